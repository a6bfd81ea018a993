//! The driver model's closed loop ([`FsDriver::run_closed_loop`]) against the in-process device:
//! both queue-full policies at twice the queue size, over one and two request queues, with every
//! reply's data checked, each request completing exactly once, warm-up and FUSE errors counted.
//! (Here rather than in the driver-model crate, which does not depend on the device.)

use std::path::Path;
use std::time::Duration;

use virtiofs_dpu::config::Profile;
use virtiofs_dpu::RunningDevice;
use virtiofs_tools::driver::{
    slot_pattern, DriverError, DriverOptions, FsDriver, IoSpec, LoopConfig, LoopReport, QueueFullPolicy,
    RETRY_DELAY,
};
use virtiofs_tools::fuse_abi::{self as abi, opcode};

const FILE: usize = 64 << 10;

fn file_byte(i: usize) -> u8 {
    (i as u8).wrapping_mul(13) ^ (i >> 8) as u8
}

/// A device with `queues` request queues of `size` entries, a driver on it, and a 64 KiB
/// file of known content: (device, driver, nodeid, fh).
fn setup(dir: &Path, size: u16, queues: u16, policy: QueueFullPolicy) -> (RunningDevice, FsDriver, u64, u64) {
    setup_with(dir, size, queues, policy, false)
}

/// [`setup`], the driver waiting for completions on its interrupts when `interrupts`.
fn setup_with(
    dir: &Path,
    size: u16,
    queues: u16,
    policy: QueueFullPolicy,
    interrupts: bool,
) -> (RunningDevice, FsDriver, u64, u64) {
    let sock = dir.join("dev.sock");
    let profile = Profile { queue_size: size, request_queues: queues, ..Default::default() };
    let dev = RunningDevice::start_with(
        &sock,
        profile,
        std::sync::Arc::new(virtiofs_dpu::FuseHandler::new(virtiofs_backend::RamFs::new())),
    )
    .unwrap();
    let opts = DriverOptions {
        queue_size: size,
        request_queues: queues,
        queue_full: policy,
        mem_size: 8 << 20,
        use_interrupts: interrupts,
        ..Default::default()
    };
    let mut d = FsDriver::connect(&sock, opts).unwrap();
    d.init().unwrap();
    let (e, o) = d.create(1, "f", 0o644, libc::O_RDWR as u32).unwrap();
    let content: Vec<u8> = (0..FILE).map(file_byte).collect();
    for off in (0..FILE).step_by(4096) {
        d.write(e.nodeid, o.fh, off as u64, &content[off..off + 4096]).unwrap();
    }
    (dev, d, e.nodeid, o.fh)
}

fn read_req(node: u64, fh: u64) -> impl FnMut(u64, &mut IoSpec) {
    move |seq, s| {
        s.opcode = opcode::READ;
        s.nodeid = node;
        let offset = (seq % (FILE as u64 / 4096)) * 4096;
        abi::ReadIn { fh, offset, size: 4096, ..Default::default() }.encode_into(&mut s.args);
        s.out_data = 4096;
    }
}

/// Runs `total` 4 KiB reads at `depth`, checking every reply's data, that each request
/// completes exactly once, and the latency bookkeeping; returns the report and the largest
/// time a request spent parked.
fn run_reads(d: &mut FsDriver, node: u64, fh: u64, depth: usize, total: u64) -> (LoopReport, Duration) {
    let mut seen = vec![0u8; total as usize];
    let mut uniques = std::collections::HashSet::new();
    let mut max_queued = Duration::ZERO;
    let mut cfg = LoopConfig::new(depth, total);
    cfg.warmup_ops = total / 10;
    let r = d
        .run_closed_loop(&cfg, read_req(node, fh), |c| {
            assert_eq!(c.errno, 0);
            assert_eq!(c.payload_len, 4096);
            let offset = (c.seq % (FILE as u64 / 4096)) as usize * 4096;
            let data = c.reply_data()?;
            assert!(data.iter().enumerate().all(|(i, &b)| b == file_byte(offset + i)), "seq {}", c.seq);
            seen[c.seq as usize] += 1;
            assert!(uniques.insert(c.unique), "unique {} completed twice", c.unique);
            assert!(c.latency >= c.queued, "latency {:?} < queued {:?}", c.latency, c.queued);
            if !c.parked {
                assert_eq!(c.queued, Duration::ZERO, "only parked requests wait to enter the ring");
            }
            assert_eq!(c.warmup, c.seq < total / 10);
            max_queued = max_queued.max(c.queued);
            Ok(())
        })
        .unwrap();
    assert!(seen.iter().all(|&n| n == 1), "every request completes exactly once");
    assert_eq!((r.issued, r.completed), (total, total));
    assert_eq!(r.measured, total - total / 10);
    assert_eq!(r.histogram.len(), r.measured);
    assert_eq!(r.per_queue.iter().sum::<u64>(), total);
    assert_eq!(d.in_flight(), 0);
    (r, max_queued)
}

