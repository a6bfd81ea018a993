//! The node table: FUSE node ids for host inodes, each held open as an `O_PATH` descriptor.
//!
//! A host inode is identified by [`InodeKey`] (device, inode number, mount id): while we hold a
//! descriptor on it, its inode number cannot be reused, so the key names one inode. Node ids are
//! handed out from a counter and never reused, so the FUSE generation is always 0. Each node
//! counts the kernel's lookup references; FORGET drops them and the node (with its descriptor)
//! goes when they reach 0 and no open handle or in-flight operation still holds its `Arc`.
//!
//! Directories remember the directory they were last looked up (or renamed) in, so that `..` is
//! answered from the table and never resolved by the host kernel: the root's parent is the root.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};

use super::keep::{HeldItem, NodeRecord, ShareKeep};

use crate::abi::ROOT_ID;

/// What identifies a host inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InodeKey {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// Mount id (`STATX_MNT_ID`), 0 where the kernel does not report it.
    pub mnt: u64,
}

impl InodeKey {
    /// The key of the inode `st` describes.
    pub fn of(st: &libc::statx) -> Self {
        let dev = libc::makedev(st.stx_dev_major, st.stx_dev_minor);
        let mnt = if st.stx_mask & libc::STATX_MNT_ID != 0 { st.stx_mnt_id } else { 0 };
        InodeKey { dev, ino: st.stx_ino, mnt }
    }
}

/// A host inode the guest knows by a node id.
#[derive(Debug)]
pub struct Inode {
    /// The FUSE node id.
    pub id: u64,
    /// An `O_PATH | O_NOFOLLOW` descriptor on the inode (never opened for I/O).
    fd: OwnedFd,
    /// Which host inode it is.
    pub key: InodeKey,
    /// File type bits (`S_IFMT` part of the mode); fixed for the life of an inode.
    pub kind: u32,
    /// For a directory: the directory it was last found in (`None` for the root).
    parent: Mutex<Option<Arc<Inode>>>,
    /// Open handles on it.
    pub opens: AtomicU64,
    /// Its slot in the records kept for a crash (`keep.rs`), once it has one.
    kept: OnceLock<(Arc<ShareKeep>, u32)>,
    /// The change that queued its descriptor for the supervisor (`ShareKeep::queue_hold`;
    /// 0: given at once, or not kept).
    held_seq: AtomicU64,
}

impl AsFd for Inode {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Inode {
    fn drop(&mut self) {
        if let Some((k, slot)) = self.kept.get() {
            k.gone(*slot, self.id);
        }
    }
}

impl Inode {
    /// A node taken over from another process (a live update): its parent is set once every
    /// node exists (`Inode::set_parent`).
    pub fn restored(id: u64, fd: OwnedFd, key: InodeKey, kind: u32) -> Self {
        Inode {
            id,
            fd,
            key,
            kind,
            parent: Mutex::new(None),
            opens: AtomicU64::new(0),
            kept: OnceLock::new(),
            held_seq: AtomicU64::new(0),
        }
    }

    /// Its slot in the records kept for a crash, if it has one.
    pub fn kept_slot(&self) -> Option<u32> {
        self.kept.get().map(|(_, s)| *s)
    }

    /// What the supervisor holds its descriptor as.
    pub fn held_item(&self) -> HeldItem {
        HeldItem::Node { key: (self.key.dev, self.key.ino, self.key.mnt), kind: self.kind }
    }

    /// The `O_PATH` descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }

