//! The latency histogram: its log-linear buckets ([`bucket_of`], [`BUCKETS`]) and a histogram as
//! read ([`Histogram`]: merged, subtracted, its percentiles as [`Latency`]).

use serde::{Deserialize, Serialize};

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

    pub(super) fn from_dense(d: &[u64], sum_ns: u64, max_ns: u64) -> Self {
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
