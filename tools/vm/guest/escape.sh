#!/bin/sh
# Guest suite: try to leave a passthrough share (virtiofs-dpu --shared-dir DIR) from the
# guest side with an unmodified kernel: `..` at the mount root, symlinks out of the share
# (absolute, relative, `..`, /proc/self/root), a hard link to such a symlink, a directory
# raced against a symlink, device nodes and FIFOs made in the share. A real kernel resolves
# symlinks and `..` itself, in the guest's namespace, so each of these must land in the
# guest's own tree; the device must never show anything from the host outside DIR.
#
# Host-side canary (recommended): before the run put a file beside DIR whose name and
# content appear nowhere in DIR, and pass them in:
#   echo "$SECRET" > "$DIR/../vfdpu-escape-canary"
#   tools/vm/run-device-test.sh --daemon-arg --shared-dir --daemon-arg "$DIR" \
#     -e ESCAPE_CANARY_NAME=vfdpu-escape-canary -e ESCAPE_CANARY_TEXT="$SECRET" \
#     tools/vm/guest/escape.sh
# The script then fails if that name or text shows up anywhere under /mnt; afterwards
# check on the host that the canary's content and mtime are unchanged.
# Env: ESCAPE_RACE_ROUNDS (200), ESCAPE_CANARY_NAME, ESCAPE_CANARY_TEXT.
. /harness/lib.sh
vm_mount /mnt || exit 1
chmod 0755 /mnt
t0=$(vm_now)
npass=0
nfail=0
ok() { npass=$((npass + 1)); echo "escape: ok: $*"; }
bad() { nfail=$((nfail + 1)); echo "escape: FAIL: $*"; }
check() { # DESCRIPTION COMMAND...
  d=$1; shift
  if "$@"; then ok "$d"; else bad "$d"; fi
}
same() { [ "$1" = "$2" ]; }
id_of() { stat -c %d:%i "$1" 2>/dev/null; }
idL_of() { stat -L -c %d:%i "$1" 2>/dev/null; }

canary_scan() { # LABEL: the host canary must not be visible under /mnt (symlinks not followed)
  if [ -n "${ESCAPE_CANARY_NAME:-}" ]; then
    found=$(find /mnt -name "$ESCAPE_CANARY_NAME" 2>/dev/null | head -5)
    check "$1: canary name not under /mnt" same "$found" ""
  fi
  if [ -n "${ESCAPE_CANARY_TEXT:-}" ]; then
    found=$(find /mnt -type f -exec grep -l -F -e "$ESCAPE_CANARY_TEXT" {} + 2>/dev/null | head -5)
    check "$1: canary text in no file under /mnt" same "$found" ""
  fi
}

W=/mnt/escape-work
rm -rf "$W" /tmp/escape-target
mkdir -p "$W" /tmp/escape-target
canary_scan before

# 1. `..` at the root of the mount is the guest's /, however often it is taken.
root_id=$(id_of /)
check "/mnt/.. is the guest root" same "$(id_of /mnt/..)" "$root_id"
check "/mnt/../.. is the guest root" same "$(id_of /mnt/../..)" "$root_id"
check "cd /mnt; cd .. lands in /" sh -c 'cd /mnt && cd .. && [ "$(pwd -P)" = / ]'
check "cd /mnt; cd ../../.. lands in /" sh -c 'cd /mnt && cd ../../.. && [ "$(pwd -P)" = / ]'
check "/mnt/escape-work/../.. is the guest root" same "$(id_of "$W/../..")" "$root_id"

