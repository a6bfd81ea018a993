//! `--crash N`: what a crash of the serving process costs the guest (issue 24).
//!
//! The benchmark starts the daemon binary itself (`virtiofs-dpu --live-update --control-socket
//! ...`, by default the one beside this executable) with one RAM-filesystem function. For each
//! queue depth (1 and the queue size) and each of the N crashes: a driver connects, makes a
//! data file of [`FILE_MIB`] MiB and reads random 4 KiB blocks of it in a closed loop, every
//! completion timed; 200-300 ms into the loop another thread sends SIGKILL to the serving
//! process. The supervisor starts a new one, which takes the function over from its
//! checkpoints and answers the requests that were in flight. Per crash: the **time to the
//! first completion by the new process** (from the kill to the first `EIO`: the new process
//! answers every request with it, the RAM filesystem's state having died with the old one,
//! which answered none so; the dying process may still complete requests for a moment after
//! the signal, 0.05-0.9 ms measured), the requests in flight at the kill (issued before it and
//! answered by the new process), and the requests that **failed** (an error reply;
//! the RAM filesystem's state dies with the process, so every request from the kill on fails
//! until the device is reset: the driver then goes away and the next crash's driver
//! connects anew). A request that got no answer at all fails the run (the driver's bound is
//! 60 s).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use virtiofs_tools::driver::{DriverOptions, FsDriver, IoDone, IoSpec, LoopConfig};

use crate::live_update::{daemon_binary, ms, serving_pid, with_daemon_log, Daemon, LiveUpdateError, Millis};
use crate::{rw_request, Machine};

/// MiB in the file the reads go to.
pub const FILE_MIB: u64 = 4;
const BLOCK: usize = 4096;
const ROOT: u64 = 1;
/// The driver's bound on any one request.
const DRIVER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the loop runs around each crash.
const LOOP: Duration = Duration::from_millis(700);
/// A pause in completions this long after the kill is the dying process gone (it stops
/// answering within a millisecond of SIGKILL; a new one takes several to start).
const DEAD_GAP: Duration = Duration::from_millis(2);
/// How long a new serving process may take to answer the control socket.
const NEW_PROCESS_BOUND: Duration = Duration::from_secs(20);

/// What `--crash` runs.
#[derive(Debug, Clone)]
pub struct CrashConfig {
    /// The daemon binary (`None`: `virtiofs-dpu` beside this executable).
    pub daemon: Option<PathBuf>,
    /// Crashes per queue depth.
    pub crashes: usize,
    /// Virtqueue size (the daemon's and the driver's); the second depth measured.
    pub queue_size: u16,
    /// An NFS export (`nfs://...`) to serve instead of a RAM filesystem: its state is kept,
    /// so the new process answers the requests in flight and every new one as the old would.
    pub remote: Option<String>,
    /// Serve a shared directory (in the run's temporary directory) instead: its state is kept
    /// too.
    pub shared: bool,
}

/// One queue depth's crashes.
#[derive(Debug, Clone, Serialize)]
pub struct CrashPhase {
    /// Requests kept outstanding.
    pub depth: usize,
    /// Crashes measured.
    pub crashes: usize,
    /// From each kill to the first completion after it (ms).
    pub to_first_completion_ms: Millis,
    /// Requests in flight at each kill.
    pub in_flight_at_kill: Vec<usize>,
    /// Requests answered with an error, all crashes together.
    pub failed: u64,
    /// Requests answered, all crashes together.
    pub completed: u64,
    /// Each crash's time to the first completion (ms), in order.
    pub gaps: Vec<f64>,
}

/// What `--crash` measured.
#[derive(Debug, Clone, Serialize)]
pub struct CrashReport {
    /// The machine.
    pub machine: Machine,
    /// The daemon binary run.
    pub daemon: String,
    /// Queue size negotiated.
    pub queue_size: u16,
    /// The NFS export served, if not a RAM filesystem.
    pub remote: Option<String>,
    /// A shared directory was served.
    pub shared: bool,
    /// The daemon's recoveries at the end (`get_device`).
    pub recoveries: u64,
    /// One entry per queue depth.
    pub phases: Vec<CrashPhase>,
    /// The daemon's log lines at WARN or ERROR level (each crash logs its recovery).
    pub daemon_log_warnings: Vec<String>,
    /// Seconds the whole run took.
    pub wall_s: f64,
}

/// Runs the daemon, crashes it under reads and reports; `progress` gets a line per step.
pub fn run(cfg: &CrashConfig, progress: &mut dyn FnMut(&str)) -> Result<CrashReport, LiveUpdateError> {
    let wall = Instant::now();
    if cfg.crashes == 0 {
        return Err(LiveUpdateError::Config("--crash must be at least 1".into()));
    }
    if cfg.queue_size < 2 || !cfg.queue_size.is_power_of_two() {
        return Err(LiveUpdateError::Config(format!(
            "queue size {} is not a power of two >= 2",
            cfg.queue_size
        )));
    }
    let binary = daemon_binary(cfg.daemon.as_deref())?;
    let dir = tempfile::Builder::new().prefix("virtiofs-bench-crash").tempdir()?;
    let log = dir.path().join("daemon.log");
    let r = run_in(cfg, &binary, dir.path(), &log, progress, wall);
    with_daemon_log(r, &log).map(|(mut rep, warnings)| {
        rep.daemon_log_warnings = warnings;
        rep
    })
}

