#!/bin/bash
# tools/vm/run-crash-test.sh [--out DIR] [--config FILE] [--daemon PATH]
#
# Crash recovery in a real guest (issue 24): a daemon started with --live-update serves one
# RAM-filesystem function to a QEMU guest that reads from it in a loop (guest/crash.sh); the
# serving process is killed with SIGKILL. The supervisor starts a new process that takes the
# function over from its checkpoint on the same QEMU connection: the guest's reads must not
# hang (the RAM filesystem's state is gone: they answer EIO), and after the guest lets the
# device go and takes it again, a fresh filesystem mounts. The daemon must count one recovery
# and exit 0 on SIGTERM. Exit status 0 on success. Logs in OUT: daemon.log, console.log,
# run.txt, crash.toml.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DAEMON=${VFDPU_DAEMON:-$REPO/target/release/virtiofs-dpu}
CONFIG=${VFDPU_CONFIG:-}
OUT=${VM_OUT:-}
TAG=${VM_TAG:-vfdpu}
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --daemon) DAEMON=$2; shift 2 ;;
    *) echo "run-crash-test: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/vm-crash.XXXXXX)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
log() { echo "[crash-test $(date +%T)] $*" | tee -a "$OUT/run.txt" >&2; }
: > "$OUT/run.txt"
SOCKDIR=$(mktemp -d /tmp/vfdpu-crash.XXXXXX)
CTL=$SOCKDIR/ctl.sock SOCK=$SOCKDIR/fs.sock
DPID=""; GPID=""
cleanup() {
  local rc=$?
  [ -z "$GPID" ] || { kill -TERM "$GPID" 2>/dev/null || true; wait "$GPID" 2>/dev/null || true; }
  [ -z "$DPID" ] || { kill -KILL "$DPID" 2>/dev/null || true; wait "$DPID" 2>/dev/null || true; }
  rm -rf "$SOCKDIR"
  return $rc
}
trap cleanup EXIT
PROFILE=$OUT/crash.toml
{
  echo 'description = "crash recovery: one RAM filesystem function"'
  [ -z "$CONFIG" ] || grep -v -E '^[[:space:]]*(tag|description)[[:space:]]*=' "$CONFIG"
  printf '\n[[function]]\nsocket_path = "%s"\ntag = "%s"\nramfs_size = "64M"\n' "$SOCK" "$TAG"
} > "$PROFILE"
"$DAEMON" --config "$PROFILE" --control-socket "$CTL" --live-update < /dev/null > "$OUT/daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 300); do [ -S "$CTL" ] && [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$CTL" ] || { log "daemon never created its control socket"; cat "$OUT/daemon.log" >&2; exit 3; }
log "daemon up (supervisor pid $DPID)"
bash "$HERE/run-guest.sh" --timeout "${VM_TIMEOUT:-300}" --log "$OUT/console.log" \
  -e "VM_TAG=$TAG" "$HERE/guest/crash.sh" -- \
  -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$SOCK\"}}" &
GPID=$!
for _ in $(seq 3000); do
  grep -aq '^CRASH: go' "$OUT/console.log" 2>/dev/null && break
  kill -0 "$GPID" 2>/dev/null || break
  sleep 0.1
done
grep -aq '^CRASH: go' "$OUT/console.log" || { log "the guest never started reading"; tail -30 "$OUT/console.log" >&2 || true; exit 1; }
serving=$(pgrep -P "$DPID" | head -1)
[ -n "$serving" ] || { log "no serving process under the supervisor"; exit 1; }
kill -KILL "$serving"
log "killed the serving process $serving"
fail=0
grc=0; wait "$GPID" || grc=$?
GPID=""
tr -d '\r' < "$OUT/console.log" | grep -a '^crash: \|^VMRESULT:' | sed 's/^/  /' >&2 || true
recoveries=$("$DAEMON" stats --control-socket "$CTL" --json 2>/dev/null |
  python3 -c 'import json,sys; print(json.load(sys.stdin).get("recoveries"))' 2>/dev/null || echo "?")
log "recoveries counted: $recoveries"
[ "$recoveries" = 1 ] || { log "FAIL: the daemon counts $recoveries recoveries, not 1"; fail=1; }
grep -a 'supervisor: .*recovery 1\|recovered: ' "$OUT/daemon.log" | sed 's/^/  /' >&2 || true
# The kill found requests in flight (an F_SETLKW waits), and the new process took them again.
replayed=$(grep -a 'recovered: ' "$OUT/daemon.log" | sed -n 's/.* \([0-9][0-9]*\) chain(s) in flight taken again.*/\1/p' |
  awk '{s += $1} END {print s + 0}')
log "chains in flight at the kill, taken again by the new process: $replayed"
[ "$replayed" -gt 0 ] || { log "FAIL: nothing was in flight at the kill: the stage did not test it"; fail=1; }
"$DAEMON" stats --control-socket "$CTL" --json 2>/dev/null | python3 -c 'import json,sys; print("checkpoints:", json.load(sys.stdin).get("checkpoints"))' >&2 || true
kill -TERM "$DPID"
drc=0; wait "$DPID" || drc=$?
DPID=""
[ "$drc" = 0 ] || { log "FAIL: daemon exit status $drc after SIGTERM"; fail=1; }
log "guest rc=$grc; daemon exit $drc"
[ "$grc" = 0 ] && [ "$fail" = 0 ]
