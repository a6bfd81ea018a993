//! Removing a function at run time as a surprise removal would, but asked first.
//!
//! [`StopHandle::request_removal`](super::StopHandle::request_removal) asks the control plane to
//! let the device go. If the client set the device-request interrupt's eventfd (vfio's
//! `VFIO_PCI_REQ_IRQ_INDEX`, which QEMU's `vfio-user-pci` sets at realize), the control plane
//! signals it and keeps serving: QEMU then asks the guest to unplug the device through the
//! hot-plug controller of its slot, the guest's driver drains its queues and resets the device,
//! and QEMU drops the device and hangs up, which ends the removal ([`Removal::Released`]). A
//! client that holds on past the profile's `remove_timeout_ms` is disconnected
//! ([`Removal::TimedOut`]), as is at once a client that set no such eventfd
//! ([`Removal::NotAsked`]).
//!
//! From the request on, the socket takes no new connection (its file is removed at once, the
//! listener no longer served) and no connection waits behind the client.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// How the removal of a function ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The client let the device go (hung up) after the device-request interrupt.
    Released,
    /// The client still held the device when `remove_timeout_ms` ran out: it was disconnected.
    TimedOut,
    /// The client set no device-request eventfd: it was disconnected at once.
    NotAsked,
    /// No client was connected.
    NoClient,
    /// The server was stopped before the removal ended (the daemon shut down).
    Stopped,
}

impl Removal {
    /// How the removal ended, in words (what `delete_function` replies).
    pub fn describe(self) -> &'static str {
        match self {
            Removal::Released => "client released it",
            Removal::TimedOut => "timed out",
            Removal::NotAsked => "client takes no removal request: disconnected",
            Removal::NoClient => "no client",
            Removal::Stopped => "stopped",
        }
    }

    fn code(self) -> u8 {
        match self {
            Removal::Released => 1,
            Removal::TimedOut => 2,
            Removal::NotAsked => 3,
            Removal::NoClient => 4,
            Removal::Stopped => 5,
        }
    }

    fn from_code(c: u8) -> Option<Removal> {
        [Removal::Released, Removal::TimedOut, Removal::NotAsked, Removal::NoClient, Removal::Stopped]
            .into_iter()
            .find(|r| r.code() == c)
    }
}

impl std::fmt::Display for Removal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// The removal request and its outcome, shared by the server and its stop handles.
#[derive(Debug, Default)]
pub(super) struct RemovalCell {
    requested: AtomicBool,
    outcome: AtomicU8,
}

impl RemovalCell {
    pub(super) fn request(&self) {
        self.requested.store(true, Ordering::SeqCst);
    }

    pub(super) fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Records how the removal ended (the first outcome stays).
    pub(super) fn end(&self, how: Removal) {
        let _ = self.outcome.compare_exchange(0, how.code(), Ordering::SeqCst, Ordering::SeqCst);
    }

    pub(super) fn outcome(&self) -> Option<Removal> {
        Removal::from_code(self.outcome.load(Ordering::SeqCst))
    }
}

/// The control plane's side of a removal in progress: since when the client has been asked.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    pub(super) deadline: Instant,
}

impl Pending {
    pub(super) fn new(bound: Duration) -> Self {
        Pending { deadline: Instant::now() + bound }
    }

    /// How long the event loop may sleep before the bound runs out.
    pub(super) fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    pub(super) fn expired(&self) -> bool {
        Instant::now() >= self.deadline
    }
}
