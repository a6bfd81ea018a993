//! POSIX record locks, LSEEK (SEEK_DATA/SEEK_HOLE), COPY_FILE_RANGE, TMPFILE, STATX, SYNCFS,
//! FSYNCDIR, and the two ways of clearing set-user-id (HANDLE_KILLPRIV and _V2).

mod harness;

use harness::ram::Fuse;
use harness::*;
use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::ramfs::{RamFsConfig, MAX_COPY};
use virtiofs_backend::RamFs;

const S_IFREG: u32 = libc::S_IFREG;
const RD: i32 = libc::F_RDLCK;
const WR: i32 = libc::F_WRLCK;
const UN: i32 = libc::F_UNLCK;
const EOF: u64 = i64::MAX as u64;

const ALICE: (u32, u32) = (1000, 1000);
const BOB: (u32, u32) = (2000, 2000);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 10) as u8).collect()
}

fn posix_locks<F: TestFs>(f: &harness::Fuse<F>) {
    let (e, o) = f.create(ROOT, b"f", 0o666, O_RDWR | O_CREAT).unwrap();
    let (ino, fh) = (e.nodeid, o.fh);
    let ro = f.open(ino, O_RDONLY).unwrap();
    let wo = f.open(ino, O_WRONLY).unwrap();

    // Owner 1 write-locks 0..=99; owner 2 sees it and cannot lock over it.
    f.setlk(ino, fh, 1, WR, 0, 99).unwrap();
    let c = f.getlk(ino, fh, 2, RD, 50, 50).unwrap();
    assert_eq!((c.typ, c.start, c.end, c.pid), (WR as u32, 0, 99, 1));
    assert_eq!(f.setlk(ino, fh, 2, RD, 99, 200), Err(libc::EAGAIN));
    assert_eq!(f.getlk(ino, fh, 1, WR, 0, 99).unwrap().typ, UN as u32, "own locks do not conflict");
    let free = f.getlk(ino, fh, 2, WR, 100, EOF).unwrap();
    assert_eq!((free.typ, free.start, free.end), (UN as u32, 100, EOF));
    // Split: unlock the middle, owner 2 takes it.
    f.setlk(ino, fh, 1, UN, 40, 59).unwrap();
    f.setlk(ino, fh, 2, WR, 40, 59).unwrap();
    assert_eq!(f.getlk(ino, fh, 3, RD, 0, EOF).unwrap().start, 0);
    assert_eq!(f.getlk(ino, fh, 3, RD, 40, 45).unwrap().pid, 2);
    // Shared locks coexist; an exclusive one over them does not.
    f.setlk(ino, fh, 3, RD, 200, 300).unwrap();
    f.setlk(ino, fh, 4, RD, 250, 350).unwrap();
    assert_eq!(f.setlk(ino, fh, 5, WR, 300, 300), Err(libc::EAGAIN));
    // Through a synchronous `PollerEngine` on a server that cannot park requests (POSIX_LOCKS is not
    // offered), SETLKW cannot wait: a conflict is EAGAIN, else it locks.
    assert_eq!(f.lk(opcode::SETLKW, ino, fh, 5, WR, 300, 300).map(|_| ()), Err(libc::EAGAIN));
    f.lk(opcode::SETLKW, ino, fh, 5, WR, 400, 400).unwrap();

    // The handle's access mode: read locks need read access, write locks write access.
    assert_eq!(f.setlk(ino, wo, 6, RD, 1000, 1000), Err(libc::EBADF));
    assert_eq!(f.setlk(ino, ro, 6, WR, 1000, 1000), Err(libc::EBADF));
    f.setlk(ino, ro, 6, RD, 1000, 1000).unwrap();
    f.setlk(ino, wo, 7, WR, 2000, 2000).unwrap();

    assert_eq!(f.srv.locks().lock_count(), 8, "owner 1 holds two pieces, owners 2 to 7 one each");
    // FLUSH (a close) by owner 3 drops its locks; RELEASE of the last handle drops all.
    let flush = abi::FlushIn { fh: ro, lock_owner: 3, ..Default::default() };
    assert_eq!(f.call(opcode::FLUSH, ino, &[vm_memory::ByteValued::as_slice(&flush)]).errno(), 0);
    assert_eq!(f.getlk(ino, fh, 9, WR, 200, 249).unwrap().typ, UN as u32);
    assert_eq!(f.getlk(ino, fh, 9, WR, 250, 250).unwrap().pid, 4);
    let rel = abi::ReleaseIn { fh: wo, lock_owner: 7, ..Default::default() };
    assert_eq!(f.call(opcode::RELEASE, ino, &[vm_memory::ByteValued::as_slice(&rel)]).errno(), 0);
    assert_eq!(f.getlk(ino, fh, 9, WR, 2000, 2000).unwrap().typ, UN as u32, "owner 7 released");
    f.release(ino, ro).unwrap();
    assert_ne!(f.getlk(ino, fh, 9, WR, 0, EOF).unwrap().typ, UN as u32, "a handle is still open");
    f.release(ino, fh).unwrap();
    let fh = f.open(ino, O_RDWR).unwrap();
    assert_eq!(f.getlk(ino, fh, 9, WR, 0, EOF).unwrap().typ, UN as u32, "the last release dropped all");
    assert_eq!(f.srv.locks().lock_count(), 0);

    // Malformed: bad type, start past end, past OFFSET_MAX, GETLK of F_UNLCK, unknown flags,
    // GETLK of a flock lock, directories.
    assert_eq!(f.setlk(ino, fh, 1, 7, 0, 1), Err(libc::EINVAL));
    assert_eq!(f.setlk(ino, fh, 1, RD, 5, 4), Err(libc::EINVAL));
    assert_eq!(f.setlk(ino, fh, 1, RD, 5, EOF + 1), Err(libc::EINVAL));
    assert_eq!(f.getlk(ino, fh, 1, UN, 0, 1), Err(libc::EINVAL));
    let flk = |op: u32, lk_flags: u32, typ: i32| {
        let arg = abi::LkIn {
            fh,
            owner: 1,
            lk: abi::FileLock { typ: typ as u32, end: EOF, ..Default::default() },
            lk_flags,
            padding: 0,
        };
        f.call(op, ino, &[vm_memory::ByteValued::as_slice(&arg)]).errno()
    };
    assert_eq!(flk(opcode::SETLK, 2, RD), libc::EINVAL);
    assert_eq!(flk(opcode::SETLK, abi::LK_FLOCK | 4, RD), libc::EINVAL);
    assert_eq!(flk(opcode::GETLK, abi::LK_FLOCK, RD), libc::EINVAL);
    // flock(2) through FUSE_LK_FLOCK: whole-file, owned by the handle, apart from POSIX locks.
    assert_eq!(flk(opcode::SETLK, abi::LK_FLOCK, WR), 0);
    assert_eq!(f.getlk(ino, fh, 9, WR, 0, EOF).unwrap().typ, UN as u32, "flock is not a POSIX lock");
    assert_eq!(f.srv.locks().lock_count(), 1);
    assert_eq!(flk(opcode::SETLK, abi::LK_FLOCK, UN), 0);
    assert_eq!(f.srv.locks().lock_count(), 0);
    let dfh = f.opendir(ROOT).unwrap();
    assert_eq!(f.setlk(ROOT, dfh, 1, RD, 0, 1), Err(libc::EINVAL));
    assert_eq!(f.setlk(ino, 9999, 1, RD, 0, 1), Err(libc::EBADF));
}

