//! The NFS backend's node and handle tables: the device's own FUSE node ids mapped to NFS file
//! handles, and the device-side open file handles.
//!
//! [`NodeTable`] gives every NFS file handle the device has told the kernel about a node id of
//! its own (never the server's fileid, which is only `st_ino`): the low 32 bits are an index
//! into a preallocated array, the high 32 bits its generation, bumped when the index is reused,
//! so a node id the kernel forgot and sends again (a hostile or buggy guest) is stale, not some
//! other file. Handles are deduplicated by their bytes (an open-addressing index over the same
//! array: the same file looked up twice, or listed by READDIRPLUS, is one node), each node
//! counts the kernel's lookup references and is freed when FORGET or BATCH_FORGET drops the
//! last one (and no handle of it is open). The root is index 0, generation 0: node id 1, never
//! freed. The table is bounded (`max_nodes`): a lookup that needs a new node when it is full
//! fails with `ENFILE` (the kernel drops unused inodes under memory pressure and forgets them,
//! which frees room).
//!
//! [`HandleTable`] keeps open files and directories (OPEN, CREATE, OPENDIR): NFSv3 has no open
//! state, so a handle is the device's alone: its node, its access mode (for the lock checks,
//! `FileSystem::lock_handle`) and, for a directory, the READDIR cookie verifier.
//!
//! Both tables are shared by every poller (one file's requests come through several queues)
//! behind a short mutex each, like the RAM filesystem's state: every operation is a few array
//! accesses under it, nothing allocates after construction.

use std::sync::{Arc, Mutex, MutexGuard};

use super::keep::{KeptHandle, NfsKeep};
use crate::filesystem::Error;
use crate::nfs::wire::Fh;

/// The root's node id (FUSE's `FUSE_ROOT_ID`).
pub const ROOT: u64 = 1;

/// The error of a lookup that needs a new node when the table is full.
pub const FULL: Error = Error::Os(libc::ENFILE);

/// The error of a node id or handle the tables do not know (forgotten, or never given).
pub const STALE: Error = Error::Os(libc::ESTALE);

const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node {
    fh: Fh,
    hash: u64,
    generation: u32,
    live: bool,
    nlookup: u64,
    opens: u32,
    /// Unlinked while open: renamed to its silly name in this directory, removed at the last
    /// close.
    silly: Option<Fh>,
}

struct Inner {
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Open-addressing index (linear probing, backward-shift deletion): node indexes by the
    /// hash of their handle bytes; `EMPTY` marks a free bucket.
    index: Vec<u32>,
    live: usize,
    /// Open handles of all nodes together.
    opens: u64,
    /// The records kept for a crash (`nfs::keep`), written as nodes change.
    keep: Option<Arc<NfsKeep>>,
}

/// Node ids ↔ NFS file handles (see the module documentation).
pub struct NodeTable {
    inner: Mutex<Inner>,
    max: usize,
}

impl std::fmt::Debug for NodeTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTable").field("live", &self.len()).field("max", &self.max).finish()
    }
}

/// FNV-1a over the handle bytes, then a multiplicative mix (handles are server-chosen bytes:
/// an attacker who controls the server can only slow its own lookups).
fn hash(fh: &Fh) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in fh.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^ (h >> 29)
}

fn nodeid(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | (u64::from(index) + 1)
}

fn split(nodeid: u64) -> Option<(usize, u32)> {
    let low = (nodeid & 0xffff_ffff) as u32;
    let index = low.checked_sub(1)?;
    Some((index as usize, (nodeid >> 32) as u32))
}

impl Inner {
    fn mask(&self) -> usize {
        self.index.len() - 1
    }

    fn node(&self, nodeid: u64) -> Option<(usize, &Node)> {
        let (i, generation) = split(nodeid)?;
        self.nodes.get(i).filter(|n| n.live && n.generation == generation).map(|n| (i, n))
    }

    fn node_mut(&mut self, nodeid: u64) -> Option<&mut Node> {
        let (i, generation) = split(nodeid)?;
        self.nodes.get_mut(i).filter(|n| n.live && n.generation == generation)
    }

    fn find(&self, fh: &Fh, h: u64) -> Option<u32> {
        let mask = self.mask();
        let mut b = (h as usize) & mask;
        loop {
            let i = self.index[b];
            if i == EMPTY {
                return None;
            }
            let n = &self.nodes[i as usize];
            if n.hash == h && n.fh.as_bytes() == fh.as_bytes() {
                return Some(i);
            }
            b = (b + 1) & mask;
        }
    }

