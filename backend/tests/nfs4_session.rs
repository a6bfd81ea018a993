//! The NFSv4.1 session layer (`nfs::session::Session`) through the real non-blocking connection
//! (`Conn<Nfs41>`), driven by a poll loop here as a poller would:
//!
//! - against nfs-ganesha (the tests' harness, a lease of 6 s): establishment (what the server
//!   granted is printed), PUTROOTFH+GETATTR, the walk to the export, many calls in flight at
//!   once (GETATTRs, CREATEs, WRITEs from buffers in pieces, READs placed into them), an idle
//!   time past the lease renewed by lone SEQUENCEs, then DESTROY_SESSION and DESTROY_CLIENTID;
//! - ganesha killed and started again while a call is in flight: the session and client id are
//!   made again and the call completes;
//! - exactly once, against a scripted server with a reply cache: the reply to a CREATE is
//!   lost with its connection; the connection sends the call again on a new one with the same
//!   slot and sequence id, the server answers from its cache (once after a DELAY that keeps the
//!   slot), the CREATE is done once and its owner told once;
//! - no heap allocation per call in steady state (GETATTR, WRITE, READs placed and copied),
//!   counted by a counting global allocator on the polling thread.

#[path = "harness/counting.rs"]
mod counting;
#[path = "harness/ganesha.rs"]
mod ganesha;
mod nfs_fake_server;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nfs_fake_server::nfs4::{
    self, compound_reply, create_ok, create_session_ok, exchange_id_ok, failed, getattr_ok, getfh_ok, ok,
    seq_ok, Arg, Seq,
};
use nfs_fake_server::{Act, FakeServer};
use virtiofs_backend::io::{Reader, Writer};
use virtiofs_backend::nfs::conn::{CallError, CompoundReply, Conn, ConnConfig, Cred, Nfs41, ReadDone};
use virtiofs_backend::nfs::session::{client_owner, ClientShare, Session, SessionConfig, SessionSink, State};
use virtiofs_backend::nfs::wire::nfs4::{
    attr, Bitmap, ChannelAttrs, CreateKind, Fattr4, Fh, Nfsstat4, Op, OpNum, OpRes, SessionId, SetAttrs,
    Stable4, Stateid,
};
use vm_memory::VolatileSlice;

