//! The NFS client's connection (`nfs::conn::Conn`) against a fake server that answers
//! programmatically (well-formed, hostile, slow, or not at all) and against a real nfs-ganesha.
//!
//! Every test drives `Conn::poll` from the test thread, as a poller would, and waits for calls
//! to end in bounded time; the hostile cases check that the call fails (Broken), the connection
//! is reset and reconnected, the counters say so, and nothing panics.

#[path = "harness/counting.rs"]
mod counting;
#[path = "harness/ganesha.rs"]
mod ganesha;
mod nfs_fake_server;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nfs_fake_server::{attr, enc, fragments, read_ok, read_ok_with, record, reply, Act, FakeServer};
use virtiofs_backend::io::{Reader, Writer};
use virtiofs_backend::nfs::conn::{CallError, Conn, ConnConfig, ConnStats, Cred, Sink};
use virtiofs_backend::nfs::wire::nfs3::{Args, Fattr, Fh, Ftype, Proc, Res, Stable};
use vm_memory::VolatileSlice;

// ---- guest-like buffers and a recording sink ----

/// Memory split into buffers, as a descriptor chain's (leaked: tests only).
struct GuestBuf {
    slices: Vec<VolatileSlice<'static>>,
}

impl GuestBuf {
    fn new(sizes: &[usize]) -> GuestBuf {
        let slices = sizes
            .iter()
            .map(|&n| {
                let m: &'static mut [u8] = Box::leak(vec![0u8; n].into_boxed_slice());
                VolatileSlice::from(m)
            })
            .collect();
        GuestBuf { slices }
    }
    fn uniform(total: usize, piece: usize) -> GuestBuf {
        let mut sizes = vec![piece; total / piece];
        if !total.is_multiple_of(piece) {
            sizes.push(total % piece);
        }
        GuestBuf::new(&sizes)
    }
    fn fill(&self, data: &[u8]) {
        let mut at = 0;
        for s in &self.slices {
            let n = s.len().min(data.len() - at);
            s.subslice(0, n).unwrap().copy_from(&data[at..at + n]);
            at += n;
        }
    }
    fn contents(&self) -> Vec<u8> {
        let mut v = Vec::new();
        for s in &self.slices {
            let mut b = vec![0u8; s.len()];
            s.copy_to(&mut b[..]);
            v.extend_from_slice(&b);
        }
        v
    }
    fn writer(&self) -> Writer<'_> {
        Writer::new(&self.slices)
    }
    fn reader(&self) -> Reader<'_> {
        Reader::new(&self.slices)
    }
}

#[derive(Debug, Clone)]
struct Summary {
    debug: String,
    attr: Option<Fattr>,
    read: Option<(u32, bool)>,
    write: Option<(u32, Stable, [u8; 8])>,
}

#[derive(Default)]
struct TestSink {
    reads: HashMap<u32, GuestBuf>,
    writes: HashMap<u32, GuestBuf>,
    done: Vec<(u32, Result<Summary, CallError>)>,
}

impl Sink for TestSink {
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>> {
        self.reads.get(&tag).map(|b| b.writer())
    }
    fn payload(&mut self, tag: u32) -> Option<Reader<'_>> {
        self.writes.get(&tag).map(|b| b.reader())
    }
    fn done(&mut self, tag: u32, res: Result<Res<'_>, CallError>) {
        let res = res.map(|r| Summary {
            debug: format!("{r:?}"),
            attr: match &r {
                Res::Attr(a) => Some(*a),
                Res::Read { attr, .. } => *attr,
                _ => None,
            },
            read: match r {
                Res::Read { count, eof, .. } => Some((count, eof)),
                _ => None,
            },
            write: match r {
                Res::Write { count, committed, verf, .. } => Some((count, committed, verf)),
                _ => None,
            },
        });
        assert!(self.done.iter().all(|(t, _)| *t != tag), "call {tag} ended twice");
        self.done.push((tag, res));
    }
}

impl TestSink {
    fn result(&self, tag: u32) -> Option<&Result<Summary, CallError>> {
        self.done.iter().find(|(t, _)| *t == tag).map(|(_, r)| r)
    }
}

fn config(addr: std::net::SocketAddr) -> ConnConfig {
    ConnConfig {
        addr,
        slots: 16,
        max_io: 4 << 20,
        timeout: Duration::from_secs(10),
        retransmit: Duration::from_secs(5),
        machine_name: "test-client".into(),
    }
}

const CRED: Cred =
    Cred { uid: 1000, gid: 100, ngroups: 3, groups: [5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0] };

/// Polls until `n` calls ended (or `limit` passes: then fails, naming what is missing).
fn run(conn: &mut Conn, sink: &mut TestSink, n: usize, limit: Duration) -> Duration {
    let t0 = Instant::now();
    while sink.done.len() < n {
        assert!(
            t0.elapsed() < limit,
            "only {} of {n} calls ended within {limit:?}: {:?}",
            sink.done.len(),
            conn.stats()
        );
        conn.poll(Instant::now(), sink);
        std::thread::sleep(Duration::from_micros(50));
    }
    t0.elapsed()
}

