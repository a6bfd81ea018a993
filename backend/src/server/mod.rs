//! The FUSE server: takes one request from a descriptor chain's buffers, decodes it
//! ([`crate::request`]), executes it (the session's own operations in this file, the
//! filesystem's in `dispatch.rs`, one method per operation, or on the filesystem's per-poller
//! engine through [`PollerEngine`], `engine.rs`), and encodes the typed reply (`reply.rs`).
//!
//! The guest is untrusted: the decoder checks every length and argument, and every failure
//! becomes an errno in the reply header rather than a panic. Operations that hand the kernel a
//! reference (an entry or a handle) first check that the reply will fit, so a too-small reply
//! buffer cannot leak a lookup count or a handle.

mod dispatch;
mod engine;
mod replay;
mod reply;
pub mod waits;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use vm_memory::{ByteValued, VolatileSlice};

use crate::abi::{self, InHeader, OutHeader};
pub use crate::filesystem::DirentWriter;
use crate::filesystem::{self, FileLock, FileSystem, LockAccess, LockType, Reply};
use crate::io::Writer;
use crate::locks::{LockError, LockKind, LockManager, SetOutcome, WaitId};
pub use crate::request::RequestError;
use crate::request::{InitArgs, LockOp, LockRequest, Op, ReadArgs, Request};
use crate::session_record::SessionRecord;
use dispatch::Dispatch;
use dispatch::Post;
pub use engine::{PollerEngine, Status, Submitted};
use replay::ReplayCounters;
pub use replay::ReplayStats;
use reply::{check_fits, encode, reply_error, reply_obj, split_reply, OUT_HEADER_SIZE};

/// `max_pages` advertised (moved to [`abi::limits`]).
pub use crate::abi::limits::MAX_PAGES;
/// Largest WRITE payload (moved to [`abi::limits`]).
pub use crate::abi::limits::MAX_WRITE;
/// Longest extended attribute name (moved to [`abi::limits`]).
pub use crate::abi::limits::XATTR_NAME_MAX;
/// Largest extended attribute value (moved to [`abi::limits`]).
pub use crate::abi::limits::XATTR_SIZE_MAX;

/// INIT flags we can honour when the kernel offers them (the filesystem then picks; see
/// [`FileSystem::init`]).
///
/// `WRITEBACK_CACHE` is offered only with [`ServerOptions::writeback`] and only to a kernel that
/// also offers `HANDLE_KILLPRIV_V2` (see [`Server`]'s INIT): the kernel then keeps dirty pages,
/// owns the size and mtime/ctime (pushed back as SETATTR with explicit times from whichever task
/// flushes) and writes pages back without the writer's identity; with `HANDLE_KILLPRIV_V2` it
/// sends the writes that must clear set-user-id through (in the writer's name, with
/// `FUSE_WRITE_KILL_SUIDGID`), so a written-back page never has to. A filesystem that accepts
/// `WRITEBACK_CACHE` (the default [`FileSystem::init`] refuses it) must accept
/// `HANDLE_KILLPRIV_V2` too, let a handle opened write-only be read (the kernel reads the rest of
/// a partly written page), leave `O_APPEND` to the kernel, and let whoever may write a file set
/// its times (DESIGN.md, "Writeback caching").
///
/// Left out on purpose:
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
    | LOCK_FLAGS
    // With `ServerOptions::writeback` only (see above).
    | abi::init::WRITEBACK_CACHE;

/// Advisory locks, kept by the server for every backend ([`crate::locks`]): `POSIX_LOCKS`
/// (fcntl record locks and OFD locks: GETLK, SETLK, SETLKW) and `FLOCK_LOCKS` (`flock(2)` as
/// SETLK/SETLKW with `FUSE_LK_FLOCK`). Offered only by a server made with
/// [`Server::with_lock_waits`], whose caller parks the SETLKW requests that must wait
/// ([`PollerEngine::submit`] answers them [`Submitted::Wait`]) and answers them later from a poller's
/// engine (see [`crate::server::waits`]); waiting never blocks a thread. Without them the guest kernel
/// keeps both kinds itself, which is exact for the single guest a device serves; the locks are
/// in-process either way, so host processes never see them (DESIGN.md, "FUSE semantics"),
/// unless the filesystem keeps them ([`FileSystem::remote_locks`]: NFSv4.1's server).
/// Linux's virtio-fs sends no FUSE_INTERRUPT, so a guest process waiting in F_SETLKW on the
/// device is woken by the grant only, not by a signal (DESIGN.md, "FUSE semantics").
const LOCK_FLAGS: u64 = abi::init::POSIX_LOCKS | abi::init::FLOCK_LOCKS;

