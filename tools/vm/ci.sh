#!/bin/bash
# tools/vm/ci.sh [OUT_DIR]: the real-client stage of the test command, from zero.
# Installs QEMU and the guest kernel (setup.sh, idempotent), builds the guest image and the
# release daemon, then runs against the daemon with the CI profile (2 vCPUs, 2 request queues):
#   1. every guest suite in one boot (pjdfstest, fsx, 64 MiB bigfile + remount, locks, dmesg
#      check), and checks from the daemon's statistics (JSON, written at exit) that both request queues carried
#      requests and that SETLKW requests reached the daemon and waited there;
#   2. a guest reboot (device reset) and a remount with the data checked;
#   3. QEMU killed with SIGKILL mid-write, then a new QEMU attaching and checking the data;
#   4. the passthrough backend (--shared-dir on a tmpfs), sandboxed (namespaces, seccomp in trap
#      mode: the default), in one boot: pjdfstest, fsx (PT_FSX_OPS, default 20000 ops),
#      escape.sh with a host canary beside the share, locks.sh, suppgroup.sh; then checks that the canary
#      is untouched and that the daemon reported no system call outside its allowlist;
#   5. the NFS backend (--remote on a ganesha export, tools/nfs/ganesha.sh), sandboxed, in one
#      boot: pjdfstest (failures listed with their NFSv3 reasons in pjdfstest-exceptions-nfs.txt),
#      fsx (NFS_FSX_OPS, default 20000), the 64 MiB bigfile + remount check, locks; then checks
#      from the statistics that the requests went to the server and SETLKWs waited in the device;
#   6. ganesha killed with SIGKILL and restarted while a guest writes (run-nfs-fault-test.sh);
#   6a. the NFS backend on NFSv4.1 (the same kind of export, ?version=4.1), sandboxed, in one
#      boot: pjdfstest (exceptions with their 4.1 reasons in pjdfstest-exceptions-nfs41.txt),
#      fsx (NFS41_FSX_OPS, default 5000), locks (without the deadlock check: an NFS server keeps
#      the locks and sees no deadlock); checks that the daemon ran NFSv4.1 sessions;
#   6b. locks across clients of one NFSv4.1 export (run-nfs41-locks-test.sh, on 6a's ganesha; stage
#      nfs41locks, ~35 s): one daemon serving two functions on the export, one guest with both
#      devices and the guest kernel's own NFSv4.1 client of the export (the knfs image, user
#      networking with restrict=on): a write lock held through one device (an fcntl range, or
#      flock) makes F_SETLK through the other EAGAIN and F_GETLK show it, and an F_SETLKW through
#      the other waits until the holder's process is killed with SIGKILL and is then granted;
#      both ways between the devices, and both ways between a device and the kernel client;
#      each function's lock counters show calls, denials and waits on the server;
#   6c. live update (run-update-test.sh): one daemon (--live-update, sandboxed) with a RAM
#      filesystem, a shared directory, an NFS export over NFSv3 and the same export over NFSv4.1,
#      replaced by a new process 10 times while the guest runs fsx and fio on the four mounts
#      (files of their own on each); the files compared on the host; checks from the 4.1
#      function's statistics that it made a session and an EXCHANGE_ID in the first process and
#      no EXCHANGE_ID in the last (it went on as the same NFSv4.1 client);
#   6d. crash recovery (run-crash-test.sh): the serving process of a daemon under --live-update
#      killed with SIGKILL while the guest reads from its RAM-filesystem function: reads answer
#      (EIO: the state is gone), never hang; after the guest unbinds and binds the device a
#      fresh filesystem mounts; the daemon counts one recovery; then an NFS function
#      (run-nfs-crash-test.sh, ~30 s): fsx (NFS_CRASH_FSX_OPS, default 5000) on a ganesha export,
#      beside an F_SETLKW waiting 10 s in the device, while the serving process is killed with
#      SIGKILL 5 times at random moments; each new process recovers the export's state and
#      session and executes the requests in flight again: fsx passes, the F_SETLKW is granted
#      once its holder lets go (not before), the kernel log is clean, the file fsx left matches
#      the export's, 5 recoveries; then the same for a shared directory (run-nfs-crash-test.sh
#      --backend shared, ~25 s: SHARED_CRASH_FSX_OPS, default 5000, on a tmpfs share, the
#      daemon sandboxed as in stage 4 and QEMU unprivileged): each new process rebuilds the share
#      from the node and handle descriptors its supervisor held; the same checks, and every
#      serving process entered its sandbox, no system call outside the allowlist;
#   7. writeback caching (--writeback), one boot per backend: the RAM filesystem and the
#      passthrough (a tmpfs share, sandboxed), each pjdfstest and fsx (WB_FSX_OPS, default
#      10000); checks from the statistics that the session negotiated FUSE_WRITEBACK_CACHE;
#   8. the guest on Linux 7.x (trixie-backports; its driver checks every reply, any EIO fails):
#      kernel7.sh (file verified after drop_caches, directories, renames), fsx (K7_FSX_OPS,
#      default 5000), the queue-full fio job, the dmesg check.
#   9. two functions from one daemon (run-multi-test.sh): one QEMU with two vfio-user-pci
#      devices, a RAM filesystem and a shared directory beneath the profile's sandbox_root,
#      isolation, fsx on both at once, function B removed at run time while the guest writes on A
#      (the guest lets go of B's PCI function first: QEMU 11.1's vfio-user-pci takes no
#      device-request interrupt and cannot be unplugged; run-multi-test.sh --unplug);
#  10. the DPU build (aarch64, tools/aarch64-check.sh --build-only) under qemu-aarch64 serving
#      the x86 guest the same way, with two RAM-filesystem functions (qemu-user has no openat2
#      for a shared directory).
# Stages 1, 2, 4 and 6d's shared directory run QEMU as an unprivileged user (vfdpu-qemu, created
# here if missing) in the group that owns the daemon's sockets (--socket-group, --socket-mode
# 0660), as a deployment does, and read the daemon's statistics through its control socket
# (`virtiofs-dpu stats --json`). Exit status 0 only if everything passed. Env: VM_CACHE, FSX_OPS
# (default 20000), PT_FSX_OPS, NFS_FSX_OPS, NFS_CRASH_FSX_OPS, SHARED_CRASH_FSX_OPS, WB_FSX_OPS,
# K7_FSX_OPS, MULTI_FSX_OPS, NFS41_FSX_OPS, VFDPU_VM_STAGES (default "ram passthrough nfs nfs41
# nfs41locks update crash writeback kernel7 multi dpu": which stages run).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:-$(mktemp -d /tmp/vfdpu-ci.XXXXXX)}
mkdir -p "$OUT"
CONFIG=$REPO/hw-configs/ci.toml
# step NAME: a stage begins (the one before it ends); every stage's wall time is printed when it
# ends and again, all together, at the end of the run.
STEP_NAME='' STEP_T0=0 STEP_TIMES=''
step_done() {
  [ -n "$STEP_NAME" ] || return 0
  local took=$(( $(date +%s) - STEP_T0 ))
  echo "=== vm: took ${took} s: $STEP_NAME"
  STEP_TIMES="${STEP_TIMES}$(printf '%6d s  %s' "$took" "$STEP_NAME")
"
  STEP_NAME=''
}
step() { step_done; STEP_NAME="$*"; STEP_T0=$(date +%s); echo "=== vm: $*"; }
# stat FILE EXPR: a value from the daemon's statistics (the JSON `virtiofs-dpu stats --json`
# read from its control socket after the guest, or the one --stats-file writes when it stops),
# EXPR a Python expression over that object `s`; empty if it cannot be read.
stat() {
  python3 - "$1" "$2" <<'PY' 2>/dev/null || true
import json, sys
with open(sys.argv[1]) as f:
    s = json.load(f)
print(eval(sys.argv[2], {"s": s}))
PY
}

