//! Writes seed inputs of the `nfs4_reply` fuzz target from a real server's NFSv4.1 replies:
//! `cargo run --example nfs4_seeds -- NFS_URL OUT_DIR` (from `fuzz/`), with `NFS_URL` an export
//! served by nfs-ganesha as `tools/nfs/ganesha.sh start` prints it (NFSv4 on its `nfsport`).
//!
//! A blocking client of its own runs one session (EXCHANGE_ID, CREATE_SESSION, then COMPOUNDs
//! behind SEQUENCE: the pseudo root, the walk to the export, OPEN with create, WRITE, COMMIT,
//! READ, CREATE of a directory and a symlink, READLINK, READDIR with attributes, LOCK, LOCKT
//! denied, LOCKU, SETATTR, ACCESS, RENAME, LINK, REMOVE, CLOSE, TEST_STATEID, the xattr
//! operations, failures, DESTROY_SESSION, DESTROY_CLIENTID) and keeps each reply's record; every
//! reply becomes one input with a record per decoding mode, and every GETATTR's attributes an
//! input of the `fattr4` mode. See `virtiofs_fuzz_common::nfs4`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use virtiofs_backend::nfs::url::NfsUrl;
use virtiofs_backend::nfs::wire::nfs4::{
    attr, decode_compound, encode_call, encode_compound, share, Bitmap, CbSec, ChannelAttrs, CreateHow4,
    CreateKind, CreateSession, ExchangeId, Fh, LockType, Locker, Op, OpRes, Open, OpenClaim, Proc4,
    SessionId, SetAttrs, SetTime4, Stable4, StateOwner, Stateid, MINOR_VERSION, MINOR_VERSION_XATTR,
};
use virtiofs_backend::nfs::wire::rpc::{self, AuthSys};
use virtiofs_backend::nfs::wire::xdr::{pad, Decoder, Encoder};
use virtiofs_fuzz_common::nfs4::mode;

const AUTH: AuthSys<'static> = AuthSys { stamp: 1, machine: b"seeds", uid: 0, gid: 0, gids: &[] };

struct Client {
    sock: TcpStream,
    xid: u32,
    sid: SessionId,
    seq: u32,
    out: Vec<(String, Vec<u8>)>,
}

