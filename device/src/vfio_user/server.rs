//! The vfio-user server: accept loop, message framing, and one handler per command.
//!
//! Framing rules (the stream must never lose step with the client):
//! - A header whose `msg_size` is below 16 is answered EINVAL and 16 bytes are consumed.
//! - A message larger than we accept is answered E2BIG and its `msg_size` bytes are drained
//!   without being buffered.
//! - Otherwise the whole message is read, handled, and consumed, whatever the handler says.
//! - Reads stop at message boundaries, so descriptors are attributed to the right message.
//!
//! Error replies carry the real errno. A command with NO_REPLY gets no reply, not even on error
//! (the error is logged). Descriptors a command does not take are closed and the command fails
//! with EINVAL.
//!
//! This file is the protocol only: each command's payload is checked here and mapped onto a call
//! of the device's control-plane state ([`crate::control::DeviceState`]), which holds the
//! registers, DMA windows, interrupts and pollers and knows nothing of sockets.

use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use log::{debug, error, info, warn};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use thiserror::Error;
use vfio_bindings::bindings::vfio as vb;
use vm_memory::ByteValued;

use super::removal::{self, Removal, RemovalCell};
use super::wire::{self, cmd, Header, HEADER_SIZE};
use crate::config::{Placement, Profile};
use crate::control::{ControlError, DeviceState};
use crate::pci;
use crate::poller::{PollerPool, RequestHandler};
use crate::stats::{ClientState, DeviceCounters, DeviceStats};

/// Largest REGION_READ/WRITE count we accept and announce (`max_data_xfer_size`).
pub const MAX_DATA_XFER: usize = 1 << 20;
/// Largest message we accept: a REGION_WRITE of MAX_DATA_XFER bytes.
const MAX_MSG_SIZE: usize = HEADER_SIZE + 16 + MAX_DATA_XFER;
/// Largest VERSION JSON we parse.
const MAX_VERSION_JSON: usize = 4096;

/// How long a connection that arrives while a client is connected waits to be served (the
/// previous client's hang-up may be on its way) before it is refused.
const WAITING_GRACE: Duration = Duration::from_secs(1);
/// How soon accept is tried again after it failed for want of a descriptor (EMFILE, ENFILE):
/// the listener reports no new readiness for connections already in the backlog.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

const LISTENER: Token = Token(0);
const CLIENT: Token = Token(1);
const WAKER: Token = Token(2);