fn fh() -> Fh {
    Fh::new(&[0xab; 32]).unwrap()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

// ---- well-formed traffic ----

#[test]
fn getattr_carries_the_callers_credentials() {
    let a = attr(Ftype::Reg, 12345, 77);
    let srv = FakeServer::start(move |c| {
        let body = if c.proc == Proc::Getattr as u32 { nfs_fake_server::getattr_ok(&a) } else { vec![] };
        vec![Act::Send(record(&reply(c.xid, &body)))]
    });
    let mut conn = Conn::new(config(srv.addr())).unwrap();
    let mut sink = TestSink::default();
    let fh = fh();
    conn.call(1, &CRED, &Args::Getattr { fh: &fh }, &mut sink).unwrap();
    conn.call(2, &Cred::ROOT, &Args::Null, &mut sink).unwrap();
    assert_eq!(conn.in_flight(), 2);
    run(&mut conn, &mut sink, 2, Duration::from_secs(5));
    assert_eq!(sink.result(1).unwrap().as_ref().unwrap().attr, Some(a));
    assert_eq!(sink.result(2).unwrap().as_ref().unwrap().debug, "Null");
    let calls = srv.calls();
    assert_eq!(calls[0].proc, Proc::Getattr as u32);
    assert_eq!((calls[0].prog, calls[0].vers), (100_003, 3));
    assert_eq!(calls[0].sys, Some((1000, 100, 3)));
    assert_eq!(calls[1].sys, Some((0, 0, 0)));
    assert_ne!(calls[0].xid, calls[1].xid);
    let st = conn.stats();
    assert_eq!((st.calls, st.replies, st.reconnects, st.bad_replies), (2, 2, 0, 0));
    assert_eq!(conn.in_flight(), 0);
}

#[test]
fn read_data_lands_in_the_writer_whole_split_and_fragmented() {
    let a = attr(Ftype::Reg, 1 << 20, 9);
    let big = pattern(700_000, 3);
    let small = pattern(3000, 5);
    let (b2, s2) = (big.clone(), small.clone());
    let srv = FakeServer::start(move |c| {
        let (_, off, count) = nfs_fake_server::read_args(&c.args);
        match off {
            // Small: one record in one write (the whole-record path).
            0 => vec![Act::Send(record(&reply(c.xid, &read_ok(&a, &s2[..count as usize], false))))],
            // Large, one record written in pieces with pauses: the header first, then the data
            // goes straight into the writer.
            1 => {
                let rec = record(&reply(c.xid, &read_ok(&a, &b2, true)));
                let mut acts = Vec::new();
                for piece in [&rec[..200], &rec[200..70_000], &rec[70_000..]] {
                    acts.push(Act::Send(piece.to_vec()));
                    acts.push(Act::Sleep(Duration::from_millis(15)));
                }
                acts
            }
            // Large, in 9973-byte fragments, with a pause after each 100 KiB.
            _ => {
                let recs = fragments(&reply(c.xid, &read_ok(&a, &b2, true)), 9973);
                recs.chunks(100_000)
                    .flat_map(|p| [Act::Send(p.to_vec()), Act::Sleep(Duration::from_millis(5))])
                    .collect()
            }
        }
    });
    let mut conn = Conn::new(config(srv.addr())).unwrap();
    let mut sink = TestSink::default();
    sink.reads.insert(1, GuestBuf::new(&[1000, 0, 2000, 4096]));
    sink.reads.insert(2, GuestBuf::uniform(big.len(), 4096));
    sink.reads.insert(3, GuestBuf::uniform(big.len() + 100, 1500));
    let fh = fh();
    conn.call(1, &CRED, &Args::Read { fh: &fh, offset: 0, count: 3000 }, &mut sink).unwrap();
    conn.call(2, &CRED, &Args::Read { fh: &fh, offset: 1, count: big.len() as u32 }, &mut sink).unwrap();
    conn.call(3, &CRED, &Args::Read { fh: &fh, offset: 2, count: big.len() as u32 + 100 }, &mut sink)
        .unwrap();
    run(&mut conn, &mut sink, 3, Duration::from_secs(10));
    for (tag, want, eof) in [(1, &small, false), (2, &big, true), (3, &big, true)] {
        let s = sink.result(tag).unwrap().as_ref().unwrap_or_else(|e| panic!("call {tag}: {e}"));
        assert_eq!(s.read, Some((want.len() as u32, eof)), "call {tag}");
        assert_eq!(s.attr, Some(a));
        assert!(sink.reads[&tag].contents()[..want.len()] == want[..], "call {tag}: data differs");
    }
    let st = conn.stats();
    assert!(st.read_direct_bytes > 0, "some data was read straight into the writer: {st:?}");
    assert_eq!(st.read_direct_bytes + st.read_copied_bytes, (small.len() + 2 * big.len()) as u64);
    assert_eq!((st.bad_replies, st.reconnects), (0, 0));
}

#[test]
fn write_payload_goes_from_the_reader_including_partial_sends() {
    let verf = [1, 2, 3, 4, 5, 6, 7, 8];
    let srv = FakeServer::start(move |c| {
        if c.proc != Proc::Write as u32 {
            return vec![Act::Send(record(&reply(c.xid, &[])))];
        }
        let (_, _, count, stable, data) = nfs_fake_server::write_args(&c.args);
        assert_eq!(count as usize, data.len());
        // Echo a checksum of the data in the verifier's place so the client side can check it.
        let sum = data.iter().fold(0u64, |s, &b| s.wrapping_mul(131).wrapping_add(u64::from(b)));
        let _ = verf;
        vec![
            Act::Sleep(Duration::from_millis(1)),
            Act::Send(record(&reply(c.xid, &nfs_fake_server::write_ok(count, stable, sum.to_be_bytes())))),
        ]
    });
    let mut conn = Conn::new(config(srv.addr())).unwrap();
    let mut sink = TestSink::default();
    // 3 MiB in 1536 buffers of 2 KiB (more than IOV_MAX), 5 bytes (padding), 4097 bytes in
    // 1000-byte buffers, and 17,603 bytes in 16-byte buffers (more than IOV_MAX pieces, then
    // padding).
    let sizes = [(1, 3 << 20, 2048), (2, 5, 5), (3, 4097, 1000), (4, 1100 * 16 + 3, 16)];
    let mut sums = HashMap::new();
    let fh = fh();
    for (tag, len, piece) in sizes {
        let data = pattern(len, tag as u8);
        let b = GuestBuf::uniform(len, piece);
        b.fill(&data);
        sink.writes.insert(tag, b);
        sums.insert(tag, data.iter().fold(0u64, |s, &b| s.wrapping_mul(131).wrapping_add(u64::from(b))));
        let stable = if tag == 2 { Stable::Unstable } else { Stable::FileSync };
        conn.call(tag, &CRED, &Args::Write { fh: &fh, offset: 0, count: len as u32, stable }, &mut sink)
            .unwrap();
    }
    run(&mut conn, &mut sink, 4, Duration::from_secs(20));
    for (tag, len, _) in sizes {
        let s = sink.result(tag).unwrap().as_ref().unwrap_or_else(|e| panic!("call {tag}: {e}"));
        let (count, committed, v) = s.write.unwrap();
        assert_eq!(count as usize, len);
        assert_eq!(committed, if tag == 2 { Stable::Unstable } else { Stable::FileSync });
        assert_eq!(u64::from_be_bytes(v), sums[&tag], "call {tag}: the server got other bytes");
    }
    // A WRITE whose owner has no payload fails cleanly, and the connection goes on.
    conn.call(9, &CRED, &Args::Write { fh: &fh, offset: 0, count: 10, stable: Stable::FileSync }, &mut sink)
        .unwrap();
    conn.call(10, &CRED, &Args::Null, &mut sink).unwrap();
    run(&mut conn, &mut sink, 6, Duration::from_secs(5));
    assert_eq!(sink.result(9).unwrap().as_ref().unwrap_err(), &CallError::Payload);
    assert!(sink.result(10).unwrap().is_ok());
}

#[test]
fn slot_table_and_size_limits() {
    let srv = FakeServer::start(|c| vec![Act::Send(record(&reply(c.xid, &[])))]);
    let mut cfg = config(srv.addr());
    cfg.slots = 2;
    cfg.max_io = 65536;
    let mut conn = Conn::new(cfg).unwrap();
    let mut sink = TestSink::default();
    let fh = fh();
    assert_eq!(
        conn.call(0, &CRED, &Args::Read { fh: &fh, offset: 0, count: 65537 }, &mut sink),
        Err(CallError::TooLarge)
    );
    let long = vec![b'x'; 2000];
    assert_eq!(
        conn.call(0, &CRED, &Args::Lookup { dir: &fh, name: &long }, &mut sink),
        Err(CallError::TooLarge)
    );
    conn.call(1, &CRED, &Args::Null, &mut sink).unwrap();
    conn.call(2, &CRED, &Args::Null, &mut sink).unwrap();
    assert_eq!(conn.call(3, &CRED, &Args::Null, &mut sink), Err(CallError::Full));
    run(&mut conn, &mut sink, 2, Duration::from_secs(5));
    conn.call(3, &CRED, &Args::Null, &mut sink).unwrap();
    run(&mut conn, &mut sink, 3, Duration::from_secs(5));
    assert_eq!(conn.stats().calls, 3);
}

// ---- hostile or broken servers ----

/// Runs one hostile answer to the first call (GETATTR on the first connection), then a
/// well-formed server: the first call must end with `want`, a second call must then succeed.
fn hostile(
    first: impl Fn(u32) -> Vec<Act> + Send + 'static,
    want: Result<(), CallError>,
) -> (ConnStats, Vec<nfs_fake_server::Call>) {
    let a = attr(Ftype::Dir, 4096, 1);
    let mut fired = false;
    let srv = FakeServer::start(move |c| {
        if !fired {
            fired = true;
            first(c.xid)
        } else {
            vec![Act::Send(record(&reply(c.xid, &nfs_fake_server::getattr_ok(&a))))]
        }
    });
    let mut conn = Conn::new(config(srv.addr())).unwrap();
    let mut sink = TestSink::default();
    let fh = fh();
    conn.call(1, &CRED, &Args::Getattr { fh: &fh }, &mut sink).unwrap();
    run(&mut conn, &mut sink, 1, Duration::from_secs(8));
    assert_eq!(sink.result(1).unwrap().as_ref().map(|_| ()).map_err(|e| *e), want, "{:?}", sink.result(1));
    conn.call(2, &CRED, &Args::Getattr { fh: &fh }, &mut sink).unwrap();
    run(&mut conn, &mut sink, 2, Duration::from_secs(8));
    assert_eq!(sink.result(2).unwrap().as_ref().unwrap().attr, Some(a));
    (conn.stats(), srv.calls())
}

#[test]
fn garbage_xdr_fails_the_call_and_resets_the_connection() {
    // A GETATTR reply whose ftype is 99.
    let (st, _) = hostile(
        |xid| {
            let mut body = nfs_fake_server::getattr_ok(&attr(Ftype::Reg, 1, 1));
            body[4..8].copy_from_slice(&99u32.to_be_bytes());
            vec![Act::Send(record(&reply(xid, &body)))]
        },
        Err(CallError::Broken),
    );
    assert_eq!((st.bad_replies, st.reconnects), (1, 1));
}

#[test]
fn a_reply_truncated_inside_its_record_is_garbage() {
    // A well-formed record whose body stops in the middle of the attributes.
    let (st, _) = hostile(
        |xid| {
            let body = reply(xid, &nfs_fake_server::getattr_ok(&attr(Ftype::Reg, 1, 1)));
            vec![Act::Send(record(&body[..body.len() - 10]))]
        },
        Err(CallError::Broken),
    );
    assert_eq!(st.bad_replies, 1);
}

#[test]
fn trailing_bytes_after_a_reply_are_garbage() {
    let (st, _) = hostile(
        |xid| {
            let mut body = reply(xid, &nfs_fake_server::getattr_ok(&attr(Ftype::Reg, 1, 1)));
            body.extend_from_slice(&[0; 8]);
            vec![Act::Send(record(&body))]
        },
        Err(CallError::Broken),
    );
    assert_eq!(st.bad_replies, 1);
}

#[test]
fn an_oversized_record_mark_fails_the_calls_on_the_wire() {
    let (st, _) = hostile(|_| vec![Act::Send(0xffff_ff00u32.to_be_bytes().to_vec())], Err(CallError::Broken));
    assert_eq!((st.bad_replies, st.reconnects), (1, 1));
}

#[test]
fn endless_empty_fragments_are_garbage() {
    let (st, _) = hostile(|_| vec![Act::Send([0u8; 4].repeat(20_000))], Err(CallError::Broken));
    assert_eq!((st.bad_replies, st.reconnects), (1, 1));
}

#[test]
fn records_of_many_empty_fragments_cost_time_linear_in_their_bytes() {
    // Records of 16,000 empty fragments each (the most one record may have is 16,384), ending
    // in a reply to no call, 4 MiB of them at once, then the reply: each record mark is dropped
    // without moving the bytes behind it (that was a memmove of the rest of the buffer per
    // mark: minutes of a blocked poller for these 4 MiB), and the call completes.
    let a = attr(Ftype::Reg, 1, 1);
    let srv = FakeServer::start(move |c| {
        let mut unknown = vec![0u8; 4 * 16_000];
        unknown.extend_from_slice(&record(&reply(c.xid ^ 0x0001_0000, &nfs_fake_server::getattr_ok(&a))));
        let mut all = unknown.repeat(64);
        all.extend_from_slice(&record(&reply(c.xid, &nfs_fake_server::getattr_ok(&a))));
        vec![Act::Send(all)]
    });
    let mut conn = Conn::new(config(srv.addr())).unwrap();
    let mut sink = TestSink::default();
    let fh = fh();
    conn.call(1, &CRED, &Args::Getattr { fh: &fh }, &mut sink).unwrap();
    let t0 = Instant::now();
    while sink.done.is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(60), "no reply: {:?}", conn.stats());
        conn.poll(Instant::now(), &mut sink);
    }
    assert_eq!(sink.result(1).unwrap().as_ref().unwrap().attr, Some(a));
    let st = conn.stats();
    assert_eq!((st.unknown_xids, st.bad_replies), (64, 0), "{st:?}");
    // The cost in bytes moved, not in time (the machine's speed decides that): linear in what
    // came. A memmove of what follows each mark (up to the 4 MiB behind it) moved about
    // 1,000,000 marks x megabytes: some 100,000 times the bytes received.
    assert!(st.received_bytes >= 4 * 16_000 * 64, "{st:?}");
    assert!(st.moved_bytes <= 2 * st.received_bytes, "{st:?}");
}

