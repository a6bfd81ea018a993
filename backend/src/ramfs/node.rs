//! The data structures behind [`RamFs`](super::RamFs): inodes with their attributes and file
//! chunks, open handles, directory contents with stable READDIR cookies, the sharded id tables,
//! and the sizes of that layout (chunk, block, shard count).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

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
pub(super) type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;

/// Which inodes and handles changed while a live update copied the filesystem ahead of its
/// quiet point (issue 22, see `super::state`); the directories' changes are logged by the
/// [`Tree`], under its own lock. Off, a change costs one atomic load.
///
/// Every change is marked while the lock that guards what it changes is held (or, for the
/// reference counts, after the count with sequentially consistent order): a copy that reads
/// the value after [`Changes::start`] either sees the change or finds it marked.
#[derive(Default)]
pub(super) struct Changes {
    /// [`OFF`], [`ON`] or [`OVERFLOWED`].
    state: AtomicU8,
    log: Mutex<ChangeLog>,
}

const OFF: u8 = 0;
const ON: u8 = 1;
/// More than [`MAX_MARKS`] were marked: marking stopped, and the filesystem travels whole.
const OVERFLOWED: u8 = 2;

/// The most inodes and handles (together), and the most directories and entries (together),
/// marked in one copy's window; past it the copy is given up for the whole state at the quiet
/// point (a guest making that many changes in the window would otherwise grow the logs, and
/// the pause, without bound).
pub(super) const MAX_MARKS: usize = if cfg!(test) { 64 } else { 1 << 18 };

/// What [`Changes`] marked.
#[derive(Default, Debug)]
pub(super) struct ChangeLog {
    /// Inodes changed, made or dropped.
    pub(super) inodes: IdSet,
    /// Handles opened or released.
    pub(super) handles: IdSet,
}

impl Changes {
    fn lock(&self) -> MutexGuard<'_, ChangeLog> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks from now on, forgetting what an earlier copy marked.
    pub(super) fn start(&self) {
        *self.lock() = ChangeLog::default();
        self.state.store(ON, Ordering::SeqCst);
    }

    /// Stops marking; what was marked, or `None` if marking was off or overflowed.
    pub(super) fn stop(&self) -> Option<ChangeLog> {
        let was = self.state.swap(OFF, Ordering::SeqCst);
        let log = std::mem::take(&mut *self.lock());
        (was == ON).then_some(log)
    }

    /// The inodes marked so far (marking goes on).
    pub(super) fn marked_inodes(&self) -> IdSet {
        self.lock().inodes.clone()
    }

    /// Whether changes are marked.
    pub(super) fn on(&self) -> bool {
        self.state.load(Ordering::SeqCst) == ON
    }

    #[inline]
    fn inode(&self, ino: u64) {
        if self.on() {
            self.mark(|l| l.inodes.insert(ino));
        }
    }

    #[inline]
    fn handle(&self, fh: u64) {
        if self.on() {
            self.mark(|l| l.handles.insert(fh));
        }
    }