STAGES=" ${VFDPU_VM_STAGES:-ram passthrough nfs nfs41 nfs41locks update crash writeback kernel7 multi dpu} "
stage() { [[ $STAGES == *" $1 "* ]]; }

step "setup (QEMU, guest kernel, pjdfstest, fsx)"
t0=$(date +%s)
bash "$HERE/setup.sh"
bash "$HERE/build-guest.sh"
echo "setup + guest image: $(( $(date +%s) - t0 )) s"
step "release daemon"
(cd "$REPO" && cargo build --release -q --bin virtiofs-dpu)
# Wherever cargo puts it (CARGO_TARGET_DIR may be set).
TARGET=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export VFDPU_DAEMON=$TARGET/release/virtiofs-dpu
# An unprivileged user for QEMU, in a group of its own that will own the daemon's sockets.
QUSER=vfdpu-qemu
step "unprivileged QEMU user $QUSER"
getent group "$QUSER" > /dev/null || groupadd --system "$QUSER"
id -u "$QUSER" > /dev/null 2>&1 ||
  useradd --system --gid "$QUSER" --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$QUSER"
if getent group kvm > /dev/null; then usermod -a -G kvm "$QUSER"; fi
echo "QEMU runs as $(id "$QUSER")"
AS_USER=(--qemu-user "$QUSER" --socket-group "$QUSER")

