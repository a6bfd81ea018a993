//! What a FUSE request was, for the device's statistics ([`Tally`]): the device keeps counters
//! and a latency histogram per operation class ([`OpClass`]) and knows nothing of FUSE, so the
//! handler tells it the class (from the request's opcode), the errno the reply carries and the
//! bytes of file data moved.
//!
//! These are read back from the request's buffers around the server's own decoding and
//! encoding: 4 bytes of the `fuse_in_header` (the opcode) before, the `fuse_out_header` (and a
//! WRITE's `fuse_write_out`) the server has just written after. A guest that rewrites its
//! buffers meanwhile changes only how its own request is counted; nothing here decides how a
//! request is served.

use virtiofs_backend::abi::opcode as op;
use virtiofs_backend::server::Status;
use virtiofs_device::stats::{OpClass, Tally};
use vm_memory::{Bytes, VolatileSlice};

/// `fuse_out_header`'s size.
const OUT_HEADER: u32 = 16;

/// The class of FUSE opcode `opcode`.
pub fn class_of(opcode: u32) -> OpClass {
    match opcode {
        op::READ => OpClass::Read,
        op::WRITE => OpClass::Write,
        op::LOOKUP
        | op::GETATTR
        | op::SETATTR
        | op::READLINK
        | op::SYMLINK
        | op::MKNOD
        | op::MKDIR
        | op::UNLINK
        | op::RMDIR
        | op::RENAME
        | op::RENAME2
        | op::LINK
        | op::OPEN
        | op::RELEASE
        | op::STATFS
        | op::SETXATTR
        | op::GETXATTR
        | op::LISTXATTR
        | op::REMOVEXATTR
        | op::OPENDIR
        | op::READDIR
        | op::READDIRPLUS
        | op::RELEASEDIR
        | op::ACCESS
        | op::CREATE
        | op::TMPFILE
        | op::STATX => OpClass::Metadata,
        _ => OpClass::Other,
    }
}

/// Copies the first bytes of `bufs` into `out`; returns how many there were.
fn gather(bufs: &[VolatileSlice<'_>], out: &mut [u8]) -> usize {
    let mut at = 0;
    for b in bufs {
        if at == out.len() {
            break;
        }
        let n = b.len().min(out.len() - at);
        if b.read_slice(&mut out[at..at + n], 0).is_err() {
            break;
        }
        at += n;
    }
    at
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    bytes.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The class of the request whose device-readable buffers are `readable` (its opcode is the
/// second word of its `fuse_in_header`); [`OpClass::Other`] if it has no header.
pub fn request_class(readable: &[VolatileSlice<'_>]) -> OpClass {
    let mut head = [0u8; 8];
    if gather(readable, &mut head) < head.len() {
        return OpClass::Other;
    }
    u32_at(&head, 4).map_or(OpClass::Other, class_of)
}

/// The tally of a request of `class` answered with the first `len` bytes of `reply`.
pub fn reply_bytes(class: OpClass, reply: &[u8], len: u32) -> Tally {
    let mut t = Tally { class, ..Tally::default() };
    if len < OUT_HEADER || reply.len() < OUT_HEADER as usize {
        return t;
    }
    let error = u32_at(reply, 4).map_or(0, |e| e as i32);
    if error < 0 {
        t.errno = u16::try_from(error.unsigned_abs()).unwrap_or(u16::MAX);
        return t;
    }
    t.bytes = match class {
        OpClass::Read => len - OUT_HEADER,
        OpClass::Write => u32_at(reply, OUT_HEADER as usize).unwrap_or(0),
        _ => 0,
    };
    t
}

/// The tally of a request of `class` answered with `len` bytes written to `writable`.
pub fn reply_tally(class: OpClass, writable: &[VolatileSlice<'_>], len: u32) -> Tally {
    let mut head = [0u8; 24];
    let n = gather(writable, &mut head[..(len as usize).min(24)]);
    reply_bytes(class, &head[..n], len)
}

/// The tally of a pending request as the server's engine reported it (the poller keeps its
/// class).
pub fn status_tally(s: Status) -> Tally {
    Tally {
        class: OpClass::Other,
        errno: u16::try_from(s.errno.unsigned_abs()).unwrap_or(u16::MAX),
        bytes: u32::try_from(s.data).unwrap_or(u32::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_replies() {
        assert_eq!(class_of(op::READ), OpClass::Read);
        assert_eq!(class_of(op::WRITE), OpClass::Write);
        assert_eq!(class_of(op::LOOKUP), OpClass::Metadata);
        assert_eq!(class_of(op::SETLKW), OpClass::Other);
        assert_eq!(class_of(9999), OpClass::Other);
        let mut reply = [0u8; 24];
        reply[..4].copy_from_slice(&(16u32 + 4096).to_le_bytes());
        assert_eq!(reply_bytes(OpClass::Read, &reply, 16 + 4096).bytes, 4096);
        reply[4..8].copy_from_slice(&(-libc::ENOENT).to_le_bytes());
        assert_eq!(reply_bytes(OpClass::Metadata, &reply, 16).errno, libc::ENOENT as u16);
        reply[4..8].copy_from_slice(&0i32.to_le_bytes());
        reply[16..20].copy_from_slice(&512u32.to_le_bytes());
        assert_eq!(reply_bytes(OpClass::Write, &reply, 24).bytes, 512);
        assert_eq!(
            reply_bytes(OpClass::Write, &reply, 0),
            Tally { class: OpClass::Write, ..Tally::default() }
        );
    }
}