/// Errors that stop the server (per-message errors are replies, not these).
#[derive(Debug, Error)]
pub enum ServerError {
    /// Another live daemon serves this socket path (it holds the lock file, or answers on it).
    #[error("{path} is served by another live daemon ({how}); not taking it over")]
    InUse {
        /// Socket path.
        path: String,
        /// How that was found.
        how: &'static str,
    },
    /// Something that is not a socket is in the way.
    #[error("{path} exists and is not a socket; not replacing it")]
    NotASocket {
        /// Socket path.
        path: String,
    },
    /// Binding the socket failed.
    #[error("cannot listen on {path}")]
    Bind {
        /// Socket path.
        path: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Setting up the event loop, the notify memory or the pollers failed.
    #[error("cannot set up the device")]
    Setup(#[source] io::Error),
    /// The event loop failed.
    #[error("event loop failed")]
    Poll(#[source] io::Error),
}

/// Stops a running [`Server`] from another thread (or a signal handler thread).
#[derive(Clone)]
pub struct StopHandle {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    stats: Arc<DeviceCounters>,
    removal: Arc<RemovalCell>,
}

impl StopHandle {
    /// Asks the server to stop; [`Server::run`] returns soon after.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }

    /// Asks the server to let its device go (see `removal.rs`): the client is sent the
    /// device-request interrupt and [`Server::run`] returns once it hung up, or once the
    /// profile's `remove_timeout_ms` ran out; at once with no client or one that set no
    /// device-request eventfd. [`Self::removal`] then says which.
    pub fn request_removal(&self) {
        self.removal.request();
        let _ = self.waker.wake();
    }

    /// How the removal ended (`None` before it did, or if none was asked).
    pub fn removal(&self) -> Option<Removal> {
        self.removal.outcome()
    }

    /// A snapshot of the device's statistics (while it runs, or after it stopped).
    pub fn stats(&self) -> DeviceStats {
        self.stats.snapshot()
    }

    /// The client's state (connected, driver status, negotiated features) as the control plane
    /// last published it.
    pub fn client(&self) -> ClientState {
        self.stats.client()
    }
}

/// One connected client.
struct Conn {
    sock: UnixStream,
    /// The bytes of the current message received so far (header first).
    buf: Vec<u8>,
    /// Descriptors received with the current message.
    fds: Vec<File>,
    /// The kernel dropped descriptors of the current message (more than we accept).
    fd_overflow: bool,
    /// Bytes of a refused message still to drop.
    discard: u64,
    negotiated: bool,
}

impl Drop for Conn {
    /// Ends the connection for the client even while the pollers' copy of the socket (their
    /// doorbell source) is still open.
    fn drop(&mut self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// A bound vfio-user socket, not served yet: [`Server::new`] serves it.
///
/// Binding is separate from starting the device so that a daemon can bind its socket, then
/// confine itself (a new root, a system-call filter) before any device thread exists.
#[derive(Debug)]
pub struct Listener {
    path: PathBuf,
    listener: UnixListener,
    /// The path the socket file is removed by when the server stops (`None`: it stays).
    unlink: Option<PathBuf>,
    /// The lock file beside the socket, locked (`flock`) for as long as this process lives;
    /// `None` for a socket a supervisor handed over (its owner guards the path).
    _lock: Option<File>,
}

impl Listener {
    /// Binds `path`, replacing a stale socket file there but never a live one.
    ///
    /// `PATH.lock` beside the socket is locked first (`flock`, exclusive, not waiting): a second
    /// daemon on the same path finds it held and stops with [`ServerError::InUse`]. The lock
    /// file is left in place at exit (unlinking it would let two daemons lock two different
    /// files of the same name); the lock itself ends with the process, however it ends. With the
    /// lock held, a socket file already at `path` is probed with a connect: a server answering
    /// there (one that does not take the lock) is [`ServerError::InUse`] too, a refused connect
    /// means a stale socket, which is replaced. Anything but a socket is
    /// [`ServerError::NotASocket`].
    pub fn bind(path: &Path) -> Result<Self, ServerError> {
        use std::os::unix::fs::FileTypeExt;
        let shown = || path.display().to_string();
        let bind_err = |source| ServerError::Bind { path: shown(), source };
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .map_err(bind_err)?;
        match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                return Err(ServerError::InUse { path: shown(), how: "its lock file is held" });
            }
            Err(e) => return Err(bind_err(e.into())),
        }
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(ServerError::NotASocket { path: shown() });
            }
            match UnixStream::connect(path) {
                Ok(_) => return Err(ServerError::InUse { path: shown(), how: "it accepts connections" }),
                Err(e) if e.kind() == ErrorKind::ConnectionRefused || e.kind() == ErrorKind::NotFound => {
                    info!("replacing the stale socket {}", path.display());
                    match std::fs::remove_file(path) {
                        Err(e) if e.kind() != ErrorKind::NotFound => return Err(bind_err(e)),
                        _ => {}
                    }
                }
                Err(e) => return Err(bind_err(e)),
            }
        }
        let listener = UnixListener::bind(path).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(ServerError::Setup)?;
        Ok(Listener {
            path: path.to_path_buf(),
            listener,
            unlink: Some(path.to_path_buf()),
            _lock: Some(lock),
        })
    }

    /// Serves a socket bound elsewhere (a descriptor a supervisor handed over), which logs call
    /// `name`; its file, if it has one, is the supervisor's and stays at exit.
    pub fn from_std(listener: UnixListener, name: PathBuf) -> Result<Self, ServerError> {
        listener.set_nonblocking(true).map_err(ServerError::Setup)?;
        Ok(Listener { path: name, listener, unlink: None, _lock: None })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the socket file in place when the server stops. For a process whose root directory
    /// changed after binding: the path then names something else, or nothing (the next start
    /// replaces the stale socket).
    pub fn keep_socket_file(&mut self) {
        self.unlink = None;
    }

    /// The process's root directory changed after binding and the socket lies beneath the new
    /// root, at `inside` as the process now names it: the socket file is removed through that
    /// path when the server stops.
    pub fn socket_file_now_at(&mut self, inside: PathBuf) {
        if self.unlink.is_some() {
            self.unlink = Some(inside);
        }
    }
}

/// The vfio-user server of one virtio-fs device.
pub struct Server {
    path: PathBuf,
    listener: UnixListener,
    unlink: Option<PathBuf>,
    poll: Poll,
    waker: Arc<Waker>,
    stop: Arc<AtomicBool>,
    dev: DeviceState,
    conn: Option<Conn>,
    /// Where [`Server::run`] pins itself ([`Profile::control_cpu`]).
    control_cpu: Option<usize>,
    /// A connection accepted while `conn` was still connected, and since when it waits.
    waiting: Option<(UnixStream, std::time::Instant)>,
    /// Accept failed for want of descriptors: try again after [`ACCEPT_RETRY`].
    accept_again: bool,
    /// The socket's lock (see [`Listener::bind`]), held until the server is dropped.
    _lock: Option<File>,
    /// A removal asked through [`StopHandle::request_removal`], and its outcome.
    removal: Arc<RemovalCell>,
    /// The removal in progress: the client was sent the device-request interrupt.
    removing: Option<removal::Pending>,
    /// How long a client may keep the device once asked to let it go.
    remove_timeout: Duration,
}

type Reply = (Vec<u8>, Vec<File>);

/// Result of a command handler: reply payload (and fds), or an errno.
type CmdResult = Result<Reply, i32>;

fn ok_empty() -> CmdResult {
    Ok((Vec::new(), Vec::new()))
}

impl Server {
    /// Binds `path` (replacing a stale socket file) and starts the pollers of a device shaped by
    /// `profile`, whose requests go to `handler`.
    pub fn bind(
        path: &Path,
        profile: &Profile,
        handler: Arc<dyn RequestHandler>,
    ) -> Result<Self, ServerError> {
        Self::new(Listener::bind(path)?, profile, handler)
    }

    /// Starts the pollers of a device shaped by `profile`, whose requests go to `handler`, to be
    /// served on `listener` by [`Server::run`].
    pub fn new(
        listener: Listener,
        profile: &Profile,
        handler: Arc<dyn RequestHandler>,
    ) -> Result<Self, ServerError> {
        Self::with_pollers(listener, profile, handler, None)
    }

    /// [`Server::new`], its queues served by the shared pollers of a pool, placed as the
    /// placement says (`None`: pollers of its own, as the profile asks). The control plane
    /// ([`Server::run`]) stays this function's own.
    pub fn with_pollers(
        listener: Listener,
        profile: &Profile,
        handler: Arc<dyn RequestHandler>,
        pool: Option<(&PollerPool, Placement)>,
    ) -> Result<Self, ServerError> {
        let Listener { path, listener, unlink, _lock } = listener;
        let poll = Poll::new().map_err(ServerError::Setup)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(ServerError::Setup)?);
        poll.registry()
            .register(&mut SourceFd(&listener.as_raw_fd()), LISTENER, Interest::READABLE)
            .map_err(ServerError::Setup)?;
        let w = waker.clone();
        let wake = Arc::new(move || {
            let _ = w.wake();
        });
        let remove_timeout = Duration::from_millis(profile.remove_timeout_ms);
        let (dev, control_cpu) = match pool {
            None => (DeviceState::new(profile, handler, wake), profile.control_cpu()),
            Some((pool, placement)) => {
                (DeviceState::on_pool(profile, pool, placement, handler, wake), pool.profile().control_cpu())
            }
        };
        let dev = dev.map_err(ServerError::Setup)?;
        Ok(Server {
            path,
            listener,
            unlink,
            poll,
            waker: waker.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            dev,
            conn: None,
            control_cpu,
            waiting: None,
            accept_again: false,
            _lock,
            removal: Arc::default(),
            removing: None,
            remove_timeout,
        })
    }

    /// A handle that stops [`Server::run`].
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            stop: self.stop.clone(),
            waker: self.waker.clone(),
            stats: self.dev.counters().clone(),
            removal: self.removal.clone(),
        }
    }

    /// A snapshot of the device's statistics.
    pub fn stats(&self) -> DeviceStats {
        self.dev.stats()
    }

    /// Serves clients, one at a time, until stopped; returns the device's final statistics.
    pub fn run(mut self) -> Result<DeviceStats, ServerError> {
        info!("listening on {}", self.path.display());
        // The control plane keeps off the poller cores, so a busy poller has its core alone.
        if let Some(cpu) = self.control_cpu {
            if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
                warn!("control plane: cannot pin to CPU {cpu}");
            }
        }
        let mut events = Events::with_capacity(16);
        while !self.stop.load(Ordering::SeqCst) {
            let timeout = match (&self.waiting, self.accept_again) {
                (_, true) => Some(ACCEPT_RETRY),
                (Some((_, since)), false) => Some(WAITING_GRACE.saturating_sub(since.elapsed())),
                (None, false) => None,
            };
            let timeout = match &self.removing {
                Some(r) => Some(timeout.map_or(r.left(), |t| t.min(r.left()))),
                None => timeout,
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(ServerError::Poll(e));
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    CLIENT => self.client_ready(),
                    WAKER => {
                        self.dev.check_broken_queues();
                        self.start_removal();
                    }
                    _ => {}
                }
            }
            if std::mem::take(&mut self.accept_again) {
                self.accept();
            }
            self.serve_waiting();
            if self.removing.is_some_and(|r| r.expired()) {
                warn!("the client did not let the device go in {:?}: disconnecting it", self.remove_timeout);
                self.end_removal(Removal::TimedOut);
            }
        }
        self.removal.end(Removal::Stopped); // unless it ended otherwise
        info!("stopping");
        self.disconnect();
        remove_socket_file(self.unlink.take());
        // The pollers end with the device (each counts its last spell first).
        let counters = self.dev.counters().clone();
        drop(self);
        Ok(counters.snapshot())
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((sock, _)) => {
                    if self.conn.is_none() {
                        if let Err(e) = self.attach(sock) {
                            error!("cannot serve new client: {e}");
                        }
                    } else if self.waiting.is_none() {
                        // The current client may be hanging up (its end of stream not handled
                        // yet): this one waits a moment rather than being refused.
                        self.waiting = Some((sock, std::time::Instant::now()));
                    } else {
                        warn!("a client is already connected; refusing another");
                        // dropping `sock` closes it
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE/ENFILE leave the connection in the backlog, and the listener will
                    // not report it again: retry on a timer until a descriptor is free.
                    if !self.accept_again {
                        warn!("accept: {e}; retrying");
                    }
                    self.accept_again = true;
                    return;
                }
            }
        }
    }

    /// Serves the waiting connection once the current client is gone, or refuses it once it
    /// waited [`WAITING_GRACE`] behind a client that stays.
    fn serve_waiting(&mut self) {
        let Some((_, since)) = &self.waiting else { return };
        if self.conn.is_none() {
            let (sock, _) = self.waiting.take().expect("checked above");
            if let Err(e) = self.attach(sock) {
                error!("cannot serve new client: {e}");
            }
        } else if since.elapsed() >= WAITING_GRACE {
            warn!("a client is already connected; refusing another");
            self.waiting = None;
        }
    }

    fn attach(&mut self, sock: UnixStream) -> io::Result<()> {
        // Receives use MSG_DONTWAIT; replies block, bounded by a send timeout.
        sock.set_nonblocking(false)?;
        sock.set_write_timeout(Some(Duration::from_secs(5)))?;
        self.poll.registry().register(&mut SourceFd(&sock.as_raw_fd()), CLIENT, Interest::READABLE)?;
        info!("client connected");
        self.dev.counters().client_connected(true);
        // A copy for the pollers to sleep on: a doorbell (a REGION_WRITE) wakes the poller that
        // owns the queue at once, not after this thread has read it (the one-hop wake-up).
        match sock.try_clone() {
            Ok(dup) => self.dev.set_doorbell_source(Some(OwnedFd::from(dup))),
            Err(e) => warn!("no doorbell source for the pollers (doorbells wake them in two hops): {e}"),
        }
        self.conn = Some(Conn {
            sock,
            buf: Vec::with_capacity(64 << 10),
            fds: Vec::new(),
            fd_overflow: false,
            discard: 0,
            negotiated: false,
        });
        Ok(())
    }

    /// Drops the client and returns the device to its power-on state (keeping the listener).
    fn disconnect(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = self.poll.registry().deregister(&mut SourceFd(&conn.sock.as_raw_fd()));
            info!("client disconnected; resetting device");
            self.dev.counters().client_connected(false);
            drop(conn); // shut down: the client sees the end although the pollers hold a copy
            self.dev.set_doorbell_source(None);
            if self.removing.is_some() {
                self.end_removal(Removal::Released);
            }
        }
        self.dev.power_on_reset();
    }

    /// Starts the removal [`StopHandle::request_removal`] asked for (once): no new client
    /// from now on; the client is sent the device-request interrupt, or, without one (or without
    /// a client), the server stops at once.
    fn start_removal(&mut self) {
        if !self.removal.requested() || self.removing.is_some() || self.stop.load(Ordering::SeqCst) {
            return;
        }
        let _ = self.poll.registry().deregister(&mut SourceFd(&self.listener.as_raw_fd()));
        self.waiting = None;
        remove_socket_file(self.unlink.take());
        if self.conn.is_none() {
            self.end_removal(Removal::NoClient);
        } else if self.dev.request_removal() {
            info!(
                "removal: device-request interrupt sent; waiting up to {:?} for the client",
                self.remove_timeout
            );
            self.removing = Some(removal::Pending::new(self.remove_timeout));
        } else {
            info!("removal: the client set no device-request eventfd; disconnecting it");
            self.end_removal(Removal::NotAsked);
        }
    }

    /// Records how the removal ended and stops the server (whose end disconnects the client).
    fn end_removal(&mut self, how: Removal) {
        self.removal.end(how);
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Reads what the client sent, one message at a time, and handles each complete message.
    ///
    /// Reads never cross a message boundary: a unix stream socket glues fd-less data in front of a
    /// chunk that carries descriptors into one `recvmsg`, so the only way to know which message a
    /// descriptor belongs to is to ask for no more than the rest of the current message.
    fn client_ready(&mut self) {
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            let Some(conn) = self.conn.as_mut() else { return };
            let want = conn.wanted().min(chunk.len());
            let mut fds = Vec::new();
            match wire::recv_with_fds(&conn.sock, &mut chunk[..want], &mut fds) {
                Ok(r) if r.bytes == 0 => break,
                Ok(r) => {
                    conn.fd_overflow |= r.truncated_fds;
                    if conn.discard > 0 {
                        conn.discard -= r.bytes as u64;
                        continue; // descriptors of a dropped message are closed here
                    }
                    conn.fds.extend(fds);
                    conn.buf.extend_from_slice(&chunk[..r.bytes]);
                    if !self.message_progress() {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    warn!("receive failed: {e}");
                    break;
                }
            }
        }
        self.disconnect();
    }

    /// Acts on the bytes of the current message: checks the header once it is complete, and
    /// handles the message once its payload is. Returns false if the client must be dropped.
    fn message_progress(&mut self) -> bool {
        let Some(conn) = self.conn.as_mut() else { return false };
        let Some(hdr) = wire::read_obj::<Header>(&conn.buf) else { return true };
        let size = hdr.msg_size as usize;
        if conn.buf.len() == HEADER_SIZE {
            // Header just completed: decide how this message is framed.
            let verdict = if hdr.flags & wire::FLAG_TYPE_MASK != wire::FLAG_COMMAND {
                warn!("message {} from the client is not a command (flags {:#x})", hdr.msg_id, hdr.flags);
                Some(None)
            } else if size < HEADER_SIZE {
                warn!("message {}: size {size} is smaller than a header", hdr.msg_id);
                Some(Some(libc::EINVAL))
            } else if size > MAX_MSG_SIZE {
                warn!("message {}: size {size} exceeds {MAX_MSG_SIZE}", hdr.msg_id);
                Some(Some(libc::E2BIG))
            } else {
                None
            };
            if let Some(errno) = verdict {
                conn.discard = (size.max(HEADER_SIZE) - HEADER_SIZE) as u64;
                let r = errno.map_or(Ok(()), |e| conn.reply(&hdr, Err(e)));
                conn.next_message();
                return r.is_ok();
            }
        }
        if conn.buf.len() < size {
            return true;
        }
        let fds = std::mem::take(&mut conn.fds);
        let overflow = conn.fd_overflow;
        let payload = std::mem::take(&mut conn.buf);
        let negotiated = conn.negotiated;
        let result = if overflow {
            warn!("message {}: too many file descriptors", hdr.msg_id);
            Err(libc::EINVAL)
        } else if hdr.command != cmd::VERSION && !negotiated {
            warn!("command {} before VERSION", hdr.command);
            Err(libc::EINVAL)
        } else {
            self.dispatch(&hdr, &payload[HEADER_SIZE..], fds)
        };
        let Some(conn) = self.conn.as_mut() else { return false };
        conn.buf = payload;
        conn.next_message();
        if hdr.command == cmd::VERSION && result.is_ok() {
            conn.negotiated = true;
        }
        log_command(&hdr, &result);
        if let Err(e) = conn.reply(&hdr, result) {
            warn!("cannot send reply: {e}");
            return false;
        }
        true
    }

    fn dispatch(&mut self, hdr: &Header, payload: &[u8], fds: Vec<File>) -> CmdResult {
        let takes_fds = matches!(hdr.command, cmd::DMA_MAP | cmd::DEVICE_SET_IRQS);
        if !takes_fds && !fds.is_empty() {
            warn!("command {} came with {} unexpected file descriptors", hdr.command, fds.len());
            return Err(libc::EINVAL);
        }
        let negotiated = self.conn.as_ref().is_some_and(|c| c.negotiated);
        match hdr.command {
            cmd::VERSION if negotiated => Err(libc::EINVAL),
            cmd::VERSION => version(payload, self.dev.max_dma_windows()),
            cmd::DMA_MAP => dma_map(&mut self.dev, payload, fds),
            cmd::DMA_UNMAP => dma_unmap(&mut self.dev, payload),
            cmd::DEVICE_GET_INFO => device_info(payload),
            cmd::DEVICE_GET_REGION_INFO => region_info(&self.dev, payload),
            cmd::DEVICE_GET_IRQ_INFO => irq_info(&self.dev, payload),
            cmd::DEVICE_SET_IRQS => set_irqs(&mut self.dev, payload, fds),
            cmd::REGION_READ => region_read(&mut self.dev, payload),
            cmd::REGION_WRITE => region_write(&mut self.dev, payload),
            cmd::DEVICE_RESET if payload.is_empty() => {
                self.dev.function_reset();
                ok_empty()
            }
            cmd::DEVICE_RESET => Err(libc::EINVAL),
            cmd::DEVICE_GET_REGION_IO_FDS | cmd::REGION_WRITE_MULTI | cmd::DEVICE_FEATURE => {
                Err(libc::ENOTSUP)
            }
            other => {
                warn!("unknown command {other}");
                Err(libc::ENOSYS)
            }
        }
    }
}

