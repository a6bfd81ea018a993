//! The opens and silly names of an ended session (`crate::nfs::locks41::Orphan`), ended on the
//! server from background slots, as `lock` lets orphaned lock states go: CLOSE of each open
//! the handle table forgot, REMOVE of each silly name nobody's last close will remove. A
//! failure is logged (a CLOSE's counted in `close_failures`) and left to the lease; nothing is
//! tried again.

use super::slot::{Kind, Slot, Step};
use crate::nfs::conn::{CallError, CompoundReply, Cred};
use crate::nfs::locks41::{Locks41, Orphan};
use crate::nfs::shared::EngineCell;
use crate::nfs::wire::nfs4::{Nfsstat4, OpRes};

/// Fills background slot `slot` with orphan `o` (a lock state: `lock::start_orphan`).
pub(super) fn start(slot: &mut Slot, o: Orphan) {
    slot.orphan = Some(o.phase());
    if let Orphan::Lock(fh, stateid) = o {
        return super::lock::start_orphan(slot, fh, stateid);
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
        Orphan::Lock(..) => {}
    }
}

/// Whether background slot `slot` ends an open or a silly name.
pub(super) fn is_orphan(slot: &Slot) -> bool {
    matches!(slot.kind, Kind::OrphanOpen | Kind::OrphanSilly)
}

/// The reply of an orphan's call: logged, a CLOSE's failure counted; the slot is free after it
/// (`false`: nothing more to send).
pub(super) fn reply(slot: &mut Slot, res: Result<CompoundReply<'_>, CallError>, cell: &EngineCell) -> bool {
    let failure = match res {
        Err(e) => Some(e.to_string()),
        Ok(r) => {
            let mut failed = (r.status != Nfsstat4::Ok).then(|| format!("{:?}", r.status));
            for op in r.results.clone() {
                match op {
                    Ok(OpRes::Failed { op, status, .. }) => failed = Some(format!("{op:?} {status:?}")),
                    Ok(_) => {}
                    Err(_) => failed = Some("undecodable".into()),
                }
            }
            failed
        }
    };
    match (slot.kind, failure) {
        (Kind::OrphanOpen, Some(why)) => {
            EngineCell::bump(&cell.close_failures);
            log::info!("nfs4.1: CLOSE of an open of an ended session failed: {why}");
        }
        (Kind::OrphanSilly, Some(why)) => {
            log::warn!("nfs4.1: the silly name of an ended session stays: REMOVE failed: {why}");
        }
        _ => {}
    }
    false
}

/// Background slot `slot`'s call ended (answered, failed, abandoned): an orphan it carried is
/// no longer on the wire (the next phase's may go).
pub(super) fn ended(locks: &Locks41, slot: &mut Slot) {
    if let Some(phase) = slot.orphan.take() {
        locks.orphan_ended(phase);
    }
}
