//! Surviving client memory that goes away under the device (`SIGBUS`).
//!
//! A DMA window is a shared mapping of a file the client passed. If the client shrinks that file
//! (`ftruncate`), punches a hole in a hugetlbfs file with no huge page left to fault in, or the
//! like, the next access to a page beyond the file raises `SIGBUS` on whichever thread touched
//! it: a poller reading a ring, the control plane, a FUSE backend copying data. The process would
//! die of it.
//!
//! Windows that cannot shrink need nothing: a memfd sealed with `F_SEAL_SHRINK` (QEMU's
//! `memory-backend-memfd` seals by default) that is not on hugetlbfs. Every other window is
//! *watched*: its address range is entered in a fixed table that a `SIGBUS` handler reads. When a
//! fault lies in a watched window, the handler maps anonymous zero pages over the faulting page
//! (`mmap(MAP_FIXED)`: a huge page's worth on hugetlbfs), counts the fault on the window's
//! device and returns, so the access completes (reads see zeros, writes land in memory the client
//! no longer shares). The device's pollers look at that count once per round; when it moved they
//! stop their queues as broken, which sets DEVICE_NEEDS_RESET: the requests of the broken queues
//! are never completed (the driver must reset), and the next client starts from a clean device.
//! A fault outside every watched window is not ours: the handler puts back the action that was
//! there before (Rust's runtime handler, or the default) and returns, so the fault repeats and is
//! fatal as it would have been.
//!
//! The handler is async-signal-safe: it reads atomics of a static table and calls `mmap` and
//! `sigaction`, nothing that allocates or locks. Entries are added and removed under a mutex by
//! the control planes (several devices may share a process), published with a release store of
//! the end address that the handler reads with acquire. A window's entry is removed only after
//! every poller has switched to a memory snapshot without it (the control plane drops the
//! [`Watch`] after the DMA_UNMAP broadcast), so no access to it can fault unwatched.

use std::io;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Most windows watched at once, in the whole process.
pub const MAX_WATCHED: usize = 16384;

/// One watched address range. `end == 0`: free.
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    /// Granule of the replacement mapping (the window's page size).
    page: AtomicUsize,
    /// The owning device's fault count.
    faults: AtomicPtr<AtomicU64>,
}

#[allow(clippy::declare_interior_mutable_const)] // only as the array initialiser below
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    page: AtomicUsize::new(0),
    faults: AtomicPtr::new(std::ptr::null_mut()),
};

/// The watched windows (a quarter of a MiB of zero pages until used).
static TABLE: [Slot; MAX_WATCHED] = [FREE; MAX_WATCHED];
/// Slots in use or once used: the handler searches `TABLE[..HIGH]`.
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Serialises adding and removing entries (never taken by the handler).
static EDIT: Mutex<()> = Mutex::new(());
/// The `SIGBUS` action before ours, put back for faults that are not ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A watched window: removed from the table when dropped.
#[derive(Debug)]
pub struct Watch {
    slot: usize,
    /// Keeps the fault count the slot points to alive.
    _faults: Arc<AtomicU64>,
}

/// Every slot is taken.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// More than [`MAX_WATCHED`] windows that could shrink.
    #[error("more than {MAX_WATCHED} DMA windows that can shrink are mapped")]
    Full,
    /// The handler could not be installed.
    #[error("cannot install the SIGBUS handler")]
    Install(#[source] io::Error),
}

/// Whether a window on `file` can never lose pages under us: a memfd sealed against shrinking,
/// not on hugetlbfs (whose holes may find no huge page to fault in). Also returns the page size
/// the window's mapping uses.
pub fn cannot_shrink(file: &std::fs::File) -> (bool, usize) {
    /// `HUGETLBFS_MAGIC` (`linux/magic.h`).
    const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;
    let huge = rustix::fs::fstatfs(file)
        .ok()
        .filter(|st| st.f_type as u64 == HUGETLBFS_MAGIC)
        .map(|st| st.f_bsize as usize);
    let page = huge.unwrap_or_else(rustix::param::page_size);
    let sealed = rustix::fs::fcntl_get_seals(file).is_ok_and(|s| s.contains(rustix::fs::SealFlags::SHRINK));
    (sealed && huge.is_none(), page)
}

/// Watches `len` bytes mapped at `start` (page size `page`), counting faults in `faults`.
pub fn watch(start: usize, len: usize, page: usize, faults: &Arc<AtomicU64>) -> Result<Watch, WatchError> {
    install()?;
    let _edit = EDIT.lock().unwrap_or_else(PoisonError::into_inner);
    let high = HIGH.load(Ordering::Relaxed);
    let slot = (0..high)
        .find(|&i| TABLE[i].end.load(Ordering::Relaxed) == 0)
        .or((high < MAX_WATCHED).then_some(high))
        .ok_or(WatchError::Full)?;
    let s = &TABLE[slot];
    s.start.store(start, Ordering::Relaxed);
    s.page.store(page.max(1), Ordering::Relaxed);
    s.faults.store(Arc::as_ptr(faults).cast_mut(), Ordering::Relaxed);
    s.end.store(start + len, Ordering::Release);
    if slot == high {
        HIGH.store(high + 1, Ordering::Release);
    }
    Ok(Watch { slot, _faults: faults.clone() })
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _edit = EDIT.lock().unwrap_or_else(PoisonError::into_inner);
        let s = &TABLE[self.slot];
        s.end.store(0, Ordering::Release);
        s.faults.store(std::ptr::null_mut(), Ordering::Release);
    }
}

