//! [`RamFs`]: an in-memory filesystem with POSIX semantics (permission bits, POSIX ACLs, extended
//! attributes; advisory locks are the server's), checked against the caller's uid/gid. Linux's
//! virtio-fs mounts with `default_permissions` (and negotiating `FUSE_POSIX_ACL` would turn it on
//! anyway), so the guest kernel checks first, with the caller's supplementary groups; our checks
//! are a second line, for a guest kernel that skips its own. FUSE tells us of a supplementary
//! group only on creations, when it owns the parent directory (`FUSE_CREATE_SUPP_GROUP`, see
//! [`Context`]); group checks count it ([`Context::in_group`]). A new node's group is the
//! directory's when the directory is set-group-id, else the caller's fsgid, never the
//! supplementary group.
//!
//! Layout and locking:
//! - `inodes`: node id -> `Arc<Inode>`, sharded `RwLock<HashMap>`s. An inode stays while it has a
//!   link, a kernel lookup reference or an open handle, so unlinked-but-open files keep their data.
//! - `tree`: one `RwLock` over the contents of every directory. Lookups and listings share it;
//!   namespace changes (create, unlink, rename, ...) take it exclusively, which makes cross-directory
//!   rename and its "not into your own subtree" check simple and race-free. It is never held while
//!   file data is copied.
//! - Per inode, `meta` (attributes) and, for regular files, `data` (sparse 64 KiB chunks, so holes
//!   cost nothing and a guest cannot make us allocate by extending a file). READ/WRITE copy straight
//!   between the chunks and guest memory under the file's own lock.
//! - `handles`: file handle -> `Arc<Handle>`, sharded like `inodes`.
//! - Per inode also `xattrs` (extended attributes other than ACLs; the ACLs live in `meta`, where
//!   the permission checks read them). Advisory locks are the server's ([`crate::locks`]); the
//!   filesystem only vouches for the handles they come through.
//!
//! Lock order: `tree` -> an `inodes`/`handles` shard -> `data` -> `meta` -> `xattrs`; at most one
//! `meta` at a time (COPY_FILE_RANGE takes two `data` locks, in inode-number order). Capacity (bytes of chunks, extended attributes and ACLs) and inode count are
//! bounded by [`RamFsConfig`].

use std::collections::btree_map;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::abi::{self, ROOT_ID};
use crate::filesystem::{
    CachePolicy, Context, DirEntry, DirPlusSink, DirSink, Entry, Error, FileSystem, LockAccess, Opened,
    Result, SetAttr, SetTime, Stat, StatFs, Statx, Timespec, XattrReply,
};
use crate::io::{Reader, Writer};

mod acl;
mod node;
mod xattr;

use node::{coarse_secs, dir_mut, now, rd, stat_of, wr, Body, Dir, FileData, Inode, Meta, Table, Tree};

pub use xattr::XATTR_INODE_MAX;

/// Longest name component.
pub const NAME_MAX: usize = 255;
/// Longest symlink target (`PATH_MAX` without the NUL).
pub const SYMLINK_MAX: usize = 4095;
/// Most hard links an inode may have.
pub const LINK_MAX: u32 = 65_000;
/// Largest file size (the kernel's `MAX_LFS_FILESIZE`).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Most bytes one COPY_FILE_RANGE copies; the caller loops for more (a copy may be short), and a
/// poller is never held longer than this much copying takes.
pub const MAX_COPY: u64 = 16 << 20;

const CHUNK: usize = 64 * 1024;
const CHUNK64: u64 = CHUNK as u64;
const BLOCK_SIZE: u32 = 4096;
const SHARDS: usize = 16;
/// READDIR positions 0 and 1 are `.` and `..`; entries get cookies from here on.
const FIRST_COOKIE: u64 = 2;

const S_IFMT: u32 = libc::S_IFMT;
const S_IFREG: u32 = libc::S_IFREG;
const S_IFDIR: u32 = libc::S_IFDIR;
const S_IFLNK: u32 = libc::S_IFLNK;
const S_IFIFO: u32 = libc::S_IFIFO;
const S_IFSOCK: u32 = libc::S_IFSOCK;
const S_IFCHR: u32 = libc::S_IFCHR;
const S_IFBLK: u32 = libc::S_IFBLK;
const S_ISUID: u32 = libc::S_ISUID;
const S_ISGID: u32 = libc::S_ISGID;
const S_ISVTX: u32 = libc::S_ISVTX;
const S_IXGRP: u32 = libc::S_IXGRP;
const O_ACCMODE: u32 = libc::O_ACCMODE as u32;
const O_RDONLY: u32 = libc::O_RDONLY as u32;
const O_WRONLY: u32 = libc::O_WRONLY as u32;
const O_RDWR: u32 = libc::O_RDWR as u32;
const O_TRUNC: u32 = libc::O_TRUNC as u32;
const O_EXCL: u32 = libc::O_EXCL as u32;
const O_APPEND: u32 = libc::O_APPEND as u32;
const SEEK_SET: u32 = libc::SEEK_SET as u32;
const SEEK_CUR: u32 = libc::SEEK_CUR as u32;
const SEEK_END: u32 = libc::SEEK_END as u32;
const SEEK_DATA: u32 = libc::SEEK_DATA as u32;
const SEEK_HOLE: u32 = libc::SEEK_HOLE as u32;
const R_OK: u32 = 4;
const W_OK: u32 = 2;
const X_OK: u32 = 1;
const FALLOC_FL_KEEP_SIZE: u32 = libc::FALLOC_FL_KEEP_SIZE as u32;
const FALLOC_FL_PUNCH_HOLE: u32 = libc::FALLOC_FL_PUNCH_HOLE as u32;
const RENAME_NOREPLACE: u32 = libc::RENAME_NOREPLACE;
const RENAME_EXCHANGE: u32 = libc::RENAME_EXCHANGE;

