//! A handle's open that the server no longer knows (BAD_STATEID, STALE_STATEID, EXPIRED on a
//! READ, WRITE or SETATTR through it: the server restarted and the session came back under a
//! new client id, or it revoked the open) is opened again, transparently: PUTFH OPEN(CLAIM_FH,
//! the handle's share access, a new open owner) on the session's current client id, the new
//! stateid kept in the handle table, and the request sent again from where it was, once (a
//! second loss is EIO). Two requests of one handle that both find it lost open it once each:
//! the first kept wins, the other's open is CLOSEd in the background (an orphan).
//!
//! After a server restart the opens and locks are reclaimed first (`reclaim`): while that is
//! under way (`ClientShare::reclaiming`), a request that finds its open unknown waits for it
//! and goes again with the stateid the reclaim put in the handle table; only an open the
//! reclaim could not take back is opened anew here.
//!
//! Locks do not come back this way: a file whose lock states the server lost (it had some when
//! the loss was found, `Locks41::lose`, or their reclaim failed) is not opened again; the
//! request is EIO, and so is every later one through a handle of it, until the file's last
//! handle closes. So no write that relied on a lock goes through without it.

use std::time::Duration;

use super::attr::error;
use super::prepare::open_owner;
use super::reply::Flow;
use super::slot::{state_bytes, stateid_of, Slot, Step};
use crate::filesystem::Error;
use crate::nfs::locks41::Orphan;
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs4::{open_result, Nfsstat4, OpNum, Stateid};

/// How long a request that found its state unknown waits, while the state is reclaimed, before
/// it looks again.
pub(super) const RECLAIM_WAIT: Duration = Duration::from_millis(100);

/// Whether the opens and locks are being reclaimed after a server restart (one atomic load).
pub(super) fn reclaiming(fs: &Shared) -> bool {
    fs.v41.as_ref().is_some_and(|v| v.client.reclaiming())
}

/// What a READ, WRITE, size SETATTR, COMMIT or resend of a file does before it goes: `Some(Ok(()))`
/// waits for the reclaim (its file has lock states, which may not be taken back yet: the
/// bytes must not reach the server before its locks do), `Some(Err)` is EIO (its file's locks
/// were lost: not reclaimed), `None` goes. One atomic load each while no reclaim is under way
/// and no file is marked.
pub(super) fn hold(fs: &Shared, slot: &Slot) -> Option<Result<(), Error>> {
    let io = match slot.step {
        // A COMMIT and its resends too: writes sent again must not go before the locks.
        Step::Read | Step::Write | Step::Commit | Step::Resend => true,
        Step::Setattr => slot.stateid != Stateid::ANONYMOUS,
        _ => false,
    };
    if !io {
        return None;
    }
    if fs.locks41.is_lost(slot.nodeid) {
        return Some(Err(Error::Io));
    }
    (reclaiming(fs) && fs.locks41.states.has_node(slot.nodeid)).then_some(Ok(()))
}

/// Whether `s` says the open (or lock) stateid used is unknown to the server.
pub(super) fn lost(s: Nfsstat4) -> bool {
    matches!(s, Nfsstat4::BadStateid | Nfsstat4::StaleStateid | Nfsstat4::Expired)
}

/// Whether a failure of `op` with `s` in `slot`'s step is its handle's open lost, to open again.
pub(super) fn applies(slot: &Slot, op: OpNum, s: Nfsstat4) -> bool {
    let step_op = match slot.step {
        Step::Read => OpNum::Read,
        Step::Write => OpNum::Write,
        Step::Setattr => OpNum::Setattr,
        _ => return false,
    };
    op == step_op && lost(s) && slot.stateid != Stateid::ANONYMOUS && !slot.reopened
}

/// The open of `slot`'s handle is lost (`s`): open it again, or go again with the open another
/// request made meanwhile; EIO when the file's locks were lost.
pub(super) fn start(fs: &Shared, slot: &mut Slot, s: Nfsstat4) -> Result<Flow, Error> {
    let f = fs.handles.get(slot.handle).filter(|f| f.nodeid == slot.nodeid && !f.dir).ok_or(Error::Io)?;
    if fs.locks41.is_lost(slot.nodeid) {
        return Err(Error::Io);
    }
    let kept = stateid_of(f.state);
    if kept != slot.stateid {
        // Reclaimed, or opened again by another request, meanwhile (a file whose locks were
        // lost is marked first: never opened again).
        slot.stateid = kept;
        return Ok(Flow::Next);
    }
    if reclaiming(fs) {
        // The reclaim may yet take the open back: wait for it (the deadline bounds the wait).
        return Ok(Flow::After(RECLAIM_WAIT));
    }
    slot.reopened = true;
    if fs.locks41.lose(slot.nodeid) {
        log::warn!(
            "nfs4.1: node {}: the server lost its open ({s:?}) and its locks: EIO until its last close",
            slot.nodeid
        );
        return Err(Error::Io);
    }
    log::info!("nfs4.1: node {}: the server lost an open ({s:?}): opening it again", slot.nodeid);
    if slot.step == Step::Setattr {
        slot.fh = slot.obj;
    }
    slot.resume = slot.step;
    slot.flags = f.flags;
    slot.owner = open_owner(fs);
    slot.step = Step::Reopen;
    Ok(Flow::Next)
}

/// The re-open's reply: the handle keeps the new open (or the one another re-open kept: ours is
/// closed), and the request goes again.
pub(super) fn reopened(
    fs: &Shared,
    slot: &mut Slot,
    failed: Option<(OpNum, Nfsstat4)>,
    open: Option<(Stateid, u32, Option<Stateid>)>,
) -> Result<Flow, Error> {
    if let Some((op, s)) = failed {
        log::warn!("nfs4.1: node {}: opening a lost open again failed: {op:?} {s:?}", slot.nodeid);
        return Err(if lost(s) { Error::Io } else { error(s) });
    }
    let (stateid, rflags, deleg) = open.ok_or(Error::Io)?;
    if rflags & open_result::CONFIRM != 0 || deleg.is_some() {
        // NFSv4.0's confirmation, or a delegation despite WANT_NO_DELEG: not kept.
        log::warn!("nfs4.1: node {}: the open made again asks what this client does not do", slot.nodeid);
        fs.locks41.orphan(Orphan::Open(slot.fh, stateid));
        return Err(Error::Io);
    }
    let kept = fs.handles.replace_state(slot.handle, state_bytes(slot.stateid), state_bytes(stateid));
    match kept {
        Some(k) if k == state_bytes(stateid) => {}
        _ => fs.locks41.orphan(Orphan::Open(slot.fh, stateid)),
    }
    slot.stateid = stateid_of(kept.ok_or(Error::Io)?);
    slot.step = slot.resume;
    Ok(Flow::Next)
}
