//! The supervisor (`--live-update`): a small process that takes no guest or client input. It
//! starts the serving process (this binary, with the same arguments, confined as any daemon),
//! and on a live update starts the new one beside it, connected to the old one. It tells the
//! service manager READY=1 when the first serving process serves, forwards SIGTERM, SIGINT,
//! SIGUSR1 and SIGHUP to the serving process, and exits with its status when it ends.
//!
//! What it accepts from a serving process (over the channel each one gets at its start) is
//! checked like any input: a request to start a binary other than its own is refused unless
//! that binary lies in the directory `--update-binary-dir` names; one update at a time.
//!
//! Not done here yet: binding the sockets (each serving process binds its own, and hands them
//! over), restarting a serving process that died (issue 24: the supervisor exits with its
//! status, as the daemon did before).

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::Duration;

use log::{error, info, warn};
use signal_hook::consts::{SIGHUP, SIGINT, SIGKILL, SIGTERM, SIGUSR1};

use super::channel::{Channel, ChannelError};
use super::{SupervisorMsg, EXPECT_FDS, SUPERVISOR_FD, TAKEOVER_FD};
use crate::error_chain;
use crate::ops::deploy::{Notifier, SUPERVISED_LISTEN_FD};
use crate::settings::AllowCreate;
use crate::sys;
use virtiofs_device::vfio_user::socket_file::{bind_exclusive_with, remove_unserved, SocketAccess};

/// What the supervisor's loop hears.
enum Event {
    Msg(u32, SupervisorMsg),
    Exited(u32, ExitStatus),
    Signal(i32),
}

/// A serving process.
struct Proc {
    pid: u32,
    chan: Arc<Channel>,
}

/// How the supervisor starts serving processes.
pub struct Launch {
    /// Its own binary (the path a package update replaces).
    pub binary: PathBuf,
    /// The arguments the serving process gets (the supervisor's own).
    pub args: Vec<OsString>,
    /// Where other binaries may come from (`--update-binary-dir`), canonical.
    pub binary_dir: Option<PathBuf>,
    /// What this supervisor binds and removes for a confined serving process.
    pub sockets: SocketRules,
    /// The socket systemd's activation gave the supervisor, passed on to every serving process
    /// (inherited, named by [`SUPERVISED_LISTEN_FD`]).
    pub activated: Option<OwnedFd>,
}

/// The sockets a supervisor binds and removes for its serving process, which, confined, can
/// reach no host path: `create_function`'s (only where `--allow-create sockets=DIR` allows),
/// and, when a function goes, its socket file (one of the command line's, or in those
/// directories; never one a server still holds).
#[derive(Debug, Default)]
pub struct SocketRules {
    /// The command line's and profile's function sockets (canonical directory, name).
    pub functions: Vec<PathBuf>,
    /// `--allow-create`.
    pub allow: Option<AllowCreate>,
    /// `--socket-group`, `--socket-mode`.
    pub access: (Option<u32>, Option<u32>),
}

impl SocketRules {
    /// The sockets of `spec`.
    pub fn of(spec: &crate::settings::DaemonSpec) -> SocketRules {
        let functions = (spec.functions.iter())
            .filter_map(|f| match &f.socket {
                crate::settings::Socket::SocketPath(p) => canonical(p),
                _ => None,
            })
            .collect();
        SocketRules {
            functions,
            allow: spec.defaults.allow_create.clone(),
            access: spec.defaults.socket_access,
        }
    }

    /// Binds `path` for `create_function`: the listener and its lock file, locked.
    fn bind(&self, path: &Path) -> Result<(std::os::unix::net::UnixListener, std::fs::File), String> {
        let allow = self.allow.as_ref().ok_or("create_function is off (no --allow-create)")?;
        let path = allow.socket_path(path)?;
        let (group, mode) = self.access;
        let (listener, files) =
            bind_exclusive_with(&path, SocketAccess { group, mode }).map_err(|e| error_chain(&e))?;
        let (_, lock) = files.into_parts();
        let lock = lock.ok_or("the socket's lock is missing")?;
        Ok((listener, lock))
    }

