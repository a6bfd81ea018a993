//! The passthrough filesystem through the FUSE server: the operations, checked against what the
//! host directory shows, with the caller's identity in force.

mod harness;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use harness::passthrough::{is_root, Fuse, Tree};
use harness::{groups_ext, with_fh, xorshift, Xattr, ROOT};
use virtiofs_backend::abi;
use virtiofs_backend::passthrough::keep::{DescriptorKeeper, HeldItem};

const RDWR: u32 = libc::O_RDWR as u32;

#[test]
fn files_and_directories_show_on_the_host() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let d = f.mkdir(ROOT, b"dir", 0o755).unwrap();
    assert_eq!(d.attr.mode & libc::S_IFMT, libc::S_IFDIR);
    assert!(t.host("dir").is_dir());
    let (e, fh) = f.create(d.nodeid, b"file", 0o644, RDWR).map(with_fh).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    assert_eq!(f.write(e.nodeid, fh, 0, &data).unwrap() as usize, data.len());
    assert_eq!(std::fs::read(t.host("dir/file")).unwrap(), data);
    assert_eq!(f.read(e.nodeid, fh, 1000, 5000).unwrap(), &data[1000..6000]);
    // At the end a read is short, past it empty.
    assert_eq!(f.read(e.nodeid, fh, 299_000, 4096).unwrap(), &data[299_000..]);
    assert!(f.read(e.nodeid, fh, 400_000, 4096).unwrap().is_empty());
    let a = f.getattr(e.nodeid).unwrap();
    assert_eq!(a.size, data.len() as u64);
    let host = std::fs::metadata(t.host("dir/file")).unwrap();
    assert_eq!(a.ino, host.ino(), "attributes carry the host inode number");
    assert_eq!(e.attr.ino, host.ino());
    f.flush(e.nodeid, fh).unwrap();
    f.fsync(e.nodeid, fh, false).unwrap();
    f.release(e.nodeid, fh).unwrap();
    assert_eq!(f.release(e.nodeid, fh), Err(libc::EBADF), "a released handle is gone");

    let names = f.list(d.nodeid).unwrap();
    assert_eq!(names, vec![b".".to_vec(), b"..".to_vec(), b"file".to_vec()]);
    f.rename(d.nodeid, b"file", ROOT, b"moved").unwrap();
    assert!(t.host("moved").is_file() && !t.host("dir/file").exists());
    let again = f.lookup(ROOT, b"moved").unwrap();
    assert_eq!(again.nodeid, e.nodeid, "the same inode keeps its node id");
    f.unlink(ROOT, b"moved").unwrap();
    assert_eq!(f.lookup(ROOT, b"moved").unwrap_err(), libc::ENOENT);
    assert_eq!(f.rmdir(ROOT, b"nope").unwrap_err(), libc::ENOENT);
    f.rmdir(ROOT, b"dir").unwrap();
    assert!(!t.host("dir").exists());
    let st = f.statfs(ROOT).unwrap();
    assert!(st.bsize > 0 && st.namelen >= 255, "{st:?}");
}

#[test]
fn host_files_are_served_with_stable_inode_numbers() {
    let t = Tree::new();
    std::fs::create_dir_all(t.host("a/b")).unwrap();
    std::fs::write(t.host("a/b/c"), b"hello").unwrap();
    let f = Fuse::new(&t.share);
    let a = f.lookup(ROOT, b"a").unwrap();
    let b = f.lookup(a.nodeid, b"b").unwrap();
    let c = f.lookup(b.nodeid, b"c").unwrap();
    assert_eq!(c.attr.ino, std::fs::metadata(t.host("a/b/c")).unwrap().ino());
    assert_eq!(c.attr.size, 5);
    // A second lookup is the same node with one more reference; forgetting both drops it.
    assert_eq!(f.lookup(b.nodeid, b"c").unwrap().nodeid, c.nodeid);
    assert_eq!(f.fs().lookup_count(c.nodeid), Some(2));
    let before = f.fs().node_count();
    f.forget(c.nodeid, 2);
    assert_eq!(f.fs().lookup_count(c.nodeid), None);
    assert_eq!(f.fs().node_count(), before - 1);
    assert_eq!(f.getattr(c.nodeid).unwrap_err(), libc::ENOENT, "a forgotten node is gone");
    let c2 = f.lookup(b.nodeid, b"c").unwrap();
    assert_eq!(c2.attr.ino, c.attr.ino, "the inode number is the host's, whatever the node id");
    // BATCH_FORGET.
    let mut arg = abi::BatchForgetIn { count: 2, dummy: 0 }.as_slice().to_vec();
    use vm_memory::ByteValued;
    arg.extend_from_slice(abi::ForgetOne { nodeid: c2.nodeid, nlookup: 1 }.as_slice());
    arg.extend_from_slice(abi::ForgetOne { nodeid: b.nodeid, nlookup: 1 }.as_slice());
    assert_eq!(f.call(abi::opcode::BATCH_FORGET, 0, &[&arg]).n, 0);
    assert_eq!(f.fs().lookup_count(c2.nodeid), None);
    // `b` is gone from the table, but `a` is still known.
    assert_eq!(f.fs().lookup_count(a.nodeid), Some(1));
}

#[test]
fn open_files_survive_rename_and_unlink() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let (e, fh) = f.create(ROOT, b"f", 0o600, RDWR).map(with_fh).unwrap();
    f.write(e.nodeid, fh, 0, b"still here").unwrap();
    std::fs::rename(t.host("f"), t.host("g")).unwrap();
    assert_eq!(f.read(e.nodeid, fh, 0, 100).unwrap(), b"still here");
    f.unlink(ROOT, b"g").unwrap();
    assert_eq!(f.read(e.nodeid, fh, 0, 100).unwrap(), b"still here");
    f.write(e.nodeid, fh, 10, b"!").unwrap();
    assert_eq!(f.getattr(e.nodeid).unwrap().nlink, 0);
    assert_eq!(f.getattr(e.nodeid).unwrap().size, 11);
    // A node without an open handle survives too: it is a descriptor.
    let fh2 = f.open(e.nodeid, libc::O_RDONLY as u32).unwrap();
    assert_eq!(f.read(e.nodeid, fh2, 0, 100).unwrap(), b"still here!");
    f.release(e.nodeid, fh).unwrap();
    f.release(e.nodeid, fh2).unwrap();
}

