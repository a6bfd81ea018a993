//! End-to-end: POSIX and flock locks through the real device over a vfio-user socket, driven by
//! the host driver model, on both backends (RAM filesystem, and a host directory with the
//! io_uring engine and with the synchronous data path).
//!
//! A SETLKW that conflicts must stay pending while the same queue (and so the same poller) keeps
//! answering other requests, and complete once the conflict goes, also when the unlock arrives
//! through another queue served by another poller; an INTERRUPT (hiprio queue, another poller)
//! ends it with EINTR; a device reset, a client that disconnects or a DMA remap with a request
//! waiting must not hang; a two-owner cycle is EDEADLK. Every test runs on split and on packed
//! virtqueues (`split::*`, `packed::*`): a waiting SETLKW is a buffer the device completes long
//! after the ones behind it, out of ring order.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::PassthroughConfig;
use virtiofs_backend::PassthroughFs;
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::{FuseHandler, RunningDevice};
use virtiofs_tools::fuse_abi::{self as abi, init_flags, opcode, OFFSET_MAX};
use virtiofs_tools::vfio_user::{DMA_MAP_FLAG_READ, DMA_MAP_FLAG_WRITE};
use virtiofs_tools::virtqueue::RingLayout;
use virtiofs_tools::{DriverError, DriverOptions, FsDriver, LockReq};

#[macro_use]
mod rings;
const ROOT: u64 = 1;
const RDWR: u32 = libc::O_RDWR as u32;
const RD: i32 = libc::F_RDLCK;
const WR: i32 = libc::F_WRLCK;
const UN: i32 = libc::F_UNLCK;
/// How long a request must stay unanswered to count as waiting.
const SETTLE: Duration = Duration::from_millis(150);

#[derive(Debug, Clone, Copy)]
enum Backend {
    Ram,
    Passthrough(IoMode),
}

const BACKENDS: [Backend; 3] =
    [Backend::Ram, Backend::Passthrough(IoMode::Hybrid), Backend::Passthrough(IoMode::Sync)];

struct Dev {
    _dir: tempfile::TempDir,
    device: Option<RunningDevice>,
    socket: PathBuf,
    ring: RingLayout,
}

impl Dev {
    fn start(backend: Backend, ring: RingLayout, profile: Profile) -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("locks.sock");
        let device = match backend {
            Backend::Ram => RunningDevice::start_with(
                &socket,
                profile,
                std::sync::Arc::new(virtiofs_dpu::FuseHandler::new(virtiofs_backend::RamFs::new())),
            )
            .expect("device starts"),
            Backend::Passthrough(mode) => {
                let share = dir.path().join("share");
                std::fs::create_dir(&share).unwrap();
                let fs = PassthroughFs::new(PassthroughConfig::new(&share)).unwrap();
                let handler = Arc::new(FuseHandler::new({
                    let mut fs = fs;
                    fs.set_io_mode(mode);
                    fs
                }));
                RunningDevice::start_with(&socket, profile, handler).expect("device starts")
            }
        };
        Dev { _dir: dir, device: Some(device), socket, ring }
    }

    fn connect(&self, request_queues: u16) -> FsDriver {
        let opts = DriverOptions { request_queues, ring: self.ring, ..Default::default() };
        let mut d = FsDriver::connect(&self.socket, opts).expect("driver brings the device up");
        let info = d.init().unwrap();
        assert_ne!(info.flags & init_flags::POSIX_LOCKS, 0, "POSIX_LOCKS negotiated");
        assert_ne!(info.flags & init_flags::FLOCK_LOCKS, 0, "FLOCK_LOCKS negotiated");
        d
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Some(d) = self.device.take() {
            let _ = d.stop();
        }
    }
}

/// Two pollers: queues 0 (hiprio) and 2 on poller 0, queue 1 on poller 1.
fn two_pollers() -> Profile {
    Profile { request_queues: 2, poller_cores: vec![0, 1], ..Default::default() }
}

fn posix(fh: u64, owner: u64, typ: i32, start: u64, end: u64) -> LockReq {
    LockReq { fh, owner, typ, start, end, pid: 1000 + owner as u32, flock: false }
}

fn flock(fh: u64, typ: i32) -> LockReq {
    LockReq { fh, owner: fh, typ, start: 0, end: OFFSET_MAX, pid: 77, flock: true }
}

fn errno(r: Result<Option<abi::FileLock>, DriverError>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.fuse_errno().unwrap_or_else(|| panic!("not a FUSE error: {e}")),
    }
}

