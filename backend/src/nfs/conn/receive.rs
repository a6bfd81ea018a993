//! Receiving: reads from the socket (into the receive buffer, or a READ's data straight into the
//! owner's buffers) and RPC record marking: fragments reassembled into records, each whole
//! record, and a READ's data as it comes, handed on to be decoded.

use std::os::fd::AsRawFd;
use std::time::Instant;

use super::program::Program;
use super::rx::{ReadProgress, RxMode};
use super::state::{Conn, Fault, Link, LAST_FRAGMENT, MAX_FRAGMENTS, PEEK, READS_PER_POLL};
use super::sys;
use super::types::Sink;

impl<P: Program> Conn<P> {
    /// Reads and consumes replies; when nothing is expected, only if `look` (a timer tick: EOF,
    /// unsolicited bytes).
    pub(super) fn receive(&mut self, now: Instant, sink: &mut dyn Sink<P>, look: bool) {
        for _ in 0..READS_PER_POLL {
            if !look && self.in_flight() == 0 && self.rx.start == self.rx.end {
                return;
            }
            let Link::Up { stream } = &self.link else {
                return;
            };
            let fd = stream.as_raw_fd();
            let got = self.fill(fd, sink);
            match got {
                Ok(0) => {
                    self.reset(now, sink, Fault::Lost);
                    return;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let fault = if e.kind() == std::io::ErrorKind::InvalidData {
                        Fault::Garbage
                    } else {
                        Fault::Lost
                    };
                    self.reset(now, sink, fault);
                    return;
                }
            }
            if let Err(fault) = self.process(sink) {
                self.reset(now, sink, fault);
                return;
            }
        }
    }

    /// One read from the socket: straight into the sink's buffer (and the receive buffer after
    /// it) when a READ's data is due and nothing is buffered, else into the receive buffer.
    pub(super) fn fill(&mut self, fd: std::os::fd::RawFd, sink: &mut dyn Sink<P>) -> std::io::Result<usize> {
        self.rx.compact();
        let target = match self.rx.mode {
            RxMode::Data(p) => self.read_target(&p),
            _ => None,
        };
        let rx = &mut self.rx;
        if let (RxMode::Data(mut p), Some(tag)) = (rx.mode, target) {
            if rx.start == rx.end && rx.in_frag && rx.frag_left > 0 {
                let want = (p.len - p.placed) as usize;
                let want = want.min(rx.frag_left);
                rx.start = 0;
                rx.end = 0;
                let w = sink.read_buffer(tag).and_then(|mut w| w.split_at(p.placed as usize).ok().map(|_| w));
                let Some(w) = w else {
                    // The sink's buffer is gone or shorter than it was: drop the rest.
                    p.discard = true;
                    p.too_small = true;
                    rx.mode = RxMode::Data(p);
                    return Ok(1);
                };
                let n = {
                    // Another big READ may follow: leave its data in the socket too.
                    let tail = if self.big_reads > 1 { PEEK } else { rx.buf.len() };
                    sys::recv_into(fd, &mut self.iov, &w, want, &mut rx.buf[..tail])?
                };
                if n == 0 {
                    return Ok(0);
                }
                self.stats.received_bytes += n as u64;
                let direct = n.min(want);
                self.stats.read_direct_bytes += direct as u64;
                p.placed += direct as u32;
                rx.frag_left -= direct;
                rx.end = n - direct;
                rx.mode = RxMode::Data(p);
                return Ok(n);
            }
        }
        if rx.end == rx.buf.len() {
            rx.squeeze();
        }
        if rx.end == rx.buf.len() {
            if rx.start > 0 {
                rx.move_within(rx.start..rx.end, 0);
                rx.end -= rx.start;
                rx.start = 0;
            } else {
                // A full buffer that `process` could not use: cannot happen with the record
                // bound; treat it as garbage rather than spin.
                return Err(std::io::Error::from(std::io::ErrorKind::InvalidData));
            }
        }
        let end = rx.end;
        let boundary = match rx.mode {
            RxMode::Record => true,
            RxMode::Data(_) => !rx.in_frag,
            RxMode::Pad(_) => false,
        };
        let limit = if self.big_reads > 0 && rx.start == rx.end && boundary {
            // At a record boundary with a big READ in flight: its header only (see DIRECT_MIN).
            (end + PEEK).min(rx.buf.len())
        } else {
            rx.buf.len()
        };
        let n = sys::recv(fd, &mut rx.buf[end..limit])?;
        rx.end += n;
        self.stats.received_bytes += n as u64;
        Ok(n)
    }

