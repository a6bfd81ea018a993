//! Live update over real sockets and real processes (issue 22): a daemon started with
//! `--live-update` is replaced by a new process of its binary while the host driver model keeps
//! its connection and does I/O; the file data, the open handles, the locks held and the
//! statistics carry over, for a RAM filesystem and for a shared directory (sandboxed or not);
//! a SETLKW waiting moves as state; a new process that fails and a binary from outside the
//! allowed directory leave the old process serving.

mod common;
use common::{wait_for, Daemon, BIN};

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_NONE, VFIO_PCI_MSIX_IRQ_INDEX,
};
use virtiofs_dpu::ops::control_socket::ControlClient;
use virtiofs_tools::fuse_abi::opcode;
use virtiofs_tools::virtqueue::RingLayout;
use virtiofs_tools::{DriverOptions, FsDriver, LockReq};

#[path = "../backend/tests/harness/ganesha.rs"]
mod ganesha;
use ganesha::Ganesha;

const ROOT: u64 = 1;

fn daemon(dir: &Path, extra: &[&str]) -> Daemon {
    let sock = dir.join("fs.sock");
    let ctl = dir.join("ctl.sock");
    let child = Command::new(BIN)
        .arg("--socket-path")
        .arg(&sock)
        .arg("--control-socket")
        .arg(&ctl)
        .args(["--live-update", "--tag", "lu", "--log-level", "info"])
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&sock);
    wait_for(&ctl);
    Daemon(child)
}

fn device(ctl: &Path) -> Value {
    ControlClient::connect(ctl).unwrap().call("get_device", Value::Null).unwrap()
}

