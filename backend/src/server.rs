//! The FUSE dispatcher: decodes one request from a descriptor chain's buffers, calls the
//! [`FileSystem`], and encodes the reply.
//!
//! The guest is untrusted. Every length is checked against the buffers actually present (the header's
//! `len` must match the readable bytes exactly, argument structs must be complete, a WRITE's size must
//! match its payload, a SETXATTR's its value, names must be NUL-terminated path components and
//! attribute names NUL-terminated and at most 255 bytes), nothing is allocated from a guest-provided
//! length beyond a bounded limit (an attribute value, at most 64 KiB), and every failure becomes an
//! errno in the reply header rather than a panic.
//! Operations that hand the kernel a reference (an entry or a handle) first check that the reply will
//! fit, so a too-small reply buffer cannot leak a lookup count or a handle.

use std::mem::size_of;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use vm_memory::{ByteValued, VolatileSlice};

use crate::abi::{self, opcode, InHeader, OutHeader};
use crate::filesystem::{
    self, Context, DirEntry, Entry, FileLock, FileSystem, LockAccess, LockType, Opened, SetAttr, SetTime,
    Stat, XattrReply,
};
use crate::io::{self, Reader, Writer};
use crate::locks::{LockError, LockKind, LockManager, SetOutcome, WaitId, OFFSET_MAX};

/// Largest WRITE payload we accept (and advertise as `max_write`).
pub const MAX_WRITE: u32 = 1 << 20;
/// `max_pages` advertised with `FUSE_MAX_PAGES` (256 x 4 KiB = [`MAX_WRITE`]).
pub const MAX_PAGES: u16 = 256;
/// Longest name section we copy out of a request (two names plus a symlink target fit).
const NAME_BUF: usize = 8192;
/// Name sections up to this long (two maximal names) are copied without zeroing [`NAME_BUF`].
const SHORT_NAMES: usize = 2 * 256;
/// Longest extended attribute name (`XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended attribute value (`XATTR_SIZE_MAX`).
pub const XATTR_SIZE_MAX: usize = 64 << 10;
/// Most bytes one COPY_FILE_RANGE may report (its reply is a 32-bit count); page-aligned, as newer
/// kernels cap it.
const MAX_COPY_REPLY: u64 = u32::MAX as u64 & !0xfff;

/// INIT flags we can honour when the kernel offers them (the filesystem then picks; see
/// [`FileSystem::init`]).
///
/// Left out on purpose:
/// - `WRITEBACK_CACHE`: the kernel would then own mtime/ctime and the size, and push them back
///   later as SETATTR with explicit times from whichever task flushes (our checks give explicit
///   times to the owner only), and write dirty pages back without the writer's identity (so
///   set-user-id clearing loses the caller); not handled yet.
/// - `EXPORT_SUPPORT`, `CACHE_SYMLINKS`, `SECURITY_CTX`, `PASSTHROUGH`, DAX and submount flags:
///   not implemented.
const SUPPORTED_INIT_FLAGS: u64 = abi::init::ASYNC_READ
    | abi::init::PARALLEL_DIROPS
    | abi::init::BIG_WRITES
    | abi::init::AUTO_INVAL_DATA
    | abi::init::ASYNC_DIO
    | abi::init::ATOMIC_O_TRUNC
    | abi::init::DO_READDIRPLUS
    | abi::init::READDIRPLUS_AUTO
    // The filesystem clears set-user-id/set-group-id on write, truncate and chown itself. Without
    // this the kernel sends those clears as SETATTR(mode) in the writer's name, which a
    // non-owner may not do.
    | abi::init::HANDLE_KILLPRIV
    // V2: the kernel says when to clear (write/setattr/open flags), and marks the superblock
    // SB_NOSEC so it stops asking GETXATTR("security.capability") before every write.
    | abi::init::HANDLE_KILLPRIV_V2
    // The filesystem applies the umask (or a parent's default ACL instead).
    | abi::init::DONT_MASK
    // The filesystem keeps POSIX ACLs; the kernel then enforces them too (default_permissions).
    | abi::init::POSIX_ACL
    // SETXATTR carries setxattr_flags (SETXATTR_ACL_KILL_SGID).
    | abi::init::SETXATTR_EXT
    // Files opened with FOPEN_DIRECT_IO (`--cache never`) may still be mmapped shared (the
    // kernel flushes and invalidates the mapping's pages around direct I/O); without it mmap
    // fails with ENODEV, as it does under virtiofsd --cache=never.
    | abi::init::DIRECT_IO_ALLOW_MMAP
    // Creations carry the caller's supplementary group that owns the parent directory (a
    // `FUSE_EXT_GROUPS` request extension), see `read_extensions`.
    | abi::init::CREATE_SUPP_GROUP
    // POSIX_LOCKS and FLOCK_LOCKS, when SETLKW can wait without blocking a poller (see there).
    | LOCK_FLAGS;

/// Advisory locks, kept by the server for every backend ([`crate::locks`]): `POSIX_LOCKS`
/// (fcntl record locks and OFD locks: GETLK, SETLK, SETLKW) and `FLOCK_LOCKS` (`flock(2)` as
/// SETLK/SETLKW with `FUSE_LK_FLOCK`). Offered only by a server made with
/// [`Server::with_lock_waits`], whose caller parks the SETLKW requests that must wait
/// ([`Server::serve`] answers them [`Served::Wait`]) and answers them later from a poller's
/// engine (see [`crate::waits`]); waiting never blocks a thread. Without them the guest kernel
/// keeps both kinds itself, which is exact for the single guest a device serves; the locks are
/// in-process either way, so host processes never see them (DESIGN.md, "FUSE semantics").
/// Linux's virtio-fs sends no FUSE_INTERRUPT, so a guest process waiting in F_SETLKW on the
/// device is woken by the grant only, not by a signal (DESIGN.md, "FUSE semantics").
const LOCK_FLAGS: u64 = abi::init::POSIX_LOCKS | abi::init::FLOCK_LOCKS;

const OUT_HEADER_SIZE: usize = size_of::<OutHeader>();

