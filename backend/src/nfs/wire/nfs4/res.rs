//! Decoding NFSv4.1 COMPOUND replies in place: [`decode_compound`] checks a whole reply once
//! (every result, the protocol's shape, that the record is used exactly) and returns its status,
//! tag and a lazy iterator of typed results ([`OpRes`], one variant per operation). The pieces
//! are public for a connection that decodes as the bytes come: [`decode_compound_head`], then
//! [`decode_op`] per result, and [`decode_read_head`] for a READ whose data it places itself.
//!
//! Nothing is copied or allocated: names, symlink targets, xattr values, READ data and READDIR
//! entries borrow the receive buffer; lists (READDIR entries, xattr names, TEST_STATEID's
//! statuses) are walked once to check them and then iterated in place.

use super::args::OpNum;
use super::status::Nfsstat4;
use super::types::{
    decode_impl_id, Bitmap, ChangeInfo, ChannelAttrs, ClientId, Fattr4, Fh, ImplId, LockType, SessionId,
    Stable4, StateOwner, Stateid, Verifier, MAX_NAME, MAX_OPS, MAX_PATH, MAX_STATEIDS, MAX_TAG,
    MAX_XATTR_VALUE, OPAQUE_LIMIT,
};
use crate::nfs::wire::xdr::Decoder;
use crate::nfs::wire::WireError;

/// SEQUENCE's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SequenceRes {
    /// The session.
    pub sessionid: SessionId,
    /// The slot's sequence id (the request's, echoed).
    pub sequenceid: u32,
    /// The slot used.
    pub slotid: u32,
    /// The highest slot id the server will accept now.
    pub highest_slotid: u32,
    /// The highest slot id the server would like the client to use.
    pub target_highest_slotid: u32,
    /// [`seq_status`](super::seq_status) flags.
    pub status_flags: u32,
}

/// `nfsace4`: an access control entry, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ace<'a> {
    /// `acetype4`.
    pub acetype: u32,
    /// `aceflag4`.
    pub flag: u32,
    /// `acemask4`.
    pub access_mask: u32,
    /// Whom it names.
    pub who: &'a [u8],
}

impl<'a> Ace<'a> {
    fn decode(d: &mut Decoder<'a>) -> Result<Ace<'a>, WireError> {
        Ok(Ace {
            acetype: d.u32()?,
            flag: d.u32()?,
            access_mask: d.u32()?,
            who: d.opaque(OPAQUE_LIMIT, "ace who")?,
        })
    }
}

/// `nfs_space_limit4`: when a write delegation's holder must flush on close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceLimit {
    /// NFS_LIMIT_SIZE: a file size.
    Size(u64),
    /// NFS_LIMIT_BLOCKS: blocks and their size.
    Blocks {
        /// Number of blocks.
        num_blocks: u32,
        /// Bytes per block.
        bytes_per_block: u32,
    },
}

/// `open_delegation4`: the delegation an OPEN granted (the client returns it, or asks for none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delegation<'a> {
    /// OPEN_DELEGATE_NONE.
    None,
    /// OPEN_DELEGATE_READ.
    Read {
        /// The delegation's stateid (for DELEGRETURN).
        stateid: Stateid,
        /// Recalled already (a reclaim).
        recall: bool,
        /// Who may open for reading without ACCESS.
        permissions: Ace<'a>,
    },
    /// OPEN_DELEGATE_WRITE.
    Write {
        /// The delegation's stateid.
        stateid: Stateid,
        /// Recalled already.
        recall: bool,
        /// When to flush on close.
        space_limit: SpaceLimit,
        /// Who may open without ACCESS.
        permissions: Ace<'a>,
    },
    /// OPEN_DELEGATE_NONE_EXT (NFSv4.1): none, and why.
    NoneExt {
        /// `why_no_delegation4`.
        why: u32,
        /// WND4_CONTENTION: the server will push one; WND4_RESOURCE: it will signal one.
        later: Option<bool>,
    },
}

