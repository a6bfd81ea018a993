//! ONC RPC v2 (RFC 5531) calls and replies, with AUTH_SYS credentials.
//!
//! A call is encoded as its header ([`encode_call`]) followed by the program's arguments; a reply
//! is decoded by [`decode_reply`], which checks the message type, skips the verifier and turns
//! a denied or unsuccessful reply into an [`RpcError`], leaving the decoder at the results.

use super::xdr::{Decoder, Encoder};
use super::WireError;

/// RPC protocol version.
pub const RPC_VERSION: u32 = 2;
/// `msg_type` CALL.
pub const CALL: u32 = 0;
/// `msg_type` REPLY.
pub const REPLY: u32 = 1;
/// Authentication flavor AUTH_NONE.
pub const AUTH_NONE: u32 = 0;
/// Authentication flavor AUTH_SYS (AUTH_UNIX).
pub const AUTH_SYS: u32 = 1;
/// Longest opaque authentication body (RFC 5531).
pub const MAX_AUTH_BYTES: u32 = 400;
/// Longest AUTH_SYS machine name.
pub const MAX_MACHINE_NAME: usize = 255;
/// Most supplementary groups an AUTH_SYS credential carries.
pub const MAX_GIDS: usize = 16;
/// Largest call header: xid, type, versions, program, procedure, a full AUTH_SYS credential and
/// an AUTH_NONE verifier.
pub const MAX_CALL_HEADER: usize = 6 * 4 + (2 * 4 + 4 + 4 + 256 + 4 + 4 + 4 + 4 * MAX_GIDS) + 2 * 4;

/// An AUTH_SYS credential (RFC 5531 appendix A), borrowed.
#[derive(Debug, Clone, Copy)]
pub struct AuthSys<'a> {
    /// Arbitrary id the caller chooses (we use the connection's start time).
    pub stamp: u32,
    /// The caller's host name (at most [`MAX_MACHINE_NAME`] bytes).
    pub machine: &'a [u8],
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
    /// Supplementary groups (at most [`MAX_GIDS`]).
    pub gids: &'a [u32],
}

/// The header of a call to `prog`/`vers`/`proc` with credential `auth`.
pub fn encode_call(
    e: &mut Encoder<'_>,
    xid: u32,
    prog: u32,
    vers: u32,
    proc: u32,
    auth: &AuthSys<'_>,
) -> Result<(), WireError> {
    if auth.machine.len() > MAX_MACHINE_NAME {
        return Err(WireError::TooLong { what: "machine name", len: auth.machine.len() as u32, max: 255 });
    }
    if auth.gids.len() > MAX_GIDS {
        return Err(WireError::TooLong { what: "gids", len: auth.gids.len() as u32, max: MAX_GIDS as u32 });
    }
    e.u32(xid)?;
    e.u32(CALL)?;
    e.u32(RPC_VERSION)?;
    e.u32(prog)?;
    e.u32(vers)?;
    e.u32(proc)?;
    e.u32(AUTH_SYS)?;
    let len_at = e.reserve_u32()?;
    let start = e.position();
    e.u32(auth.stamp)?;
    e.opaque(auth.machine, MAX_MACHINE_NAME as u32)?;
    e.u32(auth.uid)?;
    e.u32(auth.gid)?;
    e.u32(auth.gids.len() as u32)?;
    for g in auth.gids {
        e.u32(*g)?;
    }
    let body = (e.position() - start) as u32;
    e.patch_u32(len_at, body);
    e.u32(AUTH_NONE)?;
    e.u32(0)
}

