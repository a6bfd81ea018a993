//! What a run measured ([`BenchReport`]: the machine, the setup, one [`Row`] per phase, the
//! [`Target`]s) and how the rounds combine into it (medians per row, targets per round).

use serde::Serialize;
use virtiofs_tools::driver::QueueFullPolicy;

use crate::{copy, pingpong, wakeup};

/// The machine the run was on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Logical CPUs available to the process.
    pub nproc: usize,
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// Whether /proc/cpuinfo shows the `hypervisor` flag (a virtual machine).
    pub virtual_machine: bool,
    /// /proc/loadavg when the run started (other load on the machine).
    pub loadavg_at_start: String,
}

impl Machine {
    /// Reads the machine's description from /proc.
    pub fn probe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        };
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default().trim().to_string();
        Machine {
            nproc: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            cpu_model: field("model name").unwrap_or_else(|| "unknown".into()),
            kernel: read("/proc/sys/kernel/osrelease"),
            virtual_machine: field("flags").is_some_and(|f| f.split_whitespace().any(|x| x == "hypervisor")),
            loadavg_at_start: read("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        }
    }
}

/// How the device under test ran.
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    /// `in-process (RAM filesystem)` or `external daemon at PATH`.
    pub device: String,
    /// Queue size in use.
    pub queue_size: u16,
    /// Request queues in use.
    pub request_queues: u16,
    /// The in-process poller's `idle_spin_us` (None: external daemon, unknown).
    pub idle_spin_us: Option<u64>,
    /// The in-process poller's `idle_sleep_us`.
    pub idle_sleep_us: Option<u64>,
    /// The in-process poller busy-polls (`polling = "busy"`; None: external daemon, unknown).
    pub busy_poll: Option<bool>,
    /// Core the device poller is pinned to.
    pub poller_core: Option<usize>,
    /// Core the driver thread is pinned to.
    pub driver_core: Option<usize>,
    /// Negotiated `max_write` (largest request payload).
    pub max_request: usize,
    /// Measured time per phase (s), or measured requests per phase.
    pub per_phase: String,
    /// Rounds of the phase list (every figure in `rows` is a median over them).
    pub rounds: usize,
}

/// One line of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Workload name (`4k randread`, `64k seqwrite`, ...).
    pub workload: String,
    /// Operation size the application asked for.
    pub block: usize,
    /// FUSE request size actually sent (smaller when capped by max_pages).
    pub request_bytes: usize,
    /// Requests kept outstanding.
    pub depth: usize,
    /// `1`, `Q` or `2Q`.
    pub depth_label: String,
    /// Queue-full policy in force (None where the queue never fills).
    pub policy: Option<QueueFullPolicy>,
    /// Measured requests.
    pub ops: u64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// 99.9th percentile, microseconds.
    pub p999_us: f64,
    /// Largest latency, microseconds.
    pub max_us: f64,
    /// Requests per second.
    pub iops: f64,
    /// Payload MiB per second.
    pub mib_s: f64,
    /// Requests that found the ring full.
    pub parked: u64,
    /// Expired 1 ms retry timers.
    pub retry_timer_fires: u64,
    /// On-CPU time of the in-process device's pollers over the phase (warm-up included) per
    /// request completed, microseconds (from the kernel's per-thread schedstat; `None` for an
    /// external daemon and the raw NFS client). A poller that spins while requests are on the
    /// wire shows the whole phase here; one that blocks shows its work.
    pub poller_cpu_us_per_op: Option<f64>,
    /// NFS write phases (`--remote`): COMMITs sent in the phase (summed over rounds in the
    /// medians' row): the device's background COMMITs plus its FSYNC's at the end, or the raw
    /// client's (`nfs_raw`); `None` elsewhere.
    pub commits: Option<u64>,
    /// (percentile, microseconds) from p50 to p99.99, for the plot.
    pub curve: Vec<(f64, f64)>,
}

