//! The namespace family: LOOKUP, the creating operations (CREATE, MKDIR, MKNOD, SYMLINK, LINK)
//! and the removing and renaming ones (UNLINK, RMDIR, RENAME). A name operation may take more
//! than one call: a LOOKUP after a CREATE whose reply lacks the handle, a LOOKUP before a
//! `RENAME_NOREPLACE` (NFSv3 has no such flag), a LOOKUP before an UNLINK while files are open
//! (an open file is renamed to its silly name instead, as Linux's NFS client does).

use super::object::after_object;
use super::slot::{unexpected, Call, Flow, Kind, Prepared, Slot, NAME_MAX};
use crate::filesystem::{Error, Reply};
use crate::nfs::convert::{decode_dev, nfs_error};
use crate::nfs::nodes::silly_name;
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs3::{Ftype, Nfsstat, Res, Sattr, SetTime as NfsSetTime};

/// LOOKUP of `name` in the request's directory.
pub(super) fn lookup(fs: &Shared, slot: &mut Slot, name: &[u8]) -> Result<Prepared, Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.names.set(name, b"")?;
    Ok(Prepared::Send(Kind::Lookup, Call::LookupName))
}

/// SYMLINK `name` to `target` in the request's directory.
pub(super) fn symlink(fs: &Shared, slot: &mut Slot, name: &[u8], target: &[u8]) -> Result<Prepared, Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.names.set(name, b"")?;
    if target.len() > libc::PATH_MAX as usize {
        return Err(Error::NameTooLong);
    }
    slot.long.clear();
    slot.long.extend_from_slice(target);
    Ok(Prepared::Send(Kind::Symlink, Call::Symlink))
}

/// MKNOD `name` with `mode` (and device number `rdev`) in the request's directory.
pub(super) fn mknod(
    fs: &Shared,
    slot: &mut Slot,
    name: &[u8],
    mode: u32,
    rdev: u32,
) -> Result<Prepared, Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.names.set(name, b"")?;
    slot.sattr.mode = Some(mode & 0o7777);
    let ftype = match mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFIFO => Some(Ftype::Fifo),
        libc::S_IFSOCK => Some(Ftype::Sock),
        libc::S_IFCHR => Some(Ftype::Chr),
        libc::S_IFBLK => Some(Ftype::Blk),
        _ => return Err(Error::InvalidArgument),
    };
    match ftype {
        Some(t) => {
            slot.mknod = (t, decode_dev(rdev));
            Ok(Prepared::Send(Kind::Mknod, Call::Mknod))
        }
        // A regular file: CREATE, failing if it exists as mknod(2) does.
        None => {
            slot.flags = libc::O_EXCL as u32;
            Ok(Prepared::Send(Kind::Mknod, Call::CreateFile))
        }
    }
}

/// MKDIR `name` with `mode` in the request's directory.
pub(super) fn mkdir(fs: &Shared, slot: &mut Slot, name: &[u8], mode: u32) -> Result<Prepared, Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.names.set(name, b"")?;
    slot.sattr.mode = Some(mode & 0o7777);
    Ok(Prepared::Send(Kind::Mkdir, Call::Mkdir))
}

/// CREATE (and open) `name` with `mode` and open `flags` in the request's directory.
pub(super) fn create(
    fs: &Shared,
    slot: &mut Slot,
    name: &[u8],
    mode: u32,
    flags: u32,
) -> Result<Prepared, Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.names.set(name, b"")?;
    slot.flags = flags;
    slot.sattr.mode = Some(mode & 0o7777);
    if flags & libc::O_EXCL as u32 != 0 {
        // EXCLUSIVE (safe across retransmission), then SETATTR: the verifier
        // occupies the times until then.
        slot.exclusive = Some(fs.create_verf());
        slot.sattr.atime = NfsSetTime::ServerTime;
        slot.sattr.mtime = NfsSetTime::ServerTime;
    }
    Ok(Prepared::Send(Kind::Create, Call::CreateFile))
}

/// UNLINK `name` from the request's directory.
pub(super) fn unlink(fs: &Shared, slot: &mut Slot, name: &[u8]) -> Result<Prepared, Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.names.set(name, b"")?;
    // A file still open somewhere is renamed, not removed: LOOKUP first to know.
    let call = if fs.nodes.any_open() { Call::LookupName } else { Call::Remove };
    Ok(Prepared::Send(Kind::Unlink, call))
}

/// RMDIR `name` from the request's directory.
pub(super) fn rmdir(fs: &Shared, slot: &mut Slot, name: &[u8]) -> Result<Prepared, Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.names.set(name, b"")?;
    Ok(Prepared::Send(Kind::Rmdir, Call::Rmdir))
}

