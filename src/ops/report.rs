//! What `virtiofs-dpu stats` prints from the control socket's `get_stats`: a table for people
//! ([`table`], rates over an interval like `iostat`), or the Prometheus text exposition format
//! ([`prometheus`], for a node exporter's textfile collector).

use std::fmt::Write;

use serde::{Deserialize, Serialize};
use virtiofs_device::stats::{bucket_of, DeviceStats, Histogram};

use crate::ops::control_socket::{ClientError, ControlClient};
use crate::FuseStats;

/// The result of `get_stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsReport {
    /// The function's tag (a daemon may serve several).
    #[serde(default)]
    pub tag: Option<String>,
    /// Seconds since the daemon started.
    pub uptime_s: f64,
    /// Seconds the counters cover (since the start or the last `reset_stats`).
    pub interval_s: f64,
    /// Crash recoveries of the daemon so far (issue 24; absent from an older daemon: 0).
    #[serde(default)]
    pub recoveries: u64,
    /// The checkpoints the serving process gave its supervisor (`None`: it keeps none).
    #[serde(default)]
    pub checkpoints: Option<crate::update::recovery::CheckpointCounts>,
    /// The device's counters over that interval.
    pub device: DeviceStats,
    /// The FUSE side's counters (since the start).
    pub fuse: FuseStats,
}

impl StatsReport {
    /// What happened between `earlier` (a report of the same daemon) and this one.
    pub fn since(&self, earlier: &StatsReport) -> StatsReport {
        StatsReport {
            tag: self.tag.clone(),
            uptime_s: self.uptime_s,
            interval_s: (self.uptime_s - earlier.uptime_s).max(0.0),
            recoveries: self.recoveries,
            checkpoints: self.checkpoints,
            device: self.device.since(&earlier.device),
            fuse: self.fuse.clone(),
        }
    }
}

