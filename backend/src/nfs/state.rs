//! The NFS backend as data (issue 22, live update): what a process that takes an export over
//! needs to go on without mounting it again. NFSv3 keeps no client state on the server, so
//! the export's state is all here: the mount (root handle, the programs' addresses) and the
//! server's limits, the node table and the open handles, the exclusive-create verifier
//! counter, the counters, and the UNSTABLE store: writes the guest was told are done and the
//! server has not committed, with the verifier of each, so the new process commits or replays
//! them as the old one would have. The store's pages are in a memfd the successor maps: the
//! state says which pages hold which write, and nothing is copied.
//!
//! The new process makes its own connections (one per poller, as at start); none of the old
//! process's is moved, and none has a call on the wire at the quiet point.
//!
//! NFSv4.1 keeps state on the server: the opens (each FUSE handle's stateid, in the handle
//! table) and the locks (`Locks41State`: every lock stateid and the ranges held), under the
//! client the function is to the server. The new process goes on as that same client
//! ([`ShareState`]: owner id, verifier, client id, the next CREATE_SESSION sequence): its
//! sessions join the client id without an EXCHANGE_ID, and every stateid stays good; the old
//! process ends its sessions without destroying the client id (`ClientShare::hand_over`). A
//! SETLKW waiting on the server moves as data (`Locks41State::waits`, under its wait id, which
//! its parked request names) and the new process tries it on. Not at a quiet point, and
//! refused, while a try of such a SETLKW is on the wire, an ended session's cleanup is under
//! way, a session is being established, or a reclaim runs.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::fs::{shared, NfsFs, NfsOptions, NfsStats, Tables};
use super::keep::{KeptClient, KeptMount, KeptVerf, NfsKeep};
use super::locks41::{Locks41, Locks41State};
use super::nodes::{HandleTable, NodeState, NodeTable, NodeTableState, OpenFile};
use super::session::{ClientShare, ShareState};
use super::setup::Mounted;
use super::shared::Shared41;
use super::shared::{EngineCell, Limits};
use super::unstable::{EntryState, UnstableState, UnstableStore};
use super::wire::Fh;

/// The format version this firmware writes and reads.
pub const NFS_STATE_VERSION: u32 = 1;

/// An NFS backend's state; the UNSTABLE store's bytes are in the memfd that goes with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfsState {
    /// [`NFS_STATE_VERSION`].
    pub version: u32,
    /// The export's path.
    pub export: String,
    /// The export's root handle.
    pub root: Vec<u8>,
    /// The NFS program's address.
    pub nfs_addr: std::net::SocketAddr,
    /// The MOUNT program's address.
    pub mount_addr: std::net::SocketAddr,
    /// The server's transfer sizes: read, write, directory, largest file.
    pub limits: (u32, u32, u32, u64),
    /// The exclusive-create verifier counter.
    pub verf: u64,
    /// The node table.
    pub nodes: NodeTableState,
    /// The open handles: slot, generation, open file.
    pub handles: Vec<(u32, u32, Option<OpenFile>)>,
    /// The UNSTABLE store.
    pub unstable: UnstableState,
    /// The engines' counters so far (they continue).
    pub counters: NfsStats,
    /// NFSv4.1: the client and its locks (`None` with NFSv3).
    #[serde(default)]
    pub v41: Option<V41State>,
}

/// What an NFSv4.1 export's state adds (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct V41State {
    /// The client the function is to the server.
    pub client: ShareState,
    /// The server's addresses (session trunking), as the start-up checked them.
    pub addrs: Vec<std::net::SocketAddr>,
    /// The next open owner's number.
    pub owners: u64,
    /// The lock stateids and the ranges held.
    pub locks: Locks41State,
    /// Read back from the records a crash left (`NfsState::kept`): the client comes back in a
    /// new incarnation (`ClientShare::recovered`), the opens are opened anew.
    #[serde(default)]
    pub recovered: bool,
}

