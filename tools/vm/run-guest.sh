#!/bin/bash
# tools/vm/run-guest.sh [options] GUEST_SCRIPT [-- QEMU_ARGS...]
#
# Boots the test guest (q35, TCG unless hardware KVM is usable, RAM in a shared
# memfd so vhost-user / vfio-user servers can map it) with GUEST_SCRIPT as
# /guest.sh and the whole tools/vm/guest/ directory as /harness/ (plus
# the pjdfstest-exceptions*.txt lists). The guest powers off when the script ends.
#
# Exit status: the guest script's exit status; 124 when the timeout hit;
# 125 when the guest never reported one (QEMU failed to start, kernel panic,
# guest crash: read the console log).
#
# Options (each has an env default):
#   --cache DIR       harness cache (VM_CACHE, default /var/tmp/virtiofs-dpu-vm)
#   --log FILE        guest console log (VM_LOG, default a new /tmp/vm-console.XXXXXX.log);
#                     the QEMU command line goes to FILE.cmd, QEMU's messages to FILE.qemu
#   --timeout SEC     hard limit for the whole boot (VM_TIMEOUT, default 900)
#   --mem SIZE        guest RAM (VM_MEM, default 2G)
#   --smp N           vCPUs (VM_SMP, default 2)
#   --append ARGS     extra kernel command line (VM_APPEND)
#   -e KEY=VALUE      export KEY=VALUE to the guest script (repeatable)
#   --interactive     console on this terminal (Ctrl-A X quits), still logged
#   --allow-reboot    a guest reboot resets the machine (and the devices) instead of ending QEMU
#   --user USER       run QEMU as USER, with USER's groups (VM_QEMU_USER; needs root), as a
#                     deployment runs it: the device socket must let USER's group connect
#   everything after -- goes to QEMU verbatim (devices, chardevs, ...)
# Env: VM_ACCEL=kvm|tcg forces the accelerator; VM_QEMU overrides the binary;
#      VM_KEEP=1 keeps the per-run dir (initrd) so FILE.cmd can be re-run by hand.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${VM_CACHE:-/var/tmp/virtiofs-dpu-vm}
LOG=${VM_LOG:-}
TIMEOUT=${VM_TIMEOUT:-900}
MEM=${VM_MEM:-2G}
SMP=${VM_SMP:-2}
APPEND=${VM_APPEND:-}
INTERACTIVE=0
QUSER=${VM_QEMU_USER:-}
REBOOT=-no-reboot
GUEST_ENV=()
SCRIPT=""
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --cache) CACHE=$2; shift 2 ;;
    --log) LOG=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --mem) MEM=$2; shift 2 ;;
    --smp) SMP=$2; shift 2 ;;
    --append) APPEND="$APPEND $2"; shift 2 ;;
    -e) GUEST_ENV+=("$2"); shift 2 ;;
    --interactive) INTERACTIVE=1; shift ;;
    --allow-reboot) REBOOT=""; shift ;;
    --user) QUSER=$2; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "run-guest: unknown option $1" >&2; usage ;;
    *) [ -z "$SCRIPT" ] || usage; SCRIPT=$1; shift ;;
  esac
done
[ -n "$SCRIPT" ] || usage
[ -f "$SCRIPT" ] || { echo "run-guest: no such guest script: $SCRIPT" >&2; exit 2; }
CACHE=$(cd "$CACHE" && pwd)
G=$CACHE/guest
QEMU=${VM_QEMU:-$CACHE/bin/qemu-system-x86_64}
for f in "$G/base.cpio" "$G/vmlinuz" "$QEMU"; do
  [ -e "$f" ] || { echo "run-guest: missing $f (run tools/vm/setup.sh and build-guest.sh)" >&2; exit 2; }
done
[ -n "$LOG" ] || LOG=$(mktemp /tmp/vm-console.XXXXXX.log)
mkdir -p "$(dirname "$LOG")"
LOG=$(cd "$(dirname "$LOG")" && pwd)/$(basename "$LOG")

