#!/bin/sh
# Guest side of the NFS server fault test (tools/vm/run-nfs-fault-test.sh): writes NFS_FAULT_FILES
# (60) files of 1 MiB, each followed by its checksum file, while the host kills the NFS server
# with SIGKILL and starts it again. No write may fail (requests issued during the outage wait
# for the reconnect); at the end, with the page cache dropped and after a remount, every file
# must match its checksum.
. /harness/lib.sh
N=${NFS_FAULT_FILES:-60}
fail() { echo "nfs-fault: FAIL: $*"; vm_result nfs-fault "status=FAIL reason=$1"; exit 1; }
vm_mount /mnt || exit 1
mkdir -p /mnt/fault || fail mkdir
t0=$(vm_now)
i=0
while [ $i -lt "$N" ]; do
  i=$((i + 1))
  dd if=/dev/urandom of=/tmp/chunk bs=64k count=16 2>/dev/null
  dd if=/tmp/chunk of=/mnt/fault/f.$i bs=64k conv=fsync 2>/dev/null || fail write "file $i"
  sha256sum /tmp/chunk | cut -d' ' -f1 > /mnt/fault/f.$i.sha || fail write-sha "file $i"
  echo "FAULT: wrote $i at $(vm_now)"
done
secs=$(vm_elapsed "$t0")
sync
echo 3 > /proc/sys/vm/drop_caches
check() {
  j=0
  while [ $j -lt "$N" ]; do
    j=$((j + 1))
    got=$(sha256sum /mnt/fault/f.$j | cut -d' ' -f1)
    [ "$got" = "$(cat /mnt/fault/f.$j.sha)" ] || fail "$1" "f.$j differs"
  done
}
check verify-after-drop-caches
vm_umount /mnt || fail umount
vm_mount /mnt || fail remount
check verify-after-remount
vm_umount /mnt || fail umount
# The outage may show as a slow request, never as an error.
vm_dmesg_check nfs-fault || exit 1
vm_result nfs-fault "status=ok files=$N secs=$secs"
