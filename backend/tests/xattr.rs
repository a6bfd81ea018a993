//! Extended attributes and POSIX ACLs through the FUSE ops: namespaces, flags, sizes, the
//! permission rules for non-root callers, and ACLs kept in step with the mode, enforced and
//! inherited.

mod harness;

use harness::ram::Fuse;
use harness::*;
use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::ramfs::RamFsConfig;
use virtiofs_backend::RamFs;

const S_IFREG: u32 = libc::S_IFREG;
const S_ISGID: u32 = libc::S_ISGID;
const XATTR_CREATE: u32 = libc::XATTR_CREATE as u32;
const XATTR_REPLACE: u32 = libc::XATTR_REPLACE as u32;
const U: u32 = u32::MAX; // ACL_UNDEFINED_ID

const ALICE: (u32, u32) = (1000, 1000);
const BOB: (u32, u32) = (2000, 2000);

/// Root makes `/d` (0777); Alice makes her file `/d/f` (0644) and directory `/d/a` (0755).
fn setup<F: TestFs>(f: &harness::Fuse<F>) -> (u64, u64, u64) {
    let d = f.mkdir(ROOT, b"d", 0o777).unwrap().nodeid;
    f.as_user(ALICE.0, ALICE.1);
    let file = f.mknod(d, b"f", S_IFREG | 0o644, 0).unwrap().nodeid;
    let dir = f.mkdir(d, b"a", 0o755).unwrap().nodeid;
    (d, file, dir)
}

// RAM filesystem only: the host lists extended attributes in its own order, the RAM filesystem
// sorted.
#[test]
fn set_get_list_remove() {
    let f = Fuse::new();
    let (_d, file, dir) = setup(&f);
    let before = f.getattr(file).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    f.setxattr(file, b"user.one", b"1", 0).unwrap();
    let after = f.getattr(file).unwrap();
    assert!((after.ctime, after.ctimensec) > (before.ctime, before.ctimensec), "setxattr changes ctime");
    f.setxattr(file, b"user.two", b"", 0).unwrap();
    f.setxattr(dir, b"user.d", b"dir value", 0).unwrap();
    assert_eq!(f.xattr(file, b"user.one").unwrap(), b"1");
    assert_eq!(f.xattr(file, b"user.two").unwrap(), b"", "empty values exist");
    assert_eq!(f.xattr(dir, b"user.d").unwrap(), b"dir value");
    assert_eq!(f.xattr(file, b"user.nope"), Err(libc::ENODATA));

    // Size 0 asks for the size; a buffer too small is ERANGE.
    assert_eq!(f.getxattr(dir, b"user.d", 0).unwrap(), Xattr::Size(9));
    assert_eq!(f.getxattr(dir, b"user.d", 8), Err(libc::ERANGE));
    assert_eq!(f.getxattr(dir, b"user.d", 9).unwrap(), Xattr::Data(b"dir value".to_vec()));
    assert_eq!(f.listxattr(file, 0).unwrap(), Xattr::Size(18));
    assert_eq!(f.listxattr(file, 17), Err(libc::ERANGE));
    assert_eq!(f.xattr_names(file).unwrap(), [b"user.one".to_vec(), b"user.two".to_vec()]);

    // XATTR_CREATE / XATTR_REPLACE.
    assert_eq!(f.setxattr(file, b"user.one", b"x", XATTR_CREATE), Err(libc::EEXIST));
    assert_eq!(f.setxattr(file, b"user.new", b"x", XATTR_REPLACE), Err(libc::ENODATA));
    assert_eq!(f.setxattr(file, b"user.one", b"x", XATTR_CREATE | XATTR_REPLACE), Err(libc::EEXIST));
    f.setxattr(file, b"user.one", b"replaced", XATTR_REPLACE).unwrap();
    f.setxattr(file, b"user.new", b"created", XATTR_CREATE).unwrap();
    assert_eq!(f.xattr(file, b"user.one").unwrap(), b"replaced");

    f.removexattr(file, b"user.one").unwrap();
    assert_eq!(f.removexattr(file, b"user.one"), Err(libc::ENODATA));
    assert_eq!(f.xattr_names(file).unwrap(), [b"user.new".to_vec(), b"user.two".to_vec()]);
    // Names may hold any byte but NUL, "/" included.
    f.setxattr(file, b"user.a/b c", b"v", 0).unwrap();
    assert_eq!(f.xattr(file, b"user.a/b c").unwrap(), b"v");
}

