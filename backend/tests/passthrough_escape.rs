//! Confinement of the passthrough filesystem against crafted FUSE requests: names that are not
//! single components, `..` at the root, symlinks out of the root (absolute and relative), a
//! symlink swapped in for a directory or file between LOOKUP and use (once, and racing), hard
//! links and renames towards the outside, forged node ids and handles, and special files. A
//! canary file and directory beside the shared directory (see `harness::passthrough::Canary`) must
//! stay untouched: not read, written, created in, listed or stat'ed.

mod harness;

use std::os::unix::fs::{symlink, MetadataExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::passthrough::{is_root, Canary, Fuse, Tree};
use harness::{with_fh, Xattr, ROOT};
use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::filesystem::{Context, CreateArgs, Error, FileSystem, MknodArgs, RenameArgs};
use vm_memory::ByteValued;

const RDWR: u32 = libc::O_RDWR as u32;

/// Runs `body` against a fresh share with a canary beside it, then checks the canary.
fn scenario(name: &str, body: impl FnOnce(&Fuse, &Tree, &Canary)) {
    let t = Tree::new();
    let c = Canary::new(&t);
    let f = Fuse::new(&t.share);
    body(&f, &t, &c);
    c.check(&f, name);
}

#[test]
fn names_that_are_not_one_component_are_refused() {
    scenario("names", |f, t, c| {
        std::fs::write(t.host("f"), b"in").unwrap();
        let file = f.lookup(ROOT, b"f").unwrap();
        let bad: [&[u8]; 6] = [b"../canary.txt", b"a/b", b"/etc/passwd", b"..//canary_dir", b"/", b"x/.."];
        for name in bad {
            assert_eq!(f.lookup(ROOT, name).unwrap_err(), libc::EINVAL, "{name:?}");
            assert_eq!(f.mkdir(ROOT, name, 0o777).unwrap_err(), libc::EINVAL);
            assert_eq!(f.create(ROOT, name, 0o666, RDWR).unwrap_err(), libc::EINVAL);
            assert_eq!(f.symlink(ROOT, name, b"/").unwrap_err(), libc::EINVAL);
            assert_eq!(f.mknod(ROOT, name, libc::S_IFREG | 0o666, 0).unwrap_err(), libc::EINVAL);
            assert_eq!(f.unlink(ROOT, name).unwrap_err(), libc::EINVAL);
            assert_eq!(f.rmdir(ROOT, name).unwrap_err(), libc::EINVAL);
            assert_eq!(f.rename(ROOT, b"f", ROOT, name).unwrap_err(), libc::EINVAL);
            assert_eq!(f.rename(ROOT, name, ROOT, b"stolen").unwrap_err(), libc::EINVAL);
            assert_eq!(f.link(file.nodeid, ROOT, name).unwrap_err(), libc::EINVAL);
        }
        for name in [&b"."[..], b".."] {
            assert_eq!(f.mkdir(ROOT, name, 0o777).unwrap_err(), libc::EINVAL);
            assert_eq!(f.create(ROOT, name, 0o666, RDWR).unwrap_err(), libc::EINVAL);
            assert_eq!(f.link(file.nodeid, ROOT, name).unwrap_err(), libc::EINVAL);
            assert_eq!(f.rename(ROOT, b"f", ROOT, name).unwrap_err(), libc::EINVAL);
            assert!(f.unlink(ROOT, name).is_err());
            assert!(f.rmdir(ROOT, name).is_err());
            assert!(f.rename(ROOT, name, ROOT, b"x").is_err());
        }
        assert_eq!(f.lookup(ROOT, b".").unwrap_err(), libc::EINVAL);
        // An embedded NUL ends the name: the rest is never looked at.
        let r = f.call(opcode::LOOKUP, ROOT, &[b"f\0/../canary.txt\0"]).result().unwrap();
        assert_eq!(harness::parse::<abi::EntryOut>(&r).nodeid, file.nodeid);
        // Empty names.
        assert_eq!(f.call(opcode::LOOKUP, ROOT, &[b"\0"]).result().unwrap_err(), libc::EINVAL);
        // The same checks hold when the filesystem is called directly, past the server's.
        let fs = f.fs();
        let ctx = Context::default();
        for name in [&b"../canary.txt"[..], b"a/b", b"", b".", b"..", b"x\0y", b"/"] {
            if name != b".." {
                assert_eq!(fs.lookup(&ctx, ROOT, name).unwrap_err(), Error::InvalidArgument, "{name:?}");
            }
            assert_eq!(fs.mkdir(&ctx, ROOT, name, 0o777, 0).unwrap_err(), Error::InvalidArgument);
            assert_eq!(fs.unlink(&ctx, ROOT, name).unwrap_err(), Error::InvalidArgument);
            assert_eq!(fs.rmdir(&ctx, ROOT, name).unwrap_err(), Error::InvalidArgument);
            assert_eq!(fs.symlink(&ctx, ROOT, name, b"x").unwrap_err(), Error::InvalidArgument);
            assert_eq!(
                fs.mknod(&ctx, ROOT, &MknodArgs { name, mode: libc::S_IFIFO, rdev: 0, umask: 0 })
                    .unwrap_err(),
                Error::InvalidArgument
            );
            assert_eq!(
                fs.rename(&ctx, ROOT, &RenameArgs { oldname: name, newdir: ROOT, newname: b"y", flags: 0 })
                    .unwrap_err(),
                Error::InvalidArgument
            );
            assert_eq!(
                fs.rename(&ctx, ROOT, &RenameArgs { oldname: b"f", newdir: ROOT, newname: name, flags: 0 })
                    .unwrap_err(),
                Error::InvalidArgument
            );
            assert_eq!(fs.link(&ctx, file.nodeid, ROOT, name).unwrap_err(), Error::InvalidArgument);
            assert_eq!(
                fs.create(
                    &ctx,
                    ROOT,
                    &CreateArgs { name, mode: 0o666, flags: RDWR, umask: 0, kill_priv: false }
                )
                .unwrap_err(),
                Error::InvalidArgument
            );
        }
        assert_eq!(fs.lookup(&ctx, ROOT, &[b'x'; 256]).unwrap_err(), Error::NameTooLong);
        assert!(t.host("f").is_file(), "the file was never renamed away");
        let _ = c;
    });
}

#[test]
fn dot_dot_at_the_root_stays_at_the_root() {
    scenario("dotdot", |f, t, _c| {
        let mut node = ROOT;
        for _ in 0..5 {
            let up = f.lookup(node, b"..").unwrap();
            assert_eq!(up.nodeid, ROOT);
            assert_eq!(up.attr.ino, std::fs::metadata(&t.share).unwrap().ino());
            node = up.nodeid;
        }
        assert_eq!(f.lookup(node, b"canary.txt").unwrap_err(), libc::ENOENT);
        assert_eq!(f.lookup(node, b"canary_dir").unwrap_err(), libc::ENOENT);
        // From deep down, `..` climbs to the root and no further.
        let a = f.mkdir(ROOT, b"a", 0o755).unwrap();
        let b = f.mkdir(a.nodeid, b"b", 0o755).unwrap();
        let mut node = b.nodeid;
        let mut seen = vec![];
        for _ in 0..5 {
            node = f.lookup(node, b"..").unwrap().nodeid;
            seen.push(node);
        }
        assert_eq!(seen, vec![a.nodeid, ROOT, ROOT, ROOT, ROOT]);
        // The root's listing shows `..` as the root itself.
        let fh = f.opendir(ROOT).unwrap();
        let list = f.readdir(ROOT, fh, 0, 4096).unwrap();
        let root_ino = std::fs::metadata(&t.share).unwrap().ino();
        assert!(list.iter().filter(|e| e.3 == b".." || e.3 == b".").all(|e| e.0 == root_ino));
        let plus = f.readdirplus(ROOT, fh, 0, 4096).unwrap();
        assert!(plus.iter().filter(|e| e.2 == b"..").all(|e| e.0.nodeid == 0 && e.0.attr.ino == 0));
        f.releasedir(ROOT, fh).unwrap();
    });
}

/// Symlinks pointing out of the share, made both on the host and through SYMLINK.
fn outward_links(f: &Fuse, t: &Tree, c: &Canary) -> Vec<(Vec<u8>, Vec<u8>)> {
    let base = t.base.path();
    let targets: Vec<Vec<u8>> = vec![
        c.file.to_str().unwrap().into(),
        c.dir.to_str().unwrap().into(),
        b"../canary.txt".to_vec(),
        b"../canary_dir".to_vec(),
        b"../../../../../../../..".to_vec(),
        b"/".to_vec(),
        b"/etc".to_vec(),
        b"/proc/self/root".to_vec(),
        b"..".to_vec(),
        format!("{}/../canary.txt", t.share.display()).into(),
        base.join("does-not-exist").to_str().unwrap().into(),
    ];
    let mut links = Vec::new();
    for (i, target) in targets.into_iter().enumerate() {
        let host_name = format!("hostlink{i}");
        symlink(std::str::from_utf8(&target).unwrap(), t.host(&host_name)).unwrap();
        links.push((host_name.into_bytes(), target.clone()));
        let name = format!("guestlink{i}").into_bytes();
        f.symlink(ROOT, &name, &target).unwrap();
        links.push((name, target));
    }
    links
}

#[test]
fn symlinks_out_of_the_root_are_never_followed() {
    scenario("symlinks", |f, t, c| {
        let links = outward_links(f, t, c);
        for (name, target) in &links {
            let what = String::from_utf8_lossy(name);
            let e = f.lookup(ROOT, name).unwrap();
            assert_eq!(e.attr.mode & libc::S_IFMT, libc::S_IFLNK, "{what}");
            let host = std::fs::symlink_metadata(t.host(&what)).unwrap();
            assert_eq!(e.attr.ino, host.ino(), "{what}: the link's own inode");
            assert_eq!(f.readlink(e.nodeid).unwrap(), *target, "{what}");
            let a = f.getattr(e.nodeid).unwrap();
            assert_eq!(a.mode & libc::S_IFMT, libc::S_IFLNK);
            assert_eq!(a.size, target.len() as u64);
            for flags in [libc::O_RDONLY, libc::O_RDWR | libc::O_TRUNC, libc::O_WRONLY | libc::O_APPEND] {
                assert_eq!(f.open(e.nodeid, flags as u32).unwrap_err(), libc::ELOOP, "{what}");
            }
            assert_eq!(f.opendir(e.nodeid).unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.lookup(e.nodeid, &c.inner_name).unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.lookup(e.nodeid, b"..").unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.create(e.nodeid, b"planted", 0o666, RDWR).unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.mkdir(e.nodeid, b"planted", 0o777).unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.symlink(e.nodeid, b"planted", b"x").unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.mknod(e.nodeid, b"planted", libc::S_IFREG, 0).unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.tmpfile(e.nodeid, 0o600, RDWR, 0).unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.unlink(e.nodeid, &c.inner_name).unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.truncate(e.nodeid, 0).unwrap_err(), libc::EINVAL);
            assert_eq!(f.chmod(e.nodeid, 0o777).unwrap_err(), libc::EOPNOTSUPP);
            let times = abi::SetattrIn {
                valid: abi::fattr::ATIME | abi::fattr::MTIME,
                atime: 1,
                mtime: 2,
                ..Default::default()
            };
            let a = f.setattr(e.nodeid, times).unwrap();
            assert_eq!(a.mtime, 2, "{what}: the link's own times");
            if is_root() {
                let a = f.chown(e.nodeid, Some(4321), Some(4321)).unwrap();
                assert_eq!(a.uid, 4321, "{what}: the link's own owner");
                // trusted.* xattrs may sit on a symlink: they must land on the link.
                if f.setxattr(e.nodeid, b"trusted.planted", b"1", 0).is_ok() {
                    let Xattr::Data(list) = f.listxattr(e.nodeid, 4096).unwrap() else { panic!("no data") };
                    assert!(list.windows(15).any(|w| w == b"trusted.planted"));
                    f.removexattr(e.nodeid, b"trusted.planted").unwrap();
                }
            }
            let _ = f.setxattr(e.nodeid, b"user.planted", b"1", 0);
            let _ = f.getxattr(e.nodeid, b"user.planted", 100);
            let _ = f.listxattr(e.nodeid, 4096);
            let _ = f.access(e.nodeid, 7);
            f.statfs(e.nodeid).unwrap();
            // A hard link to the symlink is another name for the link, not for its target.
            let hl = [b"hl-".as_slice(), name].concat();
            let h = f.link(e.nodeid, ROOT, &hl).unwrap();
            assert_eq!(h.attr.mode & libc::S_IFMT, libc::S_IFLNK);
            assert_eq!(f.open(h.nodeid, libc::O_RDONLY as u32).unwrap_err(), libc::ELOOP);
        }
        // CREATE over a symlink, with or without O_TRUNC/O_EXCL, never opens or creates its
        // target (dangling or not).
        for (name, _) in &links {
            for flags in
                [RDWR, RDWR | libc::O_TRUNC as u32, RDWR | libc::O_EXCL as u32, libc::O_WRONLY as u32]
            {
                let err = f.create(ROOT, name, 0o666, flags).unwrap_err();
                assert!(
                    err == libc::ELOOP || err == libc::EEXIST,
                    "{}: {err}",
                    String::from_utf8_lossy(name)
                );
            }
        }
        assert!(!t.base.path().join("does-not-exist").exists());
    });
}

#[test]
fn a_symlink_swapped_in_after_lookup_is_not_followed() {
    scenario("swap", |f, t, c| {
        // A directory looked up, then replaced on the host by a symlink to the canary directory:
        // the node still is the original directory (its descriptor), wherever it now is.
        std::fs::create_dir(t.host("d")).unwrap();
        std::fs::write(t.host("d/own"), b"own").unwrap();
        let d = f.lookup(ROOT, b"d").unwrap();
        std::fs::rename(t.host("d"), t.host("d.moved")).unwrap();
        symlink(&c.dir, t.host("d")).unwrap();
        let (e, fh) = f.create(d.nodeid, b"new", 0o644, RDWR).map(with_fh).unwrap();
        f.write(e.nodeid, fh, 0, b"lands in the original").unwrap();
        f.release(e.nodeid, fh).unwrap();
        assert_eq!(std::fs::read(t.host("d.moved/new")).unwrap(), b"lands in the original");
        f.mkdir(d.nodeid, b"sub", 0o755).unwrap();
        assert!(t.host("d.moved/sub").is_dir());
        let names = f.list(d.nodeid).unwrap();
        assert!(names.contains(&b"own".to_vec()) && !names.contains(&c.inner_name));
        assert_eq!(f.lookup(d.nodeid, &c.inner_name).unwrap_err(), libc::ENOENT);
        // Looking the name up again finds the symlink, which leads nowhere.
        let l = f.lookup(ROOT, b"d").unwrap();
        assert_eq!(l.attr.mode & libc::S_IFMT, libc::S_IFLNK);
        assert_eq!(f.opendir(l.nodeid).unwrap_err(), libc::ENOTDIR);
        assert_eq!(f.create(l.nodeid, b"x", 0o644, RDWR).unwrap_err(), libc::ENOTDIR);
        assert_eq!(f.lookup(l.nodeid, &c.inner_name).unwrap_err(), libc::ENOTDIR);

        // Likewise a file swapped for a symlink to the canary file between LOOKUP and OPEN.
        std::fs::write(t.host("f"), b"mine").unwrap();
        let file = f.lookup(ROOT, b"f").unwrap();
        std::fs::rename(t.host("f"), t.host("f.moved")).unwrap();
        symlink(&c.file, t.host("f")).unwrap();
        let fh = f.open(file.nodeid, RDWR | libc::O_TRUNC as u32).unwrap();
        f.write(file.nodeid, fh, 0, b"written").unwrap();
        assert_eq!(f.read(file.nodeid, fh, 0, 100).unwrap(), b"written");
        f.release(file.nodeid, fh).unwrap();
        assert_eq!(std::fs::read(t.host("f.moved")).unwrap(), b"written");
        // SETATTR, xattrs and LINK through the stale node also reach the original only.
        f.truncate(file.nodeid, 2).unwrap();
        f.chmod(file.nodeid, 0o600).unwrap();
        assert_eq!(std::fs::metadata(t.host("f.moved")).unwrap().len(), 2);
        let _ = f.setxattr(file.nodeid, b"user.x", b"1", 0);
        f.link(file.nodeid, ROOT, b"f.link").unwrap();
        assert_eq!(
            std::fs::metadata(t.host("f.link")).unwrap().ino(),
            std::fs::metadata(t.host("f.moved")).unwrap().ino()
        );
    });
}

#[test]
fn a_symlink_racing_a_directory_is_never_followed() {
    scenario("race", |f, t, c| {
        let stop = Arc::new(AtomicBool::new(false));
        let share = t.share.clone();
        let target = c.dir.clone();
        let flipper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                // "race" and "race.alt" are a directory and a symlink to the canary directory,
                // exchanged atomically over and over.
                let a =
                    std::ffi::CString::new(share.join("race").into_os_string().into_encoded_bytes()).unwrap();
                let b = std::ffi::CString::new(share.join("race.alt").into_os_string().into_encoded_bytes())
                    .unwrap();
                std::fs::create_dir(share.join("race")).unwrap();
                symlink(&target, share.join("race.alt")).unwrap();
                let mut flips = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: both paths are NUL-terminated strings that outlive the call.
                    let r = unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            a.as_ptr(),
                            libc::AT_FDCWD,
                            b.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    assert_eq!(r, 0, "RENAME_EXCHANGE");
                    flips += 1;
                }
                flips
            })
        };
        let deadline = Instant::now() + Duration::from_millis(1500);
        let (mut dirs, mut links) = (0, 0);
        let mut i = 0u64;
        while Instant::now() < deadline {
            i += 1;
            let Ok(e) = f.lookup(ROOT, b"race") else { continue };
            let name = format!("planted-{i}").into_bytes();
            if e.attr.mode & libc::S_IFMT == libc::S_IFDIR {
                dirs += 1;
            } else {
                links += 1;
            }
            // Whatever the node is, nothing may land in or be read from the canary directory.
            if let Ok((ce, o)) = f.create(e.nodeid, &name, 0o666, RDWR) {
                let _ = f.release(ce.nodeid, o.fh);
            }
            let _ = f.mkdir(e.nodeid, &name, 0o777);
            let _ = f.symlink(e.nodeid, &[b"s-".as_slice(), &name].concat(), b"x");
            let _ = f.lookup(e.nodeid, &c.inner_name);
            if let Ok(fh) = f.opendir(e.nodeid) {
                let _ = f.readdir(e.nodeid, fh, 0, 4096);
                let _ = f.readdirplus(e.nodeid, fh, 0, 4096);
                let _ = f.releasedir(e.nodeid, fh);
            }
            let _ = f.open(e.nodeid, libc::O_RDONLY as u32);
            let _ = f.unlink(e.nodeid, &c.inner_name);
            f.forget(e.nodeid, 1);
        }
        stop.store(true, Ordering::Relaxed);
        let flips = flipper.join().unwrap();
        eprintln!("race: {i} rounds, {dirs} as directory, {links} as symlink, {flips} flips");
        assert!(flips > 10 && dirs > 0 && links > 0, "the race happened: {dirs} dirs, {links} links");
    });
}

