#!/bin/bash
# tools/vm/compare.sh [options]: the same fio jobs through our device and through virtiofsd, in
# alternating rounds of one run, and a table of ratios (ours / virtiofsd, medians over rounds).
#
# Each round boots one guest per variant, in this order: our daemon once per --polling mode
# (vfio-user-pci, profile hw-configs/bench-guest.toml with that polling mode), then virtiofsd
# (vhost-user-fs-pci,queue-size=128, serving a fresh tmpfs dir under /dev/shm), both servers with
# the same guest cache policy (--fs-cache);
# with several --kernels, the variants run per kernel within the round, and with several
# --layouts per layout within the kernel:
#   shared     the guest has --smp vCPUs (default 2) and nothing is pinned: vCPUs, QEMU and the
#              file server share the box's cores (the development setup);
#   dedicated  the DPU case: a 1-vCPU guest with QEMU pinned to core 0 (taskset -c 0) and the
#              file server pinned to core 1 (taskset -c 1): our daemon with the profile
#              --dedicated-config (default hw-configs/bench-dedicated.toml: a busy poller on
#              core 1; --polling does not apply), or virtiofsd with all its threads. Every guest runs
# guest/fio-compare.sh (same kernel, same vCPUs, same RAM, same jobs). Then fio-compare.py
# prints the medians per variant and the ratio tables; OUT/summary.md has the same.
#
# Jobs (see guest/fio-compare.sh; the default four are O_DIRECT, one fio thread): randread-4k-qd1,
# randwrite-4k-qd1 (psync), randread-4k-qdN (libaio, iodepth 2 x queue size = 256), seqwrite-1m
# (psync); and the seeds' jobs, by --jobs: seqwrite-1m-cpu1 (pinned to guest CPU 1: run it with a
# profile of one request queue and one of two, see hw-configs/bench-guest-2q.toml) and
# write-1m-buffered-2j (buffered, two jobs, with --writeback off,on).
#
# Options:
#   --rounds N          rounds (default 3)
#   --runtime S         measured seconds per fio job (default 10; plus --ramp, default 2)
#   --ramp S            fio ramp_time, not measured (default 2)
#   --jobs "J ..."      subset of the jobs (default: all four)
#   --polling M[,M]     our poller modes to run each round (default adaptive): busy, adaptive
#                       (the profile's idle_spin_us / idle_sleep_us), or adaptive:SPIN:SLEEP (those
#                       two keys overridden, in us); each is its own variant (ours-busy,
#                       ours-adaptive, ours-adaptive-SPIN-SLEEP)
#   --config FILE       our profile (default hw-configs/bench-guest.toml); its queue_size sets
#                       the QD job's depth (2 x) and virtiofsd's queue-size
#   --kernels K[,K]     guest kernels: trixie (6.12), bookworm (6.1; fetched by
#                       VM_KERNELS="trixie bookworm" setup.sh, which this script runs) (default trixie)
#   --servers S[,S]     ours, virtiofsd (default both)
#   --fs-cache P        guest cache policy of both servers, virtiofsd's --cache and our daemon's
#                       --cache: never, auto or always (default auto, virtiofsd's default: entries
#                       and attributes cached for 1 s, so a read is one FUSE round trip)
#   --layouts L[,L]     shared, dedicated (default both; see above)
#   --dedicated-config FILE  our profile in the dedicated layout (default
#                       hw-configs/bench-dedicated.toml; same queue_size as --config)
#   --writeback W[,W]   off, on (default off): with on, each server also runs with writeback
#                       caching (our --writeback, virtiofsd's --writeback), its own setup in
#                       the tables (ours with writeback against virtiofsd with writeback)
#   --smp N | --mem SIZE  guest vCPUs in the shared layout / RAM (default 2 / 2G)
#   --daemon PATH       our daemon (default target/release/virtiofs-dpu; copied into OUT first)
#   --out DIR           output dir (default a new /tmp/vfdpu-compare.XXXXXX)
#   --no-setup          skip setup.sh / build-guest.sh (they are idempotent and take ~0.5 s)
# Env: VM_CACHE (harness cache).
# Default run: 12 boots (2 layouts x 2 servers x 3 rounds), ~13 min on 2 TCG cores. The machine's other load moves the numbers by
# 2x from boot to boot: on a shared box run it under `nice -n -10` and use more --rounds.
# Results and what they mean: tools/vm/COMPARE-RESULTS.md.
# Output: OUT/<round>-<kernel>-<layout>-<variant>/{console.log,daemon.log|virtiofsd.log,meta}, OUT/summary.md,
# OUT/summary.json. Exit status 0 when every guest run passed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROUNDS=3
RUNTIME=10
RAMP=2
JOBS="randread-4k-qd1 randwrite-4k-qd1 randread-4k-qdN seqwrite-1m"
POLLING=adaptive
CONFIG=$REPO/hw-configs/bench-guest.toml
DCONFIG=$REPO/hw-configs/bench-dedicated.toml
LAYOUTS=shared,dedicated
WRITEBACK=off
KERNELS=trixie
SERVERS=ours,virtiofsd
FS_CACHE=auto
SMP=${VM_SMP:-2}
MEM=${VM_MEM:-2G}
DAEMON=${VFDPU_DAEMON:-$REPO/target/release/virtiofs-dpu}
OUT=""
SETUP=1
CACHE=${VM_CACHE:-/var/tmp/virtiofs-dpu-vm}
TAG=bench
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --ramp) RAMP=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --polling) POLLING=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --dedicated-config) DCONFIG=$2; shift 2 ;;
    --layouts) LAYOUTS=$2; shift 2 ;;
    --writeback) WRITEBACK=$2; shift 2 ;;
    --kernels) KERNELS=$2; shift 2 ;;
    --servers) SERVERS=$2; shift 2 ;;
    --fs-cache) FS_CACHE=$2; shift 2 ;;
    --smp) SMP=$2; shift 2 ;;
    --mem) MEM=$2; shift 2 ;;
    --daemon) DAEMON=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-setup) SETUP=0; shift ;;
    -h|--help) usage ;;
    *) echo "compare: unknown argument $1" >&2; usage ;;
  esac