    fn insert_index(&mut self, i: u32, h: u64) {
        let mask = self.mask();
        let mut b = (h as usize) & mask;
        while self.index[b] != EMPTY {
            b = (b + 1) & mask;
        }
        self.index[b] = i;
    }

    fn remove_index(&mut self, i: u32) {
        let mask = self.mask();
        let h = self.nodes[i as usize].hash;
        let mut b = (h as usize) & mask;
        while self.index[b] != i {
            if self.index[b] == EMPTY {
                return;
            }
            b = (b + 1) & mask;
        }
        // Backward-shift deletion: move later members of the probe run into the hole.
        let mut hole = b;
        let mut j = (b + 1) & mask;
        loop {
            let k = self.index[j];
            if k == EMPTY {
                break;
            }
            let home = (self.nodes[k as usize].hash as usize) & mask;
            // Is `home` cyclically outside (hole, j]? Then k may move into the hole.
            let outside = if hole <= j { home <= hole || home > j } else { home <= hole && home > j };
            if outside {
                self.index[hole] = k;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.index[hole] = EMPTY;
    }

    /// Frees node `i` if nothing holds it any more; whether it did.
    fn release_if_unused(&mut self, i: usize) -> bool {
        let n = self.nodes[i];
        if i == 0 || !n.live || n.nlookup > 0 || n.opens > 0 {
            return false;
        }
        self.remove_index(i as u32);
        let n = &mut self.nodes[i];
        n.live = false;
        n.generation = n.generation.wrapping_add(1);
        if let Some(k) = &self.keep {
            k.node_gone(i, n.generation);
        }
        self.free.push(i as u32);
        self.live -= 1;
        true
    }
}

impl NodeTable {
    /// A table with the export's root handle as node 1, room for `max` nodes (the root
    /// included; at least 2).
    pub fn new(root: Fh, max: usize) -> Self {
        let max = max.clamp(2, u32::MAX as usize / 4);
        let mut nodes = Vec::with_capacity(max);
        let h = hash(&root);
        nodes.push(Node { fh: root, hash: h, generation: 0, live: true, nlookup: 1, opens: 0, silly: None });
        let buckets = (max * 2).next_power_of_two();
        let mut inner = Inner {
            nodes,
            free: Vec::with_capacity(max),
            index: vec![EMPTY; buckets],
            live: 1,
            opens: 0,
            keep: None,
        };
        inner.insert_index(0, h);
        NodeTable { inner: Mutex::new(inner), max }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The handle of `nodeid`, or [`STALE`].
    pub fn fh(&self, nodeid: u64) -> Result<Fh, Error> {
        self.lock().node(nodeid).map(|(_, n)| n.fh).ok_or(STALE)
    }

    /// The handles of two nodes at once (one lock).
    pub fn fh2(&self, a: u64, b: u64) -> Result<(Fh, Fh), Error> {
        let inner = self.lock();
        let fa = inner.node(a).map(|(_, n)| n.fh).ok_or(STALE)?;
        let fb = inner.node(b).map(|(_, n)| n.fh).ok_or(STALE)?;
        Ok((fa, fb))
    }

    /// The node of handle `fh` with one more lookup reference (a new node if the handle is
    /// new): what a LOOKUP, CREATE, MKDIR, ... or a READDIRPLUS entry gives the kernel.
    /// [`FULL`] when a new node is needed and there is no room.
    pub fn reference(&self, fh: &Fh) -> Result<u64, Error> {
        let h = hash(fh);
        let mut inner = self.lock();
        if let Some(i) = inner.find(fh, h) {
            let n = &mut inner.nodes[i as usize];
            n.nlookup = n.nlookup.saturating_add(1);
            let (nlookup, generation) = (n.nlookup, n.generation);
            if let Some(k) = &inner.keep {
                k.node_lookups(i as usize, nlookup);
            }
            return Ok(nodeid(i, generation));
        }
        let i = match inner.free.pop() {
            Some(i) => i,
            None if inner.nodes.len() < self.max => {
                inner.nodes.push(Node {
                    fh: *fh,
                    hash: h,
                    generation: 1,
                    live: false,
                    nlookup: 0,
                    opens: 0,
                    silly: None,
                });
                if let Some(k) = &inner.keep {
                    k.node_slots(inner.nodes.len());
                }
                (inner.nodes.len() - 1) as u32
            }
            None => return Err(FULL),
        };
        let n = &mut inner.nodes[i as usize];
        n.fh = *fh;
        n.hash = h;
        n.live = true;
        n.nlookup = 1;
        n.opens = 0;
        n.silly = None;
        let generation = n.generation;
        if let Some(k) = &inner.keep {
            k.node_made(i as usize, generation, fh);
        }
        inner.insert_index(i, h);
        inner.live += 1;
        Ok(nodeid(i, generation))
    }

    /// Drops `n` lookup references of `nodeid` (FORGET); the node goes when none is left and
    /// no handle of it is open (then `true`). Unknown node ids are ignored.
    pub fn forget(&self, nodeid: u64, n: u64) -> bool {
        let mut inner = self.lock();
        let Some((i, _)) = inner.node(nodeid) else { return false };
        let node = &mut inner.nodes[i];
        node.nlookup = node.nlookup.saturating_sub(n);
        let nlookup = node.nlookup;
        if let Some(k) = &inner.keep {
            k.node_lookups(i, nlookup);
        }
        inner.release_if_unused(i)
    }

    /// Counts an open handle of `nodeid` (kept while it is open).
    pub fn opened(&self, nodeid: u64) -> Result<(), Error> {
        let mut inner = self.lock();
        let n = inner.node_mut(nodeid).ok_or(STALE)?;
        n.opens = n.opens.saturating_add(1);
        inner.opens += 1;
        Ok(())
    }

    /// A handle of `nodeid` was closed. When it was the last of a node unlinked while open,
    /// the directory its silly name is in (to be removed now).
    pub fn closed(&self, nodeid: u64) -> Option<Fh> {
        let mut inner = self.lock();
        let (i, _) = inner.node(nodeid)?;
        let node = &mut inner.nodes[i];
        if node.opens == 0 {
            return None;
        }
        node.opens -= 1;
        let silly = if node.opens == 0 { node.silly.take() } else { None };
        if let (Some(k), Some(_)) = (&inner.keep, silly) {
            k.node_silly(i, None);
        }
        inner.opens = inner.opens.saturating_sub(1);
        inner.release_if_unused(i);
        silly
    }

    /// Whether any node has an open handle (else an UNLINK needs no look at what it removes).
    pub fn any_open(&self) -> bool {
        self.lock().opens > 0
    }

    /// The node of handle `fh` if it has open handles (an UNLINK of it renames it instead).
    pub fn open_node(&self, fh: &Fh) -> Option<u64> {
        let h = hash(fh);
        let inner = self.lock();
        let i = inner.find(fh, h)?;
        let n = &inner.nodes[i as usize];
        (n.opens > 0).then(|| nodeid(i, n.generation))
    }

    /// `nodeid` was unlinked while open: renamed to [`silly_name`] in directory `dir`. Whether
    /// its last handle closed meanwhile (the RENAME raced the last RELEASE, which found no silly
    /// name to remove): then nothing is kept and the caller removes the silly name now.
    #[must_use = "with no open left the silly name is the caller's to remove"]
    pub fn set_silly(&self, nodeid: u64, dir: Fh) -> bool {
        let mut inner = self.lock();
        let Some((i, _)) = inner.node(nodeid).filter(|(_, n)| n.opens > 0) else { return true };
        inner.nodes[i].silly = Some(dir);
        if let Some(k) = &inner.keep {
            k.node_silly(i, Some(&dir));
        }
        false
    }

    /// Whether `nodeid` has open handles.
    pub fn has_opens(&self, nodeid: u64) -> bool {
        self.lock().node(nodeid).is_some_and(|(_, n)| n.opens > 0)
    }

    /// Every node unlinked while open, with the directory its silly name is in (the session
    /// ends: nobody will close them).
    pub fn sillies(&self) -> Vec<(u64, Fh)> {
        let inner = self.lock();
        (inner.nodes.iter().enumerate())
            .filter(|(_, n)| n.live)
            .filter_map(|(i, n)| n.silly.map(|dir| (nodeid(i as u32, n.generation), dir)))
            .collect()
    }

    /// The session ended: the kernel dropped every reference; only the root stays.
    pub fn reset(&self) {
        let mut inner = self.lock();
        for i in 1..inner.nodes.len() {
            if inner.nodes[i].live {
                inner.nodes[i].nlookup = 0;
                inner.nodes[i].opens = 0;
                inner.nodes[i].silly = None;
                if let Some(k) = &inner.keep {
                    k.node_silly(i, None);
                    k.node_lookups(i, 0);
                }
                inner.release_if_unused(i);
            }
        }
        inner.opens = 0;
    }

    /// Keeps the table in `keep` from now on (crash recovery, `nfs::keep`), writing every
    /// slot it holds first.
    pub(super) fn keep_in(&self, keep: Arc<NfsKeep>) {
        let mut inner = self.lock();
        for (i, n) in inner.nodes.iter().enumerate() {
            if n.live {
                keep.node_made(i, n.generation, &n.fh);
                keep.node_lookups(i, n.nlookup);
                keep.node_silly(i, n.silly.as_ref());
            } else {
                keep.node_gone(i, n.generation);
            }
        }
        keep.node_slots(inner.nodes.len());
        inner.keep = Some(keep);
    }

    /// Stops writing the records (they are another process's now).
    pub(super) fn unkeep(&self) {
        self.lock().keep = None;
    }

    /// Live nodes, the root included.
    pub fn len(&self) -> usize {
        self.lock().live
    }

    /// Never: the root is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The bound.
    pub fn capacity(&self) -> usize {
        self.max
    }
}

/// A node table as data (a live update): every slot's generation, and the live nodes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeTableState {
    /// Each slot's generation, slot 0 (the root) first.
    pub generations: Vec<u32>,
    /// The live nodes.
    pub live: Vec<NodeState>,
}

/// A live node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeState {
    /// Its slot.
    pub index: u32,
    /// Its NFS file handle.
    pub fh: Vec<u8>,
    /// The kernel's lookup references.
    pub nlookup: u64,
    /// Open handles.
    pub opens: u32,
    /// Unlinked while open: the directory its silly name is in.
    pub silly: Option<Vec<u8>>,
}

impl NodeTable {
    /// The table as data.
    pub fn save(&self) -> NodeTableState {
        let inner = self.lock();
        let live = (inner.nodes.iter().enumerate())
            .filter(|(_, n)| n.live)
            .map(|(i, n)| NodeState {
                index: i as u32,
                fh: n.fh.as_bytes().to_vec(),
                nlookup: n.nlookup,
                opens: n.opens,
                silly: n.silly.map(|f| f.as_bytes().to_vec()),
            })
            .collect();
        NodeTableState { generations: inner.nodes.iter().map(|n| n.generation).collect(), live }
    }

