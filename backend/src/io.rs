//! Cursors over a descriptor chain's guest buffers: [`Reader`] for the device-readable part of a
//! request, [`Writer`] for the device-writable part that takes the reply.
//!
//! Guest memory may change under our feet (the guest is untrusted and has other vCPUs), so neither
//! type ever hands out a `&[u8]` into it: every access is a copy between a [`VolatileSlice`] and
//! memory we own (or, for system calls, an iovec the kernel copies through). Both are plain cursors
//! (an index into the buffer list, an offset inside the current buffer and a byte budget); nothing
//! allocates, and an operation that cannot complete in full fails before touching anything.
//! `HeldBuffers` keeps a pending request's buffers past the call that brought them, under the
//! device poller's contract for pending requests: the only `unsafe` of this module.

use std::cmp::min;

use std::mem::size_of;

use vm_memory::{ByteValued, VolatileMemory, VolatileSlice};

/// Running past the end of a buffer chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request is shorter than what its header or arguments promise.
    #[error("request truncated: needed {wanted} more bytes, {left} left")]
    ShortRead {
        /// Bytes asked for.
        wanted: usize,
        /// Bytes that were left.
        left: usize,
    },
    /// The reply does not fit in the writable buffers.
    #[error("reply buffer too small: needed {wanted} more bytes, {left} left")]
    ShortWrite {
        /// Bytes asked for.
        wanted: usize,
        /// Bytes that were left.
        left: usize,
    },
}

/// A position in a list of buffers, with a byte budget. Shared by [`Reader`] and [`Writer`].
///
/// Invariant: `off <= bufs[idx].len()` while `idx` is in range. A position at the end of a buffer
/// is normally moved to the start of the next one, so that the common case, an object or a data
/// page that lies inside one buffer (Linux gives every header, argument struct and page its own),
/// is one bounds check and one copy ([`Cursor::contiguous`]).
#[derive(Clone, Debug)]
struct Cursor<'a> {
    bufs: &'a [VolatileSlice<'a>],
    /// Index of the current buffer.
    idx: usize,
    /// Offset inside `bufs[idx]`.
    off: usize,
    /// Bytes that may still be consumed (never more than what the buffers hold from here).
    left: usize,
    /// Bytes consumed so far.
    done: usize,
}

impl<'a> Cursor<'a> {
    #[inline]
    fn new(bufs: &'a [VolatileSlice<'a>]) -> Self {
        let left = bufs.iter().fold(0usize, |acc, b| acc.saturating_add(b.len()));
        Cursor { bufs, idx: 0, off: 0, left, done: 0 }
    }

    /// The next `n` bytes (caller checked `n <= left`) as one slice, and consumes them, when they
    /// lie inside the current buffer; `None` (nothing consumed) when they cross into another.
    #[inline]
    fn contiguous(&mut self, n: usize) -> Option<VolatileSlice<'a>> {
        debug_assert!(n <= self.left);
        let buf = self.bufs.get(self.idx)?;
        let len = buf.len();
        if len.saturating_sub(self.off) < n {
            return None;
        }
        let piece = buf.subslice(self.off, n).ok()?;
        self.off += n;
        self.left -= n;
        self.done += n;
        if self.off == len {
            self.idx += 1;
            self.off = 0;
        }
        Some(piece)
    }

    /// Visits the next `n` bytes (caller checked `n <= left`) as sub-slices, in order; `f` gets each
    /// piece and the number of bytes visited before it.
    #[inline]
    fn consume(&mut self, n: usize, mut f: impl FnMut(VolatileSlice<'a>, usize)) {
        if let Some(piece) = self.contiguous(n) {
            f(piece, 0);
        } else {
            self.consume_pieces(n, f);
        }
    }

    /// [`Cursor::consume`] across buffer boundaries.
    #[cold]
    fn consume_pieces(&mut self, n: usize, mut f: impl FnMut(VolatileSlice<'a>, usize)) {
        debug_assert!(n <= self.left);
        let mut visited = 0;
        while visited < n {
            let Some(buf) = self.bufs.get(self.idx) else {
                break;
            };
            let avail = buf.len().saturating_sub(self.off);
            if avail == 0 {
                self.idx += 1;
                self.off = 0;
                continue;
            }
            let len = min(avail, n - visited);
            // The range is inside `buf` by construction; a failure here would be a bug, and the
            // bytes are simply skipped rather than panicking on guest input.
            if let Ok(piece) = buf.subslice(self.off, len) {
                f(piece, visited);
            }
            visited += len;
            self.off += len;
        }
        self.left -= n;
        self.done += n;
    }

    /// The bytes left, as iovecs (addresses into the buffers), without consuming them.
    fn iovecs(&self, out: &mut Vec<libc::iovec>) {
        let mut c = self.clone();
        let n = c.left;
        c.consume_pieces(n, |piece, _| {
            let base = piece.ptr_guard_mut().as_ptr().cast::<libc::c_void>();
            out.push(libc::iovec { iov_base: base, iov_len: piece.len() });
        });
    }

    /// Splits off a cursor over the next `n` bytes and advances `self` past them.
    #[inline]
    fn split(&mut self, n: usize) -> Option<Cursor<'a>> {
        if n > self.left {
            return None;
        }
        let mut head = self.clone();
        head.left = n;
        head.done = 0;
        if self.contiguous(n).is_none() {
            self.consume_pieces(n, |_, _| {});
        }
        Some(head)
    }
}

