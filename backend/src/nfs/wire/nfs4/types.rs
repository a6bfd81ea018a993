//! The NFSv4.1 types the client uses, with their XDR codecs (RFC 8881, XDR in RFC 5662): the
//! program's constants and bounds, file handles ([`Fh`]), stateids, session and client ids,
//! attribute bitmaps ([`Bitmap`]), times, file types, the attributes the FUSE server needs
//! ([`Fattr4`], decoded; [`SetAttrs`], encoded), `change_info4`, state owners, lock types,
//! `stable_how4`, channel attributes and the flag constants of the operations.

use crate::nfs::wire::xdr::{Decoder, Encoder};
use crate::nfs::wire::WireError;

/// The NFS program number.
pub const PROGRAM: u32 = 100_003;
/// The NFS version spoken here.
pub const VERSION: u32 = 4;
/// The minor version of every COMPOUND but the xattr operations'.
pub const MINOR_VERSION: u32 = 1;
/// The minor version RFC 8276's xattr operations need: they extend NFSv4.2, and a server
/// answers them with OP_ILLEGAL in a minor version 1 COMPOUND.
pub const MINOR_VERSION_XATTR: u32 = 2;
pub use crate::nfs::wire::Fh;
/// Largest file handle (NFS4_FHSIZE).
pub const FHSIZE4: usize = crate::nfs::wire::FHSIZE;
/// NFS4_OPAQUE_LIMIT: the bound of client and server owners, state owners and scopes.
pub const OPAQUE_LIMIT: u32 = 1024;
/// Bytes of a session id.
pub const SESSIONID_SIZE: usize = 16;
/// Longest name (`component4`, an xattr name) accepted in a reply or sent: Linux's NAME_MAX is
/// 255, the FUSE limit 1024.
pub const MAX_NAME: u32 = 1024;
/// Longest symlink target (`linktext4`) accepted in a reply or sent.
pub const MAX_PATH: u32 = 4096;
/// Longest COMPOUND tag sent or accepted (the server echoes ours).
pub const MAX_TAG: u32 = 256;
/// Words of a [`Bitmap`]: attributes 0 to 127 (RFC 8881 and 8276 define up to 82).
pub const MAX_BITMAP_WORDS: usize = 4;
/// Longest `attrlist4` accepted in a reply (the attributes decoded here take well under 1 KiB).
pub const MAX_ATTRLIST: u32 = 4096;
/// Longest xattr value sent or accepted (Linux's XATTR_SIZE_MAX).
pub const MAX_XATTR_VALUE: u32 = 65_536;
/// Most operations in a COMPOUND sent, or results in a reply accepted.
pub const MAX_OPS: u32 = 64;
/// Most stateids in a TEST_STATEID, sent or answered.
pub const MAX_STATEIDS: u32 = 64;
/// Longest owner or group string accepted (a numeric id takes at most 10 digits).
pub const MAX_OWNER: u32 = 1024;

/// ACCESS4 bits (RFC 8881 18.1; the `XA*` bits are RFC 8276's).
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
    /// Read extended attributes.
    pub const XAREAD: u32 = 0x40;
    /// Write extended attributes.
    pub const XAWRITE: u32 = 0x80;
    /// List extended attributes.
    pub const XALIST: u32 = 0x100;
}

/// OPEN's and OPEN_DOWNGRADE's share access and deny bits.
pub mod share {
    /// Open for reading.
    pub const ACCESS_READ: u32 = 0x1;
    /// Open for writing.
    pub const ACCESS_WRITE: u32 = 0x2;
    /// Open for both.
    pub const ACCESS_BOTH: u32 = 0x3;
    /// Deny nothing to others.
    pub const DENY_NONE: u32 = 0x0;
    /// Deny reading to others.
    pub const DENY_READ: u32 = 0x1;
    /// Deny writing to others.
    pub const DENY_WRITE: u32 = 0x2;
    /// Deny both.
    pub const DENY_BOTH: u32 = 0x3;
    /// Want no delegation (NFSv4.1, in the share access word).
    pub const WANT_NO_DELEG: u32 = 0x0400;
}

/// OPEN4 result flags (`rflags`).
pub mod open_result {
    /// The client must confirm the open (never in NFSv4.1).
    pub const CONFIRM: u32 = 0x2;
    /// The server's locks are POSIX locks.
    pub const LOCKTYPE_POSIX: u32 = 0x4;
    /// The server keeps a removed file while it is open.
    pub const PRESERVE_UNLINKED: u32 = 0x8;
    /// The server may notify lock availability (CB_NOTIFY_LOCK).
    pub const MAY_NOTIFY_LOCK: u32 = 0x20;
}

