#!/usr/bin/env bash
# The project's test command (README, .ci/run):
#   0. the NFS test server's packages (nfs-ganesha, nfs-ganesha-vfs, rpcbind: tools/nfs/ganesha.sh
#      install, idempotent, the host's apt); the NFS tests start their own ganesha instances
#      with tools/nfs/ganesha.sh on the loopback;
#   1. every Rust test in the workspace (unit, protocol conformance, driver model end to end,
#      daemon subprocess, allocation count, the NFS backend against ganesha);
#   2. the real client: QEMU's vfio-user-pci and a Debian Linux guest mounting the device
#      (tools/vm/ci.sh; installs QEMU and the guest kernel from Debian packages on first use).
# VFDPU_SKIP_VM=1 skips stage 2 (for quick local runs).
set -euo pipefail
cd "$(dirname "$0")/.."
# The driver model (virtiofs-tools) is an independent implementation of vfio-user, virtio and FUSE:
# it must not pull in the device, the backend or the root crate (the benchmark, which does, is its
# own crate). The root crate has virtiofs-tools as a dev-dependency; `cargo tree -p` shows only
# what virtiofs-tools itself depends on.
if cargo tree -p virtiofs-tools -e normal,dev --prefix none | grep -E '^virtiofs-(device|backend|dpu) '; then
  echo "virtiofs-tools depends on the device, the backend or the root crate" >&2
  exit 1
fi
echo "=== NFS test server packages"
# The NFS tests start their own nfs-ganesha servers and fail where it cannot run (needs root).
tools/nfs/ganesha.sh install
cargo test --workspace --all-targets
if [ "${VFDPU_SKIP_VM:-0}" != 1 ]; then
  tools/vm/ci.sh "${VFDPU_VM_OUT:-}"
fi