// RAM filesystem only: data and holes come in 64 KiB chunks here, in host blocks there.
#[test]
fn lseek_data_and_holes() {
    let f = Fuse::new();
    let (e, o) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    let (ino, fh) = (e.nodeid, o.fh);
    const C: u64 = 64 << 10;
    // Data in chunks 1 and 2, a hole in chunk 0 and from chunk 3 to the end (size 5 chunks + 10).
    f.write(ino, fh, C + 5, b"data").unwrap();
    f.write(ino, fh, 2 * C, b"more").unwrap();
    f.truncate(ino, 5 * C + 10).unwrap();
    let (d, h) = (libc::SEEK_DATA, libc::SEEK_HOLE);
    assert_eq!(f.lseek(ino, fh, 0, d).unwrap(), C);
    assert_eq!(f.lseek(ino, fh, C + 100, d).unwrap(), C + 100);
    assert_eq!(f.lseek(ino, fh, 0, h).unwrap(), 0);
    assert_eq!(f.lseek(ino, fh, C, h).unwrap(), 3 * C);
    assert_eq!(f.lseek(ino, fh, 3 * C + 1, h).unwrap(), 3 * C + 1);
    // A trailing hole: no data after it; past the end: ENXIO for both.
    assert_eq!(f.lseek(ino, fh, 3 * C, d), Err(libc::ENXIO));
    assert_eq!(f.lseek(ino, fh, 5 * C + 10, h), Err(libc::ENXIO));
    assert_eq!(f.lseek(ino, fh, 5 * C + 10, d), Err(libc::ENXIO));
    assert_eq!(f.lseek(ino, fh, u64::MAX, d), Err(libc::ENXIO), "negative offsets too");
    // The end of the file counts as a hole even inside an allocated chunk.
    f.write(ino, fh, 5 * C, b"tail").unwrap();
    assert_eq!(f.lseek(ino, fh, 5 * C, h).unwrap(), 5 * C + 10);
    // Space preallocated past the end (KEEP_SIZE) is not data.
    let fa =
        abi::FallocateIn { fh, offset: 6 * C, length: C, mode: libc::FALLOC_FL_KEEP_SIZE as u32, padding: 0 };
    assert_eq!(f.call(opcode::FALLOCATE, ino, &[vm_memory::ByteValued::as_slice(&fa)]).errno(), 0);
    assert_eq!(f.lseek(ino, fh, 3 * C, d).unwrap(), 5 * C);
    // SEEK_SET/CUR/END.
    assert_eq!(f.lseek(ino, fh, 7, libc::SEEK_SET).unwrap(), 7);
    assert_eq!(f.lseek(ino, fh, 7, libc::SEEK_CUR).unwrap(), 7);
    assert_eq!(f.lseek(ino, fh, (-10i64) as u64, libc::SEEK_END).unwrap(), 5 * C);
    assert_eq!(f.lseek(ino, fh, (-1i64) as u64, libc::SEEK_SET), Err(libc::EINVAL));
    assert_eq!(f.lseek(ino, fh, (-(6 * C as i64)) as u64, libc::SEEK_END), Err(libc::EINVAL));
    assert_eq!(f.lseek(ino, fh, i64::MAX as u64, libc::SEEK_END), Err(libc::EINVAL), "overflow");
    assert_eq!(f.lseek(ino, fh, 0, 5), Err(libc::EINVAL), "unknown whence");
    let dfh = f.opendir(ROOT).unwrap();
    assert_eq!(f.lseek(ROOT, dfh, 0, d), Err(libc::EINVAL));
    assert_eq!(f.lseek(ino, 4242, 0, d), Err(libc::EBADF));
    // An empty file: everything is past the end.
    let (e2, o2) = f.create(ROOT, b"empty", 0o644, O_RDWR | O_CREAT).unwrap();
    assert_eq!(f.lseek(e2.nodeid, o2.fh, 0, h), Err(libc::ENXIO));
}