type Result<T> = std::result::Result<T, RequestError>;

/// What the server's session did with a request ([`PollerEngine`] drives it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Answered: this many bytes of reply were written (0: no reply).
    Replied(usize),
    /// A SETLKW that has to wait for a conflicting lock to go. Nothing was written; the caller
    /// keeps the request's reply buffers and answers it with [`Server::wait_reply`] (see
    /// [`crate::server::waits::LockWaits`]).
    Wait(LockWait),
}

/// A SETLKW request waiting for its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockWait {
    id: WaitRef,
    unique: u64,
}

/// Where a waiting SETLKW waits: in the device's lock table, or in the filesystem's
/// ([`FileSystem::remote_locks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WaitRef {
    Local(WaitId),
    Remote(u64),
}

/// The bit of a wait token that says the filesystem keeps the wait.
const REMOTE_TOKEN: u64 = 1 << 63;

impl LockWait {
    /// The FUSE unique of the waiting request.
    pub fn unique(&self) -> u64 {
        self.unique
    }

    /// Its wait id in the lock table, or the filesystem's with the top bit set (what a
    /// process that takes the session over finds it by: [`Server::resume_wait`]).
    pub fn token(&self) -> u64 {
        match self.id {
            WaitRef::Local(id) => id.get(),
            WaitRef::Remote(id) => id | REMOTE_TOKEN,
        }
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

/// A snapshot of the server's lock request counters ([`Server::lock_stats`]); serialisable, for
/// the daemon's statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// What the server offers whatever the filesystem can do (virtiofsd's `--xattr` and
/// `--readdirplus` options). The default offers everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ServerOptions {
    /// Serve SETXATTR, GETXATTR, LISTXATTR and REMOVEXATTR. Off: they are answered `ENOSYS`
    /// without reaching the filesystem (the guest kernel then stops sending them and its
    /// callers get `EOPNOTSUPP`), and `POSIX_ACL` and `SETXATTR_EXT` are not offered (ACLs are
    /// extended attributes).
    pub xattr: bool,
    /// Offer `DO_READDIRPLUS` and `READDIRPLUS_AUTO` at INIT. Off: the guest lists directories
    /// with READDIR and looks each entry up on its own.
    pub readdirplus: bool,
    /// Offer `WRITEBACK_CACHE` at INIT (virtiofsd's `--writeback`): the guest kernel keeps
    /// written data in its page cache and writes it back later, in large requests. Off by
    /// default, as in virtiofsd: a crash of the guest loses what it had not written back, and
    /// the host sees the data, size and times only once they are.
    pub writeback: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions { xattr: true, readdirplus: true, writeback: false }
    }
}

impl ServerOptions {
    /// The INIT flags these options leave out.
    fn withheld_init_flags(&self) -> u64 {
        let mut flags = 0;
        if !self.xattr {
            flags |= abi::init::POSIX_ACL | abi::init::SETXATTR_EXT;
        }
        if !self.readdirplus {
            flags |= abi::init::DO_READDIRPLUS | abi::init::READDIRPLUS_AUTO;
        }
        if !self.writeback {
            flags |= abi::init::WRITEBACK_CACHE;
        }
        flags
    }
}

/// The format version of [`SessionState`] this firmware writes and reads.
pub const SESSION_STATE_VERSION: u32 = 1;

/// A FUSE session as data ([`Server::save_session`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionState {
    /// [`SESSION_STATE_VERSION`] when written.
    pub version: u32,
    /// INIT was done.
    pub initialized: bool,
    /// The INIT flags answered.
    pub negotiated: u64,
    /// Every lock held.
    pub locks: Vec<crate::locks::FileLocksState>,
    /// Every SETLKW waiting (their descriptor chains move with the device's state).
    #[serde(default)]
    pub waits: crate::locks::WaitsState,
}

