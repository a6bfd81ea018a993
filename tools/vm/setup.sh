#!/bin/bash
# tools/vm/setup.sh [CACHE]
#
# Idempotently installs everything the guest test harness needs, from Debian
# packages and crates.io only, into CACHE (default: ${VM_CACHE:-/var/tmp/virtiofs-dpu-vm}):
#
#   CACHE/chroot/     Debian trixie minbase chroot with qemu-system-x86 (from
#                     trixie-backports: QEMU >= 10.1 is needed for vfio-user-pci),
#                     virtiofsd, busybox-static, fio. Never entered at run time:
#                     its binaries run on the host through the chroot's own ld.so.
#   CACHE/kernel/     extracted trixie linux-image (virtio_pci, fuse and virtiofs
#                     are built in, so the guest needs no modules)
#   CACHE/tools/bin/  pjdfstest (crates.io 0.2.x) and fsx (crates.io 0.3.x),
#                     built on the host with cargo (--locked)
#   CACHE/bin/        wrappers: qemu-system-x86_64, virtiofsd, busybox
#   CACHE/stamps/     one stamp per step; a step re-runs when its stamp is
#                     missing or records different inputs
#   CACHE/kernel-nfs/ only with VM_GUEST_NFS=1: the trixie kernel's NFS client and virtio-net
#                     modules (for tools/vm/nfs-compare.sh)
#   CACHE/kernel-bookworm/  only with VM_KERNELS="trixie bookworm": Debian bookworm's
#                     6.1 kernel with its virtio/fuse modules (for tools/vm/compare.sh)
#   CACHE/kernel-backports/ only with "backports" in VM_KERNELS: the trixie-backports Linux 7.x
#                     kernel (for the kernel7 stage of tools/vm/ci.sh)
#
# Needs root (apt-get, debootstrap, chroot) and cargo on PATH. Host: Debian 12+ x86_64.
# Env: VM_CACHE, MIRROR (Debian mirror URL; default: the one the host's apt sources name), CARGO_JOBS (default: nproc),
#      VM_KERNELS (default "trixie"; "trixie bookworm" adds the 6.1 kernel, "backports" the 7.x one),
#      VM_GUEST_NFS (1: keep the NFS client and virtio-net modules, see above), KPKG_BOOKWORM, KPKG_BACKPORTS.
set -euo pipefail

CACHE=${1:-${VM_CACHE:-/var/tmp/virtiofs-dpu-vm}}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
# host_mirror: the Debian archive the host's own apt uses (deb822 .sources or one-line
# sources.list entries of type deb whose suites name the host's release, not -security).
host_mirror() {
  local codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || return 1
  {
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -r "$f" ] || continue
      # one stanza per blank-line-separated block
      awk -v cn="$codename" '
        function flush() {
          if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " cn " ")) {
            n = split(uris, u, " "); for (i = 1; i <= n; i++) if (u[i] !~ /-security\/?$/) print u[i]
          }
          types = ""; uris = ""; suites = ""; enabled = ""
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
          if (key == "types") types = $0; else if (key == "uris") uris = $0
          else if (key == "suites") suites = $0; else if (key == "enabled") enabled = tolower($0) }
        END { flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -r "$f" ] || continue
      # deb [options] URI SUITE COMPONENTS...
      sed -e 's/\[[^]]*\]//' "$f" | awk -v cn="$codename" \
        '$1 == "deb" && $3 == cn && $2 !~ /-security\/?$/ { print $2 }'
    done
  } | head -n 1 | grep .
}
SUITE=trixie
C=$CACHE/chroot
ST=$CACHE/stamps
mkdir -p "$ST" "$CACHE/bin"
echo "=== setup.sh $(date)" >> "$CACHE/setup.log"

log() { echo "[vm-setup $(date +%T)] $*"; }
die() { echo "[vm-setup] ERROR: $*" >&2; exit 1; }
# MIRROR overrides; by default the host's own Debian mirror.
if [ -z "${MIRROR:-}" ]; then
  MIRROR=$(host_mirror) || die "no Debian mirror found in the host's apt sources: set MIRROR=URL"
fi
MIRROR=${MIRROR%/}
# stamp_ok NAME CONTENT: true when step NAME already ran with the same inputs
stamp_ok() { [ -f "$ST/$1" ] && [ "$(cat "$ST/$1")" = "$2" ]; }
stamp_set() { printf '%s' "$2" > "$ST/$1"; }
# quiet: run a command with its output in CACHE/setup.log; show the tail if it fails
quiet() {
  local rc=0
  echo "+ $*" >> "$CACHE/setup.log"
  "$@" < /dev/null >> "$CACHE/setup.log" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then
    tail -n 40 "$CACHE/setup.log" >&2
    die "failed (rc=$rc): $* (full log: $CACHE/setup.log)"
  fi
}

