//! The floor: the cheapest possible request/response between two cores.
//!
//! One thread (the caller) writes a sequence number to a cache line; the other spins on that
//! line and echoes the number to a second line, on which the caller spins. A virtqueue request
//! needs at least this (the avail index crosses to the device, the used index comes back), so a
//! round trip here is what a request would cost with zero work on either side. Each round trip
//! is timed with the same clock calls as a benchmark request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// The ping-pong result.
#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    /// Round trips measured (after warm-up).
    pub round_trips: u64,
    /// Median round trip, nanoseconds.
    pub p50_ns: f64,
    /// 99th percentile, nanoseconds.
    pub p99_ns: f64,
    /// 99.9th percentile, nanoseconds.
    pub p999_ns: f64,
    /// Longest round trip, nanoseconds.
    pub max_ns: f64,
    /// Round trips longer than 10 us per second: how often one of the two threads lost its
    /// core (the machine's noise, which the benchmark's tails share).
    pub stalls_per_s: f64,
    /// Core of the echoing thread (None: unpinned).
    pub echo_core: Option<usize>,
}

/// A round trip longer than this counts as a stall.
pub const STALL_NS: u64 = 10_000;

#[repr(align(128))]
struct Line(AtomicU64);

const STOP: u64 = u64::MAX;

/// Measures round trips for `duration` (a tenth more as warm-up), the echo thread pinned to
/// `echo_core` if given. The caller's thread is the pinging side.
pub fn measure(duration: Duration, echo_core: Option<usize>) -> Floor {
    let ping = Arc::new(Line(AtomicU64::new(0)));
    let pong = Arc::new(Line(AtomicU64::new(0)));
    let echo = {
        let (ping, pong) = (ping.clone(), pong.clone());
        std::thread::Builder::new()
            .name("pingpong-echo".into())
            .spawn(move || {
                if let Some(c) = echo_core {
                    core_affinity::set_for_current(core_affinity::CoreId { id: c });
                }
                let mut last = 0;
                loop {
                    let v = ping.0.load(Ordering::Acquire);
                    if v != last {
                        pong.0.store(v, Ordering::Release);
                        last = v;
                        if v == STOP {
                            return;
                        }
                    } else {
                        std::hint::spin_loop();
                    }
                }
            })
            .expect("spawn the echo thread")
    };
    let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("valid bounds");
    let start = Instant::now();
    let warm_until = start + duration / 10;
    let end = warm_until + duration;
    let mut seq = 0u64;
    loop {
        seq += 1;
        let t0 = Instant::now();
        ping.0.store(seq, Ordering::Release);
        while pong.0.load(Ordering::Acquire) != seq {
            std::hint::spin_loop();
        }
        let t1 = Instant::now();
        if t0 >= warm_until {
            h.saturating_record((t1 - t0).as_nanos().max(1) as u64);
        }
        // Look at the clock for the end only now and then: the timed part stays two calls.
        if seq.is_multiple_of(1024) && t1 >= end {
            break;
        }
    }
    ping.0.store(STOP, Ordering::Release);
    let _ = echo.join();
    let measured = start.elapsed().saturating_sub(duration / 10).as_secs_f64().max(1e-9);
    let stalls = h
        .iter_recorded()
        .filter(|v| v.value_iterated_to() > STALL_NS)
        .map(|v| v.count_at_value())
        .sum::<u64>();
    Floor {
        round_trips: h.len(),
        p50_ns: h.value_at_quantile(0.5) as f64,
        p99_ns: h.value_at_quantile(0.99) as f64,
        p999_ns: h.value_at_quantile(0.999) as f64,
        max_ns: h.max() as f64,
        stalls_per_s: stalls as f64 / measured,
        echo_core,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_pong_measures_round_trips() {
        let f = measure(Duration::from_millis(50), None);
        assert!(f.round_trips > 0);
        assert!(f.p50_ns > 0.0 && f.p50_ns <= f.p99_ns && f.p99_ns <= f.p999_ns);
    }
}