done
KERNELS=${KERNELS//,/ }; POLLING=${POLLING//,/ }; SERVERS=${SERVERS//,/ }; LAYOUTS=${LAYOUTS//,/ }
WRITEBACK=${WRITEBACK//,/ }
for w in $WRITEBACK; do case $w in on|off) ;; *) echo "compare: --writeback takes off and/or on" >&2; exit 2 ;; esac; done
for n in "$ROUNDS" "$RUNTIME" "$RAMP" "$SMP"; do
  case $n in ''|*[!0-9]*) echo "compare: not a number: '$n'" >&2; exit 2 ;; esac
done
for k in $KERNELS; do case $k in trixie|bookworm) ;; *) echo "compare: unknown kernel $k" >&2; exit 2 ;; esac; done
case $FS_CACHE in never|auto|always) ;; *) echo "compare: --fs-cache must be never, auto or always" >&2; exit 2 ;; esac
for m in $POLLING; do
  case $m in busy|adaptive|adaptive:[0-9]*:[0-9]*) ;; *) echo "compare: bad --polling $m" >&2; exit 2 ;; esac
done
pname() { echo "$1" | tr ':' '-'; }   # adaptive:1000:50 -> adaptive-1000-50
for s in $SERVERS; do case $s in ours|virtiofsd) ;; *) echo "compare: unknown server $s" >&2; exit 2 ;; esac; done
[ -n "${JOBS// /}" ] || { echo "compare: --jobs is empty" >&2; exit 2; }
[ -f "$CONFIG" ] || { echo "compare: no profile $CONFIG" >&2; exit 2; }
qsize() { local q; q=$(sed -n 's/^queue_size *= *\([0-9]*\).*/\1/p' "$1" | head -1); echo "${q:-128}"; }
QSIZE=$(qsize "$CONFIG")
for l in $LAYOUTS; do case $l in shared|dedicated) ;; *) echo "compare: unknown layout $l" >&2; exit 2 ;; esac; done
[ -n "${LAYOUTS// /}" ] || { echo "compare: --layouts is empty" >&2; exit 2; }
if [[ " $LAYOUTS " == *" dedicated "* ]]; then
  [ -f "$DCONFIG" ] || { echo "compare: no profile $DCONFIG" >&2; exit 2; }
  [ "$(qsize "$DCONFIG")" = "$QSIZE" ] ||
    { echo "compare: $DCONFIG and $CONFIG have different queue sizes (the QD job and virtiofsd use one)" >&2; exit 2; }
  command -v taskset > /dev/null || { echo "compare: the dedicated layout needs taskset (util-linux)" >&2; exit 2; }
  # Cores 0 and 1 must both be ours to use.
  taskset -c 0,1 true 2> /dev/null || { echo "compare: the dedicated layout needs CPUs 0 and 1" >&2; exit 2; }
