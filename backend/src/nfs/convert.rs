//! Conversions between NFSv3 and the filesystem's types, with no state: the caller's
//! credentials for AUTH_SYS, NFS statuses as the guest's errors, `fattr3` as `stat(2)` shows it
//! (times, file types, device numbers), a SETATTR's attributes and times as `sattr3`, and FUSE
//! access masks as ACCESS3 bits and back.
//!
//! A leaf of the backend: the filesystem (`fs`) and the per-poller engine (`engine`) both use
//! it, and it uses neither.

use super::conn::Cred;
use super::wire::nfs3::{access as access3, Fattr, Ftype, NfsTime, Nfsstat, Sattr, SetTime as NfsSetTime};
use crate::filesystem::{Context, Error, SetAttr, SetTime, Stat, Timespec};

/// The caller's credentials for AUTH_SYS: uid, gid and the supplementary group FUSE gives.
pub(crate) fn cred(ctx: &Context) -> Cred {
    let mut c = Cred { uid: ctx.uid, gid: ctx.gid, ngroups: 0, groups: [0; 16] };
    if let Some(g) = ctx.supp_gid {
        c.groups[0] = g;
        c.ngroups = 1;
    }
    c
}

/// An NFS status as the guest's error.
pub(crate) fn nfs_error(status: Nfsstat) -> Error {
    Error::from_errno(status.errno())
}

fn time(t: NfsTime) -> Timespec {
    Timespec { sec: i64::from(t.sec), nsec: t.nsec.min(999_999_999) }
}

/// `S_IF*` of an NFS file type.
pub(crate) fn type_bits(t: Ftype) -> u32 {
    match t {
        Ftype::Reg => libc::S_IFREG,
        Ftype::Dir => libc::S_IFDIR,
        Ftype::Blk => libc::S_IFBLK,
        Ftype::Chr => libc::S_IFCHR,
        Ftype::Lnk => libc::S_IFLNK,
        Ftype::Sock => libc::S_IFSOCK,
        Ftype::Fifo => libc::S_IFIFO,
    }
}

/// A device number as the kernel's `new_encode_dev` (FUSE's `rdev`).
pub(crate) fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// FUSE's `rdev` as (major, minor).
pub(crate) fn decode_dev(rdev: u32) -> (u32, u32) {
    ((rdev & 0xfff00) >> 8, (rdev & 0xff) | ((rdev >> 12) & 0xfff00))
}

/// NFS attributes as `stat(2)` shows them: `st_ino` is the server's fileid (the FUSE node id
/// is the device's own, [`super::nodes`]).
pub(crate) fn stat(a: &Fattr) -> Stat {
    Stat {
        ino: a.fileid,
        size: a.size,
        blocks: a.used.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        mode: type_bits(a.ftype) | (a.mode & 0o7777),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: encode_dev(a.rdev.0, a.rdev.1),
        blksize: 4096,
    }
}

/// A SETATTR's time as NFS sets it.
pub(crate) fn nfs_time(t: &SetTime) -> NfsSetTime {
    match t {
        SetTime::Now => NfsSetTime::ServerTime,
        SetTime::At(ts) => NfsSetTime::ClientTime(NfsTime {
            sec: u32::try_from(ts.sec.max(0)).unwrap_or(u32::MAX),
            nsec: ts.nsec,
        }),
    }
}

/// A SETATTR's attributes as `sattr3`.
pub(crate) fn sattr(a: &SetAttr) -> Sattr {
    Sattr {
        mode: a.mode.map(|m| m & 0o7777),
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        atime: a.atime.as_ref().map(nfs_time).unwrap_or_default(),
        mtime: a.mtime.as_ref().map(nfs_time).unwrap_or_default(),
    }
}

/// ACCESS3 bits for a FUSE `mask` (`R_OK | W_OK | X_OK`).
pub(crate) fn access_bits(mask: u32) -> u32 {
    let mut b = 0;
    if mask & libc::R_OK as u32 != 0 {
        b |= access3::READ;
    }
    if mask & libc::W_OK as u32 != 0 {
        b |= access3::MODIFY | access3::EXTEND;
    }
    if mask & libc::X_OK as u32 != 0 {
        b |= access3::LOOKUP | access3::EXECUTE;
    }
    b
}

/// Whether `granted` allows everything FUSE's `mask` asks.
pub(crate) fn access_ok(mask: u32, granted: u32) -> bool {
    (mask & libc::R_OK as u32 == 0 || granted & access3::READ != 0)
        && (mask & libc::W_OK as u32 == 0 || granted & access3::MODIFY != 0)
        && (mask & libc::X_OK as u32 == 0 || granted & (access3::LOOKUP | access3::EXECUTE) != 0)
}

/// The FUSE access mask an `open(2)` with `flags` needs.
pub(crate) fn open_mask(flags: u32) -> u32 {
    let w = libc::W_OK as u32;
    let mut m = match flags & libc::O_ACCMODE as u32 {
        x if x == libc::O_WRONLY as u32 => w,
        x if x == libc::O_RDWR as u32 => libc::R_OK as u32 | w,
        _ => libc::R_OK as u32,
    };
    if flags & libc::O_TRUNC as u32 != 0 {
        m |= w;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_convert() {
        let a = Fattr {
            ftype: Ftype::Chr,
            mode: 0o104755,
            nlink: 2,
            uid: 1000,
            gid: 100,
            size: 10,
            used: 513,
            rdev: (8, 300),
            fsid: 1,
            fileid: 77,
            atime: NfsTime { sec: 5, nsec: 6 },
            mtime: NfsTime { sec: 7, nsec: 8 },
            ctime: NfsTime { sec: 9, nsec: 2_000_000_000 },
        };
        let s = stat(&a);
        assert_eq!(s.mode, libc::S_IFCHR | 0o4755);
        assert_eq!((s.ino, s.blocks, s.nlink, s.uid, s.gid), (77, 2, 2, 1000, 100));
        assert_eq!(decode_dev(s.rdev), (8, 300));
        assert_eq!(s.ctime.nsec, 999_999_999);
        let c = cred(&Context { uid: 1, gid: 2, pid: 3, supp_gid: Some(4) });
        assert_eq!((c.uid, c.gid, c.ngroups, c.groups[0]), (1, 2, 1, 4));
    }
}
