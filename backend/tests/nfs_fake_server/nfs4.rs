//! NFSv4.1 for the fake server: a COMPOUND call's arguments parsed (the operations the tests
//! send, with what they check: SEQUENCE's slot and sequence id, WRITE's data, the session
//! operations' fields) and its results encoded (well-formed replies, or anything a test makes
//! of them).

use virtiofs_backend::nfs::wire::nfs4::{ChannelAttrs, Fattr4, Fh, Nfsstat4, OpNum, SessionId};
use virtiofs_backend::nfs::wire::xdr::Decoder;

use super::{enc, record, reply};

/// SEQUENCE's arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seq {
    pub session: SessionId,
    pub seqid: u32,
    pub slot: u32,
    pub highest: u32,
    pub cachethis: bool,
}

/// One operation of a COMPOUND call, with what the tests look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arg {
    Sequence(Seq),
    Putrootfh,
    Putfh(Vec<u8>),
    Getattr(Vec<u32>),
    Getfh,
    Lookup(Vec<u8>),
    Create {
        name: Vec<u8>,
    },
    Remove(Vec<u8>),
    Read {
        offset: u64,
        count: u32,
    },
    Write {
        offset: u64,
        stable: u32,
        data: Vec<u8>,
    },
    ReclaimComplete {
        one_fs: bool,
    },
    ExchangeId {
        verifier: [u8; 8],
        owner: Vec<u8>,
        flags: u32,
    },
    CreateSession {
        clientid: u64,
        sequence: u32,
        flags: u32,
        fore: ChannelAttrs,
        back: ChannelAttrs,
    },
    DestroySession(SessionId),
    DestroyClientid(u64),
    Readdir {
        cookie: u64,
        verf: [u8; 8],
        attrs: Vec<u32>,
    },
    Savefh,
    Restorefh,
    Rename {
        old: Vec<u8>,
        new: Vec<u8>,
    },
    Link(Vec<u8>),
    Access(u32),
    /// OPEN: the share access, whether it creates, the name of a CLAIM_NULL (`None`: by
    /// handle), and the delegation type of a CLAIM_PREVIOUS (`None`: another claim).
    Open {
        share_access: u32,
        create: bool,
        name: Option<Vec<u8>>,
        previous: Option<u32>,
    },
    Close {
        stateid: [u8; 16],
    },
    Setattr {
        stateid: [u8; 16],
    },
    Delegreturn,
    /// LOCK: its type (`nfs_lock_type4`), whether it reclaims, its range, whether it is the
    /// owner's first (`open_to_lock_owner4`), and the stateid it goes from (the open's if
    /// `new_owner`, else the lock's; also in [`Compound::stateids`]).
    Lock {
        locktype: u32,
        reclaim: bool,
        offset: u64,
        length: u64,
        new_owner: bool,
        stateid: [u8; 16],
    },
    /// LOCKU: the lock stateid and range.
    Locku {
        stateid: [u8; 16],
        offset: u64,
        length: u64,
    },
    FreeStateid {
        stateid: [u8; 16],
    },
    Commit {
        offset: u64,
        count: u32,
    },
}