/// Serves FUSE requests for one filesystem. Shareable between poller threads (`Arc<Server<F>>`).
pub struct Server<F: FileSystem> {
    fs: F,
    options: ServerOptions,
    initialized: AtomicBool,
    /// The `FUSE_INIT` flags of the session (what we answered).
    negotiated: AtomicU64,
    /// The advisory locks of the session.
    locks: LockManager,
    /// The caller parks SETLKW requests that must wait ([`Server::with_lock_waits`]).
    lock_waits: bool,
    counters: LockCounters,
    /// Requests executed again after a crash ([`replay`]).
    replays: ReplayCounters,
    /// Where the session is kept for a crash ([`Server::keep_session`]).
    record: OnceLock<Arc<SessionRecord>>,
    /// The session last written to `record` held no lock (RELEASE and FLUSH, which can only
    /// take locks away, then need not write it while the table is empty).
    recorded_no_locks: AtomicBool,
}

impl<F: FileSystem> Server<F> {
    /// A server for `fs`, waiting for INIT, whose callers answer every request at once
    /// ([`PollerEngine::synchronous`]): it does not offer `POSIX_LOCKS` or `FLOCK_LOCKS`, so the guest
    /// kernel keeps its locks itself; lock requests sent anyway are served, and a SETLKW that
    /// would wait fails with `EAGAIN` like SETLK.
    pub fn new(fs: F) -> Self {
        Self::build(fs, false)
    }

    /// A server for `fs` whose callers can keep a request pending: their [`PollerEngine`]s park
    /// the SETLKW requests that must wait ([`Submitted::Wait`]) until [`Server::wait_reply`] has
    /// their answer. INIT then offers `POSIX_LOCKS` and
    /// `FLOCK_LOCKS`.
    pub fn with_lock_waits(fs: F) -> Self {
        Self::build(fs, true)
    }

    fn build(fs: F, lock_waits: bool) -> Self {
        Server {
            fs,
            options: ServerOptions::default(),
            initialized: AtomicBool::new(false),
            negotiated: AtomicU64::new(0),
            locks: LockManager::new(),
            lock_waits,
            counters: LockCounters::default(),
            replays: ReplayCounters::default(),
            record: OnceLock::new(),
            recorded_no_locks: AtomicBool::new(false),
        }
    }

    /// The same server with `options` (before it serves anything).
    pub fn with_options(mut self, options: ServerOptions) -> Self {
        self.options = options;
        self
    }

    /// What the server offers ([`ServerOptions`]).
    pub fn options(&self) -> ServerOptions {
        self.options
    }

    /// The lock table.
    pub fn locks(&self) -> &LockManager {
        &self.locks
    }

    /// The FUSE session as data (issue 22: a process that takes it over): whether INIT was
    /// done, the flags it answered, every lock held and every SETLKW waiting. The filesystem's
    /// own state is the filesystem's to give.
    pub fn save_session(&self) -> SessionState {
        let (locks, waits) = self.locks.save();
        SessionState {
            version: SESSION_STATE_VERSION,
            initialized: self.initialized.load(Ordering::Acquire),
            negotiated: self.negotiated.load(Ordering::Acquire),
            locks,
            waits,
        }
    }

    /// Keeps the session in `record` from now on (crash recovery, issue 24: a process started
    /// after this one is killed serves it on): written now, then whenever INIT, DESTROY, a
    /// reset or a lock request, a RELEASE or a FLUSH may have changed it, before the request
    /// is answered. SETLKW requests waiting are not in it: their chains are in flight and run
    /// again. A second record is ignored.
    pub fn keep_session(&self, record: Arc<SessionRecord>) {
        let _ = self.record.set(record);
        self.session_changed();
    }

    /// The record the session is kept in, if it is.
    pub fn session_record(&self) -> Option<&Arc<SessionRecord>> {
        self.record.get()
    }

