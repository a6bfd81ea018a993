//! Blocking start-up calls, for the control thread only (never on a poller): portmapper
//! GETPORT, MOUNT v3 MNT/UMNT, and [`call_blocking`], one call at a time over a [`Conn`].

use std::net::SocketAddr;
use std::time::Duration;

use super::conn::{CallError, Conn, Cred};
use super::url::NfsUrl;
use super::wire::nfs3::{Args, Fh, Res};
use super::wire::rpc::RpcError;
use super::wire::WireError;

/// Why start-up failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The host name did not resolve.
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        /// The host.
        host: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Connecting, sending or receiving failed.
    #[error("{what} at {addr}: {source}")]
    Io {
        /// Which step.
        what: &'static str,
        /// The server's address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server's reply did not decode.
    #[error("{what}: malformed reply: {source}")]
    Wire {
        /// Which step.
        what: &'static str,
        /// Why.
        #[source]
        source: WireError,
    },
    /// The server refused the call at the RPC level.
    #[error("{what}: {source}")]
    Rpc {
        /// Which step.
        what: &'static str,
        /// Why.
        #[source]
        source: RpcError,
    },
    /// The portmapper does not know the program.
    #[error("the portmapper at {0} has no TCP registration of {1} (program {2} version {3})")]
    NotRegistered(SocketAddr, &'static str, u32, u32),
    /// MNT failed with this `mountstat3`.
    #[error("MOUNT of {export:?} refused: mountstat3 {status}")]
    MountRefused {
        /// The export.
        export: String,
        /// The status.
        status: u32,
    },
    /// The export does not accept AUTH_SYS.
    #[error("MOUNT of {0:?}: the export does not accept AUTH_SYS")]
    NoAuthSys(String),
    /// No reply within the timeout.
    #[error("{0}: no reply within the timeout")]
    TimedOut(&'static str),
    /// A call over a [`Conn`] failed.
    #[error("call failed: {0}")]
    Call(#[source] CallError),
}

/// A mounted export.
#[derive(Debug, Clone, Copy)]
pub struct Mounted {
    /// The export's root handle.
    pub root: Fh,
    /// The NFS program's address.
    pub nfs_addr: SocketAddr,
    /// The MOUNT program's address.
    pub mount_addr: SocketAddr,
}

/// Resolves ports (portmapper GETPORT on HOST:111 or :PORT unless nfsport/mountport given),
/// MOUNTs the export (MOUNT v3 MNT with AUTH_SYS root), returns the root handle and the NFS
/// address.
pub fn mount(url: &NfsUrl, timeout: Duration) -> Result<Mounted, SetupError> {
    let _ = (url, timeout);
    unimplemented!()
}

/// MOUNT UMNT of `export` (the server forgets the mount; handles stay valid).
pub fn unmount(m: &Mounted, export: &str, timeout: Duration) -> Result<(), SetupError> {
    let _ = (m, export, timeout);
    unimplemented!()
}

/// A blocking one-call-at-a-time helper over a [`Conn`] for start-up and for the bench's raw
/// client (FSINFO at start, GETATTR of the root): polls `conn` until the call ends or `timeout`
/// passes; `out` gets the reply. READ data is dropped, WRITE is refused (no payload).
pub fn call_blocking(
    conn: &mut Conn,
    cred: &Cred,
    args: &Args<'_>,
    timeout: Duration,
    out: &mut dyn FnMut(Res<'_>),
) -> Result<(), SetupError> {
    let _ = (conn, cred, args, timeout, out);
    unimplemented!()
}
