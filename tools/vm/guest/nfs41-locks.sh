#!/bin/sh
# Guest suite of tools/vm/run-nfs41-locks-test.sh (issue 23): locks on one NFSv4.1 export seen
# through three mounts, whose locks only the NFS server can compare:
#   /mnt/a, /mnt/b  two virtio-fs functions of one daemon (tags VM_TAG_A, VM_TAG_B), both serving
#                   the export over NFSv4.1 (each its own NFS client id: the guest kernel sees
#                   two file systems and keeps no lock of its own)
#   /mnt/k          the guest kernel's own NFSv4.1 client of the same export (a second client,
#                   virtio-net on QEMU's user networking, restrict=on, one guestfwd to the server)
# Each check is `locktest cross KIND HOLDFILE WAITFILE` (tools/vm/locktest.c): a process holds a
# write lock through one mount (fcntl: bytes 100-199, flock: the whole file); through the other
# F_SETLK (LOCK_NB) is EAGAIN, F_GETLK shows the write lock and a range beside it is free; a
# waiter's F_SETLKW (LOCK_EX) through the other blocks until the holder is killed with SIGKILL
# and is then granted. Checks: posix and flock a -> b, posix b -> a, posix k -> a and a -> k,
# flock k -> a and a -> k (the kernel client maps flock to a whole-file lock on the server too).
# Without KNFS_PORT only the a/b checks run.
# Env: VM_TAG_A, VM_TAG_B, KNFS_ADDR (10.0.2.100), KNFS_PORT, KNFS_EXPORT (the export's pseudo
# path), LOCKS_HOLD_MS (1500: how long the holder lives with a waiter blocked), LOCKS_GRANT_MAX_MS
# (30000: how long after the SIGKILL the waiter may take), NFS41_LOCK_CHECKS (the checks, as
# KIND:HOLD:WAIT with HOLD/WAIT one of a b k; default all seven above).
. /harness/lib.sh
T=/harness/locktest
HOLD=${LOCKS_HOLD_MS:-1500}
GRANT_MAX=${LOCKS_GRANT_MAX_MS:-30000}
ADDR=${KNFS_ADDR:-10.0.2.100}
t0=$(vm_now)
status=ok
fail() { echo "nfs41-locks: FAIL: $*"; status=FAIL; }
[ -x "$T" ] || { vm_result nfs41-locks "status=FAIL reason=no-locktest"; exit 1; }
VM_TAG=${VM_TAG_A:?}; vm_mount /mnt/a || { vm_result nfs41-locks "status=FAIL reason=mount-a"; exit 1; }
VM_TAG=${VM_TAG_B:?}; vm_mount /mnt/b || { vm_result nfs41-locks "status=FAIL reason=mount-b"; exit 1; }
mounts="a b"
if [ -n "${KNFS_PORT:-}" ]; then
  vm_net_up || fail "network"
  vm_net_isolated "$KNFS_PORT" || fail "the host's 10.0.2.2:$KNFS_PORT answers (restrict=on expected)"
  mkdir -p /mnt/k
  # busybox mount passes nfs4's options to the kernel as they are: addr= is what mount.nfs would
  # add. NFSv4.1 needs no rpcbind and no MOUNT protocol: one TCP connection to the NFS port.
  if mount -t nfs4 -o "vers=4.1,proto=tcp,port=$KNFS_PORT,addr=$ADDR" "$ADDR:${KNFS_EXPORT:?}" /mnt/k; then
    grep ' /mnt/k ' /proc/mounts | sed 's/^/nfs41-locks: kernel client: /'
    mounts="a b k"
  else
    dmesg | tail -n 20
    fail "the kernel NFSv4.1 client cannot mount $ADDR:$KNFS_EXPORT (port $KNFS_PORT)"
  fi
fi
echo "nfs41-locks: mounted ($mounts) at $(vm_elapsed "$t0")s"
F=locks41.dat
echo "lock file" > "/mnt/a/$F" && sync
for m in $mounts; do
  [ "$(cat "/mnt/$m/$F" 2>/dev/null)" = "lock file" ] || fail "the file written through a does not read back through $m"
done
checks=${NFS41_LOCK_CHECKS:-posix:a:b flock:a:b posix:b:a posix:k:a posix:a:k flock:k:a flock:a:k}
passed=0 failed=0 skipped=0 res=""
for c in $checks; do
  kind=${c%%:*} rest=${c#*:}
  h=${rest%%:*} w=${rest#*:}
  case " $mounts " in *" $h "*) ;; *) skipped=$((skipped + 1)); res="$res $kind-$h$w=skipped"; continue ;; esac
  case " $mounts " in *" $w "*) ;; *) skipped=$((skipped + 1)); res="$res $kind-$h$w=skipped"; continue ;; esac
  if "$T" cross "$kind" "/mnt/$h/$F" "/mnt/$w/$F" "$HOLD" "$GRANT_MAX" > /tmp/cross.out 2>&1; then
    passed=$((passed + 1))
    ms=$(sed -n 's/.*granted_after_kill_ms=\([0-9]*\).*/\1/p' /tmp/cross.out)
    res="$res $kind-$h$w=${ms}ms"
  else
    failed=$((failed + 1))
    status=FAIL
    res="$res $kind-$h$w=FAIL"
  fi
  sed "s/^/[$kind $h->$w] /" /tmp/cross.out
done
rm -f "/mnt/a/$F"
if [ -n "${KNFS_PORT:-}" ] && grep -q ' /mnt/k ' /proc/mounts; then
  umount /mnt/k || fail "umount /mnt/k"
fi
vm_umount /mnt/b || fail "umount /mnt/b"
vm_umount /mnt/a || fail "umount /mnt/a"
VM_DMESG_ALLOW='virtio_net' vm_dmesg_check nfs41-locks || status=FAIL
# res: each check's time from the holder's SIGKILL to the waiter's grant (KIND-HOLDWAIT=MS)
vm_result nfs41-locks "status=$status passed=$passed failed=$failed skipped=$skipped hold_ms=$HOLD mounts=$(echo $mounts | tr ' ' ,)$res time=$(vm_elapsed "$t0")s"
[ "$status" = ok ]
