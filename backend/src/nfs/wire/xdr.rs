//! XDR (RFC 4506): big-endian 4-byte units, opaque data padded to a multiple of four.
//!
//! [`Encoder`] writes into a borrowed, preallocated buffer and never grows it; [`Decoder`] reads
//! a borrowed `&[u8]` and hands out sub-slices of it (no copies, no allocation). Both check every
//! length: a decoder fed hostile bytes returns a [`WireError`], never panics.

use super::WireError;

/// Bytes of padding after `len` bytes of opaque data.
#[inline]
pub const fn pad(len: usize) -> usize {
    (4 - (len & 3)) & 3
}

/// `len` rounded up to a multiple of four.
#[inline]
pub const fn padded(len: usize) -> usize {
    len + pad(len)
}

/// Writes XDR into a preallocated buffer, from a position on.
#[derive(Debug)]
pub struct Encoder<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Encoder<'a> {
    /// An encoder writing `buf` from its start.
    #[inline]
    pub fn new(buf: &'a mut [u8]) -> Self {
        Encoder { buf, pos: 0 }
    }

    /// Bytes written so far.
    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Room left.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes of the buffer, reserved.
    #[inline]
    fn take(&mut self, n: usize) -> Result<&mut [u8], WireError> {
        if n > self.remaining() {
            return Err(WireError::Overflow { wanted: n, left: self.remaining() });
        }
        let at = self.pos;
        self.pos += n;
        Ok(&mut self.buf[at..at + n])
    }

    /// An unsigned 32-bit integer.
    #[inline]
    pub fn u32(&mut self, v: u32) -> Result<(), WireError> {
        self.take(4)?.copy_from_slice(&v.to_be_bytes());
        Ok(())
    }

    /// An unsigned 64-bit integer (hyper).
    #[inline]
    pub fn u64(&mut self, v: u64) -> Result<(), WireError> {
        self.take(8)?.copy_from_slice(&v.to_be_bytes());
        Ok(())
    }

    /// A boolean (0 or 1).
    #[inline]
    pub fn bool(&mut self, v: bool) -> Result<(), WireError> {
        self.u32(u32::from(v))
    }

    /// Fixed-length opaque data (its length known to both sides), padded.
    #[inline]
    pub fn fixed(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        let out = self.take(padded(bytes.len()))?;
        let (data, rest) = out.split_at_mut(bytes.len());
        data.copy_from_slice(bytes);
        rest.fill(0);
        Ok(())
    }

    /// Variable-length opaque data or a string: its length, the bytes, padding. `max` is the
    /// protocol's bound on the item (checked here, so a caller's bug never reaches the wire).
    #[inline]
    pub fn opaque(&mut self, bytes: &[u8], max: u32) -> Result<(), WireError> {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        if len > max {
            return Err(WireError::TooLong { what: "opaque", len, max });
        }
        if 4 + padded(bytes.len()) > self.remaining() {
            return Err(WireError::Overflow { wanted: 4 + padded(bytes.len()), left: self.remaining() });
        }
        self.u32(len)?;
        self.fixed(bytes)
    }

    /// Reserves a 32-bit slot to be filled later with [`Encoder::patch_u32`]; returns its position.
    #[inline]
    pub fn reserve_u32(&mut self) -> Result<usize, WireError> {
        let at = self.pos;
        self.take(4)?;
        Ok(at)
    }

    /// Fills a slot that [`Encoder::reserve_u32`] returned.
    #[inline]
    pub fn patch_u32(&mut self, at: usize, v: u32) {
        if let Some(s) = self.buf.get_mut(at..at + 4) {
            s.copy_from_slice(&v.to_be_bytes());
        }
    }
}