#[test]
fn a_record_cut_by_the_server_closing_is_sent_again_with_the_same_xid() {
    // The record mark promises 100 bytes, 40 come, then the connection closes: the call is
    // not lost, it goes again on a new connection, with the same XID.
    let (st, calls) = hostile(
        |xid| {
            let body = reply(xid, &nfs_fake_server::getattr_ok(&attr(Ftype::Reg, 1, 1)));
            let rec = record(&body);
            vec![Act::Send(rec[..40].to_vec()), Act::Close]
        },
        Ok(()),
    );
    assert_eq!((st.reconnects, st.retransmits, st.bad_replies), (1, 1, 0));
    assert_eq!(calls[0].xid, calls[1].xid, "resent with the same XID");
    assert_eq!((calls[0].conn, calls[1].conn), (0, 1));
}

#[test]
fn a_write_lost_with_its_connection_is_sent_again_with_its_payload() {
    // The first connection closes on the WRITE without answering; on the second the same XID
    // comes with the same data, re-read from the sink.
    let srv = FakeServer::start(|c| {
        if c.conn == 0 {
            return vec![Act::Close];
        }
        let (_, _, count, stable, data) = nfs_fake_server::write_args(&c.args);
        let sum = data.iter().fold(0u64, |s, &b| s.wrapping_mul(131).wrapping_add(u64::from(b)));
        vec![Act::Send(record(&reply(c.xid, &nfs_fake_server::write_ok(count, stable, sum.to_be_bytes()))))]
    });
    let mut conn = Conn::new(config(srv.addr())).unwrap();
    let mut sink = TestSink::default();
    let data = pattern(70_001, 4);
    let b = GuestBuf::uniform(data.len(), 3000);
    b.fill(&data);
    sink.writes.insert(1, b);
    let fh = fh();
    conn.call(
        1,
        &CRED,
        &Args::Write { fh: &fh, offset: 0, count: data.len() as u32, stable: Stable::FileSync },
        &mut sink,
    )
    .unwrap();
    run(&mut conn, &mut sink, 1, Duration::from_secs(5));
    let (count, _, v) = sink.result(1).unwrap().as_ref().unwrap().write.unwrap();
    assert_eq!(count as usize, data.len());
    let sum = data.iter().fold(0u64, |s, &b| s.wrapping_mul(131).wrapping_add(u64::from(b)));
    assert_eq!(u64::from_be_bytes(v), sum);
    let calls = srv.calls();
    assert_eq!((calls.len(), calls[0].xid), (2, calls[1].xid));
    assert_eq!(calls[0].args, calls[1].args, "the same call, data included");
    let st = conn.stats();
    assert_eq!((st.reconnects, st.retransmits, st.bad_replies), (1, 1, 0));
}

