//! [`Shared`]: what the NFS backend's pollers share, the one thing the filesystem gives each
//! poller's engine. It holds the mount, the settings and the server's transfer sizes
//! ([`Limits`]), the node table and the open handles ([`super::nodes`]), the UNSTABLE replay
//! store ([`super::unstable`]), and every engine's counters (`EngineCell`).
//!
//! The filesystem (`fs`) owns it and the engines (`engine`) borrow it on every call, so
//! neither of those modules needs the other's types: this module uses neither.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::conn::ConnConfig;
use super::locks41::Locks41;
use super::nodes::{HandleTable, NodeTable};
use super::session::{ClientShare, SessionConfig, SessionStats};
use super::setup::Mounted;
use super::unstable::UnstableStore;
use crate::filesystem::{CachePolicy, Timespec};

/// The server's transfer sizes, from FSINFO (capped to what FUSE moves in one request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest READ count per call.
    pub read: u32,
    /// Largest WRITE count per call.
    pub write: u32,
    /// Preferred READDIR size.
    pub dir: u32,
    /// Largest file size.
    pub max_file: u64,
}

/// One poller engine's counters: written only by its poller (plain stores), read by anyone.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct EngineCell {
    pub(crate) requests: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) backlogged: AtomicU64,
    pub(crate) timed_out: AtomicU64,
    pub(crate) calls: AtomicU64,
    pub(crate) retransmits: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) bad_replies: AtomicU64,
    /// Moves to another of the server's addresses (NFSv4.1 session trunking).
    pub(crate) address_moves: AtomicU64,
    /// NFSv4.1 CLOSEs that failed or ended without a reply (the open may stay on the server
    /// until the client's lease ends).
    pub(crate) close_failures: AtomicU64,
    /// The NFSv4.1 session's counters ([`SessionStats`]), as the engine last saw them.
    pub(crate) session: [AtomicU64; SESSION_COUNTERS],
}

/// How many of a session's counters an engine publishes ([`EngineCell::set_session`]).
pub(crate) const SESSION_COUNTERS: usize = 13;

impl EngineCell {
    pub(crate) fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub(crate) fn set(c: &AtomicU64, v: u64) {
        c.store(v, Ordering::Relaxed);
    }

    /// Publishes a session's counters, in the order [`session_counters`] names them.
    pub(crate) fn set_session(&self, s: &SessionStats) {
        for (c, v) in self.session.iter().zip(session_counters(s)) {
            Self::set(c, v);
        }
    }
}

/// A session's counters, in the order [`EngineCell::session`] keeps them.
pub(crate) fn session_counters(s: &SessionStats) -> [u64; SESSION_COUNTERS] {
    [
        s.calls,
        s.resent,
        s.waited,
        s.timed_out,
        s.exchange_ids,
        s.sessions,
        s.establish_failures,
        s.bad_sessions,
        s.stale_clientids,
        s.misordered,
        s.delays,
        s.renewals,
        s.flagged,
    ]
}

/// What the pollers of an NFSv4.1 export share besides the tables: the client their sessions
/// are of, and the open owners' numbers.
#[derive(Debug)]
pub(crate) struct Shared41 {
    /// The client (owner id, verifier, client id) every poller's session is one of.
    pub(crate) client: Arc<ClientShare>,
    /// The next open owner: every OPEN has one of its own, unique for the client's life.
    pub(crate) owners: AtomicU64,
    /// The server's addresses (one server's, checked at start-up): poller `p` connects to
    /// `addrs[p % len]` and moves on to the next ones when it cannot (session trunking).
    pub(crate) addrs: Vec<std::net::SocketAddr>,
}

impl Shared41 {
    /// A new open owner's number.
    pub(crate) fn next_owner(&self) -> u64 {
        self.owners.fetch_add(1, Ordering::Relaxed)
    }
}

/// Numbers engines (each names the requests that send stored writes again by it and a slot:
/// [`super::unstable::UnstableStore::next_resend`]'s sender).
static ENGINES: AtomicU64 = AtomicU64::new(1);

/// A new engine's number.
pub(crate) fn engine_number() -> u64 {
    ENGINES.fetch_add(1, Ordering::Relaxed)
}

/// The state the NFS backend's pollers share (see the module documentation), each part behind
/// a short lock of its own where it changes.
pub struct Shared {
    pub(crate) mounted: Mounted,
    pub(crate) cache: CachePolicy,
    pub(crate) timeout: Duration,
    pub(crate) retransmit: Duration,
    pub(crate) slots: usize,
    pub(crate) limits: Limits,
    pub(crate) nodes: NodeTable,
    pub(crate) handles: HandleTable,
    pub(crate) unstable: UnstableStore,
    pub(crate) machine_name: String,
    /// Exclusive-create verifiers: unique per CREATE of this device ([`Shared::create_verf`]).
    pub(super) verf: AtomicU64,
    /// Every engine's counters ([`Shared::register`]).
    pub(super) cells: Mutex<Vec<Arc<EngineCell>>>,
    /// NFSv4.1's shared state (`None`: NFSv3).
    pub(crate) v41: Option<Shared41>,
    /// NFSv4.1: the locks the server keeps for the device (unused with NFSv3).
    pub(crate) locks41: Arc<Locks41>,
}

impl Shared {
    /// The connection settings of one poller's engine.
    pub(crate) fn conn_config(&self) -> ConnConfig {
        ConnConfig {
            addr: self.mounted.nfs_addr,
            slots: self.slots,
            max_io: self.limits.read.max(self.limits.write),
            timeout: self.timeout,
            retransmit: self.retransmit,
            machine_name: self.machine_name.clone(),
        }
    }

    /// A poller's NFSv4.1 session settings (READ/WRITE of `max_io` at most); NFSv3 exports have
    /// none, and get a client of no use.
    pub(crate) fn session_config(&self, max_io: u32) -> SessionConfig {
        let client = match &self.v41 {
            Some(v) => v.client.clone(),
            None => Arc::new(ClientShare::new(Vec::new(), [0; 8])),
        };
        super::start41::session_config(client, self.slots, max_io, self.timeout)
    }

    /// Adds an engine's counters to those the backend's statistics sum.
    pub(crate) fn register(&self, cell: Arc<EngineCell>) {
        self.cells.lock().unwrap_or_else(|e| e.into_inner()).push(cell);
    }

    /// Calls `f` with every engine's counters.
    pub(crate) fn for_each_cell(&self, mut f: impl FnMut(&EngineCell)) {
        for c in self.cells.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            f(c);
        }
    }

    /// A verifier for an exclusive CREATE, unique for this device's life.
    pub(crate) fn create_verf(&self) -> [u8; 8] {
        let n = self.verf.fetch_add(1, Ordering::Relaxed);
        let t = Timespec::now();
        ((t.sec as u64) << 20 ^ n ^ u64::from(t.nsec)).to_be_bytes()
    }
}
