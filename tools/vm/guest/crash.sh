#!/bin/sh
# Guest side of the crash stage (tools/vm/run-crash-test.sh): a RAM-filesystem function whose
# serving process the host kills with SIGKILL while the guest reads from it in a loop
# (O_DIRECT, so every read reaches the device). What must hold: no read hangs (each answers,
# with the data before the kill, with EIO once the function's state is gone), the kernel log
# stays clean, and once the driver lets the device go and takes it again (unbind and bind:
# a device reset) a fresh filesystem mounts and serves.
. /harness/lib.sh
TAG=$(vm_tag)
vm_mount /mnt || exit 1
dd if=/dev/urandom of=/mnt/data bs=4k count=16 2>/dev/null || { echo "crash: no data file"; exit 1; }
# Each read's outcome, one line each; a read that hangs stops the log growing.
( while :; do
    if dd if=/mnt/data of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null; then echo ok; else echo err; fi
  done ) > /tmp/reads.log &
loop=$!
# A request certainly in flight at the kill: an F_SETLKW waiting in the device for a lock
# another process holds (6 s); the new process must answer it from its in-flight record.
: > /mnt/lock
/harness/locktest posix /mnt/lock 6000 > /tmp/locktest.out 2>&1 &
lock_pid=$!
sleep 2
echo "CRASH: go"
# The host kills the serving process once it sees that line; EIO must come within 60 s and
# reads must go on answering after it.
t0=$(vm_now)
status=ok
until grep -q err /tmp/reads.log; do
  if [ "$(vm_elapsed "$t0" | cut -d. -f1)" -ge 60 ]; then
    echo "crash: no read answered with an error within 60 s of the kill"; status=FAIL; break
  fi
  sleep 0.2
done
secs=$(vm_elapsed "$t0")
n1=$(wc -l < /tmp/reads.log)
sleep 1
n2=$(wc -l < /tmp/reads.log)
[ "$n2" -gt "$n1" ] || { echo "crash: reads stopped answering ($n1 then $n2)"; status=FAIL; }
kill "$loop"; wait "$loop" 2>/dev/null
# The waiting F_SETLKW was answered (EIO: the lock table died with the process) well before
# its holder let go.
wait "$lock_pid"
cat /tmp/locktest.out
if grep -q 'Input/output error' /tmp/locktest.out; then
  echo "crash: the F_SETLKW in flight at the kill was answered with EIO"
else
  echo "crash: the F_SETLKW in flight at the kill was not answered with EIO"; status=FAIL
fi
echo "crash: reads $(grep -c ok /tmp/reads.log) ok, $(grep -c err /tmp/reads.log) EIO; the first EIO seen ${secs}s after the go"
echo "CRASH: seen"
# Let the device go and take it again: a reset, after which a fresh filesystem serves.
umount /mnt || umount -l /mnt || { echo "crash: umount failed"; status=FAIL; }
dev=$(basename "$(readlink -f /sys/bus/virtio/drivers/virtiofs/virtio* 2>/dev/null | head -1)")
if [ -n "$dev" ] && echo "$dev" > /sys/bus/virtio/drivers/virtiofs/unbind &&
   echo "$dev" > /sys/bus/virtio/drivers/virtiofs/bind; then
  if vm_mount /mnt && [ ! -e /mnt/data ] && echo fresh > /mnt/after && [ "$(cat /mnt/after)" = fresh ]; then
    echo "crash: after the reset a fresh filesystem serves"
    vm_umount /mnt || status=FAIL
  else
    echo "crash: no fresh filesystem after the reset"; status=FAIL
  fi
else
  echo "crash: cannot unbind and bind the virtio-fs device (${dev:-none})"; status=FAIL
fi
vm_dmesg_check crash || status=FAIL
vm_result crash "status=$status secs=$secs"
[ "$status" = ok ]
