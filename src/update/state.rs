//! What a live update moves, as messages of the handover [`Channel`](super::channel::Channel):
//! the typed state of each function and of the control socket, and the order of the
//! descriptors that travel with each.
//!
//! The state is self-describing (JSON, named fields) and versioned twice over: the whole
//! handover by [`STATE_VERSION`] (the new process says which versions it reads,
//! [`FORMATS_READ`], and the old one refuses to go on if its own is not among them), and each
//! part by its own version (the device snapshot's, the FUSE session's, the RAM filesystem's),
//! checked again where it is restored.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use virtiofs_backend::nfs::state::NfsState;
use virtiofs_backend::passthrough::state::{PassthroughChanges, PassthroughState};
use virtiofs_backend::ramfs::state::{RamFsChanges, RamFsState};
use virtiofs_backend::server::SessionState;
use virtiofs_device::handover::{DeviceHandover, DeviceSnapshot, HandoverFiles};
use virtiofs_device::vfio_user::handover::{ClientHandover, ServerHandover};
use virtiofs_device::vfio_user::socket_file::SocketFiles;

/// The handover format this firmware writes: 3, which adds to 2 the copy of a RAM
/// filesystem or a shared directory ahead of the quiet point ([`Msg::Precopy`],
/// [`Msg::PrecopyEnd`], [`Msg::Precopied`], the backends' `...Copy` and `...Changes` parts)
/// and changes nothing of 2's messages. (2: messages and backend parts externally tagged,
/// `{"function": {...}}`, which serde reads in one pass; 1, internally tagged, was never
/// released.)
pub const STATE_VERSION: u32 = 3;
/// The format before [`STATE_VERSION`]: the whole RAM filesystem at the quiet point. Written
/// to a new process that reads no newer one (a downgrade), read from an old process that
/// writes no newer one.
pub const PREVIOUS_VERSION: u32 = 2;
/// The handover formats this firmware reads: its own and the previous one.
pub const FORMATS_READ: &[u32] = &[PREVIOUS_VERSION, STATE_VERSION];

/// The messages of a live update, in the order they go. Externally tagged: an internally
/// tagged enum makes serde buffer the whole message before reading it, which cost 16 ms for
/// the 0.75 MB of a shared directory of 10,000 nodes. [`Msg::Hello`]'s encoding
/// (`{"hello":{"reads":[...],...}}`) stays as it is in every format, so that any two versions
/// can tell which formats they share.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Msg {
    /// New to old, once it is ready to take over: which formats it reads, and who it is.
    Hello {
        /// [`FORMATS_READ`].
        reads: Vec<u32>,
        /// Its version (`CARGO_PKG_VERSION`).
        version: String,
        /// Its process id.
        pid: u32,
    },
    /// Old to new, before anything is frozen (format 3): a backend's state copied while it
    /// serves (descriptors: the backend's, as for its [`FunctionPart`]).
    Precopy(Box<PrecopyPart>),
    /// Old to new: that was every copy; build them and say [`Msg::Precopied`].
    PrecopyEnd,
    /// New to old: every copy is built; the old process may freeze the functions.
    Precopied,
    /// Old to new, before a function whose copy was given up (more changed than its logs
    /// keep) comes whole: drop the copy now, so that its descriptors are closed before the
    /// whole state's arrive.
    DropCopy {
        /// The function's tag.
        tag: String,
    },
    /// Old to new: the control socket (descriptors: the listener, then the lock if any).
    Control(ControlPart),
    /// Old to new: one function (descriptors: in the order [`FunctionPart`] names them).
    Function(Box<FunctionPart>),
    /// Old to new: that was every function.
    End {
        /// Live updates this daemon had before this one.
        updates: u64,
        /// Crash recoveries this daemon had (absent from an older process: 0).
        #[serde(default)]
        recoveries: u64,
    },
    /// New to old: every part was checked and taken; the new process serves once committed.
    Ready,
    /// New to old: a part was refused (the old process serves on).
    Refused {
        /// Why.
        reason: String,
    },
    /// Old to new: the old process has let go; serve.
    Commit,
    /// Old to new: the update is called off (the old process serves on); exit.
    Abort {
        /// Why.
        reason: String,
    },
}

/// The control socket, handed over.
#[derive(Debug, Serialize, Deserialize)]
pub struct ControlPart {
    /// Its path.
    pub path: PathBuf,
    /// The socket file the taker removes when it stops.
    pub socket_file: Option<PathBuf>,
    /// A lock descriptor follows the listener.
    pub lock: bool,
}

/// How a function came to be: from the command line and profile (the new process finds it in
/// its own spec, by tag), or by `create_function` (the new process reads the same table).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// The daemon's command line and profile.
    Start,
    /// `create_function` with this table.
    Created(toml::Table),
}

