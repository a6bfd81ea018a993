//! `virtiofs-bench`: 4 KiB latency at QD 1, QD = queue size and QD = 2 x queue size under both
//! queue-full policies, sequential bandwidth, and the shared-memory ping-pong floor.
//!
//! `cargo run --release -p virtiofs-bench` runs the device in-process with
//! its RAM filesystem; `--socket-path` measures a running daemon instead; `--live-update N`
//! starts the daemon binary and measures the pause its live updates cause. See BENCHMARKS.md.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use virtiofs_bench::{self as bench, BenchConfig};

/// Benchmarks the virtio-fs device through the userspace driver model.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Connect to a running daemon at this vfio-user socket instead of starting the device
    /// in-process.
    #[arg(long)]
    socket_path: Option<PathBuf>,
    /// Backend of the in-process device: `ramfs`, or `null` (READ/WRITE answered without data,
    /// to separate transport from backend cost).
    #[arg(long, default_value = "ramfs")]
    backend: bench::Backend,
    /// Virtqueue size (power of two).
    #[arg(long, default_value_t = 128)]
    queue_size: u16,
    /// Request queues.
    #[arg(long, default_value_t = 1)]
    request_queues: u16,
    /// Pollers of the in-process device: 1 on the poller core, or one per core from core 0 up
    /// (an NFSv4.1 export's pollers spread over the URL's addresses).
    #[arg(long, default_value_t = 1, conflicts_with = "socket_path")]
    pollers: usize,
    /// Measured seconds per phase (after a warm-up of 0.3 s, or 15% if shorter).
    #[arg(long, default_value_t = 1.0)]
    duration: f64,
    /// Rounds: the whole phase list runs this many times; the table shows medians over the
    /// rounds and each target is judged on the median of its per-round values.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Requests per variant of the adaptive-polling wake-up measurement (in-process device
    /// only; 0 skips it).
    #[arg(long, default_value_t = 300)]
    wakeup_requests: usize,
    /// Measured requests per phase instead of --duration (warm-up: a tenth as many).
    #[arg(long)]
    ops: Option<u64>,
    /// Test file size in MiB.
    #[arg(long, default_value_t = 64)]
    file_mib: u64,
    /// Queue depth of the sequential-bandwidth phases.
    #[arg(long, default_value_t = 16)]
    seq_depth: usize,
    /// The in-process poller's idle_spin_us (default: spin as on a dedicated core).
    #[arg(long, default_value_t = 10_000_000)]
    idle_spin_us: u64,
    /// Run the in-process poller with `polling = "busy"`: it never sleeps, nor blocks on the
    /// NFS socket while requests are on the wire (a DPU's dedicated core). Default: adaptive
    /// with --idle-spin-us.
    #[arg(long, conflicts_with = "socket_path")]
    busy_poll: bool,
    /// Do not pin the driver and the device poller to cores.
    #[arg(long)]
    no_pin: bool,
    /// Run the in-process device with `latency_histograms = false` (no latency measurement:
    /// to compare the statistics' cost).
    #[arg(long)]
    no_latency_histograms: bool,
    /// Run the in-process device with `inflight_tracking = true` (its split queues keep their
    /// in-flight records: to compare the tracking's cost).
    #[arg(long)]
    inflight_tracking: bool,
    /// Run only some phases: comma-separated lists of words of the phase label (e.g.
    /// "randread QD=1", "QD=1,refill").
    #[arg(long)]
    only: Option<String>,
    /// Serve this NFS export (`nfs://HOST[:PORT]/EXPORT[?nfsport=N&mountport=M]`) from the
    /// in-process device, add QD=16 phases, and run the same NFS client raw (no device, no
    /// FUSE) in every round: the device's cost is the difference (targets at the end).
    #[arg(long, value_name = "URL", conflicts_with = "socket_path")]
    remote: Option<String>,
    /// With --remote: the device's UNSTABLE store in bytes (the daemon's `nfs_unstable_bytes`;
    /// default 64 MiB), which the raw client's writes keep to as well.
    #[arg(long, value_name = "BYTES", requires = "remote")]
    nfs_unstable_bytes: Option<usize>,
    /// Several functions on one shared poller instead of the phase list: function B's QD=1
    /// p99 alone and beside function A at QD = 2 x queue size (`refill`), the QD=1 p50 with
    /// --idle-functions idle functions on the poller and without, and the memory per function
    /// (issue 14's fairness and scale figures; --duration and --rounds apply).
    #[arg(long, conflicts_with_all = ["socket_path", "remote"])]
    multi: bool,
    /// Idle functions beside the measured one in --multi.
    #[arg(long, default_value_t = 64, requires = "multi")]
    idle_functions: usize,
    /// In --multi, function A's driver polls its used ring instead of waiting on interrupts
    /// (on a 2-core machine it then shares the measuring driver's core).
    #[arg(long, requires = "multi")]
    a_spins: bool,
    /// In --multi, the core of function A's driver (default: where the scheduler puts it).
    #[arg(long, requires = "multi")]
    a_core: Option<usize>,
    /// In --multi, the fairness figure of the device on a machine without a core per driver:
    /// B's driver blocks on its interrupt under SCHED_FIFO at this priority (1-99, needs root or
    /// CAP_SYS_NICE), on the same core as A's driver, which spins (--a-spins and --a-core are
    /// then ignored), so the scheduler gives B the core as soon as its completion comes.
    #[arg(long, requires = "multi", value_parser = clap::value_parser!(i32).range(1..=99))]
    b_realtime: Option<i32>,
    /// Measure the pause a live update causes instead of the phase list (issue 22): start the
    /// daemon binary with --live-update, fill function 0's filesystem (--update-backend), then at QD=1 and
    /// QD = queue size update the daemon N times while the driver reads random 4 KiB blocks
    /// (--queue-size, --json and --check apply).
    #[arg(long, value_name = "N", conflicts_with_all = ["socket_path", "remote", "multi"])]
    live_update: Option<usize>,
    /// Measure what a crash of the serving process costs instead of the phase list (issue
    /// 24): start the daemon binary with --live-update (one RAM-filesystem function, with
    /// --remote the NFS export, with --crash-shared a shared directory), and at QD=1 and QD =
    /// queue size kill its serving process N
    /// times with SIGKILL while the driver reads random 4 KiB blocks; per depth, the time from
    /// the kill to the first completion by the new process (p50/p99/max) and the requests that
    /// failed (--queue-size, --daemon, --remote and --json apply).
    #[arg(long, value_name = "N", conflicts_with_all = ["socket_path", "multi", "live_update"])]
    crash: Option<usize>,
    /// Measure what keeping a shared directory for a crash costs its metadata operations
    /// instead of the phase list (issue 24): N CREATE+RELEASE pairs, N LOOKUPs of known nodes
    /// and N LOOKUPs that make nodes (one at a time, then 16 in flight), on the daemon binary with and without --live-update,
    /// alternating, --rounds times (--daemon and --json apply).
    #[arg(long, value_name = "N", conflicts_with_all = ["socket_path", "remote", "multi", "live_update", "crash"])]
    keep_cost: Option<usize>,
    /// In --crash, serve a shared directory (in the run's temporary directory) instead of a
    /// RAM filesystem.
    #[arg(long, requires = "crash", conflicts_with = "remote")]
    crash_shared: bool,
    /// In --live-update or --crash, the daemon binary (default: `virtiofs-dpu` beside this
    /// executable).
    #[arg(long, value_name = "PATH")]
    daemon: Option<PathBuf>,
    /// In --live-update, the daemon's functions (more than one: a profile with [[function]]
    /// tables); function 0 is measured, the others are brought up and stay idle.
    #[arg(long, value_name = "F", default_value_t = 1, requires = "live_update")]
    functions: usize,
    /// In --live-update, MiB of file data in function 0's RAM filesystem (the file read).
    #[arg(long, value_name = "M", default_value_t = 16, requires = "live_update")]
    data_mib: u64,
    /// In --live-update, what function 0 serves: `ram` (a RAM filesystem) or `shared` (a
    /// shared directory in the run's temporary directory).
    #[arg(long, value_name = "B", default_value = "ram", requires = "live_update")]
    update_backend: bench::live_update::UpdateBackend,
    /// In --live-update, empty files besides the data file, in directories of 1000.
    #[arg(long, value_name = "K", default_value_t = 10, requires = "live_update")]
    files: u64,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write a latency-percentile chart (SVG) to this file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Judge the run against its targets (printed after the table, or to stderr with --json):
    /// the exit code is 3 if any target is missed (1: the run failed, 2: bad arguments).
    #[arg(long)]
    check: bool,
}