    /// The table `state` describes, bounded by `max` (at least what it holds); `Err`: why it
    /// does not hold together.
    pub fn restore(state: &NodeTableState, max: usize) -> Result<NodeTable, String> {
        let slots = state.generations.len();
        let max = max.clamp(2, u32::MAX as usize / 4);
        if slots == 0 || slots > max {
            return Err(format!("{slots} node slots, the table holds {max}"));
        }
        let fh = |b: &[u8]| Fh::new(b).ok_or_else(|| format!("a file handle of {} bytes", b.len()));
        let empty = fh(&[])?;
        let mut nodes: Vec<Node> = Vec::with_capacity(max);
        nodes.extend(state.generations.iter().map(|&generation| Node {
            fh: empty,
            hash: 0,
            generation,
            live: false,
            nlookup: 0,
            opens: 0,
            silly: None,
        }));
        let buckets = (max * 2).next_power_of_two();
        let mut inner = Inner {
            nodes,
            free: Vec::with_capacity(max),
            index: vec![EMPTY; buckets],
            live: 0,
            opens: 0,
            keep: None,
        };
        for n in &state.live {
            let i = n.index as usize;
            let f = fh(&n.fh)?;
            let h = hash(&f);
            if i >= slots || inner.nodes[i].live || inner.find(&f, h).is_some() {
                return Err(format!("node slot {i} out of range, twice, or its handle twice"));
            }
            let silly = n.silly.as_deref().map(fh).transpose()?;
            inner.nodes[i] = Node {
                fh: f,
                hash: h,
                generation: inner.nodes[i].generation,
                live: true,
                nlookup: n.nlookup,
                opens: n.opens,
                silly,
            };
            inner.insert_index(i as u32, h);
            inner.live += 1;
            inner.opens += u64::from(n.opens);
        }
        if !inner.nodes[0].live || inner.nodes[0].generation != 0 {
            return Err("no root node".into());
        }
        inner.free.extend((1..slots as u32).rev().filter(|&i| !inner.nodes[i as usize].live));
        Ok(NodeTable { inner: Mutex::new(inner), max })
    }
}

/// Length of a silly name.
pub const SILLY_LEN: usize = 20;

/// The name a file unlinked while open gets until its last close: `.nfs` and its node id in
/// hexadecimal (as Linux's NFS client, `.nfsXXXX`).
pub fn silly_name(nodeid: u64) -> [u8; SILLY_LEN] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut n = *b".nfs0000000000000000";
    for k in 0..16 {
        n[4 + k] = HEX[((nodeid >> (60 - 4 * k)) & 0xf) as usize];
    }
    n
}