// RAM filesystem only: it counts allocated bytes and the RAM filesystem's MAX_COPY.
#[test]
fn copy_file_range_between_and_within_files() {
    let f = Fuse::new();
    let (a, ao) = f.create(ROOT, b"a", 0o644, O_RDWR | O_CREAT).unwrap();
    let (b, bo) = f.create(ROOT, b"b", 0o644, O_RDWR | O_CREAT).unwrap();
    let data = pattern(300_000, 1);
    f.write(a.nodeid, ao.fh, 0, &data).unwrap();
    // Misaligned offsets across chunk boundaries.
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 1000, b.nodeid, bo.fh, 70_001, 200_000).unwrap(), 200_000);
    let back = f.read(b.nodeid, bo.fh, 0, 300_000).unwrap();
    assert_eq!(back.len(), 270_001);
    assert!(back[..70_001].iter().all(|&x| x == 0));
    assert_eq!(&back[70_001..], &data[1000..201_000]);
    // Short at the end of the source; nothing past it.
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 299_000, b.nodeid, bo.fh, 0, 5000).unwrap(), 1000);
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 400_000, b.nodeid, bo.fh, 0, 5000).unwrap(), 0);
    // The other direction too (locks taken in inode order).
    assert_eq!(f.copy_file_range(b.nodeid, bo.fh, 70_001, a.nodeid, ao.fh, 0, 10).unwrap(), 10);
    assert_eq!(f.read(a.nodeid, ao.fh, 0, 10).unwrap(), &data[1000..1010]);

    // Within one file: non-overlapping ranges are fine, overlapping ones EINVAL.
    let before = f.read(a.nodeid, ao.fh, 0, 300_000).unwrap();
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 0, a.nodeid, ao.fh, 150_000, 100_000).unwrap(), 100_000);
    let after = f.read(a.nodeid, ao.fh, 0, 300_000).unwrap();
    assert_eq!(&after[150_000..250_000], &before[..100_000]);
    assert_eq!(&after[..150_000], &before[..150_000]);
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 0, a.nodeid, ao.fh, 99, 100), Err(libc::EINVAL));
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 100, a.nodeid, ao.fh, 0, 101), Err(libc::EINVAL));
    // Within one chunk.
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 10, a.nodeid, ao.fh, 30, 20).unwrap(), 20);
    let now = f.read(a.nodeid, ao.fh, 0, 50).unwrap();
    assert_eq!(&now[30..50], &after[10..30]);

    // Holes stay holes: copying a hole over data zeroes it without allocating.
    let (s, so) = f.create(ROOT, b"sparse", 0o644, O_RDWR | O_CREAT).unwrap();
    f.truncate(s.nodeid, 10 << 20).unwrap();
    let used = f.fs().used_bytes();
    assert_eq!(f.copy_file_range(s.nodeid, so.fh, 0, b.nodeid, bo.fh, 1 << 20, 8 << 20).unwrap(), 8 << 20);
    assert_eq!(f.fs().used_bytes(), used, "no chunks for holes");
    assert!(f.read(b.nodeid, bo.fh, 70_001, 100).unwrap().iter().any(|&x| x != 0));
    f.truncate(s.nodeid, 0).unwrap();
    f.truncate(s.nodeid, 1 << 20).unwrap();
    assert_eq!(f.copy_file_range(s.nodeid, so.fh, 0, b.nodeid, bo.fh, 0, 200_000).unwrap(), 200_000);
    assert!(f.read(b.nodeid, bo.fh, 0, 200_000).unwrap().iter().all(|&x| x == 0));

    // At most MAX_COPY per request.
    f.truncate(s.nodeid, 2 * MAX_COPY).unwrap();
    assert_eq!(
        f.copy_file_range(s.nodeid, so.fh, 0, b.nodeid, bo.fh, 0, 2 * MAX_COPY).unwrap() as u64,
        MAX_COPY
    );

    // Access modes, kinds, flags, limits.
    let ro = f.open(b.nodeid, O_RDONLY).unwrap();
    let wo = f.open(a.nodeid, O_WRONLY).unwrap();
    let app = f.open(b.nodeid, O_WRONLY | libc::O_APPEND as u32).unwrap();
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 0, b.nodeid, ro, 0, 1), Err(libc::EBADF));
    assert_eq!(f.copy_file_range(a.nodeid, wo, 0, b.nodeid, bo.fh, 0, 1), Err(libc::EBADF));
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 0, b.nodeid, app, 0, 1), Err(libc::EBADF));
    let dfh = f.opendir(ROOT).unwrap();
    assert_eq!(f.copy_file_range(ROOT, dfh, 0, b.nodeid, bo.fh, 0, 1), Err(libc::EISDIR));
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 0, ROOT, dfh, 0, 1), Err(libc::EISDIR));
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 0, b.nodeid, 4242, 0, 1), Err(libc::EBADF));
    assert_eq!(
        f.copy_file_range(a.nodeid, ao.fh, 0, a.nodeid, bo.fh, 0, 1),
        Err(libc::EBADF),
        "fh of another node"
    );
    let arg = abi::CopyFileRangeIn {
        fh_in: ao.fh,
        nodeid_out: b.nodeid,
        fh_out: bo.fh,
        len: 1,
        flags: 1,
        ..Default::default()
    };
    assert_eq!(
        f.call(opcode::COPY_FILE_RANGE, a.nodeid, &[vm_memory::ByteValued::as_slice(&arg)]).errno(),
        libc::EINVAL
    );
    assert_eq!(
        f.copy_file_range(a.nodeid, ao.fh, u64::MAX - 5, b.nodeid, bo.fh, 0, 1),
        Err(libc::EINVAL),
        "negative"
    );
    assert_eq!(
        f.copy_file_range(a.nodeid, ao.fh, u64::MAX - 5, b.nodeid, bo.fh, 0, 10),
        Err(libc::EOVERFLOW)
    );
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 0, b.nodeid, bo.fh, i64::MAX as u64 - 5, 10), Ok(5));
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 0, b.nodeid, bo.fh, i64::MAX as u64, 10), Err(libc::EFBIG));
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 1, b.nodeid, bo.fh, 0, u64::MAX), Err(libc::EOVERFLOW));
}

