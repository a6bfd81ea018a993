//! Several functions on one shared poller (issue 14): fairness and scale.
//!
//! - **Fairness**: function B at QD=1 (4 KiB random reads) alone on the poller, then while
//!   function A keeps its queue over-full (QD = 2 x queue size, the `refill` queue-full policy)
//!   on the same poller: B's p99 with A over B's p99 alone (target at most 2). With
//!   [`MultiConfig::b_realtime`] the measurement is of the device, not of CPU contention on a
//!   machine without a core for each driver: B's driver waits for each completion blocked on its
//!   interrupt eventfd under `SCHED_FIFO`, on the same core as A's driver, which spins (polls its
//!   used ring and refills); the scheduler preempts A for B as soon as B's interrupt comes, so
//!   what B waits for is the poller (on a core of its own) and a wake-up, alone and beside A
//!   alike (alone, a thread that only spins takes A's place on that core, so that B's wake-ups
//!   find it just as busy). Without it (the first figure) B's driver spins on its used ring and A's waits on its
//!   interrupts wherever the scheduler puts it: on two cores A's driver then takes CPU from B's
//!   or from the poller, and the figure measures that contention as much as the device.
//! - **Scale**: the QD=1 4 KiB read p50 of one function with no other function on its poller,
//!   then with 64 idle functions (each with a client that brought its queues up and sends
//!   nothing) on the same poller (target at most 1.2x).
//! - **Churn**: that function's QD=1 reads while functions are created on its poller, brought
//!   up by a client and removed, one after the other (what creating and removing functions at
//!   run time costs the others).
//! - **Memory per function**: the resident set the daemon side of 64 functions adds (no client
//!   yet), per function, beside the fixed size [`virtiofs_dpu::functions::memory_per_function`]
//!   computes.
//!
//! Each function is a [`RunningDevice`] on one [`PollerPool`], as the daemon runs them.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use virtiofs_backend::RamFs;
use virtiofs_device::config::{Profile, QueueMapping};
use virtiofs_device::poller::PollerPool;
use virtiofs_device::vfio_user::Listener;
use virtiofs_dpu::{FuseHandler, RunningDevice};
use virtiofs_tools::driver::{DriverOptions, FsDriver, IoSpec, LoopConfig, QueueFullPolicy};
use virtiofs_tools::fuse_abi::{self as abi, opcode};

use crate::BenchError;

const KIB: usize = 1024;
const FILE: u64 = 4 << 20;

/// What to run.
#[derive(Debug, Clone)]
pub struct MultiConfig {
    /// Queue size of every function.
    pub queue_size: u16,
    /// Measured time of each phase.
    pub duration: Duration,
    /// Warm-up of each phase.
    pub warmup: Duration,
    /// Idle functions of the scale measurement.
    pub idle_functions: usize,
    /// Rounds of each comparison (alternating; medians reported).
    pub rounds: usize,
    /// The poller's core (`None`: unpinned).
    pub poller_core: Option<usize>,
    /// The measuring driver's core.
    pub driver_core: Option<usize>,
    /// Function A's driver polls its used ring (spins) instead of waiting on its interrupts.
    pub a_spins: bool,
    /// Function A's driver's core (`None`: where the scheduler puts it).
    pub a_core: Option<usize>,
    /// The fairness measurement with B's driver blocking on its interrupt under `SCHED_FIFO` at
    /// this priority, A's driver spinning on B's core (`a_spins` and `a_core` are then
    /// ignored); `None`: the first measurement (B spinning).
    pub b_realtime: Option<i32>,
}

