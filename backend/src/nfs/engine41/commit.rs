//! UNSTABLE writes on NFSv4.1, with the replay store NFSv3 uses (`crate::nfs::unstable`, whose
//! module documentation has the rules): a WRITE's chunk is copied into the store before it goes
//! UNSTABLE4 ([`before_write`]), and learns its write verifier from the reply; FLUSH, FSYNC,
//! the last RELEASE of a file, a truncating SETATTR and a FILE_SYNC4 WRITE that found the store
//! full (after answered writes of its file) COMMIT first (`Step::Commit`, [`commit_first`]);
//! a COMMIT whose verifier is not the writes' (the server restarted) sends them again, oldest
//! first, FILE_SYNC4 with the anonymous stateid (`Step::Resend`: the file may have no open left
//! on the new server, and nothing may be lost); past the store's high-water mark an engine
//! COMMITs in the background ([`BgCommit`]) the file with the most answered bytes.
//!
//! The store is the pollers' (one file's writes come through several queues); one resend at a
//! time per engine (its replay buffer, `Nfs41Engine::replay_owner`).

use std::time::{Duration, Instant};

use super::attr::error;
use super::reply::Flow;
use super::slot::stateid_of;
use super::slot::{Kind, Slot, Step};
use crate::filesystem::{Error, Reply};
use crate::io::Reader;
use crate::nfs::shared::Shared;
use crate::nfs::unstable::BackgroundClaim;
use crate::nfs::wire::nfs4::{Nfsstat4, Stable4, Stateid};

/// A failed background COMMIT holds the next one back this long.
pub(super) const BG_COMMIT_BACKOFF: Duration = Duration::from_millis(200);

/// What a WRITE's chunk does before it goes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Before {
    /// It goes (UNSTABLE4 when stored, else FILE_SYNC4).
    Go,
    /// The store is full and a COMMIT will free room: it waits for it, a retransmission
    /// interval at most.
    Wait,
    /// The store is full for good: the file's answered writes are committed first (the
    /// slot's step is now `Commit`, then the WRITE, FILE_SYNC4): no payload now.
    CommitFirst,
}

/// Before slot `slot`'s WRITE chunk `p` (its bytes) goes: see [`Before`].
pub(super) fn before_write(fs: &Shared, slot: &mut Slot, p: &Reader<'_>, now: Instant) -> Before {
    if slot.unstable.is_some() {
        // Stored at an earlier send of this chunk (the open opened again, a backlog).
        return Before::Go;
    }
    let at = slot.offset + u64::from(slot.done);
    slot.unstable = fs.unstable.insert(slot.nodeid, &slot.fh, &slot.cred, at, p);
    slot.stable = if slot.unstable.is_some() { Stable4::Unstable } else { Stable4::FileSync };
    if slot.unstable.is_some() {
        return Before::Go;
    }
    if slot.room_until.is_none_or(|t| now < t)
        && fs.unstable.fits(p.bytes_left())
        && fs.unstable.room_may_come()
    {
        slot.room_until.get_or_insert(now + fs.retransmit);
        return Before::Wait;
    }
    if fs.unstable.enabled() {
        fs.unstable.count_full();
    }
    if fs.unstable.has_answered(slot.nodeid) {
        // A replay must never land on top of this FILE_SYNC4 write.
        slot.obj = slot.fh;
        slot.then = Some(Step::Write);
        slot.step = Step::Commit;
        return Before::CommitFirst;
    }
    Before::Go
}

/// The request's COMMIT goes first if node `slot.nodeid` has stored writes (`answered`: only
/// if some were answered, for a truncating SETATTR), then `then` (`None`: the answer):
/// whether it does. `obj` must be the file's handle.
pub(super) fn commit_first(fs: &Shared, slot: &mut Slot, then: Option<Step>, answered: bool) -> bool {
    let stored = if answered { fs.unstable.has_answered(slot.nodeid) } else { fs.unstable.has(slot.nodeid) };
    if !stored {
        return false;
    }
    slot.then = then;
    slot.step = Step::Commit;
    true
}

