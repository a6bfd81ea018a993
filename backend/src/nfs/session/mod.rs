//! An NFSv4.1 session (RFC 8881 2.10) over one connection: a state machine with no I/O of its
//! own, driven through a [`Transport`] (a [`Conn<Nfs41>`], or a test's script) from its owner's
//! poll loop. See DESIGN.md, "NFS client: wire and connection".
//!
//! [`Session::poll`] polls the connection and then does what the session needs: establishment
//! (EXCHANGE_ID with the function's owner id, CREATE_SESSION with a fore channel of the
//! connection's slots and sizes, a first COMPOUND that reads the lease time and sends
//! RECLAIM_COMPLETE once per client id), lease renewal (a lone SEQUENCE when no SEQUENCE was
//! answered for a third of the lease), the calls that wait for a session or a slot, and those
//! to send again. [`Session::call`] sends the owner's operations behind a SEQUENCE on a free
//! slot (`sa_cachethis` for non-idempotent ones), or keeps the call until it can go; the owner
//! is asked for the operations again ([`SessionSink::ops`]) whenever the session sends a call
//! it could not send at once or must send again. [`Session::close`] ends with DESTROY_SESSION
//! and DESTROY_CLIENTID.
//!
//! A reply's SEQUENCE result is the session's: a slot is busy from the call to its reply; the
//! server's highest and target slot ids bound the slots used; its status flags are kept as data
//! ([`SessionStats`]). A call retransmitted by the connection after a reconnect is the same
//! bytes (same slot, same sequence id): the server's reply cache answers it. The errors:
//! BADSESSION, DEADSESSION (and CONN_NOT_BOUND_TO_SESSION) make a new session, STALE_CLIENTID a
//! new client id, and the call goes again on it; SEQ_MISORDERED resynchronises the slot;
//! DELAY sends the call again 50 ms later (from a later poll: a poller never waits), on the same
//! slot with the same sequence id when SEQUENCE said it (the request may be in progress on the
//! server: only its reply cache may answer it). A call that waits ends with
//! [`CallError::TimedOut`] once the session's time-out has passed since the owner called.
//!
//! The sessions of one device function (one per poller) are one client to the server: they
//! share a [`ClientShare`], through which one EXCHANGE_ID serves them all and their
//! CREATE_SESSIONs go one at a time in the client id's sequence (`client`).
//!
//! `slots` has the slot table, `owner` the client owner id, `client` the share, `own` the session's own calls
//! (establishment, renewal, destruction) and `reply` the handling of every SEQUENCE result and
//! of the owner's replies.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use self::slots::Slots;
use super::conn::{CallError, Compound, CompoundReply, Conn, Cred, Nfs41, Sink};
use super::wire::nfs4::{ChannelAttrs, ClientId, Op, OpNum, SessionId, MINOR_VERSION};
use crate::io::{Reader, Writer};

mod client;
mod own;
mod owner;
mod reply;
mod slots;
#[cfg(test)]
mod tests;

pub use self::client::{Client, ClientShare, ServerOwner, ShareState, ShareStats};
pub use self::owner::{client_owner, host_identity};

/// What a session drives: a connection carrying NFSv4.1 ([`Conn<Nfs41>`]), or a test's script.
pub trait Transport {
    /// [`Conn::call`].
    fn call(
        &mut self,
        tag: u32,
        cred: &Cred,
        args: &Compound<'_>,
        sink: &mut dyn Sink<Nfs41>,
    ) -> Result<(), CallError>;
    /// [`Conn::queue`].
    fn queue(&mut self, tag: u32, cred: &Cred, args: &Compound<'_>, since: Instant) -> Result<(), CallError>;
    /// [`Conn::send_queued`].
    fn send_queued(&mut self, sink: &mut dyn Sink<Nfs41>);
    /// [`Conn::poll`].
    fn poll(&mut self, now: Instant, sink: &mut dyn Sink<Nfs41>);
}

impl Transport for Conn<Nfs41> {
    fn call(
        &mut self,
        tag: u32,
        cred: &Cred,
        args: &Compound<'_>,
        sink: &mut dyn Sink<Nfs41>,
    ) -> Result<(), CallError> {
        Conn::call(self, tag, cred, args, sink)
    }

    fn queue(&mut self, tag: u32, cred: &Cred, args: &Compound<'_>, since: Instant) -> Result<(), CallError> {
        Conn::queue(self, tag, cred, args, since)
    }

    fn send_queued(&mut self, sink: &mut dyn Sink<Nfs41>) {
        Conn::send_queued(self, sink)
    }

