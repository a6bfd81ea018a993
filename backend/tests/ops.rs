//! Happy paths and POSIX semantics of the FUSE operations, driven through the server (a synchronous `PollerEngine`).

mod harness;

use std::collections::HashSet;

use harness::ram::Fuse;
use harness::*;
use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::ramfs::RamFsConfig;
use virtiofs_backend::{RamFs, Server};

const S_IFMT: u32 = libc::S_IFMT;
const S_IFDIR: u32 = libc::S_IFDIR;
const S_IFREG: u32 = libc::S_IFREG;
const S_IFLNK: u32 = libc::S_IFLNK;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8).collect()
}

#[test]
fn init_negotiates_linux_6_12() {
    let f = Fuse::uninit();
    // Before INIT everything else is refused.
    assert_eq!(f.getattr(ROOT), Err(libc::EIO));
    let out = f.init(41, LINUX_FLAGS).unwrap();
    assert_eq!((out.major, out.minor), (7, 41));
    assert_eq!(out.max_write, 1 << 20);
    assert_eq!(out.max_pages, 256);
    assert_eq!(out.max_readahead, 131072);
    assert_eq!(out.time_gran, 1);
    let flags = u64::from(out.flags) | (u64::from(out.flags2) << 32);
    let want = abi::init::ASYNC_READ
        | abi::init::PARALLEL_DIROPS
        | abi::init::BIG_WRITES
        | abi::init::AUTO_INVAL_DATA
        | abi::init::ASYNC_DIO
        | abi::init::ATOMIC_O_TRUNC
        | abi::init::DO_READDIRPLUS
        | abi::init::READDIRPLUS_AUTO
        | abi::init::HANDLE_KILLPRIV
        | abi::init::HANDLE_KILLPRIV_V2
        | abi::init::DONT_MASK
        | abi::init::POSIX_ACL
        | abi::init::SETXATTR_EXT
        | abi::init::DIRECT_IO_ALLOW_MMAP
        | abi::init::CREATE_SUPP_GROUP
        | abi::init::MAX_PAGES
        | abi::init::INIT_EXT;
    assert_eq!(flags, want, "exactly the flags we honour, plus MAX_PAGES and INIT_EXT");
    assert_eq!(f.srv.negotiated(), want);

    // POSIX_ACL can be declined (ACLs still work, the kernel just leaves them to us).
    let cfg = RamFsConfig { posix_acl: false, ..Default::default() };
    let f = Fuse::with_fs(RamFs::with_config(cfg));
    let out = f.init(41, LINUX_FLAGS).unwrap();
    assert_eq!(out.flags as u64 & abi::init::POSIX_ACL, 0);
    assert_eq!(f.srv.negotiated(), want & !abi::init::POSIX_ACL);
    assert_eq!(flags & abi::init::WRITEBACK_CACHE, 0);
    assert_eq!(f.getattr(ROOT).unwrap().mode, S_IFDIR | 0o755);
}

#[test]
fn init_without_ext_and_old_kernels() {
    // A kernel without INIT_EXT sends the 16-byte fuse_init_in and gets no INIT_EXT back.
    let f = Fuse::uninit();
    let out = f.init(35, abi::init::ASYNC_READ | abi::init::MAX_PAGES | (1 << 33)).unwrap();
    assert_eq!(out.flags, (abi::init::ASYNC_READ | abi::init::MAX_PAGES) as u32);
    assert_eq!(out.flags2, 0);

    // 7.22 expects the 24-byte reply.
    let f = Fuse::uninit();
    let r = f.call(opcode::INIT, 0, &[&init_in(22, abi::init::ASYNC_READ)]);
    assert_eq!(r.errno(), 0);
    assert_eq!(r.n, HDR + 24);
    let out: abi::InitOut = {
        let mut b = r.body.clone();
        b.resize(64, 0);
        parse(&b)
    };
    assert_eq!(out.max_write, 1 << 20);
    assert_eq!(out.max_pages, 0, "no MAX_PAGES offered");

    // Too old, or a major we do not know.
    let f = Fuse::uninit();
    assert_eq!(f.init(11, 0).unwrap_err(), libc::EPROTO);
    let arg = abi::InitInCompat { major: 8, minor: 0, max_readahead: 0, flags: 0 };
    let r = f.call(opcode::INIT, 0, &[vm_memory::ByteValued::as_slice(&arg)]);
    let out: abi::InitOut = parse(&r.body);
    assert_eq!((r.errno(), out.major, out.minor), (0, 7, 41));
    assert_eq!(f.getattr(ROOT), Err(libc::EIO), "still not initialised");
}

