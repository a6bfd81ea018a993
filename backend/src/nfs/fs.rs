//! [`NfsFs`]: the remote backend, a [`FileSystem`] that serves an NFSv3 or NFSv4.1 export.
//!
//! [`NfsFs::connect`] does the blocking start-up on the control thread, before any poller runs:
//! MOUNT (through the portmapper unless the URL names the ports), FSINFO for the server's
//! transfer sizes, GETATTR of the root; for NFSv4.1 (`version=4.1`) a session's walk from the
//! pseudo root to the export instead (`start41`), and each poller's engine is then
//! [`super::engine41::Nfs41Engine`], with a session of its own. After that every request that needs the server goes
//! through a poller's engine ([`super::engine::NfsEngine`], one connection per poller, created by
//! [`FileSystem::engine`] on the poller's thread): the synchronous methods here answer only
//! what needs no server (FORGET, the lock checks, the session's end) and leave everything else
//! [`Error::NotImplemented`], so nothing ever blocks a poller on the network.
//!
//! State shared by the pollers, each behind a short lock, is in [`Shared`] (the one thing an
//! engine is given): the node table and the open handles ([`super::nodes`]) and the UNSTABLE
//! replay store ([`super::unstable`]). DESIGN.md ("NFS backend") has the mapping of FUSE onto
//! NFSv3.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::conn::{Conn, ConnConfig, Cred};
use super::engine::NfsEngine;
use super::engine41::stateid_of;
use super::engine41::Nfs41Engine;
use super::keep::{KeptClient, KeptMount, NfsKeep};
use super::locks41::{LockTotals, Locks41, Orphan};
use super::nodes::{silly_name, HandleTable, NodeTable};
use super::session::{client_owner, host_identity, ClientShare};
use super::setup::{self, SetupError};
pub use super::shared::Limits;
use super::shared::{Shared, Shared41};
use super::unstable::{UnstableStats, UnstableStore};
use super::url::{NfsUrl, NfsVersion};
use super::wire::nfs3::{Args, Ftype, Res};
use crate::filesystem::seam::FsEngine;
use crate::filesystem::{self, CachePolicy, Context, Error, FileSystem, LockAccess, RemoteLocks};

/// How the device serves an NFS export (the daemon's `--remote` and profile keys).
#[derive(Debug, Clone)]
pub struct NfsOptions {
    /// `nfs://HOST[:PORT]/EXPORT[?nfsport=N&mountport=M]`.
    pub url: NfsUrl,
    /// What the guest kernel may cache (default `auto`: close-to-open, FLUSH and FSYNC commit).
    pub cache: CachePolicy,
    /// A request the server has not answered by then ends with `EIO` (the drain's bound).
    pub timeout: Duration,
    /// No reply by then: reconnect and send the call again.
    pub retransmit: Duration,
    /// Calls in flight per poller's connection; more wait in the engine's backlog.
    pub slots_per_poller: usize,
    /// The node table's bound (node ids the kernel may hold at once).
    pub max_nodes: usize,
    /// The UNSTABLE replay store's bound in bytes; 0: every WRITE goes FILE_SYNC.
    pub unstable_bytes: usize,
    /// Keep the node table, the handles and the UNSTABLE store's index in records another
    /// process reads after a crash (`keep`; the daemon's supervisor holds them); with NFSv4.1
    /// also the client's owner and which files hold locks on the server (a process started
    /// after a crash is the same client in a new incarnation: `engine41::reclaim`).
    pub keep: bool,
    /// The device function's name (its tag): with NFSv4.1, part of the client's owner id, so
    /// two functions on one export are two clients and a restarted daemon the same one.
    pub function: String,
}

impl NfsOptions {
    /// Default timeout (`nfs_timeout_ms`).
    pub const TIMEOUT: Duration = Duration::from_secs(30);
    /// Default retransmission interval (`nfs_retransmit_ms`).
    pub const RETRANSMIT: Duration = Duration::from_secs(3);
    /// Default calls in flight per poller (`nfs_slots`).
    pub const SLOTS: usize = 128;
    /// Default node table bound.
    pub const MAX_NODES: usize = 1 << 16;
    /// Default UNSTABLE store (64 MiB).
    pub const UNSTABLE_BYTES: usize = 64 << 20;