#[test]
fn setattr_changes_the_host_file() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let (e, fh) = f.create(ROOT, b"f", 0o644, RDWR).map(with_fh).unwrap();
    f.write(e.nodeid, fh, 0, &[7u8; 10000]).unwrap();
    let a = f.chmod(e.nodeid, 0o640).unwrap();
    assert_eq!(a.mode & 0o7777, 0o640);
    assert_eq!(std::fs::metadata(t.host("f")).unwrap().permissions().mode() & 0o7777, 0o640);
    assert_eq!(f.truncate(e.nodeid, 100).unwrap().size, 100);
    assert_eq!(f.ftruncate(e.nodeid, 50, fh).unwrap().size, 50);
    assert_eq!(std::fs::metadata(t.host("f")).unwrap().len(), 50);
    let valid = abi::fattr::ATIME | abi::fattr::MTIME;
    let a = f
        .setattr(
            e.nodeid,
            abi::SetattrIn {
                valid,
                atime: 1000,
                atimensec: 5,
                mtime: 2000,
                mtimensec: 7,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.atime, a.atimensec, a.mtime, a.mtimensec), (1000, 5, 2000, 7));
    let m = std::fs::metadata(t.host("f")).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (2000, 7));
    let now = abi::fattr::MTIME | abi::fattr::MTIME_NOW;
    let a = f.setattr(e.nodeid, abi::SetattrIn { valid: now, ..Default::default() }).unwrap();
    assert!(a.mtime > 2000);
    if is_root() {
        let a = f.chown(e.nodeid, Some(1234), Some(5678)).unwrap();
        assert_eq!((a.uid, a.gid), (1234, 5678));
        let m = std::fs::metadata(t.host("f")).unwrap();
        assert_eq!((m.uid(), m.gid()), (1234, 5678));
    }
    // A directory cannot be truncated; a symlink has no mode of its own.
    let d = f.mkdir(ROOT, b"d", 0o755).unwrap();
    assert_eq!(f.truncate(d.nodeid, 0).unwrap_err(), libc::EISDIR);
    let l = f.symlink(ROOT, b"l", b"f").unwrap();
    assert_eq!(f.chmod(l.nodeid, 0o600).unwrap_err(), libc::EOPNOTSUPP);
    f.release(e.nodeid, fh).unwrap();
}

#[test]
fn symlinks_hard_links_and_special_files() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let l = f.symlink(ROOT, b"l", b"some/where/../else").unwrap();
    assert_eq!(l.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(f.readlink(l.nodeid).unwrap(), b"some/where/../else");
    assert_eq!(std::fs::read_link(t.host("l")).unwrap().as_os_str(), "some/where/../else");
    let (e, fh) = f.create(ROOT, b"f", 0o644, RDWR).map(with_fh).unwrap();
    f.release(e.nodeid, fh).unwrap();
    let h = f.link(e.nodeid, ROOT, b"h").unwrap();
    assert_eq!(h.nodeid, e.nodeid);
    assert_eq!(h.attr.nlink, 2);
    assert_eq!(std::fs::metadata(t.host("h")).unwrap().ino(), std::fs::metadata(t.host("f")).unwrap().ino());
    // A hard link to a symlink links the symlink.
    f.link(l.nodeid, ROOT, b"l2").unwrap();
    assert_eq!(std::fs::read_link(t.host("l2")).unwrap().as_os_str(), "some/where/../else");
    let d = f.mkdir(ROOT, b"d", 0o755).unwrap();
    assert_eq!(f.link(d.nodeid, ROOT, b"d2").unwrap_err(), libc::EPERM);
    let fifo = f.mknod(ROOT, b"fifo", libc::S_IFIFO | 0o644, 0).unwrap();
    assert_eq!(fifo.attr.mode & libc::S_IFMT, libc::S_IFIFO);
    assert_eq!(f.readlink(fifo.nodeid).unwrap_err(), libc::EINVAL);
    let reg = f.mknod(ROOT, b"reg", libc::S_IFREG | 0o600, 0).unwrap();
    assert_eq!(reg.attr.mode, libc::S_IFREG | 0o600);
    if is_root() {
        let dev = f.mknod(ROOT, b"null", libc::S_IFCHR | 0o666, 0x103).unwrap();
        assert_eq!(dev.attr.rdev, 0x103);
        let m = std::fs::symlink_metadata(t.host("null")).unwrap();
        assert_eq!(m.rdev(), libc::makedev(1, 3));
    }
}

#[test]
fn rename_flags() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    std::fs::write(t.host("a"), b"a").unwrap();
    std::fs::write(t.host("b"), b"b").unwrap();
    assert_eq!(f.rename2(ROOT, b"a", ROOT, b"b", libc::RENAME_NOREPLACE).unwrap_err(), libc::EEXIST);
    f.rename2(ROOT, b"a", ROOT, b"b", libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(std::fs::read(t.host("a")).unwrap(), b"b");
    assert_eq!(std::fs::read(t.host("b")).unwrap(), b"a");
}

#[test]
fn directory_listing_pages_and_plus_takes_references() {
    let t = Tree::new();
    for i in 0..50 {
        std::fs::write(t.host(&format!("file-{i:02}")), b"x").unwrap();
    }
    let f = Fuse::new(&t.share);
    let names = f.list(ROOT).unwrap();
    assert_eq!(names.len(), 52);
    let fh = f.opendir(ROOT).unwrap();
    let page = f.readdirplus(ROOT, fh, 0, 4096).unwrap();
    assert!(page.len() > 3 && page.len() < 52, "a page is bounded by the buffer: {}", page.len());
    for (entry, _, name) in &page {
        if name == b"." || name == b".." {
            assert_eq!(entry.nodeid, 0);
        } else {
            assert_eq!(f.fs().lookup_count(entry.nodeid), Some(1), "{name:?}");
            assert_eq!(entry.attr.size, 1);
        }
    }
    // The rest, from the last offset: no entry twice.
    let mut all: Vec<Vec<u8>> = page.iter().map(|p| p.2.clone()).collect();
    let mut off = page.last().unwrap().1;
    loop {
        let more = f.readdirplus(ROOT, fh, off, 4096).unwrap();
        let Some(last) = more.last() else { break };
        off = last.1;
        all.extend(more.into_iter().map(|p| p.2));
    }
    all.sort();
    assert_eq!(all, names);
    // The root's `..` shows the root's own inode number.
    let root_ino = std::fs::metadata(&t.share).unwrap().ino();
    let first = f.readdir(ROOT, fh, 0, 4096).unwrap();
    let dotdot = first.iter().find(|e| e.3 == b"..").unwrap();
    assert_eq!(dotdot.0, root_ino);
    f.releasedir(ROOT, fh).unwrap();
}

#[test]
fn xattrs() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let (e, fh) = f.create(ROOT, b"f", 0o644, RDWR).map(with_fh).unwrap();
    f.release(e.nodeid, fh).unwrap();
    match f.setxattr(e.nodeid, b"user.test", b"value", 0) {
        Err(libc::EOPNOTSUPP) => return, // the host filesystem has no user xattrs
        r => r.unwrap(),
    }
    assert_eq!(f.getxattr(e.nodeid, b"user.test", 0).unwrap(), Xattr::Size(5));
    assert_eq!(f.getxattr(e.nodeid, b"user.test", 100).unwrap(), Xattr::Data(b"value".to_vec()));
    assert_eq!(f.getxattr(e.nodeid, b"user.test", 2).unwrap_err(), libc::ERANGE);
    assert_eq!(f.getxattr(e.nodeid, b"user.nope", 100).unwrap_err(), libc::ENODATA);
    assert_eq!(
        f.setxattr(e.nodeid, b"user.test", b"v", libc::XATTR_CREATE as u32).unwrap_err(),
        libc::EEXIST
    );
    let Xattr::Data(list) = f.listxattr(e.nodeid, 1000).unwrap() else { panic!("no data") };
    assert!(list.windows(10).any(|w| w == b"user.test\0"), "{list:?}");
    f.removexattr(e.nodeid, b"user.test").unwrap();
    assert_eq!(f.getxattr(e.nodeid, b"user.test", 100).unwrap_err(), libc::ENODATA);
}