/// Why a request failed before or instead of reaching the filesystem.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    /// The request is shorter than its arguments, or the reply does not fit.
    #[error("bad buffer: {0}")]
    Buffer(#[from] io::Error),
    /// `in_header.len` disagrees with the readable bytes.
    #[error("header says {header} bytes, chain holds {actual}")]
    LengthMismatch { header: usize, actual: usize },
    /// A WRITE whose size disagrees with its payload, or exceeds `max_write`.
    #[error("write of {size} bytes with {payload} bytes of payload")]
    WriteSize { size: usize, payload: usize },
    /// A name without NUL terminator or that is not a valid path component.
    #[error("malformed name")]
    BadName,
    /// Names longer than anything a kernel sends.
    #[error("names too long")]
    NameTooLong,
    /// Invalid flags or values in the arguments.
    #[error("invalid argument")]
    Invalid,
    /// Malformed request extensions.
    #[error("malformed request extension: {0}")]
    Extension(&'static str),
    /// A request other than INIT before INIT.
    #[error("session not initialised")]
    NotInitialized,
    /// An INIT with a protocol version we cannot speak.
    #[error("unsupported protocol version {major}.{minor}")]
    Protocol { major: u32, minor: u32 },
    /// An opcode we do not serve.
    #[error("unsupported opcode {0}")]
    Opcode(u32),
    /// The filesystem failed the operation.
    #[error(transparent)]
    Fs(#[from] filesystem::Error),
    /// A lock request failed.
    #[error(transparent)]
    Lock(#[from] LockError),
}

impl RequestError {
    fn errno(&self) -> i32 {
        match self {
            RequestError::Buffer(io::Error::ShortRead { .. }) => libc::EINVAL,
            RequestError::Buffer(io::Error::ShortWrite { .. }) => libc::ERANGE,
            RequestError::LengthMismatch { .. }
            | RequestError::WriteSize { .. }
            | RequestError::BadName
            | RequestError::Invalid
            | RequestError::Extension(_) => libc::EINVAL,
            RequestError::NameTooLong => libc::ENAMETOOLONG,
            RequestError::NotInitialized => libc::EIO,
            RequestError::Protocol { .. } => libc::EPROTO,
            RequestError::Opcode(_) => libc::ENOSYS,
            RequestError::Fs(e) => e.errno(),
            RequestError::Lock(e) => e.errno(),
        }
    }
}

type Result<T> = std::result::Result<T, RequestError>;

/// What [`Server::serve`] did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Answered: this many bytes of reply were written (0: no reply).
    Replied(usize),
    /// A SETLKW that has to wait for a conflicting lock to go. Nothing was written; the caller
    /// keeps the request's reply buffers and answers it with [`Server::wait_reply`] (see
    /// [`crate::waits::LockWaits`]).
    Wait(LockWait),
}

/// A SETLKW request waiting for its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockWait {
    id: WaitId,
    unique: u64,
}

impl LockWait {
    /// The FUSE unique of the waiting request.
    pub fn unique(&self) -> u64 {
        self.unique
    }
}

/// Counters of lock requests, all sessions together.
#[derive(Debug, Default)]
struct LockCounters {
    getlk: AtomicU64,
    setlk: AtomicU64,
    setlkw: AtomicU64,
    waited: AtomicU64,
    interrupted: AtomicU64,
    deadlocks: AtomicU64,
}

/// A snapshot of the server's lock request counters ([`Server::lock_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockStats {
    /// GETLK requests.
    pub getlk: u64,
    /// SETLK requests (POSIX and flock).
    pub setlk: u64,
    /// SETLKW requests (POSIX and flock).
    pub setlkw: u64,
    /// SETLKW requests that had to wait (parked).
    pub waited: u64,
    /// Waiting or arriving SETLKW requests answered `EINTR` because of an INTERRUPT.
    pub interrupted: u64,
    /// SETLKW requests answered `EDEADLK`.
    pub deadlocks: u64,
}

/// Serves FUSE requests for one filesystem. Shareable between poller threads (`Arc<Server<F>>`).
pub struct Server<F: FileSystem> {
    fs: F,
    initialized: AtomicBool,
    /// The `FUSE_INIT` flags of the session (what we answered).
    negotiated: AtomicU64,
    /// The advisory locks of the session.
    locks: LockManager,
    /// The caller parks SETLKW requests that must wait ([`Server::with_lock_waits`]).
    lock_waits: bool,
    counters: LockCounters,
}

impl<F: FileSystem> Server<F> {
    /// A server for `fs`, waiting for INIT, whose caller answers every request at once
    /// ([`Server::handle`]): it does not offer `POSIX_LOCKS` or `FLOCK_LOCKS`, so the guest
    /// kernel keeps its locks itself; lock requests sent anyway are served, and a SETLKW that
    /// would wait fails with `EAGAIN` like SETLK.
    pub fn new(fs: F) -> Self {
        Self::build(fs, false)
    }

    /// A server for `fs` whose caller can keep a request pending: it serves requests through
    /// [`Server::serve`] and parks the SETLKW requests answered [`Served::Wait`] until
    /// [`Server::wait_reply`] has their answer. INIT then offers `POSIX_LOCKS` and
    /// `FLOCK_LOCKS`.
    pub fn with_lock_waits(fs: F) -> Self {
        Self::build(fs, true)
    }

    fn build(fs: F, lock_waits: bool) -> Self {
        Server {
            fs,
            initialized: AtomicBool::new(false),
            negotiated: AtomicU64::new(0),
            locks: LockManager::new(),
            lock_waits,
            counters: LockCounters::default(),
        }
    }

    /// The lock table.
    pub fn locks(&self) -> &LockManager {
        &self.locks
    }

