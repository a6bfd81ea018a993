//! The NFSv3 types the device uses, with their XDR codecs: the program's constants, file
//! handles ([`Fh`]), times, file types and attributes (`fattr3`, `post_op_attr`, `wcc_data`),
//! what SETATTR and the creating procedures set (`sattr3`, `createhow3`), `stable_how`, and the
//! procedure numbers.

use crate::nfs::wire::xdr::{Decoder, Encoder};
use crate::nfs::wire::WireError;

/// The NFS program number.
pub const PROGRAM: u32 = 100_003;
/// The NFS version spoken here.
pub const VERSION: u32 = 3;
pub use crate::nfs::wire::{Fh, FHSIZE3};
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

/// `nfstime3`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfsTime {
    /// Seconds since the epoch.
    pub sec: u32,
    /// Nanoseconds.
    pub nsec: u32,
}

impl NfsTime {
    pub(super) fn decode(d: &mut Decoder<'_>) -> Result<NfsTime, WireError> {
        Ok(NfsTime { sec: d.u32()?, nsec: d.u32()? })
    }
    pub(super) fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
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
pub(super) fn decode_wcc(d: &mut Decoder<'_>) -> Result<Option<Fattr>, WireError> {
    if d.bool()? {
        d.skip(8 + 8 + 8)?; // size, mtime, ctime
    }
    decode_post_op_attr(d)
}

pub(super) fn decode_post_op_fh(d: &mut Decoder<'_>) -> Result<Option<Fh>, WireError> {
    if d.bool()? {
        Ok(Some(Fh::decode3(d)?))
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
    pub(super) fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
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
    pub(super) fn to_u32(self) -> u32 {
        match self {
            Stable::Unstable => 0,
            Stable::DataSync => 1,
            Stable::FileSync => 2,
        }
    }
    pub(super) fn from_u32(v: u32) -> Result<Stable, WireError> {
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

/// NFSv3 procedure numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Proc {
    #[default]
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