fn copy_file_range_updates_times_and_clears_setuid<F: TestFs>(f: &harness::Fuse<F>) {
    let d = f.mkdir(ROOT, b"d", 0o777).unwrap().nodeid;
    let (a, ao) = f.create(d, b"a", 0o644, O_RDWR | O_CREAT).unwrap();
    f.write(a.nodeid, ao.fh, 0, b"hello").unwrap();
    let b = f.mknod(d, b"b", S_IFREG | 0o6777, 0).unwrap().nodeid;
    f.as_user(BOB.0, BOB.1);
    let bo = f.open(b, O_WRONLY).unwrap();
    let ai = f.open(a.nodeid, O_RDONLY).unwrap();
    let before = f.getattr(b).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(f.copy_file_range(a.nodeid, ai, 0, b, bo, 3, 5).unwrap(), 5);
    let after = f.getattr(b).unwrap();
    assert_eq!(after.size, 8);
    assert!((after.mtime, after.mtimensec) > (before.mtime, before.mtimensec));
    assert!((after.ctime, after.ctimensec) > (before.ctime, before.ctimensec));
    assert_eq!(after.mode & 0o7777, 0o0777, "a copy by a non-root caller clears set-user-id, set-group-id");
    // The capacity: a full filesystem gives ENOSPC when nothing could be copied.
    let cfg = RamFsConfig { capacity: 64 << 10, ..Default::default() };
    let f = Fuse::with_fs(RamFs::with_config(cfg));
    f.init(41, LINUX_FLAGS).unwrap();
    let (a, ao) = f.create(ROOT, b"a", 0o644, O_RDWR | O_CREAT).unwrap();
    let (b, bo) = f.create(ROOT, b"b", 0o644, O_RDWR | O_CREAT).unwrap();
    f.write(a.nodeid, ao.fh, 0, &[1u8; 100]).unwrap();
    assert_eq!(f.copy_file_range(a.nodeid, ao.fh, 0, b.nodeid, bo.fh, 0, 100), Err(libc::ENOSPC));
    assert_eq!(f.getattr(b.nodeid).unwrap().size, 0);
}

