//! The session's own calls, one at a time on the connection tag [`OWN_TAG`]: EXCHANGE_ID,
//! CREATE_SESSION, the session's first COMPOUND (SEQUENCE, PUTROOTFH, GETATTR of the lease time,
//! RECLAIM_COMPLETE once per client id), the lone SEQUENCE that renews the lease, and
//! DESTROY_SESSION and DESTROY_CLIENTID at the end; what their replies change.
//!
//! The fore channel asked: the session's slots, requests of `max_io` and 8 KiB (the connection's
//! call buffer), replies of `max_io` and 4 KiB (the connection's receive buffer has 8 KiB over
//! `max_io`), 8 KiB replies kept in the server's reply cache (a non-idempotent COMPOUND's reply:
//! a handle, attributes, a stateid), [`MAX_OPS`] operations. No back channel: CREATE_SESSION
//! sets no CONN_BACK_CHAN flag and asks the least of one (one slot, small sizes), so the server
//! calls nothing back; the client asks for no delegations and will poll for blocked locks, which
//! is all a back channel would carry, and the connection would otherwise have to serve the
//! server's calls on the same socket. The server's CB_PATH_DOWN flags in SEQUENCE results say
//! so, and are only counted.

use std::time::Instant;

use super::client::{Created, Turn};
use super::reply::Verdict;
use super::{
    Own, OwnKind, RecState, Session, SessionSink, State, Transport, Wrap, DELAY, MAX_BACKOFF, MIN_BACKOFF,
    OWN_TAG, SHARE_WAIT,
};
use crate::nfs::conn::{CallError, Compound, CompoundReply};
use crate::nfs::wire::nfs4::{
    attr, exchgid, Bitmap, CbSec, ChannelAttrs, CreateSession, ExchangeId, ImplId, NfsTime4, Nfsstat4, Op,
    OpNum, OpRes, MAX_OPS, MINOR_VERSION,
};

/// The callback program number sent (no callback is ever served).
const CB_PROGRAM: u32 = 0x4000_0000;
/// The back channel asked: the least there is.
const BACK: ChannelAttrs = ChannelAttrs {
    headerpadsize: 0,
    maxrequestsize: 4096,
    maxresponsesize: 4096,
    maxresponsesize_cached: 0,
    maxoperations: 2,
    maxrequests: 1,
    rdma_ird: None,
};
const IMPL: ImplId<'static> = ImplId {
    domain: b"virtiofs-dpu.invalid",
    name: b"virtiofs-dpu",
    date: NfsTime4 { seconds: 0, nseconds: 0 },
};
const LEASE: Bitmap = Bitmap::of(&[attr::LEASE_TIME]);

impl Session {
    /// The fore channel asked of CREATE_SESSION.
    fn fore_asked(&self) -> ChannelAttrs {
        ChannelAttrs {
            headerpadsize: 0,
            maxrequestsize: self.cfg.max_io.saturating_add(8192),
            maxresponsesize: self.cfg.max_io.saturating_add(4096),
            maxresponsesize_cached: 8192,
            maxoperations: MAX_OPS,
            maxrequests: u32::from(self.cfg.slots),
            rdma_ird: None,
        }
    }

