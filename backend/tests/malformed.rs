//! Malformed and hostile requests: each gets the right errno (or no reply), never a panic, and
//! never a side effect when the reply cannot be delivered.

mod harness;

use harness::ram::Fuse;
use harness::*;
use virtiofs_backend::abi::{self, opcode};
use vm_memory::ByteValued;

const S_IFREG: u32 = libc::S_IFREG;

#[test]
fn truncated_header() {
    let f = Fuse::new();
    let req = f.req(opcode::GETATTR, ROOT, &[&[0u8; 16]]);
    for len in [0, 1, 20, 39] {
        let r = handle_raw(&f.srv, &req[..len], usize::MAX, 64, usize::MAX);
        assert_eq!((r.n, r.errno(), r.hdr.unique), (HDR, libc::EINVAL, 0), "{len} bytes");
    }
    // No readable buffers at all.
    let r = handle_raw(&f.srv, &[], usize::MAX, 64, usize::MAX);
    assert_eq!(r.errno(), libc::EINVAL);
}

#[test]
fn header_length_disagrees_with_buffers() {
    let f = Fuse::new();
    let mut req = f.req(opcode::GETATTR, ROOT, &[&[0u8; 16]]);
    let unique: abi::InHeader = parse(&req);
    // Claims more than present.
    req[0..4].copy_from_slice(&1000u32.to_ne_bytes());
    let r = handle_raw(&f.srv, &req, usize::MAX, 256, usize::MAX);
    assert_eq!((r.errno(), r.hdr.unique), (libc::EINVAL, unique.unique));
    // Claims less than present.
    req[0..4].copy_from_slice(&50u32.to_ne_bytes());
    let r = handle_raw(&f.srv, &req, usize::MAX, 256, usize::MAX);
    assert_eq!(r.errno(), libc::EINVAL);
    // Claims less than a header.
    req[0..4].copy_from_slice(&8u32.to_ne_bytes());
    let r = handle_raw(&f.srv, &req[..8], usize::MAX, 256, usize::MAX);
    assert_eq!(r.errno(), libc::EINVAL);
    // Extension length beyond the request.
    let mut req = f.req(opcode::GETATTR, ROOT, &[&[0u8; 16]]);
    req[36..38].copy_from_slice(&3u16.to_ne_bytes());
    let r = handle_raw(&f.srv, &req, usize::MAX, 256, usize::MAX);
    assert_eq!(r.errno(), libc::EINVAL);
    // An extension that fits (of a type we do not know: skipped) is cut off before the arguments
    // are parsed.
    let unknown = abi::ExtHeader { size: 8, typ: 99 };
    let mut req = f.req(opcode::GETATTR, ROOT, &[&[0u8; 16], unknown.as_slice()]);
    req[36..38].copy_from_slice(&1u16.to_ne_bytes());
    let r = handle_raw(&f.srv, &req, usize::MAX, 256, usize::MAX);
    assert_eq!(r.errno(), 0);
}

#[test]
fn truncated_arguments() {
    let f = Fuse::new();
    let cases: &[(u32, usize)] = &[
        (opcode::GETATTR, 15),
        (opcode::SETATTR, 87),
        (opcode::OPEN, 7),
        (opcode::READ, 39),
        (opcode::WRITE, 39),
        (opcode::RELEASE, 23),
        (opcode::FLUSH, 23),
        (opcode::FSYNC, 15),
        (opcode::ACCESS, 4),
        (opcode::RENAME2, 12),
        (opcode::LINK, 7),
        (opcode::MKNOD, 15),
        (opcode::MKDIR, 7),
        (opcode::CREATE, 15),
        (opcode::READDIR, 39),
        (opcode::FALLOCATE, 31),
        (opcode::INIT, 15),
        (opcode::SETXATTR, 15),
        (opcode::GETXATTR, 7),
        (opcode::LISTXATTR, 7),
        (opcode::GETLK, 47),
        (opcode::SETLK, 47),
        (opcode::SETLKW, 47),
        (opcode::LSEEK, 23),
        (opcode::COPY_FILE_RANGE, 55),
        (opcode::SYNCFS, 7),
        (opcode::STATX, 23),
        (opcode::TMPFILE, 15),
        (opcode::FSYNCDIR, 15),
    ];
    for &(op, len) in cases {
        let r = f.call(op, ROOT, &[&vec![0u8; len]]);
        assert_eq!(r.errno(), libc::EINVAL, "opcode {op} with {len} argument bytes");
    }
    // INIT_EXT set but the extension missing.
    let arg = abi::InitInCompat { major: 7, minor: 41, max_readahead: 0, flags: abi::init::INIT_EXT as u32 };
    assert_eq!(f.call(opcode::INIT, 0, &[arg.as_slice()]).errno(), libc::EINVAL);
}

