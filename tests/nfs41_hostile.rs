//! The NFSv4.1 engine against a hostile scripted server (the device end to end over vfio-user,
//! its export served by a script that speaks just enough NFSv4.1 to be mounted): a READDIR that
//! never moves on (the cookie asked given back, with eof false) is EIO in bounded time, never a
//! loop, and the device goes on serving; a reply of garbage bytes is EIO for its request only; a
//! COMPOUND that failed at SEQUENCE or before any operation (no result to show for it) is the
//! request's error, never a success. The script answers every operation the engine sends as a
//! well-behaved server would, unless a test's hook answers a COMPOUND first.
//!
//! A restartable server ([`Srv`], [`restartable`]) keeps state (sessions, client ids, the
//! stateids it gave), forgets it at a scripted restart and keeps a grace period until
//! RECLAIM_COMPLETE; it logs every operation with what it made of it, and a test's plan may
//! refuse, drop or restart on any of them. With it: the reclaim after a restart sends exactly
//! the opens (CLAIM_PREVIOUS), the ranges held (LOCK reclaim) and one RECLAIM_COMPLETE, and
//! I/O goes on with the reclaimed state; a refused lock reclaim makes its file EIO (nothing
//! sent without the lock) and the others go on; a reclaim call never answered is sent again.

#[path = "../backend/tests/nfs_fake_server/mod.rs"]
mod nfs_fake_server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nfs_fake_server::nfs4::{
    self, close_ok, commit_ok, compound_reply, create_session_ok, exchange_id_ok, getattr_ok, getfh_ok,
    link_ok, ok, open_ok, open_ok_deleg, read_ok, readdir_ok, remove_ok, rename_ok, seq_ok, setattr_ok,
    write_ok, Arg,
};
use nfs_fake_server::{record, Act, Call, FakeServer};
use virtiofs_backend::nfs::locks41::LockTotals;
use virtiofs_backend::nfs::wire::nfs4::{
    ChannelAttrs, Fattr4, Fh, Ftype4, NfsTime4, Nfsstat4, OpNum, SessionId,
};
use virtiofs_backend::nfs::{NfsFs, NfsOptions};
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::{FuseHandler, RunningDevice};
use virtiofs_tools::fuse_abi::OFFSET_MAX;
use virtiofs_tools::{DriverOptions, FsDriver, LockReq};

const ROOT: u64 = 1;

/// What the script does with a COMPOUND before its ordinary answers: `Some(acts)` instead of
/// them.
type Hook = Box<dyn FnMut(&nfs4::Compound, &Call) -> Option<Vec<Act>> + Send>;

/// The operations of every COMPOUND the script was sent (SEQUENCE's left out), in order.
type Log = Arc<Mutex<Vec<Vec<OpNum>>>>;

fn dir_attrs() -> Fattr4 {
    let t = NfsTime4 { seconds: 1_700_000_000, nseconds: 0 };
    Fattr4 {
        ftype: Some(Ftype4::Dir),
        mode: Some(0o755),
        numlinks: Some(2),
        owner: Some(0),
        owner_group: Some(0),
        size: Some(4096),
        space_used: Some(4096),
        fileid: Some(2),
        time_access: Some(t),
        time_modify: Some(t),
        time_metadata: Some(t),
        lease_time: Some(60),
        maxread: Some(1 << 20),
        maxwrite: Some(1 << 20),
        maxfilesize: Some(1 << 40),
        ..Fattr4::default()
    }
}

fn file_attrs(fileid: u64) -> Fattr4 {
    Fattr4 {
        ftype: Some(Ftype4::Reg),
        mode: Some(0o644),
        numlinks: Some(1),
        size: Some(0),
        fileid: Some(fileid),
        ..dir_attrs()
    }
}

/// A script that establishes a session, walks to any export, and answers every operation the
/// engine sends as a well-behaved server would (any name is a regular file of its own, or a
/// directory if it starts with `d`; READDIR lists nothing), unless `hook` answers the COMPOUND first. Each COMPOUND's operations go to
/// `log`.
fn script(mut hook: Hook, log: Log) -> impl FnMut(&Call) -> Vec<Act> + Send + 'static {
    let root = b"root-of-the-export".to_vec();
    let mut opens = 0u8;
    move |call: &Call| {
        let c = nfs4::parse(&call.args);
        if c.seq().is_some() {
            log.lock().unwrap().push(c.ops());
        }
        if let Some(acts) = hook(&c, call) {
            return acts;
        }
        let mut results = Vec::new();
        let mut current = root.clone();
        for op in &c.ops {
            let r = match op {
                Arg::ExchangeId { .. } => exchange_id_ok(0x41, 1, 0),
                Arg::CreateSession { sequence, fore, .. } => {
                    create_session_ok(SessionId([4; 16]), *sequence, fore)
                }
                Arg::Sequence(s) => seq_ok(s, 63, 63, 0),
                Arg::Putfh(fh) => {
                    current = fh.clone();
                    ok(op.op(), &[])
                }
                Arg::Putrootfh => {
                    current = root.clone();
                    ok(op.op(), &[])
                }
                Arg::Lookup(name) => {
                    // The walk to the export stays on the root; any other name is a file.
                    if name.as_slice() != b"export" {
                        current = [b"f:".as_slice(), name].concat();
                    }
                    ok(op.op(), &[])
                }
                Arg::Open { name, .. } => {
                    if let Some(name) = name {
                        current = [b"f:".as_slice(), name].concat();
                    }
                    opens = opens.wrapping_add(1);
                    open_ok([opens; 12])
                }
                Arg::Getfh => getfh_ok(&Fh::new(&current).unwrap()),
                Arg::Getattr(_) if current == root => getattr_ok(&dir_attrs()),
                // Names from `d` are directories.
                Arg::Getattr(_) if current.starts_with(b"f:d") => {
                    getattr_ok(&Fattr4 { fileid: Some(30), ..dir_attrs() })
                }
                Arg::Getattr(_) => getattr_ok(&file_attrs(10 + current.len() as u64)),
                Arg::ReclaimComplete { .. } | Arg::DestroySession(_) | Arg::DestroyClientid(_) => {
                    ok(op.op(), &[])
                }
                Arg::Savefh | Arg::Restorefh => ok(op.op(), &[]),
                Arg::Remove(_) => remove_ok(),
                Arg::Rename { .. } => rename_ok(),
                Arg::Link(_) => link_ok(),
                Arg::Close { .. } => close_ok(),
                Arg::Setattr { .. } => setattr_ok(),
                Arg::Delegreturn => ok(op.op(), &[]),
                Arg::Lock { .. } | Arg::Locku { .. } => nfs4::lock_ok(op.op(), [0x10; 12]),
                Arg::FreeStateid { .. } => ok(op.op(), &[]),
                Arg::Readdir { verf, .. } => readdir_ok(*verf, &[], true),
                Arg::Read { count, .. } => read_ok(true, &vec![7; (*count).min(100) as usize]),
                Arg::Write { data, .. } => write_ok(data.len() as u32, 2, [0; 8]),
                other => panic!("the script does not answer {:?}", other.op()),
            };
            results.push(r);
        }
        vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, &results))]
    }
}

/// The hook of a READDIR that never moves on: the cookie asked given back with eof false.
fn same_cookie(readdirs: Arc<AtomicU32>) -> Hook {
    Box::new(move |c, call| {
        let Some(Arg::Readdir { cookie, verf, .. }) = c.ops.iter().find(|o| o.op() == OpNum::Readdir) else {
            return None;
        };
        readdirs.fetch_add(1, Ordering::Relaxed);
        let s = c.seq().unwrap();
        let a = Fattr4 { ftype: Some(Ftype4::Reg), fileid: Some(9), ..Fattr4::default() };
        let again = if *cookie == 0 { 7 } else { *cookie };
        let results = [
            seq_ok(&s, 63, 63, 0),
            ok(OpNum::Putfh, &[]),
            getattr_ok(&dir_attrs()),
            readdir_ok(*verf, &[(again, b"again", a)], false),
        ];
        Some(vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, &results))])
    })
}

/// The hook of a READDIR answered with garbage bytes.
fn garbage(readdirs: Arc<AtomicU32>) -> Hook {
    Box::new(move |c, _| {
        c.ops.iter().any(|o| o.op() == OpNum::Readdir).then(|| {
            readdirs.fetch_add(1, Ordering::Relaxed);
            vec![Act::Send(record(&[0xde, 0xad, 0xbe, 0xef]))]
        })
    })
}

struct Dev {
    _dir: tempfile::TempDir,
    handler: Arc<FuseHandler<NfsFs>>,
    device: Option<RunningDevice>,
    d: FsDriver,
}

fn serve(server: &FakeServer) -> Dev {
    serve_with(server, |_| {})
}

/// [`serve`], with the options `f` makes of the usual ones.
fn serve_with(server: &FakeServer, f: impl FnOnce(&mut NfsOptions)) -> Dev {
    let url = format!("nfs://127.0.0.1:{}/export?version=4.1", server.addr().port());
    let mut opts = NfsOptions::new(url.parse().unwrap());
    opts.timeout = Duration::from_secs(3);
    opts.retransmit = Duration::from_secs(1);
    f(&mut opts);
    let dir = tempfile::tempdir().unwrap();
    opts.function = dir.path().display().to_string();
    let fs = NfsFs::connect(opts).expect("the script's export mounts");
    let socket = dir.path().join("nfs.sock");
    let handler = Arc::new(FuseHandler::new(fs));
    let device = RunningDevice::start_with(&socket, Profile::default(), handler.clone()).unwrap();
    let mut d = FsDriver::connect(&socket, DriverOptions::default()).unwrap();
    d.init().unwrap();
    Dev { _dir: dir, handler, device: Some(device), d }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Some(dev) = self.device.take() {
            let _ = dev.stop();
        }
    }
}