fn tmpfile_is_unnamed_until_linked<F: TestFs>(f: &harness::Fuse<F>) {
    let d = f.mkdir(ROOT, b"d", 0o777).unwrap().nodeid;
    let before = f.getattr(d).unwrap();
    f.as_user(ALICE.0, ALICE.1);
    let (e, o) = f.tmpfile(d, 0o666, O_RDWR, 0o022).unwrap();
    assert_eq!((e.attr.mode, e.attr.nlink), (S_IFREG | 0o644, 0));
    assert_eq!((e.attr.uid, e.attr.gid), ALICE);
    let dfh = f.opendir(d).unwrap();
    assert_eq!(f.readdir(d, dfh, 0, 4096).unwrap().len(), 2, "no name");
    let after = f.getattr(d).unwrap();
    assert_eq!(
        (after.mtime, after.mtimensec),
        (before.mtime, before.mtimensec),
        "the directory is unchanged"
    );
    f.write(e.nodeid, o.fh, 0, b"content").unwrap();
    // Linked: an ordinary file from now on.
    let l = f.link(e.nodeid, d, b"named").unwrap();
    assert_eq!(l.attr.nlink, 1);
    assert_eq!(f.lookup(d, b"named").unwrap().nodeid, e.nodeid);
    f.release(e.nodeid, o.fh).unwrap();
    f.unlink(d, b"named").unwrap();
    assert_eq!(f.link(e.nodeid, d, b"again"), Err(libc::ENOENT), "a removed file cannot come back");

    // O_EXCL: never linkable; unlinked and unreferenced, it goes away.
    let (x, xo) = f.tmpfile(d, 0o600, O_RDWR | O_EXCL, 0).unwrap();
    f.write(x.nodeid, xo.fh, 0, &[1u8; 1000]).unwrap();
    assert_eq!(f.link(x.nodeid, d, b"x"), Err(libc::ENOENT));
    f.release(x.nodeid, xo.fh).unwrap();
    f.forget(x.nodeid, 1);
    assert_eq!(f.fs().lookup_count(x.nodeid), None);
    // Permissions and arguments.
    assert_eq!(f.tmpfile(d, 0o600, O_RDONLY, 0).unwrap_err(), libc::EINVAL, "needs write access");
    assert_eq!(f.tmpfile(ROOT, 0o600, O_RDWR, 0).unwrap_err(), libc::EACCES, "root's 0755 directory");
    assert_eq!(f.tmpfile(x.nodeid, 0o600, O_RDWR, 0).unwrap_err(), libc::ENOENT);
    assert_eq!(f.tmpfile(e.nodeid, 0o600, O_RDWR, 0).unwrap_err(), libc::ENOTDIR);
    let arg = abi::CreateIn { flags: O_RDWR, mode: 0o600, umask: 0, open_flags: 0 };
    let r = f.call(opcode::TMPFILE, d, &[vm_memory::ByteValued::as_slice(&arg), b"/"]);
    assert_eq!(r.errno(), libc::EINVAL, "name without NUL");
    let r = f.call(opcode::TMPFILE, d, &[&vm_memory::ByteValued::as_slice(&arg)[..15]]);
    assert_eq!(r.errno(), libc::EINVAL, "truncated");
}

// RAM filesystem only: inode numbers are node ids only here.
#[test]
fn statx_syncfs_fsyncdir() {
    let f = Fuse::new();
    let chr = f.mknod(ROOT, b"c", libc::S_IFCHR | 0o600, libc::makedev(259, 300) as u32 & 0xfffff).unwrap();
    let sx = f.statx(chr.nodeid).unwrap();
    let st = sx.stat;
    assert_eq!(st.mask & abi::statx::BASIC_STATS, abi::statx::BASIC_STATS);
    assert_ne!(st.mask & abi::statx::BTIME, 0);
    assert_eq!(u32::from(st.mode), libc::S_IFCHR | 0o600);
    assert_eq!((st.ino, st.nlink, st.uid, st.gid), (chr.nodeid, 1, 0, 0));
    assert_eq!(st.rdev_major, (chr.attr.rdev & 0xfff00) >> 8);
    assert_eq!(st.rdev_minor, (chr.attr.rdev & 0xff) | ((chr.attr.rdev >> 12) & 0xfff00));
    assert_eq!((st.btime.tv_sec as u64, st.btime.tv_nsec), (chr.attr.ctime, chr.attr.ctimensec));
    assert_eq!((st.mtime.tv_sec as u64, st.mtime.tv_nsec), (chr.attr.mtime, chr.attr.mtimensec));
    // btime never changes.
    std::thread::sleep(std::time::Duration::from_millis(5));
    f.chmod(chr.nodeid, 0o644).unwrap();
    let again = f.statx(chr.nodeid).unwrap().stat;
    assert_eq!(again.btime, st.btime);
    assert_ne!(again.ctime, st.ctime);
    assert_eq!(f.statx(4242).unwrap_err(), libc::ENOENT);
    assert_eq!(f.call(opcode::STATX, ROOT, &[&[0u8; 23]]).errno(), libc::EINVAL);

    let r = f.call(opcode::SYNCFS, ROOT, &[&[0u8; 8]]);
    assert_eq!((r.errno(), r.n), (0, HDR));
    assert_eq!(f.call(opcode::SYNCFS, ROOT, &[&[0u8; 7]]).errno(), libc::EINVAL);
    let dfh = f.opendir(ROOT).unwrap();
    let arg = abi::FsyncIn { fh: dfh, fsync_flags: 0, padding: 0 };
    assert_eq!(f.call(opcode::FSYNCDIR, ROOT, &[vm_memory::ByteValued::as_slice(&arg)]).errno(), 0);
    let arg = abi::FsyncIn { fh: 4242, fsync_flags: 0, padding: 0 };
    assert_eq!(f.call(opcode::FSYNCDIR, ROOT, &[vm_memory::ByteValued::as_slice(&arg)]).errno(), libc::EBADF);
}

