//! The namespace of [`RamFs`]: LOOKUP and FORGET, the creation of nodes (CREATE, TMPFILE,
//! MKNOD, MKDIR, SYMLINK; a new node's owner, group, mode and inherited ACLs), LINK, UNLINK,
//! RMDIR, RENAME (with `RENAME_NOREPLACE`/`RENAME_EXCHANGE` and the sticky-directory rule), and
//! directory listings with stable cookies. Every change takes the `tree` lock exclusively.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::acl;
use super::consts::{
    O_ACCMODE, O_EXCL, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY, RENAME_EXCHANGE, RENAME_NOREPLACE, S_IFBLK,
    S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK, S_ISGID, S_ISVTX, W_OK, X_OK,
};
use super::node::{now, rd, wr, Body, FileLock, Inode, Meta, Tree, BLOCK_SIZE, FIRST_COOKIE};
use super::{check_name, RamFs, LINK_MAX, SYMLINK_MAX};
use crate::filesystem::{
    Context, CreateArgs, DirEntry, DirPlusSink, DirSink, Entry, Error, Opened, Result, Stat,
};

impl RamFs {
    /// `parent` as a directory the caller may search.
    fn search_dir(&self, ctx: &Context, parent: u64) -> Result<(Arc<Inode>, Meta)> {
        let p = self.inode(parent)?;
        if p.kind != S_IFDIR {
            return Err(Error::NotDir);
        }
        let m = p.meta();
        if !m.may(ctx, X_OK) {
            return Err(Error::AccessDenied);
        }
        Ok((p, m))
    }

    /// Fails unless `parent` is a directory the caller may search; the cheap form of
    /// [`Self::search_dir`] for lookups, which need neither the inode nor its attributes after.
    fn check_search(&self, ctx: &Context, parent: u64) -> Result<()> {
        let may = self.inodes.with(parent, |p| p.kind == S_IFDIR && p.meta_ref().may(ctx, X_OK));
        match may {
            Some(true) => Ok(()),
            Some(false) => match self.inodes.with(parent, |p| p.kind) {
                Some(S_IFDIR) => Err(Error::AccessDenied),
                Some(_) => Err(Error::NotDir),
                None => Err(Error::NotFound),
            },
            None => Err(Error::NotFound),
        }
    }

    /// Creates an inode and links it as `parent/name`; the kernel gets one lookup reference.
    /// `perm` is taken through `umask`, or through the parent's default ACL when it has one.
    #[allow(clippy::too_many_arguments)]
    fn create_node(
        &self,
        ctx: &Context,
        parent: u64,
        name: &[u8],
        kind: u32,
        perm: u32,
        umask: u32,
        rdev: u32,
        body: Body,
    ) -> Result<Arc<Inode>> {
        check_name(name)?;
        let mut tree = wr(&self.tree);
        let (p, pm) = self.search_dir(ctx, parent)?;
        let dir = tree.get(&parent).ok_or(Error::NotFound)?;
        if dir.get(name).is_some() {
            return Err(Error::Exists);
        }
        if !pm.may(ctx, W_OK | X_OK) {
            return Err(Error::AccessDenied);
        }
        let inode = self.new_inode(ctx, &pm, kind, perm, umask, rdev, body)?;
        tree.insert(parent, name, inode.ino, kind)?;
        if kind == S_IFDIR {
            tree.add_dir(inode.ino, parent);
        }
        let now = now();
        p.update(|m| {
            m.mtime = now;
            m.ctime = now;
            if kind == S_IFDIR {
                m.nlink += 1;
            }
        });
        self.inodes.insert(inode.ino, inode.clone());
        Ok(inode)
    }