/// Latency percentiles of one phase, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Lat {
    /// Requests measured.
    pub ops: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest.
    pub max_us: f64,
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct MultiReport {
    /// Function B at QD=1, alone on the poller, per round.
    pub b_alone: Vec<Lat>,
    /// Function B at QD=1 beside A at QD = 2 x queue size (refill), per round.
    pub b_beside_a: Vec<Lat>,
    /// A's IOPS during those rounds.
    pub a_iops: Vec<f64>,
    /// The share of a core A's driver thread had during those rounds (its CPU time over its
    /// wall time).
    pub a_cpu_share: Vec<f64>,
    /// A's driver spun (else it waited on its interrupts).
    pub a_spins: bool,
    /// B's driver waited on its interrupt under `SCHED_FIFO` at this priority, on A's core
    /// (else it spun on its used ring).
    pub b_realtime: Option<i32>,
    /// Median of B's p99 beside A over alone.
    pub fairness_p99_ratio: f64,
    /// QD=1 read with no other function on the poller, per round.
    pub qd1_alone: Vec<Lat>,
    /// QD=1 read with `idle_functions` idle functions on the poller, per round.
    pub qd1_with_idle: Vec<Lat>,
    /// Idle functions.
    pub idle_functions: usize,
    /// Median p50 with idle functions over alone.
    pub scale_p50_ratio: f64,
    /// Resident bytes the daemon side of one function added (no client), measured.
    pub rss_per_function: u64,
    /// Resident bytes per function once each has a client with its queues up (the client's
    /// guest memory, in this process too, included).
    pub rss_per_connected_function: u64,
    /// Fixed bytes per function, computed from the profile.
    pub fixed_per_function: u64,
    /// QD=1 read alone before each churn round.
    pub churn_alone: Vec<Lat>,
    /// QD=1 read while functions were created, used and removed on the same poller.
    pub churn: Vec<Lat>,
    /// Functions created and removed during each churn round.
    pub churned: Vec<u64>,
}

fn lat(h: &Histogram<u64>) -> Lat {
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Lat {
        ops: h.len(),
        p50_us: us(0.5),
        p99_us: us(0.99),
        p999_us: us(0.999),
        max_us: h.max() as f64 / 1000.0,
    }
}

/// Clock ticks a second of `/proc`'s CPU times (`USER_HZ`, 100 on Linux).
const TICKS_PER_S: f64 = 100.0;

/// The calling thread's CPU time so far, user and system, in clock ticks.
fn thread_cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // After the command name in parentheses: field 3 on; utime and stime are fields 14 and 15.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    field(14) + field(15)
}

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

struct Function {
    dev: RunningDevice,
}

fn start(pool: &PollerPool, profile: &Profile, dir: &Path, n: usize) -> Result<Function, BenchError> {
    let sock = dir.join(format!("f{n}.sock"));
    let listener = Listener::bind(&sock).map_err(|e| BenchError::Device(Box::new(e)))?;
    let p = Profile { tag: format!("f{n}"), ..profile.clone() };
    let placement = pool.placement(QueueMapping::Spread, None, n);
    let handler = Arc::new(FuseHandler::new(RamFs::new()));
    let dev = RunningDevice::start_on_pool(listener, p, handler, pool, placement)
        .map_err(|e| BenchError::Device(Box::new(e)))?;
    Ok(Function { dev })
}

/// A driver on `f` with a 4 MiB file laid out; returns it with the file's node and handle.
fn client(f: &Function, q: u16, interrupts: bool) -> Result<(FsDriver, u64, u64), BenchError> {
    let opts = DriverOptions {
        queue_size: q,
        mem_size: 8 << 20,
        use_interrupts: interrupts,
        queue_full: QueueFullPolicy::Refill,
        ..Default::default()
    };
    let mut d = FsDriver::connect(f.dev.socket_path(), opts)?;
    d.init()?;
    let (e, o) = d.create(1, "file", 0o644, libc::O_RDWR as u32)?;
    let chunk = vec![0x5au8; 64 * KIB];
    for off in (0..FILE).step_by(chunk.len()) {
        d.write(e.nodeid, o.fh, off, &chunk)?;
    }
    Ok((d, e.nodeid, o.fh))
}

