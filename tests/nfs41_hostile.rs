//! The NFSv4.1 engine against a hostile scripted server (the device end to end over vfio-user,
//! its export served by a script that speaks just enough NFSv4.1 to be mounted): a READDIR that
//! never moves on (the cookie asked given back, with eof false) is EIO in bounded time, never a
//! loop, and the device goes on serving; a reply of garbage bytes is EIO for its request only.

#[path = "../backend/tests/nfs_fake_server/mod.rs"]
mod nfs_fake_server;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nfs_fake_server::nfs4::{
    self, compound_reply, create_session_ok, exchange_id_ok, getattr_ok, getfh_ok, ok, readdir_ok, seq_ok,
    Arg,
};
use nfs_fake_server::{record, Act, Call, FakeServer};
use virtiofs_backend::nfs::wire::nfs4::{Fattr4, Fh, Ftype4, NfsTime4, Nfsstat4, SessionId};
use virtiofs_backend::nfs::{NfsFs, NfsOptions};
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::{FuseHandler, RunningDevice};
use virtiofs_tools::{DriverOptions, FsDriver};

const ROOT: u64 = 1;

/// How the script answers READDIR.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Listing {
    /// The cookie asked, again, with eof false.
    SameCookie,
    /// Garbage bytes instead of a reply.
    Garbage,
}

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

/// A script that establishes a session, walks to any export, and answers READDIR as `listing`
/// says.
fn script(listing: Listing, readdirs: Arc<AtomicU32>) -> impl FnMut(&Call) -> Vec<Act> + Send + 'static {
    let fh = Fh::new(b"root-of-the-export").unwrap();
    move |call: &Call| {
        let c = nfs4::parse(&call.args);
        let mut results = Vec::new();
        for op in &c.ops {
            let r = match op {
                Arg::ExchangeId { .. } => exchange_id_ok(0x41, 1, 0),
                Arg::CreateSession { sequence, fore, .. } => {
                    create_session_ok(SessionId([4; 16]), *sequence, fore)
                }
                Arg::Sequence(s) => seq_ok(s, 63, 63, 0),
                Arg::Putrootfh | Arg::Putfh(_) | Arg::Lookup(_) => ok(op.op(), &[]),
                Arg::Getfh => getfh_ok(&fh),
                Arg::Getattr(_) => getattr_ok(&dir_attrs()),
                Arg::ReclaimComplete { .. } | Arg::DestroySession(_) | Arg::DestroyClientid(_) => {
                    ok(op.op(), &[])
                }
                Arg::Readdir { cookie, verf, .. } => {
                    readdirs.fetch_add(1, Ordering::Relaxed);
                    match listing {
                        Listing::Garbage => return vec![Act::Send(record(&[0xde, 0xad, 0xbe, 0xef]))],
                        Listing::SameCookie => {
                            let a = Fattr4 { ftype: Some(Ftype4::Reg), fileid: Some(9), ..Fattr4::default() };
                            let again = if *cookie == 0 { 7 } else { *cookie };
                            readdir_ok(*verf, &[(again, b"again", a)], false)
                        }
                    }
                }
                other => panic!("the script does not answer {:?}", other.op()),
            };
            results.push(r);
        }
        vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, &results))]
    }
}

struct Dev {
    _dir: tempfile::TempDir,
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
    let device =
        RunningDevice::start_with(&socket, Profile::default(), Arc::new(FuseHandler::new(fs))).unwrap();
    let mut d = FsDriver::connect(&socket, DriverOptions::default()).unwrap();
    d.init().unwrap();
    Dev { _dir: dir, device: Some(device), d }
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
    let server = FakeServer::start(script(Listing::SameCookie, readdirs.clone()));
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
    let server = FakeServer::start(script(Listing::Garbage, readdirs.clone()));
    let mut dev = serve(&server);
    let open = dev.d.opendir(ROOT).unwrap();
    let t0 = Instant::now();
    assert_eq!(errno(dev.d.readdir(ROOT, open.fh, 2, 4096)), libc::EIO);
    assert_eq!(readdirs.load(Ordering::Relaxed), 1, "one READDIR, answered with garbage");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(dev.d.getattr(ROOT).unwrap().mode & 0o777, 0o755, "the next request is served");
}
