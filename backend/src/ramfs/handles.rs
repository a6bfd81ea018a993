//! Open handles of [`RamFs`]: OPEN and OPENDIR (the permission check for the access mode,
//! `O_TRUNC`), RELEASE, the look-up of a handle a request names, and the handles advisory locks
//! come through. A handle keeps its inode alive, so an unlinked file stays readable while open.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::consts::{O_ACCMODE, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY, R_OK, S_IFDIR, S_IFREG, W_OK};
use super::node::{now, Handle, Inode};
use super::RamFs;
use crate::filesystem::{Context, Error, LockAccess, Opened, Result};

impl RamFs {
    /// The open handle `fh`, which must be of `ino`.
    pub(super) fn handle(&self, fh: u64, ino: u64) -> Result<Arc<Handle>> {
        self.handles.get(fh).filter(|h| h.inode.ino == ino).ok_or(Error::BadHandle)
    }

    /// Opens `inode`, checking permissions when `check`, truncating on `O_TRUNC` (which clears
    /// privileges as a truncate does; `kill_priv` is the kernel's say, see [`Self::kills_suid`]).
    pub(super) fn open_inode(
        &self,
        ctx: &Context,
        inode: Arc<Inode>,
        flags: u32,
        check: bool,
        kill_priv: bool,
    ) -> Result<Opened> {
        let mut mask = match flags & O_ACCMODE {
            O_RDONLY => R_OK,
            O_WRONLY => W_OK,
            O_RDWR => R_OK | W_OK,
            _ => return Err(Error::InvalidArgument),
        };
        let trunc = flags & O_TRUNC != 0;
        if trunc {
            mask |= W_OK;
        }
        match inode.kind {
            S_IFREG => {}
            S_IFDIR if mask & W_OK != 0 => return Err(Error::IsDir),
            S_IFDIR => {}
            _ => return Err(Error::NotSupported),
        }
        if check && !inode.meta().may(ctx, mask) {
            return Err(Error::AccessDenied);
        }
        // The handle limit, taken before anything changes (ENFILE: the system's open file
        // table is full, as far as the guest is concerned).
        self.nhandles
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cfg.max_handles).then_some(n + 1)
            })
            .map_err(|_| Error::Os(libc::ENFILE))?;
        if let (true, Some(mut data)) = (trunc, trunc.then(|| inode.data_mut()).flatten()) {
            let mut m = inode.meta_mut();
            self.truncate_locked(&mut data, &mut m, 0);
            let now = now();
            m.mtime = now;
            m.ctime = now;
            let kill = self.kills_suid(ctx, kill_priv);
            self.kill_priv(&inode, &mut m, ctx, kill);
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        inode.add_open();
        let open_flags = if inode.kind == S_IFDIR {
            self.cfg.cache.dir_open_flags()
        } else {
            self.cfg.cache.file_open_flags()
        };
        self.handles.insert(fh, Arc::new(Handle { inode, flags }));
        Ok(Opened { fh, open_flags })
    }

    /// Drops handle `fh`.
    pub(super) fn release_handle(&self, ino: u64, fh: u64) -> Result<()> {
        let h = self.handles.remove_if(fh, |h| h.inode.ino == ino).ok_or(Error::BadHandle)?;
        self.nhandles.fetch_sub(1, Ordering::AcqRel);
        h.inode.drop_open();
        self.maybe_evict(&h.inode);
        Ok(())
    }

    /// OPENDIR.
    pub(super) fn open_dir(&self, ctx: &Context, ino: u64, flags: u32) -> Result<Opened> {
        let inode = self.inode(ino)?;
        if inode.kind != S_IFDIR {
            return Err(Error::NotDir);
        }
        self.open_inode(ctx, inode, flags & !O_TRUNC, true, false)
    }

    /// Whether `fh` may carry an advisory lock of `access`.
    pub(super) fn check_lock_handle(
        &self,
        _ctx: &Context,
        ino: u64,
        fh: u64,
        access: LockAccess,
    ) -> Result<()> {
        let h = self.handle(fh, ino)?;
        if h.inode.kind != S_IFREG {
            return Err(Error::InvalidArgument);
        }
        match (access, h.flags & O_ACCMODE) {
            (LockAccess::Read, O_WRONLY) | (LockAccess::Write, O_RDONLY) => Err(Error::BadHandle),
            _ => Ok(()),
        }
    }
}
