//! `virtiofs-bench`: latency and bandwidth of the device as the driver model sees them.
//!
//! The benchmark is a crate of its own so that the driver model (`virtiofs-tools`) needs neither
//! the device, the backend nor the root crate: only this crate runs the device in-process
//! (`virtiofs_dpu::RunningDevice`, and [`null`]'s handler on the device's `RequestHandler`).
//!
//! [`run`] measures, in order:
//!
//! 1. the **floor**: a shared-memory ping-pong between two threads ([`pingpong`]) and a random
//!    4 KiB copy out of a buffer the size of the test file ([`copy`]: what a read's data costs
//!    at least), before the device starts so that no poller competes for a core;
//! 2. the device, in-process with its RAM filesystem (or an external daemon), brought up by
//!    [`FsDriver`]; a test file is laid out with WRITEs;
//! 3. closed loops ([`FsDriver::run_closed_loop`]): 4 KiB random read and write at QD 1, at
//!    QD = queue size and at QD = 2 x queue size under each [`QueueFullPolicy`]; then 64 KiB and
//!    1 MiB sequential read and write at QD [`BenchConfig::seq_depth`].
//!
//! Each phase has a warm-up that is not recorded; latencies go into an HDR histogram (ns, 3
//! significant digits) from the moment a request is issued. [`render_table`], JSON (serde) and
//! [`plot::render_svg`] present a [`BenchReport`].
//!
//! Linux caps a virtio-fs request at `queue size - 4` pages (so it fits a ring without indirect
//! descriptors) and the driver model does too: with 128-entry queues a "1 MiB" operation goes
//! out as 496 KiB FUSE requests. The table shows the request size actually sent.
#![deny(missing_docs)]

pub mod copy;
pub mod crash;
pub mod keep_cost;
pub mod live_update;
pub mod multi;
mod nfs41_raw;
pub mod nfs_raw;
pub mod null;
pub mod pingpong;
pub mod plot;
mod render;
mod report;
pub mod sys;
pub mod wakeup;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use virtiofs_tools::driver::{
    DriverError, DriverOptions, FsDriver, IoDone, IoSpec, LoopConfig, LoopReport, QueueFullPolicy,
};
use virtiofs_tools::fuse_abi::{self as abi, opcode};

pub use render::{render_check, render_table};
use report::{combine_targets, median_row, targets};
pub use report::{BenchReport, Machine, Row, Setup, Target};

