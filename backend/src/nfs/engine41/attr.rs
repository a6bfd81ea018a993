//! NFSv4.1 attributes as the filesystem's types, with no state: `fattr4` as `stat(2)` shows it
//! (64-bit seconds kept: a time past 2038 is exact), a FUSE SETATTR as `SetAttrs` (`UTIME_NOW`
//! as the server's time), the STATFS attributes, and NFSv4 statuses as the guest's errors.
//!
//! Owners and groups come as numeric strings (ganesha's default, Linux's
//! `nfs4_disable_idmapping`): the codec turns them into ids, and a name it cannot read makes the
//! whole reply undecodable, which ends the request with EIO. Mapping names to the nobody id
//! instead would show the guest files owned by nobody that it may still reach through its
//! credentials, and hide a server set up for name mapping, which this client cannot follow (it
//! has no idmapper): failing loudly is the honest answer.

use crate::filesystem::{Error, SetAttr, SetTime, Stat, StatFs, Timespec};
use crate::nfs::convert::encode_dev;
use crate::nfs::wire::nfs4::{Fattr4, Ftype4, NfsTime4, Nfsstat4, SetAttrs, SetTime4};

/// An NFSv4 status as the guest's error.
pub(super) fn error(status: Nfsstat4) -> Error {
    Error::from_errno(status.errno())
}

/// `S_IF*` of an NFSv4 file type (named attributes never reach here: the client asks for none).
pub(super) fn type_bits(t: Ftype4) -> u32 {
    match t {
        Ftype4::Reg | Ftype4::NamedAttr => libc::S_IFREG,
        Ftype4::Dir | Ftype4::AttrDir => libc::S_IFDIR,
        Ftype4::Blk => libc::S_IFBLK,
        Ftype4::Chr => libc::S_IFCHR,
        Ftype4::Lnk => libc::S_IFLNK,
        Ftype4::Sock => libc::S_IFSOCK,
        Ftype4::Fifo => libc::S_IFIFO,
    }
}

fn time(t: Option<NfsTime4>) -> Timespec {
    t.map_or(Timespec { sec: 0, nsec: 0 }, |t| Timespec { sec: t.seconds, nsec: t.nseconds.min(999_999_999) })
}

/// `fattr4` as `stat(2)` shows it; a reply without the file's type (a mandatory attribute) is
/// EIO. `st_ino` is the server's fileid.
pub(super) fn stat(a: &Fattr4) -> Result<Stat, Error> {
    let t = a.ftype.ok_or(Error::Io)?;
    let (major, minor) = a.rawdev.unwrap_or_default();
    Ok(Stat {
        ino: a.fileid.unwrap_or(0),
        size: a.size.unwrap_or(0),
        blocks: a.space_used.unwrap_or(0).div_ceil(512),
        atime: time(a.time_access),
        mtime: time(a.time_modify),
        ctime: time(a.time_metadata),
        mode: type_bits(t) | (a.mode.unwrap_or(0) & 0o7777),
        nlink: a.numlinks.unwrap_or(1),
        uid: a.owner.unwrap_or(u32::MAX - 1),
        gid: a.owner_group.unwrap_or(u32::MAX - 1),
        rdev: encode_dev(major, minor),
        blksize: 4096,
    })
}

fn set_time(t: &SetTime) -> SetTime4 {
    match t {
        SetTime::Now => SetTime4::ServerTime,
        SetTime::At(ts) => SetTime4::ClientTime(NfsTime4 { seconds: ts.sec, nseconds: ts.nsec }),
    }
}

/// A FUSE SETATTR's attributes as NFSv4.1's (the change time is the server's to set).
pub(super) fn set_attrs(a: &SetAttr) -> SetAttrs {
    SetAttrs {
        size: a.size,
        mode: a.mode.map(|m| m & 0o7777),
        uid: a.uid,
        gid: a.gid,
        atime: a.atime.as_ref().map_or(SetTime4::DontChange, set_time),
        mtime: a.mtime.as_ref().map_or(SetTime4::DontChange, set_time),
    }
}

/// The STATFS attributes as `statfs(2)` shows them, in 4 KiB blocks.
pub(super) fn statfs(a: &Fattr4) -> StatFs {
    const B: u64 = 4096;
    StatFs {
        blocks: a.space_total.unwrap_or(0) / B,
        bfree: a.space_free.unwrap_or(0) / B,
        bavail: a.space_avail.unwrap_or(0) / B,
        files: a.files_total.unwrap_or(0),
        ffree: a.files_free.or(a.files_avail).unwrap_or(0),
        bsize: B as u32,
        namelen: a.maxname.unwrap_or(255).min(255),
        frsize: B as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_past_2038_and_types_convert() {
        let t = NfsTime4 { seconds: 2_300_000_000, nseconds: 5 };
        let a = Fattr4 {
            ftype: Some(Ftype4::Chr),
            mode: Some(0o104755),
            time_modify: Some(t),
            rawdev: Some((8, 300)),
            owner: Some(1000),
            owner_group: Some(100),
            space_used: Some(513),
            ..Fattr4::default()
        };
        let s = stat(&a).unwrap();
        assert_eq!(s.mtime, Timespec { sec: 2_300_000_000, nsec: 5 }, "no y2038 cut");
        assert_eq!(s.mode, libc::S_IFCHR | 0o4755);
        assert_eq!((s.uid, s.gid, s.blocks), (1000, 100, 2));
        assert_eq!(crate::nfs::convert::decode_dev(s.rdev), (8, 300));
        assert_eq!(stat(&Fattr4::default()), Err(Error::Io), "no type: EIO");
        let sa = SetAttr {
            mtime: Some(SetTime::At(Timespec { sec: 2_300_000_000, nsec: 7 })),
            atime: Some(SetTime::Now),
            ..SetAttr::default()
        };
        let s4 = set_attrs(&sa);
        assert_eq!(s4.mtime, SetTime4::ClientTime(NfsTime4 { seconds: 2_300_000_000, nseconds: 7 }));
        assert_eq!(s4.atime, SetTime4::ServerTime);
    }
}