fn errno<T: std::fmt::Debug>(r: Result<T, virtiofs_tools::DriverError>) -> i32 {
    match r {
        Err(e) => e.fuse_errno().unwrap_or_else(|| panic!("not a FUSE error: {e}")),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

#[test]
fn a_readdir_that_never_moves_on_is_eio_in_bounded_time() {
    let readdirs = Arc::new(AtomicU32::new(0));
    let server = FakeServer::start(script(same_cookie(readdirs.clone()), Log::default()));
    let mut dev = serve(&server);
    let open = dev.d.opendir(ROOT).unwrap();
    let t0 = Instant::now();
    // From the start: `.` and `..`, then the server's entry (cookie 7), then READDIR at 7 gives
    // cookie 7 again with eof false.
    let mut offset = 0;
    let mut seen = Vec::new();
    let end = loop {
        match dev.d.readdir(ROOT, open.fh, offset, 4096) {
            Ok(v) if v.is_empty() => break Ok(()),
            Ok(v) => {
                offset = v.last().unwrap().off;
                seen.extend(v.into_iter().map(|e| e.name));
            }
            Err(e) => break Err(e),
        }
        assert!(seen.len() < 64, "the listing loops: {seen:?}");
    };
    assert_eq!(errno(end), libc::EIO, "a listing that does not move on is EIO (seen {seen:?})");
    assert!(t0.elapsed() < Duration::from_secs(3), "in bounded time: {:?}", t0.elapsed());
    assert!(
        readdirs.load(Ordering::Relaxed) <= 3,
        "no call loop: {} READDIRs",
        readdirs.load(Ordering::Relaxed)
    );
    // The device goes on serving.
    assert_eq!(dev.d.getattr(ROOT).unwrap().mode & 0o777, 0o755);
}

#[test]
fn garbage_for_a_readdir_reply_is_eio_and_the_device_goes_on() {
    let readdirs = Arc::new(AtomicU32::new(0));
    let server = FakeServer::start(script(garbage(readdirs.clone()), Log::default()));
    let mut dev = serve(&server);
    let open = dev.d.opendir(ROOT).unwrap();
    let t0 = Instant::now();
    assert_eq!(errno(dev.d.readdir(ROOT, open.fh, 2, 4096)), libc::EIO);
    assert_eq!(readdirs.load(Ordering::Relaxed), 1, "one READDIR, answered with garbage");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(dev.d.getattr(ROOT).unwrap().mode & 0o777, 0o755, "the next request is served");
}

/// A hook that answers each COMPOUND `pick` chooses with `status` and no result after SEQUENCE:
/// with SEQUENCE's result (`Some(true)`) or no result at all (`Some(false)`).
fn fail_when(mut pick: impl FnMut(&nfs4::Compound) -> Option<(Nfsstat4, bool)> + Send + 'static) -> Hook {
    Box::new(move |c, call| {
        let (status, with_seq) = pick(c)?;
        let results = match c.seq() {
            Some(s) if with_seq => vec![seq_ok(&s, 63, 63, 0)],
            _ => Vec::new(),
        };
        Some(vec![Act::Send(compound_reply(call.xid, status, &results))])
    })
}

#[test]
fn a_compound_failed_at_sequence_or_before_any_operation_is_never_a_success() {
    let log = Log::default();
    let hook = fail_when(|c| {
        let ops = c.ops();
        if ops.contains(&OpNum::Remove) {
            // No result at all (a server that failed before SEQUENCE: SERVERFAULT).
            Some((Nfsstat4::ServerFault, false))
        } else if ops.contains(&OpNum::Rename) {
            // SEQUENCE's result only.
            Some((Nfsstat4::ServerFault, true))
        } else if ops == [OpNum::Putfh, OpNum::Lookup] {
            // RENAME_NOREPLACE's check of the target.
            Some((Nfsstat4::ServerFault, true))
        } else {
            None
        }
    });
    let server = FakeServer::start(script(hook, log.clone()));
    let mut dev = serve(&server);
    dev.d.lookup(ROOT, "f").unwrap();
    assert_eq!(errno(dev.d.unlink(ROOT, "f")), libc::EIO, "an UNLINK whose REMOVE never ran");
    assert_eq!(errno(dev.d.rename(ROOT, "f", ROOT, "g")), libc::EIO, "a RENAME that never ran");
    assert_eq!(
        errno(dev.d.rename2(ROOT, "f", ROOT, "g", libc::RENAME_NOREPLACE)),
        libc::EIO,
        "RENAME_NOREPLACE's check that never ran: neither EEXIST nor a RENAME"
    );
    let sent = log.lock().unwrap().clone();
    assert_eq!(sent.iter().filter(|ops| ops.contains(&OpNum::Rename)).count(), 1, "{sent:?}");
    assert_eq!(dev.d.getattr(ROOT).unwrap().mode & 0o777, 0o755, "the device serves on");
}

#[test]
fn a_failed_close_still_removes_the_silly_name_and_is_counted() {
    let log = Log::default();
    let removed = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
    let r = removed.clone();
    let hook: Hook = Box::new(move |c, call| {
        if let Some(Arg::Remove(name)) = c.ops.iter().find(|o| o.op() == OpNum::Remove) {
            r.lock().unwrap().push(name.clone());
        }
        // Every CLOSE fails as after a server restart: the open's stateid is unknown.
        let s = c.seq()?;
        c.ops.iter().any(|o| o.op() == OpNum::Close).then(|| {
            let results = [
                seq_ok(&s, 63, 63, 0),
                ok(OpNum::Putfh, &[]),
                nfs4::failed(OpNum::Close, Nfsstat4::StaleStateid),
            ];
            vec![Act::Send(compound_reply(call.xid, Nfsstat4::StaleStateid, &results))]
        })
    });
    let server = FakeServer::start(script(hook, log.clone()));
    let mut dev = serve(&server);
    let e = dev.d.lookup(ROOT, "f").unwrap();
    let open = dev.d.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    // Unlinked while open: renamed to its silly name.
    dev.d.unlink(ROOT, "f").unwrap();
    assert!(removed.lock().unwrap().is_empty(), "renamed, not removed");
    dev.d.release(e.nodeid, open.fh).unwrap();
    let removed = removed.lock().unwrap().clone();
    assert_eq!(removed.len(), 1, "the silly name goes although its CLOSE failed: {:?}", log.lock().unwrap());
    assert!(removed[0].starts_with(b".nfs"), "{:?}", String::from_utf8_lossy(&removed[0]));
    assert_eq!(dev.handler.server().filesystem().stats().close_failures, 1, "the failed CLOSE is counted");
}

#[test]
fn a_close_that_failed_or_got_no_reply_goes_again() {
    let closes = Arc::new(AtomicU32::new(0));
    let n = closes.clone();
    let mut silent_since: Option<Instant> = None;
    let hook: Hook = Box::new(move |c, call| {
        if !c.ops.iter().any(|o| o.op() == OpNum::Close) {
            return None;
        }
        // The first CLOSE fails SERVERFAULT; the next gets no reply, nor do its retransmissions,
        // past the device's 3 s timeout; then a CLOSE goes.
        let s = c.seq()?;
        if n.fetch_add(1, Ordering::SeqCst) == 0 {
            let results = [
                seq_ok(&s, 63, 63, 0),
                ok(OpNum::Putfh, &[]),
                nfs4::failed(OpNum::Close, Nfsstat4::ServerFault),
            ];
            return Some(vec![Act::Send(compound_reply(call.xid, Nfsstat4::ServerFault, &results))]);
        }
        let since = *silent_since.get_or_insert_with(Instant::now);
        (since.elapsed() < Duration::from_millis(3500)).then(Vec::new)
    });
    let server = FakeServer::start(script(hook, Log::default()));
    let mut dev = serve(&server);
    let e = dev.d.lookup(ROOT, "f").unwrap();
    let open = dev.d.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    // RELEASE is answered although its CLOSE failed; the open goes again from the background
    // (the pollers' renewals would keep it on the server for the client's life).
    dev.d.release(e.nodeid, open.fh).unwrap();
    let failures = |dev: &Dev| dev.handler.server().filesystem().stats().close_failures;
    let t0 = Instant::now();
    while failures(&dev) < 2 {
        assert!(t0.elapsed() < Duration::from_secs(10), "{} CLOSEs", closes.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(20));
    }
    // The third try goes after the silence, answered; nothing after it.
    std::thread::sleep(Duration::from_millis(1500));
    let sent = closes.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(closes.load(Ordering::SeqCst), sent, "no CLOSE after the one that went");
    assert!(sent >= 3, "{sent}");
    assert_eq!(failures(&dev), 2);
    assert_eq!(dev.d.getattr(ROOT).unwrap().mode & 0o777, 0o755, "the device serves on");
}

#[test]
fn a_lock_state_whose_release_failed_is_let_go_again() {
    let lockus = Arc::new(AtomicU32::new(0));
    let frees = Arc::new(AtomicU32::new(0));
    let (n, f) = (lockus.clone(), frees.clone());
    let hook: Hook = Box::new(move |c, call| {
        if c.ops.iter().any(|o| o.op() == OpNum::FreeStateid) {
            f.fetch_add(1, Ordering::SeqCst);
        }
        if !c.ops.iter().any(|o| o.op() == OpNum::Locku) {
            return None;
        }
        // The FLUSH's LOCKU fails SERVERFAULT; the next one goes.
        let s = c.seq()?;
        (n.fetch_add(1, Ordering::SeqCst) == 0).then(|| {
            let results = [
                seq_ok(&s, 63, 63, 0),
                ok(OpNum::Putfh, &[]),
                nfs4::failed(OpNum::Locku, Nfsstat4::ServerFault),
            ];
            vec![Act::Send(compound_reply(call.xid, Nfsstat4::ServerFault, &results))]
        })
    });
    let server = FakeServer::start(script(hook, Log::default()));
    let mut dev = serve(&server);
    let e = dev.d.lookup(ROOT, "f").unwrap();
    let open = dev.d.open(e.nodeid, libc::O_RDWR as u32).unwrap();
    let lock = LockReq { fh: open.fh, owner: 1, typ: libc::F_WRLCK, start: 0, end: 99, pid: 5, flock: false };
    dev.d.setlk(e.nodeid, &lock).unwrap();
    // The process closes the file: FLUSH is answered, its lock state goes again from the
    // background (the pollers' renewals would keep the lock on the server).
    dev.d.flush_owner(e.nodeid, open.fh, 1).unwrap();
    let t0 = Instant::now();
    while frees.load(Ordering::SeqCst) < 2 {
        assert!(t0.elapsed() < Duration::from_secs(5), "{} LOCKUs", lockus.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!((lockus.load(Ordering::SeqCst), frees.load(Ordering::SeqCst)), (2, 2), "once more, not again");
    assert_eq!(dev.handler.server().filesystem().stats().locks.freed, 1);
    dev.d.release(e.nodeid, open.fh).unwrap();
}

#[test]
fn a_failed_delegreturn_after_an_open_keeps_the_answer() {
    let mut seen_create = false;
    let hook: Hook = Box::new(move |c, call| {
        let s = c.seq()?;
        let ops = c.ops();
        seen_create |= ops.contains(&OpNum::Getfh) && ops.contains(&OpNum::Open);
        if ops.contains(&OpNum::Open) && !ops.contains(&OpNum::Close) {
            // Every OPEN gets a delegation although the client asked for none.
            let mut results = vec![seq_ok(&s, 63, 63, 0)];
            for op in &c.ops[1..] {
                results.push(match op {
                    Arg::Open { .. } => open_ok_deleg([3; 12], Some([4; 12])),
                    Arg::Getfh => getfh_ok(&Fh::new(b"f:new").unwrap()),
                    Arg::Getattr(_) => getattr_ok(&file_attrs(77)),
                    other => ok(other.op(), &[]),
                });
            }
            return Some(vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, &results))]);
        }
        // The first DELEGRETURN (and its retransmissions) is never answered: the call ends at
        // the request's deadline; the second fails before any operation ran.
        if !ops.contains(&OpNum::Delegreturn) {
            return None;
        }
        if seen_create {
            Some(vec![Act::Send(compound_reply(call.xid, Nfsstat4::ServerFault, &[]))])
        } else {
            Some(Vec::new())
        }
    });
    let log = Log::default();
    let server = FakeServer::start(script(hook, log.clone()));
    let mut dev = serve(&server);
    let e = dev.d.lookup(ROOT, "f").unwrap();
    let open =
        dev.d.open(e.nodeid, libc::O_RDONLY as u32).expect("the OPEN's answer, whatever DELEGRETURN did");
    assert_eq!(dev.d.read(e.nodeid, open.fh, 0, 10).unwrap(), vec![7; 10], "the handle is kept");
    dev.d.release(e.nodeid, open.fh).unwrap();
    let (c, o) = dev.d.create(ROOT, "new", 0o644, libc::O_RDWR as u32).expect("CREATE's answer too");
    assert_eq!(c.attr.ino, 77);
    dev.d.release(c.nodeid, o.fh).unwrap();
    let sent = log.lock().unwrap().clone();
    assert!(sent.iter().filter(|ops| ops.contains(&OpNum::Delegreturn)).count() >= 2, "{sent:?}");
    assert_eq!(
        sent.iter().filter(|ops| ops.contains(&OpNum::Close)).count(),
        2,
        "both opens closed: {sent:?}"
    );
}

#[test]
fn a_readdir_whose_names_are_all_skipped_is_eio_not_the_end() {
    let hook: Hook = Box::new(move |c, call| {
        let Some(Arg::Readdir { verf, .. }) = c.ops.iter().find(|o| o.op() == OpNum::Readdir) else {
            return None;
        };
        let s = c.seq().unwrap();
        let a = file_attrs(9);
        let long = [b'x'; 300];
        let entries: [(u64, &[u8], Fattr4); 4] =
            [(3, b"", a), (4, b"a/b", a), (5, b"nul\0", a), (6, &long, a)];
        let results = [
            seq_ok(&s, 63, 63, 0),
            ok(OpNum::Putfh, &[]),
            getattr_ok(&dir_attrs()),
            readdir_ok(*verf, &entries, false),
        ];
        Some(vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, &results))])
    });
    let server = FakeServer::start(script(hook, Log::default()));
    let mut dev = serve(&server);
    let open = dev.d.opendir(ROOT).unwrap();
    // From offset 2 (after `.` and `..`): nothing the guest can take, and not the end.
    assert_eq!(errno(dev.d.readdir(ROOT, open.fh, 2, 4096)), libc::EIO, "not 0 bytes (the end)");
    // `.` and `..` from 0 still come (the listing's start is not empty).
    assert_eq!(dev.d.readdir(ROOT, open.fh, 0, 4096).unwrap().len(), 2);
}