    /// Writes the session to its record, if it has one.
    pub(crate) fn session_changed(&self) {
        let Some(record) = self.record.get() else { return };
        let snapshot = || {
            let mut state = self.save_session();
            state.waits = Default::default();
            self.recorded_no_locks.store(state.locks.is_empty(), Ordering::Release);
            state
        };
        if !record.write_with(snapshot) {
            log::warn!("fuse: the session's locks outgrow its record: a crash would end it");
        }
    }

    /// A RELEASE or FLUSH may have let locks go: the session record is written unless it
    /// holds none and the table has none (the common case: files that were never locked).
    pub(crate) fn locks_may_have_gone(&self) {
        if self.record.get().is_none()
            || (self.recorded_no_locks.load(Ordering::Acquire) && self.locks.lock_count() == 0)
        {
            return;
        }
        self.session_changed();
    }

    /// The waiting SETLKW of wait id `token` (a session taken over: a poller parks it again),
    /// if it still waits.
    pub fn resume_wait(&self, token: u64) -> Option<LockWait> {
        if token & REMOTE_TOKEN != 0 {
            let id = token & !REMOTE_TOKEN;
            let unique = self.fs.remote_locks()?.unique_of(id)?;
            return Some(LockWait { id: WaitRef::Remote(id), unique });
        }
        self.locks.waiter_unique(token).map(|(id, unique)| LockWait { id: WaitRef::Local(id), unique })
    }