// RAM filesystem only: the host filesystem may hold less than a 64 KiB value (ext4: a block,
// ENOSPC).
#[test]
fn names_values_and_namespaces() {
    let f = Fuse::new();
    let (e, o) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    let ino = e.nodeid;
    // Name length 1..=255, else ERANGE; values up to 64 KiB, else E2BIG.
    let long = [b"user.".as_slice(), &[b'n'; 250]].concat();
    assert_eq!(long.len(), 255);
    f.setxattr(ino, &long, b"v", 0).unwrap();
    assert_eq!(f.xattr(ino, &long).unwrap(), b"v");
    let too_long = [long.as_slice(), b"n"].concat();
    assert_eq!(f.setxattr(ino, &too_long, b"v", 0), Err(libc::ERANGE));
    assert_eq!(f.getxattr(ino, &too_long, 0), Err(libc::ERANGE));
    assert_eq!(f.removexattr(ino, &too_long), Err(libc::ERANGE));
    assert_eq!(f.setxattr(ino, b"", b"v", 0), Err(libc::ERANGE));
    let big = vec![7u8; 64 << 10];
    f.setxattr(ino, b"user.big", &big, 0).unwrap();
    assert_eq!(f.xattr(ino, b"user.big").unwrap(), big);
    let r = f.call(
        opcode::SETXATTR,
        ino,
        &[
            vm_memory::ByteValued::as_slice(&abi::SetxattrIn { size: (64 << 10) + 1, ..Default::default() }),
            &cstr(b"user.bigger"),
            &vec![0u8; (64 << 10) + 1],
        ],
    );
    assert_eq!(r.errno(), libc::E2BIG);

    // Unknown namespaces, other system.* names, empty suffixes.
    assert_eq!(f.setxattr(ino, b"foo.bar", b"v", 0), Err(libc::EOPNOTSUPP));
    assert_eq!(f.setxattr(ino, b"system.foo", b"v", 0), Err(libc::EOPNOTSUPP));
    assert_eq!(f.getxattr(ino, b"osx.x", 0), Err(libc::EOPNOTSUPP));
    assert_eq!(f.setxattr(ino, b"user.", b"v", 0), Err(libc::EINVAL));

    // trusted.* and security.* are root's to write; root may do it.
    f.setxattr(ino, b"trusted.t", b"secret", 0).unwrap();
    f.setxattr(ino, b"security.s", b"label", 0).unwrap();
    let names = f.xattr_names(ino).unwrap();
    assert!(names.contains(&b"trusted.t".to_vec()) && names.contains(&b"security.s".to_vec()));
    f.release(ino, o.fh).unwrap();
    f.as_user(ALICE.0, ALICE.1);
    assert_eq!(f.xattr(ino, b"trusted.t"), Err(libc::ENODATA), "trusted.* is invisible to users");
    assert_eq!(f.setxattr(ino, b"trusted.t", b"x", 0), Err(libc::EPERM));
    assert_eq!(f.removexattr(ino, b"trusted.t"), Err(libc::EPERM));
    assert_eq!(f.xattr(ino, b"security.s").unwrap(), b"label", "security.* is readable");
    assert_eq!(f.setxattr(ino, b"security.s", b"x", 0), Err(libc::EPERM));
    let names = f.xattr_names(ino).unwrap();
    assert!(!names.contains(&b"trusted.t".to_vec()), "LISTXATTR hides trusted.* from users");
    assert!(names.contains(&b"security.s".to_vec()));
}

