#!/bin/bash
# tools/vm/run-update-test.sh [--out DIR] [--config FILE] [--daemon PATH] [--updates N]
#                             [--backends LIST]
#
# Live update in a real guest (issue 22): one daemon started with --live-update serves a
# function per backend of LIST (comma-separated, default ram,shared,nfs,nfs41): a RAM
# filesystem, a shared directory (a tmpfs-backed directory beneath the profile's sandbox_root:
# the daemon is sandboxed, namespaces and seccomp, when run as root), an NFS export over NFSv3
# (nfs-ganesha, tools/nfs/ganesha.sh; needs root) and the same export over NFSv4.1 (nfs41:
# ?version=4.1, one ganesha for both). One QEMU has a vfio-user-pci device per function; the
# guest runs fsx and a fio job on every mount at once (guest/live-update.sh; each function's
# files are named by its tag, fsx.TAG.dat and fio.TAG.dat, so the two functions of one export
# write different files) while this script runs `virtiofs-dpu update` N times (default 10), one
# every UPDATE_GAP seconds (default 1). Every update must succeed, each fsx pass, fio report no
# error and the guest's kernel log stay clean; the files fsx left on the shared directory and
# the export are compared with the guest's copies. An nfs41 function's statistics (get_stats)
# are read before the first update and after the last: an EXCHANGE_ID and a session in the
# first process, sessions and no EXCHANGE_ID in the last (it went on as the same client). Prints each update's answer and fio's largest read and write latency per
# function (what the guest saw across the updates). The daemon must exit 0 on SIGTERM. --config:
# a profile whose top-level keys (not its tag or description) every function takes.
# Exit status 0 on success. Logs in OUT: daemon.log, console.log, updates.txt, run.txt,
# update.toml, ganesha/.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
. "$HERE/host-lib.sh"
DAEMON=${VFDPU_DAEMON:-$REPO/target/release/virtiofs-dpu}
CONFIG=${VFDPU_CONFIG:-}
OUT=${VM_OUT:-}
TAG=${VM_TAG:-vfdpu}
UPDATES=10
BACKENDS=ram,shared,nfs,nfs41
GAP=${UPDATE_GAP:-1}
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --daemon) DAEMON=$2; shift 2 ;;
    --updates) UPDATES=$2; shift 2 ;;
    --backends) BACKENDS=$2; shift 2 ;;
    *) echo "run-update-test: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/vm-update.XXXXXX)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
log() { echo "[update-test $(date +%T)] $*" | tee -a "$OUT/run.txt" >&2; }
: > "$OUT/run.txt"; : > "$OUT/updates.txt"
SOCKDIR=$(mktemp -d /tmp/vfdpu-update.XXXXXX)
CTL=$SOCKDIR/ctl.sock
GANESHA=$REPO/tools/nfs/ganesha.sh
SRV=$OUT/ganesha
DPID=""; GPID=""; NFS_UP=0; URL=""
# nfs_url: the export's URL (NFSv3) in URL; ganesha is started by the first function needing it.
nfs_url() {
  if [ -z "$URL" ]; then
    URL=$(bash "$GANESHA" start "$SRV")
    NFS_UP=1
    log "ganesha: $URL"
  fi
}
cleanup() {
  local rc=$?
  [ -z "$GPID" ] || { kill -TERM "$GPID" 2>/dev/null || true; wait "$GPID" 2>/dev/null || true; }
  [ -z "$DPID" ] || { kill -KILL "$DPID" 2>/dev/null || true; wait "$DPID" 2>/dev/null || true; }
  [ "$NFS_UP" = 0 ] || bash "$GANESHA" stop "$SRV" 2>/dev/null || true
  umount "$SOCKDIR/root" 2>/dev/null || true
  rm -rf "$SOCKDIR"
  return $rc
}
trap cleanup EXIT