/// EXCHANGE_ID flags.
pub mod exchgid {
    /// The client supports referrals.
    pub const SUPP_MOVED_REFER: u32 = 0x1;
    /// The client supports migration.
    pub const SUPP_MOVED_MIGR: u32 = 0x2;
    /// Stateids bound to the principal that made them.
    pub const BIND_PRINC_STATEID: u32 = 0x100;
    /// A plain (non-pNFS) server or client.
    pub const USE_NON_PNFS: u32 = 0x1_0000;
    /// A pNFS metadata server.
    pub const USE_PNFS_MDS: u32 = 0x2_0000;
    /// A pNFS data server.
    pub const USE_PNFS_DS: u32 = 0x4_0000;
    /// The client asks to update a confirmed record (a new verifier is a new incarnation).
    pub const UPD_CONFIRMED_REC_A: u32 = 0x4000_0000;
    /// The server says the client id is already confirmed.
    pub const CONFIRMED_R: u32 = 0x8000_0000;
}

/// CREATE_SESSION flags.
pub mod create_session {
    /// A persistent reply cache.
    pub const PERSIST: u32 = 0x1;
    /// Use the connection for the back channel too.
    pub const CONN_BACK_CHAN: u32 = 0x2;
    /// RDMA mode.
    pub const CONN_RDMA: u32 = 0x4;
}

/// SEQUENCE's `sr_status_flags`.
pub mod seq_status {
    /// The callback path is down.
    pub const CB_PATH_DOWN: u32 = 0x1;
    /// Callback GSS contexts are expiring.
    pub const CB_GSS_CONTEXTS_EXPIRING: u32 = 0x2;
    /// Callback GSS contexts expired.
    pub const CB_GSS_CONTEXTS_EXPIRED: u32 = 0x4;
    /// The lease expired: all state was revoked.
    pub const EXPIRED_ALL_STATE_REVOKED: u32 = 0x8;
    /// The lease expired: some state was revoked.
    pub const EXPIRED_SOME_STATE_REVOKED: u32 = 0x10;
    /// The administrator revoked state.
    pub const ADMIN_STATE_REVOKED: u32 = 0x20;
    /// Recallable state (delegations, layouts) was revoked.
    pub const RECALLABLE_STATE_REVOKED: u32 = 0x40;
    /// A filesystem moved.
    pub const LEASE_MOVED: u32 = 0x80;
    /// The server restarted: reclaim.
    pub const RESTART_RECLAIM_NEEDED: u32 = 0x100;
    /// The session's callback path is down.
    pub const CB_PATH_DOWN_SESSION: u32 = 0x200;
    /// A back channel fault.
    pub const BACKCHANNEL_FAULT: u32 = 0x400;
    /// A device id changed (pNFS).
    pub const DEVID_CHANGED: u32 = 0x800;
    /// A device id was deleted (pNFS).
    pub const DEVID_DELETED: u32 = 0x1000;
}

/// Attribute numbers (`FATTR4_*`) of the attributes [`Fattr4`] decodes and [`SetAttrs`] sets.
pub mod attr {
    /// The attributes the server supports (a bitmap).
    pub const SUPPORTED_ATTRS: u32 = 0;
    /// The file type.
    pub const TYPE: u32 = 1;
    /// The change attribute.
    pub const CHANGE: u32 = 3;
    /// The size.
    pub const SIZE: u32 = 4;
    /// The filesystem id (major, minor).
    pub const FSID: u32 = 8;
    /// The lease time in seconds.
    pub const LEASE_TIME: u32 = 10;
    /// The error of an entry's attributes in READDIR.
    pub const RDATTR_ERROR: u32 = 11;
    /// The file handle.
    pub const FILEHANDLE: u32 = 19;
    /// The file id (inode number).
    pub const FILEID: u32 = 20;
    /// Files available to the caller.
    pub const FILES_AVAIL: u32 = 21;
    /// Files free.
    pub const FILES_FREE: u32 = 22;
    /// Files in the filesystem.
    pub const FILES_TOTAL: u32 = 23;
    /// The largest file size.
    pub const MAXFILESIZE: u32 = 27;
    /// The longest name.
    pub const MAXNAME: u32 = 29;
    /// The largest READ.
    pub const MAXREAD: u32 = 30;
    /// The largest WRITE.
    pub const MAXWRITE: u32 = 31;
    /// The mode bits.
    pub const MODE: u32 = 33;
    /// The number of hard links.
    pub const NUMLINKS: u32 = 35;
    /// The owner (a numeric string here).
    pub const OWNER: u32 = 36;
    /// The owning group (a numeric string here).
    pub const OWNER_GROUP: u32 = 37;
    /// The device numbers of a device file.
    pub const RAWDEV: u32 = 41;
    /// Bytes available to the caller.
    pub const SPACE_AVAIL: u32 = 42;
    /// Bytes free.
    pub const SPACE_FREE: u32 = 43;
    /// Bytes in the filesystem.
    pub const SPACE_TOTAL: u32 = 44;
    /// Bytes the file uses.
    pub const SPACE_USED: u32 = 45;
    /// The last access.
    pub const TIME_ACCESS: u32 = 47;
    /// Set the access time (SETATTR only).
    pub const TIME_ACCESS_SET: u32 = 48;
    /// The last metadata change (ctime).
    pub const TIME_METADATA: u32 = 52;
    /// The last modification.
    pub const TIME_MODIFY: u32 = 53;
    /// Set the modification time (SETATTR only).
    pub const TIME_MODIFY_SET: u32 = 54;
    /// The file id of the directory a filesystem is mounted on.
    pub const MOUNTED_ON_FILEID: u32 = 55;
    /// Whether the filesystem has extended attributes (RFC 8276).
    pub const XATTR_SUPPORT: u32 = 82;
}

