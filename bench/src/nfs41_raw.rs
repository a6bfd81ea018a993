//! The raw NFSv4.1 client of the bench: the same [`Session`] over the same [`Conn<Nfs41>`] the
//! device's pollers use, driven from the bench thread, for the raw phases of an export served
//! with `?version=4.1` ([`super::nfs_raw`] runs the phases; this is the wire under them).
//!
//! Set-up is blocking (the bench thread polls the session until each step is answered): the
//! session is established, the bench file is found from the pseudo root (PUTROOTFH, a LOOKUP per
//! component of the export's path and the file's name, GETFH) and opened for reading and writing
//! with an open owner of its own (OPEN CLAIM_FH, no delegation wanted). Every READ, WRITE and
//! COMMIT is then one COMPOUND (SEQUENCE, PUTFH, the operation) with the open's stateid, as the
//! device's engine sends them; READ is the last operation, so its data is placed into the call's
//! buffer as it comes. At the end the open is closed and the session destroyed. The client is
//! a client of its own to the server (its owner id names the bench, not a device function), so
//! it never takes over the state of a device serving the same export.

use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtiofs_backend::io::{Reader, Writer};
use virtiofs_backend::nfs::conn::{CallError, CompoundReply, Conn, ConnConfig, ConnStats, Cred, Nfs41};
use virtiofs_backend::nfs::session::{client_owner, host_identity, ClientShare, Session, SessionConfig};
use virtiofs_backend::nfs::session::{SessionSink, State};
use virtiofs_backend::nfs::url::NfsUrl;
use virtiofs_backend::nfs::wire::nfs4::{
    share, Fh, Nfsstat4, Op, OpRes, Open, OpenClaim, Stable4, StateOwner, Stateid,
};

use super::nfs_raw::{Done, RawSink};

/// What one tag's call is, kept to give the session its operations again when it asks.
#[derive(Clone, Copy, Debug, Default)]
enum Call {
    #[default]
    None,
    Read {
        offset: u64,
        count: u32,
    },
    Write {
        offset: u64,
        count: u32,
        stable: Stable4,
    },
    Commit,
}

/// The open owner of the bench's open.
const OPEN_OWNER: &[u8] = b"virtiofs-bench raw";

/// A set-up step, and what it got.
#[derive(Debug)]
enum Step {
    /// PUTROOTFH, LOOKUP of each component, GETFH.
    Walk(Vec<Vec<u8>>),
    /// PUTFH, OPEN of it (CLAIM_FH) by the bench's owner.
    Open(Fh, u64),
    /// PUTFH, CLOSE.
    Close(Fh, Stateid),
}

/// A set-up step's operations.
fn step_ops(step: &Step, send: &mut dyn FnMut(&[Op<'_>])) {
    match step {
        Step::Walk(path) => {
            let mut ops = Vec::with_capacity(path.len() + 2);
            ops.push(Op::Putrootfh);
            ops.extend(path.iter().map(|c| Op::Lookup { name: c }));
            ops.push(Op::Getfh);
            send(&ops)
        }
        Step::Open(fh, clientid) => send(&[
            Op::Putfh { fh },
            Op::Open(Open {
                share_access: share::ACCESS_BOTH | share::WANT_NO_DELEG,
                share_deny: share::DENY_NONE,
                owner: StateOwner { clientid: *clientid, owner: OPEN_OWNER },
                create: None,
                claim: OpenClaim::Fh,
            }),
        ]),
        Step::Close(fh, stateid) => send(&[Op::Putfh { fh }, Op::Close { stateid: *stateid }]),
    }
}

/// What a set-up step got: a file handle (GETFH), a stateid (OPEN).
type Got = (Option<Fh>, Option<Stateid>);

/// The sink of a set-up step.
struct StepSink<'a> {
    step: &'a Step,
    out: Option<Result<Got, String>>,
}

impl SessionSink for StepSink<'_> {
    fn read_buffer(&mut self, _: u32) -> Option<Writer<'_>> {
        None
    }

    fn payload(&mut self, _: u32) -> Option<Reader<'_>> {
        None
    }

    fn ops(&mut self, _: u32, send: &mut dyn FnMut(&[Op<'_>])) {
        step_ops(self.step, send)
    }

    fn done(&mut self, _: u32, res: Result<CompoundReply<'_>, CallError>) {
        self.out = Some(match res {
            Err(e) => Err(e.to_string()),
            Ok(r) if r.status != Nfsstat4::Ok => Err(format!("{:?}", r.status)),
            Ok(r) => {
                let (mut fh, mut stateid) = (None, None);
                for op in r.results {
                    match op {
                        Ok(OpRes::Getfh(f)) => fh = Some(f),
                        Ok(OpRes::Open(o)) => stateid = Some(o.stateid),
                        Ok(_) => {}
                        Err(e) => return self.out = Some(Err(e.to_string())),
                    }
                }
                Ok((fh, stateid))
            }
        });
    }
}

/// The calls of a run, with the bench's buffers.
struct IoSink<'a> {
    sink: &'a mut RawSink,
    calls: &'a [Call],
    file: &'a Fh,
    open: Stateid,
}

