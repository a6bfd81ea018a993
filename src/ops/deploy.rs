//! What a supervisor needs of the daemon: the vfio-user socket's group and mode (a QEMU or
//! libvirt that is not root connects), a listening socket handed over as a descriptor (`--fd N`,
//! or systemd socket activation: `LISTEN_PID` and `LISTEN_FDS`), and `sd_notify` readiness
//! (`READY=1` to `NOTIFY_SOCKET` once the socket listens), without a system library.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixListener};

/// Why a deployment step failed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// `--socket-group` names no group of `/etc/group`.
    #[error("group {0}: no such group in /etc/group")]
    NoSuchGroup(String),
    /// The group file could not be read.
    #[error("group {group}: cannot read /etc/group")]
    GroupFile {
        /// The group asked for.
        group: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A command-line flag is wrong (the message names it).
    #[error("{0}")]
    Usage(String),
    /// The descriptor handed over is not a listening unix socket.
    #[error("--fd {fd}: {why}")]
    BadFd {
        /// The descriptor.
        fd: i32,
        /// What is wrong with it.
        why: String,
    },
    /// `NOTIFY_SOCKET` could not be told.
    #[error("NOTIFY_SOCKET {path}")]
    Notify {
        /// The socket's address.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// The gid of `group`: a number, or a name looked up in `/etc/group`.
pub fn group_id(group: &str) -> Result<u32, DeployError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let text = std::fs::read_to_string("/etc/group")
        .map_err(|source| DeployError::GroupFile { group: group.into(), source })?;
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let gid = f.nth(1)?.parse::<u32>().ok()?;
            (name == group).then_some(gid)
        })
        .next()
        .ok_or_else(|| DeployError::NoSuchGroup(group.into()))
}

/// Parses an octal mode such as `0660` or `660`.
pub fn parse_mode(s: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|e| format!("{s:?}: not an octal mode: {e}"))?;
    if m > 0o7777 {
        return Err(format!("{s:?}: more than 0o7777"));
    }
    Ok(m)
}

/// Set by a `--live-update` supervisor that was socket-activated, for the serving processes it
/// starts (`LISTEN_PID` cannot name a child before it exists): the activation's descriptor,
/// which they inherit.
pub const SUPERVISED_LISTEN_FD: &str = "VIRTIOFS_DPU_LISTEN_FD";

/// The descriptor systemd socket activation handed over: 3, if `LISTEN_PID` is this process
/// and `LISTEN_FDS` is 1 (more than one is refused); or the one a socket-activated supervisor
/// passed on ([`SUPERVISED_LISTEN_FD`]). Clears the variables, as `sd_listen_fds(1)` does, so
/// children do not take them for theirs.
pub fn systemd_listen_fd() -> Result<Option<i32>, DeployError> {
    if let Some(v) = std::env::var_os(SUPERVISED_LISTEN_FD) {
        std::env::remove_var(SUPERVISED_LISTEN_FD);
        let shown = v.to_string_lossy().into_owned();
        return match shown.parse::<i32>() {
            Ok(fd) if fd >= 3 => Ok(Some(fd)),
            _ => Err(DeployError::Usage(format!(
                "{SUPERVISED_LISTEN_FD}={shown:?}: not a descriptor number of 3 or more (a --live-update supervisor sets it)"
            ))),
        };
    }
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_FDNAMES");
    match (pid, fds) {
        (Some(pid), Some(fds)) if pid.parse::<u32>().ok() == Some(std::process::id()) => match fds
            .parse::<i32>()
        {
            Ok(1) => Ok(Some(3)),
            Ok(n) => Err(DeployError::BadFd { fd: 3, why: format!("LISTEN_FDS={n}: expected one socket") }),
            Err(_) => Err(DeployError::BadFd { fd: 3, why: format!("LISTEN_FDS={fds:?} is not a number") }),
        },
        _ => Ok(None),
    }
}

/// Takes over descriptor `fd`, a listening unix stream socket inherited from the supervisor.
pub fn adopt_listener(fd: i32) -> Result<UnixListener, DeployError> {
    let bad = |why: String| DeployError::BadFd { fd, why };
    if fd < 3 {
        return Err(bad("0, 1 and 2 are stdin, stdout and stderr".into()));
    }
    let target =
        std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|e| bad(format!("not open: {e}")))?;
    if !target.to_string_lossy().starts_with("socket:") {
        return Err(bad(format!("not a socket ({})", target.display())));
    }
    let owned = crate::sys::adopt_inherited_fd(fd).map_err(|e| bad(format!("not open: {e}")))?;
    let listener = UnixListener::from(owned);
    match listener.local_addr() {
        Ok(_) => {}
        Err(e) => return Err(bad(format!("not a unix socket: {e}"))),
    }
    listener.set_nonblocking(true).map_err(|e| bad(format!("cannot make it non-blocking: {e}")))?;
    Ok(listener)
}

/// The service manager's notification socket (`NOTIFY_SOCKET`), connected at start-up: before
/// a sandbox changes the root or a system-call filter forbids `socket`.
#[derive(Debug)]
pub struct Notifier {
    sock: UnixDatagram,
    path: String,
}

impl Notifier {
    /// Connects to `NOTIFY_SOCKET` if it is set (an address starting with `@` is in the
    /// abstract namespace).
    pub fn from_env() -> Result<Option<Self>, DeployError> {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return Ok(None) };
        let shown = path.to_string_lossy().into_owned();
        let err = |source| DeployError::Notify { path: shown.clone(), source };
        let addr = match shown.strip_prefix('@') {
            Some(name) => SocketAddr::from_abstract_name(name.as_bytes()).map_err(err)?,
            None => SocketAddr::from_pathname(&path).map_err(err)?,
        };
        let sock = UnixDatagram::unbound().map_err(err)?;
        sock.connect_addr(&addr).map_err(err)?;
        Ok(Some(Notifier { sock, path: shown }))
    }

    /// Tells the service manager `state` (for example `READY=1`).
    pub fn notify(&self, state: &str) -> Result<(), DeployError> {
        self.sock
            .send(state.as_bytes())
            .map_err(|source| DeployError::Notify { path: self.path.clone(), source })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_groups() {
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("770"), Ok(0o770));
        assert!(parse_mode("8").is_err() && parse_mode("77777").is_err());
        assert_eq!(group_id("0").unwrap(), 0);
        assert_eq!(group_id("root").unwrap(), 0);
        assert!(matches!(group_id("no-such-group-here"), Err(DeployError::NoSuchGroup(_))));
    }

    #[test]
    fn notify_reaches_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        std::env::set_var("NOTIFY_SOCKET", &path);
        let n = Notifier::from_env().unwrap().expect("NOTIFY_SOCKET is set");
        std::env::remove_var("NOTIFY_SOCKET");
        n.notify("READY=1").unwrap();
        let mut buf = [0u8; 64];
        let got = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..got], b"READY=1");
        assert!(Notifier::from_env().unwrap().is_none());
    }
}