// RAM filesystem only: STATFS and the data left are the RAM filesystem's.
#[test]
fn happy_path_sequence() {
    let f = Fuse::new();
    let dir = f.mkdir(ROOT, b"d", 0o755).unwrap();
    assert_eq!(dir.attr.mode, S_IFDIR | 0o755);
    assert_eq!(dir.attr.nlink, 2);
    assert_eq!(f.getattr(ROOT).unwrap().nlink, 3, "root: 2 + one subdir");
    let d = dir.nodeid;

    let (file, opened) = f.create(d, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    assert_eq!(file.attr.mode, S_IFREG | 0o644);
    let (ino, fh) = (file.nodeid, opened.fh);

    // 1 MiB in 128 KiB writes, read back in 128 KiB reads and in one 1 MiB read.
    let data = pattern(1 << 20, 7);
    for (i, chunk) in data.chunks(128 << 10).enumerate() {
        let off = (i * (128 << 10)) as u64;
        assert_eq!(f.write(ino, fh, off, chunk).unwrap(), chunk.len() as u32);
    }
    assert_eq!(f.getattr(ino).unwrap().size, 1 << 20);
    for (i, chunk) in data.chunks(128 << 10).enumerate() {
        let off = (i * (128 << 10)) as u64;
        assert_eq!(f.read(ino, fh, off, 128 << 10).unwrap(), chunk);
    }
    assert_eq!(f.read(ino, fh, 0, 1 << 20).unwrap(), data);
    // Reads at and past EOF are short.
    assert_eq!(f.read(ino, fh, (1 << 20) - 10, 4096).unwrap(), &data[data.len() - 10..]);
    assert!(f.read(ino, fh, 1 << 21, 4096).unwrap().is_empty());

    // Listing.
    f.mkdir(d, b"sub", 0o700).unwrap();
    let dfh = f.opendir(d).unwrap();
    let names: Vec<Vec<u8>> = f.readdir(d, dfh, 0, 4096).unwrap().into_iter().map(|e| e.3).collect();
    assert_eq!(names, [&b"."[..], b"..", b"f", b"sub"]);
    let plus = f.readdirplus(d, dfh, 0, 4096).unwrap();
    assert_eq!(plus.len(), 4);
    assert_eq!(plus[0].0.nodeid, 0, "no node id (no reference) for .");
    assert_eq!(plus[1].0.nodeid, 0, "no node id (no reference) for ..");
    assert_eq!(plus[2].0.nodeid, ino);
    assert_eq!(plus[2].0.attr.size, 1 << 20);
    assert_eq!(f.fs().lookup_count(ino), Some(2), "create + readdirplus");
    f.releasedir(d, dfh).unwrap();

    // Rename, rename2.
    f.rename(d, b"f", d, b"g").unwrap();
    assert_eq!(f.lookup(d, b"f").unwrap_err(), libc::ENOENT);
    assert_eq!(f.lookup(d, b"g").unwrap().nodeid, ino);
    let (other, ofh) = f.create(d, b"h", 0o600, O_RDWR | O_CREAT).unwrap();
    f.release(other.nodeid, ofh.fh).unwrap();
    assert_eq!(f.rename2(d, b"g", d, b"h", libc::RENAME_NOREPLACE), Err(libc::EEXIST));
    f.rename2(d, b"g", d, b"h", libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(f.lookup(d, b"h").unwrap().nodeid, ino);
    assert_eq!(f.lookup(d, b"g").unwrap().nodeid, other.nodeid);
    f.rename2(d, b"h", ROOT, b"moved", libc::RENAME_NOREPLACE).unwrap();

    // Hard link.
    let l = f.link(ino, d, b"hard").unwrap();
    assert_eq!((l.nodeid, l.attr.nlink), (ino, 2));

    // Symlink.
    let s = f.symlink(d, b"sym", b"../moved").unwrap();
    assert_eq!(s.attr.mode, S_IFLNK | 0o777);
    assert_eq!(s.attr.size, 8);
    assert_eq!(f.readlink(s.nodeid).unwrap(), b"../moved");
    assert_eq!(f.readlink(ino), Err(libc::EINVAL));

    // Truncate: shrink, then grow; the cut-off bytes come back as zeros.
    let a = f.truncate(ino, 1000).unwrap();
    assert_eq!(a.size, 1000);
    f.truncate(ino, 200_000).unwrap();
    let back = f.read(ino, fh, 0, 200_000).unwrap();
    assert_eq!(&back[..1000], &data[..1000]);
    assert!(back[1000..].iter().all(|&b| b == 0));

    // Unlink, rmdir.
    f.unlink(ROOT, b"moved").unwrap();
    assert_eq!(f.getattr(ino).unwrap().nlink, 1);
    assert_eq!(f.rmdir(ROOT, b"d"), Err(libc::ENOTEMPTY));
    for n in [&b"hard"[..], b"sym", b"g"] {
        f.unlink(d, n).unwrap();
    }
    assert_eq!(f.unlink(d, b"sub"), Err(libc::EISDIR));
    assert_eq!(f.rmdir(d, b"nope"), Err(libc::ENOENT));
    f.rmdir(d, b"sub").unwrap();
    f.rmdir(ROOT, b"d").unwrap();
    assert_eq!(f.getattr(ROOT).unwrap().nlink, 2);

    // statfs.
    let st = f.statfs(ROOT).unwrap();
    assert_eq!((st.bsize, st.frsize, st.namelen), (4096, 4096, 255));
    assert_eq!(st.blocks, (1 << 30) / 4096);
    assert!(st.bfree < st.blocks, "the open unlinked file still holds data");
    assert!(st.ffree < st.files);

    // Unlinked but open: data stays until released and forgotten.
    assert_eq!(f.getattr(ino).unwrap().nlink, 0);
    assert_eq!(&f.read(ino, fh, 0, 10).unwrap(), &data[..10]);
    f.release(ino, fh).unwrap();
    assert!(f.fs().lookup_count(ino).is_some(), "still looked up");
    let refs = f.fs().lookup_count(ino).unwrap();
    assert_eq!(refs, 5, "create, readdirplus, two lookups, link");
    f.forget(ino, refs - 1);
    assert!(f.fs().lookup_count(ino).is_some());
    f.forget(ino, 1);
    assert_eq!(f.fs().lookup_count(ino), None, "gone after the last forget");
    assert_eq!(f.getattr(ino), Err(libc::ENOENT));
    assert_eq!(f.fs().used_bytes(), 0, "no data left");
    // The other file keeps the references from CREATE and one LOOKUP.
    assert_eq!(f.fs().lookup_count(other.nodeid), Some(2));
}

fn split_buffers_everywhere<F: TestFs>(f: &harness::Fuse<F>) {
    let (e, o) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    let data = pattern(70_000, 3);
    // A WRITE cut into 7-byte buffers.
    let arg = abi::WriteIn { fh: o.fh, offset: 5, size: data.len() as u32, ..Default::default() };
    let req = f.req(opcode::WRITE, e.nodeid, &[vm_memory::ByteValued::as_slice(&arg), &data]);
    let r = handle_raw(&f.srv, &req, 7, 64, 3);
    assert_eq!(r.errno(), 0);
    let w: abi::WriteOut = parse(&r.body);
    assert_eq!(w.size, data.len() as u32);
    // A READ whose reply lands in 1000-byte buffers; request in 1-byte buffers.
    let req =
        f.req(opcode::READ, e.nodeid, &[vm_memory::ByteValued::as_slice(&Fuse::read_in(o.fh, 5, 70_000))]);
    let r = handle_raw(&f.srv, &req, 1, HDR + 70_000, 1000);
    assert_eq!(r.errno(), 0);
    assert_eq!(r.body, data);
    // LOOKUP with a name split across buffers.
    let req = f.req(opcode::LOOKUP, ROOT, &[&cstr(b"f")]);
    let r = handle_raw(&f.srv, &req, 41, HDR + 128, 5);
    let entry: abi::EntryOut = parse(&r.body);
    assert_eq!(entry.nodeid, e.nodeid);
}

// RAM filesystem only: a host directory need not list an entry added during the listing.
#[test]
fn readdir_paginates_with_stable_offsets() {
    let f = Fuse::new();
    let d = f.mkdir(ROOT, b"d", 0o755).unwrap().nodeid;
    let mut expected = HashSet::new();
    for i in 0..100 {
        let name = format!("entry-{i:03}").into_bytes();
        f.mknod(d, &name, S_IFREG | 0o644, 0).unwrap();
        expected.insert(name);
    }
    let fh = f.opendir(d).unwrap();
    // 100 bytes hold three 32-byte records: entries that don't fit end the buffer.
    let mut offset = 0;
    let mut seen = Vec::new();
    let mut mutated = false;
    loop {
        let page = f.readdir(d, fh, offset, 100).unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 3);
        offset = page.last().unwrap().1;
        seen.extend(page.into_iter().map(|e| e.3));
        // Remove an entry already listed and add a new one mid-listing: no duplicates, no skips.
        if seen.len() >= 30 && !mutated {
            mutated = true;
            f.unlink(d, b"entry-000").unwrap();
            f.mknod(d, b"late", S_IFREG | 0o644, 0).unwrap();
        }
    }
    let names: HashSet<Vec<u8>> = seen.iter().cloned().collect();
    assert_eq!(names.len(), seen.len(), "no duplicates");
    for n in &expected {
        assert!(names.contains(n), "{:?} listed", String::from_utf8_lossy(n));
    }
    assert!(names.contains(b"late".as_slice()), "entries added later are listed once");

    // READDIRPLUS with a buffer for exactly one record: it takes a reference for that one only.
    let ino_before: Vec<u64> =
        (0..3).map(|i| f.lookup(d, format!("entry-{:03}", i + 1).as_bytes()).unwrap().nodeid).collect();
    for &i in &ino_before {
        assert_eq!(f.fs().lookup_count(i), Some(2), "mknod + lookup");
    }
    let one = abi::direntplus_size(9) as u32;
    let page = f.readdirplus(d, fh, 2, one + 10).unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].2, b"entry-001");
    assert_eq!(f.fs().lookup_count(ino_before[0]), Some(3));
    assert_eq!(f.fs().lookup_count(ino_before[1]), Some(2), "not listed: no reference");
    let page2 = f.readdirplus(d, fh, page[0].1, one).unwrap();
    assert_eq!(page2[0].2, b"entry-002");
    f.releasedir(d, fh).unwrap();
    assert_eq!(f.releasedir(d, fh), Err(libc::EBADF), "released twice");
}

