//! Opening and closing files: OPEN is an ACCESS call for what the open mode needs (then a
//! SETATTR truncating the file for `O_TRUNC`) and a device-side handle; RELEASE closes the
//! handle, and on the last close commits the file's stored UNSTABLE writes, or removes the silly
//! name of a file unlinked while open.

use super::object::open_file;
use super::slot::{Call, Flow, Kind, Prepared, Slot};
use crate::filesystem::{Error, Reply};
use crate::nfs::convert::{access_bits, open_mask};
use crate::nfs::nodes::silly_name;
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs3::Sattr;

/// OPEN of the request's node with `flags`: ACCESS first.
pub(super) fn open(fs: &Shared, slot: &mut Slot, flags: u32) -> Result<Prepared, Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.flags = flags;
    slot.mask = access_bits(open_mask(flags));
    Ok(Prepared::Send(Kind::Open, Call::Access))
}

/// OPEN's ACCESS call allowed the open: truncate the file if asked, else open it.
pub(super) fn accessed(fs: &Shared, slot: &mut Slot) -> Flow {
    if slot.flags & libc::O_TRUNC as u32 != 0 {
        slot.obj = slot.fh;
        slot.sattr = Sattr { size: Some(0), ..Sattr::default() };
        slot.call = Call::SetattrObj;
        return Flow::Next;
    }
    open_file(fs, slot)
}

/// RELEASE of handle `fh`.
pub(super) fn release(fs: &Shared, slot: &mut Slot, fh: u64) -> Result<Prepared, Error> {
    // Everything goes by the node of the handle closed, not the request's node id
    // (a guest could name another node: its writes would be dropped, or the silly
    // name of the wrong file removed and the right one left on the server). The
    // node's file handle is taken first: the close may free the node.
    let before = fs.handles.get(fh).map(|f| (f.nodeid, fs.nodes.fh(f.nodeid).ok()));
    let Some(f) = fs.handles.close(fh) else { return Ok(Prepared::Answered(Reply::Empty)) };
    let nodeid = f.nodeid;
    slot.nodeid = nodeid;
    if let Some(dir) = fs.nodes.closed(nodeid) {
        // The last close of a file unlinked while open: its data is of no use any
        // more, and its silly name goes.
        fs.unstable.drop_file(nodeid);
        slot.fh = dir;
        slot.names.set(&silly_name(nodeid), b"")?;
        return Ok(Prepared::Send(Kind::Unlink, Call::Remove));
    }
    match before {
        // The last handle of a file with uncommitted writes: commit them.
        Some((n, Some(h))) if n == nodeid && fs.unstable.has(nodeid) && !fs.nodes.has_opens(nodeid) => {
            slot.fh = h;
            Ok(Prepared::Send(Kind::Commit, Call::Commit))
        }
        _ => Ok(Prepared::Answered(Reply::Empty)),
    }
}
