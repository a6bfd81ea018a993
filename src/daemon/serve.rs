//! Serving once started: the control socket, readiness, the statistics on SIGUSR1 (to the log
//! and the statistics file), the orderly stop on SIGINT or SIGTERM, bounded in time.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::process::ExitCode;
use std::sync::Arc;

use log::{error, info, warn};
use signal_hook::consts::{SIGHUP, SIGUSR1};
use virtiofs_device::stats::DeviceStats;

use crate::error_chain;
use crate::functions::FunctionSet;
use crate::ops::control_socket::{BoundControlSocket, ControlState};
use crate::ops::deploy;
use crate::FuseStats;

/// A started daemon, ready to serve.
pub struct Serving {
    pub(super) functions: Arc<FunctionSet>,
    pub(super) config: serde_json::Value,
    pub(super) control: Option<BoundControlSocket>,
    pub(super) notifier: Option<deploy::Notifier>,
    pub(super) signals: signal_hook::iterator::Signals,
    pub(super) stats_file: Option<StatsFile>,
    pub(super) started_at: std::time::Instant,
    pub(super) updater: Option<Arc<crate::update::Updater>>,
}

/// The statistics file: opened at start (a sandboxed daemon could not open it later), rewritten
/// in place at each report.
pub(super) struct StatsFile(File);

impl StatsFile {
    pub(super) fn create(path: &std::path::Path) -> std::io::Result<Self> {
        File::create(path).map(StatsFile)
    }

    /// Replaces the file's contents with the functions' statistics: the first one's as
    /// `device` and `fuse`, and with several functions every one under `functions`.
    fn write(&self, all: &[(String, DeviceStats, FuseStats)]) {
        let Some((_, stats, fuse)) = all.first() else { return };
        let mut report = serde_json::json!({ "device": stats, "fuse": fuse });
        if all.len() > 1 {
            let each: Vec<serde_json::Value> = all
                .iter()
                .map(|(tag, d, f)| serde_json::json!({"tag": tag, "device": d, "fuse": f}))
                .collect();
            report["functions"] = serde_json::Value::Array(each);
        }
        let mut text = report.to_string();
        text.push('\n');
        let r = self.0.set_len(0).and_then(|()| self.0.write_all_at(text.as_bytes(), 0));
        if let Err(e) = r {
            warn!("cannot write the statistics file: {e}");
        }
    }

    /// [`Self::write`] of the running functions.
    fn write_all(&self, functions: &FunctionSet) {
        let all: Vec<(String, DeviceStats, FuseStats)> = functions
            .tags()
            .into_iter()
            .filter_map(|t| functions.stats(Some(&t)).map(|(d, f)| (t, d, f)))
            .collect();
        self.write(&all);
    }
}

