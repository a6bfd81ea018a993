//! Replies: every SEQUENCE result ([`Session::sequence`]: the slot's sequence, the server's slot
//! limits, its status flags, and the errors that make a new session or client id, resynchronise
//! a slot or send the call again), then the owner's reply ([`Session::owner_done`]).

use std::time::Instant;

use super::{non_idempotent, RecState, Session, SessionSink, State, DELAY, GRACE_WAIT};
use crate::nfs::conn::{CallError, CompoundReply};
use crate::nfs::wire::nfs4::{Nfsstat4, OpNum, OpRes, Results};

/// What a SEQUENCE result means for its call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// SEQUENCE succeeded: the slot is free and in step; the rest of the reply is the caller's.
    Ok,
    /// The server did not take the call: send it again, after a DELAY (`delay`), keeping its
    /// slot and sequence id (`pin`: the slot stays busy for it) or on any slot once the session
    /// is ready again.
    Again {
        /// Wait [`DELAY`] first.
        delay: bool,
        /// Same slot, same sequence id.
        pin: bool,
    },
    /// The reply is the caller's as it is (no SEQUENCE result: the COMPOUND failed before it;
    /// or a SEQUENCE failure the session leaves to the caller). The slot is free.
    Deliver,
    /// The SEQUENCE result is not this call's (another slot or sequence id): garbage.
    Broken,
}

impl Session {
    /// The first result `first` of a call that went with SEQUENCE on `slot` with `seqid`, on
    /// session number `generation`.
    pub(super) fn sequence(
        &mut self,
        now: Instant,
        slot: u16,
        seqid: u32,
        generation: u32,
        cachethis: bool,
        first: Option<&OpRes<'_>>,
    ) -> Verdict {
        // A call of a session since replaced: the slot table it used is gone.
        let current = generation == self.generation;
        match first {
            Some(OpRes::Sequence(sr)) => {
                if sr.slotid != u32::from(slot)
                    || sr.sequenceid != seqid
                    || (current && sr.sessionid != self.sessionid)
                {
                    if current {
                        self.slots.unanswered(slot, seqid);
                    }
                    return Verdict::Broken;
                }
                if sr.status_flags != 0 {
                    self.stats.flagged += 1;
                }
                self.stats.status_flags = sr.status_flags;
                self.stats.status_flags_seen |= sr.status_flags;
                if current {
                    self.slots.answered(slot, seqid);
                    self.slots.server_limits(sr.highest_slotid, sr.target_highest_slotid);
                    self.renewed = now;
                }
                Verdict::Ok
            }
            Some(OpRes::Failed { op: OpNum::Sequence, status, .. }) => {
                if !current {
                    return Verdict::Again { delay: false, pin: false };
                }
                self.sequence_failed(now, slot, seqid, cachethis, *status)
            }
            _ => {
                if current {
                    // Not taken: the slot's sequence is as it was.
                    self.slots.release(slot);
                }
                Verdict::Deliver
            }
        }
    }

    /// SEQUENCE failed with `status` on the current session.
    fn sequence_failed(
        &mut self,
        now: Instant,
        slot: u16,
        seqid: u32,
        cachethis: bool,
        status: Nfsstat4,
    ) -> Verdict {
        let again = Verdict::Again { delay: false, pin: false };
        match status {
            Nfsstat4::BadSession | Nfsstat4::DeadSession | Nfsstat4::ConnNotBoundToSession => {
                self.stats.bad_sessions += 1;
                self.slots.release(slot);
                self.lose(now, State::NoSession);
                again
            }
            Nfsstat4::StaleClientid => {
                self.stats.stale_clientids += 1;
                self.slots.release(slot);
                self.lose(now, State::NoClient);
                again
            }
            Nfsstat4::Delay => {
                // The request may be in progress on the server (this was a retransmission): only
                // the same slot and sequence id may be answered from its reply cache.
                self.stats.delays += 1;
                Verdict::Again { delay: true, pin: true }
            }
            Nfsstat4::SeqMisordered => {
                self.stats.misordered += 1;
                let s = self.slots.get_mut(slot);
                if s.uncertain {
                    // The call that ended without a reply never reached the server: step back.
                    s.acked = s.acked.wrapping_sub(1);
                    s.uncertain = false;
                } else if !s.restarted {
                    // The server may have started the slot over (a slot given back and taken
                    // again): from sequence id 1.
                    s.acked = 0;
                    s.restarted = true;
                } else {
                    self.slots.release(slot);
                    self.lose(now, State::NoSession);
                    return again;
                }
                self.slots.release(slot);
                again
            }
            Nfsstat4::SeqFalseRetry => {
                // The server holds another request at this sequence id: go past it.
                self.stats.false_retries += 1;
                self.slots.answered(slot, seqid);
                again
            }
            Nfsstat4::RetryUncachedRep => {
                // The request was done, its reply not kept: an idempotent call goes again, the
                // others' owners are told.
                self.stats.uncached += 1;
                self.slots.answered(slot, seqid);
                if cachethis {
                    Verdict::Deliver
                } else {
                    again
                }
            }
            Nfsstat4::BadSlot | Nfsstat4::BadHighSlot => {
                self.stats.bad_slots += 1;
                self.slots.release(slot);
                self.slots.refuse_from(slot);
                if self.slots.limit() == 0 {
                    self.lose(now, State::NoSession);
                }
                again
            }
            _ => {
                self.slots.release(slot);
                Verdict::Deliver
            }
        }
    }