/// What an open handle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpenFile {
    /// Its node.
    pub nodeid: u64,
    /// `open(2)` flags.
    pub flags: u32,
    /// A directory (OPENDIR).
    pub dir: bool,
    /// The READDIR cookie verifier the server gave last (directories).
    pub cookieverf: [u8; 8],
    /// The cookie after which the server said the directory ends, once a listing reached it
    /// (0: not yet): a READDIR from there is answered empty without asking again.
    pub eof_at: u64,
    /// The NFSv4.1 open stateid of the handle (its `seqid` big-endian, then its `other`): each
    /// handle is an open of its own on the server. Zeros with NFSv3 and for directories.
    #[serde(default)]
    pub state: [u8; 16],
    /// The caller that opened it (uid, gid): an NFSv4.1 open is reclaimed, and its locks,
    /// with this credential (a server that squashes root would refuse root's reclaim of a file
    /// only its owner may open). Root with NFSv3, for directories, and for handles read back
    /// from the records of a crash.
    #[serde(default)]
    pub opener: (u32, u32),
}

struct Handles {
    slots: Vec<(u32, Option<OpenFile>)>,
    free: Vec<u32>,
    /// The records kept for a crash (`nfs::keep`), written as handles change.
    keep: Option<Arc<NfsKeep>>,
}