#[test]
fn xattr_requests_are_validated() {
    let f = Fuse::new();
    let (e, o) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    let ino = e.nodeid;
    let set = |arg: &abi::SetxattrIn, rest: &[&[u8]]| {
        let mut args: Vec<&[u8]> = vec![arg.as_slice()];
        args.extend_from_slice(rest);
        f.call(opcode::SETXATTR, ino, &args).errno()
    };
    let arg = |size: u32, flags: u32| abi::SetxattrIn { size, flags, setxattr_flags: 0, padding: 0 };
    // Value size disagreeing with the payload, either way.
    assert_eq!(set(&arg(5, 0), &[b"user.a\0", b"abc"]), libc::EINVAL);
    assert_eq!(set(&arg(2, 0), &[b"user.a\0", b"abc"]), libc::EINVAL);
    // No NUL at all; a name of 256 bytes without one is "too long".
    assert_eq!(set(&arg(0, 0), &[b"user.a"]), libc::EINVAL);
    assert_eq!(set(&arg(0, 0), &[&[b'u'; 300]]), libc::ERANGE);
    assert_eq!(set(&arg(0, 0), &[b"\0"]), libc::ERANGE, "empty name");
    // Unknown flags.
    assert_eq!(set(&arg(1, 4), &[b"user.a\0", b"v"]), libc::EINVAL);
    assert_eq!(
        set(&abi::SetxattrIn { setxattr_flags: 1 << 5, ..arg(1, 0) }, &[b"user.a\0", b"v"]),
        libc::EINVAL
    );
    // Nothing of that was stored.
    assert!(f.xattr_names(ino).unwrap().is_empty());

    // GETXATTR/REMOVEXATTR names.
    let get = abi::GetxattrIn { size: 100, padding: 0 };
    assert_eq!(f.call(opcode::GETXATTR, ino, &[get.as_slice(), b"user.a"]).errno(), libc::EINVAL);
    assert_eq!(f.call(opcode::GETXATTR, ino, &[get.as_slice()]).errno(), libc::EINVAL);
    assert_eq!(f.call(opcode::REMOVEXATTR, ino, &[b"user.a"]).errno(), libc::EINVAL);
    assert_eq!(f.call(opcode::REMOVEXATTR, ino, &[&[b'x'; 4000]]).errno(), libc::ERANGE);
    // A value bigger than the reply buffer: ERANGE, whatever size was asked.
    f.setxattr(ino, b"user.big", &[5u8; 1000], 0).unwrap();
    let get = abi::GetxattrIn { size: 4096, padding: 0 };
    let req = f.req(opcode::GETXATTR, ino, &[get.as_slice(), &cstr(b"user.big")]);
    let r = handle_raw(&f.srv, &req, usize::MAX, HDR + 999, usize::MAX);
    assert_eq!(r.errno(), libc::ERANGE);
    let r = handle_raw(&f.srv, &req, 3, HDR + 1000, 7);
    assert_eq!((r.errno(), r.body.len()), (0, 1000));
    let list = abi::GetxattrIn { size: 4096, padding: 0 };
    let req = f.req(opcode::LISTXATTR, ino, &[list.as_slice()]);
    assert_eq!(handle_raw(&f.srv, &req, usize::MAX, HDR + 3, usize::MAX).errno(), libc::ERANGE);
    // Unknown nodes.
    assert_eq!(f.setxattr(4242, b"user.a", b"v", 0), Err(libc::ENOENT));
    assert_eq!(f.getxattr(4242, b"user.a", 0), Err(libc::ENOENT));
    assert_eq!(f.listxattr(4242, 0), Err(libc::ENOENT));
    assert_eq!(f.removexattr(4242, b"user.a"), Err(libc::ENOENT));

    // Without SETXATTR_EXT the argument is 8 bytes; the 16-byte form would be misparsed, so
    // the name must start right after the 8.
    let old = Fuse::uninit();
    old.init(41, OLD_FLAGS).unwrap();
    let oe = old.mknod(ROOT, b"f", S_IFREG | 0o644, 0).unwrap().nodeid;
    old.setxattr(oe, b"user.v", b"value", 0).unwrap();
    assert_eq!(old.xattr(oe, b"user.v").unwrap(), b"value");
    let r = old.call(opcode::SETXATTR, oe, &[arg(1, 0).as_slice(), b"user.w\0", b"v"]);
    assert_eq!(r.errno(), libc::ERANGE, "the zero padding reads as an empty name");
    f.release(ino, o.fh).unwrap();
}

