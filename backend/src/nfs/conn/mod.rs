//! One non-blocking TCP connection to an NFS server, owned by one poller: RPC record marking,
//! XIDs matched over a preallocated slot table, AUTH_SYS, retransmission by reconnecting,
//! timeouts. See DESIGN.md, "NFS client: wire and connection".
//!
//! The connection's owner sees [`Conn`] and the types in `types` (re-exported here). Inside,
//! `state` has the connection's state and the parts every side shares, over the leaves `rx`
//! (the receive buffer), `sys` (the system calls, the only `unsafe` of the NFS client) and
//! `types`; the sides are `link` (connecting, back-off), `send` (the send queue), `receive`
//! (socket reads, record marking), `reply` (decoding replies, placing READ data) and `timers`
//! (time-outs, retransmission). This module has the owner's methods; nothing here uses it.

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use self::rx::{Rx, RxMode};
use self::state::{Link, Slot, SlotState, CALL_BUF, DIRECT_MIN, LAST_FRAGMENT, MIN_BACKOFF, RECV_EXTRA};
use self::sys::IOV_MAX;
use super::wire::nfs3::{self, Args, Proc};
use super::wire::rpc;
use super::wire::xdr::{self, Encoder};
use super::wire::WireError;

mod link;
mod receive;
mod reply;
mod rx;
mod send;
mod state;
mod sys;
mod timers;
mod types;

pub use self::state::Conn;
pub use self::types::{CallError, ConnConfig, ConnStats, Cred, Sink};

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
}
