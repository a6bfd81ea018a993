//! The sink a poll round gives the connection ([`PollSink`]): READ replies' data goes into the
//! requests' reply buffers, WRITEs' data comes from their payloads (or the replay buffer), and
//! every reply goes through its slot's state machine ([`super::dispatch::reply`]): the request
//! ends ([`complete`]), or its next call is sent after the round, or later if the server was busy.

use std::time::Instant;

use vm_memory::VolatileSlice;

use super::commit::{self, Background, BACKGROUND_TAG};
use super::dispatch;
use super::slot::{Call, Flow, Slot, JUKEBOX_DELAY};
use crate::filesystem::seam::Completions;
use crate::filesystem::{self, Error, Reply};
use crate::io::{Reader, Writer};
use crate::nfs::conn::{CallError, Sink};
use crate::nfs::shared::{EngineCell, Shared};
use crate::nfs::wire::nfs3::Res;

/// The poll-time sink: replies go through the slots' state machines.
pub(super) struct PollSink<'e, 'c> {
    pub(super) fs: &'e Shared,
    pub(super) slots: &'e mut [Slot],
    pub(super) done: &'e mut Completions<'c>,
    pub(super) next: &'e mut Vec<u32>,
    pub(super) later: &'e mut Vec<(u32, Instant)>,
    pub(super) replay: &'e [VolatileSlice<'e>],
    pub(super) replay_owner: &'e mut Option<u32>,
    pub(super) busy: &'e mut usize,
    pub(super) background: &'e mut Option<Background>,
    pub(super) background_after: &'e mut Instant,
    pub(super) cell: &'e EngineCell,
}

/// Ends slot `i`'s request with `r`.
#[allow(clippy::too_many_arguments)]
pub(super) fn complete(
    fs: &Shared,
    slot: &mut Slot,
    i: u32,
    r: filesystem::Result<Reply>,
    done: &mut Completions<'_>,
    busy: &mut usize,
    replay_owner: &mut Option<u32>,
    cell: &EngineCell,
) {
    if !slot.busy {
        return;
    }
    if let Some(id) = slot.unstable.take() {
        fs.unstable.remove(id);
    }
    if let Some(sender) = slot.resending.take() {
        // Ended before every write was sent again: another request may take the turn.
        fs.unstable.end_resend(slot.nodeid, sender);
    }
    slot.replay = None;
    if *replay_owner == Some(i) {
        *replay_owner = None;
    }
    if r.is_err() {
        EngineCell::bump(&cell.errors);
    }
    done.complete(slot.token, r);
    slot.busy = false;
    *busy -= 1;
}

impl Sink for PollSink<'_, '_> {
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>> {
        let s = self.slots.get(tag as usize).filter(|s| s.busy && s.call == Call::Read)?;
        let mut w = self.done.data(s.token)?;
        w.split_at(s.done as usize).ok()?;
        Some(w)
    }

    fn payload(&mut self, tag: u32) -> Option<Reader<'_>> {
        let s = self.slots.get(tag as usize).filter(|s| s.busy)?;
        match s.call {
            Call::Write => {
                let mut r = self.done.payload(s.token)?;
                r.consume(s.done as usize).ok()?;
                r.truncate(s.chunk as usize);
                Some(r)
            }
            Call::Resend => {
                let mut r = Reader::new(self.replay);
                r.truncate(s.replay_len as usize);
                Some(r)
            }
            _ => None,
        }
    }

    fn done(&mut self, tag: u32, res: Result<Res<'_>, CallError>) {
        if tag == BACKGROUND_TAG {
            // The claim goes with it: the next background COMMIT may be sent.
            let Some(b) = self.background.take() else { return };
            commit::background_done(self.fs, b, res, self.background_after);
            return;
        }
        let i = tag;
        let Some(slot) = self.slots.get_mut(i as usize).filter(|s| s.busy) else { return };
        let flow = match res {
            Ok(res) => dispatch::reply(self.fs, slot, res, self.done),
            Err(e) => {
                if matches!(e, CallError::TimedOut) {
                    EngineCell::bump(&self.cell.timed_out);
                }
                log::debug!("nfs: {:?} call of request {:?} ended: {e}", slot.call, slot.token);
                Flow::Done(Err(Error::Io))
            }
        };
        match flow {
            Flow::Done(r) => {
                complete(self.fs, slot, i, r, self.done, self.busy, self.replay_owner, self.cell);
            }
            Flow::Next => self.next.push(i),
            Flow::Later => {
                if let Some(id) = slot.unstable.take() {
                    self.fs.unstable.remove(id);
                }
                self.later.push((i, Instant::now() + JUKEBOX_DELAY));
            }
        }
    }
}
