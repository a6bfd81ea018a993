#!/bin/bash
# tools/vm/run-nfs-crash-test.sh [--backend nfs|shared] [--out DIR] [--config FILE] [--daemon PATH]
#                                [--kills N] [--qemu-user USER] [--socket-group GROUP]
#
# Crash recovery of one function in a real guest under fsx (issue 24), an NFS export
# (--backend nfs, the default) or a sandboxed shared directory (--backend shared):
#   nfs     ganesha (tools/nfs/ganesha.sh) exports a fresh directory; the daemon serves it as
#           one NFS function (--remote). Needs root (ganesha's FSAL_VFS).
#   shared  a fresh tmpfs (SOCKDIR/root) is the profile's sandbox_root, its directory share/ the
#           function's shared_dir: run as root, the daemon's serving processes are sandboxed as
#           in ci.sh's passthrough stage (mount, IPC and network namespaces, the tmpfs their
#           root; seccomp in trap mode). Each new process rebuilds the share from the node and
#           handle descriptors its supervisor holds and the node table's records.
# A daemon started with --live-update serves the function to a QEMU guest that runs fsx on it
# (guest/nfs-crash.sh; NFS_CRASH_FSX_OPS or SHARED_CRASH_FSX_OPS operations, default 5000; NFS
# with fsx-nfs.toml, a shared directory with fsx.toml: hole punching too). Once fsx starts, the
# serving process is killed with SIGKILL N times (default 5, the default --crash-limit) at random
# moments: before each kill a pause of 0.5-3 s ($RANDOM, seeded with NFS_CRASH_SEED or
# SHARED_CRASH_SEED, printed), and after it a wait until the new process serves (its control
# socket answers with `recoveries` one higher, a new pid under the supervisor). Each new process
# recovers the function's state (an export's node table, handles and UNSTABLE store; a share's
# nodes, handles and node table) and FUSE session from the dead one's records and executes the
# requests in flight again: beside fsx the guest keeps an F_SETLKW waiting in the device for a
# lock another process holds for NFS_CRASH_LOCK_MS or SHARED_CRASH_LOCK_MS (10 s), which must
# wait on across the kills and be granted once it goes.
# Passes when every kill came while fsx ran, fsx ends A-OK, the F_SETLKW is granted after the
# holder let go (not before), chains in flight were taken again, the guest's kernel log is clean,
# the file fsx left (read by the guest after drop_caches, and before) has the checksum of the
# file in the export (shared) directory, the daemon counts N recoveries with no state lost (no
# "cannot be recovered"), and it exits 0 on SIGTERM; for a shared directory also: every serving
# process (N + 1) logged its namespaces and its seccomp filter, no system call outside the
# allowlist, nothing it failed to hand its supervisor (`checkpoints.failed` 0 in every process's
# statistics, no "checkpoint not kept"). Prints the time from each kill
# until the new process served, and the wall time. Needs the VM cache of tools/vm/setup.sh;
# builds the release daemon if it is missing. --qemu-user/--socket-group: QEMU runs as USER, the
# function's socket belongs to GROUP (mode 0660), as in ci.sh's passthrough stage.
# Exit status 0 on success.
# Logs in OUT: daemon.log, console.log, run.txt, kills.txt, stats-*.json, and
#   nfs     nfs-crash.toml, ganesha/ (the server's directory: export/fsx.dat is what fsx left);
#   shared  shared-crash.toml, share-fsx.dat (a copy of what fsx left in the share).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DAEMON=${VFDPU_DAEMON:-$REPO/target/release/virtiofs-dpu}
CONFIG=${VFDPU_CONFIG:-}
OUT=${VM_OUT:-}
TAG=${VM_TAG:-vfdpu}
KILLS=5
BACKEND=nfs
QUSER="" SGROUP=""
while [ $# -gt 0 ]; do
  case $1 in
    --backend) BACKEND=$2; shift 2 ;;
    --qemu-user) QUSER=$2; shift 2 ;;
    --socket-group) SGROUP=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --daemon) DAEMON=$2; shift 2 ;;
    --kills) KILLS=$2; shift 2 ;;
    *) echo "run-nfs-crash-test: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $BACKEND in
  nfs) NAME=nfs-crash MARK=NFSCRASH PFX=NFS_CRASH ;;
  shared) NAME=shared-crash MARK=SHAREDCRASH PFX=SHARED_CRASH ;;
  *) echo "run-nfs-crash-test: unknown backend $BACKEND (nfs, shared)" >&2; exit 2 ;;
