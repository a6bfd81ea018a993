//! What a connection carries: an RPC program ([`Program`]), as the connection needs it. A call
//! is encoded once into its slot, with a WRITE's data left out (it is sent from the owner's
//! buffers, [`CallShape::payload`]); a READ reply's data may go straight into the owner's
//! buffers as it comes, for which the program decodes the reply up to the data
//! ([`Program::read_head`]) and later makes the reply from what it kept
//! ([`Program::read_reply`]); any other reply is decoded whole, in place ([`Program::decode`]).
//!
//! NFSv3 ([`Nfs3`], here) is one program, one procedure per call; NFSv4.1's COMPOUND
//! ([`Nfs41`](super::Nfs41)) the other.

use std::fmt::Debug;
use std::ops::Range;

use crate::nfs::wire::nfs3::{self, Args, Fattr, Proc, ReadHead, Res};
use crate::nfs::wire::rpc::{self, AuthSys};
use crate::nfs::wire::xdr::{Decoder, Encoder};
use crate::nfs::wire::WireError;

/// An RPC program a [`Conn`](super::Conn) carries: how its calls are encoded and its replies
/// decoded. Implemented by marker types ([`Nfs3`], [`Nfs41`](super::Nfs41)); the connection is
/// generic over it, so nothing of it costs a dynamic call.
pub trait Program: Sized + 'static {
    /// A call's arguments, borrowed from the caller.
    type Args<'a>;
    /// A decoded reply, borrowing the connection's buffers (valid only inside
    /// [`Sink::done`](super::Sink::done)).
    type Reply<'a>;
    /// What a call in flight keeps for decoding its reply (its slot holds it).
    type Call: Copy + Default + Debug;
    /// What the decode of a READ reply's head keeps while the data is placed.
    type ReadHead: Copy + Debug;
    /// Bytes of a reply's head the connection keeps while a READ's data is placed (the results
    /// before the READ in a COMPOUND; 0 when the head is kept as a value only).
    const KEEP: usize;

    /// Whether the arguments' counts (READ, WRITE, READDIR sizes) are within `max_io`.
    fn fits(args: &Self::Args<'_>, max_io: u32) -> bool;

    /// Encodes the call: the RPC call header (XID `xid`, credential `auth`) and the arguments,
    /// without a WRITE's data.
    fn encode(
        e: &mut Encoder<'_>,
        xid: u32,
        auth: &AuthSys<'_>,
        args: &Self::Args<'_>,
    ) -> Result<CallShape<Self::Call>, WireError>;

    /// The head of a reply to `call` (a READ asking `read_count` bytes, placed by the
    /// connection) whose record is not all in: `d` is after an accepted RPC reply header, over
    /// what came so far. `Ok(Some(_))` when `d` is left at the READ's data, `Ok(None)` when the
    /// reply brings no data to place (a failure: it is decoded whole when it is in),
    /// `Err(Truncated)` when more is needed, any other error when the reply is garbage.
    fn read_head(
        call: &Self::Call,
        read_count: u32,
        d: &mut Decoder<'_>,
    ) -> Result<Option<ReadStart<Self::ReadHead>>, WireError>;

    /// The reply of a READ whose `count` bytes of data were placed: from its head and the bytes
    /// of the record kept ([`ReadStart::keep`]).
    fn read_reply<'a>(
        call: &Self::Call,
        head: Self::ReadHead,
        kept: &'a [u8],
        count: u32,
    ) -> Result<Self::Reply<'a>, WireError>;

    /// A whole reply to `call`, after an accepted RPC reply header, every byte used. A READ
    /// whose data is the owner's (`read_count` > 0) sets `data` to it, for the connection to
    /// copy into the owner's buffers. (An out-parameter: a reply is a few hundred bytes, which
    /// the connection then moves once, into the owner's `Ok`.)
    fn decode<'a>(
        call: &Self::Call,
        read_count: u32,
        d: &mut Decoder<'a>,
        data: &mut Option<&'a [u8]>,
    ) -> Result<Self::Reply<'a>, WireError>;
}

