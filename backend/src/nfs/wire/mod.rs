//! Wire formats of the NFS client: [`xdr`] (RFC 4506) under [`rpc`] (ONC RPC v2, RFC 5531, with
//! AUTH_SYS), and the programs on top: [`nfs3`] (RFC 1813), [`nfs4`] (NFSv4.1, RFC 8881, with
//! RFC 8276's extended attributes), [`mount`] (MOUNT v3, RFC 1813 appendix I) and [`portmap`]
//! (portmapper v2, RFC 1833).
//!
//! [`Fh`] is the file handle of both NFS versions (up to NFSv4's 128 bytes; the NFSv3 codec
//! refuses more than 64 on the wire).
//!
//! Every encoder writes into a caller's preallocated buffer and fails with
//! [`WireError::Overflow`] rather than growing it; every decoder reads a `&[u8]` a server sent
//! and fails with a typed [`WireError`], never panicking, whatever the bytes.

mod fh;
pub mod mount;
pub mod nfs3;
pub mod nfs4;
pub mod portmap;
pub mod rpc;
pub mod xdr;

pub use fh::{Fh, FHSIZE, FHSIZE3};

/// Why bytes could not be encoded or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Decoding ran past the end of the bytes received.
    #[error("truncated: {wanted} bytes wanted, {left} left")]
    Truncated {
        /// Bytes the next item needs.
        wanted: usize,
        /// Bytes that were left.
        left: usize,
    },
    /// Encoding ran past the end of the preallocated buffer.
    #[error("encode buffer full: {wanted} bytes wanted, {left} left")]
    Overflow {
        /// Bytes the next item needs.
        wanted: usize,
        /// Room that was left.
        left: usize,
    },
    /// A variable-length item longer than its bound.
    #[error("{what}: length {len} over the bound {max}")]
    TooLong {
        /// The item.
        what: &'static str,
        /// The length sent.
        len: u32,
        /// Its bound.
        max: u32,
    },
    /// A value outside what the protocol defines (an enum, a bool, a discriminant).
    #[error("{what}: invalid value {value}")]
    BadValue {
        /// The item.
        what: &'static str,
        /// The value sent.
        value: u32,
    },
    /// Bytes left over after a complete message.
    #[error("{0} bytes after the end of the message")]
    Trailing(usize),
}
