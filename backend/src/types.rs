//! The plain values every layer of the backend shares, with no dependency on any of them: the
//! caller of a request ([`Context`]), times ([`Timespec`], [`SetTime`]), the attributes a
//! SETATTR changes ([`SetAttr`]), record locks ([`FileLock`], [`LockType`], [`OFFSET_MAX`]) and
//! the filesystem error ([`Error`], one errno table). The request decoder, the lock table, the
//! filesystem trait and its engines all use these; this module uses none of them, so none of
//! them import each other through it. [`crate::filesystem`] re-exports everything here.

/// The end of a record lock that runs "to the end of the file, however long" (the kernel's
/// `OFFSET_MAX`).
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// Who is asking: the fsuid, fsgid and thread group of the guest process behind a request, and
/// at most one of its supplementary groups.
///
/// FUSE carries supplementary groups only in a request extension (`FUSE_EXT_GROUPS`), which the
/// kernel adds with `FUSE_CREATE_SUPP_GROUP` to creations (CREATE, MKNOD, MKDIR, SYMLINK,
/// TMPFILE) when the parent directory's group is one of the caller's supplementary groups and not
/// its fsgid: exactly the case where group membership decides the permission check on the
/// parent. Elsewhere permission checks can only use `gid`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Context {
    /// Filesystem user id of the caller.
    pub uid: u32,
    /// Filesystem group id of the caller.
    pub gid: u32,
    /// Thread group id of the caller.
    pub pid: u32,
    /// A supplementary group of the caller, from the request's `FUSE_EXT_GROUPS` extension.
    pub supp_gid: Option<u32>,
}

impl Context {
    /// Whether the caller is in group `gid`, as far as the request tells: its fsgid or the
    /// supplementary group it carries.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.supp_gid == Some(gid)
    }
}

/// A point in time, seconds and nanoseconds since the Unix epoch (seconds may be negative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timespec {
    /// Seconds since the epoch.
    pub sec: i64,
    /// Nanoseconds, below 1e9.
    pub nsec: u32,
}

impl Timespec {
    /// The current wall-clock time.
    pub fn now() -> Self {
        match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timespec { sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() },
            Err(e) => {
                let d = e.duration();
                let sec = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
                match d.subsec_nanos() {
                    0 => Timespec { sec, nsec: 0 },
                    n => Timespec { sec: sec - 1, nsec: 1_000_000_000 - n },
                }
            }
        }
    }
}

/// A time to set with SETATTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    /// The server's current time (`UTIME_NOW`).
    Now,
    /// An explicit time.
    At(Timespec),
}

/// The attributes a SETATTR changes; `None` leaves one alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (the file type bits are ignored).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
    /// New status change time.
    pub ctime: Option<Timespec>,
    /// The request comes through this open handle (`ftruncate`), so the handle's access mode rather
    /// than the inode's permission bits decides.
    pub fh: Option<u64>,
    /// Clear set-user-id and set-group-id as a write by this caller would.
    pub kill_suidgid: bool,
}

/// The kind of a POSIX record lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockType {
    /// A shared lock (`F_RDLCK`).
    Read,
    /// An exclusive lock (`F_WRLCK`).
    Write,
    /// No lock: releases a range, or "no conflict" in a GETLK answer (`F_UNLCK`).
    Unlock,
}

/// A POSIX record lock on a byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLock {
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive (`i64::MAX` stands for "to the end of the file, however long").
    pub end: u64,
    /// Shared, exclusive, or none.
    pub typ: LockType,
    /// Process (thread group) holding it, as the kernel reports it.
    pub pid: u32,
}