/// The client of a function, handed over (its connection is the next descriptor).
#[derive(Debug, Serialize, Deserialize)]
pub struct ClientPart {
    /// The bytes of a message it started, not handled yet.
    pub pending: Vec<u8>,
    /// The descriptors that came with them (next in order).
    pub fds: usize,
    /// Descriptors of that message were dropped by the kernel.
    pub fd_overflow: bool,
    /// Bytes of a refused message still to drop.
    pub discard: u64,
    /// VERSION was negotiated.
    pub negotiated: bool,
}

/// A backend's state copied while its function serves, ahead of the quiet point.
#[derive(Debug, Serialize, Deserialize)]
pub struct PrecopyPart {
    /// Its function's tag.
    pub tag: String,
    /// Where its function's description comes from.
    pub origin: Origin,
    /// The copy.
    pub backend: BackendPart,
}

/// A function's backend, handed over.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendPart {
    /// A RAM filesystem at the quiet point, whole (format 2): its state and its session; its
    /// data memfd is the last descriptor.
    Ramfs {
        /// The filesystem but its data.
        fs: Box<RamFsState>,
        /// The FUSE session.
        session: SessionState,
    },
    /// A RAM filesystem copied while it served (in a [`PrecopyPart`]); its data memfd is the
    /// last descriptor.
    RamfsCopy {
        /// The filesystem but its data, as the copy found it.
        fs: Box<RamFsState>,
    },
    /// A RAM filesystem at the quiet point, after a [`BackendPart::RamfsCopy`]: what changed
    /// since, and its session; no descriptor.
    RamfsChanges {
        /// The changes.
        changes: Box<RamFsChanges>,
        /// The FUSE session.
        session: SessionState,
    },
    /// A shared directory copied while it served (in a [`PrecopyPart`]); each node's and each
    /// handle's descriptor follow, in the state's order.
    PassthroughCopy {
        /// The node table and handles, as the copy found them.
        fs: Box<PassthroughState>,
    },
    /// A shared directory at the quiet point, after a [`BackendPart::PassthroughCopy`]: what
    /// changed since, and its session; the descriptors of new nodes and handles follow.
    PassthroughChanges {
        /// The changes.
        changes: Box<PassthroughChanges>,
        /// The FUSE session.
        session: SessionState,
    },
    /// A shared directory: its node table and handles and its session; each node's and each
    /// handle's descriptor follow, in the state's order.
    Passthrough {
        /// The node table and handles.
        fs: Box<PassthroughState>,
        /// The FUSE session.
        session: SessionState,
    },
    /// A checkpoint's backend (crash recovery, issue 24): nothing of its state survives the
    /// process that served it; the new process opens it anew from its description, answers
    /// the requests that were in flight and every new one with an error until the driver
    /// resets the device, then serves it afresh. No descriptor.
    Fresh,
    /// A checkpoint's NFS export (crash recovery, issue 24): its state is in records the
    /// process that served it kept as it changed; its descriptors: the memfd of the UNSTABLE
    /// store's bytes, the records' memfd (`nfs::keep`), the FUSE session's record
    /// (`session_record`).
    NfsKept,
    /// A checkpoint's shared directory (crash recovery, issue 24): its nodes' records and the
    /// descriptors the supervisor held for it. Its descriptors: the records' memfd
    /// (`passthrough::keep`), the FUSE session's record, then one per `held` item.
    PassthroughKept {
        /// What each held descriptor is, by key (node id, or handle id with the top bit):
        /// filled in by the supervisor as it replays the checkpoint (empty as sent).
        #[serde(default)]
        held: Vec<(u64, virtiofs_backend::passthrough::keep::HeldItem)>,
        /// Set by the supervisor when the held descriptors may miss some (a live update's
        /// predecessor whose checkpoints were not all read): the share is not recovered.
        #[serde(default)]
        incomplete: bool,
    },
    /// An NFS export: its mount, node table, handles and UNSTABLE store, and its session; the
    /// memfd of the store's bytes is the last descriptor.
    Nfs {
        /// The export's state.
        fs: Box<NfsState>,
        /// The FUSE session.
        session: SessionState,
    },
}

