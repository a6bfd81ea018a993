//! End-to-end: the device with its RAM filesystem on a tempdir socket, driven by the host-side
//! driver model (`virtiofs_tools::FsDriver`) the way QEMU + Linux virtio-fs would drive it.
//!
//! Every scenario runs on both virtqueue layouts: a helper takes the [`RingLayout`] and two
//! `#[test]`s call it, `..._split` and `..._packed`.

use std::path::PathBuf;

use virtiofs_dpu::config::Profile;
use virtiofs_dpu::RunningDevice;
use virtiofs_tools::fuse_abi::{self as abi, opcode};
use virtiofs_tools::virtqueue::RingLayout;
use virtiofs_tools::{DriverError, DriverOptions, FsDriver};

#[macro_use]
mod rings;
const ROOT: u64 = 1;
const MIB: usize = 1 << 20;
const CHUNK: usize = 128 << 10;

struct Setup {
    _dir: tempfile::TempDir,
    device: Option<RunningDevice>,
    socket: PathBuf,
}

impl Setup {
    fn new(profile: Profile) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("virtiofs.sock");
        let device = RunningDevice::start_with(
            &socket,
            profile,
            std::sync::Arc::new(virtiofs_dpu::FuseHandler::new(virtiofs_backend::RamFs::new())),
        )
        .expect("device starts");
        Setup { _dir: dir, device: Some(device), socket }
    }

    fn connect(&self, opts: DriverOptions) -> FsDriver {
        let ring = opts.ring;
        let d = FsDriver::connect(&self.socket, opts).expect("driver brings the device up");
        assert_eq!(d.facts().ring, ring, "the layout asked for is the one negotiated");
        d
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(d) = self.device.take() {
            let _ = d.stop();
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 12) as u8)).collect()
}

/// The scenario of the issue: mkdir, create, write 1 MiB in 128 KiB requests, read back,
/// readdir, rename, unlink, statfs. `name` keeps directories of different runs apart.
fn workload(d: &mut FsDriver, name: &str, size: usize) {
    let dir = d.mkdir(ROOT, name, 0o755).unwrap();
    assert_eq!(dir.attr.mode & libc::S_IFMT, libc::S_IFDIR);
    let looked = d.lookup(ROOT, name).unwrap();
    assert_eq!(looked.nodeid, dir.nodeid);

    let (file, open) = d.create(dir.nodeid, "data", 0o644, libc::O_RDWR as u32).unwrap();
    let data = pattern(size, name.len() as u8);
    for (i, chunk) in data.chunks(CHUNK).enumerate() {
        let n = d.write(file.nodeid, open.fh, (i * CHUNK) as u64, chunk).unwrap();
        assert_eq!(n as usize, chunk.len(), "short write at chunk {i}");
    }
    let attr = d.getattr(file.nodeid).unwrap();
    assert_eq!(attr.size, size as u64);

    let mut back = Vec::with_capacity(size);
    for off in (0..size).step_by(CHUNK) {
        let want = CHUNK.min(size - off) as u32;
        let got = d.read(file.nodeid, open.fh, off as u64, want).unwrap();
        assert_eq!(got.len(), want as usize, "short read at {off}");
        back.extend_from_slice(&got);
    }
    assert!(back == data, "read-back differs from what was written");
    // Reading past the end returns nothing.
    assert!(d.read(file.nodeid, open.fh, size as u64, 4096).unwrap().is_empty());
    d.flush(file.nodeid, open.fh).unwrap();
    d.fsync(file.nodeid, open.fh, false).unwrap();
    d.release(file.nodeid, open.fh).unwrap();

    let dh = d.opendir(dir.nodeid).unwrap();
    let entries = d.readdir_all(dir.nodeid, dh.fh).unwrap();
    let names: Vec<String> = entries.iter().map(|e| String::from_utf8_lossy(&e.name).into_owned()).collect();
    assert!(names.contains(&"data".to_string()), "readdir: {names:?}");
    let plus = d.readdirplus(dir.nodeid, dh.fh, 0, 4096).unwrap();
    let p = plus.iter().find(|p| p.dirent.name == b"data").expect("readdirplus lists the file");
    if p.entry.nodeid != 0 {
        assert_eq!(p.entry.nodeid, file.nodeid);
        assert_eq!(p.entry.attr.size, size as u64);
    }
    d.releasedir(dir.nodeid, dh.fh).unwrap();

    d.rename(dir.nodeid, "data", dir.nodeid, "renamed").unwrap();
    assert_eq!(d.lookup(dir.nodeid, "data").unwrap_err().fuse_errno(), Some(libc::ENOENT));
    let renamed = d.lookup(dir.nodeid, "renamed").unwrap();
    assert_eq!(renamed.nodeid, file.nodeid);
    assert_eq!(renamed.attr.size, size as u64);

    // Truncate through SETATTR, then unlink.
    let a = d.truncate(file.nodeid, 4096, None).unwrap();
    assert_eq!(a.size, 4096);
    d.unlink(dir.nodeid, "renamed").unwrap();
    assert_eq!(d.lookup(dir.nodeid, "renamed").unwrap_err().fuse_errno(), Some(libc::ENOENT));
    d.rmdir(ROOT, name).unwrap();
    assert_eq!(d.lookup(ROOT, name).unwrap_err().fuse_errno(), Some(libc::ENOENT));

    let st = d.statfs(ROOT).unwrap();
    assert!(st.bsize > 0, "statfs: {st:?}");
    assert!(st.namelen > 0, "statfs: {st:?}");
}

