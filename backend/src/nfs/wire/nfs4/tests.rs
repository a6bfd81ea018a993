//! The NFSv4.1 codecs' tests: every operation's result decodes, failures and LOCK4denied,
//! delegations, READDIR and the lists iterated in place, READ heads, arguments as RFC 5662 lays
//! them out (hand-written words), attributes both ways, the COMPOUND's shape rules, and
//! truncated, mutated or random bytes (errors, never panics).

use super::*;
use crate::nfs::wire::rpc::{self, AuthSys};
use crate::nfs::wire::xdr::{Decoder, Encoder};
use crate::nfs::wire::WireError;

fn enc(f: impl FnOnce(&mut Encoder<'_>) -> Result<(), WireError>) -> Vec<u8> {
    let mut buf = vec![0u8; 16384];
    let mut e = Encoder::new(&mut buf);
    f(&mut e).unwrap();
    let n = e.position();
    buf.truncate(n);
    buf
}

fn words(b: &[u8]) -> Vec<u32> {
    assert_eq!(b.len() % 4, 0, "XDR is whole words");
    b.chunks(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn bytes(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_be_bytes()).collect()
}

const SID: SessionId = SessionId([0x5a; 16]);

fn stateid(n: u8) -> Stateid {
    Stateid { seqid: u32::from(n), other: [n; 12] }
}

/// Every attribute [`Fattr4`] knows, set.
fn full_attrs() -> Fattr4 {
    let t = |s: i64| NfsTime4 { seconds: s, nseconds: 999_999_999 };
    Fattr4 {
        supported_attrs: Some(Bitmap::of(&[0, 1, 3, 4, 33, 82])),
        ftype: Some(Ftype4::Reg),
        change: Some(0x1122_3344_5566_7788),
        size: Some(1 << 40),
        fsid: Some(Fsid { major: 7, minor: 8 }),
        lease_time: Some(60),
        rdattr_error: Some(Nfsstat4::Ok),
        filehandle: Fh::new(&[0xfe; FHSIZE4]),
        fileid: Some(12345),
        files_avail: Some(1),
        files_free: Some(2),
        files_total: Some(3),
        maxfilesize: Some(u64::MAX),
        maxname: Some(255),
        maxread: Some(1 << 20),
        maxwrite: Some(1 << 20),
        mode: Some(0o4755),
        numlinks: Some(2),
        owner: Some(4_294_967_295),
        owner_group: Some(0),
        rawdev: Some((8, 1)),
        space_avail: Some(10),
        space_free: Some(11),
        space_total: Some(12),
        space_used: Some(4096),
        time_access: Some(t(-1)),
        time_metadata: Some(t(1 << 33)),
        time_modify: Some(t(0)),
        mounted_on_fileid: Some(99),
        xattr_support: Some(true),
    }
}

/// A small attribute set, as a GETATTR of a file gives.
fn stat_attrs(fileid: u64) -> Fattr4 {
    Fattr4 {
        ftype: Some(Ftype4::Dir),
        size: Some(4096),
        fileid: Some(fileid),
        mode: Some(0o755),
        owner: Some(1000),
        owner_group: Some(100),
        time_modify: Some(NfsTime4 { seconds: 10, nseconds: 20 }),
        ..Fattr4::default()
    }
}

fn cinfo(e: &mut Encoder<'_>, n: u64) -> Result<(), WireError> {
    ChangeInfo { atomic: true, before: n, after: n + 1 }.encode(e)
}

fn owner(e: &mut Encoder<'_>) -> Result<(), WireError> {
    StateOwner { clientid: 77, owner: b"lock-owner" }.encode(e)
}

/// The body of `op`'s NFS4_OK result (after its status), as a server sends it.
fn ok_body(op: OpNum, e: &mut Encoder<'_>) -> Result<(), WireError> {
    match op {
        OpNum::Access => {
            e.u32(0x3f)?;
            e.u32(0x1f)
        }
        OpNum::Close | OpNum::Lock | OpNum::Locku | OpNum::OpenDowngrade => stateid(3).encode(e),
        OpNum::Commit => e.fixed(&[4; 8]),
        OpNum::Create => {
            cinfo(e, 5)?;
            Bitmap::of(&[attr::MODE]).encode(e)
        }
        OpNum::CreateSession => {
            SID.encode(e)?;
            e.u32(1)?;
            e.u32(0)?;
            let c = ChannelAttrs {
                maxrequestsize: 1 << 20,
                maxresponsesize: 1 << 20,
                maxresponsesize_cached: 4096,
                maxoperations: 16,
                maxrequests: 64,
                ..ChannelAttrs::default()
            };
            c.encode(e)?;
            ChannelAttrs { rdma_ird: Some(3), ..c }.encode(e)
        }
        OpNum::Delegreturn
        | OpNum::DestroyClientid
        | OpNum::DestroySession
        | OpNum::FreeStateid
        | OpNum::Lockt
        | OpNum::Lookup
        | OpNum::Lookupp
        | OpNum::Putfh
        | OpNum::Putrootfh
        | OpNum::ReclaimComplete
        | OpNum::Restorefh
        | OpNum::Savefh => Ok(()),
        OpNum::ExchangeId => {
            e.u64(0xc1)?;
            e.u32(1)?;
            e.u32(exchgid::USE_NON_PNFS | exchgid::CONFIRMED_R)?;
            e.u32(1)?; // SP4_MACH_CRED
            Bitmap::of(&[42, 43]).encode(e)?;
            Bitmap::EMPTY.encode(e)?;
            e.u64(9)?;
            e.opaque(b"major", OPAQUE_LIMIT)?;
            e.opaque(b"scope", OPAQUE_LIMIT)?;
            e.u32(1)?;
            ImplId { domain: b"example.org", name: b"server 1.0", date: NfsTime4::default() }.encode(e)
        }
        OpNum::Getattr => full_attrs().encode(e),
        OpNum::Getfh => e.opaque(&[7; 40], 128),
        OpNum::Getxattr => e.opaque(b"value\0with nul", MAX_XATTR_VALUE),
        OpNum::Link | OpNum::Remove | OpNum::Removexattr | OpNum::Setxattr => cinfo(e, 6),
        OpNum::Listxattrs => {
            e.u64(33)?;
            e.u32(3)?;
            for n in [&b"user.a"[..], b"user.bb", b""] {
                e.opaque(n, MAX_NAME)?;
            }
            e.bool(true)
        }
        OpNum::Open => {
            stateid(1).encode(e)?;
            cinfo(e, 2)?;
            e.u32(open_result::LOCKTYPE_POSIX)?;
            Bitmap::of(&[attr::MODE, attr::OWNER]).encode(e)?;
            e.u32(2)?; // OPEN_DELEGATE_WRITE
            stateid(9).encode(e)?;
            e.bool(false)?;
            e.u32(1)?; // NFS_LIMIT_SIZE
            e.u64(1 << 30)?;
            e.u32(0)?;
            e.u32(0)?;
            e.u32(0x2)?;
            e.opaque(b"EVERYONE@", OPAQUE_LIMIT)
        }
        OpNum::Read => {
            e.bool(true)?;
            e.opaque(b"hello", u32::MAX)
        }
        OpNum::Readdir => {
            e.fixed(&[1; 8])?;
            for (i, name) in [&b"a"[..], b"bcde", b"f"].iter().enumerate() {
                e.bool(true)?;
                e.u64(i as u64 + 1)?;
                e.opaque(name, MAX_NAME)?;
                let mut a = stat_attrs(100 + i as u64);
                a.filehandle = Fh::new(&[i as u8; 16]);
                a.encode(e)?;
            }
            e.bool(false)?;
            e.bool(true)
        }
        OpNum::Readlink => e.opaque(b"/target/x", MAX_PATH),
        OpNum::Rename => {
            cinfo(e, 7)?;
            cinfo(e, 8)
        }
        OpNum::Sequence => {
            SID.encode(e)?;
            for v in [5, 2, 63, 31, seq_status::RESTART_RECLAIM_NEEDED] {
                e.u32(v)?;
            }
            Ok(())
        }
        OpNum::Setattr => Bitmap::of(&[attr::SIZE, attr::MODE]).encode(e),
        OpNum::TestStateid => {
            e.u32(2)?;
            e.u32(0)?;
            e.u32(Nfsstat4::BadStateid.to_u32())
        }
        OpNum::Write => {
            e.u32(100)?;
            e.u32(2)?;
            e.fixed(&[9; 8])
        }
        OpNum::Illegal => e.u32(0),
    }
}

/// A COMPOUND reply body: status, tag, then each `(op, status)` result (an OK one with
/// [`ok_body`]); the status is the last result's.
fn reply(results: &[(OpNum, Nfsstat4)]) -> Vec<u8> {
    enc(|e| {
        e.u32(results.last().map_or(0, |r| r.1.to_u32()))?;
        e.opaque(b"tag", MAX_TAG)?;
        e.u32(results.len() as u32)?;
        for &(op, status) in results {
            e.u32(op as u32)?;
            e.u32(status.to_u32())?;
            if status.is_ok() {
                ok_body(op, e)?;
            } else if status == Nfsstat4::Denied && matches!(op, OpNum::Lock | OpNum::Lockt) {
                e.u64(10)?;
                e.u64(u64::MAX)?;
                e.u32(2)?;
                owner(e)?;
            } else if op == OpNum::Setattr {
                Bitmap::EMPTY.encode(e)?;
            }
        }
        Ok(())
    })
}

/// The operations whose results [`ok_body`] knows (every one but ILLEGAL).
fn ops() -> impl Iterator<Item = OpNum> {
    OpNum::ALL.into_iter().filter(|op| *op != OpNum::Illegal)
}

fn one(op: OpNum) -> OpRes<'static> {
    let body: &'static [u8] = Box::leak(reply(&[(OpNum::Sequence, Nfsstat4::Ok), (op, Nfsstat4::Ok)]).into());
    let c = decode_compound(&mut Decoder::new(body)).unwrap_or_else(|e| panic!("{op:?}: {e}"));
    assert_eq!((c.status, c.tag, c.results.len()), (Nfsstat4::Ok, &b"tag"[..], 2));
    let mut r = c.results;
    assert!(matches!(r.next(), Some(Ok(OpRes::Sequence(_)))));
    let res = r.next().unwrap().unwrap();
    assert!(r.next().is_none());
    assert_eq!((res.op(), res.status()), (op, Nfsstat4::Ok));
    res
}

#[test]
fn every_operations_result_decodes() {
    for op in ops() {
        match one(op) {
            OpRes::Access { supported, access } => assert_eq!((supported, access), (0x3f, 0x1f)),
            OpRes::Close(s) | OpRes::Lock(s) | OpRes::Locku(s) | OpRes::OpenDowngrade(s) => {
                assert_eq!(s, stateid(3))
            }
            OpRes::Commit { verf } => assert_eq!(verf, [4; 8]),
            OpRes::Create { cinfo, attrset } => {
                assert_eq!(cinfo, ChangeInfo { atomic: true, before: 5, after: 6 });
                assert_eq!(attrset.iter().collect::<Vec<_>>(), [attr::MODE]);
            }
            OpRes::CreateSession(s) => {
                assert_eq!((s.sessionid, s.sequence, s.fore.maxrequests), (SID, 1, 64));
                assert_eq!((s.fore.rdma_ird, s.back.rdma_ird), (None, Some(3)));
            }
            OpRes::ExchangeId(x) => {
                assert_eq!((x.clientid, x.sequenceid, x.server_minor_id), (0xc1, 1, 9));
                assert_eq!((x.server_major_id, x.server_scope), (&b"major"[..], &b"scope"[..]));
                assert_eq!(x.impl_id.map(|i| i.name), Some(&b"server 1.0"[..]));
                assert_eq!(
                    x.state_protect,
                    StateProtect::MachCred { must_enforce: Bitmap::of(&[42, 43]), must_allow: Bitmap::EMPTY }
                );
            }
            OpRes::Getattr(a) => assert_eq!(a, full_attrs()),
            OpRes::Getfh(fh) => assert_eq!(fh.as_bytes(), &[7; 40]),
            OpRes::Getxattr(v) => assert_eq!(v, b"value\0with nul"),
            OpRes::Link(c) | OpRes::Remove(c) | OpRes::Removexattr(c) | OpRes::Setxattr(c) => {
                assert_eq!(c.before, 6)
            }
            OpRes::Listxattrs { cookie, names, eof } => {
                assert_eq!((cookie, eof, names.len()), (33, true, 3));
                let got: Vec<_> = names.map(Result::unwrap).collect();
                assert_eq!(got, [&b"user.a"[..], b"user.bb", b""]);
            }
            OpRes::Open(o) => {
                assert_eq!((o.stateid, o.rflags), (stateid(1), open_result::LOCKTYPE_POSIX));
                assert_eq!(o.cinfo.after, 3);
                assert!(o.attrset.contains(attr::OWNER) && !o.attrset.contains(attr::SIZE));
                match o.delegation {
                    Delegation::Write { stateid: s, recall: false, space_limit, permissions } => {
                        assert_eq!((s, space_limit), (stateid(9), SpaceLimit::Size(1 << 30)));
                        assert_eq!((permissions.access_mask, permissions.who), (2, &b"EVERYONE@"[..]));
                    }
                    d => panic!("{d:?}"),
                }
            }
            OpRes::Read { eof, data } => assert_eq!((eof, data), (true, &b"hello"[..])),
            OpRes::Readdir { verf, entries, eof } => {
                assert_eq!((verf, eof), ([1; 8], true));
                let got: Vec<_> = entries.map(Result::unwrap).collect();
                assert_eq!(got.len(), 3);
                assert_eq!((got[1].cookie, got[1].name, got[1].attrs.fileid), (2, &b"bcde"[..], Some(101)));
                assert_eq!(got[2].attrs.filehandle.map(|f| f.as_bytes().to_vec()), Some(vec![2; 16]));
                assert_eq!(got[0].attrs.owner, Some(1000));
            }
            OpRes::Readlink(t) => assert_eq!(t, b"/target/x"),
            OpRes::Rename { source, target } => assert_eq!((source.before, target.before), (7, 8)),
            OpRes::Sequence(s) => assert_eq!(s.sessionid, SID),
            OpRes::Setattr(b) => assert_eq!(b, Bitmap::of(&[attr::MODE, attr::SIZE])),
            OpRes::TestStateid(codes) => {
                let got: Vec<_> = codes.map(Result::unwrap).collect();
                assert_eq!(got, [Nfsstat4::Ok, Nfsstat4::BadStateid]);
            }
            OpRes::Write { count, committed, verf } => {
                assert_eq!((count, committed, verf), (100, Stable4::FileSync, [9; 8]))
            }
            r @ (OpRes::Delegreturn
            | OpRes::DestroyClientid
            | OpRes::DestroySession
            | OpRes::FreeStateid
            | OpRes::Lockt
            | OpRes::Lookup
            | OpRes::Lookupp
            | OpRes::Putfh
            | OpRes::Putrootfh
            | OpRes::ReclaimComplete
            | OpRes::Restorefh
            | OpRes::Savefh) => assert_eq!(r.op(), op),
            r @ OpRes::Failed { .. } => panic!("{op:?} decoded as {r:?}"),
        }
    }
}

#[test]
fn sequence_result_is_exposed() {
    let OpRes::Sequence(s) = one(OpNum::Sequence) else { panic!() };
    assert_eq!(
        s,
        SequenceRes {
            sessionid: SID,
            sequenceid: 5,
            slotid: 2,
            highest_slotid: 63,
            target_highest_slotid: 31,
            status_flags: seq_status::RESTART_RECLAIM_NEEDED,
        }
    );
}

#[test]
fn a_hand_written_reply_decodes() {
    // SEQUENCE + PUTFH + GETATTR(type, size, owner) as a server writes it, word by word.
    let mut w = vec![0, 4, 0x6162_6364, 3]; // NFS4_OK, tag "abcd", 3 results
    w.extend([53, 0]);
    w.extend([0x0102_0304; 4]); // session id
    w.extend([7, 0, 9, 9, 0]);
    w.extend([22, 0]);
    w.extend([9, 0]);
    // bitmap: 2 words, bits 1 and 4 in the first, bit 36 - 32 = 4 in the second.
    w.extend([2, (1 << 1) | (1 << 4), 1 << 4]);
    w.extend([4 + 8 + 8, 2, 0, 4097, 4, 0x3130_3131]); // NF4DIR, size 4097, "1011"
    let b = bytes(&w);
    let c = decode_compound(&mut Decoder::new(&b)).unwrap();
    assert_eq!((c.status, c.tag), (Nfsstat4::Ok, &b"abcd"[..]));
    let r: Vec<_> = c.results.map(Result::unwrap).collect();
    let OpRes::Sequence(s) = &r[0] else { panic!("{r:?}") };
    assert_eq!((s.sessionid.0[..4].to_vec(), s.sequenceid, s.highest_slotid), (vec![1, 2, 3, 4], 7, 9));
    assert!(matches!(r[1], OpRes::Putfh));
    let OpRes::Getattr(a) = &r[2] else { panic!("{r:?}") };
    assert_eq!((a.ftype, a.size, a.owner), (Some(Ftype4::Dir), Some(4097), Some(1011)));
    assert_eq!(a.mask(), Bitmap::of(&[attr::TYPE, attr::SIZE, attr::OWNER]));
}

#[test]
fn failures_stop_the_compound_and_carry_lock4denied() {
    for op in [OpNum::Lock, OpNum::Lockt] {
        let b =
            reply(&[(OpNum::Sequence, Nfsstat4::Ok), (OpNum::Putfh, Nfsstat4::Ok), (op, Nfsstat4::Denied)]);
        let c = decode_compound(&mut Decoder::new(&b)).unwrap();
        assert_eq!(c.status, Nfsstat4::Denied);
        let last = c.results.last().unwrap().unwrap();
        let OpRes::Failed { op: o, status, denied: Some(d) } = last else { panic!("{last:?}") };
        assert_eq!((o, status), (op, Nfsstat4::Denied));
        assert_eq!((d.offset, d.length, d.locktype), (10, u64::MAX, LockType::Write));
        assert_eq!(d.owner, StateOwner { clientid: 77, owner: b"lock-owner" });
    }
    // Other failures carry nothing (SETATTR its attrsset, checked and dropped).
    for (op, st) in [
        (OpNum::Putfh, Nfsstat4::Stale),
        (OpNum::Setattr, Nfsstat4::Access),
        (OpNum::Open, Nfsstat4::ShareDenied),
        (OpNum::Lock, Nfsstat4::Grace),
        (OpNum::Illegal, Nfsstat4::OpIllegal),
    ] {
        let b = reply(&[(OpNum::Sequence, Nfsstat4::Ok), (op, st)]);
        let c = decode_compound(&mut Decoder::new(&b)).unwrap();
        let last = c.results.last().unwrap().unwrap();
        assert!(matches!(last, OpRes::Failed { op: o, status, denied: None } if o == op && status == st));
    }
    // A failed SEQUENCE alone, and a COMPOUND refused before any operation.
    let b = reply(&[(OpNum::Sequence, Nfsstat4::BadSession)]);
    assert_eq!(decode_compound(&mut Decoder::new(&b)).unwrap().status, Nfsstat4::BadSession);
    let b = bytes(&[Nfsstat4::MinorVersMismatch.to_u32(), 0, 0]);
    let c = decode_compound(&mut Decoder::new(&b)).unwrap();
    assert_eq!((c.status, c.results.len()), (Nfsstat4::MinorVersMismatch, 0));
}

#[test]
fn the_compounds_shape_is_checked() {
    let ok = reply(&[(OpNum::Sequence, Nfsstat4::Ok), (OpNum::Putrootfh, Nfsstat4::Ok)]);
    assert!(decode_compound(&mut Decoder::new(&ok)).is_ok());
    // A result after a failed one.
    let b = reply(&[(OpNum::Putfh, Nfsstat4::Stale), (OpNum::Getfh, Nfsstat4::Ok)]);
    assert!(matches!(decode_compound(&mut Decoder::new(&b)), Err(WireError::BadValue { .. })));
    // A status that is not the last result's.
    let mut b = ok.clone();
    b[..4].copy_from_slice(&10008u32.to_be_bytes());
    assert!(matches!(decode_compound(&mut Decoder::new(&b)), Err(WireError::BadValue { .. })));
    // Trailing bytes.
    let mut b = ok.clone();
    b.extend([0; 4]);
    assert_eq!(decode_compound(&mut Decoder::new(&b)).unwrap_err(), WireError::Trailing(4));
    // An operation the client never sends (LAYOUTGET), OK and failed.
    for st in [0, 10004] {
        let b = bytes(&[st, 0, 1, 50, st]);
        let e = decode_compound(&mut Decoder::new(&b)).unwrap_err();
        assert_eq!(e, WireError::BadValue { what: "nfs_opnum4", value: 50 });
    }
    // ILLEGAL claiming success; too many results; a tag over its bound.
    assert!(decode_compound(&mut Decoder::new(&bytes(&[0, 0, 1, 10044, 0]))).is_err());
    let b = bytes(&[0, 0, MAX_OPS + 1]);
    assert!(matches!(decode_compound(&mut Decoder::new(&b)), Err(WireError::TooLong { .. })));
    let b = bytes(&[0, MAX_TAG + 1]);
    assert!(matches!(decode_compound(&mut Decoder::new(&b)), Err(WireError::TooLong { .. })));
}

#[test]
fn delegations_decode_every_way() {
    let open = |deleg: &dyn Fn(&mut Encoder<'_>) -> Result<(), WireError>| {
        let b = enc(|e| {
            e.u32(18)?;
            e.u32(0)?;
            stateid(1).encode(e)?;
            cinfo(e, 1)?;
            e.u32(0)?;
            Bitmap::EMPTY.encode(e)?;
            deleg(e)
        });
        let mut d = Decoder::new(&b);
        let r = decode_op(&mut d).map(|r| match r {
            OpRes::Open(o) => format!("{:?}", o.delegation),
            r => panic!("{r:?}"),
        });
        (r, d.remaining())
    };
    assert_eq!(open(&|e| e.u32(0)), (Ok("None".into()), 0));
    let (r, left) = open(&|e| {
        e.u32(1)?;
        stateid(4).encode(e)?;
        e.bool(true)?;
        for v in [0, 0, 1] {
            e.u32(v)?;
        }
        e.opaque(b"", OPAQUE_LIMIT)
    });
    assert!(r.unwrap().starts_with("Read { stateid: Stateid { seqid: 4"), "left {left}");
    let (r, _) = open(&|e| {
        e.u32(2)?;
        stateid(4).encode(e)?;
        e.bool(false)?;
        e.u32(2)?;
        e.u32(10)?;
        e.u32(512)?;
        for v in [0, 0, 1] {
            e.u32(v)?;
        }
        e.opaque(b"x", OPAQUE_LIMIT)
    });
    assert!(r.unwrap().contains("Blocks { num_blocks: 10, bytes_per_block: 512 }"));
    for (why, extra, want) in
        [(0, None, "NoneExt { why: 0, later: None }"), (1, Some(1), "NoneExt { why: 1, later: Some(true) }")]
    {
        let (r, left) = open(&|e| {
            e.u32(3)?;
            e.u32(why)?;
            extra.map_or(Ok(()), |x| e.u32(x))
        });
        assert_eq!((r.unwrap(), left), (want.to_string(), 0));
    }
    assert!(open(&|e| e.u32(4)).0.is_err(), "no such delegation type");
    assert!(open(&|e| {
        e.u32(3)?;
        e.u32(9)
    })
    .0
    .is_err());
}

#[test]
fn read_head_stops_at_the_data() {
    let b = enc(|e| {
        e.u32(25)?;
        e.u32(0)?;
        ok_body(OpNum::Read, e)
    });
    let mut d = Decoder::new(&b);
    assert_eq!(decode_read_head(&mut d, 5), Ok(ReadHead::Ok { eof: true, len: 5 }));
    assert_eq!(d.remaining(), 8, "the data and its padding follow");
    assert!(matches!(decode_read_head(&mut Decoder::new(&b), 4), Err(WireError::TooLong { .. })));
    let failed = bytes(&[25, 10025]);
    assert_eq!(decode_read_head(&mut Decoder::new(&failed), 5), Ok(ReadHead::Failed(Nfsstat4::BadStateid)));
    assert!(decode_read_head(&mut Decoder::new(&bytes(&[38, 0])), 5).is_err(), "not a READ");
    // A whole-buffer READ whose data runs past the record.
    let mut cut = reply(&[(OpNum::Sequence, Nfsstat4::Ok), (OpNum::Read, Nfsstat4::Ok)]);
    cut.truncate(cut.len() - 4);
    assert!(decode_compound(&mut Decoder::new(&cut)).is_err());
}

#[test]
fn attributes_round_trip_and_unknown_ones_are_errors() {
    for a in [full_attrs(), stat_attrs(1), Fattr4::default()] {
        let b = enc(|e| a.encode(e));
        let mut d = Decoder::new(&b);
        assert_eq!(Fattr4::decode(&mut d), Ok(a));
        assert_eq!(d.remaining(), 0);
    }
    // An attribute the decoder does not know (ACL, 12), even with plausible bytes.
    let b = bytes(&[1, 1 << 12, 4, 0]);
    assert_eq!(
        Fattr4::decode(&mut Decoder::new(&b)),
        Err(WireError::BadValue { what: "fattr4 attribute not decoded here", value: 12 })
    );
    // Values shorter or longer than the attrlist4.
    let b = bytes(&[1, 1 << 4, 4, 0]);
    assert!(matches!(Fattr4::decode(&mut Decoder::new(&b)), Err(WireError::Truncated { .. })));
    let b = bytes(&[1, 1 << 4, 12, 0, 1, 2]);
    assert_eq!(Fattr4::decode(&mut Decoder::new(&b)), Err(WireError::Trailing(4)));
    // A non-numeric owner, a time with a whole second of nanoseconds, a bad type.
    let b = enc(|e| {
        Bitmap::of(&[attr::OWNER]).encode(e)?;
        e.u32(16)?;
        e.opaque(b"root@local", MAX_OWNER)
    });
    assert!(matches!(Fattr4::decode(&mut Decoder::new(&b)), Err(WireError::BadValue { what: "owner", .. })));
    let b = bytes(&[2, 0, 1 << (53 - 32), 12, 0, 0, 1_000_000_000]);
    assert!(Fattr4::decode(&mut Decoder::new(&b)).is_err());
    let b = bytes(&[1, 1 << 1, 4, 10]);
    assert!(Fattr4::decode(&mut Decoder::new(&b)).is_err());
    for (s, v) in [(&b"0"[..], Ok(0)), (b"4294967295", Ok(u32::MAX)), (b"007", Ok(7))] {
        assert_eq!(parse_numeric_id(s, "owner"), v);
    }
    for s in [&b""[..], b"4294967296", b"-1", b"+1", b"1 ", b"12345678901", b"nobody"] {
        assert!(parse_numeric_id(s, "owner").is_err(), "{s:?}");
    }
}

#[test]
fn bitmaps_are_bounded_and_canonical() {
    let b = Bitmap::of(&[0, 31, 32, 127]);
    assert_eq!(b.words(), [0x8000_0001, 1, 0, 0x8000_0000]);
    assert_eq!(b.iter().collect::<Vec<_>>(), [0, 31, 32, 127]);
    assert!(b.contains(127) && !b.contains(128) && !b.contains(u32::MAX));
    let mut m = Bitmap::EMPTY;
    assert!(m.is_empty() && m.insert(82) && !m.insert(128));
    assert_eq!(m.words().len(), 3);
    assert_eq!(b.minus(&Bitmap::of(&[127])).words(), [0x8000_0001, 1]);
    // Trailing zero words sent are dropped: the same set compares equal.
    let sent = bytes(&[4, 1, 0, 0, 0]);
    assert_eq!(Bitmap::decode(&mut Decoder::new(&sent)), Ok(Bitmap::of(&[0])));
    let five = bytes(&[5, 1, 0, 0, 0, 0]);
    assert!(matches!(Bitmap::decode(&mut Decoder::new(&five)), Err(WireError::TooLong { .. })));
    assert_eq!(words(&enc(|e| Bitmap::EMPTY.encode(e))), [0]);
}

#[test]
fn statuses_and_errnos() {
    for &v in status::ALL_VALUES {
        let s = Nfsstat4::from_u32(v);
        assert_eq!(s.to_u32(), v);
        assert!(!matches!(s, Nfsstat4::Other(_)), "{v}");
        assert_eq!(s.errno() == 0, v == 0, "{s:?}");
        assert!(s.errno() >= 0);
    }
    // NFS4_OK, 18 POSIX-like, 10001 and 10003-10048, 10049-10087 but 10073, NFSv4.2's 7, RFC 8276's 2.
    assert_eq!(status::ALL_VALUES.len(), 1 + 18 + 47 + 38 + 7 + 2, "every value of RFC 8881, 7862, 8276");
    assert_eq!(Nfsstat4::from_u32(10073), Nfsstat4::Other(10073));
    assert_eq!(Nfsstat4::Other(10073).errno(), libc::EIO);
    for (s, errno) in [
        (Nfsstat4::NoEnt, libc::ENOENT),
        (Nfsstat4::Stale, libc::ESTALE),
        (Nfsstat4::BadHandle, libc::ESTALE),
        (Nfsstat4::Denied, libc::EAGAIN),
        (Nfsstat4::Deadlock, libc::EDEADLK),
        (Nfsstat4::NoXattr, libc::ENODATA),
        (Nfsstat4::Xattr2Big, libc::E2BIG),
        (Nfsstat4::Symlink, libc::ELOOP),
        (Nfsstat4::ShareDenied, libc::EACCES),
        (Nfsstat4::ReclaimBad, libc::ENOLCK),
        (Nfsstat4::BadSession, libc::EIO),
        (Nfsstat4::NotSupp, libc::EOPNOTSUPP),
    ] {
        assert_eq!(s.errno(), errno, "{s:?}");
    }
}

#[test]
fn arguments_encode_as_rfc5662_says() {
    let fh = Fh::new(&[1, 2, 3]).unwrap();
    let attrs = SetAttrs {
        size: Some(7),
        mode: Some(0o600),
        uid: None,
        gid: Some(1000),
        atime: SetTime4::ServerTime,
        mtime: SetTime4::ClientTime(NfsTime4 { seconds: -2, nseconds: 3 }),
    };
    let compound = |tag: &[u8], minor: u32, ops: &[Op<'_>]| {
        let mut out = None;
        let b = enc(|e| {
            out = Some(encode_compound(e, tag, minor, ops)?);
            Ok(())
        });
        (words(&b), out.unwrap())
    };
    let (w, out) = compound(
        b"t",
        1,
        &[
            Op::Sequence { session: SID, sequenceid: 1, slotid: 2, highest_slotid: 3, cachethis: true },
            Op::Putfh { fh: &fh },
            Op::Setattr { stateid: stateid(1), attrs: &attrs },
        ],
    );
    let mut want = vec![1, 0x7400_0000, 1, 3, 53];
    want.extend([0x5a5a_5a5a; 4]);
    want.extend([1, 2, 3, 1, 22, 3, 0x0102_0300, 34, 1, 0x0101_0101, 0x0101_0101, 0x0101_0101]);
    // size (4), mode (33), owner_group (37), time_access_set (48), time_modify_set (54).
    want.extend([2, 1 << 4, (1 << 1) | (1 << 5) | (1 << 16) | (1 << 22)]);
    want.extend([8 + 4 + 8 + 4 + 16, 0, 7, 0o600, 4, 0x3130_3030, 0, 1, 0xffff_ffff, 0xffff_fffe, 3]);
    assert_eq!(w, want);
    assert_eq!(out, Encoded { ops: 3, payload_at: None });

    // OPEN: create EXCLUSIVE4_1 by name, then one by handle, then a reclaim.
    let owner = StateOwner { clientid: 0x1_0000_0002, owner: b"oo" };
    let open = |create, claim| Op::Open(Open { share_access: 3, share_deny: 0, owner, create, claim });
    let (w, _) = compound(
        b"",
        1,
        &[open(
            Some(CreateHow4::Exclusive41 { verf: [0xee; 8], attrs: &SetAttrs::NONE }),
            OpenClaim::Null(b"f"),
        )],
    );
    let head = [0, 1, 1, 18, 0, 3, 0, 1, 2, 2, 0x6f6f_0000];
    assert_eq!(w[..head.len()], head);
    assert_eq!(w[head.len()..], [1, 3, 0xeeee_eeee, 0xeeee_eeee, 0, 0, 0, 1, 0x6600_0000]);
    let (w, _) = compound(b"", 1, &[open(None, OpenClaim::Fh)]);
    assert_eq!(w[head.len()..], [0, 4]);
    let (w, _) = compound(
        b"",
        1,
        &[open(Some(CreateHow4::Guarded(&attrs)), OpenClaim::Previous(DelegationType::Read))],
    );
    assert_eq!(w[head.len()..head.len() + 3], [1, 1, 2]);
    assert_eq!(w[w.len() - 2..], [1, 1], "CLAIM_PREVIOUS, OPEN_DELEGATE_READ");

    // WRITE stops at the data's length; a GETATTR after it is encoded after the data's place.
    let (w, out) = compound(
        b"",
        1,
        &[
            Op::Write { stateid: stateid(2), offset: 1 << 33, stable: Stable4::Unstable, count: 5 },
            Op::Getattr { attrs: Bitmap::of(&[attr::SIZE, attr::CHANGE]) },
        ],
    );
    assert_eq!(w, [0, 1, 2, 38, 2, 0x0202_0202, 0x0202_0202, 0x0202_0202, 2, 0, 0, 5, 9, 1, 0x18]);
    assert_eq!(out.payload_at, Some((4 * 12, 5)), "right after the length");

    // CREATE of each kind; LOCK by a new and an existing owner; LOCKU; TEST_STATEID.
    let create =
        |kind| compound(b"", 1, &[Op::Create { kind, name: b"n", attrs: &SetAttrs::NONE }]).0[4..].to_vec();
    assert_eq!(create(CreateKind::Dir), [2, 1, 0x6e00_0000, 0, 0]);
    assert_eq!(create(CreateKind::Link(b"/tgt")), [5, 4, 0x2f74_6774, 1, 0x6e00_0000, 0, 0]);
    assert_eq!(create(CreateKind::Chr(4, 64)), [4, 4, 64, 1, 0x6e00_0000, 0, 0]);
    assert_eq!(create(CreateKind::Blk(8, 1))[..3], [3, 8, 1]);
    assert_eq!(create(CreateKind::Fifo)[0], 7);
    assert_eq!(create(CreateKind::Sock)[0], 6);
    let lock = |locker| {
        compound(
            b"",
            1,
            &[Op::Lock { locktype: LockType::WriteW, reclaim: true, offset: 1, length: u64::MAX, locker }],
        )
        .0[4..]
            .to_vec()
    };
    let w = lock(Locker::New { open_stateid: stateid(1), owner: StateOwner { clientid: 5, owner: b"lo" } });
    assert_eq!(w[..6], [4, 1, 0, 1, u32::MAX, u32::MAX]);
    assert_eq!(w[6..], [1, 0, 1, 0x0101_0101, 0x0101_0101, 0x0101_0101, 0, 0, 5, 2, 0x6c6f_0000]);
    let w = lock(Locker::Existing { lock_stateid: stateid(3) });
    assert_eq!(w[6..], [0, 3, 0x0303_0303, 0x0303_0303, 0x0303_0303, 0]);
    let (w, _) = compound(
        b"",
        1,
        &[Op::Locku { locktype: LockType::Read, stateid: stateid(3), offset: 0, length: 10 }],
    );
    assert_eq!(w[4..], [1, 0, 3, 0x0303_0303, 0x0303_0303, 0x0303_0303, 0, 0, 0, 10]);
    let (w, _) = compound(b"", 1, &[Op::TestStateid { stateids: &[stateid(1), stateid(2)] }]);
    assert_eq!(w[4..6], [2, 1]);

    // READDIR, xattrs (minor version 2), RECLAIM_COMPLETE, DESTROY_*.
    let (w, _) = compound(
        b"",
        MINOR_VERSION_XATTR,
        &[
            Op::Readdir {
                cookie: 3,
                verf: [0; 8],
                dircount: 512,
                maxcount: 4096,
                attrs: Bitmap::of(&[attr::TYPE]),
            },
            Op::Setxattr { option: SetxattrOption::Create, name: b"user.k", value: b"v" },
            Op::Listxattrs { cookie: 0, maxcount: 100 },
            Op::ReclaimComplete { one_fs: false },
            Op::DestroyClientid { clientid: 0xab },
        ],
    );
    assert_eq!(w[..3], [0, 2, 5]);
    assert_eq!(w[3..13], [26, 0, 3, 0, 0, 512, 4096, 1, 2, 73]);
    assert_eq!(w[13..], [1, 6, 0x7573_6572, 0x2e6b_0000, 1, 0x7600_0000, 74, 0, 0, 100, 58, 0, 57, 0, 0xab]);
}

#[test]
fn session_operations_encode_as_rfc5662_says() {
    let impl_id = ImplId { domain: b"d", name: b"n", date: NfsTime4 { seconds: 1, nseconds: 2 } };
    let x = ExchangeId {
        verifier: [1; 8],
        owner_id: b"host",
        flags: exchgid::UPD_CONFIRMED_REC_A,
        impl_id: Some(impl_id),
    };
    let b = enc(|e| encode_compound(e, b"", 1, &[Op::ExchangeId(x)]).map(|_| ()));
    assert_eq!(
        words(&b)[3..],
        [
            42,
            0x0101_0101,
            0x0101_0101,
            4,
            0x686f_7374,
            0x4000_0000,
            0,
            1,
            1,
            0x6400_0000,
            1,
            0x6e00_0000,
            0,
            1,
            2
        ]
    );
    let fore = ChannelAttrs {
        headerpadsize: 0,
        maxrequestsize: 1 << 20,
        maxresponsesize: 1 << 20,
        maxresponsesize_cached: 8192,
        maxoperations: 16,
        maxrequests: 32,
        rdma_ird: None,
    };
    let gids = [5u32, 6];
    let auth = AuthSys { stamp: 9, machine: b"m", uid: 0, gid: 0, gids: &gids };
    let cs = |sec| CreateSession {
        clientid: 7,
        sequence: 1,
        flags: 0,
        fore,
        back: fore,
        cb_program: 0x4000_0000,
        sec,
    };
    let b = enc(|e| encode_compound(e, b"", 1, &[Op::CreateSession(cs(CbSec::Sys(auth)))]).map(|_| ()));
    let w = words(&b);
    assert_eq!(w[3..8], [43, 0, 7, 1, 0]);
    assert_eq!(w[8..15], [0, 1 << 20, 1 << 20, 8192, 16, 32, 0]);
    assert_eq!(w[22..], [0x4000_0000, 1, 1, 9, 1, 0x6d00_0000, 0, 0, 2, 5, 6]);
    let b = enc(|e| encode_compound(e, b"", 1, &[Op::CreateSession(cs(CbSec::None))]).map(|_| ()));
    assert_eq!(words(&b)[22..], [0x4000_0000, 1, 0]);
    let b = enc(|e| encode_compound(e, b"", 1, &[Op::DestroySession { session: SID }]).map(|_| ()));
    assert_eq!(words(&b)[3..], [44, 0x5a5a_5a5a, 0x5a5a_5a5a, 0x5a5a_5a5a, 0x5a5a_5a5a]);
    // The RPC header: program 100003, version 4, COMPOUND (1) or NULL (0).
    let a = AuthSys { stamp: 1, machine: b"", uid: 0, gid: 0, gids: &[] };
    for proc in [Proc4::Null, Proc4::Compound] {
        let b = enc(|e| encode_call(e, 0x77, proc, &a));
        let h = rpc::decode_call(&mut Decoder::new(&b)).unwrap();
        assert_eq!((h.xid, h.prog, h.vers, h.proc), (0x77, 100_003, 4, proc as u32));
    }
}

#[test]
fn encoding_is_bounded() {
    let fh = Fh::new(&[0; 128]).unwrap();
    assert!(Fh::new(&[0; 129]).is_none());
    let w = Op::Write { stateid: Stateid::ANONYMOUS, offset: 0, stable: Stable4::FileSync, count: 1 };
    let mut buf = [0u8; 4096];
    assert_eq!(
        encode_compound(&mut Encoder::new(&mut buf), b"", 1, &[w, w]),
        Err(WireError::BadValue { what: "a second WRITE in one COMPOUND", value: 2 })
    );
    let many = [Op::Getfh; MAX_OPS as usize + 1];
    assert!(matches!(
        encode_compound(&mut Encoder::new(&mut buf), b"", 1, &many),
        Err(WireError::TooLong { .. })
    ));
    let long = [b'n'; MAX_NAME as usize + 1];
    assert!(encode_compound(&mut Encoder::new(&mut buf), b"", 1, &[Op::Lookup { name: &long }]).is_err());
    let ids = [Stateid::CURRENT; MAX_STATEIDS as usize + 1];
    assert!(
        encode_compound(&mut Encoder::new(&mut buf), b"", 1, &[Op::TestStateid { stateids: &ids }]).is_err()
    );
    assert!(encode_compound(&mut Encoder::new(&mut buf), &[0; 257], 1, &[]).is_err());
    // A buffer too small: Overflow, never a reallocation, at every size.
    let ops = [Op::Putfh { fh: &fh }, Op::Getattr { attrs: Bitmap::of(&[1, 2, 3]) }];
    let need = {
        let mut e = Encoder::new(&mut buf);
        encode_compound(&mut e, b"tag", 1, &ops).unwrap();
        e.position()
    };
    for n in 0..need {
        let r = encode_compound(&mut Encoder::new(&mut buf[..n]), b"tag", 1, &ops);
        assert!(matches!(r, Err(WireError::Overflow { .. })), "{n}");
    }
    assert_eq!(OpNum::from_u32(7), None);
    assert!(OpNum::ALL.iter().all(|op| OpNum::from_u32(*op as u32) == Some(*op)));
}

/// Decodes `b` every way a reply can be (a whole COMPOUND with its results and lists iterated,
/// the head, one result, a READ head, an attribute set); never panics. How many decoded.
fn decode_all(b: &[u8]) -> usize {
    let mut oks = 0;
    if let Ok(c) = decode_compound(&mut Decoder::new(b)) {
        oks += 1;
        for r in c.results {
            match r.unwrap() {
                OpRes::Readdir { entries, .. } => {
                    entries.for_each(|e| assert!(e.unwrap().name.len() <= 1024))
                }
                OpRes::Listxattrs { names, .. } => names.for_each(|n| assert!(n.unwrap().len() <= 1024)),
                OpRes::TestStateid(codes) => codes.for_each(|c| assert!(c.is_ok())),
                _ => {}
            }
        }
    }
    let mut d = Decoder::new(b);
    if decode_compound_head(&mut d).is_ok() {
        while decode_op(&mut d).is_ok() {}
    }
    oks += usize::from(decode_op(&mut Decoder::new(b)).is_ok());
    oks += usize::from(Fattr4::decode(&mut Decoder::new(b)).is_ok());
    let _ = decode_read_head(&mut Decoder::new(b), 1 << 20);
    oks
}

/// A reply with every operation's result, the last one failing with LOCK4denied.
fn sample_replies() -> Vec<Vec<u8>> {
    let mut all = vec![];
    for op in ops() {
        all.push(reply(&[(OpNum::Sequence, Nfsstat4::Ok), (OpNum::Putfh, Nfsstat4::Ok), (op, Nfsstat4::Ok)]));
    }
    all.push(reply(&[(OpNum::Sequence, Nfsstat4::Ok), (OpNum::Lock, Nfsstat4::Denied)]));
    all
}

#[test]
fn truncated_replies_are_errors_at_every_offset() {
    for body in sample_replies() {
        assert!(decode_compound(&mut Decoder::new(&body)).is_ok());
        for n in 0..body.len() {
            assert!(decode_compound(&mut Decoder::new(&body[..n])).is_err(), "cut at {n} of {}", body.len());
            decode_all(&body[..n]);
        }
        // Garbage at every offset: a word of all ones, then of a small value.
        for at in (0..body.len()).step_by(4) {
            for w in [u32::MAX, 1, 0x8000_0000] {
                let mut b = body.clone();
                b[at..at + 4].copy_from_slice(&w.to_be_bytes());
                decode_all(&b);
            }
        }
    }
}

#[test]
fn hostile_bytes_never_panic() {
    // Fixed-seed xorshift: random words biased to small values (so that bools, lengths,
    // operation numbers and discriminants are often valid and decoding goes deep), and mutated
    // valid replies.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let opnums: Vec<u32> = OpNum::ALL.iter().map(|o| *o as u32).collect();
    let mut oks = 0;
    for _ in 0..20_000 {
        let n = (rnd() % 96) as usize;
        let mut b = Vec::with_capacity(n * 4);
        for _ in 0..n {
            let w = match rnd() % 5 {
                0 => 0,
                1 => 1,
                2 => (rnd() % 80) as u32,
                3 => opnums[(rnd() as usize) % opnums.len()],
                _ => rnd() as u32,
            };
            b.extend_from_slice(&w.to_be_bytes());
        }
        oks += decode_all(&b);
    }
    for good in sample_replies() {
        for _ in 0..500 {
            let mut b = good.clone();
            for _ in 0..1 + rnd() % 3 {
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