impl Conn {
    /// How many bytes to ask the socket for: never past the end of the current message.
    fn wanted(&self) -> usize {
        if self.discard > 0 {
            return usize::try_from(self.discard).unwrap_or(usize::MAX);
        }
        match wire::read_obj::<Header>(&self.buf) {
            None => HEADER_SIZE - self.buf.len(),
            Some(h) => (h.msg_size as usize).saturating_sub(self.buf.len()).max(1),
        }
    }

    /// Forgets the current message (its unused descriptors are closed).
    fn next_message(&mut self) {
        self.buf.clear();
        self.fds.clear();
        self.fd_overflow = false;
    }

    fn reply(&self, req: &Header, result: CmdResult) -> io::Result<()> {
        if req.flags & wire::FLAG_NO_REPLY != 0 {
            return Ok(());
        }
        let (payload, fds, flags, error) = match result {
            Ok((p, f)) => (p, f, wire::FLAG_REPLY, 0),
            Err(errno) => (Vec::new(), Vec::new(), wire::FLAG_REPLY | wire::FLAG_ERROR, errno as u32),
        };
        let hdr = Header {
            msg_id: req.msg_id,
            command: req.command,
            msg_size: (HEADER_SIZE + payload.len()) as u32,
            flags,
            error,
        };
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let total = HEADER_SIZE + payload.len();
        let mut sent = wire::send_with_fds(&self.sock, &[hdr.as_slice(), &payload], &raw)?;
        // A large reply may go out in pieces; the descriptors went with the first one.
        while sent < total {
            let (h, p) = (hdr.as_slice(), payload.as_slice());
            let rest: Vec<u8> = h.iter().chain(p.iter()).skip(sent).copied().collect();
            sent += wire::send_with_fds(&self.sock, &[&rest], &[])?;
        }
        Ok(())
    }
}