impl Arg {
    pub fn op(&self) -> OpNum {
        match self {
            Arg::Sequence(_) => OpNum::Sequence,
            Arg::Putrootfh => OpNum::Putrootfh,
            Arg::Putfh(_) => OpNum::Putfh,
            Arg::Getattr(_) => OpNum::Getattr,
            Arg::Getfh => OpNum::Getfh,
            Arg::Lookup(_) => OpNum::Lookup,
            Arg::Create { .. } => OpNum::Create,
            Arg::Remove(_) => OpNum::Remove,
            Arg::Read { .. } => OpNum::Read,
            Arg::Write { .. } => OpNum::Write,
            Arg::ReclaimComplete { .. } => OpNum::ReclaimComplete,
            Arg::ExchangeId { .. } => OpNum::ExchangeId,
            Arg::CreateSession { .. } => OpNum::CreateSession,
            Arg::DestroySession(_) => OpNum::DestroySession,
            Arg::DestroyClientid(_) => OpNum::DestroyClientid,
            Arg::Readdir { .. } => OpNum::Readdir,
            Arg::Savefh => OpNum::Savefh,
            Arg::Restorefh => OpNum::Restorefh,
            Arg::Rename { .. } => OpNum::Rename,
            Arg::Link(_) => OpNum::Link,
            Arg::Access(_) => OpNum::Access,
            Arg::Open { .. } => OpNum::Open,
            Arg::Close { .. } => OpNum::Close,
            Arg::Commit { .. } => OpNum::Commit,
            Arg::Setattr { .. } => OpNum::Setattr,
            Arg::Delegreturn => OpNum::Delegreturn,
            Arg::Lock { .. } => OpNum::Lock,
            Arg::Locku { .. } => OpNum::Locku,
            Arg::FreeStateid { .. } => OpNum::FreeStateid,
        }
    }
}

/// A COMPOUND call's arguments.
#[derive(Clone, Debug)]
pub struct Compound {
    pub tag: Vec<u8>,
    pub minor: u32,
    pub ops: Vec<Arg>,
    /// The stateid each operation of `ops` carries (READ, WRITE, CLOSE, SETATTR, DELEGRETURN,
    /// LOCK, LOCKU, FREE_STATEID), `None` for the others.
    pub stateids: Vec<Option<[u8; 16]>>,
}

impl Compound {
    /// The SEQUENCE's arguments, if it starts with one.
    pub fn seq(&self) -> Option<Seq> {
        match self.ops.first() {
            Some(Arg::Sequence(s)) => Some(*s),
            _ => None,
        }
    }

    /// The operations' numbers, SEQUENCE's left out.
    pub fn ops(&self) -> Vec<OpNum> {
        self.ops.iter().map(Arg::op).filter(|o| *o != OpNum::Sequence).collect()
    }

    /// The stateid operation `i` of `ops` carries, if any.
    pub fn stateid(&self, i: usize) -> Option<[u8; 16]> {
        self.stateids.get(i).copied().flatten()
    }
}

fn bitmap(d: &mut Decoder<'_>) -> Vec<u32> {
    let n = d.u32().unwrap();
    (0..n).map(|_| d.u32().unwrap()).collect()
}

/// Skips an `fattr4` (its bitmap and its values).
fn fattr(d: &mut Decoder<'_>) {
    bitmap(d);
    d.opaque(u32::MAX, "attrlist").unwrap();
}

fn channel(d: &mut Decoder<'_>) -> ChannelAttrs {
    let mut c = ChannelAttrs {
        headerpadsize: d.u32().unwrap(),
        maxrequestsize: d.u32().unwrap(),
        maxresponsesize: d.u32().unwrap(),
        maxresponsesize_cached: d.u32().unwrap(),
        maxoperations: d.u32().unwrap(),
        maxrequests: d.u32().unwrap(),
        rdma_ird: None,
    };
    if d.u32().unwrap() == 1 {
        c.rdma_ird = Some(d.u32().unwrap());
    }
    c
}

