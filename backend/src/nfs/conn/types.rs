//! What a connection's owner deals in: the caller's credentials ([`Cred`]), the connection's
//! settings ([`ConnConfig`]), why a call ended without a reply ([`CallError`]), what a call's
//! owner gives and is told ([`Sink`], per program) and the connection's counters
//! ([`ConnStats`]).

use std::net::SocketAddr;
use std::time::Duration;

use super::program::{Nfs3, Program};
use crate::nfs::wire::rpc::RpcError;

/// The caller's credentials for one call (AUTH_SYS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cred {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// How many of `groups` are used (at most 16).
    pub ngroups: u8,
    /// Supplementary groups.
    pub groups: [u32; 16],
}

impl Cred {
    /// Root, with no supplementary groups.
    pub const ROOT: Cred = Cred { uid: 0, gid: 0, ngroups: 0, groups: [0; 16] };
}

/// What a connection is configured with.
#[derive(Clone, Debug)]
pub struct ConnConfig {
    /// The NFS program's address (port already resolved).
    pub addr: SocketAddr,
    /// Most calls in flight on this connection (e.g. 128).
    pub slots: usize,
    /// Largest READ/WRITE count and READDIR size (from FSINFO, e.g. 1 MiB).
    pub max_io: u32,
    /// A call not answered by then ends with [`CallError::TimedOut`].
    pub timeout: Duration,
    /// No reply by then: reconnect and send again (same XID).
    pub retransmit: Duration,
    /// AUTH_SYS machine name (at most 255 bytes; allocated once).
    pub machine_name: String,
}

/// Why a call did not return a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// No free slot: the caller answers later or with EAGAIN.
    #[error("no free call slot on the connection")]
    Full,
    /// The arguments do not fit (a count over `max_io`, names too long for the call buffer, a
    /// READ reply larger than the buffer the sink gave).
    #[error("call or reply too large")]
    TooLarge,
    /// No reply within the timeout.
    #[error("no reply within the timeout")]
    TimedOut,
    /// The server sent something that is not a valid reply: the connection was reset.
    #[error("malformed reply from the server (connection reset)")]
    Broken,
    /// The call was abandoned ([`Conn::abort_all`](super::Conn::abort_all)).
    #[error("call abandoned")]
    Closed,
    /// The server refused the call at the RPC level.
    #[error("RPC error: {0}")]
    Rpc(RpcError),
    /// A WRITE whose owner gave no payload, or a shorter one than its count, when it was sent.
    #[error("WRITE payload missing or shorter than its count")]
    Payload,
}

/// What a completed call needs from its owner (the engine), by the caller's `tag`; `P` is the
/// program the connection carries (NFSv3 unless said).
pub trait Sink<P: Program = Nfs3> {
    /// Where READ reply data goes (the guest's buffers), or None to discard. It may be asked
    /// several times for one reply (data arriving over several poll rounds) and must give the
    /// same buffers each time, from their start.
    fn read_buffer(&mut self, tag: u32) -> Option<crate::io::Writer<'_>>;
    /// A pending WRITE's data (the guest's buffers), read each time it is (re)sent.
    fn payload(&mut self, tag: u32) -> Option<crate::io::Reader<'_>>;
    /// The call `tag` ended: its decoded reply, or why not (`Err`).
    fn done(&mut self, tag: u32, res: Result<P::Reply<'_>, CallError>);
}

/// Counters of one connection (data, not log text).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Calls accepted by [`Conn::call`](super::Conn::call).
    pub calls: u64,
    /// Replies matched to a call.
    pub replies: u64,
    /// Calls sent again after a reconnection.
    pub retransmits: u64,
    /// Connections opened after the first.
    pub reconnects: u64,
    /// Moves to the server's next address after a failed connect ([`Conn::also_at`]).
    ///
    /// [`Conn::also_at`]: super::Conn::also_at
    pub address_moves: u64,
    /// Calls that ended with [`CallError::TimedOut`].
    pub timeouts: u64,
    /// Malformed records or replies (each resets the connection).
    pub bad_replies: u64,
    /// Well-formed replies to no call in flight (dropped).
    pub unknown_xids: u64,
    /// READ data bytes received straight into the sinks' buffers (`readv`).
    pub read_direct_bytes: u64,
    /// READ data bytes copied from the receive buffer into the sinks' buffers (what came in the
    /// same read as the reply's header).
    pub read_copied_bytes: u64,
    /// Bytes read from the socket (READ data received straight into the sinks' buffers too).
    pub received_bytes: u64,
    /// Bytes moved within the receive buffer (over dropped record marks, and to its start for
    /// room): each received byte moves a bounded number of times, so whatever a server sends
    /// costs the poller time linear in its bytes.
    pub moved_bytes: u64,
}
