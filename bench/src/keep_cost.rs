//! `--keep-cost N`: what keeping a shared directory for a crash costs its metadata operations
//! (issue 24).
//!
//! A supervised daemon (`--live-update`) keeps every node's and open handle's descriptor in its
//! supervisor (queued as they are made and let go, one message on the checkpoint channel per
//! poller round that made some) and the node table's counts in shared records (stores). READ
//! and WRITE pay nothing; LOOKUP of a known node three stores; a round of LOOKUPs that make
//! nodes, or of CREATEs, a message. This runs the daemon binary with one shared directory (in the run's
//! temporary directory) twice per round, with and without `--live-update`, in alternating
//! order, and per run: N CREATE+RELEASE pairs, N LOOKUPs of the nodes the kernel holds, then,
//! after forgetting them all, N LOOKUPs that each make a node again, and the same with 16 in
//! flight (a guest's processes walking paths at once); rates per second, medians
//! over the rounds and the median of the per-round ratios (kept / not kept).

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use virtiofs_tools::driver::{DriverOptions, FsDriver};
use virtiofs_tools::fuse_abi::{opcode, EntryOut};

use crate::live_update::{daemon_binary, Daemon, LiveUpdateError};
use crate::Machine;

const ROOT: u64 = 1;

/// What `--keep-cost` runs.
#[derive(Debug, Clone)]
pub struct KeepCostConfig {
    /// The daemon binary (`None`: `virtiofs-dpu` beside this executable).
    pub daemon: Option<std::path::PathBuf>,
    /// Files (operations of each kind) per run.
    pub files: usize,
    /// Rounds (each runs the daemon kept and not kept).
    pub rounds: usize,
}

/// One run's rates (operations per second).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Rates {
    /// CREATE then RELEASE, per pair.
    pub create_release: f64,
    /// LOOKUP of a node the kernel holds.
    pub lookup_known: f64,
    /// LOOKUP that makes a node.
    pub lookup_new: f64,
    /// LOOKUP that makes a node, 16 in flight.
    pub lookup_new_qd16: f64,
}

/// What `--keep-cost` measured.
#[derive(Debug, Clone, Serialize)]
pub struct KeepCostReport {
    /// The machine.
    pub machine: Machine,
    /// The daemon binary run.
    pub daemon: String,
    /// Files per run.
    pub files: usize,
    /// Each round's (kept, not kept) rates.
    pub rounds: Vec<(Rates, Rates)>,
    /// Seconds the whole run took.
    pub wall_s: f64,
}

fn one(binary: &Path, kept: bool, files: usize) -> Result<Rates, LiveUpdateError> {
    let dir = tempfile::Builder::new().prefix("virtiofs-bench-keep").tempdir()?;
    let share = dir.path().join("share");
    std::fs::create_dir(&share)?;
    let (sock, ctl) = (dir.path().join("fs.sock"), dir.path().join("ctl.sock"));
    let out = File::create(dir.path().join("daemon.log"))?;
    let mut cmd = Command::new(binary);
    cmd.arg("--socket-path").arg(&sock).arg("--shared-dir").arg(&share).args(["--tag", "keep"]);
    let mut waits = vec![sock.as_path()];
    if kept {
        cmd.arg("--live-update").arg("--control-socket").arg(&ctl);
        waits.push(&ctl);
    }
    cmd.current_dir(dir.path()).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
    let mut daemon = Daemon::launch(cmd, binary, &waits)?;
    let mut d = FsDriver::connect(&sock, DriverOptions::default())?;
    d.init()?;
    let rate = |t: Instant| files as f64 / t.elapsed().as_secs_f64().max(1e-9);
    let t = Instant::now();
    let mut ids = Vec::with_capacity(files);
    for i in 0..files {
        let (e, o) = d.create(ROOT, &format!("f{i}"), 0o644, libc::O_RDWR as u32)?;
        d.release(e.nodeid, o.fh)?;
        ids.push(e.nodeid);
    }
    let create_release = rate(t);
    let t = Instant::now();
    for i in 0..files {
        d.lookup(ROOT, &format!("f{i}"))?;
    }
    let lookup_known = rate(t);
    for &id in &ids {
        d.forget(id, 2)?;
    }
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    ids.clear();
    for i in 0..files {
        ids.push(d.lookup(ROOT, &format!("f{i}"))?.nodeid);
    }
    let lookup_new = rate(t);
    for &id in &ids {
        d.forget(id, 1)?;
    }
    std::thread::sleep(Duration::from_millis(50));
    let lookup_new_qd16 = lookups_in_flight(&mut d, files, 16)?;
    drop(d);
    daemon.stop();
    Ok(Rates { create_release, lookup_known, lookup_new, lookup_new_qd16 })
}