/// Parses a COMPOUND call's arguments (after the RPC header); panics on an operation the tests
/// do not send, or on bytes left over.
pub fn parse(args: &[u8]) -> Compound {
    let mut d = Decoder::new(args);
    let tag = d.opaque(256, "tag").unwrap().to_vec();
    let minor = d.u32().unwrap();
    let n = d.u32().unwrap();
    let mut ops = Vec::new();
    let mut stateids = Vec::new();
    for _ in 0..n {
        let mut stateid = None;
        let num = d.u32().unwrap();
        let op = OpNum::from_u32(num).unwrap_or_else(|| panic!("operation {num} not parsed here"));
        ops.push(match op {
            OpNum::Sequence => Arg::Sequence(Seq {
                session: SessionId::decode(&mut d).unwrap(),
                seqid: d.u32().unwrap(),
                slot: d.u32().unwrap(),
                highest: d.u32().unwrap(),
                cachethis: d.bool().unwrap(),
            }),
            OpNum::Putrootfh => Arg::Putrootfh,
            OpNum::Putfh => Arg::Putfh(d.opaque(128, "fh").unwrap().to_vec()),
            OpNum::Getattr => Arg::Getattr(bitmap(&mut d)),
            OpNum::Getfh => Arg::Getfh,
            OpNum::Lookup => Arg::Lookup(d.opaque(1024, "name").unwrap().to_vec()),
            OpNum::Remove => Arg::Remove(d.opaque(1024, "name").unwrap().to_vec()),
            OpNum::Create => {
                match d.u32().unwrap() {
                    5 => {
                        d.opaque(4096, "link").unwrap();
                    }
                    3 | 4 => {
                        d.u32().unwrap();
                        d.u32().unwrap();
                    }
                    _ => {}
                }
                let name = d.opaque(1024, "name").unwrap().to_vec();
                bitmap(&mut d);
                d.opaque(4096, "attrlist").unwrap();
                Arg::Create { name }
            }
            OpNum::Read => {
                stateid = Some(d.array::<16>().unwrap());
                Arg::Read { offset: d.u64().unwrap(), count: d.u32().unwrap() }
            }
            OpNum::Write => {
                stateid = Some(d.array::<16>().unwrap());
                let offset = d.u64().unwrap();
                let stable = d.u32().unwrap();
                Arg::Write { offset, stable, data: d.opaque(u32::MAX, "data").unwrap().to_vec() }
            }
            OpNum::ReclaimComplete => Arg::ReclaimComplete { one_fs: d.bool().unwrap() },
            OpNum::ExchangeId => {
                let verifier = d.array::<8>().unwrap();
                let owner = d.opaque(1024, "owner").unwrap().to_vec();
                let flags = d.u32().unwrap();
                assert_eq!(d.u32().unwrap(), 0, "SP4_NONE");
                for _ in 0..d.u32().unwrap() {
                    d.opaque(1024, "domain").unwrap();
                    d.opaque(1024, "name").unwrap();
                    d.u64().unwrap();
                    d.u32().unwrap();
                }
                Arg::ExchangeId { verifier, owner, flags }
            }
            OpNum::CreateSession => {
                let clientid = d.u64().unwrap();
                let sequence = d.u32().unwrap();
                let flags = d.u32().unwrap();
                let fore = channel(&mut d);
                let back = channel(&mut d);
                d.u32().unwrap(); // cb_program
                for _ in 0..d.u32().unwrap() {
                    match d.u32().unwrap() {
                        0 => {}
                        1 => {
                            d.u32().unwrap();
                            d.opaque(255, "machine").unwrap();
                            d.u32().unwrap();
                            d.u32().unwrap();
                            for _ in 0..d.u32().unwrap() {
                                d.u32().unwrap();
                            }
                        }
                        f => panic!("callback security flavour {f}"),
                    }
                }
                Arg::CreateSession { clientid, sequence, flags, fore, back }
            }
            OpNum::DestroySession => Arg::DestroySession(SessionId::decode(&mut d).unwrap()),
            OpNum::DestroyClientid => Arg::DestroyClientid(d.u64().unwrap()),
            OpNum::Readdir => {
                let cookie = d.u64().unwrap();
                let verf = d.array::<8>().unwrap();
                d.u32().unwrap(); // dircount
                d.u32().unwrap(); // maxcount
                Arg::Readdir { cookie, verf, attrs: bitmap(&mut d) }
            }
            OpNum::Savefh => Arg::Savefh,
            OpNum::Restorefh => Arg::Restorefh,
            OpNum::Rename => {
                let old = d.opaque(1024, "old").unwrap().to_vec();
                Arg::Rename { old, new: d.opaque(1024, "new").unwrap().to_vec() }
            }
            OpNum::Link => Arg::Link(d.opaque(1024, "name").unwrap().to_vec()),
            OpNum::Access => Arg::Access(d.u32().unwrap()),
            OpNum::Open => {
                d.u32().unwrap(); // seqid
                let share_access = d.u32().unwrap();
                d.u32().unwrap(); // share_deny
                d.u64().unwrap();
                d.opaque(1024, "owner").unwrap();
                let create = d.u32().unwrap() == 1;
                if create {
                    match d.u32().unwrap() {
                        0 | 1 => fattr(&mut d),
                        2 => {
                            d.array::<8>().unwrap();
                        }
                        3 => {
                            d.array::<8>().unwrap();
                            fattr(&mut d);
                        }
                        m => panic!("createmode {m}"),
                    }
                }
                let (name, previous) = match d.u32().unwrap() {
                    0 => (Some(d.opaque(1024, "name").unwrap().to_vec()), None),
                    1 => (None, Some(d.u32().unwrap())),
                    4 => (None, None),
                    c => panic!("open claim {c}"),
                };
                Arg::Open { share_access, create, name, previous }
            }
            OpNum::Close => {
                d.u32().unwrap(); // seqid
                let s = d.array::<16>().unwrap();
                stateid = Some(s);
                Arg::Close { stateid: s }
            }
            OpNum::Setattr => {
                let s = d.array::<16>().unwrap();
                stateid = Some(s);
                fattr(&mut d);
                Arg::Setattr { stateid: s }
            }
            OpNum::Delegreturn => {
                stateid = Some(d.array::<16>().unwrap());
                Arg::Delegreturn
            }
            OpNum::Lock => {
                let locktype = d.u32().unwrap();
                let reclaim = d.bool().unwrap();
                let offset = d.u64().unwrap();
                let length = d.u64().unwrap();
                let new_owner = d.bool().unwrap();
                let s = if new_owner {
                    d.u32().unwrap(); // open seqid
                    let s = d.array::<16>().unwrap();
                    d.u32().unwrap(); // lock seqid
                    d.u64().unwrap(); // clientid
                    d.opaque(1024, "owner").unwrap();
                    s
                } else {
                    let s = d.array::<16>().unwrap();
                    d.u32().unwrap(); // lock seqid
                    s
                };
                stateid = Some(s);
                Arg::Lock { locktype, reclaim, offset, length, new_owner, stateid: s }
            }
            OpNum::Locku => {
                d.u32().unwrap(); // locktype
                d.u32().unwrap(); // seqid
                let s = d.array::<16>().unwrap();
                stateid = Some(s);
                Arg::Locku { stateid: s, offset: d.u64().unwrap(), length: d.u64().unwrap() }
            }
            OpNum::FreeStateid => {
                let s = d.array::<16>().unwrap();
                stateid = Some(s);
                Arg::FreeStateid { stateid: s }
            }
            OpNum::Commit => Arg::Commit { offset: d.u64().unwrap(), count: d.u32().unwrap() },
            op => panic!("{op:?} not parsed here"),
        });
        stateids.push(stateid);
    }
    d.finish().expect("every byte of the COMPOUND used");
    Compound { tag, minor, ops, stateids }
}