fail=0
if stage ram; then
step "guest suites against the device"
if bash "$HERE/run-device-test.sh" --out "$OUT/suites" --config "$CONFIG" "${AS_USER[@]}" \
     -e "FSX_OPS=${FSX_OPS:-20000}" -e "VM_SUITES=pjdfstest fsx bigfile locks suppgroup dmesg-check" \
     "$HERE/guest/all.sh"; then
  st=$OUT/suites/live-stats.json
  counts=$(stat "$st" '" ".join("q%d=%d" % (q["queue"], q["requests"]) for q in s["device"]["queues"])')
  echo "per-queue requests (q0 = hiprio, from $st): ${counts:-none}"
  q1=$(stat "$st" 's["device"]["queues"][1]["requests"]'); q2=$(stat "$st" 's["device"]["queues"][2]["requests"]')
  if [ "${q1:-0}" -gt 0 ] && [ "${q2:-0}" -gt 0 ]; then
    echo "multi-queue: both request queues used"
  else
    echo "FAIL: multi-queue: a request queue carried nothing (${counts:-no statistics})"; fail=1
  fi
  # The locks suite's SETLKWs reached the daemon (POSIX_LOCKS negotiated) and some waited there.
  locks=$(stat "$st" '" ".join(f"{k}={v}" for k, v in s["fuse"]["locks"].items())')
  echo "daemon lock requests: ${locks:-none}"
  setlkw=$(stat "$st" 's["fuse"]["locks"]["setlkw"]'); waited=$(stat "$st" 's["fuse"]["locks"]["waited"]')
  if [ "${setlkw:-0}" -gt 0 ] && [ "${waited:-0}" -gt 0 ]; then
    echo "locks: the daemon served SETLKW ($setlkw, $waited of them waited)"
  else
    echo "FAIL: locks: the daemon saw no waiting SETLKW (${locks:-no lock statistics})"; fail=1
  fi
  echo "boot to first mount: $(tr -d '\r' < "$OUT/suites/console.log" | sed -n 's/^VMMOUNT: .* mounted at \([0-9.]*\)s uptime/\1/p' | head -1) s guest uptime"
  tr -d '\r' < "$OUT/suites/console.log" | grep -a '^VMHARNESS: boot-done' | head -1 || true
else
  echo "FAIL: guest suites"; fail=1
fi
tr -d '\r' < "$OUT/suites/console.log" | grep -a -E '^(VMRESULT|Summary:|pjdfstest: |fsx: |All operations|bigfile: |locktest: |locks: )' || true

step "guest reboot (device reset) and remount"
bash "$HERE/run-device-test.sh" --allow-reboot --out "$OUT/reboot" --config "$CONFIG" "${AS_USER[@]}" \
  "$HERE/guest/reboot.sh" || { echo "FAIL: reboot"; fail=1; }

step "QEMU killed mid-write; a new QEMU attaches"
bash "$HERE/run-fault-test.sh" --out "$OUT/fault" --config "$CONFIG" || { echo "FAIL: fault"; fail=1; }

fi

