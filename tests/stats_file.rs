//! The daemon's `--stats-file`: the device's and the FUSE side's statistics as JSON, on SIGUSR1
//! while it runs and at exit, after a workload through the host driver model.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use virtiofs_device::stats::DeviceStats;
use virtiofs_dpu::FuseStats;
use virtiofs_tools::{DriverOptions, FsDriver, LockReq};

const BIN: &str = env!("CARGO_BIN_EXE_virtiofs-dpu");

fn kill(child: &Child, sig: &str) {
    let st = Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap();
    assert!(st.success());
}

/// Waits until `path` holds a complete report written after `after` requests on queue 1.
fn read_report(path: &Path, min_requests: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
            let dev: DeviceStats = serde_json::from_value(v["device"].clone()).expect("device stats");
            if dev.requests().iter().sum::<u64>() >= min_requests {
                return v;
            }
        }
        assert!(Instant::now() < deadline, "no report with {min_requests} requests in {text:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn stats_file_on_sigusr1_and_at_exit() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("d.sock");
    let stats = dir.path().join("stats.json");
    let mut child = Command::new(BIN)
        .args(["--socket-path", sock.to_str().unwrap(), "--stats-file", stats.to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // The socket is bound before the statistics file is made: wait for both.
    while !sock.exists() || !stats.exists() {
        assert!(Instant::now() < deadline, "daemon did not listen and make its statistics file");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(std::fs::read(&stats).unwrap(), b"", "created empty at start");
    let mut d = FsDriver::connect(&sock, DriverOptions::default()).expect("driver brings the device up");
    d.init().unwrap();
    for _ in 0..100 {
        d.getattr(1).unwrap();
    }
    // Two lock requests, which the FUSE side counts.
    let (e, o) = d.create(1, "locked", 0o644, libc::O_RDWR as u32).unwrap();
    let lock = |typ| LockReq { fh: o.fh, owner: 7, typ, start: 0, end: u64::MAX >> 1, pid: 70, flock: false };
    d.setlk(e.nodeid, &lock(libc::F_WRLCK)).unwrap();
    d.setlk(e.nodeid, &lock(libc::F_UNLCK)).unwrap();

    kill(&child, "-USR1");
    let running = read_report(&stats, 104);
    let fuse: FuseStats = serde_json::from_value(running["fuse"].clone()).expect("FUSE statistics");
    assert_eq!((fuse.locks.setlk, fuse.locks.setlkw, fuse.locks.waited), (2, 0, 0), "{fuse:?}");
    assert_eq!(fuse.io, None, "no io_uring engine on the RAM filesystem");
    let dev: DeviceStats = serde_json::from_value(running["device"].clone()).unwrap();
    assert_eq!(dev.queues.len(), 2, "hiprio + 1 request queue");
    assert!(dev.queues[1].requests >= 104, "INIT, 100 GETATTRs, CREATE, 2 SETLKs on queue 1: {dev:?}");
    assert_eq!((dev.queues[1].in_flight, dev.queues[1].waiting), (0, 0));
    assert_eq!(dev.pollers.len(), 1);
    let p = &dev.pollers[0];
    assert!(p.rounds > 0 && p.busy_ns + p.idle_ns > 0, "{p:?}");

    for _ in 0..50 {
        d.getattr(1).unwrap();
    }
    d.shutdown().unwrap();
    kill(&child, "-TERM");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "daemon did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    let at_exit = read_report(&stats, 154);
    let dev: DeviceStats = serde_json::from_value(at_exit["device"].clone()).unwrap();
    assert!(dev.queues[1].requests >= 154, "{dev:?}");
    assert!(dev.pollers[0].rounds >= running["device"]["pollers"][0]["rounds"].as_u64().unwrap());
}