    /// Takes over a session saved by [`Self::save_session`] (before this server served
    /// anything): the guest goes on without a new INIT, its locks held.
    pub fn restore_session(&self, state: &SessionState) -> std::result::Result<(), String> {
        if state.version != SESSION_STATE_VERSION {
            return Err(format!(
                "FUSE session state format {}, this firmware reads {SESSION_STATE_VERSION}",
                state.version
            ));
        }
        if self.initialized.load(Ordering::Acquire) {
            return Err("this server's session has begun".into());
        }
        self.locks.restore(&state.locks, &state.waits)?;
        self.negotiated.store(state.negotiated, Ordering::Release);
        self.initialized.store(state.initialized, Ordering::Release);
        Ok(())
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

    /// What the server did with requests executed again after a crash so far
    /// ([`PollerEngine::submit_as`]).
    pub fn replay_stats(&self) -> ReplayStats {
        self.replays.snapshot()
    }

    /// Changes whenever a waiting SETLKW may be answerable ([`LockManager::generation`]).
    #[inline]
    pub fn lock_generation(&self) -> u64 {
        let remote = self.fs.remote_locks().map_or(0, |r| r.generation());
        self.locks.generation().wrapping_add(remote)
    }

    /// The reply to the waiting request `wait` (a bare `fuse_out_header`: 0, `EINTR` after an
    /// INTERRUPT, `EIO` when the session ended, `ENOLCK`), or `None` while it still waits.
    pub fn wait_reply(&self, wait: &LockWait) -> Option<[u8; OUT_HEADER_SIZE]> {
        let errno = match wait.id {
            WaitRef::Local(id) => {
                let r = self.locks.poll_wait(id)?;
                if r.is_ok() {
                    self.session_changed();
                }
                r.err().map_or(0, |e| e.errno())
            }
            WaitRef::Remote(id) => {
                let r = self.fs.remote_locks().map_or(Some(Err(filesystem::Error::Io)), |l| l.poll(id))?;
                r.err().map_or(0, |e| e.errno())
            }
        };
        if errno == libc::EINTR {
            self.counters.interrupted.fetch_add(1, Ordering::Relaxed);
        }
        let error = -errno;
        let out = OutHeader { len: OUT_HEADER_SIZE as u32, error, unique: wait.unique };
        let mut bytes = [0u8; OUT_HEADER_SIZE];
        bytes.copy_from_slice(out.as_slice());
        Some(bytes)
    }

    /// The device was reset, so the driver's session is gone even without DESTROY: every lock
    /// goes now (a rebooted guest must not find its old kernel's locks, not even before its
    /// INIT), and waiting requests still registered end; so do the locks a filesystem keeps
    /// elsewhere ([`FileSystem::device_reset`]: NFSv4.1's server). The filesystem's session
    /// state stays until the next INIT (which drops it) or DESTROY.
    pub fn reset(&self) {
        self.locks.end_session();
        self.fs.device_reset();
        self.session_changed();
    }

    /// Replies are about to be published ([`FileSystem::before_publish`]).
    pub fn before_publish(&self) {
        self.fs.before_publish();
    }

    /// Whether [`Self::before_publish`] has something to do ([`FileSystem::publish_due`]).
    pub fn publish_due(&self) -> bool {
        self.fs.publish_due()
    }

    /// Drops a waiting request without an answer (the device reset: its buffers are gone).
    pub fn cancel_wait(&self, wait: &LockWait) {
        match wait.id {
            WaitRef::Local(id) => self.locks.cancel_wait(id),
            WaitRef::Remote(id) => {
                if let Some(r) = self.fs.remote_locks() {
                    r.cancel(id);
                }
            }
        }
    }

    /// The `FUSE_INIT` flags of the current session ([`abi::init`]).
    pub fn negotiated(&self) -> u64 {
        self.negotiated.load(Ordering::Acquire)
    }

    /// The filesystem being served.
    pub fn filesystem(&self) -> &F {
        &self.fs
    }

    pub(crate) fn fail_request(
        &self,
        req: &Request<'_>,
        e: RequestError,
        writable: &[VolatileSlice<'_>],
    ) -> Served {
        if req.is_no_reply() {
            return Served::Replied(0);
        }
        log::trace!("fuse: opcode {} unique {} failed: {e}", req.opcode, req.unique);
        Served::Replied(reply_error(writable, req.unique, e.errno()))
    }

    /// A request that could not be decoded: its error, or `EIO` before INIT (unless the request
    /// is malformed as a whole, or has no reply).
    pub(crate) fn fail(&self, hdr: &InHeader, e: RequestError, writable: &[VolatileSlice<'_>]) -> Served {
        if crate::request::is_no_reply(hdr.opcode) {
            return Served::Replied(0);
        }
        let e = if !e.is_framing()
            && hdr.opcode != abi::opcode::INIT
            && !self.initialized.load(Ordering::Acquire)
        {
            RequestError::NotInitialized
        } else {
            e
        };
        log::trace!("fuse: opcode {} unique {} failed: {e}", hdr.opcode, hdr.unique);
        Served::Replied(reply_error(writable, hdr.unique, e.errno()))
    }

    /// Applies what the filesystem's answer `r` changes in the session and encodes it into `w`
    /// (all of the writable buffers); returns the reply's length.
    #[inline]
    fn finish(
        &self,
        post: Post,
        ino: u64,
        unique: u64,
        r: &filesystem::Result<Reply>,
        w: Writer<'_>,
        limit: u64,
    ) -> Result<usize> {
        self.after(post, ino, r);
        match r {
            Ok(reply) => encode(w, unique, reply, limit),
            Err(e) => Err((*e).into()),
        }
    }

    /// Serves the operations the server answers itself (INIT, DESTROY, FORGET, BATCH_FORGET,
    /// INTERRUPT, locks), and refuses requests before INIT; any other is left to the
    /// filesystem, with its reply buffers (checked to hold what it needs).
    fn session_op<'w>(
        &self,
        req: &mut Request<'_>,
        writable: &'w [VolatileSlice<'w>],
        can_wait: bool,
    ) -> Result<Session<'w>> {
        let (ctx, ino) = (req.ctx, req.nodeid);
        // Requests without a reply never touch the writable buffers.
        match &mut req.op {
            Op::Forget { nlookup } => {
                self.fs.forget(&ctx, ino, *nlookup);
                return Ok(Session::Done(Served::Replied(0)));
            }
            Op::BatchForget { count, forgets } => {
                // Bounded by the bytes present, whatever `count` claims.
                for _ in 0..*count {
                    let Ok(one) = forgets.read_obj::<abi::ForgetOne>() else {
                        break;
                    };
                    self.fs.forget(&ctx, one.nodeid, one.nlookup);
                }
                return Ok(Session::Done(Served::Replied(0)));
            }
            Op::Interrupt { unique } => {
                self.do_interrupt(*unique);
                return Ok(Session::Done(Served::Replied(0)));
            }
            _ => {}
        }
        let w = Writer::new(writable);
        if w.available() < OUT_HEADER_SIZE {
            return Ok(Session::Done(Served::Replied(0)));
        }
        if let Op::Init(args) = &req.op {
            let n = self.do_init(req.unique, args, w);
            self.session_changed();
            return n.map(|n| Session::Done(Served::Replied(n)));
        }
        if !self.initialized.load(Ordering::Acquire) {
            return Err(RequestError::NotInitialized);
        }
        match &req.op {
            Op::Destroy => {
                self.initialized.store(false, Ordering::Release);
                self.locks.end_session();
                self.session_changed();
                self.fs.destroy();
                encode(w, req.unique, &Reply::Empty, 0).map(|n| Session::Done(Served::Replied(n)))
            }
            Op::Lock(lock) if self.fs.remote_locks().is_some() => {
                self.remote_lock(req.unique, &ctx, ino, lock, w, can_wait)
            }
            Op::Lock(lock) => {
                let served = self.do_lock(req.unique, &ctx, ino, lock, w, can_wait);
                self.session_changed();
                served.map(Session::Done)
            }
            Op::Setxattr { .. } | Op::Getxattr { .. } | Op::Listxattr { .. } | Op::Removexattr { .. }
                if !self.options.xattr =>
            {
                Err(RequestError::Disabled("extended attributes"))
            }
            op => {
                dispatch::check_room(op, &w)?;
                Ok(Session::Fs(w))
            }
        }
    }