/// Exit code of a run whose targets `--check` found missed.
const MISSED: u8 = 3;

fn main() -> ExitCode {
    let a = Args::parse();
    if !(a.duration > 0.0 && a.duration.is_finite()) {
        eprintln!("virtiofs-bench: --duration must be positive");
        return ExitCode::from(2);
    }
    let duration = Duration::from_secs_f64(a.duration);
    if a.multi {
        return multi(&a, duration);
    }
    if let Some(n) = a.crash {
        return crash(&a, n);
    }
    if let Some(n) = a.keep_cost {
        return keep_cost(&a, n);
    }
    if let Some(n) = a.live_update {
        return live_update(&a, n);
    }
    let cfg = BenchConfig {
        socket_path: a.socket_path,
        backend: a.backend,
        queue_size: a.queue_size,
        request_queues: a.request_queues,
        pollers: a.pollers.max(1),
        duration,
        warmup: Duration::from_millis(300).min(duration.mul_f64(0.15)),
        ops: a.ops,
        file_size: a.file_mib.max(1) << 20,
        seq_depth: a.seq_depth.max(1),
        idle_spin_us: a.idle_spin_us,
        busy_poll: a.busy_poll,
        latency_histograms: !a.no_latency_histograms,
        inflight_tracking: a.inflight_tracking,
        pin: !a.no_pin,
        only: a.only,
        rounds: a.rounds.max(1),
        wakeup_requests: a.wakeup_requests,
        remote: a.remote,
        nfs_unstable_bytes: a.nfs_unstable_bytes,
        ..Default::default()
    };
    let tty = std::io::stderr().is_terminal();
    let mut progress = |line: &str| {
        let mut e = std::io::stderr().lock();
        if tty {
            let _ = write!(e, "\r\x1b[K{line}");
        } else {
            let _ = writeln!(e, "{line}");
        }
        let _ = e.flush();
    };
    let report = match bench::run(&cfg, &mut progress) {
        Ok(r) => r,
        Err(e) => {
            if tty {
                eprintln!();
            }
            let mut msg = format!("virtiofs-bench: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("{msg}");
            return ExitCode::FAILURE;
        }
    };
    if tty {
        eprintln!("\r\x1b[Kdone in {:.1} s", report.wall_s);
    }
    if a.json {
        match serde_json::to_string_pretty(&report) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("virtiofs-bench: JSON: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", bench::render_table(&report));
    }
    if let Some(p) = a.plot {
        if let Err(e) = std::fs::write(&p, bench::plot::render_svg(&report)) {
            eprintln!("virtiofs-bench: cannot write {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    if a.check {
        let (text, met) = bench::render_check(&report);
        if a.json {
            eprint!("{text}");
        } else {
            print!("\n{text}");
        }
        if !met {
            return ExitCode::from(MISSED);
        }
    }
    ExitCode::SUCCESS
}

/// `--multi`: the shared-poller figures.
fn multi(a: &Args, duration: Duration) -> ExitCode {
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pinned = !a.no_pin && nproc >= 2;
    let cfg = bench::multi::MultiConfig {
        queue_size: a.queue_size,
        duration,
        warmup: Duration::from_millis(300).min(duration.mul_f64(0.15)),
        idle_functions: a.idle_functions,
        rounds: a.rounds.max(1),
        poller_core: pinned.then_some(nproc - 1),
        driver_core: pinned.then_some(0),
        a_spins: a.a_spins,
        a_core: a.a_core,
        b_realtime: a.b_realtime,
    };
    let mut progress = |line: &str| eprintln!("{line}");
    match bench::multi::run(&cfg, &mut progress) {
        Ok(r) if a.json => match serde_json::to_string_pretty(&r) {
            Ok(j) => {
                println!("{j}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("virtiofs-bench: JSON: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(r) => {
            print!("{}", bench::multi::table(&r));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("virtiofs-bench: {}", virtiofs_dpu::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// A daemon run's report `r`, printed as JSON (`--json`) or as `table` makes it; `None` (the
/// exit code) if the run or the printing failed.
fn print_run<R: serde::Serialize>(
    a: &Args,
    r: Result<R, bench::live_update::LiveUpdateError>,
    table: fn(&R) -> String,
) -> Result<R, ExitCode> {
    let r = r.map_err(|e| {
        eprintln!("virtiofs-bench: {}", virtiofs_dpu::error_chain(&e));
        ExitCode::FAILURE
    })?;
    if a.json {
        let j = serde_json::to_string_pretty(&r).map_err(|e| {
            eprintln!("virtiofs-bench: JSON: {e}");
            ExitCode::FAILURE
        })?;
        println!("{j}");
    } else {
        print!("{}", table(&r));
    }
    Ok(r)
}

/// `--crash N`: what crashes of the serving process cost.
fn crash(a: &Args, crashes: usize) -> ExitCode {
    let cfg = bench::crash::CrashConfig {
        daemon: a.daemon.clone(),
        crashes,
        queue_size: a.queue_size,
        remote: a.remote.clone(),
        shared: a.crash_shared,
    };
    let mut progress = |line: &str| eprintln!("{line}");
    match print_run(a, bench::crash::run(&cfg, &mut progress), bench::crash::table) {
        Ok(_) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// `--keep-cost N`: what keeping a shared directory for a crash costs its metadata.
fn keep_cost(a: &Args, files: usize) -> ExitCode {
    let cfg = bench::keep_cost::KeepCostConfig { daemon: a.daemon.clone(), files, rounds: a.rounds };
    let mut progress = |line: &str| eprintln!("{line}");
    match print_run(a, bench::keep_cost::run(&cfg, &mut progress), bench::keep_cost::table) {
        Ok(_) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// `--live-update N`: the pause of live updates.
fn live_update(a: &Args, updates: usize) -> ExitCode {
    let cfg = bench::live_update::LiveUpdateConfig {
        daemon: a.daemon.clone(),
        updates,
        functions: a.functions,
        data_mib: a.data_mib,
        files: a.files,
        queue_size: a.queue_size,
        backend: a.update_backend,
    };
    let mut progress = |line: &str| eprintln!("{line}");
    let r = match print_run(a, bench::live_update::run(&cfg, &mut progress), bench::live_update::table) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if a.check && !bench::live_update::met(&r) {
        eprintln!("virtiofs-bench: the p99 pause target is missed");
        return ExitCode::from(MISSED);
    }
    ExitCode::SUCCESS
}
