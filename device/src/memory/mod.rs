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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use thiserror::Error;
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap, MemoryRegionAddress,
};

pub mod shared;
pub mod sigbus;

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
    #[error("too many DMA windows (max {max})")]
    TooMany {
        /// The limit.
        max: usize,
    },
    /// The windows would map more bytes than allowed.
    #[error("DMA windows would map {bytes:#x} bytes (max {max:#x})")]
    TooLarge {
        /// What would be mapped.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// Taking the window's descriptor would leave too few for serving (accepting the next
    /// client, the backend's files).
    #[error("DMA window descriptor {fd} is within {reserve} of the descriptor limit {limit}")]
    NoDescriptors {
        /// The descriptor received.
        fd: i32,
        /// The soft RLIMIT_NOFILE.
        limit: u64,
        /// Descriptors kept free.
        reserve: u64,
    },
    /// The window's file is not on shmem or hugetlbfs: touching it could fault for ever (a FUSE
    /// or hung NFS mount), so it is not mapped.
    #[error("DMA window {address:#x}+{size:#x} not mapped: {reason}")]
    Backing {
        /// Start of the window.
        address: u64,
        /// Its size.
        size: u64,
        /// Why (in the message: the control plane logs only that).
        reason: sigbus::BackingError,
    },
    /// A window that can shrink could not be watched for SIGBUS.
    #[error("cannot watch DMA window {address:#x}+{size:#x} for SIGBUS")]
    Watch {
        /// Start of the window.
        address: u64,
        /// Its size.
        size: u64,
        /// Why.
        #[source]
        source: sigbus::WatchError,
    },
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
            MemoryError::TooMany { .. } | MemoryError::TooLarge { .. } | MemoryError::Watch { .. } => {
                libc::ENOSPC
            }
            MemoryError::NoDescriptors { .. } => libc::EMFILE,
            // mmap's own answer for a file whose filesystem cannot be mapped.
            MemoryError::Backing { .. } => libc::ENODEV,
            MemoryError::Map { .. } | MemoryError::FileTooSmall { .. } => libc::EINVAL,
        }
    }
}

/// A window as [`DmaTable::export`] gives it: address, size, and its file with the offset in
/// it (`None` for a window shared without a descriptor).
pub type ExportedWindow = (u64, u64, Option<(File, u64)>);

/// One DMA window.
#[derive(Debug)]
pub struct Window {
    size: u64,
    /// The mapping, or `None` for a window shared without a file descriptor.
    region: Option<Arc<GuestRegionMmap<()>>>,
    /// The SIGBUS watch of a mapping that can shrink (dropped after the pollers let go of it).
    _watch: Option<sigbus::Watch>,
}

/// Windows taken out of the table: drop them only once no poller can touch them (after the
/// memory broadcast), since that ends their SIGBUS watch.
#[derive(Debug, Default)]
#[must_use = "drop removed windows after the pollers switched memory"]
pub struct Removed(Vec<Window>);

impl Removed {
    /// How many windows were removed.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Bounds on what a client may map.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most windows.
    pub max_windows: usize,
    /// Most bytes mapped (windows with a descriptor).
    pub max_bytes: u64,
    /// Descriptors kept free below RLIMIT_NOFILE: a window whose descriptor number is past
    /// `limit - reserve` is refused (descriptors are allocated lowest first, so every number
    /// below it is taken).
    pub fd_reserve: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_windows: MAX_DMA_MAPS, max_bytes: u64::MAX, fd_reserve: 0 }
    }
}

/// The DMA windows of the current client, keyed by DMA address.
#[derive(Debug, Default)]
pub struct DmaTable {
    windows: BTreeMap<u64, Window>,
    limits: Limits,
    /// Bytes mapped now.
    mapped: u64,
    /// SIGBUS faults repaired in this table's windows (see [`sigbus`]); pollers compare it.
    faults: Arc<AtomicU64>,
}

impl DmaTable {
    /// An empty table with these limits.
    pub fn with_limits(limits: Limits) -> Self {
        DmaTable { limits, ..Default::default() }
    }