/// The reply to a guest request's COMMIT or resend (`failed`: the COMPOUND's failure; `verf`
/// COMMIT's verifier; `written` the resend's count).
pub(super) fn reply(
    fs: &Shared,
    slot: &mut Slot,
    failed: Option<Nfsstat4>,
    verf: Option<[u8; 8]>,
    written: Option<u32>,
) -> Result<Flow, Error> {
    if let (Step::Resend, Some(Nfsstat4::Access | Nfsstat4::Perm), false) =
        (slot.step, failed, slot.resend_open)
    {
        // A write the guest made through an open for writing, to a file whose mode no longer
        // lets its caller write (`open(O_CREAT | O_WRONLY, 0444)`, as tar extracts): the
        // server checks the mode for the anonymous stateid. The same write goes again with the
        // request's handle's open (once a reclaim under way is over: the open it reclaimed).
        if handle_open(fs, slot).is_some() {
            slot.resend_open = true;
            return Ok(Flow::Next);
        }
    }
    if let Some(s) = failed {
        if s == Nfsstat4::Stale {
            // The file is gone: nothing of it can be committed any more.
            fs.unstable.drop_file(slot.nodeid);
        }
        if matches!(slot.kind, Kind::Release | Kind::Flush) && slot.then.is_some() {
            // What follows must still go (lock states already forgotten, the open's CLOSE);
            // a FLUSH answers the failure after it (the stored writes stay, for a later
            // COMMIT).
            log::warn!(
                "nfs4.1: {:?} of node {} before its {:?} failed: {s:?}",
                slot.step,
                slot.nodeid,
                slot.kind
            );
            slot.answer = Some(Err(error(s)));
            return Ok(then(slot));
        }
        return Err(error(s));
    }
    match slot.step {
        Step::Commit => {
            let c = fs.unstable.committed(slot.nodeid, verf.ok_or(Error::Io)?, slot.horizon);
            if c.resend > 0 {
                log::info!(
                    "nfs4.1: the server's write verifier changed: sending {} writes of node {} again",
                    c.resend,
                    slot.nodeid
                );
                slot.step = Step::Resend;
                return Ok(Flow::Next);
            }
            Ok(then(slot))
        }
        Step::Resend => {
            if written.ok_or(Error::Io)? < slot.replay_len {
                return Err(Error::Io);
            }
            if let Some(id) = slot.replay.take() {
                fs.unstable.remove(id);
            }
            // The next stored write of the file, if any (the engine looks).
            Ok(Flow::Next)
        }
        _ => Err(Error::Io),
    }
}

/// The open of the request's handle, if it is a file of the slot's node whose open the server
/// may know (not one a crash left unknown).
pub(super) fn handle_open(fs: &Shared, slot: &Slot) -> Option<Stateid> {
    let f = fs.handles.get(slot.handle).filter(|f| f.nodeid == slot.nodeid && !f.dir)?;
    if f.state == crate::nfs::state::LOST_OPEN || f.state == [0; 16] {
        return None;
    }
    Some(stateid_of(f.state))
}

/// The commit and its resends are done: the step after them, or the answer.
pub(super) fn then(slot: &mut Slot) -> Flow {
    match slot.then.take() {
        Some(step) => {
            slot.step = step;
            Flow::Next
        }
        None => Flow::Done(Ok(Reply::Empty)),
    }
}

/// A COMMIT an engine sent on its own (see the module documentation), while on the wire.
pub(super) struct BgCommit {
    pub(super) file: u64,
    pub(super) horizon: u64,
    /// The store's one background COMMIT is this one while held.
    pub(super) _claim: BackgroundClaim,
}

/// The background COMMIT `b` ended (`Ok(verf)`, or the status it failed with, `None`: no
/// reply); whether the next one is to wait ([`BG_COMMIT_BACKOFF`]).
pub(super) fn background_done(fs: &Shared, b: BgCommit, res: Result<[u8; 8], Option<Nfsstat4>>) -> bool {
    match res {
        Ok(verf) => {
            let c = fs.unstable.committed_background(b.file, verf, b.horizon);
            if c.resend > 0 {
                // Sent again at the file's next FLUSH, FSYNC or last close.
                log::info!("nfs4.1: the server's write verifier changed: {} writes to send again", c.resend);
            }
            false
        }
        Err(Some(Nfsstat4::Stale)) => {
            fs.unstable.drop_file(b.file);
            false
        }
        Err(s) => {
            log::debug!("nfs4.1: background COMMIT failed: {s:?}");
            true
        }
    }
}
