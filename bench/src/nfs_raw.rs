//! The raw round trip of the NFS client: the same [`Conn`] the device's pollers use, driven
//! directly from the bench thread (no device, no FUSE, no guest memory), READ and WRITE on the
//! file the device phases laid out. Run in the same process and round as the device phases, so
//! the device's own cost at QD=1 is a difference of two medians measured together
//! ([`super::BenchConfig::remote`]).
//!
//! With `?version=4.1` the calls are NFSv4.1 COMPOUNDs on a session of the raw client's own
//! (`nfs41_raw`), otherwise NFSv3 calls after a MOUNT; the phases are the same.
//!
//! Each call in flight has a buffer of its own (allocated once per run); READ data is received
//! into it and WRITE data sent from it. Latency is from [`Conn::call`] (or, for a write that
//! waits for room, from when it would have been sent) to the completion seen by [`Conn::poll`].
//!
//! Writes do what the device's engine does for the same job (`Uncommitted`): UNSTABLE, with
//! the bytes of the writes sent and not yet freed by a COMMIT counted against a bound the size
//! of the device's UNSTABLE store (`nfs_unstable_bytes`, 4 KiB-page rounded as there); once they
//! reach half of it (the store's high-water mark) one COMMIT at a time covers the writes
//! answered before it was sent and frees them at its reply; a write that finds no room waits
//! for that reply (or goes FILE_SYNC when no COMMIT can free any). At the end of a write phase
//! one COMMIT covers what is left, as the bench's FSYNC does on the device, and both sides add
//! its time to the phase's (not to any latency).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use virtiofs_backend::io::{Reader, Writer};
use virtiofs_backend::nfs::conn::{CallError, Conn, ConnConfig, ConnStats, Cred, Sink};
use virtiofs_backend::nfs::setup::{self, Mounted};
use virtiofs_backend::nfs::url::{NfsUrl, NfsVersion};
use virtiofs_backend::nfs::wire::nfs3::{Args, Fh, Res, Stable};
use vm_memory::VolatileSlice;

use super::nfs41_raw::Raw41;
use super::{curve, us, xorshift, BenchError, Row, MIB};

/// One raw phase.
#[derive(Debug, Clone, Copy)]
pub struct RawPhase {
    /// WRITE (else READ).
    pub write: bool,
    /// Sequential offsets (else random blocks).
    pub sequential: bool,
    /// Bytes per call.
    pub block: usize,
    /// Calls kept in flight.
    pub depth: usize,
    /// `1`, `16`, `seq`.
    pub depth_label: &'static str,
}

impl RawPhase {
    /// The workload name (`raw NFS 4k randread`, ...).
    pub fn name(&self) -> String {
        let size = if self.block >= MIB / 4 { "1M".to_string() } else { format!("{}k", self.block / 1024) };
        let kind = match (self.sequential, self.write) {
            (false, false) => "randread",
            (false, true) => "randwrite",
            (true, false) => "seqread",
            (true, true) => "seqwrite",
        };
        format!("raw NFS {size} {kind}")
    }
}

/// Per-call buffers and the completions of one poll.
pub(super) struct RawSink {
    /// One buffer per tag (leaked once: the slices borrow them for the run).
    full: Vec<VolatileSlice<'static>>,
    /// The first `block` bytes of each, for the current phase.
    slices: Vec<[VolatileSlice<'static>; 1]>,
    /// (tag, what the call did or why it failed), filled by `done`.
    pub(super) completed: Vec<(u32, Result<Done, String>)>,
}

impl RawSink {
    /// Where call `tag`'s READ data goes.
    pub(super) fn writer(&self, tag: u32) -> Option<Writer<'_>> {
        let s = self.slices.get(tag as usize)?;
        Some(Writer::new(&s[..]))
    }

    /// Call `tag`'s WRITE data.
    pub(super) fn reader(&self, tag: u32) -> Option<Reader<'_>> {
        let s = self.slices.get(tag as usize)?;
        Some(Reader::new(&s[..]))
    }
}

