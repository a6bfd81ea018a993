//! The FUSE request decoder: [`Request::parse`] turns the bytes of one request (its header and a
//! [`Reader`] over the rest of the device-readable buffers) into a typed [`Request`], one [`Op`]
//! variant per opcode with its arguments decoded and checked. The server executes it
//! ([`crate::server`]); the filesystem's per-poller engine sees the same value
//! ([`crate::filesystem::seam::FsEngine`]). Parse, then execute: nothing of the guest's bytes is interpreted
//! anywhere else.
//!
//! The guest is untrusted. Every length is checked against the buffers actually present (the
//! header's `len` must match the readable bytes exactly, argument structs must be complete, a
//! WRITE's size must match its payload and be at most [`limits::MAX_WRITE`], a SETXATTR's value
//! its size and at most [`limits::XATTR_SIZE_MAX`]), names must be NUL-terminated path
//! components (not `.` or `..` where one is created), attribute names NUL-terminated and at
//! most [`limits::XATTR_NAME_MAX`] bytes. The checks every backend would otherwise repeat are
//! made here once: RENAME2 flags, COPY_FILE_RANGE flags and wrapping ranges, `fallocate` mode
//! bits, `lseek` whence, SETATTR times, lock types and ranges, SETXATTR flags. Names are copied
//! into a caller's [`NameBuf`] (guest memory may change under us; a name is read once) and
//! borrowed from it; a WRITE's payload and a SETXATTR's value stay in the guest buffers, as a
//! [`Reader`].

use std::mem::size_of;

use crate::abi::{self, limits, opcode, InHeader};
use crate::io::{self, Reader};
use crate::locks::LockError;
use crate::types::OFFSET_MAX;
use crate::types::{self as filesystem, Context, FileLock, LockType, SetAttr, SetTime, Timespec};

mod args;
pub use args::*;

/// Name sections up to this long (two maximal names) use the short part of a [`NameBuf`].
const SHORT_NAMES: usize = 2 * 256;

/// Why a request failed before or instead of reaching the filesystem.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The request is shorter than its arguments, or the reply does not fit.
    #[error("bad buffer: {0}")]
    Buffer(#[from] io::Error),
    /// `in_header.len` disagrees with the readable bytes.
    #[error("header says {header} bytes, chain holds {actual}")]
    LengthMismatch {
        /// The header's `len`.
        header: usize,
        /// The readable bytes.
        actual: usize,
    },
    /// A WRITE whose size disagrees with its payload, or exceeds `max_write`.
    #[error("write of {size} bytes with {payload} bytes of payload")]
    WriteSize {
        /// The WRITE's `size`.
        size: usize,
        /// The payload's bytes.
        payload: usize,
    },
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
    Protocol {
        /// Major version asked for.
        major: u32,
        /// Minor version asked for.
        minor: u32,
    },
    /// An opcode we do not serve.
    #[error("unsupported opcode {0}")]
    Opcode(u32),
    /// Operations the daemon was told not to serve (`ServerOptions`, e.g. `--no-xattr`).
    #[error("{0} are disabled")]
    Disabled(&'static str),
    /// The filesystem failed the operation (or a check answered as it would).
    #[error(transparent)]
    Fs(#[from] filesystem::Error),
    /// A lock request failed.
    #[error(transparent)]
    Lock(#[from] LockError),
}

impl RequestError {
    /// The errno the guest gets.
    pub fn errno(&self) -> i32 {
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
            RequestError::Opcode(_) | RequestError::Disabled(_) => libc::ENOSYS,
            RequestError::Fs(e) => e.errno(),
            RequestError::Lock(e) => e.errno(),
        }
    }

    /// Whether the request is malformed as a whole (its length or its extensions), which is
    /// reported even before INIT.
    pub fn is_framing(&self) -> bool {
        matches!(self, RequestError::LengthMismatch { .. } | RequestError::Extension(_))
    }
}

type Result<T> = std::result::Result<T, RequestError>;

/// Stack room for the names (and the larger decoded arguments) of one request. Nearly every name
/// section (one name, two for RENAME) fits the short array; the long one is used only for longer
/// sections (a symlink target). Neither is zeroed before it is needed, so a request without names
/// costs nothing.
pub struct NameBuf {
    short: Option<[u8; SHORT_NAMES]>,
    long: Option<[u8; limits::NAME_BUF]>,
    /// A SETATTR's decoded arguments (kept here, not in the [`Op`], which stays small).
    setattr: Option<SetAttr>,
}

impl NameBuf {
    /// Room, unused.
    #[inline]
    pub fn new() -> Self {
        NameBuf { short: None, long: None, setattr: None }
    }
}

impl Default for NameBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for NameBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NameBuf").finish_non_exhaustive()
    }
}