fn user_namespace_permissions<F: TestFs>(f: &harness::Fuse<F>) {
    let (d, file, dir) = setup(f);
    // Alice owns the 0644 file: she may write; Bob may only read.
    f.setxattr(file, b"user.x", b"alice", 0).unwrap();
    f.as_user(BOB.0, BOB.1);
    assert_eq!(f.xattr(file, b"user.x").unwrap(), b"alice");
    assert_eq!(f.setxattr(file, b"user.x", b"bob", 0), Err(libc::EACCES));
    assert_eq!(f.removexattr(file, b"user.x"), Err(libc::EACCES));
    // Permission is checked before existence.
    assert_eq!(f.removexattr(file, b"user.none"), Err(libc::EACCES));
    // No read permission: EACCES even for a missing attribute.
    f.as_user(ALICE.0, ALICE.1).chmod(file, 0o600).unwrap();
    f.as_user(BOB.0, BOB.1);
    assert_eq!(f.xattr(file, b"user.x"), Err(libc::EACCES));
    assert_eq!(f.xattr(file, b"user.none"), Err(libc::EACCES));
    // LISTXATTR needs no permission.
    assert_eq!(f.xattr_names(file).unwrap(), [b"user.x".to_vec()]);
    // Group write permission is enough.
    f.as_user(ALICE.0, ALICE.1).chmod(file, 0o664).unwrap();
    f.as_user(3000, ALICE.1).setxattr(file, b"user.g", b"group", 0).unwrap();

    // Only regular files and directories carry user.*.
    f.as_user(ALICE.0, ALICE.1);
    let fifo = f.mknod(d, b"p", libc::S_IFIFO | 0o666, 0).unwrap().nodeid;
    let sym = f.symlink(d, b"s", b"f").unwrap().nodeid;
    for ino in [fifo, sym] {
        assert_eq!(f.setxattr(ino, b"user.x", b"v", 0), Err(libc::EPERM));
        assert_eq!(f.xattr(ino, b"user.x"), Err(libc::ENODATA));
        assert_eq!(f.removexattr(ino, b"user.x"), Err(libc::EPERM));
    }
    f.as_user(0, 0);
    f.setxattr(sym, b"trusted.ok", b"root may", 0).unwrap();

    // A sticky directory: only its owner (or root) writes user.*, even with write permission.
    f.as_user(ALICE.0, ALICE.1).chmod(dir, 0o1777).unwrap();
    f.setxattr(dir, b"user.mine", b"1", 0).unwrap();
    f.as_user(BOB.0, BOB.1);
    assert_eq!(f.setxattr(dir, b"user.bob", b"1", 0), Err(libc::EPERM));
    assert_eq!(f.removexattr(dir, b"user.mine"), Err(libc::EPERM));
    assert_eq!(f.xattr(dir, b"user.mine").unwrap(), b"1");
    f.as_user(0, 0).setxattr(dir, b"user.root", b"1", 0).unwrap();
    // Without the sticky bit, write permission decides.
    f.as_user(ALICE.0, ALICE.1).chmod(dir, 0o777).unwrap();
    f.as_user(BOB.0, BOB.1).setxattr(dir, b"user.bob", b"1", 0).unwrap();
}