fn rate(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// A table of `r`: per queue the requests and MiB per second read and written (over
/// `r.interval_s`), errors, interrupts and doorbells per second and the requests in flight and
/// waiting; per operation class the requests per second and latency percentiles in
/// microseconds; per poller its busy share.
pub fn table(r: &StatsReport) -> String {
    let d = &r.device;
    let secs = r.interval_s;
    let mib = |b: u64| rate(b, secs) / (1024.0 * 1024.0);
    let mut s = String::new();
    if let Some(tag) = &r.tag {
        let _ = writeln!(s, "function {tag}");
    }
    let _ = writeln!(s, "uptime {:.1} s, over the last {:.1} s", r.uptime_s, secs);
    let _ = writeln!(
        s,
        "{:>5} {:>6} {:>10} {:>10} {:>11} {:>8} {:>8} {:>8} {:>10} {:>9} {:>7}",
        "queue",
        "poller",
        "IOPS",
        "read MiB/s",
        "write MiB/s",
        "errors",
        "bad",
        "irq/s",
        "doorbell/s",
        "in-flight",
        "waiting"
    );
    for q in &d.queues {
        let _ = writeln!(
            s,
            "{:>5} {:>6} {:>10.0} {:>10.2} {:>11.2} {:>8} {:>8} {:>8.0} {:>10.0} {:>9} {:>7}",
            q.queue,
            q.poller,
            rate(q.requests, secs),
            mib(q.bytes_read),
            mib(q.bytes_written),
            q.errors,
            q.bad_chains,
            rate(q.interrupts, secs),
            rate(q.doorbells, secs),
            q.in_flight,
            q.waiting
        );
    }
    let _ = writeln!(s);
    if !d.latency_histograms {
        let _ = writeln!(s, "(latency histograms off: latency_histograms = false in the profile)");
    }
    let _ = writeln!(
        s,
        "{:<9} {:>10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "class", "IOPS", "errors", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us"
    );
    for c in &d.classes {
        let l = &c.latency;
        let _ = writeln!(
            s,
            "{:<9} {:>10.0} {:>8} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            c.class.name(),
            rate(c.requests, secs),
            c.errors,
            us(l.p50_ns),
            us(l.p90_ns),
            us(l.p99_ns),
            us(l.p999_ns),
            us(l.max_ns)
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "{:>6} {:>6} {:>8} {:>12} {:>8}", "poller", "core", "busy %", "rounds/s", "parks/s");
    for p in &d.pollers {
        let total = p.busy_ns + p.idle_ns;
        let busy = if total > 0 { 100.0 * p.busy_ns as f64 / total as f64 } else { 0.0 };
        let core = p.core.map_or("-".to_string(), |c| c.to_string());
        let _ = writeln!(
            s,
            "{:>6} {:>6} {:>8.1} {:>12.0} {:>8.0}",
            p.poller,
            core,
            busy,
            rate(p.rounds, secs),
            rate(p.parks, secs)
        );
    }
    if !d.errors.is_empty() {
        let list: Vec<String> = d
            .errors
            .iter()
            .map(|e| {
                if e.errno == 0 {
                    format!("other={}", e.count)
                } else {
                    format!("{}={}", std::io::Error::from_raw_os_error(i32::from(e.errno)), e.count)
                }
            })
            .collect();
        let _ = writeln!(s, "\nerrors by errno: {}", list.join(", "));
    }
    s
}

/// Prometheus metric name prefix.
const P: &str = "virtiofs_dpu";

/// Upper bounds (in nanoseconds) of the histogram buckets exported: powers of two from 128 ns
/// to 2^36 ns (69 s), which are bucket boundaries of [`Histogram`], so each count is exact.
fn exported_bounds() -> impl Iterator<Item = u64> {
    (7..=36).map(|e| 1u64 << e)
}

fn header(s: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(s, "# HELP {P}_{name} {help}");
    let _ = writeln!(s, "# TYPE {P}_{name} {kind}");
}

fn histogram(s: &mut String, name: &str, labels: &str, h: &Histogram) {
    for le in exported_bounds() {
        // Buckets wholly below `le` (every bucket boundary at a power of two is one).
        let below = bucket_of(le);
        let n: u64 = h.buckets.iter().filter(|b| bucket_of(b.low_ns) < below).map(|b| b.count).sum();
        let _ = writeln!(s, "{P}_{name}_bucket{{{labels},le=\"{}\"}} {n}", le as f64 / 1e9);
    }
    let _ = writeln!(s, "{P}_{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(s, "{P}_{name}_sum{{{labels}}} {}", h.sum_ns as f64 / 1e9);
    let _ = writeln!(s, "{P}_{name}_count{{{labels}}} {}", h.count);
}

/// `r` in the Prometheus text exposition format (version 0.0.4).
pub fn prometheus(r: &StatsReport) -> String {
    let d = &r.device;
    let mut s = String::new();
    header(&mut s, "uptime_seconds", "gauge", "Seconds since the daemon started.");
    let _ = writeln!(s, "{P}_uptime_seconds {}", r.uptime_s);
    type QueueField = fn(&virtiofs_device::stats::QueueStats) -> u64;
    let per_queue: [(&str, &str, &str, QueueField); 9] = [
        ("requests_total", "counter", "Requests completed per queue.", |q| q.requests),
        ("read_bytes_total", "counter", "File data read per queue, in bytes.", |q| q.bytes_read),
        ("written_bytes_total", "counter", "File data written per queue, in bytes.", |q| q.bytes_written),
        ("errors_total", "counter", "Requests answered with an errno per queue.", |q| q.errors),
        ("bad_chains_total", "counter", "Malformed descriptor chains per queue.", |q| q.bad_chains),
        ("interrupts_total", "counter", "Interrupts sent per queue.", |q| q.interrupts),
        ("doorbells_total", "counter", "Doorbells taken through the socket per queue.", |q| q.doorbells),
        ("in_flight_requests", "gauge", "Requests pending in an engine per queue.", |q| q.in_flight),
        ("waiting_requests", "gauge", "Requests waiting on an outside event per queue.", |q| q.waiting),
    ];
    for (name, kind, help, f) in per_queue {
        header(&mut s, name, kind, help);
        for q in &d.queues {
            let _ = writeln!(s, "{P}_{name}{{queue=\"{}\",poller=\"{}\"}} {}", q.queue, q.poller, f(q));
        }
    }
    type PollerField = fn(&virtiofs_device::stats::PollerStats) -> f64;
    let per_poller: [(&str, &str, PollerField); 6] = [
        ("poller_busy_seconds_total", "Time in busy poll rounds.", |p| p.busy_ns as f64 / 1e9),
        ("poller_idle_seconds_total", "Time in idle poll rounds and sleeps.", |p| p.idle_ns as f64 / 1e9),
        ("poller_rounds_total", "Poll rounds.", |p| p.rounds as f64),
        ("poller_parks_total", "Times a poller parked.", |p| p.parks as f64),
        ("poller_engine_waits_total", "Times a poller blocked on its engines' readiness.", |p| {
            p.engine_waits as f64
        }),
        ("poller_doorbell_wakes_total", "Sleeps a doorbell ended directly (one hop).", |p| {
            p.doorbell_wakes as f64
        }),
    ];
    for (name, help, f) in per_poller {
        header(&mut s, name, "counter", help);
        for p in &d.pollers {
            let _ = writeln!(s, "{P}_{name}{{poller=\"{}\"}} {}", p.poller, f(p));
        }
    }
    header(&mut s, "class_requests_total", "counter", "Requests completed per operation class.");
    for c in &d.classes {
        let _ = writeln!(s, "{P}_class_requests_total{{class=\"{}\"}} {}", c.class.name(), c.requests);
    }
    header(&mut s, "class_errors_total", "counter", "Requests answered with an errno per operation class.");
    for c in &d.classes {
        let _ = writeln!(s, "{P}_class_errors_total{{class=\"{}\"}} {}", c.class.name(), c.errors);
    }
    header(&mut s, "errno_total", "counter", "Requests answered with each errno (0: a larger one).");
    for e in &d.errors {
        let _ = writeln!(s, "{P}_errno_total{{errno=\"{}\"}} {}", e.errno, e.count);
    }
    header(
        &mut s,
        "request_latency_seconds",
        "histogram",
        "Device-side request latency, from the poll round that took the chain to its used entry's publication.",
    );
    for c in &d.classes {
        histogram(&mut s, "request_latency_seconds", &format!("class=\"{}\"", c.class.name()), &c.histogram);
    }
    header(&mut s, "lock_requests_total", "counter", "Lock requests the FUSE server saw.");
    let l = &r.fuse.locks;
    for (kind, n) in [("getlk", l.getlk), ("setlk", l.setlk), ("setlkw", l.setlkw)] {
        let _ = writeln!(s, "{P}_lock_requests_total{{kind=\"{kind}\"}} {n}");
    }
    header(
        &mut s,
        "replayed_requests_total",
        "counter",
        "Requests executed again after a crash: all, answered as their first execution would have been, refused.",
    );
    let p = &r.fuse.replayed;
    for (kind, n) in [("all", p.requests), ("answered_as_first", p.answered_as_first), ("refused", p.refused)]
    {
        let _ = writeln!(s, "{P}_replayed_requests_total{{kind=\"{kind}\"}} {n}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_bounds_are_bucket_boundaries() {
        use virtiofs_device::stats::bucket_low;
        for le in exported_bounds() {
            assert_eq!(bucket_low(bucket_of(le)), le);
        }
    }
}

/// How `virtiofs-dpu stats` prints a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// [`table`], for people.
    Table,
    /// `get_stats`'s result as one line of JSON.
    Json,
    /// [`prometheus`].
    Prometheus,
}

/// Why `virtiofs-dpu stats` stopped.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The control socket call failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// `get_stats` answered something that is not a report.
    #[error("get_stats: not a statistics report")]
    Report(#[from] serde_json::Error),
    /// The output could not be written.
    #[error("writing the report")]
    Output(#[from] std::io::Error),
}

/// The functions to report: `function`, or every function the daemon lists (`None`: the first
/// one, for a daemon of one function or without `list_functions`, and for the Prometheus
/// format, whose metric names carry no function label).
fn tags(client: &mut ControlClient, function: Option<&str>, format: Format) -> Vec<Option<String>> {
    if let Some(t) = function {
        return vec![Some(t.to_string())];
    }
    if format == Format::Prometheus {
        return vec![None];
    }
    match client.call("list_functions", serde_json::Value::Null) {
        Ok(serde_json::Value::Array(l)) if l.len() > 1 => {
            l.iter().map(|f| f["tag"].as_str().map(str::to_string)).collect()
        }
        _ => vec![None],
    }
}

/// Writes the statistics of the daemon behind `client` to `out` in `format`: once, or again
/// every `every` for ever, like `iostat SECONDS` (the first report covers the time since the
/// start or the last `reset_stats`, each later one the last interval).
pub fn watch(
    client: &mut ControlClient,
    function: Option<&str>,
    format: Format,
    every: Option<std::time::Duration>,
    out: &mut dyn std::io::Write,
) -> Result<(), WatchError> {
    let tags = tags(client, function, format);
    let mut prev: Vec<Option<StatsReport>> = vec![None; tags.len()];
    loop {
        for (tag, prev) in tags.iter().zip(prev.iter_mut()) {
            let params = tag.as_ref().map_or(serde_json::Value::Null, |t| serde_json::json!({ "tag": t }));
            let now: StatsReport = serde_json::from_value(client.call("get_stats", params)?)?;
            let shown = match &*prev {
                Some(p) => now.since(p),
                None => now.clone(),
            };
            match format {
                Format::Json => writeln!(out, "{}", serde_json::to_string(&shown)?)?,
                Format::Prometheus => write!(out, "{}", prometheus(&now))?,
                Format::Table => {
                    write!(out, "{}", table(&shown))?;
                    if every.is_some() || tags.len() > 1 {
                        writeln!(out)?;
                    }
                }
            }
            out.flush()?;
            *prev = Some(now);
        }
        let Some(w) = every else { return Ok(()) };
        std::thread::sleep(w);
    }
}