/// Memory in pieces, as a descriptor chain's (leaked: tests only).
struct GuestBuf(Vec<VolatileSlice<'static>>);

impl GuestBuf {
    fn new(data: &[u8], piece: usize) -> GuestBuf {
        GuestBuf(
            data.chunks(piece)
                .map(|c| {
                    let m: &'static mut [u8] = Box::leak(c.to_vec().into_boxed_slice());
                    VolatileSlice::from(m)
                })
                .collect(),
        )
    }

    fn contents(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for s in &self.0 {
            let mut b = vec![0u8; s.len()];
            s.copy_to(&mut b[..]);
            out.extend_from_slice(&b);
        }
        out
    }
}

/// A request of the test's, kept to give its operations whenever the session asks.
#[derive(Clone, Debug)]
enum Req {
    /// PUTROOTFH, GETATTR.
    RootAttr,
    /// PUTROOTFH, LOOKUP of each component, GETFH.
    Walk(Vec<Vec<u8>>),
    /// PUTFH, GETATTR.
    Attr(Fh),
    /// PUTFH, CREATE of a directory, GETFH.
    Mkdir(Fh, Vec<u8>),
    /// PUTFH, OPEN-less WRITE (anonymous stateid, FILE_SYNC) of the owner's buffer.
    Write(Fh, u64, u32),
    /// PUTFH, READ into the owner's buffer.
    Read(Fh, u64, u32),
}

const STAT: Bitmap = Bitmap::of(&[attr::TYPE, attr::SIZE, attr::FILEID, attr::MODE]);
static DIR_ATTRS: SetAttrs = SetAttrs { mode: Some(0o755), ..SetAttrs::NONE };

impl Req {
    fn with_ops(&self, f: &mut dyn FnMut(&[Op<'_>])) {
        match self {
            Req::RootAttr => f(&[Op::Putrootfh, Op::Getattr { attrs: STAT }]),
            Req::Walk(path) => {
                let mut ops = vec![Op::Putrootfh];
                ops.extend(path.iter().map(|c| Op::Lookup { name: c }));
                ops.push(Op::Getfh);
                f(&ops)
            }
            Req::Attr(fh) => f(&[Op::Putfh { fh }, Op::Getattr { attrs: STAT }]),
            Req::Mkdir(fh, name) => f(&[
                Op::Putfh { fh },
                Op::Create { kind: CreateKind::Dir, name, attrs: &DIR_ATTRS },
                Op::Getfh,
            ]),
            Req::Write(fh, offset, count) => f(&[
                Op::Putfh { fh },
                Op::Write {
                    stateid: Stateid::ANONYMOUS,
                    offset: *offset,
                    stable: Stable4::FileSync,
                    count: *count,
                },
            ]),
            Req::Read(fh, offset, count) => f(&[
                Op::Putfh { fh },
                Op::Read { stateid: Stateid::ANONYMOUS, offset: *offset, count: *count },
            ]),
        }
    }
}

/// What the owner was told of a call.
#[derive(Clone, Debug)]
struct Told {
    status: Nfsstat4,
    ops: Vec<OpNum>,
    fh: Option<Fh>,
    attr: Option<Fattr4>,
    read: Option<ReadDone>,
}

#[derive(Default)]
struct Owner {
    reqs: HashMap<u32, Req>,
    bufs: HashMap<u32, GuestBuf>,
    asked: Vec<u32>,
    done: HashMap<u32, Vec<Result<Told, CallError>>>,
}

impl SessionSink for Owner {
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>> {
        self.bufs.get(&tag).map(|b| Writer::new(&b.0))
    }

    fn payload(&mut self, tag: u32) -> Option<Reader<'_>> {
        self.bufs.get(&tag).map(|b| Reader::new(&b.0))
    }

    fn ops(&mut self, tag: u32, send: &mut dyn FnMut(&[Op<'_>])) {
        self.asked.push(tag);
        if let Some(r) = self.reqs.get(&tag) {
            r.with_ops(send);
        }
    }

    fn done(&mut self, tag: u32, res: Result<CompoundReply<'_>, CallError>) {
        let told = res.map(|r| {
            let mut t = Told { status: r.status, ops: Vec::new(), fh: None, attr: None, read: r.read };
            for op in r.results {
                let op = op.unwrap();
                match op {
                    OpRes::Getfh(fh) => t.fh = Some(fh),
                    OpRes::Getattr(a) => t.attr = Some(a),
                    _ => {}
                }
                t.ops.push(op.op());
            }
            t
        });
        self.done.entry(tag).or_default().push(told);
    }
}

/// A session over a connection, and its owner, driven by polls.
struct Client {
    conn: Conn<Nfs41>,
    s: Session,
    o: Owner,
}

impl Client {
    fn new(addr: std::net::SocketAddr, owner: &[u8], slots: u16, timeout: Duration) -> Client {
        let verifier = (std::process::id() as u64 ^ 0x5e55_1000).to_be_bytes();
        Self::sharing(addr, Arc::new(ClientShare::new(owner.to_vec(), verifier)), slots, timeout)
    }

    /// A session of the client `client` (other sessions may share it).
    fn sharing(
        addr: std::net::SocketAddr,
        client: Arc<ClientShare>,
        slots: u16,
        timeout: Duration,
    ) -> Client {
        let cfg = SessionConfig { client, slots, max_io: 1 << 20, timeout, cred: Cred::ROOT };
        let conn = Conn::new(ConnConfig {
            addr,
            slots: cfg.conn_slots(),
            max_io: 1 << 20,
            timeout,
            retransmit: Duration::from_secs(1),
            machine_name: "nfs4-session-test".into(),
        })
        .unwrap();
        Client { conn, s: Session::new(cfg, Instant::now()), o: Owner::default() }
    }

    fn poll(&mut self) {
        self.s.poll(Instant::now(), &mut self.conn, &mut self.o);
    }

    /// Polls until `done` holds, for at most `limit`.
    fn until(&mut self, limit: Duration, what: &str, done: impl Fn(&Client) -> bool) {
        let t0 = Instant::now();
        while !done(self) {
            assert!(
                t0.elapsed() < limit,
                "{what}: not within {limit:?} (state {:?}, {:?}, {:?})",
                self.s.state(),
                self.s.stats(),
                self.conn.stats()
            );
            self.poll();
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Polls for `d` whatever happens.
    fn idle(&mut self, d: Duration) {
        let t0 = Instant::now();
        while t0.elapsed() < d {
            self.poll();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn start(&mut self, tag: u32, req: Req) {
        self.o.reqs.insert(tag, req.clone());
        let (s, conn, o) = (&mut self.s, &mut self.conn, &mut self.o);
        let mut r = None;
        req.with_ops(&mut |ops| r = Some(s.call(conn, Instant::now(), tag, &Cred::ROOT, ops, o)));
        r.unwrap().unwrap();
    }

    /// Sends `req` and waits for its one answer.
    fn call(&mut self, tag: u32, req: Req) -> Told {
        self.start(tag, req);
        self.until(Duration::from_secs(20), "the call", |c| c.o.done.contains_key(&tag));
        self.told(tag)
    }

    /// Call `tag`'s one answer, which must have succeeded.
    fn told(&self, tag: u32) -> Told {
        let v = &self.o.done[&tag];
        assert_eq!(v.len(), 1, "one answer for call {tag}: {v:?}");
        let t = v[0].clone().unwrap();
        assert_eq!(t.status, Nfsstat4::Ok, "call {tag}: {t:?}");
        t
    }

    fn close(&mut self) {
        self.s.close(Instant::now(), &mut self.o);
        self.until(Duration::from_secs(10), "the session's end", |c| c.s.state() == State::Closed);
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

/// The export's path components under the pseudo root.
fn components(export: &std::path::Path) -> Vec<Vec<u8>> {
    export
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n.as_encoded_bytes().to_vec()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_session_against_ganesha_renews_its_lease_and_carries_many_calls() {
    const LEASE: u32 = 6;
    let g = ganesha::Ganesha::start_with_lease(Some(LEASE));
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], g.nfs_port()));
    let owner = client_owner(b"test host", &g.export().to_string_lossy(), "fs-lease");
    let mut c = Client::new(addr, &owner, 32, Duration::from_secs(20));
    c.until(Duration::from_secs(10), "establishment", |c| c.s.state() == State::Ready);
    let p = c.s.params().unwrap();
    let st = c.s.stats();
    eprintln!(
        "session: client id {:#x}, {:?}, fore channel granted {:?}, lease {:?}, usable slots {}, flags seen {:#x}",
        p.clientid, p.sessionid, p.fore, p.lease, p.usable_slots, st.status_flags_seen
    );
    assert_eq!(p.lease, Duration::from_secs(u64::from(LEASE)), "the lease from the lease_time attribute");
    assert!(p.fore.maxrequests >= 1 && p.fore.maxrequests <= 32, "{p:?}");
    assert!(p.fore.maxrequestsize >= 1 << 20, "{p:?}");
    assert_eq!((st.exchange_ids, st.sessions, st.reclaim_completes), (1, 1, 1));

    // PUTROOTFH + GETATTR: the pseudo root.
    let t = c.call(1, Req::RootAttr);
    assert_eq!(t.ops, [OpNum::Putrootfh, OpNum::Getattr], "SEQUENCE's result is the session's");
    assert!(t.attr.unwrap().ftype.is_some());
    // The walk down to the export.
    let export = c.call(2, Req::Walk(components(&g.export()))).fh.unwrap();

    // Many calls at once: directories, writes from buffers in pieces, then reads into them.
    let n = 24u32;
    for i in 0..n {
        c.start(100 + i, Req::Mkdir(export, format!("d{i}").into_bytes()));
    }
    c.until(Duration::from_secs(20), "the CREATEs", |c| (0..n).all(|i| c.o.done.contains_key(&(100 + i))));
    let file = {
        // A file to write: ganesha's FSAL_VFS serves what is in the export directory.
        std::fs::write(g.export().join("f"), b"").unwrap();
        c.call(3, Req::Walk([components(&g.export()), vec![b"f".to_vec()]].concat())).fh.unwrap()
    };
    let block = 256 << 10;
    for i in 0..8u32 {
        c.o.bufs.insert(200 + i, GuestBuf::new(&pattern(block, i as u8), 4096 + 512));
        c.start(200 + i, Req::Write(file, u64::from(i) * block as u64, block as u32));
    }
    for i in 0..8u32 {
        c.start(250 + i, Req::Attr(file));
    }
    assert!(c.s.in_flight() > 8, "calls in flight at once: {}", c.s.in_flight());
    c.until(Duration::from_secs(20), "the WRITEs", |c| (0..8).all(|i| c.o.done.contains_key(&(200 + i))));
    let on_disk = std::fs::read(g.export().join("f")).unwrap();
    for i in 0..8usize {
        assert_eq!(
            on_disk[i * block..(i + 1) * block],
            pattern(block, i as u8)[..],
            "block {i} on the export"
        );
    }
    for i in 0..8u32 {
        c.o.bufs.insert(300 + i, GuestBuf::new(&vec![0; block], 4096));
        c.start(300 + i, Req::Read(file, u64::from(7 - i) * block as u64, block as u32));
    }
    c.until(Duration::from_secs(20), "the READs", |c| (0..8).all(|i| c.o.done.contains_key(&(300 + i))));
    for i in 0..8u32 {
        let t = c.told(300 + i);
        assert_eq!(t.ops, [OpNum::Putfh]);
        assert_eq!(t.read.unwrap().count, block as u32);
        assert_eq!(c.o.bufs[&(300 + i)].contents(), pattern(block, 7 - i as u8), "read {i} placed");
    }
    for i in 0..n {
        let t = c.told(100 + i);
        assert_eq!(t.ops, [OpNum::Putfh, OpNum::Create, OpNum::Getfh]);
        assert!(g.export().join(format!("d{i}")).is_dir());
    }
    assert!(c.conn.stats().read_direct_bytes > 0, "big READs placed from the socket: {:?}", c.conn.stats());

    // Idle for more than the lease: lone SEQUENCEs keep it.
    let before = c.s.stats().renewals;
    c.idle(Duration::from_secs(u64::from(LEASE) * 3 / 2));
    let st = c.s.stats();
    eprintln!(
        "after {} s idle: {} renewals, flags seen {:#x}",
        LEASE * 3 / 2,
        st.renewals - before,
        st.status_flags_seen
    );
    assert!(st.renewals - before >= 3, "a renewal every third of the lease: {st:?}");
    let t = c.call(4, Req::Attr(export));
    assert_eq!(t.ops, [OpNum::Putfh, OpNum::Getattr]);
    let st = c.s.stats();
    assert_eq!((st.sessions, st.bad_sessions, st.stale_clientids), (1, 0, 0), "the same session: {st:?}");
    assert_eq!(st.status_flags_seen & 0x18, 0, "no state expired: {st:?}");
    assert_eq!(c.conn.stats().retransmits, 0);
    c.close();
}

#[test]
fn ganesha_restarted_under_a_call_the_session_is_made_again_and_the_call_completes() {
    let mut g = ganesha::Ganesha::start();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], g.nfs_port()));
    let owner = client_owner(b"test host", &g.export().to_string_lossy(), "fs-restart");
    let mut c = Client::new(addr, &owner, 8, Duration::from_secs(30));
    c.until(Duration::from_secs(10), "establishment", |c| c.s.state() == State::Ready);
    let first = c.s.params().unwrap();
    let export = c.call(1, Req::Walk(components(&g.export()))).fh.unwrap();

    g.kill();
    c.start(2, Req::Mkdir(export, b"after-restart".to_vec()));
    c.idle(Duration::from_millis(1500));
    assert!(!c.o.done.contains_key(&2), "no server: the call waits");
    g.start_again();
    c.until(Duration::from_secs(30), "the call after the restart", |c| c.o.done.contains_key(&2));
    let t = c.told(2);
    assert_eq!(t.ops, [OpNum::Putfh, OpNum::Create, OpNum::Getfh]);
    assert!(g.export().join("after-restart").is_dir());
    let p = c.s.params().unwrap();
    let st = c.s.stats();
    eprintln!(
        "after the restart: {st:?}, connection {:?}, session {:?} (was {:?})",
        c.conn.stats(),
        p.sessionid,
        first.sessionid
    );
    assert_ne!(p.sessionid, first.sessionid, "a new session");
    assert_eq!(st.sessions, 2);
    assert_eq!(st.exchange_ids, 2, "the client id was stale: a new one");
    assert_eq!(st.reclaim_completes, 2, "RECLAIM_COMPLETE once per client id");
    assert!(st.bad_sessions >= 1 && st.stale_clientids >= 1, "{st:?}");
    assert!(c.conn.stats().reconnects >= 1);
    // And it serves on.
    let t = c.call(3, Req::Attr(export));
    assert_eq!(t.ops, [OpNum::Putfh, OpNum::Getattr]);
    c.close();
}

/// Polls every client until `done` holds for all, for at most `limit`.
fn all_until(cs: &mut [Client], limit: Duration, what: &str, done: impl Fn(&Client) -> bool) {
    let t0 = Instant::now();
    while !cs.iter().all(&done) {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        for c in cs.iter_mut() {
            c.poll();
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[test]
fn a_pollers_sessions_share_one_client_id_through_a_restart_and_the_last_destroys_it() {
    let mut g = ganesha::Ganesha::start();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], g.nfs_port()));
    let owner = client_owner(b"test host", &g.export().to_string_lossy(), "fs-shared");
    let share = Arc::new(ClientShare::new(owner, *b"sharing!"));
    let mut cs: Vec<Client> =
        (0..4).map(|_| Client::sharing(addr, share.clone(), 8, Duration::from_secs(30))).collect();
    // Established at once, as pollers starting together would.
    all_until(&mut cs, Duration::from_secs(10), "establishment", |c| c.s.state() == State::Ready);
    let ps: Vec<_> = cs.iter().map(|c| c.s.params().unwrap()).collect();
    eprintln!("sessions: {:?}", ps.iter().map(|p| (p.clientid, p.sessionid)).collect::<Vec<_>>());
    assert!(ps.iter().all(|p| p.clientid == ps[0].clientid), "one client id");
    for (i, p) in ps.iter().enumerate() {
        assert!(ps[..i].iter().all(|q| q.sessionid != p.sessionid), "a session each");
    }
    let st = share.stats();
    assert_eq!((st.exchange_ids, st.sessions_created, st.sessions), (1, 4, 4));
    let reclaims: u64 = cs.iter().map(|c| c.s.stats().reclaim_completes).sum();
    assert_eq!(reclaims, 1, "RECLAIM_COMPLETE once for the client id");

    // A restart: each session finds it (BADSESSION, STALE_CLIENTID), one new client id.
    let export = cs[0].call(1, Req::Walk(components(&g.export()))).fh.unwrap();
    g.kill();
    g.start_again();
    for (i, c) in cs.iter_mut().enumerate() {
        c.start(10 + i as u32, Req::Mkdir(export, format!("after-{i}").into_bytes()));
    }
    all_until(&mut cs, Duration::from_secs(30), "the calls after the restart", |c| {
        c.o.done.keys().any(|t| (10..14).contains(t))
    });
    for (i, c) in cs.iter().enumerate() {
        assert_eq!(c.told(10 + i as u32).ops, [OpNum::Putfh, OpNum::Create, OpNum::Getfh]);
    }
    let ps2: Vec<_> = cs.iter().map(|c| c.s.params().unwrap()).collect();
    let ids: Vec<_> = ps2.iter().map(|p| (p.clientid, p.sessionid)).collect();
    let st = share.stats();
    // (Ganesha makes its ids from its start time in seconds: a restart within the same second
    // gives the same numbers again.)
    assert!(ps2.iter().all(|p| p.clientid == ps2[0].clientid), "{ids:?} {st:?}");
    let st = share.stats();
    assert_eq!((st.exchange_ids, st.sessions_created), (2, 8), "{st:?}");

    // Three sessions end: the client id stays for the fourth.
    let mut last = cs.pop().unwrap();
    for c in cs.iter_mut() {
        c.close();
    }
    assert_eq!(last.call(20, Req::Attr(export)).ops, [OpNum::Putfh, OpNum::Getattr]);
    assert_eq!(share.stats().exchange_ids, 2, "the client id was not destroyed under the last session");
    last.close();
    assert_eq!(share.stats().sessions, 0);
}

#[test]
fn ganesha_paused_past_the_retransmission_a_create_is_done_once() {
    let g = ganesha::Ganesha::start();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], g.nfs_port()));
    let owner = client_owner(b"test host", &g.export().to_string_lossy(), "fs-pause");
    let mut c = Client::new(addr, &owner, 8, Duration::from_secs(30));
    c.until(Duration::from_secs(10), "establishment", |c| c.s.state() == State::Ready);
    let export = c.call(1, Req::Walk(components(&g.export()))).fh.unwrap();
    // The server stops answering; the connection gives the call up after its retransmission
    // interval (1 s), connects again (the kernel accepts for the stopped server) and sends it
    // again, same slot and sequence id. The server then finds the CREATE twice: on the old
    // connection and on the new.
    g.signal(libc::SIGSTOP);
    let t0 = Instant::now();
    while !g.stopped() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the server does not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!("stopped after {:?}", t0.elapsed());
    c.start(2, Req::Mkdir(export, b"paused".to_vec()));
    c.idle(Duration::from_millis(2500));
    g.signal(libc::SIGCONT);
    c.until(Duration::from_secs(30), "the CREATE", |c| c.o.done.contains_key(&2));
    let t = c.told(2);
    assert_eq!(t.ops, [OpNum::Putfh, OpNum::Create, OpNum::Getfh], "done once: no EXIST");
    assert!(g.export().join("paused").is_dir());
    let (st, cs) = (c.s.stats(), c.conn.stats());
    eprintln!("paused server: {st:?}, connection {cs:?}");
    assert!(cs.retransmits >= 1 && cs.reconnects >= 1, "{cs:?}");
    assert_eq!((st.sessions, st.bad_sessions), (1, 0), "the same session on the new connection");
    c.close();
}

/// What the scripted server saw of each SEQUENCE-led COMPOUND: its connection, slot, sequence
/// id, cachethis and operations.
#[derive(Clone, Debug)]
struct Seen {
    conn: usize,
    seq: Seq,
    ops: Vec<OpNum>,
}

/// The scripted server, what it saw, and how many CREATEs it did.
type Scripted = (FakeServer, Arc<Mutex<Vec<Seen>>>, Arc<Mutex<u32>>);

/// A slot's last sequence id and, if it was to be cached, its reply's status and results.
type Cached = (u32, Option<(Nfsstat4, Vec<Vec<u8>>)>);

/// A server with a reply cache per slot that loses the first reply to a CREATE (and closes the
/// connection); with `delay_retry`, it answers the retransmission DELAY once (as if the CREATE
/// were still in progress) before answering from the cache.
fn scripted(delay_retry: bool) -> Scripted {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let created = Arc::new(Mutex::new(0u32));
    let (seen2, created2) = (seen.clone(), created.clone());
    const SID: SessionId = SessionId([0x5e; 16]);
    // Per slot: the last sequence id and its reply's results (None: not cached).
    let mut cache: HashMap<u32, Cached> = HashMap::new();
    let mut lost_one = false;
    let mut delayed_one = false;
    let server = FakeServer::start(move |call| {
        let c = nfs4::parse(&call.args);
        let Some(s) = c.seq() else {
            let results = match &c.ops[0] {
                Arg::ExchangeId { .. } => vec![exchange_id_ok(0x77, 1, 0)],
                Arg::CreateSession { sequence, fore, .. } => {
                    let granted =
                        ChannelAttrs { maxrequests: fore.maxrequests.min(8), maxoperations: 16, ..*fore };
                    vec![create_session_ok(SID, *sequence, &granted)]
                }
                Arg::DestroySession(_) => vec![ok(OpNum::DestroySession, &[])],
                Arg::DestroyClientid(_) => vec![ok(OpNum::DestroyClientid, &[])],
                a => panic!("{a:?} alone"),
            };
            return vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, &results))];
        };
        seen2.lock().unwrap().push(Seen { conn: call.conn, seq: s, ops: c.ops() });
        let (last, cached) = cache.get(&s.slot).cloned().unwrap_or((0, None));
        if s.seqid == last {
            // A retry: from the cache.
            if delay_retry && !delayed_one {
                delayed_one = true;
                let r = [failed(OpNum::Sequence, Nfsstat4::Delay)];
                return vec![Act::Send(compound_reply(call.xid, Nfsstat4::Delay, &r))];
            }
            let (status, results) = cached.expect("a retried call was cached (sa_cachethis)");
            let mut all = vec![seq_ok(&s, 7, 7, 0)];
            all.extend(results);
            return vec![Act::Send(compound_reply(call.xid, status, &all))];
        }
        assert_eq!(s.seqid, last.wrapping_add(1), "slot {} in order", s.slot);
        let mut results = Vec::new();
        let mut lose = false;
        for a in &c.ops[1..] {
            results.push(match a {
                Arg::Putrootfh => ok(OpNum::Putrootfh, &[]),
                Arg::Putfh(_) => ok(OpNum::Putfh, &[]),
                Arg::Getattr(_) => getattr_ok(&Fattr4 { lease_time: Some(60), ..Fattr4::default() }),
                Arg::ReclaimComplete { .. } => ok(OpNum::ReclaimComplete, &[]),
                Arg::Create { .. } => {
                    *created2.lock().unwrap() += 1;
                    lose = !lost_one;
                    lost_one = true;
                    create_ok()
                }
                Arg::Getfh => getfh_ok(&Fh::new(&[0xd1; 16]).unwrap()),
                a => panic!("{a:?} not scripted"),
            });
        }
        cache.insert(s.slot, (s.seqid, s.cachethis.then(|| (Nfsstat4::Ok, results.clone()))));
        if lose {
            // Done, and the reply lost with the connection.
            return vec![Act::Close];
        }
        let mut all = vec![seq_ok(&s, 7, 7, 0)];
        all.extend(results);
        vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, &all))]
    });
    (server, seen, created)
}

