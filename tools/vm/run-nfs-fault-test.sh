#!/bin/bash
# tools/vm/run-nfs-fault-test.sh [--out DIR] [--config FILE] [--daemon PATH]
#
# The NFS backend survives its server's crash: ganesha (tools/nfs/ganesha.sh) exports a fresh
# directory, our daemon serves it (--remote), and a guest writes 1 MiB files with their checksums
# (guest/nfs-fault-writer.sh). After the first files, ganesha is killed with SIGKILL, left down
# for NFS_OUTAGE seconds (2; shorter than the daemon's timeout) and started again on the same
# ports; the guest goes on writing. Passes when no guest write failed, the guest finds every file
# intact after drop_caches and a remount, the host finds every file intact in the export
# directory itself, the daemon reconnected (its statistics) and exits 0 on SIGTERM.
# Logs in OUT: daemon.log, console.log, ganesha/ (the server's directory), run.txt, stats.json.
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
    *) echo "run-nfs-fault-test: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/vm-nfs-fault.XXXXXX)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
log() { echo "[nfs-fault $(date +%T)] $*" | tee -a "$OUT/run.txt" >&2; }
: > "$OUT/run.txt"
GANESHA=$REPO/tools/nfs/ganesha.sh
SRV=$OUT/ganesha
SOCKDIR=$(mktemp -d /tmp/vfdpu-nfsf.XXXXXX)
SOCK=$SOCKDIR/dev.sock
DPID=""; GPID=""
cleanup() {
  local rc=$?
  [ -z "$GPID" ] || { kill -TERM "$GPID" 2>/dev/null || true; wait "$GPID" 2>/dev/null || true; }
  [ -z "$DPID" ] || { kill -KILL "$DPID" 2>/dev/null || true; wait "$DPID" 2>/dev/null || true; }
  bash "$GANESHA" stop "$SRV" 2>/dev/null || true
  rm -rf "$SOCKDIR"
  return $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

URL=$(bash "$GANESHA" start "$SRV")
log "ganesha: $URL"
args=(--socket-path "$SOCK" --tag "$TAG" --remote "$URL" --stats-file "$OUT/stats.json")
[ -z "$CONFIG" ] || args+=(--config "$CONFIG")
"$DAEMON" "${args[@]}" < /dev/null > "$OUT/daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 300); do grep -q 'listening on' "$OUT/daemon.log" && break; kill -0 "$DPID" || break; sleep 0.1; done
grep -q 'listening on' "$OUT/daemon.log" || { log "daemon did not start"; tail -20 "$OUT/daemon.log" >&2; exit 3; }
log "daemon up (pid $DPID)"

DEV=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$SOCK\"}}")
bash "$HERE/run-guest.sh" --append "vm.tag=$TAG" --timeout "${VM_TIMEOUT:-600}" --log "$OUT/console.log" \
  -e "NFS_FAULT_FILES=${NFS_FAULT_FILES:-60}" "$HERE/guest/nfs-fault-writer.sh" -- "${DEV[@]}" &
GPID=$!
written() { grep -ac '^FAULT: wrote' "$OUT/console.log" 2>/dev/null || true; }
n=0
for _ in $(seq 3000); do
  n=$(written)
  [ "${n:-0}" -ge 5 ] && break
  kill -0 "$GPID" 2>/dev/null || break
  sleep 0.1
done
[ "${n:-0}" -ge 5 ] || { log "the writer guest never got going"; tail -20 "$OUT/console.log" >&2 || true; exit 1; }
log "killing ganesha with SIGKILL after $n files; down for ${NFS_OUTAGE:-2} s"
bash "$GANESHA" kill "$SRV"
sleep "${NFS_OUTAGE:-2}"
during=$(written)
bash "$GANESHA" start "$SRV" > /dev/null
log "ganesha restarted ($during files written when it came back)"
grc=0
wait "$GPID" || grc=$?
GPID=""
tr -d '\r' < "$OUT/console.log" | grep -a -E '^(VMRESULT|nfs-fault: )' | sed 's/^/  /' >&2 || true
final=$(written)
[ "${final:-0}" -gt "${during:-0}" ] || { log "FAIL: no file written after the restart"; grc=1; }

# The data is on the server: every file against its checksum, read from the export itself.
bad=0; nf=0
for sum in "$SRV"/export/fault/*.sha; do
  [ -e "$sum" ] || continue
  f=${sum%.sha}
  [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$(cat "$sum")" ] || { log "FAIL: $f differs on the server"; bad=1; }
  nf=$((nf + 1))
done
[ "$nf" -ge "${NFS_FAULT_FILES:-60}" ] || { log "FAIL: $nf files on the server"; bad=1; }
[ $bad = 0 ] || grc=1
kill -TERM "$DPID"
drc=0; wait "$DPID" || drc=$?
DPID=""
[ "$drc" = 0 ] || { log "FAIL: daemon exit status $drc after SIGTERM"; grc=3; }
reconnects=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["fuse"]["nfs"]["reconnects"])' "$OUT/stats.json" 2>/dev/null || echo 0)
[ "${reconnects:-0}" -ge 1 ] || { log "FAIL: the daemon reports no reconnect"; grc=1; }
if grep -a 'seccomp: system call' "$OUT/daemon.log"; then log "FAIL: a system call outside the allowlist"; grc=1; fi
log "guest rc=$grc, $nf files verified on the server, $reconnects reconnect(s); daemon exited $drc"
exit "$grc"