/// One function, handed over. Its descriptors, in order: the listening socket, the socket's lock
/// (if [`Self::lock`]), the client's connection and the descriptors of the message it started
/// (if [`Self::client`]), the device's DMA window files, MSI-X eventfds, device-request eventfd,
/// doorbells' area and in-flight record (as its snapshot marks them), then the backend's (the
/// RAM filesystem's data memfd).
#[derive(Debug, Serialize, Deserialize)]
pub struct FunctionPart {
    /// Its tag.
    pub tag: String,
    /// Where its description comes from.
    pub origin: Origin,
    /// Its vfio-user socket's path.
    pub path: PathBuf,
    /// The socket file the taker removes when it stops.
    pub socket_file: Option<PathBuf>,
    /// A lock descriptor follows the listener.
    pub lock: bool,
    /// Its client, if one is connected.
    pub client: Option<ClientPart>,
    /// The device.
    pub device: DeviceSnapshot,
    /// The backend.
    pub backend: BackendPart,
}

/// A function's server state as a part and its descriptors (the backend's part and files are
/// the caller's to add).
pub fn server_part(
    h: ServerHandover,
) -> (PathBuf, Option<PathBuf>, bool, Option<ClientPart>, DeviceHandover, Vec<OwnedFd>) {
    let ServerHandover { path, listener, files, client, device } = h;
    let (socket_file, lock) = files.into_parts();
    let mut all: Vec<OwnedFd> = vec![listener.into()];
    let has_lock = lock.is_some();
    all.extend(lock.map(OwnedFd::from));
    let client = client.map(|c| {
        all.push(c.sock.into());
        let fds = c.fds.len();
        all.extend(c.fds.into_iter().map(OwnedFd::from));
        ClientPart {
            pending: c.pending,
            fds,
            fd_overflow: c.fd_overflow,
            discard: c.discard,
            negotiated: c.negotiated,
        }
    });
    (path, socket_file, has_lock, client, device, all)
}

/// The device's descriptors, in [`FunctionPart`]'s order.
pub fn device_files(files: HandoverFiles) -> Vec<OwnedFd> {
    let HandoverFiles { windows, msix, request, notify, inflight } = files;
    let mut all: Vec<OwnedFd> = windows.into_iter().map(OwnedFd::from).collect();
    all.extend(msix.into_iter().map(OwnedFd::from));
    all.extend(request.map(OwnedFd::from));
    all.extend(notify.map(OwnedFd::from));
    all.extend(inflight.map(OwnedFd::from));
    all
}

/// Takes descriptors off the front of a received message's, in order.
pub struct Files(std::vec::IntoIter<File>);

impl Files {
    /// Over what a message brought.
    pub fn new(files: Vec<File>) -> Self {
        Files(files.into_iter())
    }

    /// The next one, or an error naming what is missing.
    pub fn next(&mut self, what: &str) -> Result<File, String> {
        self.0.next().ok_or_else(|| format!("the descriptor of {what} is missing"))
    }

    /// Every descriptor not taken yet.
    pub fn rest(self) -> Vec<File> {
        self.0.collect()
    }

    /// Fails if descriptors are left over.
    pub fn finish(mut self) -> Result<(), String> {
        match self.0.next() {
            None => Ok(()),
            Some(_) => Err(format!("{} descriptors more than the state names", 1 + self.0.len())),
        }
    }
}

/// The server state of a received [`FunctionPart`], its descriptors taken from `files`.
pub fn server_handover(part: &mut FunctionPart, files: &mut Files) -> Result<ServerHandover, String> {
    let listener = UnixListener::from(OwnedFd::from(files.next("the listening socket")?));
    let lock = if part.lock { Some(files.next("the socket's lock")?) } else { None };
    let client = match part.client.take() {
        Some(c) => {
            let sock = UnixStream::from(OwnedFd::from(files.next("the client's connection")?));
            let fds = (0..c.fds).map(|_| files.next("the client's message")).collect::<Result<_, _>>()?;
            Some(ClientHandover {
                sock,
                pending: c.pending,
                fds,
                fd_overflow: c.fd_overflow,
                discard: c.discard,
                negotiated: c.negotiated,
            })
        }
        None => None,
    };
    let s = &part.device;
    let mut hf = HandoverFiles::default();
    for _ in s.windows.iter().filter(|w| w.offset.is_some()) {
        hf.windows.push(files.next("a DMA window")?);
    }
    for _ in s.msix_fds.iter().filter(|&&set| set) {
        hf.msix.push(files.next("an interrupt eventfd")?);
    }
    hf.request = if s.request_fd { Some(files.next("the device-request eventfd")?) } else { None };
    hf.notify = if s.notify_mem { Some(files.next("the doorbells' area")?) } else { None };
    hf.inflight = if s.inflight { Some(files.next("the in-flight record")?) } else { None };
    Ok(ServerHandover {
        path: part.path.clone(),
        listener,
        files: SocketFiles::from_parts(part.socket_file.clone(), lock),
        client,
        device: DeviceHandover { snapshot: part.device.clone(), files: hf },
    })
}
