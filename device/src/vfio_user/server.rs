//! The vfio-user server: accept loop, message framing and dispatch to the command handlers
//! ([`super::commands`]).
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
//! This file and `commands.rs` are the protocol only: each command's payload is checked there and
//! mapped onto a call of the device's control-plane state ([`crate::control::DeviceState`]),
//! which holds the registers, DMA windows, interrupts and pollers and knows nothing of sockets.

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
use vm_memory::ByteValued;

use super::commands::{self, ok_empty, CmdResult, MAX_DATA_XFER};
use super::handover::CheckpointSink;
use super::handover::{Answer, ClientHandover, HandoverCell, ServerHandover, ANSWER_BOUND, OFFER_BOUND};
use super::removal::{self, Removal, RemovalCell};
use super::socket_file::{bind_exclusive_with, BindError, SocketAccess, SocketFiles};
use super::wire::{self, cmd, Header, HEADER_SIZE};
use crate::config::{Placement, Profile};
use crate::control::DeviceState;
use crate::handover::{DeviceHandover, HandoverError};
use crate::poller::{PollerPool, RequestHandler};
use crate::stats::{ClientState, DeviceCounters, DeviceStats};

/// Largest message we accept: a REGION_WRITE of MAX_DATA_XFER bytes.
const MAX_MSG_SIZE: usize = HEADER_SIZE + 16 + MAX_DATA_XFER;

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
    /// The socket path could not be bound (in use by a live daemon, something else in the way,
    /// a system call failed).
    #[error(transparent)]
    Bind(#[from] BindError),
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
    handover: Arc<HandoverCell>,
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

    /// Asks the server to hand its function over (issue 22): at its next message boundary it
    /// brings the function to its quiet point and offers its state and descriptors, which the
    /// caller gives to a taker ([`Server::take_over`]); the [`Answer`] then tells the server
    /// whether the taker serves (it exits without touching the client or the device) or not
    /// (it serves on; also when no answer comes within [`ANSWER_BOUND`]). Waits at most
    /// [`OFFER_BOUND`] for the offer.
    pub fn hand_over(&self) -> Result<(ServerHandover, Answer), HandoverError> {
        let (offers, answer) = self.handover.ask();
        let _ = self.waker.wake();
        match offers.recv_timeout(OFFER_BOUND) {
            Ok(Ok(h)) => Ok((h, Answer(answer))),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                let _ = self.handover.take();
                Err(HandoverError::NoOffer)
            }
        }
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
    /// Handed over: the connection is another server's now, and stays up.
    handed_over: bool,
}