    fn poll(&mut self, now: Instant, sink: &mut dyn Sink<Nfs41>) {
        Conn::poll(self, now, sink)
    }
}

/// The owner of the calls a session carries (the engine), by its `tag`.
pub trait SessionSink {
    /// Where a READ's data goes ([`Sink::read_buffer`]).
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>>;
    /// A WRITE's data ([`Sink::payload`]).
    fn payload(&mut self, tag: u32) -> Option<Reader<'_>>;
    /// The operations of call `tag` (without SEQUENCE), given to `send`: asked whenever the
    /// session sends a call it could not send when the owner called (no session yet, no free
    /// slot) or sends it again (a new session, DELAY, a slot resynchronised). The same
    /// operations each time; not calling `send` ends the call ([`CallError::Closed`]).
    fn ops(&mut self, tag: u32, send: &mut dyn FnMut(&[Op<'_>]));
    /// Call `tag` ended: its reply (the results after SEQUENCE's), or why not.
    fn done(&mut self, tag: u32, res: Result<CompoundReply<'_>, CallError>);
}

/// A session's settings.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// The client the session is one of: EXCHANGE_ID's `co_ownerid` ([`client_owner`]) and
    /// `co_verifier` (this incarnation of the client: a new one makes the server drop what an
    /// earlier incarnation of the same owner held; the same one, a process that took over the
    /// state, keeps it), and the client id every session of the share uses.
    pub client: Arc<ClientShare>,
    /// Calls in flight at most: the fore channel slots asked. The connection needs one slot
    /// more ([`SessionConfig::conn_slots`]) for the session's own call.
    pub slots: u16,
    /// Largest READ/WRITE data (the connection's `max_io`): the channel's sizes follow.
    pub max_io: u32,
    /// A call that waits (for a session, a slot, a DELAY) ends with [`CallError::TimedOut`]
    /// this long after the owner called.
    pub timeout: Duration,
    /// The credential of the session's own calls.
    pub cred: Cred,
}

impl SessionConfig {
    /// The connection's slots: the session's, and one for its own calls.
    pub fn conn_slots(&self) -> usize {
        usize::from(self.slots) + 1
    }
}

/// Where a session is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// No client id: EXCHANGE_ID next.
    NoClient,
    /// A client id, no session: CREATE_SESSION next.
    NoSession,
    /// A session whose first COMPOUND (lease time, RECLAIM_COMPLETE) is not answered yet.
    Starting,
    /// Calls go.
    Ready,
    /// DESTROY_SESSION and DESTROY_CLIENTID to send or on the wire.
    Closing,
    /// Nothing more is sent.
    Closed,
}

/// What the server granted the session now (for logs and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionParams {
    /// The client id.
    pub clientid: ClientId,
    /// The session.
    pub sessionid: SessionId,
    /// The fore channel CREATE_SESSION granted.
    pub fore: ChannelAttrs,
    /// The lease (from the `lease_time` attribute).
    pub lease: Duration,
    /// Slot ids below this take new calls (the server's highest and target slot ids).
    pub usable_slots: u16,
}

/// A session's counters (data, not log text).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Calls the owner made ([`Session::call`] accepted).
    pub calls: u64,
    /// Calls sent again by the session (a new session, DELAY, a slot resynchronised).
    pub resent: u64,
    /// Calls that waited for a session or a slot before their first send.
    pub waited: u64,
    /// Calls that ended while waiting, their time-out passed.
    pub timed_out: u64,
    /// EXCHANGE_IDs answered (client ids obtained).
    pub exchange_ids: u64,
    /// Sessions created.
    pub sessions: u64,
    /// RECLAIM_COMPLETEs answered (COMPLETE_ALREADY counts).
    pub reclaim_completes: u64,
    /// Establishment calls that failed (then tried again after a back-off).
    pub establish_failures: u64,
    /// The status of the last failed establishment call (0: none; a call that ended without a
    /// reply counts as NFS4ERR_DELAY here, one the connection refused as NFS4ERR_SERVERFAULT).
    pub last_establish_error: u32,
    /// BADSESSION, DEADSESSION or CONN_NOT_BOUND_TO_SESSION answers (each makes a new session
    /// once).
    pub bad_sessions: u64,
    /// STALE_CLIENTID answers.
    pub stale_clientids: u64,
    /// SEQ_MISORDERED answers (each resynchronises a slot).
    pub misordered: u64,
    /// SEQ_FALSE_RETRY answers.
    pub false_retries: u64,
    /// RETRY_UNCACHED_REP answers.
    pub uncached: u64,
    /// BADSLOT or BAD_HIGH_SLOT answers.
    pub bad_slots: u64,
    /// DELAY answers (SEQUENCE's or an operation's).
    pub delays: u64,
    /// Lone SEQUENCEs sent to renew the lease.
    pub renewals: u64,
    /// SEQUENCE results with flags (`sr_status_flags`) set.
    pub flagged: u64,
    /// The last SEQUENCE result's status flags.
    pub status_flags: u32,
    /// Every status flag seen (OR of them all).
    pub status_flags_seen: u32,
}

/// What is done with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RecState {
    Free,
    /// Waits in `retry` or `waiting` to be sent.
    Waiting,
    /// On the connection.
    Sent,
    /// Sent again at `until` (a DELAY).
    Delayed,
}