/// `stateid4`: a sequence id and 12 opaque bytes naming an open, a lock or a delegation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stateid {
    /// Bumped by the server at each change of the state.
    pub seqid: u32,
    /// The server's name of the state.
    pub other: [u8; 12],
}

impl Stateid {
    /// The anonymous stateid (all zeros): I/O or SETATTR without open state.
    pub const ANONYMOUS: Stateid = Stateid { seqid: 0, other: [0; 12] };
    /// The READ bypass stateid (all ones): READ that may bypass share reservations and locks.
    pub const READ_BYPASS: Stateid = Stateid { seqid: u32::MAX, other: [0xff; 12] };
    /// The current stateid (seqid 1, other zeros): the stateid the previous operation of the
    /// COMPOUND produced (OPEN's for a WRITE after it, say).
    pub const CURRENT: Stateid = Stateid { seqid: 1, other: [0; 12] };
    /// The invalid stateid (seqid all ones, other zeros): never accepted.
    pub const INVALID: Stateid = Stateid { seqid: u32::MAX, other: [0; 12] };

    /// Decodes a `stateid4`.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Stateid, WireError> {
        Ok(Stateid { seqid: d.u32()?, other: d.array::<12>()? })
    }

    /// Encodes a `stateid4`.
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        e.u32(self.seqid)?;
        e.fixed(&self.other)
    }
}

/// `sessionid4`.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SessionId(pub [u8; SESSIONID_SIZE]);

impl SessionId {
    /// Decodes a `sessionid4`.
    pub fn decode(d: &mut Decoder<'_>) -> Result<SessionId, WireError> {
        Ok(SessionId(d.array::<SESSIONID_SIZE>()?))
    }

    /// Encodes a `sessionid4`.
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        e.fixed(&self.0)
    }
}

impl std::fmt::Debug for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionId(")?;
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// `clientid4`: the server's short name of a client, from EXCHANGE_ID.
pub type ClientId = u64;

/// `verifier4`: 8 opaque bytes (a client's incarnation, a write verifier, a cookie verifier).
pub type Verifier = [u8; 8];

/// `bitmap4`: a set of attribute numbers (or operations), bounded to [`MAX_BITMAP_WORDS`] words.
/// Kept without trailing zero words, so equal sets compare equal whatever was sent.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bitmap {
    words: [u32; MAX_BITMAP_WORDS],
    len: u8,
}

impl Bitmap {
    /// The empty set.
    pub const EMPTY: Bitmap = Bitmap { words: [0; MAX_BITMAP_WORDS], len: 0 };

    /// The set of `bits`. A bit of 128 or more is a bug of the caller: it panics, at compile time
    /// when this makes a constant.
    pub const fn of(bits: &[u32]) -> Bitmap {
        let mut words = [0u32; MAX_BITMAP_WORDS];
        let mut i = 0;
        while i < bits.len() {
            let b = bits[i];
            assert!((b as usize) < 32 * MAX_BITMAP_WORDS, "attribute number beyond the bitmap's bound");
            words[(b / 32) as usize] |= 1 << (b % 32);
            i += 1;
        }
        Bitmap::from_words(words)
    }

    const fn from_words(words: [u32; MAX_BITMAP_WORDS]) -> Bitmap {
        let mut len = MAX_BITMAP_WORDS;
        while len > 0 && words[len - 1] == 0 {
            len -= 1;
        }
        Bitmap { words, len: len as u8 }
    }

    /// Whether `bit` is in the set.
    pub fn contains(&self, bit: u32) -> bool {
        let w = (bit / 32) as usize;
        w < MAX_BITMAP_WORDS && self.words[w] & (1 << (bit % 32)) != 0
    }

    /// Adds `bit`; false (and nothing changes) when it is beyond the bound.
    pub fn insert(&mut self, bit: u32) -> bool {
        let w = (bit / 32) as usize;
        if w >= MAX_BITMAP_WORDS {
            return false;
        }
        self.words[w] |= 1 << (bit % 32);
        self.len = self.len.max(w as u8 + 1);
        true
    }

    /// The set without the bits of `other`.
    pub fn minus(&self, other: &Bitmap) -> Bitmap {
        let mut words = self.words;
        for (w, o) in words.iter_mut().zip(other.words) {
            *w &= !o;
        }
        Bitmap::from_words(words)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The words, without trailing zero words (as they are encoded).
    pub fn words(&self) -> &[u32] {
        &self.words[..usize::from(self.len)]
    }

    /// The bits of the set, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words()
            .iter()
            .enumerate()
            .flat_map(|(i, &w)| (0..32u32).filter(move |b| w & (1 << b) != 0).map(move |b| 32 * i as u32 + b))
    }

