//! The `nfs4_reply` target: what an NFSv4.1 server sends the client, through the COMPOUND reply
//! decoders (`nfs::wire::nfs4`). Each record is one reply: the RPC reply header first unless
//! the flags' bit 7 is set, then the COMPOUND's results; the flags' low 2 bits say how it is
//! decoded:
//!
//! - `0`: [`decode_compound`], the whole reply checked, then every result, READDIR entry, xattr
//!   name and TEST_STATEID status iterated in place;
//! - `1`: as a connection decodes while the bytes come: [`decode_compound_head`], then
//!   [`decode_op`] per result; where the whole-reply decoder accepted the reply, the results
//!   must be the same operations with the same statuses;
//! - `2`: up to a READ's data: the head and results as in `1` until a READ, whose result is
//!   decoded by [`decode_read_head`] with the data's bound from the flags' bits 2-6 (in KiB);
//! - `3`: a `fattr4` alone.
//!
//! Invariants checked beyond "no panic": a reply `decode_compound` accepted iterates without an
//! error (its lists too) and has as many results as it said, only its last result may have
//! failed and the COMPOUND's status is that result's; a READ head never reports more data than
//! the bound.

use virtiofs_backend::nfs::wire::nfs4::{
    decode_compound, decode_compound_head, decode_op, decode_read_head, Fattr4, Nfsstat4, OpNum, OpRes,
    ReadHead, MAX_NAME,
};
use virtiofs_backend::nfs::wire::rpc;
use virtiofs_backend::nfs::wire::xdr::Decoder;

use super::records;

/// Decoding modes (a record's flags, low 2 bits).
pub mod mode {
    /// The whole reply, then everything iterated.
    pub const WHOLE: u8 = 0;
    /// The head, then result after result.
    pub const STREAM: u8 = 1;
    /// Results up to a READ's data.
    pub const READ_HEAD: u8 = 2;
    /// A `fattr4` alone.
    pub const FATTR: u8 = 3;
    /// No RPC reply header before the COMPOUND's results.
    pub const NO_RPC_HEADER: u8 = 0x80;
}

/// Entry point: see the module's documentation.
pub fn nfs4_reply(data: &[u8]) {
    for (flags, body) in records(data) {
        let mut d = Decoder::new(body);
        if flags & mode::NO_RPC_HEADER == 0 {
            match rpc::decode_reply(&mut d) {
                Ok((_, Ok(()))) => {}
                Ok((_, Err(_))) | Err(_) => continue,
            }
        }
        match flags & 3 {
            mode::WHOLE => whole(d),
            mode::STREAM => stream(d),
            mode::READ_HEAD => read_head(d, u32::from((flags >> 2) & 0x1f) << 10),
            mode::FATTR => {
                let _ = Fattr4::decode(&mut d);
            }
            _ => {}
        }
    }
}

/// The whole reply, checked, then every result and list iterated.
fn whole(mut d: Decoder<'_>) {
    let Ok(c) = decode_compound(&mut d) else { return };
    assert_eq!(d.remaining(), 0, "a checked reply uses every byte");
    let count = c.results.len();
    let mut n = 0;
    let mut last = Nfsstat4::Ok;
    for r in c.results {
        let r = r.expect("a checked reply's results decode");
        assert!(last.is_ok(), "a result after a failed one");
        last = r.status();
        n += 1;
        match r {
            OpRes::Readdir { entries, .. } => {
                for e in entries {
                    assert!(e.expect("checked entries decode").name.len() <= MAX_NAME as usize);
                }
            }
            OpRes::Listxattrs { names, .. } => {
                for name in names {
                    assert!(name.expect("checked names decode").len() <= MAX_NAME as usize);
                }
            }
            OpRes::TestStateid(codes) => {
                for code in codes {
                    code.expect("checked statuses decode");
                }
            }
            OpRes::Failed { op, status, denied } => {
                assert!(!status.is_ok());
                assert!(denied.is_none() || matches!(op, OpNum::Lock | OpNum::Lockt));
            }
            _ => {}
        }
    }
    assert_eq!(n, count, "as many results as the reply said");
    if n > 0 {
        assert_eq!(last, c.status, "the COMPOUND's status is its last result's");
    }
}

/// The head, then result after result; compared with the whole-reply decoder where it accepts.
fn stream(d: Decoder<'_>) {
    let whole: Option<Vec<(OpNum, Nfsstat4)>> = decode_compound(&mut d.clone())
        .ok()
        .map(|c| c.results.map(|r| r.map(|r| (r.op(), r.status())).expect("checked")).collect());
    let mut d = d;
    let Ok(head) = decode_compound_head(&mut d) else {
        assert!(whole.is_none());
        return;
    };
    let mut got = Vec::new();
    for _ in 0..head.count {
        match decode_op(&mut d) {
            Ok(r) => got.push((r.op(), r.status())),
            Err(_) => break,
        }
    }
    if let Some(whole) = whole {
        assert_eq!(whole, got, "both decoders see the same results");
    }
}

/// Results up to a READ, then its head.
fn read_head(mut d: Decoder<'_>, asked: u32) {
    let Ok(head) = decode_compound_head(&mut d) else { return };
    for _ in 0..head.count {
        // A READ's result starts with its operation number.
        if d.clone().u32() == Ok(OpNum::Read as u32) {
            if let Ok(ReadHead::Ok { len, .. }) = decode_read_head(&mut d, asked) {
                assert!(len <= asked, "a READ head over its bound");
                let _ = d.fixed(len as usize);
            }
            return;
        }
        if decode_op(&mut d).is_err() {
            return;
        }
    }
}