    /// The defaults for `url`.
    pub fn new(url: NfsUrl) -> Self {
        NfsOptions {
            url,
            cache: CachePolicy::Auto,
            timeout: Self::TIMEOUT,
            retransmit: Self::RETRANSMIT,
            slots_per_poller: Self::SLOTS,
            max_nodes: Self::MAX_NODES,
            unstable_bytes: Self::UNSTABLE_BYTES,
            keep: false,
            function: String::new(),
        }
    }
}

/// Why an export could not be served.
#[derive(Debug, thiserror::Error)]
pub enum NfsError {
    /// Portmapper or MOUNT failed.
    #[error("mounting the export")]
    Setup(#[from] SetupError),
    /// The start-up connection could not be made.
    #[error("connecting to the NFS server")]
    Connect(#[source] std::io::Error),
    /// The server refused a start-up call.
    #[error("{call} of the export's root failed: errno {errno}")]
    Refused {
        /// FSINFO or GETATTR.
        call: &'static str,
        /// What the server's status stands for.
        errno: i32,
    },
    /// The server answered a start-up call with the wrong reply.
    #[error("{0}: unexpected reply")]
    Unexpected(&'static str),
    /// The export's root is not a directory.
    #[error("the export's root is not a directory")]
    RootNotDir,
    /// An option is out of range.
    #[error("option {0} out of range")]
    Option(&'static str),
    /// The UNSTABLE store's memory could not be made.
    #[error("cannot make the UNSTABLE store")]
    Store(#[source] std::io::Error),
    /// The NFSv4.1 start-up failed.
    #[error("NFSv4.1 start-up")]
    Start41(#[from] super::start41::Start41Error),
}

/// What the NFS backend did so far, all pollers together (plain numbers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NfsStats {
    /// FUSE requests started on the engines.
    pub requests: u64,
    /// Of them, answered with an error.
    pub errors: u64,
    /// Requests that waited in an engine's backlog for a free connection slot.
    pub backlogged: u64,
    /// Requests that ended with `EIO` because the server did not answer in time.
    pub timed_out: u64,
    /// RPC calls sent (connections' counters).
    pub calls: u64,
    /// Calls sent again.
    pub retransmits: u64,
    /// Connections made again.
    pub reconnects: u64,
    /// Connections that moved to another of the server's addresses (NFSv4.1 session
    /// trunking: the one they had could not be reached).
    #[serde(default)]
    pub address_moves: u64,
    /// NFSv4.1: CLOSEs that failed or ended without a reply (RELEASE, the CLOSE of an open no
    /// handle keeps, MKNOD's, the opens of a reset guest): each open may stay on the server
    /// until the client's lease ends.
    #[serde(default)]
    pub close_failures: u64,
    /// Replies that broke the protocol (the connection was reset).
    pub bad_replies: u64,
    /// The UNSTABLE replay store.
    pub unstable: UnstableStats,
    /// Nodes in the table now.
    pub nodes: u64,
    /// NFSv4.1: the pollers' sessions, summed (zeros with NFSv3).
    #[serde(default)]
    pub session: SessionTotals,
    /// NFSv4.1: the locks kept on the server (zeros with NFSv3, whose locks are the device's).
    #[serde(default)]
    pub locks: LockTotals,
}

/// The NFSv4.1 sessions' counters, all pollers together ([`crate::nfs::session::SessionStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SessionTotals {
    /// Calls the engines made through their sessions.
    pub calls: u64,
    /// Calls a session sent again (a new session, DELAY, a slot resynchronised).
    pub resent: u64,
    /// Calls that waited for a session or a slot.
    pub waited: u64,
    /// Calls that ended waiting, their time-out passed.
    pub timed_out: u64,
    /// EXCHANGE_IDs answered.
    pub exchange_ids: u64,
    /// Sessions created.
    pub sessions: u64,
    /// Establishment calls that failed.
    pub establish_failures: u64,
    /// BADSESSION, DEADSESSION, CONN_NOT_BOUND_TO_SESSION answers.
    pub bad_sessions: u64,
    /// STALE_CLIENTID answers.
    pub stale_clientids: u64,
    /// SEQ_MISORDERED answers.
    pub misordered: u64,
    /// DELAY answers.
    pub delays: u64,
    /// Lone SEQUENCEs sent to renew the lease.
    pub renewals: u64,
    /// SEQUENCE results with status flags set.
    pub flagged: u64,
}

impl SessionTotals {
    /// Sets the counters `c` (one engine's) to these totals: a predecessor's, which continue.
    pub(crate) fn set_into(&self, c: &[AtomicU64; super::shared::SESSION_COUNTERS]) {
        let v = [
            self.calls,
            self.resent,
            self.waited,
            self.timed_out,
            self.exchange_ids,
            self.sessions,
            self.establish_failures,
            self.bad_sessions,
            self.stale_clientids,
            self.misordered,
            self.delays,
            self.renewals,
            self.flagged,
        ];
        for (a, v) in c.iter().zip(v) {
            a.store(v, Ordering::Relaxed);
        }
    }

    fn add(&mut self, c: &[AtomicU64; super::shared::SESSION_COUNTERS]) {
        let v: [u64; super::shared::SESSION_COUNTERS] = std::array::from_fn(|i| c[i].load(Ordering::Relaxed));
        let [calls, resent, waited, timed_out, exchange_ids, sessions, establish_failures, bad_sessions, stale_clientids, misordered, delays, renewals, flagged] =
            v;
        self.calls += calls;
        self.resent += resent;
        self.waited += waited;
        self.timed_out += timed_out;
        self.exchange_ids += exchange_ids;
        self.sessions += sessions;
        self.establish_failures += establish_failures;
        self.bad_sessions += bad_sessions;
        self.stale_clientids += stale_clientids;
        self.misordered += misordered;
        self.delays += delays;
        self.renewals += renewals;
        self.flagged += flagged;
    }
}

/// The NFS export as a [`FileSystem`] (see the module documentation).
pub struct NfsFs {
    /// What the pollers' engines share (they are given only this).
    shared: Shared,
    export: String,
    /// Handed over to another process (a live update): leave the mount to it at the end.
    given: AtomicBool,
    /// The records kept for a crash, when [`NfsOptions::keep`].
    keep: Option<Arc<NfsKeep>>,
    /// The tables write the records (a live update's successor: from the commit on).
    pub(super) records_taken: AtomicBool,
}

impl std::fmt::Debug for NfsFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfsFs")
            .field("export", &self.export)
            .field("nfs", &self.shared.mounted.nfs_addr)
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

/// The credential start-up calls go with (MOUNT is as root too).
const ROOT_CRED: Cred = Cred { uid: 0, gid: 0, ngroups: 0, groups: [0; 16] };

impl NfsFs {
    /// Mounts the export and learns its limits: blocking, on the control thread, before the
    /// pollers start.
    pub fn connect(opts: NfsOptions) -> Result<NfsFs, NfsError> {
        if opts.slots_per_poller == 0 || opts.slots_per_poller > 1 << 16 {
            return Err(NfsError::Option("slots_per_poller"));
        }
        if opts.timeout.is_zero() {
            return Err(NfsError::Option("timeout"));
        }
        if opts.url.version == NfsVersion::V41 {
            return Self::connect41(opts);
        }
        let mounted = setup::mount(&opts.url, opts.timeout)?;
        let machine_name = machine_name();
        let cfg = ConnConfig {
            addr: mounted.nfs_addr,
            slots: 4,
            max_io: 64 << 10,
            timeout: opts.timeout,
            retransmit: opts.retransmit,
            machine_name: machine_name.clone(),
        };
        let mut conn = Conn::new(cfg).map_err(NfsError::Connect)?;
        let root = mounted.root;
        let mut limits = Err(NfsError::Unexpected("FSINFO"));
        setup::call_blocking(&mut conn, &ROOT_CRED, &Args::Fsinfo { fh: &root }, opts.timeout, &mut |res| {
            limits = match res {
                Res::Fsinfo { rtmax, wtmax, dtpref, maxfilesize, .. } => Ok(Limits {
                    read: rtmax.clamp(4096, crate::abi::limits::MAX_WRITE),
                    write: wtmax.clamp(4096, crate::abi::limits::MAX_WRITE),
                    dir: dtpref.clamp(1024, 1 << 16),
                    max_file: maxfilesize,
                }),
                Res::Failed { status, .. } => {
                    Err(NfsError::Refused { call: "FSINFO", errno: status.errno() })
                }
                _ => Err(NfsError::Unexpected("FSINFO")),
            };
        })?;
        let limits = limits?;
        let mut root_type = Err(NfsError::Unexpected("GETATTR"));
        setup::call_blocking(
            &mut conn,
            &ROOT_CRED,
            &Args::Getattr { fh: &root },
            opts.timeout,
            &mut |res| {
                root_type = match res {
                    Res::Attr(a) => Ok(a.ftype),
                    Res::Failed { status, .. } => {
                        Err(NfsError::Refused { call: "GETATTR", errno: status.errno() })
                    }
                    _ => Err(NfsError::Unexpected("GETATTR")),
                };
            },
        )?;
        if root_type? != Ftype::Dir {
            return Err(NfsError::RootNotDir);
        }
        log::info!(
            "nfs: {} mounted from {} (read {} write {} bytes per call)",
            opts.url.export,
            mounted.nfs_addr,
            limits.read,
            limits.write
        );
        let tables = Tables {
            nodes: NodeTable::new(root, opts.max_nodes),
            handles: HandleTable::new(opts.max_nodes),
            unstable: UnstableStore::new(opts.unstable_bytes).map_err(NfsError::Store)?,
        };
        let keep = keep_tables(&opts, &mounted, &limits, &tables, None)?;
        let shared = shared(&opts, limits, mounted, tables, 0, Vec::new());
        let records_taken = AtomicBool::new(keep.is_some());
        Ok(NfsFs {
            export: opts.url.export.clone(),
            shared,
            given: AtomicBool::new(false),
            keep,
            records_taken,
        })
    }

    /// NFSv4.1: a session walks to the export and learns its limits (no MOUNT); the pollers'
    /// sessions are of one client, the function's ([`client_owner`]).
    fn connect41(opts: NfsOptions) -> Result<NfsFs, NfsError> {
        let url = &opts.url;
        let owner = client_owner(&host_identity(), &url.export, &opts.function);
        let verifier = super::start41::new_verifier();
        let (e, addrs) = super::start41::start_all(
            &url.nfs4_hosts(),
            &url.export,
            &owner,
            verifier,
            opts.timeout,
            opts.retransmit,
            &machine_name(),
        )?;
        let max = crate::abi::limits::MAX_WRITE;
        let size = |v: Option<u64>| v.map_or(max, |v| u32::try_from(v).unwrap_or(u32::MAX).clamp(4096, max));
        let limits = Limits {
            read: size(e.maxread),
            write: size(e.maxwrite),
            dir: 1 << 16,
            max_file: e.max_file.unwrap_or(i64::MAX as u64),
        };
        log::info!(
            "nfs: {} reached over NFSv4.1 at {:?} (read {} write {} bytes per call, lease {:?})",
            url.export,
            addrs,
            limits.read,
            limits.write,
            e.lease
        );
        let mounted = setup::Mounted { root: e.root, nfs_addr: e.addr, mount_addr: e.addr };
        let tables = Tables {
            nodes: NodeTable::new(e.root, opts.max_nodes),
            handles: HandleTable::new(opts.max_nodes),
            // WRITEs go UNSTABLE4, kept until a COMMIT returns their verifier (engine41::commit).
            unstable: UnstableStore::new(opts.unstable_bytes).map_err(NfsError::Store)?,
        };
        // Kept for a crash: the tables, and which files hold locks on the server; the client's
        // owner (a process started after a crash is the same client in a new incarnation).
        let client = KeptClient { owner: owner.clone(), addrs: addrs.clone() };
        let keep = keep_tables(&opts, &mounted, &limits, &tables, Some(client))?;
        let mut shared = shared(&opts, limits, mounted, tables, 0, Vec::new());
        let client = Arc::new(ClientShare::new(owner, verifier));
        // The engines reclaim the opens and locks after a server restart (engine41::reclaim).
        client.owner_reclaims();
        shared.v41 = Some(Shared41 { client, addrs, owners: AtomicU64::new(1) });
        if let Some(k) = &keep {
            shared.locks41.states.keep_in(Some(k.clone()));
        }
        let records_taken = AtomicBool::new(keep.is_some());
        Ok(NfsFs { export: url.export.clone(), shared, given: AtomicBool::new(false), keep, records_taken })
    }

    /// Whether the export is served over NFSv4.1.
    pub fn is_v41(&self) -> bool {
        self.shared.v41.is_some()
    }

    /// The server addresses the pollers use: NFSv4.1's that answered at start-up (session
    /// trunking), else the NFS program's one.
    pub fn server_addrs(&self) -> Vec<std::net::SocketAddr> {
        match self.shared.v41.as_ref() {
            Some(v) => v.addrs.clone(),
            None => vec![self.shared.mounted.nfs_addr],
        }
    }

    pub(super) fn from_parts(
        export: String,
        shared: Shared,
        given: AtomicBool,
        keep: Option<Arc<NfsKeep>>,
    ) -> NfsFs {
        NfsFs { export, shared, given, keep, records_taken: AtomicBool::new(false) }
    }

    /// A live update's successor, at the commit: its tables write the records from now on
    /// (written whole first; the predecessor stopped writing them before it committed).
    pub fn take_records(&self) {
        if let Some(k) = &self.keep {
            if !self.records_taken.swap(true, Ordering::AcqRel) {
                let sh = &self.shared;
                sh.nodes.keep_in(k.clone());
                sh.handles.keep_in(k.clone());
                sh.unstable.keep_in(k.clone());
                sh.locks41.states.keep_in(Some(k.clone()));
            }
        }
    }

    /// A live update's predecessor, once every function was taken (just before the commit):
    /// its tables stop writing the records, which are the successor's now.
    pub fn stop_keeping(&self) {
        self.shared.nodes.unkeep();
        self.shared.handles.unkeep();
        self.shared.unstable.unkeep();
        self.shared.locks41.states.keep_in(None);
    }

    /// The memfd of the records kept for a crash, and of the UNSTABLE store's bytes (for the
    /// supervisor to hold); `None` unless [`NfsOptions::keep`].
    pub fn kept_files(&self) -> Option<std::io::Result<(std::fs::File, std::fs::File)>> {
        let keep = self.keep.as_ref()?;
        Some((|| {
            let records = keep.memfd().try_clone_to_owned()?;
            let data = self.shared.unstable.memfd()?;
            Ok((std::fs::File::from(records), data))
        })())
    }

    pub(super) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The export's path.
    pub fn export(&self) -> &str {
        &self.export
    }

    /// Another process serves the export now (a live update): this one does not unmount it
    /// as it ends.
    pub fn give_away(&self) {
        self.given.store(true, Ordering::Release);
        if let Some(v) = self.shared.v41.as_ref() {
            // The new process is the same client: the sessions here end without destroying it.
            v.client.hand_over();
        }
    }

    /// The server's transfer sizes.
    pub fn limits(&self) -> Limits {
        self.shared.limits
    }

    /// What the backend did so far, all pollers together.
    pub fn stats(&self) -> NfsStats {
        let mut s = NfsStats::default();
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.shared.for_each_cell(|c| {
            s.requests += g(&c.requests);
            s.errors += g(&c.errors);
            s.backlogged += g(&c.backlogged);
            s.timed_out += g(&c.timed_out);
            s.calls += g(&c.calls);
            s.retransmits += g(&c.retransmits);
            s.reconnects += g(&c.reconnects);
            s.address_moves += g(&c.address_moves);
            s.close_failures += g(&c.close_failures);
            s.bad_replies += g(&c.bad_replies);
            s.session.add(&c.session);
        });
        s.unstable = self.shared.unstable.stats();
        s.nodes = self.shared.nodes.len() as u64;
        s.locks = self.shared.locks41.totals();
        s
    }
}

impl Drop for NfsFs {
    fn drop(&mut self) {
        if self.given.load(Ordering::Acquire) || self.shared.v41.is_some() {
            return;
        }
        // Best effort: the server forgets this client's mount entry (nothing depends on it).
        if let Err(e) = setup::unmount(&self.shared.mounted, &self.export, Duration::from_secs(2)) {
            log::debug!("nfs: unmount of {}: {e}", self.export);
        }
    }
}

/// New records for a crash of the export `mounted` (its NFSv4.1 `client`), with `tables` kept
/// in them from now on; `None` unless [`NfsOptions::keep`].
fn keep_tables(
    opts: &NfsOptions,
    mounted: &setup::Mounted,
    limits: &Limits,
    tables: &Tables,
    client: Option<KeptClient>,
) -> Result<Option<Arc<NfsKeep>>, NfsError> {
    if !opts.keep {
        return Ok(None);
    }
    let mount = KeptMount {
        export: opts.url.export.clone(),
        root: mounted.root.as_bytes().to_vec(),
        nfs_addr: mounted.nfs_addr,
        mount_addr: mounted.mount_addr,
        limits: (limits.read, limits.write, limits.dir, limits.max_file),
        v41: client,
    };
    let pages = tables.unstable.pages();
    let k = NfsKeep::create(&mount, opts.max_nodes.max(2), opts.max_nodes.max(1), pages)
        .map_err(NfsError::Store)?;
    let k = Arc::new(k);
    tables.keep_in(&k);
    Ok(Some(k))
}

/// The tables of an export's state (new at a mount, restored at a takeover).
pub(super) struct Tables {
    pub(super) nodes: NodeTable,
    pub(super) handles: HandleTable,
    pub(super) unstable: UnstableStore,
}

impl Tables {
    /// Keeps every table in `keep` from now on, writing what they hold first.
    pub(super) fn keep_in(&self, keep: &Arc<NfsKeep>) {
        self.nodes.keep_in(keep.clone());
        self.handles.keep_in(keep.clone());
        self.unstable.keep_in(keep.clone());
    }
}

/// What the pollers' engines share, for the export `opts` names, mounted as `mounted`; `verf`:
/// the exclusive-create counter; `cells`: counters so far.
pub(super) fn shared(
    opts: &NfsOptions,
    limits: Limits,
    mounted: setup::Mounted,
    tables: Tables,
    verf: u64,
    cells: Vec<std::sync::Arc<super::shared::EngineCell>>,
) -> Shared {
    Shared {
        cache: opts.cache,
        timeout: opts.timeout,
        retransmit: opts.retransmit,
        slots: opts.slots_per_poller,
        limits,
        nodes: tables.nodes,
        handles: tables.handles,
        unstable: tables.unstable,
        machine_name: machine_name(),
        verf: AtomicU64::new(verf),
        cells: Mutex::new(cells),
        mounted,
        v41: None,
        locks41: Arc::new(Locks41::default()),
    }
}

/// AUTH_SYS's machine name: the host name (at most 255 bytes), or the program's name.
fn machine_name() -> String {
    match std::fs::read("/proc/sys/kernel/hostname") {
        Ok(name) => {
            let name = name.strip_suffix(b"\n").unwrap_or(&name);
            let n = name.len().min(255);
            match std::str::from_utf8(&name[..n]) {
                Ok(s) if !s.is_empty() => s.to_owned(),
                _ => "virtiofs-dpu".to_owned(),
            }
        }
        Err(_) => "virtiofs-dpu".to_owned(),
    }
}

impl FileSystem for NfsFs {
    /// NFSv4.1: the guest's locks, its opens and the silly names of the files it unlinked
    /// while open end with its session: orphans the engines end on the server (LOCKU and
    /// FREE_STATEID, CLOSE, REMOVE), in the background, before the tables forget them.
    fn destroy(&self) {
        let sh = &self.shared;
        if sh.v41.is_some() {
            let nodes = &sh.nodes;
            sh.locks41.orphan_all(|n| nodes.fh(n).ok());
            for f in sh.handles.open_files() {
                if f.dir || f.state == [0; 16] {
                    continue;
                }
                match nodes.fh(f.nodeid) {
                    Ok(fh) => sh.locks41.orphan(Orphan::Open(fh, stateid_of(f.state))),
                    Err(_) => {
                        log::debug!("nfs4.1: an open of node {} has no handle: left to the lease", f.nodeid)
                    }
                }
            }
            for (node, dir) in nodes.sillies() {
                sh.locks41.orphan(Orphan::Silly(dir, silly_name(node)));
            }
            sh.locks41.found_all();
        }
        sh.nodes.reset();
        sh.handles.reset();
    }

    /// NFSv4.1: the server's locks of a reset guest go at once (orphans the engines let go),
    /// not at its next INIT; its opens stay until that INIT (the handle table still names them).
    fn device_reset(&self) {
        if self.shared.v41.is_some() {
            let nodes = &self.shared.nodes;
            self.shared.locks41.orphan_all(|n| nodes.fh(n).ok());
        }
    }

    fn forget(&self, _ctx: &Context, ino: u64, nlookup: u64) {
        // A node the kernel forgot with writes still stored (their COMMIT at RELEASE failed):
        // nobody can FLUSH or FSYNC them any more, and the node id is not reused.
        if self.shared.nodes.forget(ino, nlookup) && self.shared.unstable.has(ino) {
            log::warn!("nfs: node {ino} forgotten with uncommitted writes; dropping them");
            self.shared.unstable.drop_file(ino);
        }
    }

    fn lock_handle(&self, _ctx: &Context, ino: u64, fh: u64, access: LockAccess) -> filesystem::Result<()> {
        let f = self.shared.handles.get(fh).filter(|f| f.nodeid == ino).ok_or(Error::BadHandle)?;
        if f.dir {
            return Err(Error::BadHandle);
        }
        let mode = f.flags & libc::O_ACCMODE as u32;
        let ok = match access {
            LockAccess::Any => true,
            LockAccess::Read => mode != libc::O_WRONLY as u32,
            LockAccess::Write => mode != libc::O_RDONLY as u32,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::BadHandle)
        }
    }

    fn has_open_handles(&self, ino: u64) -> bool {
        self.shared.nodes.has_opens(ino)
    }

    /// NFSv4.1: the server keeps the locks (LOCK, LOCKT, LOCKU through the engines), so other
    /// clients of the export see them; NFSv3's are the device's (no NLM).
    fn remote_locks(&self) -> Option<&dyn RemoteLocks> {
        self.shared.v41.as_ref().map(|_| &*self.shared.locks41 as &dyn RemoteLocks)
    }

    fn engine(&self, poller: usize) -> Option<Box<dyn FsEngine<Self>>> {
        if self.shared.v41.is_some() {
            return Some(Box::new(Nfs41Engine::new(self, poller)));
        }
        Some(Box::new(NfsEngine::new(self, poller)))
    }
}

/// The engines are given the shared state only ([`NfsEngine`] is an engine of any filesystem
/// that lends it one).
impl AsRef<Shared> for NfsFs {
    fn as_ref(&self) -> &Shared {
        &self.shared
    }
}
