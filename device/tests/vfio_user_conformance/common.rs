//! What every conformance test shares: the device's server on a temporary socket with a request
//! handler of the test's own, and the driver model's client on it ([`Conn`] for single messages,
//! [`Dev::driver`] for a brought-up virtio-fs function with virtqueues).

use std::borrow::Borrow;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vfio_bindings::bindings::vfio as vb;
use virtiofs_device::config::{Doorbells, Profile};
use virtiofs_device::poller::{Engine, Outcome, RequestHandler, Taken};
use virtiofs_device::stats::Tally;
use virtiofs_device::vfio_user::{Server, StopHandle};
use virtiofs_tools::driver::{DriverOptions, FsDriver};
use virtiofs_tools::memory::GuestRam;
use virtiofs_tools::vfio_user::{
    command as cmd, flags, Client, ClientCaps, DmaMap, DmaUnmap, IrqSet, RegionAccess, Reply, VersionInfo,
};
use vm_memory::VolatileSlice;

/// How long a test waits for the server before it fails.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Answers every request by writing 4 bytes "done"; optionally blocks until released.
pub struct TestHandler {
    pub calls: AtomicUsize,
    pub gate: Mutex<Option<(Sender<()>, Receiver<()>)>>,
    /// When set, requests go through a [`HeldEngine`] that completes them only once released.
    pub engine_release: Option<Arc<AtomicBool>>,
    pub engine_submitted: Arc<AtomicUsize>,
    /// The next request makes the handler panic.
    pub panic_next: AtomicBool,
    /// When set, requests go through a [`WaitEngine`] that answers them only once released.
    pub wait_release: Option<Arc<AtomicBool>>,
    /// `Engine::cancel_waits` calls.
    pub cancelled: Arc<AtomicUsize>,
    /// `RequestHandler::reset` calls.
    pub resets: AtomicUsize,
}

/// An engine whose requests all wait for an outside event ([`Outcome::Wait`]): it keeps only
/// their ids and answers "wait" once the test releases them.
struct WaitEngine {
    waiting: Vec<u64>,
    release: Arc<AtomicBool>,
    submitted: Arc<AtomicUsize>,
    cancelled: Arc<AtomicUsize>,
}

