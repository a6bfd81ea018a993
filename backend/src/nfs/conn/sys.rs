//! The system calls of the connection: `sendmsg` of a call (its encoded part, a WRITE's data
//! straight from the guest's buffers, padding, the encoded part after the data) and `readv` of a
//! READ's data straight into the guest's buffers. The only `unsafe` of the NFS client.

use std::io;
use std::os::fd::RawFd;

use crate::io::{Reader, Writer};

/// Most iovecs one `sendmsg`/`readv` takes (IOV_MAX).
pub(super) const IOV_MAX: usize = 1024;

/// A reusable list of iovecs (allocated once). It holds addresses only while one of the
/// functions below runs: each fills it from borrowed buffers, makes its system call and
/// empties it before returning.
pub(super) struct Iovecs(Vec<libc::iovec>);

// SAFETY: the vector is empty whenever the functions below are not running (each clears it
// before returning), so no address in it outlives the borrows it came from or is seen by
// another thread; moving the empty vector between threads is moving a plain allocation.
unsafe impl Send for Iovecs {}

impl Iovecs {
    pub(super) fn with_capacity(n: usize) -> Iovecs {
        Iovecs(Vec::with_capacity(n))
    }
}

#[inline]
fn push(v: &mut Vec<libc::iovec>, b: &[u8]) {
    if !b.is_empty() && v.len() < IOV_MAX {
        v.push(libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() });
    }
}

/// Sends `head`, then the bytes each reader has left, then `pad` and `tail`, in one `sendmsg`
/// (`MSG_NOSIGNAL | MSG_DONTWAIT`); returns the bytes sent (maybe fewer). Inlined: a call
/// without a WRITE's data then costs no more than its `sendmsg`.
#[inline(always)]
pub(super) fn send(
    fd: RawFd,
    iov: &mut Iovecs,
    head: &[u8],
    data: &[Reader<'_>],
    pad: &[u8],
    tail: &[u8],
) -> io::Result<usize> {
    let v = &mut iov.0;
    v.clear();
    push(v, head);
    for r in data {
        r.iovecs(v);
    }
    if v.len() < IOV_MAX {
        // `push` stops at IOV_MAX: a piece goes only if every piece before it went.
        push(v, pad);
        push(v, tail);
    } else {
        // More pieces than one call takes: these now, the rest (and the padding after
        // them) on the next call, from the offset reached.
        v.truncate(IOV_MAX);
    }
    if v.is_empty() {
        return Ok(0);
    }
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = v.as_mut_ptr();
    msg.msg_iovlen = v.len() as _;
    // SAFETY: every iovec names memory that is valid for reads for the whole call: `head`,
    // `pad` and `tail` are borrowed slices, the readers' iovecs name guest buffers the caller's
    // sink keeps mapped while it lends the `Reader`; the kernel only reads them.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    v.clear();
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Receives into `buf` (`MSG_DONTWAIT`).
#[inline]
pub(super) fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid, exclusively borrowed buffer of `buf.len()` bytes.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Receives at most `want` bytes into the writer's buffers, then whatever more is there
/// into `rest`, in one `readv`; returns the total.
pub(super) fn recv_into(
    fd: RawFd,
    iov: &mut Iovecs,
    w: &Writer<'_>,
    want: usize,
    rest: &mut [u8],
) -> io::Result<usize> {
    let v = &mut iov.0;
    v.clear();
    w.iovecs(v);
    // Cut the guest part at `want` bytes.
    let mut left = want;
    let mut keep = 0;
    for e in v.iter_mut() {
        if left == 0 {
            break;
        }
        e.iov_len = e.iov_len.min(left);
        left -= e.iov_len;
        keep += 1;
    }
    v.truncate(keep.min(IOV_MAX - 1));
    let guest: usize = v.iter().map(|e| e.iov_len).sum();
    if guest < want {
        // More iovecs than IOV_MAX: take what fits now, the rest on the next read. Nothing
        // may land in `rest` before the data is complete.
        let n = readv(fd, v);
        v.clear();
        return n;
    }
    v.push(libc::iovec { iov_base: rest.as_mut_ptr().cast(), iov_len: rest.len() });
    let n = readv(fd, v);
    v.clear();
    n
}

fn readv(fd: RawFd, v: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: every iovec names memory valid for writes for the whole call: the writer's
    // iovecs name guest buffers the caller's sink keeps mapped while it lends the `Writer`
    // (guest memory is only ever accessed by copies, which the kernel's is), the last one
    // the exclusively borrowed receive buffer.
    let n = unsafe { libc::readv(fd, v.as_ptr(), v.len() as libc::c_int) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
