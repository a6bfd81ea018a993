//! NFSv3 (RFC 1813), program 100003 version 3: the types the device uses, [`encode_args`] for
//! every procedure's arguments and [`decode_res`] for its results, in place.
//!
//! A READ reply's data is not decoded here: [`decode_read_head`] stops at the data's length so
//! that the connection can place the data itself (straight into the guest's buffers). A WRITE's
//! arguments end with the data's length; the connection sends the data after them.

use super::xdr::{Decoder, Encoder};
use super::WireError;

/// The NFS program number.
pub const PROGRAM: u32 = 100_003;
/// The NFS version spoken here.
pub const VERSION: u32 = 3;
/// Largest file handle (NFS3_FHSIZE).
pub const FHSIZE3: usize = 64;
/// Longest name accepted in a reply (READDIR): Linux's NAME_MAX is 255, the FUSE limit 1024.
pub const MAX_NAME: u32 = 1024;
/// Longest path (symlink target) accepted in a reply or sent.
pub const MAX_PATH: u32 = 4096;
/// Bytes of an encoded `fattr3`.
pub const FATTR3_SIZE: usize = 84;

/// ACCESS3 bits.
pub mod access {
    /// Read data or list a directory.
    pub const READ: u32 = 0x01;
    /// Look up a name in a directory.
    pub const LOOKUP: u32 = 0x02;
    /// Rewrite data or directory entries.
    pub const MODIFY: u32 = 0x04;
    /// Write past the end or add directory entries.
    pub const EXTEND: u32 = 0x08;
    /// Delete a directory entry.
    pub const DELETE: u32 = 0x10;
    /// Execute a file.
    pub const EXECUTE: u32 = 0x20;
}

/// An NFSv3 file handle: up to 64 opaque bytes, compared by value.
#[derive(Clone, Copy)]
pub struct Fh {
    len: u8,
    bytes: [u8; FHSIZE3],
}

impl Fh {
    /// A handle with these bytes, or `None` when there are more than [`FHSIZE3`].
    pub fn new(bytes: &[u8]) -> Option<Fh> {
        if bytes.len() > FHSIZE3 {
            return None;
        }
        let mut b = [0u8; FHSIZE3];
        b[..bytes.len()].copy_from_slice(bytes);
        Some(Fh { len: bytes.len() as u8, bytes: b })
    }

    /// The handle's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    fn decode(d: &mut Decoder<'_>) -> Result<Fh, WireError> {
        let b = d.opaque(FHSIZE3 as u32, "nfs_fh3")?;
        Ok(Fh::new(b).unwrap_or(Fh { len: 0, bytes: [0; FHSIZE3] }))
    }

    fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        e.opaque(self.as_bytes(), FHSIZE3 as u32)
    }
}

impl PartialEq for Fh {
    fn eq(&self, other: &Fh) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Fh {}

impl std::hash::Hash for Fh {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl std::fmt::Debug for Fh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fh(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// `nfstime3`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfsTime {
    /// Seconds since the epoch.
    pub sec: u32,
    /// Nanoseconds.
    pub nsec: u32,
}

impl NfsTime {
    fn decode(d: &mut Decoder<'_>) -> Result<NfsTime, WireError> {
        Ok(NfsTime { sec: d.u32()?, nsec: d.u32()? })
    }
    fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        e.u32(self.sec)?;
        e.u32(self.nsec)
    }
}

/// `ftype3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ftype {
    /// Regular file.
    Reg,
    /// Directory.
    Dir,
    /// Block device.
    Blk,
    /// Character device.
    Chr,
    /// Symbolic link.
    Lnk,
    /// Socket.
    Sock,
    /// Named pipe.
    Fifo,
}

impl Ftype {
    /// The wire value.
    pub fn to_u32(self) -> u32 {
        match self {
            Ftype::Reg => 1,
            Ftype::Dir => 2,
            Ftype::Blk => 3,
            Ftype::Chr => 4,
            Ftype::Lnk => 5,
            Ftype::Sock => 6,
            Ftype::Fifo => 7,
        }
    }

    /// From the wire value.
    pub fn from_u32(v: u32) -> Result<Ftype, WireError> {
        Ok(match v {
            1 => Ftype::Reg,
            2 => Ftype::Dir,
            3 => Ftype::Blk,
            4 => Ftype::Chr,
            5 => Ftype::Lnk,
            6 => Ftype::Sock,
            7 => Ftype::Fifo,
            value => return Err(WireError::BadValue { what: "ftype3", value }),
        })
    }
}

/// `fattr3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fattr {
    /// File type.
    pub ftype: Ftype,
    /// Permission bits (and setuid/setgid/sticky), without the type.
    pub mode: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Bytes of storage used.
    pub used: u64,
    /// Device numbers (major, minor) of a device file.
    pub rdev: (u32, u32),
    /// Filesystem id.
    pub fsid: u64,
    /// File id (the server's inode number).
    pub fileid: u64,
    /// Last access.
    pub atime: NfsTime,
    /// Last modification.
    pub mtime: NfsTime,
    /// Last status change.
    pub ctime: NfsTime,
}

impl Fattr {
    /// Decodes a `fattr3`.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Fattr, WireError> {
        Ok(Fattr {
            ftype: Ftype::from_u32(d.u32()?)?,
            mode: d.u32()?,
            nlink: d.u32()?,
            uid: d.u32()?,
            gid: d.u32()?,
            size: d.u64()?,
            used: d.u64()?,
            rdev: (d.u32()?, d.u32()?),
            fsid: d.u64()?,
            fileid: d.u64()?,
            atime: NfsTime::decode(d)?,
            mtime: NfsTime::decode(d)?,
            ctime: NfsTime::decode(d)?,
        })
    }

    /// Encodes a `fattr3` (servers, tests).
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        e.u32(self.ftype.to_u32())?;
        e.u32(self.mode)?;
        e.u32(self.nlink)?;
        e.u32(self.uid)?;
        e.u32(self.gid)?;
        e.u64(self.size)?;
        e.u64(self.used)?;
        e.u32(self.rdev.0)?;
        e.u32(self.rdev.1)?;
        e.u64(self.fsid)?;
        e.u64(self.fileid)?;
        self.atime.encode(e)?;
        self.mtime.encode(e)?;
        self.ctime.encode(e)
    }
}

