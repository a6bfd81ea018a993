//! A function's part of one poller ([`Attached`]): its queues there, the memory snapshot and
//! interrupts they are served with, its engine and waiting requests; how its messages are
//! applied (or held until its engine drained) and one poll round of its queues.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use log::debug;

use super::engine::Engine;
use super::msg::{Event, FnCtx, Msg};
use super::parked::{Parked, QueueState};
use super::queue::Served;
use crate::interrupt::Irqs;
use crate::memory::GuestMem;
use crate::virtq::{Chain, QueueError};

/// A function's part of one poller: its queues there, the memory snapshot and interrupts they
/// are served with, its engine and its waiting requests.
pub(super) struct Attached {
    pub(super) fid: u64,
    pub(super) f: Box<FnCtx>,
    pub(super) mem: Arc<GuestMem>,
    pub(super) irqs: Irqs,
    pub(super) queues: Vec<Served>,
    pub(super) parked: Vec<Parked>,
    pub(super) engine: Option<Box<dyn Engine>>,
    pub(super) faults_seen: u64,
    /// Messages held until the engine has drained, in arrival order; while any is held the
    /// function's queues give no new requests (its pending ones complete), and the poller goes
    /// on serving the other functions.
    pub(super) deferred: VecDeque<(u64, Msg)>,
    /// Detached: the sequence number to acknowledge once its engine is gone.
    pub(super) detached: Option<u64>,
    /// Rounds in a row this function had nothing to do (no request, nothing pending).
    pub(super) quiet: u32,
    /// Its doorbell source ([`Msg::DoorbellSource`]).
    pub(super) source: Option<Arc<OwnedFd>>,
    /// At its quiet point ([`Msg::Freeze`]): no request is taken.
    pub(super) frozen: bool,
}

/// Rounds without work after which a function of a shared poller turns cold.
pub(super) const QUIET_ROUNDS: u32 = 1 << 16;
/// A cold function is looked at every this many rounds (its queues, engine, faults): on a poller
/// with many idle functions a round costs the busy ones a sixteenth of the idle ones' checks
/// (each an avail-index load from that function's memory), and an idle function's first request
/// waits at most this many (then short) rounds; any request or pending work makes it hot again.
pub(super) const COLD_STRIDE: u64 = 16;

impl Attached {
    pub(super) fn in_flight(&self) -> usize {
        self.engine.as_ref().map_or(0, |e| e.in_flight())
    }

