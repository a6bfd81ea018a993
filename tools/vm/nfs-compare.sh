#!/bin/bash
# tools/vm/nfs-compare.sh [options]: the same fio jobs through our device on an NFS export and
# through the guest kernel's own NFSv3 client on the same export, in one boot, alternating
# rounds, and a table of ratios (ours / kernel NFS; medians over rounds) with the guest's CPU time
# per operation.
#
# The export: nfs-ganesha (tools/nfs/ganesha.sh, listening on 127.0.0.1 only) serving a fresh
# directory. Our daemon serves it with --remote URL (profile --config) as a vfio-user-pci device;
# the guest (CACHE/alt/knfs: the trixie kernel with its NFS client and virtio-net modules, which
# setup.sh and build-guest.sh make with VM_GUEST_NFS=1) also has a virtio-net NIC on QEMU's user
# networking with restrict=on (no way out) and two guestfwd rules, 10.0.2.100:NFSPORT and
# :MOUNTPORT to the same ports on the host's 127.0.0.1 (TCP_NODELAY), so the kernel client mounts
# 10.0.2.100:EXPORT (vers=3, proto=tcp, nolock). guest/nfs-compare.sh runs the jobs on both
# mounts in turn (each on a file of its own) and nfs-compare.py prints the tables.
#
# Jobs (fio_job_args in guest/lib.sh, O_DIRECT, one fio thread, time-based): randread-4k-qd1,
# randwrite-4k-qd1 (psync), randread-4k-qdN (libaio, iodepth --qd, default 16), seqread-1m,
# seqwrite-1m (psync), and the two writes again with O_SYNC (randwrite-4k-qd1-sync,
# seqwrite-1m-sync). Why both: the kernel NFS client sends an O_DIRECT write that fits one
# WRITE call FILE_SYNC (the server syncs each, with or without O_SYNC), while our device sends
# it UNSTABLE and COMMITs in the background or at FSYNC/FLUSH/close: without O_SYNC the write
# jobs compare a durable write with one that is not yet; with O_SYNC both are durable when
# write(2) returns (ours: WRITE + the FSYNC's COMMIT).
#
# Options:
#   --rounds N       rounds (default 3)
#   --runtime S      seconds per fio job (default 3)
#   --size SIZE      each client's file (default 64M)
#   --qd N           the QD job's iodepth (default 16)
#   --jobs "J ..."   a subset of the jobs
#   --config FILE    our profile (default hw-configs/bench-guest.toml)
#   --smp N | --mem SIZE  guest vCPUs / RAM (default 2 / 2G)
#   --daemon PATH    our daemon (default target/release/virtiofs-dpu; copied into OUT first)
#   --out DIR        output dir (default a new /tmp/vfdpu-nfscmp.XXXXXX)
#   --no-setup       skip setup.sh / build-guest.sh / ganesha.sh install
# Env: VM_CACHE (harness cache). Needs root (ganesha's FSAL_VFS).
# Default run: one boot, 7 jobs x 2 clients x 3 rounds of 3 s, about 3-4 minutes under TCG on 2 cores.
# Results and what they mean: tools/vm/COMPARE-RESULTS.md.
# Output: OUT/console.log, daemon.log, stats.json, ports.txt (ganesha's listening sockets),
# summary.md, summary.json. Exit status 0 when the guest run passed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
. "$HERE/host-lib.sh"
ROUNDS=3
RUNTIME=3
SIZE=64M
QD=16
JOBS="randread-4k-qd1 randwrite-4k-qd1 randwrite-4k-qd1-sync randread-4k-qdN seqread-1m seqwrite-1m seqwrite-1m-sync"
CONFIG=$REPO/hw-configs/bench-guest.toml
SMP=${VM_SMP:-2}
MEM=${VM_MEM:-2G}
DAEMON=${VFDPU_DAEMON:-$REPO/target/release/virtiofs-dpu}
OUT=""
SETUP=1
CACHE=${VM_CACHE:-/var/tmp/virtiofs-dpu-vm}
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --qd) QD=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --smp) SMP=$2; shift 2 ;;
    --mem) MEM=$2; shift 2 ;;
    --daemon) DAEMON=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-setup) SETUP=0; shift ;;
    -h|--help) usage ;;
    *) echo "nfs-compare: unknown argument $1" >&2; usage ;;
  esac
done
for n in "$ROUNDS" "$RUNTIME" "$QD" "$SMP"; do
  case $n in ''|*[!0-9]*|0) echo "nfs-compare: not a positive number: '$n'" >&2; exit 2 ;; esac
done
case $SIZE in [0-9]*[KMG]|[0-9]*) ;; *) echo "nfs-compare: bad --size $SIZE" >&2; exit 2 ;; esac
[ -n "${JOBS// /}" ] || { echo "nfs-compare: --jobs is empty" >&2; exit 2; }
for j in $JOBS; do
  case $j in randread-4k-qd1|randwrite-4k-qd1|randwrite-4k-qd1-sync|randread-4k-qdN|seqread-1m|seqwrite-1m|seqwrite-1m-sync) ;;
    *) echo "nfs-compare: unknown job $j" >&2; exit 2 ;; esac
done
[ -f "$CONFIG" ] || { echo "nfs-compare: no profile $CONFIG" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "nfs-compare: needs root (ganesha's FSAL_VFS)" >&2; exit 2; }

[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/vfdpu-nfscmp.XXXXXX)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
log() { echo "[nfs-compare $(date +%T)] $*" | tee -a "$OUT/compare.log" >&2; }

