//! The passthrough's io_uring engine: READ, WRITE and FSYNC on the ring, straight between the
//! host file and request buffers cut into odd pieces; everything else (and every unusual case)
//! answered synchronously by the server, exactly as without the engine.

mod harness;

use std::sync::Arc;

use harness::passthrough::Tree;
use harness::{parse, request, HDR, LINUX_FLAGS, ROOT};
use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::{PassthroughConfig, PassthroughFs};
use virtiofs_backend::server::{PollerEngine, Submitted};
use virtiofs_backend::Server;
use vm_memory::{ByteValued, VolatileSlice};

/// A request and its reply area, cut into buffers at the given sizes (the last one takes the
/// rest), kept alive while the engine holds them.
struct Req {
    rbufs: Vec<Vec<u8>>,
    wbufs: Vec<Vec<u8>>,
}

fn cut(bytes: &[u8], sizes: &[usize]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    for &s in sizes {
        if at >= bytes.len() {
            break;
        }
        let n = s.min(bytes.len() - at);
        out.push(bytes[at..at + n].to_vec());
        at += n;
    }
    if at < bytes.len() {
        out.push(bytes[at..].to_vec());
    }
    out
}

impl Req {
    fn new(req: &[u8], rsplit: &[usize], cap: usize, wsplit: &[usize]) -> Req {
        Req { rbufs: cut(req, rsplit), wbufs: cut(&vec![0xa5; cap], wsplit) }
    }

    fn submit(&mut self, e: &mut UringEngine, id: u64) -> Submitted {
        let readable: Vec<VolatileSlice<'_>> =
            self.rbufs.iter_mut().map(|b| VolatileSlice::from(&mut b[..])).collect();
        let writable: Vec<VolatileSlice<'_>> =
            self.wbufs.iter_mut().map(|b| VolatileSlice::from(&mut b[..])).collect();
        e.submit(id, &readable, &writable)
    }

    fn reply(&self, len: u32) -> (abi::OutHeader, Vec<u8>) {
        let all: Vec<u8> = self.wbufs.concat();
        let h: abi::OutHeader = parse(&all);
        assert_eq!(h.len, len, "the reported length is the header's");
        (h, all[HDR..len as usize].to_vec())
    }
}

/// Polls until `want` requests completed; returns (id, len) pairs.
fn reap(e: &mut UringEngine, want: usize) -> Vec<(u64, u32)> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while got.len() < want {
        e.poll(&mut |id, len, _| got.push((id, len)));
        assert!(std::time::Instant::now() < deadline, "completions never came: {got:?}");
    }
    got
}

fn run(e: &mut UringEngine, r: &mut Req) -> (abi::OutHeader, Vec<u8>) {
    let len = match r.submit(e, 7) {
        Submitted::Done(n) => n,
        Submitted::Pending => {
            let done = reap(e, 1);
            assert_eq!(done[0].0, 7);
            done[0].1
        }
        Submitted::Wait(w) => panic!("no request of these tests waits for a lock: {w:?}"),
    };
    r.reply(len)
}

struct Setup {
    t: Tree,
    server: Arc<Server<PassthroughFs>>,
}

/// A share and an initialised server over it, which the engine and the synchronous helpers share.
fn setup() -> Setup {
    setup_tree(Tree::new())
}

/// The passthrough's engine over a ring of its own, as a poller drives it.
type UringEngine = PollerEngine<PassthroughFs>;

fn ring_engine(server: &Arc<Server<PassthroughFs>>, entries: u32, mode: IoMode) -> UringEngine {
    let ring = server.filesystem().new_ring(entries, mode).expect("io_uring");
    PollerEngine::with_engine(server.clone(), Some(Box::new(ring)))
}

fn setup_tree(t: Tree) -> Setup {
    let fs = PassthroughFs::new(PassthroughConfig::new(&t.share)).unwrap();
    let server = Arc::new(Server::new(fs));
    init(&server);
    Setup { t, server }
}

fn init(server: &Arc<Server<PassthroughFs>>) {
    let mut v = abi::InitInCompat { major: 7, minor: 41, max_readahead: 131072, flags: LINUX_FLAGS as u32 }
        .as_slice()
        .to_vec();
    v.extend_from_slice(abi::InitInExt { flags2: (LINUX_FLAGS >> 32) as u32, unused: [0; 11] }.as_slice());
    let mut req = request(opcode::INIT, 0, 1, 0, 0, &[&v]);
    let mut out = vec![0u8; 4096];
    let n =
        harness::serve(server, &[VolatileSlice::from(&mut req[..])], &[VolatileSlice::from(&mut out[..])]);
    let h: abi::OutHeader = parse(&out);
    assert_eq!((h.error, h.len as usize), (0, n));
}

