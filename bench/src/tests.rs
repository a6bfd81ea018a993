//! Unit tests of the benchmark: the phase list, a smoke run on a tiny configuration, rounds and
//! medians, the phase filter.

use super::report::median;
use super::*;

#[test]
fn phase_list_has_every_row() {
    let p = phases(128, 16);
    let names: Vec<String> =
        p.iter().map(|p| format!("{} {} {:?}", p.name(), p.depth_label, p.policy)).collect();
    assert_eq!(p.len(), 12, "{names:?}");
    assert_eq!(p.iter().filter(|p| p.depth == 256).count(), 4);
    assert!(names.contains(&"1M seqwrite seq None".to_string()), "{names:?}");
}

/// The whole benchmark path at a tiny size: every row, the targets, table, JSON and SVG.
#[test]
fn smoke_run_has_every_row() {
    let cfg = BenchConfig {
        queue_size: 8,
        ops: Some(200),
        file_size: 1 << 20,
        seq_depth: 4,
        idle_spin_us: 50,
        pin: false,
        floor_duration: Duration::from_millis(50),
        ..Default::default()
    };
    let mut lines = Vec::new();
    let r = run(&cfg, &mut |l| lines.push(l.to_string())).unwrap();
    assert_eq!(r.rows.len(), 12);
    assert!(lines.iter().any(|l| l.starts_with("[12/12] 1M seqwrite QD=4")), "{lines:?}");
    for row in &r.rows {
        assert_eq!(row.ops, 200, "{}", row.workload);
        assert!(row.p50_us > 0.0 && row.p50_us <= row.p999_us && row.p999_us <= row.max_us);
        assert!(row.iops > 0.0 && row.mib_s > 0.0);
    }
    // Queue size 8 caps requests at 4 pages, as Linux does.
    assert_eq!(r.setup.max_request, 16 << 10);
    assert!(r.rows.iter().filter(|w| w.depth == 16).all(|w| w.parked > 0));
    assert_eq!(r.targets.len(), 7);
    assert!(r.floor.p50_ns > 0.0 && r.qd1_read_p50_over_floor > 0.0);
    // The floor with the data's copy: out of a buffer the size of the test file, and below the
    // ping-pong-only ratio.
    assert_eq!(r.copy.buffer_bytes, cfg.file_size);
    assert!(r.copy.copies > 0 && r.copy.p50_ns > 0.0, "{:?}", r.copy);
    assert!(r.qd1_read_p50_over_floor_and_copy > 0.0);
    assert!(r.qd1_read_p50_over_floor_and_copy < r.qd1_read_p50_over_floor);
    let copy_target = r.targets.iter().find(|t| t.name.contains("4 KiB copy")).unwrap();
    assert_eq!(copy_target.value, r.qd1_read_p50_over_floor_and_copy);
    assert_eq!(copy_target.limit, 2.0);

    let table = render_table(&r);
    for w in ["4k randread", "4k randwrite", "64k seqread", "64k seqwrite", "1M seqread", "1M seqwrite"] {
        assert!(table.contains(w), "{w} missing from\n{table}");
    }
    assert_eq!(table.matches("retry-1ms").count(), 2, "one row per 4k workload: {table}");
    assert!(table.contains("ping-pong") && table.contains("idle_spin_us=50"), "{table}");
    let json: serde_json::Value = serde_json::to_value(&r).unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len(), 12);
    assert_eq!(json["rows"][4]["policy"], "retry-1ms");
    let svg = plot::render_svg(&r);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 8, "one line per 4k row");
}

/// A run small enough for a unit test: 8-entry queues, 100 requests per phase, 1 MiB file.
fn tiny() -> BenchConfig {
    BenchConfig {
        queue_size: 8,
        ops: Some(100),
        file_size: 1 << 20,
        idle_spin_us: 50,
        pin: false,
        floor_duration: Duration::from_millis(20),
        ..Default::default()
    }
}

#[test]
fn null_backend_answers_without_data() {
    let cfg = BenchConfig { backend: Backend::Null, only: Some("QD=1,1M seqread".into()), ..tiny() };
    let r = run(&cfg, &mut |_| {}).unwrap();
    let names: Vec<&str> = r.rows.iter().map(|r| r.workload.as_str()).collect();
    assert_eq!(names, ["4k randread", "4k randwrite", "1M seqread"]);
    assert!(r.setup.device.contains("null-data"));
    assert!(render_table(&r).contains("null-data"));
}