    /// A new inode of `ctx` for a node created in a directory with attributes `pm`: the group and
    /// set-group-id follow the directory's set-group-id bit; the permissions go through the
    /// directory's default ACL (which a new directory also inherits) or else `umask`. Counted
    /// against the inode limit and, for the ACLs, the capacity; not yet in the inode table.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_inode(
        &self,
        ctx: &Context,
        pm: &Meta,
        kind: u32,
        perm: u32,
        umask: u32,
        rdev: u32,
        body: Body,
    ) -> Result<Arc<Inode>> {
        let mut perm = perm & 0o7777;
        let gid = if pm.mode & S_ISGID != 0 {
            if kind == S_IFDIR {
                perm |= S_ISGID;
            }
            pm.gid
        } else {
            ctx.gid
        };
        let (mode, acl, default_acl) = match &pm.default_acl {
            _ if kind == S_IFLNK => (kind | perm, None, None),
            Some(dacl) => {
                let (mode, acl) = acl::inherit(dacl, kind | perm);
                (mode, acl.map(Arc::new), (kind == S_IFDIR).then(|| dacl.clone()))
            }
            None => (kind | (perm & !(umask & 0o777)), None, None),
        };
        let acl_bytes = acl.as_ref().map_or(0, |a| a.value_size())
            + default_acl.as_ref().map_or(0, |d| acl::value_size(d.len()));
        self.take_inode(acl_bytes as u64)?;
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        let size = match (&body, kind) {
            (Body::Symlink(t), _) => t.len() as u64,
            (_, S_IFDIR) => u64::from(BLOCK_SIZE),
            _ => 0,
        };
        let nlink = if kind == S_IFDIR { 2 } else { 1 };
        let mut meta = Meta::new(mode, ctx.uid, gid, nlink, rdev, size);
        meta.acl = acl;
        meta.default_acl = default_acl;
        meta.xattr_bytes = acl_bytes as u64;
        Ok(Arc::new(Inode::new(ino, kind, meta, 1, body, self.changes.clone())))
    }

    /// Whether directory `anc` is `ino` or one of its ancestors.
    fn is_ancestor(tree: &Tree, anc: u64, mut ino: u64) -> bool {
        // The tree is a tree, so the walk ends at the root; the bound only guards against a bug.
        for _ in 0..1_000_000 {
            if ino == anc {
                return true;
            }
            match tree.get(&ino) {
                Some(d) if d.parent != ino => ino = d.parent,
                _ => return false,
            }
        }
        false
    }

    /// LOOKUP: the entry `parent/name`, with one more kernel reference.
    pub(super) fn lookup_name(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<Entry> {
        check_name(name)?;
        let tree = rd(&self.tree);
        self.check_search(ctx, parent)?;
        let dir = tree.get(&parent).ok_or(Error::NotFound)?;
        let ino = match name {
            b"." => parent,
            b".." => dir.parent,
            _ => dir.get(name).ok_or(Error::NotFound)?.ino,
        };
        // Under the shard's read lock: no reference count traffic, and no eviction in between.
        self.inodes
            .with(ino, |child| {
                child.add_lookups(1);
                self.entry(child)
            })
            .ok_or(Error::NotFound)
    }

    /// FORGET: drops `nlookup` kernel references.
    pub(super) fn forget_node(&self, _ctx: &Context, ino: u64, nlookup: u64) {
        let Some(inode) = self.inodes.get(ino) else {
            return;
        };
        inode.drop_lookups(nlookup);
        self.maybe_evict(&inode);
    }

    /// SYMLINK.
    pub(super) fn make_symlink(
        &self,
        ctx: &Context,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Result<Entry> {
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        let body = Body::Symlink(target.into());
        let inode = self.create_node(ctx, parent, name, S_IFLNK, 0o777, 0, 0, body)?;
        Ok(self.entry(&inode))
    }

    /// MKNOD: regular files, FIFOs, sockets, and devices for root.
    pub(super) fn make_node(
        &self,
        ctx: &Context,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> Result<Entry> {
        let kind = match mode & S_IFMT {
            0 | S_IFREG => S_IFREG,
            k @ (S_IFIFO | S_IFSOCK) => k,
            k @ (S_IFCHR | S_IFBLK) if ctx.uid == 0 => k,
            S_IFCHR | S_IFBLK | S_IFDIR => return Err(Error::NotPermitted),
            _ => return Err(Error::InvalidArgument),
        };
        let (body, rdev) = match kind {
            S_IFREG => (Body::File(FileLock::default()), 0),
            S_IFCHR | S_IFBLK => (Body::Other, rdev),
            _ => (Body::Other, 0),
        };
        let inode = self.create_node(ctx, parent, name, kind, mode, umask, rdev, body)?;
        Ok(self.entry(&inode))
    }

    /// MKDIR.
    pub(super) fn make_dir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Entry> {
        let perm = mode & (0o777 | S_ISVTX);
        let inode = self.create_node(ctx, parent, name, S_IFDIR, perm, umask, 0, Body::Other)?;
        Ok(self.entry(&inode))
    }

    /// UNLINK: the inode stays while open or looked up.
    pub(super) fn unlink_name(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        check_name(name)?;
        let victim = {
            let mut tree = wr(&self.tree);
            let (p, pm) = self.search_dir(ctx, parent)?;
            let child = tree.get(&parent).ok_or(Error::NotFound)?.get(name).ok_or(Error::NotFound)?;
            let victim = self.inode(child.ino)?;
            if !pm.may(ctx, W_OK | X_OK) {
                return Err(Error::AccessDenied);
            }
            if pm.sticky_denies(ctx, victim.meta().uid) {
                return Err(Error::NotPermitted);
            }
            if victim.kind == S_IFDIR {
                return Err(Error::IsDir);
            }
            tree.remove(parent, name)?;
            let now = now();
            p.update(|m| {
                m.mtime = now;
                m.ctime = now;
            });
            victim.update(|m| {
                m.nlink = m.nlink.saturating_sub(1);
                m.ctime = now;
            });
            victim
        };
        self.maybe_evict(&victim);
        Ok(())
    }

    /// RMDIR of an empty directory.
    pub(super) fn remove_dir(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        match name {
            b"." => return Err(Error::InvalidArgument),
            b".." => return Err(Error::NotEmpty),
            _ => check_name(name)?,
        }
        let victim = {
            let mut tree = wr(&self.tree);
            let (p, pm) = self.search_dir(ctx, parent)?;
            let child = tree.get(&parent).ok_or(Error::NotFound)?.get(name).ok_or(Error::NotFound)?;
            let victim = self.inode(child.ino)?;
            if !pm.may(ctx, W_OK | X_OK) {
                return Err(Error::AccessDenied);
            }
            if pm.sticky_denies(ctx, victim.meta().uid) {
                return Err(Error::NotPermitted);
            }
            if victim.kind != S_IFDIR {
                return Err(Error::NotDir);
            }
            if tree.get(&child.ino).is_some_and(|d| !d.is_empty()) {
                return Err(Error::NotEmpty);
            }
            tree.remove_dir(child.ino);
            tree.remove(parent, name)?;
            let now = now();
            p.update(|m| {
                m.nlink = m.nlink.saturating_sub(1);
                m.mtime = now;
                m.ctime = now;
            });
            victim.update(|m| {
                m.nlink = 0;
                m.ctime = now;
            });
            victim
        };
        self.maybe_evict(&victim);
        Ok(())
    }

    /// RENAME, with `RENAME_NOREPLACE` or `RENAME_EXCHANGE`.
    pub(super) fn rename_entry(
        &self,
        ctx: &Context,
        olddir: u64,
        oldname: &[u8],
        newdir: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<()> {
        // Unknown bits and NOREPLACE with EXCHANGE are refused by the request decoder.
        let noreplace = flags & RENAME_NOREPLACE != 0;
        let exchange = flags & RENAME_EXCHANGE != 0;
        for name in [oldname, newname] {
            if name == b"." || name == b".." {
                return Err(Error::InvalidArgument);
            }
            check_name(name)?;
        }
        let victim = {
            let mut tree = wr(&self.tree);
            let (op, opm) = self.search_dir(ctx, olddir)?;
            let (np, npm) = self.search_dir(ctx, newdir)?;
            let src = tree.get(&olddir).ok_or(Error::NotFound)?.get(oldname).ok_or(Error::NotFound)?;
            let dst = tree.get(&newdir).ok_or(Error::NotFound)?.get(newname);
            if exchange && dst.is_none() {
                return Err(Error::NotFound);
            }
            if noreplace && dst.is_some() {
                return Err(Error::Exists);
            }
            if dst.is_some_and(|d| d.ino == src.ino) {
                // Two links to one inode: POSIX says do nothing.
                return Ok(());
            }
            if !opm.may(ctx, W_OK | X_OK) || !npm.may(ctx, W_OK | X_OK) {
                return Err(Error::AccessDenied);
            }
            let src_inode = self.inode(src.ino)?;
            let srcm = src_inode.meta();
            if opm.sticky_denies(ctx, srcm.uid) {
                return Err(Error::NotPermitted);
            }
            let dst_inode = dst.map(|d| self.inode(d.ino)).transpose()?;
            let dstm = dst_inode.as_ref().map(|i| i.meta());
            if dstm.as_ref().is_some_and(|m| npm.sticky_denies(ctx, m.uid)) {
                return Err(Error::NotPermitted);
            }
            let src_dir = src_inode.kind == S_IFDIR;
            let dst_dir = dst_inode.as_ref().is_some_and(|i| i.kind == S_IFDIR);
            if let (false, Some(d)) = (exchange, dst) {
                if src_dir && !dst_dir {
                    return Err(Error::NotDir);
                }
                if !src_dir && dst_dir {
                    return Err(Error::IsDir);
                }
                if dst_dir && tree.get(&d.ino).is_some_and(|d| !d.is_empty()) {
                    return Err(Error::NotEmpty);
                }
            }
            let moves = olddir != newdir;
            // A directory may not move below itself.
            if moves && src_dir && Self::is_ancestor(&tree, src.ino, newdir) {
                return Err(Error::InvalidArgument);
            }
            if let (true, true, true, Some(d)) = (exchange, moves, dst_dir, dst) {
                if Self::is_ancestor(&tree, d.ino, olddir) {
                    return Err(Error::InvalidArgument);
                }
            }
            // Moving a directory rewrites its "..", which needs write permission on it.
            if moves && src_dir && !srcm.may(ctx, W_OK) {
                return Err(Error::AccessDenied);
            }
            if moves && exchange && dst_dir && !dstm.is_some_and(|m| m.may(ctx, W_OK)) {
                return Err(Error::AccessDenied);
            }

            let now = now();
            let mut victim = None;
            tree.remove(olddir, oldname)?;
            if dst.is_some() {
                tree.remove(newdir, newname)?;
            }
            tree.insert(newdir, newname, src.ino, src_inode.kind)?;
            if moves && src_dir {
                tree.set_parent(src.ino, newdir)?;
                op.update(|m| m.nlink = m.nlink.saturating_sub(1));
                np.update(|m| m.nlink += 1);
            }
            if let (Some(d), Some(di)) = (dst, dst_inode) {
                if exchange {
                    tree.insert(olddir, oldname, d.ino, di.kind)?;
                    if moves && dst_dir {
                        tree.set_parent(d.ino, olddir)?;
                        np.update(|m| m.nlink = m.nlink.saturating_sub(1));
                        op.update(|m| m.nlink += 1);
                    }
                    di.update(|m| m.ctime = now);
                } else {
                    if dst_dir {
                        tree.remove_dir(d.ino);
                        np.update(|m| m.nlink = m.nlink.saturating_sub(1));
                        di.update(|m| m.nlink = 0);
                    } else {
                        di.update(|m| m.nlink = m.nlink.saturating_sub(1));
                    }
                    di.update(|m| m.ctime = now);
                    victim = Some(di);
                }
            }
            src_inode.update(|m| m.ctime = now);
            for p in [&op, &np] {
                p.update(|m| {
                    m.mtime = now;
                    m.ctime = now;
                });
            }
            victim
        };
        if let Some(v) = victim {
            self.maybe_evict(&v);
        }
        Ok(())
    }

    /// LINK: a new name for `ino` (also the first name of a linkable `O_TMPFILE` file).
    pub(super) fn link_inode(
        &self,
        ctx: &Context,
        ino: u64,
        newparent: u64,
        newname: &[u8],
    ) -> Result<Entry> {
        check_name(newname)?;
        let mut tree = wr(&self.tree);
        let inode = self.inode(ino)?;
        if inode.kind == S_IFDIR {
            return Err(Error::NotPermitted);
        }
        let (p, pm) = self.search_dir(ctx, newparent)?;
        if tree.get(&newparent).ok_or(Error::NotFound)?.get(newname).is_some() {
            return Err(Error::Exists);
        }
        if !pm.may(ctx, W_OK | X_OK) {
            return Err(Error::AccessDenied);
        }
        let now = now();
        {
            let mut m = inode.meta_mut();
            if m.nlink == 0 && !m.linkable {
                return Err(Error::NotFound);
            }
            // An O_TMPFILE file gets its first name (and is an ordinary file from now on).
            m.linkable = false;
            if m.nlink >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            m.nlink += 1;
            m.ctime = now;
        }
        tree.insert(newparent, newname, ino, inode.kind)?;
        p.update(|m| {
            m.mtime = now;
            m.ctime = now;
        });
        inode.add_lookups(1);
        Ok(self.entry(&inode))
    }

    /// READDIR from cookie `offset`.
    pub(super) fn list_dir(
        &self,
        _ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        sink: &mut DirSink<'_>,
    ) -> Result<()> {
        let h = self.handle(fh, ino)?;
        if h.inode.kind != S_IFDIR {
            return Err(Error::NotDir);
        }
        let tree = rd(&self.tree);
        let Some(dir) = tree.get(&ino) else {
            return Ok(()); // removed while open: empty
        };
        let dt_dir = S_IFDIR >> 12;
        let dots = [(ino, b".".as_slice()), (dir.parent, b"..".as_slice())];
        for (pos, (dot_ino, name)) in dots.into_iter().enumerate() {
            let pos = pos as u64;
            if offset <= pos {
                let e = DirEntry { ino: dot_ino, offset: pos + 1, typ: dt_dir, name };
                if !sink(e) {
                    return Ok(());
                }
            }
        }
        for (&cookie, name) in dir.order.range(offset.max(FIRST_COOKIE)..) {
            let Some(child) = dir.entries.get(name) else {
                continue;
            };
            let e = DirEntry { ino: child.ino, offset: cookie + 1, typ: child.typ, name };
            if !sink(e) {
                break;
            }
        }
        Ok(())
    }

    /// READDIRPLUS from cookie `offset`; each entry handed out is a kernel reference.
    pub(super) fn list_dir_plus(
        &self,
        _ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        sink: &mut DirPlusSink<'_>,
    ) -> Result<()> {
        let h = self.handle(fh, ino)?;
        if h.inode.kind != S_IFDIR {
            return Err(Error::NotDir);
        }
        let tree = rd(&self.tree);
        let Some(dir) = tree.get(&ino) else {
            return Ok(());
        };
        let dt_dir = S_IFDIR >> 12;
        let dots = [(ino, b".".as_slice()), (dir.parent, b"..".as_slice())];
        for (pos, (dot_ino, name)) in dots.into_iter().enumerate() {
            let pos = pos as u64;
            if offset <= pos {
                let e = DirEntry { ino: dot_ino, offset: pos + 1, typ: dt_dir, name };
                // Node id 0: the kernel takes no reference for "." and "..".
                let entry = Entry {
                    attr: Stat { ino: dot_ino, mode: S_IFDIR, ..Stat::default() },
                    ..Entry::default()
                };
                if !sink(e, &entry) {
                    return Ok(());
                }
            }
        }
        for (&cookie, name) in dir.order.range(offset.max(FIRST_COOKIE)..) {
            let Some(child) = dir.entries.get(name) else {
                continue;
            };
            let Ok(inode) = self.inode(child.ino) else {
                continue;
            };
            let e = DirEntry { ino: child.ino, offset: cookie + 1, typ: child.typ, name };
            if !sink(e, &self.entry(&inode)) {
                break;
            }
            inode.add_lookups(1);
        }
        Ok(())
    }

    /// CREATE: a new regular file, opened (or, without `O_EXCL`, the existing one).
    pub(super) fn create_file(
        &self,
        ctx: &Context,
        parent: u64,
        args: &CreateArgs<'_>,
    ) -> Result<(Entry, Opened)> {
        let CreateArgs { name, mode, flags, umask, kill_priv } = *args;
        if !matches!(flags & O_ACCMODE, O_RDONLY | O_WRONLY | O_RDWR) {
            return Err(Error::InvalidArgument);
        }
        let body = Body::File(FileLock::default());
        match self.create_node(ctx, parent, name, S_IFREG, mode, umask, 0, body) {
            Ok(inode) => {
                let opened = self.open_inode(ctx, inode.clone(), flags & !O_TRUNC, false, false);
                match opened {
                    Ok(opened) => Ok((self.entry(&inode), opened)),
                    Err(e) => {
                        self.forget_node(ctx, inode.ino, 1);
                        Err(e)
                    }
                }
            }
            Err(Error::Exists) if flags & O_EXCL == 0 => {
                let entry = self.lookup_name(ctx, parent, name)?;
                let inode = self.inode(entry.ino)?;
                if inode.kind == S_IFDIR {
                    self.forget_node(ctx, entry.ino, 1);
                    return Err(Error::IsDir);
                }
                match self.open_inode(ctx, inode.clone(), flags, true, kill_priv) {
                    Ok(opened) => Ok((self.entry(&inode), opened)),
                    Err(e) => {
                        self.forget_node(ctx, entry.ino, 1);
                        Err(e)
                    }
                }
            }
            Err(e) => Err(e),
        }
    }

    /// TMPFILE: an open file without a name.
    pub(super) fn create_tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> Result<(Entry, Opened)> {
        // O_TMPFILE needs a writable descriptor.
        if !matches!(flags & O_ACCMODE, O_WRONLY | O_RDWR) {
            return Err(Error::InvalidArgument);
        }
        let inode = {
            let tree = rd(&self.tree);
            let (_, pm) = self.search_dir(ctx, parent)?;
            if !tree.contains_key(&parent) {
                return Err(Error::NotFound); // removed while open
            }
            if !pm.may(ctx, W_OK | X_OK) {
                return Err(Error::AccessDenied);
            }
            let inode = self.new_inode(ctx, &pm, S_IFREG, mode, umask, 0, Body::File(FileLock::default()))?;
            inode.update(|m| {
                m.nlink = 0;
                m.linkable = flags & O_EXCL == 0;
            });
            self.inodes.insert(inode.ino, inode.clone());
            inode
        };
        match self.open_inode(ctx, inode.clone(), flags & !O_TRUNC, false, false) {
            Ok(opened) => Ok((self.entry(&inode), opened)),
            Err(e) => {
                self.forget_node(ctx, inode.ino, 1);
                Err(e)
            }
        }
    }
}