impl OpenFile {
    /// A handle of `nodeid` opened with `flags` (a directory's if `dir`): no listing yet, no
    /// NFSv4.1 open, opened as root (the NFSv4.1 engine sets `state` and `opener`).
    pub fn new(nodeid: u64, flags: u32, dir: bool) -> OpenFile {
        OpenFile { nodeid, flags, dir, cookieverf: [0; 8], eof_at: 0, state: [0; 16], opener: (0, 0) }
    }

    fn kept(&self) -> KeptHandle {
        KeptHandle {
            nodeid: self.nodeid,
            flags: self.flags,
            dir: self.dir,
            cookieverf: self.cookieverf,
            eof_at: self.eof_at,
        }
    }
}

/// The device-side open handles (see the module documentation): a preallocated table, handle
/// = generation << 32 | index + 1.
pub struct HandleTable {
    inner: Mutex<Handles>,
}

impl std::fmt::Debug for HandleTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleTable").finish_non_exhaustive()
    }
}

impl HandleTable {
    /// Room for `max` open handles.
    pub fn new(max: usize) -> Self {
        let max = max.clamp(1, u32::MAX as usize / 4);
        let slots = vec![(0u32, None); max];
        let free = (0..max as u32).rev().collect();
        HandleTable { inner: Mutex::new(Handles { slots, free, keep: None }) }
    }

    fn lock(&self) -> MutexGuard<'_, Handles> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new handle for `file`; `ENFILE` when all are open.
    pub fn open(&self, file: OpenFile) -> Result<u64, Error> {
        let mut h = self.lock();
        let i = h.free.pop().ok_or(FULL)?;
        let slot = &mut h.slots[i as usize];
        slot.0 = slot.0.wrapping_add(1);
        slot.1 = Some(file);
        let generation = slot.0;
        if let Some(k) = &h.keep {
            k.handle_opened(i as usize, generation, &file.kept());
        }
        Ok(nodeid(i, generation))
    }

    /// The open file of `fh`, if it is open.
    pub fn get(&self, fh: u64) -> Option<OpenFile> {
        let (i, generation) = split(fh)?;
        let h = self.lock();
        h.slots.get(i).filter(|s| s.0 == generation).and_then(|s| s.1)
    }