/// Asserts that `unique` gets no reply for a while.
fn assert_waits(d: &mut FsDriver, unique: u64) {
    std::thread::sleep(SETTLE);
    let c = d.try_take(unique).unwrap();
    assert!(c.is_none(), "the request should still wait: {c:?}");
    assert!(d.is_pending(unique));
}

/// A file with two handles.
fn file(d: &mut FsDriver, name: &str) -> (u64, u64, u64) {
    let (e, o) = d.create(ROOT, name, 0o644, RDWR).unwrap();
    let other = d.open(e.nodeid, RDWR).unwrap();
    (e.nodeid, o.fh, other.fh)
}

fn setlkw_waits_while_the_queue_goes_on(backend: Backend, ring: RingLayout) {
    let dev = Dev::start(backend, ring, Profile::default());
    let mut d = dev.connect(1);
    let (ino, fa, fb) = file(&mut d, "f");
    d.setlk(ino, &posix(fa, 1, WR, 0, OFFSET_MAX)).unwrap();
    let w = d.submit_lk(1, opcode::SETLKW, ino, &posix(fb, 2, WR, 10, 19)).unwrap();
    assert_waits(&mut d, w);
    // The poller is not blocked: the same queue keeps being answered.
    for i in 0..20u64 {
        assert_eq!(d.write(ino, fa, i * 4096, &[i as u8; 4096]).unwrap(), 4096);
        assert_eq!(d.read(ino, fa, i * 4096, 4096).unwrap(), vec![i as u8; 4096]);
        d.getattr(ino).unwrap();
    }
    // GETLK sees owner 1's lock, with its pid; SETLK of owner 3 is refused at once.
    let c = d.getlk(ino, &posix(fb, 3, RD, 15, 15)).unwrap();
    assert_eq!((c.typ as i32, c.start, c.end, c.pid), (WR, 0, OFFSET_MAX, 1001));
    let u = d.submit_lk(1, opcode::SETLK, ino, &posix(fb, 3, RD, 15, 15)).unwrap();
    assert_eq!(errno(d.lk_result(opcode::SETLK, u)), libc::EAGAIN);
    assert!(d.is_pending(w), "still waiting");
    // Owner 1 unlocks: owner 2's SETLKW completes with 0.
    let t0 = Instant::now();
    d.setlk(ino, &posix(fa, 1, UN, 0, OFFSET_MAX)).unwrap();
    assert_eq!(d.lk_result(opcode::SETLKW, w).unwrap(), None);
    let granted = t0.elapsed();
    assert!(granted < Duration::from_secs(2), "grant took {granted:?}");
    eprintln!("{backend:?}: unlock sent to SETLKW reply seen (same poller): {granted:?}");
    let c = d.getlk(ino, &posix(fa, 1, WR, 0, OFFSET_MAX)).unwrap();
    assert_eq!((c.typ as i32, c.start, c.end, c.pid), (WR, 10, 19, 1002), "owner 2 now holds its range");
    // FLUSH (close) by owner 2 drops it.
    d.flush_owner(ino, fb, 2).unwrap();
    assert_eq!(d.getlk(ino, &posix(fa, 1, WR, 0, OFFSET_MAX)).unwrap().typ as i32, UN);
    d.shutdown().unwrap();
}

fn ram_setlkw_waits_while_the_queue_goes_on(ring: RingLayout) {
    setlkw_waits_while_the_queue_goes_on(Backend::Ram, ring);
}

fn passthrough_setlkw_waits_while_the_queue_goes_on(ring: RingLayout) {
    setlkw_waits_while_the_queue_goes_on(Backend::Passthrough(IoMode::Hybrid), ring);
    setlkw_waits_while_the_queue_goes_on(Backend::Passthrough(IoMode::Sync), ring);
}