    /// Removes the socket file at `path` if it is one of the daemon's and nobody serves it.
    fn unlink(&self, path: &Path) -> Result<bool, String> {
        let full = canonical(path).ok_or_else(|| format!("{}: no such directory", path.display()))?;
        let allowed = self.functions.contains(&full)
            || self
                .allow
                .as_ref()
                .is_some_and(|a| full.parent().is_some_and(|d| a.sockets.iter().any(|s| s == d)));
        if !allowed {
            return Err(format!("{}: not a socket of this daemon's", path.display()));
        }
        remove_unserved(&full).map_err(|e| format!("{}: {e}", full.display()))
    }
}

/// `path` with its directory canonical (the name itself is not followed).
fn canonical(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.canonicalize().ok()?,
        _ => std::env::current_dir().ok()?,
    };
    Some(dir.join(name))
}

impl Launch {
    /// The binary a `Spawn` asks for, if allowed.
    fn binary(&self, asked: Option<&Path>) -> Result<PathBuf, String> {
        let Some(p) = asked else { return Ok(self.binary.clone()) };
        let dir = self.binary_dir.as_ref().ok_or_else(|| {
            format!("{}: another binary needs a supervisor started with --update-binary-dir", p.display())
        })?;
        let real = p.canonicalize().map_err(|e| format!("{}: {e}", p.display()))?;
        if !real.starts_with(dir) || !real.is_file() {
            return Err(format!("{}: not a file in --update-binary-dir {}", p.display(), dir.display()));
        }
        Ok(real)
    }

    /// Starts `binary` as a serving process; `peer`: its end of a handover channel.
    fn spawn(
        &self,
        binary: &Path,
        peer: Option<UnixStream>,
        events: &Sender<Event>,
    ) -> std::io::Result<Proc> {
        self.spawn_expecting(binary, peer, None, events)
    }

    /// As [`Self::spawn`]; `expect_fds`: the descriptors the process it takes over holds.
    fn spawn_expecting(
        &self,
        binary: &Path,
        peer: Option<UnixStream>,
        expect_fds: Option<usize>,
        events: &Sender<Event>,
    ) -> std::io::Result<Proc> {
        let (mine, theirs) = UnixStream::pair()?;
        sys::set_inherited(&theirs.as_fd(), true)?;
        let mut cmd = Command::new(binary);
        cmd.args(&self.args).env(SUPERVISOR_FD, theirs.as_raw_fd().to_string()).env_remove("NOTIFY_SOCKET");
        if let Some(fd) = &self.activated {
            sys::set_inherited(&fd.as_fd(), true)?;
            cmd.env(SUPERVISED_LISTEN_FD, fd.as_raw_fd().to_string());
        }
        if let Some(p) = &peer {
            sys::set_inherited(&p.as_fd(), true)?;
            cmd.env(TAKEOVER_FD, p.as_raw_fd().to_string());
        }
        if let Some(n) = expect_fds {
            cmd.env(EXPECT_FDS, n.to_string());
        }
        let mut child = cmd.spawn()?;
        drop((theirs, peer));
        let pid = child.id();
        let tx = events.clone();
        std::thread::Builder::new().name(format!("wait-{pid}")).spawn(move || {
            let status = child.wait().unwrap_or_else(|_| ExitStatus::from_raw(1 << 8));
            let _ = tx.send(Event::Exited(pid, status));
        })?;
        let chan = Arc::new(Channel::new(mine)?);
        let (c, tx) = (chan.clone(), events.clone());
        std::thread::Builder::new().name(format!("chan-{pid}")).spawn(move || loop {
            match c.recv::<SupervisorMsg>(Duration::from_secs(3600)) {
                Ok((m, _)) => {
                    if tx.send(Event::Msg(pid, m)).is_err() {
                        return;
                    }
                }
                Err(ChannelError::Timeout(_)) => {}
                Err(ChannelError::Closed) => return,
                Err(e) => {
                    warn!("supervisor: process {pid}: {}", error_chain(&e));
                    return;
                }
            }
        })?;
        info!("supervisor: started serving process {pid} ({})", binary.display());
        Ok(Proc { pid, chan })
    }
}

