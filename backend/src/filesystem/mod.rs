//! The [`FileSystem`] trait a backend implements, and the plain types its operations exchange.
//!
//! The [`Server`](crate::Server) decodes a FUSE request ([`crate::request`]), calls one method
//! here (or hands the decoded request to the filesystem's per-poller engine, [`FileSystem::engine`]
//! and [`crate::filesystem::seam`], when it has one) and encodes the result, a [`Reply`]; a filesystem never
//! sees wire structs or errnos ([`Error::from_errno`] is the one errno table, both ways). Every method takes `&self` (requests arrive
//! concurrently from several queues) and the caller's [`Context`], and defaults to
//! [`Error::NotImplemented`], which the server answers with `ENOSYS` (for most operations the kernel
//! then stops sending it). Names are raw bytes without the NUL terminator; the server has already
//! checked that they are non-empty and contain no `/` or NUL, and, where a name is being created, that
//! it is not `.` or `..`.

pub(crate) mod dirent;
pub mod seam;

pub use dirent::DirentWriter;

use std::time::Duration;

use crate::io::{Reader, Writer};
pub use crate::request::{
    CopyFileRangeArgs, CreateArgs, FallocateArgs, LockRequest, MknodArgs, ReadArgs, RenameArgs, SetxattrArgs,
    WriteArgs,
};
pub use crate::types::{Context, Error, FileLock, LockType, Result, SetAttr, SetTime, Timespec};

/// Locks a filesystem keeps itself ([`FileSystem::remote_locks`]), with the SETLKW requests
/// that wait for them. A waiting SETLKW is not pending on the filesystem seam (it holds no
/// buffers: the server parks it, [`crate::server::waits`]); the filesystem tries to take its
/// lock in the background as long as it takes, and the server asks how it ended whenever
/// [`RemoteLocks::generation`] moves.
pub trait RemoteLocks: Send + Sync {
    /// SETLKW `unique` for `lock` on `ino` starts waiting; its wait id.
    fn wait(&self, ctx: &Context, ino: u64, lock: &LockRequest, unique: u64) -> Result<u64>;
    /// How wait `id` ended (the lock taken, or why not: `EINTR` after an INTERRUPT), or
    /// `None` while it waits. An ended wait is forgotten once this has said so.
    fn poll(&self, id: u64) -> Option<Result<()>>;
    /// Wait `id` ends without an answer (the device reset: its buffers are gone); a lock taken
    /// for it meanwhile is let go.
    fn cancel(&self, id: u64);
    /// INTERRUPT of request `unique`: a wait of it ends with `EINTR` (whether one did).
    fn interrupt(&self, unique: u64) -> bool;
    /// Moves whenever a wait may have ended (cheap: one atomic load).
    fn generation(&self) -> u64;
    /// The FUSE unique of wait `id`, if it waits here (a session taken over from another
    /// process: its waits are parked again only if the filesystem took them over too).
    fn unique_of(&self, id: u64) -> Option<u64>;
}

/// Attributes of an inode, as `stat(2)` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    /// Inode number (also the FUSE node id).
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Allocated storage, in 512-byte units.
    pub blocks: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last data modification.
    pub mtime: Timespec,
    /// Last status change.
    pub ctime: Timespec,
    /// File type and permission bits (`S_IF*` | mode).
    pub mode: u32,
    /// Number of hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number, for character and block devices.
    pub rdev: u32,
    /// Preferred I/O size.
    pub blksize: u32,
}

/// A name resolved to an inode; the kernel now holds one more lookup reference on `ino`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Entry {
    /// Inode number (0 means "no inode": a negative entry).
    pub ino: u64,
    /// Generation of `ino` (distinguishes reuses of an inode number).
    pub generation: u64,
    /// The inode's attributes.
    pub attr: Stat,
    /// How long the kernel may cache the name -> inode binding.
    pub entry_timeout: Duration,
    /// How long the kernel may cache `attr`.
    pub attr_timeout: Duration,
}