/// The open state a handle read back from the records of a crash holds: no stateid the server
/// knows (its first READ or WRITE is answered BAD_STATEID), until the recovery opens it anew.
pub(crate) const LOST_OPEN: [u8; 16] =
    [0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];

impl NfsFs {
    /// Its state and the memfd of its UNSTABLE store (mapped again by the successor, not
    /// copied); call while no request runs. `Err`: it is not at a quiet point (a WRITE on the
    /// wire), or the memfd could not be duplicated.
    pub fn save(&self) -> Result<(NfsState, File), String> {
        let r = self.save_now();
        if r.is_err() {
            self.called_off();
        }
        r
    }

    /// The update a [`NfsFs::save`] was for is called off: this process serves on as before
    /// (the SETLKWs waiting on an NFSv4.1 server are tried again here).
    pub fn called_off(&self) {
        self.shared().locks41.waits.thaw();
    }

    fn save_now(&self) -> Result<(NfsState, File), String> {
        let sh = self.shared();
        let v41 = match sh.v41.as_ref() {
            Some(v) => Some(V41State {
                client: v.client.save()?,
                addrs: v.addrs.clone(),
                owners: v.owners.load(Ordering::Relaxed),
                locks: sh.locks41.save()?,
                recovered: false,
            }),
            None => None,
        };
        let (unstable, data) = sh.unstable.save()?;
        let l = sh.limits;
        let state = NfsState {
            version: NFS_STATE_VERSION,
            export: self.export().to_string(),
            root: sh.mounted.root.as_bytes().to_vec(),
            nfs_addr: sh.mounted.nfs_addr,
            mount_addr: sh.mounted.mount_addr,
            limits: (l.read, l.write, l.dir, l.max_file),
            verf: sh.verf.load(Ordering::Relaxed),
            nodes: sh.nodes.save(),
            handles: sh.handles.save(),
            unstable,
            counters: self.stats(),
            v41,
        };
        Ok((state, data))
    }

    /// The backend `state` describes, for the export `opts` names (its limits and timeouts
    /// this process's own), its UNSTABLE store over `data`, the predecessor's memfd; with
    /// [`NfsOptions::keep`], its tables kept in `records` (the predecessor's, when it kept them
    /// and they fit: the same records go on), else in new ones. Nothing is sent to the server:
    /// the pollers connect as at start.
    pub fn restore(
        opts: NfsOptions,
        state: &NfsState,
        data: File,
        records: Option<File>,
    ) -> Result<NfsFs, String> {
        let keep = match records {
            // Records of another format (a firmware before this one's): new ones are made.
            Some(r) if opts.keep => NfsKeep::open(r)
                .map_err(|e| log::info!("nfs: the predecessor's records are not taken ({e}): new ones"))
                .ok(),
            _ => None,
        };
        // The predecessor serves on until the commit: its records are written here only from
        // the commit on (`NfsFs::take_records`).
        Self::restore_kept(opts, state, data, keep, false)
    }

    /// The backend whose tables a process killed while it served kept in `records` (crash
    /// recovery, issue 24), for the export `opts` names, its UNSTABLE store over `data`. The
    /// writes that had no answer from the server are dropped (their requests run again); the
    /// same records go on.
    pub fn recover(opts: NfsOptions, data: File, records: File) -> Result<NfsFs, String> {
        let keep = NfsKeep::open(records)?;
        let state = NfsState::kept(&keep)?;
        Self::restore_kept(NfsOptions { keep: true, ..opts }, &state, data, Some(keep), true)
    }

