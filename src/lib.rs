//! virtiofs-dpu: wires the device (vfio-user server, PCI function, pollers) to a FUSE backend.
//!
//! The device crate knows nothing of FUSE and the backend knows nothing of PCI or vfio-user; this
//! crate is the seam: [`FuseHandler`] adapts a backend [`Server`] over any filesystem to the
//! device's [`RequestHandler`] (and each poller's [`FuseEngine`] to its `Engine`), and
//! [`RunningDevice`] runs a device on a socket in a thread of its own (the daemon's functions on
//! its shared pollers, [`RunningDevice::start_on_pool`]; one device alone for the tests and the
//! benchmarks, [`RunningDevice::start_with`]).
//!
//! The daemon: [`settings`] reads the command line, the profile and `create_function` into one
//! typed [`settings::DaemonSpec`]; [`daemon`] is its one start-up path; [`backends`] sets up a
//! function's backend; [`functions`] keeps the functions of one daemon on one pool of pollers;
//! [`ops`] operates it (control socket, reports, logger, supervisor).
#![deny(missing_docs)]

pub mod backends;
pub mod daemon;
pub mod functions;
pub mod ops;
pub mod settings;
pub mod sys;
pub mod tally;
pub mod update;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use virtiofs_backend::filesystem::FileSystem;
use virtiofs_backend::nfs::fs::NfsStats;
use virtiofs_backend::passthrough::uring::EngineStats;
use virtiofs_backend::server::{LockStats, PollerEngine, ReplayStats, ServerOptions, Submitted};
use virtiofs_backend::Server;
use virtiofs_device::config::{Placement, Profile};
use virtiofs_device::poller::{Engine, Outcome, PollerPool, RequestHandler, Taken};
use virtiofs_device::stats::{DeviceStats, OpClass, Tally};
use virtiofs_device::vfio_user::{self, ServerError, StopHandle};
use vm_memory::VolatileSlice;

pub use virtiofs_device::config;

/// The FUSE side's statistics, as data (the daemon writes them beside the device's).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FuseStats {
    /// Lock requests the server saw (GETLK, SETLK, SETLKW, how many waited, ...).
    pub locks: LockStats,
    /// Requests left pending on a filesystem's per-poller engine, all pollers together.
    pub pending_requests: u64,
    /// The passthrough's io_uring engines, added up (`None` for other backends).
    pub io: Option<EngineStats>,
    /// The NFS backend: requests, calls, retransmits, reconnects, timeouts (`None` for other
    /// backends).
    #[serde(default)]
    pub nfs: Option<NfsStats>,
    /// The `FUSE_INIT` flags of the current session (what the server answered; 0 before the
    /// guest's INIT), e.g. whether `WRITEBACK_CACHE` (bit 16) is in force.
    #[serde(default)]
    pub init_flags: u64,
    /// Requests executed again after a crash (taken again from the in-flight record), and
    /// what the server made of them (DESIGN.md, "Executing again").
    #[serde(default)]
    pub replayed: ReplayStats,
}

/// Serves virtio-fs requests with a FUSE server over filesystem `F`. Each poller gets an engine
/// ([`FuseEngine`]) that hands requests to the filesystem's own engine for that poller when it
/// has one (the asynchronous filesystem seam, `virtiofs_backend::filesystem::seam`: the passthrough's
/// io_uring), serves the others at once, and keeps the SETLKW requests that must wait for a
/// lock, so the server offers `POSIX_LOCKS` and `FLOCK_LOCKS`.
pub struct FuseHandler<F: FileSystem> {
    server: Arc<Server<F>>,
    /// Pollers get engines (and SETLKW can wait).
    engines: bool,
    /// Requests left pending on a filesystem engine: one counter per poller's engine, each on a
    /// cache line of its own and written only by that poller (registered when the engine is
    /// made, on the control path), added up when read.
    pending: Arc<Mutex<Vec<Arc<PendingCount>>>>,
}

/// A per-poller count with one writer, alone on its cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct PendingCount(AtomicU64);

