//! virtiofs-dpu: wires the device (vfio-user server, PCI function, pollers) to a FUSE backend.
//!
//! The device crate knows nothing of FUSE and the backend knows nothing of PCI or vfio-user; this
//! crate is the seam: [`FuseHandler`] adapts a backend [`Server`] to the device's
//! [`RequestHandler`], and [`RunningDevice`] runs a device on a socket in a thread of its own (for
//! the daemon, the tests and the benchmarks), serving a RAM filesystem ([`RunningDevice::start`])
//! or a host directory ([`RunningDevice::start_passthrough`]).
#![deny(missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use virtiofs_backend::filesystem::FileSystem;
use virtiofs_backend::passthrough::uring::{IoMode, Submitted, UringEngine};
use virtiofs_backend::passthrough::{PassthroughConfig, SetupError};
use virtiofs_backend::server::{LockStats, Served};
use virtiofs_backend::waits::LockWaits;
use virtiofs_backend::{PassthroughFs, RamFs, Server};
use virtiofs_device::config::Profile;
use virtiofs_device::poller::{Engine, Outcome, RequestHandler};
use virtiofs_device::stats::DeviceStats;
use virtiofs_device::vfio_user::{self, ServerError, StopHandle};
use vm_memory::VolatileSlice;

pub use virtiofs_device::config;

/// Serves virtio-fs requests with a FUSE server over filesystem `F`. Each poller gets an engine
/// ([`FuseEngine`]) that serves requests at once and keeps the SETLKW requests that must wait for
/// a lock, so the server offers `POSIX_LOCKS` and `FLOCK_LOCKS`.
pub struct FuseHandler<F: FileSystem> {
    server: Arc<Server<F>>,
    /// Pollers get engines (and SETLKW can wait).
    engines: bool,
}

impl<F: FileSystem> FuseHandler<F> {
    /// A handler serving `fs`.
    pub fn new(fs: F) -> Self {
        FuseHandler { server: Arc::new(Server::with_lock_waits(fs)), engines: true }
    }

    /// A handler serving `fs` through [`RequestHandler::handle`] alone, without engines (for
    /// wrappers that intercept `handle`): nothing can wait, so the server does not offer
    /// `POSIX_LOCKS` or `FLOCK_LOCKS` and the guest kernel keeps its locks itself.
    pub fn synchronous(fs: F) -> Self {
        FuseHandler { server: Arc::new(Server::new(fs)), engines: false }
    }

    /// The FUSE server.
    pub fn server(&self) -> &Arc<Server<F>> {
        &self.server
    }
}

impl<F: FileSystem + 'static> RequestHandler for FuseHandler<F> {
    fn handle(&self, _queue: u16, readable: &[VolatileSlice<'_>], writable: &[VolatileSlice<'_>]) -> u32 {
        u32::try_from(self.server.handle(readable, writable)).unwrap_or(0)
    }

    fn engine(&self, _poller: usize) -> Option<Box<dyn Engine>> {
        self.engines.then(|| Box::new(FuseEngine::new(self.server.clone())) as Box<dyn Engine>)
    }

    fn reset(&self) {
        self.server.reset();
    }
}

impl<F: FileSystem> Drop for FuseHandler<F> {
    fn drop(&mut self) {
        log_lock_stats(self.server.lock_stats());
    }
}

fn log_lock_stats(s: LockStats) {
    if s != LockStats::default() {
        log::info!(
            "lock requests: getlk={} setlk={} setlkw={} waited={} interrupted={} deadlocks={}",
            s.getlk,
            s.setlk,
            s.setlkw,
            s.waited,
            s.interrupted,
            s.deadlocks
        );
    }
}

/// A poller's engine for a [`FuseHandler`]: every request is served at once through
/// [`Server::serve`], except a SETLKW that has to wait, which is parked ([`Outcome::Wait`]) and
/// answered from [`Engine::poll_waits`] once its lock is granted (or it is interrupted).
pub struct FuseEngine<F: FileSystem> {
    waits: LockWaits<F>,
}

