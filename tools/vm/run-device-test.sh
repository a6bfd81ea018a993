#!/bin/bash
# tools/vm/run-device-test.sh [options] GUEST_SCRIPT [-- QEMU_ARGS...]
#
# Runs a guest suite against a virtio-fs device:
#   default        our daemon (vfio-user server) attached as QEMU vfio-user-pci:
#                    DAEMON --socket-path SOCKDIR/dev.sock --tag TAG --stats-file OUT/stats.json
#                           --control-socket SOCKDIR/ctl.sock [--config FILE] [ARGS...]
#                  after the guest, its statistics are read through the control socket
#                  (`DAEMON stats --json`, into OUT/live-stats.json) while it still runs; then it
#                  is stopped with SIGTERM and must exit 0 (DAEMON_EXPECT_RC) within
#                  DAEMON_STOP_TIMEOUT seconds.
#   --virtiofsd DIR  Debian's virtiofsd serves host DIR (vhost-user-fs-pci):
#                  the peer, for validating suites and for benchmark comparison.
# The guest gets the tag on its kernel command line (vm.tag=TAG).
#
# Exit status: the guest script's (0 = suite passed), else non-zero: 124 guest
# timeout, 125 guest gave no status, 3 daemon failed to start / died / bad exit.
# Logs in OUT: console.log (guest serial), daemon.log or virtiofsd.log,
# results.txt (the guest's VMRESULT lines), run.txt (summary), stats.json (the daemon's
# statistics, written when it stops), live-stats.json (read from its control socket before).
#
# Options:
#   --daemon PATH        device daemon (VFDPU_DAEMON, default REPO/target/release/virtiofs-dpu)
#   --config FILE        daemon --config FILE (VFDPU_CONFIG)
#   --daemon-arg ARG     extra daemon argument (repeatable)
#   --virtiofsd DIR      use virtiofsd serving DIR instead of the daemon
#   --virtiofsd-arg ARG  extra virtiofsd argument (repeatable; default cache mode:
#                        VIRTIOFSD_CACHE=auto)
#   --tag TAG            virtiofs tag (VM_TAG, default vfdpu)
#   --out DIR            log dir (VM_OUT, default a new /tmp/vm-test.XXXXXX)
#   --cache DIR | --timeout SEC | --mem SIZE | --smp N | --append ARGS | -e KEY=VAL
#                        passed to run-guest.sh (see there; VM_* env defaults)
#   --interactive        console on this terminal (used by dev-vm.sh)
#   --allow-reboot       a guest reboot resets the machine and its devices (run-guest.sh)
#   --qemu-user USER     run QEMU as USER (run-guest.sh --user; VM_QEMU_USER)
#   --socket-group GROUP the daemon's sockets belong to GROUP, mode 0660 (--socket-group,
#                        --socket-mode), in a directory GROUP may enter: what a QEMU that is
#                        not root needs (VFDPU_SOCKET_GROUP)
# Env: DAEMON_WAIT (socket wait, 30 s), RUST_LOG (passed to the daemon).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DAEMON=${VFDPU_DAEMON:-$REPO/target/release/virtiofs-dpu}
CONFIG=${VFDPU_CONFIG:-}
DAEMON_ARGS=()
VFSD_DIR=""
VFSD_ARGS=()
TAG=${VM_TAG:-vfdpu}
OUT=${VM_OUT:-}
RG_ARGS=()
SGROUP=${VFDPU_SOCKET_GROUP:-}
SCRIPT=""
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --daemon) DAEMON=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --daemon-arg) DAEMON_ARGS+=("$2"); shift 2 ;;
    --virtiofsd) VFSD_DIR=$2; shift 2 ;;
    --virtiofsd-arg) VFSD_ARGS+=("$2"); shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --cache|--timeout|--mem|--smp|--append|-e) RG_ARGS+=("$1" "$2"); shift 2 ;;
    --interactive|--allow-reboot) RG_ARGS+=("$1"); shift ;;
    --qemu-user) RG_ARGS+=(--user "$2"); shift 2 ;;
    --socket-group) SGROUP=$2; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "run-device-test: unknown option $1" >&2; usage ;;
    *) [ -z "$SCRIPT" ] || usage; SCRIPT=$1; shift ;;
  esac