fn exactly_once(delay_retry: bool) {
    let (server, seen, created) = scripted(delay_retry);
    let mut c = Client::new(server.addr(), b"exactly-once", 4, Duration::from_secs(10));
    c.until(Duration::from_secs(10), "establishment", |c| c.s.state() == State::Ready);
    let root = Fh::new(&[1; 8]).unwrap();
    let t = c.call(1, Req::Mkdir(root, b"once".to_vec()));
    assert_eq!(t.ops, [OpNum::Putfh, OpNum::Create, OpNum::Getfh]);
    assert_eq!(t.fh, Some(Fh::new(&[0xd1; 16]).unwrap()));
    assert_eq!(c.o.done[&1].len(), 1, "one answer");
    assert_eq!(*created.lock().unwrap(), 1, "the CREATE was done once");
    let seen = seen.lock().unwrap().clone();
    let creates: Vec<&Seen> = seen.iter().filter(|s| s.ops.contains(&OpNum::Create)).collect();
    let expect = if delay_retry { 3 } else { 2 };
    assert_eq!(creates.len(), expect, "sent, then sent again: {creates:?}");
    assert!(
        creates.iter().all(|s| s.seq == creates[0].seq),
        "the same slot and sequence id each time: {creates:?}"
    );
    assert!(creates[0].seq.cachethis, "a CREATE's reply is cached");
    assert_eq!((creates[0].conn, creates[1].conn), (0, 1), "again on a new connection");
    let cs = c.conn.stats();
    assert_eq!((cs.retransmits, cs.reconnects), (1, 1));
    let st = c.s.stats();
    assert_eq!((st.sessions, st.bad_sessions, st.delays), (1, 0, u64::from(delay_retry)));
    eprintln!(
        "CREATE on slot {} sequence id {} seen {} times, done once; {st:?}",
        creates[0].seq.slot,
        creates[0].seq.seqid,
        creates.len()
    );
    c.close();
}