/// One call of the owner's.
#[derive(Clone, Copy, Debug)]
struct Record {
    state: RecState,
    tag: u32,
    cred: Cred,
    /// When the owner called.
    started: Instant,
    cachethis: bool,
    /// While sent, or pinned: the slot, the sequence id and the session (its number) it went on.
    slot: u16,
    seqid: u32,
    generation: u32,
    /// The `sa_highest_slotid` it was sent with (a retry sends the same).
    highest: u32,
    /// The call keeps its slot and sequence id for its next send (SEQUENCE answered DELAY).
    pinned: bool,
    /// Delayed until.
    until: Instant,
    /// Sent at least once.
    was_sent: bool,
}

/// The session's own calls, one at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OwnKind {
    ExchangeId,
    CreateSession,
    /// SEQUENCE, PUTROOTFH, GETATTR(lease_time) and, once per client id, RECLAIM_COMPLETE.
    Start,
    /// A lone SEQUENCE.
    Renew,
    DestroySession,
    DestroyClientid,
}

#[derive(Clone, Copy, Debug)]
struct Own {
    kind: OwnKind,
    /// With SEQUENCE: its slot, sequence id and session.
    slot: u16,
    seqid: u32,
    generation: u32,
    /// A start that carries the client id's RECLAIM_COMPLETE (the share's one).
    reclaim: bool,
}

/// The connection tag of the session's own call (the owner's are record numbers).
const OWN_TAG: u32 = u32::MAX;
/// How long a session waits before it looks again when another session of its client share has
/// the establishment turn.
const SHARE_WAIT: Duration = Duration::from_millis(2);
/// How long a call answered GRACE (the server's grace period after a restart, when only
/// reclaims are served) waits before it goes again.
const GRACE_WAIT: Duration = Duration::from_millis(250);
/// How long a call answered DELAY waits before it goes again.
const DELAY: Duration = Duration::from_millis(50);
/// Back-off of a failed establishment call: from this, doubling up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The lease when the server does not say (RFC 8881's usual 90 s is longer: renew early).
const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// Whether an operation changes something a second execution would change again or fail on:
/// its reply must come from the server's reply cache when the call is retried
/// (`sa_cachethis`). WRITE and COMMIT are idempotent (the same data at the same place); a
/// SETATTR of the same attributes too.
pub fn non_idempotent(op: OpNum) -> bool {
    matches!(
        op,
        OpNum::Create
            | OpNum::Remove
            | OpNum::Rename
            | OpNum::Link
            | OpNum::Open
            | OpNum::OpenDowngrade
            | OpNum::Close
            | OpNum::Lock
            | OpNum::Locku
            | OpNum::Delegreturn
            | OpNum::FreeStateid
            | OpNum::Setxattr
            | OpNum::Removexattr
            | OpNum::ReclaimComplete
    )
}

/// One NFSv4.1 session (see the module documentation). Allocates in [`Session::new`] only.
pub struct Session {
    cfg: SessionConfig,
    state: State,
    /// The next establishment call may go at this time (a failure's back-off).
    next_at: Instant,
    backoff: Duration,
    /// This session's number in its client share.
    me: u64,
    /// The client id it uses (or last used).
    client: Client,
    /// Whether this session still counts in its share (until it closes or is dropped).
    joined: bool,
    /// The share said this was its last session: DESTROY_CLIENTID after DESTROY_SESSION.
    destroy_client: bool,
    sessionid: SessionId,
    /// Sessions made so far: a call carries the number of the one it went on.
    generation: u32,
    fore: ChannelAttrs,
    lease: Duration,
    /// When a SEQUENCE was last answered (the lease renewed).
    renewed: Instant,
    slots: Slots,
    records: Vec<Record>,
    free: Vec<u16>,
    /// Calls to send again (before `waiting`).
    retry: VecDeque<u16>,
    /// Calls not sent yet.
    waiting: VecDeque<u16>,
    /// Records in the state `Delayed`.
    delayed: usize,
    own: Option<Own>,
    /// Closing: DESTROY_SESSION answered (or there was no session).
    destroyed_session: bool,
    stats: SessionStats,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The sink the connection is given: the owner's, with the session in between.
struct Wrap<'a> {
    s: &'a mut Session,
    owner: &'a mut dyn SessionSink,
    now: Instant,
}