/// One decoded FUSE request: the operation with its arguments. `'a` borrows the request's
/// buffers (a WRITE's payload) and the [`NameBuf`] the names were copied into.
#[derive(Debug)]
pub enum Op<'a> {
    /// Start a session.
    Init(InitArgs),
    /// End the session.
    Destroy,
    /// Drop lookup references (no reply).
    Forget {
        /// References to drop.
        nlookup: u64,
    },
    /// Drop lookup references on many inodes (no reply): `count` [`abi::ForgetOne`]s, bounded by
    /// the bytes present.
    BatchForget {
        /// How many the kernel says.
        count: u32,
        /// The [`abi::ForgetOne`] array.
        forgets: Reader<'a>,
    },
    /// Interrupt a request (no reply).
    Interrupt {
        /// The interrupted request's unique.
        unique: u64,
    },
    /// Resolve `name` in the node.
    Lookup {
        /// A path component.
        name: &'a [u8],
    },
    /// Attributes.
    Getattr {
        /// The handle the request names, if any.
        fh: Option<u64>,
    },
    /// Change attributes.
    Setattr(&'a SetAttr),
    /// A symlink's target.
    Readlink,
    /// Create a symlink.
    Symlink {
        /// The new name.
        name: &'a [u8],
        /// Its target (without NUL).
        target: &'a [u8],
    },
    /// Create a node.
    Mknod(MknodArgs<'a>),
    /// Create a directory.
    Mkdir {
        /// The new name.
        name: &'a [u8],
        /// Permission bits.
        mode: u32,
        /// The caller's umask.
        umask: u32,
    },
    /// Remove a non-directory.
    Unlink {
        /// The name.
        name: &'a [u8],
    },
    /// Remove an empty directory.
    Rmdir {
        /// The name.
        name: &'a [u8],
    },
    /// RENAME or RENAME2 (`flags` checked: `RENAME_NOREPLACE`, `RENAME_EXCHANGE` or 0).
    Rename(RenameArgs<'a>),
    /// Hard link the inode `oldnodeid` as `name` in the node.
    Link {
        /// The inode to link.
        oldnodeid: u64,
        /// The new name.
        name: &'a [u8],
    },
    /// Open a file.
    Open {
        /// `open(2)` flags.
        flags: u32,
        /// Clear set-user-id on `O_TRUNC` ([`abi::OPEN_KILL_SUIDGID`]).
        kill_priv: bool,
    },
    /// Open a directory.
    Opendir {
        /// `open(2)` flags.
        flags: u32,
    },
    /// Read `size` bytes at `offset`.
    Read(ReadArgs),
    /// Write the payload at `offset`.
    Write {
        /// Where, how much (checked: `data.bytes_left()`, at most [`limits::MAX_WRITE`]) and how.
        args: WriteArgs,
        /// The payload, in the guest's buffers.
        data: Reader<'a>,
    },
    /// Filesystem statistics.
    Statfs,
    /// Close a file handle.
    Release {
        /// The handle.
        fh: u64,
        /// Its `open(2)` flags.
        flags: u32,
        /// The lock owner the kernel names (0: none).
        lock_owner: u64,
        /// `FUSE_RELEASE_FLOCK_UNLOCK`: the handle's flock lock goes too.
        flock_unlock: bool,
    },
    /// Close a directory handle.
    Releasedir {
        /// The handle.
        fh: u64,
        /// Its `open(2)` flags.
        flags: u32,
    },
    /// Make a file durable.
    Fsync {
        /// The handle.
        fh: u64,
        /// Data only.
        datasync: bool,
    },
    /// Make a directory durable.
    Fsyncdir {
        /// The handle.
        fh: u64,
        /// Data only.
        datasync: bool,
    },
    /// A descriptor of the handle is closed.
    Flush {
        /// The handle.
        fh: u64,
        /// The POSIX lock owner closing it.
        lock_owner: u64,
    },
    /// List a directory.
    Readdir {
        /// The handle.
        fh: u64,
        /// Where to continue.
        offset: u64,
        /// Most reply bytes.
        size: u32,
    },
    /// List a directory with lookups.
    Readdirplus {
        /// The handle.
        fh: u64,
        /// Where to continue.
        offset: u64,
        /// Most reply bytes.
        size: u32,
    },
    /// Check access.
    Access {
        /// `R_OK | W_OK | X_OK` or `F_OK`.
        mask: u32,
    },
    /// Create and open a file.
    Create(CreateArgs<'a>),
    /// Create and open an unnamed file.
    Tmpfile {
        /// Permission bits.
        mode: u32,
        /// `open(2)` flags.
        flags: u32,
        /// The caller's umask.
        umask: u32,
    },
    /// Allocate or deallocate space (`mode` checked: only known `FALLOC_FL_*` bits, a hole
    /// punched with `KEEP_SIZE`).
    Fallocate(FallocateArgs),
    /// Set an extended attribute.
    Setxattr {
        /// Its name and how to set it.
        args: SetxattrArgs<'a>,
        /// The value (at most [`limits::XATTR_SIZE_MAX`] bytes), in the guest's buffers.
        value: Reader<'a>,
    },
    /// Get an extended attribute.
    Getxattr {
        /// Its name.
        name: &'a [u8],
        /// The caller's buffer size (0: the size only).
        size: u32,
    },
    /// List extended attributes.
    Listxattr {
        /// The caller's buffer size (0: the size only).
        size: u32,
    },
    /// Remove an extended attribute.
    Removexattr {
        /// Its name.
        name: &'a [u8],
    },
    /// GETLK, SETLK or SETLKW.
    Lock(LockRequest),
    /// Reposition (`whence` checked: `SEEK_SET` to `SEEK_HOLE`).
    Lseek {
        /// The handle.
        fh: u64,
        /// The offset.
        offset: u64,
        /// `lseek(2)` whence.
        whence: u32,
    },
    /// Copy between files (flags checked: none; ranges checked not to wrap; `len` capped to what
    /// the 32-bit reply counts).
    CopyFileRange(CopyFileRangeArgs),
    /// Make the filesystem durable.
    Syncfs,
    /// Attributes with the birth time.
    Statx {
        /// The handle the request names, if any.
        fh: Option<u64>,
    },
}

/// A decoded request: the header's identity, the caller (with what its extensions add) and the
/// operation.
#[derive(Debug)]
pub struct Request<'a> {
    /// The request's id, echoed in the reply.
    pub unique: u64,
    /// The node it is about.
    pub nodeid: u64,
    /// The raw opcode ([`abi::opcode`]).
    pub opcode: u32,
    /// The caller.
    pub ctx: Context,
    /// What it asks.
    pub op: Op<'a>,
}

impl<'a> Request<'a> {
    /// Decodes the request whose header is `hdr` and whose arguments are the rest of `r` (the
    /// readable buffers after the header). Names go into `names`. `negotiated`: the session's
    /// `FUSE_INIT` flags (SETXATTR's argument size depends on them).
    pub fn parse(hdr: &InHeader, mut r: Reader<'a>, names: &'a mut NameBuf, negotiated: u64) -> Result<Self> {
        let actual = r.bytes_left() + size_of::<InHeader>();
        if hdr.len as usize != actual {
            return Err(RequestError::LengthMismatch { header: hdr.len as usize, actual });
        }
        let mut ctx = Context { uid: hdr.uid, gid: hdr.gid, pid: hdr.pid, supp_gid: None };
        // Request extensions (supplementary groups, security contexts) trail the arguments.
        let ext = usize::from(hdr.total_extlen) * 8;
        if ext != 0 {
            let args_len =
                r.bytes_left().checked_sub(ext).ok_or(RequestError::Extension("longer than the request"))?;
            let mut ext_r = r.clone();
            ext_r.consume(args_len)?;
            ctx.supp_gid = read_extensions(ext_r)?;
            r.truncate(args_len);
        }
        let op = decode(hdr.opcode, r, names, negotiated)?;
        Ok(Request { unique: hdr.unique, nodeid: hdr.nodeid, opcode: hdr.opcode, ctx, op })
    }

    /// Whether the request has no reply (FORGET, BATCH_FORGET, INTERRUPT): its writable buffers
    /// are never touched.
    pub fn is_no_reply(&self) -> bool {
        is_no_reply(self.opcode)
    }
}

/// Whether requests with `opcode` have no reply.
pub fn is_no_reply(op: u32) -> bool {
    matches!(op, opcode::FORGET | opcode::BATCH_FORGET | opcode::INTERRUPT)
}

fn decode<'a>(op: u32, r: Reader<'a>, names: &'a mut NameBuf, negotiated: u64) -> Result<Op<'a>> {
    match op {
        opcode::LOOKUP
        | opcode::SYMLINK
        | opcode::MKNOD
        | opcode::MKDIR
        | opcode::UNLINK
        | opcode::RMDIR
        | opcode::RENAME
        | opcode::RENAME2
        | opcode::LINK
        | opcode::CREATE
        | opcode::TMPFILE => decode_namespace(op, r, names),
        opcode::READ | opcode::WRITE | opcode::FALLOCATE | opcode::LSEEK | opcode::COPY_FILE_RANGE => {
            decode_data(op, r)
        }
        opcode::SETXATTR | opcode::GETXATTR | opcode::LISTXATTR | opcode::REMOVEXATTR => {
            decode_xattr(op, r, names, negotiated)
        }
        _ => decode_session_and_handles(op, r, names),
    }
}

/// The operations on names: creating, linking, removing and renaming entries.
fn decode_namespace<'a>(op: u32, mut r: Reader<'a>, names: &'a mut NameBuf) -> Result<Op<'a>> {
    Ok(match op {
        opcode::LOOKUP => Op::Lookup { name: split_name(read_names(&mut r, names)?, false)?.0 },
        opcode::SYMLINK => {
            let (name, rest) = split_name(read_names(&mut r, names)?, true)?;
            let target =
                rest.iter().position(|&b| b == 0).map(|n| &rest[..n]).ok_or(RequestError::BadName)?;
            Op::Symlink { name, target }
        }
        opcode::MKNOD => {
            let arg: abi::MknodIn = r.read_obj()?;
            let (name, _) = split_name(read_names(&mut r, names)?, true)?;
            Op::Mknod(MknodArgs { name, mode: arg.mode, rdev: arg.rdev, umask: arg.umask })
        }
        opcode::MKDIR => {
            let arg: abi::MkdirIn = r.read_obj()?;
            let (name, _) = split_name(read_names(&mut r, names)?, true)?;
            Op::Mkdir { name, mode: arg.mode, umask: arg.umask }
        }
        opcode::UNLINK => Op::Unlink { name: split_name(read_names(&mut r, names)?, false)?.0 },
        opcode::RMDIR => Op::Rmdir { name: split_name(read_names(&mut r, names)?, false)?.0 },
        opcode::RENAME | opcode::RENAME2 => {
            let (newdir, flags) = if op == opcode::RENAME {
                (r.read_obj::<abi::RenameIn>()?.newdir, 0)
            } else {
                let arg: abi::Rename2In = r.read_obj()?;
                (arg.newdir, arg.flags)
            };
            if flags & !limits::RENAME_KNOWN != 0 || flags == limits::RENAME_KNOWN {
                return Err(RequestError::Invalid);
            }
            let (oldname, rest) = split_name(read_names(&mut r, names)?, false)?;
            let (newname, _) = split_name(rest, true)?;
            Op::Rename(RenameArgs { oldname, newdir, newname, flags })
        }
        opcode::LINK => {
            let arg: abi::LinkIn = r.read_obj()?;
            let (name, _) = split_name(read_names(&mut r, names)?, true)?;
            Op::Link { oldnodeid: arg.oldnodeid, name }
        }
        opcode::CREATE => {
            let arg: abi::CreateIn = r.read_obj()?;
            let (name, _) = split_name(read_names(&mut r, names)?, true)?;
            let kill_priv = arg.open_flags & abi::OPEN_KILL_SUIDGID != 0;
            Op::Create(CreateArgs { name, mode: arg.mode, flags: arg.flags, umask: arg.umask, kill_priv })
        }
        opcode::TMPFILE => {
            let arg: abi::CreateIn = r.read_obj()?;
            // The kernel names the new dentry "/"; only the terminator is checked.
            if !read_names(&mut r, names)?.contains(&0) {
                return Err(RequestError::BadName);
            }
            Op::Tmpfile { mode: arg.mode, flags: arg.flags, umask: arg.umask }
        }
        other => return Err(RequestError::Opcode(other)),
    })
}

/// The operations on file data: transfers, allocation, seeking, copies.
fn decode_data<'a>(op: u32, mut r: Reader<'a>) -> Result<Op<'a>> {
    Ok(match op {
        opcode::READ => {
            let arg: abi::ReadIn = r.read_obj()?;
            Op::Read(ReadArgs { fh: arg.fh, offset: arg.offset, size: arg.size })
        }
        opcode::WRITE => {
            let arg: abi::WriteIn = r.read_obj()?;
            let size = arg.size as usize;
            if size != r.bytes_left() || arg.size > limits::MAX_WRITE {
                return Err(RequestError::WriteSize { size, payload: r.bytes_left() });
            }
            Op::Write {
                args: WriteArgs {
                    fh: arg.fh,
                    offset: arg.offset,
                    size: arg.size,
                    write_flags: arg.write_flags,
                    flags: arg.flags,
                },
                data: r,
            }
        }
        opcode::FALLOCATE => {
            let arg: abi::FallocateIn = r.read_obj()?;
            let punch = libc::FALLOC_FL_PUNCH_HOLE as u32;
            let keep = libc::FALLOC_FL_KEEP_SIZE as u32;
            // As vfs_fallocate: unknown bits, and a hole punched without KEEP_SIZE.
            if arg.mode & !limits::FALLOC_KNOWN != 0 || (arg.mode & punch != 0 && arg.mode & keep == 0) {
                return Err(filesystem::Error::NotSupported.into());
            }
            Op::Fallocate(FallocateArgs {
                fh: arg.fh,
                mode: arg.mode,
                offset: arg.offset,
                length: arg.length,
            })
        }
        opcode::LSEEK => {
            let arg: abi::LseekIn = r.read_obj()?;
            if arg.whence > limits::SEEK_MAX {
                return Err(filesystem::Error::InvalidArgument.into());
            }
            Op::Lseek { fh: arg.fh, offset: arg.offset, whence: arg.whence }
        }
        opcode::COPY_FILE_RANGE => {
            let arg: abi::CopyFileRangeIn = r.read_obj()?;
            // Ranges that wrap are refused before the length is capped to what a reply holds.
            if arg.off_in.checked_add(arg.len).is_none() || arg.off_out.checked_add(arg.len).is_none() {
                return Err(filesystem::Error::Overflow.into());
            }
            if arg.flags != 0 {
                return Err(filesystem::Error::InvalidArgument.into());
            }
            Op::CopyFileRange(CopyFileRangeArgs {
                fh_in: arg.fh_in,
                off_in: arg.off_in,
                nodeid_out: arg.nodeid_out,
                fh_out: arg.fh_out,
                off_out: arg.off_out,
                len: arg.len.min(limits::MAX_COPY_REPLY),
            })
        }
        other => return Err(RequestError::Opcode(other)),
    })
}