impl<'a> Delegation<'a> {
    fn decode(d: &mut Decoder<'a>) -> Result<Delegation<'a>, WireError> {
        Ok(match d.u32()? {
            0 => Delegation::None,
            1 => Delegation::Read {
                stateid: Stateid::decode(d)?,
                recall: d.bool()?,
                permissions: Ace::decode(d)?,
            },
            2 => {
                let stateid = Stateid::decode(d)?;
                let recall = d.bool()?;
                let space_limit = match d.u32()? {
                    1 => SpaceLimit::Size(d.u64()?),
                    2 => SpaceLimit::Blocks { num_blocks: d.u32()?, bytes_per_block: d.u32()? },
                    value => return Err(WireError::BadValue { what: "limit_by4", value }),
                };
                Delegation::Write { stateid, recall, space_limit, permissions: Ace::decode(d)? }
            }
            3 => {
                let why = d.u32()?;
                let later = match why {
                    1 | 2 => Some(d.bool()?),
                    0..=8 => None,
                    value => return Err(WireError::BadValue { what: "why_no_delegation4", value }),
                };
                Delegation::NoneExt { why, later }
            }
            value => return Err(WireError::BadValue { what: "open_delegation_type4", value }),
        })
    }
}

/// OPEN's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenRes<'a> {
    /// The open stateid.
    pub stateid: Stateid,
    /// The directory's change (CLAIM_NULL).
    pub cinfo: ChangeInfo,
    /// [`open_result`](super::open_result) flags.
    pub rflags: u32,
    /// The attributes set at creation.
    pub attrset: Bitmap,
    /// The delegation granted, if any.
    pub delegation: Delegation<'a>,
}

/// `LOCK4denied`: the lock in the way (LOCK's and LOCKT's NFS4ERR_DENIED).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockDenied<'a> {
    /// Its start.
    pub offset: u64,
    /// Its length (u64::MAX: to the end).
    pub length: u64,
    /// Its type.
    pub locktype: LockType,
    /// Its owner.
    pub owner: StateOwner<'a>,
}

impl<'a> LockDenied<'a> {
    fn decode(d: &mut Decoder<'a>) -> Result<LockDenied<'a>, WireError> {
        Ok(LockDenied {
            offset: d.u64()?,
            length: d.u64()?,
            locktype: LockType::from_u32(d.u32()?)?,
            owner: StateOwner::decode(d)?,
        })
    }
}

/// `state_protect4_r`: how the server protects the client's state (SP4_SSV is not accepted:
/// the client never asks for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateProtect {
    /// SP4_NONE.
    None,
    /// SP4_MACH_CRED: the operations that must, and may, use the machine credential.
    MachCred {
        /// `spo_must_enforce`.
        must_enforce: Bitmap,
        /// `spo_must_allow`.
        must_allow: Bitmap,
    },
}

/// EXCHANGE_ID's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExchangeIdRes<'a> {
    /// The client id.
    pub clientid: ClientId,
    /// The sequence id CREATE_SESSION starts from.
    pub sequenceid: u32,
    /// [`exchgid`](super::exchgid) flags.
    pub flags: u32,
    /// State protection.
    pub state_protect: StateProtect,
    /// `so_minor_id` of the server owner.
    pub server_minor_id: u64,
    /// `so_major_id` of the server owner (trunking: the same on every address of one server).
    pub server_major_id: &'a [u8],
    /// The server scope.
    pub server_scope: &'a [u8],
    /// The server's implementation id, if sent.
    pub impl_id: Option<ImplId<'a>>,
}

/// CREATE_SESSION's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateSessionRes {
    /// The new session.
    pub sessionid: SessionId,
    /// The sequence id used (the request's, echoed).
    pub sequence: u32,
    /// [`create_session`](super::create_session) flags granted.
    pub flags: u32,
    /// The fore channel granted (`maxrequests`: its slots).
    pub fore: ChannelAttrs,
    /// The back channel granted.
    pub back: ChannelAttrs,
}