log() { echo "[run-guest $(date +%T)] $*" >&2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/vm-run.XXXXXX")
QPID=""
cleanup() {
  local rc=$?
  if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then
    log "stopping QEMU (pid $QPID)"
    kill -TERM -- "-$QPID" 2>/dev/null || kill -TERM "$QPID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$QPID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$QPID" 2>/dev/null || kill -KILL "$QPID" 2>/dev/null || true
    wait "$QPID" 2>/dev/null || true
  fi
  if [ "${VM_KEEP:-0}" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
  return $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Per-run overlay archive: /guest.sh, /harness/* and /harness/env.
ov=$work/ov
mkdir -p "$ov/harness"
cp "$SCRIPT" "$ov/guest.sh"
cp "$HERE"/guest/* "$ov/harness/"
cp "$HERE"/pjdfstest-exceptions*.txt "$ov/harness/" 2>/dev/null || true
# The lock suite's test program, static (the image has no compiler; glibc's static libc.a is in
# the host's libc6-dev, which setup.sh installs).
if ! "${CC:-cc}" -static -O2 -Wall -o "$ov/harness/locktest" "$HERE/locktest.c" 2> "$work/locktest.cc.log"; then
  echo "run-guest: cannot build tools/vm/locktest.c (gcc and libc6-dev needed); the locks suite will fail:" >&2
  cat "$work/locktest.cc.log" >&2
fi
chmod 755 "$ov/guest.sh" "$ov"/harness/*.sh
for kv in ${GUEST_ENV[@]+"${GUEST_ENV[@]}"}; do
  key=${kv%%=*}; val=${kv#*=}
  case $key in ''|*[!A-Za-z0-9_]*) echo "run-guest: bad -e $kv" >&2; exit 2 ;; esac
  printf "export %s='%s'\n" "$key" "$(printf '%s' "$val" | sed "s/'/'\\\\''/g")"
done > "$ov/harness/env"
( cd "$ov" && find . -mindepth 1 | "$CACHE/bin/busybox" cpio -o -H newc 2>/dev/null ) > "$work/ov.cpio"
cat "$G/base.cpio" "$work/ov.cpio" > "$work/initrd"

# QEMU as another user: it reads the initrd and writes the console log as that user.
RUNAS=()
if [ -n "$QUSER" ]; then
  [ "$(id -u)" = 0 ] || { echo "run-guest: --user needs root" >&2; exit 2; }
  id -u "$QUSER" > /dev/null 2>&1 || { echo "run-guest: no such user: $QUSER" >&2; exit 2; }
  RUNAS=(setpriv --reuid="$(id -u "$QUSER")" --regid="$(id -g "$QUSER")" --init-groups --inh-caps=-all --)
  chmod 755 "$work"
  chmod 644 "$work/initrd"
  : > "$LOG"
  chown "$QUSER" "$LOG"
fi
ACCEL=${VM_ACCEL:-}
if [ -z "$ACCEL" ]; then
  # /dev/kvm existing is not enough: on a PVM host (kvm_pvm, e.g. nested in
  # Firecracker) a stock kernel dies early with an emulation failure.
  if ${RUNAS[@]+"${RUNAS[@]}"} test -w /dev/kvm && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
    ACCEL=kvm
  else
    ACCEL=tcg
  fi
fi
CPU=max
[ "$ACCEL" = kvm ] && CPU=host

# The console log reaches QEMU as descriptor 3, opened here: a QEMU running as --user may not
# search the directories above the log (a CI's mktemp -d is 0700), and reopening the descriptor
# through /proc/self/fd needs no search of them, only write access to the file (its owner).
CLOG=/proc/self/fd/3
if [ "$INTERACTIVE" = 1 ]; then
  CONSOLE=(-chardev "stdio,id=con0,mux=on,signal=off,logfile=$CLOG" -serial chardev:con0
           -object monitor-hmp,id=mon0,chardev=con0)
else
  CONSOLE=(-serial "file:$CLOG")
fi
: > "$LOG"
QARGS=(
  -machine q35,memory-backend=mem -accel "$ACCEL" -cpu "$CPU" -smp "$SMP" -m "$MEM"
  -object "memory-backend-memfd,id=mem,size=$MEM,share=on"
  -kernel "$G/vmlinuz" -initrd "$work/initrd"
  -append "console=ttyS0 panic=-1 quiet loglevel=4 $APPEND"
  -display none -vga none -nodefaults -no-user-config ${REBOOT:+$REBOOT}
  "${CONSOLE[@]}" "$@"
)
log "accel=$ACCEL smp=$SMP mem=$MEM timeout=${TIMEOUT}s script=$(basename "$SCRIPT") log=$LOG${QUSER:+ user=$QUSER}"
{ printf '%q ' ${RUNAS[@]+"${RUNAS[@]}"} "$QEMU" "${QARGS[@]}"; echo "3>>$LOG"; } > "$LOG.cmd"   # for reproducing by hand
t0=$(date +%s.%N)
set +e
if [ "$INTERACTIVE" = 1 ]; then
  # Foreground: QEMU needs the terminal. timeout still bounds the session.
  timeout --foreground -k 10 "$TIMEOUT" ${RUNAS[@]+"${RUNAS[@]}"} "$QEMU" "${QARGS[@]}" 3>>"$LOG"
  qrc=$?
else
  # Own process group (timeout setpgid()s), so cleanup can kill it whole.
  timeout -k 10 "$TIMEOUT" ${RUNAS[@]+"${RUNAS[@]}"} "$QEMU" "${QARGS[@]}" < /dev/null > "$work/qemu.out" 2>&1 3>>"$LOG" &
  QPID=$!
  wait "$QPID"
  qrc=$?
  QPID=""
  # QEMU's own messages next to the console log, and on stderr
  if [ -s "$work/qemu.out" ]; then
    cp "$work/qemu.out" "$LOG.qemu"
    sed 's/^/[qemu] /' "$work/qemu.out" >&2
  fi
fi
set -e
wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')

grc=$(tr -d '\r' < "$LOG" | sed -n 's/^VMHARNESS: guest-exit rc=\([0-9]*\).*/\1/p' | tail -1)
boot=$(tr -d '\r' < "$LOG" | sed -n 's/^VMHARNESS: boot-done uptime=\([0-9.]*\)s.*/\1/p' | head -1)
if [ -n "$grc" ]; then
  rc=$grc
  log "guest script rc=$rc (boot-done at ${boot:-?}s guest uptime, ${wall}s wall)"
elif [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  rc=124
  if awk -v w="$wall" -v t="$TIMEOUT" 'BEGIN{exit !(w < t - 1)}'; then
    # SIGKILL before the timeout: another process killed QEMU (a fault test does).
    log "QEMU killed (SIGKILL) after ${wall}s, before the ${TIMEOUT}s timeout; console log: $LOG"
  else
    log "TIMEOUT after ${TIMEOUT}s (boot-done at ${boot:-never}); console log: $LOG"
  fi
else
  rc=125
  log "guest reported no exit status (qemu rc=$qrc, ${wall}s wall); console log: $LOG"
  [ "$INTERACTIVE" = 1 ] || tail -n 20 "$LOG" | sed 's/^/[console] /' >&2
fi
exit "$rc"
