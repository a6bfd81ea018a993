//! The opens and silly names of an ended session (`crate::nfs::locks41::Orphan`), ended on the
//! server from background slots, as `lock` lets orphaned lock states go: CLOSE of each open
//! the handle table forgot, REMOVE of each silly name nobody's last close will remove. A
//! failure is logged (a CLOSE's counted in `close_failures`); a CLOSE that failed otherwise
//! than on a stateid the server no longer knows, or any call that got no reply, goes again
//! later (`Locks41::orphan_again`: a back-off, a bounded number of tries), since the pollers'
//! renewals keep the lease, and so the open, for the client's life.

use super::slot::{Kind, Slot, Step};
use crate::nfs::conn::{CallError, CompoundReply, Cred};
use crate::nfs::locks41::{Locks41, Orphan};
use crate::nfs::shared::EngineCell;
use crate::nfs::wire::nfs4::{Nfsstat4, OpRes};

/// Fills background slot `slot` with orphan `o` (a lock state: `lock::start_orphan`).
pub(super) fn start(slot: &mut Slot, o: Orphan, tries: u8) {
    slot.orphan = Some((o, tries));
    match o {
        Orphan::Lock(fh, stateid) => return super::lock::start_orphan(slot, fh, stateid),
        Orphan::Unlock(fh, stateid, lock) => return super::lock::start_unlock(slot, fh, stateid, lock),
        _ => {}
    }
    slot.cred = Cred::ROOT;
    slot.nodeid = 0;
    slot.frees.clear();
    slot.attempt = None;
    slot.answer = None;
    slot.silly = false;
    match o {
        Orphan::Open(fh, stateid) => {
            slot.obj = fh;
            slot.stateid = stateid;
            slot.kind = Kind::OrphanOpen;
            slot.step = Step::Close;
        }
        Orphan::Silly(dir, name) => {
            slot.fh = dir;
            // A silly name is 20 bytes: always within NAME_MAX.
            let _ = slot.names.set(&name, b"");
            slot.kind = Kind::OrphanSilly;
            slot.step = Step::Remove;
        }
        Orphan::Lock(..) | Orphan::Unlock(..) => {}
    }
}

/// Background slot `slot`'s cleanup (an orphan, or the LOCKU of a lock granted too late)
/// failed (`tried`) or could not be sent: it waits to go again (`Locks41::orphan_again`,
/// `put_back`). Before [`ended`].
pub(super) fn requeue(locks: &Locks41, slot: &Slot, tried: bool) {
    let (o, tries) = match slot.orphan {
        Some(x) => x,
        None if slot.kind == Kind::LetGo => match slot.lock_state {
            Some(s) => (Orphan::Unlock(slot.obj, s, slot.lock), 0),
            None => return,
        },
        None => return,
    };
    if tried {
        locks.orphan_again(o, tries);
    } else {
        locks.put_back(o, tries);
    }
}

/// Whether background slot `slot` ends an open or a silly name.
pub(super) fn is_orphan(slot: &Slot) -> bool {
    matches!(slot.kind, Kind::OrphanOpen | Kind::OrphanSilly)
}

/// The reply of an orphan's call: logged, a CLOSE's failure counted; the slot is free after it
/// (`false`: nothing more to send).
pub(super) fn reply(
    locks: &Locks41,
    slot: &mut Slot,
    res: Result<CompoundReply<'_>, CallError>,
    cell: &EngineCell,
) -> bool {
    // Why it failed, and its status if the server gave one (`None`: no reply).
    let failure = match res {
        Err(e) => Some((e.to_string(), None)),
        Ok(r) => {
            let mut failed = (r.status != Nfsstat4::Ok).then(|| (format!("{:?}", r.status), Some(r.status)));
            for op in r.results.clone() {
                match op {
                    Ok(OpRes::Failed { op, status, .. }) => {
                        failed = Some((format!("{op:?} {status:?}"), Some(status)))
                    }
                    Ok(_) => {}
                    Err(_) => failed = Some(("undecodable".into(), None)),
                }
            }
            failed
        }
    };
    let Some((why, status)) = failure else { return false };
    let again = match (slot.kind, status) {
        (_, None) => true,
        (Kind::OrphanOpen, Some(s)) => !super::reopen::lost(s) && s != Nfsstat4::OldStateid,
        (_, Some(s)) => s == Nfsstat4::ServerFault,
    };
    match slot.kind {
        Kind::OrphanOpen => {
            EngineCell::bump(&cell.close_failures);
            log::info!("nfs4.1: CLOSE of an open of an ended session failed: {why}");
        }
        _ => log::warn!("nfs4.1: REMOVE of the silly name of an ended session failed: {why}"),
    }
    if again {
        requeue(locks, slot, true);
    }
    false
}

/// Background slot `slot`'s call ended (answered, failed, abandoned): an orphan it carried is
/// no longer on the wire (the next phase's may go).
pub(super) fn ended(locks: &Locks41, slot: &mut Slot) {
    if let Some((o, _)) = slot.orphan.take() {
        locks.orphan_ended(o.phase());
    }
}