#[test]
fn fallocate_lseek_and_copy_file_range() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let (e, fh) = f.create(ROOT, b"f", 0o644, RDWR).map(with_fh).unwrap();
    f.write(e.nodeid, fh, 0, &vec![1u8; 1 << 20]).unwrap();
    let mode = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32;
    let arg = abi::FallocateIn { fh, offset: 256 << 10, length: 256 << 10, mode, padding: 0 };
    use vm_memory::ByteValued;
    f.call(abi::opcode::FALLOCATE, e.nodeid, &[arg.as_slice()]).result().unwrap();
    assert_eq!(f.read(e.nodeid, fh, 256 << 10, 16).unwrap(), vec![0u8; 16]);
    assert_eq!(f.getattr(e.nodeid).unwrap().size, 1 << 20);
    let seek = |off: u64, whence: i32| -> Result<u64, i32> {
        let arg = abi::LseekIn { fh, offset: off, whence: whence as u32, padding: 0 };
        let body = f.call(abi::opcode::LSEEK, e.nodeid, &[arg.as_slice()]).result()?;
        Ok(harness::parse::<abi::LseekOut>(&body).offset)
    };
    // Filesystems that report holes put one at the punched range.
    let hole = seek(0, libc::SEEK_HOLE).unwrap();
    assert!(hole == 256 << 10 || hole == 1 << 20, "hole at {hole}");
    if hole == 256 << 10 {
        assert_eq!(seek(hole, libc::SEEK_DATA).unwrap(), 512 << 10);
    }
    assert_eq!(seek(2 << 20, libc::SEEK_DATA).unwrap_err(), libc::ENXIO);
    let (e2, fh2) = f.create(ROOT, b"g", 0o644, RDWR).map(with_fh).unwrap();
    let arg = abi::CopyFileRangeIn {
        fh_in: fh,
        off_in: 0,
        nodeid_out: e2.nodeid,
        fh_out: fh2,
        off_out: 10,
        len: 4096,
        flags: 0,
    };
    let body = f.call(abi::opcode::COPY_FILE_RANGE, e.nodeid, &[arg.as_slice()]).result().unwrap();
    assert_eq!(harness::parse::<abi::WriteOut>(&body).size, 4096);
    assert_eq!(std::fs::metadata(t.host("g")).unwrap().len(), 4106);
    let sync = abi::SyncfsIn::default();
    f.call(abi::opcode::SYNCFS, ROOT, &[sync.as_slice()]).result().unwrap();
    let dfh = f.opendir(ROOT).unwrap();
    f.fsync(ROOT, dfh, true).unwrap();
    f.releasedir(ROOT, dfh).unwrap();
}

#[test]
fn tmpfile_then_link() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let (e, fh) = match f.tmpfile(ROOT, 0o600, RDWR, 0).map(with_fh) {
        Err(libc::EOPNOTSUPP) => return, // host filesystem without O_TMPFILE
        r => r.unwrap(),
    };
    assert_eq!(e.attr.nlink, 0);
    f.write(e.nodeid, fh, 0, b"tmp").unwrap();
    assert_eq!(f.list(ROOT).unwrap().len(), 2, "an unnamed file");
    f.link(e.nodeid, ROOT, b"named").unwrap();
    assert_eq!(std::fs::read(t.host("named")).unwrap(), b"tmp");
    f.release(e.nodeid, fh).unwrap();
}

#[test]
fn umask_applies_with_dont_mask() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let d = f.mkdir_umask(ROOT, b"d", 0o777, 0o027).unwrap();
    assert_eq!(d.attr.mode & 0o777, 0o750);
    // Without DONT_MASK the guest applied it already: the host applies none.
    let g = Fuse::uninit(&t.share);
    g.init(41, harness::LINUX_FLAGS & !abi::init::DONT_MASK).unwrap();
    let d = g.mkdir_umask(ROOT, b"e", 0o777, 0o027).unwrap();
    assert_eq!(d.attr.mode & 0o777, 0o777);
}

#[test]
fn dot_dot_is_the_tracked_parent_and_stops_at_the_root() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let a = f.mkdir(ROOT, b"a", 0o755).unwrap();
    let b = f.mkdir(a.nodeid, b"b", 0o755).unwrap();
    assert_eq!(f.lookup(b.nodeid, b"..").unwrap().nodeid, a.nodeid);
    assert_eq!(f.lookup(a.nodeid, b"..").unwrap().nodeid, ROOT);
    assert_eq!(f.lookup(ROOT, b"..").unwrap().nodeid, ROOT);
    // A directory moved elsewhere has its new parent as `..`.
    let c = f.mkdir(ROOT, b"c", 0o755).unwrap();
    f.rename(a.nodeid, b"b", c.nodeid, b"b").unwrap();
    assert_eq!(f.lookup(b.nodeid, b"..").unwrap().nodeid, c.nodeid);
    // Even once the parent is forgotten by the kernel.
    let refs = f.fs().lookup_count(c.nodeid).unwrap();
    f.forget(c.nodeid, refs);
    let up = f.lookup(b.nodeid, b"..").unwrap();
    assert_eq!(up.attr.ino, std::fs::metadata(t.host("c")).unwrap().ino());
    assert_eq!(f.lookup(ROOT, b".").unwrap_err(), libc::EINVAL);
    let (e, fh) = f.create(ROOT, b"file", 0o644, RDWR).map(with_fh).unwrap();
    f.release(e.nodeid, fh).unwrap();
    assert_eq!(f.lookup(e.nodeid, b"..").unwrap_err(), libc::ENOTDIR);
}

#[test]
fn destroy_forgets_every_node_and_handle() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let d = f.mkdir(ROOT, b"d", 0o755).unwrap();
    let (e, _fh) = f.create(d.nodeid, b"f", 0o644, RDWR).map(with_fh).unwrap();
    let _dh = f.opendir(d.nodeid).unwrap();
    assert_eq!(f.fs().handle_count(), 2);
    f.call(abi::opcode::DESTROY, 0, &[]).result().unwrap();
    assert_eq!(f.fs().handle_count(), 0);
    assert_eq!(f.fs().node_count(), 1);
    f.init(41, harness::LINUX_FLAGS).unwrap();
    assert_eq!(f.getattr(e.nodeid).unwrap_err(), libc::ENOENT);
    assert!(f.getattr(ROOT).is_ok());
}