fn init(d: &mut FsDriver) {
    let i = d.init().unwrap();
    assert_eq!(i.out.major, 7);
    assert!(i.max_write as usize >= CHUNK, "max_write {} below {CHUNK}", i.max_write);
}

fn bring_up_reports_the_device(ring: RingLayout) {
    let s = Setup::new(Profile::default());
    let d = s.connect(DriverOptions { ring, ..Default::default() });
    let f = d.facts();
    assert_eq!(f.tag, "virtiofs");
    assert_eq!(f.num_request_queues, 1);
    assert!(f.num_queues >= 2);
    assert!(f.device_features & virtiofs_tools::virtio::features::VERSION_1 != 0);
    assert_eq!(
        f.device_features & virtiofs_tools::virtio::features::VIRTIO_FS_F_NOTIFICATION,
        f.device_features & 1
    );
    assert_eq!(d.queue_size(1), 128);
    // The default profile polls adaptively, so doorbells come through the socket.
    assert!(!f.notify_mapped, "adaptive polling traps the notify area");
    assert_eq!(f.version.major, 0);
    d.shutdown().unwrap();
    drop(s);
    let busy = Setup::new(Profile { polling: virtiofs_dpu::config::Polling::Busy, ..Profile::default() });
    let d = busy.connect(DriverOptions { ring, ..Default::default() });
    assert!(d.facts().notify_mapped, "busy polling: the notify area is sparse-mmappable");
    d.shutdown().unwrap();
}

fn polling_completions(ring: RingLayout) {
    let s = Setup::new(Profile::default());
    let mut d = s.connect(DriverOptions { ring, ..Default::default() });
    init(&mut d);
    workload(&mut d, "poll", MIB);
    d.forget(ROOT, 1).unwrap();
    eprintln!("poll stats {:?} notify {:?}", d.stats(), d.notify_counts());
    d.shutdown().unwrap();
}

fn interrupt_completions(ring: RingLayout) {
    let s = Setup::new(Profile::default());
    let mut d = s.connect(DriverOptions { ring, use_interrupts: true, ..Default::default() });
    init(&mut d);
    workload(&mut d, "irq", MIB);
    eprintln!("irq stats {:?} notify {:?}", d.stats(), d.notify_counts());
    assert!(d.stats().interrupts > 0, "no MSI-X eventfd fired: {:?}", d.stats());
    let dev = s.device.as_ref().unwrap().stats();
    assert!(dev.interrupts().iter().sum::<u64>() > 0, "the device counted no interrupt: {dev:?}");
    d.shutdown().unwrap();
}

