#!/bin/sh
# Guest side of the fault test: write 1 MiB files forever (each followed by its checksum file),
# until the host kills QEMU with SIGKILL in the middle of a write.
. /harness/lib.sh
vm_mount /mnt || exit 1
mkdir -p /mnt/fault || exit 1
i=0
while :; do
  i=$((i + 1))
  dd if=/dev/urandom of=/tmp/chunk bs=64k count=16 2>/dev/null
  dd if=/tmp/chunk of=/mnt/fault/f.$i bs=64k 2>/dev/null || { echo "FAULT: write $i failed"; exit 1; }
  sha256sum /tmp/chunk | cut -d' ' -f1 > /mnt/fault/f.$i.sha
  echo "FAULT: wrote $i"
done