#[test]
fn requests_run_with_the_callers_identity() {
    if !is_root() {
        return;
    }
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    // Root creates a private directory and a private file.
    let priv_dir = f.mkdir(ROOT, b"private", 0o700).unwrap();
    let (secret, fh) = f.create(ROOT, b"secret", 0o600, RDWR).map(with_fh).unwrap();
    f.write(secret.nodeid, fh, 0, b"root only").unwrap();
    f.release(secret.nodeid, fh).unwrap();

    let u = f.as_user(1000, 1000);
    // New files belong to the caller.
    let (mine, fh) = u.create(ROOT, b"mine", 0o644, RDWR).map(with_fh).unwrap();
    assert_eq!((mine.attr.uid, mine.attr.gid), (1000, 1000));
    let m = std::fs::metadata(t.host("mine")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1000, 1000));
    u.release(mine.nodeid, fh).unwrap();
    let d = u.mkdir(ROOT, b"mydir", 0o755).unwrap();
    assert_eq!(d.attr.uid, 1000);
    // What an owner may do to its own file goes through /proc/self/fd under its ids.
    u.truncate(mine.nodeid, 10).unwrap();
    u.chmod(mine.nodeid, 0o600).unwrap();
    let now = abi::fattr::MTIME | abi::fattr::MTIME_NOW;
    u.setattr(mine.nodeid, abi::SetattrIn { valid: now, ..Default::default() }).unwrap();
    if u.setxattr(mine.nodeid, b"user.mine", b"1", 0).is_ok() {
        assert_eq!(u.getxattr(mine.nodeid, b"user.mine", 10).unwrap(), Xattr::Data(b"1".to_vec()));
    }
    u.link(mine.nodeid, ROOT, b"mine2").unwrap();
    assert_eq!(std::fs::metadata(t.host("mine")).unwrap().len(), 10);
    // The host kernel denies what the permission bits deny.
    assert_eq!(u.open(secret.nodeid, libc::O_RDONLY as u32).unwrap_err(), libc::EACCES);
    assert_eq!(u.lookup(priv_dir.nodeid, b"x").unwrap_err(), libc::EACCES);
    assert_eq!(u.mkdir(priv_dir.nodeid, b"x", 0o755).unwrap_err(), libc::EACCES);
    assert_eq!(u.opendir(priv_dir.nodeid).unwrap_err(), libc::EACCES);
    assert_eq!(u.chmod(secret.nodeid, 0o666).unwrap_err(), libc::EPERM);
    assert_eq!(u.chown(mine.nodeid, Some(0), Some(0)).unwrap_err(), libc::EPERM);
    assert_eq!(u.truncate(secret.nodeid, 0).unwrap_err(), libc::EACCES);
    assert_eq!(u.unlink(priv_dir.nodeid, b"x").unwrap_err(), libc::EACCES);
    let sticky = f.as_user(0, 0).mkdir(ROOT, b"tmp", 0o1777).unwrap();
    let (rootfile, fh) = f.create(sticky.nodeid, b"rootfile", 0o666, RDWR).map(with_fh).unwrap();
    f.release(rootfile.nodeid, fh).unwrap();
    let u = f.as_user(1000, 1000);
    assert_eq!(u.unlink(sticky.nodeid, b"rootfile").unwrap_err(), libc::EPERM, "sticky directory");
    assert_eq!(u.access(secret.nodeid, 4).unwrap_err(), libc::EACCES);
    u.access(mine.nodeid, 6).unwrap();
    // Root's supplementary groups do not leak to other users.
    let g0 = f.as_user(0, 0).mkdir(ROOT, b"group0", 0o770).unwrap();
    assert_eq!(f.as_user(1000, 1000).lookup(g0.nodeid, b"x").unwrap_err(), libc::EACCES);
    assert_eq!(f.as_user(1000, 0).lookup(g0.nodeid, b"x").unwrap_err(), libc::ENOENT, "fsgid 0 is in");
    // A write by another user clears set-user-id (the host does it under the writer's ids).
    let (suid, fh) = f.as_user(1000, 1000).create(ROOT, b"suid", 0o666, RDWR).map(with_fh).unwrap();
    f.as_user(1000, 1000).chmod(suid.nodeid, 0o4777).unwrap();
    f.as_user(2000, 2000).write_flags(suid.nodeid, fh, 0, b"x", abi::write_flags::KILL_SUIDGID).unwrap();
    assert_eq!(std::fs::metadata(t.host("suid")).unwrap().mode() & 0o7777, 0o777);
    // ... and the serving thread is root again afterwards.
    f.as_user(0, 0).chmod(secret.nodeid, 0o640).unwrap();
}

/// `FUSE_EXT_GROUPS`: a creation in a directory the caller may write only through a supplementary
/// group succeeds on the host with that group, and only for that request.
#[test]
fn creations_run_with_the_supplementary_group_they_carry() {
    use vm_memory::ByteValued;
    if !is_root() {
        return;
    }
    const TEAM: u32 = 4242;
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let team = f.mkdir(ROOT, b"team", 0o775).unwrap().nodeid;
    f.chown(team, Some(u32::MAX), Some(TEAM)).unwrap();
    let u = f.as_user(1000, 1000);
    let g = groups_ext(&[TEAM]);
    assert_eq!(u.mkdir(team, b"d", 0o755).unwrap_err(), libc::EACCES, "the host refuses without the group");
    let mkdir = abi::MkdirIn { mode: 0o755, umask: 0 };
    let d = u.call_with_ext(abi::opcode::MKDIR, team, &[mkdir.as_slice(), b"d\0"], &g).result().unwrap();
    let d: abi::EntryOut = harness::parse(&d);
    let m = std::fs::metadata(t.host("team/d")).unwrap();
    assert_eq!((m.uid(), m.gid(), d.attr.gid), (1000, 1000, 1000));
    let create = abi::CreateIn { flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, open_flags: 0 };
    u.call_with_ext(abi::opcode::CREATE, team, &[create.as_slice(), b"f\0"], &g).result().unwrap();
    u.call_with_ext(abi::opcode::TMPFILE, team, &[create.as_slice(), b"/\0"], &g).result().unwrap();
    let mknod = abi::MknodIn { mode: libc::S_IFIFO | 0o644, rdev: 0, umask: 0, padding: 0 };
    u.call_with_ext(abi::opcode::MKNOD, team, &[mknod.as_slice(), b"p\0"], &g).result().unwrap();
    u.call_with_ext(abi::opcode::SYMLINK, team, &[b"l\0", b"target\0"], &g).result().unwrap();
    assert_eq!(std::fs::metadata(t.host("team/f")).unwrap().uid(), 1000);
    // This thread served the requests: its supplementary groups are empty again.
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let groups = status.lines().find_map(|l| l.strip_prefix("Groups:")).unwrap().trim().to_string();
    assert_eq!(groups, "", "the group lasted beyond its request");
    assert_eq!(u.mkdir(team, b"e", 0o755).unwrap_err(), libc::EACCES);
    // Another group grants nothing.
    let r = u.call_with_ext(abi::opcode::MKDIR, team, &[mkdir.as_slice(), b"x\0"], &groups_ext(&[5555]));
    assert_eq!(r.result().unwrap_err(), libc::EACCES);
}

