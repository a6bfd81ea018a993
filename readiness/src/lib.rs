//! How a poller may wait for an engine instead of polling it: a descriptor and a bound.
//!
//! An adaptive poller whose only work is requests pending on its engines (a remote server's
//! replies, say) asks each engine for its [`Readiness`] and blocks in `poll(2)` on those
//! descriptors until one is ready or the shortest bound passes. The device's `Engine` and the
//! filesystems' `FsEngine` both answer with this one type, so the glue between them passes it
//! through unchanged; it is a crate of its own because neither layer depends on the other.
#![deny(missing_docs)]

use std::os::fd::BorrowedFd;
use std::time::Duration;

/// How a poller whose only work is an engine's pending requests may wait for them.
#[derive(Debug, Clone, Copy)]
pub struct Readiness<'a> {
    /// Ready (readable, or writable if [`Self::writable`]) when the engine has progress to
    /// make (a socket with a reply); `None`: nothing to wait on but time (a reconnection's
    /// back-off, say).
    pub fd: Option<BorrowedFd<'a>>,
    /// Wait for the descriptor to become writable too (a send that did not finish, a connect
    /// in progress).
    pub writable: bool,
    /// Poll the engine again after this long at most, ready or not (its timers).
    pub within: Duration,
}
