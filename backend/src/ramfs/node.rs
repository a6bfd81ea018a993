//! The data structures behind [`RamFs`](super::RamFs): inodes with their attributes and file
//! chunks, open handles, directory contents with stable READDIR cookies, the sharded id tables,
//! and the sizes of that layout (chunk, block, shard count).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::acl::{AclEntry, ExtAcl};
use super::consts::{S_IFDIR, S_IFMT, S_ISGID, S_ISUID, S_ISVTX, S_IXGRP, X_OK};
use crate::filesystem::{Context, Error, Result, Stat, Timespec};

pub(super) use super::sys::{Chunk, CHUNK, CHUNK64};
/// The block size attributes and STATFS report.
pub(super) const BLOCK_SIZE: u32 = 4096;
/// Locks each id table is split over.
pub(super) const SHARDS: usize = 16;
/// READDIR positions 0 and 1 are `.` and `..`; entries get cookies from here on.
pub(super) const FIRST_COOKIE: u64 = 2;

/// A fast hasher for server-assigned integer keys (node ids, file handles). Names, which the guest
/// chooses, keep the default DoS-resistant hasher.
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(super) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// The current wall-clock time (`CLOCK_REALTIME`, through the vDSO), for timestamps.
#[inline]
pub(super) fn now() -> Timespec {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    Timespec { sec: t.tv_sec, nsec: u32::try_from(t.tv_nsec).unwrap_or(0).min(999_999_999) }
}

/// Seconds of the coarse wall clock (`CLOCK_REALTIME_COARSE`: the time of the last tick, read
/// without touching the TSC). Never ahead of [`now`], behind by at most a tick. Not for storing.
#[inline]
pub(super) fn coarse_secs() -> i64 {
    rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse).tv_sec
}

pub(super) fn rd<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn wr<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// A map from server-assigned ids, split over [`SHARDS`] locks.
pub(super) struct Table<V> {
    pub(super) shards: Box<[RwLock<IdMap<V>>]>,
}

impl<V: Clone> Table<V> {
    pub(super) fn new() -> Self {
        Table { shards: (0..SHARDS).map(|_| RwLock::default()).collect() }
    }

    pub(super) fn shard(&self, key: u64) -> &RwLock<IdMap<V>> {
        &self.shards[(key % SHARDS as u64) as usize]
    }

    pub(super) fn get(&self, key: u64) -> Option<V> {
        rd(self.shard(key)).get(&key).cloned()
    }

    /// Runs `f` on the value under the shard's read lock, without cloning it (for short work:
    /// writers of the shard wait).
    #[inline]
    pub(super) fn with<R>(&self, key: u64, f: impl FnOnce(&V) -> R) -> Option<R> {
        rd(self.shard(key)).get(&key).map(f)
    }

    pub(super) fn insert(&self, key: u64, value: V) {
        wr(self.shard(key)).insert(key, value);
    }

    pub(super) fn remove_if(&self, key: u64, pred: impl FnOnce(&V) -> bool) -> Option<V> {
        let mut shard = wr(self.shard(key));
        if shard.get(&key).is_some_and(pred) {
            shard.remove(&key)
        } else {
            None
        }
    }
}

/// Attributes of an inode, with what the permission checks need (the ACLs).
#[derive(Debug, Clone)]
pub(super) struct Meta {
    pub(super) mode: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) nlink: u32,
    pub(super) rdev: u32,
    pub(super) size: u64,
    pub(super) blocks: u64,
    pub(super) atime: Timespec,
    pub(super) mtime: Timespec,
    pub(super) ctime: Timespec,
    /// Creation time.
    pub(super) btime: Timespec,
    /// The access ACL beyond the mode bits (see [`super::acl`]).
    pub(super) acl: Option<Arc<ExtAcl>>,
    /// The default ACL (directories only).
    pub(super) default_acl: Option<Arc<[AclEntry]>>,
    /// A `security.capability` attribute is set (cleared with set-user-id on write, truncate and
    /// chown).
    pub(super) fcaps: bool,
    /// An `O_TMPFILE` file that LINK may still give a name, though it has no link.
    pub(super) linkable: bool,
    /// Bytes of extended attributes and ACLs charged to the filesystem's capacity.
    pub(super) xattr_bytes: u64,
}

impl Meta {
    /// Fresh attributes: times now, no ACL, no extended attributes.
    pub(super) fn new(mode: u32, uid: u32, gid: u32, nlink: u32, rdev: u32, size: u64) -> Self {
        let now = now();
        Meta {
            mode,
            uid,
            gid,
            nlink,
            rdev,
            size,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            acl: None,
            default_acl: None,
            fcaps: false,
            linkable: false,
            xattr_bytes: 0,
        }
    }

    /// Whether `ctx` may access this inode with `mask` (`R_OK | W_OK | X_OK`), as the kernel's
    /// `generic_permission` decides: root may do anything but execute a non-directory with no
    /// execute bit at all; the owner gets the owner bits; with an access ACL and a non-empty mask
    /// the ACL decides; else the group or other bits.
    pub(super) fn may(&self, ctx: &Context, mask: u32) -> bool {
        if ctx.uid == 0 {
            return mask & X_OK == 0 || self.mode & S_IFMT == S_IFDIR || self.mode & 0o111 != 0;
        }
        if ctx.uid == self.uid {
            return (self.mode >> 6) & 7 & mask == mask;
        }
        if let Some(acl) = &self.acl {
            if self.mode & 0o070 != 0 {
                return acl.permits(ctx, self.gid, self.mode, mask);
            }
        }
        let bits = if ctx.in_group(self.gid) { self.mode >> 3 } else { self.mode } & 7;
        bits & mask == mask
    }

