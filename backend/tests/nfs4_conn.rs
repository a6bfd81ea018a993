//! The connection carrying NFSv4.1 (`Conn<Nfs41>`) against the fake server: a WRITE's data in
//! the middle of a COMPOUND, sent from the owner's buffers, and sent again after a reconnect;
//! READ data placed as it comes when the READ is the COMPOUND's last (a big READ's straight into
//! the owner's buffers, a small one's copied), left in the reply when it is not; failed READs;
//! hostile READ replies (more data than asked, a record that ends inside the data), which fail
//! their call and reset the connection, the next call going through.

mod nfs_fake_server;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nfs_fake_server::nfs4::{
    self, compound_reply, failed, getattr_ok, ok, read_ok, read_ok_len, seq_ok, write_ok, Arg,
};
use nfs_fake_server::{fragments, record, reply, Act, FakeServer};
use virtiofs_backend::io::{Reader, Writer};
use virtiofs_backend::nfs::conn::{
    CallError, Compound, CompoundReply, Conn, ConnConfig, Cred, Nfs41, ReadDone, Sink,
};
use virtiofs_backend::nfs::wire::nfs4::{
    attr, Bitmap, Fattr4, Fh, Nfsstat4, Op, OpNum, OpRes, SessionId, Stable4, Stateid, MINOR_VERSION,
};
use vm_memory::VolatileSlice;

/// Memory in pieces, as a descriptor chain's (leaked: tests only).
struct GuestBuf(Vec<VolatileSlice<'static>>);

impl GuestBuf {
    fn new(total: usize, piece: usize) -> GuestBuf {
        let mut v = Vec::new();
        let mut left = total;
        while left > 0 {
            let n = left.min(piece);
            let m: &'static mut [u8] = Box::leak(vec![0u8; n].into_boxed_slice());
            v.push(VolatileSlice::from(m));
            left -= n;
        }
        GuestBuf(v)
    }

    fn fill(&self, data: &[u8]) {
        let mut at = 0;
        for s in &self.0 {
            s.copy_from(&data[at..at + s.len()]);
            at += s.len();
        }
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

/// What a call's owner was told.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Told {
    status: Nfsstat4,
    ops: Vec<OpNum>,
    read: Option<ReadDone>,
    /// The data of a READ result left in the reply.
    inline: Option<Vec<u8>>,
}

#[derive(Default)]
struct V4Sink {
    reads: HashMap<u32, GuestBuf>,
    writes: HashMap<u32, GuestBuf>,
    done: Vec<(u32, Result<Told, CallError>)>,
}

impl Sink<Nfs41> for V4Sink {
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>> {
        self.reads.get(&tag).map(|b| Writer::new(&b.0))
    }

    fn payload(&mut self, tag: u32) -> Option<Reader<'_>> {
        self.writes.get(&tag).map(|b| Reader::new(&b.0))
    }

    fn done(&mut self, tag: u32, res: Result<CompoundReply<'_>, CallError>) {
        let res = res.map(|r| {
            let mut inline = None;
            let ops = r
                .results
                .map(|op| {
                    let op = op.unwrap();
                    if let OpRes::Read { data, .. } = op {
                        inline = Some(data.to_vec());
                    }
                    op.op()
                })
                .collect();
            Told { status: r.status, ops, read: r.read, inline }
        });
        assert!(self.done.iter().all(|(t, _)| *t != tag), "call {tag} ended twice");
        self.done.push((tag, res));
    }
}

fn conn(addr: std::net::SocketAddr) -> Conn<Nfs41> {
    Conn::new(ConnConfig {
        addr,
        slots: 8,
        max_io: 1 << 20,
        timeout: Duration::from_secs(10),
        retransmit: Duration::from_secs(5),
        machine_name: "nfs4-conn-test".into(),
    })
    .unwrap()
}

/// Polls until `n` calls ended.
fn run(c: &mut Conn<Nfs41>, sink: &mut V4Sink, n: usize) {
    let t0 = Instant::now();
    while sink.done.len() < n {
        assert!(t0.elapsed() < Duration::from_secs(10), "calls did not end: {:?}", sink.done);
        c.poll(Instant::now(), sink);
        std::thread::sleep(Duration::from_micros(50));
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn fh() -> Fh {
    Fh::new(&[7; 24]).unwrap()
}

const STAT: Bitmap = Bitmap::of(&[attr::SIZE]);

fn size(n: u64) -> Fattr4 {
    Fattr4 { size: Some(n), ..Fattr4::default() }
}

#[test]
fn write_data_goes_in_the_middle_and_again_after_a_reconnect() {
    let data = pattern(5001, 3);
    // (connection, arguments) of each call.
    type Seen = Vec<(usize, Vec<u8>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let s2 = seen.clone();
    let server = FakeServer::start(move |call| {
        s2.lock().unwrap().push((call.conn, call.args.clone()));
        if call.conn == 0 {
            // The reply is lost with the connection.
            return vec![Act::Close];
        }
        let results = [ok(OpNum::Putfh, &[]), write_ok(5001, 0, *b"verifier"), getattr_ok(&size(5001))];
        vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, &results))]
    });
    let mut c = conn(server.addr());
    let mut sink = V4Sink::default();
    let buf = GuestBuf::new(5001, 1000);
    buf.fill(&data);
    sink.writes.insert(1, buf);
    let fh = fh();
    let ops = [
        Op::Putfh { fh: &fh },
        Op::Write { stateid: Stateid::ANONYMOUS, offset: 4096, stable: Stable4::Unstable, count: 5001 },
        Op::Getattr { attrs: STAT },
    ];
    c.call(1, &Cred::ROOT, &Compound::of(&ops), &mut sink).unwrap();
    run(&mut c, &mut sink, 1);
    let told = sink.done[0].1.clone().unwrap();
    assert_eq!(told.ops, [OpNum::Putfh, OpNum::Write, OpNum::Getattr]);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "sent, then sent again on a new connection");
    assert_eq!((seen[0].0, seen[1].0), (0, 1));
    assert_eq!(seen[0].1, seen[1].1, "the same bytes, the data read again from the owner's buffers");
    let parsed = nfs4::parse(&seen[1].1);
    assert_eq!(parsed.minor, MINOR_VERSION);
    assert_eq!(
        parsed.ops[1],
        Arg::Write { offset: 4096, stable: 0, data },
        "the data and its padding after the count, GETATTR after them"
    );
    assert_eq!(parsed.ops[2], Arg::Getattr(vec![1 << attr::SIZE]));
    let st = c.stats();
    assert_eq!((st.retransmits, st.reconnects), (1, 1));
}