impl SessionSink for IoSink<'_> {
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>> {
        self.sink.writer(tag)
    }

    fn payload(&mut self, tag: u32) -> Option<Reader<'_>> {
        self.sink.reader(tag)
    }

    fn ops(&mut self, tag: u32, send: &mut dyn FnMut(&[Op<'_>])) {
        io_ops(self.calls.get(tag as usize).copied().unwrap_or_default(), self.file, self.open, send)
    }

    fn done(&mut self, tag: u32, res: Result<CompoundReply<'_>, CallError>) {
        let r = match res {
            Err(e) => Err(e.to_string()),
            Ok(reply) if reply.status != Nfsstat4::Ok => Err(format!("NFS error {:?}", reply.status)),
            Ok(reply) => {
                let mut out = reply.read.map(|r| Done { count: r.count, ..Done::default() });
                for op in reply.results {
                    match op {
                        Ok(OpRes::Read { data, .. }) => {
                            // A reply that came in one piece: its data copied, as NFSv3's is.
                            let placed = self.sink.writer(tag).is_some_and(|mut w| w.write_all(data).is_ok());
                            if !placed {
                                self.sink
                                    .completed
                                    .push((tag, Err("READ data larger than its buffer".into())));
                                return;
                            }
                            out = Some(Done { count: data.len() as u32, ..Done::default() });
                        }
                        Ok(OpRes::Write { count, committed, verf }) => {
                            out =
                                Some(Done { count, verf: Some(verf), stable: committed != Stable4::Unstable })
                        }
                        Ok(OpRes::Commit { verf }) => {
                            out = Some(Done { count: 0, verf: Some(verf), stable: true })
                        }
                        Ok(_) => {}
                        Err(e) => {
                            self.sink.completed.push((tag, Err(e.to_string())));
                            return;
                        }
                    }
                }
                out.ok_or_else(|| "unexpected reply".to_string())
            }
        };
        self.sink.completed.push((tag, r));
    }
}

/// A run's call's operations.
fn io_ops(call: Call, fh: &Fh, stateid: Stateid, send: &mut dyn FnMut(&[Op<'_>])) {
    match call {
        Call::None => {}
        Call::Read { offset, count } => send(&[Op::Putfh { fh }, Op::Read { stateid, offset, count }]),
        Call::Write { offset, count, stable } => {
            send(&[Op::Putfh { fh }, Op::Write { stateid, offset, stable, count }])
        }
        Call::Commit => send(&[Op::Putfh { fh }, Op::Commit { offset: 0, count: 0 }]),
    }
}

/// The raw NFSv4.1 client: a session, the bench file's handle and its open.
pub(super) struct Raw41 {
    conn: Conn<Nfs41>,
    session: Session,
    file: Fh,
    open: Stateid,
    calls: Vec<Call>,
    timeout: Duration,
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

impl Raw41 {
    /// Connects to `url`'s server, finds `name` in the export's root and opens it; room for
    /// `tags` calls of up to `max_block` bytes.
    pub(super) fn new(
        url: &NfsUrl,
        name: &str,
        tags: usize,
        max_block: usize,
        timeout: Duration,
    ) -> Result<Raw41, String> {
        let addr = (url.host.as_str(), url.nfs4_port())
            .to_socket_addrs()
            .map_err(|e| err("resolving the server", e))?
            .next()
            .ok_or_else(|| "resolving the server: no address".to_string())?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let verifier = (now.as_nanos() as u64 ^ u64::from(std::process::id()) << 40).to_be_bytes();
        let owner = client_owner(&host_identity(), &url.export, "virtiofs-bench raw client");
        let cfg = SessionConfig {
            client: Arc::new(ClientShare::new(owner, verifier)),
            slots: u16::try_from(tags).unwrap_or(u16::MAX),
            max_io: max_block as u32,
            timeout,
            cred: Cred::ROOT,
        };
        let conn = Conn::new(ConnConfig {
            addr,
            slots: cfg.conn_slots(),
            max_io: max_block as u32,
            timeout,
            retransmit: Duration::from_secs(3),
            machine_name: "virtiofs-bench".into(),
        })
        .map_err(|e| err("connect", e))?;
        let session = Session::new(cfg, Instant::now());
        let mut r = Raw41 {
            conn,
            session,
            file: Fh::EMPTY,
            open: Stateid::ANONYMOUS,
            calls: vec![Call::None; tags],
            timeout,
        };
        let mut path: Vec<Vec<u8>> = std::path::Path::new(&url.export)
            .components()
            .filter_map(|c| match c {
                std::path::Component::Normal(n) => Some(n.as_encoded_bytes().to_vec()),
                _ => None,
            })
            .collect();
        path.push(name.as_bytes().to_vec());
        let (fh, _) = r.step(&Step::Walk(path)).map_err(|e| err(&format!("LOOKUP of {name}"), e))?;
        r.file = fh.ok_or("LOOKUP: no file handle")?;
        let clientid = r.session.params().map(|p| p.clientid).unwrap_or_default();
        let (_, open) = r.step(&Step::Open(r.file, clientid)).map_err(|e| err("OPEN", e))?;
        r.open = open.ok_or("OPEN: no stateid")?;
        Ok(r)
    }

    /// Runs one set-up step to its end (blocking).
    fn step(&mut self, step: &Step) -> Result<Got, String> {
        let t0 = Instant::now();
        let mut sink = StepSink { step, out: None };
        let mut called = false;
        loop {
            let now = Instant::now();
            if now - t0 > self.timeout {
                return Err(format!(
                    "no answer within {:?} (session {:?})",
                    self.timeout,
                    self.session.state()
                ));
            }
            self.session.poll(now, &mut self.conn, &mut sink);
            if !called && self.session.state() == State::Ready {
                let (session, conn) = (&mut self.session, &mut self.conn);
                let mut sent = Ok(());
                step_ops(step, &mut |ops| sent = session.call(conn, now, 0, &Cred::ROOT, ops, &mut sink));
                sent.map_err(|e| e.to_string())?;
                called = true;
            }
            if let Some(out) = sink.out.take() {
                return out;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Sends a READ (`write` false) or WRITE of `count` bytes at `offset` as call `tag`.
    pub(super) fn io(
        &mut self,
        sink: &mut RawSink,
        tag: u32,
        write: bool,
        offset: u64,
        count: u32,
        unstable: bool,
    ) -> Result<(), String> {
        let call = if write {
            let stable = if unstable { Stable4::Unstable } else { Stable4::FileSync };
            Call::Write { offset, count, stable }
        } else {
            Call::Read { offset, count }
        };
        self.call(sink, tag, call)
    }

    /// Sends a COMMIT of the whole file as call `tag`.
    pub(super) fn commit(&mut self, sink: &mut RawSink, tag: u32) -> Result<(), String> {
        self.call(sink, tag, Call::Commit)
    }

    fn call(&mut self, sink: &mut RawSink, tag: u32, call: Call) -> Result<(), String> {
        let i = tag as usize;
        if i >= self.calls.len() {
            self.calls.resize(i + 1, Call::None);
        }
        self.calls[i] = call;
        let (fh, open) = (self.file, self.open);
        let mut io = IoSink { sink, calls: &self.calls, file: &fh, open };
        let (session, conn) = (&mut self.session, &mut self.conn);
        let mut r = Ok(());
        io_ops(call, &fh, open, &mut |ops| {
            r = session.call(conn, Instant::now(), tag, &Cred::ROOT, ops, &mut io)
        });
        r.map_err(|e| e.to_string())
    }

    /// One poll of the session: completions go to `sink`.
    pub(super) fn poll(&mut self, sink: &mut RawSink) {
        let mut io = IoSink { sink, calls: &self.calls, file: &self.file, open: self.open };
        self.session.poll(Instant::now(), &mut self.conn, &mut io);
    }

    /// The connection's counters.
    pub(super) fn conn_stats(&self) -> ConnStats {
        self.conn.stats()
    }
}

impl Drop for Raw41 {
    fn drop(&mut self) {
        self.timeout = Duration::from_secs(2);
        if self.session.state() == State::Ready {
            let close = Step::Close(self.file, self.open);
            let _ = self.step(&close);
        }
        let mut sink = StepSink { step: &Step::Walk(Vec::new()), out: None };
        self.session.close(Instant::now(), &mut sink);
        let t0 = Instant::now();
        while self.session.state() != State::Closed && t0.elapsed() < Duration::from_secs(2) {
            self.session.poll(Instant::now(), &mut self.conn, &mut sink);
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}