#[test]
fn hard_links_and_renames_cannot_reach_outside() {
    scenario("link-rename", |f, t, c| {
        std::fs::write(t.host("f"), b"in").unwrap();
        std::fs::create_dir(t.host("d")).unwrap();
        symlink(&c.dir, t.host("to_canary_dir")).unwrap();
        symlink("..", t.host("up")).unwrap();
        let file = f.lookup(ROOT, b"f").unwrap();
        let link = f.lookup(ROOT, b"to_canary_dir").unwrap();
        let up = f.lookup(ROOT, b"up").unwrap();
        // Node ids the guest never received.
        for bogus in [0, 2, 999_999, u64::MAX] {
            if bogus == file.nodeid || bogus == link.nodeid || bogus == up.nodeid {
                continue;
            }
            assert_eq!(f.link(file.nodeid, bogus, b"x").unwrap_err(), libc::ENOENT);
            assert_eq!(f.link(bogus, ROOT, b"x").unwrap_err(), libc::ENOENT);
            assert_eq!(f.rename(ROOT, b"f", bogus, b"x").unwrap_err(), libc::ENOENT);
            assert_eq!(f.rename(bogus, b"canary.txt", ROOT, b"x").unwrap_err(), libc::ENOENT);
        }
        // Into a symlink to a directory outside: not a directory here.
        for l in [link.nodeid, up.nodeid] {
            assert_eq!(f.link(file.nodeid, l, b"x").unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.rename(ROOT, b"f", l, b"x").unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.rename(l, &c.inner_name, ROOT, b"stolen").unwrap_err(), libc::ENOTDIR);
            assert_eq!(
                f.rename2(ROOT, b"f", l, &c.inner_name, libc::RENAME_EXCHANGE).unwrap_err(),
                libc::ENOTDIR
            );
        }
        // Renaming the link itself moves the link, not what it points to.
        let d = f.lookup(ROOT, b"d").unwrap();
        f.rename(ROOT, b"to_canary_dir", d.nodeid, b"moved").unwrap();
        assert!(std::fs::symlink_metadata(t.host("d/moved")).unwrap().file_type().is_symlink());
        // Exchanging the root's own name is impossible: it has none here.
        assert_eq!(f.rename(ROOT, b"..", ROOT, b"x").unwrap_err(), libc::EINVAL);
        assert!(t.host("f").is_file());
    });
}

