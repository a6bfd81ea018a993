//! virtiofs-dpu: wires the device (vfio-user server, PCI function, pollers) to a FUSE backend.
//!
//! The device crate knows nothing of FUSE and the backend knows nothing of PCI or vfio-user; this
//! crate is the seam: [`FuseHandler`] adapts a backend [`Server`] to the device's
//! [`RequestHandler`], and [`RunningDevice`] runs a device on a socket in a thread of its own (for
//! the daemon, the tests and the benchmarks).
#![deny(missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use virtiofs_backend::filesystem::FileSystem;
use virtiofs_backend::{RamFs, Server};
use virtiofs_device::config::Profile;
use virtiofs_device::poller::{QueueStats, RequestHandler};
use virtiofs_device::vfio_user::{self, ServerError, StopHandle};
use vm_memory::VolatileSlice;

pub use virtiofs_device::config;

/// Serves virtio-fs requests with a FUSE server over filesystem `F`.
pub struct FuseHandler<F: FileSystem> {
    server: Server<F>,
}

impl<F: FileSystem> FuseHandler<F> {
    /// A handler serving `fs`.
    pub fn new(fs: F) -> Self {
        FuseHandler { server: Server::new(fs) }
    }
}

impl<F: FileSystem + 'static> RequestHandler for FuseHandler<F> {
    fn handle(&self, _queue: u16, readable: &[VolatileSlice<'_>], writable: &[VolatileSlice<'_>]) -> u32 {
        u32::try_from(self.server.handle(readable, writable)).unwrap_or(0)
    }
}

/// A device serving one socket from a thread of its own.
pub struct RunningDevice {
    socket: PathBuf,
    stop: StopHandle,
    stats: Arc<QueueStats>,
    join: Option<JoinHandle<Result<Arc<QueueStats>, ServerError>>>,
}

impl RunningDevice {
    /// Starts a device with an empty RAM filesystem on `socket` (listening when this returns).
    pub fn start(socket: &Path, profile: Profile) -> Result<Self, ServerError> {
        Self::start_with(socket, profile, Arc::new(FuseHandler::new(RamFs::new())))
    }

    /// Starts a device whose requests go to `handler`.
    pub fn start_with(
        socket: &Path,
        profile: Profile,
        handler: Arc<dyn RequestHandler>,
    ) -> Result<Self, ServerError> {
        let server = vfio_user::Server::bind(socket, &profile, handler)?;
        let stop = server.stop_handle();
        let stats = server.stats();
        let join = std::thread::Builder::new()
            .name("vfio-user".into())
            .spawn(move || server.run())
            .map_err(ServerError::Setup)?;
        Ok(RunningDevice { socket: socket.to_path_buf(), stop, stats, join: Some(join) })
    }

    /// The socket the device listens on.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Per-queue counters (index 0 = hiprio).
    pub fn stats(&self) -> &Arc<QueueStats> {
        &self.stats
    }

    /// A handle that stops the device from elsewhere.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Stops the device and waits for it.
    pub fn stop(mut self) -> Result<Arc<QueueStats>, ServerError> {
        self.stop.stop();
        match self.join.take().map(|j| j.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(ServerError::Setup(std::io::Error::other("device thread panicked"))),
            None => Ok(self.stats.clone()),
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