/// A completed call.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Done {
    /// Bytes moved (READ, WRITE).
    pub(super) count: u32,
    /// The server's write verifier (WRITE, COMMIT).
    pub(super) verf: Option<[u8; 8]>,
    /// A WRITE the server answered FILE_SYNC or DATA_SYNC (nothing left to commit).
    pub(super) stable: bool,
}

const PAGE: u64 = 4096;

/// The device's UNSTABLE store, counted instead of kept: what the raw client must COMMIT, and
/// when, to do what the device does for the same writes (`backend/src/nfs/unstable.rs` and the
/// engine's background COMMIT). Bytes are counted in whole 4 KiB pages, as the store keeps them.
#[derive(Debug, Default)]
struct Uncommitted {
    /// The bound (the device's `nfs_unstable_bytes`, whole pages; 0: every WRITE FILE_SYNC).
    cap: u64,
    /// Page bytes of UNSTABLE writes sent, since the start.
    sent: u64,
    /// Page bytes of those the server answered UNSTABLE, in the order of the answers.
    answered: u64,
    /// `answered` up to which COMMITs have freed.
    freed: u64,
    /// Page bytes answered stable (never stored past the reply).
    dropped: u64,
    /// The background COMMIT on the wire: `answered` when it was sent (its horizon).
    commit_out: Option<u64>,
    /// The verifier of the writes answered so far.
    verf: Option<[u8; 8]>,
    /// COMMITs sent (background and final).
    commits: u64,
    /// Writes that waited for room.
    waited: u64,
    /// Writes sent FILE_SYNC for want of room.
    full: u64,
}

impl Uncommitted {
    fn pages(len: usize) -> u64 {
        (len as u64).div_ceil(PAGE).max(1) * PAGE
    }

    fn stored(&self) -> u64 {
        self.sent - self.freed - self.dropped
    }

    fn has_room(&self, len: usize) -> bool {
        self.stored() + Self::pages(len) <= self.cap
    }

    /// At or past the high-water mark (half the bound), as `UnstableStore::past_high_water`.
    fn past_high_water(&self) -> bool {
        self.cap > 0 && self.stored() * 2 >= self.cap
    }

    /// Something answered that a COMMIT would free.
    fn committable(&self) -> bool {
        self.answered > self.freed
    }

    /// Whether waiting can bring room (`UnstableStore::room_may_come`).
    fn room_may_come(&self) -> bool {
        self.commit_out.is_some() || self.sent > self.freed + self.dropped
    }

    fn answer(&mut self, len: usize, d: &Done) -> Result<(), String> {
        if d.stable {
            self.dropped += Self::pages(len);
            return Ok(());
        }
        self.answered += Self::pages(len);
        self.check_verf(d.verf)
    }

    fn check_verf(&mut self, v: Option<[u8; 8]>) -> Result<(), String> {
        match (self.verf, v) {
            (_, None) => Err("no write verifier".into()),
            (None, Some(v)) => {
                self.verf = Some(v);
                Ok(())
            }
            (Some(a), Some(b)) if a == b => Ok(()),
            // The device would replay; the bench's figures would be of something else.
            (Some(_), Some(_)) => Err("the server's write verifier changed (it restarted?)".into()),
        }
    }

    /// A COMMIT sent when `answered` was `horizon` returned `verf`.
    fn committed(&mut self, horizon: u64, verf: Option<[u8; 8]>) -> Result<(), String> {
        self.check_verf(verf)?;
        self.freed = self.freed.max(horizon);
        Ok(())
    }
}

impl Sink for RawSink {
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>> {
        self.writer(tag)
    }

