//! The FUSE wire format (`include/uapi/linux/fuse.h`, protocol 7.41), as `#[repr(C)]` structs.
//!
//! Every struct here is plain old data with explicit padding fields, so any byte pattern is a valid
//! value; that is what lets them implement [`vm_memory::ByteValued`], and it is the only place in the
//! crate where bytes are reinterpreted as structs. All integers are in the guest's native byte order
//! (virtio-fs is only defined between a guest and a device of the same endianness; FUSE has no
//! byte-order conversion).
//!
//! **A second implementation on purpose.** The host driver model has its own FUSE structures
//! (`tools/src/fuse_abi.rs`), written from `<linux/fuse.h>` without this module: every
//! end-to-end test runs one against the other, so a wrong field order, size or padding on either
//! side fails a test instead of cancelling out. Keep them apart; settle a mismatch against the
//! header.

use vm_memory::ByteValued;

/// Major protocol version we speak.
pub const KERNEL_VERSION: u32 = 7;
/// Minor protocol version we speak (Linux 6.12).
pub const KERNEL_MINOR_VERSION: u32 = 41;
/// Oldest minor version we accept from a kernel: from 7.12 on, every argument struct has its current
/// size (Linux 2.6.31 and later; virtio-fs itself needs 7.31).
pub const MIN_KERNEL_MINOR_VERSION: u32 = 12;
/// The node id of the filesystem root.
pub const ROOT_ID: u64 = 1;
/// The longest name component a FUSE kernel may send (it enforces this before sending).
pub const FUSE_NAME_MAX: usize = 1024;

/// Limits of the protocol and of Linux that requests are checked against (the server's and
/// every backend's: one place).
pub mod limits {
    /// Largest WRITE payload we accept (and advertise as `max_write`).
    pub const MAX_WRITE: u32 = 1 << 20;
    /// `max_pages` advertised with `FUSE_MAX_PAGES` (256 x 4 KiB = [`MAX_WRITE`]).
    pub const MAX_PAGES: u16 = 256;
    /// Longest extended attribute name (`XATTR_NAME_MAX`).
    pub const XATTR_NAME_MAX: usize = 255;
    /// Largest extended attribute value or name list (`XATTR_SIZE_MAX`).
    pub const XATTR_SIZE_MAX: usize = 64 << 10;
    /// Longest name component (`NAME_MAX`).
    pub const NAME_MAX: usize = 255;
    /// Longest name section of a request (two names plus a symlink target fit).
    pub const NAME_BUF: usize = 8192;
    /// Most bytes one COPY_FILE_RANGE may report (its reply is a 32-bit count); page-aligned, as
    /// newer kernels cap it.
    pub const MAX_COPY_REPLY: u64 = u32::MAX as u64 & !0xfff;
    /// `fallocate(2)` mode bits Linux knows (`FALLOC_FL_*`); any other bit is `EOPNOTSUPP`.
    pub const FALLOC_KNOWN: u32 = (libc::FALLOC_FL_KEEP_SIZE
        | libc::FALLOC_FL_PUNCH_HOLE
        | libc::FALLOC_FL_COLLAPSE_RANGE
        | libc::FALLOC_FL_ZERO_RANGE
        | libc::FALLOC_FL_INSERT_RANGE
        | libc::FALLOC_FL_UNSHARE_RANGE) as u32;
    /// The largest `lseek(2)` whence (`SEEK_HOLE`); SET, CUR, END, DATA and HOLE are 0 to 4.
    pub const SEEK_MAX: u32 = libc::SEEK_HOLE as u32;
    /// The `renameat2(2)` flags a RENAME2 may carry (not both at once).
    pub const RENAME_KNOWN: u32 = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE;
}

/// FUSE request opcodes (`enum fuse_opcode`). `FUSE_COPY_FILE_RANGE_64` (53) came with 7.45; a
/// kernel speaking 7.41 never sends it, so it is not listed (it is answered `ENOSYS` like any
/// unknown opcode).
pub mod opcode {
    #![allow(missing_docs)]
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SETUPMAPPING: u32 = 48;
    pub const REMOVEMAPPING: u32 = 49;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;
}