fi
QD=$((2 * QSIZE))

[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/vfdpu-compare.XXXXXX)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
log() { echo "[compare $(date +%T)] $*" | tee -a "$OUT/compare.log" >&2; }

# ---------------------------------------------------------------- prerequisites
if [ $SETUP = 1 ]; then
  VM_KERNELS="trixie $KERNELS" bash "$HERE/setup.sh" "$CACHE" > "$OUT/setup.out" 2>&1 ||
    { cat "$OUT/setup.out" >&2; exit 1; }
  VM_KERNELS="trixie $KERNELS" bash "$HERE/build-guest.sh" "$CACHE" >> "$OUT/setup.out" 2>&1 ||
    { cat "$OUT/setup.out" >&2; exit 1; }
fi
CACHE=$(cd "$CACHE" && pwd)
kcache() { if [ "$1" = trixie ]; then echo "$CACHE"; else echo "$CACHE/alt/$1"; fi; }
for k in $KERNELS; do
  [ -e "$(kcache "$k")/guest/base.cpio" ] || { echo "compare: no guest image for $k (run without --no-setup)" >&2; exit 2; }
done

# A private copy of the daemon: others may rebuild target/release while the rounds run.
mkdir -p "$OUT/bin" "$OUT/profiles"
if [[ " $SERVERS " == *" ours "* ]]; then
  [ -x "$DAEMON" ] || { echo "compare: no daemon $DAEMON (cargo build --release)" >&2; exit 2; }
  cp "$DAEMON" "$OUT/bin/virtiofs-dpu"
  for m in $POLLING; do
    IFS=: read -r mode spin sleep <<< "$m"
    sed -e "s/^polling *=.*/polling = \"$mode\"/" \
        ${spin:+-e "s/^idle_spin_us *=.*/idle_spin_us = $spin/"} \
        ${sleep:+-e "s/^idle_sleep_us *=.*/idle_sleep_us = $sleep/"} "$CONFIG" > "$OUT/profiles/$(pname "$m").toml"
    grep -q "^polling = \"$mode\"" "$OUT/profiles/$(pname "$m").toml" ||
      { echo "compare: $CONFIG has no polling = line" >&2; exit 2; }
  done
  cp "$DCONFIG" "$OUT/profiles/dedicated.toml"
  # The dedicated layout's file server runs on core 1 (with all its threads).
  printf '#!/bin/sh\nexec taskset -c 1 "%s" "$@"\n' "$OUT/bin/virtiofs-dpu" > "$OUT/bin/virtiofs-dpu-core1"
  chmod +x "$OUT/bin/virtiofs-dpu-core1"
fi
# ... and QEMU on core 0.
printf '#!/bin/sh\nexec taskset -c 0 "%s" "$@"\n' "$CACHE/bin/qemu-system-x86_64" > "$OUT/bin/qemu-core0"
chmod +x "$OUT/bin/qemu-core0"

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -r), $(nproc) cpus, $(sed -n 's/^model name.*: //p' /proc/cpuinfo | head -1)"
  echo "qemu: $("$CACHE/bin/qemu-system-x86_64" --version | head -1)"
  echo "virtiofsd: $("$CACHE/bin/virtiofsd" --version 2>&1 | head -1)"
  [ ! -e "$OUT/bin/virtiofs-dpu" ] || echo "daemon: $DAEMON sha256 $(sha256sum "$OUT/bin/virtiofs-dpu" | cut -c1-16) mtime $(date -u -r "$DAEMON" +%FT%TZ)"
  echo "scripts: repo HEAD $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?') (the daemon line says which binary ran)"
  echo "profile: $CONFIG (queue_size $QSIZE -> QD $QD); polling: $POLLING"
  echo "layouts: $LAYOUTS (dedicated: 1 vCPU, QEMU on core 0, file server on core 1, our profile $DCONFIG)"
  echo "rounds $ROUNDS, runtime ${RUNTIME}s + ramp ${RAMP}s per job, jobs: $JOBS"
  echo "guest: smp $SMP (shared layout), mem $MEM, kernels: $KERNELS; servers: $SERVERS"
  echo "guest cache policy (both servers): $FS_CACHE; writeback caching: $WRITEBACK"
  echo "virtiofsd: --cache=$FS_CACHE --sandbox=namespace, vhost-user-fs-pci queue-size=$QSIZE, tmpfs dir"
} > "$OUT/config.txt"
sed 's/^/  /' "$OUT/config.txt" >&2