/// The kernel's say on clearing set-user-id (HANDLE_KILLPRIV_V2) against our guess from the uid
/// (HANDLE_KILLPRIV).
// RAM filesystem only: two sessions with different INIT offers.
#[test]
fn killpriv_v1_and_v2() {
    let raw_write = |f: &Fuse, ino, fh, write_flags| {
        let arg = abi::WriteIn { fh, offset: 0, size: 1, write_flags, ..Default::default() };
        f.call(opcode::WRITE, ino, &[vm_memory::ByteValued::as_slice(&arg), b"x"]).result().map(|_| ())
    };
    let mode = |f: &Fuse, ino| f.as_user(0, 0).getattr(ino).unwrap().mode & 0o7777;
    for v2 in [false, true] {
        let f = Fuse::uninit();
        let flags = if v2 { LINUX_FLAGS } else { OLD_FLAGS };
        let out = f.init(41, flags).unwrap();
        let got = u64::from(out.flags) | u64::from(out.flags2) << 32;
        assert_eq!(got & abi::init::HANDLE_KILLPRIV_V2 != 0, v2);
        assert_ne!(got & abi::init::HANDLE_KILLPRIV, 0);
        let (e, o) = f.create(ROOT, b"f", 0o6777, O_RDWR | O_CREAT).unwrap();
        let ino = e.nodeid;
        // A non-root writer with no flag: only V1 clears (it cannot know about CAP_FSETID).
        let bfh = f.as_user(BOB.0, BOB.1).open(ino, O_RDWR).unwrap();
        raw_write(&f, ino, bfh, 0).unwrap();
        assert_eq!(mode(&f, ino), if v2 { 0o6777 } else { 0o0777 }, "v2={v2}");
        // Root with the flag (no CAP_FSETID): both clear.
        f.chmod(ino, 0o6777).unwrap();
        raw_write(&f, ino, o.fh, abi::write_flags::KILL_SUIDGID).unwrap();
        assert_eq!(mode(&f, ino), 0o0777, "v2={v2}");
        // Truncate: the same rule through FATTR_KILL_SUIDGID.
        f.chmod(ino, 0o6777).unwrap();
        let trunc = abi::SetattrIn { valid: abi::fattr::SIZE, size: 0, ..Default::default() };
        f.as_user(BOB.0, BOB.1).setattr(ino, trunc).unwrap();
        assert_eq!(mode(&f, ino), if v2 { 0o6777 } else { 0o0777 }, "v2={v2}");
        let kill = abi::SetattrIn { valid: abi::fattr::SIZE | abi::fattr::KILL_SUIDGID, ..trunc };
        f.as_user(0, 0).chmod(ino, 0o6777).unwrap();
        f.setattr(ino, kill).unwrap();
        assert_eq!(mode(&f, ino), 0o0777, "v2={v2}: root without CAP_FSETID");
        // O_TRUNC with FUSE_OPEN_KILL_SUIDGID.
        f.chmod(ino, 0o6777).unwrap();
        let arg = abi::OpenIn { flags: O_WRONLY | O_TRUNC, open_flags: abi::OPEN_KILL_SUIDGID };
        let r = f.call(opcode::OPEN, ino, &[vm_memory::ByteValued::as_slice(&arg)]);
        assert_eq!(r.errno(), 0);
        assert_eq!(mode(&f, ino), 0o0777, "v2={v2}");
        // Root's plain write never clears.
        f.chmod(ino, 0o6777).unwrap();
        raw_write(&f, ino, o.fh, 0).unwrap();
        assert_eq!(mode(&f, ino), 0o6777);
        // Chown of a file clears set-user-id whoever asks, in both modes.
        f.chown(ino, Some(ALICE.0), None).unwrap();
        assert_eq!(mode(&f, ino), 0o0777);
    }
}

fn fallocate_updates_times_and_clears_setuid<F: TestFs>(f: &harness::Fuse<F>) {
    let d = f.mkdir(ROOT, b"d", 0o777).unwrap().nodeid;
    let ino = f.mknod(d, b"f", S_IFREG | 0o6777, 0).unwrap().nodeid;
    f.as_user(ALICE.0, ALICE.1);
    let fh = f.open(ino, O_RDWR).unwrap();
    f.write(ino, fh, 0, &[1u8; 100]).unwrap();
    f.as_user(0, 0).chmod(ino, 0o6777).unwrap();
    f.as_user(ALICE.0, ALICE.1);
    let before = f.getattr(ino).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    // Inside the file: size unchanged, but a modification all the same.
    let fa = abi::FallocateIn { fh, offset: 0, length: 10, mode: 0, padding: 0 };
    assert_eq!(f.call(opcode::FALLOCATE, ino, &[vm_memory::ByteValued::as_slice(&fa)]).errno(), 0);
    let after = f.getattr(ino).unwrap();
    assert_eq!(after.size, 100);
    assert!((after.ctime, after.ctimensec) > (before.ctime, before.ctimensec));
    assert!((after.mtime, after.mtimensec) > (before.mtime, before.mtimensec));
    assert_eq!(after.mode & 0o7777, 0o0777);
    // A failed fallocate changes nothing.
    f.as_user(0, 0).chmod(ino, 0o6777).unwrap();
    let before = f.getattr(ino).unwrap();
    let bad = abi::FallocateIn { length: 0, ..fa };
    assert_eq!(
        f.call(opcode::FALLOCATE, ino, &[vm_memory::ByteValued::as_slice(&bad)]).errno(),
        libc::EINVAL
    );
    assert_eq!(f.getattr(ino).unwrap(), before);
    let _ = ALICE;
}