/// `FUSE_INIT` capability flags, as one 64-bit set: bits 0..32 travel in `flags`, bits 32..64 in
/// `flags2` (only when [`init::INIT_EXT`] is set by both sides).
pub mod init {
    #![allow(missing_docs)]
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const FILE_OPS: u64 = 1 << 2;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const SPLICE_WRITE: u64 = 1 << 7;
    pub const SPLICE_MOVE: u64 = 1 << 8;
    pub const SPLICE_READ: u64 = 1 << 9;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const HAS_IOCTL_DIR: u64 = 1 << 11;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const ABORT_ERROR: u64 = 1 << 21;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    pub const MAP_ALIGNMENT: u64 = 1 << 26;
    pub const SUBMOUNTS: u64 = 1 << 27;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const INIT_RESERVED: u64 = 1 << 31;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const HAS_INODE_DAX: u64 = 1 << 33;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    pub const HAS_EXPIRE_ONLY: u64 = 1 << 35;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const NO_EXPORT_SUPPORT: u64 = 1 << 38;
    pub const HAS_RESEND: u64 = 1 << 39;
    pub const ALLOW_IDMAP: u64 = 1 << 40;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    #![allow(missing_docs)]
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_open_out.open_flags` bits (`FOPEN_*`).
pub mod fopen {
    #![allow(missing_docs)]
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const NONSEEKABLE: u32 = 1 << 2;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const STREAM: u32 = 1 << 4;
    pub const NOFLUSH: u32 = 1 << 5;
    pub const PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
}

/// `fuse_write_in.write_flags` bits.
pub mod write_flags {
    #![allow(missing_docs)]
    pub const CACHE: u32 = 1 << 0;
    pub const LOCKOWNER: u32 = 1 << 1;
    pub const KILL_SUIDGID: u32 = 1 << 2;
}

/// `fuse_getattr_in.getattr_flags`: `fh` is valid.
pub const GETATTR_FH: u32 = 1 << 0;
/// `fuse_fsync_in.fsync_flags`: only flush user data (fdatasync).
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
/// `fuse_open_in.open_flags` / `fuse_create_in.open_flags`: clear set-user-id and set-group-id on
/// `O_TRUNC` (sent with `HANDLE_KILLPRIV_V2` when the caller lacks `CAP_FSETID`).
pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;
/// `fuse_setxattr_in.setxattr_flags`: setting this POSIX access ACL clears set-group-id (the caller
/// is neither in the file's group nor has `CAP_FSETID`). Only with `SETXATTR_EXT` and `POSIX_ACL`.
pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;
/// `fuse_lk_in.lk_flags`: a BSD `flock` rather than a POSIX record lock.
pub const LK_FLOCK: u32 = 1 << 0;
/// `fuse_release_in.release_flags`: flush as well.
pub const RELEASE_FLUSH: u32 = 1 << 0;
/// `fuse_release_in.release_flags`: drop the `flock` locks of `lock_owner`.
pub const RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
/// `fuse_setxattr_in` size without `SETXATTR_EXT` (`size` and `flags` only).
pub const COMPAT_SETXATTR_IN_SIZE: usize = 8;

/// `statx` mask bits (`STATX_*`) used in `fuse_statx`.
pub mod statx {
    #![allow(missing_docs)]
    pub const TYPE: u32 = 0x0001;
    pub const MODE: u32 = 0x0002;
    pub const NLINK: u32 = 0x0004;
    pub const UID: u32 = 0x0008;
    pub const GID: u32 = 0x0010;
    pub const ATIME: u32 = 0x0020;
    pub const MTIME: u32 = 0x0040;
    pub const CTIME: u32 = 0x0080;
    pub const INO: u32 = 0x0100;
    pub const SIZE: u32 = 0x0200;
    pub const BLOCKS: u32 = 0x0400;
    pub const BASIC_STATS: u32 = 0x07ff;
    pub const BTIME: u32 = 0x0800;
}

/// Header of every request (`struct fuse_in_header`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    /// Total request length in bytes, this header included.
    pub len: u32,
    /// One of [`opcode`].
    pub opcode: u32,
    /// Request id, echoed in the reply.
    pub unique: u64,
    /// The inode the request is about.
    pub nodeid: u64,
    /// Caller's fsuid.
    pub uid: u32,
    /// Caller's fsgid.
    pub gid: u32,
    /// Caller's thread group id.
    pub pid: u32,
    /// Length of request extensions, in 8-byte units.
    pub total_extlen: u16,
    /// Padding.
    pub padding: u16,
}

/// Request extension types (`enum fuse_ext_type`).
pub mod ext {
    /// Types 0 to this one are security contexts (`fuse_secctx_header`, whose second field is
    /// the number of contexts), sent with `FUSE_SECURITY_CTX`.
    pub const MAX_NR_SECCTX: u32 = 31;
    /// Supplementary groups (`struct fuse_supp_groups`), sent with `FUSE_CREATE_SUPP_GROUP`.
    pub const GROUPS: u32 = 32;
}

/// Header of one request extension (`struct fuse_ext_header`). Extensions follow the
/// arguments, `in_header.total_extlen * 8` bytes in all; each is `size` bytes (a multiple of 8,
/// this header included).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExtHeader {
    /// Bytes of this extension, header included.
    pub size: u32,
    /// One of [`ext`].
    pub typ: u32,
}

/// Header of every reply (`struct fuse_out_header`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OutHeader {
    /// Total reply length in bytes, this header included.
    pub len: u32,
    /// 0 or a negated errno.
    pub error: i32,
    /// The request id this answers.
    pub unique: u64,
}

/// Inode attributes (`struct fuse_attr`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

/// Reply to LOOKUP, MKNOD, MKDIR, SYMLINK, LINK (`struct fuse_entry_out`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

/// FORGET argument (`struct fuse_forget_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct ForgetIn {
    pub nlookup: u64,
}

/// One BATCH_FORGET item (`struct fuse_forget_one`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct ForgetOne {
    pub nodeid: u64,
    pub nlookup: u64,
}

