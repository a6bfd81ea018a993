//! One non-blocking TCP connection to an NFS server, owned by one poller: RPC record marking,
//! XIDs matched over a preallocated slot table, AUTH_SYS, retransmission by reconnecting,
//! timeouts. See DESIGN.md, "NFS client: wire and connection".

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::net::TcpStream;

use super::wire::nfs3::{self, Args, Fattr, Proc, ReadHead, Res};
use super::wire::rpc::{self, RpcError};
use super::wire::xdr::{self, Decoder, Encoder};
use super::wire::WireError;

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
    /// The call was abandoned ([`Conn::abort_all`]).
    #[error("call abandoned")]
    Closed,
    /// The server refused the call at the RPC level.
    #[error("RPC error: {0}")]
    Rpc(RpcError),
    /// A WRITE whose owner gave no payload, or a shorter one than its count, when it was sent.
    #[error("WRITE payload missing or shorter than its count")]
    Payload,
}

/// What a completed call needs from its owner (the engine), by the caller's `tag`.
pub trait Sink {
    /// Where READ reply data goes (the guest's buffers), or None to discard. It may be asked
    /// several times for one reply (data arriving over several poll rounds) and must give the
    /// same buffers each time, from their start.
    fn read_buffer(&mut self, tag: u32) -> Option<crate::io::Writer<'_>>;
    /// A pending WRITE's data (the guest's buffers), read each time it is (re)sent.
    fn payload(&mut self, tag: u32) -> Option<crate::io::Reader<'_>>;
    /// The call `tag` ended: its decoded reply, or why not (`Err`).
    fn done(&mut self, tag: u32, res: Result<Res<'_>, CallError>);
}

/// Counters of one connection (data, not log text).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Calls accepted by [`Conn::call`].
    pub calls: u64,
    /// Replies matched to a call.
    pub replies: u64,
    /// Calls sent again after a reconnection.
    pub retransmits: u64,
    /// Connections opened after the first.
    pub reconnects: u64,
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

/// Bytes of one slot's send buffer: the record mark, the largest RPC call header and the
/// largest arguments (two handles and two names, or a handle, a name and a symlink target).
const CALL_BUF: usize = 8192;
/// Room in the receive buffer beyond `max_io`: the largest reply header and attributes.
const RECV_EXTRA: usize = 8192;
/// A record's fragments are reassembled in the receive buffer; a record longer than this
/// (relative to the buffer) is refused as garbage.
const RECORD_SLACK: usize = 8;
/// Most fragments of one record (a 1 MiB reply in 4 KiB fragments has 256).
const MAX_FRAGMENTS: usize = 1 << 14;
/// Most iovecs one `sendmsg`/`readv` takes (IOV_MAX).
const IOV_MAX: usize = 1024;
/// Most socket reads per poll round, so that one busy connection does not starve the poller.
const READS_PER_POLL: usize = 16;
/// First reconnection delay after a failed connect; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(1);
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// READs asking this much or more get their data straight into the sink's buffers: while one is
/// in flight, a read at a record boundary takes only [`PEEK`] bytes (a READ reply's header and
/// attributes are 132), so that the data after them is left in the socket for `readv`. Smaller
/// READs are copied from the receive buffer: one `memcpy` of a few KiB costs less than the
/// extra system call.
const DIRECT_MIN: u32 = 16 << 10;
const PEEK: usize = 256;
/// The last-fragment bit of a record mark.
const LAST_FRAGMENT: u32 = 0x8000_0000;

static ZEROS: [u8; 4] = [0; 4];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Encoded, waiting in the send queue (or for a connection).
    Queued,
    /// Sent in full or in part on the current connection.
    Sent,
}

/// One call in flight. Its encoded record (without a WRITE's data) is in the slot's part of
/// `Conn::calls`.
#[derive(Clone, Copy, Debug)]
struct Slot {
    state: SlotState,
    tag: u32,
    xid: u32,
    /// Bumped for every new call in this slot: the high half of the XID.
    generation: u16,
    proc: Proc,
    /// Encoded bytes (record mark, header, arguments).
    len: usize,
    /// WRITE: data bytes sent after the encoded part (then padding).
    payload: u32,
    /// READ: the count asked (a reply with more data is garbage).
    read_count: u32,
    /// When `call` took it (for the timeout).
    started: Instant,
    /// When it was last (re)sent (for the retransmission).
    sent_at: Instant,
    /// Whether it went out on some connection already (a later send is a retransmission).
    was_sent: bool,
}

impl Slot {
    fn record_len(&self) -> usize {
        self.len + self.payload as usize + xdr::pad(self.payload as usize)
    }
}

enum Link {
    /// No socket; connect again at `retry_at`.
    Down { retry_at: Instant },
    /// A non-blocking connect in progress since `since`.
    Connecting { stream: TcpStream, since: Instant },
    /// Connected.
    Up { stream: TcpStream },
}

/// How far the receiver is in the current record.
#[derive(Clone, Copy, Debug)]
enum RxMode {
    /// Assembling a record in the buffer.
    Record,
    /// A READ reply's data, placed straight into the sink's buffer (or dropped): its header was
    /// decoded and consumed.
    Data(ReadProgress),
    /// After a READ's data: its padding, which must end the record.
    Pad(ReadProgress),
}

#[derive(Clone, Copy, Debug)]
struct ReadProgress {
    slot: u16,
    xid: u32,
    len: u32,
    placed: u32,
    eof: bool,
    attr: Option<Fattr>,
    /// The data is dropped (the sink gave no buffer, or one too small: then `too_small`).
    discard: bool,
    too_small: bool,
}

