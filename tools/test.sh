#!/usr/bin/env bash
# The project's test command (README, .ci/run):
#   1. every Rust test in the workspace (unit, protocol conformance, driver model end to end,
#      daemon subprocess, allocation count);
#   2. the real client: QEMU's vfio-user-pci and a Debian Linux guest mounting the device
#      (tools/vm/ci.sh; installs QEMU and the guest kernel from Debian packages on first use).
# VFDPU_SKIP_VM=1 skips stage 2 (for quick local runs).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
if [ "${VFDPU_SKIP_VM:-0}" != 1 ]; then
  tools/vm/ci.sh "${VFDPU_VM_OUT:-}"
fi
