//! NFSv4.1 on a connection ([`Nfs41`]): every call a COMPOUND ([`Compound`]), every reply a
//! [`CompoundReply`] iterated in place.
//!
//! A WRITE's data sits in the middle of the call (after its length, before the operations that
//! follow it): the connection sends the bytes before it, the owner's buffers, the padding, then
//! the rest. A READ that is the COMPOUND's last operation gets its data placed into the owner's
//! buffers as it comes: the head of the reply (the COMPOUND's status and tag, the results before
//! the READ, each checked, then the READ's own head) is decoded as soon as it is in, the results
//! before the READ are kept (a few hundred bytes), and the reply is made from them when the data
//! has come. A smaller READ whose reply comes in one piece is decoded in place and its data
//! copied, as NFSv3's is.

use super::program::{CallShape, Program, ReadStart};
use crate::nfs::wire::nfs4::{
    self, decode_compound, decode_compound_head, decode_op, decode_read_head, Nfsstat4, Op, OpRes, Proc4,
    ReadHead, Results,
};
use crate::nfs::wire::rpc::AuthSys;
use crate::nfs::wire::xdr::{Decoder, Encoder};
use crate::nfs::wire::WireError;

/// NFSv4.1 (RFC 8881): COMPOUND calls.
#[derive(Clone, Copy, Debug, Default)]
pub struct Nfs41;

/// One COMPOUND's arguments.
#[derive(Clone, Copy, Debug)]
pub struct Compound<'a> {
    /// The tag (echoed by the server).
    pub tag: &'a [u8],
    /// [`MINOR_VERSION`](nfs4::MINOR_VERSION), or
    /// [`MINOR_VERSION_XATTR`](nfs4::MINOR_VERSION_XATTR) for the xattr operations.
    pub minorversion: u32,
    /// An operation before `ops` (a session's SEQUENCE), so the caller's need not be copied.
    pub first: Option<Op<'a>>,
    /// The operations (at most one WRITE, whose data the owner's sink gives).
    pub ops: &'a [Op<'a>],
}

impl<'a> Compound<'a> {
    /// A minor version 1 COMPOUND of `ops` with an empty tag.
    pub fn of(ops: &'a [Op<'a>]) -> Compound<'a> {
        Compound { tag: b"", minorversion: nfs4::MINOR_VERSION, first: None, ops }
    }

    fn all(&self) -> impl Iterator<Item = &Op<'a>> {
        self.first.iter().chain(self.ops)
    }
}

/// A READ whose data went into the owner's buffers (the COMPOUND's last operation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadDone {
    /// Bytes placed.
    pub count: u32,
    /// End of file reached.
    pub eof: bool,
}

/// A COMPOUND reply, checked, borrowing the connection's buffers.
#[derive(Clone, Debug)]
pub struct CompoundReply<'a> {
    /// The COMPOUND's status (its last result's).
    pub status: Nfsstat4,
    /// The tag, echoed.
    pub tag: &'a [u8],
    /// The results in the order of the operations; without the READ's when `read` is given.
    pub results: Results<'a>,
    /// The COMPOUND's last operation was a READ that succeeded, and its data is in the owner's
    /// buffers (or was dropped when the owner gave none).
    pub read: Option<ReadDone>,
}

/// What a COMPOUND in flight keeps for its reply.
#[derive(Clone, Copy, Debug, Default)]
pub struct Call41 {
    /// Operations sent.
    ops: u32,
    /// The last one is a READ.
    read_last: bool,
}

/// Whether the counts of `op` are within `max`.
fn op_fits(op: &Op<'_>, max: u32) -> bool {
    match *op {
        Op::Read { count, .. } | Op::Write { count, .. } => count <= max,
        Op::Readdir { dircount, maxcount, .. } => dircount <= max && maxcount <= max,
        Op::Listxattrs { maxcount, .. } => maxcount <= max,
        _ => true,
    }
}

impl Program for Nfs41 {
    type Args<'a> = Compound<'a>;
    type Reply<'a> = CompoundReply<'a>;
    type Call = Call41;
    type ReadHead = bool;
    /// The COMPOUND's head and the results before a READ: SEQUENCE, PUTFH, maybe GETATTR.
    const KEEP: usize = 2048;

    fn fits(args: &Compound<'_>, max: u32) -> bool {
        args.all().all(|op| op_fits(op, max))
    }

    fn encode(
        e: &mut Encoder<'_>,
        xid: u32,
        auth: &AuthSys<'_>,
        args: &Compound<'_>,
    ) -> Result<CallShape<Call41>, WireError> {
        nfs4::encode_call(e, xid, Proc4::Compound, auth)?;
        let enc = nfs4::encode_compound_after(e, args.tag, args.minorversion, args.first.as_ref(), args.ops)?;
        let last = args.ops.last().or(args.first.as_ref());
        let (read_last, read_count) = match last {
            Some(Op::Read { count, .. }) => (true, *count),
            _ => (false, 0),
        };
        Ok(CallShape { call: Call41 { ops: enc.ops, read_last }, payload: enc.payload_at, read_count })
    }

    fn read_head(
        call: &Call41,
        read_count: u32,
        d: &mut Decoder<'_>,
    ) -> Result<Option<ReadStart<bool>>, WireError> {
        if !call.read_last {
            return Ok(None);
        }
        let from = d.position();
        let head = decode_compound_head(d)?;
        if head.count != call.ops {
            // An operation before the READ failed: no data.
            return Ok(None);
        }
        for _ in 1..call.ops {
            if !decode_op(d)?.status().is_ok() {
                return Err(WireError::BadValue { what: "COMPOUND result after a failed one", value: 0 });
            }
        }
        let keep = from..d.position();
        match decode_read_head(d, read_count)? {
            ReadHead::Ok { eof, len } => {
                if !head.status.is_ok() {
                    return Err(WireError::BadValue {
                        what: "COMPOUND status (not its last result's)",
                        value: head.status.to_u32(),
                    });
                }
                Ok(Some(ReadStart { head: eof, len, keep }))
            }
            ReadHead::Failed(_) => Ok(None),
        }
    }

    fn read_reply<'a>(
        call: &Call41,
        eof: bool,
        kept: &'a [u8],
        count: u32,
    ) -> Result<CompoundReply<'a>, WireError> {
        let mut d = Decoder::new(kept);
        let head = decode_compound_head(&mut d)?;
        Ok(CompoundReply {
            status: head.status,
            tag: head.tag,
            results: Results::checked(d, call.ops.saturating_sub(1)),
            read: Some(ReadDone { count, eof }),
        })
    }

    fn decode<'a>(
        call: &Call41,
        read_count: u32,
        d: &mut Decoder<'a>,
        out: &mut Option<&'a [u8]>,
    ) -> Result<CompoundReply<'a>, WireError> {
        let c = decode_compound(d)?;
        if !(call.read_last && c.status.is_ok() && c.results.len() == call.ops as usize) {
            return Ok(CompoundReply { status: c.status, tag: c.tag, results: c.results, read: None });
        }
        // The last result is the READ's: its data is the owner's.
        let Some(Ok(OpRes::Read { eof, data })) = c.results.clone().last() else {
            return Err(WireError::BadValue { what: "the last result (READ expected)", value: 0 });
        };
        if data.len() > read_count as usize {
            return Err(WireError::TooLong { what: "READ data", len: data.len() as u32, max: read_count });
        }
        *out = Some(data);
        let read = Some(ReadDone { count: data.len() as u32, eof });
        Ok(CompoundReply { status: c.status, tag: c.tag, results: c.results.first(call.ops - 1), read })
    }
}
