//! The NFS backend's per-poller engine ([`NfsEngine`], an [`FsEngine`] of the NFS filesystem,
//! which lends it the pollers' [`Shared`] state and nothing else): every FUSE request that needs
//! the server becomes one NFSv3 call, or a short sequence of them, on the poller's own
//! non-blocking connection ([`Conn`]), and completes from a later poll round.
//!
//! **Slots.** The engine keeps one slot per pending request, indexed by the server's [`Token`]
//! (so it has as many as the server has pending requests, preallocated to `slots_per_poller`
//! and kept when more ever come). A slot holds what the request needs after `start` returns:
//! the caller's credential, the file handles (copied from the node table), the names (copied:
//! the request's own are borrowed), a symlink's target, the arguments, and where its state
//! machine is (`Call`: the next NFS call). Requests that need two or more calls (LOOKUP or
//! GETATTR after a CREATE whose reply lacks the handle or attributes, SETATTR after an exclusive
//! CREATE or an `O_TRUNC` open, LOOKUP before a `RENAME_NOREPLACE`, READ/WRITE larger than the
//! server's transfer size, COMMIT then the replays of writes the server lost) go on from the
//! reply of one call to the next. A slot never holds guest buffers: READ data goes into the
//! reply buffers the server holds for the request ([`Completions::data`], asked by the
//! connection when the reply arrives), WRITE data comes from the held payload
//! ([`Completions::payload`], asked each time the call is sent).
//!
//! **Backlog.** At most `slots_per_poller` calls are on the wire (the connection's slots); a
//! request that finds them all busy waits in the engine's FIFO backlog, its arguments already
//! copied, and is sent when a call ends. So `Conn::call`'s `Full` never reaches the guest.
//!
//! **Bounded time.** Each request has a deadline (`timeout` after it started): the connection
//! ends every call in `timeout` at most (reconnecting and retransmitting meanwhile), and a
//! request past its deadline is not sent again (a backlogged one, or the next call of a
//! sequence) but ends with `EIO`. So a drain (DMA_UNMAP, queue stop) waits `timeout` plus one
//! call at most, however long the server is gone.
//!
//! **Layout.** Here: the engine itself, its slots' lifecycle, the backlog and the poll round.
//! `slot` has the slot and the small types of its state machine; `dispatch` has the two
//! dispatchers, `prepare` (a new request: its operation family fills the slot) and `reply` (a
//! reply: the family of the call it answers says what it means); the families are `io` (READ,
//! WRITE), `namespace` (LOOKUP, CREATE, MKDIR, MKNOD, SYMLINK, LINK, UNLINK, RMDIR, RENAME),
//! `attr` (GETATTR, SETATTR, ACCESS, READLINK, STATFS), `open` (OPEN, RELEASE), `dir` (OPENDIR,
//! READDIR, READDIRPLUS, RELEASEDIR, FSYNCDIR) and `commit` (FLUSH, FSYNC, the replays, the
//! background COMMIT), with `object` for the end of a sequence some of them share; `send` sends a
//! slot's call, and `poll` is the sink a poll round's replies go through. They use each other in
//! one direction only: `poll` uses `dispatch` (and `commit`), `dispatch` the families, the
//! families `object`, `send` and `slot` (and `attr` uses `open`), and nothing uses this module.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use vm_memory::VolatileSlice;

use self::commit::Background;
use self::poll::{complete, PollSink};
use self::send::{send, SendError};
use self::slot::{Call, Slot};
use super::conn::{CallError, Conn};
use super::shared::{EngineCell, Shared};
use super::unstable::Resend;
use super::wire::Fh;
use crate::filesystem::seam::{Completions, FsEngine, Readiness, Started, Token};
use crate::filesystem::{self, Error, Reply};
use crate::io::{Reader, Writer};
use crate::request::{Op, Request};

mod attr;
mod commit;
mod dir;
mod dispatch;
mod io;
mod namespace;
mod object;
mod open;
mod poll;
mod send;
mod slot;

/// How long a request waits before it looks again whether another engine is done sending the
/// same file's stored writes again.
const RESEND_LOOK: std::time::Duration = std::time::Duration::from_millis(1);

