//! Live update (issue 22): a new firmware takes over every function of a running daemon while
//! the guests keep their mounts.
//!
//! The process layout: with `--live-update` the process started is a small **supervisor**
//! ([`supervisor`]) that takes no guest or client input. It starts the **serving process**
//! (the same binary and arguments, confined as any daemon) and keeps a channel to it. The
//! `live_update` method of the control socket ([`Updater::live_update`]) asks the supervisor
//! to start a new serving process beside the old one, connected to it by a second channel;
//! the old one brings each function to its quiet point and hands it over ([`give`]), with its
//! descriptors (`SCM_RIGHTS`, [`channel`]) and its state as data ([`state`]); the new one
//! checks and builds everything (`daemon::take_over`), says it is ready, and serves once the
//! old one has let go. Any failure before that and the old one serves on (rollback).

pub mod backend;
pub mod channel;
pub mod give;
pub mod recovery;
pub mod state;
pub mod supervisor;

use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use virtiofs_device::vfio_user::socket_file::SocketFiles;

pub use backend::SavesState;
use channel::{Channel, ChannelError};
pub use state::Origin;

use crate::functions::{FunctionError, FunctionSet};

/// The environment variable naming the serving process's end of its supervisor channel.
pub const SUPERVISOR_FD: &str = "VIRTIOFS_DPU_SUPERVISOR_FD";
/// The environment variable naming a new serving process's end of the handover channel.
pub const TAKEOVER_FD: &str = "VIRTIOFS_DPU_TAKEOVER_FD";
/// The environment variable telling a new serving process how many descriptors the old one
/// holds (it grows its descriptor table to that while it has one thread: grown later, with
/// threads, each growth waits for an RCU grace period, inside the guests' pause).
pub const EXPECT_FDS: &str = "VIRTIOFS_DPU_EXPECT_FDS";
/// How long the supervisor may take to start a new serving process and connect it.
pub const SPAWN_BOUND: Duration = Duration::from_secs(10);

/// Why a live update did not happen (the old process serves on after each of these).
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// The daemon was not started with `--live-update`.
    #[error("live update needs a daemon started with --live-update (a supervisor to start the new process)")]
    NoSupervisor,
    /// Another update is under way.
    #[error("an update is under way already")]
    Busy,
    /// A function cannot be handed over.
    #[error("function {tag:?} ({backend}) cannot be handed over: {why}")]
    Function {
        /// The function.
        tag: String,
        /// Its backend.
        backend: &'static str,
        /// Why.
        why: String,
    },
    /// The functions could not be listed.
    #[error(transparent)]
    Functions(#[from] FunctionError),
    /// The supervisor could not start the new process.
    #[error("the new process could not be started: {0}")]
    Spawn(String),
    /// The new process reads another state format.
    #[error("the new process reads state formats {reads:?}, this one writes {writes}: refused")]
    Format {
        /// What it reads.
        reads: Vec<u32>,
        /// What this one writes.
        writes: u32,
    },
    /// The new process refused the state.
    #[error("the new process refused the state: {0}")]
    Refused(String),
    /// The channel to the supervisor or to the new process failed.
    #[error("channel")]
    Channel(#[from] ChannelError),
    /// The protocol was not followed.
    #[error("{0}")]
    Protocol(String),
    /// A function's server did not offer its state.
    #[error("function {tag:?}")]
    Handover {
        /// The function.
        tag: String,
        /// Why.
        #[source]
        source: virtiofs_device::handover::HandoverError,
    },
}

/// What the serving process and the supervisor tell each other.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SupervisorMsg {
    /// Serving process: it serves (the supervisor tells the service manager).
    Ready,
    /// Serving process: start a new serving process (this binary's path, or `binary`).
    Spawn {
        /// The binary, if not the supervisor's own.
        binary: Option<PathBuf>,
    },
    /// Supervisor: started, its process id; the handover channel's other end is attached.
    Spawned {
        /// The new process.
        pid: u32,
    },
    /// Supervisor: not started.
    SpawnFailed {
        /// Why.
        reason: String,
    },
    /// Serving process: the new process took over; it is the serving process now and this
    /// one exits.
    Committed {
        /// The new process.
        pid: u32,
    },
    /// Serving process: the update was called off; end the new process.
    Abandon {
        /// The new process.
        pid: u32,
    },
    /// Serving process (a confined one, `create_function`): bind this socket path (checked
    /// against `--allow-create sockets=DIR`, with the daemon's socket group and mode).
    Bind {
        /// The socket path, as `create_function` named it.
        path: PathBuf,
    },
    /// Supervisor: bound; the listening socket and its locked `PATH.lock` are attached.
    Bound,
    /// Supervisor: not bound.
    BindFailed {
        /// Why.
        reason: String,
    },
    /// Serving process (a confined one, `delete_function`): remove this function's socket
    /// file, if it is one of the daemon's and no server holds it. No answer.
    Unlink {
        /// The socket path.
        path: PathBuf,
    },
}

