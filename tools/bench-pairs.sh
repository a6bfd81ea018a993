#!/usr/bin/env bash
# Compares two virtiofs-bench settings A and B in PAIRS alternating pairs of runs, the order
# within a pair swapped every other pair (A/B, B/A, ...) so that a drift in the machine's load
# favours neither. A and B are commands (a binary and its extra arguments), e.g. two builds of
# the benchmark or one build with and without a flag. Prints per setting the median over the
# runs of the 4k randread QD=1 p50 and p99.9 and the IOPS at QD = queue size (128), and the
# median of the per-pair A/B ratios.
# Usage: A="old/virtiofs-bench" B="new/virtiofs-bench" tools/bench-pairs.sh [PAIRS] (default 10);
# LABELS="before after" names them in the table.
set -euo pipefail
pairs=${1:-10}
read -r -a cmd_a <<<"${A:?A=command of setting A}"
read -r -a cmd_b <<<"${B:?B=command of setting B}"
read -r label_a label_b <<<"${LABELS:-A B}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(--only "randread QD=1,randread QD=128" --rounds 1 --duration 2 --wakeup-requests 0 --json)
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((i = 0; i < pairs; i++)); do
    if ((i % 2 == 0)); then order=(a b); else order=(b a); fi
    for s in "${order[@]}"; do
        if [ "$s" = a ]; then c=("${cmd_a[@]}"); else c=("${cmd_b[@]}"); fi
        "${c[0]}" "${args[@]}" "${c[@]:1}" >"$out/$s.$i.json" 2>/dev/null
    done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$pairs" "$label_a" "$label_b" <<'PY'
import json, statistics, sys
out, pairs, la, lb = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def row(d, depth):
    return next(r for r in d["rows"] if r["workload"] == "4k randread" and r["depth"] == depth)
m = {s: {"p50": [], "p999": [], "iops128": []} for s in ("a", "b")}
for i in range(pairs):
    for s in ("a", "b"):
        d = json.load(open(f"{out}/{s}.{i}.json"))
        m[s]["p50"].append(row(d, 1)["p50_us"])
        m[s]["p999"].append(row(d, 1)["p999_us"])
        m[s]["iops128"].append(row(d, 128)["iops"])
print(f"{pairs} alternating pairs; medians over the runs, and the median of the per-pair {la}/{lb} ratios")
print(f"| metric | {la} | {lb} | median {la} / {lb} | per-pair {la} / {lb} median (min-max) |")
print("|---|---:|---:|---:|---|")
for key, label, unit in (("p50", "4k randread QD=1 p50", "us"),
                         ("p999", "4k randread QD=1 p99.9", "us"),
                         ("iops128", "4k randread QD=128 IOPS", "")):
    a, b = statistics.median(m["a"][key]), statistics.median(m["b"][key])
    ratios = [x / y for x, y in zip(m["a"][key], m["b"][key])]
    print(f"| {label} | {a:,.3f} {unit} | {b:,.3f} {unit} | {a / b:.3f} | "
          f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")
PY