[ "$(id -u)" = 0 ] || die "must run as root"
[ "$(uname -m)" = x86_64 ] || die "x86_64 host required"

# ---------------------------------------------------------------- 1. host packages
# debootstrap builds the chroot; libacl1-dev lets pjdfstest (exacl crate) link; gcc and
# libc6-dev build the lock suite's static test program (run-guest.sh).
HOST_PKGS="debootstrap libacl1-dev gcc libc6-dev"
if ! stamp_ok host-pkgs "$HOST_PKGS"; then
  missing=""
  for p in $HOST_PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    log "apt-get install on host:$missing"
    quiet timeout 600 apt-get update
    quiet env DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y --no-install-recommends $missing
  fi
  stamp_set host-pkgs "$HOST_PKGS"
fi

# ---------------------------------------------------------------- 2. trixie chroot
if ! stamp_ok debootstrap "$SUITE $MIRROR"; then
  log "debootstrap $SUITE -> $C"
  rm -rf "$C"
  mkdir -p "$CACHE/debs"
  quiet timeout 1200 debootstrap --variant=minbase --cache-dir="$CACHE/debs" "$SUITE" "$C" "$MIRROR"
  rm -f "$ST/chroot-pkgs" "$ST/kernel"
  stamp_set debootstrap "$SUITE $MIRROR"
fi

# ---------------------------------------------------------------- 3. chroot packages
# qemu-system-x86 must come from backports (vfio-user-pci appeared in QEMU 10.1).
BPO_PKGS="qemu-system-x86"
PKGS="virtiofsd busybox-static fio libacl1"
if ! stamp_ok chroot-pkgs "$BPO_PKGS / $PKGS"; then
  log "installing in chroot: $BPO_PKGS (backports) $PKGS"
  printf 'deb %s %s main\ndeb %s %s-backports main\n' "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" \
    > "$C/etc/apt/sources.list"
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    > "$C/etc/apt/apt.conf.d/90vm-harness"
  quiet timeout 600 chroot "$C" apt-get update
  quiet timeout 1200 chroot "$C" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -t "$SUITE-backports" $BPO_PKGS
  quiet timeout 1200 chroot "$C" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y $PKGS
  quiet chroot "$C" apt-get clean
  stamp_set chroot-pkgs "$BPO_PKGS / $PKGS"
fi

# ---------------------------------------------------------------- 4. guest kernel
# The image .deb is downloaded and extracted, not installed (that would pull in
# initramfs-tools). KPKG overrides the package (e.g. a backports kernel).
KPKG=${KPKG:-$(chroot "$C" apt-cache depends "linux-image-amd64/$SUITE" 2>/dev/null |
               awk '/Depends: linux-image-[0-9]/{print $2; exit}')}
