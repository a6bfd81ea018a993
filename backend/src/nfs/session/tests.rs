//! The session's state machine against a scripted transport: every call it sends is recorded
//! (its SEQUENCE and operations), every reply is made by hand, the clock is the test's.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::{ClientShare, Session, SessionConfig, SessionSink, State, Transport};
use crate::io::{Reader, Writer};
use crate::nfs::conn::{CallError, Compound, CompoundReply, Cred, Nfs41, Sink};
use crate::nfs::wire::nfs4::{
    attr, decode_compound, seq_status, Bitmap, ChannelAttrs, ClientId, Fattr4, Fh, Nfsstat4, Op, OpNum,
    OpRes, SessionId, SetAttrs, Verifier,
};
use crate::nfs::wire::xdr::{Decoder, Encoder};

/// One call the session made.
#[derive(Clone, Debug)]
struct Sent {
    tag: u32,
    /// SEQUENCE's session, sequence id, slot, highest slot id, cachethis.
    seq: Option<(SessionId, u32, u32, u32, bool)>,
    ops: Vec<OpNum>,
    exchange: Option<(Vec<u8>, Verifier)>,
    create: Option<(ClientId, u32, ChannelAttrs, ChannelAttrs, u32)>,
    since: Option<Instant>,
}

#[derive(Default)]
struct Script {
    sent: Vec<Sent>,
    replies: VecDeque<(u32, Result<Vec<u8>, CallError>)>,
    /// Refuse calls with `Full`.
    full: bool,
}

impl Script {
    fn record(&mut self, tag: u32, c: &Compound<'_>, since: Option<Instant>) -> Result<(), CallError> {
        if self.full {
            return Err(CallError::Full);
        }
        let mut s = Sent { tag, seq: None, ops: Vec::new(), exchange: None, create: None, since };
        for op in c.first.iter().chain(c.ops) {
            match *op {
                Op::Sequence { session, sequenceid, slotid, highest_slotid, cachethis } => {
                    s.seq = Some((session, sequenceid, slotid, highest_slotid, cachethis))
                }
                Op::ExchangeId(x) => s.exchange = Some((x.owner_id.to_vec(), x.verifier)),
                Op::CreateSession(cs) => {
                    s.create = Some((cs.clientid, cs.sequence, cs.fore, cs.back, cs.flags))
                }
                _ => {}
            }
            if op.num() != OpNum::Sequence {
                s.ops.push(op.num());
            }
        }
        self.sent.push(s);
        Ok(())
    }

    /// The calls sent since the last look.
    fn take(&mut self) -> Vec<Sent> {
        std::mem::take(&mut self.sent)
    }

    fn reply(&mut self, tag: u32, body: Vec<u8>) {
        self.replies.push_back((tag, Ok(body)));
    }

    fn fail(&mut self, tag: u32, e: CallError) {
        self.replies.push_back((tag, Err(e)));
    }
}

impl Transport for Script {
    fn call(
        &mut self,
        tag: u32,
        _: &Cred,
        c: &Compound<'_>,
        _: &mut dyn Sink<Nfs41>,
    ) -> Result<(), CallError> {
        self.record(tag, c, None)
    }

    fn queue(&mut self, tag: u32, _: &Cred, c: &Compound<'_>, since: Instant) -> Result<(), CallError> {
        self.record(tag, c, Some(since))
    }

    fn send_queued(&mut self, _: &mut dyn Sink<Nfs41>) {}

    fn poll(&mut self, _now: Instant, sink: &mut dyn Sink<Nfs41>) {
        while let Some((tag, r)) = self.replies.pop_front() {
            match r {
                Err(e) => sink.done(tag, Err(e)),
                Ok(body) => {
                    let c = decode_compound(&mut Decoder::new(&body)).expect("a hand-made reply decodes");
                    let reply =
                        CompoundReply { status: c.status, tag: c.tag, results: c.results, read: None };
                    sink.done(tag, Ok(reply));
                }
            }
        }
    }
}

/// What the owner was told of a call: the COMPOUND's status and the results after SEQUENCE.
type Told = (u32, Result<(Nfsstat4, Vec<OpNum>), CallError>);

/// The owner: its calls' operations, what it was asked and told.
#[derive(Default)]
struct Owner {
    ops: HashMap<u32, Vec<Op<'static>>>,
    asked: Vec<u32>,
    done: Vec<Told>,
}

