//! [`NfsFs`]: the remote backend, a [`FileSystem`] that serves an NFSv3 export.
//!
//! [`NfsFs::connect`] does the blocking start-up on the control thread, before any poller runs:
//! MOUNT (through the portmapper unless the URL names the ports), FSINFO for the server's
//! transfer sizes, GETATTR of the root. After that every request that needs the server goes
//! through a poller's engine ([`super::engine::NfsEngine`], one connection per poller, created by
//! [`FileSystem::engine`] on the poller's thread): the synchronous methods here answer only
//! what needs no server (FORGET, the lock checks, the session's end) and leave everything else
//! [`Error::NotImplemented`], so nothing ever blocks a poller on the network.
//!
//! State shared by the pollers, each behind a short lock: the node table and the open handles
//! ([`super::nodes`]) and the UNSTABLE replay store ([`super::unstable`]). DESIGN.md ("NFS
//! backend") has the mapping of FUSE onto NFSv3.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::conn::{Conn, ConnConfig, Cred};
use super::engine::NfsEngine;
use super::nodes::{HandleTable, NodeTable};
use super::setup::{self, Mounted, SetupError};
use super::unstable::{UnstableStats, UnstableStore};
use super::url::NfsUrl;
use super::wire::nfs3::{Args, Fattr, Ftype, NfsTime, Nfsstat, Res};
use crate::filesystem::seam::FsEngine;
use crate::filesystem::{self, CachePolicy, Context, Error, FileSystem, LockAccess, Stat, Timespec};

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
}

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
}

impl EngineCell {
    pub(crate) fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub(crate) fn set(c: &AtomicU64, v: u64) {
        c.store(v, Ordering::Relaxed);
    }
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
    /// Replies that broke the protocol (the connection was reset).
    pub bad_replies: u64,
    /// The UNSTABLE replay store.
    pub unstable: UnstableStats,
    /// Nodes in the table now.
    pub nodes: u64,
}

/// The NFS export as a [`FileSystem`] (see the module documentation).
pub struct NfsFs {
    pub(crate) mounted: Mounted,
    export: String,
    pub(crate) cache: CachePolicy,
    pub(crate) timeout: Duration,
    pub(crate) retransmit: Duration,
    pub(crate) slots: usize,
    pub(crate) limits: Limits,
    pub(crate) nodes: NodeTable,
    pub(crate) handles: HandleTable,
    pub(crate) unstable: UnstableStore,
    pub(crate) machine_name: String,
    /// Exclusive-create verifiers: unique per CREATE of this device.
    verf: AtomicU64,
    cells: Mutex<Vec<Arc<EngineCell>>>,
}

impl std::fmt::Debug for NfsFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfsFs")
            .field("export", &self.export)
            .field("nfs", &self.mounted.nfs_addr)
            .field("limits", &self.limits)
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
        Ok(NfsFs {
            export: opts.url.export.clone(),
            cache: opts.cache,
            timeout: opts.timeout,
            retransmit: opts.retransmit,
            slots: opts.slots_per_poller,
            limits,
            nodes: NodeTable::new(root, opts.max_nodes),
            handles: HandleTable::new(opts.max_nodes),
            unstable: UnstableStore::new(opts.unstable_bytes),
            machine_name,
            verf: AtomicU64::new(0),
            cells: Mutex::default(),
            mounted,
        })
    }

    /// The server's transfer sizes.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// What the backend did so far, all pollers together.
    pub fn stats(&self) -> NfsStats {
        let mut s = NfsStats::default();
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for c in self.cells.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            s.requests += g(&c.requests);
            s.errors += g(&c.errors);
            s.backlogged += g(&c.backlogged);
            s.timed_out += g(&c.timed_out);
            s.calls += g(&c.calls);
            s.retransmits += g(&c.retransmits);
            s.reconnects += g(&c.reconnects);
            s.bad_replies += g(&c.bad_replies);
        }
        s.unstable = self.unstable.stats();
        s.nodes = self.nodes.len() as u64;
        s
    }

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

    pub(crate) fn register(&self, cell: Arc<EngineCell>) {
        self.cells.lock().unwrap_or_else(|e| e.into_inner()).push(cell);
    }

    /// A verifier for an exclusive CREATE, unique for this device's life.
    pub(crate) fn create_verf(&self) -> [u8; 8] {
        let n = self.verf.fetch_add(1, Ordering::Relaxed);
        let t = Timespec::now();
        ((t.sec as u64) << 20 ^ n ^ u64::from(t.nsec)).to_be_bytes()
    }
}