/// How much the guest kernel may cache, as virtiofsd's `--cache` says it: the entry and attribute
/// timeouts a backend puts in its replies and the `FOPEN_*` flags it gives open files.
///
/// - [`Never`](Self::Never): timeouts 0 and `FOPEN_DIRECT_IO` on every open file (no page cache;
///   every `stat`, path walk and read goes to the device). For a share that the host changes under
///   the guest all the time.
/// - [`Auto`](Self::Auto): timeouts of one second, page cache dropped on open when the file
///   changed. The passthrough's default: the host may change the directory too, and a guest sees
///   that within a second.
/// - [`Always`](Self::Always): timeouts of a day, `FOPEN_KEEP_CACHE` on files and
///   `FOPEN_CACHE_DIR` on directories. The RAM filesystem's default: only the guest changes it, and
///   the guest kernel invalidates what its own operations change, so nothing it caches goes stale.
///
/// With timeouts of 0 the kernel also refreshes the attributes before every read
/// (`fuse_cache_read_iter` under `AUTO_INVAL_DATA`), so a 4 KiB read costs two round trips
/// (GETATTR + READ); with `Auto` or `Always` it costs one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CachePolicy {
    /// No caching in the guest.
    Never,
    /// Cache for a second.
    #[default]
    Auto,
    /// Cache for a day and keep the page cache across opens.
    Always,
}

impl CachePolicy {
    /// How long the kernel may keep a name -> inode binding (and attributes).
    pub fn timeout(self) -> Duration {
        match self {
            CachePolicy::Never => Duration::ZERO,
            CachePolicy::Auto => Duration::from_secs(1),
            CachePolicy::Always => Duration::from_secs(86_400),
        }
    }

    /// `FOPEN_*` flags for a regular file opened (or created) under this policy.
    pub fn file_open_flags(self) -> u32 {
        match self {
            CachePolicy::Never => crate::abi::fopen::DIRECT_IO,
            CachePolicy::Auto => 0,
            CachePolicy::Always => crate::abi::fopen::KEEP_CACHE,
        }
    }

    /// `FOPEN_*` flags for a directory opened under this policy.
    pub fn dir_open_flags(self) -> u32 {
        match self {
            CachePolicy::Always => crate::abi::fopen::CACHE_DIR,
            CachePolicy::Never | CachePolicy::Auto => 0,
        }
    }
}

impl std::str::FromStr for CachePolicy {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "never" => Ok(CachePolicy::Never),
            "auto" => Ok(CachePolicy::Auto),
            "always" => Ok(CachePolicy::Always),
            _ => Err(format!("unknown cache policy {s:?} (never, auto or always)")),
        }
    }
}

impl std::fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CachePolicy::Never => "never",
            CachePolicy::Auto => "auto",
            CachePolicy::Always => "always",
        })
    }
}

/// A new file or directory handle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Opened {
    /// Handle the kernel passes back in later requests.
    pub fh: u64,
    /// `FOPEN_*` flags for the kernel (see [`crate::abi::fopen`]).
    pub open_flags: u32,
}

/// Filesystem statistics, as `statfs(2)` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatFs {
    /// Total data blocks, in `frsize` units.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks available to unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name component.
    pub namelen: u32,
    /// Fragment size.
    pub frsize: u32,
}

/// One directory entry handed to a READDIR sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// Inode number.
    pub ino: u64,
    /// Offset to pass to the next READDIR to continue after this entry.
    pub offset: u64,
    /// File type (`DT_*`, i.e. `S_IF* >> 12`).
    pub typ: u32,
    /// Name, without NUL.
    pub name: &'a [u8],
}

/// The answer to GETXATTR or LISTXATTR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrReply {
    /// The caller asked for the size only (size 0): the value (or list) is this long.
    Size(u32),
    /// The value (or the list of NUL-terminated names), which fits the caller's size.
    Data(Vec<u8>),
}