/// Removes the socket file at `path`, if that is still a socket (after a change of root the
/// name may lie in a shared directory, where a guest may have put a file of its own).
fn remove_socket_file(path: Option<PathBuf>) {
    use std::os::unix::fs::FileTypeExt;
    let Some(p) = path else { return };
    if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(&p);
    }
}

fn version(payload: &[u8], max_dma_maps: usize) -> CmdResult {
    let v = wire::read_obj::<wire::Version>(payload).ok_or(libc::EINVAL)?;
    if v.major != 0 {
        warn!("client wants protocol {}.{}; we speak 0.x", v.major, v.minor);
        return Err(libc::ENOTSUP);
    }
    let json = &payload[4..];
    let mut proposed: Vec<&str> = Vec::new();
    if json.len() > MAX_VERSION_JSON {
        return Err(libc::E2BIG);
    }
    if !json.is_empty() {
        let text = json.strip_suffix(&[0]).ok_or(libc::EINVAL)?;
        let value: serde_json::Value = serde_json::from_slice(text).map_err(|e| {
            warn!("malformed VERSION JSON: {e}");
            libc::EINVAL
        })?;
        let obj = value.as_object().ok_or(libc::EINVAL)?;
        if let Some(caps) = obj.get("capabilities") {
            let caps = caps.as_object().ok_or(libc::EINVAL)?;
            for key in ["max_msg_fds", "max_data_xfer_size", "pgsizes", "max_dma_maps"] {
                match caps.get(key) {
                    Some(v) if !v.is_u64() => {
                        warn!("VERSION capability {key} is not a number");
                        return Err(libc::EINVAL);
                    }
                    Some(_) => proposed.push(key),
                    None => {}
                }
            }
            if caps.get("pgsizes").and_then(|v| v.as_u64()).is_some_and(|p| p & 4096 == 0) {
                warn!("client does not support 4 KiB pages");
                return Err(libc::EINVAL);
            }
        }
    }
    // The reply's capabilities are a subset of the proposal: ours, for the keys the client named.
    let ours = [
        ("max_msg_fds", wire::MAX_MSG_FDS as u64),
        ("max_data_xfer_size", MAX_DATA_XFER as u64),
        ("pgsizes", 4096),
        ("max_dma_maps", max_dma_maps as u64),
    ];
    let reply_caps: serde_json::Map<String, serde_json::Value> = ours
        .iter()
        .filter(|(k, _)| proposed.contains(k))
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    let caps = serde_json::json!({ "capabilities": reply_caps });
    let mut out = wire::Version { major: 0, minor: v.minor.min(1) }.as_slice().to_vec();
    out.extend_from_slice(caps.to_string().as_bytes());
    out.push(0);
    Ok((out, Vec::new()))
}

