//! The synchronous dispatcher: one method per operation, each calling the [`FileSystem`] method
//! for a decoded [`Op`] and returning the typed [`Reply`] (virtiofsd's `server.rs` shape, with
//! decoding and encoding taken out: [`crate::request`] before, [`super::reply`] after).
//!
//! Operations whose reply carries data (READ, READLINK, READDIR, READDIRPLUS, GETXATTR,
//! LISTXATTR) write it into `data`, the data part of the reply buffers, and answer
//! [`Reply::Data`] with the byte count: a READ goes straight from the filesystem into the guest's
//! buffers.

use super::reply::check_fits;
use super::{Result, Server};
use crate::abi;
use crate::filesystem::dirent::add_dirent;
use crate::filesystem::{self, Context, FileSystem, Reply, SetAttr, SetxattrArgs, XattrReply};
use crate::io::{Reader, Writer};
use crate::request::Op;

type FsResult<T> = filesystem::Result<T>;

/// The synchronous dispatcher over filesystem `F`.
pub(crate) struct Dispatch<'f, F>(pub(crate) &'f F);

impl<F: FileSystem> Dispatch<'_, F> {
    /// Serves `op` through the synchronous [`FileSystem`] methods. Session operations (INIT,
    /// DESTROY, FORGET, INTERRUPT, locks) are the server's own and never come here
    /// (`EINVAL`); nor do the locks a RELEASE or FLUSH ends ([`Server::after`]).
    pub(crate) fn call(
        &self,
        ctx: &Context,
        ino: u64,
        op: &mut Op<'_>,
        data: &mut Writer<'_>,
    ) -> FsResult<Reply> {
        match op {
            Op::Lookup { name } => self.lookup(ctx, ino, name),
            Op::Getattr { fh } => self.getattr(ctx, ino, *fh),
            Op::Setattr(set) => self.setattr(ctx, ino, set),
            Op::Readlink => self.readlink(ctx, ino, data),
            Op::Symlink { name, target } => self.symlink(ctx, ino, name, target),
            Op::Mknod(args) => Ok(Reply::Entry(self.0.mknod(ctx, ino, args)?)),
            Op::Mkdir { name, mode, umask } => self.mkdir(ctx, ino, name, *mode, *umask),
            Op::Unlink { name } => self.unlink(ctx, ino, name),
            Op::Rmdir { name } => self.rmdir(ctx, ino, name),
            Op::Rename(args) => self.0.rename(ctx, ino, args).map(|()| Reply::Empty),
            Op::Link { oldnodeid, name } => self.link(ctx, *oldnodeid, ino, name),
            Op::Open { flags, kill_priv } => self.open(ctx, ino, *flags, *kill_priv),
            Op::Opendir { flags } => self.opendir(ctx, ino, *flags),
            Op::Read(args) => Ok(Reply::Data(self.0.read(ctx, ino, args, data)?)),
            Op::Write { args, data: payload } => Ok(Reply::Written(self.0.write(ctx, ino, args, payload)?)),
            Op::Statfs => self.statfs(ctx, ino),
            Op::Release { fh, flags, lock_owner, .. } => self.release(ctx, ino, *fh, *flags, *lock_owner),
            Op::Releasedir { fh, flags } => self.releasedir(ctx, ino, *fh, *flags),
            Op::Fsync { fh, datasync } => self.fsync(ctx, ino, *fh, *datasync),
            Op::Fsyncdir { fh, datasync } => self.fsyncdir(ctx, ino, *fh, *datasync),
            Op::Flush { fh, lock_owner } => self.flush(ctx, ino, *fh, *lock_owner),
            Op::Readdir { fh, offset, .. } => self.readdir(ctx, ino, *fh, *offset, data),
            Op::Readdirplus { fh, offset, .. } => self.readdirplus(ctx, ino, *fh, *offset, data),
            Op::Access { mask } => self.access(ctx, ino, *mask),
            Op::Create(args) => {
                let (entry, opened) = self.0.create(ctx, ino, args)?;
                Ok(Reply::Created(entry, opened))
            }
            Op::Tmpfile { mode, flags, umask } => self.tmpfile(ctx, ino, *mode, *flags, *umask),
            Op::Fallocate(args) => self.0.fallocate(ctx, ino, args).map(|()| Reply::Empty),
            Op::Setxattr { args, value } => self.setxattr(ctx, ino, args, value),
            Op::Getxattr { name, size } => self.getxattr(ctx, ino, name, *size, data),
            Op::Listxattr { size } => self.listxattr(ctx, ino, *size, data),
            Op::Removexattr { name } => self.removexattr(ctx, ino, name),
            Op::Lseek { fh, offset, whence } => self.lseek(ctx, ino, *fh, *offset, *whence),
            Op::CopyFileRange(args) => Ok(Reply::Written(self.0.copy_file_range(ctx, ino, args)?)),
            Op::Syncfs => self.syncfs(ctx, ino),
            Op::Statx { fh } => self.statx(ctx, ino, *fh),
            Op::Init(_)
            | Op::Destroy
            | Op::Forget { .. }
            | Op::BatchForget { .. }
            | Op::Interrupt { .. }
            | Op::Lock(_) => Err(filesystem::Error::InvalidArgument),
        }
    }

    fn lookup(&self, ctx: &Context, ino: u64, name: &[u8]) -> FsResult<Reply> {
        Ok(Reply::Entry(self.0.lookup(ctx, ino, name)?))
    }

    fn getattr(&self, ctx: &Context, ino: u64, fh: Option<u64>) -> FsResult<Reply> {
        let (attr, valid) = self.0.getattr(ctx, ino, fh)?;
        Ok(Reply::Attr(attr, valid))
    }

    fn setattr(&self, ctx: &Context, ino: u64, set: &SetAttr) -> FsResult<Reply> {
        let (attr, valid) = self.0.setattr(ctx, ino, set)?;
        Ok(Reply::Attr(attr, valid))
    }

    fn readlink(&self, ctx: &Context, ino: u64, data: &mut Writer<'_>) -> FsResult<Reply> {
        let target = self.0.readlink(ctx, ino)?;
        data.write_all(&target)?;
        Ok(Reply::Data(target.len()))
    }

    fn symlink(&self, ctx: &Context, parent: u64, name: &[u8], target: &[u8]) -> FsResult<Reply> {
        Ok(Reply::Entry(self.0.symlink(ctx, parent, name, target)?))
    }

    fn mkdir(&self, ctx: &Context, parent: u64, name: &[u8], mode: u32, umask: u32) -> FsResult<Reply> {
        Ok(Reply::Entry(self.0.mkdir(ctx, parent, name, mode, umask)?))
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &[u8]) -> FsResult<Reply> {
        self.0.unlink(ctx, parent, name)?;
        Ok(Reply::Empty)
    }

    fn rmdir(&self, ctx: &Context, parent: u64, name: &[u8]) -> FsResult<Reply> {
        self.0.rmdir(ctx, parent, name)?;
        Ok(Reply::Empty)
    }

    fn link(&self, ctx: &Context, ino: u64, newparent: u64, name: &[u8]) -> FsResult<Reply> {
        Ok(Reply::Entry(self.0.link(ctx, ino, newparent, name)?))
    }

    fn open(&self, ctx: &Context, ino: u64, flags: u32, kill_priv: bool) -> FsResult<Reply> {
        Ok(Reply::Open(self.0.open(ctx, ino, flags, kill_priv)?))
    }

    fn opendir(&self, ctx: &Context, ino: u64, flags: u32) -> FsResult<Reply> {
        Ok(Reply::Open(self.0.opendir(ctx, ino, flags)?))
    }

    fn statfs(&self, ctx: &Context, ino: u64) -> FsResult<Reply> {
        Ok(Reply::StatFs(self.0.statfs(ctx, ino)?))
    }

    fn release(&self, ctx: &Context, ino: u64, fh: u64, flags: u32, lock_owner: u64) -> FsResult<Reply> {
        // The locks it ends are the server's ([`Server::after`]).
        self.0.release(ctx, ino, fh, flags, lock_owner)?;
        Ok(Reply::Empty)
    }

    fn releasedir(&self, ctx: &Context, ino: u64, fh: u64, flags: u32) -> FsResult<Reply> {
        self.0.releasedir(ctx, ino, fh, flags)?;
        Ok(Reply::Empty)
    }

    fn fsync(&self, ctx: &Context, ino: u64, fh: u64, datasync: bool) -> FsResult<Reply> {
        self.0.fsync(ctx, ino, fh, datasync)?;
        Ok(Reply::Empty)
    }

    fn fsyncdir(&self, ctx: &Context, ino: u64, fh: u64, datasync: bool) -> FsResult<Reply> {
        self.0.fsyncdir(ctx, ino, fh, datasync)?;
        Ok(Reply::Empty)
    }

    fn flush(&self, ctx: &Context, ino: u64, fh: u64, lock_owner: u64) -> FsResult<Reply> {
        // The locks it ends are the server's ([`Server::after`]).
        self.0.flush(ctx, ino, fh, lock_owner)?;
        Ok(Reply::Empty)
    }

    fn readdir(
        &self,
        ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &mut Writer<'_>,
    ) -> FsResult<Reply> {
        self.0.readdir(ctx, ino, fh, offset, &mut |e| add_dirent(data, &e, None))?;
        Ok(Reply::Data(data.bytes_written()))
    }

    fn readdirplus(
        &self,
        ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &mut Writer<'_>,
    ) -> FsResult<Reply> {
        self.0.readdirplus(ctx, ino, fh, offset, &mut |e, entry| add_dirent(data, &e, Some(entry)))?;
        Ok(Reply::Data(data.bytes_written()))
    }

    fn access(&self, ctx: &Context, ino: u64, mask: u32) -> FsResult<Reply> {
        self.0.access(ctx, ino, mask)?;
        Ok(Reply::Empty)
    }

    fn tmpfile(&self, ctx: &Context, parent: u64, mode: u32, flags: u32, umask: u32) -> FsResult<Reply> {
        let (entry, opened) = self.0.tmpfile(ctx, parent, mode, flags, umask)?;
        Ok(Reply::Created(entry, opened))
    }

    fn setxattr(
        &self,
        ctx: &Context,
        ino: u64,
        args: &SetxattrArgs<'_>,
        value: &mut Reader<'_>,
    ) -> FsResult<Reply> {
        // Bounded by the decoder (XATTR_SIZE_MAX).
        let mut v = Vec::new();
        let n = value.bytes_left();
        value.read_to(&mut v, n);
        self.0.setxattr(ctx, ino, args, &v)?;
        Ok(Reply::Empty)
    }

    fn getxattr(
        &self,
        ctx: &Context,
        ino: u64,
        name: &[u8],
        size: u32,
        data: &mut Writer<'_>,
    ) -> FsResult<Reply> {
        let reply = self.0.getxattr(ctx, ino, name, size)?;
        xattr_reply(reply, size, data)
    }

    fn listxattr(&self, ctx: &Context, ino: u64, size: u32, data: &mut Writer<'_>) -> FsResult<Reply> {
        let reply = self.0.listxattr(ctx, ino, size)?;
        xattr_reply(reply, size, data)
    }

    fn removexattr(&self, ctx: &Context, ino: u64, name: &[u8]) -> FsResult<Reply> {
        self.0.removexattr(ctx, ino, name)?;
        Ok(Reply::Empty)
    }

    fn lseek(&self, ctx: &Context, ino: u64, fh: u64, offset: u64, whence: u32) -> FsResult<Reply> {
        Ok(Reply::Offset(self.0.lseek(ctx, ino, fh, offset, whence)?))
    }

    fn syncfs(&self, ctx: &Context, ino: u64) -> FsResult<Reply> {
        self.0.syncfs(ctx, ino)?;
        Ok(Reply::Empty)
    }

    fn statx(&self, ctx: &Context, ino: u64, fh: Option<u64>) -> FsResult<Reply> {
        let (st, valid) = self.0.statx(ctx, ino, fh)?;
        Ok(Reply::Statx(st, valid))
    }
}

