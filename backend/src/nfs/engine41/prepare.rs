//! A new request fills its slot ([`prepare`]): the handles copied from the node table, the
//! names, what to set, the open stateid of the FUSE handle it comes through, and the first
//! COMPOUND to send; or it is answered at once, with no call (OPENDIR, RELEASEDIR, FSYNCDIR,
//! FLUSH and FSYNC of a file with no stored UNSTABLE write, unless the FLUSH's lock owner has
//! locks to let go; an empty READ or WRITE; the READDIR after the end of a listing; a RELEASE
//! of a handle with no open state). Lock requests are `lock`'s; COMMITs first are `commit`'s.

use std::time::Instant;

use super::attr::set_attrs;
use super::slot::{state_bytes, stateid_of, Kind, Make, Slot, Step};
use crate::filesystem::{Error, Opened, Reply};
use crate::nfs::convert::{access_bits, cred, decode_dev};
use crate::nfs::nodes::{silly_name, OpenFile};
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs4::{Ftype4, SetAttrs, SetTime4, Stateid};
use crate::request::{CreateArgs, MknodArgs, Op, ReadArgs, RenameArgs, Request, WriteArgs};

/// What preparing a request came to.
pub(super) enum Prepared {
    /// Send the slot's step.
    Send,
    /// Answered at once.
    Answered(Reply),
}

