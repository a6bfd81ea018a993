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
pub mod multi;
pub mod nfs_raw;
pub mod null;
pub mod pingpong;
pub mod plot;
pub mod sys;
pub mod wakeup;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use virtiofs_tools::driver::{
    DriverError, DriverOptions, FsDriver, IoSpec, LoopConfig, LoopReport, QueueFullPolicy,
};
use virtiofs_tools::fuse_abi::{self as abi, opcode};

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
            duration: Duration::from_secs(2),
            warmup: Duration::from_millis(300),
            ops: None,
            file_size: 64 << 20,
            seq_depth: 16,
            idle_spin_us: 10_000_000,
            busy_poll: false,
            pin: true,
            latency_histograms: true,
            floor_duration: Duration::from_secs(1),
            only: None,
            rounds: 1,
            wakeup_requests: 0,
            remote: None,
            nfs_unstable_bytes: None,
        }
    }
}

/// The machine the run was on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Logical CPUs available to the process.
    pub nproc: usize,
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// Whether /proc/cpuinfo shows the `hypervisor` flag (a virtual machine).
    pub virtual_machine: bool,
    /// /proc/loadavg when the run started (other load on the machine).
    pub loadavg_at_start: String,
}

impl Machine {
    /// Reads the machine's description from /proc.
    pub fn probe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        };
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default().trim().to_string();
        Machine {
            nproc: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            cpu_model: field("model name").unwrap_or_else(|| "unknown".into()),
            kernel: read("/proc/sys/kernel/osrelease"),
            virtual_machine: field("flags").is_some_and(|f| f.split_whitespace().any(|x| x == "hypervisor")),
            loadavg_at_start: read("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        }
    }
}

/// How the device under test ran.
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    /// `in-process (RAM filesystem)` or `external daemon at PATH`.
    pub device: String,
    /// Queue size in use.
    pub queue_size: u16,
    /// Request queues in use.
    pub request_queues: u16,
    /// The in-process poller's `idle_spin_us` (None: external daemon, unknown).
    pub idle_spin_us: Option<u64>,
    /// The in-process poller's `idle_sleep_us`.
    pub idle_sleep_us: Option<u64>,
    /// The in-process poller busy-polls (`polling = "busy"`; None: external daemon, unknown).
    pub busy_poll: Option<bool>,
    /// Core the device poller is pinned to.
    pub poller_core: Option<usize>,
    /// Core the driver thread is pinned to.
    pub driver_core: Option<usize>,
    /// Negotiated `max_write` (largest request payload).
    pub max_request: usize,
    /// Measured time per phase (s), or measured requests per phase.
    pub per_phase: String,
    /// Rounds of the phase list (every figure in `rows` is a median over them).
    pub rounds: usize,
}

/// One line of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Workload name (`4k randread`, `64k seqwrite`, ...).
    pub workload: String,
    /// Operation size the application asked for.
    pub block: usize,
    /// FUSE request size actually sent (smaller when capped by max_pages).
    pub request_bytes: usize,
    /// Requests kept outstanding.
    pub depth: usize,
    /// `1`, `Q` or `2Q`.
    pub depth_label: String,
    /// Queue-full policy in force (None where the queue never fills).
    pub policy: Option<QueueFullPolicy>,
    /// Measured requests.
    pub ops: u64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// 99.9th percentile, microseconds.
    pub p999_us: f64,
    /// Largest latency, microseconds.
    pub max_us: f64,
    /// Requests per second.
    pub iops: f64,
    /// Payload MiB per second.
    pub mib_s: f64,
    /// Requests that found the ring full.
    pub parked: u64,
    /// Expired 1 ms retry timers.
    pub retry_timer_fires: u64,
    /// On-CPU time of the in-process device's pollers over the phase (warm-up included) per
    /// request completed, microseconds (from the kernel's per-thread schedstat; `None` for an
    /// external daemon and the raw NFS client). A poller that spins while requests are on the
    /// wire shows the whole phase here; one that blocks shows its work.
    pub poller_cpu_us_per_op: Option<f64>,
    /// NFS write phases (`--remote`): COMMITs sent in the phase (summed over rounds in the
    /// medians' row): the device's background COMMITs plus its FSYNC's at the end, or the raw
    /// client's (`nfs_raw`); `None` elsewhere.
    pub commits: Option<u64>,
    /// (percentile, microseconds) from p50 to p99.99, for the plot.
    pub curve: Vec<(f64, f64)>,
}

