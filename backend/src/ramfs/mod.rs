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
//!   between the chunks and guest memory under the file's own lock. The chunks are slots of one
//!   memfd mapped shared (`sys`'s chunk store, [`RamFs::data_memfd`]): a process given the memfd
//!   maps the same data without a copy.
//! - `handles`: file handle -> `Arc<Handle>`, sharded like `inodes`.
//! - Per inode also `xattrs` (extended attributes other than ACLs; the ACLs live in `meta`, where
//!   the permission checks read them). Advisory locks are the server's ([`crate::locks`]); the
//!   filesystem only vouches for the handles they come through.
//!
//! Changes go through methods that mark them (`node::Inode`, `node::Table`, `node::Tree`), for a
//! live update's copy taken while the filesystem serves ([`RamFs::precopy`], `state`).
//!
//! Lock order: `tree` -> an `inodes`/`handles` shard -> `data` -> `meta` -> `xattrs`; at most one
//! `meta` at a time (COPY_FILE_RANGE takes two `data` locks, in inode-number order). Capacity
//! (bytes of chunks, extended attributes and ACLs) and inode count are bounded by [`RamFsConfig`].
//!
//! Modules, by concern (each adds `impl RamFs` methods that the [`FileSystem`] implementation
//! here calls): `namespace` (lookup, creation, link, unlink, rename, listings), `data` (file
//! chunks: read, write, copy, fallocate, lseek, truncate), `handles` (open, release, the handle
//! table), `attr` (SETATTR, ACCESS, privilege clearing), `capacity` (limits, eviction, STATFS),
//! `xattr` and `acl` (extended attributes, POSIX ACLs); beneath them `node` (the data
//! structures), `consts` (Linux constants) and `sys` (the memfd the chunks live in, the only
//! `unsafe` code). None of them imports another that imports it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::abi::{self, ROOT_ID};
use crate::filesystem::{
    CachePolicy, Context, DirPlusSink, DirSink, Entry, Error, FileSystem, LockAccess, Opened, Result,
    SetAttr, Stat, StatFs, Statx, XattrReply,
};
use crate::filesystem::{
    CopyFileRangeArgs, CreateArgs, FallocateArgs, MknodArgs, ReadArgs, RenameArgs, SetxattrArgs, WriteArgs,
};
use crate::io::{Reader, Writer};

mod acl;
mod attr;
mod capacity;
mod consts;
mod data;
mod handles;
mod namespace;
mod node;
pub mod state;
pub(crate) mod sys;
mod xattr;

use consts::S_IFDIR;
use node::{stat_of, wr, Body, Changes, Handle, Ids, Inode, Meta, Table, Tree, BLOCK_SIZE};
use sys::ChunkStore;

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
/// Bytes of extended attribute names and values (ACLs included) one inode may hold.
pub const XATTR_INODE_MAX: u64 = 256 << 10;

