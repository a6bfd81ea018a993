//! The asynchronous filesystem seam: any operation of a filesystem may complete later.
//!
//! A filesystem that can only answer some requests later (the passthrough's io_uring data path)
//! or every one of them (a remote filesystem whose requests travel on a socket) gives each
//! poller an engine, [`FsEngine`], from [`FileSystem::engine`], created on the poller's own
//! thread: the per-poller state where its rings or sockets live. The server decodes a request
//! ([`Request`]) and hands it to the engine with the data part of its reply buffers
//! ([`FsEngine::start`]); the engine answers at once ([`Started::Done`]), leaves it to the
//! synchronous [`FileSystem`] methods ([`Started::Sync`]), or keeps it ([`Started::Pending`])
//! and finishes it from a later [`FsEngine::poll`] of the same poller with a typed
//! [`Reply`] ([`Completions::complete`]). The server encodes every reply (the FUSE encoding
//! stays in the server) and applies the session state an operation changes (locks a RELEASE or
//! FLUSH ends), whichever way the request went. A filesystem without an engine (the RAM
//! filesystem) answers every request at once through its synchronous methods.
//!
//! # The buffer rule
//!
//! While a request is pending, the device's poller keeps all its guest buffers mapped and
//! untouched (it keeps the memory snapshot the request came with and does not complete the
//! descriptor chain), and *drains* its engine — polls until nothing is in flight — before it
//! applies a DMA_MAP/DMA_UNMAP memory change or stops or restarts its queues. So:
//!
//! - A pending request may hold its buffers: the server keeps its writable buffers (and a
//!   WRITE's payload) in a preallocated slot and gives them back to the engine by [`Token`]
//!   ([`Completions::data`], [`Completions::payload`]), so data can go straight between a
//!   socket or the kernel and the guest's buffers; an engine may also keep their addresses
//!   itself (iovecs from [`Writer::iovecs`] at start, for the kernel) until it completes the
//!   request. Nothing else of the request outlives [`FsEngine::start`]: names and arguments
//!   are borrowed from the request, so an engine copies what it needs.
//! - **Bounded time**: a pending request must complete in bounded time, whatever happens to
//!   the remote end or the storage (a time-out that completes it with an error is fine). A
//!   drain waits for as long as that takes, and DMA_UNMAP is acknowledged only after it.
//! - A request that waits for an outside event that may take any time (a SETLKW whose lock
//!   another request holds) is not pending: it is *waiting*, kept by the server, not by the
//!   engine ([`crate::server::waits`]); it holds no buffers, a drain does not wait for it, and it
//!   is answered through whatever memory is mapped when its event comes.

pub use super::dirent::DirentWriter;
#[cfg(doc)]
use super::FileSystem;
use super::{self as filesystem, Reply};
use crate::io::{HeldBuffers, Reader, Writer};
use crate::request::Request;

/// Names one pending request between the server and an engine (the index of the server's
/// slot for it). Valid from [`FsEngine::start`] until the engine completes the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(pub(crate) u32);

impl Token {
    /// The slot index (for an engine's own tables).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What [`FsEngine::start`] did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// Answered at once; for [`Reply::Data`] the data is in the `data` writer already.
    Done(filesystem::Result<Reply>),
    /// Kept: a later [`FsEngine::poll`] completes it ([`Completions::complete`]), in bounded
    /// time.
    Pending,
    /// Not for this engine: the server serves it through the synchronous [`FileSystem`]
    /// methods. The engine must not have touched the request's buffers.
    Sync,
}

/// The per-poller engine of a filesystem whose operations may complete later (see the module
/// documentation for the buffer rule). Created by [`FileSystem::engine`] on the poller's own
/// thread and used only there: nothing is handed to another thread.
///
/// Every request except the session's own (INIT, DESTROY, FORGET, BATCH_FORGET, INTERRUPT and
/// the lock requests GETLK, SETLK and SETLKW, which the server answers from its own state,
/// asking the filesystem only [`FileSystem::lock_handle`] and [`FileSystem::has_open_handles`],
/// synchronously) comes to [`FsEngine::start`].
pub trait FsEngine<F>: Send {
    /// Starts `req`, whose pending state is named `token`. `data` is the data part of the reply
    /// buffers (after the reply header) for the operations whose reply carries data (READ:
    /// exactly its size; READDIR, READDIRPLUS: at most its size; READLINK, GETXATTR, LISTXATTR:
    /// all the room there is), empty for the others. A WRITE's payload is in the request
    /// ([`crate::request::Op::Write`]).
    fn start(&mut self, fs: &F, token: Token, req: &mut Request<'_>, data: &mut Writer<'_>) -> Started;

    /// Does the engine's work of one poll round (reap completions, read sockets) and completes
    /// finished requests through `done`. Called every round of the poller, so it must be cheap
    /// when nothing happened.
    fn poll(&mut self, fs: &F, done: &mut Completions<'_>);

    /// Requests started [`Started::Pending`] and not completed yet.
    fn in_flight(&self) -> usize;

    /// What a poller whose only work is this engine's pending requests may block on instead of
    /// calling [`Self::poll`] every round ([`Readiness`]); `None` (the default): poll.
    fn readiness(&self) -> Option<Readiness<'_>> {
        None
    }
}

/// How a poller may wait for an engine's pending requests ([`FsEngine::readiness`]): until the
/// descriptor is ready or `within` has passed, then it polls the engine again. The device's
/// engines answer with the same type.
pub use virtiofs_readiness::Readiness;

/// What a request's slot gives back to the engine at completion time.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// All the writable buffers.
    pub(crate) writable: HeldBuffers,
    /// A WRITE's payload.
    pub(crate) payload: HeldBuffers,
    /// Bytes of the data part (after the reply header).
    pub(crate) data_len: usize,
    /// The slot holds a pending request.
    pub(crate) busy: bool,
}

/// How an engine completes requests from [`FsEngine::poll`]: by [`Token`], with a typed reply,
/// and with access to the buffers of the requests it still holds.
pub struct Completions<'c> {
    pub(crate) held: &'c [Held],
    pub(crate) done: &'c mut Vec<(Token, filesystem::Result<Reply>)>,
}

impl std::fmt::Debug for Completions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completions").field("done", &self.done.len()).finish()
    }
}

impl<'c> Completions<'c> {
    /// Completes the pending request `token` with `reply` (the server encodes it into the
    /// request's reply buffers; for [`Reply::Data`] the data must already be in
    /// [`Completions::data`]). A token that is not pending is ignored.
    pub fn complete(&mut self, token: Token, reply: filesystem::Result<Reply>) {
        if self.held.get(token.index()).is_some_and(|h| h.busy) {
            self.done.push((token, reply));
        }
    }

    /// The data part of the pending request `token`'s reply buffers (after the reply header),
    /// from its start, as in [`FsEngine::start`]; `None` if `token` is not pending.
    pub fn data(&self, token: Token) -> Option<Writer<'c>> {
        let held: &'c [Held] = self.held;
        let h = held.get(token.index()).filter(|h| h.busy)?;
        let mut w = h.writable.writer();
        w.split_at(std::mem::size_of::<crate::abi::OutHeader>()).ok()?;
        w.split_at(h.data_len.min(w.available())).ok()
    }

    /// The payload of the pending WRITE `token`, from its start; `None` if `token` is not a
    /// pending WRITE.
    pub fn payload(&self, token: Token) -> Option<Reader<'c>> {
        let held: &'c [Held] = self.held;
        let h = held.get(token.index()).filter(|h| h.busy && !h.payload.is_empty())?;
        Some(h.payload.reader())
    }
}
