#!/bin/bash
# tools/vm/build-guest.sh [CACHE]
#
# Builds the guest boot artefacts from what setup.sh installed:
#   CACHE/guest/vmlinuz        the trixie kernel (virtio_pci, fuse, virtiofs built in)
#   CACHE/guest/base.cpio      busybox (static), fio, pjdfstest, fsx and every
#                              shared library they need (ldd in the chroot),
#                              /etc/passwd + /etc/group with pjdfstest's dummy
#                              users, and /init.
# /init mounts proc/sys/devtmpfs, sources /harness/env, runs /guest.sh, prints
#   VMHARNESS: guest-exit rc=N
# and powers off. /guest.sh and /harness/ come from a second, per-run cpio
# archive that run-guest.sh appends (the kernel unpacks both in order).
# The archives are not compressed: under TCG, gunzipping the 64 MB initramfs
# costs the guest ~2.5 s per boot, the copy of the raw one a few ms on the host.
# Idempotent: rebuilds only when an input is newer than the archive.
# Env: VM_KERNELS (default "trixie"; "trixie bookworm" also builds CACHE/alt/bookworm, see below),
#      VM_GUEST_NFS (1: also CACHE/alt/knfs, see below).
set -euo pipefail

CACHE=${1:-${VM_CACHE:-/var/tmp/virtiofs-dpu-vm}}
[ -d "$CACHE" ] || { echo "[vm-build] no cache dir $CACHE: run tools/vm/setup.sh first" >&2; exit 1; }
CACHE=$(cd "$CACHE" && pwd)
C=$CACHE/chroot
G=$CACHE/guest
OUT=$G/base.cpio
TOOLS="$CACHE/tools/bin/pjdfstest $CACHE/tools/bin/fsx"
BUSYBOX=$C/usr/bin/busybox

for f in "$BUSYBOX" "$C/usr/bin/fio" $TOOLS "$CACHE/kernel/vmlinuz"; do
  [ -e "$f" ] || { echo "[vm-build] missing $f: run tools/vm/setup.sh first" >&2; exit 1; }
done

