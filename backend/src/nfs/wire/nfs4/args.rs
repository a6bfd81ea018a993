//! Encoding NFSv4.1 calls: the RPC call header of NULL and COMPOUND ([`encode_call`]), and a
//! COMPOUND's arguments ([`encode_compound`]): its tag, minor version and a sequence of typed
//! operations ([`Op`], one variant per operation the client sends).
//!
//! A WRITE's data is not copied here: the encoder stops at the data's length and says where
//! the data goes ([`Encoded::payload_at`]); the connection sends the bytes before that point,
//! the data and its XDR padding, then the bytes after it (the operations that follow the
//! WRITE), so the guest's buffers go to the socket as they are.
//!
//! NFSv4.1 ignores the `seqid` of OPEN, CLOSE, OPEN_DOWNGRADE, LOCK and LOCKU (the session's
//! slot orders requests, RFC 8881 18.16.3 and its siblings): they are sent as 0.

use super::types::{
    encode_impl_id, Bitmap, ChannelAttrs, ClientId, Fh, ImplId, LockType, SessionId, SetAttrs, Stable4,
    StateOwner, Stateid, Verifier, MAX_NAME, MAX_OPS, MAX_PATH, MAX_STATEIDS, MAX_TAG, MAX_XATTR_VALUE,
    OPAQUE_LIMIT, PROGRAM, VERSION,
};
use crate::nfs::wire::rpc::{self, AuthSys};
use crate::nfs::wire::xdr::Encoder;
use crate::nfs::wire::WireError;

/// The NFSv4 procedures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proc4 {
    /// NFSPROC4_NULL: no arguments, no results (a ping).
    Null = 0,
    /// NFSPROC4_COMPOUND.
    Compound = 1,
}

/// Encodes the RPC call header of `proc` to program 100003 version 4 with credential `auth`;
/// a COMPOUND's arguments follow ([`encode_compound`]), a NULL has none.
pub fn encode_call(e: &mut Encoder<'_>, xid: u32, proc: Proc4, auth: &AuthSys<'_>) -> Result<(), WireError> {
    rpc::encode_call(e, xid, PROGRAM, VERSION, proc as u32, auth)
}

/// `nfs_opnum4`: the operations the client sends, and ILLEGAL (a reply's answer to an
/// operation the server does not know).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum OpNum {
    Access = 3,
    Close = 4,
    Commit = 5,
    Create = 6,
    Delegreturn = 8,
    Getattr = 9,
    Getfh = 10,
    Link = 11,
    Lock = 12,
    Lockt = 13,
    Locku = 14,
    Lookup = 15,
    Lookupp = 16,
    Open = 18,
    OpenDowngrade = 21,
    Putfh = 22,
    Putrootfh = 24,
    Read = 25,
    Readdir = 26,
    Readlink = 27,
    Remove = 28,
    Rename = 29,
    Restorefh = 31,
    Savefh = 32,
    Setattr = 34,
    Write = 38,
    ExchangeId = 42,
    CreateSession = 43,
    DestroySession = 44,
    FreeStateid = 45,
    Sequence = 53,
    TestStateid = 55,
    DestroyClientid = 57,
    ReclaimComplete = 58,
    Getxattr = 72,
    Setxattr = 73,
    Listxattrs = 74,
    Removexattr = 75,
    Illegal = 10044,
}

impl OpNum {
    /// Every operation, in number order.
    pub const ALL: [OpNum; 39] = [
        OpNum::Access,
        OpNum::Close,
        OpNum::Commit,
        OpNum::Create,
        OpNum::Delegreturn,
        OpNum::Getattr,
        OpNum::Getfh,
        OpNum::Link,
        OpNum::Lock,
        OpNum::Lockt,
        OpNum::Locku,
        OpNum::Lookup,
        OpNum::Lookupp,
        OpNum::Open,
        OpNum::OpenDowngrade,
        OpNum::Putfh,
        OpNum::Putrootfh,
        OpNum::Read,
        OpNum::Readdir,
        OpNum::Readlink,
        OpNum::Remove,
        OpNum::Rename,
        OpNum::Restorefh,
        OpNum::Savefh,
        OpNum::Setattr,
        OpNum::Write,
        OpNum::ExchangeId,
        OpNum::CreateSession,
        OpNum::DestroySession,
        OpNum::FreeStateid,
        OpNum::Sequence,
        OpNum::TestStateid,
        OpNum::DestroyClientid,
        OpNum::ReclaimComplete,
        OpNum::Getxattr,
        OpNum::Setxattr,
        OpNum::Listxattrs,
        OpNum::Removexattr,
        OpNum::Illegal,
    ];