fn two_request_queues(ring: RingLayout) {
    let profile = Profile { request_queues: 2, ..Default::default() };
    let s = Setup::new(profile);
    let mut d =
        s.connect(DriverOptions { ring, request_queues: 2, spread_requests: true, ..Default::default() });
    assert_eq!(d.facts().num_request_queues, 2);
    assert_eq!(d.request_queues(), 2);
    init(&mut d);
    workload(&mut d, "two", MIB);
    assert!(d.completed_on(1) > 10, "queue 1: {}", d.completed_on(1));
    assert!(d.completed_on(2) > 10, "queue 2: {}", d.completed_on(2));
    // And explicitly on each queue, with interrupts, on a fresh device.
    drop(d);
    drop(s);
    let s = Setup::new(Profile { request_queues: 2, ..Default::default() });
    let mut d =
        s.connect(DriverOptions { ring, request_queues: 2, use_interrupts: true, ..Default::default() });
    init(&mut d);
    for q in 1..=2 {
        d.use_queue(q);
        workload(&mut d, &format!("q{q}"), 256 << 10);
    }
    assert!(d.completed_on(1) > 0 && d.completed_on(2) > 0);
}

/// One poller per request queue, hiprio riding on poller 0 (`queue_mapping = "request-queues"`),
/// with doorbells through the socket: every queue is served, FORGETs on hiprio included.
fn one_poller_per_request_queue(ring: RingLayout) {
    use virtiofs_dpu::config::QueueMapping;
    let profile = Profile {
        request_queues: 2,
        poller_cores: vec![0, 1],
        queue_mapping: QueueMapping::RequestQueues,
        ..Default::default()
    };
    let s = Setup::new(profile);
    let mut d =
        s.connect(DriverOptions { ring, request_queues: 2, use_interrupts: true, ..Default::default() });
    init(&mut d);
    for q in 1..=2 {
        d.use_queue(q);
        workload(&mut d, &format!("rq{q}"), 256 << 10);
    }
    let e = d.mkdir(ROOT, "forgotten", 0o755).unwrap();
    d.forget(e.nodeid, 1).unwrap();
    assert!(d.completed_on(1) > 0 && d.completed_on(2) > 0);
    let stats = s.device.as_ref().unwrap().stats().requests();
    assert!(stats[0] >= 1 && stats[1] > 0 && stats[2] > 0, "per-queue requests {stats:?}");
}

fn ring_feature_variants(ring: RingLayout) {
    let s = Setup::new(Profile::default());
    for (i, (event_idx, indirect, posted, irq)) in [
        (false, false, true, false),
        (false, true, false, true),
        (true, false, false, false),
        (true, true, false, true),
    ]
    .into_iter()
    .enumerate()
    {
        let mut d = s.connect(DriverOptions {
            ring,
            event_idx,
            indirect_desc: indirect,
            posted_writes: posted,
            use_interrupts: irq,
            ..Default::default()
        });
        init(&mut d);
        workload(&mut d, &format!("variant{i}"), 512 << 10);
        d.shutdown().unwrap();
    }
}

