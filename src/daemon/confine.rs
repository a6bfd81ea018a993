//! The daemon's confinement, as its [`Confinement`] says: namespaces once every socket is
//! bound ([`Plan::enter`]), then, once the backends are built, no new privileges, the kept
//! capabilities only and the seccomp allowlist ([`Plan::lock_down`]). The pollers start after
//! both and inherit them (see `virtiofs_backend::passthrough::sandbox`).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use log::info;
use virtiofs_backend::passthrough::sandbox::{self, SandboxMode};
use virtiofs_backend::passthrough::seccomp::{self, Network, SeccompMode};
use virtiofs_device::vfio_user::Listener;

use super::StartError;
use crate::ops::control_socket::BoundControlSocket;
use crate::settings::{BackendSpec, Confinement, DaemonSpec};

/// Where each function's share is once the sandbox's root is the root.
pub(super) struct Plan {
    confinement: Confinement,
    /// The namespace's root, canonical (on the host's terms).
    root: Option<PathBuf>,
    /// Per function: its shared directory's path inside the root.
    inside: Vec<Option<PathBuf>>,
}

impl Plan {
    /// Checks that every shared directory lies beneath the sandbox's root.
    pub(super) fn new(spec: &DaemonSpec) -> Result<Plan, StartError> {
        let c = spec.confinement.clone();
        let root = match &c.sandbox_root {
            Some(r) => Some(
                std::fs::canonicalize(r)
                    .map_err(|e| StartError::Sandbox(format!("sandbox_root {}: {e}", r.display())))?,
            ),
            None => None,
        };
        let mut inside = Vec::new();
        for f in &spec.functions {
            let (Some(root), BackendSpec::SharedDir { shared_dir, .. }) = (&root, &f.backend) else {
                inside.push(None);
                continue;
            };
            let beneath = std::fs::canonicalize(shared_dir).ok().and_then(|d| within(&d, root));
            match beneath {
                Some(p) => inside.push(Some(p)),
                None => {
                    return Err(StartError::Sandbox(format!(
                        "function {:?}: shared_dir {} is not beneath sandbox_root {}",
                        f.tag(),
                        shared_dir.display(),
                        root.display()
                    )))
                }
            }
        }
        Ok(Plan { confinement: c, root, inside })
    }

    /// Whether a shared directory opened on the host may be kept (no namespace will change
    /// the root under it).
    pub(super) fn keeps_shares(&self) -> bool {
        self.root.is_none()
    }

    /// Function `i`'s shared directory inside the sandbox, if it moved there.
    pub(super) fn inside(&self, i: usize) -> Option<&Path> {
        self.inside.get(i).and_then(Option::as_deref)
    }

    /// Enters the namespaces (if any): returns the sandbox's `/proc/self/fd` when the root
    /// changed to the sandbox root. The sockets' files are then named from inside (one beneath
    /// the root is removed through that path at exit; one elsewhere stays).
    pub(super) fn enter(
        &self,
        listeners: &mut [Listener],
        control: Option<&mut BoundControlSocket>,
    ) -> Result<Option<OwnedFd>, StartError> {
        let c = &self.confinement;
        if !(c.shares || c.network) {
            return Ok(None);
        }
        if c.sandbox == SandboxMode::None {
            info!("no sandbox (--sandbox=none)");
            return Ok(None);
        }
        if let Some(c) = control {
            c.keep_socket_file();
        }
        let Some(root) = &self.root else {
            sandbox::enter_namespace_keeping_network().map_err(StartError::Confine)?;
            listeners.iter_mut().for_each(Listener::keep_socket_file);
            info!("sandbox: new mount and IPC namespaces (the network kept for the NFS server), root an empty read-only tmpfs");
            return Ok(None);
        };
        let sockets: Vec<Option<PathBuf>> = listeners
            .iter()
            .map(|l| std::fs::canonicalize(l.path()).ok().and_then(|s| within(&s, root)))
            .collect();
        let confined = sandbox::enter_namespace_with(root, c.network).map_err(StartError::Confine)?;
        for (l, inside) in listeners.iter_mut().zip(sockets) {
            match inside {
                Some(p) => l.socket_file_now_at(p),
                None => l.keep_socket_file(),
            }
        }
        info!(
            "sandbox: new {} namespaces; root is now {} (procfs {}; every shared_dir beneath it)",
            if c.network {
                "mount and IPC (the network kept for the NFS servers)"
            } else {
                "mount, IPC and network"
            },
            root.display(),
            if confined.proc_restricted { "subset=pid,hidepid=invisible" } else { "unrestricted" }
        );
        Ok(Some(confined.proc_self_fd))
    }

    /// No new privileges, only the capabilities serving needs, the system-call allowlist (with
    /// the TCP client's calls for an NFS export): for a daemon that serves the host's files or
    /// network.
    pub(super) fn lock_down(&self) -> Result<(), StartError> {
        let c = &self.confinement;
        if !(c.shares || c.network) {
            return Ok(());
        }
        let caps = if c.shares { sandbox::KEPT_CAPS } else { sandbox::NFS_KEPT_CAPS };
        match sandbox::drop_privileges_keeping(caps).map_err(StartError::Privileges)? {
            d if d.privileged => info!(
                "no_new_privs, {} capabilities dropped from the bounding set, kept [{}]",
                d.bounding,
                caps.iter().map(|c| c.1).collect::<Vec<_>>().join(",")
            ),
            _ => info!("unprivileged, no_new_privs set"),
        }
        let net = if c.network { Network::TcpClient } else { Network::None };
        seccomp::install_with(c.seccomp, net).map_err(StartError::Seccomp)?;
        match c.seccomp {
            SeccompMode::Off => info!("seccomp: off"),
            m => info!(
                "seccomp: {} system calls allowed{}, others: {m:?}",
                seccomp::allowlist_with(net).len(),
                if c.network { " (TCP client included)" } else { "" }
            ),
        }
        Ok(())
    }
}

/// `path` (canonical) as the sandbox names it, if it lies beneath `root` (canonical).
fn within(path: &Path, root: &Path) -> Option<PathBuf> {
    path.strip_prefix(root).ok().map(|r| Path::new("/").join(r))
}
