#!/bin/sh
# Guest suite for two virtio-fs functions of one daemon (issue 14): mounts both tags
# (VM_TAG_A, VM_TAG_B), checks that a file written on one is not visible on the other, runs fsx
# on both at once (FSX_OPS each), then tells the host (MULTI: b-ready), which removes function B
# through the control socket while the guest writes on A. MULTI_UNPLUG=guest (the default):
# the guest unmounts B and removes B's PCI function itself first. MULTI_UNPLUG=request: B stays
# mounted; the device asks QEMU to let it go, QEMU asks the guest to unplug B's PCI function (its
# slot is hot-pluggable), the guest's virtio-fs driver drains and resets the device; the guest
# checks that B's PCI function went and that B's mount answers with an error (then unmounts it
# lazily). Either way the guest then checks that A still serves: fsx again on A, the file
# written before still intact; MULTI_WAIT_S bounds the wait (guest mode: the writes' duration).
. /harness/lib.sh
A=${VM_TAG_A:?} B=${VM_TAG_B:?}
OPS=${FSX_OPS:-5000}
status=ok
fail() { echo "multi: FAIL: $*"; status=FAIL; }
VM_TAG=$A; vm_mount /mnt/a || exit 1
VM_TAG=$B; vm_mount /mnt/b || exit 1
echo "from a" > /mnt/a/only-a
echo "from b" > /mnt/b/only-b
sync
[ -e /mnt/b/only-a ] && fail "a's file visible on b"
[ -e /mnt/a/only-b ] && fail "b's file visible on a"
[ "$(cat /mnt/a/only-a)" = "from a" ] || fail "a's file"
[ "$(cat /mnt/b/only-b)" = "from b" ] || fail "b's file"
dd if=/dev/urandom of=/mnt/a/keep bs=1M count=8 2>/dev/null
sum_a=$(md5sum /mnt/a/keep | cut -d' ' -f1)
t0=$(vm_now)
fsx -N "$OPS" -S 1 -f /harness/fsx.toml -P /tmp /mnt/a/fsx.dat > /tmp/fsx-a.log 2>&1 &
pa=$!
fsx -N "$OPS" -S 2 -f /harness/fsx.toml -P /tmp /mnt/b/fsx.dat > /tmp/fsx-b.log 2>&1 &
pb=$!
wait $pa; ra=$?
wait $pb; rb=$?
for x in a b; do
  if grep -q 'All operations completed A-OK' /tmp/fsx-$x.log; then
    echo "multi: fsx on $x: $OPS operations OK"
  else
    fail "fsx on $x"; tail -n 40 /tmp/fsx-$x.log
  fi
done
echo "multi: both fsx runs in $(vm_elapsed "$t0")s (rc a=$ra b=$rb)"
vm_result multi-fsx "status=$status ops=$OPS"
pci=""
for d in /sys/fs/virtiofs/*; do
  [ "$(cat "$d/tag" 2>/dev/null)" = "$B" ] && pci=$(basename "$(dirname "$(readlink -f "$d/device")")")
done
[ -n "$pci" ] && [ -e "/sys/bus/pci/devices/$pci" ] || fail "b's PCI function not found under /sys/fs/virtiofs"
if [ "${MULTI_UNPLUG:-guest}" = guest ]; then
  # The guest lets go of B's PCI function before the host removes it: with a QEMU that neither
  # takes the device-request interrupt nor survives a vfio-user-pci unplug (README of the VM
  # stages), a virtio device whose server went can never be reset again (Linux's vp_reset waits
  # for the status register to read 0, QEMU answers all-ones) and the shutdown would hang.
  vm_umount /mnt/b || fail "umount b"
  echo 1 > "/sys/bus/pci/devices/$pci/remove" || fail "cannot remove b's PCI function $pci"
  echo "multi: b's PCI function $pci removed from the guest"
else
  echo "multi: b is PCI function $pci, mounted, left to the host's removal"
fi
echo "MULTI: b-ready"
# The host removes function B now (the console is one way): the guest writes on A meanwhile; with
# MULTI_UNPLUG=request it waits for B's PCI function to go (at most MULTI_WAIT_S seconds): the
# device asks QEMU to let it go (the device-request interrupt), QEMU asks this guest to unplug it
# from its hot-pluggable slot, as a surprise removal would but announced.
t1=$(vm_now)
i=0 gone=0
while [ $i -lt "$((${MULTI_WAIT_S:-20} * 5))" ]; do
  echo x >> /mnt/a/during || fail "write to a while b goes"
  if [ "${MULTI_UNPLUG:-guest}" = request ] && [ ! -e "/sys/bus/pci/devices/$pci" ]; then gone=1; break; fi
  sleep 0.2
  i=$((i + 1))
done
if [ "${MULTI_UNPLUG:-guest}" = request ]; then
  if [ "$gone" = 1 ]; then
    echo "multi: b's PCI function $pci gone $(vm_elapsed "$t1")s after b-ready"
  else
    fail "b's PCI function $pci still there after ${MULTI_WAIT_S:-20}s"
  fi
  # B's mount answers with an error now, not a hang; it is unmounted lazily.
  if timeout 10 ls /mnt/b > /tmp/ls-b.log 2>&1; then
    fail "b's mount still lists after its device went"
  else
    rc=$?
    [ "$rc" = 124 ] && fail "b's mount hangs after its device went"
    echo "multi: ls on b's mount after removal: rc=$rc ($(head -c 120 /tmp/ls-b.log | tr '\n' ' '))"
  fi
  umount -l /mnt/b || fail "lazy umount of b"
  echo "multi: kernel log of the removal:"
  dmesg | grep -Ei "$pci|virtio.?fs|pciehp|acpiphp|hotplug|eject" | tail -n 12 | sed 's/^/  dmesg: /'
  # A few more seconds of writes on A after B went, then the host reads A's counters.
  i=0
  while [ $i -lt 10 ]; do
    echo x >> /mnt/a/during || fail "write to a after b went"
    sleep 0.2
    i=$((i + 1))
  done
fi
echo "MULTI: b-gone"
[ "$(md5sum /mnt/a/keep | cut -d' ' -f1)" = "$sum_a" ] || fail "a's 8 MiB file changed"
fsx -N "$OPS" -S 3 -f /harness/fsx.toml -P /tmp /mnt/a/fsx2.dat > /tmp/fsx-a2.log 2>&1
grep -q 'All operations completed A-OK' /tmp/fsx-a2.log || { fail "fsx on a after b was removed"; tail -n 40 /tmp/fsx-a2.log; }
echo "multi: a after b's removal: $(wc -l < /mnt/a/during) writes, fsx $OPS operations"
vm_umount /mnt/a || fail "umount a"
vm_dmesg_check multi || status=FAIL
vm_result multi "status=$status"
[ "$status" = ok ]
