//! Permission checks with non-root callers: the guest mounts without `default_permissions`, so the
//! server is the only line of defence.

mod harness;

use harness::ram::Fuse;
use harness::*;
use virtiofs_backend::abi::{self, opcode};

const S_IFREG: u32 = libc::S_IFREG;
const S_ISUID: u32 = libc::S_ISUID;
const S_ISGID: u32 = libc::S_ISGID;

const ALICE: (u32, u32) = (1000, 1000);
const BOB: (u32, u32) = (2000, 2000);

/// Root creates `/d` (0777) and Alice's file `/d/f` (0644).
fn setup<F: TestFs>(f: &harness::Fuse<F>) -> (u64, u64) {
    let d = f.mkdir(ROOT, b"d", 0o777).unwrap().nodeid;
    f.as_user(ALICE.0, ALICE.1);
    let file = f.mknod(d, b"f", S_IFREG | 0o644, 0).unwrap();
    assert_eq!((file.attr.uid, file.attr.gid), ALICE);
    (d, file.nodeid)
}

// RAM filesystem only: the host refuses a hard link to a file the caller neither owns nor may read
// and write with EPERM (`fs.protected_hardlinks`) before the parent's EACCES.
#[test]
fn creating_needs_write_and_search_on_the_parent() {
    let f = Fuse::new();
    f.as_user(ALICE.0, ALICE.1);
    // Root's 0755 directory.
    assert_eq!(f.mkdir(ROOT, b"x", 0o755), Err(libc::EACCES));
    assert_eq!(f.mknod(ROOT, b"x", S_IFREG | 0o644, 0), Err(libc::EACCES));
    assert_eq!(f.create(ROOT, b"x", 0o644, O_RDWR | O_CREAT).unwrap_err(), libc::EACCES);
    assert_eq!(f.symlink(ROOT, b"x", b"y"), Err(libc::EACCES));
    f.as_user(0, 0);
    let d = f.mkdir(ROOT, b"d", 0o777).unwrap().nodeid;
    let (e, o) = f.create(ROOT, b"rootfile", 0o644, O_RDWR | O_CREAT).unwrap();
    f.release(e.nodeid, o.fh).unwrap();
    f.as_user(ALICE.0, ALICE.1);
    assert_eq!(f.link(e.nodeid, ROOT, b"l"), Err(libc::EACCES));
    assert!(f.link(e.nodeid, d, b"l").is_ok());
    // Search permission: a 0666 directory can be listed by name but not looked into.
    f.as_user(0, 0);
    f.chmod(d, 0o776).unwrap();
    f.as_user(ALICE.0, ALICE.1);
    assert_eq!(f.lookup(d, b"l"), Err(libc::EACCES));
    assert_eq!(f.mkdir(d, b"y", 0o755), Err(libc::EACCES));
    // ...but root is not bound by it.
    f.as_user(0, 0);
    assert!(f.lookup(d, b"l").is_ok());
}