/// Sends `op` through the server (synchronously) and returns the body.
fn sync(server: &Arc<Server<PassthroughFs>>, op: u32, nodeid: u64, args: &[&[u8]]) -> Result<Vec<u8>, i32> {
    let mut req = request(op, nodeid, 3, 0, 0, args);
    let mut out = vec![0u8; 1 << 20];
    let n =
        harness::serve(server, &[VolatileSlice::from(&mut req[..])], &[VolatileSlice::from(&mut out[..])]);
    let h: abi::OutHeader = parse(&out);
    if h.error != 0 {
        return Err(-h.error);
    }
    Ok(out[HDR..n].to_vec())
}

fn create(server: &Arc<Server<PassthroughFs>>, name: &[u8]) -> (u64, u64) {
    let arg = abi::CreateIn { flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, open_flags: 0 };
    let body = sync(server, opcode::CREATE, ROOT, &[arg.as_slice(), &harness::cstr(name)]).unwrap();
    let e: abi::EntryOut = parse(&body);
    let o: abi::OpenOut = parse(&body[128..]);
    (e.nodeid, o.fh)
}

fn write_req(node: u64, fh: u64, offset: u64, data: &[u8], flags: u32) -> Vec<u8> {
    let arg = abi::WriteIn { fh, offset, size: data.len() as u32, write_flags: flags, ..Default::default() };
    request(opcode::WRITE, node, 11, 0, 0, &[arg.as_slice(), data])
}

fn read_req(node: u64, fh: u64, offset: u64, size: u32) -> Vec<u8> {
    request(
        opcode::READ,
        node,
        12,
        0,
        0,
        &[abi::ReadIn { fh, offset, size, ..Default::default() }.as_slice()],
    )
}

#[test]
fn reads_and_writes_go_through_the_ring_with_any_buffer_layout() {
    let s = setup();
    let mut e = ring_engine(&s.server, 64, IoMode::Ring);
    let (node, fh) = create(&s.server, b"data");
    let data: Vec<u8> = (0..(1 << 20) as u32).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
    // WRITE with the payload cut in odd pieces; the header in one buffer or split.
    let layouts: [(&[usize], &[usize]); 4] = [
        (&[40, 40], &[16, 8]),
        (&[7, 33, 40, 4095, 1], &[3, 13, 8]),
        (&[80, 1 << 20], &[24]),
        (&[40, 40, 4096], &[1, 1, 22]),
    ];
    for (i, (rs, ws)) in layouts.iter().enumerate() {
        let off = (i as u64) * (256 << 10);
        let chunk = &data[off as usize..off as usize + (256 << 10)];
        let mut r = Req::new(&write_req(node, fh, off, chunk, 0), rs, 24, ws);
        assert_eq!(r.submit(&mut e, i as u64), Submitted::Pending, "layout {i} goes to the ring");
        let done = reap(&mut e, 1);
        assert_eq!(done, vec![(i as u64, 24)]);
        let (h, body) = r.reply(24);
        assert_eq!((h.error, h.unique), (0, 11));
        assert_eq!(parse::<abi::WriteOut>(&body).size, 256 << 10);
    }
    assert_eq!(std::fs::read(s.t.host("data")).unwrap(), data);
    // READ into odd reply layouts, several in flight at once.
    let mut reqs: Vec<(u64, Req)> = Vec::new();
    for (i, ws) in [&[16usize, 4096][..], &[5, 11, 1000, 3], &[16, 100_000], &[64 << 10]].iter().enumerate() {
        let off = i as u64 * 100_000 + 3;
        reqs.push((off, Req::new(&read_req(node, fh, off, 70_000), &[80], HDR + 70_000, ws)));
    }
    for (i, (_, r)) in reqs.iter_mut().enumerate() {
        assert_eq!(r.submit(&mut e, 100 + i as u64), Submitted::Pending);
    }
    assert!(e.in_flight() <= 4);
    let mut done = reap(&mut e, 4);
    done.sort();
    for (id, len) in done {
        let (off, r) = &reqs[(id - 100) as usize];
        let (h, body) = r.reply(len);
        assert_eq!((h.error, h.unique), (0, 12));
        assert!(body == data[*off as usize..*off as usize + 70_000], "read {id}");
    }
    // At the end of the file the read is short; past it, empty.
    let mut r = Req::new(&read_req(node, fh, (1 << 20) - 10, 4096), &[80], HDR + 4096, &[HDR, 4096]);
    let (h, body) = run(&mut e, &mut r);
    assert_eq!(h.error, 0);
    assert_eq!(body, &data[(1 << 20) - 10..]);
    let mut r = Req::new(&read_req(node, fh, 2 << 20, 4096), &[80], HDR + 4096, &[HDR, 4096]);
    let (h, body) = run(&mut e, &mut r);
    assert_eq!((h.error, body.len()), (0, 0));
    // FSYNC and FDATASYNC.
    for flags in [0, abi::FSYNC_FDATASYNC] {
        let arg = abi::FsyncIn { fh, fsync_flags: flags, padding: 0 };
        let mut r = Req::new(&request(opcode::FSYNC, node, 13, 0, 0, &[arg.as_slice()]), &[80], HDR, &[HDR]);
        assert_eq!(r.submit(&mut e, 1), Submitted::Pending);
        let done = reap(&mut e, 1);
        let (h, body) = r.reply(done[0].1);
        assert_eq!((h.error, h.unique, body.len()), (0, 13, 0));
    }
    let st = e.server().filesystem().engine_stats();
    assert_eq!(st.sync_requests, 0, "{st:?}");
    assert!(st.async_requests >= 12, "{st:?}");
}