# The profile: CONFIG's top-level keys, a sandbox root on a tmpfs, one table per function.
PROFILE=$OUT/update.toml
{
  echo "description = \"live update: one function per backend ($BACKENDS)\""
  [ -z "$CONFIG" ] || grep -v -E '^[[:space:]]*(tag|description)[[:space:]]*=' "$CONFIG"
} > "$PROFILE"
TAGS="" DEV=()
n=0
for b in ${BACKENDS//,/ }; do
  n=$((n + 1))
  sock=$SOCKDIR/$b.sock
  tag="$TAG-$b"
  TAGS="$TAGS $tag"
  DEV+=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$sock\"}}")
  printf '\n[[function]]\nsocket_path = "%s"\ntag = "%s"\n' "$sock" "$tag" >> "$PROFILE"
  case $b in
    ram) echo 'ramfs_size = "256M"' >> "$PROFILE" ;;
    shared)
      mkdir -p "$SOCKDIR/root"
      mount -t tmpfs -o size=512m,mode=0755 vfdpu-update "$SOCKDIR/root" 2>/dev/null ||
        log "no tmpfs mounted (not root?): the share is on $(df --output=fstype "$SOCKDIR" | tail -1)"
      mkdir -p "$SOCKDIR/root/share"
      sed -i "1a sandbox_root = \"$SOCKDIR/root\"" "$PROFILE"
      echo "shared_dir = \"$SOCKDIR/root/share\"" >> "$PROFILE" ;;
    nfs)
      nfs_url
      echo "remote = \"$URL\"" >> "$PROFILE" ;;
    nfs41)
      nfs_url
      NFSPORT=$(sed -n 's/.*[?&]nfsport=\([0-9]*\).*/\1/p' <<< "$URL")
      echo "remote = \"${URL%%\?*}?version=4.1&nfsport=$NFSPORT\"" >> "$PROFILE" ;;
    *) echo "run-update-test: unknown backend $b (ram, shared, nfs, nfs41)" >&2; exit 2 ;;
  esac
done
TAGS=${TAGS# }

"$DAEMON" --config "$PROFILE" --control-socket "$CTL" --live-update < /dev/null > "$OUT/daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 300); do [ -S "$CTL" ] && break; sleep 0.1; done
[ -S "$CTL" ] || { log "daemon never created its control socket"; cat "$OUT/daemon.log" >&2; exit 3; }
log "daemon up (supervisor pid $DPID): $n function(s), tags $TAGS"
# session41 WHEN: the nfs41 function's NFSv4.1 session counters (get_stats through the control
# socket) into OUT/stats-nfs41-WHEN.json; prints "EXCHANGE_IDS SESSIONS" (empty if unread).
session41() {
  ctl_rpc "$CTL" "{\"jsonrpc\":\"2.0\",\"method\":\"get_stats\",\"params\":{\"tag\":\"$TAG-nfs41\"},\"id\":1}" \
    > "$OUT/stats-nfs41-$1.json" 2>&1 || true
  python3 - "$OUT/stats-nfs41-$1.json" <<'PY' 2>/dev/null || true
import json, sys
r = json.load(open(sys.argv[1]))["result"]
assert r["tag"].endswith("-nfs41")
s = r["fuse"]["nfs"]["session"]
print(s["exchange_ids"], s["sessions"])
PY
}

bash "$HERE/run-guest.sh" --timeout "${VM_TIMEOUT:-300}" --log "$OUT/console.log" \
  -e "VM_TAGS=$TAGS" "$HERE/guest/live-update.sh" -- "${DEV[@]}" &
GPID=$!
for _ in $(seq 1800); do
  grep -aq '^UPDATE: go' "$OUT/console.log" 2>/dev/null && break
  kill -0 "$GPID" 2>/dev/null || break
  sleep 0.1
done
grep -aq '^UPDATE: go' "$OUT/console.log" || { log "the guest never started its I/O"; tail -30 "$OUT/console.log" >&2 || true; exit 1; }
sleep 1
fail=0
if [[ ,$BACKENDS, == *,nfs41,* ]]; then
  read -r x41 s41 <<< "$(session41 first)" || true
  x41_first=${x41:-}
  log "nfs41 before the updates: exchange_ids=${x41:-?} sessions=${s41:-?}"
  [ "${x41:-0}" -gt 0 ] && [ "${s41:-0}" -gt 0 ] ||
    { log "FAIL: nfs41: the first process shows no EXCHANGE_ID or no session (stats-nfs41-first.json)"; fail=1; }
fi
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
tr -d '\r' < "$OUT/console.log" | grep -a -E '^(VMRESULT:|fsx on )' | sed 's/^/  /' | tee -a "$OUT/run.txt" >&2 || true
# fio's largest completion latencies, as the guest saw them across the updates.
tr -d '\r' < "$OUT/console.log" | sed -n '/^VMFIO-JSON-BEGIN/,/^VMFIO-JSON-END/p' | sed '1d;$d' > "$OUT/fio.json" || true
python3 - "$OUT/fio.json" <<'PY' | tee -a "$OUT/run.txt" >&2 || { log "FAIL: no fio result"; fail=1; }
import json, sys
for job in json.load(open(sys.argv[1]))["jobs"]:
    for side in ("read", "write"):
        lat = job[side]["clat_ns"]
        print(f"guest fio {job['jobname']} {side}: {job[side]['io_bytes'] >> 20} MiB, errors {job['error']}, "
              f"clat p50 {lat['percentile'].get('50.000000', 0) / 1e3:.0f} us, "
              f"p99.9 {lat['percentile'].get('99.900000', 0) / 1e3:.0f} us, max {lat['max'] / 1e6:.1f} ms")
PY
[ "$(wc -l < "$OUT/updates.txt")" = "$UPDATES" ] || fail=1
# What fsx left, as the guest read it, against the host's copy (the share, the export).
for b in ${BACKENDS//,/ }; do
  n=fsx.$TAG-$b.dat
  case $b in shared) f=$SOCKDIR/root/share/$n ;; nfs|nfs41) f=$SRV/export/$n ;; *) continue ;; esac
  want=$(tr -d '\r' < "$OUT/console.log" | sed -n "s/^VMSUM: $TAG-$b //p" | tail -1)
  have=$(md5sum < "$f" 2>/dev/null | cut -d' ' -f1 || true)
  if [ -n "$want" ] && [ "$want" = "$have" ]; then
    log "$b: the host's $n matches the guest's ($have)"
  else
    log "FAIL: $b: the host's $n ($have) is not the guest's (${want:-none})"; fail=1
  fi
