#!/bin/sh
# Guest suite for two virtio-fs functions of one daemon (issue 14): mounts both tags
# (VM_TAG_A, VM_TAG_B), checks that a file written on one is not visible on the other, runs fsx
# on both at once (FSX_OPS each), then unmounts B, removes its PCI function from the guest and
# tells the host (MULTI: b-unmounted), which removes function B; the guest goes on writing on A for MULTI_WAIT_S seconds meanwhile and
# then checks that A still serves: fsx again on A, the file written before still intact.
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
vm_umount /mnt/b || fail "umount b"
# The guest lets go of B's PCI function before the host removes it, as before a hot-unplug:
# a virtio device whose server is gone can never be reset again (Linux's vp_reset waits for the
# status register to read 0, QEMU answers all-ones), so the guest's shutdown would hang on it.
pci=""
for d in /sys/fs/virtiofs/*; do
  [ "$(cat "$d/tag" 2>/dev/null)" = "$B" ] && pci=$(dirname "$(readlink -f "$d/device")")
done
if [ -n "$pci" ] && [ -e "$pci/remove" ]; then
  echo 1 > "$pci/remove" || fail "cannot remove b's PCI function $pci"
  echo "multi: b's PCI function $(basename "$pci") removed from the guest"
else
  fail "b's PCI function not found under /sys/fs/virtiofs"
fi
echo "MULTI: b-unmounted"
# The host removes function B now (the console is one way: the guest keeps writing on A for a
# fixed time, long enough for the host to act).
i=0
while [ $i -lt "${MULTI_WAIT_S:-20}" ]; do
  echo x >> /mnt/a/during || fail "write to a while b goes"
  sleep 1
  i=$((i + 1))
done
[ "$(md5sum /mnt/a/keep | cut -d' ' -f1)" = "$sum_a" ] || fail "a's 8 MiB file changed"
fsx -N "$OPS" -S 3 -f /harness/fsx.toml -P /tmp /mnt/a/fsx2.dat > /tmp/fsx-a2.log 2>&1
grep -q 'All operations completed A-OK' /tmp/fsx-a2.log || { fail "fsx on a after b was removed"; tail -n 40 /tmp/fsx-a2.log; }
echo "multi: a after b's removal: $(wc -l < /mnt/a/during) writes, fsx $OPS operations"
vm_umount /mnt/a || fail "umount a"
vm_dmesg_check multi || status=FAIL
vm_result multi "status=$status"
[ "$status" = ok ]