/// A copy of the control socket, kept for a live update to hand over.
pub struct ControlCopy {
    /// Its path.
    pub path: PathBuf,
    /// The listening socket.
    pub listener: UnixListener,
    /// Its files (the lock).
    pub files: SocketFiles,
}

/// The serving process's side of live updates: its supervisor channel, and what it hands over
/// besides the functions.
pub struct Updater {
    supervisor: Mutex<Channel>,
    /// The checkpoint channel's keeper, if the supervisor recovers from crashes.
    keeper: Option<Arc<recovery::CheckpointKeeper>>,
    /// Crash recoveries before this process took over (this one's start included).
    recoveries: u64,
    control: Mutex<Option<ControlCopy>>,
    /// Updates before this process started, and whether this one has handed over.
    updates: AtomicU64,
    busy: AtomicBool,
    handed_over: AtomicBool,
}

impl Updater {
    /// Over the channel to the supervisor; `updates`: the updates before this process.
    pub fn new(supervisor: Channel, updates: u64) -> Self {
        Updater {
            supervisor: Mutex::new(supervisor),
            keeper: None,
            recoveries: 0,
            control: Mutex::new(None),
            updates: AtomicU64::new(updates),
            busy: AtomicBool::new(false),
            handed_over: AtomicBool::new(false),
        }
    }

    /// The checkpoints go to `keeper` (the supervisor recovers from crashes); `recoveries`:
    /// the crash recoveries the daemon had so far.
    pub fn with_recovery(mut self, keeper: Option<Arc<recovery::CheckpointKeeper>>, recoveries: u64) -> Self {
        self.keeper = keeper;
        self.recoveries = recoveries;
        self
    }

    /// Crash recoveries the daemon had (issue 24).
    pub fn recoveries(&self) -> u64 {
        self.recoveries
    }

    /// The checkpoints this process gave its supervisor (`None`: it keeps none).
    pub fn checkpoints(&self) -> Option<recovery::CheckpointCounts> {
        self.keeper.as_ref().map(|k| k.counts())
    }

    /// Keeps a copy of the control socket to hand over (and gives the supervisor one to keep
    /// across a crash).
    pub fn keep_control(&self, copy: ControlCopy) {
        if let Some(k) = &self.keeper {
            k.keep_control(&copy);
        }
        *self.control.lock().unwrap_or_else(|e| e.into_inner()) = Some(copy);
    }

    /// Live updates this daemon has had.
    pub fn updates(&self) -> u64 {
        self.updates.load(Ordering::Relaxed)
    }

    /// Whether this process handed its functions over (it exits, leaving the socket files).
    pub fn handed_over(&self) -> bool {
        self.handed_over.load(Ordering::Acquire)
    }

    /// Asks the supervisor to bind `path` for a function made at run time (this process is
    /// confined: it can reach no host path); the listener, its lock held.
    pub fn bind(&self, path: &Path) -> Result<virtiofs_device::vfio_user::Listener, String> {
        let sup = self.supervisor.lock().unwrap_or_else(|e| e.into_inner());
        let failed = |e: ChannelError| format!("the supervisor: {}", crate::error_chain(&e));
        sup.send(&SupervisorMsg::Bind { path: path.to_path_buf() }, &[]).map_err(failed)?;
        match sup.recv(SPAWN_BOUND).map_err(failed)? {
            (SupervisorMsg::Bound, files) => {
                let n = files.len();
                let [listener, lock]: [std::fs::File; 2] =
                    files.try_into().map_err(|_| format!("the supervisor sent {n} descriptors, not 2"))?;
                let listener = UnixListener::from(OwnedFd::from(listener));
                virtiofs_device::vfio_user::Listener::bound_elsewhere(path.to_path_buf(), listener, lock)
                    .map_err(|e| crate::error_chain(&e))
            }
            (SupervisorMsg::BindFailed { reason }, _) => Err(reason),
            (other, _) => Err(format!("the supervisor answered {other:?}")),
        }
    }

