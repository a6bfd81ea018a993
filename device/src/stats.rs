//! Device statistics: counters and latency histograms kept where the work happens, read as data
//! ([`DeviceStats`]).
//!
//! Each poller writes only its own block of counters: its busy and idle time, its rounds and
//! parks, per operation class (see [`OpClass`]: the request handler names the class, the device
//! knows nothing of FUSE) the requests, errors, bytes and a latency [`Histogram`], the errors by
//! errno, and per queue it serves the requests, bytes read and written, errors, bad chains,
//! interrupts, requests pending in its engine and requests waiting on an outside event. Every
//! block (and every queue's and class's counters in it) sits on cache lines of its own
//! (`CachePadded`), so the pollers share no line for statistics; each counter has one writer,
//! which updates it with a plain load and store (no locked read-modify-write, no lock, no
//! allocation). Doorbells that reach the control plane through the socket are counted by the
//! control plane, in a block of its own, beside the client's state (connected, driver status,
//! negotiated features) that it publishes the same way; doorbells that land in the shared notify
//! page (`doorbells = "shared"`) reach nobody and are not counted.
//!
//! Latency is measured device-side, from the poll round that took a chain to the publication of
//! its used entry, with the CPU's cycle counter (`quanta`: the TSC, calibrated once against the
//! monotonic clock): one read when a queue has work, one after the round's used index is
//! published, shared by every request of that batch; an engine's request is timed from the round
//! that took it to the round that completes it. A profile with `latency_histograms = false` reads
//! no clock for it.
//!
//! [`DeviceCounters::snapshot`] reads every counter (relaxed loads: each value is exact, the set
//! is not one instant) into a [`DeviceStats`], which is `Serialize` + `Deserialize`: what the
//! daemon writes as JSON and serves on its control socket. Histograms are mergeable
//! ([`Histogram::merge`]) and snapshots subtract ([`DeviceStats::since`]): a reset is a baseline
//! kept by the reader, never a write into a poller's counters. Modelled on Firecracker's
//! per-device metrics, with the counters per poller instead of shared atomics.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use serde::{Deserialize, Serialize};

use crate::config::{Placement, Profile};

/// What kind of operation a request is, as the request handler classifies it (the device keeps
/// a latency histogram and counters per class and knows nothing else of the protocol).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpClass {
    /// Reads of file data.
    Read,
    /// Writes of file data.
    Write,
    /// Name and attribute operations (lookup, getattr, create, readdir, ...).
    Metadata,
    /// Everything else (session, locks, sync, a request the handler could not read).
    #[default]
    Other,
}

impl OpClass {
    /// Every class, in index order.
    pub const ALL: [OpClass; 4] = [OpClass::Read, OpClass::Write, OpClass::Metadata, OpClass::Other];

    /// Its index in [`Self::ALL`].
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name, as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            OpClass::Read => "read",
            OpClass::Write => "write",
            OpClass::Metadata => "metadata",
            OpClass::Other => "other",
        }
    }
}

/// What a request handler reports of a request, for the statistics: its class, the errno it
/// failed with (0: it succeeded) and the bytes of file data it moved (read or written, by class).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// The operation's class.
    pub class: OpClass,
    /// The errno it was answered with, 0 for success.
    pub errno: u16,
    /// File data read (class read) or written (class write), in bytes.
    pub bytes: u32,
}

/// Linear buckets of the latency histogram: one per nanosecond below this.
const LINEAR: usize = 32;
/// Sub-buckets per power of two above it (4 bits: every bucket within 1/16 of its value).
const SUB_BITS: u32 = 4;
/// Powers of two covered above the linear part: up to 2^40 ns (18 minutes); longer lands in
/// the last bucket.
const GROUPS: usize = 40 - 5;
/// Buckets of a latency histogram.
pub const BUCKETS: usize = LINEAR + GROUPS * (1 << SUB_BITS);

/// The bucket of a latency of `ns` nanoseconds (log-linear, as HdrHistogram's).
#[inline]
pub fn bucket_of(ns: u64) -> usize {
    if ns < LINEAR as u64 {
        return ns as usize;
    }
    let e = 63 - ns.leading_zeros(); // >= 5
    if e >= 40 {
        return BUCKETS - 1;
    }
    let sub = ((ns >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1)) as usize;
    LINEAR + (e as usize - 5) * (1 << SUB_BITS) + sub
}

/// The smallest latency bucket `i` holds, in nanoseconds.
pub fn bucket_low(i: usize) -> u64 {
    if i < LINEAR {
        return i as u64;
    }
    let (g, s) = ((i - LINEAR) >> SUB_BITS, (i - LINEAR) & ((1 << SUB_BITS) - 1));
    let e = g as u32 + 5;
    (1u64 << e) + ((s as u64) << (e - SUB_BITS))
}