/// A target of the issue, checked against this run.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The measured value.
    pub value: f64,
    /// The limit it must not exceed.
    pub limit: f64,
    /// Unit of both.
    pub unit: String,
    /// value <= limit.
    pub met: bool,
    /// The value in each round (`value` is their median).
    pub per_round: Vec<f64>,
    /// Rounds in which the value was within the limit.
    pub rounds_met: usize,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The machine.
    pub machine: Machine,
    /// The device and driver setup.
    pub setup: Setup,
    /// The ping-pong floor.
    pub floor: pingpong::Floor,
    /// A random 4 KiB copy out of a buffer the size of the test file, measured in the same run.
    pub copy: copy::CopyCost,
    /// The table.
    pub rows: Vec<Row>,
    /// QD=1 4k randread p50 as a multiple of the floor's p50.
    pub qd1_read_p50_over_floor: f64,
    /// QD=1 4k randread p50 as a multiple of (ping-pong p50 + copy p50).
    pub qd1_read_p50_over_floor_and_copy: f64,
    /// The targets (judged on the median of the per-round values).
    pub targets: Vec<Target>,
    /// Each round's own rows, in phase order (`rows` holds their medians).
    pub round_rows: Vec<Vec<Row>>,
    /// What a request after an idle spell pays for waking an adaptive poller (empty if skipped).
    pub wakeup: Vec<wakeup::WakeRow>,
    /// The NFS backend's counters at the end (`--remote`, in-process device): its calls, the
    /// UNSTABLE store's background COMMITs, waits and high-water mark.
    #[serde(default)]
    pub nfs: Option<virtiofs_backend::nfs::fs::NfsStats>,
    /// Times the in-process device's pollers blocked on their engine's readiness instead of
    /// polling for requests pending there, and times they parked (all phases).
    #[serde(default)]
    pub poller_waits: Option<(u64, u64)>,
    /// Wall time of the whole run, seconds.
    pub wall_s: f64,
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
    nfs: Option<Arc<virtiofs_dpu::FuseHandler<virtiofs_backend::nfs::fs::NfsFs>>>,
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
            let offset = block * req as u64;
            s.nodeid = node;
            if write {
                s.opcode = opcode::WRITE;
                abi::WriteIn { fh, offset, size: req as u32, ..Default::default() }.encode_into(&mut s.args);
                s.in_data = req;
                s.out_args = abi::WriteOut::SIZE;
            } else {
                s.opcode = opcode::READ;
                abi::ReadIn { fh, offset, size: req as u32, ..Default::default() }.encode_into(&mut s.args);
                s.out_data = req;
            }
        };
        let started = Instant::now();
        let mut last_report = started;
        let mut done_count = 0u64;
        let progress = &mut *self.progress;
        let check = |c: &virtiofs_tools::driver::IoDone<'_>| -> Result<(), DriverError> {
            if c.errno != 0 {
                return Err(DriverError::Fuse { opcode: c.opcode, errno: c.errno });
            }
            let got = if write {
                let a = c.reply_args()?;
                abi::WriteOut::decode(&a).map(|w| w.size as usize).unwrap_or(0)
            } else {
                c.payload_len
            };
            if got != req {
                return Err(DriverError::BadReply {
                    opcode: c.opcode,
                    reason: format!("{got} bytes moved for a {req}-byte request"),
                });
            }
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
    let mut profile = virtiofs_dpu::config::Profile {
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
        ..Default::default()
    };
    let mut nfs_handler = None;
    // The device's UNSTABLE store size, which the raw client's writes keep to (an external
    // daemon: the default).
    let mut unstable_bytes =
        cfg.nfs_unstable_bytes.unwrap_or(virtiofs_backend::nfs::fs::NfsOptions::UNSTABLE_BYTES);
    let (device, socket, setup_device) = match &cfg.socket_path {
        Some(p) => (None, p.clone(), format!("external daemon at {}", p.display())),
        None => {
            profile.poller_cores = poller_core.into_iter().collect();
            profile.validate().map_err(|e| BenchError::Config(e.to_string()))?;
            let sock = dir.path().join("virtiofs.sock");
            let (dev, what) = match (&cfg.remote, cfg.backend) {
                (Some(url), _) => {
                    let keys = virtiofs_dpu::settings::FunctionKeys::default();
                    let mut opts = virtiofs_dpu::settings::nfs_options(url, &keys)
                        .map_err(|e| BenchError::Device(Box::new(e)))?;
                    if let Some(b) = cfg.nfs_unstable_bytes {
                        opts.unstable_bytes = b;
                    }
                    unstable_bytes = opts.unstable_bytes;
                    let fs = virtiofs_backend::nfs::fs::NfsFs::connect(opts)
                        .map_err(|e| BenchError::Device(Box::new(e)))?;
                    let handler = Arc::new(virtiofs_dpu::FuseHandler::new(fs));
                    nfs_handler = Some(handler.clone());
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
                    virtiofs_dpu::RunningDevice::start_with(
                        &sock,
                        profile.clone(),
                        Arc::new(null::NullData::new()),
                    ),
                    "null-data backend (READ/WRITE answered without data)",
                ),
            };
            let dev = dev.map_err(|e| BenchError::Device(Box::new(e)))?;
            (Some(dev), sock, format!("in-process, {what}"))
        }
    };
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
        device: setup_device,
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
    let mut list = phases(usize::from(q), cfg.seq_depth);
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
    let rounds = cfg.rounds.max(1);
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
        let mut run_raw =
            |b: &mut Bench<'_>, j: usize, raw_rows: &mut Vec<Option<Row>>| -> Result<(), BenchError> {
                let (Some(r), ph) = (raw.as_mut(), &raw_list[j]) else { return Ok(()) };
                (b.progress)(&format!(
                    "[round {}/{rounds}, raw {}/{}] {}",
                    round + 1,
                    j + 1,
                    raw_list.len(),
                    ph.name()
                ));
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
            };
        for (i, ph) in list.iter().enumerate() {
            let label = if rounds > 1 {
                format!("[round {}/{rounds}, {}/{}] {}", round + 1, i + 1, list.len(), ph.label())
            } else {
                format!("[{}/{}] {}", i + 1, list.len(), ph.label())
            };
            (b.progress)(&label);
            rows.push(b.run_phase(ph, &label)?);
            for j in (0..raw_list.len()).filter(|&j| pair[j] == Some(i)) {
                run_raw(&mut b, j, &mut raw_rows)?;
            }
        }
        for j in (0..raw_list.len()).filter(|&j| pair[j].is_none()) {
            run_raw(&mut b, j, &mut raw_rows)?;
        }
        rows.extend(raw_rows.into_iter().flatten());
        round_rows.push(rows);
    }
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

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One row from the same phase's rows of every round: medians of the percentiles, IOPS and
/// bandwidth, the largest max, summed counts, and the curve of the round whose p99.9 is the median
/// (lower middle for an even count), so the plot shows a round that happened.
fn median_row<'a>(rounds: impl Iterator<Item = &'a Row> + Clone) -> Row {
    let pick = |f: fn(&Row) -> f64| median(rounds.clone().map(f).collect());
    let mut by_tail: Vec<&Row> = rounds.clone().collect();
    by_tail.sort_by(|a, b| a.p999_us.total_cmp(&b.p999_us));
    let middle = by_tail[(by_tail.len() - 1) / 2];
    Row {
        ops: rounds.clone().map(|r| r.ops).sum(),
        p50_us: pick(|r| r.p50_us),
        p99_us: pick(|r| r.p99_us),
        p999_us: pick(|r| r.p999_us),
        max_us: rounds.clone().map(|r| r.max_us).fold(0.0, f64::max),
        iops: pick(|r| r.iops),
        mib_s: pick(|r| r.mib_s),
        parked: rounds.clone().map(|r| r.parked).sum(),
        retry_timer_fires: rounds.clone().map(|r| r.retry_timer_fires).sum(),
        poller_cpu_us_per_op: rounds
            .clone()
            .map(|r| r.poller_cpu_us_per_op)
            .collect::<Option<Vec<f64>>>()
            .map(median),
        commits: rounds.clone().map(|r| r.commits).sum(),
        ..middle.clone()
    }
}

