//! Replies: a whole record decoded in place and matched to its call by XID, and a READ reply
//! whose head is in before its data (the data is then placed as it comes, and the call ends
//! when its padding does). The program ([`Program`]) decodes; this side matches, places and
//! ends calls.

use super::program::{Program, ReadStart};
use super::rx::{ReadProgress, RxMode};
use super::state::{free_slot, Conn, Fault};
use super::types::{CallError, Sink};
use crate::nfs::wire::rpc;
use crate::nfs::wire::xdr::{self, Decoder};
use crate::nfs::wire::WireError;

impl<P: Program> Conn<P> {
    /// A reply that is garbage, for call `i`: the call fails, the connection is reset.
    pub(super) fn call_garbage(&mut self, i: usize, sink: &mut dyn Sink<P>) -> Result<(), Fault> {
        self.finish(i, sink, Err(CallError::Broken));
        Err(Fault::Garbage)
    }

    /// While a record is incomplete: if it is a READ reply whose head is in, switch to placing
    /// its data as it comes.
    pub(super) fn early_read_head(&mut self, sink: &mut dyn Sink<P>) -> Result<(), Fault> {
        let (start, len) = (self.rx.start, self.rx.rec_len);
        let rec = &self.rx.buf[start..start + len];
        let Some(i) = rpc::peek_xid(rec).and_then(|x| self.slot_of(x)) else {
            return Ok(());
        };
        let slot = self.slots[i];
        if slot.read_count == 0 {
            return Ok(());
        }
        let mut d = Decoder::new(rec);
        let head = match rpc::decode_reply(&mut d) {
            Ok((_, Ok(()))) => P::read_head(&slot.call, slot.read_count, &mut d),
            Ok((_, Err(_))) => return Ok(()),
            Err(e) => Err(e),
        };
        let ReadStart { head, len: data_len, keep } = match head {
            Ok(Some(h)) => h,
            Ok(None) | Err(WireError::Truncated { .. }) => return Ok(()),
            Err(_) => return self.call_garbage(i, sink),
        };
        let at = d.position();
        let have = len - at;
        if have >= data_len as usize || keep.len() > self.keep.len() {
            // All here already, or more of the head to keep than there is room for: the whole
            // record is decoded when it is in.
            return Ok(());
        }
        self.keep[..keep.len()].copy_from_slice(&self.rx.buf[start + keep.start..start + keep.end]);
        self.keep_len = keep.len();
        self.read_head = Some(head);
        let (discard, too_small) = match sink.read_buffer(slot.tag) {
            None => (true, false),
            Some(w) if w.available() < data_len as usize => (true, true),
            Some(_) => (false, false),
        };
        let mut p =
            ReadProgress { slot: i as u16, xid: slot.xid, len: data_len, placed: 0, discard, too_small };
        // The data that came with the header: placed now, then header and data are consumed.
        if have > 0 && !discard {
            let from = start + at;
            let ok = sink
                .read_buffer(slot.tag)
                .and_then(|mut w| w.write_all(&self.rx.buf[from..from + have]).ok());
            if ok.is_none() {
                p.discard = true;
                p.too_small = true;
            } else {
                self.stats.read_copied_bytes += have as u64;
            }
        }
        p.placed = have as u32;
        self.rx.consume_record();
        self.rx.mode = RxMode::Data(p);
        Ok(())
    }

    /// The end of a READ whose data was placed as it came: `pad` bytes of padding remain.
    pub(super) fn end_read(
        &mut self,
        p: ReadProgress,
        pad: usize,
        sink: &mut dyn Sink<P>,
    ) -> Result<(), Fault> {
        let i = usize::from(p.slot);
        if self.read_target(&ReadProgress { discard: false, ..p }).is_none() {
            // Ended meanwhile (timed out, aborted): nothing to tell.
            return Ok(());
        }
        if pad != xdr::pad(p.len as usize) {
            return self.call_garbage(i, sink);
        }
        let Some(head) = self.read_head.take() else {
            return self.call_garbage(i, sink);
        };
        self.stats.replies += 1;
        if p.too_small {
            self.finish(i, sink, Err(CallError::TooLarge));
            return Ok(());
        }
        let call = self.slots[i].call;
        // (The reply borrows `keep`: the garbage case is handled once it is gone.)
        let told = match P::read_reply(&call, head, &self.keep[..self.keep_len], p.len) {
            Ok(reply) => {
                let tag = free_slot(&mut self.slots, &mut self.free, &mut self.big_reads, i);
                sink.done(tag, Ok(reply));
                true
            }
            Err(_) => false,
        };
        if told {
            Ok(())
        } else {
            self.call_garbage(i, sink)
        }
    }

    /// One whole record at `buf[start..start + len]`.
    pub(super) fn record(&mut self, start: usize, len: usize, sink: &mut dyn Sink<P>) -> Result<(), Fault> {
        let rec = &self.rx.buf[start..start + len];
        let Some(xid) = rpc::peek_xid(rec) else {
            return Err(Fault::Garbage);
        };
        let Some(i) = self.slot_of(xid) else {
            // A reply to no call in flight (a retransmitted call answered twice, a call that
            // timed out): dropped, if it is a reply at all.
            return match rpc::decode_reply(&mut Decoder::new(rec)) {
                Ok(_) => {
                    self.stats.unknown_xids += 1;
                    Ok(())
                }
                Err(_) => Err(Fault::Garbage),
            };
        };
        let slot = self.slots[i];
        let mut d = Decoder::new(rec);
        match rpc::decode_reply(&mut d) {
            Err(_) => return self.call_garbage(i, sink),
            Ok((_, Err(e))) => {
                self.stats.replies += 1;
                self.finish(i, sink, Err(CallError::Rpc(e)));
                return Ok(());
            }
            Ok((_, Ok(()))) => {}
        }
        // Decoded in place; the reply borrows the receive buffer while the sink looks at it.
        let results = start + d.position();
        let mut d = Decoder::new(&self.rx.buf[results..start + len]);
        // (The reply borrows the receive buffer: the garbage case is handled once it is gone.)
        let told = {
            let mut data = None;
            let decoded = P::decode(&slot.call, slot.read_count, &mut d, &mut data);
            // A READ's data into the owner's buffers (dropped if it gives none); before the reply
            // is taken apart, so that it is moved once, into the owner's `Ok`.
            let placed = match (&decoded, data) {
                (Ok(_), Some(data)) => match sink.read_buffer(slot.tag) {
                    Some(mut w) => {
                        let ok = w.write_all(data).is_ok();
                        if ok {
                            self.stats.read_copied_bytes += data.len() as u64;
                        }
                        ok
                    }
                    None => true,
                },
                _ => true,
            };
            match decoded {
                Ok(reply) => {
                    self.stats.replies += 1;
                    let tag = free_slot(&mut self.slots, &mut self.free, &mut self.big_reads, i);
                    if placed {
                        sink.done(tag, Ok(reply));
                    } else {
                        sink.done(tag, Err(CallError::TooLarge));
                    }
                    true
                }
                Err(_) => false,
            }
        };
        if told {
            Ok(())
        } else {
            self.call_garbage(i, sink)
        }
    }
}
