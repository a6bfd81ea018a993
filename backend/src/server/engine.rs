//! A poller's side of the server: [`PollerEngine`] serves the requests of one poller, hands
//! them to the filesystem's engine when it has one ([`crate::filesystem::seam`]), keeps the pending ones in
//! preallocated slots (their reply buffers held, `io::HeldBuffers`),
//! encodes their replies when the engine completes them, and keeps the poller's waiting SETLKW
//! requests ([`LockWaits`]). A request executed again after a crash is answered as its rule
//! says ([`super::replay`]), whichever way it and the LOOKUP or OPEN its rule asks for go.

use std::sync::Arc;

use vm_memory::VolatileSlice;

use super::dispatch::{Dispatch, Post};
use super::replay::{Next, Replay, Rule};
use super::reply::{error_into, reply_error};
use super::{data_part, LockWait, Result, Served, Server, Session};
use crate::abi::InHeader;
use crate::filesystem::seam::{Completions, FsEngine, Held, Started, Token};
use crate::filesystem::{self, FileSystem, Reply};
use crate::io::{Reader, Writer};
use crate::request::{NameBuf, Op, Request};
use crate::server::waits::LockWaits;

/// What [`PollerEngine::submit`] did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// Answered at once: this many bytes of reply.
    Done(u32),
    /// Pending in the filesystem's engine: [`PollerEngine::poll`] reports it.
    Pending,
    /// A SETLKW waiting for its lock ([`Served::Wait`]), parked in the engine's
    /// [`LockWaits`]: [`PollerEngine::poll_waits`] answers it. Its buffers are not held.
    Wait(LockWait),
}

/// How a pending request ended, as [`PollerEngine::poll`] reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Status {
    /// The errno it was answered with, 0 for success.
    pub errno: i32,
    /// Bytes of file data it read or wrote.
    pub data: u64,
}

/// What the server keeps of a pending request besides its buffers.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The poller's id for it.
    id: u64,
    unique: u64,
    nodeid: u64,
    post: Post,
    /// The cap of the count its reply reports ([`super::reply::encode`]).
    limit: u64,
    /// A request executed again whose answer is still being decided (its [`Replay`] is in
    /// [`PollerEngine::replays`]).
    replay: bool,
}

impl Default for Slot {
    fn default() -> Self {
        Slot { id: 0, unique: 0, nodeid: 0, post: Post::None, limit: 0, replay: false }
    }
}

/// The requests of one poller: served at once through the server, or started on the
/// filesystem's engine ([`FileSystem::engine`]) and completed from [`PollerEngine::poll`];
/// SETLKW requests that must wait are parked ([`LockWaits`]). The device's poller drives it
/// through its `Engine` face (the root crate's `FuseEngine`).
///
/// Contract (the device poller's, for `Outcome::Pending`): every buffer of a request answered
/// [`Submitted::Pending`] stays mapped and untouched until [`PollerEngine::poll`] reports it,
/// and all calls come from one thread.
pub struct PollerEngine<F: FileSystem> {
    // Dropped first: an engine may wait in its drop for what the kernel still does with the
    // buffers.
    fs_engine: Option<Box<dyn FsEngine<F>>>,
    server: Arc<Server<F>>,
    /// SETLKW requests that must wait are parked (not failed).
    can_wait: bool,
    slots: Vec<Slot>,
    held: Vec<Held>,
    free: Vec<u32>,
    in_flight: usize,
    /// Completions of one poll round (capacity kept).
    done: Vec<(Token, filesystem::Result<Reply>)>,
    waits: LockWaits<F>,
    /// Requests executed again after a crash, pending on the filesystem's engine (themselves
    /// or the LOOKUP or OPEN their rule asked for), by slot index: only after a crash.
    replays: Vec<(u32, Replay)>,
}

impl<F: FileSystem> std::fmt::Debug for PollerEngine<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollerEngine")
            .field("fs_engine", &self.fs_engine.is_some())
            .field("in_flight", &self.in_flight)
            .field("slots", &self.slots.len())
            .field("waits", &self.waits)
            .finish()
    }
}

impl<F: FileSystem> PollerEngine<F> {
    /// The engine of poller `poller` for requests to `server`: with the filesystem's own
    /// engine for that poller, if it has one ([`FileSystem::engine`]). Call it on the poller's
    /// thread.
    pub fn for_poller(server: Arc<Server<F>>, poller: usize) -> Self {
        let fs_engine = server.filesystem().engine(poller);
        Self::with_engine(server, fs_engine)
    }