/// Why an operation failed. The server turns it into an errno in the reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The filesystem does not implement this operation (`ENOSYS`).
    #[error("operation not implemented")]
    NotImplemented,
    /// No such file, directory or inode (`ENOENT`).
    #[error("no such file or directory")]
    NotFound,
    /// The name already exists (`EEXIST`).
    #[error("file exists")]
    Exists,
    /// A directory was required (`ENOTDIR`).
    #[error("not a directory")]
    NotDir,
    /// A non-directory was required (`EISDIR`).
    #[error("is a directory")]
    IsDir,
    /// The directory is not empty (`ENOTEMPTY`).
    #[error("directory not empty")]
    NotEmpty,
    /// The permission bits deny the access (`EACCES`).
    #[error("permission denied")]
    AccessDenied,
    /// The caller lacks the ownership or privilege the operation needs (`EPERM`).
    #[error("operation not permitted")]
    NotPermitted,
    /// A name component is too long (`ENAMETOOLONG`).
    #[error("name too long")]
    NameTooLong,
    /// An argument is invalid (`EINVAL`).
    #[error("invalid argument")]
    InvalidArgument,
    /// The filesystem is full (`ENOSPC`).
    #[error("no space left on device")]
    NoSpace,
    /// Unknown or unsuitable file handle (`EBADF`).
    #[error("bad file handle")]
    BadHandle,
    /// The file would exceed the maximum file size (`EFBIG`).
    #[error("file too large")]
    FileTooLarge,
    /// The inode has the maximum number of links (`EMLINK`).
    #[error("too many links")]
    TooManyLinks,
    /// The operation is not supported for this object (`EOPNOTSUPP`).
    #[error("operation not supported")]
    NotSupported,
    /// The result does not fit the caller's buffer, or an attribute name is empty or too long
    /// (`ERANGE`).
    #[error("result out of range")]
    OutOfRange,
    /// No such extended attribute (`ENODATA`).
    #[error("no such attribute")]
    NoData,
    /// An extended attribute value is too large (`E2BIG`).
    #[error("argument too large")]
    TooBig,
    /// SEEK_DATA/SEEK_HOLE past the end of the file, or SEEK_DATA in a trailing hole (`ENXIO`).
    #[error("no such device or address")]
    NoSuchAddress,
    /// An offset plus a length does not fit the offset type (`EOVERFLOW`).
    #[error("value too large for defined data type")]
    Overflow,
    /// Internal failure (`EIO`).
    #[error("input/output error")]
    Io,
    /// Any other errno, passed on as is: a filesystem backed by a host kernel (the passthrough)
    /// reports what the host said (`ELOOP`, `EXDEV`, `EBUSY`, `EROFS`, `EDQUOT`, ...) when no
    /// variant above names it. Not positive: reported as `EIO`.
    #[error("errno {0}")]
    Os(i32),
}

/// The one errno table: each variant and the errno it stands for, both ways.
macro_rules! errno_table {
    ($($variant:ident = $errno:ident,)*) => {
        impl Error {
            /// The errno this error is reported as.
            pub fn errno(self) -> i32 {
                match self {
                    $(Error::$variant => libc::$errno,)*
                    Error::Os(e) if e > 0 => e,
                    Error::Os(_) => libc::EIO,
                }
            }

            /// The error an errno stands for: its variant, or [`Error::Os`] for errnos without
            /// one.
            pub fn from_errno(errno: i32) -> Self {
                match errno {
                    $(libc::$errno => Error::$variant,)*
                    other => Error::Os(other),
                }
            }
        }
    };
}

errno_table! {
    NotImplemented = ENOSYS,
    NotFound = ENOENT,
    Exists = EEXIST,
    NotDir = ENOTDIR,
    IsDir = EISDIR,
    NotEmpty = ENOTEMPTY,
    AccessDenied = EACCES,
    NotPermitted = EPERM,
    NameTooLong = ENAMETOOLONG,
    InvalidArgument = EINVAL,
    NoSpace = ENOSPC,
    BadHandle = EBADF,
    FileTooLarge = EFBIG,
    TooManyLinks = EMLINK,
    NotSupported = EOPNOTSUPP,
    OutOfRange = ERANGE,
    NoData = ENODATA,
    TooBig = E2BIG,
    NoSuchAddress = ENXIO,
    Overflow = EOVERFLOW,
    Io = EIO,
}

/// A host error as the guest gets it: its errno's variant; an error without an errno is
/// [`Error::Io`].
impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        e.raw_os_error().map_or(Error::Io, Error::from_errno)
    }
}

impl From<crate::io::Error> for Error {
    fn from(e: crate::io::Error) -> Self {
        match e {
            crate::io::Error::ShortRead { .. } => Error::InvalidArgument,
            crate::io::Error::ShortWrite { .. } => Error::OutOfRange,
        }
    }
}

/// Result of a filesystem operation.
pub type Result<T> = std::result::Result<T, Error>;