#[test]
fn new_ops_do_not_leak_when_the_reply_does_not_fit() {
    let f = Fuse::new();
    let d = f.mkdir(ROOT, b"d", 0o777).unwrap().nodeid;
    let before = f.fs().inode_count();
    let arg = abi::CreateIn { flags: O_RDWR, mode: 0o600, umask: 0, open_flags: 0 };
    let req = f.req(opcode::TMPFILE, d, &[arg.as_slice(), b"/\0"]);
    let r = handle_raw(&f.srv, &req, usize::MAX, HDR + 128, usize::MAX);
    assert_eq!(r.errno(), libc::ERANGE);
    assert_eq!(f.fs().inode_count(), before, "no tmpfile left behind");
    // COPY_FILE_RANGE copies nothing it cannot report.
    let (a, ao) = f.create(d, b"a", 0o644, O_RDWR | O_CREAT).unwrap();
    let (b, bo) = f.create(d, b"b", 0o644, O_RDWR | O_CREAT).unwrap();
    f.write(a.nodeid, ao.fh, 0, b"abc").unwrap();
    let cp = abi::CopyFileRangeIn {
        fh_in: ao.fh,
        nodeid_out: b.nodeid,
        fh_out: bo.fh,
        len: 3,
        ..Default::default()
    };
    let req = f.req(opcode::COPY_FILE_RANGE, a.nodeid, &[cp.as_slice()]);
    assert_eq!(handle_raw(&f.srv, &req, usize::MAX, HDR + 7, usize::MAX).errno(), libc::ERANGE);
    assert_eq!(f.getattr(b.nodeid).unwrap().size, 0);
}

