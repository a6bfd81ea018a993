//! Closed-loop load: keep `depth` requests outstanding, as fio's `iodepth` does over the Linux
//! virtio-fs driver, and account each request's latency from the moment the application issued
//! it, time spent parked on a full virtqueue included.
//!
//! Every outstanding request owns a slot whose guest buffers are allocated once for the whole
//! run (like the user pages fio hands the kernel for O_DIRECT), so a request costs the ring
//! protocol and the device, not the driver model's allocator. Each request is laid out as
//! [`FsDriver::submit`] lays it out (Linux `virtio_fs_enqueue_req`): in header | in args | data
//! pages; out header | out args | data pages, in one indirect descriptor when negotiated. Request
//! `seq` goes to request queue `1 + seq % N` (Linux spreads by submitting CPU).
//!
//! One loop iteration, the way the Linux paths interleave:
//!
//! 1. **Completion path**: reap every request queue; with [`QueueFullPolicy::Refill`], submit
//!    that queue's parked requests (FIFO) into the descriptors just freed.
//! 2. **Delayed work** ([`QueueFullPolicy::Retry1ms`]): a queue whose 1 ms timer expired
//!    submits parked requests in order until the ring is full again, then re-arms the timer; the
//!    request that did not fit goes to the back of the list.
//! 3. **Application**: issue new requests until `depth` are outstanding (a request that finds
//!    the ring full is parked; under `Refill` it also queues behind parked ones).
//!
//! Replies are checked (out header length = used length, `unique` matches, a negative errno
//! without payload), and every slot's state is tracked, so a lost, duplicated or foreign
//! completion is an error rather than a skewed figure. Reply buffers are not poisoned (fio's are
//! not either), unlike the one-request calls.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::error::{device, DriverError, Result};
use super::options::{QueueFullPolicy, RETRY_DELAY};
use super::state::{FsDriver, PAGE_SIZE};
use crate::fuse_abi::{InHeader, OutHeader};
use crate::memory::{DmaBuf, GuestRam};
use crate::virtqueue::{QueueError, Segment};

/// Bytes of a slot's header block: in header + in args from 0, out header + out args from
/// [`OUT_OFF`].
const HDR_BLOCK: usize = 4096;
const OUT_OFF: u64 = 2048;
/// Largest in-arguments of a loop request.
pub const MAX_IN_ARGS: usize = OUT_OFF as usize - InHeader::SIZE;
/// Largest out-arguments of a loop request.
pub const MAX_OUT_ARGS: usize = HDR_BLOCK - OUT_OFF as usize - OutHeader::SIZE;
/// Highest latency the histograms hold (100 s); longer ones are recorded as this.
const HIST_MAX_NS: u64 = 100_000_000_000;

/// Shape of a closed-loop run.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// Requests kept outstanding (issued and not completed, parked ones included).
    pub depth: usize,
    /// Requests to issue in all, warm-up included (`u64::MAX`: until `duration` ends).
    pub total: u64,
    /// Stop issuing this long after the measured part started (`None`: after `total`).
    pub duration: Option<Duration>,
    /// The first requests issued are warm-up: not recorded, not counted in the rates.
    pub warmup_ops: u64,
    /// Requests issued within this time of the start are warm-up too.
    pub warmup: Duration,
    /// Largest `in_data` or `out_data` of any request (size of each slot's data buffer).
    pub max_data: usize,
}

impl LoopConfig {
    /// `total` requests with `depth` outstanding and no warm-up; data up to one page.
    pub fn new(depth: usize, total: u64) -> Self {
        LoopConfig {
            depth,
            total,
            duration: None,
            warmup_ops: 0,
            warmup: Duration::ZERO,
            max_data: PAGE_SIZE,
        }
    }
}

/// One request, as the application asks for it. The loop clears `args` and zeroes the sizes
/// before each call of `make_request`.
#[derive(Debug, Clone, Default)]
pub struct IoSpec {
    /// FUSE opcode.
    pub opcode: u32,
    /// Target node.
    pub nodeid: u64,
    /// In-arguments (one buffer, at most [`MAX_IN_ARGS`](crate::driver::MAX_IN_ARGS) bytes), e.g. a `fuse_read_in`.
    pub args: Vec<u8>,
    /// Bytes of the slot's data buffer sent to the device (a WRITE payload). The buffer is
    /// filled with a fixed pattern once; see [`slot_pattern`](crate::driver::slot_pattern).
    pub in_data: usize,
    /// Reply arguments expected after the out header (at most [`MAX_OUT_ARGS`](crate::driver::MAX_OUT_ARGS)).
    pub out_args: usize,
    /// Reply data room, in the slot's data buffer (a READ). At most one of `in_data` and
    /// `out_data` may be non-zero.
    pub out_data: usize,
}