fn rename_semantics<F: TestFs>(f: &harness::Fuse<F>) {
    let a = f.mkdir(ROOT, b"a", 0o755).unwrap().nodeid;
    let b = f.mkdir(a, b"b", 0o755).unwrap().nodeid;
    let c = f.mkdir(ROOT, b"c", 0o755).unwrap().nodeid;
    f.mknod(ROOT, b"file", S_IFREG | 0o644, 0).unwrap();
    f.mknod(c, b"inner", S_IFREG | 0o644, 0).unwrap();

    assert_eq!(f.rename(ROOT, b"a", b, b"x"), Err(libc::EINVAL), "into its own subtree");
    assert_eq!(f.rename(ROOT, b"a", a, b"x"), Err(libc::EINVAL), "into itself");
    assert_eq!(f.rename(ROOT, b"a", ROOT, b"c"), Err(libc::ENOTEMPTY));
    assert_eq!(f.rename(ROOT, b"file", ROOT, b"a"), Err(libc::EISDIR));
    assert_eq!(f.rename(ROOT, b"a", ROOT, b"file"), Err(libc::ENOTDIR));
    assert_eq!(f.rename(ROOT, b"missing", ROOT, b"x"), Err(libc::ENOENT));
    assert_eq!(f.rename2(ROOT, b"file", ROOT, b"x", 4), Err(libc::EINVAL), "RENAME_WHITEOUT");
    assert_eq!(f.rename2(ROOT, b"file", ROOT, b"x", 3), Err(libc::EINVAL));
    assert_eq!(f.rename2(ROOT, b"file", ROOT, b"x", 1 << 8), Err(libc::EINVAL));
    assert_eq!(f.rename2(ROOT, b"file", ROOT, b"x", libc::RENAME_EXCHANGE), Err(libc::ENOENT));

    // Moving b from a to c: link counts follow, ".." follows.
    f.rename(a, b"b", c, b"b2").unwrap();
    assert_eq!(f.getattr(a).unwrap().nlink, 2);
    assert_eq!(f.getattr(c).unwrap().nlink, 3);
    assert_eq!(f.lookup(b, b"..").unwrap().nodeid, c);

    // Replacing an empty directory.
    f.mkdir(ROOT, b"empty", 0o755).unwrap();
    let root_links = f.getattr(ROOT).unwrap().nlink;
    f.rename(c, b"b2", ROOT, b"empty").unwrap();
    assert_eq!(f.getattr(ROOT).unwrap().nlink, root_links);
    assert_eq!(f.getattr(c).unwrap().nlink, 2);
    assert_eq!(f.lookup(ROOT, b"empty").unwrap().nodeid, b);

    // Exchanging a directory and a file across directories.
    f.rename2(ROOT, b"empty", c, b"inner", libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(f.lookup(c, b"inner").unwrap().nodeid, b);
    assert_eq!(f.getattr(c).unwrap().nlink, 3);
    assert_eq!(f.lookup(ROOT, b"empty").unwrap().attr.mode & S_IFMT, S_IFREG);
    assert_eq!(f.lookup(b, b"..").unwrap().nodeid, c);

    // Renaming onto another link of the same inode does nothing.
    let file = f.lookup(ROOT, b"file").unwrap().nodeid;
    f.link(file, ROOT, b"file2").unwrap();
    f.rename(ROOT, b"file", ROOT, b"file2").unwrap();
    assert_eq!(f.getattr(file).unwrap().nlink, 2);
    assert!(f.lookup(ROOT, b"file").is_ok());

    // Replacing a file drops its link; ctime of the moved inode changes.
    let before = f.getattr(file).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    f.rename(ROOT, b"file", ROOT, b"empty").unwrap();
    let after = f.getattr(file).unwrap();
    assert!((after.ctime, after.ctimensec) > (before.ctime, before.ctimensec));
}

// RAM filesystem only: a host truncate to the same size still sets mtime.
#[test]
fn times_follow_posix() {
    let f = Fuse::new();
    let d = f.mkdir(ROOT, b"d", 0o777).unwrap();
    let t0 = d.attr;
    std::thread::sleep(std::time::Duration::from_millis(5));
    let (e, o) = f.create(d.nodeid, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    let t1 = f.getattr(d.nodeid).unwrap();
    assert!((t1.mtime, t1.mtimensec) > (t0.mtime, t0.mtimensec), "create updates parent mtime");
    assert!((t1.ctime, t1.ctimensec) > (t0.ctime, t0.ctimensec));

    // Explicit times.
    let a = f
        .setattr(
            e.nodeid,
            abi::SetattrIn {
                valid: abi::fattr::ATIME | abi::fattr::MTIME,
                atime: 1_000_000,
                atimensec: 5,
                mtime: 2_000_000,
                mtimensec: 7,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.atime, a.atimensec, a.mtime, a.mtimensec), (1_000_000, 5, 2_000_000, 7));
    assert!(a.ctime > 2_000_000, "ctime is now");
    let bad = abi::SetattrIn { valid: abi::fattr::MTIME, mtimensec: 1_000_000_000, ..Default::default() };
    assert_eq!(f.setattr(e.nodeid, bad), Err(libc::EINVAL));

    // A write sets mtime and ctime to now; a read after it bumps atime (relatime).
    f.write(e.nodeid, o.fh, 0, b"x").unwrap();
    let w = f.getattr(e.nodeid).unwrap();
    assert!(w.mtime > 2_000_000);
    assert_eq!(w.atime, 1_000_000);
    f.read(e.nodeid, o.fh, 0, 1).unwrap();
    assert!(f.getattr(e.nodeid).unwrap().atime > 1_000_000);

    // Truncating to the same size changes nothing; to another size updates mtime.
    let before = f.getattr(e.nodeid).unwrap();
    let same = f.truncate(e.nodeid, 1).unwrap();
    assert_eq!((same.mtime, same.mtimensec), (before.mtime, before.mtimensec));
    std::thread::sleep(std::time::Duration::from_millis(5));
    let other = f.truncate(e.nodeid, 0).unwrap();
    assert!((other.mtime, other.mtimensec) > (before.mtime, before.mtimensec));
}

// RAM filesystem only: the RAM filesystem answers LOOKUP of ".", the passthrough refuses it
// (EINVAL).
#[test]
fn special_files_and_links() {
    let f = Fuse::new();
    let fifo = f.mknod(ROOT, b"fifo", libc::S_IFIFO | 0o640, 0).unwrap();
    assert_eq!(fifo.attr.mode, libc::S_IFIFO | 0o640);
    let sock = f.mknod(ROOT, b"sock", libc::S_IFSOCK | 0o600, 0).unwrap();
    assert_eq!(sock.attr.mode & S_IFMT, libc::S_IFSOCK);
    let chr = f.mknod(ROOT, b"chr", libc::S_IFCHR | 0o600, 0x0103).unwrap();
    assert_eq!((chr.attr.mode & S_IFMT, chr.attr.rdev), (libc::S_IFCHR, 0x0103));
    let blk = f.mknod(ROOT, b"blk", libc::S_IFBLK | 0o600, 0x0801).unwrap();
    assert_eq!(blk.attr.rdev, 0x0801);
    assert_eq!(f.mknod(ROOT, b"dir", S_IFDIR | 0o600, 0), Err(libc::EPERM));
    assert_eq!(f.mknod(ROOT, b"fifo", libc::S_IFIFO | 0o600, 0), Err(libc::EEXIST));

    // Hard links count; directories cannot be linked.
    let l = f.link(fifo.nodeid, ROOT, b"fifo2").unwrap();
    assert_eq!(l.attr.nlink, 2);
    let d = f.mkdir(ROOT, b"d", 0o755).unwrap();
    assert_eq!(f.link(d.nodeid, ROOT, b"d2"), Err(libc::EPERM));
    assert_eq!(f.link(fifo.nodeid, ROOT, b"d"), Err(libc::EEXIST));
    assert_eq!(f.link(fifo.nodeid, fifo.nodeid, b"x"), Err(libc::ENOTDIR));
    f.unlink(ROOT, b"fifo").unwrap();
    assert_eq!(f.getattr(fifo.nodeid).unwrap().nlink, 1);
    assert_eq!(f.lookup(ROOT, b"fifo2").unwrap().nodeid, fifo.nodeid);

    // Lookup of "." and ".." inside a directory.
    assert_eq!(f.lookup(d.nodeid, b".").unwrap().nodeid, d.nodeid);
    assert_eq!(f.lookup(d.nodeid, b"..").unwrap().nodeid, ROOT);
    assert_eq!(f.lookup(fifo.nodeid, b"x"), Err(libc::ENOTDIR));

    // Symlink targets up to PATH_MAX - 1.
    assert!(f.symlink(ROOT, b"long", &[b'a'; 4095]).is_ok());
    assert_eq!(f.readlink(f.lookup(ROOT, b"long").unwrap().nodeid).unwrap().len(), 4095);
    assert_eq!(f.symlink(ROOT, b"toolong", &[b'a'; 4096]), Err(libc::ENAMETOOLONG));
}

fn open_flags_and_handles<F: TestFs>(f: &harness::Fuse<F>) {
    let (e, o) = f.create(ROOT, b"f", 0o644, O_WRONLY | O_CREAT).unwrap();
    f.write(e.nodeid, o.fh, 0, b"hello").unwrap();
    // CREATE on an existing name: EEXIST with O_EXCL, otherwise an open (with O_TRUNC honoured).
    assert_eq!(f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT | O_EXCL).unwrap_err(), libc::EEXIST);
    let (again, o2) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    assert_eq!(again.nodeid, e.nodeid);
    f.mkdir(ROOT, b"dir", 0o755).unwrap();
    assert_eq!(f.create(ROOT, b"dir", 0o644, O_RDONLY | O_CREAT).unwrap_err(), libc::EISDIR);
    let dir = f.lookup(ROOT, b"dir").unwrap().nodeid;
    assert_eq!(f.fs().lookup_count(dir), Some(2), "mkdir + lookup: the failed CREATE kept none");
    assert_eq!(f.read(e.nodeid, o2.fh, 0, 10).unwrap(), b"hello");
    // A read-only handle cannot write; an unknown handle is EBADF; a handle of another inode too.
    let ro = f.open(e.nodeid, O_RDONLY).unwrap();
    assert_eq!(f.write(e.nodeid, ro, 0, b"x"), Err(libc::EBADF));
    assert_eq!(f.read(e.nodeid, 9999, 0, 1), Err(libc::EBADF));
    assert_eq!(f.read(ROOT, ro, 0, 1), Err(libc::EBADF));
    // O_TRUNC on open.
    let t = f.open(e.nodeid, O_WRONLY | O_TRUNC).unwrap();
    assert_eq!(f.getattr(e.nodeid).unwrap().size, 0);
    // Directories: OPEN for writing is EISDIR, OPENDIR on a file is ENOTDIR.
    assert_eq!(f.open(ROOT, O_RDWR), Err(libc::EISDIR));
    assert_eq!(f.opendir(e.nodeid), Err(libc::ENOTDIR));
    // FLUSH and FSYNC validate the handle.
    let flush = abi::FlushIn { fh: t, ..Default::default() };
    let r = f.call(opcode::FLUSH, e.nodeid, &[vm_memory::ByteValued::as_slice(&flush)]);
    assert_eq!((r.errno(), r.n), (0, HDR));
    let fsync = abi::FsyncIn { fh: 12345, fsync_flags: 1, padding: 0 };
    let r = f.call(opcode::FSYNC, e.nodeid, &[vm_memory::ByteValued::as_slice(&fsync)]);
    assert_eq!(r.errno(), libc::EBADF);
    for fh in [o.fh, o2.fh, ro, t] {
        f.release(e.nodeid, fh).unwrap();
    }
    assert_eq!(f.release(e.nodeid, t), Err(libc::EBADF));
}

// RAM filesystem only: the limits are the RAM filesystem's.
#[test]
fn capacity_and_sparse_files() {
    let cfg = RamFsConfig { capacity: 256 << 10, max_inodes: 4, ..Default::default() };
    let f = Fuse::with_fs(RamFs::with_config(cfg));
    f.init(41, LINUX_FLAGS).unwrap();
    let (e, o) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    // A huge sparse extension costs nothing.
    f.truncate(e.nodeid, 1 << 40).unwrap();
    assert_eq!(f.fs().used_bytes(), 0);
    assert!(f.read(e.nodeid, o.fh, 1 << 39, 4096).unwrap().iter().all(|&b| b == 0));
    // Writes past capacity: partial, then ENOSPC.
    let big = vec![1u8; 300 << 10];
    assert_eq!(f.write(e.nodeid, o.fh, 0, &big).unwrap(), 256 << 10);
    assert_eq!(f.write(e.nodeid, o.fh, 1 << 30, b"x"), Err(libc::ENOSPC));
    assert_eq!(f.statfs(ROOT).unwrap().bfree, 0);
    // Writes past the maximum file size.
    assert_eq!(f.write(e.nodeid, o.fh, i64::MAX as u64, b"x"), Err(libc::EFBIG));
    assert_eq!(f.truncate(e.nodeid, u64::MAX), Err(libc::EFBIG));
    // Inode limit.
    f.mknod(ROOT, b"a", S_IFREG | 0o644, 0).unwrap();
    f.mknod(ROOT, b"b", S_IFREG | 0o644, 0).unwrap();
    assert_eq!(f.mknod(ROOT, b"c", S_IFREG | 0o644, 0), Err(libc::ENOSPC));
    // Freed on truncate.
    f.truncate(e.nodeid, 0).unwrap();
    assert_eq!(f.fs().used_bytes(), 0);
}

// RAM filesystem only: it counts the RAM filesystem's allocated bytes.
#[test]
fn fallocate_modes() {
    let f = Fuse::new();
    let (e, o) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    let fa = |mode: u32, offset: u64, length: u64| {
        let arg = abi::FallocateIn { fh: o.fh, offset, length, mode, padding: 0 };
        f.call(opcode::FALLOCATE, e.nodeid, &[vm_memory::ByteValued::as_slice(&arg)]).errno()
    };
    assert_eq!(fa(0, 0, 100_000), 0);
    assert_eq!(f.getattr(e.nodeid).unwrap().size, 100_000);
    assert!(f.fs().used_bytes() >= 100_000);
    assert_eq!(fa(libc::FALLOC_FL_KEEP_SIZE as u32, 0, 300_000), 0);
    assert_eq!(f.getattr(e.nodeid).unwrap().size, 100_000);
    f.write(e.nodeid, o.fh, 0, &[9u8; 100_000]).unwrap();
    let punch = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u32;
    assert_eq!(fa(punch, 10, 20), 0);
    let back = f.read(e.nodeid, o.fh, 0, 40).unwrap();
    assert_eq!(&back[..10], &[9u8; 10]);
    assert_eq!(&back[10..30], &[0u8; 20]);
    assert_eq!(&back[30..], &[9u8; 10]);
    // Punching a hole over an enormous sparse range only visits the chunks that exist.
    f.truncate(e.nodeid, 1 << 60).unwrap();
    f.write(e.nodeid, o.fh, 1 << 59, b"far").unwrap();
    let start = std::time::Instant::now();
    assert_eq!(fa(punch, 1, (1 << 60) - 2), 0);
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(f.read(e.nodeid, o.fh, 0, 2).unwrap(), [9, 0]);
    assert_eq!(f.read(e.nodeid, o.fh, 1 << 59, 3).unwrap(), [0, 0, 0]);
    assert!(f.fs().used_bytes() <= 64 << 10, "only the first chunk is left");
    assert_eq!(fa(0, 0, 0), libc::EINVAL);
    assert_eq!(fa(libc::FALLOC_FL_PUNCH_HOLE as u32, 0, 1), libc::EOPNOTSUPP);
}

// RAM filesystem only: the root's inode number is the node id only here.
#[test]
fn destroy_drops_references_and_reinit_works() {
    let f = Fuse::new();
    let (e, _o) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    f.unlink(ROOT, b"f").unwrap();
    assert!(f.fs().lookup_count(e.nodeid).is_some());
    let r = f.call(opcode::DESTROY, 0, &[]);
    assert_eq!((r.errno(), r.n), (0, HDR));
    assert_eq!(f.fs().lookup_count(e.nodeid), None, "unlinked inode freed on DESTROY");
    assert_eq!(f.getattr(ROOT), Err(libc::EIO), "no session after DESTROY");
    f.init(41, LINUX_FLAGS).unwrap();
    assert_eq!(f.getattr(ROOT).unwrap().ino, ROOT);
}

#[test]
fn concurrent_requests_from_several_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Server<RamFs>>();

    let f = Fuse::new();
    let setup: Vec<(u64, u64)> = (0..4)
        .map(|i| {
            let (e, o) = f.create(ROOT, format!("f{i}").as_bytes(), 0o644, O_RDWR | O_CREAT).unwrap();
            (e.nodeid, o.fh)
        })
        .collect();
    let srv = &f.srv;
    std::thread::scope(|s| {
        for (t, &(ino, fh)) in setup.iter().enumerate() {
            s.spawn(move || {
                for round in 0..20u64 {
                    let data = pattern(64 << 10, (t as u8) ^ round as u8);
                    let arg = abi::WriteIn {
                        fh,
                        offset: round * (64 << 10),
                        size: data.len() as u32,
                        ..Default::default()
                    };
                    let req = request(
                        opcode::WRITE,
                        ino,
                        round,
                        0,
                        0,
                        &[vm_memory::ByteValued::as_slice(&arg), &data],
                    );
                    assert_eq!(handle_raw(srv, &req, 4096, 64, 64).errno(), 0);
                    let rd = Fuse::read_in(fh, round * (64 << 10), 64 << 10);
                    let req =
                        request(opcode::READ, ino, round + 1, 0, 0, &[vm_memory::ByteValued::as_slice(&rd)]);
                    let r = handle_raw(srv, &req, 4096, HDR + (64 << 10), 4096);
                    assert_eq!(r.body, data);
                    // Namespace traffic in between.
                    let name = format!("t{t}-{round}");
                    let req = request(
                        opcode::MKNOD,
                        ROOT,
                        round + 2,
                        0,
                        0,
                        &[
                            vm_memory::ByteValued::as_slice(&abi::MknodIn {
                                mode: S_IFREG | 0o600,
                                ..Default::default()
                            }),
                            &cstr(name.as_bytes()),
                        ],
                    );
                    assert_eq!(handle_raw(srv, &req, 4096, 256, 256).errno(), 0);
                }
            });
        }
    });
    for &(ino, _) in &setup {
        assert_eq!(f.getattr(ino).unwrap().size, 20 * (64 << 10));
    }
    let fh = f.opendir(ROOT).unwrap();
    assert_eq!(f.readdir(ROOT, fh, 0, 65536).unwrap().len(), 2 + 4 + 80);
}