esac
# penv X DEFAULT: the backend's variable PFX_X, else DEFAULT.
penv() { local v="${PFX}_$1"; echo "${!v:-$2}"; }
OPS=$(penv FSX_OPS 5000)
SEED=$(penv SEED $(( $(date +%s) % 32768 )))
LOCK_MS=$(penv LOCK_MS 10000)
T_START=$(date +%s%N)
[ -n "$OUT" ] || OUT=$(mktemp -d "/tmp/vm-$NAME.XXXXXX")
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
log() { echo "[$NAME $(date +%T)] $*" | tee -a "$OUT/run.txt" >&2; }
: > "$OUT/run.txt"; : > "$OUT/kills.txt"
# Nothing of an earlier run in OUT may be read as this one's (its console's go line above all).
rm -f "$OUT"/stats-*.json "$OUT"/console.log "$OUT"/console.log.*
GANESHA=$REPO/tools/nfs/ganesha.sh
SRV=$OUT/ganesha
SOCKDIR=$(mktemp -d /tmp/vfdpu-nfscrash.XXXXXX)
CTL=$SOCKDIR/ctl.sock SOCK=$SOCKDIR/fs.sock
SHARE_ROOT=$SOCKDIR/root SHARE=$SOCKDIR/root/share
DPID=""; GPID=""; NFS_UP=0; SHARE_UP=0
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
  [ "$SHARE_UP" = 0 ] || umount "$SHARE_ROOT" 2>/dev/null || true
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

PROFILE=$OUT/$NAME.toml
if [ "$BACKEND" = nfs ]; then
  bash "$GANESHA" install
  URL=$(bash "$GANESHA" start "$SRV")
  NFS_UP=1
  rm -f "$SRV/export/fsx.dat"
  log "ganesha: $URL"
  {
    echo 'description = "crash recovery: one NFS function"'
    [ -z "$CONFIG" ] || grep -v -E '^[[:space:]]*(tag|description)[[:space:]]*=' "$CONFIG"
    printf '\n[[function]]\nsocket_path = "%s"\ntag = "%s"\nremote = "%s"\n' "$SOCK" "$TAG" "$URL"
  } > "$PROFILE"
  FSX_CFG=/harness/fsx-nfs.toml
  HOST_FILE=$SRV/export/fsx.dat
else
  mkdir -p "$SHARE_ROOT"
  if mount -t tmpfs -o size=256m,mode=0755 vfdpu-shcrash "$SHARE_ROOT"; then
    SHARE_UP=1
  else
    log "no tmpfs mounted (not root?): the share is on $(df --output=fstype "$SOCKDIR" | tail -1)"
  fi
  mkdir -p "$SHARE"
  rm -f "$OUT/share-fsx.dat"
  {
    echo 'description = "crash recovery: one shared directory, sandboxed"'
    echo "sandbox_root = \"$SHARE_ROOT\""
    [ -z "$CONFIG" ] || grep -v -E '^[[:space:]]*(tag|description)[[:space:]]*=' "$CONFIG"
    printf '\n[[function]]\nsocket_path = "%s"\ntag = "%s"\nshared_dir = "%s"\n' "$SOCK" "$TAG" "$SHARE"
  } > "$PROFILE"
  FSX_CFG=/harness/fsx.toml
  HOST_FILE=$SHARE/fsx.dat