#[test]
fn a_big_read_last_is_placed_straight_into_the_buffers() {
    let data = pattern(256 << 10, 9);
    let d2 = data.clone();
    let server = FakeServer::start(move |call| {
        let c = nfs4::parse(&call.args);
        let s = c.seq().expect("SEQUENCE first");
        assert_eq!(c.ops(), [OpNum::Putfh, OpNum::Read]);
        let results = [seq_ok(&s, 7, 7, 0), ok(OpNum::Putfh, &[]), read_ok(true, &d2)];
        let body = reply(call.xid, &nfs4::compound_res(Nfsstat4::Ok, &results));
        // One record (as ganesha sends it) over a few writes: the client sees the head before
        // the data.
        let bytes = record(&body);
        vec![
            Act::Send(bytes[..300].to_vec()),
            Act::Sleep(Duration::from_millis(20)),
            Act::Send(bytes[300..100_000].to_vec()),
            Act::Sleep(Duration::from_millis(20)),
            Act::Send(bytes[100_000..].to_vec()),
        ]
    });
    let mut c = conn(server.addr());
    let mut sink = V4Sink::default();
    sink.reads.insert(1, GuestBuf::new(256 << 10, 4096));
    let fh = fh();
    let seq = Op::Sequence {
        session: SessionId([4; 16]),
        sequenceid: 9,
        slotid: 3,
        highest_slotid: 3,
        cachethis: false,
    };
    let ops = [Op::Putfh { fh: &fh }, Op::Read { stateid: Stateid::ANONYMOUS, offset: 0, count: 256 << 10 }];
    let compound = Compound { tag: b"t", minorversion: MINOR_VERSION, first: Some(seq), ops: &ops };
    c.call(1, &Cred::ROOT, &compound, &mut sink).unwrap();
    run(&mut c, &mut sink, 1);
    let told = sink.done[0].1.clone().unwrap();
    assert_eq!(told.status, Nfsstat4::Ok);
    assert_eq!(told.ops, [OpNum::Sequence, OpNum::Putfh], "the results before the READ's");
    assert_eq!(told.read, Some(ReadDone { count: 256 << 10, eof: true }));
    assert_eq!(told.inline, None);
    assert!(sink.reads[&1].contents() == data, "the data in the owner's buffers");
    let st = c.stats();
    assert!(st.read_direct_bytes > 100_000, "most of it straight from the socket: {st:?}");
    assert_eq!(st.read_direct_bytes + st.read_copied_bytes, 256 << 10);
}

