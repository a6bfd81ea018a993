#!/bin/bash
# tools/vm/run-nfs-crash-test.sh [--out DIR] [--config FILE] [--daemon PATH] [--kills N]
#
# Crash recovery of an NFS function in a real guest (issue 24): ganesha (tools/nfs/ganesha.sh)
# exports a fresh directory; a daemon started with --live-update serves it as one NFS function
# (--remote) to a QEMU guest that runs fsx on it (guest/nfs-crash.sh, NFS_CRASH_FSX_OPS
# operations, default 5000). Once fsx starts, the serving process is killed with SIGKILL N
# times (default 5, the default --crash-limit) at random moments: before each kill a pause of
# 0.5-3 s ($RANDOM, seeded with NFS_CRASH_SEED, printed), and after it a wait until the new
# process serves (its control socket answers with `recoveries` one higher, a new pid under the
# supervisor). Each new process recovers the export's node table, handles, UNSTABLE store and
# FUSE session from the dead one's records and executes the requests in flight again: beside
# fsx the guest keeps an F_SETLKW waiting in the device for a lock another process holds for
# NFS_CRASH_LOCK_MS (10 s), which must wait on across the kills and be granted once it goes.
# Passes when every kill came while fsx ran, fsx ends A-OK, the F_SETLKW is granted after the
# holder let go (not before), chains in flight were taken again, the guest's kernel log is clean,
# the file fsx left (read by the guest after drop_caches, and before) has the checksum of the
# file in the export directory, the daemon counts N recoveries with no NFS state lost, and it
# exits 0 on SIGTERM. Prints the time from each kill until the new process served, and the
# wall time. Needs root (ganesha's FSAL_VFS) and the VM cache of tools/vm/setup.sh; builds the
# release daemon if it is missing. Exit status 0 on success.
# Logs in OUT: daemon.log, console.log, run.txt, kills.txt, nfs-crash.toml, stats-*.json,
# ganesha/ (the server's directory: export/fsx.dat is what fsx left).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DAEMON=${VFDPU_DAEMON:-$REPO/target/release/virtiofs-dpu}
CONFIG=${VFDPU_CONFIG:-}
OUT=${VM_OUT:-}
TAG=${VM_TAG:-vfdpu}
KILLS=5
OPS=${NFS_CRASH_FSX_OPS:-5000}
SEED=${NFS_CRASH_SEED:-$(( $(date +%s) % 32768 ))}
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --daemon) DAEMON=$2; shift 2 ;;
    --kills) KILLS=$2; shift 2 ;;
    *) echo "run-nfs-crash-test: unknown argument $1" >&2; exit 2 ;;
  esac
