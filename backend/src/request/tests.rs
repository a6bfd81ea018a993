//! The decoder against requests built byte by byte: each check it makes, and its errors.

use super::*;
use vm_memory::{ByteValued, VolatileSlice};

/// Decodes a request of `op` with argument bytes `args` (the header is made to fit).
fn parse_with(op: u32, args: &[u8], f: impl FnOnce(Result<Request<'_>>)) {
    let hdr = InHeader {
        len: (size_of::<InHeader>() + args.len()) as u32,
        opcode: op,
        unique: 9,
        ..Default::default()
    };
    let mut bytes = args.to_vec();
    let bufs = [VolatileSlice::from(&mut bytes[..])];
    let mut names = NameBuf::new();
    f(Request::parse(&hdr, Reader::new(&bufs), &mut names, 0));
}

fn errno(op: u32, args: &[u8]) -> Option<i32> {
    let mut out = None;
    parse_with(op, args, |r| out = r.err().map(|e| e.errno()));
    out
}

#[test]
fn names_are_borrowed_and_checked() {
    let mut args =
        abi::Rename2In { newdir: 5, flags: libc::RENAME_NOREPLACE, padding: 0 }.as_slice().to_vec();
    args.extend_from_slice(b"old\0new\0");
    parse_with(opcode::RENAME2, &args, |r| match r.unwrap().op {
        Op::Rename(RenameArgs { oldname, newdir, newname, flags }) => {
            assert_eq!(
                (oldname, newdir, newname, flags),
                (&b"old"[..], 5, &b"new"[..], libc::RENAME_NOREPLACE)
            );
        }
        other => panic!("{other:?}"),
    });
    assert_eq!(errno(opcode::LOOKUP, b"a/b\0"), Some(libc::EINVAL), "not a path component");
    assert_eq!(
        errno(opcode::MKDIR, &[abi::MkdirIn::default().as_slice(), b"..\0"].concat()),
        Some(libc::EINVAL)
    );
    assert_eq!(errno(opcode::LOOKUP, b"unterminated"), Some(libc::EINVAL));
}

#[test]
fn argument_checks_every_backend_shares() {
    let both = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE;
    let mut args = abi::Rename2In { newdir: 5, flags: both, padding: 0 }.as_slice().to_vec();
    args.extend_from_slice(b"a\0b\0");
    assert_eq!(errno(opcode::RENAME2, &args), Some(libc::EINVAL), "NOREPLACE with EXCHANGE");
    let copy = abi::CopyFileRangeIn { len: 10, flags: 1, ..Default::default() };
    assert_eq!(errno(opcode::COPY_FILE_RANGE, copy.as_slice()), Some(libc::EINVAL), "copy flags");
    let wrap = abi::CopyFileRangeIn { off_in: u64::MAX, len: 10, ..Default::default() };
    assert_eq!(errno(opcode::COPY_FILE_RANGE, wrap.as_slice()), Some(libc::EOVERFLOW));
    let punch = abi::FallocateIn { mode: libc::FALLOC_FL_PUNCH_HOLE as u32, ..Default::default() };
    assert_eq!(
        errno(opcode::FALLOCATE, punch.as_slice()),
        Some(libc::EOPNOTSUPP),
        "a hole without KEEP_SIZE"
    );
    let unknown = abi::FallocateIn { mode: 1 << 20, ..Default::default() };
    assert_eq!(errno(opcode::FALLOCATE, unknown.as_slice()), Some(libc::EOPNOTSUPP));
    let whence = abi::LseekIn { whence: 5, ..Default::default() };
    assert_eq!(errno(opcode::LSEEK, whence.as_slice()), Some(libc::EINVAL));
    let ok = abi::LseekIn { whence: libc::SEEK_HOLE as u32, ..Default::default() };
    assert_eq!(errno(opcode::LSEEK, ok.as_slice()), None);
}

#[test]
fn write_payload_stays_in_the_buffers() {
    let mut args = abi::WriteIn { fh: 3, offset: 8, size: 4, ..Default::default() }.as_slice().to_vec();
    args.extend_from_slice(b"data");
    parse_with(opcode::WRITE, &args, |r| match r.unwrap().op {
        Op::Write { args: WriteArgs { fh, offset, size, .. }, mut data } => {
            assert_eq!((fh, offset, size, data.bytes_left()), (3, 8, 4, 4));
            let mut b = [0u8; 4];
            data.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"data");
        }
        other => panic!("{other:?}"),
    });
    args.push(0);
    assert_eq!(errno(opcode::WRITE, &args), Some(libc::EINVAL), "size disagrees with the payload");
}

#[test]
fn the_header_length_must_match() {
    let hdr = InHeader { len: 100, opcode: opcode::GETATTR, ..Default::default() };
    let mut bytes = abi::GetattrIn::default().as_slice().to_vec();
    let bufs = [VolatileSlice::from(&mut bytes[..])];
    let mut names = NameBuf::new();
    let e = Request::parse(&hdr, Reader::new(&bufs), &mut names, 0).unwrap_err();
    assert!(e.is_framing(), "{e}");
}