#[test]
fn unknown_xids_are_counted_and_dropped() {
    let (st, _) = hostile(
        |xid| {
            let a = attr(Ftype::Reg, 1, 1);
            vec![
                Act::Send(record(&reply(xid ^ 0x5555_0000, &nfs_fake_server::getattr_ok(&a)))),
                Act::Send(record(&reply(xid.wrapping_add(1), &[]))),
                Act::Send(record(&reply(xid, &nfs_fake_server::getattr_ok(&a)))),
            ]
        },
        Ok(()),
    );
    assert_eq!((st.unknown_xids, st.bad_replies, st.reconnects), (2, 0, 0));
}

#[test]
fn read_counts_larger_than_asked_or_than_the_buffer() {
    let a = attr(Ftype::Reg, 1 << 20, 9);
    let data = pattern(8192, 1);
    let d2 = data.clone();
    let srv = FakeServer::start(move |c| {
        let (_, off, count) = nfs_fake_server::read_args(&c.args);
        match off {
            // More data than asked: garbage.
            0 => vec![Act::Send(record(&reply(c.xid, &read_ok(&a, &d2[..count as usize + 4], false))))],
            // count and data length disagree.
            1 => vec![Act::Send(record(&reply(c.xid, &read_ok_with(Some(&a), 10, false, 12, &d2[..12]))))],
            // An opaque length far beyond the record.
            2 => vec![Act::Send(record(&reply(
                c.xid,
                &read_ok_with(Some(&a), u32::MAX, false, u32::MAX, &[]),
            )))],
            // Fine, but the sink's buffer is smaller than what it asked for.
            _ => vec![Act::Send(record(&reply(c.xid, &read_ok(&a, &d2[..count as usize], true))))],
        }
    });
    let mut conn = Conn::new(config(srv.addr())).unwrap();
    let mut sink = TestSink::default();
    let fh = fh();
    for (tag, off) in [(1u32, 0u64), (2, 1), (3, 2)] {
        sink.reads.insert(tag, GuestBuf::uniform(8192, 4096));
        conn.call(tag, &CRED, &Args::Read { fh: &fh, offset: off, count: 4096 }, &mut sink).unwrap();
        run(&mut conn, &mut sink, tag as usize, Duration::from_secs(5));
        assert_eq!(sink.result(tag).unwrap().as_ref().unwrap_err(), &CallError::Broken, "read at {off}");
    }
    sink.reads.insert(4, GuestBuf::uniform(1000, 300));
    conn.call(4, &CRED, &Args::Read { fh: &fh, offset: 3, count: 4096 }, &mut sink).unwrap();
    run(&mut conn, &mut sink, 4, Duration::from_secs(5));
    assert_eq!(sink.result(4).unwrap().as_ref().unwrap_err(), &CallError::TooLarge);
    // A large one too small, its data arriving over several reads (the placing path).
    sink.reads.insert(5, GuestBuf::uniform(1000, 300));
    conn.call(5, &CRED, &Args::Read { fh: &fh, offset: 3, count: 8192 }, &mut sink).unwrap();
    sink.reads.insert(6, GuestBuf::uniform(8192, 4096));
    conn.call(6, &CRED, &Args::Read { fh: &fh, offset: 3, count: 8192 }, &mut sink).unwrap();
    run(&mut conn, &mut sink, 6, Duration::from_secs(5));
    assert_eq!(sink.result(5).unwrap().as_ref().unwrap_err(), &CallError::TooLarge);
    assert_eq!(sink.result(6).unwrap().as_ref().unwrap().read, Some((8192, true)));
    assert_eq!(sink.reads[&6].contents(), data);
    let st = conn.stats();
    assert_eq!((st.bad_replies, st.reconnects), (3, 3));
}

