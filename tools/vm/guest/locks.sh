#!/bin/sh
# Guest suite: two processes contending for locks on a file in the virtiofs mount
# (/harness/locktest, built from tools/vm/locktest.c by run-guest.sh):
#   posix     the holder keeps an fcntl write lock; the other process's F_SETLK is EAGAIN, its
#             F_GETLK names the holder's pid, its F_SETLKW waits until the holder closes the file
#   flock     the same with flock(2)
#   deadlock  two processes each waiting for the other's byte: the second F_SETLKW is EDEADLK
#   signal    SIGALRM during F_SETLKW: Linux's virtio-fs sends no FUSE_INTERRUPT, so the call
#             waits for the lock (returns 0) where a guest-local lock wait returns EINTR
#   kill      SIGKILL during F_SETLKW: reports whether the process died at once or only once the
#             holder let go (informational: either way it must end)
# and /proc/locks, read while the lock is held, shows whether the guest kernel kept the lock
# (local) or sent it to the device (remote: POSIX_LOCKS / FLOCK_LOCKS negotiated).
# Env: LOCKS_HOLD_MS (1500), LOCKS_EXPECT (remote; "local" for a server without lock support,
#      e.g. virtiofsd; "any" to accept both), LOCKS_CHECKS (the checks to run, default all five:
#      a device whose locks an NFS server keeps cannot see a deadlock, so "deadlock" is left out
#      there).
. /harness/lib.sh
HOLD=${LOCKS_HOLD_MS:-1500}
EXPECT=${LOCKS_EXPECT:-remote}
T=/harness/locktest
[ -x "$T" ] || { echo "locks: $T missing (run-guest.sh builds it with the host's cc)"; vm_result locks "status=FAIL reason=no-locktest"; exit 1; }
vm_mount /mnt || exit 1
F=/mnt/locks.dat
: > "$F"
status=ok
out=/tmp/locks.out
: > "$out"
for check in ${LOCKS_CHECKS:-posix flock deadlock signal kill}; do
  case $check in
    deadlock) "$T" deadlock "$F" >> "$out" 2>&1 ;;
    *) "$T" "$check" "$F" "$HOLD" >> "$out" 2>&1 ;;
  esac
  rc=$?
  tail -n 1 "$out"
  [ $rc = 0 ] || status=FAIL
done
where=$(sed -n 's/.* proc_locks=\([a-z]*\).*/\1/p' "$out" | sort -u | tr '\n' ' ' | sed 's/ $//')
case $EXPECT in
  any) ;;
  *) if [ "$where" != "$EXPECT" ]; then
       echo "locks: the locks were kept $where, expected $EXPECT"
       status=FAIL
     fi ;;
esac
posix_ms=$(sed -n 's/^locktest: posix ok child waited \([0-9]*\) ms.*/\1/p' "$out")
flock_ms=$(sed -n 's/^locktest: flock ok child waited \([0-9]*\) ms.*/\1/p' "$out")
signal=$(sed -n 's/^locktest: signal ok .*: \(.*\) after [0-9]* ms$/\1/p' "$out" | tr ' ' '_')
killed=$(sed -n 's/^locktest: kill ok .*(\([a-z]*\) the holder let go.*/\1/p' "$out")
rm -f "$F"
vm_umount /mnt || status=FAIL
vm_dmesg_check locks || status=FAIL
vm_result locks "status=$status hold_ms=$HOLD posix_wait_ms=${posix_ms:-?} flock_wait_ms=${flock_ms:-?} locks=${where:-?} signal=${signal:-?} sigkill_ended=${killed:-?}_release"
[ "$status" = ok ]