// RAM filesystem only: the limits are the RAM filesystem's.
#[test]
fn capacity_and_per_inode_limits() {
    let cfg = RamFsConfig { capacity: 256 << 10, ..Default::default() };
    let f = Fuse::with_fs(RamFs::with_config(cfg));
    f.init(41, LINUX_FLAGS).unwrap();
    let a = f.mknod(ROOT, b"a", S_IFREG | 0o644, 0).unwrap().nodeid;
    let b = f.mknod(ROOT, b"b", S_IFREG | 0o644, 0).unwrap().nodeid;
    let v = vec![1u8; 60 << 10];
    for i in 0..4 {
        f.setxattr(a, format!("user.{i}").as_bytes(), &v, 0).unwrap();
    }
    assert!(f.fs().used_bytes() >= 240 << 10);
    // The filesystem is full: another inode's attribute does not fit.
    assert_eq!(f.setxattr(b, b"user.x", &v, 0), Err(libc::ENOSPC));
    // Replacing with a smaller value, and removing, give the space back.
    f.setxattr(a, b"user.0", b"small", 0).unwrap();
    f.setxattr(b, b"user.x", &v, 0).unwrap();
    f.removexattr(b, b"user.x").unwrap();
    // Unlinking (and forgetting) an inode frees its attributes.
    f.unlink(ROOT, b"a").unwrap();
    f.forget(a, 1);
    assert_eq!(f.fs().used_bytes(), 0);

    // One inode holds at most XATTR_INODE_MAX bytes.
    let f = Fuse::new();
    let ino = f.mknod(ROOT, b"f", S_IFREG | 0o644, 0).unwrap().nodeid;
    let v = vec![1u8; 64 << 10];
    let limit = virtiofs_backend::ramfs::XATTR_INODE_MAX;
    let mut i = 0;
    let err = loop {
        match f.setxattr(ino, format!("user.{i}").as_bytes(), &v, 0) {
            Ok(()) => i += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(err, libc::ENOSPC);
    assert!(i as u64 * (64 << 10) <= limit && (i as u64 + 1) * (64 << 10) > limit - 1024);
}

// RAM filesystem only: the host checks the format of `security.capability` (EINVAL for the test's
// value).
#[test]
fn security_capability_goes_on_write_truncate_and_chown() {
    let f = Fuse::new();
    let (e, o) = f.create(ROOT, b"f", 0o755, O_RDWR | O_CREAT).unwrap();
    let caps = b"security.capability";
    let set = || f.as_user(0, 0).setxattr(e.nodeid, caps, &[1, 0, 0, 2], 0).unwrap();
    set();
    // Even root's write drops it (cap_inode_need_killpriv does not ask who writes).
    f.write(e.nodeid, o.fh, 0, b"x").unwrap();
    assert_eq!(f.xattr(e.nodeid, caps), Err(libc::ENODATA));
    set();
    f.truncate(e.nodeid, 0).unwrap();
    assert_eq!(f.xattr(e.nodeid, caps), Err(libc::ENODATA));
    set();
    f.chown(e.nodeid, Some(5), None).unwrap();
    assert_eq!(f.xattr(e.nodeid, caps), Err(libc::ENODATA));
    // Other security attributes stay.
    f.setxattr(e.nodeid, b"security.other", b"v", 0).unwrap();
    f.write(e.nodeid, o.fh, 0, b"x").unwrap();
    assert_eq!(f.xattr(e.nodeid, b"security.other").unwrap(), b"v");
}

fn acl_of<F: TestFs>(f: &harness::Fuse<F>, ino: u64) -> Result<Vec<u8>, i32> {
    f.xattr(ino, b"system.posix_acl_access")
}

fn access_acl_sets_the_mode_and_reads_back<F: TestFs>(f: &harness::Fuse<F>) {
    let (_d, file, _dir) = setup(f);
    // A minimal ACL is just a chmod: nothing stored.
    let minimal = acl(&[(ACL_USER_OBJ, 6, U), (ACL_GROUP_OBJ, 0, U), (ACL_OTHER, 0, U)]);
    f.setxattr(file, b"system.posix_acl_access", &minimal, 0).unwrap();
    assert_eq!(f.getattr(file).unwrap().mode, S_IFREG | 0o600);
    assert_eq!(acl_of(f, file), Err(libc::ENODATA));
    assert!(f.xattr_names(file).unwrap().is_empty());

    // An extended ACL: mode group bits = mask.
    let ext = acl(&[
        (ACL_USER_OBJ, 7, U),
        (ACL_USER, 6, BOB.0),
        (ACL_GROUP_OBJ, 4, U),
        (ACL_GROUP, 2, 3000),
        (ACL_MASK, 6, U),
        (ACL_OTHER, 1, U),
    ]);
    f.setxattr(file, b"system.posix_acl_access", &ext, 0).unwrap();
    assert_eq!(f.getattr(file).unwrap().mode, S_IFREG | 0o761);
    assert_eq!(acl_of(f, file).unwrap(), ext);
    assert_eq!(f.xattr_names(file).unwrap(), [b"system.posix_acl_access".to_vec()]);
    assert_eq!(f.getxattr(file, b"system.posix_acl_access", 0).unwrap(), Xattr::Size(ext.len() as u32));

    // chmod rewrites owner, mask and other (posix_acl_chmod); named entries stay.
    f.chmod(file, 0o640).unwrap();
    let want = acl(&[
        (ACL_USER_OBJ, 6, U),
        (ACL_USER, 6, BOB.0),
        (ACL_GROUP_OBJ, 4, U),
        (ACL_GROUP, 2, 3000),
        (ACL_MASK, 4, U),
        (ACL_OTHER, 0, U),
    ]);
    assert_eq!(acl_of(f, file).unwrap(), want);

    // Removing it keeps the mode (group bits were the mask).
    f.removexattr(file, b"system.posix_acl_access").unwrap();
    assert_eq!(acl_of(f, file), Err(libc::ENODATA));
    assert_eq!(f.getattr(file).unwrap().mode, S_IFREG | 0o640);
    // Removing an absent ACL succeeds, as on Linux filesystems.
    f.removexattr(file, b"system.posix_acl_access").unwrap();
    // An empty ACL (header only) removes too.
    f.setxattr(file, b"system.posix_acl_access", &ext, 0).unwrap();
    f.setxattr(file, b"system.posix_acl_access", &acl(&[]), 0).unwrap();
    assert_eq!(acl_of(f, file), Err(libc::ENODATA));
}

// RAM filesystem only: the host filesystem refuses an ACL of more than a page with its own errno
// (ext4: ENOSPC, not E2BIG).
#[test]
fn acl_validation_and_who_may_set() {
    let f = Fuse::new();
    let (_d, file, _dir) = setup(&f);
    let name = b"system.posix_acl_access";
    let bad: Vec<Vec<u8>> = vec![
        vec![2, 0, 0],                                                          // short header
        acl(&[(ACL_USER_OBJ, 6, U), (ACL_GROUP_OBJ, 4, U)]),                    // no other
        acl(&[(ACL_GROUP_OBJ, 4, U), (ACL_USER_OBJ, 6, U), (ACL_OTHER, 0, U)]), // order
        acl(&[(ACL_USER_OBJ, 6, U), (ACL_USER, 6, 5), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)]), // no mask
        acl(&[(ACL_USER_OBJ, 8, U), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)]), // perm bits
        acl(&[
            (ACL_USER_OBJ, 6, U),
            (ACL_USER, 6, U),
            (ACL_GROUP_OBJ, 4, U),
            (ACL_MASK, 6, U),
            (ACL_OTHER, 0, U),
        ]),
        acl(&[(ACL_USER_OBJ, 6, U), (0x40, 6, 1), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)]), // tag
        [acl(&[(ACL_USER_OBJ, 6, U), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)]), vec![0; 3]].concat(),
    ];
    for (i, v) in bad.iter().enumerate() {
        assert_eq!(f.setxattr(file, name, v, 0), Err(libc::EINVAL), "case {i}");
    }
    let mut v1 = acl(&[(ACL_USER_OBJ, 6, U), (ACL_GROUP_OBJ, 4, U), (ACL_OTHER, 0, U)]);
    v1[0] = 1;
    assert_eq!(f.setxattr(file, name, &v1, 0), Err(libc::EOPNOTSUPP), "unknown version");
    // More than a page of entries: the kernel cannot read it back.
    let many: Vec<(u16, u16, u32)> = (0..600).map(|i| (ACL_USER, 4, 10_000 + i)).collect();
    let big = acl(&[
        vec![(ACL_USER_OBJ, 6, U)],
        many,
        vec![(ACL_GROUP_OBJ, 4, U), (ACL_MASK, 4, U), (ACL_OTHER, 0, U)],
    ]
    .concat());
    assert_eq!(f.setxattr(file, name, &big, 0), Err(libc::E2BIG));
    assert_eq!(f.getattr(file).unwrap().mode, S_IFREG | 0o644, "nothing changed");

    // Only the owner or root sets ACLs; anyone reads them.
    let good = acl(&[
        (ACL_USER_OBJ, 6, U),
        (ACL_USER, 4, BOB.0),
        (ACL_GROUP_OBJ, 4, U),
        (ACL_MASK, 4, U),
        (ACL_OTHER, 0, U),
    ]);
    f.as_user(BOB.0, BOB.1);
    assert_eq!(f.setxattr(file, name, &good, 0), Err(libc::EPERM));
    assert_eq!(f.removexattr(file, name), Err(libc::EPERM));
    f.as_user(0, 0).setxattr(file, name, &good, 0).unwrap();
    f.as_user(BOB.0, BOB.1);
    assert_eq!(acl_of(&f, file).unwrap(), good);
    // Symlinks have no ACLs.
    f.as_user(ALICE.0, ALICE.1);
    let sym = f.symlink(ROOT, b"s", b"x");
    assert_eq!(sym, Err(libc::EACCES), "root's 0755 directory");
    let sym = f.as_user(0, 0).symlink(ROOT, b"s", b"x").unwrap().nodeid;
    assert_eq!(f.setxattr(sym, name, &good, 0), Err(libc::EOPNOTSUPP));
}