/// Per-request cost of the FUSE layer (run with `--release -- --ignored --nocapture`).
#[test]
#[ignore = "timing report, run by hand in release mode"]
fn per_request_cost() {
    let f = Fuse::new();
    let (e, o) = f.create(ROOT, b"bench", 0o644, O_RDWR | O_CREAT).unwrap();
    f.truncate(e.nodeid, 64 << 20).unwrap();
    let data = pattern(4096, 1);
    let mut wreq = f.req(
        opcode::WRITE,
        e.nodeid,
        &[
            vm_memory::ByteValued::as_slice(&abi::WriteIn { fh: o.fh, size: 4096, ..Default::default() }),
            &data,
        ],
    );
    let mut rreq =
        f.req(opcode::READ, e.nodeid, &[vm_memory::ByteValued::as_slice(&Fuse::read_in(o.fh, 0, 4096))]);
    let mut lreq = f.req(opcode::GETATTR, e.nodeid, &[&[0u8; 16]]);
    let mut reply = vec![0u8; HDR + 4096];
    let n = 200_000u64;
    for (name, req) in [("write 4k", &mut wreq), ("read 4k", &mut rreq), ("getattr", &mut lreq)] {
        let start = std::time::Instant::now();
        for i in 0..n {
            // Random-ish 4 KiB-aligned offsets within 64 MiB (offset field at 40 + 8).
            let off = (i.wrapping_mul(2654435761) % (16 << 10)) * 4096;
            if req.len() > 56 {
                req[48..56].copy_from_slice(&off.to_ne_bytes());
            }
            let rs = [vm_memory::VolatileSlice::from(&mut req[..])];
            let ws = [vm_memory::VolatileSlice::from(&mut reply[..])];
            assert!(harness::serve(&f.srv, &rs, &ws) >= HDR);
        }
        let per = start.elapsed().as_nanos() as f64 / n as f64;
        println!("{name}: {per:.0} ns/request");
    }
    assert_eq!(f.read(e.nodeid, o.fh, 0, 4096).unwrap(), data);
}

