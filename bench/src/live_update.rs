//! `--live-update N`: the pause a live update of the daemon causes, as the guest sees it
//! (issue 22).
//!
//! The benchmark starts the daemon binary itself (`virtiofs-dpu --live-update --control-socket
//! ...`, by default the one beside this executable) in a temporary directory, with
//! [`LiveUpdateConfig::functions`] functions from a generated profile: RAM filesystems, but for
//! function 0 a shared directory with [`UpdateBackend::Shared`]. A driver brings up every
//! function (functions 1.. stay idle); function 0's filesystem is filled with
//! a data file of [`LiveUpdateConfig::data_mib`] MiB and [`LiveUpdateConfig::files`] empty
//! files in directories of at most [`FILES_PER_DIR`]. One update that is not measured follows
//! (it sizes the measuring loop's chunks, below, and shows that the daemon can be updated).
//!
//! Then, at QD 1 and at QD = queue size, the driver reads random 4 KiB blocks of the data file
//! in a closed loop ([`FsDriver::run_closed_loop`], with the phases' request layout and
//! completion check) while another thread calls the control socket's `live_update`
//! [`LiveUpdateConfig::updates`] times. The process that handed over exits 200 ms after its
//! answer (`OLD_EXIT`), which disturbs the new one on a small machine, so each update is made
//! 200-300 ms after that (and only once that process is gone), not into its exit. Every
//! completion's time is recorded and every reply's data checked; any failed request or wrong
//! byte ends the run with an error. An update's **pause** is the longest gap between
//! consecutive completions that overlaps its window: from the RPC's start to its answer plus
//! [`AFTER_ANSWER`]. The RPC's own `handover_ms` (the old process's time from the first
//! function frozen to the commit) is collected beside it, and the longest gap outside the
//! windows (the machine's noise, and the old process's exit) with where it fell.
//!
//! The closed loop runs for a set time, so the measuring thread runs it in chunks, one per
//! update, each long enough to cover the update's window by an estimate from the updates so
//! far; an update slower than the estimate gets another chunk, and a chunk boundary that falls
//! inside a window (its small gap then counts in that update's pause) is reported
//! ([`PhaseReport::boundaries_in_windows`]).
//!
//! The daemon is ended (SIGTERM to its supervisor, SIGKILL to its processes if it does not
//! stop) on every way out (the daemon guard's `Drop`), and the temporary directory removed; the
//! daemon's log (stdout and stderr) is kept there, its tail printed if the run fails, and its
//! warnings and errors reported.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};
use virtiofs_dpu::ops::control_socket::{ClientError, ControlClient};
use virtiofs_tools::driver::{DriverError, DriverOptions, FsDriver, IoDone, IoSpec, LoopConfig};

use crate::{check_rw, rw_request, Machine};

/// Size of every measured read.
pub const BLOCK: usize = 4096;
/// Most files in one directory of the filled filesystem.
pub const FILES_PER_DIR: u64 = 1000;
/// How long after an update's answer its window ends.
pub const AFTER_ANSWER: Duration = Duration::from_millis(50);
/// The pause (p99) the issue asks for with one function.
pub const TARGET_ONE_MS: f64 = 20.0;
/// The pause (p99) the issue asks for with several (16) functions.
pub const TARGET_MANY_MS: f64 = 50.0;

const MIB: u64 = 1 << 20;
const ROOT: u64 = 1;
/// Shortest and longest wait between an answer and the next update.
const GAP_MIN: Duration = Duration::from_millis(200);
const GAP_SPREAD_MS: u64 = 100;
/// How long after its answer the process that handed over exits (`virtiofs_dpu::update`'s
/// `exit_after_answer`); updates are paced from then.
const OLD_EXIT: Duration = Duration::from_millis(200);
/// How long a `live_update` call may take before the run fails.
const RPC_TIMEOUT: Duration = Duration::from_secs(60);
/// The driver's bound on any one request (an update must not look like a lost request).
const DRIVER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the daemon may take to bind its sockets.
const START_BOUND: Duration = Duration::from_secs(20);
/// How long the daemon may take to stop on SIGTERM before it is killed.
const STOP_BOUND: Duration = Duration::from_secs(10);

/// What `--live-update` runs.
#[derive(Debug, Clone)]
pub struct LiveUpdateConfig {
    /// The daemon binary (`None`: `virtiofs-dpu` beside this executable).
    pub daemon: Option<PathBuf>,
    /// Measured updates per queue depth.
    pub updates: usize,
    /// Functions of the daemon (function 0 is measured, the others are brought up and idle).
    pub functions: usize,
    /// MiB of file data in function 0's filesystem (the file the reads go to).
    pub data_mib: u64,
    /// Empty files besides the data file.
    pub files: u64,
    /// Virtqueue size (the daemon's and the driver's); the second depth measured.
    pub queue_size: u16,
    /// What function 0 serves (the others serve RAM filesystems).
    pub backend: UpdateBackend,
}

/// What the measured function serves in `--live-update`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UpdateBackend {
    /// A RAM filesystem.
    Ram,
    /// A shared directory (a directory in the run's temporary directory; the daemon's default
    /// confinement: namespaces and seccomp as root): every file the filling makes is a node
    /// the update hands over as a descriptor.
    Shared,
}