    fn do_init(&self, unique: u64, arg: &InitArgs, w: Writer<'_>) -> Result<usize> {
        if arg.major != abi::KERNEL_VERSION || arg.minor < abi::MIN_KERNEL_MINOR_VERSION {
            if arg.major > abi::KERNEL_VERSION {
                // The kernel retries with our major version when we answer with it.
                let out = abi::InitOut {
                    major: abi::KERNEL_VERSION,
                    minor: abi::KERNEL_MINOR_VERSION,
                    ..Default::default()
                };
                return reply_obj(w, unique, &out);
            }
            return Err(RequestError::Protocol { major: arg.major, minor: arg.minor });
        }
        let offered = arg.flags;
        // Kernels before 7.23 expect the short reply.
        let len =
            if arg.minor < 23 { abi::COMPAT_22_INIT_OUT_SIZE } else { std::mem::size_of::<abi::InitOut>() };
        check_fits(&w, len)?;
        if self.initialized.swap(false, Ordering::AcqRel) {
            // A new session without DESTROY (guest reset): the old one's references are gone.
            self.fs.destroy();
        }
        // A rebooted guest must not find its old kernel's locks (nor its waiters).
        self.locks.end_session();
        let supported =
            if self.lock_waits { SUPPORTED_INIT_FLAGS } else { SUPPORTED_INIT_FLAGS & !LOCK_FLAGS };
        let mut supported = supported & !self.options.withheld_init_flags();
        if offered & abi::init::HANDLE_KILLPRIV_V2 == 0 {
            // Without it a page written back in no one's name could not clear set-user-id.
            supported &= !abi::init::WRITEBACK_CACHE;
        }
        let mut wanted = self.fs.init(offered & supported)? & offered & supported;
        if wanted & abi::init::HANDLE_KILLPRIV_V2 == 0 && wanted & abi::init::WRITEBACK_CACHE != 0 {
            log::warn!("fuse: the filesystem took WRITEBACK_CACHE without HANDLE_KILLPRIV_V2: not offered");
            wanted &= !abi::init::WRITEBACK_CACHE;
        }
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
            max_write: abi::limits::MAX_WRITE,
            time_gran: 1,
            max_pages: if flags & abi::init::MAX_PAGES != 0 { abi::limits::MAX_PAGES } else { 0 },
            map_alignment: 0,
            flags2: (flags >> 32) as u32,
            max_stack_depth: 0,
            unused: [0; 6],
        };
        let (mut hw, mut body) = split_reply(w)?;
        body.write_all(&out.as_slice()[..len])?;
        let n = reply::finish_reply(&mut hw, unique, len)?;
        self.negotiated.store(flags, Ordering::Release);
        self.initialized.store(true, Ordering::Release);
        log::debug!("fuse: session up: kernel {}.{}, flags {:#x}", arg.major, arg.minor, flags);
        Ok(n)
    }

    /// INTERRUPT: a waiting SETLKW it names is answered `EINTR` by its poller; one not seen yet
    /// is remembered, and answered `EINTR` if it arrives and has to wait. No reply: Linux's
    /// virtio-fs driver reads none on the hiprio queue (and sends no INTERRUPT at all so far),
    /// so the `EAGAIN` "send it again later" answer of `/dev/fuse` servers has no reader here.
    fn do_interrupt(&self, unique: u64) {
        self.locks.interrupt(unique);
        if let Some(r) = self.fs.remote_locks() {
            r.interrupt(unique);
        }
    }

    /// GETLK, SETLK and SETLKW, POSIX or (`FUSE_LK_FLOCK`) flock. `can_wait`: the caller can
    /// keep a SETLKW that has to wait pending.
    fn do_lock(
        &self,
        unique: u64,
        ctx: &crate::filesystem::Context,
        ino: u64,
        l: &LockRequest,
        w: Writer<'_>,
        can_wait: bool,
    ) -> Result<Served> {
        let lock = l.lock;
        // flock locks are owned by the open file: its handle.
        let kind = if l.flock { LockKind::Flock { fh: l.fh } } else { LockKind::Posix { owner: l.owner } };
        let c = &self.counters;
        if l.op == LockOp::Get {
            c.getlk.fetch_add(1, Ordering::Relaxed);
            check_fits(&w, std::mem::size_of::<abi::LkOut>())?;
            self.fs.lock_handle(ctx, ino, l.fh, LockAccess::Any)?;
            let found = self.locks.test(ino, l.owner, &lock);
            let out = found.unwrap_or(FileLock { typ: LockType::Unlock, ..lock });
            return encode(w, unique, &Reply::Lock(out), 0).map(Served::Replied);
        }
        let access = match (l.flock, lock.typ) {
            (true, _) | (false, LockType::Unlock) => LockAccess::Any,
            (false, LockType::Read) => LockAccess::Read,
            (false, LockType::Write) => LockAccess::Write,
        };
        self.fs.lock_handle(ctx, ino, l.fh, access)?;
        let set = l.op == LockOp::Set;
        if set || lock.typ == LockType::Unlock {
            c.setlk.fetch_add(u64::from(set), Ordering::Relaxed);
            c.setlkw.fetch_add(u64::from(!set), Ordering::Relaxed);
            self.locks.set(ino, kind, &lock)?;
            return encode(w, unique, &Reply::Empty, 0).map(Served::Replied);
        }
        c.setlkw.fetch_add(1, Ordering::Relaxed);
        if !(can_wait && self.lock_waits) {
            // Nobody can keep this request pending: it cannot wait.
            return match self.locks.set(ino, kind, &lock) {
                Err(LockError::WouldBlock) if self.lock_waits => Err(LockError::NoLocks.into()),
                r => r
                    .map_err(Into::into)
                    .and_then(|()| encode(w, unique, &Reply::Empty, 0).map(Served::Replied)),
            };
        }
        match self.locks.set_or_wait(ino, kind, &lock, unique) {
            Ok(SetOutcome::Done) => encode(w, unique, &Reply::Empty, 0).map(Served::Replied),
            Ok(SetOutcome::Wait(id)) => {
                c.waited.fetch_add(1, Ordering::Relaxed);
                Ok(Served::Wait(LockWait { id: WaitRef::Local(id), unique }))
            }
            Err(e) => {
                match e {
                    LockError::Deadlock => c.deadlocks.fetch_add(1, Ordering::Relaxed),
                    LockError::Interrupted => c.interrupted.fetch_add(1, Ordering::Relaxed),
                    _ => 0,
                };
                Err(e.into())
            }
        }
    }
}

