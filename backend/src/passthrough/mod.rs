//! [`PassthroughFs`]: serves a host directory, confined beneath it.
//!
//! # Confinement
//!
//! - Every node is a host inode held open as an `O_PATH | O_NOFOLLOW` descriptor (see [`inode`]);
//!   nothing is ever named by a path string. A LOOKUP resolves one validated component (non-empty,
//!   no `/` or NUL, not `.`, at most 255 bytes) under its parent's descriptor with `openat2(...,
//!   RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, so every node descends from
//!   the root by names the guest gave, one directory at a time, and never through a symlink.
//! - `..` is never resolved by the host kernel: each directory remembers the directory it was
//!   found in, and the root's `..` is the root.
//! - Symlinks are never followed: a symlink node answers GETATTR and READLINK with its own
//!   attributes and text; OPEN, OPENDIR and LOOKUP through it fail. Name operations (MKDIR,
//!   MKNOD, SYMLINK, UNLINK, RMDIR, RENAME, LINK, CREATE) are `*at` calls on the parent's
//!   descriptor with one component, none of which follows a final symlink (CREATE adds
//!   `O_NOFOLLOW` and the `openat2` resolve flags).
//! - A node is opened for I/O only through its own descriptor's `/proc/self/fd/N` entry (a magic
//!   link to exactly that inode), only if it is a regular file (OPEN) or directory (OPENDIR) —
//!   device nodes, FIFOs and sockets are refused, so a guest can neither block the daemon nor
//!   reach a host device through a node it created — and the opened file is checked to be the
//!   same inode. Attribute and xattr changes go through the same `/proc/self/fd/N` paths (or
//!   `AT_EMPTY_PATH` on the descriptor), which land on the inode itself, a symlink included.
//! - Each operation runs with the caller's filesystem uid and gid on the serving thread (see
//!   [`creds`]), with no supplementary groups but the one a creation carries
//!   (`FUSE_CREATE_SUPP_GROUP`), so the host kernel checks permissions as it would for that user. Guest root is root on the share (as virtiofsd without id mapping): mount the
//!   shared directory `nosuid,nodev` on the host.
//!
//! The daemon runs this inside a sandbox of its own (see [`sandbox`]): a mount namespace whose
//! root is the shared directory, and a seccomp filter ([`seccomp`]); the passthrough is then
//! created on `/` with the `/proc/self/fd` the sandbox opened ([`PassthroughFs::with_proc_fd`]).
//!
//! Assumptions: no untrusted host process moves directories out from under the shared
//! directory while the daemon holds them (a held directory moved outside would stay reachable, as
//! with any descriptor-based server); mounts below the shared directory are the host
//! administrator's and are crossed (inode numbers may then repeat across devices, as with
//! virtiofsd without submounts).
//!
//! # Data path
//!
//! READ and WRITE copy between the host file and the guest buffers through a per-thread bounce
//! buffer (`pread`/`pwrite`); the io_uring engine ([`uring::Ring`], the filesystem's engine of each poller) serves READ, WRITE and
//! FSYNC zero-copy instead, on the poller's own ring, when the device gives a poller an engine.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use crate::abi::{self, limits, ROOT_ID};
use crate::filesystem::{
    CachePolicy, Context, DirEntry, DirPlusSink, DirSink, Entry, Error, FileSystem, LockAccess, Opened,
    Result, SetAttr, SetTime, Stat, StatFs, Statx, Timespec, XattrReply,
};
use crate::io::{Reader, Writer};

pub mod creds;
pub mod inode;
pub mod keep;
mod ops;
pub mod sandbox;
pub mod seccomp;
pub mod state;
pub mod sys;
pub mod uring;

use inode::{Inode, InodeKey, InodeTable};

/// Longest name component (`NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// Most bytes one COPY_FILE_RANGE copies (the kernel loops for more), so that a poller is never
/// held long by one request.
pub const MAX_COPY: u64 = 16 << 20;
/// Bounce buffer for the synchronous READ/WRITE path.
const IO_CHUNK: usize = 1 << 20;
/// Buffer for one `getdents64` call.
const DIRENT_BUF: usize = 16 << 10;

/// `openat2` resolve flags for every lookup: stay beneath the directory, follow no symlink.
const RESOLVE: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// `open(2)` flags passed on from OPEN and CREATE; everything else (`O_CREAT`, `O_EXCL`,
/// `O_DIRECTORY`, `O_PATH`, `O_TMPFILE`, `O_DIRECT`, `O_NOFOLLOW`, `O_NONBLOCK`, ...) is ours to set.
const OPEN_FLAGS_PASSED: i32 =
    libc::O_ACCMODE | libc::O_APPEND | libc::O_TRUNC | libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME;