fn device_info(payload: &[u8]) -> CmdResult {
    let req = wire::read_obj::<wire::DeviceInfo>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 16 || (req.argsz as usize) < 16 {
        return Err(libc::EINVAL);
    }
    let info = wire::DeviceInfo {
        argsz: 16,
        flags: vb::VFIO_DEVICE_FLAGS_RESET | vb::VFIO_DEVICE_FLAGS_PCI,
        num_regions: vb::VFIO_PCI_NUM_REGIONS,
        num_irqs: vb::VFIO_PCI_NUM_IRQS,
    };
    Ok((info.as_slice().to_vec(), Vec::new()))
}

/// The errno a refused device operation is reported with (and the log line saying why).
/// At debug level, every command by name with its size and result.
fn log_command(hdr: &Header, result: &CmdResult) {
    if !log::log_enabled!(log::Level::Debug) {
        return;
    }
    let name = cmd::name(hdr.command);
    let (id, size) = (hdr.msg_id, hdr.msg_size);
    match result {
        Ok((reply, fds)) => {
            debug!(
                "{name} (msg {id}, {size} bytes): ok, reply {} bytes, {} fds",
                reply.len() + HEADER_SIZE,
                fds.len()
            )
        }
        Err(errno) => debug!(
            "{name} (msg {id}, {size} bytes): failed: errno {errno} ({})",
            io::Error::from_raw_os_error(*errno)
        ),
    }
}