#[test]
fn reads_keep_within_the_reply_size_the_session_was_granted() {
    // The server grants 20000-byte replies (the client asked for its 1 MiB reads and more), and
    // fails a READ whose reply would not fit.
    let counts = Arc::new(Mutex::new(Vec::new()));
    let seen = counts.clone();
    let hook: Hook = Box::new(move |c, call| {
        let reply =
            |results: &[Vec<u8>]| Some(vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, results))]);
        match c.ops.as_slice() {
            [Arg::CreateSession { sequence, fore, .. }] => {
                let fore = ChannelAttrs { maxresponsesize: 20_000, ..*fore };
                reply(&[create_session_ok(SessionId([4; 16]), *sequence, &fore)])
            }
            [Arg::Sequence(s), Arg::Putfh(_), Arg::Read { count, .. }] => {
                seen.lock().unwrap().push(*count);
                let r = if *count > 20_000 - 200 {
                    nfs4::failed(OpNum::Read, Nfsstat4::RepTooBig)
                } else {
                    read_ok(false, &vec![5; *count as usize])
                };
                let status = if *count > 20_000 - 200 { Nfsstat4::RepTooBig } else { Nfsstat4::Ok };
                let results = [seq_ok(s, 63, 63, 0), ok(OpNum::Putfh, &[]), r];
                Some(vec![Act::Send(compound_reply(call.xid, status, &results))])
            }
            _ => None,
        }
    });
    let server = FakeServer::start(script(hook, Log::default()));
    let mut dev = serve(&server);
    let e = dev.d.lookup(ROOT, "f").unwrap();
    let open = dev.d.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    let data = dev.d.read(e.nodeid, open.fh, 0, 64 << 10).expect("a large READ in pieces the session takes");
    assert_eq!(data, vec![5; 64 << 10]);
    let counts = counts.lock().unwrap().clone();
    assert!(counts.iter().all(|&c| c <= 16 << 10), "{counts:?}");
    assert_eq!(counts.len(), 4, "{counts:?}");
}

/// Answers `c` as the script would, except the result of the first operation `at` (after
/// SEQUENCE) is `fail`, the last one sent, with the COMPOUND's status `status`.
fn answer_failing_at(c: &nfs4::Compound, xid: u32, at: OpNum, fail: Vec<u8>, status: Nfsstat4) -> Vec<Act> {
    let s = c.seq().unwrap();
    let mut results = vec![seq_ok(&s, 63, 63, 0)];
    for op in &c.ops[1..] {
        if op.op() == at {
            results.push(fail);
            return vec![Act::Send(compound_reply(xid, status, &results))];
        }
        results.push(match op {
            Arg::Open { .. } => open_ok([9; 12]),
            Arg::Getfh => getfh_ok(&Fh::new(b"f:new").unwrap()),
            Arg::Getattr(_) => getattr_ok(&file_attrs(88)),
            Arg::Link(_) => link_ok(),
            Arg::Setattr { .. } => setattr_ok(),
            other => ok(other.op(), &[]),
        });
    }
    vec![Act::Send(compound_reply(xid, Nfsstat4::Ok, &results))]
}

#[test]
fn a_delay_after_an_operation_that_must_not_run_twice_sends_only_the_rest() {
    let log = Log::default();
    let mut delayed = 0;
    let hook: Hook = Box::new(move |c, call| {
        let ops = c.ops();
        let first_time = |n: &mut i32, bit: i32| {
            let f = *n & bit == 0;
            *n |= bit;
            f
        };
        if ops.contains(&OpNum::Link) && first_time(&mut delayed, 1) {
            // LINK ran; its GETATTR is answered DELAY.
            return Some(answer_failing_at(
                c,
                call.xid,
                OpNum::Getattr,
                nfs4::failed(OpNum::Getattr, Nfsstat4::Delay),
                Nfsstat4::Delay,
            ));
        }
        if ops.contains(&OpNum::Open) && ops.contains(&OpNum::Setattr) && first_time(&mut delayed, 2) {
            // The exclusive create's OPEN ran; the SETATTR of its times is answered GRACE.
            return Some(answer_failing_at(
                c,
                call.xid,
                OpNum::Setattr,
                nfs4::setattr_failed(Nfsstat4::Grace),
                Nfsstat4::Grace,
            ));
        }
        if ops == [OpNum::Putfh, OpNum::Create, OpNum::Getfh, OpNum::Getattr] && first_time(&mut delayed, 4) {
            // MKDIR's CREATE ran; its GETFH is answered DELAY.
            let results = [
                seq_ok(&c.seq().unwrap(), 63, 63, 0),
                ok(OpNum::Putfh, &[]),
                nfs4::create_ok(),
                nfs4::failed(OpNum::Getfh, Nfsstat4::Delay),
            ];
            return Some(vec![Act::Send(compound_reply(call.xid, Nfsstat4::Delay, &results))]);
        }
        None
    });
    let server = FakeServer::start(script(hook, log.clone()));
    let mut dev = serve(&server);
    let e = dev.d.lookup(ROOT, "f").unwrap();
    let l = dev.d.link(e.nodeid, ROOT, "g").expect("LINK ran: the entry comes from a GETATTR alone");
    assert_eq!(l.nodeid, e.nodeid);
    let (c, o) =
        dev.d.create(ROOT, "new", 0o644, (libc::O_RDWR | libc::O_EXCL) as u32).expect("CREATE's rest");
    assert_eq!(c.attr.mode & libc::S_IFMT, libc::S_IFREG, "the attributes of the rest's GETATTR");
    dev.d.release(c.nodeid, o.fh).unwrap();
    dev.d.mkdir(ROOT, "d", 0o755).expect("MKDIR's rest: a LOOKUP");
    let sent = log.lock().unwrap().clone();
    let count = |op| sent.iter().filter(|ops| ops.contains(&op)).count();
    assert_eq!(count(OpNum::Link), 1, "LINK once (again it would be EEXIST): {sent:?}");
    assert_eq!(count(OpNum::Open), 1, "OPEN once: {sent:?}");
    assert_eq!(count(OpNum::Create), 1, "CREATE once: {sent:?}");
    assert!(sent.contains(&vec![OpNum::Putfh, OpNum::Getattr]), "LINK's rest: {sent:?}");
    assert!(sent.contains(&vec![OpNum::Putfh, OpNum::Setattr, OpNum::Getattr]), "CREATE's rest: {sent:?}");
    assert!(sent.contains(&vec![OpNum::Putfh, OpNum::Lookup, OpNum::Getfh, OpNum::Getattr]), "{sent:?}");
}

#[test]
fn an_open_whose_compound_failed_after_it_is_closed() {
    let log = Log::default();
    let hook: Hook = Box::new(move |c, call| {
        let ops = c.ops();
        // O_TRUNC's SETATTR after the OPEN is refused.
        (ops.contains(&OpNum::Open) && ops.contains(&OpNum::Setattr)).then(|| {
            answer_failing_at(
                c,
                call.xid,
                OpNum::Setattr,
                nfs4::setattr_failed(Nfsstat4::Access),
                Nfsstat4::Access,
            )
        })
    });
    let server = FakeServer::start(script(hook, log.clone()));
    let mut dev = serve(&server);
    let e = dev.d.lookup(ROOT, "f").unwrap();
    assert_eq!(errno(dev.d.open(e.nodeid, (libc::O_RDWR | libc::O_TRUNC) as u32)), libc::EACCES);
    let sent = log.lock().unwrap().clone();
    assert_eq!(sent.last(), Some(&vec![OpNum::Putfh, OpNum::Close]), "the open that ran is closed: {sent:?}");
}