fn run_in(
    cfg: &CrashConfig,
    binary: &Path,
    dir: &Path,
    log: &Path,
    progress: &mut dyn FnMut(&str),
    wall: Instant,
) -> Result<CrashReport, LiveUpdateError> {
    let (sock, ctl) = (dir.join("fs.sock"), dir.join("ctl.sock"));
    let profile = dir.join("profile.toml");
    match &cfg.remote {
        None => std::fs::write(
            &profile,
            format!("queue_size = {}\nramfs_size = {}\n", cfg.queue_size, 64u64 << 20),
        )?,
        Some(_) => std::fs::write(&profile, format!("queue_size = {}\n", cfg.queue_size))?,
    }
    let share = dir.join("share");
    if cfg.shared {
        std::fs::create_dir_all(&share)?;
    }
    let out = File::create(log)?;
    let mut cmd = Command::new(binary);
    cmd.arg("--config")
        .arg(&profile)
        .arg("--socket-path")
        .arg(&sock)
        .args(["--tag", "crash"])
        .args(cfg.remote.iter().flat_map(|url| ["--remote", url.as_str()]))
        .args(
            cfg.shared
                .then(|| [std::ffi::OsStr::new("--shared-dir"), share.as_os_str()])
                .into_iter()
                .flatten(),
        )
        .arg("--control-socket")
        .arg(&ctl)
        // Every crash of the run is recovered.
        .args(["--live-update", "--log-level", "info", "--crash-limit"])
        .arg(format!("{}/1", 2 * cfg.crashes + 1))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    progress(&format!("starting {}", binary.display()));
    let mut daemon = Daemon::launch(cmd, binary, &[&sock, &ctl])?;
    daemon.serving = Some(serving_pid(&ctl)?);
    let opts = DriverOptions {
        queue_size: cfg.queue_size,
        request_queues: 1,
        use_interrupts: true,
        timeout: DRIVER_TIMEOUT,
        ..Default::default()
    };
    let mut phases = Vec::new();
    for depth in [1, usize::from(cfg.queue_size)] {
        let mut p = CrashPhase {
            depth,
            crashes: cfg.crashes,
            to_first_completion_ms: Millis::default(),
            in_flight_at_kill: Vec::new(),
            failed: 0,
            completed: 0,
            gaps: Vec::new(),
        };
        for i in 0..cfg.crashes {
            let kept = cfg.remote.is_some() || cfg.shared;
            let one = crash_once(&sock, &ctl, &opts, depth, i, kept, &mut daemon)?;
            progress(&format!(
                "QD={depth} crash {}: first completion {:.1} ms after the kill, {} in flight, {} failed",
                i + 1,
                one.gap_ms,
                one.in_flight,
                one.failed
            ));
            p.gaps.push(one.gap_ms);
            p.in_flight_at_kill.push(one.in_flight);
            p.failed += one.failed;
            p.completed += one.completed;
        }
        p.to_first_completion_ms = Millis::of(&p.gaps);
        phases.push(p);
    }
    let recoveries = virtiofs_dpu::ops::control_socket::ControlClient::connect(&ctl)?
        .call("get_device", serde_json::Value::Null)?["recoveries"]
        .as_u64()
        .unwrap_or(0);
    daemon.stop();
    Ok(CrashReport {
        machine: Machine::probe(),
        daemon: binary.display().to_string(),
        queue_size: cfg.queue_size,
        remote: cfg.remote.clone(),
        shared: cfg.shared,
        recoveries,
        phases,
        daemon_log_warnings: Vec::new(),
        wall_s: wall.elapsed().as_secs_f64(),
    })
}

/// One crash's figures.
struct One {
    gap_ms: f64,
    in_flight: usize,
    failed: u64,
    completed: u64,
}