    /// An engine for requests to `server` whose filesystem requests go to `fs_engine` (`None`:
    /// all at once through the synchronous methods).
    pub fn with_engine(server: Arc<Server<F>>, fs_engine: Option<Box<dyn FsEngine<F>>>) -> Self {
        PollerEngine {
            fs_engine,
            waits: LockWaits::new(server.clone()),
            server,
            can_wait: true,
            slots: Vec::new(),
            held: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            done: Vec::new(),
            replays: Vec::new(),
        }
    }

    /// An engine that serves every request at once through the filesystem's synchronous
    /// methods and never parks one: a SETLKW that would have to wait fails (`ENOLCK` on a
    /// server made with [`Server::with_lock_waits`], `EAGAIN` on one made with
    /// [`Server::new`], which never offered `POSIX_LOCKS`). For callers without a poll loop (a
    /// request handler called on its own, the tests): every [`Self::submit`] comes back
    /// [`Submitted::Done`].
    pub fn synchronous(server: Arc<Server<F>>) -> Self {
        PollerEngine { can_wait: false, ..Self::with_engine(server, None) }
    }

    /// The server.
    pub fn server(&self) -> &Arc<Server<F>> {
        &self.server
    }

    /// Whether the filesystem gave this poller an engine.
    pub fn has_fs_engine(&self) -> bool {
        self.fs_engine.is_some()
    }