both_backends!(posix_locks);

both_backends!(
    as_root:
    copy_file_range_updates_times_and_clears_setuid,
    tmpfile_is_unnamed_until_linked,
    fallocate_updates_times_and_clears_setuid,
);

/// Issue 22's ground: the RAM filesystem's file data lives in a memfd that another process can
/// be given and map (`RamFs::data_memfd`): what a guest wrote is found there, in 64 KiB
/// chunks, without a copy; the memfd is sparse (only written chunks take memory) and the
/// memory goes back when the file does.
#[test]
fn ramfs_file_data_lives_in_a_memfd() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let f = harness::ram::Fuse::new();
    let memfd = std::fs::File::from(f.fs().data_memfd().try_clone_to_owned().unwrap());
    let blocks = || memfd.metadata().unwrap().blocks();
    assert_eq!(blocks(), 0);
    let (e, fh) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).map(with_fh).unwrap();
    // Two chunks far apart: at most 2 x 64 KiB of memory (the pages written), whatever the
    // file's size.
    f.write(e.nodeid, fh, 0, b"first chunk").unwrap();
    f.write(e.nodeid, fh, 100 << 20, b"another chunk").unwrap();
    assert!(blocks() > 0 && blocks() <= 2 * (64 << 10) / 512, "{} blocks", blocks());
    let mut found = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    for off in (0..memfd.metadata().unwrap().len()).step_by(64 << 10) {
        memfd.read_exact_at(&mut buf, off).unwrap();
        for needle in [&b"first chunk"[..], b"another chunk"] {
            if buf.starts_with(needle) {
                found.push(needle);
            }
        }
        if found.len() == 2 {
            break;
        }
    }
    assert_eq!(found.len(), 2, "the file's data is not in the memfd");
    f.release(e.nodeid, fh).unwrap();
    f.unlink(ROOT, b"f").unwrap();
    f.forget(e.nodeid, 1);
    assert_eq!(blocks(), 0, "the deleted file's memory stays taken");
}