/// One READDIR entry, borrowed from the reply.
#[derive(Clone, Copy, Debug)]
pub struct DirEntry4<'a> {
    /// Cookie to continue after this entry.
    pub cookie: u64,
    /// The name.
    pub name: &'a [u8],
    /// The attributes asked for (or `rdattr_error`).
    pub attrs: Fattr4,
}

/// READDIR's entries, decoded in place as they are iterated. The whole list was checked when
/// the reply was decoded, so an error here means a bug, but it is reported, not assumed.
#[derive(Clone, Debug)]
pub struct DirEntries<'a> {
    d: Decoder<'a>,
    done: bool,
}

impl<'a> DirEntries<'a> {
    fn entry(&mut self) -> Result<Option<DirEntry4<'a>>, WireError> {
        let d = &mut self.d;
        if !d.bool()? {
            return Ok(None);
        }
        let cookie = d.u64()?;
        let name = d.opaque(MAX_NAME, "component4")?;
        let attrs = Fattr4::decode(d)?;
        Ok(Some(DirEntry4 { cookie, name, attrs }))
    }
}

impl<'a> Iterator for DirEntries<'a> {
    type Item = Result<DirEntry4<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.entry().transpose();
        if !matches!(r, Some(Ok(_))) {
            self.done = true;
        }
        r
    }
}

/// A counted list of items decoded in place (xattr names, TEST_STATEID's statuses), checked
/// once when the reply was decoded.
#[derive(Clone, Debug)]
pub struct List<'a, T> {
    d: Decoder<'a>,
    left: u32,
    item: fn(&mut Decoder<'a>) -> Result<T, WireError>,
}

impl<T> List<'_, T> {
    /// Items not yet iterated.
    pub fn len(&self) -> usize {
        self.left as usize
    }

    /// Whether every item was iterated.
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }
}

impl<T> Iterator for List<'_, T> {
    type Item = Result<T, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let r = (self.item)(&mut self.d);
        self.left = if r.is_ok() { self.left - 1 } else { 0 };
        Some(r)
    }
}

/// Decodes a counted list of at most `max` items, checking each now; the list is iterated again
/// later.
fn list<'a, T>(
    d: &mut Decoder<'a>,
    max: u32,
    what: &'static str,
    item: fn(&mut Decoder<'a>) -> Result<T, WireError>,
) -> Result<List<'a, T>, WireError> {
    let n = d.u32()?;
    if n > max {
        return Err(WireError::TooLong { what, len: n, max });
    }
    let l = List { d: d.clone(), left: n, item };
    for _ in 0..n {
        item(d)?;
    }
    Ok(l)
}

fn xattr_name<'a>(d: &mut Decoder<'a>) -> Result<&'a [u8], WireError> {
    d.opaque(MAX_NAME, "xattrkey4")
}

fn status_code(d: &mut Decoder<'_>) -> Result<Nfsstat4, WireError> {
    Ok(Nfsstat4::from_u32(d.u32()?))
}