    /// Decodes a `bitmap4` of at most [`MAX_BITMAP_WORDS`] words.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Bitmap, WireError> {
        let n = d.u32()?;
        if n as usize > MAX_BITMAP_WORDS {
            return Err(WireError::TooLong { what: "bitmap4", len: n, max: MAX_BITMAP_WORDS as u32 });
        }
        let mut words = [0u32; MAX_BITMAP_WORDS];
        for w in words.iter_mut().take(n as usize) {
            *w = d.u32()?;
        }
        Ok(Bitmap::from_words(words))
    }

    /// Encodes the `bitmap4`.
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        e.u32(u32::from(self.len))?;
        for w in self.words() {
            e.u32(*w)?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Bitmap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// `nfstime4`: 64-bit signed seconds since the epoch and nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NfsTime4 {
    /// Seconds since the epoch (negative before it).
    pub seconds: i64,
    /// Nanoseconds, below 1,000,000,000.
    pub nseconds: u32,
}

impl NfsTime4 {
    /// Decodes an `nfstime4`; nanoseconds of a second or more are [`WireError::BadValue`].
    pub fn decode(d: &mut Decoder<'_>) -> Result<NfsTime4, WireError> {
        let seconds = d.u64()? as i64;
        let nseconds = d.u32()?;
        if nseconds >= 1_000_000_000 {
            return Err(WireError::BadValue { what: "nfstime4 nseconds", value: nseconds });
        }
        Ok(NfsTime4 { seconds, nseconds })
    }

    /// Encodes the `nfstime4`.
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        e.u64(self.seconds as u64)?;
        e.u32(self.nseconds)
    }
}

/// `nfs_ftype4`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ftype4 {
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
    /// A named-attribute directory.
    AttrDir,
    /// A named attribute.
    NamedAttr,
}

impl Ftype4 {
    /// The wire value.
    pub fn to_u32(self) -> u32 {
        match self {
            Ftype4::Reg => 1,
            Ftype4::Dir => 2,
            Ftype4::Blk => 3,
            Ftype4::Chr => 4,
            Ftype4::Lnk => 5,
            Ftype4::Sock => 6,
            Ftype4::Fifo => 7,
            Ftype4::AttrDir => 8,
            Ftype4::NamedAttr => 9,
        }
    }

    /// From the wire value.
    pub fn from_u32(v: u32) -> Result<Ftype4, WireError> {
        Ok(match v {
            1 => Ftype4::Reg,
            2 => Ftype4::Dir,
            3 => Ftype4::Blk,
            4 => Ftype4::Chr,
            5 => Ftype4::Lnk,
            6 => Ftype4::Sock,
            7 => Ftype4::Fifo,
            8 => Ftype4::AttrDir,
            9 => Ftype4::NamedAttr,
            value => return Err(WireError::BadValue { what: "nfs_ftype4", value }),
        })
    }
}

/// A numeric owner or group string as an id ("1000"); anything else (a name, "user@domain", a
/// sign, more than 10 digits or a value over `u32::MAX`) is [`WireError::BadValue`]: the
/// server must run with numeric owners (ganesha's `Only_Numeric_Owners`, Linux's
/// `nfs4_disable_idmapping`).
pub fn parse_numeric_id(s: &[u8], what: &'static str) -> Result<u32, WireError> {
    let bad = WireError::BadValue { what, value: s.len() as u32 };
    if s.is_empty() || s.len() > 10 {
        return Err(bad);
    }
    let mut v: u64 = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return Err(bad);
        }
        v = v * 10 + u64::from(c - b'0');
    }
    u32::try_from(v).map_err(|_| bad)
}

/// Encodes `id` as a numeric owner or group string, without allocating.
pub fn encode_numeric_id(e: &mut Encoder<'_>, id: u32) -> Result<(), WireError> {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    let mut v = id;
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    e.opaque(&digits[at..], MAX_OWNER)
}

/// `fsid4`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fsid {
    /// Major part.
    pub major: u64,
    /// Minor part.
    pub minor: u64,
}