/// Tunables of a [`RamFs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamFsConfig {
    /// What the guest kernel may cache (entry and attribute timeouts, page-cache flags). The
    /// default is [`CachePolicy::Always`]: only the guest changes a RAM filesystem, and the guest
    /// kernel invalidates what its own operations change.
    pub cache: CachePolicy,
    /// Bytes of file data the filesystem may hold.
    pub capacity: u64,
    /// Inodes the filesystem may hold (past it a creation fails ENOSPC). A guest that looks
    /// names up and never FORGETs creates nothing: lookups only count references on inodes
    /// that exist.
    pub max_inodes: u64,
    /// Open file and directory handles at once (past it OPEN, OPENDIR and CREATE fail ENFILE):
    /// a guest that opens and never releases is held to this many.
    pub max_handles: u64,
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
            max_handles: 1 << 16,
            root_mode: 0o755,
            posix_acl: true,
        }
    }
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    Ok(())
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
    /// Where file data lives (a memfd another process can map).
    store: Arc<ChunkStore>,
    /// Live inodes.
    ninodes: AtomicU64,
    /// Open handles.
    nhandles: AtomicU64,
    /// `FUSE_INIT` flags of the session (what `init` accepted).
    session: AtomicU64,
    /// What changed while a live update copies the filesystem ahead of its quiet point.
    changes: Arc<Changes>,
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
    ///
    /// # Panics
    /// If the memfd for its data cannot be made ([`RamFs::try_with_config`] says why instead).
    pub fn with_config(cfg: RamFsConfig) -> Self {
        Self::try_with_config(cfg).expect("RAM filesystem: the memfd for file data")
    }

    /// An empty filesystem: just the root directory; its file data in a memfd of
    /// `cfg.capacity` bytes (sparse: memory is taken as data is written).
    pub fn try_with_config(cfg: RamFsConfig) -> std::io::Result<Self> {
        let store = ChunkStore::new("virtiofs-ramfs", cfg.capacity)?;
        let meta = Meta::new(S_IFDIR | (cfg.root_mode & 0o7777), 0, 0, 2, 0, u64::from(BLOCK_SIZE));
        let changes = Arc::new(Changes::default());
        let root = Arc::new(Inode::new(ROOT_ID, S_IFDIR, meta, 0, Body::Other, changes.clone()));
        let fs = RamFs {
            cfg,
            tree: RwLock::default(),
            inodes: Table::new(changes.clone(), Ids::Inodes),
            handles: Table::new(changes.clone(), Ids::Handles),
            next_ino: AtomicU64::new(ROOT_ID + 1),
            next_fh: AtomicU64::new(1),
            used: AtomicU64::new(0),
            store,
            nhandles: AtomicU64::new(0),
            ninodes: AtomicU64::new(1),
            session: AtomicU64::new(0),
            changes,
        };
        fs.inodes.insert(ROOT_ID, root);
        wr(&fs.tree).add_dir(ROOT_ID, ROOT_ID);
        Ok(fs)
    }

    /// Leaves the file data to the process that took this filesystem over (a live update):
    /// from now on nothing this filesystem frees is reused or given back to the kernel (its
    /// memfd's contents stay as the successor found them), and it takes no new data.
    pub fn give_data_away(&self) {
        self.store.give_away();
    }

    /// The memfd that holds the file data, for a process that takes this filesystem over
    /// (chunk `n` of the store at offset `n * 64 KiB`).
    pub fn data_memfd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.store.memfd()
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
        self.inodes.get(ino).map(|i| i.lookups())
    }

    fn inode(&self, ino: u64) -> Result<Arc<Inode>> {
        self.inodes.get(ino).ok_or(Error::NotFound)
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
        self.drop_all();
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<Entry> {
        self.lookup_name(ctx, parent, name)
    }

    fn forget(&self, ctx: &Context, ino: u64, nlookup: u64) {
        self.forget_node(ctx, ino, nlookup);
    }

    fn getattr(&self, _ctx: &Context, ino: u64, _fh: Option<u64>) -> Result<(Stat, Duration)> {
        let st = self.inodes.with(ino, |i| i.stat()).ok_or(Error::NotFound)?;
        Ok((st, self.cfg.cache.timeout()))
    }

    fn setattr(&self, ctx: &Context, ino: u64, attr: &SetAttr) -> Result<(Stat, Duration)> {
        self.set_attr(ctx, ino, attr)
    }

    fn readlink(&self, _ctx: &Context, ino: u64) -> Result<Vec<u8>> {
        match &self.inode(ino)?.body {
            Body::Symlink(target) => Ok(target.to_vec()),
            _ => Err(Error::InvalidArgument),
        }
    }

    fn symlink(&self, ctx: &Context, parent: u64, name: &[u8], target: &[u8]) -> Result<Entry> {
        self.make_symlink(ctx, parent, name, target)
    }

    fn mknod(&self, ctx: &Context, parent: u64, args: &MknodArgs<'_>) -> Result<Entry> {
        let MknodArgs { name, mode, rdev, umask } = *args;
        self.make_node(ctx, parent, name, mode, rdev, umask)
    }

    fn mkdir(&self, ctx: &Context, parent: u64, name: &[u8], mode: u32, umask: u32) -> Result<Entry> {
        self.make_dir(ctx, parent, name, mode, umask)
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        self.unlink_name(ctx, parent, name)
    }

    fn rmdir(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        self.remove_dir(ctx, parent, name)
    }

    fn rename(&self, ctx: &Context, olddir: u64, args: &RenameArgs<'_>) -> Result<()> {
        let RenameArgs { oldname, newdir, newname, flags } = *args;
        self.rename_entry(ctx, olddir, oldname, newdir, newname, flags)
    }

    fn link(&self, ctx: &Context, ino: u64, newparent: u64, newname: &[u8]) -> Result<Entry> {
        self.link_inode(ctx, ino, newparent, newname)
    }

    fn open(&self, ctx: &Context, ino: u64, flags: u32, kill_priv: bool) -> Result<Opened> {
        let inode = self.inode(ino)?;
        self.open_inode(ctx, inode, flags, true, kill_priv)
    }

    #[inline]
    fn read(&self, ctx: &Context, ino: u64, args: &ReadArgs, w: &mut Writer<'_>) -> Result<usize> {
        let ReadArgs { fh, offset, size } = *args;
        self.read_data(ctx, ino, fh, offset, size, w)
    }

    #[inline]
    fn write(&self, ctx: &Context, ino: u64, args: &WriteArgs, r: &mut Reader<'_>) -> Result<usize> {
        self.write_data(ctx, ino, args, r)
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
        self.open_dir(ctx, ino, flags)
    }

    fn readdir(&self, ctx: &Context, ino: u64, fh: u64, offset: u64, sink: &mut DirSink<'_>) -> Result<()> {
        self.list_dir(ctx, ino, fh, offset, sink)
    }

    fn readdirplus(
        &self,
        ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        sink: &mut DirPlusSink<'_>,
    ) -> Result<()> {
        self.list_dir_plus(ctx, ino, fh, offset, sink)
    }

    fn releasedir(&self, _ctx: &Context, ino: u64, fh: u64, _flags: u32) -> Result<()> {
        self.release_handle(ino, fh)
    }

    fn fsyncdir(&self, _ctx: &Context, ino: u64, fh: u64, _datasync: bool) -> Result<()> {
        self.handle(fh, ino).map(|_| ())
    }

    fn statfs(&self, _ctx: &Context, _ino: u64) -> Result<StatFs> {
        Ok(self.stat_fs())
    }

    fn access(&self, ctx: &Context, ino: u64, mask: u32) -> Result<()> {
        self.check_access(ctx, ino, mask)
    }

    fn create(&self, ctx: &Context, parent: u64, args: &CreateArgs<'_>) -> Result<(Entry, Opened)> {
        self.create_file(ctx, parent, args)
    }

    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> Result<(Entry, Opened)> {
        self.create_tmpfile(ctx, parent, mode, flags, umask)
    }

    fn fallocate(&self, ctx: &Context, ino: u64, args: &FallocateArgs) -> Result<()> {
        let FallocateArgs { fh, mode, offset, length } = *args;
        self.allocate(ctx, ino, fh, mode, offset, length)
    }

    fn setxattr(&self, ctx: &Context, ino: u64, args: &SetxattrArgs<'_>, value: &[u8]) -> Result<()> {
        let SetxattrArgs { name, flags, acl_kill_sgid } = *args;
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

    fn lock_handle(&self, ctx: &Context, ino: u64, fh: u64, access: LockAccess) -> Result<()> {
        self.check_lock_handle(ctx, ino, fh, access)
    }

    fn has_open_handles(&self, ino: u64) -> bool {
        self.inodes.get(ino).is_some_and(|inode| inode.opens() > 0)
    }

    fn lseek(&self, ctx: &Context, ino: u64, fh: u64, offset: u64, whence: u32) -> Result<u64> {
        self.seek(ctx, ino, fh, offset, whence)
    }

    fn copy_file_range(&self, ctx: &Context, ino_in: u64, args: &CopyFileRangeArgs) -> Result<usize> {
        self.copy_range(ctx, ino_in, args)
    }

    fn syncfs(&self, _ctx: &Context, _ino: u64) -> Result<()> {
        // Nothing is ever more durable than it is now.
        Ok(())
    }

    fn statx(&self, _ctx: &Context, ino: u64, _fh: Option<u64>) -> Result<(Statx, Duration)> {
        let inode = self.inode(ino)?;
        let m = inode.meta_ref();
        Ok((Statx { stat: stat_of(ino, &m), btime: Some(m.btime) }, self.cfg.cache.timeout()))
    }
}
