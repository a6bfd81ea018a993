//! The NFSv4.1 engine of one poller ([`Nfs41Engine`], an [`FsEngine`] of the NFS filesystem,
//! which lends it the pollers' [`Shared`] state): every FUSE request that needs the server
//! becomes one COMPOUND (LOOKUP is PUTFH, LOOKUP, GETFH, GETATTR: one round trip), or a short
//! sequence of them, on the poller's own [`Session`] over its own non-blocking [`Conn<Nfs41>`],
//! and completes from a later poll round. DESIGN.md ("NFS backend") has the mapping.
//!
//! **Slots.** One per pending request, indexed by the server's [`Token`] (preallocated to
//! `slots_per_poller`, kept when more come), holding what the request needs after `start`: the
//! credential, handles and names copied, what to set, the open stateid of the FUSE handle, and
//! the next COMPOUND (`slot::Step`). The COMPOUND's operations are made from the slot each
//! time the session sends it ([`SessionSink::ops`]: the first time, and again after a new
//! session or a DELAY), so nothing is kept encoded and nothing is allocated per request.
//! READ data goes from the socket into the request's reply buffers (the READ is the COMPOUND's
//! last operation: [`Completions::data`]); WRITE data is sent from its held payload
//! ([`Completions::payload`]) each time the call goes (copied once into the UNSTABLE replay
//! store, which keeps it until a COMMIT: `commit`).
//!
//! **Backlog.** A request that finds no session yet (establishing, or established again) or no
//! free record in it waits in the engine's FIFO backlog and is sent from a poll round once it
//! can go (with the client id of the session then, which the open owner names).
//!
//! **Bounded time.** Each request has a deadline (`timeout` after it started): the connection
//! ends each call within `timeout`, the session each call it holds, and no next COMPOUND of a
//! sequence or backlogged request is sent past the deadline (EIO). So a drain waits `timeout`
//! plus one call at most.
//!
//! **Idle.** The session renews its lease with a lone SEQUENCE when none was answered for a
//! third of it: [`FsEngine::poll`] drives the session on every poll round, busy or not (a
//! poller polls its engines every round, at least every 100 ms when idle), and
//! [`FsEngine::readiness`] bounds a blocked poller's wait by the session's next timer.
//!
//! **Layout.** Here: the engine, its poll round and the sinks; `slot` (the slot, its steps and
//! the COMPOUND each sends), `prepare` (a new request fills its slot), `reply` (what a reply
//! means), `attr` (attributes and statuses as the filesystem's types), `lock` (locks, and the
//! background calls), `orphan` (an ended session's opens and silly names), `reopen` (an open
//! the server lost, opened again), `reclaim` (the opens and locks after a server restart),
//! `commit` (UNSTABLE writes: the store, COMMIT, resends). `prepare` and
//! `reply` use `slot` and `attr`; nothing uses this module.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::VolatileSlice;

use self::lock::Background;
use self::prepare::{prepare, Prepared};
use self::reply::{reply, Flow};
use self::slot::{Caps, Slot};
use super::conn::{CallError, CompoundReply, Conn, ConnConfig, Nfs41};
use super::session::{Session, SessionSink, State};
use super::shared::{EngineCell, Limits, Shared};
use super::unstable::Resend;
use super::wire::nfs4::{Nfsstat4, Op, OpRes};
use super::wire::Fh;
use crate::filesystem::seam::{Completions, FsEngine, Readiness, Started, Token};
use crate::filesystem::{self, Error, Reply};
use crate::io::{Reader, Writer};
use crate::request::{Op as FuseOp, Request};

mod attr;
mod commit;
mod lock;
mod orphan;
mod prepare;
mod reclaim;
mod reopen;
mod reply;
mod slot;

pub(super) use self::slot::stateid_of;

/// How often a poller blocked on its connection looks at requests waiting in the backlog for a
/// session (their deadlines; the session's own timers wake it for the rest).
const BACKLOG_LOOK: Duration = Duration::from_millis(10);

