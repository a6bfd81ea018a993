//! Attributes of [`RamFs`] nodes: SETATTR (mode, owner, size, times, with every permission
//! check before any change), ACCESS, and what a write, truncate or chown does to privileges
//! (clearing set-user-id/set-group-id and `security.capability`, as `HANDLE_KILLPRIV(_V2)` leaves
//! to the filesystem).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::consts::{O_ACCMODE, O_RDONLY, R_OK, S_IFDIR, S_IFMT, S_ISGID, W_OK, X_OK};
use super::node::{now, stat_of, Body, Inode, Meta};
use super::{RamFs, MAX_FILE_SIZE};
use crate::abi;
use crate::filesystem::{Context, Error, Result, SetAttr, SetTime, Stat, Timespec};

fn resolve(t: SetTime, now: Timespec) -> Timespec {
    match t {
        SetTime::Now => now,
        SetTime::At(t) => t,
    }
}

impl RamFs {
    /// Whether `HANDLE_KILLPRIV_V2` is in force: the kernel then flags the writes, truncates and
    /// opens that must clear set-user-id/set-group-id.
    fn killpriv_v2(&self) -> bool {
        self.session.load(Ordering::Relaxed) & abi::init::HANDLE_KILLPRIV_V2 != 0
    }

    /// Whether `WRITEBACK_CACHE` is in force (see `set_attr`).
    pub(super) fn writeback(&self) -> bool {
        self.session.load(Ordering::Relaxed) & abi::init::WRITEBACK_CACHE != 0
    }

    /// Whether a write or truncate by `ctx` clears set-user-id/set-group-id: with
    /// `HANDLE_KILLPRIV_V2` the kernel's `flag` says so (the caller lacks `CAP_FSETID`); otherwise
    /// every non-root caller is taken to lack it.
    pub(super) fn kills_suid(&self, ctx: &Context, flag: bool) -> bool {
        flag || (!self.killpriv_v2() && ctx.uid != 0)
    }

    /// What a write, truncate or chown does to privileges, the caller holding the inode's `meta`:
    /// clears set-user-id/set-group-id when `kill` (see [`Meta::kill_suid`]) and, whoever the
    /// caller, drops `security.capability`. Returns whether the mode changed.
    pub(super) fn kill_priv(&self, inode: &Inode, m: &mut Meta, ctx: &Context, kill: bool) -> bool {
        if m.fcaps {
            self.drop_fcaps(inode, m);
        }
        kill && m.kill_suid(ctx)
    }

    /// SETATTR: every check before any change.
    pub(super) fn set_attr(&self, ctx: &Context, ino: u64, attr: &SetAttr) -> Result<(Stat, Duration)> {
        let inode = self.inode(ino)?;
        let handle = attr.fh.map(|fh| self.handle(fh, ino)).transpose()?;
        let mut data = match (attr.size, &inode.body) {
            (None, _) => None,
            (Some(size), Body::File(_)) => {
                if size > MAX_FILE_SIZE {
                    return Err(Error::FileTooLarge);
                }
                inode.data_mut()
            }
            (Some(_), _) if inode.kind == S_IFDIR => return Err(Error::IsDir),
            (Some(_), _) => return Err(Error::InvalidArgument),
        };
        let mut m = inode.meta_mut();
        let root = ctx.uid == 0;
        let owner = root || ctx.uid == m.uid;

        // Every check before any change.
        if attr.mode.is_some() && !owner {
            return Err(Error::NotPermitted);
        }
        if let Some(uid) = attr.uid {
            if !root && (uid != m.uid || ctx.uid != m.uid) {
                return Err(Error::NotPermitted);
            }
        }
        if let Some(gid) = attr.gid {
            if !root && (ctx.uid != m.uid || (gid != m.gid && !ctx.in_group(gid))) {
                return Err(Error::NotPermitted);
            }
        }
        // A handle open for writing (ftruncate, which also sets mtime to now) already proved
        // write access.
        let write_handle = handle.as_ref().is_some_and(|h| h.flags & O_ACCMODE != O_RDONLY);
        let explicit_time =
            matches!(attr.atime, Some(SetTime::At(_))) || matches!(attr.mtime, Some(SetTime::At(_)));
        // With writeback caching the kernel owns the times: it sends every change of them as
        // explicit times (a `touch` by a writer too, and the mtime/ctime of data it writes back,
        // from whichever task flushes), having checked the caller itself (virtio-fs mounts with
        // `default_permissions`). Whoever may write the file may then set them.
        let writer_may_set = self.writeback() && (write_handle || m.may(ctx, W_OK));
        if explicit_time && !owner && !writer_may_set {
            return Err(Error::NotPermitted);
        }
        if (attr.atime.is_some() || attr.mtime.is_some()) && !owner && !write_handle && !m.may(ctx, W_OK) {
            return Err(Error::AccessDenied);
        }
        if attr.size.is_some() {
            match &handle {
                Some(h) if h.flags & O_ACCMODE == O_RDONLY => return Err(Error::InvalidArgument),
                Some(_) => {}
                None if !m.may(ctx, W_OK) => return Err(Error::AccessDenied),
                None => {}
            }
        }

        let now = now();
        let mut changed = false;
        // With FUSE_HANDLE_KILLPRIV(_V2) the kernel leaves clearing set-user-id/set-group-id and
        // security.capability to us: on chown of a non-directory (by anyone, as Linux does), and
        // on truncate (by callers without CAP_FSETID; see `kills_suid`). Decided on the
        // attributes before the change, as the kernel does.
        let chown = (attr.uid.is_some() || attr.gid.is_some()) && inode.kind != S_IFDIR;
        let kill = chown
            || (attr.size.is_some() && self.kills_suid(ctx, attr.kill_suidgid))
            || (attr.kill_suidgid && (self.killpriv_v2() || !root));
        if chown || attr.size.is_some() || kill {
            changed |= self.kill_priv(&inode, &mut m, ctx, kill);
        }
        if let Some(uid) = attr.uid {
            m.uid = uid;
            changed = true;
        }
        if let Some(gid) = attr.gid {
            m.gid = gid;
            changed = true;
        }
        if let Some(mode) = attr.mode {
            let mut perm = mode & 0o7777;
            if !root && !ctx.in_group(m.gid) {
                perm &= !S_ISGID;
            }
            m.mode = (m.mode & S_IFMT) | perm;
            changed = true;
        }
        if let (Some(size), Some(data)) = (attr.size, data.as_deref_mut()) {
            if size != m.size {
                self.truncate_locked(data, &mut m, size);
                m.mtime = now;
                changed = true;
            }
        }
        if let Some(t) = attr.atime {
            m.atime = resolve(t, now);
            changed = true;
        }
        if let Some(t) = attr.mtime {
            m.mtime = resolve(t, now);
            changed = true;
        }
        match attr.ctime {
            Some(t) => m.ctime = t,
            None if changed => m.ctime = now,
            None => {}
        }
        Ok((stat_of(ino, &m), self.cfg.cache.timeout()))
    }

    /// ACCESS for `mask` (`R_OK | W_OK | X_OK`).
    pub(super) fn check_access(&self, ctx: &Context, ino: u64, mask: u32) -> Result<()> {
        let m = self.inode(ino)?.meta();
        let mask = mask & (R_OK | W_OK | X_OK);
        if mask == 0 || m.may(ctx, mask) {
            Ok(())
        } else {
            Err(Error::AccessDenied)
        }
    }
}