/// The pattern a slot's data buffer holds: byte `i` of slot `slot`.
pub fn slot_pattern(slot: usize, i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(slot as u8) ^ ((i >> 12) as u8)
}

/// A completed request, as `on_complete` sees it.
#[derive(Debug)]
pub struct IoDone<'a> {
    /// Issue order (0-based).
    pub seq: u64,
    /// FUSE unique of the request.
    pub unique: u64,
    /// Request queue it ran on.
    pub queue: u16,
    /// Opcode.
    pub opcode: u32,
    /// Positive errno from the FUSE reply, 0 on success.
    pub errno: i32,
    /// Reply bytes after the out header.
    pub payload_len: usize,
    /// From issue to the moment the completion was reaped.
    pub latency: Duration,
    /// From issue to the moment a parked request went into the ring (zero if it never found
    /// the ring full).
    pub queued: Duration,
    /// Whether it found the ring full at least once.
    pub parked: bool,
    /// Whether it belongs to the warm-up (not recorded).
    pub warmup: bool,
    mem: &'a GuestRam,
    out_args_at: u64,
    out_args: usize,
    data_at: u64,
}

impl IoDone<'_> {
    /// The reply arguments (the part of the payload before the data pages).
    pub fn reply_args(&self) -> Result<Vec<u8>> {
        Ok(self.mem.read_vec(self.out_args_at, self.payload_len.min(self.out_args))?)
    }

    /// The reply data (the payload after the reply arguments), e.g. what a READ returned.
    pub fn reply_data(&self) -> Result<Vec<u8>> {
        Ok(self.mem.read_vec(self.data_at, self.payload_len.saturating_sub(self.out_args))?)
    }
}

/// What a closed-loop run did.
#[derive(Debug, Clone)]
pub struct LoopReport {
    /// Latency of the measured (non-warm-up) requests, in nanoseconds.
    pub histogram: Histogram<u64>,
    /// Requests issued.
    pub issued: u64,
    /// Requests completed (= issued).
    pub completed: u64,
    /// Completed requests outside the warm-up.
    pub measured: u64,
    /// From the first measured issue to the last measured completion.
    pub measured_time: Duration,
    /// Payload bytes (`in_data` + `out_data` asked for) of the measured requests.
    pub measured_bytes: u64,
    /// Requests that found their ring full.
    pub parked: u64,
    /// Most requests parked at once.
    pub max_parked: usize,
    /// Parked requests submitted from the completion path (refill).
    pub refills: u64,
    /// 1 ms retry timers that expired (retry-1ms).
    pub retry_timer_fires: u64,
    /// Parked requests submitted by an expired timer.
    pub retried: u64,
    /// Requests answered with a FUSE error.
    pub fuse_errors: u64,
    /// Completions per request queue (index 0 = queue 1).
    pub per_queue: Vec<u64>,
}

impl LoopReport {
    /// Measured requests per second.
    pub fn iops(&self) -> f64 {
        let s = self.measured_time.as_secs_f64();
        if s > 0.0 {
            self.measured as f64 / s
        } else {
            0.0
        }
    }

