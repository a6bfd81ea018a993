//! A connection's state ([`Conn`]) and the parts every side of it shares: the tuning constants,
//! the call slots ([`Slot`]), the link ([`Link`]), what can go wrong with a stream ([`Fault`]),
//! and the few methods that end calls, drop the link and find the call a reply is for.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::TcpStream;

use super::program::{Nfs3, Program};
use super::rx::{ReadProgress, Rx};
use super::sys;
use super::types::{CallError, ConnConfig, ConnStats, Sink};
use crate::nfs::wire::xdr;

/// Bytes of one slot's send buffer: the record mark, the largest RPC call header and the
/// largest arguments (two handles and two names, or a handle, a name and a symlink target; a
/// COMPOUND of a few operations).
pub(super) const CALL_BUF: usize = 8192;
/// Room in the receive buffer beyond `max_io`: the largest reply header and attributes.
pub(super) const RECV_EXTRA: usize = 8192;
/// A record's fragments are reassembled in the receive buffer; a record longer than this
/// (relative to the buffer) is refused as garbage.
pub(super) const RECORD_SLACK: usize = 8;
/// Most fragments of one record (a 1 MiB reply in 4 KiB fragments has 256).
pub(super) const MAX_FRAGMENTS: usize = 1 << 14;
/// Most socket reads per poll round, so that one busy connection does not starve the poller.
pub(super) const READS_PER_POLL: usize = 16;
/// How often a connection that moved off its first address looks whether that one answers
/// again ([`Conn::probe_first_every`]).
pub(super) const FIRST_PROBE: Duration = Duration::from_secs(5);
/// First reconnection delay after a failed connect; it doubles up to [`MAX_BACKOFF`].
pub(super) const MIN_BACKOFF: Duration = Duration::from_millis(1);
pub(super) const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// READs asking this much or more get their data straight into the sink's buffers: while one is
/// in flight, a read at a record boundary takes only [`PEEK`] bytes (a READ reply's header and
/// attributes are 132), so that the data after them is left in the socket for `readv`. Smaller
/// READs are copied from the receive buffer: one `memcpy` of a few KiB costs less than the
/// extra system call.
pub(super) const DIRECT_MIN: u32 = 16 << 10;
pub(super) const PEEK: usize = 256;
/// The last-fragment bit of a record mark.
pub(super) const LAST_FRAGMENT: u32 = 0x8000_0000;

pub(super) static ZEROS: [u8; 4] = [0; 4];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotState {
    Free,
    /// Encoded, waiting in the send queue (or for a connection).
    Queued,
    /// Sent in full or in part on the current connection.
    Sent,
}

/// One call in flight. Its encoded record (without a WRITE's data) is in the slot's part of
/// `Conn::calls`; `call` is what the program keeps for the reply.
#[derive(Clone, Copy, Debug)]
pub(super) struct Slot<C> {
    pub(super) state: SlotState,
    pub(super) tag: u32,
    pub(super) xid: u32,
    /// Bumped for every new call in this slot: the high half of the XID.
    pub(super) generation: u16,
    pub(super) call: C,
    /// Encoded bytes (record mark, header, arguments).
    pub(super) len: usize,
    /// WRITE: data bytes sent at `payload_at` of the encoded part (then padding, then the rest
    /// of the encoded part).
    pub(super) payload: u32,
    /// (Within `CALL_BUF`; a u16 keeps a slot in 64 bytes, which it is copied as.)
    pub(super) payload_at: u16,
    /// READ whose data goes into the sink's buffers: the count asked (a reply with more data is
    /// garbage).
    pub(super) read_count: u32,
    /// When `call` took it (for the timeout).
    pub(super) started: Instant,
    /// When it was last (re)sent (for the retransmission).
    pub(super) sent_at: Instant,
    /// Whether it went out on some connection already (a later send is a retransmission).
    pub(super) was_sent: bool,
}

impl<C> Slot<C> {
    pub(super) fn record_len(&self) -> usize {
        self.len + self.payload as usize + xdr::pad(self.payload as usize)
    }
}

pub(super) enum Link {
    /// No socket; connect again at `retry_at`.
    Down { retry_at: Instant },
    /// A non-blocking connect in progress since `since`.
    Connecting { stream: TcpStream, since: Instant },
    /// Connected.
    Up { stream: TcpStream },
}

/// A connect to the first address while the connection serves on another ([`Conn::also_at`]).
pub(super) enum Probe {
    /// None now; the next at `at`.
    Idle { at: Instant },
    /// In progress since `since`.
    Connecting { stream: TcpStream, since: Instant },
    /// Connected: the link moves to it once no call is on the wire of the current one (calls
    /// queued meanwhile wait for it).
    Ready { stream: TcpStream },
}

/// What happened to a record or a stream; decides whether the connection is reset.
pub(super) enum Fault {
    /// The stream is unusable (a bad record mark, garbage not attributable to a call): the calls
    /// on the wire fail with [`CallError::Broken`], the others are sent again.
    Garbage,
    /// The connection was lost (EOF, an error): every call is sent again on a new one.
    Lost,
}

