//! A running vfio-user server handing its function over to another server (issue 22, live
//! update): what moves ([`ServerHandover`]: the listening socket, the connected client with
//! the bytes and descriptors of a message it started, and the device's
//! [`DeviceHandover`]), and the two-step exchange with the
//! thread that asked for it: the server offers its state at a message
//! boundary with its function at the quiet point, then waits for the answer: taken (it exits
//! without touching the client or the device) or not (it serves on). Bounded: an answer that
//! does not come within [`ANSWER_BOUND`] counts as not taken.

use std::fs::File;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Mutex;
use std::time::Duration;

use super::socket_file::SocketFiles;
use crate::handover::{DeviceHandover, HandoverError};

/// How long a server whose state was offered waits for the answer before it serves on.
pub const ANSWER_BOUND: Duration = Duration::from_secs(10);
/// How long [`super::StopHandle::hand_over`] waits for the server to offer its state.
pub const OFFER_BOUND: Duration = Duration::from_secs(5);

/// The client of a server handed over.
#[derive(Debug)]
pub struct ClientHandover {
    /// Its connection.
    pub sock: UnixStream,
    /// The bytes of a message it started sending (header first), not handled yet.
    pub pending: Vec<u8>,
    /// The descriptors that came with them.
    pub fds: Vec<File>,
    /// Descriptors of that message were dropped by the kernel.
    pub fd_overflow: bool,
    /// Bytes of a refused message still to drop.
    pub discard: u64,
    /// VERSION was negotiated.
    pub negotiated: bool,
}

/// A vfio-user server's function, handed over.
#[derive(Debug)]
pub struct ServerHandover {
    /// The socket's path.
    pub path: PathBuf,
    /// The listening socket.
    pub listener: UnixListener,
    /// The socket file and its lock, now the taker's.
    pub files: SocketFiles,
    /// The connected client, if any.
    pub client: Option<ClientHandover>,
    /// The device.
    pub device: DeviceHandover,
}

/// Where a server's checkpoints go (issue 24, crash recovery): the process that keeps them so
/// that one started after a crash can take the function over ([`super::Server::take_over`]).
/// Given one whenever what it holds changed (a client came or went, the device's registers,
/// DMA windows or interrupt descriptors changed), before the client is answered; the device's
/// part is a [`crate::control::DeviceState::checkpoint`].
pub trait CheckpointSink: Send + Sync {
    /// The function's state as it stands now, replacing the previous one.
    fn checkpoint(&self, state: ServerHandover);
}

/// What the asking thread and the server tell each other.
pub(super) struct Request {
    /// The server's offer.
    pub(super) offer: SyncSender<Result<ServerHandover, HandoverError>>,
    /// The answer: true once the taker serves the function.
    pub(super) answer: Receiver<bool>,
}

/// A handover asked of a server, waiting for its control plane.
#[derive(Default)]
pub(super) struct HandoverCell(Mutex<Option<Request>>);

impl HandoverCell {
    /// Files a request; the asker's ends of its two channels.
    pub(super) fn ask(&self) -> (Receiver<Result<ServerHandover, HandoverError>>, SyncSender<bool>) {
        let (offer, offers) = sync_channel(1);
        let (answers, answer) = sync_channel(1);
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Request { offer, answer });
        (offers, answers)
    }

    /// The request, if one is waiting.
    pub(super) fn take(&self) -> Option<Request> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The asker's side of an offered handover: say whether the function was taken.
#[derive(Debug)]
pub struct Answer(pub(super) SyncSender<bool>);

impl Answer {
    /// The taker serves the function: the old server exits without touching the client or the
    /// device.
    /// False if the server no longer waited for the answer (it serves on).
    pub fn taken(self) -> bool {
        self.0.send(true).is_ok()
    }

    /// The handover did not go through: the old server serves on.
    pub fn not_taken(self) {
        let _ = self.0.send(false);
    }
}
