//! Zero heap allocations per request in steady state through the NFS engine: READ, WRITE
//! (UNSTABLE, into the replay store) and GETATTR of a file on a real ganesha export, submitted
//! to the server's `PollerEngine` over the `NfsFs` engine and its connection, and polled until
//! they complete. A counting global allocator counts what the engine, the connection and the
//! server allocate inside `submit` and `poll` on this thread (the test's own buffers are made
//! before); after a warm-up the count must not move.

#[path = "harness/counting.rs"]
mod counting;
#[path = "harness/ganesha.rs"]
mod ganesha;
mod harness;

use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{parse, request, HDR, LINUX_FLAGS};
use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::nfs::{NfsFs, NfsOptions};
use virtiofs_backend::server::{PollerEngine, Submitted};
use virtiofs_backend::Server;
use vm_memory::{ByteValued, VolatileSlice};

/// Runs one request through the engine to its reply, counting allocations meanwhile; the
/// reply's header.
fn run(e: &mut PollerEngine<NfsFs>, req: &mut [u8], out: &mut [u8]) -> abi::OutHeader {
    let len = {
        let readable = [VolatileSlice::from(&mut *req)];
        let writable = [VolatileSlice::from(&mut *out)];
        counting::count_here(true);
        let mut len = match e.submit(1, &readable, &writable) {
            Submitted::Done(n) => Some(n),
            Submitted::Pending => None,
            Submitted::Wait(_) => unreachable!("no lock request here"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while len.is_none() {
            e.poll(&mut |_, n, _| len = Some(n));
            assert!(Instant::now() < deadline, "no reply");
        }
        counting::count_here(false);
        len.unwrap_or(0)
    };
    let h: abi::OutHeader = parse(out);
    assert_eq!(h.len, len);
    h
}

#[test]
fn steady_state_read_write_getattr_do_not_allocate() {
    let g = ganesha::Ganesha::start();
    let fs = NfsFs::connect(NfsOptions::new(g.url().parse().unwrap())).unwrap();
    let server = Arc::new(Server::with_lock_waits(fs));
    let mut e = PollerEngine::for_poller(server.clone(), 0);
    let mut out = vec![0u8; 64 << 10];

    let mut init = request(opcode::INIT, 0, 1, 0, 0, &[&harness::init_in(41, LINUX_FLAGS)]);
    assert_eq!(run(&mut e, &mut init, &mut out).error, 0);
    let create = abi::CreateIn { flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, open_flags: 0 };
    let mut req = request(opcode::CREATE, 1, 2, 0, 0, &[create.as_slice(), b"f\0"]);
    assert_eq!(run(&mut e, &mut req, &mut out).error, 0);
    let entry: abi::EntryOut = parse(&out[HDR..]);
    let open: abi::OpenOut = parse(&out[HDR + std::mem::size_of::<abi::EntryOut>()..]);
    let (node, fh) = (entry.nodeid, open.fh);
    // The server's first pending request made its slot: the counting hook works.
    assert!(counting::counted() > 0, "no allocation seen at all: the counting hook is broken");

    let block = vec![0x5au8; 4096];
    let w = abi::WriteIn { fh, offset: 0, size: 4096, ..Default::default() };
    let mut write = request(opcode::WRITE, node, 3, 0, 0, &[w.as_slice(), &block]);
    let r = abi::ReadIn { fh, offset: 0, size: 4096, ..Default::default() };
    let mut read = request(opcode::READ, node, 4, 0, 0, &[r.as_slice()]);
    let mut getattr = request(opcode::GETATTR, node, 5, 0, 0, &[abi::GetattrIn::default().as_slice()]);
    let mut flush =
        request(opcode::FLUSH, node, 6, 0, 0, &[abi::FlushIn { fh, ..Default::default() }.as_slice()]);
    let mut round = |e: &mut PollerEngine<NfsFs>, out: &mut [u8], i: usize| {
        assert_eq!(run(e, &mut write, out).error, 0);
        let h = run(e, &mut read, out);
        assert_eq!((h.error, h.len as usize), (0, HDR + 4096));
        assert_eq!(run(e, &mut getattr, out).error, 0);
        // A FLUSH now and then commits the stored writes (the store stays small).
        if i % 64 == 63 {
            assert_eq!(run(e, &mut flush, out).error, 0);
        }
    };
    for i in 0..256 {
        round(&mut e, &mut out, i);
    }
    let before = counting::counted();
    let n = 1000;
    for i in 0..n {
        round(&mut e, &mut out, i);
    }
    let allocs = counting::counted() - before;
    assert_eq!(allocs, 0, "{allocs} heap allocations for {} requests through the NFS engine", 3 * n);
    let st = server.filesystem().stats();
    assert!(st.unstable.stored >= n as u64, "the writes went UNSTABLE through the store: {st:?}");
}