impl<F: FileSystem> Server<F> {
    /// GETLK, SETLK and SETLKW on a filesystem that keeps its locks
    /// ([`FileSystem::remote_locks`]): the handle is checked as for the device's locks; a SETLKW
    /// that sets a lock waits in the filesystem (parked here, answered when its wait ends);
    /// the rest go to the filesystem as any request.
    fn remote_lock<'w>(
        &self,
        unique: u64,
        ctx: &crate::filesystem::Context,
        ino: u64,
        l: &LockRequest,
        w: Writer<'w>,
        can_wait: bool,
    ) -> Result<Session<'w>> {
        let c = &self.counters;
        let access = match (l.op, l.flock, l.lock.typ) {
            (LockOp::Get, ..) | (_, true, _) | (_, false, LockType::Unlock) => LockAccess::Any,
            (_, false, LockType::Read) => LockAccess::Read,
            (_, false, LockType::Write) => LockAccess::Write,
        };
        self.fs.lock_handle(ctx, ino, l.fh, access)?;
        match l.op {
            LockOp::Get => c.getlk.fetch_add(1, Ordering::Relaxed),
            LockOp::Set => c.setlk.fetch_add(1, Ordering::Relaxed),
            LockOp::SetWait => c.setlkw.fetch_add(1, Ordering::Relaxed),
        };
        let Some(remote) = self.fs.remote_locks() else {
            return Err(LockError::NoLocks.into());
        };
        if l.op != LockOp::SetWait || l.lock.typ == LockType::Unlock {
            dispatch::check_room(&Op::Lock(*l), &w)?;
            return Ok(Session::Fs(w));
        }
        if !(can_wait && self.lock_waits) {
            // Nobody can keep this request waiting.
            return Err(LockError::NoLocks.into());
        }
        if self.locks.take_early_interrupt(unique) {
            // Its INTERRUPT came first (another queue, another poller): EINTR, as a SETLKW
            // that would wait in the device's own table ends.
            c.interrupted.fetch_add(1, Ordering::Relaxed);
            return Err(LockError::Interrupted.into());
        }
        let id = remote.wait(ctx, ino, l, unique)?;
        c.waited.fetch_add(1, Ordering::Relaxed);
        Ok(Session::Done(Served::Wait(LockWait { id: WaitRef::Remote(id), unique })))
    }
}