#[test]
fn names_must_be_nul_terminated_components() {
    let f = Fuse::new();
    let mkdir = abi::MkdirIn { mode: 0o755, umask: 0 };
    // No NUL.
    let r = f.call(opcode::MKDIR, ROOT, &[mkdir.as_slice(), b"abc"]);
    assert_eq!(r.errno(), libc::EINVAL);
    let r = f.call(opcode::LOOKUP, ROOT, &[b"abc"]);
    assert_eq!(r.errno(), libc::EINVAL);
    let r = f.call(opcode::LOOKUP, ROOT, &[]);
    assert_eq!(r.errno(), libc::EINVAL);
    // Not a component where a name is created.
    for bad in [&b""[..], b".", b"..", b"a/b", b"/"] {
        assert_eq!(f.mkdir(ROOT, bad, 0o755), Err(libc::EINVAL), "{bad:?}");
        assert_eq!(f.mknod(ROOT, bad, S_IFREG | 0o644, 0), Err(libc::EINVAL));
        assert_eq!(f.create(ROOT, bad, 0o644, O_RDWR).unwrap_err(), libc::EINVAL);
        assert_eq!(f.symlink(ROOT, bad, b"t"), Err(libc::EINVAL));
        assert_eq!(f.link(ROOT, ROOT, bad), Err(libc::EINVAL));
        assert_eq!(f.rename(ROOT, b"x", ROOT, bad), Err(libc::EINVAL));
    }
    assert_eq!(f.lookup(ROOT, b"a/b"), Err(libc::EINVAL));
    assert_eq!(f.lookup(ROOT, b""), Err(libc::EINVAL));
    assert_eq!(f.unlink(ROOT, b"."), Err(libc::ENOENT));
    assert_eq!(f.rmdir(ROOT, b"."), Err(libc::EINVAL));
    assert_eq!(f.rmdir(ROOT, b".."), Err(libc::ENOTEMPTY));
    // Symlink without the target's NUL.
    let r = f.call(opcode::SYMLINK, ROOT, &[b"s\0target"]);
    assert_eq!(r.errno(), libc::EINVAL);
    // RENAME with only one name.
    let r = f.call(opcode::RENAME, ROOT, &[&ROOT.to_ne_bytes(), b"a\0"]);
    assert_eq!(r.errno(), libc::EINVAL);
    // Name length: 255 is fine, 256 is too long, absurd lengths too.
    let ok = vec![b'n'; 255];
    assert!(f.mkdir(ROOT, &ok, 0o755).is_ok());
    let long = vec![b'n'; 256];
    assert_eq!(f.mkdir(ROOT, &long, 0o755), Err(libc::ENAMETOOLONG));
    assert_eq!(f.lookup(ROOT, &long), Err(libc::ENAMETOOLONG));
    let huge = vec![b'n'; 100_000];
    assert_eq!(f.lookup(ROOT, &huge), Err(libc::ENAMETOOLONG));
    // Nothing was created by any of this.
    let fh = f.opendir(ROOT).unwrap();
    assert_eq!(f.readdir(ROOT, fh, 0, 65536).unwrap().len(), 3);
}

#[test]
fn unknown_opcodes_nodes_and_handles() {
    let f = Fuse::new();
    for op in [999, 0, opcode::BMAP, opcode::IOCTL, opcode::POLL, opcode::SETUPMAPPING, 53, 4096] {
        let r = f.call(op, ROOT, &[&[0u8; 64]]);
        assert_eq!((r.n, r.errno()), (HDR, libc::ENOSYS), "opcode {op}");
    }
    assert_eq!(f.getattr(0), Err(libc::ENOENT));
    assert_eq!(f.getattr(0xdead_beef), Err(libc::ENOENT));
    assert_eq!(f.lookup(12345, b"x"), Err(libc::ENOENT));
    assert_eq!(f.mkdir(12345, b"x", 0o755), Err(libc::ENOENT));
    assert_eq!(f.open(12345, O_RDONLY), Err(libc::ENOENT));
    assert_eq!(f.read(ROOT, 777, 0, 10), Err(libc::EBADF));
    assert_eq!(f.write(ROOT, 777, 0, b"x"), Err(libc::EBADF));
    assert_eq!(f.release(ROOT, 777), Err(libc::EBADF));
    assert_eq!(f.readdir(ROOT, 777, 0, 4096), Err(libc::EBADF));
    // Forgetting unknown nodes, or more than was looked up, is harmless.
    f.forget(0xdead_beef, 5);
    f.forget(ROOT, u64::MAX);
    assert_eq!(f.getattr(ROOT).unwrap().ino, ROOT);
    let e = f.mkdir(ROOT, b"d", 0o755).unwrap();
    f.forget(e.nodeid, 100);
    assert_eq!(f.fs().lookup_count(e.nodeid), Some(0), "still linked, so still there");
    assert!(f.lookup(ROOT, b"d").is_ok());
}