#[test]
fn a_small_read_is_copied_and_a_read_not_last_stays_in_the_reply() {
    let server = FakeServer::start(move |call| {
        let c = nfs4::parse(&call.args);
        let results = match c.ops.last() {
            Some(Arg::Read { count, .. }) => {
                vec![ok(OpNum::Putfh, &[]), read_ok(false, &pattern(*count as usize, 1))]
            }
            _ => vec![ok(OpNum::Putfh, &[]), read_ok(false, &pattern(100, 2)), getattr_ok(&size(100))],
        };
        vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, &results))]
    });
    let mut c = conn(server.addr());
    let mut sink = V4Sink::default();
    sink.reads.insert(1, GuestBuf::new(4096, 512));
    sink.reads.insert(2, GuestBuf::new(4096, 512));
    let fh = fh();
    let small = [Op::Putfh { fh: &fh }, Op::Read { stateid: Stateid::ANONYMOUS, offset: 0, count: 4096 }];
    let middle = [
        Op::Putfh { fh: &fh },
        Op::Read { stateid: Stateid::ANONYMOUS, offset: 0, count: 100 },
        Op::Getattr { attrs: STAT },
    ];
    c.call(1, &Cred::ROOT, &Compound::of(&small), &mut sink).unwrap();
    run(&mut c, &mut sink, 1);
    c.call(2, &Cred::ROOT, &Compound::of(&middle), &mut sink).unwrap();
    run(&mut c, &mut sink, 2);
    let t1 = sink.done[0].1.clone().unwrap();
    assert_eq!((t1.ops, t1.read), (vec![OpNum::Putfh], Some(ReadDone { count: 4096, eof: false })));
    assert_eq!(sink.reads[&1].contents(), pattern(4096, 1));
    assert_eq!(c.stats().read_copied_bytes, 4096);
    let t2 = sink.done[1].1.clone().unwrap();
    assert_eq!(t2.ops, [OpNum::Putfh, OpNum::Read, OpNum::Getattr]);
    assert_eq!((t2.read, t2.inline), (None, Some(pattern(100, 2))));
    assert_eq!(sink.reads[&2].contents(), vec![0; 4096], "nothing placed");
}

#[test]
fn failed_reads_carry_their_status() {
    let server = FakeServer::start(move |call| {
        let c = nfs4::parse(&call.args);
        let results = match c.ops.first() {
            Some(Arg::Putfh(fh)) if fh[0] == 1 => vec![failed(OpNum::Putfh, Nfsstat4::Stale)],
            _ => vec![ok(OpNum::Putfh, &[]), failed(OpNum::Read, Nfsstat4::Io)],
        };
        let status = if results.len() == 1 { Nfsstat4::Stale } else { Nfsstat4::Io };
        vec![Act::Send(compound_reply(call.xid, status, &results))]
    });
    let mut c = conn(server.addr());
    let mut sink = V4Sink::default();
    sink.reads.insert(1, GuestBuf::new(64 << 10, 4096));
    sink.reads.insert(2, GuestBuf::new(64 << 10, 4096));
    let (stale, good) = (Fh::new(&[1; 8]).unwrap(), fh());
    for (tag, fh) in [(1, &stale), (2, &good)] {
        let ops = [Op::Putfh { fh }, Op::Read { stateid: Stateid::ANONYMOUS, offset: 0, count: 64 << 10 }];
        c.call(tag, &Cred::ROOT, &Compound::of(&ops), &mut sink).unwrap();
    }
    run(&mut c, &mut sink, 2);
    sink.done.sort_by_key(|(t, _)| *t);
    let t1 = sink.done[0].1.clone().unwrap();
    assert_eq!((t1.status, t1.ops, t1.read), (Nfsstat4::Stale, vec![OpNum::Putfh], None));
    let t2 = sink.done[1].1.clone().unwrap();
    assert_eq!((t2.status, t2.ops, t2.read), (Nfsstat4::Io, vec![OpNum::Putfh, OpNum::Read], None));
}

#[test]
fn hostile_read_replies_fail_their_call_and_the_connection_goes_on() {
    let server = FakeServer::start(move |call| {
        let c = nfs4::parse(&call.args);
        let Some(Arg::Read { count, offset }) = c.ops.last().cloned() else { panic!("{c:?}") };
        let results = match offset {
            // More data than asked: in one piece, and a big one whose head comes first.
            0 | 1 => vec![ok(OpNum::Putfh, &[]), read_ok(false, &pattern(count as usize + 4, 0))],
            // The data's length says more than the record holds.
            2 => vec![ok(OpNum::Putfh, &[]), read_ok_len(false, count, &pattern(100, 0))],
            _ => vec![ok(OpNum::Putfh, &[]), read_ok(true, &pattern(count as usize, 5))],
        };
        let body = reply(call.xid, &nfs4::compound_res(Nfsstat4::Ok, &results));
        // In fragments, the first write ending just after the READ's head.
        let bytes = fragments(&body, 16 << 10);
        vec![
            Act::Send(bytes[..100].to_vec()),
            Act::Sleep(Duration::from_millis(10)),
            Act::Send(bytes[100..].to_vec()),
        ]
    });
    let mut c = conn(server.addr());
    let mut sink = V4Sink::default();
    let fh = fh();
    for (tag, (offset, count)) in
        [(0u64, 1000u32), (1, 64 << 10), (2, 64 << 10), (3, 64 << 10)].into_iter().enumerate()
    {
        let tag = tag as u32;
        sink.reads.insert(tag, GuestBuf::new(count as usize + 8, 4096));
        let ops = [Op::Putfh { fh: &fh }, Op::Read { stateid: Stateid::ANONYMOUS, offset, count }];
        c.call(tag, &Cred::ROOT, &Compound::of(&ops), &mut sink).unwrap();
        run(&mut c, &mut sink, tag as usize + 1);
    }
    assert_eq!(sink.done[0].1, Err(CallError::Broken), "more than asked");
    assert_eq!(sink.done[1].1, Err(CallError::Broken), "more than asked, seen in the head");
    assert_eq!(sink.done[2].1, Err(CallError::Broken), "the record ends inside the data");
    let last = sink.done[3].1.clone().unwrap();
    assert_eq!(last.read, Some(ReadDone { count: 64 << 10, eof: true }), "the connection goes on");
    assert_eq!(sink.reads[&3].contents()[..64 << 10], pattern(64 << 10, 5)[..]);
    assert_eq!(c.stats().bad_replies, 3);
}