/// Reads a request out of the device-readable buffers of a descriptor chain.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    cur: Cursor<'a>,
}

impl<'a> Reader<'a> {
    /// A reader over `bufs`, in order.
    #[inline]
    pub fn new(bufs: &'a [VolatileSlice<'a>]) -> Self {
        Reader { cur: Cursor::new(bufs) }
    }

    /// Bytes not read yet.
    #[inline]
    pub fn bytes_left(&self) -> usize {
        self.cur.left
    }

    /// Bytes read (or skipped) so far.
    pub fn bytes_read(&self) -> usize {
        self.cur.done
    }

    /// Forgets everything past the next `n` bytes (no-op when fewer are left).
    #[inline]
    pub fn truncate(&mut self, n: usize) {
        self.cur.left = min(self.cur.left, n);
    }

    /// Fills `buf` entirely, or fails without consuming anything.
    #[inline]
    pub fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), Error> {
        let wanted = buf.len();
        if wanted > self.cur.left {
            return Err(Error::ShortRead { wanted, left: self.cur.left });
        }
        self.cur.consume(wanted, |piece, at| {
            piece.copy_to(&mut buf[at..at + piece.len()]);
        });
        Ok(())
    }

    /// Reads one `T`, or fails without consuming anything.
    #[inline]
    pub fn read_obj<T: ByteValued + Default>(&mut self) -> Result<T, Error> {
        let wanted = size_of::<T>();
        if wanted > self.cur.left {
            return Err(Error::ShortRead { wanted, left: self.cur.left });
        }
        // One buffer holds it (the usual case): a single unaligned load of known size.
        let mut obj = T::default();
        match self.cur.contiguous(wanted) {
            Some(piece) => match piece.get_ref::<T>(0) {
                Ok(r) => obj = r.load(),
                Err(_) => {
                    piece.copy_to(obj.as_mut_slice());
                }
            },
            None => self.read_exact(obj.as_mut_slice())?,
        }
        Ok(obj)
    }

    /// Skips `n` bytes, or fails without consuming anything.
    pub fn consume(&mut self, n: usize) -> Result<(), Error> {
        if n > self.cur.left {
            return Err(Error::ShortRead { wanted: n, left: self.cur.left });
        }
        self.cur.consume(n, |_, _| {});
        Ok(())
    }

    /// Appends up to `max` bytes (fewer if fewer are left) to `dst`; returns how many.
    pub fn read_to(&mut self, dst: &mut Vec<u8>, max: usize) -> usize {
        let n = min(max, self.cur.left);
        let start = dst.len();
        dst.resize(start + n, 0);
        self.cur.consume(n, |piece, at| {
            piece.copy_to(&mut dst[start + at..start + at + piece.len()]);
        });
        n
    }

    /// Appends the bytes left to `out` as iovecs naming the guest buffers (for a system call
    /// that reads them: `pwritev2`, io_uring), consuming nothing.
    pub fn iovecs(&self, out: &mut Vec<libc::iovec>) {
        self.cur.iovecs(out);
    }

    /// Splits off a reader over the next `n` bytes and advances `self` past them.
    #[inline]
    pub fn split_at(&mut self, n: usize) -> Result<Reader<'a>, Error> {
        let left = self.cur.left;
        self.cur.split(n).map(|cur| Reader { cur }).ok_or(Error::ShortRead { wanted: n, left })
    }
}