// RAM filesystem only: two sessions with different INIT offers.
#[test]
fn setting_an_acl_clears_setgid_outside_the_group() {
    let name = b"system.posix_acl_access";
    let v = acl(&[(ACL_USER_OBJ, 7, U), (ACL_GROUP_OBJ, 5, U), (ACL_OTHER, 5, U)]);
    // An older kernel (no SETXATTR_EXT): we decide, knowing only the primary group.
    let f = Fuse::uninit();
    f.init(41, OLD_FLAGS).unwrap();
    let file = f.mknod(ROOT, b"f", S_IFREG | 0o644, 0).unwrap().nodeid;
    f.chown(file, Some(ALICE.0), Some(ALICE.1)).unwrap();
    f.chmod(file, 0o2755).unwrap();
    // Alice is in the file's group: set-gid stays.
    f.as_user(ALICE.0, ALICE.1).setxattr(file, name, &v, 0).unwrap();
    assert_eq!(f.getattr(file).unwrap().mode & 0o7777, 0o2755);
    // In a group she is not in, it goes.
    f.as_user(0, 0).chown(file, None, Some(777)).unwrap();
    f.chmod(file, 0o2755).unwrap();
    f.as_user(ALICE.0, ALICE.1).setxattr(file, name, &v, 0).unwrap();
    assert_eq!(f.getattr(file).unwrap().mode & 0o7777, 0o0755);

    // Linux 6.12 (SETXATTR_EXT and POSIX_ACL): the kernel decides, knowing the supplementary
    // groups, and says so with SETXATTR_ACL_KILL_SGID.
    let f = Fuse::new();
    let file = f.mknod(ROOT, b"f", S_IFREG | 0o644, 0).unwrap().nodeid;
    f.chown(file, Some(ALICE.0), Some(777)).unwrap();
    f.chmod(file, 0o2755).unwrap();
    f.as_user(ALICE.0, ALICE.1).setxattr_ext(file, name, &v, 0, 0).unwrap();
    assert_eq!(f.getattr(file).unwrap().mode & 0o7777, 0o2755, "in a supplementary group");
    f.setxattr_ext(file, name, &v, 0, abi::SETXATTR_ACL_KILL_SGID).unwrap();
    assert_eq!(f.getattr(file).unwrap().mode & 0o7777, 0o0755);
    // Unknown setxattr_flags bits are refused.
    assert_eq!(f.setxattr_ext(file, b"user.x", b"v", 0, 2), Err(libc::EINVAL));
    assert_eq!(f.setxattr_ext(file, b"user.x", b"v", 4, 0), Err(libc::EINVAL), "unknown flags");
}

