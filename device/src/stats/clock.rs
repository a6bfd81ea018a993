//! The clocks the statistics read: the coarse monotonic clock a poller's busy and idle time
//! comes from ([`coarse_now_ns`]), and the cycle-counter latency clock ([`LatencyClock`]).

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

/// The latency clock: raw cycle-counter reads, converted to nanoseconds only for a difference.
#[derive(Debug, Clone)]
pub(crate) struct LatencyClock(pub(super) quanta::Clock);

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

/// Calibrates the latency clock now (the cycle counter against the monotonic clock, once per
/// process: 10-120 ms measured on a loaded 2-core machine), so that the first device made later
/// does not pay it. A live update's new process calls it before anything is frozen: its first
/// function's build took that long otherwise, inside the guests' pause.
pub fn calibrate_latency_clock() {
    let _ = quanta::Clock::new();
}
