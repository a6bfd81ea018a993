#!/bin/sh
# tools/vm/guest/nfs-compare.sh: the fio jobs of tools/vm/nfs-compare.sh (busybox sh, in the guest).
#
# One boot, two clients of one NFS export: our device (the virtio-fs tag, mounted on
# /mnt/virtiofs; the daemon serves the export with --remote) and the guest kernel's own NFSv3
# client (/mnt/knfs, over virtio-net and QEMU's user networking with restrict=on, whose only way
# out is a guestfwd of KNFS_ADDR:KNFS_PORT and :KNFS_MOUNTPORT to the server on the host's
# loopback). Each client has a file of its own on the export (vfdpu-ours.dat, vfdpu-knfs.dat), so
# neither sees the other's cache. FIO_ROUNDS rounds; in each, every job of FIO_JOBS runs on one
# client and then the other (ours first in odd rounds, the kernel's first in even ones), each
# with fio's JSON between
#   VMNFS-BEGIN round=R job=J client=ours|knfs cpu0=B0/T0 cpu1=B1/T1 wall=S   and   VMNFS-END rc=N
# where cpuN is /proc/stat's aggregate cpu line before and after the job: busy (user + nice +
# system + irq + softirq + steal) / total, in USER_HZ ticks, and S the job's seconds
# (tools/vm/nfs-compare.py divides the busy ticks by the operations fio did, with and without
# the idle guest's own busy time, measured at the start of each round over as long as a job:
#   VMNFS-IDLE round=R cpu0=B0/T0 cpu1=B1/T1 wall=S). The jobs are fio_job_args' (lib.sh), O_DIRECT, one fio
# thread, time-based with no ramp (so fio's operation count covers the whole CPU window; fio's
# start and exit are in it too, the same for both clients).
#
# Parameters (-e KEY=VAL): KNFS_ADDR (10.0.2.100), KNFS_PORT, KNFS_MOUNTPORT, KNFS_EXPORT (the
# export's path), FIO_JOBS (tools/vm/nfs-compare.sh's), FIO_ROUNDS (3), FIO_RUNTIME (3 s per
# job), FIO_SIZE (64M per file), FIO_QD (16). At the end, as VMNFS-INFO lines: the guest's TCP
# counters (/proc/net/snmp, /proc/net/netstat) and the kernel client's per-operation counts
# (/proc/self/mountstats: READ, WRITE, COMMIT: ops, transmissions, timeouts, bytes sent and
# received, then queue, RTT and execution time in ms, summed).
. /harness/lib.sh

JOBS=${FIO_JOBS:-randread-4k-qd1 randwrite-4k-qd1 randwrite-4k-qd1-sync randread-4k-qdN seqread-1m seqwrite-1m seqwrite-1m-sync}
ROUNDS=${FIO_ROUNDS:-3}
RT=${FIO_RUNTIME:-3}
SIZE=${FIO_SIZE:-64M}
QD=${FIO_QD:-16}
ADDR=${KNFS_ADDR:-10.0.2.100}
t0=$(vm_now)
fail() { vm_result nfs-compare "status=FAIL reason=$1 time=$(vm_elapsed "$t0")s"; exit 1; }
[ -n "${KNFS_PORT:-}" ] && [ -n "${KNFS_MOUNTPORT:-}" ] && [ -n "${KNFS_EXPORT:-}" ] || fail params

echo "VMNFS-INFO kernel=$(uname -r) cpus=$(grep -c ^processor /proc/cpuinfo) jobs=$(echo $JOBS | tr ' ' ,) rounds=$ROUNDS runtime=${RT}s size=$SIZE qd=$QD"

# The network: a static address on the one NIC (no DHCP client in the image).
vm_net_up || fail net
# restrict=on: the host itself (10.0.2.2, which QEMU's user networking maps to the host's
# loopback without restrict) must not answer on the server's port; only the guestfwd address does.
if ! vm_net_isolated "$KNFS_PORT"; then
  echo "VMNFS-INFO isolation=FAIL (10.0.2.2:$KNFS_PORT reachable)"
  fail isolation
fi
echo "VMNFS-INFO isolation=ok (10.0.2.2:$KNFS_PORT unreachable)"

vm_mount /mnt/virtiofs || fail mount-virtiofs
mkdir -p /mnt/knfs
if ! mount -t nfs -o "vers=3,proto=tcp,port=$KNFS_PORT,mountport=$KNFS_MOUNTPORT,mountproto=tcp,nolock" \
     "$ADDR:$KNFS_EXPORT" /mnt/knfs; then
  dmesg | tail -n 20
  fail mount-nfs
fi
grep ' /mnt/knfs ' /proc/mounts | sed 's/^/VMNFS-INFO mount: /'