#[test]
fn rounds_give_medians_and_per_round_targets() {
    let cfg = BenchConfig { only: Some("QD=1".into()), rounds: 3, wakeup_requests: 20, ..tiny() };
    let mut lines = Vec::new();
    let r = run(&cfg, &mut |l| lines.push(l.to_string())).unwrap();
    assert_eq!(r.round_rows.len(), 3);
    assert!(lines.iter().any(|l| l.starts_with("[round 3/3, 2/2] 4k randwrite QD=1")), "{lines:?}");
    for (i, row) in r.rows.iter().enumerate() {
        let mut p50: Vec<f64> = r.round_rows.iter().map(|rr| rr[i].p50_us).collect();
        p50.sort_by(f64::total_cmp);
        assert_eq!(row.p50_us, p50[1], "median of three");
        assert_eq!(row.ops, 300, "ops summed over rounds");
        let max = r.round_rows.iter().map(|rr| rr[i].max_us).fold(0.0, f64::max);
        assert_eq!(row.max_us, max);
    }
    let t = r.targets.iter().find(|t| t.name.contains("p99.9")).unwrap();
    assert_eq!(t.per_round.len(), 3);
    assert_eq!(t.rounds_met, t.per_round.iter().filter(|v| **v <= t.limit).count());
    let table = render_table(&r);
    assert!(table.contains("rounds:  3") && !table.contains("target"), "targets only with --check: {table}");
    let (check, met) = render_check(&r);
    assert!(check.contains("of 3 rounds"), "{check}");
    assert_eq!(met, r.targets.iter().all(|t| t.met), "{check}");
    assert_eq!(check.matches("MISSED").count(), r.targets.iter().filter(|t| !t.met).count(), "{check}");
    let variants: Vec<&str> = r.wakeup.iter().map(|w| w.variant.as_str()).collect();
    assert_eq!(variants, ["busy", "adaptive, timer", "adaptive, doorbell"]);
    assert!(r.wakeup.iter().all(|w| w.requests == 20 && w.p50_us > 0.0 && w.p50_us <= w.max_us));
    assert_eq!(r.wakeup[0].socket_doorbells + r.wakeup[1].socket_doorbells, 0, "shared-memory doorbells");
    assert!(r.wakeup[2].socket_doorbells >= 10, "a parked poller is rung awake: {:?}", r.wakeup[2]);
    assert!(table.contains("adaptive, doorbell"), "{table}");
}

#[test]
fn median_of_even_and_odd_counts() {
    assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    assert_eq!(median(Vec::new()), 0.0);
}

#[test]
fn phase_filter_matches_whole_words() {
    assert!(selected("4k randread QD=1", "randread QD=1"));
    assert!(!selected("4k randread QD=128", "randread QD=1"));
    assert!(selected("4k randwrite QD=256 refill", "QD=1,refill"));
    assert!(!selected("4k randwrite QD=256 refill", ""));
}

#[test]
fn curve_spans_p50_to_p9999() {
    let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
    for i in 1..=100_000u64 {
        h.record(i * 10).unwrap();
    }
    let c = curve(&h);
    assert!((c[0].0 - 50.0).abs() < 1e-6);
    assert!((c.last().unwrap().0 - 99.99).abs() < 1e-3);
    assert!(c.windows(2).all(|w| w[0].1 <= w[1].1));
}

/// `--live-update`'s pause: the longest gap between completions that overlaps the window,
/// gaps before and after it left out; percentiles by nearest rank.
#[test]
fn live_update_pause_is_the_longest_gap_in_the_window() {
    use live_update::{longest_gap, Millis};
    // Completions every 10 ns, a 500 ns pause from 100 to 600, a 910 ns gap from 790.
    let mut t: Vec<u64> = (0..=10).map(|i| i * 10).collect();
    t.extend((0..20).map(|i| 600 + i * 10));
    t.extend([1700, 1710]);
    assert_eq!(longest_gap(&t, 50, 700), Some(500));
    // A window that starts inside the pause still sees all of it.
    assert_eq!(longest_gap(&t, 300, 700), Some(500));
    assert_eq!(longest_gap(&t, 0, 90), Some(10));
    assert_eq!(longest_gap(&t, 1500, 1600), Some(910));
    // A gap that starts before the window's end counts.
    assert_eq!(longest_gap(&t, 50, 790), Some(910));
    assert_eq!(longest_gap(&t, 3000, 4000), None);
    assert_eq!(longest_gap(&[5], 0, 10), None);
    let v: Vec<f64> = (1..=20).map(f64::from).collect();
    let m = Millis::of(&v);
    assert_eq!((m.p50, m.p99, m.max), (10.0, 20.0, 20.0));
    assert_eq!(Millis::of(&[]).max, 0.0);
}