#[test]
fn everything_else_is_answered_by_the_server() {
    let s = setup();
    let mut e = ring_engine(&s.server, 8, IoMode::Ring);
    let (node, fh) = create(&s.server, b"f");
    // Other opcodes.
    let mut r = Req::new(
        &request(opcode::GETATTR, node, 5, 0, 0, &[abi::GetattrIn::default().as_slice()]),
        &[56],
        120,
        &[120],
    );
    assert!(matches!(r.submit(&mut e, 1), Submitted::Done(n) if n as usize == HDR + 104));
    // Unknown handle, a handle of another node, a directory handle: the server's errno.
    for (n, h) in [(node, fh + 99), (ROOT, fh)] {
        let mut r = Req::new(&read_req(n, h, 0, 10), &[80], HDR + 10, &[HDR + 10]);
        let (hdr, _) = run(&mut e, &mut r);
        assert_eq!(hdr.error, -libc::EBADF);
    }
    let dfh: abi::OpenOut =
        parse(&sync(&s.server, opcode::OPENDIR, ROOT, &[abi::OpenIn::default().as_slice()]).unwrap());
    let mut r = Req::new(&read_req(ROOT, dfh.fh, 0, 10), &[80], HDR + 10, &[HDR + 10]);
    assert_eq!(run(&mut e, &mut r).0.error, -libc::EISDIR);
    // A reply area too small for the read: ERANGE from the server, nothing read.
    let mut r = Req::new(&read_req(node, fh, 0, 4096), &[80], HDR + 100, &[HDR + 100]);
    assert!(matches!(r.submit(&mut e, 1), Submitted::Done(_)));
    assert_eq!(r.reply(HDR as u32).0.error, -libc::ERANGE);
    // A WRITE whose size disagrees with its payload; one asking to clear set-user-id.
    let mut bad = write_req(node, fh, 0, b"abcd", 0);
    bad[40 + 16..40 + 20].copy_from_slice(&8u32.to_ne_bytes());
    let mut r = Req::new(&bad, &[80], 24, &[24]);
    assert!(matches!(r.submit(&mut e, 1), Submitted::Done(16)));
    assert_eq!(r.reply(16).0.error, -libc::EINVAL);
    let mut r = Req::new(&write_req(node, fh, 0, b"kill", abi::write_flags::KILL_SUIDGID), &[80], 24, &[24]);
    assert!(matches!(r.submit(&mut e, 1), Submitted::Done(24)), "the writer's identity is needed");
    // A header whose length lies.
    let mut lie = read_req(node, fh, 0, 4);
    lie[0] = 200;
    let mut r = Req::new(&lie, &[80], HDR + 4, &[HDR + 4]);
    assert!(matches!(r.submit(&mut e, 1), Submitted::Done(16)));
    // A write to a read-only handle fails on the ring with the host's errno.
    let ro: abi::OpenOut = parse(
        &sync(&s.server, opcode::OPEN, node, &[abi::OpenIn { flags: 0, open_flags: 0 }.as_slice()]).unwrap(),
    );
    let mut r = Req::new(&write_req(node, ro.fh, 0, b"nope", 0), &[80], 24, &[24]);
    assert_eq!(r.submit(&mut e, 2), Submitted::Pending);
    let done = reap(&mut e, 1);
    assert_eq!(r.reply(done[0].1).0.error, -libc::EBADF);
    assert_eq!(e.in_flight(), 0);
}

#[test]
fn a_release_during_a_read_keeps_the_file_open_until_completion() {
    let s = setup();
    let mut e = ring_engine(&s.server, 16, IoMode::Ring);
    let (node, fh) = create(&s.server, b"f");
    std::fs::write(s.t.host("f"), vec![9u8; 1 << 20]).unwrap();
    let mut reqs: Vec<Req> = (0..8)
        .map(|i| {
            Req::new(&read_req(node, fh, i << 17, 128 << 10), &[80], HDR + (128 << 10), &[HDR, 128 << 10])
        })
        .collect();
    for (i, r) in reqs.iter_mut().enumerate() {
        assert_eq!(r.submit(&mut e, i as u64), Submitted::Pending);
    }
    // RELEASE arrives (from another queue) before the completions are reaped.
    sync(&s.server, opcode::RELEASE, node, &[abi::ReleaseIn { fh, ..Default::default() }.as_slice()])
        .unwrap();
    for (id, len) in reap(&mut e, 8) {
        let (h, body) = reqs[id as usize].reply(len);
        assert_eq!(h.error, 0);
        assert!(body.iter().all(|&b| b == 9) && body.len() == 128 << 10);
    }
    assert_eq!(s.server.filesystem().handle_count(), 0);
}