    /// From the wire value: `None` for an operation the client never sends.
    pub fn from_u32(v: u32) -> Option<OpNum> {
        OpNum::ALL.iter().copied().find(|op| *op as u32 == v)
    }
}

/// `createtype4`: what CREATE makes (regular files are made by OPEN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateKind<'a> {
    /// A directory.
    Dir,
    /// A symbolic link to this target.
    Link(&'a [u8]),
    /// A block device (major, minor).
    Blk(u32, u32),
    /// A character device (major, minor).
    Chr(u32, u32),
    /// A socket.
    Sock,
    /// A named pipe.
    Fifo,
}

/// `createhow4`: how OPEN creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateHow4<'a> {
    /// UNCHECKED4: create, or open what exists (the attributes then are a SETATTR's).
    Unchecked(&'a SetAttrs),
    /// GUARDED4: create; NFS4ERR_EXIST if the name exists.
    Guarded(&'a SetAttrs),
    /// EXCLUSIVE4 (NFSv4.0's, deprecated in 4.1): the verifier only.
    Exclusive(Verifier),
    /// EXCLUSIVE4_1: the verifier and attributes (not the times: the server may keep the
    /// verifier in them, see `suppattr_exclcreat`).
    Exclusive41 {
        /// Tells a retransmission from another client's create.
        verf: Verifier,
        /// What to set on the new file.
        attrs: &'a SetAttrs,
    },
}

/// `open_delegation_type4` (CLAIM_PREVIOUS: the delegation the client had).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DelegationType {
    /// OPEN_DELEGATE_NONE.
    None = 0,
    /// OPEN_DELEGATE_READ.
    Read = 1,
    /// OPEN_DELEGATE_WRITE.
    Write = 2,
}

/// `open_claim4`: what the OPEN names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenClaim<'a> {
    /// CLAIM_NULL: this name in the current file handle's directory.
    Null(&'a [u8]),
    /// CLAIM_FH: the current file handle.
    Fh,
    /// CLAIM_PREVIOUS: reclaim (in the grace period) the open of the current file handle,
    /// with the delegation it had.
    Previous(DelegationType),
}

/// OPEN's arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Open<'a> {
    /// [`share`](super::share) access bits (and the WANT bits of NFSv4.1).
    pub share_access: u32,
    /// [`share`](super::share) deny bits.
    pub share_deny: u32,
    /// The open owner.
    pub owner: StateOwner<'a>,
    /// Create (how), or `None` to open what exists.
    pub create: Option<CreateHow4<'a>>,
    /// What is opened.
    pub claim: OpenClaim<'a>,
}

/// `locker4`: a lock by a new lock owner (from an open) or by an existing lock stateid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locker<'a> {
    /// The first lock of `owner` on the file: from the open's stateid.
    New {
        /// The open's stateid.
        open_stateid: Stateid,
        /// The lock owner.
        owner: StateOwner<'a>,
    },
    /// A further lock of the owner that has this lock stateid.
    Existing {
        /// The lock stateid.
        lock_stateid: Stateid,
    },
}

/// `callback_sec_parms4`: the security the server's callbacks are to use.
#[derive(Clone, Copy, Debug)]
pub enum CbSec<'a> {
    /// AUTH_NONE.
    None,
    /// AUTH_SYS with this credential.
    Sys(AuthSys<'a>),
}

/// EXCHANGE_ID's arguments (`state_protect4_a` is SP4_NONE).
#[derive(Clone, Copy, Debug)]
pub struct ExchangeId<'a> {
    /// `co_verifier`: the client's incarnation (a new one tells the server to drop the old
    /// incarnation's state).
    pub verifier: Verifier,
    /// `co_ownerid`: the client's long-lived unique name (at most [`OPAQUE_LIMIT`] bytes).
    pub owner_id: &'a [u8],
    /// [`exchgid`](super::exchgid) flags.
    pub flags: u32,
    /// The client's implementation id, if sent.
    pub impl_id: Option<ImplId<'a>>,
}

