//! The raw round trip of the NFS client: the same [`Conn`] the device's pollers use, driven
//! directly from the bench thread (no device, no FUSE, no guest memory), READ and WRITE on the
//! file the device phases laid out. Run in the same process and round as the device phases, so
//! the device's own cost at QD=1 is a difference of two medians measured together
//! ([`super::BenchConfig::remote`]).
//!
//! Each call in flight has a buffer of its own (allocated once per run); READ data is received
//! into it and WRITE data sent from it (UNSTABLE, as the device's engine sends in steady state).
//! Latency is from [`Conn::call`] to the completion seen by [`Conn::poll`].

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use virtiofs_backend::io::{Reader, Writer};
use virtiofs_backend::nfs::conn::{CallError, Conn, ConnConfig, Cred, Sink};
use virtiofs_backend::nfs::setup::{self, Mounted};
use virtiofs_backend::nfs::url::NfsUrl;
use virtiofs_backend::nfs::wire::nfs3::{Args, Fh, Res, Stable};
use vm_memory::VolatileSlice;

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
struct RawSink {
    /// One buffer per tag (leaked once: the slices borrow them for the run).
    full: Vec<VolatileSlice<'static>>,
    /// The first `block` bytes of each, for the current phase.
    slices: Vec<[VolatileSlice<'static>; 1]>,
    /// (tag, bytes moved or why not), filled by `done`.
    completed: Vec<(u32, Result<u32, String>)>,
}

impl Sink for RawSink {
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>> {
        let s = self.slices.get(tag as usize)?;
        Some(Writer::new(&s[..]))
    }

    fn payload(&mut self, tag: u32) -> Option<Reader<'_>> {
        let s = self.slices.get(tag as usize)?;
        Some(Reader::new(&s[..]))
    }

    fn done(&mut self, tag: u32, res: Result<Res<'_>, CallError>) {
        let r = match res {
            Ok(Res::Read { count, .. }) | Ok(Res::Write { count, .. }) => Ok(count),
            Ok(Res::Failed { status, .. }) => Err(format!("NFS error {status:?}")),
            Ok(_) => Err("unexpected reply".into()),
            Err(e) => Err(e.to_string()),
        };
        self.completed.push((tag, r));
    }
}

/// The raw client: a mounted export, one connection, the bench file's handle.
pub struct RawClient {
    url: NfsUrl,
    mounted: Mounted,
    conn: Conn,
    file: Fh,
    sink: RawSink,
    starts: Vec<Instant>,
}

const TIMEOUT: Duration = Duration::from_secs(30);

fn err(what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Config(format!("raw NFS client: {what}: {e}"))
}

