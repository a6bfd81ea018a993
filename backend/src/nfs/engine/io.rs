//! The I/O family: READ and WRITE, each cut into calls of the server's transfer size at most
//! (the slot's `chunk`) and going on from the reply of one call to the next. A WRITE's data is
//! sent from the request's held payload; whether it goes UNSTABLE (into the replay store) is
//! decided when each call is sent (`sink::send`), not here.

use super::slot::{unexpected, Call, Flow, Kind, Prepared, Slot};
use crate::filesystem::{Error, Reply};
use crate::nfs::convert::nfs_error;
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs3::{Res, Stable};

/// Sets a READ/WRITE slot's next chunk.
pub(super) fn set_chunk(slot: &mut Slot, max: u32) {
    slot.chunk = (slot.size - slot.done).min(max);
}

/// `fh` must be an open handle of `nodeid` (not a directory).
fn check_handle(fs: &Shared, fh: u64, nodeid: u64) -> Result<(), Error> {
    match fs.handles.get(fh) {
        Some(f) if f.nodeid == nodeid && !f.dir => Ok(()),
        _ => Err(Error::BadHandle),
    }
}

/// READ of `size` bytes at `offset` through handle `fh`.
pub(super) fn read(fs: &Shared, slot: &mut Slot, fh: u64, offset: u64, size: u32) -> Result<Prepared, Error> {
    check_handle(fs, fh, slot.nodeid)?;
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.offset = offset;
    // Cut at the end of the offset space: no call's offset (`offset` plus what came
    // so far) can overflow, however few bytes the server gives per call.
    let size = u32::try_from(u64::MAX - offset).map_or(size, |room| size.min(room));
    slot.size = size;
    if size == 0 {
        return Ok(Prepared::Answered(Reply::Data(0)));
    }
    set_chunk(slot, fs.limits.read);
    Ok(Prepared::Send(Kind::Read, Call::Read))
}

/// WRITE of `size` bytes at `offset` through handle `fh` (the data is the request's payload).
pub(super) fn write(
    fs: &Shared,
    slot: &mut Slot,
    fh: u64,
    offset: u64,
    size: u32,
) -> Result<Prepared, Error> {
    check_handle(fs, fh, slot.nodeid)?;
    if offset.checked_add(u64::from(size)).is_none_or(|end| end > fs.limits.max_file) {
        return Err(Error::FileTooLarge);
    }
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.offset = offset;
    slot.size = size;
    if size == 0 {
        return Ok(Prepared::Answered(Reply::Written(0)));
    }
    set_chunk(slot, fs.limits.write);
    Ok(Prepared::Send(Kind::Write, Call::Write))
}

/// What the reply `res` to a READ or WRITE call means.
pub(super) fn reply(fs: &Shared, slot: &mut Slot, res: Res<'_>) -> Flow {
    match (slot.call, res) {
        (_, Res::Failed { status, .. }) => Flow::Done(Err(nfs_error(status))),
        (Call::Read, Res::Read { count, eof, .. }) => {
            let count = count.min(slot.chunk);
            slot.done += count;
            if eof || count == 0 || slot.done >= slot.size {
                Flow::Done(Ok(Reply::Data(slot.done as usize)))
            } else {
                set_chunk(slot, fs.limits.read);
                Flow::Next
            }
        }
        (Call::Write, Res::Write { count, committed, verf, .. }) => {
            if let Some(id) = slot.unstable.take() {
                fs.unstable.written(id, verf, committed == Stable::FileSync && count == slot.chunk);
            }
            let count = count.min(slot.chunk);
            if count == 0 {
                return Flow::Done(Err(Error::Io));
            }
            slot.done += count;
            if slot.done >= slot.size {
                Flow::Done(Ok(Reply::Written(slot.done as usize)))
            } else {
                set_chunk(slot, fs.limits.write);
                Flow::Next
            }
        }
        (call, _) => unexpected(call),
    }
}
