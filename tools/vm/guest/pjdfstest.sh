#!/bin/sh
# Guest suite: pjdfstest (POSIX conformance) on the virtiofs mount.
# Prints pjdfstest's summary and a VMRESULT line; fails when a test fails that
# is not listed in /harness/pjdfstest-exceptions.txt (tools/vm/pjdfstest-exceptions.txt).
# Env: PJDFSTEST_ARGS (extra args, e.g. test name patterns), PJDFSTEST_CONFIG,
# PJDFSTEST_EXCEPTIONS (the list's name in /harness, default pjdfstest-exceptions.txt; the NFS
# backend's is pjdfstest-exceptions-nfs.txt).
. /harness/lib.sh
CFG=${PJDFSTEST_CONFIG:-/harness/pjdfstest.toml}
EXC=/harness/${PJDFSTEST_EXCEPTIONS:-pjdfstest-exceptions.txt}
LOGF=/tmp/pjdfstest.log
vm_mount /mnt || exit 1
chmod 0755 /mnt
# second file system for the cross-device (EXDEV) cases
mkdir -p /tmp/pjd-secondary
mount -t tmpfs tmpfs /tmp/pjd-secondary
t0=$(vm_now)
echo "pjdfstest: starting ($CFG, path /mnt)"
cd /mnt || exit 1
NO_COLOR=1 CLICOLOR=0 pjdfstest -c "$CFG" -p /mnt -s /tmp/pjd-secondary ${PJDFSTEST_ARGS:-} > "$LOGF" 2>&1
prc=$?
cd /
secs=$(vm_elapsed "$t0")
ESC=$(printf '\033')
sed -i "s/${ESC}\[[0-9;]*m//g" "$LOGF"
cat "$LOGF"
summary=$(grep '^Summary:' "$LOGF" | tail -1)
if [ -z "$summary" ]; then
  echo "pjdfstest: no summary line (rc=$prc): crashed?"
  vm_result pjdfstest "status=FAIL reason=no-summary rc=$prc secs=$secs"
  exit 1
fi
# "Summary: F failed, S skipped, P passed, E expected failures, T total"
failed=$(echo "$summary" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
skipped=$(echo "$summary" | sed -n 's/.* \([0-9]*\) skipped.*/\1/p')
passed=$(echo "$summary" | sed -n 's/.* \([0-9]*\) passed.*/\1/p')
total=$(echo "$summary" | sed -n 's/.* \([0-9]*\) total.*/\1/p')

grep -E ' (FAILED|PASSED UNEXPECTEDLY)$' "$LOGF" | awk '{print $1}' | sort -u > /tmp/pjd-failed
: > /tmp/pjd-exc
[ -f "$EXC" ] && grep -Ev '^[[:space:]]*(#|$)' "$EXC" | awk '{print $1}' | sort -u > /tmp/pjd-exc
# in_set FILE WANT: print the lines of stdin that are (WANT=1) or are not (WANT=0) lines of FILE
# (busybox has no comm, and its grep -f treats an empty pattern file as "match all")
in_set() { awk -v f="$1" -v want="$2" 'BEGIN { while ((getline l < f) > 0) s[l] = 1 } ((($0 in s) ? 1 : 0) == want)'; }
unexpected=$(in_set /tmp/pjd-exc 0 < /tmp/pjd-failed)
excepted=$(in_set /tmp/pjd-exc 1 < /tmp/pjd-failed)
stale=$(in_set /tmp/pjd-failed 0 < /tmp/pjd-exc)
# Timing-sensitive cases (ETXTBSY races a child's exec; timestamps sleep naptime) can lose under
# a loaded TCG host: retry each unexpected failure alone, twice; one that then passes is reported
# as flaky, not as a failure.
flaky=""
if [ -n "$unexpected" ]; then
  still=""
  for t in $unexpected; do
    fixed=0
    for try in 1 2; do
      (cd /mnt && NO_COLOR=1 CLICOLOR=0 pjdfstest -c "$CFG" -p /mnt -s /tmp/pjd-secondary "$t") > /tmp/pjd-retry.log 2>&1
      rs=$(sed "s/${ESC}\[[0-9;]*m//g" /tmp/pjd-retry.log | grep '^Summary:' | tail -1)
      rf=$(echo "$rs" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
      rp=$(echo "$rs" | sed -n 's/.* \([0-9]*\) passed.*/\1/p')
      if [ "$rf" = 0 ] && [ "${rp:-0}" -ge 1 ]; then fixed=1; break; fi
    done
    if [ $fixed = 1 ]; then flaky="$flaky $t"; else still="$still $t"; fi
  done
  unexpected=$(echo $still | tr ' ' '\n' | grep . || true)
  [ -z "$flaky" ] || echo "$flaky" | tr ' ' '\n' | grep . | sed 's/^/pjdfstest: flaky (failed once, passed alone on retry): /'
fi
n_flaky=$(echo $flaky | tr ' ' '\n' | grep -c . || true)
n_unexp=$(echo "$unexpected" | grep -c . || true)
n_exc=$(echo "$excepted" | grep -c . || true)

echo "pjdfstest: $summary (${secs}s)"
echo "pjdfstest: $passed passed, $failed failed, $skipped skipped ($n_exc of the failures listed as exceptions)"
[ -z "$excepted" ] || echo "$excepted" | sed 's/^/pjdfstest: failed, listed as exception: /'
[ -z "$stale" ] || echo "$stale" | sed 's/^/pjdfstest: note: exception did not fail (remove it?): /'
[ -z "$unexpected" ] || echo "$unexpected" | sed 's/^/pjdfstest: UNEXPECTED FAILURE: /'

umount /tmp/pjd-secondary
vm_umount /mnt || { vm_result pjdfstest "status=FAIL reason=umount"; exit 1; }
status=ok
[ "$n_unexp" = 0 ] || status=FAIL
vm_dmesg_check pjdfstest || status=FAIL
vm_result pjdfstest "status=$status passed=$passed failed=$failed skipped=$skipped total=$total excepted=$n_exc unexpected=$n_unexp flaky=$n_flaky secs=$secs"
[ "$status" = ok ]