/// `post_op_attr`.
pub fn decode_post_op_attr(d: &mut Decoder<'_>) -> Result<Option<Fattr>, WireError> {
    if d.bool()? {
        Ok(Some(Fattr::decode(d)?))
    } else {
        Ok(None)
    }
}

/// `wcc_data`: the pre-op attributes are skipped, the post-op ones returned.
fn decode_wcc(d: &mut Decoder<'_>) -> Result<Option<Fattr>, WireError> {
    if d.bool()? {
        d.skip(8 + 8 + 8)?; // size, mtime, ctime
    }
    decode_post_op_attr(d)
}

fn decode_post_op_fh(d: &mut Decoder<'_>) -> Result<Option<Fh>, WireError> {
    if d.bool()? {
        Ok(Some(Fh::decode(d)?))
    } else {
        Ok(None)
    }
}

/// `set_atime` / `set_mtime`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SetTime {
    /// Leave the time alone.
    #[default]
    DontChange,
    /// The server's current time.
    ServerTime,
    /// This time.
    ClientTime(NfsTime),
}

/// `sattr3`: what SETATTR (and the creating procedures) set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sattr {
    /// Permission bits.
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Size (truncate or extend).
    pub size: Option<u64>,
    /// Access time.
    pub atime: SetTime,
    /// Modification time.
    pub mtime: SetTime,
}

impl Sattr {
    fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        for v in [self.mode, self.uid, self.gid] {
            e.bool(v.is_some())?;
            if let Some(v) = v {
                e.u32(v)?;
            }
        }
        e.bool(self.size.is_some())?;
        if let Some(s) = self.size {
            e.u64(s)?;
        }
        for t in [self.atime, self.mtime] {
            match t {
                SetTime::DontChange => e.u32(0)?,
                SetTime::ServerTime => e.u32(1)?,
                SetTime::ClientTime(t) => {
                    e.u32(2)?;
                    t.encode(e)?;
                }
            }
        }
        Ok(())
    }
}

/// `stable_how`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stable {
    /// The server may cache the data until a COMMIT.
    Unstable,
    /// Data on stable storage, metadata maybe not.
    DataSync,
    /// Data and metadata on stable storage.
    FileSync,
}

impl Stable {
    fn to_u32(self) -> u32 {
        match self {
            Stable::Unstable => 0,
            Stable::DataSync => 1,
            Stable::FileSync => 2,
        }
    }
    fn from_u32(v: u32) -> Result<Stable, WireError> {
        Ok(match v {
            0 => Stable::Unstable,
            1 => Stable::DataSync,
            2 => Stable::FileSync,
            value => return Err(WireError::BadValue { what: "stable_how", value }),
        })
    }
}

/// `createhow3`.
#[derive(Clone, Copy, Debug)]
pub enum CreateHow<'a> {
    /// Create, or open what exists.
    Unchecked(&'a Sattr),
    /// Create; fail with NFS3ERR_EXIST if the name exists.
    Guarded(&'a Sattr),
    /// Exclusive create with this verifier (set the attributes with a SETATTR after).
    Exclusive([u8; 8]),
}

/// `nfsstat3` other than NFS3_OK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Nfsstat {
    Perm,
    NoEnt,
    Io,
    Nxio,
    Acces,
    Exist,
    Xdev,
    NoDev,
    NotDir,
    IsDir,
    Inval,
    FBig,
    NoSpc,
    Rofs,
    MLink,
    NameTooLong,
    NotEmpty,
    DQuot,
    Stale,
    Remote,
    BadHandle,
    NotSync,
    BadCookie,
    NotSupp,
    TooSmall,
    ServerFault,
    BadType,
    Jukebox,
    /// A value RFC 1813 does not define.
    Other(u32),
}

impl Nfsstat {
    /// From a non-zero wire value.
    pub fn from_u32(v: u32) -> Nfsstat {
        match v {
            1 => Nfsstat::Perm,
            2 => Nfsstat::NoEnt,
            5 => Nfsstat::Io,
            6 => Nfsstat::Nxio,
            13 => Nfsstat::Acces,
            17 => Nfsstat::Exist,
            18 => Nfsstat::Xdev,
            19 => Nfsstat::NoDev,
            20 => Nfsstat::NotDir,
            21 => Nfsstat::IsDir,
            22 => Nfsstat::Inval,
            27 => Nfsstat::FBig,
            28 => Nfsstat::NoSpc,
            30 => Nfsstat::Rofs,
            31 => Nfsstat::MLink,
            63 => Nfsstat::NameTooLong,
            66 => Nfsstat::NotEmpty,
            69 => Nfsstat::DQuot,
            70 => Nfsstat::Stale,
            71 => Nfsstat::Remote,
            10001 => Nfsstat::BadHandle,
            10002 => Nfsstat::NotSync,
            10003 => Nfsstat::BadCookie,
            10004 => Nfsstat::NotSupp,
            10005 => Nfsstat::TooSmall,
            10006 => Nfsstat::ServerFault,
            10007 => Nfsstat::BadType,
            10008 => Nfsstat::Jukebox,
            other => Nfsstat::Other(other),
        }
    }

    /// The wire value.
    pub fn to_u32(self) -> u32 {
        match self {
            Nfsstat::Perm => 1,
            Nfsstat::NoEnt => 2,
            Nfsstat::Io => 5,
            Nfsstat::Nxio => 6,
            Nfsstat::Acces => 13,
            Nfsstat::Exist => 17,
            Nfsstat::Xdev => 18,
            Nfsstat::NoDev => 19,
            Nfsstat::NotDir => 20,
            Nfsstat::IsDir => 21,
            Nfsstat::Inval => 22,
            Nfsstat::FBig => 27,
            Nfsstat::NoSpc => 28,
            Nfsstat::Rofs => 30,
            Nfsstat::MLink => 31,
            Nfsstat::NameTooLong => 63,
            Nfsstat::NotEmpty => 66,
            Nfsstat::DQuot => 69,
            Nfsstat::Stale => 70,
            Nfsstat::Remote => 71,
            Nfsstat::BadHandle => 10001,
            Nfsstat::NotSync => 10002,
            Nfsstat::BadCookie => 10003,
            Nfsstat::NotSupp => 10004,
            Nfsstat::TooSmall => 10005,
            Nfsstat::ServerFault => 10006,
            Nfsstat::BadType => 10007,
            Nfsstat::Jukebox => 10008,
            Nfsstat::Other(v) => v,
        }
    }

