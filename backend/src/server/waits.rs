//! The SETLKW requests one poller keeps waiting ([`LockWaits`]).
//!
//! A poller's engine ([`crate::server::PollerEngine`]) serves every request through the server;
//! a SETLKW that has to wait comes back as [`Served::Wait`](crate::server::Served::Wait), and
//! the engine parks it here with the poller's id for it. A waiting request is not pending on
//! the filesystem seam ([`crate::filesystem::seam`]): it holds no buffers (the poller keeps where its reply
//! goes and writes the reply this hands out through the memory mapped then), and a drain does
//! not wait for it. Every poll round the engine calls [`LockWaits::poll`]: with nothing parked
//! that is one branch; with requests parked it is one atomic load of the lock table's generation
//! unless something changed since the last round, and only then does it ask the server about
//! each parked request and hand out the replies that are ready. A lock released through any
//! poller (another queue) bumps the generation, so waits are answered across pollers without a
//! thread ever blocking or being woken.

use std::sync::Arc;

use crate::filesystem::FileSystem;
use crate::server::{LockWait, Server};

/// The waiting SETLKW requests of one poller. Dropping it cancels them (without replies).
pub struct LockWaits<F: FileSystem> {
    server: Arc<Server<F>>,
    parked: Vec<(u64, LockWait)>,
    /// The lock generation the parked requests were last checked at.
    seen: u64,
}

impl<F: FileSystem> std::fmt::Debug for LockWaits<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockWaits").field("parked", &self.parked.len()).field("seen", &self.seen).finish()
    }
}

impl<F: FileSystem> LockWaits<F> {
    /// No requests waiting, for requests to `server`.
    pub fn new(server: Arc<Server<F>>) -> Self {
        LockWaits { server, parked: Vec::new(), seen: 0 }
    }

    /// The server.
    pub fn server(&self) -> &Arc<Server<F>> {
        &self.server
    }

    /// Keeps `wait` waiting; `id` is the caller's name for the request.
    pub fn park(&mut self, id: u64, wait: LockWait) {
        if self.parked.is_empty() {
            // Check at the next poll whatever the generation: the lock may have gone between
            // the request's attempt and now.
            self.seen = self.server.lock_generation().wrapping_sub(1);
        }
        self.parked.push((id, wait));
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.parked.len()
    }

    /// Whether no request waits.
    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }

    /// Hands out the replies of the parked requests that are done (granted, interrupted, ...), as
    /// `(id, reply bytes)`; returns how many.
    #[inline]
    pub fn poll(&mut self, answer: &mut dyn FnMut(u64, &[u8])) -> usize {
        if self.parked.is_empty() {
            return 0;
        }
        let generation = self.server.lock_generation();
        if generation == self.seen {
            return 0;
        }
        self.poll_changed(generation, answer)
    }

    #[cold]
    fn poll_changed(&mut self, generation: u64, answer: &mut dyn FnMut(u64, &[u8])) -> usize {
        // Read before the checks: a change after it is seen at the next poll.
        self.seen = generation;
        let server = &self.server;
        let mut n = 0;
        self.parked.retain(|(id, wait)| match server.wait_reply(wait) {
            Some(reply) => {
                answer(*id, &reply);
                n += 1;
                false
            }
            None => true,
        });
        n
    }

    /// Every parked request as `(the caller's id, its wait token)` (a live update: the new
    /// process parks them again, [`Server::resume_wait`]).
    pub fn tokens(&self) -> Vec<(u64, u64)> {
        self.parked.iter().map(|(id, w)| (*id, w.token())).collect()
    }

    /// Forgets every parked request without a reply (the device reset; their buffers are gone).
    pub fn cancel_all(&mut self) {
        for (_, wait) in self.parked.drain(..) {
            self.server.cancel_wait(&wait);
        }
    }
}

impl<F: FileSystem> Drop for LockWaits<F> {
    fn drop(&mut self) {
        self.cancel_all();
    }
}
