//! The RAM filesystem as data (issue 22, live update): everything a process that takes it over
//! needs besides the memfd its file data lives in ([`RamFs::data_memfd`]): the inodes with their
//! attributes, ACLs, extended attributes and reference counts, which chunk slot of the memfd
//! holds which 64 KiB of which file, the directories with their READDIR cookies, the open
//! handles, the session's INIT flags and the chunk store's free lists. File data is not copied.
//!
//! [`RamFs::save`] is taken while no request runs (the function at its quiet point);
//! [`RamFs::restore`] checks the state against itself and the memfd before it builds anything
//! (every slot inside the memfd and owned once, every name and handle naming an inode that
//! exists, the limits the same) and refuses it with a [`StateError`] otherwise.
//!
//! So that the pause of a live update does not grow with the file count, the state can also
//! move in two steps: [`RamFs::precopy`] while the filesystem serves (changes are marked from
//! then on), [`RamFs::changes`] at the quiet point (only what was marked, as it is now). The
//! taker builds from the copy ([`Restoring::new`], all of the above checks) and applies the
//! changes ([`Restoring::finish`]), checking them at a cost that follows their size.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::acl::{AclEntry, ExtAcl};
use super::node::{
    rd, wr, Body, Changes, Child, FileData, FileLock, Handle, IdMap, IdSet, Ids, Inode, Meta, Table, Tree,
    Xattrs, CHUNK,
};
use super::sys::{ChunkStore, FreeState};
use super::{RamFs, RamFsConfig, NAME_MAX};
use crate::abi::ROOT_ID;
use crate::filesystem::Timespec;

/// The format version this firmware writes and reads.
pub const RAMFS_STATE_VERSION: u32 = 2;

/// Entries of a directory copied under one hold of the tree's read lock.
const DIR_CHUNK: usize = 1024;

/// An ACL entry: tag, permissions, id.
pub type AclEntryState = (u16, u16, u32);

/// An inode's attributes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    /// Mode (type and permission bits).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Links.
    pub nlink: u32,
    /// Device number of a device node.
    pub rdev: u32,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    /// Times: access, modification, change, birth (seconds, nanoseconds).
    pub times: [(i64, u32); 4],
    /// The access ACL beyond the mode bits: the group-object permissions and the named entries.
    pub acl: Option<(u16, Vec<AclEntryState>)>,
    /// The default ACL.
    pub default_acl: Option<Vec<AclEntryState>>,
    /// A `security.capability` attribute is set.
    pub fcaps: bool,
    /// An `O_TMPFILE` file LINK may still name.
    pub linkable: bool,
    /// Bytes of extended attributes and ACLs charged to the capacity.
    pub xattr_bytes: u64,
}

/// What an inode holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BodyState {
    /// A regular file: its chunks as runs `(first chunk index, its memfd slot, count)`, chunk
    /// `index + k` in slot `slot + k` (a file written in order is one run, whatever its size).
    File(Vec<(u64, u32, u32)>),
    /// A symbolic link's target.
    Symlink(Vec<u8>),
    /// Anything else.
    Other,
}

/// One inode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeState {
    /// Its number.
    pub ino: u64,
    /// Its type bits.
    pub kind: u32,
    /// Its attributes.
    pub meta: MetaState,
    /// Its extended attributes (other than ACLs), by name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The guest's lookup references.
    pub lookups: u64,
    /// Open handles on it.
    pub opens: u64,
    /// What it holds.
    pub body: BodyState,
}

/// One directory's entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirState {
    /// The directory's inode.
    pub ino: u64,
    /// Its parent's.
    pub parent: u64,
    /// The cookie the next entry gets.
    pub next_cookie: u64,
    /// Entries: name, READDIR cookie, inode, type.
    pub entries: Vec<(Vec<u8>, u64, u64, u32)>,
}

/// The chunk store's allocator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreState {
    /// Slots of the memfd.
    pub slots: u32,
    /// Slots from this one on were never used.
    pub next: u32,
    /// Freed slots still resident.
    pub resident: Vec<u32>,
    /// Freed slots given back to the kernel.
    pub punched: Vec<u32>,
}

/// The whole filesystem but its file data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RamFsState {
    /// [`RAMFS_STATE_VERSION`] when written.
    pub version: u32,
    /// Capacity, inode and handle limits (the taker's must be the same).
    pub limits: (u64, u64, u64),
    /// The next inode number and file handle.
    pub next_ino: u64,
    /// The next file handle.
    pub next_fh: u64,
    /// Bytes charged to the capacity.
    pub used: u64,
    /// The session's INIT flags.
    pub session: u64,
    /// Every inode.
    pub inodes: Vec<InodeState>,
    /// Every directory.
    pub dirs: Vec<DirState>,
    /// Open handles: handle, inode, open flags.
    pub handles: Vec<(u64, u64, u32)>,
    /// The chunk store's allocator.
    pub store: StoreState,
}

