//! The timers, looked at every tick: calls past their timeout end, a call sent and not answered
//! within the retransmission interval drops the link (so every call on it goes again on a new
//! one), and an idle link is looked at for EOF.

use std::time::Instant;

use super::program::Program;
use super::state::{Conn, Link, SlotState};
use super::types::{CallError, Sink};

impl<P: Program> Conn<P> {
    pub(super) fn check_timers(&mut self, now: Instant, sink: &mut dyn Sink<P>) {
        if let Link::Up { .. } = self.link {
            if self.in_flight() == 0 && self.rx.start == self.rx.end {
                // Idle: a look at the socket for EOF or unsolicited bytes.
                self.receive(now, sink, true);
            }
        }
        let mut stuck = false;
        let mut half_sent_timed_out = false;
        let mut timed_out = false;
        for i in 0..self.slots.len() {
            let s = self.slots[i];
            if s.state == SlotState::Free {
                continue;
            }
            if now.duration_since(s.started) >= self.cfg.timeout {
                if matches!(self.tx, Some((t, off)) if usize::from(t) == i && off > 0) {
                    half_sent_timed_out = true;
                }
                if matches!(self.tx, Some((t, _)) if usize::from(t) == i) {
                    self.tx = None;
                }
                self.stats.timeouts += 1;
                timed_out = true;
                self.finish(i, sink, Err(CallError::TimedOut));
                continue;
            }
            if s.state == SlotState::Sent && now.duration_since(s.sent_at) >= self.cfg.retransmit {
                stuck = true;
            }
        }
        if timed_out {
            // Forget the queue entries of calls that ended before being sent, so the queue
            // never holds more than one entry per slot (and never grows).
            let slots = &self.slots;
            self.queue.retain(|&(i, g)| {
                let s = &slots[usize::from(i)];
                s.state == SlotState::Queued && s.generation == g
            });
        }
        if half_sent_timed_out || (stuck && matches!(self.link, Link::Up { .. })) {
            self.drop_link(now);
        }
    }
}
