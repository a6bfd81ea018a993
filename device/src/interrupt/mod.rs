//! Interrupt eventfds: how the device holds and signals the descriptors a client hands over for
//! its MSI-X vectors (DEVICE_SET_IRQS) and its device-request interrupt. Both the control plane
//! ([`crate::control`]) and the pollers ([`crate::poller`]) signal them; the mask and pending
//! state that gates an MSI-X vector is [`crate::pci::msix::MsixShared`].

use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

mod sys;

/// MSI-X eventfds by vector number, as set by DEVICE_SET_IRQS.
pub type Irqs = Arc<[Option<File>]>;

/// Makes a received interrupt eventfd non-blocking (on its open file description, which the
/// client shares: QEMU's eventfds are `EFD_NONBLOCK` already). A client may hand over an eventfd
/// without `EFD_NONBLOCK` whose counter it set to 2^64-2: a blocking write would then wait for
/// ever, on the control plane or a poller.
pub(crate) fn set_nonblocking(f: &File) -> io::Result<()> {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    let flags = fcntl_getfl(f)?;
    if !flags.contains(OFlags::NONBLOCK) {
        fcntl_setfl(f, flags | OFlags::NONBLOCK)?;
    }
    Ok(())
}

/// What signalling an interrupt eventfd found ([`signal_eventfd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signalled {
    /// The counter went up by one.
    Done,
    /// The counter is full (2^64-2: nobody reads it, a legitimate consumer never lets it get
    /// there), or the write waited past [`STUCK_AFTER`] and the watchdog ended it: the client
    /// is feeding us a descriptor to block on, and the vector's interrupts are broken.
    Stuck,
}

/// Signals an interrupt eventfd (adds 1 to its counter) without ever waiting for long.
///
/// The descriptor was made non-blocking on receipt ([`set_nonblocking`]), but the flag lives on
/// the open file description the client shares: a client can clear `O_NONBLOCK` again and fill
/// the counter, and the kernel offers no per-call non-blocking write for an eventfd
/// (`pwritev2(RWF_NOWAIT)` is `EOPNOTSUPP` there). So the write is guarded: the calling thread
/// publishes that it is inside it, and the watchdog thread ([`start_watchdog`]) interrupts a
/// write still under way after [`STUCK_AFTER`] with a signal whose handler does nothing and is
/// installed without `SA_RESTART`, so the write fails `EINTR`. Either way the answer is
/// [`Signalled::Stuck`], which the caller turns into a broken function, never a wait.
pub(crate) fn signal_eventfd(f: &File) -> io::Result<Signalled> {
    let r = GUARD.with(|g| {
        g.enter();
        let r = (&*f).write(&1u64.to_ne_bytes());
        g.leave();
        r
    });
    match r {
        Ok(_) => Ok(Signalled::Done),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
            Ok(Signalled::Stuck)
        }
        Err(e) => Err(e),
    }
}

/// How long an interrupt write may wait before the watchdog ends it: between one and two of
/// its ticks.
pub const STUCK_AFTER: Duration = Duration::from_millis(5);

/// One thread's guard over its eventfd writes: `seq` is odd while a write is under way.
struct Guard {
    tid: i32,
    seq: AtomicU64,
}

impl Guard {
    #[inline]
    fn enter(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
    }

    #[inline]
    fn leave(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
    }
}

thread_local! {
    static GUARD: Arc<Guard> = {
        let g = Arc::new(Guard { tid: sys::gettid(), seq: AtomicU64::new(0) });
        start_watchdog();
        if let Ok(mut all) = watchdog().guards.lock() {
            all.push(Arc::downgrade(&g));
        }
        g
    };
}

struct Watchdog {
    guards: Mutex<Vec<Weak<Guard>>>,
    /// Writes the watchdog ended.
    ended: AtomicU64,
}

fn watchdog() -> &'static Watchdog {
    static W: OnceLock<Watchdog> = OnceLock::new();
    W.get_or_init(|| Watchdog { guards: Mutex::new(Vec::new()), ended: AtomicU64::new(0) })
}

/// Interrupt writes the watchdog has ended so far (in this process).
pub fn writes_ended() -> u64 {
    watchdog().ended.load(Ordering::Relaxed)
}

/// Installs the interrupting signal's handler and starts the watchdog thread, once per process.
/// The daemon calls it as it starts its pollers; otherwise the first interrupt write does.
pub fn start_watchdog() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        if let Err(e) = sys::install_interrupting_handler() {
            log::error!("interrupt watchdog: cannot install its signal handler: {e}");
            return;
        }
        let spawned = std::thread::Builder::new().name("irq-watchdog".into()).spawn(watch);
        if let Err(e) = spawned {
            log::error!("interrupt watchdog: cannot start: {e}");
        }
    });
}

/// The watchdog: every half [`STUCK_AFTER`], a thread found inside the same write as last time
/// is interrupted.
fn watch() {
    let w = watchdog();
    let mut last: Vec<u64> = Vec::new();
    loop {
        // (A timed futex wait: the daemon's system-call filter has no nanosleep.)
        std::thread::park_timeout(STUCK_AFTER / 2);
        let Ok(mut guards) = w.guards.lock() else { return };
        guards.retain(|g| g.strong_count() > 0);
        last.resize(guards.len(), 0);
        for (g, last) in guards.iter().zip(last.iter_mut()) {
            let Some(g) = g.upgrade() else { continue };
            let seq = g.seq.load(Ordering::SeqCst);
            // (Read again just before: a write that ended meanwhile is not interrupted; one
            // ending between the read and the signal sees it in its next system call, EINTR.)
            if seq % 2 == 1 && seq == *last && g.seq.load(Ordering::SeqCst) == seq {
                w.ended.fetch_add(1, Ordering::Relaxed);
                // Not a warning yet: on a loaded machine the thread may only have been
                // descheduled around a write that cannot block; the signal then ends nothing.
                // A write it did end fails, and its caller marks the vector broken (and says so).
                log::debug!("interrupt watchdog: thread {} has been in an eventfd write for over {STUCK_AFTER:?}; interrupting it", g.tid);
                sys::interrupt_thread(g.tid);
            }
            *last = seq;
        }
    }
}

/// Whether `f` can be an eventfd (what an interrupt descriptor must be: we write 8 bytes to it):
/// an anonymous-inode file. Without procfs (a sandboxed daemon has none) the kinds of anonymous
/// inode cannot be told apart, but the others (epoll, timerfd, signalfd, io_uring, ...) fail a
/// write at once; what is refused is anything a write could block on or change: a pipe, a
/// socket, a file, a memfd.
pub(crate) fn is_eventfd(f: &File) -> bool {
    /// `ANON_INODE_FS_MAGIC` (`linux/magic.h`).
    const ANON_INODE_FS_MAGIC: u64 = 0x0904_1934;
    rustix::fs::fstatfs(f).is_ok_and(|st| st.f_type as u64 == ANON_INODE_FS_MAGIC)
}
