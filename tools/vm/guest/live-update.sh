#!/bin/sh
# Guest side of the live-update stage (tools/vm/run-update-test.sh): fsx and a fio job run on
# the mount while the host replaces the daemon's serving process (UPDATE_COUNT times). fsx must
# end A-OK, fio without an error, and the kernel log stay clean. fio's JSON is printed between
# VMFIO-JSON-BEGIN and VMFIO-JSON-END for the host to read the largest latency.
# Env: FSX_OPS (6000), FIO_SECONDS (20).
. /harness/lib.sh
vm_mount /mnt || exit 1
mkdir -p /tmp/fsx-artifacts
rm -f /mnt/fsx.dat /mnt/fio.dat
echo "UPDATE: go"
t0=$(vm_now)
fsx -N "${FSX_OPS:-6000}" -S 22 -f /harness/fsx.toml -P /tmp/fsx-artifacts /mnt/fsx.dat > /tmp/fsx.log 2>&1 &
fsx_pid=$!
fio --name=live-update --filename=/mnt/fio.dat --size=16M --rw=randrw --bs=4k --ioengine=psync \
    --direct=1 --time_based --runtime="${FIO_SECONDS:-20}" \
    --output-format=json --output=/tmp/fio.json > /tmp/fio.out 2>&1
fio_rc=$?
wait "$fsx_pid"
fsx_rc=$?
secs=$(vm_elapsed "$t0")
echo "UPDATE: done"
status=ok
if [ $fsx_rc -ne 0 ] || ! grep -q 'All operations completed A-OK' /tmp/fsx.log; then
  status=FAIL
  echo "fsx: FAILED (rc=$fsx_rc); its messages (the operation log left out):"
  grep -v '^\[ERROR fsx\] *[0-9]' /tmp/fsx.log | tail -n 40
  echo "fsx: the last 15 operations:"
  grep '^\[ERROR fsx\] *[0-9]' /tmp/fsx.log | tail -n 15
else
  tail -n 3 /tmp/fsx.log
fi
if [ $fio_rc -ne 0 ]; then
  status=FAIL
  echo "fio: FAILED (rc=$fio_rc)"
  cat /tmp/fio.out
fi
echo "VMFIO-JSON-BEGIN"
cat /tmp/fio.json
echo "VMFIO-JSON-END"
rm -f /mnt/fsx.dat /mnt/fio.dat
vm_umount /mnt || status=FAIL
vm_dmesg_check live-update || status=FAIL
vm_result live-update "status=$status fsx_rc=$fsx_rc fio_rc=$fio_rc secs=$secs"
[ "$status" = ok ]