#[test]
fn cache_policy_sets_timeouts_and_open_flags() {
    use virtiofs_backend::filesystem::CachePolicy;
    use vm_memory::ByteValued;
    // (policy, entry/attr seconds, file FOPEN flags, dir FOPEN flags)
    let cases = [
        (CachePolicy::Never, 0, abi::fopen::DIRECT_IO, 0),
        (CachePolicy::Auto, 1, 0, 0),
        (CachePolicy::Always, 86_400, abi::fopen::KEEP_CACHE, abi::fopen::CACHE_DIR),
    ];
    for (cache, secs, file_flags, dir_flags) in cases {
        let f = Fuse::with_fs(RamFs::with_config(RamFsConfig { cache, ..Default::default() }));
        f.init(41, abi::init::ASYNC_READ).unwrap();
        let (entry, opened) = f.create(ROOT, b"f", S_IFREG | 0o644, libc::O_RDWR as u32).unwrap();
        assert_eq!((entry.entry_valid, entry.attr_valid), (secs, secs), "{cache}: CREATE timeouts");
        assert_eq!(opened.open_flags, file_flags, "{cache}: CREATE open flags");
        let looked = f.lookup(ROOT, b"f").unwrap();
        assert_eq!((looked.entry_valid, looked.attr_valid), (secs, secs), "{cache}: LOOKUP timeouts");
        let arg = abi::OpenIn { flags: libc::O_RDONLY as u32, open_flags: 0 };
        let out: abi::OpenOut =
            parse(&f.call(opcode::OPEN, entry.nodeid, &[arg.as_slice()]).result().unwrap());
        assert_eq!(out.open_flags, file_flags, "{cache}: OPEN flags");
        let arg = abi::OpenIn::default();
        let out: abi::OpenOut = parse(&f.call(opcode::OPENDIR, ROOT, &[arg.as_slice()]).result().unwrap());
        assert_eq!(out.open_flags, dir_flags, "{cache}: OPENDIR flags");
        let attr =
            f.call(opcode::GETATTR, entry.nodeid, &[abi::GetattrIn::default().as_slice()]).result().unwrap();
        let attr: abi::AttrOut = parse(&attr);
        assert_eq!(attr.attr_valid, secs, "{cache}: GETATTR timeout");
    }
    // The RAM filesystem caches for a day by default: only the guest changes it.
    assert_eq!(RamFsConfig::default().cache, CachePolicy::Always);
    assert_eq!("never".parse::<CachePolicy>(), Ok(CachePolicy::Never));
    assert!("sometimes".parse::<CachePolicy>().is_err());
}