/// Writes a reply into the device-writable buffers of a descriptor chain.
#[derive(Clone, Debug)]
pub struct Writer<'a> {
    cur: Cursor<'a>,
}

impl<'a> Writer<'a> {
    /// A writer over `bufs`, in order.
    #[inline]
    pub fn new(bufs: &'a [VolatileSlice<'a>]) -> Self {
        Writer { cur: Cursor::new(bufs) }
    }

    /// Bytes that can still be written.
    #[inline]
    pub fn available(&self) -> usize {
        self.cur.left
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> usize {
        self.cur.done
    }

    /// Writes all of `buf`, or fails without writing anything.
    #[inline]
    pub fn write_all(&mut self, buf: &[u8]) -> Result<(), Error> {
        let wanted = buf.len();
        if wanted > self.cur.left {
            return Err(Error::ShortWrite { wanted, left: self.cur.left });
        }
        self.cur.consume(wanted, |piece, at| {
            piece.copy_from(&buf[at..at + piece.len()]);
        });
        Ok(())
    }

    /// Writes one `T`, or fails without writing anything.
    #[inline]
    pub fn write_obj<T: ByteValued>(&mut self, obj: &T) -> Result<(), Error> {
        let wanted = size_of::<T>();
        if wanted > self.cur.left {
            return Err(Error::ShortWrite { wanted, left: self.cur.left });
        }
        // One buffer holds it (the usual case): a single unaligned store of known size.
        match self.cur.contiguous(wanted) {
            Some(piece) => match piece.get_ref::<T>(0) {
                Ok(r) => r.store(*obj),
                Err(_) => piece.copy_from(obj.as_slice()),
            },
            None => return self.write_all(obj.as_slice()),
        }
        Ok(())
    }

    /// Writes `n` zero bytes, or fails without writing anything.
    pub fn write_zeros(&mut self, n: usize) -> Result<(), Error> {
        static ZEROS: [u8; 4096] = [0; 4096];
        if n > self.cur.left {
            return Err(Error::ShortWrite { wanted: n, left: self.cur.left });
        }
        self.cur.consume(n, |piece, _| {
            let mut at = 0;
            while at < piece.len() {
                let len = min(ZEROS.len(), piece.len() - at);
                if let Ok(sub) = piece.subslice(at, len) {
                    sub.copy_from(&ZEROS[..len]);
                }
                at += len;
            }
        });
        Ok(())
    }

    /// Appends the room left to `out` as iovecs naming the guest buffers (for a system call
    /// that fills them: `preadv2`, io_uring, a socket's `recvmsg`), consuming nothing.
    pub fn iovecs(&self, out: &mut Vec<libc::iovec>) {
        self.cur.iovecs(out);
    }

    /// Splits off a writer over the next `n` bytes and advances `self` past them (used to fill a
    /// reply header after its body).
    #[inline]
    pub fn split_at(&mut self, n: usize) -> Result<Writer<'a>, Error> {
        let left = self.cur.left;
        self.cur.split(n).map(|cur| Writer { cur }).ok_or(Error::ShortWrite { wanted: n, left })
    }
}

