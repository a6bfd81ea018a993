//! `virtiofs-dpu --remote nfs://...` as a subprocess against nfs-ganesha: it serves the export
//! through the driver model, confined in the NFS mode of the sandbox (mount and IPC namespaces
//! of its own with an empty root, the host's network namespace, no capabilities, the seccomp
//! allowlist in `kill` mode), survives a server restart (its pollers reconnect under the
//! filter), writes the NFS counters into its statistics file, and refuses a bad URL or a
//! server that is not there.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use virtiofs_tools::{DriverOptions, FsDriver};

#[path = "../backend/tests/harness/ganesha.rs"]
mod ganesha;
use ganesha::Ganesha;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofs-dpu");
const RDWR: u32 = libc::O_RDWR as u32;

struct Daemon {
    child: Option<Child>,
    log: PathBuf,
    sock: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Daemon {
    fn start(base: &Path, extra: &[&str]) -> Daemon {
        let sock = base.join("d.sock");
        let log = base.join("daemon.log");
        let child = Command::new(BIN)
            .arg("--socket-path")
            .arg(&sock)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut d = Daemon { child: Some(child), log, sock };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !d.log().contains("listening on") {
            if let Ok(Some(status)) = d.child.as_mut().unwrap().try_wait() {
                panic!("daemon exited early: {status}\n{}", d.log());
            }
            assert!(Instant::now() < deadline, "daemon never got ready:\n{}", d.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn connect(&self) -> FsDriver {
        let mut d = FsDriver::connect(&self.sock, DriverOptions::default())
            .unwrap_or_else(|e| panic!("cannot connect: {e:?}\n{}", self.log()));
        d.init().unwrap();
        d
    }

    /// SIGTERM, and the exit status.
    fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        // SAFETY: a plain system call on our own child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        c.wait().unwrap()
    }
}

fn status_field(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("{key} not in /proc/{pid}/status"))
}

fn ns(pid: &str, which: &str) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/{which}")).unwrap()
}

/// Writes `name` through the device and checks it reads back, then closes it (FLUSH commits).
fn write_file(d: &mut FsDriver, name: &str, data: &[u8]) {
    let (e, o) = d.create(1, name, 0o644, RDWR).unwrap();
    assert_eq!(d.write(e.nodeid, o.fh, 0, data).unwrap() as usize, data.len());
    assert_eq!(d.read(e.nodeid, o.fh, 0, data.len() as u32 + 10).unwrap(), data);
    d.fsync(e.nodeid, o.fh, false).unwrap();
    d.flush(e.nodeid, o.fh).unwrap();
    d.release(e.nodeid, o.fh).unwrap();
}

#[test]
fn sandboxed_nfs_daemon_serves_the_export_and_reconnects_after_a_server_restart() {
    let mut server = Ganesha::start();
    let base = tempfile::tempdir().unwrap();
    std::fs::write(server.export().join("from-server"), b"on the export").unwrap();
    let stats = base.path().join("stats.json");
    let url = server.url();
    let mut daemon = Daemon::start(
        base.path(),
        &[
            "--remote",
            &url,
            "--sandbox",
            "namespace",
            "--seccomp",
            "kill",
            "--stats-file",
            stats.to_str().unwrap(),
        ],
    );
    let pid = daemon.pid();
    let log = daemon.log();
    assert!(log.contains("sandbox: new mount and IPC namespaces"), "{log}");
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    assert_eq!(status_field(pid, "Seccomp:"), "2");
    assert_eq!(status_field(pid, "CapEff:"), "0000000000000000", "no capabilities");
    assert_eq!(status_field(pid, "CapBnd:"), "0000000000000000", "empty bounding set");
    let p = pid.to_string();
    for which in ["mnt", "ipc"] {
        assert_ne!(ns(&p, which), ns("self", which), "{which} namespace is ours");
    }
    assert_eq!(ns(&p, "net"), ns("self", "net"), "the network namespace is kept (reconnects)");
    // Its root is an empty tmpfs, the only mount it sees.
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let points: Vec<&str> = mounts.lines().map(|l| l.split(' ').nth(4).unwrap()).collect();
    assert_eq!(points, ["/"], "mounts seen by the daemon:\n{mounts}");
    assert!(mounts.contains(" - tmpfs ") && mounts.contains(" ro,"), "{mounts}");
    assert_eq!(std::fs::read_dir(format!("/proc/{pid}/root")).unwrap().count(), 0, "an empty root");

    let mut d = daemon.connect();
    let e = d.lookup(1, "from-server").unwrap();
    let o = d.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(d.read(e.nodeid, o.fh, 0, 100).unwrap(), b"on the export");
    d.release(e.nodeid, o.fh).unwrap();
    let dir = d.mkdir(1, "dir", 0o755).unwrap();
    write_file(&mut d, "first", b"before the restart");
    assert_eq!(std::fs::read(server.export().join("first")).unwrap(), b"before the restart");
    assert!(server.export().join("dir").is_dir());
    assert_eq!(d.lookup(1, "dir").unwrap().nodeid, dir.nodeid);

    // The server crashes and comes back: the pollers reconnect (socket, connect under the
    // filter) and the next requests are served.
    server.kill();
    server.start_again();
    write_file(&mut d, "second", b"after the restart");
    assert_eq!(std::fs::read(server.export().join("second")).unwrap(), b"after the restart");
    let h = d.opendir(1).unwrap();
    let names: Vec<String> = d
        .readdir(1, h.fh, 0, 4096)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    for n in ["from-server", "dir", "first", "second"] {
        assert!(names.iter().any(|x| x == n), "{n} not in {names:?}");
    }
    d.shutdown().unwrap();

    let status = daemon.stop();
    let log = daemon.log();
    assert!(status.success(), "daemon exit {status}:\n{log}");
    assert!(!log.contains("seccomp: system call"), "a call outside the allowlist:\n{log}");
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let nfs = &s["fuse"]["nfs"];
    assert!(nfs["requests"].as_u64().unwrap() > 0, "{s}");
    assert!(nfs["calls"].as_u64().unwrap() > 0, "{s}");
    assert!(nfs["reconnects"].as_u64().unwrap() >= 1, "the restart made a reconnect: {s}");
    for key in ["retransmits", "timed_out", "bad_replies"] {
        assert!(nfs[key].is_u64(), "{key} in {s}");
    }
}

#[test]
fn bad_urls_and_absent_servers_stop_the_daemon_with_a_message() {
    let base = tempfile::tempdir().unwrap();
    let sock = base.path().join("d.sock");
    let run = |args: &[&str]| {
        let out = Command::new(BIN).arg("--socket-path").arg(&sock).args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["--remote", "http://127.0.0.1/x"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("remote URL") && err.contains("nfs://"), "{err}");
    let (code, err) = run(&["--remote", "nfs://127.0.0.1/x", "--shared-dir", "/tmp"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, err) = run(&["--seccomp", "kill"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--seccomp needs --shared-dir or --remote"), "{err}");
    // A profile key out of range names itself.
    let profile = base.path().join("p.toml");
    std::fs::write(&profile, "remote = \"nfs://127.0.0.1/x\"\nnfs_slots = 0\n").unwrap();
    let (code, err) = run(&["--config", profile.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("nfs_slots"), "{err}");
    // Nothing listens on either port: the MOUNT fails at once (connection refused).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("nfs://127.0.0.1/x?nfsport={port}&mountport={port}");
    std::fs::write(&profile, "nfs_timeout_ms = 2000\nnfs_retransmit_ms = 500\n").unwrap();
    let t0 = Instant::now();
    let (code, err) = run(&["--remote", &url, "--config", profile.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("mounting the export"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
    assert!(!sock.exists(), "no socket is bound before the export is mounted");
}