if stage passthrough; then
step "passthrough backend, sandboxed: pjdfstest, fsx, escape, suppgroup"
PT=$(mktemp -d /tmp/vfdpu-pt.XXXXXX)
mount -t tmpfs -o size=1g,mode=0755 tmpfs "$PT"
mkdir "$PT/share"
SECRET="vfdpu-ci-canary-$$-$RANDOM$RANDOM"
echo "$SECRET" > "$PT/vfdpu-escape-canary"
canary_before=$(stat -c %Y:%s "$PT/vfdpu-escape-canary")
if bash "$HERE/run-device-test.sh" --out "$OUT/passthrough" --config "$CONFIG" --timeout 1800 "${AS_USER[@]}" \
     --daemon-arg --shared-dir --daemon-arg "$PT/share" \
     -e "FSX_OPS=${PT_FSX_OPS:-20000}" -e "VM_SUITES=pjdfstest fsx escape locks suppgroup" \
     -e ESCAPE_CANARY_NAME=vfdpu-escape-canary -e "ESCAPE_CANARY_TEXT=$SECRET" "$HERE/guest/all.sh"; then
  :
else
  echo "FAIL: passthrough guest suites"; fail=1
fi
tr -d '\r' < "$OUT/passthrough/console.log" |
  grep -a -E '^(VMRESULT|Summary:|pjdfstest: |fsx: |All operations|escape: FAIL|suppgroup: FAIL)' || true
grep -a -E 'sandbox:|seccomp:' "$OUT/passthrough/daemon.log" || true
if [ "$(cat "$PT/vfdpu-escape-canary")" != "$SECRET" ] || [ "$(stat -c %Y:%s "$PT/vfdpu-escape-canary")" != "$canary_before" ]; then
  echo "FAIL: the canary beside the share changed"; fail=1
fi
if ! grep -q 'sandbox: new mount, IPC and network namespaces' "$OUT/passthrough/daemon.log"; then
  echo "FAIL: the passthrough daemon did not enter its sandbox"; fail=1
fi
if grep -a 'seccomp: system call' "$OUT/passthrough/daemon.log"; then
  echo "FAIL: the daemon made a system call outside its allowlist"; fail=1
fi
umount "$PT" && rmdir "$PT"
fi

if stage nfs; then
step "NFS backend (ganesha export), sandboxed: pjdfstest, fsx, bigfile, locks"
t0=$(date +%s)
bash "$REPO/tools/nfs/ganesha.sh" install
NFSD=$(mktemp -d /tmp/vfdpu-nfs.XXXXXX)
URL=$(bash "$REPO/tools/nfs/ganesha.sh" start "$NFSD")
if bash "$HERE/run-device-test.sh" --out "$OUT/nfs" --config "$CONFIG" --timeout 1800 \
     --daemon-arg --remote --daemon-arg "$URL" \
     -e "FSX_OPS=${NFS_FSX_OPS:-20000}" -e "VM_SUITES=pjdfstest fsx bigfile locks dmesg-check" \
     -e PJDFSTEST_EXCEPTIONS=pjdfstest-exceptions-nfs.txt -e FSX_CONFIG=/harness/fsx-nfs.toml \
     "$HERE/guest/all.sh"; then
  st=$OUT/nfs/stats.json
  nfs=$(stat "$st" '" ".join(f"{k}={v}" for k, v in s["fuse"]["nfs"].items() if k != "unstable")')
  echo "daemon NFS counters: ${nfs:-none}"
  calls=$(stat "$st" 's["fuse"]["nfs"]["calls"]')
  [ "${calls:-0}" -gt 0 ] || { echo "FAIL: nfs: the daemon reports no NFS call (${nfs:-no statistics})"; fail=1; }
  waited=$(stat "$st" 's["fuse"]["locks"]["waited"]')
  [ "${waited:-0}" -gt 0 ] || { echo "FAIL: nfs: no SETLKW waited in the device"; fail=1; }
else
  echo "FAIL: NFS guest suites"; fail=1
fi
tr -d '\r' < "$OUT/nfs/console.log" |
  grep -a -E '^(VMRESULT|Summary:|pjdfstest: |fsx: |All operations|bigfile: |locks: )' || true
grep -a -E 'sandbox:|seccomp:' "$OUT/nfs/daemon.log" || true
grep -q 'sandbox: new mount and IPC namespaces' "$OUT/nfs/daemon.log" ||
  { echo "FAIL: the NFS daemon did not enter its sandbox"; fail=1; }
if grep -a 'seccomp: system call' "$OUT/nfs/daemon.log"; then
  echo "FAIL: the NFS daemon made a system call outside its allowlist"; fail=1
fi
bash "$REPO/tools/nfs/ganesha.sh" stop "$NFSD"
rm -rf "$NFSD"
echo "NFS suites: $(( $(date +%s) - t0 )) s"

