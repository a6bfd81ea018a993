//! The receive side's buffer ([`Rx`]): records reassembled from their fragments in place, the
//! bytes received and not yet looked at after them, and how far the receiver is in the current
//! record ([`RxMode`]: a record, or a READ's data placed straight into the owner's buffers).

/// How far the receiver is in the current record.
#[derive(Clone, Copy, Debug)]
pub(super) enum RxMode {
    /// Assembling a record in the buffer.
    Record,
    /// A READ reply's data, placed straight into the sink's buffer (or dropped): its header was
    /// decoded and consumed (what the reply needs of it is in `Conn::read_head` and
    /// `Conn::keep`).
    Data(ReadProgress),
    /// After a READ's data: its padding, which must end the record.
    Pad(ReadProgress),
}

#[derive(Clone, Copy, Debug)]
pub(super) struct ReadProgress {
    pub(super) slot: u16,
    pub(super) xid: u32,
    pub(super) len: u32,
    pub(super) placed: u32,
    /// The data is dropped (the sink gave no buffer, or one too small: then `too_small`).
    pub(super) discard: bool,
    pub(super) too_small: bool,
}

/// The receive side: one buffer, allocated once. `buf[start..start + rec_len]` is the current
/// record assembled so far (record marks removed), `buf[start + rec_len + gap..end]` bytes
/// received and not yet looked at.
pub(super) struct Rx {
    pub(super) buf: Box<[u8]>,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) rec_len: usize,
    /// Bytes of the record marks dropped since the record began, between the record assembled so
    /// far and the raw bytes: a fragment's bytes move down over it as they are taken, so each
    /// byte moves once per fragment (moving everything behind each mark instead costs the whole
    /// buffer per mark: a hostile server's empty fragments would stall the poller). Zero while
    /// `rec_len` is.
    pub(super) gap: usize,
    /// Bytes of the current record received so far, including READ data placed elsewhere.
    pub(super) rec_total: usize,
    /// Fragments of the current record so far (bounded: empty fragments would never end it).
    pub(super) frags: usize,
    /// A record mark was read and `frag_left` bytes of its fragment are still to come.
    pub(super) in_frag: bool,
    pub(super) frag_left: usize,
    pub(super) frag_last: bool,
    pub(super) mode: RxMode,
    /// Bytes moved within `buf` so far ([`ConnStats::moved_bytes`]).
    ///
    /// [`ConnStats::moved_bytes`]: super::types::ConnStats::moved_bytes
    pub(super) moved: u64,
}

impl Rx {
    pub(super) fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
        self.rec_len = 0;
        self.gap = 0;
        self.rec_total = 0;
        self.frags = 0;
        self.in_frag = false;
        self.frag_left = 0;
        self.frag_last = false;
        self.mode = RxMode::Record;
    }

    /// Moves `from` to `to` within the buffer, counted ([`ConnStats::moved_bytes`]): every move
    /// within it goes through here.
    ///
    /// [`ConnStats::moved_bytes`]: super::types::ConnStats::moved_bytes
    pub(super) fn move_within(&mut self, from: std::ops::Range<usize>, to: usize) {
        self.moved += from.len() as u64;
        self.buf.copy_within(from, to);
    }

    /// Where the raw bytes begin.
    pub(super) fn raw_at(&self) -> usize {
        self.start + self.rec_len + self.gap
    }

    pub(super) fn raw(&self) -> usize {
        self.end - self.raw_at()
    }

    /// Appends `n` raw bytes to the record assembled so far (moving them over the gap).
    pub(super) fn take(&mut self, n: usize) {
        if self.gap > 0 {
            let from = self.raw_at();
            let to = self.start + self.rec_len;
            self.move_within(from..from + n, to);
        }
        self.rec_len += n;
    }

    /// Closes the gap (the raw bytes move down behind the record), for room at the end.
    pub(super) fn squeeze(&mut self) {
        if self.gap > 0 {
            let from = self.raw_at();
            let end = self.end;
            self.move_within(from..end, self.start + self.rec_len);
            self.end -= self.gap;
            self.gap = 0;
        }
    }

    /// The record assembled so far is consumed (`start` moves past it and the gap).
    pub(super) fn consume_record(&mut self) {
        self.start += self.rec_len + self.gap;
        self.rec_len = 0;
        self.gap = 0;
    }

    /// Moves what is kept to the buffer's start when the room after it runs short.
    pub(super) fn compact(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 && self.buf.len() - self.end < self.buf.len() / 4 {
            self.move_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }
}