/// The NFSv4.1 engine of one poller (see the module documentation).
pub struct Nfs41Engine {
    conn: Option<Conn<Nfs41>>,
    session: Session,
    slots: Vec<Slot>,
    root: Fh,
    busy: usize,
    /// Requests waiting for the session or a free record, oldest first.
    backlog: VecDeque<u32>,
    /// Slots whose next COMPOUND goes out after this poll round's replies.
    next: Vec<u32>,
    /// Slots whose next COMPOUND goes out at a time (the rest of a COMPOUND answered DELAY).
    later: Vec<(Instant, u32)>,
    /// The session's client id (the open owners name it).
    clientid: u64,
    cell: Arc<EngineCell>,
    /// Calls with no guest request behind them: tries of waiting locks (`lock`), the orphans
    /// of an ended session (`lock`'s lock states, `orphan`'s opens and silly names).
    bg: Background,
    /// The transfer sizes within the session's fore channel.
    caps: Caps,
    limits: Limits,
    /// Writes waiting for room in the UNSTABLE store (`commit::Before::Wait`).
    room_wait: Vec<u32>,
    /// The stored write being sent again (`Step::Resend`), and the slot sending it: one at a
    /// time per engine.
    replay_buf: Vec<u8>,
    replay_owner: Option<u32>,
    /// The background COMMIT this engine has on the wire, and when the next may go.
    bg_commit: Option<commit::BgCommit>,
    bg_commit_after: Instant,
    /// This engine's number (a sender of stored writes is it and a slot).
    number: u64,
}

/// The wait of a write for room in the store, or of a resend for the engine's replay buffer,
/// before it looks again.
const ROOM_LOOK: Duration = Duration::from_millis(1);

/// Why a slot's COMPOUND did not go.
#[derive(Debug)]
enum SendError {
    /// The session or connection refused it.
    Call(CallError),
    /// A WRITE waits for room in the UNSTABLE store.
    NoRoom,
}

impl std::fmt::Debug for Nfs41Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nfs41Engine")
            .field("busy", &self.busy)
            .field("backlog", &self.backlog.len())
            .field("session", &self.session.state())
            .finish()
    }
}

/// The sink of a call made outside a poll round: the payload of the call being sent.
struct SendSink<'a> {
    payload: Option<Reader<'a>>,
    ended: bool,
}