    fn restore_kept(
        opts: NfsOptions,
        state: &NfsState,
        data: File,
        keep: Option<NfsKeep>,
        now: bool,
    ) -> Result<NfsFs, String> {
        let v41 = opts.url.version == super::url::NfsVersion::V41;
        if v41 != state.v41.is_some() {
            return Err("the state is of another NFS version than the function's URL".into());
        }
        if state.version != NFS_STATE_VERSION {
            return Err(format!(
                "NFS state format {}, this firmware reads {NFS_STATE_VERSION}",
                state.version
            ));
        }
        if state.export != opts.url.export {
            return Err(format!(
                "the state is of export {}, this function serves {}",
                state.export, opts.url.export
            ));
        }
        let root = Fh::new(&state.root).ok_or("the root's file handle")?;
        let (read, write, dir, max_file) = state.limits;
        let max = crate::abi::limits::MAX_WRITE;
        let limits = Limits {
            read: read.clamp(4096, max),
            write: write.clamp(4096, max),
            dir: dir.clamp(1024, 1 << 16),
            max_file,
        };
        let unstable = UnstableStore::restore(opts.unstable_bytes, &state.unstable, data)?;
        let nodes = NodeTable::restore(&state.nodes, opts.max_nodes)?;
        let handles = HandleTable::restore(&state.handles, opts.max_nodes)?;
        // The counters so far, as one more engine's: the sums continue.
        let c = &state.counters;
        let base = EngineCell::default();
        for (cell, v) in [
            (&base.requests, c.requests),
            (&base.errors, c.errors),
            (&base.backlogged, c.backlogged),
            (&base.timed_out, c.timed_out),
            (&base.calls, c.calls),
            (&base.retransmits, c.retransmits),
            (&base.reconnects, c.reconnects),
            (&base.bad_replies, c.bad_replies),
            (&base.address_moves, c.address_moves),
            (&base.close_failures, c.close_failures),
        ] {
            EngineCell::set(cell, v);
        }
        c.session.set_into(&base.session);
        let mounted = Mounted { root, nfs_addr: state.nfs_addr, mount_addr: state.mount_addr };
        let tables = Tables { nodes, handles, unstable };
        let keep = match keep {
            Some(k) if k.fits(opts.max_nodes.max(2), opts.max_nodes.max(1), tables.unstable.pages()) => {
                Some(k)
            }
            Some(_) | None if opts.keep => {
                let mount = KeptMount {
                    export: state.export.clone(),
                    root: state.root.clone(),
                    nfs_addr: state.nfs_addr,
                    mount_addr: state.mount_addr,
                    limits: state.limits,
                    v41: state
                        .v41
                        .as_ref()
                        .map(|v| KeptClient { owner: v.client.owner.clone(), addrs: v.addrs.clone() }),
                };
                let (nodes, pages) = (opts.max_nodes.max(2), tables.unstable.pages());
                Some(
                    NfsKeep::create(&mount, nodes, opts.max_nodes.max(1), pages)
                        .map_err(|e| format!("the NFS records: {e}"))?,
                )
            }
            _ => None,
        };
        let keep = keep.map(Arc::new);
        if let Some(k) = keep.as_ref().filter(|_| now) {
            tables.keep_in(k);
        }
        let mut shared = shared(&opts, limits, mounted, tables, state.verf, vec![Arc::new(base)]);
        if let Some(v) = &state.v41 {
            let client = if v.recovered {
                // A new incarnation of the same client: the dead process's state goes.
                ClientShare::recovered(v.client.owner.clone(), super::start41::new_verifier())
            } else {
                ClientShare::restore(&v.client)
            };
            // Reclaims after a later server restart, as at a connect.
            client.owner_reclaims();
            shared.v41 = Some(Shared41 {
                client: Arc::new(client),
                owners: std::sync::atomic::AtomicU64::new(v.owners),
                addrs: v.addrs.clone(),
            });
            shared.locks41 =
                Arc::new(Locks41::restore(&v.locks).map_err(|_| "the NFSv4.1 lock states".to_string())?);
            shared.locks41.continue_from(&state.counters.locks);
            if let Some(k) = keep.as_ref().filter(|_| now) {
                shared.locks41.states.keep_in(Some(k.clone()));
            }
        }
        let fs = NfsFs::from_parts(opts.url.export.clone(), shared, AtomicBool::new(false), keep);
        fs.records_taken.store(now, Ordering::Release);
        Ok(fs)
    }
}