// A server that restarts: it forgets its sessions, client ids and state, and keeps a grace
// period in which only reclaims (OPEN CLAIM_PREVIOUS, LOCK with reclaim) are served, until
// RECLAIM_COMPLETE. Every operation it is sent goes to its log with what it made of it.

/// One operation the restartable server was sent (after SEQUENCE), with what it did.
#[derive(Clone, Debug)]
struct Rec {
    /// The server's instance that met it (1 before the first restart).
    epoch: u8,
    xid: u32,
    arg: Arg,
    /// The current file handle it applied to.
    fh: Vec<u8>,
    /// The stateid it carried.
    stateid: Option<[u8; 16]>,
    /// The server's answer.
    status: Nfsstat4,
    /// The stateid it gave (OPEN, LOCK).
    gave: Option<[u8; 16]>,
    /// The COMPOUND's reply was dropped (done, not answered).
    dropped: bool,
    /// The call's AUTH_SYS uid.
    uid: Option<u32>,
}

impl Rec {
    /// OPEN CLAIM_PREVIOUS, LOCK with reclaim, RECLAIM_COMPLETE.
    fn reclaims(&self) -> bool {
        matches!(
            self.arg,
            Arg::Open { previous: Some(_), .. }
                | Arg::Lock { reclaim: true, .. }
                | Arg::ReclaimComplete { .. }
        )
    }

    fn file(&self) -> &[u8] {
        self.fh.strip_prefix(b"f:").unwrap_or(&self.fh)
    }
}

/// The log, one line an operation.
fn show(log: &[Rec]) -> String {
    let hex = |s: &Option<[u8; 16]>| {
        s.map(|s| format!("{}:{:02x?}", u32::from_be_bytes(s[..4].try_into().unwrap()), &s[4..7]))
    };
    log.iter()
        .map(|r| {
            let arg = match &r.arg {
                Arg::Write { offset, stable, data } => {
                    format!("Write {{ offset: {offset}, stable: {stable}, {} bytes }}", data.len())
                }
                a => format!("{a:?}").chars().take(120).collect(),
            };
            format!(
                "e{} xid {:#x} {:?} {arg} from {:?} -> {:?} gave {:?}{}\n",
                r.epoch,
                r.xid,
                String::from_utf8_lossy(r.file()),
                hex(&r.stateid),
                r.status,
                hex(&r.gave),
                if r.dropped { " (dropped)" } else { "" }
            )
        })
        .collect()
}

/// What a test's plan makes of an operation before the server does it.
enum Fate {
    Serve,
    /// Fails with this status.
    Refuse(Nfsstat4),
    /// Done, but the COMPOUND gets no reply.
    Drop,
    /// The server restarts first (the COMPOUND meets the new instance: BADSESSION).
    Restart,
}

/// The plan: the server's state, the call, the operation, the current file handle.
type Plan = Box<dyn FnMut(&Srv, &Call, &Arg, &[u8]) -> Fate + Send>;

#[derive(Debug)]
struct Srv {
    epoch: u8,
    grace: bool,
    /// RECLAIM_COMPLETE came for the current client id.
    completed: bool,
    /// The stateids (`other`, with their seqid) this instance gave and did not let go.
    known: HashMap<[u8; 12], u32>,
    given: u8,
    sessions: u8,
    log: Vec<Rec>,
    /// UNSTABLE4 WRITEs are answered UNSTABLE4, with the instance's write verifier (its
    /// epoch), which COMMIT gives: a restart loses them (else every WRITE is FILE_SYNC4).
    unstable: bool,
}

impl Srv {
    fn new() -> Srv {
        Srv {
            epoch: 1,
            grace: false,
            completed: false,
            known: HashMap::new(),
            given: 0,
            sessions: 0,
            log: Vec::new(),
            unstable: false,
        }
    }

    /// The server restarts: sessions, client ids and state forgotten, a grace period begins.
    fn restart(&mut self) {
        self.epoch += 1;
        self.grace = true;
        self.completed = false;
        self.known.clear();
    }

    fn clientid(&self) -> u64 {
        0x4100 + u64::from(self.epoch)
    }

    /// A new stateid's `other` of `kind` (`b'O'` open, `b'L'` lock), known from now on.
    fn give(&mut self, kind: u8) -> [u8; 12] {
        self.given += 1;
        let mut o = [0; 12];
        (o[0], o[1], o[2]) = (self.epoch, kind, self.given);
        self.known.insert(o, 1);
        o
    }

    /// Whether stateid `s` may be used: special, or given by this instance and not let go.
    fn check(&self, s: [u8; 16]) -> Result<[u8; 12], Nfsstat4> {
        let other: [u8; 12] = s[4..].try_into().unwrap();
        if other == [0; 12] || other == [0xff; 12] {
            Ok(other)
        } else if other[0] != self.epoch {
            Err(Nfsstat4::StaleStateid)
        } else if !self.known.contains_key(&other) {
            Err(Nfsstat4::BadStateid)
        } else {
            Ok(other)
        }
    }

    /// The operations met by instance `epoch`.
    fn of(&self, epoch: u8) -> Vec<Rec> {
        self.log.iter().filter(|r| r.epoch == epoch).cloned().collect()
    }
}

fn stateid(seqid: u32, other: [u8; 12]) -> [u8; 16] {
    let mut s = [0; 16];
    s[..4].copy_from_slice(&seqid.to_be_bytes());
    s[4..].copy_from_slice(&other);
    s
}

/// The restartable server's script (see [`Srv`]); `plan` may make it misbehave.
fn restartable(srv: Arc<Mutex<Srv>>, mut plan: Plan) -> impl FnMut(&Call) -> Vec<Act> + Send + 'static {
    let root = b"root-of-the-export".to_vec();
    move |call: &Call| {
        let c = nfs4::parse(&call.args);
        let mut g = srv.lock().unwrap();
        let s = &mut *g;
        let reply = |status, results: &[Vec<u8>]| vec![Act::Send(compound_reply(call.xid, status, results))];
        let bad_session =
            || reply(Nfsstat4::BadSession, &[nfs4::failed(OpNum::Sequence, Nfsstat4::BadSession)]);
        if std::env::var_os("HOSTILE_TRACE").is_some() {
            eprintln!("e{} conn {} xid {:#x} {:?}", s.epoch, call.conn, call.xid, c.ops());
        }
        let seq = match c.ops.first() {
            Some(Arg::ExchangeId { .. }) => {
                return reply(Nfsstat4::Ok, &[exchange_id_ok(s.clientid(), 1, 0)])
            }
            Some(Arg::CreateSession { clientid, sequence, fore, .. }) => {
                if *clientid != s.clientid() {
                    let st = Nfsstat4::StaleClientid;
                    return reply(st, &[nfs4::failed(OpNum::CreateSession, st)]);
                }
                s.sessions += 1;
                let mut id = [0; 16];
                (id[0], id[1]) = (s.epoch, s.sessions);
                return reply(Nfsstat4::Ok, &[create_session_ok(SessionId(id), *sequence, fore)]);
            }
            Some(op @ (Arg::DestroySession(_) | Arg::DestroyClientid(_))) => {
                return reply(Nfsstat4::Ok, &[ok(op.op(), &[])])
            }
            Some(Arg::Sequence(q)) if q.session.0[0] != s.epoch => return bad_session(),
            Some(Arg::Sequence(q)) => *q,
            other => panic!("a COMPOUND starting with {other:?}"),
        };
        let mut results = vec![seq_ok(&seq, 63, 63, 0)];
        let mut current = root.clone();
        let mut status = Nfsstat4::Ok;
        let mut dropped = false;
        let first = s.log.len();
        for (i, op) in c.ops.iter().enumerate().skip(1) {
            let carried = c.stateid(i);
            let fate = plan(s, call, op, &current);
            let mut gave = None;
            let res: Result<Vec<u8>, Nfsstat4> = match fate {
                Fate::Restart => {
                    s.restart();
                    s.log.truncate(first);
                    return bad_session();
                }
                Fate::Refuse(st) => Err(st),
                Fate::Drop | Fate::Serve => {
                    dropped |= matches!(fate, Fate::Drop);
                    match op {
                        Arg::Putfh(fh) => {
                            current = fh.clone();
                            Ok(ok(op.op(), &[]))
                        }
                        Arg::Putrootfh => {
                            current = root.clone();
                            Ok(ok(op.op(), &[]))
                        }
                        Arg::Lookup(name) => {
                            if name.as_slice() != b"export" {
                                current = [b"f:".as_slice(), name].concat();
                            }
                            Ok(ok(op.op(), &[]))
                        }
                        Arg::Getfh => Ok(getfh_ok(&Fh::new(&current).unwrap())),
                        Arg::Getattr(_) if current == root => Ok(getattr_ok(&dir_attrs())),
                        Arg::Getattr(_) => Ok(getattr_ok(&file_attrs(10 + current.len() as u64))),
                        Arg::Open { name, previous, .. } => {
                            if let Some(name) = name {
                                current = [b"f:".as_slice(), name].concat();
                            }
                            match (previous, s.grace) {
                                (Some(_), false) => Err(Nfsstat4::NoGrace),
                                (None, true) => Err(Nfsstat4::Grace),
                                _ => {
                                    let o = s.give(b'O');
                                    gave = Some(stateid(1, o));
                                    Ok(open_ok(o))
                                }
                            }
                        }
                        Arg::Close { stateid: st } => s.check(*st).map(|o| {
                            s.known.remove(&o);
                            close_ok()
                        }),
                        Arg::Lock { reclaim, new_owner, stateid: st, .. } => match (reclaim, s.grace) {
                            (true, false) => Err(Nfsstat4::NoGrace),
                            (false, true) => Err(Nfsstat4::Grace),
                            _ => s.check(*st).map(|o| {
                                let (seqid, other) = if *new_owner {
                                    (1, s.give(b'L'))
                                } else {
                                    let n = s.known.get_mut(&o).unwrap();
                                    *n += 1;
                                    (*n, o)
                                };
                                gave = Some(stateid(seqid, other));
                                nfs4::lock_ok_seq(OpNum::Lock, seqid, other)
                            }),
                        },
                        Arg::Locku { stateid: st, .. } => s.check(*st).map(|o| {
                            let n = s.known.get_mut(&o).unwrap();
                            *n += 1;
                            nfs4::lock_ok_seq(OpNum::Locku, *n, o)
                        }),
                        Arg::FreeStateid { stateid: st } => s.check(*st).map(|o| {
                            s.known.remove(&o);
                            ok(op.op(), &[])
                        }),
                        Arg::ReclaimComplete { .. } if s.completed => Err(Nfsstat4::CompleteAlready),
                        Arg::ReclaimComplete { .. } => {
                            (s.completed, s.grace) = (true, false);
                            Ok(ok(op.op(), &[]))
                        }
                        Arg::Read { count, .. } => s
                            .check(carried.unwrap())
                            .map(|_| read_ok(true, &vec![7; (*count).min(100) as usize])),
                        Arg::Write { data, stable, .. } => {
                            let (how, verf) = if s.unstable { (*stable, [s.epoch; 8]) } else { (2, [0; 8]) };
                            s.check(carried.unwrap()).map(|_| write_ok(data.len() as u32, how, verf))
                        }
                        Arg::Commit { .. } => Ok(commit_ok([s.epoch; 8])),
                        Arg::Setattr { stateid: st } => s.check(*st).map(|_| setattr_ok()),
                        Arg::Delegreturn | Arg::Savefh | Arg::Restorefh => Ok(ok(op.op(), &[])),
                        Arg::Remove(_) => Ok(remove_ok()),
                        Arg::Rename { .. } => Ok(rename_ok()),
                        Arg::Link(_) => Ok(link_ok()),
                        other => panic!("the restartable server does not answer {:?}", other.op()),
                    }
                }
            };
            let st = *res.as_ref().err().unwrap_or(&Nfsstat4::Ok);
            if std::env::var_os("HOSTILE_TRACE").is_some() {
                eprintln!("e{} xid {:#x} {:?} -> {st:?}", s.epoch, call.xid, op.op());
            }
            s.log.push(Rec {
                epoch: s.epoch,
                xid: call.xid,
                arg: op.clone(),
                fh: current.clone(),
                stateid: carried,
                status: st,
                gave,
                dropped: false,
                uid: call.sys.map(|c| c.0),
            });
            match res {
                Ok(r) => results.push(r),
                Err(e) => {
                    results.push(if op.op() == OpNum::Setattr {
                        nfs4::setattr_failed(e)
                    } else {
                        nfs4::failed(op.op(), e)
                    });
                    status = e;
                    break;
                }
            }
        }
        if dropped {
            for r in &mut s.log[first..] {
                r.dropped = true;
            }
            return Vec::new();
        }
        reply(status, &results)
    }
}