impl std::str::FromStr for UpdateBackend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ram" => Ok(UpdateBackend::Ram),
            "shared" => Ok(UpdateBackend::Shared),
            other => Err(format!("unknown backend {other:?} (ram or shared)")),
        }
    }
}

impl Default for LiveUpdateConfig {
    fn default() -> Self {
        LiveUpdateConfig {
            daemon: None,
            updates: 20,
            functions: 1,
            data_mib: 16,
            files: 10,
            queue_size: 128,
            backend: UpdateBackend::Ram,
        }
    }
}

/// Why `--live-update` failed.
#[derive(Debug, thiserror::Error)]
pub enum LiveUpdateError {
    /// The configuration cannot be run.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The daemon binary is missing or the daemon misbehaved.
    #[error("{0}")]
    Daemon(String),
    /// The driver failed: a request failed, or its data was wrong.
    #[error("driver")]
    Driver(#[from] DriverError),
    /// The control socket failed (an update refused, or no answer).
    #[error("control socket")]
    Control(#[from] ClientError),
    /// A local resource failed.
    #[error("I/O")]
    Io(#[from] std::io::Error),
}

/// Percentiles of a set of milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Millis {
    /// Median.
    pub p50: f64,
    /// 99th percentile (nearest rank: the maximum below 100 values).
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

impl Millis {
    /// The percentiles of `v` (nearest rank); zeros if it is empty.
    pub fn of(v: &[f64]) -> Millis {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            if s.is_empty() {
                return 0.0;
            }
            let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
            s[i]
        };
        Millis { p50: rank(0.5), p99: rank(0.99), max: rank(1.0) }
    }
}

/// One queue depth's updates.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseReport {
    /// Requests kept outstanding.
    pub depth: usize,
    /// Updates measured.
    pub updates: usize,
    /// The pause of each update: the longest gap between completions in its window (ms).
    pub pause_ms: Millis,
    /// `handover_ms` of each update's answer (the old process's freeze-to-commit time).
    pub handover_ms: Millis,
    /// Each `live_update` call, from the request to the answer (ms).
    pub rpc_ms: Millis,
    /// Requests completed (every one checked) during the phase.
    pub completions: u64,
    /// Completions per second over the phase.
    pub iops: f64,
    /// The longest gap between completions outside every window and chunk boundary (ms): the
    /// machine's own noise.
    pub longest_gap_outside_ms: f64,
    /// Where that gap began, from the update answer before it (ms). The process that handed
    /// over exits 200 ms after the answer.
    pub longest_gap_outside_after_answer_ms: f64,
    /// Windows a chunk boundary of the closed loop fell into (their pause includes it).
    pub boundaries_in_windows: usize,
    /// Updates that waited for the previous update's process to exit past their planned start.
    pub waited_for_old_exit: usize,
    /// The target for the p99 pause (ms).
    pub target_p99_ms: f64,
    /// Whether the p99 pause is within it.
    pub met: bool,
    /// Each update's pause (ms), in order.
    pub pauses: Vec<f64>,
    /// Each update's `handover_ms`, in order.
    pub handovers: Vec<f64>,
    /// Each update's longest gap outside its window in its chunk(s) of the loop (ms).
    pub quiet_gaps: Vec<f64>,
    /// Where each of those began, from the answer before it (this update's, or the previous
    /// one's, or the unmeasured update's; ms).
    pub quiet_gaps_after_answer: Vec<f64>,
}

/// What `--live-update` measured.
#[derive(Debug, Clone, Serialize)]
pub struct LiveUpdateReport {
    /// The machine.
    pub machine: Machine,
    /// The daemon binary run.
    pub daemon: String,
    /// Its version (the `new_version` of the updates).
    pub version: String,
    /// Functions of the daemon.
    pub functions: usize,
    /// MiB of data in function 0's filesystem.
    pub data_mib: u64,
    /// Empty files besides the data file.
    pub files: u64,
    /// Directories they are in.
    pub directories: u64,
    /// Queue size negotiated.
    pub queue_size: u16,
    /// What function 0 serves.
    pub backend: UpdateBackend,
    /// Seconds the filling took.
    pub fill_s: f64,
    /// The unmeasured update after the filling: its RPC time (ms).
    pub warmup_rpc_ms: f64,
    /// Its `handover_ms`.
    pub warmup_handover_ms: f64,
    /// One entry per queue depth.
    pub phases: Vec<PhaseReport>,
    /// The daemon's log lines at WARN or ERROR level.
    pub daemon_log_warnings: Vec<String>,
    /// Seconds the whole run took.
    pub wall_s: f64,
}

/// The longest gap between consecutive `times` (ascending, ns) that overlaps `[from, to]`
/// (the pair `a`, `b` with `b >= from` and `a <= to`); `None` if no pair does.
pub fn longest_gap(times: &[u64], from: u64, to: u64) -> Option<u64> {
    times.windows(2).filter(|w| w[1] >= from && w[0] <= to).map(|w| w[1] - w[0]).max()
}

/// Runs the daemon, fills it, updates it under reads and reports; `progress` gets a line per
/// step. The daemon's log tail is printed to stderr if it fails.
pub fn run(
    cfg: &LiveUpdateConfig,
    progress: &mut dyn FnMut(&str),
) -> Result<LiveUpdateReport, LiveUpdateError> {
    let wall = Instant::now();
    if cfg.updates == 0 || cfg.functions == 0 {
        return Err(LiveUpdateError::Config("--live-update and --functions must be at least 1".into()));
    }
    if cfg.queue_size < 2 || !cfg.queue_size.is_power_of_two() {
        return Err(LiveUpdateError::Config(format!(
            "queue size {} is not a power of two >= 2",
            cfg.queue_size
        )));
    }
    if cfg.data_mib == 0 {
        return Err(LiveUpdateError::Config("--data-mib must be at least 1".into()));
    }
    let binary = daemon_binary(cfg.daemon.as_deref())?;
    let dir = tempfile::Builder::new().prefix("virtiofs-bench-lu").tempdir()?;
    let log = dir.path().join("daemon.log");
    let r = run_in(cfg, &binary, dir.path(), &log, progress, wall);
    with_daemon_log(r, &log).map(|(mut rep, warnings)| {
        rep.daemon_log_warnings = warnings;
        rep.wall_s = wall.elapsed().as_secs_f64();
        rep
    })
}

/// A run's result `r` with the warnings of the daemon's log `log` (the daemon has stopped: its
/// guard was dropped, so its log is whole); a failed run prints the log's last lines.
pub(crate) fn with_daemon_log<T>(
    r: Result<T, LiveUpdateError>,
    log: &Path,
) -> Result<(T, Vec<String>), LiveUpdateError> {
    let lines = std::fs::read_to_string(log).unwrap_or_default();
    match r {
        Ok(rep) => Ok((rep, warnings(&lines))),
        Err(e) => {
            let all: Vec<&str> = lines.lines().collect();
            eprintln!("virtiofs-bench: the last lines of the daemon's log:");
            for l in &all[all.len().saturating_sub(40)..] {
                eprintln!("  {l}");
            }
            Err(e)
        }
    }
}

/// The daemon binary: `asked`, or `virtiofs-dpu` beside this executable.
pub fn daemon_binary(asked: Option<&Path>) -> Result<PathBuf, LiveUpdateError> {
    let path = match asked {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("virtiofs-dpu"))
            .ok_or_else(|| LiveUpdateError::Daemon("this executable has no directory".into()))?,
    };
    if !path.is_file() {
        return Err(LiveUpdateError::Daemon(format!(
            "the daemon binary {} does not exist: build it with `cargo build --release -p virtiofs-dpu` \
             (or name one with --daemon PATH)",
            path.display()
        )));
    }
    // Absolute, so that the daemon started in the temporary directory finds itself again.
    Ok(path.canonicalize()?)
}