/// The extended attribute operations (SETXATTR's layout depends on `negotiated`).
fn decode_xattr<'a>(op: u32, mut r: Reader<'a>, names: &'a mut NameBuf, negotiated: u64) -> Result<Op<'a>> {
    Ok(match op {
        opcode::SETXATTR => {
            let ext = negotiated & abi::init::SETXATTR_EXT != 0;
            let mut arg = abi::SetxattrIn::default();
            let len = if ext { size_of::<abi::SetxattrIn>() } else { abi::COMPAT_SETXATTR_IN_SIZE };
            r.read_exact(&mut vm_memory::ByteValued::as_mut_slice(&mut arg)[..len])?;
            let known = (libc::XATTR_CREATE | libc::XATTR_REPLACE) as u32;
            if arg.flags & !known != 0 || arg.setxattr_flags & !abi::SETXATTR_ACL_KILL_SGID != 0 {
                return Err(RequestError::Invalid);
            }
            let name = read_xattr_name(&mut r, names)?;
            let size = arg.size as usize;
            if size > limits::XATTR_SIZE_MAX {
                return Err(filesystem::Error::TooBig.into());
            }
            if size != r.bytes_left() {
                return Err(RequestError::Invalid);
            }
            let acl_kill_sgid = (ext && negotiated & abi::init::POSIX_ACL != 0)
                .then_some(arg.setxattr_flags & abi::SETXATTR_ACL_KILL_SGID != 0);
            Op::Setxattr { args: SetxattrArgs { name, flags: arg.flags, acl_kill_sgid }, value: r }
        }
        opcode::GETXATTR => {
            let arg: abi::GetxattrIn = r.read_obj()?;
            Op::Getxattr { name: read_xattr_name(&mut r, names)?, size: arg.size }
        }
        opcode::LISTXATTR => Op::Listxattr { size: r.read_obj::<abi::GetxattrIn>()?.size },
        opcode::REMOVEXATTR => Op::Removexattr { name: read_xattr_name(&mut r, names)? },
        other => return Err(RequestError::Opcode(other)),
    })
}

