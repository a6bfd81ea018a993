//! The human-readable report ([`render_table`]) and the targets' verdict ([`render_check`]).

use std::fmt::Write;

use crate::{pingpong, BenchReport, KIB, MIB};

fn fmt_us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}", v)
    } else if v >= 100.0 {
        format!("{:.1}", v)
    } else {
        format!("{:.2}", v)
    }
}

fn size(b: usize) -> String {
    if b >= MIB && b.is_multiple_of(MIB) {
        format!("{}M", b / MIB)
    } else {
        format!("{}K", b / KIB)
    }
}

/// The human-readable report: header (machine, setup, floor), the table, the targets.
pub fn render_table(r: &BenchReport) -> String {
    let mut s = String::new();
    header(&mut s, r);
    rows(&mut s, r);
    wakeup(&mut s, r);
    remote(&mut s, r);
    let _ = writeln!(s);
    if r.qd1_read_p50_over_floor > 0.0 {
        let _ = writeln!(
            s,
            "QD=1 4k read p50 = {:.1} x the ping-pong round trip, {:.1} x (ping-pong + 4 KiB copy: {:.3} us)",
            r.qd1_read_p50_over_floor,
            r.qd1_read_p50_over_floor_and_copy,
            (r.floor.p50_ns + r.copy.p50_ns) / 1000.0
        );
    }
    let _ = writeln!(s, "wall time {:.1} s", r.wall_s);
    s
}

/// The machine, the device's setup, the floor and how the phases ran.
fn header(s: &mut String, r: &BenchReport) {
    let m = &r.machine;
    let st = &r.setup;
    let _ = writeln!(
        s,
        "machine: {} x {} ({}), Linux {}, load average at start {}",
        m.nproc,
        m.cpu_model,
        if m.virtual_machine { "virtual machine" } else { "bare metal" },
        m.kernel,
        m.loadavg_at_start
    );
    let _ = writeln!(
        s,
        "device:  {}, queue size {}, {} request queue(s), max request {}",
        st.device,
        st.queue_size,
        st.request_queues,
        size(st.max_request)
    );
    match (st.idle_spin_us, st.idle_sleep_us, st.busy_poll) {
        (Some(_), Some(_), Some(true)) => {
            let _ = writeln!(
                s,
                "poller:  busy (never sleeps, nor blocks on a remote backend: a dedicated core), poller core {}, \
                 driver core {}",
                st.poller_core.map(|c| c.to_string()).unwrap_or_else(|| "unpinned".into()),
                st.driver_core.map(|c| c.to_string()).unwrap_or_else(|| "unpinned".into()),
            );
        }
        (Some(spin), Some(sleep), _) => {
            let _ = writeln!(
                s,
                "poller:  idle_spin_us={spin} idle_sleep_us={sleep} (adaptive: spins {:.0} s on empty rings before \
                 it would park; blocks on a remote backend while its requests are out), poller core {}, driver \
                 core {}",
                spin as f64 / 1e6,
                st.poller_core.map(|c| c.to_string()).unwrap_or_else(|| "unpinned".into()),
                st.driver_core.map(|c| c.to_string()).unwrap_or_else(|| "unpinned".into()),
            );
        }
        _ => {
            let _ = writeln!(s, "poller:  external daemon, its own profile");
        }
    }
    let _ = writeln!(
        s,
        "floor:   shared-memory ping-pong round trip p50 {:.3} us, p99 {:.3} us ({} round trips)",
        r.floor.p50_ns / 1000.0,
        r.floor.p99_ns / 1000.0,
        r.floor.round_trips
    );
    let _ = writeln!(
        s,
        "noise:   ping-pong p99.9 {:.1} us, max {:.0} us, {:.0} stalls/s over {} us (a thread lost its core)",
        r.floor.p999_ns / 1000.0,
        r.floor.max_ns / 1000.0,
        r.floor.stalls_per_s,
        pingpong::STALL_NS / 1000
    );
    let _ = writeln!(
        s,
        "copy:    random 4 KiB copy out of a {} buffer p50 {:.3} us, p99.9 {:.3} us ({} copies)",
        size(usize::try_from(r.copy.buffer_bytes).unwrap_or(usize::MAX)),
        r.copy.p50_ns / 1000.0,
        r.copy.p999_ns / 1000.0,
        r.copy.copies
    );
    let _ =
        writeln!(s, "phases:  {} each; latency from issue, HDR histogram; warm-up excluded", st.per_phase);
    if st.rounds > 1 {
        let _ = writeln!(
            s,
            "rounds:  {} (every phase once per round); figures are medians over the rounds, max is the largest",
            st.rounds
        );
    }
}

