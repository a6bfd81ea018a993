//! End to end on the NFS backend: the device serving an nfs-ganesha export (`NfsFs`, every
//! request through the pollers' NFS engines), driven by the host driver model over vfio-user.
//! Data is checked on the export directory directly (the server's own view). Then the faults:
//! the server SIGKILLed and restarted mid-workload, a restart between WRITE and COMMIT (the
//! write verifier changes: the data is sent again), the server gone longer than the timeout
//! (EIO in bounded time while requests that need no server go on; serving again when it is
//! back), a file removed by another client (ESTALE, then a lookup recovers), and two devices on
//! one export. With NFSv4.1 the server keeps the locks: two devices, and a device beside a plain
//! NFSv4.1 client, see each other's locks (`locks41`, `plain41`, `locks41_faults`).

#[path = "../backend/tests/harness/ganesha.rs"]
mod ganesha;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ganesha::Ganesha;
use virtiofs_backend::nfs::{NfsFs, NfsOptions};
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::{FuseHandler, RunningDevice};
use virtiofs_tools::fuse_abi::{self as abi, opcode, InHeader};
use virtiofs_tools::vfio_user::{DMA_MAP_FLAG_READ, DMA_MAP_FLAG_WRITE};
use virtiofs_tools::{DriverOptions, FsDriver};

const ROOT: u64 = 1;
const RDWR: u32 = libc::O_RDWR as u32;

/// A device serving `g`'s export.
struct Served {
    _dir: tempfile::TempDir,
    handler: Arc<FuseHandler<NfsFs>>,
    device: Option<RunningDevice>,
    socket: PathBuf,
}

/// The protocol a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nfs {
    V3,
    V41,
}

impl Served {
    fn new(g: &Ganesha, tune: impl FnOnce(&mut NfsOptions)) -> Served {
        Self::with_profile(g, Nfs::V3, Profile::default(), tune)
    }

    fn on(g: &Ganesha, v: Nfs, tune: impl FnOnce(&mut NfsOptions)) -> Served {
        Self::with_profile(g, v, Profile::default(), tune)
    }

    fn with_profile(g: &Ganesha, v: Nfs, profile: Profile, tune: impl FnOnce(&mut NfsOptions)) -> Served {
        let url = if v == Nfs::V41 { g.url41() } else { g.url() };
        let mut opts = NfsOptions::new(url.parse().expect("the harness's URL parses"));
        let dir = tempfile::tempdir().unwrap();
        // Each device is a function of its own: with NFSv4.1, a client of its own.
        opts.function = dir.path().display().to_string();
        tune(&mut opts);
        let fs = NfsFs::connect(opts).expect("the export mounts");
        assert_eq!(fs.is_v41(), v == Nfs::V41, "served over {v:?}");
        let socket = dir.path().join("nfs.sock");
        let handler = Arc::new(FuseHandler::new(fs));
        let device = RunningDevice::start_with(&socket, profile, handler.clone()).unwrap();
        Served { _dir: dir, handler, device: Some(device), socket }
    }

    fn connect(&self) -> FsDriver {
        let mut d =
            FsDriver::connect(&self.socket, DriverOptions::default()).expect("driver brings the device up");
        d.init().unwrap();
        d
    }

    fn fs(&self) -> &NfsFs {
        self.handler.server().filesystem()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(d) = self.device.take() {
            let _ = d.stop();
        }
    }
}

