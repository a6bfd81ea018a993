//! One non-blocking TCP connection to an NFS server, owned by one poller: RPC record marking,
//! XIDs matched over a preallocated slot table, AUTH_SYS, retransmission by reconnecting,
//! timeouts. See DESIGN.md, "NFS client: wire and connection".
//!
//! The connection is generic over the RPC program it carries ([`Program`]): NFSv3 ([`Nfs3`],
//! the default) or NFSv4.1's COMPOUND ([`Nfs41`]); the program encodes a call and decodes its
//! reply, the connection does the rest the same way for both.
//!
//! The connection's owner sees [`Conn`] and the types in `types`, `program` and `nfs41`
//! (re-exported here). Inside, `state` has the connection's state and the parts every side
//! shares, over the leaves `rx` (the receive buffer), `sys` (the system calls, the only `unsafe`
//! of the NFS client) and `types`; the sides are `link` (connecting, back-off), `send` (the send
//! queue), `receive` (socket reads, record marking), `reply` (decoding replies, placing READ
//! data) and `timers` (time-outs, retransmission). This module has the owner's methods; nothing
//! here uses it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use self::rx::{Rx, RxMode};
use self::state::{
    Link, Probe, Slot, SlotState, CALL_BUF, DIRECT_MIN, FIRST_PROBE, LAST_FRAGMENT, MIN_BACKOFF, RECV_EXTRA,
};
use self::sys::IOV_MAX;
use super::wire::rpc;
use super::wire::xdr::{self, Encoder};

mod link;
mod nfs41;
mod program;
mod receive;
mod reply;
mod rx;
mod send;
mod state;
mod sys;
mod timers;
mod types;

pub use self::nfs41::{Call41, Compound, CompoundReply, Nfs41, ReadDone};
pub use self::program::{CallShape, Nfs3, Program, Read3, ReadStart};
pub use self::state::Conn;
pub use self::types::{CallError, ConnConfig, ConnStats, Cred, Sink};