/// Fills `slot` for `req` (see the module documentation).
pub(super) fn prepare(fs: &Shared, slot: &mut Slot, req: &Request<'_>) -> Result<Prepared, Error> {
    slot.cred = cred(&req.ctx);
    slot.nodeid = req.nodeid;
    slot.deadline = Instant::now() + fs.timeout;
    slot.done = 0;
    slot.sattr = SetAttrs::NONE;
    slot.sattr2 = None;
    slot.exclusive = None;
    slot.stateid = Stateid::ANONYMOUS;
    slot.silly = false;
    slot.answer = None;
    slot.opened = None;
    slot.have_obj = false;
    slot.lock_state = None;
    slot.convert = false;
    slot.frees.clear();
    slot.attempt = None;
    slot.reopened = false;
    slot.unstable = None;
    slot.stable = crate::nfs::wire::nfs4::Stable4::FileSync;
    slot.then = None;
    slot.room_until = None;
    slot.replay = None;
    slot.resend_open = false;
    let (kind, step) = match req.op {
        Op::Lookup { name } => {
            named(fs, slot, name)?;
            (Kind::Lookup, Step::Lookup)
        }
        Op::Getattr { .. } => {
            slot.obj = fs.nodes.fh(slot.nodeid)?;
            (Kind::Getattr, Step::Getattr)
        }
        Op::Setattr(a) => {
            slot.obj = fs.nodes.fh(slot.nodeid)?;
            slot.sattr = set_attrs(a);
            if a.size.is_some() {
                // A size change through a handle goes with that handle's open; else anonymous.
                if let Some((h, f)) =
                    a.fh.and_then(|h| fs.handles.get(h).map(|f| (h, f)))
                        .filter(|(_, f)| f.nodeid == slot.nodeid)
                {
                    if fs.locks41.is_lost(slot.nodeid) {
                        return Err(Error::Io);
                    }
                    slot.stateid = stateid_of(f.state);
                    slot.handle = h;
                }
                // A truncate after stored writes: they are committed first (a replay after it
                // would bring the cut bytes back).
                if super::commit::commit_first(fs, slot, Some(Step::Setattr), true) {
                    return Ok(start(slot, Kind::Setattr, Step::Commit));
                }
            }
            (Kind::Setattr, Step::Setattr)
        }
        Op::Access { mask } => {
            slot.fh = fs.nodes.fh(slot.nodeid)?;
            slot.mask_req = mask;
            slot.mask = if mask == 0 { access_bits(libc::R_OK as u32) } else { access_bits(mask) };
            (Kind::Access, Step::Access)
        }
        Op::Readlink => {
            slot.fh = fs.nodes.fh(slot.nodeid)?;
            (Kind::Readlink, Step::Readlink)
        }
        Op::Statfs => {
            slot.fh = fs.nodes.fh(slot.nodeid)?;
            (Kind::Statfs, Step::Statfs)
        }
        Op::Symlink { name, target } => {
            named(fs, slot, name)?;
            if target.len() > libc::PATH_MAX as usize {
                return Err(Error::NameTooLong);
            }
            slot.long.clear();
            slot.long.extend_from_slice(target);
            slot.make = Make::Symlink;
            (Kind::Make, Step::Create)
        }
        Op::Mknod(MknodArgs { name, mode, rdev, .. }) => {
            named(fs, slot, name)?;
            slot.sattr.mode = Some(mode & 0o7777);
            let (ma, mi) = decode_dev(rdev);
            slot.make = match mode & libc::S_IFMT {
                libc::S_IFREG => {
                    // OPEN(create, GUARDED: EEXIST as mknod(2)) and CLOSE in one COMPOUND.
                    slot.flags = libc::O_WRONLY as u32;
                    slot.owner = open_owner(fs);
                    return Ok(start(slot, Kind::MknodReg, Step::OpenCreate));
                }
                libc::S_IFIFO => Make::Fifo,
                libc::S_IFSOCK => Make::Sock,
                libc::S_IFCHR => Make::Dev(Ftype4::Chr, ma, mi),
                libc::S_IFBLK => Make::Dev(Ftype4::Blk, ma, mi),
                _ => return Err(Error::InvalidArgument),
            };
            (Kind::Make, Step::Create)
        }
        Op::Mkdir { name, mode, .. } => {
            named(fs, slot, name)?;
            slot.sattr.mode = Some(mode & 0o7777);
            slot.make = Make::Dir;
            (Kind::Make, Step::Create)
        }
        Op::Create(CreateArgs { name, mode, flags, .. }) => {
            named(fs, slot, name)?;
            slot.flags = flags;
            slot.owner = open_owner(fs);
            slot.sattr.mode = Some(mode & 0o7777);
            let mut after = SetAttrs::NONE;
            if flags & libc::O_EXCL as u32 != 0 {
                // EXCLUSIVE4_1 (safe across a retransmission); the server may keep the
                // verifier in the times: they are set after it.
                slot.exclusive = Some(fs.create_verf());
                after.atime = SetTime4::ServerTime;
                after.mtime = SetTime4::ServerTime;
            }
            if flags & libc::O_TRUNC as u32 != 0 {
                after.size = Some(0);
            }
            slot.sattr2 = (after != SetAttrs::NONE).then_some(after);
            (Kind::Create, Step::OpenCreate)
        }
        Op::Unlink { name } => {
            named(fs, slot, name)?;
            (Kind::Unlink, Step::Probe)
        }
        Op::Rmdir { name } => {
            named(fs, slot, name)?;
            (Kind::Rmdir, Step::Probe)
        }
        Op::Rename(RenameArgs { oldname, newdir, newname, flags }) => {
            if flags & libc::RENAME_EXCHANGE != 0 {
                return Err(Error::InvalidArgument);
            }
            let (a, b) = fs.nodes.fh2(slot.nodeid, newdir)?;
            slot.fh = a;
            slot.fh2 = b;
            slot.names.set(oldname, newname)?;
            let step = if flags & libc::RENAME_NOREPLACE != 0 { Step::ProbeTarget } else { Step::Rename };
            (Kind::Rename, step)
        }
        Op::Link { oldnodeid, name } => {
            let (dir, file) = fs.nodes.fh2(slot.nodeid, oldnodeid)?;
            slot.fh = dir;
            slot.fh2 = file;
            slot.names.set(name, b"")?;
            (Kind::Link, Step::Link)
        }
        Op::Open { flags, .. } => {
            slot.fh = fs.nodes.fh(slot.nodeid)?;
            slot.flags = flags;
            slot.owner = open_owner(fs);
            if flags & libc::O_TRUNC as u32 != 0 {
                slot.sattr2 = Some(SetAttrs { size: Some(0), ..SetAttrs::NONE });
            }
            (Kind::Open, Step::OpenFh)
        }
        Op::Opendir { flags } => {
            fs.nodes.fh(slot.nodeid)?;
            return open_dir(fs, slot.nodeid, flags).map(Prepared::Answered);
        }
        Op::Releasedir { fh, .. } => {
            if let Some(f) = fs.handles.close(fh) {
                let _ = fs.nodes.closed(f.nodeid);
            }
            return Ok(Prepared::Answered(Reply::Empty));
        }
        // Directory operations are synchronous on the server.
        Op::Fsyncdir { .. } => return Ok(Prepared::Answered(Reply::Empty)),
        // The file's stored UNSTABLE writes are committed (close-to-open: a FLUSH at every
        // close), and a FLUSH's lock owner's locks go.
        Op::Fsync { .. } => {
            slot.obj = fs.nodes.fh(slot.nodeid)?;
            let commit = super::commit::commit_first(fs, slot, None, false);
            return Ok(if commit {
                start(slot, Kind::Commit, Step::Commit)
            } else {
                Prepared::Answered(Reply::Empty)
            });
        }
        Op::Flush { lock_owner, .. } => {
            let frees = super::lock::flush(fs, slot, lock_owner).is_some();
            let obj = fs.nodes.fh(slot.nodeid)?;
            slot.obj = obj;
            let then = frees.then_some(Step::Free);
            if super::commit::commit_first(fs, slot, then, false) {
                let kind = if frees { Kind::Flush } else { Kind::Commit };
                return Ok(start(slot, kind, Step::Commit));
            }
            return Ok(if frees { Prepared::Send } else { Prepared::Answered(Reply::Empty) });
        }
        Op::Lock(l) => {
            return Ok(match super::lock::prepare(fs, slot, &l)? {
                Some(r) => Prepared::Answered(r),
                None => Prepared::Send,
            });
        }
        Op::Read(ReadArgs { fh, offset, size }) => {
            io(fs, slot, fh, offset)?;
            let size = u32::try_from(u64::MAX - offset).map_or(size, |room| size.min(room));
            slot.size = size;
            if size == 0 {
                return Ok(Prepared::Answered(Reply::Data(0)));
            }
            slot.chunk = size.min(fs.limits.read);
            (Kind::Read, Step::Read)
        }
        Op::Write { args: WriteArgs { fh, offset, size, .. }, .. } => {
            io(fs, slot, fh, offset)?;
            if offset.checked_add(u64::from(size)).is_none_or(|end| end > fs.limits.max_file) {
                return Err(Error::FileTooLarge);
            }
            slot.size = size;
            if size == 0 {
                return Ok(Prepared::Answered(Reply::Written(0)));
            }
            slot.chunk = size.min(fs.limits.write);
            (Kind::Write, Step::Write)
        }
        Op::Readdir { fh, offset, size } => return readdir(fs, slot, fh, offset, size, false),
        Op::Readdirplus { fh, offset, size } => return readdir(fs, slot, fh, offset, size, true),
        Op::Release { fh, lock_owner, .. } => return release(fs, slot, fh, lock_owner),
        // xattrs (ganesha answers RFC 8276's operations OP_ILLEGAL at minor version 1) and
        // what NFSv3 could not do either: ENOSYS, on which the kernel stops asking.
        Op::Setxattr { .. }
        | Op::Getxattr { .. }
        | Op::Listxattr { .. }
        | Op::Removexattr { .. }
        | Op::Fallocate { .. }
        | Op::Lseek { .. }
        | Op::CopyFileRange { .. }
        | Op::Tmpfile { .. }
        | Op::Statx { .. }
        | Op::Syncfs => return Err(Error::NotImplemented),
        // The session's own: never here.
        Op::Init(_) | Op::Destroy | Op::Forget { .. } | Op::BatchForget { .. } | Op::Interrupt { .. } => {
            return Err(Error::InvalidArgument)
        }
    };
    Ok(start(slot, kind, step))
}