/// The receive side: one buffer, allocated once. `buf[start..start + rec_len]` is the current
/// record assembled so far (record marks removed), `buf[start + rec_len + gap..end]` bytes
/// received and not yet looked at.
struct Rx {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    rec_len: usize,
    /// Bytes of the record marks dropped since the record began, between the record assembled so
    /// far and the raw bytes: a fragment's bytes move down over it as they are taken, so each
    /// byte moves once per fragment (moving everything behind each mark instead costs the whole
    /// buffer per mark: a hostile server's empty fragments would stall the poller). Zero while
    /// `rec_len` is.
    gap: usize,
    /// Bytes of the current record received so far, including READ data placed elsewhere.
    rec_total: usize,
    /// Fragments of the current record so far (bounded: empty fragments would never end it).
    frags: usize,
    /// A record mark was read and `frag_left` bytes of its fragment are still to come.
    in_frag: bool,
    frag_left: usize,
    frag_last: bool,
    mode: RxMode,
    /// Bytes moved within `buf` so far ([`ConnStats::moved_bytes`]).
    moved: u64,
}

impl Rx {
    fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
        self.rec_len = 0;
        self.gap = 0;
        self.rec_total = 0;
        self.frags = 0;
        self.in_frag = false;
        self.frag_left = 0;
        self.frag_last = false;
        self.mode = RxMode::Record;
    }

    /// Moves `from` to `to` within the buffer, counted ([`ConnStats::moved_bytes`]): every move
    /// within it goes through here.
    fn move_within(&mut self, from: std::ops::Range<usize>, to: usize) {
        self.moved += from.len() as u64;
        self.buf.copy_within(from, to);
    }

    /// Where the raw bytes begin.
    fn raw_at(&self) -> usize {
        self.start + self.rec_len + self.gap
    }

    fn raw(&self) -> usize {
        self.end - self.raw_at()
    }

    /// Appends `n` raw bytes to the record assembled so far (moving them over the gap).
    fn take(&mut self, n: usize) {
        if self.gap > 0 {
            let from = self.raw_at();
            let to = self.start + self.rec_len;
            self.move_within(from..from + n, to);
        }
        self.rec_len += n;
    }

    /// Closes the gap (the raw bytes move down behind the record), for room at the end.
    fn squeeze(&mut self) {
        if self.gap > 0 {
            let from = self.raw_at();
            let end = self.end;
            self.move_within(from..end, self.start + self.rec_len);
            self.end -= self.gap;
            self.gap = 0;
        }
    }

    /// The record assembled so far is consumed (`start` moves past it and the gap).
    fn consume_record(&mut self) {
        self.start += self.rec_len + self.gap;
        self.rec_len = 0;
        self.gap = 0;
    }

    /// Moves what is kept to the buffer's start when the room after it runs short.
    fn compact(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 && self.buf.len() - self.end < self.buf.len() / 4 {
            self.move_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }
}

/// What happened to a record or a stream; decides whether the connection is reset.
enum Fault {
    /// The stream is unusable (a bad record mark, garbage not attributable to a call): the calls
    /// on the wire fail with [`CallError::Broken`], the others are sent again.
    Garbage,
    /// The connection was lost (EOF, an error): every call is sent again on a new one.
    Lost,
}

/// One non-blocking TCP connection. `Send`, owned by one poller.
pub struct Conn {
    cfg: ConnConfig,
    link: Link,
    /// Whether a connection was ever established (later ones count as reconnects).
    connected_once: bool,
    backoff: Duration,
    slots: Vec<Slot>,
    /// `slots.len() * CALL_BUF` bytes: slot `i`'s encoded call at `i * CALL_BUF`.
    calls: Box<[u8]>,
    free: Vec<u16>,
    /// Slots to send, in order, with the generation of the call queued (an entry whose call
    /// ended meanwhile is skipped, even if the slot holds a newer call).
    queue: VecDeque<(u16, u16)>,
    /// The slot being sent and how many bytes of its record went out.
    tx: Option<(u16, usize)>,
    rx: Rx,
    iov: sys::Iovecs,
    /// XOR-ed into every XID, so that two connections' (or two runs') XIDs differ.
    xid_seed: u32,
    stamp: u32,
    /// Timers are checked when `now` reaches this, every `tick`.
    next_timer: Instant,
    tick: Duration,
    /// READs in flight asking at least [`DIRECT_MIN`] bytes.
    big_reads: usize,
    stats: ConnStats,
}