const ROOT: u64 = 1;
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Errors of a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The driver failed.
    #[error("driver")]
    Driver(#[from] DriverError),
    /// The in-process device did not start.
    #[error("cannot start the in-process device")]
    Device(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A local resource (temporary directory) failed.
    #[error("I/O")]
    Io(#[from] std::io::Error),
    /// The configuration cannot be run.
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// What serves the in-process device's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum Backend {
    /// The RAM filesystem (the daemon's backend).
    #[default]
    #[serde(rename = "ramfs")]
    RamFs,
    /// [`null::NullData`]: READ/WRITE answered at once without data.
    #[serde(rename = "null")]
    Null,
}

impl std::str::FromStr for Backend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ramfs" => Ok(Backend::RamFs),
            "null" => Ok(Backend::Null),
            _ => Err(format!("unknown backend {s:?} (ramfs or null)")),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Connect to a running daemon instead of starting the device in-process.
    pub socket_path: Option<PathBuf>,
    /// Backend of the in-process device.
    pub backend: Backend,
    /// Virtqueue size (device maximum in-process; the driver asks for it).
    pub queue_size: u16,
    /// Request queues.
    pub request_queues: u16,
    /// Pollers of the in-process device (1: one, on the poller core; more: one per core from
    /// core 0 up, at most one per core, each serving its share of the request queues; an
    /// NFSv4.1 export's pollers spread over the URL's addresses).
    pub pollers: usize,
    /// Measured time of each phase (after its warm-up).
    pub duration: Duration,
    /// Warm-up of each phase (time-based runs).
    pub warmup: Duration,
    /// Measured requests per phase instead of a duration (warm-up: a tenth as many more).
    pub ops: Option<u64>,
    /// Size of the test file.
    pub file_size: u64,
    /// Queue depth of the sequential-bandwidth phases.
    pub seq_depth: usize,
    /// The in-process device's `idle_spin_us` (the default keeps its poller spinning, as on a
    /// dedicated DPU core).
    pub idle_spin_us: u64,
    /// The in-process device's `polling = "busy"`: its poller never sleeps, nor blocks on a
    /// remote backend's socket while requests are on the wire (a DPU's dedicated core). The
    /// default is adaptive polling with `idle_spin_us`, which spins on empty rings but blocks on
    /// the NFS socket after a few empty rounds with requests pending there.
    pub busy_poll: bool,
    /// Pin the driver thread and the device poller to different cores (when there are two).
    pub pin: bool,
    /// The in-process device's `latency_histograms` (its per-class latency measurement).
    pub latency_histograms: bool,
    /// The in-process device's `inflight_tracking` (its split queues' in-flight records).
    pub inflight_tracking: bool,
    /// Length of the ping-pong measurement.
    pub floor_duration: Duration,
    /// Run only some phases: comma-separated filters, each a list of words that must all be
    /// words of the phase's label (e.g. `randread QD=1,refill` runs `4k randread QD=1` and both
    /// refill phases).
    pub only: Option<String>,
    /// How many times the whole list of phases runs (round 1 runs every phase, then round 2...).
    /// Each table figure is the median over the rounds and each target is judged on the median
    /// of its per-round values: on a shared machine one round hit by a stall of the host does
    /// not decide a ratio, and the spread between rounds shows how far the figures can be trusted.
    pub rounds: usize,
    /// Requests per variant of the adaptive-polling wake-up measurement ([`wakeup`]; in-process
    /// only; 0 skips it).
    pub wakeup_requests: usize,
    /// Serve this NFS export (`nfs://...`) from the in-process device instead of `backend`, add
    /// QD=16 phases, and run the raw NFS client's phases ([`nfs_raw`]) in every round.
    pub remote: Option<String>,
    /// With `remote`: the device's UNSTABLE store size instead of the backend's default, the
    /// raw client's bound too.
    pub nfs_unstable_bytes: Option<usize>,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            socket_path: None,
            backend: Backend::RamFs,
            queue_size: 128,
            request_queues: 1,
            pollers: 1,
            duration: Duration::from_secs(2),
            warmup: Duration::from_millis(300),
            ops: None,
            file_size: 64 << 20,
            seq_depth: 16,
            idle_spin_us: 10_000_000,
            busy_poll: false,
            pin: true,
            latency_histograms: true,
            inflight_tracking: false,
            floor_duration: Duration::from_secs(1),
            only: None,
            rounds: 1,
            wakeup_requests: 0,
            remote: None,
            nfs_unstable_bytes: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    Random,
    Sequential,
}

#[derive(Debug, Clone, Copy)]
struct Phase {
    write: bool,
    pattern: Pattern,
    block: usize,
    depth: usize,
    depth_label: &'static str,
    policy: Option<QueueFullPolicy>,
}

impl Phase {
    fn name(&self) -> String {
        let size = if self.block >= MIB {
            format!("{}M", self.block / MIB)
        } else {
            format!("{}k", self.block / KIB)
        };
        let kind = match self.pattern {
            Pattern::Random => "rand",
            Pattern::Sequential => "seq",
        };
        format!("{size} {kind}{}", if self.write { "write" } else { "read" })
    }
}

impl Phase {
    fn label(&self) -> String {
        format!(
            "{} QD={}{}",
            self.name(),
            self.depth,
            self.policy.map(|p| format!(" {p}")).unwrap_or_default()
        )
    }
}

fn selected(label: &str, filter: &str) -> bool {
    let words: Vec<&str> = label.split_whitespace().collect();
    filter.split(',').any(|f| {
        let f: Vec<&str> = f.split_whitespace().collect();
        !f.is_empty() && f.iter().all(|w| words.contains(w))
    })
}

fn phases(q: usize, seq_depth: usize) -> Vec<Phase> {
    let mut v = Vec::new();
    let rand = |write, depth, depth_label, policy| Phase {
        write,
        pattern: Pattern::Random,
        block: 4 * KIB,
        depth,
        depth_label,
        policy,
    };
    for write in [false, true] {
        v.push(rand(write, 1, "1", None));
    }
    for write in [false, true] {
        v.push(rand(write, q, "Q", None));
    }
    for write in [false, true] {
        for p in QueueFullPolicy::ALL {
            v.push(rand(write, 2 * q, "2Q", Some(p)));
        }
    }
    for block in [64 * KIB, MIB] {
        for write in [false, true] {
            v.push(Phase {
                write,
                pattern: Pattern::Sequential,
                block,
                depth: seq_depth,
                depth_label: "seq",
                policy: None,
            });
        }
    }
    v
}

/// Fraction -> microseconds at that quantile.
fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    // Evenly spaced in "nines" (-log10(1 - q)) from p50 to p99.99.
    let first = 2f64.log10();
    let steps = 74;
    (0..=steps)
        .map(|k| {
            let n = first + (4.0 - first) * k as f64 / steps as f64;
            let q = 1.0 - 10f64.powf(-n);
            (q * 100.0, us(h, q))
        })
        .collect()
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Lays out a closed-loop READ (or WRITE) of `size` bytes at `offset` of handle `fh` on `node`
/// in `s`, as every phase's requests are laid out.
pub(crate) fn rw_request(s: &mut IoSpec, node: u64, fh: u64, offset: u64, size: usize, write: bool) {
    s.nodeid = node;
    if write {
        s.opcode = opcode::WRITE;
        abi::WriteIn { fh, offset, size: size as u32, ..Default::default() }.encode_into(&mut s.args);
        s.in_data = size;
        s.out_args = abi::WriteOut::SIZE;
    } else {
        s.opcode = opcode::READ;
        abi::ReadIn { fh, offset, size: size as u32, ..Default::default() }.encode_into(&mut s.args);
        s.out_data = size;
    }
}

/// Checks the completion of a [`rw_request`] of `size` bytes: no FUSE error, every byte moved.
pub(crate) fn check_rw(c: &IoDone<'_>, size: usize, write: bool) -> Result<(), DriverError> {
    if c.errno != 0 {
        return Err(DriverError::Fuse { opcode: c.opcode, errno: c.errno });
    }
    let got = if write {
        let a = c.reply_args()?;
        abi::WriteOut::decode(&a).map(|w| w.size as usize).unwrap_or(0)
    } else {
        c.payload_len
    };
    if got != size {
        return Err(DriverError::BadReply {
            opcode: c.opcode,
            reason: format!("{got} bytes moved for a {size}-byte request"),
        });
    }
    Ok(())
}

/// On-CPU nanoseconds of this process's poller threads (named `poller-N`) so far.
fn poller_cpu_ns() -> Option<u64> {
    let mut total = 0;
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("poller-") {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

struct Bench<'a> {
    cfg: &'a BenchConfig,
    /// The in-process NFS device's filesystem (for its COMMIT counters).
    nfs: Option<NfsHandler>,
    in_process: bool,
    d: FsDriver,
    node: u64,
    fh: u64,
    max_request: usize,
    progress: &'a mut dyn FnMut(&str),
}

impl Bench<'_> {
    fn layout(&mut self) -> Result<(), BenchError> {
        let (e, o) = self.d.create(ROOT, BENCH_FILE, 0o644, libc::O_RDWR as u32)?;
        self.node = e.nodeid;
        self.fh = o.fh;
        let chunk: Vec<u8> = (0..self.max_request).map(|i| (i as u8).wrapping_mul(7)).collect();
        let mut off = 0u64;
        while off < self.cfg.file_size {
            let n = (self.cfg.file_size - off).min(chunk.len() as u64) as usize;
            let w = self.d.write(self.node, self.fh, off, &chunk[..n])?;
            if w as usize != n {
                return Err(BenchError::Config(format!("short write laying out the file at {off}")));
            }
            off += n as u64;
        }
        if self.cfg.remote.is_some() {
            // The layout committed now: the measured phases must not pay for the server's sync
            // of it (a background COMMIT of the UNSTABLE store still running into them).
            self.d.fsync(self.node, self.fh, false)?;
        }
        Ok(())
    }

    fn run_phase(&mut self, ph: &Phase, label: &str) -> Result<Row, BenchError> {
        if let Some(p) = ph.policy {
            self.d.set_queue_full(p);
        }
        let req = ph.block.min(self.max_request);
        let blocks = (self.cfg.file_size / req as u64).max(1);
        let mut cfg = LoopConfig::new(ph.depth, u64::MAX);
        cfg.max_data = req;
        match self.cfg.ops {
            Some(n) => {
                cfg.warmup_ops = (n / 10).max(1);
                cfg.total = n + cfg.warmup_ops;
            }
            None => {
                cfg.warmup = self.cfg.warmup;
                cfg.duration = Some(self.cfg.duration);
            }
        }
        let (node, fh, write, pattern) = (self.node, self.fh, ph.write, ph.pattern);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (ph.depth as u64) << 8 ^ u64::from(write);
        let make = |seq: u64, s: &mut IoSpec| {
            let block = match pattern {
                Pattern::Random => xorshift(&mut rng) % blocks,
                Pattern::Sequential => seq % blocks,
            };
            rw_request(s, node, fh, block * req as u64, req, write);
        };
        let started = Instant::now();
        let mut last_report = started;
        let mut done_count = 0u64;
        let progress = &mut *self.progress;
        let check = |c: &IoDone<'_>| -> Result<(), DriverError> {
            check_rw(c, req, write)?;
            done_count += 1;
            if done_count.is_multiple_of(4096) && last_report.elapsed() >= Duration::from_millis(500) {
                last_report = Instant::now();
                progress(&format!("{label} {:.1} s, {done_count} requests", started.elapsed().as_secs_f64()));
            }
            Ok(())
        };
        let nfs_stats = || self.nfs.as_ref().map(|h| h.server().filesystem().stats().unstable);
        let background_before = nfs_stats().map(|u| u.background_commits);
        let cpu_before = self.in_process.then(poller_cpu_ns).flatten();
        let r: LoopReport = self.d.run_closed_loop(&cfg, make, check)?;
        let cpu = cpu_before.zip(poller_cpu_ns()).map(|(a, b)| b.saturating_sub(a));
        // A write phase on an NFS export ends with an FSYNC (a COMMIT of what the UNSTABLE store
        // holds), timed into the phase, as the raw client's final COMMIT is (`nfs_raw`).
        let (mut commits, mut sync_time) = (None, Duration::ZERO);
        if write && self.cfg.remote.is_some() {
            let stored = nfs_stats().is_none_or(|u| u.bytes_now > 0);
            let t = Instant::now();
            self.d.fsync(self.node, self.fh, false)?;
            sync_time = t.elapsed();
            let background = background_before.zip(nfs_stats()).map(|(a, u)| u.background_commits - a);
            commits = background.map(|b| b + u64::from(stored));
        }
        let secs = (r.measured_time + sync_time).as_secs_f64();
        let per_sec = |n: f64| if secs > 0.0 { n / secs } else { 0.0 };
        let h = &r.histogram;
        Ok(Row {
            workload: ph.name(),
            block: ph.block,
            request_bytes: req,
            depth: ph.depth,
            depth_label: ph.depth_label.to_string(),
            policy: ph.policy,
            ops: r.measured,
            p50_us: us(h, 0.5),
            p99_us: us(h, 0.99),
            p999_us: us(h, 0.999),
            max_us: h.max() as f64 / 1000.0,
            iops: per_sec(r.measured as f64),
            mib_s: per_sec(r.measured_bytes as f64) / MIB as f64,
            parked: r.parked,
            retry_timer_fires: r.retry_timer_fires,
            poller_cpu_us_per_op: cpu.map(|ns| ns as f64 / 1000.0 / r.completed.max(1) as f64),
            commits,
            curve: curve(h),
        })
    }
}