    #[cold]
    fn mark(&self, f: impl FnOnce(&mut ChangeLog) -> bool) {
        let mut log = self.lock();
        if f(&mut log) && log.inodes.len() + log.handles.len() > MAX_MARKS {
            *log = ChangeLog::default();
            // Only from ON: a copy stopped meanwhile stays stopped.
            let _ = self.state.compare_exchange(ON, OVERFLOWED, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

/// What a [`Table`] holds, for marking its changes.
#[derive(Clone, Copy)]
pub(super) enum Ids {
    Inodes,
    Handles,
}

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

/// A map from server-assigned ids, split over [`SHARDS`] locks. Every insertion and removal
/// is marked in its [`Changes`].
pub(super) struct Table<V> {
    shards: Box<[RwLock<IdMap<V>>]>,
    changes: Arc<Changes>,
    ids: Ids,
}

impl<V: Clone> Table<V> {
    pub(super) fn new(changes: Arc<Changes>, ids: Ids) -> Self {
        Table { shards: (0..SHARDS).map(|_| RwLock::default()).collect(), changes, ids }
    }

    fn shard(&self, key: u64) -> &RwLock<IdMap<V>> {
        &self.shards[(key % SHARDS as u64) as usize]
    }

    fn mark(&self, key: u64) {
        match self.ids {
            Ids::Inodes => self.changes.inode(key),
            Ids::Handles => self.changes.handle(key),
        }
    }

    /// Every value, a shard at a time (each shard's read lock held while `f` runs on it).
    pub(super) fn for_each(&self, mut f: impl FnMut(&u64, &V)) {
        for shard in self.shards.iter() {
            rd(shard).iter().for_each(|(k, v)| f(k, v));
        }
    }

    /// Keeps the values `keep` says to keep, a shard at a time.
    pub(super) fn retain(&self, mut keep: impl FnMut(&V) -> bool) {
        for shard in self.shards.iter() {
            wr(shard).retain(|&k, v| {
                let kept = keep(v);
                if !kept {
                    self.mark(k);
                }
                kept
            });
        }
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
        let mut shard = wr(self.shard(key));
        self.mark(key);
        shard.insert(key, value);
    }

    pub(super) fn remove_if(&self, key: u64, pred: impl FnOnce(&V) -> bool) -> Option<V> {
        let mut shard = wr(self.shard(key));
        if shard.get(&key).is_some_and(pred) {
            self.mark(key);
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
    File(FileLock),
    Symlink(Box<[u8]>),
    /// Directories (contents live in the tree) and special files.
    Other,
}

/// A regular file's chunks. Read through [`FileLock::read`]; changed only through
/// [`Inode::data_mut`], which marks the change.
#[derive(Default)]
pub(super) struct FileLock(RwLock<FileData>);

impl FileLock {
    pub(super) fn new(data: FileData) -> Self {
        FileLock(RwLock::new(data))
    }

    pub(super) fn read(&self) -> RwLockReadGuard<'_, FileData> {
        rd(&self.0)
    }
}

/// An inode. Its attributes, extended attributes, chunks and reference counts change only
/// through its methods, each of which marks the change in the filesystem's [`Changes`].
pub(super) struct Inode {
    pub(super) ino: u64,
    /// `S_IFMT` bits; never change.
    pub(super) kind: u32,
    meta: RwLock<Meta>,
    xattrs: RwLock<Xattrs>,
    /// References the kernel holds (entries handed out minus FORGETs).
    lookups: AtomicU64,
    /// Open handles.
    opens: AtomicU64,
    pub(super) body: Body,
    changes: Arc<Changes>,
}

impl Inode {
    pub(super) fn new(
        ino: u64,
        kind: u32,
        meta: Meta,
        lookups: u64,
        body: Body,
        changes: Arc<Changes>,
    ) -> Self {
        Inode {
            ino,
            kind,
            meta: RwLock::new(meta),
            xattrs: RwLock::default(),
            lookups: AtomicU64::new(lookups),
            opens: AtomicU64::new(0),
            body,
            changes,
        }
    }

    pub(super) fn meta(&self) -> Meta {
        rd(&self.meta).clone()
    }

    pub(super) fn meta_ref(&self) -> RwLockReadGuard<'_, Meta> {
        rd(&self.meta)
    }

    pub(super) fn meta_mut(&self) -> RwLockWriteGuard<'_, Meta> {
        let m = wr(&self.meta);
        self.changes.inode(self.ino);
        m
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut Meta)) {
        f(&mut self.meta_mut());
    }

    pub(super) fn xattrs_ref(&self) -> RwLockReadGuard<'_, Xattrs> {
        rd(&self.xattrs)
    }

    pub(super) fn xattrs_mut(&self) -> RwLockWriteGuard<'_, Xattrs> {
        let x = wr(&self.xattrs);
        self.changes.inode(self.ino);
        x
    }