/// Issue 22: a RAM filesystem taken over by another (`RamFs::save`, through JSON, and
/// `RamFs::restore` on a duplicate of its memfd) with its FUSE session (`save_session`,
/// `restore_session`: no new INIT, the locks held) has the same names with the same READDIR
/// cookies, attributes, symlinks, extended attributes, file data (read without a copy having
/// been made: the data is the memfd's) and open handles, and goes on allocating and freeing
/// chunks; a state that contradicts itself or the limits is refused.
#[test]
fn ramfs_taken_over_from_its_state_and_memfd_is_the_same_filesystem() {
    use virtiofs_backend::ramfs::state::{BodyState, RamFsState};
    let f = Fuse::new();
    let d = f.mkdir(ROOT, b"dir", 0o755).unwrap();
    let (e, fh) = f.create(d.nodeid, b"file", 0o640, O_RDWR | O_CREAT).map(with_fh).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    f.write(e.nodeid, fh, 0, &data).unwrap();
    f.write(e.nodeid, fh, 10 << 20, b"far away").unwrap();
    let s = f.symlink(d.nodeid, b"link", b"file").unwrap();
    f.setxattr(e.nodeid, b"user.tag", b"value", 0).unwrap();
    for n in 0..20 {
        f.mkdir(d.nodeid, format!("sub{n}").as_bytes(), 0o700).unwrap();
    }
    f.rmdir(d.nodeid, b"sub3").unwrap();
    let dh = f.opendir(d.nodeid).unwrap();
    let listing = |f: &Fuse, dh| f.readdir(d.nodeid, dh, 0, 1 << 16).unwrap();
    let before = listing(&f, dh);
    let attrs =
        |f: &Fuse| [f.getattr(d.nodeid).unwrap(), f.getattr(e.nodeid).unwrap(), f.getattr(s.nodeid).unwrap()];
    let attrs_before = attrs(&f);

    // A lock held: a POSIX write lock of owner 1.
    f.setlk(e.nodeid, fh, 1, WR, 0, 99).unwrap();

    let state = f.fs().save();
    let json = serde_json::to_string(&state).unwrap();
    let state: RamFsState = serde_json::from_str(&json).unwrap();
    let session = f.srv.save_session();
    let session: virtiofs_backend::server::SessionState =
        serde_json::from_str(&serde_json::to_string(&session).unwrap()).unwrap();
    let memfd = || std::fs::File::from(f.fs().data_memfd().try_clone_to_owned().unwrap());
    // The taker's session goes on without INIT, its locks held.
    let g = RamFs::restore(RamFsConfig::default(), &state, memfd()).unwrap();
    g.take_data_back(); // the commit
    let g = Fuse::with_fs(g);
    g.srv.restore_session(&session).unwrap();
    assert!(g.srv.restore_session(&session).is_err(), "a session restored twice");
    let c = g.getlk(e.nodeid, fh, 2, RD, 50, 50).unwrap();
    assert_eq!((c.typ, c.start, c.end), (WR as u32, 0, 99), "owner 1's lock is held");
    assert_eq!(g.setlk(e.nodeid, fh, 2, RD, 0, 0), Err(libc::EAGAIN));
    assert_eq!(g.srv.locks().lock_count(), 1);
    assert_eq!(listing(&g, dh), before, "the listing and its cookies");
    assert_eq!(attrs(&g), attrs_before);
    assert_eq!(g.readlink(s.nodeid).unwrap(), b"file");
    assert_eq!(g.getxattr(e.nodeid, b"user.tag", 64).unwrap(), Xattr::Data(b"value".to_vec()));
    // The open handle reads the data, hole and far chunk included.
    assert_eq!(g.read(e.nodeid, fh, 0, 200_000).unwrap(), data);
    assert_eq!(g.read(e.nodeid, fh, (10 << 20) - 4, 12).unwrap(), b"\0\0\0\0far away");
    // It goes on: new data, a file removed and its chunks freed.
    let (e2, fh2) = g.create(ROOT, b"new", 0o644, O_RDWR | O_CREAT).map(with_fh).unwrap();
    g.write(e2.nodeid, fh2, 0, &data).unwrap();
    assert_eq!(g.read(e2.nodeid, fh2, 0, 200_000).unwrap(), data);
    assert_eq!(g.read(e.nodeid, fh, 0, 200_000).unwrap(), data, "a new file's chunks took no slot in use");
    g.release(e.nodeid, fh).unwrap();
    g.unlink(d.nodeid, b"file").unwrap();
    assert!(g.lookup(d.nodeid, b"file").is_err());

    // Refused: another version, other limits, a slot owned twice, a name of no inode.
    let refused = |s: &RamFsState, cfg: RamFsConfig| RamFs::restore(cfg, s, memfd()).is_err();
    let mut bad = state.clone();
    bad.version += 1;
    assert!(refused(&bad, RamFsConfig::default()));
    assert!(refused(&state, RamFsConfig { capacity: 1 << 20, ..RamFsConfig::default() }));
    let mut bad = state.clone();
    let file =
        bad.inodes.iter_mut().find(|i| matches!(i.body, BodyState::File(ref c) if c.len() > 1)).unwrap();
    if let BodyState::File(c) = &mut file.body {
        // Written in order, the first 200,000 bytes are one run of 4 chunks; the far chunk
        // another.
        assert_eq!((c.len(), c[0].0, c[0].2, c[1].0, c[1].2), (2, 0, 4, 160, 1), "{c:?}");
        c[1].1 = c[0].1;
    }
    assert!(refused(&bad, RamFsConfig::default()));
    // Runs that are empty, or that overflow the chunk indices or the slots.
    for run in [(0, 0, 0), (u64::MAX, 0, 2), (0, u32::MAX, 2)] {
        let mut bad = state.clone();
        let file = bad.inodes.iter_mut().find(|i| matches!(i.body, BodyState::File(_))).unwrap();
        file.body = BodyState::File(vec![run]);
        assert!(refused(&bad, RamFsConfig::default()), "{run:?}");
    }
    let mut bad = state.clone();
    bad.dirs[0].entries.push((b"ghost".to_vec(), 1, 999_999, 8));
    assert!(refused(&bad, RamFsConfig::default()));
}

/// The session kept for a crash follows the locks a FLUSH and a RELEASE end: a lock taken is
/// in the record, and gone from it once the FLUSH of its owner (or the RELEASE of its file)
/// ends it; FLUSHes and RELEASEs of files never locked leave it as it is.
#[test]
fn the_session_record_follows_the_locks_flush_and_release_end() {
    use std::sync::Arc;
    use virtiofs_backend::session_record::SessionRecord;
    let f = Fuse::new();
    let record = Arc::new(SessionRecord::new().unwrap());
    f.srv.keep_session(record.clone());
    let locks = || record.read().unwrap().expect("a session is kept").locks.len();
    let (e, o) = f.create(ROOT, b"locked", 0o666, O_RDWR | O_CREAT).unwrap();
    let (other, other_fh) = with_fh(f.create(ROOT, b"plain", 0o666, O_RDWR | O_CREAT).unwrap());
    f.setlk(e.nodeid, o.fh, 0, WR, 0, 99).unwrap();
    assert_eq!(locks(), 1);
    f.flush(other.nodeid, other_fh).unwrap();
    f.release(other.nodeid, other_fh).unwrap();
    assert_eq!(locks(), 1, "another file's FLUSH and RELEASE end no lock");
    f.flush(e.nodeid, o.fh).unwrap();
    assert_eq!(locks(), 0, "the owner's FLUSH ends its lock");
    f.setlk(e.nodeid, o.fh, 0, WR, 0, 9).unwrap();
    assert_eq!(locks(), 1);
    f.release(e.nodeid, o.fh).unwrap();
    assert_eq!(locks(), 0, "the file's last RELEASE ends its locks");
    let (g, h) = with_fh(f.create(ROOT, b"later", 0o666, O_RDWR | O_CREAT).unwrap());
    f.flush(g.nodeid, h).unwrap();
    f.release(g.nodeid, h).unwrap();
    assert_eq!(locks(), 0);
}