fn queue_depth_and_queue_full(ring: RingLayout) {
    let s = Setup::new(Profile::default());
    // Small queue without indirect descriptors: a 16 KiB read takes 1 + 1 + 1 + 4 descriptors.
    let mut d = s.connect(DriverOptions { ring, queue_size: 16, indirect_desc: false, ..Default::default() });
    d.init().unwrap();
    let (file, open) = d.create(ROOT, "qd", 0o644, libc::O_RDWR as u32).unwrap();
    // Linux caps requests at queue size - 4 pages: 12 pages = 48 KiB here.
    let max_write = d.init_info().unwrap().max_write as usize;
    assert_eq!(max_write, 12 * 4096);
    let data = pattern(256 << 10, 7);
    for (i, c) in data.chunks(max_write).enumerate() {
        d.write(file.nodeid, open.fh, (i * max_write) as u64, c).unwrap();
    }
    let read_in =
        |off: u64| abi::ReadIn { fh: open.fh, offset: off, size: 16 << 10, ..Default::default() }.to_bytes();
    let mut want: std::collections::HashMap<u64, u64> = Default::default();
    let mut next_off = 0u64;
    let mut full_seen = false;
    let mut done = 0;
    let total = data.len() as u64 / (16 << 10);
    while done < total {
        while next_off < data.len() as u64 {
            let r = read_in(next_off);
            match d.submit(1, opcode::READ, file.nodeid, &[&r], &[], 0, 16 << 10) {
                Ok(t) => {
                    want.insert(t, next_off);
                    next_off += 16 << 10;
                }
                Err(e) if e.is_queue_full() => {
                    full_seen = true;
                    break;
                }
                Err(e) => panic!("{e:?}"),
            }
        }
        for c in d.wait_completions().unwrap() {
            let off = want.remove(&c.token).expect("known token") as usize;
            let (h, payload) = FsDriver::parse_reply(&c, opcode::READ, c.token).unwrap();
            assert_eq!(h.error, 0);
            assert!(payload == data[off..off + (16 << 10)], "data at {off}");
            done += 1;
        }
    }
    assert!(full_seen, "the queue never filled up");
    assert!(want.is_empty());
    d.release(file.nodeid, open.fh).unwrap();
}

fn symlink_link_and_errors(ring: RingLayout) {
    let s = Setup::new(Profile::default());
    let mut d = s.connect(DriverOptions { ring, ..Default::default() });
    init(&mut d);
    let (f, o) = d.create(ROOT, "target", 0o600, libc::O_RDWR as u32).unwrap();
    d.release(f.nodeid, o.fh).unwrap();
    let l = d.symlink(ROOT, "sym", "target").unwrap();
    assert_eq!(d.readlink(l.nodeid).unwrap(), b"target");
    let h = d.link(f.nodeid, ROOT, "hard").unwrap();
    assert_eq!(h.attr.nlink, 2);
    // Errors come back as negative errnos.
    let e = d.mkdir(ROOT, "target", 0o755).unwrap_err();
    assert_eq!(e.fuse_errno(), Some(libc::EEXIST), "{e:?}");
    let e = d.rmdir(ROOT, "nothing").unwrap_err();
    assert_eq!(e.fuse_errno(), Some(libc::ENOENT), "{e:?}");
    // An unknown opcode gets ENOSYS, not silence.
    let (h, p) = d.call(1, 9999, ROOT, &[], 64).unwrap();
    assert_eq!(h.error, -libc::ENOSYS);
    assert!(p.is_empty());
    // A crafted GETATTR through the generic path.
    let g = abi::GetattrIn::default().to_bytes();
    let (h, p) = d.call(1, opcode::GETATTR, ROOT, &[&g], 104).unwrap();
    assert_eq!(h.error, 0);
    assert_eq!(p.len(), abi::ATTR_OUT_SIZE);
    // MKNOD (a FIFO) and RENAME2 with RENAME_NOREPLACE onto an existing name.
    let fifo = d.mknod(ROOT, "fifo", libc::S_IFIFO | 0o644, 0).unwrap();
    assert_eq!(fifo.attr.mode & libc::S_IFMT, libc::S_IFIFO);
    let e = d.rename2(ROOT, "fifo", ROOT, "target", 1).unwrap_err();
    assert_eq!(e.fuse_errno(), Some(libc::EEXIST), "{e:?}");
    // A fully raw request: header crafted here, one readable and two writable descriptors.
    let unique = 0x1000;
    let mut raw = abi::InHeader {
        len: (abi::InHeader::SIZE + abi::GetattrIn::SIZE) as u32,
        opcode: opcode::GETATTR,
        unique,
        nodeid: ROOT,
        ..Default::default()
    }
    .to_bytes();
    raw.extend_from_slice(&abi::GetattrIn::default().to_bytes());
    let t = d.submit_raw(1, &[&raw], &[16, 104]).unwrap();
    let c = d.wait_for(t).unwrap();
    let (h, p) = FsDriver::parse_reply(&c, opcode::GETATTR, unique).unwrap();
    assert_eq!((h.error, p.len()), (0, abi::ATTR_OUT_SIZE));
    for n in ["sym", "hard", "target", "fifo"] {
        d.unlink(ROOT, n).unwrap();
    }
    assert!(matches!(d.lookup(ROOT, "target"), Err(DriverError::Fuse { errno: libc::ENOENT, .. })));
}