impl Drop for Conn {
    /// Ends the connection for the client even while the pollers' copy of the socket (their
    /// doorbell source) is still open (unless it was handed over).
    fn drop(&mut self) {
        if !self.handed_over {
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A bound vfio-user socket, not served yet: [`Server::on_pool`] serves it.
///
/// Binding is separate from starting the device so that a daemon can bind its socket, then
/// confine itself (a new root, a system-call filter) before any device thread exists.
#[derive(Debug)]
pub struct Listener {
    path: PathBuf,
    listener: UnixListener,
    /// The socket file and its lock ([`socket_file`](super::socket_file)): dropped unserved,
    /// what the bind made goes.
    files: SocketFiles,
}

impl Listener {
    /// Binds `path`, replacing a stale socket file there but never a live one, nor anything
    /// that is not a socket ([`bind_exclusive_with`]).
    pub fn bind(path: &Path) -> Result<Self, ServerError> {
        Self::bind_with(path, SocketAccess::default())
    }

    /// [`Listener::bind`], the socket file appearing with `access` (its group and mode).
    pub fn bind_with(path: &Path, access: SocketAccess) -> Result<Self, ServerError> {
        let (listener, files) = bind_exclusive_with(path, access)?;
        Ok(Listener { path: path.to_path_buf(), listener, files })
    }

    /// Serves a socket bound elsewhere (a descriptor a supervisor handed over), which logs call
    /// `name`; its file, if it has one, is the supervisor's and stays at exit.
    pub fn from_std(listener: UnixListener, name: PathBuf) -> Result<Self, ServerError> {
        listener.set_nonblocking(true).map_err(ServerError::Setup)?;
        Ok(Listener { path: name, listener, files: SocketFiles::default() })
    }

    /// A socket another process bound for this one at `path` (a supervisor, for a confined
    /// process that cannot reach the path), with the descriptor of its `PATH.lock`, locked: the
    /// lock is held while this serves; the socket file is the other process's to remove.
    pub fn bound_elsewhere(path: PathBuf, listener: UnixListener, lock: File) -> Result<Self, ServerError> {
        listener.set_nonblocking(true).map_err(ServerError::Setup)?;
        Ok(Listener { path, listener, files: SocketFiles::from_parts(None, Some(lock)) })
    }

    /// The socket's path (for an inherited socket, the name it was given).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the socket file in place when the server stops. For a process whose root directory
    /// changed after binding: the path then names something else, or nothing (the next start
    /// replaces the stale socket).
    pub fn keep_socket_file(&mut self) {
        self.files.keep_socket_file();
    }

    /// The process's root directory changed after binding and the socket lies beneath the new
    /// root, at `inside` as the process now names it: the socket file is removed through that
    /// path when the server stops.
    pub fn socket_file_now_at(&mut self, inside: PathBuf) {
        self.files.socket_file_now_at(inside);
    }
}

/// The vfio-user server of one virtio-fs device.
pub struct Server {
    path: PathBuf,
    listener: UnixListener,
    /// The socket file and its lock (held until the server is dropped).
    files: SocketFiles,
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
    /// A removal asked through [`StopHandle::request_removal`], and its outcome.
    removal: Arc<RemovalCell>,
    /// The removal in progress: the client was sent the device-request interrupt.
    removing: Option<removal::Pending>,
    /// How long a client may keep the device once asked to let it go.
    remove_timeout: Duration,
    /// A handover asked through [`StopHandle::hand_over`].
    handover: Arc<HandoverCell>,
    /// Taken over ([`Server::take_over`]) and not run yet: dropped now, it leaves the client's
    /// connection up and the socket file in place (they are still its predecessor's).
    taken: bool,
    /// Where checkpoints go ([`Server::keep_checkpoints`]), and what the last one saw: the
    /// device's epoch and the connection's.
    checkpoints: Option<(Arc<dyn CheckpointSink>, (u64, u64))>,
    /// Bumped when a client connects or goes.
    conn_epoch: u64,
}

impl Server {
    /// Binds `path` (replacing a stale socket file) and serves a device shaped by `profile`,
    /// whose requests go to `handler`, on a pool of pollers of its own: one device alone, for
    /// tests. A daemon's functions start with [`Server::on_pool`].
    pub fn bind(
        path: &Path,
        profile: &Profile,
        handler: Arc<dyn RequestHandler>,
    ) -> Result<Self, ServerError> {
        let pool = PollerPool::spawn(profile).map_err(ServerError::Setup)?;
        Self::on_pool(Listener::bind(path)?, profile, handler, &pool, Placement::of_profile(profile))
    }

    /// A device shaped by `profile`, whose requests go to `handler`, to be served on `listener`
    /// by [`Server::run`]; its queues are served by the shared pollers of `pool`, placed as
    /// `placement` says. The control plane ([`Server::run`]) stays this function's own.
    pub fn on_pool(
        listener: Listener,
        profile: &Profile,
        handler: Arc<dyn RequestHandler>,
        pool: &PollerPool,
        placement: Placement,
    ) -> Result<Self, ServerError> {
        let Listener { path, listener, mut files } = listener;
        files.served();
        Self::assemble(path, listener, files, profile, pool, ServerError::Setup, |wake| {
            DeviceState::on_pool(profile, pool, placement, handler, wake).map_err(ServerError::Setup)
        })
    }

    /// The server of a function handed over by another ([`StopHandle::hand_over`]): the same
    /// socket and client (with the bytes of a message it started), the device taken over
    /// ([`DeviceState::take_over`]) on `pool`, its requests going to `handler`.
    pub fn take_over(
        handover: ServerHandover,
        profile: &Profile,
        handler: Arc<dyn RequestHandler>,
        pool: &PollerPool,
        placement: Placement,
    ) -> Result<Self, HandoverError> {
        let ServerHandover { path, listener, files, client, device } = handover;
        listener.set_nonblocking(true)?;
        let mut server = Self::assemble(path, listener, files, profile, pool, HandoverError::Io, |wake| {
            DeviceState::take_over(profile, pool, placement, handler, wake, device)
        })?;
        server.taken = true;
        if let Some(c) = client {
            server.attach(c.sock)?;
            if let Some(conn) = server.conn.as_mut() {
                (conn.buf, conn.fds, conn.fd_overflow) = (c.pending, c.fds, c.fd_overflow);
                (conn.discard, conn.negotiated) = (c.discard, c.negotiated);
                conn.handed_over = true; // until it runs
            }
        }
        Ok(server)
    }

    /// A server on `listener` whose device `device` makes (given the control plane's waker);
    /// `setup` says how a failure to set up the event loop is reported.
    fn assemble<E>(
        path: PathBuf,
        listener: UnixListener,
        files: SocketFiles,
        profile: &Profile,
        pool: &PollerPool,
        setup: fn(io::Error) -> E,
        device: impl FnOnce(Arc<dyn Fn() + Send + Sync>) -> Result<DeviceState, E>,
    ) -> Result<Self, E> {
        let poll = Poll::new().map_err(setup)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(setup)?);
        poll.registry()
            .register(&mut SourceFd(&listener.as_raw_fd()), LISTENER, Interest::READABLE)
            .map_err(setup)?;
        let w = waker.clone();
        let wake = Arc::new(move || {
            let _ = w.wake();
        });
        let remove_timeout = Duration::from_millis(profile.remove_timeout_ms);
        let dev = device(wake)?;
        let control_cpu = pool.profile().control_cpu();
        Ok(Server {
            path,
            listener,
            files,
            poll,
            waker: waker.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            dev,
            conn: None,
            control_cpu,
            waiting: None,
            accept_again: false,
            removal: Arc::default(),
            removing: None,
            remove_timeout,
            handover: Arc::default(),
            taken: false,
            checkpoints: None,
            conn_epoch: 0,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Gives `sink` a checkpoint of the function whenever what it holds changes, from
    /// [`Server::run`] on (issue 24).
    pub fn keep_checkpoints(&mut self, sink: Arc<dyn CheckpointSink>) {
        self.checkpoints = Some((sink, (u64::MAX, u64::MAX)));
    }

    /// Gives the sink a checkpoint if the device or the connection changed since the last.
    fn checkpoint_if_changed(&mut self) {
        let now = (self.dev.epoch(), self.conn_epoch);
        match &self.checkpoints {
            Some((_, seen)) if *seen != now => {}
            _ => return,
        }
        // Only at a message boundary (the bytes of a message begun would be put back in front
        // of the socket's next ones): taken once the message is handled.
        if self.conn.as_ref().is_some_and(|c| !c.buf.is_empty() || !c.fds.is_empty()) {
            return;
        }
        let state = self.dev.checkpoint().and_then(|device| self.export(device));
        if let Some((sink, seen)) = self.checkpoints.as_mut() {
            match state {
                Ok(s) => {
                    sink.checkpoint(s);
                    *seen = now;
                }
                // Tried again at the next change; until then a crash resumes from the last.
                Err(e) => warn!("no checkpoint of the function: {e}"),
            }
        }
    }

    /// A handle that stops [`Server::run`].
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            stop: self.stop.clone(),
            waker: self.waker.clone(),
            stats: self.dev.counters().clone(),
            removal: self.removal.clone(),
            handover: self.handover.clone(),
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
        // A function taken over is this server's from now on: its connection, its socket file,
        // and its queues, resumed only now (nothing served them meanwhile).
        if std::mem::take(&mut self.taken) {
            self.files.served();
            if let Some(conn) = self.conn.as_mut() {
                conn.handed_over = false;
            }
            // Kept before a queue is served: a crash from the first request on is recovered
            // from this process's state (its backend's records), not its predecessor's.
            self.checkpoint_if_changed();
            self.dev.start_taken();
        }
        self.checkpoint_if_changed();
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
                        if self.offer_handover() {
                            return Ok(self.end_handed_over());
                        }
                    }
                    _ => {}
                }
            }
            if std::mem::take(&mut self.accept_again) {
                self.accept();
            }
            self.serve_waiting();
            self.checkpoint_if_changed();
            if self.removing.is_some_and(|r| r.expired()) {
                warn!("the client did not let the device go in {:?}: disconnecting it", self.remove_timeout);
                self.end_removal(Removal::TimedOut);
            }
        }
        self.removal.end(Removal::Stopped); // unless it ended otherwise
        info!("stopping");
        self.disconnect();
        self.files.remove_socket_file();
        // The pollers end with the device (each counts its last spell first).
        let counters = self.dev.counters().clone();
        drop(self);
        Ok(counters.snapshot())
    }

