//! `nfsstat3`: the statuses of failed NFSv3 procedures ([`Nfsstat`]), their wire values and
//! the Linux errnos they stand for.

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