impl Drop for NfsFs {
    fn drop(&mut self) {
        // Best effort: the server forgets this client's mount entry (nothing depends on it).
        if let Err(e) = setup::unmount(&self.mounted, &self.export, Duration::from_secs(2)) {
            log::debug!("nfs: unmount of {}: {e}", self.export);
        }
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

/// The caller's credentials for AUTH_SYS: uid, gid and the supplementary group FUSE gives.
pub(crate) fn cred(ctx: &Context) -> Cred {
    let mut c = Cred { uid: ctx.uid, gid: ctx.gid, ngroups: 0, groups: [0; 16] };
    if let Some(g) = ctx.supp_gid {
        c.groups[0] = g;
        c.ngroups = 1;
    }
    c
}

/// An NFS status as the guest's error.
pub(crate) fn nfs_error(status: Nfsstat) -> Error {
    Error::from_errno(status.errno())
}

fn time(t: NfsTime) -> Timespec {
    Timespec { sec: i64::from(t.sec), nsec: t.nsec.min(999_999_999) }
}

/// `S_IF*` of an NFS file type.
pub(crate) fn type_bits(t: Ftype) -> u32 {
    match t {
        Ftype::Reg => libc::S_IFREG,
        Ftype::Dir => libc::S_IFDIR,
        Ftype::Blk => libc::S_IFBLK,
        Ftype::Chr => libc::S_IFCHR,
        Ftype::Lnk => libc::S_IFLNK,
        Ftype::Sock => libc::S_IFSOCK,
        Ftype::Fifo => libc::S_IFIFO,
    }
}

/// A device number as the kernel's `new_encode_dev` (FUSE's `rdev`).
pub(crate) fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// FUSE's `rdev` as (major, minor).
pub(crate) fn decode_dev(rdev: u32) -> (u32, u32) {
    ((rdev & 0xfff00) >> 8, (rdev & 0xff) | ((rdev >> 12) & 0xfff00))
}

/// NFS attributes as `stat(2)` shows them: `st_ino` is the server's fileid (the FUSE node id
/// is the device's own, [`super::nodes`]).
pub(crate) fn stat(a: &Fattr) -> Stat {
    Stat {
        ino: a.fileid,
        size: a.size,
        blocks: a.used.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        mode: type_bits(a.ftype) | (a.mode & 0o7777),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: encode_dev(a.rdev.0, a.rdev.1),
        blksize: 4096,
    }
}

impl FileSystem for NfsFs {
    fn destroy(&self) {
        self.nodes.reset();
        self.handles.reset();
    }

    fn forget(&self, _ctx: &Context, ino: u64, nlookup: u64) {
        // A node the kernel forgot with writes still stored (their COMMIT at RELEASE failed):
        // nobody can FLUSH or FSYNC them any more, and the node id is not reused.
        if self.nodes.forget(ino, nlookup) && self.unstable.has(ino) {
            log::warn!("nfs: node {ino} forgotten with uncommitted writes; dropping them");
            self.unstable.drop_file(ino);
        }
    }

    fn lock_handle(&self, _ctx: &Context, ino: u64, fh: u64, access: LockAccess) -> filesystem::Result<()> {
        let f = self.handles.get(fh).filter(|f| f.nodeid == ino).ok_or(Error::BadHandle)?;
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
        self.nodes.has_opens(ino)
    }

    fn engine(&self, poller: usize) -> Option<Box<dyn FsEngine<Self>>> {
        Some(Box::new(NfsEngine::new(self, poller)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_convert() {
        let a = Fattr {
            ftype: Ftype::Chr,
            mode: 0o104755,
            nlink: 2,
            uid: 1000,
            gid: 100,
            size: 10,
            used: 513,
            rdev: (8, 300),
            fsid: 1,
            fileid: 77,
            atime: NfsTime { sec: 5, nsec: 6 },
            mtime: NfsTime { sec: 7, nsec: 8 },
            ctime: NfsTime { sec: 9, nsec: 2_000_000_000 },
        };
        let s = stat(&a);
        assert_eq!(s.mode, libc::S_IFCHR | 0o4755);
        assert_eq!((s.ino, s.blocks, s.nlink, s.uid, s.gid), (77, 2, 2, 1000, 100));
        assert_eq!(decode_dev(s.rdev), (8, 300));
        assert_eq!(s.ctime.nsec, 999_999_999);
        let c = cred(&Context { uid: 1, gid: 2, pid: 3, supp_gid: Some(4) });
        assert_eq!((c.uid, c.gid, c.ngroups, c.groups[0]), (1, 2, 1, 4));
    }
}