/// The buffers of a pending request, kept past the call that brought them, so that the request
/// can be completed later ([`crate::filesystem::seam`]): the server holds a pending request's writable
/// buffers (and a WRITE's payload) here, in a preallocated slot, and gives the filesystem's
/// engine a [`Writer`] or [`Reader`] over them again when it finishes the request.
///
/// Holding copies the buffer list (addresses and lengths) into storage this value keeps and
/// reuses: no allocation once it has held as many buffers as a request brings. It is only valid
/// under the device poller's contract for pending requests (`Outcome::Pending` in the device's
/// `Engine` trait): the poller keeps every buffer of a pending request mapped (it keeps the
/// memory snapshot the request came with) and untouched until its engine reports the request,
/// and drains its engine before it changes memory or stops queues. The holder must
/// [`clear`](HeldBuffers::clear) it when the request is reported, and never use it after. That
/// contract is the server's to keep, so the type is private to the crate: no safe code outside
/// it can hold buffers and touch them after they are gone.
#[derive(Default)]
pub(crate) struct HeldBuffers {
    slices: Vec<VolatileSlice<'static>>,
}

// SAFETY: the slices name guest memory that stays mapped while they are held (the poller's
// contract above), and they are only touched from the thread that owns the engine holding them
// (the poller); moving them with the engine between threads before it starts changes nothing.
unsafe impl Send for HeldBuffers {}

impl std::fmt::Debug for HeldBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBuffers").field("buffers", &self.slices.len()).finish()
    }
}

impl HeldBuffers {
    /// Holds `bufs` (all of them), instead of what was held.
    pub fn hold(&mut self, bufs: &[VolatileSlice<'_>]) {
        self.slices.clear();
        for b in bufs {
            self.push(b);
        }
    }

    /// Holds the bytes `r` has left, instead of what was held.
    pub fn hold_reader(&mut self, r: &Reader<'_>) {
        self.slices.clear();
        let mut c = r.cur.clone();
        let n = c.left;
        let mut pieces = std::mem::take(&mut self.slices);
        c.consume_pieces(n, |piece, _| pieces.push(extend(&piece)));
        self.slices = pieces;
    }

    fn push(&mut self, b: &VolatileSlice<'_>) {
        self.slices.push(extend(b));
    }

    /// Forgets the buffers (the request was reported); the storage stays for the next.
    pub fn clear(&mut self) {
        self.slices.clear();
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.slices.is_empty()
    }

    /// A writer over the held buffers, from their start.
    pub fn writer(&self) -> Writer<'_> {
        Writer::new(&self.slices)
    }

    /// A reader over the held buffers, from their start.
    pub fn reader(&self) -> Reader<'_> {
        Reader::new(&self.slices)
    }
}

