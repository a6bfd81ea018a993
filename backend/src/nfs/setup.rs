//! Blocking start-up calls, for the control thread only (never on a poller): portmapper
//! GETPORT, MOUNT v3 MNT/UMNT, and [`call_blocking`], one call at a time over a [`Conn`].

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::conn::{CallError, Conn, Cred, Sink};
use super::url::NfsUrl;
use super::wire::mount::{self, MntRes};
use super::wire::nfs3::{self, Args, Res};
use super::wire::portmap;
use super::wire::rpc::{self, RpcError};
use super::wire::xdr::{Decoder, Encoder};
use super::wire::Fh;
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

/// The AUTH_SYS machine name of start-up calls.
const MACHINE: &[u8] = b"virtiofs-dpu";
/// Largest reply accepted by the blocking helpers (MNT, GETPORT replies are small).
const MAX_REPLY: usize = 64 << 10;

/// One blocking RPC over a fresh TCP connection: `args` encodes the arguments; returns the
/// reply's results (after the RPC header).
fn rpc_call(
    what: &'static str,
    addr: SocketAddr,
    prog: u32,
    vers: u32,
    proc: u32,
    timeout: Duration,
    args: impl FnOnce(&mut Encoder<'_>) -> Result<(), WireError>,
) -> Result<Vec<u8>, SetupError> {
    let io = |source| SetupError::Io { what, addr, source };
    let deadline = Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    s.set_write_timeout(Some(left())).map_err(io)?;
    let mut buf = [0u8; 2048];
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let xid = (wall.as_nanos() as u32) ^ (std::process::id() << 8) ^ proc;
    let n = {
        let mut e = Encoder::new(&mut buf);
        let auth = rpc::AuthSys { stamp: 0, machine: MACHINE, uid: 0, gid: 0, gids: &[] };
        let enc = (|| {
            let mark = e.reserve_u32()?;
            rpc::encode_call(&mut e, xid, prog, vers, proc, &auth)?;
            args(&mut e)?;
            Ok::<_, WireError>(mark)
        })();
        let mark = enc.map_err(|source| SetupError::Wire { what, source })?;
        let n = e.position();
        e.patch_u32(mark, 0x8000_0000 | (n - 4) as u32);
        n
    };
    s.write_all(&buf[..n]).map_err(io)?;
    // Read records until the one with our XID (a server may not send others, but be lenient).
    loop {
        let rec = read_record(&mut s, deadline, what, addr)?;
        let mut d = Decoder::new(&rec);
        let (rxid, status) = rpc::decode_reply(&mut d).map_err(|source| SetupError::Wire { what, source })?;
        if rxid != xid {
            continue;
        }
        status.map_err(|source| SetupError::Rpc { what, source })?;
        return Ok(d.rest().to_vec());
    }
}

fn read_record(
    s: &mut TcpStream,
    deadline: Instant,
    what: &'static str,
    addr: SocketAddr,
) -> Result<Vec<u8>, SetupError> {
    let mut rec = Vec::new();
    loop {
        let mut mark = [0u8; 4];
        read_full(s, &mut mark, deadline, what, addr)?;
        let mark = u32::from_be_bytes(mark);
        let len = (mark & 0x7fff_ffff) as usize;
        if rec.len() + len > MAX_REPLY {
            return Err(SetupError::Wire {
                what,
                source: WireError::TooLong { what: "record", len: len as u32, max: MAX_REPLY as u32 },
            });
        }
        let at = rec.len();
        rec.resize(at + len, 0);
        read_full(s, &mut rec[at..], deadline, what, addr)?;
        if mark & 0x8000_0000 != 0 {
            return Ok(rec);
        }
    }
}

fn read_full(
    s: &mut TcpStream,
    mut buf: &mut [u8],
    deadline: Instant,
    what: &'static str,
    addr: SocketAddr,
) -> Result<(), SetupError> {
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(SetupError::TimedOut(what));
        }
        s.set_read_timeout(Some(left)).map_err(|source| SetupError::Io { what, addr, source })?;
        match s.read(buf) {
            Ok(0) => {
                let source = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
                return Err(SetupError::Io { what, addr, source });
            }
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(SetupError::TimedOut(what));
            }
            Err(source) => return Err(SetupError::Io { what, addr, source }),
        }
    }
    Ok(())
}