/// BATCH_FORGET argument header (`struct fuse_batch_forget_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct BatchForgetIn {
    pub count: u32,
    pub dummy: u32,
}

/// GETATTR argument (`struct fuse_getattr_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct GetattrIn {
    pub getattr_flags: u32,
    pub dummy: u32,
    pub fh: u64,
}

/// Reply to GETATTR and SETATTR (`struct fuse_attr_out`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

/// MKNOD argument (`struct fuse_mknod_in`), followed by the name.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct MknodIn {
    pub mode: u32,
    pub rdev: u32,
    pub umask: u32,
    pub padding: u32,
}

/// MKDIR argument (`struct fuse_mkdir_in`), followed by the name.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct MkdirIn {
    pub mode: u32,
    pub umask: u32,
}

/// RENAME argument (`struct fuse_rename_in`), followed by both names.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct RenameIn {
    pub newdir: u64,
}

/// RENAME2 argument (`struct fuse_rename2_in`), followed by both names.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Rename2In {
    pub newdir: u64,
    pub flags: u32,
    pub padding: u32,
}

/// LINK argument (`struct fuse_link_in`), followed by the new name.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct LinkIn {
    pub oldnodeid: u64,
}

/// SETATTR argument (`struct fuse_setattr_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

/// OPEN and OPENDIR argument (`struct fuse_open_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct OpenIn {
    pub flags: u32,
    pub open_flags: u32,
}

/// CREATE argument (`struct fuse_create_in`), followed by the name.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct CreateIn {
    pub flags: u32,
    pub mode: u32,
    pub umask: u32,
    pub open_flags: u32,
}

/// Reply to OPEN and OPENDIR; second half of the CREATE reply (`struct fuse_open_out`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

/// RELEASE and RELEASEDIR argument (`struct fuse_release_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct ReleaseIn {
    pub fh: u64,
    pub flags: u32,
    pub release_flags: u32,
    pub lock_owner: u64,
}

/// FLUSH argument (`struct fuse_flush_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct FlushIn {
    pub fh: u64,
    pub unused: u32,
    pub padding: u32,
    pub lock_owner: u64,
}

/// READ, READDIR and READDIRPLUS argument (`struct fuse_read_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// WRITE argument (`struct fuse_write_in`), followed by the data.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct WriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// Reply to WRITE (`struct fuse_write_out`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

/// Filesystem statistics (`struct fuse_kstatfs`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Kstatfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

/// Reply to STATFS (`struct fuse_statfs_out`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct StatfsOut {
    pub st: Kstatfs,
}

/// FSYNC and FSYNCDIR argument (`struct fuse_fsync_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct FsyncIn {
    pub fh: u64,
    pub fsync_flags: u32,
    pub padding: u32,
}

/// ACCESS argument (`struct fuse_access_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct AccessIn {
    pub mask: u32,
    pub padding: u32,
}

/// The part of `struct fuse_init_in` every kernel sends.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct InitInCompat {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
}

/// The tail of `struct fuse_init_in` sent since 7.36 (`flags2` and reserved words).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct InitInExt {
    pub flags2: u32,
    pub unused: [u32; 11],
}

/// Reply to INIT (`struct fuse_init_out`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    pub flags2: u32,
    pub max_stack_depth: u32,
    pub unused: [u32; 6],
}

/// `fuse_init_out` size a kernel older than 7.23 expects.
pub const COMPAT_22_INIT_OUT_SIZE: usize = 24;

