//! The end of a sequence whose object is known (looked up, created, linked, or the node
//! itself): SETATTR it if the request asks, GETATTR it if the reply had no attributes, then the
//! answer as the request's operation wants it (attributes, an entry, an entry and an open
//! handle, an open handle). The operation families that end this way share it.

use super::slot::{Call, Flow, Kind, Slot};
use crate::filesystem::{self, Entry, Opened, Reply};
use crate::nfs::convert::stat;
use crate::nfs::nodes::OpenFile;
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs3::Fattr;
use crate::nfs::wire::Fh;

/// The entry of `fh`, whose attributes are `attr`: a node id the kernel now holds one more
/// reference to.
pub(super) fn entry(fs: &Shared, fh: &Fh, attr: &Fattr) -> filesystem::Result<Entry> {
    let ino = fs.nodes.reference(fh)?;
    let t = fs.cache.timeout();
    Ok(Entry { ino, generation: 0, attr: stat(attr), entry_timeout: t, attr_timeout: t })
}

/// The object of a sequence is known: SETATTR it if asked, fetch missing attributes, or finish.
pub(super) fn after_object(fs: &Shared, slot: &mut Slot, fh: Fh, attr: Option<Fattr>) -> Flow {
    slot.obj = fh;
    if slot.setattr_after {
        slot.setattr_after = false;
        slot.call = Call::SetattrObj;
        return Flow::Next;
    }
    match attr {
        Some(a) => finish(fs, slot, &a),
        None => {
            slot.call = Call::GetattrObj;
            Flow::Next
        }
    }
}

/// The answer of a sequence whose object and attributes are known.
pub(super) fn finish(fs: &Shared, slot: &mut Slot, a: &Fattr) -> Flow {
    let t = fs.cache.timeout();
    let r = match slot.kind {
        Kind::Getattr | Kind::Setattr => Ok(Reply::Attr(stat(a), t)),
        Kind::Open => return open_file(fs, slot),
        Kind::Create => entry(fs, &slot.obj, a).and_then(|e| {
            let file = OpenFile::new(e.ino, slot.flags, false);
            let opened = fs.nodes.opened(e.ino).and_then(|()| match fs.handles.open(file) {
                Ok(fh) => Ok(fh),
                Err(err) => {
                    fs.nodes.closed(e.ino);
                    Err(err)
                }
            });
            match opened {
                Ok(fh) => Ok(Reply::Created(e, Opened { fh, open_flags: fs.cache.file_open_flags() })),
                Err(err) => {
                    fs.nodes.forget(e.ino, 1);
                    Err(err)
                }
            }
        }),
        _ => entry(fs, &slot.obj, a).map(Reply::Entry),
    };
    Flow::Done(r)
}

/// OPEN's answer: a device-side handle.
pub(super) fn open_file(fs: &Shared, slot: &Slot) -> Flow {
    Flow::Done(open_handle(fs, slot.nodeid, slot.flags, false))
}

/// A device-side handle of `nodeid` opened with `flags` (OPEN, OPENDIR).
pub(super) fn open_handle(fs: &Shared, nodeid: u64, flags: u32, dir: bool) -> filesystem::Result<Reply> {
    fs.nodes.opened(nodeid)?;
    let file = OpenFile::new(nodeid, flags, dir);
    match fs.handles.open(file) {
        Ok(fh) => {
            let open_flags = if dir { fs.cache.dir_open_flags() } else { fs.cache.file_open_flags() };
            Ok(Reply::Open(Opened { fh, open_flags }))
        }
        Err(e) => {
            fs.nodes.closed(nodeid);
            Err(e)
        }
    }
}
