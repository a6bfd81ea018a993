//! The bodies of the fuzz targets in `fuzz/fuzz_targets/` (cargo-fuzz, nightly), kept in a
//! workspace member so that their corpora (`fuzz/corpus/<target>/`) and the inputs of fixed
//! crashes (`fuzz/regressions/<target>/`) replay as ordinary tests on stable (`tests/fuzz_replay.rs`),
//! as vm-virtio's `fuzz/` does.
//!
//! - [`vfio_user`]: a byte stream of vfio-user messages (some with a memfd or an eventfd
//!   attached) through a real socket into one long-lived device server;
//! - [`virtq`]: the split and packed descriptor walk over guest memory the fuzzer lays out
//!   (cloud-hypervisor's `fuzz_targets/block.rs` shape: queue registers and memory from the
//!   input, then every chain taken and returned);
//! - [`fuse_ramfs`] and [`fuse_passthrough`]: a session of FUSE requests through the decoder
//!   and the server against the RAM filesystem, and against a passthrough of a fresh directory;
//! - [`nfs_reply`]: what an NFS server sends the remote backend, through the reply decoders
//!   alone, through a connection's record reassembly and reply matching over loopback TCP, and
//!   through the blocking start-up calls (see [`nfs`]);
//! - [`nfs4_reply`]: what an NFSv4.1 server sends, through the COMPOUND reply decoders, whole and
//!   result by result (see [`nfs4`]).
//!
//! Inputs are framed as records `[len: u16 le][flags: u8][len bytes]`; what `flags` means is
//! per target. Nothing here may panic on any input: a panic is the finding.

#![deny(missing_docs)]

pub mod nfs;
pub mod nfs4;
pub use nfs::nfs_reply;
pub use nfs4::nfs4_reply;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use virtiofs_backend::filesystem::FileSystem;
use virtiofs_backend::passthrough::{PassthroughConfig, PassthroughFs};
use virtiofs_backend::server::PollerEngine;
use virtiofs_backend::{RamFs, Server};
use virtiofs_device::config::Profile;
use virtiofs_device::memory::DmaTable;
use virtiofs_device::pci::QueueConfig;
use virtiofs_device::poller::{RequestHandler, Taken};
use virtiofs_device::stats::Tally;
use virtiofs_device::virtq::{Chain, Ring};
use vm_memory::VolatileSlice;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Splits `data` into `(flags, bytes)` records (a short last record takes what is left).
pub fn records(mut data: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    std::iter::from_fn(move || {
        if data.len() < 3 {
            return None;
        }
        let len = usize::from(u16::from_le_bytes([data[0], data[1]]));
        let flags = data[2];
        let end = (3 + len).min(data.len());
        let body = &data[3..end];
        data = &data[end..];
        Some((flags, body))
    })
}

// ---------------------------------------------------------------------------------------------
// vfio-user

/// Answers every request with used length 0: the device side is what is fuzzed here.
struct NoFs;

impl RequestHandler for NoFs {
    fn handle(
        &self,
        _taken: Taken,
        _readable: &[VolatileSlice<'_>],
        _writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally) {
        (0, Tally::default())
    }
}

/// Set if the server thread panicked (a finding the replay tests report; under libFuzzer the
/// panic aborts the process).
static SERVER_PANICKED: AtomicBool = AtomicBool::new(false);

/// The socket of the one device server all inputs go to (started on first use).
fn server_socket() -> &'static PathBuf {
    static SOCKET: OnceLock<PathBuf> = OnceLock::new();
    SOCKET.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        let path = dir.join("fuzz.sock");
        let server = virtiofs_device::vfio_user::Server::bind(&path, &Profile::default(), Arc::new(NoFs))
            .expect("server binds");
        std::thread::Builder::new()
            .name("fuzz-vfio-user".into())
            .spawn(move || {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.run())).is_err() {
                    SERVER_PANICKED.store(true, Ordering::SeqCst);
                }
            })
            .expect("server thread");
        path
    })
}