/// Why a state cannot be restored.
#[derive(Debug, Error)]
pub enum StateError {
    /// Another format version.
    #[error("RAM filesystem state format {found}, this firmware reads {expected}")]
    Version {
        /// The state's.
        found: u32,
        /// This firmware's.
        expected: u32,
    },
    /// The state contradicts itself, the limits or the memfd.
    #[error("RAM filesystem state: {0}")]
    Invalid(String),
    /// The memfd cannot be mapped.
    #[error("RAM filesystem state: the memfd")]
    Memfd(#[source] std::io::Error),
}

fn ts(t: Timespec) -> (i64, u32) {
    (t.sec, t.nsec)
}

fn entry((tag, perm, id): AclEntryState) -> AclEntry {
    AclEntry { tag, perm, id }
}

fn entry_state(e: &AclEntry) -> AclEntryState {
    (e.tag, e.perm, e.id)
}

impl MetaState {
    fn of(m: &Meta) -> Self {
        MetaState {
            mode: m.mode,
            uid: m.uid,
            gid: m.gid,
            nlink: m.nlink,
            rdev: m.rdev,
            size: m.size,
            blocks: m.blocks,
            times: [ts(m.atime), ts(m.mtime), ts(m.ctime), ts(m.btime)],
            acl: m.acl.as_ref().map(|a| (a.group_obj, a.named.iter().map(entry_state).collect())),
            default_acl: m.default_acl.as_ref().map(|d| d.iter().map(entry_state).collect()),
            fcaps: m.fcaps,
            linkable: m.linkable,
            xattr_bytes: m.xattr_bytes,
        }
    }

    fn meta(&self) -> Meta {
        let t = |(sec, nsec): (i64, u32)| Timespec { sec, nsec: nsec.min(999_999_999) };
        Meta {
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            nlink: self.nlink,
            rdev: self.rdev,
            size: self.size,
            blocks: self.blocks,
            atime: t(self.times[0]),
            mtime: t(self.times[1]),
            ctime: t(self.times[2]),
            btime: t(self.times[3]),
            acl: self.acl.as_ref().map(|(group_obj, named)| {
                Arc::new(ExtAcl { group_obj: *group_obj, named: named.iter().copied().map(entry).collect() })
            }),
            default_acl: self.default_acl.as_ref().map(|d| d.iter().copied().map(entry).collect()),
            fcaps: self.fcaps,
            linkable: self.linkable,
            xattr_bytes: self.xattr_bytes,
        }
    }
}

/// What changed in a filesystem between [`RamFs::precopy`] and its quiet point: applied to
/// the copy a successor built from the earlier state, it gives the filesystem as it is now.
/// Its size follows what changed, not how many files there are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RamFsChanges {
    /// [`RAMFS_STATE_VERSION`] when written.
    pub version: u32,
    /// The next inode number.
    pub next_ino: u64,
    /// The next file handle.
    pub next_fh: u64,
    /// Bytes charged to the capacity.
    pub used: u64,
    /// The session's INIT flags.
    pub session: u64,
    /// Inodes changed or made, as they are now.
    pub inodes: Vec<InodeState>,
    /// Inodes dropped.
    pub gone: Vec<u64>,
    /// Directories made or changed: `(inode, Some((parent, next cookie)))`; removed: `None`.
    pub dirs: Vec<(u64, Option<(u64, u64)>)>,
    /// Entries set (`(directory, name, Some((cookie, inode, type)))`) or removed (`None`).
    pub names: Vec<NameChange>,
    /// Handles opened (`(handle, Some((inode, open flags)))`) or released (`None`).
    pub handles: Vec<(u64, Option<(u64, u32)>)>,
    /// The chunk store's allocator.
    pub store: StoreState,
}

/// One entry of [`RamFsChanges::names`]: directory, name, and the entry as it is now.
pub type NameChange = (u64, Vec<u8>, Option<(u64, u64, u32)>);

fn inode_state(inode: &Inode) -> InodeState {
    // Lock order: data, then meta, then xattrs.
    let body = match &inode.body {
        Body::File(data) => BodyState::File(runs(data.read().chunks.iter().map(|(&i, c)| (i, c.slot())))),
        Body::Symlink(target) => BodyState::Symlink(target.to_vec()),
        Body::Other => BodyState::Other,
    };
    let meta = MetaState::of(&inode.meta_ref());
    let x = inode.xattrs_ref();
    InodeState {
        ino: inode.ino,
        kind: inode.kind,
        meta,
        xattrs: x.map.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect(),
        lookups: inode.lookups(),
        opens: inode.opens(),
        body,
    }
}