impl Conn {
    /// Starts a non-blocking connect; never blocks. Allocates all buffers here, once.
    pub fn new(cfg: ConnConfig) -> std::io::Result<Conn> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, m.to_owned());
        if cfg.slots == 0 || cfg.slots > usize::from(u16::MAX) {
            return Err(bad("slots must be 1 to 65535"));
        }
        if cfg.max_io == 0 || cfg.max_io > 64 << 20 {
            return Err(bad("max_io must be 1 byte to 64 MiB"));
        }
        if cfg.machine_name.len() > rpc::MAX_MACHINE_NAME {
            return Err(bad("machine name over 255 bytes"));
        }
        if cfg.timeout.is_zero() || cfg.retransmit.is_zero() {
            return Err(bad("timeout and retransmit must be positive"));
        }
        let now = Instant::now();
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        // Distinct per connection: the time, the process and a count of connections made.
        static MADE: AtomicU32 = AtomicU32::new(0);
        let nth = MADE.fetch_add(1, Ordering::Relaxed);
        let xid_seed = (wall.as_nanos() as u32) ^ (std::process::id() << 16) ^ nth.wrapping_mul(0x9e37_79b9);
        let blank = Slot {
            state: SlotState::Free,
            tag: 0,
            xid: 0,
            generation: 0,
            proc: Proc::Null,
            len: 0,
            payload: 0,
            read_count: 0,
            started: now,
            sent_at: now,
            was_sent: false,
        };
        let tick = (cfg.retransmit.min(cfg.timeout) / 10)
            .clamp(Duration::from_millis(1), Duration::from_millis(100));
        let n = cfg.slots;
        let mut conn = Conn {
            link: Link::Down { retry_at: now },
            connected_once: false,
            backoff: MIN_BACKOFF,
            slots: vec![blank; n],
            calls: vec![0u8; n * CALL_BUF].into_boxed_slice(),
            free: (0..n as u16).rev().collect(),
            queue: VecDeque::with_capacity(n),
            tx: None,
            rx: Rx {
                buf: vec![0u8; cfg.max_io as usize + RECV_EXTRA].into_boxed_slice(),
                start: 0,
                end: 0,
                rec_len: 0,
                gap: 0,
                rec_total: 0,
                frags: 0,
                in_frag: false,
                frag_left: 0,
                frag_last: false,
                mode: RxMode::Record,
                moved: 0,
            },
            iov: sys::Iovecs::with_capacity(IOV_MAX + 2),
            xid_seed,
            stamp: wall.as_secs() as u32,
            next_timer: now + tick,
            tick,
            big_reads: 0,
            stats: ConnStats::default(),
            cfg,
        };
        conn.connect(now);
        Ok(conn)
    }

    /// Queues one call (encoded into its slot's send buffer now, sent at once if the
    /// connection can take it and no other call waits, else on a later poll). While it runs,
    /// `sink` is asked about this call only: its payload, and `done(tag)` if it ends at once (a
    /// WRITE whose payload is missing); other calls are only ever handled in [`Conn::poll`].
    pub fn call(
        &mut self,
        tag: u32,
        cred: &Cred,
        args: &Args<'_>,
        sink: &mut dyn Sink,
    ) -> Result<(), CallError> {
        let max = self.cfg.max_io;
        let (payload, read_count) = match *args {
            Args::Read { count, .. } => (0, count),
            Args::Write { count, .. } => (count, 0),
            _ => (0, 0),
        };
        let too_big = match *args {
            Args::Read { count, .. } | Args::Write { count, .. } | Args::Readdir { count, .. } => count > max,
            Args::Readdirplus { dircount, maxcount, .. } => maxcount > max || dircount > max,
            _ => false,
        };
        if too_big {
            return Err(CallError::TooLarge);
        }
        let Some(&idx) = self.free.last() else {
            return Err(CallError::Full);
        };
        let i = usize::from(idx);
        let generation = self.slots[i].generation.wrapping_add(1);
        let xid = ((u32::from(generation) << 16) | u32::from(idx)) ^ self.xid_seed;
        let buf = &mut self.calls[i * CALL_BUF..(i + 1) * CALL_BUF];
        let ngroups = usize::from(cred.ngroups).min(rpc::MAX_GIDS);
        let auth = rpc::AuthSys {
            stamp: self.stamp,
            machine: self.cfg.machine_name.as_bytes(),
            uid: cred.uid,
            gid: cred.gid,
            gids: &cred.groups[..ngroups],
        };
        let proc = args.proc();
        let mut e = Encoder::new(buf);
        let encoded = (|| {
            let mark = e.reserve_u32()?;
            rpc::encode_call(&mut e, xid, nfs3::PROGRAM, nfs3::VERSION, proc as u32, &auth)?;
            nfs3::encode_args(&mut e, args)?;
            Ok::<_, WireError>(mark)
        })();
        let Ok(mark) = encoded else {
            return Err(CallError::TooLarge);
        };
        let len = e.position();
        let body = (len - 4) + payload as usize + xdr::pad(payload as usize);
        e.patch_u32(mark, LAST_FRAGMENT | body as u32);
        self.free.pop();
        let now = Instant::now();
        self.slots[i] = Slot {
            state: SlotState::Queued,
            tag,
            xid,
            generation,
            proc,
            len,
            payload,
            read_count,
            started: now,
            sent_at: now,
            was_sent: false,
        };
        self.queue.push_back((idx, generation));
        self.stats.calls += 1;
        if read_count >= DIRECT_MIN {
            self.big_reads += 1;
        }
        // Sent at once only when nothing else waits: then `sink` is asked about this call only
        // (its payload), so a caller may pass a sink that knows just this call.
        if self.tx.is_none() && self.queue.len() == 1 && matches!(self.link, Link::Up { .. }) {
            self.flush(now, sink);
        }
        Ok(())
    }

    /// One poll round: connect progress, send what is queued, read and decode replies,
    /// retransmit/reconnect and time out calls, calling `sink` for each call that ended.
    /// Never blocks. Cheap when idle.
    pub fn poll(&mut self, now: Instant, sink: &mut dyn Sink) {
        let busy = self.in_flight() > 0;
        let timers = now >= self.next_timer;
        if !busy && !timers {
            return;
        }
        self.progress_link(now);
        if matches!(self.link, Link::Up { .. }) {
            self.flush(now, sink);
            self.receive(now, sink, false);
            if matches!(self.link, Link::Up { .. }) && self.tx.is_none() && !self.queue.is_empty() {
                self.flush(now, sink);
            }
        }
        if timers {
            self.next_timer = now + self.tick;
            self.check_timers(now, sink);
        }
    }

    /// What a caller with calls in flight may block on instead of calling [`Conn::poll`] in a
    /// loop: the socket (`None` while there is none: a reconnection's back-off), whether it must
    /// become writable too (a connect in progress, a record not all sent, calls queued), and how
    /// long until the timers want a poll (retransmission, time-outs, the next connect). Level
    /// triggered: bytes left in the socket by a poll's read budget keep it readable.
    pub fn readiness(&self, now: Instant) -> (Option<BorrowedFd<'_>>, bool, Duration) {
        let timer = self.next_timer.saturating_duration_since(now);
        match &self.link {
            Link::Down { retry_at } => (None, false, timer.min(retry_at.saturating_duration_since(now))),
            Link::Connecting { stream, .. } => (Some(stream.as_fd()), true, timer),
            Link::Up { stream } => (Some(stream.as_fd()), self.tx.is_some() || !self.queue.is_empty(), timer),
        }
    }

    /// Calls in flight (queued or sent, not yet ended).
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The counters.
    pub fn stats(&self) -> ConnStats {
        ConnStats { moved_bytes: self.rx.moved, ..self.stats }
    }

    /// Whether the connection is established.
    pub fn is_connected(&self) -> bool {
        matches!(self.link, Link::Up { .. })
    }

    /// Ends every call in flight with [`CallError::Closed`] (used on drop / drain give-up).
    pub fn abort_all(&mut self, sink: &mut dyn Sink) {
        if let Some((_, off)) = self.tx {
            if off > 0 {
                // A record is half sent: the stream cannot go on without its payload.
                self.drop_link(Instant::now());
            }
        }
        self.tx = None;
        self.queue.clear();
        for i in 0..self.slots.len() {
            if self.slots[i].state != SlotState::Free {
                self.finish(i, sink, Err(CallError::Closed));
            }
        }
    }

    // ---- the link ----

    fn connect(&mut self, now: Instant) {
        self.link = match TcpStream::connect(self.cfg.addr) {
            Ok(stream) => Link::Connecting { stream, since: now },
            Err(_) => self.failed_connect(now),
        };
    }

    fn failed_connect(&mut self, now: Instant) -> Link {
        let retry_at = now + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF).min(self.cfg.retransmit);
        Link::Down { retry_at }
    }

    fn progress_link(&mut self, now: Instant) {
        match &self.link {
            Link::Down { retry_at } => {
                if now >= *retry_at {
                    self.connect(now);
                }
            }
            Link::Connecting { stream, since } => {
                let since = *since;
                let state = match stream.take_error() {
                    Ok(Some(_)) | Err(_) => Err(()),
                    Ok(None) => match stream.peer_addr() {
                        Ok(_) => Ok(true),
                        Err(e) if e.kind() == std::io::ErrorKind::NotConnected => Ok(false),
                        Err(_) => Err(()),
                    },
                };
                match state {
                    Ok(true) => {
                        let Link::Connecting { stream, .. } =
                            std::mem::replace(&mut self.link, Link::Down { retry_at: now })
                        else {
                            return;
                        };
                        let _ = stream.set_nodelay(true);
                        self.link = Link::Up { stream };
                        self.backoff = MIN_BACKOFF;
                        if self.connected_once {
                            self.stats.reconnects += 1;
                        }
                        self.connected_once = true;
                        self.rx.clear();
                    }
                    Ok(false) if now.duration_since(since) < self.cfg.retransmit => {}
                    _ => self.link = self.failed_connect(now),
                }
            }
            Link::Up { .. } => {}
        }
    }

    /// Closes the socket; every call not finished goes back to the send queue (calls that were
    /// on the wire count as retransmissions when they go out again).
    fn drop_link(&mut self, now: Instant) {
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
    fn reset(&mut self, now: Instant, sink: &mut dyn Sink, fault: Fault) {
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
    fn finish(&mut self, i: usize, sink: &mut dyn Sink, res: Result<Res<'_>, CallError>) {
        let tag = self.free_slot(i);
        sink.done(tag, res);
    }

    /// Frees slot `i`; returns its tag.
    fn free_slot(&mut self, i: usize) -> u32 {
        free_slot(&mut self.slots, &mut self.free, &mut self.big_reads, i)
    }

    // ---- sending ----

    /// Sends queued calls until the socket would block.
    fn flush(&mut self, now: Instant, sink: &mut dyn Sink) {
        loop {
            let (idx, off) = match self.tx {
                Some(t) => t,
                None => {
                    let Some((idx, generation)) = self.queue.pop_front() else {
                        return;
                    };
                    let s = &mut self.slots[usize::from(idx)];
                    if s.state != SlotState::Queued || s.generation != generation {
                        continue;
                    }
                    s.state = SlotState::Sent;
                    s.sent_at = now;
                    if s.was_sent {
                        self.stats.retransmits += 1;
                    }
                    s.was_sent = true;
                    self.tx = Some((idx, 0));
                    (idx, 0)
                }
            };
            let i = usize::from(idx);
            let slot = self.slots[i];
            let total = slot.record_len();
            let Link::Up { stream } = &self.link else {
                return;
            };
            let fd = stream.as_raw_fd();
            let head = &self.calls[i * CALL_BUF..i * CALL_BUF + slot.len];
            let sent = if slot.payload == 0 {
                sys::send(fd, &mut self.iov, &head[off..], &[], &[])
            } else {
                let data_off = off.saturating_sub(slot.len);
                let data_len = slot.payload as usize;
                let reader = sink.payload(slot.tag).filter(|r| r.bytes_left() >= data_len);
                let Some(mut r) = reader else {
                    self.tx = None;
                    if off > 0 {
                        // Half a record is out: the connection cannot continue.
                        self.finish(i, sink, Err(CallError::Payload));
                        self.drop_link(now);
                        return;
                    }
                    self.finish(i, sink, Err(CallError::Payload));
                    continue;
                };
                r.truncate(data_len);
                let skip = data_off.min(data_len);
                if r.consume(skip).is_err() {
                    // Cannot happen (checked above); never loop on it.
                    self.tx = None;
                    self.finish(i, sink, Err(CallError::Payload));
                    self.drop_link(now);
                    return;
                }
                let pad_from = data_off.saturating_sub(data_len);
                let pad = &ZEROS[..xdr::pad(data_len)];
                sys::send(
                    fd,
                    &mut self.iov,
                    &head[off.min(slot.len)..],
                    &[r],
                    &pad[pad_from.min(pad.len())..],
                )
            };
            match sent {
                // Nothing to send or nothing taken: never spin on it.
                Ok(0) => return,
                Ok(n) => {
                    let off = off + n;
                    if off >= total {
                        self.tx = None;
                    } else {
                        self.tx = Some((idx, off));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.drop_link(now);
                    return;
                }
            }
        }
    }

    // ---- receiving ----

    /// Reads and consumes replies; when nothing is expected, only if `look` (a timer tick: EOF,
    /// unsolicited bytes).
    fn receive(&mut self, now: Instant, sink: &mut dyn Sink, look: bool) {
        for _ in 0..READS_PER_POLL {
            if !look && self.in_flight() == 0 && self.rx.start == self.rx.end {
                return;
            }
            let Link::Up { stream } = &self.link else {
                return;
            };
            let fd = stream.as_raw_fd();
            let got = self.fill(fd, sink);
            match got {
                Ok(0) => {
                    self.reset(now, sink, Fault::Lost);
                    return;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let fault = if e.kind() == std::io::ErrorKind::InvalidData {
                        Fault::Garbage
                    } else {
                        Fault::Lost
                    };
                    self.reset(now, sink, fault);
                    return;
                }
            }
            if let Err(fault) = self.process(sink) {
                self.reset(now, sink, fault);
                return;
            }
        }
    }

    /// One read from the socket: straight into the sink's buffer (and the receive buffer after
    /// it) when a READ's data is due and nothing is buffered, else into the receive buffer.
    fn fill(&mut self, fd: std::os::fd::RawFd, sink: &mut dyn Sink) -> std::io::Result<usize> {
        self.rx.compact();
        let target = match self.rx.mode {
            RxMode::Data(p) => self.read_target(&p),
            _ => None,
        };
        let rx = &mut self.rx;
        if let (RxMode::Data(mut p), Some(tag)) = (rx.mode, target) {
            if rx.start == rx.end && rx.in_frag && rx.frag_left > 0 {
                let want = (p.len - p.placed) as usize;
                let want = want.min(rx.frag_left);
                rx.start = 0;
                rx.end = 0;
                let w = sink.read_buffer(tag).and_then(|mut w| w.split_at(p.placed as usize).ok().map(|_| w));
                let Some(w) = w else {
                    // The sink's buffer is gone or shorter than it was: drop the rest.
                    p.discard = true;
                    p.too_small = true;
                    rx.mode = RxMode::Data(p);
                    return Ok(1);
                };
                let n = {
                    // Another big READ may follow: leave its data in the socket too.
                    let tail = if self.big_reads > 1 { PEEK } else { rx.buf.len() };
                    sys::recv_into(fd, &mut self.iov, &w, want, &mut rx.buf[..tail])?
                };
                if n == 0 {
                    return Ok(0);
                }
                self.stats.received_bytes += n as u64;
                let direct = n.min(want);
                self.stats.read_direct_bytes += direct as u64;
                p.placed += direct as u32;
                rx.frag_left -= direct;
                rx.end = n - direct;
                rx.mode = RxMode::Data(p);
                return Ok(n);
            }
        }
        if rx.end == rx.buf.len() {
            rx.squeeze();
        }
        if rx.end == rx.buf.len() {
            if rx.start > 0 {
                rx.move_within(rx.start..rx.end, 0);
                rx.end -= rx.start;
                rx.start = 0;
            } else {
                // A full buffer that `process` could not use: cannot happen with the record
                // bound; treat it as garbage rather than spin.
                return Err(std::io::Error::from(std::io::ErrorKind::InvalidData));
            }
        }
        let end = rx.end;
        let boundary = match rx.mode {
            RxMode::Record => true,
            RxMode::Data(_) => !rx.in_frag,
            RxMode::Pad(_) => false,
        };
        let limit = if self.big_reads > 0 && rx.start == rx.end && boundary {
            // At a record boundary with a big READ in flight: its header only (see DIRECT_MIN).
            (end + PEEK).min(rx.buf.len())
        } else {
            rx.buf.len()
        };
        let n = sys::recv(fd, &mut rx.buf[end..limit])?;
        rx.end += n;
        self.stats.received_bytes += n as u64;
        Ok(n)
    }

    fn max_record(&self) -> usize {
        self.rx.buf.len() - RECORD_SLACK
    }

    /// The tag of the READ whose data is being placed, if that call is still waiting for it (it
    /// may have timed out or been aborted meanwhile, and its slot reused).
    fn read_target(&self, p: &ReadProgress) -> Option<u32> {
        let s = self.slots.get(usize::from(p.slot))?;
        (!p.discard && s.state == SlotState::Sent && s.xid == p.xid).then_some(s.tag)
    }

    /// Looks up the call a reply is for.
    fn slot_of(&self, xid: u32) -> Option<usize> {
        let i = ((xid ^ self.xid_seed) & 0xffff) as usize;
        let s = self.slots.get(i)?;
        (s.state == SlotState::Sent && s.xid == xid).then_some(i)
    }

    /// Consumes what the receive buffer holds: record marks, whole records, READ data.
    fn process(&mut self, sink: &mut dyn Sink) -> Result<(), Fault> {
        loop {
            if !self.rx.in_frag {
                let at = self.rx.raw_at();
                if self.rx.end - at < 4 {
                    return Ok(());
                }
                let b = &self.rx.buf[at..at + 4];
                let mark = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                // The mark is dropped where it is: into the gap, or before the record begins.
                if self.rx.rec_len == 0 {
                    self.rx.start += 4;
                } else {
                    self.rx.gap += 4;
                }
                let len = (mark & !LAST_FRAGMENT) as usize;
                self.rx.rec_total += len;
                self.rx.frags += 1;
                if self.rx.rec_total > self.max_record() || self.rx.frags > MAX_FRAGMENTS {
                    return Err(Fault::Garbage);
                }
                self.rx.in_frag = true;
                self.rx.frag_left = len;
                self.rx.frag_last = mark & LAST_FRAGMENT != 0;
            }
            match self.rx.mode {
                RxMode::Record | RxMode::Pad(_) => {
                    let take = self.rx.raw().min(self.rx.frag_left);
                    self.rx.take(take);
                    self.rx.frag_left -= take;
                    if self.rx.frag_left > 0 {
                        if let RxMode::Record = self.rx.mode {
                            self.early_read_head(sink)?;
                        }
                        return Ok(());
                    }
                    self.rx.in_frag = false;
                    if !self.rx.frag_last {
                        if let RxMode::Record = self.rx.mode {
                            self.early_read_head(sink)?;
                        }
                        continue;
                    }
                    let mode = self.rx.mode;
                    self.rx.mode = RxMode::Record;
                    let (start, len) = (self.rx.start, self.rx.rec_len);
                    self.rx.consume_record();
                    self.rx.rec_total = 0;
                    self.rx.frags = 0;
                    match mode {
                        RxMode::Pad(p) => self.end_read(p, len, sink)?,
                        _ => self.record(start, len, sink)?,
                    }
                }
                RxMode::Data(mut p) => {
                    let avail = self.rx.raw().min(self.rx.frag_left).min((p.len - p.placed) as usize);
                    if avail > 0 {
                        if let Some(tag) = self.read_target(&p) {
                            let start = self.rx.start;
                            let placed = sink.read_buffer(tag).and_then(|mut w| {
                                w.split_at(p.placed as usize).ok()?;
                                w.write_all(&self.rx.buf[start..start + avail]).ok()
                            });
                            if placed.is_none() {
                                // The sink's buffer changed under the reply: drop the rest.
                                p.discard = true;
                                p.too_small = true;
                            } else {
                                self.stats.read_copied_bytes += avail as u64;
                            }
                        }
                        p.placed += avail as u32;
                        self.rx.start += avail;
                        self.rx.frag_left -= avail;
                    }
                    if p.placed == p.len {
                        self.rx.mode = RxMode::Pad(p);
                        continue;
                    }
                    self.rx.mode = RxMode::Data(p);
                    if self.rx.frag_left == 0 {
                        self.rx.in_frag = false;
                        if self.rx.frag_last {
                            // The record ended inside the data.
                            if self.read_target(&ReadProgress { discard: false, ..p }).is_some() {
                                return self.call_garbage(usize::from(p.slot), sink);
                            }
                            return Err(Fault::Garbage);
                        }
                        continue;
                    }
                    return Ok(());
                }
            }
        }
    }

    /// A reply that is garbage, for call `i`: the call fails, the connection is reset.
    fn call_garbage(&mut self, i: usize, sink: &mut dyn Sink) -> Result<(), Fault> {
        self.finish(i, sink, Err(CallError::Broken));
        Err(Fault::Garbage)
    }

    /// While a record is incomplete: if it is a READ reply whose header is in, switch to
    /// placing its data as it comes.
    fn early_read_head(&mut self, sink: &mut dyn Sink) -> Result<(), Fault> {
        let (start, len) = (self.rx.start, self.rx.rec_len);
        let rec = &self.rx.buf[start..start + len];
        let Some(i) = rpc::peek_xid(rec).and_then(|x| self.slot_of(x)) else {
            return Ok(());
        };
        let slot = self.slots[i];
        if slot.proc != Proc::Read {
            return Ok(());
        }
        let mut d = Decoder::new(rec);
        let head = match rpc::decode_reply(&mut d) {
            Ok((_, Ok(()))) => nfs3::decode_read_head(&mut d, slot.read_count),
            Ok((_, Err(_))) => return Ok(()),
            Err(e) => Err(e),
        };
        let head = match head {
            Ok(h) => h,
            Err(WireError::Truncated { .. }) => return Ok(()),
            Err(_) => return self.call_garbage(i, sink),
        };
        let ReadHead::Ok { attr, eof, len: data_len, .. } = head else {
            return Ok(());
        };
        let at = d.position();
        let have = len - at;
        if have >= data_len as usize {
            return Ok(());
        }
        let (discard, too_small) = match sink.read_buffer(slot.tag) {
            None => (true, false),
            Some(w) if w.available() < data_len as usize => (true, true),
            Some(_) => (false, false),
        };
        let mut p = ReadProgress {
            slot: i as u16,
            xid: slot.xid,
            len: data_len,
            placed: 0,
            eof,
            attr,
            discard,
            too_small,
        };
        // The data that came with the header: placed now, then header and data are consumed.
        if have > 0 && !discard {
            let from = start + at;
            let ok = sink
                .read_buffer(slot.tag)
                .and_then(|mut w| w.write_all(&self.rx.buf[from..from + have]).ok());
            if ok.is_none() {
                p.discard = true;
                p.too_small = true;
            } else {
                self.stats.read_copied_bytes += have as u64;
            }
        }
        p.placed = have as u32;
        self.rx.consume_record();
        self.rx.mode = RxMode::Data(p);
        Ok(())
    }

    /// The end of a READ whose data was placed as it came: `pad` bytes of padding remain.
    fn end_read(&mut self, p: ReadProgress, pad: usize, sink: &mut dyn Sink) -> Result<(), Fault> {
        let i = usize::from(p.slot);
        if self.read_target(&ReadProgress { discard: false, ..p }).is_none() {
            // Ended meanwhile (timed out, aborted): nothing to tell.
            return Ok(());
        }
        if pad != xdr::pad(p.len as usize) {
            return self.call_garbage(i, sink);
        }
        self.stats.replies += 1;
        if p.too_small {
            self.finish(i, sink, Err(CallError::TooLarge));
        } else {
            self.finish(i, sink, Ok(Res::Read { count: p.len, eof: p.eof, attr: p.attr }));
        }
        Ok(())
    }

    /// One whole record at `buf[start..start + len]`.
    fn record(&mut self, start: usize, len: usize, sink: &mut dyn Sink) -> Result<(), Fault> {
        let rec = &self.rx.buf[start..start + len];
        let Some(xid) = rpc::peek_xid(rec) else {
            return Err(Fault::Garbage);
        };
        let Some(i) = self.slot_of(xid) else {
            // A reply to no call in flight (a retransmitted call answered twice, a call that
            // timed out): dropped, if it is a reply at all.
            return match rpc::decode_reply(&mut Decoder::new(rec)) {
                Ok(_) => {
                    self.stats.unknown_xids += 1;
                    Ok(())
                }
                Err(_) => Err(Fault::Garbage),
            };
        };
        let slot = self.slots[i];
        let mut d = Decoder::new(rec);
        match rpc::decode_reply(&mut d) {
            Err(_) => return self.call_garbage(i, sink),
            Ok((_, Err(e))) => {
                self.stats.replies += 1;
                self.finish(i, sink, Err(CallError::Rpc(e)));
                return Ok(());
            }
            Ok((_, Ok(()))) => {}
        }
        let results = start + d.position();
        if slot.proc == Proc::Read {
            let head = match nfs3::decode_read_head(&mut d, slot.read_count) {
                Ok(h) => h,
                Err(_) => return self.call_garbage(i, sink),
            };
            let res = match head {
                ReadHead::Failed { status, attr } => Ok(Res::Failed { status, attr }),
                ReadHead::Ok { attr, eof, len, .. } => {
                    let Ok(data) = d.fixed(len as usize) else {
                        return self.call_garbage(i, sink);
                    };
                    match sink.read_buffer(slot.tag) {
                        None => Ok(Res::Read { count: len, eof, attr }),
                        Some(mut w) => match w.write_all(data) {
                            Ok(()) => {
                                self.stats.read_copied_bytes += u64::from(len);
                                Ok(Res::Read { count: len, eof, attr })
                            }
                            Err(_) => Err(CallError::TooLarge),
                        },
                    }
                }
            };
            if d.finish().is_err() {
                return self.call_garbage(i, sink);
            }
            self.stats.replies += 1;
            self.finish(i, sink, res);
            return Ok(());
        }
        // Decoded in place; the reply borrows the receive buffer while the sink looks at it.
        let mut d = Decoder::new(&self.rx.buf[results..start + len]);
        match nfs3::decode_res(slot.proc, &mut d) {
            Ok(res) => {
                self.stats.replies += 1;
                let tag = free_slot(&mut self.slots, &mut self.free, &mut self.big_reads, i);
                sink.done(tag, Ok(res));
                Ok(())
            }
            Err(_) => self.call_garbage(i, sink),
        }
    }

    // ---- timers ----

    fn check_timers(&mut self, now: Instant, sink: &mut dyn Sink) {
        if let Link::Up { .. } = self.link {
            if self.in_flight() == 0 && self.rx.start == self.rx.end {
                // Idle: a look at the socket for EOF or unsolicited bytes.
                self.receive(now, sink, true);
            }
        }
        let mut stuck = false;
        let mut half_sent_timed_out = false;
        let mut timed_out = false;
        for i in 0..self.slots.len() {
            let s = self.slots[i];
            if s.state == SlotState::Free {
                continue;
            }
            if now.duration_since(s.started) >= self.cfg.timeout {
                if matches!(self.tx, Some((t, off)) if usize::from(t) == i && off > 0) {
                    half_sent_timed_out = true;
                }
                if matches!(self.tx, Some((t, _)) if usize::from(t) == i) {
                    self.tx = None;
                }
                self.stats.timeouts += 1;
                timed_out = true;
                self.finish(i, sink, Err(CallError::TimedOut));
                continue;
            }
            if s.state == SlotState::Sent && now.duration_since(s.sent_at) >= self.cfg.retransmit {
                stuck = true;
            }
        }
        if timed_out {
            // Forget the queue entries of calls that ended before being sent, so the queue
            // never holds more than one entry per slot (and never grows).
            let slots = &self.slots;
            self.queue.retain(|&(i, g)| {
                let s = &slots[usize::from(i)];
                s.state == SlotState::Queued && s.generation == g
            });
        }
        if half_sent_timed_out || (stuck && matches!(self.link, Link::Up { .. })) {
            self.drop_link(now);
        }
    }
}

/// Frees slot `i` (by fields, for callers that hold a borrow of the receive buffer); returns
/// its tag.
fn free_slot(slots: &mut [Slot], free: &mut Vec<u16>, big_reads: &mut usize, i: usize) -> u32 {
    let s = &mut slots[i];
    s.state = SlotState::Free;
    if s.read_count >= DIRECT_MIN {
        *big_reads -= 1;
    }
    free.push(i as u16);
    s.tag
}

/// The system calls of the connection: `sendmsg` of a call (its encoded part, a WRITE's data
/// straight from the guest's buffers, padding) and `readv` of a READ's data straight into the
/// guest's buffers. The only `unsafe` of the NFS client.
mod sys {
    use std::io;
    use std::os::fd::RawFd;

    use crate::io::{Reader, Writer};

    /// A reusable list of iovecs (allocated once). It holds addresses only while one of the
    /// functions below runs: each fills it from borrowed buffers, makes its system call and
    /// empties it before returning.
    pub(super) struct Iovecs(Vec<libc::iovec>);

    // SAFETY: the vector is empty whenever the functions below are not running (each clears it
    // before returning), so no address in it outlives the borrows it came from or is seen by
    // another thread; moving the empty vector between threads is moving a plain allocation.
    unsafe impl Send for Iovecs {}

    impl Iovecs {
        pub(super) fn with_capacity(n: usize) -> Iovecs {
            Iovecs(Vec::with_capacity(n))
        }
    }

    fn push(v: &mut Vec<libc::iovec>, b: &[u8]) {
        if !b.is_empty() && v.len() < super::IOV_MAX {
            v.push(libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() });
        }
    }

    /// Sends `head`, then the bytes each reader has left, then `tail`, in one `sendmsg`
    /// (`MSG_NOSIGNAL | MSG_DONTWAIT`); returns the bytes sent (maybe fewer).
    pub(super) fn send(
        fd: RawFd,
        iov: &mut Iovecs,
        head: &[u8],
        data: &[Reader<'_>],
        tail: &[u8],
    ) -> io::Result<usize> {
        let v = &mut iov.0;
        v.clear();
        push(v, head);
        for r in data {
            r.iovecs(v);
        }
        if v.len() < super::IOV_MAX {
            push(v, tail);
        } else {
            // More pieces than one call takes: these now, the rest (and the padding after
            // them) on the next call, from the offset reached.
            v.truncate(super::IOV_MAX);
        }
        if v.is_empty() {
            return Ok(0);
        }
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = v.as_mut_ptr();
        msg.msg_iovlen = v.len() as _;
        // SAFETY: every iovec names memory that is valid for reads for the whole call: `head`
        // and `tail` are borrowed slices, the readers' iovecs name guest buffers the caller's
        // sink keeps mapped while it lends the `Reader`; the kernel only reads them.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        v.clear();
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Receives into `buf` (`MSG_DONTWAIT`).
    pub(super) fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is a valid, exclusively borrowed buffer of `buf.len()` bytes.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Receives at most `want` bytes into the writer's buffers, then whatever more is there
    /// into `rest`, in one `readv`; returns the total.
    pub(super) fn recv_into(
        fd: RawFd,
        iov: &mut Iovecs,
        w: &Writer<'_>,
        want: usize,
        rest: &mut [u8],
    ) -> io::Result<usize> {
        let v = &mut iov.0;
        v.clear();
        w.iovecs(v);
        // Cut the guest part at `want` bytes.
        let mut left = want;
        let mut keep = 0;
        for e in v.iter_mut() {
            if left == 0 {
                break;
            }
            e.iov_len = e.iov_len.min(left);
            left -= e.iov_len;
            keep += 1;
        }
        v.truncate(keep.min(super::IOV_MAX - 1));
        let guest: usize = v.iter().map(|e| e.iov_len).sum();
        if guest < want {
            // More iovecs than IOV_MAX: take what fits now, the rest on the next read. Nothing
            // may land in `rest` before the data is complete.
            let n = readv(fd, v);
            v.clear();
            return n;
        }
        v.push(libc::iovec { iov_base: rest.as_mut_ptr().cast(), iov_len: rest.len() });
        let n = readv(fd, v);
        v.clear();
        n
    }

    fn readv(fd: RawFd, v: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: every iovec names memory valid for writes for the whole call: the writer's
        // iovecs name guest buffers the caller's sink keeps mapped while it lends the `Writer`
        // (guest memory is only ever accessed by copies, which the kernel's is), the last one
        // the exclusively borrowed receive buffer.
        let n = unsafe { libc::readv(fd, v.as_ptr(), v.len() as libc::c_int) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}
