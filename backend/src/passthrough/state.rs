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
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::inode::{Inode, InodeKey, InodeTable};
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

impl PassthroughFs {
    /// Its state and the descriptors that go with it (see the module documentation). Call
    /// while no request runs.
    pub fn save(&self) -> (PassthroughState, Held) {
        let (table, next_id) = self.inodes.entries();
        let handles: Vec<(u64, Arc<Handle>)> = {
            let h = self.handles.read().unwrap_or_else(PoisonError::into_inner);
            h.iter().map(|(&fh, h)| (fh, h.clone())).collect()
        };
        // Nodes out of the table that handles or child directories still hold go too.
        let mut known: HashSet<u64> = table.iter().map(|(i, _)| i.id).collect();
        let mut nodes: Vec<(Arc<Inode>, Option<u64>)> =
            table.into_iter().map(|(i, r)| (i, Some(r))).collect();
        let mut more: Vec<Arc<Inode>> = handles.iter().map(|(_, h)| h.inode.clone()).collect();
        more.extend(nodes.iter().filter_map(|(i, _)| i.parent()));
        while let Some(i) = more.pop() {
            if known.insert(i.id) {
                more.extend(i.parent());
                nodes.push((i, None));
            }
        }
        let state = PassthroughState {
            version: PASSTHROUGH_STATE_VERSION,
            max_nodes: self.cfg.max_nodes,
            max_handles: self.cfg.max_handles,
            session: self.session.load(Ordering::Relaxed),
            next_id,
            next_fh: self.next_fh.load(Ordering::Relaxed),
            nodes: (nodes.iter())
                .map(|(i, refs)| NodeState {
                    id: i.id,
                    key: key_of(&i.key),
                    kind: i.kind,
                    parent: i.parent().map(|p| p.id),
                    refs: *refs,
                })
                .collect(),
            handles: (handles.iter())
                .map(|(fh, h)| HandleState {
                    fh: *fh,
                    node: h.inode.id,
                    dir: h.dir.is_some(),
                    access: h.access,
                    no_nowait: h.no_nowait.load(Ordering::Relaxed),
                })
                .collect(),
        };
        let held = Held {
            nodes: nodes.into_iter().map(|(i, _)| i).collect(),
            handles: handles.into_iter().map(|(_, h)| h).collect(),
        };
        (state, held)
    }

    /// The passthrough `state` describes, serving `cfg.root` (this process's name of the
    /// share, checked to be the directory the state's root is) and reopening nodes through
    /// `proc_fd` (see [`PassthroughFs::with_proc_fd`]); `files` are the state's descriptors.
    /// The limits are the state's (the old process fitted them to the same descriptor budget).
    pub fn restore(
        mut cfg: PassthroughConfig,
        proc_fd: OwnedFd,
        state: &PassthroughState,
        files: Vec<File>,
    ) -> Result<PassthroughFs, StateError> {
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
            let inode = nodes.get(&h.node).ok_or_else(|| bad(format!("handle {} of no node", h.fh)))?;
            let st = sys::fstatx(file.as_fd()).map_err(io(format!("handle {}", h.fh)))?;
            let k = InodeKey::of(&st);
            if (k.dev, k.ino) != (inode.key.dev, inode.key.ino)
                || h.dir != inode.is_dir()
                || !(0..=2).contains(&h.access)
                || h.fh >= state.next_fh
                || handles.contains_key(&h.fh)
            {
                return Err(bad(format!("handle {} does not match its node {}", h.fh, h.node)));
            }
            let memory_backed = !h.dir && super::memory_backed(&file);
            inode.opens.fetch_add(1, Ordering::AcqRel);
            let handle = Handle {
                inode: inode.clone(),
                file,
                dir: h.dir.then(|| Mutex::new(Vec::new())),
                memory_backed,
                no_nowait: AtomicU8::new(h.no_nowait),
                access: h.access,
            };
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
        Ok(PassthroughFs {
            inodes: InodeTable::rebuild(root, in_table, state.next_id),
            cfg,
            proc_fd,
            handles: RwLock::new(handles),
            next_fh: AtomicU64::new(state.next_fh),
            session: AtomicU64::new(state.session),
            io_mode: uring::IoMode::Sync,
            engines: Mutex::new(Vec::new()),
        })
    }
}
