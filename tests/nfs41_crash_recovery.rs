//! Crash recovery of an NFSv4.1 function (issue 23) over real sockets and real processes,
//! against nfs-ganesha: the serving process of a `--live-update` daemon is killed with SIGKILL
//! while the host driver model holds node ids, open handles, UNSTABLE writes and a lock. The
//! NFSv4.1 server keeps opens and locks under the client the dead process was: the new process
//! is that client in a new incarnation, so the server drops them, and the records say which
//! files held locks. (A test binary of its own: beside `nfs_crash_recovery.rs`'s test that
//! stops its server with SIGSTOP, in one binary, that test's requests were seen answered before
//! its kill in some parallel runs; not understood, noted in the issue.)

mod common;
use common::crash::{device, kill, new_serving, stats, Supervised};

#[path = "../backend/tests/harness/ganesha.rs"]
mod ganesha;
use ganesha::Ganesha;

use std::ffi::OsStr;
use std::time::Duration;

use serde_json::Value;
use virtiofs_dpu::ops::control_socket::ControlClient;
use virtiofs_tools::virtqueue::RingLayout;
use virtiofs_tools::LockReq;

const ROOT: u64 = 1;
const RDWR: u32 = libc::O_RDWR as u32;

/// NFSv4.1 (issue 23): the process started after the kill is the same client in a new
/// incarnation (the owner from the records, a new verifier), so the server drops the dead
/// process's opens and locks at once. The same node ids and handles serve: each open is opened
/// anew before the guest's requests go, and an UNSTABLE write the dead process left is
/// committed; a file that held a lock is EIO through its handles until its last close (its lock
/// is gone, never silently), after which a new open locks it at once (the old lock was let go
/// by the server, not left to the lease). Then a live update and another kill: the same again.
#[test]
fn an_nfs41_function_recovers_as_a_new_incarnation_and_fails_only_the_files_that_held_locks() {
    ganesha::require();
    let server = Ganesha::start();
    let dir = tempfile::tempdir().unwrap();
    let url = server.url41();
    let s = Supervised::start(dir.path(), "nfs41cr", &[OsStr::new("--remote"), OsStr::new(&url)]);
    let mut d = s.driver(RingLayout::Split);
    let (a, oa) = d.create(ROOT, "plain", 0o644, RDWR).unwrap();
    let mut expect = b"written before the first crash\n".to_vec();
    d.write(a.nodeid, oa.fh, 0, &expect).unwrap();
    // Files that held a lock at a kill, kept open across the next one.
    let mut lost: Vec<(u64, u64, String)> = Vec::new();
    for round in 1..=2u64 {
        let name = format!("locked{round}");
        let (b, ob) = d.create(ROOT, &name, 0o644, RDWR).unwrap();
        let lock =
            LockReq { fh: ob.fh, owner: 1, typ: libc::F_WRLCK, start: 0, end: 99, pid: 1, flock: false };
        d.setlk(b.nodeid, &lock).unwrap();
        d.write(b.nodeid, ob.fh, 0, b"under the lock").unwrap();
        lost.push((b.nodeid, ob.fh, name));
        if round == 2 {
            // The kept state goes on through a live update first.
            let before = device(&s.ctl)["pid"].as_u64().unwrap();
            ControlClient::connect(&s.ctl).unwrap().call("live_update", Value::Null).unwrap();
            new_serving(&s.ctl, before);
            std::thread::sleep(Duration::from_millis(500));
        }
        let old = device(&s.ctl)["pid"].as_u64().unwrap();
        kill(old);
        let now = new_serving(&s.ctl, old);
        assert_eq!(now["recoveries"].as_u64(), Some(round), "{now}");
        // The file without a lock: the same handle writes and reads on.
        let more = format!("round {round}: written after the crash\n").into_bytes();
        let at = expect.len() as u64;
        let w = d.write(a.nodeid, oa.fh, at, &more);
        assert_eq!(w.as_ref().ok(), Some(&(more.len() as u32)), "round {round}: {w:?}\n{}", s.logs());
        expect.extend_from_slice(&more);
        assert_eq!(d.read(a.nodeid, oa.fh, 0, 4096).unwrap(), expect, "round {round}");
        // Every file that held a lock, this kill's and (still open) the last one's: EIO
        // through its handle, for I/O and a new lock alike (the mark outlives a second crash).
        for (n, fh, name) in &lost {
            let e = d.write(*n, *fh, 0, b"without the lock").unwrap_err();
            assert_eq!(e.fuse_errno(), Some(libc::EIO), "round {round}, {name}: {e}");
            let e = d.setlk(*n, &LockReq { fh: *fh, owner: 2, pid: 2, ..lock }).unwrap_err();
            assert_eq!(e.fuse_errno(), Some(libc::EIO), "round {round}, {name}: {e}");
        }
        let st = stats(&s.ctl);
        let l = &st["fuse"]["nfs"]["locks"];
        assert_eq!(l["reclaims"].as_u64(), Some(1), "round {round}: the open pass ran once: {l}");
        assert!(l["opens_reclaimed"].as_u64() >= Some(2), "round {round}: the opens opened anew: {l}");
    }
    // Their last close ends the marks (the close reports the loss: EIO); the server let the
    // old locks go with the old incarnations: a new open locks each at once.
    for (n, fh, name) in &lost {
        let e = d.flush_owner(*n, *fh, 1).unwrap_err();
        assert_eq!(e.fuse_errno(), Some(libc::EIO), "{name}: {e}");
        d.release(*n, *fh).unwrap();
        let o = d.open(*n, RDWR).unwrap();
        let lock =
            LockReq { fh: o.fh, owner: 2, typ: libc::F_WRLCK, start: 0, end: 99, pid: 2, flock: false };
        d.setlk(*n, &lock).unwrap();
        d.setlk(*n, &LockReq { typ: libc::F_UNLCK, ..lock }).unwrap();
        d.flush_owner(*n, o.fh, 2).unwrap();
        d.release(*n, o.fh).unwrap();
    }
    d.fsync(a.nodeid, oa.fh, false).unwrap();
    assert_eq!(std::fs::read(server.export().join("plain")).unwrap(), expect);
    d.flush(a.nodeid, oa.fh).unwrap();
    d.release(a.nodeid, oa.fh).unwrap();
}
