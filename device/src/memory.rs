//! Guest memory: the DMA windows a client shares with DMA_MAP, mapped with `vm-memory`.
//!
//! The control plane owns the [`DmaTable`]. After every change it builds a fresh, immutable
//! [`GuestMem`] snapshot (an `Arc`) and hands it to the pollers by message: pollers never lock
//! anything to read guest memory. A window dropped by DMA_UNMAP stays mapped until the last
//! snapshot holding it is dropped, which is why the control plane acknowledges DMA_UNMAP only
//! after every poller has confirmed it switched to the new snapshot (see `DESIGN.md`).
//!
//! Windows without a file descriptor (QEMU's ROM ranges) are recorded so that unmaps and overlap
//! checks see them, but they are not in any snapshot: a descriptor pointing into one fails like
//! any other unmapped address.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::Arc;

use thiserror::Error;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// The guest memory a poller sees: an immutable snapshot of the mapped DMA windows.
pub type GuestMem = GuestMemoryMmap<()>;

/// Most DMA windows at once (the protocol's default `max_dma_maps`).
pub const MAX_DMA_MAPS: usize = 65535;

/// Errors changing the DMA table. Each maps to the errno sent back to the client.
#[derive(Debug, Error)]
pub enum MemoryError {
    /// Zero size, misalignment, or an address range that wraps.
    #[error("invalid DMA window {address:#x}+{size:#x}")]
    InvalidRange {
        /// Start of the window.
        address: u64,
        /// Its size.
        size: u64,
    },
    /// The window overlaps one that is already mapped.
    #[error("DMA window {address:#x}+{size:#x} overlaps an existing one")]
    Overlap {
        /// Start of the window.
        address: u64,
        /// Its size.
        size: u64,
    },
    /// No window matches the unmap request.
    #[error("no DMA window at {address:#x}+{size:#x}")]
    NotMapped {
        /// Start of the range.
        address: u64,
        /// Its size.
        size: u64,
    },
    /// The unmap range cuts through a window instead of covering whole windows.
    #[error("unmap {address:#x}+{size:#x} splits a DMA window")]
    PartialUnmap {
        /// Start of the range.
        address: u64,
        /// Its size.
        size: u64,
    },
    /// The file passed with the window is shorter than `offset + size`.
    #[error("DMA window {address:#x}+{size:#x} reaches past the end of its file ({file_len:#x} bytes)")]
    FileTooSmall {
        /// Start of the window.
        address: u64,
        /// Its size.
        size: u64,
        /// Length of the file.
        file_len: u64,
    },
    /// Too many windows.
    #[error("too many DMA windows (max {MAX_DMA_MAPS})")]
    TooMany,
    /// mmap of the passed file descriptor failed (for example the file is smaller than the window).
    #[error("cannot map DMA window {address:#x}+{size:#x}")]
    Map {
        /// Start of the window.
        address: u64,
        /// Its size.
        size: u64,
        /// Why vm-memory refused it.
        #[source]
        source: vm_memory::mmap::FromRangesError,
    },
}

impl MemoryError {
    /// The errno reported to the client.
    pub fn errno(&self) -> i32 {
        match self {
            MemoryError::InvalidRange { .. } | MemoryError::PartialUnmap { .. } => libc::EINVAL,
            MemoryError::Overlap { .. } => libc::EEXIST,
            MemoryError::NotMapped { .. } => libc::ENOENT,
            MemoryError::TooMany => libc::ENOSPC,
            MemoryError::Map { .. } | MemoryError::FileTooSmall { .. } => libc::EINVAL,
        }
    }
}

/// One DMA window.
#[derive(Debug)]
struct Window {
    size: u64,
    /// The mapping, or `None` for a window shared without a file descriptor.
    region: Option<Arc<GuestRegionMmap<()>>>,
}

/// The DMA windows of the current client, keyed by DMA address.
#[derive(Debug, Default)]
pub struct DmaTable {
    windows: BTreeMap<u64, Window>,
}

impl DmaTable {
    /// Records a window; with `file`, maps `size` bytes of it at `offset`.
    pub fn map(
        &mut self,
        address: u64,
        size: u64,
        offset: u64,
        file: Option<File>,
    ) -> Result<(), MemoryError> {
        let end = address.checked_add(size);
        let page_ok =
            address.is_multiple_of(4096) && size.is_multiple_of(4096) && offset.is_multiple_of(4096);
        if size == 0 || end.is_none() || !page_ok || usize::try_from(size).is_err() {
            return Err(MemoryError::InvalidRange { address, size });
        }
        let end = end.unwrap_or(u64::MAX);
        // Overlap: the window starting at or before `address`, and any starting inside.
        let before = self.windows.range(..=address).next_back();
        let overlaps_before = before.is_some_and(|(&a, w)| a + w.size > address);
        let overlaps_inside = self.windows.range(address..end).next().is_some();
        if overlaps_before || overlaps_inside {
            return Err(MemoryError::Overlap { address, size });
        }
        if self.windows.len() >= MAX_DMA_MAPS {
            return Err(MemoryError::TooMany);
        }
        let region = match file {
            Some(file) => {
                // Touching a mapping beyond the end of its file raises SIGBUS: refuse such windows.
                // (A client that shrinks the file afterwards can still do that; see DESIGN.md.)
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                if offset.checked_add(size).is_none_or(|e| e > len) {
                    return Err(MemoryError::FileTooSmall { address, size, file_len: len });
                }
                let r = GuestRegionMmap::from_range(
                    GuestAddress(address),
                    size as usize,
                    Some(FileOffset::new(file, offset)),
                )
                .map_err(|source| MemoryError::Map { address, size, source })?;
                Some(Arc::new(r))
            }
            None => None,
        };
        self.windows.insert(address, Window { size, region });
        Ok(())
    }

