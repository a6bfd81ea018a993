#!/usr/bin/env bash
# The cost of the in-flight records crash recovery keeps (issue 24): tools/bench-pairs.sh with
# the split queues' tracking on (`--inflight-tracking`) and off (the bench's default), in PAIRS
# alternating pairs.
# Usage: tools/tracking-cost.sh [PAIRS] (default 10); BENCH=path overrides the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${BENCH:-target/release/virtiofs-bench}
[ -n "${BENCH:-}" ] || cargo build --release -q -p virtiofs-bench
A="$bench --inflight-tracking" B="$bench" LABELS="on off" exec tools/bench-pairs.sh "${1:-10}"