fn errno<T: std::fmt::Debug>(r: Result<T, virtiofs_tools::DriverError>) -> i32 {
    match r {
        Err(e) => e.fuse_errno().unwrap_or_else(|| panic!("not a FUSE error: {e}")),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A request with the caller's identity set to `uid`/`gid`; the reply's header and body.
fn call_as(d: &mut FsDriver, uid: u32, gid: u32, op: u32, nodeid: u64, args: &[&[u8]]) -> (i32, Vec<u8>) {
    let unique = d.peek_next_unique();
    let len: usize = InHeader::SIZE + args.iter().map(|a| a.len()).sum::<usize>();
    let hdr = InHeader {
        len: len as u32,
        opcode: op,
        unique,
        nodeid,
        uid,
        gid,
        pid: 1,
        total_extlen: 0,
        padding: 0,
    }
    .to_bytes();
    let mut parts: Vec<&[u8]> = vec![&hdr];
    parts.extend_from_slice(args);
    let token = d.submit_raw(1, &parts, &[16, 4096]).unwrap();
    assert_eq!(token, unique);
    let c = d.wait_for(token).unwrap();
    let (h, body) = FsDriver::parse_reply(&c, op, unique).unwrap();
    (h.error, body)
}

#[test]
fn every_operation_against_a_real_export() {
    every_operation(Nfs::V3);
}

#[test]
fn every_operation_against_a_real_export_v41() {
    every_operation(Nfs::V41);
}

fn every_operation(v: Nfs) {
    let g = Ganesha::start();
    let s = Served::on(&g, v, |_| {});
    let mut d = s.connect();
    let exp = g.export();

    // CREATE, WRITE, READ: the data is on the export.
    let (f, open) = d.create(ROOT, "file", 0o640, RDWR).unwrap();
    let data = pattern(1, 300_000);
    assert_eq!(d.write(f.nodeid, open.fh, 0, &data).unwrap() as usize, data.len());
    assert_eq!(d.read(f.nodeid, open.fh, 0, 300_000).unwrap(), data);
    assert_eq!(d.read(f.nodeid, open.fh, 299_000, 4096).unwrap(), &data[299_000..], "short at end of file");
    d.flush(f.nodeid, open.fh).unwrap();
    d.release(f.nodeid, open.fh).unwrap();
    assert!(std::fs::read(exp.join("file")).unwrap() == data, "the export holds what was written");
    assert_eq!(std::fs::metadata(exp.join("file")).unwrap().mode() & 0o7777, 0o640);
    let e = d.lookup(ROOT, "file").unwrap();
    assert_eq!(e.nodeid, f.nodeid, "one node per file handle");
    assert_eq!(e.attr.size, data.len() as u64);
    assert_eq!(
        e.attr.ino,
        std::fs::metadata(exp.join("file")).unwrap().ino(),
        "st_ino is the server's fileid"
    );
    assert_eq!(errno(d.lookup(ROOT, "missing")), libc::ENOENT);
    assert_eq!(errno(d.create(ROOT, "file", 0o644, RDWR | libc::O_EXCL as u32)), libc::EEXIST);

    // MKDIR, SYMLINK, LINK, RENAME, READDIR.
    let dir = d.mkdir(ROOT, "dir", 0o755).unwrap();
    assert!(exp.join("dir").is_dir());
    let l = d.symlink(dir.nodeid, "link", "../file").unwrap();
    assert_eq!(d.readlink(l.nodeid).unwrap(), b"../file");
    assert_eq!(std::fs::read_link(exp.join("dir/link")).unwrap(), PathBuf::from("../file"));
    let h = d.link(f.nodeid, dir.nodeid, "hard").unwrap();
    assert_eq!(h.nodeid, f.nodeid);
    assert_eq!(h.attr.nlink, 2);
    d.rename(ROOT, "file", dir.nodeid, "moved").unwrap();
    assert!(exp.join("dir/moved").is_file() && !exp.join("file").exists());
    assert_eq!(
        errno(d.rename2(dir.nodeid, "moved", dir.nodeid, "hard", libc::RENAME_NOREPLACE)),
        libc::EEXIST
    );
    assert_eq!(
        errno(d.rename2(dir.nodeid, "moved", dir.nodeid, "hard", libc::RENAME_EXCHANGE)),
        libc::EINVAL
    );
    d.rename2(dir.nodeid, "moved", dir.nodeid, "fresh", libc::RENAME_NOREPLACE).unwrap();
    for i in 0..200 {
        std::fs::write(exp.join(format!("dir/n{i:03}")), b"x").unwrap();
    }
    let dh = d.opendir(dir.nodeid).unwrap();
    let all = d.readdir_all(dir.nodeid, dh.fh).unwrap();
    // Past the last entry the server said "end" already: answered without asking again.
    let calls = s.fs().stats().calls;
    assert!(d.readdir(dir.nodeid, dh.fh, all.last().unwrap().off, 4096).unwrap().is_empty());
    assert_eq!(s.fs().stats().calls, calls);
    let mut names: Vec<String> = all.into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
    names.sort();
    assert_eq!(names.len(), 205, "200 files, fresh, hard, link, . and ..: {names:?}");
    assert!(names.contains(&"fresh".to_string()) && names.contains(&"n199".to_string()));
    let plus = d.readdirplus(dir.nodeid, dh.fh, 0, 4096).unwrap();
    assert!(!plus.is_empty());
    d.releasedir(dir.nodeid, dh.fh).unwrap();

    // SETATTR: truncate, chmod, utimes.
    let mut sa = abi::SetattrIn { valid: abi::fattr::SIZE, size: 1000, ..Default::default() };
    assert_eq!(d.setattr(f.nodeid, &sa).unwrap().size, 1000);
    assert_eq!(std::fs::metadata(exp.join("dir/fresh")).unwrap().len(), 1000);
    sa = abi::SetattrIn { valid: abi::fattr::MODE, mode: 0o600, ..Default::default() };
    assert_eq!(d.setattr(f.nodeid, &sa).unwrap().mode & 0o7777, 0o600);
    sa = abi::SetattrIn { valid: abi::fattr::MTIME, mtime: 1_000_000, ..Default::default() };
    assert_eq!(d.setattr(f.nodeid, &sa).unwrap().mtime, 1_000_000);
    assert_eq!(std::fs::metadata(exp.join("dir/fresh")).unwrap().mtime(), 1_000_000);

    // UNLINK, RMDIR, STATFS, MKNOD (a FIFO).
    let fifo = d.mknod(ROOT, "fifo", libc::S_IFIFO | 0o600, 0).unwrap();
    assert_eq!(fifo.attr.mode & libc::S_IFMT, libc::S_IFIFO);
    d.unlink(ROOT, "fifo").unwrap();
    assert_eq!(errno(d.rmdir(ROOT, "dir")), libc::ENOTEMPTY);
    for n in ["link", "hard", "fresh"] {
        d.unlink(dir.nodeid, n).unwrap();
    }
    for i in 0..200 {
        d.unlink(dir.nodeid, &format!("n{i:03}")).unwrap();
    }
    d.rmdir(ROOT, "dir").unwrap();
    assert!(!exp.join("dir").exists());
    let st = d.statfs(ROOT).unwrap();
    assert!(st.blocks > 0 && st.bsize > 0);

    // What NFSv3 cannot do: the errno on which Linux stops asking or falls back.
    let (x, xo) = d.create(ROOT, "x", 0o644, RDWR).unwrap();
    let get = [64u32.to_ne_bytes(), 0u32.to_ne_bytes()].concat(); // fuse_getxattr_in
    let (e, _) = d.call(1, opcode::GETXATTR, x.nodeid, &[&get, b"user.a\0"], 64).unwrap();
    assert_eq!(-e.error, libc::ENOSYS, "xattrs: ENOSYS, the kernel stops asking");
    // fuse_fallocate_in: fh, offset, length, mode, padding.
    let fa = [xo.fh.to_ne_bytes(), 0u64.to_ne_bytes(), 4096u64.to_ne_bytes(), [0; 8]].concat();
    let (e, _) = d.call(1, opcode::FALLOCATE, x.nodeid, &[&fa], 0).unwrap();
    assert_eq!(-e.error, libc::ENOSYS, "fallocate: the kernel answers EOPNOTSUPP from then on");
    d.release(x.nodeid, xo.fh).unwrap();
    let st = s.fs().stats();
    assert!(st.requests > 0);
    if v == Nfs::V41 {
        assert!(st.session.sessions >= 1 && st.session.calls > 0, "through a session: {st:?}");
        eprintln!("NFSv4.1: {st:?}");
    }
    d.shutdown().unwrap();
}

#[test]
fn requests_carry_the_callers_credentials() {
    callers_credentials(Nfs::V3);
}

#[test]
fn requests_carry_the_callers_credentials_v41() {
    callers_credentials(Nfs::V41);
}

fn callers_credentials(v: Nfs) {
    let g = Ganesha::start();
    let s = Served::on(&g, v, |_| {});
    let mut d = s.connect();
    let shared = d.mkdir(ROOT, "shared", 0o777).unwrap();
    std::fs::set_permissions(g.export().join("shared"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let args = abi::CreateIn { flags: RDWR, mode: 0o644, umask: 0, open_flags: 0 }.to_bytes();
    let (err, _) = call_as(&mut d, 1000, 1000, opcode::CREATE, shared.nodeid, &[&args, b"mine\0"]);
    assert_eq!(err, 0);
    let m = std::fs::metadata(g.export().join("shared/mine")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1000, 1000), "created as the caller");
    // Another user may not remove it from a directory only root may write.
    std::fs::set_permissions(g.export().join("shared"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (err, _) = call_as(&mut d, 1001, 1001, opcode::UNLINK, shared.nodeid, &[b"mine\0"]);
    assert_eq!(-err, libc::EACCES);
    d.shutdown().unwrap();
}

#[test]
fn a_time_past_2038_set_over_nfs41_reads_back_exactly() {
    let g = Ganesha::start();
    let s = Served::on(&g, Nfs::V41, |_| {});
    let mut d = s.connect();
    let (f, open) = d.create(ROOT, "future", 0o644, RDWR).unwrap();
    // 2042-11-20: past NFSv3's 32-bit seconds (y2038); nfstime4 has 64.
    let (sec, nsec) = (2_300_000_000u64, 123_456_789u32);
    let sa = abi::SetattrIn {
        valid: abi::fattr::MTIME | abi::fattr::ATIME,
        mtime: sec,
        mtimensec: nsec,
        atime: sec + 1,
        ..Default::default()
    };
    let a = d.setattr(f.nodeid, &sa).unwrap();
    assert_eq!((a.mtime, a.mtimensec, a.atime), (sec, nsec, sec + 1), "SETATTR's reply");
    let a = d.getattr(f.nodeid).unwrap();
    assert_eq!((a.mtime, a.mtimensec), (sec, nsec), "GETATTR");
    let m = std::fs::metadata(g.export().join("future")).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (sec as i64, i64::from(nsec)), "on the export");
    d.release(f.nodeid, open.fh).unwrap();
    d.shutdown().unwrap();
}

/// A device with two pollers (two request queues) serving `g`'s export over `v`, and a driver
/// that spreads its requests over both queues.
fn two_pollers(g: &Ganesha, v: Nfs) -> (Served, FsDriver) {
    let profile = Profile { request_queues: 2, poller_cores: vec![0, 1], ..Default::default() };
    let s = Served::with_profile(g, v, profile, |_| {});
    let opts = DriverOptions { request_queues: 2, spread_requests: true, ..Default::default() };
    let mut d = FsDriver::connect(&s.socket, opts).unwrap();
    d.init().unwrap();
    (s, d)
}

/// Creates `name` and writes 16 blocks of 16 KiB through it, spread over both queues (checked):
/// its entry, its handle and the bytes written.
fn written_through_both(d: &mut FsDriver, name: &str) -> (abi::EntryOut, abi::OpenOut, Vec<u8>) {
    let (f, open) = d.create(ROOT, name, 0o644, RDWR).unwrap();
    let mut expected = Vec::new();
    for i in 0..16u64 {
        let block = pattern(i as u8, 16 << 10);
        d.write(f.nodeid, open.fh, i * (16 << 10), &block).unwrap();
        expected.extend_from_slice(&block);
    }
    assert!(d.completed_on(1) > 0 && d.completed_on(2) > 0, "both queues (pollers) served writes");
    (f, open, expected)
}

#[test]
fn two_pollers_sessions_of_one_client_share_the_opens_on_nfs41() {
    let g = Ganesha::start();
    let (s, mut d) = two_pollers(&g, Nfs::V41);
    // One handle opened through one poller's session, written and read through both.
    let (f, open, expected) = written_through_both(&mut d, "two41");
    assert_eq!(d.read(f.nodeid, open.fh, 0, expected.len() as u32).unwrap(), expected);
    d.release(f.nodeid, open.fh).unwrap();
    assert!(std::fs::read(g.export().join("two41")).unwrap() == expected, "every write is on the export");
    let st = s.fs().stats();
    assert!(st.session.sessions >= 2, "a session per poller: {st:?}");
    d.shutdown().unwrap();
}

#[test]
fn a_server_restart_mid_workload_loses_nothing() {
    restart_mid_workload(Nfs::V3);
}

/// NFSv4.1: the restarted server knows neither the session nor the open; the session comes
/// back under a new client id and the handle's open is opened again (issue 23).
#[test]
fn a_server_restart_mid_workload_loses_nothing_v41() {
    restart_mid_workload(Nfs::V41);
}

fn restart_mid_workload(v: Nfs) {
    let mut g = Ganesha::start();
    let s = Served::on(&g, v, |o| o.retransmit = Duration::from_millis(500));
    let mut d = s.connect();
    let (f, open) = d.create(ROOT, "w", 0o644, RDWR).unwrap();
    let block = 64 << 10;
    let n = 64;
    let mut expected = Vec::new();
    for i in 0..n {
        if i == n / 2 {
            g.kill();
            // The writer below waits through the outage; the server comes back meanwhile.
            let restart = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(400));
                g.start_again();
                g
            });
            let data = pattern(i as u8, block);
            assert_eq!(d.write(f.nodeid, open.fh, (i * block) as u64, &data).unwrap() as usize, block);
            expected.extend_from_slice(&data);
            g = restart.join().unwrap();
            continue;
        }
        let data = pattern(i as u8, block);
        assert_eq!(d.write(f.nodeid, open.fh, (i * block) as u64, &data).unwrap() as usize, block);
        expected.extend_from_slice(&data);
    }
    d.fsync(f.nodeid, open.fh, false).unwrap();
    assert_eq!(d.read(f.nodeid, open.fh, 0, 1 << 20).unwrap(), &expected[..1 << 20]);
    d.flush(f.nodeid, open.fh).unwrap();
    d.release(f.nodeid, open.fh).unwrap();
    assert!(std::fs::read(g.export().join("w")).unwrap() == expected, "the export holds what was written");
    let st = s.fs().stats();
    assert!(st.reconnects >= 1, "{st:?}");
    d.shutdown().unwrap();
}

#[test]
fn a_verifier_change_between_write_and_commit_sends_the_data_again() {
    verifier_change(Nfs::V3);
}

/// NFSv4.1: WRITEs go UNSTABLE4 into the same store; the resends go with the anonymous stateid
/// (the new server knows no open of the old one until it is opened or reclaimed again).
#[test]
fn a_verifier_change_between_write_and_commit_sends_the_data_again_v41() {
    verifier_change(Nfs::V41);
}

fn verifier_change(v: Nfs) {
    let mut g = Ganesha::start();
    let s = Served::on(&g, v, |o| o.retransmit = Duration::from_millis(500));
    let mut d = s.connect();
    let (f, open) = d.create(ROOT, "v", 0o644, RDWR).unwrap();
    let data = pattern(7, 200_000);
    d.write(f.nodeid, open.fh, 0, &data).unwrap();
    assert!(s.fs().stats().unstable.stored > 0, "the WRITE went UNSTABLE");
    // The server dies before any COMMIT and loses what it had not committed: made
    // deterministic by overwriting the file behind its back while it is down.
    g.kill();
    std::fs::write(g.export().join("v"), vec![0u8; data.len()]).unwrap();
    // Ganesha's write verifier is its start time in seconds: the new one must start in another.
    std::thread::sleep(Duration::from_millis(1100));
    g.start_again();
    // FLUSH commits: the new server's verifier differs, so the stored writes go again.
    d.flush(f.nodeid, open.fh).unwrap();
    let st = s.fs().stats();
    assert!(
        std::fs::read(g.export().join("v")).unwrap() == data,
        "FLUSH acknowledged: the data is there ({st:?})"
    );
    assert!(st.unstable.resent >= 1, "{st:?}");
    assert_eq!(st.unstable.bytes_now, 0, "committed writes leave the store");
    d.release(f.nodeid, open.fh).unwrap();
    d.shutdown().unwrap();
}

#[test]
fn a_server_gone_longer_than_the_timeout_fails_requests_in_bounded_time() {
    outage(Nfs::V3);
}

/// NFSv4.1: the session's calls end at the deadline too; once the server is back (a new
/// server: the session comes back under a new client id, the open is opened again) it serves.
#[test]
fn a_server_gone_longer_than_the_timeout_fails_requests_in_bounded_time_v41() {
    outage(Nfs::V41);
}

fn outage(v: Nfs) {
    let mut g = Ganesha::start();
    let timeout = Duration::from_secs(1);
    let s = Served::on(&g, v, |o| {
        o.timeout = timeout;
        o.retransmit = Duration::from_millis(300);
    });
    let mut d = s.connect();
    let (f, open) = d.create(ROOT, "t", 0o644, RDWR).unwrap();
    d.write(f.nodeid, open.fh, 0, &pattern(3, 4096)).unwrap();
    d.fsync(f.nodeid, open.fh, false).unwrap();
    g.kill();
    let t0 = Instant::now();
    let arg = abi::ReadIn { fh: open.fh, offset: 0, size: 4096, ..Default::default() };
    let read = d.submit(1, opcode::READ, f.nodeid, &[&arg.to_bytes()], &[], 0, 4096).unwrap();
    // Requests that need no server go on meanwhile (an OPENDIR is the device's own).
    let dh = d.opendir(ROOT).unwrap();
    d.releasedir(ROOT, dh.fh).unwrap();
    assert!(d.is_pending(read) || t0.elapsed() >= timeout, "answered before the timeout");
    // A DMA_MAP and DMA_UNMAP go through too: the pollers drain first, which the timeout
    // bounds (the pending READ ends with EIO meanwhile).
    let extra = virtiofs_device::memory::memfd("extra-window", 1 << 20).unwrap();
    let at = 1u64 << 40;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&extra);
    d.client().dma_map(DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE, 0, at, 1 << 20, Some(fd)).unwrap();
    d.client().dma_unmap(0, at, 1 << 20).unwrap();
    assert!(t0.elapsed() < timeout * 4, "DMA changes took {:?}", t0.elapsed());
    let c = d.wait_for(read).unwrap();
    let took = t0.elapsed();
    let (h, _) = FsDriver::parse_reply(&c, opcode::READ, read).unwrap();
    assert_eq!(-h.error, libc::EIO);
    assert!(took >= timeout / 2 && took < timeout * 4, "EIO after {took:?} (timeout {timeout:?})");
    assert!(s.fs().stats().timed_out >= 1);
    // Back: served again.
    g.start_again();
    assert_eq!(d.read(f.nodeid, open.fh, 0, 4096).unwrap(), pattern(3, 4096));
    d.release(f.nodeid, open.fh).unwrap();
    d.shutdown().unwrap();
}

