#!/bin/sh
# Guest suite: creating in a directory whose group is one of the caller's supplementary groups
# (FUSE_CREATE_SUPP_GROUP). The guest kernel (default_permissions) grants it from the caller's
# real groups; the device only learns of that group from the request extension the kernel adds
# to CREATE/MKNOD/MKDIR/SYMLINK when the parent's group is a supplementary group of the caller.
# Without it the passthrough (which runs each request with the caller's ids on the host) and the
# RAM fs (which checks again) would refuse: EACCES. Other requests carry no groups, so a
# directory only the group may search stays closed to such a caller (a LOOKUP fails first).
# User nobody (65534:65534) gets supplementary group suppg (4242) through /etc/group and
# busybox su (initgroups); user tests (1000) is not in it.
. /harness/lib.sh
vm_mount /mnt || exit 1
t0=$(vm_now)
npass=0
nfail=0
ok() { npass=$((npass + 1)); echo "suppgroup: ok: $*"; }
bad() { nfail=$((nfail + 1)); echo "suppgroup: FAIL: $*"; }
check() { d=$1; shift; if "$@"; then ok "$d"; else bad "$d"; fi; }
as() { u=$1; shift; su -s /bin/sh "$u" -c "$*"; }

grep -q '^suppg:' /etc/group || echo 'suppg:x:4242:nobody' >> /etc/group
check "nobody has supplementary group 4242" sh -c 'su -s /bin/sh nobody -c "id -G" | tr " " "\n" | grep -qx 4242'

D=/mnt/suppgroup
rm -rf "$D"
mkdir -p "$D/plain" "$D/sgid"
chgrp 4242 "$D/plain" "$D/sgid"
# Writable only through the group, searchable by anyone: lookups (which carry no extension) are
# granted by the "other" bits, the creation's write permission only by the group.
chmod 0775 "$D/plain"
chmod 2775 "$D/sgid"
chmod 0755 "$D"

# Every creation kind the extension comes with.
check "create (open O_CREAT) via the group" as nobody "echo data > $D/plain/file"
check "mkdir via the group" as nobody "mkdir $D/plain/dir"
check "mknod (fifo) via the group" as nobody "mkfifo $D/plain/fifo"
check "symlink via the group" as nobody "ln -s file $D/plain/link"
check "the new file has the caller's ids" sh -c "[ \"\$(stat -c %u:%g $D/plain/file)\" = 65534:65534 ]"
check "the new directory has the caller's ids" sh -c "[ \"\$(stat -c %u:%g $D/plain/dir)\" = 65534:65534 ]"
check "the data arrived" sh -c "[ \"\$(cat $D/plain/file)\" = data ]"
# In a set-group-id directory the new node takes the directory's group (and a directory the bit).
check "create in a setgid directory via the group" as nobody "touch $D/sgid/file"
check "mkdir in a setgid directory via the group" as nobody "mkdir $D/sgid/dir"
check "the file got the directory's group" sh -c "[ \"\$(stat -c %g $D/sgid/file)\" = 4242 ]"
check "the directory got the group and set-group-id" sh -c "[ \"\$(stat -c %g:%A $D/sgid/dir)\" = 4242:drwxr-sr-x ]"
# Someone outside the group is refused (by the guest kernel already).
check "a user outside the group cannot create" sh -c "! su -s /bin/sh tests -c 'touch $D/plain/nope' 2>/dev/null"
check "nothing was created by the outsider" sh -c "[ ! -e $D/plain/nope ]"

rm -rf "$D"
vm_umount /mnt
vm_dmesg_check suppgroup || nfail=$((nfail + 1))
st=ok
[ $nfail = 0 ] || st=FAIL
vm_result suppgroup "status=$st passed=$npass failed=$nfail secs=$(vm_elapsed "$t0")"
[ $nfail = 0 ]