impl SessionSink for SendSink<'_> {
    fn read_buffer(&mut self, _tag: u32) -> Option<Writer<'_>> {
        None
    }

    fn payload(&mut self, _tag: u32) -> Option<Reader<'_>> {
        self.payload.clone()
    }

    fn ops(&mut self, _tag: u32, _send: &mut dyn FnMut(&[Op<'_>])) {}

    fn done(&mut self, _tag: u32, _res: Result<CompoundReply<'_>, CallError>) {
        self.ended = true;
    }
}

/// Sends `slot`'s step as call `tag` on `session` over `conn` (`payload`: a WRITE's bytes).
fn call_slot(
    conn: Option<&mut Conn<Nfs41>>,
    session: &mut Session,
    clientid: u64,
    slot: &Slot,
    tag: u32,
    payload: Option<Reader<'_>>,
) -> Result<(), CallError> {
    let Some(conn) = conn else { return Err(CallError::Closed) };
    if session.state() != State::Ready {
        return Err(CallError::Full);
    }
    let mut sink = SendSink { payload, ended: false };
    let mut r = Err(CallError::Closed);
    slot.with_ops(clientid, &mut |ops| {
        r = session.call(conn, Instant::now(), tag, &slot.cred, ops, &mut sink);
    });
    match r {
        Ok(()) if sink.ended => Err(CallError::Closed),
        r => r,
    }
}

/// The poll-time sink: replies go through the slots' steps.
struct PollSink<'e, 'c> {
    fs: &'e Shared,
    /// The engine's replay buffer (a `Step::Resend`'s bytes).
    replay: &'e [VolatileSlice<'e>],
    bg_commit: &'e mut Option<commit::BgCommit>,
    bg_commit_after: &'e mut Instant,
    slots: &'e mut [Slot],
    done: &'e mut Completions<'c>,
    next: &'e mut Vec<u32>,
    later: &'e mut Vec<(Instant, u32)>,
    busy: &'e mut usize,
    clientid: u64,
    cell: &'e EngineCell,
    bg: &'e mut Background,
    now: Instant,
}

/// Ends slot `slot`'s request with `r`; or, when `r` is an error and the request kept an answer
/// for after a follow-up step (the DELEGRETURN after an OPEN, the CLOSE of an open no handle
/// keeps), with that answer: the follow-up's failure (at the server, the session, the deadline)
/// does not undo what the answer holds (a FUSE handle, the node's open count, CREATE's lookup
/// reference, the open on the server).
fn complete(
    fs: &Shared,
    slot: &mut Slot,
    r: filesystem::Result<Reply>,
    done: &mut Completions<'_>,
    busy: &mut usize,
    cell: &EngineCell,
) {
    if !slot.busy {
        return;
    }
    if let Some(id) = slot.unstable.take() {
        // Its WRITE failed: nothing of it is the server's to commit.
        fs.unstable.remove(id);
    }
    if let Some(sender) = slot.resending.take() {
        // Ended before every write was sent again: another request may take the turn.
        fs.unstable.end_resend(slot.nodeid, sender);
    }
    slot.replay = None;
    let r = match slot.answer.take() {
        Some(kept) if r.is_err() => kept,
        _ => r,
    };
    if r.is_err() {
        EngineCell::bump(&cell.errors);
    }
    done.complete(slot.token, r);
    slot.busy = false;
    *busy -= 1;
}

/// A background COMMIT's reply as its verifier, or the status it failed with (`None`: no
/// usable reply).
fn bg_commit_result(res: Result<CompoundReply<'_>, CallError>) -> Result<[u8; 8], Option<Nfsstat4>> {
    let r = res.map_err(|_| None)?;
    let mut verf = None;
    for op in r.results.clone() {
        match op {
            Ok(OpRes::Commit { verf: v }) => verf = Some(v),
            Ok(OpRes::Failed { status, .. }) => return Err(Some(status)),
            Ok(_) => {}
            Err(_) => return Err(None),
        }
    }
    match verf {
        Some(v) if r.status == Nfsstat4::Ok => Ok(v),
        _ => Err(Some(r.status)),
    }
}

impl SessionSink for PollSink<'_, '_> {
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>> {
        let s = self.slots.get(tag as usize).filter(|s| s.busy && s.step == slot::Step::Read)?;
        let mut w = self.done.data(s.token)?;
        w.split_at(s.done as usize).ok()?;
        Some(w)
    }

    fn payload(&mut self, tag: u32) -> Option<Reader<'_>> {
        let s = self.slots.get(tag as usize).filter(|s| s.busy)?;
        if s.step == slot::Step::Resend {
            let mut r = Reader::new(self.replay);
            r.truncate(s.replay_len as usize);
            return Some(r);
        }
        let s = Some(s).filter(|s| s.step == slot::Step::Write)?;
        let mut r = self.done.payload(s.token)?;
        r.consume(s.done as usize).ok()?;
        r.truncate(s.chunk as usize);
        Some(r)
    }

    fn ops(&mut self, tag: u32, send: &mut dyn FnMut(&[Op<'_>])) {
        // A call sent again may go on a session made anew within this poll, under a new client
        // id: the owners it names carry the current one.
        let clientid = match self.fs.v41.as_ref().map(|v| v.client.clientid_now()) {
            Some(c) if c != 0 => c,
            _ => self.clientid,
        };
        if let Some(i) = Background::index(tag) {
            if let Some(s) = self.bg.slots.get(i).filter(|s| s.busy) {
                let ended = s.kind == slot::Kind::Reclaim
                    && self.fs.v41.as_ref().is_some_and(|v| !v.client.is_current_epoch(s.reclaim_of));
                if ended {
                    // A call of a reclaim another restart ended, sent again on the new
                    // session: nothing but the SEQUENCE (its RECLAIM_COMPLETE would end the
                    // new grace period before the new reclaim ran; its OPENs and LOCKs carry
                    // the old stateids).
                    send(&[]);
                } else {
                    s.with_ops(clientid, send);
                }
            }
            return;
        }
        if let Some(s) = self.slots.get(tag as usize).filter(|s| s.busy) {
            s.with_ops(clientid, send);
        }
    }

    fn done(&mut self, tag: u32, res: Result<CompoundReply<'_>, CallError>) {
        if let Some(i) = Background::index(tag) {
            let bg = &mut *self.bg;
            if let Some(s) = bg.slots.get_mut(i).filter(|s| s.busy) {
                let more = if s.kind == slot::Kind::BgCommit {
                    if let Some(b) = self.bg_commit.take() {
                        if commit::background_done(self.fs, b, bg_commit_result(res)) {
                            *self.bg_commit_after = self.now + commit::BG_COMMIT_BACKOFF;
                        }
                    }
                    false
                } else if s.kind == slot::Kind::Reclaim {
                    match bg.reclaim.as_mut() {
                        Some(r) if r.owns(s) => {
                            if r.reply(self.fs, res) {
                                bg.reclaim = None;
                            }
                        }
                        // An ended reclaim's call (another restart): its answer is not the
                        // current reclaim's.
                        _ => reclaim::stale_reply(self.fs, s, res),
                    }
                    false
                } else if orphan::is_orphan(s) {
                    orphan::reply(&bg.locks, s, res, self.cell)
                } else {
                    lock::background(&bg.locks, s, res, self.now, reopen::reclaiming(self.fs))
                };
                if more {
                    bg.next.push(tag);
                } else {
                    s.busy = false;
                    orphan::ended(&bg.locks, s);
                }
            }
            return;
        }
        let Some(slot) = self.slots.get_mut(tag as usize).filter(|s| s.busy) else { return };
        if matches!(res, Err(CallError::TimedOut)) {
            EngineCell::bump(&self.cell.timed_out);
        }
        let flow = if slot.step.is_lock() {
            lock::reply(self.fs, slot, res)
        } else {
            reply(self.fs, slot, res, self.done, self.cell)
        };
        match flow {
            Flow::Done(r) => complete(self.fs, slot, r, self.done, self.busy, self.cell),
            Flow::Next => self.next.push(tag),
            Flow::After(wait) => self.later.push((self.now + wait, tag)),
        }
    }
}

impl Nfs41Engine {
    /// The engine of poller `poller` of `fs` (an NFSv4.1 export), with a connection and a
    /// session of its own (established in the background: the first requests wait for it).
    pub fn new(fs: &impl AsRef<Shared>, poller: usize) -> Self {
        let fs = fs.as_ref();
        let max_io = fs.limits.read.max(fs.limits.write);
        let cfg = fs.session_config(max_io);
        let conn = match fs.v41.as_ref() {
            Some(v) => {
                // Session trunking: the pollers spread over the server's addresses, each
                // moving on to the next ones when its own cannot be reached.
                let n = v.addrs.len().max(1);
                let mine = |k: usize| v.addrs.get((poller + k) % n).copied().unwrap_or(fs.mounted.nfs_addr);
                let addr = mine(0);
                let others: Vec<_> = (1..n).map(mine).collect();
                Conn::<Nfs41>::new(ConnConfig {
                    addr,
                    slots: cfg.conn_slots(),
                    max_io,
                    timeout: fs.timeout,
                    retransmit: fs.retransmit,
                    machine_name: fs.machine_name.clone(),
                })
                .map(|mut c| {
                    c.also_at(&others);
                    c
                })
                .map_err(|e| log::error!("nfs4.1: poller {poller}: no connection to {addr}: {e}"))
                .ok()
            }
            None => {
                log::error!("nfs4.1: poller {poller}: the export was not set up for NFSv4.1");
                None
            }
        };
        let root = fs.mounted.root;
        let n = fs.slots;
        let cell = Arc::new(EngineCell::default());
        fs.register(cell.clone());
        Nfs41Engine {
            conn,
            session: Session::new(cfg, Instant::now()),
            slots: (0..n).map(|_| Slot::new(root)).collect(),
            root,
            busy: 0,
            backlog: VecDeque::with_capacity(n),
            next: Vec::with_capacity(n),
            later: Vec::new(),
            clientid: 0,
            cell,
            bg: Background::new(fs, root),
            caps: Caps::new(&fs.limits, None),
            limits: fs.limits,
            room_wait: Vec::new(),
            replay_buf: Vec::new(),
            replay_owner: None,
            bg_commit: None,
            bg_commit_after: Instant::now(),
            number: super::shared::engine_number(),
        }
    }

    /// Sends slot `i`'s step (`payload`: a WRITE's data from where this call starts, within its
    /// chunk): a WRITE's chunk is stored first when it is to go UNSTABLE4 (`commit`).
    fn send(&mut self, fs: &Shared, i: u32, payload: Option<Reader<'_>>) -> Result<(), SendError> {
        let slot = &mut self.slots[i as usize];
        let mut payload = payload;
        if slot.step == slot::Step::Write {
            if let Some(p) = payload.as_ref() {
                match commit::before_write(fs, slot, p, Instant::now()) {
                    commit::Before::Go => {}
                    commit::Before::Wait => return Err(SendError::NoRoom),
                    commit::Before::CommitFirst => payload = None,
                }
            }
        }
        if slot.step == slot::Step::Commit {
            slot.horizon = fs.unstable.horizon();
        }
        let r = call_slot(
            self.conn.as_mut(),
            &mut self.session,
            self.clientid,
            &self.slots[i as usize],
            i,
            payload,
        );
        if r.is_err() {
            if let Some(id) = self.slots[i as usize].unstable.take() {
                fs.unstable.remove(id);
            }
        }
        r.map_err(SendError::Call)
    }

    /// Sends slot `i`'s next step from a poll round (after a reply, or from the backlog).
    fn send_next(&mut self, fs: &Shared, i: u32, done: &mut Completions<'_>) {
        let slot = &self.slots[i as usize];
        if !slot.busy {
            return;
        }
        if Instant::now() > slot.deadline {
            EngineCell::bump(&self.cell.timed_out);
            return self.end(fs, i, Err(Error::Io), done);
        }
        self.slots[i as usize].clamp(self.caps);
        let slot = &self.slots[i as usize];
        match reopen::hold(fs, slot) {
            Some(Ok(())) => return self.later.push((Instant::now() + reopen::RECLAIM_WAIT, i)),
            Some(Err(e)) => return self.end(fs, i, Err(e), done),
            None => {}
        }
        let r = match slot.step {
            slot::Step::Write => {
                let Some(mut p) = done.payload(slot.token) else {
                    return self.end(fs, i, Err(Error::Io), done);
                };
                if p.consume(slot.done as usize).is_err() {
                    return self.end(fs, i, Err(Error::Io), done);
                }
                p.truncate(slot.chunk as usize);
                self.send(fs, i, Some(p))
            }
            slot::Step::Resend => {
                if self.replay_owner.is_some_and(|o| o != i) {
                    // Another request's resend has the replay buffer.
                    self.later.push((Instant::now() + ROOM_LOOK, i));
                    return;
                }
                let open = if slot.resend_open {
                    if reopen::reclaiming(fs) {
                        // With the open the reclaim gives the handle back.
                        self.later.push((Instant::now() + reopen::RECLAIM_WAIT, i));
                        return;
                    }
                    match commit::handle_open(fs, slot) {
                        Some(open) => open,
                        None => return self.end(fs, i, Err(Error::Io), done),
                    }
                } else {
                    // The anonymous stateid: a handle's open may be one the restarted server
                    // no longer knows (not reclaimed yet, or refused), and the file may have
                    // none left; the request's open once the server refused that
                    // (`commit::reply`).
                    crate::nfs::wire::nfs4::Stateid::ANONYMOUS
                };
                let sender = self.number << 32 | u64::from(i);
                let want = fs.limits.write as usize;
                let next = fs.unstable.next_resend_into(slot.nodeid, sender, &mut self.replay_buf, want);
                let r = match next {
                    Resend::Send(r) => r,
                    Resend::Busy => {
                        // Another request sends the file's writes again: after it (the order).
                        self.later.push((Instant::now() + ROOM_LOOK, i));
                        return;
                    }
                    Resend::Done | Resend::Short(_) => {
                        // Everything the server lost is on it again.
                        self.replay_owner = None;
                        self.slots[i as usize].resending = None;
                        return match commit::then(&mut self.slots[i as usize]) {
                            Flow::Done(r) => self.end(fs, i, r, done),
                            _ => self.send_next(fs, i, done),
                        };
                    }
                };
                self.replay_owner = Some(i);
                self.slots[i as usize].resending = Some(sender);
                let slot = &mut self.slots[i as usize];
                slot.obj = r.fh;
                slot.stateid = open;
                slot.replay_at = r.offset;
                slot.replay_len = r.len;
                slot.replay = Some(r.id);
                let slices = [VolatileSlice::from(&mut self.replay_buf[..])];
                let mut p = Reader::new(&slices);
                p.truncate(r.len as usize);
                call_slot(
                    self.conn.as_mut(),
                    &mut self.session,
                    self.clientid,
                    &self.slots[i as usize],
                    i,
                    Some(p),
                )
                .map_err(SendError::Call)
            }
            _ => self.send(fs, i, None),
        };
        match r {
            Ok(()) => EngineCell::bump(&self.cell.calls),
            Err(SendError::Call(CallError::Full)) => {
                EngineCell::bump(&self.cell.backlogged);
                self.backlog.push_back(i);
            }
            Err(SendError::NoRoom) => self.room_wait.push(i),
            Err(SendError::Call(e)) => {
                log::debug!("nfs4.1: request {i} not sent: {e}");
                self.end(fs, i, Err(Error::Io), done);
            }
        }
    }

    /// Writes waiting for room in the store go on once there is some, or once none can come
    /// (they go FILE_SYNC4 then), or their wait is over; past their deadline, EIO.
    fn retry_room(&mut self, fs: &Shared, now: Instant, done: &mut Completions<'_>) {
        let waiting = std::mem::take(&mut self.room_wait);
        for &i in &waiting {
            let slot = &self.slots[i as usize];
            if now > slot.deadline
                || fs.unstable.has_room(slot.chunk as usize)
                || !fs.unstable.room_may_come()
                || slot.room_until.is_some_and(|t| now >= t)
            {
                self.send_next(fs, i, done);
            } else {
                self.room_wait.push(i);
            }
        }
    }

    /// Sends background slot `i`'s step; whether it went.
    fn send_bg(&mut self, i: usize) -> bool {
        let Some(conn) = self.conn.as_mut() else { return false };
        if self.session.state() != State::Ready {
            return false;
        }
        let slot = &self.bg.slots[i];
        let mut sink = SendSink { payload: None, ended: false };
        let mut r = Err(CallError::Closed);
        let session = &mut self.session;
        slot.with_ops(self.clientid, &mut |ops| {
            r = session.call(conn, Instant::now(), lock::BG_TAG | i as u32, &slot.cred, ops, &mut sink);
        });
        r.is_ok() && !sink.ended
    }

    /// The background round: next steps of background slots, then the orphans of an ended
    /// session (lock states, opens, silly names) and waiting locks due for a try, while a background slot is free (every engine takes
    /// them: any engine may serve any wait).
    fn background(&mut self, fs: &Shared, now: Instant) {
        let reclaiming = reopen::reclaiming(fs);
        let commit =
            (fs.unstable.past_high_water() || !self.room_wait.is_empty()) && self.bg_commit.is_none();
        if self.bg.next.is_empty()
            && self.bg.locks.idle()
            && !reclaiming
            && self.bg.reclaim.is_none()
            && !commit
        {
            // The common case: no lock waits, nothing to end, no reclaim, the store below its
            // high-water mark; four atomic loads.
            return;
        }
        if self.conn.is_none() || self.session.state() != State::Ready {
            return;
        }
        self.reclaim(fs, reclaiming);
        if commit && now >= self.bg_commit_after {
            self.commit_in_background(fs);
        }
        let next = std::mem::take(&mut self.bg.next);
        for &tag in &next {
            let Some(i) = Background::index(tag) else { continue };
            if !self.send_bg(i) {
                let s = &mut self.bg.slots[i];
                orphan::requeue(&self.bg.locks, s, false);
                lock::abandon(&self.bg.locks, s, now);
                orphan::ended(&self.bg.locks, s);
            }
        }
        self.bg.next = next;
        self.bg.next.clear();
        while let Some(i) = self.bg.free() {
            if !self.session.has_room() {
                // Nothing could be sent: orphans and tries stay where they are.
                break;
            }
            let locks = self.bg.locks.clone();
            let slot = &mut self.bg.slots[i];
            if let Some((o, tries)) = locks.take_orphan(now) {
                orphan::start(slot, o, tries);
            } else if let Some(a) = locks.waits.due(now) {
                if let Err(e) = lock::start_try(fs, slot, a) {
                    locks.waits.attempted(a.id, crate::nfs::locks41::Tried::Failed(e), now);
                    continue;
                }
            } else {
                break;
            }
            slot.busy = true;
            if !self.send_bg(i) {
                // An orphan taken goes back, untried (a try is reported denied).
                let s = &mut self.bg.slots[i];
                orphan::requeue(&locks, s, false);
                lock::abandon(&locks, s, now);
                orphan::ended(&locks, s);
                break;
            }
        }
    }

    /// A COMMIT of the store's file with the most answered bytes, from a background slot, unless
    /// another engine has one on the wire (the store is past its high-water mark, or a write
    /// here waits for room).
    fn commit_in_background(&mut self, fs: &Shared) {
        let Some(i) = self.bg.free() else { return };
        if !self.session.has_room() {
            return;
        }
        let Some(claim) = fs.unstable.begin_background() else { return };
        let Some(pick) = fs.unstable.pick_commit() else { return };
        let slot = &mut self.bg.slots[i];
        slot.kind = slot::Kind::BgCommit;
        slot.step = slot::Step::Commit;
        slot.obj = pick.fh;
        slot.cred = pick.cred;
        slot.nodeid = pick.file;
        slot.attempt = None;
        slot.orphan = None;
        slot.busy = true;
        let horizon = fs.unstable.horizon();
        if self.send_bg(i) {
            EngineCell::bump(&self.cell.calls);
            fs.unstable.count_background();
            self.bg_commit = Some(commit::BgCommit { file: pick.file, horizon, _claim: claim });
        } else {
            self.bg.slots[i].busy = false;
        }
    }

    /// The reclaim after a server restart: taken if it is due on this session's client id and
    /// nobody took it; its next call sent (one at a time, before any other background call).
    fn reclaim(&mut self, fs: &Shared, reclaiming: bool) {
        if self.bg.reclaim.as_ref().is_some_and(|r| !r.current()) {
            // Another restart: this client id's reclaim is over, the next one has its own
            // (given back: the same client id may come back confirmed, the same epoch's).
            if let Some(r) = self.bg.reclaim.take() {
                r.give_back();
            }
        }
        if self.bg.reclaim.is_none() && reclaiming {
            self.bg.reclaim = reclaim::Reclaim::take(fs, self.clientid);
        }
        if self.bg.reclaim.is_none() || self.bg.reclaim_out() || !self.session.has_room() {
            return;
        }
        let Some(i) = self.bg.free() else { return };
        let (Some(r), slot) = (self.bg.reclaim.as_mut(), &mut self.bg.slots[i]) else { return };
        if !r.fill(fs, slot) {
            self.bg.reclaim = None;
            return;
        }
        slot.busy = true;
        if !self.send_bg(i) {
            // Sent again from a later round.
            self.bg.slots[i].busy = false;
        }
    }

    fn end(&mut self, fs: &Shared, i: u32, r: filesystem::Result<Reply>, done: &mut Completions<'_>) {
        if self.replay_owner == Some(i) {
            self.replay_owner = None;
        }
        complete(fs, &mut self.slots[i as usize], r, done, &mut self.busy, &self.cell);
    }

    /// The session's client id and fore channel, once it has them.
    fn learn(&mut self) {
        if let Some(p) = self.session.params() {
            self.clientid = p.clientid;
            self.caps = Caps::new(&self.limits, Some(&p.fore));
        }
    }

    fn publish(&mut self) {
        self.learn();
        if let Some(c) = &self.conn {
            let s = c.stats();
            EngineCell::set(&self.cell.retransmits, s.retransmits);
            EngineCell::set(&self.cell.reconnects, s.reconnects);
            EngineCell::set(&self.cell.address_moves, s.address_moves);
            EngineCell::set(&self.cell.bad_replies, s.bad_replies);
        }
        self.cell.set_session(&self.session.stats());
    }
}

impl<F: AsRef<Shared>> FsEngine<F> for Nfs41Engine {
    fn start(&mut self, fs: &F, token: Token, req: &mut Request<'_>, _data: &mut Writer<'_>) -> Started {
        let fs = fs.as_ref();
        EngineCell::bump(&self.cell.requests);
        let i = token.index();
        if i >= self.slots.len() {
            // More pending requests than ever before: kept from now.
            let root = self.root;
            self.slots.resize_with(i + 1, || Slot::new(root));
        }
        if self.slots[i].busy {
            return Started::Done(Err(Error::Io));
        }
        match prepare(fs, &mut self.slots[i], req) {
            Ok(Prepared::Answered(reply)) => return Started::Done(Ok(reply)),
            Err(e) => {
                EngineCell::bump(&self.cell.errors);
                return Started::Done(Err(e));
            }
            Ok(Prepared::Send) => {}
        }
        if self.conn.is_none() {
            EngineCell::bump(&self.cell.errors);
            return Started::Done(Err(Error::Io));
        }
        let slot = &mut self.slots[i];
        slot.clamp(self.caps);
        slot.token = token;
        slot.busy = true;
        self.busy += 1;
        let payload = match &req.op {
            FuseOp::Write { data, .. } => {
                let mut p = data.clone();
                p.truncate(slot.chunk as usize);
                Some(p)
            }
            _ => None,
        };
        let tag = i as u32;
        if reopen::hold(fs, &self.slots[i]).is_some() {
            // A reclaim is under way and the file has locks (or lost them): a later round
            // sends it, or answers EIO.
            self.later.push((Instant::now() + reopen::RECLAIM_WAIT, tag));
            return Started::Pending;
        }
        // Requests queue behind a backlog: order is kept.
        let r = if self.backlog.is_empty() {
            self.send(fs, tag, payload)
        } else {
            Err(SendError::Call(CallError::Full))
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
                self.room_wait.push(tag);
                Started::Pending
            }
            Err(SendError::Call(e)) => {
                log::debug!("nfs4.1: request not sent: {e}");
                self.slots[i].busy = false;
                self.busy -= 1;
                EngineCell::bump(&self.cell.errors);
                Started::Done(Err(Error::Io))
            }
        }
    }

    fn poll(&mut self, fs: &F, done: &mut Completions<'_>) {
        let fs = fs.as_ref();
        let now = Instant::now();
        if let Some(conn) = self.conn.as_mut() {
            let slices = [VolatileSlice::from(&mut self.replay_buf[..])];
            let mut sink = PollSink {
                fs,
                replay: &slices,
                bg_commit: &mut self.bg_commit,
                bg_commit_after: &mut self.bg_commit_after,
                slots: &mut self.slots,
                done,
                next: &mut self.next,
                later: &mut self.later,
                busy: &mut self.busy,
                clientid: self.clientid,
                cell: &self.cell,
                bg: &mut self.bg,
                now,
            };
            self.session.poll(now, conn, &mut sink);
        }
        self.learn();
        let mut next = std::mem::take(&mut self.next);
        // The rests whose wait is over join this round's next steps.
        let mut k = 0;
        while k < self.later.len() {
            if self.later[k].0 <= now {
                next.push(self.later.swap_remove(k).1);
            } else {
                k += 1;
            }
        }
        if let Some(o) = self.replay_owner {
            // Its resend ended (answered, failed): the buffer is free.
            let s = &self.slots[o as usize];
            if !s.busy || s.step != slot::Step::Resend {
                self.replay_owner = None;
            }
        }
        for &i in &next {
            self.send_next(fs, i, done);
        }
        next.clear();
        self.next = next;
        // The backlog, oldest first, while the session takes calls; past their deadline: EIO.
        let mut n = self.backlog.len();
        while n > 0 {
            n -= 1;
            let Some(i) = self.backlog.pop_front() else { break };
            if self.session.state() != State::Ready && now <= self.slots[i as usize].deadline {
                self.backlog.push_back(i);
                continue;
            }
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
        if !self.room_wait.is_empty() {
            self.retry_room(fs, now, done);
        }
        self.background(fs, now);
        self.publish();
    }

    fn in_flight(&self) -> usize {
        self.busy
    }

    fn readiness(&self) -> Option<Readiness<'_>> {
        let conn = self.conn.as_ref()?;
        let now = Instant::now();
        let (fd, writable, mut within) = conn.readiness(now);
        if let Some(t) = self.session.next_timer() {
            within = within.min(t.saturating_duration_since(now));
        }
        if !self.backlog.is_empty() {
            within = within.min(BACKLOG_LOOK);
        }
        if !self.room_wait.is_empty() {
            within = within.min(ROOM_LOOK);
        }
        if let Some(t) = self.later.iter().map(|l| l.0).min() {
            within = within.min(t.saturating_duration_since(now));
        }
        if self.session.state() == State::Ready {
            if let Some(t) = self.bg.due() {
                within = within.min(t.saturating_duration_since(now));
            }
        }
        Some(Readiness { fd, writable, within })
    }
}

impl Drop for Nfs41Engine {
    fn drop(&mut self) {
        // The session's end, best effort and without waiting (a poller never blocks): the
        // DESTROY_SESSION goes if it can; the server drops the rest at the end of the lease.
        let mut sink = SendSink { payload: None, ended: false };
        let now = Instant::now();
        // Tries on the wire go to another engine (their waits are tried again), and so do
        // orphans and let-gos on the wire (sent again: a LOCKU or CLOSE that went is answered
        // BAD_STATEID the second time, which ends it).
        for s in &mut self.bg.slots {
            if s.busy {
                orphan::requeue(&self.bg.locks, s, false);
            }
            orphan::ended(&self.bg.locks, s);
        }
        self.bg.abandon_all(now);
        if let Some(r) = self.bg.reclaim.take() {
            r.give_back();
        }
        self.session.close(now, &mut sink);
        if let Some(conn) = self.conn.as_mut() {
            self.session.poll(now, conn, &mut sink);
        }
    }
}