    fn payload(&mut self, tag: u32) -> Option<Reader<'_>> {
        self.reader(tag)
    }

    fn done(&mut self, tag: u32, res: Result<Res<'_>, CallError>) {
        let r = match res {
            Ok(Res::Read { count, .. }) => Ok(Done { count, ..Done::default() }),
            Ok(Res::Write { count, committed, verf, .. }) => {
                Ok(Done { count, verf: Some(verf), stable: committed != Stable::Unstable })
            }
            Ok(Res::Commit { verf }) => Ok(Done { count: 0, verf: Some(verf), stable: true }),
            Ok(Res::Failed { status, .. }) => Err(format!("NFS error {status:?}")),
            Ok(_) => Err("unexpected reply".into()),
            Err(e) => Err(e.to_string()),
        };
        self.completed.push((tag, r));
    }
}

/// The NFSv3 wire under the raw client: a mounted export, one connection, the file's handle.
struct Raw3 {
    url: NfsUrl,
    mounted: Mounted,
    conn: Conn,
    file: Fh,
}

impl Drop for Raw3 {
    fn drop(&mut self) {
        let _ = setup::unmount(&self.mounted, &self.url.export, Duration::from_secs(2));
    }
}

/// What the raw client's calls go on: NFSv3, or NFSv4.1 COMPOUNDs on a session (`?version=4.1`).
enum Wire {
    V3(Box<Raw3>),
    V41(Box<Raw41>),
}

impl Wire {
    /// Sends a READ or WRITE (UNSTABLE or FILE_SYNC) of the file as call `tag`.
    fn io(
        &mut self,
        sink: &mut RawSink,
        tag: u32,
        write: bool,
        offset: u64,
        count: u32,
        unstable: bool,
    ) -> Result<(), BenchError> {
        match self {
            Wire::V3(r) => {
                let fh = &r.file;
                let args = if write {
                    let stable = if unstable { Stable::Unstable } else { Stable::FileSync };
                    Args::Write { fh, offset, count, stable }
                } else {
                    Args::Read { fh, offset, count }
                };
                r.conn.call(tag, &Cred::ROOT, &args, sink).map_err(|e| err("call", e))
            }
            Wire::V41(r) => r.io(sink, tag, write, offset, count, unstable).map_err(|e| err("call", e)),
        }
    }

    /// Sends a COMMIT of the whole file as call `tag`.
    fn commit(&mut self, sink: &mut RawSink, tag: u32) -> Result<(), BenchError> {
        match self {
            Wire::V3(r) => {
                let args = Args::Commit { fh: &r.file, offset: 0, count: 0 };
                r.conn.call(tag, &Cred::ROOT, &args, sink).map_err(|e| err("COMMIT", e))
            }
            Wire::V41(r) => r.commit(sink, tag).map_err(|e| err("COMMIT", e)),
        }
    }

    fn poll(&mut self, sink: &mut RawSink) {
        match self {
            Wire::V3(r) => r.conn.poll(Instant::now(), sink),
            Wire::V41(r) => r.poll(sink),
        }
    }

    fn conn_stats(&self) -> ConnStats {
        match self {
            Wire::V3(r) => r.conn.stats(),
            Wire::V41(r) => r.conn_stats(),
        }
    }
}

/// The raw client: its wire (NFSv3 or NFSv4.1), the buffers, the UNSTABLE bound.
pub struct RawClient {
    wire: Wire,
    sink: RawSink,
    starts: Vec<Instant>,
    store: Uncommitted,
}

/// What a raw phase did besides its row.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawPhaseStats {
    /// COMMITs sent (background and the final one).
    pub commits: u64,
    /// Writes that waited for room under the bound.
    pub waited: u64,
    /// Writes sent FILE_SYNC for want of room.
    pub full: u64,
    /// The final COMMIT's time, added to the phase's.
    pub final_commit: Duration,
}

const TIMEOUT: Duration = Duration::from_secs(30);

fn err(what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Config(format!("raw NFS client: {what}: {e}"))
}