/// Portmapper GETPORT of `prog`/`vers` over TCP.
pub fn getport(
    pmap: SocketAddr,
    prog: u32,
    vers: u32,
    name: &'static str,
    timeout: Duration,
) -> Result<u16, SetupError> {
    let res = rpc_call(
        "portmapper GETPORT",
        pmap,
        portmap::PROGRAM,
        portmap::VERSION,
        portmap::PROC_GETPORT,
        timeout,
        |e| portmap::encode_getport(e, prog, vers),
    )?;
    portmap::decode_getport(&mut Decoder::new(&res))
        .map_err(|source| SetupError::Wire { what: "portmapper GETPORT", source })?
        .ok_or(SetupError::NotRegistered(pmap, name, prog, vers))
}

/// Resolves ports (portmapper GETPORT on HOST:111 or :PORT unless nfsport/mountport given),
/// MOUNTs the export (MOUNT v3 MNT with AUTH_SYS root), returns the root handle and the NFS
/// address.
pub fn mount(url: &NfsUrl, timeout: Duration) -> Result<Mounted, SetupError> {
    let resolve = |source| SetupError::Resolve { host: url.host.clone(), source };
    let pmap_port = url.port.unwrap_or(portmap::PORT);
    let host = (url.host.as_str(), pmap_port)
        .to_socket_addrs()
        .map_err(resolve)?
        .next()
        .ok_or_else(|| resolve(std::io::Error::from(std::io::ErrorKind::NotFound)))?;
    let port_of = |given: Option<u16>, prog, vers, name| match given {
        Some(p) => Ok(p),
        None => getport(host, prog, vers, name, timeout),
    };
    let nfs_port = port_of(url.nfsport, nfs3::PROGRAM, nfs3::VERSION, "NFS")?;
    let mount_port = port_of(url.mountport, mount::PROGRAM, mount::VERSION, "MOUNT")?;
    let mut nfs_addr = host;
    nfs_addr.set_port(nfs_port);
    let mut mount_addr = host;
    mount_addr.set_port(mount_port);
    let what = "MOUNT MNT";
    let res = rpc_call(what, mount_addr, mount::PROGRAM, mount::VERSION, mount::PROC_MNT, timeout, |e| {
        mount::encode_dirpath(e, url.export.as_bytes())
    })?;
    match mount::decode_mnt(&mut Decoder::new(&res)).map_err(|source| SetupError::Wire { what, source })? {
        MntRes::Ok { root, auth_sys: true } => Ok(Mounted { root, nfs_addr, mount_addr }),
        MntRes::Ok { auth_sys: false, .. } => Err(SetupError::NoAuthSys(url.export.clone())),
        MntRes::Failed(status) => Err(SetupError::MountRefused { export: url.export.clone(), status }),
    }
}

/// MOUNT UMNT of `export` (the server forgets the mount; handles stay valid).
pub fn unmount(m: &Mounted, export: &str, timeout: Duration) -> Result<(), SetupError> {
    rpc_call("MOUNT UMNT", m.mount_addr, mount::PROGRAM, mount::VERSION, mount::PROC_UMNT, timeout, |e| {
        mount::encode_dirpath(e, export.as_bytes())
    })
    .map(|_| ())
}

/// A blocking one-call-at-a-time helper over a [`Conn`] for start-up and for the bench's raw
/// client (FSINFO at start, GETATTR of the root): polls `conn` until the call ends or `timeout`
/// passes; `out` gets the reply. READ data is dropped, a WRITE fails (no payload).
pub fn call_blocking(
    conn: &mut Conn,
    cred: &Cred,
    args: &Args<'_>,
    timeout: Duration,
    out: &mut dyn FnMut(Res<'_>),
) -> Result<(), SetupError> {
    const TAG: u32 = u32::MAX;
    struct One<'f> {
        out: &'f mut dyn FnMut(Res<'_>),
        result: Option<Result<(), CallError>>,
    }
    impl Sink for One<'_> {
        fn read_buffer(&mut self, _tag: u32) -> Option<crate::io::Writer<'_>> {
            None
        }
        fn payload(&mut self, _tag: u32) -> Option<crate::io::Reader<'_>> {
            None
        }
        fn done(&mut self, tag: u32, res: Result<Res<'_>, CallError>) {
            if tag != TAG {
                return;
            }
            self.result = Some(res.map(|r| (self.out)(r)));
        }
    }
    let mut sink = One { out, result: None };
    let deadline = Instant::now() + timeout;
    conn.call(TAG, cred, args, &mut sink).map_err(SetupError::Call)?;
    loop {
        let now = Instant::now();
        conn.poll(now, &mut sink);
        if let Some(r) = sink.result.take() {
            return r.map_err(SetupError::Call);
        }
        if now >= deadline {
            conn.abort_all(&mut sink);
            return Err(SetupError::TimedOut("NFS call"));
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}