impl RamFs {
    /// The filesystem as data, without its file data (see the module documentation). Taken
    /// while no request runs, it is exact; taken while requests run (by [`RamFs::precopy`]),
    /// each inode, directory and handle is as it was at some moment of the walk.
    pub fn save(&self) -> RamFsState {
        let mut all = Vec::new();
        self.inodes.for_each(|_, i| all.push(i.clone()));
        let mut inodes: Vec<InodeState> = all.iter().map(|i| inode_state(i)).collect();
        drop(all);
        inodes.sort_unstable_by_key(|i| i.ino);
        let dirs = self.copy_dirs();
        let mut handles = Vec::new();
        self.handles.for_each(|&fh, h| handles.push((fh, h.inode.ino, h.flags)));
        handles.sort_unstable();
        // Read last: every inode, handle and slot the walks saw is below them.
        RamFsState {
            version: RAMFS_STATE_VERSION,
            limits: (self.cfg.capacity, self.cfg.max_inodes, self.cfg.max_handles),
            next_ino: self.next_ino.load(Ordering::Acquire),
            next_fh: self.next_fh.load(Ordering::Acquire),
            used: self.used.load(Ordering::Acquire),
            session: self.session.load(Ordering::Acquire),
            inodes,
            dirs,
            handles,
            store: self.store_state(),
        }
    }

    /// Every directory, each read [`DIR_CHUNK`] entries at a time under the tree's read lock
    /// (so a copy taken while the filesystem serves holds namespace changes up only briefly).
    /// Between two chunks a name may be removed and made again: the later entry counts.
    fn copy_dirs(&self) -> Vec<DirState> {
        let inos: Vec<u64> = rd(&self.tree).iter().map(|(&ino, _)| ino).collect();
        let mut dirs = Vec::with_capacity(inos.len());
        for ino in inos {
            let mut entries = Vec::new();
            let (mut from, mut chunks) = (0, 0);
            let header = loop {
                let tree = rd(&self.tree);
                let Some(d) = tree.get(&ino) else { break None };
                let before = entries.len();
                for (_, name) in d.order.range(from..).take(DIR_CHUNK) {
                    if let Some(c) = d.get(name) {
                        entries.push((name.to_vec(), c.cookie, c.ino, c.typ));
                    }
                }
                chunks += 1;
                match entries.last() {
                    Some(&(_, cookie, _, _)) if entries.len() - before == DIR_CHUNK => from = cookie + 1,
                    _ => break Some((d.parent, d.next_cookie)),
                }
            };
            let Some((parent, next_cookie)) = header else { continue };
            if chunks > 1 {
                let mut latest: HashMap<&[u8], u64> = HashMap::new();
                for (name, cookie, _, _) in &entries {
                    let c = latest.entry(name).or_default();
                    *c = (*c).max(*cookie);
                }
                let keep: HashSet<u64> = latest.into_values().collect();
                entries.retain(|e| keep.contains(&e.1));
            }
            dirs.push(DirState { ino, parent, next_cookie, entries });
        }
        dirs.sort_unstable_by_key(|d| d.ino);
        dirs
    }

    fn store_state(&self) -> StoreState {
        let free: FreeState = self.store.free_state();
        StoreState {
            slots: self.store.slot_count(),
            next: free.next,
            resident: free.resident,
            punched: free.punched,
        }
    }

    /// The filesystem as data, taken while it serves (a live update's copy ahead of the quiet
    /// point): every change from now on is marked, and [`RamFs::changes`] gives them at the
    /// quiet point. [`RamFs::forget_precopy`] stops marking (an update called off).
    pub fn precopy(&self) -> RamFsState {
        // Marking starts before anything is read: a change the walk misses is marked.
        self.changes.start();
        wr(&self.tree).start_log();
        let mut copy = self.save();
        // The walks read each thing at a different moment. What no change touched is as it
        // was when marking began, so those parts agree with each other; the rest is marked
        // and travels again at the quiet point. The copy keeps only what agrees: a marked
        // file's chunks are left out (a slot it freed may be another file's by now), and so
        // are entries, directories and handles naming an inode the walk did not see (made
        // after it passed; their making is marked too).
        let marked = self.changes.marked_inodes();
        for i in copy.inodes.iter_mut().filter(|i| marked.contains(&i.ino)) {
            if let BodyState::File(runs) = &mut i.body {
                runs.clear();
            }
        }
        let seen: IdSet = copy.inodes.iter().map(|i| i.ino).collect();
        copy.dirs.retain(|d| seen.contains(&d.ino));
        for d in &mut copy.dirs {
            // A directory moved into one made after the walk passed: its entries stay (they
            // did not change), its parent for now is the root (its move is logged and its
            // real parent comes with the changes).
            if !seen.contains(&d.parent) {
                d.parent = ROOT_ID;
            }
            d.entries.retain(|e| seen.contains(&e.2));
        }
        copy.handles.retain(|h| seen.contains(&h.1));
        copy
    }