#[test]
fn a_lost_reply_to_a_create_is_answered_from_the_reply_cache() {
    exactly_once(false);
}

#[test]
fn a_retry_answered_delay_keeps_its_slot_and_gets_the_cached_reply() {
    exactly_once(true);
}

/// An owner that allocates nothing: one call at a time, its operations built on the stack.
struct Quiet {
    fh: Fh,
    /// 0: GETATTR, 1: WRITE, 2: READ of `len`.
    kind: u8,
    len: u32,
    data: GuestBuf,
    last: Option<Result<(Nfsstat4, Option<ReadDone>), CallError>>,
}

impl Quiet {
    fn with_ops(&self, f: &mut dyn FnMut(&[Op<'_>])) {
        let fh = &self.fh;
        let anon = Stateid::ANONYMOUS;
        match self.kind {
            0 => f(&[Op::Putfh { fh }, Op::Getattr { attrs: STAT }]),
            1 => f(&[
                Op::Putfh { fh },
                Op::Write { stateid: anon, offset: 0, stable: Stable4::Unstable, count: self.len },
            ]),
            _ => f(&[Op::Putfh { fh }, Op::Read { stateid: anon, offset: 0, count: self.len }]),
        }
    }
}

impl SessionSink for Quiet {
    fn read_buffer(&mut self, _: u32) -> Option<Writer<'_>> {
        Some(Writer::new(&self.data.0))
    }

    fn payload(&mut self, _: u32) -> Option<Reader<'_>> {
        let mut r = Reader::new(&self.data.0);
        r.truncate(self.len as usize);
        Some(r)
    }