    /// The Linux errno a FUSE reply carries for this status (as the Linux NFS client maps them
    /// for its callers: a bad handle is stale, a server fault an I/O error, JUKEBOX "try again").
    pub fn errno(self) -> i32 {
        match self {
            Nfsstat::Perm => libc::EPERM,
            Nfsstat::NoEnt => libc::ENOENT,
            Nfsstat::Io => libc::EIO,
            Nfsstat::Nxio => libc::ENXIO,
            Nfsstat::Acces => libc::EACCES,
            Nfsstat::Exist => libc::EEXIST,
            Nfsstat::Xdev => libc::EXDEV,
            Nfsstat::NoDev => libc::ENODEV,
            Nfsstat::NotDir => libc::ENOTDIR,
            Nfsstat::IsDir => libc::EISDIR,
            Nfsstat::Inval => libc::EINVAL,
            Nfsstat::FBig => libc::EFBIG,
            Nfsstat::NoSpc => libc::ENOSPC,
            Nfsstat::Rofs => libc::EROFS,
            Nfsstat::MLink => libc::EMLINK,
            Nfsstat::NameTooLong => libc::ENAMETOOLONG,
            Nfsstat::NotEmpty => libc::ENOTEMPTY,
            Nfsstat::DQuot => libc::EDQUOT,
            Nfsstat::Stale | Nfsstat::BadHandle => libc::ESTALE,
            Nfsstat::Remote => libc::EREMOTE,
            Nfsstat::NotSupp => libc::EOPNOTSUPP,
            Nfsstat::BadCookie | Nfsstat::TooSmall | Nfsstat::BadType => libc::EINVAL,
            Nfsstat::Jukebox => libc::EAGAIN,
            Nfsstat::NotSync | Nfsstat::ServerFault | Nfsstat::Other(_) => libc::EIO,
        }
    }
}

/// NFSv3 procedure numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Proc {
    Null = 0,
    Getattr = 1,
    Setattr = 2,
    Lookup = 3,
    Access = 4,
    Readlink = 5,
    Read = 6,
    Write = 7,
    Create = 8,
    Mkdir = 9,
    Symlink = 10,
    Mknod = 11,
    Remove = 12,
    Rmdir = 13,
    Rename = 14,
    Link = 15,
    Readdir = 16,
    Readdirplus = 17,
    Fsstat = 18,
    Fsinfo = 19,
    Commit = 21,
}

impl Proc {
    /// Every procedure the backend calls (PATHCONF and the like it never does), in number order.
    pub const ALL: [Proc; 21] = [
        Proc::Null,
        Proc::Getattr,
        Proc::Setattr,
        Proc::Lookup,
        Proc::Access,
        Proc::Readlink,
        Proc::Read,
        Proc::Write,
        Proc::Create,
        Proc::Mkdir,
        Proc::Symlink,
        Proc::Mknod,
        Proc::Remove,
        Proc::Rmdir,
        Proc::Rename,
        Proc::Link,
        Proc::Readdir,
        Proc::Readdirplus,
        Proc::Fsstat,
        Proc::Fsinfo,
        Proc::Commit,
    ];
}

/// One call's arguments, borrowed from the FUSE request. `Conn::call` encodes them.
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub enum Args<'a> {
    Null,
    Getattr {
        fh: &'a Fh,
    },
    /// `guard_ctime`: only if the object's ctime is still this (sattrguard3).
    Setattr {
        fh: &'a Fh,
        attr: &'a Sattr,
        guard_ctime: Option<NfsTime>,
    },
    Lookup {
        dir: &'a Fh,
        name: &'a [u8],
    },
    Access {
        fh: &'a Fh,
        mask: u32,
    },
    Readlink {
        fh: &'a Fh,
    },
    Read {
        fh: &'a Fh,
        offset: u64,
        count: u32,
    },
    /// The data is NOT here: Conn asks `Sink::payload(tag)` for it each time it (re)sends.
    Write {
        fh: &'a Fh,
        offset: u64,
        count: u32,
        stable: Stable,
    },
    Create {
        dir: &'a Fh,
        name: &'a [u8],
        how: CreateHow<'a>,
    },
    Mkdir {
        dir: &'a Fh,
        name: &'a [u8],
        attr: &'a Sattr,
    },
    Symlink {
        dir: &'a Fh,
        name: &'a [u8],
        attr: &'a Sattr,
        target: &'a [u8],
    },
    /// `ftype`: Chr, Blk, Sock or Fifo; `rdev` is sent for Chr and Blk.
    Mknod {
        dir: &'a Fh,
        name: &'a [u8],
        ftype: Ftype,
        attr: &'a Sattr,
        rdev: (u32, u32),
    },
    Remove {
        dir: &'a Fh,
        name: &'a [u8],
    },
    Rmdir {
        dir: &'a Fh,
        name: &'a [u8],
    },
    Rename {
        from_dir: &'a Fh,
        from_name: &'a [u8],
        to_dir: &'a Fh,
        to_name: &'a [u8],
    },
    Link {
        fh: &'a Fh,
        dir: &'a Fh,
        name: &'a [u8],
    },
    Readdir {
        dir: &'a Fh,
        cookie: u64,
        verf: [u8; 8],
        count: u32,
    },
    Readdirplus {
        dir: &'a Fh,
        cookie: u64,
        verf: [u8; 8],
        dircount: u32,
        maxcount: u32,
    },
    Fsstat {
        fh: &'a Fh,
    },
    Fsinfo {
        fh: &'a Fh,
    },
    Commit {
        fh: &'a Fh,
        offset: u64,
        count: u32,
    },
}

impl Args<'_> {
    /// The procedure these arguments are for.
    pub fn proc(&self) -> Proc {
        match self {
            Args::Null => Proc::Null,
            Args::Getattr { .. } => Proc::Getattr,
            Args::Setattr { .. } => Proc::Setattr,
            Args::Lookup { .. } => Proc::Lookup,
            Args::Access { .. } => Proc::Access,
            Args::Readlink { .. } => Proc::Readlink,
            Args::Read { .. } => Proc::Read,
            Args::Write { .. } => Proc::Write,
            Args::Create { .. } => Proc::Create,
            Args::Mkdir { .. } => Proc::Mkdir,
            Args::Symlink { .. } => Proc::Symlink,
            Args::Mknod { .. } => Proc::Mknod,
            Args::Remove { .. } => Proc::Remove,
            Args::Rmdir { .. } => Proc::Rmdir,
            Args::Rename { .. } => Proc::Rename,
            Args::Link { .. } => Proc::Link,
            Args::Readdir { .. } => Proc::Readdir,
            Args::Readdirplus { .. } => Proc::Readdirplus,
            Args::Fsstat { .. } => Proc::Fsstat,
            Args::Fsinfo { .. } => Proc::Fsinfo,
            Args::Commit { .. } => Proc::Commit,
        }
    }
}