fi
limit=() access=() rguser=()
# The default --crash-limit (5/60) allows 5 recoveries a minute; more kills need a higher one.
[ "$KILLS" -le 5 ] || limit=(--crash-limit "$KILLS/60")
if [ -n "$SGROUP" ]; then
  # The group may enter the socket's directory and, with the socket's mode, connect.
  chgrp "$SGROUP" "$SOCKDIR"
  chmod 0750 "$SOCKDIR"
  access=(--socket-group "$SGROUP" --socket-mode 0660)
fi
[ -z "$QUSER" ] || rguser=(--user "$QUSER")
"$DAEMON" --config "$PROFILE" --control-socket "$CTL" --live-update "${limit[@]}" "${access[@]}" \
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

bash "$HERE/run-guest.sh" --timeout "${VM_TIMEOUT:-420}" --log "$OUT/console.log" "${rguser[@]}" \
  -e "VM_TAG=$TAG" -e "CRASH_NAME=$NAME" -e "CRASH_MARK=$MARK" -e "CRASH_FSX_CONFIG=$FSX_CFG" \
  -e "CRASH_FSX_OPS=$OPS" -e "CRASH_LOCK_MS=$LOCK_MS" \
  "$HERE/guest/nfs-crash.sh" -- \
  -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$SOCK\"}}" &
GPID=$!
for _ in $(seq 3000); do
  grep -aq "^$MARK: go" "$OUT/console.log" 2>/dev/null && break
  kill -0 "$GPID" 2>/dev/null || break
  sleep 0.1
done
grep -aq "^$MARK: go" "$OUT/console.log" 2>/dev/null ||
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
  if grep -aq "^$MARK: fsx-done" "$OUT/console.log"; then
    log "FAIL: fsx ended before kill $i (raise ${PFX}_FSX_OPS)"; fail=1; break
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
tr -d '\r' < "$OUT/console.log" | grep -a -E "^($NAME: |$MARK: |VMSUM|VMRESULT: |  dmesg: |  stack|  wchan: )" | sed 's/^/  /' >&2 || true
if ! stats_to "$OUT/stats-end.json"; then log "FAIL: the daemon's statistics cannot be read"; fail=1; fi
r=$(field "$OUT/stats-end.json" '.fuse.replayed.requests // 0')
replayed=$((replayed + ${r:-0}))
recoveries=$(field "$OUT/stats-end.json" '.recoveries')
log "from each kill until the new process served (ms):${SERVE_MS:- none}"
log "recoveries counted: ${recoveries:-?}; requests executed again by the new processes: $replayed"
[ "$recoveries" = "$KILLS" ] || { log "FAIL: the daemon counts ${recoveries:-?} recoveries, not $KILLS"; fail=1; }
if [ "$BACKEND" = nfs ]; then
  log "daemon NFS counters: $(field "$OUT/stats-end.json" '.fuse.nfs | del(.unstable) | to_entries | map("\(.key)=\(.value)") | join(" ")')"
else
  log "daemon replay counters (last process): $(field "$OUT/stats-end.json" '.fuse.replayed | to_entries | map("\(.key)=\(.value)") | join(" ")')"
  # A node's or handle's descriptor the supervisor did not get: a crash then ends the share.
  failed=0
  for st in "$OUT"/stats-before-*.json "$OUT/stats-end.json"; do
    c=$(field "$st" '.checkpoints.failed // 0'); failed=$((failed + ${c:-0}))
  done
  log "checkpoints (last process): $(field "$OUT/stats-end.json" '.checkpoints | to_entries | map("\(.key)=\(.value)") | join(" ")'); failed, all processes: $failed"
  if [ "$failed" != 0 ] || grep -aq 'checkpoint not kept' "$OUT/daemon.log"; then
    grep -a 'checkpoint not kept' "$OUT/daemon.log" | head -5 >&2 || true
    log "FAIL: the supervisor did not get every checkpoint or descriptor"; fail=1
  fi
  # Sandboxed as in ci.sh's passthrough stage, every serving process (the first and each new
  # one logs its namespaces and its seccomp filter), and no system call outside the allowlist
  # (seccomp's trap mode logs each).
  nsb=$(grep -ac 'sandbox: new mount, IPC and network namespaces' "$OUT/daemon.log" || true)
  nsc=$(grep -ac 'seccomp: [0-9]* system calls allowed' "$OUT/daemon.log" || true)
  log "sandbox entered ${nsb:-0} time(s), seccomp filter installed ${nsc:-0} time(s) ($(( KILLS + 1 )) serving processes): $(
    grep -a -m1 -o 'sandbox: .*' "$OUT/daemon.log" || true); $(grep -a -m1 -o 'seccomp: .*' "$OUT/daemon.log" || true)"
  if [ "${nsb:-0}" -lt $(( KILLS + 1 )) ] || [ "${nsc:-0}" -lt $(( KILLS + 1 )) ]; then
    log "FAIL: not every serving process entered its sandbox"; fail=1
  fi
  if grep -a 'seccomp: system call' "$OUT/daemon.log" >&2; then
    log "FAIL: the daemon made a system call outside its allowlist"; fail=1
  fi