/// One vfio-user session: VERSION first unless flags of the first record say not, then each
/// record as a message. Record flags: bit 0 attaches a 64 KiB memfd, bit 1 an eventfd, bit 2
/// keeps the record's own `msg_size` (else it is set to the record's length, so that most
/// inputs stay in step and reach the command handlers).
pub fn vfio_user(data: &[u8]) {
    let path = server_socket();
    let Ok(mut sock) = UnixStream::connect(path) else { return };
    let _ = sock.set_read_timeout(Some(Duration::from_millis(200)));
    let _ = sock.set_write_timeout(Some(Duration::from_secs(2)));
    let mut reply = vec![0u8; 1 << 16];
    let mut drain = |s: &mut UnixStream| {
        let _ = s.set_nonblocking(true);
        while matches!(s.read(&mut reply), Ok(n) if n > 0) {}
        let _ = s.set_nonblocking(false);
    };
    let json = b"{\"capabilities\":{\"max_msg_fds\":8}}\0";
    let mut version = Vec::new();
    version.extend_from_slice(&0u16.to_le_bytes()); // msg_id
    version.extend_from_slice(&1u16.to_le_bytes()); // VERSION
    version.extend_from_slice(&((16 + 4 + json.len()) as u32).to_le_bytes());
    version.extend_from_slice(&[0u8; 8]); // flags, error
    version.extend_from_slice(&[0u8; 4]); // major 0, minor 0
    version.extend_from_slice(json);
    let mut first = true;
    for (flags, body) in records(data) {
        if first && flags & 0x80 == 0 {
            let _ = sock.write_all(&version);
        }
        first = false;
        let mut msg = body.to_vec();
        if flags & 4 == 0 && msg.len() >= 8 {
            let n = msg.len() as u32;
            msg[4..8].copy_from_slice(&n.to_le_bytes());
        }
        let mut files = Vec::new();
        if flags & 1 != 0 {
            if let Ok(f) = virtiofs_device::memory::memfd("fuzz-dma", 1 << 16) {
                files.push(f);
            }
        }
        let mut events = Vec::new();
        if flags & 2 != 0 {
            if let Ok(e) = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK) {
                events.push(e);
            }
        }
        let fds: Vec<i32> =
            files.iter().map(|f| f.as_raw_fd()).chain(events.iter().map(|e| e.as_raw_fd())).collect();
        let sent = if fds.is_empty() {
            sock.write_all(&msg).is_ok()
        } else {
            sock.send_with_fds(&[&msg[..]], &fds).is_ok()
        };
        if !sent {
            break;
        }
        drain(&mut sock);
    }
    let _ = sock.shutdown(std::net::Shutdown::Write);
    // Read until the server hangs up (it resets the device when it sees our end).
    let _ = sock.set_read_timeout(Some(Duration::from_secs(2)));
    while matches!(sock.read(&mut reply), Ok(n) if n > 0) {}
    assert!(!SERVER_PANICKED.load(Ordering::SeqCst), "the vfio-user server panicked");
}

// ---------------------------------------------------------------------------------------------
// virtqueues

/// Guest memory of the virtqueue target: one window of this many bytes at [`MEM_BASE`].
pub const MEM_SIZE: usize = 64 << 10;
/// Its DMA address.
pub const MEM_BASE: u64 = 0x1_0000;

/// The descriptor walk. The first record's first 8 bytes are the queue registers: features
/// (bit 0 packed, bit 1 EVENT_IDX, bit 2 INDIRECT_DESC), log2 of the size (0..=8), and the
/// descriptor, driver and device area offsets in 16-byte units (u16 each, reduced into the
/// window); everything after them, and the next records, is guest memory from offset 0.
pub fn virtq(data: &[u8]) {
    use virtiofs_device::pci::features as f;
    if data.len() < 8 {
        return;
    }
    let (regs, image) = data.split_at(8);
    let mut features = 0u64;
    if regs[0] & 1 != 0 {
        features |= f::RING_PACKED;
    }
    if regs[0] & 2 != 0 {
        features |= f::EVENT_IDX;
    }
    if regs[0] & 4 != 0 {
        features |= f::INDIRECT_DESC;
    }
    let size = 1u16 << (regs[1] % 9);
    let off = |i: usize| -> u64 {
        let units = u64::from(u16::from_le_bytes([regs[i], regs[i + 1]]));
        MEM_BASE + (units * 16) % MEM_SIZE as u64
    };
    let cfg = QueueConfig { index: 1, size, desc: off(2), avail: off(4), used: off(6), vector: 1 };
    let mut table = DmaTable::default();
    let Ok(file) = virtiofs_device::memory::memfd("fuzz-guest", MEM_SIZE as u64) else { return };
    let mut content = vec![0u8; MEM_SIZE];
    let n = image.len().min(MEM_SIZE);
    content[..n].copy_from_slice(&image[..n]);
    if std::os::unix::fs::FileExt::write_all_at(&file, &content, 0).is_err() {
        return;
    }
    if table.map(MEM_BASE, MEM_SIZE as u64, 0, Some(file)).is_err() {
        return;
    }
    let mem = table.snapshot();
    let Ok(mut ring) = Ring::new(cfg, features) else { return };
    if ring.attach(&mem).is_err() {
        return;
    }
    let mut chain = Chain::default();
    let mut scratch = [0u8; 64];
    // At most two rings' worth of chains: a well-formed ring runs dry much sooner.
    for _ in 0..2 * u32::from(size) {
        match ring.next(&mem, &mut chain) {
            Ok(None) | Err(_) => break,
            Ok(Some(Ok(()))) => {
                // Touch every buffer as a request would: read the readable ones, fill the
                // writable ones.
                let mut written = 0u32;
                for r in chain.readable.iter() {
                    let k = r.len().min(scratch.len());
                    let _ = r.subslice(0, k).map(|s| s.copy_to(&mut scratch[..k]));
                }
                for w in chain.writable.iter() {
                    let k = w.len().min(scratch.len());
                    if let Ok(s) = w.subslice(0, k) {
                        s.copy_from(&scratch[..k]);
                        written = written.saturating_add(k as u32);
                    }
                }
                let head = chain.head;
                if ring.push_used(&mem, head, written).is_err() {
                    break;
                }
            }
            Ok(Some(Err(_))) => {
                let head = chain.head;
                if ring.push_used(&mem, head, 0).is_err() {
                    break;
                }
            }
        }
        if ring.publish_used(&mem).is_err() {
            break;
        }
    }
    let _ = ring.publish_used(&mem);
    let _ = ring.needs_interrupt(&mem);
    let _ = ring.set_notify(&mem, true);
    let _ = ring.has_work(&mem);
}