/// 4 KiB random reads at `depth` for `duration` (after `warmup`); the latencies and IOPS.
fn reads(
    d: &mut FsDriver,
    node: u64,
    fh: u64,
    depth: usize,
    warmup: Duration,
    duration: Duration,
) -> Result<(Histogram<u64>, f64), BenchError> {
    let mut cfg = LoopConfig::new(depth, u64::MAX);
    cfg.max_data = 4 * KIB;
    cfg.warmup = warmup;
    cfg.duration = Some(duration);
    let blocks = FILE / 4096;
    let mut rng = 0x2545_f491_4f6c_dd1du64 ^ depth as u64;
    let make = |_: u64, s: &mut IoSpec| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        s.nodeid = node;
        s.opcode = opcode::READ;
        abi::ReadIn { fh, offset: (rng % blocks) * 4096, size: 4096, ..Default::default() }
            .encode_into(&mut s.args);
        s.out_data = 4096;
    };
    let r = d.run_closed_loop(&cfg, make, |_| Ok(()))?;
    let iops = r.iops();
    Ok((r.histogram, iops))
}

fn pin(core: Option<usize>) {
    if let Some(c) = core {
        let _ = core_affinity::set_for_current(core_affinity::CoreId { id: c });
    }
}

/// What every measurement runs on: the configuration, the pool, the functions' profile and
/// the directory their sockets are in.
#[derive(Clone, Copy)]
struct Bed<'a> {
    cfg: &'a MultiConfig,
    pool: &'a PollerPool,
    profile: &'a Profile,
    dir: &'a Path,
}

/// Function B's latency alone and beside a loaded function A on the one poller.
struct Fairness {
    b_alone: Vec<Lat>,
    b_beside_a: Vec<Lat>,
    a_iops: Vec<f64>,
    a_cpu: Vec<f64>,
    a_spins: bool,
}

/// A busy function's QD=1 latency with idle functions beside it and alone, and what a function
/// costs in resident memory.
struct Scale {
    qd1_alone: Vec<Lat>,
    qd1_with_idle: Vec<Lat>,
    rss_fn: u64,
    rss_conn: u64,
}

/// A busy function's QD=1 latency alone and while functions come and go on its poller.
struct Churn {
    churn_alone: Vec<Lat>,
    churn: Vec<Lat>,
    churned: Vec<u64>,
}