fn diropargs(e: &mut Encoder<'_>, dir: &Fh, name: &[u8]) -> Result<(), WireError> {
    dir.encode(e)?;
    e.opaque(name, MAX_NAME)
}

/// Encodes `args` (after the RPC call header). A WRITE ends with the data's length: the caller
/// sends `count` bytes of data and their padding after it.
pub fn encode_args(e: &mut Encoder<'_>, args: &Args<'_>) -> Result<(), WireError> {
    match *args {
        Args::Null => Ok(()),
        Args::Getattr { fh } | Args::Readlink { fh } | Args::Fsstat { fh } | Args::Fsinfo { fh } => {
            fh.encode(e)
        }
        Args::Setattr { fh, attr, guard_ctime } => {
            fh.encode(e)?;
            attr.encode(e)?;
            e.bool(guard_ctime.is_some())?;
            match guard_ctime {
                Some(t) => t.encode(e),
                None => Ok(()),
            }
        }
        Args::Lookup { dir, name } | Args::Remove { dir, name } | Args::Rmdir { dir, name } => {
            diropargs(e, dir, name)
        }
        Args::Access { fh, mask } => {
            fh.encode(e)?;
            e.u32(mask)
        }
        Args::Read { fh, offset, count } | Args::Commit { fh, offset, count } => {
            fh.encode(e)?;
            e.u64(offset)?;
            e.u32(count)
        }
        Args::Write { fh, offset, count, stable } => {
            fh.encode(e)?;
            e.u64(offset)?;
            e.u32(count)?;
            e.u32(stable.to_u32())?;
            e.u32(count)
        }
        Args::Create { dir, name, how } => {
            diropargs(e, dir, name)?;
            match how {
                CreateHow::Unchecked(a) => {
                    e.u32(0)?;
                    a.encode(e)
                }
                CreateHow::Guarded(a) => {
                    e.u32(1)?;
                    a.encode(e)
                }
                CreateHow::Exclusive(v) => {
                    e.u32(2)?;
                    e.fixed(&v)
                }
            }
        }
        Args::Mkdir { dir, name, attr } => {
            diropargs(e, dir, name)?;
            attr.encode(e)
        }
        Args::Symlink { dir, name, attr, target } => {
            diropargs(e, dir, name)?;
            attr.encode(e)?;
            e.opaque(target, MAX_PATH)
        }
        Args::Mknod { dir, name, ftype, attr, rdev } => {
            diropargs(e, dir, name)?;
            e.u32(ftype.to_u32())?;
            match ftype {
                Ftype::Chr | Ftype::Blk => {
                    attr.encode(e)?;
                    e.u32(rdev.0)?;
                    e.u32(rdev.1)
                }
                Ftype::Sock | Ftype::Fifo => attr.encode(e),
                _ => Ok(()),
            }
        }
        Args::Rename { from_dir, from_name, to_dir, to_name } => {
            diropargs(e, from_dir, from_name)?;
            diropargs(e, to_dir, to_name)
        }
        Args::Link { fh, dir, name } => {
            fh.encode(e)?;
            diropargs(e, dir, name)
        }
        Args::Readdir { dir, cookie, verf, count } => {
            dir.encode(e)?;
            e.u64(cookie)?;
            e.fixed(&verf)?;
            e.u32(count)
        }
        Args::Readdirplus { dir, cookie, verf, dircount, maxcount } => {
            dir.encode(e)?;
            e.u64(cookie)?;
            e.fixed(&verf)?;
            e.u32(dircount)?;
            e.u32(maxcount)
        }
    }
}

/// A decoded reply, borrowed from the connection's receive buffer (valid only inside
/// `Sink::done`). Pre-op wcc attributes are dropped.
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub enum Res<'a> {
    Null,
    /// GETATTR.
    Attr(Fattr),
    Setattr {
        attr: Option<Fattr>,
    },
    Lookup {
        fh: Fh,
        attr: Option<Fattr>,
        dir_attr: Option<Fattr>,
    },
    Access {
        access: u32,
        attr: Option<Fattr>,
    },
    Readlink {
        target: &'a [u8],
        attr: Option<Fattr>,
    },
    /// The data already went into the Writer that `Sink::read_buffer(tag)` gave (or was dropped
    /// if it gave none); `count` bytes were placed (or dropped).
    Read {
        count: u32,
        eof: bool,
        attr: Option<Fattr>,
    },
    Write {
        count: u32,
        committed: Stable,
        verf: [u8; 8],
        attr: Option<Fattr>,
    },
    /// CREATE, MKDIR, SYMLINK, MKNOD: the handle and attributes are optional in RFC 1813.
    Created {
        fh: Option<Fh>,
        attr: Option<Fattr>,
        dir_attr: Option<Fattr>,
    },
    /// REMOVE, RMDIR (the directory's attributes), RENAME (the target directory's), LINK (the
    /// file's).
    Changed {
        attr: Option<Fattr>,
    },
    /// READDIR / READDIRPLUS: iterate entries in place.
    Dir {
        verf: [u8; 8],
        entries: DirEntries<'a>,
        eof: bool,
        dir_attr: Option<Fattr>,
    },
    Fsstat {
        tbytes: u64,
        fbytes: u64,
        abytes: u64,
        tfiles: u64,
        ffiles: u64,
        afiles: u64,
    },
    Fsinfo {
        rtmax: u32,
        rtpref: u32,
        wtmax: u32,
        wtpref: u32,
        dtpref: u32,
        maxfilesize: u64,
        properties: u32,
    },
    Commit {
        verf: [u8; 8],
    },
    /// Any procedure failing with a status (NFS3ERR_*); post-op attr of the object if sent.
    Failed {
        status: Nfsstat,
        attr: Option<Fattr>,
    },
}