# ---------------------------------------------------------------- runners
VPID=""; SHARE=""; SOCKDIR=""
cleanup() {
  local rc=$?
  if [ -n "$VPID" ] && kill -0 "$VPID" 2>/dev/null; then
    kill -TERM "$VPID" 2>/dev/null || true
    wait "$VPID" 2>/dev/null || true
  fi
  [ -z "$SHARE" ] || rm -rf "$SHARE"
  [ -z "$SOCKDIR" ] || rm -rf "$SOCKDIR"
  return $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

cpu_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }

GUEST_ENV=(-e "FIO_JOBS=$JOBS" -e "FIO_RUNTIME=$RUNTIME" -e "FIO_RAMP=$RAMP" -e "FIO_QD=$QD")
TIMEOUT=$(( 120 + $(echo $JOBS | wc -w) * (RUNTIME + RAMP + 30) ))

# Per layout: guest vCPUs, the QEMU binary (VM_QEMU of run-guest.sh), and what runs the servers.
lsmp() { if [ "$1" = dedicated ]; then echo 1; else echo "$SMP"; fi; }
lqemu() { if [ "$1" = dedicated ]; then echo "$OUT/bin/qemu-core0"; else echo "$CACHE/bin/qemu-system-x86_64"; fi; }

run_ours() { # DIR KCACHE POLLING LAYOUT WRITEBACK
  local daemon=$OUT/bin/virtiofs-dpu profile=$OUT/profiles/$3.toml wb=()
  if [ "$4" = dedicated ]; then daemon=$OUT/bin/virtiofs-dpu-core1; profile=$OUT/profiles/dedicated.toml; fi
  [ "$5" != on ] || wb=(--daemon-arg --writeback)
  VM_QEMU=$(lqemu "$4") bash "$HERE/run-device-test.sh" --daemon "$daemon" --config "$profile" \
    --daemon-arg --cache --daemon-arg "$FS_CACHE" ${wb[@]+"${wb[@]}"} \
    --tag "$TAG" --out "$1" --cache "$2" --smp "$(lsmp "$4")" --mem "$MEM" --timeout "$TIMEOUT" \
    "${GUEST_ENV[@]}" -e "FIO_LABEL=ours-$3-$4" "$HERE/guest/fio-compare.sh"
}