/// Runs the supervisor until the serving process ends; its exit status.
pub fn run(launch: Launch) -> ExitCode {
    let (tx, events) = channel();
    let notifier = match Notifier::from_env() {
        Ok(n) => n,
        Err(e) => {
            error!("{}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGUSR1, SIGHUP]);
    let mut signals = match signals {
        Ok(s) => s,
        Err(e) => {
            error!("supervisor: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stx = tx.clone();
    let _ = std::thread::Builder::new().name("signals".into()).spawn(move || {
        for s in signals.forever() {
            if stx.send(Event::Signal(s)).is_err() {
                return;
            }
        }
    });
    let mut current = match launch.spawn(&launch.binary, None, &tx) {
        Ok(p) => p,
        Err(e) => {
            error!("supervisor: cannot start {}: {e}", launch.binary.display());
            return ExitCode::FAILURE;
        }
    };
    let mut pending: Option<Proc> = None;
    let (mut ready, mut stopping, mut updates) = (false, false, 0u64);
    while let Ok(ev) = events.recv() {
        match ev {
            Event::Msg(pid, SupervisorMsg::Ready) if pid == current.pid => {
                if !ready {
                    ready = true;
                    if let Some(n) = &notifier {
                        match n.notify(&format!("READY=1\nMAINPID={}", std::process::id())) {
                            Ok(()) => info!("told the service manager READY=1"),
                            Err(e) => warn!("{}", error_chain(&e)),
                        }
                    }
                }
            }
            Event::Msg(pid, SupervisorMsg::Spawn { binary }) if pid == current.pid => {
                let answer = if pending.is_some() {
                    Err("an update is under way already".to_string())
                } else {
                    launch.binary(binary.as_deref()).and_then(|b| {
                        let (old_end, new_end) = UnixStream::pair().map_err(|e| e.to_string())?;
                        // What the new process will receive, about: the old one's descriptors.
                        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).ok();
                        let p = launch
                            .spawn_expecting(&b, Some(new_end), fds, &tx)
                            .map_err(|e| format!("{}: {e}", b.display()))?;
                        Ok((p, old_end))
                    })
                };
                let sent = match answer {
                    Ok((p, old_end)) => {
                        let r = current.chan.send(&SupervisorMsg::Spawned { pid: p.pid }, &[old_end.as_fd()]);
                        pending = Some(p);
                        r
                    }
                    Err(reason) => {
                        warn!("supervisor: update refused: {reason}");
                        current.chan.send(&SupervisorMsg::SpawnFailed { reason }, &[])
                    }
                };
                if let Err(e) = sent {
                    warn!("supervisor: cannot answer process {}: {}", current.pid, error_chain(&e));
                }
            }
            Event::Msg(pid, SupervisorMsg::Committed { pid: new }) if pid == current.pid => {
                match pending.take() {
                    Some(p) if p.pid == new => {
                        updates += 1;
                        info!("supervisor: update {updates}: process {new} serves; {pid} exits");
                        current = p;
                    }
                    other => {
                        warn!("supervisor: process {pid} says {new} took over, which it did not start");
                        pending = other;
                    }
                }
            }
            Event::Msg(pid, SupervisorMsg::Bind { path }) if pid == current.pid => {
                let sent = match launch.sockets.bind(&path) {
                    Ok((listener, lock)) => {
                        info!("supervisor: bound {} for process {pid}", path.display());
                        let r = current.chan.send(&SupervisorMsg::Bound, &[listener.as_fd(), lock.as_fd()]);
                        if r.is_err() {
                            let _ = std::fs::remove_file(&path);
                        }
                        r
                    }
                    Err(reason) => {
                        warn!("supervisor: not binding {} for process {pid}: {reason}", path.display());
                        current.chan.send(&SupervisorMsg::BindFailed { reason }, &[])
                    }
                };
                if let Err(e) = sent {
                    warn!("supervisor: cannot answer process {}: {}", current.pid, error_chain(&e));
                }
            }
            Event::Msg(pid, SupervisorMsg::Unlink { path }) if pid == current.pid => {
                match launch.sockets.unlink(&path) {
                    Ok(true) => info!("supervisor: removed the socket file {}", path.display()),
                    Ok(false) => {}
                    Err(e) => warn!("supervisor: not removing {}: {e}", path.display()),
                }
            }
            Event::Msg(pid, SupervisorMsg::Abandon { pid: new }) if pid == current.pid => {
                if let Some(p) = pending.take_if(|p| p.pid == new) {
                    info!("supervisor: update to process {new} called off; ending it");
                    let _ = sys::signal_process(p.pid, SIGKILL);
                }
            }
            Event::Msg(pid, m) => {
                if pending.as_ref().is_none_or(|p| p.pid != pid) || !matches!(m, SupervisorMsg::Ready) {
                    warn!("supervisor: ignored {m:?} from process {pid}");
                }
            }
            Event::Exited(pid, status) if pid == current.pid => {
                if !stopping {
                    error!("supervisor: the serving process {pid} ended ({status}) unasked; the daemon ends");
                }
                if let Some(p) = pending.take() {
                    let _ = sys::signal_process(p.pid, SIGKILL);
                }
                return exit_code(status);
            }
            Event::Exited(pid, status) => {
                if pending.as_ref().is_some_and(|p| p.pid == pid) {
                    pending = None;
                    warn!("supervisor: the new process {pid} ended ({status}) before taking over");
                } else {
                    info!("supervisor: process {pid} ended ({status})");
                }
            }
            Event::Signal(sig) => {
                stopping |= sig == SIGTERM || sig == SIGINT;
                if let Err(e) = sys::signal_process(current.pid, sig) {
                    warn!("supervisor: cannot signal process {}: {e}", current.pid);
                }
            }
        }
    }
    ExitCode::FAILURE
}

/// The serving process's exit status as the supervisor's.
fn exit_code(status: ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)),
        _ => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the supervisor binds and removes for a confined serving process: a socket in the
    /// allowed directory only; a removal only of one of the daemon's sockets, only while no
    /// server holds its lock, never anything else.
    #[test]
    fn the_supervisor_binds_and_removes_only_the_daemons_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let socks = dir.path().join("socks");
        std::fs::create_dir(&socks).unwrap();
        let arg = format!("sockets={}", socks.display());
        let allow = AllowCreate::from_args(&[arg]).unwrap();
        let fixed = dir.path().join("fixed.sock");
        let rules = SocketRules { functions: vec![canonical(&fixed).unwrap()], allow, access: (None, None) };

        let outside = dir.path().join("outside.sock");
        assert!(rules.bind(&outside).unwrap_err().contains("not allowed"));
        assert!(!outside.exists());
        let made = socks.join("made.sock");
        let (listener, lock) = rules.bind(&made).unwrap();
        // Held (the lock is open): not removed.
        assert_eq!(rules.unlink(&made), Ok(false));
        assert!(made.exists());
        drop((listener, lock));
        assert_eq!(rules.unlink(&made), Ok(true));
        assert!(!made.exists());
        // Not one of the daemon's: refused, whatever it is.
        let other = dir.path().join("other.sock");
        let _l = std::os::unix::net::UnixListener::bind(&other).unwrap();
        assert!(rules.unlink(&other).unwrap_err().contains("not a socket of this daemon"));
        assert!(other.exists());
        // One of the daemon's that is not a socket: left alone.
        std::fs::write(&fixed, b"a file").unwrap();
        assert_eq!(rules.unlink(&fixed), Ok(false));
        assert!(fixed.exists());
    }
}
