#!/bin/bash
# tools/vm/run-update-test.sh [--out DIR] [--config FILE] [--daemon PATH] [--updates N]
#
# Live update in a real guest (issue 22): a daemon started with --live-update serves a RAM
# filesystem; the guest runs fsx and a fio job on it (guest/live-update.sh) while this script
# runs `virtiofs-dpu update` N times (default 10), one every UPDATE_GAP seconds (default 1).
# Every update must succeed, fsx pass, fio report no error and the guest's kernel log stay
# clean. Prints each update's answer, the serving process ids, and fio's largest read and
# write latency (what the guest saw across the updates). The daemon must exit 0 on SIGTERM.
# Exit status 0 on success. Logs in OUT: daemon.log, console.log, updates.txt, run.txt.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DAEMON=${VFDPU_DAEMON:-$REPO/target/release/virtiofs-dpu}
CONFIG=${VFDPU_CONFIG:-}
OUT=${VM_OUT:-}
TAG=${VM_TAG:-vfdpu}
UPDATES=10
GAP=${UPDATE_GAP:-1}
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --daemon) DAEMON=$2; shift 2 ;;
    --updates) UPDATES=$2; shift 2 ;;
    *) echo "run-update-test: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/vm-update.XXXXXX)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
log() { echo "[update-test $(date +%T)] $*" | tee -a "$OUT/run.txt" >&2; }
: > "$OUT/run.txt"; : > "$OUT/updates.txt"
SOCKDIR=$(mktemp -d /tmp/vfdpu-update.XXXXXX)
SOCK=$SOCKDIR/dev.sock
CTL=$SOCKDIR/ctl.sock
DPID=""; GPID=""
cleanup() {
  local rc=$?
  [ -z "$GPID" ] || { kill -TERM "$GPID" 2>/dev/null || true; wait "$GPID" 2>/dev/null || true; }
  [ -z "$DPID" ] || { kill -KILL "$DPID" 2>/dev/null || true; wait "$DPID" 2>/dev/null || true; }
  rm -rf "$SOCKDIR"
  return $rc
}
trap cleanup EXIT
DEV=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$SOCK\"}}")

args=(--socket-path "$SOCK" --control-socket "$CTL" --live-update --tag "$TAG" --ramfs-size 256M)
[ -z "$CONFIG" ] || args+=(--config "$CONFIG")
"$DAEMON" "${args[@]}" < /dev/null > "$OUT/daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 300); do [ -S "$SOCK" ] && [ -S "$CTL" ] && break; sleep 0.1; done
[ -S "$CTL" ] || { log "daemon never created its sockets"; cat "$OUT/daemon.log" >&2; exit 3; }
log "daemon up (supervisor pid $DPID)"

bash "$HERE/run-guest.sh" --append "vm.tag=$TAG" --timeout "${VM_TIMEOUT:-300}" --log "$OUT/console.log" \
  "$HERE/guest/live-update.sh" -- "${DEV[@]}" &
GPID=$!
for _ in $(seq 1800); do
  grep -aq '^UPDATE: go' "$OUT/console.log" 2>/dev/null && break
  kill -0 "$GPID" 2>/dev/null || break
  sleep 0.1
done
grep -aq '^UPDATE: go' "$OUT/console.log" || { log "the guest never started its I/O"; tail -30 "$OUT/console.log" >&2 || true; exit 1; }
sleep 1
fail=0
for i in $(seq "$UPDATES"); do
  if grep -aq '^UPDATE: done' "$OUT/console.log"; then
    log "FAIL: the guest's I/O ended before update $i (lengthen FIO_SECONDS)"; fail=1; break
  fi
  if answer=$("$DAEMON" update --control-socket "$CTL" 2>&1); then
    echo "$answer" >> "$OUT/updates.txt"
    log "update $i: $answer"
  else
    log "FAIL: update $i: $answer"; fail=1; break
  fi
  sleep "$GAP"
done
grc=0; wait "$GPID" || grc=$?
GPID=""
tr -d '\r' < "$OUT/console.log" | grep -a '^VMRESULT:' | sed 's/^/  /' >&2 || true
# fio's largest completion latencies, as the guest saw them across the updates.
tr -d '\r' < "$OUT/console.log" | sed -n '/^VMFIO-JSON-BEGIN/,/^VMFIO-JSON-END/p' | sed '1d;$d' > "$OUT/fio.json" || true
python3 - "$OUT/fio.json" <<'PY' | tee -a "$OUT/run.txt" >&2 || { log "FAIL: no fio result"; fail=1; }
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
for side in ("read", "write"):
    lat = job[side]["clat_ns"]
    print(f"guest fio {side}: {job[side]['io_bytes'] >> 20} MiB, errors {job['error']}, "
          f"clat p50 {lat['percentile'].get('50.000000', 0) / 1e3:.0f} us, "
          f"p99.9 {lat['percentile'].get('99.900000', 0) / 1e3:.0f} us, max {lat['max'] / 1e6:.1f} ms")
PY
[ "$(wc -l < "$OUT/updates.txt")" = "$UPDATES" ] || fail=1
kill -TERM "$DPID"
drc=0; wait "$DPID" || drc=$?
DPID=""
[ "$drc" = 0 ] || { log "FAIL: daemon exit status $drc after SIGTERM"; fail=1; }
grep -a 'ERROR' "$OUT/daemon.log" | head -5 >&2 || true
log "guest rc=$grc; $(wc -l < "$OUT/updates.txt") update(s); daemon exit $drc"
[ "$grc" = 0 ] && [ "$fail" = 0 ]