/// Hybrid mode: what cannot block completes inline (no ring), the rest goes on the ring, and
/// the bytes are the same either way.
#[test]
fn hybrid_mode_completes_inline_what_cannot_block() {
    let mut trees = vec![("disk", Tree::new())];
    if std::path::Path::new("/dev/shm").is_dir() {
        trees.push(("tmpfs", Tree::new_in(std::path::Path::new("/dev/shm"))));
    }
    for (what, t) in trees {
        let s = setup_tree(t);
        let tmpfs = what == "tmpfs";
        let mut e = ring_engine(&s.server, 16, IoMode::Hybrid);
        let (node, fh) = create(&s.server, b"f");
        let data: Vec<u8> = (0..(512 << 10) as u32).map(|i| (i * 13 + 5) as u8).collect();
        for (i, chunk) in data.chunks(128 << 10).enumerate() {
            let mut r =
                Req::new(&write_req(node, fh, (i * (128 << 10)) as u64, chunk, 0), &[80, 1000], 24, &[16, 8]);
            let (h, body) = run(&mut e, &mut r);
            assert_eq!(h.error, 0, "{what}");
            assert_eq!(parse::<abi::WriteOut>(&body).size, 128 << 10);
        }
        assert_eq!(std::fs::read(s.t.host("f")).unwrap(), data, "{what}");
        // Cached data: reads are page-cache hits, inline on both.
        for off in [0u64, 4096 * 7 + 3, (512 << 10) - 100] {
            let mut r = Req::new(&read_req(node, fh, off, 8192), &[80], HDR + 8192, &[HDR, 100, 8092]);
            let before = e.server().filesystem().engine_stats();
            let (h, body) = run(&mut e, &mut r);
            assert_eq!(h.error, 0);
            let end = (off as usize + 8192).min(data.len());
            assert!(body == data[off as usize..end], "{what} read at {off}");
            assert_eq!(
                e.server().filesystem().engine_stats().inline_requests,
                before.inline_requests + 1,
                "{what}: a cached read is inline"
            );
        }
        let arg = abi::FsyncIn { fh, fsync_flags: 0, padding: 0 };
        let mut r = Req::new(&request(opcode::FSYNC, node, 13, 0, 0, &[arg.as_slice()]), &[80], HDR, &[HDR]);
        let (h, _) = run(&mut e, &mut r);
        assert_eq!(h.error, 0);
        let st = e.server().filesystem().engine_stats();
        assert_eq!(st.sync_requests, 0, "{what}: {st:?}");
        if tmpfs {
            assert_eq!(st.async_requests, 0, "{what}: nothing waits for storage on tmpfs: {st:?}");
        } else {
            assert!(st.async_requests >= 1, "{what}: FSYNC goes on the ring: {st:?}");
        }
    }
}

#[test]
fn a_full_ring_falls_back_to_the_server() {
    let s = setup();
    let mut e = ring_engine(&s.server, 2, IoMode::Ring);
    let (node, fh) = create(&s.server, b"f");
    std::fs::write(s.t.host("f"), (0..=255u8).cycle().take(64 << 10).collect::<Vec<u8>>()).unwrap();
    let mut reqs: Vec<Req> = (0..4)
        .map(|i| Req::new(&read_req(node, fh, i * 1000, 1000), &[80], HDR + 1000, &[HDR + 1000]))
        .collect();
    let mut pending = 0;
    let mut lens = [0u32; 4];
    for (i, r) in reqs.iter_mut().enumerate() {
        match r.submit(&mut e, i as u64) {
            Submitted::Pending => pending += 1,
            Submitted::Done(n) => lens[i] = n,
            Submitted::Wait(w) => panic!("a READ does not wait for a lock: {w:?}"),
        }
    }
    assert_eq!(pending, 2, "two ring entries");
    for (id, len) in reap(&mut e, 2) {
        lens[id as usize] = len;
    }
    for (i, r) in reqs.iter().enumerate() {
        let (h, body) = r.reply(lens[i]);
        assert_eq!(h.error, 0);
        assert!(body.iter().enumerate().all(|(j, &b)| b == ((i * 1000 + j) % 256) as u8), "read {i}");
    }
    assert_eq!(e.server().filesystem().engine_stats().sync_requests, 2);
}