fn pin(core: Option<usize>) {
    if let Some(c) = core {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
            log::warn!("cannot pin the driver thread to core {c}");
        }
    }
}

/// The in-process NFS device's handler (for its COMMIT counters).
type NfsHandler = Arc<virtiofs_dpu::FuseHandler<virtiofs_backend::nfs::fs::NfsFs>>;

/// The device the benchmark drives: in-process (started here) or an external daemon.
struct DeviceUnderTest {
    /// The in-process device (`None`: an external daemon).
    device: Option<virtiofs_dpu::RunningDevice>,
    socket: PathBuf,
    /// What [`Setup::device`] says of it.
    what: String,
    nfs: Option<NfsHandler>,
    /// The device's UNSTABLE store size, which the raw client's writes keep to.
    unstable_bytes: usize,
}

/// The device's profile as `cfg` asks.
fn profile_of(cfg: &BenchConfig) -> virtiofs_dpu::config::Profile {
    virtiofs_dpu::config::Profile {
        description: "virtiofs-bench".into(),
        request_queues: cfg.request_queues,
        queue_size: cfg.queue_size,
        idle_spin_us: cfg.idle_spin_us,
        polling: if cfg.busy_poll {
            virtiofs_dpu::config::Polling::Busy
        } else {
            virtiofs_dpu::config::Polling::Adaptive
        },
        latency_histograms: cfg.latency_histograms,
        inflight_tracking: cfg.inflight_tracking,
        ..Default::default()
    }
}