impl Engine for WaitEngine {
    fn submit(
        &mut self,
        id: u64,
        _q: Taken,
        _r: &[VolatileSlice<'_>],
        _w: &[VolatileSlice<'_>],
    ) -> (Outcome, Tally) {
        self.waiting.push(id);
        self.submitted.fetch_add(1, Ordering::SeqCst);
        (Outcome::Wait, Tally::default())
    }
    fn poll(&mut self, _done: &mut dyn FnMut(u64, u32, Tally)) -> usize {
        0
    }
    fn in_flight(&self) -> usize {
        0
    }
    fn poll_waits(&mut self, answer: &mut dyn FnMut(u64, &[u8], Tally)) -> usize {
        if !self.release.load(Ordering::SeqCst) {
            return 0;
        }
        let n = self.waiting.len();
        for id in self.waiting.drain(..) {
            answer(id, b"wait", Tally::default());
        }
        n
    }
    fn cancel_waits(&mut self) {
        if !self.waiting.is_empty() {
            self.cancelled.fetch_add(self.waiting.len(), Ordering::SeqCst);
        }
        self.waiting.clear();
    }
}

/// An asynchronous engine that writes its reply at once but reports completion only after the
/// test releases it.
struct HeldEngine {
    pending: Vec<(u64, u32)>,
    release: Arc<AtomicBool>,
    submitted: Arc<AtomicUsize>,
}

impl Engine for HeldEngine {
    fn submit(
        &mut self,
        id: u64,
        _q: Taken,
        _r: &[VolatileSlice<'_>],
        w: &[VolatileSlice<'_>],
    ) -> (Outcome, Tally) {
        w[0].copy_from(b"asyn");
        self.pending.push((id, 4));
        self.submitted.fetch_add(1, Ordering::SeqCst);
        (Outcome::Pending, Tally::default())
    }
    fn poll(&mut self, done: &mut dyn FnMut(u64, u32, Tally)) -> usize {
        if !self.release.load(Ordering::SeqCst) {
            return 0;
        }
        let n = self.pending.len();
        for (id, len) in self.pending.drain(..) {
            done(id, len, Tally::default());
        }
        n
    }
    fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

impl RequestHandler for TestHandler {
    fn handle(
        &self,
        _q: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.panic_next.swap(false, Ordering::SeqCst) {
            panic!("injected handler bug");
        }
        if let Some((entered, release)) = &*self.gate.lock().unwrap() {
            entered.send(()).unwrap();
            let _ = release.recv_timeout(Duration::from_secs(10));
        }
        let _ = readable;
        let len = match writable.first() {
            Some(w) if w.len() >= 4 => {
                w.copy_from(b"done");
                4
            }
            _ => 0,
        };
        (len, Tally::default())
    }

    fn engine(&self, _poller: usize) -> Option<Box<dyn Engine>> {
        if let Some(release) = self.wait_release.clone() {
            return Some(Box::new(WaitEngine {
                waiting: Vec::new(),
                release,
                submitted: self.engine_submitted.clone(),
                cancelled: self.cancelled.clone(),
            }));
        }
        let release = self.engine_release.clone()?;
        Some(Box::new(HeldEngine { pending: Vec::new(), release, submitted: self.engine_submitted.clone() }))
    }

    fn reset(&self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
    }
}

/// A running server and its handler.
pub struct Dev {
    dir: tempfile::TempDir,
    stop: StopHandle,
    join: Option<JoinHandle<()>>,
    pub handler: Arc<TestHandler>,
}

impl Dev {
    /// Two request queues of 16 entries, doorbells in a shared (mmappable) area, no engine.
    pub fn start() -> Dev {
        Dev::start_with(None)
    }
    /// With a [`HeldEngine`] released by `engine_release`.
    pub fn start_with(engine_release: Option<Arc<AtomicBool>>) -> Dev {
        Dev::start_engines(engine_release, None)
    }
    /// With a [`HeldEngine`] or a [`WaitEngine`].
    pub fn start_engines(
        engine_release: Option<Arc<AtomicBool>>,
        wait_release: Option<Arc<AtomicBool>>,
    ) -> Dev {
        let profile =
            Profile { request_queues: 2, queue_size: 16, doorbells: Doorbells::Shared, ..Profile::default() };
        Dev::start_profile(engine_release, wait_release, profile)
    }
    /// With any profile.
    pub fn start_profile(
        engine_release: Option<Arc<AtomicBool>>,
        wait_release: Option<Arc<AtomicBool>>,
        profile: Profile,
    ) -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let handler = Arc::new(TestHandler {
            calls: AtomicUsize::new(0),
            gate: Mutex::new(None),
            engine_release,
            engine_submitted: Arc::new(AtomicUsize::new(0)),
            panic_next: AtomicBool::new(false),
            wait_release,
            cancelled: Arc::new(AtomicUsize::new(0)),
            resets: AtomicUsize::new(0),
        });
        let server = Server::bind(&dir.path().join("dev.sock"), &profile, handler.clone()).unwrap();
        let stop = server.stop_handle();
        let join = std::thread::spawn(move || {
            server.run().unwrap();
        });
        Dev { dir, stop, join: Some(join), handler }
    }
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("dev.sock")
    }
    /// The running server's handle.
    pub fn stop_handle(&self) -> &StopHandle {
        &self.stop
    }
    /// The socket's directory, kept beyond the server (a server that took the socket over
    /// still has its file there).
    pub fn take_dir(&mut self) -> tempfile::TempDir {
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
    }
    /// A connection that has not sent VERSION yet.
    pub fn connect(&self) -> Conn {
        let mut client = Client::connect(&self.path()).unwrap();
        client.set_timeout(TIMEOUT).unwrap();
        Conn { client }
    }
    /// A connection after VERSION.
    pub fn client(&self) -> Conn {
        let mut c = self.connect();
        c.version();
        c
    }
    /// The driver model's virtio-fs driver, brought up to DRIVER_OK on request queue 1 (no FUSE:
    /// the handler answers raw chains), polling the used rings.
    pub fn driver(&self) -> FsDriver {
        self.driver_with(DriverOptions::default())
    }
    /// [`Dev::driver`] with `opts`' interrupt and doorbell choices.
    pub fn driver_with(&self, opts: DriverOptions) -> FsDriver {
        let opts =
            DriverOptions { queue_size: 16, request_queues: 1, mem_size: 2 << 20, timeout: TIMEOUT, ..opts };
        FsDriver::connect(&self.path(), opts).unwrap()
    }
    /// Waits until the engine has been handed `n` requests, and a little more, so that a wrong
    /// early completion would have happened.
    pub fn wait_engine_submitted(&self, n: usize) {
        let deadline = Instant::now() + TIMEOUT;
        while self.handler.engine_submitted.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < deadline, "request {n} never reached the engine");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(j) = self.join.take() {
            j.join().unwrap();
        }
    }
}

/// The errno of a reply (0 for success), checking that it is a reply and that an error reply
/// carries an errno. (The driver model's client has already checked id, command, flags and
/// that an error reply has no payload.)
pub fn errno(r: impl Borrow<Reply>) -> i32 {
    let r = r.borrow();
    assert_eq!(r.header.msg_type(), flags::TYPE_REPLY);
    if r.header.is_error() {
        assert_ne!(r.header.error, 0, "error replies must carry an errno");
    }
    r.errno()
}

/// `reply.ok()`: the reply, which must not be an error.
pub trait ReplyOk {
    fn ok(self) -> Reply;
}

impl ReplyOk for Reply {
    fn ok(self) -> Reply {
        assert_eq!(errno(&self), 0, "unexpected error reply {:?}", self.header);
        self
    }
}

/// A vfio-user connection through the driver model's client: raw calls that return whatever the
/// server answered, for the conformance checks.
pub struct Conn {
    pub client: Client,
}

impl Conn {
    /// Sends `command` with `payload` and `fds`; returns the reply, error or not.
    pub fn call_fds(&mut self, command: u16, payload: &[u8], fds: &[RawFd]) -> Reply {
        self.client.call_raw(command, payload, fds).unwrap()
    }
    pub fn call(&mut self, command: u16, payload: &[u8]) -> Reply {
        self.call_fds(command, payload, &[])
    }
    /// Sends a command without waiting for its reply; returns its message id.
    pub fn send(&mut self, command: u16, extra_flags: u32, payload: &[u8], fds: &[RawFd]) -> u16 {
        self.client.send_command(command, extra_flags, payload, fds).unwrap()
    }
    /// Sends raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.client.send_raw(bytes, &[]).unwrap();
    }
    /// The next message.
    pub fn recv(&mut self) -> Reply {
        self.client.recv_message().unwrap()
    }
    /// VERSION 0.1 proposing 16 fds, 1 MiB transfers and 4 KiB pages, through the client's typed
    /// call (which checks the reply: version, NUL-terminated JSON, capability types, pgsizes).
    pub fn version(&mut self) -> VersionInfo {
        let caps = ClientCaps { max_msg_fds: 16, max_data_xfer_size: 1 << 20, pgsizes: 4096 };
        self.client.version(&caps).unwrap()
    }
    /// A valid request that must always work: DEVICE_GET_INFO (typed: the reply's size is
    /// checked too).
    pub fn still_serves(&mut self) {
        let info = self.client.device_info().unwrap();
        assert_eq!(info.num_regions, vb::VFIO_PCI_NUM_REGIONS);
    }
    pub fn region_read(&mut self, region: u32, offset: u64, count: u32) -> Reply {
        self.call(cmd::REGION_READ, &RegionAccess { offset, region, count }.to_bytes())
    }
    /// A 32-bit register through the client's typed REGION_READ (which checks the echo).
    pub fn read32(&mut self, region: u32, offset: u64) -> u32 {
        self.client.read_le(region, offset, 4).unwrap() as u32
    }
    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Reply {
        let mut p = RegionAccess { offset, region, count: data.len() as u32 }.to_bytes();
        p.extend_from_slice(data);
        self.call(cmd::REGION_WRITE, &p)
    }
    pub fn dma_map(&mut self, address: u64, size: u64, file: Option<&File>) -> Reply {
        let m = DmaMap { argsz: 32, flags: 3, offset: 0, address, size };
        let fds: Vec<RawFd> = file.iter().map(|f| f.as_raw_fd()).collect();
        self.call_fds(cmd::DMA_MAP, &m.to_bytes(), &fds)
    }
    pub fn dma_unmap(&mut self, address: u64, size: u64, flags: u32) -> Reply {
        self.call(cmd::DMA_UNMAP, &DmaUnmap { argsz: 24, flags, address, size }.to_bytes())
    }
    pub fn set_irqs(&mut self, flags: u32, start: u32, count: u32, data: &[u8], fds: &[RawFd]) -> Reply {
        let mut p = IrqSet {
            argsz: (20 + data.len()) as u32,
            flags,
            index: vb::VFIO_PCI_MSIX_IRQ_INDEX,
            start,
            count,
        }
        .to_bytes();
        p.extend_from_slice(data);
        self.call_fds(cmd::DEVICE_SET_IRQS, &p, fds)
    }
}

/// A memfd of `size` bytes to share by DMA_MAP (the driver model's guest RAM).
pub fn memfd(size: usize) -> File {
    GuestRam::new(size, 0).unwrap().file().try_clone().unwrap()
}

/// Deterministic pseudo-random bytes (xorshift), so a failure replays.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