both_backends!(rename_semantics, open_flags_and_handles, split_buffers_everywhere,);

/// Issue 11, "bounds": a guest that opens and never releases is held to `max_handles` (ENFILE,
/// nothing changed by the refused OPEN, not even an O_TRUNC), and a RELEASE makes room again.
#[test]
fn open_handles_are_bounded() {
    let cfg = RamFsConfig { max_handles: 4, ..Default::default() };
    let f = Fuse::with_fs(RamFs::with_config(cfg)).initialised();
    let (e, fh0) = f.create(ROOT, b"f", 0o644, libc::O_RDWR as u32).map(with_fh).unwrap();
    f.write(e.nodeid, fh0, 0, b"data").unwrap();
    let mut fhs = vec![fh0];
    for _ in 0..3 {
        fhs.push(f.open(e.nodeid, libc::O_RDONLY as u32).unwrap());
    }
    assert_eq!(f.open(e.nodeid, (libc::O_RDWR | libc::O_TRUNC) as u32).unwrap_err(), libc::ENFILE);
    assert_eq!(f.opendir(ROOT).unwrap_err(), libc::ENFILE);
    assert_eq!(f.create(ROOT, b"g", 0o644, libc::O_RDWR as u32).map(|_| ()).unwrap_err(), libc::ENFILE);
    assert_eq!(f.getattr(e.nodeid).unwrap().size, 4, "the refused O_TRUNC changed nothing");
    f.release(e.nodeid, fhs.pop().unwrap()).unwrap();
    let d = f.opendir(ROOT).unwrap();
    f.releasedir(ROOT, d).unwrap();
}