/// Reads XDR from received bytes, in place.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    /// A decoder over `buf`, from its start.
    #[inline]
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0 }
    }

    /// Bytes read so far.
    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes left.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The bytes left, unread.
    #[inline]
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    /// Fails with [`WireError::Trailing`] unless every byte was read.
    pub fn finish(&self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.remaining() {
            return Err(WireError::Truncated { wanted: n, left: self.remaining() });
        }
        let at = self.pos;
        self.pos += n;
        Ok(&self.buf[at..at + n])
    }

    /// An unsigned 32-bit integer.
    #[inline]
    pub fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// An unsigned 64-bit integer (hyper).
    #[inline]
    pub fn u64(&mut self) -> Result<u64, WireError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    /// A boolean: 0 or 1, anything else is [`WireError::BadValue`].
    #[inline]
    pub fn bool(&mut self) -> Result<bool, WireError> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(WireError::BadValue { what: "bool", value }),
        }
    }

    /// Fixed-length opaque data of `n` bytes (and its padding).
    #[inline]
    pub fn fixed(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if padded(n) > self.remaining() {
            return Err(WireError::Truncated { wanted: padded(n), left: self.remaining() });
        }
        let data = self.take(n)?;
        self.take(pad(n))?;
        Ok(data)
    }

    /// Fixed-length opaque data into an array.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.fixed(N)?);
        Ok(a)
    }

    /// Variable-length opaque data or a string of at most `max` bytes (`what` names it in the
    /// error); the padding is skipped.
    #[inline]
    pub fn opaque(&mut self, max: u32, what: &'static str) -> Result<&'a [u8], WireError> {
        let len = self.u32()?;
        if len > max {
            return Err(WireError::TooLong { what, len, max });
        }
        self.fixed(len as usize)
    }

    /// Skips `n` bytes.
    #[inline]
    pub fn skip(&mut self, n: usize) -> Result<(), WireError> {
        self.take(n).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_of_every_item() {
        let mut buf = [0xaau8; 64];
        let mut e = Encoder::new(&mut buf);
        e.u32(0x0102_0304).unwrap();
        e.u64(0x1122_3344_5566_7788).unwrap();
        e.bool(true).unwrap();
        e.fixed(&[9, 8, 7]).unwrap();
        e.opaque(b"hello", 255).unwrap();
        let slot = e.reserve_u32().unwrap();
        e.patch_u32(slot, 77);
        let n = e.position();
        assert_eq!(n, 4 + 8 + 4 + 4 + 4 + 8 + 4);
        assert_eq!(&buf[..4], &[1, 2, 3, 4]);
        assert_eq!(&buf[16..20], &[9, 8, 7, 0], "fixed data padded with zeros");
        let mut d = Decoder::new(&buf[..n]);
        assert_eq!(d.u32(), Ok(0x0102_0304));
        assert_eq!(d.u64(), Ok(0x1122_3344_5566_7788));
        assert_eq!(d.bool(), Ok(true));
        assert_eq!(d.fixed(3), Ok(&[9u8, 8, 7][..]));
        assert_eq!(d.opaque(255, "s"), Ok(&b"hello"[..]));
        assert_eq!(d.u32(), Ok(77));
        assert_eq!(d.finish(), Ok(()));
    }

    #[test]
    fn encoder_never_grows_its_buffer() {
        let mut buf = [0u8; 6];
        let mut e = Encoder::new(&mut buf);
        e.u32(1).unwrap();
        assert_eq!(e.u32(2), Err(WireError::Overflow { wanted: 4, left: 2 }));
        assert_eq!(e.u64(2), Err(WireError::Overflow { wanted: 8, left: 2 }));
        assert!(e.opaque(b"x", 10).is_err());
        assert_eq!(e.position(), 4, "a failed item writes nothing");
        assert_eq!(e.opaque(&[0; 11], 10), Err(WireError::TooLong { what: "opaque", len: 11, max: 10 }));
    }

    #[test]
    fn decoder_checks_every_length() {
        assert_eq!(Decoder::new(&[0, 0, 1]).u32(), Err(WireError::Truncated { wanted: 4, left: 3 }));
        assert_eq!(Decoder::new(&[0, 0, 0, 2]).bool(), Err(WireError::BadValue { what: "bool", value: 2 }));
        // A length over the bound, and a length past the end of the bytes.
        let big = [0xff, 0xff, 0xff, 0xff, 1, 2];
        assert!(matches!(Decoder::new(&big).opaque(1024, "name"), Err(WireError::TooLong { .. })));
        let short = [0, 0, 0, 5, 1, 2, 3, 4, 5];
        assert!(matches!(Decoder::new(&short).opaque(1024, "name"), Err(WireError::Truncated { .. })));
        // Padding must be there too.
        let nopad = [0, 0, 0, 1, 7];
        assert!(matches!(Decoder::new(&nopad).opaque(1024, "name"), Err(WireError::Truncated { .. })));
        assert_eq!(Decoder::new(&[1]).finish(), Err(WireError::Trailing(1)));
    }
}