/// A whole reply record: the RPC header for `xid`, then COMPOUND4res of `status` (the last
/// result's), the call's tag and `results`.
pub fn compound_reply(xid: u32, status: Nfsstat4, results: &[Vec<u8>]) -> Vec<u8> {
    record(&reply(xid, &compound_res(status, results)))
}

/// COMPOUND4res: `status`, an empty tag, `results`.
pub fn compound_res(status: Nfsstat4, results: &[Vec<u8>]) -> Vec<u8> {
    let mut v = enc(|e| {
        e.u32(status.to_u32()).unwrap();
        e.opaque(b"", 256).unwrap();
        e.u32(results.len() as u32).unwrap();
    });
    for r in results {
        v.extend_from_slice(r);
    }
    v
}

/// A successful result of `op` with `body`.
pub fn ok(op: OpNum, body: &[u8]) -> Vec<u8> {
    let mut v = enc(|e| {
        e.u32(op as u32).unwrap();
        e.u32(0).unwrap();
    });
    v.extend_from_slice(body);
    v
}

/// A failed result of `op`.
pub fn failed(op: OpNum, status: Nfsstat4) -> Vec<u8> {
    enc(|e| {
        e.u32(op as u32).unwrap();
        e.u32(status.to_u32()).unwrap();
    })
}