fn open_checks_the_mode_bits<F: TestFs>(f: &harness::Fuse<F>) {
    let (_d, ino) = setup(f);
    // Alice owns the 0644 file.
    let fh = f.open(ino, O_RDWR).unwrap();
    f.release(ino, fh).unwrap();
    f.as_user(BOB.0, BOB.1);
    assert!(f.open(ino, O_RDONLY).is_ok());
    assert_eq!(f.open(ino, O_WRONLY), Err(libc::EACCES));
    assert_eq!(f.open(ino, O_RDONLY | O_TRUNC), Err(libc::EACCES));
    // Group bits apply to the group.
    f.as_user(3000, ALICE.1);
    f.as_user(ALICE.0, ALICE.1).chmod(ino, 0o620).unwrap();
    f.as_user(3000, ALICE.1);
    assert!(f.open(ino, O_WRONLY).is_ok());
    assert_eq!(f.open(ino, O_RDONLY), Err(libc::EACCES));
    // The owner class wins even when it grants less than the others.
    f.as_user(ALICE.0, ALICE.1).chmod(ino, 0o066).unwrap();
    assert_eq!(f.open(ino, O_RDONLY), Err(libc::EACCES));
    // Root reads and writes anything.
    f.as_user(0, 0).chmod(ino, 0o000).unwrap();
    assert!(f.open(ino, O_RDWR).is_ok());
    // ACCESS: root may execute only if some execute bit is set.
    assert_eq!(f.access(ino, libc::X_OK as u32), Err(libc::EACCES));
    f.chmod(ino, 0o001).unwrap();
    assert!(f.access(ino, libc::X_OK as u32).is_ok());
    assert!(f.access(ino, (libc::R_OK | libc::W_OK) as u32).is_ok());
    f.as_user(BOB.0, BOB.1);
    assert!(f.access(ino, libc::X_OK as u32).is_ok());
    assert_eq!(f.access(ino, libc::R_OK as u32), Err(libc::EACCES));
    assert!(f.access(ino, libc::F_OK as u32).is_ok());
    // Opening a directory for listing needs read permission.
    f.as_user(0, 0);
    let d = f.mkdir(ROOT, b"private", 0o700).unwrap().nodeid;
    f.as_user(BOB.0, BOB.1);
    assert_eq!(f.opendir(d), Err(libc::EACCES));
}

fn chmod_chown_rules<F: TestFs>(f: &harness::Fuse<F>) {
    let (_d, ino) = setup(f);
    f.as_user(BOB.0, BOB.1);
    assert_eq!(f.chmod(ino, 0o777), Err(libc::EPERM), "not the owner");
    assert_eq!(f.chown(ino, Some(BOB.0), None), Err(libc::EPERM));
    assert_eq!(f.chown(ino, None, Some(BOB.1)), Err(libc::EPERM));
    // Both -1: nothing to change, nothing to check.
    assert!(f.chown(ino, None, None).is_ok());

    f.as_user(ALICE.0, ALICE.1);
    assert_eq!(f.chown(ino, Some(BOB.0), None), Err(libc::EPERM), "giving away");
    assert!(f.chown(ino, Some(ALICE.0), None).is_ok(), "to itself");
    assert_eq!(f.chown(ino, None, Some(4242)), Err(libc::EPERM), "not her group");
    // chgrp to her own group; set-uid/set-gid bits go.
    f.as_user(0, 0).chown(ino, None, Some(77)).unwrap();
    f.as_user(ALICE.0, ALICE.1);
    let a = f.chmod(ino, 0o6755).unwrap();
    assert_eq!(a.mode & 0o7777, 0o4755, "S_ISGID dropped: caller not in the file's group");
    f.as_user(0, 0).chmod(ino, 0o6755).unwrap();
    let a = f.as_user(ALICE.0, ALICE.1).chown(ino, None, Some(ALICE.1)).unwrap();
    assert_eq!((a.gid, a.mode & 0o7777), (ALICE.1, 0o755));
    // Root can do anything and keeps the bits it sets.
    let a = f.as_user(0, 0).chown(ino, Some(BOB.0), Some(BOB.1)).unwrap();
    assert_eq!((a.uid, a.gid), BOB);
    let a = f.chmod(ino, 0o6777).unwrap();
    assert_eq!(a.mode, S_IFREG | 0o6777);
}