impl RawClient {
    /// Mounts `url`, connects, and finds `name` in the export's root; buffers for `depth`
    /// calls of up to `max_block` bytes; writes kept within `unstable_bytes` uncommitted, as
    /// the device's store of that size keeps them.
    pub fn new(
        url: &str,
        name: &str,
        depth: usize,
        max_block: usize,
        unstable_bytes: usize,
    ) -> Result<RawClient, BenchError> {
        let url: NfsUrl = url.parse().map_err(|e| err("URL", e))?;
        // The COMMITs' tags besides the calls'.
        let tags = depth.max(1) + 2;
        let wire = match url.version {
            NfsVersion::V41 => Wire::V41(Box::new(
                Raw41::new(&url, name, tags, max_block, TIMEOUT).map_err(|e| err("NFSv4.1", e))?,
            )),
            NfsVersion::V3 => {
                let mounted = setup::mount(&url, TIMEOUT).map_err(|e| err("MOUNT", e))?;
                let cfg = ConnConfig {
                    addr: mounted.nfs_addr,
                    slots: tags,
                    max_io: max_block as u32,
                    timeout: TIMEOUT,
                    retransmit: Duration::from_secs(3),
                    machine_name: "virtiofs-bench".into(),
                };
                let mut conn = Conn::new(cfg).map_err(|e| err("connect", e))?;
                let mut file = None;
                let args = Args::Lookup { dir: &mounted.root, name: name.as_bytes() };
                setup::call_blocking(&mut conn, &Cred::ROOT, &args, TIMEOUT, &mut |r| {
                    if let Res::Lookup { fh, .. } = r {
                        file = Some(fh);
                    }
                })
                .map_err(|e| err("LOOKUP", e))?;
                let file = file.ok_or_else(|| err("LOOKUP", format!("{name} not found")))?;
                Wire::V3(Box::new(Raw3 { url, mounted, conn, file }))
            }
        };
        let full: Vec<VolatileSlice<'static>> =
            (0..depth.max(1)).map(|_| VolatileSlice::from(Vec::leak(vec![0x5au8; max_block]))).collect();
        let sink = RawSink { full, slices: Vec::new(), completed: Vec::with_capacity(depth.max(1)) };
        let store = Uncommitted { cap: unstable_bytes as u64 / PAGE * PAGE, ..Uncommitted::default() };
        Ok(RawClient { wire, sink, starts: vec![Instant::now(); depth.max(1)], store })
    }