/// A target of the issue, checked against this run.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: String,
    /// The measured value.
    pub value: f64,
    /// The limit it must not exceed.
    pub limit: f64,
    /// Unit of both.
    pub unit: String,
    /// value <= limit.
    pub met: bool,
    /// The value in each round (`value` is their median).
    pub per_round: Vec<f64>,
    /// Rounds in which the value was within the limit.
    pub rounds_met: usize,
}

impl Target {
    /// A target of one round: `value` (in `unit`) against `limit`, met when at most the limit.
    fn judged(name: String, value: f64, limit: f64, unit: &str) -> Target {
        Target {
            name,
            value,
            limit,
            unit: unit.into(),
            met: value <= limit,
            per_round: vec![value],
            rounds_met: usize::from(value <= limit),
        }
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The machine.
    pub machine: Machine,
    /// The device and driver setup.
    pub setup: Setup,
    /// The ping-pong floor.
    pub floor: pingpong::Floor,
    /// A random 4 KiB copy out of a buffer the size of the test file, measured in the same run.
    pub copy: copy::CopyCost,
    /// The table.
    pub rows: Vec<Row>,
    /// QD=1 4k randread p50 as a multiple of the floor's p50.
    pub qd1_read_p50_over_floor: f64,
    /// QD=1 4k randread p50 as a multiple of (ping-pong p50 + copy p50).
    pub qd1_read_p50_over_floor_and_copy: f64,
    /// The targets (judged on the median of the per-round values).
    pub targets: Vec<Target>,
    /// Each round's own rows, in phase order (`rows` holds their medians).
    pub round_rows: Vec<Vec<Row>>,
    /// What a request after an idle spell pays for waking an adaptive poller (empty if skipped).
    pub wakeup: Vec<wakeup::WakeRow>,
    /// The NFS backend's counters at the end (`--remote`, in-process device): its calls, the
    /// UNSTABLE store's background COMMITs, waits and high-water mark.
    #[serde(default)]
    pub nfs: Option<virtiofs_backend::nfs::fs::NfsStats>,
    /// Times the in-process device's pollers blocked on their engine's readiness instead of
    /// polling for requests pending there, and times they parked (all phases).
    #[serde(default)]
    pub poller_waits: Option<(u64, u64)>,
    /// Wall time of the whole run, seconds.
    pub wall_s: f64,
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One row from the same phase's rows of every round: medians of the percentiles, IOPS and
/// bandwidth, the largest max, summed counts, and the curve of the round whose p99.9 is the median
/// (lower middle for an even count), so the plot shows a round that happened.
pub(crate) fn median_row<'a>(rounds: impl Iterator<Item = &'a Row> + Clone) -> Row {
    let pick = |f: fn(&Row) -> f64| median(rounds.clone().map(f).collect());
    let mut by_tail: Vec<&Row> = rounds.clone().collect();
    by_tail.sort_by(|a, b| a.p999_us.total_cmp(&b.p999_us));
    let middle = by_tail[(by_tail.len() - 1) / 2];
    Row {
        ops: rounds.clone().map(|r| r.ops).sum(),
        p50_us: pick(|r| r.p50_us),
        p99_us: pick(|r| r.p99_us),
        p999_us: pick(|r| r.p999_us),
        max_us: rounds.clone().map(|r| r.max_us).fold(0.0, f64::max),
        iops: pick(|r| r.iops),
        mib_s: pick(|r| r.mib_s),
        parked: rounds.clone().map(|r| r.parked).sum(),
        retry_timer_fires: rounds.clone().map(|r| r.retry_timer_fires).sum(),
        poller_cpu_us_per_op: rounds
            .clone()
            .map(|r| r.poller_cpu_us_per_op)
            .collect::<Option<Vec<f64>>>()
            .map(median),
        commits: rounds.clone().map(|r| r.commits).sum(),
        ..middle.clone()
    }
}

/// The targets of every round, judged on the median of their per-round values.
pub(crate) fn combine_targets(per_round: &[Vec<Target>]) -> Vec<Target> {
    let Some(first) = per_round.first() else { return Vec::new() };
    first
        .iter()
        .map(|t| {
            let values: Vec<f64> = per_round
                .iter()
                .filter_map(|r| r.iter().find(|x| x.name == t.name).map(|x| x.value))
                .collect();
            let value = median(values.clone());
            Target {
                name: t.name.clone(),
                value,
                limit: t.limit,
                unit: t.unit.clone(),
                met: value <= t.limit,
                rounds_met: values.iter().filter(|v| **v <= t.limit).count(),
                per_round: values,
            }
        })
        .collect()
}

/// The NFS targets: device cost at QD=1 (p50 through the device minus the raw
/// client's), QD=16 4k read IOPS and 1 MiB sequential bandwidth as raw over device.
pub(crate) fn nfs_targets(rows: &[Row]) -> Vec<Target> {
    let find = |w: &str, label: &str| {
        rows.iter().find(|r| r.workload == w && r.depth_label == label && r.policy.is_none())
    };
    let t = Target::judged;
    let mut v = Vec::new();
    for kind in ["read", "write"] {
        if let (Some(d), Some(r)) =
            (find(&format!("4k rand{kind}"), "1"), find(&format!("raw NFS 4k rand{kind}"), "1"))
        {
            v.push(t(format!("NFS QD=1 4k {kind} p50: device - raw client"), d.p50_us - r.p50_us, 2.0, "us"));
        }
    }
    if let (Some(d), Some(r)) = (find("4k randread", "16"), find("raw NFS 4k randread", "16")) {
        v.push(t(
            "NFS QD=16 4k read IOPS: raw client / device".into(),
            r.iops / d.iops.max(1e-9),
            1.0 / 0.9,
            "x",
        ));
    }
    for kind in ["read", "write"] {
        if let (Some(d), Some(r)) =
            (find(&format!("1M seq{kind}"), "seq"), find(&format!("raw NFS 1M seq{kind}"), "seq"))
        {
            v.push(t(
                format!("NFS 1 MiB seq{kind} MiB/s: raw client / device"),
                r.mib_s / d.mib_s.max(1e-9),
                1.0 / 0.8,
                "x",
            ));
        }
    }
    v
}

pub(crate) fn targets(rows: &[Row], floor: &pingpong::Floor, copy: &copy::CopyCost) -> Vec<Target> {
    let find = |w: &str, label: &str, p: Option<QueueFullPolicy>| {
        rows.iter().find(|r| r.workload == w && r.depth_label == label && r.policy == p)
    };
    let t = Target::judged;
    let mut v = nfs_targets(rows);
    if let Some(r) = find("4k randread", "1", None) {
        v.push(t("QD=1 4k read p50 / ping-pong p50".into(), r.p50_us * 1000.0 / floor.p50_ns, 5.0, "x"));
        v.push(t(
            "QD=1 4k read p50 / (ping-pong + 4 KiB copy) p50".into(),
            r.p50_us * 1000.0 / (floor.p50_ns + copy.p50_ns),
            2.0,
            "x",
        ));
        v.push(t("QD=1 4k read p99.9".into(), r.p999_us, 40.0, "us"));
    }
    for w in ["4k randread", "4k randwrite"] {
        let retry = find(w, "2Q", Some(QueueFullPolicy::Retry1ms));
        let refill = find(w, "2Q", Some(QueueFullPolicy::Refill));
        let full = find(w, "Q", None);
        if let (Some(a), Some(b)) = (retry, refill) {
            v.push(t(
                format!("{w} QD=2Q p99.9 refill / retry-1ms"),
                b.p999_us / a.p999_us.max(1e-9),
                1.0 / 60.0,
                "x",
            ));
        }
        if let (Some(b), Some(f)) = (refill, full) {
            v.push(t(format!("{w} p99.9 refill QD=2Q / QD=Q"), b.p999_us / f.p999_us.max(1e-9), 3.0, "x"));
        }
    }
    v
}