step "NFS server killed (SIGKILL) and restarted under a guest writer"
t0=$(date +%s)
bash "$HERE/run-nfs-fault-test.sh" --out "$OUT/nfs-fault" --config "$CONFIG" || { echo "FAIL: nfs fault"; fail=1; }
echo "NFS fault test: $(( $(date +%s) - t0 )) s"
fi

# The NFSv4.1 stages share one ganesha, started for whichever of them runs and stopped after both.
NFS41D=""
if stage nfs41 || stage nfs41locks; then
  bash "$REPO/tools/nfs/ganesha.sh" install
  NFS41D=$(mktemp -d /tmp/vfdpu-nfs41.XXXXXX)
  URL=$(bash "$REPO/tools/nfs/ganesha.sh" start "$NFS41D")
  NFSPORT=$(sed -n 's/.*nfsport=\([0-9]*\).*/\1/p' <<< "$URL")
  URL41="${URL%%\?*}?version=4.1&nfsport=$NFSPORT"
fi
if stage nfs41; then
step "NFS backend on NFSv4.1 (the same ganesha export, ?version=4.1), sandboxed: pjdfstest, fsx, locks"
t0=$(date +%s)
if bash "$HERE/run-device-test.sh" --out "$OUT/nfs41" --config "$CONFIG" --timeout 1200 \
     --daemon-arg --remote --daemon-arg "$URL41" \
     -e "FSX_OPS=${NFS41_FSX_OPS:-5000}" -e "VM_SUITES=pjdfstest fsx locks dmesg-check" \
     -e PJDFSTEST_EXCEPTIONS=pjdfstest-exceptions-nfs41.txt -e FSX_CONFIG=/harness/fsx-nfs.toml \
     -e "LOCKS_CHECKS=posix flock signal kill" \
     "$HERE/guest/all.sh"; then
  st=$OUT/nfs41/stats.json
  sessions=$(stat "$st" 's["fuse"]["nfs"]["session"]["sessions"]')
  [ "${sessions:-0}" -gt 0 ] || { echo "FAIL: nfs41: the daemon reports no NFSv4.1 session"; fail=1; }
  echo "daemon NFSv4.1 session counters: $(stat "$st" '" ".join(f"{k}={v}" for k, v in s["fuse"]["nfs"]["session"].items())')"
else
  echo "FAIL: NFSv4.1 guest suites"; fail=1
fi
tr -d '\r' < "$OUT/nfs41/console.log" |
  grep -a -E '^(VMRESULT|Summary:|pjdfstest: |fsx: |All operations|locks: )' || true
if grep -a 'seccomp: system call' "$OUT/nfs41/daemon.log"; then
  echo "FAIL: the NFSv4.1 daemon made a system call outside its allowlist"; fail=1
fi
echo "NFSv4.1 suites: $(( $(date +%s) - t0 )) s"
fi

# Locks across clients of the NFSv4.1 export: two functions of one daemon and the guest kernel's
# NFSv4.1 client (the knfs guest image: VM_GUEST_NFS=1 setup.sh fetches the kernel's NFS and
# virtio-net modules once, build-guest.sh adds them to CACHE/alt/knfs).
if stage nfs41locks; then
step "NFSv4.1 locks across clients: two functions of one daemon and the guest kernel's NFS client, one export"
t0=$(date +%s)
if ! { VM_GUEST_NFS=1 bash "$HERE/setup.sh" && VM_GUEST_NFS=1 bash "$HERE/build-guest.sh"; } > "$OUT/nfs41locks-setup.log" 2>&1; then
  tail -n 20 "$OUT/nfs41locks-setup.log"; echo "FAIL: nfs41locks: the knfs guest image"; fail=1
elif ! bash "$HERE/run-nfs41-locks-test.sh" --out "$OUT/nfs41locks" --config "$CONFIG" --url "$URL41"; then
  echo "FAIL: NFSv4.1 locks across clients"; fail=1
fi
if grep -a 'seccomp: system call' "$OUT/nfs41locks/daemon.log" 2>/dev/null; then
  echo "FAIL: the NFSv4.1 locks daemon made a system call outside its allowlist"; fail=1
fi
echo "NFSv4.1 locks stage: $(( $(date +%s) - t0 )) s"
fi
if [ -n "$NFS41D" ]; then
  bash "$REPO/tools/nfs/ganesha.sh" stop "$NFS41D"
  rm -rf "$NFS41D"