/// Issue 11, "CREATE over a FIFO / device node": a CREATE without O_EXCL naming an existing
/// FIFO, device node or socket used to open it (a FIFO's open waits for a writer, blocking the
/// poller for ever; a device's open has side effects). They are refused unopened with ENXIO; a
/// regular file is still opened (and truncated when asked), a directory is EISDIR, a symlink ELOOP.
#[test]
fn create_over_an_existing_special_file_opens_nothing() {
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    f.mknod(ROOT, b"fifo", libc::S_IFIFO | 0o666, 0).unwrap();
    let sock = std::os::unix::net::UnixListener::bind(t.host("sock")).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = f.create(ROOT, b"fifo", 0o666, RDWR).map(|_| ());
        let r2 = f.create(ROOT, b"fifo", 0o666, libc::O_WRONLY as u32).map(|_| ());
        let _ = tx.send((f, r, r2));
    });
    let (f, r, r2) =
        rx.recv_timeout(std::time::Duration::from_secs(5)).expect("CREATE over a FIFO returns at once");
    assert_eq!(r.unwrap_err(), libc::ENXIO);
    assert_eq!(r2.unwrap_err(), libc::ENXIO);
    assert_eq!(f.create(ROOT, b"sock", 0o666, RDWR).map(|_| ()).unwrap_err(), libc::ENXIO);
    drop(sock);
    if is_root() {
        f.mknod(ROOT, b"null", libc::S_IFCHR | 0o666, 0x103).unwrap();
        assert_eq!(f.create(ROOT, b"null", 0o666, RDWR).map(|_| ()).unwrap_err(), libc::ENXIO);
    }
    // With O_EXCL every existing name is EEXIST, as before.
    let excl = RDWR | libc::O_EXCL as u32;
    assert_eq!(f.create(ROOT, b"fifo", 0o666, excl).map(|_| ()).unwrap_err(), libc::EEXIST);
    // A regular file is opened; O_TRUNC empties it.
    std::fs::write(t.host("reg"), b"old contents").unwrap();
    let (e, fh) = f.create(ROOT, b"reg", 0o666, RDWR | libc::O_TRUNC as u32).map(with_fh).unwrap();
    assert_eq!(e.attr.size, 0);
    f.release(e.nodeid, fh).unwrap();
    assert_eq!(std::fs::read(t.host("reg")).unwrap(), b"");
    f.mkdir(ROOT, b"d", 0o755).unwrap();
    assert_eq!(f.create(ROOT, b"d", 0o666, RDWR).map(|_| ()).unwrap_err(), libc::EISDIR);
    std::os::unix::fs::symlink("reg", t.host("l")).unwrap();
    assert_eq!(f.create(ROOT, b"l", 0o666, RDWR).map(|_| ()).unwrap_err(), libc::ELOOP);
    // OPEN of a FIFO looked up by the guest is refused the same way.
    let fifo = f.lookup(ROOT, b"fifo").unwrap();
    assert_eq!(f.open(fifo.nodeid, RDWR).map(|_| ()).unwrap_err(), libc::ENXIO);
}