# Optional second guest kernel (VM_KERNELS="trixie bookworm"; setup.sh with the same VM_KERNELS
# fetches it): CACHE/alt/bookworm/ is a cache dir that run-guest.sh --cache accepts:
#   guest/vmlinuz     bookworm's 6.1 kernel
#   guest/base.cpio   base.cpio + a second archive with that kernel's virtio, virtio_ring,
#                     virtio_pci_*, fuse and virtiofs modules in /lib/modules and
#                     /lib/modules/vm-load.list (dependency order, from each module's
#                     modinfo depends=, what depmod writes into modules.dep); /init insmods them
#   bin -> ../../bin  the same QEMU and virtiofsd
# And with VM_GUEST_NFS=1 (setup.sh with the same), CACHE/alt/knfs/: the trixie kernel with its
# NFSv3 and NFSv4.1 clients (sunrpc, lockd, nfs, nfsv3, dns_resolver, nfsv4, ...) and virtio-net
# modules loaded the same way, for tools/vm/nfs-compare.sh and run-nfs41-locks-test.sh; the
# default image is untouched.
build_bookworm() {
  local KB=$CACHE/kernel-bookworm
  [ -e "$KB/vmlinuz" ] ||
    { echo "[vm-build] missing $KB/vmlinuz: run VM_KERNELS=\"trixie bookworm\" tools/vm/setup.sh" >&2; exit 1; }
  build_alt bookworm "$KB" "$KB/vmlinuz" "$CACHE/stamps/kernel-bookworm" virtio_pci virtiofs
}
build_knfs() {
  local KN=$CACHE/kernel-nfs
  [ -d "$KN/lib/modules" ] ||
    { echo "[vm-build] missing $KN: run VM_GUEST_NFS=1 tools/vm/setup.sh" >&2; exit 1; }
  # The modules must be the image's own: setup.sh stamps both with the package they came from.
  [ "$(cat "$CACHE/stamps/kernel-nfs" 2>/dev/null)" = "$(cat "$CACHE/stamps/kernel" 2>/dev/null)" ] ||
    { echo "[vm-build] $KN is not from the kernel in $CACHE/kernel: run VM_GUEST_NFS=1 tools/vm/setup.sh" >&2; exit 1; }
  build_alt knfs "$KN" "$CACHE/kernel/vmlinuz" "$CACHE/stamps/kernel-nfs" nfsv3 nfsv4 virtio_net
}
# build_alt NAME KDIR VMLINUZ STAMP MODULE...: CACHE/alt/NAME/guest/{vmlinuz,base.cpio}, base.cpio
# plus the MODULEs of KDIR's modules tree and their modinfo dependencies, in load order.
build_alt() {
  local name=$1 KB=$2 vml=$3 stamp=$4 A=$CACHE/alt/$1
  shift 4
  if [ -e "$A/guest/base.cpio" ] && [ -e "$A/guest/vmlinuz" ]; then
    local f stale=0
    for f in "${BASH_SOURCE[0]}" "$OUT" "$stamp"; do
      if [ "$f" -nt "$A/guest/base.cpio" ]; then stale=1; fi
    done
    if [ $stale = 0 ]; then echo "[vm-build] up to date: $A/guest/base.cpio"; return 0; fi
  fi
  local md d m
  md=""
  for d in "$KB"/lib/modules/*/ "$KB"/usr/lib/modules/*/; do
    if [ -z "$md" ] && [ -d "$d/kernel" ]; then md=${d%/}; fi
  done
  [ -n "$md" ] || { echo "[vm-build] no modules in $KB" >&2; exit 1; }
  local M=$G/mods-$name.tmp
  rm -rf "$M"
  mkdir -p "$M/lib/modules" "$A/guest"
  ln -sfn ../../bin "$A/bin"
  local order="" dep=""
  # ko_file NAME: its .ko[.xz|.zst]; ko_cat FILE: the module, decompressed. visit NAME: its modinfo
  # depends= first (depth first), then NAME itself: the order insmod needs
  ko_file() { find "$md/kernel" -name "$1.ko" -o -name "$1.ko.xz" -o -name "$1.ko.zst" | head -1; }
  ko_cat() { case $1 in *.xz) xz -dc "$1" ;; *.zst) zstd -dcq "$1" ;; *) cat "$1" ;; esac; }
  visit() {
    local name=$1 f d x
    case " $order " in *" $name "*) return 0 ;; esac
    f=$(ko_file "$name")
    [ -n "$f" ] || { echo "[vm-build] module $name not found under $md" >&2; exit 1; }
    d=$(ko_cat "$f" | tr '\0' '\n' | sed -n 's/^depends=//p' | head -1)
    dep="$dep$name.ko: $(echo "$d" | tr ',' ' ')"$'\n'
    for x in $(echo "$d" | tr ',' ' '); do visit "$x"; done
    ko_cat "$f" > "$M/lib/modules/$name.ko"
    order="$order $name"
  }
  for m in "$@"; do visit "$m"; done
  printf '%s.ko\n' $order > "$M/lib/modules/vm-load.list"
  printf '%s' "$dep" > "$A/guest/modules.dep.txt"
  ( cd "$M" && find . -mindepth 1 | "$BUSYBOX" cpio -o -H newc 2>/dev/null ) > "$G/mods-$name.cpio"
  cat "$OUT" "$G/mods-$name.cpio" > "$A/guest/base.cpio.tmp"
  mv "$A/guest/base.cpio.tmp" "$A/guest/base.cpio"
  cp "$(readlink -f "$vml")" "$A/guest/vmlinuz.tmp"
  mv "$A/guest/vmlinuz.tmp" "$A/guest/vmlinuz"
  rm -rf "$M" "$G/mods-$name.cpio"
  echo "[vm-build] wrote $A/guest ($name $(basename "$md"); modules:$order)"
}
build_extra() {
  local k
  for k in ${VM_KERNELS:-trixie}; do
    case $k in
      trixie) ;;
      bookworm) build_bookworm ;;
      *) echo "[vm-build] unknown kernel in VM_KERNELS: $k (known: trixie bookworm)" >&2; exit 1 ;;
    esac
  done
  if [ "${VM_GUEST_NFS:-0}" = 1 ]; then build_knfs; fi
}

uptodate=1
if [ ! -e "$OUT" ] || [ ! -e "$G/vmlinuz" ]; then uptodate=0; fi
if [ $uptodate = 1 ]; then
  for f in "${BASH_SOURCE[0]}" "$CACHE/stamps/chroot-pkgs" "$CACHE/stamps/kernel" $TOOLS; do
    if [ "$f" -nt "$OUT" ]; then uptodate=0; fi
  done
fi
if [ $uptodate = 1 ]; then
  echo "[vm-build] up to date: $OUT"
  build_extra
  exit 0
fi