fn utimes_rules<F: TestFs>(f: &harness::Fuse<F>) {
    let (_d, ino) = setup(f);
    let explicit = abi::SetattrIn {
        valid: abi::fattr::ATIME | abi::fattr::MTIME,
        atime: 10,
        mtime: 20,
        ..Default::default()
    };
    let now = abi::SetattrIn {
        valid: abi::fattr::ATIME | abi::fattr::MTIME | abi::fattr::ATIME_NOW | abi::fattr::MTIME_NOW,
        ..Default::default()
    };
    f.as_user(BOB.0, BOB.1);
    assert_eq!(f.setattr(ino, explicit), Err(libc::EPERM));
    assert_eq!(f.setattr(ino, now), Err(libc::EACCES), "no write permission");
    f.as_user(ALICE.0, ALICE.1).chmod(ino, 0o646).unwrap();
    f.as_user(BOB.0, BOB.1);
    assert!(f.setattr(ino, now).is_ok(), "write permission suffices for 'now'");
    assert_eq!(f.setattr(ino, explicit), Err(libc::EPERM), "but not for explicit times");
    let a = f.as_user(ALICE.0, ALICE.1).setattr(ino, explicit).unwrap();
    assert_eq!((a.atime, a.mtime), (10, 20));
}

// RAM filesystem only: the host refuses MTIME_NOW by a non-owner of a 0444 file (EPERM) though
// the handle it comes through is open for writing, which the RAM filesystem counts.
#[test]
fn truncate_rules() {
    let f = Fuse::new();
    let (_d, ino) = setup(&f);
    f.as_user(BOB.0, BOB.1);
    assert_eq!(f.truncate(ino, 0), Err(libc::EACCES));
    // ftruncate through a handle opened for writing succeeds whatever the mode bits say now.
    f.as_user(ALICE.0, ALICE.1);
    let fh = f.open(ino, O_RDWR).unwrap();
    f.chmod(ino, 0o444).unwrap();
    assert_eq!(f.truncate(ino, 5), Err(libc::EACCES));
    let a = f
        .setattr(
            ino,
            abi::SetattrIn { valid: abi::fattr::SIZE | abi::fattr::FH, size: 5, fh, ..Default::default() },
        )
        .unwrap();
    assert_eq!(a.size, 5);
    // A handle of another inode is refused.
    let bad = abi::SetattrIn {
        valid: abi::fattr::SIZE | abi::fattr::FH,
        size: 1,
        fh: fh + 1000,
        ..Default::default()
    };
    assert_eq!(f.setattr(ino, bad), Err(libc::EBADF));
    assert_eq!(f.as_user(0, 0).truncate(ROOT, 0), Err(libc::EISDIR));
    // ftruncate by a non-owner: the kernel adds MTIME_NOW; the write handle authorises it.
    f.as_user(ALICE.0, ALICE.1).chmod(ino, 0o666).unwrap();
    let bob_fh = f.as_user(BOB.0, BOB.1).open(ino, O_WRONLY).unwrap();
    f.as_user(ALICE.0, ALICE.1).chmod(ino, 0o444).unwrap();
    let ftruncate = abi::SetattrIn {
        valid: abi::fattr::SIZE | abi::fattr::FH | abi::fattr::MTIME | abi::fattr::MTIME_NOW,
        size: 2,
        fh: bob_fh,
        ..Default::default()
    };
    assert_eq!(f.as_user(BOB.0, BOB.1).setattr(ino, ftruncate).unwrap().size, 2);
    let no_fh =
        abi::SetattrIn { valid: abi::fattr::SIZE | abi::fattr::MTIME | abi::fattr::MTIME_NOW, ..ftruncate };
    assert_eq!(f.setattr(ino, no_fh), Err(libc::EACCES));
}