/// Adaptive polling with doorbells on the socket: a parked poller is woken by the driver's
/// doorbell, not by its timer, and a polling one asks for no doorbells at all.
fn parked_poller_wakes_on_doorbell(ring: RingLayout) {
    use std::time::{Duration, Instant};
    use virtiofs_dpu::config::{Doorbells, Polling};
    // Park after 20 ms idle, for up to 100 ms: timer-only wake-ups would cost ~50 ms a request.
    let profile = Profile {
        polling: Polling::Adaptive,
        doorbells: Doorbells::Socket,
        idle_spin_us: 20_000,
        idle_sleep_us: 100_000,
        ..Profile::default()
    };
    let s = Setup::new(profile);
    let mut d = s.connect(DriverOptions { ring, ..Default::default() });
    assert!(!d.facts().notify_mapped, "the notify area is trapped, not mmapped");
    d.init().unwrap();

    // Back-to-back requests: the poller is spinning and asked for no doorbells.
    let (_, before) = d.notify_counts();
    for _ in 0..2000 {
        d.getattr(ROOT).unwrap();
    }
    let (mapped, busy_rings) = d.notify_counts();
    assert_eq!(mapped, 0);
    assert!(busy_rings - before < 200, "{} doorbells for 2000 back-to-back requests", busy_rings - before);

    // Requests after idle spells: each finds the poller parked and rings it awake.
    let n = 20;
    let mut waits = Vec::with_capacity(n as usize);
    for _ in 0..n {
        std::thread::sleep(Duration::from_millis(40));
        let t = Instant::now();
        d.getattr(ROOT).unwrap();
        waits.push(t.elapsed());
    }
    let (_, idle_rings) = d.notify_counts();
    assert!(
        idle_rings - busy_rings >= n / 2,
        "{} doorbells for {n} requests after idle spells",
        idle_rings - busy_rings
    );
    let taken: u64 = s.device.as_ref().unwrap().stats().doorbells().iter().sum();
    assert!(taken >= n / 2, "the device counted {taken} doorbells");
    // A timer wake-up would take half the 100 ms sleep on average; a doorbell takes well under.
    // The median, not the sum, so that a loaded machine's few slow rounds do not decide.
    waits.sort_unstable();
    let median = waits[waits.len() / 2];
    assert!(median < Duration::from_millis(25), "median request after an idle spell took {median:?}");
    d.shutdown().unwrap();
}

