//! The driver's "guest RAM": a memfd shared with the device through DMA_MAP.
//!
//! Like a QEMU guest with `memory-backend-memfd,share=on`, the driver keeps all rings and buffers
//! in one memfd, mapped here with vm-memory and handed to the device as one DMA window at
//! `iova_base`. Addresses in this module are DMA addresses (IOVAs), never host pointers, so a
//! device that confuses file offsets and DMA addresses fails visibly (the default base is 4 GiB).
//!
//! A first-fit free-list allocator hands out buffers; callers free them explicitly.
//!
//! The only `unsafe` in this crate is the `memfd_create` call below.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap,
    MemoryRegionAddress,
};

/// Errors of the guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// Creating or sizing the memfd failed.
    #[error("cannot create the memfd")]
    Memfd(#[source] io::Error),
    /// Mapping the memfd failed.
    #[error("cannot map guest memory: {0}")]
    Map(String),
    /// No free block is large enough.
    #[error("guest memory exhausted: {len} bytes wanted")]
    OutOfMemory {
        /// Requested size.
        len: usize,
    },
    /// An access fell outside guest memory.
    #[error("access {iova:#x}+{len:#x} outside guest memory")]
    OutOfRange {
        /// DMA address.
        iova: u64,
        /// Length.
        len: usize,
    },
}

/// A block of guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaBuf {
    /// DMA address of the first byte.
    pub iova: u64,
    /// Length in bytes.
    pub len: usize,
}

/// First-fit allocator over `[0, size)` offsets, coalescing on free.
#[derive(Debug)]
struct FreeList {
    free: BTreeMap<u64, u64>,
    total_free: u64,
}

impl FreeList {
    fn new(size: u64) -> Self {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        FreeList { free, total_free: size }
    }

    fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        let align = align.max(1);
        let mut found = None;
        for (&start, &size) in &self.free {
            let a = start.div_ceil(align) * align;
            if a + len <= start + size {
                found = Some((start, size, a));
                break;
            }
        }
        let (start, size, a) = found?;
        self.free.remove(&start);
        if a > start {
            self.free.insert(start, a - start);
        }
        let end = start + size;
        if a + len < end {
            self.free.insert(a + len, end - (a + len));
        }
        self.total_free -= len;
        Some(a)
    }

    fn free(&mut self, off: u64, len: u64) {
        let mut start = off;
        let mut size = len;
        if let Some((&ps, &pl)) = self.free.range(..off).next_back() {
            assert!(ps + pl <= off, "double free or overlap at {off:#x}");
            if ps + pl == off {
                self.free.remove(&ps);
                start = ps;
                size += pl;
            }
        }
        if let Some((&ns, &nl)) = self.free.range(off..).next() {
            assert!(off + len <= ns, "double free or overlap at {off:#x}");
            if off + len == ns {
                self.free.remove(&ns);
                size += nl;
            }
        }
        self.free.insert(start, size);
        self.total_free += len;
    }
}

/// Guest memory backed by a memfd.
#[derive(Debug)]
pub struct GuestRam {
    mem: GuestMemoryMmap,
    file: File,
    iova_base: u64,
    size: u64,
    alloc: Mutex<FreeList>,
}