#[test]
fn requests_without_reply() {
    let f = Fuse::new();
    let e = f.mkdir(ROOT, b"d", 0o755).unwrap();
    f.lookup(ROOT, b"d").unwrap();
    assert_eq!(f.fs().lookup_count(e.nodeid), Some(2));
    // FORGET with no writable buffer at all.
    let req = f.req(opcode::FORGET, e.nodeid, &[abi::ForgetIn { nlookup: 1 }.as_slice()]);
    assert_eq!(handle_raw(&f.srv, &req, 3, 0, 1).n, 0);
    assert_eq!(f.fs().lookup_count(e.nodeid), Some(1));
    // A truncated FORGET: still no reply.
    let req = f.req(opcode::FORGET, e.nodeid, &[&[1u8; 4]]);
    assert_eq!(handle_raw(&f.srv, &req, usize::MAX, 64, usize::MAX).n, 0);
    // BATCH_FORGET whose count exceeds the items present: the present ones are applied.
    let batch = abi::BatchForgetIn { count: 1_000_000, dummy: 0 };
    let one = abi::ForgetOne { nodeid: e.nodeid, nlookup: 1 };
    let req = f.req(opcode::BATCH_FORGET, 0, &[batch.as_slice(), one.as_slice(), &[7u8; 5]]);
    assert_eq!(handle_raw(&f.srv, &req, 16, 0, 1).n, 0);
    assert_eq!(f.fs().lookup_count(e.nodeid), Some(0));
    // INTERRUPT is a no-op without reply.
    let req = f.req(opcode::INTERRUPT, 0, &[&5u64.to_ne_bytes()]);
    assert_eq!(handle_raw(&f.srv, &req, usize::MAX, 64, usize::MAX).n, 0);
}

#[test]
fn reply_buffer_too_small() {
    let f = Fuse::new();
    f.mkdir(ROOT, b"d", 0o755).unwrap();
    let d = f.lookup(ROOT, b"d").unwrap().nodeid;
    let before = f.fs().lookup_count(d);
    // Not even a header: no reply at all.
    let req = f.req(opcode::LOOKUP, ROOT, &[&cstr(b"d")]);
    assert_eq!(handle_raw(&f.srv, &req, usize::MAX, 15, usize::MAX).n, 0);
    // A header but not the entry: ERANGE, and no lookup reference leaked.
    let req = f.req(opcode::LOOKUP, ROOT, &[&cstr(b"d")]);
    let r = handle_raw(&f.srv, &req, usize::MAX, 100, 7);
    assert_eq!((r.n, r.errno()), (HDR, libc::ERANGE));
    assert_eq!(f.fs().lookup_count(d), before);
    // MKDIR that could not be answered does not create anything.
    let req =
        f.req(opcode::MKDIR, ROOT, &[abi::MkdirIn { mode: 0o755, umask: 0 }.as_slice(), &cstr(b"ghost")]);
    let r = handle_raw(&f.srv, &req, usize::MAX, 64, usize::MAX);
    assert_eq!(r.errno(), libc::ERANGE);
    assert_eq!(f.lookup(ROOT, b"ghost"), Err(libc::ENOENT));
    // CREATE/OPEN: no handle leaks.
    let arg = abi::CreateIn { flags: O_RDWR, mode: 0o644, ..Default::default() };
    let req = f.req(opcode::CREATE, ROOT, &[arg.as_slice(), &cstr(b"c")]);
    let r = handle_raw(&f.srv, &req, usize::MAX, HDR + 128, usize::MAX);
    assert_eq!(r.errno(), libc::ERANGE);
    assert_eq!(f.lookup(ROOT, b"c"), Err(libc::ENOENT));
    // READ asking for more than the reply buffer holds.
    let (e, o) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    f.write(e.nodeid, o.fh, 0, &[1u8; 8192]).unwrap();
    let req = f.req(opcode::READ, e.nodeid, &[Fuse::read_in(o.fh, 0, 8192).as_slice()]);
    let r = handle_raw(&f.srv, &req, usize::MAX, HDR + 4096, 512);
    assert_eq!(r.errno(), libc::ERANGE);
    // GETATTR/STATFS/INIT with room for the header only.
    for (op, args) in
        [(opcode::GETATTR, vec![0u8; 16]), (opcode::STATFS, vec![]), (opcode::INIT, init_in(41, LINUX_FLAGS))]
    {
        let req = f.req(op, ROOT, &[&args]);
        let r = handle_raw(&f.srv, &req, usize::MAX, HDR, usize::MAX);
        assert_eq!((r.n, r.errno()), (HDR, libc::ERANGE), "opcode {op}");
    }
    // READDIR fills what fits (nothing here) and reports success.
    let fh = f.opendir(ROOT).unwrap();
    let req = f.req(opcode::READDIR, ROOT, &[Fuse::read_in(fh, 0, 4096).as_slice()]);
    let r = handle_raw(&f.srv, &req, usize::MAX, HDR + 31, usize::MAX);
    assert_eq!((r.errno(), r.n), (0, HDR));
}