/// Many requests with several in flight on a 16-entry ring without indirect descriptors (each
/// request takes 3 to 5 slots), so the ring wraps dozens of times; a SETLKW that waits the whole
/// time holds its slots, so every other request completes before it (out of order), and so do
/// the requests around it. Then readdir, unlink and the waiter's grant.
fn many_requests_wrap_the_ring(ring: RingLayout) {
    use virtiofs_tools::LockReq;
    let s = Setup::new(Profile { queue_size: 16, ..Profile::default() });
    for event_idx in [false, true] {
        let mut d = s.connect(DriverOptions {
            ring,
            queue_size: 16,
            indirect_desc: false,
            event_idx,
            ..Default::default()
        });
        d.init().unwrap();
        let name = format!("wrap{}", u8::from(event_idx));
        let dir = d.mkdir(ROOT, &name, 0o755).unwrap();
        let (file, fa) = d.create(dir.nodeid, "f", 0o644, libc::O_RDWR as u32).unwrap();
        let fb = d.open(file.nodeid, libc::O_RDWR as u32).unwrap();
        let lock = |fh, owner| LockReq {
            fh,
            owner,
            typ: libc::F_WRLCK,
            end: u64::MAX >> 1,
            pid: 9,
            ..Default::default()
        };
        d.setlk(file.nodeid, &lock(fa.fh, 1)).unwrap();
        let waiter = d.submit_lk(1, opcode::SETLKW, file.nodeid, &lock(fb.fh, 2)).unwrap();
        // Writes of 4 KiB blocks, then reads of them, keeping as many in flight as fit.
        const BLOCKS: u64 = 16;
        let block = |i: u64| pattern(4096, i as u8);
        let mut want = std::collections::HashMap::new();
        let (mut issued, mut done, mut max_in_flight) = (0u64, 0u64, 0usize);
        let total = 600u64;
        while done < total {
            while issued < total {
                let b = issued % BLOCKS;
                let r = if issued < BLOCKS || issued % 3 == 0 {
                    let w = abi::WriteIn { fh: fa.fh, offset: b * 4096, size: 4096, ..Default::default() }
                        .to_bytes();
                    d.submit(1, opcode::WRITE, file.nodeid, &[&w], &block(b), abi::WriteOut::SIZE, 0)
                        .map(|t| (t, opcode::WRITE, b))
                } else {
                    let r = abi::ReadIn { fh: fa.fh, offset: b * 4096, size: 4096, ..Default::default() }
                        .to_bytes();
                    d.submit(1, opcode::READ, file.nodeid, &[&r], &[], 0, 4096).map(|t| (t, opcode::READ, b))
                };
                match r {
                    Ok((t, op, b)) => {
                        want.insert(t, (op, b));
                        issued += 1;
                    }
                    Err(e) if e.is_queue_full() => break,
                    Err(e) => panic!("{e:?}"),
                }
            }
            max_in_flight = max_in_flight.max(d.in_flight());
            for c in d.wait_completions().unwrap() {
                let (op, b) = want.remove(&c.token).unwrap_or_else(|| panic!("unknown token {}", c.token));
                let (h, p) = FsDriver::parse_reply(&c, op, c.token).unwrap();
                assert_eq!(h.error, 0, "{op} of block {b}");
                if op == opcode::READ {
                    assert!(p == block(b), "block {b} reads back what was written");
                } else {
                    assert_eq!(abi::WriteOut::decode(&p).unwrap().size, 4096);
                }
                done += 1;
            }
        }
        // The waiter and at least two others were in flight at once.
        assert!(max_in_flight >= 3, "{max_in_flight} in flight at most");
        assert!(d.is_pending(waiter), "the SETLKW still waits after {total} later requests");
        let dh = d.opendir(dir.nodeid).unwrap();
        let names: Vec<Vec<u8>> =
            d.readdir_all(dir.nodeid, dh.fh).unwrap().into_iter().map(|e| e.name).collect();
        assert!(names.contains(&b"f".to_vec()), "{names:?}");
        d.releasedir(dir.nodeid, dh.fh).unwrap();
        d.setlk(file.nodeid, &LockReq { typ: libc::F_UNLCK, ..lock(fa.fh, 1) }).unwrap();
        assert_eq!(d.lk_result(opcode::SETLKW, waiter).unwrap(), None, "granted once the holder unlocked");
        d.release(file.nodeid, fa.fh).unwrap();
        d.release(file.nodeid, fb.fh).unwrap();
        d.unlink(dir.nodeid, "f").unwrap();
        assert_eq!(d.lookup(dir.nodeid, "f").unwrap_err().fuse_errno(), Some(libc::ENOENT));
        d.rmdir(ROOT, &name).unwrap();
        assert_eq!(d.in_flight(), 0);
        d.shutdown().unwrap();
    }
}

