//! The blocking start-up of an NFSv4.1 export, for the control thread only (never a poller):
//! a session over a [`Conn<Nfs41>`] driven in a loop until done or the timeout, which walks from
//! the server's pseudo root to the export (PUTROOTFH, one LOOKUP per component of the export's
//! path, GETFH, GETATTR of its type and the server's limits), then ends the session
//! (DESTROY_SESSION, DESTROY_CLIENTID). No portmapper and no MOUNT: NFSv4 has neither.
//!
//! `session_config` is the one place a [`SessionConfig`] is made, for the start-up's session
//! and the pollers' alike.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{CallError, CompoundReply, Conn, ConnConfig, Cred, Nfs41};
use super::session::{ClientShare, ServerOwner, Session, SessionConfig, SessionSink, State};
use super::setup::SetupError;
use super::wire::nfs4::{attr, Bitmap, Fattr4, Ftype4, Nfsstat4, Op, OpRes, Verifier};
use super::wire::Fh;
use crate::io::{Reader, Writer};

/// What the start-up learnt of the export.
#[derive(Debug, Clone, Copy)]
pub(super) struct Export41 {
    /// The server's address.
    pub(super) addr: SocketAddr,
    /// The export's root handle.
    pub(super) root: Fh,
    /// The server's largest READ and WRITE (`maxread`, `maxwrite`; `None`: not said).
    pub(super) maxread: Option<u64>,
    pub(super) maxwrite: Option<u64>,
    /// The largest file (`maxfilesize`).
    pub(super) max_file: Option<u64>,
    /// The lease (`lease_time`), if the server said.
    pub(super) lease: Option<Duration>,
}