impl Sink<Nfs41> for Wrap<'_> {
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>> {
        let r = self.s.records.get(tag as usize).filter(|r| r.state == RecState::Sent)?;
        self.owner.read_buffer(r.tag)
    }

    fn payload(&mut self, tag: u32) -> Option<Reader<'_>> {
        let r = self.s.records.get(tag as usize).filter(|r| r.state == RecState::Sent)?;
        self.owner.payload(r.tag)
    }

    fn done(&mut self, tag: u32, res: Result<CompoundReply<'_>, CallError>) {
        if tag == OWN_TAG {
            self.s.own_done(self.now, res);
        } else {
            self.s.owner_done(self.now, tag, res, self.owner);
        }
    }
}

impl Session {
    /// A session to establish (nothing is sent before the first [`Session::poll`]).
    pub fn new(cfg: SessionConfig, now: Instant) -> Session {
        let n = cfg.slots.max(1);
        let blank = Record {
            state: RecState::Free,
            tag: 0,
            cred: Cred::ROOT,
            started: now,
            cachethis: false,
            slot: 0,
            seqid: 0,
            generation: 0,
            highest: 0,
            pinned: false,
            until: now,
            was_sent: false,
        };
        let zero = ChannelAttrs {
            headerpadsize: 0,
            maxrequestsize: 0,
            maxresponsesize: 0,
            maxresponsesize_cached: 0,
            maxoperations: 0,
            maxrequests: 0,
            rdma_ird: None,
        };
        Session {
            state: State::NoClient,
            next_at: now,
            backoff: MIN_BACKOFF,
            me: cfg.client.join(),
            client: Client::default(),
            joined: true,
            destroy_client: false,
            sessionid: SessionId::default(),
            generation: 0,
            fore: zero,
            lease: DEFAULT_LEASE,
            renewed: now,
            slots: Slots::new(n),
            records: vec![blank; usize::from(n)],
            free: (0..n).rev().collect(),
            retry: VecDeque::with_capacity(usize::from(n)),
            waiting: VecDeque::with_capacity(usize::from(n)),
            delayed: 0,
            own: None,
            destroyed_session: false,
            stats: SessionStats::default(),
            cfg,
        }
    }

    /// Where the session is.
    pub fn state(&self) -> State {
        self.state
    }

    /// The counters.
    pub fn stats(&self) -> SessionStats {
        self.stats
    }

    /// What the server granted, once a session exists.
    pub fn params(&self) -> Option<SessionParams> {
        matches!(self.state, State::Starting | State::Ready).then_some(SessionParams {
            clientid: self.client.clientid,
            sessionid: self.sessionid,
            fore: self.fore,
            lease: self.lease,
            usable_slots: self.slots.limit(),
        })
    }

    /// Whether [`Session::call`] would take one more call now (not `Full`).
    pub fn has_room(&self) -> bool {
        !self.free.is_empty()
    }

    /// The owner's calls not ended yet (waiting or on the wire).
    pub fn in_flight(&self) -> usize {
        self.records.len() - self.free.len()
    }

    /// When the session wants a poll even if the connection has nothing: an establishment step
    /// after its back-off, a lease renewal, a DELAY's end, a waiting call's time-out.
    pub fn next_timer(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut at = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        if self.own.is_none() {
            match self.state {
                State::NoClient | State::NoSession | State::Starting => at(self.next_at),
                State::Ready => at((self.renewed + self.lease / 3).max(self.next_at)),
                State::Closing => at(self.next_at),
                State::Closed => {}
            }
        }
        if self.delayed > 0 || !self.retry.is_empty() || !self.waiting.is_empty() {
            for r in &self.records {
                match r.state {
                    RecState::Delayed => at(r.until.min(r.started + self.cfg.timeout)),
                    RecState::Waiting => at(r.started + self.cfg.timeout),
                    _ => {}
                }
            }
        }
        t
    }