/// Waits (at most `within`) until `f`, else fails with what `what` says.
fn wait_until(within: Duration, mut f: impl FnMut() -> bool, what: impl Fn() -> String) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < within, "{}", what());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn posix(fh: u64, owner: u64, typ: i32, start: u64, end: u64) -> LockReq {
    LockReq { fh, owner, typ, start, end, pid: 1000 + owner as u32, flock: false }
}

fn flock(fh: u64, typ: i32) -> LockReq {
    LockReq { fh, owner: fh, typ, start: 0, end: OFFSET_MAX, pid: 77, flock: true }
}

const RDWR: u32 = libc::O_RDWR as u32;
/// NFSv4's lock types (`nfs_lock_type4`): READ_LT, WRITE_LT.
const READ_LT: u32 = 1;
const WRITE_LT: u32 = 2;

/// A device on the restartable server with two files open (`a`, `b`) through one handle each.
struct Restarted {
    srv: Arc<Mutex<Srv>>,
    _server: FakeServer,
    dev: Dev,
    a: (u64, u64),
    b: (u64, u64),
}

fn restartable_device(plan: Plan, opts: impl FnOnce(&mut NfsOptions)) -> Restarted {
    let srv = Arc::new(Mutex::new(Srv::new()));
    let server = FakeServer::start(restartable(srv.clone(), plan));
    let mut dev = serve_with(&server, opts);
    let mut open = |name| {
        let e = dev.d.lookup(ROOT, name).unwrap();
        (e.nodeid, dev.d.open(e.nodeid, RDWR).unwrap().fh)
    };
    let (a, b) = (open("a"), open("b"));
    Restarted { srv, _server: server, dev, a, b }
}

impl Restarted {
    fn srv(&self) -> std::sync::MutexGuard<'_, Srv> {
        self.srv.lock().unwrap()
    }

    fn locks(&self) -> LockTotals {
        self.dev.handler.server().filesystem().stats().locks
    }

    /// The reclaim counters: (reclaims, opens reclaimed, opens not reclaimed, locks reclaimed,
    /// locks not reclaimed).
    fn reclaim_counts(&self) -> (u64, u64, u64, u64, u64) {
        let l = self.locks();
        (l.reclaims, l.opens_reclaimed, l.opens_not_reclaimed, l.locks_reclaimed, l.locks_not_reclaimed)
    }

    /// Waits for `n` reclaims to have ended (RECLAIM_COMPLETE answered or given up).
    fn reclaimed(&self, n: u64, within: Duration) {
        wait_until(
            within,
            || self.locks().reclaims >= n,
            || format!("{:?}\n{:#?}", self.locks(), self.srv().log),
        );
    }

    /// The open stateid the server gave instance `epoch`'s CLAIM_PREVIOUS of `file`.
    fn reclaimed_open(&self, epoch: u8, file: &[u8]) -> [u8; 16] {
        let log = self.srv().of(epoch);
        let opens: Vec<_> = log
            .iter()
            .filter(|r| {
                matches!(r.arg, Arg::Open { previous: Some(_), .. }) && r.file() == file && r.gave.is_some()
            })
            .collect();
        assert_eq!(opens.len(), 1, "one open of {:?} reclaimed: {log:#?}", String::from_utf8_lossy(file));
        opens[0].gave.unwrap()
    }
}

/// What a LOCK carried: the file, its type, offset, length, whether it came from an open
/// (`open_to_lock_owner4`), and the stateid it went from (its `other`: a lock stateid may go
/// with seqid 0, the current one).
fn lock_args(r: &Rec) -> (Vec<u8>, u32, u64, u64, bool, [u8; 12]) {
    let Arg::Lock { locktype, offset, length, new_owner, stateid, .. } = r.arg else { panic!("{r:?}") };
    (r.file().to_vec(), locktype, offset, length, new_owner, other(stateid))
}

fn other(s: [u8; 16]) -> [u8; 12] {
    s[4..].try_into().unwrap()
}

/// Short timeouts, for tests of calls whose replies never come.
fn quick_retransmit(o: &mut NfsOptions) {
    o.timeout = Duration::from_millis(1500);
    o.retransmit = Duration::from_millis(500);
}

/// `sent`: one call whose replies never came (every record of it dropped), then the same
/// operation sent again as a call of its own and answered once; the answered record.
fn dropped_then_answered<'a>(sent: &[&'a Rec], desc: &dyn Fn() -> String) -> &'a Rec {
    let (dropped, answered): (Vec<&Rec>, Vec<&Rec>) = sent.iter().partition(|r| r.dropped);
    assert!(!dropped.is_empty() && dropped.iter().all(|r| r.xid == dropped[0].xid), "{}", desc());
    assert_eq!(answered.len(), 1, "sent again, answered once: {}", desc());
    assert!(answered[0].xid != dropped[0].xid, "a call of its own: {}", desc());
    answered[0]
}

/// Where RECLAIM_COMPLETE is in `log`.
fn reclaim_complete_at(log: &[Rec], desc: &dyn Fn() -> String) -> usize {
    log.iter().position(|r| r.arg.op() == OpNum::ReclaimComplete).unwrap_or_else(|| panic!("{}", desc()))
}

/// The opens of `log` that are not reclaims and succeeded, with their places.
fn opened_anew(log: &[Rec]) -> Vec<(usize, &Rec)> {
    log.iter()
        .enumerate()
        .filter(|(_, r)| matches!(r.arg, Arg::Open { previous: None, .. }) && r.status == Nfsstat4::Ok)
        .collect()
}

/// A plan that drops every record of the first call with an operation `pick` chooses (the
/// server keeps no reply for it), and serves everything else.
fn silent_first(pick: impl Fn(&Srv, &Arg, &[u8]) -> bool + Send + 'static) -> Plan {
    let mut silent = None;
    Box::new(move |s, call, op, fh| {
        if pick(s, op, fh) && *silent.get_or_insert(call.xid) == call.xid {
            Fate::Drop
        } else {
            Fate::Serve
        }
    })
}

/// A device with short timeouts on a server run by `plan`: `a` locked (owner 1, 0-99), then the
/// server restarted and the reclaim done (a LOOKUP sets it off).
fn lock_restart_and_reclaim(plan: Plan) -> Restarted {
    let mut t = restartable_device(plan, quick_retransmit);
    let (a, fa) = t.a;
    t.dev.d.setlk(a, &posix(fa, 1, libc::F_WRLCK, 0, 99)).unwrap();
    t.srv().restart();
    t.dev.d.lookup(ROOT, "c").unwrap();
    t.reclaimed(1, Duration::from_secs(4));
    t
}