    /// Runs one phase: `warmup` then `duration` (or `ops` measured calls after a tenth as many).
    /// A write phase ends with a COMMIT of what is left uncommitted, its time added to the
    /// phase's (IOPS and MiB/s are over the measured calls' time plus it).
    pub fn run(
        &mut self,
        ph: &RawPhase,
        file_size: u64,
        warmup: Duration,
        duration: Duration,
        ops: Option<u64>,
    ) -> Result<(Row, RawPhaseStats), BenchError> {
        let depth = ph.depth.min(self.starts.len());
        self.sink.slices = self
            .sink
            .full
            .iter()
            .map(|f| f.subslice(0, ph.block).map(|s| [s]))
            .collect::<Result<_, _>>()
            .map_err(|e| err("block larger than the buffers", e))?;
        let (bg_tag, final_tag) = (self.starts.len() as u32, self.starts.len() as u32 + 1);
        let before = (self.store.commits, self.store.waited, self.store.full);
        let blocks = (file_size / ph.block as u64).max(1);
        let mut rng = 0x2545_f491_4f6c_dd1du64 ^ (ph.depth as u64) << 8 ^ u64::from(ph.write);
        let mut seq = 0u64;
        let mut hist =
            Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| err("histogram", e))?;
        let mut st = PhaseState {
            ph: *ph,
            offsets: vec![0; self.starts.len()],
            file_sync: vec![false; self.starts.len()],
            waiting: VecDeque::with_capacity(self.starts.len()),
        };
        let count = ph.block as u32;
        let t0 = Instant::now();
        let (warm_ops, total_ops) = match ops {
            Some(n) => ((n / 10).max(1), n + (n / 10).max(1)),
            None => (u64::MAX, u64::MAX),
        };
        let mut next = |c: &mut RawClient, st: &mut PhaseState, tag: u32| {
            let block = if ph.sequential { seq % blocks } else { xorshift(&mut rng) % blocks };
            seq += 1;
            st.offsets[tag as usize] = block * ph.block as u64;
            c.starts[tag as usize] = Instant::now();
            st.send_or_wait(&mut c.wire, &mut c.sink, &mut c.store, tag)
        };
        for tag in 0..depth as u32 {
            next(self, &mut st, tag)?;
        }
        let (mut completed, mut measured, mut bytes) = (0u64, 0u64, 0u64);
        let mut measure_start: Option<Instant> = None;
        let mut last_done: Option<Instant> = None;
        let mut in_flight = depth;
        let mut stopping = false;
        let mut final_sent: Option<Instant> = None;
        let mut final_commit = Duration::ZERO;
        let mut final_done = false;
        loop {
            self.wire.poll(&mut self.sink);
            let now = Instant::now();
            if measure_start.is_none() {
                let warm = match ops {
                    Some(_) => completed >= warm_ops,
                    None => now - t0 >= warmup,
                };
                if warm {
                    measure_start = Some(now);
                }
            }
            if !stopping {
                stopping = match (ops, measure_start) {
                    (Some(_), _) => completed >= total_ops,
                    (None, Some(m)) => now - m >= duration,
                    (None, None) => false,
                };
            }
            for i in 0..self.sink.completed.len() {
                let (tag, r) = std::mem::replace(&mut self.sink.completed[i], (0, Ok(Done::default())));
                if tag == bg_tag || tag == final_tag {
                    let d = r.map_err(|e| err("COMMIT", e))?;
                    if tag == bg_tag {
                        let horizon = self.store.commit_out.take().unwrap_or(0);
                        self.store.committed(horizon, d.verf).map_err(|e| err("COMMIT", e))?;
                    } else {
                        let horizon = self.store.answered;
                        self.store.committed(horizon, d.verf).map_err(|e| err("COMMIT", e))?;
                        final_commit = final_sent.map_or(Duration::ZERO, |t| now - t);
                        final_done = true;
                    }
                    continue;
                }
                let d = r.map_err(|e| err(if ph.write { "WRITE" } else { "READ" }, e))?;
                if d.count != count {
                    return Err(err("short transfer", format!("{} of {count} bytes", d.count)));
                }
                if ph.write && !st.file_sync[tag as usize] {
                    self.store.answer(ph.block, &d).map_err(|e| err("WRITE", e))?;
                }
                completed += 1;
                if measure_start.is_some() && !stopping {
                    let ns = (now - self.starts[tag as usize]).as_nanos() as u64;
                    hist.record(ns.max(1)).map_err(|e| err("histogram", e))?;
                    measured += 1;
                    bytes += u64::from(d.count);
                    last_done = Some(now);
                }
                if stopping {
                    in_flight -= 1;
                } else {
                    next(self, &mut st, tag)?;
                }
            }
            self.sink.completed.clear();
            if !ph.write {
                if in_flight == 0 {
                    break;
                }
                continue;
            }
            st.retry_room(&mut self.wire, &mut self.sink, &mut self.store)?;
            if self.commit_step(&st, in_flight, &mut final_sent, final_done, (bg_tag, final_tag))? {
                break;
            }
        }
        let window = match (measure_start, last_done) {
            (Some(m), Some(l)) => l - m,
            _ => Duration::ZERO,
        };
        let stats = RawPhaseStats {
            commits: self.store.commits - before.0,
            waited: self.store.waited - before.1,
            full: self.store.full - before.2,
            final_commit,
        };
        let row = row_of(ph, &hist, measured, bytes, window + final_commit, &stats);
        Ok((row, stats))
    }

    /// A write phase's COMMITs after a round of completions: the device's background COMMIT
    /// while calls are in flight, then the bench's final one. Whether the phase is over.
    fn commit_step(
        &mut self,
        st: &PhaseState,
        in_flight: usize,
        final_sent: &mut Option<Instant>,
        final_done: bool,
        (bg_tag, final_tag): (u32, u32),
    ) -> Result<bool, BenchError> {
        if in_flight > 0 {
            // The device's background COMMIT (`NfsEngine::maybe_commit`).
            let wanted = self.store.past_high_water() || !st.waiting.is_empty();
            if wanted && self.store.commit_out.is_none() && self.store.committable() {
                self.wire.commit(&mut self.sink, bg_tag)?;
                self.store.commit_out = Some(self.store.answered);
                self.store.commits += 1;
            }
            Ok(false)
        } else if final_sent.is_none() {
            // The bench's FSYNC at the end of the device's write phase: a COMMIT of the
            // file's stored writes, none when nothing is stored.
            if !self.store.committable() && self.store.commit_out.is_none() {
                return Ok(true);
            }
            *final_sent = Some(Instant::now());
            self.wire.commit(&mut self.sink, final_tag)?;
            self.store.commits += 1;
            Ok(false)
        } else {
            Ok(final_done && self.store.commit_out.is_none())
        }
    }

    /// The connection's counters (retransmits, reconnects, timeouts).
    pub fn conn_stats(&self) -> ConnStats {
        self.wire.conn_stats()
    }
}