/// The table: one row per phase.
fn rows(s: &mut String, r: &BenchReport) {
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<19} {:>4} {:>5} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>8} {:>12}",
        "workload",
        "req",
        "QD",
        "policy",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "IOPS",
        "MiB/s",
        "parked",
        "poller us/op"
    );
    for row in &r.rows {
        let qd = match row.depth_label.as_str() {
            "1" | "16" | "seq" => row.depth.to_string(),
            l => format!("{}={}", l, row.depth),
        };
        let _ = writeln!(
            s,
            "{:<19} {:>4} {:>5} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10.0} {:>9.1} {:>8} {:>12}",
            row.workload,
            size(row.request_bytes),
            qd,
            row.policy.map(|p| p.name()).unwrap_or("-"),
            fmt_us(row.p50_us),
            fmt_us(row.p99_us),
            fmt_us(row.p999_us),
            fmt_us(row.max_us),
            row.iops,
            row.mib_s,
            row.parked,
            row.poller_cpu_us_per_op.map_or("-".to_string(), |c| format!("{c:.1}"))
        );
    }
}

/// The wake-up cost of adaptive polling, when it was measured.
fn wakeup(s: &mut String, r: &BenchReport) {
    if !r.wakeup.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "wake-up: 4k read QD=1 after 1 ms idle (adaptive: idle_spin_us=50 idle_sleep_us=200), {} requests each",
            r.wakeup[0].requests
        );
        let _ = writeln!(
            s,
            "{:<20} {:>9} {:>9} {:>9} {:>9} {:>14} {:>16} {:>13}",
            "poller",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "max us",
            "added p50 us",
            "socket doorbells",
            "direct wakes"
        );
        for w in &r.wakeup {
            let _ = writeln!(
                s,
                "{:<20} {:>9} {:>9} {:>9} {:>9} {:>14} {:>16} {:>13}",
                w.variant,
                fmt_us(w.p50_us),
                fmt_us(w.p99_us),
                fmt_us(w.p999_us),
                fmt_us(w.max_us),
                fmt_us(w.added_p50_us),
                w.socket_doorbells,
                w.direct_wakes
            );
        }
    }
}

/// What the pollers waited on, and what the NFS backend did.
fn remote(s: &mut String, r: &BenchReport) {
    if let Some((waits, parks)) = r.poller_waits {
        let _ = writeln!(s);
        let _ = writeln!(s, "pollers: {waits} waits on the engine's readiness, {parks} parks");
    }
    if let Some(n) = &r.nfs {
        let u = &n.unstable;
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "nfs: {} calls, {} retransmits, {} backlogged; UNSTABLE store: {} writes stored, {} FILE_SYNC for want of room, {} waited for room, high-water {} KiB, {} background COMMITs freeing {} KiB",
            n.calls,
            n.retransmits,
            n.backlogged,
            u.stored,
            u.full,
            u.waited,
            u.high_water >> 10,
            u.background_commits,
            u.background_freed >> 10
        );
        let commits: Vec<String> = r
            .rows
            .iter()
            .filter_map(|row| row.commits.map(|c| format!("{} QD={} {c}", row.workload, row.depth_label)))
            .collect();
        if !commits.is_empty() {
            let _ = writeln!(s, "COMMITs per write phase (all rounds): {}", commits.join(", "));
        }
    }
}

/// The targets of the run (see [`BenchReport::targets`]), one line each, and whether every one
/// was met: what `--check` prints and turns into the exit code.
pub fn render_check(r: &BenchReport) -> (String, bool) {
    let mut s = String::new();
    if r.targets.is_empty() {
        let _ = writeln!(s, "check: no target applies to the phases run");
    }
    for t in &r.targets {
        let _ = write!(
            s,
            "target {:<50} {:>10.4} {} (limit {:.4}) {}",
            t.name,
            t.value,
            t.unit,
            t.limit,
            if t.met { "met" } else { "MISSED" }
        );
        if t.per_round.len() > 1 {
            let v: Vec<String> = t.per_round.iter().map(|v| format!("{v:.4}")).collect();
            let _ = write!(s, "; met in {} of {} rounds: {}", t.rounds_met, t.per_round.len(), v.join(" "));
        }
        let _ = writeln!(s);
    }
    (s, r.targets.iter().all(|t| t.met))
}