[ -n "$KPKG" ] || die "cannot resolve the trixie kernel package"
if ! stamp_ok kernel "$KPKG" || [ ! -e "$CACHE/kernel/vmlinuz" ]; then
  log "downloading + extracting $KPKG"
  rm -rf "$CACHE/kernel" "$C/tmp/kdl"
  mkdir -p "$C/tmp/kdl"
  quiet timeout 900 chroot "$C" sh -c "cd /tmp/kdl && apt-get -o APT::Sandbox::User=root download $KPKG"
  dpkg-deb -x "$C"/tmp/kdl/*.deb "$CACHE/kernel"
  # the drivers the guest needs are built in: drop the 100 MB of modules
  rm -rf "$C/tmp/kdl" "$CACHE/kernel/lib/modules" "$CACHE/kernel/usr/lib/modules"
  vmlinuz=$(ls "$CACHE"/kernel/boot/vmlinuz-* | head -1)
  ln -sf "$vmlinuz" "$CACHE/kernel/vmlinuz"
  for opt in VIRTIO_PCI FUSE_FS VIRTIO_FS DEVTMPFS; do
    grep -q "^CONFIG_$opt=y" "$CACHE"/kernel/boot/config-* || die "kernel lacks CONFIG_$opt=y"
  done
  stamp_set kernel "$KPKG"
fi

# ---------------------------------------------------------------- 4a. guest NFS client modules (optional)
# VM_GUEST_NFS=1 (tools/vm/nfs-compare.sh, run-nfs41-locks-test.sh) also keeps, from the same
# trixie kernel package, the modules of the guest kernel's own NFSv3 and NFSv4.1 client and of virtio-net (the trixie kernel has them as
# modules, which step 4 drops) in CACHE/kernel-nfs; build-guest.sh puts them into CACHE/alt/knfs.
# Without it, nothing changes.
if [ "${VM_GUEST_NFS:-0}" = 1 ]; then
  KN=$CACHE/kernel-nfs
  # (a cache from before nfsv4 was kept has no dns_resolver: extracted again)
  if ! stamp_ok kernel-nfs "$KPKG" || [ ! -d "$KN/lib/modules" ] ||
     [ -z "$(find "$KN/lib/modules" -name 'dns_resolver.ko*' 2>/dev/null | head -1)" ]; then
    log "downloading $KPKG again for its NFS client and virtio-net modules"
    rm -rf "$KN" "$C/tmp/kdl-nfs"
    mkdir -p "$C/tmp/kdl-nfs" "$KN/lib/modules"
    quiet timeout 900 chroot "$C" sh -c "cd /tmp/kdl-nfs && apt-get -o APT::Sandbox::User=root download $KPKG"
    dpkg-deb -x "$C"/tmp/kdl-nfs/*.deb "$C/tmp/kdl-nfs/x"
    for md in "$C"/tmp/kdl-nfs/x/lib/modules/*/ "$C"/tmp/kdl-nfs/x/usr/lib/modules/*/; do
      [ -d "$md/kernel" ] || continue
      v=$(basename "$md")
      # nfsv3's, nfsv4's and virtio_net's modinfo depends= closure (build-guest.sh checks it
      # again) (directories, and single modules by name: .ko, .ko.xz or .ko.zst)
      for p in fs/nfs fs/nfs_common fs/lockd fs/netfs net/sunrpc net/dns_resolver net/core/failover \
               drivers/net/virtio_net drivers/net/net_failover; do
        f=$md/kernel/$p
        [ -d "$f" ] || f=$(ls "$md/kernel/$p".ko* 2>/dev/null | head -1)
        [ -n "$f" ] && [ -e "$f" ] || die "$KPKG has no kernel/$p"
        mkdir -p "$KN/lib/modules/$v/kernel/$(dirname "$p")"
        mv "$f" "$KN/lib/modules/$v/kernel/$(dirname "$p")/"
      done
    done
    rm -rf "$C/tmp/kdl-nfs"
    [ -n "$(ls "$KN/lib/modules")" ] || die "$KPKG has no modules directory"
    for opt in NFS_FS NFS_V3 NFS_V4 SUNRPC DNS_RESOLVER VIRTIO_NET; do
      grep -q "^CONFIG_$opt=m" "$CACHE"/kernel/boot/config-* || die "kernel lacks CONFIG_$opt=m"
    done
    stamp_set kernel-nfs "$KPKG"
  fi
fi

# ---------------------------------------------------------------- 4b. extra guest kernels (optional)
# VM_KERNELS="trixie bookworm" also fetches Debian bookworm's 6.1 kernel (before the Linux 6.11
# virtio-fs queue-full fix) into CACHE/kernel-bookworm, for tools/vm/compare.sh. Its virtio,
# virtio_pci, fuse and virtiofs are modules: only drivers/virtio and fs/fuse are kept, and
# build-guest.sh puts them into that kernel's initramfs. The bookworm package lists live in the
# chroot apart from the trixie ones (/etc/apt-bookworm, /var/lib/apt/lists-bookworm,
# /var/cache/apt-bookworm), so the default path is untouched. Default: trixie only.
VM_KERNELS=${VM_KERNELS:-trixie}
for k in $VM_KERNELS; do
  case $k in
    trixie) ;;
    bookworm)
      KB=$CACHE/kernel-bookworm
      if ! stamp_ok kernel-bookworm "bookworm $MIRROR ${KPKG_BOOKWORM:-}" || [ ! -e "$KB/vmlinuz" ]; then
        BO="-o Dir::Etc::SourceList=/etc/apt-bookworm/sources.list -o Dir::Etc::SourceParts=/etc/apt-bookworm/parts"
        BO="$BO -o Dir::State::Lists=/var/lib/apt/lists-bookworm -o Dir::Cache=/var/cache/apt-bookworm"
        mkdir -p "$C/etc/apt-bookworm/parts" "$C/var/lib/apt/lists-bookworm/partial" \
                 "$C/var/cache/apt-bookworm/archives/partial"
        printf 'deb %s bookworm main\n' "$MIRROR" > "$C/etc/apt-bookworm/sources.list"
        quiet timeout 600 chroot "$C" apt-get $BO update
        KPB=${KPKG_BOOKWORM:-$(chroot "$C" apt-cache $BO depends linux-image-amd64/bookworm 2>/dev/null |
                               awk '/Depends: linux-image-[0-9]/{print $2; exit}')}
        [ -n "$KPB" ] || die "cannot resolve the bookworm kernel package"
        log "downloading + extracting $KPB (bookworm)"
        rm -rf "$KB" "$C/tmp/kdl-bookworm"
        mkdir -p "$C/tmp/kdl-bookworm"
        quiet timeout 900 chroot "$C" sh -c "cd /tmp/kdl-bookworm && apt-get $BO -o APT::Sandbox::User=root download $KPB"
        dpkg-deb -x "$C"/tmp/kdl-bookworm/*.deb "$KB"
        rm -rf "$C/tmp/kdl-bookworm"
        # keep only the modules the guest loads (virtio core + PCI transport, fuse + virtiofs)
        for md in "$KB"/lib/modules/*/ "$KB"/usr/lib/modules/*/; do
          [ -d "$md/kernel" ] || continue
          mkdir -p "$KB/keep"
          mv "$md/kernel/drivers/virtio" "$md/kernel/fs/fuse" "$KB/keep/"
          rm -rf "$md/kernel"
          mkdir -p "$md/kernel/drivers" "$md/kernel/fs"
          mv "$KB/keep/virtio" "$md/kernel/drivers/"
          mv "$KB/keep/fuse" "$md/kernel/fs/"
          rmdir "$KB/keep"
        done
        vmlinuz=$(ls "$KB"/boot/vmlinuz-* | head -1)
        ln -sf "$vmlinuz" "$KB/vmlinuz"
        for opt in VIRTIO VIRTIO_PCI FUSE_FS VIRTIO_FS; do
          grep -Eq "^CONFIG_$opt=(y|m)" "$KB"/boot/config-* || die "bookworm kernel lacks CONFIG_$opt"
        done
        grep -q '^CONFIG_DEVTMPFS=y' "$KB"/boot/config-* || die "bookworm kernel lacks CONFIG_DEVTMPFS=y"
        printf '%s\n' "$KPB" > "$KB/package"
        stamp_set kernel-bookworm "bookworm $MIRROR ${KPKG_BOOKWORM:-}"
      fi
      ;;
    backports) ;;  # step 4c
    *) die "unknown kernel in VM_KERNELS: $k (known: trixie bookworm backports)" ;;
  esac
done

# ---------------------------------------------------------------- 4c. Linux 7.x guest kernel (optional)
# VM_KERNELS="... backports" also fetches the trixie-backports kernel (Linux 7.x, whose virtio-fs
# driver checks every reply: virtio_fs_verify_response) into CACHE/kernel-backports, for the
# kernel7 stage of tools/vm/ci.sh. The package linux-image-amd64/trixie-backports names is, from
# 7.x on, a meta package: the image is in its linux-binary-VERSION dependency (vmlinuz and config
# under usr/lib/modules/VERSION/), the modules in linux-modules-VERSION, which is not needed:
# virtio_pci, fuse and virtiofs are built in (checked). KPKG_BACKPORTS overrides the version's
# image package. Uses the chroot's trixie-backports source (step 3).
kernel_backports() {
  local KBP=$CACHE/kernel-backports img pkgs deps vmlinuz config opt
  if stamp_ok kernel-backports "$MIRROR ${KPKG_BACKPORTS:-}" && [ -e "$KBP/vmlinuz" ]; then return 0; fi
  img=${KPKG_BACKPORTS:-$(chroot "$C" apt-cache depends "linux-image-amd64/$SUITE-backports" 2>/dev/null |
                          awk '/Depends: linux-image-[0-9]/{print $2; exit}')}
  [ -n "$img" ] || die "cannot resolve the $SUITE-backports kernel package"
  # The image and what it depends on that holds the kernel: linux-binary-* and linux-base-*
  # (7.x), or nothing more (an image package that carries the kernel itself).
  deps=$(chroot "$C" apt-cache depends "$img" 2>/dev/null |
         awk '/Depends: linux-(binary|base)-[0-9]/{print $2}' | sort -u | tr '\n' ' ')
  pkgs="$img $deps"
  log "downloading + extracting $pkgs($SUITE-backports)"
  rm -rf "$KBP" "$C/tmp/kdl-backports"
  mkdir -p "$C/tmp/kdl-backports" "$KBP"
  quiet timeout 900 chroot "$C" sh -c "cd /tmp/kdl-backports && apt-get -o APT::Sandbox::User=root download $pkgs"
  for d in "$C"/tmp/kdl-backports/*.deb; do dpkg-deb -x "$d" "$KBP"; done
  rm -rf "$C/tmp/kdl-backports"
  vmlinuz=$(find "$KBP/boot" "$KBP/usr/lib/modules" -name 'vmlinuz*' -type f 2>/dev/null | head -1 || true)
  config=$(find "$KBP/boot" "$KBP/usr/lib/modules" -name 'config*' -type f 2>/dev/null | head -1 || true)
  [ -n "$vmlinuz" ] && [ -n "$config" ] || die "no vmlinuz/config in $pkgs"
  for opt in VIRTIO_PCI FUSE_FS VIRTIO_FS DEVTMPFS; do
    grep -q "^CONFIG_$opt=y" "$config" || die "$SUITE-backports kernel lacks CONFIG_$opt=y"
  done
  ln -sf "$vmlinuz" "$KBP/vmlinuz"
  printf '%s\n' "$img" > "$KBP/package"
  stamp_set kernel-backports "$MIRROR ${KPKG_BACKPORTS:-}"
}
case " $VM_KERNELS " in *" backports "*) kernel_backports ;; esac

# ---------------------------------------------------------------- 5. host wrappers
# Trixie binaries run on an older host through the chroot's loader and libs;
# no chroot(2) or bind mounts at run time, paths and sockets stay host paths.
LP="$C/usr/lib/x86_64-linux-gnu:$C/lib/x86_64-linux-gnu"
LDSO="$C/lib64/ld-linux-x86-64.so.2"
write_wrapper() { # NAME BODY
  printf '#!/bin/sh\n# generated by tools/vm/setup.sh\n%s\n' "$2" > "$CACHE/bin/$1.tmp"
  chmod +x "$CACHE/bin/$1.tmp"
  mv "$CACHE/bin/$1.tmp" "$CACHE/bin/$1"
}
# ld.so is /proc/self/exe, so QEMU needs explicit firmware dirs and module dir.
write_wrapper qemu-system-x86_64 "QEMU_MODULE_DIR='$C/usr/lib/x86_64-linux-gnu/qemu'; export QEMU_MODULE_DIR
exec '$LDSO' --library-path '$LP' '$C/usr/bin/qemu-system-x86_64' -L '$C/usr/share/qemu' -L '$C/usr/share/seabios' \"\$@\""
write_wrapper virtiofsd "exec '$LDSO' --library-path '$LP' '$C/usr/libexec/virtiofsd' \"\$@\""
write_wrapper busybox "exec '$C/usr/bin/busybox' \"\$@\""

"$CACHE/bin/qemu-system-x86_64" -device help 2>/dev/null | grep -q '"vfio-user-pci"' ||
  die "QEMU has no vfio-user-pci device"

# ---------------------------------------------------------------- 6. guest test tools
# Host-built with the host toolchain (glibc of the host <= trixie's, so they
# run on the guest's trixie libs). --locked: the crates' own Cargo.lock.
PJDFSTEST_VER=${PJDFSTEST_VER:-0.2.2}
FSX_VER=${FSX_VER:-0.3.2}
command -v cargo >/dev/null || die "cargo not on PATH"
JOBS=${CARGO_JOBS:-$(nproc)}
for spec in "pjdfstest $PJDFSTEST_VER" "fsx $FSX_VER"; do
  crate=${spec% *}; ver=${spec#* }
  if ! stamp_ok "crate-$crate" "$ver" || [ ! -x "$CACHE/tools/bin/$crate" ]; then
    log "cargo install $crate $ver"
    quiet env CARGO_TARGET_DIR="$CACHE/cargo-target" timeout 1800 \
      cargo install --locked --force -j "$JOBS" --root "$CACHE/tools" --version "=$ver" "$crate"
    stamp_set "crate-$crate" "$ver"
  fi
done
rm -rf "$CACHE/cargo-target"   # ~300 MB of build products, not needed any more

log "QEMU: $("$CACHE/bin/qemu-system-x86_64" --version | head -1)"
log "virtiofsd: $("$CACHE/bin/virtiofsd" --version 2>&1 | head -1)"
[ ! -e "$CACHE/kernel-bookworm/package" ] || log "extra kernel: $(cat "$CACHE/kernel-bookworm/package") (bookworm)"
[ ! -e "$CACHE/kernel-backports/package" ] || log "extra kernel: $(cat "$CACHE/kernel-backports/package") ($SUITE-backports)"
log "kernel: $KPKG; tools: $(ls "$CACHE/tools/bin" | tr '\n' ' ')"
log "done: $CACHE ($(du -sh "$CACHE" 2>/dev/null | cut -f1))"