#[test]
fn forged_handles_and_nodes_are_refused() {
    scenario("forged", |f, t, _c| {
        std::fs::write(t.host("a"), b"aaaa").unwrap();
        std::fs::write(t.host("b"), b"bbbb").unwrap();
        let a = f.lookup(ROOT, b"a").unwrap();
        let b = f.lookup(ROOT, b"b").unwrap();
        let fa = f.open(a.nodeid, libc::O_RDONLY as u32).unwrap();
        assert_eq!(f.read(b.nodeid, fa, 0, 4).unwrap_err(), libc::EBADF, "handle of another node");
        assert_eq!(f.read(a.nodeid, fa + 1000, 0, 4).unwrap_err(), libc::EBADF);
        assert_eq!(f.write(a.nodeid, fa, 0, b"x").unwrap_err(), libc::EBADF, "read-only handle");
        let dh = f.opendir(ROOT).unwrap();
        assert_eq!(f.read(ROOT, dh, 0, 4).unwrap_err(), libc::EISDIR);
        assert!(f.readdir(a.nodeid, fa, 0, 4096).is_err());
        assert!(f.release(b.nodeid, fa).is_err());
        for bogus in [0u64, 3, 777, u64::MAX] {
            if [a.nodeid, b.nodeid].contains(&bogus) {
                continue;
            }
            assert_eq!(f.getattr(bogus).unwrap_err(), libc::ENOENT);
            assert_eq!(f.lookup(bogus, b"canary.txt").unwrap_err(), libc::ENOENT);
            assert_eq!(f.open(bogus, 0).unwrap_err(), libc::ENOENT);
            assert_eq!(f.opendir(bogus).unwrap_err(), libc::ENOENT);
            assert_eq!(f.readlink(bogus).unwrap_err(), libc::ENOENT);
            f.forget(bogus, 1);
        }
        // Over-forgetting clamps; the root is never forgotten.
        f.forget(ROOT, u64::MAX);
        f.forget(a.nodeid, u64::MAX);
        assert!(f.getattr(ROOT).is_ok());
        assert_eq!(f.read(a.nodeid, fa, 0, 4).unwrap(), b"aaaa", "an open handle keeps its node");
        // Crafted open flags are reduced to access mode and data flags.
        let weird = libc::O_RDONLY
            | libc::O_DIRECTORY
            | libc::O_PATH
            | libc::O_CREAT
            | libc::O_NOFOLLOW
            | libc::O_TMPFILE;
        let fh = f.open(b.nodeid, weird as u32).unwrap();
        assert_eq!(f.read(b.nodeid, fh, 0, 4).unwrap(), b"bbbb");
        assert_eq!(f.open(b.nodeid, 3).unwrap_err(), libc::EINVAL);
    });
}

