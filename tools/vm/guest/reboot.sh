#!/bin/sh
# Guest suite (needs run-guest.sh --allow-reboot): write data, reboot the guest (QEMU resets the
# machine, so the device gets a vfio-user DEVICE_RESET and a fresh virtio init), then on the second
# boot mount again and check the data.
. /harness/lib.sh
vm_mount /mnt || exit 1
if [ -f /mnt/.reboot-phase1 ]; then
  want=$(cat /mnt/.reboot-phase1)
  got=$(sha256sum /mnt/reboot-data | cut -d' ' -f1)
  [ "$got" = "$want" ] || { echo "reboot: data differs after reboot"; vm_result reboot "status=FAIL"; exit 1; }
  rm -f /mnt/.reboot-phase1 /mnt/reboot-data
  vm_umount /mnt || exit 1
  vm_dmesg_check reboot || exit 1
  vm_result reboot "status=ok boot=2 uptime=$(vm_now)"
  exit 0
fi
dd if=/dev/urandom of=/mnt/reboot-data bs=64k count=64 2>/dev/null || exit 1
sha256sum /mnt/reboot-data | cut -d' ' -f1 > /mnt/.reboot-phase1
vm_umount /mnt || exit 1
echo "reboot: phase 1 done at $(vm_now)s, rebooting"
reboot -f
sleep 30
echo "reboot: still running after reboot -f"
exit 1