    /// Stops marking changes (the update the copy was for is called off).
    pub fn forget_precopy(&self) {
        self.changes.stop();
        wr(&self.tree).take_log();
    }

    /// What changed since [`RamFs::precopy`], taken while no request runs; marking stops.
    /// `None` when no copy was taken, or when more changed than the logs keep (then the
    /// filesystem travels whole, [`RamFs::save`]).
    pub fn changes(&self) -> Option<RamFsChanges> {
        let log = self.changes.stop();
        let tlog = wr(&self.tree).take_log();
        let (log, tlog) = (log?, tlog?);
        let mut inodes = Vec::new();
        let mut gone = Vec::new();
        for ino in log.inodes {
            match self.inodes.get(ino) {
                Some(i) => inodes.push(inode_state(&i)),
                None => gone.push(ino),
            }
        }
        let tree = rd(&self.tree);
        let dirs =
            (tlog.dirs.iter()).map(|&ino| (ino, tree.get(&ino).map(|d| (d.parent, d.next_cookie)))).collect();
        let names = (tlog.names.into_iter())
            .filter_map(|(dir, name)| {
                let d = tree.get(&dir)?;
                let now = d.get(&name).map(|c| (c.cookie, c.ino, c.typ));
                Some((dir, name.into_vec(), now))
            })
            .collect();
        drop(tree);
        let handles = (log.handles.iter())
            .map(|&fh| (fh, self.handles.get(fh).map(|h| (h.inode.ino, h.flags))))
            .collect();
        Some(RamFsChanges {
            version: RAMFS_STATE_VERSION,
            next_ino: self.next_ino.load(Ordering::Acquire),
            next_fh: self.next_fh.load(Ordering::Acquire),
            used: self.used.load(Ordering::Acquire),
            session: self.session.load(Ordering::Acquire),
            inodes,
            gone,
            dirs,
            names,
            handles,
            store: self.store_state(),
        })
    }

    /// A filesystem of `cfg` taken over from `state` (whole, taken at the quiet point), its
    /// file data in `memfd` (the predecessor's [`RamFs::data_memfd`]); the state is checked
    /// first. Its data stays the predecessor's until [`RamFs::take_data_back`].
    pub fn restore(cfg: RamFsConfig, state: &RamFsState, memfd: File) -> Result<RamFs, StateError> {
        Restoring::build(cfg, state, memfd, false)?.finish(None)
    }

    /// The filesystem taken over is this process's now (the predecessor let go): from here on
    /// it allocates and frees chunks of the memfd. Until then a taker that is dropped (an
    /// update called off) frees nothing the predecessor, serving on, still uses.
    pub fn take_data_back(&self) {
        self.store.take_back();
    }
}

/// A filesystem being taken over: built from a state copied while its predecessor served
/// ([`RamFs::precopy`]), it serves once [`Restoring::finish`] has applied what changed since.
/// Its store neither reuses nor frees a slot until then (the predecessor still writes them).
pub struct Restoring {
    fs: RamFs,
    /// Which slots of the store a chunk or a free list holds.
    owned: Vec<bool>,
    /// How many entries, directories (as themselves or as a parent) and handles name each
    /// inode: one that goes must be named by none.
    refs: IdMap<u64>,
}

fn bad<T>(what: String) -> Result<T, StateError> {
    Err(StateError::Invalid(what))
}

fn count(refs: &mut IdMap<u64>, ino: u64, up: bool) {
    let n = refs.entry(ino).or_default();
    *n = if up { *n + 1 } else { n.saturating_sub(1) };
}

impl Restoring {
    /// Checks the copy `state` ([`RamFs::precopy`]) and builds the filesystem it describes
    /// (not serving), its file data in `memfd`.
    pub fn new(cfg: RamFsConfig, state: &RamFsState, memfd: File) -> Result<Restoring, StateError> {
        Self::build(cfg, state, memfd, true)
    }