#[test]
fn special_files_are_never_opened() {
    scenario("special", |f, _t, _c| {
        let fifo = f.mknod(ROOT, b"fifo", libc::S_IFIFO | 0o666, 0).unwrap();
        let sock = f.mknod(ROOT, b"sock", libc::S_IFSOCK | 0o666, 0).unwrap();
        let mut nodes = vec![fifo.nodeid, sock.nodeid];
        if is_root() {
            // /dev/mem and /dev/null numbers: the device is the guest's, never opened here.
            nodes.push(f.mknod(ROOT, b"mem", libc::S_IFCHR | 0o666, 0x101).unwrap().nodeid);
            nodes.push(f.mknod(ROOT, b"null", libc::S_IFCHR | 0o666, 0x103).unwrap().nodeid);
            nodes.push(f.mknod(ROOT, b"blk", libc::S_IFBLK | 0o666, 0x800).unwrap().nodeid);
        }
        let t0 = Instant::now();
        for n in nodes {
            for flags in [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR] {
                assert_eq!(f.open(n, flags as u32).unwrap_err(), libc::ENXIO);
            }
            assert_eq!(f.opendir(n).unwrap_err(), libc::ENOTDIR);
            assert_eq!(f.truncate(n, 0).unwrap_err(), libc::EINVAL);
            f.getattr(n).unwrap();
            let _ = f.listxattr(n, 100);
            let _ = f.getxattr(n, b"user.x", 100);
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "nothing blocked");
    });
}