/// The session state a filesystem operation changes, kept by the server whatever the backend
/// (and whether the operation ran at once or later, [`crate::filesystem::seam`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Post {
    /// Nothing.
    None,
    /// A RELEASE: the handle's locks go.
    Release { fh: u64, lock_owner: u64, flock_unlock: bool },
    /// A FLUSH: the owner's POSIX locks go.
    Flush { lock_owner: u64 },
}

impl Post {
    pub(crate) fn of(op: &Op<'_>) -> Post {
        match *op {
            Op::Release { fh, lock_owner, flock_unlock, .. } => {
                Post::Release { fh, lock_owner, flock_unlock }
            }
            Op::Flush { lock_owner, .. } => Post::Flush { lock_owner },
            _ => Post::None,
        }
    }
}

impl<F: FileSystem> Server<F> {
    /// Applies what the filesystem's answer `r` to a request on `ino` changes in the session
    /// ([`Post`]).
    #[inline]
    pub(crate) fn after(&self, post: Post, ino: u64, r: &FsResult<Reply>) {
        let done = r.as_ref().map(drop).map_err(|e| *e);
        match post {
            Post::None => {}
            Post::Release { fh, lock_owner, flock_unlock } => {
                self.after_release(ino, fh, lock_owner, flock_unlock, done)
            }
            Post::Flush { lock_owner } => self.after_flush(ino, lock_owner, done),
        }
    }