#[test]
fn rpc_level_refusals_are_typed() {
    let srv = FakeServer::start(|c| {
        let body = enc(|e| {
            for w in [c.xid, 1, 1, 1, 5] {
                e.u32(w).unwrap(); // MSG_DENIED, AUTH_ERROR, AUTH_TOOWEAK
            }
        });
        vec![Act::Send(record(&body))]
    });
    let mut conn = Conn::new(config(srv.addr())).unwrap();
    let mut sink = TestSink::default();
    conn.call(1, &CRED, &Args::Null, &mut sink).unwrap();
    run(&mut conn, &mut sink, 1, Duration::from_secs(5));
    assert_eq!(
        sink.result(1).unwrap().as_ref().unwrap_err(),
        &CallError::Rpc(virtiofs_backend::nfs::wire::rpc::RpcError::AuthError(5))
    );
    assert_eq!(conn.stats().bad_replies, 0);
}

#[test]
fn random_garbage_never_panics_and_every_call_ends() {
    // A fixed-seed generator: each reply is random bytes, a random mutation of a valid reply,
    // or a valid reply cut short; the client must end every call in bounded time.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let srv = FakeServer::start(move |c| {
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let a = attr(Ftype::Reg, 1, 1);
        let good = reply(c.xid, &nfs_fake_server::getattr_ok(&a));
        let rec = match rnd() % 4 {
            0 => record(&(0..rnd() % 200).map(|_| rnd() as u8).collect::<Vec<_>>()),
            1 => {
                let mut b = good.clone();
                for _ in 0..1 + rnd() % 4 {
                    let i = (rnd() as usize) % b.len();
                    b[i] = rnd() as u8;
                }
                record(&b)
            }
            2 => record(&good[..(rnd() as usize) % good.len()]),
            _ => record(&good),
        };
        vec![Act::Send(rec)]
    });
    let mut cfg = config(srv.addr());
    cfg.timeout = Duration::from_millis(1500);
    cfg.retransmit = Duration::from_millis(300);
    let mut conn = Conn::new(cfg).unwrap();
    let mut sink = TestSink::default();
    let fh = fh();
    for tag in 0..200 {
        conn.call(tag, &CRED, &Args::Getattr { fh: &fh }, &mut sink).unwrap();
        run(&mut conn, &mut sink, tag as usize + 1, Duration::from_secs(5));
    }
    let st = conn.stats();
    let ok = sink.done.iter().filter(|(_, r)| r.is_ok()).count();
    assert!(ok > 20 && st.bad_replies > 20, "ok {ok}, {st:?}");
}

// ---- time ----

#[test]
fn a_silent_server_times_out_in_bounded_time() {
    let srv = FakeServer::start(|_| vec![]);
    let mut cfg = config(srv.addr());
    cfg.timeout = Duration::from_millis(400);
    cfg.retransmit = Duration::from_millis(150);
    let mut conn = Conn::new(cfg).unwrap();
    let mut sink = TestSink::default();
    let t0 = Instant::now();
    conn.call(1, &CRED, &Args::Null, &mut sink).unwrap();
    run(&mut conn, &mut sink, 1, Duration::from_secs(3));
    let took = t0.elapsed();
    assert_eq!(sink.result(1).unwrap().as_ref().unwrap_err(), &CallError::TimedOut);
    assert!(took >= Duration::from_millis(400) && took < Duration::from_millis(2000), "bounded: {took:?}");
    let st = conn.stats();
    assert_eq!(st.timeouts, 1);
    assert!(st.reconnects >= 1 && st.retransmits >= 1, "retransmitted over a new connection: {st:?}");
    let calls = srv.calls();
    assert!(calls.len() >= 2 && calls.iter().all(|c| c.xid == calls[0].xid), "the same XID every time");
}