/// The NFS engine of one poller (see the module documentation).
pub struct NfsEngine {
    conn: Option<Conn>,
    slots: Vec<Slot>,
    root: Fh,
    busy: usize,
    /// Requests waiting for a connection slot, oldest first.
    backlog: VecDeque<u32>,
    /// Slots whose next call goes out after this poll round's replies.
    next: Vec<u32>,
    /// Slots whose call goes again once the server was busy, and when.
    later: Vec<(u32, Instant)>,
    /// Slots waiting for the replay buffer (one replays at a time).
    replay_wait: VecDeque<u32>,
    replay_owner: Option<u32>,
    /// This engine's number (a sender of stored writes is it and a slot).
    number: u64,
    /// Where a stored write is copied to be sent again (allocated at the first replay).
    replay_buf: Vec<u8>,
    /// Slots whose WRITE found the store full and waits for a COMMIT to free room, oldest first.
    room_wait: VecDeque<u32>,
    /// The background COMMIT this engine has on the wire.
    background: Option<Background>,
    /// No background COMMIT before then (one failed: the server is busy or gone).
    background_after: Instant,
    cell: Arc<EngineCell>,
}

impl std::fmt::Debug for NfsEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfsEngine").field("busy", &self.busy).field("backlog", &self.backlog.len()).finish()
    }
}

impl NfsEngine {
    /// The engine of poller `poller` of `fs`, with a connection of its own (connecting in the
    /// background: the first calls wait in it until it is up).
    pub fn new(fs: &impl AsRef<Shared>, poller: usize) -> Self {
        let fs = fs.as_ref();
        let conn = match Conn::new(fs.conn_config()) {
            Ok(c) => Some(c),
            Err(e) => {
                log::error!("nfs: poller {poller}: no connection to {}: {e}", fs.mounted.nfs_addr);
                None
            }
        };
        let root = fs.mounted.root;
        let n = fs.slots;
        let cell = Arc::new(EngineCell::default());
        fs.register(cell.clone());
        NfsEngine {
            conn,
            slots: (0..n).map(|_| Slot::new(root)).collect(),
            root,
            busy: 0,
            backlog: VecDeque::with_capacity(n),
            next: Vec::with_capacity(n),
            later: Vec::with_capacity(n),
            replay_wait: VecDeque::with_capacity(n),
            replay_owner: None,
            number: super::shared::engine_number(),
            replay_buf: Vec::new(),
            room_wait: VecDeque::with_capacity(n),
            background: None,
            background_after: Instant::now(),
            cell,
        }
    }

    /// Sends slot `i`'s next call from a poll round (after a reply, or from the backlog).
    fn send_next(&mut self, fs: &Shared, i: u32, done: &mut Completions<'_>) {
        let Some(conn) = self.conn.as_mut() else {
            return self.end(fs, i, Err(Error::Io), done);
        };
        let slot = &mut self.slots[i as usize];
        if !slot.busy {
            return;
        }
        if Instant::now() > slot.deadline {
            EngineCell::bump(&self.cell.timed_out);
            return self.end(fs, i, Err(Error::Io), done);
        }
        let r = match slot.call {
            Call::Write => {
                let payload =
                    done.payload(slot.token).and_then(|mut p| p.consume(slot.done as usize).ok().map(|()| p));
                match payload {
                    Some(p) => send(conn, fs, slot, i, Some(p)),
                    None => return self.end(fs, i, Err(Error::Io), done),
                }
            }
            Call::Resend => {
                if self.replay_owner.is_some_and(|o| o != i) {
                    self.replay_wait.push_back(i);
                    return;
                }
                let sender = self.number << 32 | u64::from(i);
                let want = fs.limits.write as usize;
                let next = fs.unstable.next_resend_into(slot.nodeid, sender, &mut self.replay_buf, want);
                let r = match next {
                    Resend::Send(r) => {
                        slot.resending = Some(sender);
                        r
                    }
                    Resend::Busy => {
                        // Another engine sends the file's writes again: after it (the order).
                        self.later.push((i, Instant::now() + RESEND_LOOK));
                        return;
                    }
                    Resend::Done | Resend::Short(_) => {
                        // Everything the server lost is on it again.
                        slot.resending = None;
                        if self.replay_owner == Some(i) {
                            self.replay_owner = None;
                        }
                        return match slot.then.take() {
                            Some(call) => {
                                slot.call = call;
                                self.send_next(fs, i, done)
                            }
                            None => self.end(fs, i, Ok(Reply::Empty), done),
                        };
                    }
                };
                self.replay_owner = Some(i);
                slot.obj = r.fh;
                slot.replay_at = r.offset;
                slot.replay_len = r.len;
                slot.replay = Some(r.id);
                let slices = [VolatileSlice::from(&mut self.replay_buf[..])];
                let mut p = Reader::new(&slices);
                p.truncate(r.len as usize);
                send(conn, fs, slot, i, Some(p))
            }
            _ => send(conn, fs, slot, i, None),
        };
        match r {
            Ok(()) => EngineCell::bump(&self.cell.calls),
            Err(SendError::Call(CallError::Full)) => {
                EngineCell::bump(&self.cell.backlogged);
                self.backlog.push_back(i);
            }
            Err(SendError::NoRoom) => self.room_wait.push_back(i),
            Err(SendError::Call(e)) => {
                log::debug!("nfs: call of request {i} not sent: {e}");
                self.end(fs, i, Err(Error::Io), done);
            }
        }
    }