fn granted_across_pollers(backend: Backend, ring: RingLayout) {
    let dev = Dev::start(backend, ring, two_pollers());
    let mut d = dev.connect(2);
    let (ino, fa, fb) = file(&mut d, "f");
    // The holder works on queue 2 (poller 0), the waiter on queue 1 (poller 1).
    let u = d.submit_lk(2, opcode::SETLK, ino, &posix(fa, 1, WR, 0, 99)).unwrap();
    d.lk_result(opcode::SETLK, u).unwrap();
    let w = d.submit_lk(1, opcode::SETLKW, ino, &posix(fb, 2, RD, 50, 150)).unwrap();
    assert_waits(&mut d, w);
    // Both pollers keep serving.
    d.use_queue(1);
    d.getattr(ino).unwrap();
    d.use_queue(2);
    d.getattr(ino).unwrap();
    assert!(d.is_pending(w));
    // A downgrade to a read lock through poller 0 lets the reader on poller 1 in.
    let t0 = Instant::now();
    let u = d.submit_lk(2, opcode::SETLK, ino, &posix(fa, 1, RD, 0, 99)).unwrap();
    d.lk_result(opcode::SETLK, u).unwrap();
    let c = d.lk_result(opcode::SETLKW, w);
    assert_eq!(errno(c), 0);
    let granted = t0.elapsed();
    assert!(granted < Duration::from_secs(2), "grant took {granted:?}");
    eprintln!("{backend:?}: downgrade sent to SETLKW reply seen (other poller): {granted:?}");
    // And the other way round, with flock: a waiter on poller 0, the unlock through poller 1.
    d.setlk(ino, &flock(fa, WR)).unwrap();
    let w = d.submit_lk(2, opcode::SETLKW, ino, &flock(fb, RD)).unwrap();
    assert_waits(&mut d, w);
    let u = d.submit_lk(1, opcode::SETLK, ino, &flock(fa, UN)).unwrap();
    d.lk_result(opcode::SETLK, u).unwrap();
    assert_eq!(errno(d.lk_result(opcode::SETLKW, w)), 0);
    d.shutdown().unwrap();
}

fn setlkw_granted_across_pollers(ring: RingLayout) {
    for b in BACKENDS {
        granted_across_pollers(b, ring);
    }
}

fn interrupt(backend: Backend, ring: RingLayout) {
    let dev = Dev::start(backend, ring, two_pollers());
    let mut d = dev.connect(2);
    let (ino, fa, fb) = file(&mut d, "f");
    d.use_queue(2);
    d.setlk(ino, &posix(fa, 1, WR, 0, 0)).unwrap();
    // A waiter on queue 1 (poller 1), interrupted through hiprio (poller 0).
    let w = d.submit_lk(1, opcode::SETLKW, ino, &posix(fb, 2, WR, 0, 0)).unwrap();
    assert_waits(&mut d, w);
    d.interrupt(w).unwrap();
    assert_eq!(errno(d.lk_result(opcode::SETLKW, w)), libc::EINTR);
    // The INTERRUPT can come before the request it names (another queue): the request then
    // fails at once, once.
    let next = d.peek_next_unique();
    d.interrupt(next).unwrap();
    let w = d.submit_lk(1, opcode::SETLKW, ino, &posix(fb, 2, WR, 0, 0)).unwrap();
    assert_eq!(w, next);
    assert_eq!(errno(d.lk_result(opcode::SETLKW, w)), libc::EINTR);
    let w = d.submit_lk(1, opcode::SETLKW, ino, &posix(fb, 2, WR, 0, 0)).unwrap();
    assert_waits(&mut d, w);
    // An INTERRUPT naming a request that was answered already changes nothing.
    d.interrupt(w - 2).unwrap();
    assert_waits(&mut d, w);
    d.setlk(ino, &posix(fa, 1, UN, 0, 0)).unwrap();
    assert_eq!(errno(d.lk_result(opcode::SETLKW, w)), 0);
    d.shutdown().unwrap();
}

fn interrupt_ends_a_waiting_setlkw(ring: RingLayout) {
    for b in BACKENDS {
        interrupt(b, ring);
    }
}

fn deadlock(backend: Backend, ring: RingLayout) {
    let dev = Dev::start(backend, ring, Profile::default());
    let mut d = dev.connect(1);
    let (ino, fa, fb) = file(&mut d, "f");
    d.setlk(ino, &posix(fa, 1, WR, 0, 0)).unwrap();
    d.setlk(ino, &posix(fb, 2, WR, 1, 1)).unwrap();
    let w = d.submit_lk(1, opcode::SETLKW, ino, &posix(fa, 1, WR, 1, 1)).unwrap();
    assert_waits(&mut d, w);
    let u = d.submit_lk(1, opcode::SETLKW, ino, &posix(fb, 2, WR, 0, 0)).unwrap();
    assert_eq!(errno(d.lk_result(opcode::SETLKW, u)), libc::EDEADLK);
    // Owner 2 backs off: owner 1 gets byte 1.
    d.setlk(ino, &posix(fb, 2, UN, 0, OFFSET_MAX)).unwrap();
    assert_eq!(errno(d.lk_result(opcode::SETLKW, w)), 0);
    let c = d.getlk(ino, &posix(fb, 2, WR, 0, OFFSET_MAX)).unwrap();
    assert_eq!((c.start, c.end, c.pid), (0, 1, 1001), "owner 1 holds bytes 0 and 1, merged");
    d.shutdown().unwrap();
}