/// Starts the in-process device `cfg` asks for on a socket in `dir` (its pollers on
/// `poller_core`), or names the external daemon's socket.
fn start_device(
    cfg: &BenchConfig,
    profile: &mut virtiofs_dpu::config::Profile,
    poller_core: Option<usize>,
    dir: &std::path::Path,
) -> Result<DeviceUnderTest, BenchError> {
    // An external daemon's UNSTABLE store size is taken to be the default.
    let mut unstable_bytes =
        cfg.nfs_unstable_bytes.unwrap_or(virtiofs_backend::nfs::fs::NfsOptions::UNSTABLE_BYTES);
    if let Some(p) = &cfg.socket_path {
        let what = format!("external daemon at {}", p.display());
        return Ok(DeviceUnderTest { device: None, socket: p.clone(), what, nfs: None, unstable_bytes });
    }
    profile.poller_cores =
        if cfg.pollers > 1 { (0..cfg.pollers).collect() } else { poller_core.into_iter().collect() };
    profile.validate().map_err(|e| BenchError::Config(e.to_string()))?;
    let sock = dir.join("virtiofs.sock");
    let mut nfs = None;
    let (dev, what) = match (&cfg.remote, cfg.backend) {
        (Some(url), _) => {
            let keys = virtiofs_dpu::settings::FunctionKeys::default();
            let mut opts = virtiofs_dpu::settings::nfs_options(url, &keys)
                .map_err(|e| BenchError::Device(Box::new(e)))?;
            if let Some(b) = cfg.nfs_unstable_bytes {
                opts.unstable_bytes = b;
            }
            // Both versions write UNSTABLE through the store: the raw client keeps the same bound.
            unstable_bytes = opts.unstable_bytes;
            let fs = virtiofs_backend::nfs::fs::NfsFs::connect(opts)
                .map_err(|e| BenchError::Device(Box::new(e)))?;
            let handler = Arc::new(virtiofs_dpu::FuseHandler::new(fs));
            nfs = Some(handler.clone());
            (virtiofs_dpu::RunningDevice::start_with(&sock, profile.clone(), handler), "NFS export")
        }
        (None, Backend::RamFs) => (
            virtiofs_dpu::RunningDevice::start_with(
                &sock,
                profile.clone(),
                Arc::new(virtiofs_dpu::FuseHandler::new(virtiofs_backend::RamFs::new())),
            ),
            "RAM filesystem",
        ),
        (None, Backend::Null) => (
            virtiofs_dpu::RunningDevice::start_with(&sock, profile.clone(), Arc::new(null::NullData::new())),
            "null-data backend (READ/WRITE answered without data)",
        ),
    };
    let dev = dev.map_err(|e| BenchError::Device(Box::new(e)))?;
    Ok(DeviceUnderTest {
        device: Some(dev),
        socket: sock,
        what: format!("in-process, {what}"),
        nfs,
        unstable_bytes,
    })
}

