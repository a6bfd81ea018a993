#!/bin/bash
# tools/vm/run-nfs41-locks-test.sh [--out DIR] [--daemon PATH] [--config FILE] [--url URL] [--no-knfs]
#
# Locks across clients of one NFSv4.1 export (issue 23), in one guest: one daemon serves two
# functions (two vfio-user sockets, tags vfl-a and vfl-b) whose backends are the same ganesha
# export over NFSv4.1, each with an NFS client id of its own; one QEMU attaches both as
# vfio-user-pci devices and has a virtio-net NIC on user networking (restrict=on) whose only way
# out is a guestfwd to the server's NFS port, so the guest kernel's own NFSv4.1 client mounts the
# export too (a second client of it: CACHE/alt/knfs, the trixie kernel with its NFS modules, made
# by VM_GUEST_NFS=1 setup.sh and build-guest.sh). guest/nfs41-locks.sh mounts both tags and the
# kernel client and runs `locktest cross`: a write lock held through one mount (fcntl range, or
# flock) makes F_SETLK (LOCK_NB) through another EAGAIN and F_GETLK show it, and a F_SETLKW
# (LOCK_EX) through the other waits until the holder's process is killed with SIGKILL, then is
# granted: device A against device B both ways, the kernel client against device A both ways.
# Afterwards the host reads each function's NFSv4.1 lock counters through the control socket
# (both must have called LOCK and seen a denial), and the daemon must exit 0 on SIGTERM.
#   --url URL   the export, an NFSv4.1 URL (nfs://127.0.0.1/PATH?version=4.1&nfsport=N) of a
#               running ganesha (ci.sh's nfs41 stage passes its own); default: a ganesha started
#               here (tools/nfs/ganesha.sh, needs root) and stopped at the end
#   --config F  profile whose top-level keys the daemon's profile takes (ci.sh: hw-configs/ci.toml)
#   --no-knfs   no kernel client: the device-to-device checks only
# Env: VFDPU_DAEMON, VM_CACHE, VM_TIMEOUT (300), LOCKS_HOLD_MS (1500), NFS41_LOCK_CHECKS (the
# guest's, e.g. "posix:a:b"). An NFSv3 export is refused: there each device keeps its own locks
# and the checks fail (got the lock through the other device). Logs in OUT: daemon.log,
# daemon.toml, console.log, run.txt, stats-a.json, stats-b.json. Exit status 0 on success.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
. "$HERE/host-lib.sh"
DAEMON=${VFDPU_DAEMON:-$REPO/target/release/virtiofs-dpu}
CACHE=${VM_CACHE:-/var/tmp/virtiofs-dpu-vm}
OUT=${VM_OUT:-}
CONFIG=""
URL41=""
KNFS=1
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --daemon) DAEMON=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --url) URL41=$2; shift 2 ;;
    --no-knfs) KNFS=0; shift ;;
    *) echo "run-nfs41-locks-test: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/vm-nfs41locks.XXXXXX)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
: > "$OUT/run.txt"
log() { echo "[nfs41-locks $(date +%T)] $*" | tee -a "$OUT/run.txt" >&2; }
GUEST_CACHE=$CACHE
if [ $KNFS = 1 ]; then
  GUEST_CACHE=$(cd "$CACHE" && pwd)/alt/knfs
  [ -e "$GUEST_CACHE/guest/base.cpio" ] ||
    { log "no $GUEST_CACHE: run VM_GUEST_NFS=1 tools/vm/setup.sh and build-guest.sh"; exit 2; }
fi
W=$(mktemp -d /tmp/vfdpu-locks41.XXXXXX)
NFSD="" DPID="" GPID=""
cleanup() {
  local rc=$?
  [ -z "$GPID" ] || { kill -TERM "$GPID" 2>/dev/null || true; wait "$GPID" 2>/dev/null || true; }
  [ -z "$DPID" ] || { kill -KILL "$DPID" 2>/dev/null || true; wait "$DPID" 2>/dev/null || true; }
  [ -z "$NFSD" ] || bash "$REPO/tools/nfs/ganesha.sh" stop "$NFSD" > /dev/null 2>&1 || true
  rm -rf "$W"
  return $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -z "$URL41" ]; then
  NFSD=$W/nfs
  URL=$(bash "$REPO/tools/nfs/ganesha.sh" start "$NFSD" 2>> "$OUT/run.txt")
  URL41="${URL%%\?*}?version=4.1&nfsport=$(sed -n 's/.*[?&]nfsport=\([0-9]*\).*/\1/p' <<< "$URL")"