fn refused(what: &str, e: impl Into<ControlError>) -> i32 {
    let e = e.into();
    warn!("{what}: {e}");
    e.errno()
}

fn dma_map(dev: &mut DeviceState, payload: &[u8], mut fds: Vec<File>) -> CmdResult {
    let m = wire::read_obj::<wire::DmaMap>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 32 || m.argsz != 32 || fds.len() > 1 || m.flags & !3 != 0 {
        return Err(libc::EINVAL);
    }
    dev.dma_map(m.address, m.size, m.offset, fds.pop()).map_err(|e| refused("DMA_MAP", e))?;
    ok_empty()
}

fn dma_unmap(dev: &mut DeviceState, payload: &[u8]) -> CmdResult {
    let u = wire::read_obj::<wire::DmaUnmap>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 24 || (u.argsz as usize) < 24 {
        return Err(libc::EINVAL);
    }
    let range = match u.flags {
        0 => Some((u.address, u.size)),
        vb::VFIO_DMA_UNMAP_FLAG_ALL if u.address == 0 && u.size == 0 => None,
        vb::VFIO_DMA_UNMAP_FLAG_GET_DIRTY_BITMAP => return Err(libc::ENOTSUP),
        _ => return Err(libc::EINVAL),
    };
    // Returns only once no poller can still touch the removed windows.
    dev.dma_unmap(range).map_err(|e| refused("DMA_UNMAP", e))?;
    let reply = wire::DmaUnmap { argsz: 24, ..u };
    Ok((reply.as_slice().to_vec(), Vec::new()))
}