/// A driver reads at `depth` while the serving process is killed once.
fn crash_once(
    sock: &Path,
    ctl: &Path,
    opts: &DriverOptions,
    depth: usize,
    i: usize,
    kept: bool,
    daemon: &mut Daemon,
) -> Result<One, LiveUpdateError> {
    // A new driver each time: the last crash's ended its filesystem until a reset.
    let mut d = FsDriver::connect(sock, opts.clone())?;
    d.init()?;
    let (e, o) = d.create(ROOT, &format!("data{i}"), 0o644, libc::O_RDWR as u32)?;
    let block = vec![0x5a; 64 << 10];
    for off in (0..FILE_MIB << 20).step_by(block.len()) {
        d.write(e.nodeid, o.fh, off, &block)?;
    }
    let blocks = (FILE_MIB << 20) / BLOCK as u64;
    let old = serving_pid(ctl)?;
    // The killer: 200-300 ms into the loop.
    let killed: Arc<Mutex<Option<Instant>>> = Arc::default();
    let k = killed.clone();
    let delay = Duration::from_millis(200 + (i as u64 * 37) % 100);
    let killer = std::thread::spawn(move || {
        std::thread::sleep(delay);
        let at = Instant::now();
        let r = virtiofs_dpu::sys::signal_process(old, libc::SIGKILL);
        *k.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
        r
    });
    let base = Instant::now();
    // Each completion: when it was reaped (ns since `base`), when it was issued, and whether it
    // failed.
    let mut times: Vec<(u64, u64, bool)> = Vec::new();
    let mut lc = LoopConfig::new(depth, u64::MAX);
    lc.max_data = BLOCK;
    lc.duration = Some(LOOP);
    let make = |seq: u64, s: &mut IoSpec| {
        let blk = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) % blocks;
        rw_request(s, e.nodeid, o.fh, blk * BLOCK as u64, BLOCK, false)
    };
    let check = |c: &IoDone<'_>| -> Result<(), virtiofs_tools::driver::DriverError> {
        let now = base.elapsed().as_nanos() as u64;
        times.push((now, now.saturating_sub(c.latency.as_nanos() as u64), c.errno != 0));
        Ok(())
    };
    d.run_closed_loop(&lc, make, check)?;
    killer
        .join()
        .map_err(|_| LiveUpdateError::Daemon("the killer thread panicked".into()))?
        .map_err(LiveUpdateError::Io)?;
    let at = killed.lock().unwrap_or_else(|e| e.into_inner()).expect("set before the join");
    let kill_ns = at.saturating_duration_since(base).as_nanos() as u64;
    let (first, in_flight) =
        if kept {
            // A backend's state is kept: the new process answers as the old one would, so its
            // first completion is the one after the first pause of [`DEAD_GAP`] in completions
            // that follows the kill: the dying process stops answering within a millisecond of
            // the signal, and a new one takes longer than that to start (a later pause, the
            // server's or the machine's, is not the crash's).
            let mut after: Vec<(u64, u64)> =
                times.iter().filter(|t| t.0 >= kill_ns).map(|t| (t.0, t.1)).collect();
            after.sort_unstable();
            let gap = DEAD_GAP.as_nanos() as u64;
            let mut prev = kill_ns;
            let mut found = None;
            for &(reaped, _) in &after {
                if reaped - prev >= gap {
                    found = Some(reaped);
                    break;
                }
                prev = reaped;
            }
            let first = found
                .ok_or_else(|| LiveUpdateError::Daemon("no request answered by the new process".into()))?;
            (first, after.iter().filter(|t| t.0 >= first && t.1 < kill_ns).count())
        } else {
            // The new process answers every request of the RAM filesystem with EIO (its state died
            // with the old one), the old one none: its first completion is the first failed one,
            // and the requests in flight at the kill are those issued before it and answered by it.
            let first =
                times.iter().filter(|t| t.2).map(|t| t.0).min().ok_or_else(|| {
                    LiveUpdateError::Daemon("no request answered by the new process".into())
                })?;
            (first, times.iter().filter(|t| t.1 < kill_ns && t.2).count())
        };
    let failed = times.iter().filter(|t| t.2).count() as u64;
    let new = wait_new_serving(ctl, old)?;
    daemon.serving = Some(new);
    drop(d);
    Ok(One {
        gap_ms: ms(Duration::from_nanos(first - kill_ns)),
        in_flight,
        failed,
        completed: times.len() as u64,
    })
}

/// The serving process once it is another than `old`.
fn wait_new_serving(ctl: &Path, old: u32) -> Result<u32, LiveUpdateError> {
    let deadline = Instant::now() + NEW_PROCESS_BOUND;
    loop {
        if let Ok(p) = serving_pid(ctl) {
            if p != old {
                return Ok(p);
            }
        }
        if Instant::now() > deadline {
            return Err(LiveUpdateError::Daemon(format!(
                "no new serving process within {NEW_PROCESS_BOUND:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The report as a table.
pub fn table(r: &CrashReport) -> String {
    let mut s = format!(
        "crash recovery: {} (queue size {}, {}), {} recoveries\n\n",
        r.daemon,
        r.queue_size,
        match (&r.remote, r.shared) {
            (Some(u), _) => format!("NFS export {u}"),
            (None, true) => "a shared directory".into(),
            (None, false) => "RAM filesystem".into(),
        },
        r.recoveries
    );
    s +=
        "| depth | crashes | kill to first completion p50 / p99 / max (ms) | requests completed | failed |\n";
    s += "|---|---:|---|---:|---:|\n";
    for p in &r.phases {
        let m = p.to_first_completion_ms;
        s += &format!(
            "| QD={} | {} | {:.1} / {:.1} / {:.1} | {} | {} |\n",
            p.depth, p.crashes, m.p50, m.p99, m.max, p.completed, p.failed
        );
    }
    s
}