/// The typed answer to a request, which the server encodes into the request's reply buffers
/// (the FUSE encoding stays in the server). The server produces it from the synchronous
/// [`FileSystem`] methods; a filesystem's per-poller engine hands it over when it finishes a
/// request ([`crate::filesystem::seam`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Success without a body (UNLINK, RENAME, FSYNC, RELEASE, SETXATTR, ...).
    Empty,
    /// A name resolved or created (LOOKUP, MKNOD, MKDIR, SYMLINK, LINK): the kernel holds one
    /// more lookup reference on it.
    Entry(Entry),
    /// Attributes and how long they may be cached (GETATTR, SETATTR).
    Attr(Stat, Duration),
    /// `statx` attributes and how long they may be cached (STATX).
    Statx(Statx, Duration),
    /// A new handle (OPEN, OPENDIR).
    Open(Opened),
    /// A created and opened file (CREATE, TMPFILE).
    Created(Entry, Opened),
    /// This many bytes were written into the data part of the reply buffers (the part after
    /// the reply header): READ, READLINK, READDIR, READDIRPLUS, and GETXATTR or LISTXATTR with a
    /// size. Never more than the request allows (READ's size, ...): the server caps it.
    Data(usize),
    /// The size of an attribute value or list (GETXATTR or LISTXATTR with size 0).
    XattrSize(u32),
    /// Bytes written or copied (WRITE, COPY_FILE_RANGE).
    Written(usize),
    /// The resulting offset (LSEEK).
    Offset(u64),
    /// Filesystem statistics (STATFS).
    StatFs(StatFs),
    /// The conflicting lock, or one of type [`LockType::Unlock`] (GETLK; answered by the server).
    Lock(FileLock),
}

/// What a lock request needs of the handle it comes through ([`FileSystem::lock_handle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockAccess {
    /// Any open handle of the file: GETLK, unlocking, `flock(2)`.
    Any,
    /// A handle open for reading: a shared POSIX lock (`F_RDLCK`).
    Read,
    /// A handle open for writing: an exclusive POSIX lock (`F_WRLCK`).
    Write,
}

/// Attributes as `statx(2)` shows them: [`Stat`] plus the birth time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Statx {
    /// The `stat(2)` attributes.
    pub stat: Stat,
    /// Creation time, if the filesystem knows it.
    pub btime: Option<Timespec>,
}

/// Receives READDIR entries; returns `false` when the entry did not fit, which ends the listing
/// (the entry is then not consumed: the next READDIR starts with it).
pub type DirSink<'s> = dyn FnMut(DirEntry<'_>) -> bool + 's;

/// Receives READDIRPLUS entries with their lookup result; returns `false` when the entry did not
/// fit, which ends the listing. The filesystem takes a lookup reference on `Entry::ino` only for
/// entries the sink accepted, and never for `.` and `..` (whose `Entry::ino` must be 0).
pub type DirPlusSink<'s> = dyn FnMut(DirEntry<'_>, &Entry) -> bool + 's;

/// A filesystem served over FUSE. Every operation defaults to [`Error::NotImplemented`].
///
/// Inode numbers are FUSE node ids; [`crate::abi::ROOT_ID`] is the root. Operations returning an
/// [`Entry`] give the kernel one lookup reference on it, which [`FileSystem::forget`] later drops.
#[allow(unused_variables)]
pub trait FileSystem: Send + Sync {
    /// The session starts. `capable` is the set of `FUSE_INIT` flags ([`crate::abi::init`]) that the
    /// kernel offers and the server can honour; return the subset this filesystem wants.
    ///
    /// Some flags are promises only the filesystem can make, so the default leaves them out:
    /// `HANDLE_KILLPRIV` and `HANDLE_KILLPRIV_V2` (it clears set-user-id, set-group-id and
    /// `security.capability` itself on write, truncate and chown), `DONT_MASK` (it applies the
    /// `umask` argument of MKNOD, MKDIR, CREATE and TMPFILE itself) and `POSIX_ACL` (it stores
    /// `system.posix_acl_*`, keeps the mode in step with them and makes new nodes inherit default
    /// ACLs; the kernel then also checks permissions itself, as with `default_permissions`) and
    /// `WRITEBACK_CACHE` (it then also takes `HANDLE_KILLPRIV_V2`, lets handles opened write-only
    /// be read, leaves `O_APPEND` to the kernel and lets a caller who may write a file set its
    /// times; see `server::SUPPORTED_INIT_FLAGS`).
    fn init(&self, capable: u64) -> Result<u64> {
        use crate::abi::init;
        Ok(capable
            & !(init::HANDLE_KILLPRIV
                | init::HANDLE_KILLPRIV_V2
                | init::DONT_MASK
                | init::POSIX_ACL
                | init::WRITEBACK_CACHE))
    }