/// The `--refuse` policy switches: device-node MKNOD, set-user-id / set-group-id bits and
/// `security.capability` xattrs fail EPERM when refused, and are allowed by default.
#[test]
fn policy_switches_refuse_device_nodes_setid_bits_and_file_caps() {
    use virtiofs_backend::passthrough::Policy;
    let t = Tree::new();
    let f =
        Fuse::with_config(&t.share, |c| c.policy = Policy::refusing("device-nodes,setid,file-caps").unwrap());
    assert_eq!(f.mknod(ROOT, b"chr", libc::S_IFCHR | 0o666, 0x103).unwrap_err(), libc::EPERM);
    assert_eq!(f.mknod(ROOT, b"blk", libc::S_IFBLK | 0o666, 0x700).unwrap_err(), libc::EPERM);
    assert!(!t.host("chr").exists() && !t.host("blk").exists());
    f.mknod(ROOT, b"fifo", libc::S_IFIFO | 0o666, 0).unwrap();
    assert_eq!(f.mknod(ROOT, b"suid", libc::S_IFREG | 0o4755, 0).unwrap_err(), libc::EPERM);
    assert_eq!(f.create(ROOT, b"sgid", 0o2755, RDWR).map(|_| ()).unwrap_err(), libc::EPERM);
    let (e, fh) = f.create(ROOT, b"plain", 0o755, RDWR).map(with_fh).unwrap();
    f.release(e.nodeid, fh).unwrap();
    assert_eq!(f.chmod(e.nodeid, 0o4755).unwrap_err(), libc::EPERM);
    assert_eq!(f.chmod(e.nodeid, 0o2755).unwrap_err(), libc::EPERM);
    assert_eq!(std::fs::metadata(t.host("plain")).unwrap().permissions().mode() & 0o7777, 0o755);
    // Set-group-id on a directory only makes entries inherit its group: allowed.
    let d = f.mkdir(ROOT, b"d", 0o2755).unwrap();
    f.chmod(d.nodeid, 0o2775).unwrap();
    assert_eq!(f.mkdir(ROOT, b"d2", 0o4755).unwrap_err(), libc::EPERM);
    // A v2 file capability (cap_net_raw): refused before the host sees it.
    let cap: [u8; 20] = [0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(f.setxattr(e.nodeid, b"security.capability", &cap, 0).unwrap_err(), libc::EPERM);
    f.setxattr(e.nodeid, b"user.ok", b"v", 0).unwrap();

    // The defaults allow all of it (as virtiofsd and the POSIX suites expect).
    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let (e, fh) = f.create(ROOT, b"plain", 0o755, RDWR).map(with_fh).unwrap();
    f.release(e.nodeid, fh).unwrap();
    f.chmod(e.nodeid, 0o4755).unwrap();
    assert_eq!(std::fs::metadata(t.host("plain")).unwrap().permissions().mode() & 0o7777, 0o4755);
    if is_root() {
        f.mknod(ROOT, b"chr", libc::S_IFCHR | 0o666, 0x103).unwrap();
        f.setxattr(e.nodeid, b"security.capability", &cap, 0).unwrap();
    }
    assert!(Policy::refusing("bogus").is_err());
}

/// Issue 11, "bounds": nodes (each an `O_PATH` descriptor) and handles (each a descriptor) are
/// bounded: a guest that looks up names and never FORGETs, or opens and never releases, gets
/// ENFILE past `max_nodes` / `max_handles`, before any descriptor is taken or anything created;
/// FORGET and RELEASE make room again.
#[test]
fn nodes_and_handles_are_bounded() {
    let t = Tree::new();
    for i in 0..8 {
        std::fs::write(t.host(&format!("f{i}")), b"x").unwrap();
    }
    let f = Fuse::with_config(&t.share, |c| {
        c.max_nodes = 4; // the root and three more
        c.max_handles = 2;
    });
    let nodes: Vec<_> = (0..3).map(|i| f.lookup(ROOT, format!("f{i}").as_bytes()).unwrap()).collect();
    assert_eq!(f.lookup(ROOT, b"f3").unwrap_err(), libc::ENFILE);
    // A node already held is found again (a revalidation takes no descriptor).
    assert_eq!(f.lookup(ROOT, b"f0").unwrap().nodeid, nodes[0].nodeid);
    assert_eq!(f.mkdir(ROOT, b"d", 0o755).unwrap_err(), libc::ENFILE);
    assert_eq!(f.create(ROOT, b"new", 0o644, RDWR).map(|_| ()).unwrap_err(), libc::ENFILE);
    assert!(!t.host("d").exists() && !t.host("new").exists(), "refused before creating");
    let a = f.open(nodes[0].nodeid, RDWR).unwrap();
    let _b = f.open(nodes[1].nodeid, RDWR).unwrap();
    assert_eq!(f.open(nodes[2].nodeid, RDWR).unwrap_err(), libc::ENFILE);
    assert_eq!(f.opendir(ROOT).unwrap_err(), libc::ENFILE);
    f.release(nodes[0].nodeid, a).unwrap();
    f.open(nodes[2].nodeid, RDWR).unwrap();
    f.forget(nodes[0].nodeid, 2);
    f.lookup(ROOT, b"f3").unwrap();
}

/// Issue 22 (live update): a passthrough rebuilt from its state and its descriptors (as a new
/// process gets them) serves the same nodes and handles: the open file reads through its
/// handle, `..` of a directory is its parent, a node looked up again keeps its id, a new node
/// gets a new one. A state whose root is another directory, or whose descriptors are not the
/// inodes it names, or are too few, is refused.
#[test]
fn a_passthrough_rebuilt_from_its_state_serves_the_same_nodes_and_handles() {
    use std::fs::File;
    use std::os::fd::OwnedFd;
    use virtiofs_backend::passthrough::{PassthroughConfig, PassthroughFs};

    let t = Tree::new();
    let f = Fuse::new(&t.share);
    let d = f.mkdir(ROOT, b"dir", 0o755).unwrap();
    let (e, fh) = f.create(d.nodeid, b"file", 0o644, RDWR).map(with_fh).unwrap();
    assert_eq!(f.write(e.nodeid, fh, 0, b"hello").unwrap(), 5);
    let session = f.srv.save_session();
    let (state, held) = f.srv.filesystem().save();
    let state = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let files = || -> Vec<File> {
        held.fds().iter().map(|fd| File::from(fd.try_clone_to_owned().unwrap())).collect()
    };
    let proc_fd = || OwnedFd::from(File::open("/proc/self/fd").unwrap());
    let cfg = PassthroughConfig::new(&t.share);

    let fs = PassthroughFs::restore(cfg.clone(), proc_fd(), &state, files()).expect("restored");
    let g = Fuse::with_fs(fs);
    g.srv.restore_session(&session).unwrap();
    assert_eq!(g.read(e.nodeid, fh, 0, 16).unwrap(), b"hello");
    assert_eq!(g.lookup(d.nodeid, b"..").unwrap().nodeid, ROOT);
    assert_eq!(g.lookup(ROOT, b"dir").unwrap().nodeid, d.nodeid);
    let (n, nfh) = g.create(d.nodeid, b"new", 0o644, RDWR).map(with_fh).unwrap();
    assert!(![ROOT, d.nodeid, e.nodeid].contains(&n.nodeid), "a node id reused");
    assert!(nfh != fh, "a handle id reused");
    g.release(e.nodeid, fh).unwrap();

    // Refused: another directory as the root; descriptors short; a node's descriptor another inode.
    let other = Tree::new();
    let e1 =
        PassthroughFs::restore(PassthroughConfig::new(&other.share), proc_fd(), &state, files()).unwrap_err();
    assert!(e1.to_string().contains("root"), "{e1}");
    let mut short = files();
    short.pop();
    assert!(PassthroughFs::restore(cfg.clone(), proc_fd(), &state, short).is_err());
    let mut swapped = files();
    swapped.swap(1, 2);
    assert!(PassthroughFs::restore(cfg, proc_fd(), &state, swapped).is_err(), "descriptors out of order");
}

/// Issue 22: a shared directory copied while it serves (`precopy`), then only what changed
/// since (`changes`, with the descriptors of the nodes and handles the copy lacks), is rebuilt
/// by its successor (`restore_copy`, `finish`) as exactly the share it is at the quiet point:
/// the same nodes with their references and parents, the same handles. Changes covered: nodes
/// looked up, made and forgotten, a directory moved into one made after the copy, handles
/// opened and released, a node out of the table but still open. Changes that contradict the
/// copy are refused.
#[test]
fn a_passthrough_copied_while_serving_is_rebuilt_exactly_from_its_changes() {
    use std::fs::File;
    use std::os::fd::OwnedFd;
    use virtiofs_backend::passthrough::state::PassthroughState;
    use virtiofs_backend::passthrough::{PassthroughConfig, PassthroughFs};

    let t = Tree::new();
    for i in 0..20 {
        std::fs::write(t.host(&format!("f{i}")), format!("data {i}")).unwrap();
    }
    let f = Fuse::new(&t.share);
    let d = f.mkdir(ROOT, b"dir", 0o755).unwrap();
    let sub = f.mkdir(d.nodeid, b"sub", 0o755).unwrap();
    let early: Vec<_> = (0..10).map(|i| f.lookup(ROOT, format!("f{i}").as_bytes()).unwrap()).collect();
    let kept = f.open(early[0].nodeid, RDWR).unwrap();
    let dropped = f.open(early[1].nodeid, RDWR).unwrap();

    let (copy, held) = f.srv.filesystem().precopy();
    let wire = |s: &PassthroughState| -> PassthroughState {
        serde_json::from_str(&serde_json::to_string(s).unwrap()).unwrap()
    };
    let copy = wire(&copy);
    let files = |fds: Vec<std::os::fd::BorrowedFd<'_>>| -> Vec<File> {
        fds.iter().map(|fd| File::from(fd.try_clone_to_owned().unwrap())).collect()
    };
    let copy_files = files(held.fds());
    drop(held);

    // Changes after the copy.
    let late: Vec<_> = (10..15).map(|i| f.lookup(ROOT, format!("f{i}").as_bytes()).unwrap()).collect();
    f.forget(early[2].nodeid, 1);
    f.forget(early[3].nodeid, 1);
    let (n, nfh) = f.create(d.nodeid, b"new", 0o644, RDWR).map(with_fh).unwrap();
    f.release(early[1].nodeid, dropped).unwrap();
    let o = f.open(late[0].nodeid, RDWR).unwrap();
    f.forget(late[0].nodeid, 1); // out of the table, still open
    let p = f.mkdir(ROOT, b"p", 0o755).unwrap();
    f.rename(d.nodeid, b"sub", p.nodeid, b"sub").unwrap();
    f.lookup(p.nodeid, b"sub").unwrap();
    // Forgotten, then looked up again: a new node of the same inode.
    f.forget(early[4].nodeid, 1);
    let again = f.lookup(ROOT, b"f4").unwrap();
    assert_ne!(again.nodeid, early[4].nodeid);
    // `..` of a top-level directory takes a reference on the root.
    assert_eq!(f.lookup(d.nodeid, b"..").unwrap().nodeid, ROOT);
    // A directory out of the table, still the parent of a child looked up, moves into a
    // directory made after the copy.
    let k = f.mkdir(d.nodeid, b"k", 0o755).unwrap();
    let kc = f.mkdir(k.nodeid, b"child", 0o755).unwrap();
    let n2 = f.mkdir(ROOT, b"n2", 0o755).unwrap();
    f.rename(d.nodeid, b"k", n2.nodeid, b"k").unwrap();
    f.forget(k.nodeid, 2);

    let (changes, held) = f.srv.filesystem().changes().expect("a copy was taken");
    let changes = serde_json::from_str(&serde_json::to_string(&changes).unwrap()).unwrap();
    let change_files = files(held.fds());
    drop(held);
    assert!(f.srv.filesystem().changes().is_none(), "logging stopped");
    let proc_fd = || OwnedFd::from(File::open("/proc/self/fd").unwrap());
    let cfg = PassthroughConfig::new(&t.share);
    let rebuilt = |changes: &virtiofs_backend::passthrough::state::PassthroughChanges, files: Vec<File>| {
        let base = PassthroughFs::restore_copy(cfg.clone(), proc_fd(), &copy, copy_files_dup(&copy_files))
            .expect("the copy");
        base.finish(changes, files)
    };
    fn copy_files_dup(v: &[File]) -> Vec<File> {
        v.iter().map(|f| f.try_clone().unwrap()).collect()
    }
    let g = rebuilt(&changes, copy_files_dup(&change_files)).expect("the changes");
    let sorted = |(mut s, _): (PassthroughState, _)| {
        s.nodes.sort_by_key(|n| n.id);
        s.handles.sort_by_key(|h| h.fh);
        s
    };
    assert_eq!(sorted(g.save()), sorted(f.srv.filesystem().save()), "the rebuilt share is the same");

    // It serves: the open handles read, `..` of the moved directory is its new parent.
    let session = f.srv.save_session();
    let g = Fuse::with_fs(g);
    g.srv.restore_session(&session).unwrap();
    assert_eq!(g.read(early[0].nodeid, kept, 0, 16).unwrap(), b"data 0");
    assert_eq!(g.read(late[0].nodeid, o, 0, 16).unwrap(), b"data 10", "open, out of the table");
    assert_eq!(g.write(n.nodeid, nfh, 0, b"x").unwrap(), 1);
    assert_eq!(g.lookup(sub.nodeid, b"..").unwrap().nodeid, p.nodeid);
    assert_eq!(g.release(early[1].nodeid, dropped).unwrap_err(), libc::EBADF, "released before");
    assert_eq!(g.lookup(ROOT, b"f4").unwrap().nodeid, again.nodeid);
    let k_again = g.lookup(kc.nodeid, b"..").unwrap().nodeid;
    assert_eq!(g.lookup(k_again, b"..").unwrap().nodeid, n2.nodeid, "the moved directory's parent");

    // Refused: a changed node naming another inode; descriptors short.
    let mut bad = changes.clone();
    if let Some(x) = bad.nodes.last_mut() {
        x.key.1 ^= 1;
    }
    assert!(rebuilt(&bad, copy_files_dup(&change_files)).is_err(), "a node naming another inode");
    let mut short = copy_files_dup(&change_files);
    short.pop();
    assert!(rebuilt(&changes, short).is_err(), "descriptors short");
    let mut bad = changes.clone();
    if let Some((fh, Some(h))) = bad.handles.iter_mut().find(|h| h.1.is_some()) {
        *fh = h.fh + 1000;
    }
    assert!(rebuilt(&bad, copy_files_dup(&change_files)).is_err(), "a handle under another id");
}

