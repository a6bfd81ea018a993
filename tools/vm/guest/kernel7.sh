#!/bin/sh
# Guest suite for the Linux 7.x stage (tools/vm/ci.sh, stage kernel7): checks that the guest
# runs a 7.x kernel (whose virtio-fs driver checks every reply in virtio_fs_verify_response:
# the used length covers the out header, oh.len equals it, the unique matches, else EIO), then
# a short workload through the device: a file written, the page cache dropped, read back and
# compared; a tree of directories and files created, renamed across directories and checked
# after drop_caches; then removed. Any EIO fails the suite (and the dmesg check after it).
# Env: K7_MB (file size, 16 MiB), K7_FILES (files in the tree, 200).
. /harness/lib.sh
MB=${K7_MB:-16}
N=${K7_FILES:-200}
fail() { echo "kernel7: FAIL: $*"; vm_result kernel7 "status=FAIL reason=$1 kernel=$(uname -r)"; exit 1; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
t0=$(vm_now)
major=$(uname -r | cut -d. -f1)
echo "kernel7: guest kernel $(uname -r)"
[ "$major" -ge 7 ] 2>/dev/null || fail kernel "not a 7.x kernel: $(uname -r)"
vm_mount /mnt || fail mount

# A file: written, caches dropped, read back.
dd if=/dev/urandom of=/tmp/k7.src bs=1M count="$MB" 2>/dev/null || fail gen
ref=$(sha256sum /tmp/k7.src | cut -d' ' -f1)
dd if=/tmp/k7.src of=/mnt/k7.dat bs=64k conv=fsync 2>/dev/null || fail write
drop
got=$(sha256sum /mnt/k7.dat | cut -d' ' -f1) || fail read
[ "$got" = "$ref" ] || fail verify "sha256 $got, wrote $ref"
# Overwrite the middle with odd-sized pieces, read again.
dd if=/dev/urandom of=/tmp/k7.mid bs=4097 count=33 2>/dev/null || fail gen
dd if=/tmp/k7.mid of=/tmp/k7.src bs=4097 seek=100 conv=notrunc 2>/dev/null || fail gen
dd if=/tmp/k7.mid of=/mnt/k7.dat bs=4097 seek=100 conv=notrunc,fsync 2>/dev/null || fail overwrite
drop
[ "$(sha256sum /mnt/k7.dat | cut -d' ' -f1)" = "$(sha256sum /tmp/k7.src | cut -d' ' -f1)" ] ||
  fail verify-overwrite
rm -f /tmp/k7.src /tmp/k7.mid /mnt/k7.dat
[ ! -e /mnt/k7.dat ] || fail unlink

# Directories and renames: N files in a/b, each renamed into c/ under a new name, directories
# renamed, everything checked after drop_caches, then removed.
mkdir -p /mnt/k7/a/b /mnt/k7/c || fail mkdir
i=0
while [ $i -lt "$N" ]; do
  echo "file $i" > "/mnt/k7/a/b/f$i" || fail create "f$i"
  i=$((i + 1))
done
i=0
while [ $i -lt "$N" ]; do
  mv "/mnt/k7/a/b/f$i" "/mnt/k7/c/g$i" || fail rename "f$i"
  i=$((i + 1))
done
mv /mnt/k7/c /mnt/k7/a/d || fail rename-dir
mv /mnt/k7/a /mnt/k7/e || fail rename-dir2
drop
[ "$(ls /mnt/k7/e/d | wc -l)" = "$N" ] || fail count "$(ls /mnt/k7/e/d | wc -l) entries, wanted $N"
[ "$(ls /mnt/k7/e/b | wc -l)" = 0 ] || fail count-empty
i=0
while [ $i -lt "$N" ]; do
  [ "$(cat "/mnt/k7/e/d/g$i")" = "file $i" ] || fail content "g$i"
  i=$((i + 1))
done
rm -r /mnt/k7 || fail remove
[ ! -e /mnt/k7 ] || fail remove-gone
vm_umount /mnt || fail umount
vm_dmesg_check kernel7 || fail dmesg
vm_result kernel7 "status=ok kernel=$(uname -r) mb=$MB files=$N secs=$(vm_elapsed "$t0")"