/// What [`Program::encode`] wrote.
#[derive(Clone, Copy, Debug)]
pub struct CallShape<C> {
    /// What the slot keeps for the reply.
    pub call: C,
    /// A WRITE's data: where it goes in the encoded bytes (after its length) and its length. The
    /// record is the bytes before that point, the data, its XDR padding, then the bytes after.
    pub payload: Option<(usize, u32)>,
    /// A READ whose data goes into the owner's buffers: the count asked (0: none).
    pub read_count: u32,
}

/// What [`Program::read_head`] found.
#[derive(Clone, Debug)]
pub struct ReadStart<H> {
    /// Kept for [`Program::read_reply`].
    pub head: H,
    /// Bytes of data that follow (then their padding, which ends the record).
    pub len: u32,
    /// Bytes of the record (from the decoder's start) to keep for [`Program::read_reply`]: at
    /// most [`Program::KEEP`], or the data is not placed as it comes (the whole record is
    /// decoded when it is in).
    pub keep: Range<usize>,
}

/// NFSv3 (RFC 1813): one procedure per call ([`Args`], [`Res`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Nfs3;

/// What an NFSv3 READ's head leaves for its reply.
#[derive(Clone, Copy, Debug)]
pub struct Read3 {
    eof: bool,
    attr: Option<Fattr>,
}

impl Program for Nfs3 {
    type Args<'a> = Args<'a>;
    type Reply<'a> = Res<'a>;
    type Call = Proc;
    type ReadHead = Read3;
    const KEEP: usize = 0;

    #[inline]
    fn fits(args: &Args<'_>, max: u32) -> bool {
        match *args {
            Args::Read { count, .. } | Args::Write { count, .. } | Args::Readdir { count, .. } => {
                count <= max
            }
            Args::Readdirplus { dircount, maxcount, .. } => maxcount <= max && dircount <= max,
            _ => true,
        }
    }

    #[inline]
    fn encode(
        e: &mut Encoder<'_>,
        xid: u32,
        auth: &AuthSys<'_>,
        args: &Args<'_>,
    ) -> Result<CallShape<Proc>, WireError> {
        let proc = args.proc();
        rpc::encode_call(e, xid, nfs3::PROGRAM, nfs3::VERSION, proc as u32, auth)?;
        nfs3::encode_args(e, args)?;
        let (payload, read_count) = match *args {
            Args::Read { count, .. } => (None, count),
            Args::Write { count, .. } => (Some((e.position(), count)), 0),
            _ => (None, 0),
        };
        Ok(CallShape { call: proc, payload, read_count })
    }

    #[inline]
    fn read_head(
        call: &Proc,
        read_count: u32,
        d: &mut Decoder<'_>,
    ) -> Result<Option<ReadStart<Read3>>, WireError> {
        if *call != Proc::Read {
            return Ok(None);
        }
        Ok(match nfs3::decode_read_head(d, read_count)? {
            ReadHead::Ok { attr, eof, len, .. } => {
                Some(ReadStart { head: Read3 { eof, attr }, len, keep: 0..0 })
            }
            ReadHead::Failed { .. } => None,
        })
    }

    #[inline]
    fn read_reply<'a>(_call: &Proc, head: Read3, _kept: &'a [u8], count: u32) -> Result<Res<'a>, WireError> {
        Ok(Res::Read { count, eof: head.eof, attr: head.attr })
    }

    #[inline]
    fn decode<'a>(
        call: &Proc,
        read_count: u32,
        d: &mut Decoder<'a>,
        data: &mut Option<&'a [u8]>,
    ) -> Result<Res<'a>, WireError> {
        if *call != Proc::Read {
            return nfs3::decode_res(*call, d);
        }
        // (Each reply made where it is returned: it is not moved again.)
        match nfs3::decode_read_head(d, read_count)? {
            ReadHead::Failed { status, attr } => {
                d.finish()?;
                Ok(Res::Failed { status, attr })
            }
            ReadHead::Ok { attr, eof, len, .. } => {
                *data = Some(d.fixed(len as usize)?);
                d.finish()?;
                Ok(Res::Read { count: len, eof, attr })
            }
        }
    }
}
