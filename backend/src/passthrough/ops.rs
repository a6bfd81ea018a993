//! The passthrough's [`FileSystem`] operations: each a system call (or a few) on the host
//! directory beneath the share's root, under the caller's identity where permissions matter.

use super::*;
use crate::filesystem::{
    CopyFileRangeArgs, CreateArgs, FallocateArgs, MknodArgs, ReadArgs, RenameArgs, SetxattrArgs, WriteArgs,
};

impl FileSystem for PassthroughFs {
    fn init(&self, capable: u64) -> Result<u64> {
        // What the server can honour suits us: the host kernel clears set-user-id/set-group-id
        // on write, truncate and chown under the caller's ids (HANDLE_KILLPRIV(_V2)), applies
        // the umask per thread (DONT_MASK, see `creation_umask`) and keeps POSIX ACLs.
        let mut wanted = capable;
        if !self.cfg.posix_acl {
            wanted &= !abi::init::POSIX_ACL;
        }
        self.session.store(wanted, Ordering::Relaxed);
        Ok(wanted)
    }

    fn destroy(&self) {
        let handles = {
            let mut handles = self.handles.write().unwrap_or_else(PoisonError::into_inner);
            handles.keys().for_each(|&fh| self.handle_changed(fh));
            if let Some(k) = self.keep.get() {
                handles.keys().for_each(|&fh| k.queue_let(fh | super::keep::HANDLE_KEY));
            }
            std::mem::take(&mut *handles)
        };
        for h in handles.values() {
            h.inode.opens.fetch_sub(1, Ordering::AcqRel);
        }
        drop(handles);
        self.inodes.clear();
    }