    /// Sends the session's next own call, if one is due.
    pub(super) fn send_own<T: Transport>(&mut self, now: Instant, t: &mut T, sink: &mut dyn SessionSink) {
        if now < self.next_at {
            return;
        }
        let share = self.cfg.client.clone();
        let mut cs_sequence = 0;
        if self.state == State::NoClient {
            match share.client(self.me) {
                Turn::Go(Some(c)) => {
                    // Another session of the share has the client id: no EXCHANGE_ID.
                    self.client = c;
                    self.state = State::NoSession;
                }
                Turn::Go(None) => {}
                Turn::Wait => {
                    self.next_at = now + SHARE_WAIT;
                    return;
                }
            }
        }
        if self.state == State::NoSession {
            match share.create(self.me, self.client) {
                Turn::Go(Some(seq)) => cs_sequence = seq,
                Turn::Go(None) => {
                    // The client id went meanwhile: get the current one first.
                    self.state = State::NoClient;
                    self.next_at = now;
                    return self.send_own(now, t, sink);
                }
                Turn::Wait => {
                    self.next_at = now + SHARE_WAIT;
                    return;
                }
            }
        }
        let kind = match self.state {
            State::NoClient => OwnKind::ExchangeId,
            State::NoSession => OwnKind::CreateSession,
            State::Starting => OwnKind::Start,
            State::Ready if now >= self.renewed + self.lease / 3 => OwnKind::Renew,
            State::Closing if !self.destroyed_session => {
                if self.records.iter().any(|r| r.state == RecState::Sent) {
                    // DESTROY_SESSION once the owner's calls are answered.
                    return;
                }
                OwnKind::DestroySession
            }
            State::Closing if !self.destroy_client => {
                // Other sessions of the share still use the client id.
                self.state = State::Closed;
                return;
            }
            State::Closing => OwnKind::DestroyClientid,
            _ => return,
        };
        let (slot, seqid) = match kind {
            OwnKind::Start | OwnKind::Renew => {
                let Some(s) = self.slots.take() else { return };
                s
            }
            OwnKind::CreateSession => (0, cs_sequence),
            _ => (0, 0),
        };
        let seq = Op::Sequence {
            session: self.sessionid,
            sequenceid: seqid,
            slotid: u32::from(slot),
            highest_slotid: self.slots.highest_busy(),
            cachethis: false,
        };
        let fore = self.fore_asked();
        let one = [match kind {
            OwnKind::ExchangeId => Op::ExchangeId(ExchangeId {
                verifier: share.verifier(),
                owner_id: share.owner(),
                flags: 0,
                impl_id: Some(IMPL),
            }),
            OwnKind::CreateSession => Op::CreateSession(CreateSession {
                clientid: self.client.clientid,
                sequence: cs_sequence,
                flags: 0,
                fore,
                back: BACK,
                cb_program: CB_PROGRAM,
                sec: CbSec::None,
            }),
            OwnKind::DestroySession => Op::DestroySession { session: self.sessionid },
            OwnKind::DestroyClientid => Op::DestroyClientid { clientid: self.client.clientid },
            OwnKind::Start | OwnKind::Renew => Op::Putrootfh,
        }];
        let start = [Op::Putrootfh, Op::Getattr { attrs: LEASE }, Op::ReclaimComplete { one_fs: false }];
        // One start among the share's sessions carries the client id's RECLAIM_COMPLETE.
        let reclaim = kind == OwnKind::Start && share.claim_reclaim_complete(self.client);
        let c = match kind {
            OwnKind::Start => {
                let n = if reclaim { 3 } else { 2 };
                Compound { tag: b"", minorversion: MINOR_VERSION, first: Some(seq), ops: &start[..n] }
            }
            OwnKind::Renew => Compound { tag: b"", minorversion: MINOR_VERSION, first: Some(seq), ops: &[] },
            _ => Compound::of(&one),
        };
        match t.queue(OWN_TAG, &self.cfg.cred, &c, now) {
            Ok(()) => {
                if kind == OwnKind::Renew {
                    self.stats.renewals += 1;
                }
                self.own = Some(Own { kind, slot, seqid, generation: self.generation, reclaim });
                t.send_queued(&mut Wrap { s: self, owner: sink, now });
            }
            Err(e) => {
                if reclaim {
                    share.reclaim_unsent(self.client);
                }
                match kind {
                    OwnKind::Start | OwnKind::Renew => self.slots.release(slot),
                    OwnKind::ExchangeId => share.exchange_failed(self.me),
                    OwnKind::CreateSession => share.created(self.me, self.client, Created::Failed),
                    _ => {}
                }
                if e != CallError::Full {
                    self.failed(now, Nfsstat4::ServerFault);
                }
            }
        }
    }

