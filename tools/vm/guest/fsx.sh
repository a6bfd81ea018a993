#!/bin/sh
# Guest suite: fsx (random file operations, every read verified) on a file in
# the virtiofs mount, with a fixed seed so runs are reproducible.
# Env: FSX_OPS (20000), FSX_SEED (1), FSX_CONFIG (/harness/fsx.toml),
#      FSX_ARGS (extra fsx arguments, e.g. -v to log every operation).
. /harness/lib.sh
OPS=${FSX_OPS:-20000}
SEED=${FSX_SEED:-1}
CFG=${FSX_CONFIG:-/harness/fsx.toml}
ART=/tmp/fsx-artifacts
vm_mount /mnt || exit 1
mkdir -p "$ART"
rm -f /mnt/fsx.dat
t0=$(vm_now)
echo "fsx: $OPS operations, seed $SEED, config $CFG, file /mnt/fsx.dat"
fsx -N "$OPS" -S "$SEED" -f "$CFG" -P "$ART" ${FSX_ARGS:-} /mnt/fsx.dat > /tmp/fsx.log 2>&1
frc=$?
secs=$(vm_elapsed "$t0")
status=ok
if [ $frc -ne 0 ] || ! grep -q 'All operations completed A-OK' /tmp/fsx.log; then
  status=FAIL
  echo "fsx: FAILED (rc=$frc) after ${secs}s; last 80 lines of its output:"
  tail -n 80 /tmp/fsx.log
  ls -la "$ART"
else
  cat /tmp/fsx.log
  echo "fsx: $OPS operations OK in ${secs}s (seed $SEED)"
fi
rm -f /mnt/fsx.dat
vm_umount /mnt || status=FAIL
vm_dmesg_check fsx || status=FAIL
vm_result fsx "status=$status ops=$OPS seed=$SEED rc=$frc secs=$secs"
[ "$status" = ok ]
