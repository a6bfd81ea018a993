#!/bin/sh
# Interactive development guest (tools/vm/dev-vm.sh): mounts the virtiofs tag
# on /mnt (unless VM_NOMOUNT=1) and gives a shell on the console; the suites
# are in /harness (e.g. sh /harness/fsx.sh after umount /mnt). Leaving the
# shell powers the guest off; Ctrl-A X kills QEMU.
. /harness/lib.sh
if [ "${VM_NOMOUNT:-0}" != 1 ]; then
  vm_mount /mnt || echo "shell: mount failed; try: mount -t virtiofs $(vm_tag) /mnt"
fi
echo "shell: tag $(vm_tag); suites: ls /harness; exit or Ctrl-D powers off"
cd /
setsid cttyhack sh -l
exit 0