    /// An establishment call failed (`status`, or a time-out or broken reply as DELAY): the
    /// next one goes after the back-off.
    fn failed(&mut self, now: Instant, status: Nfsstat4) {
        self.stats.establish_failures += 1;
        self.stats.last_establish_error = status.to_u32();
        self.next_at = now + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    fn succeeded(&mut self, now: Instant) {
        self.next_at = now;
        self.backoff = MIN_BACKOFF;
    }

    /// The reply (or failure) of the session's own call.
    pub(super) fn own_done(&mut self, now: Instant, res: Result<CompoundReply<'_>, CallError>) {
        let Some(own) = self.own.take() else { return };
        let answered = matches!(&res, Ok(r) if r.results.clone().any(|op| matches!(
            op,
            Ok(OpRes::ReclaimComplete)
                | Ok(OpRes::Failed { op: OpNum::ReclaimComplete, status: Nfsstat4::CompleteAlready, .. })
        )));
        if own.reclaim && !answered {
            // Its RECLAIM_COMPLETE got no answer (or failed): the next start carries it.
            self.cfg.client.reclaim_unsent(self.client);
        }
        let with_sequence = matches!(own.kind, OwnKind::Start | OwnKind::Renew);
        let current = own.generation == self.generation;
        let reply = match res {
            Ok(reply) => reply,
            Err(e) => {
                if with_sequence && current {
                    match e {
                        CallError::Rpc(_) | CallError::Payload | CallError::Full => {
                            self.slots.release(own.slot)
                        }
                        _ => self.slots.unanswered(own.slot, own.seqid),
                    }
                }
                match own.kind {
                    OwnKind::ExchangeId => self.cfg.client.exchange_failed(self.me),
                    // It may have been done: the same sequence goes again (the server's
                    // CREATE_SESSION reply cache answers), by this session only.
                    OwnKind::CreateSession => {
                        self.cfg.client.created(self.me, self.client, Created::Unanswered)
                    }
                    _ => {}
                }
                self.own_failed(now, own.kind, Nfsstat4::Delay);
                return;
            }
        };
        let mut results = reply.results.clone();
        if with_sequence {
            let first = results.next();
            let verdict = match &first {
                Some(Err(_)) => Verdict::Broken,
                Some(Ok(op)) => self.sequence(now, own.slot, own.seqid, own.generation, false, Some(op)),
                None => self.sequence(now, own.slot, own.seqid, own.generation, false, None),
            };
            match verdict {
                Verdict::Ok => {}
                Verdict::Again { delay, pin } => {
                    if pin {
                        // An own call keeps no slot: the slot is counted as used, maybe wrongly
                        // (a SEQ_MISORDERED on its next call steps it back).
                        self.slots.unanswered(own.slot, own.seqid);
                    }
                    if delay {
                        self.next_at = now + DELAY;
                    }
                    return;
                }
                Verdict::Deliver | Verdict::Broken => {
                    self.own_failed(now, own.kind, reply.status);
                    return;
                }
            }
        }
        match own.kind {
            OwnKind::ExchangeId => match results.next() {
                Some(Ok(OpRes::ExchangeId(x))) => {
                    // A client id the server just made is to be reclaimed on, then
                    // RECLAIM_COMPLETE (the share knows).
                    let confirmed = x.flags & exchgid::CONFIRMED_R != 0;
                    let server = (x.server_major_id, x.server_scope);
                    self.client =
                        self.cfg.client.exchanged(self.me, x.clientid, x.sequenceid, confirmed, server);
                    self.stats.exchange_ids += 1;
                    if self.state == State::NoClient {
                        self.state = State::NoSession;
                    }
                    self.succeeded(now);
                }
                _ => {
                    self.cfg.client.exchange_failed(self.me);
                    self.own_failed(now, own.kind, reply.status)
                }
            },
            OwnKind::CreateSession => match results.next() {
                Some(Ok(OpRes::CreateSession(cs))) if cs.sequence == own.seqid => {
                    self.cfg.client.created(self.me, self.client, Created::Session);
                    self.sessionid = cs.sessionid;
                    self.fore = cs.fore;
                    self.slots.reset(cs.fore.maxrequests);
                    self.generation = self.generation.wrapping_add(1);
                    self.stats.sessions += 1;
                    match self.state {
                        State::NoSession | State::NoClient => self.state = State::Starting,
                        State::Closing => self.destroyed_session = false,
                        _ => {}
                    }
                    self.succeeded(now);
                }
                _ => match reply.status {
                    Nfsstat4::StaleClientid | Nfsstat4::SeqMisordered => {
                        // The client id is gone, or its CREATE_SESSION sequence is not ours: a
                        // new EXCHANGE_ID gives both.
                        let how = if reply.status == Nfsstat4::StaleClientid {
                            self.stats.stale_clientids += 1;
                            Created::Stale
                        } else {
                            Created::Misordered
                        };
                        self.cfg.client.created(self.me, self.client, how);
                        if self.state == State::NoSession {
                            self.state = State::NoClient;
                        }
                        self.next_at = now;
                    }
                    Nfsstat4::Delay => {
                        self.cfg.client.created(self.me, self.client, Created::Unanswered);
                        self.own_failed(now, own.kind, Nfsstat4::Delay)
                    }
                    s => {
                        self.cfg.client.created(self.me, self.client, Created::Failed);
                        self.own_failed(now, own.kind, s)
                    }
                },
            },
            OwnKind::Start => {
                let mut delay = false;
                for r in results {
                    match r {
                        Ok(OpRes::Getattr(a)) => {
                            if let Some(l) = a.lease_time.filter(|l| *l > 0) {
                                self.lease = std::time::Duration::from_secs(u64::from(l));
                            }
                        }
                        Ok(OpRes::ReclaimComplete)
                        | Ok(OpRes::Failed {
                            op: OpNum::ReclaimComplete,
                            status: Nfsstat4::CompleteAlready,
                            ..
                        }) => {
                            self.cfg.client.reclaim_done(self.client);
                            self.stats.reclaim_completes += 1;
                        }
                        Ok(OpRes::Failed { status: Nfsstat4::Delay, .. }) => delay = true,
                        Ok(OpRes::Failed { status, .. }) => {
                            self.stats.establish_failures += 1;
                            self.stats.last_establish_error = status.to_u32();
                        }
                        _ => {}
                    }
                }
                if delay {
                    self.stats.delays += 1;
                    self.next_at = now + DELAY;
                } else if self.state == State::Starting && current {
                    self.state = State::Ready;
                    self.succeeded(now);
                }
            }
            OwnKind::Renew => {}
            OwnKind::DestroySession => {
                self.destroyed_session = true;
                self.next_at = now;
            }
            OwnKind::DestroyClientid => self.state = State::Closed,
        }
    }

    /// An own call failed with `status`: establishment goes on after the back-off; destruction
    /// goes on regardless (the server drops what is left at the end of the lease).
    fn own_failed(&mut self, now: Instant, kind: OwnKind, status: Nfsstat4) {
        match kind {
            OwnKind::DestroySession => {
                self.destroyed_session = true;
                self.next_at = now;
            }
            OwnKind::DestroyClientid => self.state = State::Closed,
            _ => self.failed(now, status),
        }
    }
}