/// The copy of a shared directory is taken on another thread while this one looks names up,
/// forgets them, opens and releases files, many times over: each copy is accepted as it is,
/// and with the changes since it makes exactly the share as it is.
#[test]
fn a_passthrough_copied_under_changes_is_made_exact_by_them() {
    use std::fs::File;
    use std::os::fd::OwnedFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use virtiofs_backend::passthrough::state::PassthroughState;
    use virtiofs_backend::passthrough::{PassthroughConfig, PassthroughFs};

    let t = Tree::new();
    for i in 0..400 {
        std::fs::write(t.host(&format!("f{i}")), b"x").unwrap();
    }
    let f = Fuse::new(&t.share);
    for i in 0..300 {
        f.lookup(ROOT, format!("f{i}").as_bytes()).unwrap();
    }
    let dup = |v: &[File]| -> Vec<File> { v.iter().map(|f| f.try_clone().unwrap()).collect() };
    for round in 0..6u32 {
        let stop = Arc::new(AtomicBool::new(false));
        let (srv, s2) = (f.srv.clone(), stop.clone());
        let copier = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(1));
            let (state, held) = srv.filesystem().precopy();
            let files: Vec<File> =
                held.fds().iter().map(|fd| File::from(fd.try_clone_to_owned().unwrap())).collect();
            s2.store(true, Ordering::SeqCst);
            (state, files)
        });
        let mut n = 0u32;
        while !stop.load(Ordering::SeqCst) || n < 30 {
            let i = (round * 37 + n * 7) % 400;
            let e = f.lookup(ROOT, format!("f{i}").as_bytes()).unwrap();
            match n % 4 {
                0 => f.forget(e.nodeid, 1),
                1 => {
                    let h = f.open(e.nodeid, RDWR).unwrap();
                    f.release(e.nodeid, h).unwrap();
                }
                2 => {
                    f.open(e.nodeid, RDWR).unwrap(); // left open
                    f.forget(e.nodeid, 1);
                }
                _ => {}
            }
            n += 1;
        }
        let (state, files) = copier.join().unwrap();
        let (changes, held) = f.srv.filesystem().changes().unwrap();
        let change_files: Vec<File> =
            held.fds().iter().map(|fd| File::from(fd.try_clone_to_owned().unwrap())).collect();
        drop(held);
        let proc_fd = OwnedFd::from(File::open("/proc/self/fd").unwrap());
        let cfg = PassthroughConfig::new(&t.share);
        let g = PassthroughFs::restore_copy(cfg, proc_fd, &state, dup(&files))
            .and_then(|b| b.finish(&changes, change_files))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let sorted = |(mut s, _): (PassthroughState, _)| {
            s.nodes.sort_by_key(|n| n.id);
            s.handles.sort_by_key(|h| h.fh);
            s
        };
        assert_eq!(sorted(g.save()), sorted(f.srv.filesystem().save()), "round {round} after {n} changes");
    }
}

