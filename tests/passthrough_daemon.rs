//! `virtiofs-dpu --shared-dir DIR` as a subprocess: it serves the directory, runs with
//! `no_new_privs`, only the capabilities it keeps, a seccomp filter on every thread and (as root)
//! in namespaces of its own whose root is the shared directory; and it refuses a directory it
//! cannot open.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use virtiofs_backend::passthrough::sandbox;
use virtiofs_tools::fuse_abi::{self as abi, opcode};
use virtiofs_tools::{DriverOptions, FsDriver};

const BIN: &str = env!("CARGO_BIN_EXE_virtiofs-dpu");
const RDWR: u32 = libc::O_RDWR as u32;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

struct Daemon {
    child: Child,
    log: PathBuf,
    sock: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: plain system call on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Starts the daemon on `share` (with `extra` options) and waits until it serves: its socket
    /// exists as soon as it is bound, before the daemon confines itself, so readiness is the
    /// control plane's "listening" line.
    fn start(base: &Path, share: &Path, extra: &[&str]) -> Daemon {
        let sock = base.join("d.sock");
        let log = base.join("daemon.log");
        let mut args = vec!["--socket-path", sock.to_str().unwrap(), "--shared-dir", share.to_str().unwrap()];
        args.extend_from_slice(extra);
        let child = Command::new(BIN)
            .args(&args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut d = Daemon { child, log, sock };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !d.log().contains("listening on") {
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!("daemon exited early: {status}\n{}", d.log());
            }
            assert!(Instant::now() < deadline, "daemon never got ready:\n{}", d.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn pid(&self) -> u32 {
        self.child.id()
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
}

fn status_field(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("{key} not in /proc/{pid}/status"))
}

/// Every thread of `pid` and its `/proc/.../status`.
fn thread_status(pid: u32) -> Vec<(u32, String)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| {
            let tid: u32 = t.unwrap().file_name().to_str().unwrap().parse().unwrap();
            (tid, std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap())
        })
        .collect()
}

fn new_share() -> (tempfile::TempDir, PathBuf) {
    let base = tempfile::tempdir().unwrap();
    let share = base.path().join("share");
    std::fs::create_dir(&share).unwrap();
    (base, share)
}

#[test]
fn daemon_serves_a_directory_with_reduced_privileges() {
    let (base, share) = new_share();
    let daemon = Daemon::start(base.path(), &share, &[]);
    let pid = daemon.pid();
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    assert_eq!(status_field(pid, "Seccomp:"), "2", "a seccomp filter by default");
    if is_root() {
        let kept = format!("{:016x}", sandbox::kept_mask());
        assert_eq!(status_field(pid, "CapEff:"), kept, "effective capabilities");
        assert_eq!(status_field(pid, "CapPrm:"), kept, "permitted capabilities");
        assert_eq!(status_field(pid, "CapBnd:"), kept, "bounding set");
        assert_eq!(status_field(pid, "CapInh:"), "0000000000000000");
        // Every thread (the pollers included) has the reduced set and the filters.
        for (tid, s) in thread_status(pid) {
            assert!(s.contains(&format!("CapEff:\t{kept}")), "thread {tid}");
            assert!(s.contains("Seccomp:\t2\n") && s.contains("Seccomp_filters:\t2\n"), "thread {tid}:\n{s}");
        }
    }
    // It serves the directory, with what the kept capabilities allow guest root to do.
    let mut d = daemon.connect();
    let (e, o) = d.create(1, "file", 0o644, RDWR).unwrap();
    d.write(e.nodeid, o.fh, 0, b"served").unwrap();
    d.release(e.nodeid, o.fh).unwrap();
    assert_eq!(std::fs::read(share.join("file")).unwrap(), b"served");
    if is_root() {
        let s = abi::SetattrIn {
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

fn ns(pid: &str, which: &str) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/{which}")).unwrap()
}

/// A raw request through the driver: errno (0 on success) and reply payload.
fn raw(d: &mut FsDriver, op: u32, node: u64, args: &[&[u8]], cap: usize) -> (i32, Vec<u8>) {
    let (h, p) = d.call(1, op, node, args, cap).unwrap();
    (-h.error, p)
}

/// As root the daemon lives in mount, IPC and network namespaces of its own whose root is the
/// shared directory, with no other mount in sight; the whole FUSE workload still works through
/// it, the data lands in the share, and nothing beside the share is touched.
#[test]
fn sandboxed_daemon_sees_only_the_shared_directory_and_still_serves_it() {
    if !is_root() {
        return; // namespaces need CAP_SYS_ADMIN: see the unprivileged test below
    }
    let (base, share) = new_share();
    std::fs::write(share.join("host-file"), b"from the host").unwrap();
    let canary = base.path().join("canary");
    std::fs::write(&canary, b"beside the share").unwrap();
    let canary_meta = std::fs::metadata(&canary).unwrap();
    let stats = base.path().join("stats.json");
    let mut daemon = Daemon::start(
        base.path(),
        &share,
        &["--sandbox", "namespace", "--seccomp", "kill", "--stats-file", stats.to_str().unwrap()],
    );
    let pid = daemon.pid().to_string();
    assert!(daemon.log().contains("sandbox: new mount, IPC and network namespaces"), "{}", daemon.log());
    for which in ["mnt", "net", "ipc"] {
        assert_ne!(ns(&pid, which), ns("self", which), "{which} namespace is ours");
    }
    assert_eq!(ns(&pid, "user"), ns("self", "user"), "no user namespace");
    // Its root is the shared directory (the same inode), and nothing else is mounted there.
    let root = std::fs::metadata(format!("/proc/{pid}/root")).unwrap();
    let want = std::fs::metadata(&share).unwrap();
    assert_eq!((root.dev(), root.ino()), (want.dev(), want.ino()), "root is the share");
    assert_eq!(std::fs::read(format!("/proc/{pid}/root/host-file")).unwrap(), b"from the host");
    let cwd = std::fs::metadata(format!("/proc/{pid}/cwd")).unwrap();
    assert_eq!((cwd.dev(), cwd.ino()), (want.dev(), want.ino()), "working directory is the root");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let points: Vec<&str> = mounts.lines().map(|l| l.split(' ').nth(4).unwrap()).collect();
    assert_eq!(points, ["/"], "mounts seen by the daemon:\n{mounts}");
    // Every thread is in the namespace and under the filter.
    for (tid, s) in thread_status(daemon.pid()) {
        let tns = std::fs::read_link(format!("/proc/{pid}/task/{tid}/ns/mnt")).unwrap();
        assert_eq!(tns, ns(&pid, "mnt"), "thread {tid}");
        assert!(s.contains("Seccomp:\t2\n"), "thread {tid}");
    }

    let mut d = daemon.connect();
    // LOOKUP of what the host put there.
    let host = d.lookup(1, "host-file").unwrap();
    let o = d.open(host.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(d.read(host.nodeid, o.fh, 0, 100).unwrap(), b"from the host");
    d.release(host.nodeid, o.fh).unwrap();
    // CREATE, WRITE, READ, FSYNC, SETATTR(size) without a handle (a path-based truncate through
    // /proc/self/fd), STATFS.
    let (e, o) = d.create(1, "file", 0o644, RDWR).unwrap();
    d.write(e.nodeid, o.fh, 0, b"written through the sandbox").unwrap();
    assert_eq!(d.read(e.nodeid, o.fh, 0, 100).unwrap(), b"written through the sandbox");
    d.fsync(e.nodeid, o.fh, false).unwrap();
    d.release(e.nodeid, o.fh).unwrap();
    d.truncate(e.nodeid, 7, None).unwrap();
    d.statfs(1).unwrap();
    // MKDIR, SYMLINK + READLINK, LINK, MKNOD.
    let dir = d.mkdir(1, "dir", 0o755).unwrap();
    let l = d.symlink(dir.nodeid, "link", "../file").unwrap();
    assert_eq!(d.readlink(l.nodeid).unwrap(), b"../file");
    let hard = d.link(e.nodeid, dir.nodeid, "hard").unwrap();
    // Inode identity (device, inode, mount id) holds inside the namespace: the same host inode
    // is the same node, however it is reached.
    assert_eq!(hard.nodeid, e.nodeid, "a hard link is the same node");
    assert_eq!(d.lookup(dir.nodeid, "hard").unwrap().nodeid, e.nodeid);
    assert_eq!(d.lookup(1, "host-file").unwrap().nodeid, host.nodeid, "a second lookup");
    assert_eq!(d.lookup(dir.nodeid, "..").unwrap().nodeid, 1);
    d.mknod(dir.nodeid, "fifo", libc::S_IFIFO | 0o600, 0).unwrap();
    // SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR (path-based calls on /proc/self/fd entries).
    let set = [8u32.to_ne_bytes(), 0u32.to_ne_bytes(), 0u32.to_ne_bytes(), 0u32.to_ne_bytes()].concat();
    let (err, _) = raw(&mut d, opcode::SETXATTR, e.nodeid, &[&set, b"user.sandbox\0", b"xattr-ok"], 0);
    assert_eq!(err, 0, "SETXATTR");
    let get = [64u32.to_ne_bytes(), 0u32.to_ne_bytes()].concat();
    let (err, v) = raw(&mut d, opcode::GETXATTR, e.nodeid, &[&get, b"user.sandbox\0"], 64);
    assert_eq!((err, v.as_slice()), (0, &b"xattr-ok"[..]), "GETXATTR");
    let (err, names) = raw(&mut d, opcode::LISTXATTR, e.nodeid, &[&get], 64);
    assert_eq!(err, 0);
    assert!(names.split(|&b| b == 0).any(|n| n == b"user.sandbox"), "LISTXATTR: {names:?}");
    let (err, _) = raw(&mut d, opcode::REMOVEXATTR, e.nodeid, &[b"user.sandbox\0"], 0);
    assert_eq!(err, 0, "REMOVEXATTR");
    // READDIR.
    let h = d.opendir(1).unwrap();
    let mut names: Vec<String> =
        d.readdir_all(1, h.fh).unwrap().into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
    d.releasedir(1, h.fh).unwrap();
    names.sort();
    assert_eq!(names, [".", "..", "dir", "file", "host-file"]);
    // RENAME, UNLINK, RMDIR.
    d.rename(1, "file", dir.nodeid, "moved").unwrap();
    d.unlink(dir.nodeid, "hard").unwrap();
    d.unlink(dir.nodeid, "link").unwrap();
    d.unlink(dir.nodeid, "fifo").unwrap();
    // `..` of the root is the root, inside the sandbox as outside.
    assert_eq!(d.lookup(1, "..").unwrap().nodeid, 1);
    d.shutdown().unwrap();

    // What the host sees: all of it, in the share.
    assert_eq!(std::fs::read(share.join("dir/moved")).unwrap(), b"written");
    assert!(!share.join("file").exists());
    assert_eq!(std::fs::read_dir(share.join("dir")).unwrap().count(), 1);
    assert_eq!(std::fs::read(&canary).unwrap(), b"beside the share");
    assert_eq!(std::fs::metadata(&canary).unwrap().mtime(), canary_meta.mtime());
    // The daemon is still there (no system call outside its allowlist).
    assert!(daemon.log().lines().all(|l| !l.contains("seccomp: system call")), "{}", daemon.log());
    assert!(!status_field(daemon.pid(), "State:").starts_with('Z'), "the daemon died");

    // The statistics file (opened before the sandbox) is written on SIGUSR1 and at exit, under
    // the filter in kill mode.
    // SAFETY: plain system call on our own child's pid.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGUSR1) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&stats).map(|m| m.len()).unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "no statistics on SIGUSR1:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGTERM) };
    let status = daemon.child.wait().unwrap();
    assert!(status.success(), "exit {status}:\n{}", daemon.log());
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let requests: u64 =
        report["device"]["queues"].as_array().unwrap().iter().map(|q| q["requests"].as_u64().unwrap()).sum();
    assert!(requests > 20, "the workload above: {report}");
    assert!(report["fuse"]["io"].is_object(), "the passthrough reports its engines: {report}");
}

/// Sharing `/` itself: nothing to pivot into, and the sandbox's own procfs mounts do not show in
/// the share (the daemon reads nothing here but the root's listing).
#[test]
fn sharing_the_root_hides_the_sandboxs_procfs() {
    if !is_root() {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(base.path(), Path::new("/"), &["--sandbox", "namespace"]);
    let mounts = std::fs::read_to_string(format!("/proc/{}/mountinfo", daemon.pid())).unwrap();
    assert!(!mounts.contains("subset=pid") && !mounts.contains("/fd /proc"), "{mounts}");
    let mut d = daemon.connect();
    assert_ne!(d.lookup(1, "etc").unwrap().nodeid, 0);
    d.shutdown().unwrap();
}

/// `--sandbox=none --seccomp=off`: the daemon stays in our namespaces, unfiltered (and still
/// drops its privileges).
#[test]
fn sandbox_and_filter_can_be_turned_off() {
    let (base, share) = new_share();
    let daemon = Daemon::start(base.path(), &share, &["--sandbox", "none", "--seccomp", "off"]);
    let pid = daemon.pid().to_string();
    assert_eq!(ns(&pid, "mnt"), ns("self", "mnt"));
    assert_eq!(status_field(daemon.pid(), "Seccomp:"), "0");
    assert_eq!(status_field(daemon.pid(), "NoNewPrivs:"), "1");
    let mut d = daemon.connect();
    d.mkdir(1, "d", 0o755).unwrap();
    d.shutdown().unwrap();
    assert!(share.join("d").is_dir());
}

/// Without the namespace sandbox (the default when unprivileged) but with the filter, the daemon
/// still stops cleanly on SIGTERM and removes its socket file (which it can still name).
#[test]
fn filtered_daemon_without_namespaces_stops_cleanly() {
    let (base, share) = new_share();
    let mut daemon = Daemon::start(base.path(), &share, &["--sandbox", "none", "--seccomp", "kill"]);
    let mut d = daemon.connect();
    d.mkdir(1, "d", 0o755).unwrap();
    d.shutdown().unwrap();
    // SAFETY: plain system call on our own child's pid.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGTERM) };
    let status = daemon.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status}\n{}", daemon.log());
    assert!(!daemon.sock.exists(), "socket file removed at exit");
}

/// Every data path (`--io-mode`: the io_uring, inline zero-copy, the bounce buffer) under the
/// filter in kill mode.
#[test]
fn every_io_mode_runs_under_the_filter() {
    for mode in ["ring", "hybrid", "sync"] {
        let (base, share) = new_share();
        let daemon = Daemon::start(base.path(), &share, &["--io-mode", mode, "--seccomp", "kill"]);
        let mut d = daemon.connect();
        let (e, o) = d.create(1, "f", 0o644, RDWR).unwrap();
        let data = vec![0x5au8; 256 << 10];
        assert_eq!(d.write(e.nodeid, o.fh, 4096, &data).unwrap() as usize, data.len(), "{mode}");
        d.fsync(e.nodeid, o.fh, true).unwrap();
        d.fsync(e.nodeid, o.fh, false).unwrap();
        assert_eq!(d.read(e.nodeid, o.fh, 4096, 128 << 10).unwrap(), &data[..128 << 10], "{mode}");
        d.release(e.nodeid, o.fh).unwrap();
        d.shutdown().unwrap();
        assert_eq!(std::fs::metadata(share.join("f")).unwrap().len(), 4096 + (256 << 10), "{mode}");
        assert!(!status_field(daemon.pid(), "State:").starts_with('Z'), "{mode}: {}", daemon.log());
    }
}

/// `--seccomp=log`: the filter is installed, with the kernel logging what it lacks instead of
/// killing; the daemon says so.
#[test]
fn log_mode_installs_the_filter() {
    let (base, share) = new_share();
    let daemon = Daemon::start(base.path(), &share, &["--sandbox", "none", "--seccomp", "log"]);
    assert_eq!(status_field(daemon.pid(), "Seccomp:"), "2");
    assert!(daemon.log().contains("others: Log"), "{}", daemon.log());
    let mut d = daemon.connect();
    d.mkdir(1, "d", 0o755).unwrap();
    d.shutdown().unwrap();
}

/// Without the privilege to create namespaces, `--sandbox=namespace` is a clear error.
#[test]
fn namespace_sandbox_without_privileges_is_a_clear_error() {
    if is_root() {
        // Run the daemon as nobody (it keeps no capabilities then).
        let (base, share) = new_share();
        for p in [base.path(), share.as_path()] {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        }
        let sock = base.path().join("d.sock");
        let out = Command::new(BIN)
            .args(["--socket-path", sock.to_str().unwrap(), "--shared-dir", share.to_str().unwrap()])
            .args(["--sandbox", "namespace"])
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("run as root, or use --sandbox=none"), "{err}");
    } else {
        let (base, share) = new_share();
        let sock = base.path().join("d.sock");
        let out = Command::new(BIN)
            .args(["--socket-path", sock.to_str().unwrap(), "--shared-dir", share.to_str().unwrap()])
            .args(["--sandbox", "namespace"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("run as root, or use --sandbox=none"), "{err}");
    }
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
