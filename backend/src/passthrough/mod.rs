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
//! buffer (`pread`/`pwrite`); the io_uring engine ([`uring::UringEngine`]) serves READ, WRITE and
//! FSYNC zero-copy instead, on the poller's own ring, when the device gives a poller an engine.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use crate::abi::{self, ROOT_ID};
use crate::filesystem::{
    CachePolicy, Context, DirEntry, DirPlusSink, DirSink, Entry, Error, FileSystem, LockAccess, Opened,
    Result, SetAttr, SetTime, Stat, StatFs, Statx, Timespec, XattrReply,
};
use crate::io::{Reader, Writer};

pub mod creds;
pub mod inode;
pub mod sandbox;
pub mod seccomp;
pub mod sys;
pub mod uring;

use inode::{Inode, InodeKey, InodeTable};

/// Longest name component (`NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// Most bytes one COPY_FILE_RANGE copies (the kernel loops for more), so that a poller is never
/// held long by one request.
pub const MAX_COPY: u64 = 16 << 20;
/// Largest extended attribute value or list we fetch (`XATTR_SIZE_MAX`).
const XATTR_SIZE_MAX: usize = 64 << 10;
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
}

impl PassthroughConfig {
    /// Serve `root` with the default settings.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        PassthroughConfig { root: root.into(), cache: CachePolicy::Auto, posix_acl: true }
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
}

impl std::fmt::Debug for PassthroughFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassthroughFs").field("root", &self.cfg.root).finish_non_exhaustive()
    }
}