#[test]
fn a_file_removed_by_another_client_is_stale_until_looked_up_again() {
    removed_by_another(Nfs::V3);
}

#[test]
fn a_file_removed_by_another_client_is_stale_until_looked_up_again_v41() {
    removed_by_another(Nfs::V41);
}

fn removed_by_another(v: Nfs) {
    let g = Ganesha::start();
    let s = Served::on(&g, v, |_| {});
    let mut d = s.connect();
    let (f, open) = d.create(ROOT, "gone", 0o644, RDWR).unwrap();
    d.write(f.nodeid, open.fh, 0, b"old").unwrap();
    d.release(f.nodeid, open.fh).unwrap();
    // Another client (a second device on the export) removes it.
    let other = Served::on(&g, v, |_| {});
    let mut d2 = other.connect();
    d2.unlink(ROOT, "gone").unwrap();
    assert!(!g.export().join("gone").exists());
    // The old handle names a file that is no more.
    assert_eq!(errno(d.getattr(f.nodeid)), libc::ESTALE);
    let o = d.open(f.nodeid, libc::O_RDONLY as u32);
    assert_eq!(errno(o), libc::ESTALE);
    // The guest's next lookup of the name recovers: no such file, then the new one.
    assert_eq!(errno(d.lookup(ROOT, "gone")), libc::ENOENT);
    std::fs::write(g.export().join("gone"), b"another file").unwrap();
    let again = d.lookup(ROOT, "gone").unwrap();
    assert_eq!(again.attr.size, 12);
    let o = d.open(again.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(d.read(again.nodeid, o.fh, 0, 100).unwrap(), b"another file");
    d.release(again.nodeid, o.fh).unwrap();
    d.forget(f.nodeid, 1).unwrap();
    d.shutdown().unwrap();
    d2.shutdown().unwrap();
}

#[test]
fn two_devices_on_one_export_see_each_others_closed_writes() {
    two_devices(Nfs::V3);
}

#[test]
fn two_devices_on_one_export_see_each_others_closed_writes_v41() {
    two_devices(Nfs::V41);
}

fn two_devices(v: Nfs) {
    let g = Ganesha::start();
    let a = Served::on(&g, v, |_| {});
    let b = Served::on(&g, v, |_| {});
    let mut da = a.connect();
    let mut db = b.connect();
    let (f, open) = da.create(ROOT, "shared", 0o644, RDWR).unwrap();
    let seen = db.lookup(ROOT, "shared").unwrap();
    assert_eq!(seen.attr.size, 0);
    let data = pattern(9, 10_000);
    da.write(f.nodeid, open.fh, 0, &data).unwrap();
    da.flush(f.nodeid, open.fh).unwrap();
    da.release(f.nodeid, open.fh).unwrap();
    // After the attribute timeout (cache auto: 1 s) the other device sees the new size.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(db.getattr(seen.nodeid).unwrap().size, data.len() as u64);
    let o = db.open(seen.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(db.read(seen.nodeid, o.fh, 0, 20_000).unwrap(), data);
    db.release(seen.nodeid, o.fh).unwrap();
    da.shutdown().unwrap();
    db.shutdown().unwrap();
}

#[test]
fn more_requests_than_connection_slots_wait_in_the_backlog() {
    backlog(Nfs::V3);
}

#[test]
fn more_requests_than_connection_slots_wait_in_the_backlog_v41() {
    backlog(Nfs::V41);
}

fn backlog(v: Nfs) {
    let g = Ganesha::start();
    let s = Served::on(&g, v, |o| o.slots_per_poller = 2);
    let mut d = s.connect();
    let (f, open) = d.create(ROOT, "q", 0o644, RDWR).unwrap();
    let data = pattern(5, 64 * 4096);
    d.write(f.nodeid, open.fh, 0, &data).unwrap();
    let tokens: Vec<(u64, usize)> = (0..32)
        .map(|i| {
            let off = (i % 64) * 4096;
            let arg = abi::ReadIn { fh: open.fh, offset: off as u64, size: 4096, ..Default::default() };
            (d.submit(1, opcode::READ, f.nodeid, &[&arg.to_bytes()], &[], 0, 4096).unwrap(), off)
        })
        .collect();
    for (t, off) in tokens {
        let c = d.wait_for(t).unwrap();
        let (h, body) = FsDriver::parse_reply(&c, opcode::READ, t).unwrap();
        assert_eq!(h.error, 0);
        assert!(body == data[off..off + 4096], "READ at {off}");
    }
    assert!(s.fs().stats().backlogged > 0, "{:?}", s.fs().stats());
    d.release(f.nodeid, open.fh).unwrap();
    d.shutdown().unwrap();
}

#[test]
fn writes_through_two_pollers_are_replayed_by_the_flush_on_either() {
    let mut g = Ganesha::start();
    let (s, mut d) = two_pollers(&g, Nfs::V3);
    let (f, open, expected) = written_through_both(&mut d, "two");
    g.kill();
    std::fs::write(g.export().join("two"), vec![0u8; expected.len()]).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    g.start_again();
    // One FLUSH, on one poller, replays what both pollers' connections wrote (the store is
    // shared).
    d.flush(f.nodeid, open.fh).unwrap();
    assert!(std::fs::read(g.export().join("two")).unwrap() == expected, "every write is on the export");
    assert_eq!(s.fs().stats().unstable.resent, 16);
    d.release(f.nodeid, open.fh).unwrap();
    d.shutdown().unwrap();
}

#[test]
fn a_file_unlinked_while_open_stays_usable_until_its_last_close() {
    unlinked_while_open(Nfs::V3);
}

#[test]
fn a_file_unlinked_while_open_stays_usable_until_its_last_close_v41() {
    unlinked_while_open(Nfs::V41);
}

fn unlinked_while_open(v: Nfs) {
    let g = Ganesha::start();
    let s = Served::on(&g, v, |_| {});
    let mut d = s.connect();
    // What glibc's tmpfile() does when O_TMPFILE is not supported: create, unlink, use.
    let (f, open) = d.create(ROOT, "tmp", 0o600, RDWR).unwrap();
    d.unlink(ROOT, "tmp").unwrap();
    assert_eq!(errno(d.lookup(ROOT, "tmp")), libc::ENOENT);
    let data = pattern(4, 50_000);
    d.write(f.nodeid, open.fh, 0, &data).unwrap();
    assert_eq!(d.read(f.nodeid, open.fh, 0, 60_000).unwrap(), data);
    let silly: Vec<_> = std::fs::read_dir(g.export())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".nfs"))
        .collect();
    assert_eq!(silly.len(), 1, "renamed, not removed, while open: {silly:?}");
    d.flush(f.nodeid, open.fh).unwrap();
    d.release(f.nodeid, open.fh).unwrap();
    assert_eq!(std::fs::read_dir(g.export()).unwrap().count(), 0, "gone at the last close");
    // A file nobody has open is removed at once.
    let (h, o) = d.create(ROOT, "plain", 0o600, RDWR).unwrap();
    d.release(h.nodeid, o.fh).unwrap();
    d.unlink(ROOT, "plain").unwrap();
    assert_eq!(std::fs::read_dir(g.export()).unwrap().count(), 0);
    d.shutdown().unwrap();
}