    /// Lock requests served so far.
    pub fn lock_stats(&self) -> LockStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LockStats {
            getlk: get(&c.getlk),
            setlk: get(&c.setlk),
            setlkw: get(&c.setlkw),
            waited: get(&c.waited),
            interrupted: get(&c.interrupted),
            deadlocks: get(&c.deadlocks),
        }
    }

    /// Changes whenever a waiting SETLKW may be answerable ([`LockManager::generation`]).
    #[inline]
    pub fn lock_generation(&self) -> u64 {
        self.locks.generation()
    }

    /// The reply to the waiting request `wait` (a bare `fuse_out_header`: 0, `EINTR` after an
    /// INTERRUPT, `EIO` when the session ended, `ENOLCK`), or `None` while it still waits.
    pub fn wait_reply(&self, wait: &LockWait) -> Option<[u8; OUT_HEADER_SIZE]> {
        let r = self.locks.poll_wait(wait.id)?;
        if r == Err(LockError::Interrupted) {
            self.counters.interrupted.fetch_add(1, Ordering::Relaxed);
        }
        let error = r.err().map_or(0, |e| -e.errno());
        let out = OutHeader { len: OUT_HEADER_SIZE as u32, error, unique: wait.unique };
        let mut bytes = [0u8; OUT_HEADER_SIZE];
        bytes.copy_from_slice(out.as_slice());
        Some(bytes)
    }

    /// The device was reset, so the driver's session is gone even without DESTROY: every lock
    /// goes now (a rebooted guest must not find its old kernel's locks, not even before its
    /// INIT), and waiting requests still registered end. The filesystem's session state stays
    /// until the next INIT (which drops it) or DESTROY.
    pub fn reset(&self) {
        self.locks.end_session();
    }

    /// Drops a waiting request without an answer (the device reset: its buffers are gone).
    pub fn cancel_wait(&self, wait: &LockWait) {
        self.locks.cancel_wait(wait.id);
    }

    /// The `FUSE_INIT` flags of the current session ([`abi::init`]).
    pub fn negotiated(&self) -> u64 {
        self.negotiated.load(Ordering::Acquire)
    }

    /// The filesystem being served.
    pub fn filesystem(&self) -> &F {
        &self.fs
    }

    /// Serve one FUSE request at once. `readable`: the device-readable buffers of the
    /// descriptor chain (`fuse_in_header` + args + payload); `writable`: the device-writable
    /// buffers (`fuse_out_header` + reply). Returns the number of bytes written into `writable`
    /// (0 for requests without a reply: FORGET, BATCH_FORGET, INTERRUPT, and when `writable`
    /// cannot hold even a reply header).
    ///
    /// A SETLKW that would have to wait cannot here: it fails with `EAGAIN` on a server made
    /// with [`Server::new`] (which never offered `POSIX_LOCKS`), and with `ENOLCK` on one made
    /// with [`Server::with_lock_waits`], whose callers use [`Server::serve`].
    pub fn handle(&self, readable: &[VolatileSlice<'_>], writable: &[VolatileSlice<'_>]) -> usize {
        match self.serve_with(readable, writable, None) {
            Served::Replied(n) => n,
            Served::Wait(_) => 0,
        }
    }

    /// Serve one FUSE request, as [`Server::handle`] does, except that a SETLKW that has to wait
    /// (on a server made with [`Server::with_lock_waits`]) is left pending: [`Served::Wait`].
    pub fn serve(&self, readable: &[VolatileSlice<'_>], writable: &[VolatileSlice<'_>]) -> Served {
        let mut parked = None;
        self.serve_with(readable, writable, Some(&mut parked))
    }

    fn serve_with(
        &self,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
        mut park: Option<&mut Option<LockWait>>,
    ) -> Served {
        let mut r = Reader::new(readable);
        let actual = r.bytes_left();
        let hdr: InHeader = match r.read_obj() {
            Ok(h) => h,
            Err(e) => {
                log::debug!("fuse: request without header: {e}");
                return Served::Replied(reply_error(writable, 0, libc::EINVAL));
            }
        };
        let ctx = Context { uid: hdr.uid, gid: hdr.gid, pid: hdr.pid, supp_gid: None };
        match self.dispatch(&hdr, &ctx, actual, r, Writer::new(writable), park.as_deref_mut()) {
            Ok(n) => match park.and_then(Option::take) {
                Some(wait) => Served::Wait(wait),
                None => Served::Replied(n),
            },
            Err(e) => {
                if is_no_reply(hdr.opcode) {
                    return Served::Replied(0);
                }
                log::trace!("fuse: opcode {} unique {} failed: {e}", hdr.opcode, hdr.unique);
                Served::Replied(reply_error(writable, hdr.unique, e.errno()))
            }
        }
    }

    fn dispatch(
        &self,
        hdr: &InHeader,
        ctx: &Context,
        actual: usize,
        mut r: Reader<'_>,
        w: Writer<'_>,
        park: Option<&mut Option<LockWait>>,
    ) -> Result<usize> {
        if hdr.len as usize != actual {
            return Err(RequestError::LengthMismatch { header: hdr.len as usize, actual });
        }
        // Request extensions (supplementary groups, security contexts) trail the arguments.
        let ext = usize::from(hdr.total_extlen) * 8;
        let args_len =
            r.bytes_left().checked_sub(ext).ok_or(RequestError::Extension("longer than the request"))?;
        let with_ext;
        let ctx = if ext == 0 {
            ctx
        } else {
            let mut ext_r = r.clone();
            ext_r.consume(args_len)?;
            with_ext = read_extensions(ctx, ext_r)?;
            &with_ext
        };
        r.truncate(args_len);

        // Requests without a reply never touch the writable buffers.
        match hdr.opcode {
            opcode::FORGET => return self.do_forget(hdr, ctx, r),
            opcode::BATCH_FORGET => return self.do_batch_forget(ctx, r),
            opcode::INTERRUPT => return self.do_interrupt(r),
            _ => {}
        }
        if w.available() < OUT_HEADER_SIZE {
            return Ok(0);
        }
        if hdr.opcode == opcode::INIT {
            return self.do_init(hdr, r, w);
        }
        if !self.initialized.load(Ordering::Acquire) {
            return Err(RequestError::NotInitialized);
        }
        let fs = &self.fs;
        let ino = hdr.nodeid;
        match hdr.opcode {
            opcode::DESTROY => {
                self.initialized.store(false, Ordering::Release);
                self.locks.end_session();
                fs.destroy();
                reply_empty(w, hdr)
            }
            opcode::LOOKUP => {
                let mut buf = NameBuf::new();
                let names = read_names(&mut r, &mut buf)?;
                let (name, _) = split_name(names, false)?;
                check_fits(&w, size_of::<abi::EntryOut>())?;
                let entry = fs.lookup(ctx, ino, name)?;
                reply_entry(w, hdr, &entry)
            }
            opcode::GETATTR => {
                let arg: abi::GetattrIn = r.read_obj()?;
                let fh = (arg.getattr_flags & abi::GETATTR_FH != 0).then_some(arg.fh);
                let (attr, valid) = fs.getattr(ctx, ino, fh)?;
                reply_attr(w, hdr, &attr, valid)
            }
            opcode::SETATTR => {
                let arg: abi::SetattrIn = r.read_obj()?;
                let set = decode_setattr(&arg)?;
                let (attr, valid) = fs.setattr(ctx, ino, &set)?;
                reply_attr(w, hdr, &attr, valid)
            }
            opcode::READLINK => {
                let target = fs.readlink(ctx, ino)?;
                reply_bytes(w, hdr, &target)
            }
            opcode::SYMLINK => {
                let mut buf = NameBuf::new();
                let names = read_names(&mut r, &mut buf)?;
                let (name, rest) = split_name(names, true)?;
                let target =
                    rest.iter().position(|&b| b == 0).map(|n| &rest[..n]).ok_or(RequestError::BadName)?;
                check_fits(&w, size_of::<abi::EntryOut>())?;
                let entry = fs.symlink(ctx, ino, name, target)?;
                reply_entry(w, hdr, &entry)
            }
            opcode::MKNOD => {
                let arg: abi::MknodIn = r.read_obj()?;
                let mut buf = NameBuf::new();
                let (name, _) = split_name(read_names(&mut r, &mut buf)?, true)?;
                check_fits(&w, size_of::<abi::EntryOut>())?;
                let entry = fs.mknod(ctx, ino, name, arg.mode, arg.rdev, arg.umask)?;
                reply_entry(w, hdr, &entry)
            }
            opcode::MKDIR => {
                let arg: abi::MkdirIn = r.read_obj()?;
                let mut buf = NameBuf::new();
                let (name, _) = split_name(read_names(&mut r, &mut buf)?, true)?;
                check_fits(&w, size_of::<abi::EntryOut>())?;
                let entry = fs.mkdir(ctx, ino, name, arg.mode, arg.umask)?;
                reply_entry(w, hdr, &entry)
            }
            opcode::UNLINK | opcode::RMDIR => {
                let mut buf = NameBuf::new();
                let (name, _) = split_name(read_names(&mut r, &mut buf)?, false)?;
                if hdr.opcode == opcode::UNLINK {
                    fs.unlink(ctx, ino, name)?;
                } else {
                    fs.rmdir(ctx, ino, name)?;
                }
                reply_empty(w, hdr)
            }
            opcode::RENAME | opcode::RENAME2 => {
                let (newdir, flags) = if hdr.opcode == opcode::RENAME {
                    let arg: abi::RenameIn = r.read_obj()?;
                    (arg.newdir, 0)
                } else {
                    let arg: abi::Rename2In = r.read_obj()?;
                    (arg.newdir, arg.flags)
                };
                let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE;
                if flags & !known != 0 || flags == known {
                    return Err(RequestError::Invalid);
                }
                let mut buf = NameBuf::new();
                let names = read_names(&mut r, &mut buf)?;
                let (oldname, rest) = split_name(names, false)?;
                let (newname, _) = split_name(rest, true)?;
                fs.rename(ctx, ino, oldname, newdir, newname, flags)?;
                reply_empty(w, hdr)
            }
            opcode::LINK => {
                let arg: abi::LinkIn = r.read_obj()?;
                let mut buf = NameBuf::new();
                let (name, _) = split_name(read_names(&mut r, &mut buf)?, true)?;
                check_fits(&w, size_of::<abi::EntryOut>())?;
                let entry = fs.link(ctx, arg.oldnodeid, ino, name)?;
                reply_entry(w, hdr, &entry)
            }
            opcode::OPEN | opcode::OPENDIR => {
                let arg: abi::OpenIn = r.read_obj()?;
                check_fits(&w, size_of::<abi::OpenOut>())?;
                let opened = if hdr.opcode == opcode::OPEN {
                    fs.open(ctx, ino, arg.flags, arg.open_flags & abi::OPEN_KILL_SUIDGID != 0)?
                } else {
                    fs.opendir(ctx, ino, arg.flags)?
                };
                let out = abi::OpenOut { fh: opened.fh, open_flags: opened.open_flags, backing_id: 0 };
                reply_obj(w, hdr, &out)
            }
            opcode::READ => {
                let arg: abi::ReadIn = r.read_obj()?;
                let (mut hw, mut body) = split_reply(w)?;
                if body.available() < arg.size as usize {
                    return Err(
                        io::Error::ShortWrite { wanted: arg.size as usize, left: body.available() }.into()
                    );
                }
                let mut data = body.split_at(arg.size as usize)?;
                let n = fs.read(ctx, ino, arg.fh, arg.offset, arg.size, &mut data)?;
                finish_reply(&mut hw, hdr, OUT_HEADER_SIZE + n.min(arg.size as usize))
            }
            opcode::WRITE => {
                let arg: abi::WriteIn = r.read_obj()?;
                let size = arg.size as usize;
                if size != r.bytes_left() || arg.size > MAX_WRITE {
                    return Err(RequestError::WriteSize { size, payload: r.bytes_left() });
                }
                check_fits(&w, size_of::<abi::WriteOut>())?;
                let n = fs.write(ctx, ino, arg.fh, arg.offset, arg.size, arg.write_flags, &mut r)?;
                let out =
                    abi::WriteOut { size: u32::try_from(n).unwrap_or(arg.size).min(arg.size), padding: 0 };
                reply_obj(w, hdr, &out)
            }
            opcode::STATFS => {
                let st = fs.statfs(ctx, ino)?;
                let out = abi::StatfsOut {
                    st: abi::Kstatfs {
                        blocks: st.blocks,
                        bfree: st.bfree,
                        bavail: st.bavail,
                        files: st.files,
                        ffree: st.ffree,
                        bsize: st.bsize,
                        namelen: st.namelen,
                        frsize: st.frsize,
                        padding: 0,
                        spare: [0; 6],
                    },
                };
                reply_obj(w, hdr, &out)
            }
            opcode::RELEASE | opcode::RELEASEDIR => {
                let arg: abi::ReleaseIn = r.read_obj()?;
                if hdr.opcode == opcode::RELEASE {
                    fs.release(ctx, ino, arg.fh, arg.flags, arg.lock_owner)?;
                    // The handle's flock lock goes with it, and the OFD locks of the owner the
                    // kernel names (it does, with FLOCK_UNLOCK, for files that used flock).
                    let flock = arg.release_flags & abi::RELEASE_FLOCK_UNLOCK != 0;
                    let owner = (flock || arg.lock_owner != 0).then_some(arg.lock_owner);
                    self.locks.release_handle(ino, arg.fh, owner);
                    if !fs.has_open_handles(ino) {
                        self.locks.clear_file(ino);
                    }
                } else {
                    fs.releasedir(ctx, ino, arg.fh, arg.flags)?;
                }
                reply_empty(w, hdr)
            }
            opcode::FSYNC | opcode::FSYNCDIR => {
                let arg: abi::FsyncIn = r.read_obj()?;
                let datasync = arg.fsync_flags & abi::FSYNC_FDATASYNC != 0;
                if hdr.opcode == opcode::FSYNC {
                    fs.fsync(ctx, ino, arg.fh, datasync)?;
                } else {
                    fs.fsyncdir(ctx, ino, arg.fh, datasync)?;
                }
                reply_empty(w, hdr)
            }
            opcode::FLUSH => {
                let arg: abi::FlushIn = r.read_obj()?;
                let flushed = fs.flush(ctx, ino, arg.fh, arg.lock_owner);
                // Closing any descriptor of a file drops its process's POSIX locks on it, whatever
                // the flush itself says (close(2) does too); not for a handle that does not exist.
                if flushed != Err(filesystem::Error::BadHandle) {
                    self.locks.release_owner(ino, arg.lock_owner);
                }
                flushed?;
                reply_empty(w, hdr)
            }
            opcode::READDIR | opcode::READDIRPLUS => {
                let arg: abi::ReadIn = r.read_obj()?;
                let (mut hw, mut body) = split_reply(w)?;
                let limit = body.available().min(arg.size as usize);
                let mut out = body.split_at(limit)?;
                if hdr.opcode == opcode::READDIR {
                    fs.readdir(ctx, ino, arg.fh, arg.offset, &mut |e| add_dirent(&mut out, &e, None))?;
                } else {
                    fs.readdirplus(ctx, ino, arg.fh, arg.offset, &mut |e, entry| {
                        add_dirent(&mut out, &e, Some(entry))
                    })?;
                }
                let len = OUT_HEADER_SIZE + out.bytes_written();
                finish_reply(&mut hw, hdr, len)
            }
            opcode::ACCESS => {
                let arg: abi::AccessIn = r.read_obj()?;
                fs.access(ctx, ino, arg.mask)?;
                reply_empty(w, hdr)
            }
            opcode::CREATE => {
                let arg: abi::CreateIn = r.read_obj()?;
                let mut buf = NameBuf::new();
                let (name, _) = split_name(read_names(&mut r, &mut buf)?, true)?;
                check_fits(&w, size_of::<abi::EntryOut>() + size_of::<abi::OpenOut>())?;
                let kill = arg.open_flags & abi::OPEN_KILL_SUIDGID != 0;
                let (entry, opened) = fs.create(ctx, ino, name, arg.mode, arg.flags, arg.umask, kill)?;
                reply_created(w, hdr, &entry, &opened)
            }
            opcode::TMPFILE => {
                let arg: abi::CreateIn = r.read_obj()?;
                // The kernel names the new dentry "/"; only the terminator is checked.
                let mut buf = NameBuf::new();
                if !read_names(&mut r, &mut buf)?.contains(&0) {
                    return Err(RequestError::BadName);
                }
                check_fits(&w, size_of::<abi::EntryOut>() + size_of::<abi::OpenOut>())?;
                let (entry, opened) = fs.tmpfile(ctx, ino, arg.mode, arg.flags, arg.umask)?;
                reply_created(w, hdr, &entry, &opened)
            }
            opcode::FALLOCATE => {
                let arg: abi::FallocateIn = r.read_obj()?;
                fs.fallocate(ctx, ino, arg.fh, arg.mode, arg.offset, arg.length)?;
                reply_empty(w, hdr)
            }
            opcode::SETXATTR => {
                let negotiated = self.negotiated();
                let ext = negotiated & abi::init::SETXATTR_EXT != 0;
                let mut arg = abi::SetxattrIn::default();
                let len = if ext { size_of::<abi::SetxattrIn>() } else { abi::COMPAT_SETXATTR_IN_SIZE };
                r.read_exact(&mut arg.as_mut_slice()[..len])?;
                let known = (libc::XATTR_CREATE | libc::XATTR_REPLACE) as u32;
                if arg.flags & !known != 0 || arg.setxattr_flags & !abi::SETXATTR_ACL_KILL_SGID != 0 {
                    return Err(RequestError::Invalid);
                }
                let mut nbuf = [0u8; XATTR_NAME_MAX + 1];
                let name = read_xattr_name(&mut r, &mut nbuf)?;
                let size = arg.size as usize;
                if size > XATTR_SIZE_MAX {
                    return Err(filesystem::Error::TooBig.into());
                }
                if size != r.bytes_left() {
                    return Err(RequestError::Invalid);
                }
                let mut value = Vec::new();
                r.read_to(&mut value, size);
                let acl_kill_sgid = (ext && negotiated & abi::init::POSIX_ACL != 0)
                    .then_some(arg.setxattr_flags & abi::SETXATTR_ACL_KILL_SGID != 0);
                fs.setxattr(ctx, ino, name, &value, arg.flags, acl_kill_sgid)?;
                reply_empty(w, hdr)
            }
            opcode::GETXATTR => {
                let arg: abi::GetxattrIn = r.read_obj()?;
                let mut nbuf = [0u8; XATTR_NAME_MAX + 1];
                let name = read_xattr_name(&mut r, &mut nbuf)?;
                let reply = fs.getxattr(ctx, ino, name, arg.size)?;
                reply_xattr(w, hdr, reply, arg.size)
            }
            opcode::LISTXATTR => {
                let arg: abi::GetxattrIn = r.read_obj()?;
                let reply = fs.listxattr(ctx, ino, arg.size)?;
                reply_xattr(w, hdr, reply, arg.size)
            }
            opcode::REMOVEXATTR => {
                let mut nbuf = [0u8; XATTR_NAME_MAX + 1];
                let name = read_xattr_name(&mut r, &mut nbuf)?;
                fs.removexattr(ctx, ino, name)?;
                reply_empty(w, hdr)
            }
            opcode::GETLK | opcode::SETLK | opcode::SETLKW => {
                let arg: abi::LkIn = r.read_obj()?;
                self.do_lock(hdr, ctx, &arg, w, park)
            }
            opcode::LSEEK => {
                let arg: abi::LseekIn = r.read_obj()?;
                let offset = fs.lseek(ctx, ino, arg.fh, arg.offset, arg.whence)?;
                reply_obj(w, hdr, &abi::LseekOut { offset })
            }
            opcode::COPY_FILE_RANGE => {
                let arg: abi::CopyFileRangeIn = r.read_obj()?;
                check_fits(&w, size_of::<abi::WriteOut>())?;
                // Ranges that wrap are refused before the length is capped to what a reply holds.
                if arg.off_in.checked_add(arg.len).is_none() || arg.off_out.checked_add(arg.len).is_none() {
                    return Err(filesystem::Error::Overflow.into());
                }
                let len = arg.len.min(MAX_COPY_REPLY);
                let n = fs.copy_file_range(
                    ctx,
                    ino,
                    arg.fh_in,
                    arg.off_in,
                    arg.nodeid_out,
                    arg.fh_out,
                    arg.off_out,
                    len,
                    arg.flags,
                )?;
                // Never more than asked, so it fits 32 bits.
                let size = u32::try_from((n as u64).min(len)).unwrap_or(u32::MAX);
                reply_obj(w, hdr, &abi::WriteOut { size, padding: 0 })
            }
            opcode::SYNCFS => {
                let _arg: abi::SyncfsIn = r.read_obj()?;
                fs.syncfs(ctx, ino)?;
                reply_empty(w, hdr)
            }
            opcode::STATX => {
                let arg: abi::StatxIn = r.read_obj()?;
                let fh = (arg.getattr_flags & abi::GETATTR_FH != 0).then_some(arg.fh);
                let (st, valid) = fs.statx(ctx, ino, fh)?;
                let out = abi::StatxOut {
                    attr_valid: valid.as_secs(),
                    attr_valid_nsec: valid.subsec_nanos(),
                    flags: 0,
                    spare: [0; 2],
                    stat: to_statx(&st),
                };
                reply_obj(w, hdr, &out)
            }
            other => Err(RequestError::Opcode(other)),
        }
    }

    fn do_init(&self, hdr: &InHeader, mut r: Reader<'_>, w: Writer<'_>) -> Result<usize> {
        let arg: abi::InitInCompat = r.read_obj()?;
        if arg.major != abi::KERNEL_VERSION || arg.minor < abi::MIN_KERNEL_MINOR_VERSION {
            if arg.major > abi::KERNEL_VERSION {
                // The kernel retries with our major version when we answer with it.
                let out = abi::InitOut {
                    major: abi::KERNEL_VERSION,
                    minor: abi::KERNEL_MINOR_VERSION,
                    ..Default::default()
                };
                return reply_obj(w, hdr, &out);
            }
            return Err(RequestError::Protocol { major: arg.major, minor: arg.minor });
        }
        let mut offered = u64::from(arg.flags);
        if offered & abi::init::INIT_EXT != 0 {
            // Since 7.36 the rest of fuse_init_in follows; it carries the upper 32 flag bits.
            let ext: abi::InitInExt = r.read_obj()?;
            offered |= u64::from(ext.flags2) << 32;
        }
        // Kernels before 7.23 expect the short reply.
        let len = if arg.minor < 23 { abi::COMPAT_22_INIT_OUT_SIZE } else { size_of::<abi::InitOut>() };
        check_fits(&w, len)?;
        if self.initialized.swap(false, Ordering::AcqRel) {
            // A new session without DESTROY (guest reset): the old one's references are gone.
            self.fs.destroy();
        }
        // A rebooted guest must not find its old kernel's locks (nor its waiters).
        self.locks.end_session();
        let supported =
            if self.lock_waits { SUPPORTED_INIT_FLAGS } else { SUPPORTED_INIT_FLAGS & !LOCK_FLAGS };
        let wanted = self.fs.init(offered & supported)? & offered & supported;
        let mut flags = wanted;
        if offered & abi::init::MAX_PAGES != 0 {
            flags |= abi::init::MAX_PAGES;
        }
        if offered & abi::init::INIT_EXT != 0 {
            flags |= abi::init::INIT_EXT;
        }
        let out = abi::InitOut {
            major: abi::KERNEL_VERSION,
            minor: abi::KERNEL_MINOR_VERSION,
            max_readahead: arg.max_readahead,
            flags: flags as u32,
            // As virtiofsd: no limit of ours on background requests (async reads and direct I/O);
            // the kernel keeps at most this many in flight and queues the rest itself. 64 would
            // keep a 128-entry ring from ever filling, hiding the queue-full path of the guest.
            max_background: u16::MAX,
            congestion_threshold: u16::MAX / 4 * 3,
            max_write: MAX_WRITE,
            time_gran: 1,
            max_pages: if flags & abi::init::MAX_PAGES != 0 { MAX_PAGES } else { 0 },
            map_alignment: 0,
            flags2: (flags >> 32) as u32,
            max_stack_depth: 0,
            unused: [0; 6],
        };
        let (mut hw, mut body) = split_reply(w)?;
        body.write_all(&out.as_slice()[..len])?;
        let n = finish_reply(&mut hw, hdr, OUT_HEADER_SIZE + len)?;
        self.negotiated.store(flags, Ordering::Release);
        self.initialized.store(true, Ordering::Release);
        log::debug!("fuse: session up: kernel {}.{}, flags {:#x}", arg.major, arg.minor, flags);
        Ok(n)
    }

    /// INTERRUPT: a waiting SETLKW it names is answered `EINTR` by its poller; one not seen yet
    /// is remembered, and answered `EINTR` if it arrives and has to wait. No reply: Linux's
    /// virtio-fs driver reads none on the hiprio queue (and sends no INTERRUPT at all so far),
    /// so the `EAGAIN` "send it again later" answer of `/dev/fuse` servers has no reader here.
    fn do_interrupt(&self, mut r: Reader<'_>) -> Result<usize> {
        let arg: abi::InterruptIn = r.read_obj()?;
        self.locks.interrupt(arg.unique);
        Ok(0)
    }

    /// GETLK, SETLK and SETLKW, POSIX or (`FUSE_LK_FLOCK`) flock. `park`: where to leave a
    /// SETLKW that has to wait, when the caller can keep it pending.
    fn do_lock(
        &self,
        hdr: &InHeader,
        ctx: &Context,
        arg: &abi::LkIn,
        w: Writer<'_>,
        park: Option<&mut Option<LockWait>>,
    ) -> Result<usize> {
        let ino = hdr.nodeid;
        if arg.lk_flags & !abi::LK_FLOCK != 0 {
            return Err(RequestError::Invalid);
        }
        let flock = arg.lk_flags & abi::LK_FLOCK != 0;
        let lock = decode_lock(&arg.lk)?;
        // flock locks are owned by the open file: its handle.
        let kind = if flock { LockKind::Flock { fh: arg.fh } } else { LockKind::Posix { owner: arg.owner } };
        if hdr.opcode == opcode::GETLK {
            self.counters.getlk.fetch_add(1, Ordering::Relaxed);
            if lock.typ == LockType::Unlock || flock {
                return Err(RequestError::Invalid);
            }
            check_fits(&w, size_of::<abi::LkOut>())?;
            self.fs.lock_handle(ctx, ino, arg.fh, LockAccess::Any)?;
            let found = self.locks.test(ino, arg.owner, &lock);
            let out = found.unwrap_or(FileLock { typ: LockType::Unlock, ..lock });
            return reply_obj(w, hdr, &abi::LkOut { lk: encode_lock(&out) });
        }
        let access = match (flock, lock.typ) {
            (true, _) | (false, LockType::Unlock) => LockAccess::Any,
            (false, LockType::Read) => LockAccess::Read,
            (false, LockType::Write) => LockAccess::Write,
        };
        self.fs.lock_handle(ctx, ino, arg.fh, access)?;
        if hdr.opcode == opcode::SETLK || lock.typ == LockType::Unlock {
            self.counters.setlk.fetch_add(u64::from(hdr.opcode == opcode::SETLK), Ordering::Relaxed);
            self.counters.setlkw.fetch_add(u64::from(hdr.opcode == opcode::SETLKW), Ordering::Relaxed);
            self.locks.set(ino, kind, &lock)?;
            return reply_empty(w, hdr);
        }
        self.counters.setlkw.fetch_add(1, Ordering::Relaxed);
        let Some(park) = park.filter(|_| self.lock_waits) else {
            // Nobody can keep this request pending: it cannot wait.
            return match self.locks.set(ino, kind, &lock) {
                Err(LockError::WouldBlock) if self.lock_waits => Err(LockError::NoLocks.into()),
                r => r.map_err(Into::into).and_then(|()| reply_empty(w, hdr)),
            };
        };
        match self.locks.set_or_wait(ino, kind, &lock, hdr.unique) {
            Ok(SetOutcome::Done) => reply_empty(w, hdr),
            Ok(SetOutcome::Wait(id)) => {
                self.counters.waited.fetch_add(1, Ordering::Relaxed);
                *park = Some(LockWait { id, unique: hdr.unique });
                Ok(0)
            }
            Err(e) => {
                match e {
                    LockError::Deadlock => self.counters.deadlocks.fetch_add(1, Ordering::Relaxed),
                    LockError::Interrupted => self.counters.interrupted.fetch_add(1, Ordering::Relaxed),
                    _ => 0,
                };
                Err(e.into())
            }
        }
    }

    fn do_forget(&self, hdr: &InHeader, ctx: &Context, mut r: Reader<'_>) -> Result<usize> {
        let arg: abi::ForgetIn = r.read_obj()?;
        self.fs.forget(ctx, hdr.nodeid, arg.nlookup);
        Ok(0)
    }

    fn do_batch_forget(&self, ctx: &Context, mut r: Reader<'_>) -> Result<usize> {
        let arg: abi::BatchForgetIn = r.read_obj()?;
        // Bounded by the bytes present, whatever `count` claims.
        for _ in 0..arg.count {
            let Ok(one) = r.read_obj::<abi::ForgetOne>() else {
                break;
            };
            self.fs.forget(ctx, one.nodeid, one.nlookup);
        }
        Ok(0)
    }
}