/// Tunables of a [`RamFs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamFsConfig {
    /// What the guest kernel may cache (entry and attribute timeouts, page-cache flags). The
    /// default is [`CachePolicy::Always`]: only the guest changes a RAM filesystem, and the guest
    /// kernel invalidates what its own operations change.
    pub cache: CachePolicy,
    /// Bytes of file data the filesystem may hold.
    pub capacity: u64,
    /// Inodes the filesystem may hold.
    pub max_inodes: u64,
    /// Permission bits of the root directory (owned by 0:0).
    pub root_mode: u32,
    /// Accept `FUSE_POSIX_ACL`. ACLs are stored, inherited and enforced here either way (a kernel
    /// without the flag passes `system.posix_acl_*` through on an initial-namespace mount); with
    /// it the guest kernel also caches them and checks permissions itself, as with
    /// `default_permissions`, which costs a GETATTR (and, for non-owners, a GETXATTR of the ACL)
    /// per permission check once the attribute timeout has passed.
    pub posix_acl: bool,
}

impl Default for RamFsConfig {
    fn default() -> Self {
        RamFsConfig {
            cache: CachePolicy::Always,
            capacity: 1 << 30,
            max_inodes: 1 << 20,
            root_mode: 0o755,
            posix_acl: true,
        }
    }
}

struct Handle {
    inode: Arc<Inode>,
    flags: u32,
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

fn resolve(t: SetTime, now: Timespec) -> Timespec {
    match t {
        SetTime::Now => now,
        SetTime::At(t) => t,
    }
}

/// An in-memory POSIX filesystem. See the module documentation.
pub struct RamFs {
    cfg: RamFsConfig,
    tree: RwLock<Tree>,
    inodes: Table<Arc<Inode>>,
    handles: Table<Arc<Handle>>,
    next_ino: AtomicU64,
    next_fh: AtomicU64,
    /// Bytes of allocated chunks.
    used: AtomicU64,
    /// Live inodes.
    ninodes: AtomicU64,
    /// `FUSE_INIT` flags of the session (what `init` accepted).
    session: AtomicU64,
}

impl Default for RamFs {
    fn default() -> Self {
        Self::new()
    }
}

impl RamFs {
    /// An empty filesystem with the default [`RamFsConfig`].
    pub fn new() -> Self {
        Self::with_config(RamFsConfig::default())
    }

    /// An empty filesystem: just the root directory.
    pub fn with_config(cfg: RamFsConfig) -> Self {
        let meta = Meta::new(S_IFDIR | (cfg.root_mode & 0o7777), 0, 0, 2, 0, u64::from(BLOCK_SIZE));
        let root = Arc::new(Inode::new(ROOT_ID, S_IFDIR, meta, 0, Body::Other));
        let fs = RamFs {
            cfg,
            tree: RwLock::default(),
            inodes: Table::new(),
            handles: Table::new(),
            next_ino: AtomicU64::new(ROOT_ID + 1),
            next_fh: AtomicU64::new(1),
            used: AtomicU64::new(0),
            ninodes: AtomicU64::new(1),
            session: AtomicU64::new(0),
        };
        fs.inodes.insert(ROOT_ID, root);
        wr(&fs.tree).insert(ROOT_ID, Dir::new(ROOT_ID));
        fs
    }

    /// Bytes of file data currently allocated.
    pub fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Inodes currently alive (linked, looked up by the kernel, or open).
    pub fn inode_count(&self) -> u64 {
        self.ninodes.load(Ordering::Relaxed)
    }

    /// Lookup references the kernel holds on `ino` (`None` if the inode is gone).
    pub fn lookup_count(&self, ino: u64) -> Option<u64> {
        self.inodes.get(ino).map(|i| i.lookups.load(Ordering::Relaxed))
    }

    fn inode(&self, ino: u64) -> Result<Arc<Inode>> {
        self.inodes.get(ino).ok_or(Error::NotFound)
    }

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
        let may = self.inodes.with(parent, |p| p.kind == S_IFDIR && rd(&p.meta).may(ctx, X_OK));
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

    fn entry(&self, inode: &Inode) -> Entry {
        Entry {
            ino: inode.ino,
            generation: 0,
            attr: inode.stat(),
            entry_timeout: self.cfg.cache.timeout(),
            attr_timeout: self.cfg.cache.timeout(),
        }
    }

    fn handle(&self, fh: u64, ino: u64) -> Result<Arc<Handle>> {
        self.handles.get(fh).filter(|h| h.inode.ino == ino).ok_or(Error::BadHandle)
    }

    /// Drops `inode` once nothing refers to it any more.
    fn maybe_evict(&self, inode: &Inode) {
        if inode.ino == ROOT_ID {
            return;
        }
        let evicted = {
            let mut shard = wr(self.inodes.shard(inode.ino));
            let unused = inode.lookups.load(Ordering::Acquire) == 0
                && inode.opens.load(Ordering::Acquire) == 0
                && rd(&inode.meta).nlink == 0;
            if unused {
                shard.remove(&inode.ino)
            } else {
                None
            }
        };
        if let Some(gone) = evicted {
            self.free_inode(&gone);
        }
    }

