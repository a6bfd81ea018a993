//! The data's share of the floor: a random 4 KiB copy out of a buffer as large as the test file.
//!
//! A 4 KiB read from the RAM filesystem copies the file's page into the request's buffer at
//! least once; with a test file far larger than the caches that copy misses the cache, and on a
//! small machine it costs as much as the ping-pong round trip itself. So a QD=1 read cannot be
//! faster than ping-pong + this copy, measured the same way in the same run: one thread (on the
//! device's core) copies 4 KiB from a random 4 KiB-aligned offset of a buffer the size of the
//! test file into a fixed 4 KiB buffer, timed with the same clock calls as a request.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// The copy's result.
#[derive(Debug, Clone, Serialize)]
pub struct CopyCost {
    /// Size of the buffer copied from (the test file's size), bytes.
    pub buffer_bytes: u64,
    /// Copies measured (after warm-up).
    pub copies: u64,
    /// Median copy, nanoseconds.
    pub p50_ns: f64,
    /// 99th percentile, nanoseconds.
    pub p99_ns: f64,
    /// 99.9th percentile, nanoseconds.
    pub p999_ns: f64,
    /// Core of the copying thread (None: unpinned).
    pub core: Option<usize>,
}

const PAGE: usize = 4096;

/// Measures random 4 KiB copies out of a `buffer_bytes` buffer (at least one page) for
/// `duration` (a tenth more as warm-up), on a thread pinned to `core` if given.
pub fn measure(buffer_bytes: u64, duration: Duration, core: Option<usize>) -> CopyCost {
    let pages = (usize::try_from(buffer_bytes).unwrap_or(usize::MAX) / PAGE).max(1);
    let run = move || {
        if let Some(c) = core {
            core_affinity::set_for_current(core_affinity::CoreId { id: c });
        }
        // Every page written once, so the copies read memory that exists (no zero-page mapping).
        let src: Vec<u8> = (0..pages * PAGE).map(|i| (i / PAGE) as u8 ^ 0x5a).collect();
        let mut dst = vec![0u8; PAGE];
        let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("valid bounds");
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let start = Instant::now();
        let warm_until = start + duration / 10;
        let end = warm_until + duration;
        let mut n = 0u64;
        loop {
            n += 1;
            let page = (super::xorshift(&mut seed) % pages as u64) as usize;
            let from = &src[page * PAGE..(page + 1) * PAGE];
            let t0 = Instant::now();
            dst.copy_from_slice(std::hint::black_box(from));
            std::hint::black_box(&mut dst);
            let t1 = Instant::now();
            if t0 >= warm_until {
                h.saturating_record((t1 - t0).as_nanos().max(1) as u64);
            }
            if n.is_multiple_of(1024) && t1 >= end {
                break;
            }
        }
        h
    };
    let h = std::thread::Builder::new()
        .name("copy-floor".into())
        .spawn(run)
        .expect("spawn the copying thread")
        .join()
        .expect("the copying thread does not panic");
    CopyCost {
        buffer_bytes: (pages * PAGE) as u64,
        copies: h.len(),
        p50_ns: h.value_at_quantile(0.5) as f64,
        p99_ns: h.value_at_quantile(0.99) as f64,
        p999_ns: h.value_at_quantile(0.999) as f64,
        core,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_measured() {
        let c = measure(1 << 20, Duration::from_millis(30), None);
        assert_eq!(c.buffer_bytes, 1 << 20);
        assert!(c.copies > 0);
        assert!(c.p50_ns > 0.0 && c.p50_ns <= c.p99_ns && c.p99_ns <= c.p999_ns);
    }
}
