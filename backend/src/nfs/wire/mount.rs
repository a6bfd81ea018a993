//! MOUNT v3 (RFC 1813 appendix I), program 100005: MNT (export path to root handle) and UMNT.

use super::nfs3::{Fh, FHSIZE3};
use super::xdr::{Decoder, Encoder};
use super::WireError;

/// The MOUNT program number.
pub const PROGRAM: u32 = 100_005;
/// MOUNT version 3 (the one that goes with NFSv3).
pub const VERSION: u32 = 3;
/// MOUNTPROC3_MNT.
pub const PROC_MNT: u32 = 1;
/// MOUNTPROC3_UMNT.
pub const PROC_UMNT: u32 = 3;
/// MNTPATHLEN.
pub const MNTPATHLEN: u32 = 1024;
/// Most authentication flavors a MNT reply may list that we accept.
const MAX_FLAVORS: u32 = 64;

/// The arguments of MNT and UMNT: the export's path.
pub fn encode_dirpath(e: &mut Encoder<'_>, path: &[u8]) -> Result<(), WireError> {
    e.opaque(path, MNTPATHLEN)
}

/// A MNT reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MntRes {
    /// The export's root handle, and whether AUTH_SYS is among the flavors the server accepts
    /// (or none were listed).
    Ok {
        /// Root file handle.
        root: Fh,
        /// AUTH_SYS may be used.
        auth_sys: bool,
    },
    /// `mountstat3` other than MNT3_OK (1 EPERM, 2 ENOENT, 13 EACCES, 20 ENOTDIR, 22 EINVAL,
    /// 63 ENAMETOOLONG, 10004 ENOTSUPP, 10006 SERVERFAULT).
    Failed(u32),
}

/// Decodes MNT's results.
pub fn decode_mnt(d: &mut Decoder<'_>) -> Result<MntRes, WireError> {
    let status = d.u32()?;
    if status != 0 {
        d.finish()?;
        return Ok(MntRes::Failed(status));
    }
    let fh = d.opaque(FHSIZE3 as u32, "fhandle3")?;
    let root = Fh::new(fh).ok_or(WireError::TooLong { what: "fhandle3", len: fh.len() as u32, max: 64 })?;
    let n = d.u32()?;
    if n > MAX_FLAVORS {
        return Err(WireError::TooLong { what: "auth_flavors", len: n, max: MAX_FLAVORS });
    }
    let mut auth_sys = n == 0;
    for _ in 0..n {
        auth_sys |= d.u32()? == super::rpc::AUTH_SYS;
    }
    d.finish()?;
    Ok(MntRes::Ok { root, auth_sys })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mnt_reply_decoding() {
        let mut buf = [0u8; 128];
        let mut e = Encoder::new(&mut buf);
        e.u32(0).unwrap();
        e.opaque(&[1, 2, 3, 4, 5], 64).unwrap();
        e.u32(2).unwrap();
        e.u32(0).unwrap();
        e.u32(1).unwrap();
        let n = e.position();
        let root = Fh::new(&[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(decode_mnt(&mut Decoder::new(&buf[..n])), Ok(MntRes::Ok { root, auth_sys: true }));
        assert!(decode_mnt(&mut Decoder::new(&buf[..n - 1])).is_err());
        assert_eq!(decode_mnt(&mut Decoder::new(&13u32.to_be_bytes())), Ok(MntRes::Failed(13)));
        let mut e = Encoder::new(&mut buf);
        e.u32(0).unwrap();
        e.u32(65).unwrap(); // a handle over 64 bytes
        assert!(decode_mnt(&mut Decoder::new(&buf[..72])).is_err());
    }
}
