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

mod class;
mod clock;
mod counters;
mod histogram;
mod snapshot;

pub use class::{OpClass, Tally};
pub use clock::calibrate_latency_clock;
pub(crate) use clock::{coarse_now_ns, LatencyClock};
pub use counters::DeviceCounters;
pub(crate) use counters::{add, sub_one, PollerCounters, QueueCounters};
pub use histogram::{bucket_high, bucket_low, bucket_of, Bucket, Histogram, Latency, BUCKETS};
pub use snapshot::{ClassStats, ClientState, DeviceStats, ErrnoCount, PollerStats, QueueStats, ERRNO_SLOTS};

#[cfg(test)]
mod tests;