fi

if stage update; then
step "live update: RAM fs, shared directory, NFSv3 and NFSv4.1 functions of one daemon, replaced 10 times under fsx and fio"
bash "$HERE/run-update-test.sh" --out "$OUT/update" --config "$CONFIG" --updates 10 ||
  { echo "FAIL: live update"; fail=1; }
fi

if stage crash; then
step "crash recovery: the serving process of a RAM-filesystem function killed (SIGKILL) under guest reads"
bash "$HERE/run-crash-test.sh" --out "$OUT/crash" --config "$CONFIG" || { echo "FAIL: crash recovery"; fail=1; }
step "crash recovery: the serving process of an NFS function killed (SIGKILL) 5 times under fsx"
bash "$HERE/run-nfs-crash-test.sh" --out "$OUT/nfs-crash" --config "$CONFIG" --kills 5 ||
  { echo "FAIL: NFS crash recovery"; fail=1; }
step "crash recovery: the serving process of a sandboxed shared-directory function killed (SIGKILL) 5 times under fsx"
bash "$HERE/run-nfs-crash-test.sh" --backend shared --out "$OUT/shared-crash" --config "$CONFIG" --kills 5 \
  "${AS_USER[@]}" || { echo "FAIL: shared-directory crash recovery"; fail=1; }
fi

if stage writeback; then
# Writeback caching: the guest kernel keeps dirty pages and owns size and times (SETATTR with
# explicit times from whichever task flushes); pjdfstest's permission and time checks and fsx's
# data checks must hold with it on both local backends.
WBT=$(mktemp -d /tmp/vfdpu-wb.XXXXXX)
mount -t tmpfs -o size=1g,mode=0755 tmpfs "$WBT"
mkdir "$WBT/share"
for backend in ramfs passthrough; do
  step "writeback caching ($backend): pjdfstest, fsx"
  t0=$(date +%s)
  extra=(--daemon-arg --writeback)
  [ $backend = passthrough ] && extra+=(--daemon-arg --shared-dir --daemon-arg "$WBT/share")
  if bash "$HERE/run-device-test.sh" --out "$OUT/writeback-$backend" --config "$CONFIG" --timeout 900 "${AS_USER[@]}" \
       "${extra[@]}" -e "FSX_OPS=${WB_FSX_OPS:-10000}" -e "VM_SUITES=pjdfstest fsx dmesg-check" \
       -e PJDFSTEST_EXCEPTIONS=pjdfstest-exceptions-writeback.txt \
       "$HERE/guest/all.sh"; then
    flags=$(stat "$OUT/writeback-$backend/live-stats.json" 's["fuse"]["init_flags"]')
    if [ $(( ${flags:-0} & (1 << 16) )) -ne 0 ]; then
      echo "writeback ($backend): FUSE_WRITEBACK_CACHE negotiated (INIT flags $flags)"
    else
      echo "FAIL: writeback ($backend): the session did not negotiate FUSE_WRITEBACK_CACHE (INIT flags ${flags:-unknown})"; fail=1
    fi
  else
    echo "FAIL: writeback ($backend) guest suites"; fail=1
  fi
  tr -d '\r' < "$OUT/writeback-$backend/console.log" |
    grep -a -E '^(VMRESULT|Summary:|pjdfstest: |fsx: |All operations)' || true
  echo "writeback ($backend): $(( $(date +%s) - t0 )) s"
done
umount "$WBT" && rmdir "$WBT"
fi