    /// The locks a RELEASE ends (whatever the filesystem, once it succeeded).
    fn after_release(&self, ino: u64, fh: u64, lock_owner: u64, flock_unlock: bool, released: FsResult<()>) {
        if released.is_err() {
            return;
        }
        // The handle's flock lock goes with it, and the OFD locks of the owner the kernel names
        // (it does, with FLOCK_UNLOCK, for files that used flock).
        let owner = (flock_unlock || lock_owner != 0).then_some(lock_owner);
        self.locks.release_handle(ino, fh, owner);
        if !self.fs.has_open_handles(ino) {
            self.locks.clear_file(ino);
        }
        self.locks_may_have_gone();
    }

    /// The locks a FLUSH ends (whatever the filesystem said, unless the handle does not exist).
    fn after_flush(&self, ino: u64, lock_owner: u64, flushed: FsResult<()>) {
        // Closing any descriptor of a file drops its process's POSIX locks on it, whatever the
        // flush itself says (close(2) does too); not for a handle that does not exist.
        if flushed != Err(filesystem::Error::BadHandle) {
            self.locks.release_owner(ino, lock_owner);
            self.locks_may_have_gone();
        }
    }
}

/// A GETXATTR or LISTXATTR answer into the data part (checked against the caller's `size`).
fn xattr_reply(reply: XattrReply, size: u32, data: &mut Writer<'_>) -> FsResult<Reply> {
    match reply {
        XattrReply::Size(n) => Ok(Reply::XattrSize(n)),
        XattrReply::Data(v) if v.len() > size as usize => Err(filesystem::Error::OutOfRange),
        XattrReply::Data(v) => {
            data.write_all(&v)?;
            Ok(Reply::Data(v.len()))
        }
    }
}

/// The smallest reply body an operation that hands the kernel a reference (an entry or a
/// handle) or reports a count needs: checked before the filesystem runs it, so that a reply
/// buffer too small cannot leak a lookup count or a handle.
pub(super) fn check_room(op: &Op<'_>, w: &Writer<'_>) -> Result<()> {
    use std::mem::size_of;
    let body = match op {
        Op::Lookup { .. } | Op::Symlink { .. } | Op::Mknod { .. } | Op::Mkdir { .. } | Op::Link { .. } => {
            size_of::<abi::EntryOut>()
        }
        Op::Create { .. } | Op::Tmpfile { .. } => size_of::<abi::EntryOut>() + size_of::<abi::OpenOut>(),
        Op::Open { .. } | Op::Opendir { .. } => size_of::<abi::OpenOut>(),
        Op::Write { .. } | Op::CopyFileRange { .. } => size_of::<abi::WriteOut>(),
        _ => return Ok(()),
    };
    check_fits(w, body)
}
