#!/bin/sh
# Guest side of the crash stages (tools/vm/run-nfs-crash-test.sh --backend nfs|shared): fsx runs
# on one function, an NFS export (fsx-nfs.toml: no hole punching on NFSv3) or a shared directory
# (fsx.toml), while the host kills the daemon's serving process with SIGKILL several times; each
# new process recovers the function's state and executes the requests in flight again. fsx must
# end A-OK (every read it does is checked against its model of the file), and the kernel log
# stay clean. What fsx leaves is kept and its checksum printed twice: as the page cache holds it
# (VMSUM-CACHED) and read from the device after drop_caches (VMSUM), for the host to compare with
# the file in the export or shared directory.
# Beside fsx, a request certainly in flight at the first kills: an F_SETLKW waiting in the
# device for a lock another process holds (locktest posix, CRASH_LOCK_MS); the new processes
# take it again from the in-flight record and, the holder's lock being recovered with the FUSE
# session, it must wait on until the holder lets go, then be granted.
# Lines for the host: "MARK: go" (fsx starts), "MARK: fsx-done rc=N secs=S" (MARK: CRASH_MARK).
# Env (each CRASH_X falls back to NFS_CRASH_X, then the default): CRASH_NAME (nfs-crash: the
# prefix of its lines and its VMRESULT suite), CRASH_MARK (NFSCRASH), CRASH_FSX_CONFIG
# (/harness/fsx-nfs.toml), CRASH_FSX_OPS (5000), FSX_SEED (24), CRASH_LOCK_MS (10000),
# CRASH_FSX_LIMIT (240: seconds before fsx counts as hung: its kernel stack is printed and it is
# killed).
. /harness/lib.sh
NAME=${CRASH_NAME:-nfs-crash}
MARK=${CRASH_MARK:-NFSCRASH}
OPS=${CRASH_FSX_OPS:-${NFS_CRASH_FSX_OPS:-5000}}
SEED=${FSX_SEED:-24}
LIMIT=${CRASH_FSX_LIMIT:-${NFS_CRASH_FSX_LIMIT:-240}}
CFG=${CRASH_FSX_CONFIG:-/harness/fsx-nfs.toml}
ART=/tmp/fsx-artifacts
vm_mount /mnt || exit 1
mkdir -p "$ART"
rm -f /mnt/fsx.dat
LOCK_MS=${CRASH_LOCK_MS:-${NFS_CRASH_LOCK_MS:-10000}}
: > /mnt/lock
/harness/locktest posix /mnt/lock "$LOCK_MS" > /tmp/locktest.out 2>&1 &
lock_pid=$!
echo "$NAME: fsx $OPS operations, seed $SEED, config $CFG, file /mnt/fsx.dat; an F_SETLKW waits ${LOCK_MS} ms"
t0=$(vm_now)
fsx -N "$OPS" -S "$SEED" -f "$CFG" -P "$ART" /mnt/fsx.dat > /tmp/fsx.log 2>&1 &
fsx_pid=$!
sleep 0.5
echo "$MARK: go"
status=ok
hung=0
while kill -0 "$fsx_pid" 2>/dev/null; do
  if [ "$(vm_elapsed "$t0" | cut -d. -f1)" -ge "$LIMIT" ]; then
    hung=1
    echo "$NAME: fsx still runs after ${LIMIT}s: hung? its state and kernel stack:"
    grep -E '^(State|SigBlk)' "/proc/$fsx_pid/status" 2>/dev/null | sed 's/^/  /'
    echo "  wchan: $(cat "/proc/$fsx_pid/wchan" 2>/dev/null)"
    sed 's/^/  stack: /' "/proc/$fsx_pid/stack" 2>/dev/null
    echo "$NAME: its last output lines:"
    tail -n 15 /tmp/fsx.log
    kill -KILL "$fsx_pid"
    break
  fi
  sleep 0.2
done
wait "$fsx_pid"
frc=$?
secs=$(vm_elapsed "$t0")
echo "$MARK: fsx-done rc=$frc secs=$secs"
if [ $hung = 0 ] && [ $frc -eq 0 ] && grep -q 'All operations completed A-OK' /tmp/fsx.log; then
  echo "$NAME: fsx $OPS operations A-OK in ${secs}s (seed $SEED)"
else
  status=FAIL
  echo "$NAME: fsx FAILED (rc=$frc) after ${secs}s; its messages (the operation log left out):"
  grep -v '^\[ERROR fsx\] *[0-9]' /tmp/fsx.log | tail -n 40
  echo "$NAME: fsx's last 25 operations:"
  grep '^\[ERROR fsx\] *[0-9]' /tmp/fsx.log | tail -n 25
  ls -la "$ART"
fi
# The F_SETLKW in flight at the kills was granted once its holder let go, not before.
n=$(( LOCK_MS / 1000 + 60 ))
while kill -0 "$lock_pid" 2>/dev/null && [ $n -gt 0 ]; do sleep 1; n=$((n - 1)); done
if kill -0 "$lock_pid" 2>/dev/null; then
  echo "$NAME: locktest still waits $(( LOCK_MS / 1000 + 60 ))s after fsx ended: its kernel stacks:"
  for t in /proc/"$lock_pid"/task/* $(pgrep -P "$lock_pid" | sed 's|^|/proc/|'); do
    sed "s|^|  stack $(basename "$t"): |" "$t/stack" 2>/dev/null
  done
  pkill -KILL -P "$lock_pid"; kill -KILL "$lock_pid"
fi
wait "$lock_pid"
lrc=$?
sed "s/^/$NAME: /" /tmp/locktest.out
if [ $lrc -ne 0 ] || ! grep -q '^locktest: posix ok' /tmp/locktest.out; then
  echo "$NAME: the F_SETLKW waiting across the kills FAILED (rc=$lrc)"; status=FAIL
fi
rm -f /mnt/lock
if [ $hung = 0 ]; then
  echo "VMSUM-CACHED: $(md5sum < /mnt/fsx.dat | cut -d' ' -f1) $(stat -c %s /mnt/fsx.dat)"
  sync
  echo 3 > /proc/sys/vm/drop_caches
  echo "VMSUM: $(md5sum < /mnt/fsx.dat | cut -d' ' -f1) $(stat -c %s /mnt/fsx.dat)"
  vm_umount /mnt || status=FAIL
fi
vm_dmesg_check "$NAME" || status=FAIL
vm_result "$NAME" "status=$status ops=$OPS seed=$SEED rc=$frc secs=$secs"
[ "$status" = ok ]
