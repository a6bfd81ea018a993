//! What the crash-recovery tests share (issue 24): a supervised daemon (`--live-update`) with
//! its log, the control socket's view of the serving process, SIGKILL, and the rounds a
//! backend whose state is kept must pass: a write, a lock and a SETLKW waiting on it, then a
//! kill, after which the same node ids and handle serve what was written, the lock is still
//! held and the SETLKW taken again gets it once the lock goes; and a live update, then a kill
//! of the process it started.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use virtiofs_dpu::ops::control_socket::ControlClient;
use virtiofs_tools::fuse_abi::opcode;
use virtiofs_tools::virtqueue::RingLayout;
use virtiofs_tools::{DriverOptions, FsDriver, LockReq};

use super::{wait_for, Daemon, BIN};

/// A daemon under `--live-update` with one function, its log in a file.
pub struct Supervised {
    _daemon: Daemon,
    /// The function's socket.
    pub sock: PathBuf,
    /// The control socket.
    pub ctl: PathBuf,
    log: PathBuf,
}

impl Supervised {
    /// Starts it in `dir` with tag `tag` and `extra` arguments (the backend).
    pub fn start(dir: &Path, tag: &str, extra: &[&std::ffi::OsStr]) -> Supervised {
        let (sock, ctl, log) = (dir.join("fs.sock"), dir.join("ctl.sock"), dir.join("daemon.log"));
        let child = Command::new(BIN)
            .arg("--socket-path")
            .arg(&sock)
            .arg("--control-socket")
            .arg(&ctl)
            .args(["--live-update", "--tag", tag, "--log-level", "info"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let d = Supervised { _daemon: Daemon(child), sock, ctl, log };
        wait_for(&d.sock);
        wait_for(&d.ctl);
        d
    }

    /// The host driver model on the function, initialised: one request queue on `ring`,
    /// interrupts on, a bound well above a recovery on a loaded machine.
    pub fn driver(&self, ring: RingLayout) -> FsDriver {
        let opts = DriverOptions {
            ring,
            use_interrupts: true,
            request_queues: 1,
            timeout: Duration::from_secs(15),
            ..Default::default()
        };
        let mut d = FsDriver::connect(&self.sock, opts).unwrap();
        d.init().unwrap();
        d
    }

    /// Its log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `get_device` once the control socket answers (a new process serves it after a crash; the
/// bound is for a loaded test run, where a recovery can take seconds: a hang still fails).
pub fn device(ctl: &Path) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match ControlClient::connect(ctl).and_then(|mut c| c.call("get_device", Value::Null)) {
            Ok(v) => return v,
            Err(e) => assert!(Instant::now() < deadline, "the control socket does not answer: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The serving process once it is another than `old` (the supervisor started a new one).
pub fn new_serving(ctl: &Path, old: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = device(ctl);
        if d["pid"].as_u64() != Some(old) {
            return d;
        }
        assert!(Instant::now() < deadline, "no new serving process");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `get_stats` of the serving process.
pub fn stats(ctl: &Path) -> Value {
    ControlClient::connect(ctl).unwrap().call("get_stats", Value::Null).unwrap()
}

/// SIGKILL to `pid`.
pub fn kill(pid: u64) {
    let ok = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success();
    assert!(ok, "kill -KILL {pid}");
}

/// An open file of a kept backend the rounds go through: its node, handle, name and
/// directory, and a directory to make nodes in.
pub struct Kept {
    /// The file's node id.
    pub node: u64,
    /// Its open handle (read-write).
    pub fh: u64,
    /// Its directory.
    pub dir: u64,
    /// Its name there.
    pub name: String,
    /// Where each round makes a directory (a node made before the kill).
    pub made_in: u64,
    /// What was written so far.
    pub expect: Vec<u8>,
}

/// `rounds` kills of the serving process of `s` (counted from `first`), each with a write, a
/// node made, a lock and a SETLKW waiting on it before the kill, checked after it; `what`
/// names the run in messages.
pub fn kept_rounds(d: &mut FsDriver, s: &Supervised, k: &mut Kept, first: u64, rounds: u64, what: &str) {
    for round in first..first + rounds {
        let data = format!("round {round} of {what}, written before the crash\n").into_bytes();
        d.write(k.node, k.fh, k.expect.len() as u64, &data).unwrap();
        k.expect.extend_from_slice(&data);
        let made = d.mkdir(k.made_in, &format!("made{round}"), 0o755).unwrap();
        let lock = LockReq { fh: k.fh, owner: 1, typ: libc::F_WRLCK, start: 0, end: 9, pid: 1, flock: false };
        d.setlk(k.node, &lock).unwrap();
        let other = LockReq { owner: 2, pid: 2, ..lock };
        let waiting = d.submit_lk(1, opcode::SETLKW, k.node, &other).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let old = device(&s.ctl)["pid"].as_u64().unwrap();
        let t = Instant::now();
        kill(old);
        let now = new_serving(&s.ctl, old);
        assert_eq!(now["recoveries"].as_u64(), Some(round), "{what}: {now}");
        // The same node ids and handle serve, with what was written before the kill.
        let got = d.read(k.node, k.fh, 0, 4096);
        let shown = format!("{what} round {round}: {got:?}\n{}", s.logs());
        assert_eq!(got.ok().as_deref(), Some(k.expect.as_slice()), "{shown}");
        eprintln!("{what} round {round}: read through the same handle {:?} after the kill", t.elapsed());
        assert_eq!(d.lookup(k.dir, &k.name).unwrap().nodeid, k.node, "{what}: the same node id");
        assert_eq!(d.getattr(made.nodeid).unwrap().mode & libc::S_IFMT, libc::S_IFDIR, "{what}: made{round}");
        // The lock is still owner 1's: another owner's test sees it.
        let probe = LockReq { owner: 3, pid: 3, ..lock };
        assert_eq!(d.getlk(k.node, &probe).unwrap().typ, libc::F_WRLCK as u32, "{what}: the lock");
        // The SETLKW in flight was taken again and waits for it; unlocking grants it.
        d.setlk(k.node, &LockReq { typ: libc::F_UNLCK, ..lock }).unwrap();
        let r = d.lk_result(opcode::SETLKW, waiting);
        assert!(r.is_ok(), "{what} round {round}: the SETLKW in flight: {r:?}");
        d.setlk(k.node, &LockReq { typ: libc::F_UNLCK, ..other }).unwrap();
        d.rmdir(k.made_in, &format!("made{round}")).unwrap();
    }
}

/// A live update, a node made by the process it started, then a kill of that process: the
/// file reads back and the node is there (the kept state went on with the update).
pub fn update_then_crash(d: &mut FsDriver, s: &Supervised, k: &Kept, what: &str) {
    let before = device(&s.ctl)["pid"].as_u64().unwrap();
    let answer = ControlClient::connect(&s.ctl).unwrap().call("live_update", Value::Null).unwrap();
    assert_ne!(answer["new_pid"].as_u64(), Some(before), "{what}: {answer}");
    let updated = new_serving(&s.ctl, before)["pid"].as_u64().unwrap();
    // The process that handed over exits 200 ms after its answer.
    std::thread::sleep(Duration::from_millis(300));
    let late = d.mkdir(k.made_in, "after-update", 0o755).unwrap();
    kill(updated);
    new_serving(&s.ctl, updated);
    let got = d.read(k.node, k.fh, 0, 4096);
    let shown = format!("{what} after an update and a crash: {got:?}\n{}", s.logs());
    assert_eq!(got.ok().as_deref(), Some(k.expect.as_slice()), "{shown}");
    assert_eq!(d.getattr(late.nodeid).unwrap().mode & libc::S_IFMT, libc::S_IFDIR, "{what}: after-update");
    d.rmdir(k.made_in, "after-update").unwrap();
}