    /// Removes every window inside `address..address+size`; the range must not cut a window.
    /// Returns how many windows were removed.
    pub fn unmap(&mut self, address: u64, size: u64) -> Result<usize, MemoryError> {
        let end = address.checked_add(size).ok_or(MemoryError::InvalidRange { address, size })?;
        if size == 0 {
            return Err(MemoryError::InvalidRange { address, size });
        }
        let before = self.windows.range(..address).next_back();
        if before.is_some_and(|(&a, w)| a + w.size > address) {
            return Err(MemoryError::PartialUnmap { address, size });
        }
        let inside: Vec<u64> = self.windows.range(address..end).map(|(&a, _)| a).collect();
        if let Some(&last) = inside.last() {
            if last + self.windows[&last].size > end {
                return Err(MemoryError::PartialUnmap { address, size });
            }
        }
        if inside.is_empty() {
            return Err(MemoryError::NotMapped { address, size });
        }
        for a in &inside {
            self.windows.remove(a);
        }
        Ok(inside.len())
    }

    /// Removes every window.
    pub fn clear(&mut self) {
        self.windows.clear();
    }

    /// Number of windows (with or without a mapping).
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Whether no window is recorded.
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// An immutable snapshot of the mapped windows, for the pollers.
    pub fn snapshot(&self) -> Arc<GuestMem> {
        let regions = self.windows.values().filter_map(|w| w.region.clone());
        // The table keeps windows sorted and disjoint, which is all from_arc_regions checks.
        Arc::new(GuestMemoryMmap::from_arc_regions(regions.collect()).unwrap_or_default())
    }
}

/// Creates an anonymous shared-memory file of `size` bytes (for memory the device shares with its
/// client, such as the notify page).
pub fn memfd(name: &str, size: u64) -> std::io::Result<File> {
    use std::os::fd::FromRawFd;
    let name = std::ffi::CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryBackend};

    fn memfd(size: u64) -> File {
        let f = tempfile::tempfile().unwrap();
        f.set_len(size).unwrap();
        f
    }

    #[test]
    fn map_read_write_unmap() {
        let mut t = DmaTable::default();
        t.map(0x10000, 0x4000, 0, Some(memfd(0x4000))).unwrap();
        t.map(0xc0000, 0x1000, 0, None).unwrap();
        let m = t.snapshot();
        m.write_obj(0xabcdu32, GuestAddress(0x10010)).unwrap();
        assert_eq!(m.read_obj::<u32>(GuestAddress(0x10010)).unwrap(), 0xabcd);
        assert!(m.read_obj::<u32>(GuestAddress(0xc0000)).is_err(), "fd-less window is not readable");
        assert_eq!(t.unmap(0x10000, 0x4000).unwrap(), 1);
        // The old snapshot keeps its mapping alive.
        assert_eq!(m.read_obj::<u32>(GuestAddress(0x10010)).unwrap(), 0xabcd);
        assert_eq!(t.snapshot().num_regions(), 0);
    }

    #[test]
    fn overlaps_and_bad_ranges() {
        let mut t = DmaTable::default();
        t.map(0x10000, 0x4000, 0, None).unwrap();
        assert_eq!(t.map(0x10000, 0x1000, 0, None).unwrap_err().errno(), libc::EEXIST);
        assert_eq!(t.map(0xf000, 0x2000, 0, None).unwrap_err().errno(), libc::EEXIST);
        assert_eq!(t.map(0x13000, 0x1000, 0, None).unwrap_err().errno(), libc::EEXIST);
        assert_eq!(t.map(0x20000, 0, 0, None).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(t.map(u64::MAX - 0xfff, 0x2000, 0, None).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(t.map(0x20001, 0x1000, 0, None).unwrap_err().errno(), libc::EINVAL);
        // A file smaller than the window is refused rather than mapped (no SIGBUS later).
        assert_eq!(t.map(0x40000, 0x4000, 0, Some(memfd(0x1000))).unwrap_err().errno(), libc::EINVAL);
        t.map(0x14000, 0x1000, 0, None).unwrap();
    }

    #[test]
    fn unmap_covering_and_partial() {
        let mut t = DmaTable::default();
        t.map(0x0, 0xc0000, 0, None).unwrap();
        t.map(0x100000, 0x100000, 0, None).unwrap();
        assert_eq!(t.unmap(0x1000, 0x1000).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(t.unmap(0x0, 0x150000).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(t.unmap(0x300000, 0x1000).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(t.unmap(0, 0x80000000).unwrap(), 2);
        assert!(t.is_empty());
    }
}