/// SEQUENCE's result echoing `s`.
pub fn seq_ok(s: &Seq, highest: u32, target: u32, flags: u32) -> Vec<u8> {
    ok(
        OpNum::Sequence,
        &enc(|e| {
            s.session.encode(e).unwrap();
            e.u32(s.seqid).unwrap();
            e.u32(s.slot).unwrap();
            e.u32(highest).unwrap();
            e.u32(target).unwrap();
            e.u32(flags).unwrap();
        }),
    )
}

pub fn exchange_id_ok(clientid: u64, sequence: u32, flags: u32) -> Vec<u8> {
    exchange_id_as(clientid, sequence, flags, b"fake server", b"fake scope")
}

/// EXCHANGE_ID's result from a server whose owner major id is `major` and scope `scope`.
pub fn exchange_id_as(clientid: u64, sequence: u32, flags: u32, major: &[u8], scope: &[u8]) -> Vec<u8> {
    ok(
        OpNum::ExchangeId,
        &enc(|e| {
            e.u64(clientid).unwrap();
            e.u32(sequence).unwrap();
            e.u32(flags).unwrap();
            e.u32(0).unwrap(); // SP4_NONE
            e.u64(1).unwrap();
            e.opaque(major, 1024).unwrap();
            e.opaque(scope, 1024).unwrap();
            e.u32(0).unwrap(); // no impl id
        }),
    )
}

/// CREATE_SESSION's result granting `fore` (the back channel asked is granted as one slot).
pub fn create_session_ok(session: SessionId, sequence: u32, fore: &ChannelAttrs) -> Vec<u8> {
    ok(
        OpNum::CreateSession,
        &enc(|e| {
            session.encode(e).unwrap();
            e.u32(sequence).unwrap();
            e.u32(0).unwrap();
            fore.encode(e).unwrap();
            ChannelAttrs { maxrequests: 1, ..*fore }.encode(e).unwrap();
        }),
    )
}

pub fn getattr_ok(a: &Fattr4) -> Vec<u8> {
    ok(OpNum::Getattr, &enc(|e| a.encode(e).unwrap()))
}

pub fn getfh_ok(fh: &Fh) -> Vec<u8> {
    ok(OpNum::Getfh, &enc(|e| fh.encode(e).unwrap()))
}

/// CREATE's result: change info, no attributes set.
pub fn create_ok() -> Vec<u8> {
    ok(
        OpNum::Create,
        &enc(|e| {
            e.bool(true).unwrap();
            e.u64(1).unwrap();
            e.u64(2).unwrap();
            e.u32(0).unwrap();
        }),
    )
}

/// READ's result: `eof`, then `len` as the data's length (to lie about it) and `data`.
pub fn read_ok_len(eof: bool, len: u32, data: &[u8]) -> Vec<u8> {
    ok(
        OpNum::Read,
        &enc(|e| {
            e.bool(eof).unwrap();
            e.u32(len).unwrap();
            e.fixed(data).unwrap();
        }),
    )
}

pub fn read_ok(eof: bool, data: &[u8]) -> Vec<u8> {
    read_ok_len(eof, data.len() as u32, data)
}

pub fn commit_ok(verf: [u8; 8]) -> Vec<u8> {
    ok(OpNum::Commit, &verf)
}

pub fn write_ok(count: u32, stable: u32, verf: [u8; 8]) -> Vec<u8> {
    ok(
        OpNum::Write,
        &enc(|e| {
            e.u32(count).unwrap();
            e.u32(stable).unwrap();
            e.fixed(&verf).unwrap();
        }),
    )
}

