//! NFSv4.1 (RFC 8881, XDR in RFC 5662), program 100003 version 4, with RFC 8276's extended
//! attributes: the types the client uses, [`encode_call`] and [`encode_compound`] for a call,
//! and [`decode_compound`] for its reply, in place.
//!
//! Every call but NULL is one COMPOUND: a tag, the minor version and a list of operations, each
//! working on the current file handle the previous ones left (PUTFH, LOOKUP, GETFH, SAVEFH and
//! RESTOREFH move it). Its reply is a status, the tag and one result per operation up to the
//! first that failed.
//!
//! A WRITE's data is not encoded here: [`encode_compound`] stops at the data's length and says
//! where the data goes, for the connection to send it from the guest's buffers. A READ's data is
//! a slice of the reply ([`OpRes::Read`]), or, for a connection that places it itself,
//! [`decode_read_head`] stops at its length.
//!
//! The codecs are split by seam as NFSv3's are: `types` (constants, handles, stateids,
//! bitmaps, attributes, what SETATTR sets), `status` (`nfsstat4`), `args` (the COMPOUND's
//! operations, encoded) and `res` (their results, decoded in place); every item is here,
//! re-exported.

mod args;
mod res;
mod status;
mod types;

pub use args::{
    encode_call, encode_compound, encode_compound_after, CbSec, CreateHow4, CreateKind, CreateSession,
    DelegationType, Encoded, ExchangeId, Locker, Op, OpNum, Open, OpenClaim, Proc4, SetxattrOption,
};
pub use res::{
    decode_compound, decode_compound_head, decode_op, decode_read_head, Ace, CompoundHead, CompoundRes,
    CreateSessionRes, Delegation, DirEntries, DirEntry4, ExchangeIdRes, List, LockDenied, OpRes, OpenRes,
    ReadHead, Results, SequenceRes, SpaceLimit, StateProtect,
};
pub use status::Nfsstat4;
pub use types::{
    access, attr, create_session, encode_numeric_id, exchgid, open_result, parse_numeric_id, seq_status,
    share, Bitmap, ChangeInfo, ChannelAttrs, ClientId, Fattr4, Fh, Fsid, Ftype4, ImplId, LockType, NfsTime4,
    SessionId, SetAttrs, SetTime4, Stable4, StateOwner, Stateid, Verifier, FHSIZE4, MAX_ATTRLIST,
    MAX_BITMAP_WORDS, MAX_NAME, MAX_OPS, MAX_OWNER, MAX_PATH, MAX_STATEIDS, MAX_TAG, MAX_XATTR_VALUE,
    MINOR_VERSION, MINOR_VERSION_XATTR, OPAQUE_LIMIT, PROGRAM, SESSIONID_SIZE, VERSION,
};

#[cfg(test)]
mod tests;
