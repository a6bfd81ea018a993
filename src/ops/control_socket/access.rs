//! Who may use the control socket: the socket file's group and mode, and each accepted client's
//! credentials (`SO_PEERCRED`), checked against them.

use mio::net::UnixStream;

/// The control socket's permission bits unless `--control-socket-mode` says otherwise.
pub const DEFAULT_MODE: u32 = 0o600;

/// Who may use the control socket besides root and the daemon's own uid: the socket file's
/// group and mode, and the group whose members' connections are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlAccess {
    /// The control group (`--control-socket-group`): the socket file's group, and the group
    /// whose members may connect. `None`: the group is left as created, and only root and the
    /// daemon's uid are served.
    pub group: Option<u32>,
    /// The socket file's permission bits (`--control-socket-mode`).
    pub mode: u32,
}

impl Default for ControlAccess {
    fn default() -> Self {
        ControlAccess { group: None, mode: DEFAULT_MODE }
    }
}

/// A connected client's credentials as the kernel recorded them (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Its pid (0 when it is in a pid namespace this one cannot see).
    pub pid: i32,
    /// Its effective uid.
    pub uid: u32,
    /// Its effective gid.
    pub gid: u32,
}

/// Whether a client with credentials `peer` may use the control socket of a daemon running as
/// `daemon_uid` whose control group is `group`: root and the daemon's uid may, and so may a
/// member of the group, by its primary gid or by one of the supplementary groups
/// `supplementary` reads (asked only when the rest does not decide).
pub fn peer_allowed(
    peer: &PeerCred,
    daemon_uid: u32,
    group: Option<u32>,
    supplementary: impl FnOnce(&PeerCred) -> Vec<u32>,
) -> bool {
    if peer.uid == 0 || peer.uid == daemon_uid {
        return true;
    }
    match group {
        None => false,
        Some(g) => peer.gid == g || supplementary(peer).contains(&g),
    }
}

/// The supplementary groups of a `/proc/PID/status` text, if its effective uid is `uid` (none
/// otherwise: the pid was reused by a process of someone else since the client connected).
pub fn status_groups(status: &str, uid: u32) -> Vec<u32> {
    let mut euid = None;
    let mut groups = Vec::new();
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("Uid:") {
            euid = rest.split_whitespace().nth(1).and_then(|u| u.parse::<u32>().ok());
        } else if let Some(rest) = line.strip_prefix("Groups:") {
            groups = rest.split_whitespace().filter_map(|g| g.parse().ok()).collect();
        }
    }
    if euid == Some(uid) {
        groups
    } else {
        Vec::new()
    }
}

/// The supplementary groups of a peer's process from `/proc` (none if it cannot be read: a
/// sandbox without `/proc`, a pid of another namespace).
fn proc_groups(peer: &PeerCred) -> Vec<u32> {
    if peer.pid <= 0 {
        return Vec::new();
    }
    std::fs::read_to_string(format!("/proc/{}/status", peer.pid))
        .map(|s| status_groups(&s, peer.uid))
        .unwrap_or_default()
}

/// Checks an accepted client's credentials; `Err` says why it is refused.
pub(super) fn check_peer(stream: &UnixStream, daemon_uid: u32, group: Option<u32>) -> Result<(), String> {
    let (pid, uid, gid) = crate::sys::peer_credentials(stream)
        .map_err(|e| format!("cannot read the client's credentials: {e}"))?;
    let peer = PeerCred { pid, uid, gid };
    if peer_allowed(&peer, daemon_uid, group, proc_groups) {
        return Ok(());
    }
    let group = group.map_or("none".to_string(), |g| g.to_string());
    Err(format!(
        "uid {uid} gid {gid} (pid {pid}) is not root, the daemon's uid {daemon_uid} nor of the control group ({group})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_the_daemons_uid_and_the_control_group_may_connect() {
        let peer = |uid, gid| PeerCred { pid: 42, uid, gid };
        let none = |_: &PeerCred| Vec::new();
        let member_of_7 = |_: &PeerCred| vec![5, 7];
        let must_not_ask = |_: &PeerCred| -> Vec<u32> { panic!("the groups were not needed") };
        // Root and the daemon's own uid, whatever the group.
        assert!(peer_allowed(&peer(0, 0), 1000, None, must_not_ask));
        assert!(peer_allowed(&peer(1000, 1000), 1000, None, must_not_ask));
        // Anyone else only through the control group.
        assert!(!peer_allowed(&peer(1001, 7), 1000, None, member_of_7));
        assert!(peer_allowed(&peer(1001, 7), 1000, Some(7), must_not_ask));
        assert!(!peer_allowed(&peer(1001, 8), 1000, Some(7), none));
        assert!(peer_allowed(&peer(1001, 8), 1000, Some(7), member_of_7));
        // A daemon running as someone else does not serve root's uid by accident of equality.
        assert!(!peer_allowed(&peer(1001, 1001), 0, Some(7), none));
    }

    #[test]
    fn supplementary_groups_come_from_the_status_of_the_same_uid() {
        let status =
            "Name:\tqemu\nUid:\t107\t107\t107\t107\nGid:\t107\t107\t107\t107\nGroups:\t36 107 1001 \n";
        assert_eq!(status_groups(status, 107), [36, 107, 1001]);
        // The pid now belongs to another uid: no groups are taken from it.
        assert!(status_groups(status, 108).is_empty());
        assert!(status_groups("Uid:\t107\t107\t107\t107\nGroups:\n", 107).is_empty());
        assert!(status_groups("garbage", 107).is_empty());
        // The real uid differs from the effective one: the effective one counts.
        assert_eq!(status_groups("Uid:\t5\t107\t5\t107\nGroups:\t9\n", 107), [9]);
    }
}