    /// Whether `ctx` owns the inode or is root (`inode_owner_or_capable`).
    pub(super) fn owner_or_root(&self, ctx: &Context) -> bool {
        ctx.uid == 0 || ctx.uid == self.uid
    }

    /// The sticky-directory rule: in a sticky directory only the owner of the entry or of the
    /// directory (or root) may remove or rename it.
    pub(super) fn sticky_denies(&self, ctx: &Context, victim_uid: u32) -> bool {
        self.mode & S_ISVTX != 0 && ctx.uid != 0 && ctx.uid != self.uid && ctx.uid != victim_uid
    }

    /// Clears set-user-id, and set-group-id when group-execute is set or `ctx` is neither in the
    /// file's group nor root, as a write or truncate by an unprivileged user does
    /// (`setattr_should_drop_suidgid`). Returns whether anything changed.
    pub(super) fn kill_suid(&mut self, ctx: &Context) -> bool {
        let old = self.mode;
        self.mode &= !S_ISUID;
        let in_group = ctx.uid == 0 || ctx.in_group(self.gid);
        if self.mode & S_IXGRP != 0 || !in_group {
            self.mode &= !S_ISGID;
        }
        old != self.mode
    }
}

/// The extended attributes of an inode other than the ACLs (those live in [`Meta`]): full names
/// (`user.x`, `trusted.x`, `security.x`) to values.
#[derive(Debug, Default)]
pub(super) struct Xattrs {
    pub(super) map: BTreeMap<Box<[u8]>, Box<[u8]>>,
    /// Length of the LISTXATTR answer for all of them (names with their NULs).
    pub(super) list_len: usize,
}

#[derive(Default)]
pub(super) struct FileData {
    /// Chunk index -> chunk. Missing chunks read as zeros; bytes past the file size are always zero.
    pub(super) chunks: BTreeMap<u64, Chunk>,
}

impl FileData {
    pub(super) fn blocks(&self) -> u64 {
        self.chunks.len() as u64 * (CHUNK64 / 512)
    }
}

/// An open file or directory: the inode it keeps alive and the flags it was opened with.
pub(super) struct Handle {
    pub(super) inode: Arc<Inode>,
    pub(super) flags: u32,
}

pub(super) enum Body {
    File(RwLock<FileData>),
    Symlink(Box<[u8]>),
    /// Directories (contents live in the tree) and special files.
    Other,
}

pub(super) struct Inode {
    pub(super) ino: u64,
    /// `S_IFMT` bits; never change.
    pub(super) kind: u32,
    pub(super) meta: RwLock<Meta>,
    pub(super) xattrs: RwLock<Xattrs>,
    /// References the kernel holds (entries handed out minus FORGETs).
    pub(super) lookups: AtomicU64,
    /// Open handles.
    pub(super) opens: AtomicU64,
    pub(super) body: Body,
}

impl Inode {
    pub(super) fn new(ino: u64, kind: u32, meta: Meta, lookups: u64, body: Body) -> Self {
        Inode {
            ino,
            kind,
            meta: RwLock::new(meta),
            xattrs: RwLock::default(),
            lookups: AtomicU64::new(lookups),
            opens: AtomicU64::new(0),
            body,
        }
    }

    pub(super) fn meta(&self) -> Meta {
        rd(&self.meta).clone()
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut Meta)) {
        f(&mut wr(&self.meta));
    }

    pub(super) fn stat(&self) -> Stat {
        stat_of(self.ino, &rd(&self.meta))
    }
}

pub(super) fn stat_of(ino: u64, m: &Meta) -> Stat {
    Stat {
        ino,
        size: m.size,
        blocks: m.blocks,
        atime: m.atime,
        mtime: m.mtime,
        ctime: m.ctime,
        mode: m.mode,
        nlink: m.nlink,
        uid: m.uid,
        gid: m.gid,
        rdev: m.rdev,
        blksize: BLOCK_SIZE,
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Child {
    pub(super) cookie: u64,
    pub(super) ino: u64,
    /// `DT_*` type.
    pub(super) typ: u32,
}

/// The contents of one directory.
pub(super) struct Dir {
    pub(super) parent: u64,
    pub(super) entries: HashMap<Box<[u8]>, Child>,
    /// Cookie -> name, for stable READDIR offsets: cookies only grow, so an entry present for the
    /// whole listing is returned exactly once whatever else changes.
    pub(super) order: BTreeMap<u64, Box<[u8]>>,
    pub(super) next_cookie: u64,
}

impl Dir {
    pub(super) fn new(parent: u64) -> Self {
        Dir { parent, entries: HashMap::new(), order: BTreeMap::new(), next_cookie: FIRST_COOKIE }
    }

    pub(super) fn get(&self, name: &[u8]) -> Option<Child> {
        self.entries.get(name).copied()
    }

    pub(super) fn insert(&mut self, name: &[u8], ino: u64, kind: u32) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let child = Child { cookie, ino, typ: kind >> 12 };
        if let Some(old) = self.entries.insert(name.into(), child) {
            self.order.remove(&old.cookie);
        }
        self.order.insert(cookie, name.into());
    }

    pub(super) fn remove(&mut self, name: &[u8]) -> Option<Child> {
        let child = self.entries.remove(name)?;
        self.order.remove(&child.cookie);
        Some(child)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

pub(super) type Tree = IdMap<Dir>;

pub(super) fn dir_mut(tree: &mut Tree, ino: u64) -> Result<&mut Dir> {
    tree.get_mut(&ino).ok_or(Error::NotFound)
}