/// One operation's result, borrowed from the receive buffer.
#[derive(Clone, Debug)]
#[allow(missing_docs)]
#[allow(clippy::large_enum_variant)] // on the stack, never boxed: a reply costs no allocation
pub enum OpRes<'a> {
    Access {
        /// The bits the server could check.
        supported: u32,
        /// The bits granted.
        access: u32,
    },
    /// The open stateid, now closed.
    Close(Stateid),
    Commit {
        verf: Verifier,
    },
    Create {
        cinfo: ChangeInfo,
        attrset: Bitmap,
    },
    CreateSession(CreateSessionRes),
    Delegreturn,
    DestroyClientid,
    DestroySession,
    ExchangeId(ExchangeIdRes<'a>),
    FreeStateid,
    Getattr(Fattr4),
    Getfh(Fh),
    Getxattr(&'a [u8]),
    Link(ChangeInfo),
    Listxattrs {
        /// Cookie to continue after the last name.
        cookie: u64,
        names: List<'a, &'a [u8]>,
        eof: bool,
    },
    /// The lock stateid.
    Lock(Stateid),
    /// No conflicting lock.
    Lockt,
    /// The lock stateid, updated.
    Locku(Stateid),
    Lookup,
    Lookupp,
    Open(OpenRes<'a>),
    /// The open stateid, updated.
    OpenDowngrade(Stateid),
    Putfh,
    Putrootfh,
    /// `data` borrows the reply.
    Read {
        eof: bool,
        data: &'a [u8],
    },
    Readdir {
        verf: Verifier,
        entries: DirEntries<'a>,
        eof: bool,
    },
    Readlink(&'a [u8]),
    ReclaimComplete,
    Remove(ChangeInfo),
    Removexattr(ChangeInfo),
    Rename {
        source: ChangeInfo,
        target: ChangeInfo,
    },
    Restorefh,
    Savefh,
    Sequence(SequenceRes),
    /// The attributes set.
    Setattr(Bitmap),
    Setxattr(ChangeInfo),
    /// One status per stateid asked about.
    TestStateid(List<'a, Nfsstat4>),
    Write {
        count: u32,
        committed: Stable4,
        verf: Verifier,
    },
    /// An operation that failed (the last result of its COMPOUND). `denied`: LOCK's and
    /// LOCKT's NFS4ERR_DENIED carry the lock in the way. (A failed SETATTR's `attrsset` is
    /// checked and dropped.) OP_ILLEGAL's answer is `op` [`OpNum::Illegal`].
    Failed {
        op: OpNum,
        status: Nfsstat4,
        denied: Option<LockDenied<'a>>,
    },
}

impl OpRes<'_> {
    /// The operation this result is of.
    pub fn op(&self) -> OpNum {
        match self {
            OpRes::Access { .. } => OpNum::Access,
            OpRes::Close(_) => OpNum::Close,
            OpRes::Commit { .. } => OpNum::Commit,
            OpRes::Create { .. } => OpNum::Create,
            OpRes::CreateSession(_) => OpNum::CreateSession,
            OpRes::Delegreturn => OpNum::Delegreturn,
            OpRes::DestroyClientid => OpNum::DestroyClientid,
            OpRes::DestroySession => OpNum::DestroySession,
            OpRes::ExchangeId(_) => OpNum::ExchangeId,
            OpRes::FreeStateid => OpNum::FreeStateid,
            OpRes::Getattr(_) => OpNum::Getattr,
            OpRes::Getfh(_) => OpNum::Getfh,
            OpRes::Getxattr(_) => OpNum::Getxattr,
            OpRes::Link(_) => OpNum::Link,
            OpRes::Listxattrs { .. } => OpNum::Listxattrs,
            OpRes::Lock(_) => OpNum::Lock,
            OpRes::Lockt => OpNum::Lockt,
            OpRes::Locku(_) => OpNum::Locku,
            OpRes::Lookup => OpNum::Lookup,
            OpRes::Lookupp => OpNum::Lookupp,
            OpRes::Open(_) => OpNum::Open,
            OpRes::OpenDowngrade(_) => OpNum::OpenDowngrade,
            OpRes::Putfh => OpNum::Putfh,
            OpRes::Putrootfh => OpNum::Putrootfh,
            OpRes::Read { .. } => OpNum::Read,
            OpRes::Readdir { .. } => OpNum::Readdir,
            OpRes::Readlink(_) => OpNum::Readlink,
            OpRes::ReclaimComplete => OpNum::ReclaimComplete,
            OpRes::Remove(_) => OpNum::Remove,
            OpRes::Removexattr(_) => OpNum::Removexattr,
            OpRes::Rename { .. } => OpNum::Rename,
            OpRes::Restorefh => OpNum::Restorefh,
            OpRes::Savefh => OpNum::Savefh,
            OpRes::Sequence(_) => OpNum::Sequence,
            OpRes::Setattr(_) => OpNum::Setattr,
            OpRes::Setxattr(_) => OpNum::Setxattr,
            OpRes::TestStateid(_) => OpNum::TestStateid,
            OpRes::Write { .. } => OpNum::Write,
            OpRes::Failed { op, .. } => *op,
        }
    }

    /// The result's status: `Ok` but for [`OpRes::Failed`].
    pub fn status(&self) -> Nfsstat4 {
        match self {
            OpRes::Failed { status, .. } => *status,
            _ => Nfsstat4::Ok,
        }
    }
}

/// A COMPOUND reply's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompoundHead<'a> {
    /// The COMPOUND's status: that of its last result.
    pub status: Nfsstat4,
    /// The tag, echoed.
    pub tag: &'a [u8],
    /// Results that follow (at most [`MAX_OPS`]).
    pub count: u32,
}

/// Decodes a COMPOUND reply's status, tag and result count (after the RPC reply header).
pub fn decode_compound_head<'a>(d: &mut Decoder<'a>) -> Result<CompoundHead<'a>, WireError> {
    let status = Nfsstat4::from_u32(d.u32()?);
    let tag = d.opaque(MAX_TAG, "COMPOUND tag")?;
    let count = d.u32()?;
    if count > MAX_OPS {
        return Err(WireError::TooLong { what: "COMPOUND results", len: count, max: MAX_OPS });
    }
    Ok(CompoundHead { status, tag, count })
}