    /// Records the cookie verifier of directory handle `fh`, and where the listing ends if this
    /// reply reached the end (`eof_at`, 0 if not).
    pub fn set_cookieverf(&self, fh: u64, verf: [u8; 8], eof_at: u64) {
        let Some((i, generation)) = split(fh) else { return };
        let mut h = self.lock();
        let h = &mut *h;
        if let Some((g, Some(f))) = h.slots.get_mut(i) {
            if *g == generation {
                f.cookieverf = verf;
                f.eof_at = eof_at;
                if let Some(k) = &h.keep {
                    k.handle_cookie(i, verf, eof_at);
                }
            }
        }
    }

    /// Handle `fh`'s open state becomes `new` if it is still `old` (NFSv4.1: its open opened
    /// again); the state it keeps now (`new`, or what another re-open put there), `None` if
    /// it is not open.
    pub fn replace_state(&self, fh: u64, old: [u8; 16], new: [u8; 16]) -> Option<[u8; 16]> {
        let (i, generation) = split(fh)?;
        let mut h = self.lock();
        let (g, f) = h.slots.get_mut(i)?;
        let f = f.as_mut().filter(|_| *g == generation)?;
        if f.state == old {
            f.state = new;
        }
        Some(f.state)
    }

    /// Closes `fh`; its open file, if it was open.
    pub fn close(&self, fh: u64) -> Option<OpenFile> {
        let (i, generation) = split(fh)?;
        let mut h = self.lock();
        let slot = h.slots.get_mut(i).filter(|s| s.0 == generation)?;
        let file = slot.1.take()?;
        if let Some(k) = &h.keep {
            k.handle_closed(i, generation);
        }
        h.free.push(i as u32);
        Some(file)
    }

    /// The table as data (a live update): each slot used so far with its generation and its
    /// open file, if open.
    pub fn save(&self) -> Vec<(u32, u32, Option<OpenFile>)> {
        let h = self.lock();
        (h.slots.iter().enumerate())
            .filter(|(_, s)| s.0 != 0 || s.1.is_some())
            .map(|(i, s)| (i as u32, s.0, s.1))
            .collect()
    }

    /// A table of `max` slots holding `slots` (as [`Self::save`] gave them).
    pub fn restore(slots: &[(u32, u32, Option<OpenFile>)], max: usize) -> Result<HandleTable, String> {
        let t = HandleTable::new(max);
        {
            let mut h = t.lock();
            for &(i, generation, file) in slots {
                let Some(slot) = h.slots.get_mut(i as usize).filter(|s| s.0 == 0 && s.1.is_none()) else {
                    return Err(format!("handle slot {i} out of range or twice"));
                };
                *slot = (generation, file);
            }
            let h = &mut *h;
            h.free.clear();
            h.free.extend((0..h.slots.len() as u32).rev().filter(|&i| h.slots[i as usize].1.is_none()));
        }
        Ok(t)
    }

    /// Every open handle with its file (a reclaim after a server restart).
    pub fn open_handles(&self) -> Vec<(u64, OpenFile)> {
        let h = self.lock();
        (h.slots.iter().enumerate()).filter_map(|(i, s)| s.1.map(|f| (nodeid(i as u32, s.0), f))).collect()
    }

    /// Every open handle's file (the session ends: nobody will RELEASE them).
    pub fn open_files(&self) -> Vec<OpenFile> {
        self.lock().slots.iter().filter_map(|s| s.1).collect()
    }

    /// Closes every handle (the session ended).
    pub fn reset(&self) {
        let mut h = self.lock();
        let h = &mut *h;
        h.free.clear();
        for (i, s) in h.slots.iter_mut().enumerate().rev() {
            if let (Some(k), Some(_)) = (&h.keep, s.1.take()) {
                k.handle_closed(i, s.0);
            }
            h.free.push(i as u32);
        }
    }

    /// Stops writing the records (they are another process's now).
    pub(super) fn unkeep(&self) {
        self.lock().keep = None;
    }