/// `fattr4` decoded: the attributes the FUSE server uses, each `Some` exactly when the reply's
/// bitmap named it. An attribute the bitmap names that is not one of these is
/// [`WireError::BadValue`] (nothing is skipped: its length is not known without its type), and
/// so are values that do not use exactly the `attrlist4`'s bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fattr4 {
    /// `supported_attrs`.
    pub supported_attrs: Option<Bitmap>,
    /// `type`.
    pub ftype: Option<Ftype4>,
    /// `change`.
    pub change: Option<u64>,
    /// `size`.
    pub size: Option<u64>,
    /// `fsid`.
    pub fsid: Option<Fsid>,
    /// `lease_time`, in seconds.
    pub lease_time: Option<u32>,
    /// `rdattr_error` (READDIR: why an entry's attributes could not be had).
    pub rdattr_error: Option<super::Nfsstat4>,
    /// `filehandle`.
    pub filehandle: Option<Fh>,
    /// `fileid`.
    pub fileid: Option<u64>,
    /// `files_avail`.
    pub files_avail: Option<u64>,
    /// `files_free`.
    pub files_free: Option<u64>,
    /// `files_total`.
    pub files_total: Option<u64>,
    /// `maxfilesize`.
    pub maxfilesize: Option<u64>,
    /// `maxname`.
    pub maxname: Option<u32>,
    /// `maxread`.
    pub maxread: Option<u64>,
    /// `maxwrite`.
    pub maxwrite: Option<u64>,
    /// `mode`: permission bits and setuid/setgid/sticky, without the type.
    pub mode: Option<u32>,
    /// `numlinks`.
    pub numlinks: Option<u32>,
    /// `owner`, as a numeric id.
    pub owner: Option<u32>,
    /// `owner_group`, as a numeric id.
    pub owner_group: Option<u32>,
    /// `rawdev`: (major, minor).
    pub rawdev: Option<(u32, u32)>,
    /// `space_avail`.
    pub space_avail: Option<u64>,
    /// `space_free`.
    pub space_free: Option<u64>,
    /// `space_total`.
    pub space_total: Option<u64>,
    /// `space_used`.
    pub space_used: Option<u64>,
    /// `time_access`.
    pub time_access: Option<NfsTime4>,
    /// `time_metadata`.
    pub time_metadata: Option<NfsTime4>,
    /// `time_modify`.
    pub time_modify: Option<NfsTime4>,
    /// `mounted_on_fileid`.
    pub mounted_on_fileid: Option<u64>,
    /// `xattr_support` (RFC 8276).
    pub xattr_support: Option<bool>,
}

impl Fattr4 {
    /// Decodes a `fattr4` (its bitmap and `attrlist4`).
    pub fn decode(d: &mut Decoder<'_>) -> Result<Fattr4, WireError> {
        let mask = Bitmap::decode(d)?;
        let vals = d.opaque(MAX_ATTRLIST, "attrlist4")?;
        let mut v = Decoder::new(vals);
        let v = &mut v;
        let mut a = Fattr4::default();
        for bit in mask.iter() {
            match bit {
                attr::SUPPORTED_ATTRS => a.supported_attrs = Some(Bitmap::decode(v)?),
                attr::TYPE => a.ftype = Some(Ftype4::from_u32(v.u32()?)?),
                attr::CHANGE => a.change = Some(v.u64()?),
                attr::SIZE => a.size = Some(v.u64()?),
                attr::FSID => a.fsid = Some(Fsid { major: v.u64()?, minor: v.u64()? }),
                attr::LEASE_TIME => a.lease_time = Some(v.u32()?),
                attr::RDATTR_ERROR => a.rdattr_error = Some(super::Nfsstat4::from_u32(v.u32()?)),
                attr::FILEHANDLE => a.filehandle = Some(Fh::decode(v)?),
                attr::FILEID => a.fileid = Some(v.u64()?),
                attr::FILES_AVAIL => a.files_avail = Some(v.u64()?),
                attr::FILES_FREE => a.files_free = Some(v.u64()?),
                attr::FILES_TOTAL => a.files_total = Some(v.u64()?),
                attr::MAXFILESIZE => a.maxfilesize = Some(v.u64()?),
                attr::MAXNAME => a.maxname = Some(v.u32()?),
                attr::MAXREAD => a.maxread = Some(v.u64()?),
                attr::MAXWRITE => a.maxwrite = Some(v.u64()?),
                attr::MODE => a.mode = Some(v.u32()?),
                attr::NUMLINKS => a.numlinks = Some(v.u32()?),
                attr::OWNER => a.owner = Some(parse_numeric_id(v.opaque(MAX_OWNER, "owner")?, "owner")?),
                attr::OWNER_GROUP => {
                    let s = v.opaque(MAX_OWNER, "owner_group")?;
                    a.owner_group = Some(parse_numeric_id(s, "owner_group")?)
                }
                attr::RAWDEV => a.rawdev = Some((v.u32()?, v.u32()?)),
                attr::SPACE_AVAIL => a.space_avail = Some(v.u64()?),
                attr::SPACE_FREE => a.space_free = Some(v.u64()?),
                attr::SPACE_TOTAL => a.space_total = Some(v.u64()?),
                attr::SPACE_USED => a.space_used = Some(v.u64()?),
                attr::TIME_ACCESS => a.time_access = Some(NfsTime4::decode(v)?),
                attr::TIME_METADATA => a.time_metadata = Some(NfsTime4::decode(v)?),
                attr::TIME_MODIFY => a.time_modify = Some(NfsTime4::decode(v)?),
                attr::MOUNTED_ON_FILEID => a.mounted_on_fileid = Some(v.u64()?),
                attr::XATTR_SUPPORT => a.xattr_support = Some(v.bool()?),
                value => {
                    return Err(WireError::BadValue { what: "fattr4 attribute not decoded here", value })
                }
            }
        }
        v.finish()?;
        Ok(a)
    }