    fn before_publish(&self) {
        if let Some(k) = self.keep.get() {
            // A bug in the flush must not leave holds taken and not given unnoticed.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| k.flush())).is_err() {
                k.mark_incomplete();
            }
        }
    }

    fn publish_due(&self) -> bool {
        self.keep.get().is_some_and(|k| k.due())
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<Entry> {
        let dir = self.inode(parent)?;
        if name == b".." {
            return as_caller(ctx, || self.lookup_dotdot(&dir));
        }
        let name = Name::new(name)?;
        as_caller(ctx, || self.do_lookup(&dir, &name))
    }

    fn forget(&self, _ctx: &Context, ino: u64, nlookup: u64) {
        self.inodes.forget(ino, nlookup);
    }

    fn getattr(&self, _ctx: &Context, ino: u64, _fh: Option<u64>) -> Result<(Stat, Duration)> {
        let inode = self.inode(ino)?;
        let st = sys::fstatx(inode.fd()).map_err(Error::from)?;
        Ok((to_stat(&st), self.cfg.cache.timeout()))
    }

    fn setattr(&self, ctx: &Context, ino: u64, attr: &SetAttr) -> Result<(Stat, Duration)> {
        let inode = self.inode(ino)?;
        let handle = match attr.fh {
            Some(fh) => Some(self.file_handle(fh, ino)?),
            None => None,
        };
        let path = sys::FdPath::new(inode.fd());
        as_caller(ctx, || {
            if let Some(mode) = attr.mode {
                if inode.kind == libc::S_IFLNK {
                    return Err(Error::NotSupported);
                }
                self.cfg.policy.check_mode(inode.kind, mode)?;
                sys::fchmodat(self.proc_fd.as_fd(), path.name(), mode & 0o7777).map_err(Error::from)?;
            }
            if attr.uid.is_some() || attr.gid.is_some() {
                let uid = attr.uid.unwrap_or(u32::MAX);
                let gid = attr.gid.unwrap_or(u32::MAX);
                sys::fchown_fd(inode.fd(), uid, gid).map_err(Error::from)?;
            }
            if let Some(size) = attr.size {
                match inode.kind {
                    libc::S_IFREG => {}
                    libc::S_IFDIR => return Err(Error::IsDir),
                    _ => return Err(Error::InvalidArgument),
                }
                match &handle {
                    // Through the handle its access mode decides, as ftruncate(2).
                    Some(h) => sys::ftruncate(h.file.as_fd(), size).map_err(Error::from)?,
                    None => sys::truncate(self.proc_entry(inode.fd())?.name(), size).map_err(Error::from)?,
                }
            }
            if attr.atime.is_some() || attr.mtime.is_some() {
                let times = [set_time(attr.atime), set_time(attr.mtime)];
                match sys::utimensat(self.proc_fd.as_fd(), path.name(), &times, 0) {
                    // With writeback caching the kernel sends every change of the times as
                    // explicit times (a writer's `touch`, the mtime of data it writes back, from
                    // whichever task flushes), which the host lets only the owner set. Through
                    // a handle open for writing they are the writer's: set below, as the daemon.
                    Err(e)
                        if e.raw_os_error() == Some(libc::EPERM)
                            && self.writer_sets_times(handle.as_deref(), &inode) =>
                    {
                        return Ok(Some(times));
                    }
                    r => r.map_err(Error::from)?,
                }
            }
            // ctime cannot be set on the host: it is whatever the changes above made it.
            Ok(None)
        })?
        .map_or(Ok(()), |times| sys::utimensat(self.proc_fd.as_fd(), path.name(), &times, 0))
        .map_err(Error::from)?;
        let st = sys::fstatx(inode.fd()).map_err(Error::from)?;
        Ok((to_stat(&st), self.cfg.cache.timeout()))
    }

    fn readlink(&self, _ctx: &Context, ino: u64) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        if inode.kind != libc::S_IFLNK {
            return Err(Error::InvalidArgument);
        }
        sys::readlink_fd(inode.fd()).map_err(Error::from)
    }

    fn symlink(&self, ctx: &Context, parent: u64, name: &[u8], target: &[u8]) -> Result<Entry> {
        self.room_for_node()?;
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        let target = sys::cstring(target).map_err(Error::from)?;
        as_caller(ctx, || {
            sys::symlinkat(&target, dir.fd(), name.c()).map_err(Error::from)?;
            self.do_lookup(&dir, &name)
        })
    }

    fn mknod(&self, ctx: &Context, parent: u64, args: &MknodArgs<'_>) -> Result<Entry> {
        let MknodArgs { name, mode, rdev, umask } = *args;
        self.room_for_node()?;
        self.cfg.policy.check_mknod(mode)?;
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        as_caller(ctx, || {
            self.creation_umask(umask)?;
            sys::mknodat(dir.fd(), name.c(), mode, u64::from(rdev)).map_err(Error::from)?;
            self.do_lookup(&dir, &name)
        })
    }

    fn mkdir(&self, ctx: &Context, parent: u64, name: &[u8], mode: u32, umask: u32) -> Result<Entry> {
        self.room_for_node()?;
        self.cfg.policy.check_mode(libc::S_IFDIR, mode)?;
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        as_caller(ctx, || {
            self.creation_umask(umask)?;
            sys::mkdirat(dir.fd(), name.c(), mode & 0o7777).map_err(Error::from)?;
            self.do_lookup(&dir, &name)
        })
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        as_caller(ctx, || sys::unlinkat(dir.fd(), name.c(), 0).map_err(Error::from))
    }

    fn rmdir(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        as_caller(ctx, || sys::unlinkat(dir.fd(), name.c(), libc::AT_REMOVEDIR).map_err(Error::from))
    }

    fn rename(&self, ctx: &Context, olddir: u64, args: &RenameArgs<'_>) -> Result<()> {
        let RenameArgs { oldname, newdir, newname, flags } = *args;
        let old = self.dir(olddir)?;
        let new = self.dir(newdir)?;
        let oldname = Name::new(oldname)?;
        let newname = Name::new(newname)?;
        as_caller(ctx, || {
            sys::renameat2(old.fd(), oldname.c(), new.fd(), newname.c(), flags).map_err(Error::from)
        })?;
        // Moved directories now live in their new parent (both ways for an exchange).
        let mut moved = vec![(&new, &newname)];
        if flags & libc::RENAME_EXCHANGE != 0 {
            moved.push((&old, &oldname));
        }
        for (dir, name) in moved {
            if let Ok(st) = sys::statx(dir.fd(), name.c(), libc::AT_SYMLINK_NOFOLLOW) {
                if kind_of(&st) == libc::S_IFDIR {
                    if let Some(inode) = self.inodes.lookup_key_in(&InodeKey::of(&st), dir) {
                        self.inodes.forget(inode.id, 1);
                    }
                }
            }
        }
        Ok(())
    }

    fn link(&self, ctx: &Context, ino: u64, newparent: u64, newname: &[u8]) -> Result<Entry> {
        self.room_for_node()?;
        let inode = self.inode(ino)?;
        let dir = self.dir(newparent)?;
        let name = Name::new(newname)?;
        if inode.is_dir() {
            return Err(Error::NotPermitted);
        }
        let path = sys::FdPath::new(inode.fd());
        as_caller(ctx, || {
            // The magic link resolves to the node's own inode (a symlink stays a symlink).
            sys::linkat(self.proc_fd.as_fd(), path.name(), dir.fd(), name.c(), libc::AT_SYMLINK_FOLLOW)
                .map_err(Error::from)
        })?;
        let inode = self.inodes.reref(&inode, || inode.fd().try_clone_to_owned()).map_err(Error::from)?;
        match sys::fstatx(inode.fd()) {
            Ok(st) => Ok(self.entry(&inode, &st)),
            Err(e) => {
                self.inodes.forget(inode.id, 1);
                Err(Error::from(e))
            }
        }
    }

    fn open(&self, ctx: &Context, ino: u64, flags: u32, _kill_priv: bool) -> Result<Opened> {
        self.room_for_handle()?;
        let inode = self.inode(ino)?;
        match inode.kind {
            libc::S_IFREG => {}
            libc::S_IFDIR => return Err(Error::IsDir),
            libc::S_IFLNK => return Err(Error::Os(libc::ELOOP)),
            // Device nodes, FIFOs and sockets are the guest's business, never opened here.
            _ => return Err(Error::NoSuchAddress),
        }
        let oflags = open_flags(flags)?;
        // With the caller's ids: the host checks the access mode (and an O_TRUNC clears
        // set-user-id as for that caller).
        let (file, oflags) = as_caller(ctx, || self.open_with(oflags, |f| Ok((self.reopen(&inode, f)?, f))))?;
        Ok(Opened {
            fh: self.add_handle(inode, file, false, oflags),
            open_flags: self.cfg.cache.file_open_flags(),
        })
    }

    fn read(&self, _ctx: &Context, ino: u64, args: &ReadArgs, w: &mut Writer<'_>) -> Result<usize> {
        let ReadArgs { fh, offset, size } = *args;
        let h = self.file_handle(fh, ino)?;
        let want = (size as usize).min(w.available());
        BOUNCE.with(|b| {
            let mut buf = b.borrow_mut();
            let mut done = 0;
            while done < want {
                let chunk = (want - done).min(IO_CHUNK);
                if buf.len() < chunk {
                    buf.resize(chunk, 0);
                }
                let n = match h.file.read_at(&mut buf[..chunk], offset + done as u64) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if done > 0 => {
                        log::debug!("passthrough: short read after {done} bytes: {e}");
                        break;
                    }
                    Err(e) => return Err(Error::from(e)),
                };
                w.write_all(&buf[..n])?;
                done += n;
            }
            Ok(done)
        })
    }

    fn write(&self, ctx: &Context, ino: u64, args: &WriteArgs, r: &mut Reader<'_>) -> Result<usize> {
        let WriteArgs { fh, offset, size, write_flags, .. } = *args;
        let h = self.file_handle(fh, ino)?;
        let size = size as usize;
        // The caller's ids matter only for clearing set-user-id/set-group-id (the host does it
        // when the writer lacks CAP_FSETID); the kernel tells us when, with HANDLE_KILLPRIV_V2.
        let kill = write_flags & abi::write_flags::KILL_SUIDGID != 0
            || !self.session_has(abi::init::HANDLE_KILLPRIV_V2);
        let guard = if kill {
            Some(creds::Guard::enter(ctx.uid, ctx.gid, ctx.supp_gid).map_err(Error::from)?)
        } else {
            None
        };
        let res = BOUNCE.with(|b| {
            let mut buf = b.borrow_mut();
            let mut done = 0;
            while done < size {
                let chunk = (size - done).min(IO_CHUNK);
                buf.clear();
                if r.read_to(&mut buf, chunk) != chunk {
                    return Err(Error::InvalidArgument);
                }
                let mut at = 0;
                while at < chunk {
                    match h.file.write_at(&buf[at..chunk], offset + (done + at) as u64) {
                        Ok(0) => return Err(Error::Io),
                        Ok(n) => at += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) if done + at > 0 => return Ok(done + at),
                        Err(e) => return Err(Error::from(e)),
                    }
                }
                done += chunk;
            }
            Ok(done)
        });
        drop(guard);
        res
    }

    fn flush(&self, _ctx: &Context, ino: u64, fh: u64, _lock_owner: u64) -> Result<()> {
        self.handle(fh, ino).map(drop)
    }

    fn release(&self, _ctx: &Context, ino: u64, fh: u64, _flags: u32, _lock_owner: u64) -> Result<()> {
        self.remove_handle(fh, ino)
    }

    fn lock_handle(&self, _ctx: &Context, ino: u64, fh: u64, access: LockAccess) -> Result<()> {
        // The locks live in the server (for the one guest this device serves), not on the host
        // file: see DESIGN.md ("FUSE semantics").
        let h = self.handle(fh, ino)?;
        if h.inode.kind != libc::S_IFREG {
            return Err(Error::InvalidArgument);
        }
        match (access, h.access) {
            (LockAccess::Read, libc::O_WRONLY) | (LockAccess::Write, libc::O_RDONLY) => Err(Error::BadHandle),
            _ => Ok(()),
        }
    }

    fn has_open_handles(&self, ino: u64) -> bool {
        self.inodes.get(ino).is_some_and(|inode| inode.opens.load(Ordering::Acquire) > 0)
    }

    fn fsync(&self, _ctx: &Context, ino: u64, fh: u64, datasync: bool) -> Result<()> {
        let h = self.file_handle(fh, ino)?;
        sys::fsync(h.file.as_fd(), datasync).map_err(Error::from)
    }

    fn opendir(&self, ctx: &Context, ino: u64, _flags: u32) -> Result<Opened> {
        self.room_for_handle()?;
        let inode = self.dir(ino)?;
        let file = as_caller(ctx, || self.reopen(&inode, libc::O_RDONLY | libc::O_DIRECTORY))?;
        Ok(Opened {
            fh: self.add_handle(inode, file, true, libc::O_RDONLY),
            open_flags: self.cfg.cache.dir_open_flags(),
        })
    }

    fn readdir(&self, ctx: &Context, ino: u64, fh: u64, offset: u64, sink: &mut DirSink<'_>) -> Result<()> {
        self.listing(ctx, ino, fh, offset, sink)
    }

    fn readdirplus(
        &self,
        ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        sink: &mut DirPlusSink<'_>,
    ) -> Result<()> {
        let dir = self.dir(ino)?;
        as_caller(ctx, || {
            self.listing(ctx, ino, fh, offset, |e| {
                let entry = if e.name == b"." || e.name == b".." {
                    Entry::default()
                } else {
                    // An entry that vanished or that the caller may not look up is listed
                    // without attributes (node id 0), as the kernel allows.
                    Name::new(e.name).and_then(|n| self.do_lookup(&dir, &n)).unwrap_or_default()
                };
                let taken = sink(e, &entry);
                if !taken && entry.ino != 0 {
                    self.inodes.forget(entry.ino, 1);
                }
                taken
            })
        })
    }

    fn releasedir(&self, _ctx: &Context, ino: u64, fh: u64, _flags: u32) -> Result<()> {
        self.remove_handle(fh, ino)
    }

    fn fsyncdir(&self, _ctx: &Context, ino: u64, fh: u64, datasync: bool) -> Result<()> {
        let h = self.handle(fh, ino)?;
        sys::fsync(h.file.as_fd(), datasync).map_err(Error::from)
    }

    fn statfs(&self, _ctx: &Context, ino: u64) -> Result<StatFs> {
        let inode = self.inode(ino)?;
        let st = sys::fstatfs(inode.fd()).map_err(Error::from)?;
        Ok(StatFs {
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
            files: st.f_files,
            ffree: st.f_ffree,
            bsize: st.f_bsize as u32,
            namelen: st.f_namelen as u32,
            frsize: st.f_frsize as u32,
        })
    }

    fn access(&self, ctx: &Context, ino: u64, mask: u32) -> Result<()> {
        let inode = self.inode(ino)?;
        as_caller(ctx, || sys::faccess_fd(inode.fd(), mask).map_err(Error::from))
    }

    fn create(&self, ctx: &Context, parent: u64, args: &CreateArgs<'_>) -> Result<(Entry, Opened)> {
        let CreateArgs { name, mode, flags, umask, kill_priv: _kill_priv } = *args;
        self.room_for_node()?;
        self.room_for_handle()?;
        self.cfg.policy.check_mode(libc::S_IFREG, mode)?;
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        let oflags = open_flags(flags)? | libc::O_NOFOLLOW;
        let excl = flags as i32 & libc::O_EXCL != 0;
        as_caller(ctx, || {
            self.creation_umask(umask)?;
            // Create exclusively first: what O_CREAT | O_EXCL makes is always a new regular file.
            // An existing name is opened only once it is known to be a regular file, so a FIFO
            // (whose open waits for a writer), a device node (whose open has side effects) or a
            // socket is never opened, whatever the guest sends. A name removed in between is
            // tried again.
            for _ in 0..3 {
                let created = self.open_with(oflags, |f| {
                    let create = f | libc::O_CREAT | libc::O_EXCL;
                    match sys::openat2(dir.fd(), name.c(), create, mode & 0o7777, RESOLVE) {
                        Ok(file) => self.adopt(&dir, file, f).map(Some),
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) && !excl => Ok(None),
                        Err(e) => Err(Error::from(e)),
                    }
                })?;
                if let Some(r) = created {
                    return Ok(r);
                }
                match self.open_with(oflags, |f| self.open_existing(&dir, &name, f)) {
                    Err(Error::NotFound) => continue,
                    r => return r,
                }
            }
            Err(Error::NotFound)
        })
    }

    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> Result<(Entry, Opened)> {
        self.room_for_node()?;
        self.room_for_handle()?;
        self.cfg.policy.check_mode(libc::S_IFREG, mode)?;
        let dir = self.dir(parent)?;
        let oflags = open_flags(flags)? | libc::O_TMPFILE | (flags as i32 & libc::O_EXCL);
        as_caller(ctx, || {
            self.creation_umask(umask)?;
            self.open_with(oflags, |f| {
                let file = sys::openat2(dir.fd(), c".", f, mode & 0o7777, RESOLVE).map_err(Error::from)?;
                self.adopt(&dir, file, f)
            })
        })
    }

    fn fallocate(&self, ctx: &Context, ino: u64, args: &FallocateArgs) -> Result<()> {
        let FallocateArgs { fh, mode, offset, length } = *args;
        let h = self.file_handle(fh, ino)?;
        as_caller(ctx, || sys::fallocate(h.file.as_fd(), mode, offset, length).map_err(Error::from))
    }

    fn setxattr(&self, ctx: &Context, ino: u64, args: &SetxattrArgs<'_>, value: &[u8]) -> Result<()> {
        let SetxattrArgs { name, flags, acl_kill_sgid: _acl_kill_sgid } = *args;
        self.cfg.policy.check_xattr(name)?;
        let inode = self.inode(ino)?;
        let name = sys::cstring(name).map_err(Error::from)?;
        let path = self.proc_entry(inode.fd())?;
        as_caller(ctx, || sys::setxattr(path.name(), &name, value, flags as i32).map_err(Error::from))
    }

    fn getxattr(&self, ctx: &Context, ino: u64, name: &[u8], size: u32) -> Result<XattrReply> {
        let inode = self.inode(ino)?;
        let name = sys::cstring(name).map_err(Error::from)?;
        let path = self.proc_entry(inode.fd())?;
        as_caller(ctx, || {
            if size == 0 {
                let n = sys::getxattr(path.name(), &name, &mut []).map_err(Error::from)?;
                return Ok(XattrReply::Size(n as u32));
            }
            let mut buf = vec![0u8; (size as usize).min(limits::XATTR_SIZE_MAX)];
            let n = sys::getxattr(path.name(), &name, &mut buf).map_err(Error::from)?;
            buf.truncate(n);
            Ok(XattrReply::Data(buf))
        })
    }

    fn listxattr(&self, ctx: &Context, ino: u64, size: u32) -> Result<XattrReply> {
        let inode = self.inode(ino)?;
        let path = self.proc_entry(inode.fd())?;
        as_caller(ctx, || {
            if size == 0 {
                let n = sys::listxattr(path.name(), &mut []).map_err(Error::from)?;
                return Ok(XattrReply::Size(n as u32));
            }
            let mut buf = vec![0u8; (size as usize).min(limits::XATTR_SIZE_MAX)];
            let n = sys::listxattr(path.name(), &mut buf).map_err(Error::from)?;
            buf.truncate(n);
            Ok(XattrReply::Data(buf))
        })
    }

    fn removexattr(&self, ctx: &Context, ino: u64, name: &[u8]) -> Result<()> {
        let inode = self.inode(ino)?;
        let name = sys::cstring(name).map_err(Error::from)?;
        let path = self.proc_entry(inode.fd())?;
        as_caller(ctx, || sys::removexattr(path.name(), &name).map_err(Error::from))
    }

    fn lseek(&self, _ctx: &Context, ino: u64, fh: u64, offset: u64, whence: u32) -> Result<u64> {
        let h = self.file_handle(fh, ino)?;
        sys::lseek(h.file.as_fd(), offset, whence).map_err(Error::from)
    }

    fn copy_file_range(&self, ctx: &Context, ino_in: u64, args: &CopyFileRangeArgs) -> Result<usize> {
        let CopyFileRangeArgs { fh_in, off_in, nodeid_out: ino_out, fh_out, off_out, len } = *args;
        // `flags` is 0: the decoder refuses any other value.
        let hin = self.file_handle(fh_in, ino_in)?;
        let hout = self.file_handle(fh_out, ino_out)?;
        let len = len.min(MAX_COPY) as usize;
        as_caller(ctx, || {
            sys::copy_file_range(hin.file.as_fd(), off_in, hout.file.as_fd(), off_out, len)
                .map_err(Error::from)
        })
    }

    fn syncfs(&self, _ctx: &Context, ino: u64) -> Result<()> {
        let inode = self.inode(ino)?;
        let target = if inode.is_dir() { inode } else { self.inodes.root().clone() };
        let dir = self.reopen(&target, libc::O_RDONLY | libc::O_DIRECTORY)?;
        sys::syncfs(dir.as_fd()).map_err(Error::from)
    }

    fn statx(&self, _ctx: &Context, ino: u64, _fh: Option<u64>) -> Result<(Statx, Duration)> {
        let inode = self.inode(ino)?;
        let st = sys::fstatx(inode.fd()).map_err(Error::from)?;
        let btime = (st.stx_mask & libc::STATX_BTIME != 0).then(|| ts(&st.stx_btime));
        Ok((Statx { stat: to_stat(&st), btime }, self.cfg.cache.timeout()))
    }

    fn engine(&self, poller: usize) -> Option<Box<dyn crate::filesystem::seam::FsEngine<Self>>> {
        self.ring(poller).map(|r| Box::new(r) as Box<dyn crate::filesystem::seam::FsEngine<Self>>)
    }
}