/// One non-blocking TCP connection carrying program `P` (NFSv3 unless said). `Send`, owned by
/// one poller.
pub struct Conn<P: Program = Nfs3> {
    pub(super) cfg: ConnConfig,
    /// The server's other addresses ([`Conn::also_at`]): a connect that fails moves on to the
    /// next one.
    pub(super) others: Vec<SocketAddr>,
    /// The address connected to: 0 is `cfg.addr`, `k` is `others[k - 1]`.
    pub(super) at: usize,
    /// Connects failed in a row (on any address) since the last one that succeeded.
    pub(super) failed_in_row: usize,
    pub(super) link: Link,
    /// Away from the first address: the connect that looks whether it answers again.
    pub(super) probe: Probe,
    /// How often that connect is tried.
    pub(super) probe_every: Duration,
    /// Whether a connection was ever established (later ones count as reconnects).
    pub(super) connected_once: bool,
    pub(super) backoff: Duration,
    pub(super) slots: Vec<Slot<P::Call>>,
    /// `slots.len() * CALL_BUF` bytes: slot `i`'s encoded call at `i * CALL_BUF`.
    pub(super) calls: Box<[u8]>,
    pub(super) free: Vec<u16>,
    /// Slots to send, in order, with the generation of the call queued (an entry whose call
    /// ended meanwhile is skipped, even if the slot holds a newer call).
    pub(super) queue: VecDeque<(u16, u16)>,
    /// The slot being sent and how many bytes of its record went out.
    pub(super) tx: Option<(u16, usize)>,
    pub(super) rx: Rx,
    /// The head of the READ reply whose data is being placed ([`RxMode::Data`]), and the bytes
    /// of its record kept for the reply (`keep[..keep_len]`, at most [`Program::KEEP`]).
    ///
    /// [`RxMode::Data`]: super::rx::RxMode::Data
    pub(super) read_head: Option<P::ReadHead>,
    pub(super) keep: Box<[u8]>,
    pub(super) keep_len: usize,
    pub(super) iov: sys::Iovecs,
    /// XOR-ed into every XID, so that two connections' (or two runs') XIDs differ.
    pub(super) xid_seed: u32,
    pub(super) stamp: u32,
    /// Timers are checked when `now` reaches this, every `tick`.
    pub(super) next_timer: Instant,
    pub(super) tick: Duration,
    /// READs in flight asking at least [`DIRECT_MIN`] bytes.
    pub(super) big_reads: usize,
    pub(super) stats: ConnStats,
}

impl<P: Program> Conn<P> {
    /// Closes the socket; every call not finished goes back to the send queue (calls that were
    /// on the wire count as retransmissions when they go out again).
    pub(super) fn drop_link(&mut self, now: Instant) {
        self.link = Link::Down { retry_at: now };
        self.tx = None;
        self.rx.clear();
        self.queue.clear();
        for i in 0..self.slots.len() {
            let s = &mut self.slots[i];
            if s.state != SlotState::Free {
                s.state = SlotState::Queued;
                self.queue.push_back((i as u16, s.generation));
            }
        }
    }

    /// Resets the connection after `fault`, ending or requeueing the calls.
    pub(super) fn reset(&mut self, now: Instant, sink: &mut dyn Sink<P>, fault: Fault) {
        if let Fault::Garbage = fault {
            self.stats.bad_replies += 1;
            for i in 0..self.slots.len() {
                if self.slots[i].state == SlotState::Sent {
                    self.finish(i, sink, Err(CallError::Broken));
                }
            }
        }
        self.drop_link(now);
    }

    /// Ends slot `i`'s call: tells the sink, frees the slot.
    pub(super) fn finish(&mut self, i: usize, sink: &mut dyn Sink<P>, res: Result<P::Reply<'_>, CallError>) {
        let tag = self.free_slot(i);
        sink.done(tag, res);
    }

    /// Frees slot `i`; returns its tag.
    pub(super) fn free_slot(&mut self, i: usize) -> u32 {
        free_slot(&mut self.slots, &mut self.free, &mut self.big_reads, i)
    }

    pub(super) fn max_record(&self) -> usize {
        self.rx.buf.len() - RECORD_SLACK
    }

    /// The tag of the READ whose data is being placed, if that call is still waiting for it (it
    /// may have timed out or been aborted meanwhile, and its slot reused).
    pub(super) fn read_target(&self, p: &ReadProgress) -> Option<u32> {
        let s = self.slots.get(usize::from(p.slot))?;
        (!p.discard && s.state == SlotState::Sent && s.xid == p.xid).then_some(s.tag)
    }

    /// Looks up the call a reply is for.
    pub(super) fn slot_of(&self, xid: u32) -> Option<usize> {
        let i = ((xid ^ self.xid_seed) & 0xffff) as usize;
        let s = self.slots.get(i)?;
        (s.state == SlotState::Sent && s.xid == xid).then_some(i)
    }
}

/// Frees slot `i` (by fields, for callers that hold a borrow of the receive buffer); returns
/// its tag.
pub(super) fn free_slot<C>(
    slots: &mut [Slot<C>],
    free: &mut Vec<u16>,
    big_reads: &mut usize,
    i: usize,
) -> u32 {
    let s = &mut slots[i];
    s.state = SlotState::Free;
    if s.read_count >= DIRECT_MIN {
        *big_reads -= 1;
    }
    free.push(i as u16);
    s.tag
}