impl SessionSink for Owner {
    fn read_buffer(&mut self, _: u32) -> Option<Writer<'_>> {
        None
    }

    fn payload(&mut self, _: u32) -> Option<Reader<'_>> {
        None
    }

    fn ops(&mut self, tag: u32, send: &mut dyn FnMut(&[Op<'_>])) {
        self.asked.push(tag);
        if let Some(ops) = self.ops.get(&tag) {
            send(ops);
        }
    }

    fn done(&mut self, tag: u32, res: Result<CompoundReply<'_>, CallError>) {
        let r = res.map(|r| (r.status, r.results.map(|r| r.unwrap().op()).collect()));
        self.done.push((tag, r));
    }
}

fn enc(f: impl FnOnce(&mut Encoder<'_>)) -> Vec<u8> {
    let mut buf = vec![0u8; 8192];
    let mut e = Encoder::new(&mut buf);
    f(&mut e);
    let n = e.position();
    buf.truncate(n);
    buf
}

/// A COMPOUND4res: `status`, an empty tag, the results.
fn compound(status: Nfsstat4, results: &[Vec<u8>]) -> Vec<u8> {
    let mut v = enc(|e| {
        e.u32(status.to_u32()).unwrap();
        e.opaque(b"", 256).unwrap();
        e.u32(results.len() as u32).unwrap();
    });
    for r in results {
        v.extend_from_slice(r);
    }
    v
}

fn ok(op: OpNum, body: &[u8]) -> Vec<u8> {
    let mut v = enc(|e| {
        e.u32(op as u32).unwrap();
        e.u32(0).unwrap();
    });
    v.extend_from_slice(body);
    v
}

fn failed(op: OpNum, status: Nfsstat4) -> Vec<u8> {
    enc(|e| {
        e.u32(op as u32).unwrap();
        e.u32(status.to_u32()).unwrap();
    })
}

const SID1: SessionId = SessionId([1; 16]);
const SID2: SessionId = SessionId([2; 16]);
const SID3: SessionId = SessionId([3; 16]);
const CLIENT1: ClientId = 0x1111;
const CLIENT2: ClientId = 0x2222;

/// SEQUENCE's result echoing `s`'s, with these slot limits and flags.
fn seq_res(s: &Sent, highest: u32, target: u32, flags: u32) -> Vec<u8> {
    let (sid, seqid, slot, _, _) = s.seq.expect("a SEQUENCE");
    ok(
        OpNum::Sequence,
        &enc(|e| {
            sid.encode(e).unwrap();
            e.u32(seqid).unwrap();
            e.u32(slot).unwrap();
            e.u32(highest).unwrap();
            e.u32(target).unwrap();
            e.u32(flags).unwrap();
        }),
    )
}

/// A successful reply to `s`: SEQUENCE's result then an empty result per operation (those of
/// the operations used here have none).
fn answer(s: &Sent) -> Vec<u8> {
    let mut results = vec![seq_res(s, 63, 63, 0)];
    for op in &s.ops {
        results.push(match op {
            OpNum::Getattr => ok(*op, &enc(|e| Fattr4::default().encode(e).unwrap())),
            OpNum::Create => ok(
                *op,
                &enc(|e| {
                    e.bool(true).unwrap();
                    e.u64(1).unwrap();
                    e.u64(2).unwrap();
                    Bitmap::EMPTY.encode(e).unwrap();
                }),
            ),
            _ => ok(*op, &[]),
        });
    }
    compound(Nfsstat4::Ok, &results)
}

/// A reply to `s` whose SEQUENCE failed with `status`.
fn seq_failed(status: Nfsstat4) -> Vec<u8> {
    compound(status, &[failed(OpNum::Sequence, status)])
}

fn exchange_ok(clientid: ClientId, sequence: u32, flags: u32) -> Vec<u8> {
    compound(
        Nfsstat4::Ok,
        &[ok(
            OpNum::ExchangeId,
            &enc(|e| {
                e.u64(clientid).unwrap();
                e.u32(sequence).unwrap();
                e.u32(flags).unwrap();
                e.u32(0).unwrap(); // SP4_NONE
                e.u64(7).unwrap();
                e.opaque(b"server", 1024).unwrap();
                e.opaque(b"scope", 1024).unwrap();
                e.u32(0).unwrap(); // no impl id
            }),
        )],
    )
}

fn create_ok(sid: SessionId, sequence: u32, slots: u32) -> Vec<u8> {
    let fore = ChannelAttrs {
        headerpadsize: 0,
        maxrequestsize: 1 << 20,
        maxresponsesize: 1 << 20,
        maxresponsesize_cached: 8192,
        maxoperations: 16,
        maxrequests: slots,
        rdma_ird: None,
    };
    compound(
        Nfsstat4::Ok,
        &[ok(
            OpNum::CreateSession,
            &enc(|e| {
                sid.encode(e).unwrap();
                e.u32(sequence).unwrap();
                e.u32(0).unwrap();
                fore.encode(e).unwrap();
                ChannelAttrs { maxrequests: 1, ..fore }.encode(e).unwrap();
            }),
        )],
    )
}

/// The reply to the session's first COMPOUND: the lease, RECLAIM_COMPLETE's result if asked.
fn start_ok(s: &Sent, lease: u32) -> Vec<u8> {
    let a = Fattr4 { lease_time: Some(lease), ..Fattr4::default() };
    let mut results = vec![
        seq_res(s, 63, 63, seq_status::CB_PATH_DOWN),
        ok(OpNum::Putrootfh, &[]),
        ok(OpNum::Getattr, &enc(|e| a.encode(e).unwrap())),
    ];
    if s.ops.contains(&OpNum::ReclaimComplete) {
        results.push(ok(OpNum::ReclaimComplete, &[]));
    }
    compound(Nfsstat4::Ok, &results)
}

struct Rig {
    s: Session,
    t: Script,
    o: Owner,
    now: Instant,
}

const OWN: u32 = u32::MAX;
const VERF: Verifier = *b"incarnat";
const GETATTR: [Op<'static>; 2] = [Op::Putrootfh, Op::Getattr { attrs: Bitmap::of(&[attr::SIZE]) }];
static NONE: SetAttrs = SetAttrs::NONE;
const CREATE: [Op<'static>; 2] =
    [Op::Putrootfh, Op::Create { kind: crate::nfs::wire::nfs4::CreateKind::Dir, name: b"d", attrs: &NONE }];

impl Rig {
    fn new(slots: u16) -> Rig {
        Self::sharing(slots, std::sync::Arc::new(ClientShare::new(b"owner".to_vec(), VERF)), Instant::now())
    }

    /// A session of the client share `client`.
    fn sharing(slots: u16, client: std::sync::Arc<ClientShare>, now: Instant) -> Rig {
        let cfg = SessionConfig {
            client,
            slots,
            max_io: 1 << 20,
            timeout: Duration::from_secs(10),
            cred: Cred::ROOT,
        };
        Rig { s: Session::new(cfg, now), t: Script::default(), o: Owner::default(), now }
    }

    fn poll(&mut self) {
        self.s.poll(self.now, &mut self.t, &mut self.o);
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.poll();
    }

    /// The one call sent since the last look.
    fn one(&mut self) -> Sent {
        let mut v = self.t.take();
        assert_eq!(v.len(), 1, "one call expected: {v:?}");
        v.remove(0)
    }

    fn nothing_sent(&mut self) {
        let v = self.t.take();
        assert!(v.is_empty(), "nothing expected: {v:?}");
    }

    /// Answers the session's establishment: `clientid`, session `sid` of `slots` slots.
    fn establish(&mut self, clientid: ClientId, sid: SessionId, slots: u32) {
        self.poll();
        let x = self.one();
        assert_eq!((x.tag, x.ops.as_slice()), (OWN, &[OpNum::ExchangeId][..]));
        self.t.reply(OWN, exchange_ok(clientid, 5, 0));
        self.poll();
        let c = self.one();
        assert_eq!(c.ops, [OpNum::CreateSession]);
        let (cid, seq, ..) = c.create.unwrap();
        assert_eq!(cid, clientid);
        self.t.reply(OWN, create_ok(sid, seq, slots));
        self.poll();
        let st = self.one();
        assert_eq!(st.ops[..2], [OpNum::Putrootfh, OpNum::Getattr]);
        self.t.reply(OWN, start_ok(&st, 90));
        self.poll();
        assert_eq!(self.s.state(), State::Ready);
    }

    fn call(&mut self, tag: u32, ops: &[Op<'static>]) -> Result<(), CallError> {
        self.o.ops.insert(tag, ops.to_vec());
        self.s.call(&mut self.t, self.now, tag, &Cred::ROOT, ops, &mut self.o)
    }
}

#[test]
fn establishment_asks_what_the_connection_can_take_and_reclaims_once() {
    let mut r = Rig::new(8);
    assert_eq!(r.s.state(), State::NoClient);
    r.poll();
    let x = r.one();
    assert_eq!(x.exchange, Some((b"owner".to_vec(), VERF)));
    assert!(x.seq.is_none(), "EXCHANGE_ID goes alone");
    r.t.reply(OWN, exchange_ok(CLIENT1, 5, 0));
    r.poll();
    let c = r.one();
    let (cid, seq, fore, back, flags) = c.create.unwrap();
    assert_eq!((cid, seq, flags), (CLIENT1, 5, 0), "the client id and its sequence; no back channel flag");
    assert_eq!(fore.maxrequests, 8, "the session's slots");
    assert_eq!((fore.maxrequestsize, fore.maxresponsesize), ((1 << 20) + 8192, (1 << 20) + 4096));
    assert_eq!(back.maxrequests, 1);
    r.t.reply(OWN, create_ok(SID1, 5, 4));
    r.poll();
    let st = r.one();
    assert_eq!(st.seq, Some((SID1, 1, 0, 0, false)), "slot 0, sequence id 1");
    assert_eq!(st.ops, [OpNum::Putrootfh, OpNum::Getattr, OpNum::ReclaimComplete]);
    assert_eq!(r.s.state(), State::Starting);
    r.t.reply(OWN, start_ok(&st, 90));
    r.poll();
    assert_eq!(r.s.state(), State::Ready);
    let p = r.s.params().unwrap();
    assert_eq!(
        (p.clientid, p.sessionid, p.fore.maxrequests, p.lease),
        (CLIENT1, SID1, 4, Duration::from_secs(90))
    );
    let st = r.s.stats();
    assert_eq!((st.exchange_ids, st.sessions, st.reclaim_completes), (1, 1, 1));
    assert_eq!(st.status_flags_seen, seq_status::CB_PATH_DOWN, "flags kept as data");
    r.nothing_sent();
}

#[test]
fn calls_take_the_lowest_free_slots_and_get_their_results_after_sequence() {
    let mut r = Rig::new(4);
    r.establish(CLIENT1, SID1, 4);
    r.call(1, &GETATTR).unwrap();
    r.call(2, &CREATE).unwrap();
    let v = r.t.take();
    assert_eq!(v.len(), 2, "both sent at once");
    assert_eq!(v[0].seq, Some((SID1, 2, 0, 0, false)), "slot 0 after the first COMPOUND's sequence id 1");
    assert_eq!(v[1].seq, Some((SID1, 1, 1, 1, true)), "slot 1, highest slot id 1, CREATE cached");
    assert_eq!(v[0].since, None, "sent at once, not queued");
    r.t.reply(v[1].tag, answer(&v[1]));
    r.t.reply(v[0].tag, answer(&v[0]));
    r.poll();
    assert_eq!(
        r.o.done,
        vec![
            (2, Ok((Nfsstat4::Ok, vec![OpNum::Putrootfh, OpNum::Create]))),
            (1, Ok((Nfsstat4::Ok, vec![OpNum::Putrootfh, OpNum::Getattr])))
        ]
    );
    assert!(r.o.asked.is_empty(), "nothing was asked again");
    // The slots moved on: sequence ids 3 and 2.
    r.call(3, &GETATTR).unwrap();
    r.call(4, &GETATTR).unwrap();
    let v = r.t.take();
    assert_eq!((v[0].seq.unwrap().1, v[1].seq.unwrap().1), (3, 2));
    assert_eq!(r.s.in_flight(), 2);
}

#[test]
fn a_full_table_refuses_and_the_servers_target_holds_calls_back() {
    let mut r = Rig::new(4);
    r.establish(CLIENT1, SID1, 4);
    for tag in 0..4 {
        r.call(tag, &GETATTR).unwrap();
    }
    assert_eq!(r.call(9, &GETATTR), Err(CallError::Full), "as many calls as slots");
    let v = r.t.take();
    assert_eq!(v.len(), 4);
    // The server wants two slots only: after the replies, slots 2 and 3 are not used.
    for s in &v {
        let mut results = vec![seq_res(s, 3, 1, 0)];
        results.extend(s.ops.iter().map(|op| match op {
            OpNum::Getattr => ok(*op, &enc(|e| Fattr4::default().encode(e).unwrap())),
            _ => ok(*op, &[]),
        }));
        r.t.reply(s.tag, compound(Nfsstat4::Ok, &results));
    }
    r.poll();
    assert_eq!(r.s.params().unwrap().usable_slots, 2);
    for tag in 10..13 {
        r.call(tag, &GETATTR).unwrap();
    }
    let v = r.t.take();
    assert_eq!(v.len(), 2, "the third waits");
    assert!(v.iter().all(|s| s.seq.unwrap().2 < 2));
    r.t.reply(v[0].tag, answer(&v[0]));
    r.poll();
    let w = r.one();
    assert_eq!(r.o.asked, vec![12], "the waiting call goes when a slot frees, its operations asked then");
    assert_eq!(w.ops, [OpNum::Putrootfh, OpNum::Getattr]);
    assert_eq!(r.s.stats().waited, 1);
}

#[test]
fn badsession_makes_a_new_session_and_the_call_goes_again_on_it() {
    for status in [Nfsstat4::BadSession, Nfsstat4::DeadSession] {
        let mut r = Rig::new(4);
        r.establish(CLIENT1, SID1, 4);
        r.call(1, &CREATE).unwrap();
        let c = r.one();
        r.t.reply(c.tag, seq_failed(status));
        r.poll();
        assert!(r.o.done.is_empty(), "not the owner's business");
        assert_eq!(r.s.state(), State::NoSession);
        let cs = r.one();
        let (cid, seq, ..) = cs.create.unwrap();
        assert_eq!((cid, seq), (CLIENT1, 6), "the same client id, its next CREATE_SESSION sequence");
        r.t.reply(OWN, create_ok(SID2, 6, 4));
        r.poll();
        let st = r.one();
        assert_eq!(
            st.ops,
            [OpNum::Putrootfh, OpNum::Getattr],
            "RECLAIM_COMPLETE was done for this client id"
        );
        assert_eq!(st.seq.unwrap().0, SID2);
        r.t.reply(OWN, start_ok(&st, 90));
        r.poll();
        let again = r.one();
        assert_eq!(again.tag, c.tag);
        assert_eq!(again.seq.unwrap().0, SID2, "on the new session");
        assert!(again.seq.unwrap().4, "still cached");
        assert_eq!(r.o.asked, vec![1]);
        r.t.reply(again.tag, answer(&again));
        r.poll();
        assert_eq!(r.o.done.len(), 1, "one answer");
        assert!(r.o.done[0].1.is_ok());
        let st = r.s.stats();
        assert_eq!((st.bad_sessions, st.sessions, st.resent, st.exchange_ids), (1, 2, 1, 1));
    }
}

#[test]
fn stale_clientid_makes_a_new_client_which_reclaims_again() {
    let mut r = Rig::new(4);
    r.establish(CLIENT1, SID1, 4);
    r.call(1, &GETATTR).unwrap();
    r.call(2, &GETATTR).unwrap();
    let v = r.t.take();
    // The server restarted: BADSESSION, then CREATE_SESSION finds the client id stale.
    r.t.reply(v[0].tag, seq_failed(Nfsstat4::BadSession));
    r.poll();
    let cs = r.one();
    assert!(cs.create.is_some());
    r.t.reply(v[1].tag, seq_failed(Nfsstat4::BadSession));
    r.t.reply(
        OWN,
        compound(Nfsstat4::StaleClientid, &[failed(OpNum::CreateSession, Nfsstat4::StaleClientid)]),
    );
    r.poll();
    assert_eq!(r.s.state(), State::NoClient);
    let x = r.one();
    assert!(x.exchange.is_some());
    r.t.reply(OWN, exchange_ok(CLIENT2, 1, 0));
    r.poll();
    let cs = r.one();
    assert_eq!(cs.create.unwrap().0, CLIENT2);
    assert_eq!(cs.create.unwrap().1, 1);
    r.t.reply(OWN, create_ok(SID2, 1, 4));
    r.poll();
    let st = r.one();
    assert_eq!(st.ops.last(), Some(&OpNum::ReclaimComplete), "a new client id reclaims again");
    r.t.reply(OWN, start_ok(&st, 90));
    r.poll();
    let v2 = r.t.take();
    assert_eq!(v2.len(), 2, "both calls go again");
    assert!(v2.iter().all(|s| s.seq.unwrap().0 == SID2));
    for s in &v2 {
        r.t.reply(s.tag, answer(s));
    }
    r.poll();
    assert_eq!(r.o.done.len(), 2);
    assert_eq!(v.len(), 2);
    let st = r.s.stats();
    assert_eq!((st.stale_clientids, st.exchange_ids, st.reclaim_completes), (1, 2, 2));
    // A STALE_CLIENTID from an operation does the same.
    r.call(3, &GETATTR).unwrap();
    let c = r.one();
    r.t.reply(
        c.tag,
        compound(
            Nfsstat4::StaleClientid,
            &[seq_res(&c, 63, 63, 0), failed(OpNum::Putrootfh, Nfsstat4::StaleClientid)],
        ),
    );
    r.poll();
    assert_eq!(r.s.state(), State::NoClient);
    assert!(r.one().exchange.is_some());
}

#[test]
fn seq_misordered_resynchronises_the_slot() {
    let mut r = Rig::new(1);
    r.establish(CLIENT1, SID1, 1);
    // A call that ended without a reply: its sequence id may or may not have been taken.
    r.call(1, &GETATTR).unwrap();
    let c = r.one();
    assert_eq!(c.seq.unwrap().1, 2);
    r.t.fail(c.tag, CallError::TimedOut);
    r.poll();
    assert_eq!(r.o.done[0], (1, Err(CallError::TimedOut)));
    r.call(2, &GETATTR).unwrap();
    let c = r.one();
    assert_eq!(c.seq.unwrap().1, 3, "counted as taken");
    r.t.reply(c.tag, seq_failed(Nfsstat4::SeqMisordered));
    r.poll();
    let again = r.one();
    assert_eq!((again.tag, again.seq.unwrap().1), (c.tag, 2), "it was not: one back");
    assert_eq!(r.o.asked, vec![2]);
    r.t.reply(again.tag, answer(&again));
    r.poll();
    assert!(r.o.done[1].1.is_ok());
    // A slot the server started over: from sequence id 1.
    r.call(3, &GETATTR).unwrap();
    let c = r.one();
    assert_eq!(c.seq.unwrap().1, 3);
    r.t.reply(c.tag, seq_failed(Nfsstat4::SeqMisordered));
    r.poll();
    let again = r.one();
    assert_eq!(again.seq.unwrap().1, 1);
    // Twice: the session is given up for a new one.
    r.t.reply(again.tag, seq_failed(Nfsstat4::SeqMisordered));
    r.poll();
    assert_eq!(r.s.state(), State::NoSession);
    let cs = r.one();
    r.t.reply(OWN, create_ok(SID2, cs.create.unwrap().1, 1));
    r.poll();
    let st = r.one();
    r.t.reply(OWN, start_ok(&st, 90));
    r.poll();
    let last = r.one();
    assert_eq!((last.tag, last.seq.unwrap().0, last.seq.unwrap().1), (c.tag, SID2, 2));
    assert_eq!(r.s.stats().misordered, 3);
}

#[test]
fn delay_from_sequence_keeps_the_slot_and_sequence_id_and_never_blocks() {
    let mut r = Rig::new(2);
    r.establish(CLIENT1, SID1, 2);
    r.call(1, &CREATE).unwrap();
    let first = r.one();
    r.t.reply(first.tag, seq_failed(Nfsstat4::Delay));
    r.poll();
    r.nothing_sent();
    // Another call meanwhile takes the other slot.
    r.call(2, &GETATTR).unwrap();
    let other = r.one();
    assert_ne!(other.seq.unwrap().2, first.seq.unwrap().2, "the delayed call keeps its slot");
    r.advance(Duration::from_millis(49));
    r.nothing_sent();
    let t = r.s.next_timer().unwrap();
    assert_eq!(t.duration_since(r.now), Duration::from_millis(1), "the poller may sleep until then");
    r.advance(Duration::from_millis(1));
    let again = r.one();
    assert_eq!(again.seq, first.seq, "the same slot and sequence id: the reply cache answers");
    assert_eq!(again.since, Some(r.now - Duration::from_millis(50)), "its time-out from the first send");
    r.t.reply(again.tag, answer(&again));
    r.poll();
    assert_eq!(r.o.done.len(), 1);
    assert_eq!(r.s.stats().delays, 1);
}

#[test]
fn delay_from_an_operation_sends_the_compound_again_as_a_new_request() {
    let mut r = Rig::new(2);
    r.establish(CLIENT1, SID1, 2);
    r.call(1, &CREATE).unwrap();
    let first = r.one();
    r.t.reply(
        first.tag,
        compound(
            Nfsstat4::Delay,
            &[seq_res(&first, 1, 1, 0), ok(OpNum::Putrootfh, &[]), failed(OpNum::Create, Nfsstat4::Delay)],
        ),
    );
    r.poll();
    r.nothing_sent();
    r.advance(Duration::from_millis(50));
    let again = r.one();
    let (a, b) = (first.seq.unwrap(), again.seq.unwrap());
    assert_eq!((b.2, b.1), (a.2, a.1 + 1), "the lowest slot again, its next sequence id");
    r.t.reply(again.tag, answer(&again));
    r.poll();
    assert!(r.o.done[0].1.is_ok());
}

#[test]
fn delay_after_an_operation_that_must_not_run_twice_goes_to_the_owner_and_grace_waits_longer() {
    let mut r = Rig::new(2);
    r.establish(CLIENT1, SID1, 2);
    // CREATE ran, then GETATTR after it was answered DELAY: sending it all again would make the
    // directory twice (EEXIST); the owner gets the reply and sends the rest.
    let ops = [CREATE[0], CREATE[1], Op::Getattr { attrs: Bitmap::of(&[attr::SIZE]) }];
    r.call(1, &ops).unwrap();
    let first = r.one();
    let create_res = {
        ok(
            OpNum::Create,
            &enc(|e| {
                e.bool(true).unwrap();
                e.u64(1).unwrap();
                e.u64(2).unwrap();
                Bitmap::EMPTY.encode(e).unwrap();
            }),
        )
    };
    r.t.reply(
        first.tag,
        compound(
            Nfsstat4::Delay,
            &[
                seq_res(&first, 1, 1, 0),
                ok(OpNum::Putrootfh, &[]),
                create_res,
                failed(OpNum::Getattr, Nfsstat4::Delay),
            ],
        ),
    );
    r.poll();
    r.advance(Duration::from_millis(100));
    r.nothing_sent();
    let told = r.o.done[0].1.clone().unwrap();
    assert_eq!(told, (Nfsstat4::Delay, vec![OpNum::Putrootfh, OpNum::Create, OpNum::Getattr]));

    // GRACE on an operation before anything ran: again, after the grace wait (not DELAY's).
    r.call(2, &CREATE).unwrap();
    let first = r.one();
    r.t.reply(
        first.tag,
        compound(
            Nfsstat4::Grace,
            &[seq_res(&first, 1, 1, 0), ok(OpNum::Putrootfh, &[]), failed(OpNum::Create, Nfsstat4::Grace)],
        ),
    );
    r.poll();
    r.advance(Duration::from_millis(100));
    r.nothing_sent();
    r.advance(Duration::from_millis(200));
    let again = r.one();
    assert_eq!(again.ops, [OpNum::Putrootfh, OpNum::Create]);
    r.t.reply(again.tag, answer(&again));
    r.poll();
    assert_eq!(r.o.done.len(), 2);
    assert!(r.o.done[1].1.is_ok());
}

#[test]
fn false_retry_and_uncached_replies() {
    let mut r = Rig::new(1);
    r.establish(CLIENT1, SID1, 1);
    r.call(1, &GETATTR).unwrap();
    let c = r.one();
    r.t.reply(c.tag, seq_failed(Nfsstat4::SeqFalseRetry));
    r.poll();
    let again = r.one();
    assert_eq!(again.seq.unwrap().1, c.seq.unwrap().1 + 1, "past the request the server holds");
    // An idempotent call whose reply was not kept goes again; a CREATE's owner is told.
    r.t.reply(again.tag, seq_failed(Nfsstat4::RetryUncachedRep));
    r.poll();
    let third = r.one();
    assert_eq!(third.seq.unwrap().1, again.seq.unwrap().1 + 1);
    r.t.reply(third.tag, answer(&third));
    r.poll();
    r.call(2, &CREATE).unwrap();
    let c = r.one();
    r.t.reply(c.tag, seq_failed(Nfsstat4::RetryUncachedRep));
    r.poll();
    r.nothing_sent();
    assert_eq!(r.o.done[1], (2, Ok((Nfsstat4::RetryUncachedRep, vec![]))));
    let st = r.s.stats();
    assert_eq!((st.false_retries, st.uncached), (1, 2));
}

#[test]
fn badslot_lowers_the_slots_used() {
    let mut r = Rig::new(4);
    r.establish(CLIENT1, SID1, 4);
    for tag in 0..3 {
        r.call(tag, &GETATTR).unwrap();
    }
    let v = r.t.take();
    assert_eq!(v[2].seq.unwrap().2, 2);
    r.t.reply(v[2].tag, seq_failed(Nfsstat4::BadSlot));
    let (get, attrs) =
        (ok(OpNum::Putrootfh, &[]), ok(OpNum::Getattr, &enc(|e| Fattr4::default().encode(e).unwrap())));
    r.t.reply(v[0].tag, compound(Nfsstat4::Ok, &[seq_res(&v[0], 1, 1, 0), get, attrs]));
    r.poll();
    assert_eq!(r.s.params().unwrap().usable_slots, 2);
    let again = r.one();
    assert_eq!((again.tag, again.seq.unwrap().2), (v[2].tag, 0));
    assert_eq!(r.s.stats().bad_slots, 1);
}

#[test]
fn a_lone_sequence_renews_the_lease_after_a_third_of_it_idle() {
    let mut r = Rig::new(2);
    r.establish(CLIENT1, SID1, 2);
    let lease = Duration::from_secs(90);
    r.advance(Duration::from_secs(20));
    r.call(1, &GETATTR).unwrap();
    let c = r.one();
    r.t.reply(c.tag, answer(&c));
    r.poll();
    // The reply renewed the lease: the next renewal is a third of it after that.
    r.advance(lease / 3 - Duration::from_millis(1));
    r.nothing_sent();
    assert_eq!(r.s.next_timer(), Some(r.now + Duration::from_millis(1)));
    r.advance(Duration::from_millis(1));
    let renew = r.one();
    assert_eq!((renew.tag, renew.ops.len()), (OWN, 0), "a lone SEQUENCE");
    assert!(!renew.seq.unwrap().4);
    r.advance(Duration::from_secs(5));
    r.nothing_sent();
    r.t.reply(OWN, compound(Nfsstat4::Ok, &[seq_res(&renew, 1, 1, 0)]));
    r.poll();
    r.advance(lease / 3 - Duration::from_secs(1));
    r.nothing_sent();
    r.advance(Duration::from_secs(1));
    assert_eq!(r.one().ops.len(), 0, "again a third of the lease after the last answer");
    assert_eq!(r.s.stats().renewals, 2);
}

#[test]
fn calls_wait_for_the_session_and_time_out_if_it_never_comes() {
    let mut r = Rig::new(2);
    r.call(1, &GETATTR).unwrap();
    r.poll();
    let x = r.one();
    assert!(x.exchange.is_some(), "the call waits; establishment starts");
    assert_eq!(r.s.stats().waited, 1);
    // The server refuses: tried again after a back-off that doubles.
    let refuse = || compound(Nfsstat4::ServerFault, &[failed(OpNum::ExchangeId, Nfsstat4::ServerFault)]);
    r.t.reply(OWN, refuse());
    r.poll();
    r.advance(Duration::from_millis(9));
    r.nothing_sent();
    r.advance(Duration::from_millis(1));
    r.one();
    r.t.reply(OWN, refuse());
    r.poll();
    r.advance(Duration::from_millis(19));
    r.nothing_sent();
    r.advance(Duration::from_millis(1));
    r.one();
    let st = r.s.stats();
    assert_eq!((st.establish_failures, st.last_establish_error), (2, Nfsstat4::ServerFault.to_u32()));
    // The connection fails it too: the same.
    r.t.fail(OWN, CallError::TimedOut);
    r.poll();
    assert!(r.o.done.is_empty());
    r.advance(Duration::from_secs(10));
    assert_eq!(r.o.done, vec![(1, Err(CallError::TimedOut))], "ended at its time-out");
    assert_eq!(r.s.stats().timed_out, 1);
    // Establishment goes on meanwhile; established, a new call goes at once.
    let x = r.one();
    assert!(x.exchange.is_some());
    r.t.reply(OWN, exchange_ok(CLIENT1, 1, 0));
    r.poll();
    let cs = r.one();
    r.t.reply(OWN, create_ok(SID1, cs.create.unwrap().1, 2));
    r.poll();
    let st = r.one();
    r.t.reply(OWN, start_ok(&st, 90));
    r.poll();
    assert_eq!(r.s.state(), State::Ready);
    r.call(2, &GETATTR).unwrap();
    assert_eq!(r.one().ops, [OpNum::Putrootfh, OpNum::Getattr]);
}

#[test]
fn a_sequence_result_of_another_call_is_garbage() {
    let mut r = Rig::new(2);
    r.establish(CLIENT1, SID1, 2);
    r.call(1, &GETATTR).unwrap();
    let mut c = r.one();
    let real = c.seq.unwrap();
    c.seq = Some((real.0, real.1 + 7, real.2, real.3, real.4));
    r.t.reply(c.tag, answer(&c));
    r.poll();
    assert_eq!(r.o.done, vec![(1, Err(CallError::Broken))]);
    // The slot is uncertain: its next call counts the broken one as taken.
    r.call(2, &GETATTR).unwrap();
    assert_eq!(r.one().seq.unwrap().1, real.1 + 1);
}

#[test]
fn the_connection_being_full_keeps_the_call_waiting() {
    let mut r = Rig::new(2);
    r.establish(CLIENT1, SID1, 2);
    r.t.full = true;
    r.call(1, &GETATTR).unwrap();
    r.nothing_sent();
    r.poll();
    r.nothing_sent();
    r.t.full = false;
    r.poll();
    let c = r.one();
    assert_eq!(c.seq.unwrap().1, 2, "the slot taken and given back did not move on");
    assert_eq!(r.o.asked, vec![1, 1], "asked at each try");
}

#[test]
fn an_owner_that_gives_no_operations_ends_its_call() {
    let mut r = Rig::new(2);
    r.call(1, &GETATTR).unwrap();
    r.o.ops.clear();
    r.establish(CLIENT1, SID1, 2);
    assert_eq!(r.o.done, vec![(1, Err(CallError::Closed))]);
    assert_eq!(r.s.in_flight(), 0);
}

#[test]
fn close_destroys_the_session_then_the_client_id() {
    let mut r = Rig::new(2);
    r.establish(CLIENT1, SID1, 2);
    r.call(1, &GETATTR).unwrap();
    let c = r.one();
    r.s.close(r.now, &mut r.o);
    assert_eq!(r.call(2, &GETATTR), Err(CallError::Closed));
    r.poll();
    r.nothing_sent();
    r.t.reply(c.tag, answer(&c));
    r.poll();
    assert_eq!(r.o.done.len(), 1, "the call on the wire is answered first");
    let d = r.one();
    assert_eq!(d.ops, [OpNum::DestroySession]);
    assert!(d.seq.is_none());
    r.t.reply(OWN, compound(Nfsstat4::Ok, &[ok(OpNum::DestroySession, &[])]));
    r.poll();
    let d = r.one();
    assert_eq!(d.ops, [OpNum::DestroyClientid]);
    r.t.fail(OWN, CallError::TimedOut);
    r.poll();
    assert_eq!(r.s.state(), State::Closed, "whatever the server answers");
    r.advance(Duration::from_secs(100));
    r.nothing_sent();
}

#[test]
fn sessions_of_one_share_use_one_client_id_and_create_their_sessions_in_turn() {
    let share = std::sync::Arc::new(ClientShare::new(b"owner".to_vec(), VERF));
    let now = Instant::now();
    let mut a = Rig::sharing(4, share.clone(), now);
    let mut b = Rig::sharing(4, share.clone(), now);
    a.poll();
    assert_eq!(a.one().ops, [OpNum::ExchangeId]);
    b.poll();
    b.nothing_sent();
    a.t.reply(OWN, exchange_ok(CLIENT1, 5, 0));
    a.poll();
    let ca = a.one();
    assert_eq!(ca.create.as_ref().map(|c| (c.0, c.1)), Some((CLIENT1, 5)));
    // B takes the client id without an EXCHANGE_ID, and waits for A's CREATE_SESSION.
    b.advance(Duration::from_millis(5));
    b.nothing_sent();
    // A's reply is lost: A sends the same sequence again; B still waits.
    a.t.fail(OWN, CallError::TimedOut);
    a.poll();
    a.advance(Duration::from_secs(2));
    let ca = a.one();
    assert_eq!(ca.create.as_ref().map(|c| c.1), Some(5), "the same sequence again");
    b.advance(Duration::from_millis(5));
    b.nothing_sent();
    a.t.reply(OWN, create_ok(SID1, 5, 4));
    a.poll();
    let st = a.one();
    assert_eq!(st.ops, [OpNum::Putrootfh, OpNum::Getattr, OpNum::ReclaimComplete]);
    a.t.reply(OWN, start_ok(&st, 90));
    a.poll();
    assert_eq!(a.s.state(), State::Ready);
    b.advance(Duration::from_millis(5));
    let cb = b.one();
    assert_eq!(cb.create.as_ref().map(|c| (c.0, c.1)), Some((CLIENT1, 6)), "the next sequence");
    b.t.reply(OWN, create_ok(SID2, 6, 4));
    b.poll();
    let st = b.one();
    assert_eq!(st.ops, [OpNum::Putrootfh, OpNum::Getattr], "RECLAIM_COMPLETE once per client id");
    b.t.reply(OWN, start_ok(&st, 90));
    b.poll();
    assert_eq!(b.s.state(), State::Ready);
    assert_eq!((a.s.params().unwrap().clientid, b.s.params().unwrap().clientid), (CLIENT1, CLIENT1));
    assert_eq!(a.s.stats().exchange_ids + b.s.stats().exchange_ids, 1);

    // STALE_CLIENTID on A: one new EXCHANGE_ID (by A), which B then takes when it finds out.
    a.call(1, &GETATTR).unwrap();
    let c = a.one();
    a.t.reply(c.tag, seq_failed(Nfsstat4::StaleClientid));
    a.poll();
    assert_eq!(a.one().ops, [OpNum::ExchangeId]);
    b.call(1, &GETATTR).unwrap();
    let c = b.one();
    b.t.reply(c.tag, seq_failed(Nfsstat4::StaleClientid));
    b.poll();
    b.nothing_sent();
    a.t.reply(OWN, exchange_ok(CLIENT2, 1, 0));
    a.poll();
    assert_eq!(a.one().create.map(|c| (c.0, c.1)), Some((CLIENT2, 1)));
    a.t.reply(OWN, create_ok(SID3, 1, 4));
    a.poll();
    let st = a.one();
    assert_eq!(st.ops.len(), 3, "the new client id reclaims");
    b.advance(Duration::from_millis(5));
    assert_eq!(b.one().create.map(|c| (c.0, c.1)), Some((CLIENT2, 2)));
    assert_eq!(share.stats().exchange_ids, 2);

    // Closing: only the last session destroys the client id.
    a.t.reply(OWN, start_ok(&st, 90));
    a.poll();
    let c = a.one();
    assert_eq!(
        c.seq.map(|q| q.0),
        Some(SID3),
        "the call answered STALE_CLIENTID goes again on the new session"
    );
    a.t.reply(c.tag, answer(&c));
    a.poll();
    a.s.close(a.now, &mut a.o);
    a.poll();
    assert_eq!(a.one().ops, [OpNum::DestroySession]);
    a.t.reply(OWN, compound(Nfsstat4::Ok, &[ok(OpNum::DestroySession, &[])]));
    a.poll();
    a.nothing_sent();
    assert_eq!(a.s.state(), State::Closed);
    assert_eq!(share.stats().sessions, 1, "A left at its close");
    drop(b);
    assert_eq!(share.stats().sessions, 0, "B left as it was dropped");
}

#[test]
fn results_and_file_handles_reach_the_owner_in_place() {
    // A PUTFH+GETFH reply: the owner iterates the results after SEQUENCE.
    let mut r = Rig::new(1);
    r.establish(CLIENT1, SID1, 1);
    let fh = Fh::new(&[9; 20]).unwrap();
    let ops: Vec<Op<'static>> = vec![Op::Putrootfh, Op::Getfh];
    r.call(1, &ops).unwrap();
    let c = r.one();
    r.t.reply(
        c.tag,
        compound(
            Nfsstat4::Ok,
            &[
                seq_res(&c, 0, 0, 0),
                ok(OpNum::Putrootfh, &[]),
                ok(OpNum::Getfh, &enc(|e| fh.encode(e).unwrap())),
            ],
        ),
    );
    let mut got = None;
    struct Look<'a>(&'a mut Option<Fh>);
    impl SessionSink for Look<'_> {
        fn read_buffer(&mut self, _: u32) -> Option<Writer<'_>> {
            None
        }
        fn payload(&mut self, _: u32) -> Option<Reader<'_>> {
            None
        }
        fn ops(&mut self, _: u32, _: &mut dyn FnMut(&[Op<'_>])) {}
        fn done(&mut self, _: u32, res: Result<CompoundReply<'_>, CallError>) {
            for op in res.unwrap().results {
                if let Ok(OpRes::Getfh(f)) = op {
                    *self.0 = Some(f);
                }
            }
        }
    }
    r.s.poll(r.now, &mut r.t, &mut Look(&mut got));
    assert_eq!(got, Some(fh));
}
