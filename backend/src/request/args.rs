//! The typed arguments of the operations whose argument lists are long: what [`Op`](super::Op)
//! carries and what the filesystem's methods take ([`crate::filesystem::FileSystem`]), decoded
//! and checked by [`super::Request::parse`].

use crate::types::FileLock;

/// The `FUSE_INIT` arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitArgs {
    /// Protocol major version.
    pub major: u32,
    /// Protocol minor version.
    pub minor: u32,
    /// The kernel's readahead.
    pub max_readahead: u32,
    /// Offered flags, both halves ([`crate::abi::init`]).
    pub flags: u64,
}

/// Which lock request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockOp {
    /// GETLK: which lock conflicts.
    Get,
    /// SETLK: set, or fail at once.
    Set,
    /// SETLKW: set, waiting for conflicting locks to go.
    SetWait,
}

/// A decoded GETLK, SETLK or SETLKW.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockRequest {
    /// Which of the three.
    pub op: LockOp,
    /// The handle it comes through.
    pub fh: u64,
    /// The POSIX lock owner.
    pub owner: u64,
    /// The range and type (checked: a known type, `start <= end <= OFFSET_MAX`; GETLK never
    /// asks about `Unlock`).
    pub lock: FileLock,
    /// A `flock(2)` lock (owned by the open file) rather than a POSIX one (never for GETLK).
    pub flock: bool,
}

/// MKNOD's arguments, as [`crate::filesystem::FileSystem::mknod`] takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MknodArgs<'a> {
    /// The new name.
    pub name: &'a [u8],
    /// Type and permission bits.
    pub mode: u32,
    /// Device number.
    pub rdev: u32,
    /// The caller's umask.
    pub umask: u32,
}

/// RENAME's and RENAME2's arguments (the old directory is the request's node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenameArgs<'a> {
    /// The old name in the node.
    pub oldname: &'a [u8],
    /// The target directory.
    pub newdir: u64,
    /// The new name (not `.` or `..`).
    pub newname: &'a [u8],
    /// `renameat2(2)` flags.
    pub flags: u32,
}

/// READ's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadArgs {
    /// The handle.
    pub fh: u64,
    /// Where.
    pub offset: u64,
    /// How many bytes.
    pub size: u32,
}

/// WRITE's arguments (the payload comes beside them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteArgs {
    /// The handle.
    pub fh: u64,
    /// Where.
    pub offset: u64,
    /// Payload bytes.
    pub size: u32,
    /// [`crate::abi::write_flags`].
    pub write_flags: u32,
    /// The `open(2)` flags of the file written through, as the kernel sends them with every
    /// WRITE (`fuse_write_in.flags`: `O_APPEND`, `O_DIRECT`, `O_SYNC`, ...).
    pub flags: u32,
}

/// CREATE's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateArgs<'a> {
    /// The new name.
    pub name: &'a [u8],
    /// Permission bits.
    pub mode: u32,
    /// `open(2)` flags.
    pub flags: u32,
    /// The caller's umask.
    pub umask: u32,
    /// Clear set-user-id on `O_TRUNC`.
    pub kill_priv: bool,
}

/// FALLOCATE's arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallocateArgs {
    /// The handle.
    pub fh: u64,
    /// `fallocate(2)` mode.
    pub mode: u32,
    /// Where.
    pub offset: u64,
    /// How many bytes.
    pub length: u64,
}

/// SETXATTR's arguments (the value comes beside them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetxattrArgs<'a> {
    /// Its name.
    pub name: &'a [u8],
    /// `XATTR_CREATE` and/or `XATTR_REPLACE`.
    pub flags: u32,
    /// The kernel's decision on clearing set-group-id for an access ACL, when it makes it.
    pub acl_kill_sgid: Option<bool>,
}

/// COPY_FILE_RANGE's arguments (the source inode is the request's node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyFileRangeArgs {
    /// The source handle.
    pub fh_in: u64,
    /// The source offset.
    pub off_in: u64,
    /// The destination inode.
    pub nodeid_out: u64,
    /// The destination handle.
    pub fh_out: u64,
    /// The destination offset.
    pub off_out: u64,
    /// Most bytes to copy.
    pub len: u64,
}