/// The first latency past bucket `i`, in nanoseconds (`u64::MAX` for the last bucket).
pub fn bucket_high(i: usize) -> u64 {
    if i + 1 >= BUCKETS {
        u64::MAX
    } else {
        bucket_low(i + 1)
    }
}

/// One bucket of a [`Histogram`]: requests whose latency was in `[low_ns, high_ns)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// Smallest latency in the bucket, in nanoseconds.
    pub low_ns: u64,
    /// First latency past it, in nanoseconds.
    pub high_ns: u64,
    /// Requests in it.
    pub count: u64,
}

/// Percentiles of a [`Histogram`], each the upper end of the bucket holding it (capped by the
/// largest latency seen): within 1/16 of the true value, never below it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    /// Median, in nanoseconds.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest latency (after a reset: to the precision of its bucket).
    pub max_ns: u64,
    /// Mean latency.
    pub mean_ns: u64,
}

/// A latency histogram, as read: the non-empty buckets in increasing order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    /// Requests timed.
    pub count: u64,
    /// Sum of their latencies, in nanoseconds.
    pub sum_ns: u64,
    /// Largest latency, in nanoseconds.
    pub max_ns: u64,
    /// Non-empty buckets, by increasing latency.
    pub buckets: Vec<Bucket>,
}

impl Histogram {
    /// Bucket counts by index.
    fn dense(&self) -> Vec<u64> {
        let mut d = vec![0u64; BUCKETS];
        for b in &self.buckets {
            d[bucket_of(b.low_ns)] += b.count;
        }
        d
    }

    fn from_dense(d: &[u64], sum_ns: u64, max_ns: u64) -> Self {
        let buckets: Vec<Bucket> = d
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &count)| Bucket { low_ns: bucket_low(i), high_ns: bucket_high(i), count })
            .collect();
        Histogram { count: d.iter().sum(), sum_ns, max_ns, buckets }
    }

    /// Adds `other`'s requests to this one (every histogram has the same buckets).
    pub fn merge(&mut self, other: &Histogram) {
        let mut d = self.dense();
        for (a, b) in d.iter_mut().zip(other.dense()) {
            *a += b;
        }
        *self = Self::from_dense(&d, self.sum_ns + other.sum_ns, self.max_ns.max(other.max_ns));
    }

    /// The requests timed since `base` was read (an earlier read of the same counters). The
    /// largest latency is the one seen if its bucket gained requests, else the top of the
    /// highest bucket that did.
    pub fn since(&self, base: &Histogram) -> Histogram {
        let mut d = self.dense();
        for (a, b) in d.iter_mut().zip(base.dense()) {
            *a = a.saturating_sub(b);
        }
        let top = d.iter().rposition(|&c| c > 0);
        let max_ns = match top {
            None => 0,
            Some(i) if bucket_of(self.max_ns) == i => self.max_ns,
            Some(i) => bucket_high(i).saturating_sub(1),
        };
        Self::from_dense(&d, self.sum_ns.saturating_sub(base.sum_ns), max_ns)
    }

    /// The latency at quantile `q` (0..=1): the upper end of the bucket holding it, capped by
    /// the largest latency seen; 0 if empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for b in &self.buckets {
            seen += b.count;
            if seen >= rank {
                return b.high_ns.saturating_sub(1).min(self.max_ns.max(b.low_ns));
            }
        }
        self.max_ns
    }

    /// Its percentiles.
    pub fn latency(&self) -> Latency {
        Latency {
            p50_ns: self.quantile(0.5),
            p90_ns: self.quantile(0.9),
            p99_ns: self.quantile(0.99),
            p999_ns: self.quantile(0.999),
            max_ns: self.max_ns,
            mean_ns: self.sum_ns.checked_div(self.count).unwrap_or(0),
        }
    }
}

/// Statistics of one operation class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassStats {
    /// The class.
    pub class: OpClass,
    /// Requests of the class completed.
    pub requests: u64,
    /// Those answered with an error.
    pub errors: u64,
    /// File data read or written, in bytes.
    pub bytes: u64,
    /// Percentiles of `histogram`.
    pub latency: Latency,
    /// Device-side latency: from the round that took the chain to its used entry's publication.
    pub histogram: Histogram,
}