#[test]
fn no_reply_within_retransmit_reconnects_and_resends() {
    // The first connection swallows the call; the second answers.
    let srv =
        FakeServer::start(|c| if c.conn == 0 { vec![] } else { vec![Act::Send(record(&reply(c.xid, &[])))] });
    let mut cfg = config(srv.addr());
    cfg.retransmit = Duration::from_millis(100);
    let mut conn = Conn::new(cfg).unwrap();
    let mut sink = TestSink::default();
    conn.call(1, &CRED, &Args::Null, &mut sink).unwrap();
    let took = run(&mut conn, &mut sink, 1, Duration::from_secs(3));
    assert!(sink.result(1).unwrap().is_ok());
    assert!(took >= Duration::from_millis(100), "{took:?}");
    let calls = srv.calls();
    assert!(calls.len() >= 2 && calls.iter().all(|c| c.xid == calls[0].xid), "{calls:?}");
    assert!(conn.stats().retransmits >= 1);
}

#[test]
fn no_server_at_all_times_out_and_abort_all_ends_calls() {
    // A port nobody listens on: connects are refused, retried with backoff, calls time out.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = config(addr);
    cfg.timeout = Duration::from_millis(300);
    cfg.retransmit = Duration::from_millis(100);
    let mut conn = Conn::new(cfg).unwrap();
    let mut sink = TestSink::default();
    conn.call(1, &CRED, &Args::Null, &mut sink).unwrap();
    run(&mut conn, &mut sink, 1, Duration::from_secs(2));
    assert_eq!(sink.result(1).unwrap().as_ref().unwrap_err(), &CallError::TimedOut);
    conn.call(2, &CRED, &Args::Null, &mut sink).unwrap();
    conn.call(3, &CRED, &Args::Null, &mut sink).unwrap();
    conn.abort_all(&mut sink);
    assert_eq!(conn.in_flight(), 0);
    assert_eq!(sink.result(2).unwrap().as_ref().unwrap_err(), &CallError::Closed);
    assert_eq!(sink.result(3).unwrap().as_ref().unwrap_err(), &CallError::Closed);
}

#[test]
fn late_data_of_a_timed_out_read_never_lands_in_the_next_calls_buffer() {
    // READ A's reply stalls after its header and 1000 bytes of data; A times out, READ B takes
    // its slot; the rest of A's data arrives while B waits: it is dropped, B's buffer gets
    // exactly B's data.
    let a = attr(Ftype::Reg, 1 << 20, 9);
    let (da, db) = (pattern(65536, 1), pattern(4096, 2));
    let srv = FakeServer::start(move |c| {
        let (_, off, _) = nfs_fake_server::read_args(&c.args);
        if off == 0 {
            let rec = record(&reply(c.xid, &read_ok(&a, &da, false)));
            let cut = rec.len() - da.len() + 1000;
            vec![
                Act::Send(rec[..cut].to_vec()),
                Act::Sleep(Duration::from_millis(1300)),
                Act::Send(rec[cut..].to_vec()),
            ]
        } else {
            vec![Act::Send(record(&reply(c.xid, &read_ok(&a, &db, true))))]
        }
    });
    let mut cfg = config(srv.addr());
    // A ends by 1.1 s (the timeout and a tick), before the rest of its data comes at 1.3 s;
    // B, sent then, has until 2 s: room for a slow machine (the tests run under qemu-user too).
    cfg.timeout = Duration::from_millis(1000);
    let mut conn = Conn::new(cfg).unwrap();
    let mut sink = TestSink::default();
    sink.reads.insert(1, GuestBuf::uniform(65536, 4096));
    sink.reads.insert(2, GuestBuf::uniform(65536, 4096));
    let fh = fh();
    conn.call(1, &CRED, &Args::Read { fh: &fh, offset: 0, count: 65536 }, &mut sink).unwrap();
    run(&mut conn, &mut sink, 1, Duration::from_secs(3));
    assert_eq!(sink.result(1).unwrap().as_ref().unwrap_err(), &CallError::TimedOut);
    conn.call(2, &CRED, &Args::Read { fh: &fh, offset: 1, count: 65536 }, &mut sink).unwrap();
    run(&mut conn, &mut sink, 2, Duration::from_secs(3));
    assert_eq!(sink.result(2).unwrap().as_ref().unwrap().read, Some((4096, true)));
    let got = sink.reads[&2].contents();
    assert!(got[..4096] == pattern(4096, 2)[..], "B's data");
    assert!(got[4096..].iter().all(|&b| b == 0), "nothing of A's late data in B's buffer");
    let st = conn.stats();
    assert_eq!((st.timeouts, st.bad_replies, st.reconnects), (1, 0, 0), "{st:?}");
}

// ---- zero allocations per call in steady state ----

/// A sink that records nothing but counts (no allocation in `done`).
struct CountingSink {
    read: GuestBuf,
    write: GuestBuf,
    ok: u64,
    failed: u64,
}

impl Sink for CountingSink {
    fn read_buffer(&mut self, _tag: u32) -> Option<Writer<'_>> {
        Some(self.read.writer())
    }
    fn payload(&mut self, _tag: u32) -> Option<Reader<'_>> {
        Some(self.write.reader())
    }
    fn done(&mut self, _tag: u32, res: Result<Res<'_>, CallError>) {
        match res {
            Ok(Res::Failed { .. }) | Err(_) => self.failed += 1,
            Ok(_) => self.ok += 1,
        }
    }
}