/// The log lines at WARN or ERROR level.
pub(crate) fn warnings(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| matches!(l.split_whitespace().nth(1), Some("WARN" | "ERROR")))
        .map(str::to_string)
        .collect()
}

/// The measured function's data file, and what a closed loop over it needs.
#[derive(Debug, Clone, Copy)]
struct Target {
    node: u64,
    fh: u64,
    /// 4 KiB blocks in it.
    blocks: u64,
}

/// The body of [`run`]: everything in `dir`, the daemon's output in `log`.
fn run_in(
    cfg: &LiveUpdateConfig,
    binary: &Path,
    dir: &Path,
    log: &Path,
    progress: &mut dyn FnMut(&str),
    wall: Instant,
) -> Result<LiveUpdateReport, LiveUpdateError> {
    let machine = Machine::probe();
    let dirs = cfg.files.div_ceil(FILES_PER_DIR);
    let sockets: Vec<PathBuf> = (0..cfg.functions).map(|i| dir.join(format!("fs{i}.sock"))).collect();
    let ctl = dir.join("ctl.sock");
    let profile = dir.join("profile.toml");
    let share = dir.join("share");
    if cfg.backend == UpdateBackend::Shared {
        std::fs::create_dir(&share)?;
    }
    std::fs::write(&profile, profile_text(cfg, dir, &sockets, dirs))?;
    progress(&format!("starting {} with {} function(s)", binary.display(), cfg.functions));
    let mut daemon = Daemon::start(binary, cfg, &profile, &sockets, &ctl, log)?;
    daemon.serving = Some(serving_pid(&ctl)?);

    // Function 0, measured; the others brought up and idle, as other guests' functions are.
    let opts = DriverOptions {
        queue_size: cfg.queue_size,
        request_queues: 1,
        use_interrupts: true,
        timeout: DRIVER_TIMEOUT,
        ..Default::default()
    };
    let mut d = FsDriver::connect(&sockets[0], opts.clone())?;
    let init = d.init()?;
    let mut idle = Vec::new();
    for s in &sockets[1..] {
        let mut o = FsDriver::connect(s, DriverOptions { mem_size: 4 << 20, ..opts.clone() })?;
        o.init()?;
        idle.push(o);
    }
    let q = d.queue_size(1);
    let max_request =
        (init.max_write as usize).min(usize::from(init.max_pages) * virtiofs_tools::driver::PAGE_SIZE);

    let t = Instant::now();
    progress(&format!(
        "filling function 0: {} MiB of data, {} files in {dirs} directories",
        cfg.data_mib, cfg.files
    ));
    let target = fill(&mut d, cfg, dirs, max_request, progress)?;
    let fill_s = t.elapsed().as_secs_f64();

    progress("one update before measuring (not counted)");
    let warm = update(&ctl)?;
    daemon.serving = Some(warm.new_pid);
    let version = warm.version.clone();
    let mut pace = Pacing { estimate: warm.rpc, last_answer: Instant::now(), old_pid: warm.old_pid };

    let mut phases = Vec::new();
    for depth in [1, usize::from(q)] {
        let p = measure(&mut d, target, depth, cfg, &ctl, &mut pace, &mut daemon, progress)?;
        phases.push(p);
    }

    // The guest goes on after the updates: the data is still there.
    let got = d.read(target.node, target.fh, 0, BLOCK as u32)?;
    if got != pattern(0, BLOCK) {
        return Err(LiveUpdateError::Daemon("the data file's first block changed".into()));
    }
    d.release(target.node, target.fh)?;
    d.shutdown()?;
    for o in idle {
        o.shutdown()?;
    }
    let status = daemon.stop();
    if !status.is_some_and(|s| s.success()) {
        return Err(LiveUpdateError::Daemon(format!(
            "the daemon did not stop cleanly on SIGTERM: {status:?}"
        )));
    }
    Ok(LiveUpdateReport {
        machine,
        daemon: binary.display().to_string(),
        version,
        functions: cfg.functions,
        data_mib: cfg.data_mib,
        files: cfg.files,
        backend: cfg.backend,
        directories: dirs,
        queue_size: q,
        fill_s,
        warmup_rpc_ms: ms(warm.rpc),
        warmup_handover_ms: warm.handover_ms,
        phases,
        daemon_log_warnings: Vec::new(),
        wall_s: wall.elapsed().as_secs_f64(),
    })
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `a - b` in ms.
fn signed_ms(a: Instant, b: Instant) -> f64 {
    if a >= b {
        ms(a - b)
    } else {
        -ms(b - a)
    }
}

/// A TOML basic string of `s`.
fn toml_str(s: &str) -> String {
    // JSON's string escapes are a subset of TOML's basic string's.
    serde_json::to_string(s).unwrap_or_default()
}

/// The daemon's profile: the queue size and a RAM filesystem large enough for the data and
/// the files; with several functions, a `[[function]]` table each. With a shared directory
/// (`dir/share`, function 0's), `dir` is the sandbox's root; a single function's share is
/// given on the command line ([`Daemon::start`]).
fn profile_text(cfg: &LiveUpdateConfig, dir: &Path, sockets: &[PathBuf], dirs: u64) -> String {
    let mut s = String::from("description = \"virtiofs-bench --live-update\"\n");
    s += &format!("queue_size = {}\n", cfg.queue_size);
    let shared = cfg.backend == UpdateBackend::Shared;
    // The data in 64 KiB slots, with room to spare.
    let ram = format!(
        "ramfs_size = {}\nramfs_inodes = {}\n",
        (cfg.data_mib + 64) * MIB,
        (cfg.files + dirs + 2 + 1024).max(65536)
    );
    if sockets.len() > 1 && shared {
        s += &format!("sandbox_root = {}\n", toml_str(&dir.display().to_string()));
    } else if !shared {
        s += &ram;
    }
    if sockets.len() > 1 {
        for (i, p) in sockets.iter().enumerate() {
            s += &format!(
                "\n[[function]]\ntag = \"lu{i}\"\nsocket_path = {}\n",
                toml_str(&p.display().to_string())
            );
            match (i, shared) {
                (0, true) => {
                    s += &format!("shared_dir = {}\n", toml_str(&dir.join("share").display().to_string()))
                }
                (_, true) => s += &ram,
                _ => {}
            }
        }
    }
    s
}

/// The 8 bytes at `offset` (a multiple of 8) of the data file, little-endian.
fn pattern_word(offset: u64) -> u64 {
    (offset / 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995_a5a5_0f0f
}

/// `len` bytes of the data file from `offset` (both multiples of 8).
fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64 / 8).flat_map(|w| pattern_word(offset + 8 * w).to_le_bytes()).collect()
}