#[test]
fn write_size_must_match_payload() {
    let f = Fuse::new();
    let (e, o) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).unwrap();
    let arg = |size: u32| abi::WriteIn { fh: o.fh, offset: 0, size, ..Default::default() };
    // Size larger than the payload.
    let r = f.call(opcode::WRITE, e.nodeid, &[arg(100).as_slice(), &[1u8; 10]]);
    assert_eq!(r.errno(), libc::EINVAL);
    // Size smaller than the payload.
    let r = f.call(opcode::WRITE, e.nodeid, &[arg(5).as_slice(), &[1u8; 10]]);
    assert_eq!(r.errno(), libc::EINVAL);
    // Above max_write.
    let big = vec![0u8; (1 << 20) + 1];
    let r = f.call(opcode::WRITE, e.nodeid, &[arg(big.len() as u32).as_slice(), &big]);
    assert_eq!(r.errno(), libc::EINVAL);
    assert_eq!(f.getattr(e.nodeid).unwrap().size, 0, "nothing written");
    // Exactly max_write is fine.
    let r = f.call(opcode::WRITE, e.nodeid, &[arg(1 << 20).as_slice(), &big[..1 << 20]]);
    assert_eq!(r.errno(), 0);
    // Offset + size overflowing.
    let over = abi::WriteIn { fh: o.fh, offset: u64::MAX - 2, size: 10, ..Default::default() };
    let r = f.call(opcode::WRITE, e.nodeid, &[over.as_slice(), &[0u8; 10]]);
    assert_eq!(r.errno(), libc::EFBIG);
}

#[test]
fn garbage_never_panics() {
    // A cheap deterministic fuzz: random opcodes, random argument bytes, random splits.
    let f = Fuse::new();
    f.mkdir(ROOT, b"d", 0o777).unwrap();
    let (e, _) = f.create(ROOT, b"f", 0o666, O_RDWR | O_CREAT).unwrap();
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..5000 {
        let op = (rnd() % 55) as u32;
        if op == opcode::DESTROY || op == opcode::INIT {
            continue;
        }
        let len = (rnd() % 300) as usize;
        let args: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
        let nodeid = [ROOT, e.nodeid, rnd() % 8, rnd()][(rnd() % 4) as usize];
        let req = request(op, nodeid, 1, (rnd() % 3) as u32 * 1000, 0, &[&args]);
        let split = 1 + (rnd() % 64) as usize;
        let cap = (rnd() % 512) as usize;
        let r = handle_raw(&f.srv, &req, split, cap, 1 + (rnd() % 100) as usize);
        assert!(r.n <= cap);
    }
    // The filesystem is still coherent.
    assert_eq!(f.as_user(0, 0).getattr(ROOT).unwrap().ino, ROOT);
}