/// How a [`PassthroughFs`] serves its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassthroughConfig {
    /// The shared directory.
    pub root: PathBuf,
    /// What the guest kernel may cache. The default, [`CachePolicy::Auto`], lets it keep entries
    /// and attributes for a second: changes made on the host show within that time.
    pub cache: CachePolicy,
    /// Accept `FUSE_POSIX_ACL` (the guest kernel then caches and enforces ACLs too; the host
    /// filesystem stores them and applies default ACLs).
    pub posix_acl: bool,
    /// What the guest may put on the host beyond plain files and directories.
    pub policy: Policy,
    /// Nodes the guest may hold at once (each keeps an `O_PATH` descriptor): past it a LOOKUP
    /// of a node not held yet, and every creation, fails ENFILE. A guest that looks names up
    /// and never FORGETs is held to this many.
    pub max_nodes: usize,
    /// Open file and directory handles at once (each keeps a descriptor): past it OPEN,
    /// OPENDIR and CREATE fail ENFILE.
    pub max_handles: usize,
    /// The part of the process's descriptor budget this directory may take: `max_nodes` and
    /// `max_handles` are lowered at start to fit it ([`descriptor_budget`]).
    pub descriptor_share: DescriptorShare,
}

/// Which part of the process's descriptor budget (three quarters of RLIMIT_NOFILE, the rest is
/// the device's and the daemon's) one passthrough's nodes and handles may take together. Every
/// passthrough function of a daemon shares that one budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescriptorShare {
    /// One of `n` equal parts: the `n` passthrough functions a daemon starts with.
    OneOf(usize),
    /// A passthrough added while `running` others run whose limits take `taken` descriptors
    /// together: what they leave of the budget, but no more than an equal part (one of
    /// `running + 1`).
    Left {
        /// Nodes and handles the running passthroughs may hold.
        taken: u64,
        /// How many passthroughs run.
        running: usize,
    },
}

/// Fewest descriptors a passthrough's nodes and handles are given, whatever its share.
pub const MIN_DESCRIPTORS: usize = 64;

/// The descriptors a passthrough's nodes and handles may take together under RLIMIT_NOFILE
/// `limit` (see [`DescriptorShare`]); at least [`MIN_DESCRIPTORS`].
pub fn descriptor_budget(limit: u64, share: DescriptorShare) -> usize {
    let total = limit - limit / 4;
    let part = match share {
        DescriptorShare::OneOf(n) => total / (n.max(1) as u64),
        DescriptorShare::Left { taken, running } => {
            total.saturating_sub(taken).min(total / (running as u64).saturating_add(1))
        }
    };
    usize::try_from(part).unwrap_or(usize::MAX).max(MIN_DESCRIPTORS)
}

impl PassthroughConfig {
    /// Serve `root` with the default settings.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        PassthroughConfig {
            root: root.into(),
            cache: CachePolicy::Auto,
            posix_acl: true,
            policy: Policy::default(),
            max_nodes: 1 << 18,
            max_handles: 1 << 16,
            descriptor_share: DescriptorShare::OneOf(1),
        }
    }
}

/// What a guest (its root, usually) may create on the host that a host user could then use to
/// gain privileges, in the spirit of virtiofsd's `--modcaps` (`--refuse` on the command line).
/// Each is allowed by default, as in virtiofsd and as POSIX test suites expect; a share that is
/// not mounted `nosuid,nodev` on the host should refuse them. A refused operation fails `EPERM`.
/// Independent of these, the passthrough never *opens* a FIFO, socket or device node (OPEN and
/// CREATE refuse them before any open: see `ops.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// MKNOD of character and block devices (FIFOs and sockets are always allowed).
    pub device_nodes: bool,
    /// Set-user-id bits, and set-group-id bits on anything but a directory (where the bit only
    /// makes new entries inherit the group), in MKNOD, MKDIR, CREATE, TMPFILE and SETATTR modes.
    pub setid: bool,
    /// `security.capability` extended attributes (file capabilities).
    pub file_caps: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { device_nodes: true, setid: true, file_caps: true }
    }
}

impl Policy {
    /// The names `--refuse` takes.
    pub const NAMES: [&'static str; 3] = ["device-nodes", "setid", "file-caps"];

    /// The default policy with the comma-separated `list` of [`Self::NAMES`] refused.
    pub fn refusing(list: &str) -> std::result::Result<Policy, String> {
        let mut p = Policy::default();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "device-nodes" => p.device_nodes = false,
                "setid" => p.setid = false,
                "file-caps" => p.file_caps = false,
                other => {
                    return Err(format!(
                        "unknown --refuse item {other:?} (one of {})",
                        Self::NAMES.join(", ")
                    ))
                }
            }
        }
        Ok(p)
    }

    /// Checks the mode of a creation or a SETATTR of a node of type `kind` (`S_IFMT` bits).
    pub(crate) fn check_mode(&self, kind: u32, mode: u32) -> Result<()> {
        let setid = mode & libc::S_ISUID != 0 || (mode & libc::S_ISGID != 0 && kind != libc::S_IFDIR);
        if setid && !self.setid {
            return Err(Error::NotPermitted);
        }
        Ok(())
    }

    /// Checks a MKNOD of `mode` (type and permission bits).
    pub(crate) fn check_mknod(&self, mode: u32) -> Result<()> {
        let kind = mode & libc::S_IFMT;
        if (kind == libc::S_IFCHR || kind == libc::S_IFBLK) && !self.device_nodes {
            return Err(Error::NotPermitted);
        }
        self.check_mode(kind, mode)
    }

    /// Checks a SETXATTR of `name`.
    pub(crate) fn check_xattr(&self, name: &[u8]) -> Result<()> {
        if name == b"security.capability" && !self.file_caps {
            return Err(Error::NotPermitted);
        }
        Ok(())
    }
}