    /// Measured payload bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        let s = self.measured_time.as_secs_f64();
        if s > 0.0 {
            self.measured_bytes as f64 / s
        } else {
            0.0
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    Parked,
    InFlight,
}

#[derive(Debug)]
struct Slot {
    hdr: DmaBuf,
    data: DmaBuf,
    segs: Vec<Segment>,
    state: SlotState,
    seq: u64,
    unique: u64,
    queue: u16,
    opcode: u32,
    out_args: usize,
    bytes: u64,
    issued: Instant,
    queued: Duration,
    parked: bool,
    warmup: bool,
}

#[derive(Debug, Default)]
struct Backlog {
    parked: VecDeque<usize>,
    timer: Option<Instant>,
}

/// The state of one closed loop ([`FsDriver::run_closed_loop`]).
struct LoopRun {
    // What the loop was asked for.
    depth: usize,
    total: u64,
    duration: Option<Duration>,
    warmup_ops: u64,
    warm_until: Instant,
    policy: QueueFullPolicy,
    nreq: u16,
    max_data: usize,
    // Its requests.
    slots: Vec<Slot>,
    free: Vec<usize>,
    backlog: Vec<Backlog>,
    outstanding: usize,
    parked_now: usize,
    timers_armed: usize,
    issuing: bool,
    // Its measurements.
    hist: Histogram<u64>,
    r: LoopReport,
    measure_start: Option<Instant>,
    issue_until: Option<Instant>,
    last_done: Instant,
    // Scratch space kept between requests.
    spec: IoSpec,
    scratch: Vec<u8>,
}

impl LoopRun {
    fn new(
        cfg: &LoopConfig,
        policy: QueueFullPolicy,
        nreq: u16,
        max_data: usize,
        slots: Vec<Slot>,
    ) -> Result<Self> {
        let hist = Histogram::<u64>::new_with_bounds(1, HIST_MAX_NS, 3)
            .map_err(|e| DriverError::Unsupported(format!("histogram: {e}")))?;
        let r = LoopReport {
            histogram: hist.clone(),
            issued: 0,
            completed: 0,
            measured: 0,
            measured_time: Duration::ZERO,
            measured_bytes: 0,
            parked: 0,
            max_parked: 0,
            refills: 0,
            retry_timer_fires: 0,
            retried: 0,
            fuse_errors: 0,
            per_queue: vec![0; usize::from(nreq)],
        };
        let start = Instant::now();
        Ok(LoopRun {
            depth: cfg.depth,
            total: cfg.total,
            duration: cfg.duration,
            warmup_ops: cfg.warmup_ops,
            warm_until: start + cfg.warmup,
            policy,
            nreq,
            max_data,
            free: (0..cfg.depth).rev().collect(),
            slots,
            backlog: (0..=nreq).map(|_| Backlog::default()).collect(),
            outstanding: 0,
            parked_now: 0,
            timers_armed: 0,
            issuing: cfg.total > 0,
            hist,
            r,
            measure_start: None,
            issue_until: None,
            last_done: start,
            spec: IoSpec::default(),
            scratch: Vec::with_capacity(HDR_BLOCK),
        })
    }
}

impl FsDriver {
    /// Runs a closed loop: issues `cfg.total` requests (or for `cfg.duration`) keeping
    /// `cfg.depth` outstanding over the request queues in use. `make_request(seq, spec)` fills in
    /// request `seq`; `on_complete` sees each completion (an `Err` from it ends the run). A
    /// request that finds its ring full is handled per [`super::DriverOptions::queue_full`].
    ///
    /// Needs the driver idle (nothing in flight); FUSE errors are counted and passed on, not
    /// treated as failures. Completions are found by polling the used rings (fio's polled I/O);
    /// with [`super::DriverOptions::use_interrupts`] a loop that has requests in flight, nothing
    /// to reap and no retry timer armed blocks on the queues' interrupt eventfds instead of
    /// spinning (interrupts re-armed and the rings looked at again first, as Linux's
    /// `virtqueue_enable_cb` and `virtqueue_poll`). On error the slots' guest buffers are not
    /// reclaimed.
    pub fn run_closed_loop<M, C>(
        &mut self,
        cfg: &LoopConfig,
        mut make_request: M,
        mut on_complete: C,
    ) -> Result<LoopReport>
    where
        M: FnMut(u64, &mut IoSpec),
        C: FnMut(&IoDone<'_>) -> Result<()>,
    {
        if cfg.depth == 0 {
            return Err(DriverError::Unsupported("closed loop of depth 0".into()));
        }
        if !self.pending.is_empty() || self.queues.iter().any(|q| q.vq.in_flight() > 0) {
            return Err(DriverError::Unsupported("closed loop with requests already in flight".into()));
        }
        let nreq = self.request_queues();
        let max_data = cfg.max_data.div_ceil(PAGE_SIZE).max(1) * PAGE_SIZE;
        let slots = self.loop_slots(cfg.depth, max_data)?;
        let mut run = LoopRun::new(cfg, self.opts.queue_full, nreq, max_data, slots)?;
        let mut last_progress = Instant::now();
        let mut idle_spins = 0u64;

        loop {
            let mut progress = false;
            // 1. Completion path.
            for q in 1..=nreq {
                progress |= self.reap_queue(&mut run, q, &mut on_complete)?;
            }
            // 2. Delayed work of retry-1ms.
            if run.timers_armed > 0 {
                progress |= self.fire_retry_timers(&mut run)?;
            }
            // 3. The application keeps `depth` requests outstanding.
            progress |= self.issue(&mut run, &mut make_request)?;
            if !run.issuing && run.outstanding == 0 {
                break;
            }
            if progress {
                idle_spins = 0;
            } else {
                // Look at the clock only now and then: the poll loop stays a load of the used index.
                idle_spins += 1;
                if idle_spins == 1 {
                    last_progress = Instant::now();
                } else if idle_spins.is_multiple_of(4096) && last_progress.elapsed() > self.opts.timeout {
                    return Err(self.stuck(run.outstanding, run.parked_now));
                }
                if self.opts.use_interrupts && run.outstanding > 0 && run.timers_armed == 0 {
                    if last_progress.elapsed() > self.opts.timeout {
                        return Err(self.stuck(run.outstanding, run.parked_now));
                    }
                    self.wait_step(last_progress + self.opts.timeout)?;
                } else {
                    std::hint::spin_loop();
                }
            }
        }

        let LoopRun { mut r, hist, slots, measure_start, last_done, .. } = run;
        if let Some(ms) = measure_start {
            r.measured_time = last_done.saturating_duration_since(ms);
        }
        r.histogram = hist;
        for s in slots {
            self.mem.free(s.hdr);
            self.mem.free(s.data);
        }
        Ok(r)
    }

    /// The `depth` slots of a closed loop: a header block and `max_data` bytes of data each,
    /// the data filled with the slot's pattern.
    fn loop_slots(&mut self, depth: usize, max_data: usize) -> Result<Vec<Slot>> {
        let now = Instant::now();
        let mut slots = Vec::with_capacity(depth);
        for i in 0..depth {
            let hdr = self.mem.alloc_zeroed(HDR_BLOCK, PAGE_SIZE)?;
            let data = self.mem.alloc(max_data, PAGE_SIZE)?;
            let pattern: Vec<u8> = (0..max_data).map(|b| slot_pattern(i, b)).collect();
            self.mem.write(data.iova, &pattern)?;
            slots.push(Slot {
                hdr,
                data,
                segs: Vec::new(),
                state: SlotState::Free,
                seq: 0,
                unique: 0,
                queue: 1,
                opcode: 0,
                out_args: 0,
                bytes: 0,
                issued: now,
                queued: Duration::ZERO,
                parked: false,
                warmup: true,
            });
        }
        Ok(slots)
    }

    /// Reaps what queue `q` completed (each checked, counted and handed to `on_complete`), then,
    /// with [`QueueFullPolicy::Refill`], submits the requests parked on it while there is room;
    /// returns whether anything completed.
    #[inline]
    fn reap_queue<C>(&mut self, run: &mut LoopRun, q: u16, on_complete: &mut C) -> Result<bool>
    where
        C: FnMut(&IoDone<'_>) -> Result<()>,
    {
        let mut reaped_at: Option<Instant> = None;
        let mut freed = false;
        while let Some(u) = self.queues[usize::from(q)].vq.pop_used(&self.mem)? {
            let t = *reaped_at.get_or_insert_with(Instant::now);
            let idx = usize::try_from(u.token).unwrap_or(usize::MAX);
            let s = run
                .slots
                .get_mut(idx)
                .filter(|s| s.state == SlotState::InFlight && s.queue == q)
                .ok_or_else(|| {
                    device(format!("queue {q}: completion of token {} that is not in flight", u.token))
                })?;
            let mut h = [0u8; OutHeader::SIZE];
            let (errno, payload_len) = if (u.len as usize) < OutHeader::SIZE {
                (0, usize::MAX)
            } else {
                self.mem.read(s.hdr.iova + OUT_OFF, &mut h)?;
                let h = OutHeader::decode(&h).expect("16 bytes");
                check_reply(&h, u.len, s.unique, s.opcode)?;
                (-h.error, u.len as usize - OutHeader::SIZE)
            };
            if payload_len == usize::MAX {
                return Err(DriverError::BadReply {
                    opcode: s.opcode,
                    reason: format!("used length {} shorter than fuse_out_header", u.len),
                });
            }
            let r = &mut run.r;
            let latency = t.saturating_duration_since(s.issued);
            if !s.warmup {
                run.hist.saturating_record((latency.as_nanos() as u64).clamp(1, HIST_MAX_NS));
                r.measured += 1;
                r.measured_bytes += s.bytes;
                run.last_done = t;
            }
            if errno != 0 {
                r.fuse_errors += 1;
            }
            s.state = SlotState::Free;
            let done = IoDone {
                seq: s.seq,
                unique: s.unique,
                queue: q,
                opcode: s.opcode,
                errno,
                payload_len,
                latency,
                queued: s.queued,
                parked: s.parked,
                warmup: s.warmup,
                mem: &self.mem,
                out_args_at: s.hdr.iova + OUT_OFF + OutHeader::SIZE as u64,
                out_args: s.out_args,
                data_at: s.data.iova,
            };
            on_complete(&done)?;
            run.free.push(idx);
            run.outstanding -= 1;
            r.completed += 1;
            r.per_queue[usize::from(q - 1)] += 1;
            self.stats.completed += 1;
            self.completed_per_queue[usize::from(q)] += 1;
            freed = true;
        }
        if freed && run.policy == QueueFullPolicy::Refill {
            let b = &mut run.backlog[usize::from(q)];
            while let Some(&idx) = b.parked.front() {
                if !self.ring_submit(&mut run.slots[idx], idx)? {
                    break;
                }
                b.parked.pop_front();
                run.parked_now -= 1;
                run.r.refills += 1;
            }
        }
        Ok(freed)
    }

    /// [`QueueFullPolicy::Retry1ms`]: submits the requests parked on each queue whose timer
    /// ran out, arming it again if the ring is still full; returns whether a timer fired.
    fn fire_retry_timers(&mut self, run: &mut LoopRun) -> Result<bool> {
        let now = Instant::now();
        let mut fired = false;
        for b in run.backlog.iter_mut() {
            if b.timer.is_none_or(|t| t > now) {
                continue;
            }
            b.timer = None;
            run.timers_armed -= 1;
            run.r.retry_timer_fires += 1;
            fired = true;
            while let Some(idx) = b.parked.pop_front() {
                if self.ring_submit(&mut run.slots[idx], idx)? {
                    run.parked_now -= 1;
                    run.r.retried += 1;
                } else {
                    b.parked.push_back(idx);
                    b.timer = Some(now + RETRY_DELAY);
                    run.timers_armed += 1;
                    break;
                }
            }
        }
        Ok(fired)
    }

    /// Issues requests until `depth` are outstanding (or the run's count or time is up):
    /// each made by `make_request`, put on the next request queue in turn, or parked there
    /// when its ring is full (or, with [`QueueFullPolicy::Refill`], when requests wait before
    /// it); returns whether it issued any.
    #[inline]
    fn issue<M>(&mut self, run: &mut LoopRun, make_request: &mut M) -> Result<bool>
    where
        M: FnMut(u64, &mut IoSpec),
    {
        let mut issued = false;
        while run.issuing && run.outstanding < run.depth {
            let now = Instant::now();
            if run.measure_start.is_none() && run.r.issued >= run.warmup_ops && now >= run.warm_until {
                run.measure_start = Some(now);
                run.issue_until = run.duration.map(|d| now + d);
            }
            if run.r.issued >= run.total || run.issue_until.is_some_and(|u| now >= u) {
                run.issuing = false;
                break;
            }
            let idx = run.free.pop().expect("a free slot per outstanding request");
            let seq = run.r.issued;
            let spec = &mut run.spec;
            spec.args.clear();
            spec.in_data = 0;
            spec.out_args = 0;
            spec.out_data = 0;
            make_request(seq, spec);
            let q = 1 + (seq % u64::from(run.nreq)) as u16;
            let unique = self.alloc_unique();
            let s = &mut run.slots[idx];
            self.prepare_slot(s, &run.spec, unique, run.max_data, &mut run.scratch)?;
            s.seq = seq;
            s.queue = q;
            s.issued = now;
            s.parked = false;
            s.warmup = run.measure_start.is_none();
            run.r.issued += 1;
            run.outstanding += 1;
            issued = true;
            let b = &mut run.backlog[usize::from(q)];
            let behind = run.policy == QueueFullPolicy::Refill && !b.parked.is_empty();
            if behind || !self.ring_submit(s, idx)? {
                s.state = SlotState::Parked;
                s.parked = true;
                b.parked.push_back(idx);
                run.parked_now += 1;
                run.r.parked += 1;
                run.r.max_parked = run.r.max_parked.max(run.parked_now);
                if run.policy == QueueFullPolicy::Retry1ms && b.timer.is_none() {
                    b.timer = Some(now + RETRY_DELAY);
                    run.timers_armed += 1;
                }
            }
        }
        Ok(issued)
    }

    /// Writes the request into slot `s` (header and arguments; data stays in place) and lays
    /// out its segments.
    fn prepare_slot(
        &self,
        s: &mut Slot,
        spec: &IoSpec,
        unique: u64,
        max_data: usize,
        scratch: &mut Vec<u8>,
    ) -> Result<()> {
        if spec.args.len() > MAX_IN_ARGS
            || spec.out_args > MAX_OUT_ARGS
            || spec.in_data.max(spec.out_data) > max_data
            || (spec.in_data > 0 && spec.out_data > 0)
        {
            return Err(DriverError::Unsupported(format!(
                "loop request with {} B args, {} B in data, {} B out args, {} B out data (slot: {max_data} B data)",
                spec.args.len(),
                spec.in_data,
                spec.out_args,
                spec.out_data
            )));
        }
        let total = InHeader::SIZE + spec.args.len() + spec.in_data;
        scratch.clear();
        self.in_header(spec.opcode, unique, spec.nodeid, total).encode_into(scratch);
        scratch.extend_from_slice(&spec.args);
        self.mem.write(s.hdr.iova, scratch)?;
        let segs = &mut s.segs;
        segs.clear();
        segs.push(Segment { addr: s.hdr.iova, len: InHeader::SIZE as u32, write: false });
        if !spec.args.is_empty() {
            let at = s.hdr.iova + InHeader::SIZE as u64;
            segs.push(Segment { addr: at, len: spec.args.len() as u32, write: false });
        }
        let pages = |segs: &mut Vec<Segment>, len: usize, write: bool| {
            let mut off = 0;
            while off < len {
                let n = (len - off).min(PAGE_SIZE);
                segs.push(Segment { addr: s.data.iova + off as u64, len: n as u32, write });
                off += n;
            }
        };
        pages(segs, spec.in_data, false);
        segs.push(Segment { addr: s.hdr.iova + OUT_OFF, len: OutHeader::SIZE as u32, write: true });
        if spec.out_args > 0 {
            let at = s.hdr.iova + OUT_OFF + OutHeader::SIZE as u64;
            segs.push(Segment { addr: at, len: spec.out_args as u32, write: true });
        }
        pages(segs, spec.out_data, true);
        s.unique = unique;
        s.opcode = spec.opcode;
        s.out_args = spec.out_args;
        s.bytes = (spec.in_data + spec.out_data) as u64;
        s.queued = Duration::ZERO;
        Ok(())
    }

    /// Puts slot `s` (index `idx`) into its ring and rings the doorbell if the device wants it.
    /// Returns false, leaving the slot untouched, when the ring is full.
    fn ring_submit(&mut self, s: &mut Slot, idx: usize) -> Result<bool> {
        let qs = &mut self.queues[usize::from(s.queue)];
        match qs.vq.add_chain(&self.mem, &s.segs, idx as u64) {
            Ok(_) => {}
            Err(QueueError::Full { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        s.state = SlotState::InFlight;
        if s.parked {
            s.queued = s.issued.elapsed();
        }
        self.stats.submitted += 1;
        if qs.vq.kick_prepare(&self.mem)? {
            let addr = qs.notify_addr;
            self.transport.notify(s.queue, addr)?;
        } else {
            self.stats.notifies_suppressed += 1;
        }
        Ok(true)
    }

    fn stuck(&self, outstanding: usize, parked: usize) -> DriverError {
        DriverError::Timeout(format!(
            "closed loop made no progress for {:?} ({outstanding} outstanding, {parked} parked); {}",
            self.opts.timeout,
            self.describe_queues(1, false)
        ))
    }
}

fn check_reply(h: &OutHeader, used: u32, unique: u64, opcode: u32) -> Result<()> {
    let bad = |reason: String| Err(DriverError::BadReply { opcode, reason });
    super::io::verify_response(opcode, used, &h.to_bytes(), unique)?;
    if h.error > 0 || h.error < -4095 {
        return bad(format!("error {} is not a negative errno", h.error));
    }
    if h.error != 0 && h.len as usize != OutHeader::SIZE {
        return bad(format!("error {} with {} payload bytes", h.error, h.len as usize - OutHeader::SIZE));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    // The closed-loop tests that run against a device are in the root crate's
    // tests/closed_loop.rs: this crate does not depend on the device.
    use super::*;

    #[test]
    fn policy_names_round_trip() {
        for p in QueueFullPolicy::ALL {
            assert_eq!(p.name().parse::<QueueFullPolicy>().unwrap(), p);
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{p}\""));
        }
        assert!("retry".parse::<QueueFullPolicy>().is_err());
        assert_eq!(QueueFullPolicy::default(), QueueFullPolicy::Refill);
    }
}
