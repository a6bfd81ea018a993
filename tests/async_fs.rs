//! The asynchronous filesystem seam end to end: a filesystem whose every operation completes
//! later (a wrapper over the RAM filesystem whose per-poller engine answers on the next poll, in
//! reverse order, READ, WRITE and READDIR doing their work only then, through the buffers the
//! server holds), served by the real device over a real socket to the host driver model. Its
//! synchronous methods are left unimplemented (`ENOSYS`) except the few the server calls itself
//! (INIT, FORGET, the lock checks), so a request that bypassed the engine would fail. And a
//! queue stop (the driver's reset) waits for a pending request: the drain.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtiofs_backend::filesystem::seam::DirentWriter;
use virtiofs_backend::filesystem::seam::{Completions, FsEngine, Started, Token};
use virtiofs_backend::filesystem::{self, Context, FileSystem, LockAccess, Reply};
use virtiofs_backend::request::{Op, ReadArgs, Request, WriteArgs};
use virtiofs_backend::server::serve_sync;
use virtiofs_backend::RamFs;
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::{FuseHandler, RunningDevice};
use virtiofs_tools::fuse_abi::opcode;
use virtiofs_tools::{DriverOptions, FsDriver};
use vm_memory::VolatileSlice;

const ROOT: u64 = 1;

/// What the engines did, all pollers together.
#[derive(Default)]
struct Counters {
    started: AtomicU64,
    completed: AtomicU64,
    /// While set, engines complete nothing.
    hold: AtomicBool,
}

/// The RAM filesystem, every operation of it answered later by [`Later`].
struct LaterFs {
    ram: RamFs,
    counters: Arc<Counters>,
}

impl FileSystem for LaterFs {
    fn init(&self, capable: u64) -> filesystem::Result<u64> {
        self.ram.init(capable)
    }

    fn destroy(&self) {
        self.ram.destroy()
    }

    fn forget(&self, ctx: &Context, ino: u64, nlookup: u64) {
        self.ram.forget(ctx, ino, nlookup)
    }

    fn lock_handle(&self, ctx: &Context, ino: u64, fh: u64, access: LockAccess) -> filesystem::Result<()> {
        self.ram.lock_handle(ctx, ino, fh, access)
    }

    fn has_open_handles(&self, ino: u64) -> bool {
        self.ram.has_open_handles(ino)
    }

    fn engine(&self, _poller: usize) -> Option<Box<dyn FsEngine<Self>>> {
        Some(Box::new(Later { queue: Vec::new(), counters: self.counters.clone() }))
    }
}

/// A request kept for the next poll.
enum Deferred {
    /// Served at start (the reply's data, if any, is in its held buffers already).
    Ready(Token, filesystem::Result<Reply>),
    /// Read at completion time, into the held reply buffers.
    Read { token: Token, ctx: Context, ino: u64, args: ReadArgs },
    /// Written at completion time, from the held payload.
    Write { token: Token, ctx: Context, ino: u64, args: WriteArgs },
    /// Listed at completion time, into the held reply buffers.
    Readdir { token: Token, ctx: Context, ino: u64, fh: u64, offset: u64, plus: bool },
}

struct Later {
    queue: Vec<Deferred>,
    counters: Arc<Counters>,
}

impl FsEngine<LaterFs> for Later {
    fn start(
        &mut self,
        fs: &LaterFs,
        token: Token,
        req: &mut Request<'_>,
        data: &mut virtiofs_backend::io::Writer<'_>,
    ) -> Started {
        self.counters.started.fetch_add(1, Ordering::Relaxed);
        let (ctx, ino) = (req.ctx, req.nodeid);
        let d = match req.op {
            Op::Read(args) => Deferred::Read { token, ctx, ino, args },
            Op::Write { args, .. } => Deferred::Write { token, ctx, ino, args },
            Op::Readdir { fh, offset, .. } => Deferred::Readdir { token, ctx, ino, fh, offset, plus: false },
            Op::Readdirplus { fh, offset, .. } => {
                Deferred::Readdir { token, ctx, ino, fh, offset, plus: true }
            }
            _ => Deferred::Ready(token, serve_sync(&fs.ram, req, data)),
        };
        self.queue.push(d);
        Started::Pending
    }

