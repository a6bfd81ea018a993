//! The wake-up cost of adaptive polling: what a request pays when it arrives after an idle spell,
//! by the way its poller is woken.
//!
//! Each variant starts its own in-process device (RAM filesystem, one request queue) and sends
//! 4 KiB reads at QD 1 with an idle gap before each one, longer than the poller's spin window, so
//! every request finds the poller parked (or, for `busy`, still spinning). Variants:
//!
//! - `busy`: the poller never parks: the reference (no wake-up at all);
//! - `adaptive, timer`: doorbells stay in shared memory (`doorbells = "shared"`); a parked poller
//!   notices the request when its sleep of `idle_sleep_us` ends;
//! - `adaptive, doorbell`: doorbells come through the socket (`doorbells = "socket"`); the
//!   poller asks for one before it parks and the doorbell wakes it: directly, as the poller also
//!   sleeps on the client's socket (counted as direct wake-ups), or through the control plane's
//!   kick when that thread read the message first.
//!
//! The added wake-up latency of a variant is its p50 minus the busy p50.

use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use virtiofs_dpu::config::{Doorbells, Polling, Profile};

use super::BenchError;
use virtiofs_tools::driver::{DriverOptions, FsDriver};

/// Parameters of the wake-up measurement.
#[derive(Debug, Clone)]
pub struct WakeupConfig {
    /// Requests per variant.
    pub requests: usize,
    /// Idle gap before each request.
    pub gap: Duration,
    /// The adaptive pollers' spin window (µs); shorter than `gap`.
    pub idle_spin_us: u64,
    /// The adaptive pollers' longest sleep (µs).
    pub idle_sleep_us: u64,
    /// Core of the device's poller, if pinned.
    pub poller_core: Option<usize>,
}

/// One variant's figures.
#[derive(Debug, Clone, Serialize)]
pub struct WakeRow {
    /// `busy`, `adaptive, timer` or `adaptive, doorbell`.
    pub variant: String,
    /// Requests measured.
    pub requests: usize,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
    /// Largest, µs.
    pub max_us: f64,
    /// p50 minus the busy variant's p50, µs (0 for busy itself).
    pub added_p50_us: f64,
    /// Doorbells the driver rang through the socket.
    pub socket_doorbells: u64,
    /// Sleeps of the poller that a doorbell ended directly (one hop: the poller woke on the
    /// client's socket itself, not on the control plane's kick after it read the message).
    pub direct_wakes: u64,
}

/// Runs the three variants (see the module documentation).
pub fn measure(cfg: &WakeupConfig, dir: &Path) -> Result<Vec<WakeRow>, BenchError> {
    let variants = [
        ("busy", Polling::Busy, Doorbells::Shared),
        ("adaptive, timer", Polling::Adaptive, Doorbells::Shared),
        ("adaptive, doorbell", Polling::Adaptive, Doorbells::Socket),
    ];
    let mut rows: Vec<WakeRow> = Vec::new();
    for (i, (name, polling, doorbells)) in variants.into_iter().enumerate() {
        let profile = Profile {
            description: format!("virtiofs-bench wake-up: {name}"),
            polling,
            doorbells,
            idle_spin_us: cfg.idle_spin_us,
            idle_sleep_us: cfg.idle_sleep_us,
            poller_cores: cfg.poller_core.into_iter().collect(),
            ..Profile::default()
        };
        profile.validate().map_err(|e| BenchError::Config(e.to_string()))?;
        let sock = dir.join(format!("wakeup-{i}.sock"));
        let dev = virtiofs_dpu::RunningDevice::start_with(
            &sock,
            profile,
            std::sync::Arc::new(virtiofs_dpu::FuseHandler::new(virtiofs_backend::RamFs::new())),
        )
        .map_err(|e| BenchError::Device(Box::new(e)))?;
        let (hist, rung) = run_variant(cfg, &sock)?;
        let stats = dev.stop().map_err(|e| BenchError::Device(Box::new(e)))?;
        let direct_wakes = stats.pollers.iter().map(|p| p.doorbell_wakes).sum();
        let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
        let p50 = us(0.5);
        let base = rows.first().map(|r| r.p50_us).unwrap_or(p50);
        rows.push(WakeRow {
            variant: name.to_string(),
            requests: cfg.requests,
            p50_us: p50,
            p99_us: us(0.99),
            p999_us: us(0.999),
            max_us: hist.max() as f64 / 1000.0,
            added_p50_us: p50 - base,
            socket_doorbells: rung,
            direct_wakes,
        });
    }
    Ok(rows)
}

fn run_variant(cfg: &WakeupConfig, sock: &Path) -> Result<(Histogram<u64>, u64), BenchError> {
    let mut d = FsDriver::connect(sock, DriverOptions { queue_size: 128, ..Default::default() })?;
    d.init()?;
    let (file, open) = d.create(super::ROOT, "wake", 0o644, libc::O_RDWR as u32)?;
    d.write(file.nodeid, open.fh, 0, &[0x5a; 4096])?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3)
        .map_err(|e| BenchError::Config(e.to_string()))?;
    let (_, rung_before) = d.notify_counts();
    for _ in 0..cfg.requests {
        std::thread::sleep(cfg.gap);
        let t = Instant::now();
        let got = d.read(file.nodeid, open.fh, 0, 4096)?;
        let ns = t.elapsed().as_nanos() as u64;
        if got.len() != 4096 {
            return Err(BenchError::Config(format!("wake-up read returned {} bytes", got.len())));
        }
        hist.saturating_record(ns.max(1));
    }
    let (_, rung_after) = d.notify_counts();
    d.release(file.nodeid, open.fh)?;
    d.shutdown()?;
    Ok((hist, rung_after - rung_before))
}