fn start(slot: &mut Slot, kind: Kind, step: Step) -> Prepared {
    slot.kind = kind;
    slot.step = step;
    Prepared::Send
}

/// A name operation in the request's directory: its handle and the name.
fn named(fs: &Shared, slot: &mut Slot, name: &[u8]) -> Result<(), Error> {
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.names.set(name, b"")
}

/// An open owner of its own for each OPEN: each FUSE handle is then an open of its own on the
/// server, with its own stateid, which its RELEASE closes (no OPEN_DOWNGRADE bookkeeping).
pub(super) fn open_owner(fs: &Shared) -> [u8; 8] {
    fs.v41.as_ref().map_or(0, |v| v.next_owner()).to_be_bytes()
}

/// READ or WRITE through handle `fh`: a file handle of the request's node.
fn io(fs: &Shared, slot: &mut Slot, fh: u64, offset: u64) -> Result<(), Error> {
    let f = fs.handles.get(fh).filter(|f| f.nodeid == slot.nodeid && !f.dir).ok_or(Error::BadHandle)?;
    if fs.locks41.is_lost(slot.nodeid) {
        // Its locks are gone from the server (not reclaimed): nothing goes without them.
        return Err(Error::Io);
    }
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.stateid = stateid_of(f.state);
    slot.handle = fh;
    slot.offset = offset;
    Ok(())
}

