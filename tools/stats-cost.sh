#!/usr/bin/env bash
# The cost of the device-side latency histograms (issue 12): tools/bench-pairs.sh with the
# histograms on (the default) and off (`--no-latency-histograms`), in PAIRS alternating pairs.
# Usage: tools/stats-cost.sh [PAIRS] (default 10); BENCH=path overrides the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${BENCH:-target/release/virtiofs-bench}
[ -n "${BENCH:-}" ] || cargo build --release -q -p virtiofs-bench
A="$bench" B="$bench --no-latency-histograms" LABELS="on off" exec tools/bench-pairs.sh "${1:-10}"