fn region_info(dev: &DeviceState, payload: &[u8]) -> CmdResult {
    let req = wire::read_obj::<wire::RegionInfo>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 32 || (req.argsz as usize) < 32 || req.index >= vb::VFIO_PCI_NUM_REGIONS {
        return Err(libc::EINVAL);
    }
    let size = dev.region_size(req.index);
    let mut info = wire::RegionInfo { argsz: 32, flags: 0, index: req.index, cap_offset: 0, size, offset: 0 };
    if size > 0 {
        info.flags = vb::VFIO_REGION_INFO_FLAG_READ | vb::VFIO_REGION_INFO_FLAG_WRITE;
    }
    let mut caps = Vec::new();
    let mut fds = Vec::new();
    let notify = if req.index == pci::VIRTIO_BAR {
        dev.notify_memory().map_err(|e| refused("REGION_INFO", e))?
    } else {
        None
    };
    if let Some(notify_mem) = notify {
        // The notify page is mmappable: guest doorbells land in shared memory, never on the socket.
        info.flags |= vb::VFIO_REGION_INFO_FLAG_MMAP | vb::VFIO_REGION_INFO_FLAG_CAPS;
        info.cap_offset = 32;
        let cap = wire::SparseMmapCap {
            id: vb::VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16,
            version: 1,
            next: 0,
            nr_areas: 1,
            reserved: 0,
        };
        let area = wire::SparseArea { offset: pci::NOTIFY_OFFSET, size: pci::NOTIFY_SIZE };
        caps.extend_from_slice(cap.as_slice());
        caps.extend_from_slice(area.as_slice());
        info.argsz = (32 + caps.len()) as u32;
        if req.argsz >= info.argsz {
            fds.push(notify_mem);
        } else {
            // Too small: the client asks again with argsz. cap_offset still says where the
            // caps will be (QEMU rejects CAPS with a cap_offset inside the fixed struct).
            caps.clear();
        }
    }
    let mut out = info.as_slice().to_vec();
    out.extend_from_slice(&caps);
    Ok((out, fds))
}

fn irq_info(dev: &DeviceState, payload: &[u8]) -> CmdResult {
    let req = wire::read_obj::<wire::IrqInfo>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 16 || (req.argsz as usize) < 16 || req.index >= vb::VFIO_PCI_NUM_IRQS {
        return Err(libc::EINVAL);
    }
    let (flags, count) = irq_shape(dev, req.index);
    let info = wire::IrqInfo { argsz: 16, flags, index: req.index, count };
    Ok((info.as_slice().to_vec(), Vec::new()))
}

/// Flags and vector count of interrupt index `index`: MSI-X has the device's vectors, the
/// device request (`VFIO_PCI_REQ_IRQ_INDEX`) one interrupt as vfio-pci offers it (not maskable,
/// not resizable), the others (INTx, MSI, error) none.
fn irq_shape(dev: &DeviceState, index: u32) -> (u32, u32) {
    match index {
        vb::VFIO_PCI_MSIX_IRQ_INDEX => {
            (vb::VFIO_IRQ_INFO_EVENTFD | vb::VFIO_IRQ_INFO_MASKABLE, dev.msix_vectors() as u32)
        }
        vb::VFIO_PCI_REQ_IRQ_INDEX => (vb::VFIO_IRQ_INFO_EVENTFD | vb::VFIO_IRQ_INFO_NORESIZE, 1),
        _ => (vb::VFIO_IRQ_INFO_EVENTFD, 0),
    }
}

/// SET_IRQS of the device-request interrupt, as vfio-pci's `vfio_pci_set_req_trigger` takes
/// it: only the TRIGGER action (MASK and UNMASK: ENOTTY, the kernel's answer), `start` 0 and
/// `count` at most 1; count 0 with DATA_NONE clears the eventfd; count 1 with DATA_EVENTFD sets
/// it (one descriptor) or clears it (none: how a vfio-user client sends vfio's fd -1), with
/// DATA_NONE or DATA_BOOL (a nonzero byte) signals it (the loopback test vfio allows).
fn set_req_irq(dev: &mut DeviceState, s: &wire::IrqSet, data: &[u8], mut fds: Vec<File>) -> CmdResult {
    let data_kind = s.flags & vb::VFIO_IRQ_SET_DATA_TYPE_MASK;
    if s.flags & vb::VFIO_IRQ_SET_ACTION_TYPE_MASK != vb::VFIO_IRQ_SET_ACTION_TRIGGER {
        return Err(libc::ENOTTY);
    }
    if s.start != 0 || s.count > 1 {
        return Err(libc::EINVAL);
    }
    match (data_kind, s.count) {
        (vb::VFIO_IRQ_SET_DATA_NONE, 0) if data.is_empty() && fds.is_empty() => {
            dev.set_request_eventfd(None).map_err(|e| refused("SET_IRQS", e))?;
        }
        (vb::VFIO_IRQ_SET_DATA_NONE, 1) if data.is_empty() && fds.is_empty() => {
            dev.request_removal();
        }
        (vb::VFIO_IRQ_SET_DATA_BOOL, 1) if data.len() == 1 && fds.is_empty() => {
            if data[0] != 0 {
                dev.request_removal();
            }
        }
        (vb::VFIO_IRQ_SET_DATA_EVENTFD, 1) if data.is_empty() && fds.len() <= 1 => {
            dev.set_request_eventfd(fds.pop()).map_err(|e| refused("SET_IRQS", e))?;
        }
        _ => return Err(libc::EINVAL),
    }
    ok_empty()
}