impl NfsState {
    /// The state records kept for a crash describe ([`NfsKeep`]): no counters, the
    /// exclusive-create counter from 0 (its verifiers also hold the time), and without the
    /// writes whose WRITE had no answer (their requests run again; `keep_in` clears them).
    pub fn kept(keep: &NfsKeep) -> Result<NfsState, String> {
        let mount = keep.mount()?;
        let mut handles = Vec::new();
        let mut opens: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
        for i in 0..keep.handle_room() {
            let Some((generation, open)) = keep.handle_record(i) else { continue };
            let file = open.map(|h| OpenFile {
                nodeid: h.nodeid,
                flags: h.flags,
                dir: h.dir,
                cookieverf: h.cookieverf,
                eof_at: h.eof_at,
                // NFSv4.1: the dead process's opens are gone with its client.
                state: if mount.v41.is_some() && !h.dir { LOST_OPEN } else { [0; 16] },
                // Not kept: the recovery opens them anew as root.
                opener: (0, 0),
            });
            if let Some(f) = &file {
                *opens.entry(f.nodeid).or_default() += 1;
            }
            handles.push((i as u32, generation, file));
        }
        let slots = keep.node_slots_used()?;
        let mut lost = Vec::new();
        let mut generations = Vec::with_capacity(slots);
        let mut live = Vec::new();
        for i in 0..slots {
            let (generation, node) = keep.node_record(i)?;
            generations.push(generation);
            let Some(n) = node else { continue };
            let nodeid = (u64::from(generation) << 32) | (i as u64 + 1);
            if n.locked {
                // Its locks went with the dead process's client: EIO until its last close.
                lost.push(nodeid);
            }
            live.push(NodeState {
                index: i as u32,
                fh: n.fh,
                nlookup: n.nlookup,
                opens: opens.get(&nodeid).copied().unwrap_or(0),
                silly: n.silly,
            });
        }
        let (pages, seq, answers, entry_slots) = keep.store_header();
        let mut entries = Vec::new();
        for i in 0..entry_slots {
            let Some(e) = keep.entry_record(i)? else { continue };
            let verf = match e.verf {
                KeptVerf::Unknown => continue,
                KeptVerf::Known(v) => Some(v),
                KeptVerf::Resend => None,
            };
            entries.push(EntryState {
                file: e.file,
                fh: e.fh,
                cred: e.cred,
                offset: e.offset,
                len: e.len,
                pages: e.pages,
                verf,
                seq: e.seq,
                answered: e.answered,
                slot: Some(i as u32),
            });
        }
        Ok(NfsState {
            version: NFS_STATE_VERSION,
            export: mount.export,
            root: mount.root,
            nfs_addr: mount.nfs_addr,
            mount_addr: mount.mount_addr,
            limits: mount.limits,
            verf: 0,
            nodes: NodeTableState { generations, live },
            handles,
            unstable: UnstableState {
                pages,
                // Never behind an entry's (the counters are written first; a dead process's
                // records are not trusted to be).
                seq: entries.iter().map(|e| e.seq).fold(seq, u64::max),
                answers: entries.iter().map(|e| e.answered).fold(answers, u64::max),
                entries,
                stats: Default::default(),
            },
            counters: Default::default(),
            v41: mount.v41.map(|c| V41State {
                client: ShareState {
                    owner: c.owner,
                    verifier: [0; 8],
                    clientid: 0,
                    cs_sequence: None,
                    server: None,
                },
                addrs: c.addrs,
                owners: 1,
                locks: Locks41State { lost, ..Default::default() },
                recovered: true,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfs::conn::Cred;

    fn fh(n: u32) -> Fh {
        Fh::new(&[n.to_le_bytes().as_slice(), b"-handle"].concat()).unwrap()
    }

    /// The tables as a crash's records read them back equal the tables as a live update saves
    /// them, after a mix of every change (writes with no answer aside: they are dropped).
    #[test]
    fn kept_records_read_back_as_the_tables_save() {
        let mount = KeptMount {
            export: "/e".into(),
            root: fh(0).as_bytes().to_vec(),
            nfs_addr: "127.0.0.1:2049".parse().unwrap(),
            mount_addr: "127.0.0.1:2050".parse().unwrap(),
            limits: (65536, 65536, 8192, u64::MAX),
            v41: None,
        };
        let tables = Tables {
            nodes: NodeTable::new(fh(0), 64),
            handles: HandleTable::new(64),
            unstable: UnstableStore::new(64 * 4096).unwrap(),
        };
        // Some state before the records exist, then the records, then more changes.
        let a = tables.nodes.reference(&fh(1)).unwrap();
        let keep = Arc::new(NfsKeep::create(&mount, 64, 64, 64).unwrap());
        tables.keep_in(&keep);
        let b = tables.nodes.reference(&fh(2)).unwrap();
        let c = tables.nodes.reference(&fh(3)).unwrap();
        tables.nodes.reference(&fh(2)).unwrap();
        tables.nodes.forget(c, 1);
        let d = tables.nodes.reference(&fh(4)).unwrap();
        tables.nodes.opened(b).unwrap();
        let file = |nodeid, dir| OpenFile::new(nodeid, 2, dir);
        tables.handles.open(file(b, false)).unwrap();
        tables.nodes.opened(a).unwrap();
        let ha = tables.handles.open(file(a, true)).unwrap();
        tables.handles.set_cookieverf(ha, *b"cookieve", 42);
        assert!(!tables.nodes.set_silly(b, fh(0)));
        tables.nodes.opened(d).unwrap();
        let hd = tables.handles.open(file(d, false)).unwrap();
        tables.handles.close(hd);
        tables.nodes.closed(d);
        let cred = Cred { uid: 1, gid: 2, ngroups: 1, groups: [3; 16] };
        let data = vec![7u8; 3 * 4096 + 5];
        let reader = |bytes: &[u8], f: &mut dyn FnMut(&crate::io::Reader<'_>)| {
            let mut b = bytes.to_vec();
            let bufs = [vm_memory::VolatileSlice::from(&mut b[..])];
            f(&crate::io::Reader::new(&bufs));
        };
        let mut ids = Vec::new();
        for (k, len) in [(0u64, 100usize), (1, 3 * 4096 + 5), (2, 4096)] {
            reader(&data[..len], &mut |r| {
                ids.push(tables.unstable.insert(b, &fh(2), &cred, k * 65536, r).unwrap())
            });
        }
        tables.unstable.written(ids[0], *b"verifie1", false);
        tables.unstable.written(ids[1], *b"verifie1", false);
        tables.unstable.remove(ids[0]);
        // ids[2]: its WRITE has no answer yet.

        let kept = NfsState::kept(&keep).unwrap();
        assert_eq!(kept.nodes, tables.nodes.save());
        assert_eq!(kept.handles, tables.handles.save());
        let saved_entries: Vec<_> = {
            let e = &kept.unstable.entries;
            assert_eq!(e.len(), 1, "the write with no answer is not read back");
            e.clone()
        };
        assert_eq!(saved_entries[0].len as usize, 3 * 4096 + 5);
        assert_eq!(saved_entries[0].verf, Some(*b"verifie1"));
        assert_eq!(saved_entries[0].slot, Some(1));
        // The store restored from them replays the same bytes.
        let store =
            UnstableStore::restore(64 * 4096, &kept.unstable, tables.unstable.memfd().unwrap()).unwrap();
        let c = store.committed(b, *b"verifie2", u64::MAX);
        assert_eq!(c.resend, 1);
        let mut out = vec![0u8; 4 * 4096];
        let r = store.next_resend(b, 1, &mut out).replay().unwrap();
        assert_eq!((r.offset, r.len), (65536, 3 * 4096 + 5));
        assert!(out[..3 * 4096 + 5].iter().all(|&x| x == 7));
    }
}