/// The offset of the first 8 bytes of `data`, read at `offset` (a multiple of 8), that are not
/// the data file's.
fn first_wrong(data: &[u8], offset: u64) -> Option<u64> {
    let words = data.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
    let at = words.zip(0u64..).position(|(w, i)| w != pattern_word(offset + 8 * i));
    at.map(|i| offset + 8 * i as u64).or_else(|| (!data.len().is_multiple_of(8)).then_some(offset))
}

/// Fills function 0: the data file (left open, its handle returned) and the empty files.
fn fill(
    d: &mut FsDriver,
    cfg: &LiveUpdateConfig,
    dirs: u64,
    max_request: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Target, LiveUpdateError> {
    let (e, o) = d.create(ROOT, "data", 0o644, libc::O_RDWR as u32)?;
    let size = cfg.data_mib * MIB;
    let chunk = max_request.clamp(BLOCK, MIB as usize) as u64;
    let mut off = 0;
    while off < size {
        let n = chunk.min(size - off);
        let w = d.write(e.nodeid, o.fh, off, &pattern(off, n as usize))?;
        if u64::from(w) != n {
            return Err(LiveUpdateError::Daemon(format!("short write at {off}: {w} of {n} bytes")));
        }
        off += n;
    }
    let mut made = 0;
    for i in 0..dirs {
        let parent = d.mkdir(ROOT, &format!("d{i:04}"), 0o755)?.nodeid;
        for _ in 0..FILES_PER_DIR.min(cfg.files - made) {
            d.mknod(parent, &format!("f{made:07}"), libc::S_IFREG | 0o644, 0)?;
            made += 1;
            if made.is_multiple_of(20_000) {
                progress(&format!("  {made} files"));
            }
        }
    }
    Ok(Target { node: e.nodeid, fh: o.fh, blocks: size / BLOCK as u64 })
}

/// An update's answer.
#[derive(Debug, Clone)]
struct Updated {
    /// From the call to the answer.
    rpc: Duration,
    handover_ms: f64,
    /// The old process's `phases` of it, as the answer gives them (freeze, save, send, ready;
    /// precopy).
    phases: String,
    new_pid: u32,
    /// The process that handed over (it exits [`OLD_EXIT`] after the answer).
    old_pid: u32,
    version: String,
}

/// Calls `live_update` on the control socket `ctl`.
fn update(ctl: &Path) -> Result<Updated, LiveUpdateError> {
    let mut c = ControlClient::connect(ctl)?;
    c.set_timeout(RPC_TIMEOUT)?;
    let t = Instant::now();
    let v = c.call("live_update", json!({}))?;
    let rpc = t.elapsed();
    let bad = || LiveUpdateError::Daemon(format!("live_update answered {v}"));
    Ok(Updated {
        rpc,
        handover_ms: v["handover_ms"].as_f64().ok_or_else(bad)?,
        phases: phases(&v["phases"]),
        new_pid: v["new_pid"].as_u64().and_then(|p| u32::try_from(p).ok()).ok_or_else(bad)?,
        old_pid: v["old_pid"].as_u64().and_then(|p| u32::try_from(p).ok()).ok_or_else(bad)?,
        version: v["new_version"].as_str().unwrap_or("?").to_string(),
    })
}

/// The `phases` of an answer in one line: `freeze 0.2, save 0.0, send 0.1, ready 2.0;
/// precopy 440.2` (the copy ahead of the quiet point, while the function serves, last: it is
/// not in the handover).
fn phases(v: &Value) -> String {
    let one = |k: &str| format!("{} {:.1}", k, v[format!("{k}_ms")].as_f64().unwrap_or(f64::NAN));
    format!("{}; {}", ["freeze", "save", "send", "ready"].map(one).join(", "), one("precopy"))
}

/// The serving process's id, from `get_device`.
pub(crate) fn serving_pid(ctl: &Path) -> Result<u32, LiveUpdateError> {
    let v = ControlClient::connect(ctl)?.call("get_device", Value::Null)?;
    v["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .ok_or_else(|| LiveUpdateError::Daemon(format!("get_device answered {v}")))
}

/// An update the measuring thread asked for, as the updating thread did it.
struct Done {
    /// When the call was made and answered.
    start: Instant,
    end: Instant,
    /// The previous update's process was still exiting at `start`'s planned time.
    waited: bool,
    result: Result<Updated, String>,
}

/// What the measuring thread asks of the updating thread: an update at `at`, once the
/// process `old` (the previous update's) has exited.
struct Go {
    at: Instant,
    old: Option<u32>,
}

/// The updating thread: for each [`Go`] it receives, waits until then and updates the daemon
/// once; ends when the measuring thread drops its sender.
fn updater(ctl: &Path, go: mpsc::Receiver<Go>, done: mpsc::Sender<Done>) {
    for Go { at, old } in go {
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        // The previous update's process still exiting: wait for it, and as long again as a
        // process takes to be gone after its exit.
        let mut waited = false;
        let bound = Instant::now() + STOP_BOUND;
        while old.is_some_and(running) && Instant::now() < bound {
            waited = true;
            std::thread::sleep(Duration::from_millis(1));
        }
        if waited {
            std::thread::sleep(Duration::from_millis(20));
        }
        let start = Instant::now();
        let result = update(ctl).map_err(|e| virtiofs_dpu::error_chain(&e));
        if done.send(Done { start, end: Instant::now(), waited, result }).is_err() {
            return;
        }
    }
}

/// Whether process `pid` exists and has not exited (a zombie has).
fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    stat.rsplit_once(')')
        .and_then(|(_, r)| r.split_whitespace().next())
        .is_some_and(|st| st != "Z" && st != "X")
}

/// The read at issue `seq` of a chunk salted `salt`: its offset in the data file.
fn offset_of(seq: u64, salt: u64, blocks: u64) -> u64 {
    // splitmix64
    let mut z =
        seq.wrapping_add(salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % blocks.max(1)) * BLOCK as u64
}

/// One chunk of the measuring loop: 4 KiB random reads at `depth` for `len`, each completion's
/// time (ns since `base`) pushed to `times`, each reply's data checked. Returns the requests
/// completed.
fn chunk(
    d: &mut FsDriver,
    t: Target,
    depth: usize,
    len: Duration,
    salt: u64,
    base: Instant,
    times: &mut Vec<u64>,
) -> Result<u64, DriverError> {
    let mut cfg = LoopConfig::new(depth, u64::MAX);
    cfg.max_data = BLOCK;
    cfg.duration = Some(len);
    let make =
        |seq: u64, s: &mut IoSpec| rw_request(s, t.node, t.fh, offset_of(seq, salt, t.blocks), BLOCK, false);
    let check = |c: &IoDone<'_>| -> Result<(), DriverError> {
        times.push(base.elapsed().as_nanos() as u64);
        check_rw(c, BLOCK, false)?;
        let off = offset_of(c.seq, salt, t.blocks);
        if let Some(at) = first_wrong(&c.reply_data()?, off) {
            return Err(DriverError::BadReply {
                opcode: c.opcode,
                reason: format!("READ of the data file at {off}: wrong data at {at}"),
            });
        }
        Ok(())
    };
    Ok(d.run_closed_loop(&cfg, make, check)?.completed)
}