    /// The bitmap of the attributes that are `Some`.
    pub fn mask(&self) -> Bitmap {
        let mut m = Bitmap::EMPTY;
        let a = self;
        for (bit, set) in [
            (attr::SUPPORTED_ATTRS, a.supported_attrs.is_some()),
            (attr::TYPE, a.ftype.is_some()),
            (attr::CHANGE, a.change.is_some()),
            (attr::SIZE, a.size.is_some()),
            (attr::FSID, a.fsid.is_some()),
            (attr::LEASE_TIME, a.lease_time.is_some()),
            (attr::RDATTR_ERROR, a.rdattr_error.is_some()),
            (attr::FILEHANDLE, a.filehandle.is_some()),
            (attr::FILEID, a.fileid.is_some()),
            (attr::FILES_AVAIL, a.files_avail.is_some()),
            (attr::FILES_FREE, a.files_free.is_some()),
            (attr::FILES_TOTAL, a.files_total.is_some()),
            (attr::MAXFILESIZE, a.maxfilesize.is_some()),
            (attr::MAXNAME, a.maxname.is_some()),
            (attr::MAXREAD, a.maxread.is_some()),
            (attr::MAXWRITE, a.maxwrite.is_some()),
            (attr::MODE, a.mode.is_some()),
            (attr::NUMLINKS, a.numlinks.is_some()),
            (attr::OWNER, a.owner.is_some()),
            (attr::OWNER_GROUP, a.owner_group.is_some()),
            (attr::RAWDEV, a.rawdev.is_some()),
            (attr::SPACE_AVAIL, a.space_avail.is_some()),
            (attr::SPACE_FREE, a.space_free.is_some()),
            (attr::SPACE_TOTAL, a.space_total.is_some()),
            (attr::SPACE_USED, a.space_used.is_some()),
            (attr::TIME_ACCESS, a.time_access.is_some()),
            (attr::TIME_METADATA, a.time_metadata.is_some()),
            (attr::TIME_MODIFY, a.time_modify.is_some()),
            (attr::MOUNTED_ON_FILEID, a.mounted_on_fileid.is_some()),
            (attr::XATTR_SUPPORT, a.xattr_support.is_some()),
        ] {
            if set {
                m.insert(bit);
            }
        }
        m
    }

    /// Encodes the attributes that are `Some` as a `fattr4` (fake servers, tests).
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        let mask = self.mask();
        mask.encode(e)?;
        let len_at = e.reserve_u32()?;
        let start = e.position();
        let a = self;
        for bit in mask.iter() {
            match bit {
                attr::SUPPORTED_ATTRS => a.supported_attrs.unwrap_or_default().encode(e)?,
                attr::TYPE => e.u32(a.ftype.map_or(0, Ftype4::to_u32))?,
                attr::CHANGE => e.u64(a.change.unwrap_or_default())?,
                attr::SIZE => e.u64(a.size.unwrap_or_default())?,
                attr::FSID => {
                    let f = a.fsid.unwrap_or_default();
                    e.u64(f.major)?;
                    e.u64(f.minor)?
                }
                attr::LEASE_TIME => e.u32(a.lease_time.unwrap_or_default())?,
                attr::RDATTR_ERROR => e.u32(a.rdattr_error.map_or(0, super::Nfsstat4::to_u32))?,
                attr::FILEHANDLE => a.filehandle.unwrap_or(Fh::EMPTY).encode(e)?,
                attr::FILEID => e.u64(a.fileid.unwrap_or_default())?,
                attr::FILES_AVAIL => e.u64(a.files_avail.unwrap_or_default())?,
                attr::FILES_FREE => e.u64(a.files_free.unwrap_or_default())?,
                attr::FILES_TOTAL => e.u64(a.files_total.unwrap_or_default())?,
                attr::MAXFILESIZE => e.u64(a.maxfilesize.unwrap_or_default())?,
                attr::MAXNAME => e.u32(a.maxname.unwrap_or_default())?,
                attr::MAXREAD => e.u64(a.maxread.unwrap_or_default())?,
                attr::MAXWRITE => e.u64(a.maxwrite.unwrap_or_default())?,
                attr::MODE => e.u32(a.mode.unwrap_or_default())?,
                attr::NUMLINKS => e.u32(a.numlinks.unwrap_or_default())?,
                attr::OWNER => encode_numeric_id(e, a.owner.unwrap_or_default())?,
                attr::OWNER_GROUP => encode_numeric_id(e, a.owner_group.unwrap_or_default())?,
                attr::RAWDEV => {
                    let (ma, mi) = a.rawdev.unwrap_or_default();
                    e.u32(ma)?;
                    e.u32(mi)?
                }
                attr::SPACE_AVAIL => e.u64(a.space_avail.unwrap_or_default())?,
                attr::SPACE_FREE => e.u64(a.space_free.unwrap_or_default())?,
                attr::SPACE_TOTAL => e.u64(a.space_total.unwrap_or_default())?,
                attr::SPACE_USED => e.u64(a.space_used.unwrap_or_default())?,
                attr::TIME_ACCESS => a.time_access.unwrap_or_default().encode(e)?,
                attr::TIME_METADATA => a.time_metadata.unwrap_or_default().encode(e)?,
                attr::TIME_MODIFY => a.time_modify.unwrap_or_default().encode(e)?,
                attr::MOUNTED_ON_FILEID => e.u64(a.mounted_on_fileid.unwrap_or_default())?,
                attr::XATTR_SUPPORT => e.bool(a.xattr_support.unwrap_or_default())?,
                _ => {}
            }
        }
        let len = (e.position() - start) as u32;
        e.patch_u32(len_at, len);
        Ok(())
    }
}