/// CREATE_SESSION's arguments.
#[derive(Clone, Copy, Debug)]
pub struct CreateSession<'a> {
    /// The client id from EXCHANGE_ID.
    pub clientid: ClientId,
    /// EXCHANGE_ID's `eir_sequenceid` (then one more per CREATE_SESSION).
    pub sequence: u32,
    /// [`create_session`](super::create_session) flags.
    pub flags: u32,
    /// What the client asks of the fore channel.
    pub fore: ChannelAttrs,
    /// What the client asks of the back channel.
    pub back: ChannelAttrs,
    /// The callback program number.
    pub cb_program: u32,
    /// The callbacks' security.
    pub sec: CbSec<'a>,
}

/// `setxattr_option4`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetxattrOption {
    /// Create or replace.
    Either = 0,
    /// Create; fail if it exists (Linux's XATTR_CREATE).
    Create = 1,
    /// Replace; fail if it does not exist (XATTR_REPLACE).
    Replace = 2,
}

/// One operation of a COMPOUND, its arguments borrowed from the caller.
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub enum Op<'a> {
    /// `mask`: [`access`](super::access) bits.
    Access {
        mask: u32,
    },
    Close {
        stateid: Stateid,
    },
    Commit {
        offset: u64,
        count: u32,
    },
    /// The new object becomes the current file handle.
    Create {
        kind: CreateKind<'a>,
        name: &'a [u8],
        attrs: &'a SetAttrs,
    },
    CreateSession(CreateSession<'a>),
    /// Returns the delegation of the current file handle.
    Delegreturn {
        stateid: Stateid,
    },
    DestroyClientid {
        clientid: ClientId,
    },
    DestroySession {
        session: SessionId,
    },
    ExchangeId(ExchangeId<'a>),
    FreeStateid {
        stateid: Stateid,
    },
    Getattr {
        attrs: Bitmap,
    },
    Getfh,
    Getxattr {
        name: &'a [u8],
    },
    /// The saved file handle is linked into the current one (a directory) as `name`.
    Link {
        name: &'a [u8],
    },
    Listxattrs {
        cookie: u64,
        maxcount: u32,
    },
    /// `length` u64::MAX: to the end of the file.
    Lock {
        locktype: LockType,
        reclaim: bool,
        offset: u64,
        length: u64,
        locker: Locker<'a>,
    },
    Lockt {
        locktype: LockType,
        offset: u64,
        length: u64,
        owner: StateOwner<'a>,
    },
    Locku {
        locktype: LockType,
        stateid: Stateid,
        offset: u64,
        length: u64,
    },
    Lookup {
        name: &'a [u8],
    },
    Lookupp,
    Open(Open<'a>),
    OpenDowngrade {
        stateid: Stateid,
        share_access: u32,
        share_deny: u32,
    },
    Putfh {
        fh: &'a Fh,
    },
    Putrootfh,
    Read {
        stateid: Stateid,
        offset: u64,
        count: u32,
    },
    /// `attrs`: the attributes of each entry (with `filehandle`, READDIRPLUS's equivalent).
    Readdir {
        cookie: u64,
        verf: Verifier,
        dircount: u32,
        maxcount: u32,
        attrs: Bitmap,
    },
    Readlink,
    /// `one_fs`: only the current file handle's filesystem (false: every one).
    ReclaimComplete {
        one_fs: bool,
    },
    Remove {
        name: &'a [u8],
    },
    Removexattr {
        name: &'a [u8],
    },
    /// `old` in the saved file handle's directory becomes `new` in the current one's.
    Rename {
        old: &'a [u8],
        new: &'a [u8],
    },
    Restorefh,
    Savefh,
    Sequence {
        session: SessionId,
        sequenceid: u32,
        slotid: u32,
        highest_slotid: u32,
        cachethis: bool,
    },
    /// `stateid`: the open's when the size changes, else [`Stateid::ANONYMOUS`].
    Setattr {
        stateid: Stateid,
        attrs: &'a SetAttrs,
    },
    Setxattr {
        option: SetxattrOption,
        name: &'a [u8],
        value: &'a [u8],
    },
    TestStateid {
        stateids: &'a [Stateid],
    },
    /// The data is NOT here: the encoding stops at its length ([`Encoded::payload_at`]).
    Write {
        stateid: Stateid,
        offset: u64,
        stable: Stable4,
        count: u32,
    },
}

impl Op<'_> {
    /// The operation's number.
    pub fn num(&self) -> OpNum {
        match self {
            Op::Access { .. } => OpNum::Access,
            Op::Close { .. } => OpNum::Close,
            Op::Commit { .. } => OpNum::Commit,
            Op::Create { .. } => OpNum::Create,
            Op::CreateSession(_) => OpNum::CreateSession,
            Op::Delegreturn { .. } => OpNum::Delegreturn,
            Op::DestroyClientid { .. } => OpNum::DestroyClientid,
            Op::DestroySession { .. } => OpNum::DestroySession,
            Op::ExchangeId(_) => OpNum::ExchangeId,
            Op::FreeStateid { .. } => OpNum::FreeStateid,
            Op::Getattr { .. } => OpNum::Getattr,
            Op::Getfh => OpNum::Getfh,
            Op::Getxattr { .. } => OpNum::Getxattr,
            Op::Link { .. } => OpNum::Link,
            Op::Listxattrs { .. } => OpNum::Listxattrs,
            Op::Lock { .. } => OpNum::Lock,
            Op::Lockt { .. } => OpNum::Lockt,
            Op::Locku { .. } => OpNum::Locku,
            Op::Lookup { .. } => OpNum::Lookup,
            Op::Lookupp => OpNum::Lookupp,
            Op::Open(_) => OpNum::Open,
            Op::OpenDowngrade { .. } => OpNum::OpenDowngrade,
            Op::Putfh { .. } => OpNum::Putfh,
            Op::Putrootfh => OpNum::Putrootfh,
            Op::Read { .. } => OpNum::Read,
            Op::Readdir { .. } => OpNum::Readdir,
            Op::Readlink => OpNum::Readlink,
            Op::ReclaimComplete { .. } => OpNum::ReclaimComplete,
            Op::Remove { .. } => OpNum::Remove,
            Op::Removexattr { .. } => OpNum::Removexattr,
            Op::Rename { .. } => OpNum::Rename,
            Op::Restorefh => OpNum::Restorefh,
            Op::Savefh => OpNum::Savefh,
            Op::Sequence { .. } => OpNum::Sequence,
            Op::Setattr { .. } => OpNum::Setattr,
            Op::Setxattr { .. } => OpNum::Setxattr,
            Op::TestStateid { .. } => OpNum::TestStateid,
            Op::Write { .. } => OpNum::Write,
        }
    }
}

/// What [`encode_compound`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Encoded {
    /// Operations encoded.
    pub ops: u32,
    /// With a WRITE: the encoder's position where its data goes (right after the data's
    /// length), and the data's length. The call is the bytes before it, the data, `pad(len)`
    /// zero bytes, then the bytes from it to the end.
    pub payload_at: Option<(usize, u32)>,
}

