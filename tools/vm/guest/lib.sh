# tools/vm/guest/lib.sh: helpers for the guest suites (busybox sh).
# Sourced by the suites as /harness/lib.sh inside the guest.

# vm_tag: the virtiofs tag: $VM_TAG, else vm.tag= on the kernel command line.
vm_tag() {
  if [ -n "${VM_TAG:-}" ]; then echo "$VM_TAG"; return; fi
  tr ' ' '\n' < /proc/cmdline | sed -n 's/^vm\.tag=//p' | tail -1
}

vm_now() { cut -d' ' -f1 /proc/uptime; }
# vm_elapsed T0: seconds since uptime T0
vm_elapsed() { awk -v t0="$1" '{printf "%.1f", $1 - t0}' /proc/uptime; }

# vm_result SUITE KEY=VAL...: one machine-readable result line on the console.
vm_result() { s=$1; shift; echo "VMRESULT: suite=$s $*"; }

# vm_mount [MNT]: mount the virtiofs tag at MNT (default /mnt).
vm_mount() {
  mnt=${1:-/mnt}
  tag=$(vm_tag)
  [ -n "$tag" ] || { echo "vm_mount: no tag (VM_TAG or vm.tag=)"; return 1; }
  mkdir -p "$mnt"
  if ! mount -t virtiofs ${VM_MOUNT_OPTS:+-o "$VM_MOUNT_OPTS"} "$tag" "$mnt"; then
    echo "vm_mount: mount -t virtiofs $tag $mnt FAILED"
    dmesg | tail -n 20
    return 1
  fi
  grep " $mnt virtiofs " /proc/mounts
  echo "VMMOUNT: $tag mounted at $(vm_now)s uptime"
}

vm_umount() {
  mnt=${1:-/mnt}
  cd /
  sync
  umount "$mnt" || { echo "vm_umount: umount $mnt FAILED"; return 1; }
}

# vm_net_up: the guest's one NIC (virtio-net on QEMU's user networking) up as 10.0.2.15/24, and
# lo (the image has no DHCP client). vm_net_isolated PORT: status 0 when the host itself
# (10.0.2.2, which user networking maps to the host's loopback unless restrict=on) does not
# answer on PORT, i.e. the only way to the server is the guestfwd address.
vm_net_up() {
  dev=""
  for d in /sys/class/net/*; do
    n=$(basename "$d")
    [ "$n" = lo ] || [ -n "$dev" ] || dev=$n
  done
  [ -n "$dev" ] || { echo "vm_net_up: no NIC"; return 1; }
  ip link set lo up
  ip link set "$dev" up
  ip addr add 10.0.2.15/24 dev "$dev" || { echo "vm_net_up: ip addr add on $dev FAILED"; return 1; }
}
vm_net_isolated() { ! nc -w 3 10.0.2.2 "$1" < /dev/null > /dev/null 2>&1; }

# vm_dmesg_check [LABEL]: fail when the kernel log shows virtio-fs / FUSE /
# virtio errors or any kernel bug report. VM_DMESG_ALLOW: extra egrep pattern
# of lines to ignore.
vm_dmesg_check() {
  label=${1:-dmesg}
  bad=$(dmesg | grep -Ei 'virtio.?fs|fuse|virtio|vring|BUG:|WARNING:|Oops:|general protection|Call Trace|blocked for more than|rcu.*stall|soft lockup|hung_task|I/O error' |
        grep -Eiv 'virtio_(net|blk|rng|console|balloon)|Booting paravirtualized|\] fuse: init \(API version|virtio_fs_setup_dax: No cache capability' |
        { if [ -n "${VM_DMESG_ALLOW:-}" ]; then grep -Eiv "$VM_DMESG_ALLOW"; else cat; fi; } || true)
  if [ -n "$bad" ]; then
    echo "$label: kernel log shows virtio-fs/FUSE problems:"
    echo "$bad" | sed 's/^/  dmesg: /'
    vm_result dmesg "status=FAIL label=$label lines=$(echo "$bad" | wc -l)"
    return 1
  fi
  vm_result dmesg "status=ok label=$label"
}

# fio_job_args JOB QD: the fio arguments of a comparison job (guest/fio-compare.sh,
# guest/nfs-compare.sh); every one runs with --direct=1 --numjobs=1. Unknown JOB: status 1.
fio_job_args() {
  case $1 in
    randread-4k-qd1)  echo "--rw=randread --bs=4k --ioengine=psync --iodepth=1" ;;
    randwrite-4k-qd1) echo "--rw=randwrite --bs=4k --ioengine=psync --iodepth=1" ;;
    # O_SYNC: every write durable before it returns (the kernel NFS client's O_DIRECT writes are
    # FILE_SYNC whatever the flags; through FUSE, O_SYNC adds an FSYNC, our COMMIT)
    randwrite-4k-qd1-sync) echo "--rw=randwrite --bs=4k --ioengine=psync --iodepth=1 --sync=1" ;;
    randread-4k-qdN)  echo "--rw=randread --bs=4k --ioengine=libaio --iodepth=$2" ;;
    seqread-1m)       echo "--rw=read --bs=1M --ioengine=psync --iodepth=1" ;;
    seqwrite-1m)      echo "--rw=write --bs=1M --ioengine=psync --iodepth=1" ;;
    seqwrite-1m-sync) echo "--rw=write --bs=1M --ioengine=psync --iodepth=1 --sync=1" ;;
    seqwrite-1m-cpu1) echo "--rw=write --bs=1M --ioengine=psync --iodepth=1 --cpus_allowed=1" ;;
    *) return 1 ;;
  esac
}