done
T_START=$(date +%s%N)
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/vm-nfs-crash.XXXXXX)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
log() { echo "[nfs-crash $(date +%T)] $*" | tee -a "$OUT/run.txt" >&2; }
: > "$OUT/run.txt"; : > "$OUT/kills.txt"
# Nothing of an earlier run in OUT may be read as this one's (its console's go line above all).
rm -f "$OUT"/stats-*.json "$OUT"/console.log "$OUT"/console.log.*
GANESHA=$REPO/tools/nfs/ganesha.sh
SRV=$OUT/ganesha
SOCKDIR=$(mktemp -d /tmp/vfdpu-nfscrash.XXXXXX)
CTL=$SOCKDIR/ctl.sock SOCK=$SOCKDIR/fs.sock
DPID=""; GPID=""; NFS_UP=0
# alive PID: the process exists and is not a zombie (an exited child not waited for yet).
alive() { [ -n "$(ps -o stat= -p "$1" 2>/dev/null | grep -v Z)" ]; }
cleanup() {
  local rc=$?
  [ -z "$GPID" ] || { kill -TERM "$GPID" 2>/dev/null || true; wait "$GPID" 2>/dev/null || true; }
  # The supervisor and its serving process: SIGTERM ends both; after 5 s SIGKILL to each (to
  # the supervisor alone it would leave the child).
  if [ -n "$DPID" ]; then
    local kids n=50
    kids=$(pgrep -P "$DPID" 2>/dev/null || true)
    kill -TERM "$DPID" 2>/dev/null || true
    while [ $n -gt 0 ] && alive "$DPID"; do sleep 0.1; n=$((n - 1)); done
    kill -KILL "$DPID" 2>/dev/null || true
    # shellcheck disable=SC2086 # pids, one per word
    [ -z "$kids" ] || kill -KILL $kids 2>/dev/null || true
    wait "$DPID" 2>/dev/null || true
  fi
  [ "$NFS_UP" = 0 ] || bash "$GANESHA" stop "$SRV" 2>/dev/null || true
  rm -rf "$SOCKDIR"
  return $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
elapsed() { echo $(( ($(date +%s%N) - $1) / 1000000 )); } # ms since T (date +%s%N)

if [ ! -x "$DAEMON" ] && [ "$DAEMON" = "$REPO/target/release/virtiofs-dpu" ]; then
  log "building the release daemon"
  (cd "$REPO" && nice cargo build --release -q -p virtiofs-dpu)
fi
[ -x "$DAEMON" ] || { log "no daemon binary at $DAEMON"; exit 2; }

bash "$GANESHA" install
URL=$(bash "$GANESHA" start "$SRV")
NFS_UP=1
rm -f "$SRV/export/fsx.dat"
log "ganesha: $URL"
PROFILE=$OUT/nfs-crash.toml
{
  echo 'description = "crash recovery: one NFS function"'
  [ -z "$CONFIG" ] || grep -v -E '^[[:space:]]*(tag|description)[[:space:]]*=' "$CONFIG"
  printf '\n[[function]]\nsocket_path = "%s"\ntag = "%s"\nremote = "%s"\n' "$SOCK" "$TAG" "$URL"
} > "$PROFILE"
limit=()
# The default --crash-limit (5/60) allows 5 recoveries a minute; more kills need a higher one.
[ "$KILLS" -le 5 ] || limit=(--crash-limit "$KILLS/60")
"$DAEMON" --config "$PROFILE" --control-socket "$CTL" --live-update "${limit[@]}" \
  < /dev/null > "$OUT/daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 300); do [ -S "$CTL" ] && [ -S "$SOCK" ] && break; kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
[ -S "$CTL" ] && [ -S "$SOCK" ] || { log "the daemon never created its sockets"; tail -20 "$OUT/daemon.log" >&2; exit 3; }
log "daemon up (supervisor pid $DPID, serving pid $(pgrep -P "$DPID" | tr '\n' ' '))"

# stats_to FILE: the daemon's get_stats as JSON into FILE (waits while a new process takes
# over: the supervisor holds the control socket, the new process answers what waited).
stats_to() { timeout 20 "$DAEMON" stats --control-socket "$CTL" --json > "$1" 2>/dev/null; }
# field FILE EXPR: EXPR (jq) of a statistics file, empty if it cannot be read.
field() { jq -r "$2" "$1" 2>/dev/null || true; }

bash "$HERE/run-guest.sh" --timeout "${VM_TIMEOUT:-420}" --log "$OUT/console.log" \
  -e "VM_TAG=$TAG" -e "NFS_CRASH_FSX_OPS=$OPS" -e "NFS_CRASH_LOCK_MS=${NFS_CRASH_LOCK_MS:-10000}" \
  "$HERE/guest/nfs-crash.sh" -- \
  -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$SOCK\"}}" &
GPID=$!
for _ in $(seq 3000); do
  grep -aq '^NFSCRASH: go' "$OUT/console.log" 2>/dev/null && break
  kill -0 "$GPID" 2>/dev/null || break
  sleep 0.1
done
grep -aq '^NFSCRASH: go' "$OUT/console.log" 2>/dev/null ||
  { log "the guest never started fsx"; tail -30 "$OUT/console.log" >&2 || true; exit 1; }
T_GO=$(date +%s%N)
log "fsx started in the guest ($OPS operations); $KILLS kills, pauses from RANDOM seed $SEED"
RANDOM=$SEED
fail=0
replayed=0
SERVE_MS=""
for i in $(seq "$KILLS"); do
  ms=$(( 500 + RANDOM % 2501 ))
  sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
  if grep -aq '^NFSCRASH: fsx-done' "$OUT/console.log"; then
    log "FAIL: fsx ended before kill $i (raise NFS_CRASH_FSX_OPS)"; fail=1; break
  fi
  victim=$(pgrep -P "$DPID" | head -1 || true)
  [ -n "$victim" ] || { log "FAIL: no serving process under the supervisor before kill $i"; fail=1; break; }
  # What the victim did since it took over (its requests executed again among them).
  t_st=$(date +%s%N)
  stats_to "$OUT/stats-before-$i.json" || true
  st_ms=$(elapsed "$t_st")
  r=$(field "$OUT/stats-before-$i.json" '.fuse.replayed.requests // 0')
  replayed=$((replayed + ${r:-0}))
  t_kill=$(date +%s%N)
  kill -KILL "$victim"
  # Serving again: the control socket answers with one recovery more, from another process.
  got="" new=""
  while [ "$(elapsed "$t_kill")" -lt 30000 ]; do
    if stats_to "$OUT/stats-after-$i.json"; then
      got=$(field "$OUT/stats-after-$i.json" '.recoveries')
      new=$(pgrep -P "$DPID" | grep -vx "$victim" | head -1 || true)
      [ "$got" != "$i" ] || [ -z "$new" ] || break
    fi
    alive "$DPID" || break
    sleep 0.02
  done
  took=$(elapsed "$t_kill")
  if [ "$got" != "$i" ] || [ -z "$new" ]; then
    log "FAIL: kill $i (pid $victim, $(( (t_kill - T_GO) / 1000000 )) ms after the go): no new process served within ${took} ms (recoveries ${got:-?})"
    fail=1; break
  fi
  sup=$( { grep -a "supervisor: recovery $i: " "$OUT/daemon.log" || true; } | tail -1 | sed -n 's/.* in \([0-9.]*\) ms.*/\1/p')
  SERVE_MS="$SERVE_MS $took"
  line="kill $i: pid $victim $(( (t_kill - T_GO) / 1000000 )) ms after the go (a ${ms} ms pause, then get_stats ${st_ms} ms); pid $new serves ${took} ms after the kill (supervisor: took over in ${sup:-?} ms)"
  echo "$line" >> "$OUT/kills.txt"
  log "$line"
done
grc=0; wait "$GPID" || grc=$?
GPID=""
T_GUEST=$(date +%s%N)
tr -d '\r' < "$OUT/console.log" | grep -a -E '^(nfs-crash: |NFSCRASH: |VMSUM|VMRESULT: |  dmesg: |  stack|  wchan: )' | sed 's/^/  /' >&2 || true
if ! stats_to "$OUT/stats-end.json"; then log "FAIL: the daemon's statistics cannot be read"; fail=1; fi
r=$(field "$OUT/stats-end.json" '.fuse.replayed.requests // 0')
replayed=$((replayed + ${r:-0}))
recoveries=$(field "$OUT/stats-end.json" '.recoveries')
log "from each kill until the new process served (ms):${SERVE_MS:- none}"
log "recoveries counted: ${recoveries:-?}; requests executed again by the new processes: $replayed"
[ "$recoveries" = "$KILLS" ] || { log "FAIL: the daemon counts ${recoveries:-?} recoveries, not $KILLS"; fail=1; }
log "daemon NFS counters: $(field "$OUT/stats-end.json" '.fuse.nfs | del(.unstable) | to_entries | map("\(.key)=\(.value)") | join(" ")')"
grep -a -E 'supervisor: .*(ended|recovery [0-9])|crash recovery [0-9]|recovered: ' "$OUT/daemon.log" | sed 's/^/  /' >&2 || true
inflight=$( { grep -a 'recovered: ' "$OUT/daemon.log" || true; } |
  sed -n 's/.* \([0-9][0-9]*\) chain(s) in flight taken again.*/\1/p' | awk '{s += $1} END {print s + 0}')
log "chains in flight at the kills, taken again: $inflight"
# The guest's F_SETLKW waits in the device across the first kill (at least).
[ "$inflight" -gt 0 ] || { log "FAIL: nothing was in flight at the kills: the stage did not test it"; fail=1; }
if grep -a -E 'NFS state cannot be recovered|did not take over|cannot be read' "$OUT/daemon.log" >&2; then
  log "FAIL: a recovery lost the NFS state or did not take over"; fail=1
fi
# What fsx left: the guest's view (after drop_caches: from the device; before: its page cache)
# against the file in the export directory.
want=$(tr -d '\r' < "$OUT/console.log" | sed -n 's/^VMSUM: //p' | tail -1)
cached=$(tr -d '\r' < "$OUT/console.log" | sed -n 's/^VMSUM-CACHED: //p' | tail -1)
f=$SRV/export/fsx.dat
have=$( { md5sum < "$f" | cut -d' ' -f1; } 2>/dev/null || true)
have="$have $(stat -c %s "$f" 2>/dev/null || true)"
if [ -n "$want" ] && [ "$want" = "$have" ] && [ "$cached" = "$have" ]; then
  log "the export's fsx.dat matches the guest's (md5 and size: $have)"
else
  log "FAIL: the export's fsx.dat ($have) is not the guest's (${want:-none}; page cache ${cached:-none})"; fail=1
fi
kill -TERM "$DPID"
drc=0; wait "$DPID" || drc=$?
DPID=""
[ "$drc" = 0 ] || { log "FAIL: daemon exit status $drc after SIGTERM"; fail=1; }
# Errors other than the supervisor's report of each kill.
grep -a 'ERROR' "$OUT/daemon.log" | grep -av 'supervisor: the serving process [0-9]* ended (signal: 9 (SIGKILL)) unasked; recovery' |
  head -5 >&2 || true
bash "$GANESHA" stop "$SRV" 2>/dev/null || true
NFS_UP=0
log "guest rc=$grc; daemon exit $drc; fsx $(tr -d '\r' < "$OUT/console.log" | sed -n 's/^NFSCRASH: fsx-done //p' | tail -1)"
log "wall time: $(( $(elapsed "$T_START") / 1000 )).$(( $(elapsed "$T_START") % 1000 / 100 )) s (guest from the go to its end: $(( (T_GUEST - T_GO) / 1000000 )) ms)"
[ "$grc" = 0 ] && [ "$fail" = 0 ]