/// OPENDIR: a device-side handle (NFSv4 opens no directories).
fn open_dir(fs: &Shared, nodeid: u64, flags: u32) -> Result<Reply, Error> {
    fs.nodes.opened(nodeid)?;
    let file = OpenFile::new(nodeid, flags, true);
    match fs.handles.open(file) {
        Ok(fh) => Ok(Reply::Open(Opened { fh, open_flags: fs.cache.dir_open_flags() })),
        Err(e) => {
            fs.nodes.closed(nodeid);
            Err(e)
        }
    }
}

/// READDIR(PLUS) of `size` bytes from FUSE offset `offset` through handle `fh`. NFSv4 lists
/// no `.` and `..` and keeps cookies 1 and 2 for them (RFC 8881 18.23.3): they are made here,
/// at offsets 1 and 2, and offset 2 lists from the server's cookie 0.
fn readdir(
    fs: &Shared,
    slot: &mut Slot,
    fh: u64,
    offset: u64,
    size: u32,
    plus: bool,
) -> Result<Prepared, Error> {
    let f = fs.handles.get(fh).filter(|f| f.dir && f.nodeid == slot.nodeid).ok_or(Error::BadHandle)?;
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.handle = fh;
    slot.offset = offset;
    if offset != 0 && offset == f.eof_at {
        // The last listing reached the end here: nothing more.
        return Ok(Prepared::Answered(Reply::Data(0)));
    }
    slot.dots = match offset {
        0 => 2,
        1 => 1,
        _ => 0,
    };
    slot.cookie = if offset <= 2 { 0 } else { offset };
    slot.cookieverf = if offset <= 2 { [0; 8] } else { f.cookieverf };
    let max = fs.limits.read.max(fs.limits.write);
    slot.size = size.clamp(512, max);
    // Entries with handles and attributes take about three times a FUSE entry's room.
    slot.chunk = slot.size.saturating_mul(3).clamp(8192, max);
    let kind = if plus { Kind::Readdirplus } else { Kind::Readdir };
    Ok(start(slot, kind, Step::Readdir))
}

/// RELEASE of handle `fh`: CLOSE of its open, then the silly name's REMOVE at the last close of a
/// file unlinked while open (a COMPOUND of its own: it goes whatever the CLOSE came to), after
/// the lock states that go with it (`lock`).
fn release(fs: &Shared, slot: &mut Slot, fh: u64, lock_owner: u64) -> Result<Prepared, Error> {
    // The node's handle first: the close may free the node.
    let file_fh = fs.handles.get(fh).and_then(|f| fs.nodes.fh(f.nodeid).ok());
    let Some(f) = fs.handles.close(fh) else { return Ok(Prepared::Answered(Reply::Empty)) };
    slot.nodeid = f.nodeid;
    slot.stateid = stateid_of(f.state);
    let has_fh = file_fh.is_some();
    if let Some(obj) = file_fh {
        slot.obj = obj;
    } else {
        slot.stateid = Stateid::ANONYMOUS;
    }
    if let Some(dir) = fs.nodes.closed(f.nodeid) {
        // The last close of a file unlinked while open: its stored writes are of no use.
        fs.unstable.drop_file(f.nodeid);
        slot.fh = dir;
        slot.names.set(&silly_name(f.nodeid), b"")?;
        slot.silly = true;
    }
    if !fs.nodes.has_opens(f.nodeid) {
        // Its last handle: a mark of locks the server lost goes with it, and so do its stored
        // writes (their FLUSH or FSYNC was EIO: sent again now, they would go without the
        // lock the guest wrote them under).
        if fs.locks41.is_lost(f.nodeid) {
            fs.unstable.drop_file(f.nodeid);
        }
        fs.locks41.found(f.nodeid);
    }
    if has_fh {
        super::lock::release(fs, slot, f.nodeid, fh, lock_owner);
    }
    let step = if slot.frees.is_empty() { slot.release_step() } else { Some(Step::Free) };
    // The file's last handle with stored writes: they are committed before its CLOSE.
    let last = has_fh && !fs.nodes.has_opens(f.nodeid);
    let step =
        if last && super::commit::commit_first(fs, slot, step, false) { Some(Step::Commit) } else { step };
    match step {
        Some(step) => Ok(start(slot, Kind::Release, step)),
        None => Ok(Prepared::Answered(Reply::Empty)),
    }
}

/// The handle table's form of an open stateid (for the reply side).
pub(super) fn kept_state(s: Stateid) -> [u8; 16] {
    state_bytes(s)
}