impl<P: Program> Conn<P> {
    /// Starts a non-blocking connect; never blocks. Allocates all buffers here, once.
    pub fn new(cfg: ConnConfig) -> std::io::Result<Conn<P>> {
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
            call: P::Call::default(),
            len: 0,
            payload: 0,
            payload_at: 0,
            read_count: 0,
            started: now,
            sent_at: now,
            was_sent: false,
        };
        let tick = (cfg.retransmit.min(cfg.timeout) / 10)
            .clamp(Duration::from_millis(1), Duration::from_millis(100));
        let n = cfg.slots;
        let mut conn = Conn {
            others: Vec::new(),
            at: 0,
            failed_in_row: 0,
            link: Link::Down { retry_at: now },
            probe: Probe::Idle { at: now },
            probe_every: FIRST_PROBE,
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
            read_head: None,
            keep: vec![0u8; P::KEEP].into_boxed_slice(),
            keep_len: 0,
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

    /// Other addresses of the same server (session trunking, RFC 8881 2.10.5): when a connect
    /// to the current address fails (refused, or not done within the retransmission interval),
    /// the next one is tried at once, and only after every address failed in a row does the
    /// back-off apply. A link that was up and is lost is connected again to the same address
    /// first. While on another address than the first, a connect to the first is tried every
    /// few seconds ([`Conn::probe_first_every`]); once it is up, calls are held back until none
    /// is on the wire, and the link moves back to it. Allocates (once, at set-up).
    pub fn also_at(&mut self, others: &[SocketAddr]) {
        self.others = others.iter().copied().filter(|a| *a != self.cfg.addr).collect();
    }

    /// How often a connection away from its first address tries that one again (5 s unless
    /// set).
    pub fn probe_first_every(&mut self, every: Duration) {
        self.probe_every = every.max(Duration::from_millis(1));
        if let Probe::Idle { at } = &mut self.probe {
            *at = (*at).min(Instant::now() + self.probe_every);
        }
    }

    /// The address connected to (or being connected to).
    pub fn address(&self) -> SocketAddr {
        if self.at == 0 {
            self.cfg.addr
        } else {
            self.others[self.at - 1]
        }
    }

    /// Queues one call (encoded into its slot's send buffer now, sent at once if the
    /// connection can take it and no other call waits, else on a later poll). While it runs,
    /// `sink` is asked about this call only: its payload, and `done(tag)` if it ends at once (a
    /// WRITE whose payload is missing); other calls are only ever handled in [`Conn::poll`].
    pub fn call(
        &mut self,
        tag: u32,
        cred: &Cred,
        args: &P::Args<'_>,
        sink: &mut dyn Sink<P>,
    ) -> Result<(), CallError> {
        let now = Instant::now();
        self.encode(tag, cred, args, now, now)?;
        // Sent at once only when nothing else waits: then `sink` is asked about this call only
        // (its payload), so a caller may pass a sink that knows just this call.
        if self.tx.is_none() && self.queue.len() == 1 && matches!(self.link, Link::Up { .. }) {
            self.flush(now, sink);
        }
        Ok(())
    }

    /// Queues one call without sending it: the next [`Conn::call`], [`Conn::poll`] or
    /// [`Conn::send_queued`] sends it. Its timeout counts from `since` (a call sent again by
    /// its owner keeps its first start). For an owner that cannot lend its sink while it gives
    /// the arguments.
    pub fn queue(
        &mut self,
        tag: u32,
        cred: &Cred,
        args: &P::Args<'_>,
        since: Instant,
    ) -> Result<(), CallError> {
        self.encode(tag, cred, args, since, Instant::now())
    }

    /// Sends what is queued, if the connection is up (else [`Conn::poll`] will); `sink` is
    /// asked about any call queued.
    pub fn send_queued(&mut self, sink: &mut dyn Sink<P>) {
        if self.tx.is_none() && !self.queue.is_empty() && matches!(self.link, Link::Up { .. }) {
            self.flush(Instant::now(), sink);
        }
    }

    /// Encodes a call into a free slot and queues it.
    fn encode(
        &mut self,
        tag: u32,
        cred: &Cred,
        args: &P::Args<'_>,
        since: Instant,
        now: Instant,
    ) -> Result<(), CallError> {
        if !P::fits(args, self.cfg.max_io) {
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
        let mut e = Encoder::new(buf);
        let Ok(mark) = e.reserve_u32() else {
            return Err(CallError::TooLarge);
        };
        let Ok(shape) = P::encode(&mut e, xid, &auth, args) else {
            return Err(CallError::TooLarge);
        };
        let len = e.position();
        let (payload_at, payload) = shape.payload.unwrap_or((len, 0));
        let payload_at = payload_at.min(CALL_BUF) as u16;
        let body = (len - 4) + payload as usize + xdr::pad(payload as usize);
        e.patch_u32(mark, LAST_FRAGMENT | body as u32);
        self.free.pop();
        self.slots[i] = Slot {
            state: SlotState::Queued,
            tag,
            xid,
            generation,
            call: shape.call,
            len,
            payload,
            payload_at,
            read_count: shape.read_count,
            started: since,
            sent_at: now,
            was_sent: false,
        };
        self.queue.push_back((idx, generation));
        self.stats.calls += 1;
        if shape.read_count >= DIRECT_MIN {
            self.big_reads += 1;
        }
        Ok(())
    }

    /// One poll round: connect progress, send what is queued, read and decode replies,
    /// retransmit/reconnect and time out calls, calling `sink` for each call that ended.
    /// Never blocks. Cheap when idle.
    pub fn poll(&mut self, now: Instant, sink: &mut dyn Sink<P>) {
        let busy = self.in_flight() > 0;
        let timers = now >= self.next_timer;
        if !busy && !timers {
            return;
        }
        self.progress_link(now);
        if self.at != 0 {
            self.probe_first(now);
        } else if !matches!(self.probe, Probe::Idle { .. }) {
            // Back on the first address by another way (every address failed in turn): a
            // probe under way or ready is not needed.
            self.probe = Probe::Idle { at: now };
        }
        if matches!(self.link, Link::Up { .. }) {
            self.flush(now, sink);
            self.receive(now, sink, false);
            if self.holding() {
                // The last call on the wire may have been answered: the link moves back now.
                self.probe_first(now);
            }
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
            Link::Up { stream } => {
                let sending = self.tx.is_some() || (!self.queue.is_empty() && !self.holding());
                (Some(stream.as_fd()), sending, timer)
            }
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
    pub fn abort_all(&mut self, sink: &mut dyn Sink<P>) {
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
}