#[test]
fn a_server_restart_reclaims_every_open_and_lock_range_then_reclaim_complete_once() {
    let mut t = restartable_device(Box::new(|_, _, _, _| Fate::Serve), |_| {});
    let ((a, fa), (b, fb)) = (t.a, t.b);
    let d = &mut t.dev.d;
    // Two ranges of one owner and a read lock of another to the end of `a`; a flock of `b`.
    d.setlk(a, &posix(fa, 1, libc::F_WRLCK, 0, 99)).unwrap();
    d.setlk(a, &posix(fa, 1, libc::F_WRLCK, 200, 299)).unwrap();
    d.setlk(a, &posix(fa, 2, libc::F_RDLCK, 1000, OFFSET_MAX)).unwrap();
    d.setlk(b, &flock(fb, libc::F_WRLCK)).unwrap();
    d.write(a, fa, 0, b"before").unwrap();
    t.srv().restart();
    let t0 = Instant::now();
    // The WRITE meets the restart (BADSESSION, then STALE_CLIENTID), then its open unknown: it
    // waits for the reclaim and goes with the reclaimed open.
    assert_eq!(t.dev.d.write(a, fa, 0, b"after the restart").unwrap(), 17);
    t.reclaimed(1, Duration::from_secs(3));
    let took = t0.elapsed();

    let log = t.srv().of(2);
    let reclaims: Vec<&Rec> = log.iter().filter(|r| r.reclaims()).collect();
    let desc = || show(&log);
    // Every reclaim alone in its COMPOUND, answered OK.
    for r in &reclaims {
        assert_eq!(
            log.iter().filter(|o| o.xid == r.xid).count(),
            1 + usize::from(r.arg.op() != OpNum::ReclaimComplete)
        );
        assert_eq!(r.status, Nfsstat4::Ok, "{r:?}");
    }
    // The opens, each once, with no delegation, the handle's share access; then the locks; then
    // RECLAIM_COMPLETE, once, last.
    let (opens, rest) = reclaims.split_at(2);
    let mut files: Vec<&[u8]> = opens.iter().map(|r| r.file()).collect();
    files.sort();
    assert_eq!(files, [b"a".as_slice(), b"b"], "{}", desc());
    for r in opens {
        let Arg::Open { share_access, previous, create, .. } = &r.arg else { panic!("{r:?}") };
        assert_eq!((*previous, share_access & 0xff, *create), (Some(0), 3, false), "{r:?}");
    }
    let (locks, complete) = rest.split_at(rest.len() - 1);
    assert!(matches!(complete[0].arg, Arg::ReclaimComplete { one_fs: false }), "{}", desc());
    assert_eq!(log.iter().filter(|r| r.arg.op() == OpNum::ReclaimComplete).count(), 1, "{}", desc());
    assert_eq!(locks.len(), 4, "{}", desc());
    let open_a = t.reclaimed_open(2, b"a");
    let open_b = t.reclaimed_open(2, b"b");
    let mut got: Vec<_> = locks.iter().map(|r| lock_args(r)).collect();
    // Owner 1's second range goes from the lock stateid its first gave.
    let at = |file: &[u8], offset| locks.iter().position(|r| r.file() == file && lock_args(r).2 == offset);
    let (first, second) = (at(b"a", 0), at(b"a", 200));
    let (Some(first), Some(second)) = (first, second) else { panic!("{}", desc()) };
    assert!(first < second, "{}", desc());
    let lock_1 = other(locks[first].gave.unwrap());
    let (open_a, open_b) = (other(open_a), other(open_b));
    got.sort_by_key(|g| (g.0.clone(), g.2));
    assert_eq!(
        got,
        [
            (b"a".to_vec(), WRITE_LT, 0, 100, true, open_a),
            (b"a".to_vec(), WRITE_LT, 200, 100, false, lock_1),
            (b"a".to_vec(), READ_LT, 1000, u64::MAX, true, open_a),
            (b"b".to_vec(), WRITE_LT, 0, u64::MAX, true, open_b),
        ],
        "{}",
        desc()
    );
    // Nothing but reclaims opened or locked before RECLAIM_COMPLETE (the server answers GRACE).
    let end = log.iter().position(|r| r.arg.op() == OpNum::ReclaimComplete).unwrap();
    assert!(
        log[..end].iter().all(|r| !matches!(r.arg.op(), OpNum::Open | OpNum::Lock) || r.reclaims()),
        "{}",
        desc()
    );
    assert!(log.iter().all(|r| r.status != Nfsstat4::Grace), "{}", desc());
    // The guest's WRITE went once with the reclaimed open, after it was reclaimed, and succeeded.
    let writes: Vec<_> =
        log.iter().filter(|r| r.arg.op() == OpNum::Write && r.status == Nfsstat4::Ok).collect();
    assert_eq!(writes.len(), 1, "{}", desc());
    assert_eq!(writes[0].stateid.map(other), Some(open_a), "{}", desc());
    assert!(matches!(&writes[0].arg, Arg::Write { data, .. } if data == b"after the restart"));
    let t2 = t.locks();
    assert_eq!(
        (t2.reclaims, t2.opens_reclaimed, t2.opens_not_reclaimed, t2.locks_reclaimed, t2.locks_not_reclaimed),
        (1, 2, 0, 3, 0),
        "{t2:?}"
    );
    eprintln!("reclaimed within {took:?} of the restart");

    // After the grace period: the reclaimed locks are the device's as before (a new range of
    // owner 1 goes from its reclaimed lock stateid, not from the open), I/O goes on.
    let d = &mut t.dev.d;
    d.setlk(a, &posix(fa, 1, libc::F_WRLCK, 500, 599)).unwrap();
    d.write(b, fb, 0, b"b after").unwrap();
    assert_eq!(d.read(a, fa, 0, 10).unwrap(), vec![7; 10]);
    let log = t.srv().of(2);
    let last = log.iter().rev().find(|r| r.arg.op() == OpNum::Lock).unwrap();
    assert_eq!(lock_args(last), (b"a".to_vec(), WRITE_LT, 500, 100, false, lock_1), "{last:?}");
    assert!(matches!(last.arg, Arg::Lock { reclaim: false, .. }) && last.status == Nfsstat4::Ok, "{last:?}");
    assert!(log.iter().all(|r| r.arg.op() != OpNum::Open || r.reclaims()), "nothing opened anew: {log:#?}");
}

#[test]
fn a_lock_whose_reclaim_is_refused_makes_its_file_eio_and_the_others_go_on() {
    for refusal in [Nfsstat4::ReclaimBad, Nfsstat4::NoGrace] {
        // The server refuses the reclaim of any lock of `a`.
        let plan: Plan = Box::new(move |_, _, op, fh| match op {
            Arg::Lock { reclaim: true, .. } if fh == b"f:a" => Fate::Refuse(refusal),
            _ => Fate::Serve,
        });
        let mut t = restartable_device(plan, |_| {});
        let ((a, fa), (b, fb)) = (t.a, t.b);
        let d = &mut t.dev.d;
        d.setlk(a, &posix(fa, 1, libc::F_WRLCK, 0, 99)).unwrap();
        d.setlk(b, &posix(fb, 2, libc::F_WRLCK, 0, 99)).unwrap();
        d.write(a, fa, 0, b"before").unwrap();
        t.srv().restart();
        // A request that meets the restart (no open, no lock of its own), then the reclaim.
        t.dev.d.lookup(ROOT, "c").unwrap();
        t.reclaimed(1, Duration::from_secs(3));
        let restart = t.srv().log.len();
        let d = &mut t.dev.d;
        // `a`'s lock is gone from the server: nothing goes through it unlocked.
        assert_eq!(errno(d.write(a, fa, 0, b"unlocked")), libc::EIO, "{refusal:?}");
        assert_eq!(errno(d.read(a, fa, 0, 10)), libc::EIO, "{refusal:?}");
        assert_eq!(errno(d.setlk(a, &posix(fa, 3, libc::F_WRLCK, 500, 599))), libc::EIO, "{refusal:?}");
        // `b`'s lock was reclaimed: its I/O and locks go on.
        assert_eq!(d.write(b, fb, 0, b"b after").unwrap(), 7);
        assert_eq!(d.read(b, fb, 0, 10).unwrap(), vec![7; 10]);
        d.setlk(b, &posix(fb, 2, libc::F_WRLCK, 200, 299)).unwrap();
        let log = t.srv().of(2);
        let desc = || format!("{refusal:?}:\n{}", show(&log));
        assert!(
            !t.srv().log[restart..].iter().any(|r| r.file() == b"a" && r.arg.op() != OpNum::Getattr),
            "nothing of `a` reached the server after the reclaim: {}",
            desc()
        );
        let of =
            |file: &[u8], op| log.iter().filter(|r| r.file() == file && r.arg.op() == op).collect::<Vec<_>>();
        assert!(of(b"a", OpNum::Write).is_empty(), "no WRITE of `a` after the restart: {}", desc());
        assert!(of(b"a", OpNum::Read).is_empty(), "{}", desc());
        let locks_a = of(b"a", OpNum::Lock);
        assert_eq!(locks_a.len(), 1, "{}", desc());
        assert_eq!(locks_a[0].status, refusal, "{}", desc());
        assert!(
            matches!(locks_a[0].arg, Arg::Lock { reclaim: true, offset: 0, length: 100, .. }),
            "{}",
            desc()
        );
        let locks_b = of(b"b", OpNum::Lock);
        assert_eq!(locks_b.len(), 2, "{}", desc());
        assert!(locks_b.iter().all(|r| r.status == Nfsstat4::Ok), "{}", desc());
        assert!(
            matches!(locks_b[0].arg, Arg::Lock { reclaim: true, offset: 0, length: 100, .. }),
            "{}",
            desc()
        );
        assert!(matches!(locks_b[1].arg, Arg::Lock { reclaim: false, offset: 200, .. }), "{}", desc());
        let writes_b = of(b"b", OpNum::Write);
        assert_eq!(writes_b.len(), 1, "{}", desc());
        assert_eq!(writes_b[0].stateid.map(other), Some(other(t.reclaimed_open(2, b"b"))), "{}", desc());
        assert_eq!(writes_b[0].status, Nfsstat4::Ok);
        assert_eq!(log.iter().filter(|r| r.arg.op() == OpNum::ReclaimComplete).count(), 1, "{}", desc());
        assert_eq!(t.reclaim_counts(), (1, 2, 0, 1, 1), "{refusal:?}: {:?}", t.locks());
        // Until its last close: then `a` opens (anew) and is written again.
        let d = &mut t.dev.d;
        d.flush_owner(a, fa, 1).unwrap();
        d.release(a, fa).unwrap();
        let fa = d.open(a, RDWR).unwrap().fh;
        assert_eq!(d.write(a, fa, 0, b"again").unwrap(), 5, "{refusal:?}");
        let log = t.srv().of(2);
        let w: Vec<_> = log.iter().filter(|r| r.file() == b"a" && r.arg.op() == OpNum::Write).collect();
        assert_eq!(w.len(), 1, "{}", show(&log));
        assert_eq!(w[0].status, Nfsstat4::Ok, "{}", show(&log));
    }
}

#[test]
fn a_reclaim_open_whose_reply_never_comes_is_sent_again_and_the_reclaim_completes() {
    // The first CLAIM_PREVIOUS of `a` is done but never answered (nor its retransmissions: the
    // server keeps no reply for it).
    let mut t = lock_restart_and_reclaim(silent_first(|_, op, fh| {
        matches!(op, Arg::Open { previous: Some(_), .. }) && fh == b"f:a"
    }));
    let ((a, fa), (b, fb)) = (t.a, t.b);
    let log = t.srv().of(2);
    let desc = || show(&log);
    let opens_a: Vec<_> = log
        .iter()
        .filter(|r| r.file() == b"a" && matches!(r.arg, Arg::Open { previous: Some(_), .. }))
        .collect();
    let answered = dropped_then_answered(&opens_a, &desc);
    // The lock goes from the open answered, then RECLAIM_COMPLETE, once.
    let locks: Vec<_> = log.iter().filter(|r| r.arg.op() == OpNum::Lock).collect();
    assert_eq!(locks.len(), 1, "{}", desc());
    assert_eq!(
        lock_args(locks[0]),
        (b"a".to_vec(), WRITE_LT, 0, 100, true, other(answered.gave.unwrap())),
        "{}",
        desc()
    );
    assert_eq!(locks[0].status, Nfsstat4::Ok);
    let complete: Vec<_> = log.iter().filter(|r| r.arg.op() == OpNum::ReclaimComplete).collect();
    assert_eq!(complete.len(), 1, "{}", desc());
    assert_eq!(complete[0].status, Nfsstat4::Ok);
    assert_eq!(t.reclaim_counts(), (1, 2, 0, 1, 0), "{:?}", t.locks());
    // Both files' I/O goes on with their reclaimed opens.
    let d = &mut t.dev.d;
    d.write(a, fa, 0, b"a after").unwrap();
    d.write(b, fb, 0, b"b after").unwrap();
    let log = t.srv().of(2);
    let writes: Vec<_> = log.iter().filter(|r| r.arg.op() == OpNum::Write).collect();
    assert_eq!(writes.len(), 2, "{}", show(&log));
    assert!(writes.iter().all(|w| w.status == Nfsstat4::Ok), "{}", show(&log));
    assert_eq!(writes[0].stateid.map(other), Some(other(answered.gave.unwrap())));
}