/// Serves the functions until a signal stops the daemon: the control socket, readiness, the
/// statistics on SIGUSR1, the orderly stop.
impl Serving {
    /// Serves until a signal stops the daemon; the exit status.
    pub fn serve(self) -> ExitCode {
        let Serving { functions, config, control, notifier, mut signals, stats_file, started_at, updater } =
            self;
        let control = match control {
            None => None,
            Some(bound) => {
                let state = ControlState {
                    functions: functions.clone(),
                    config,
                    started: started_at,
                    updater: updater.clone(),
                };
                match bound.serve(state) {
                    Ok(c) => {
                        info!("control socket {}", c.path().display());
                        Some(c)
                    }
                    Err(e) => {
                        error!("{}", error_chain(&e));
                        return ExitCode::FAILURE;
                    }
                }
            }
        };
        if let Some(n) = &notifier {
            match n.notify(&format!("READY=1\nMAINPID={}", std::process::id())) {
                Ok(()) => info!("told the service manager READY=1"),
                Err(e) => warn!("{}", error_chain(&e)),
            }
        }
        if let Some(u) = &updater {
            u.ready();
        }
        for sig in signals.forever() {
            match sig {
                SIGUSR1 => {
                    for tag in functions.tags() {
                        if let Some((d, fuse)) = functions.stats(Some(&tag)) {
                            log_stats(&tag, &d, &fuse);
                        }
                    }
                    if let Some(f) = &stats_file {
                        f.write_all(&functions);
                    }
                }
                SIGHUP => info!("SIGHUP: nothing to reload (the profile is read at start); ignored"),
                _ => {
                    info!("signal {sig}: shutting down");
                    exit_anyway_after(SHUTDOWN_BOUND);
                    break;
                }
            }
        }
        if let Some(Err(e)) = notifier.as_ref().map(|n| n.notify("STOPPING=1")) {
            warn!("{}", error_chain(&e));
        }
        let handed_over = updater.as_ref().is_some_and(|u| u.handed_over());
        match control {
            Some(c) if handed_over => c.stop_handed_over(),
            Some(c) => c.stop(),
            None => {}
        }
        let mut code = ExitCode::SUCCESS;
        let mut finals = Vec::new();
        for (tag, result, fuse) in functions.stop_all() {
            match result {
                Ok(stats) => {
                    let per_queue: Vec<String> =
                        stats.requests().iter().enumerate().map(|(i, n)| format!("q{i}={n}")).collect();
                    info!("{tag}: requests per queue: {}", per_queue.join(" "));
                    info!("{tag}: bad chains per queue: {:?}", stats.bad_chains());
                    finals.push((tag, stats, fuse));
                }
                Err(e) => {
                    error!("{tag}: {}", error_chain(&e));
                    code = ExitCode::FAILURE;
                }
            }
        }
        // After a live update the file is the new process's.
        if let Some(f) = stats_file.as_ref().filter(|_| !handed_over) {
            f.write(&finals);
        }
        code
    }
}

/// SIGUSR1: the statistics in the log, one line for the queues and one for the classes.
fn log_stats(tag: &str, d: &DeviceStats, fuse: &FuseStats) {
    let queues: Vec<String> = d
        .queues
        .iter()
        .map(|q| {
            format!(
                "q{}: requests={} read={}B written={}B errors={} bad_chains={} interrupts={} doorbells={} in_flight={} waiting={}",
                q.queue, q.requests, q.bytes_read, q.bytes_written, q.errors, q.bad_chains, q.interrupts, q.doorbells, q.in_flight, q.waiting
            )
        })
        .collect();
    info!("statistics of {tag}: {}", queues.join("; "));
    let classes: Vec<String> = d
        .classes
        .iter()
        .filter(|c| c.requests > 0)
        .map(|c| {
            let l = &c.latency;
            format!(
                "{}: requests={} errors={} p50={:.2}us p99={:.2}us p99.9={:.2}us max={:.2}us",
                c.class.name(),
                c.requests,
                c.errors,
                l.p50_ns as f64 / 1e3,
                l.p99_ns as f64 / 1e3,
                l.p999_ns as f64 / 1e3,
                l.max_ns as f64 / 1e3
            )
        })
        .collect();
    info!("statistics: {}", if classes.is_empty() { "no requests".to_string() } else { classes.join("; ") });
    let pollers: Vec<String> = d
        .pollers
        .iter()
        .map(|p| {
            format!(
                "poller {}: busy={}ms idle={}ms parks={}",
                p.poller,
                p.busy_ns / 1_000_000,
                p.idle_ns / 1_000_000,
                p.parks
            )
        })
        .collect();
    info!(
        "statistics: {}; lock requests getlk={} setlk={} setlkw={}",
        pollers.join("; "),
        fuse.locks.getlk,
        fuse.locks.setlk,
        fuse.locks.setlkw
    );
}

/// How long a signalled daemon may take to stop before it exits anyway.
const SHUTDOWN_BOUND: std::time::Duration = std::time::Duration::from_millis(800);

/// Ends the process `bound` from now if the orderly stop has not finished by then: no client can
/// keep the daemon alive after SIGTERM (a thread stuck on a descriptor the client controls).
fn exit_anyway_after(bound: std::time::Duration) {
    let _ = std::thread::Builder::new().name("shutdown-bound".into()).spawn(move || {
        // park_timeout (a futex wait) rather than sleep: nanosleep is not in the seccomp allowlist.
        let deadline = std::time::Instant::now() + bound;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            std::thread::park_timeout(left);
        }
        error!("shutdown did not finish within {bound:?}; exiting");
        std::process::exit(1);
    });
}
