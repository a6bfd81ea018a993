#!/bin/bash
# tools/vm/run-fault-test.sh [--out DIR] [--config FILE] [--daemon PATH]
#
# One daemon, two QEMUs: the first guest writes files in a loop and QEMU is killed with SIGKILL
# in the middle of a write; the daemon must keep serving, and a second QEMU attaches, mounts and
# finds every completed file intact. At the end the daemon must exit 0 on SIGTERM.
# Exit status 0 on success. Logs in OUT: daemon.log, console1.log, console2.log, run.txt.
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
    *) echo "run-fault-test: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/vm-fault.XXXXXX)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
log() { echo "[fault-test $(date +%T)] $*" | tee -a "$OUT/run.txt" >&2; }
: > "$OUT/run.txt"
SOCKDIR=$(mktemp -d /tmp/vfdpu-fault.XXXXXX)
SOCK=$SOCKDIR/dev.sock
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
RG=(bash "$HERE/run-guest.sh" --append "vm.tag=$TAG" --timeout "${VM_TIMEOUT:-300}")

args=(--socket-path "$SOCK" --tag "$TAG"); [ -z "$CONFIG" ] || args+=(--config "$CONFIG")
"$DAEMON" "${args[@]}" < /dev/null > "$OUT/daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 300); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { log "daemon never created its socket"; exit 3; }
log "daemon up (pid $DPID)"

# QEMU 1: writer, killed mid-write.
"${RG[@]}" --log "$OUT/console1.log" "$HERE/guest/fault-writer.sh" -- "${DEV[@]}" &
GPID=$!
for _ in $(seq 1800); do
  n=$(grep -ac '^FAULT: wrote' "$OUT/console1.log" 2>/dev/null || true)
  [ "${n:-0}" -ge 5 ] && break
  kill -0 "$GPID" 2>/dev/null || break
  sleep 0.1
done
[ "${n:-0}" -ge 5 ] || { log "writer guest never got going"; tail -20 "$OUT/console1.log" >&2 || true; exit 1; }
# The QEMU process itself (not its timeout/bash wrappers, not the daemon, which also has SOCK
# on its command line).
QPID=""
for p in $(pgrep -f -- "$SOCK" || true); do
  [ "$p" = "$DPID" ] && continue
  case $(cat "/proc/$p/comm" 2>/dev/null) in timeout|bash|sh|"") continue ;; esac
  QPID=$p
done
[ -n "$QPID" ] || { log "cannot find the first QEMU"; exit 1; }
sleep 0.3   # land in the middle of the next write
log "killing QEMU $QPID ($(cat /proc/$QPID/comm)) with SIGKILL after $n files"
kill -KILL "$QPID"
wait "$GPID" 2>/dev/null || true
GPID=""
sleep 0.5
kill -0 "$DPID" 2>/dev/null || { log "FAIL: the daemon died with its client"; exit 3; }
log "daemon still running"

# QEMU 2: a new client attaches, mounts, checks.
grc=0
"${RG[@]}" --log "$OUT/console2.log" "$HERE/guest/fault-check.sh" -- "${DEV[@]}" || grc=$?
tr -d '\r' < "$OUT/console2.log" | grep -a '^VMRESULT:' | sed 's/^/  /' >&2 || true
kill -TERM "$DPID"
drc=0; wait "$DPID" || drc=$?
DPID=""
[ "$drc" = 0 ] || { log "FAIL: daemon exit status $drc after SIGTERM"; exit 3; }
log "second guest rc=$grc; daemon exited 0"
exit "$grc"