fi
# nfs://127.0.0.1/PATH?version=4.1&nfsport=N: PATH is the export's NFSv4 pseudo path too.
EXPORT=$(sed -n 's|^nfs://127\.0\.0\.1\(/[^?]*\)?.*|\1|p' <<< "$URL41")
NPORT=$(sed -n 's/.*[?&]nfsport=\([0-9]*\).*/\1/p' <<< "$URL41")
[ -n "$EXPORT" ] && [ -n "$NPORT" ] && [[ $URL41 == *version=4.1* ]] ||
  { log "not an NFSv4.1 URL on 127.0.0.1 with nfsport=: $URL41"; exit 2; }
log "export: $URL41"

# The profile: CONFIG's top-level keys, two functions on the same export.
SA=$W/a.sock SB=$W/b.sock CTL=$W/ctl.sock
{
  echo 'description = "two functions on one NFSv4.1 export (locks across clients)"'
  [ -z "$CONFIG" ] || grep -v -E '^[[:space:]]*(tag|description)[[:space:]]*=' "$CONFIG"
  for f in a b; do
    printf '\n[[function]]\nsocket_path = "%s"\ntag = "vfl-%s"\nremote = "%s"\n' "$W/$f.sock" "$f" "$URL41"
  done
} > "$OUT/daemon.toml"
"$DAEMON" --config "$OUT/daemon.toml" --control-socket "$CTL" < /dev/null > "$OUT/daemon.log" 2>&1 &
DPID=$!
wait_sockets 300 "$SA" "$SB" "$CTL" || { log "daemon never created its sockets"; cat "$OUT/daemon.log" >&2; exit 3; }
log "daemon up (pid $DPID): two functions on the export"

QEMU_ARGS=(-device "$(vfu_device "$SA")" -device "$(vfu_device "$SB")")
GUEST_ENV=(-e VM_TAG_A=vfl-a -e VM_TAG_B=vfl-b -e "LOCKS_HOLD_MS=${LOCKS_HOLD_MS:-1500}")
[ -z "${NFS41_LOCK_CHECKS:-}" ] || GUEST_ENV+=(-e "NFS41_LOCK_CHECKS=$NFS41_LOCK_CHECKS")
if [ $KNFS = 1 ]; then
  QEMU_ARGS+=(-netdev "$(knfs_netdev "$NPORT")" -device virtio-net-pci,netdev=n0)
  GUEST_ENV+=(-e "KNFS_PORT=$NPORT" -e "KNFS_EXPORT=$EXPORT")
fi
t0=$(date +%s)
set +e
bash "$HERE/run-guest.sh" --cache "$GUEST_CACHE" --log "$OUT/console.log" --timeout "${VM_TIMEOUT:-300}" \
  "${GUEST_ENV[@]}" "$HERE/guest/nfs41-locks.sh" -- "${QEMU_ARGS[@]}" &
GPID=$!
wait "$GPID"; grc=$?
set -e
GPID=""
log "guest rc=$grc ($(( $(date +%s) - t0 )) s)"
fail=0
[ "$grc" = 0 ] || fail=1
tr -d '\r' < "$OUT/console.log" | grep -a -E '^(VMRESULT|nfs41-locks: |\[(posix|flock) )' | tee -a "$OUT/run.txt" >&2 || true

# Each function's NFSv4.1 lock counters: both took locks on the server, were denied there and
# had a SETLKW waiting on the server (a -> b and b -> a).
for f in a b; do
  ctl_rpc "$CTL" "{\"jsonrpc\":\"2.0\",\"method\":\"get_stats\",\"params\":{\"tag\":\"vfl-$f\"},\"id\":1}" \
    > "$OUT/stats-$f.json" || true
  locks=$(python3 -c '
import json, sys
l = json.load(open(sys.argv[1]))["result"]["fuse"]["nfs"]["locks"]
print(" ".join(f"{k}={v}" for k, v in l.items()), "ok" if min(l["calls"], l["denied"], l["waits"]) > 0 else "none")
' "$OUT/stats-$f.json" 2>/dev/null || true)
  log "function vfl-$f NFSv4.1 lock counters: ${locks% *}"
  [[ $locks == *" ok" ]] || { log "FAIL: function vfl-$f: no lock call, denial or wait on the server"; fail=1; }
done
kill -TERM "$DPID"
set +e
timeout 10 tail --pid="$DPID" -f /dev/null
wait "$DPID"; drc=$?
set -e
DPID=""
log "daemon exit status $drc"
[ "$drc" = 0 ] || fail=1
[ "$fail" = 0 ] && log "NFSv4.1 locks across clients: ok" || log "NFSv4.1 locks across clients: FAILED (logs in $OUT)"
exit "$fail"