/// SETXATTR argument (`struct fuse_setxattr_in`), followed by the name and the value. Without
/// `SETXATTR_EXT` only the first [`COMPAT_SETXATTR_IN_SIZE`] bytes are sent.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct SetxattrIn {
    pub size: u32,
    pub flags: u32,
    pub setxattr_flags: u32,
    pub padding: u32,
}

/// GETXATTR (followed by the name) and LISTXATTR argument (`struct fuse_getxattr_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct GetxattrIn {
    pub size: u32,
    pub padding: u32,
}

/// Reply to GETXATTR and LISTXATTR asked with size 0 (`struct fuse_getxattr_out`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct GetxattrOut {
    pub size: u32,
    pub padding: u32,
}

/// A POSIX record lock (`struct fuse_file_lock`); `end` is inclusive, `type` is `F_RDLCK`,
/// `F_WRLCK` or `F_UNLCK`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct FileLock {
    pub start: u64,
    pub end: u64,
    pub typ: u32,
    pub pid: u32,
}

/// GETLK, SETLK and SETLKW argument (`struct fuse_lk_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct LkIn {
    pub fh: u64,
    pub owner: u64,
    pub lk: FileLock,
    pub lk_flags: u32,
    pub padding: u32,
}

/// Reply to GETLK (`struct fuse_lk_out`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct LkOut {
    pub lk: FileLock,
}

/// LSEEK argument (`struct fuse_lseek_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct LseekIn {
    pub fh: u64,
    pub offset: u64,
    pub whence: u32,
    pub padding: u32,
}

/// Reply to LSEEK (`struct fuse_lseek_out`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct LseekOut {
    pub offset: u64,
}

/// COPY_FILE_RANGE argument (`struct fuse_copy_file_range_in`); the source is the request's node.
/// The reply is a [`WriteOut`].
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct CopyFileRangeIn {
    pub fh_in: u64,
    pub off_in: u64,
    pub nodeid_out: u64,
    pub fh_out: u64,
    pub off_out: u64,
    pub len: u64,
    pub flags: u64,
}

/// SYNCFS argument (`struct fuse_syncfs_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct SyncfsIn {
    pub padding: u64,
}

/// A timestamp in a [`Statx`] (`struct fuse_sx_time`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct SxTime {
    pub tv_sec: i64,
    pub tv_nsec: u32,
    pub reserved: i32,
}

/// Extended attributes (`struct fuse_statx`); `mask` says which fields are valid ([`statx`]).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Statx {
    pub mask: u32,
    pub blksize: u32,
    pub attributes: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u16,
    pub spare0: u16,
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub attributes_mask: u64,
    pub atime: SxTime,
    pub btime: SxTime,
    pub ctime: SxTime,
    pub mtime: SxTime,
    pub rdev_major: u32,
    pub rdev_minor: u32,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub spare2: [u64; 14],
}

/// STATX argument (`struct fuse_statx_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct StatxIn {
    pub getattr_flags: u32,
    pub reserved: u32,
    pub fh: u64,
    pub sx_flags: u32,
    pub sx_mask: u32,
}

/// Reply to STATX (`struct fuse_statx_out`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct StatxOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub flags: u32,
    pub spare: [u64; 2],
    pub stat: Statx,
}

/// INTERRUPT argument (`struct fuse_interrupt_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct InterruptIn {
    pub unique: u64,
}

/// FALLOCATE argument (`struct fuse_fallocate_in`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct FallocateIn {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

/// Fixed part of a READDIR entry (`struct fuse_dirent`), followed by the name, padded to 8 bytes.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Dirent {
    pub ino: u64,
    pub off: u64,
    pub namelen: u32,
    pub typ: u32,
}

/// Fixed part of a READDIRPLUS entry (`struct fuse_direntplus`), followed by the name, padded to 8
/// bytes.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct DirentPlus {
    pub entry_out: EntryOut,
    pub dirent: Dirent,
}

/// Size of a dirent record with a name of `namelen` bytes, padding included (`FUSE_DIRENT_SIZE`).
pub const fn dirent_size(namelen: usize) -> usize {
    (std::mem::size_of::<Dirent>() + namelen + 7) & !7
}

/// Size of a direntplus record with a name of `namelen` bytes, padding included
/// (`FUSE_DIRENTPLUS_SIZE`).
pub const fn direntplus_size(namelen: usize) -> usize {
    (std::mem::size_of::<DirentPlus>() + namelen + 7) & !7
}

macro_rules! byte_valued {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: `$t` is `#[repr(C)]`, made only of integers (and arrays/structs of integers)
            // with every padding byte spelled out as a field (checked by the size assertions in the
            // tests), so it has no uninitialised bytes and every bit pattern is a valid value.
            unsafe impl ByteValued for $t {}
        )*
    };
}