file_of() { if [ "$1" = ours ]; then echo /mnt/virtiofs/vfdpu-ours.dat; else echo /mnt/knfs/vfdpu-knfs.dat; fi; }
for c in ours knfs; do
  fio --name=layout --filename="$(file_of $c)" --size="$SIZE" --rw=write --bs=1M --ioengine=psync \
      --direct=1 --end_fsync=1 --output-format=terse > /tmp/layout.out 2>&1 ||
    { cat /tmp/layout.out; fail "layout-$c"; }
  echo "VMNFS-INFO layout $c $SIZE at $(vm_elapsed "$t0")s"
done

# busy/total ticks of the aggregate cpu line
cpu() { awk '/^cpu /{printf "%d/%d", $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9; exit}' /proc/stat; }

fails=0
r=1
while [ "$r" -le "$ROUNDS" ]; do
  if [ $((r % 2)) = 1 ]; then order="ours knfs"; else order="knfs ours"; fi
  # The guest's own busy time with no I/O (timer ticks, kworkers: under TCG they are not small),
  # over as long as a job: nfs-compare.py subtracts it at this rate from each job's busy time.
  w0=$(vm_now); c0=$(cpu); sleep "$RT"; c1=$(cpu); w1=$(vm_now)
  echo "VMNFS-IDLE round=$r cpu0=$c0 cpu1=$c1 wall=$(awk -v a="$w0" -v b="$w1" 'BEGIN{printf "%.2f", b-a}')"
  for job in $JOBS; do
    args=$(fio_job_args "$job" "$QD") || { echo "nfs-compare: unknown job $job"; fails=$((fails + 1)); continue; }
    for c in $order; do
      rc=0
      w0=$(vm_now)
      c0=$(cpu)
      # shellcheck disable=SC2086
      fio --name="$job" --filename="$(file_of $c)" --size="$SIZE" --direct=1 --numjobs=1 --time_based \
          --runtime="$RT" --lat_percentiles=1 --percentile_list=50:99:99.9 \
          --output-format=json --output=/tmp/fio.json $args > /tmp/fio.err 2>&1 || rc=$?
      c1=$(cpu)
      w1=$(vm_now)
      echo "VMNFS-BEGIN round=$r job=$job client=$c cpu0=$c0 cpu1=$c1 wall=$(awk -v a="$w0" -v b="$w1" 'BEGIN{printf "%.2f", b-a}')"
      cat /tmp/fio.json
      echo
      echo "VMNFS-END rc=$rc"
      [ $rc = 0 ] || { fails=$((fails + 1)); sed 's/^/  fio: /' /tmp/fio.err; }
    done
  done
  r=$((r + 1))
done
rm -f "$(file_of ours)" "$(file_of knfs)"
# The guest's TCP counters (the kernel client's transport): segments, retransmissions, delayed ACKs.
awk '/^Tcp:/ { if (!h) { split($0, k); h = 1 } else { for (i = 2; i <= NF; i++) if (k[i] ~ /^(ActiveOpens|OutSegs|InSegs|RetransSegs)$/) printf "%s=%s ", k[i], $i; print "" } }' /proc/net/snmp |
  sed 's/^/VMNFS-INFO tcp: /'
awk '/^TcpExt:/ { if (!h) { split($0, k); h = 1 } else { for (i = 2; i <= NF; i++) if (k[i] ~ /^(DelayedACKs|DelayedACKLost|TCPTimeouts|TCPLossProbes|TCPSlowStartRetrans|TCPFastRetrans)$/) printf "%s=%s ", k[i], $i; print "" } }' /proc/net/netstat |
  sed 's/^/VMNFS-INFO tcpext: /'
sed -n '/mounted on \/mnt\/knfs /,/^device /p' /proc/self/mountstats |
  grep -E '^[[:space:]]+(READ|WRITE|COMMIT):' | sed 's/^[[:space:]]*/VMNFS-INFO knfs ops: /'
cd /
umount /mnt/knfs || fails=$((fails + 1))
vm_umount /mnt/virtiofs || fails=$((fails + 1))
# The kernel NFS client's messages (server not responding, ...) are the comparison's business too.
VM_DMESG_ALLOW='virtio_net' vm_dmesg_check nfs-compare || true
dmesg | grep -Ei 'nfs|rpc' | sed 's/^/VMNFS-INFO dmesg: /' | tail -n 20
if [ $fails = 0 ]; then
  vm_result nfs-compare "status=ok time=$(vm_elapsed "$t0")s"
else
  vm_result nfs-compare "status=FAIL failed=$fails time=$(vm_elapsed "$t0")s"
  exit 1
fi