/// Fairness: A and B on the one poller, B measured alone and beside A, round after round.
fn fairness(bed: &Bed<'_>, progress: &mut dyn FnMut(&str)) -> Result<Fairness, BenchError> {
    let Bed { cfg, pool, profile, dir } = *bed;
    let q = cfg.queue_size;
    let rounds = cfg.rounds.max(1);
    let fa = start(pool, profile, dir, 0)?;
    let fb = start(pool, profile, dir, 1)?;
    let rt = cfg.b_realtime;
    let (a_spins, a_core) = match rt {
        Some(_) => (true, cfg.driver_core),
        None => (cfg.a_spins, cfg.a_core),
    };
    let (mut db, nb, hb) = client(&fb, q, rt.is_some())?;
    let (da, na, ha) = client(&fa, q, !a_spins)?;
    // B's measurements (alone and beside A) under the real-time policy, the rest not.
    let b_reads = |db: &mut FsDriver| -> Result<Histogram<u64>, BenchError> {
        if rt.is_some() {
            crate::sys::set_realtime(rt)?;
        }
        let r = reads(db, nb, hb, 1, cfg.warmup, cfg.duration);
        if rt.is_some() {
            crate::sys::set_realtime(None)?;
        }
        r.map(|(h, _)| h)
    };
    let da = Arc::new(std::sync::Mutex::new(da));
    let (mut b_alone, mut b_beside_a, mut a_iops, mut a_cpu) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        progress(&format!("[fairness {}/{rounds}] B at QD=1 alone", round + 1));
        // Alone the same way: with the real-time B, a thread as CPU-bound as A's driver spins on
        // A's core without touching the device, so that B's wake-ups find that core as busy as
        // beside A and only A's load on the poller differs.
        let burning = Arc::new(AtomicBool::new(rt.is_some()));
        let burner = rt.map(|_| {
            let burning = burning.clone();
            std::thread::spawn(move || {
                pin(a_core);
                while burning.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        });
        let h = b_reads(&mut db);
        burning.store(false, Ordering::Relaxed);
        if let Some(b) = burner {
            let _ = b.join();
        }
        b_alone.push(lat(&h?));
        progress(&format!("[fairness {}/{rounds}] B at QD=1 beside A at QD={} (refill)", round + 1, 2 * q));
        let running = Arc::new(AtomicBool::new(true));
        let a = {
            let (da, running) = (da.clone(), running.clone());
            // A runs a little longer on both sides than B measures.
            let span = cfg.warmup + cfg.duration + Duration::from_millis(400);
            std::thread::spawn(move || -> Result<(f64, f64), String> {
                pin(a_core);
                let mut d = da.lock().unwrap_or_else(|e| e.into_inner());
                let (t0, cpu0) = (std::time::Instant::now(), thread_cpu_ticks());
                let r = reads(&mut d, na, ha, 2 * usize::from(q), Duration::from_millis(100), span);
                running.store(false, Ordering::Relaxed);
                let share = (thread_cpu_ticks() - cpu0) as f64 / TICKS_PER_S / t0.elapsed().as_secs_f64();
                r.map(|(_, iops)| (iops, share)).map_err(|e| e.to_string())
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        let h = b_reads(&mut db)?;
        let still = running.load(Ordering::Relaxed);
        let iops = a
            .join()
            .map_err(|_| BenchError::Config("A's driver panicked".into()))?
            .map_err(BenchError::Config)?;
        if !still {
            return Err(BenchError::Config("A's load ended before B's measurement did".into()));
        }
        b_beside_a.push(lat(&h));
        a_iops.push(iops.0);
        a_cpu.push(iops.1);
    }
    drop((db, da));
    drop((fa, fb));
    Ok(Fairness { b_alone, b_beside_a, a_iops, a_cpu, a_spins })
}

/// Scale: the busy function on `d` (node `n`, handle `h`), then idle functions beside it on the
/// same poller, alternating.
fn scale(
    bed: &Bed<'_>,
    progress: &mut dyn FnMut(&str),
    (d, n, h): (&mut FsDriver, u64, u64),
) -> Result<Scale, BenchError> {
    let Bed { cfg, pool, profile, dir } = *bed;
    let q = cfg.queue_size;
    let rounds = cfg.rounds.max(1);
    let mut qd1_alone = Vec::new();
    let mut qd1_with_idle = Vec::new();
    let n_idle = cfg.idle_functions.max(1) as u64;
    let (mut rss_fn, mut rss_conn) = (0, 0);
    // Alternate, so that drift of a shared machine hits both sides alike: the idle functions
    // come (their clients bring their queues up), the busy one is measured, they go, it is
    // measured alone.
    for round in 0..rounds {
        let before = rss();
        let mut idle = Vec::new();
        for i in 0..cfg.idle_functions {
            idle.push(start(pool, profile, dir, 3 + i)?);
        }
        let after_functions = rss();
        let mut clients = Vec::new();
        for f in &idle {
            let opts = DriverOptions { queue_size: q, mem_size: 1 << 20, ..Default::default() };
            let mut c = FsDriver::connect(f.dev.socket_path(), opts)?;
            c.init()?;
            clients.push(c);
        }
        if round == 0 {
            rss_fn = after_functions.saturating_sub(before) / n_idle;
            rss_conn = rss().saturating_sub(before) / n_idle;
        }
        progress(&format!(
            "[scale {}/{rounds}] QD=1 read, {} idle functions on the poller",
            round + 1,
            idle.len()
        ));
        let (hist, _) = reads(d, n, h, 1, cfg.warmup, cfg.duration)?;
        qd1_with_idle.push(lat(&hist));
        drop(clients);
        drop(idle);
        progress(&format!("[scale {}/{rounds}] QD=1 read, alone on the poller", round + 1));
        let (hist, _) = reads(d, n, h, 1, cfg.warmup, cfg.duration)?;
        qd1_alone.push(lat(&hist));
    }
    Ok(Scale { qd1_alone, qd1_with_idle, rss_fn, rss_conn })
}

/// Churn: the busy function's QD=1 reads on `d` while, on another thread, functions are created
/// on its poller, brought up by a client (bring-up, INIT, one GETATTR) and removed, one after
/// the other, for as long as the phase lasts.
fn churn(
    bed: &Bed<'_>,
    progress: &mut dyn FnMut(&str),
    (d, n, h): (&mut FsDriver, u64, u64),
) -> Result<Churn, BenchError> {
    let Bed { cfg, pool, profile, dir } = *bed;
    let q = cfg.queue_size;
    let rounds = cfg.rounds.max(1);
    let mut churn_alone = Vec::new();
    let mut churn = Vec::new();
    let mut churned = Vec::new();
    for round in 0..rounds {
        progress(&format!("[churn {}/{rounds}] QD=1 read, alone", round + 1));
        let (hist, _) = reads(d, n, h, 1, cfg.warmup, cfg.duration)?;
        churn_alone.push(lat(&hist));
        progress(&format!("[churn {}/{rounds}] QD=1 read while functions come and go", round + 1));
        let stop = Arc::new(AtomicBool::new(false));
        let churner = {
            let (pool, profile, stop) = (pool.clone(), profile.clone(), stop.clone());
            let dir = dir.to_path_buf();
            std::thread::spawn(move || -> Result<u64, String> {
                let mut made = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let f = start(&pool, &profile, &dir, 1000).map_err(|e| e.to_string())?;
                    let opts = DriverOptions { queue_size: q, mem_size: 1 << 20, ..Default::default() };
                    let mut c = FsDriver::connect(f.dev.socket_path(), opts).map_err(|e| e.to_string())?;
                    c.init().map_err(|e| e.to_string())?;
                    c.getattr(1).map_err(|e| e.to_string())?;
                    drop(c);
                    f.dev.stop().map_err(|e| e.to_string())?;
                    made += 1;
                }
                Ok(made)
            })
        };
        let (hist, _) = reads(d, n, h, 1, cfg.warmup, cfg.duration)?;
        stop.store(true, Ordering::Relaxed);
        let made = churner.join().map_err(|_| BenchError::Config("the churn thread panicked".into()))?;
        churned.push(made.map_err(BenchError::Config)?);
        churn.push(lat(&hist));
    }
    Ok(Churn { churn_alone, churn, churned })
}

/// Runs the fairness and scale measurements (`progress`: one line per phase).
pub fn run(cfg: &MultiConfig, progress: &mut dyn FnMut(&str)) -> Result<MultiReport, BenchError> {
    pin(cfg.driver_core);
    let dir = tempfile::tempdir()?;
    let profile = Profile {
        description: "virtiofs-bench --multi".into(),
        queue_size: cfg.queue_size,
        poller_cores: cfg.poller_core.into_iter().collect(),
        idle_spin_us: 10_000_000,
        ..Default::default()
    };
    let pool = PollerPool::spawn(&profile)?;
    let bed = Bed { cfg, pool: &pool, profile: &profile, dir: dir.path() };
    let Fairness { b_alone, b_beside_a, a_iops, a_cpu, a_spins } = fairness(&bed, progress)?;
    let ratio = median(b_beside_a.iter().map(|l| l.p99_us).collect())
        / median(b_alone.iter().map(|l| l.p99_us).collect());
    // Scale and churn: one busy function, and others beside it on the same poller.
    let busy = start(&pool, &profile, dir.path(), 2)?;
    let (mut d, n, h) = client(&busy, cfg.queue_size, false)?;
    let Scale { qd1_alone, qd1_with_idle, rss_fn, rss_conn } = scale(&bed, progress, (&mut d, n, h))?;
    let Churn { churn_alone, churn, churned } = churn(&bed, progress, (&mut d, n, h))?;
    drop(d);
    let scale = median(qd1_with_idle.iter().map(|l| l.p50_us).collect())
        / median(qd1_alone.iter().map(|l| l.p50_us).collect());
    let placement = pool.placement(QueueMapping::Spread, None, 0);
    Ok(MultiReport {
        b_alone,
        b_beside_a,
        a_iops,
        a_cpu_share: a_cpu,
        a_spins,
        b_realtime: cfg.b_realtime,
        fairness_p99_ratio: ratio,
        qd1_alone,
        qd1_with_idle,
        idle_functions: cfg.idle_functions,
        scale_p50_ratio: scale,
        rss_per_function: rss_fn,
        rss_per_connected_function: rss_conn,
        fixed_per_function: virtiofs_dpu::functions::memory_per_function(&profile, &placement),
        churn_alone,
        churn,
        churned,
    })
}

/// The report as a table.
pub fn table(r: &MultiReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let row = |s: &mut String, what: &str, l: &[Lat]| {
        let m = |f: fn(&Lat) -> f64| median(l.iter().map(f).collect());
        let _ = writeln!(
            s,
            "{what:<52} {:>9.2} {:>9.2} {:>9.2} {:>9.1}",
            m(|l| l.p50_us),
            m(|l| l.p99_us),
            m(|l| l.p999_us),
            m(|l| l.max_us)
        );
    };
    let _ = writeln!(
        s,
        "{:<52} {:>9} {:>9} {:>9} {:>9}",
        "4k randread, medians over rounds (us)", "p50", "p99", "p99.9", "max"
    );
    let how = match r.b_realtime {
        Some(_) => " (B blocks, RT)",
        None => " (B spins)",
    };
    row(&mut s, &format!("B QD=1 alone on the poller{how}"), &r.b_alone);
    row(&mut s, &format!("B QD=1 beside A at QD=2x queue (refill){how}"), &r.b_beside_a);
    row(&mut s, "QD=1 alone on the poller", &r.qd1_alone);
    row(&mut s, &format!("QD=1 with {} idle functions on the poller", r.idle_functions), &r.qd1_with_idle);
    row(&mut s, "QD=1 alone (churn phase)", &r.churn_alone);
    row(&mut s, "QD=1 while functions are created and removed", &r.churn);
    let _ = writeln!(s, "functions created, used and removed per churn round: {:?}", r.churned);
    let _ = writeln!(
        s,
        "A's IOPS beside B: {:.0}, its driver on {:.0} % of a core (A's driver {})",
        median(r.a_iops.clone()),
        100.0 * median(r.a_cpu_share.clone()),
        if r.a_spins { "polling its used ring" } else { "waiting on its interrupts" }
    );
    let _ = writeln!(
        s,
        "B's driver: {}",
        match r.b_realtime {
            Some(p) => format!(
                "blocked on its interrupt eventfd under SCHED_FIFO {p}, on A's core (the device's figure)"
            ),
            None => "spinning on its used ring (includes CPU contention with A's driver)".into(),
        }
    );
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let _ = writeln!(
        s,
        "fairness: B p99 beside A / alone = {:.2} (target <= 2: {})",
        r.fairness_p99_ratio,
        verdict(r.fairness_p99_ratio <= 2.0)
    );
    let _ = writeln!(
        s,
        "scale: QD=1 p50 with {} idle / none = {:.2} (target <= 1.2: {})",
        r.idle_functions,
        r.scale_p50_ratio,
        verdict(r.scale_p50_ratio <= 1.2)
    );
    let _ = writeln!(
        s,
        "memory per function: {} KiB resident (daemon side, no client), {} KiB with a connected client, {} KiB fixed by the profile",
        r.rss_per_function / 1024,
        r.rss_per_connected_function / 1024,
        r.fixed_per_function / 1024
    );
    s
}