    /// Asks the supervisor to remove the socket file at `path` (a function removed; this
    /// process, confined, cannot).
    pub fn unlink(&self, path: &Path) {
        let sup = self.supervisor.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = sup.send(&SupervisorMsg::Unlink { path: path.to_path_buf() }, &[]) {
            log::warn!("cannot ask the supervisor to remove {}: {}", path.display(), crate::error_chain(&e));
        }
    }

    /// Tells the supervisor that this process serves.
    pub fn ready(&self) {
        let sup = self.supervisor.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = sup.send(&SupervisorMsg::Ready, &[]) {
            log::warn!("cannot tell the supervisor READY: {}", crate::error_chain(&e));
        }
    }

    /// The `live_update` method: starts the new process (`binary`, or the supervisor's own),
    /// hands every function and the control socket over, and returns what happened. On an
    /// error this process serves on. After success the caller ends the process.
    pub fn live_update(
        &self,
        functions: &FunctionSet,
        binary: Option<PathBuf>,
    ) -> Result<Value, UpdateError> {
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(UpdateError::Busy);
        }
        let r = self.update(functions, binary);
        if r.is_err() {
            functions.handover_ended();
            self.busy.store(false, Ordering::Release);
        }
        r
    }

    fn update(&self, functions: &FunctionSet, binary: Option<PathBuf>) -> Result<Value, UpdateError> {
        let list = functions.handover_list()?;
        if let Some(f) = list.iter().find(|f| f.saver.is_none()) {
            return Err(UpdateError::Function {
                tag: f.tag.clone(),
                backend: f.backend,
                why: "its backend's state cannot be handed over".into(),
            });
        }
        let sup = self.supervisor.lock().unwrap_or_else(|e| e.into_inner());
        sup.send(&SupervisorMsg::Spawn { binary }, &[])?;
        let (pid, peer) = match sup.recv(SPAWN_BOUND)? {
            (SupervisorMsg::Spawned { pid }, mut files) if files.len() == 1 => {
                let sock = UnixStream::from(OwnedFd::from(files.remove(0)));
                (pid, Channel::new(sock).map_err(ChannelError::Io)?)
            }
            (SupervisorMsg::SpawnFailed { reason }, _) => return Err(UpdateError::Spawn(reason)),
            (other, _) => return Err(UpdateError::Protocol(format!("the supervisor answered {other:?}"))),
        };
        let control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        let commit = || self.handed_over.store(true, Ordering::Release);
        let result = give::give(&peer, list, control.as_ref(), (self.updates(), self.recoveries), commit);
        match result {
            Ok(given) => {
                // What this process kept for a crash is all sent: the supervisor gives it to
                // the new process once read (`Kept::Adopt`).
                if let Some(k) = &self.keeper {
                    k.close();
                }
                if let Err(e) = sup.send(&SupervisorMsg::Committed { pid }, &[]) {
                    log::error!("cannot tell the supervisor of the new process: {}", crate::error_chain(&e));
                }
                let p = given.phases;
                log::info!(
                    "live update: process {pid} serves {} function(s) now (pause {:.1} ms: freeze {:.1}, \
                     save {:.1}, send {:.1}, ready {:.1}); this one exits",
                    given.functions,
                    given.pause.as_secs_f64() * 1e3,
                    p.freeze_ms,
                    p.save_ms,
                    p.send_ms,
                    p.ready_ms
                );
                Ok(serde_json::json!({
                    "new_pid": pid,
                    "old_pid": std::process::id(),
                    "functions": given.functions,
                    "new_version": given.version,
                    "handover_ms": given.pause.as_secs_f64() * 1e3,
                    "phases": given.phases,
                    "updates": self.updates() + 1,
                }))
            }
            Err(e) => {
                self.handed_over.store(false, Ordering::Release);
                let _ = sup.send(&SupervisorMsg::Abandon { pid }, &[]);
                log::warn!("live update to process {pid} failed, serving on: {}", crate::error_chain(&e));
                Err(e)
            }
        }
    }
}