byte_valued!(
    InHeader,
    ExtHeader,
    OutHeader,
    Attr,
    EntryOut,
    ForgetIn,
    ForgetOne,
    BatchForgetIn,
    GetattrIn,
    AttrOut,
    MknodIn,
    MkdirIn,
    RenameIn,
    Rename2In,
    LinkIn,
    SetattrIn,
    OpenIn,
    CreateIn,
    OpenOut,
    ReleaseIn,
    FlushIn,
    ReadIn,
    WriteIn,
    WriteOut,
    Kstatfs,
    StatfsOut,
    FsyncIn,
    AccessIn,
    InitInCompat,
    InitInExt,
    InitOut,
    InterruptIn,
    FallocateIn,
    Dirent,
    DirentPlus,
    SetxattrIn,
    GetxattrIn,
    GetxattrOut,
    FileLock,
    LkIn,
    LkOut,
    LseekIn,
    LseekOut,
    CopyFileRangeIn,
    SyncfsIn,
    SxTime,
    Statx,
    StatxIn,
    StatxOut,
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn sizes_match_the_kernel_header() {
        assert_eq!(size_of::<InHeader>(), 40);
        assert_eq!(size_of::<ExtHeader>(), 8);
        assert_eq!(size_of::<OutHeader>(), 16);
        assert_eq!(size_of::<Attr>(), 88);
        assert_eq!(size_of::<EntryOut>(), 128);
        assert_eq!(size_of::<ForgetIn>(), 8);
        assert_eq!(size_of::<ForgetOne>(), 16);
        assert_eq!(size_of::<BatchForgetIn>(), 8);
        assert_eq!(size_of::<GetattrIn>(), 16);
        assert_eq!(size_of::<AttrOut>(), 104);
        assert_eq!(size_of::<MknodIn>(), 16);
        assert_eq!(size_of::<MkdirIn>(), 8);
        assert_eq!(size_of::<RenameIn>(), 8);
        assert_eq!(size_of::<Rename2In>(), 16);
        assert_eq!(size_of::<LinkIn>(), 8);
        assert_eq!(size_of::<SetattrIn>(), 88);
        assert_eq!(size_of::<OpenIn>(), 8);
        assert_eq!(size_of::<CreateIn>(), 16);
        assert_eq!(size_of::<OpenOut>(), 16);
        assert_eq!(size_of::<ReleaseIn>(), 24);
        assert_eq!(size_of::<FlushIn>(), 24);
        assert_eq!(size_of::<ReadIn>(), 40);
        assert_eq!(size_of::<WriteIn>(), 40);
        assert_eq!(size_of::<WriteOut>(), 8);
        assert_eq!(size_of::<Kstatfs>(), 80);
        assert_eq!(size_of::<StatfsOut>(), 80);
        assert_eq!(size_of::<FsyncIn>(), 16);
        assert_eq!(size_of::<AccessIn>(), 8);
        assert_eq!(size_of::<InitInCompat>() + size_of::<InitInExt>(), 64);
        assert_eq!(size_of::<InitOut>(), 64);
        assert_eq!(size_of::<InterruptIn>(), 8);
        assert_eq!(size_of::<FallocateIn>(), 32);
        assert_eq!(size_of::<Dirent>(), 24);
        assert_eq!(size_of::<DirentPlus>(), 152);
        assert_eq!(size_of::<SetxattrIn>(), 16);
        assert_eq!(size_of::<GetxattrIn>(), 8);
        assert_eq!(size_of::<GetxattrOut>(), 8);
        assert_eq!(size_of::<FileLock>(), 24);
        assert_eq!(size_of::<LkIn>(), 48);
        assert_eq!(size_of::<LkOut>(), 24);
        assert_eq!(size_of::<LseekIn>(), 24);
        assert_eq!(size_of::<LseekOut>(), 8);
        assert_eq!(size_of::<CopyFileRangeIn>(), 56);
        assert_eq!(size_of::<SyncfsIn>(), 8);
        assert_eq!(size_of::<SxTime>(), 16);
        assert_eq!(size_of::<Statx>(), 256);
        assert_eq!(size_of::<StatxIn>(), 24);
        assert_eq!(size_of::<StatxOut>(), 288);
    }

    #[test]
    fn dirent_sizes_are_padded_to_8() {
        assert_eq!(dirent_size(1), 32);
        assert_eq!(dirent_size(8), 32);
        assert_eq!(dirent_size(9), 40);
        assert_eq!(direntplus_size(1), 160);
        assert_eq!(direntplus_size(255), 152 + 256);
    }
}