/// What [`Server::session_op`] left: a served request, or the reply buffers of one for the
/// filesystem.
enum Session<'w> {
    Done(Served),
    Fs(Writer<'w>),
}

/// The data part of the reply buffers an operation writes into (after the reply header), and
/// the cap of the count its reply reports ([`reply::encode`]'s `limit`).
#[inline]
fn data_part<'w>(op: &Op<'_>, w: &Writer<'w>) -> Result<(Writer<'w>, u64)> {
    match *op {
        Op::Read(_)
        | Op::Readdir { .. }
        | Op::Readdirplus { .. }
        | Op::Readlink
        | Op::Getxattr { .. }
        | Op::Listxattr { .. } => {}
        Op::Write { args, .. } => return Ok((Writer::new(&[]), u64::from(args.size))),
        Op::CopyFileRange(args) => return Ok((Writer::new(&[]), args.len)),
        _ => return Ok((Writer::new(&[]), 0)),
    }
    let mut body = w.clone();
    body.split_at(OUT_HEADER_SIZE)?;
    let avail = body.available();
    let (len, limit) = match *op {
        Op::Read(ReadArgs { size, .. }) => {
            if avail < size as usize {
                return Err(crate::io::Error::ShortWrite { wanted: size as usize, left: avail }.into());
            }
            (size as usize, u64::from(size))
        }
        Op::Readdir { size, .. } | Op::Readdirplus { size, .. } => {
            let n = avail.min(size as usize);
            (n, n as u64)
        }
        _ => (avail, avail as u64),
    };
    Ok((body.split_at(len)?, limit))
}

/// Serves `req` through `fs`'s synchronous [`FileSystem`] methods, as the server does for a
/// filesystem without an engine or for [`Started::Sync`](crate::filesystem::seam::Started::Sync): for engines that answer some requests
/// from the synchronous methods themselves (after a delay, on another path). Session operations
/// are `EINVAL` here (they never reach an engine).
pub fn serve_sync<F: FileSystem>(
    fs: &F,
    req: &mut Request<'_>,
    data: &mut Writer<'_>,
) -> filesystem::Result<Reply> {
    Dispatch(fs).call(&req.ctx, req.nodeid, &mut req.op, data)
}