    /// Sends `ops` (at most one WRITE; without SEQUENCE, which the session puts first) as call
    /// `tag` of the owner's, now if the session is ready and a slot is free, else when it can
    /// (the owner is then asked for the operations again, [`SessionSink::ops`]). `Full` when
    /// the owner has [`SessionConfig::slots`] calls out already; `TooLarge` when they do not fit
    /// a call; `Closed` once the session is closing.
    pub fn call<T: Transport>(
        &mut self,
        t: &mut T,
        now: Instant,
        tag: u32,
        cred: &Cred,
        ops: &[Op<'_>],
        sink: &mut dyn SessionSink,
    ) -> Result<(), CallError> {
        if matches!(self.state, State::Closing | State::Closed) {
            return Err(CallError::Closed);
        }
        if self.state == State::Ready && ops.len() + 1 > self.fore.maxoperations as usize {
            return Err(CallError::TooLarge);
        }
        let Some(i) = self.free.pop() else {
            return Err(CallError::Full);
        };
        self.stats.calls += 1;
        let r = &mut self.records[usize::from(i)];
        *r = Record {
            state: RecState::Waiting,
            tag,
            cred: *cred,
            started: now,
            cachethis: ops.iter().any(|op| non_idempotent(op.num())),
            pinned: false,
            was_sent: false,
            ..*r
        };
        let can_go = self.state == State::Ready && self.retry.is_empty() && self.waiting.is_empty();
        let Some(seq) = can_go.then(|| self.begin(i)).flatten() else {
            self.stats.waited += 1;
            self.waiting.push_back(i);
            return Ok(());
        };
        let compound = Compound { tag: b"", minorversion: MINOR_VERSION, first: Some(seq), ops };
        let cred = self.records[usize::from(i)].cred;
        let r = t.call(u32::from(i), &cred, &compound, &mut Wrap { s: self, owner: sink, now });
        match r {
            Ok(()) => Ok(()),
            Err(CallError::Full) => {
                // The connection has no slot (its own call took the last): wait for one.
                self.unbegin(i);
                self.stats.waited += 1;
                self.waiting.push_back(i);
                Ok(())
            }
            Err(e) => {
                self.unbegin(i);
                self.free_record(i);
                Err(e)
            }
        }
    }

    /// One poll round: the connection's, then what the session has to send (see the module
    /// documentation). Never blocks.
    pub fn poll<T: Transport>(&mut self, now: Instant, t: &mut T, sink: &mut dyn SessionSink) {
        t.poll(now, &mut Wrap { s: self, owner: sink, now });
        self.pump(now, t, sink);
    }

    /// Starts the end: calls waiting end with [`CallError::Closed`], new ones are refused;
    /// DESTROY_SESSION then DESTROY_CLIENTID go once no call of the owner's is on the wire
    /// (polls drive it; [`State::Closed`] when done, whatever the server answered).
    pub fn close(&mut self, now: Instant, sink: &mut dyn SessionSink) {
        if matches!(self.state, State::Closing | State::Closed) {
            return;
        }
        let had_session = matches!(self.state, State::Starting | State::Ready);
        let had_client = self.state != State::NoClient;
        self.leave();
        self.destroy_client &= had_client;
        self.state = State::Closing;
        self.destroyed_session = !had_session;
        if !had_client {
            self.state = State::Closed;
        }
        self.next_at = now;
        for i in 0..self.records.len() {
            if matches!(self.records[i].state, RecState::Waiting | RecState::Delayed) {
                self.end(i as u16, sink, Err(CallError::Closed));
            }
        }
        self.retry.clear();
        self.waiting.clear();
    }

    /// Leaves the client share (once), learning whether this was its last session.
    fn leave(&mut self) {
        if self.joined {
            self.joined = false;
            self.destroy_client = self.cfg.client.leave(self.me);
        }
    }

    /// Takes a slot for record `i` (its pinned one if the session is the same) and returns the
    /// SEQUENCE to send; `None` when no slot is free.
    fn begin(&mut self, i: u16) -> Option<Op<'static>> {
        let r = self.records[usize::from(i)];
        let (slot, seqid, pinned) = if r.pinned && r.generation == self.generation {
            (r.slot, r.seqid, true)
        } else {
            let (slot, seqid) = self.slots.take()?;
            (slot, seqid, false)
        };
        let highest = if pinned { r.highest } else { self.slots.highest_busy() };
        let r = &mut self.records[usize::from(i)];
        if r.was_sent {
            self.stats.resent += 1;
        }
        *r =
            Record { state: RecState::Sent, slot, seqid, generation: self.generation, highest, pinned, ..*r };
        r.was_sent = true;
        Some(Op::Sequence {
            session: self.sessionid,
            sequenceid: seqid,
            slotid: u32::from(slot),
            highest_slotid: highest,
            cachethis: r.cachethis,
        })
    }