if [ $SETUP = 1 ]; then
  { VM_GUEST_NFS=1 bash "$HERE/setup.sh" "$CACHE" && VM_GUEST_NFS=1 bash "$HERE/build-guest.sh" "$CACHE" &&
    bash "$REPO/tools/nfs/ganesha.sh" install; } > "$OUT/setup.out" 2>&1 ||
    { cat "$OUT/setup.out" >&2; exit 1; }
fi
CACHE=$(cd "$CACHE" && pwd)
KC=$CACHE/alt/knfs
[ -e "$KC/guest/base.cpio" ] || { echo "nfs-compare: no $KC (run without --no-setup)" >&2; exit 2; }
[ -x "$DAEMON" ] || { echo "nfs-compare: no daemon $DAEMON (cargo build --release)" >&2; exit 2; }
mkdir -p "$OUT/bin"
cp "$DAEMON" "$OUT/bin/virtiofs-dpu"

NFSD=$(mktemp -d /tmp/vfdpu-nfscmp-srv.XXXXXX)
cleanup() {
  local rc=$?
  bash "$REPO/tools/nfs/ganesha.sh" stop "$NFSD" > /dev/null 2>&1 || true
  rm -rf "$NFSD"
  return $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
URL=$(bash "$REPO/tools/nfs/ganesha.sh" start "$NFSD" 2>> "$OUT/compare.log")
# nfs://127.0.0.1/PATH?nfsport=N&mountport=M
EXPORT=$(echo "$URL" | sed -n 's|^nfs://127\.0\.0\.1\(/[^?]*\)?.*|\1|p')
NPORT=$(echo "$URL" | sed -n 's/.*[?&]nfsport=\([0-9]*\).*/\1/p')
MPORT=$(echo "$URL" | sed -n 's/.*[?&]mountport=\([0-9]*\).*/\1/p')
[ -n "$EXPORT" ] && [ -n "$NPORT" ] && [ -n "$MPORT" ] || { echo "nfs-compare: cannot read the URL $URL" >&2; exit 1; }
# ganesha listens on the loopback only: anything else is a failure, not a footnote.
pid=$(cat "$NFSD/ganesha.pid")
ss -Hltnup | grep "pid=$pid," > "$OUT/ports.txt" || true
if awk '{print $5}' "$OUT/ports.txt" | grep -Ev '^(\[::ffff:)?127\.0\.0\.1\]?:' ; then
  echo "nfs-compare: ganesha listens beyond 127.0.0.1 (see $OUT/ports.txt)" >&2; exit 1
fi

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -r), $(nproc) cpus, $(sed -n 's/^model name.*: //p' /proc/cpuinfo | head -1), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "qemu: $("$CACHE/bin/qemu-system-x86_64" --version | head -1)"
  echo "daemon: $DAEMON sha256 $(sha256sum "$OUT/bin/virtiofs-dpu" | cut -c1-16); profile $CONFIG"
  echo "scripts: repo HEAD $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "export: $URL (ganesha $(dpkg-query -W -f='${Version}' nfs-ganesha 2>/dev/null), FSAL_VFS)"
  echo "rounds $ROUNDS, runtime ${RUNTIME}s per job, file $SIZE per client, QD $QD, jobs: $JOBS"
  echo "guest: smp $SMP, mem $MEM, kernel $(basename "$(readlink -f "$CACHE/kernel/vmlinuz")")"
} > "$OUT/config.txt"
sed 's/^/  /' "$OUT/config.txt" >&2

NJOBS=$(echo $JOBS | wc -w)
TIMEOUT=$(( 300 + ROUNDS * NJOBS * 2 * (RUNTIME + 30) ))
# restrict=on, guestfwd of both ports with nodelay=on (host-lib.sh says why)
NET=$(knfs_netdev "$NPORT" "$MPORT")
log "one boot: $ROUNDS rounds x $NJOBS jobs x 2 clients on $URL"
s0=$(date +%s)
read -r b0 t0 < <(awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
rc=0
bash "$HERE/run-device-test.sh" --daemon "$OUT/bin/virtiofs-dpu" --config "$CONFIG" \
  --daemon-arg --remote --daemon-arg "$URL" --tag bench --out "$OUT" --cache "$KC" \
  --smp "$SMP" --mem "$MEM" --timeout "$TIMEOUT" \
  -e "KNFS_PORT=$NPORT" -e "KNFS_MOUNTPORT=$MPORT" -e "KNFS_EXPORT=$EXPORT" -e "FIO_JOBS=$JOBS" \
  -e "FIO_ROUNDS=$ROUNDS" -e "FIO_RUNTIME=$RUNTIME" -e "FIO_SIZE=$SIZE" -e "FIO_QD=$QD" \
  "$HERE/guest/nfs-compare.sh" -- -netdev "$NET" -device virtio-net-pci,netdev=n0 \
  > "$OUT/runner.log" 2>&1 || rc=$?
read -r b1 t1 < <(awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat)
log "rc=$rc wall=$(( $(date +%s) - s0 ))s host cpu busy $(awk -v a="$b0" -v b="$b1" -v c="$t0" -v d="$t1" 'BEGIN{if (d>c) printf "%.0f", 100*(b-a)/(d-c); else print "?"}')% load $(cut -d' ' -f1-3 /proc/loadavg)"
[ $rc = 0 ] || tail -n 20 "$OUT/runner.log" >&2
grep -a '^VMNFS-INFO' "$OUT/console.log" | tr -d '\r' | sed 's/^/  /' >&2 || true
python3 "$HERE/nfs-compare.py" "$OUT" | tee "$OUT/summary.txt"
exit $rc
