#!/bin/sh
# Guest suite driver: every suite in one boot (saves a boot per suite).
# Env: VM_SUITES (default "pjdfstest fsx bigfile locks dmesg-check").
. /harness/lib.sh
rc=0
npass=0
nfail=0
for s in ${VM_SUITES:-pjdfstest fsx bigfile locks dmesg-check}; do
  echo "===== suite $s"
  if sh "/harness/$s.sh"; then
    echo "===== suite $s: ok"
    npass=$((npass + 1))
  else
    echo "===== suite $s: FAILED"
    rc=1
    nfail=$((nfail + 1))
  fi
done
vm_result all "status=$([ $rc = 0 ] && echo ok || echo FAIL) passed=$npass failed=$nfail"
echo "guest suites: $npass passed, $nfail failed"
exit $rc