/// How this process was started, from its environment.
pub enum Role {
    /// A daemon on its own (or a supervisor, with `--live-update`).
    Alone,
    /// A serving process under a supervisor; `checkpoints`: the checkpoint channel, if the
    /// supervisor recovers from crashes.
    Serving {
        /// To the supervisor.
        supervisor: Channel,
        /// The checkpoint channel.
        checkpoints: Option<Channel>,
    },
    /// A new serving process taking over from the old one, or, after a crash, from the
    /// checkpoints the supervisor kept (`recovering`: the recoveries before this one).
    Taking {
        /// To the supervisor.
        supervisor: Channel,
        /// To the old process (or the supervisor replaying its checkpoints).
        peer: Channel,
        /// The checkpoint channel.
        checkpoints: Option<Channel>,
        /// Taking over after a crash.
        recovering: Option<u64>,
    },
}

impl Role {
    /// Reads [`SUPERVISOR_FD`] and [`TAKEOVER_FD`] (and removes them from the environment, so
    /// that no process this one starts sees them). Call it once, at start-up.
    pub fn from_env() -> Result<Role, String> {
        let take = |name: &str| -> Result<Option<Channel>, String> {
            let Some(v) = std::env::var_os(name) else { return Ok(None) };
            std::env::remove_var(name);
            let fd: i32 =
                v.to_str().and_then(|s| s.parse().ok()).ok_or_else(|| format!("{name}: not a number"))?;
            let fd = crate::sys::adopt_inherited_fd(fd).map_err(|e| format!("{name}={fd}: {e}"))?;
            let sock = UnixStream::from(fd);
            sock.peer_addr().map_err(|e| format!("{name}: not a connected unix socket: {e}"))?;
            Channel::new(sock).map(Some).map_err(|e| format!("{name}: {e}"))
        };
        let supervisor = take(SUPERVISOR_FD)?;
        let peer = take(TAKEOVER_FD)?;
        let checkpoints = take(recovery::CHECKPOINT_FD)?;
        let recovering = match std::env::var_os(recovery::RECOVERING) {
            Some(v) => {
                std::env::remove_var(recovery::RECOVERING);
                let n = v.to_str().and_then(|s| s.parse().ok());
                Some(n.ok_or_else(|| format!("{}: not a number", recovery::RECOVERING))?)
            }
            None => None,
        };
        if let Some(s) = &supervisor {
            // The supervisor made the channel's socket pair: its pid is the peer's. A serving
            // process ends (orderly, SIGTERM) when its supervisor does, however it ends.
            let (pid, _, _) =
                crate::sys::peer_credentials(s.socket()).map_err(|e| format!("{SUPERVISOR_FD}: {e}"))?;
            let pid = u32::try_from(pid).map_err(|_| format!("{SUPERVISOR_FD}: no peer process"))?;
            match crate::sys::end_with_parent(pid, libc::SIGTERM) {
                Ok(true) => {}
                Ok(false) => return Err(format!("the supervisor (pid {pid}) is gone")),
                Err(e) => return Err(format!("cannot tie this process to its supervisor: {e}")),
            }
        }
        Ok(match (supervisor, peer) {
            (None, None) => Role::Alone,
            (Some(supervisor), None) => Role::Serving { supervisor, checkpoints },
            (Some(supervisor), Some(peer)) => Role::Taking { supervisor, peer, checkpoints, recovering },
            (None, Some(_)) => return Err(format!("{TAKEOVER_FD} without {SUPERVISOR_FD}")),
        })
    }
}

/// Ends this process shortly after a live update handed everything over: long enough for the
/// control socket to send the `live_update` answer, then the orderly stop (SIGTERM), which
/// leaves the socket files to the new process ([`Updater::handed_over`]).
pub fn exit_after_answer() {
    let _ = std::thread::Builder::new().name("handed-over".into()).spawn(|| {
        let deadline = std::time::Instant::now() + Duration::from_millis(200);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            std::thread::park_timeout(left);
        }
        let _ = signal_hook::low_level::raise(signal_hook::consts::SIGTERM);
    });
}

impl crate::functions::SocketBinder for Updater {
    fn bind(&self, path: &Path) -> Result<virtiofs_device::vfio_user::Listener, String> {
        Updater::bind(self, path)
    }

    fn unlink(&self, path: &Path) {
        Updater::unlink(self, path)
    }
}
