//! Several virtio-fs functions from one daemon on shared pollers (issue 14), over real sockets
//! with the host driver model: two functions with different backends serving at once, functions
//! created and removed at run time through the control socket while another runs a workload,
//! a broken ring and a broken memory window on one function beside a healthy one, a function
//! removed at run time asking its client to let it go (the device-request interrupt), and
//! per-function statistics checked against what was sent.

mod common;
use common::{wait_for, BIN};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::os::fd::AsRawFd;

use serde_json::{json, Value};
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_NORESIZE, VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_BOOL, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
    VFIO_PCI_NUM_IRQS, VFIO_PCI_REQ_IRQ_INDEX,
};
use virtiofs_device::stats::OpClass;
use virtiofs_dpu::ops::control_socket::{ClientError, ControlClient};
use virtiofs_dpu::ops::report::StatsReport;
use virtiofs_tools::vfio_user::ClientCaps;
use virtiofs_tools::{Client, DriverError, DriverOptions, FsDriver};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, args: &[&str]) -> Daemon {
        let log = dir.join("daemon.log");
        let child = Command::new(BIN)
            .args(args)
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        Daemon { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn alive(&mut self) {
        assert!(self.child.try_wait().unwrap().is_none(), "daemon died: {}", self.log());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--allow-create` for functions with sockets in `dir` and shares in temporary directories.
fn allow_create(dir: &Path) -> String {
    format!("sockets={},roots={}", dir.display(), std::env::temp_dir().display())
}

/// A daemon started the single-function way (`a.sock`, tag `a`) with a control socket
/// (`ctl.sock`) and `create_function` allowed in a new temporary directory.
fn single_function_daemon() -> (tempfile::TempDir, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let (a, ctl) = (dir.path().join("a.sock"), dir.path().join("ctl.sock"));
    let allow = allow_create(dir.path());
    let daemon = Daemon::start(
        dir.path(),
        &[
            "--socket-path",
            a.to_str().unwrap(),
            "--tag",
            "a",
            "--control-socket",
            ctl.to_str().unwrap(),
            "--allow-create",
            &allow,
        ],
    );
    wait_for(&a);
    wait_for(&ctl);
    (dir, daemon)
}

fn stats(c: &mut ControlClient, tag: &str) -> StatsReport {
    serde_json::from_value(c.call("get_stats", json!({ "tag": tag })).unwrap()).unwrap()
}

fn driver(sock: &Path) -> FsDriver {
    let opts = DriverOptions { timeout: Duration::from_secs(5), ..DriverOptions::default() };
    let mut d = FsDriver::connect(sock, opts).expect("driver brings the device up");
    d.init().unwrap();
    d
}

/// Writes `n` 4 KiB blocks of `byte` to a new file `name` and reads them back.
fn write_and_read(d: &mut FsDriver, name: &str, byte: u8, n: u64) {
    let (e, o) = d.create(1, name, 0o644, libc::O_RDWR as u32).unwrap();
    let data = vec![byte; 4096];
    for i in 0..n {
        assert_eq!(d.write(e.nodeid, o.fh, i * 4096, &data).unwrap(), 4096);
    }
    for i in 0..n {
        assert_eq!(d.read(e.nodeid, o.fh, i * 4096, 4096).unwrap(), data, "{name} block {i}");
    }
    d.release(e.nodeid, o.fh).unwrap();
}

/// A driver on `sock` writing and reading back one block until the flag is set; the counter
/// counts its requests, the thread returns its slowest write and read.
fn busy(sock: &Path) -> (Arc<AtomicBool>, Arc<AtomicU64>, std::thread::JoinHandle<Duration>) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let (sock, st, dn) = (sock.to_path_buf(), stop.clone(), done.clone());
    let worker = std::thread::spawn(move || {
        let mut d = driver(&sock);
        let (e, o) = d.create(1, "busy", 0o644, libc::O_RDWR as u32).unwrap();
        let data = vec![7u8; 4096];
        let mut slowest = Duration::ZERO;
        while !st.load(Ordering::Relaxed) {
            let t = Instant::now();
            d.write(e.nodeid, o.fh, 0, &data).unwrap();
            assert_eq!(d.read(e.nodeid, o.fh, 0, 4096).unwrap(), data);
            slowest = slowest.max(t.elapsed());
            dn.fetch_add(2, Ordering::Relaxed);
        }
        slowest
    });
    (stop, done, worker)
}

fn enoent(r: Result<impl std::fmt::Debug, DriverError>) {
    match r {
        Err(DriverError::Fuse { errno, .. }) => assert_eq!(errno, libc::ENOENT),
        other => panic!("expected ENOENT, got {other:?}"),
    }
}

/// Two functions of one daemon, a RAM filesystem and a shared directory, on one shared poller,
/// driven at the same time: each sees only its own files, and each one's statistics count
/// exactly what was sent to it.
#[test]
fn two_functions_with_different_backends_serve_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let share = tempfile::tempdir().unwrap();
    let (a, b, ctl) = (dir.path().join("a.sock"), dir.path().join("b.sock"), dir.path().join("ctl.sock"));
    let profile = dir.path().join("multi.toml");
    std::fs::write(
        &profile,
        format!(
            "queue_size = 64\n\n[[function]]\nsocket_path = {a:?}\ntag = \"ram\"\nramfs_size = \"16M\"\n\n\
             [[function]]\nsocket_path = {b:?}\ntag = \"dir\"\nshared_dir = {:?}\nrequest_queues = 2\nqueue_size = 128\n",
            share.path()
        ),
    )
    .unwrap();
    let mut daemon = Daemon::start(
        dir.path(),
        &[
            "--config",
            profile.to_str().unwrap(),
            "--control-socket",
            ctl.to_str().unwrap(),
            "--sandbox",
            "none",
        ],
    );
    wait_for(&a);
    wait_for(&b);
    wait_for(&ctl);
    let mut c = ControlClient::connect(&ctl).unwrap();
    let list = c.call("list_functions", Value::Null).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!((list[0]["tag"].as_str(), list[0]["backend"].as_str()), (Some("ram"), Some("ramfs")));
    assert_eq!((list[1]["tag"].as_str(), list[1]["backend"].as_str()), (Some("dir"), Some("passthrough")));
    assert_eq!(list[0]["queue_size"], json!(64), "the daemon's default");
    assert_eq!((list[1]["queue_size"].clone(), list[1]["request_queues"].clone()), (json!(128), json!(2)));
    // One poller: both functions' queues on it.
    assert_eq!(list[0]["queue_pollers"], json!([0, 0]));
    assert_eq!(list[1]["queue_pollers"], json!([0, 0, 0]));
    assert!(list[0]["memory_bytes"].as_u64().unwrap() > 0);

    let (blocks_a, blocks_b) = (50u64, 30u64);
    let go = Arc::new(std::sync::Barrier::new(2));
    let run = |sock: PathBuf, name: &'static str, byte: u8, n: u64, go: Arc<std::sync::Barrier>| {
        std::thread::spawn(move || {
            let mut d = driver(&sock);
            go.wait();
            write_and_read(&mut d, name, byte, n);
            d
        })
    };
    let ta = run(a.clone(), "only-a", 0xaa, blocks_a, go.clone());
    let tb = run(b.clone(), "only-b", 0xbb, blocks_b, go);
    let mut da = ta.join().unwrap();
    let mut db = tb.join().unwrap();
    // What is written on one is not visible on the other.
    enoent(da.lookup(1, "only-b"));
    enoent(db.lookup(1, "only-a"));
    assert_eq!(std::fs::read(share.path().join("only-b")).unwrap(), vec![0xbb; 4096 * blocks_b as usize]);
    assert!(!share.path().join("only-a").exists());

    let (sa, sb) = (stats(&mut c, "ram"), stats(&mut c, "dir"));
    let class = |r: &StatsReport, k| r.device.class(k).unwrap().clone();
    assert_eq!(
        (class(&sa, OpClass::Write).requests, class(&sa, OpClass::Read).requests),
        (blocks_a, blocks_a)
    );
    assert_eq!(
        (class(&sb, OpClass::Write).requests, class(&sb, OpClass::Read).requests),
        (blocks_b, blocks_b)
    );
    assert_eq!(class(&sa, OpClass::Read).bytes, blocks_a * 4096);
    assert_eq!(class(&sb, OpClass::Write).bytes, blocks_b * 4096);
    assert_eq!(sb.device.queues.len(), 3, "hiprio and two request queues");
    assert!(sb.fuse.io.is_some() && sa.fuse.io.is_none(), "the passthrough's io_uring counters are its own");
    // Both views show the one shared poller, with the thread's own rounds.
    assert_eq!((sa.device.pollers.len(), sb.device.pollers.len()), (1, 1));
    assert_eq!((sa.device.pollers[0].poller, sb.device.pollers[0].poller), (0, 0));
    assert!(sa.device.pollers[0].rounds > 0 && sb.device.pollers[0].rounds > 0);
    // A reset of one function's counters leaves the other's.
    assert_eq!(c.call("reset_stats", json!({"tag": "ram"})).unwrap(), json!(true));
    assert_eq!(stats(&mut c, "ram").device.requests().iter().sum::<u64>(), 0);
    assert!(stats(&mut c, "dir").device.requests().iter().sum::<u64>() >= 2 * blocks_b);
    let dev = c.call("get_device", json!({"tag": "dir"})).unwrap();
    assert_eq!(dev["client"]["connected"], json!(true));
    assert_eq!(dev["config"]["backend"]["kind"], json!("passthrough"));
    let e = c.call("get_stats", json!({"tag": "nope"})).unwrap_err();
    assert!(matches!(e, ClientError::Rpc { code: -32602, .. }), "{e:?}");

    // `virtiofs-dpu stats` shows every function.
    let out = Command::new(BIN).args(["stats", "--control-socket", ctl.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("ram") && text.contains("dir"), "{text}");
    drop((da, db));
    daemon.alive();
}

/// Functions created and removed through the control socket while another function runs a
/// workload: its requests keep completing throughout, the new function has a filesystem of its
/// own, and the removed one's client sees the disconnect and its socket file goes.
#[test]
fn functions_are_created_and_deleted_while_another_serves() {
    let (dir, mut daemon) = single_function_daemon();
    let (a, b, ctl) = (dir.path().join("a.sock"), dir.path().join("b.sock"), dir.path().join("ctl.sock"));
    let (stop, done, worker) = busy(&a);
    let mut c = ControlClient::connect(&ctl).unwrap();
    while done.load(Ordering::Relaxed) < 100 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let info = c
        .call(
            "create_function",
            json!({"socket_path": b, "tag": "b", "ramfs_size": "8M", "remove_timeout_ms": 200}),
        )
        .unwrap();
    assert_eq!((info["tag"].clone(), info["backend"].clone()), (json!("b"), json!("ramfs")));
    let e =
        c.call("create_function", json!({"socket_path": dir.path().join("c.sock"), "tag": "b"})).unwrap_err();
    assert!(
        matches!(&e, ClientError::Rpc { code: -32602, message, .. } if message.contains("exists")),
        "{e:?}"
    );
    let e = c.call("create_function", json!({"tag": "c"})).unwrap_err();
    assert!(matches!(&e, ClientError::Rpc { message, .. } if message.contains("socket_path")), "{e:?}");
    let e =
        c.call("create_function", json!({"socket_path": "/x", "tag": "c", "poller_cores": [0]})).unwrap_err();
    assert!(matches!(&e, ClientError::Rpc { message, .. } if message.contains("daemon-wide")), "{e:?}");
    let e = c.call("create_function", json!({"socket_path": "/x", "tag": "c", "queue_size": 3})).unwrap_err();
    assert!(matches!(&e, ClientError::Rpc { message, .. } if message.contains("queue_size")), "{e:?}");
    let before = done.load(Ordering::Relaxed);
    let mut db = driver(&b);
    write_and_read(&mut db, "on-b", 0xb0, 10);
    enoent(db.lookup(1, "busy"));
    let tags: Vec<Value> = c
        .call("list_functions", Value::Null)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["tag"].clone())
        .collect();
    assert_eq!(tags, [json!("a"), json!("b")]);
    let sb = stats(&mut c, "b");
    assert_eq!(sb.device.class(OpClass::Write).unwrap().requests, 10);

    // The driver does not answer the device-request interrupt: it is disconnected at the bound.
    let gone = c.call("delete_function", json!({"tag": "b"})).unwrap();
    assert_eq!((gone["tag"].clone(), gone["removed"].clone()), (json!("b"), json!("timed out")), "{gone}");
    assert!(!b.exists(), "the removed function's socket file is gone");
    match db.getattr(1) {
        Err(_) => {}
        Ok(a) => panic!("the removed function still answered: {a:?}"),
    }
    let e = c.call("get_stats", json!({"tag": "b"})).unwrap_err();
    assert!(matches!(e, ClientError::Rpc { code: -32602, .. }), "{e:?}");
    let e = c.call("delete_function", json!({"tag": "b"})).unwrap_err();
    assert!(matches!(e, ClientError::Rpc { code: -32602, .. }), "{e:?}");
    // A's requests went on meanwhile, and go on.
    let during = done.load(Ordering::Relaxed) - before;
    assert!(during > 0, "function a completed nothing while b came and went");
    let now = done.load(Ordering::Relaxed);
    while done.load(Ordering::Relaxed) < now + 100 {
        std::thread::sleep(Duration::from_millis(5));
        daemon.alive();
    }
    // The same tag and socket can be created again, with a fresh filesystem.
    c.call("create_function", json!({"socket_path": b, "tag": "b"})).unwrap();
    let mut db = driver(&b);
    enoent(db.lookup(1, "on-b"));
    // A run-time function serving a host directory, with its own queue count.
    let share = tempfile::tempdir().unwrap();
    let d = dir.path().join("d.sock");
    let info = c
        .call(
            "create_function",
            json!({"socket_path": d, "tag": "d", "shared_dir": share.path(), "request_queues": 2}),
        )
        .unwrap();
    assert_eq!((info["backend"].clone(), info["request_queues"].clone()), (json!("passthrough"), json!(2)));
    let e = c
        .call("create_function", json!({"socket_path": "/x.sock", "tag": "e", "shared_dir": "rel"}))
        .unwrap_err();
    assert!(matches!(&e, ClientError::Rpc { message, .. } if message.contains("absolute")), "{e:?}");
    let mut dd = driver(&d);
    write_and_read(&mut dd, "on-d", 0xd0, 3);
    assert_eq!(std::fs::read(share.path().join("on-d")).unwrap(), vec![0xd0; 3 * 4096]);
    drop(dd);
    c.call("delete_function", json!({"tag": "d"})).unwrap();
    stop.store(true, Ordering::Relaxed);
    let slowest = worker.join().unwrap();
    assert!(slowest < Duration::from_secs(2), "a request of a took {slowest:?}");
    daemon.alive();
}

/// A broken ring on one function (its avail index jumped far ahead) and a lost memory window
/// (its memfd truncated) set DEVICE_NEEDS_RESET on that function only: the other, on the same
/// poller, keeps serving, and the broken one serves its next client.
#[test]
fn a_broken_function_leaves_the_other_serving() {
    let (dir, mut daemon) = single_function_daemon();
    let (a, b, ctl) = (dir.path().join("a.sock"), dir.path().join("b.sock"), dir.path().join("ctl.sock"));
    let mut c = ControlClient::connect(&ctl).unwrap();
    c.call("create_function", json!({"socket_path": b, "tag": "b"})).unwrap();
    let mut healthy = driver(&b);
    let (e, o) = healthy.create(1, "ok", 0o644, libc::O_RDWR as u32).unwrap();

    for breakage in ["ring", "memory"] {
        let mut broken = driver(&a);
        broken.getattr(1).unwrap();
        match breakage {
            "ring" => {
                // Request queue 1's avail index, a whole ring and more ahead of what was made.
                let (_, avail, _) = broken.transport().queue_addrs(1).unwrap();
                let mut idx = [0u8; 2];
                broken.memory().read(avail + 2, &mut idx).unwrap();
                let far = u16::from_le_bytes(idx).wrapping_add(1000);
                broken.memory().write(avail + 2, &far.to_le_bytes()).unwrap();
            }
            _ => broken.memory().file().set_len(0).unwrap(),
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut served = 0u64;
        loop {
            daemon.alive();
            healthy.write(e.nodeid, o.fh, 0, &[served as u8; 512]).unwrap();
            served += 1;
            let status = broken.transport().status().expect("status register");
            if status & 0x40 != 0 {
                break; // DEVICE_NEEDS_RESET
            }
            assert!(Instant::now() < deadline, "{breakage}: no reset asked (status {status:#x})");
        }
        for i in 0..50u64 {
            healthy.write(e.nodeid, o.fh, i * 512, &[i as u8; 512]).unwrap();
            assert_eq!(healthy.read(e.nodeid, o.fh, i * 512, 512).unwrap(), vec![i as u8; 512]);
        }
        let st = healthy.transport().status().unwrap();
        assert_eq!(st & 0x40, 0, "{breakage}: the healthy function needs no reset");
        let sa = stats(&mut c, "a");
        assert!(sa.device.queues.iter().all(|q| q.in_flight == 0));
        drop(broken); // its client goes away
        let mut again = driver(&a);
        again.getattr(1).unwrap();
        healthy.getattr(e.nodeid).unwrap();
        assert!(served > 0);
    }
    let sb = stats(&mut c, "b");
    assert!(sb.device.bad_chains().iter().all(|&n| n == 0));
    assert!(sb.device.class(OpClass::Write).unwrap().requests >= 100);
    daemon.alive();
}

/// Two functions serving host directories beneath one `sandbox_root`, in the default confinement
/// of a root daemon (namespaces whose root is the sandbox root, seccomp in trap mode): each
/// resolves only beneath its own directory, `..` included, and run-time functions are refused;
/// a deleted function's socket file beneath the sandbox root is removed from inside it.
#[test]
fn shared_directories_beneath_one_sandbox_root_stay_apart() {
    assert!(is_root(), "the namespace sandbox needs root: run this test as root");
    let dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let (da, db) = (root.path().join("a"), root.path().join("b"));
    std::fs::create_dir(&da).unwrap();
    std::fs::create_dir(&db).unwrap();
    std::fs::write(db.join("secret"), b"b's").unwrap();
    std::fs::write(root.path().join("top"), b"root's").unwrap();
    // b's socket lies beneath the sandbox root (not in a shared directory), a's elsewhere.
    std::fs::create_dir(root.path().join("run")).unwrap();
    let (a, b, ctl) =
        (dir.path().join("a.sock"), root.path().join("run/b.sock"), dir.path().join("ctl.sock"));
    let profile = dir.path().join("multi.toml");
    std::fs::write(
        &profile,
        format!(
            "sandbox_root = {:?}\n\n[[function]]\nsocket_path = {a:?}\ntag = \"a\"\nshared_dir = {da:?}\n\n\
                 [[function]]\nsocket_path = {b:?}\ntag = \"b\"\nshared_dir = {db:?}\n",
            root.path()
        ),
    )
    .unwrap();
    let mut daemon = Daemon::start(
        dir.path(),
        &["--config", profile.to_str().unwrap(), "--control-socket", ctl.to_str().unwrap()],
    );
    wait_for(&ctl);
    let mut c = ControlClient::connect(&ctl).unwrap();
    let dev = c.call("get_device", Value::Null).unwrap();
    assert_eq!(dev["config"]["sandbox"], json!("namespace"), "{dev}");
    let mut fa = driver(&a);
    let mut fb = driver(&b);
    write_and_read(&mut fa, "from-a", 0xa1, 4);
    assert_eq!(std::fs::read(da.join("from-a")).unwrap(), vec![0xa1; 4 * 4096]);
    enoent(fa.lookup(1, "secret"));
    enoent(fa.lookup(1, "top"));
    // `..` of a function's root is that root, not the sandbox root.
    if let Ok(up) = fa.lookup(1, "..") {
        enoent(fa.lookup(up.nodeid, "b"));
        enoent(fa.lookup(up.nodeid, "top"));
    }
    assert!(fb.lookup(1, "secret").is_ok());
    enoent(fb.lookup(1, "from-a"));
    let e =
        c.call("create_function", json!({"socket_path": dir.path().join("c.sock"), "tag": "c"})).unwrap_err();
    assert!(
        matches!(&e, ClientError::Rpc { code: -32000, message, .. } if message.contains("confined")),
        "{e:?}"
    );
    daemon.alive();
    // Removing a function tears its io_uring down while the daemon runs under its system-call
    // filter (a parked poller's timed wait then resumes through restart_syscall): the daemon
    // lives on and the other function serves.
    drop(fb);
    c.call("delete_function", json!({"tag": "b"})).unwrap();
    // Its socket file went, removed through its path inside the sandbox.
    assert!(!b.exists(), "b's socket beneath the sandbox root stays");
    std::thread::sleep(Duration::from_millis(300));
    daemon.alive();
    write_and_read(&mut fa, "after-b", 0xa2, 4);
    daemon.alive();
    drop(fa);
}

/// Functions with a shared directory in a namespace sandbox need a `sandbox_root` holding all
/// of them; one outside it is refused at start.
#[test]
fn a_shared_directory_outside_the_sandbox_root_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (root, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let sock = dir.path().join("a.sock");
    let function =
        format!("[[function]]\nsocket_path = {sock:?}\ntag = \"a\"\nshared_dir = {:?}\n", other.path());
    // The daemon's stderr, once it refused to start (exit status 2).
    let refused = |text: String| {
        let profile = dir.path().join("multi.toml");
        std::fs::write(&profile, text).unwrap();
        let out = Command::new(BIN)
            .args(["--config", profile.to_str().unwrap(), "--sandbox", "namespace"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{err}");
        err
    };
    let err = refused(format!("sandbox_root = {:?}\n{function}", root.path()));
    assert!(err.contains("not beneath sandbox_root"), "{err}");
    assert!(!sock.exists(), "nothing bound");
    // Without a sandbox_root the namespace mode says what it needs.
    let err = refused(function.clone());
    assert!(err.contains("sandbox_root"), "{err}");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// The errno of a vfio-user command the device refused.
fn refused_with(r: Result<(), virtiofs_tools::ClientError>) -> i32 {
    match r {
        Err(e) => e.errno().unwrap_or_else(|| panic!("not an error reply: {e}")),
        Ok(()) => panic!("accepted"),
    }
}

/// The device-request interrupt (vfio's `VFIO_PCI_REQ_IRQ_INDEX`) as vfio-pci offers it: one
/// interrupt, an eventfd, neither maskable nor resizable; SET_IRQS takes TRIGGER only (MASK and
/// UNMASK: ENOTTY), `start` 0 and `count` at most 1; an eventfd is set, cleared (count 1 with no
/// descriptor, how a vfio-user client sends vfio's fd -1; count 0 with DATA_NONE) and signalled
/// by DATA_NONE or a true DATA_BOOL; anything else is refused with EINVAL.
#[test]
fn the_device_request_interrupt_follows_vfio() {
    let (dir, mut daemon) = single_function_daemon();
    let mut c = Client::connect(&dir.path().join("a.sock")).unwrap();
    c.set_timeout(Duration::from_secs(5)).unwrap();
    c.version(&ClientCaps::default()).unwrap();
    let info = c.irq_info(VFIO_PCI_REQ_IRQ_INDEX).unwrap();
    assert_eq!((info.count, info.flags), (1, VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE));
    let (req, trigger) = (VFIO_PCI_REQ_IRQ_INDEX, VFIO_IRQ_SET_ACTION_TRIGGER);
    let efd = EventFd::new(EFD_NONBLOCK).unwrap();
    let fd = [efd.as_raw_fd()];
    let eventfd = VFIO_IRQ_SET_DATA_EVENTFD | trigger;
    for action in [VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_UNMASK] {
        assert_eq!(
            refused_with(c.set_irqs(req, VFIO_IRQ_SET_DATA_NONE | action, 0, 1, &[], &[])),
            libc::ENOTTY
        );
    }
    assert_eq!(refused_with(c.set_irqs(req, eventfd, 1, 1, &fd, &[])), libc::EINVAL, "start 1");
    assert_eq!(refused_with(c.set_irqs(req, eventfd, 0, 2, &fd, &[])), libc::EINVAL, "count 2");
    let two = [efd.as_raw_fd(), efd.as_raw_fd()];
    assert_eq!(refused_with(c.set_irqs(req, eventfd, 0, 1, &two, &[])), libc::EINVAL, "two descriptors");
    let file = tempfile::tempfile().unwrap();
    assert_eq!(
        refused_with(c.set_irqs(req, eventfd, 0, 1, &[file.as_raw_fd()], &[])),
        libc::EINVAL,
        "a file"
    );
    let boolean = VFIO_IRQ_SET_DATA_BOOL | trigger;
    assert_eq!(refused_with(c.set_irqs(req, boolean, 0, 1, &[], &[1, 1])), libc::EINVAL, "two bools");
    assert_eq!(refused_with(c.set_irqs(req, boolean, 0, 0, &[], &[])), libc::EINVAL, "count 0 bool");
    assert_eq!(refused_with(c.set_irqs(req, eventfd, 0, 0, &[], &[])), libc::EINVAL, "count 0 eventfd");
    let none = VFIO_IRQ_SET_DATA_NONE | trigger;
    assert_eq!(refused_with(c.set_irqs(req, none, 0, 1, &fd, &[])), libc::EINVAL, "NONE with a descriptor");
    assert_eq!(refused_with(c.set_irqs(VFIO_PCI_NUM_IRQS, none, 0, 1, &[], &[])), libc::EINVAL, "index 5");
    assert!(efd.read().is_err(), "nothing signalled by refused requests");

    c.set_irqs(req, eventfd, 0, 1, &fd, &[]).unwrap();
    c.set_irqs(req, none, 0, 1, &[], &[]).unwrap();
    assert_eq!(efd.read().unwrap(), 1, "DATA_NONE signals");
    c.set_irqs(req, boolean, 0, 1, &[], &[0]).unwrap();
    assert!(efd.read().is_err(), "a false bool does not");
    c.set_irqs(req, boolean, 0, 1, &[], &[1]).unwrap();
    assert_eq!(efd.read().unwrap(), 1, "a true bool does");
    c.set_irqs(req, eventfd, 0, 1, &[], &[]).unwrap(); // cleared (vfio's fd -1)
    c.set_irqs(req, none, 0, 1, &[], &[]).unwrap();
    assert!(efd.read().is_err(), "a cleared eventfd is not signalled");
    c.set_irqs(req, eventfd, 0, 1, &fd, &[]).unwrap();
    c.set_irqs(req, none, 0, 0, &[], &[]).unwrap(); // cleared (count 0)
    c.set_irqs(req, none, 0, 1, &[], &[]).unwrap();
    assert!(efd.read().is_err(), "cleared by count 0");
    drop(c);
    daemon.alive();
}

/// A function removed at run time as a surprise removal would, but asked first: delete_function
/// signals its client's device-request eventfd (QEMU turns it into a hot-unplug request to the
/// guest) and keeps serving it; a driver that lets the device go (reset, interrupts cleared,
/// hang-up) ends the removal with "client released it", one that ignores it is disconnected
/// once the function's `remove_timeout_ms` ran out ("timed out"), one that set no such eventfd
/// at once. Meanwhile the control socket answers other requests and lists the function as
/// `removing`, and the other function on the same poller keeps serving.
#[test]
fn a_removed_function_asks_its_client_to_let_it_go() {
    let (dir, mut daemon) = single_function_daemon();
    let (a, ctl) = (dir.path().join("a.sock"), dir.path().join("ctl.sock"));
    let (stop, done, worker) = busy(&a);
    let mut c = ControlClient::connect(&ctl).unwrap();
    let b = dir.path().join("b.sock");
    c.call("create_function", json!({"socket_path": b, "tag": "b", "remove_timeout_ms": 4000})).unwrap();
    let mut db = driver(&b);
    assert_eq!(db.facts().req_count, 1);
    let client_of = |c: &mut ControlClient, tag: &str| {
        let list = c.call("list_functions", Value::Null).unwrap();
        list.as_array().unwrap().iter().find(|f| f["tag"] == json!(tag)).unwrap()["client"].clone()
    };
    assert_eq!(client_of(&mut c, "b")["removal_interrupt"], json!(true));
    write_and_read(&mut db, "on-b", 0xb1, 4);
    assert!(!db.removal_requested());
    // The driver answers the request the way a guest's unplug and QEMU's unrealize do.
    let releaser = std::thread::spawn(move || {
        let asked = db.wait_removal_request(Duration::from_secs(10)).unwrap();
        assert!(asked, "no device-request interrupt");
        db.getattr(1).expect("still served while it lets go"); // the guest's last requests
        std::thread::sleep(Duration::from_millis(300));
        db.let_go().unwrap();
        Instant::now()
    });
    let deleter = {
        let ctl = ctl.clone();
        std::thread::spawn(move || {
            let mut c = ControlClient::connect(&ctl).unwrap();
            let r = c.call("delete_function", json!({"tag": "b"})).unwrap();
            (r, Instant::now())
        })
    };
    // The control socket answers meanwhile, and shows the function going.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let list = c.call("list_functions", Value::Null).unwrap();
        let state =
            list.as_array().unwrap().iter().find(|f| f["tag"] == json!("b")).map(|f| f["state"].clone());
        if state == Some(json!("removing")) {
            break;
        }
        assert!(Instant::now() < deadline, "b never listed as removing: {list}");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!b.exists(), "the socket file goes as the removal starts");
    let e = c.call("delete_function", json!({"tag": "b"})).unwrap_err();
    assert!(matches!(&e, ClientError::Rpc { message, .. } if message.contains("being removed")), "{e:?}");
    let released_at = releaser.join().unwrap();
    let (gone, answered_at) = deleter.join().unwrap();
    assert_eq!(gone["removed"], json!("client released it"), "{gone}");
    assert!(gone["requests"].as_u64().unwrap() >= 10, "{gone}");
    assert!(answered_at >= released_at && answered_at - released_at < Duration::from_secs(2));
    let tags = c.call("list_functions", Value::Null).unwrap();
    assert_eq!(tags.as_array().unwrap().len(), 1, "{tags}");

    // A driver that ignores the request is disconnected once the bound ran out.
    let x = dir.path().join("x.sock");
    c.call("create_function", json!({"socket_path": x, "tag": "x", "remove_timeout_ms": 300})).unwrap();
    // (A disconnected driver notices at its reply timeout: a short one.)
    let quick = DriverOptions { timeout: Duration::from_secs(1), ..DriverOptions::default() };
    let mut dx = FsDriver::connect(&x, quick.clone()).unwrap();
    dx.init().unwrap();
    let t = Instant::now();
    let gone = c.call("delete_function", json!({"tag": "x"})).unwrap();
    assert_eq!(gone["removed"], json!("timed out"), "{gone}");
    assert!(t.elapsed() >= Duration::from_millis(300), "answered after {:?}", t.elapsed());
    assert!(dx.removal_requested(), "it was asked");
    assert!(dx.getattr(1).is_err(), "and then disconnected");
    // One that set no device-request eventfd is disconnected at once.
    c.call("create_function", json!({"socket_path": x, "tag": "y", "remove_timeout_ms": 60000})).unwrap();
    let mut dy = FsDriver::connect(&x, DriverOptions { request_irq: false, ..quick }).unwrap();
    dy.init().unwrap();
    assert_eq!(client_of(&mut c, "y")["removal_interrupt"], json!(false));
    let t = Instant::now();
    let gone = c.call("delete_function", json!({"tag": "y"})).unwrap();
    assert_eq!(gone["removed"], json!("client takes no removal request: disconnected"), "{gone}");
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(dy.getattr(1).is_err());
    // A batch holding a delete_function is answered whole once the removal is done, while the
    // socket answers another client at once.
    c.call("create_function", json!({"socket_path": x, "tag": "z", "remove_timeout_ms": 500})).unwrap();
    let mut dz = FsDriver::connect(&x, quick.clone()).unwrap();
    dz.init().unwrap();
    let batch = {
        let ctl = ctl.clone();
        std::thread::spawn(move || {
            use std::io::{BufRead, Write};
            let mut s = std::os::unix::net::UnixStream::connect(&ctl).unwrap();
            let line = r#"[{"jsonrpc":"2.0","method":"delete_function","params":{"tag":"z"},"id":1},{"jsonrpc":"2.0","method":"list_functions","id":2}]"#;
            s.write_all(format!("{line}\n").as_bytes()).unwrap();
            let mut answer = String::new();
            std::io::BufReader::new(s).read_line(&mut answer).unwrap();
            serde_json::from_str::<Value>(&answer).unwrap()
        })
    };
    let t = Instant::now();
    while client_of(&mut c, "z")["connected"] == json!(true) && !dz.removal_requested() {
        assert!(t.elapsed() < Duration::from_secs(5), "z was never asked to go");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(t.elapsed() < Duration::from_millis(450), "the other client waited for the batch");
    let answers = batch.join().unwrap();
    let answers = answers.as_array().unwrap();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!((answers[0]["id"].clone(), answers[1]["id"].clone()), (json!(1), json!(2)));
    assert_eq!(answers[0]["result"]["removed"], json!("timed out"), "{answers:?}");
    assert!(answers[1]["result"].is_array(), "{answers:?}");
    drop(dz);

    let before = done.load(Ordering::Relaxed);
    while done.load(Ordering::Relaxed) < before + 50 {
        std::thread::sleep(Duration::from_millis(5));
        daemon.alive();
    }
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    daemon.alive();
}

/// The share policy is a function key (issue 20): a `[[function]]` share and a
/// `create_function` share with `refuse = "device-nodes"` fail MKNOD of a character device with
/// EPERM over their sockets, while a share without it (and a daemon run as root) creates one;
/// FIFOs stay allowed everywhere. `list_functions` and `get_device` show the policy built.
#[test]
fn a_function_share_refuses_device_nodes_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (listed, open, made) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b, c, ctl) = (
        dir.path().join("a.sock"),
        dir.path().join("b.sock"),
        dir.path().join("c.sock"),
        dir.path().join("ctl.sock"),
    );
    let profile = dir.path().join("multi.toml");
    std::fs::write(
        &profile,
        format!(
            "[[function]]\nsocket_path = {a:?}\ntag = \"listed\"\nshared_dir = {:?}\nrefuse = \"device-nodes\"\n\n\
             [[function]]\nsocket_path = {b:?}\ntag = \"open\"\nshared_dir = {:?}\n",
            listed.path(),
            open.path()
        ),
    )
    .unwrap();
    // Unconfined, so that create_function may open a new share.
    let mut daemon = Daemon::start(
        dir.path(),
        &[
            "--config",
            profile.to_str().unwrap(),
            "--sandbox",
            "none",
            "--seccomp",
            "off",
            "--control-socket",
            ctl.to_str().unwrap(),
            "--allow-create",
            &allow_create(dir.path()),
        ],
    );
    wait_for(&ctl);
    let mut ctl_client = ControlClient::connect(&ctl).unwrap();
    let info = ctl_client
        .call(
            "create_function",
            json!({"socket_path": c, "tag": "made", "shared_dir": made.path(), "refuse": ["device-nodes"]}),
        )
        .unwrap();
    assert_eq!(info["spec"]["backend"]["refuse"], json!(["device-nodes"]), "{info}");
    let list = ctl_client.call("list_functions", Value::Null).unwrap();
    let refused: Vec<&Value> =
        list.as_array().unwrap().iter().map(|f| &f["spec"]["backend"]["refuse"]).collect();
    assert_eq!(refused, [&json!(["device-nodes"]), &json!([]), &json!(["device-nodes"])], "{list}");
    let dev = ctl_client.call("get_device", json!({"tag": "listed"})).unwrap();
    assert_eq!(dev["config"]["backend"]["refuse"], json!(["device-nodes"]), "{dev}");

    let chr = libc::S_IFCHR | 0o600;
    let rdev = 0x103; // 1:3, /dev/null's numbers
    for (sock, share) in [(&a, listed.path()), (&c, made.path())] {
        let mut d = driver(sock);
        let e = d.mknod(1, "null", chr, rdev).unwrap_err();
        assert_eq!(e.fuse_errno(), Some(libc::EPERM), "{}: {e}", sock.display());
        assert!(!share.join("null").exists());
        d.mknod(1, "fifo", libc::S_IFIFO | 0o600, 0).expect("FIFOs are not device nodes");
    }
    let mut d = driver(&b);
    if is_root() {
        d.mknod(1, "null", chr, rdev).expect("a share without the policy creates device nodes");
        assert!(open.path().join("null").exists());
    }
    daemon.alive();
}