/// `b` with its lifetime extended to `'static`, for `HeldBuffers`; the result is only ever
/// handed out again borrowed from the holder, so no `'static` slice escapes.
fn extend(b: &VolatileSlice<'_>) -> VolatileSlice<'static> {
    let ptr = b.ptr_guard_mut().as_ptr();
    // SAFETY: `ptr` and `b.len()` describe one guest buffer of a request the device's poller
    // left pending: under its `Engine` contract (see `HeldBuffers`) that memory stays mapped
    // and is not reused until the request is reported, which is when the holder clears it; it is
    // accessed only through volatile copies, as every guest buffer is.
    unsafe { VolatileSlice::new(ptr, b.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_crosses_buffer_boundaries() {
        let mut a = [1u8, 2, 3];
        let mut b = [];
        let mut c = [4u8, 5, 6, 7, 8, 9, 10, 11];
        let bufs = [
            VolatileSlice::from(&mut a[..]),
            VolatileSlice::from(&mut b[..]),
            VolatileSlice::from(&mut c[..]),
        ];
        let mut r = Reader::new(&bufs);
        assert_eq!(r.bytes_left(), 11);
        let v: u32 = r.read_obj().unwrap();
        assert_eq!(v.to_ne_bytes(), [1, 2, 3, 4]);
        r.consume(1).unwrap();
        let mut buf = [0u8; 7];
        assert_eq!(r.read_exact(&mut buf), Err(Error::ShortRead { wanted: 7, left: 6 }));
        assert_eq!(r.bytes_left(), 6, "a failed read consumes nothing");
        let mut v = Vec::new();
        assert_eq!(r.read_to(&mut v, 100), 6);
        assert_eq!(v, [6, 7, 8, 9, 10, 11]);
        assert_eq!(r.bytes_read(), 11);
    }

    #[test]
    fn reader_split_and_truncate() {
        let mut a = [0u8, 1, 2, 3, 4, 5, 6, 7];
        let bufs = [VolatileSlice::from(&mut a[..])];
        let mut r = Reader::new(&bufs);
        let mut head = r.split_at(3).unwrap();
        assert_eq!(head.bytes_left(), 3);
        let mut h = [0u8; 3];
        head.read_exact(&mut h).unwrap();
        assert_eq!(h, [0, 1, 2]);
        r.truncate(2);
        let mut t = [0u8; 2];
        r.read_exact(&mut t).unwrap();
        assert_eq!(t, [3, 4]);
        assert_eq!(r.bytes_left(), 0);
        assert!(r.split_at(1).is_err());
    }

    #[test]
    fn objects_inside_and_across_buffers() {
        // An object that ends a buffer, then an empty buffer, then one split over two buffers.
        let mut a = [1u8, 0, 0, 0];
        let mut b = [];
        let mut c = [2u8, 0];
        let mut d = [0u8, 0, 9];
        {
            let bufs = [
                VolatileSlice::from(&mut a[..]),
                VolatileSlice::from(&mut b[..]),
                VolatileSlice::from(&mut c[..]),
                VolatileSlice::from(&mut d[..]),
            ];
            let mut r = Reader::new(&bufs);
            assert_eq!(r.read_obj::<u32>(), Ok(1));
            assert_eq!(r.read_obj::<u32>(), Ok(2));
            assert_eq!(r.read_obj::<u16>(), Err(Error::ShortRead { wanted: 2, left: 1 }));
            assert_eq!(r.read_obj::<u8>(), Ok(9));
            assert_eq!(r.bytes_read(), 9);

            let mut w = Writer::new(&bufs);
            w.write_obj(&0x0403_0201u32).unwrap();
            w.write_obj(&0x0807_0605u32).unwrap();
            assert_eq!(w.write_obj(&0u16), Err(Error::ShortWrite { wanted: 2, left: 1 }));
            w.write_obj(&0x09u8).unwrap();
            assert_eq!(w.available(), 0);
        }
        assert_eq!((a, c, d), ([1, 2, 3, 4], [5, 6], [7, 8, 9]));
    }

    #[test]
    fn writer_is_all_or_nothing() {
        let mut a = [0xffu8; 2];
        let mut b = [0xffu8; 3];
        {
            let bufs = [VolatileSlice::from(&mut a[..]), VolatileSlice::from(&mut b[..])];
            let mut w = Writer::new(&bufs);
            assert_eq!(w.write_all(&[9; 6]), Err(Error::ShortWrite { wanted: 6, left: 5 }));
            let mut hdr = w.split_at(1).unwrap();
            w.write_all(&[1, 2, 3]).unwrap();
            w.write_zeros(1).unwrap();
            assert_eq!(w.available(), 0);
            assert_eq!(w.bytes_written(), 5, "the split-off header counts as written");
            hdr.write_obj(&7u8).unwrap();
            assert!(hdr.write_obj(&7u8).is_err());
        }
        assert_eq!(a, [7, 1]);
        assert_eq!(b, [2, 3, 0]);
    }
}
