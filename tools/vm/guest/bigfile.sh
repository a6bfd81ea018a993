#!/bin/sh
# Guest suite: a large file survives the page cache being dropped and an
# umount/mount cycle: write BIGFILE_MB (64) MiB from /dev/urandom, sha256sum,
# drop caches, read back and compare; umount, mount again, compare again.
. /harness/lib.sh
MB=${BIGFILE_MB:-64}
F=/mnt/bigfile.dat
fail() { echo "bigfile: FAIL: $*"; vm_result bigfile "status=FAIL reason=$1 mb=$MB"; exit 1; }
vm_mount /mnt || exit 1
t0=$(vm_now)
# generate into the guest's tmpfs first, so the reference hash is not read
# back through the file system under test
dd if=/dev/urandom of=/tmp/big.src bs=1M count="$MB" 2>/dev/null || fail gen
ref=$(sha256sum /tmp/big.src | cut -d' ' -f1)
echo "bigfile: reference sha256 $ref ($MB MiB)"
tw=$(vm_now)
dd if=/tmp/big.src of="$F" bs=1M conv=fsync 2>/dev/null || fail write
wsecs=$(vm_elapsed "$tw")
rm -f /tmp/big.src
size=$(stat -c %s "$F")
[ "$size" = $((MB * 1048576)) ] || fail size "size $size"
sync
echo 3 > /proc/sys/vm/drop_caches
tr=$(vm_now)
h1=$(sha256sum "$F" | cut -d' ' -f1)
rsecs=$(vm_elapsed "$tr")
[ "$h1" = "$ref" ] || fail read-after-drop-caches "got $h1"
echo "bigfile: read back after drop_caches: match"
vm_umount /mnt || fail umount
vm_mount /mnt || fail remount
h2=$(sha256sum "$F" | cut -d' ' -f1)
[ "$h2" = "$ref" ] || fail read-after-remount "got $h2"
echo "bigfile: read back after umount+mount: match"
rm -f "$F"
vm_umount /mnt || fail umount2
vm_dmesg_check bigfile || fail dmesg
vm_result bigfile "status=ok mb=$MB write_secs=$wsecs read_secs=$rsecs secs=$(vm_elapsed "$t0")"
