//! The counters where the work happens: a block per poller ([`PollerCounters`]: its time,
//! rounds and parks, per class and per queue), the control plane's doorbells and client state,
//! all of a device's in [`DeviceCounters`], which reads them into a [`DeviceStats`] snapshot.
//! Each counter has one writer, which updates it with a plain load and store ([`add`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use super::class::{OpClass, Tally};
use super::clock::LatencyClock;
use super::histogram::{bucket_of, Histogram, BUCKETS};
use super::snapshot::{
    ClassStats, ClientState, DeviceStats, ErrnoCount, PollerStats, QueueStats, ERRNO_SLOTS,
};
use crate::config::{Placement, Profile};

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
    /// The statistics of the device this one took over (a live update): every snapshot
    /// continues from them.
    carried: std::sync::OnceLock<DeviceStats>,
}

/// VIRTIO_F_RING_PACKED.
pub(super) const RING_PACKED: u64 = 1 << 34;

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
            carried: std::sync::OnceLock::new(),
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
        let now = DeviceStats { queues, pollers, classes, errors, latency_histograms: self.clock.is_some() };
        match self.carried.get() {
            Some(earlier) => now.plus(earlier),
            None => now,
        }
    }

    /// Continues the counters of a device taken over from `earlier`, its predecessor's last
    /// snapshot (once; a second call is ignored).
    pub fn carry(&self, earlier: DeviceStats) {
        let _ = self.carried.set(earlier);
    }
}