/// Encodes a COMPOUND's arguments (after the RPC call header): `tag`, `minorversion`
/// ([`MINOR_VERSION`](super::MINOR_VERSION), or
/// [`MINOR_VERSION_XATTR`](super::MINOR_VERSION_XATTR) for the xattr operations), then `ops`.
/// At most [`MAX_OPS`] operations and one WRITE (whose data is the caller's to send, see
/// [`Encoded::payload_at`]).
pub fn encode_compound(
    e: &mut Encoder<'_>,
    tag: &[u8],
    minorversion: u32,
    ops: &[Op<'_>],
) -> Result<Encoded, WireError> {
    encode_compound_after(e, tag, minorversion, None, ops)
}

/// [`encode_compound`] with `first` (a session's SEQUENCE) before `ops`, so that a caller's
/// operations need not be copied behind it.
pub fn encode_compound_after(
    e: &mut Encoder<'_>,
    tag: &[u8],
    minorversion: u32,
    first: Option<&Op<'_>>,
    ops: &[Op<'_>],
) -> Result<Encoded, WireError> {
    let n = ops.len() + usize::from(first.is_some());
    if n > MAX_OPS as usize {
        return Err(WireError::TooLong { what: "COMPOUND operations", len: n as u32, max: MAX_OPS });
    }
    e.opaque(tag, MAX_TAG)?;
    e.u32(minorversion)?;
    e.u32(n as u32)?;
    let mut payload_at = None;
    for op in first.into_iter().chain(ops) {
        e.u32(op.num() as u32)?;
        if let Some(at) = encode_op(e, op)? {
            if payload_at.is_some() {
                return Err(WireError::BadValue { what: "a second WRITE in one COMPOUND", value: 2 });
            }
            payload_at = Some(at);
        }
    }
    Ok(Encoded { ops: n as u32, payload_at })
}

fn encode_op(e: &mut Encoder<'_>, op: &Op<'_>) -> Result<Option<(usize, u32)>, WireError> {
    match *op {
        Op::Access { mask } => e.u32(mask)?,
        Op::Close { stateid } => {
            e.u32(0)?;
            stateid.encode(e)?
        }
        Op::Commit { offset, count } => {
            e.u64(offset)?;
            e.u32(count)?
        }
        Op::Create { kind, name, attrs } => {
            match kind {
                CreateKind::Link(target) => {
                    e.u32(5)?;
                    e.opaque(target, MAX_PATH)?
                }
                CreateKind::Blk(major, minor) | CreateKind::Chr(major, minor) => {
                    e.u32(if matches!(kind, CreateKind::Blk(..)) { 3 } else { 4 })?;
                    e.u32(major)?;
                    e.u32(minor)?
                }
                CreateKind::Dir => e.u32(2)?,
                CreateKind::Sock => e.u32(6)?,
                CreateKind::Fifo => e.u32(7)?,
            }
            e.opaque(name, MAX_NAME)?;
            attrs.encode(e)?
        }
        Op::CreateSession(ref c) => encode_create_session(e, c)?,
        Op::DestroyClientid { clientid } => e.u64(clientid)?,
        Op::DestroySession { session } => session.encode(e)?,
        Op::ExchangeId(ref x) => {
            e.fixed(&x.verifier)?;
            e.opaque(x.owner_id, OPAQUE_LIMIT)?;
            e.u32(x.flags)?;
            e.u32(0)?; // SP4_NONE
            encode_impl_id(e, x.impl_id.as_ref())?
        }
        Op::Delegreturn { stateid } | Op::FreeStateid { stateid } => stateid.encode(e)?,
        Op::Getattr { attrs } => attrs.encode(e)?,
        Op::Getfh | Op::Lookupp | Op::Putrootfh | Op::Readlink | Op::Restorefh | Op::Savefh => {}
        Op::Getxattr { name } | Op::Removexattr { name } => e.opaque(name, MAX_NAME)?,
        Op::Link { name } | Op::Lookup { name } | Op::Remove { name } => e.opaque(name, MAX_NAME)?,
        Op::Listxattrs { cookie, maxcount } => {
            e.u64(cookie)?;
            e.u32(maxcount)?
        }
        Op::Lock { locktype, reclaim, offset, length, locker } => {
            e.u32(locktype.to_u32())?;
            e.bool(reclaim)?;
            e.u64(offset)?;
            e.u64(length)?;
            match locker {
                Locker::New { open_stateid, owner } => {
                    e.bool(true)?;
                    e.u32(0)?; // open_seqid
                    open_stateid.encode(e)?;
                    e.u32(0)?; // lock_seqid
                    owner.encode(e)?
                }
                Locker::Existing { lock_stateid } => {
                    e.bool(false)?;
                    lock_stateid.encode(e)?;
                    e.u32(0)? // lock_seqid
                }
            }
        }
        Op::Lockt { locktype, offset, length, owner } => {
            e.u32(locktype.to_u32())?;
            e.u64(offset)?;
            e.u64(length)?;
            owner.encode(e)?
        }
        Op::Locku { locktype, stateid, offset, length } => {
            e.u32(locktype.to_u32())?;
            e.u32(0)?; // seqid
            stateid.encode(e)?;
            e.u64(offset)?;
            e.u64(length)?
        }
        Op::Open(ref o) => encode_open(e, o)?,
        Op::OpenDowngrade { stateid, share_access, share_deny } => {
            stateid.encode(e)?;
            e.u32(0)?; // seqid
            e.u32(share_access)?;
            e.u32(share_deny)?
        }
        Op::Putfh { fh } => fh.encode(e)?,
        Op::Read { stateid, offset, count } => {
            stateid.encode(e)?;
            e.u64(offset)?;
            e.u32(count)?
        }
        Op::Readdir { cookie, verf, dircount, maxcount, attrs } => {
            e.u64(cookie)?;
            e.fixed(&verf)?;
            e.u32(dircount)?;
            e.u32(maxcount)?;
            attrs.encode(e)?
        }
        Op::ReclaimComplete { one_fs } => e.bool(one_fs)?,
        Op::Rename { old, new } => {
            e.opaque(old, MAX_NAME)?;
            e.opaque(new, MAX_NAME)?
        }
        Op::Sequence { session, sequenceid, slotid, highest_slotid, cachethis } => {
            session.encode(e)?;
            e.u32(sequenceid)?;
            e.u32(slotid)?;
            e.u32(highest_slotid)?;
            e.bool(cachethis)?
        }
        Op::Setattr { stateid, attrs } => {
            stateid.encode(e)?;
            attrs.encode(e)?
        }
        Op::Setxattr { option, name, value } => {
            e.u32(option as u32)?;
            e.opaque(name, MAX_NAME)?;
            e.opaque(value, MAX_XATTR_VALUE)?
        }
        Op::TestStateid { stateids } => {
            if stateids.len() > MAX_STATEIDS as usize {
                let len = stateids.len() as u32;
                return Err(WireError::TooLong { what: "TEST_STATEID stateids", len, max: MAX_STATEIDS });
            }
            e.u32(stateids.len() as u32)?;
            for s in stateids {
                s.encode(e)?;
            }
        }
        Op::Write { stateid, offset, stable, count } => {
            stateid.encode(e)?;
            e.u64(offset)?;
            e.u32(stable.to_u32())?;
            e.u32(count)?;
            return Ok(Some((e.position(), count)));
        }
    }
    Ok(None)
}

fn encode_open(e: &mut Encoder<'_>, o: &Open<'_>) -> Result<(), WireError> {
    e.u32(0)?; // seqid
    e.u32(o.share_access)?;
    e.u32(o.share_deny)?;
    o.owner.encode(e)?;
    match o.create {
        None => e.u32(0)?,
        Some(how) => {
            e.u32(1)?;
            match how {
                CreateHow4::Unchecked(a) => {
                    e.u32(0)?;
                    a.encode(e)?
                }
                CreateHow4::Guarded(a) => {
                    e.u32(1)?;
                    a.encode(e)?
                }
                CreateHow4::Exclusive(verf) => {
                    e.u32(2)?;
                    e.fixed(&verf)?
                }
                CreateHow4::Exclusive41 { verf, attrs } => {
                    e.u32(3)?;
                    e.fixed(&verf)?;
                    attrs.encode(e)?
                }
            }
        }
    }
    match o.claim {
        OpenClaim::Null(name) => {
            e.u32(0)?;
            e.opaque(name, MAX_NAME)
        }
        OpenClaim::Previous(deleg) => {
            e.u32(1)?;
            e.u32(deleg as u32)
        }
        OpenClaim::Fh => e.u32(4),
    }
}

fn encode_create_session(e: &mut Encoder<'_>, c: &CreateSession<'_>) -> Result<(), WireError> {
    e.u64(c.clientid)?;
    e.u32(c.sequence)?;
    e.u32(c.flags)?;
    c.fore.encode(e)?;
    c.back.encode(e)?;
    e.u32(c.cb_program)?;
    e.u32(1)?; // one callback_sec_parms4
    match c.sec {
        CbSec::None => e.u32(rpc::AUTH_NONE),
        CbSec::Sys(a) => {
            if a.machine.len() > rpc::MAX_MACHINE_NAME {
                let len = a.machine.len() as u32;
                return Err(WireError::TooLong {
                    what: "machine name",
                    len,
                    max: rpc::MAX_MACHINE_NAME as u32,
                });
            }
            if a.gids.len() > rpc::MAX_GIDS {
                let len = a.gids.len() as u32;
                return Err(WireError::TooLong { what: "gids", len, max: rpc::MAX_GIDS as u32 });
            }
            e.u32(rpc::AUTH_SYS)?;
            e.u32(a.stamp)?;
            e.opaque(a.machine, rpc::MAX_MACHINE_NAME as u32)?;
            e.u32(a.uid)?;
            e.u32(a.gid)?;
            e.u32(a.gids.len() as u32)?;
            for g in a.gids {
                e.u32(*g)?;
            }
            Ok(())
        }
    }
}