/// Why the NFSv4.1 start-up failed.
#[derive(Debug, thiserror::Error)]
pub enum Start41Error {
    /// The host did not resolve, or the connection could not be made.
    #[error("connecting")]
    Setup(#[from] SetupError),
    /// No session within the timeout.
    #[error("no NFSv4.1 session within the timeout (last establishment status {0})")]
    NoSession(u32),
    /// The walk to the export failed with this status.
    #[error("{op:?} on the way to the export failed: {status:?}")]
    Refused {
        /// The operation.
        op: super::wire::nfs4::OpNum,
        /// Its status.
        status: Nfsstat4,
    },
    /// The call ended without an answer.
    #[error("the walk to the export: {0}")]
    Call(#[source] CallError),
    /// The reply lacked the handle or attributes asked, or did not decode.
    #[error("the walk to the export: unexpected reply")]
    Unexpected,
    /// The export is not a directory.
    #[error("the export is not a directory")]
    NotDir,
    /// Another address of the URL answered as another server (its owner or scope differs):
    /// session trunking needs the addresses of one server.
    #[error("{addr} is not the same NFSv4.1 server as {first} (server owner or scope differs)")]
    NotOneServer {
        /// The first address.
        first: SocketAddr,
        /// The address that differs.
        addr: SocketAddr,
    },
}

/// Walks to `export` at each of `hosts` (a server's addresses, for session trunking) as
/// [`start`] does, each time as the client `owner` in incarnation `verifier`, and checks that
/// every address answers as the same server (EXCHANGE_ID's server owner major id and scope).
/// An address that cannot be reached (no connection, no session, no answer within the
/// timeout) is left out, logged, as long as another answers: the function serves from those
/// (it does not take the others up later: their server is not known to be the same). Returns
/// what the first address that answered learnt, and the addresses that answered, in order.
#[allow(clippy::too_many_arguments)]
pub(super) fn start_all(
    hosts: &[(&str, u16)],
    export: &str,
    owner: &[u8],
    verifier: Verifier,
    timeout: Duration,
    retransmit: Duration,
    machine_name: &str,
) -> Result<(Export41, Vec<SocketAddr>), Start41Error> {
    let mut addrs = Vec::with_capacity(hosts.len());
    let mut first: Option<(Export41, Option<ServerOwner>)> = None;
    let mut unreached = None;
    for &(host, port) in hosts {
        let started = resolve(host, port).map_err(Start41Error::from).and_then(|addr| {
            let client = Arc::new(ClientShare::new(owner.to_vec(), verifier));
            let e = start(addr, export, client.clone(), timeout, retransmit, machine_name)?;
            Ok((addr, e, client))
        });
        let (addr, e, client) = match started {
            Ok(x) => x,
            Err(e @ (Start41Error::Setup(_) | Start41Error::NoSession(_) | Start41Error::Call(_)))
                if hosts.len() > 1 =>
            {
                log::warn!("nfs4.1: {host}:{port} does not answer ({e}): left out");
                unreached.get_or_insert(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let server = client.server_owner();
        match &first {
            None => first = Some((e, server)),
            Some((f, s)) if *s != server => return Err(Start41Error::NotOneServer { first: f.addr, addr }),
            Some(_) => {}
        }
        addrs.push(addr);
    }
    let Some((e, _)) = first else {
        return Err(unreached.unwrap_or(Start41Error::Setup(SetupError::Resolve {
            host: String::new(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no host"),
        })));
    };
    Ok((e, addrs))
}

/// A session's settings: the one place they are made (the start-up's session and every
/// poller's). `client`: the client the sessions are of (owner id, verifier, the shared client
/// id); `slots`: calls in flight; `max_io`: largest READ/WRITE.
pub(super) fn session_config(
    client: Arc<ClientShare>,
    slots: usize,
    max_io: u32,
    timeout: Duration,
) -> SessionConfig {
    SessionConfig {
        client,
        // At most 64: what servers grant (ganesha's most); more requests wait in the engine.
        slots: slots.clamp(1, MAX_SESSION_SLOTS) as u16,
        max_io,
        timeout,
        cred: Cred::ROOT,
    }
}

/// The most fore channel slots a session asks.
const MAX_SESSION_SLOTS: usize = 64;

/// A new incarnation's EXCHANGE_ID verifier: the wall clock and the process id, so a
/// restarted daemon (the same owner) tells the server to drop what the last one held.
pub(super) fn new_verifier() -> Verifier {
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (wall.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(48)).to_be_bytes()
}

/// The attributes of the export's root asked at start-up.
const ROOT_ATTRS: Bitmap =
    Bitmap::of(&[attr::TYPE, attr::LEASE_TIME, attr::MAXFILESIZE, attr::MAXREAD, attr::MAXWRITE]);

/// The start-up's one call: the walk, its ops made again whenever the session asks.
struct Walk {
    components: Vec<Vec<u8>>,
    out: Option<Result<(Fh, Fattr4), Start41Error>>,
}

impl SessionSink for Walk {
    fn read_buffer(&mut self, _tag: u32) -> Option<Writer<'_>> {
        None
    }

    fn payload(&mut self, _tag: u32) -> Option<Reader<'_>> {
        None
    }

    fn ops(&mut self, _tag: u32, send: &mut dyn FnMut(&[Op<'_>])) {
        let mut ops = Vec::with_capacity(self.components.len() + 3);
        ops.push(Op::Putrootfh);
        ops.extend(self.components.iter().map(|c| Op::Lookup { name: c }));
        ops.extend([Op::Getfh, Op::Getattr { attrs: ROOT_ATTRS }]);
        send(&ops);
    }

    fn done(&mut self, _tag: u32, res: Result<CompoundReply<'_>, CallError>) {
        let reply = match res {
            Ok(r) => r,
            Err(e) => {
                self.out = Some(Err(Start41Error::Call(e)));
                return;
            }
        };
        let (mut fh, mut attrs) = (None, None);
        for r in reply.results {
            match r {
                Ok(OpRes::Failed { op, status, .. }) => {
                    self.out = Some(Err(Start41Error::Refused { op, status }));
                    return;
                }
                Ok(OpRes::Getfh(f)) => fh = Some(f),
                Ok(OpRes::Getattr(a)) => attrs = Some(a),
                Ok(_) => {}
                Err(_) => {
                    self.out = Some(Err(Start41Error::Unexpected));
                    return;
                }
            }
        }
        self.out = Some(match (fh, attrs) {
            (Some(f), Some(a)) => Ok((f, a)),
            _ => Err(Start41Error::Unexpected),
        });
    }
}

/// The components of the export's path (`/a/b` → `a`, `b`).
fn components(export: &str) -> Vec<Vec<u8>> {
    export.split('/').filter(|c| !c.is_empty() && *c != ".").map(|c| c.as_bytes().to_vec()).collect()
}

/// Resolves `host:port`.
fn resolve(host: &str, port: u16) -> Result<SocketAddr, SetupError> {
    (host, port)
        .to_socket_addrs()
        .map_err(|source| SetupError::Resolve { host: host.to_owned(), source })?
        .next()
        .ok_or_else(|| SetupError::Resolve {
            host: host.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
        })
}

/// Polls `s` over `conn` until `done` holds or `deadline` passes; whether it holds.
fn drive(
    s: &mut Session,
    conn: &mut Conn<Nfs41>,
    sink: &mut Walk,
    deadline: Instant,
    done: impl Fn(&Session, &Walk) -> bool,
) -> bool {
    loop {
        let now = Instant::now();
        s.poll(now, conn, sink);
        if done(s, sink) {
            return true;
        }
        if now >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Walks to `export` on the server at `addr` through a session of `client` (blocking, at
/// most about `timeout` for the walk plus two seconds for the session's end).
pub(super) fn start(
    addr: SocketAddr,
    export: &str,
    client: Arc<ClientShare>,
    timeout: Duration,
    retransmit: Duration,
    machine_name: &str,
) -> Result<Export41, Start41Error> {
    let cfg = session_config(client, 2, 64 << 10, timeout);
    let mut conn = Conn::<Nfs41>::new(ConnConfig {
        addr,
        slots: cfg.conn_slots(),
        max_io: 64 << 10,
        timeout,
        retransmit,
        machine_name: machine_name.to_owned(),
    })
    .map_err(|source| SetupError::Io { what: "connecting to the NFSv4.1 server", addr, source })?;
    let deadline = Instant::now() + timeout;
    let mut s = Session::new(cfg, Instant::now());
    let mut walk = Walk { components: components(export), out: None };
    let ready = drive(&mut s, &mut conn, &mut walk, deadline, |s, _| s.state() == State::Ready);
    let out = if ready {
        let mut r = Ok(());
        walk.ops(0, &mut |ops| {
            // The walk's ops borrow `walk`: the call is made with a sink of its own.
            let mut first = Walk { components: Vec::new(), out: None };
            r = s.call(&mut conn, Instant::now(), 0, &Cred::ROOT, ops, &mut first);
        });
        match r {
            Ok(()) => {
                drive(&mut s, &mut conn, &mut walk, deadline + Duration::from_secs(1), |_, w| {
                    w.out.is_some()
                });
                walk.out.take().unwrap_or(Err(Start41Error::Call(CallError::TimedOut)))
            }
            Err(e) => Err(Start41Error::Call(e)),
        }
    } else {
        Err(Start41Error::NoSession(s.stats().last_establish_error))
    };
    let lease = s.params().map(|p| p.lease);
    // The session's end: DESTROY_SESSION and DESTROY_CLIENTID, best effort (the server drops
    // what is left at the end of the lease).
    s.close(Instant::now(), &mut walk);
    drive(&mut s, &mut conn, &mut walk, Instant::now() + Duration::from_secs(2), |s, _| {
        s.state() == State::Closed
    });
    let (root, a) = out?;
    if a.ftype != Some(Ftype4::Dir) {
        return Err(Start41Error::NotDir);
    }
    let lease = a.lease_time.filter(|l| *l > 0).map(|l| Duration::from_secs(u64::from(l))).or(lease);
    Ok(Export41 { addr, root, maxread: a.maxread, maxwrite: a.maxwrite, max_file: a.maxfilesize, lease })
}

#[cfg(test)]
mod tests {
    use super::components;

    #[test]
    fn export_paths_split_into_components() {
        assert_eq!(components("/srv/exp"), [b"srv".to_vec(), b"exp".to_vec()]);
        assert_eq!(components("/"), Vec::<Vec<u8>>::new());
        assert_eq!(components("//a/./b/"), [b"a".to_vec(), b"b".to_vec()]);
    }
}