/// `settime4` (SETATTR's `time_access_set` and `time_modify_set`), or leave the time alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SetTime4 {
    /// Leave the time alone (the attribute is not sent).
    #[default]
    DontChange,
    /// SET_TO_SERVER_TIME4: the server's current time.
    ServerTime,
    /// SET_TO_CLIENT_TIME4: this time.
    ClientTime(NfsTime4),
}

/// What SETATTR, CREATE and OPEN(CREATE) set, encoded as a `fattr4` of `size`, `mode`, `owner`,
/// `owner_group` (numeric strings), `time_access_set` and `time_modify_set`: only the ones
/// given are sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttrs {
    /// Size (truncate or extend).
    pub size: Option<u64>,
    /// Permission bits.
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Access time.
    pub atime: SetTime4,
    /// Modification time.
    pub mtime: SetTime4,
}

impl SetAttrs {
    /// Nothing to set (an empty `fattr4`).
    pub const NONE: SetAttrs = SetAttrs {
        size: None,
        mode: None,
        uid: None,
        gid: None,
        atime: SetTime4::DontChange,
        mtime: SetTime4::DontChange,
    };

    /// The bitmap of what is set.
    pub fn mask(&self) -> Bitmap {
        let mut m = Bitmap::EMPTY;
        for (bit, set) in [
            (attr::SIZE, self.size.is_some()),
            (attr::MODE, self.mode.is_some()),
            (attr::OWNER, self.uid.is_some()),
            (attr::OWNER_GROUP, self.gid.is_some()),
            (attr::TIME_ACCESS_SET, self.atime != SetTime4::DontChange),
            (attr::TIME_MODIFY_SET, self.mtime != SetTime4::DontChange),
        ] {
            if set {
                m.insert(bit);
            }
        }
        m
    }

    /// Encodes the `fattr4`: the bitmap, then the values in attribute order.
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        self.mask().encode(e)?;
        let len_at = e.reserve_u32()?;
        let start = e.position();
        if let Some(s) = self.size {
            e.u64(s)?;
        }
        if let Some(m) = self.mode {
            e.u32(m)?;
        }
        if let Some(u) = self.uid {
            encode_numeric_id(e, u)?;
        }
        if let Some(g) = self.gid {
            encode_numeric_id(e, g)?;
        }
        for t in [self.atime, self.mtime] {
            match t {
                SetTime4::DontChange => {}
                SetTime4::ServerTime => e.u32(0)?,
                SetTime4::ClientTime(t) => {
                    e.u32(1)?;
                    t.encode(e)?;
                }
            }
        }
        let len = (e.position() - start) as u32;
        e.patch_u32(len_at, len);
        Ok(())
    }
}

/// `change_info4`: a directory's change attribute before and after an operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChangeInfo {
    /// Whether `before` and `after` were taken atomically with the operation.
    pub atomic: bool,
    /// Before.
    pub before: u64,
    /// After.
    pub after: u64,
}

impl ChangeInfo {
    /// Decodes a `change_info4`.
    pub fn decode(d: &mut Decoder<'_>) -> Result<ChangeInfo, WireError> {
        Ok(ChangeInfo { atomic: d.bool()?, before: d.u64()?, after: d.u64()? })
    }

    /// Encodes the `change_info4`.
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        e.bool(self.atomic)?;
        e.u64(self.before)?;
        e.u64(self.after)
    }
}

/// `state_owner4` (`open_owner4`, `lock_owner4`): the client id and the client's opaque name
/// of an owner (at most [`OPAQUE_LIMIT`] bytes), borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateOwner<'a> {
    /// The client id from EXCHANGE_ID.
    pub clientid: ClientId,
    /// The owner's name.
    pub owner: &'a [u8],
}

impl<'a> StateOwner<'a> {
    /// Decodes a `state_owner4`.
    pub fn decode(d: &mut Decoder<'a>) -> Result<StateOwner<'a>, WireError> {
        Ok(StateOwner { clientid: d.u64()?, owner: d.opaque(OPAQUE_LIMIT, "state_owner4")? })
    }

    /// Encodes the `state_owner4`.
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        e.u64(self.clientid)?;
        e.opaque(self.owner, OPAQUE_LIMIT)
    }
}

/// `nfs_lock_type4`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockType {
    /// A read (shared) lock.
    Read,
    /// A write (exclusive) lock.
    Write,
    /// A read lock the client would wait for (a hint for fairness).
    ReadW,
    /// A write lock the client would wait for.
    WriteW,
}

