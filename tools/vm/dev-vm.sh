#!/bin/bash
# tools/vm/dev-vm.sh [run-device-test.sh options] [-- QEMU_ARGS...]
#
# Interactive development VM: starts the device (our daemon, or virtiofsd with
# --virtiofsd DIR), boots the guest with guest/shell.sh and puts its console on
# this terminal. The share is mounted on /mnt (VM_NOMOUNT=1: not mounted), the
# suites are in /harness (e.g. `umount /mnt; sh /harness/fsx.sh`).
# `exit` (or Ctrl-D) powers the guest off; Ctrl-A X kills QEMU; Ctrl-A C gives
# the QEMU monitor. The session ends after VM_TIMEOUT seconds (default 4 h).
# Logs (console, daemon) go to --out DIR (default a new /tmp/vm-test.XXXXXX).
#
#   tools/vm/dev-vm.sh                             # target/release/virtiofs-dpu
#   tools/vm/dev-vm.sh --daemon-arg --foo -e RUST_LOG=debug
#   tools/vm/dev-vm.sh --virtiofsd /tmp/share      # the virtiofsd peer
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
args=()
[ "${VM_NOMOUNT:-0}" = 1 ] && args+=(-e VM_NOMOUNT=1)
export VM_TIMEOUT=${VM_TIMEOUT:-14400}
exec bash "$HERE/run-device-test.sh" --interactive "$HERE/guest/shell.sh" ${args[@]+"${args[@]}"} "$@"