/// Installs the handler once per process.
fn install() -> Result<(), WatchError> {
    static DONE: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = DONE.get_or_init(|| {
        // SAFETY: an all-zero `sigaction` is a valid value to fill in (no handler, empty mask).
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as libc::sighandler_t;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `act.sa_mask` is a valid signal set to empty.
        unsafe { libc::sigemptyset(&mut act.sa_mask) };
        // SAFETY: as above; `old` is written by sigaction.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointers to initialised sigaction structs; the handler only does
        // async-signal-safe work (see the module docs).
        if unsafe { libc::sigaction(libc::SIGBUS, &act, &mut old) } != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL));
        }
        let _ = PREVIOUS.set(old);
        Ok(())
    });
    r.map_err(|e| WatchError::Install(io::Error::from_raw_os_error(e)))
}

/// The `SIGBUS` handler (see the module docs). Async-signal-safe.
extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO; si_addr is the faulting
    // address for a fault (for a SIGBUS sent with kill(2) it is whatever, and matches nothing).
    let addr = unsafe { (*info).si_addr() } as usize;
    let high = HIGH.load(Ordering::Acquire);
    for s in &TABLE[..high.min(MAX_WATCHED)] {
        let end = s.end.load(Ordering::Acquire);
        if end == 0 || addr >= end || addr < s.start.load(Ordering::Relaxed) {
            continue;
        }
        let page = s.page.load(Ordering::Relaxed);
        let at = addr & !(page - 1);
        // SAFETY: replaces one page of a window's own shared mapping (inside [start, end),
        // which the device mapped and keeps mapped while the slot is in use) with anonymous
        // memory; nothing else lives at those addresses.
        let r = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if r != libc::MAP_FAILED {
            let faults = s.faults.load(Ordering::Acquire);
            // SAFETY: a non-null pointer here is the `Arc<AtomicU64>` the slot's `Watch` keeps
            // alive; the slot is in use (end != 0), so its `Watch` has not been dropped.
            if let Some(f) = unsafe { faults.as_ref() } {
                f.fetch_add(1, Ordering::Release);
            }
            return;
        }
        break; // cannot repair it: fatal, as below
    }
    // Not a watched window: the previous action handles the repeated fault.
    let previous = PREVIOUS.get().map_or(std::ptr::null(), |p| p as *const libc::sigaction);
    if previous.is_null() {
        // SAFETY: resetting a signal to its default action.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
    } else {
        // SAFETY: `previous` points to the sigaction saved at install time, valid for ever.
        unsafe { libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_truncated_watched_mapping_reads_zeros_and_counts_the_fault() {
        let f = crate::memory::memfd("sigbus-test", 4 * 4096).unwrap();
        assert!(!cannot_shrink(&f).0, "an unsealed memfd can shrink");
        // SAFETY: a new shared mapping of a 16 KiB file, unmapped at the end of the test.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let base = p as usize;
        let faults = Arc::new(AtomicU64::new(0));
        let w = watch(base, 4 * 4096, 4096, &faults).unwrap();
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile((base + 4096) as *mut u64, 7) };
        f.set_len(0).unwrap();
        // SAFETY: inside the mapping; the page is beyond the file now and faults once.
        let v = unsafe { std::ptr::read_volatile((base + 4096) as *const u64) };
        assert_eq!(v, 0);
        // SAFETY: as above, a write to another page.
        unsafe { std::ptr::write_volatile((base + 3 * 4096 + 8) as *mut u64, 9) };
        assert_eq!(faults.load(Ordering::Acquire), 2);
        drop(w);
        // SAFETY: unmapping what was mapped above.
        unsafe { libc::munmap(p, 4 * 4096) };
    }

    #[test]
    fn sealed_memfds_cannot_shrink() {
        let f = crate::memory::memfd("sealed-test", 4096).unwrap();
        rustix::fs::fcntl_add_seals(&f, rustix::fs::SealFlags::SHRINK).unwrap_err(); // not MFD_ALLOW_SEALING
        let name = c"sealed";
        let fd = rustix::fs::memfd_create(
            name,
            rustix::fs::MemfdFlags::ALLOW_SEALING | rustix::fs::MemfdFlags::CLOEXEC,
        )
        .unwrap();
        let f = std::fs::File::from(fd);
        f.set_len(4096).unwrap();
        assert!(!cannot_shrink(&f).0);
        rustix::fs::fcntl_add_seals(&f, rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW).unwrap();
        assert!(cannot_shrink(&f).0);
    }
}