    /// Sends a background COMMIT when the store is past its high-water mark (or a write here
    /// waits for room) and none is on the wire: of the file with the most answered bytes stored,
    /// as its newest writer. No guest request waits for it; its reply frees the store.
    fn maybe_commit(&mut self, fs: &Shared, now: Instant) {
        let wanted = fs.unstable.past_high_water() || !self.room_wait.is_empty();
        if self.background.is_some() || !wanted || now < self.background_after {
            return;
        }
        let Some(conn) = self.conn.as_mut() else { return };
        self.background = commit::send_background(fs, conn, &self.cell);
    }

    /// Writes waiting for room in the store go on once there is some, or once none can come
    /// (they go FILE_SYNC then); past their deadline they end with EIO.
    fn retry_room(&mut self, fs: &Shared, now: Instant, done: &mut Completions<'_>) {
        for _ in 0..self.room_wait.len() {
            let Some(i) = self.room_wait.pop_front() else { break };
            let slot = &self.slots[i as usize];
            if now > slot.deadline {
                EngineCell::bump(&self.cell.timed_out);
                self.end(fs, i, Err(Error::Io), done);
            } else if fs.unstable.has_room(slot.chunk as usize)
                || !fs.unstable.room_may_come()
                || slot.room_until.is_some_and(|t| now >= t)
            {
                self.send_next(fs, i, done);
            } else {
                self.room_wait.push_back(i);
            }
        }
    }

    fn end(&mut self, fs: &Shared, i: u32, r: filesystem::Result<Reply>, done: &mut Completions<'_>) {
        let slot = &mut self.slots[i as usize];
        complete(fs, slot, i, r, done, &mut self.busy, &mut self.replay_owner, &self.cell);
    }

    fn publish(&self) {
        if let Some(c) = &self.conn {
            let s = c.stats();
            EngineCell::set(&self.cell.retransmits, s.retransmits);
            EngineCell::set(&self.cell.reconnects, s.reconnects);
            EngineCell::set(&self.cell.bad_replies, s.bad_replies);
        }
    }
}

impl<F: AsRef<Shared>> FsEngine<F> for NfsEngine {
    fn start(&mut self, fs: &F, token: Token, req: &mut Request<'_>, _data: &mut Writer<'_>) -> Started {
        let fs = fs.as_ref();
        EngineCell::bump(&self.cell.requests);
        let i = token.index();
        if i >= self.slots.len() {
            // More pending requests than ever before (the server's table grew): kept from now.
            let root = self.root;
            self.slots.resize_with(i + 1, || Slot::new(root));
        }
        if self.slots[i].busy {
            return Started::Done(Err(Error::Io));
        }
        match dispatch::prepare(fs, &mut self.slots[i], req) {
            Ok(Some(reply)) => return Started::Done(Ok(reply)),
            Err(e) => {
                EngineCell::bump(&self.cell.errors);
                return Started::Done(Err(e));
            }
            Ok(None) => {}
        }
        let Some(conn) = self.conn.as_mut() else {
            EngineCell::bump(&self.cell.errors);
            return Started::Done(Err(Error::Io));
        };
        let slot = &mut self.slots[i];
        slot.token = token;
        slot.busy = true;
        self.busy += 1;
        let payload = match &req.op {
            Op::Write { data, .. } => Some(data.clone()),
            _ => None,
        };
        let tag = i as u32;
        // Requests queue behind a backlog: order is kept.
        let r = if self.backlog.is_empty() {
            send(conn, fs, slot, tag, payload)
        } else {
            Err(CallError::Full.into())
        };
        match r {
            Ok(()) => {
                EngineCell::bump(&self.cell.calls);
                Started::Pending
            }
            Err(SendError::Call(CallError::Full)) => {
                EngineCell::bump(&self.cell.backlogged);
                self.backlog.push_back(tag);
                Started::Pending
            }
            Err(SendError::NoRoom) => {
                fs.unstable.count_waited();
                self.room_wait.push_back(tag);
                Started::Pending
            }
            Err(SendError::Call(e)) => {
                log::debug!("nfs: request not sent: {e}");
                slot.busy = false;
                self.busy -= 1;
                EngineCell::bump(&self.cell.errors);
                Started::Done(Err(Error::Io))
            }
        }
    }

