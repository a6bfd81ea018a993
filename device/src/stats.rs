//! Device statistics: counters kept where the work happens, read as data ([`DeviceStats`]).
//!
//! Each poller writes only its own block of counters: its busy and idle time, its rounds and
//! parks, and per queue it serves the requests, bad chains, interrupts, requests pending in its
//! engine and requests waiting on an outside event. Every block (and every queue's counters in
//! it) sits on cache lines of its own (`CachePadded`), so the pollers share no line for
//! statistics; each counter has one writer, which updates it with a plain load and store (no
//! locked read-modify-write, no lock, no allocation). Doorbells that reach the control plane
//! through the socket are counted by the control plane, in a block of its own; doorbells that
//! land in the shared notify page (`doorbells = "shared"`) reach nobody and are not counted.
//!
//! [`DeviceCounters::snapshot`] reads every counter (relaxed loads: each value is exact, the set
//! is not one instant) into a [`DeviceStats`], which is `Serialize` + `Deserialize`: what the
//! daemon writes as JSON. Modelled on Firecracker's per-device metrics, with the counters per
//! poller instead of shared atomics.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use serde::{Deserialize, Serialize};

use crate::config::Profile;

/// Statistics of one virtqueue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    /// Queue index (0 = hiprio).
    pub queue: u16,
    /// The poller that serves it.
    pub poller: usize,
    /// Requests completed (used entries returned, bad chains included).
    pub requests: u64,
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
pub struct PollerStats {
    /// Poller number.
    pub poller: usize,
    /// The core it is pinned to, if any.
    pub core: Option<usize>,
    /// The queues it serves.
    pub queues: Vec<u16>,
    /// Time in rounds that took or completed requests or had requests pending in the engine, in
    /// nanoseconds (from the coarse clock: exact in the sum over many rounds, not per round).
    pub busy_ns: u64,
    /// Time in the other rounds, sleeps included, in nanoseconds.
    pub idle_ns: u64,
    /// Poll rounds run.
    pub rounds: u64,
    /// Times it parked after an idle spell (adaptive polling).
    pub parks: u64,
}

/// A snapshot of every counter of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// Per queue, by queue index.
    pub queues: Vec<QueueStats>,
    /// Per poller, by poller number.
    pub pollers: Vec<PollerStats>,
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

/// The counters of one queue, written by the poller that serves it.
#[derive(Debug, Default)]
pub(crate) struct QueueCounters {
    pub(crate) requests: AtomicU64,
    pub(crate) bad_chains: AtomicU64,
    pub(crate) interrupts: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) waiting: AtomicU64,
}

/// The counters one poller writes.
#[derive(Debug)]
pub(crate) struct PollerCounters {
    pub(crate) busy_ns: AtomicU64,
    pub(crate) idle_ns: AtomicU64,
    pub(crate) rounds: AtomicU64,
    pub(crate) parks: AtomicU64,
    /// Its queues' counters, in the order of [`DeviceCounters::place`]'s local index.
    queues: Box<[CachePadded<QueueCounters>]>,
}

impl PollerCounters {
    /// The counters of the poller's `local`-th queue (see [`DeviceCounters::place`]).
    #[inline]
    pub(crate) fn queue(&self, local: usize) -> Option<&QueueCounters> {
        self.queues.get(local).map(|c| &**c)
    }
}

/// Every counter of one device: a block per poller and one for the control plane.
#[derive(Debug)]
pub struct DeviceCounters {
    pollers: Box<[CachePadded<PollerCounters>]>,
    /// Doorbells per queue, written by the control plane only.
    doorbells: Box<[CachePadded<AtomicU64>]>,
    /// Queue index -> (poller, index among that poller's queues).
    places: Box<[(usize, usize)]>,
    cores: Box<[Option<usize>]>,
}

impl DeviceCounters {
    /// Zeroed counters for the queues and pollers of `profile`.
    pub(crate) fn new(profile: &Profile) -> Self {
        let queues = usize::from(profile.request_queues) + 1;
        let pollers = profile.pollers();
        let mut owned = vec![0usize; pollers];
        let places: Box<[(usize, usize)]> = (0..queues)
            .map(|q| {
                let p = profile.poller_of(q as u16);
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
                    queues: (0..n).map(|_| CachePadded::new(QueueCounters::default())).collect(),
                })
            })
            .collect();
        let cores = if profile.poller_cores.is_empty() {
            vec![None].into_boxed_slice()
        } else {
            profile.poller_cores.iter().map(|&c| Some(c)).collect()
        };
        DeviceCounters {
            pollers: blocks,
            doorbells: (0..queues).map(|_| CachePadded::new(AtomicU64::new(0))).collect(),
            places,
            cores,
        }
    }

    /// The block poller `poller` writes.
    #[inline]
    pub(crate) fn poller(&self, poller: usize) -> &PollerCounters {
        &self.pollers[poller]
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
                    bad_chains: load(&c.bad_chains),
                    interrupts: load(&c.interrupts),
                    doorbells: load(&self.doorbells[q]),
                    in_flight: load(&c.in_flight),
                    waiting: load(&c.waiting),
                }
            })
            .collect();
        let pollers = self
            .pollers
            .iter()
            .enumerate()
            .map(|(p, c)| PollerStats {
                poller: p,
                core: self.cores.get(p).copied().flatten(),
                queues: (0..self.places.len() as u16)
                    .filter(|&q| self.places[usize::from(q)].0 == p)
                    .collect(),
                busy_ns: load(&c.busy_ns),
                idle_ns: load(&c.idle_ns),
                rounds: load(&c.rounds),
                parks: load(&c.parks),
            })
            .collect();
        DeviceStats { queues, pollers }
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
        assert_eq!(
            s.pollers[1],
            PollerStats { poller: 1, core: Some(1), queues: vec![2], rounds: 7, ..Default::default() }
        );
        assert_eq!(s.pollers[0].queues, [0, 1, 3]);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<DeviceStats>(&json).unwrap(), s);
    }
}