# ---- stage kernel7: the guest on Linux 7.x (trixie-backports), whose virtio-fs driver checks
# every reply (virtio_fs_verify_response: used length >= the out header, oh.len == used length,
# unique matching, else EIO): a short workload through the device (kernel7.sh: a file verified
# after drop_caches, directories and renames), a short fsx, the queue-full fio job (libaio QD =
# 2 x the queue size: requests wait for ring slots), and the dmesg check. setup.sh fetches the
# kernel (VM_KERNELS=backports); CACHE/alt/backports is a cache dir for run-guest.sh with that
# kernel and the main guest image (the drivers are built in: no modules to add). 7.x logs an
# information line per tag ("discovered new tag") that the dmesg check would take for a problem.
kernel7_stage() {
  local cache=${VM_CACHE:-/var/tmp/virtiofs-dpu-vm} t0 alt
  t0=$(date +%s)
  VM_KERNELS="trixie backports" bash "$HERE/setup.sh" > "$OUT/kernel7-setup.log" 2>&1 ||
    { tail -n 20 "$OUT/kernel7-setup.log"; echo "FAIL: kernel7: setup"; fail=1; return; }
  cache=$(cd "$cache" && pwd)
  alt=$cache/alt/backports
  mkdir -p "$alt/guest"
  ln -sfn ../../bin "$alt/bin"
  ln -sfn "$cache/guest/base.cpio" "$alt/guest/base.cpio"
  ln -sfn "$(readlink -f "$cache/kernel-backports/vmlinuz")" "$alt/guest/vmlinuz"
  echo "kernel7: $(cat "$cache/kernel-backports/package")"
  if bash "$HERE/run-device-test.sh" --cache "$alt" --out "$OUT/kernel7" --config "$CONFIG" --timeout 600 \
       "${AS_USER[@]}" -e "VM_SUITES=kernel7 fsx fio-compare dmesg-check" -e "FSX_OPS=${K7_FSX_OPS:-5000}" \
       -e FIO_JOBS=randread-4k-qdN -e FIO_QD=256 -e FIO_RUNTIME=5 -e FIO_RAMP=1 -e FIO_SIZE=32M \
       -e "VM_DMESG_ALLOW=virtiofs virtio[0-9]+: discovered new tag" \
       "$HERE/guest/all.sh"; then
    :
  else
    echo "FAIL: kernel7 guest suites"; fail=1
  fi
  tr -d '\r' < "$OUT/kernel7/console.log" |
    grep -a -E '^(VMRESULT|kernel7: |fsx: |All operations|  dmesg: )' || true
  echo "kernel7 stage: $(( $(date +%s) - t0 )) s"
}
if stage kernel7; then
step "Linux 7.x guest (trixie-backports): workload, fsx, queue-full fio, dmesg"
kernel7_stage
fi

if stage multi; then
step "two functions from one daemon, one guest (RAM fs + shared directory), B removed at run time"
t0=$(date +%s)
bash "$HERE/run-multi-test.sh" --out "$OUT/multi" || { echo "FAIL: multi-function stage"; fail=1; }
tr -d '\r' < "$OUT/multi/console.log" | grep -a -E '^(VMRESULT|multi: )' || true
if grep -a 'seccomp: system call' "$OUT/multi/daemon.log"; then
  echo "FAIL: the multi-function daemon made a system call outside its allowlist"; fail=1
fi
echo "multi-function stage: $(( $(date +%s) - t0 )) s"
fi

if stage dpu; then
step "the DPU build (aarch64) under qemu-aarch64: two functions, one guest"
t0=$(date +%s)
(cd "$REPO" && tools/aarch64-check.sh --build-only) > "$OUT/dpu-build.log" 2>&1 ||
  { tail -n 20 "$OUT/dpu-build.log"; echo "FAIL: dpu: aarch64 build"; fail=1; }
A64=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/aarch64-unknown-linux-gnu/release/virtiofs-dpu
mkdir -p "$OUT/dpu"
printf '#!/bin/sh\nexec qemu-aarch64-static -L /usr/aarch64-linux-gnu %s "$@"\n' "$A64" > "$OUT/dpu/virtiofs-dpu-aarch64"
chmod +x "$OUT/dpu/virtiofs-dpu-aarch64"
echo "dpu: $(file -b "$A64" 2>/dev/null | cut -d, -f1-2)"
bash "$HERE/run-multi-test.sh" --daemon "$OUT/dpu/virtiofs-dpu-aarch64" --b-ramfs --out "$OUT/dpu" ||
  { echo "FAIL: dpu stage"; fail=1; }
tr -d '\r' < "$OUT/dpu/console.log" | grep -a -E '^(VMRESULT|multi: )' || true
echo "dpu stage: $(( $(date +%s) - t0 )) s"
fi

step_done
printf 'vm: wall time of each step\n%s' "$STEP_TIMES"
if [ $fail = 0 ]; then
  echo "vm: all stages passed ($STAGES)"
else
  echo "vm: logs in $OUT"
  echo "vm: FAILED"
fi
exit $fail
