//! The attributes family: GETATTR, SETATTR, ACCESS, READLINK and STATFS, one call each (a
//! SETATTR whose reply lacks the attributes asks GETATTR after it; a truncating SETATTR of a
//! file with stored UNSTABLE writes commits them first). The GETATTR and SETATTR calls of
//! other families' sequences (after a CREATE, an `O_TRUNC` open) end here too.

use super::object::finish;
use super::open;
use super::slot::{unexpected, Call, Flow, Kind, Prepared, Slot, NAME_MAX};
use crate::filesystem::seam::Completions;
use crate::filesystem::{Error, Reply, SetAttr, StatFs};
use crate::nfs::convert::{access_bits, access_ok, nfs_error, sattr};
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs3::{access as access3, Res};

/// GETATTR of the request's node.
pub(super) fn getattr(fs: &Shared, slot: &mut Slot) -> Result<Prepared, Error> {
    slot.obj = fs.nodes.fh(slot.nodeid)?;
    Ok(Prepared::Send(Kind::Getattr, Call::GetattrObj))
}

/// SETATTR of the request's node with `a`.
pub(super) fn setattr(fs: &Shared, slot: &mut Slot, a: &SetAttr) -> Result<Prepared, Error> {
    slot.obj = fs.nodes.fh(slot.nodeid)?;
    slot.fh = slot.obj;
    slot.sattr = sattr(a);
    if a.size.is_some() && fs.unstable.has_answered(slot.nodeid) {
        // A truncate after stored writes: commit them first (a replay after it
        // would bring the cut data back).
        slot.then = Some(Call::SetattrObj);
        Ok(Prepared::Send(Kind::Setattr, Call::Commit))
    } else {
        Ok(Prepared::Send(Kind::Setattr, Call::SetattrObj))
    }
}

/// ACCESS of the request's node for FUSE's `mask`.
pub(super) fn access(fs: &Shared, slot: &mut Slot, mask: u32) -> Result<Prepared, Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    // F_OK (0): the node exists if the server answers for its handle.
    slot.mask_req = mask;
    slot.mask = if mask == 0 { access3::READ } else { access_bits(mask) };
    Ok(Prepared::Send(Kind::Access, Call::Access))
}

/// READLINK of the request's node.
pub(super) fn readlink(fs: &Shared, slot: &mut Slot) -> Result<Prepared, Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    Ok(Prepared::Send(Kind::Readlink, Call::Readlink))
}

/// STATFS of the filesystem the request's node is on.
pub(super) fn statfs(fs: &Shared, slot: &mut Slot) -> Result<Prepared, Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    Ok(Prepared::Send(Kind::Statfs, Call::Fsstat))
}

/// What the reply `res` to a GETATTR, SETATTR, ACCESS, READLINK or FSSTAT call means
/// (READLINK's target goes into the request's reply buffers, from `done`).
pub(super) fn reply(fs: &Shared, slot: &mut Slot, res: Res<'_>, done: &mut Completions<'_>) -> Flow {
    match (slot.call, res) {
        (_, Res::Failed { status, .. }) => Flow::Done(Err(nfs_error(status))),
        (Call::GetattrObj, Res::Attr(a)) => finish(fs, slot, &a),
        (Call::SetattrObj, Res::Setattr { attr }) => match attr {
            Some(a) => finish(fs, slot, &a),
            None => {
                slot.call = Call::GetattrObj;
                Flow::Next
            }
        },
        (Call::Access, Res::Access { access, .. }) => {
            if !access_ok(slot.mask_fuse(), access) {
                return Flow::Done(Err(Error::AccessDenied));
            }
            if slot.kind != Kind::Open {
                return Flow::Done(Ok(Reply::Empty));
            }
            open::accessed(fs, slot)
        }
        (Call::Readlink, Res::Readlink { target, .. }) => {
            let Some(mut w) = done.data(slot.token) else { return Flow::Done(Err(Error::Io)) };
            if target.len() > w.available() {
                return Flow::Done(Err(Error::NameTooLong));
            }
            match w.write_all(target) {
                Ok(()) => Flow::Done(Ok(Reply::Data(target.len()))),
                Err(e) => Flow::Done(Err(e.into())),
            }
        }
        (Call::Fsstat, Res::Fsstat { tbytes, fbytes, abytes, tfiles, ffiles, .. }) => {
            const B: u64 = 4096;
            Flow::Done(Ok(Reply::StatFs(StatFs {
                blocks: tbytes / B,
                bfree: fbytes / B,
                bavail: abytes / B,
                files: tfiles,
                ffree: ffiles,
                bsize: B as u32,
                namelen: NAME_MAX as u32,
                frsize: B as u32,
            })))
        }
        (call, _) => unexpected(call),
    }
}