fn writes_and_truncates_by_non_root_clear_setuid<F: TestFs>(f: &harness::Fuse<F>) {
    let (d, ino) = setup(f);
    f.chmod(ino, 0o6775).unwrap();
    f.as_user(0, 0).chown(ino, None, Some(ALICE.1)).unwrap();
    f.chmod(ino, 0o6777).unwrap();
    // Root writing keeps the bits.
    let fh = f.open(ino, O_RDWR).unwrap();
    f.write(ino, fh, 0, b"root").unwrap();
    assert_eq!(f.getattr(ino).unwrap().mode & 0o7777, 0o6777);
    // Bob writing clears set-uid, and set-gid because group-execute is set.
    f.as_user(BOB.0, BOB.1);
    let fh = f.open(ino, O_WRONLY).unwrap();
    f.write(ino, fh, 0, b"bob").unwrap();
    assert_eq!(f.getattr(ino).unwrap().mode & 0o7777, 0o0777);
    // Set-gid without group-execute survives a member of the file's group (Linux 6.2+
    // `setattr_should_drop_sgid`), not anybody else.
    f.as_user(0, 0).chmod(ino, 0o6767).unwrap();
    f.as_user(3000, ALICE.1).truncate(ino, 1).unwrap();
    assert_eq!(f.getattr(ino).unwrap().mode & 0o7777, 0o2767);
    f.as_user(BOB.0, BOB.1).truncate(ino, 1).unwrap();
    assert_eq!(f.getattr(ino).unwrap().mode & 0o7777, 0o0767);
    // O_TRUNC by a non-root caller clears set-uid too.
    f.as_user(0, 0).chmod(ino, 0o4777).unwrap();
    let fh2 = f.as_user(BOB.0, BOB.1).open(ino, O_WRONLY | O_TRUNC).unwrap();
    assert_eq!(f.getattr(ino).unwrap().mode & 0o7777, 0o0777);
    // Files created in a set-gid directory take its group; directories inherit the bit.
    f.as_user(0, 0);
    let sg = f.mkdir(d, b"sg", 0o777).unwrap().nodeid;
    f.chown(sg, None, Some(555)).unwrap();
    f.chmod(sg, 0o2777).unwrap();
    f.as_user(ALICE.0, ALICE.1);
    let file = f.mknod(sg, b"x", S_IFREG | 0o644, 0).unwrap();
    assert_eq!(file.attr.gid, 555);
    assert_eq!(file.attr.mode & S_ISGID, 0);
    let sub = f.mkdir(sg, b"sub", 0o755).unwrap();
    assert_eq!((sub.attr.gid, sub.attr.mode & 0o7777), (555, 0o2755));
    for h in [fh, fh2] {
        f.as_user(BOB.0, BOB.1).release(ino, h).unwrap();
    }
    let _ = S_ISUID;
}

fn chown_clears_setuid_on_files_only<F: TestFs>(f: &harness::Fuse<F>) {
    let file = f.mknod(ROOT, b"f", S_IFREG | 0o644, 0).unwrap().nodeid;
    let dir = f.mkdir(ROOT, b"d", 0o755).unwrap().nodeid;
    for ino in [file, dir] {
        f.chmod(ino, 0o6755).unwrap();
    }
    // Even root's chown clears them on a file (as Linux does); a directory keeps them.
    assert_eq!(f.chown(file, Some(BOB.0), Some(BOB.1)).unwrap().mode & 0o7777, 0o755);
    assert_eq!(f.chown(dir, Some(BOB.0), Some(BOB.1)).unwrap().mode & 0o7777, 0o6755);
    // A set-gid file without group-execute keeps set-gid.
    f.chmod(file, 0o6745).unwrap();
    assert_eq!(f.chown(file, Some(0), None).unwrap().mode & 0o7777, 0o2745);
    // An empty SETATTR (chown -1 -1) changes nothing.
    f.chmod(file, 0o6755).unwrap();
    let before = f.getattr(file).unwrap();
    let after = f.setattr(file, abi::SetattrIn::default()).unwrap();
    assert_eq!(after, before);
}