    fn free_inode(&self, inode: &Inode) {
        self.ninodes.fetch_sub(1, Ordering::Relaxed);
        if let Body::File(data) = &inode.body {
            let mut data = wr(data);
            let n = data.chunks.len();
            data.chunks.clear();
            self.release_chunks(n);
        }
        let mut m = wr(&inode.meta);
        self.uncharge(m.xattr_bytes);
        m.xattr_bytes = 0;
    }

    /// Takes `bytes` of the capacity.
    fn charge(&self, bytes: u64) -> Result<()> {
        let cap = self.cfg.capacity;
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_add(bytes).filter(|&n| n <= cap))
            .map(|_| ())
            .map_err(|_| Error::NoSpace)
    }

    fn uncharge(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    fn alloc_chunk(&self) -> Result<Box<[u8]>> {
        self.charge(CHUNK64)?;
        Ok(vec![0u8; CHUNK].into_boxed_slice())
    }

    fn release_chunks(&self, n: usize) {
        self.uncharge(n as u64 * CHUNK64);
    }

    /// Whether `HANDLE_KILLPRIV_V2` is in force: the kernel then flags the writes, truncates and
    /// opens that must clear set-user-id/set-group-id.
    fn killpriv_v2(&self) -> bool {
        self.session.load(Ordering::Relaxed) & abi::init::HANDLE_KILLPRIV_V2 != 0
    }

    /// Whether a write or truncate by `ctx` clears set-user-id/set-group-id: with
    /// `HANDLE_KILLPRIV_V2` the kernel's `flag` says so (the caller lacks `CAP_FSETID`); otherwise
    /// every non-root caller is taken to lack it.
    fn kills_suid(&self, ctx: &Context, flag: bool) -> bool {
        flag || (!self.killpriv_v2() && ctx.uid != 0)
    }

    /// What a write, truncate or chown does to privileges, the caller holding the inode's `meta`:
    /// clears set-user-id/set-group-id when `kill` (see [`Meta::kill_suid`]) and, whoever the
    /// caller, drops `security.capability`. Returns whether the mode changed.
    fn kill_priv(&self, inode: &Inode, m: &mut Meta, ctx: &Context, kill: bool) -> bool {
        if m.fcaps {
            self.drop_fcaps(inode, m);
        }
        kill && m.kill_suid(ctx)
    }

    /// Sets the size of a file whose data and meta locks the caller holds.
    fn truncate_locked(&self, data: &mut FileData, m: &mut Meta, size: u64) {
        if size < m.size {
            let dropped = data.chunks.split_off(&size.div_ceil(CHUNK64));
            self.release_chunks(dropped.len());
            let tail = (size % CHUNK64) as usize;
            if tail != 0 {
                if let Some(chunk) = data.chunks.get_mut(&(size / CHUNK64)) {
                    chunk[tail..].fill(0);
                }
            }
        }
        m.size = size;
        m.blocks = data.blocks();
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
        let dir = dir_mut(&mut tree, parent)?;
        if dir.get(name).is_some() {
            return Err(Error::Exists);
        }
        if !pm.may(ctx, W_OK | X_OK) {
            return Err(Error::AccessDenied);
        }
        let inode = self.new_inode(ctx, &pm, kind, perm, umask, rdev, body)?;
        dir.insert(name, inode.ino, kind);
        if kind == S_IFDIR {
            tree.insert(inode.ino, Dir::new(parent));
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
    fn new_inode(
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
        self.ninodes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.cfg.max_inodes).then_some(n + 1))
            .map_err(|_| Error::NoSpace)?;
        if let Err(e) = self.charge(acl_bytes as u64) {
            self.ninodes.fetch_sub(1, Ordering::Relaxed);
            return Err(e);
        }
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
        Ok(Arc::new(Inode::new(ino, kind, meta, 1, body)))
    }

    /// Opens `inode`, checking permissions when `check`, truncating on `O_TRUNC` (which clears
    /// privileges as a truncate does; `kill_priv` is the kernel's say, see [`Self::kills_suid`]).
    fn open_inode(
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
        if let (true, Body::File(data)) = (trunc, &inode.body) {
            let mut data = wr(data);
            let mut m = wr(&inode.meta);
            self.truncate_locked(&mut data, &mut m, 0);
            let now = now();
            m.mtime = now;
            m.ctime = now;
            let kill = self.kills_suid(ctx, kill_priv);
            self.kill_priv(&inode, &mut m, ctx, kill);
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        inode.opens.fetch_add(1, Ordering::AcqRel);
        let open_flags = if inode.kind == S_IFDIR {
            self.cfg.cache.dir_open_flags()
        } else {
            self.cfg.cache.file_open_flags()
        };
        self.handles.insert(fh, Arc::new(Handle { inode, flags }));
        Ok(Opened { fh, open_flags })
    }

    /// Drops handle `fh`.
    fn release_handle(&self, ino: u64, fh: u64) -> Result<()> {
        let h = self.handles.remove_if(fh, |h| h.inode.ino == ino).ok_or(Error::BadHandle)?;
        h.inode.opens.fetch_sub(1, Ordering::AcqRel);
        self.maybe_evict(&h.inode);
        Ok(())
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

    fn write_chunks(
        &self,
        data: &mut FileData,
        offset: u64,
        len: usize,
        r: &mut Reader<'_>,
    ) -> Result<usize> {
        let mut done = 0;
        while done < len {
            let pos = offset + done as u64;
            let at = (pos % CHUNK64) as usize;
            let n = (CHUNK - at).min(len - done);
            let chunk = match data.chunks.entry(pos / CHUNK64) {
                btree_map::Entry::Occupied(e) => e.into_mut(),
                btree_map::Entry::Vacant(v) => match self.alloc_chunk() {
                    Ok(c) => v.insert(c),
                    Err(e) if done == 0 => return Err(e),
                    Err(_) => break,
                },
            };
            r.read_exact(&mut chunk[at..at + n])?;
            done += n;
        }
        Ok(done)
    }

    /// Copies `count` bytes at `off_in` of `src` (`None`: `dst` itself) to `off_out` of `dst`, a
    /// piece within one chunk of each at a time: holes in the source stay holes, or zero what the
    /// destination had there. Short when the capacity runs out after something was copied.
    fn copy_chunks(
        &self,
        src: Option<&FileData>,
        dst: &mut FileData,
        off_in: u64,
        off_out: u64,
        count: usize,
    ) -> Result<usize> {
        let mut bounce = [0u8; 4096];
        let mut done = 0;
        while done < count {
            let (pi, po) = (off_in + done as u64, off_out + done as u64);
            let (ai, ao) = ((pi % CHUNK64) as usize, (po % CHUNK64) as usize);
            let (ci, co) = (pi / CHUNK64, po / CHUNK64);
            let n = (CHUNK - ai).min(CHUNK - ao).min(count - done);
            if !src.unwrap_or(dst).chunks.contains_key(&ci) {
                if let Some(to) = dst.chunks.get_mut(&co) {
                    to[ao..ao + n].fill(0);
                }
                done += n;
                continue;
            }
            if let btree_map::Entry::Vacant(v) = dst.chunks.entry(co) {
                match self.alloc_chunk() {
                    Ok(c) => {
                        v.insert(c);
                    }
                    Err(e) if done == 0 => return Err(e),
                    Err(_) => break,
                }
            }
            match src {
                Some(s) => {
                    if let (Some(from), Some(to)) = (s.chunks.get(&ci), dst.chunks.get_mut(&co)) {
                        to[ao..ao + n].copy_from_slice(&from[ai..ai + n]);
                    }
                }
                None if ci == co => {
                    if let Some(c) = dst.chunks.get_mut(&co) {
                        c.copy_within(ai..ai + n, ao);
                    }
                }
                None => {
                    // Two chunks of one map: through a small buffer.
                    let mut at = 0;
                    while at < n {
                        let k = (n - at).min(bounce.len());
                        if let Some(from) = dst.chunks.get(&ci) {
                            bounce[..k].copy_from_slice(&from[ai + at..ai + at + k]);
                        }
                        if let Some(to) = dst.chunks.get_mut(&co) {
                            to[ao + at..ao + at + k].copy_from_slice(&bounce[..k]);
                        }
                        at += k;
                    }
                }
            }
            done += n;
        }
        Ok(done)
    }

    /// Relatime: bump atime when it is older than mtime/ctime or a day old.
    fn touch_atime(&self, inode: &Inode) {
        if atime_stale(&rd(&inode.meta)) {
            let now = now();
            inode.update(|m| m.atime = now);
        }
    }
}

/// Whether a read should update atime (relatime): atime is not newer than mtime or ctime, or is
/// a day old. The day is measured on the coarse clock (no TSC read; it lags by at most a tick,
/// so the update can come that much later); the time stored is the precise one.
fn atime_stale(m: &Meta) -> bool {
    m.atime <= m.mtime || m.atime <= m.ctime || coarse_secs().saturating_sub(m.atime.sec) >= 24 * 3600
}

fn read_chunks(data: &FileData, offset: u64, len: usize, w: &mut Writer<'_>) -> Result<()> {
    let mut done = 0;
    while done < len {
        let pos = offset + done as u64;
        let at = (pos % CHUNK64) as usize;
        let n = (CHUNK - at).min(len - done);
        match data.chunks.get(&(pos / CHUNK64)) {
            Some(chunk) => w.write_all(&chunk[at..at + n])?,
            None => w.write_zeros(n)?,
        }
        done += n;
    }
    Ok(())
}

impl FileSystem for RamFs {
    fn init(&self, capable: u64) -> Result<u64> {
        // Everything the server can honour suits us: HANDLE_KILLPRIV(_V2) (see `kill_priv`),
        // DONT_MASK and POSIX_ACL (see `new_inode`, `xattr.rs` and `Meta::may`).
        let mut wanted = capable;
        if !self.cfg.posix_acl {
            wanted &= !abi::init::POSIX_ACL;
        }
        self.session.store(wanted, Ordering::Relaxed);
        Ok(wanted)
    }

    fn destroy(&self) {
        for shard in self.handles.shards.iter() {
            wr(shard).clear();
        }
        let mut gone = Vec::new();
        for shard in self.inodes.shards.iter() {
            let mut shard = wr(shard);
            shard.retain(|_, inode| {
                inode.lookups.store(0, Ordering::Release);
                inode.opens.store(0, Ordering::Release);
                let keep = inode.ino == ROOT_ID || rd(&inode.meta).nlink > 0;
                if !keep {
                    gone.push(inode.clone());
                }
                keep
            });
        }
        for inode in gone {
            self.free_inode(&inode);
        }
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<Entry> {
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
                child.lookups.fetch_add(1, Ordering::AcqRel);
                self.entry(child)
            })
            .ok_or(Error::NotFound)
    }

    fn forget(&self, _ctx: &Context, ino: u64, nlookup: u64) {
        let Some(inode) = self.inodes.get(ino) else {
            return;
        };
        let _ = inode
            .lookups
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(nlookup)));
        self.maybe_evict(&inode);
    }