    /// A regular file's chunks, to change; `None` for anything else.
    pub(super) fn data_mut(&self) -> Option<RwLockWriteGuard<'_, FileData>> {
        let Body::File(lock) = &self.body else { return None };
        let d = wr(&lock.0);
        self.changes.inode(self.ino);
        Some(d)
    }

    pub(super) fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::SeqCst)
    }

    pub(super) fn add_lookups(&self, n: u64) {
        self.lookups.fetch_add(n, Ordering::SeqCst);
        self.changes.inode(self.ino);
    }

    /// Drops `n` lookup references (never below none).
    pub(super) fn drop_lookups(&self, n: u64) {
        let _ = self.lookups.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| Some(l.saturating_sub(n)));
        self.changes.inode(self.ino);
    }

    pub(super) fn opens(&self) -> u64 {
        self.opens.load(Ordering::SeqCst)
    }

    pub(super) fn add_open(&self) {
        self.opens.fetch_add(1, Ordering::SeqCst);
        self.changes.inode(self.ino);
    }

    pub(super) fn drop_open(&self) {
        let _ = self.opens.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |o| Some(o.saturating_sub(1)));
        self.changes.inode(self.ino);
    }

    /// Forgets every lookup reference and open handle (DESTROY).
    pub(super) fn clear_refs(&self) {
        self.lookups.store(0, Ordering::SeqCst);
        self.opens.store(0, Ordering::SeqCst);
        self.changes.inode(self.ino);
    }

    /// Sets everything a taken-over state says of an existing inode (`super::state`, before
    /// the filesystem serves: nothing is marked).
    pub(super) fn set_restored(&self, meta: Meta, xattrs: Xattrs, lookups: u64, opens: u64) {
        *wr(&self.meta) = meta;
        *wr(&self.xattrs) = xattrs;
        self.lookups.store(lookups, Ordering::SeqCst);
        self.opens.store(opens, Ordering::SeqCst);
    }

    /// A taken-over file's chunks, replaced (`super::state`, before the filesystem serves).
    pub(super) fn set_restored_data(&self, data: FileData) -> Option<FileData> {
        let Body::File(lock) = &self.body else { return None };
        Some(std::mem::replace(&mut *wr(&lock.0), data))
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

/// The contents of one directory. Changed only through the [`Tree`], which logs the change.
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

    fn insert(&mut self, name: &[u8], ino: u64, kind: u32) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.put(name, Child { cookie, ino, typ: kind >> 12 });
    }

    /// Sets `name` to `child`, its cookie as given; the entry it replaces, if any.
    fn put(&mut self, name: &[u8], child: Child) -> Option<Child> {
        let old = self.entries.insert(name.into(), child);
        if let Some(old) = old {
            self.order.remove(&old.cookie);
        }
        self.order.insert(child.cookie, name.into());
        old
    }

    fn remove(&mut self, name: &[u8]) -> Option<Child> {
        let child = self.entries.remove(name)?;
        self.order.remove(&child.cookie);
        Some(child)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What changed in a [`Tree`] since [`Tree::start_log`].
#[derive(Default, Debug)]
pub(super) struct TreeLog {
    /// Directories made, removed, or whose parent or entries changed.
    pub(super) dirs: IdSet,
    /// Entries added, replaced or removed: (directory, name).
    pub(super) names: HashSet<(u64, Box<[u8]>)>,
    /// More than [`MAX_MARKS`] were logged: logging stopped.
    overflowed: bool,
}

impl TreeLog {
    fn dir(&mut self, ino: u64) {
        if !self.overflowed {
            self.dirs.insert(ino);
            self.check();
        }
    }

    fn name(&mut self, dir: u64, name: &[u8]) {
        if !self.overflowed {
            self.names.insert((dir, name.into()));
            self.check();
        }
    }

    fn check(&mut self) {
        if self.dirs.len() + self.names.len() > MAX_MARKS {
            *self = TreeLog { overflowed: true, ..TreeLog::default() };
        }
    }
}

/// Every directory's contents, by inode. All changes go through its methods and, while a live
/// update copies the filesystem, are logged (under the tree's lock, as they are made).
#[derive(Default)]
pub(super) struct Tree {
    dirs: IdMap<Dir>,
    log: Option<TreeLog>,
}

impl Tree {
    pub(super) fn get(&self, ino: &u64) -> Option<&Dir> {
        self.dirs.get(ino)
    }

    pub(super) fn contains_key(&self, ino: &u64) -> bool {
        self.dirs.contains_key(ino)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&u64, &Dir)> {
        self.dirs.iter()
    }

    fn dir_mut(&mut self, ino: u64) -> Result<&mut Dir> {
        if let Some(log) = &mut self.log {
            log.dir(ino);
        }
        self.dirs.get_mut(&ino).ok_or(Error::NotFound)
    }

    fn name(&mut self, dir: u64, name: &[u8]) {
        if let Some(log) = &mut self.log {
            log.name(dir, name);
        }
    }

    /// A new, empty directory `ino` in `parent`.
    pub(super) fn add_dir(&mut self, ino: u64, parent: u64) {
        if let Some(log) = &mut self.log {
            log.dir(ino);
        }
        self.dirs.insert(ino, Dir::new(parent));
    }

    /// Directory `ino`'s contents, gone.
    pub(super) fn remove_dir(&mut self, ino: u64) -> Option<Dir> {
        if let Some(log) = &mut self.log {
            log.dir(ino);
        }
        self.dirs.remove(&ino)
    }

    pub(super) fn set_parent(&mut self, ino: u64, parent: u64) -> Result<()> {
        self.dir_mut(ino)?.parent = parent;
        Ok(())
    }

    /// Links `dir/name` to `ino` with the next cookie (replacing an entry of that name).
    pub(super) fn insert(&mut self, dir: u64, name: &[u8], ino: u64, kind: u32) -> Result<()> {
        self.dir_mut(dir)?.insert(name, ino, kind);
        self.name(dir, name);
        Ok(())
    }

    /// Unlinks `dir/name`.
    pub(super) fn remove(&mut self, dir: u64, name: &[u8]) -> Result<Option<Child>> {
        let child = self.dir_mut(dir)?.remove(name);
        self.name(dir, name);
        Ok(child)
    }

    /// Logs every change from now on (forgetting an earlier log).
    pub(super) fn start_log(&mut self) {
        self.log = Some(TreeLog::default());
    }

    /// Stops logging; what was logged, or `None` if it was off or overflowed.
    pub(super) fn take_log(&mut self) -> Option<TreeLog> {
        self.log.take().filter(|l| !l.overflowed)
    }

    /// A taken-over directory, as the state says (`super::state`: nothing is logged).
    pub(super) fn restore_dir(&mut self, ino: u64, parent: u64, next_cookie: u64) -> &mut Dir {
        let d = self.dirs.entry(ino).or_insert_with(|| Dir::new(parent));
        d.parent = parent;
        d.next_cookie = next_cookie;
        d
    }

    /// A taken-over directory, gone (`super::state`).
    pub(super) fn restore_remove_dir(&mut self, ino: u64) -> Option<Dir> {
        self.dirs.remove(&ino)
    }

    /// A taken-over entry set (`Some`) or removed (`None`); the entry it replaces.
    pub(super) fn restore_entry(&mut self, dir: u64, name: &[u8], child: Option<Child>) -> Option<Child> {
        let d = self.dirs.get_mut(&dir)?;
        match child {
            Some(c) => d.put(name, c),
            None => d.remove(name),
        }
    }
}