/// Why a [`PassthroughFs`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The shared directory cannot be opened.
    #[error("cannot open shared directory {path}")]
    Root {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `/proc/self/fd` is not available (the passthrough needs procfs).
    #[error("cannot open /proc/self/fd")]
    Proc(#[source] io::Error),
    /// The kernel lacks a system call the confinement relies on (`openat2`, Linux 5.6).
    #[error("kernel support missing: {what}")]
    Kernel {
        /// What was tried.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
}

/// An open file or directory.
pub(crate) struct Handle {
    inode: Arc<Inode>,
    file: File,
    /// For a directory handle: the `getdents64` buffer, also serialising the listing.
    dir: Option<Mutex<Vec<u8>>>,
    /// The file lives in memory (tmpfs, ramfs): a transfer never waits for storage.
    memory_backed: bool,
    /// `RWF_NOWAIT` reads (bit 0) / writes (bit 1) were refused for this file: don't try again.
    no_nowait: std::sync::atomic::AtomicU8,
    /// The access mode it was opened with (`O_RDONLY`, `O_WRONLY` or `O_RDWR`).
    access: i32,
}

impl AsFd for Handle {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl Handle {
    /// What the supervisor holds its file as (crash recovery).
    fn held_item(&self) -> keep::HeldItem {
        keep::HeldItem::Handle {
            node: self.inode.id,
            dir: self.dir.is_some(),
            access: self.access,
            no_nowait: self.no_nowait.load(Ordering::Relaxed),
        }
    }
}

/// A passthrough filesystem over a host directory. See the module documentation.
pub struct PassthroughFs {
    cfg: PassthroughConfig,
    /// `/proc/self/fd`, through which nodes are reopened.
    proc_fd: OwnedFd,
    inodes: InodeTable,
    handles: RwLock<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    /// The `FUSE_INIT` flags of the session.
    session: AtomicU64,
    /// How pollers serve READ, WRITE and FSYNC ([`PassthroughFs::set_io_mode`]).
    io_mode: uring::IoMode,
    /// The counters of every poller's ring.
    engines: Mutex<Vec<Arc<uring::StatsCell>>>,
    /// A live update's copy ahead of its quiet point (`state`): the handles opened or
    /// released since (changed under the `handles` lock), and the nodes the copy held.
    precopy: Mutex<Option<state::Precopied>>,
    /// A copy is under way (set and read under the `handles` lock: opening and releasing a
    /// handle takes the `precopy` mutex only then).
    copying: AtomicBool,
    /// The records and descriptors kept for a crash ([`PassthroughFs::keep_in`]).
    keep: std::sync::OnceLock<Arc<keep::ShareKeep>>,
    /// Restored from a process whose share was kept completely (a live update's state says
    /// so): [`PassthroughFs::keep_in`] may take over that process's held descriptors.
    predecessor_kept: AtomicBool,
}

impl std::fmt::Debug for PassthroughFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassthroughFs").field("root", &self.cfg.root).finish_non_exhaustive()
    }
}

/// A validated name component, NUL-terminated on the stack.
struct Name {
    buf: [u8; NAME_MAX + 1],
    len: usize,
}

impl Name {
    /// Checks `name` is one path component the guest may name: non-empty, no `/` or NUL, not `.`
    /// or `..` (`EINVAL`), at most [`NAME_MAX`] bytes (`ENAMETOOLONG`).
    fn new(name: &[u8]) -> Result<Name> {
        if name.is_empty() || name == b"." || name == b".." || name.iter().any(|&b| b == b'/' || b == 0) {
            return Err(Error::InvalidArgument);
        }
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        let mut buf = [0u8; NAME_MAX + 1];
        buf[..name.len()].copy_from_slice(name);
        Ok(Name { buf, len: name.len() })
    }

    fn c(&self) -> &CStr {
        CStr::from_bytes_with_nul(&self.buf[..=self.len]).unwrap_or(sys::EMPTY)
    }
}

fn ts(t: &libc::statx_timestamp) -> Timespec {
    Timespec { sec: t.tv_sec, nsec: t.tv_nsec.min(999_999_999) }
}

/// `dev_t` (major, minor) in the kernel's `new_encode_dev` format that FUSE carries.
fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

fn to_stat(st: &libc::statx) -> Stat {
    Stat {
        ino: st.stx_ino,
        size: st.stx_size,
        blocks: st.stx_blocks,
        atime: ts(&st.stx_atime),
        mtime: ts(&st.stx_mtime),
        ctime: ts(&st.stx_ctime),
        mode: u32::from(st.stx_mode),
        nlink: st.stx_nlink,
        uid: st.stx_uid,
        gid: st.stx_gid,
        rdev: encode_dev(st.stx_rdev_major, st.stx_rdev_minor),
        blksize: st.stx_blksize,
    }
}

fn kind_of(st: &libc::statx) -> u32 {
    u32::from(st.stx_mode) & libc::S_IFMT
}

fn set_time(t: Option<SetTime>) -> libc::timespec {
    match t {
        None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        Some(SetTime::Now) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        Some(SetTime::At(t)) => libc::timespec { tv_sec: t.sec, tv_nsec: i64::from(t.nsec) },
    }
}

/// `open(2)` flags for reopening a node from guest OPEN/CREATE flags.
fn open_flags(flags: u32) -> Result<i32> {
    let flags = flags as i32;
    if flags & libc::O_ACCMODE == libc::O_ACCMODE {
        return Err(Error::InvalidArgument);
    }
    Ok(flags & OPEN_FLAGS_PASSED | libc::O_NOCTTY | libc::O_LARGEFILE)
}

/// Whether `file` lives in memory (tmpfs, ramfs: `RAMFS_MAGIC`, which libc does not name), so
/// that a transfer never waits for storage.
fn memory_backed(file: &File) -> bool {
    const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;
    sys::fstatfs(file.as_fd()).is_ok_and(|st| st.f_type == libc::TMPFS_MAGIC || st.f_type == RAMFS_MAGIC)
}

/// Lowers the node and handle limits so that together they take at most the configuration's
/// share of three quarters of RLIMIT_NOFILE (`limit`, see [`descriptor_budget`]): the rest is
/// for the device (DMA windows, accepting the next client) and the daemon. Handles get at most a
/// fifth of that share.
fn fit_descriptor_limits(cfg: &mut PassthroughConfig, limit: u64) {
    let budget = descriptor_budget(limit, cfg.descriptor_share);
    if cfg.max_nodes.saturating_add(cfg.max_handles) <= budget {
        return;
    }
    let handles = cfg.max_handles.min(budget / 5).max(1);
    let nodes = cfg.max_nodes.min(budget - handles).max(2);
    log::info!(
        "passthrough: RLIMIT_NOFILE {limit}, {:?}: at most {nodes} nodes and {handles} handles (configured {} and {})",
        cfg.descriptor_share,
        cfg.max_nodes,
        cfg.max_handles
    );
    cfg.max_nodes = nodes;
    cfg.max_handles = handles;
}

/// Runs `f` with the caller's filesystem ids on this thread.
fn as_caller<T>(ctx: &Context, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let _guard = creds::Guard::enter(ctx.uid, ctx.gid, ctx.supp_gid).map_err(Error::from)?;
    f()
}

thread_local! {
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl PassthroughFs {
    /// Opens `cfg.root` (following symlinks in that path: it is the administrator's) and checks
    /// that the kernel has what the confinement needs.
    pub fn new(cfg: PassthroughConfig) -> std::result::Result<Self, SetupError> {
        let proc_fd =
            sys::open(c"/proc/self/fd", libc::O_PATH | libc::O_DIRECTORY).map_err(SetupError::Proc)?;
        Self::with_proc_fd(cfg, proc_fd)
    }

    /// As [`PassthroughFs::new`], reopening nodes through `proc_fd`, a descriptor on this
    /// process's `/proc/self/fd` directory (a sandboxed daemon opens it before its root changes,
    /// see [`sandbox::enter_namespace`]).
    pub fn with_proc_fd(cfg: PassthroughConfig, proc_fd: OwnedFd) -> std::result::Result<Self, SetupError> {
        let root_err = |source| SetupError::Root { path: cfg.root.clone(), source };
        let path = sys::cstring(cfg.root.as_os_str().as_bytes()).map_err(root_err)?;
        let root_fd = sys::open(&path, libc::O_PATH | libc::O_DIRECTORY).map_err(root_err)?;
        let st = sys::fstatx(root_fd.as_fd()).map_err(root_err)?;
        // Its magic links are what reopening relies on: it must be procfs.
        let fs_type = sys::fstatfs(proc_fd.as_fd()).map_err(SetupError::Proc)?.f_type;
        if fs_type != libc::PROC_SUPER_MAGIC {
            return Err(SetupError::Proc(io::Error::other("/proc is not procfs")));
        }
        // openat2 (5.6) is the confinement; refuse to run without it rather than degrade.
        sys::openat2(root_fd.as_fd(), c".", libc::O_PATH, 0, RESOLVE)
            .map_err(|source| SetupError::Kernel { what: "openat2 with RESOLVE_BENEATH", source })?;
        // Every node holds a descriptor: let the guest have as many as the hard limit allows.
        let mut cfg = cfg;
        match sys::raise_nofile_limit() {
            Ok(limit) => fit_descriptor_limits(&mut cfg, limit),
            Err(e) => log::warn!("passthrough: cannot raise RLIMIT_NOFILE: {e}"),
        }
        Ok(PassthroughFs {
            inodes: InodeTable::new(root_fd, &st),
            cfg,
            proc_fd,
            handles: RwLock::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            session: AtomicU64::new(0),
            io_mode: uring::IoMode::Sync,
            engines: Mutex::new(Vec::new()),
            precopy: Mutex::new(None),
            copying: AtomicBool::new(false),
            keep: std::sync::OnceLock::new(),
            predecessor_kept: AtomicBool::new(false),
        })
    }

    /// Ring entries per poller.
    pub const RING_ENTRIES: u32 = 256;

    /// The descriptors its nodes and handles may take together (its limits, as fitted to its
    /// [`DescriptorShare`]).
    pub fn descriptor_limit(&self) -> u64 {
        self.cfg.max_nodes.saturating_add(self.cfg.max_handles) as u64
    }

    /// How each poller serves READ, WRITE and FSYNC: [`uring::IoMode::Sync`] (the default) through
    /// the synchronous methods, with a bounce buffer; otherwise on an io_uring of the poller's own
    /// ([`uring::Ring`], the filesystem's per-poller engine on the seam), inline when that cannot
    /// block with [`uring::IoMode::Hybrid`].
    pub fn set_io_mode(&mut self, mode: uring::IoMode) {
        self.io_mode = mode;
    }

    /// The I/O mode ([`PassthroughFs::set_io_mode`]).
    pub fn io_mode(&self) -> uring::IoMode {
        self.io_mode
    }

    /// What every poller's ring did so far, added up.
    pub fn engine_stats(&self) -> uring::EngineStats {
        let cells = self.engines.lock().unwrap_or_else(PoisonError::into_inner);
        let mut total = uring::EngineStats::default();
        for c in cells.iter() {
            total += c.get();
        }
        total
    }

    /// Counts `cell` in [`PassthroughFs::engine_stats`].
    fn register_engine(&self, cell: Arc<uring::StatsCell>) {
        self.engines.lock().unwrap_or_else(PoisonError::into_inner).push(cell);
    }

    /// A ring of `entries` for a caller that drives an engine itself (the daemon's pollers get
    /// theirs from `FileSystem::engine`), serving transfers as `mode` says ([`uring::IoMode::Sync`]
    /// is taken as [`uring::IoMode::Hybrid`]: an engine has a ring); counted in
    /// [`PassthroughFs::engine_stats`].
    pub fn new_ring(&self, entries: u32, mode: uring::IoMode) -> std::io::Result<uring::Ring> {
        let ring = uring::Ring::new(entries, mode)?;
        self.register_engine(ring.stats_cell());
        Ok(ring)
    }

    /// Poller `poller`'s ring, unless the I/O mode is synchronous or there is no io_uring.
    fn ring(&self, poller: usize) -> Option<uring::Ring> {
        if self.io_mode == uring::IoMode::Sync {
            return None;
        }
        match uring::Ring::new(Self::RING_ENTRIES, self.io_mode) {
            Ok(ring) => {
                self.register_engine(ring.stats_cell());
                Some(ring)
            }
            Err(e) => {
                log::warn!("poller {poller}: no io_uring ({e}); serving I/O synchronously");
                None
            }
        }
    }

    /// The shared directory.
    pub fn root_path(&self) -> &Path {
        &self.cfg.root
    }

    /// Nodes the guest holds (the root included).
    pub fn node_count(&self) -> usize {
        self.inodes.len()
    }

    /// The kernel's lookup references on node `ino`.
    pub fn lookup_count(&self, ino: u64) -> Option<u64> {
        self.inodes.refs(ino)
    }

    /// Its configuration (limits as fitted at start).
    pub fn config(&self) -> &PassthroughConfig {
        &self.cfg
    }

    /// Open file and directory handles.
    pub fn handle_count(&self) -> usize {
        self.handles.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    fn inode(&self, ino: u64) -> Result<Arc<Inode>> {
        self.inodes.get(ino).ok_or(Error::NotFound)
    }

    fn dir(&self, ino: u64) -> Result<Arc<Inode>> {
        let inode = self.inode(ino)?;
        if !inode.is_dir() {
            return Err(Error::NotDir);
        }
        Ok(inode)
    }

    /// The open handle `fh`, which must belong to node `ino`.
    pub(crate) fn handle(&self, fh: u64, ino: u64) -> Result<Arc<Handle>> {
        let handles = self.handles.read().unwrap_or_else(PoisonError::into_inner);
        match handles.get(&fh) {
            Some(h) if h.inode.id == ino => Ok(h.clone()),
            _ => Err(Error::BadHandle),
        }
    }

    fn file_handle(&self, fh: u64, ino: u64) -> Result<Arc<Handle>> {
        let h = self.handle(fh, ino)?;
        if h.dir.is_some() {
            return Err(Error::IsDir);
        }
        Ok(h)
    }

    /// ENFILE once the guest holds [`PassthroughConfig::max_nodes`] nodes (checked before the
    /// descriptor is opened or anything is created; concurrent pollers may pass it by one each).
    fn room_for_node(&self) -> Result<()> {
        if self.inodes.len() >= self.cfg.max_nodes {
            return Err(Error::Os(libc::ENFILE));
        }
        Ok(())
    }

    /// ENFILE once [`PassthroughConfig::max_handles`] handles are open (checked before opening).
    fn room_for_handle(&self) -> Result<()> {
        if self.handles.read().unwrap_or_else(PoisonError::into_inner).len() >= self.cfg.max_handles {
            return Err(Error::Os(libc::ENFILE));
        }
        Ok(())
    }

    fn add_handle(&self, inode: Arc<Inode>, file: File, dir: bool, oflags: i32) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let dir = dir.then(|| Mutex::new(Vec::new()));
        let memory_backed = dir.is_none() && memory_backed(&file);
        inode.opens.fetch_add(1, Ordering::AcqRel);
        let access = oflags & libc::O_ACCMODE;
        let h = Arc::new(Handle { inode, file, dir, memory_backed, no_nowait: Default::default(), access });
        if let Some(k) = self.keep.get() {
            // Its file queued for the supervisor (given before the OPEN is answered), and the
            // handle ids never given past it.
            k.next_ids(0, fh + 1);
            k.queue_hold(fh | keep::HANDLE_KEY, h.held_item(), h.clone());
        }
        let mut handles = self.handles.write().unwrap_or_else(PoisonError::into_inner);
        self.handle_changed(fh);
        handles.insert(fh, h);
        fh
    }

    fn remove_handle(&self, fh: u64, ino: u64) -> Result<()> {
        let gone = {
            let mut handles = self.handles.write().unwrap_or_else(PoisonError::into_inner);
            match handles.get(&fh) {
                Some(h) if h.inode.id == ino => {
                    self.handle_changed(fh);
                    if let Some(k) = self.keep.get() {
                        k.queue_let(fh | keep::HANDLE_KEY);
                    }
                    handles.remove(&fh)
                }
                _ => return Err(Error::BadHandle),
            }
        };
        if let Some(h) = gone {
            h.inode.opens.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(())
    }

    fn session_has(&self, flag: u64) -> bool {
        self.session.load(Ordering::Relaxed) & flag != 0
    }

    fn entry(&self, inode: &Inode, st: &libc::statx) -> Entry {
        Entry {
            ino: inode.id,
            generation: 0,
            attr: to_stat(st),
            entry_timeout: self.cfg.cache.timeout(),
            attr_timeout: self.cfg.cache.timeout(),
        }
    }

    /// The `/proc/self/fd` entry of `fd`, for a path-based call relative to the working
    /// directory, which this makes the `/proc/self/fd` directory (once per thread, see
    /// [`creds::enter_dir`]).
    fn proc_entry(&self, fd: std::os::fd::BorrowedFd<'_>) -> Result<sys::FdPath> {
        creds::enter_dir(self.proc_fd.as_fd()).map_err(Error::from)?;
        Ok(sys::FdPath::new(fd))
    }

    /// Opens node `inode` for I/O through its `/proc/self/fd` entry and checks the result is the
    /// same inode. The caller checked the type (regular file or directory).
    fn reopen(&self, inode: &Inode, flags: i32) -> Result<File> {
        let name = sys::FdPath::new(inode.fd());
        let fd = sys::openat(self.proc_fd.as_fd(), name.name(), flags, 0).map_err(Error::from)?;
        let st = sys::fstatx(fd.as_fd()).map_err(Error::from)?;
        if InodeKey::of(&st) != inode.key {
            log::error!("passthrough: /proc/self/fd reopen of node {} reached another inode", inode.id);
            return Err(Error::Io);
        }
        Ok(File::from(fd))
    }

    /// Resolves `name` in directory `dir` (with the caller's ids already in force) and takes a
    /// lookup reference on the result.
    fn do_lookup(&self, dir: &Arc<Inode>, name: &Name) -> Result<Entry> {
        if !dir.is_dir() {
            return Err(Error::NotDir);
        }
        // Fast path: a node we already hold (a revalidation). `statx` on one component without
        // following a final symlink; the node found is ours, held by its own descriptor.
        let st = sys::statx(dir.fd(), name.c(), libc::AT_SYMLINK_NOFOLLOW).map_err(Error::from)?;
        if let Some(inode) = self.inodes.lookup_key_in(&InodeKey::of(&st), dir) {
            return Ok(self.entry(&inode, &st));
        }
        self.room_for_node()?;
        let fd = sys::openat2(dir.fd(), name.c(), libc::O_PATH | libc::O_NOFOLLOW, 0, RESOLVE)
            .map_err(Error::from)?;
        let st = sys::fstatx(fd.as_fd()).map_err(Error::from)?;
        let inode = self.inodes.intern(fd, InodeKey::of(&st), kind_of(&st), Some(dir));
        Ok(self.entry(&inode, &st))
    }

    /// `..` of `dir`, from the table (the root's is the root).
    fn lookup_dotdot(&self, dir: &Arc<Inode>) -> Result<Entry> {
        if !dir.is_dir() {
            return Err(Error::NotDir);
        }
        let target = if dir.id == ROOT_ID {
            self.inodes.root().clone()
        } else {
            dir.parent().ok_or(Error::NotFound)?
        };
        let inode = self.inodes.reref(&target, || target.fd().try_clone_to_owned()).map_err(Error::from)?;
        let st = match sys::fstatx(inode.fd()) {
            Ok(st) => st,
            Err(e) => {
                self.inodes.forget(inode.id, 1);
                return Err(Error::from(e));
            }
        };
        Ok(self.entry(&inode, &st))
    }

    /// Wraps a freshly opened file (CREATE, TMPFILE) as a node plus a handle.
    fn adopt(&self, parent: &Arc<Inode>, file: OwnedFd, oflags: i32) -> Result<(Entry, Opened)> {
        let st = sys::fstatx(file.as_fd()).map_err(Error::from)?;
        if kind_of(&st) != libc::S_IFREG {
            return Err(Error::Io);
        }
        // An O_PATH descriptor on the same inode, through the magic link of the open one.
        let path = sys::FdPath::new(file.as_fd());
        let opath = sys::openat(self.proc_fd.as_fd(), path.name(), libc::O_PATH, 0).map_err(Error::from)?;
        let key = InodeKey::of(&st);
        if InodeKey::of(&sys::fstatx(opath.as_fd()).map_err(Error::from)?) != key {
            return Err(Error::Io);
        }
        let inode = self.inodes.intern(opath, key, libc::S_IFREG, Some(parent));
        let entry = self.entry(&inode, &st);
        let fh = self.add_handle(inode, File::from(file), false, oflags);
        Ok((entry, Opened { fh, open_flags: self.cfg.cache.file_open_flags() }))
    }

    /// Opens the existing entry `name` of `dir` for a CREATE without O_EXCL (with the caller's
    /// ids in force): as an `O_PATH` descriptor first, then, if it is a regular file, for I/O
    /// through its `/proc/self/fd` entry. Anything else is refused without being opened: a
    /// directory `EISDIR`, a symlink `ELOOP` (the `O_NOFOLLOW` answer), a FIFO, socket or
    /// device node `ENXIO` (what opening a socket gives; the guest kernel opens such nodes
    /// itself).
    fn open_existing(&self, dir: &Arc<Inode>, name: &Name, oflags: i32) -> Result<(Entry, Opened)> {
        let opath = sys::openat2(dir.fd(), name.c(), libc::O_PATH | libc::O_NOFOLLOW, 0, RESOLVE)
            .map_err(Error::from)?;
        let st = sys::fstatx(opath.as_fd()).map_err(Error::from)?;
        match kind_of(&st) {
            libc::S_IFREG => {}
            libc::S_IFDIR => return Err(Error::IsDir),
            libc::S_IFLNK => return Err(Error::Os(libc::ELOOP)),
            _ => return Err(Error::NoSuchAddress),
        }
        let path = sys::FdPath::new(opath.as_fd());
        // Not O_NOFOLLOW here: the /proc/self/fd entry is the (magic) link to follow.
        let reopen = oflags & !libc::O_NOFOLLOW;
        let file = sys::openat(self.proc_fd.as_fd(), path.name(), reopen, 0).map_err(Error::from)?;
        if InodeKey::of(&sys::fstatx(file.as_fd()).map_err(Error::from)?) != InodeKey::of(&st) {
            return Err(Error::Io);
        }
        self.adopt(dir, file, oflags)
    }

    /// Opens with `open(flags)`, adjusted for writeback caching: the kernel then owns the file
    /// position of `O_APPEND` writes (it sends them at the end it knows, so the host file is not
    /// opened `O_APPEND`, which would move every write to the host's end), and reads through any
    /// handle to fill the rest of a partly written page, so a write-only open is tried
    /// read-write first. If the caller may not read the file, it stays write-only: writes of
    /// whole pages work, a write-back that needs to read the page first fails `EBADF` (as under
    /// virtiofsd, whose host opens are not made as the caller, they would succeed).
    fn open_with<T>(&self, flags: i32, mut open: impl FnMut(i32) -> Result<T>) -> Result<T> {
        if !self.session_has(abi::init::WRITEBACK_CACHE) {
            return open(flags);
        }
        let flags = flags & !libc::O_APPEND;
        if flags & libc::O_ACCMODE == libc::O_WRONLY {
            match open(flags & !libc::O_ACCMODE | libc::O_RDWR) {
                Err(Error::AccessDenied) => {}
                r => return r,
            }
        }
        open(flags)
    }

    /// Whether, with writeback caching, the caller (whose ids are in force) may set the times of
    /// `inode` as a writer: through a handle open for writing, or with write permission (what
    /// the guest kernel checked before it turned a `touch` into explicit times).
    fn writer_sets_times(&self, handle: Option<&Handle>, inode: &Inode) -> bool {
        self.session_has(abi::init::WRITEBACK_CACHE)
            && (handle.is_some_and(|h| h.access != libc::O_RDONLY)
                || sys::faccess_fd(inode.fd(), libc::W_OK as u32).is_ok())
    }

    /// The umask for a creation: the request's when the session has `DONT_MASK` (the host then
    /// applies it unless the parent has a default ACL), else none (the guest applied it).
    fn creation_umask(&self, umask: u32) -> Result<()> {
        let mask = if self.session_has(abi::init::DONT_MASK) { umask } else { 0 };
        creds::set_umask(mask).map_err(Error::from)
    }

    fn listing(
        &self,
        ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        mut each: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        let _ = ctx;
        let h = self.handle(fh, ino)?;
        let Some(buf) = &h.dir else {
            return Err(Error::NotDir);
        };
        let mut buf = buf.lock().unwrap_or_else(PoisonError::into_inner);
        buf.resize(DIRENT_BUF, 0);
        sys::lseek(h.file.as_fd(), offset, libc::SEEK_SET as u32).map_err(Error::from)?;
        let root_ino = self.inodes.root().key.ino;
        loop {
            let n = sys::getdents64(h.file.as_fd(), &mut buf).map_err(Error::from)?;
            if n == 0 {
                return Ok(());
            }
            let mut at = 0;
            while at + 19 <= n {
                let rec = &buf[at..n];
                let d_ino = u64::from_ne_bytes(rec[0..8].try_into().unwrap_or_default());
                let d_off = u64::from_ne_bytes(rec[8..16].try_into().unwrap_or_default());
                let reclen = usize::from(u16::from_ne_bytes(rec[16..18].try_into().unwrap_or_default()));
                let typ = u32::from(rec[18]);
                if reclen < 19 || reclen > rec.len() {
                    log::error!("passthrough: malformed getdents64 record");
                    return Err(Error::Io);
                }
                let raw = &rec[19..reclen];
                let name = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
                at += reclen;
                // The root's `..` is the root (its host parent is outside the share).
                let d_ino = if name == b".." && h.inode.id == ROOT_ID { root_ino } else { d_ino };
                if !each(DirEntry { ino: d_ino, offset: d_off, typ, name }) {
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_single_components() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b", b"../x"] {
            assert_eq!(Name::new(bad).err(), Some(Error::InvalidArgument), "{bad:?}");
        }
        assert_eq!(Name::new(&[b'x'; 256]).err(), Some(Error::NameTooLong));
        let n = Name::new(&[b'x'; 255]).unwrap();
        assert_eq!(n.c().to_bytes().len(), 255);
        assert_eq!(Name::new(b"...").unwrap().c().to_bytes(), b"...");
    }

    #[test]
    fn node_and_handle_limits_fit_the_descriptor_limit() {
        let mut cfg = PassthroughConfig::new("/");
        fit_descriptor_limits(&mut cfg, 1 << 22);
        assert_eq!((cfg.max_nodes, cfg.max_handles), (1 << 18, 1 << 16), "a large limit changes nothing");
        fit_descriptor_limits(&mut cfg, 4096);
        assert_eq!(cfg.max_handles, 3072 / 5);
        assert_eq!(cfg.max_nodes + cfg.max_handles, 3072, "a quarter of the descriptors stays free");
    }

    /// Issue 21: each passthrough function used to fit its limits to three quarters of the
    /// process's limit on its own, so N functions together could take N times that, leaving the
    /// device and the daemon nothing. The functions a daemon starts with split the budget
    /// equally; one created later gets what the running ones leave, at most an equal part.
    #[test]
    fn passthrough_functions_share_one_descriptor_budget() {
        let limit = 1 << 20; // budget: 786432
        assert_eq!(descriptor_budget(limit, DescriptorShare::OneOf(1)), 786_432);
        assert_eq!(descriptor_budget(limit, DescriptorShare::OneOf(0)), 786_432, "0 counts as 1");
        assert_eq!(descriptor_budget(limit, DescriptorShare::OneOf(4)), 196_608);
        let mut each = Vec::new();
        for _ in 0..4 {
            let mut cfg = PassthroughConfig::new("/");
            cfg.descriptor_share = DescriptorShare::OneOf(4);
            fit_descriptor_limits(&mut cfg, limit);
            each.push(cfg.max_nodes + cfg.max_handles);
        }
        assert_eq!(each, [196_608; 4], "four functions take the budget together, no more");
        // Created later: an equal part while room is left...
        let two = DescriptorShare::Left { taken: 196_608, running: 1 };
        assert_eq!(descriptor_budget(limit, two), 786_432 / 2);
        // ...what is left when less than that...
        let nearly_full = DescriptorShare::Left { taken: 700_000, running: 2 };
        assert_eq!(descriptor_budget(limit, nearly_full), 86_432);
        // ...and the floor when nothing is.
        let full = DescriptorShare::Left { taken: 4 * 196_608, running: 4 };
        assert_eq!(descriptor_budget(limit, full), MIN_DESCRIPTORS);
        let mut cfg = PassthroughConfig::new("/");
        cfg.descriptor_share = nearly_full;
        fit_descriptor_limits(&mut cfg, limit);
        assert_eq!((cfg.max_handles, cfg.max_nodes), (86_432 / 5, 86_432 - 86_432 / 5));
    }

    #[test]
    fn open_flags_keep_only_access_and_data_flags() {
        let f = open_flags(
            (libc::O_RDWR | libc::O_CREAT | libc::O_DIRECTORY | libc::O_PATH | libc::O_APPEND) as u32,
        )
        .unwrap();
        assert_eq!(f & libc::O_ACCMODE, libc::O_RDWR);
        assert_ne!(f & libc::O_APPEND, 0);
        assert_eq!(f & (libc::O_CREAT | libc::O_DIRECTORY | libc::O_PATH), 0);
        assert_eq!(open_flags(3).err(), Some(Error::InvalidArgument));
    }

    #[test]
    fn rdev_encoding_matches_the_kernel() {
        assert_eq!(encode_dev(1, 3), 0x103);
        assert_eq!(encode_dev(8, 0x12345), (0x45) | (8 << 8) | (0x12300 << 12));
    }
}
