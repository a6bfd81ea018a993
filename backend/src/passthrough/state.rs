//! The passthrough as data (issue 22, live update): what a process that takes a shared
//! directory over needs, beside the descriptors themselves, which travel with it.
//!
//! Every node is a host inode held by an `O_PATH` descriptor, every open handle an open file
//! description: both move as descriptors (`SCM_RIGHTS`), so a file's offset, its `O_APPEND`
//! and the inode itself stay exactly what they were, and nothing is looked up again by name.
//! The state says which descriptor is which node or handle, with the node ids, the kernel's
//! lookup references, each directory's parent (for `..`), the handles' ids and access modes,
//! the session's INIT flags and the limits.
//!
//! [`PassthroughFs::save`] is taken while no request runs (the function at its quiet point).
//! [`PassthroughFs::restore`] checks each descriptor against the state before it builds
//! anything (every node's descriptor is the inode its key names, every handle's file the
//! inode of its node, the root the directory this process was told to share) and refuses the
//! state with a [`StateError`] otherwise.
//!
//! The nodes keep the mount they were opened on: in a sandbox, the old process's bind mount
//! of the share, which the new process uses through them (mounts below the share that the old
//! namespace had are not crossed once that namespace is gone: see DESIGN.md "Live update").

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::inode::{Inode, InodeKey, InodeTable};
use super::keep::{HeldItem, NodeRecord, ShareKeep, HANDLE_KEY};
use super::{descriptor_budget, sys, uring, Handle, PassthroughConfig, PassthroughFs};
use crate::abi::ROOT_ID;

/// The format version this firmware writes and reads.
pub const PASSTHROUGH_STATE_VERSION: u32 = 1;

/// One node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    /// Its node id.
    pub id: u64,
    /// The host inode: `st_dev`, `st_ino`, mount id.
    pub key: (u64, u64, u64),
    /// Its file type (`S_IFMT` bits).
    pub kind: u32,
    /// A directory's parent node (`None` for the root and for anything else).
    pub parent: Option<u64>,
    /// The kernel's lookup references; `None` for a node out of the table that a handle or a
    /// child directory still holds.
    pub refs: Option<u64>,
}

/// One open file or directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandleState {
    /// Its handle id.
    pub fh: u64,
    /// The node it was opened on.
    pub node: u64,
    /// A directory handle.
    pub dir: bool,
    /// `O_RDONLY`, `O_WRONLY` or `O_RDWR`.
    pub access: i32,
    /// `RWF_NOWAIT` refused for reads (bit 0) or writes (bit 1).
    pub no_nowait: u8,
}

/// A passthrough's state. Its descriptors go in this order: one per node of `nodes`, then one
/// per handle of `handles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassthroughState {
    /// [`PASSTHROUGH_STATE_VERSION`].
    pub version: u32,
    /// The nodes the guest may hold (as fitted to the old process's descriptor budget).
    pub max_nodes: usize,
    /// The handles that may be open.
    pub max_handles: usize,
    /// The session's INIT flags.
    pub session: u64,
    /// The next node id.
    pub next_id: u64,
    /// The next handle id.
    pub next_fh: u64,
    /// Every node, the root first.
    pub nodes: Vec<NodeState>,
    /// Every open handle.
    pub handles: Vec<HandleState>,
    /// The process it comes from had the supervisor hold its nodes' and handles' descriptors
    /// for a crash, completely (a successor under the same supervisor may take those over
    /// instead of giving its own: `ShareKeep::adopt`). Absent from older processes' states.
    #[serde(default)]
    pub kept: bool,
}

/// What changed in a shared directory between [`PassthroughFs::precopy`] and its quiet point:
/// applied to what a successor built from the copy, it gives the share as it is now. Its
/// descriptors: one per node of the first [`Self::new_nodes`] of `nodes`, then one per handle
/// opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassthroughChanges {
    /// [`PASSTHROUGH_STATE_VERSION`].
    pub version: u32,
    /// The session's INIT flags.
    pub session: u64,
    /// The next node id.
    pub next_id: u64,
    /// The next handle id.
    pub next_fh: u64,
    /// Nodes the copy did not have (the first [`Self::new_nodes`], each with its descriptor),
    /// then nodes it had whose table entry or parent changed: as they are now (`refs` `None`:
    /// out of the table, held by a handle or a child directory).
    pub nodes: Vec<NodeState>,
    /// How many of `nodes` are new.
    pub new_nodes: usize,
    /// Nodes out of the table now (forgotten).
    pub left: Vec<u64>,
    /// Handles opened (with a descriptor each) or released (`None`).
    pub handles: Vec<(u64, Option<HandleState>)>,
    /// As [`PassthroughState::kept`], at the quiet point.
    #[serde(default)]
    pub kept: bool,
}