impl<F: FileSystem> FuseEngine<F> {
    /// An engine for requests to `server`.
    pub fn new(server: Arc<Server<F>>) -> Self {
        FuseEngine { waits: LockWaits::new(server) }
    }
}

impl<F: FileSystem + 'static> Engine for FuseEngine<F> {
    fn submit(
        &mut self,
        id: u64,
        _queue: u16,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> Outcome {
        match self.waits.server().serve(readable, writable) {
            Served::Replied(n) => Outcome::Done(u32::try_from(n).unwrap_or(0)),
            Served::Wait(wait) => {
                self.waits.park(id, wait);
                Outcome::Wait
            }
        }
    }

    fn poll(&mut self, _done: &mut dyn FnMut(u64, u32)) -> usize {
        0
    }

    fn in_flight(&self) -> usize {
        0
    }

    fn poll_waits(&mut self, answer: &mut dyn FnMut(u64, &[u8])) -> usize {
        self.waits.poll(answer)
    }

    fn cancel_waits(&mut self) {
        self.waits.cancel_all();
    }
}

/// Serves virtio-fs requests from a host directory: a FUSE server over a [`PassthroughFs`],
/// with (unless [`IoMode::Sync`]) an engine per poller for READ, WRITE and FSYNC ([`UringEngine`]:
/// zero-copy between the host file and the guest buffers, inline when that cannot block, else on
/// an io_uring owned by the poller, whose completions it polls on its own core). Either way each
/// poller's engine keeps the SETLKW requests that must wait, as [`FuseEngine`] does.
pub struct PassthroughHandler {
    server: Arc<Server<PassthroughFs>>,
    mode: IoMode,
    /// Requests served on a ring, all pollers together.
    ring_requests: Arc<AtomicU64>,
}

impl PassthroughHandler {
    /// Ring entries per poller by default.
    pub const RING_ENTRIES: u32 = 256;

    /// A handler serving `fs`, its data path as `mode` says.
    pub fn new(fs: PassthroughFs, mode: IoMode) -> Self {
        PassthroughHandler {
            server: Arc::new(Server::with_lock_waits(fs)),
            mode,
            ring_requests: Arc::default(),
        }
    }

    /// Requests left pending on a ring so far, all pollers together.
    pub fn ring_requests(&self) -> u64 {
        self.ring_requests.load(Ordering::Relaxed)
    }

    /// The FUSE server.
    pub fn server(&self) -> &Arc<Server<PassthroughFs>> {
        &self.server
    }
}

impl RequestHandler for PassthroughHandler {
    fn handle(&self, _queue: u16, readable: &[VolatileSlice<'_>], writable: &[VolatileSlice<'_>]) -> u32 {
        u32::try_from(self.server.handle(readable, writable)).unwrap_or(0)
    }

    fn engine(&self, poller: usize) -> Option<Box<dyn Engine>> {
        if self.mode == IoMode::Sync {
            return Some(Box::new(FuseEngine::new(self.server.clone())));
        }
        match UringEngine::new(self.server.clone(), Self::RING_ENTRIES, self.mode) {
            Ok(ring) => Some(Box::new(UringAdapter {
                ring,
                waits: LockWaits::new(self.server.clone()),
                ring_requests: self.ring_requests.clone(),
            })),
            Err(e) => {
                log::warn!("poller {poller}: no io_uring ({e}); serving I/O synchronously");
                Some(Box::new(FuseEngine::new(self.server.clone())))
            }
        }
    }

    fn reset(&self) {
        self.server.reset();
    }
}

impl Drop for PassthroughHandler {
    fn drop(&mut self) {
        log_lock_stats(self.server.lock_stats());
    }
}

/// The device's [`Engine`] face of a [`UringEngine`], plus the poller's waiting SETLKW requests.
struct UringAdapter {
    ring: UringEngine,
    waits: LockWaits<PassthroughFs>,
    /// Requests left pending on a ring, all pollers together.
    ring_requests: Arc<AtomicU64>,
}