impl PendingCount {
    /// Counts one more: a plain load and store (the engine's poller is the only writer).
    fn bump(&self) {
        self.0.store(self.0.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

impl<F: FileSystem> FuseHandler<F> {
    /// A handler serving `fs`.
    pub fn new(fs: F) -> Self {
        Self::with_options(fs, ServerOptions::default())
    }

    /// A handler serving `fs`, offering what `options` allow (`--no-xattr`, `--no-readdirplus`).
    pub fn with_options(fs: F, options: ServerOptions) -> Self {
        let server = Server::with_lock_waits(fs).with_options(options);
        FuseHandler { server: Arc::new(server), engines: true, pending: Arc::default() }
    }

    /// A handler serving `fs` through [`RequestHandler::handle`] alone, without engines (for
    /// wrappers that intercept `handle`): nothing can wait, so the server does not offer
    /// `POSIX_LOCKS` or `FLOCK_LOCKS` and the guest kernel keeps its locks itself, and the
    /// filesystem's own engines are not used.
    pub fn synchronous(fs: F) -> Self {
        FuseHandler { server: Arc::new(Server::new(fs)), engines: false, pending: Arc::default() }
    }

    /// The FUSE server.
    pub fn server(&self) -> &Arc<Server<F>> {
        &self.server
    }

    /// Requests left pending on a filesystem's engine so far, all pollers together.
    pub fn pending_requests(&self) -> u64 {
        let counts = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        counts.iter().map(|c| c.0.load(Ordering::Relaxed)).sum()
    }

    /// The FUSE side's statistics now.
    pub fn stats(&self) -> FuseStats {
        FuseStats {
            locks: self.server.lock_stats(),
            pending_requests: self.pending_requests(),
            io: None,
            nfs: None,
            init_flags: self.server.negotiated(),
            replayed: self.server.replay_stats(),
        }
    }
}

impl<F: FileSystem + 'static> RequestHandler for FuseHandler<F> {
    fn handle(
        &self,
        taken: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally) {
        // Only without pollers' engines ([`FuseHandler::synchronous`]): the one pipeline, on an
        // engine of this call's own that serves at once and parks nothing.
        let class = tally::request_class(readable);
        let mut engine = PollerEngine::synchronous(self.server.clone());
        let len = match engine.submit_as(0, taken.replayed, readable, writable) {
            Submitted::Done(len) => len,
            Submitted::Pending | Submitted::Wait(_) => 0,
        };
        (len, tally::reply_tally(class, writable, len))
    }

    fn engine(&self, poller: usize) -> Option<Box<dyn Engine>> {
        self.engines.then(|| {
            let pending = Arc::new(PendingCount::default());
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(pending.clone());
            let engine = FuseEngine { inner: PollerEngine::for_poller(self.server.clone(), poller), pending };
            Box::new(engine) as Box<dyn Engine>
        })
    }

    fn before_publish(&self) {
        self.server.before_publish();
    }

    fn publish_due(&self) -> bool {
        self.server.publish_due()
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

/// A poller's engine for a [`FuseHandler`]: the device's [`Engine`] face of the backend's
/// [`PollerEngine`]. Requests are served at once, or left pending on the filesystem's engine
/// ([`Outcome::Pending`], reported from [`Engine::poll`]), or, for a SETLKW that has to wait,
/// parked ([`Outcome::Wait`]) and answered from [`Engine::poll_waits`] once its lock is granted
/// (or it is interrupted).
pub struct FuseEngine<F: FileSystem> {
    inner: PollerEngine<F>,
    pending: Arc<PendingCount>,
}

impl<F: FileSystem> FuseEngine<F> {
    /// The engine of poller `poller` for requests to `server` (call it on that poller's thread).
    pub fn new(server: Arc<Server<F>>, poller: usize) -> Self {
        FuseEngine { inner: PollerEngine::for_poller(server, poller), pending: Arc::default() }
    }
}

impl<F: FileSystem + 'static> Engine for FuseEngine<F> {
    fn submit(
        &mut self,
        id: u64,
        taken: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (Outcome, Tally) {
        let class = tally::request_class(readable);
        match self.inner.submit_as(id, taken.replayed, readable, writable) {
            Submitted::Done(len) => (Outcome::Done(len), tally::reply_tally(class, writable, len)),
            Submitted::Pending => {
                self.pending.bump();
                (Outcome::Pending, Tally { class, ..Tally::default() })
            }
            Submitted::Wait(_) => (Outcome::Wait, Tally { class, ..Tally::default() }),
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, u32, Tally)) -> usize {
        self.inner.poll(&mut |id, len, status| done(id, len, tally::status_tally(status)))
    }

    fn poll_waits(&mut self, answer: &mut dyn FnMut(u64, &[u8], Tally)) -> usize {
        self.inner.poll_waits(&mut |id, reply| {
            let len = u32::try_from(reply.len()).unwrap_or(u32::MAX);
            answer(id, reply, tally::reply_bytes(OpClass::Other, reply, len))
        })
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    fn cancel_waits(&mut self) {
        self.inner.cancel_waits();
    }

    fn wait_tokens(&self) -> Vec<(u64, u64)> {
        self.inner.wait_tokens()
    }

    fn adopt_wait(&mut self, id: u64, token: u64) -> bool {
        self.inner.adopt_wait(id, token)
    }

    fn readiness(&self) -> Option<virtiofs_device::poller::Readiness<'_>> {
        self.inner.readiness()
    }
}

/// A device serving one socket from a thread of its own.
pub struct RunningDevice {
    socket: PathBuf,
    stop: StopHandle,
    join: Option<JoinHandle<Result<DeviceStats, ServerError>>>,
}

impl RunningDevice {
    /// Starts a device on `socket` (listening when this returns) whose requests go to
    /// `handler`, on a pool of pollers of its own as `profile` places them: one device alone,
    /// for the tests and the benchmarks. The daemon's functions start with
    /// [`Self::start_on_pool`].
    pub fn start_with(
        socket: &Path,
        profile: Profile,
        handler: Arc<dyn RequestHandler>,
    ) -> Result<Self, ServerError> {
        let pool = PollerPool::spawn(&profile).map_err(ServerError::Setup)?;
        let placement = Placement::of_profile(&profile);
        Self::start_on_pool(vfio_user::Listener::bind(socket)?, profile, handler, &pool, placement)
    }

    /// Starts a device on a socket bound earlier whose queues are served by the shared
    /// pollers of `pool`, placed as `placement` says (its control plane is a thread of its own).
    pub fn start_on_pool(
        listener: vfio_user::Listener,
        profile: Profile,
        handler: Arc<dyn RequestHandler>,
        pool: &PollerPool,
        placement: Placement,
    ) -> Result<Self, ServerError> {
        let server = vfio_user::Server::on_pool(listener, &profile, handler, pool, placement)?;
        Self::run_server(server, &profile.tag)
    }

    /// Runs `server` (made by [`vfio_user::Server::on_pool`] or taken over from another
    /// process, [`vfio_user::Server::take_over`]) on a thread of its own.
    pub fn run_server(server: vfio_user::Server, tag: &str) -> Result<Self, ServerError> {
        let socket = server.path().to_path_buf();
        let stop = server.stop_handle();
        let join = std::thread::Builder::new()
            .name(format!("vfio-user-{tag}"))
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

impl RunningDevice {
    /// Removes the device as a surprise removal would, but asked first (see
    /// [`StopHandle::request_removal`]): waits until its client let it go, or until the
    /// profile's `remove_timeout_ms` ran out; returns its final statistics and how it went.
    pub fn remove(mut self) -> Result<(DeviceStats, vfio_user::Removal), ServerError> {
        self.stop.request_removal();
        let stats = match self.join.take().map(|j| j.join()) {
            Some(Ok(r)) => r?,
            Some(Err(_)) => return Err(ServerError::Setup(std::io::Error::other("device thread panicked"))),
            None => self.stop.stats(),
        };
        Ok((stats, self.stop.removal().unwrap_or(vfio_user::Removal::Stopped)))
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

/// `e` and its sources, joined by `: `.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