/// Why a server did not run a call (a well-formed reply that is not `SUCCESS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// PROG_UNAVAIL: the program is not served there.
    #[error("program unavailable")]
    ProgUnavail,
    /// PROG_MISMATCH: the version is not served.
    #[error("program version mismatch (server has {low}..={high})")]
    ProgMismatch {
        /// Lowest version served.
        low: u32,
        /// Highest version served.
        high: u32,
    },
    /// PROC_UNAVAIL: no such procedure.
    #[error("procedure unavailable")]
    ProcUnavail,
    /// GARBAGE_ARGS: the server could not decode the arguments.
    #[error("server could not decode the arguments")]
    GarbageArgs,
    /// SYSTEM_ERR: the server failed (memory, ...).
    #[error("server system error")]
    SystemErr,
    /// MSG_DENIED / RPC_MISMATCH.
    #[error("RPC version mismatch (server has {low}..={high})")]
    RpcMismatch {
        /// Lowest version served.
        low: u32,
        /// Highest version served.
        high: u32,
    },
    /// MSG_DENIED / AUTH_ERROR with its `auth_stat`.
    #[error("authentication refused (auth_stat {0})")]
    AuthError(u32),
}

/// The transaction id of a reply (its first word), without checking anything else.
pub fn peek_xid(record: &[u8]) -> Option<u32> {
    let b = record.get(..4)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Decodes a reply's header: `Ok((xid, Ok(())))` leaves `d` at the procedure's results;
/// `Ok((xid, Err(e)))` is a well-formed refusal; `Err` is a malformed message.
pub fn decode_reply(d: &mut Decoder<'_>) -> Result<(u32, Result<(), RpcError>), WireError> {
    let xid = d.u32()?;
    match d.u32()? {
        REPLY => {}
        value => return Err(WireError::BadValue { what: "msg_type", value }),
    }
    let status = match d.u32()? {
        0 => {
            // MSG_ACCEPTED: verifier (skipped), accept_stat.
            let _flavor = d.u32()?;
            d.opaque(MAX_AUTH_BYTES, "verifier")?;
            match d.u32()? {
                0 => Ok(()),
                1 => Err(RpcError::ProgUnavail),
                2 => Err(RpcError::ProgMismatch { low: d.u32()?, high: d.u32()? }),
                3 => Err(RpcError::ProcUnavail),
                4 => Err(RpcError::GarbageArgs),
                5 => Err(RpcError::SystemErr),
                value => return Err(WireError::BadValue { what: "accept_stat", value }),
            }
        }
        1 => match d.u32()? {
            0 => Err(RpcError::RpcMismatch { low: d.u32()?, high: d.u32()? }),
            1 => Err(RpcError::AuthError(d.u32()?)),
            value => return Err(WireError::BadValue { what: "reject_stat", value }),
        },
        value => return Err(WireError::BadValue { what: "reply_stat", value }),
    };
    Ok((xid, status))
}

/// Encodes an accepted, successful reply header (for tests and fake servers).
pub fn encode_success_reply(e: &mut Encoder<'_>, xid: u32) -> Result<(), WireError> {
    e.u32(xid)?;
    e.u32(REPLY)?;
    e.u32(0)?;
    e.u32(AUTH_NONE)?;
    e.u32(0)?;
    e.u32(0)
}

/// A decoded call header (for tests and fake servers): xid, program, version, procedure, and the
/// AUTH_SYS uid/gid/gid count when the credential is AUTH_SYS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallHeader {
    /// Transaction id.
    pub xid: u32,
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure.
    pub proc: u32,
    /// AUTH_SYS (uid, gid, number of supplementary groups), if that was the flavor.
    pub sys: Option<(u32, u32, u32)>,
}

