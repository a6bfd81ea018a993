//! The NFSv3 codecs' tests: every procedure's reply decodes, failures, READ heads, arguments as
//! RFC 1813 lays them out, and truncated or hostile bytes (errors, never panics).

use super::*;
use crate::nfs::wire::xdr::{Decoder, Encoder};
use crate::nfs::wire::WireError;

fn fattr(fileid: u64) -> Fattr {
    let t = NfsTime { sec: 10, nsec: 20 };
    Fattr {
        ftype: Ftype::Dir,
        mode: 0o755,
        nlink: 2,
        uid: 1,
        gid: 2,
        size: 4096,
        used: 8192,
        rdev: (3, 4),
        fsid: 5,
        fileid,
        atime: t,
        mtime: t,
        ctime: t,
    }
}

fn enc(f: impl FnOnce(&mut Encoder<'_>) -> Result<(), WireError>) -> Vec<u8> {
    let mut buf = vec![0u8; 8192];
    let mut e = Encoder::new(&mut buf);
    f(&mut e).unwrap();
    let n = e.position();
    buf.truncate(n);
    buf
}

fn post_op(e: &mut Encoder<'_>, a: Option<&Fattr>) -> Result<(), WireError> {
    e.bool(a.is_some())?;
    match a {
        Some(a) => a.encode(e),
        None => Ok(()),
    }
}

fn wcc(e: &mut Encoder<'_>, a: Option<&Fattr>) -> Result<(), WireError> {
    e.bool(true)?; // pre-op: size, mtime, ctime
    e.u64(1)?;
    e.u64(2)?;
    e.u64(3)?;
    post_op(e, a)
}

/// A valid NFS3_OK reply body for every procedure.
fn ok_reply(proc: Proc) -> Vec<u8> {
    let a = fattr(9);
    let fh = Fh::new(&[7; 20]).unwrap();
    enc(|e| {
        if proc == Proc::Null {
            return Ok(());
        }
        e.u32(0)?;
        match proc {
            Proc::Null => Ok(()),
            Proc::Getattr => a.encode(e),
            Proc::Setattr | Proc::Remove | Proc::Rmdir => wcc(e, Some(&a)),
            Proc::Lookup => {
                e.opaque(fh.as_bytes(), 64)?;
                post_op(e, Some(&a))?;
                post_op(e, None)
            }
            Proc::Access => {
                post_op(e, Some(&a))?;
                e.u32(0x1f)
            }
            Proc::Readlink => {
                post_op(e, None)?;
                e.opaque(b"/target/x", MAX_PATH)
            }
            Proc::Read => {
                post_op(e, Some(&a))?;
                e.u32(5)?;
                e.bool(true)?;
                e.opaque(b"hello", 100)
            }
            Proc::Write => {
                wcc(e, Some(&a))?;
                e.u32(100)?;
                e.u32(1)?;
                e.fixed(&[9; 8])
            }
            Proc::Create | Proc::Mkdir | Proc::Symlink | Proc::Mknod => {
                e.bool(true)?;
                e.opaque(fh.as_bytes(), 64)?;
                post_op(e, Some(&a))?;
                wcc(e, None)
            }
            Proc::Rename => {
                wcc(e, None)?;
                wcc(e, Some(&a))
            }
            Proc::Link => {
                post_op(e, Some(&a))?;
                wcc(e, None)
            }
            Proc::Readdir | Proc::Readdirplus => {
                post_op(e, Some(&a))?;
                e.fixed(&[1; 8])?;
                for (i, name) in [&b"a"[..], b"bcde", b"f"].iter().enumerate() {
                    e.bool(true)?;
                    e.u64(100 + i as u64)?;
                    e.opaque(name, MAX_NAME)?;
                    e.u64(i as u64 + 1)?;
                    if proc == Proc::Readdirplus {
                        post_op(e, if i == 1 { None } else { Some(&a) })?;
                        e.bool(i != 2)?;
                        if i != 2 {
                            e.opaque(&[i as u8; 8], 64)?;
                        }
                    }
                }
                e.bool(false)?;
                e.bool(true)
            }
            Proc::Fsstat => {
                post_op(e, None)?;
                for v in 1..=6u64 {
                    e.u64(v)?;
                }
                e.u32(0)
            }
            Proc::Fsinfo => {
                post_op(e, None)?;
                for v in [1u32 << 20, 1 << 16, 4096, 1 << 20, 1 << 16, 4096, 8192] {
                    e.u32(v)?;
                }
                e.u64(u64::MAX)?;
                e.u32(0)?;
                e.u32(1)?;
                e.u32(0x1b)
            }
            Proc::Commit => {
                wcc(e, None)?;
                e.fixed(&[4; 8])
            }
        }
    })
}

#[test]
fn every_procedures_reply_decodes() {
    let a = fattr(9);
    for proc in Proc::ALL {
        let body = ok_reply(proc);
        let res = decode_res(proc, &mut Decoder::new(&body)).unwrap_or_else(|e| panic!("{proc:?}: {e}"));
        match (proc, res) {
            (Proc::Null, Res::Null) => {}
            (Proc::Getattr, Res::Attr(x)) => assert_eq!(x, a),
            (Proc::Setattr, Res::Setattr { attr }) => assert_eq!(attr, Some(a)),
            (Proc::Lookup, Res::Lookup { fh, attr, dir_attr }) => {
                assert_eq!(fh.as_bytes(), &[7; 20]);
                assert_eq!((attr, dir_attr), (Some(a), None));
            }
            (Proc::Access, Res::Access { access, attr }) => assert_eq!((access, attr), (0x1f, Some(a))),
            (Proc::Readlink, Res::Readlink { target, attr }) => {
                assert_eq!((target, attr), (&b"/target/x"[..], None))
            }
            (Proc::Read, Res::Read { count, eof, attr }) => {
                assert_eq!((count, eof, attr), (5, true, Some(a)))
            }
            (Proc::Write, Res::Write { count, committed, verf, attr }) => {
                assert_eq!((count, committed, verf, attr), (100, Stable::DataSync, [9; 8], Some(a)))
            }
            (
                Proc::Create | Proc::Mkdir | Proc::Symlink | Proc::Mknod,
                Res::Created { fh, attr, dir_attr },
            ) => {
                assert_eq!(fh.map(|f| f.as_bytes().len()), Some(20));
                assert_eq!((attr, dir_attr), (Some(a), None));
            }
            (Proc::Remove | Proc::Rmdir | Proc::Rename | Proc::Link, Res::Changed { attr }) => {
                assert_eq!(attr, Some(a))
            }
            (Proc::Readdir | Proc::Readdirplus, Res::Dir { verf, entries, eof, dir_attr }) => {
                assert_eq!((verf, eof, dir_attr), ([1; 8], true, Some(a)));
                let got: Vec<_> = entries.map(|e| e.unwrap()).collect();
                assert_eq!(got.len(), 3);
                assert_eq!((got[1].fileid, got[1].name, got[1].cookie), (101, &b"bcde"[..], 2));
                if proc == Proc::Readdirplus {
                    assert_eq!((got[0].attr, got[1].attr), (Some(a), None));
                    assert_eq!(got[0].fh.map(|f| f.as_bytes().to_vec()), Some(vec![0; 8]));
                    assert!(got[2].fh.is_none());
                } else {
                    assert!(got.iter().all(|e| e.attr.is_none() && e.fh.is_none()));
                }
            }
            (Proc::Fsstat, Res::Fsstat { tbytes, afiles, .. }) => assert_eq!((tbytes, afiles), (1, 6)),
            (Proc::Fsinfo, Res::Fsinfo { rtmax, wtpref, dtpref, maxfilesize, properties, .. }) => {
                assert_eq!(
                    (rtmax, wtpref, dtpref, maxfilesize, properties),
                    (1 << 20, 1 << 16, 8192, u64::MAX, 0x1b)
                )
            }
            (Proc::Commit, Res::Commit { verf }) => assert_eq!(verf, [4; 8]),
            (p, r) => panic!("{p:?} decoded as {r:?}"),
        }
    }
}

#[test]
fn failures_carry_status_and_attributes() {
    let a = fattr(3);
    let stale = enc(|e| {
        e.u32(70)?;
        post_op(e, Some(&a))
    });
    let res = decode_res(Proc::Lookup, &mut Decoder::new(&stale)).unwrap();
    assert!(matches!(res, Res::Failed { status: Nfsstat::Stale, attr: Some(x) } if x == a));
    assert_eq!(Nfsstat::Stale.errno(), libc::ESTALE);
    let bad = 10001u32.to_be_bytes();
    let res = decode_res(Proc::Getattr, &mut Decoder::new(&bad)).unwrap();
    assert!(matches!(res, Res::Failed { status: Nfsstat::BadHandle, attr: None }));
    let exist = enc(|e| {
        e.u32(17)?;
        wcc(e, Some(&a))
    });
    let res = decode_res(Proc::Create, &mut Decoder::new(&exist)).unwrap();
    assert!(matches!(res, Res::Failed { status: Nfsstat::Exist, attr: Some(_) }));
    for v in [1, 2, 5, 6, 13, 17, 18, 19, 20, 21, 22, 27, 28, 30, 31, 63, 66, 69, 70, 71, 10001, 10008, 12345]
    {
        let s = Nfsstat::from_u32(v);
        assert_eq!(s.to_u32(), v);
        assert!(s.errno() > 0);
    }
    assert_eq!(Nfsstat::from_u32(12345), Nfsstat::Other(12345));
}

#[test]
fn read_head_checks_counts() {
    let body = ok_reply(Proc::Read);
    let mut d = Decoder::new(&body);
    let h = decode_read_head(&mut d, 5).unwrap();
    assert!(matches!(h, ReadHead::Ok { count: 5, eof: true, len: 5, attr: Some(_) }));
    assert_eq!(d.remaining(), 8, "the data and its padding follow");
    assert!(matches!(decode_read_head(&mut Decoder::new(&body), 4), Err(WireError::TooLong { .. })));
    let mut lie = body.clone();
    let at = 4 + 4 + FATTR3_SIZE; // status, attr, then count
    lie[at..at + 4].copy_from_slice(&4u32.to_be_bytes());
    assert!(decode_read_head(&mut Decoder::new(&lie), 100).is_err());
}

#[test]
fn arguments_encode_as_rfc1813_says() {
    let fh = Fh::new(&[1, 2, 3]).unwrap();
    let attr = Sattr {
        mode: Some(0o600),
        uid: None,
        gid: Some(5),
        size: Some(7),
        atime: SetTime::ServerTime,
        mtime: SetTime::ClientTime(NfsTime { sec: 1, nsec: 2 }),
    };
    let words =
        |b: &[u8]| b.chunks(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<u32>>();
    let b = enc(|e| {
        encode_args(
            e,
            &Args::Setattr { fh: &fh, attr: &attr, guard_ctime: Some(NfsTime { sec: 9, nsec: 8 }) },
        )
    });
    assert_eq!(words(&b), [3, 0x0102_0300, 1, 0o600, 0, 1, 5, 1, 0, 7, 1, 2, 1, 2, 1, 9, 8]);
    let b = enc(|e| {
        encode_args(e, &Args::Create { dir: &fh, name: b"ab", how: CreateHow::Exclusive([0xee; 8]) })
    });
    assert_eq!(words(&b), [3, 0x0102_0300, 2, 0x6162_0000, 2, 0xeeee_eeee, 0xeeee_eeee]);
    let b = enc(|e| {
        encode_args(e, &Args::Write { fh: &fh, offset: 1 << 33, count: 5, stable: Stable::FileSync })
    });
    assert_eq!(words(&b), [3, 0x0102_0300, 2, 0, 5, 2, 5], "ends with the data's length");
    let b = enc(|e| {
        encode_args(
            e,
            &Args::Mknod { dir: &fh, name: b"c", ftype: Ftype::Chr, attr: &Sattr::default(), rdev: (4, 64) },
        )
    });
    assert_eq!(words(&b), [3, 0x0102_0300, 1, 0x6300_0000, 4, 0, 0, 0, 0, 0, 0, 4, 64]);
    let b = enc(|e| {
        encode_args(
            e,
            &Args::Mknod { dir: &fh, name: b"p", ftype: Ftype::Fifo, attr: &Sattr::default(), rdev: (4, 64) },
        )
    });
    assert_eq!(words(&b).len(), 4 + 1 + 6, "no device numbers for a FIFO");
    let b = enc(|e| {
        encode_args(
            e,
            &Args::Readdirplus { dir: &fh, cookie: 3, verf: [0; 8], dircount: 512, maxcount: 4096 },
        )
    });
    assert_eq!(words(&b), [3, 0x0102_0300, 0, 3, 0, 0, 512, 4096]);
    let b = enc(|e| {
        encode_args(e, &Args::Rename { from_dir: &fh, from_name: b"x", to_dir: &fh, to_name: b"yy" })
    });
    assert_eq!(words(&b), [3, 0x0102_0300, 1, 0x7800_0000, 3, 0x0102_0300, 2, 0x7979_0000]);
    let b = enc(|e| {
        encode_args(e, &Args::Symlink { dir: &fh, name: b"l", attr: &Sattr::default(), target: b"/t" })
    });
    assert_eq!(words(&b), [3, 0x0102_0300, 1, 0x6c00_0000, 0, 0, 0, 0, 0, 0, 2, 0x2f74_0000]);
    // Bounds: a name over MAX_NAME, a target over MAX_PATH.
    let mut buf = [0u8; 16384];
    let long = [b'n'; MAX_NAME as usize + 1];
    assert!(encode_args(&mut Encoder::new(&mut buf), &Args::Lookup { dir: &fh, name: &long }).is_err());
    let path = [b'p'; MAX_PATH as usize + 1];
    let a = Sattr::default();
    assert!(encode_args(
        &mut Encoder::new(&mut buf),
        &Args::Symlink { dir: &fh, name: b"l", attr: &a, target: &path }
    )
    .is_err());
    let big = Fh::new(&[0; 65]).unwrap();
    assert!(
        encode_args(&mut Encoder::new(&mut buf), &Args::Getattr { fh: &big }).is_err(),
        "an nfs_fh3 of 65 bytes"
    );
    assert_eq!(Fh::new(&[1, 2]), Fh::new(&[1, 2]));
    assert_ne!(Fh::new(&[1, 2]), Fh::new(&[1, 2, 0]));
}

/// Decodes `b` as every procedure's reply and as a READ head; must never panic, and a
/// successful directory listing must iterate.
fn decode_all(b: &[u8]) -> usize {
    let mut oks = 0;
    for proc in Proc::ALL {
        if let Ok(Res::Dir { entries, .. }) = decode_res(proc, &mut Decoder::new(b)) {
            for e in entries {
                e.unwrap();
            }
            oks += 1;
        } else if decode_res(proc, &mut Decoder::new(b)).is_ok() {
            oks += 1;
        }
    }
    let _ = decode_read_head(&mut Decoder::new(b), 1 << 20);
    let _ = super::super::rpc::decode_reply(&mut Decoder::new(b));
    let _ = super::super::rpc::decode_call(&mut Decoder::new(b));
    let _ = super::super::mount::decode_mnt(&mut Decoder::new(b));
    let _ = super::super::portmap::decode_getport(&mut Decoder::new(b));
    oks
}

#[test]
fn truncated_replies_are_errors() {
    for proc in Proc::ALL {
        let body = ok_reply(proc);
        for n in 0..body.len() {
            assert!(
                decode_res(proc, &mut Decoder::new(&body[..n])).is_err(),
                "{proc:?} cut at {n} of {}",
                body.len()
            );
            decode_all(&body[..n]);
        }
    }
}

#[test]
fn hostile_bytes_never_panic() {
    // Fixed-seed xorshift: random words biased to small values (so that bools, lengths
    // and discriminants are often valid and decoding goes deep), and mutated valid replies.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut oks = 0;
    for _ in 0..20_000 {
        let n = (rnd() % 96) as usize;
        let mut b = Vec::with_capacity(n * 4);
        for _ in 0..n {
            let w = match rnd() % 4 {
                0 => 0,
                1 => 1,
                2 => (rnd() % 80) as u32,
                _ => rnd() as u32,
            };
            b.extend_from_slice(&w.to_be_bytes());
        }
        oks += decode_all(&b);
    }
    for proc in Proc::ALL {
        let good = ok_reply(proc);
        for _ in 0..2_000 {
            let mut b = good.clone();
            for _ in 0..1 + rnd() % 3 {
                if b.is_empty() {
                    break;
                }
                let i = (rnd() as usize) % b.len();
                b[i] = rnd() as u8;
            }
            if rnd() % 4 == 0 {
                b.truncate((rnd() as usize) % (b.len() + 1));
            }
            decode_all(&b);
        }
    }
    assert!(oks > 0, "some random inputs decode (the generator reaches deep paths)");
}