    /// Consumes what the receive buffer holds: record marks, whole records, READ data.
    pub(super) fn process(&mut self, sink: &mut dyn Sink<P>) -> Result<(), Fault> {
        loop {
            if !self.rx.in_frag {
                let at = self.rx.raw_at();
                if self.rx.end - at < 4 {
                    return Ok(());
                }
                let b = &self.rx.buf[at..at + 4];
                let mark = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
                // The mark is dropped where it is: into the gap, or before the record begins.
                if self.rx.rec_len == 0 {
                    self.rx.start += 4;
                } else {
                    self.rx.gap += 4;
                }
                let len = (mark & !LAST_FRAGMENT) as usize;
                self.rx.rec_total += len;
                self.rx.frags += 1;
                if self.rx.rec_total > self.max_record() || self.rx.frags > MAX_FRAGMENTS {
                    return Err(Fault::Garbage);
                }
                self.rx.in_frag = true;
                self.rx.frag_left = len;
                self.rx.frag_last = mark & LAST_FRAGMENT != 0;
            }
            match self.rx.mode {
                RxMode::Record | RxMode::Pad(_) => {
                    let take = self.rx.raw().min(self.rx.frag_left);
                    self.rx.take(take);
                    self.rx.frag_left -= take;
                    if self.rx.frag_left > 0 {
                        if let RxMode::Record = self.rx.mode {
                            self.early_read_head(sink)?;
                        }
                        return Ok(());
                    }
                    self.rx.in_frag = false;
                    if !self.rx.frag_last {
                        if let RxMode::Record = self.rx.mode {
                            self.early_read_head(sink)?;
                        }
                        continue;
                    }
                    let mode = self.rx.mode;
                    self.rx.mode = RxMode::Record;
                    let (start, len) = (self.rx.start, self.rx.rec_len);
                    self.rx.consume_record();
                    self.rx.rec_total = 0;
                    self.rx.frags = 0;
                    match mode {
                        RxMode::Pad(p) => self.end_read(p, len, sink)?,
                        _ => self.record(start, len, sink)?,
                    }
                }
                RxMode::Data(mut p) => {
                    let avail = self.rx.raw().min(self.rx.frag_left).min((p.len - p.placed) as usize);
                    if avail > 0 {
                        if let Some(tag) = self.read_target(&p) {
                            let start = self.rx.start;
                            let placed = sink.read_buffer(tag).and_then(|mut w| {
                                w.split_at(p.placed as usize).ok()?;
                                w.write_all(&self.rx.buf[start..start + avail]).ok()
                            });
                            if placed.is_none() {
                                // The sink's buffer changed under the reply: drop the rest.
                                p.discard = true;
                                p.too_small = true;
                            } else {
                                self.stats.read_copied_bytes += avail as u64;
                            }
                        }
                        p.placed += avail as u32;
                        self.rx.start += avail;
                        self.rx.frag_left -= avail;
                    }
                    if p.placed == p.len {
                        self.rx.mode = RxMode::Pad(p);
                        continue;
                    }
                    self.rx.mode = RxMode::Data(p);
                    if self.rx.frag_left == 0 {
                        self.rx.in_frag = false;
                        if self.rx.frag_last {
                            // The record ended inside the data.
                            if self.read_target(&ReadProgress { discard: false, ..p }).is_some() {
                                return self.call_garbage(usize::from(p.slot), sink);
                            }
                            return Err(Fault::Garbage);
                        }
                        continue;
                    }
                    return Ok(());
                }
            }
        }
    }
}