/// What a copy ahead of the quiet point left for [`PassthroughFs::changes`]: the handles
/// opened or released since (the node table keeps its own log), and the nodes the successor
/// has (the copy's, then those the changes send).
#[derive(Default)]
pub struct Precopied {
    handles: HashSet<u64>,
    overflowed: bool,
    known: Option<HashSet<u64>>,
}

/// What holds a saved passthrough's descriptors open until they are sent (no descriptor is
/// duplicated: a share's nodes may take most of the process's descriptor budget).
pub struct Held {
    nodes: Vec<Arc<Inode>>,
    handles: Vec<Arc<Handle>>,
}

impl Held {
    /// The descriptors, in the order the state names them.
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let nodes = self.nodes.iter().map(|n| n.fd());
        nodes.chain(self.handles.iter().map(|h| h.file.as_fd())).collect()
    }
}

/// Why a passthrough's state is refused.
#[derive(Debug, Error)]
pub enum StateError {
    /// Another format.
    #[error("passthrough state format {0}, this firmware reads {PASSTHROUGH_STATE_VERSION}")]
    Version(u32),
    /// The state does not hold together, or its descriptors are not what it says.
    #[error("passthrough state: {0}")]
    Inconsistent(String),
    /// A descriptor or this process's share cannot be looked at.
    #[error("passthrough state: {what}")]
    Io {
        /// What was tried.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

fn bad(why: impl Into<String>) -> StateError {
    StateError::Inconsistent(why.into())
}

fn key_of(k: &InodeKey) -> (u64, u64, u64) {
    (k.dev, k.ino, k.mnt)
}

/// A node the save walked: the node, its lookup references if in the table, its parent.
type Walked = (Arc<Inode>, Option<u64>, Option<Arc<Inode>>);

fn handle_state(fh: u64, h: &Handle) -> HandleState {
    HandleState {
        fh,
        node: h.inode.id,
        dir: h.dir.is_some(),
        access: h.access,
        no_nowait: h.no_nowait.load(Ordering::Relaxed),
    }
}

impl PassthroughFs {
    /// Its state and the descriptors that go with it (see the module documentation). Call
    /// while no request runs.
    pub fn save(&self) -> (PassthroughState, Held) {
        let (table, _) = self.inodes.entries();
        let handles: Vec<(u64, Arc<Handle>)> = {
            let h = self.handles.read().unwrap_or_else(PoisonError::into_inner);
            h.iter().map(|(&fh, h)| (fh, h.clone())).collect()
        };
        // Nodes out of the table that handles or child directories still hold go too. Each
        // node's parent is read once (requests may move directories meanwhile, for a copy).
        let mut known: HashSet<u64> = table.iter().map(|(i, _)| i.id).collect();
        // (node, lookup references if in the table, parent as read once)
        let mut nodes: Vec<Walked> = Vec::with_capacity(table.len());
        let mut more: Vec<Arc<Inode>> = handles.iter().map(|(_, h)| h.inode.clone()).collect();
        for (i, r) in table {
            let parent = i.parent();
            more.extend(parent.clone());
            nodes.push((i, Some(r), parent));
        }
        while let Some(i) = more.pop() {
            if known.insert(i.id) {
                let parent = i.parent();
                more.extend(parent.clone());
                nodes.push((i, None, parent));
            }
        }
        let state = PassthroughState {
            version: PASSTHROUGH_STATE_VERSION,
            max_nodes: self.cfg.max_nodes,
            max_handles: self.cfg.max_handles,
            session: self.session.load(Ordering::Relaxed),
            // Read after the walk: every node it found is below (ids only grow).
            next_id: self.inodes.next_id(),
            next_fh: self.next_fh.load(Ordering::Relaxed),
            nodes: (nodes.iter())
                .map(|(i, refs, parent)| NodeState {
                    id: i.id,
                    key: key_of(&i.key),
                    kind: i.kind,
                    parent: parent.as_ref().map(|p| p.id),
                    refs: *refs,
                })
                .collect(),
            handles: handles.iter().map(|(fh, h)| handle_state(*fh, h)).collect(),
            kept: self.kept_completely(),
        };
        let held = Held {
            nodes: nodes.into_iter().map(|(i, _, _)| i).collect(),
            handles: handles.into_iter().map(|(_, h)| h).collect(),
        };
        (state, held)
    }

    /// Marks handle `fh` changed for a copy under way; called with the `handles` lock held.
    pub(super) fn handle_changed(&self, fh: u64) {
        if !self.copying.load(Ordering::Relaxed) {
            return;
        }
        let mut p = self.precopy.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = p.as_mut().filter(|p| !p.overflowed) {
            p.handles.insert(fh);
            if p.handles.len() > super::inode::MAX_LOGGED {
                *p = Precopied { overflowed: true, ..Precopied::default() };
            }
        }
    }

    /// Its state and descriptors taken while it serves (a live update's copy ahead of the
    /// quiet point): every change to the node table and the handles is logged from now on,
    /// and [`PassthroughFs::changes`] gives them at the quiet point. The copy holds together
    /// as it is: the table and the handles are each read under their own lock at once, and
    /// the nodes out of the table are those the handles and directories read hold.
    pub fn precopy(&self) -> (PassthroughState, Held) {
        {
            let _handles = self.handles.write().unwrap_or_else(PoisonError::into_inner);
            *self.precopy.lock().unwrap_or_else(PoisonError::into_inner) = Some(Precopied::default());
            self.copying.store(true, Ordering::Relaxed);
        }
        self.inodes.start_log();
        let (state, held) = self.save();
        let known = state.nodes.iter().map(|n| n.id).collect();
        if let Some(p) = self.precopy.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            p.known = Some(known);
        }
        (state, held)
    }

    /// Stops logging (the update the copy was for is called off).
    pub fn forget_precopy(&self) {
        self.inodes.take_log();
        self.copying.store(false, Ordering::Relaxed);
        self.precopy.lock().unwrap_or_else(PoisonError::into_inner).take();
    }

    /// What changed since [`PassthroughFs::precopy`], with the descriptors of the nodes and
    /// handles the successor does not have; taken while no request runs; logging stops.
    /// `None` when no copy was taken or more changed than the logs keep (the share then
    /// travels whole, [`PassthroughFs::save`]).
    pub fn changes(&self) -> Option<(PassthroughChanges, Held)> {
        let ids = self.inodes.take_log();
        self.copying.store(false, Ordering::Relaxed);
        let pre = self.precopy.lock().unwrap_or_else(PoisonError::into_inner).take();
        let (ids, pre) = (ids?, pre?);
        if pre.overflowed {
            return None;
        }
        let mut known = pre.known?;
        let mut new_nodes: Vec<Arc<Inode>> = Vec::new();
        // A node the successor does not have goes with its descriptor, and so does its parent.
        let mut ensure = |inode: &Arc<Inode>, new_nodes: &mut Vec<Arc<Inode>>| {
            let mut next = Some(inode.clone());
            while let Some(i) = next.take() {
                if known.insert(i.id) {
                    next = i.parent();
                    new_nodes.push(i);
                }
            }
        };
        let mut handles = Vec::new();
        let mut held_handles = Vec::new();
        {
            let all = self.handles.read().unwrap_or_else(PoisonError::into_inner);
            for &fh in &pre.handles {
                match all.get(&fh) {
                    Some(h) => {
                        ensure(&h.inode, &mut new_nodes);
                        handles.push((fh, Some(handle_state(fh, h))));
                        held_handles.push(h.clone());
                    }
                    None => handles.push((fh, None)),
                }
            }
        }
        // Each logged node as it is now: in the table; out of it but alive (a handle or a child
        // directory holds it: its parent may have changed); or gone.
        let mut changed = Vec::new();
        let mut left = Vec::new();
        for (id, alive) in ids {
            match self.inodes.slot(id).map(|(i, _)| i).or(alive) {
                Some(inode) => {
                    ensure(&inode, &mut new_nodes);
                    if let Some(p) = inode.parent() {
                        ensure(&p, &mut new_nodes);
                    }
                    changed.push(inode);
                }
                None => left.push(id),
            }
        }
        let state_of = |i: &Arc<Inode>| NodeState {
            id: i.id,
            key: key_of(&i.key),
            kind: i.kind,
            parent: i.parent().map(|p| p.id),
            refs: self.inodes.slot(i.id).map(|(_, r)| r),
        };
        let fresh: HashSet<u64> = new_nodes.iter().map(|i| i.id).collect();
        let mut nodes: Vec<NodeState> = new_nodes.iter().map(state_of).collect();
        nodes.extend(changed.iter().filter(|i| !fresh.contains(&i.id)).map(state_of));
        let changes = PassthroughChanges {
            version: PASSTHROUGH_STATE_VERSION,
            session: self.session.load(Ordering::Relaxed),
            next_id: self.inodes.next_id(),
            next_fh: self.next_fh.load(Ordering::Relaxed),
            new_nodes: new_nodes.len(),
            nodes,
            left,
            handles,
            kept: self.kept_completely(),
        };
        Some((changes, Held { nodes: new_nodes, handles: held_handles }))
    }

    /// The passthrough `state` describes, serving `cfg.root` (this process's name of the
    /// share, checked to be the directory the state's root is) and reopening nodes through
    /// `proc_fd` (see [`PassthroughFs::with_proc_fd`]); `files` are the state's descriptors.
    /// The limits are the state's (the old process fitted them to the same descriptor budget).
    pub fn restore(
        cfg: PassthroughConfig,
        proc_fd: OwnedFd,
        state: &PassthroughState,
        files: Vec<File>,
    ) -> Result<PassthroughFs, StateError> {
        Self::build(cfg, proc_fd, state, files).map(|(fs, _)| fs)
    }

    /// As [`PassthroughFs::restore`], from a copy taken while the share served
    /// ([`PassthroughFs::precopy`]): the changes since are applied by
    /// [`PassthroughRestoring::finish`] before it serves.
    pub fn restore_copy(
        cfg: PassthroughConfig,
        proc_fd: OwnedFd,
        state: &PassthroughState,
        files: Vec<File>,
    ) -> Result<PassthroughRestoring, StateError> {
        let (fs, nodes) = Self::build(cfg, proc_fd, state, files)?;
        Ok(PassthroughRestoring { fs, nodes })
    }

    fn build(
        mut cfg: PassthroughConfig,
        proc_fd: OwnedFd,
        state: &PassthroughState,
        files: Vec<File>,
    ) -> Result<(PassthroughFs, HashMap<u64, Arc<Inode>>), StateError> {
        if state.version != PASSTHROUGH_STATE_VERSION {
            return Err(StateError::Version(state.version));
        }
        if files.len() != state.nodes.len() + state.handles.len() {
            return Err(bad(format!(
                "{} descriptors for {} nodes and {} handles",
                files.len(),
                state.nodes.len(),
                state.handles.len()
            )));
        }
        let io = |what: String| move |source| StateError::Io { what, source };
        let fs_type = sys::fstatfs(proc_fd.as_fd()).map_err(io("/proc/self/fd".into()))?.f_type;
        if fs_type != libc::PROC_SUPER_MAGIC {
            return Err(bad("/proc is not procfs"));
        }
        // The share as this process names it: the state's root must be that directory.
        let share = cfg.root.display().to_string();
        let path = sys::cstring(cfg.root.as_os_str().as_bytes()).map_err(io(share.clone()))?;
        let here = sys::open(&path, libc::O_PATH | libc::O_DIRECTORY).map_err(io(share.clone()))?;
        let here = sys::fstatx(here.as_fd()).map_err(io(share.clone()))?;
        let mut files = files.into_iter();
        let mut nodes: HashMap<u64, Arc<Inode>> = HashMap::with_capacity(state.nodes.len());
        let mut in_table = Vec::with_capacity(state.nodes.len());
        let mut keys = HashSet::with_capacity(state.nodes.len());
        let mut root = None;
        for (n, file) in state.nodes.iter().zip(files.by_ref()) {
            let fd = OwnedFd::from(file);
            let st = sys::fstatx(fd.as_fd()).map_err(io(format!("node {}", n.id)))?;
            let key = InodeKey::of(&st);
            if key_of(&key) != n.key || super::kind_of(&st) != n.kind {
                return Err(bad(format!("node {}'s descriptor is not the inode the state names", n.id)));
            }
            if n.id >= state.next_id || nodes.contains_key(&n.id) {
                return Err(bad(format!("node id {} twice or past the next id", n.id)));
            }
            let inode = Arc::new(Inode::restored(n.id, fd, key, n.kind));
            if root.is_none() {
                let same = (st.stx_dev_major, st.stx_dev_minor, st.stx_ino)
                    == (here.stx_dev_major, here.stx_dev_minor, here.stx_ino);
                if n.id != ROOT_ID || n.refs.is_none() || !inode.is_dir() || !same {
                    return Err(bad(format!("the state's root is not the shared directory {share}")));
                }
                keys.insert(key);
                root = Some(inode.clone());
            } else if let Some(refs) = n.refs {
                if n.id == ROOT_ID || !keys.insert(key) {
                    return Err(bad(format!("node {} is the root or names an inode twice", n.id)));
                }
                in_table.push((inode.clone(), refs));
            }
            nodes.insert(n.id, inode);
        }
        let root = root.ok_or_else(|| bad("no root"))?;
        if in_table.len() + 1 > state.max_nodes || state.handles.len() > state.max_handles {
            return Err(bad("more nodes or handles than its limits"));
        }
        for n in &state.nodes {
            if let Some(p) = n.parent {
                let parent = nodes.get(&p).filter(|p| p.is_dir());
                let (Some(parent), Some(child)) = (parent, nodes.get(&n.id)) else {
                    return Err(bad(format!("node {}'s parent {p} is not a directory it has", n.id)));
                };
                child.set_parent(parent);
            }
        }
        let mut handles = HashMap::with_capacity(state.handles.len());
        for (h, file) in state.handles.iter().zip(files) {
            if handles.contains_key(&h.fh) {
                return Err(bad(format!("handle {} twice", h.fh)));
            }
            let handle = handle_from(h, file, &nodes, state.next_fh)?;
            handles.insert(h.fh, Arc::new(handle));
        }
        (cfg.max_nodes, cfg.max_handles) = (state.max_nodes, state.max_handles);
        // The old process fitted them to the same budget; this one's must hold them too.
        match sys::raise_nofile_limit() {
            Ok(limit)
                if cfg.max_nodes.saturating_add(cfg.max_handles)
                    > descriptor_budget(limit, cfg.descriptor_share) =>
            {
                return Err(bad(format!(
                    "its limits ({} nodes, {} handles) exceed this process's descriptor budget (RLIMIT_NOFILE {limit})",
                    cfg.max_nodes, cfg.max_handles
                )));
            }
            Ok(_) => {}
            Err(e) => log::warn!("passthrough: cannot raise RLIMIT_NOFILE: {e}"),
        }
        let fs = PassthroughFs {
            inodes: InodeTable::rebuild(root, in_table, state.next_id),
            cfg,
            proc_fd,
            handles: RwLock::new(handles),
            next_fh: AtomicU64::new(state.next_fh),
            session: AtomicU64::new(state.session),
            io_mode: uring::IoMode::Sync,
            engines: Mutex::new(Vec::new()),
            precopy: Mutex::new(None),
            copying: AtomicBool::new(false),
            keep: std::sync::OnceLock::new(),
            predecessor_kept: AtomicBool::new(state.kept),
        };
        Ok((fs, nodes))
    }

    /// Keeps the share for a crash from now on (issue 24): `keep`'s records and its keeper
    /// (the supervisor) get every node and handle it holds now, then each change as it comes.
    /// `slots`: the node slots a recovery read back (kept as they were; the descriptors the
    /// supervisor held are held again under the same keys, so none is missing at any moment);
    /// empty: everything held before for the function is let go first. Call before it serves.
    pub fn keep_in(&self, keep: Arc<ShareKeep>, slots: &HashMap<u64, u32>) {
        // A live update's successor of a completely kept share takes over the supervisor's
        // copies of its predecessor's descriptors (the same nodes and handles under the same
        // keys) rather than give its own before it serves; otherwise it gives them all.
        let give = !slots.is_empty() || !self.predecessor_kept.load(Ordering::Relaxed) || !keep.adopt();
        if slots.is_empty() && give {
            keep.let_all_go();
        }
        let handles = self.handles.read().unwrap_or_else(PoisonError::into_inner);
        // Nodes out of the table that a handle or a child directory holds.
        let mut others: Vec<Arc<Inode>> = handles.values().map(|h| h.inode.clone()).collect();
        let (entries, _) = self.inodes.entries();
        let mut i = 0;
        others.extend(entries.iter().map(|(n, _)| n.clone()));
        let mut seen: HashSet<u64> = others.iter().map(|o| o.id).collect();
        while i < others.len() {
            if let Some(p) = others[i].parent() {
                if seen.insert(p.id) {
                    others.push(p);
                }
            }
            i += 1;
        }
        keep.next_ids(self.inodes.next_id(), self.next_fh.load(Ordering::Relaxed));
        self.inodes.keep_in(&keep, slots, &others, give);
        // Every node there is now was given above, or is held already (taken over).
        keep.given_through(self.inodes.next_id().saturating_sub(1));
        if give {
            for chunk in handles.iter().collect::<Vec<_>>().chunks(200) {
                let items: Vec<_> = chunk.iter().map(|(&fh, h)| (fh | HANDLE_KEY, h.held_item())).collect();
                let fds: Vec<_> = chunk.iter().map(|(_, h)| h.file.as_fd()).collect();
                keep.hold(&items, &fds);
            }
        }
        let _ = self.keep.set(keep);
    }

    /// Whether every node and handle is held by a keeper (a successor may take them over):
    /// the queue is given first (at a quiet point, nothing else runs).
    fn kept_completely(&self) -> bool {
        self.keep.get().is_some_and(|k| k.has_keeper() && k.drain() && !k.incomplete())
    }

    /// The records kept for a crash, if it keeps them.
    pub fn kept(&self) -> Option<&Arc<ShareKeep>> {
        self.keep.get()
    }

    /// The share of a process killed while it served it (issue 24): its nodes' records in
    /// `keep` and the descriptors the supervisor held for it (`held`, with `files` in the same
    /// order), for the share `cfg` names, reopened through `proc_fd`; `session`: the FUSE
    /// session's INIT flags. Nodes gone from the records are dropped; a node in the table
    /// whose descriptor was not held refuses it. Then [`Self::keep_in`] with the same records
    /// and the slots returned.
    pub fn recover(
        cfg: PassthroughConfig,
        proc_fd: OwnedFd,
        keep: &ShareKeep,
        held: &[(u64, HeldItem)],
        files: Vec<File>,
        session: u64,
    ) -> Result<Recovered, StateError> {
        if held.len() != files.len() {
            return Err(bad(format!("{} descriptors held for {} items", files.len(), held.len())));
        }
        // This process's limits, fitted to its descriptor budget as at start.
        let mut cfg = cfg;
        if let Ok(limit) = sys::raise_nofile_limit() {
            super::fit_descriptor_limits(&mut cfg, limit);
        }
        let records: HashMap<u64, NodeRecord> = keep.read().into_iter().map(|r| (r.id, r)).collect();
        let mut nodes: Vec<(NodeState, File)> = Vec::new();
        let mut handles: Vec<(HandleState, File)> = Vec::new();
        let (mut next_id, mut next_fh) = (ROOT_ID + 1, 1u64);
        let mut dropped = Vec::new();
        for ((key, item), file) in held.iter().zip(files) {
            match item {
                HeldItem::Node { key: k, kind } => {
                    let Some(r) = records.get(key) else {
                        dropped.push(*key);
                        continue;
                    };
                    next_id = next_id.max(key + 1);
                    let parent =
                        (*kind == libc::S_IFDIR && r.parent != 0 && *key != ROOT_ID).then_some(r.parent);
                    // A record in the table with no reference left was on its way out.
                    let refs = if *key == ROOT_ID { Some(1) } else { r.refs.filter(|&n| n > 0) };
                    nodes.push((NodeState { id: *key, key: *k, kind: *kind, parent, refs }, file));
                }
                HeldItem::Handle { node, dir, access, no_nowait } => {
                    let fh = key & !HANDLE_KEY;
                    next_fh = next_fh.max(fh + 1);
                    let h =
                        HandleState { fh, node: *node, dir: *dir, access: *access, no_nowait: *no_nowait };
                    handles.push((h, file));
                }
            }
        }
        if keep.incomplete() {
            return Err(bad(
                "a node got no record (the records were full) or a descriptor was not given: the guest may \
                 hold a node or handle they do not name",
            ));
        }
        // A node in the table whose descriptor the supervisor does not have was made in a
        // round whose replies were not published (its descriptor was still queued: every
        // descriptor is given before an answer names it, and one that could not be given
        // marked the records incomplete above): the guest does not know it.
        let held_ids: HashSet<u64> = nodes.iter().map(|(n, _)| n.id).collect();
        let (kept_id, _) = keep.next_ids_kept();
        if let Some(newer) = held_ids.iter().find(|&&id| id >= kept_id) {
            // Held for a node these records never gave out: they are an older process's (a
            // successor that served before its own records were kept), and nodes the guest
            // knows may have no record.
            return Err(bad(format!(
                "node {newer} is held but the records never gave it (they stop at {kept_id})"
            )));
        }
        let given = keep.given_id();
        for r in records.values().filter(|r| r.refs.is_some_and(|n| n > 0)) {
            if held_ids.contains(&r.id) {
                continue;
            }
            if r.id <= given {
                // Given once, and not held now: the supervisor lost it, and the guest may know
                // the node.
                return Err(bad(format!("node {} is in the table but its descriptor is not held", r.id)));
            }
            dropped.push(r.id);
        }
        // Ids never given go on from where the records say, so none is given twice.
        let (kept_id, kept_fh) = keep.next_ids_kept();
        (next_id, next_fh) = (next_id.max(kept_id), next_fh.max(kept_fh));
        // A node out of the table that no handle and no directory of the share holds (it went
        // just before the kill) is let go.
        let wanted: HashSet<u64> = (handles.iter().map(|(h, _)| h.node))
            .chain(nodes.iter().filter(|(n, _)| n.refs.is_some()).map(|(n, _)| n.id))
            .collect();
        let parents: HashMap<u64, u64> =
            nodes.iter().filter_map(|(n, _)| n.parent.map(|p| (n.id, p))).collect();
        let mut reach: HashSet<u64> = HashSet::new();
        for &id in &wanted {
            let mut at = Some(id);
            while let Some(x) = at {
                if !reach.insert(x) {
                    break;
                }
                at = parents.get(&x).copied();
            }
        }
        nodes.retain(|(n, _)| {
            let keep = n.id == ROOT_ID || reach.contains(&n.id);
            if !keep {
                dropped.push(n.id);
            }
            keep
        });
        // The root first; parents and handles need their nodes.
        nodes.sort_by_key(|(n, _)| (n.id != ROOT_ID, n.id));
        let ids: HashSet<u64> = nodes.iter().map(|(n, _)| n.id).collect();
        for (n, _) in &mut nodes {
            if n.parent.is_some_and(|p| !ids.contains(&p)) {
                n.parent = None;
            }
        }
        handles.retain(|(h, _)| {
            let keep = ids.contains(&h.node);
            if !keep {
                dropped.push(h.fh | HANDLE_KEY);
            }
            keep
        });
        let slots: HashMap<u64, u32> =
            nodes.iter().filter_map(|(n, _)| records.get(&n.id).map(|r| (n.id, r.slot))).collect();
        let state = PassthroughState {
            version: PASSTHROUGH_STATE_VERSION,
            max_nodes: cfg.max_nodes,
            max_handles: cfg.max_handles,
            session,
            next_id,
            next_fh,
            nodes: nodes.iter().map(|(n, _)| n.clone()).collect(),
            handles: handles.iter().map(|(h, _)| h.clone()).collect(),
            kept: false,
        };
        let files = nodes.into_iter().map(|(_, f)| f).chain(handles.into_iter().map(|(_, f)| f)).collect();
        let fs = Self::restore(cfg, proc_fd, &state, files)?;
        keep.release_unused(&slots.values().copied().collect());
        Ok(Recovered { fs, slots, dropped })
    }
}

/// A shared directory recovered after a crash ([`PassthroughFs::recover`]).
pub struct Recovered {
    /// The share.
    pub fs: PassthroughFs,
    /// Each node's slot in the records (for [`PassthroughFs::keep_in`]).
    pub slots: HashMap<u64, u32>,
    /// The keys of descriptors held for it that it did not take (nodes gone just before the
    /// kill): for the keeper to let go.
    pub dropped: Vec<u64>,
}

/// A shared directory being taken over: built from a copy taken while its predecessor served,
/// it serves once [`PassthroughRestoring::finish`] has applied what changed since.
pub struct PassthroughRestoring {
    fs: PassthroughFs,
    /// Every node the successor has, by id (in the table or not).
    nodes: HashMap<u64, Arc<Inode>>,
}

impl PassthroughRestoring {
    /// The share, `changes` applied with their descriptors `files` (each checked as a whole
    /// state's are; the cost follows the changes, not the share's size).
    pub fn finish(mut self, c: &PassthroughChanges, files: Vec<File>) -> Result<PassthroughFs, StateError> {
        if c.version != PASSTHROUGH_STATE_VERSION {
            return Err(StateError::Version(c.version));
        }
        let opened = c.handles.iter().filter(|h| h.1.is_some()).count();
        if c.new_nodes > c.nodes.len() || files.len() != c.new_nodes + opened {
            return Err(bad(format!(
                "{} descriptors for {} new nodes and {opened} handles",
                files.len(),
                c.new_nodes
            )));
        }
        let fs = &self.fs;
        fs.predecessor_kept.store(c.kept, Ordering::Relaxed);
        if c.next_id < fs.inodes.next_id() || c.next_fh < fs.next_fh.load(Ordering::Relaxed) {
            return Err(bad("the next node or handle id goes back"));
        }
        let io = |what: String| move |source| StateError::Io { what, source };
        let mut files = files.into_iter();
        for (n, file) in c.nodes[..c.new_nodes].iter().zip(files.by_ref()) {
            let fd = OwnedFd::from(file);
            let st = sys::fstatx(fd.as_fd()).map_err(io(format!("node {}", n.id)))?;
            let key = InodeKey::of(&st);
            if key_of(&key) != n.key || super::kind_of(&st) != n.kind {
                return Err(bad(format!("node {}'s descriptor is not the inode the state names", n.id)));
            }
            if n.id >= c.next_id || self.nodes.contains_key(&n.id) {
                return Err(bad(format!("new node {} known already or past the next id", n.id)));
            }
            self.nodes.insert(n.id, Arc::new(Inode::restored(n.id, fd, key, n.kind)));
        }
        let mut seen = HashSet::with_capacity(c.nodes.len());
        let mut entries = Vec::with_capacity(c.nodes.len());
        for n in &c.nodes {
            let Some(inode) = self.nodes.get(&n.id).filter(|i| seen.insert(n.id) && key_of(&i.key) == n.key)
            else {
                return Err(bad(format!("node {} is unknown, repeated, or names another inode", n.id)));
            };
            if let Some(p) = n.parent {
                let parent = self.nodes.get(&p).filter(|p| p.is_dir());
                let Some(parent) = parent else {
                    return Err(bad(format!("node {}'s parent {p} is not a directory it has", n.id)));
                };
                inode.set_parent(parent);
            }
            entries.push((n.id, n.refs.map(|r| (inode.clone(), r))));
        }
        // Every node that left the table goes before any comes in: a file forgotten and looked
        // up again meanwhile is a new node of the same key.
        let gone = c.left.iter().map(|&id| (id, None));
        let (outs, ins): (Vec<_>, Vec<_>) =
            entries.into_iter().chain(gone).partition(|(_, now)| now.is_none());
        for (id, now) in outs.into_iter().chain(ins) {
            self.fs.inodes.restore_slot(id, now).map_err(bad)?;
        }
        let mut handles = self.fs.handles.write().unwrap_or_else(PoisonError::into_inner);
        let mut fhs = HashSet::with_capacity(c.handles.len());
        for (fh, now) in &c.handles {
            if !fhs.insert(*fh) || now.as_ref().is_some_and(|h| h.fh != *fh) {
                return Err(bad(format!("handle {fh} twice, or under another id")));
            }
            if let Some(old) = handles.remove(fh) {
                old.inode.opens.fetch_sub(1, Ordering::AcqRel);
            }
            let Some(h) = now else { continue };
            let file = files.next().ok_or_else(|| bad("a handle's descriptor is missing"))?;
            let handle = handle_from(h, file, &self.nodes, c.next_fh)?;
            handles.insert(*fh, Arc::new(handle));
        }
        if self.fs.inodes.len() > self.fs.cfg.max_nodes || handles.len() > self.fs.cfg.max_handles {
            return Err(bad("more nodes or handles than its limits"));
        }
        drop(handles);
        self.fs.inodes.restore_next_id(c.next_id);
        self.fs.next_fh.store(c.next_fh, Ordering::Relaxed);
        self.fs.session.store(c.session, Ordering::Relaxed);
        Ok(self.fs)
    }
}

/// Handle `h` over `file`, on its node among `nodes`, checked; its node counts it open.
fn handle_from(
    h: &HandleState,
    file: File,
    nodes: &HashMap<u64, Arc<Inode>>,
    next_fh: u64,
) -> Result<Handle, StateError> {
    let inode = nodes.get(&h.node).ok_or_else(|| bad(format!("handle {} of no node", h.fh)))?;
    let st = sys::fstatx(file.as_fd())
        .map_err(|source| StateError::Io { what: format!("handle {}", h.fh), source })?;
    let k = InodeKey::of(&st);
    if (k.dev, k.ino) != (inode.key.dev, inode.key.ino)
        || h.dir != inode.is_dir()
        || !(0..=2).contains(&h.access)
        || h.fh >= next_fh
    {
        return Err(bad(format!("handle {} does not match its node {}", h.fh, h.node)));
    }
    let memory_backed = !h.dir && super::memory_backed(&file);
    inode.opens.fetch_add(1, Ordering::AcqRel);
    Ok(Handle {
        inode: inode.clone(),
        file,
        dir: h.dir.then(|| Mutex::new(Vec::new())),
        memory_backed,
        no_nowait: AtomicU8::new(h.no_nowait),
        access: h.access,
    })
}
