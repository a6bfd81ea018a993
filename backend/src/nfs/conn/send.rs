//! Sending: the queued calls' records, one `sendmsg` each (the encoded part up to a WRITE's
//! data, the data straight from the owner's buffers, its padding, the rest of the encoded part),
//! until the socket would block.

use std::os::fd::AsRawFd;
use std::time::Instant;

use super::program::Program;
use super::state::{Conn, Link, SlotState, CALL_BUF, ZEROS};
use super::sys;
use super::types::{CallError, Sink};
use crate::nfs::wire::xdr;

impl<P: Program> Conn<P> {
    /// Sends queued calls until the socket would block.
    pub(super) fn flush(&mut self, now: Instant, sink: &mut dyn Sink<P>) {
        loop {
            let (idx, off) = match self.tx {
                Some(t) => t,
                None => {
                    if self.holding() {
                        // The link moves back to the first address once the calls on the wire
                        // are answered: what is queued goes there.
                        return;
                    }
                    let Some((idx, generation)) = self.queue.pop_front() else {
                        return;
                    };
                    let s = &mut self.slots[usize::from(idx)];
                    if s.state != SlotState::Queued || s.generation != generation {
                        continue;
                    }
                    s.state = SlotState::Sent;
                    s.sent_at = now;
                    if s.was_sent {
                        self.stats.retransmits += 1;
                    }
                    s.was_sent = true;
                    self.tx = Some((idx, 0));
                    (idx, 0)
                }
            };
            let i = usize::from(idx);
            let slot = self.slots[i];
            let total = slot.record_len();
            let Link::Up { stream } = &self.link else {
                return;
            };
            let fd = stream.as_raw_fd();
            let encoded = &self.calls[i * CALL_BUF..i * CALL_BUF + slot.len];
            let sent = if slot.payload == 0 {
                sys::send(fd, &mut self.iov, &encoded[off..], &[], &[], &[])
            } else {
                // The record: head, data, padding, tail (the encoded part after the data).
                let (head, tail) = encoded.split_at(usize::from(slot.payload_at).min(slot.len));
                let data_off = off.saturating_sub(head.len());
                let data_len = slot.payload as usize;
                let reader = sink.payload(slot.tag).filter(|r| r.bytes_left() >= data_len);
                let Some(mut r) = reader else {
                    self.tx = None;
                    if off > 0 {
                        // Half a record is out: the connection cannot continue.
                        self.finish(i, sink, Err(CallError::Payload));
                        self.drop_link(now);
                        return;
                    }
                    self.finish(i, sink, Err(CallError::Payload));
                    continue;
                };
                r.truncate(data_len);
                let skip = data_off.min(data_len);
                if r.consume(skip).is_err() {
                    // Cannot happen (checked above); never loop on it.
                    self.tx = None;
                    self.finish(i, sink, Err(CallError::Payload));
                    self.drop_link(now);
                    return;
                }
                let pad_off = data_off.saturating_sub(data_len);
                let pad = &ZEROS[..xdr::pad(data_len)];
                let tail_off = pad_off.saturating_sub(pad.len());
                sys::send(
                    fd,
                    &mut self.iov,
                    &head[off.min(head.len())..],
                    &[r],
                    &pad[pad_off.min(pad.len())..],
                    &tail[tail_off.min(tail.len())..],
                )
            };
            match sent {
                // Nothing to send or nothing taken: never spin on it.
                Ok(0) => return,
                Ok(n) => {
                    let off = off + n;
                    if off >= total {
                        self.tx = None;
                    } else {
                        self.tx = Some((idx, off));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.drop_link(now);
                    return;
                }
            }
        }
    }
}
