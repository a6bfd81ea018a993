#!/bin/sh
# Guest side of the live-update stage (tools/vm/run-update-test.sh): the functions of one
# daemon (VM_TAGS: their tags, space-separated; else the one of vm.tag=) are mounted, and fsx
# and a fio job run on every mount at once while the host replaces the daemon's serving process
# (UPDATE_COUNT times). Each fsx must end A-OK, fio without an error, and the kernel log stay
# clean. fio's JSON (one job per mount, named by its tag) is printed between VMFIO-JSON-BEGIN
# and VMFIO-JSON-END for the host to read the largest latency.
# Each mount's files are named by its tag (fsx.TAG.dat, fio.TAG.dat): two functions of one
# export (-nfs over NFSv3, -nfs41 over NFSv4.1) write different files. No locks are taken (a
# SETLKW waiting on an NFSv4.1 server refuses a live update). A tag ending in -nfs or -nfs41 gets
# fsx-nfs.toml (no hole punching on NFS). What fsx leaves is kept and its checksum printed
# (VMSUM: TAG MD5) for the host to compare with the share or export.
# Each fsx's time since the start is printed with its result (fsx on TAG: N operations A-OK in S s).
# Env: FSX_OPS (6000, per mount), FSX41_OPS (2000: on an -nfs41 mount, which keeps the stage's
# wall time; its fsx still outlasts the updates), FIO_SECONDS (20).
. /harness/lib.sh
TAGS=${VM_TAGS:-$(vm_tag)}
fsx_ops() { case $1 in *-nfs41) echo "${FSX41_OPS:-2000}" ;; *) echo "${FSX_OPS:-6000}" ;; esac; }
mkdir -p /tmp/fsx-artifacts
fio_jobs=""
for t in $TAGS; do
  VM_TAG=$t vm_mount "/mnt/$t" || exit 1
  rm -f "/mnt/$t/fsx.$t.dat" "/mnt/$t/fio.$t.dat"
  fio_jobs="$fio_jobs --name=$t --filename=/mnt/$t/fio.$t.dat"
done
echo "UPDATE: go"
t0=$(vm_now)
pids=""
seed=22
for t in $TAGS; do
  mkdir -p "/tmp/fsx-artifacts/$t"
  cfg=/harness/fsx.toml
  case $t in *-nfs|*-nfs41) cfg=/harness/fsx-nfs.toml ;; esac
  (
    fsx -N "$(fsx_ops "$t")" -S "$seed" -f "$cfg" -P "/tmp/fsx-artifacts/$t" "/mnt/$t/fsx.$t.dat" \
      > "/tmp/fsx-$t.log" 2>&1
    rc=$?
    vm_elapsed "$t0" > "/tmp/fsx-$t.secs"
    exit $rc
  ) &
  pids="$pids $!"
  seed=$((seed + 1))
done
# shellcheck disable=SC2086 # one --name/--filename pair per mount
fio --size=16M --rw=randrw --bs=4k --ioengine=psync --direct=1 --time_based \
    --runtime="${FIO_SECONDS:-20}" $fio_jobs \
    --output-format=json --output=/tmp/fio.json > /tmp/fio.out 2>&1
fio_rc=$?
fsx_rc=0
for p in $pids; do
  wait "$p" || fsx_rc=$?
done
secs=$(vm_elapsed "$t0")
echo "UPDATE: done"
status=ok
for t in $TAGS; do
  if grep -q 'All operations completed A-OK' "/tmp/fsx-$t.log"; then
    echo "fsx on $t: $(fsx_ops "$t") operations A-OK in $(cat "/tmp/fsx-$t.secs") s"
  else
    status=FAIL
    echo "fsx on $t: FAILED; its messages (the operation log left out):"
    grep -v '^\[ERROR fsx\] *[0-9]' "/tmp/fsx-$t.log" | tail -n 40
    echo "fsx on $t: the last 15 operations:"
    grep '^\[ERROR fsx\] *[0-9]' "/tmp/fsx-$t.log" | tail -n 15
  fi
done
if [ $fio_rc -ne 0 ]; then
  status=FAIL
  echo "fio: FAILED (rc=$fio_rc)"
  cat /tmp/fio.out
fi
echo "VMFIO-JSON-BEGIN"
cat /tmp/fio.json
echo "VMFIO-JSON-END"
for t in $TAGS; do
  echo "VMSUM: $t $(md5sum < "/mnt/$t/fsx.$t.dat" | cut -d' ' -f1)"
  rm -f "/mnt/$t/fio.$t.dat"
  vm_umount "/mnt/$t" || status=FAIL
done
vm_dmesg_check live-update || status=FAIL
vm_result live-update "status=$status tags=$(echo $TAGS | tr ' ' ,) fsx_rc=$fsx_rc fio_rc=$fio_rc secs=$secs"
[ "$status" = ok ]