fi
grep -a -E 'supervisor: .*(ended|recovery [0-9])|crash recovery [0-9]|recovered: ' "$OUT/daemon.log" | sed 's/^/  /' >&2 || true
inflight=$( { grep -a 'recovered: ' "$OUT/daemon.log" || true; } |
  sed -n 's/.* \([0-9][0-9]*\) chain(s) in flight taken again.*/\1/p' | awk '{s += $1} END {print s + 0}')
log "chains in flight at the kills, taken again: $inflight"
# The guest's F_SETLKW waits in the device across the first kill (at least).
[ "$inflight" -gt 0 ] || { log "FAIL: nothing was in flight at the kills: the stage did not test it"; fail=1; }
if grep -a -E 'cannot be recovered|did not take over|cannot be read' "$OUT/daemon.log" >&2; then
  log "FAIL: a recovery lost the function's state or did not take over"; fail=1
fi
# What fsx left: the guest's view (after drop_caches: from the device; before: its page cache)
# against the file in the export (shared) directory.
WHERE=export; [ "$BACKEND" = nfs ] || WHERE=share
want=$(tr -d '\r' < "$OUT/console.log" | sed -n 's/^VMSUM: //p' | tail -1)
cached=$(tr -d '\r' < "$OUT/console.log" | sed -n 's/^VMSUM-CACHED: //p' | tail -1)
f=$HOST_FILE
[ "$BACKEND" = nfs ] || cp "$f" "$OUT/share-fsx.dat" 2>/dev/null || true
have=$( { md5sum < "$f" | cut -d' ' -f1; } 2>/dev/null || true)
have="$have $(stat -c %s "$f" 2>/dev/null || true)"
if [ -n "$want" ] && [ "$want" = "$have" ] && [ "$cached" = "$have" ]; then
  log "the $WHERE's fsx.dat matches the guest's (md5 and size: $have)"
else
  log "FAIL: the $WHERE's fsx.dat ($have) is not the guest's (${want:-none}; page cache ${cached:-none})"; fail=1
fi
kill -TERM "$DPID"
drc=0; wait "$DPID" || drc=$?
DPID=""
[ "$drc" = 0 ] || { log "FAIL: daemon exit status $drc after SIGTERM"; fail=1; }
# Errors other than the supervisor's report of each kill.
grep -a 'ERROR' "$OUT/daemon.log" | grep -av 'supervisor: the serving process [0-9]* ended (signal: 9 (SIGKILL)) unasked; recovery' |
  head -5 >&2 || true
[ "$NFS_UP" = 0 ] || bash "$GANESHA" stop "$SRV" 2>/dev/null || true
NFS_UP=0
log "guest rc=$grc; daemon exit $drc; fsx $(tr -d '\r' < "$OUT/console.log" | sed -n "s/^$MARK: fsx-done //p" | tail -1)"
log "wall time: $(( $(elapsed "$T_START") / 1000 )).$(( $(elapsed "$T_START") % 1000 / 100 )) s (guest from the go to its end: $(( (T_GUEST - T_GO) / 1000000 )) ms)"
[ "$grc" = 0 ] && [ "$fail" = 0 ]