/// The session's operations, attributes, handles, directories, locks and the rest.
fn decode_session_and_handles<'a>(op: u32, mut r: Reader<'a>, names: &'a mut NameBuf) -> Result<Op<'a>> {
    Ok(match op {
        opcode::INIT => {
            let arg: abi::InitInCompat = r.read_obj()?;
            let mut flags = u64::from(arg.flags);
            if arg.major == abi::KERNEL_VERSION
                && arg.minor >= abi::MIN_KERNEL_MINOR_VERSION
                && flags & abi::init::INIT_EXT != 0
            {
                // Since 7.36 the rest of fuse_init_in follows; it carries the upper 32 flag bits.
                let ext: abi::InitInExt = r.read_obj()?;
                flags |= u64::from(ext.flags2) << 32;
            }
            Op::Init(InitArgs { major: arg.major, minor: arg.minor, max_readahead: arg.max_readahead, flags })
        }
        opcode::DESTROY => Op::Destroy,
        opcode::FORGET => Op::Forget { nlookup: r.read_obj::<abi::ForgetIn>()?.nlookup },
        opcode::BATCH_FORGET => {
            let arg: abi::BatchForgetIn = r.read_obj()?;
            Op::BatchForget { count: arg.count, forgets: r }
        }
        opcode::INTERRUPT => Op::Interrupt { unique: r.read_obj::<abi::InterruptIn>()?.unique },
        opcode::GETATTR => {
            let arg: abi::GetattrIn = r.read_obj()?;
            Op::Getattr { fh: (arg.getattr_flags & abi::GETATTR_FH != 0).then_some(arg.fh) }
        }
        opcode::SETATTR => Op::Setattr(names.setattr.insert(decode_setattr(&r.read_obj()?)?)),
        opcode::READLINK => Op::Readlink,
        opcode::OPEN => {
            let arg: abi::OpenIn = r.read_obj()?;
            Op::Open { flags: arg.flags, kill_priv: arg.open_flags & abi::OPEN_KILL_SUIDGID != 0 }
        }
        opcode::OPENDIR => Op::Opendir { flags: r.read_obj::<abi::OpenIn>()?.flags },
        opcode::STATFS => Op::Statfs,
        opcode::RELEASE => {
            let arg: abi::ReleaseIn = r.read_obj()?;
            Op::Release {
                fh: arg.fh,
                flags: arg.flags,
                lock_owner: arg.lock_owner,
                flock_unlock: arg.release_flags & abi::RELEASE_FLOCK_UNLOCK != 0,
            }
        }
        opcode::RELEASEDIR => {
            let arg: abi::ReleaseIn = r.read_obj()?;
            Op::Releasedir { fh: arg.fh, flags: arg.flags }
        }
        opcode::FSYNC | opcode::FSYNCDIR => {
            let arg: abi::FsyncIn = r.read_obj()?;
            let datasync = arg.fsync_flags & abi::FSYNC_FDATASYNC != 0;
            if op == opcode::FSYNC {
                Op::Fsync { fh: arg.fh, datasync }
            } else {
                Op::Fsyncdir { fh: arg.fh, datasync }
            }
        }
        opcode::FLUSH => {
            let arg: abi::FlushIn = r.read_obj()?;
            Op::Flush { fh: arg.fh, lock_owner: arg.lock_owner }
        }
        opcode::READDIR | opcode::READDIRPLUS => {
            let arg: abi::ReadIn = r.read_obj()?;
            let (fh, offset, size) = (arg.fh, arg.offset, arg.size);
            if op == opcode::READDIR {
                Op::Readdir { fh, offset, size }
            } else {
                Op::Readdirplus { fh, offset, size }
            }
        }
        opcode::ACCESS => Op::Access { mask: r.read_obj::<abi::AccessIn>()?.mask },
        opcode::GETLK | opcode::SETLK | opcode::SETLKW => Op::Lock(decode_lock_request(op, &r.read_obj()?)?),
        opcode::SYNCFS => {
            let _arg: abi::SyncfsIn = r.read_obj()?;
            Op::Syncfs
        }
        opcode::STATX => {
            let arg: abi::StatxIn = r.read_obj()?;
            Op::Statx { fh: (arg.getattr_flags & abi::GETATTR_FH != 0).then_some(arg.fh) }
        }
        other => return Err(RequestError::Opcode(other)),
    })
}