fn deadlock_of_two_owners_is_edeadlk(ring: RingLayout) {
    for b in BACKENDS {
        deadlock(b, ring);
    }
}

/// A reset with a request waiting, then a client that goes away with one waiting: neither
/// hangs, the next client attaches, and it finds none of the old session's locks.
fn reset_and_disconnect(backend: Backend, ring: RingLayout) {
    let dev = Dev::start(backend, ring, two_pollers());
    for round in 0..2 {
        let mut d = dev.connect(2);
        let (ino, fa, fb) = file(&mut d, &format!("f{round}"));
        d.setlk(ino, &posix(fa, 1, WR, 0, OFFSET_MAX)).unwrap();
        d.setlk(ino, &flock(fa, WR)).unwrap();
        // Waiters on both pollers.
        let w1 = d.submit_lk(1, opcode::SETLKW, ino, &posix(fb, 2, WR, 0, 0)).unwrap();
        let w2 = d.submit_lk(2, opcode::SETLKW, ino, &flock(fb, WR)).unwrap();
        assert_waits(&mut d, w1);
        assert_waits(&mut d, w2);
        let t0 = Instant::now();
        if round == 0 {
            d.shutdown().unwrap();
        } else {
            drop(d);
        }
        let opts = DriverOptions { request_queues: 2, ring: dev.ring, ..Default::default() };
        let mut d = FsDriver::connect(&dev.socket, opts).expect("the next client attaches");
        assert!(t0.elapsed() < Duration::from_secs(5), "reattach took {:?}", t0.elapsed());
        // The reset dropped the locks, even before the new driver's INIT (the old handle still
        // names the file: the session's state goes at INIT).
        let c = d.getlk(ino, &posix(fb, 9, WR, 0, OFFSET_MAX)).unwrap();
        assert_eq!(c.typ as i32, UN, "no lock survives the reset");
        d.init().unwrap();
        // A new session: the old kernel's locks are gone.
        let e = d.lookup(ROOT, &format!("f{round}")).unwrap();
        let o = d.open(e.nodeid, RDWR).unwrap();
        let c = d.getlk(e.nodeid, &posix(o.fh, 9, WR, 0, OFFSET_MAX)).unwrap();
        assert_eq!(c.typ as i32, UN, "no lock survives the reset");
        d.setlk(e.nodeid, &flock(o.fh, WR)).unwrap();
        d.shutdown().unwrap();
    }
}

fn reset_or_disconnect_with_a_waiting_setlkw_does_not_hang(ring: RingLayout) {
    for b in BACKENDS {
        reset_and_disconnect(b, ring);
    }
}

fn remap(backend: Backend, ring: RingLayout) {
    let dev = Dev::start(backend, ring, Profile::default());
    let mut d = dev.connect(1);
    let (ino, fa, fb) = file(&mut d, "f");
    d.setlk(ino, &posix(fa, 1, WR, 0, 0)).unwrap();
    let w = d.submit_lk(1, opcode::SETLKW, ino, &posix(fb, 2, WR, 0, 0)).unwrap();
    assert_waits(&mut d, w);
    // DMA_MAP and DMA_UNMAP of another window are answered while the request waits (the
    // pollers switch memory snapshots without waiting for it).
    let extra = virtiofs_device::memory::memfd("extra-window", 1 << 20).unwrap();
    let t0 = Instant::now();
    let at = 1u64 << 40;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&extra);
    d.client().dma_map(DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE, 0, at, 1 << 20, Some(fd)).unwrap();
    d.client().dma_unmap(0, at, 1 << 20).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "remap took {:?}", t0.elapsed());
    assert!(d.is_pending(w));
    // The wait is answered afterwards, through the new memory snapshot.
    d.setlk(ino, &posix(fa, 1, UN, 0, 0)).unwrap();
    assert_eq!(errno(d.lk_result(opcode::SETLKW, w)), 0);
    d.shutdown().unwrap();
}

fn dma_remap_with_a_waiting_setlkw(ring: RingLayout) {
    for b in BACKENDS {
        remap(b, ring);
    }
}