/// The caller's context with what the request extensions in `r` (all of `r`) add to it: the
/// supplementary group of a `FUSE_EXT_GROUPS` extension (the kernel sends one group; only the
/// first is kept). Security contexts (types up to `FUSE_MAX_NR_SECCTX`, sent only with
/// `FUSE_SECURITY_CTX`, which we do not negotiate) and types we do not know are skipped, as a
/// newer kernel's extensions must not break an older server. Malformed extensions (a size that is
/// not a multiple of 8, below the header, or past the end; a group list longer than its
/// extension; two group extensions) are `EINVAL`.
fn read_extensions(ctx: &Context, mut r: Reader<'_>) -> Result<Context> {
    const HEADER: usize = size_of::<abi::ExtHeader>();
    let mut ctx = *ctx;
    let mut groups_seen = false;
    while r.bytes_left() > 0 {
        let h: abi::ExtHeader = r.read_obj().map_err(|_| RequestError::Extension("truncated header"))?;
        let size = h.size as usize;
        if size < HEADER || size & 7 != 0 {
            return Err(RequestError::Extension("bad size"));
        }
        let mut body = r.split_at(size - HEADER).map_err(|_| RequestError::Extension("past the end"))?;
        if h.typ != abi::ext::GROUPS {
            continue;
        }
        if std::mem::replace(&mut groups_seen, true) {
            return Err(RequestError::Extension("two group lists"));
        }
        let n: u32 = body.read_obj().map_err(|_| RequestError::Extension("short group list"))?;
        if n as usize > body.bytes_left() / size_of::<u32>() {
            return Err(RequestError::Extension("group count past the end"));
        }
        if n > 0 {
            ctx.supp_gid = Some(body.read_obj::<u32>()?);
        }
    }
    Ok(ctx)
}

