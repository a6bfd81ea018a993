//! The NFSv4.1 engine against a hostile scripted server (the device end to end over vfio-user,
//! its export served by a script that speaks just enough NFSv4.1 to be mounted): a READDIR that
//! never moves on (the cookie asked given back, with eof false) is EIO in bounded time, never a
//! loop, and the device goes on serving; a reply of garbage bytes is EIO for its request only; a
//! COMPOUND that failed at SEQUENCE or before any operation (no result to show for it) is the
//! request's error, never a success. The script answers every operation the engine sends as a
//! well-behaved server would, unless a test's hook answers a COMPOUND first.

#[path = "../backend/tests/nfs_fake_server/mod.rs"]
mod nfs_fake_server;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nfs_fake_server::nfs4::{
    self, close_ok, compound_reply, create_session_ok, exchange_id_ok, getattr_ok, getfh_ok, link_ok, ok,
    open_ok, open_ok_deleg, read_ok, readdir_ok, remove_ok, rename_ok, seq_ok, setattr_ok, write_ok, Arg,
};
use nfs_fake_server::{record, Act, Call, FakeServer};
use virtiofs_backend::nfs::wire::nfs4::{
    ChannelAttrs, Fattr4, Fh, Ftype4, NfsTime4, Nfsstat4, OpNum, SessionId,
};
use virtiofs_backend::nfs::{NfsFs, NfsOptions};
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::{FuseHandler, RunningDevice};
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
    let url = format!("nfs://127.0.0.1:{}/export?version=4.1", server.addr().port());
    let mut opts = NfsOptions::new(url.parse().unwrap());
    opts.timeout = Duration::from_secs(3);
    opts.retransmit = Duration::from_secs(1);
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