/// The closed loop at twice the queue size, under both queue-full policies: requests park when
/// the ring is full and every one completes once, with the data it asked for.
fn closed_loop_with_a_full_ring(ring: RingLayout) {
    use virtiofs_tools::{LoopConfig, QueueFullPolicy};
    let s = Setup::new(Profile { queue_size: 8, ..Profile::default() });
    for policy in QueueFullPolicy::ALL {
        let mut d =
            s.connect(DriverOptions { ring, queue_size: 8, queue_full: policy, ..Default::default() });
        d.init().unwrap();
        let (file, open) = d.create(ROOT, &format!("loop-{policy}"), 0o644, libc::O_RDWR as u32).unwrap();
        for b in 0..8u64 {
            d.write(file.nodeid, open.fh, b * 4096, &pattern(4096, b as u8)).unwrap();
        }
        let mut seen = vec![0u8; 1000];
        let r = d
            .run_closed_loop(
                &LoopConfig::new(16, 1000),
                |seq, spec| {
                    spec.opcode = opcode::READ;
                    spec.nodeid = file.nodeid;
                    let offset = (seq % 8) * 4096;
                    abi::ReadIn { fh: open.fh, offset, size: 4096, ..Default::default() }
                        .encode_into(&mut spec.args);
                    spec.out_data = 4096;
                },
                |c| {
                    assert_eq!((c.errno, c.payload_len), (0, 4096));
                    assert!(c.reply_data()? == pattern(4096, (c.seq % 8) as u8), "seq {}", c.seq);
                    seen[c.seq as usize] += 1;
                    Ok(())
                },
            )
            .unwrap();
        assert!(seen.iter().all(|&n| n == 1), "{policy}: every request completes exactly once");
        assert_eq!(r.completed, 1000);
        assert!(r.parked > 0, "{policy}: QD 16 on an 8-entry ring parks requests");
        match policy {
            QueueFullPolicy::Refill => assert_eq!(r.refills, r.parked),
            QueueFullPolicy::Retry1ms => assert!(r.retry_timer_fires > 0 && r.retried == r.parked, "{r:?}"),
        }
        d.release(file.nodeid, open.fh).unwrap();
        d.shutdown().unwrap();
    }
}

/// A packed ring is only used when the device offers it: a device whose profile turns packed
/// rings off refuses, by its feature bits, a driver that insists, and serves one that asks for
/// split rings.
#[test]
fn packed_ring_needs_the_feature() {
    use virtiofs_tools::virtio::features::RING_PACKED;
    let s = Setup::new(Profile { packed_ring: false, ..Profile::default() });
    let e = FsDriver::connect(&s.socket, DriverOptions { ring: RingLayout::Packed, ..Default::default() })
        .unwrap_err();
    assert!(matches!(e, DriverError::FeatureNotOffered { name: "VIRTIO_F_RING_PACKED", bit: 34 }), "{e:?}");
    let mut d = s.connect(DriverOptions::default());
    assert_eq!(d.facts().device_features & RING_PACKED, 0);
    init(&mut d);
    d.getattr(ROOT).unwrap();
    d.shutdown().unwrap();
    // The default profile offers packed rings; a split driver does not take them.
    let s = Setup::new(Profile::default());
    let d = s.connect(DriverOptions::default());
    assert_ne!(d.facts().device_features & RING_PACKED, 0);
    assert_eq!(d.facts().driver_features & RING_PACKED, 0);
    d.shutdown().unwrap();
    let d = s.connect(DriverOptions { ring: RingLayout::Packed, ..Default::default() });
    assert_ne!(d.facts().driver_features & RING_PACKED, 0);
    d.shutdown().unwrap();
}

on_both_layouts!(
    bring_up_reports_the_device,
    polling_completions,
    interrupt_completions,
    two_request_queues,
    one_poller_per_request_queue,
    ring_feature_variants,
    queue_depth_and_queue_full,
    symlink_link_and_errors,
    parked_poller_wakes_on_doorbell,
    many_requests_wrap_the_ring,
    closed_loop_with_a_full_ring,
);
