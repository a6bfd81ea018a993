//! `virtiofs-dpu --shared-dir DIR` as a subprocess: it serves the directory, runs with
//! `no_new_privs` and only the capabilities it keeps, and refuses a directory it cannot open.

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use virtiofs_backend::passthrough::sandbox;
use virtiofs_tools::{DriverOptions, FsDriver};

const BIN: &str = env!("CARGO_BIN_EXE_virtiofs-dpu");

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: plain system call on our own child's pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn wait_for_socket(path: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(path).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("daemon exited early: {status}");
        }
        assert!(Instant::now() < deadline, "socket never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn status_field(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("{key} not in /proc/{pid}/status"))
}

#[test]
fn daemon_serves_a_directory_with_reduced_privileges() {
    let base = tempfile::tempdir().unwrap();
    let share = base.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let sock = base.path().join("d.sock");
    let child = Command::new(BIN)
        .args(["--socket-path", sock.to_str().unwrap(), "--shared-dir", share.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut daemon = Daemon(child);
    wait_for_socket(&sock, &mut daemon.0);
    let pid = daemon.0.id();
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let kept = format!("{:016x}", sandbox::kept_mask());
        assert_eq!(status_field(pid, "CapEff:"), kept, "effective capabilities");
        assert_eq!(status_field(pid, "CapPrm:"), kept, "permitted capabilities");
        assert_eq!(status_field(pid, "CapBnd:"), kept, "bounding set");
        assert_eq!(status_field(pid, "CapInh:"), "0000000000000000");
        // Every thread (the pollers included) has the reduced set.
        for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let tid: u32 = t.unwrap().file_name().to_str().unwrap().parse().unwrap();
            let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
            assert!(s.contains(&format!("CapEff:\t{kept}")), "thread {tid}");
        }
    }
    // It serves the directory, with what the kept capabilities allow guest root to do.
    // The probe connection of wait_for_socket may still be held by the server for a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut d = loop {
        match FsDriver::connect(&sock, DriverOptions::default()) {
            Ok(d) => break d,
            Err(e) if Instant::now() < deadline => {
                eprintln!("connect: {e:?}; retrying");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("cannot connect: {e:?}"),
        }
    };
    d.init().unwrap();
    let (e, o) = d.create(1, "file", 0o644, libc::O_RDWR as u32).unwrap();
    d.write(e.nodeid, o.fh, 0, b"served").unwrap();
    d.release(e.nodeid, o.fh).unwrap();
    assert_eq!(std::fs::read(share.join("file")).unwrap(), b"served");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let s = virtiofs_tools::fuse_abi::SetattrIn {
            valid: 2 | 4, // FATTR_UID | FATTR_GID
            uid: 1234,
            gid: 1234,
            ..Default::default()
        };
        d.setattr(e.nodeid, &s).unwrap();
        assert_eq!(std::fs::metadata(share.join("file")).unwrap().uid(), 1234);
        d.mknod(1, "fifo", libc::S_IFIFO | 0o600, 0).unwrap();
    }
    d.shutdown().unwrap();
}

#[test]
fn daemon_refuses_a_missing_directory() {
    let base = tempfile::tempdir().unwrap();
    let sock = base.path().join("d.sock");
    let out = Command::new(BIN)
        .args(["--socket-path", sock.to_str().unwrap(), "--shared-dir", "/nonexistent/share/dir"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/share/dir"), "{err}");
    let file = base.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let out = Command::new(BIN)
        .args(["--socket-path", sock.to_str().unwrap(), "--shared-dir", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