done
[ -n "$SCRIPT" ] || usage
[ -f "$SCRIPT" ] || { echo "run-device-test: no such guest script: $SCRIPT" >&2; exit 2; }
case $TAG in ''|*[!A-Za-z0-9._-]*) echo "run-device-test: bad tag '$TAG'" >&2; exit 2 ;; esac
[ ${#TAG} -le 36 ] || { echo "run-device-test: tag longer than 36 bytes" >&2; exit 2; }
if [ -z "$OUT" ]; then OUT=$(mktemp -d /tmp/vm-test.XXXXXX); fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CACHE_DIR=${VM_CACHE:-/var/tmp/virtiofs-dpu-vm}

log() { echo "[device-test $(date +%T)] $*" | tee -a "$OUT/run.txt" >&2; }
: > "$OUT/run.txt"

# A unix socket path must fit in sun_path (108 bytes): keep it short.
SOCKDIR=$(mktemp -d /tmp/vfdpu-sock.XXXXXX)
SOCK=$SOCKDIR/dev.sock
CTL=$SOCKDIR/ctl.sock
if [ -n "$SGROUP" ]; then
  # The group may enter the directory (and, with the sockets' mode, connect); nobody else.
  chgrp "$SGROUP" "$SOCKDIR"
  chmod 0750 "$SOCKDIR"
fi
SPID=""        # the server: our daemon or virtiofsd
SNAME=""
stop_server() { # SIGNAL WAIT_SECONDS -> sets SRC (server exit status, or 'timeout')
  local sig=$1 wait_s=$2
  SRC=""
  [ -n "$SPID" ] || return 0
  if kill -0 "$SPID" 2>/dev/null; then kill -"$sig" "$SPID" 2>/dev/null || true; fi
  local n=$((wait_s * 10))
  while [ $n -gt 0 ] && kill -0 "$SPID" 2>/dev/null; do sleep 0.1; n=$((n - 1)); done
  if kill -0 "$SPID" 2>/dev/null; then
    SRC=timeout
    kill -KILL "$SPID" 2>/dev/null || true
  fi
  local rc=0
  wait "$SPID" 2>/dev/null || rc=$?
  [ -n "$SRC" ] || SRC=$rc
  SPID=""
}
GPID=""        # run-guest.sh
cleanup() {
  local rc=$?
  if [ -n "$GPID" ] && kill -0 "$GPID" 2>/dev/null; then
    log "cleanup: stopping the guest (run-guest.sh pid $GPID)"
    kill -TERM "$GPID" 2>/dev/null || true
    wait "$GPID" 2>/dev/null || true
  fi
  if [ -n "$SPID" ]; then
    log "cleanup: stopping $SNAME (pid $SPID)"
    stop_server TERM 5
  fi
  rm -rf "$SOCKDIR"
  return $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

wait_socket() { # NAME LOGFILE
  local n=$(( ${DAEMON_WAIT:-30} * 10 ))
  while [ $n -gt 0 ]; do
    [ -S "$SOCK" ] && return 0
    if ! kill -0 "$SPID" 2>/dev/null; then
      local rc=0; wait "$SPID" || rc=$?; SPID=""
      log "$1 exited (rc=$rc) before creating its socket; last lines of $2:"
      tail -n 20 "$2" >&2
      exit 3
    fi
    sleep 0.1; n=$((n - 1))
  done
  log "$1 did not create $SOCK within ${DAEMON_WAIT:-30}s"
  tail -n 20 "$2" >&2
  exit 3
}

if [ -n "$VFSD_DIR" ]; then
  [ -d "$VFSD_DIR" ] || { echo "run-device-test: no such dir $VFSD_DIR" >&2; exit 2; }
  VFSD_DIR=$(cd "$VFSD_DIR" && pwd)
  SNAME=virtiofsd
  SLOG=$OUT/virtiofsd.log
  VFSD=$CACHE_DIR/bin/virtiofsd
  for ((i = 0; i < ${#RG_ARGS[@]}; i++)); do
    [ "${RG_ARGS[i]}" = --cache ] && VFSD=${RG_ARGS[i+1]}/bin/virtiofsd
  done
  [ -x "$VFSD" ] || { echo "run-device-test: missing $VFSD (run tools/vm/setup.sh)" >&2; exit 2; }
  SCMD=("$VFSD" --socket-path="$SOCK" --shared-dir="$VFSD_DIR" --cache="${VIRTIOFSD_CACHE:-auto}"
        --sandbox=namespace --log-level=warn ${VFSD_ARGS[@]+"${VFSD_ARGS[@]}"})
  DEVARGS=(-chardev "socket,id=vfsd0,path=$SOCK"
           -device "vhost-user-fs-pci,chardev=vfsd0,tag=$TAG,queue-size=1024")
  # virtiofsd does not keep locks itself: the guest kernel does (the locks suite then checks
  # only the contention; a later -e LOCKS_EXPECT=... wins).
  RG_ARGS=(-e LOCKS_EXPECT=any ${RG_ARGS[@]+"${RG_ARGS[@]}"})
else
  [ -x "$DAEMON" ] || { echo "run-device-test: daemon not found or not executable: $DAEMON" >&2; exit 2; }
  SNAME=daemon
  SLOG=$OUT/daemon.log
  SCMD=("$DAEMON" --socket-path "$SOCK" --tag "$TAG" --stats-file "$OUT/stats.json"
        --control-socket "$CTL")
  [ -z "$SGROUP" ] || SCMD+=(--socket-group "$SGROUP" --socket-mode 0660)
  [ -z "$CONFIG" ] || SCMD+=(--config "$CONFIG")
  SCMD+=(${DAEMON_ARGS[@]+"${DAEMON_ARGS[@]}"})
  DEVARGS=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$SOCK\"}}")
fi

log "starting $SNAME: ${SCMD[*]}"
"${SCMD[@]}" < /dev/null > "$SLOG" 2>&1 &
SPID=$!
wait_socket "$SNAME" "$SLOG"
log "$SNAME up (pid $SPID), socket $SOCK ($(stat -c '%U:%G %a' "$SOCK"))"

grc=0
RG=(bash "$HERE/run-guest.sh" --log "$OUT/console.log" --append "vm.tag=$TAG"
    ${RG_ARGS[@]+"${RG_ARGS[@]}"} "$SCRIPT" -- "${DEVARGS[@]}" "$@")
if [[ " ${RG_ARGS[*]-} " == *" --interactive "* ]]; then
  "${RG[@]}" || grc=$?     # needs the terminal: foreground
else
  # background + wait, so that a signal to this script is handled at once
  # (bash defers traps while a foreground child runs); cleanup stops it.
  "${RG[@]}" &
  GPID=$!
  wait "$GPID" || grc=$?
  GPID=""
fi
tr -d '\r' < "$OUT/console.log" | grep -a '^VMRESULT:' > "$OUT/results.txt" || true
[ -s "$OUT/results.txt" ] && sed 's/^/  /' "$OUT/results.txt" >&2

rc=$grc
if [ "$SNAME" = daemon ]; then
  if ! kill -0 "$SPID" 2>/dev/null; then
    stop_server TERM 0
    log "FAIL: daemon died during the run (exit status $SRC); see $SLOG"
    rc=3
  else
    # The statistics through the control socket, as an operator reads them.
    if "$DAEMON" stats --control-socket "$CTL" --json > "$OUT/live-stats.json" 2>> "$OUT/run.txt"; then
      log "statistics read through the control socket: $OUT/live-stats.json"
    else
      log "FAIL: cannot read the statistics through the control socket $CTL"
      rm -f "$OUT/live-stats.json"
      [ "$rc" != 0 ] || rc=3
    fi
    stop_server TERM "${DAEMON_STOP_TIMEOUT:-10}"
    if [ "$SRC" != "${DAEMON_EXPECT_RC:-0}" ]; then
      log "FAIL: daemon exit status after SIGTERM: $SRC (expected ${DAEMON_EXPECT_RC:-0}); see $SLOG"
      [ "$rc" != 0 ] || rc=3
    else
      log "daemon stopped cleanly (exit status $SRC)"
    fi
  fi
else
  # virtiofsd exits by itself when QEMU disconnects
  stop_server TERM 5
  log "virtiofsd exit status: $SRC"
fi
log "guest rc=$grc, result rc=$rc; logs in $OUT"
exit "$rc"