#[test]
fn advisory_locks_stay_in_the_device_and_check_the_handle() {
    use virtiofs_tools::LockReq;
    let g = Ganesha::start();
    let s = Served::new(&g, |_| {});
    let mut d = s.connect();
    let (f, rw) = d.create(ROOT, "l", 0o644, RDWR).unwrap();
    let ro = d.open(f.nodeid, libc::O_RDONLY as u32).unwrap();
    let lock =
        |fh, owner, typ| LockReq { fh, owner, typ, start: 0, end: 99, pid: 10 + owner as u32, flock: false };
    d.setlk(f.nodeid, &lock(rw.fh, 1, libc::F_WRLCK)).unwrap();
    // Another owner conflicts; a write lock through a read-only handle is EBADF.
    let calls = s.fs().stats().calls;
    assert_eq!(errno(d.setlk(f.nodeid, &lock(ro.fh, 2, libc::F_RDLCK))), libc::EAGAIN);
    assert_eq!(errno(d.setlk(f.nodeid, &lock(ro.fh, 2, libc::F_WRLCK))), libc::EBADF);
    assert_eq!(errno(d.setlk(f.nodeid, &lock(9999, 2, libc::F_RDLCK))), libc::EBADF);
    assert_eq!(s.fs().stats().calls, calls, "locks never reach the server");
    d.setlk(f.nodeid, &lock(rw.fh, 1, libc::F_UNLCK)).unwrap();
    d.setlk(f.nodeid, &lock(ro.fh, 2, libc::F_RDLCK)).unwrap();
    d.release(f.nodeid, ro.fh).unwrap();
    d.release(f.nodeid, rw.fh).unwrap();
    d.shutdown().unwrap();
}

#[test]
fn a_long_run_of_writes_without_flush_stays_unstable_and_the_store_bounded() {
    long_run_unstable(Nfs::V3);
}

#[test]
fn a_long_run_of_writes_without_flush_stays_unstable_and_the_store_bounded_v41() {
    long_run_unstable(Nfs::V41);
}

fn long_run_unstable(v: Nfs) {
    // 12 MiB written without FLUSH or FSYNC through a store of 1 MiB: the engines COMMIT in the
    // background past the high-water mark (half of it), so every write still goes UNSTABLE
    // (none falls back to FILE_SYNC), the store never holds more than its size, and what the
    // device acknowledged is on the export before any FLUSH.
    const STORE: usize = 1 << 20;
    let g = Ganesha::start();
    let s = Served::on(&g, v, |o| o.unstable_bytes = STORE);
    let mut d = s.connect();
    let (f, open) = d.create(ROOT, "long", 0o644, RDWR).unwrap();
    let mut expected = vec![0u8; 12 << 20];
    // First 4 MiB sequential at QD=1 in 64 KiB writes, then 4k writes at QD=8 all over the file.
    for (i, chunk) in expected[..4 << 20].chunks_mut(64 << 10).enumerate() {
        chunk.copy_from_slice(&pattern(i as u8, chunk.len()));
        d.write(f.nodeid, open.fh, (i * chunk.len()) as u64, chunk).unwrap();
    }
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let blocks = expected.len() / 4096;
    for round in 0..256 {
        let mut tokens = Vec::new();
        // Eight different blocks: writes in flight together have no order between them (the
        // server's threads may run them either way), so two to one block would leave either.
        let mut picked = [usize::MAX; 8];
        for k in 0..8 {
            let b = loop {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let b = (rng % blocks as u64) as usize;
                if !picked.contains(&b) {
                    break b;
                }
            };
            picked[k] = b;
            let data = pattern((round * 8 + k) as u8 ^ 0x5a, 4096);
            expected[b * 4096..(b + 1) * 4096].copy_from_slice(&data);
            let arg =
                abi::WriteIn { fh: open.fh, offset: (b * 4096) as u64, size: 4096, ..Default::default() };
            tokens.push(
                d.submit(1, opcode::WRITE, f.nodeid, &[&arg.to_bytes()], &data, abi::WriteOut::SIZE, 0)
                    .unwrap(),
            );
        }
        for t in tokens {
            let c = d.wait_for(t).unwrap();
            let (h, _) = FsDriver::parse_reply(&c, opcode::WRITE, t).unwrap();
            assert_eq!(h.error, 0);
        }
    }
    // The rest of the file (sequential, 128 KiB writes): where the random writes did not go.
    for (i, chunk) in expected[4 << 20..].chunks(128 << 10).enumerate() {
        let at = (4 << 20) + i * (128 << 10);
        d.write(f.nodeid, open.fh, at as u64, chunk).unwrap();
    }
    let st = s.fs().stats().unstable;
    assert!(st.background_commits >= 8, "{st:?}");
    assert_eq!(st.full, 0, "no write fell back to FILE_SYNC: {st:?}");
    assert!(st.stored >= 2048 + 64 + 64, "every write went UNSTABLE: {st:?}");
    assert!(st.high_water <= STORE as u64 && st.bytes_now <= STORE as u64, "{st:?}");
    assert!(st.background_freed > 10 << 20, "the background COMMITs freed the store: {st:?}");
    // On the server before any FLUSH (the server's own view of the file).
    assert!(std::fs::read(g.export().join("long")).unwrap() == expected, "the export has every write");
    // And through the device.
    let back = d.read(f.nodeid, open.fh, 0, 128 << 10).unwrap();
    assert!(back == expected[..128 << 10]);
    d.release(f.nodeid, open.fh).unwrap();
    assert_eq!(s.fs().stats().unstable.bytes_now, 0, "the last close committed the rest");
    d.shutdown().unwrap();
}

/// Locks kept by the NFSv4.1 server (issue 23): what one device holds, another device on the
/// export (and any other client) sees.
mod locks41 {
    use super::*;
    use virtiofs_tools::fuse_abi::OFFSET_MAX;
    use virtiofs_tools::{DriverError, LockReq};

    const RD: i32 = libc::F_RDLCK;
    const WR: i32 = libc::F_WRLCK;
    const UN: i32 = libc::F_UNLCK;

    pub(super) fn posix(fh: u64, owner: u64, typ: i32, start: u64, end: u64) -> LockReq {
        LockReq { fh, owner, typ, start, end, pid: 1000 + owner as u32, flock: false }
    }

    pub(super) fn flock(fh: u64, typ: i32) -> LockReq {
        LockReq { fh, owner: fh, typ, start: 0, end: OFFSET_MAX, pid: 77, flock: true }
    }

    pub(super) fn lk_errno(r: Result<Option<abi::FileLock>, DriverError>) -> i32 {
        match r {
            Ok(_) => 0,
            Err(e) => e.fuse_errno().unwrap_or_else(|| panic!("not a FUSE error: {e}")),
        }
    }

    /// Asserts that `unique` stays unanswered for a while (it waits).
    pub(super) fn assert_waits(d: &mut FsDriver, unique: u64) {
        std::thread::sleep(Duration::from_millis(300));
        let c = d.try_take(unique).unwrap();
        assert!(c.is_none(), "the request should still wait: {c:?}");
    }