impl LockType {
    /// The wire value.
    pub fn to_u32(self) -> u32 {
        match self {
            LockType::Read => 1,
            LockType::Write => 2,
            LockType::ReadW => 3,
            LockType::WriteW => 4,
        }
    }

    /// From the wire value.
    pub fn from_u32(v: u32) -> Result<LockType, WireError> {
        Ok(match v {
            1 => LockType::Read,
            2 => LockType::Write,
            3 => LockType::ReadW,
            4 => LockType::WriteW,
            value => return Err(WireError::BadValue { what: "nfs_lock_type4", value }),
        })
    }
}

/// `stable_how4`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stable4 {
    /// The server may cache the data until a COMMIT.
    Unstable,
    /// Data on stable storage, metadata maybe not.
    DataSync,
    /// Data and metadata on stable storage.
    FileSync,
}

impl Stable4 {
    /// The wire value.
    pub fn to_u32(self) -> u32 {
        match self {
            Stable4::Unstable => 0,
            Stable4::DataSync => 1,
            Stable4::FileSync => 2,
        }
    }

    /// From the wire value.
    pub fn from_u32(v: u32) -> Result<Stable4, WireError> {
        Ok(match v {
            0 => Stable4::Unstable,
            1 => Stable4::DataSync,
            2 => Stable4::FileSync,
            value => return Err(WireError::BadValue { what: "stable_how4", value }),
        })
    }
}

/// `channel_attrs4`: what a session's fore or back channel allows (asked in CREATE_SESSION,
/// granted in its reply).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelAttrs {
    /// Padding the server may put before a request's header (0 without RDMA).
    pub headerpadsize: u32,
    /// Largest request (COMPOUND) in bytes.
    pub maxrequestsize: u32,
    /// Largest reply in bytes.
    pub maxresponsesize: u32,
    /// Largest reply the server keeps in its reply cache.
    pub maxresponsesize_cached: u32,
    /// Most operations in a COMPOUND.
    pub maxoperations: u32,
    /// Slots: most requests outstanding at once.
    pub maxrequests: u32,
    /// RDMA's inbound read depth, if any.
    pub rdma_ird: Option<u32>,
}

impl ChannelAttrs {
    /// Decodes a `channel_attrs4`.
    pub fn decode(d: &mut Decoder<'_>) -> Result<ChannelAttrs, WireError> {
        let mut c = ChannelAttrs {
            headerpadsize: d.u32()?,
            maxrequestsize: d.u32()?,
            maxresponsesize: d.u32()?,
            maxresponsesize_cached: d.u32()?,
            maxoperations: d.u32()?,
            maxrequests: d.u32()?,
            rdma_ird: None,
        };
        match d.u32()? {
            0 => {}
            1 => c.rdma_ird = Some(d.u32()?),
            len => return Err(WireError::TooLong { what: "ca_rdma_ird", len, max: 1 }),
        }
        Ok(c)
    }

    /// Encodes the `channel_attrs4`.
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        for v in [
            self.headerpadsize,
            self.maxrequestsize,
            self.maxresponsesize,
            self.maxresponsesize_cached,
            self.maxoperations,
            self.maxrequests,
        ] {
            e.u32(v)?;
        }
        match self.rdma_ird {
            None => e.u32(0),
            Some(v) => {
                e.u32(1)?;
                e.u32(v)
            }
        }
    }
}

/// `nfs_impl_id4`: an implementation's domain, name and build date, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImplId<'a> {
    /// The implementer's DNS domain.
    pub domain: &'a [u8],
    /// The implementation's name and version.
    pub name: &'a [u8],
    /// Its build date.
    pub date: NfsTime4,
}

impl<'a> ImplId<'a> {
    /// Decodes an `nfs_impl_id4`.
    pub fn decode(d: &mut Decoder<'a>) -> Result<ImplId<'a>, WireError> {
        Ok(ImplId {
            domain: d.opaque(OPAQUE_LIMIT, "nii_domain")?,
            name: d.opaque(OPAQUE_LIMIT, "nii_name")?,
            date: NfsTime4::decode(d)?,
        })
    }

    /// Encodes the `nfs_impl_id4`.
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        e.opaque(self.domain, OPAQUE_LIMIT)?;
        e.opaque(self.name, OPAQUE_LIMIT)?;
        self.date.encode(e)
    }
}

/// An optional `nfs_impl_id4<1>` (EXCHANGE_ID's arguments and results).
pub(super) fn decode_impl_id<'a>(d: &mut Decoder<'a>) -> Result<Option<ImplId<'a>>, WireError> {
    match d.u32()? {
        0 => Ok(None),
        1 => Ok(Some(ImplId::decode(d)?)),
        len => Err(WireError::TooLong { what: "nfs_impl_id4<1>", len, max: 1 }),
    }
}

/// Encodes an optional `nfs_impl_id4<1>`.
pub(super) fn encode_impl_id(e: &mut Encoder<'_>, id: Option<&ImplId<'_>>) -> Result<(), WireError> {
    match id {
        None => e.u32(0),
        Some(id) => {
            e.u32(1)?;
            id.encode(e)
        }
    }
}