fn many_waiters_and_flock(backend: Backend, ring: RingLayout) {
    let dev = Dev::start(backend, ring, Profile::default());
    let mut d = dev.connect(1);
    let (ino, fa, fb) = file(&mut d, "f");
    d.setlk(ino, &posix(fa, 1, WR, 0, OFFSET_MAX)).unwrap();
    // A hundred readers wait (the queue holds 128); all get in when the writer goes.
    let waiters: Vec<u64> = (0..100)
        .map(|i| d.submit_lk(1, opcode::SETLKW, ino, &posix(fb, 10 + i, RD, i, i + 10)).unwrap())
        .collect();
    std::thread::sleep(SETTLE);
    for &w in &waiters {
        assert!(d.try_take(w).unwrap().is_none());
    }
    d.setlk(ino, &posix(fa, 1, UN, 0, OFFSET_MAX)).unwrap();
    for &w in &waiters {
        assert_eq!(errno(d.lk_result(opcode::SETLKW, w)), 0);
    }
    // flock: exclusive by one handle; another handle waits; RELEASE with FLOCK_UNLOCK of the
    // holder lets it in; converting back and forth works.
    let fc = d.open(ino, RDWR).unwrap().fh;
    d.setlk(ino, &flock(fa, WR)).unwrap();
    let w = d.submit_lk(1, opcode::SETLKW, ino, &flock(fb, WR)).unwrap();
    assert_waits(&mut d, w);
    let u = d.submit_lk(1, opcode::SETLK, ino, &flock(fc, RD)).unwrap();
    assert_eq!(errno(d.lk_result(opcode::SETLK, u)), libc::EAGAIN);
    d.release_flock(ino, fa, fa).unwrap();
    assert_eq!(errno(d.lk_result(opcode::SETLKW, w)), 0);
    d.setlk(ino, &flock(fb, RD)).unwrap();
    d.setlk(ino, &flock(fc, RD)).unwrap();
    let u = d.submit_lk(1, opcode::SETLK, ino, &flock(fb, WR)).unwrap();
    assert_eq!(errno(d.lk_result(opcode::SETLK, u)), libc::EAGAIN, "upgrade while another shares");
    d.shutdown().unwrap();
}

fn many_waiters_and_flock_locks(ring: RingLayout) {
    for b in BACKENDS {
        many_waiters_and_flock(b, ring);
    }
}

fn malformed(backend: Backend, ring: RingLayout) {
    let dev = Dev::start(backend, ring, Profile::default());
    let mut d = dev.connect(1);
    let (ino, fa, _) = file(&mut d, "f");
    let dir = d.mkdir(ROOT, "d", 0o755).unwrap();
    let dh = d.opendir(dir.nodeid).unwrap();
    let cases: [(u32, u64, LockReq, i32); 6] = [
        (opcode::SETLKW, ino, posix(fa, 1, WR, 9, 8), libc::EINVAL),
        (opcode::SETLKW, ino, posix(fa, 1, 9, 0, 1), libc::EINVAL),
        (opcode::SETLK, ino, posix(fa, 1, WR, 0, u64::MAX), libc::EINVAL),
        (opcode::SETLKW, ino, posix(fa + 1000, 1, WR, 0, 1), libc::EBADF),
        (opcode::GETLK, ino, flock(fa, WR), libc::EINVAL),
        (opcode::SETLK, dir.nodeid, posix(dh.fh, 1, WR, 0, 1), libc::EINVAL),
    ];
    for (op, node, req, want) in cases {
        let u = d.submit_lk(1, op, node, &req).unwrap();
        assert_eq!(errno(d.lk_result(op, u)), want, "{op} {req:?}");
    }
    // Unknown lk_flags bits.
    let arg = abi::LkIn { fh: fa, owner: 1, lk_typ: RD as u32, lk_flags: 6, ..Default::default() }.to_bytes();
    let (h, _) = d.call(1, opcode::SETLK, ino, &[&arg], 0).unwrap();
    assert_eq!(h.error, -libc::EINVAL);
    // A short argument.
    let (h, _) = d.call(1, opcode::SETLKW, ino, &[&arg[..20]], 0).unwrap();
    assert_eq!(h.error, -libc::EINVAL);
    d.shutdown().unwrap();
}

fn malformed_lock_requests_are_errnos(ring: RingLayout) {
    for b in BACKENDS {
        malformed(b, ring);
    }
}

on_both_layouts!(
    ram_setlkw_waits_while_the_queue_goes_on,
    passthrough_setlkw_waits_while_the_queue_goes_on,
    setlkw_granted_across_pollers,
    interrupt_ends_a_waiting_setlkw,
    deadlock_of_two_owners_is_edeadlk,
    reset_or_disconnect_with_a_waiting_setlkw_does_not_hang,
    dma_remap_with_a_waiting_setlkw,
    many_waiters_and_flock_locks,
    malformed_lock_requests_are_errnos,
);