#[test]
fn a_second_restart_in_the_middle_of_the_reclaim_starts_it_over_on_the_newest_client_id() {
    // The server restarts again when the first reclaim's first LOCK reaches it.
    let plan: Plan = Box::new(move |s, _, op, _| match op {
        Arg::Lock { reclaim: true, .. } if s.epoch == 2 => Fate::Restart,
        _ => Fate::Serve,
    });
    let mut t = restartable_device(plan, |_| {});
    let ((a, fa), (b, fb)) = (t.a, t.b);
    let d = &mut t.dev.d;
    d.setlk(a, &posix(fa, 1, libc::F_WRLCK, 0, 99)).unwrap();
    d.setlk(b, &flock(fb, libc::F_RDLCK)).unwrap();
    t.srv().restart();
    t.dev.d.lookup(ROOT, "c").unwrap();
    wait_until(
        Duration::from_secs(4),
        || {
            let s = t.srv();
            s.epoch == 3 && s.completed
        },
        || format!("{:?}\n{}", t.locks(), show(&t.srv().log)),
    );
    let two = t.srv().of(2);
    let three = t.srv().of(3);
    let totals = t.locks();
    let desc = || format!("{totals:?}\nepoch 2:\n{}epoch 3:\n{}", show(&two), show(&three));
    assert!(two.iter().all(|r| r.arg.op() != OpNum::ReclaimComplete), "{}", desc());
    // The first reclaim's LOCK that met the restart is sent again on the new session (the
    // session resends what it had on the wire) and refused: its old open is unknown there; the
    // device lets that answer go. At most that one.
    let resent: Vec<_> =
        three.iter().filter(|r| r.reclaims() && r.status == Nfsstat4::StaleStateid).collect();
    assert!(resent.len() <= 1 && resent.iter().all(|r| r.arg.op() == OpNum::Lock), "{}", desc());
    // On the newest client id: both opens, both locks, one RECLAIM_COMPLETE, last.
    let reclaims: Vec<_> =
        three.iter().filter(|r| r.reclaims() && r.status != Nfsstat4::StaleStateid).collect();
    assert_eq!(reclaims.len(), 5, "{}", desc());
    assert!(reclaims.iter().all(|r| r.status == Nfsstat4::Ok), "{}", desc());
    assert!(reclaims[..2].iter().all(|r| r.arg.op() == OpNum::Open), "{}", desc());
    let mut opens: Vec<_> = reclaims[..2].iter().map(|r| r.file().to_vec()).collect();
    opens.sort();
    assert_eq!(opens, [b"a".to_vec(), b"b".to_vec()], "{}", desc());
    let (open_a, open_b) = (other(t.reclaimed_open(3, b"a")), other(t.reclaimed_open(3, b"b")));
    let mut locks: Vec<_> = reclaims[2..4].iter().map(|r| lock_args(r)).collect();
    locks.sort();
    assert_eq!(
        locks,
        [
            (b"a".to_vec(), WRITE_LT, 0, 100, true, open_a),
            (b"b".to_vec(), READ_LT, 0, u64::MAX, true, open_b)
        ],
        "{}",
        desc()
    );
    assert_eq!(reclaims[4].arg.op(), OpNum::ReclaimComplete, "{}", desc());
    assert_eq!(three.iter().filter(|r| r.arg.op() == OpNum::ReclaimComplete).count(), 1, "{}", desc());
    // Nothing lost, and I/O goes on with the newest opens.
    t.reclaimed(1, Duration::from_secs(1));
    let l = t.locks();
    assert_eq!((l.opens_not_reclaimed, l.locks_not_reclaimed), (0, 0), "{l:?}\n{}", desc());
    assert_eq!(l.locks_reclaimed, 2, "{l:?}\n{}", desc());
    let d = &mut t.dev.d;
    d.write(a, fa, 0, b"a after").unwrap();
    d.write(b, fb, 0, b"b after").unwrap();
    let three = t.srv().of(3);
    let writes: Vec<_> = three.iter().filter(|r| r.arg.op() == OpNum::Write).collect();
    assert_eq!(writes.len(), 2, "{}", show(&three));
    assert!(writes.iter().all(|w| w.status == Nfsstat4::Ok), "{}", show(&three));
    assert_eq!(writes[0].stateid.map(other), Some(open_a), "{}", show(&three));
    assert_eq!(writes[1].stateid.map(other), Some(open_b), "{}", show(&three));
}

#[test]
fn a_lock_and_an_open_asked_as_the_server_restarts_wait_for_the_reclaim_and_are_reclaimed_next_time() {
    let mut t = restartable_device(Box::new(|_, _, _, _| Fate::Serve), |_| {});
    let ((a, fa), (b, fb)) = (t.a, t.b);
    t.dev.d.setlk(a, &posix(fa, 1, libc::F_WRLCK, 0, 99)).unwrap();
    // A new lock owner's lock meets the restart: it waits for the reclaim, then is granted
    // from `b`'s reclaimed open, never in the grace period.
    t.srv().restart();
    t.dev.d.setlk(b, &posix(fb, 5, libc::F_RDLCK, 10, 19)).unwrap();
    t.reclaimed(1, Duration::from_secs(3));
    let log = t.srv().of(2);
    let desc = || show(&log);
    let end = reclaim_complete_at(&log, &desc);
    assert!(
        log[..end]
            .iter()
            .all(|r| r.status != Nfsstat4::Ok || !matches!(r.arg, Arg::Lock { reclaim: false, .. })),
        "nothing granted but reclaims before RECLAIM_COMPLETE: {}",
        desc()
    );
    let granted: Vec<_> = log
        .iter()
        .filter(|r| matches!(r.arg, Arg::Lock { reclaim: false, .. }) && r.status == Nfsstat4::Ok)
        .collect();
    assert_eq!(granted.len(), 1, "{}", desc());
    assert_eq!(
        lock_args(granted[0]),
        (b"b".to_vec(), READ_LT, 10, 10, true, other(t.reclaimed_open(2, b"b"))),
        "{}",
        desc()
    );
    // A new file opened as the server restarts again: opened once the reclaim is over.
    t.srv().restart();
    let c = t.dev.d.lookup(ROOT, "c").unwrap().nodeid;
    let fc = t.dev.d.open(c, RDWR).unwrap().fh;
    t.reclaimed(2, Duration::from_secs(3));
    t.dev.d.write(c, fc, 0, b"c").unwrap();
    let log = t.srv().of(3);
    let desc = || show(&log);
    let end = reclaim_complete_at(&log, &desc);
    let opened = opened_anew(&log);
    assert_eq!(opened.len(), 1, "{}", desc());
    assert!(opened[0].0 > end, "opened after RECLAIM_COMPLETE: {}", desc());
    // The second reclaim took back what the first left and the lock granted since: `a`'s and
    // `b`'s opens, owner 1's range of `a`, owner 5's of `b`.
    let reclaims: Vec<_> = log[..=end].iter().filter(|r| r.reclaims()).collect();
    assert_eq!(reclaims.len(), 5, "{}", desc());
    let mut locks: Vec<_> =
        reclaims.iter().filter(|r| r.arg.op() == OpNum::Lock).map(|r| lock_args(r)).collect();
    locks.sort();
    assert_eq!(
        locks,
        [
            (b"a".to_vec(), WRITE_LT, 0, 100, true, other(t.reclaimed_open(3, b"a"))),
            (b"b".to_vec(), READ_LT, 10, 10, true, other(t.reclaimed_open(3, b"b"))),
        ],
        "{}",
        desc()
    );
    assert!(reclaims.iter().all(|r| r.status == Nfsstat4::Ok), "{}", desc());
    assert_eq!(t.reclaim_counts(), (2, 4, 0, 3, 0), "{:?}", t.locks());
}

#[test]
fn a_refused_open_reclaim_is_opened_anew_when_used_unless_its_file_had_locks() {
    // Both opens' reclaims are refused; `b` had a lock, `a` none.
    let plan: Plan = Box::new(move |_, _, op, fh| match op {
        Arg::Open { previous: Some(_), .. } if fh == b"f:a" => Fate::Refuse(Nfsstat4::ReclaimBad),
        Arg::Open { previous: Some(_), .. } => Fate::Refuse(Nfsstat4::NoGrace),
        _ => Fate::Serve,
    });
    let mut t = restartable_device(plan, |_| {});
    let ((a, fa), (b, fb)) = (t.a, t.b);
    t.dev.d.setlk(b, &posix(fb, 1, libc::F_WRLCK, 0, 99)).unwrap();
    t.srv().restart();
    t.dev.d.lookup(ROOT, "c").unwrap();
    t.reclaimed(1, Duration::from_secs(3));
    let d = &mut t.dev.d;
    assert_eq!(d.write(a, fa, 0, b"a after").unwrap(), 7, "opened anew");
    assert_eq!(errno(d.write(b, fb, 0, b"unlocked")), libc::EIO, "never without its lock");
    let log = t.srv().of(2);
    let desc = || show(&log);
    // No lock reclaim without an open to go from; RECLAIM_COMPLETE all the same.
    assert!(log.iter().all(|r| r.arg.op() != OpNum::Lock), "{}", desc());
    let end = reclaim_complete_at(&log, &desc);
    // `a` opened anew (CLAIM_FH) after the reclaim, its WRITE with that open; nothing of `b`.
    let opened = opened_anew(&log);
    assert_eq!(opened.len(), 1, "{}", desc());
    assert!(opened[0].0 > end && opened[0].1.file() == b"a", "{}", desc());
    let writes: Vec<_> =
        log.iter().filter(|r| r.arg.op() == OpNum::Write && r.status == Nfsstat4::Ok).collect();
    assert_eq!(writes.len(), 1, "{}", desc());
    assert_eq!((writes[0].file(), writes[0].stateid), (b"a".as_slice(), opened[0].1.gave), "{}", desc());
    assert!(log.iter().all(|r| r.file() != b"b" || r.arg.op() != OpNum::Write), "{}", desc());
    assert_eq!(t.reclaim_counts(), (1, 0, 2, 0, 1), "{:?}", t.locks());
}