/// The supplementary group the request extensions in `r` (all of `r`) carry: that of a
/// `FUSE_EXT_GROUPS` extension (the kernel sends one group; only the first is kept). Security
/// contexts (types up to `FUSE_MAX_NR_SECCTX`, sent only with `FUSE_SECURITY_CTX`, which we do
/// not negotiate) and types we do not know are skipped, as a newer kernel's extensions must not
/// break an older server. Malformed extensions (a size that is not a multiple of 8, below the
/// header, or past the end; a group list longer than its extension; two group extensions) are
/// `EINVAL`.
fn read_extensions(mut r: Reader<'_>) -> Result<Option<u32>> {
    const HEADER: usize = size_of::<abi::ExtHeader>();
    let mut supp_gid = None;
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
            supp_gid = Some(body.read_obj::<u32>()?);
        }
    }
    Ok(supp_gid)
}

/// Copies the rest of the arguments (the name section) into `buf`; at most
/// [`limits::NAME_BUF`] bytes.
fn read_names<'b>(r: &mut Reader<'_>, buf: &'b mut NameBuf) -> Result<&'b [u8]> {
    let n = r.bytes_left();
    let room: &mut [u8] = if n <= SHORT_NAMES {
        buf.short.insert([0; SHORT_NAMES])
    } else if n <= limits::NAME_BUF {
        buf.long.insert([0; limits::NAME_BUF])
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
/// [`limits::XATTR_NAME_MAX`] are `ERANGE`, as `setxattr(2)` has it; bytes after the NUL stay
/// unread.
fn read_xattr_name<'b>(r: &mut Reader<'_>, buf: &'b mut NameBuf) -> Result<&'b [u8]> {
    const ROOM: usize = limits::XATTR_NAME_MAX + 1;
    let buf = &mut buf.short.insert([0; SHORT_NAMES])[..ROOM];
    let n = r.bytes_left().min(ROOM);
    r.clone().read_exact(&mut buf[..n])?;
    let Some(end) = buf[..n].iter().position(|&b| b == 0) else {
        return Err(if n == ROOM { filesystem::Error::OutOfRange.into() } else { RequestError::BadName });
    };
    if end == 0 {
        return Err(filesystem::Error::OutOfRange.into());
    }
    r.consume(end + 1)?;
    Ok(&buf[..end])
}

fn decode_lock_request(op: u32, arg: &abi::LkIn) -> Result<LockRequest> {
    if arg.lk_flags & !abi::LK_FLOCK != 0 {
        return Err(RequestError::Invalid);
    }
    let flock = arg.lk_flags & abi::LK_FLOCK != 0;
    let lock = decode_lock(&arg.lk)?;
    let op = match op {
        opcode::GETLK if lock.typ == LockType::Unlock || flock => return Err(RequestError::Invalid),
        opcode::GETLK => LockOp::Get,
        opcode::SETLK => LockOp::Set,
        _ => LockOp::SetWait,
    };
    Ok(LockRequest { op, fh: arg.fh, owner: arg.owner, lock, flock })
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
        Ok(Some(SetTime::At(Timespec { sec: sec as i64, nsec })))
    };
    let ctime = if v & fattr::CTIME != 0 {
        if arg.ctimensec >= 1_000_000_000 {
            return Err(RequestError::Invalid);
        }
        Some(Timespec { sec: arg.ctime as i64, nsec: arg.ctimensec })
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

#[cfg(test)]
mod tests;
