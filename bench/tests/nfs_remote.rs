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

/// The raw client on NFSv4.1 (`?version=4.1`): a session of its own, the file opened, READs
/// placed into its buffers, UNSTABLE WRITEs with background COMMITs under the bound, and the
/// data on the export.
#[test]
fn the_raw_client_runs_on_nfsv4_1() {
    use virtiofs_bench::nfs_raw::{RawClient, RawPhase};
    let g = ganesha::Ganesha::start();
    let name = "raw41.dat";
    std::fs::write(g.export().join(name), vec![0u8; 1 << 20]).unwrap();
    let url = format!("nfs://127.0.0.1{}?version=4.1&nfsport={}", g.export().display(), g.nfs_port());
    let mut c = RawClient::new(&url, name, 4, 64 << 10, 64 << 10).expect("the raw 4.1 client starts");
    let write = RawPhase { write: true, sequential: false, block: 4096, depth: 4, depth_label: "4" };
    let (row, st) = c.run(&write, 1 << 20, Duration::ZERO, Duration::ZERO, Some(300)).unwrap();
    // The measured calls: the 300 asked, give or take the calls in flight when the measuring
    // starts and stops.
    assert!((296..=304).contains(&row.ops), "{}", row.ops);
    assert!(st.commits > 2, "background COMMITs under a 64 KiB bound: {st:?}");
    assert_eq!(st.full, 0, "{st:?}");
    let read = RawPhase { write: false, sequential: true, block: 64 << 10, depth: 1, depth_label: "1" };
    let (row, _) = c.run(&read, 1 << 20, Duration::ZERO, Duration::ZERO, Some(40)).unwrap();
    assert_eq!(row.ops, 40);
    assert_eq!(c.conn_stats().retransmits, 0);
    drop(c);
    // The raw client writes its buffers' byte: some 4 KiB blocks of the file now hold it.
    let data = std::fs::read(g.export().join(name)).unwrap();
    assert_eq!(data.len(), 1 << 20);
    let written = data.chunks(4096).filter(|b| b.iter().all(|&x| x == 0x5a)).count();
    assert!(written > 50, "{written} blocks written");
}