    /// Serves one request (`id` is the caller's): at once, pending on the filesystem's engine,
    /// or waiting for a lock. See the type's contract for the buffers. This is the one way a
    /// request goes: decoded once ([`Request::parse`]), the session's own operations
    /// ([`Server`]), then the filesystem (its engine, or its synchronous methods), and the
    /// reply encoded by the server.
    pub fn submit(
        &mut self,
        id: u64,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> Submitted {
        self.submit_as(id, false, readable, writable)
    }

    /// Serves one request as [`Self::submit`] does; `replayed`: it is executed again after a
    /// crash of the process that served it (taken again from the device's in-flight record),
    /// and is answered as the server's replay rules say (`server/replay.rs`; DESIGN.md,
    /// "Executing again").
    pub fn submit_as(
        &mut self,
        id: u64,
        replayed: bool,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> Submitted {
        if replayed {
            self.server.replays.request();
        }
        let mut r = Reader::new(readable);
        let hdr: InHeader = match r.read_obj() {
            Ok(h) => h,
            Err(e) => {
                log::debug!("fuse: request without header: {e}");
                return Submitted::Done(done_len(reply_error(writable, 0, libc::EINVAL)));
            }
        };
        let mut names = NameBuf::new();
        // Used in place: a decoded request is not moved.
        let mut parsed = Request::parse(&hdr, r, &mut names, self.server.negotiated());
        if let Ok(req) = &mut parsed {
            return match self.start(id, req, writable, replayed) {
                Ok(submitted) => submitted,
                Err(e) => {
                    let served = self.server.fail_request(req, e, writable);
                    self.served(id, served)
                }
            };
        }
        match parsed {
            Err(e) => {
                let served = self.server.fail(&hdr, e, writable);
                self.served(id, served)
            }
            Ok(_) => Submitted::Done(0),
        }
    }

    fn served(&mut self, id: u64, served: Served) -> Submitted {
        match served {
            Served::Replied(n) => Submitted::Done(done_len(n)),
            Served::Wait(wait) => {
                self.waits.park(id, wait);
                Submitted::Wait(wait)
            }
        }
    }

    /// Serves a decoded request: the session's own operations, then the filesystem's engine
    /// (when it has one and takes the request) or its synchronous methods. `replayed`: executed
    /// again after a crash ([`Self::submit_as`]).
    fn start(
        &mut self,
        id: u64,
        req: &mut Request<'_>,
        writable: &[VolatileSlice<'_>],
        replayed: bool,
    ) -> Result<Submitted> {
        let server = &*self.server;
        if replayed && matches!(req.op, Op::Forget { .. } | Op::BatchForget { .. }) {
            // It may have run before the crash (its chain is returned right after): a second
            // decrement could free a node the kernel still holds; a reference left is a leak.
            return Ok(self.served(id, Served::Replied(0)));
        }
        let w = match server.session_op(req, writable, self.can_wait)? {
            Session::Done(served) => return Ok(self.served(id, served)),
            Session::Fs(w) => w,
        };
        let (mut data, limit) = data_part(&req.op, &w)?;
        let mut post = Post::of(&req.op);
        let replay = if replayed { replay_of(server, req) } else { Ok(None) };
        let replay = match replay {
            Ok(replay) => replay,
            Err(refused) => {
                let n = server.finish(post, req.nodeid, req.unique, &Err(refused), w, limit)?;
                return Ok(Submitted::Done(done_len(n)));
            }
        };
        let r = match self.fs_engine.as_deref_mut() {
            None => Dispatch(&server.fs).call(&req.ctx, req.nodeid, &mut req.op, &mut data),
            Some(engine) => {
                let index = free_slot(&mut self.slots, &mut self.held, &mut self.free);
                let payload = match &req.op {
                    Op::Write { data, .. } => Some(data.clone()),
                    _ => None,
                };
                let data_len = data.available();
                match engine.start(&server.fs, Token(index), req, &mut data) {
                    Started::Done(r) => r,
                    Started::Sync => Dispatch(&server.fs).call(&req.ctx, req.nodeid, &mut req.op, &mut data),
                    Started::Pending => {
                        self.free.pop();
                        self.in_flight += 1;
                        hold(&mut self.held[index as usize], writable, payload.as_ref(), data_len);
                        let (unique, nodeid, replay_slot) = (req.unique, req.nodeid, replay.is_some());
                        self.slots[index as usize] =
                            Slot { id, unique, nodeid, post, limit, replay: replay_slot };
                        if let Some(replay) = replay {
                            self.replays.push((index, replay));
                        }
                        return Ok(Submitted::Pending);
                    }
                }
            }
        };
        let r = match replay {
            None => r,
            Some(replay) => {
                // The session's part follows the filesystem's own answer; the reply, the rule.
                server.after(post, req.nodeid, &r);
                post = Post::None;
                let index = match self.fs_engine {
                    Some(_) => free_slot(&mut self.slots, &mut self.held, &mut self.free),
                    None => 0,
                };
                match drive(&mut self.fs_engine, server, Token(index), replay, r) {
                    Driven::Answer(r) => r,
                    Driven::Pending(replay) => {
                        // The LOOKUP or OPEN it asked for is pending on the engine.
                        self.free.pop();
                        self.in_flight += 1;
                        hold(&mut self.held[index as usize], writable, None, 0);
                        let (unique, nodeid) = (req.unique, req.nodeid);
                        self.slots[index as usize] = Slot { id, unique, nodeid, post, limit, replay: true };
                        self.replays.push((index, replay));
                        return Ok(Submitted::Pending);
                    }
                }
            }
        };
        let n = server.finish(post, req.nodeid, req.unique, &r, w, limit)?;
        Ok(Submitted::Done(done_len(n)))
    }

    /// Polls the filesystem's engine and reports the requests it finished as `(id, reply
    /// length, status)`, their replies encoded into their buffers; returns how many.
    pub fn poll(&mut self, done: &mut dyn FnMut(u64, u32, Status)) -> usize {
        let Some(engine) = self.fs_engine.as_deref_mut() else {
            return 0;
        };
        let mut finished = std::mem::take(&mut self.done);
        finished.clear();
        engine.poll(&self.server.fs, &mut Completions { held: &self.held, done: &mut finished });
        let mut n = 0;
        for (token, r) in finished.drain(..) {
            let i = token.index();
            let Some(h) = self.held.get_mut(i).filter(|h| h.busy) else {
                continue;
            };
            let slot = self.slots[i];
            let (mut r, mut post) = (r, slot.post);
            if slot.replay {
                if let Some(at) = self.replays.iter().position(|&(k, _)| k == token.0) {
                    let (_, replay) = self.replays.swap_remove(at);
                    self.server.after(post, slot.nodeid, &r);
                    post = Post::None;
                    match drive(&mut self.fs_engine, &self.server, token, replay, r) {
                        Driven::Answer(answer) => r = answer,
                        Driven::Pending(replay) => {
                            // The LOOKUP or OPEN it asked for is pending, as the same slot.
                            self.slots[i].post = Post::None;
                            self.replays.push((token.0, replay));
                            continue;
                        }
                    }
                }
                self.slots[i].replay = false;
            }
            let w = h.writable.writer();
            let encoded = self.server.finish(post, slot.nodeid, slot.unique, &r, w.clone(), slot.limit);
            let (len, status) = match encoded {
                Ok(len) => {
                    let data = match r {
                        Ok(Reply::Data(n) | Reply::Written(n)) => (n as u64).min(slot.limit),
                        _ => 0,
                    };
                    (len, Status { errno: 0, data })
                }
                Err(e) => {
                    log::trace!("fuse: unique {} failed: {e}", slot.unique);
                    (error_into(w, slot.unique, e.errno()), Status { errno: e.errno(), data: 0 })
                }
            };
            h.writable.clear();
            h.payload.clear();
            h.busy = false;
            self.free.push(token.0);
            self.in_flight -= 1;
            done(slot.id, u32::try_from(len).unwrap_or(0), status);
            n += 1;
        }
        self.done = finished;
        n
    }

    /// Requests answered [`Submitted::Pending`] and not reported yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// What the poller may block on while its only work is this engine's pending requests
    /// (the filesystem engine's [`FsEngine::readiness`]; every completion is handed over in
    /// each poll, so nothing else is due).
    pub fn readiness(&self) -> Option<crate::filesystem::seam::Readiness<'_>> {
        self.fs_engine.as_deref().and_then(|e| e.readiness())
    }

    /// Answers the parked SETLKW requests whose lock came (or that were interrupted), as `(id,
    /// reply bytes)`; returns how many.
    pub fn poll_waits(&mut self, answer: &mut dyn FnMut(u64, &[u8])) -> usize {
        self.waits.poll(answer)
    }

    /// The parked SETLKW requests as `(id, wait token)` (a live update).
    pub fn wait_tokens(&self) -> Vec<(u64, u64)> {
        self.waits.tokens()
    }

    /// Parks again the SETLKW of wait token `token` (taken over from another process) under
    /// `id`; false if the session has no such waiting request.
    pub fn adopt_wait(&mut self, id: u64, token: u64) -> bool {
        match self.waits.server().resume_wait(token) {
            Some(w) => {
                self.waits.park(id, w);
                true
            }
            None => false,
        }
    }

    /// Parked SETLKW requests.
    pub fn waiting(&self) -> usize {
        self.waits.len()
    }

    /// Drops every parked SETLKW request unanswered (the queues stop).
    pub fn cancel_waits(&mut self) {
        self.waits.cancel_all();
    }
}

/// A reply length as the device counts it.
fn done_len(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

/// The index of a free slot, made if none is (kept from then on); taken only when a request
/// is left pending in it.
fn free_slot(slots: &mut Vec<Slot>, held: &mut Vec<Held>, free: &mut Vec<u32>) -> u32 {
    if let Some(&i) = free.last() {
        return i;
    }
    // More pending requests than ever before: one more slot (kept from now on).
    slots.push(Slot::default());
    held.push(Held::default());
    let i = u32::try_from(slots.len() - 1).unwrap_or(u32::MAX);
    free.push(i);
    i
}

/// Keeps a pending request's buffers in its slot.
fn hold(h: &mut Held, writable: &[VolatileSlice<'_>], payload: Option<&Reader<'_>>, data_len: usize) {
    h.writable.hold(writable);
    match payload {
        Some(p) => h.payload.hold_reader(p),
        None => h.payload.clear(),
    }
    h.data_len = data_len;
    h.busy = true;
}

/// The replay of `req`, executed again after a crash: `None` when its answer stands whatever
/// it is (its rule does not matter), `Err` when it is refused without being executed.
fn replay_of<F: FileSystem>(
    server: &Server<F>,
    req: &Request<'_>,
) -> std::result::Result<Option<Replay>, filesystem::Error> {
    let rule = Rule::of(req);
    if let Some(refused) = rule.refusal() {
        server.replays.refused();
        return Err(refused);
    }
    Ok(rule.matters().then(|| Replay::new(req, rule)))
}

/// How far [`drive`] took a replayed request.
enum Driven {
    /// To its reply.
    Answer(filesystem::Result<Reply>),
    /// To a LOOKUP or OPEN left pending on the filesystem's engine (completed later under the
    /// same token).
    Pending(Replay),
}

/// Takes the replayed request `replay` from the answer `r` of its last step to its reply:
/// runs the LOOKUP or OPEN its rule asks for the one way a request goes (the filesystem's
/// engine, as `token`, or its synchronous methods), until one is left pending on the engine.
fn drive<F: FileSystem>(
    engine: &mut Option<Box<dyn FsEngine<F>>>,
    server: &Server<F>,
    token: Token,
    mut replay: Replay,
    mut r: filesystem::Result<Reply>,
) -> Driven {
    loop {
        let ctx = replay.ctx();
        let mut req = match replay.next(r) {
            Next::Answer { reply, forget, changed } => {
                if let Some(ino) = forget {
                    server.fs.forget(&ctx, ino, 1);
                }
                if changed {
                    server.replays.answered_as_first();
                }
                return Driven::Answer(reply);
            }
            Next::Run(req) => req,
        };
        // A LOOKUP or an OPEN: no data part.
        let mut none = Writer::new(&[]);
        r = match engine.as_deref_mut().map(|e| e.start(&server.fs, token, &mut req, &mut none)) {
            Some(Started::Done(r)) => r,
            None | Some(Started::Sync) => {
                Dispatch(&server.fs).call(&req.ctx, req.nodeid, &mut req.op, &mut none)
            }
            Some(Started::Pending) => return Driven::Pending(replay),
        };
    }
}
