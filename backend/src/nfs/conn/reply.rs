//! Replies: a whole record decoded in place and matched to its call by XID, and a READ reply
//! whose header is in before its data (the data is then placed as it comes, and the call ends
//! when its padding does).

use super::rx::{ReadProgress, RxMode};
use super::state::{free_slot, Conn, Fault};
use super::types::{CallError, Sink};
use crate::nfs::wire::nfs3::{self, Proc, ReadHead, Res};
use crate::nfs::wire::rpc;
use crate::nfs::wire::xdr::{self, Decoder};
use crate::nfs::wire::WireError;

impl Conn {
    /// A reply that is garbage, for call `i`: the call fails, the connection is reset.
    pub(super) fn call_garbage(&mut self, i: usize, sink: &mut dyn Sink) -> Result<(), Fault> {
        self.finish(i, sink, Err(CallError::Broken));
        Err(Fault::Garbage)
    }

    /// While a record is incomplete: if it is a READ reply whose header is in, switch to
    /// placing its data as it comes.
    pub(super) fn early_read_head(&mut self, sink: &mut dyn Sink) -> Result<(), Fault> {
        let (start, len) = (self.rx.start, self.rx.rec_len);
        let rec = &self.rx.buf[start..start + len];
        let Some(i) = rpc::peek_xid(rec).and_then(|x| self.slot_of(x)) else {
            return Ok(());
        };
        let slot = self.slots[i];
        if slot.proc != Proc::Read {
            return Ok(());
        }
        let mut d = Decoder::new(rec);
        let head = match rpc::decode_reply(&mut d) {
            Ok((_, Ok(()))) => nfs3::decode_read_head(&mut d, slot.read_count),
            Ok((_, Err(_))) => return Ok(()),
            Err(e) => Err(e),
        };
        let head = match head {
            Ok(h) => h,
            Err(WireError::Truncated { .. }) => return Ok(()),
            Err(_) => return self.call_garbage(i, sink),
        };
        let ReadHead::Ok { attr, eof, len: data_len, .. } = head else {
            return Ok(());
        };
        let at = d.position();
        let have = len - at;
        if have >= data_len as usize {
            return Ok(());
        }
        let (discard, too_small) = match sink.read_buffer(slot.tag) {
            None => (true, false),
            Some(w) if w.available() < data_len as usize => (true, true),
            Some(_) => (false, false),
        };
        let mut p = ReadProgress {
            slot: i as u16,
            xid: slot.xid,
            len: data_len,
            placed: 0,
            eof,
            attr,
            discard,
            too_small,
        };
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
    pub(super) fn end_read(&mut self, p: ReadProgress, pad: usize, sink: &mut dyn Sink) -> Result<(), Fault> {
        let i = usize::from(p.slot);
        if self.read_target(&ReadProgress { discard: false, ..p }).is_none() {
            // Ended meanwhile (timed out, aborted): nothing to tell.
            return Ok(());
        }
        if pad != xdr::pad(p.len as usize) {
            return self.call_garbage(i, sink);
        }
        self.stats.replies += 1;
        if p.too_small {
            self.finish(i, sink, Err(CallError::TooLarge));
        } else {
            self.finish(i, sink, Ok(Res::Read { count: p.len, eof: p.eof, attr: p.attr }));
        }
        Ok(())
    }

    /// One whole record at `buf[start..start + len]`.
    pub(super) fn record(&mut self, start: usize, len: usize, sink: &mut dyn Sink) -> Result<(), Fault> {
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
        let results = start + d.position();
        if slot.proc == Proc::Read {
            let head = match nfs3::decode_read_head(&mut d, slot.read_count) {
                Ok(h) => h,
                Err(_) => return self.call_garbage(i, sink),
            };
            let res = match head {
                ReadHead::Failed { status, attr } => Ok(Res::Failed { status, attr }),
                ReadHead::Ok { attr, eof, len, .. } => {
                    let Ok(data) = d.fixed(len as usize) else {
                        return self.call_garbage(i, sink);
                    };
                    match sink.read_buffer(slot.tag) {
                        None => Ok(Res::Read { count: len, eof, attr }),
                        Some(mut w) => match w.write_all(data) {
                            Ok(()) => {
                                self.stats.read_copied_bytes += u64::from(len);
                                Ok(Res::Read { count: len, eof, attr })
                            }
                            Err(_) => Err(CallError::TooLarge),
                        },
                    }
                }
            };
            if d.finish().is_err() {
                return self.call_garbage(i, sink);
            }
            self.stats.replies += 1;
            self.finish(i, sink, res);
            return Ok(());
        }
        // Decoded in place; the reply borrows the receive buffer while the sink looks at it.
        let mut d = Decoder::new(&self.rx.buf[results..start + len]);
        match nfs3::decode_res(slot.proc, &mut d) {
            Ok(res) => {
                self.stats.replies += 1;
                let tag = free_slot(&mut self.slots, &mut self.free, &mut self.big_reads, i);
                sink.done(tag, Ok(res));
                Ok(())
            }
            Err(_) => self.call_garbage(i, sink),
        }
    }
}