impl Engine for UringAdapter {
    fn submit(
        &mut self,
        id: u64,
        _queue: u16,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> Outcome {
        match self.ring.submit(id, readable, writable) {
            Submitted::Done(n) => Outcome::Done(n),
            Submitted::Pending => {
                self.ring_requests.fetch_add(1, Ordering::Relaxed);
                Outcome::Pending
            }
            Submitted::Wait(wait) => {
                self.waits.park(id, wait);
                Outcome::Wait
            }
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, u32)) -> usize {
        self.ring.poll(done)
    }

    fn in_flight(&self) -> usize {
        self.ring.in_flight()
    }

    fn poll_waits(&mut self, answer: &mut dyn FnMut(u64, &[u8])) -> usize {
        self.waits.poll(answer)
    }

    fn cancel_waits(&mut self) {
        self.waits.cancel_all();
    }
}

impl Drop for UringAdapter {
    fn drop(&mut self) {
        let s = self.ring.stats();
        log::debug!(
            "io_uring engine: {} requests inline, {} on the ring, {} synchronous, {} resubmits",
            s.inline_requests,
            s.async_requests,
            s.sync_requests,
            s.resubmits
        );
    }
}

/// Why a device could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The shared directory could not be served.
    #[error("passthrough filesystem")]
    Passthrough(#[from] SetupError),
    /// The device could not start.
    #[error("device")]
    Device(#[from] ServerError),
}

/// A device serving one socket from a thread of its own.
pub struct RunningDevice {
    socket: PathBuf,
    stop: StopHandle,
    join: Option<JoinHandle<Result<DeviceStats, ServerError>>>,
}

impl RunningDevice {
    /// Starts a device with an empty RAM filesystem on `socket` (listening when this returns).
    pub fn start(socket: &Path, profile: Profile) -> Result<Self, ServerError> {
        Self::start_with(socket, profile, Arc::new(FuseHandler::new(RamFs::new())))
    }

    /// Starts a device serving the host directory `cfg.root` (see
    /// [`virtiofs_backend::passthrough`] for how it stays confined beneath it).
    pub fn start_passthrough(
        socket: &Path,
        profile: Profile,
        cfg: PassthroughConfig,
    ) -> Result<Self, StartError> {
        let fs = PassthroughFs::new(cfg)?;
        Ok(Self::start_with(socket, profile, Arc::new(FuseHandler::new(fs)))?)
    }

    /// Starts a device whose requests go to `handler`.
    pub fn start_with(
        socket: &Path,
        profile: Profile,
        handler: Arc<dyn RequestHandler>,
    ) -> Result<Self, ServerError> {
        Self::start_on(vfio_user::Listener::bind(socket)?, profile, handler)
    }

    /// Starts a device on a socket bound earlier (see [`vfio_user::Listener`]): its threads start
    /// here, not before.
    pub fn start_on(
        listener: vfio_user::Listener,
        profile: Profile,
        handler: Arc<dyn RequestHandler>,
    ) -> Result<Self, ServerError> {
        let socket = listener.path().to_path_buf();
        let server = vfio_user::Server::new(listener, &profile, handler)?;
        let stop = server.stop_handle();
        let join = std::thread::Builder::new()
            .name("vfio-user".into())
            .spawn(move || server.run())
            .map_err(ServerError::Setup)?;
        Ok(RunningDevice { socket, stop, join: Some(join) })
    }

    /// The socket the device listens on.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// A snapshot of the device's statistics (per queue, index 0 = hiprio, and per poller).
    pub fn stats(&self) -> DeviceStats {
        self.stop.stats()
    }

    /// A handle that stops the device from elsewhere.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Stops the device and waits for it; returns its final statistics.
    pub fn stop(mut self) -> Result<DeviceStats, ServerError> {
        self.stop.stop();
        match self.join.take().map(|j| j.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(ServerError::Setup(std::io::Error::other("device thread panicked"))),
            None => Ok(self.stop.stats()),
        }
    }
}

impl Drop for RunningDevice {
    fn drop(&mut self) {
        if let Some(j) = self.join.take() {
            self.stop.stop();
            let _ = j.join();
        }
    }
}