/// A whole COMPOUND reply, checked: its results are iterated in place.
#[derive(Clone, Debug)]
pub struct CompoundRes<'a> {
    /// The COMPOUND's status (that of the last result; `Ok` if every operation succeeded).
    pub status: Nfsstat4,
    /// The tag, echoed.
    pub tag: &'a [u8],
    /// The results, in the order of the operations; only the last may have failed.
    pub results: Results<'a>,
}

/// The results of a checked COMPOUND reply, decoded as they are iterated.
#[derive(Clone, Debug)]
pub struct Results<'a> {
    d: Decoder<'a>,
    left: u32,
}

impl<'a> Results<'a> {
    /// The next `left` results from `d`, which a caller checked already (a connection that
    /// decoded a READ's head as it came and kept the results before it).
    pub(crate) fn checked(d: Decoder<'a>, left: u32) -> Results<'a> {
        Results { d, left }
    }

    /// Only the first `n` results (a connection that placed the last result's READ data).
    pub(crate) fn first(self, n: u32) -> Results<'a> {
        Results { left: self.left.min(n), ..self }
    }

    /// Results not yet iterated.
    pub fn len(&self) -> usize {
        self.left as usize
    }

    /// Whether every result was iterated.
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }
}

impl<'a> Iterator for Results<'a> {
    type Item = Result<OpRes<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let r = decode_op(&mut self.d);
        self.left = if r.is_ok() { self.left - 1 } else { 0 };
        Some(r)
    }
}

/// Decodes a whole COMPOUND reply (after the RPC reply header) and checks it: every result
/// decodes, only the last may have failed (a server stops at the first failure), the
/// COMPOUND's status is the last result's (`Ok` with no results), and every byte is used.
pub fn decode_compound<'a>(d: &mut Decoder<'a>) -> Result<CompoundRes<'a>, WireError> {
    let head = decode_compound_head(d)?;
    let results = Results { d: d.clone(), left: head.count };
    let mut last = Nfsstat4::Ok;
    for i in 0..head.count {
        let r = decode_op(d)?;
        last = r.status();
        if !last.is_ok() && i + 1 != head.count {
            return Err(WireError::BadValue { what: "COMPOUND result after a failed one", value: i + 1 });
        }
    }
    if head.count > 0 && last != head.status {
        return Err(WireError::BadValue {
            what: "COMPOUND status (not its last result's)",
            value: head.status.to_u32(),
        });
    }
    d.finish()?;
    Ok(CompoundRes { status: head.status, tag: head.tag, results })
}

