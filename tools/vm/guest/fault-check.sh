#!/bin/sh
# Guest side of the fault test, in a new QEMU after the previous one was killed: the device must
# still serve; every file whose checksum file was written must match it.
. /harness/lib.sh
vm_mount /mnt || exit 1
n=0
for sum in /mnt/fault/*.sha; do
  [ -s "$sum" ] || continue
  f=${sum%.sha}
  got=$(sha256sum "$f" | cut -d' ' -f1)
  [ "$got" = "$(cat "$sum")" ] || { echo "fault-check: $f differs"; vm_result fault "status=FAIL file=$f"; exit 1; }
  n=$((n + 1))
done
[ "$n" -ge 1 ] || { echo "fault-check: no complete file survived"; vm_result fault "status=FAIL files=0"; exit 1; }
dd if=/dev/urandom of=/tmp/x bs=64k count=16 2>/dev/null
cp /tmp/x /mnt/fault/after || exit 1
cmp /tmp/x /mnt/fault/after || { echo "fault-check: new write reads back wrong"; exit 1; }
rm -rf /mnt/fault
vm_umount /mnt || exit 1
vm_dmesg_check fault || exit 1
vm_result fault "status=ok verified=$n"
