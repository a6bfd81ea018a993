//! Crash recovery of an NFS function (issue 24) over real sockets and real processes, against
//! nfs-ganesha: the serving process of a `--live-update` daemon is killed with SIGKILL while the
//! host driver model holds node ids, open handles, an UNSTABLE write not yet committed, a lock
//! and a SETLKW waiting on it; the new process recovers the export from the records the dead
//! one kept (node table, handles, UNSTABLE index, FUSE session) and the driver goes on as if
//! nothing happened: the same node ids and handles serve, the lock is still held (the SETLKW
//! taken again from the in-flight record waits for it, then gets it), and the data reaches
//! the export, sent again from the UNSTABLE store the dead process kept when the server
//! restarts before it is committed. Twice in a row, on each ring layout.

mod common;
use common::crash::{device, kept_rounds, kill, new_serving, stats, update_then_crash, Kept, Supervised};

#[path = "../backend/tests/harness/ganesha.rs"]
mod ganesha;
use ganesha::Ganesha;

use std::ffi::OsStr;
use std::time::Duration;

use virtiofs_tools::fuse_abi::opcode;
use virtiofs_tools::virtqueue::RingLayout;
use virtiofs_tools::{DriverOptions, FsDriver};

const ROOT: u64 = 1;
const RDWR: u32 = libc::O_RDWR as u32;

#[test]
fn an_nfs_function_recovers_its_nodes_handles_locks_and_unstable_writes() {
    ganesha::require();
    let mut server = Ganesha::start();
    for ring in [RingLayout::Split, RingLayout::Packed] {
        recovered(&mut server, ring);
    }
}