// ---------------------------------------------------------------------------------------------
// FUSE

/// FUSE_INIT from Linux 6.12 (major 7, minor 41, its flags), so that inputs start in a session.
fn init_request(unique: u64) -> Vec<u8> {
    let mut b = Vec::new();
    let len: u32 = 40 + 64;
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&26u32.to_le_bytes()); // FUSE_INIT
    b.extend_from_slice(&unique.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // nodeid
    b.extend_from_slice(&[0u8; 16]); // uid gid pid total_extlen padding
    b.extend_from_slice(&7u32.to_le_bytes());
    b.extend_from_slice(&41u32.to_le_bytes());
    b.extend_from_slice(&(128u32 << 10).to_le_bytes()); // max_readahead
    b.extend_from_slice(&0x73ff_fffbu32.to_le_bytes()); // flags
    b.extend_from_slice(&0x0000_0003u32.to_le_bytes()); // flags2
    b.extend_from_slice(&[0u8; 44]);
    b
}

/// Serves the FUSE session in `data` on `srv`. Record flags: bit 0 keeps the record's own
/// `len` field (else it is set to the record's length), bit 1 splits the request into two
/// readable buffers after its header, bits 4-5 choose the reply buffers (one of 16 bytes, one
/// of 4 KiB, or 4 KiB + 64 KiB). The first record's bit 7 skips the built-in INIT. `skip` names
/// opcodes not to send (requests the target must not run).
fn fuse_session<F: FileSystem>(srv: &mut PollerEngine<F>, data: &[u8], skip: &[u32]) {
    let mut out_a = vec![0u8; 4096];
    let mut out_b = vec![0u8; 64 << 10];
    let mut first = true;
    let mut unique = 1u64;
    for (flags, body) in records(data) {
        if first && flags & 0x80 == 0 {
            let mut init = init_request(unique);
            srv.submit(0, &[VolatileSlice::from(&mut init[..])], &[VolatileSlice::from(&mut out_a[..])]);
        }
        first = false;
        unique += 2;
        let mut req = body.to_vec();
        if req.len() >= 16 {
            if flags & 1 == 0 {
                let n = req.len() as u32;
                req[..4].copy_from_slice(&n.to_le_bytes());
            }
            req[8..16].copy_from_slice(&unique.to_le_bytes());
            let opcode = u32::from_le_bytes([req[4], req[5], req[6], req[7]]);
            if skip.contains(&opcode) {
                continue;
            }
        }
        let (head, tail) =
            if flags & 2 != 0 && req.len() > 40 { req.split_at_mut(40) } else { (&mut req[..], &mut [][..]) };
        let mut readable = vec![VolatileSlice::from(head)];
        if !tail.is_empty() {
            readable.push(VolatileSlice::from(tail));
        }
        let writable: Vec<VolatileSlice<'_>> = match (flags >> 4) & 3 {
            0 => vec![VolatileSlice::from(&mut out_a[..16])],
            1 => vec![VolatileSlice::from(&mut out_a[..])],
            _ => vec![VolatileSlice::from(&mut out_a[..]), VolatileSlice::from(&mut out_b[..])],
        };
        srv.submit(0, &readable, &writable);
    }
}

/// A FUSE session against a fresh RAM filesystem.
pub fn fuse_ramfs(data: &[u8]) {
    let mut srv = PollerEngine::synchronous(Arc::new(Server::new(RamFs::new())));
    fuse_session(&mut srv, data, &[]);
}

/// A FUSE session against a passthrough of a fresh directory (no sandbox: the passthrough's own
/// confinement keeps it beneath). FALLOCATE is not sent: it would reserve real space on the
/// machine's disk or memory for whatever length the input names.
pub fn fuse_passthrough(data: &[u8]) {
    let Ok(dir) = tempfile::tempdir() else { return };
    let Ok(fs) = PassthroughFs::new(PassthroughConfig::new(dir.path())) else { return };
    let mut srv = PollerEngine::synchronous(Arc::new(Server::new(fs)));
    const FALLOCATE: u32 = 43;
    fuse_session(&mut srv, data, &[FALLOCATE]);
}