/// One phase's calls: where each tag's call goes, how it was sent, the writes waiting for room.
struct PhaseState {
    ph: RawPhase,
    offsets: Vec<u64>,
    /// Sent FILE_SYNC for want of room (so not counted as stored).
    file_sync: Vec<bool>,
    waiting: VecDeque<u32>,
}

impl PhaseState {
    /// Sends `tag`'s call, or for a write that finds no room under the bound while a COMMIT
    /// can free some, keeps it waiting (as the device's `room_wait`).
    fn send_or_wait(
        &mut self,
        wire: &mut Wire,
        sink: &mut RawSink,
        store: &mut Uncommitted,
        tag: u32,
    ) -> Result<(), BenchError> {
        if self.ph.write && store.cap > 0 && !store.has_room(self.ph.block) && store.room_may_come() {
            store.waited += 1;
            self.waiting.push_back(tag);
            return Ok(());
        }
        self.send(wire, sink, store, tag)
    }

    fn send(
        &mut self,
        wire: &mut Wire,
        sink: &mut RawSink,
        store: &mut Uncommitted,
        tag: u32,
    ) -> Result<(), BenchError> {
        let (offset, count) = (self.offsets[tag as usize], self.ph.block as u32);
        let mut unstable = false;
        if self.ph.write {
            unstable = store.has_room(self.ph.block);
            if !unstable {
                store.full += 1;
            } else {
                store.sent += Uncommitted::pages(self.ph.block);
            }
            self.file_sync[tag as usize] = !unstable;
        }
        wire.io(sink, tag, self.ph.write, offset, count, unstable)
    }

    /// Writes waiting for room go once there is some, or once none can come (FILE_SYNC then).
    fn retry_room(
        &mut self,
        wire: &mut Wire,
        sink: &mut RawSink,
        store: &mut Uncommitted,
    ) -> Result<(), BenchError> {
        while let Some(&tag) = self.waiting.front() {
            if !store.has_room(self.ph.block) && store.room_may_come() {
                break;
            }
            self.waiting.pop_front();
            self.send(wire, sink, store, tag)?;
        }
        Ok(())
    }
}