/// Decodes a call header, leaving `d` at the arguments.
pub fn decode_call(d: &mut Decoder<'_>) -> Result<CallHeader, WireError> {
    let xid = d.u32()?;
    match d.u32()? {
        CALL => {}
        value => return Err(WireError::BadValue { what: "msg_type", value }),
    }
    match d.u32()? {
        RPC_VERSION => {}
        value => return Err(WireError::BadValue { what: "rpcvers", value }),
    }
    let (prog, vers, proc) = (d.u32()?, d.u32()?, d.u32()?);
    let flavor = d.u32()?;
    let body = d.opaque(MAX_AUTH_BYTES, "credential")?;
    let sys = if flavor == AUTH_SYS {
        let mut b = Decoder::new(body);
        let _stamp = b.u32()?;
        b.opaque(MAX_MACHINE_NAME as u32, "machine name")?;
        let (uid, gid) = (b.u32()?, b.u32()?);
        let n = b.u32()?;
        if n as usize > MAX_GIDS {
            return Err(WireError::TooLong { what: "gids", len: n, max: MAX_GIDS as u32 });
        }
        b.skip(4 * n as usize)?;
        b.finish()?;
        Some((uid, gid, n))
    } else {
        None
    };
    let _verf_flavor = d.u32()?;
    d.opaque(MAX_AUTH_BYTES, "verifier")?;
    Ok(CallHeader { xid, prog, vers, proc, sys })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_header_round_trip_with_full_credential() {
        let mut buf = [0u8; MAX_CALL_HEADER];
        let name = [b'm'; MAX_MACHINE_NAME];
        let gids = [7u32; MAX_GIDS];
        let auth = AuthSys { stamp: 1, machine: &name, uid: 1000, gid: 100, gids: &gids };
        let mut e = Encoder::new(&mut buf);
        encode_call(&mut e, 0xdead_beef, 100_003, 3, 6, &auth).unwrap();
        assert_eq!(e.position(), MAX_CALL_HEADER, "the bound is exact for the largest credential");
        let n = e.position();
        let h = decode_call(&mut Decoder::new(&buf[..n])).unwrap();
        assert_eq!(
            h,
            CallHeader { xid: 0xdead_beef, prog: 100_003, vers: 3, proc: 6, sys: Some((1000, 100, 16)) }
        );
        let too_many = [0u32; 17];
        let auth = AuthSys { gids: &too_many, ..auth };
        assert!(encode_call(&mut Encoder::new(&mut buf), 1, 1, 1, 1, &auth).is_err());
    }

    #[test]
    fn replies_accepted_denied_and_malformed() {
        let mut buf = [0u8; 64];
        let mut e = Encoder::new(&mut buf);
        encode_success_reply(&mut e, 5).unwrap();
        e.u32(42).unwrap();
        let n = e.position();
        let mut d = Decoder::new(&buf[..n]);
        assert_eq!(decode_reply(&mut d), Ok((5, Ok(()))));
        assert_eq!(d.u32(), Ok(42), "left at the results");

        let words = |w: &[u32]| w.iter().flat_map(|x| x.to_be_bytes()).collect::<Vec<u8>>();
        let mismatch = words(&[9, 1, 0, 0, 0, 2, 3, 3]);
        assert_eq!(
            decode_reply(&mut Decoder::new(&mismatch)),
            Ok((9, Err(RpcError::ProgMismatch { low: 3, high: 3 })))
        );
        let auth = words(&[9, 1, 1, 1, 5]);
        assert_eq!(decode_reply(&mut Decoder::new(&auth)), Ok((9, Err(RpcError::AuthError(5)))));
        // A verifier with a non-zero body is skipped.
        let verf = words(&[9, 1, 0, 1, 8, 0xaaaa, 0xbbbb, 0]);
        assert_eq!(decode_reply(&mut Decoder::new(&verf)), Ok((9, Ok(()))));
        // A call where a reply should be, a bad reply_stat, an oversized verifier.
        assert!(decode_reply(&mut Decoder::new(&words(&[9, 0]))).is_err());
        assert!(decode_reply(&mut Decoder::new(&words(&[9, 1, 7]))).is_err());
        assert!(decode_reply(&mut Decoder::new(&words(&[9, 1, 0, 0, 401]))).is_err());
        assert!(decode_reply(&mut Decoder::new(&words(&[9, 1, 0, 0, 0, 6]))).is_err());
    }
}