/// The wait before update `i` (200-300 ms, spread evenly over the updates).
fn gap_before(i: usize, n: usize) -> Duration {
    GAP_MIN + Duration::from_millis(GAP_SPREAD_MS * (i as u64 * 7 % n.max(1) as u64) / n.max(1) as u64)
}

/// The pace of the updates, carried from one to the next.
#[derive(Debug, Clone, Copy)]
struct Pacing {
    /// The longest RPC time so far, which sizes the loop's chunks.
    estimate: Duration,
    /// The last update's answer, and the process that handed over then.
    last_answer: Instant,
    old_pid: u32,
}

/// `cfg.updates` updates while the driver reads at `depth`: the phase's report.
#[allow(clippy::too_many_arguments)]
fn measure(
    d: &mut FsDriver,
    t: Target,
    depth: usize,
    cfg: &LiveUpdateConfig,
    ctl: &Path,
    pace: &mut Pacing,
    daemon: &mut Daemon,
    progress: &mut dyn FnMut(&str),
) -> Result<PhaseReport, LiveUpdateError> {
    let n = cfg.updates;
    let base = Instant::now();
    let ns = |at: Instant| at.saturating_duration_since(base).as_nanos() as u64;
    let (mut pauses, mut handovers, mut rpcs) = (Vec::new(), Vec::new(), Vec::new());
    let (mut quiet_gaps, mut quiet_at_ms) = (Vec::new(), Vec::new());
    let (mut completions, mut outside, mut straddled) = (0u64, 0u64, 0usize);
    let (mut outside_at, mut waited) = (0.0, 0);
    let mut salt = depth as u64 * 1_000_003;
    let started = Instant::now();
    let mut times: Vec<u64> = Vec::new();
    std::thread::scope(|sc| -> Result<(), LiveUpdateError> {
        let (go_tx, go_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        sc.spawn(move || updater(ctl, go_rx, done_tx));
        for i in 0..n {
            let now = Instant::now();
            // 200-300 ms after the previous update's process has gone.
            let at = (now + Duration::from_millis(20)).max(pace.last_answer + OLD_EXIT + gap_before(i, n));
            go_tx
                .send(Go { at, old: Some(pace.old_pid) })
                .map_err(|_| LiveUpdateError::Daemon("the updating thread ended".into()))?;
            times.clear();
            let mut starts = Vec::new();
            // The window's expected end, and a margin for the chunk to end after it.
            let mut len = (at - now) + pace.estimate * 3 / 2 + AFTER_ANSWER + Duration::from_millis(50);
            let mut done: Option<Done> = None;
            loop {
                starts.push(times.len());
                salt += 1;
                completions += chunk(d, t, depth, len, salt, base, &mut times)?;
                if done.is_none() {
                    match done_rx.try_recv() {
                        Ok(x) => done = Some(x),
                        Err(mpsc::TryRecvError::Empty) => {}
                        Err(mpsc::TryRecvError::Disconnected) => {
                            return Err(LiveUpdateError::Daemon("the updating thread ended".into()))
                        }
                    }
                }
                let last = times.last().copied().unwrap_or(0);
                len = match &done {
                    Some(x) if last >= ns(x.end + AFTER_ANSWER) => break,
                    Some(x) => (x.end + AFTER_ANSWER + Duration::from_millis(10))
                        .saturating_duration_since(Instant::now()),
                    None => (pace.estimate / 2).max(Duration::from_millis(50)),
                };
            }
            let done = done.expect("the loop ends with the answer");
            let u = done.result.map_err(|e| {
                LiveUpdateError::Daemon(format!("update {} of {n} at QD={depth} failed: {e}", i + 1))
            })?;
            daemon.serving = Some(u.new_pid);
            let previous_answer = pace.last_answer;
            *pace = Pacing { estimate: pace.estimate.max(u.rpc), last_answer: done.end, old_pid: u.old_pid };
            waited += usize::from(done.waited);
            let (from, to) = (ns(done.start), ns(done.end + AFTER_ANSWER));
            let pause = longest_gap(&times, from, to).ok_or_else(|| {
                LiveUpdateError::Daemon(format!("update {}: no completion around it", i + 1))
            })?;
            let boundary = |k: usize| k > 0 && k < times.len();
            let in_window = |k: usize| times[k] >= from && times[k - 1] <= to;
            straddled += usize::from(starts.iter().any(|&k| boundary(k) && in_window(k)));
            // The longest gap outside the window (not at a chunk boundary), and where it began.
            let (quiet, quiet_at) = times
                .windows(2)
                .enumerate()
                .filter(|&(k, w)| (w[1] < from || w[0] > to) && !starts.contains(&(k + 1)))
                .map(|(_, w)| (w[1] - w[0], w[0]))
                .max()
                .unwrap_or((0, 0));
            // From the answer before it: this update's, or the previous one's.
            let quiet_start = base + Duration::from_nanos(quiet_at);
            let quiet_after =
                signed_ms(quiet_start, if quiet_start < done.start { previous_answer } else { done.end });
            if quiet > outside {
                (outside, outside_at) = (quiet, quiet_after);
            }
            quiet_gaps.push(quiet as f64 / 1e6);
            quiet_at_ms.push(quiet_after);
            pauses.push(pause as f64 / 1e6);
            handovers.push(u.handover_ms);
            rpcs.push(ms(u.rpc));
            progress(&format!(
                "QD={depth} update {}/{n}: pause {:.2} ms, handover {:.2} ms ({}), RPC {:.1} ms",
                i + 1,
                pause as f64 / 1e6,
                u.handover_ms,
                u.phases,
                ms(u.rpc)
            ));
        }
        Ok(())
    })?;
    let pause_ms = Millis::of(&pauses);
    let target = if cfg.functions > 1 { TARGET_MANY_MS } else { TARGET_ONE_MS };
    Ok(PhaseReport {
        depth,
        updates: n,
        pause_ms,
        handover_ms: Millis::of(&handovers),
        rpc_ms: Millis::of(&rpcs),
        completions,
        iops: completions as f64 / started.elapsed().as_secs_f64(),
        longest_gap_outside_ms: outside as f64 / 1e6,
        longest_gap_outside_after_answer_ms: outside_at,
        boundaries_in_windows: straddled,
        waited_for_old_exit: waited,
        target_p99_ms: target,
        met: pause_ms.p99 <= target,
        pauses,
        handovers,
        quiet_gaps,
        quiet_gaps_after_answer: quiet_at_ms,
    })
}

/// The daemon this run started: its supervisor process, and the serving process last known.
/// Dropping it stops the daemon (SIGTERM; SIGKILL to its processes if it does not stop).
pub struct Daemon {
    child: Child,
    pub(crate) serving: Option<u32>,
    status: Option<ExitStatus>,
}

impl Daemon {
    /// Starts `binary` in `dir`'s profile with `--live-update`, its output to `log`, and waits
    /// for its sockets.
    fn start(
        binary: &Path,
        cfg: &LiveUpdateConfig,
        profile: &Path,
        sockets: &[PathBuf],
        ctl: &Path,
        log: &Path,
    ) -> Result<Daemon, LiveUpdateError> {
        let out = File::create(log)?;
        let mut cmd = Command::new(binary);
        cmd.arg("--config").arg(profile);
        if cfg.functions == 1 {
            cmd.arg("--socket-path").arg(&sockets[0]).args(["--tag", "lu0"]);
            if cfg.backend == UpdateBackend::Shared {
                let share = profile.parent().unwrap_or(Path::new("/")).join("share");
                cmd.arg("--shared-dir").arg(share);
            }
        }
        cmd.arg("--control-socket")
            .arg(ctl)
            .args(["--live-update", "--log-level", "info"])
            .current_dir(profile.parent().unwrap_or(Path::new("/")))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let waits: Vec<&Path> = sockets.iter().map(PathBuf::as_path).chain([ctl]).collect();
        Daemon::launch(cmd, binary, &waits)
    }

    /// Runs `cmd` (of `binary`) and waits for the sockets `waits` to appear.
    pub fn launch(mut cmd: Command, binary: &Path, waits: &[&Path]) -> Result<Daemon, LiveUpdateError> {
        let child = cmd
            .spawn()
            .map_err(|e| LiveUpdateError::Daemon(format!("cannot start {}: {e}", binary.display())))?;
        let mut d = Daemon { child, serving: None, status: None };
        let deadline = Instant::now() + START_BOUND;
        for &p in waits {
            while !p.exists() {
                if let Some(s) = d.child.try_wait()? {
                    d.status = Some(s);
                    return Err(LiveUpdateError::Daemon(format!("the daemon exited at start-up: {s}")));
                }
                if Instant::now() > deadline {
                    return Err(LiveUpdateError::Daemon(format!(
                        "{} did not appear within {START_BOUND:?}",
                        p.display()
                    )));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(d)
    }

    /// Stops the daemon: SIGTERM to the supervisor (it stops the serving process), then, if it
    /// is not gone within `STOP_BOUND`, SIGKILL to its children and to it. Its exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        if self.status.is_some() {
            return self.status;
        }
        let pid = self.child.id();
        let _ = virtiofs_dpu::sys::signal_process(pid, libc::SIGTERM);
        let deadline = Instant::now() + STOP_BOUND;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.status = Some(s);
                return self.status;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Its children (the serving process, a new one in the middle of an update), then it.
        for c in children_of(pid).into_iter().chain(self.serving) {
            if c == pid || !is_child_of(c, pid) {
                continue;
            }
            let _ = virtiofs_dpu::sys::signal_process(c, libc::SIGKILL);
        }
        let _ = self.child.kill();
        self.status = self.child.wait().ok();
        self.status
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The parent process id of `pid` (from /proc).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": the command may hold spaces and parentheses.
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

fn is_child_of(pid: u32, parent: u32) -> bool {
    parent_of(pid) == Some(parent)
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&c| is_child_of(c, pid))
        .collect()
}

/// The report as a table.
pub fn table(r: &LiveUpdateReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "live update of {} ({}): {} function(s), {} MiB of data and {} files in {} directories in function 0 ({}), queue size {}",
        r.daemon,
        r.version,
        r.functions,
        r.data_mib,
        r.files,
        r.directories,
        match r.backend {
            UpdateBackend::Ram => "a RAM filesystem",
            UpdateBackend::Shared => "a shared directory",
        },
        r.queue_size
    );
    let _ = writeln!(
        s,
        "machine: {} CPUs, {}; load at start {}",
        r.machine.nproc, r.machine.cpu_model, r.machine.loadavg_at_start
    );
    let _ = writeln!(
        s,
        "fill {:.2} s; the update before measuring: RPC {:.1} ms, handover {:.2} ms",
        r.fill_s, r.warmup_rpc_ms, r.warmup_handover_ms
    );
    let _ = writeln!(
        s,
        "{:>4} {:>3} | {:>8} {:>8} {:>8} | {:>9} {:>9} | {:>8} {:>8} | {:>11} {:>9} | {:>9} {:>6}",
        "QD",
        "N",
        "pause50",
        "pause99",
        "max",
        "handov50",
        "handovmax",
        "RPC50",
        "RPCmax",
        "completions",
        "IOPS",
        "quiet gap",
        "target"
    );
    for p in &r.phases {
        let _ = writeln!(
            s,
            "{:>4} {:>3} | {:>8.2} {:>8.2} {:>8.2} | {:>9.2} {:>9.2} | {:>8.1} {:>8.1} | {:>11} {:>9.0} | {:>9.2} {:>6}",
            p.depth,
            p.updates,
            p.pause_ms.p50,
            p.pause_ms.p99,
            p.pause_ms.max,
            p.handover_ms.p50,
            p.handover_ms.max,
            p.rpc_ms.p50,
            p.rpc_ms.max,
            p.completions,
            p.iops,
            p.longest_gap_outside_ms,
            if p.met { "met" } else { "MISSED" }
        );
    }
    let _ = writeln!(
        s,
        "(ms; pause: the longest gap between completions from the RPC to 50 ms after its answer; \
         quiet gap: the longest outside the updates; target: p99 pause <= {} ms)",
        r.phases.first().map_or(TARGET_ONE_MS, |p| p.target_p99_ms)
    );
    for p in &r.phases {
        let _ = writeln!(
            s,
            "QD={}: the longest quiet gap began {:.0} ms after an update's answer (the old process exits at 200 ms)",
            p.depth, p.longest_gap_outside_after_answer_ms
        );
    }
    for p in r.phases.iter().filter(|p| p.waited_for_old_exit > 0) {
        let _ = writeln!(
            s,
            "QD={}: {} update(s) waited for the previous update's process to exit",
            p.depth, p.waited_for_old_exit
        );
    }
    for p in r.phases.iter().filter(|p| p.boundaries_in_windows > 0) {
        let _ = writeln!(
            s,
            "QD={}: {} update window(s) had a chunk boundary of the measuring loop (its gap counts)",
            p.depth, p.boundaries_in_windows
        );
    }
    let _ = writeln!(s, "daemon log: {} warning/error line(s)", r.daemon_log_warnings.len());
    for l in r.daemon_log_warnings.iter().take(10) {
        let _ = writeln!(s, "  {l}");
    }
    let _ = writeln!(s, "wall time {:.1} s", r.wall_s);
    s
}

/// Whether every phase met its target.
pub fn met(r: &LiveUpdateReport) -> bool {
    r.phases.iter().all(|p| p.met)
}
