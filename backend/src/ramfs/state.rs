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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::acl::{AclEntry, ExtAcl};
use super::node::{rd, Body, Child, Dir, FileData, Handle, Inode, Meta, Table, Xattrs, CHUNK};
use super::sys::{ChunkStore, FreeState};
use super::{RamFs, RamFsConfig};
use crate::abi::ROOT_ID;
use crate::filesystem::Timespec;

/// The format version this firmware writes and reads.
pub const RAMFS_STATE_VERSION: u32 = 2;

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

impl RamFs {
    /// The filesystem as data, without its file data (see the module documentation). Take it
    /// while no request runs.
    pub fn save(&self) -> RamFsState {
        let mut inodes = Vec::new();
        for shard in self.inodes.shards.iter() {
            for inode in rd(shard).values() {
                let body = match &inode.body {
                    Body::File(data) => {
                        BodyState::File(runs(rd(data).chunks.iter().map(|(&i, c)| (i, c.slot()))))
                    }
                    Body::Symlink(target) => BodyState::Symlink(target.to_vec()),
                    Body::Other => BodyState::Other,
                };
                let x = rd(&inode.xattrs);
                inodes.push(InodeState {
                    ino: inode.ino,
                    kind: inode.kind,
                    meta: MetaState::of(&rd(&inode.meta)),
                    xattrs: x.map.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect(),
                    lookups: inode.lookups.load(Ordering::Acquire),
                    opens: inode.opens.load(Ordering::Acquire),
                    body,
                });
            }
        }
        inodes.sort_unstable_by_key(|i| i.ino);
        let mut dirs: Vec<DirState> = (rd(&self.tree).iter())
            .map(|(&ino, d)| DirState {
                ino,
                parent: d.parent,
                next_cookie: d.next_cookie,
                entries: (d.order.values())
                    .filter_map(|name| d.get(name).map(|c| (name.to_vec(), c.cookie, c.ino, c.typ)))
                    .collect(),
            })
            .collect();
        dirs.sort_unstable_by_key(|d| d.ino);
        let mut handles = Vec::new();
        for shard in self.handles.shards.iter() {
            handles.extend(rd(shard).iter().map(|(&fh, h)| (fh, h.inode.ino, h.flags)));
        }
        handles.sort_unstable();
        let free: FreeState = self.store.free_state();
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
            store: StoreState {
                slots: self.store.slot_count(),
                next: free.next,
                resident: free.resident,
                punched: free.punched,
            },
        }
    }

    /// A filesystem of `cfg` taken over from `state`, its file data in `memfd` (the
    /// predecessor's [`RamFs::data_memfd`]); the state is checked first.
    pub fn restore(cfg: RamFsConfig, state: &RamFsState, memfd: File) -> Result<RamFs, StateError> {
        check(&cfg, state)?;
        let bad = |what: String| StateError::Invalid(what);
        let free = FreeState {
            resident: state.store.resident.clone(),
            punched: state.store.punched.clone(),
            next: state.store.next,
        };
        let store = ChunkStore::from_memfd(memfd, state.store.slots, free).map_err(StateError::Memfd)?;
        let inodes = Table::new();
        let mut by_ino = HashMap::new();
        for i in &state.inodes {
            let body = match &i.body {
                BodyState::File(chunks) => {
                    let mut map = BTreeMap::new();
                    for (index, slot) in chunks.iter().flat_map(|&r| run_chunks(r)) {
                        map.insert(
                            index,
                            store.claim(slot).ok_or_else(|| bad(format!("slot {slot} taken twice")))?,
                        );
                    }
                    Body::File(RwLock::new(FileData { chunks: map }))
                }
                BodyState::Symlink(t) => Body::Symlink(t.clone().into_boxed_slice()),
                BodyState::Other => Body::Other,
            };
            let inode = Arc::new(Inode::new(i.ino, i.kind, i.meta.meta(), i.lookups, body));
            inode.opens.store(i.opens, Ordering::Release);
            let mut x = Xattrs::default();
            for (k, v) in &i.xattrs {
                x.list_len += k.len() + 1;
                x.map.insert(k.clone().into_boxed_slice(), v.clone().into_boxed_slice());
            }
            *inode.xattrs.write().unwrap_or_else(|e| e.into_inner()) = x;
            inodes.insert(i.ino, inode.clone());
            by_ino.insert(i.ino, inode);
        }
        let mut tree = super::node::Tree::default();
        for d in &state.dirs {
            let mut dir = Dir::new(d.parent);
            dir.next_cookie = d.next_cookie;
            for (name, cookie, ino, typ) in &d.entries {
                let child = Child { cookie: *cookie, ino: *ino, typ: *typ };
                dir.entries.insert(name.clone().into_boxed_slice(), child);
                dir.order.insert(*cookie, name.clone().into_boxed_slice());
            }
            tree.insert(d.ino, dir);
        }
        let handles = Table::new();
        for &(fh, ino, flags) in &state.handles {
            let inode =
                by_ino.get(&ino).cloned().ok_or_else(|| bad(format!("handle {fh}: no inode {ino}")))?;
            handles.insert(fh, Arc::new(Handle { inode, flags }));
        }
        Ok(RamFs {
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
        })
    }
}

/// Whether `state` can be restored into a filesystem of `cfg`: nothing is built before this.
fn check(cfg: &RamFsConfig, s: &RamFsState) -> Result<(), StateError> {
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
    if s.inodes.len() as u64 > cfg.max_inodes
        || s.handles.len() as u64 > cfg.max_handles
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
    Ok(())
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
