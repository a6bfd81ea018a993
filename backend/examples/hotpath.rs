//! Replays hot-path FUSE requests against `Server<RamFs>`, laid out as Linux's virtio-fs driver
//! lays them out (one buffer per header, argument struct and data page), for instruction counts
//! (`valgrind --tool=callgrind`) and a wall-clock figure per request.
//!
//! ```sh
//! cargo build --release -p virtiofs-backend --example hotpath
//! target/release/examples/hotpath read 200000          # ns/request
//! valgrind --tool=callgrind --toggle-collect='*replay*' target/release/examples/hotpath read 20000
//! ```
//!
//! Operations: `read`, `write` (4 KiB at random 4 KiB-aligned offsets of the file, 8 MiB or the
//! third argument in MiB), `getattr`, `lookup`, or `none` (setup only, to subtract from an
//! instruction count).

use std::sync::Arc;
use std::time::Instant;

use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::server::{PollerEngine, Submitted};
use virtiofs_backend::{RamFs, Server};
use vm_memory::{ByteValued, VolatileSlice};

const PAGE: usize = 4096;
const HDR_IN: usize = std::mem::size_of::<abi::InHeader>();
const HDR_OUT: usize = std::mem::size_of::<abi::OutHeader>();

fn header(op: u32, nodeid: u64, unique: u64, len: usize) -> abi::InHeader {
    abi::InHeader {
        len: len as u32,
        opcode: op,
        unique,
        nodeid,
        uid: 0,
        gid: 0,
        pid: 1,
        total_extlen: 0,
        padding: 0,
    }
}

/// Sends `parts` (readable) with `out` (writable); returns the reply length. Allocation-free, so
/// that the driver adds little to an instruction count.
fn call<const R: usize, const W: usize>(
    srv: &mut PollerEngine<RamFs>,
    parts: [&mut [u8]; R],
    out: [&mut [u8]; W],
) -> usize {
    let rs = parts.map(VolatileSlice::from);
    let ws = out.map(VolatileSlice::from);
    match srv.submit(0, &rs, &ws) {
        Submitted::Done(n) => n as usize,
        _ => 0,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let op = args.next().unwrap_or_else(|| "read".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let file_mib: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(8);
    let file = file_mib << 20;

    let mut srv = PollerEngine::synchronous(Arc::new(Server::new(RamFs::new())));
    // INIT as Linux 6.12 would (the flags that matter here: HANDLE_KILLPRIV_V2, INIT_EXT).
    let flags = abi::init::ASYNC_READ
        | abi::init::BIG_WRITES
        | abi::init::HANDLE_KILLPRIV_V2
        | abi::init::MAX_PAGES
        | abi::init::INIT_EXT
        | abi::init::POSIX_ACL;
    let init = abi::InitInCompat { major: 7, minor: 41, max_readahead: 131072, flags: flags as u32 };
    let ext = abi::InitInExt { flags2: (flags >> 32) as u32, unused: [0; 11] };
    let mut h = header(opcode::INIT, 0, 1, HDR_IN + 64);
    let (mut a, mut b) = (init, ext);
    let mut ohdr = [0u8; HDR_OUT];
    let mut obody = [0u8; 256];
    let r = call(&mut srv, [h.as_mut_slice(), a.as_mut_slice(), b.as_mut_slice()], [&mut ohdr, &mut obody]);
    assert!(r > HDR_OUT, "init");

    // CREATE "bench".
    let mut cin = abi::CreateIn { flags: libc::O_RDWR as u32, mode: 0o100644, umask: 0o022, open_flags: 0 };
    let mut name = *b"bench\0";
    let mut h = header(opcode::CREATE, abi::ROOT_ID, 2, HDR_IN + 16 + name.len());
    let r = call(&mut srv, [h.as_mut_slice(), cin.as_mut_slice(), &mut name], [&mut ohdr, &mut obody]);
    assert!(r > HDR_OUT, "create");
    let entry: abi::EntryOut = read_obj(&obody);
    let open: abi::OpenOut = read_obj(&obody[std::mem::size_of::<abi::EntryOut>()..]);
    let (ino, fh) = (entry.nodeid, open.fh);

    let mut page = vec![0x5au8; PAGE];
    let mut wout = [0u8; 8];
    // Lay the file out.
    for i in 0..file / PAGE as u64 {
        let mut h = header(opcode::WRITE, ino, 3 + i, HDR_IN + 40 + PAGE);
        let mut wi = abi::WriteIn { fh, offset: i * PAGE as u64, size: PAGE as u32, ..Default::default() };
        let r = call(&mut srv, [h.as_mut_slice(), wi.as_mut_slice(), &mut page], [&mut ohdr, &mut wout]);
        assert_eq!(r, HDR_OUT + 8, "layout write");
    }

    let start = Instant::now();
    replay(&mut srv, &op, n, ino, fh, file, &mut page);
    let el = start.elapsed();
    if n > 0 {
        println!("{op}: {:.0} ns/request ({n} requests)", el.as_nanos() as f64 / n as f64);
    }
}

/// The measured loop (`valgrind --tool=callgrind --toggle-collect='*replay*'` counts only this).
#[inline(never)]
fn replay(srv: &mut PollerEngine<RamFs>, op: &str, n: u64, ino: u64, fh: u64, file: u64, page: &mut [u8]) {
    let mut ohdr = [0u8; HDR_OUT];
    let mut wout = [0u8; 8];
    let mut eout = [0u8; std::mem::size_of::<abi::EntryOut>()];
    let mut aout = [0u8; std::mem::size_of::<abi::AttrOut>()];
    let mut unique = 1 << 32;
    for i in 0..n {
        unique += 1;
        let off = (i.wrapping_mul(2654435761) % (file / PAGE as u64)) * PAGE as u64;
        let r = match op {
            "read" => {
                let mut h = header(opcode::READ, ino, unique, HDR_IN + 40);
                let mut ri = abi::ReadIn { fh, offset: off, size: PAGE as u32, ..Default::default() };
                call(srv, [h.as_mut_slice(), ri.as_mut_slice()], [&mut ohdr, &mut *page])
            }
            "write" => {
                let mut h = header(opcode::WRITE, ino, unique, HDR_IN + 40 + PAGE);
                let mut wi = abi::WriteIn { fh, offset: off, size: PAGE as u32, ..Default::default() };
                call(srv, [h.as_mut_slice(), wi.as_mut_slice(), &mut *page], [&mut ohdr, &mut wout])
            }
            "getattr" => {
                let mut h = header(opcode::GETATTR, ino, unique, HDR_IN + 16);
                let mut gi = abi::GetattrIn::default();
                call(srv, [h.as_mut_slice(), gi.as_mut_slice()], [&mut ohdr, &mut aout])
            }
            "lookup" => {
                let mut name = *b"bench\0";
                let mut h = header(opcode::LOOKUP, abi::ROOT_ID, unique, HDR_IN + name.len());
                call(srv, [h.as_mut_slice(), &mut name], [&mut ohdr, &mut eout])
            }
            "none" => {
                ohdr[8..16].copy_from_slice(&unique.to_ne_bytes());
                HDR_OUT + 1
            }
            other => panic!("unknown operation {other}"),
        };
        let out: abi::OutHeader = read_obj(&ohdr);
        assert!(r > HDR_OUT && out.error == 0 && out.unique == unique, "{op} failed: {out:?}");
    }
}

fn read_obj<T: ByteValued + Default>(bytes: &[u8]) -> T {
    let mut t = T::default();
    let len = std::mem::size_of::<T>();
    t.as_mut_slice().copy_from_slice(&bytes[..len]);
    t
}