/// A shared directory's changes are the old process's word, checked as untrusted input:
/// valid changes mangled at random (ids, parents, references, the count of new nodes, the
/// nodes that left, handles) are applied or refused, never a panic.
#[test]
fn mangled_passthrough_changes_are_refused_or_applied_never_a_panic() {
    use std::fs::File;
    use std::os::fd::OwnedFd;
    use virtiofs_backend::passthrough::{PassthroughConfig, PassthroughFs};

    let t = Tree::new();
    for i in 0..10 {
        std::fs::write(t.host(&format!("f{i}")), b"x").unwrap();
    }
    let f = Fuse::new(&t.share);
    let d = f.mkdir(ROOT, b"dir", 0o755).unwrap();
    let early: Vec<_> = (0..5).map(|i| f.lookup(ROOT, format!("f{i}").as_bytes()).unwrap()).collect();
    let (copy, held) = f.srv.filesystem().precopy();
    let dup = |fds: Vec<std::os::fd::BorrowedFd<'_>>| -> Vec<File> {
        fds.iter().map(|fd| File::from(fd.try_clone_to_owned().unwrap())).collect()
    };
    let copy_files = dup(held.fds());
    drop(held);
    for i in 5..8 {
        f.lookup(ROOT, format!("f{i}").as_bytes()).unwrap();
    }
    f.forget(early[0].nodeid, 1);
    let o = f.open(early[1].nodeid, RDWR).unwrap();
    f.mkdir(d.nodeid, b"sub", 0o755).unwrap();
    let _ = o;
    let (good, held) = f.srv.filesystem().changes().unwrap();
    let change_files = dup(held.fds());
    drop(held);
    let again = |v: &[File]| -> Vec<File> { v.iter().map(|f| f.try_clone().unwrap()).collect() };
    let ids: Vec<u64> = copy.nodes.iter().map(|n| n.id).chain(good.nodes.iter().map(|n| n.id)).collect();
    let mut rnd = xorshift(0x2545_f491_4f6c_dd1du64);
    let (mut applied, mut refused) = (0, 0);
    for _ in 0..300 {
        let mut c = good.clone();
        let any = |r: u64| ids[(r % ids.len() as u64) as usize];
        for _ in 0..1 + rnd(2) {
            let k = if c.nodes.is_empty() { 0 } else { rnd(c.nodes.len() as u64) as usize };
            match rnd(8) {
                0 if !c.nodes.is_empty() => c.nodes[k].id = any(rnd(100)),
                1 if !c.nodes.is_empty() => c.nodes[k].parent = Some(any(rnd(100))),
                2 if !c.nodes.is_empty() => c.nodes[k].refs = [None, Some(0), Some(7)][rnd(3) as usize],
                3 => c.new_nodes = rnd(c.nodes.len() as u64 + 2) as usize,
                4 => c.left.push(any(rnd(100))),
                5 if !c.handles.is_empty() => {
                    let h = rnd(c.handles.len() as u64) as usize;
                    if let Some(s) = &mut c.handles[h].1 {
                        s.node = any(rnd(100));
                    }
                }
                6 => c.next_id = c.next_id.wrapping_sub(rnd(4)),
                _ if !c.nodes.is_empty() => c.nodes[k].key.1 ^= rnd(3),
                _ => {}
            }
        }
        let proc_fd = || OwnedFd::from(File::open("/proc/self/fd").unwrap());
        let cfg = PassthroughConfig::new(&t.share);
        let r = PassthroughFs::restore_copy(cfg, proc_fd(), &copy, again(&copy_files))
            .and_then(|base| base.finish(&c, again(&change_files)));
        match r {
            Ok(_) => applied += 1,
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 50 && applied > 0, "{applied} applied, {refused} refused");
}

/// What a crash-kept share gives its keeper, as the daemon's supervisor holds it: a copy of
/// each descriptor by key.
#[derive(Default)]
struct Holder {
    held: std::sync::Mutex<std::collections::BTreeMap<u64, (HeldItem, std::fs::File)>>,
}

impl DescriptorKeeper for Holder {
    fn hold(&self, items: &[(u64, HeldItem)], fds: &[std::os::fd::BorrowedFd<'_>]) -> bool {
        let mut held = self.held.lock().unwrap();
        for ((key, item), fd) in items.iter().zip(fds) {
            held.insert(*key, (item.clone(), fd.try_clone_to_owned().unwrap().into()));
        }
        true
    }
    fn let_go(&self, keys: &[u64]) {
        let mut held = self.held.lock().unwrap();
        keys.iter().for_each(|k| drop(held.remove(k)));
    }
    fn let_all_go(&self) {
        self.held.lock().unwrap().clear();
    }
}

impl Holder {
    /// What a recovery is given: each item and a copy of its descriptor, by key, less `but`.
    fn replay(&self, but: Option<u64>) -> (Vec<(u64, HeldItem)>, Vec<std::fs::File>) {
        let held = self.held.lock().unwrap();
        let kept = held.iter().filter(|(k, _)| Some(**k) != but);
        kept.map(|(k, (item, f))| ((*k, item.clone()), f.try_clone().unwrap())).unzip()
    }
}

/// Crash keeping (issue 24): a recovery takes the nodes whose descriptors were given before
/// their replies could be published, drops a node made in a round that never published (its
/// descriptor still queued at the kill: the guest does not know it), and refuses records that
/// say a node was given when the keeper does not hold it (the guest may know that node).
#[test]
fn a_recovery_drops_only_nodes_whose_descriptors_were_never_given() {
    use std::collections::HashMap;
    use std::sync::Arc;
    use virtiofs_backend::passthrough::keep::ShareKeep;
    use virtiofs_backend::passthrough::{PassthroughConfig, PassthroughFs};
    let tree = Tree::new();
    std::fs::write(tree.share.join("a"), b"a").unwrap();
    std::fs::write(tree.share.join("b"), b"b").unwrap();
    let f = Fuse::new(&tree.share);
    let holder = Arc::new(Holder::default());
    let keep = Arc::new(ShareKeep::create(64).unwrap());
    keep.set_keeper(holder.clone());
    f.fs().keep_in(keep.clone(), &HashMap::new());
    let a = f.lookup(ROOT, b"a").unwrap().nodeid;
    f.srv.before_publish(); // the poller publishes a's reply after this
    let b = f.lookup(ROOT, b"b").unwrap().nodeid; // killed before b's round published
    let proc_fd = || std::os::fd::OwnedFd::from(std::fs::File::open("/proc/self/fd").unwrap());
    let records = || ShareKeep::open(keep.memfd().try_clone_to_owned().unwrap().into()).unwrap();
    let (held, files) = holder.replay(None);
    let cfg = PassthroughConfig::new(&tree.share);
    let r = PassthroughFs::recover(cfg.clone(), proc_fd(), &records(), &held, files, 0).unwrap();
    assert!(r.dropped.contains(&b), "b was never given: {:?}", r.dropped);
    assert!(!r.dropped.contains(&a));
    assert_eq!(r.fs.lookup_count(a), Some(1), "a goes on with its reference");
    assert_eq!(r.fs.lookup_count(b), None);
    let (held, files) = holder.replay(Some(a));
    let lost = PassthroughFs::recover(cfg, proc_fd(), &records(), &held, files, 0);
    assert!(lost.is_err(), "a was given and is not held: the recovery is refused");
}