/// The phases to run (queue size `q`), and with a remote export the raw NFS client's phases and
/// the client (its requests at most `max_request` bytes).
#[allow(clippy::type_complexity)]
fn plan(
    cfg: &BenchConfig,
    q: usize,
    max_request: usize,
    unstable_bytes: usize,
) -> Result<(Vec<Phase>, Vec<nfs_raw::RawPhase>, Option<nfs_raw::RawClient>), BenchError> {
    let mut list = phases(q, cfg.seq_depth);
    let mut raw_list = Vec::new();
    let mut raw = None;
    if let Some(url) = &cfg.remote {
        // The NFS targets' depth beside Q and 2Q.
        for write in [true, false] {
            let p = Phase {
                write,
                pattern: Pattern::Random,
                block: 4 * KIB,
                depth: NFS_QD,
                depth_label: "16",
                policy: None,
            };
            list.insert(2, p);
        }
        // 1 MiB calls the size of the device's requests (capped by max_pages), for a fair ratio.
        raw_list = raw_phases(cfg.seq_depth, max_request.min(MIB));
        let depth = raw_list.iter().map(|p| p.depth).max().unwrap_or(1);
        raw = Some(nfs_raw::RawClient::new(url, BENCH_FILE, depth, MIB, unstable_bytes)?);
    }
    if let Some(o) = &cfg.only {
        list.retain(|p| selected(&p.label(), o));
        raw_list.retain(|p| selected(&format!("{} QD={}", p.name(), p.depth_label), o));
    }
    Ok((list, raw_list, raw))
}