fn set_irqs(dev: &mut DeviceState, payload: &[u8], fds: Vec<File>) -> CmdResult {
    let s = wire::read_obj::<wire::IrqSet>(payload).ok_or(libc::EINVAL)?;
    // argsz is not checked against the payload: QEMU sends the kernel-style argsz (which counts
    // the eventfd array) while the descriptors travel as SCM_RIGHTS, not in the payload.
    if (s.argsz as usize) < 20 || s.index >= vb::VFIO_PCI_NUM_IRQS {
        return Err(libc::EINVAL);
    }
    let data_kind = s.flags & vb::VFIO_IRQ_SET_DATA_TYPE_MASK;
    let action = s.flags & vb::VFIO_IRQ_SET_ACTION_TYPE_MASK;
    let unknown = s.flags & !(vb::VFIO_IRQ_SET_DATA_TYPE_MASK | vb::VFIO_IRQ_SET_ACTION_TYPE_MASK);
    if unknown != 0 || !data_kind.is_power_of_two() || !action.is_power_of_two() {
        return Err(libc::EINVAL);
    }
    let data = &payload[20..];
    if s.index == vb::VFIO_PCI_REQ_IRQ_INDEX {
        return set_req_irq(dev, &s, data, fds);
    }
    let (_, count) = irq_shape(dev, s.index);
    // count 0 with DATA_NONE + TRIGGER: disable every interrupt of the index.
    if s.count == 0 {
        if data_kind != vb::VFIO_IRQ_SET_DATA_NONE
            || action != vb::VFIO_IRQ_SET_ACTION_TRIGGER
            || s.start != 0
            || !data.is_empty()
            || !fds.is_empty()
        {
            return Err(libc::EINVAL);
        }
        if s.index == vb::VFIO_PCI_MSIX_IRQ_INDEX {
            dev.clear_irq_eventfds();
        }
        return ok_empty();
    }
    // Only MSI-X has vectors past here (the others have count 0), so the index is MSI-X.
    let end = s.start.checked_add(s.count).ok_or(libc::EINVAL)?;
    if end > count {
        return Err(libc::EINVAL);
    }
    let (start, n) = (s.start as usize, s.count as usize);
    let selected: Option<Vec<bool>> = match data_kind {
        vb::VFIO_IRQ_SET_DATA_NONE if data.is_empty() && fds.is_empty() => None,
        vb::VFIO_IRQ_SET_DATA_BOOL if data.len() == n && fds.is_empty() => {
            Some(data.iter().map(|&b| b != 0).collect())
        }
        vb::VFIO_IRQ_SET_DATA_EVENTFD if data.is_empty() => {
            if action != vb::VFIO_IRQ_SET_ACTION_TRIGGER {
                return Err(libc::ENOTSUP); // no mask/unmask notification eventfds
            }
            dev.set_irq_eventfds(start, n, fds).map_err(|e| refused("SET_IRQS", e))?;
            return ok_empty();
        }
        _ => return Err(libc::EINVAL),
    };
    let selected = selected.as_deref();
    let r = match action {
        vb::VFIO_IRQ_SET_ACTION_MASK => dev.mask_vectors(start, n, selected, true),
        vb::VFIO_IRQ_SET_ACTION_UNMASK => dev.mask_vectors(start, n, selected, false),
        _ => dev.trigger_vectors(start, n, selected),
    };
    r.map_err(|e| refused("SET_IRQS", e))?;
    ok_empty()
}

fn region_read(dev: &mut DeviceState, payload: &[u8]) -> CmdResult {
    let a = wire::read_obj::<wire::RegionAccess>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 16 {
        return Err(libc::EINVAL);
    }
    if a.count as usize > MAX_DATA_XFER {
        return Err(libc::E2BIG);
    }
    let mut out = a.as_slice().to_vec();
    let mut data = vec![0u8; a.count as usize];
    dev.region_read(a.region, a.offset, &mut data).map_err(access_refused)?;
    out.extend_from_slice(&data);
    Ok((out, Vec::new()))
}

fn region_write(dev: &mut DeviceState, payload: &[u8]) -> CmdResult {
    let a = wire::read_obj::<wire::RegionAccess>(payload).ok_or(libc::EINVAL)?;
    if a.count as usize > MAX_DATA_XFER {
        return Err(libc::E2BIG);
    }
    if payload.len() != 16 + a.count as usize {
        return Err(libc::EINVAL);
    }
    dev.region_write(a.region, a.offset, &payload[16..]).map_err(access_refused)?;
    Ok((a.as_slice()[..16].to_vec(), Vec::new()))
}

fn access_refused(e: pci::AccessError) -> i32 {
    debug!("region access refused: {e}");
    libc::EINVAL
}
