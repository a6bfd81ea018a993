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
//! The handler acts only on faults the kernel raised (`si_code > 0`: `BUS_ADRERR` and the like).
//! A `SIGBUS` another process (or thread) sent with `kill`, `tgkill` or `sigqueue` (`si_code <=
//! 0`: its `si_addr` is no address at all) is counted ([`user_signals`]) and ignored: the handler
//! stays installed, so such a signal can neither kill the process nor disarm the repair of the
//! next real fault.
//!
//! The handler is async-signal-safe: it reads atomics of a static table and calls `mmap` and
//! `sigaction`, nothing that allocates or locks; it keeps `errno` as it found it. Entries are added and removed under a mutex by
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
/// `SIGBUS` signals sent by a process rather than raised by a fault, ignored.
static USER_SIGNALS: AtomicU64 = AtomicU64::new(0);

/// How many `SIGBUS` signals sent with `kill`, `tgkill` or `sigqueue` the handler ignored.
pub fn user_signals() -> u64 {
    USER_SIGNALS.load(Ordering::Relaxed)
}

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

/// `TMPFS_MAGIC` (`linux/magic.h`): tmpfs, `/dev/shm` and memfds (shmem reports it too).
pub const TMPFS_MAGIC: u32 = 0x0102_1994;
/// `HUGETLBFS_MAGIC` (`linux/magic.h`).
pub const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;

/// A DMA_MAP file the device refuses to map.
#[derive(Debug, thiserror::Error)]
pub enum BackingError {
    /// The file is not on shmem or hugetlbfs: a page fault in it may wait on a FUSE server or a
    /// hung NFS mount for ever, in a poller.
    #[error("file is on a filesystem of type {0:#x}, not tmpfs/memfd or hugetlbfs")]
    Filesystem(u32),
    /// fstatfs failed, so the filesystem is unknown.
    #[error("cannot fstatfs the file: {0}")]
    Statfs(io::Error),
}

/// How a DMA window's file is backed: only memory that cannot fault for ever is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backing {
    /// The window can never lose pages under us: a memfd sealed against shrinking, not on
    /// hugetlbfs (whose holes may find no huge page to fault in). Others are watched.
    pub cannot_shrink: bool,
    /// The page size of the window's mapping.
    pub page: usize,
}

/// Checks that `file` is on shmem (tmpfs, `/dev/shm`, a memfd) or hugetlbfs, whose page faults
/// never wait on anything but memory, and says whether it can shrink (see [`Backing`]).
pub fn backing(file: &std::fs::File) -> Result<Backing, BackingError> {
    let st = rustix::fs::fstatfs(file).map_err(|e| BackingError::Statfs(e.into()))?;
    // Filesystem magics are 32-bit; f_type is a signed word of the platform's size.
    let magic = st.f_type as u32;
    let page = match magic {
        HUGETLBFS_MAGIC => st.f_bsize as usize,
        TMPFS_MAGIC => rustix::param::page_size(),
        other => return Err(BackingError::Filesystem(other)),
    };
    let sealed = rustix::fs::fcntl_get_seals(file).is_ok_and(|s| s.contains(rustix::fs::SealFlags::SHRINK));
    Ok(Backing { cannot_shrink: sealed && magic == TMPFS_MAGIC, page })
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

/// The `SIGBUS` handler (see the module docs). Async-signal-safe; `errno` is saved around it.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: as above; reading an int.
    let saved = unsafe { *errno };
    handle(sig, info, ctx);
    // SAFETY: as above; the interrupted code finds errno as it left it (mmap may have set it).
    unsafe { *errno = saved };
}

