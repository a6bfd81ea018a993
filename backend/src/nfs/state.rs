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

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::fs::{shared, NfsFs, NfsOptions, NfsStats, Tables};
use super::nodes::{HandleTable, NodeTable, NodeTableState, OpenFile};
use super::setup::Mounted;
use super::shared::{EngineCell, Limits};
use super::unstable::{UnstableState, UnstableStore};
use super::wire::nfs3::Fh;

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
}

impl NfsFs {
    /// Its state and the memfd of its UNSTABLE store (mapped again by the successor, not
    /// copied); call while no request runs. `Err`: it is not at a quiet point (a WRITE on the
    /// wire), or the memfd could not be duplicated.
    pub fn save(&self) -> Result<(NfsState, File), String> {
        let sh = self.shared();
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
        };
        Ok((state, data))
    }

    /// The backend `state` describes, for the export `opts` names (its limits and timeouts
    /// this process's own), its UNSTABLE store over `data`, the predecessor's memfd. Nothing is
    /// sent to the server: the pollers connect as at start.
    pub fn restore(opts: NfsOptions, state: &NfsState, data: File) -> Result<NfsFs, String> {
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
        ] {
            EngineCell::set(cell, v);
        }
        let mounted = Mounted { root, nfs_addr: state.nfs_addr, mount_addr: state.mount_addr };
        let tables = Tables { nodes, handles, unstable };
        let shared = shared(&opts, limits, mounted, tables, state.verf, vec![Arc::new(base)]);
        Ok(NfsFs::from_parts(opts.url.export.clone(), shared, AtomicBool::new(false)))
    }
}