fn acls_are_enforced<F: TestFs>(f: &harness::Fuse<F>) {
    let (_d, file, dir) = setup(f);
    let name = b"system.posix_acl_access";
    // u::rw- u:bob:rw- g::r-- g:3000:-w- m::rw- o::---
    let v = acl(&[
        (ACL_USER_OBJ, 6, U),
        (ACL_USER, 6, BOB.0),
        (ACL_GROUP_OBJ, 4, U),
        (ACL_GROUP, 2, 3000),
        (ACL_MASK, 6, U),
        (ACL_OTHER, 0, U),
    ]);
    f.setxattr(file, name, &v, 0).unwrap();
    let open = |who: (u32, u32), flags| f.as_user(who.0, who.1).open(file, flags);
    // Named user Bob: read and write.
    let fh = open(BOB, O_RDWR).unwrap();
    f.release(file, fh).unwrap();
    assert_eq!(f.as_user(BOB.0, BOB.1).access(file, 1), Err(libc::EACCES));
    // Owning group: read only.
    assert!(open((3001, ALICE.1), O_RDONLY).is_ok());
    assert_eq!(open((3001, ALICE.1), O_WRONLY), Err(libc::EACCES));
    // Named group 3000: write only, and no fallback to other for what it lacks.
    assert!(open((3002, 3000), O_WRONLY).is_ok());
    assert_eq!(open((3002, 3000), O_RDONLY), Err(libc::EACCES));
    // Others: nothing.
    assert_eq!(open((4000, 4000), O_RDONLY), Err(libc::EACCES));
    // The mask limits the named entries: chmod g-w makes the mask r--.
    f.as_user(ALICE.0, ALICE.1).chmod(file, 0o640).unwrap();
    assert_eq!(open(BOB, O_WRONLY), Err(libc::EACCES));
    assert!(open(BOB, O_RDONLY).is_ok());
    assert_eq!(open((3002, 3000), O_WRONLY), Err(libc::EACCES));
    // A mask of nothing (mode group bits 0): the ACL is skipped and the mode decides, as in
    // Linux's acl_permission_check; others (Bob included) get the other bits.
    f.as_user(ALICE.0, ALICE.1).chmod(file, 0o604).unwrap();
    assert!(open(BOB, O_RDONLY).is_ok());
    assert_eq!(open((3001, ALICE.1), O_RDONLY), Err(libc::EACCES), "the owning group gets ---");
    // The owner is never subject to the ACL.
    f.as_user(ALICE.0, ALICE.1).chmod(file, 0o004).unwrap();
    assert_eq!(open(ALICE, O_RDONLY), Err(libc::EACCES));

    // Directories: search permission through a named user entry.
    f.as_user(ALICE.0, ALICE.1);
    f.mknod(dir, b"inner", S_IFREG | 0o644, 0).unwrap();
    f.chmod(dir, 0o700).unwrap();
    assert_eq!(f.as_user(BOB.0, BOB.1).lookup(dir, b"inner"), Err(libc::EACCES));
    let dv = acl(&[
        (ACL_USER_OBJ, 7, U),
        (ACL_USER, 1, BOB.0),
        (ACL_GROUP_OBJ, 0, U),
        (ACL_MASK, 1, U),
        (ACL_OTHER, 0, U),
    ]);
    f.as_user(ALICE.0, ALICE.1).setxattr(dir, name, &dv, 0).unwrap();
    assert!(f.as_user(BOB.0, BOB.1).lookup(dir, b"inner").is_ok());
    assert_eq!(f.as_user(BOB.0, BOB.1).mknod(dir, b"x", S_IFREG | 0o644, 0), Err(libc::EACCES));
}