impl RawClient {
    /// Mounts `url`, connects, and finds `name` in the export's root; buffers for `depth`
    /// calls of up to `max_block` bytes.
    pub fn new(url: &str, name: &str, depth: usize, max_block: usize) -> Result<RawClient, BenchError> {
        let url: NfsUrl = url.parse().map_err(|e| err("URL", e))?;
        let mounted = setup::mount(&url, TIMEOUT).map_err(|e| err("MOUNT", e))?;
        let cfg = ConnConfig {
            addr: mounted.nfs_addr,
            slots: depth.max(1),
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
        let full: Vec<VolatileSlice<'static>> =
            (0..depth.max(1)).map(|_| VolatileSlice::from(Vec::leak(vec![0x5au8; max_block]))).collect();
        let sink = RawSink { full, slices: Vec::new(), completed: Vec::with_capacity(depth.max(1)) };
        Ok(RawClient { url, mounted, conn, file, sink, starts: vec![Instant::now(); depth.max(1)] })
    }

    /// Runs one phase: `warmup` then `duration` (or `ops` measured calls after a tenth as many).
    pub fn run(
        &mut self,
        ph: &RawPhase,
        file_size: u64,
        warmup: Duration,
        duration: Duration,
        ops: Option<u64>,
    ) -> Result<Row, BenchError> {
        let depth = ph.depth.min(self.starts.len());
        self.sink.slices = self
            .sink
            .full
            .iter()
            .map(|f| f.subslice(0, ph.block).map(|s| [s]))
            .collect::<Result<_, _>>()
            .map_err(|e| err("block larger than the buffers", e))?;
        let blocks = (file_size / ph.block as u64).max(1);
        let mut rng = 0x2545_f491_4f6c_dd1du64 ^ (ph.depth as u64) << 8 ^ u64::from(ph.write);
        let mut seq = 0u64;
        let mut hist =
            Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| err("histogram", e))?;
        let file = self.file;
        let count = ph.block as u32;
        let issue = |conn: &mut Conn,
                     sink: &mut RawSink,
                     starts: &mut [Instant],
                     tag: u32,
                     seq: &mut u64,
                     rng: &mut u64| {
            let block = if ph.sequential { *seq % blocks } else { xorshift(rng) % blocks };
            *seq += 1;
            let offset = block * ph.block as u64;
            let args = if ph.write {
                Args::Write { fh: &file, offset, count, stable: Stable::Unstable }
            } else {
                Args::Read { fh: &file, offset, count }
            };
            starts[tag as usize] = Instant::now();
            conn.call(tag, &Cred::ROOT, &args, sink).map_err(|e| err("call", e))
        };
        let t0 = Instant::now();
        let (warm_ops, total_ops) = match ops {
            Some(n) => ((n / 10).max(1), n + (n / 10).max(1)),
            None => (u64::MAX, u64::MAX),
        };
        for tag in 0..depth as u32 {
            issue(&mut self.conn, &mut self.sink, &mut self.starts, tag, &mut seq, &mut rng)?;
        }
        let (mut completed, mut measured, mut bytes) = (0u64, 0u64, 0u64);
        let mut measure_start: Option<Instant> = None;
        let mut in_flight = depth;
        let mut stopping = false;
        while in_flight > 0 {
            self.conn.poll(Instant::now(), &mut self.sink);
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
                let (tag, r) = std::mem::replace(&mut self.sink.completed[i], (0, Ok(0)));
                let moved = r.map_err(|e| err(if ph.write { "WRITE" } else { "READ" }, e))?;
                if moved != count {
                    return Err(err("short transfer", format!("{moved} of {count} bytes")));
                }
                completed += 1;
                if measure_start.is_some() && !stopping {
                    let ns = (now - self.starts[tag as usize]).as_nanos() as u64;
                    hist.record(ns.max(1)).map_err(|e| err("histogram", e))?;
                    measured += 1;
                    bytes += u64::from(moved);
                }
                if stopping {
                    in_flight -= 1;
                } else {
                    issue(&mut self.conn, &mut self.sink, &mut self.starts, tag, &mut seq, &mut rng)?;
                }
            }
            self.sink.completed.clear();
        }
        let secs = measure_start.map(|m| m.elapsed().as_secs_f64()).unwrap_or(0.0).max(1e-9);
        Ok(Row {
            workload: ph.name(),
            block: ph.block,
            request_bytes: ph.block,
            depth: ph.depth,
            depth_label: ph.depth_label.to_string(),
            policy: None,
            ops: measured,
            p50_us: us(&hist, 0.5),
            p99_us: us(&hist, 0.99),
            p999_us: us(&hist, 0.999),
            max_us: hist.max() as f64 / 1000.0,
            iops: measured as f64 / secs,
            mib_s: bytes as f64 / secs / MIB as f64,
            parked: 0,
            retry_timer_fires: 0,
            poller_cpu_us_per_op: None,
            curve: curve(&hist),
        })
    }

    /// The connection's counters (retransmits, reconnects, timeouts).
    pub fn conn_stats(&self) -> virtiofs_backend::nfs::conn::ConnStats {
        self.conn.stats()
    }
}

impl Drop for RawClient {
    fn drop(&mut self) {
        let _ = setup::unmount(&self.mounted, &self.url.export, Duration::from_secs(2));
    }
}