fn recovered(server: &mut Ganesha, ring: RingLayout) {
    let dir = tempfile::tempdir().unwrap();
    let url = server.url();
    let s = Supervised::start(dir.path(), "nfscr", &[OsStr::new("--remote"), OsStr::new(&url)]);
    let mut d = s.driver(ring);
    let name = format!("cr-{ring:?}");
    let sub = d.mkdir(ROOT, &format!("{name}.d"), 0o755).unwrap();
    let (e, o) = d.create(ROOT, &name, 0o644, RDWR).unwrap();
    // UNSTABLE writes (not committed: no FSYNC, no FLUSH) before each kill.
    let mut k = Kept {
        node: e.nodeid,
        fh: o.fh,
        dir: ROOT,
        name: name.clone(),
        made_in: sub.nodeid,
        expect: Vec::new(),
    };
    let what = format!("{ring:?}");
    kept_rounds(&mut d, &s, &mut k, 1, 2, &what);
    update_then_crash(&mut d, &s, &k, &what);
    let (ctl, expect) = (s.ctl.clone(), k.expect.clone());
    // The server dies before the writes are committed and loses them (made deterministic by
    // overwriting the file behind its back while it is down); the new one has another write
    // verifier (its start time in seconds: it starts in another second). The recovered
    // process sends them again from the UNSTABLE store the dead one kept.
    server.kill();
    std::fs::write(server.export().join(&name), vec![0u8; expect.len()]).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    server.start_again();
    d.fsync(e.nodeid, o.fh, false).unwrap();
    let st = stats(&ctl);
    let resent = &st["fuse"]["nfs"]["unstable"]["resent"];
    assert!(resent.as_u64().unwrap_or(0) >= 1, "{ring:?}: {}", st["fuse"]);
    d.flush(e.nodeid, o.fh).unwrap();
    d.release(e.nodeid, o.fh).unwrap();
    assert_eq!(std::fs::read(server.export().join(&name)).unwrap(), expect, "{ring:?}");
    d.unlink(ROOT, &name).unwrap();
    d.rmdir(ROOT, &format!("{name}.d")).unwrap();
    let st = stats(&ctl);
    assert_eq!(st["recoveries"].as_u64(), Some(3), "{st}");
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Requests on the NFS engine at the kill (their calls sent to a server that stopped
/// answering, SIGSTOP) are taken again from the in-flight record by the new process and run
/// again once the server goes on; whatever the server did with the dead connection's calls, the
/// guest gets the answer the first execution would have had (DESIGN.md "Executing again"):
/// MKDIR and CREATE an entry (an `EEXIST` looked up), UNLINK and RENAME success (an `ENOENT`
/// with the new name there).
#[test]
fn requests_on_the_engine_at_the_kill_run_again_and_get_the_first_answer() {
    use virtiofs_tools::fuse_abi as abi;
    ganesha::require();
    let server = Ganesha::start();
    let dir = tempfile::tempdir().unwrap();
    let url = server.url();
    let s = Supervised::start(dir.path(), "nfseng", &[OsStr::new("--remote"), OsStr::new(&url)]);
    let (sock, ctl) = (s.sock.clone(), s.ctl.clone());
    let logs = || s.logs();
    let opts = DriverOptions {
        use_interrupts: true,
        request_queues: 1,
        timeout: Duration::from_secs(40),
        ..Default::default()
    };
    let mut d = FsDriver::connect(&sock, opts).unwrap();
    d.init().unwrap();
    for name in ["victim", "src"] {
        let (e, o) = d.create(ROOT, name, 0o644, RDWR).unwrap();
        d.release(e.nodeid, o.fh).unwrap();
    }
    server.signal(libc::SIGSTOP);
    let entry = abi::EntryOut::SIZE;
    let mkdir = d
        .submit(
            1,
            opcode::MKDIR,
            ROOT,
            &[&abi::MkdirIn { mode: 0o755, umask: 0o022 }.to_bytes(), &cstr("made.d")],
            &[],
            entry,
            0,
        )
        .unwrap();
    let create_in = abi::CreateIn { flags: RDWR, mode: 0o644 | libc::S_IFREG, umask: 0o022, open_flags: 0 };
    let create = d
        .submit(
            1,
            opcode::CREATE,
            ROOT,
            &[&create_in.to_bytes(), &cstr("made")],
            &[],
            entry + abi::OpenOut::SIZE,
            0,
        )
        .unwrap();
    let unlink = d.submit(1, opcode::UNLINK, ROOT, &[&cstr("victim")], &[], 0, 0).unwrap();
    let rename = d
        .submit(
            1,
            opcode::RENAME,
            ROOT,
            &[&abi::RenameIn { newdir: ROOT }.to_bytes(), &cstr("src"), &cstr("dst")],
            &[],
            0,
            0,
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let old = device(&ctl)["pid"].as_u64().unwrap();
    kill(old);
    server.signal(libc::SIGCONT);
    new_serving(&ctl, old);
    for (what, op, token) in [
        ("MKDIR", opcode::MKDIR, mkdir),
        ("CREATE", opcode::CREATE, create),
        ("UNLINK", opcode::UNLINK, unlink),
        ("RENAME", opcode::RENAME, rename),
    ] {
        let c = d.wait_for(token).unwrap_or_else(|e| panic!("{what}: {e:?}\n{}", logs()));
        let (h, _) = FsDriver::parse_reply(&c, op, token).unwrap();
        assert_eq!(h.error, 0, "{what} in flight at the kill answered {}\n{}", h.error, logs());
    }
    let made = d.lookup(ROOT, "made.d").unwrap().nodeid;
    assert_eq!(d.getattr(made).unwrap().mode & libc::S_IFMT, libc::S_IFDIR);
    d.lookup(ROOT, "made").unwrap();
    d.lookup(ROOT, "dst").unwrap();
    for gone in ["victim", "src"] {
        assert!(d.lookup(ROOT, gone).is_err(), "{gone} is still there");
    }
    let st = stats(&ctl);
    let replayed = &st["fuse"]["replayed"];
    // Those the poller had taken were on the engine (executed again, marked); one it had not
    // taken yet (the engine holding back a directory's later changes) is taken as new.
    assert!(replayed["requests"].as_u64().unwrap_or(0) >= 1, "{replayed}\n{}", logs());
    eprintln!("replayed: {replayed}");
}