    /// Undoes [`Session::begin`] for a call that did not go: the slot is free (unless the call
    /// keeps it), its sequence id untouched.
    fn unbegin(&mut self, i: u16) {
        let r = &mut self.records[usize::from(i)];
        r.state = RecState::Waiting;
        if r.generation == self.generation && !r.pinned {
            self.slots.release(r.slot);
        }
    }

    fn free_record(&mut self, i: u16) {
        self.records[usize::from(i)].state = RecState::Free;
        self.free.push(i);
    }

    /// Ends record `i`: tells the owner, frees the record (not its slot).
    fn end(&mut self, i: u16, sink: &mut dyn SessionSink, res: Result<CompoundReply<'_>, CallError>) {
        let r = self.records[usize::from(i)];
        if r.state == RecState::Delayed {
            self.delayed -= 1;
        }
        if r.pinned && r.generation == self.generation {
            // Its slot was kept for it: the request may still be on the server.
            self.slots.unanswered(r.slot, r.seqid);
        }
        self.free_record(i);
        sink.done(r.tag, res);
    }

    /// After the connection's poll or a call: time-outs, DELAYs that are over, the session's
    /// own call, and the calls waiting, while slots are free.
    fn pump<T: Transport>(&mut self, now: Instant, t: &mut T, sink: &mut dyn SessionSink) {
        if self.delayed > 0 || !self.retry.is_empty() || !self.waiting.is_empty() {
            self.expire(now, sink);
        }
        if self.own.is_none() {
            self.send_own(now, t, sink);
        }
        if self.state != State::Ready {
            return;
        }
        let mut sent = false;
        // Until a call finds no slot (a call that keeps its slot needs no free one).
        while let Some(i) = self.retry.pop_front().or_else(|| self.waiting.pop_front()) {
            if self.records[usize::from(i)].state != RecState::Waiting {
                continue;
            }
            match self.resend(t, i, sink) {
                Ok(()) => sent = true,
                Err(CallError::Full) => {
                    self.retry.push_front(i);
                    break;
                }
                Err(e) => self.end(i, sink, Err(e)),
            }
        }
        if sent {
            t.send_queued(&mut Wrap { s: self, owner: sink, now });
        }
    }

    /// Queues record `i` on the connection with the operations its owner gives.
    fn resend<T: Transport>(
        &mut self,
        t: &mut T,
        i: u16,
        sink: &mut dyn SessionSink,
    ) -> Result<(), CallError> {
        let Some(seq) = self.begin(i) else {
            return Err(CallError::Full);
        };
        let r = self.records[usize::from(i)];
        let max_ops = self.fore.maxoperations as usize;
        let mut out = None;
        sink.ops(r.tag, &mut |ops| {
            out = Some(if ops.len() + 1 > max_ops {
                Err(CallError::TooLarge)
            } else {
                let c = Compound { tag: b"", minorversion: MINOR_VERSION, first: Some(seq), ops };
                t.queue(u32::from(i), &r.cred, &c, r.started)
            });
        });
        let out = out.unwrap_or(Err(CallError::Closed));
        if out.is_err() {
            self.unbegin(i);
        }
        out
    }

    /// Calls waiting past their time-out end; DELAYs over go to `retry`.
    fn expire(&mut self, now: Instant, sink: &mut dyn SessionSink) {
        let mut ended = false;
        for i in 0..self.records.len() {
            let r = self.records[i];
            if !matches!(r.state, RecState::Waiting | RecState::Delayed) {
                continue;
            }
            if now.saturating_duration_since(r.started) >= self.cfg.timeout {
                self.stats.timed_out += 1;
                self.end(i as u16, sink, Err(CallError::TimedOut));
                ended = true;
            } else if r.state == RecState::Delayed && now >= r.until {
                self.records[i].state = RecState::Waiting;
                self.delayed -= 1;
                self.retry.push_back(i as u16);
            }
        }
        if ended {
            let records = &self.records;
            let waiting = |i: &u16| records[usize::from(*i)].state == RecState::Waiting;
            self.retry.retain(waiting);
            self.waiting.retain(waiting);
        }
    }
}
