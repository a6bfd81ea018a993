//! NFSv3 (RFC 1813), program 100003 version 3: the types the device uses, [`encode_args`] for
//! every procedure's arguments and [`decode_res`] for its results, in place.
//!
//! A READ reply's data is not decoded here: [`decode_read_head`] stops at the data's length so
//! that the connection can place the data itself (straight into the guest's buffers). A WRITE's
//! arguments end with the data's length; the connection sends the data after them.
//!
//! The codecs are split by seam: `types` (constants, handles, attributes, what SETATTR sets),
//! `status` (`nfsstat3`), `args` (arguments, encoded) and `res` (results, decoded in place); every
//! item is here, re-exported.

mod args;
mod res;
mod status;
mod types;

pub use args::{encode_args, Args};
pub use res::{decode_read_head, decode_res, DirEntries, DirEntry3, ReadHead, Res};
pub use status::Nfsstat;
pub use types::{
    access, decode_post_op_attr, CreateHow, Fattr, Fh, Ftype, NfsTime, Proc, Sattr, SetTime, Stable,
    FATTR3_SIZE, FHSIZE3, MAX_NAME, MAX_PATH, PROGRAM, VERSION,
};

#[cfg(test)]
mod tests;