/// Runs the raw client's phase `j` of `raw_list` into `raw_rows[j]` (nothing without a client).
fn run_raw(
    b: &mut Bench<'_>,
    raw: Option<&mut nfs_raw::RawClient>,
    raw_list: &[nfs_raw::RawPhase],
    j: usize,
    round: usize,
    raw_rows: &mut [Option<Row>],
) -> Result<(), BenchError> {
    let (Some(r), ph) = (raw, &raw_list[j]) else { return Ok(()) };
    let cfg = b.cfg;
    let rounds = cfg.rounds.max(1);
    (b.progress)(&format!("[round {}/{rounds}, raw {}/{}] {}", round + 1, j + 1, raw_list.len(), ph.name()));
    let (row, st) = r.run(ph, cfg.file_size, cfg.warmup, cfg.duration, cfg.ops)?;
    if ph.write {
        (b.progress)(&format!(
            "  {} COMMITs (final {:.1} ms), {} waited for room, {} FILE_SYNC",
            st.commits,
            st.final_commit.as_secs_f64() * 1000.0,
            st.waited,
            st.full
        ));
    }
    raw_rows[j] = Some(row);
    Ok(())
}

/// Every round of the device's phases `list` and the raw client's `raw_list`: the rows of
/// each round, device phases first, then raw ones.
fn run_rounds(
    b: &mut Bench<'_>,
    list: &[Phase],
    raw_list: &[nfs_raw::RawPhase],
    mut raw: Option<&mut nfs_raw::RawClient>,
) -> Result<Vec<Vec<Row>>, BenchError> {
    let rounds = b.cfg.rounds.max(1);
    let mut round_rows = Vec::with_capacity(rounds);
    // Each raw phase runs right after the device phase it is compared with (same workload and
    // depth), so the two sides of a target are measured seconds apart rather than a round apart,
    // while the machine's load drifts; raw phases with no device counterpart run last. The rows
    // keep their order: device phases, then raw ones.
    let pair: Vec<Option<usize>> = raw_list
        .iter()
        .map(|rp| {
            list.iter().position(|ph| {
                format!("raw NFS {}", ph.name()) == rp.name() && ph.depth_label == rp.depth_label
            })
        })
        .collect();
    for round in 0..rounds {
        let mut rows = Vec::with_capacity(list.len());
        let mut raw_rows: Vec<Option<Row>> = vec![None; raw_list.len()];
        for (i, ph) in list.iter().enumerate() {
            let label = if rounds > 1 {
                format!("[round {}/{rounds}, {}/{}] {}", round + 1, i + 1, list.len(), ph.label())
            } else {
                format!("[{}/{}] {}", i + 1, list.len(), ph.label())
            };
            (b.progress)(&label);
            rows.push(b.run_phase(ph, &label)?);
            for j in (0..raw_list.len()).filter(|&j| pair[j] == Some(i)) {
                run_raw(b, raw.as_deref_mut(), raw_list, j, round, &mut raw_rows)?;
            }
        }
        for j in (0..raw_list.len()).filter(|&j| pair[j].is_none()) {
            run_raw(b, raw.as_deref_mut(), raw_list, j, round, &mut raw_rows)?;
        }
        rows.extend(raw_rows.into_iter().flatten());
        round_rows.push(rows);
    }
    Ok(round_rows)
}