fn default_acls_are_inherited<F: TestFs>(f: &harness::Fuse<F>) {
    let (_d, file, dir) = setup(f);
    let dname = b"system.posix_acl_default";
    let dv = acl(&[
        (ACL_USER_OBJ, 7, U),
        (ACL_USER, 7, BOB.0),
        (ACL_GROUP_OBJ, 5, U),
        (ACL_MASK, 7, U),
        (ACL_OTHER, 0, U),
    ]);
    // Only on directories (EACCES elsewhere; removing one from a file is a no-op).
    assert_eq!(f.setxattr(file, dname, &dv, 0), Err(libc::EACCES));
    f.removexattr(file, dname).unwrap();
    f.setxattr(dir, dname, &dv, 0).unwrap();
    assert_eq!(f.xattr(dir, dname).unwrap(), dv);
    assert_eq!(f.getattr(dir).unwrap().mode & 0o777, 0o755, "a default ACL leaves the mode alone");
    assert_eq!(acl_of(f, dir), Err(libc::ENODATA));

    // A new file: access ACL from the default, masked by the create mode; the umask is not
    // applied (umask 077 would otherwise leave 0600).
    let arg = abi::MknodIn { mode: S_IFREG | 0o666, rdev: 0, umask: 0o077, padding: 0 };
    let r = f.call(opcode::MKNOD, dir, &[vm_memory::ByteValued::as_slice(&arg), &cstr(b"new")]);
    let e: abi::EntryOut = parse(&r.result().unwrap());
    assert_eq!(e.attr.mode, S_IFREG | 0o660, "u::rw- (mode), mask rw- (mode & mask), o::---");
    let got = acl_of(f, e.nodeid).unwrap();
    assert_eq!(
        got,
        acl(&[
            (ACL_USER_OBJ, 6, U),
            (ACL_USER, 7, BOB.0),
            (ACL_GROUP_OBJ, 5, U),
            (ACL_MASK, 6, U),
            (ACL_OTHER, 0, U)
        ])
    );
    assert_eq!(f.xattr(e.nodeid, dname), Err(libc::ENODATA), "files get no default ACL");
    // Bob may write it through his entry (rwx & mask rw-).
    let fh = f.as_user(BOB.0, BOB.1).open(e.nodeid, O_WRONLY).unwrap();
    f.release(e.nodeid, fh).unwrap();

    // A new directory gets both, and passes them on.
    let sub = f.as_user(ALICE.0, ALICE.1).mkdir_umask(dir, b"sub", 0o777, 0o077).unwrap();
    assert_eq!(sub.attr.mode & 0o777, 0o770);
    assert_eq!(f.xattr(sub.nodeid, dname).unwrap(), dv);
    let deeper = f.mkdir_umask(sub.nodeid, b"deeper", 0o700, 0).unwrap();
    assert_eq!(deeper.attr.mode & 0o777, 0o700);
    assert_eq!(f.xattr(deeper.nodeid, dname).unwrap(), dv);
    // CREATE and TMPFILE inherit too; symlinks do not.
    let arg = abi::CreateIn { flags: O_RDWR, mode: 0o640, umask: 0o077, open_flags: 0 };
    let body =
        f.call(opcode::CREATE, dir, &[vm_memory::ByteValued::as_slice(&arg), &cstr(b"c")]).result().unwrap();
    let c: abi::EntryOut = parse(&body);
    assert_eq!(c.attr.mode, S_IFREG | 0o640);
    assert!(acl_of(f, c.nodeid).is_ok());
    let (t, _) = f.tmpfile(dir, 0o600, O_RDWR, 0o077).unwrap();
    assert_eq!(t.attr.mode, S_IFREG | 0o600);
    assert!(acl_of(f, t.nodeid).is_ok());
    let s = f.symlink(dir, b"sym", b"c").unwrap();
    assert_eq!(acl_of(f, s.nodeid), Err(libc::EOPNOTSUPP), "symlinks have no ACLs (Linux's do_get_acl)");

    // Without a default ACL the umask applies.
    let plain = f.mkdir_umask(ROOT, b"plain", 0o777, 0o027);
    assert_eq!(plain, Err(libc::EACCES), "Alice in root's directory");
    let plain = f.as_user(0, 0).mkdir_umask(ROOT, b"plain", 0o777, 0o027).unwrap();
    assert_eq!(plain.attr.mode & 0o777, 0o750);
    // Removing the default ACL: new children follow the umask again.
    f.as_user(ALICE.0, ALICE.1).removexattr(dir, dname).unwrap();
    let later = f.mkdir_umask(dir, b"later", 0o777, 0o022).unwrap();
    assert_eq!(later.attr.mode & 0o777, 0o755);
    assert_eq!(f.xattr(later.nodeid, dname), Err(libc::ENODATA));
    // Set-gid directories still pass on their group and bit alongside the ACLs.
    f.as_user(0, 0).chmod(dir, 0o2777).unwrap();
    f.setxattr(dir, dname, &dv, 0).unwrap();
    let sg = f.mkdir_umask(dir, b"sg", 0o755, 0).unwrap();
    assert_eq!(sg.attr.mode & 0o7777, S_ISGID | 0o750, "o::--- from the default ACL");
}

both_backends!(
    as_root:
    user_namespace_permissions,
    access_acl_sets_the_mode_and_reads_back,
    acls_are_enforced,
    default_acls_are_inherited,
);