    /// Drops the waiting requests (their queues are going away).
    pub(super) fn cancel_waits(&mut self) {
        if let Some(e) = self.engine.as_mut() {
            e.cancel_waits();
        }
        if !self.parked.is_empty() {
            debug!("poller {}: dropping {} waiting requests with their queues", self.f.id, self.parked.len());
        }
        self.parked.clear();
        for q in &self.queues {
            if let Some(c) = self.f.counters(q.stat) {
                c.waiting.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Takes message `msg`: applied now, or held until the engine has drained (nothing may
    /// still use the rings or the memory when they change). True if the memory snapshot or the
    /// function itself changed.
    pub(super) fn take(&mut self, seq: u64, msg: Msg) -> bool {
        // Waiting requests go with their queues (the driver reset them); they survive a memory
        // change, holding only guest addresses.
        if matches!(msg, Msg::Start { .. } | Msg::Stop | Msg::Detach) {
            self.cancel_waits();
        }
        let drains =
            matches!(msg, Msg::Start { .. } | Msg::Stop | Msg::Memory(_) | Msg::Detach | Msg::Freeze);
        if !self.deferred.is_empty() || (drains && self.in_flight() > 0) {
            self.deferred.push_back((seq, msg));
            return false;
        }
        self.apply(seq, msg)
    }

    /// Applies the held messages once the engine has drained.
    pub(super) fn take_deferred(&mut self) -> bool {
        let mut changed = false;
        while self.in_flight() == 0 {
            let Some((seq, msg)) = self.deferred.pop_front() else { break };
            changed |= self.apply(seq, msg);
        }
        changed
    }

    fn apply(&mut self, seq: u64, msg: Msg) -> bool {
        let mut changed = false;
        match msg {
            Msg::Start { queues: cfgs, features: f, resume, recover } => {
                self.faults_seen = self.f.faults.load(Ordering::Acquire);
                let state = |i: u16| resume.iter().find(|s| s.ring.index == i);
                self.queues = (cfgs.into_iter())
                    .filter_map(|c| self.f.new_queue(c, f, state(c.index).map(|s| &s.ring), recover))
                    .collect();
                for q in &mut self.queues {
                    self.f.attach(q, &self.mem);
                }
                self.adopt_parked(&resume);
            }
            Msg::Stop => self.queues.clear(),
            Msg::Freeze => {
                // The engine has drained: a queue's requests still out are parked (SETLKWs
                // waiting for their locks), each named by the engine or answered already.
                self.frozen = true;
                let states = self.frozen_states();
                let _ = self.f.events.send(Event::Frozen(states));
            }
            Msg::Thaw => self.frozen = false,
            Msg::Memory(m) => {
                self.mem = m;
                for q in self.queues.iter_mut().filter(|q| !q.attached) {
                    self.f.attach(q, &self.mem);
                }
                changed = true;
            }
            Msg::Irqs(i) => self.irqs = i,
            Msg::DoorbellSource(fd) => self.source = fd,
            Msg::Detach => {
                self.queues.clear();
                self.detached = Some(seq);
                return true; // acknowledged once its engine is dropped
            }
            Msg::Attach(_) => {}
        }
        let _ = self.f.events.send(Event::Ack { poller: self.f.id, seq });
        changed
    }

    /// Each queue's state at the quiet point: `None` for one whose outstanding requests are not
    /// all parked and nameable.
    fn frozen_states(&self) -> Vec<(u16, Option<QueueState>)> {
        let tokens = self.engine.as_ref().map(|e| e.wait_tokens()).unwrap_or_default();
        let token = |id: u64| tokens.iter().find(|t| t.0 == id).map(|t| t.1);
        (self.queues.iter().enumerate())
            .map(|(slot, q)| {
                let ring = q.queue.state();
                let mine = self.parked.iter().filter(|p| (p.id >> 16) as usize == slot);
                let parked: Vec<_> = mine.map(|p| p.state(token(p.id))).collect();
                let named = parked.iter().all(|p| p.answer.is_some() || p.token.is_some());
                let whole = named && ring.outstanding() == parked.len();
                (q.queue.index(), whole.then_some(QueueState { ring, parked }))
            })
            .collect()
    }

    /// Parks again the waiting requests of queues resumed from a handover (their engine
    /// names them again); one its engine does not know breaks its queue (it would never be
    /// answered).
    fn adopt_parked(&mut self, resume: &[QueueState]) {
        let now = self.f.clock.as_ref().map_or(0, |c| c.now());
        for (slot, q) in self.queues.iter_mut().enumerate() {
            let Some(st) = resume.iter().find(|s| s.ring.index == q.queue.index()) else { continue };
            for p in &st.parked {
                let id = ((slot as u64) << 16) | u64::from(p.head);
                let known = match (&p.answer, p.token, self.engine.as_mut()) {
                    (Some(_), _, _) => true,
                    (None, Some(t), Some(e)) => e.adopt_wait(id, t),
                    _ => false,
                };
                match Parked::from_state(id, p, now).filter(|_| known) {
                    Some(parked) => {
                        self.parked.push(parked);
                        if let Some(c) = self.f.counters(q.stat) {
                            c.waiting.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    None => {
                        q.broken = true;
                        self.f.report(QueueError::HandoverWait { queue: q.queue.index(), head: p.head });
                    }
                }
            }
        }
    }

    /// One poll round of this function's queues on memory `snapshot` (the function's current
    /// one); returns the work done.
    pub(super) fn round<'m>(&mut self, snapshot: &'m GuestMem, chain: &mut Chain<'m>) -> usize {
        let mut work = 0usize;
        let f = &self.f;
        if self.deferred.is_empty() && !self.frozen {
            for (slot, q) in self.queues.iter_mut().enumerate() {
                if !q.attached || q.broken {
                    continue;
                }
                match f.serve(slot, q, snapshot, chain, &mut self.engine, &mut self.parked) {
                    Ok(n) => work += n,
                    Err(QueueError::RingUnmapped(i)) => {
                        // Guest memory is being remapped under a live queue; wait for the new map.
                        debug!("queue {i}: ring not mapped, waiting for DMA_MAP");
                        q.attached = false;
                    }
                    Err(e) => {
                        q.broken = true;
                        f.report(e);
                    }
                }
            }
        }
        // Frozen (a handover under way), nothing is completed either: the engine has drained,
        // and a waiting request's answer is the next process's to give.
        if let Some(e) = self.engine.as_mut().filter(|_| !self.frozen) {
            work += f.complete(e.as_mut(), &mut self.queues, &self.mem, &mut self.parked);
        }
        let faults = f.faults.load(Ordering::Relaxed);
        if faults != self.faults_seen {
            // Client memory went away under this round: what it read or wrote there was zeros
            // or lost. No queue of this function goes on; its driver must reset the device.
            self.faults_seen = faults;
            for q in self.queues.iter_mut().filter(|q| !q.broken) {
                q.broken = true;
                f.report(QueueError::MemoryLost(q.queue.index()));
            }
        }
        for q in self.queues.iter_mut().filter(|q| q.attached && !q.broken) {
            if q.queue.needs_interrupt(&self.mem) {
                crate::crash_point::reached(crate::crash_point::CrashPoint::Published);
                f.signal(&self.irqs, q.queue.vector(), q.queue.index(), q.stat);
            }
        }
        work
    }
}