/// The targets of every round, judged on the median of their per-round values.
fn combine_targets(per_round: &[Vec<Target>]) -> Vec<Target> {
    let Some(first) = per_round.first() else { return Vec::new() };
    first
        .iter()
        .map(|t| {
            let values: Vec<f64> = per_round
                .iter()
                .filter_map(|r| r.iter().find(|x| x.name == t.name).map(|x| x.value))
                .collect();
            let value = median(values.clone());
            Target {
                name: t.name.clone(),
                value,
                limit: t.limit,
                unit: t.unit.clone(),
                met: value <= t.limit,
                rounds_met: values.iter().filter(|v| **v <= t.limit).count(),
                per_round: values,
            }
        })
        .collect()
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

/// The NFS targets: device cost at QD=1 (p50 through the device minus the raw
/// client's), QD=16 4k read IOPS and 1 MiB sequential bandwidth as raw over device.
fn nfs_targets(rows: &[Row]) -> Vec<Target> {
    let find = |w: &str, label: &str| {
        rows.iter().find(|r| r.workload == w && r.depth_label == label && r.policy.is_none())
    };
    let t = |name: String, value: f64, limit: f64, unit: &str| Target {
        name,
        value,
        limit,
        unit: unit.into(),
        met: value <= limit,
        per_round: vec![value],
        rounds_met: usize::from(value <= limit),
    };
    let mut v = Vec::new();
    for kind in ["read", "write"] {
        if let (Some(d), Some(r)) =
            (find(&format!("4k rand{kind}"), "1"), find(&format!("raw NFS 4k rand{kind}"), "1"))
        {
            v.push(t(format!("NFS QD=1 4k {kind} p50: device - raw client"), d.p50_us - r.p50_us, 2.0, "us"));
        }
    }
    if let (Some(d), Some(r)) = (find("4k randread", "16"), find("raw NFS 4k randread", "16")) {
        v.push(t(
            "NFS QD=16 4k read IOPS: raw client / device".into(),
            r.iops / d.iops.max(1e-9),
            1.0 / 0.9,
            "x",
        ));
    }
    for kind in ["read", "write"] {
        if let (Some(d), Some(r)) =
            (find(&format!("1M seq{kind}"), "seq"), find(&format!("raw NFS 1M seq{kind}"), "seq"))
        {
            v.push(t(
                format!("NFS 1 MiB seq{kind} MiB/s: raw client / device"),
                r.mib_s / d.mib_s.max(1e-9),
                1.0 / 0.8,
                "x",
            ));
        }
    }
    v
}

fn targets(rows: &[Row], floor: &pingpong::Floor, copy: &copy::CopyCost) -> Vec<Target> {
    let find = |w: &str, label: &str, p: Option<QueueFullPolicy>| {
        rows.iter().find(|r| r.workload == w && r.depth_label == label && r.policy == p)
    };
    let t = |name: String, value: f64, limit: f64, unit: &str| Target {
        name,
        value,
        limit,
        unit: unit.into(),
        met: value <= limit,
        per_round: vec![value],
        rounds_met: usize::from(value <= limit),
    };
    let mut v = nfs_targets(rows);
    if let Some(r) = find("4k randread", "1", None) {
        v.push(t("QD=1 4k read p50 / ping-pong p50".into(), r.p50_us * 1000.0 / floor.p50_ns, 5.0, "x"));
        v.push(t(
            "QD=1 4k read p50 / (ping-pong + 4 KiB copy) p50".into(),
            r.p50_us * 1000.0 / (floor.p50_ns + copy.p50_ns),
            2.0,
            "x",
        ));
        v.push(t("QD=1 4k read p99.9".into(), r.p999_us, 40.0, "us"));
    }
    for w in ["4k randread", "4k randwrite"] {
        let retry = find(w, "2Q", Some(QueueFullPolicy::Retry1ms));
        let refill = find(w, "2Q", Some(QueueFullPolicy::Refill));
        let full = find(w, "Q", None);
        if let (Some(a), Some(b)) = (retry, refill) {
            v.push(t(
                format!("{w} QD=2Q p99.9 refill / retry-1ms"),
                b.p999_us / a.p999_us.max(1e-9),
                1.0 / 60.0,
                "x",
            ));
        }
        if let (Some(b), Some(f)) = (refill, full) {
            v.push(t(format!("{w} p99.9 refill QD=2Q / QD=Q"), b.p999_us / f.p999_us.max(1e-9), 3.0, "x"));
        }
    }
    v
}

fn fmt_us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}", v)
    } else if v >= 100.0 {
        format!("{:.1}", v)
    } else {
        format!("{:.2}", v)
    }
}