    fn poll(&mut self, fs: &F, done: &mut Completions<'_>) {
        let fs = fs.as_ref();
        if self.busy == 0 && self.background.is_none() {
            return;
        }
        let now = Instant::now();
        if let Some(conn) = self.conn.as_mut() {
            let slices = [VolatileSlice::from(&mut self.replay_buf[..])];
            let mut sink = PollSink {
                fs,
                slots: &mut self.slots,
                done,
                next: &mut self.next,
                later: &mut self.later,
                replay: &slices,
                replay_owner: &mut self.replay_owner,
                busy: &mut self.busy,
                background: &mut self.background,
                background_after: &mut self.background_after,
                cell: &self.cell,
            };
            conn.poll(now, &mut sink);
        }
        let mut next = std::mem::take(&mut self.next);
        for &i in &next {
            self.send_next(fs, i, done);
        }
        next.clear();
        self.next = next;
        // Calls the server was too busy for, once their delay is over.
        let mut k = 0;
        while k < self.later.len() {
            let (i, at) = self.later[k];
            if now >= at {
                self.later.swap_remove(k);
                self.send_next(fs, i, done);
            } else {
                k += 1;
            }
        }
        // The replay buffer is free: the first waiting slot takes it.
        if self.replay_owner.is_none() {
            if let Some(i) = self.replay_wait.pop_front() {
                self.send_next(fs, i, done);
            }
        }
        for _ in 0..self.replay_wait.len() {
            let Some(i) = self.replay_wait.pop_front() else { break };
            if now > self.slots[i as usize].deadline {
                EngineCell::bump(&self.cell.timed_out);
                self.end(fs, i, Err(Error::Io), done);
            } else {
                self.replay_wait.push_back(i);
            }
        }
        self.retry_room(fs, now, done);
        // The backlog, oldest first, while there is room on the connection.
        let mut n = self.backlog.len();
        while n > 0 {
            n -= 1;
            let Some(i) = self.backlog.pop_front() else { break };
            let before = self.backlog.len();
            self.send_next(fs, i, done);
            if self.backlog.len() > before {
                // Still full: it went back to the end; restore the order and stop.
                if let Some(j) = self.backlog.pop_back() {
                    self.backlog.push_front(j);
                }
                break;
            }
        }
        self.maybe_commit(fs, now);
        self.publish();
    }

    fn in_flight(&self) -> usize {
        self.busy
    }

    fn readiness(&self) -> Option<Readiness<'_>> {
        let conn = self.conn.as_ref()?;
        let now = Instant::now();
        let (fd, writable, mut within) = conn.readiness(now);
        // Calls the server was too busy for go again at their time.
        if let Some(at) = self.later.iter().map(|l| l.1).min() {
            within = within.min(at.saturating_duration_since(now));
        }
        if !self.room_wait.is_empty() {
            // Room in the store may come from another poller's COMMIT: no descriptor says so.
            within = within.min(ROOM_LOOK);
        }
        Some(Readiness { fd, writable, within })
    }
}

/// How often a poller blocked on its connection looks whether writes waiting for room in the
/// store can go (the room may come from another poller's COMMIT).
const ROOM_LOOK: std::time::Duration = std::time::Duration::from_millis(1);