#[test]
fn a_reclaim_complete_whose_reply_never_comes_is_sent_again_and_complete_already_ends_it() {
    // The restarted server's RECLAIM_COMPLETE is done, but neither it nor its retransmissions
    // answered: the call sent again meets COMPLETE_ALREADY.
    let mut t = lock_restart_and_reclaim(silent_first(|s, op, _| {
        matches!(op, Arg::ReclaimComplete { .. }) && s.epoch == 2
    }));
    let ((a, fa), (b, fb)) = (t.a, t.b);
    let log = t.srv().of(2);
    let desc = || show(&log);
    let completes: Vec<_> = log.iter().filter(|r| r.arg.op() == OpNum::ReclaimComplete).collect();
    assert_eq!(dropped_then_answered(&completes, &desc).status, Nfsstat4::CompleteAlready, "{}", desc());
    // Nothing lost: the reclaim is over, its state in use.
    assert_eq!(t.reclaim_counts(), (1, 2, 0, 1, 0), "{:?}", t.locks());
    let d = &mut t.dev.d;
    d.write(a, fa, 0, b"a after").unwrap();
    d.write(b, fb, 0, b"b after").unwrap();
    d.setlk(b, &posix(fb, 2, libc::F_WRLCK, 0, 9)).unwrap();
    let log = t.srv().of(2);
    assert!(
        log.iter()
            .filter(|r| matches!(r.arg.op(), OpNum::Write | OpNum::Lock))
            .all(|r| r.status == Nfsstat4::Ok),
        "{}",
        show(&log)
    );
}

#[test]
fn a_write_waiting_for_the_reclaim_never_goes_before_its_files_locks_are_reclaimed() {
    // `b`'s open reclaim is slow (the WRITE waiting for `a`'s goes behind it), so are the
    // lock reclaims; `a`'s is refused.
    let plan: Plan = Box::new(move |_, _, op, fh| match op {
        Arg::Open { previous: Some(_), .. } if fh == b"f:b" => {
            std::thread::sleep(Duration::from_millis(300));
            Fate::Serve
        }
        Arg::Lock { reclaim: true, .. } => {
            std::thread::sleep(Duration::from_millis(200));
            if fh == b"f:a" {
                Fate::Refuse(Nfsstat4::ReclaimBad)
            } else {
                Fate::Serve
            }
        }
        _ => Fate::Serve,
    });
    let mut t = restartable_device(plan, |_| {});
    let ((a, fa), (b, fb)) = (t.a, t.b);
    t.dev.d.setlk(a, &posix(fa, 1, libc::F_WRLCK, 0, 99)).unwrap();
    t.dev.d.setlk(b, &posix(fb, 2, libc::F_WRLCK, 0, 99)).unwrap();
    t.srv().restart();
    // The WRITE meets the restart and waits for the reclaim: its lock is lost, so is it.
    let w = t.dev.d.write(a, fa, 0, b"under the lock");
    t.reclaimed(1, Duration::from_secs(3));
    let log = t.srv().of(2);
    let desc = || format!("the guest's WRITE: {w:?}\n{}", show(&log));
    let sent: Vec<_> = log.iter().filter(|r| r.file() == b"a" && r.arg.op() == OpNum::Write).collect();
    assert!(
        sent.iter().all(|r| r.status != Nfsstat4::Ok),
        "a WRITE of `a` went without the lock its owner held (not reclaimed): {}",
        desc()
    );
    let desc = desc();
    assert_eq!(errno(w), libc::EIO, "{desc}");
}

/// Session trunking takes the addresses of one server only: an address that answers
/// EXCHANGE_ID as another server (its owner differs) is refused at start-up, saying which; one
/// that does not answer at all is left out, and the function serves from the others.
#[test]
fn an_address_of_another_server_is_refused_and_one_that_does_not_answer_is_left_out() {
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let a = FakeServer::start(script(Box::new(|_, _| None), log.clone()));
    let other: Hook = Box::new(|c, call| {
        c.ops.iter().any(|op| matches!(op, Arg::ExchangeId { .. })).then(|| {
            let r = nfs4::exchange_id_as(0x42, 1, 0, b"another server", b"fake scope");
            vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, &[r]))]
        })
    });
    let b = FakeServer::start(script(other, log.clone()));
    let connect = |url: String| {
        let mut opts = NfsOptions::new(url.parse().unwrap());
        opts.timeout = Duration::from_secs(2);
        opts.retransmit = Duration::from_millis(500);
        opts.function = "trunk".into();
        NfsFs::connect(opts)
    };
    let e = connect(format!("nfs://{},{}/export?version=4.1", a.addr(), b.addr())).unwrap_err();
    let text = virtiofs_dpu::error_chain(&e);
    assert!(
        text.contains("is not the same NFSv4.1 server") && text.contains(&b.addr().to_string()),
        "{text}"
    );
    // A port nobody listens on: left out, the first address serves.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let fs = connect(format!("nfs://{closed},{}/export?version=4.1", a.addr())).expect("one address answers");
    assert_eq!(fs.server_addrs(), vec![a.addr()]);
    // None answers: the start-up fails, saying why.
    assert!(connect(format!("nfs://{closed},{closed}/export?version=4.1")).is_err());
}

/// A server that squashes root refuses root the reclaim of a file only its owner may open (and
/// a LOCK needs read access or ownership there): the open of a handle, and the lock taken
/// through it, are reclaimed as the caller that opened the handle. (The scripted server refuses
/// every reclaim from uid 0 with ACCESS.)
#[test]
fn opens_and_locks_are_reclaimed_as_the_caller_that_opened_the_handle() {
    use virtiofs_tools::fuse_abi::{opcode, InHeader, OpenIn, OpenOut};
    let plan: Plan = Box::new(move |_, call, op, _| match op {
        Arg::Open { previous: Some(_), .. } | Arg::Lock { reclaim: true, .. }
            if call.sys.map(|c| c.0) == Some(0) =>
        {
            Fate::Refuse(Nfsstat4::Access)
        }
        _ => Fate::Serve,
    });
    let mut t = restartable_device(plan, |_| {});
    // `c` opened by uid 1000 (a raw OPEN: the driver's own requests go as this process).
    let c = t.dev.d.lookup(ROOT, "c").unwrap().nodeid;
    let d = &mut t.dev.d;
    let unique = d.peek_next_unique();
    let args = OpenIn { flags: RDWR, open_flags: 0 }.to_bytes();
    let len = InHeader::SIZE + args.len();
    let hdr = InHeader {
        len: len as u32,
        opcode: opcode::OPEN,
        unique,
        nodeid: c,
        uid: 1000,
        gid: 1000,
        pid: 1,
        total_extlen: 0,
        padding: 0,
    }
    .to_bytes();
    d.submit_raw(1, &[&hdr, &args], &[16, OpenOut::SIZE as u32]).unwrap();
    let done = d.wait_for(unique).unwrap();
    let (h, body) = FsDriver::parse_reply(&done, opcode::OPEN, unique).unwrap();
    assert_eq!(h.error, 0);
    let fc = OpenOut::decode(&body).unwrap().fh;
    d.setlk(c, &posix(fc, 1, libc::F_WRLCK, 0, 99)).unwrap();
    t.srv().restart();
    t.dev.d.lookup(ROOT, "c").unwrap();
    t.reclaimed(1, Duration::from_secs(3));
    let log = t.srv().of(2);
    let desc = || show(&log);
    let of_c: Vec<_> = log.iter().filter(|r| r.reclaims() && r.file() == b"c").collect();
    assert_eq!(of_c.len(), 2, "the open and the lock of `c`: {}", desc());
    assert!(of_c.iter().all(|r| r.uid == Some(1000) && r.status == Nfsstat4::Ok), "{}", desc());
    // `a` and `b` were opened by root here: refused, opened anew when used.
    assert_eq!(t.reclaim_counts(), (1, 1, 2, 1, 0), "{:?}", t.locks());
    assert_eq!(t.dev.d.write(c, fc, 0, b"c after").unwrap(), 7, "through the reclaimed open");
}

/// `open(O_CREAT | O_WRONLY, 0444)` then writes (as tar extracts a read-only file): the server
/// checks the file's mode for a WRITE with the anonymous stateid. A stored write the restarted
/// server lost, refused so (ACCESS), goes again with the handle's reclaimed open, and the FLUSH
/// succeeds: nothing is lost.
#[test]
fn a_stored_write_refused_with_the_anonymous_stateid_goes_again_with_the_reclaimed_open() {
    let mut refused = false;
    let plan: Plan = Box::new(move |s, _, op, fh| match op {
        Arg::Write { stable: 2, .. } if s.epoch == 2 && fh == b"f:a" && !refused => {
            refused = true;
            Fate::Refuse(Nfsstat4::Access)
        }
        _ => Fate::Serve,
    });
    let mut t = restartable_device(plan, |_| {});
    t.srv().unstable = true;
    let (a, fa) = t.a;
    t.dev.d.write(a, fa, 0, b"stored, not committed").unwrap();
    t.srv().restart();
    t.dev.d.flush(a, fa).unwrap();
    let log = t.srv().of(2);
    let desc = || show(&log);
    let writes: Vec<_> = log.iter().filter(|r| r.arg.op() == OpNum::Write && r.file() == b"a").collect();
    assert_eq!(writes.len(), 2, "{}", desc());
    assert_eq!(
        (writes[0].status, writes[0].stateid.map(other)),
        (Nfsstat4::Access, Some([0; 12])),
        "{}",
        desc()
    );
    assert_eq!(writes[1].status, Nfsstat4::Ok, "{}", desc());
    assert_eq!(writes[1].stateid.map(other), Some(other(t.reclaimed_open(2, b"a"))), "{}", desc());
    assert!(
        matches!(&writes[1].arg, Arg::Write { data, stable: 2, offset: 0 } if data == b"stored, not committed"),
        "{}",
        desc()
    );
    let st = t.dev.handler.server().filesystem().stats();
    // Sent again twice (refused, then with the open), and out of the store.
    assert_eq!((st.unstable.resent, st.unstable.bytes_now), (2, 0), "{st:?}");
}