/// The table row of a raw phase: `measured` calls moving `bytes` in `span` (the measured calls'
/// time plus the final COMMIT's).
fn row_of(
    ph: &RawPhase,
    hist: &Histogram<u64>,
    measured: u64,
    bytes: u64,
    span: Duration,
    stats: &RawPhaseStats,
) -> Row {
    let secs = span.as_secs_f64().max(1e-9);
    Row {
        workload: ph.name(),
        block: ph.block,
        request_bytes: ph.block,
        depth: ph.depth,
        depth_label: ph.depth_label.to_string(),
        policy: None,
        ops: measured,
        p50_us: us(hist, 0.5),
        p99_us: us(hist, 0.99),
        p999_us: us(hist, 0.999),
        max_us: hist.max() as f64 / 1000.0,
        iops: measured as f64 / secs,
        mib_s: bytes as f64 / secs / MIB as f64,
        parked: 0,
        retry_timer_fires: 0,
        poller_cpu_us_per_op: None,
        commits: ph.write.then_some(stats.commits),
        curve: curve(hist),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unstable(v: u8) -> Done {
        Done { count: 4096, verf: Some([v; 8]), stable: false }
    }

    #[test]
    fn the_bound_counts_pages_sent_and_frees_what_a_commit_covered() {
        let mut u = Uncommitted { cap: 8 * PAGE, ..Uncommitted::default() };
        assert!(u.has_room(8 * PAGE as usize) && !u.has_room(8 * PAGE as usize + 1));
        // Three writes sent, one of 100 bytes: whole pages, as the store keeps them.
        u.sent += Uncommitted::pages(4096) * 2 + Uncommitted::pages(100);
        assert_eq!(u.stored(), 3 * PAGE);
        assert!(!u.past_high_water() && !u.committable());
        u.sent += Uncommitted::pages(4096);
        assert!(u.past_high_water(), "4 of 8 pages is the high-water mark");
        // Two answered; a COMMIT sent now covers those two only.
        u.answer(4096, &unstable(1)).unwrap();
        u.answer(4096, &unstable(1)).unwrap();
        assert!(u.committable());
        let horizon = u.answered;
        u.answer(100, &unstable(1)).unwrap();
        u.committed(horizon, Some([1; 8])).unwrap();
        assert_eq!(u.stored(), 2 * PAGE, "the write answered after the COMMIT was sent stays");
        assert!(u.committable() && !u.past_high_water());
        // A reply older than one already seen frees nothing more.
        u.committed(horizon, Some([1; 8])).unwrap();
        assert_eq!(u.stored(), 2 * PAGE);
    }

    #[test]
    fn a_stable_answer_is_not_kept_and_a_new_verifier_is_an_error() {
        let mut u = Uncommitted { cap: 4 * PAGE, ..Uncommitted::default() };
        u.sent += PAGE;
        u.answer(4096, &Done { count: 4096, verf: Some([2; 8]), stable: true }).unwrap();
        assert_eq!(u.stored(), 0);
        assert!(!u.committable() && !u.room_may_come());
        u.sent += PAGE;
        u.answer(4096, &unstable(3)).unwrap();
        assert!(u.room_may_come());
        assert!(u.committed(u.answered, Some([4; 8])).is_err(), "the server restarted");
        assert!(u.answer(4096, &Done { count: 4096, verf: None, stable: false }).is_err());
    }

    #[test]
    fn no_room_means_waiting_while_a_commit_can_free_some() {
        let mut u = Uncommitted { cap: 2 * PAGE, ..Uncommitted::default() };
        u.sent += 2 * PAGE;
        assert!(!u.has_room(4096));
        // Sent but unanswered: a COMMIT can free them once answered.
        assert!(u.room_may_come());
        u.answer(4096, &unstable(5)).unwrap();
        u.answer(4096, &unstable(5)).unwrap();
        u.commit_out = Some(u.answered);
        assert!(u.room_may_come());
        let h = u.commit_out.take().unwrap();
        u.committed(h, Some([5; 8])).unwrap();
        assert!(u.has_room(2 * 4096));
        // A bound of 0: nothing is ever stored, every write goes FILE_SYNC.
        let z = Uncommitted::default();
        assert!(!z.has_room(1) && !z.room_may_come() && !z.past_high_water());
    }
}