mkdir -p "$G"
R=$G/root.tmp
rm -rf "$R"
trap 'rm -rf "$R" "$C/tmp/vm-ldd"' EXIT
mkdir -p "$R"/{bin,sbin,lib64,lib/x86_64-linux-gnu,proc,sys,dev,tmp,mnt,run,root,etc,harness}
mkdir -p "$R/usr"
ln -s ../lib "$R/usr/lib"
ln -s ../bin "$R/usr/bin"
ln -s ../sbin "$R/usr/sbin"
chmod 1777 "$R/tmp"

cp "$BUSYBOX" "$R/bin/busybox"

# Binaries + libraries. ldd runs inside the chroot so that every library
# resolves to the trixie copy (the host's may be older). All libraries go flat
# into /lib/x86_64-linux-gnu (fio's ceph/gluster/rdma libs included: Debian's
# fio links them even though the sync engines never use them).
mkdir -p "$C/tmp/vm-ldd"
# coreutils sleep too: pjdfstest's ETXTBSY tests copy `which sleep` to a new name and run it;
# busybox's multi-call binary exits at once under a name it does not know ("applet not found"),
# which made those tests a race.
cp "$C/usr/bin/fio" "$C/usr/bin/sleep" $TOOLS "$C/tmp/vm-ldd/"
for b in "$C"/tmp/vm-ldd/*; do
  name=$(basename "$b")
  cp "$b" "$R/bin/$name"
  chroot "$C" ldd "/tmp/vm-ldd/$name" > "$G/ldd.$name.txt" ||
    { echo "[vm-build] ldd failed for $name" >&2; cat "$G/ldd.$name.txt" >&2; exit 1; }
  if grep -q 'not found' "$G/ldd.$name.txt"; then
    echo "[vm-build] unresolved libraries for $name:" >&2; grep 'not found' "$G/ldd.$name.txt" >&2; exit 1
  fi
  awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/lib64\// {print $1}' "$G/ldd.$name.txt"
done | sort -u | while read -r lib; do
  real=$(chroot "$C" readlink -f "$lib")
  case $lib in
    /lib64/*) dst=$R/lib64/$(basename "$lib") ;;
    *)        dst=$R/lib/x86_64-linux-gnu/$(basename "$lib") ;;
  esac
  [ -e "$dst" ] || cp "$C$real" "$dst"
done

# Users: root, plus two unprivileged users, each in its own primary group, for
# pjdfstest's [dummy_auth] (it checks that user.gid == group.gid).
cat > "$R/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
tests:x:1000:1000:pjdfstest dummy user:/nonexistent:/bin/false
EOF
cat > "$R/etc/group" <<'EOF'
root:x:0:
tests:x:1000:
nogroup:x:65534:
EOF
printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files\n' > "$R/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n' > "$R/etc/hosts"
echo guest > "$R/etc/hostname"

cat > "$R/init" <<'EOF'
#!/bin/busybox sh
# virtiofs-dpu guest harness PID 1 (generated by tools/vm/build-guest.sh).
/bin/busybox --install -s /bin
export PATH=/bin:/sbin LD_LIBRARY_PATH=/lib/x86_64-linux-gnu HOME=/root TERM=${TERM:-linux}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# Kernels with virtio/fuse as modules (VM_KERNELS=bookworm) list them here, in dependency order.
if [ -f /lib/modules/vm-load.list ]; then
  while read -r m; do insmod "/lib/modules/$m" || echo "VMHARNESS: insmod $m failed"; done < /lib/modules/vm-load.list
fi
hostname guest
uptime_s() { cut -d' ' -f1 /proc/uptime; }
echo
echo "VMHARNESS: boot-done uptime=$(uptime_s)s"
[ -f /harness/env ] && . /harness/env
cd /
if [ -x /guest.sh ]; then
  /guest.sh
  rc=$?
else
  echo "VMHARNESS: no /guest.sh"
  rc=127
fi
echo
echo "VMHARNESS: guest-exit rc=$rc uptime=$(uptime_s)s"
sync
poweroff -f
EOF
chmod 755 "$R/init"

( cd "$R" && find . | "$BUSYBOX" cpio -o -H newc 2>/dev/null ) > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
rm -f "$G/base.cpio.gz"
cp "$(readlink -f "$CACHE/kernel/vmlinuz")" "$G/vmlinuz.tmp"
mv "$G/vmlinuz.tmp" "$G/vmlinuz"
echo "[vm-build] wrote $OUT ($(du -h "$OUT" | cut -f1)) and $G/vmlinuz"
build_extra