fn is_no_reply(op: u32) -> bool {
    matches!(op, opcode::FORGET | opcode::BATCH_FORGET | opcode::INTERRUPT)
}

/// Stack room for a name section. Nearly every section (one name, two for RENAME) fits the short
/// array, the only part zeroed up front; the long one is zeroed only when needed (zeroing
/// [`NAME_BUF`] bytes per request cost more than the whole of a LOOKUP otherwise).
struct NameBuf {
    short: [u8; SHORT_NAMES],
    long: Option<[u8; NAME_BUF]>,
}

impl NameBuf {
    #[inline]
    fn new() -> Self {
        NameBuf { short: [0; SHORT_NAMES], long: None }
    }
}

/// Copies the rest of the arguments (the name section) into `buf`; at most [`NAME_BUF`] bytes.
fn read_names<'b>(r: &mut Reader<'_>, buf: &'b mut NameBuf) -> Result<&'b [u8]> {
    let n = r.bytes_left();
    let room: &mut [u8] = if n <= SHORT_NAMES {
        &mut buf.short
    } else if n <= NAME_BUF {
        buf.long.insert([0; NAME_BUF])
    } else {
        return Err(RequestError::NameTooLong);
    };
    r.read_exact(&mut room[..n])?;
    Ok(&room[..n])
}