done
# The nfs41 function in the last process: sessions, and no EXCHANGE_ID (no new client made):
# the counters continue across updates, so the count is still the first process's.
# get_stats answers for one function, by tag (stats-TAG.json): fuse.nfs is null for the RAM fs
# and the share, and an NFSv3 function's fuse.nfs.session counters stay 0.
for t in $TAGS; do
  ctl_rpc "$CTL" "{\"jsonrpc\":\"2.0\",\"method\":\"get_stats\",\"params\":{\"tag\":\"$t\"},\"id\":1}" \
    > "$OUT/stats-$t.json" 2>&1 || true
done
if [[ ,$BACKENDS, == *,nfs,* ]]; then
  log "nfs (NFSv3) session counters: $(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["result"]["fuse"]["nfs"]["session"]
print("exchange_ids=%d sessions=%d calls=%d" % (s["exchange_ids"], s["sessions"], s["calls"]))' "$OUT/stats-$TAG-nfs.json" 2>/dev/null || echo unread)"
fi
if [[ ,$BACKENDS, == *,nfs41,* ]]; then
  read -r x41 s41 <<< "$(session41 last)" || true
  log "nfs41 after the updates (last process): exchange_ids=${x41:-?} sessions=${s41:-?} (first process: ${x41_first:-?})"
  [ -n "${x41_first:-}" ] && [ "${x41:-x}" = "$x41_first" ] && [ "${s41:-0}" -gt 0 ] ||
    { log "FAIL: nfs41: the last process made an EXCHANGE_ID or has no session (stats-nfs41-last.json)"; fail=1; }
fi
kill -TERM "$DPID"
drc=0; wait "$DPID" || drc=$?
DPID=""
[ "$drc" = 0 ] || { log "FAIL: daemon exit status $drc after SIGTERM"; fail=1; }
grep -a 'ERROR' "$OUT/daemon.log" | head -5 >&2 || true
log "guest rc=$grc; $(wc -l < "$OUT/updates.txt") update(s); daemon exit $drc"
[ "$grc" = 0 ] && [ "$fail" = 0 ]