#[test]
fn refill_at_twice_the_queue_never_waits_for_a_timer() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, mut d, node, fh) = setup(dir.path(), 8, 1, QueueFullPolicy::Refill);
    let (r, _) = run_reads(&mut d, node, fh, 16, 3000);
    assert!(r.parked > 0, "QD 16 on an 8-entry queue parks requests");
    assert_eq!(r.refills, r.parked, "every parked request went in from the completion path");
    assert_eq!((r.retry_timer_fires, r.retried), (0, 0), "refill never sleeps 1 ms");
    assert!(r.max_parked <= 8);
}

/// With `use_interrupts` an idle loop blocks on the queue's interrupt eventfd instead of
/// spinning: at QD=1 nearly every request is waited for that way, and at twice the queue size
/// (refill) nothing is lost either.
#[test]
fn with_interrupts_the_loop_waits_on_them() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, mut d, node, fh) = setup_with(dir.path(), 8, 1, QueueFullPolicy::Refill, true);
    let before = d.stats().interrupts;
    let (r, _) = run_reads(&mut d, node, fh, 1, 500);
    assert_eq!(r.completed, 500);
    let woken = d.stats().interrupts - before;
    assert!(woken > 0, "no interrupt was waited for");
    let (r, _) = run_reads(&mut d, node, fh, 16, 2000);
    assert!(r.parked > 0 && r.completed == 2000, "{r:?}");
}

#[test]
fn retry_1ms_parks_requests_for_a_millisecond() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, mut d, node, fh) = setup(dir.path(), 8, 1, QueueFullPolicy::Retry1ms);
    let (r, max_queued) = run_reads(&mut d, node, fh, 16, 3000);
    assert!(r.parked > 0);
    assert!(r.retry_timer_fires > 0 && r.retried > 0, "{r:?}");
    assert_eq!(r.refills, 0);
    assert_eq!(r.retried, r.parked, "parked requests go in only when the timer fires");
    // The first request parked behind an armed timer waits the whole millisecond at least.
    assert!(max_queued >= RETRY_DELAY, "longest park {max_queued:?}");
    assert!(r.histogram.max() >= RETRY_DELAY.as_nanos() as u64);
}

#[test]
fn both_policies_over_two_queues_lose_nothing() {
    for policy in QueueFullPolicy::ALL {
        let dir = tempfile::tempdir().unwrap();
        let (_dev, mut d, node, fh) = setup(dir.path(), 8, 2, policy);
        let (r, _) = run_reads(&mut d, node, fh, 32, 2000);
        assert_eq!(r.per_queue, vec![1000, 1000], "{policy}: round robin over the request queues");
        assert!(r.parked > 0, "{policy}");
        // Writes carry their payload from the slot's data buffer.
        let mut cfg = LoopConfig::new(32, 500);
        cfg.max_data = 8192;
        let w = d
            .run_closed_loop(
                &cfg,
                |seq, s| {
                    s.opcode = opcode::WRITE;
                    s.nodeid = node;
                    let offset = (seq % 8) * 8192;
                    abi::WriteIn { fh, offset, size: 8192, ..Default::default() }.encode_into(&mut s.args);
                    s.in_data = 8192;
                    s.out_args = abi::WriteOut::SIZE;
                },
                |c| {
                    let out = abi::WriteOut::decode(&c.reply_args()?).unwrap();
                    assert_eq!((c.errno, out.size), (0, 8192));
                    Ok(())
                },
            )
            .unwrap();
        assert_eq!((w.completed, w.measured_bytes), (500, 500 * 8192));
        // The file now holds slot patterns where it was written.
        let got = d.read(node, fh, 0, 8192).unwrap();
        assert!((0..cfg.depth).any(|slot| (0..8192).all(|i| got[i] == slot_pattern(slot, i))));
    }
}

#[test]
fn warm_up_and_errors_are_accounted() {
    let dir = tempfile::tempdir().unwrap();
    let (_dev, mut d, node, _) = setup(dir.path(), 8, 1, QueueFullPolicy::Refill);
    // READ with a bad handle: FUSE errors complete normally and are counted.
    let mut cfg = LoopConfig::new(4, 100);
    cfg.warmup_ops = 40;
    let mut warm = 0;
    let r = d
        .run_closed_loop(&cfg, read_req(node, 999_999), |c| {
            assert_eq!((c.errno, c.payload_len), (libc::EBADF, 0));
            warm += u32::from(c.warmup);
            Ok(())
        })
        .unwrap();
    assert_eq!((r.fuse_errors, r.measured, warm), (100, 60, 40));
    assert_eq!(r.measured_bytes, 60 * 4096);
    assert!(r.iops() > 0.0 && r.measured_time > Duration::ZERO);
    // An error from on_complete ends the run.
    let e = d
        .run_closed_loop(&LoopConfig::new(1, 5), read_req(node, 999_999), |_| {
            Err(DriverError::Unsupported("stop".into()))
        })
        .unwrap_err();
    assert!(matches!(e, DriverError::Unsupported(_)));
}