/// Session trunking's connection side (`Conn::also_at`): a server address that goes away moves
/// the calls to the next address, at once (no back-off while another address is left), and an
/// address dead from the start is passed over.
#[test]
fn a_server_address_that_goes_away_moves_the_calls_to_the_next() {
    fn answer(call: &nfs_fake_server::Call) -> Vec<Act> {
        let results = [ok(OpNum::Putfh, &[]), getattr_ok(&size(1))];
        vec![Act::Send(compound_reply(call.xid, Nfsstat4::Ok, &results))]
    }
    let fh = fh();
    let ops = [Op::Putfh { fh: &fh }, Op::Getattr { attrs: STAT }];
    let a = FakeServer::start(answer);
    let b = FakeServer::start(answer);
    let (a_addr, b_addr) = (a.addr(), b.addr());
    let mut c = conn(a_addr);
    c.also_at(&[a_addr, b_addr]);
    let mut sink = V4Sink::default();
    c.call(1, &Cred::ROOT, &Compound::of(&ops), &mut sink).unwrap();
    run(&mut c, &mut sink, 1);
    assert_eq!((c.address(), a.calls().len(), b.calls().len()), (a_addr, 1, 0));
    drop(a);
    let t0 = Instant::now();
    c.call(2, &Cred::ROOT, &Compound::of(&ops), &mut sink).unwrap();
    run(&mut c, &mut sink, 2);
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "no back-off while an address is left: {:?}",
        t0.elapsed()
    );
    assert!(
        sink.done.iter().all(|(_, r)| r.as_ref().is_ok_and(|t| t.status == Nfsstat4::Ok)),
        "{:?}",
        sink.done
    );
    assert_eq!((c.address(), b.calls().len()), (b_addr, 1));
    let st = c.stats();
    assert!(st.address_moves >= 1 && st.reconnects == 1, "{st:?}");

    // The first address answers again: the connection goes back to it (a probe every 20 ms
    // here), the calls it held back meanwhile (three at a time are out) served there, none lost
    // or sent twice.
    c.probe_first_every(Duration::from_millis(20));
    let a = FakeServer::start_at(a_addr, answer);
    let moves = c.stats().address_moves;
    let t0 = Instant::now();
    let mut tag = 3;
    while a.calls().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(5), "never back on the first address: {:?}", c.stats());
        for _ in 0..3 {
            c.call(tag, &Cred::ROOT, &Compound::of(&ops), &mut sink).unwrap();
            tag += 1;
        }
        run(&mut c, &mut sink, tag as usize - 1);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(c.address(), a_addr);
    assert_eq!(c.stats().address_moves, moves + 1, "{:?}", c.stats());
    assert_eq!(c.stats().retransmits, 1, "only the first move's call went again: {:?}", c.stats());
    let sent = (tag - 1) as usize;
    assert_eq!(sink.done.len(), sent);
    assert!(sink.done.iter().all(|(_, r)| r.as_ref().is_ok_and(|t| t.status == Nfsstat4::Ok)));
    assert_eq!(
        a.calls().len() + b.calls().len(),
        sent - 1,
        "every call served once (the first by the old `a`)"
    );

    // The first address dead from the start (the fake server serves one connection at a time:
    // the first one goes).
    drop(c);
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut c = conn(dead);
    c.also_at(&[b_addr]);
    let mut sink = V4Sink::default();
    c.call(3, &Cred::ROOT, &Compound::of(&ops), &mut sink).unwrap();
    run(&mut c, &mut sink, 1);
    assert_eq!(c.address(), b_addr);
    assert_eq!(c.stats().address_moves, 1);
}