run_virtiofsd() { # DIR KCACHE LAYOUT WRITEBACK
  local dir=$1 kc=$2 rc=0 n=300 pin=() wb=()
  [ "$3" != dedicated ] || pin=(taskset -c 1)
  [ "$4" != on ] || wb=(--writeback)
  SHARE=$(mktemp -d /dev/shm/vfdpu-share.XXXXXX)
  SOCKDIR=$(mktemp -d /tmp/vfdpu-cmp.XXXXXX)
  ${pin[@]+"${pin[@]}"} "$CACHE/bin/virtiofsd" --socket-path="$SOCKDIR/vfsd.sock" --shared-dir="$SHARE" \
    --cache="$FS_CACHE" --sandbox=namespace --log-level=warn ${wb[@]+"${wb[@]}"} \
    < /dev/null > "$dir/virtiofsd.log" 2>&1 &
  VPID=$!
  while [ ! -S "$SOCKDIR/vfsd.sock" ] && [ $n -gt 0 ] && kill -0 "$VPID" 2>/dev/null; do sleep 0.1; n=$((n - 1)); done
  if [ ! -S "$SOCKDIR/vfsd.sock" ]; then
    log "virtiofsd did not start; see $dir/virtiofsd.log"; rc=3
  else
    VM_QEMU=$(lqemu "$3") bash "$HERE/run-guest.sh" --cache "$kc" --log "$dir/console.log" --smp "$(lsmp "$3")" \
      --mem "$MEM" --timeout "$TIMEOUT" --append "vm.tag=$TAG" "${GUEST_ENV[@]}" -e "FIO_LABEL=virtiofsd-$3" \
      "$HERE/guest/fio-compare.sh" -- \
      -chardev "socket,id=vfsd0,path=$SOCKDIR/vfsd.sock" \
      -device "vhost-user-fs-pci,chardev=vfsd0,tag=$TAG,queue-size=$QSIZE" || rc=$?
  fi
  # virtiofsd exits when QEMU disconnects; give it a moment, then stop it
  n=50; while kill -0 "$VPID" 2>/dev/null && [ $n -gt 0 ]; do sleep 0.1; n=$((n - 1)); done
  kill -TERM "$VPID" 2>/dev/null || true
  wait "$VPID" 2>/dev/null || true
  VPID=""
  rm -rf "$SHARE" "$SOCKDIR"; SHARE=""; SOCKDIR=""
  return $rc
}

# ---------------------------------------------------------------- rounds
variants_of() { # LAYOUT: our polling modes (busy alone, from the profile, when dedicated), virtiofsd
  local s m
  for s in $SERVERS; do
    if [ "$s" = virtiofsd ]; then echo virtiofsd
    elif [ "$1" = dedicated ]; then echo "ours-$(sed -n 's/^polling *= *"\([a-z]*\)".*/\1/p' "$DCONFIG" | head -1)"
    else for m in $POLLING; do echo "ours-$(pname "$m")"; done
    fi
  done
}
fails=0
t0=$(date +%s)
for r in $(seq 1 "$ROUNDS"); do
  for k in $KERNELS; do
   for l in $LAYOUTS; do
   for w in $WRITEBACK; do
    for v in $(variants_of "$l"); do
      dir=$OUT/$r-$k-$l-$v
      [ "$w" = off ] || dir=$OUT/$r-$k-$l-wb-$v
      mkdir -p "$dir"
      read -r b0 t0c < <(cpu_busy)
      s0=$(date +%s.%N)
      log "round $r/$ROUNDS kernel $k, $l cores, writeback $w: $v"
      rc=0
      if [ "$v" = virtiofsd ]; then
        run_virtiofsd "$dir" "$(kcache "$k")" "$l" "$w" > "$dir/runner.log" 2>&1 || rc=$?
      else
        run_ours "$dir" "$(kcache "$k")" "${v#ours-}" "$l" "$w" > "$dir/runner.log" 2>&1 || rc=$?
      fi
      read -r b1 t1c < <(cpu_busy)
      wall=$(awk -v a="$s0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
      busy=$(awk -v a="$b0" -v b="$b1" -v c="$t0c" -v d="$t1c" 'BEGIN{if (d>c) printf "%.0f", 100*(b-a)/(d-c); else print "?"}')
      printf 'round=%s kernel=%s layout=%s writeback=%s variant=%s rc=%s wall=%s host_busy_pct=%s loadavg=%s\n' \
        "$r" "$k" "$l" "$w" "$v" "$rc" "$wall" "$busy" "$(cut -d' ' -f1 /proc/loadavg)" > "$dir/meta"
      log "  rc=$rc wall=${wall}s host cpu busy ${busy}% ($(tr -d '\r' < "$dir/console.log" 2>/dev/null | grep -a '^VMRESULT: suite=fio-compare' | head -1))"
      if [ $rc != 0 ]; then
        fails=$((fails + 1))
        tail -n 15 "$dir/runner.log" | sed 's/^/    /' >&2
      fi
    done
   done
   done
  done
done
log "all rounds: $(( $(date +%s) - t0 )) s, $fails failed run(s)"
python3 "$HERE/fio-compare.py" "$OUT" | tee "$OUT/summary.txt"
exit $(( fails > 0 ))