#[test]
fn setxattr_and_setattr_through_crafted_requests_stay_inside() {
    scenario("attrs", |f, t, c| {
        symlink(&c.file, t.host("l")).unwrap();
        let l = f.lookup(ROOT, b"l").unwrap();
        // SETATTR with FH of a file handle belonging to another node is refused.
        std::fs::write(t.host("f"), b"ff").unwrap();
        let file = f.lookup(ROOT, b"f").unwrap();
        let fh = f.open(file.nodeid, RDWR).unwrap();
        assert_eq!(f.ftruncate(l.nodeid, 0, fh).unwrap_err(), libc::EBADF);
        let arg =
            abi::SetattrIn { valid: abi::fattr::SIZE | abi::fattr::FH, fh, size: 0, ..Default::default() };
        assert_eq!(f.call(opcode::SETATTR, l.nodeid, &[arg.as_slice()]).result().unwrap_err(), libc::EBADF);
        f.release(file.nodeid, fh).unwrap();
        // A handle-less FALLOCATE/COPY on the symlink is refused for want of a handle.
        let fa = abi::FallocateIn { fh: 12345, offset: 0, length: 10, mode: 0, padding: 0 };
        assert_eq!(f.call(opcode::FALLOCATE, l.nodeid, &[fa.as_slice()]).result().unwrap_err(), libc::EBADF);
    });
}

#[test]
fn the_canary_notices_access() {
    // The checks above are only as good as the canary: make sure it sees reads, listings,
    // creations and inode numbers in replies.
    type Poke = fn(&Tree, &Canary);
    let cases: [(&str, Poke); 4] = [
        ("read", |_, c| drop(std::fs::read(&c.file).unwrap())),
        ("list", |_, c| std::fs::read_dir(&c.dir).unwrap().for_each(drop)),
        ("create", |_, c| std::fs::write(c.dir.join("new"), b"x").unwrap()),
        ("stat-through-symlink", |t, c| symlink(&c.file, t.host("l")).unwrap()),
    ];
    for (what, poke) in cases {
        let t = Tree::new();
        let c = Canary::new(&t);
        let f = Fuse::new(&t.share);
        poke(&t, &c);
        if what == "stat-through-symlink" {
            // Pretend a reply showed the target's attributes.
            let ino = std::fs::metadata(&c.file).unwrap().ino();
            f.seen_inos.borrow_mut().push(ino);
        }
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.check(&f, what)));
        assert!(caught.is_err(), "the canary missed a {what}");
    }
}
