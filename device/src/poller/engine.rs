//! What the pollers hand requests to: the [`RequestHandler`] a function serves its requests
//! with, and the per-poller [`Engine`] it may give each poller to complete them asynchronously
//! ([`Outcome`]: done, pending on the engine, or waiting on an outside event).

use vm_memory::VolatileSlice;

use super::wait::Readiness;
use crate::stats::Tally;

/// How the poller took a request from its queue, handed with its buffers to
/// [`RequestHandler::handle`] and [`Engine::submit`] (passed by value: two words in a register).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Taken {
    /// The queue's index.
    pub queue: u16,
    /// The request was in flight when the process that served the queue died, and is executed
    /// again from the in-flight record (crash recovery: [`crate::virtq::Chain::replayed`]). Its
    /// first execution may have changed the backend's state before the crash; the handler may
    /// answer it as that execution would have (DESIGN.md, "Executing again").
    pub replayed: bool,
}

/// Serves one request. Implemented by the FUSE server glue; the device knows nothing of FUSE.
pub trait RequestHandler: Send + Sync + 'static {
    /// Handles the request taken as `taken` says (its queue, whether it is executed again after
    /// a crash) whose device-readable buffers are `readable` and
    /// device-writable buffers are `writable`; returns the number of bytes written (the used
    /// length) and what the request was for the statistics ([`Tally`]: its class, errno and
    /// bytes of data; `Tally::default()` counts it as
    /// [`OpClass::Other`](crate::stats::OpClass::Other), successful). Must not block for long: it
    /// runs on a poller that serves other queues too.
    fn handle(
        &self,
        taken: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally);

    /// The asynchronous engine of poller `poller` (for example an io_uring owned by that
    /// poller's core), or `None` to serve every request synchronously through [`Self::handle`].
    /// Called once on the poller's own thread when it starts.
    fn engine(&self, poller: usize) -> Option<Box<dyn Engine>> {
        let _ = poller;
        None
    }

    /// Replies of this handler's requests were written to a queue and are about to be
    /// published to the driver (the used index moved): what must happen before the driver
    /// can see them happens now. Called on the poller, once per publish of a round that
    /// completed requests; must cost next to nothing when nothing is due.
    fn before_publish(&self) {}

    /// Whether [`Self::before_publish`] has something to do (a reply written now could name
    /// what is not ready yet): the poller then holds the round's later returns until it ran.
    /// Called on the poller after each request; must be cheap. Without it, returns are written
    /// as each request ends.
    fn publish_due(&self) -> bool {
        false
    }

    /// The device was reset (by the driver, by DEVICE_RESET, or because the client went away):
    /// every queue is stopped, no request is in flight and none waits any more. Drop what belonged
    /// to the driver's session and must not outlive the device. Called on the control plane
    /// thread, after every poller has stopped.
    fn reset(&self) {}
}

/// How a request submitted to an [`Engine`] stands when `submit` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Finished: this many bytes were written to the writable buffers.
    Done(u32),
    /// Still running, on the request's buffers: [`Engine::poll`] will report it, in bounded
    /// time (the poller waits for it before memory or queues change).
    Pending,
    /// Waiting on an outside event that may take any time (another request releasing something
    /// it needs). The engine keeps nothing of the request's buffers; it answers it later with
    /// the reply's bytes through [`Engine::poll_waits`], which the poller copies into the
    /// request's writable buffers (at most [`MAX_WAIT_REPLY`] bytes).
    Wait,
}

/// Most reply bytes a waiting request ([`Outcome::Wait`]) can be answered with: the poller keeps
/// where this many bytes at the start of its writable buffers are.
pub const MAX_WAIT_REPLY: usize = 64;

/// A per-poller engine that completes requests asynchronously, polled on the same core (run to
/// completion: no hand-off to another thread).
///
/// A request can be left in two ways:
/// - [`Outcome::Pending`]: the engine works on the request's buffers. The poller guarantees that
///   they stay mapped and untouched by the device until `poll` reports it: it keeps the
///   guest-memory snapshot the request was submitted with, does not complete the descriptor
///   chain, and *drains* the engine (polls until `in_flight() == 0`) before it switches memory
///   snapshots or stops its queues. An engine may therefore hand the buffers' addresses to the
///   kernel (io_uring) and keep them until completion. A drain waits for as long as that takes,
///   so a pending request must finish in bounded time.
/// - [`Outcome::Wait`]: the request waits for an outside event, for as long as that takes (a
///   lock another request holds). The engine must not keep the request's buffers; the poller
///   remembers where the start of its writable buffers is (as guest addresses) and writes the
///   reply that [`Engine::poll_waits`] hands over, through whatever memory snapshot is current
///   then. Waiting requests are not `in_flight`: a drain does not wait for them, and they survive
///   memory changes (DMA_MAP and DMA_UNMAP are never held up by a wait). When the queues stop
///   or restart (device reset, client gone, shutdown) the poller first calls
///   [`Engine::cancel_waits`] and drops every waiting request unanswered: the driver that made
///   them has reset the queues.
pub trait Engine: Send {
    /// Starts the request `id` (opaque to the engine), taken as `taken` says (its queue,
    /// whether it is executed again after a crash), and tells the statistics what
    /// it is ([`Tally`]). Its class counts whatever the outcome; its errno and bytes only for
    /// [`Outcome::Done`] (a pending request's come from [`Self::poll`], a waiting one's from
    /// [`Self::poll_waits`]).
    fn submit(
        &mut self,
        id: u64,
        taken: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (Outcome, Tally);
    /// Reports finished [`Outcome::Pending`] requests as `(id, bytes written, tally)` (the
    /// tally's errno and bytes; its class is the one [`Self::submit`] gave); returns how many
    /// it reported.
    fn poll(&mut self, done: &mut dyn FnMut(u64, u32, Tally)) -> usize;
    /// [`Outcome::Pending`] requests submitted and not yet reported.
    fn in_flight(&self) -> usize;

    /// What an adaptive poller whose only work is pending requests (of this engine and of the
    /// other functions' on the same poller) may block on instead of polling ([`Readiness`]: a
    /// descriptor and a bound), asked each time it would spin for them; `None` (the default):
    /// poll every round.
    fn readiness(&self) -> Option<Readiness<'_>> {
        None
    }
    /// Answers [`Outcome::Wait`] requests whose event came, as `(id, reply bytes, tally)` (its
    /// errno and bytes; the class is the one [`Self::submit`] gave); returns how many. Called
    /// every round while any request waits.
    fn poll_waits(&mut self, answer: &mut dyn FnMut(u64, &[u8], Tally)) -> usize {
        let _ = answer;
        0
    }
    /// Forgets every [`Outcome::Wait`] request without answering it; the poller drops them too.
    /// Called before the queues stop or restart.
    fn cancel_waits(&mut self) {}

    /// The [`Outcome::Wait`] requests as `(id, token)`, the token being what another process's
    /// engine of the same backend takes them back by ([`Self::adopt_wait`]): a live update
    /// hands waiting requests over (issue 22). The default names none (the function is then
    /// not at a quiet point while one waits).
    fn wait_tokens(&self) -> Vec<(u64, u64)> {
        Vec::new()
    }

    /// Takes over a waiting request that [`Self::wait_tokens`] named `token` in the old
    /// process, as request `id` of this poller: it is answered from [`Self::poll_waits`] as if
    /// submitted here. False if the backend has no such waiting request.
    fn adopt_wait(&mut self, id: u64, token: u64) -> bool {
        let _ = (id, token);
        false
    }
}