    /// Offers the function to the thread that asked for it ([`StopHandle::hand_over`]), at
    /// the quiet point; true once it was taken.
    fn offer_handover(&mut self) -> bool {
        let Some(req) = self.handover.take() else { return false };
        let offer = self.dev.hand_over().and_then(|device| self.export(device));
        let offered = offer.is_ok();
        let _ = req.offer.send(offer);
        if !offered {
            return false; // the device serves on (hand_over thawed it)
        }
        match req.answer.recv_timeout(ANSWER_BOUND) {
            Ok(true) => true,
            _ => {
                warn!("handover not taken: serving on");
                self.dev.resume_serving();
                false
            }
        }
    }

    /// What moves besides the device: new descriptors of the listening socket, the socket
    /// file's lock and the client's connection, and the client's unhandled bytes.
    fn export(&self, device: DeviceHandover) -> Result<ServerHandover, HandoverError> {
        let client = match &self.conn {
            Some(c) => Some(ClientHandover {
                sock: c.sock.try_clone()?,
                pending: c.buf.clone(),
                fds: c.fds.iter().map(File::try_clone).collect::<io::Result<_>>()?,
                fd_overflow: c.fd_overflow,
                discard: c.discard,
                negotiated: c.negotiated,
            }),
            None => None,
        };
        Ok(ServerHandover {
            path: self.path.clone(),
            listener: self.listener.try_clone()?,
            files: self.files.handed_over()?,
            client,
            device,
        })
    }