/// Splits the first NUL-terminated name off `bytes` and checks that it is a path component
/// (non-empty, no `/`; when `creating`, also not `.` or `..`).
fn split_name(bytes: &[u8], creating: bool) -> Result<(&[u8], &[u8])> {
    let end = bytes.iter().position(|&b| b == 0).ok_or(RequestError::BadName)?;
    let name = &bytes[..end];
    if name.is_empty() || name.contains(&b'/') || (creating && (name == b"." || name == b"..")) {
        return Err(RequestError::BadName);
    }
    Ok((name, &bytes[end + 1..]))
}

/// Reads a NUL-terminated extended attribute name. Empty names and names longer than
/// [`XATTR_NAME_MAX`] are `ERANGE`, as `setxattr(2)` has it; bytes after the NUL stay unread.
fn read_xattr_name<'b>(r: &mut Reader<'_>, buf: &'b mut [u8; XATTR_NAME_MAX + 1]) -> Result<&'b [u8]> {
    let n = r.bytes_left().min(buf.len());
    r.clone().read_exact(&mut buf[..n])?;
    let Some(end) = buf[..n].iter().position(|&b| b == 0) else {
        return Err(if n == buf.len() {
            filesystem::Error::OutOfRange.into()
        } else {
            RequestError::BadName
        });
    };
    if end == 0 {
        return Err(filesystem::Error::OutOfRange.into());
    }
    r.consume(end + 1)?;
    Ok(&buf[..end])
}