fn sticky_directories<F: TestFs>(f: &harness::Fuse<F>) {
    let tmp = f.mkdir(ROOT, b"tmp", 0o1777).unwrap().nodeid;
    assert_eq!(f.getattr(tmp).unwrap().mode & 0o7777, 0o1777);
    f.as_user(ALICE.0, ALICE.1);
    f.mknod(tmp, b"alice", S_IFREG | 0o666, 0).unwrap();
    f.mkdir(tmp, b"alicedir", 0o777).unwrap();
    f.as_user(BOB.0, BOB.1);
    f.mknod(tmp, b"bob", S_IFREG | 0o666, 0).unwrap();
    assert_eq!(f.unlink(tmp, b"alice"), Err(libc::EPERM));
    assert_eq!(f.rmdir(tmp, b"alicedir"), Err(libc::EPERM));
    assert_eq!(f.rename(tmp, b"alice", tmp, b"mine"), Err(libc::EPERM));
    assert_eq!(f.rename(tmp, b"bob", tmp, b"alice"), Err(libc::EPERM), "target in sticky dir");
    assert!(f.rename(tmp, b"bob", tmp, b"bob2").is_ok());
    f.as_user(ALICE.0, ALICE.1);
    assert!(f.unlink(tmp, b"alice").is_ok());
    assert_eq!(f.unlink(tmp, b"bob2"), Err(libc::EPERM));
    // Root, and the owner of the directory, may.
    f.as_user(0, 0);
    assert!(f.unlink(tmp, b"bob2").is_ok());
    assert!(f.rmdir(tmp, b"alicedir").is_ok());
}

fn removal_and_rename_need_write_on_parents<F: TestFs>(f: &harness::Fuse<F>) {
    let ro = f.mkdir(ROOT, b"ro", 0o755).unwrap().nodeid;
    f.mknod(ro, b"f", S_IFREG | 0o666, 0).unwrap();
    let rw = f.mkdir(ROOT, b"rw", 0o777).unwrap().nodeid;
    f.as_user(ALICE.0, ALICE.1);
    assert_eq!(f.unlink(ro, b"f"), Err(libc::EACCES));
    assert_eq!(f.rename(ro, b"f", rw, b"f"), Err(libc::EACCES));
    let mine = f.mkdir(rw, b"mine", 0o755).unwrap().nodeid;
    f.mknod(rw, b"g", S_IFREG | 0o644, 0).unwrap();
    assert_eq!(f.rename(rw, b"g", ro, b"g"), Err(libc::EACCES));
    // Moving a directory to another parent needs write permission on it (its ".." changes).
    f.chmod(mine, 0o555).unwrap();
    let other = f.mkdir(rw, b"other", 0o777).unwrap().nodeid;
    assert_eq!(f.rename(rw, b"mine", other, b"mine"), Err(libc::EACCES));
    assert!(f.rename(rw, b"mine", rw, b"mine2").is_ok(), "same parent: fine");
    f.chmod(mine, 0o755).unwrap();
    assert!(f.rename(rw, b"mine2", other, b"mine").is_ok());
}

fn device_nodes_need_root<F: TestFs>(f: &harness::Fuse<F>) {
    let d = f.mkdir(ROOT, b"d", 0o777).unwrap().nodeid;
    f.as_user(ALICE.0, ALICE.1);
    assert_eq!(f.mknod(d, b"c", libc::S_IFCHR | 0o600, 0x0101), Err(libc::EPERM));
    assert_eq!(f.mknod(d, b"b", libc::S_IFBLK | 0o600, 0x0101), Err(libc::EPERM));
    assert!(f.mknod(d, b"p", libc::S_IFIFO | 0o600, 0).is_ok());
    // The caller's identity is what a new node is owned by.
    let r = f.call(opcode::GETATTR, f.lookup(d, b"p").unwrap().nodeid, &[&[0u8; 16]]);
    let attr: abi::AttrOut = parse(&r.body);
    assert_eq!((attr.attr.uid, attr.attr.gid), ALICE);
}

both_backends!(
    as_root:
    open_checks_the_mode_bits,
    chmod_chown_rules,
    utimes_rules,
    writes_and_truncates_by_non_root_clear_setuid,
    chown_clears_setuid_on_files_only,
    sticky_directories,
    removal_and_rename_need_write_on_parents,
    device_nodes_need_root,
);