impl Client {
    /// One call (NULL when `ops` is `None`); the reply's record body is kept under `name` and
    /// returned.
    fn call(&mut self, name: &str, minor: u32, ops: Option<&[Op<'_>]>, payload: &[u8]) -> Vec<u8> {
        self.xid += 1;
        let mut buf = vec![0u8; 64 << 10];
        let mut e = Encoder::new(&mut buf);
        let mark = e.reserve_u32().unwrap();
        let proc = if ops.is_some() { Proc4::Compound } else { Proc4::Null };
        encode_call(&mut e, self.xid, proc, &AUTH).unwrap();
        let mut at = None;
        if let Some(ops) = ops {
            at = encode_compound(&mut e, b"seeds", minor, ops).unwrap().payload_at;
        }
        let n = e.position();
        let total = n - 4 + at.map_or(0, |_| payload.len() + pad(payload.len()));
        e.patch_u32(mark, 0x8000_0000 | total as u32);
        let msg = match at {
            Some((at, _)) => {
                let mut m = buf[..at].to_vec();
                m.extend_from_slice(payload);
                m.extend_from_slice(&[0u8; 3][..pad(payload.len())]);
                m.extend_from_slice(&buf[at..n]);
                m
            }
            None => buf[..n].to_vec(),
        };
        self.sock.write_all(&msg).unwrap();
        let mut body = Vec::new();
        loop {
            let mut m = [0u8; 4];
            self.sock.read_exact(&mut m).unwrap();
            let m = u32::from_be_bytes(m);
            let at = body.len();
            body.resize(at + (m & 0x7fff_ffff) as usize, 0);
            self.sock.read_exact(&mut body[at..]).unwrap();
            if m & 0x8000_0000 != 0 {
                break;
            }
        }
        self.out.push((name.into(), body.clone()));
        body
    }

    /// SEQUENCE on slot 0, then `ops`.
    fn seq(&mut self, name: &str, minor: u32, ops: &[Op<'_>], payload: &[u8]) -> Vec<u8> {
        self.seq += 1;
        let mut all = vec![Op::Sequence {
            session: self.sid,
            sequenceid: self.seq,
            slotid: 0,
            highest_slotid: 0,
            cachethis: false,
        }];
        all.extend_from_slice(ops);
        self.call(name, minor, Some(&all), payload)
    }
}

/// The results of a reply (after its RPC header), which must decode.
fn results(reply: &[u8]) -> Vec<OpRes<'_>> {
    let mut d = Decoder::new(reply);
    rpc::decode_reply(&mut d).unwrap().1.unwrap();
    decode_compound(&mut d).unwrap().results.map(Result::unwrap).collect()
}

fn fh_at(reply: &[u8], i: usize) -> Fh {
    match &results(reply)[i] {
        OpRes::Getfh(f) => *f,
        r => panic!("no handle: {r:?}"),
    }
}

fn stateid_at(reply: &[u8], i: usize) -> Stateid {
    match &results(reply)[i] {
        OpRes::Open(o) => o.stateid,
        OpRes::Lock(s) | OpRes::Locku(s) => *s,
        r => panic!("no stateid: {r:?}"),
    }
}

/// A record of the fuzz input framing: `[len: u16 le][flags][bytes]`.
fn rec(out: &mut Vec<u8>, flags: u8, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.push(flags);
    out.extend_from_slice(bytes);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert!(args.len() == 3, "usage: nfs4_seeds NFS_URL OUT_DIR");
    let url = args[1].parse::<NfsUrl>().expect("an nfs:// URL with nfsport");
    let out = Path::new(&args[2]);
    std::fs::create_dir_all(out).unwrap();
    let sock = TcpStream::connect((url.host.as_str(), url.nfsport.expect("nfsport in the URL"))).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut c = Client { sock, xid: 0x5eed_4000, sid: SessionId::default(), seq: 0, out: Vec::new() };

    c.call("null", 0, None, b"");
    let owner_id = format!("nfs4 seeds {}", std::process::id());
    let x = ExchangeId { verifier: [7; 8], owner_id: owner_id.as_bytes(), flags: 0, impl_id: None };
    let r = c.call("exchange-id", MINOR_VERSION, Some(&[Op::ExchangeId(x)]), b"");
    let OpRes::ExchangeId(x) = results(&r)[0] else { panic!() };
    let clientid = x.clientid;
    let fore = ChannelAttrs {
        maxrequestsize: 1 << 20,
        maxresponsesize: 1 << 20,
        maxresponsesize_cached: 8192,
        maxoperations: 16,
        maxrequests: 16,
        ..ChannelAttrs::default()
    };
    let back = ChannelAttrs { maxrequests: 1, maxoperations: 2, ..fore };
    let cs = CreateSession {
        clientid,
        sequence: x.sequenceid,
        flags: 0,
        fore,
        back,
        cb_program: 0x4000_0000,
        sec: CbSec::Sys(AUTH),
    };
    let r = c.call("create-session", MINOR_VERSION, Some(&[Op::CreateSession(cs)]), b"");
    let OpRes::CreateSession(s) = results(&r)[0] else { panic!() };
    c.sid = s.sessionid;

    let all = Bitmap::of(&[
        attr::SUPPORTED_ATTRS,
        attr::TYPE,
        attr::CHANGE,
        attr::SIZE,
        attr::FSID,
        attr::LEASE_TIME,
        attr::FILEHANDLE,
        attr::FILEID,
        attr::FILES_AVAIL,
        attr::FILES_FREE,
        attr::FILES_TOTAL,
        attr::MAXFILESIZE,
        attr::MAXNAME,
        attr::MAXREAD,
        attr::MAXWRITE,
        attr::MODE,
        attr::NUMLINKS,
        attr::OWNER,
        attr::OWNER_GROUP,
        attr::RAWDEV,
        attr::SPACE_AVAIL,
        attr::SPACE_FREE,
        attr::SPACE_TOTAL,
        attr::SPACE_USED,
        attr::TIME_ACCESS,
        attr::TIME_METADATA,
        attr::TIME_MODIFY,
        attr::MOUNTED_ON_FILEID,
    ]);
    c.seq("root", MINOR_VERSION, &[Op::Putrootfh, Op::Getfh, Op::Getattr { attrs: all }], b"");
    c.seq("reclaim-complete", MINOR_VERSION, &[Op::ReclaimComplete { one_fs: false }], b"");
    let comps: Vec<&str> = url.export.split('/').filter(|s| !s.is_empty()).collect();
    let mut ops = vec![Op::Putrootfh];
    ops.extend(comps.iter().map(|n| Op::Lookup { name: n.as_bytes() }));
    ops.extend([Op::Getfh, Op::Getattr { attrs: all }]);
    let r = c.seq("export", MINOR_VERSION, &ops, b"");
    let dir = fh_at(&r, ops.len() - 1);
    c.seq("lookup-noent", MINOR_VERSION, &[Op::Putfh { fh: &dir }, Op::Lookup { name: b"none" }], b"");

    let create = SetAttrs { mode: Some(0o644), ..SetAttrs::NONE };
    let oo = StateOwner { clientid, owner: b"seed-open" };
    let open = Open {
        share_access: share::ACCESS_BOTH,
        share_deny: share::DENY_NONE,
        owner: oo,
        create: Some(CreateHow4::Guarded(&create)),
        claim: OpenClaim::Null(b"seed-file"),
    };
    let r = c.seq(
        "open-create",
        MINOR_VERSION,
        &[Op::Putfh { fh: &dir }, Op::Open(open), Op::Getfh, Op::Getattr { attrs: all }],
        b"",
    );
    let open_sid = stateid_at(&r, 2);
    let file = fh_at(&r, 3);
    c.seq("open-exist", MINOR_VERSION, &[Op::Putfh { fh: &dir }, Op::Open(open)], b"");
    let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    let w = Op::Write { stateid: open_sid, offset: 0, stable: Stable4::Unstable, count: data.len() as u32 };
    let size = Bitmap::of(&[attr::SIZE, attr::CHANGE]);
    c.seq("write", MINOR_VERSION, &[Op::Putfh { fh: &file }, w, Op::Getattr { attrs: size }], &data);
    c.seq("commit", MINOR_VERSION, &[Op::Putfh { fh: &file }, Op::Commit { offset: 0, count: 0 }], b"");
    c.seq(
        "read",
        MINOR_VERSION,
        &[Op::Putfh { fh: &file }, Op::Read { stateid: open_sid, offset: 0, count: 8192 }],
        b"",
    );
    c.seq(
        "read-bad-stateid",
        MINOR_VERSION,
        &[
            Op::Putfh { fh: &file },
            Op::Read { stateid: Stateid { seqid: 1, other: [9; 12] }, offset: 0, count: 10 },
        ],
        b"",
    );
    let none = SetAttrs::NONE;
    c.seq(
        "create-dir",
        MINOR_VERSION,
        &[
            Op::Putfh { fh: &dir },
            Op::Create { kind: CreateKind::Dir, name: b"seed-dir", attrs: &create },
            Op::Getfh,
        ],
        b"",
    );
    let r = c.seq(
        "create-symlink",
        MINOR_VERSION,
        &[
            Op::Putfh { fh: &dir },
            Op::Create { kind: CreateKind::Link(b"seed-file"), name: b"seed-link", attrs: &none },
            Op::Getfh,
        ],
        b"",
    );
    let link = fh_at(&r, 3);
    c.seq("readlink", MINOR_VERSION, &[Op::Putfh { fh: &link }, Op::Readlink], b"");
    let entry_attrs = Bitmap::of(&[
        attr::RDATTR_ERROR,
        attr::TYPE,
        attr::FILEHANDLE,
        attr::FILEID,
        attr::MODE,
        attr::OWNER,
        attr::SIZE,
        attr::TIME_MODIFY,
    ]);
    let readdir =
        Op::Readdir { cookie: 0, verf: [0; 8], dircount: 4096, maxcount: 16384, attrs: entry_attrs };
    c.seq("readdir", MINOR_VERSION, &[Op::Putfh { fh: &dir }, readdir], b"");

    let lo = StateOwner { clientid, owner: b"seed-lock" };
    let lock = Op::Lock {
        locktype: LockType::Write,
        reclaim: false,
        offset: 0,
        length: u64::MAX,
        locker: Locker::New { open_stateid: open_sid, owner: lo },
    };
    let r = c.seq("lock", MINOR_VERSION, &[Op::Putfh { fh: &file }, lock], b"");
    let lock_sid = stateid_at(&r, 2);
    let other = StateOwner { clientid, owner: b"seed-other" };
    let lockt = Op::Lockt { locktype: LockType::Read, offset: 5, length: 5, owner: other };
    c.seq("lockt-denied", MINOR_VERSION, &[Op::Putfh { fh: &file }, lockt], b"");
    let lock2 = Op::Lock {
        locktype: LockType::Read,
        reclaim: false,
        offset: 0,
        length: 1,
        locker: Locker::New { open_stateid: open_sid, owner: other },
    };
    c.seq("lock-denied", MINOR_VERSION, &[Op::Putfh { fh: &file }, lock2], b"");
    let unlock = Op::Locku { locktype: LockType::Write, stateid: lock_sid, offset: 0, length: u64::MAX };
    let r = c.seq("locku", MINOR_VERSION, &[Op::Putfh { fh: &file }, unlock], b"");
    let lock_sid = stateid_at(&r, 2);
    c.seq(
        "test-stateid",
        MINOR_VERSION,
        &[Op::TestStateid { stateids: &[open_sid, lock_sid, Stateid::INVALID] }],
        b"",
    );
    c.seq("free-stateid", MINOR_VERSION, &[Op::FreeStateid { stateid: lock_sid }], b"");

    let set = SetAttrs { size: Some(10), mtime: SetTime4::ServerTime, ..SetAttrs::NONE };
    c.seq(
        "setattr",
        MINOR_VERSION,
        &[
            Op::Putfh { fh: &file },
            Op::Setattr { stateid: open_sid, attrs: &set },
            Op::Getattr { attrs: all },
        ],
        b"",
    );
    c.seq("access", MINOR_VERSION, &[Op::Putfh { fh: &file }, Op::Access { mask: 0x3f }], b"");
    c.seq(
        "link",
        MINOR_VERSION,
        &[Op::Putfh { fh: &file }, Op::Savefh, Op::Putfh { fh: &dir }, Op::Link { name: b"seed-hard" }],
        b"",
    );
    c.seq(
        "rename",
        MINOR_VERSION,
        &[
            Op::Putfh { fh: &dir },
            Op::Savefh,
            Op::Rename { old: b"seed-hard", new: b"seed-moved" },
            Op::Restorefh,
        ],
        b"",
    );
    c.seq("remove", MINOR_VERSION, &[Op::Putfh { fh: &dir }, Op::Remove { name: b"seed-moved" }], b"");
    c.seq("remove-noent", MINOR_VERSION, &[Op::Putfh { fh: &dir }, Op::Remove { name: b"seed-moved" }], b"");
    c.seq("lookupp", MINOR_VERSION, &[Op::Putfh { fh: &file }, Op::Lookupp], b"");
    c.seq(
        "open-downgrade",
        MINOR_VERSION,
        &[
            Op::Putfh { fh: &file },
            Op::OpenDowngrade {
                stateid: open_sid,
                share_access: share::ACCESS_READ,
                share_deny: share::DENY_NONE,
            },
        ],
        b"",
    );
    c.seq(
        "listxattrs",
        MINOR_VERSION_XATTR,
        &[Op::Putfh { fh: &file }, Op::Listxattrs { cookie: 0, maxcount: 1024 }],
        b"",
    );
    c.seq("getxattr", MINOR_VERSION_XATTR, &[Op::Putfh { fh: &file }, Op::Getxattr { name: b"user.x" }], b"");
    c.seq("xattr-illegal", MINOR_VERSION, &[Op::Putfh { fh: &file }, Op::Getxattr { name: b"user.x" }], b"");
    c.seq("close", MINOR_VERSION, &[Op::Putfh { fh: &file }, Op::Close { stateid: open_sid }], b"");
    let sid = c.sid;
    c.call("destroy-session", MINOR_VERSION, Some(&[Op::DestroySession { session: sid }]), b"");
    c.call("destroy-clientid", MINOR_VERSION, Some(&[Op::DestroyClientid { clientid }]), b"");
    c.seq("bad-session", MINOR_VERSION, &[Op::Putrootfh], b"");

    let mut n = 0;
    for (name, body) in &c.out {
        let mut v = Vec::new();
        rec(&mut v, mode::WHOLE, body);
        rec(&mut v, mode::STREAM, body);
        rec(&mut v, mode::READ_HEAD | (31 << 2), body);
        std::fs::write(out.join(format!("dec-{name}")), v).unwrap();
        n += 1;
        let mut d = Decoder::new(body);
        if rpc::decode_reply(&mut d).map(|r| r.1.is_ok()) != Ok(true) {
            continue;
        }
        let Ok(comp) = decode_compound(&mut d) else { continue };
        for (i, r) in comp.results.enumerate() {
            if let Ok(OpRes::Getattr(a)) = r {
                let mut buf = vec![0u8; 8192];
                let mut e = Encoder::new(&mut buf);
                a.encode(&mut e).unwrap();
                let len = e.position();
                let mut v = Vec::new();
                rec(&mut v, mode::NO_RPC_HEADER | mode::FATTR, &buf[..len]);
                std::fs::write(out.join(format!("fattr-{name}-{i}")), v).unwrap();
                n += 1;
            }
        }
    }
    eprintln!("{} replies captured, {n} inputs written into {}", c.out.len(), out.display());
}