#[test]
fn steady_state_calls_do_not_allocate() {
    let a = attr(Ftype::Reg, 1 << 20, 9);
    let data = pattern(65536, 7);
    let srv = FakeServer::start(move |c| {
        let body = match c.proc {
            p if p == Proc::Read as u32 => read_ok(&a, &data, false),
            p if p == Proc::Write as u32 => nfs_fake_server::write_ok(65536, 2, [0; 8]),
            _ => nfs_fake_server::getattr_ok(&a),
        };
        vec![Act::Send(record(&reply(c.xid, &body)))]
    });
    let mut cfg = config(srv.addr());
    cfg.max_io = 1 << 20;
    let mut conn = Conn::new(cfg).unwrap();
    let mut sink = CountingSink {
        read: GuestBuf::uniform(65536, 4096),
        write: GuestBuf::uniform(65536, 4096),
        ok: 0,
        failed: 0,
    };
    let fh = fh();
    let round = |conn: &mut Conn, sink: &mut CountingSink, n: u64| {
        for i in 0..n {
            let args = match i % 3 {
                0 => Args::Getattr { fh: &fh },
                1 => Args::Read { fh: &fh, offset: 0, count: 65536 },
                _ => Args::Write { fh: &fh, offset: 0, count: 65536, stable: Stable::FileSync },
            };
            let target = sink.ok + sink.failed + 1;
            conn.call(i as u32, &CRED, &args, sink).unwrap();
            let t0 = Instant::now();
            while sink.ok + sink.failed < target {
                assert!(t0.elapsed() < Duration::from_secs(5));
                conn.poll(Instant::now(), sink);
            }
        }
    };
    round(&mut conn, &mut sink, 30); // warm-up
    counting::count_here(true);
    let before = counting::counted();
    round(&mut conn, &mut sink, 1500);
    let allocs = counting::counted() - before;
    counting::count_here(false);
    assert_eq!(sink.failed, 0);
    assert_eq!(allocs, 0, "allocations in 1500 steady-state calls");
    assert!(conn.stats().read_direct_bytes + conn.stats().read_copied_bytes >= 500 * 65536);
}

// ---- start-up: portmapper and MOUNT ----