    /// Keeps the table in `keep` from now on (crash recovery, `nfs::keep`), writing every
    /// slot first.
    pub(super) fn keep_in(&self, keep: Arc<NfsKeep>) {
        let mut h = self.lock();
        for (i, s) in h.slots.iter().enumerate() {
            match &s.1 {
                Some(f) => keep.handle_opened(i, s.0, &f.kept()),
                // A slot never used is zeros in the records already (its pages untouched).
                None if s.0 == 0 => {}
                None => keep.handle_closed(i, s.0),
            }
        }
        h.keep = Some(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fh(n: u32) -> Fh {
        Fh::new(&[n.to_le_bytes().as_slice(), b"handle-bytes"].concat()).unwrap()
    }

    #[test]
    fn handles_are_deduplicated_counted_and_freed() {
        let t = NodeTable::new(fh(0), 4);
        assert_eq!(t.fh(ROOT).unwrap().as_bytes(), fh(0).as_bytes());
        let a = t.reference(&fh(1)).unwrap();
        assert_ne!(a, ROOT);
        assert_eq!(t.reference(&fh(1)).unwrap(), a, "same handle, same node");
        let b = t.reference(&fh(2)).unwrap();
        let c = t.reference(&fh(3)).unwrap();
        assert_eq!(t.reference(&fh(4)), Err(FULL));
        assert_eq!(t.len(), 4);
        t.forget(a, 1);
        assert!(t.fh(a).is_ok(), "one reference left");
        t.forget(a, 1);
        assert_eq!(t.fh(a), Err(STALE));
        let d = t.reference(&fh(4)).unwrap();
        assert_ne!(d, a, "a reused index has a new generation");
        assert_eq!(d & 0xffff_ffff, a & 0xffff_ffff);
        // The index still finds everything after deletions.
        assert_eq!(t.reference(&fh(2)).unwrap(), b);
        assert_eq!(t.reference(&fh(3)).unwrap(), c);
        assert_eq!(t.reference(&fh(0)).unwrap(), ROOT, "the root's handle is node 1");
        t.forget(ROOT, u64::MAX);
        assert!(t.fh(ROOT).is_ok(), "the root is never freed");
    }

    #[test]
    fn a_silly_name_set_after_the_last_close_is_the_callers_to_remove() {
        let t = NodeTable::new(fh(0), 8);
        let a = t.reference(&fh(1)).unwrap();
        t.opened(a).unwrap();
        t.opened(a).unwrap();
        // The UNLINK's probe saw it open; its RENAME is answered with one handle still open.
        assert!(!t.set_silly(a, fh(0)), "kept for the last close");
        assert_eq!(t.closed(a), None);
        assert_eq!(t.closed(a).map(|d| d.as_bytes().to_vec()), Some(fh(0).as_bytes().to_vec()));
        // Again, but the last RELEASE runs while the RENAME is out.
        t.opened(a).unwrap();
        assert_eq!(t.closed(a), None, "no silly name yet");
        assert!(t.set_silly(a, fh(0)), "no open left: remove it now");
        assert!(!t.has_opens(a));
        assert_eq!(t.closed(a), None, "nothing kept");
        // A node gone altogether (forgotten too) has no open either.
        t.forget(a, 1);
        assert!(t.set_silly(a, fh(0)));
    }

    #[test]
    fn open_handles_keep_a_forgotten_node() {
        let t = NodeTable::new(fh(0), 8);
        let a = t.reference(&fh(1)).unwrap();
        t.opened(a).unwrap();
        t.forget(a, 1);
        assert!(t.has_opens(a));
        assert!(t.fh(a).is_ok());
        assert!(t.any_open());
        assert_eq!(t.open_node(&fh(1)), Some(a));
        assert!(!t.set_silly(a, fh(0)));
        assert_eq!(t.closed(a).map(|d| d.as_bytes().to_vec()), Some(fh(0).as_bytes().to_vec()));
        assert!(!t.any_open());
        assert_eq!(t.fh(a), Err(STALE));
        assert_eq!(t.fh(0), Err(STALE));
        assert_eq!(&silly_name(0x1_0000_0002), b".nfs0000000100000002");
        assert_eq!(t.fh(u64::MAX), Err(STALE));
    }

    #[test]
    fn many_inserts_and_removals_keep_the_index_consistent() {
        let t = NodeTable::new(fh(0), 300);
        let mut ids = Vec::new();
        for round in 0..5u32 {
            for i in 1..290u32 {
                ids.push((i, t.reference(&fh(i + round * 1000)).unwrap()));
            }
            for (k, &(i, id)) in ids.iter().enumerate() {
                if k % 3 != 0 {
                    t.forget(id, 1);
                } else {
                    assert_eq!(t.reference(&fh(i + round * 1000)).unwrap(), id);
                    t.forget(id, 2);
                }
            }
            ids.clear();
            assert_eq!(t.len(), 1);
        }
    }

    #[test]
    fn handle_table_is_bounded_and_generational() {
        let h = HandleTable::new(2);
        let f = OpenFile::new(5, 0, false);
        let a = h.open(f).unwrap();
        let b = h.open(f).unwrap();
        assert_eq!(h.open(f), Err(FULL));
        assert_eq!(h.get(a), Some(f));
        assert_eq!(h.close(a), Some(f));
        assert_eq!(h.close(a), None);
        let c = h.open(f).unwrap();
        assert_ne!(c, a);
        assert_eq!(h.get(a), None);
        h.set_cookieverf(b, [1; 8], 0);
        assert_eq!(h.get(b).unwrap().cookieverf, [1; 8]);
        // An open opened again: kept only over the state it replaces.
        assert_eq!(h.replace_state(b, [0; 16], [2; 16]), Some([2; 16]));
        assert_eq!(h.replace_state(b, [0; 16], [3; 16]), Some([2; 16]), "another re-open kept first");
        assert_eq!(h.replace_state(a, [0; 16], [3; 16]), None, "a closed handle");
        assert_eq!(h.open_files().len(), 2);
    }

    /// Issue 22: a node table and a handle table given to another process are the same
    /// tables there: the same node ids name the same handles with their references and opens,
    /// a forgotten id stays stale, a new handle gets an id no one held, the bound holds; a
    /// state naming a handle twice, or without its root, is refused.
    #[test]
    fn tables_handed_over_keep_their_ids_generations_and_counts() {
        let t = NodeTable::new(fh(0), 8);
        let a = t.reference(&fh(1)).unwrap();
        let b = t.reference(&fh(2)).unwrap();
        assert!(t.forget(b, 1), "b goes: its slot's generation moves on");
        let c = t.reference(&fh(3)).unwrap();
        t.reference(&fh(1)).unwrap();
        t.opened(a).unwrap();
        assert!(!t.set_silly(a, fh(0)));
        let state = t.save();
        let json = serde_json::to_string(&state).unwrap();
        let r = NodeTable::restore(&serde_json::from_str(&json).unwrap(), 8).unwrap();
        assert_eq!(r.len(), t.len());
        assert_eq!(r.fh(a).unwrap().as_bytes(), fh(1).as_bytes());
        assert_eq!(r.fh(c).unwrap().as_bytes(), fh(3).as_bytes());
        assert_eq!(r.fh(b), Err(STALE), "a forgotten id stays stale");
        assert!(r.has_opens(a) && r.any_open());
        assert!(!r.forget(a, 1) && !r.forget(a, 1), "two references, and open");
        assert_eq!(r.closed(a).map(|f| f.as_bytes().to_vec()), Some(fh(0).as_bytes().to_vec()), "silly");
        assert_eq!(r.reference(&fh(3)).unwrap(), c, "deduplicated against the restored index");
        let d = r.reference(&fh(4)).unwrap();
        assert!(![ROOT, a, b, c].contains(&d), "a new node gets an id no one held: {d:#x}");
        assert_eq!(NodeTable::restore(&state, 2).err().map(|_| ()), Some(()), "over its bound");
        let mut twice = state.clone();
        twice.live.push(NodeState { index: 5, ..twice.live[1].clone() });
        twice.generations.resize(6, 0);
        assert!(NodeTable::restore(&twice, 8).is_err(), "a handle twice");
        let mut rootless = state.clone();
        rootless.live.retain(|n| n.index != 0);
        assert!(NodeTable::restore(&rootless, 8).is_err(), "no root");

        let h = HandleTable::new(4);
        let f = OpenFile::new(a, 2, false);
        let x = h.open(f).unwrap();
        let y = h.open(OpenFile { dir: true, cookieverf: [7; 8], eof_at: 9, ..f }).unwrap();
        h.close(x);
        let z = h.open(f).unwrap();
        let saved = h.save();
        let r = HandleTable::restore(&saved, 4).unwrap();
        assert_eq!(r.get(x), None, "a closed handle stays closed");
        assert_eq!(r.get(y).map(|f| (f.cookieverf, f.eof_at)), Some(([7; 8], 9)));
        assert_eq!(r.get(z), Some(f));
        let w = r.open(f).unwrap();
        assert!(![x, y, z].contains(&w));
        assert!(HandleTable::restore(&saved, 1).is_err(), "past its slots");
    }
}