    fn getattr(&self, _ctx: &Context, ino: u64, _fh: Option<u64>) -> Result<(Stat, Duration)> {
        let st = self.inodes.with(ino, |i| i.stat()).ok_or(Error::NotFound)?;
        Ok((st, self.cfg.cache.timeout()))
    }

    fn setattr(&self, ctx: &Context, ino: u64, attr: &SetAttr) -> Result<(Stat, Duration)> {
        let inode = self.inode(ino)?;
        let handle = attr.fh.map(|fh| self.handle(fh, ino)).transpose()?;
        let mut data = match (attr.size, &inode.body) {
            (None, _) => None,
            (Some(size), Body::File(d)) => {
                if size > MAX_FILE_SIZE {
                    return Err(Error::FileTooLarge);
                }
                Some(wr(d))
            }
            (Some(_), _) if inode.kind == S_IFDIR => return Err(Error::IsDir),
            (Some(_), _) => return Err(Error::InvalidArgument),
        };
        let mut m = wr(&inode.meta);
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
        let explicit_time =
            matches!(attr.atime, Some(SetTime::At(_))) || matches!(attr.mtime, Some(SetTime::At(_)));
        if explicit_time && !owner {
            return Err(Error::NotPermitted);
        }
        // A handle open for writing (ftruncate, which also sets mtime to now) already proved
        // write access.
        let write_handle = handle.as_ref().is_some_and(|h| h.flags & O_ACCMODE != O_RDONLY);
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

    fn readlink(&self, _ctx: &Context, ino: u64) -> Result<Vec<u8>> {
        match &self.inode(ino)?.body {
            Body::Symlink(target) => Ok(target.to_vec()),
            _ => Err(Error::InvalidArgument),
        }
    }

    fn symlink(&self, ctx: &Context, parent: u64, name: &[u8], target: &[u8]) -> Result<Entry> {
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

    fn mknod(
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
            S_IFREG => (Body::File(RwLock::default()), 0),
            S_IFCHR | S_IFBLK => (Body::Other, rdev),
            _ => (Body::Other, 0),
        };
        let inode = self.create_node(ctx, parent, name, kind, mode, umask, rdev, body)?;
        Ok(self.entry(&inode))
    }

    fn mkdir(&self, ctx: &Context, parent: u64, name: &[u8], mode: u32, umask: u32) -> Result<Entry> {
        let perm = mode & (0o777 | S_ISVTX);
        let inode = self.create_node(ctx, parent, name, S_IFDIR, perm, umask, 0, Body::Other)?;
        Ok(self.entry(&inode))
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        check_name(name)?;
        let victim = {
            let mut tree = wr(&self.tree);
            let (p, pm) = self.search_dir(ctx, parent)?;
            let dir = dir_mut(&mut tree, parent)?;
            let child = dir.get(name).ok_or(Error::NotFound)?;
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
            dir.remove(name);
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

    fn rmdir(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        match name {
            b"." => return Err(Error::InvalidArgument),
            b".." => return Err(Error::NotEmpty),
            _ => check_name(name)?,
        }
        let victim = {
            let mut tree = wr(&self.tree);
            let (p, pm) = self.search_dir(ctx, parent)?;
            let child = dir_mut(&mut tree, parent)?.get(name).ok_or(Error::NotFound)?;
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
            tree.remove(&child.ino);
            dir_mut(&mut tree, parent)?.remove(name);
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

    fn rename(
        &self,
        ctx: &Context,
        olddir: u64,
        oldname: &[u8],
        newdir: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<()> {
        let noreplace = flags & RENAME_NOREPLACE != 0;
        let exchange = flags & RENAME_EXCHANGE != 0;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 || (noreplace && exchange) {
            return Err(Error::InvalidArgument);
        }
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
            let src = dir_mut(&mut tree, olddir)?.get(oldname).ok_or(Error::NotFound)?;
            let dst = dir_mut(&mut tree, newdir)?.get(newname);
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
            dir_mut(&mut tree, olddir)?.remove(oldname);
            if dst.is_some() {
                dir_mut(&mut tree, newdir)?.remove(newname);
            }
            dir_mut(&mut tree, newdir)?.insert(newname, src.ino, src_inode.kind);
            if moves && src_dir {
                dir_mut(&mut tree, src.ino)?.parent = newdir;
                op.update(|m| m.nlink = m.nlink.saturating_sub(1));
                np.update(|m| m.nlink += 1);
            }
            if let (Some(d), Some(di)) = (dst, dst_inode) {
                if exchange {
                    dir_mut(&mut tree, olddir)?.insert(oldname, d.ino, di.kind);
                    if moves && dst_dir {
                        dir_mut(&mut tree, d.ino)?.parent = olddir;
                        np.update(|m| m.nlink = m.nlink.saturating_sub(1));
                        op.update(|m| m.nlink += 1);
                    }
                    di.update(|m| m.ctime = now);
                } else {
                    if dst_dir {
                        tree.remove(&d.ino);
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

    fn link(&self, ctx: &Context, ino: u64, newparent: u64, newname: &[u8]) -> Result<Entry> {
        check_name(newname)?;
        let mut tree = wr(&self.tree);
        let inode = self.inode(ino)?;
        if inode.kind == S_IFDIR {
            return Err(Error::NotPermitted);
        }
        let (p, pm) = self.search_dir(ctx, newparent)?;
        let dir = dir_mut(&mut tree, newparent)?;
        if dir.get(newname).is_some() {
            return Err(Error::Exists);
        }
        if !pm.may(ctx, W_OK | X_OK) {
            return Err(Error::AccessDenied);
        }
        let now = now();
        {
            let mut m = wr(&inode.meta);
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
        dir.insert(newname, ino, inode.kind);
        p.update(|m| {
            m.mtime = now;
            m.ctime = now;
        });
        inode.lookups.fetch_add(1, Ordering::AcqRel);
        Ok(self.entry(&inode))
    }

    fn open(&self, ctx: &Context, ino: u64, flags: u32, kill_priv: bool) -> Result<Opened> {
        let inode = self.inode(ino)?;
        self.open_inode(ctx, inode, flags, true, kill_priv)
    }

    fn read(
        &self,
        _ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        w: &mut Writer<'_>,
    ) -> Result<usize> {
        // The kernel checks the descriptor's access mode; it may read through any handle of the
        // file (e.g. for page cache fills), so none is enforced here.
        let h = self.handle(fh, ino)?;
        let Body::File(data) = &h.inode.body else {
            return Err(if h.inode.kind == S_IFDIR { Error::IsDir } else { Error::InvalidArgument });
        };
        let (n, stale) = {
            let data = rd(data);
            // One look at the attributes: the size (stable while we hold `data`: every size
            // change holds it for writing) and whether atime is due.
            let (size_now, stale) = {
                let m = rd(&h.inode.meta);
                (m.size, atime_stale(&m))
            };
            if offset >= size_now {
                (0, stale)
            } else {
                let n = u64::from(size).min(size_now - offset) as usize;
                read_chunks(&data, offset, n, w)?;
                (n, stale)
            }
        };
        if stale {
            let now = now();
            h.inode.update(|m| m.atime = now);
        }
        Ok(n)
    }

    fn write(
        &self,
        ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        write_flags: u32,
        r: &mut Reader<'_>,
    ) -> Result<usize> {
        let h = self.handle(fh, ino)?;
        if h.flags & O_ACCMODE == O_RDONLY {
            return Err(Error::BadHandle);
        }
        let Body::File(data) = &h.inode.body else {
            return Err(Error::InvalidArgument);
        };
        let len = size as usize;
        offset.checked_add(u64::from(size)).filter(|&end| end <= MAX_FILE_SIZE).ok_or(Error::FileTooLarge)?;
        if len == 0 {
            return Ok(0);
        }
        let mut data = wr(data);
        let written = self.write_chunks(&mut data, offset, len, r)?;
        let now = now();
        let mut m = wr(&h.inode.meta);
        m.size = m.size.max(offset + written as u64);
        m.blocks = data.blocks();
        m.mtime = now;
        m.ctime = now;
        let kill = self.kills_suid(ctx, write_flags & abi::write_flags::KILL_SUIDGID != 0);
        if kill || m.fcaps {
            self.kill_priv(&h.inode, &mut m, ctx, kill);
        }
        Ok(written)
    }

    fn flush(&self, _ctx: &Context, ino: u64, fh: u64, _lock_owner: u64) -> Result<()> {
        // Nothing is buffered; the server drops the closing process's locks.
        self.handle(fh, ino).map(|_| ())
    }

    fn release(&self, _ctx: &Context, ino: u64, fh: u64, _flags: u32, _lock_owner: u64) -> Result<()> {
        self.release_handle(ino, fh)
    }

    fn fsync(&self, _ctx: &Context, ino: u64, fh: u64, _datasync: bool) -> Result<()> {
        self.handle(fh, ino).map(|_| ())
    }

    fn opendir(&self, ctx: &Context, ino: u64, flags: u32) -> Result<Opened> {
        let inode = self.inode(ino)?;
        if inode.kind != S_IFDIR {
            return Err(Error::NotDir);
        }
        self.open_inode(ctx, inode, flags & !O_TRUNC, true, false)
    }

    fn readdir(&self, _ctx: &Context, ino: u64, fh: u64, offset: u64, sink: &mut DirSink<'_>) -> Result<()> {
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

    fn readdirplus(
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
            inode.lookups.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }

    fn releasedir(&self, _ctx: &Context, ino: u64, fh: u64, _flags: u32) -> Result<()> {
        self.release_handle(ino, fh)
    }

    fn fsyncdir(&self, _ctx: &Context, ino: u64, fh: u64, _datasync: bool) -> Result<()> {
        self.handle(fh, ino).map(|_| ())
    }

    fn statfs(&self, _ctx: &Context, _ino: u64) -> Result<StatFs> {
        let bsize = u64::from(BLOCK_SIZE);
        let free = self.cfg.capacity.saturating_sub(self.used.load(Ordering::Relaxed)) / bsize;
        let ffree = self.cfg.max_inodes.saturating_sub(self.ninodes.load(Ordering::Relaxed));
        Ok(StatFs {
            blocks: self.cfg.capacity / bsize,
            bfree: free,
            bavail: free,
            files: self.cfg.max_inodes,
            ffree,
            bsize: BLOCK_SIZE,
            namelen: NAME_MAX as u32,
            frsize: BLOCK_SIZE,
        })
    }

    fn access(&self, ctx: &Context, ino: u64, mask: u32) -> Result<()> {
        let m = self.inode(ino)?.meta();
        let mask = mask & (R_OK | W_OK | X_OK);
        if mask == 0 || m.may(ctx, mask) {
            Ok(())
        } else {
            Err(Error::AccessDenied)
        }
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: u32,
        umask: u32,
        kill_priv: bool,
    ) -> Result<(Entry, Opened)> {
        if !matches!(flags & O_ACCMODE, O_RDONLY | O_WRONLY | O_RDWR) {
            return Err(Error::InvalidArgument);
        }
        let body = Body::File(RwLock::default());
        match self.create_node(ctx, parent, name, S_IFREG, mode, umask, 0, body) {
            Ok(inode) => {
                let opened = self.open_inode(ctx, inode.clone(), flags & !O_TRUNC, false, false);
                match opened {
                    Ok(opened) => Ok((self.entry(&inode), opened)),
                    Err(e) => {
                        self.forget(ctx, inode.ino, 1);
                        Err(e)
                    }
                }
            }
            Err(Error::Exists) if flags & O_EXCL == 0 => {
                let entry = self.lookup(ctx, parent, name)?;
                let inode = self.inode(entry.ino)?;
                if inode.kind == S_IFDIR {
                    self.forget(ctx, entry.ino, 1);
                    return Err(Error::IsDir);
                }
                match self.open_inode(ctx, inode.clone(), flags, true, kill_priv) {
                    Ok(opened) => Ok((self.entry(&inode), opened)),
                    Err(e) => {
                        self.forget(ctx, entry.ino, 1);
                        Err(e)
                    }
                }
            }
            Err(e) => Err(e),
        }
    }

    fn tmpfile(
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
            let inode = self.new_inode(ctx, &pm, S_IFREG, mode, umask, 0, Body::File(RwLock::default()))?;
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
                self.forget(ctx, inode.ino, 1);
                Err(e)
            }
        }
    }

    fn fallocate(&self, ctx: &Context, ino: u64, fh: u64, mode: u32, offset: u64, length: u64) -> Result<()> {
        let h = self.handle(fh, ino)?;
        if h.flags & O_ACCMODE == O_RDONLY {
            return Err(Error::BadHandle);
        }
        let Body::File(data) = &h.inode.body else {
            return Err(if h.inode.kind == S_IFDIR { Error::IsDir } else { Error::NotSupported });
        };
        if length == 0 {
            return Err(Error::InvalidArgument);
        }
        let end = offset.checked_add(length).filter(|&e| e <= MAX_FILE_SIZE).ok_or(Error::FileTooLarge)?;
        let mut data = wr(data);
        let now = now();
        // Like any modification through a descriptor (`file_modified`): times, and privileges
        // (the kernel's clearing request never reaches us with HANDLE_KILLPRIV).
        let modified = |m: &mut Meta| {
            m.mtime = now;
            m.ctime = now;
            self.kill_priv(&h.inode, m, ctx, ctx.uid != 0);
        };
        if mode == 0 || mode == FALLOC_FL_KEEP_SIZE {
            let mut result = Ok(());
            for idx in offset / CHUNK64..=(end - 1) / CHUNK64 {
                if let btree_map::Entry::Vacant(v) = data.chunks.entry(idx) {
                    match self.alloc_chunk() {
                        Ok(c) => {
                            v.insert(c);
                        }
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    }
                }
            }
            let mut m = wr(&h.inode.meta);
            m.blocks = data.blocks();
            if result.is_ok() {
                if mode == 0 && end > m.size {
                    m.size = end;
                }
                modified(&mut m);
            }
            result
        } else if mode == FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE {
            let mut m = wr(&h.inode.meta);
            let end = end.min(m.size);
            if offset < end {
                // Whole chunks go (found through the map, never by walking the range, which
                // may be huge); the partial chunks at either end are zeroed.
                let first_full = offset.div_ceil(CHUNK64);
                let end_full = end / CHUNK64;
                if first_full < end_full {
                    let mut middle = data.chunks.split_off(&first_full);
                    let mut tail = middle.split_off(&end_full);
                    self.release_chunks(middle.len());
                    data.chunks.append(&mut tail);
                }
                for (from, to) in
                    [(offset, end.min(first_full * CHUNK64)), (offset.max(end_full * CHUNK64), end)]
                {
                    if from < to {
                        if let Some(chunk) = data.chunks.get_mut(&(from / CHUNK64)) {
                            let at = (from % CHUNK64) as usize;
                            chunk[at..at + (to - from) as usize].fill(0);
                        }
                    }
                }
            }
            m.blocks = data.blocks();
            modified(&mut m);
            Ok(())
        } else {
            Err(Error::NotSupported)
        }
    }

    fn setxattr(
        &self,
        ctx: &Context,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        acl_kill_sgid: Option<bool>,
    ) -> Result<()> {
        self.set_xattr(ctx, ino, name, value, flags, acl_kill_sgid)
    }

    fn getxattr(&self, ctx: &Context, ino: u64, name: &[u8], size: u32) -> Result<XattrReply> {
        self.get_xattr(ctx, ino, name, size)
    }

    fn listxattr(&self, ctx: &Context, ino: u64, size: u32) -> Result<XattrReply> {
        self.list_xattr(ctx, ino, size)
    }

    fn removexattr(&self, ctx: &Context, ino: u64, name: &[u8]) -> Result<()> {
        self.remove_xattr(ctx, ino, name)
    }

    fn lock_handle(&self, _ctx: &Context, ino: u64, fh: u64, access: LockAccess) -> Result<()> {
        let h = self.handle(fh, ino)?;
        if h.inode.kind != S_IFREG {
            return Err(Error::InvalidArgument);
        }
        match (access, h.flags & O_ACCMODE) {
            (LockAccess::Read, O_WRONLY) | (LockAccess::Write, O_RDONLY) => Err(Error::BadHandle),
            _ => Ok(()),
        }
    }

    fn has_open_handles(&self, ino: u64) -> bool {
        self.inodes.get(ino).is_some_and(|inode| inode.opens.load(Ordering::Acquire) > 0)
    }

    fn lseek(&self, _ctx: &Context, ino: u64, fh: u64, offset: u64, whence: u32) -> Result<u64> {
        let h = self.handle(fh, ino)?;
        let Body::File(data) = &h.inode.body else {
            return Err(Error::InvalidArgument);
        };
        // Offsets are `loff_t`: the top half of u64 is negative.
        let signed = offset as i64;
        match whence {
            // Handles keep no position (I/O is positional), so SEEK_CUR counts from 0, as it does
            // for virtiofsd; the kernel answers both itself anyway.
            SEEK_SET | SEEK_CUR if signed >= 0 => Ok(offset),
            SEEK_SET | SEEK_CUR => Err(Error::InvalidArgument),
            SEEK_END => {
                let size = rd(&h.inode.meta).size as i64;
                match size.checked_add(signed) {
                    Some(pos) if pos >= 0 => Ok(pos as u64),
                    _ => Err(Error::InvalidArgument),
                }
            }
            SEEK_DATA | SEEK_HOLE => {
                let data = rd(data);
                let size = rd(&h.inode.meta).size;
                if offset >= size {
                    return Err(Error::NoSuchAddress);
                }
                let first = offset / CHUNK64;
                if whence == SEEK_DATA {
                    // Chunks past the size (fallocate KEEP_SIZE) hold no data.
                    match data.chunks.range(first..).next() {
                        Some((&idx, _)) if idx * CHUNK64 < size => Ok(offset.max(idx * CHUNK64)),
                        _ => Err(Error::NoSuchAddress),
                    }
                } else {
                    let mut idx = first;
                    for (&i, _) in data.chunks.range(first..) {
                        if i != idx {
                            break;
                        }
                        idx += 1;
                    }
                    // The end of the file is a hole too.
                    Ok(offset.max(idx * CHUNK64).min(size))
                }
            }
            _ => Err(Error::InvalidArgument),
        }
    }

    fn copy_file_range(
        &self,
        ctx: &Context,
        ino_in: u64,
        fh_in: u64,
        off_in: u64,
        ino_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> Result<usize> {
        if flags != 0 {
            return Err(Error::InvalidArgument);
        }
        let hin = self.handle(fh_in, ino_in)?;
        let hout = self.handle(fh_out, ino_out)?;
        if hin.inode.kind == S_IFDIR || hout.inode.kind == S_IFDIR {
            return Err(Error::IsDir);
        }
        let (Body::File(din), Body::File(dout)) = (&hin.inode.body, &hout.inode.body) else {
            return Err(Error::InvalidArgument);
        };
        if hin.flags & O_ACCMODE == O_WRONLY
            || hout.flags & O_ACCMODE == O_RDONLY
            || hout.flags & O_APPEND != 0
        {
            return Err(Error::BadHandle);
        }
        if off_in > MAX_FILE_SIZE || off_out > MAX_FILE_SIZE {
            return Err(Error::InvalidArgument);
        }
        if off_in.checked_add(len).is_none() || off_out.checked_add(len).is_none() {
            return Err(Error::Overflow);
        }
        let same = hin.inode.ino == hout.inode.ino;
        // Two files: data locks in inode-number order (a copy the other way cannot deadlock us).
        let (mut gout, gin) = if same {
            (wr(dout), None)
        } else if hin.inode.ino < hout.inode.ino {
            let gin = rd(din);
            (wr(dout), Some(gin))
        } else {
            let gout = wr(dout);
            (gout, Some(rd(din)))
        };
        let size_in = rd(&hin.inode.meta).size;
        let mut count = if off_in >= size_in { 0 } else { len.min(size_in - off_in) };
        if off_out >= MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        count = count.min(MAX_FILE_SIZE - off_out);
        if same && off_out < off_in + count && off_in < off_out + count {
            return Err(Error::InvalidArgument);
        }
        let count = count.min(MAX_COPY) as usize;
        if count == 0 {
            return Ok(0);
        }
        let copied = self.copy_chunks(gin.as_deref(), &mut gout, off_in, off_out, count)?;
        {
            let now = now();
            let mut m = wr(&hout.inode.meta);
            m.size = m.size.max(off_out + copied as u64);
            m.blocks = gout.blocks();
            m.mtime = now;
            m.ctime = now;
            self.kill_priv(&hout.inode, &mut m, ctx, ctx.uid != 0);
        }
        drop(gin);
        drop(gout);
        self.touch_atime(&hin.inode);
        Ok(copied)
    }

    fn syncfs(&self, _ctx: &Context, _ino: u64) -> Result<()> {
        // Nothing is ever more durable than it is now.
        Ok(())
    }

    fn statx(&self, _ctx: &Context, ino: u64, _fh: Option<u64>) -> Result<(Statx, Duration)> {
        let inode = self.inode(ino)?;
        let m = rd(&inode.meta);
        Ok((Statx { stat: stat_of(ino, &m), btime: Some(m.btime) }, self.cfg.cache.timeout()))
    }
}
