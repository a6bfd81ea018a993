//! Portmapper v2 (RFC 1833), program 100000: GETPORT, to find the NFS and MOUNT ports.

use super::xdr::{Decoder, Encoder};
use super::WireError;

/// The portmapper's program number.
pub const PROGRAM: u32 = 100_000;
/// Version 2.
pub const VERSION: u32 = 2;
/// PMAPPROC_GETPORT.
pub const PROC_GETPORT: u32 = 3;
/// The portmapper's well-known port.
pub const PORT: u16 = 111;
/// IPPROTO_TCP.
pub const IPPROTO_TCP: u32 = 6;

/// GETPORT's argument: which program, version and protocol (the port field is ignored).
pub fn encode_getport(e: &mut Encoder<'_>, prog: u32, vers: u32) -> Result<(), WireError> {
    e.u32(prog)?;
    e.u32(vers)?;
    e.u32(IPPROTO_TCP)?;
    e.u32(0)
}

/// GETPORT's result: the port, or `None` when the program is not registered (port 0).
pub fn decode_getport(d: &mut Decoder<'_>) -> Result<Option<u16>, WireError> {
    let port = d.u32()?;
    d.finish()?;
    match port {
        0 => Ok(None),
        p => u16::try_from(p).map(Some).map_err(|_| WireError::BadValue { what: "port", value: p }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getport_codec() {
        let mut buf = [0u8; 16];
        encode_getport(&mut Encoder::new(&mut buf), 100_003, 3).unwrap();
        assert_eq!(&buf[8..12], &6u32.to_be_bytes());
        assert_eq!(decode_getport(&mut Decoder::new(&2049u32.to_be_bytes())), Ok(Some(2049)));
        assert_eq!(decode_getport(&mut Decoder::new(&0u32.to_be_bytes())), Ok(None));
        assert!(decode_getport(&mut Decoder::new(&70000u32.to_be_bytes())).is_err());
        assert!(decode_getport(&mut Decoder::new(&[0, 0])).is_err());
    }
}