    fn ops(&mut self, _: u32, send: &mut dyn FnMut(&[Op<'_>])) {
        self.with_ops(send);
    }

    fn done(&mut self, _: u32, res: Result<CompoundReply<'_>, CallError>) {
        self.last = Some(res.map(|r| (r.status, r.read)));
    }
}

#[test]
fn no_allocation_per_call_in_steady_state() {
    let g = ganesha::Ganesha::start();
    std::fs::write(g.export().join("f"), pattern(64 << 10, 4)).unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], g.nfs_port()));
    let owner = client_owner(b"test host", &g.export().to_string_lossy(), "fs-alloc");
    let mut c = Client::new(addr, &owner, 8, Duration::from_secs(20));
    c.until(Duration::from_secs(10), "establishment", |c| c.s.state() == State::Ready);
    let fh = c.call(1, Req::Walk([components(&g.export()), vec![b"f".to_vec()]].concat())).fh.unwrap();
    let mut q = Quiet { fh, kind: 0, len: 0, data: GuestBuf::new(&pattern(64 << 10, 4), 4096), last: None };
    let (mut s, mut conn) = (c.s, c.conn);
    let mut round = |count: bool| {
        for (kind, len) in [(0u8, 0u32), (1, 64 << 10), (2, 64 << 10), (2, 4096)] {
            q.kind = kind;
            q.len = len;
            q.last = None;
            counting::count_here(count);
            let fh = q.fh;
            let anon = Stateid::ANONYMOUS;
            let ops_write = [
                Op::Putfh { fh: &fh },
                Op::Write { stateid: anon, offset: 0, stable: Stable4::Unstable, count: len },
            ];
            let ops_read = [Op::Putfh { fh: &fh }, Op::Read { stateid: anon, offset: 0, count: len }];
            let ops_attr = [Op::Putfh { fh: &fh }, Op::Getattr { attrs: STAT }];
            let ops: &[Op<'_>] = match kind {
                0 => &ops_attr,
                1 => &ops_write,
                _ => &ops_read,
            };
            s.call(&mut conn, Instant::now(), 9, &Cred::ROOT, ops, &mut q).unwrap();
            let t0 = Instant::now();
            while q.last.is_none() {
                s.poll(Instant::now(), &mut conn, &mut q);
                assert!(t0.elapsed() < Duration::from_secs(20), "no reply");
            }
            counting::count_here(false);
            let (status, read) = q.last.take().unwrap().unwrap();
            assert_eq!(status, Nfsstat4::Ok);
            if kind == 2 {
                assert_eq!(read, Some(ReadDone { count: len, eof: len == 64 << 10 }));
            }
        }
    };
    for _ in 0..3 {
        round(false);
    }
    let before = counting::counted();
    for _ in 0..25 {
        round(true);
    }
    let n = counting::counted() - before;
    assert_eq!(n, 0, "heap allocations in 100 calls through the session and its connection");
    assert!(conn.stats().read_direct_bytes > 0);
}