/// READ's result up to its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadHead {
    /// NFS4_OK: `len` bytes of data (and their padding) follow.
    Ok {
        /// End of file reached.
        eof: bool,
        /// Length of the data.
        len: u32,
    },
    /// A failure: the whole result (the COMPOUND's last).
    Failed(Nfsstat4),
}

/// Decodes a READ's result (its operation number, status, `eof` and the data's length),
/// leaving `d` at the data. Fails if the result is not READ's or the data is longer than
/// `asked` (a server may not return more than asked).
pub fn decode_read_head(d: &mut Decoder<'_>, asked: u32) -> Result<ReadHead, WireError> {
    match d.u32()? {
        25 => {}
        value => return Err(WireError::BadValue { what: "nfs_opnum4 (READ expected)", value }),
    }
    let status = Nfsstat4::from_u32(d.u32()?);
    if !status.is_ok() {
        return Ok(ReadHead::Failed(status));
    }
    let eof = d.bool()?;
    let len = d.u32()?;
    if len > asked {
        return Err(WireError::TooLong { what: "READ data", len, max: asked });
    }
    Ok(ReadHead::Ok { eof, len })
}

/// Decodes one `nfs_resop4`: its operation number, status and result. An operation the client
/// never sends is [`WireError::BadValue`].
pub fn decode_op<'a>(d: &mut Decoder<'a>) -> Result<OpRes<'a>, WireError> {
    let num = d.u32()?;
    let op = OpNum::from_u32(num).ok_or(WireError::BadValue { what: "nfs_opnum4", value: num })?;
    let status = Nfsstat4::from_u32(d.u32()?);
    if !status.is_ok() {
        let denied = match (op, status) {
            (OpNum::Lock | OpNum::Lockt, Nfsstat4::Denied) => Some(LockDenied::decode(d)?),
            _ => None,
        };
        if op == OpNum::Setattr {
            Bitmap::decode(d)?;
        }
        return Ok(OpRes::Failed { op, status, denied });
    }
    Ok(match op {
        OpNum::Access => OpRes::Access { supported: d.u32()?, access: d.u32()? },
        OpNum::Close => OpRes::Close(Stateid::decode(d)?),
        OpNum::Commit => OpRes::Commit { verf: d.array::<8>()? },
        OpNum::Create => OpRes::Create { cinfo: ChangeInfo::decode(d)?, attrset: Bitmap::decode(d)? },
        OpNum::CreateSession => OpRes::CreateSession(CreateSessionRes {
            sessionid: SessionId::decode(d)?,
            sequence: d.u32()?,
            flags: d.u32()?,
            fore: ChannelAttrs::decode(d)?,
            back: ChannelAttrs::decode(d)?,
        }),
        OpNum::Delegreturn => OpRes::Delegreturn,
        OpNum::DestroyClientid => OpRes::DestroyClientid,
        OpNum::DestroySession => OpRes::DestroySession,
        OpNum::ExchangeId => OpRes::ExchangeId(decode_exchange_id(d)?),
        OpNum::FreeStateid => OpRes::FreeStateid,
        OpNum::Getattr => OpRes::Getattr(Fattr4::decode(d)?),
        OpNum::Getfh => OpRes::Getfh(Fh::decode(d)?),
        OpNum::Getxattr => OpRes::Getxattr(d.opaque(MAX_XATTR_VALUE, "xattrvalue4")?),
        OpNum::Link => OpRes::Link(ChangeInfo::decode(d)?),
        OpNum::Listxattrs => {
            let cookie = d.u64()?;
            let names = list(d, u32::MAX, "xattr names", xattr_name)?;
            OpRes::Listxattrs { cookie, names, eof: d.bool()? }
        }
        OpNum::Lock => OpRes::Lock(Stateid::decode(d)?),
        OpNum::Lockt => OpRes::Lockt,
        OpNum::Locku => OpRes::Locku(Stateid::decode(d)?),
        OpNum::Lookup => OpRes::Lookup,
        OpNum::Lookupp => OpRes::Lookupp,
        OpNum::Open => OpRes::Open(OpenRes {
            stateid: Stateid::decode(d)?,
            cinfo: ChangeInfo::decode(d)?,
            rflags: d.u32()?,
            attrset: Bitmap::decode(d)?,
            delegation: Delegation::decode(d)?,
        }),
        OpNum::OpenDowngrade => OpRes::OpenDowngrade(Stateid::decode(d)?),
        OpNum::Putfh => OpRes::Putfh,
        OpNum::Putrootfh => OpRes::Putrootfh,
        OpNum::Read => OpRes::Read { eof: d.bool()?, data: d.opaque(u32::MAX, "READ data")? },
        OpNum::Readdir => {
            let verf = d.array::<8>()?;
            let entries = DirEntries { d: d.clone(), done: false };
            // Check the whole list once (and find `eof` after it); whoever iterates decodes the
            // entries again, in place.
            let mut walk = entries.clone();
            while walk.entry()?.is_some() {}
            *d = walk.d;
            OpRes::Readdir { verf, entries, eof: d.bool()? }
        }
        OpNum::Readlink => OpRes::Readlink(d.opaque(MAX_PATH, "linktext4")?),
        OpNum::ReclaimComplete => OpRes::ReclaimComplete,
        OpNum::Remove => OpRes::Remove(ChangeInfo::decode(d)?),
        OpNum::Removexattr => OpRes::Removexattr(ChangeInfo::decode(d)?),
        OpNum::Rename => OpRes::Rename { source: ChangeInfo::decode(d)?, target: ChangeInfo::decode(d)? },
        OpNum::Restorefh => OpRes::Restorefh,
        OpNum::Savefh => OpRes::Savefh,
        OpNum::Sequence => OpRes::Sequence(SequenceRes {
            sessionid: SessionId::decode(d)?,
            sequenceid: d.u32()?,
            slotid: d.u32()?,
            highest_slotid: d.u32()?,
            target_highest_slotid: d.u32()?,
            status_flags: d.u32()?,
        }),
        OpNum::Setattr => OpRes::Setattr(Bitmap::decode(d)?),
        OpNum::Setxattr => OpRes::Setxattr(ChangeInfo::decode(d)?),
        OpNum::TestStateid => {
            OpRes::TestStateid(list(d, MAX_STATEIDS, "TEST_STATEID statuses", status_code)?)
        }
        OpNum::Write => {
            OpRes::Write { count: d.u32()?, committed: Stable4::from_u32(d.u32()?)?, verf: d.array::<8>()? }
        }
        OpNum::Illegal => return Err(WireError::BadValue { what: "OP_ILLEGAL with NFS4_OK", value: 0 }),
    })
}

fn decode_exchange_id<'a>(d: &mut Decoder<'a>) -> Result<ExchangeIdRes<'a>, WireError> {
    let clientid = d.u64()?;
    let sequenceid = d.u32()?;
    let flags = d.u32()?;
    let state_protect = match d.u32()? {
        0 => StateProtect::None,
        1 => StateProtect::MachCred { must_enforce: Bitmap::decode(d)?, must_allow: Bitmap::decode(d)? },
        value => return Err(WireError::BadValue { what: "state_protect_how4", value }),
    };
    Ok(ExchangeIdRes {
        clientid,
        sequenceid,
        flags,
        state_protect,
        server_minor_id: d.u64()?,
        server_major_id: d.opaque(OPAQUE_LIMIT, "so_major_id")?,
        server_scope: d.opaque(OPAQUE_LIMIT, "eir_server_scope")?,
        impl_id: decode_impl_id(d)?,
    })
}
