//! [`Fh`]: a file handle of either protocol, up to [`FHSIZE`] (NFS4_FHSIZE, 128) opaque bytes
//! inline, compared and hashed by value. One type for NFSv3 and NFSv4.1, so the node table, the
//! open handles and the UNSTABLE store serve both: the NFSv3 codec still refuses a handle of
//! more than [`FHSIZE3`] bytes on the wire ([`Fh::decode3`], [`Fh::encode3`]).

use super::xdr::{Decoder, Encoder};
use super::WireError;

/// Largest file handle of either protocol (NFS4_FHSIZE).
pub const FHSIZE: usize = 128;
/// Largest NFSv3 file handle (NFS3_FHSIZE).
pub const FHSIZE3: usize = 64;

/// A file handle: up to [`FHSIZE`] opaque bytes, inline, compared by value.
#[derive(Clone, Copy)]
pub struct Fh {
    len: u8,
    bytes: [u8; FHSIZE],
}

impl Fh {
    /// The empty handle (a placeholder; no server gives one).
    pub const EMPTY: Fh = Fh { len: 0, bytes: [0; FHSIZE] };

    /// A handle with these bytes, or `None` when there are more than [`FHSIZE`].
    pub fn new(bytes: &[u8]) -> Option<Fh> {
        if bytes.len() > FHSIZE {
            return None;
        }
        let mut b = [0u8; FHSIZE];
        b[..bytes.len()].copy_from_slice(bytes);
        Some(Fh { len: bytes.len() as u8, bytes: b })
    }

    /// The handle's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    fn decode_max(d: &mut Decoder<'_>, max: usize, what: &'static str) -> Result<Fh, WireError> {
        let b = d.opaque(max as u32, what)?;
        match Fh::new(b) {
            Some(fh) if b.len() <= max => Ok(fh),
            _ => Err(WireError::TooLong { what, len: b.len() as u32, max: max as u32 }),
        }
    }

    fn encode_max(&self, e: &mut Encoder<'_>, max: usize, what: &'static str) -> Result<(), WireError> {
        if self.as_bytes().len() > max {
            return Err(WireError::TooLong { what, len: self.as_bytes().len() as u32, max: max as u32 });
        }
        e.opaque(self.as_bytes(), max as u32)
    }

    /// Decodes an `nfs_fh4`.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Fh, WireError> {
        Fh::decode_max(d, FHSIZE, "nfs_fh4")
    }

    /// Encodes an `nfs_fh4`.
    pub fn encode(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        self.encode_max(e, FHSIZE, "nfs_fh4")
    }

    /// Decodes an `nfs_fh3` (at most [`FHSIZE3`] bytes).
    pub fn decode3(d: &mut Decoder<'_>) -> Result<Fh, WireError> {
        Fh::decode_max(d, FHSIZE3, "nfs_fh3")
    }

    /// Encodes an `nfs_fh3`: a handle of more than [`FHSIZE3`] bytes (an NFSv4 server's) is
    /// [`WireError::TooLong`].
    pub fn encode3(&self, e: &mut Encoder<'_>) -> Result<(), WireError> {
        self.encode_max(e, FHSIZE3, "nfs_fh3")
    }
}

impl PartialEq for Fh {
    fn eq(&self, other: &Fh) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Fh {}

impl std::hash::Hash for Fh {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl std::fmt::Debug for Fh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fh(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_handle_type_bounded_per_protocol() {
        assert!(Fh::new(&[0; FHSIZE + 1]).is_none());
        let long = Fh::new(&[7; 100]).unwrap();
        let mut buf = [0u8; 512];
        assert!(matches!(long.encode3(&mut Encoder::new(&mut buf)), Err(WireError::TooLong { .. })));
        let mut e = Encoder::new(&mut buf);
        long.encode(&mut e).unwrap();
        let n = e.position();
        assert_eq!(Fh::decode(&mut Decoder::new(&buf[..n])).unwrap(), long);
        assert!(Fh::decode3(&mut Decoder::new(&buf[..n])).is_err(), "an nfs_fh3 of 100 bytes");
        let short = Fh::new(&[1, 2, 3]).unwrap();
        let mut e = Encoder::new(&mut buf);
        short.encode3(&mut e).unwrap();
        let n = e.position();
        assert_eq!(Fh::decode3(&mut Decoder::new(&buf[..n])).unwrap(), short);
        assert_eq!(Fh::new(&[1, 2]), Fh::new(&[1, 2]));
        assert_ne!(Fh::new(&[1, 2]), Fh::new(&[1, 2, 0]));
    }
}