    /// The session (`to` [`State::NoSession`]) or the client id ([`State::NoClient`]) is gone:
    /// establish again, at once. Never forward, never while closing.
    pub(super) fn lose(&mut self, now: Instant, to: State) {
        let back = match self.state {
            State::Starting | State::Ready => true,
            State::NoSession => to == State::NoClient,
            _ => false,
        };
        if back {
            if to == State::NoClient {
                // For the other sessions of the share too (unless a newer one came).
                self.cfg.client.stale(self.client);
            }
            self.state = to;
            self.next_at = now;
        }
    }

    /// The reply (or failure) of the owner's call on connection tag `tag`.
    pub(super) fn owner_done(
        &mut self,
        now: Instant,
        tag: u32,
        res: Result<CompoundReply<'_>, CallError>,
        owner: &mut dyn SessionSink,
    ) {
        let Some(r) = self.records.get(tag as usize).copied().filter(|r| r.state == RecState::Sent) else {
            return;
        };
        let i = tag as u16;
        self.records[usize::from(i)].pinned = false;
        let current = r.generation == self.generation;
        let reply = match res {
            Ok(reply) => reply,
            Err(e) => {
                if current {
                    match e {
                        // Refused before the NFS server saw it, or never all sent.
                        CallError::Rpc(_) | CallError::Payload | CallError::Full => {
                            self.slots.release(r.slot)
                        }
                        _ => self.slots.unanswered(r.slot, r.seqid),
                    }
                }
                self.end(i, owner, Err(e));
                return;
            }
        };
        let mut results = reply.results.clone();
        let first = results.next();
        let verdict = match &first {
            Some(Err(_)) => Verdict::Broken,
            Some(Ok(op)) => self.sequence(now, r.slot, r.seqid, r.generation, r.cachethis, Some(op)),
            None => self.sequence(now, r.slot, r.seqid, r.generation, r.cachethis, None),
        };
        let mut wait = DELAY;
        let verdict = match (verdict, reply.status) {
            (Verdict::Ok, status @ (Nfsstat4::Delay | Nfsstat4::Grace)) if !ran_once(results.clone()) => {
                // An operation's DELAY, or GRACE (the server's grace period after a restart):
                // the request was taken (the slot moved on) and nothing it did must not be done
                // twice; the whole COMPOUND goes again later, as a new request. (When an
                // operation that must not run twice ran before the one that failed, the owner
                // gets the reply and sends only the rest.)
                self.stats.delays += 1;
                if status == Nfsstat4::Grace {
                    wait = GRACE_WAIT;
                }
                Verdict::Again { delay: true, pin: false }
            }
            (Verdict::Ok, Nfsstat4::StaleClientid) => {
                self.stats.stale_clientids += 1;
                self.lose(now, State::NoClient);
                Verdict::Again { delay: false, pin: false }
            }
            (Verdict::Ok, _) => Verdict::Deliver,
            (v, _) => v,
        };
        match verdict {
            Verdict::Deliver | Verdict::Ok => {
                let results = if first.is_some() { results } else { reply.results };
                let out = CompoundReply { status: reply.status, tag: reply.tag, results, read: reply.read };
                self.end(i, owner, Ok(out));
            }
            Verdict::Broken => self.end(i, owner, Err(CallError::Broken)),
            Verdict::Again { delay, pin } => {
                let rec = &mut self.records[usize::from(i)];
                rec.pinned = pin;
                if delay {
                    rec.state = RecState::Delayed;
                    rec.until = now + wait;
                    self.delayed += 1;
                } else {
                    rec.state = RecState::Waiting;
                    self.retry.push_back(i);
                }
            }
        }
    }
}

/// Whether an operation that must not run twice ([`non_idempotent`]) succeeded among `results`
/// (those after SEQUENCE, up to the one that failed).
fn ran_once(results: Results<'_>) -> bool {
    results.filter_map(|r| r.ok()).any(|op| !matches!(op, OpRes::Failed { .. }) && non_idempotent(op.op()))
}