    /// The directory this directory was last found in.
    pub fn parent(&self) -> Option<Arc<Inode>> {
        self.parent.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Records where this directory now lives (no-op for other types and for the root).
    pub(super) fn set_parent(&self, parent: &Arc<Inode>) {
        if self.is_dir() && self.id != ROOT_ID && parent.id != self.id {
            *self.parent.lock().unwrap_or_else(PoisonError::into_inner) = Some(parent.clone());
        }
    }
}

struct Slot {
    inode: Arc<Inode>,
    /// The kernel's lookup references.
    refs: u64,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<u64, Slot>,
    by_key: HashMap<InodeKey, u64>,
    next_id: u64,
    /// While a live update copies the table ahead of its quiet point: the nodes whose table
    /// entry (presence, references) or parent changed since ([`InodeTable::start_log`]).
    log: Option<ChangeLog>,
    /// The records kept for a crash (`keep.rs`): each change is written there.
    keep: Option<Arc<ShareKeep>>,
}

/// The most nodes one copy's window logs; past it the copy is given up (the share travels
/// whole at the quiet point).
pub const MAX_LOGGED: usize = if cfg!(test) { 64 } else { 1 << 18 };

#[derive(Default)]
struct ChangeLog {
    /// Each node logged, held weakly: one that left the table may live on (a handle or a
    /// child directory holds it), and its parent then matters.
    ids: HashMap<u64, Weak<Inode>>,
    overflowed: bool,
}

impl Inner {
    /// Writes `inode`'s record, if it is kept: its references while it is in the table (as
    /// this node), its parent.
    fn keep_record(&self, inode: &Arc<Inode>) {
        let (Some(k), Some((_, slot))) = (&self.keep, inode.kept.get()) else { return };
        let refs = self.by_id.get(&inode.id).filter(|s| Arc::ptr_eq(&s.inode, inode)).map(|s| s.refs);
        let parent = inode.parent().map_or(0, |p| p.id);
        k.write(&NodeRecord { slot: *slot, id: inode.id, refs, parent });
    }

    /// Logs `inode` as changed. The root is never logged: its entry (one reference, no
    /// parent) never changes as far as a successor is concerned.
    fn mark(&mut self, inode: &Arc<Inode>) {
        self.keep_record(inode);
        if inode.id == ROOT_ID {
            return;
        }
        if let Some(log) = &mut self.log {
            if !log.overflowed {
                log.ids.insert(inode.id, Arc::downgrade(inode));
                if log.ids.len() > MAX_LOGGED {
                    *log = ChangeLog { overflowed: true, ..ChangeLog::default() };
                }
            }
        }
    }
}

/// Node id -> inode, and host key -> node id.
pub struct InodeTable {
    inner: RwLock<Inner>,
    root: Arc<Inode>,
}

impl InodeTable {
    /// A table holding just the root, node id [`ROOT_ID`].
    pub fn new(root_fd: OwnedFd, st: &libc::statx) -> Self {
        let root = Arc::new(Inode {
            id: ROOT_ID,
            fd: root_fd,
            key: InodeKey::of(st),
            kind: u32::from(st.stx_mode) & libc::S_IFMT,
            parent: Mutex::new(None),
            opens: AtomicU64::new(0),
            kept: OnceLock::new(),
            held_seq: AtomicU64::new(0),
        });
        let mut inner = Inner { next_id: ROOT_ID + 1, ..Default::default() };
        inner.by_id.insert(ROOT_ID, Slot { inode: root.clone(), refs: 1 });
        inner.by_key.insert(root.key, ROOT_ID);
        InodeTable { inner: RwLock::new(inner), root }
    }

    /// The root.
    pub fn root(&self) -> &Arc<Inode> {
        &self.root
    }

    /// The inode with node id `id`.
    pub fn get(&self, id: u64) -> Option<Arc<Inode>> {
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        inner.by_id.get(&id).map(|s| s.inode.clone())
    }

    /// The node already known for `key`, with one more lookup reference, found in directory
    /// `dir` (a directory's parent is set to it; under the table's lock, so that a live
    /// update's copy either sees the change or has it logged).
    pub fn lookup_key_in(&self, key: &InodeKey, dir: &Arc<Inode>) -> Option<Arc<Inode>> {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let id = *inner.by_key.get(key)?;
        let slot = inner.by_id.get_mut(&id)?;
        slot.refs += 1;
        let inode = slot.inode.clone();
        inode.set_parent(dir);
        inner.mark(&inode);
        Some(inode)
    }

    /// One more lookup reference on `inode`, putting it back in the table if it was forgotten
    /// meanwhile (as the node already known for its key, if there is one now, or under its own
    /// id). `dup` supplies a fresh descriptor in that last case.
    pub fn reref(
        &self,
        inode: &Arc<Inode>,
        dup: impl FnOnce() -> std::io::Result<OwnedFd>,
    ) -> std::io::Result<Arc<Inode>> {
        {
            let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
            if let Some(slot) = inner.by_id.get_mut(&inode.id) {
                slot.refs += 1;
                let found = slot.inode.clone();
                inner.mark(&found);
                return Ok(found);
            }
            if let Some(&id) = inner.by_key.get(&inode.key) {
                if let Some(slot) = inner.by_id.get_mut(&id) {
                    slot.refs += 1;
                    let found = slot.inode.clone();
                    inner.mark(&found);
                    return Ok(found);
                }
            }
        }
        let fd = dup()?;
        Ok(self.intern(fd, inode.key, inode.kind, inode.parent().as_ref()))
    }