    /// The session ends: the kernel drops every lookup reference and handle it held.
    fn destroy(&self) {}

    /// The device was reset (by the driver, or because its client went away): the driver's
    /// session is gone even before the next INIT, which calls [`Self::destroy`]. What must not
    /// outlive the device goes now (NFSv4.1: the guest's locks on the server); the session's
    /// tables (nodes, handles) stay until that INIT or DESTROY. Called on the control thread
    /// once no poller serves a queue; must not block.
    fn device_reset(&self) {}

    /// Replies this filesystem made are about to be published to the driver: what must be
    /// somewhere safe before the guest can see them goes there now (a crash-kept share's
    /// queued descriptors). Called on the poller before each publish of a round that
    /// completed requests; must cost next to nothing when nothing is due.
    fn before_publish(&self) {}

    /// Whether [`Self::before_publish`] has something to do now; must be cheap (called after
    /// each request on a poller).
    fn publish_due(&self) -> bool {
        false
    }

    /// Resolves `name` in directory `parent`.
    fn lookup(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<Entry> {
        Err(Error::NotImplemented)
    }

    /// Drops `nlookup` lookup references on `ino`.
    fn forget(&self, ctx: &Context, ino: u64, nlookup: u64) {}

    /// Returns the attributes of `ino` and how long they may be cached.
    fn getattr(&self, ctx: &Context, ino: u64, fh: Option<u64>) -> Result<(Stat, Duration)> {
        Err(Error::NotImplemented)
    }

    /// Changes attributes of `ino`; returns the new attributes.
    fn setattr(&self, ctx: &Context, ino: u64, attr: &SetAttr) -> Result<(Stat, Duration)> {
        Err(Error::NotImplemented)
    }

    /// Returns the target of symlink `ino`.
    fn readlink(&self, ctx: &Context, ino: u64) -> Result<Vec<u8>> {
        Err(Error::NotImplemented)
    }

    /// Creates symlink `name` in `parent` pointing at `target`.
    fn symlink(&self, ctx: &Context, parent: u64, name: &[u8], target: &[u8]) -> Result<Entry> {
        Err(Error::NotImplemented)
    }

    /// Creates a node (regular file, FIFO, socket, device) `name` in `parent`. `mode` holds the
    /// type and permission bits; unless `DONT_MASK` was negotiated the kernel has already applied
    /// `umask` to it (applying it again changes nothing).
    fn mknod(&self, ctx: &Context, parent: u64, args: &MknodArgs<'_>) -> Result<Entry> {
        Err(Error::NotImplemented)
    }

    /// Creates directory `name` in `parent`.
    fn mkdir(&self, ctx: &Context, parent: u64, name: &[u8], mode: u32, umask: u32) -> Result<Entry> {
        Err(Error::NotImplemented)
    }

    /// Removes the non-directory `name` from `parent`.
    fn unlink(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Removes the empty directory `name` from `parent`.
    fn rmdir(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Renames `olddir/oldname` to `newdir/newname`. `flags` are `RENAME_NOREPLACE`,
    /// `RENAME_EXCHANGE` or 0.
    fn rename(&self, ctx: &Context, olddir: u64, args: &RenameArgs<'_>) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Creates hard link `newparent/newname` to `ino`.
    fn link(&self, ctx: &Context, ino: u64, newparent: u64, newname: &[u8]) -> Result<Entry> {
        Err(Error::NotImplemented)
    }

    /// Opens `ino` with `open(2)` `flags`. `kill_priv`: the kernel asks that an `O_TRUNC` clear
    /// set-user-id and set-group-id ([`crate::abi::OPEN_KILL_SUIDGID`], with `HANDLE_KILLPRIV_V2`).
    fn open(&self, ctx: &Context, ino: u64, flags: u32, kill_priv: bool) -> Result<Opened> {
        Err(Error::NotImplemented)
    }

    /// Reads up to `size` bytes at `offset` into `w`; returns the number of bytes written (fewer
    /// than `size` only at end of file).
    fn read(&self, ctx: &Context, ino: u64, args: &ReadArgs, w: &mut Writer<'_>) -> Result<usize> {
        Err(Error::NotImplemented)
    }

    /// Writes `size` bytes from `r` at `offset`; returns the number of bytes written.
    /// `write_flags` are [`crate::abi::write_flags`].
    fn write(&self, ctx: &Context, ino: u64, args: &WriteArgs, r: &mut Reader<'_>) -> Result<usize> {
        Err(Error::NotImplemented)
    }

    /// A file descriptor of `fh` is being closed.
    fn flush(&self, ctx: &Context, ino: u64, fh: u64, lock_owner: u64) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// The last reference to `fh` is gone. `lock_owner` is the owner whose locks go with it (0
    /// when the kernel names none).
    fn release(&self, ctx: &Context, ino: u64, fh: u64, flags: u32, lock_owner: u64) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Makes the data (and, unless `datasync`, the metadata) of `ino` durable.
    fn fsync(&self, ctx: &Context, ino: u64, fh: u64, datasync: bool) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Opens directory `ino` for listing.
    fn opendir(&self, ctx: &Context, ino: u64, flags: u32) -> Result<Opened> {
        Err(Error::NotImplemented)
    }

    /// Lists directory `ino` from `offset` (0 or an offset of a previous entry) into `sink` until
    /// it refuses an entry or the directory ends.
    fn readdir(&self, ctx: &Context, ino: u64, fh: u64, offset: u64, sink: &mut DirSink<'_>) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Like [`FileSystem::readdir`], with each entry looked up (see [`DirPlusSink`]).
    fn readdirplus(
        &self,
        ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        sink: &mut DirPlusSink<'_>,
    ) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// The last reference to directory handle `fh` is gone.
    fn releasedir(&self, ctx: &Context, ino: u64, fh: u64, flags: u32) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Makes directory `ino` durable.
    fn fsyncdir(&self, ctx: &Context, ino: u64, fh: u64, datasync: bool) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Returns filesystem statistics.
    fn statfs(&self, ctx: &Context, ino: u64) -> Result<StatFs> {
        Err(Error::NotImplemented)
    }

    /// Checks whether the caller may access `ino` with `mask` (`R_OK | W_OK | X_OK`, or `F_OK`).
    fn access(&self, ctx: &Context, ino: u64, mask: u32) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Creates and opens regular file `name` in `parent` (opening it if it exists and `flags` has
    /// no `O_EXCL`; `kill_priv` as for [`FileSystem::open`]).
    fn create(&self, ctx: &Context, parent: u64, args: &CreateArgs<'_>) -> Result<(Entry, Opened)> {
        Err(Error::NotImplemented)
    }

    /// Creates and opens an unnamed regular file in directory `parent` (`O_TMPFILE`); it has no
    /// link until [`FileSystem::link`] gives it one, which `flags` with `O_EXCL` forbids.
    fn tmpfile(
        &self,
        ctx: &Context,
        parent: u64,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> Result<(Entry, Opened)> {
        Err(Error::NotImplemented)
    }

    /// Allocates or deallocates space of `ino` (`fallocate(2)` `mode`).
    fn fallocate(&self, ctx: &Context, ino: u64, args: &FallocateArgs) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Sets extended attribute `name` of `ino` to `value`. `flags`: `XATTR_CREATE` (fail if it
    /// exists) and/or `XATTR_REPLACE` (fail if it does not); no other bit. `acl_kill_sgid`: when the kernel
    /// decides whether setting a POSIX access ACL clears set-group-id (`POSIX_ACL` and
    /// `SETXATTR_EXT` negotiated), its decision; `None` leaves it to the filesystem.
    fn setxattr(&self, ctx: &Context, ino: u64, args: &SetxattrArgs<'_>, value: &[u8]) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Returns extended attribute `name` of `ino`: its size when `size` is 0, else the value, or
    /// [`Error::OutOfRange`] when it is longer than `size`.
    fn getxattr(&self, ctx: &Context, ino: u64, name: &[u8], size: u32) -> Result<XattrReply> {
        Err(Error::NotImplemented)
    }

    /// Lists the extended attribute names of `ino` (each NUL-terminated), sized as for
    /// [`FileSystem::getxattr`].
    fn listxattr(&self, ctx: &Context, ino: u64, size: u32) -> Result<XattrReply> {
        Err(Error::NotImplemented)
    }

    /// Removes extended attribute `name` of `ino`.
    fn removexattr(&self, ctx: &Context, ino: u64, name: &[u8]) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Checks that a lock request may come through `fh`: an open handle of the regular file
    /// `ino` that allows `access`. The server keeps the locks themselves, the same for every
    /// backend (see [`crate::locks`]).
    fn lock_handle(&self, ctx: &Context, ino: u64, fh: u64, access: LockAccess) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// The filesystem's own locks ([`RemoteLocks`]: a server other clients share keeps them),
    /// or `None` when the server keeps them in the device, the same for every backend (the
    /// default). With them, GETLK and SETLK go to the filesystem as any request (its engine
    /// answers them), and a SETLKW waits through [`RemoteLocks::wait`].
    fn remote_locks(&self) -> Option<&dyn RemoteLocks> {
        None
    }

    /// Whether `ino` still has open handles (asked after a RELEASE): with its last handle gone
    /// nobody can hold a lock on a file, and the server drops any left. The default, `true`,
    /// leaves them to their owners' releases.
    fn has_open_handles(&self, ino: u64) -> bool {
        true
    }

    /// Repositions within `fh` (`lseek(2)` `whence`: `SEEK_SET`, `SEEK_CUR`, `SEEK_END`,
    /// `SEEK_DATA`, `SEEK_HOLE`); returns the resulting offset.
    fn lseek(&self, ctx: &Context, ino: u64, fh: u64, offset: u64, whence: u32) -> Result<u64> {
        Err(Error::NotImplemented)
    }

    /// Copies up to `len` bytes from `ino_in`/`fh_in` at `off_in` to `ino_out`/`fh_out` at
    /// `off_out`; returns the number of bytes copied (fewer than asked at end of file, or when the
    /// filesystem copies in pieces). The server has checked that neither range wraps, and caps
    /// `len` to what the 32-bit reply can count.
    fn copy_file_range(&self, ctx: &Context, ino_in: u64, args: &CopyFileRangeArgs) -> Result<usize> {
        Err(Error::NotImplemented)
    }

    /// Makes the whole filesystem durable.
    fn syncfs(&self, ctx: &Context, ino: u64) -> Result<()> {
        Err(Error::NotImplemented)
    }

    /// Returns the attributes of `ino` with its birth time, and how long they may be cached.
    /// `fh`: the open handle the request names, if any.
    fn statx(&self, ctx: &Context, ino: u64, fh: Option<u64>) -> Result<(Statx, Duration)> {
        Err(Error::NotImplemented)
    }

    /// The engine of poller `poller` for requests that may complete later ([`crate::filesystem::seam`]:
    /// the buffer rule and the bounded-time rule are there), created on that poller's own
    /// thread; it keeps the poller's share of the filesystem's asynchronous state (an io_uring,
    /// sockets). `None`, the default: every request is answered at once through the methods
    /// above, on the poller's thread.
    fn engine(&self, poller: usize) -> Option<Box<dyn seam::FsEngine<Self>>>
    where
        Self: Sized,
    {
        None
    }
}
