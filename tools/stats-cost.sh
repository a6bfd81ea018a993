#!/usr/bin/env bash
# The cost of the device-side latency histograms (issue 12): PAIRS alternating pairs of
# virtiofs-bench runs, histograms on (the default) and off (`--no-latency-histograms`), the order
# within a pair swapped every other pair (on/off, off/on, ...) so a drift in the machine's load
# does not favour one setting. Prints per setting the median over the runs of the 4k randread
# QD=1 p50 and p99.9 and the IOPS at QD = queue size (128), and the median of the per-pair
# on/off ratios. Usage: tools/stats-cost.sh [PAIRS] (default 10); BENCH=path overrides the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-10}
bench=${BENCH:-target/release/virtiofs-bench}
[ -n "${BENCH:-}" ] || cargo build --release -q -p virtiofs-bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(--only "randread QD=1,randread QD=128" --rounds 1 --duration 2 --wakeup-requests 0 --json)
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((i = 0; i < pairs; i++)); do
    if ((i % 2 == 0)); then order=(on off); else order=(off on); fi
    for s in "${order[@]}"; do
        extra=()
        [ "$s" = off ] && extra=(--no-latency-histograms)
        "$bench" "${args[@]}" "${extra[@]}" >"$out/$s.$i.json" 2>/dev/null
    done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$pairs" <<'EOF'
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
def row(d, depth):
    return next(r for r in d["rows"] if r["workload"] == "4k randread" and r["depth"] == depth)
m = {s: {"p50": [], "p999": [], "iops128": []} for s in ("on", "off")}
for i in range(pairs):
    for s in ("on", "off"):
        d = json.load(open(f"{out}/{s}.{i}.json"))
        m[s]["p50"].append(row(d, 1)["p50_us"])
        m[s]["p999"].append(row(d, 1)["p999_us"])
        m[s]["iops128"].append(row(d, 128)["iops"])
print(f"{pairs} alternating pairs; medians over the runs, and the median of the per-pair on/off ratios")
print("| metric | on | off | median on / off | per-pair on / off median (min-max) |")
print("|---|---:|---:|---:|---|")
for key, label, unit in (("p50", "4k randread QD=1 p50", "us"),
                         ("p999", "4k randread QD=1 p99.9", "us"),
                         ("iops128", "4k randread QD=128 IOPS", "")):
    on, off = statistics.median(m["on"][key]), statistics.median(m["off"][key])
    ratios = [a / b for a, b in zip(m["on"][key], m["off"][key])]
    print(f"| {label} | {on:,.3f} {unit} | {off:,.3f} {unit} | {on / off:.3f} | "
          f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")
EOF
