#!/bin/bash
# tools/vm/compare-all.sh [--rounds N] [--out DIR] [compare.sh options...]: issue 13's whole guest
# comparison in one command, three compare.sh runs into OUT/{layouts,writeback,queues}, then every
# ratio table together (OUT/summary.md):
#   layouts    the four default jobs in both core layouts (shared: 2 vCPUs, nothing pinned;
#              dedicated: 1 vCPU, QEMU on core 0, the file server on core 1), ours vs virtiofsd;
#   writeback  the writeback seed, write-1m-buffered-2j (buffered 1 MiB writes, two jobs, final
#              fsync), shared layout, with writeback off and on for both servers;
#   queues     the core-local queue seed, seqwrite-1m-cpu1 (1 MiB O_DIRECT writes pinned to guest
#              CPU 1), shared layout, ours with one request queue (hw-configs/bench-guest.toml)
#              and with one per vCPU (hw-configs/bench-guest-2q.toml), each against virtiofsd.
# Options other than --rounds and --out go to every compare.sh run. Default 3 rounds: about
# 13 + 5 + 6 minutes on 2 TCG cores. Exit status 0 when every run passed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROUNDS=3
OUT=""
PASS=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
    *) PASS+=("$1"); shift ;;
  esac
done
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/vfdpu-compare-all.XXXXXX)
mkdir -p "$OUT"
rc=0
run() { # NAME compare.sh-args...
  local name=$1; shift
  echo "[compare-all $(date +%T)] $name: compare.sh $*" >&2
  bash "$HERE/compare.sh" --rounds "$ROUNDS" --out "$OUT/$name" "$@" ${PASS[@]+"${PASS[@]}"} > "$OUT/$name.log" 2>&1 || rc=1
}
run layouts --layouts shared,dedicated
run writeback --layouts shared --jobs write-1m-buffered-2j --writeback off,on --no-setup
run queues-1q --layouts shared --jobs seqwrite-1m-cpu1 --no-setup
run queues-2q --layouts shared --jobs seqwrite-1m-cpu1 --servers ours --config "$REPO/hw-configs/bench-guest-2q.toml" --no-setup
{
  echo "# Guest comparison, $(date -u +%FT%TZ), $ROUNDS rounds per run"
  for name in layouts writeback queues-1q queues-2q; do
    echo
    echo "## $name (OUT/$name; config: OUT/$name/config.txt)"
    [ -f "$OUT/$name/summary.md" ] && cat "$OUT/$name/summary.md" || echo "(no summary: see $OUT/$name.log)"
  done
} > "$OUT/summary.md"
cat "$OUT/summary.md"
exit $rc
