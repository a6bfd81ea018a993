//! The two dispatchers of the engine's state machine: [`prepare`] fills a slot for a new request
//! (the operation family of its opcode copies what the calls need and picks the first call, or
//! answers it at once), and [`reply`] hands a reply to the family of the call it answers, which
//! says what it means for the request ([`Flow`]).

use std::time::Instant;

use super::slot::{Call, Flow, Prepared, Slot};
use super::{attr, commit, dir, io, namespace, open};
use crate::filesystem::seam::Completions;
use crate::filesystem::{Error, Reply};
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs3::{Nfsstat, Res};
use crate::request::{CreateArgs, MknodArgs, Op, ReadArgs, RenameArgs, Request, WriteArgs};

/// Fills `slot` for `req`; `Err` answers it at once, `Ok(Some)` too (with the reply), `Ok(None)`:
/// the slot's call is to be sent.
pub(super) fn prepare(fs: &Shared, slot: &mut Slot, req: &Request<'_>) -> Result<Option<Reply>, Error> {
    slot.begin(req, Instant::now() + fs.timeout);
    let prepared = match req.op {
        Op::Lookup { name } => namespace::lookup(fs, slot, name),
        Op::Getattr { .. } => attr::getattr(fs, slot),
        Op::Setattr(a) => attr::setattr(fs, slot, a),
        Op::Access { mask } => attr::access(fs, slot, mask),
        Op::Readlink => attr::readlink(fs, slot),
        Op::Symlink { name, target } => namespace::symlink(fs, slot, name, target),
        Op::Mknod(MknodArgs { name, mode, rdev, .. }) => namespace::mknod(fs, slot, name, mode, rdev),
        Op::Mkdir { name, mode, .. } => namespace::mkdir(fs, slot, name, mode),
        Op::Create(CreateArgs { name, mode, flags, .. }) => namespace::create(fs, slot, name, mode, flags),
        Op::Unlink { name } => namespace::unlink(fs, slot, name),
        Op::Rmdir { name } => namespace::rmdir(fs, slot, name),
        Op::Rename(RenameArgs { oldname, newdir, newname, flags }) => {
            namespace::rename(fs, slot, oldname, newdir, newname, flags)
        }
        Op::Link { oldnodeid, name } => namespace::link(fs, slot, oldnodeid, name),
        Op::Open { flags, .. } => open::open(fs, slot, flags),
        Op::Opendir { flags } => dir::opendir(fs, slot, flags),
        Op::Read(ReadArgs { fh, offset, size }) => io::read(fs, slot, fh, offset, size),
        Op::Write { args: WriteArgs { fh, offset, size, .. }, .. } => io::write(fs, slot, fh, offset, size),
        Op::Statfs => attr::statfs(fs, slot),
        Op::Flush { .. } | Op::Fsync { .. } => commit::flush(fs, slot),
        Op::Release { fh, .. } => open::release(fs, slot, fh),
        Op::Releasedir { fh, .. } => dir::releasedir(fs, fh),
        Op::Fsyncdir { .. } => dir::fsyncdir(),
        Op::Readdir { fh, offset, size } => dir::readdir(fs, slot, fh, offset, size, false),
        Op::Readdirplus { fh, offset, size } => dir::readdir(fs, slot, fh, offset, size, true),
        // What NFSv3 cannot do: ENOSYS, on which the kernel stops asking and falls back
        // (xattrs: EOPNOTSUPP to the caller; fallocate: EOPNOTSUPP; lseek: computed locally
        // from the size; copy_file_range: a copy through the page cache; O_TMPFILE:
        // EOPNOTSUPP; statx: GETATTR; syncfs: nothing to do per FUSE).
        Op::Setxattr { .. }
        | Op::Getxattr { .. }
        | Op::Listxattr { .. }
        | Op::Removexattr { .. }
        | Op::Fallocate { .. }
        | Op::Lseek { .. }
        | Op::CopyFileRange { .. }
        | Op::Tmpfile { .. }
        | Op::Statx { .. }
        | Op::Syncfs => Err(Error::NotImplemented),
        // The session's own: never here.
        Op::Init(_)
        | Op::Destroy
        | Op::Forget { .. }
        | Op::BatchForget { .. }
        | Op::Interrupt { .. }
        | Op::Lock(_) => Err(Error::InvalidArgument),
    }?;
    match prepared {
        Prepared::Send(kind, call) => {
            slot.kind = kind;
            slot.call = call;
            Ok(None)
        }
        Prepared::Answered(reply) => Ok(Some(reply)),
    }
}

/// What the reply `res` to slot's current call means.
pub(super) fn reply(fs: &Shared, slot: &mut Slot, res: Res<'_>, done: &mut Completions<'_>) -> Flow {
    // The server is busy, whatever the call: the same call again a little later.
    if let Res::Failed { status: Nfsstat::Jukebox, .. } = res {
        return Flow::Later;
    }
    match slot.call {
        Call::LookupName
        | Call::LookupTarget
        | Call::Symlink
        | Call::Mknod
        | Call::CreateFile
        | Call::Mkdir
        | Call::Remove
        | Call::Rmdir
        | Call::Rename
        | Call::Link => namespace::reply(fs, slot, res),
        Call::GetattrObj | Call::SetattrObj | Call::Access | Call::Readlink | Call::Fsstat => {
            attr::reply(fs, slot, res, done)
        }
        Call::Read | Call::Write => io::reply(fs, slot, res),
        Call::Commit | Call::Resend => commit::reply(fs, slot, res),
        Call::Readdir => dir::reply(fs, slot, res, done),
    }
}
