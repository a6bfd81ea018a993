//! Waiting on an engine instead of polling it: an adaptive poller whose only work is requests
//! pending on its engine (a remote server's replies, say) blocks in `poll(2)` on the engine's
//! readiness descriptor ([`Readiness`], from [`super::engine::Engine::readiness`]) and on its own wake-up
//! ([`Wake`]), so a reply wakes it at once and the core is free meanwhile. A busy poller (a
//! dedicated core) never waits here.
//!
//! The wake-up is an eventfd beside the thread's park token: whoever unparks a poller (a control
//! message, a doorbell through the socket) calls [`Wake::wake`], which also writes the eventfd
//! while the poller says it is about to block ([`Wake::arm`]). The poller arms first and then
//! looks once more at its messages and rings, so a wake-up either comes after the arming (the
//! eventfd is written and `poll` returns at once) or before that last look (which sees its
//! message or request). The wait is bounded anyway: by the engines' timers and the poller's
//! `idle_sleep_us`.
//!
//! **Doorbell sources** (the one-hop wake-up). With doorbells on the transport, a function's
//! transport gives its pollers a descriptor that turns readable when the client sent something
//! (the vfio-user client's socket: a doorbell is a REGION_WRITE message). A sleeping poller
//! waits on it too, so the guest's doorbell wakes the poller that owns the queue directly, at the
//! same moment as the control plane that reads the message, instead of after it (two hops). The
//! poller never reads the descriptor. When the control plane has read the message before the
//! poller's `poll` looked, the poller does not wake from it: the control plane's kick then writes
//! the eventfd as before, so no wake-up is lost, only the hop not saved.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::Thread;
use std::time::Duration;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

pub use virtiofs_readiness::Readiness;

/// A poller's wake-up while it blocks in `poll(2)` (see the module documentation).
#[derive(Debug)]
pub(crate) struct Wake {
    armed: AtomicBool,
    fd: OwnedFd,
}

impl Wake {
    pub(crate) fn new() -> std::io::Result<Self> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Wake { armed: AtomicBool::new(false), fd })
    }

    /// Wakes the poller running on `thread`, parked or blocked in [`Self::wait`].
    pub(crate) fn wake(&self, thread: &Thread) {
        thread.unpark();
        if self.armed.load(Ordering::SeqCst) {
            // Full (2^64 - 2 wake-ups unread) is as good as written.
            let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
        }
    }

    /// The poller is about to block: wake-ups from now on write the eventfd. It must look at
    /// its messages and rings after this and before [`Self::wait`].
    pub(crate) fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Not blocking after all.
    pub(crate) fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    /// Blocks until one of `ready`'s descriptors is ready, one of the doorbell `sources` is
    /// readable (or hung up), a wake-up comes, or `timeout` passes; disarms. Returns whether a
    /// doorbell source ended the wait. At most [`MAX_POLL_FDS`] descriptors in all: past them
    /// the sources are left out (their doorbells still come as wake-ups) and then the timeout
    /// bounds the wait (the callers stay below).
    pub(crate) fn wait<const N: usize>(
        &self,
        ready: &heapless::Vec<Readiness<'_>, N>,
        sources: &[BorrowedFd<'_>],
        timeout: Duration,
    ) -> bool {
        let mut fds: heapless::Vec<PollFd<'_>, MAX_POLL_FDS> = heapless::Vec::new();
        let _ = fds.push(PollFd::new(&self.fd, PollFlags::IN));
        for r in ready.iter() {
            let Some(fd) = r.fd else { continue };
            let mut want = PollFlags::IN;
            if r.writable {
                want |= PollFlags::OUT;
            }
            let _ = fds.push(PollFd::from_borrowed_fd(fd, want));
        }
        let first_source = fds.len();
        for &fd in sources {
            if fds.push(PollFd::from_borrowed_fd(fd, PollFlags::IN)).is_err() {
                break;
            }
        }
        let t = Timespec {
            tv_sec: timeout.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: timeout.subsec_nanos().into(),
        };
        // EINTR and the like: the caller polls its engines and rings again either way.
        let _ = poll(&mut fds, Some(&t));
        self.disarm();
        if !fds[0].revents().is_empty() {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(self.fd.as_fd(), &mut b);
        }
        fds[first_source..].iter().any(|f| !f.revents().is_empty())
    }
}

/// Most descriptors one wait polls: the wake-up, the engines' and the doorbell sources.
pub(crate) const MAX_POLL_FDS: usize = 65;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn one(r: Readiness<'_>) -> heapless::Vec<Readiness<'_>, 1> {
        let mut v = heapless::Vec::new();
        let _ = v.push(r);
        v
    }

    #[test]
    fn a_wake_up_while_armed_ends_the_wait_and_one_before_is_not_lost() {
        let w = std::sync::Arc::new(Wake::new().unwrap());
        let r = Readiness { fd: None, writable: false, within: Duration::from_secs(10) };
        // Not armed: only the park token (the caller's last look finds the message).
        w.wake(&std::thread::current());
        w.arm();
        let t0 = Instant::now();
        let (w2, me) = (w.clone(), std::thread::current());
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w2.wake(&me);
        });
        w.wait(&one(r), &[], Duration::from_secs(10));
        assert!(t0.elapsed() < Duration::from_secs(5), "woken, not timed out");
        waker.join().unwrap();
        // The eventfd was drained: the next wait lasts its timeout.
        w.arm();
        let t0 = Instant::now();
        w.wait(&one(r), &[], Duration::from_millis(20));
        assert!(t0.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn a_doorbell_source_with_a_message_ends_the_wait_and_says_so() {
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let w = Wake::new().unwrap();
        let none = Readiness { fd: None, writable: false, within: Duration::from_secs(10) };
        // Nothing sent: the wait lasts its timeout and no source is reported.
        w.arm();
        let t0 = Instant::now();
        assert!(!w.wait(&one(none), &[a.as_fd()], Duration::from_millis(20)));
        assert!(t0.elapsed() >= Duration::from_millis(20));
        // A message from the client ends it at once, and the message is left for its reader.
        std::io::Write::write_all(&mut b, b"doorbell").unwrap();
        w.arm();
        let t0 = Instant::now();
        assert!(w.wait(&one(none), &[a.as_fd()], Duration::from_secs(10)));
        assert!(t0.elapsed() < Duration::from_secs(5));
        let mut got = [0u8; 8];
        std::io::Read::read_exact(&mut &a, &mut got).unwrap();
        assert_eq!(&got, b"doorbell");
        // A wake-up is not a source.
        w.arm();
        w.wake(&std::thread::current());
        assert!(!w.wait(&one(none), &[a.as_fd()], Duration::from_secs(10)));
    }

    #[test]
    fn a_ready_descriptor_ends_the_wait() {
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let w = Wake::new().unwrap();
        std::io::Write::write_all(&mut b, b"x").unwrap();
        let r = Readiness { fd: Some(a.as_fd()), writable: false, within: Duration::from_secs(10) };
        w.arm();
        let t0 = Instant::now();
        w.wait(&one(r), &[], Duration::from_secs(10));
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