fn decode_lock(lk: &abi::FileLock) -> Result<FileLock> {
    let typ = match i32::try_from(lk.typ) {
        Ok(libc::F_RDLCK) => LockType::Read,
        Ok(libc::F_WRLCK) => LockType::Write,
        Ok(libc::F_UNLCK) => LockType::Unlock,
        _ => return Err(RequestError::Invalid),
    };
    // The kernel's ranges end at OFFSET_MAX ("to the end of the file") at most.
    if lk.start > lk.end || lk.end > OFFSET_MAX {
        return Err(RequestError::Invalid);
    }
    Ok(FileLock { start: lk.start, end: lk.end, typ, pid: lk.pid })
}

fn encode_lock(lock: &FileLock) -> abi::FileLock {
    let typ = match lock.typ {
        LockType::Read => libc::F_RDLCK,
        LockType::Write => libc::F_WRLCK,
        LockType::Unlock => libc::F_UNLCK,
    };
    abi::FileLock { start: lock.start, end: lock.end, typ: typ as u32, pid: lock.pid }
}

fn decode_setattr(arg: &abi::SetattrIn) -> Result<SetAttr> {
    use abi::fattr;
    let v = arg.valid;
    let time = |set: u32, now: u32, sec: u64, nsec: u32| -> Result<Option<SetTime>> {
        if v & set == 0 {
            return Ok(None);
        }
        if v & now != 0 {
            return Ok(Some(SetTime::Now));
        }
        if nsec >= 1_000_000_000 {
            return Err(RequestError::Invalid);
        }
        Ok(Some(SetTime::At(filesystem::Timespec { sec: sec as i64, nsec })))
    };
    let ctime = if v & fattr::CTIME != 0 {
        if arg.ctimensec >= 1_000_000_000 {
            return Err(RequestError::Invalid);
        }
        Some(filesystem::Timespec { sec: arg.ctime as i64, nsec: arg.ctimensec })
    } else {
        None
    };
    Ok(SetAttr {
        mode: (v & fattr::MODE != 0).then_some(arg.mode),
        uid: (v & fattr::UID != 0).then_some(arg.uid),
        gid: (v & fattr::GID != 0).then_some(arg.gid),
        size: (v & fattr::SIZE != 0).then_some(arg.size),
        atime: time(fattr::ATIME, fattr::ATIME_NOW, arg.atime, arg.atimensec)?,
        mtime: time(fattr::MTIME, fattr::MTIME_NOW, arg.mtime, arg.mtimensec)?,
        ctime,
        fh: (v & fattr::FH != 0).then_some(arg.fh),
        kill_suidgid: v & fattr::KILL_SUIDGID != 0,
    })
}

fn to_attr(st: &Stat) -> abi::Attr {
    abi::Attr {
        ino: st.ino,
        size: st.size,
        blocks: st.blocks,
        atime: st.atime.sec as u64,
        mtime: st.mtime.sec as u64,
        ctime: st.ctime.sec as u64,
        atimensec: st.atime.nsec,
        mtimensec: st.mtime.nsec,
        ctimensec: st.ctime.nsec,
        mode: st.mode,
        nlink: st.nlink,
        uid: st.uid,
        gid: st.gid,
        rdev: st.rdev,
        blksize: st.blksize,
        flags: 0,
    }
}