# 2. Symlinks pointing out of the share: readlink gives the text, following them stays in the
#    guest (the guest kernel follows them, never the device).
ln -s /etc "$W/abs"
ln -s ../../../../../../.. "$W/rel"
ln -s .. "$W/dotdot"
ln -s /proc/self/root "$W/proc"
ln -s /nonexistent/outside "$W/dangling"
check "readlink abs" same "$(readlink "$W/abs")" /etc
check "readlink rel" same "$(readlink "$W/rel")" ../../../../../../..
check "readlink proc" same "$(readlink "$W/proc")" /proc/self/root
check "abs is a symlink (lstat)" test -L "$W/abs"
check "abs/ resolves to the guest /etc" same "$(idL_of "$W/abs")" "$(id_of /etc)"
check "rel resolves to the guest /" same "$(idL_of "$W/rel")" "$root_id"
check "dotdot resolves to /mnt" same "$(idL_of "$W/dotdot")" "$(id_of /mnt)"
check "proc resolves to the guest /" same "$(idL_of "$W/proc")" "$root_id"
check "abs/passwd is the guest's passwd" cmp -s "$W/abs/passwd" /etc/passwd
check "creating through a dangling link fails in the guest" sh -c "! ( : > '$W/dangling' ) 2>/dev/null"
check "nothing was created at the dangling target" test ! -e /nonexistent/outside

# 3. A hard link to an outward symlink is another symlink with the same text.
check "hard link to a symlink" ln "$W/abs" "$W/abs-hard"
check "the hard link is a symlink" test -L "$W/abs-hard"
check "the hard link has the same text" same "$(readlink "$W/abs-hard")" /etc
check "link count 2" same "$(stat -c %h "$W/abs")" 2

# 4. A directory raced against a symlink to a guest directory: whatever wins, files land in
#    the share or in the guest's /tmp/escape-target, and the device keeps answering.
rounds=${ESCAPE_RACE_ROUNDS:-200}
(
  i=0
  while [ $i -lt "$rounds" ]; do
    rm -rf "$W/race" 2>/dev/null
    mkdir "$W/race" 2>/dev/null
    rm -rf "$W/race" 2>/dev/null
    ln -s /tmp/escape-target "$W/race" 2>/dev/null
    i=$((i + 1))
  done
) &
racer=$!
i=0
while [ $i -lt "$rounds" ]; do
  # (a failed redirection on a special builtin would end the shell: use a subshell)
  ( : > "$W/race/planted-$i" ) 2>/dev/null
  ls "$W/race/" > /dev/null 2>&1
  cat "$W/race/planted-$i" > /dev/null 2>&1
  i=$((i + 1))
done
wait $racer
rm -rf "$W/race"
check "the device answers after the race" ls "$W" > /dev/null
stray=$(find / -xdev -name 'planted-*' 2>/dev/null | grep -v '^/tmp/escape-target/' | head -3)
check "planted files only in the guest target (or gone with the share's directory)" same "$stray" ""

# 5. Device nodes and FIFOs made in the share are the guest's.
check "mknod c 1 3 in the share" mknod "$W/null" c 1 3
check "writing to it is the guest's /dev/null" sh -c "echo hi > '$W/null' && [ ! -s '$W/null' ]"
check "mkfifo in the share" mkfifo "$W/fifo"
check "a FIFO in the share works in the guest" sh -c "(echo through > '$W/fifo' &) ; read l < '$W/fifo'; [ \"\$l\" = through ]"

# 6. Names: the guest kernel never sends '/', but odd names must round-trip.
for n in '...' '.hidden' ' space' 'nl
line' '..x' 'x..'; do
  touch "$W/$n" && [ -e "$W/$n" ] && rm "$W/$n" && ok "odd name [$n]" || bad "odd name [$n]"
done

rm -rf "$W"
check "the work directory is gone" test ! -e "$W"
canary_scan after
cd /
vm_umount /mnt || bad "umount"
vm_dmesg_check escape || nfail=$((nfail + 1))
secs=$(vm_elapsed "$t0")
status=ok
[ $nfail = 0 ] || status=FAIL
echo "escape: $npass passed, $nfail failed (${secs}s)"
vm_result escape "status=$status passed=$npass failed=$nfail secs=$secs"
[ $nfail = 0 ]
