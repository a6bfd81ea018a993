//! The statistics as read: [`DeviceStats`] and its per-queue, per-poller and per-class parts,
//! and the client's state ([`ClientState`]). Plain data, `Serialize` + `Deserialize` (what the
//! daemon writes as JSON), and subtracted from a baseline ([`DeviceStats::since`]).

use serde::{Deserialize, Serialize};

use super::class::OpClass;
use super::histogram::{Histogram, Latency};

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
    pub(super) fn merge(&mut self, o: &ClassStats) {
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
        self.combine(base, u64::saturating_sub, classes_since, errors_since)
    }

    /// These statistics continued from `earlier`, the last snapshot of the device this one took
    /// over (a live update): every counter and histogram added, gauges as they are now. The
    /// inverse of [`Self::since`].
    pub fn plus(&self, earlier: &DeviceStats) -> DeviceStats {
        self.combine(earlier, u64::saturating_add, classes_plus, errors_plus)
    }

    /// Every counter of this and `other` (matched by queue, poller and class) put together
    /// with `op`, the classes with `classes` and the errno counts with `errors`; gauges and
    /// everything else as in `self`.
    fn combine(
        &self,
        other: &DeviceStats,
        op: fn(u64, u64) -> u64,
        classes: fn(&[ClassStats], &[ClassStats]) -> Vec<ClassStats>,
        errors: fn(&[ErrnoCount], &[ErrnoCount]) -> Vec<ErrnoCount>,
    ) -> DeviceStats {
        let queues = (self.queues.iter())
            .map(|q| match other.queues.iter().find(|b| b.queue == q.queue) {
                None => q.clone(),
                Some(b) => QueueStats {
                    requests: op(q.requests, b.requests),
                    bytes_read: op(q.bytes_read, b.bytes_read),
                    bytes_written: op(q.bytes_written, b.bytes_written),
                    errors: op(q.errors, b.errors),
                    bad_chains: op(q.bad_chains, b.bad_chains),
                    interrupts: op(q.interrupts, b.interrupts),
                    doorbells: op(q.doorbells, b.doorbells),
                    ..q.clone()
                },
            })
            .collect();
        let pollers = (self.pollers.iter())
            .map(|p| match other.pollers.iter().find(|b| b.poller == p.poller) {
                None => p.clone(),
                Some(b) => PollerStats {
                    busy_ns: op(p.busy_ns, b.busy_ns),
                    idle_ns: op(p.idle_ns, b.idle_ns),
                    rounds: op(p.rounds, b.rounds),
                    parks: op(p.parks, b.parks),
                    engine_waits: op(p.engine_waits, b.engine_waits),
                    doorbell_wakes: op(p.doorbell_wakes, b.doorbell_wakes),
                    classes: classes(&p.classes, &b.classes),
                    errors: errors(&p.errors, &b.errors),
                    ..p.clone()
                },
            })
            .collect();
        DeviceStats {
            queues,
            pollers,
            classes: classes(&self.classes, &other.classes),
            errors: errors(&self.errors, &other.errors),
            latency_histograms: self.latency_histograms,
        }
    }
}

fn classes_plus(now: &[ClassStats], earlier: &[ClassStats]) -> Vec<ClassStats> {
    now.iter()
        .map(|c| {
            let mut sum = c.clone();
            if let Some(b) = earlier.iter().find(|b| b.class == c.class) {
                sum.merge(b);
            }
            sum
        })
        .collect()
}

fn errors_plus(now: &[ErrnoCount], earlier: &[ErrnoCount]) -> Vec<ErrnoCount> {
    let mut all = now.to_vec();
    for e in earlier {
        match all.iter_mut().find(|a| a.errno == e.errno) {
            Some(a) => a.count += e.count,
            None => all.push(*e),
        }
    }
    all.sort_unstable_by_key(|e| e.errno);
    all
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