fn sx_time(t: filesystem::Timespec) -> abi::SxTime {
    abi::SxTime { tv_sec: t.sec, tv_nsec: t.nsec, reserved: 0 }
}

fn to_statx(sx: &filesystem::Statx) -> abi::Statx {
    let st = &sx.stat;
    // `rdev` is in the kernel's new_encode_dev() format, like fuse_attr.rdev.
    let major = (st.rdev & 0xfff00) >> 8;
    let minor = (st.rdev & 0xff) | ((st.rdev >> 12) & 0xfff00);
    let mut mask = abi::statx::BASIC_STATS;
    if sx.btime.is_some() {
        mask |= abi::statx::BTIME;
    }
    abi::Statx {
        mask,
        blksize: st.blksize,
        attributes: 0,
        nlink: st.nlink,
        uid: st.uid,
        gid: st.gid,
        mode: st.mode as u16,
        spare0: 0,
        ino: st.ino,
        size: st.size,
        blocks: st.blocks,
        attributes_mask: 0,
        atime: sx_time(st.atime),
        btime: sx_time(sx.btime.unwrap_or_default()),
        ctime: sx_time(st.ctime),
        mtime: sx_time(st.mtime),
        rdev_major: major,
        rdev_minor: minor,
        dev_major: 0,
        dev_minor: 0,
        spare2: [0; 14],
    }
}

fn entry_out(e: &Entry) -> abi::EntryOut {
    abi::EntryOut {
        nodeid: e.ino,
        generation: e.generation,
        entry_valid: e.entry_timeout.as_secs(),
        attr_valid: e.attr_timeout.as_secs(),
        entry_valid_nsec: e.entry_timeout.subsec_nanos(),
        attr_valid_nsec: e.attr_timeout.subsec_nanos(),
        attr: to_attr(&e.attr),
    }
}

/// Serialises one directory entry into `out`; false (nothing written) if it does not fit.
fn add_dirent(out: &mut Writer<'_>, e: &DirEntry<'_>, entry: Option<&Entry>) -> bool {
    let namelen = e.name.len();
    let (fixed, total) = match entry {
        None => (size_of::<abi::Dirent>(), abi::dirent_size(namelen)),
        Some(_) => (size_of::<abi::DirentPlus>(), abi::direntplus_size(namelen)),
    };
    if namelen == 0 || namelen > abi::FUSE_NAME_MAX || total > out.available() {
        return false;
    }
    let dirent = abi::Dirent { ino: e.ino, off: e.offset, namelen: namelen as u32, typ: e.typ };
    let res = match entry {
        None => out.write_obj(&dirent),
        Some(entry) => out.write_obj(&abi::DirentPlus { entry_out: entry_out(entry), dirent }),
    };
    res.and_then(|_| out.write_all(e.name)).and_then(|_| out.write_zeros(total - fixed - namelen)).is_ok()
}

fn check_fits(w: &Writer<'_>, body: usize) -> Result<()> {
    let wanted = OUT_HEADER_SIZE + body;
    if w.available() < wanted {
        return Err(io::Error::ShortWrite { wanted, left: w.available() }.into());
    }
    Ok(())
}

/// Splits a reply buffer into the header part and the body part.
fn split_reply(mut w: Writer<'_>) -> Result<(Writer<'_>, Writer<'_>)> {
    let hw = w.split_at(OUT_HEADER_SIZE)?;
    Ok((hw, w))
}

fn finish_reply(hw: &mut Writer<'_>, hdr: &InHeader, len: usize) -> Result<usize> {
    let out = OutHeader { len: len as u32, error: 0, unique: hdr.unique };
    hw.write_obj(&out)?;
    Ok(len)
}

fn reply_obj<T: ByteValued>(mut w: Writer<'_>, hdr: &InHeader, body: &T) -> Result<usize> {
    // Header first: the body's size is known, and once both fit neither write can fail.
    check_fits(&w, size_of::<T>())?;
    let len = OUT_HEADER_SIZE + size_of::<T>();
    w.write_obj(&OutHeader { len: len as u32, error: 0, unique: hdr.unique })?;
    w.write_obj(body)?;
    Ok(len)
}

fn reply_bytes(mut w: Writer<'_>, hdr: &InHeader, body: &[u8]) -> Result<usize> {
    check_fits(&w, body.len())?;
    let len = OUT_HEADER_SIZE + body.len();
    w.write_obj(&OutHeader { len: len as u32, error: 0, unique: hdr.unique })?;
    w.write_all(body)?;
    Ok(len)
}

fn reply_empty(mut w: Writer<'_>, hdr: &InHeader) -> Result<usize> {
    check_fits(&w, 0)?;
    w.write_obj(&OutHeader { len: OUT_HEADER_SIZE as u32, error: 0, unique: hdr.unique })?;
    Ok(OUT_HEADER_SIZE)
}

fn reply_entry(w: Writer<'_>, hdr: &InHeader, entry: &Entry) -> Result<usize> {
    reply_obj(w, hdr, &entry_out(entry))
}

/// The CREATE and TMPFILE reply: an entry and a handle (the caller checked that it fits).
fn reply_created(w: Writer<'_>, hdr: &InHeader, entry: &Entry, opened: &Opened) -> Result<usize> {
    let (mut hw, mut body) = split_reply(w)?;
    body.write_obj(&entry_out(entry))?;
    body.write_obj(&abi::OpenOut { fh: opened.fh, open_flags: opened.open_flags, backing_id: 0 })?;
    finish_reply(&mut hw, hdr, body.bytes_written())
}

fn reply_xattr(w: Writer<'_>, hdr: &InHeader, reply: XattrReply, size: u32) -> Result<usize> {
    match reply {
        XattrReply::Size(n) => reply_obj(w, hdr, &abi::GetxattrOut { size: n, padding: 0 }),
        XattrReply::Data(v) if v.len() > size as usize => Err(filesystem::Error::OutOfRange.into()),
        XattrReply::Data(v) => reply_bytes(w, hdr, &v),
    }
}

fn reply_attr(w: Writer<'_>, hdr: &InHeader, attr: &Stat, valid: Duration) -> Result<usize> {
    let out = abi::AttrOut {
        attr_valid: valid.as_secs(),
        attr_valid_nsec: valid.subsec_nanos(),
        dummy: 0,
        attr: to_attr(attr),
    };
    reply_obj(w, hdr, &out)
}

/// Writes an error reply at the start of `writable`; 0 if not even a header fits.
fn reply_error(writable: &[VolatileSlice<'_>], unique: u64, errno: i32) -> usize {
    let mut w = Writer::new(writable);
    let out = OutHeader { len: OUT_HEADER_SIZE as u32, error: -errno, unique };
    match w.write_obj(&out) {
        Ok(()) => OUT_HEADER_SIZE,
        Err(_) => 0,
    }
}
