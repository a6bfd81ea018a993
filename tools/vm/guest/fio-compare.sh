#!/bin/sh
# tools/vm/guest/fio-compare.sh: the fio jobs of tools/vm/compare.sh (busybox sh, in the guest).
#
# Mounts the tag on /mnt, lays out one test file with 1 MiB O_DIRECT writes, then runs each job in
# FIO_JOBS with fio's JSON output printed between
#   VMFIO-BEGIN <job>          and       VMFIO-END <job> rc=N
# lines on the console (tools/vm/fio-compare.py reads them). Jobs (all O_DIRECT, one fio thread):
#   randread-4k-qd1    4k random read,  psync, iodepth 1
#   randwrite-4k-qd1   4k random write, psync, iodepth 1
#   randread-4k-qdN    4k random read,  libaio, iodepth FIO_QD (compare.sh: 2 x the queue size)
#   seqwrite-1m        1 MiB sequential write, psync, iodepth 1
#   (these from fio_job_args in lib.sh, shared with guest/nfs-compare.sh)
#   seqwrite-1m-cpu1   the same pinned to CPU 1 (--cpus_allowed=1): with one request queue per
#                      vCPU the guest driver puts it on CPU 1's own queue (the seed's core-local
#                      queue choice); with one queue, on the only one
#   write-1m-buffered-2j  buffered (not O_DIRECT) 1 MiB sequential writes, two fio jobs of
#                      FIO_WB_SIZE (256M) each on files of their own, then fsync, size-based (not
#                      --runtime): the writeback seed's job, group-reported; the bandwidth includes
#                      the final fsync, so a page cache that only absorbed the data gains nothing
# Latency percentiles are fio's total latency (lat = submission + completion): with libaio a
# request that waits for a FUSE background slot waits inside io_submit (fio's slat), with psync
# slat is zero; lat counts both the same way.
#
# Parameters (-e KEY=VAL): FIO_JOBS ("randread-4k-qd1 randwrite-4k-qd1 randread-4k-qdN seqwrite-1m"),
# FIO_RUNTIME (10 s per job), FIO_RAMP (2 s, not measured), FIO_SIZE (256M), FIO_QD (256),
# FIO_LABEL (free text echoed in the result line).
# The async requests in flight are bounded by the server's INIT max_background (virtiofsd: 65535,
# our backend: 64): virtiofs connections have no fusectl entry (no_control), so the guest cannot
# change it.
. /harness/lib.sh

JOBS=${FIO_JOBS:-randread-4k-qd1 randwrite-4k-qd1 randread-4k-qdN seqwrite-1m}
RT=${FIO_RUNTIME:-10}
RAMP=${FIO_RAMP:-2}
SIZE=${FIO_SIZE:-256M}
QD=${FIO_QD:-256}
F=/mnt/fio-compare.dat
t0=$(vm_now)

echo "VMFIO-INFO kernel=$(uname -r) cpus=$(grep -c ^processor /proc/cpuinfo) label=${FIO_LABEL:-}"
vm_mount /mnt || { vm_result fio-compare "status=FAIL reason=mount"; exit 1; }

for q in /sys/bus/virtio/devices/*; do
  # virtio device id 26 = virtio-fs: print the features the guest negotiated
  [ "$(cat "$q/device" 2>/dev/null)" = 0x001a ] && echo "VMFIO-INFO virtio-fs $(basename "$q") features=$(cat "$q/features")"
done

fio --name=layout --filename=$F --size=$SIZE --rw=write --bs=1M --ioengine=psync --direct=1 \
    --end_fsync=1 --output-format=terse > /tmp/layout.out 2>&1 ||
  { cat /tmp/layout.out; vm_result fio-compare "status=FAIL reason=layout"; exit 1; }
echo "VMFIO-INFO layout=$SIZE in $(vm_elapsed "$t0")s"

fails=0
for job in $JOBS; do
  case $job in
    write-1m-buffered-2j) args="" ;;
    *) args=$(fio_job_args "$job" "$QD") || { echo "fio-compare: unknown job $job"; fails=$((fails + 1)); continue; } ;;
  esac
  rc=0
  if [ "$job" = write-1m-buffered-2j ]; then
    rm -f /mnt/wb.0 /mnt/wb.1
    fio --name="$job" --directory=/mnt --filename_format='wb.$jobnum' --size="${FIO_WB_SIZE:-256M}" \
        --rw=write --bs=1M --direct=0 --numjobs=2 --ioengine=psync --end_fsync=1 --group_reporting \
        --lat_percentiles=1 --percentile_list=50:99:99.9 \
        --output-format=json --output=/tmp/fio.json > /tmp/fio.err 2>&1 || rc=$?
    rm -f /mnt/wb.0 /mnt/wb.1
  else
  # shellcheck disable=SC2086
  fio --name="$job" --filename=$F --size=$SIZE --direct=1 --numjobs=1 --time_based \
      --runtime="$RT" --ramp_time="$RAMP" --lat_percentiles=1 --percentile_list=50:99:99.9 \
      --output-format=json --output=/tmp/fio.json $args > /tmp/fio.err 2>&1 || rc=$?
  fi
  echo "VMFIO-BEGIN $job"
  cat /tmp/fio.json
  echo
  echo "VMFIO-END $job rc=$rc"
  [ $rc = 0 ] || { fails=$((fails + 1)); sed 's/^/  fio: /' /tmp/fio.err; }
done
rm -f $F
vm_umount /mnt || fails=$((fails + 1))
vm_dmesg_check fio-compare || true   # reported, not fatal: the jobs' numbers are the point
if [ $fails = 0 ]; then
  vm_result fio-compare "status=ok jobs=$(echo $JOBS | wc -w) time=$(vm_elapsed "$t0")s"
else
  vm_result fio-compare "status=FAIL failed=$fails time=$(vm_elapsed "$t0")s"
  exit 1
fi