impl ClassStats {
    fn merge(&mut self, o: &ClassStats) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.bytes += o.bytes;
        self.histogram.merge(&o.histogram);
        self.latency = self.histogram.latency();
    }

    fn since(&self, base: &ClassStats) -> ClassStats {
        let histogram = self.histogram.since(&base.histogram);
        ClassStats {
            class: self.class,
            requests: self.requests.saturating_sub(base.requests),
            errors: self.errors.saturating_sub(base.errors),
            bytes: self.bytes.saturating_sub(base.bytes),
            latency: histogram.latency(),
            histogram,
        }
    }
}

/// Requests answered with one errno.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrnoCount {
    /// The errno (0: one past the table, [`ERRNO_SLOTS`] and above).
    pub errno: u16,
    /// Requests answered with it.
    pub count: u64,
}

/// Errnos counted one by one (Linux's go up to 133); larger ones are counted together as 0.
pub const ERRNO_SLOTS: usize = 134;

/// Statistics of one virtqueue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueStats {
    /// Queue index (0 = hiprio).
    pub queue: u16,
    /// The poller that serves it.
    pub poller: usize,
    /// Requests completed (used entries returned, bad chains included).
    pub requests: u64,
    /// File data read by its requests of class read, in bytes.
    pub bytes_read: u64,
    /// File data written by its requests of class write, in bytes.
    pub bytes_written: u64,
    /// Requests answered with an errno.
    pub errors: u64,
    /// Requests failed for a malformed descriptor chain (or a handler that panicked).
    pub bad_chains: u64,
    /// Interrupts sent (MSI-X eventfd writes).
    pub interrupts: u64,
    /// Doorbells that reached the control plane through the socket.
    pub doorbells: u64,
    /// Requests pending in the poller's engine now.
    pub in_flight: u64,
    /// Requests waiting on an outside event now (for example a SETLKW).
    pub waiting: u64,
}

/// Statistics of one poller thread.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PollerStats {
    /// Poller number.
    pub poller: usize,
    /// The core it is pinned to, if any.
    pub core: Option<usize>,
    /// The queues it serves.
    pub queues: Vec<u16>,
    /// Time in rounds that took or completed requests or polled for requests pending in the engine, in
    /// nanoseconds (from the coarse clock: exact in the sum over many rounds, not per round).
    pub busy_ns: u64,
    /// Time in the other rounds, sleeps included, in nanoseconds.
    pub idle_ns: u64,
    /// Poll rounds run.
    pub rounds: u64,
    /// Times it parked after an idle spell (adaptive polling).
    pub parks: u64,
    /// Times it blocked on its engine's readiness instead of polling for requests pending
    /// there (adaptive polling).
    #[serde(default)]
    pub engine_waits: u64,
    /// Sleeps (parks or engine waits) that the client's doorbell ended directly, through the
    /// function's doorbell source, rather than through the control plane's kick.
    #[serde(default)]
    pub doorbell_wakes: u64,
    /// Its requests per operation class, in [`OpClass::ALL`] order.
    pub classes: Vec<ClassStats>,
    /// Its requests answered with an error, by errno (non-zero counts only).
    pub errors: Vec<ErrnoCount>,
}

/// A snapshot of every counter of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceStats {
    /// Per queue, by queue index.
    pub queues: Vec<QueueStats>,
    /// Per poller, by poller number.
    pub pollers: Vec<PollerStats>,
    /// Per operation class, every poller's together, in [`OpClass::ALL`] order.
    pub classes: Vec<ClassStats>,
    /// Requests answered with an error, by errno, every poller's together.
    pub errors: Vec<ErrnoCount>,
    /// Whether latencies are measured (the profile's `latency_histograms`); if not, the
    /// histograms stay empty and only the counters move.
    pub latency_histograms: bool,
}

impl DeviceStats {
    /// Requests completed per queue (index 0 = hiprio).
    pub fn requests(&self) -> Vec<u64> {
        self.queues.iter().map(|q| q.requests).collect()
    }

    /// Bad chains per queue.
    pub fn bad_chains(&self) -> Vec<u64> {
        self.queues.iter().map(|q| q.bad_chains).collect()
    }

    /// Interrupts sent per queue.
    pub fn interrupts(&self) -> Vec<u64> {
        self.queues.iter().map(|q| q.interrupts).collect()
    }

    /// Doorbells taken per queue.
    pub fn doorbells(&self) -> Vec<u64> {
        self.queues.iter().map(|q| q.doorbells).collect()
    }

    /// The statistics of `class`, every poller's together.
    pub fn class(&self, class: OpClass) -> Option<&ClassStats> {
        self.classes.iter().find(|c| c.class == class)
    }