/// Runs the benchmark. `progress` gets one line per phase and more during long phases. With
/// [`BenchConfig::pin`], the calling thread is pinned to core 0 for good.
pub fn run(cfg: &BenchConfig, progress: &mut dyn FnMut(&str)) -> Result<BenchReport, BenchError> {
    let wall = Instant::now();
    if cfg.queue_size < 2 || !cfg.queue_size.is_power_of_two() {
        return Err(BenchError::Config(format!("queue size {} is not a power of two >= 2", cfg.queue_size)));
    }
    let machine = Machine::probe();
    let (driver_core, poller_core) =
        if cfg.pin && machine.nproc >= 2 { (Some(0), Some(machine.nproc - 1)) } else { (None, None) };
    pin(driver_core);

    progress("floor: shared-memory ping-pong");
    let floor = pingpong::measure(cfg.floor_duration, poller_core);
    progress("floor: random 4 KiB copy");
    let copy = copy::measure(cfg.file_size, cfg.floor_duration, poller_core);

    let dir = tempfile::tempdir()?;
    let mut profile = profile_of(cfg);
    let DeviceUnderTest { device, socket, what, nfs: nfs_handler, unstable_bytes } =
        start_device(cfg, &mut profile, poller_core, dir.path())?;
    let opts = DriverOptions {
        queue_size: cfg.queue_size,
        request_queues: cfg.request_queues,
        spread_requests: true,
        mem_size: 64 * MIB + 2 * usize::from(cfg.queue_size) * 8 * KIB + cfg.seq_depth * MIB,
        ..Default::default()
    };
    progress("bring-up and file layout");
    let mut d = FsDriver::connect(&socket, opts)?;
    let init = d.init()?;
    let q = d.queue_size(1);
    let max_request =
        (init.max_write as usize).min(usize::from(init.max_pages) * virtiofs_tools::driver::PAGE_SIZE);
    let setup = Setup {
        device: what,
        queue_size: q,
        request_queues: d.request_queues(),
        idle_spin_us: device.as_ref().map(|_| profile.idle_spin_us),
        idle_sleep_us: device.as_ref().map(|_| profile.idle_sleep_us),
        busy_poll: device.as_ref().map(|_| cfg.busy_poll),
        poller_core: device.as_ref().and(poller_core),
        driver_core,
        max_request,
        per_phase: match cfg.ops {
            Some(n) => format!("{n} requests (+{} warm-up)", (n / 10).max(1)),
            None => {
                format!("{:.1} s (+{:.1} s warm-up)", cfg.duration.as_secs_f64(), cfg.warmup.as_secs_f64())
            }
        },
        rounds: cfg.rounds.max(1),
    };
    let mut b = Bench {
        cfg,
        nfs: nfs_handler.clone(),
        in_process: device.is_some(),
        d,
        node: 0,
        fh: 0,
        max_request,
        progress,
    };
    b.layout()?;
    let (list, raw_list, mut raw) = plan(cfg, usize::from(q), max_request, unstable_bytes)?;
    let round_rows = run_rounds(&mut b, &list, &raw_list, raw.as_mut())?;
    let per_round = round_rows.first().map_or(0, Vec::len);
    let rows: Vec<Row> = (0..per_round).map(|i| median_row(round_rows.iter().map(|r| &r[i]))).collect();
    drop(raw);
    let Bench { d, node, fh, .. } = b;
    let mut d = d;
    d.release(node, fh)?;
    d.shutdown()?;
    let in_process = device.is_some();
    let poller_waits = device.as_ref().map(|dev| {
        let st = dev.stats();
        (st.pollers.iter().map(|p| p.engine_waits).sum(), st.pollers.iter().map(|p| p.parks).sum())
    });
    if let Some(dev) = device {
        dev.stop().map_err(|e| BenchError::Device(Box::new(e)))?;
    }
    let mut wake = Vec::new();
    if in_process && cfg.wakeup_requests > 0 {
        progress("wake-up cost of adaptive polling (busy / timer / doorbell)");
        let wcfg = wakeup::WakeupConfig {
            requests: cfg.wakeup_requests,
            gap: Duration::from_millis(1),
            idle_spin_us: 50,
            idle_sleep_us: 200,
            poller_core,
        };
        wake = wakeup::measure(&wcfg, dir.path())?;
    }
    let qd1 = rows.iter().find(|r| r.workload == "4k randread" && r.depth == 1).map(|r| r.p50_us);
    let ratio = qd1.map(|p| p * 1000.0 / floor.p50_ns).unwrap_or(0.0);
    let ratio_copy = qd1.map(|p| p * 1000.0 / (floor.p50_ns + copy.p50_ns)).unwrap_or(0.0);
    let per_round: Vec<Vec<Target>> = round_rows.iter().map(|r| targets(r, &floor, &copy)).collect();
    let targets = combine_targets(&per_round);
    Ok(BenchReport {
        machine,
        setup,
        floor,
        copy,
        rows,
        qd1_read_p50_over_floor: ratio,
        qd1_read_p50_over_floor_and_copy: ratio_copy,
        targets,
        round_rows,
        wakeup: wake,
        nfs: nfs_handler.map(|h| h.server().filesystem().stats()),
        poller_waits,
        wall_s: wall.elapsed().as_secs_f64(),
    })
}

/// The NFS targets' queue depth.
const NFS_QD: usize = 16;
/// The file the phases read and write.
const BENCH_FILE: &str = "virtiofs-bench.dat";

/// The raw NFS client's phases: 4k random at QD=1 and QD=16, 1 MiB sequential.
fn raw_phases(seq_depth: usize, seq_block: usize) -> Vec<nfs_raw::RawPhase> {
    let p = |write, sequential, block, depth, depth_label| nfs_raw::RawPhase {
        write,
        sequential,
        block,
        depth,
        depth_label,
    };
    vec![
        p(false, false, 4 * KIB, 1, "1"),
        p(true, false, 4 * KIB, 1, "1"),
        p(false, false, 4 * KIB, NFS_QD, "16"),
        p(true, false, 4 * KIB, NFS_QD, "16"),
        p(false, true, seq_block, seq_depth, "seq"),
        p(true, true, seq_block, seq_depth, "seq"),
    ]
}

#[cfg(test)]
mod tests;