#[test]
fn mount_asks_the_portmapper_then_mounts() {
    use virtiofs_backend::nfs::setup::{self, SetupError};
    use virtiofs_backend::nfs::wire::{mount, portmap};
    // One fake answers as portmapper (NFS and MOUNT registered at its own port), and as MOUNT.
    let port = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let p2 = port.clone();
    let srv = FakeServer::start(move |c| {
        let results = match (c.prog, c.proc) {
            (portmap::PROGRAM, portmap::PROC_GETPORT) => {
                let mut d = virtiofs_backend::nfs::wire::xdr::Decoder::new(&c.args);
                let (prog, vers, prot) = (d.u32().unwrap(), d.u32().unwrap(), d.u32().unwrap());
                assert_eq!((vers, prot), (3, 6));
                let p = if prog == 100_003 || prog == mount::PROGRAM { p2.load(Ordering::SeqCst) } else { 0 };
                enc(|e| e.u32(p).unwrap())
            }
            (mount::PROGRAM, mount::PROC_MNT) => {
                let mut d = virtiofs_backend::nfs::wire::xdr::Decoder::new(&c.args);
                let path = d.opaque(1024, "path").unwrap().to_vec();
                assert_eq!(c.sys, Some((0, 0, 0)), "MOUNT as root");
                if path == b"/exp" {
                    enc(|e| {
                        e.u32(0).unwrap();
                        e.opaque(&[9; 28], 64).unwrap();
                        e.u32(1).unwrap();
                        e.u32(1).unwrap(); // AUTH_SYS
                    })
                } else {
                    enc(|e| e.u32(2).unwrap()) // MNT3ERR_NOENT
                }
            }
            (mount::PROGRAM, mount::PROC_UMNT) => vec![],
            _ => panic!("unexpected call {c:?}"),
        };
        vec![Act::Send(record(&reply(c.xid, &results)))]
    });
    port.store(u32::from(srv.addr().port()), Ordering::SeqCst);
    let t = Duration::from_secs(3);
    let url: virtiofs_backend::nfs::url::NfsUrl =
        format!("nfs://127.0.0.1:{}/exp", srv.addr().port()).parse().unwrap();
    let m = setup::mount(&url, t).unwrap();
    assert_eq!(m.root.as_bytes(), &[9; 28]);
    assert_eq!((m.nfs_addr, m.mount_addr), (srv.addr(), srv.addr()));
    setup::unmount(&m, "/exp", t).unwrap();
    let calls: Vec<(u32, u32)> = srv.calls().iter().map(|c| (c.prog, c.proc)).collect();
    assert_eq!(calls, [(100_000, 3), (100_000, 3), (100_005, 1), (100_005, 3)]);
    let bad: virtiofs_backend::nfs::url::NfsUrl =
        format!("nfs://127.0.0.1:{}/nope", srv.addr().port()).parse().unwrap();
    assert!(matches!(setup::mount(&bad, t), Err(SetupError::MountRefused { status: 2, .. })));
    // A portmapper that does not know the program.
    port.store(0, Ordering::SeqCst);
    assert!(matches!(setup::mount(&url, t), Err(SetupError::NotRegistered(..))));
    // A server that never answers: bounded by the timeout.
    let silent = FakeServer::start(|_| vec![]);
    let url: virtiofs_backend::nfs::url::NfsUrl =
        format!("nfs://127.0.0.1:{}/exp", silent.addr().port()).parse().unwrap();
    let t0 = Instant::now();
    assert!(matches!(setup::mount(&url, Duration::from_millis(300)), Err(SetupError::TimedOut(_))));
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[test]
fn a_connection_can_move_to_its_poller_thread() {
    fn send<T: Send>(_: &T) {}
    let srv = FakeServer::start(|c| vec![Act::Send(record(&reply(c.xid, &[])))]);
    let conn = Conn::new(config(srv.addr())).unwrap();
    send(&conn);
    std::thread::spawn(move || {
        let mut conn = conn;
        let mut sink = TestSink::default();
        conn.call(1, &CRED, &Args::Null, &mut sink).unwrap();
        run(&mut conn, &mut sink, 1, Duration::from_secs(5));
        assert!(sink.result(1).unwrap().is_ok());
    })
    .join()
    .unwrap();
}

// ---- a real server ----

#[test]
fn ganesha_mount_fsinfo_create_write_read_commit() {
    let g = ganesha::Ganesha::start();
    use virtiofs_backend::nfs::setup;
    use virtiofs_backend::nfs::wire::nfs3::{CreateHow, Sattr};
    let url: virtiofs_backend::nfs::url::NfsUrl = g.url().parse().unwrap();
    let m = setup::mount(&url, Duration::from_secs(5)).expect("MOUNT");
    let mut cfg = config(m.nfs_addr);
    cfg.max_io = 1 << 20;
    let mut conn = Conn::new(cfg).unwrap();
    let t = Duration::from_secs(5);
    let mut fsinfo = None;
    setup::call_blocking(&mut conn, &Cred::ROOT, &Args::Fsinfo { fh: &m.root }, t, &mut |r| {
        if let Res::Fsinfo { rtmax, wtmax, .. } = r {
            fsinfo = Some((rtmax, wtmax));
        }
    })
    .expect("FSINFO");
    let (rtmax, wtmax) = fsinfo.expect("FSINFO result");
    assert!(rtmax >= 65536 && wtmax >= 65536, "{rtmax} {wtmax}");

    let root = m.root;
    let mut sink = TestSink::default();
    let sattr = Sattr { mode: Some(0o644), ..Sattr::default() };
    conn.call(
        1,
        &Cred::ROOT,
        &Args::Create { dir: &root, name: b"f", how: CreateHow::Guarded(&sattr) },
        &mut sink,
    )
    .unwrap();
    run(&mut conn, &mut sink, 1, t);
    let created = sink.result(1).unwrap().as_ref().unwrap().debug.clone();
    assert!(created.starts_with("Created { fh: Some("), "{created}");
    // The handle, by LOOKUP (also checks LOOKUP).
    let mut file = None;
    setup::call_blocking(&mut conn, &Cred::ROOT, &Args::Lookup { dir: &root, name: b"f" }, t, &mut |r| {
        if let Res::Lookup { fh, attr, .. } = r {
            assert_eq!(attr.map(|a| a.ftype), Some(Ftype::Reg));
            file = Some(fh);
        }
    })
    .expect("LOOKUP");
    let file = file.expect("LOOKUP found f");

    let len = 200_000;
    let data = pattern(len, 42);
    let wb = GuestBuf::uniform(len, 4096);
    wb.fill(&data);
    sink.writes.insert(2, wb);
    conn.call(
        2,
        &Cred::ROOT,
        &Args::Write { fh: &file, offset: 0, count: len as u32, stable: Stable::Unstable },
        &mut sink,
    )
    .unwrap();
    run(&mut conn, &mut sink, 2, t);
    let (count, _, wverf) = sink.result(2).unwrap().as_ref().unwrap().write.unwrap();
    assert_eq!(count as usize, len);
    conn.call(3, &Cred::ROOT, &Args::Commit { fh: &file, offset: 0, count: 0 }, &mut sink).unwrap();
    run(&mut conn, &mut sink, 3, t);
    let commit = sink.result(3).unwrap().as_ref().unwrap().debug.clone();
    assert_eq!(commit, format!("Commit {{ verf: {wverf:?} }}"), "same write verifier");

    sink.reads.insert(4, GuestBuf::uniform(len, 4096));
    conn.call(4, &Cred::ROOT, &Args::Read { fh: &file, offset: 0, count: len as u32 }, &mut sink).unwrap();
    run(&mut conn, &mut sink, 4, t);
    let r = sink.result(4).unwrap().as_ref().unwrap();
    assert_eq!(r.read, Some((len as u32, true)));
    assert!(sink.reads[&4].contents() == data, "READ data differs from what was written");
    assert_eq!(std::fs::read(g.export().join("f")).unwrap(), data, "the export holds the data");
    let st = conn.stats();
    assert_eq!((st.bad_replies, st.reconnects, st.timeouts), (0, 0, 0));
    assert!(st.read_direct_bytes > len as u64 / 2, "the data went straight into the writer: {st:?}");
    eprintln!("ganesha round trip: {st:?}");
    setup::unmount(&m, &url.export, t).expect("UMNT");
}

#[test]
fn ganesha_killed_and_restarted_calls_wait_reconnect_and_complete() {
    let mut g = ganesha::Ganesha::start();
    use virtiofs_backend::nfs::setup;
    let data = pattern(100_000, 9);
    std::fs::write(g.export().join("r"), &data).unwrap();
    let url: virtiofs_backend::nfs::url::NfsUrl = g.url().parse().unwrap();
    let m = setup::mount(&url, Duration::from_secs(5)).expect("MOUNT");
    let mut cfg = config(m.nfs_addr);
    cfg.max_io = 1 << 20;
    cfg.timeout = Duration::from_secs(20);
    cfg.retransmit = Duration::from_secs(2);
    let mut conn = Conn::new(cfg).unwrap();
    let t = Duration::from_secs(5);
    let mut file = None;
    setup::call_blocking(&mut conn, &Cred::ROOT, &Args::Lookup { dir: &m.root, name: b"r" }, t, &mut |r| {
        if let Res::Lookup { fh, .. } = r {
            file = Some(fh);
        }
    })
    .expect("LOOKUP");
    let file = file.expect("LOOKUP found r");

    // SIGKILL, as a crash; calls issued during the outage wait, then complete on a new
    // connection once the server is back (the file handle survives: VFS handles are stable).
    g.kill();
    let mut sink = TestSink::default();
    sink.reads.insert(1, GuestBuf::uniform(data.len(), 4096));
    conn.call(1, &Cred::ROOT, &Args::Read { fh: &file, offset: 0, count: data.len() as u32 }, &mut sink)
        .unwrap();
    conn.call(2, &Cred::ROOT, &Args::Getattr { fh: &file }, &mut sink).unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(300) {
        conn.poll(Instant::now(), &mut sink);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(sink.done.is_empty(), "nothing ends during a short outage: {:?}", sink.done);
    g.start_again();
    run(&mut conn, &mut sink, 2, Duration::from_secs(15));
    let r = sink.result(1).unwrap().as_ref().unwrap_or_else(|e| panic!("READ after the restart: {e}"));
    assert_eq!(r.read, Some((data.len() as u32, true)));
    assert!(sink.reads[&1].contents() == data);
    assert_eq!(sink.result(2).unwrap().as_ref().unwrap().attr.map(|a| a.size), Some(data.len() as u64));
    let st = conn.stats();
    assert!(st.reconnects >= 1, "{st:?}");
    assert_eq!((st.bad_replies, st.timeouts), (0, 0));
    eprintln!("ganesha restart: {st:?}");
}