    /// The node for the inode `fd` holds (key `key`, type `kind`), with one more lookup
    /// reference: the existing node if the key is known (and `fd` is closed), else a new one.
    /// `parent` is the directory it was found in.
    pub fn intern(&self, fd: OwnedFd, key: InodeKey, kind: u32, parent: Option<&Arc<Inode>>) -> Arc<Inode> {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(&id) = inner.by_key.get(&key) {
            if let Some(slot) = inner.by_id.get_mut(&id) {
                slot.refs += 1;
                let inode = slot.inode.clone();
                if let Some(p) = parent {
                    inode.set_parent(p);
                }
                inner.mark(&inode);
                drop(inner);
                // Made by a request whose round has not given its descriptor yet: given
                // before this one's answer names it.
                if let Some((k, _)) = inode.kept.get() {
                    k.flush_through(inode.held_seq.load(Ordering::Acquire));
                }
                return inode;
            }
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let parent = parent.filter(|_| kind == libc::S_IFDIR).cloned();
        let inode = Arc::new(Inode {
            id,
            fd,
            key,
            kind,
            parent: Mutex::new(parent),
            opens: AtomicU64::new(0),
            kept: OnceLock::new(),
            held_seq: AtomicU64::new(0),
        });
        if let Some(k) = &inner.keep {
            // Its descriptor queued for the supervisor (given before any answer names its id),
            // and the ids never given past it.
            k.next_ids(id + 1, 0);
            if let Some(slot) = k.alloc() {
                let _ = inode.kept.set((k.clone(), slot));
                let seq = k.queue_hold(id, inode.held_item(), inode.clone());
                inode.held_seq.store(seq, Ordering::Release);
            }
        }
        inner.by_id.insert(id, Slot { inode: inode.clone(), refs: 1 });
        inner.by_key.insert(key, id);
        inner.mark(&inode);
        inode
    }

    /// Drops `n` lookup references on `id`; the node leaves the table at 0 (never the root).
    pub fn forget(&self, id: u64, n: u64) {
        let gone = {
            let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
            let Some(slot) = inner.by_id.get_mut(&id) else {
                return;
            };
            slot.refs = slot.refs.saturating_sub(n);
            let keep = slot.refs > 0 || id == ROOT_ID;
            let inode = slot.inode.clone();
            inner.mark(&inode);
            if keep {
                return;
            }
            let gone = inner.by_id.remove(&id);
            if let Some(s) = &gone {
                if inner.by_key.get(&s.inode.key) == Some(&id) {
                    inner.by_key.remove(&s.inode.key);
                }
                inner.keep_record(&s.inode);
            }
            gone
        };
        // The descriptor closes here, outside the lock (if nothing else holds the inode).
        drop(gone);
    }

    /// Forgets every node but the root (the session ended).
    pub fn clear(&self) {
        let old = {
            let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
            let mut by_id = std::mem::take(&mut inner.by_id);
            for slot in by_id.values() {
                inner.mark(&slot.inode);
            }
            let root = by_id.remove(&ROOT_ID);
            inner.by_key.clear();
            for slot in by_id.values() {
                inner.keep_record(&slot.inode);
            }
            if let Some(root) = root {
                inner.by_key.insert(root.inode.key, ROOT_ID);
                inner.by_id.insert(ROOT_ID, Slot { inode: root.inode, refs: 1 });
            }
            by_id
        };
        drop(old);
    }

    /// Nodes in the table (the root included).
    pub fn len(&self) -> usize {
        self.inner.read().unwrap_or_else(PoisonError::into_inner).by_id.len()
    }

    /// Whether the table is empty (it never is: the root stays).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every node in the table with its lookup references, the root first, and the next node
    /// id (a live update; taken while no request runs).
    pub fn entries(&self) -> (Vec<(Arc<Inode>, u64)>, u64) {
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        let mut all = Vec::with_capacity(inner.by_id.len());
        all.push((self.root.clone(), 1));
        all.extend(inner.by_id.values().filter(|s| s.inode.id != ROOT_ID).map(|s| (s.inode.clone(), s.refs)));
        (all, inner.next_id)
    }

    /// A table of the nodes of another process (a live update): `root`, and `nodes` with their
    /// lookup references (the root not among them; their keys distinct, checked by the
    /// caller); node ids go on from `next_id`.
    pub fn rebuild(root: Arc<Inode>, nodes: Vec<(Arc<Inode>, u64)>, next_id: u64) -> Self {
        let mut inner = Inner { next_id, ..Default::default() };
        inner.by_id.reserve(nodes.len() + 1);
        inner.by_key.reserve(nodes.len() + 1);
        inner.by_id.insert(ROOT_ID, Slot { inode: root.clone(), refs: 1 });
        inner.by_key.insert(root.key, ROOT_ID);
        for (inode, refs) in nodes {
            inner.by_key.insert(inode.key, inode.id);
            inner.by_id.insert(inode.id, Slot { inode, refs });
        }
        InodeTable { inner: RwLock::new(inner), root }
    }

    /// Keeps the table in `keep` from now on (crash recovery): every node in it and every
    /// one of `others` (out of the table, held by a handle or a child directory) gets a slot
    /// (its slot in `slots`, a recovery's, else a new one), its record and, if `give`, its
    /// descriptor held (else the keeper has it already).
    pub fn keep_in(
        &self,
        keep: &Arc<ShareKeep>,
        slots: &HashMap<u64, u32>,
        others: &[Arc<Inode>],
        give: bool,
    ) {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<Arc<Inode>> = inner.by_id.values().map(|s| s.inode.clone()).collect();
        all.extend(others.iter().filter(|o| !inner.by_id.contains_key(&o.id)).cloned());
        for chunk in all.chunks(200) {
            let mut items = Vec::with_capacity(chunk.len());
            let mut fds = Vec::with_capacity(chunk.len());
            for inode in chunk {
                if inode.kept.get().is_none() {
                    let Some(slot) = slots.get(&inode.id).copied().or_else(|| keep.alloc()) else { continue };
                    let _ = inode.kept.set((keep.clone(), slot));
                }
                items.push((inode.id, inode.held_item()));
                fds.push(inode.fd());
            }
            if give {
                keep.hold(&items, &fds);
            }
        }
        inner.keep = Some(keep.clone());
        for inode in &all {
            inner.keep_record(inode);
        }
    }

    /// Logs every change from now on (a live update's copy; forgets an earlier log).
    pub fn start_log(&self) {
        self.inner.write().unwrap_or_else(PoisonError::into_inner).log = Some(ChangeLog::default());
    }

    /// Stops logging; the nodes changed since [`Self::start_log`] (each with the node, if it
    /// is still alive), or `None` if the log was off or overflowed.
    pub fn take_log(&self) -> Option<Vec<(u64, Option<Arc<Inode>>)>> {
        let log = self.inner.write().unwrap_or_else(PoisonError::into_inner).log.take()?;
        (!log.overflowed).then(|| log.ids.into_iter().map(|(id, w)| (id, w.upgrade())).collect())
    }

    /// Node `id` with its lookup references if it is in the table now.
    pub fn slot(&self, id: u64) -> Option<(Arc<Inode>, u64)> {
        let inner = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        inner.by_id.get(&id).map(|s| (s.inode.clone(), s.refs))
    }

    /// Puts `inode` in the table with `refs` references, or takes node `id` out (`None`): a
    /// taken-over table being brought up to date (a live update). Refused if another node in
    /// the table has its key, or for the root.
    pub fn restore_slot(&self, id: u64, now: Option<(Arc<Inode>, u64)>) -> Result<(), String> {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        if id == ROOT_ID {
            return Err("the root changes".into());
        }
        if let Some(old) = inner.by_id.remove(&id) {
            if inner.by_key.get(&old.inode.key) == Some(&id) {
                inner.by_key.remove(&old.inode.key);
            }
        }
        if let Some((inode, refs)) = now {
            if inner.by_key.get(&inode.key).is_some_and(|&other| other != id) {
                return Err(format!("node {id} names an inode another node names"));
            }
            inner.by_key.insert(inode.key, id);
            inner.by_id.insert(id, Slot { inode, refs });
        }
        Ok(())
    }

    /// The next node id.
    pub fn next_id(&self) -> u64 {
        self.inner.read().unwrap_or_else(PoisonError::into_inner).next_id
    }

    /// Node ids go on from `next_id` (a taken-over table).
    pub fn restore_next_id(&self, next_id: u64) {
        self.inner.write().unwrap_or_else(PoisonError::into_inner).next_id = next_id;
    }

    /// The lookup references the kernel holds on `id`.
    pub fn refs(&self, id: u64) -> Option<u64> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner).by_id.get(&id).map(|s| s.refs)
    }
}