/// RENAME `oldname` in the request's directory to `newname` in `newdir` (`flags`: FUSE's).
pub(super) fn rename(
    fs: &Shared,
    slot: &mut Slot,
    oldname: &[u8],
    newdir: u64,
    newname: &[u8],
    flags: u32,
) -> Result<Prepared, Error> {
    if flags & libc::RENAME_EXCHANGE != 0 {
        // NFSv3 has no atomic exchange.
        return Err(Error::InvalidArgument);
    }
    let (a, b) = fs.nodes.fh2(slot.nodeid, newdir)?;
    slot.fh = a;
    slot.fh2 = b;
    slot.names.set(oldname, newname)?;
    let call = if flags & libc::RENAME_NOREPLACE != 0 { Call::LookupTarget } else { Call::Rename };
    Ok(Prepared::Send(Kind::Rename, call))
}

/// LINK node `oldnodeid` as `name` in the request's directory.
pub(super) fn link(fs: &Shared, slot: &mut Slot, oldnodeid: u64, name: &[u8]) -> Result<Prepared, Error> {
    let (dir, obj) = fs.nodes.fh2(slot.nodeid, oldnodeid)?;
    slot.fh = dir;
    slot.fh2 = obj;
    slot.names.set(name, b"")?;
    Ok(Prepared::Send(Kind::Link, Call::Link))
}

/// What the reply `res` to a name call (LOOKUP, the creating calls, REMOVE, RMDIR, RENAME,
/// LINK) means.
pub(super) fn reply(fs: &Shared, slot: &mut Slot, res: Res<'_>) -> Flow {
    match (slot.call, res) {
        // Failures first: a few are steps of a sequence, not errors.
        (Call::LookupTarget, Res::Failed { status: Nfsstat::NoEnt, .. }) => {
            slot.call = Call::Rename;
            Flow::Next
        }
        (Call::CreateFile, Res::Failed { status: Nfsstat::Exist, .. })
            if slot.exclusive.is_none() && slot.kind == Kind::Create =>
        {
            // Created meanwhile by someone else: open it (truncated if asked).
            slot.setattr_after = slot.flags & libc::O_TRUNC as u32 != 0;
            slot.sattr = Sattr { size: Some(0), ..Sattr::default() };
            slot.call = Call::LookupName;
            Flow::Next
        }
        (_, Res::Failed { status, .. }) => Flow::Done(Err(nfs_error(status))),
        (Call::LookupName, Res::Lookup { fh, .. }) if slot.kind == Kind::Unlink => {
            match fs.nodes.open_node(&fh) {
                // Open: renamed to its silly name until the last close (as Linux's NFS client).
                Some(n) => {
                    slot.handle = n;
                    slot.fh2 = slot.fh;
                    let a = slot.names.a;
                    let mut old = [0u8; NAME_MAX];
                    old[..a].copy_from_slice(slot.names.a());
                    if slot.names.set(&old[..a], &silly_name(n)).is_err() {
                        return Flow::Done(Err(Error::NameTooLong));
                    }
                    slot.call = Call::Rename;
                }
                None => slot.call = Call::Remove,
            }
            Flow::Next
        }
        (Call::LookupName, Res::Lookup { fh, attr, .. }) => after_object(fs, slot, fh, attr),
        (Call::LookupTarget, Res::Lookup { .. }) => Flow::Done(Err(Error::Exists)),
        (Call::Symlink | Call::Mknod | Call::CreateFile | Call::Mkdir, Res::Created { fh, attr, .. }) => {
            if slot.exclusive.is_some() {
                // The verifier is in the times: set the mode and real times now.
                slot.setattr_after = true;
            }
            match fh {
                Some(fh) => after_object(fs, slot, fh, attr),
                None => {
                    slot.call = Call::LookupName;
                    Flow::Next
                }
            }
        }
        (Call::Rename, Res::Changed { .. }) if slot.kind == Kind::Unlink => {
            if fs.nodes.set_silly(slot.handle, slot.fh) {
                // The last RELEASE ran meanwhile (not removed here yet on NFSv3).
                log::warn!(
                    "nfs: node {} closed while renamed to its silly name: the name stays",
                    slot.handle
                );
            }
            Flow::Done(Ok(Reply::Empty))
        }
        (Call::Remove | Call::Rmdir | Call::Rename, Res::Changed { .. }) => Flow::Done(Ok(Reply::Empty)),
        (Call::Link, Res::Changed { attr }) => {
            let fh = slot.fh2;
            after_object(fs, slot, fh, attr)
        }
        (call, _) => unexpected(call),
    }
}