/// One READDIR(PLUS) entry, borrowed from the reply.
#[derive(Clone, Copy, Debug)]
pub struct DirEntry3<'a> {
    /// The server's file id.
    pub fileid: u64,
    /// The name.
    pub name: &'a [u8],
    /// Cookie to continue after this entry.
    pub cookie: u64,
    /// READDIRPLUS: attributes, if sent.
    pub attr: Option<Fattr>,
    /// READDIRPLUS: handle, if sent.
    pub fh: Option<Fh>,
}

/// An iterator over READDIR(PLUS) entries, decoding in place. The whole list was checked once
/// when the reply was decoded, so an error here means a bug, but it is reported, not assumed.
#[derive(Clone, Debug)]
pub struct DirEntries<'a> {
    d: Decoder<'a>,
    plus: bool,
    done: bool,
}

impl<'a> DirEntries<'a> {
    fn entry(&mut self) -> Result<Option<DirEntry3<'a>>, WireError> {
        let d = &mut self.d;
        if !d.bool()? {
            return Ok(None);
        }
        let fileid = d.u64()?;
        let name = d.opaque(MAX_NAME, "filename3")?;
        let cookie = d.u64()?;
        let (attr, fh) =
            if self.plus { (decode_post_op_attr(d)?, decode_post_op_fh(d)?) } else { (None, None) };
        Ok(Some(DirEntry3 { fileid, name, cookie, attr, fh }))
    }
}

