//! A shared mapping of a memory file read and written as little-endian words, each with one
//! atomic load or store: the queues' in-flight record (`virtq/track.rs`), which the data path
//! writes on every request and a process started after a crash reads. The pointer arithmetic is
//! here; every access is checked to lie in the mapping and to be aligned.

use std::fs::File;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

use vm_memory::{Bytes, FileOffset, GuestAddress, GuestRegionMmap, MemoryRegionAddress};

/// A mapping of `len` bytes of a memory file, shared with the file's other mappings.
#[derive(Debug)]
pub struct SharedWords {
    region: GuestRegionMmap<()>,
    base: *mut u8,
    len: u64,
}

// SAFETY: the mapping is owned by `region` and lives as long as this value; it is only ever
// accessed through atomic loads and stores (and vm-memory's volatile copies for the cold
// paths), which are sound from any thread.
unsafe impl Send for SharedWords {}
// SAFETY: as for `Send`: shared access is atomic.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Maps the first `len` bytes of `file` (shared: stores reach the file).
    pub fn map(file: &File, len: u64) -> Result<SharedWords, String> {
        let size = usize::try_from(len).map_err(|_| format!("{len} bytes: too large"))?;
        let fo = FileOffset::new(file.try_clone().map_err(|e| e.to_string())?, 0);
        let region =
            GuestRegionMmap::from_range(GuestAddress(0), size, Some(fo)).map_err(|e| e.to_string())?;
        let base = region.as_ptr();
        Ok(SharedWords { region, base, len })
    }

    /// The mapping's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it maps nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The word of `size` bytes at `at`, if it lies in the mapping and is aligned.
    #[inline]
    fn word(&self, at: u64, size: u64) -> Option<*mut u8> {
        let end = at.checked_add(size)?;
        (end <= self.len && at.is_multiple_of(size)).then(|| {
            // SAFETY: `at + size <= len`: the offset stays inside the mapping.
            unsafe { self.base.add(at as usize) }
        })
    }

    /// Stores `v` at `at` (release order); nothing if `at` is out of the mapping or unaligned.
    #[inline]
    pub fn store16(&self, at: u64, v: u16) {
        if let Some(p) = self.word(at, 2) {
            // SAFETY: `p` is in the mapping, aligned for u16, and the mapping lives as long as
            // `self`; an AtomicU16 has u16's layout.
            unsafe { &*(p as *const AtomicU16) }.store(v.to_le(), Ordering::Release);
        }
    }

    /// As [`Self::store16`], 32 bits.
    #[inline]
    pub fn store32(&self, at: u64, v: u32) {
        if let Some(p) = self.word(at, 4) {
            // SAFETY: as in `store16`, for u32.
            unsafe { &*(p as *const AtomicU32) }.store(v.to_le(), Ordering::Release);
        }
    }

    /// As [`Self::store16`], 64 bits.
    #[inline]
    pub fn store64(&self, at: u64, v: u64) {
        if let Some(p) = self.word(at, 8) {
            // SAFETY: as in `store16`, for u64.
            unsafe { &*(p as *const AtomicU64) }.store(v.to_le(), Ordering::Release);
        }
    }

    /// The 16 bits at `at` (acquire order); 0 if out of the mapping or unaligned.
    pub fn load16(&self, at: u64) -> u16 {
        self.word(at, 2).map_or(0, |p| {
            // SAFETY: as in `store16`.
            u16::from_le(unsafe { &*(p as *const AtomicU16) }.load(Ordering::Acquire))
        })
    }

    /// As [`Self::load16`], 32 bits.
    pub fn load32(&self, at: u64) -> u32 {
        self.word(at, 4).map_or(0, |p| {
            // SAFETY: as in `store32`.
            u32::from_le(unsafe { &*(p as *const AtomicU32) }.load(Ordering::Acquire))
        })
    }

    /// As [`Self::load16`], 64 bits.
    pub fn load64(&self, at: u64) -> u64 {
        self.word(at, 8).map_or(0, |p| {
            // SAFETY: as in `store64`.
            u64::from_le(unsafe { &*(p as *const AtomicU64) }.load(Ordering::Acquire))
        })
    }

    /// Copies `b` to `at` (volatile; nothing if it does not fit).
    #[inline]
    pub fn store_bytes(&self, at: u64, b: &[u8]) {
        let _ = self.region.write_slice(b, MemoryRegionAddress(at));
    }

    /// Copies from `at` into `b` (zeros if it does not fit).
    pub fn load_bytes(&self, at: u64, b: &mut [u8]) {
        if self.region.read_slice(b, MemoryRegionAddress(at)).is_err() {
            b.fill(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words stored through one mapping are read through another of the same file; an access
    /// out of the mapping or unaligned does nothing (loads read 0).
    #[test]
    fn words_reach_the_file_and_stay_in_bounds() {
        let file = crate::memory::memfd("shared-words", 4096).unwrap();
        let (a, b) = (SharedWords::map(&file, 4096).unwrap(), SharedWords::map(&file, 4096).unwrap());
        a.store64(8, 0x0102_0304_0506_0708);
        a.store32(16, 7);
        a.store16(20, 9);
        assert_eq!((b.load64(8), b.load32(16), b.load16(20)), (0x0102_0304_0506_0708, 7, 9));
        a.store64(4092, 1);
        a.store64(12, 1);
        assert_eq!((b.load64(4088), b.load64(12), b.load32(4096)), (0, 0, 0));
        a.store_bytes(100, b"xyz");
        let mut got = [0u8; 3];
        b.load_bytes(100, &mut got);
        assert_eq!(&got, b"xyz");
        b.load_bytes(4095, &mut got);
        assert_eq!(got, [0; 3]);
    }
}