    /// `copy`: the state was read while the filesystem served, so its counts may pass the
    /// limits by what changed hands during the walk (they are checked once the changes are
    /// applied); only twice the limits are refused here.
    fn build(cfg: RamFsConfig, state: &RamFsState, memfd: File, copy: bool) -> Result<Restoring, StateError> {
        let mut owned = check(&cfg, state, copy)?;
        owned.resize(state.store.slots as usize, false);
        let free = FreeState {
            resident: state.store.resident.clone(),
            punched: state.store.punched.clone(),
            next: state.store.next,
        };
        let store = ChunkStore::from_memfd(memfd, state.store.slots, free).map_err(StateError::Memfd)?;
        store.give_away();
        let changes = Arc::new(Changes::default());
        let inodes = Table::new(changes.clone(), Ids::Inodes);
        for i in &state.inodes {
            let inode = new_inode(i, &store, &changes)?;
            inodes.insert(i.ino, inode);
        }
        let mut refs = IdMap::default();
        let mut tree = Tree::default();
        for d in &state.dirs {
            count(&mut refs, d.ino, true);
            count(&mut refs, d.parent, true);
            let dir = tree.restore_dir(d.ino, d.parent, d.next_cookie);
            for (name, cookie, ino, typ) in &d.entries {
                if dir.order.contains_key(cookie) || dir.entries.contains_key(name.as_slice()) {
                    return bad(format!("directory {}: a cookie or name repeats", d.ino));
                }
                let child = Child { cookie: *cookie, ino: *ino, typ: *typ };
                dir.entries.insert(name.clone().into_boxed_slice(), child);
                dir.order.insert(*cookie, name.clone().into_boxed_slice());
                count(&mut refs, *ino, true);
            }
        }
        let handles = Table::new(changes.clone(), Ids::Handles);
        for &(fh, ino, flags) in &state.handles {
            let inode =
                inodes.get(ino).ok_or_else(|| StateError::Invalid(format!("handle {fh}: no inode {ino}")))?;
            handles.insert(fh, Arc::new(Handle { inode, flags }));
            count(&mut refs, ino, true);
        }
        let fs = RamFs {
            cfg,
            tree: RwLock::new(tree),
            inodes,
            handles,
            next_ino: AtomicU64::new(state.next_ino),
            next_fh: AtomicU64::new(state.next_fh),
            used: AtomicU64::new(state.used),
            store,
            nhandles: AtomicU64::new(state.handles.len() as u64),
            ninodes: AtomicU64::new(state.inodes.len() as u64),
            session: AtomicU64::new(state.session),
            changes,
        };
        Ok(Restoring { fs, owned, refs })
    }

    /// The filesystem, `changes` applied (each checked against the filesystem as built so
    /// far: the cost follows the changes, not the filesystem's size). Its data stays the
    /// predecessor's until [`RamFs::take_data_back`].
    pub fn finish(mut self, changes: Option<&RamFsChanges>) -> Result<RamFs, StateError> {
        if let Some(c) = changes {
            self.apply(c)?;
            let free = FreeState {
                resident: c.store.resident.clone(),
                punched: c.store.punched.clone(),
                next: c.store.next,
            };
            self.fs.store.set_free(free);
        }
        Ok(self.fs)
    }

    fn mark(&mut self, slot: u32, next: u32) -> Result<(), StateError> {
        match self.owned.get_mut(slot as usize) {
            Some(o) if !*o && slot < next => {
                *o = true;
                Ok(())
            }
            _ => bad(format!("slot {slot} is outside the used slots or owned twice")),
        }
    }

    fn unmark_file(&mut self, inode: &Inode) {
        if let Body::File(data) = &inode.body {
            for c in data.read().chunks.values() {
                if let Some(o) = self.owned.get_mut(c.slot() as usize) {
                    *o = false;
                }
            }
        }
    }