    /// The table's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The count of SIGBUS faults repaired in this table's windows (it only grows).
    pub fn faults(&self) -> &Arc<AtomicU64> {
        &self.faults
    }

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
        let max = self.limits.max_windows.min(MAX_DMA_MAPS);
        if self.windows.len() >= max {
            return Err(MemoryError::TooMany { max });
        }
        if file.is_some() && self.mapped.saturating_add(size) > self.limits.max_bytes {
            return Err(MemoryError::TooLarge {
                bytes: self.mapped.saturating_add(size),
                max: self.limits.max_bytes,
            });
        }
        if let Some(f) = &file {
            use std::os::fd::AsRawFd;
            let fd = f.as_raw_fd();
            if let Ok(limit) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.ok_or(())
            {
                let reserve = self.limits.fd_reserve;
                if fd as u64 + reserve >= limit {
                    return Err(MemoryError::NoDescriptors { fd, limit, reserve });
                }
            }
        }
        let mut watch = None;
        let region = match file {
            Some(file) => {
                // Touching a mapping beyond the end of its file raises SIGBUS: refuse such windows.
                // (A client that shrinks the file afterwards can still do that; see DESIGN.md.)
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                if offset.checked_add(size).is_none_or(|e| e > len) {
                    return Err(MemoryError::FileTooSmall { address, size, file_len: len });
                }
                let backing = sigbus::backing(&file).map_err(|source| MemoryError::Backing {
                    address,
                    size,
                    reason: source,
                })?;
                let r = GuestRegionMmap::from_range(
                    GuestAddress(address),
                    size as usize,
                    Some(FileOffset::new(file, offset)),
                )
                .map_err(|source| MemoryError::Map { address, size, source })?;
                if !backing.cannot_shrink {
                    let host = r.get_host_address(MemoryRegionAddress(0)).map_or(0, |p| p as usize);
                    let w = sigbus::watch(host, size as usize, backing.page, &self.faults)
                        .map_err(|source| MemoryError::Watch { address, size, source })?;
                    watch = Some(w);
                }
                self.mapped += size;
                Some(Arc::new(r))
            }
            None => None,
        };
        self.windows.insert(address, Window { size, region, _watch: watch });
        Ok(())
    }

    /// Removes every window inside `address..address+size`; the range must not cut a window.
    /// Returns the windows removed (drop them once no poller uses them).
    pub fn unmap(&mut self, address: u64, size: u64) -> Result<Removed, MemoryError> {
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
        let removed: Vec<Window> = inside.iter().filter_map(|a| self.windows.remove(a)).collect();
        self.mapped -= removed.iter().filter(|w| w.region.is_some()).map(|w| w.size).sum::<u64>();
        Ok(Removed(removed))
    }

    /// Removes every window (drop them once no poller uses them).
    pub fn clear(&mut self) -> Removed {
        self.mapped = 0;
        Removed(std::mem::take(&mut self.windows).into_values().collect())
    }

    /// Whether a SIGBUS fault was repaired in a window since the count was `seen`.
    pub fn faulted_since(&self, seen: u64) -> bool {
        self.faults.load(Ordering::Acquire) != seen
    }

    /// Every window as a successor process re-creates it ([`crate::handover`]): its address,
    /// size, and, for a window mapped from a file, a new descriptor of the file (the same open
    /// file description) and the offset. Fails only if a descriptor cannot be duplicated.
    pub fn export(&self) -> std::io::Result<Vec<ExportedWindow>> {
        self.windows
            .iter()
            .map(|(&address, w)| {
                let file = match w.region.as_ref().and_then(|r| r.file_offset()) {
                    Some(fo) => Some((fo.file().try_clone()?, fo.start())),
                    None => None,
                };
                Ok((address, w.size, file))
            })
            .collect()
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
        super::memfd("dma-table-test", size).unwrap()
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
        assert_eq!(t.unmap(0x10000, 0x4000).unwrap().len(), 1);
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

    /// Only shmem (memfd, tmpfs) and hugetlbfs files are mapped: a file on a disk filesystem (or
    /// FUSE, NFS) could make a poller's page fault wait for ever. It is refused with ENODEV
    /// before anything is mapped, and the table is unchanged.
    #[test]
    fn files_off_shmem_are_refused() {
        // The source tree is on a disk filesystem (ext4 here), unlike /tmp on many hosts.
        let disk = tempfile::tempfile_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        disk.set_len(0x4000).unwrap();
        let magic = rustix::fs::fstatfs(&disk).unwrap().f_type as u32;
        assert!(
            magic != sigbus::TMPFS_MAGIC && magic != sigbus::HUGETLBFS_MAGIC,
            "test precondition: {} must not be on tmpfs",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut t = DmaTable::default();
        let e = t.map(0x10000, 0x4000, 0, Some(disk)).unwrap_err();
        assert_eq!(e.errno(), libc::ENODEV, "{e}");
        assert!(
            matches!(e, MemoryError::Backing { reason: sigbus::BackingError::Filesystem(m), .. } if m == magic),
            "{e:?}"
        );
        assert!(t.is_empty());
        assert_eq!(t.snapshot().num_regions(), 0);
        // The same range with a memfd maps.
        t.map(0x10000, 0x4000, 0, Some(memfd(0x4000))).unwrap();
        assert_eq!(t.snapshot().num_regions(), 1);
    }

    #[test]
    fn unmap_covering_and_partial() {
        let mut t = DmaTable::default();
        t.map(0x0, 0xc0000, 0, None).unwrap();
        t.map(0x100000, 0x100000, 0, None).unwrap();
        assert_eq!(t.unmap(0x1000, 0x1000).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(t.unmap(0x0, 0x150000).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(t.unmap(0x300000, 0x1000).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(t.unmap(0, 0x80000000).unwrap().len(), 2);
        assert!(t.is_empty());
    }
}