/// `virtiofs-dpu update`, started now; its output once done.
fn update(ctl: &Path, binary: Option<&Path>) -> Child {
    let mut c = Command::new(BIN);
    c.args(["update", "--control-socket"]).arg(ctl);
    if let Some(b) = binary {
        c.arg("--binary").arg(b);
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

fn finish(c: Child) -> Output {
    c.wait_with_output().unwrap()
}

/// Reads `f` at 4 KiB steps while `upd` runs: every read answers with the right bytes; returns
/// the reads done and the longest one.
fn read_through(d: &mut FsDriver, node: u64, fh: u64, data: &[u8], upd: &mut Child) -> (u64, Duration) {
    let (mut n, mut longest) = (0u64, Duration::ZERO);
    while upd.try_wait().unwrap().is_none() || n < 10 {
        let off = (n * 4096) % data.len() as u64;
        let t = Instant::now();
        let got = d.read(node, fh, off, 4096).unwrap_or_else(|e| panic!("read {n} during the update: {e}"));
        longest = longest.max(t.elapsed());
        assert_eq!(got, data[off as usize..off as usize + 4096], "read {n} at {off}");
        n += 1;
    }
    (n, longest)
}

/// The daemon is updated twice while the driver reads (split and packed rings, interrupts on):
/// no request fails, the data, the open handle and a lock held by one owner are there after it
/// (another owner's GETLK sees the lock), the serving process is a new one, `updates` counts
/// and the request counters continue. Then a new process that exits at once and a binary
/// outside `--update-binary-dir` each leave the old process serving, and an update with a
/// SETLKW waiting hands the waiting request over: the new process grants it when the lock goes.
#[test]
fn a_daemon_is_updated_under_io_and_a_failed_update_leaves_it_serving() {
    for ring in [RingLayout::Split, RingLayout::Packed] {
        let dir = tempfile::tempdir().unwrap();
        let bins = dir.path().join("bins");
        std::fs::create_dir(&bins).unwrap();
        let failing = bins.join("fails");
        std::fs::write(&failing, "#!/bin/sh\nexit 3\n").unwrap();
        std::fs::set_permissions(&failing, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut d_proc =
            daemon(dir.path(), &["--update-binary-dir", bins.to_str().unwrap(), "--ramfs-size", "64M"]);
        let ctl = dir.path().join("ctl.sock");
        let opts = DriverOptions { ring, use_interrupts: true, request_queues: 1, ..Default::default() };
        let mut d = FsDriver::connect(&dir.path().join("fs.sock"), opts).unwrap();
        d.init().unwrap();
        let (e, o) = d.create(ROOT, "data", 0o644, libc::O_RDWR as u32).unwrap();
        // 8 MiB: more 64 KiB chunks than the RAM filesystem keeps resident when freed, so an
        // old process that freed its chunks as it ended would punch holes into the data.
        let data: Vec<u8> = (0..8 << 20u32).map(|i| (i * 7 + i / 4096) as u8).collect();
        for (i, c) in data.chunks(64 * 1024).enumerate() {
            d.write(e.nodeid, o.fh, (i * 64 * 1024) as u64, c).unwrap();
        }
        let lock =
            LockReq { fh: o.fh, owner: 1, typ: libc::F_WRLCK, start: 0, end: 99, pid: 10, flock: false };
        d.setlk(e.nodeid, &lock).unwrap();
        let first = device(&ctl);
        let before = first["pid"].as_u64().unwrap();

        for round in 1..=2u64 {
            let mut upd = update(&ctl, None);
            let (reads, longest) = read_through(&mut d, e.nodeid, o.fh, &data, &mut upd);
            let out = finish(upd);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{ring:?} update {round}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let answer: Value = serde_json::from_str(text.trim()).unwrap();
            eprintln!("{ring:?} update {round}: {answer}; {reads} reads meanwhile, the longest {longest:?}");
            let now = device(&ctl);
            assert_ne!(now["pid"], first["pid"], "{ring:?}: still the first process");
            assert_eq!(now["pid"], answer["new_pid"], "{ring:?}");
            assert_eq!(now["updates"].as_u64(), Some(round), "{ring:?}");
        }
        // The old processes have ended (they exit 200 ms after answering): the data is whole.
        std::thread::sleep(Duration::from_millis(500));
        for (i, c) in data.chunks(128 * 1024).enumerate() {
            let got = d.read(e.nodeid, o.fh, (i * 128 * 1024) as u64, 128 * 1024).unwrap();
            assert!(got == c, "{ring:?}: the data at {} changed after the updates", i * 128 * 1024);
        }
        // The lock moved with the session: another owner sees it; its owner still holds it.
        let other = LockReq { owner: 2, pid: 20, ..lock };
        let seen = d.getlk(e.nodeid, &other).unwrap();
        assert_eq!((seen.typ as i32, seen.start, seen.end), (libc::F_WRLCK, 0, 99), "{ring:?}: the lock");
        // Writes and reads go on, past the ring's end many times.
        for i in 0..300u64 {
            let buf = [i as u8; 512];
            d.write(e.nodeid, o.fh, (9 << 20) + i * 512, &buf).unwrap();
            assert_eq!(d.read(e.nodeid, o.fh, (9 << 20) + i * 512, 512).unwrap(), buf.to_vec());
        }
        let mut c = ControlClient::connect(&ctl).unwrap();
        let stats = c.call("get_stats", Value::Null).unwrap();
        let requests: u64 = (stats["device"]["queues"].as_array().unwrap().iter())
            .map(|q| q["requests"].as_u64().unwrap())
            .sum();
        assert!(requests > 600 + 4, "{ring:?}: the counters did not continue: {requests}");

        // Failed updates: the serving process stays and serves.
        let serving = device(&ctl)["pid"].clone();
        let out = finish(update(&ctl, Some(&failing)));
        assert!(!out.status.success(), "{ring:?}: an update to a failing binary succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("closed the channel") || err.contains("ended"), "{ring:?}: {err}");
        let out = finish(update(&ctl, Some(Path::new("/bin/true"))));
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("update-binary-dir"), "{ring:?}");
        // A SETLKW waits on owner 1's lock: it is state, and the new process answers it once
        // owner 1 lets go.
        let q = 1;
        let waiting = d.submit_lk(q, opcode::SETLKW, e.nodeid, &other).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let out = finish(update(&ctl, None));
        assert!(out.status.success(), "{ring:?}: a SETLKW waiting: {}", String::from_utf8_lossy(&out.stderr));
        assert_ne!(device(&ctl)["pid"], serving, "{ring:?}: not handed over with a SETLKW waiting");
        // The new process's pollers park it again as they start its queues, just after the
        // update's answer.
        let waits = || parked(&ctl);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while waits() != 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(waits(), 1, "{ring:?}: the new process keeps the request waiting");
        d.setlk(e.nodeid, &LockReq { typ: libc::F_UNLCK, ..lock }).unwrap();
        d.lk_result(opcode::SETLKW, waiting).unwrap();
        let seen = d.getlk(e.nodeid, &lock).unwrap();
        assert_eq!(
            (seen.typ as i32, seen.start, seen.end),
            (libc::F_WRLCK, 0, 99),
            "{ring:?}: owner 2 holds it"
        );
        assert_eq!(d.read(e.nodeid, o.fh, 8192, 4096).unwrap(), data[8192..12288].to_vec());
        assert_ne!(before, 0);

        // The daemon stops on SIGTERM to the supervisor, with its socket files.
        drop(d);
        let pid = d_proc.0.id() as i32;
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let status = d_proc.0.wait().unwrap();
        assert!(status.success(), "{ring:?}: {status}");
        assert!(!dir.path().join("fs.sock").exists(), "{ring:?}: the socket file stayed");
        assert!(!ctl.exists(), "{ring:?}: the control socket file stayed");
    }
}

/// A shared directory is handed over: sandboxed (namespaces, seccomp in `kill` mode, the
/// io_uring engine) and not (`--sandbox none`, synchronous I/O). Twice under reads, with a
/// lock held, a directory handle half read, a subdirectory looked up and a file unlinked on
/// the host while the guest holds it open: after the updates the same handles and node ids
/// serve, `..` of the subdirectory is the root, the listing goes on from its cookie, the
/// unlinked file still reads through its handle, new files land on the host, and the lock
/// moved with the session.
#[test]
fn a_shared_directory_is_handed_over_with_its_nodes_and_open_files() {
    // SAFETY: a plain system call without arguments.
    let root = unsafe { libc::geteuid() } == 0;
    let modes: &[&[&str]] = if root {
        &[
            &["--sandbox", "namespace", "--seccomp", "trap", "--io-mode", "ring"],
            &["--sandbox", "none", "--seccomp", "off"],
        ]
    } else {
        eprintln!("not root: the sandboxed case needs namespaces; only --sandbox none runs");
        &[&["--sandbox", "none", "--seccomp", "off"]]
    };
    for mode in modes {
        let dir = tempfile::tempdir().unwrap();
        let share = dir.path().join("share");
        std::fs::create_dir_all(share.join("sub")).unwrap();
        for i in 0..40 {
            std::fs::write(share.join(format!("entry-{i:02}")), b"x").unwrap();
        }
        std::fs::write(share.join("gone"), b"unlinked but open").unwrap();
        let mut args = vec!["--shared-dir", share.to_str().unwrap()];
        args.extend_from_slice(mode);
        let _d = daemon(dir.path(), &args);
        let ctl = dir.path().join("ctl.sock");
        let opts = DriverOptions { use_interrupts: true, request_queues: 1, ..Default::default() };
        let mut d = FsDriver::connect(&dir.path().join("fs.sock"), opts).unwrap();
        d.init().unwrap();
        let (e, o) = d.create(ROOT, "data", 0o644, libc::O_RDWR as u32).unwrap();
        let data: Vec<u8> = (0..1 << 20u32).map(|i| (i * 13 + i / 4096) as u8).collect();
        for (i, c) in data.chunks(128 * 1024).enumerate() {
            d.write(e.nodeid, o.fh, (i * 128 * 1024) as u64, c).unwrap();
        }
        let lock =
            LockReq { fh: o.fh, owner: 1, typ: libc::F_WRLCK, start: 0, end: 99, pid: 10, flock: false };
        d.setlk(e.nodeid, &lock).unwrap();
        let sub = d.lookup(ROOT, "sub").unwrap();
        let gone = d.lookup(ROOT, "gone").unwrap();
        let gone_fh = d.open(gone.nodeid, libc::O_RDONLY as u32).unwrap().fh;
        std::fs::remove_file(share.join("gone")).unwrap();
        let listing = d.opendir(ROOT).unwrap();
        let first = d.readdir(ROOT, listing.fh, 0, 512).unwrap();
        let cookie = first.last().unwrap().off;
        let serving = device(&ctl)["pid"].clone();

        for round in 1..=2u64 {
            let mut upd = update(&ctl, None);
            let (reads, longest) = read_through(&mut d, e.nodeid, o.fh, &data, &mut upd);
            let out = finish(upd);
            assert!(
                out.status.success(),
                "{mode:?} update {round}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!("{mode:?} update {round}: {} reads meanwhile, the longest {longest:?}", reads);
            assert_eq!(device(&ctl)["updates"].as_u64(), Some(round), "{mode:?}");
        }
        let now = device(&ctl)["pid"].clone();
        assert_ne!(now, serving, "{mode:?}: still the first process");
        if mode.contains(&"namespace") {
            // The new process is confined as the first was.
            let status = std::fs::read_to_string(format!("/proc/{now}/status")).unwrap();
            let field = |k: &str| status.lines().find(|l| l.starts_with(k)).unwrap_or("").to_string();
            assert!(field("Seccomp:").ends_with('2') && field("NoNewPrivs:").ends_with('1'), "{status}");
            let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).unwrap();
            assert_ne!(ns(&now.to_string()), ns("self"), "the new process shares our mount namespace");
        }
        std::thread::sleep(Duration::from_millis(500));
        // The same handles and nodes.
        assert_eq!(d.read(e.nodeid, o.fh, 4096, 4096).unwrap(), data[4096..8192].to_vec(), "{mode:?}");
        assert_eq!(d.read(gone.nodeid, gone_fh, 0, 64).unwrap(), b"unlinked but open", "{mode:?}");
        assert_eq!(d.write(e.nodeid, o.fh, 1 << 20, b"tail").unwrap(), 4, "{mode:?}");
        let up = d.lookup(sub.nodeid, "..").unwrap();
        assert_eq!(up.nodeid, ROOT, "{mode:?}: .. of the subdirectory");
        assert_eq!(d.lookup(ROOT, "sub").unwrap().nodeid, sub.nodeid, "{mode:?}: the same node id");
        // The listing goes on where it stopped: every name once.
        let mut names: Vec<Vec<u8>> = first.iter().map(|x| x.name.clone()).collect();
        let mut off = cookie;
        loop {
            let more = d.readdir(ROOT, listing.fh, off, 4096).unwrap();
            let Some(last) = more.last() else { break };
            off = last.off;
            names.extend(more.iter().map(|x| x.name.clone()));
        }
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "{mode:?}: a name listed twice");
        assert!(names.iter().any(|n| n == b"entry-39") && names.iter().any(|n| n == b"sub"), "{mode:?}");
        // New nodes get new ids, and land on the host.
        let (n, no) = d.create(sub.nodeid, "after", 0o600, libc::O_RDWR as u32).unwrap();
        assert!(![ROOT, e.nodeid, sub.nodeid, gone.nodeid].contains(&n.nodeid), "{mode:?}: a node id reused");
        d.write(n.nodeid, no.fh, 0, b"new").unwrap();
        d.release(n.nodeid, no.fh).unwrap();
        assert_eq!(std::fs::read(share.join("sub/after")).unwrap(), b"new", "{mode:?}");
        let host = std::fs::read(share.join("data")).unwrap();
        assert!(host[..1 << 20] == data[..] && &host[1 << 20..] == b"tail", "{mode:?}: the host's file");
        let other = LockReq { owner: 2, pid: 20, ..lock };
        let seen = d.getlk(e.nodeid, &other).unwrap();
        assert_eq!((seen.typ as i32, seen.start, seen.end), (libc::F_WRLCK, 0, 99), "{mode:?}: the lock");
        d.release(gone.nodeid, gone_fh).unwrap();
        d.release(e.nodeid, o.fh).unwrap();
    }
}

/// An NFS export (nfs-ganesha) is handed over, sandboxed as an NFS daemon is (its own mount
/// namespace, the host's network, seccomp): twice under reads, with 1 MiB of UNSTABLE writes
/// the server has not committed, an open handle and a lock held. After the updates the store
/// still holds those writes (the counters say so), an FSYNC through the same handle commits
/// them, the export has the bytes, and the NFS counters went on from where they were.
#[test]
fn an_nfs_export_is_handed_over_with_its_uncommitted_writes() {
    let server = Ganesha::start();
    nfs_handed_over(&server, &server.url(), false);
}

/// Requests the serving process keeps waiting (parked SETLKWs), all queues together.
fn parked(ctl: &Path) -> u64 {
    let stats = ControlClient::connect(ctl).unwrap().call("get_stats", Value::Null).unwrap();
    (stats["device"]["queues"].as_array().unwrap().iter()).map(|q| q["waiting"].as_u64().unwrap_or(0)).sum()
}

/// NFSv4.1 (issue 23): the new process goes on as the same client of the server. Its sessions
/// join the client id without an EXCHANGE_ID, the handle's open stateid and the lock stateid
/// stay good (the lock is let go through the new process and then free for another owner, and
/// the writes are committed through the same handle), nothing is reclaimed or opened again.
#[test]
fn an_nfs41_export_is_handed_over_as_the_same_client_with_its_opens_and_locks() {
    let server = Ganesha::start();
    nfs_handed_over(&server, &server.url41(), true);
}

fn nfs_handed_over(server: &Ganesha, url: &str, v41: bool) {
    let dir = tempfile::tempdir().unwrap();
    let url = url.to_string();
    let _d = daemon(dir.path(), &["--remote", &url, "--sandbox", "namespace", "--seccomp", "trap"]);
    let ctl = dir.path().join("ctl.sock");
    let opts = DriverOptions { use_interrupts: true, request_queues: 1, ..Default::default() };
    let mut d = FsDriver::connect(&dir.path().join("fs.sock"), opts).unwrap();
    d.init().unwrap();
    let (e, o) = d.create(ROOT, "data", 0o644, libc::O_RDWR as u32).unwrap();
    // The lock first: an NFSv4.1 lock operation commits the file's stored writes before it.
    let lock = LockReq { fh: o.fh, owner: 1, typ: libc::F_WRLCK, start: 0, end: 99, pid: 10, flock: false };
    d.setlk(e.nodeid, &lock).unwrap();
    let data: Vec<u8> = (0..1 << 20u32).map(|i| (i * 31 + i / 4096) as u8).collect();
    for (i, c) in data.chunks(64 * 1024).enumerate() {
        d.write(e.nodeid, o.fh, (i * 64 * 1024) as u64, c).unwrap();
    }
    let nfs = |ctl: &Path| {
        let s = ControlClient::connect(ctl).unwrap().call("get_stats", Value::Null).unwrap();
        s["fuse"]["nfs"].clone()
    };
    let before = nfs(&ctl);
    let stored = before["unstable"]["bytes_now"].as_u64().unwrap();
    assert!(stored >= 1 << 20, "the writes are not in the UNSTABLE store: {before}");
    let serving = device(&ctl)["pid"].clone();
    for round in 1..=2u64 {
        let mut upd = update(&ctl, None);
        let (reads, longest) = read_through(&mut d, e.nodeid, o.fh, &data, &mut upd);
        let out = finish(upd);
        assert!(out.status.success(), "update {round}: {}", String::from_utf8_lossy(&out.stderr));
        eprintln!("NFS update {round}: {reads} reads meanwhile, the longest {longest:?}");
    }
    assert_ne!(device(&ctl)["pid"], serving, "still the first process");
    std::thread::sleep(Duration::from_millis(500));
    let after = nfs(&ctl);
    assert_eq!(after["unstable"]["bytes_now"].as_u64(), Some(stored), "the store moved whole: {after}");
    assert!(after["calls"].as_u64() > before["calls"].as_u64(), "the counters went on: {before} {after}");
    let other = LockReq { owner: 2, pid: 20, ..lock };
    let seen = d.getlk(e.nodeid, &other).unwrap();
    assert_eq!((seen.typ as i32, seen.start, seen.end), (libc::F_WRLCK, 0, 99), "the lock");
    if v41 {
        let s = &after["session"];
        let exchange_ids = before["session"]["exchange_ids"].as_u64();
        assert!(exchange_ids >= Some(1), "{before}");
        assert_eq!(s["exchange_ids"].as_u64(), exchange_ids, "the same client id, no EXCHANGE_ID: {after}");
        assert!(s["sessions"].as_u64() >= Some(1), "{after}");
        let l = &after["locks"];
        for k in ["stale", "reclaims", "opens_reclaimed", "locks_not_reclaimed"] {
            assert_eq!(l[k].as_u64(), Some(0), "{k}: {after}");
        }
        // Owner 2's SETLKW waits on the server for owner 1's lock (tried, denied): a third
        // update hands it over, the new process tries it on, and it is granted when owner 1's
        // lock goes, through the lock stateid the first process got (its LOCKU lets the lock
        // go on the server: had it been another client's, the lock would stay until the lease).
        let waiting = d.submit_lk(1, opcode::SETLKW, e.nodeid, &other).unwrap();
        let denied = || nfs(&ctl)["locks"]["tries_denied"].as_u64().unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while denied() == 0 {
            assert!(Instant::now() < deadline, "the SETLKW was never tried: {}", nfs(&ctl));
            std::thread::sleep(Duration::from_millis(10));
        }
        let serving = device(&ctl)["pid"].clone();
        let out = finish(update(&ctl, None));
        assert!(
            out.status.success(),
            "a SETLKW waiting on the server: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_ne!(device(&ctl)["pid"], serving, "not handed over with a SETLKW waiting");
        let tried = denied();
        let deadline = Instant::now() + Duration::from_secs(10);
        while parked(&ctl) != 1 || denied() == tried {
            assert!(Instant::now() < deadline, "the new process does not wait on: {}", nfs(&ctl));
            std::thread::sleep(Duration::from_millis(10));
        }
        d.setlk(e.nodeid, &LockReq { typ: libc::F_UNLCK, ..lock }).unwrap();
        d.lk_result(opcode::SETLKW, waiting).unwrap();
        let probe = LockReq { owner: 3, pid: 30, ..lock };
        let seen = d.getlk(e.nodeid, &probe).unwrap();
        assert_eq!((seen.typ as i32, seen.start, seen.end), (libc::F_WRLCK, 0, 99), "owner 2 holds it");
        d.setlk(e.nodeid, &LockReq { typ: libc::F_UNLCK, ..other }).unwrap();
        let now = nfs(&ctl);
        assert_eq!(now["session"]["exchange_ids"].as_u64(), exchange_ids, "the same client id: {now}");
        assert_eq!(now["locks"]["waits"].as_u64(), Some(1), "one SETLKW waited, across the update: {now}");
    }
    d.fsync(e.nodeid, o.fh, false).unwrap();
    assert_eq!(nfs(&ctl)["unstable"]["bytes_now"].as_u64(), Some(0), "FSYNC committed the store");
    assert!(std::fs::read(server.export().join("data")).unwrap() == data, "the export's bytes");
    d.release(e.nodeid, o.fh).unwrap();
}

/// The request queue's MSI-X vector is masked when the daemon is updated: the interrupt of a
/// completion made before the update stays pending across it (the PBA bit reads set from the
/// new process), and unmasking delivers it.
#[test]
fn a_masked_vector_stays_masked_and_pending_across_an_update() {
    let dir = tempfile::tempdir().unwrap();
    let _d = daemon(dir.path(), &[]);
    let ctl = dir.path().join("ctl.sock");
    let opts = DriverOptions { use_interrupts: true, request_queues: 1, ..Default::default() };
    let mut d = FsDriver::connect(&dir.path().join("fs.sock"), opts).unwrap();
    d.init().unwrap();
    let (e, o) = d.create(ROOT, "f", 0o644, libc::O_RDWR as u32).unwrap();
    let v = d.queue_vector(1);
    assert!(v < 8, "vector {v}: the test reads one PBA byte");
    let pending = |d: &mut FsDriver| d.client().read_le(1, 0x800, 1).unwrap() & (1 << v) != 0;
    let msix = VFIO_PCI_MSIX_IRQ_INDEX;
    d.client()
        .set_irqs(msix, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_MASK, u32::from(v), 1, &[], &[])
        .unwrap();
    let _ = d.take_interrupts(v);
    // A request completed while masked: its interrupt pends (the reply is reaped from the ring).
    let probe = LockReq { fh: o.fh, owner: 1, typ: libc::F_WRLCK, start: 0, end: 9, pid: 1, flock: false };
    let t = d.submit_lk(1, opcode::GETLK, e.nodeid, &probe).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(pending(&mut d), "no pending bit before the update");
    let before = device(&ctl)["pid"].clone();
    let out = finish(update(&ctl, None));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_ne!(device(&ctl)["pid"], before);
    assert!(pending(&mut d), "the pending bit did not survive the update");
    assert_eq!(d.take_interrupts(v), 0, "a masked vector was signalled");
    d.lk_result(opcode::GETLK, t).unwrap();
    d.client()
        .set_irqs(msix, VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK, u32::from(v), 1, &[], &[])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while d.take_interrupts(v) == 0 {
        assert!(Instant::now() < deadline, "unmasking did not deliver the pending interrupt");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!pending(&mut d), "still pending after delivery");
    assert_eq!(d.read(e.nodeid, o.fh, 0, 1).unwrap(), Vec::<u8>::new());
}

/// Two functions, one from the command line and one made at run time by `create_function`
/// (the new process reads its table again), each with a driver and data: after the update both
/// serve their data, `list_functions` shows both, and the created one keeps its own size.
#[test]
fn a_function_created_at_run_time_is_handed_over_too() {
    let dir = tempfile::tempdir().unwrap();
    let socks = dir.path().join("socks");
    std::fs::create_dir(&socks).unwrap();
    let allow = format!("sockets={}", socks.display());
    let _d = daemon(dir.path(), &["--allow-create", &allow]);
    let ctl = dir.path().join("ctl.sock");
    let b_sock = socks.join("b.sock");
    let params = serde_json::json!({"socket_path": b_sock, "tag": "b", "ramfs_size": "32M"});
    ControlClient::connect(&ctl).unwrap().call("create_function", params).unwrap();
    let mut drivers = Vec::new();
    for (sock, byte) in [(dir.path().join("fs.sock"), 0xa1u8), (b_sock.clone(), 0xb2)] {
        let mut d = FsDriver::connect(&sock, DriverOptions::default()).unwrap();
        d.init().unwrap();
        let (e, o) = d.create(ROOT, "f", 0o644, libc::O_RDWR as u32).unwrap();
        d.write(e.nodeid, o.fh, 0, &vec![byte; 300_000]).unwrap();
        drivers.push((d, e.nodeid, o.fh, byte));
    }
    let out = finish(update(&ctl, None));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["functions"], 2, "{answer}");
    std::thread::sleep(Duration::from_millis(400));
    for (d, node, fh, byte) in &mut drivers {
        assert_eq!(d.read(*node, *fh, 0, 300_000).unwrap(), vec![*byte; 300_000]);
    }
    let list = ControlClient::connect(&ctl).unwrap().call("list_functions", Value::Null).unwrap();
    let tags: Vec<&str> = list.as_array().unwrap().iter().map(|f| f["tag"].as_str().unwrap()).collect();
    assert_eq!(tags, ["lu", "b"]);
    let b = &list[1]["spec"]["backend"];
    assert_eq!(b["size"], 32 << 20, "{b}");
    // The created function's socket file is in place after the old process ended.
    assert!(b_sock.exists());
}

/// `live_update` with params it does not take is refused (-32602) naming what it takes, and on
/// a daemon without `--live-update` it is refused (-32000) saying so; the daemon serves on.
#[test]
fn bad_live_update_requests_get_clean_errors() {
    use virtiofs_dpu::ops::control_socket::ClientError;
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl.sock");
    let code = |r: Result<Value, ClientError>| match r {
        Err(ClientError::Rpc { code, message, .. }) => (code, message),
        other => panic!("expected an error, got {other:?}"),
    };
    {
        let _d = daemon(dir.path(), &[]);
        let mut c = ControlClient::connect(&ctl).unwrap();
        for bad in [
            serde_json::json!({"binary": 5}),
            serde_json::json!({"binary": ""}),
            serde_json::json!({"tag": "lu"}),
        ] {
            let (code, message) = code(c.call("live_update", bad.clone()));
            assert_eq!(code, -32602, "{bad}: {message}");
            assert!(message.contains("binary"), "{bad}: {message}");
        }
        assert!(c.call("get_device", Value::Null).is_ok());
    }
    // A daemon of its own sockets (the first one's serving process may still be stopping).
    let (sock, ctl) = (dir.path().join("plain.sock"), dir.path().join("plain-ctl.sock"));
    let _plain = Daemon(
        Command::new(BIN)
            .arg("--socket-path")
            .arg(&sock)
            .arg("--control-socket")
            .arg(&ctl)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&sock);
    wait_for(&ctl);
    let mut c = ControlClient::connect(&ctl).unwrap();
    let (code, message) = code(c.call("live_update", Value::Null));
    assert_eq!(code, -32000, "{message}");
    assert!(message.contains("--live-update"), "{message}");
    assert_eq!(device(&ctl)["live_update"], false);
}

/// A confined daemon (a shared directory, sandboxed as root, else seccomp in `trap` mode)
/// under `--live-update` makes RAM-filesystem functions at run time after all: its supervisor
/// binds their sockets where `--allow-create sockets=DIR` allows and passes them in. The
/// function serves, is handed over in an update, and when deleted its socket file, outside the
/// sandbox, is removed by the supervisor. A socket path elsewhere and a shared directory are
/// refused with the reason.
#[test]
fn a_confined_daemon_makes_functions_through_its_supervisor() {
    // SAFETY: a plain system call without arguments.
    let root = unsafe { libc::geteuid() } == 0;
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    let socks = dir.path().join("socks");
    std::fs::create_dir(&share).unwrap();
    std::fs::create_dir(&socks).unwrap();
    let allow = format!("sockets={}", socks.display());
    let confine: &[&str] = if root {
        &["--sandbox", "namespace", "--seccomp", "trap"]
    } else {
        &["--sandbox", "none", "--seccomp", "trap"]
    };
    let mut args = vec!["--shared-dir", share.to_str().unwrap(), "--allow-create", &allow];
    args.extend_from_slice(confine);
    let _d = daemon(dir.path(), &args);
    let ctl = dir.path().join("ctl.sock");
    let call = |method: &str, params: Value| ControlClient::connect(&ctl).unwrap().call(method, params);
    let made = socks.join("made.sock");
    call("create_function", serde_json::json!({"socket_path": made, "tag": "made", "ramfs_size": "32M"}))
        .expect("a RAM function made in a confined daemon");
    let mut d = FsDriver::connect(&made, DriverOptions::default()).unwrap();
    d.init().unwrap();
    let (e, o) = d.create(ROOT, "f", 0o644, libc::O_RDWR as u32).unwrap();
    d.write(e.nodeid, o.fh, 0, &[0x5a; 100_000]).unwrap();
    // Refused: a socket outside the allowed directory, a shared directory.
    let outside = dir.path().join("outside.sock");
    let e1 =
        call("create_function", serde_json::json!({"socket_path": outside, "tag": "x", "ramfs_size": "32M"}))
            .unwrap_err()
            .to_string();
    assert!(e1.contains("not allowed"), "{e1}");
    assert!(!outside.exists());
    let e2 = call(
        "create_function",
        serde_json::json!({"socket_path": socks.join("y.sock"), "tag": "y", "shared_dir": share}),
    )
    .unwrap_err()
    .to_string();
    assert!(e2.contains("RAM-filesystem functions only"), "{e2}");
    // Handed over with the daemon, confined as before; it serves on.
    let out = finish(update(&ctl, None));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(d.read(e.nodeid, o.fh, 0, 100_000).unwrap(), vec![0x5a; 100_000]);
    // The new process makes functions the same way.
    let again = socks.join("again.sock");
    call("create_function", serde_json::json!({"socket_path": again, "tag": "again", "ramfs_size": "32M"}))
        .expect("a function made after the update");
    FsDriver::connect(&again, DriverOptions::default()).unwrap().init().unwrap();
    // Deleted: the supervisor removes the socket file the sandbox cannot reach.
    drop(d);
    call("delete_function", serde_json::json!({"tag": "made"})).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while made.exists() {
        assert!(Instant::now() < deadline, "the deleted function's socket file stayed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(again.exists(), "another function's socket went too");
}

/// While an update hands the functions over, `create_function` and `delete_function` are
/// refused with a clean error (a function made then would be lost at the commit; one removed
/// would vanish from under the handover), and accepted again once the update has failed. The
/// update here waits for a new process that takes 2 s to fail.
#[test]
fn functions_are_neither_made_nor_removed_while_an_update_runs() {
    use virtiofs_dpu::ops::control_socket::ClientError;
    let dir = tempfile::tempdir().unwrap();
    let (socks, bins) = (dir.path().join("socks"), dir.path().join("bins"));
    std::fs::create_dir(&socks).unwrap();
    std::fs::create_dir(&bins).unwrap();
    let slow = bins.join("slow");
    std::fs::write(&slow, "#!/bin/sh\nsleep 2\nexit 3\n").unwrap();
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    let allow = format!("sockets={}", socks.display());
    let _d = daemon(dir.path(), &["--allow-create", &allow, "--update-binary-dir", bins.to_str().unwrap()]);
    let ctl = dir.path().join("ctl.sock");
    let params = serde_json::json!({"socket_path": socks.join("b.sock"), "tag": "b"});
    let upd = update(&ctl, Some(&slow));
    std::thread::sleep(Duration::from_millis(500));
    let mut c = ControlClient::connect(&ctl).unwrap();
    for (method, p) in
        [("create_function", params.clone()), ("delete_function", serde_json::json!({"tag": "lu"}))]
    {
        match c.call(method, p) {
            Err(ClientError::Rpc { message, .. }) => {
                assert!(message.contains("live update is under way"), "{method}: {message}")
            }
            other => panic!("{method} during an update: {other:?}"),
        }
    }
    let out = finish(upd);
    assert!(!out.status.success(), "an update to a failing binary succeeded");
    c.call("create_function", params).expect("made once the update has failed");
    assert!(socks.join("b.sock").exists());
}