/// LOOKUPs of `f0`.. `f{files-1}` in the root with `depth` of them in flight (a guest's
/// processes walking paths at once): the rate per second.
fn lookups_in_flight(d: &mut FsDriver, files: usize, depth: usize) -> Result<f64, LiveUpdateError> {
    let t = Instant::now();
    let (mut next, mut done, mut in_flight) = (0usize, 0usize, 0usize);
    while done < files {
        while in_flight < depth && next < files {
            let name = format!("f{next}\0");
            d.submit(1, opcode::LOOKUP, ROOT, &[name.as_bytes()], &[], EntryOut::SIZE, 0)?;
            (next, in_flight) = (next + 1, in_flight + 1);
        }
        for c in d.wait_completions()? {
            let (h, _) = FsDriver::parse_reply(&c, opcode::LOOKUP, c.token)?;
            if h.error != 0 {
                return Err(LiveUpdateError::Config(format!("LOOKUP failed: errno {}", -h.error)));
            }
            (done, in_flight) = (done + 1, in_flight - 1);
        }
    }
    Ok(files as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

/// Runs the rounds; `progress` gets a line per run.
pub fn run(cfg: &KeepCostConfig, progress: &mut dyn FnMut(&str)) -> Result<KeepCostReport, LiveUpdateError> {
    let wall = Instant::now();
    if cfg.files == 0 || cfg.rounds == 0 {
        return Err(LiveUpdateError::Config("--keep-cost and --rounds must be at least 1".into()));
    }
    let binary = daemon_binary(cfg.daemon.as_deref())?;
    let mut rounds = Vec::with_capacity(cfg.rounds);
    for r in 0..cfg.rounds {
        let order = if r % 2 == 0 { [true, false] } else { [false, true] };
        let (mut k, mut n) = (None, None);
        for kept in order {
            let rates = one(&binary, kept, cfg.files)?;
            progress(&format!("round {r} kept={kept}: {rates:?}"));
            if kept {
                k = Some(rates);
            } else {
                n = Some(rates);
            }
        }
        if let (Some(k), Some(n)) = (k, n) {
            rounds.push((k, n));
        }
    }
    Ok(KeepCostReport {
        machine: Machine::probe(),
        daemon: binary.display().to_string(),
        files: cfg.files,
        rounds,
        wall_s: wall.elapsed().as_secs_f64(),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The report as a table.
pub fn table(r: &KeepCostReport) -> String {
    let mut s = format!(
        "crash keeping of a shared directory: {} ({} files, {} rounds)\n\n",
        r.daemon,
        r.files,
        r.rounds.len()
    );
    s += "| operation | kept (median /s) | not kept (median /s) | kept / not kept (median of rounds) |\n";
    s += "|---|---:|---:|---:|\n";
    type Pick = fn(&Rates) -> f64;
    let rows: [(&str, Pick); 4] = [
        ("CREATE + RELEASE", |x| x.create_release),
        ("LOOKUP of a known node", |x| x.lookup_known),
        ("LOOKUP making a node", |x| x.lookup_new),
        ("LOOKUP making a node, 16 in flight", |x| x.lookup_new_qd16),
    ];
    for (name, f) in rows {
        let kept = median(r.rounds.iter().map(|(k, _)| f(k)).collect());
        let not = median(r.rounds.iter().map(|(_, n)| f(n)).collect());
        let ratio = median(r.rounds.iter().map(|(k, n)| f(k) / f(n).max(1e-9)).collect());
        s += &format!("| {name} | {kept:.0} | {not:.0} | {ratio:.2} |\n");
    }
    s
}
