#!/usr/bin/env python3
"""fio-compare.py OUT_DIR: the tables of tools/vm/compare.sh (python3 stdlib only).

Reads every OUT_DIR/<round>-<kernel>[-<layout>]-<variant>/ (meta + console.log with the
VMFIO-BEGIN/END blocks that guest/fio-compare.sh prints) and prints, in markdown:
  1. every run: IOPS, bandwidth and total-latency percentiles per job;
  2. medians over rounds per setup (kernel and core layout), variant and job;
  3. ratios ours/virtiofsd per job and metric (ratio of the medians), per setup;
  4. with several setups, each variant's jobs per setup (p50/p99/p99.9);
  5. the targets: on dedicated cores 4k QD1 randread and randwrite p50 <= 0.6x, 4k QD=2Q randread
     IOPS >= 1.5x, 1M sequential write bandwidth >= 1.2x; on shared cores no job worse than
     virtiofsd (p50 <= 1.0x, IOPS and bandwidth >= 1.0x); with writeback on both servers (a setup
     ending ", writeback"), the buffered two-job write bandwidth >= 1.2x.
Writes OUT_DIR/summary.md and OUT_DIR/summary.json too.
"""
import json
import os
import re
import statistics
import sys

METRICS = [  # key, header, unit, better
    ("p50", "p50 us", 1, "lower"),
    ("p99", "p99 us", 1, "lower"),
    ("p99.9", "p99.9 us", 1, "lower"),
    ("iops", "IOPS", 1, "higher"),
    ("bw", "MB/s", 1, "higher"),
]
JOB_ORDER = ["randread-4k-qd1", "randwrite-4k-qd1", "randread-4k-qdN", "seqwrite-1m", "seqwrite-1m-cpu1",
             "write-1m-buffered-2j"]


def fio_json_job(body, rc):
    """The first job of fio's JSON output in a console block; None for a failed run (rc) or one
    without JSON."""
    if rc != 0 or "{" not in body:
        return None
    try:
        return json.loads(body[body.index("{"):body.rindex("}") + 1])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        return None


def parse_run(d):
    meta = {}
    try:
        with open(os.path.join(d, "meta")) as f:
            for kv in f.read().split():
                k, _, v = kv.partition("=")
                meta[k] = v
    except OSError:
        return None
    # Runs from before the layouts were shared-core runs.
    meta.setdefault("layout", "shared")
    meta["group"] = f"{meta.get('kernel', '?')}, {meta['layout']} cores"
    if meta.get("writeback") == "on":
        meta["group"] += ", writeback"
    log = os.path.join(d, "console.log")
    txt = open(log, errors="replace").read().replace("\r", "") if os.path.exists(log) else ""
    run = {"meta": meta, "jobs": {}, "info": re.findall(r"^VMFIO-INFO (.*)$", txt, re.M)}
    for m in re.finditer(r"^VMFIO-BEGIN (\S+)\n(.*?)^VMFIO-END \S+ rc=(\d+)", txt, re.S | re.M):
        name, body, rc = m.group(1), m.group(2), int(m.group(3))
        j = fio_json_job(body, rc)
        if j is None:
            continue
        side = j["read"] if j["read"]["io_bytes"] else j["write"]
        lat = side.get("lat_ns", {})
        pct = lat.get("percentile") or side.get("clat_ns", {}).get("percentile", {})
        g = lambda k: pct.get(k, 0) / 1000.0
        run["jobs"][name] = {
            "iops": side["iops"], "bw": side["bw_bytes"] / 1e6,
            "p50": g("50.000000"), "p99": g("99.000000"), "p99.9": g("99.900000"),
            "mean": lat.get("mean", side.get("clat_ns", {}).get("mean", 0)) / 1000.0,
            "slat_mean": side.get("slat_ns", {}).get("mean", 0) / 1000.0,
            "samples": lat.get("N", 0),
        }
    for f in ("daemon.log", "virtiofsd.log"):
        p = os.path.join(d, f)
        if os.path.exists(p):
            m = re.search(r"requests per queue: (.*)", open(p, errors="replace").read())
            if m:
                run["queues"] = m.group(1).strip()
    return run