/// Maps a host error to the errno the guest gets.
fn os(e: io::Error) -> Error {
    let Some(code) = e.raw_os_error() else {
        return Error::Io;
    };
    match code {
        libc::ENOSYS => Error::NotImplemented,
        libc::ENOENT => Error::NotFound,
        libc::EEXIST => Error::Exists,
        libc::ENOTDIR => Error::NotDir,
        libc::EISDIR => Error::IsDir,
        libc::ENOTEMPTY => Error::NotEmpty,
        libc::EACCES => Error::AccessDenied,
        libc::EPERM => Error::NotPermitted,
        libc::ENAMETOOLONG => Error::NameTooLong,
        libc::EINVAL => Error::InvalidArgument,
        libc::ENOSPC => Error::NoSpace,
        libc::EBADF => Error::BadHandle,
        libc::EFBIG => Error::FileTooLarge,
        libc::EMLINK => Error::TooManyLinks,
        libc::EOPNOTSUPP => Error::NotSupported,
        libc::ERANGE => Error::OutOfRange,
        libc::ENODATA => Error::NoData,
        libc::E2BIG => Error::TooBig,
        libc::ENXIO => Error::NoSuchAddress,
        libc::EOVERFLOW => Error::Overflow,
        libc::EIO => Error::Io,
        other => Error::Os(other),
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

/// Runs `f` with the caller's filesystem ids on this thread.
fn as_caller<T>(ctx: &Context, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let _guard = creds::Guard::enter(ctx.uid, ctx.gid, ctx.supp_gid).map_err(os)?;
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
        if let Err(e) = sys::raise_nofile_limit() {
            log::warn!("passthrough: cannot raise RLIMIT_NOFILE: {e}");
        }
        Ok(PassthroughFs {
            inodes: InodeTable::new(root_fd, &st),
            cfg,
            proc_fd,
            handles: RwLock::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            session: AtomicU64::new(0),
        })
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

    fn add_handle(&self, inode: Arc<Inode>, file: File, dir: bool, oflags: i32) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let dir = dir.then(|| Mutex::new(Vec::new()));
        // tmpfs and ramfs (`RAMFS_MAGIC`, which libc does not name).
        const RAMFS_MAGIC: libc::c_long = 0x8584_58f6;
        let memory_backed = dir.is_none()
            && sys::fstatfs(file.as_fd())
                .is_ok_and(|st| st.f_type == libc::TMPFS_MAGIC || st.f_type == RAMFS_MAGIC);
        inode.opens.fetch_add(1, Ordering::AcqRel);
        let access = oflags & libc::O_ACCMODE;
        let h = Arc::new(Handle { inode, file, dir, memory_backed, no_nowait: Default::default(), access });
        self.handles.write().unwrap_or_else(PoisonError::into_inner).insert(fh, h);
        fh
    }

    fn remove_handle(&self, fh: u64, ino: u64) -> Result<()> {
        let gone = {
            let mut handles = self.handles.write().unwrap_or_else(PoisonError::into_inner);
            match handles.get(&fh) {
                Some(h) if h.inode.id == ino => handles.remove(&fh),
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
        creds::enter_dir(self.proc_fd.as_fd()).map_err(os)?;
        Ok(sys::FdPath::new(fd))
    }

    /// Opens node `inode` for I/O through its `/proc/self/fd` entry and checks the result is the
    /// same inode. The caller checked the type (regular file or directory).
    fn reopen(&self, inode: &Inode, flags: i32) -> Result<File> {
        let name = sys::FdPath::new(inode.fd());
        let fd = sys::openat(self.proc_fd.as_fd(), name.name(), flags, 0).map_err(os)?;
        let st = sys::fstatx(fd.as_fd()).map_err(os)?;
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
        let st = sys::statx(dir.fd(), name.c(), libc::AT_SYMLINK_NOFOLLOW).map_err(os)?;
        if let Some(inode) = self.inodes.lookup_key(&InodeKey::of(&st)) {
            inode.set_parent(dir);
            return Ok(self.entry(&inode, &st));
        }
        let fd = sys::openat2(dir.fd(), name.c(), libc::O_PATH | libc::O_NOFOLLOW, 0, RESOLVE).map_err(os)?;
        let st = sys::fstatx(fd.as_fd()).map_err(os)?;
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
        let inode = self.inodes.reref(&target, || target.fd().try_clone_to_owned()).map_err(os)?;
        let st = match sys::fstatx(inode.fd()) {
            Ok(st) => st,
            Err(e) => {
                self.inodes.forget(inode.id, 1);
                return Err(os(e));
            }
        };
        Ok(self.entry(&inode, &st))
    }

    /// Wraps a freshly opened file (CREATE, TMPFILE) as a node plus a handle.
    fn adopt(&self, parent: &Arc<Inode>, file: OwnedFd, oflags: i32) -> Result<(Entry, Opened)> {
        let st = sys::fstatx(file.as_fd()).map_err(os)?;
        if kind_of(&st) != libc::S_IFREG {
            return Err(Error::Io);
        }
        // An O_PATH descriptor on the same inode, through the magic link of the open one.
        let path = sys::FdPath::new(file.as_fd());
        let opath = sys::openat(self.proc_fd.as_fd(), path.name(), libc::O_PATH, 0).map_err(os)?;
        let key = InodeKey::of(&st);
        if InodeKey::of(&sys::fstatx(opath.as_fd()).map_err(os)?) != key {
            return Err(Error::Io);
        }
        let inode = self.inodes.intern(opath, key, libc::S_IFREG, Some(parent));
        let entry = self.entry(&inode, &st);
        let fh = self.add_handle(inode, File::from(file), false, oflags);
        Ok((entry, Opened { fh, open_flags: self.cfg.cache.file_open_flags() }))
    }

    /// The umask for a creation: the request's when the session has `DONT_MASK` (the host then
    /// applies it unless the parent has a default ACL), else none (the guest applied it).
    fn creation_umask(&self, umask: u32) -> Result<()> {
        let mask = if self.session_has(abi::init::DONT_MASK) { umask } else { 0 };
        creds::set_umask(mask).map_err(os)
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
        sys::lseek(h.file.as_fd(), offset, libc::SEEK_SET as u32).map_err(os)?;
        let root_ino = self.inodes.root().key.ino;
        loop {
            let n = sys::getdents64(h.file.as_fd(), &mut buf).map_err(os)?;
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

impl FileSystem for PassthroughFs {
    fn init(&self, capable: u64) -> Result<u64> {
        // What the server can honour suits us: the host kernel clears set-user-id/set-group-id
        // on write, truncate and chown under the caller's ids (HANDLE_KILLPRIV(_V2)), applies
        // the umask per thread (DONT_MASK, see `creation_umask`) and keeps POSIX ACLs.
        let mut wanted = capable;
        if !self.cfg.posix_acl {
            wanted &= !abi::init::POSIX_ACL;
        }
        self.session.store(wanted, Ordering::Relaxed);
        Ok(wanted)
    }

    fn destroy(&self) {
        let handles = std::mem::take(&mut *self.handles.write().unwrap_or_else(PoisonError::into_inner));
        for h in handles.values() {
            h.inode.opens.fetch_sub(1, Ordering::AcqRel);
        }
        drop(handles);
        self.inodes.clear();
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<Entry> {
        let dir = self.inode(parent)?;
        if name == b".." {
            return as_caller(ctx, || self.lookup_dotdot(&dir));
        }
        let name = Name::new(name)?;
        as_caller(ctx, || self.do_lookup(&dir, &name))
    }

    fn forget(&self, _ctx: &Context, ino: u64, nlookup: u64) {
        self.inodes.forget(ino, nlookup);
    }

    fn getattr(&self, _ctx: &Context, ino: u64, _fh: Option<u64>) -> Result<(Stat, Duration)> {
        let inode = self.inode(ino)?;
        let st = sys::fstatx(inode.fd()).map_err(os)?;
        Ok((to_stat(&st), self.cfg.cache.timeout()))
    }

    fn setattr(&self, ctx: &Context, ino: u64, attr: &SetAttr) -> Result<(Stat, Duration)> {
        let inode = self.inode(ino)?;
        let handle = match attr.fh {
            Some(fh) => Some(self.file_handle(fh, ino)?),
            None => None,
        };
        let path = sys::FdPath::new(inode.fd());
        as_caller(ctx, || {
            if let Some(mode) = attr.mode {
                if inode.kind == libc::S_IFLNK {
                    return Err(Error::NotSupported);
                }
                sys::fchmodat(self.proc_fd.as_fd(), path.name(), mode & 0o7777).map_err(os)?;
            }
            if attr.uid.is_some() || attr.gid.is_some() {
                let uid = attr.uid.unwrap_or(u32::MAX);
                let gid = attr.gid.unwrap_or(u32::MAX);
                sys::fchown_fd(inode.fd(), uid, gid).map_err(os)?;
            }
            if let Some(size) = attr.size {
                match inode.kind {
                    libc::S_IFREG => {}
                    libc::S_IFDIR => return Err(Error::IsDir),
                    _ => return Err(Error::InvalidArgument),
                }
                match &handle {
                    // Through the handle its access mode decides, as ftruncate(2).
                    Some(h) => sys::ftruncate(h.file.as_fd(), size).map_err(os)?,
                    None => sys::truncate(self.proc_entry(inode.fd())?.name(), size).map_err(os)?,
                }
            }
            if attr.atime.is_some() || attr.mtime.is_some() {
                let times = [set_time(attr.atime), set_time(attr.mtime)];
                sys::utimensat(self.proc_fd.as_fd(), path.name(), &times, 0).map_err(os)?;
            }
            // ctime cannot be set on the host: it is whatever the changes above made it.
            Ok(())
        })?;
        let st = sys::fstatx(inode.fd()).map_err(os)?;
        Ok((to_stat(&st), self.cfg.cache.timeout()))
    }

    fn readlink(&self, _ctx: &Context, ino: u64) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        if inode.kind != libc::S_IFLNK {
            return Err(Error::InvalidArgument);
        }
        sys::readlink_fd(inode.fd()).map_err(os)
    }

    fn symlink(&self, ctx: &Context, parent: u64, name: &[u8], target: &[u8]) -> Result<Entry> {
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        let target = sys::cstring(target).map_err(os)?;
        as_caller(ctx, || {
            sys::symlinkat(&target, dir.fd(), name.c()).map_err(os)?;
            self.do_lookup(&dir, &name)
        })
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> Result<Entry> {
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        as_caller(ctx, || {
            self.creation_umask(umask)?;
            sys::mknodat(dir.fd(), name.c(), mode, u64::from(rdev)).map_err(os)?;
            self.do_lookup(&dir, &name)
        })
    }

    fn mkdir(&self, ctx: &Context, parent: u64, name: &[u8], mode: u32, umask: u32) -> Result<Entry> {
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        as_caller(ctx, || {
            self.creation_umask(umask)?;
            sys::mkdirat(dir.fd(), name.c(), mode & 0o7777).map_err(os)?;
            self.do_lookup(&dir, &name)
        })
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        as_caller(ctx, || sys::unlinkat(dir.fd(), name.c(), 0).map_err(os))
    }

    fn rmdir(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        as_caller(ctx, || sys::unlinkat(dir.fd(), name.c(), libc::AT_REMOVEDIR).map_err(os))
    }

    fn rename(
        &self,
        ctx: &Context,
        olddir: u64,
        oldname: &[u8],
        newdir: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<()> {
        let old = self.dir(olddir)?;
        let new = self.dir(newdir)?;
        let oldname = Name::new(oldname)?;
        let newname = Name::new(newname)?;
        as_caller(ctx, || sys::renameat2(old.fd(), oldname.c(), new.fd(), newname.c(), flags).map_err(os))?;
        // Moved directories now live in their new parent (both ways for an exchange).
        let mut moved = vec![(&new, &newname)];
        if flags & libc::RENAME_EXCHANGE != 0 {
            moved.push((&old, &oldname));
        }
        for (dir, name) in moved {
            if let Ok(st) = sys::statx(dir.fd(), name.c(), libc::AT_SYMLINK_NOFOLLOW) {
                if kind_of(&st) == libc::S_IFDIR {
                    if let Some(inode) = self.inodes.lookup_key(&InodeKey::of(&st)) {
                        inode.set_parent(dir);
                        self.inodes.forget(inode.id, 1);
                    }
                }
            }
        }
        Ok(())
    }

    fn link(&self, ctx: &Context, ino: u64, newparent: u64, newname: &[u8]) -> Result<Entry> {
        let inode = self.inode(ino)?;
        let dir = self.dir(newparent)?;
        let name = Name::new(newname)?;
        if inode.is_dir() {
            return Err(Error::NotPermitted);
        }
        let path = sys::FdPath::new(inode.fd());
        as_caller(ctx, || {
            // The magic link resolves to the node's own inode (a symlink stays a symlink).
            sys::linkat(self.proc_fd.as_fd(), path.name(), dir.fd(), name.c(), libc::AT_SYMLINK_FOLLOW)
                .map_err(os)
        })?;
        let inode = self.inodes.reref(&inode, || inode.fd().try_clone_to_owned()).map_err(os)?;
        match sys::fstatx(inode.fd()) {
            Ok(st) => Ok(self.entry(&inode, &st)),
            Err(e) => {
                self.inodes.forget(inode.id, 1);
                Err(os(e))
            }
        }
    }

    fn open(&self, ctx: &Context, ino: u64, flags: u32, _kill_priv: bool) -> Result<Opened> {
        let inode = self.inode(ino)?;
        match inode.kind {
            libc::S_IFREG => {}
            libc::S_IFDIR => return Err(Error::IsDir),
            libc::S_IFLNK => return Err(Error::Os(libc::ELOOP)),
            // Device nodes, FIFOs and sockets are the guest's business, never opened here.
            _ => return Err(Error::NoSuchAddress),
        }
        let oflags = open_flags(flags)?;
        // With the caller's ids: the host checks the access mode (and an O_TRUNC clears
        // set-user-id as for that caller).
        let file = as_caller(ctx, || self.reopen(&inode, oflags))?;
        Ok(Opened {
            fh: self.add_handle(inode, file, false, oflags),
            open_flags: self.cfg.cache.file_open_flags(),
        })
    }

    fn read(
        &self,
        _ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        w: &mut Writer<'_>,
    ) -> Result<usize> {
        let h = self.file_handle(fh, ino)?;
        let want = (size as usize).min(w.available());
        BOUNCE.with(|b| {
            let mut buf = b.borrow_mut();
            let mut done = 0;
            while done < want {
                let chunk = (want - done).min(IO_CHUNK);
                if buf.len() < chunk {
                    buf.resize(chunk, 0);
                }
                let n = match h.file.read_at(&mut buf[..chunk], offset + done as u64) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if done > 0 => {
                        log::debug!("passthrough: short read after {done} bytes: {e}");
                        break;
                    }
                    Err(e) => return Err(os(e)),
                };
                w.write_all(&buf[..n])?;
                done += n;
            }
            Ok(done)
        })
    }

    fn write(
        &self,
        ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        write_flags: u32,
        r: &mut Reader<'_>,
    ) -> Result<usize> {
        let h = self.file_handle(fh, ino)?;
        let size = size as usize;
        // The caller's ids matter only for clearing set-user-id/set-group-id (the host does it
        // when the writer lacks CAP_FSETID); the kernel tells us when, with HANDLE_KILLPRIV_V2.
        let kill = write_flags & abi::write_flags::KILL_SUIDGID != 0
            || !self.session_has(abi::init::HANDLE_KILLPRIV_V2);
        let guard =
            if kill { Some(creds::Guard::enter(ctx.uid, ctx.gid, ctx.supp_gid).map_err(os)?) } else { None };
        let res = BOUNCE.with(|b| {
            let mut buf = b.borrow_mut();
            let mut done = 0;
            while done < size {
                let chunk = (size - done).min(IO_CHUNK);
                buf.clear();
                if r.read_to(&mut buf, chunk) != chunk {
                    return Err(Error::InvalidArgument);
                }
                let mut at = 0;
                while at < chunk {
                    match h.file.write_at(&buf[at..chunk], offset + (done + at) as u64) {
                        Ok(0) => return Err(Error::Io),
                        Ok(n) => at += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) if done + at > 0 => return Ok(done + at),
                        Err(e) => return Err(os(e)),
                    }
                }
                done += chunk;
            }
            Ok(done)
        });
        drop(guard);
        res
    }

    fn flush(&self, _ctx: &Context, ino: u64, fh: u64, _lock_owner: u64) -> Result<()> {
        self.handle(fh, ino).map(drop)
    }

    fn release(&self, _ctx: &Context, ino: u64, fh: u64, _flags: u32, _lock_owner: u64) -> Result<()> {
        self.remove_handle(fh, ino)
    }

    fn lock_handle(&self, _ctx: &Context, ino: u64, fh: u64, access: LockAccess) -> Result<()> {
        // The locks live in the server (for the one guest this device serves), not on the host
        // file: see DESIGN.md ("FUSE semantics").
        let h = self.handle(fh, ino)?;
        if h.inode.kind != libc::S_IFREG {
            return Err(Error::InvalidArgument);
        }
        match (access, h.access) {
            (LockAccess::Read, libc::O_WRONLY) | (LockAccess::Write, libc::O_RDONLY) => Err(Error::BadHandle),
            _ => Ok(()),
        }
    }

    fn has_open_handles(&self, ino: u64) -> bool {
        self.inodes.get(ino).is_some_and(|inode| inode.opens.load(Ordering::Acquire) > 0)
    }

    fn fsync(&self, _ctx: &Context, ino: u64, fh: u64, datasync: bool) -> Result<()> {
        let h = self.file_handle(fh, ino)?;
        sys::fsync(h.file.as_fd(), datasync).map_err(os)
    }

    fn opendir(&self, ctx: &Context, ino: u64, _flags: u32) -> Result<Opened> {
        let inode = self.dir(ino)?;
        let file = as_caller(ctx, || self.reopen(&inode, libc::O_RDONLY | libc::O_DIRECTORY))?;
        Ok(Opened {
            fh: self.add_handle(inode, file, true, libc::O_RDONLY),
            open_flags: self.cfg.cache.dir_open_flags(),
        })
    }

    fn readdir(&self, ctx: &Context, ino: u64, fh: u64, offset: u64, sink: &mut DirSink<'_>) -> Result<()> {
        self.listing(ctx, ino, fh, offset, sink)
    }

    fn readdirplus(
        &self,
        ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        sink: &mut DirPlusSink<'_>,
    ) -> Result<()> {
        let dir = self.dir(ino)?;
        as_caller(ctx, || {
            self.listing(ctx, ino, fh, offset, |e| {
                let entry = if e.name == b"." || e.name == b".." {
                    Entry::default()
                } else {
                    // An entry that vanished or that the caller may not look up is listed
                    // without attributes (node id 0), as the kernel allows.
                    Name::new(e.name).and_then(|n| self.do_lookup(&dir, &n)).unwrap_or_default()
                };
                let taken = sink(e, &entry);
                if !taken && entry.ino != 0 {
                    self.inodes.forget(entry.ino, 1);
                }
                taken
            })
        })
    }

    fn releasedir(&self, _ctx: &Context, ino: u64, fh: u64, _flags: u32) -> Result<()> {
        self.remove_handle(fh, ino)
    }

    fn fsyncdir(&self, _ctx: &Context, ino: u64, fh: u64, datasync: bool) -> Result<()> {
        let h = self.handle(fh, ino)?;
        sys::fsync(h.file.as_fd(), datasync).map_err(os)
    }

    fn statfs(&self, _ctx: &Context, ino: u64) -> Result<StatFs> {
        let inode = self.inode(ino)?;
        let st = sys::fstatfs(inode.fd()).map_err(os)?;
        Ok(StatFs {
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
            files: st.f_files,
            ffree: st.f_ffree,
            bsize: st.f_bsize as u32,
            namelen: st.f_namelen as u32,
            frsize: st.f_frsize as u32,
        })
    }

    fn access(&self, ctx: &Context, ino: u64, mask: u32) -> Result<()> {
        let inode = self.inode(ino)?;
        as_caller(ctx, || sys::faccess_fd(inode.fd(), mask).map_err(os))
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: u32,
        umask: u32,
        _kill_priv: bool,
    ) -> Result<(Entry, Opened)> {
        let dir = self.dir(parent)?;
        let name = Name::new(name)?;
        let oflags = open_flags(flags)? | libc::O_CREAT | libc::O_NOFOLLOW | (flags as i32 & libc::O_EXCL);
        as_caller(ctx, || {
            self.creation_umask(umask)?;
            let file = sys::openat2(dir.fd(), name.c(), oflags, mode & 0o7777, RESOLVE).map_err(os)?;
            self.adopt(&dir, file, oflags)
        })
    }

    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> Result<(Entry, Opened)> {
        let dir = self.dir(parent)?;
        let oflags = open_flags(flags)? | libc::O_TMPFILE | (flags as i32 & libc::O_EXCL);
        as_caller(ctx, || {
            self.creation_umask(umask)?;
            let file = sys::openat2(dir.fd(), c".", oflags, mode & 0o7777, RESOLVE).map_err(os)?;
            self.adopt(&dir, file, oflags)
        })
    }

    fn fallocate(&self, ctx: &Context, ino: u64, fh: u64, mode: u32, offset: u64, length: u64) -> Result<()> {
        let h = self.file_handle(fh, ino)?;
        as_caller(ctx, || sys::fallocate(h.file.as_fd(), mode, offset, length).map_err(os))
    }

    fn setxattr(
        &self,
        ctx: &Context,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        _acl_kill_sgid: Option<bool>,
    ) -> Result<()> {
        let inode = self.inode(ino)?;
        let name = sys::cstring(name).map_err(os)?;
        let path = self.proc_entry(inode.fd())?;
        as_caller(ctx, || sys::setxattr(path.name(), &name, value, flags as i32).map_err(os))
    }

    fn getxattr(&self, ctx: &Context, ino: u64, name: &[u8], size: u32) -> Result<XattrReply> {
        let inode = self.inode(ino)?;
        let name = sys::cstring(name).map_err(os)?;
        let path = self.proc_entry(inode.fd())?;
        as_caller(ctx, || {
            if size == 0 {
                let n = sys::getxattr(path.name(), &name, &mut []).map_err(os)?;
                return Ok(XattrReply::Size(n as u32));
            }
            let mut buf = vec![0u8; (size as usize).min(XATTR_SIZE_MAX)];
            let n = sys::getxattr(path.name(), &name, &mut buf).map_err(os)?;
            buf.truncate(n);
            Ok(XattrReply::Data(buf))
        })
    }

    fn listxattr(&self, ctx: &Context, ino: u64, size: u32) -> Result<XattrReply> {
        let inode = self.inode(ino)?;
        let path = self.proc_entry(inode.fd())?;
        as_caller(ctx, || {
            if size == 0 {
                let n = sys::listxattr(path.name(), &mut []).map_err(os)?;
                return Ok(XattrReply::Size(n as u32));
            }
            let mut buf = vec![0u8; (size as usize).min(XATTR_SIZE_MAX)];
            let n = sys::listxattr(path.name(), &mut buf).map_err(os)?;
            buf.truncate(n);
            Ok(XattrReply::Data(buf))
        })
    }

    fn removexattr(&self, ctx: &Context, ino: u64, name: &[u8]) -> Result<()> {
        let inode = self.inode(ino)?;
        let name = sys::cstring(name).map_err(os)?;
        let path = self.proc_entry(inode.fd())?;
        as_caller(ctx, || sys::removexattr(path.name(), &name).map_err(os))
    }

    fn lseek(&self, _ctx: &Context, ino: u64, fh: u64, offset: u64, whence: u32) -> Result<u64> {
        let h = self.file_handle(fh, ino)?;
        sys::lseek(h.file.as_fd(), offset, whence).map_err(os)
    }

    fn copy_file_range(
        &self,
        ctx: &Context,
        ino_in: u64,
        fh_in: u64,
        off_in: u64,
        ino_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    ) -> Result<usize> {
        if flags != 0 {
            return Err(Error::InvalidArgument);
        }
        let hin = self.file_handle(fh_in, ino_in)?;
        let hout = self.file_handle(fh_out, ino_out)?;
        let len = len.min(MAX_COPY) as usize;
        as_caller(ctx, || {
            sys::copy_file_range(hin.file.as_fd(), off_in, hout.file.as_fd(), off_out, len).map_err(os)
        })
    }

    fn syncfs(&self, _ctx: &Context, ino: u64) -> Result<()> {
        let inode = self.inode(ino)?;
        let target = if inode.is_dir() { inode } else { self.inodes.root().clone() };
        let dir = self.reopen(&target, libc::O_RDONLY | libc::O_DIRECTORY)?;
        sys::syncfs(dir.as_fd()).map_err(os)
    }

    fn statx(&self, _ctx: &Context, ino: u64, _fh: Option<u64>) -> Result<(Statx, Duration)> {
        let inode = self.inode(ino)?;
        let st = sys::fstatx(inode.fd()).map_err(os)?;
        let btime = (st.stx_mask & libc::STATX_BTIME != 0).then(|| ts(&st.stx_btime));
        Ok((Statx { stat: to_stat(&st), btime }, self.cfg.cache.timeout()))
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