fn size(b: usize) -> String {
    if b >= MIB && b.is_multiple_of(MIB) {
        format!("{}M", b / MIB)
    } else {
        format!("{}K", b / KIB)
    }
}

/// The human-readable report: header (machine, setup, floor), the table, the targets.
pub fn render_table(r: &BenchReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let m = &r.machine;
    let st = &r.setup;
    let _ = writeln!(
        s,
        "machine: {} x {} ({}), Linux {}, load average at start {}",
        m.nproc,
        m.cpu_model,
        if m.virtual_machine { "virtual machine" } else { "bare metal" },
        m.kernel,
        m.loadavg_at_start
    );
    let _ = writeln!(
        s,
        "device:  {}, queue size {}, {} request queue(s), max request {}",
        st.device,
        st.queue_size,
        st.request_queues,
        size(st.max_request)
    );
    match (st.idle_spin_us, st.idle_sleep_us, st.busy_poll) {
        (Some(_), Some(_), Some(true)) => {
            let _ = writeln!(
                s,
                "poller:  busy (never sleeps, nor blocks on a remote backend: a dedicated core), poller core {}, \
                 driver core {}",
                st.poller_core.map(|c| c.to_string()).unwrap_or_else(|| "unpinned".into()),
                st.driver_core.map(|c| c.to_string()).unwrap_or_else(|| "unpinned".into()),
            );
        }
        (Some(spin), Some(sleep), _) => {
            let _ = writeln!(
                s,
                "poller:  idle_spin_us={spin} idle_sleep_us={sleep} (adaptive: spins {:.0} s on empty rings before \
                 it would park; blocks on a remote backend while its requests are out), poller core {}, driver \
                 core {}",
                spin as f64 / 1e6,
                st.poller_core.map(|c| c.to_string()).unwrap_or_else(|| "unpinned".into()),
                st.driver_core.map(|c| c.to_string()).unwrap_or_else(|| "unpinned".into()),
            );
        }
        _ => {
            let _ = writeln!(s, "poller:  external daemon, its own profile");
        }
    }
    let _ = writeln!(
        s,
        "floor:   shared-memory ping-pong round trip p50 {:.3} us, p99 {:.3} us ({} round trips)",
        r.floor.p50_ns / 1000.0,
        r.floor.p99_ns / 1000.0,
        r.floor.round_trips
    );
    let _ = writeln!(
        s,
        "noise:   ping-pong p99.9 {:.1} us, max {:.0} us, {:.0} stalls/s over {} us (a thread lost its core)",
        r.floor.p999_ns / 1000.0,
        r.floor.max_ns / 1000.0,
        r.floor.stalls_per_s,
        pingpong::STALL_NS / 1000
    );
    let _ = writeln!(
        s,
        "copy:    random 4 KiB copy out of a {} buffer p50 {:.3} us, p99.9 {:.3} us ({} copies)",
        size(usize::try_from(r.copy.buffer_bytes).unwrap_or(usize::MAX)),
        r.copy.p50_ns / 1000.0,
        r.copy.p999_ns / 1000.0,
        r.copy.copies
    );
    let _ =
        writeln!(s, "phases:  {} each; latency from issue, HDR histogram; warm-up excluded", st.per_phase);
    if st.rounds > 1 {
        let _ = writeln!(
            s,
            "rounds:  {} (every phase once per round); figures are medians over the rounds, max is the largest",
            st.rounds
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<19} {:>4} {:>5} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>8} {:>12}",
        "workload",
        "req",
        "QD",
        "policy",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "IOPS",
        "MiB/s",
        "parked",
        "poller us/op"
    );
    for row in &r.rows {
        let qd = match row.depth_label.as_str() {
            "1" | "16" | "seq" => row.depth.to_string(),
            l => format!("{}={}", l, row.depth),
        };
        let _ = writeln!(
            s,
            "{:<19} {:>4} {:>5} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10.0} {:>9.1} {:>8} {:>12}",
            row.workload,
            size(row.request_bytes),
            qd,
            row.policy.map(|p| p.name()).unwrap_or("-"),
            fmt_us(row.p50_us),
            fmt_us(row.p99_us),
            fmt_us(row.p999_us),
            fmt_us(row.max_us),
            row.iops,
            row.mib_s,
            row.parked,
            row.poller_cpu_us_per_op.map_or("-".to_string(), |c| format!("{c:.1}"))
        );
    }
    if !r.wakeup.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "wake-up: 4k read QD=1 after 1 ms idle (adaptive: idle_spin_us=50 idle_sleep_us=200), {} requests each",
            r.wakeup[0].requests
        );
        let _ = writeln!(
            s,
            "{:<20} {:>9} {:>9} {:>9} {:>9} {:>14} {:>16} {:>13}",
            "poller",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "max us",
            "added p50 us",
            "socket doorbells",
            "direct wakes"
        );
        for w in &r.wakeup {
            let _ = writeln!(
                s,
                "{:<20} {:>9} {:>9} {:>9} {:>9} {:>14} {:>16} {:>13}",
                w.variant,
                fmt_us(w.p50_us),
                fmt_us(w.p99_us),
                fmt_us(w.p999_us),
                fmt_us(w.max_us),
                fmt_us(w.added_p50_us),
                w.socket_doorbells,
                w.direct_wakes
            );
        }
    }
    if let Some((waits, parks)) = r.poller_waits {
        let _ = writeln!(s);
        let _ = writeln!(s, "pollers: {waits} waits on the engine's readiness, {parks} parks");
    }
    if let Some(n) = &r.nfs {
        let u = &n.unstable;
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "nfs: {} calls, {} retransmits, {} backlogged; UNSTABLE store: {} writes stored, {} FILE_SYNC for want of room, {} waited for room, high-water {} KiB, {} background COMMITs freeing {} KiB",
            n.calls,
            n.retransmits,
            n.backlogged,
            u.stored,
            u.full,
            u.waited,
            u.high_water >> 10,
            u.background_commits,
            u.background_freed >> 10
        );
        let commits: Vec<String> = r
            .rows
            .iter()
            .filter_map(|row| row.commits.map(|c| format!("{} QD={} {c}", row.workload, row.depth_label)))
            .collect();
        if !commits.is_empty() {
            let _ = writeln!(s, "COMMITs per write phase (all rounds): {}", commits.join(", "));
        }
    }
    let _ = writeln!(s);
    if r.qd1_read_p50_over_floor > 0.0 {
        let _ = writeln!(
            s,
            "QD=1 4k read p50 = {:.1} x the ping-pong round trip, {:.1} x (ping-pong + 4 KiB copy: {:.3} us)",
            r.qd1_read_p50_over_floor,
            r.qd1_read_p50_over_floor_and_copy,
            (r.floor.p50_ns + r.copy.p50_ns) / 1000.0
        );
    }
    let _ = writeln!(s, "wall time {:.1} s", r.wall_s);
    s
}

/// The targets of the run (see [`BenchReport::targets`]), one line each, and whether every one
/// was met: what `--check` prints and turns into the exit code.
pub fn render_check(r: &BenchReport) -> (String, bool) {
    use std::fmt::Write;
    let mut s = String::new();
    if r.targets.is_empty() {
        let _ = writeln!(s, "check: no target applies to the phases run");
    }
    for t in &r.targets {
        let _ = write!(
            s,
            "target {:<50} {:>10.4} {} (limit {:.4}) {}",
            t.name,
            t.value,
            t.unit,
            t.limit,
            if t.met { "met" } else { "MISSED" }
        );
        if t.per_round.len() > 1 {
            let v: Vec<String> = t.per_round.iter().map(|v| format!("{v:.4}")).collect();
            let _ = write!(s, "; met in {} of {} rounds: {}", t.rounds_met, t.per_round.len(), v.join(" "));
        }
        let _ = writeln!(s);
    }
    (s, r.targets.iter().all(|t| t.met))
}

#[cfg(test)]
mod tests;