def fmt(v):
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main():
    out_dir = sys.argv[1]
    runs = []
    for name in sorted(os.listdir(out_dir)):
        d = os.path.join(out_dir, name)
        if os.path.isdir(d) and re.match(r"^\d+-", name):
            r = parse_run(d)
            if r:
                runs.append(r)
    if not runs:
        print("no runs found")
        return 1
    runs.sort(key=lambda r: (int(r["meta"].get("round", 0)), r["meta"]["group"]))
    kernels = list(dict.fromkeys(r["meta"]["group"] for r in runs))
    variants = list(dict.fromkeys(r["meta"]["variant"] for r in runs))
    jobs = [j for j in JOB_ORDER if any(j in r["jobs"] for r in runs)]
    jobs += sorted({j for r in runs for j in r["jobs"]} - set(jobs))
    md = []

    # 1. every run
    rows = []
    for r in runs:
        m = r["meta"]
        for j in jobs:
            x = r["jobs"].get(j)
            if x is None:
                rows.append([m["round"], m["group"], m["variant"], j, "FAILED", "", "", "", ""])
                continue
            rows.append([m["round"], m["group"], m["variant"], j, f"{x['iops']:.0f}", fmt(x["bw"]),
                         fmt(x["p50"]), fmt(x["p99"]), fmt(x["p99.9"])])
    md.append("### Every run (total latency lat = slat + clat, in us)\n")
    md.append(table(["round", "setup", "variant", "job", "IOPS", "MB/s", "p50", "p99", "p99.9"], rows))
    info = []
    for r in runs:
        m = r["meta"]
        extra = [i for i in r["info"] if i.startswith("max_background") or i.startswith("kernel")]
        info.append(f"- round {m['round']} {m['group']} {m['variant']}: rc={m.get('rc')} wall {m.get('wall')} s, "
                    f"host cpu busy {m.get('host_busy_pct')}%, loadavg {m.get('loadavg')}; "
                    + "; ".join(extra) + (f"; device requests per queue: {r['queues']}" if r.get("queues") else ""))
    md.append("\nRuns:\n" + "\n".join(info))

    # 2. medians
    med = {}
    for k in kernels:
        for v in variants:
            for j in jobs:
                vals = [r["jobs"][j] for r in runs
                        if r["meta"]["group"] == k and r["meta"]["variant"] == v and j in r["jobs"]]
                if vals:
                    med[(k, v, j)] = {key: statistics.median(x[key] for x in vals) for key, *_ in METRICS}
                    med[(k, v, j)]["n"] = len(vals)
                    med[(k, v, j)]["spread"] = {key: (min(x[key] for x in vals), max(x[key] for x in vals))
                                                for key, *_ in METRICS}
    rows = []
    for k in kernels:
        for j in jobs:
            for v in variants:
                x = med.get((k, v, j))
                if x:
                    sp = x["spread"]
                    rows.append([k, j, v, x["n"], f"{x['iops']:.0f}", fmt(x["bw"]), fmt(x["p50"]),
                                 fmt(x["p99"]), fmt(x["p99.9"]),
                                 f"{fmt(sp['p50'][0])}-{fmt(sp['p50'][1])}",
                                 f"{sp['iops'][0]:.0f}-{sp['iops'][1]:.0f}"])
    md.append("\n### Medians over rounds (latency in us)\n")
    md.append(table(["setup", "job", "variant", "rounds", "IOPS", "MB/s", "p50", "p99", "p99.9",
                     "p50 range", "IOPS range"], rows))

    # 3. ratios ours / virtiofsd
    ratios = {}
    for k in kernels:
        base = "virtiofsd"
        ours = [v for v in variants if v != base]
        if base not in variants or not ours:
            continue
        rows = []
        for v in ours:
            for j in jobs:
                a, b = med.get((k, v, j)), med.get((k, base, j))
                if not a or not b:
                    continue
                rr = {key: (a[key] / b[key] if b[key] else None) for key, *_ in METRICS}
                ratios[(k, v, j)] = rr
                # the same ratio within each round (neighbouring boots), to show the spread
                per = {}
                for r in runs:
                    m = r["meta"]
                    if m["group"] != k or m["variant"] != v or j not in r["jobs"]:
                        continue
                    peer = [x for x in runs if x["meta"]["group"] == k and x["meta"]["variant"] == base
                            and x["meta"]["round"] == m["round"] and j in x["jobs"]]
                    if peer:
                        for key, *_ in METRICS:
                            if peer[0]["jobs"][j][key]:
                                per.setdefault(key, []).append(r["jobs"][j][key] / peer[0]["jobs"][j][key])
                cells = []
                for key, *_ in METRICS:
                    c = f"**{rr[key]:.2f}**" if rr[key] is not None else "-"
                    if len(per.get(key, [])) > 1:
                        c += f" ({min(per[key]):.2f}-{max(per[key]):.2f})"
                    cells.append(c)
                rows.append([v, j] + cells)
        md.append(f"\n### Ratio ours / virtiofsd, {k}: ratio of the medians, in brackets the range of "
                  "the per-round ratios (latency: lower is better for us; IOPS, MB/s: higher is better)\n")
        md.append(table(["variant", "job", "p50", "p99", "p99.9", "IOPS", "MB/s"], rows))

    # 4. kernels
    if len(kernels) > 1:
        rows = []
        for v in variants:
            for j in jobs:
                if not all((k, v, j) in med for k in kernels):
                    continue
                cells = []
                for k in kernels:
                    x = med[(k, v, j)]
                    cells.append(f"{fmt(x['p50'])} / {fmt(x['p99'])} / {fmt(x['p99.9'])} ({x['iops']:.0f} IOPS)")
                rows.append([v, j] + cells)
        md.append("\n### Per setup: p50 / p99 / p99.9 us (IOPS), medians\n")
        md.append(table(["variant", "job"] + kernels, rows))

    # 5. targets (issue: dedicated cores ahead by a margin, shared cores never behind)
    tl = []
    dedicated = [("randread-4k-qd1", "p50", "<=", 0.6), ("randwrite-4k-qd1", "p50", "<=", 0.6),
                 ("randread-4k-qdN", "iops", ">=", 1.5), ("seqwrite-1m", "bw", ">=", 1.2)]
    for k in kernels:
        for v in variants:
            if v == "virtiofsd":
                continue
            if "dedicated cores" in k:
                want = list(dedicated)
            else:
                want = [(j, key, cmp, 1.0) for j in jobs for key, cmp in (("p50", "<="), ("iops", ">="), ("bw", ">="))]
            if k.endswith(", writeback"):
                # The writeback seed: with writeback on both servers, buffered 1 MiB writes of two
                # jobs at least 1.2x virtiofsd's bandwidth.
                want.append(("write-1m-buffered-2j", "bw", ">=", 1.2))
            for j, key, cmp, limit in want:
                rr = ratios.get((k, v, j))
                if not rr or rr[key] is None:
                    continue
                met = rr[key] <= limit if cmp == "<=" else rr[key] >= limit
                tl.append(f"- {k}, {v}: {j} {key} ratio {rr[key]:.2f} (target {cmp} {limit:.2f}): "
                          + ("MET" if met else "not met"))
    if tl:
        md.append("\n### Targets\n")
        md.append("\n".join(tl))

    text = "\n".join(md) + "\n"
    print(text)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump({"runs": runs,
                   "medians": [{"setup": k, "variant": v, "job": j, **{m: x[m] for m, *_ in METRICS}, "n": x["n"]}
                               for (k, v, j), x in med.items()],
                   "ratios": [{"setup": k, "variant": v, "job": j, **rr} for (k, v, j), rr in ratios.items()]},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