/// The work of [`on_sigbus`].
fn handle(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    let code = unsafe { (*info).si_code };
    if code <= 0 {
        // SI_USER, SI_QUEUE, SI_TKILL...: sent, not a fault. Nothing faulted, so returning
        // resumes the thread where it was; the handler stays.
        USER_SIGNALS.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // SAFETY: as above; with si_code > 0 the kernel raised the signal for a fault and si_addr
    // is the faulting address.
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
        assert!(!backing(&f).unwrap().cannot_shrink, "an unsealed memfd can shrink");
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

    /// The handler installed now (the `sa_sigaction` of SIGBUS).
    fn current_handler() -> libc::sighandler_t {
        // SAFETY: an all-zero sigaction is a valid value for sigaction to overwrite.
        let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a query (null new action); `now` is a valid sigaction to fill in.
        assert_eq!(unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut now) }, 0);
        now.sa_sigaction
    }

    /// A new shared mapping of 4 pages of `f`.
    fn map4(f: &std::fs::File) -> usize {
        // SAFETY: a new shared mapping of a 16 KiB file, at an address the kernel picks.
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
        p as usize
    }

    /// Issue 21: a SIGBUS another process sends (`kill -BUS`, SI_USER), or a thread sends to
    /// one thread (`tgkill`, SI_TKILL), used to be taken for a fault outside every window: the
    /// handler put the previous action back, so one stray signal disarmed the repair for good
    /// (and the next, with the default action, killed the process). Now it is ignored and
    /// counted: the process lives, the handler stays, and a truncated window is still repaired.
    #[test]
    fn a_sigbus_sent_by_a_process_is_ignored_and_the_handler_stays() {
        install().unwrap();
        let ours = on_sigbus as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as libc::sighandler_t;
        assert_eq!(current_handler(), ours);
        let before = user_signals();
        // What kill(2) sends (si_code SI_USER), directed at this thread: a process-directed
        // kill may be taken by another thread of the test process, and under qemu-user (the
        // aarch64 stage of CI) one that is just ending loses it.
        // SAFETY: a zeroed siginfo with the fields rt_tgsigqueueinfo reads; SIGBUS to this
        // thread of this process (allowed with SI_USER for one's own process); the handler is
        // installed.
        let r = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            info.si_signo = libc::SIGBUS;
            info.si_code = libc::SI_USER;
            libc::syscall(
                libc::SYS_rt_tgsigqueueinfo,
                libc::getpid(),
                libc::gettid(),
                libc::SIGBUS,
                &mut info as *mut libc::siginfo_t,
            )
        };
        assert_eq!(r, 0, "rt_tgsigqueueinfo: {}", std::io::Error::last_os_error());
        // SAFETY: sends SIGBUS to this thread (SI_TKILL), delivered before tgkill returns.
        let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), libc::SIGBUS) };
        assert_eq!(r, 0);
        // (Both are delivered to this thread before the calls return; the wait is a margin.)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while user_signals() < before + 2 {
            assert!(std::time::Instant::now() < deadline, "sent SIGBUS not counted");
            std::thread::yield_now();
        }
        assert_eq!(current_handler(), ours, "a sent SIGBUS must not change the handler");

        // A real fault in a watched, truncated window is still repaired.
        let f = crate::memory::memfd("sigbus-sent", 4 * 4096).unwrap();
        let base = map4(&f);
        let faults = Arc::new(AtomicU64::new(0));
        let w = watch(base, 4 * 4096, 4096, &faults).unwrap();
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile((base + 2 * 4096) as *mut u64, 5) };
        f.set_len(0).unwrap();
        // SAFETY: inside the mapping; the page is beyond the file now and faults once.
        let v = unsafe { std::ptr::read_volatile((base + 2 * 4096) as *const u64) };
        assert_eq!((v, faults.load(Ordering::Acquire)), (0, 1));
        assert_eq!(current_handler(), ours);
        drop(w);
        // SAFETY: unmapping what map4 mapped.
        unsafe { libc::munmap(base as *mut libc::c_void, 4 * 4096) };
    }

    /// A fault the kernel raises outside every watched window stays fatal (returning would
    /// repeat it for ever), even after a sent SIGBUS was ignored: run in a child process of this
    /// test binary, which must die of SIGBUS.
    #[test]
    fn a_kernel_fault_outside_every_window_stays_fatal() {
        const CHILD: &str = "VIRTIOFS_SIGBUS_TEST_CHILD";
        if std::env::var_os(CHILD).is_some() {
            // No core file for the expected death.
            let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
            install().unwrap();
            // SAFETY: sends SIGBUS to this thread; the handler is installed and ignores it.
            unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), libc::SIGBUS) };
            let f = crate::memory::memfd("sigbus-fatal", 4 * 4096).unwrap();
            let base = map4(&f);
            f.set_len(0).unwrap();
            // SAFETY: inside the (unwatched) mapping, beyond the file: a real SIGBUS, fatal.
            let v = unsafe { std::ptr::read_volatile(base as *const u64) };
            eprintln!("survived an unwatched fault (read {v})");
            std::process::exit(0);
        }
        use std::os::unix::process::ExitStatusExt;
        let name = "memory::sigbus::tests::a_kernel_fault_outside_every_window_stays_fatal";
        // Under emulation (tools/aarch64-check.sh) the test binary is not the host's: the
        // child runs under the same emulator, named by VIRTIOFS_TEST_RUNNER.
        let runner = std::env::var("VIRTIOFS_TEST_RUNNER").unwrap_or_default();
        let mut cmd: Vec<String> = runner.split_whitespace().map(str::to_string).collect();
        cmd.push(std::env::current_exe().unwrap().display().to_string());
        let out = std::process::Command::new(&cmd[0])
            .args(&cmd[1..])
            .args(["--exact", name, "--test-threads=1", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGBUS),
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
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
        assert!(!backing(&f).unwrap().cannot_shrink);
        rustix::fs::fcntl_add_seals(&f, rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW).unwrap();
        assert_eq!(backing(&f).unwrap(), Backing { cannot_shrink: true, page: rustix::param::page_size() });
    }
}