    /// What happened since `base`, an earlier snapshot of the same device: every counter less
    /// its value then (gauges, `in_flight` and `waiting`, as they are now). This is how a reset
    /// works without writing into a poller's counters.
    pub fn since(&self, base: &DeviceStats) -> DeviceStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let queues = self
            .queues
            .iter()
            .map(|q| match base.queues.iter().find(|b| b.queue == q.queue) {
                None => q.clone(),
                Some(b) => QueueStats {
                    requests: d(q.requests, b.requests),
                    bytes_read: d(q.bytes_read, b.bytes_read),
                    bytes_written: d(q.bytes_written, b.bytes_written),
                    errors: d(q.errors, b.errors),
                    bad_chains: d(q.bad_chains, b.bad_chains),
                    interrupts: d(q.interrupts, b.interrupts),
                    doorbells: d(q.doorbells, b.doorbells),
                    ..q.clone()
                },
            })
            .collect();
        let pollers = self
            .pollers
            .iter()
            .map(|p| match base.pollers.iter().find(|b| b.poller == p.poller) {
                None => p.clone(),
                Some(b) => PollerStats {
                    busy_ns: d(p.busy_ns, b.busy_ns),
                    idle_ns: d(p.idle_ns, b.idle_ns),
                    rounds: d(p.rounds, b.rounds),
                    parks: d(p.parks, b.parks),
                    engine_waits: d(p.engine_waits, b.engine_waits),
                    doorbell_wakes: d(p.doorbell_wakes, b.doorbell_wakes),
                    classes: classes_since(&p.classes, &b.classes),
                    errors: errors_since(&p.errors, &b.errors),
                    ..p.clone()
                },
            })
            .collect();
        DeviceStats {
            queues,
            pollers,
            classes: classes_since(&self.classes, &base.classes),
            errors: errors_since(&self.errors, &base.errors),
            latency_histograms: self.latency_histograms,
        }
    }
}

fn classes_since(now: &[ClassStats], base: &[ClassStats]) -> Vec<ClassStats> {
    now.iter()
        .map(|c| match base.iter().find(|b| b.class == c.class) {
            Some(b) => c.since(b),
            None => c.clone(),
        })
        .collect()
}

fn errors_since(now: &[ErrnoCount], base: &[ErrnoCount]) -> Vec<ErrnoCount> {
    now.iter()
        .map(|e| {
            let was = base.iter().find(|b| b.errno == e.errno).map_or(0, |b| b.count);
            ErrnoCount { errno: e.errno, count: e.count.saturating_sub(was) }
        })
        .filter(|e| e.count > 0)
        .collect()
}

/// The client's state as the control plane last published it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientState {
    /// A vfio-user client is connected.
    pub connected: bool,
    /// Clients accepted since the device started.
    pub connections: u64,
    /// The virtio device status register (ACKNOWLEDGE 1, DRIVER 2, DRIVER_OK 4, FEATURES_OK 8,
    /// DEVICE_NEEDS_RESET 64, FAILED 128).
    pub driver_status: u8,
    /// The features the driver accepted (valid once FEATURES_OK is set).
    pub features: u64,
    /// The queues run on packed rings (VIRTIO_F_RING_PACKED negotiated).
    pub packed_ring: bool,
    /// Device resets (driver, DEVICE_RESET or a client gone) so far.
    pub resets: u64,
    /// The client set the device-request interrupt's eventfd: a run-time removal asks it to let
    /// the device go (QEMU then unplugs it from the guest) before it is disconnected.
    #[serde(default)]
    pub removal_interrupt: bool,
}

/// The monotonic coarse clock in nanoseconds (`CLOCK_MONOTONIC_COARSE`: a few nanoseconds a
/// read, where a precise clock read costs about 20 ns, which a poller reading it twice per
/// request at QD=1 would pay in latency). It moves in jiffies (1 to 10 ms), so one busy spell of a
/// microsecond reads as 0 or as a whole jiffy; but a jiffy falls inside a spell with a
/// probability proportional to the spell's length, so the sums over many spells are unbiased,
/// and spells longer than a jiffy are measured to within one.
#[inline]
pub(crate) fn coarse_now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
}

/// Adds `n` to a counter that only the calling thread writes: a plain load and store.
#[inline]
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// Takes one from a gauge that only the calling thread writes.
#[inline]
pub(crate) fn sub_one(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).saturating_sub(1), Ordering::Relaxed);
}

/// The latency clock: raw cycle-counter reads, converted to nanoseconds only for a difference.
#[derive(Debug, Clone)]
pub(crate) struct LatencyClock(quanta::Clock);

