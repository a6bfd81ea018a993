#!/bin/sh
# Guest suite: mount + list + umount the share, then fail if the kernel log
# shows any virtio-fs / FUSE / virtio error or kernel bug report.
. /harness/lib.sh
vm_mount /mnt || exit 1
ls -la /mnt | head -n 20
vm_umount /mnt || exit 1
dmesg | tail -n 30
vm_dmesg_check dmesg-check