/// READDIR's result: the cookie verifier, `entries` (cookie, name, attributes) and `eof`.
pub fn readdir_ok(verf: [u8; 8], entries: &[(u64, &[u8], Fattr4)], eof: bool) -> Vec<u8> {
    ok(
        OpNum::Readdir,
        &enc(|e| {
            e.fixed(&verf).unwrap();
            for (cookie, name, a) in entries {
                e.bool(true).unwrap();
                e.u64(*cookie).unwrap();
                e.opaque(name, 1024).unwrap();
                a.encode(e).unwrap();
            }
            e.bool(false).unwrap();
            e.bool(eof).unwrap();
        }),
    )
}

/// Change info (atomic, before, after).
fn cinfo(e: &mut virtiofs_backend::nfs::wire::xdr::Encoder<'_>) {
    e.bool(true).unwrap();
    e.u64(1).unwrap();
    e.u64(2).unwrap();
}

/// REMOVE's result.
pub fn remove_ok() -> Vec<u8> {
    ok(OpNum::Remove, &enc(cinfo))
}

/// RENAME's result.
pub fn rename_ok() -> Vec<u8> {
    ok(
        OpNum::Rename,
        &enc(|e| {
            cinfo(e);
            cinfo(e);
        }),
    )
}

/// LINK's result.
pub fn link_ok() -> Vec<u8> {
    ok(OpNum::Link, &enc(cinfo))
}

/// OPEN's result: `stateid` (seqid 1 and `other`), no flags, no delegation.
pub fn open_ok(other: [u8; 12]) -> Vec<u8> {
    open_ok_deleg(other, None)
}

/// OPEN's result: `stateid` (seqid 1 and `other`), no flags, a read delegation (its stateid's
/// `other`) if `deleg`.
pub fn open_ok_deleg(other: [u8; 12], deleg: Option<[u8; 12]>) -> Vec<u8> {
    ok(
        OpNum::Open,
        &enc(|e| {
            e.u32(1).unwrap();
            e.fixed(&other).unwrap();
            cinfo(e);
            e.u32(0).unwrap(); // rflags
            e.u32(0).unwrap(); // attrset: an empty bitmap
            match deleg {
                None => e.u32(0).unwrap(), // OPEN_DELEGATE_NONE
                Some(d) => {
                    e.u32(1).unwrap(); // OPEN_DELEGATE_READ
                    e.u32(1).unwrap();
                    e.fixed(&d).unwrap();
                    e.bool(false).unwrap(); // recall
                    e.u32(0).unwrap(); // nfsace4: type, flag, mask, who
                    e.u32(0).unwrap();
                    e.u32(0).unwrap();
                    e.opaque(b"", 1024).unwrap();
                }
            }
        }),
    )
}

/// LOCK's or LOCKU's result (`op`): the lock stateid, `other` with seqid 1.
pub fn lock_ok(op: OpNum, other: [u8; 12]) -> Vec<u8> {
    lock_ok_seq(op, 1, other)
}

/// LOCK's or LOCKU's result (`op`): the lock stateid `seqid`, `other`.
pub fn lock_ok_seq(op: OpNum, seqid: u32, other: [u8; 12]) -> Vec<u8> {
    ok(
        op,
        &enc(|e| {
            e.u32(seqid).unwrap();
            e.fixed(&other).unwrap();
        }),
    )
}

/// CLOSE's result: the (invalid) stateid it leaves.
pub fn close_ok() -> Vec<u8> {
    ok(OpNum::Close, &enc(|e| e.fixed(&[0xff; 16]).unwrap()))
}

/// SETATTR's result: the attributes set (none listed).
pub fn setattr_ok() -> Vec<u8> {
    ok(OpNum::Setattr, &enc(|e| e.u32(0).unwrap()))
}

/// SETATTR's failure: the status and the (empty) set of attributes set.
pub fn setattr_failed(status: Nfsstat4) -> Vec<u8> {
    let mut v = failed(OpNum::Setattr, status);
    v.extend_from_slice(&enc(|e| e.u32(0).unwrap()));
    v
}
