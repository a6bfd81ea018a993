#!/usr/bin/env python3
"""nfs-compare.py OUT_DIR: the tables of tools/vm/nfs-compare.sh (python3 stdlib only).

Reads OUT_DIR/console.log (the VMNFS-BEGIN/END blocks of guest/nfs-compare.sh) and prints, in
markdown: every round's figures per job and client (ours: our device serving the export;
knfs: the guest kernel's NFSv3 client on the same export), the medians over the rounds, and the
ratios ours/knfs of the medians: fio's total-latency p50 and p99.9, IOPS, MB/s, and the guest's
CPU time per operation (the busy ticks of /proc/stat's aggregate cpu line over the job, at
USER_HZ = 100, divided by the operations fio did), also less the idle guest's own busy time over
the job's seconds (VMNFS-IDLE, once per round): a job of few operations, waiting on the server,
is otherwise charged the guest's timer ticks and kworkers. Writes OUT_DIR/summary.md and summary.json.
"""
import importlib.util
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("fio_compare", os.path.join(HERE, "fio-compare.py"))
fio_compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fio_compare)
fmt, table = fio_compare.fmt, fio_compare.table

USER_HZ = 100
JOBS = ["randread-4k-qd1", "randwrite-4k-qd1", "randwrite-4k-qd1-sync", "randread-4k-qdN", "seqread-1m",
        "seqwrite-1m", "seqwrite-1m-sync"]
METRICS = [  # key, header, better
    ("p50", "p50 us", "lower"),
    ("p99.9", "p99.9 us", "lower"),
    ("iops", "IOPS", "higher"),
    ("bw", "MB/s", "higher"),
    ("cpu_us", "guest CPU us/op", "lower"),
    ("net_cpu_us", "guest CPU us/op less idle", "lower"),
]


def idle_rates(txt):
    """round -> busy ticks per second of the idle guest (VMNFS-IDLE)."""
    idle = {}
    for m in re.finditer(r"^VMNFS-IDLE round=(\d+) cpu0=(\d+)/\d+ cpu1=(\d+)/\d+ wall=([\d.]+)", txt, re.M):
        idle[int(m.group(1))] = (int(m.group(3)) - int(m.group(2))) / max(float(m.group(4)), 1e-3)
    return idle


def parse(txt):
    runs = []
    idle = idle_rates(txt)
    pat = (r"^VMNFS-BEGIN round=(\d+) job=(\S+) client=(\S+) cpu0=(\d+)/(\d+) cpu1=(\d+)/(\d+) wall=([\d.]+)\n"
           r"(.*?)^VMNFS-END rc=(\d+)")
    for m in re.finditer(pat, txt, re.S | re.M):
        rnd, job, client = int(m.group(1)), m.group(2), m.group(3)
        b0, t0, b1, t1 = (int(m.group(i)) for i in range(4, 8))
        wall = float(m.group(8))
        j = fio_compare.fio_json_job(m.group(9), int(m.group(10)))
        if j is None:
            continue
        side = j["read"] if j["read"]["io_bytes"] else j["write"]
        ops = j["read"]["total_ios"] + j["write"]["total_ios"]
        pct = side.get("lat_ns", {}).get("percentile", {})
        busy = b1 - b0
        net = max(busy - idle.get(rnd, 0.0) * wall, 0.0)
        runs.append({
            "round": rnd, "job": job, "client": client, "ops": ops,
            "iops": side["iops"], "bw": side["bw_bytes"] / 1e6,
            "p50": pct.get("50.000000", 0) / 1000.0, "p99.9": pct.get("99.900000", 0) / 1000.0,
            "busy_ticks": busy, "total_ticks": t1 - t0,
            "cpu_us": busy * 1e6 / USER_HZ / ops if ops else None,
            "net_cpu_us": net * 1e6 / USER_HZ / ops if ops else None,
            "idle_ticks": idle.get(rnd, 0.0) * wall, "wall_s": wall,
            "runtime_s": j.get("job_runtime", 0) / 1000.0,
        })
    return runs


def main():
    out = sys.argv[1]
    txt = open(os.path.join(out, "console.log"), errors="replace").read().replace("\r", "")
    runs = parse(txt)
    if not runs:
        print("no runs found in console.log")
        return 1
    jobs = [j for j in JOBS if any(r["job"] == j for r in runs)]
    jobs += sorted({r["job"] for r in runs} - set(jobs))
    md = []
    rows = []
    for r in sorted(runs, key=lambda r: (r["round"], jobs.index(r["job"]), r["client"])):
        rows.append([r["round"], r["job"], r["client"], r["ops"], fmt(r["p50"]), fmt(r["p99.9"]),
                     fmt(r["iops"]), fmt(r["bw"]), f"{r['busy_ticks']}/{r['total_ticks']}",
                     f"{r['idle_ticks']:.0f}", fmt(r["cpu_us"]), fmt(r["net_cpu_us"])])
    md.append("### Every round\n")
    md.append(table(["round", "job", "client", "ops", "p50 us", "p99.9 us", "IOPS", "MB/s",
                     "busy/total ticks", "idle guest's ticks", "guest CPU us/op", "less idle"], rows))
    med = {}
    for j in jobs:
        for c in ("ours", "knfs"):
            xs = [r for r in runs if r["job"] == j and r["client"] == c]
            if xs:
                med[(j, c)] = {k: statistics.median([x[k] for x in xs if x[k] is not None] or [0])
                               for k, _, _ in METRICS}
                med[(j, c)]["rounds"] = len(xs)
    rows = []
    for j in jobs:
        a, b = med.get((j, "ours")), med.get((j, "knfs"))
        if not a or not b:
            rows.append([j] + ["-"] * (3 * len(METRICS)))
            continue
        row = [f"{j} ({a['rounds']}/{b['rounds']})"]
        for k, _, _ in METRICS:
            row += [fmt(a[k]), fmt(b[k]), f"{a[k] / b[k]:.2f}" if b[k] else "-"]
        rows.append(row)
    hdr = ["job (rounds ours/knfs)"]
    for _, h, better in METRICS:
        hdr += [f"ours {h}", f"knfs {h}", f"ours/knfs ({better} is better)"]
    md.append("\n### Medians over the rounds, and ours / kernel NFS client\n")
    md.append(table(hdr, rows))
    # Per-round CPU ratios, to see the spread.
    rows = []
    for j in jobs:
        per, per_net = [], []
        for rnd in sorted({r["round"] for r in runs}):
            a = [r for r in runs if r["job"] == j and r["client"] == "ours" and r["round"] == rnd]
            b = [r for r in runs if r["job"] == j and r["client"] == "knfs" and r["round"] == rnd]
            if a and b and a[0]["cpu_us"] and b[0]["cpu_us"]:
                per.append(f"{a[0]['cpu_us'] / b[0]['cpu_us']:.2f}")
            if a and b and a[0]["net_cpu_us"] and b[0]["net_cpu_us"]:
                per_net.append(f"{a[0]['net_cpu_us'] / b[0]['net_cpu_us']:.2f}")
        rows.append([j, ", ".join(per), ", ".join(per_net)])
    md.append("\n### Guest CPU per operation, ours / knfs, per round\n")
    md.append(table(["job", "per round", "less idle, per round"], rows))
    md.append("\nThe idle guest's busy time, per round (ticks/s at USER_HZ = 100, both vCPUs): "
              + ", ".join(f"{v:.1f}" for _, v in sorted(idle_rates(txt).items())))
    text = "\n".join(md) + "\n"
    print(text)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"runs": runs, "medians": {f"{j}/{c}": v for (j, c), v in med.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