impl<'a> Iterator for DirEntries<'a> {
    type Item = Result<DirEntry3<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.entry() {
            Ok(Some(e)) => Some(Ok(e)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// The part of a READ reply before its data.
#[derive(Clone, Copy, Debug)]
pub enum ReadHead {
    /// NFS3_OK: `count` and `eof` as sent, then `len` bytes of data (and padding) follow.
    Ok {
        /// Attributes of the file.
        attr: Option<Fattr>,
        /// Bytes read (the server's `count`).
        count: u32,
        /// End of file reached.
        eof: bool,
        /// Length of the data opaque (must equal `count`).
        len: u32,
    },
    /// A failure: the whole reply (nothing follows).
    Failed {
        /// The status.
        status: Nfsstat,
        /// Attributes of the file.
        attr: Option<Fattr>,
    },
}

/// Decodes a READ reply up to its data. Fails if the data's length disagrees with `count` or
/// exceeds `asked` (a server may not return more than asked).
pub fn decode_read_head(d: &mut Decoder<'_>, asked: u32) -> Result<ReadHead, WireError> {
    let status = d.u32()?;
    let attr = decode_post_op_attr(d)?;
    if status != 0 {
        return Ok(ReadHead::Failed { status: Nfsstat::from_u32(status), attr });
    }
    let count = d.u32()?;
    let eof = d.bool()?;
    let len = d.u32()?;
    if len > asked {
        return Err(WireError::TooLong { what: "READ data", len, max: asked });
    }
    if len != count {
        return Err(WireError::BadValue { what: "READ count (data length differs)", value: count });
    }
    Ok(ReadHead::Ok { attr, count, eof, len })
}

/// Decodes the results of `proc` (after the RPC reply header): everything but READ, whose data
/// the connection places itself (see [`decode_read_head`]). Every byte must be used.
pub fn decode_res<'a>(proc: Proc, d: &mut Decoder<'a>) -> Result<Res<'a>, WireError> {
    let res = decode_body(proc, d)?;
    d.finish()?;
    Ok(res)
}

fn decode_body<'a>(proc: Proc, d: &mut Decoder<'a>) -> Result<Res<'a>, WireError> {
    if proc == Proc::Null {
        return Ok(Res::Null);
    }
    let status = d.u32()?;
    let failed = |attr| Ok(Res::Failed { status: Nfsstat::from_u32(status), attr });
    let ok = status == 0;
    match proc {
        Proc::Null => Ok(Res::Null),
        Proc::Getattr => {
            if ok {
                Ok(Res::Attr(Fattr::decode(d)?))
            } else {
                failed(None)
            }
        }
        Proc::Setattr => {
            let attr = decode_wcc(d)?;
            if ok {
                Ok(Res::Setattr { attr })
            } else {
                failed(attr)
            }
        }
        Proc::Lookup => {
            if ok {
                let fh = Fh::decode(d)?;
                let attr = decode_post_op_attr(d)?;
                let dir_attr = decode_post_op_attr(d)?;
                Ok(Res::Lookup { fh, attr, dir_attr })
            } else {
                failed(decode_post_op_attr(d)?)
            }
        }
        Proc::Access => {
            let attr = decode_post_op_attr(d)?;
            if ok {
                Ok(Res::Access { access: d.u32()?, attr })
            } else {
                failed(attr)
            }
        }
        Proc::Readlink => {
            let attr = decode_post_op_attr(d)?;
            if ok {
                Ok(Res::Readlink { target: d.opaque(MAX_PATH, "nfspath3")?, attr })
            } else {
                failed(attr)
            }
        }
        Proc::Read => {
            // Whole-buffer decoding of a READ (the data is skipped; the connection places it).
            let attr = decode_post_op_attr(d)?;
            if ok {
                let count = d.u32()?;
                let eof = d.bool()?;
                let data = d.opaque(u32::MAX, "READ data")?;
                if data.len() != count as usize {
                    return Err(WireError::BadValue {
                        what: "READ count (data length differs)",
                        value: count,
                    });
                }
                Ok(Res::Read { count, eof, attr })
            } else {
                failed(attr)
            }
        }
        Proc::Write => {
            let attr = decode_wcc(d)?;
            if ok {
                let count = d.u32()?;
                let committed = Stable::from_u32(d.u32()?)?;
                let verf = d.array::<8>()?;
                Ok(Res::Write { count, committed, verf, attr })
            } else {
                failed(attr)
            }
        }
        Proc::Create | Proc::Mkdir | Proc::Symlink | Proc::Mknod => {
            if ok {
                let fh = decode_post_op_fh(d)?;
                let attr = decode_post_op_attr(d)?;
                let dir_attr = decode_wcc(d)?;
                Ok(Res::Created { fh, attr, dir_attr })
            } else {
                failed(decode_wcc(d)?)
            }
        }
        Proc::Remove | Proc::Rmdir => {
            let attr = decode_wcc(d)?;
            if ok {
                Ok(Res::Changed { attr })
            } else {
                failed(attr)
            }
        }
        Proc::Rename => {
            let _from = decode_wcc(d)?;
            let attr = decode_wcc(d)?;
            if ok {
                Ok(Res::Changed { attr })
            } else {
                failed(attr)
            }
        }
        Proc::Link => {
            let attr = decode_post_op_attr(d)?;
            let _dir = decode_wcc(d)?;
            if ok {
                Ok(Res::Changed { attr })
            } else {
                failed(attr)
            }
        }
        Proc::Readdir | Proc::Readdirplus => {
            let dir_attr = decode_post_op_attr(d)?;
            if !ok {
                return failed(dir_attr);
            }
            let verf = d.array::<8>()?;
            let entries = DirEntries { d: d.clone(), plus: proc == Proc::Readdirplus, done: false };
            // Check the whole list once (and find `eof` after it); entries are decoded again,
            // in place, by whoever iterates.
            let mut walk = entries.clone();
            while walk.entry()?.is_some() {}
            *d = walk.d;
            let eof = d.bool()?;
            Ok(Res::Dir { verf, entries, eof, dir_attr })
        }
        Proc::Fsstat => {
            let attr = decode_post_op_attr(d)?;
            if !ok {
                return failed(attr);
            }
            let r = Res::Fsstat {
                tbytes: d.u64()?,
                fbytes: d.u64()?,
                abytes: d.u64()?,
                tfiles: d.u64()?,
                ffiles: d.u64()?,
                afiles: d.u64()?,
            };
            let _invarsec = d.u32()?;
            Ok(r)
        }
        Proc::Fsinfo => {
            let attr = decode_post_op_attr(d)?;
            if !ok {
                return failed(attr);
            }
            let rtmax = d.u32()?;
            let rtpref = d.u32()?;
            let _rtmult = d.u32()?;
            let wtmax = d.u32()?;
            let wtpref = d.u32()?;
            let _wtmult = d.u32()?;
            let dtpref = d.u32()?;
            let maxfilesize = d.u64()?;
            let _time_delta = NfsTime::decode(d)?;
            let properties = d.u32()?;
            Ok(Res::Fsinfo { rtmax, rtpref, wtmax, wtpref, dtpref, maxfilesize, properties })
        }
        Proc::Commit => {
            let attr = decode_wcc(d)?;
            if ok {
                Ok(Res::Commit { verf: d.array::<8>()? })
            } else {
                failed(attr)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fattr(fileid: u64) -> Fattr {
        let t = NfsTime { sec: 10, nsec: 20 };
        Fattr {
            ftype: Ftype::Dir,
            mode: 0o755,
            nlink: 2,
            uid: 1,
            gid: 2,
            size: 4096,
            used: 8192,
            rdev: (3, 4),
            fsid: 5,
            fileid,
            atime: t,
            mtime: t,
            ctime: t,
        }
    }

    fn enc(f: impl FnOnce(&mut Encoder<'_>) -> Result<(), WireError>) -> Vec<u8> {
        let mut buf = vec![0u8; 8192];
        let mut e = Encoder::new(&mut buf);
        f(&mut e).unwrap();
        let n = e.position();
        buf.truncate(n);
        buf
    }

    fn post_op(e: &mut Encoder<'_>, a: Option<&Fattr>) -> Result<(), WireError> {
        e.bool(a.is_some())?;
        match a {
            Some(a) => a.encode(e),
            None => Ok(()),
        }
    }

    fn wcc(e: &mut Encoder<'_>, a: Option<&Fattr>) -> Result<(), WireError> {
        e.bool(true)?; // pre-op: size, mtime, ctime
        e.u64(1)?;
        e.u64(2)?;
        e.u64(3)?;
        post_op(e, a)
    }

    /// A valid NFS3_OK reply body for every procedure.
    fn ok_reply(proc: Proc) -> Vec<u8> {
        let a = fattr(9);
        let fh = Fh::new(&[7; 20]).unwrap();
        enc(|e| {
            if proc == Proc::Null {
                return Ok(());
            }
            e.u32(0)?;
            match proc {
                Proc::Null => Ok(()),
                Proc::Getattr => a.encode(e),
                Proc::Setattr | Proc::Remove | Proc::Rmdir => wcc(e, Some(&a)),
                Proc::Lookup => {
                    e.opaque(fh.as_bytes(), 64)?;
                    post_op(e, Some(&a))?;
                    post_op(e, None)
                }
                Proc::Access => {
                    post_op(e, Some(&a))?;
                    e.u32(0x1f)
                }
                Proc::Readlink => {
                    post_op(e, None)?;
                    e.opaque(b"/target/x", MAX_PATH)
                }
                Proc::Read => {
                    post_op(e, Some(&a))?;
                    e.u32(5)?;
                    e.bool(true)?;
                    e.opaque(b"hello", 100)
                }
                Proc::Write => {
                    wcc(e, Some(&a))?;
                    e.u32(100)?;
                    e.u32(1)?;
                    e.fixed(&[9; 8])
                }
                Proc::Create | Proc::Mkdir | Proc::Symlink | Proc::Mknod => {
                    e.bool(true)?;
                    e.opaque(fh.as_bytes(), 64)?;
                    post_op(e, Some(&a))?;
                    wcc(e, None)
                }
                Proc::Rename => {
                    wcc(e, None)?;
                    wcc(e, Some(&a))
                }
                Proc::Link => {
                    post_op(e, Some(&a))?;
                    wcc(e, None)
                }
                Proc::Readdir | Proc::Readdirplus => {
                    post_op(e, Some(&a))?;
                    e.fixed(&[1; 8])?;
                    for (i, name) in [&b"a"[..], b"bcde", b"f"].iter().enumerate() {
                        e.bool(true)?;
                        e.u64(100 + i as u64)?;
                        e.opaque(name, MAX_NAME)?;
                        e.u64(i as u64 + 1)?;
                        if proc == Proc::Readdirplus {
                            post_op(e, if i == 1 { None } else { Some(&a) })?;
                            e.bool(i != 2)?;
                            if i != 2 {
                                e.opaque(&[i as u8; 8], 64)?;
                            }
                        }
                    }
                    e.bool(false)?;
                    e.bool(true)
                }
                Proc::Fsstat => {
                    post_op(e, None)?;
                    for v in 1..=6u64 {
                        e.u64(v)?;
                    }
                    e.u32(0)
                }
                Proc::Fsinfo => {
                    post_op(e, None)?;
                    for v in [1u32 << 20, 1 << 16, 4096, 1 << 20, 1 << 16, 4096, 8192] {
                        e.u32(v)?;
                    }
                    e.u64(u64::MAX)?;
                    e.u32(0)?;
                    e.u32(1)?;
                    e.u32(0x1b)
                }
                Proc::Commit => {
                    wcc(e, None)?;
                    e.fixed(&[4; 8])
                }
            }
        })
    }

    #[test]
    fn every_procedures_reply_decodes() {
        let a = fattr(9);
        for proc in Proc::ALL {
            let body = ok_reply(proc);
            let res = decode_res(proc, &mut Decoder::new(&body)).unwrap_or_else(|e| panic!("{proc:?}: {e}"));
            match (proc, res) {
                (Proc::Null, Res::Null) => {}
                (Proc::Getattr, Res::Attr(x)) => assert_eq!(x, a),
                (Proc::Setattr, Res::Setattr { attr }) => assert_eq!(attr, Some(a)),
                (Proc::Lookup, Res::Lookup { fh, attr, dir_attr }) => {
                    assert_eq!(fh.as_bytes(), &[7; 20]);
                    assert_eq!((attr, dir_attr), (Some(a), None));
                }
                (Proc::Access, Res::Access { access, attr }) => assert_eq!((access, attr), (0x1f, Some(a))),
                (Proc::Readlink, Res::Readlink { target, attr }) => {
                    assert_eq!((target, attr), (&b"/target/x"[..], None))
                }
                (Proc::Read, Res::Read { count, eof, attr }) => {
                    assert_eq!((count, eof, attr), (5, true, Some(a)))
                }
                (Proc::Write, Res::Write { count, committed, verf, attr }) => {
                    assert_eq!((count, committed, verf, attr), (100, Stable::DataSync, [9; 8], Some(a)))
                }
                (
                    Proc::Create | Proc::Mkdir | Proc::Symlink | Proc::Mknod,
                    Res::Created { fh, attr, dir_attr },
                ) => {
                    assert_eq!(fh.map(|f| f.as_bytes().len()), Some(20));
                    assert_eq!((attr, dir_attr), (Some(a), None));
                }
                (Proc::Remove | Proc::Rmdir | Proc::Rename | Proc::Link, Res::Changed { attr }) => {
                    assert_eq!(attr, Some(a))
                }
                (Proc::Readdir | Proc::Readdirplus, Res::Dir { verf, entries, eof, dir_attr }) => {
                    assert_eq!((verf, eof, dir_attr), ([1; 8], true, Some(a)));
                    let got: Vec<_> = entries.map(|e| e.unwrap()).collect();
                    assert_eq!(got.len(), 3);
                    assert_eq!((got[1].fileid, got[1].name, got[1].cookie), (101, &b"bcde"[..], 2));
                    if proc == Proc::Readdirplus {
                        assert_eq!((got[0].attr, got[1].attr), (Some(a), None));
                        assert_eq!(got[0].fh.map(|f| f.as_bytes().to_vec()), Some(vec![0; 8]));
                        assert!(got[2].fh.is_none());
                    } else {
                        assert!(got.iter().all(|e| e.attr.is_none() && e.fh.is_none()));
                    }
                }
                (Proc::Fsstat, Res::Fsstat { tbytes, afiles, .. }) => assert_eq!((tbytes, afiles), (1, 6)),
                (Proc::Fsinfo, Res::Fsinfo { rtmax, wtpref, dtpref, maxfilesize, properties, .. }) => {
                    assert_eq!(
                        (rtmax, wtpref, dtpref, maxfilesize, properties),
                        (1 << 20, 1 << 16, 8192, u64::MAX, 0x1b)
                    )
                }
                (Proc::Commit, Res::Commit { verf }) => assert_eq!(verf, [4; 8]),
                (p, r) => panic!("{p:?} decoded as {r:?}"),
            }
        }
    }

    #[test]
    fn failures_carry_status_and_attributes() {
        let a = fattr(3);
        let stale = enc(|e| {
            e.u32(70)?;
            post_op(e, Some(&a))
        });
        let res = decode_res(Proc::Lookup, &mut Decoder::new(&stale)).unwrap();
        assert!(matches!(res, Res::Failed { status: Nfsstat::Stale, attr: Some(x) } if x == a));
        assert_eq!(Nfsstat::Stale.errno(), libc::ESTALE);
        let bad = 10001u32.to_be_bytes();
        let res = decode_res(Proc::Getattr, &mut Decoder::new(&bad)).unwrap();
        assert!(matches!(res, Res::Failed { status: Nfsstat::BadHandle, attr: None }));
        let exist = enc(|e| {
            e.u32(17)?;
            wcc(e, Some(&a))
        });
        let res = decode_res(Proc::Create, &mut Decoder::new(&exist)).unwrap();
        assert!(matches!(res, Res::Failed { status: Nfsstat::Exist, attr: Some(_) }));
        for v in
            [1, 2, 5, 6, 13, 17, 18, 19, 20, 21, 22, 27, 28, 30, 31, 63, 66, 69, 70, 71, 10001, 10008, 12345]
        {
            let s = Nfsstat::from_u32(v);
            assert_eq!(s.to_u32(), v);
            assert!(s.errno() > 0);
        }
        assert_eq!(Nfsstat::from_u32(12345), Nfsstat::Other(12345));
    }

    #[test]
    fn read_head_checks_counts() {
        let body = ok_reply(Proc::Read);
        let mut d = Decoder::new(&body);
        let h = decode_read_head(&mut d, 5).unwrap();
        assert!(matches!(h, ReadHead::Ok { count: 5, eof: true, len: 5, attr: Some(_) }));
        assert_eq!(d.remaining(), 8, "the data and its padding follow");
        assert!(matches!(decode_read_head(&mut Decoder::new(&body), 4), Err(WireError::TooLong { .. })));
        let mut lie = body.clone();
        let at = 4 + 4 + FATTR3_SIZE; // status, attr, then count
        lie[at..at + 4].copy_from_slice(&4u32.to_be_bytes());
        assert!(decode_read_head(&mut Decoder::new(&lie), 100).is_err());
    }

    #[test]
    fn arguments_encode_as_rfc1813_says() {
        let fh = Fh::new(&[1, 2, 3]).unwrap();
        let attr = Sattr {
            mode: Some(0o600),
            uid: None,
            gid: Some(5),
            size: Some(7),
            atime: SetTime::ServerTime,
            mtime: SetTime::ClientTime(NfsTime { sec: 1, nsec: 2 }),
        };
        let words = |b: &[u8]| {
            b.chunks(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<u32>>()
        };
        let b = enc(|e| {
            encode_args(
                e,
                &Args::Setattr { fh: &fh, attr: &attr, guard_ctime: Some(NfsTime { sec: 9, nsec: 8 }) },
            )
        });
        assert_eq!(words(&b), [3, 0x0102_0300, 1, 0o600, 0, 1, 5, 1, 0, 7, 1, 2, 1, 2, 1, 9, 8]);
        let b = enc(|e| {
            encode_args(e, &Args::Create { dir: &fh, name: b"ab", how: CreateHow::Exclusive([0xee; 8]) })
        });
        assert_eq!(words(&b), [3, 0x0102_0300, 2, 0x6162_0000, 2, 0xeeee_eeee, 0xeeee_eeee]);
        let b = enc(|e| {
            encode_args(e, &Args::Write { fh: &fh, offset: 1 << 33, count: 5, stable: Stable::FileSync })
        });
        assert_eq!(words(&b), [3, 0x0102_0300, 2, 0, 5, 2, 5], "ends with the data's length");
        let b = enc(|e| {
            encode_args(
                e,
                &Args::Mknod {
                    dir: &fh,
                    name: b"c",
                    ftype: Ftype::Chr,
                    attr: &Sattr::default(),
                    rdev: (4, 64),
                },
            )
        });
        assert_eq!(words(&b), [3, 0x0102_0300, 1, 0x6300_0000, 4, 0, 0, 0, 0, 0, 0, 4, 64]);
        let b = enc(|e| {
            encode_args(
                e,
                &Args::Mknod {
                    dir: &fh,
                    name: b"p",
                    ftype: Ftype::Fifo,
                    attr: &Sattr::default(),
                    rdev: (4, 64),
                },
            )
        });
        assert_eq!(words(&b).len(), 4 + 1 + 6, "no device numbers for a FIFO");
        let b = enc(|e| {
            encode_args(
                e,
                &Args::Readdirplus { dir: &fh, cookie: 3, verf: [0; 8], dircount: 512, maxcount: 4096 },
            )
        });
        assert_eq!(words(&b), [3, 0x0102_0300, 0, 3, 0, 0, 512, 4096]);
        let b = enc(|e| {
            encode_args(e, &Args::Rename { from_dir: &fh, from_name: b"x", to_dir: &fh, to_name: b"yy" })
        });
        assert_eq!(words(&b), [3, 0x0102_0300, 1, 0x7800_0000, 3, 0x0102_0300, 2, 0x7979_0000]);
        let b = enc(|e| {
            encode_args(e, &Args::Symlink { dir: &fh, name: b"l", attr: &Sattr::default(), target: b"/t" })
        });
        assert_eq!(words(&b), [3, 0x0102_0300, 1, 0x6c00_0000, 0, 0, 0, 0, 0, 0, 2, 0x2f74_0000]);
        // Bounds: a name over MAX_NAME, a target over MAX_PATH.
        let mut buf = [0u8; 16384];
        let long = [b'n'; MAX_NAME as usize + 1];
        assert!(encode_args(&mut Encoder::new(&mut buf), &Args::Lookup { dir: &fh, name: &long }).is_err());
        let path = [b'p'; MAX_PATH as usize + 1];
        let a = Sattr::default();
        assert!(encode_args(
            &mut Encoder::new(&mut buf),
            &Args::Symlink { dir: &fh, name: b"l", attr: &a, target: &path }
        )
        .is_err());
        assert!(Fh::new(&[0; 65]).is_none());
        assert_eq!(Fh::new(&[1, 2]), Fh::new(&[1, 2]));
        assert_ne!(Fh::new(&[1, 2]), Fh::new(&[1, 2, 0]));
    }

    /// Decodes `b` as every procedure's reply and as a READ head; must never panic, and a
    /// successful directory listing must iterate.
    fn decode_all(b: &[u8]) -> usize {
        let mut oks = 0;
        for proc in Proc::ALL {
            if let Ok(Res::Dir { entries, .. }) = decode_res(proc, &mut Decoder::new(b)) {
                for e in entries {
                    e.unwrap();
                }
                oks += 1;
            } else if decode_res(proc, &mut Decoder::new(b)).is_ok() {
                oks += 1;
            }
        }
        let _ = decode_read_head(&mut Decoder::new(b), 1 << 20);
        let _ = super::super::rpc::decode_reply(&mut Decoder::new(b));
        let _ = super::super::rpc::decode_call(&mut Decoder::new(b));
        let _ = super::super::mount::decode_mnt(&mut Decoder::new(b));
        let _ = super::super::portmap::decode_getport(&mut Decoder::new(b));
        oks
    }

    #[test]
    fn truncated_replies_are_errors() {
        for proc in Proc::ALL {
            let body = ok_reply(proc);
            for n in 0..body.len() {
                assert!(
                    decode_res(proc, &mut Decoder::new(&body[..n])).is_err(),
                    "{proc:?} cut at {n} of {}",
                    body.len()
                );
                decode_all(&body[..n]);
            }
        }
    }

    #[test]
    fn hostile_bytes_never_panic() {
        // Fixed-seed xorshift: random words biased to small values (so that bools, lengths
        // and discriminants are often valid and decoding goes deep), and mutated valid replies.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut oks = 0;
        for _ in 0..20_000 {
            let n = (rnd() % 96) as usize;
            let mut b = Vec::with_capacity(n * 4);
            for _ in 0..n {
                let w = match rnd() % 4 {
                    0 => 0,
                    1 => 1,
                    2 => (rnd() % 80) as u32,
                    _ => rnd() as u32,
                };
                b.extend_from_slice(&w.to_be_bytes());
            }
            oks += decode_all(&b);
        }
        for proc in Proc::ALL {
            let good = ok_reply(proc);
            for _ in 0..2_000 {
                let mut b = good.clone();
                for _ in 0..1 + rnd() % 3 {
                    if b.is_empty() {
                        break;
                    }
                    let i = (rnd() as usize) % b.len();
                    b[i] = rnd() as u8;
                }
                if rnd() % 4 == 0 {
                    b.truncate((rnd() as usize) % (b.len() + 1));
                }
                decode_all(&b);
            }
        }
        assert!(oks > 0, "some random inputs decode (the generator reaches deep paths)");
    }
}
