#!/usr/bin/env bash
# Builds the firmware for the DPU's Arm cores (aarch64-unknown-linux-gnu) and runs the device and
# backend tests under Debian's qemu-user-static. Installs the target, the cross linker, qemu-user-static
# and (before the backend tests) the NFS test server's packages on first use (root, Debian).
# `--build-only`: stop after building the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
  rustup target add aarch64-unknown-linux-gnu
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64-static >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static
fi
# The daemon links for the target; the tests run under emulation (runner in .cargo/config.toml).
cargo build --target aarch64-unknown-linux-gnu --release --bin virtiofs-dpu
file target/aarch64-unknown-linux-gnu/release/virtiofs-dpu 2>/dev/null || true
# --build-only: the toolchain and the daemon only (tools/vm/ci.sh's dpu stage).
[ "${1:-}" != --build-only ] || exit 0
# A test that runs a child of its own test binary (memory::sigbus's fatal fault) runs it under
# the same emulator, the runner of .cargo/config.toml.
VIRTIOFS_TEST_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu" \
  cargo test --target aarch64-unknown-linux-gnu -p virtiofs-device
# Backend: everything but the passthrough tests. qemu-user does not implement openat2 (ENOSYS) nor
# io_uring, which the passthrough needs and which real aarch64 kernels (5.6+) have; the passthrough
# tests run natively in the x86 stage of CI.
backend_tests=()
for t in backend/tests/*.rs; do
  name=$(basename "$t" .rs)
  case $name in passthrough*) continue ;; esac
  backend_tests+=(--test "$name")
done
# The NFS tests run here too: the client's and the engine's against the tests' fake server
# (loopback only: nfs_client, nfs_engine), and those against a real nfs-ganesha (nfs_client's
# ganesha_*, nfs_alloc): the emulated test spawns the host's own ganesha.nfsd and rpcbind, so they
# need root and the Debian packages as in the x86 stage, and fail saying so without them. The
# device end to end on NFS (tests/nfs_e2e.rs, root crate) runs in the x86 stage with the other
# root-crate tests.
# The shared test bodies (backend/tests/harness: both_backends!) run on the passthrough as
# `NAME::passthrough`: skipped here for the same reason as the passthrough test files.
# qemu-user refuses to install seccomp filters for its guest program (they would filter the
# emulator's own system calls): the filter's forked-child tests run natively only. The aarch64
# filter is still built and checked (seccomp::tests::the_list_has_no_duplicates_...).
# Those ganesha tests need the packages before they run: install them here (idempotent; the test
# command installs them too, for the x86 stage and for runs without this check).
tools/nfs/ganesha.sh install
cargo test --target aarch64-unknown-linux-gnu -p virtiofs-backend --lib "${backend_tests[@]}" -- \
  --skip ::passthrough \
  --skip seccomp::tests::filter_kills_on_a_forbidden_call_and_lets_allowed_ones_through \
  --skip seccomp::tests::trap_mode_reports_the_call_and_dies_of_sigsys \
  --skip seccomp::tests::tcp_client_filter_allows_stream_sockets_only
