//! `nfsstat4`: the status of a COMPOUND and of each of its operations ([`Nfsstat4`]), every value
//! RFC 8881 (NFSv4.1) defines, those NFSv4.2 added (RFC 7862) and RFC 8276's two xattr
//! statuses, with their wire values and the Linux errnos they stand for.

macro_rules! statuses {
    ($($(#[$doc:meta])* $name:ident = $value:literal,)*) => {
        /// `nfsstat4`. `Ok` is NFS4_OK; a value no RFC defines is kept as [`Nfsstat4::Other`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Nfsstat4 {
            $($(#[$doc])* $name,)*
            /// A value RFC 8881, 7862 and 8276 do not define.
            Other(u32),
        }

        impl Nfsstat4 {
            /// From the wire value.
            pub fn from_u32(v: u32) -> Nfsstat4 {
                match v {
                    $($value => Nfsstat4::$name,)*
                    other => Nfsstat4::Other(other),
                }
            }

            /// The wire value.
            pub fn to_u32(self) -> u32 {
                match self {
                    $(Nfsstat4::$name => $value,)*
                    Nfsstat4::Other(v) => v,
                }
            }
        }

        #[cfg(test)]
        /// Every defined value, for the tests.
        pub(super) const ALL_VALUES: &[u32] = &[$($value,)*];
    };
}

statuses! {
    /// NFS4_OK.
    Ok = 0,
    /// Not the owner, or not privileged.
    Perm = 1,
    /// No such file or directory.
    NoEnt = 2,
    /// A hard I/O error.
    Io = 5,
    /// No such device or address.
    Nxio = 6,
    /// Access denied (NFS4ERR_ACCESS).
    Access = 13,
    /// The name exists.
    Exist = 17,
    /// Across filesystems.
    Xdev = 18,
    /// Not a directory.
    NotDir = 20,
    /// A directory where it should not be.
    IsDir = 21,
    /// An invalid argument.
    Inval = 22,
    /// The file is too large for the server.
    FBig = 27,
    /// No space left.
    NoSpc = 28,
    /// A read-only filesystem.
    Rofs = 30,
    /// Too many hard links.
    MLink = 31,
    /// A name too long for the server.
    NameTooLong = 63,
    /// The directory is not empty.
    NotEmpty = 66,
    /// Over the quota.
    DQuot = 69,
    /// The file handle no longer names a file.
    Stale = 70,
    /// An illegal file handle.
    BadHandle = 10001,
    /// The READDIR cookie is stale.
    BadCookie = 10003,
    /// The operation is not supported.
    NotSupp = 10004,
    /// The reply would exceed the limit the call set.
    TooSmall = 10005,
    /// An undefined server error.
    ServerFault = 10006,
    /// A type CREATE cannot make.
    BadType = 10007,
    /// The file is busy: try again later.
    Delay = 10008,
    /// NVERIFY: the attributes are the same.
    Same = 10009,
    /// The lock is held by another owner.
    Denied = 10010,
    /// The lease expired.
    Expired = 10011,
    /// I/O failed against a lock.
    Locked = 10012,
    /// The server is in its grace period.
    Grace = 10013,
    /// A volatile file handle expired.
    FhExpired = 10014,
    /// A share reservation conflicts.
    ShareDenied = 10015,
    /// The security flavour is wrong for the object.
    WrongSec = 10016,
    /// The client id is in use by another principal.
    ClidInUse = 10017,
    /// Resource exhaustion (NFSv4.0 only; not valid in NFSv4.1).
    Resource = 10018,
    /// The filesystem moved.
    Moved = 10019,
    /// No current file handle.
    NoFileHandle = 10020,
    /// The minor version is not supported.
    MinorVersMismatch = 10021,
    /// The client id is stale (the server restarted).
    StaleClientid = 10022,
    /// The stateid is stale (the server restarted).
    StaleStateid = 10023,
    /// The stateid's seqid is older than the current one.
    OldStateid = 10024,
    /// The stateid is invalid.
    BadStateid = 10025,
    /// A sequence id out of order (NFSv4.0).
    BadSeqid = 10026,
    /// VERIFY: the attributes differ.
    NotSame = 10027,
    /// A lock range overlapping another of the same owner in a way the server cannot do.
    LockRange = 10028,
    /// A symbolic link where a file or directory should be.
    Symlink = 10029,
    /// No saved file handle.
    RestoreFh = 10030,
    /// Some filesystem moved (RENEW, NFSv4.0).
    LeaseMoved = 10031,
    /// An attribute the server does not support.
    AttrNotSupp = 10032,
    /// A reclaim outside the grace period.
    NoGrace = 10033,
    /// A reclaim the server cannot honour.
    ReclaimBad = 10034,
    /// A reclaim that conflicts with another client's state.
    ReclaimConflict = 10035,
    /// The server could not decode the arguments.
    BadXdr = 10036,
    /// CLOSE with locks still held.
    LocksHeld = 10037,
    /// I/O the open mode does not allow.
    OpenMode = 10038,
    /// An owner or group the server cannot map.
    BadOwner = 10039,
    /// A UTF-8 character the server does not accept.
    BadChar = 10040,
    /// A name the server does not accept.
    BadName = 10041,
    /// A lock range the server does not support.
    BadRange = 10042,
    /// No atomic lock upgrade or downgrade.
    LockNotSupp = 10043,
    /// An undefined operation.
    OpIllegal = 10044,
    /// A lock would deadlock.
    Deadlock = 10045,
    /// An open file prevents the operation.
    FileOpen = 10046,
    /// The administrator revoked the state.
    AdminRevoked = 10047,
    /// The callback path is down.
    CbPathDown = 10048,
    /// An I/O mode the layout does not allow (pNFS).
    BadIoMode = 10049,
    /// A bad layout (pNFS).
    BadLayout = 10050,
    /// A bad session digest (SSV).
    BadSessionDigest = 10051,
    /// The session is unknown to the server.
    BadSession = 10052,
    /// A slot id beyond the session's table.
    BadSlot = 10053,
    /// RECLAIM_COMPLETE was already done.
    CompleteAlready = 10054,
    /// The connection is not bound to the session.
    ConnNotBoundToSession = 10055,
    /// A delegation was already wanted.
    DelegAlreadyWanted = 10056,
    /// Callbacks outstanding on the back channel.
    BackChanBusy = 10057,
    /// Try the layout later (pNFS).
    LayoutTryLater = 10058,
    /// No layout available (pNFS).
    LayoutUnavailable = 10059,
    /// No matching layout (pNFS).
    NoMatchingLayout = 10060,
    /// A recall conflicts (pNFS).
    RecallConflict = 10061,
    /// An unknown layout type (pNFS).
    UnknownLayoutType = 10062,
    /// The slot's sequence id is not the expected one.
    SeqMisordered = 10063,
    /// SEQUENCE not first in the COMPOUND.
    SequencePos = 10064,
    /// The request exceeds the channel's limit.
    ReqTooBig = 10065,
    /// The reply would exceed the channel's limit.
    RepTooBig = 10066,
    /// The reply is too big for the reply cache.
    RepTooBigToCache = 10067,
    /// A retry whose reply was not cached.
    RetryUncachedRep = 10068,
    /// A COMPOUND too hard to retry or recover.
    UnsafeCompound = 10069,
    /// Too many operations in the COMPOUND.
    TooManyOps = 10070,
    /// The operation needs a SEQUENCE first.
    OpNotInSession = 10071,
    /// A hash algorithm the server does not support.
    HashAlgUnsupp = 10072,
    /// The client id still has state.
    ClientidBusy = 10074,
    /// I/O to a hole of a sparse file (pNFS).
    PnfsIoHole = 10075,
    /// A retry that differs from the original request.
    SeqFalseRetry = 10076,
    /// A bad highest slot id.
    BadHighSlot = 10077,
    /// The session is dead: no new requests.
    DeadSession = 10078,
    /// An encryption algorithm the server does not support.
    EncrAlgUnsupp = 10079,
    /// I/O without a layout (pNFS).
    PnfsNoLayout = 10080,
    /// The operation must be alone in its COMPOUND.
    NotOnlyOp = 10081,
    /// The operation was done with the wrong credential.
    WrongCred = 10082,
    /// The operation is on an object of the wrong type.
    WrongType = 10083,
    /// No directory delegation available.
    DirDelegUnavail = 10084,
    /// The callback rejected the delegation.
    RejectDeleg = 10085,
    /// A layout get before a return (pNFS).
    ReturnConflict = 10086,
    /// The delegation or layout was revoked.
    DelegRevoked = 10087,
    /// NFSv4.2: the copy partner does not support the operation.
    PartnerNotSupp = 10088,
    /// NFSv4.2: the copy partner refuses the authentication.
    PartnerNoAuth = 10089,
    /// NFSv4.2: the union of file types is not supported.
    UnionNotSupp = 10090,
    /// NFSv4.2: the offload (copy) is denied.
    OffloadDenied = 10091,
    /// NFSv4.2: a wrong labeled-security format.
    WrongLfs = 10092,
    /// NFSv4.2: a bad security label.
    BadLabel = 10093,
    /// NFSv4.2: no offload requests.
    OffloadNoReqs = 10094,
    /// RFC 8276: no such extended attribute.
    NoXattr = 10095,
    /// RFC 8276: the extended attribute is too big.
    Xattr2Big = 10096,
}

impl Nfsstat4 {
    /// Whether this is NFS4_OK.
    pub fn is_ok(self) -> bool {
        self == Nfsstat4::Ok
    }

    /// The Linux errno a FUSE reply carries for this status (0 for `Ok`). Mostly as the Linux NFS
    /// client maps them for its callers (`nfs4_map_errors` and the `nfs_errtbl` of
    /// `fs/nfs/nfs4xdr.c`); where Linux uses a kernel-internal errno (ENOTSUPP, EBADCOOKIE,
    /// ETOOSMALL, EBADTYPE) the nearest errno a user sees is taken.
    ///
    /// - The POSIX-named statuses (NOENT, ACCESS, EXIST, ...) are their errno.
    /// - A handle that names nothing any more (STALE, BADHANDLE, FHEXPIRED): ESTALE.
    /// - "Try again" (DELAY, GRACE, LOCKED, DENIED: a lock held by another owner, what
    ///   F_SETLK answers): EAGAIN; DEADLOCK: EDEADLK.
    /// - State lost or not reclaimable (EXPIRED, NO_GRACE, RECLAIM_BAD, RECLAIM_CONFLICT,
    ///   ADMIN_REVOKED, DELEG_REVOKED): ENOLCK for the reclaim statuses (a lock that could not be
    ///   kept), EIO for the rest.
    /// - Refusals of a name or value (BADNAME, BADCHAR, BADOWNER, BADTYPE, BAD_RANGE, BAD_COOKIE,
    ///   TOOSMALL, WRONG_TYPE, LOCK_RANGE, and VERIFY's SAME and NOT_SAME): EINVAL; SYMLINK: ELOOP; SHARE_DENIED: EACCES;
    ///   OPENMODE: EBADF (I/O the open does not allow); FILE_OPEN: EBUSY; NOTSUPP, ATTRNOTSUPP:
    ///   EOPNOTSUPP; LOCK_NOTSUPP: ENOLCK; WRONGSEC, WRONG_CRED: EPERM; MINOR_VERS_MISMATCH:
    ///   EPROTONOSUPPORT; MOVED: EREMOTE.
    /// - RFC 8276: NOXATTR is ENODATA (what `getxattr(2)` answers), XATTR2BIG E2BIG.
    /// - Everything about the session, the client id, sequencing, stateids and pNFS is the
    ///   client's own business (it recovers or the request fails): EIO if one ever reaches a
    ///   caller, as are SERVERFAULT, BADXDR, RESOURCE and unknown values.
    pub fn errno(self) -> i32 {
        use Nfsstat4::*;
        match self {
            Ok => 0,
            Perm => libc::EPERM,
            NoEnt => libc::ENOENT,
            Io => libc::EIO,
            Nxio => libc::ENXIO,
            Access | ShareDenied => libc::EACCES,
            Exist => libc::EEXIST,
            Xdev => libc::EXDEV,
            NotDir => libc::ENOTDIR,
            IsDir => libc::EISDIR,
            Inval => libc::EINVAL,
            FBig => libc::EFBIG,
            NoSpc => libc::ENOSPC,
            Rofs => libc::EROFS,
            MLink => libc::EMLINK,
            NameTooLong => libc::ENAMETOOLONG,
            NotEmpty => libc::ENOTEMPTY,
            DQuot => libc::EDQUOT,
            Stale | BadHandle | FhExpired => libc::ESTALE,
            NotSupp | AttrNotSupp => libc::EOPNOTSUPP,
            BadCookie | TooSmall | BadType | BadOwner | BadChar | BadName | BadRange | WrongType
            | LockRange | Same | NotSame => libc::EINVAL,
            Delay | Grace | Locked | Denied => libc::EAGAIN,
            Deadlock => libc::EDEADLK,
            NoGrace | ReclaimBad | ReclaimConflict | LockNotSupp => libc::ENOLCK,
            Symlink => libc::ELOOP,
            OpenMode => libc::EBADF,
            FileOpen => libc::EBUSY,
            WrongSec | WrongCred => libc::EPERM,
            MinorVersMismatch => libc::EPROTONOSUPPORT,
            Moved => libc::EREMOTE,
            NoXattr => libc::ENODATA,
            Xattr2Big => libc::E2BIG,
            Expired
            | ClidInUse
            | Resource
            | NoFileHandle
            | StaleClientid
            | StaleStateid
            | OldStateid
            | BadStateid
            | BadSeqid
            | RestoreFh
            | LeaseMoved
            | BadXdr
            | LocksHeld
            | OpIllegal
            | AdminRevoked
            | CbPathDown
            | BadIoMode
            | BadLayout
            | BadSessionDigest
            | BadSession
            | BadSlot
            | CompleteAlready
            | ConnNotBoundToSession
            | DelegAlreadyWanted
            | BackChanBusy
            | LayoutTryLater
            | LayoutUnavailable
            | NoMatchingLayout
            | RecallConflict
            | UnknownLayoutType
            | SeqMisordered
            | SequencePos
            | ReqTooBig
            | RepTooBig
            | RepTooBigToCache
            | RetryUncachedRep
            | UnsafeCompound
            | TooManyOps
            | OpNotInSession
            | HashAlgUnsupp
            | ClientidBusy
            | PnfsIoHole
            | SeqFalseRetry
            | BadHighSlot
            | DeadSession
            | EncrAlgUnsupp
            | PnfsNoLayout
            | NotOnlyOp
            | DirDelegUnavail
            | RejectDeleg
            | ReturnConflict
            | DelegRevoked
            | PartnerNotSupp
            | PartnerNoAuth
            | UnionNotSupp
            | OffloadDenied
            | WrongLfs
            | BadLabel
            | OffloadNoReqs
            | ServerFault
            | Other(_) => libc::EIO,
        }
    }
}