    /// Waits for SETLKW `w`'s answer, which must be a grant, in bounded time.
    pub(super) fn granted(d: &mut FsDriver, w: u64) -> Duration {
        let t0 = Instant::now();
        assert_eq!(lk_errno(d.lk_result(opcode::SETLKW, w)), 0);
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(5), "the grant took {took:?}");
        took
    }

    #[test]
    fn two_devices_on_one_nfs41_export_see_each_others_locks() {
        let g = Ganesha::start();
        let a = Served::on(&g, Nfs::V41, |_| {});
        let b = Served::on(&g, Nfs::V41, |_| {});
        let mut da = a.connect();
        let mut db = b.connect();
        let (f, oa) = da.create(ROOT, "locked", 0o644, RDWR).unwrap();
        let fb = db.lookup(ROOT, "locked").unwrap().nodeid;
        let ob = db.open(fb, RDWR).unwrap();
        // A write lock through A: B's SETLK is EAGAIN, its GETLK names the lock in the way.
        da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 0, 99)).unwrap();
        assert_eq!(errno(db.setlk(fb, &posix(ob.fh, 2, RD, 50, 60))), libc::EAGAIN);
        let c = db.getlk(fb, &posix(ob.fh, 2, WR, 0, OFFSET_MAX)).unwrap();
        assert_eq!((c.typ as i32, c.start, c.end, c.pid), (WR, 0, 99, 0), "the conflict, pid unknown");
        assert_eq!(db.getlk(fb, &posix(ob.fh, 2, WR, 100, OFFSET_MAX)).unwrap().typ as i32, UN);
        // B's SETLKW waits while A holds it and is granted once A unlocks.
        let w = db.submit_lk(1, opcode::SETLKW, fb, &posix(ob.fh, 2, WR, 0, 0)).unwrap();
        assert_waits(&mut db, w);
        db.getattr(fb).unwrap();
        da.setlk(f.nodeid, &posix(oa.fh, 1, UN, 0, 99)).unwrap();
        let took = granted(&mut db, w);
        eprintln!("unlock through A to SETLKW granted through B: {took:?}");
        let c = da.getlk(f.nodeid, &posix(oa.fh, 1, RD, 0, OFFSET_MAX)).unwrap();
        assert_eq!((c.typ as i32, c.start, c.end), (WR, 0, 0), "B holds byte 0 now");
        // B's process closes the file (FLUSH with its lock owner): its locks go.
        db.flush_owner(fb, ob.fh, 2).unwrap();
        assert_eq!(da.getlk(f.nodeid, &posix(oa.fh, 1, WR, 0, OFFSET_MAX)).unwrap().typ as i32, UN);
        // A locks again; B waits; A's process closes the file (FLUSH, then RELEASE): B is in.
        da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 0, OFFSET_MAX)).unwrap();
        let w = db.submit_lk(1, opcode::SETLKW, fb, &posix(ob.fh, 3, RD, 10, 20)).unwrap();
        assert_waits(&mut db, w);
        da.flush_owner(f.nodeid, oa.fh, 1).unwrap();
        da.release(f.nodeid, oa.fh).unwrap();
        granted(&mut db, w);
        db.setlk(fb, &posix(ob.fh, 3, UN, 0, OFFSET_MAX)).unwrap();
        // flock: whole file, owned by the handle; RELEASE with FLOCK_UNLOCK lets it go.
        let oa = da.open(f.nodeid, RDWR).unwrap();
        da.setlk(f.nodeid, &flock(oa.fh, WR)).unwrap();
        assert_eq!(errno(db.setlk(fb, &flock(ob.fh, RD))), libc::EAGAIN);
        let w = db.submit_lk(1, opcode::SETLKW, fb, &flock(ob.fh, WR)).unwrap();
        assert_waits(&mut db, w);
        da.release_flock(f.nodeid, oa.fh, oa.fh).unwrap();
        granted(&mut db, w);
        // B's last close (with the flock held) closes its open: nothing is left on the server.
        db.release_flock(fb, ob.fh, ob.fh).unwrap();
        let oa = da.open(f.nodeid, RDWR).unwrap();
        da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 0, OFFSET_MAX)).unwrap();
        da.flush_owner(f.nodeid, oa.fh, 1).unwrap();
        da.release(f.nodeid, oa.fh).unwrap();
        let (sa, sb) = (a.fs().stats(), b.fs().stats());
        eprintln!("A {:?}\nB {:?}", sa.locks, sb.locks);
        assert!(sb.locks.waits == 3 && sb.locks.tries >= 3 && sb.locks.tries_denied >= 3, "{:?}", sb.locks);
        assert!(sb.locks.denied >= 3 && sa.locks.freed >= 3 && sb.locks.freed >= 2, "{sa:?} {sb:?}");
        assert_eq!((sa.errors, sb.errors), (0, 2), "B's two EAGAINs only");
        da.shutdown().unwrap();
        db.shutdown().unwrap();
    }
    /// A lock operation commits the file's stored UNSTABLE writes first (as Linux's client
    /// flushes before one): a write the server might lose would otherwise be sent again after
    /// the lock changed hands, over what the next holder wrote.
    #[test]
    fn a_lock_or_unlock_commits_the_files_stored_writes_first_on_nfs41() {
        let g = Ganesha::start();
        let a = Served::on(&g, Nfs::V41, |_| {});
        let mut da = a.connect();
        let (f, o) = da.create(ROOT, "committed", 0o644, RDWR).unwrap();
        let stored = |a: &Served| a.fs().stats().unstable.bytes_now;
        da.write(f.nodeid, o.fh, 0, &pattern(1, 8192)).unwrap();
        assert!(stored(&a) > 0, "the write is stored");
        da.setlk(f.nodeid, &posix(o.fh, 1, WR, 0, 99)).unwrap();
        assert_eq!(stored(&a), 0, "committed before the LOCK");
        da.write(f.nodeid, o.fh, 0, &pattern(2, 8192)).unwrap();
        assert!(stored(&a) > 0);
        da.setlk(f.nodeid, &posix(o.fh, 1, UN, 0, 99)).unwrap();
        assert_eq!(stored(&a), 0, "committed before the LOCKU");
        // GETLK changes nothing: nothing to commit for it.
        da.write(f.nodeid, o.fh, 0, &pattern(3, 8192)).unwrap();
        da.getlk(f.nodeid, &posix(o.fh, 2, WR, 0, 99)).unwrap();
        assert!(stored(&a) > 0, "GETLK does not commit");
        da.flush_owner(f.nodeid, o.fh, 1).unwrap();
        da.release(f.nodeid, o.fh).unwrap();
        assert_eq!(std::fs::read(g.export().join("committed")).unwrap(), pattern(3, 8192));
        da.shutdown().unwrap();
    }

    #[test]
    fn an_ofd_lock_goes_with_the_release_of_the_handle_it_came_from() {
        let g = Ganesha::start();
        let a = Served::on(&g, Nfs::V41, |_| {});
        let b = Served::on(&g, Nfs::V41, |_| {});
        let mut da = a.connect();
        let mut db = b.connect();
        let (f, o1) = da.create(ROOT, "ofd", 0o644, RDWR).unwrap();
        let o2 = da.open(f.nodeid, RDWR).unwrap();
        let fb = db.lookup(ROOT, "ofd").unwrap().nodeid;
        let ob = db.open(fb, RDWR).unwrap();
        // An OFD lock through the first handle (its owner is the open file: no FLUSH names it,
        // and RELEASE names it only when a flock was held).
        const OFD: u64 = 0x0fd0_0000_0001;
        da.setlk(f.nodeid, &posix(o1.fh, OFD, WR, 0, 99)).unwrap();
        assert_eq!(errno(db.setlk(fb, &posix(ob.fh, 2, WR, 0, 0))), libc::EAGAIN);
        // The file stays open through the second handle; the first one's RELEASE lets the
        // lock go before its CLOSE (which would fail LOCKS_HELD).
        da.release(f.nodeid, o1.fh).unwrap();
        db.setlk(fb, &posix(ob.fh, 2, WR, 0, 99)).unwrap();
        assert_eq!(a.fs().stats().close_failures, 0);
        db.flush_owner(fb, ob.fh, 2).unwrap();
        db.release(fb, ob.fh).unwrap();
        da.release(f.nodeid, o2.fh).unwrap();
        da.shutdown().unwrap();
        db.shutdown().unwrap();
    }

    /// Waits (at most 5 s) for whichever of SETLKW `wa` through `da` and `wb` through `db`
    /// is answered first, which must be a grant: true for `wa`'s.
    fn first_granted(da: &mut FsDriver, wa: u64, db: &mut FsDriver, wb: u64) -> bool {
        let t0 = Instant::now();
        loop {
            for (d, w, is_a) in [(&mut *da, wa, true), (&mut *db, wb, false)] {
                if let Some(c) = d.try_take(w).unwrap() {
                    assert_eq!(lk_errno(FsDriver::lk_reply(&c, opcode::SETLKW)), 0);
                    return is_a;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "neither conversion was granted");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_flock_conversion_lets_the_shared_lock_go_first_so_two_converting_holders_do_not_deadlock() {
        let g = Ganesha::start();
        let a = Served::on(&g, Nfs::V41, |_| {});
        let b = Served::on(&g, Nfs::V41, |_| {});
        let mut da = a.connect();
        let mut db = b.connect();
        let (f, oa) = da.create(ROOT, "converted", 0o644, RDWR).unwrap();
        let fb = db.lookup(ROOT, "converted").unwrap().nodeid;
        let ob = db.open(fb, RDWR).unwrap();
        // Both hold LOCK_SH; A asks LOCK_EX and waits until B lets its LOCK_SH go.
        da.setlk(f.nodeid, &flock(oa.fh, RD)).unwrap();
        db.setlk(fb, &flock(ob.fh, RD)).unwrap();
        let w = da.submit_lk(1, opcode::SETLKW, f.nodeid, &flock(oa.fh, WR)).unwrap();
        assert_waits(&mut da, w);
        db.setlk(fb, &flock(ob.fh, UN)).unwrap();
        granted(&mut da, w);
        assert_eq!(errno(db.setlk(fb, &flock(ob.fh, RD))), libc::EAGAIN, "A holds LOCK_EX");
        // Back to both LOCK_SH (A converts down at once), then both ask LOCK_EX: each lets its
        // LOCK_SH go first, so one is granted, and the other once that one unlocks.
        da.setlk(f.nodeid, &flock(oa.fh, RD)).unwrap();
        db.setlk(fb, &flock(ob.fh, RD)).unwrap();
        let wa = da.submit_lk(1, opcode::SETLKW, f.nodeid, &flock(oa.fh, WR)).unwrap();
        let wb = db.submit_lk(1, opcode::SETLKW, fb, &flock(ob.fh, WR)).unwrap();
        if first_granted(&mut da, wa, &mut db, wb) {
            assert_waits(&mut db, wb);
            da.setlk(f.nodeid, &flock(oa.fh, UN)).unwrap();
            granted(&mut db, wb);
        } else {
            assert_waits(&mut da, wa);
            db.setlk(fb, &flock(ob.fh, UN)).unwrap();
            granted(&mut da, wa);
        }
        da.release_flock(f.nodeid, oa.fh, oa.fh).unwrap();
        db.release_flock(fb, ob.fh, ob.fh).unwrap();
        da.shutdown().unwrap();
        db.shutdown().unwrap();
    }
}

/// A plain NFSv4.1 client of the export beside the device: a session of its own, with a client
/// owner of its own (as `backend/tests/nfs4_session.rs` builds one), that opens and locks a file.
mod plain41 {
    use std::collections::HashMap;

    use super::*;
    use virtiofs_backend::nfs::conn::{CallError, CompoundReply, Conn, ConnConfig, Cred, Nfs41};
    use virtiofs_backend::nfs::session::{ClientShare, Session, SessionConfig, SessionSink, State};
    use virtiofs_backend::nfs::wire::nfs4::{
        share, Fh, LockType, Locker, Nfsstat4, Op, OpRes, Open, OpenClaim, StateOwner, Stateid,
    };

    /// A call of the plain client's, kept to give its operations whenever the session asks.
    #[derive(Clone)]
    enum Req {
        /// PUTROOTFH, LOOKUP of each component, OPEN (no create) of `name` denying others
        /// the share given, GETFH.
        Open(Vec<Vec<u8>>, Vec<u8>, u32),
        /// PUTFH, LOCK (write, `offset`, `length`) from the open's stateid.
        Lock(Fh, Stateid, u64, u64),
        /// PUTFH, LOCKU of the lock stateid's whole file.
        Locku(Fh, Stateid),
    }

    /// What a call came to: its status, the stateid (OPEN's, LOCK's), the handle.
    #[derive(Clone, Debug)]
    pub(super) struct Told {
        pub(super) status: Nfsstat4,
        pub(super) stateid: Option<Stateid>,
        pub(super) fh: Option<Fh>,
    }

    #[derive(Default)]
    struct Owner {
        clientid: u64,
        reqs: HashMap<u32, Req>,
        done: HashMap<u32, Result<Told, CallError>>,
    }

    const NAME: &[u8] = b"plain-client";

    impl Owner {
        fn with_ops(&self, tag: u32, f: &mut dyn FnMut(&[Op<'_>])) {
            let Some(r) = self.reqs.get(&tag) else { return };
            let owner = StateOwner { clientid: self.clientid, owner: NAME };
            match r {
                Req::Open(path, name, deny) => {
                    let mut ops = vec![Op::Putrootfh];
                    ops.extend(path.iter().map(|c| Op::Lookup { name: c }));
                    ops.push(Op::Open(Open {
                        share_access: share::ACCESS_BOTH | share::WANT_NO_DELEG,
                        share_deny: *deny,
                        owner,
                        create: None,
                        claim: OpenClaim::Null(name),
                    }));
                    ops.push(Op::Getfh);
                    f(&ops)
                }
                Req::Lock(fh, open, offset, length) => f(&[
                    Op::Putfh { fh },
                    Op::Lock {
                        locktype: LockType::Write,
                        reclaim: false,
                        offset: *offset,
                        length: *length,
                        locker: Locker::New { open_stateid: *open, owner },
                    },
                ]),
                Req::Locku(fh, s) => f(&[
                    Op::Putfh { fh },
                    Op::Locku { locktype: LockType::Write, stateid: *s, offset: 0, length: u64::MAX },
                ]),
            }
        }
    }

    impl SessionSink for Owner {
        fn read_buffer(&mut self, _: u32) -> Option<virtiofs_backend::io::Writer<'_>> {
            None
        }

        fn payload(&mut self, _: u32) -> Option<virtiofs_backend::io::Reader<'_>> {
            None
        }

        fn ops(&mut self, tag: u32, send: &mut dyn FnMut(&[Op<'_>])) {
            self.with_ops(tag, send);
        }

        fn done(&mut self, tag: u32, res: Result<CompoundReply<'_>, CallError>) {
            let told = res.map(|r| {
                let mut t = Told { status: r.status, stateid: None, fh: None };
                for op in r.results.flatten() {
                    match op {
                        OpRes::Open(o) => t.stateid = Some(o.stateid),
                        OpRes::Lock(s) | OpRes::Locku(s) => t.stateid = Some(s),
                        OpRes::Getfh(fh) => t.fh = Some(fh),
                        _ => {}
                    }
                }
                t
            });
            self.done.insert(tag, told);
        }
    }

    /// The plain client: a session over a connection of its own, driven by its calls.
    pub(super) struct Plain {
        conn: Conn<Nfs41>,
        s: Session,
        o: Owner,
        tag: u32,
        fh: Option<Fh>,
        open: Option<Stateid>,
    }

    impl Plain {
        pub(super) fn new(g: &Ganesha) -> Plain {
            let timeout = Duration::from_secs(20);
            let verifier = (std::process::id() as u64 ^ 0x9a1a_0001).to_be_bytes();
            let client = Arc::new(ClientShare::new(b"a plain NFSv4.1 client of the test".to_vec(), verifier));
            let cfg = SessionConfig { client, slots: 4, max_io: 1 << 16, timeout, cred: Cred::ROOT };
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], g.nfs_port()));
            let conn = Conn::new(ConnConfig {
                addr,
                slots: cfg.conn_slots(),
                max_io: 1 << 16,
                timeout,
                retransmit: Duration::from_secs(1),
                machine_name: "plain41".into(),
            })
            .unwrap();
            let mut p = Plain {
                conn,
                s: Session::new(cfg, Instant::now()),
                o: Owner::default(),
                tag: 0,
                fh: None,
                open: None,
            };
            let t0 = Instant::now();
            while p.s.state() != State::Ready {
                assert!(t0.elapsed() < timeout, "the plain client's session");
                p.poll();
                std::thread::sleep(Duration::from_millis(1));
            }
            p.o.clientid = p.s.params().unwrap().clientid;
            p
        }

        fn poll(&mut self) {
            self.s.poll(Instant::now(), &mut self.conn, &mut self.o);
        }

        fn call(&mut self, req: Req) -> Told {
            self.tag += 1;
            let tag = self.tag;
            self.o.reqs.insert(tag, req);
            let (s, conn, o) = (&mut self.s, &mut self.conn, &mut self.o);
            let mut r = None;
            o.with_ops(tag, &mut |ops| {
                r = Some(s.call(conn, Instant::now(), tag, &Cred::ROOT, ops, &mut Owner::default()))
            });
            r.unwrap().unwrap();
            let t0 = Instant::now();
            while !self.o.done.contains_key(&tag) {
                assert!(t0.elapsed() < Duration::from_secs(20), "the plain client's call");
                self.poll();
                std::thread::sleep(Duration::from_micros(200));
            }
            self.o.done.remove(&tag).unwrap().unwrap()
        }

        /// Opens `name` in the export (read and write).
        pub(super) fn open(&mut self, g: &Ganesha, name: &str) {
            let t = self.open_deny(g, name, share::DENY_NONE);
            assert_eq!(t.status, Nfsstat4::Ok, "{t:?}");
        }

        /// Opens `name` in the export (read and write), denying others `deny`: what the server
        /// said.
        pub(super) fn open_deny(&mut self, g: &Ganesha, name: &str, deny: u32) -> Told {
            let path = g
                .export()
                .components()
                .filter_map(|c| match c {
                    std::path::Component::Normal(n) => Some(n.as_encoded_bytes().to_vec()),
                    _ => None,
                })
                .collect();
            let t = self.call(Req::Open(path, name.as_bytes().to_vec(), deny));
            if t.status == Nfsstat4::Ok {
                self.fh = t.fh;
                self.open = t.stateid;
            }
            t
        }

        /// LOCK (write) of `length` bytes from `offset`: the status, and the lock stateid.
        pub(super) fn lock(&mut self, offset: u64, length: u64) -> Told {
            self.call(Req::Lock(self.fh.unwrap(), self.open.unwrap(), offset, length))
        }

        /// LOCKU of the whole file.
        pub(super) fn unlock(&mut self, lock: Stateid) -> Told {
            self.call(Req::Locku(self.fh.unwrap(), lock))
        }

        /// Keeps the session alive (and answers nothing) for `d`.
        pub(super) fn idle(&mut self, d: Duration) {
            let t0 = Instant::now();
            while t0.elapsed() < d {
                self.poll();
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    #[test]
    fn a_device_and_a_plain_nfs41_client_see_each_others_locks() {
        use super::locks41::{assert_waits, granted, posix};
        let g = Ganesha::start();
        let s = Served::on(&g, Nfs::V41, |_| {});
        let mut d = s.connect();
        let (f, o) = d.create(ROOT, "shared-lock", 0o644, RDWR).unwrap();
        let mut p = Plain::new(&g);
        p.open(&g, "shared-lock");
        // The plain client's lock blocks the device's SETLK, and its SETLKW until LOCKU.
        let t = p.lock(0, 10);
        assert_eq!(t.status, Nfsstat4::Ok, "{t:?}");
        let held = t.stateid.unwrap();
        assert_eq!(errno(d.setlk(f.nodeid, &posix(o.fh, 1, libc::F_WRLCK, 5, 5))), libc::EAGAIN);
        let c = d.getlk(f.nodeid, &posix(o.fh, 1, libc::F_RDLCK, 0, 100)).unwrap();
        assert_eq!((c.typ as i32, c.start, c.end), (libc::F_WRLCK, 0, 9));
        let w = d.submit_lk(1, opcode::SETLKW, f.nodeid, &posix(o.fh, 1, libc::F_WRLCK, 0, 99)).unwrap();
        assert_waits(&mut d, w);
        p.idle(Duration::from_millis(100));
        assert_eq!(p.unlock(held).status, Nfsstat4::Ok);
        granted(&mut d, w);
        // The device's lock makes the plain client's LOCK DENIED; its unlock lets it in.
        assert_eq!(p.lock(50, 1).status, Nfsstat4::Denied);
        d.setlk(f.nodeid, &posix(o.fh, 1, libc::F_UNLCK, 0, 99)).unwrap();
        let t = p.lock(50, 1);
        assert_eq!(t.status, Nfsstat4::Ok, "{t:?}");
        p.unlock(t.stateid.unwrap());
        d.flush_owner(f.nodeid, o.fh, 1).unwrap();
        d.release(f.nodeid, o.fh).unwrap();
        d.shutdown().unwrap();
    }
}

/// A reset guest leaves nothing on an NFSv4.1 server (issue 23): its locks go at the reset,
/// its opens and the silly names of files it unlinked while open at the next INIT.
mod reset41 {
    use super::locks41::posix;
    use super::plain41::Plain;
    use super::*;
    use virtiofs_backend::nfs::wire::nfs4::{share, Nfsstat4};

    const WR: i32 = libc::F_WRLCK;
    const UN: i32 = libc::F_UNLCK;

    fn sillies(g: &Ganesha) -> usize {
        let names = std::fs::read_dir(g.export()).unwrap().map(|e| e.unwrap().file_name());
        names.filter(|n| n.to_string_lossy().starts_with(".nfs")).count()
    }

    #[test]
    fn a_reset_guest_leaves_no_lock_open_or_silly_name_on_the_nfs41_server() {
        let g = Ganesha::start();
        let a = Served::on(&g, Nfs::V41, |_| {});
        let b = Served::on(&g, Nfs::V41, |_| {});
        let mut da = a.connect();
        let (f, oa) = da.create(ROOT, "held", 0o644, RDWR).unwrap();
        da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 0, 99)).unwrap();
        let (t, ot) = da.create(ROOT, "tmp", 0o600, RDWR).unwrap();
        da.write(t.nodeid, ot.fh, 0, b"unlinked while open").unwrap();
        da.unlink(ROOT, "tmp").unwrap();
        assert_eq!(sillies(&g), 1, "renamed while open");
        let mut db = b.connect();
        let fb = db.lookup(ROOT, "held").unwrap().nodeid;
        let ob = db.open(fb, RDWR).unwrap();
        assert_eq!(errno(db.setlk(fb, &posix(ob.fh, 2, WR, 0, 99))), libc::EAGAIN);
        // A resets its device (no INIT yet): its lock goes in bounded time.
        da.shutdown().unwrap();
        let t0 = Instant::now();
        while let Err(e) = db.setlk(fb, &posix(ob.fh, 2, WR, 0, 99)) {
            assert_eq!(e.fuse_errno(), Some(libc::EAGAIN), "{e}");
            assert!(t0.elapsed() < Duration::from_secs(5), "A's lock outlived its reset");
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("the lock went {:?} after the reset", t0.elapsed());
        db.setlk(fb, &posix(ob.fh, 2, UN, 0, 99)).unwrap();
        db.flush_owner(fb, ob.fh, 2).unwrap();
        db.release(fb, ob.fh).unwrap();
        // A's opens stay until its next INIT (its handle table still names them): an open that
        // denies others both accesses is refused while any other open of the file is left.
        let mut p = Plain::new(&g);
        assert_eq!(p.open_deny(&g, "held", share::DENY_BOTH).status, Nfsstat4::ShareDenied);
        assert_eq!(sillies(&g), 1);
        // The next guest's INIT: the old opens are CLOSEd, the silly name REMOVEd. Each try is
        // a new plain client's (ganesha kept refusing one client's repeated OPEN after a
        // refusal in some runs, though the opens in the way were closed).
        let da = a.connect();
        let t0 = Instant::now();
        loop {
            let told = Plain::new(&g).open_deny(&g, "held", share::DENY_BOTH);
            if told.status == Nfsstat4::Ok && sillies(&g) == 0 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "after INIT: {told:?}, {} silly names left; A {:?} B {:?}",
                sillies(&g),
                a.fs().stats(),
                b.fs().stats()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("the opens and the silly name went {:?} after INIT", t0.elapsed());
        let names: Vec<_> = std::fs::read_dir(g.export()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["held"], "the file unlinked while open is gone");
        let st = a.fs().stats();
        assert_eq!(st.close_failures, 0, "{st:?}");
        assert!(st.locks.freed >= 1, "{:?}", st.locks);
        da.shutdown().unwrap();
    }
}

mod locks41_faults {
    use super::locks41::{assert_waits, flock, granted, lk_errno, posix};
    use super::*;
    use virtiofs_tools::fuse_abi::OFFSET_MAX;

    const RD: i32 = libc::F_RDLCK;
    const WR: i32 = libc::F_WRLCK;
    const UN: i32 = libc::F_UNLCK;

    #[test]
    fn an_interrupt_or_a_reset_ends_a_setlkw_waiting_on_nfs41_and_the_reset_lets_locks_go() {
        let g = Ganesha::start();
        let a = Served::on(&g, Nfs::V41, |_| {});
        let b = Served::on(&g, Nfs::V41, |_| {});
        let mut da = a.connect();
        let (f, oa) = da.create(ROOT, "waited", 0o644, RDWR).unwrap();
        da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 0, 99)).unwrap();
        let mut db = b.connect();
        let fb = db.lookup(ROOT, "waited").unwrap().nodeid;
        let ob = db.open(fb, RDWR).unwrap();
        // INTERRUPT (hiprio queue) of a waiting SETLKW: EINTR.
        let w = db.submit_lk(1, opcode::SETLKW, fb, &posix(ob.fh, 2, WR, 0, 0)).unwrap();
        assert_waits(&mut db, w);
        db.interrupt(w).unwrap();
        assert_eq!(lk_errno(db.lk_result(opcode::SETLKW, w)), libc::EINTR);
        // B holds a lock of its own, and a SETLKW waits, when the device resets.
        db.setlk(fb, &posix(ob.fh, 5, WR, 200, 299)).unwrap();
        assert_eq!(errno(da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 200, 200))), libc::EAGAIN);
        let w = db.submit_lk(1, opcode::SETLKW, fb, &posix(ob.fh, 2, WR, 0, 0)).unwrap();
        assert_waits(&mut db, w);
        let t0 = Instant::now();
        db.shutdown().unwrap();
        let mut db = b.connect();
        assert!(t0.elapsed() < Duration::from_secs(5), "reset and INIT took {:?}", t0.elapsed());
        // The new session's INIT ended the old one's locks: the engines let them go.
        let t0 = Instant::now();
        while errno_or_ok(da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 200, 200))) == libc::EAGAIN {
            assert!(t0.elapsed() < Duration::from_secs(5), "B's lock outlived its session");
            std::thread::sleep(Duration::from_millis(20));
        }
        // And the waiting SETLKW is gone: nothing of B's takes byte 0 when A unlocks.
        da.setlk(f.nodeid, &posix(oa.fh, 1, UN, 0, OFFSET_MAX)).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let c = da.getlk(f.nodeid, &posix(oa.fh, 1, WR, 0, OFFSET_MAX)).unwrap();
        assert_eq!(c.typ as i32, UN, "no lock of B's old session: {c:?}");
        assert!(b.fs().stats().locks.freed >= 1, "{:?}", b.fs().stats().locks);
        let fb = db.lookup(ROOT, "waited").unwrap().nodeid;
        let ob = db.open(fb, RDWR).unwrap();
        db.setlk(fb, &posix(ob.fh, 2, WR, 0, OFFSET_MAX)).unwrap();
        db.flush_owner(fb, ob.fh, 2).unwrap();
        db.release(fb, ob.fh).unwrap();
        da.flush_owner(f.nodeid, oa.fh, 1).unwrap();
        da.release(f.nodeid, oa.fh).unwrap();
        da.shutdown().unwrap();
        db.shutdown().unwrap();
    }

    #[test]
    fn a_lock_held_across_an_nfs41_server_restart_fails_the_next_io_instead_of_going_without_it() {
        let mut g = Ganesha::start();
        let a = Served::on(&g, Nfs::V41, |o| o.retransmit = Duration::from_millis(500));
        let mut da = a.connect();
        let (f, oa) = da.create(ROOT, "locked", 0o644, RDWR).unwrap();
        let (u, ou) = da.create(ROOT, "unlocked", 0o644, RDWR).unwrap();
        da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 0, OFFSET_MAX)).unwrap();
        da.write(f.nodeid, oa.fh, 0, b"under the lock").unwrap();
        g.kill();
        g.start_again();
        // A file with no lock: its open is opened again, unseen.
        da.write(u.nodeid, ou.fh, 0, b"after the restart").unwrap();
        assert_eq!(da.read(u.nodeid, ou.fh, 0, 100).unwrap(), b"after the restart");
        // The locked file: its lock is gone on the server, so the write that relied on it fails,
        // and so does everything through a handle opened before, never without the lock.
        assert_eq!(errno(da.write(f.nodeid, oa.fh, 0, b"without the lock")), libc::EIO);
        assert_eq!(errno(da.read(f.nodeid, oa.fh, 0, 100)), libc::EIO);
        assert_eq!(errno(da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 0, 0))), libc::EIO);
        // It is gone: another device takes it.
        let b = Served::on(&g, Nfs::V41, |_| {});
        let mut db = b.connect();
        let fb = db.lookup(ROOT, "locked").unwrap().nodeid;
        let ob = db.open(fb, RDWR).unwrap();
        db.setlk(fb, &posix(ob.fh, 2, WR, 0, OFFSET_MAX)).unwrap();
        db.setlk(fb, &posix(ob.fh, 2, UN, 0, OFFSET_MAX)).unwrap();
        db.release(fb, ob.fh).unwrap();
        // The file's last close ends the mark: a new open works, and locks again. (Its FLUSH
        // reports the loss, EIO, when the write under the lost lock is still stored: it is not
        // sent again without the lock, and goes with the last close.)
        let flushed = errno_or_ok(da.flush_owner(f.nodeid, oa.fh, 1));
        assert!(flushed == 0 || flushed == libc::EIO, "{flushed}");
        da.release(f.nodeid, oa.fh).unwrap();
        let oa = da.open(f.nodeid, RDWR).unwrap();
        da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 0, OFFSET_MAX)).unwrap();
        da.write(f.nodeid, oa.fh, 0, b"under a new lock").unwrap();
        assert_eq!(std::fs::read(g.export().join("locked")).unwrap(), b"under a new lock");
        assert_eq!(std::fs::read(g.export().join("unlocked")).unwrap(), b"after the restart");
        da.flush_owner(f.nodeid, oa.fh, 1).unwrap();
        da.release(f.nodeid, oa.fh).unwrap();
        da.release(u.nodeid, ou.fh).unwrap();
        da.shutdown().unwrap();
        db.shutdown().unwrap();
    }

    #[test]
    fn an_interrupt_that_comes_before_its_setlkw_ends_it_on_nfs41() {
        let g = Ganesha::start();
        let a = Served::on(&g, Nfs::V41, |_| {});
        let b = Served::on(&g, Nfs::V41, |_| {});
        let mut da = a.connect();
        let mut db = b.connect();
        let (f, oa) = da.create(ROOT, "early", 0o644, RDWR).unwrap();
        let fb = db.lookup(ROOT, "early").unwrap().nodeid;
        let ob = db.open(fb, RDWR).unwrap();
        da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 0, OFFSET_MAX)).unwrap();
        // The INTERRUPT reaches the device before the SETLKW it names (another queue): the
        // SETLKW ends with EINTR at once rather than wait for the lock.
        let next = db.peek_next_unique();
        db.interrupt(next).unwrap();
        let w = db.submit_lk(1, opcode::SETLKW, fb, &posix(ob.fh, 2, WR, 0, 0)).unwrap();
        assert_eq!(w, next);
        assert_eq!(lk_errno(db.lk_result(opcode::SETLKW, w)), libc::EINTR);
        // Once: the next SETLKW waits, and is granted when A unlocks.
        let w = db.submit_lk(1, opcode::SETLKW, fb, &posix(ob.fh, 2, WR, 0, 0)).unwrap();
        assert_waits(&mut db, w);
        da.setlk(f.nodeid, &posix(oa.fh, 1, UN, 0, OFFSET_MAX)).unwrap();
        granted(&mut db, w);
        assert_eq!(b.fs().stats().locks.waits, 1, "the interrupted one never waited");
        db.flush_owner(fb, ob.fh, 2).unwrap();
        db.release(fb, ob.fh).unwrap();
        da.flush_owner(f.nodeid, oa.fh, 1).unwrap();
        da.release(f.nodeid, oa.fh).unwrap();
        da.shutdown().unwrap();
        db.shutdown().unwrap();
    }

    #[test]
    fn a_lock_call_that_meets_a_lost_lock_state_first_still_fails_the_next_write() {
        let mut g = Ganesha::start();
        let a = Served::on(&g, Nfs::V41, |o| o.retransmit = Duration::from_millis(500));
        let mut da = a.connect();
        // Three files, each with a write lock on 0-99 of an owner of its own.
        let mut files = Vec::new();
        for (i, name) in ["unlocked-part", "locked-more", "waited-more"].into_iter().enumerate() {
            let (f, o) = da.create(ROOT, name, 0o644, RDWR).unwrap();
            let owner = i as u64 + 1;
            da.setlk(f.nodeid, &posix(o.fh, owner, WR, 0, 99)).unwrap();
            files.push((f.nodeid, o.fh, owner));
        }
        g.kill();
        g.start_again();
        // The lock call comes before any READ or WRITE (the reclaim, refused, marked the files).
        let (n, fh, owner) = files[0];
        assert_eq!(errno_or_ok(da.setlk(n, &posix(fh, owner, UN, 50, 99))), 0, "an unlock finds nothing");
        let (n, fh, owner) = files[1];
        assert_eq!(errno(da.setlk(n, &posix(fh, owner, WR, 200, 299))), libc::EIO);
        let (n, fh, owner) = files[2];
        let w = da.submit_lk(1, opcode::SETLKW, n, &posix(fh, owner, WR, 200, 299)).unwrap();
        assert_eq!(lk_errno(da.lk_result(opcode::SETLKW, w)), libc::EIO);
        // Each file is lost: the write through the old handle that relied on 0-99 fails.
        for &(n, fh, _) in &files {
            assert_eq!(errno(da.write(n, fh, 0, b"without the lock")), libc::EIO, "node {n}");
        }
        for (&(n, fh, owner), name) in files.iter().zip(["unlocked-part", "locked-more", "waited-more"]) {
            assert!(std::fs::read(g.export().join(name)).unwrap().is_empty(), "{name} was written");
            da.flush_owner(n, fh, owner).unwrap();
            da.release(n, fh).unwrap();
        }
        // The server (graceless) refused the reclaim: that is where the loss was found.
        let t = a.fs().stats().locks;
        assert_eq!((t.reclaims, t.locks_reclaimed, t.opens_reclaimed), (1, 0, 0), "{t:?}");
        assert!(t.locks_not_reclaimed + t.stale >= 3, "{t:?}");
        da.shutdown().unwrap();
    }

    fn errno_or_ok(r: Result<(), virtiofs_tools::DriverError>) -> i32 {
        r.err().map_or(0, |e| e.fuse_errno().unwrap_or_else(|| panic!("not a FUSE error: {e}")))
    }

    #[test]
    fn an_nfs41_lock_held_two_leases_without_guest_traffic_still_blocks_the_other_device() {
        const LEASE: u32 = 6;
        let g = Ganesha::start_with_lease(Some(LEASE));
        let a = Served::on(&g, Nfs::V41, |_| {});
        let b = Served::on(&g, Nfs::V41, |_| {});
        let mut da = a.connect();
        let mut db = b.connect();
        let (f, oa) = da.create(ROOT, "leased", 0o644, RDWR).unwrap();
        let fb = db.lookup(ROOT, "leased").unwrap().nodeid;
        let ob = db.open(fb, RDWR).unwrap();
        da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 0, OFFSET_MAX)).unwrap();
        // A's pollers renew the lease with no guest request (B's too).
        std::thread::sleep(Duration::from_secs(2 * u64::from(LEASE) + 1));
        assert_eq!(errno(db.setlk(fb, &posix(ob.fh, 2, WR, 0, 0))), libc::EAGAIN);
        let w = db.submit_lk(1, opcode::SETLKW, fb, &posix(ob.fh, 2, WR, 0, 0)).unwrap();
        assert_waits(&mut db, w);
        da.setlk(f.nodeid, &posix(oa.fh, 1, UN, 0, OFFSET_MAX)).unwrap();
        granted(&mut db, w);
        assert!(a.fs().stats().session.renewals >= 2, "{:?}", a.fs().stats().session);
        da.shutdown().unwrap();
        db.shutdown().unwrap();
    }

    #[test]
    fn opens_and_locks_held_across_an_nfs41_server_restart_are_reclaimed_in_its_grace_period() {
        // Ganesha lifts its grace period at the reaper's next look (every half lease) after
        // the last client it knew sent RECLAIM_COMPLETE: a short lease keeps that within the
        // driver's time-out of another device's first OPEN.
        const GRACE: u32 = 30;
        const LEASE: u32 = 4;
        let mut g = Ganesha::start_with_grace(GRACE, LEASE);
        let a = Served::on(&g, Nfs::V41, |o| o.retransmit = Duration::from_millis(500));
        let mut da = a.connect();
        let (f, oa) = da.create(ROOT, "kept", 0o644, RDWR).unwrap();
        let (h, oh) = da.create(ROOT, "flocked", 0o644, RDWR).unwrap();
        let (u, ou) = da.create(ROOT, "unlocked", 0o644, RDWR).unwrap();
        // Two ranges of one owner, a read lock of another to the end of the file, a flock.
        da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 0, 99)).unwrap();
        da.setlk(f.nodeid, &posix(oa.fh, 1, WR, 200, 299)).unwrap();
        da.setlk(f.nodeid, &posix(oa.fh, 2, RD, 1000, OFFSET_MAX)).unwrap();
        da.setlk(h.nodeid, &flock(oh.fh, WR)).unwrap();
        da.write(f.nodeid, oa.fh, 0, b"before").unwrap();
        g.kill();
        g.start_again();
        let t0 = Instant::now();
        // The opens and locks come back in the grace period: I/O goes on through the handles
        // opened before, the locked file's too (under its lock, never without it).
        da.write(f.nodeid, oa.fh, 0, b"after the restart").unwrap();
        da.write(u.nodeid, ou.fh, 0, b"no lock here").unwrap();
        da.write(h.nodeid, oh.fh, 0, b"flocked").unwrap();
        let took = t0.elapsed();
        assert_eq!(da.read(f.nodeid, oa.fh, 0, 100).unwrap(), b"after the restart");
        let t = a.fs().stats().locks;
        assert_eq!(
            (t.reclaims, t.opens_reclaimed, t.opens_not_reclaimed, t.locks_reclaimed, t.locks_not_reclaimed),
            (1, 3, 0, 3, 0),
            "{t:?}"
        );
        eprintln!("reclaimed within {took:?} of the restart");

        // Another device sees the reclaimed locks: the ranges held, not the hole between them.
        let b = Served::on(&g, Nfs::V41, |_| {});
        let mut db = b.connect();
        let fb = db.lookup(ROOT, "kept").unwrap().nodeid;
        let ob = db.open(fb, RDWR).unwrap();
        assert_eq!(errno(db.setlk(fb, &posix(ob.fh, 9, WR, 50, 50))), libc::EAGAIN);
        assert_eq!(errno(db.setlk(fb, &posix(ob.fh, 9, WR, 250, 250))), libc::EAGAIN);
        assert_eq!(errno(db.setlk(fb, &posix(ob.fh, 9, WR, 5000, 5000))), libc::EAGAIN);
        db.setlk(fb, &posix(ob.fh, 9, RD, 5000, 5000)).unwrap();
        db.setlk(fb, &posix(ob.fh, 9, WR, 100, 199)).unwrap();
        db.setlk(fb, &posix(ob.fh, 9, UN, 0, OFFSET_MAX)).unwrap();
        let hb = db.lookup(ROOT, "flocked").unwrap().nodeid;
        let obh = db.open(hb, RDWR).unwrap();
        assert_eq!(errno(db.setlk(hb, &flock(obh.fh, WR))), libc::EAGAIN);
        // A lets go: B takes them.
        da.setlk(f.nodeid, &posix(oa.fh, 1, UN, 0, OFFSET_MAX)).unwrap();
        da.setlk(f.nodeid, &posix(oa.fh, 2, UN, 0, OFFSET_MAX)).unwrap();
        da.setlk(h.nodeid, &flock(oh.fh, UN)).unwrap();
        db.setlk(fb, &posix(ob.fh, 9, WR, 0, OFFSET_MAX)).unwrap();
        db.setlk(hb, &flock(obh.fh, WR)).unwrap();
        db.setlk(fb, &posix(ob.fh, 9, UN, 0, OFFSET_MAX)).unwrap();
        db.setlk(hb, &flock(obh.fh, UN)).unwrap();
        db.release(fb, ob.fh).unwrap();
        db.release(hb, obh.fh).unwrap();
        for (n, o) in [(f.nodeid, oa.fh), (h.nodeid, oh.fh), (u.nodeid, ou.fh)] {
            da.flush_owner(n, o, 1).unwrap();
            da.release(n, o).unwrap();
        }
        assert_eq!(std::fs::read(g.export().join("kept")).unwrap(), b"after the restart");
        assert_eq!(std::fs::read(g.export().join("unlocked")).unwrap(), b"no lock here");
        assert_eq!(a.fs().stats().close_failures, 0, "every reclaimed open closed");
        da.shutdown().unwrap();
        db.shutdown().unwrap();
    }
}