impl LatencyClock {
    /// A raw reading.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.0.raw()
    }

    /// Nanoseconds from reading `start` to reading `end`.
    #[inline]
    pub(crate) fn ns(&self, start: u64, end: u64) -> u64 {
        self.0.delta_as_nanos(start, end.max(start))
    }
}

/// The counters of one queue, written by the poller that serves it.
#[derive(Debug, Default)]
pub(crate) struct QueueCounters {
    pub(crate) requests: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) bad_chains: AtomicU64,
    pub(crate) interrupts: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) waiting: AtomicU64,
}

/// The counters of one operation class, written by one poller.
#[derive(Debug)]
pub(crate) struct ClassCounters {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    timed: AtomicU64,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl Default for ClassCounters {
    fn default() -> Self {
        ClassCounters {
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            timed: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl ClassCounters {
    /// Records `n` requests that each took `ns` nanoseconds.
    #[inline]
    pub(crate) fn time(&self, ns: u64, n: u64) {
        add(&self.buckets[bucket_of(ns)], n);
        add(&self.timed, n);
        add(&self.sum_ns, ns.wrapping_mul(n));
        if ns > self.max_ns.load(Ordering::Relaxed) {
            self.max_ns.store(ns, Ordering::Relaxed);
        }
    }

    fn snapshot(&self, class: OpClass) -> ClassStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let d: Vec<u64> = self.buckets.iter().map(load).collect();
        let histogram = Histogram::from_dense(&d, load(&self.sum_ns), load(&self.max_ns));
        ClassStats {
            class,
            requests: load(&self.requests),
            errors: load(&self.errors),
            bytes: load(&self.bytes),
            latency: histogram.latency(),
            histogram,
        }
    }
}

/// The counters one poller writes.
#[derive(Debug)]
pub(crate) struct PollerCounters {
    pub(crate) busy_ns: AtomicU64,
    pub(crate) idle_ns: AtomicU64,
    pub(crate) rounds: AtomicU64,
    pub(crate) parks: AtomicU64,
    pub(crate) engine_waits: AtomicU64,
    pub(crate) doorbell_wakes: AtomicU64,
    /// Its queues' counters, in the order of [`DeviceCounters::place`]'s local index.
    queues: Box<[CachePadded<QueueCounters>]>,
    /// Per class, in [`OpClass::ALL`] order.
    classes: Box<[CachePadded<ClassCounters>]>,
    /// Errors by errno ([`ERRNO_SLOTS`]; slot 0: larger ones).
    errnos: Box<[AtomicU64]>,
}

impl PollerCounters {
    /// The counters of the poller's `local`-th queue (see [`DeviceCounters::place`]).
    #[inline]
    pub(crate) fn queue(&self, local: usize) -> Option<&QueueCounters> {
        self.queues.get(local).map(|c| &**c)
    }

    /// The counters of `class`.
    #[inline]
    pub(crate) fn class(&self, class: OpClass) -> &ClassCounters {
        &self.classes[class.index()]
    }

    /// Counts one request completed with `tally` on the queue whose counters are `q` (not its
    /// latency: see [`ClassCounters::time`]).
    #[inline]
    pub(crate) fn count(&self, q: Option<&QueueCounters>, tally: Tally) {
        let c = self.class(tally.class);
        add(&c.requests, 1);
        let bytes = u64::from(tally.bytes);
        if bytes > 0 {
            add(&c.bytes, bytes);
        }
        if tally.errno != 0 {
            add(&c.errors, 1);
            let slot = usize::from(tally.errno);
            add(&self.errnos[if slot < ERRNO_SLOTS { slot } else { 0 }], 1);
        }
        if let Some(q) = q {
            match tally.class {
                OpClass::Read if bytes > 0 => add(&q.bytes_read, bytes),
                OpClass::Write if bytes > 0 => add(&q.bytes_written, bytes),
                _ => {}
            }
            if tally.errno != 0 {
                add(&q.errors, 1);
            }
        }
    }

    fn classes(&self) -> Vec<ClassStats> {
        OpClass::ALL.iter().map(|&k| self.class(k).snapshot(k)).collect()
    }

    fn errors(&self) -> Vec<ErrnoCount> {
        self.errnos
            .iter()
            .enumerate()
            .map(|(e, c)| ErrnoCount { errno: e as u16, count: c.load(Ordering::Relaxed) })
            .filter(|e| e.count > 0)
            .collect()
    }
}

/// What the control plane publishes of the client (its thread is the only writer).
#[derive(Debug, Default)]
struct ClientCounters {
    connected: AtomicBool,
    connections: AtomicU64,
    status: AtomicU64,
    features: AtomicU64,
    resets: AtomicU64,
    removal_interrupt: AtomicBool,
}

/// Every counter of one device: a block per poller and one for the control plane.
#[derive(Debug)]
pub struct DeviceCounters {
    pollers: Box<[CachePadded<PollerCounters>]>,
    /// Doorbells per queue, written by the control plane only.
    doorbells: Box<[CachePadded<AtomicU64>]>,
    /// The client's state, written by the control plane only.
    client: CachePadded<ClientCounters>,
    /// Queue index -> (poller, index among that poller's queues).
    places: Box<[(usize, usize)]>,
    cores: Box<[Option<usize>]>,
    /// The latency clock, `None` if the profile turned latency measurement off.
    clock: Option<LatencyClock>,
    /// The counters of the poller threads themselves (busy and idle time, rounds, parks), when
    /// they serve other functions too: a pool's ([`DeviceCounters::pool`]). `None`: this
    /// device's own blocks hold them.
    threads: Option<Arc<DeviceCounters>>,
}

/// VIRTIO_F_RING_PACKED.
const RING_PACKED: u64 = 1 << 34;

impl DeviceCounters {
    /// Zeroed counters for the queues and pollers of `profile`.
    #[cfg(test)]
    pub(crate) fn new(profile: &Profile) -> Self {
        Self::placed(profile, &Placement::of_profile(profile), None)
    }

    /// The counters of a pool's poller threads (only their time, rounds and parks are used).
    pub(crate) fn pool(profile: &Profile) -> Self {
        let p = Profile { request_queues: 1, latency_histograms: false, ..profile.clone() };
        Self::placed(&p, &Placement::of_profile(&p), None)
    }

    /// Zeroed counters for the queues of a function shaped by `profile`, placed on a pool's
    /// pollers as `placement` says; `threads`: the pool's own counters.
    pub(crate) fn placed(
        profile: &Profile,
        placement: &Placement,
        threads: Option<Arc<DeviceCounters>>,
    ) -> Self {
        let queues = usize::from(profile.request_queues) + 1;
        let pollers = placement.pool_pollers.max(1);
        let mut owned = vec![0usize; pollers];
        let places: Box<[(usize, usize)]> = (0..queues)
            .map(|q| {
                let p = placement.poller_of(q as u16).min(pollers - 1);
                owned[p] += 1;
                (p, owned[p] - 1)
            })
            .collect();
        let blocks = owned
            .iter()
            .map(|&n| {
                CachePadded::new(PollerCounters {
                    busy_ns: AtomicU64::new(0),
                    idle_ns: AtomicU64::new(0),
                    rounds: AtomicU64::new(0),
                    parks: AtomicU64::new(0),
                    engine_waits: AtomicU64::new(0),
                    doorbell_wakes: AtomicU64::new(0),
                    queues: (0..n).map(|_| CachePadded::new(QueueCounters::default())).collect(),
                    classes: OpClass::ALL
                        .iter()
                        .map(|_| CachePadded::new(ClassCounters::default()))
                        .collect(),
                    errnos: (0..ERRNO_SLOTS).map(|_| AtomicU64::new(0)).collect(),
                })
            })
            .collect();
        let cores = placement.cores.clone().into_boxed_slice();
        DeviceCounters {
            pollers: blocks,
            doorbells: (0..queues).map(|_| CachePadded::new(AtomicU64::new(0))).collect(),
            client: CachePadded::new(ClientCounters::default()),
            places,
            cores,
            clock: profile.latency_histograms.then(|| LatencyClock(quanta::Clock::new())),
            threads,
        }
    }

    /// The block poller `poller` writes its own time, rounds and parks into.
    #[inline]
    pub(crate) fn thread(&self, poller: usize) -> &PollerCounters {
        match &self.threads {
            Some(t) => t.poller(poller),
            None => self.poller(poller),
        }
    }

    /// The block poller `poller` writes.
    #[inline]
    pub(crate) fn poller(&self, poller: usize) -> &PollerCounters {
        &self.pollers[poller]
    }

    /// The latency clock, if latencies are measured.
    pub(crate) fn clock(&self) -> Option<&LatencyClock> {
        self.clock.as_ref()
    }

    /// Where queue `queue`'s counters are: (poller, index among that poller's queues).
    pub(crate) fn place(&self, queue: u16) -> Option<(usize, usize)> {
        self.places.get(usize::from(queue)).copied()
    }

    /// Counts a doorbell of `queue` (the control plane's thread only).
    pub(crate) fn doorbell(&self, queue: u16) {
        if let Some(c) = self.doorbells.get(usize::from(queue)) {
            add(c, 1);
        }
    }

    /// Publishes that a client connected or went away (the control plane's thread only).
    pub fn client_connected(&self, connected: bool) {
        self.client.connected.store(connected, Ordering::Relaxed);
        if connected {
            add(&self.client.connections, 1);
        }
    }

    /// Publishes the device status register and the driver's features (the control plane's
    /// thread only).
    pub(crate) fn driver_state(&self, status: u8, features: u64) {
        self.client.status.store(u64::from(status), Ordering::Relaxed);
        self.client.features.store(features, Ordering::Relaxed);
    }

    /// Publishes whether the client set the device-request eventfd (the control plane's thread
    /// only).
    pub(crate) fn removal_interrupt(&self, set: bool) {
        self.client.removal_interrupt.store(set, Ordering::Relaxed);
    }

    /// Counts a device reset (the control plane's thread only).
    pub(crate) fn reset_done(&self) {
        add(&self.client.resets, 1);
    }

    /// The client's state as last published.
    pub fn client(&self) -> ClientState {
        let c = &self.client;
        let features = c.features.load(Ordering::Relaxed);
        ClientState {
            connected: c.connected.load(Ordering::Relaxed),
            connections: c.connections.load(Ordering::Relaxed),
            driver_status: c.status.load(Ordering::Relaxed) as u8,
            features,
            packed_ring: features & RING_PACKED != 0,
            resets: c.resets.load(Ordering::Relaxed),
            removal_interrupt: c.removal_interrupt.load(Ordering::Relaxed),
        }
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> DeviceStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let queues = self
            .places
            .iter()
            .enumerate()
            .map(|(q, &(p, local))| {
                let c = &self.pollers[p].queues[local];
                QueueStats {
                    queue: q as u16,
                    poller: p,
                    requests: load(&c.requests),
                    bytes_read: load(&c.bytes_read),
                    bytes_written: load(&c.bytes_written),
                    errors: load(&c.errors),
                    bad_chains: load(&c.bad_chains),
                    interrupts: load(&c.interrupts),
                    doorbells: load(&self.doorbells[q]),
                    in_flight: load(&c.in_flight),
                    waiting: load(&c.waiting),
                }
            })
            .collect();
        let pollers: Vec<PollerStats> = self
            .pollers
            .iter()
            .enumerate()
            .filter(|(p, _)| self.threads.is_none() || self.places.iter().any(|&(q, _)| q == *p))
            .map(|(p, c)| {
                let t = self.thread(p);
                PollerStats {
                    poller: p,
                    core: self.cores.get(p).copied().flatten(),
                    queues: (0..self.places.len() as u16)
                        .filter(|&q| self.places[usize::from(q)].0 == p)
                        .collect(),
                    busy_ns: load(&t.busy_ns),
                    idle_ns: load(&t.idle_ns),
                    rounds: load(&t.rounds),
                    parks: load(&t.parks),
                    engine_waits: load(&t.engine_waits),
                    doorbell_wakes: load(&t.doorbell_wakes),
                    classes: c.classes(),
                    errors: c.errors(),
                }
            })
            .collect();
        let mut classes: Vec<ClassStats> =
            OpClass::ALL.iter().map(|&class| ClassStats { class, ..Default::default() }).collect();
        let mut errors: Vec<ErrnoCount> = Vec::new();
        for p in &pollers {
            for (all, c) in classes.iter_mut().zip(&p.classes) {
                all.merge(c);
            }
            for e in &p.errors {
                match errors.iter_mut().find(|x| x.errno == e.errno) {
                    Some(x) => x.count += e.count,
                    None => errors.push(*e),
                }
            }
        }
        errors.sort_by_key(|e| e.errno);
        DeviceStats { queues, pollers, classes, errors, latency_histograms: self.clock.is_some() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::QueueMapping;

    #[test]
    fn counters_land_in_their_queue_and_poller() {
        let profile = Profile {
            request_queues: 3,
            poller_cores: vec![0, 1],
            queue_mapping: QueueMapping::RequestQueues,
            ..Default::default()
        };
        let c = DeviceCounters::new(&profile);
        // Request queue k on poller (k-1) mod 2, hiprio on poller 0.
        assert_eq!(
            (c.place(0), c.place(1), c.place(2), c.place(3)),
            (Some((0, 0)), Some((0, 1)), Some((1, 0)), Some((0, 2)))
        );
        assert_eq!(c.place(4), None);
        let (p, local) = c.place(2).unwrap();
        let q = c.poller(p).queue(local).unwrap();
        add(&q.requests, 5);
        add(&q.in_flight, 2);
        sub_one(&q.in_flight);
        add(&c.poller(1).rounds, 7);
        c.doorbell(2);
        c.doorbell(9); // no such queue: ignored
        let s = c.snapshot();
        assert_eq!(s.requests(), [0, 0, 5, 0]);
        assert_eq!(s.doorbells(), [0, 0, 1, 0]);
        assert_eq!(
            s.queues[2],
            QueueStats { queue: 2, poller: 1, requests: 5, doorbells: 1, in_flight: 1, ..Default::default() }
        );
        assert_eq!(s.pollers[1].queues, [2]);
        assert_eq!((s.pollers[1].rounds, s.pollers[1].core), (7, Some(1)));
        assert_eq!(s.pollers[0].queues, [0, 1, 3]);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<DeviceStats>(&json).unwrap(), s);
    }

    #[test]
    fn buckets_are_log_linear_and_contiguous() {
        assert_eq!(bucket_high(BUCKETS - 1), u64::MAX);
        for i in 0..BUCKETS - 1 {
            assert_eq!(bucket_of(bucket_low(i)), i, "bucket {i}");
            assert_eq!(bucket_of(bucket_high(i) - 1), i, "top of bucket {i}");
            assert!(bucket_high(i) > bucket_low(i));
            // Every bucket past the linear part is within 1/16 of its low end.
            assert!((bucket_high(i) - bucket_low(i)) * 16 <= bucket_low(i).max(16), "bucket {i}");
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_of(1 << 40), BUCKETS - 1);
    }

    #[test]
    fn histograms_count_merge_and_subtract() {
        let profile = Profile { poller_cores: vec![0, 1], request_queues: 1, ..Default::default() };
        let c = DeviceCounters::new(&profile);
        let (p0, p1) = (c.poller(0), c.poller(1));
        let q = p1.queue(0);
        // 1000 reads of 1 us..1000 us on poller 1, 10 writes of 5 us on poller 0.
        for i in 1..=1000u64 {
            p1.count(q, Tally { class: OpClass::Read, errno: 0, bytes: 4096 });
            p1.class(OpClass::Read).time(i * 1000, 1);
        }
        p0.count(None, Tally { class: OpClass::Write, errno: 28, bytes: 0 });
        p0.class(OpClass::Write).time(5000, 10);
        p0.count(None, Tally { class: OpClass::Other, errno: 999, bytes: 0 });
        let s = c.snapshot();
        let read = s.class(OpClass::Read).unwrap();
        assert_eq!((read.requests, read.bytes, read.histogram.count), (1000, 4096 * 1000, 1000));
        assert_eq!(read.histogram.buckets.iter().map(|b| b.count).sum::<u64>(), 1000);
        assert_eq!(read.histogram.max_ns, 1_000_000);
        let l = read.latency;
        for (got, want) in
            [(l.p50_ns, 500_000u64), (l.p90_ns, 900_000), (l.p99_ns, 990_000), (l.p999_ns, 999_000)]
        {
            assert!(got >= want && got <= want + want / 16, "{got} for {want}");
        }
        assert_eq!(l.mean_ns, 500_500);
        assert_eq!(s.queues[1].bytes_read, 4096 * 1000);
        let write = s.class(OpClass::Write).unwrap();
        assert_eq!((write.requests, write.errors, write.histogram.count), (1, 1, 10));
        assert_eq!(s.errors, [ErrnoCount { errno: 0, count: 1 }, ErrnoCount { errno: 28, count: 1 }]);
        // A reset: the next snapshot less this one.
        p1.count(q, Tally { class: OpClass::Read, errno: 0, bytes: 10 });
        p1.class(OpClass::Read).time(2_000, 1);
        let d = c.snapshot().since(&s);
        let read = d.class(OpClass::Read).unwrap();
        assert_eq!((read.requests, read.bytes, read.histogram.count), (1, 10, 1));
        assert_eq!(read.histogram.buckets.len(), 1);
        assert!(read.latency.max_ns >= 2_000 && read.latency.max_ns < 2_000 + 2_000 / 16);
        assert!(d.errors.is_empty());
        assert_eq!(d.queues[1].bytes_read, 10);
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<DeviceStats>(&json).unwrap(), d);
    }

    #[test]
    fn client_state_is_published() {
        let c = DeviceCounters::new(&Profile::default());
        c.client_connected(true);
        c.driver_state(0xf, RING_PACKED | 1 << 32);
        c.reset_done();
        let s = c.client();
        assert!(s.connected && s.packed_ring);
        assert_eq!((s.connections, s.driver_status, s.resets), (1, 0xf, 1));
        c.client_connected(false);
        assert!(!c.client().connected);
    }
}
