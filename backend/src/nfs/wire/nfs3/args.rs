//! Encoding NFSv3 calls' arguments: [`Args`], one variant per procedure the device calls, and
//! [`encode_args`].

use super::types::{CreateHow, Fh, Ftype, NfsTime, Proc, Sattr, Stable, MAX_NAME, MAX_PATH};
use crate::nfs::wire::xdr::Encoder;
use crate::nfs::wire::WireError;

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
    dir.encode3(e)?;
    e.opaque(name, MAX_NAME)
}

/// Encodes `args` (after the RPC call header). A WRITE ends with the data's length: the caller
/// sends `count` bytes of data and their padding after it.
pub fn encode_args(e: &mut Encoder<'_>, args: &Args<'_>) -> Result<(), WireError> {
    match *args {
        Args::Null => Ok(()),
        Args::Getattr { fh } | Args::Readlink { fh } | Args::Fsstat { fh } | Args::Fsinfo { fh } => {
            fh.encode3(e)
        }
        Args::Setattr { fh, attr, guard_ctime } => {
            fh.encode3(e)?;
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
            fh.encode3(e)?;
            e.u32(mask)
        }
        Args::Read { fh, offset, count } | Args::Commit { fh, offset, count } => {
            fh.encode3(e)?;
            e.u64(offset)?;
            e.u32(count)
        }
        Args::Write { fh, offset, count, stable } => {
            fh.encode3(e)?;
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
            fh.encode3(e)?;
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