    fn poll(&mut self, fs: &LaterFs, done: &mut Completions<'_>) {
        if self.queue.is_empty() || self.counters.hold.load(Ordering::Acquire) {
            return;
        }
        // Everything started before this poll, the last first.
        while let Some(d) = self.queue.pop() {
            let (token, reply) = match d {
                Deferred::Ready(token, reply) => (token, reply),
                Deferred::Read { token, ctx, ino, args } => {
                    let mut w = done.data(token).expect("a pending READ has its reply buffers");
                    (token, fs.ram.read(&ctx, ino, &args, &mut w).map(Reply::Data))
                }
                Deferred::Write { token, ctx, ino, args } => {
                    let mut p = done.payload(token).expect("a pending WRITE has its payload");
                    assert_eq!(p.bytes_left(), args.size as usize);
                    (token, fs.ram.write(&ctx, ino, &args, &mut p).map(Reply::Written))
                }
                Deferred::Readdir { token, ctx, ino, fh, offset, plus } => {
                    let mut w = done.data(token).expect("a pending READDIR has its reply buffers");
                    let mut out = DirentWriter::new(&mut w);
                    let r = if plus {
                        fs.ram.readdirplus(&ctx, ino, fh, offset, &mut |e, entry| out.add_plus(&e, entry))
                    } else {
                        fs.ram.readdir(&ctx, ino, fh, offset, &mut |e| out.add(&e))
                    };
                    (token, r.map(|()| Reply::Data(out.bytes_written())))
                }
            };
            done.complete(token, reply);
            self.counters.completed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn in_flight(&self) -> usize {
        self.queue.len()
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    device: Option<RunningDevice>,
    handler: Arc<FuseHandler<LaterFs>>,
    socket: std::path::PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("async.sock");
        let fs = LaterFs { ram: RamFs::new(), counters: Arc::default() };
        let handler = Arc::new(FuseHandler::new(fs));
        let device = RunningDevice::start_with(&socket, Profile::default(), handler.clone()).unwrap();
        Setup { _dir: dir, device: Some(device), handler, socket }
    }

    fn counters(&self) -> &Counters {
        &self.handler.server().filesystem().counters
    }

    fn connect(&self) -> FsDriver {
        FsDriver::connect(&self.socket, DriverOptions::default()).expect("driver brings the device up")
    }

    /// A session with file `f` in the root holding `data`; its node id and handle.
    fn with_file(&self, data: &[u8]) -> (FsDriver, u64, u64) {
        let mut d = self.connect();
        d.init().unwrap();
        let (file, open) = d.create(ROOT, "f", 0o644, libc::O_RDWR as u32).unwrap();
        d.write(file.nodeid, open.fh, 0, data).unwrap();
        (d, file.nodeid, open.fh)
    }
}

/// Submits a 4 KiB READ at `offset` without waiting for it; its token.
fn submit_read(d: &mut FsDriver, node: u64, fh: u64, offset: u64) -> u64 {
    let arg = virtiofs_tools::fuse_abi::ReadIn { fh, offset, size: 4096, ..Default::default() };
    d.submit(1, opcode::READ, node, &[&arg.to_bytes()], &[], 0, 4096).unwrap()
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(d) = self.device.take() {
            let _ = d.stop();
        }
    }
}

#[test]
fn every_operation_completes_later() {
    let s = Setup::new();
    let mut d = s.connect();
    d.init().unwrap();

    let dir = d.mkdir(ROOT, "dir", 0o755).unwrap();
    let (file, open) = d.create(dir.nodeid, "f", 0o644, libc::O_RDWR as u32).unwrap();
    let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(d.write(file.nodeid, open.fh, 0, &data).unwrap() as usize, data.len());
    assert_eq!(
        d.read(file.nodeid, open.fh, 0, data.len() as u32 + 4096).unwrap(),
        data,
        "read back, short at EOF"
    );
    assert_eq!(d.read(file.nodeid, open.fh, 4096, 10).unwrap(), &data[4096..4106]);
    assert_eq!(d.getattr(file.nodeid).unwrap().size, data.len() as u64);
    assert_eq!(d.lookup(dir.nodeid, "f").unwrap().nodeid, file.nodeid);

    d.symlink(dir.nodeid, "link", "f").unwrap();
    let link = d.lookup(dir.nodeid, "link").unwrap();
    assert_eq!(d.readlink(link.nodeid).unwrap(), b"f");

    let dh = d.opendir(dir.nodeid).unwrap();
    let mut names: Vec<Vec<u8>> =
        d.readdir_all(dir.nodeid, dh.fh).unwrap().into_iter().map(|e| e.name).collect();
    names.sort();
    assert_eq!(names, [b".".to_vec(), b"..".to_vec(), b"f".to_vec(), b"link".to_vec()]);
    let plus = d.readdirplus(dir.nodeid, dh.fh, 0, 4096).unwrap();
    assert!(
        plus.iter().any(|e| e.dirent.name == b"f" && e.entry.nodeid == file.nodeid),
        "readdirplus looks up"
    );
    d.releasedir(dir.nodeid, dh.fh).unwrap();

    d.rename(dir.nodeid, "f", ROOT, "g").unwrap();
    assert_eq!(d.lookup(ROOT, "g").unwrap().nodeid, file.nodeid);
    let e = d.lookup(dir.nodeid, "f").unwrap_err();
    assert_eq!(e.fuse_errno(), Some(libc::ENOENT), "errors come back later too: {e}");
    let e = d.unlink(dir.nodeid, "missing").unwrap_err();
    assert_eq!(e.fuse_errno(), Some(libc::ENOENT));
    let e = d.rmdir(ROOT, "dir").unwrap_err();
    assert_eq!(e.fuse_errno(), Some(libc::ENOTEMPTY));
    d.unlink(dir.nodeid, "link").unwrap();
    d.rmdir(ROOT, "dir").unwrap();
    d.flush(file.nodeid, open.fh).unwrap();
    d.release(file.nodeid, open.fh).unwrap();
    d.unlink(ROOT, "g").unwrap();
    assert_eq!(d.lookup(ROOT, "g").unwrap_err().fuse_errno(), Some(libc::ENOENT));

    let c = s.counters();
    let started = c.started.load(Ordering::Relaxed);
    assert!(started >= 25, "every filesystem request went through the engine: {started}");
    assert_eq!(c.completed.load(Ordering::Relaxed), started);
    assert_eq!(s.handler.pending_requests(), started, "all of them pending first");
    d.shutdown().unwrap();
}

#[test]
fn requests_in_flight_together_complete_in_reverse_order() {
    let s = Setup::new();
    let data: Vec<u8> = (0..8192).map(|j| (j / 1024) as u8).collect();
    let (mut d, node, fh) = s.with_file(&data);
    // Hold completions so that several requests are pending at once, then let them go together.
    s.counters().hold.store(true, Ordering::Release);
    let tokens: Vec<u64> = (0..4).map(|i| submit_read(&mut d, node, fh, i * 1024)).collect();
    std::thread::sleep(Duration::from_millis(50));
    assert!(d.poll_completions().unwrap().is_empty(), "held: nothing completes");
    s.counters().hold.store(false, Ordering::Release);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < tokens.len() {
        got.extend(d.poll_completions().unwrap());
        assert!(Instant::now() < deadline, "completions never came");
    }
    let order: Vec<u64> = got.iter().map(|c| c.token).collect();
    assert_eq!(order, tokens.iter().rev().copied().collect::<Vec<_>>(), "the engine answers the last first");
    for c in &got {
        let (h, body) = FsDriver::parse_reply(c, opcode::READ, c.token).unwrap();
        let i = tokens.iter().position(|&t| t == c.token).unwrap();
        assert_eq!(h.error, 0);
        assert_eq!(body, &data[i * 1024..i * 1024 + 4096], "read {i} went into its own buffers");
    }
    d.shutdown().unwrap();
}

#[test]
fn a_queue_stop_drains_pending_requests() {
    let s = Setup::new();
    let (mut d, node, fh) = s.with_file(&[1u8; 4096]);
    let c = s.counters();
    c.hold.store(true, Ordering::Release);
    let token = submit_read(&mut d, node, fh, 0);
    std::thread::sleep(Duration::from_millis(100));
    assert!(d.try_take(token).unwrap().is_none(), "the READ is pending");
    let completed = c.completed.load(Ordering::Relaxed);
    // The reset (queues stop) and the DMA_UNMAP that follows must wait until the engine lets
    // the READ go.
    let handler = s.handler.clone();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        handler.server().filesystem().counters.hold.store(false, Ordering::Release);
        Instant::now()
    });
    d.shutdown().unwrap();
    let stopped = Instant::now();
    let released = release.join().unwrap();
    assert!(stopped >= released, "the queue stop waited for the pending READ");
    assert_eq!(c.completed.load(Ordering::Relaxed), completed + 1, "the READ completed before the stop");
}

/// Not a test of the seam: the wrapper's synchronous methods really are unimplemented, so the
/// tests above prove every request went through the engine.
#[test]
fn the_wrapper_has_no_synchronous_data_path() {
    let fs = LaterFs { ram: RamFs::new(), counters: Arc::default() };
    let ctx = Context::default();
    assert_eq!(fs.lookup(&ctx, ROOT, b"x"), Err(filesystem::Error::NotImplemented));
    let mut buf = [0u8; 8];
    let bufs = [VolatileSlice::from(&mut buf[..])];
    let mut w = virtiofs_backend::io::Writer::new(&bufs);
    assert_eq!(
        fs.read(&ctx, ROOT, &ReadArgs { fh: 0, offset: 0, size: 8 }, &mut w),
        Err(filesystem::Error::NotImplemented)
    );
}