fn memfd_create(name: &str) -> io::Result<File> {
    let name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call; memfd_create
    // reads it and has no other memory-safety preconditions.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create, is valid, and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

impl GuestRam {
    /// Creates `size` bytes (rounded up to 4 KiB) of memfd-backed memory at DMA address
    /// `iova_base` (must be 4 KiB aligned).
    pub fn new(size: usize, iova_base: u64) -> Result<GuestRam, MemoryError> {
        let size = (size as u64).div_ceil(4096) * 4096;
        if size == 0 || !iova_base.is_multiple_of(4096) {
            return Err(MemoryError::Map("size must be non-zero, base 4 KiB aligned".into()));
        }
        let file = memfd_create("virtiofs-driver-ram").map_err(MemoryError::Memfd)?;
        file.set_len(size).map_err(MemoryError::Memfd)?;
        let fo = FileOffset::new(file.try_clone().map_err(MemoryError::Memfd)?, 0);
        let mem =
            GuestMemoryMmap::from_ranges_with_files([(GuestAddress(iova_base), size as usize, Some(fo))])
                .map_err(|e| MemoryError::Map(e.to_string()))?;
        Ok(GuestRam { mem, file, iova_base, size, alloc: Mutex::new(FreeList::new(size)) })
    }

    /// The memfd (to pass in DMA_MAP).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The memfd's raw descriptor.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// DMA address of the first byte.
    pub fn iova_base(&self) -> u64 {
        self.iova_base
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes not allocated.
    pub fn free_bytes(&self) -> u64 {
        self.alloc.lock().expect("allocator lock").total_free
    }

    /// Allocates `len` bytes (at least 1) aligned to `align` (a power of two).
    pub fn alloc(&self, len: usize, align: usize) -> Result<DmaBuf, MemoryError> {
        let l = len.max(1) as u64;
        let off = self
            .alloc
            .lock()
            .expect("allocator lock")
            .alloc(l, align as u64)
            .ok_or(MemoryError::OutOfMemory { len })?;
        Ok(DmaBuf { iova: self.iova_base + off, len })
    }

    /// Allocates and zero-fills.
    pub fn alloc_zeroed(&self, len: usize, align: usize) -> Result<DmaBuf, MemoryError> {
        let b = self.alloc(len, align)?;
        self.fill(b.iova, len, 0)?;
        Ok(b)
    }

    /// Returns a block to the allocator.
    pub fn free(&self, buf: DmaBuf) {
        self.alloc.lock().expect("allocator lock").free(buf.iova - self.iova_base, buf.len.max(1) as u64);
    }

    /// Checks that `iova..iova + len` is inside guest memory; returns the offset in the (single)
    /// region, so accesses skip vm-memory's per-access region lookup.
    fn check(&self, iova: u64, len: usize) -> Result<MemoryRegionAddress, MemoryError> {
        let ok = iova >= self.iova_base
            && (iova - self.iova_base).checked_add(len as u64).is_some_and(|e| e <= self.size);
        if ok {
            Ok(MemoryRegionAddress(iova - self.iova_base))
        } else {
            Err(MemoryError::OutOfRange { iova, len })
        }
    }

    fn region(&self) -> &GuestRegionMmap {
        self.mem.iter().next().expect("guest RAM is one region")
    }

    /// Writes `data` at `iova`.
    pub fn write(&self, iova: u64, data: &[u8]) -> Result<(), MemoryError> {
        let a = self.check(iova, data.len())?;
        self.region().write_slice(data, a).map_err(|_| MemoryError::OutOfRange { iova, len: data.len() })
    }

    /// Reads into `buf` from `iova`.
    pub fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let a = self.check(iova, buf.len())?;
        let len = buf.len();
        self.region().read_slice(buf, a).map_err(|_| MemoryError::OutOfRange { iova, len })
    }

    /// Reads `len` bytes from `iova`.
    pub fn read_vec(&self, iova: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
        let mut v = vec![0u8; len];
        self.read(iova, &mut v)?;
        Ok(v)
    }

    /// Fills `len` bytes at `iova` with `byte`.
    pub fn fill(&self, iova: u64, len: usize, byte: u8) -> Result<(), MemoryError> {
        let chunk = vec![byte; len.min(64 << 10)];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len());
            self.write(iova + done as u64, &chunk[..n])?;
            done += n;
        }
        Ok(())
    }

    /// Atomic little-endian 16-bit load (ring indexes).
    pub fn load_u16(&self, iova: u64, order: Ordering) -> Result<u16, MemoryError> {
        let a = self.check(iova, 2)?;
        self.region()
            .load::<u16>(a, order)
            .map(u16::from_le)
            .map_err(|_| MemoryError::OutOfRange { iova, len: 2 })
    }

    /// Atomic little-endian 16-bit store (ring indexes).
    pub fn store_u16(&self, iova: u64, v: u16, order: Ordering) -> Result<(), MemoryError> {
        let a = self.check(iova, 2)?;
        self.region().store(v.to_le(), a, order).map_err(|_| MemoryError::OutOfRange { iova, len: 2 })
    }

    /// Little-endian 32-bit load.
    pub fn load_u32(&self, iova: u64, order: Ordering) -> Result<u32, MemoryError> {
        let a = self.check(iova, 4)?;
        self.region()
            .load::<u32>(a, order)
            .map(u32::from_le)
            .map_err(|_| MemoryError::OutOfRange { iova, len: 4 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freelist_alloc_free_coalesce() {
        let mut f = FreeList::new(0x10000);
        let a = f.alloc(100, 64).unwrap();
        let b = f.alloc(4096, 4096).unwrap();
        let c = f.alloc(10, 8).unwrap();
        assert_eq!(a, 0);
        assert_eq!(b, 4096);
        assert_eq!(c, 104); // first fit, in the gap before b
        assert!(f.alloc(0x10000, 1).is_none());
        f.free(b, 4096);
        f.free(a, 100);
        f.free(c, 10);
        assert_eq!(f.total_free, 0x10000);
        assert_eq!(f.free.len(), 1);
        assert_eq!(f.alloc(0x10000, 1), Some(0));
    }

    #[test]
    fn ram_rw_and_bounds() {
        let r = GuestRam::new(1 << 20, 1 << 32).unwrap();
        let b = r.alloc(16, 16).unwrap();
        assert!(b.iova >= 1 << 32);
        r.write(b.iova, b"hello").unwrap();
        assert_eq!(r.read_vec(b.iova, 5).unwrap(), b"hello");
        r.store_u16(b.iova + 6, 0xbeef, Ordering::Release).unwrap();
        assert_eq!(r.load_u16(b.iova + 6, Ordering::Acquire).unwrap(), 0xbeef);
        assert!(r.read_vec((1 << 32) + (1 << 20) - 2, 4).is_err());
        assert!(r.read_vec(0, 4).is_err());
        r.free(b);
        assert_eq!(r.free_bytes(), 1 << 20);
        // The memfd sees the bytes: it is what the device will map.
        let mut buf = [0u8; 5];
        use std::os::unix::fs::FileExt;
        r.file().read_exact_at(&mut buf, b.iova - (1 << 32)).unwrap();
        assert_eq!(&buf, b"hello");
    }
}