    /// Ends a server whose function was taken over: the client's connection, the socket file
    /// and the device are the taker's now; nothing is reset or shut down.
    fn end_handed_over(mut self) -> DeviceStats {
        info!("function handed over; this server ends");
        if let Some(mut conn) = self.conn.take() {
            conn.handed_over = true;
            let _ = self.poll.registry().deregister(&mut SourceFd(&conn.sock.as_raw_fd()));
        }
        self.files.keep_socket_file();
        self.removal.end(Removal::Stopped);
        let counters = self.dev.counters().clone();
        drop(self);
        counters.snapshot()
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
        self.conn_epoch += 1;
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
            handed_over: false,
        });
        Ok(())
    }

    /// Drops the client and returns the device to its power-on state (keeping the listener).
    fn disconnect(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = self.poll.registry().deregister(&mut SourceFd(&conn.sock.as_raw_fd()));
            info!("client disconnected; resetting device");
            self.conn_epoch += 1;
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
        self.files.remove_socket_file();
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
        // Kept before the client hears of it: it never sees a state a crash would lose.
        self.checkpoint_if_changed();
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
            cmd::VERSION => commands::version(payload, self.dev.max_dma_windows()),
            cmd::DMA_MAP => {
                crate::crash_point::reached(crate::crash_point::CrashPoint::DmaMapRead);
                commands::dma_map(&mut self.dev, payload, fds)
            }
            cmd::DMA_UNMAP => commands::dma_unmap(&mut self.dev, payload),
            cmd::DEVICE_GET_INFO => commands::device_info(payload),
            cmd::DEVICE_GET_REGION_INFO => commands::region_info(&self.dev, payload),
            cmd::DEVICE_GET_IRQ_INFO => commands::irq_info(&self.dev, payload),
            cmd::DEVICE_SET_IRQS => commands::set_irqs(&mut self.dev, payload, fds),
            cmd::REGION_READ => commands::region_read(&mut self.dev, payload),
            cmd::REGION_WRITE => commands::region_write(&mut self.dev, payload),
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