    fn apply(&mut self, c: &RamFsChanges) -> Result<(), StateError> {
        if c.version != RAMFS_STATE_VERSION {
            return Err(StateError::Version { found: c.version, expected: RAMFS_STATE_VERSION });
        }
        let fs = &self.fs;
        let before = (fs.next_ino.load(Ordering::Relaxed), fs.next_fh.load(Ordering::Relaxed));
        let old_free = fs.store.free_state();
        if c.next_ino < before.0
            || c.next_fh < before.1
            || c.store.slots != fs.store.slot_count()
            || c.store.next < old_free.next
            || c.store.next > c.store.slots
            || c.used > fs.cfg.capacity
        {
            return bad("the changes move a counter back or past its limit".into());
        }
        let next = c.store.next;
        for s in old_free.resident.iter().chain(&old_free.punched) {
            if let Some(o) = self.owned.get_mut(*s as usize) {
                *o = false;
            }
        }
        let gone: IdSet = c.gone.iter().copied().collect();
        let changed: IdSet = c.inodes.iter().map(|i| i.ino).collect();
        let dirs: IdSet = c.dirs.iter().map(|d| d.0).collect();
        let names: HashSet<(u64, &[u8])> = c.names.iter().map(|(d, n, _)| (*d, n.as_slice())).collect();
        let handles: IdSet = c.handles.iter().map(|h| h.0).collect();
        if gone.len() != c.gone.len()
            || changed.len() != c.inodes.len()
            || dirs.len() != c.dirs.len()
            || names.len() != c.names.len()
            || handles.len() != c.handles.len()
        {
            return bad("an inode, directory, entry or handle repeats in the changes".into());
        }
        // Every slot that changes hands is let go before any is taken (a file gone may have
        // freed a slot a file made since took).
        for ino in c.inodes.iter().map(|i| i.ino).chain(c.gone.iter().copied()) {
            if let Some(inode) = self.fs.inodes.get(ino) {
                self.unmark_file(&inode);
            }
        }
        // Inodes: changed in place (handles hold them), or made.
        for i in &c.inodes {
            if gone.contains(&i.ino) || i.ino >= c.next_ino {
                return bad(format!("inode {} both changed and gone, or past the next number", i.ino));
            }
            match self.fs.inodes.get(i.ino) {
                Some(inode) => {
                    let same = match (&inode.body, &i.body) {
                        (Body::File(_), BodyState::File(_)) | (Body::Other, BodyState::Other) => true,
                        (Body::Symlink(t), BodyState::Symlink(n)) => **t == n[..],
                        _ => false,
                    };
                    if inode.kind != i.kind || !same {
                        return bad(format!("inode {} changes its type", i.ino));
                    }
                    if let BodyState::File(r) = &i.body {
                        let data = self.file_data(r, next)?;
                        inode.set_restored_data(data);
                    }
                    inode.set_restored(i.meta.meta(), xattrs(i), i.lookups, i.opens);
                }
                None => {
                    if let BodyState::File(r) = &i.body {
                        for (_, slot) in checked_runs(r)?.iter().flat_map(|&r| run_chunks(r)) {
                            self.mark(slot, next)?;
                        }
                    }
                    let inode = new_inode(i, &self.fs.store, &self.fs.changes)?;
                    self.fs.inodes.insert(i.ino, inode);
                    self.fs.ninodes.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let exists = |fs: &RamFs, ino: u64| fs.inodes.get(ino).is_some();
        // Directories, then their entries.
        {
            let mut tree = wr(&self.fs.tree);
            for &(ino, header) in &c.dirs {
                if let Some(d) = tree.get(&ino) {
                    count(&mut self.refs, d.parent, false);
                    count(&mut self.refs, ino, false);
                }
                match header {
                    None => {
                        if let Some(d) = tree.restore_remove_dir(ino) {
                            for child in d.entries.values() {
                                count(&mut self.refs, child.ino, false);
                            }
                        }
                    }
                    Some((parent, next_cookie)) => {
                        if !exists(&self.fs, ino) || !exists(&self.fs, parent) {
                            return bad(format!("directory {ino} or its parent {parent} is no inode"));
                        }
                        if tree.get(&ino).is_some_and(|d| next_cookie < d.next_cookie) {
                            return bad(format!("directory {ino}: its next cookie goes back"));
                        }
                        tree.restore_dir(ino, parent, next_cookie);
                        count(&mut self.refs, ino, true);
                        count(&mut self.refs, parent, true);
                    }
                }
            }
            for (dir, name, now) in &c.names {
                let Some(d) = tree.get(dir) else {
                    if now.is_some() {
                        return bad(format!("an entry in {dir}, which is no directory"));
                    }
                    continue;
                };
                let child = match *now {
                    Some((cookie, ino, typ)) => {
                        let clash = d.order.get(&cookie).is_some_and(|n| **n != name[..]);
                        if name.is_empty() || name.len() > NAME_MAX || cookie >= d.next_cookie || clash {
                            return bad(format!(
                                "directory {dir}: a bad name, or a cookie past its next or taken"
                            ));
                        }
                        if !exists(&self.fs, ino) {
                            return bad(format!(
                                "directory {dir}: an entry names inode {ino} that is not there"
                            ));
                        }
                        Some(Child { cookie, ino, typ })
                    }
                    None => None,
                };
                if let Some(old) = tree.restore_entry(*dir, name, child) {
                    count(&mut self.refs, old.ino, false);
                }
                if let Some(c) = child {
                    count(&mut self.refs, c.ino, true);
                }
            }
        }
        // Handles.
        for &(fh, now) in &c.handles {
            if let Some(old) = self.fs.handles.remove_if(fh, |_| true) {
                count(&mut self.refs, old.inode.ino, false);
                self.fs.nhandles.fetch_sub(1, Ordering::Relaxed);
            }
            if let Some((ino, flags)) = now {
                let Some(inode) = self.fs.inodes.get(ino).filter(|_| fh < c.next_fh) else {
                    return bad(format!("handle {fh} past the next handle, or on no inode"));
                };
                self.fs.handles.insert(fh, Arc::new(Handle { inode, flags }));
                count(&mut self.refs, ino, true);
                self.fs.nhandles.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Inodes gone: named by nothing any more.
        for &ino in &c.gone {
            if ino == ROOT_ID || self.refs.get(&ino).is_some_and(|&n| n > 0) {
                return bad(format!("inode {ino} is gone but still named or open"));
            }
            self.refs.remove(&ino);
            if let Some(inode) = self.fs.inodes.remove_if(ino, |_| true) {
                inode.set_restored_data(FileData::default());
                self.fs.ninodes.fetch_sub(1, Ordering::Relaxed);
            }
        }
        for &s in c.store.resident.iter().chain(&c.store.punched) {
            self.mark(s, next)?;
        }
        let fs = &self.fs;
        if fs.ninodes.load(Ordering::Relaxed) > fs.cfg.max_inodes
            || fs.nhandles.load(Ordering::Relaxed) > fs.cfg.max_handles
        {
            return bad("more inodes or handles than the limits".into());
        }
        fs.next_ino.store(c.next_ino, Ordering::Relaxed);
        fs.next_fh.store(c.next_fh, Ordering::Relaxed);
        fs.used.store(c.used, Ordering::Relaxed);
        fs.session.store(c.session, Ordering::Relaxed);
        Ok(())
    }

    /// A file's chunks from its runs, each slot marked owned.
    fn file_data(&mut self, runs: &[(u64, u32, u32)], next: u32) -> Result<FileData, StateError> {
        let mut map = BTreeMap::new();
        for (index, slot) in checked_runs(runs)?.iter().flat_map(|&r| run_chunks(r)) {
            self.mark(slot, next)?;
            let chunk =
                self.fs.store.claim(slot).ok_or_else(|| StateError::Invalid(format!("slot {slot}")))?;
            map.insert(index, chunk);
        }
        Ok(FileData { chunks: map })
    }
}

/// `runs`, refused if one is empty or overflows.
fn checked_runs(runs: &[(u64, u32, u32)]) -> Result<&[(u64, u32, u32)], StateError> {
    match runs.iter().find(|&&(index, slot, count)| {
        count == 0 || index.checked_add(u64::from(count)).is_none() || slot.checked_add(count).is_none()
    }) {
        Some(&(index, slot, count)) => {
            bad(format!("chunk run ({index}, {slot}, {count}) is empty or overflows"))
        }
        None => Ok(runs),
    }
}

fn xattrs(i: &InodeState) -> Xattrs {
    let mut x = Xattrs::default();
    for (k, v) in &i.xattrs {
        x.list_len += k.len() + 1;
        x.map.insert(k.clone().into_boxed_slice(), v.clone().into_boxed_slice());
    }
    x
}

/// An inode as `i` describes it, its chunks claimed from `store` (the caller checked them).
fn new_inode(
    i: &InodeState,
    store: &Arc<ChunkStore>,
    changes: &Arc<Changes>,
) -> Result<Arc<Inode>, StateError> {
    let body = match &i.body {
        BodyState::File(chunks) => {
            let mut map = BTreeMap::new();
            for (index, slot) in checked_runs(chunks)?.iter().flat_map(|&r| run_chunks(r)) {
                let chunk = store.claim(slot).ok_or_else(|| StateError::Invalid(format!("slot {slot}")))?;
                map.insert(index, chunk);
            }
            Body::File(FileLock::new(FileData { chunks: map }))
        }
        BodyState::Symlink(t) => Body::Symlink(t.clone().into_boxed_slice()),
        BodyState::Other => Body::Other,
    };
    let inode = Arc::new(Inode::new(i.ino, i.kind, i.meta.meta(), i.lookups, body, changes.clone()));
    inode.set_restored(i.meta.meta(), xattrs(i), i.lookups, i.opens);
    Ok(inode)
}

/// Whether `state` can be restored into a filesystem of `cfg`: nothing is built before this.
fn check(cfg: &RamFsConfig, s: &RamFsState, copy: bool) -> Result<Vec<bool>, StateError> {
    let bad = |what: String| Err(StateError::Invalid(what));
    if s.version != RAMFS_STATE_VERSION {
        return Err(StateError::Version { found: s.version, expected: RAMFS_STATE_VERSION });
    }
    if s.limits != (cfg.capacity, cfg.max_inodes, cfg.max_handles) {
        return bad(format!(
            "limits {:?}, this filesystem's {:?}",
            s.limits,
            (cfg.capacity, cfg.max_inodes, cfg.max_handles)
        ));
    }
    if u64::from(s.store.slots) != cfg.capacity / CHUNK as u64 || s.store.next > s.store.slots {
        return bad(format!(
            "{} slots (next {}) for a capacity of {}",
            s.store.slots, s.store.next, cfg.capacity
        ));
    }
    // Every slot below `next` is either free (once) or a chunk of one file (once).
    let mut seen = vec![false; s.store.next as usize];
    let mut runs = Vec::new();
    for i in &s.inodes {
        if let BodyState::File(r) = &i.body {
            runs.extend(r.iter().copied());
        }
    }
    if let Some(&(index, slot, count)) = runs.iter().find(|&&(index, slot, count)| {
        count == 0 || index.checked_add(u64::from(count)).is_none() || slot.checked_add(count).is_none()
    }) {
        return bad(format!("chunk run ({index}, {slot}, {count}) is empty or overflows"));
    }
    let slots = runs.iter().flat_map(|&r| run_chunks(r).map(|(_, slot)| slot));
    for slot in s.store.resident.iter().chain(&s.store.punched).copied().chain(slots) {
        match seen.get_mut(slot as usize) {
            Some(owned) if !*owned => *owned = true,
            _ => return bad(format!("slot {slot} is outside the used slots or owned twice")),
        }
    }
    let inos: HashSet<u64> = s.inodes.iter().map(|i| i.ino).collect();
    if inos.len() != s.inodes.len() || !inos.contains(&ROOT_ID) {
        return bad("inode numbers repeat, or there is no root".into());
    }
    let slack = if copy { 2 } else { 1 };
    if s.inodes.len() as u64 > cfg.max_inodes.saturating_mul(slack)
        || s.handles.len() as u64 > cfg.max_handles.saturating_mul(slack)
        || s.used > cfg.capacity
    {
        return bad("more inodes, handles or bytes than the limits".into());
    }
    if let Some(i) = s.inodes.iter().find(|i| i.ino >= s.next_ino) {
        return bad(format!("inode {} at or past the next inode number {}", i.ino, s.next_ino));
    }
    for d in &s.dirs {
        if !inos.contains(&d.ino) || !inos.contains(&d.parent) {
            return bad(format!("directory {} or its parent {} is no inode", d.ino, d.parent));
        }
        if let Some((_, _, ino, _)) =
            d.entries.iter().find(|(_, c, ino, _)| !inos.contains(ino) || *c >= d.next_cookie)
        {
            return bad(format!(
                "directory {}: an entry names inode {ino} that is not there, or a cookie past its next",
                d.ino
            ));
        }
    }
    if let Some((fh, _, _)) = s.handles.iter().find(|(fh, ino, _)| *fh >= s.next_fh || !inos.contains(ino)) {
        return bad(format!("handle {fh} past the next handle, or on no inode"));
    }
    Ok(seen)
}

/// `(chunk index, slot)` pairs in index order as runs of consecutive indices in consecutive
/// slots.
fn runs(chunks: impl Iterator<Item = (u64, u32)>) -> Vec<(u64, u32, u32)> {
    let mut out: Vec<(u64, u32, u32)> = Vec::new();
    for (index, slot) in chunks {
        match out.last_mut() {
            Some((i, s, n))
                if *i + u64::from(*n) == index && s.checked_add(*n) == Some(slot) && *n < u32::MAX =>
            {
                *n += 1
            }
            _ => out.push((index, slot, 1)),
        }
    }
    out
}

/// The `(chunk index, slot)` pairs of one run (checked not to overflow by `check`).
fn run_chunks((index, slot, count): (u64, u32, u32)) -> impl Iterator<Item = (u64, u32)> {
    (0..count).map(move |k| (index + u64::from(k), slot + k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filesystem::{Context, FileSystem};

    /// More changes in a copy's window than the logs keep (64 under test): the copy is given
    /// up, the filesystem then travels whole (`changes` is `None`), and a later copy starts
    /// afresh.
    #[test]
    fn a_copy_whose_window_saw_too_many_changes_is_given_up() {
        let fs = RamFs::new();
        let ctx = Context { uid: 0, gid: 0, pid: 1, supp_gid: None };
        for (what, churn) in [("names", true), ("inodes", false)] {
            fs.precopy();
            for n in 0..200u32 {
                let name = format!("{what}{n}");
                let e = fs.mkdir(&ctx, ROOT_ID, name.as_bytes(), 0o755, 0).unwrap();
                if churn {
                    fs.rmdir(&ctx, ROOT_ID, name.as_bytes()).unwrap();
                    fs.forget(&ctx, e.ino, 1);
                }
            }
            assert!(fs.changes().is_none(), "{what}: the copy is given up");
            assert!(!fs.changes.on(), "{what}: marking stopped");
        }
        let base = fs.precopy();
        fs.mkdir(&ctx, ROOT_ID, b"after", 0o755, 0).unwrap();
        let changes = fs.changes().expect("a copy of a quiet window");
        let memfd = File::from(fs.data_memfd().try_clone_to_owned().unwrap());
        let g = Restoring::new(RamFsConfig::default(), &base, memfd).unwrap().finish(Some(&changes)).unwrap();
        assert_eq!(g.save(), fs.save());
    }
}
