//! `virtiofs-bench --remote` against nfs-ganesha: the device's write phases and the raw
//! client's COMMIT by the same rule (from half the UNSTABLE store's size, and once at the end of
//! each write phase, timed into it), counted per phase; read phases send none.

use std::time::Duration;

use virtiofs_bench::{run, BenchConfig};

#[path = "../../backend/tests/harness/ganesha.rs"]
mod ganesha;

#[test]
fn both_sides_commit_by_the_store_rule() {
    let g = ganesha::Ganesha::start();
    let cfg = BenchConfig {
        queue_size: 8,
        ops: Some(400),
        file_size: 1 << 20,
        seq_depth: 4,
        idle_spin_us: 50,
        pin: false,
        floor_duration: Duration::from_millis(20),
        only: Some("randwrite QD=1,randread QD=1".into()),
        rounds: 2,
        remote: Some(g.url()),
        // 64 KiB: a background COMMIT every 32 KiB of the 1.6 MB each side writes per round.
        nfs_unstable_bytes: Some(64 << 10),
        ..Default::default()
    };
    let mut lines = Vec::new();
    let r = run(&cfg, &mut |l| lines.push(l.to_string())).unwrap();
    let row = |w: &str| r.rows.iter().find(|x| x.workload == w && x.depth == 1).unwrap();
    for w in ["4k randwrite", "raw NFS 4k randwrite"] {
        let c = row(w).commits.unwrap_or_else(|| panic!("{w}: no COMMIT count"));
        // 2 rounds of 1.6 MB each over a 32 KiB high-water mark: far more than the 2 final ones.
        assert!(c > 10, "{w}: {c} COMMITs in 2 rounds");
        assert_eq!(row(w).ops, 2 * 400, "{w}");
    }
    // The same rule over the same bytes: about as many on both sides.
    let (d, raw) = (row("4k randwrite").commits.unwrap(), row("raw NFS 4k randwrite").commits.unwrap());
    assert!(d * 2 > raw && raw * 2 > d, "device {d} against raw {raw} COMMITs");
    for w in ["4k randread", "raw NFS 4k randread"] {
        assert_eq!(row(w).commits, None, "{w}");
    }
    let nfs = r.nfs.as_ref().unwrap();
    assert!(nfs.unstable.background_commits > 10, "{:?}", nfs.unstable);
    assert_eq!(nfs.unstable.full, 0, "no write went FILE_SYNC for want of room");
    assert!(nfs.unstable.high_water <= 64 << 10, "{:?}", nfs.unstable);
    assert_eq!(nfs.unstable.bytes_now, 0, "the last FSYNC left nothing stored");
    // The raw client reports its COMMITs per write phase and round.
    let raw: Vec<&String> = lines.iter().filter(|l| l.contains("COMMITs (final")).collect();
    assert_eq!(raw.len(), 2, "{lines:?}");
    let table = virtiofs_bench::render_table(&r);
    assert!(table.contains("COMMITs per write phase"), "{table}");
    // The layout and the writes reached the export.
    let len = std::fs::metadata(g.export().join("virtiofs-bench.dat")).map(|m| m.len());
    assert_eq!(len.ok(), Some(1 << 20), "{:?}", std::fs::read_dir(g.export()).map(|d| d.count()));
}
