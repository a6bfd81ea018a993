//! Serving one function's queues on a poller ([`FnCtx`]'s methods): taking the requests the
//! driver made available and handing them to the handler or the engine, completing what the
//! engine finished and the waiting requests it answered, draining the engine, and signalling
//! the queues' interrupts. [`Served`] is one queue as a poller holds it.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use log::{debug, error, warn};

use super::engine::{Engine, Outcome, Taken, MAX_WAIT_REPLY};
use super::msg::{Event, FnCtx};
use super::parked::{guest_ranges, write_reply, Parked};
use crate::interrupt::{signal_eventfd, Irqs, Signalled};
use crate::memory::GuestMem;
use crate::pci::{QueueConfig, NO_VECTOR};
use crate::stats::{add, sub_one, OpClass, QueueCounters, Tally};
use crate::virtq::{Chain, QueueError, Ring, RingState};

/// Most requests a poller takes from one queue per round before moving to the next queue.
const ROUND_BUDGET: u16 = 64;

pub(super) struct Served {
    pub(super) queue: Ring,
    pub(super) attached: bool,
    pub(super) broken: bool,
    /// Index of its counters in the poller's block.
    pub(super) stat: usize,
    /// Per head (buffer id), the clock reading of the round that took it and its class, for a
    /// request left pending in the engine.
    pub(super) starts: Box<[(u64, OpClass)]>,
    /// A round's returns (head, length) that wait for the handler to make ready what they
    /// name ([`RequestHandler::before_publish`], when it says one is due): a used entry may
    /// be seen by the driver, or published by a recovery, as soon as it is written. Room for
    /// a round.
    pub(super) returns: Vec<(u16, u32)>,
    /// The engine's completions of a pass, pushed likewise after `before_publish`: head,
    /// length, when a waiting one was taken, and what it was.
    pub(super) finished: Vec<(u16, u32, Option<u64>, Tally)>,
}

/// The queue slots with new used entries in one completion pass.
#[derive(Default)]
struct Touched {
    /// Bitmap of the first 64 slots.
    bits: u64,
    /// Any slot past those.
    overflow: bool,
}

impl FnCtx {
    /// The handler's [`RequestHandler::before_publish`]; a panic in it (a bug) costs a log
    /// line, not the poller: the replies are published all the same (what it did not make
    /// ready may then be missing after a crash).
    fn before_publish(&self) {
        if std::panic::catch_unwind(AssertUnwindSafe(|| self.handler.before_publish())).is_err() {
            error!("poller {}: the request handler panicked before a publish", self.id);
        }
    }
}

/// Keeps engine request `id`'s completion (its used entry `len` bytes long; `waited`: since
/// when a waiting one waited) for the pass's pushes, and marks its queue touched.
fn defer(queues: &mut [Served], id: u64, len: u32, waited: Option<u64>, tally: Tally, touched: &mut Touched) {
    let (slot, head) = ((id >> 16) as usize, (id & 0xffff) as u16);
    let Some(q) = queues.get_mut(slot) else { return };
    q.finished.push((head, len, waited, tally));
    touch(touched, slot);
}

/// Marks queue `slot` as having new used entries.
fn touch(touched: &mut Touched, slot: usize) {
    if slot < 64 {
        touched.bits |= 1 << slot;
    } else {
        touched.overflow = true;
    }
}

impl FnCtx {
    /// The queue `cfg` in the layout features `f` negotiated, resumed from `state` if given.
    /// With `recover`, it resumes from its in-flight record instead (a queue that keeps
    /// none, or a packed one, cannot: it is reported broken).
    pub(super) fn new_queue(
        &self,
        cfg: QueueConfig,
        f: u64,
        state: Option<&RingState>,
        recover: bool,
    ) -> Option<Served> {
        let ring = match state {
            Some(s) => Ring::resume(cfg, f, s),
            None => Ring::new(cfg, f),
        };
        match ring {
            Ok(mut queue) => {
                if recover {
                    if !self.track.as_ref().is_some_and(|a| queue.recover_from(a)) {
                        self.report(QueueError::Recovery { queue: cfg.index });
                        return None;
                    }
                } else if let Some(a) = &self.track {
                    // Resumed after a live update: the record the predecessor kept, with the
                    // requests still out; started afresh otherwise.
                    if state.is_none() || !queue.continue_track(a) {
                        queue.keep_track(a);
                    }
                }
                let stat = match self.stats.place(cfg.index) {
                    Some((p, local)) if p == self.id => local,
                    _ => usize::MAX, // not a queue of ours by the profile: not counted
                };
                let starts = vec![(0, OpClass::Other); usize::from(cfg.size)].into_boxed_slice();
                let size = usize::from(cfg.size);
                Some(Served {
                    queue,
                    attached: false,
                    broken: false,
                    stat,
                    starts,
                    returns: Vec::with_capacity(size.min(usize::from(ROUND_BUDGET))),
                    finished: Vec::with_capacity(size),
                })
            }
            Err(e) => {
                self.report(e);
                None
            }
        }
    }

    /// The counters of this poller's `stat`-th queue.
    #[inline]
    pub(super) fn counters(&self, stat: usize) -> Option<&QueueCounters> {
        self.stats.poller(self.id).queue(stat)
    }

    pub(super) fn attach(&self, q: &mut Served, mem: &GuestMem) {
        match q.queue.attach(mem) {
            Ok(()) => q.attached = true,
            Err(QueueError::RingUnmapped(i)) => debug!("queue {i}: rings not mapped yet"),
            Err(e) => {
                q.broken = true;
                self.report(e);
            }
        }
    }

    pub(super) fn report(&self, e: QueueError) {
        error!("poller {}: {e}; device needs reset", self.id);
        let _ = self.events.send(Event::Broken(e));
        (self.wake_control)();
    }

    pub(super) fn serve<'m>(
        &self,
        slot: usize,
        served: &mut Served,
        mem: &'m GuestMem,
        chain: &mut Chain<'m>,
        engine: &mut Option<Box<dyn Engine>>,
        parked: &mut Vec<Parked>,
    ) -> Result<usize, QueueError> {
        let q = &mut served.queue;
        if !q.has_work(mem)? {
            return Ok(0);
        }
        let index = usize::from(q.index());
        let counters = self.counters(served.stat);
        let count = |n: u64, field: fn(&QueueCounters) -> &AtomicU64| {
            if let Some(c) = counters {
                add(field(c), n);
            }
        };
        let mine = self.stats.poller(self.id);
        // The round took the batch now; its used entries are published together below.
        let t0 = self.clock.as_ref().map_or(0, |c| c.now());
        let mut by_class = [0u64; OpClass::ALL.len()];
        let (mut taken, mut completed) = (0usize, 0u64);
        // Returns are written at once while the handler has nothing to make ready first; from
        // the first that must wait for it, the round's returns wait (`served.returns`).
        let mut deferring = false;
        let mut failed = None;
        while taken < usize::from(ROUND_BUDGET) {
            let valid = match q.next(mem, chain) {
                Ok(Some(v)) => v,
                Ok(None) => break,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            taken += 1;
            let token = chain.head;
            let len = match valid {
                Ok(()) => {
                    let room: usize = chain.writable.iter().map(|s| s.len()).sum();
                    let room = u32::try_from(room).unwrap_or(u32::MAX);
                    // A bug in a handler must cost one request, not the poller (and with it the
                    // device): a panic fails the request like a malformed chain.
                    let taken = Taken { queue: q.index(), replayed: chain.replayed };
                    let call = std::panic::catch_unwind(AssertUnwindSafe(|| match engine {
                        Some(e) => {
                            let id = ((slot as u64) << 16) | u64::from(token);
                            e.submit(id, taken, &chain.readable, &chain.writable)
                        }
                        None => {
                            let (len, tally) = self.handler.handle(taken, &chain.readable, &chain.writable);
                            (Outcome::Done(len), tally)
                        }
                    }));
                    let (outcome, tally) = call.unwrap_or_else(|_| {
                        error!("queue {index}: the request handler panicked on request {token}; failing it");
                        count(1, |c| &c.bad_chains);
                        (Outcome::Done(0), Tally { errno: libc::EIO as u16, ..Tally::default() })
                    });
                    match outcome {
                        Outcome::Done(len) => {
                            mine.count(counters, tally);
                            by_class[tally.class.index()] += 1;
                            len.min(room)
                        }
                        Outcome::Pending => {
                            if let Some(s) = served.starts.get_mut(usize::from(token)) {
                                *s = (t0, tally.class);
                            }
                            count(1, |c| &c.in_flight);
                            continue;
                        }
                        Outcome::Wait => {
                            let id = ((slot as u64) << 16) | u64::from(token);
                            let reply = guest_ranges(mem, &chain.writable);
                            let class = tally.class;
                            parked.push(Parked { id, reply, answer: None, started: t0, class, tally });
                            count(1, |c| &c.waiting);
                            continue;
                        }
                    }
                }
                Err(e) => {
                    warn!("queue {index}: request {token} failed: {e}");
                    count(1, |c| &c.bad_chains);
                    0
                }
            };
            deferring = deferring || self.handler.publish_due();
            if deferring {
                served.returns.push((token, len));
            } else {
                q.push_used(mem, token, len)?;
            }
            completed += 1;
        }
        if !served.returns.is_empty() {
            // What the replies name is made safe first (a crash-kept share's descriptors),
            // then the replies are written.
            self.before_publish();
            for (token, len) in served.returns.drain(..) {
                q.push_used(mem, token, len)?;
            }
        }
        if let Some(e) = failed {
            return Err(e); // what was written is published with a later round
        }
        if completed > 0 {
            crate::crash_point::reached(crate::crash_point::CrashPoint::Returned);
            q.publish_used(mem)?;
            count(completed, |c| &c.requests);
            if let Some(clock) = &self.clock {
                let ns = clock.ns(t0, clock.now());
                for (class, &n) in OpClass::ALL.iter().zip(&by_class) {
                    if n > 0 {
                        mine.class(*class).time(ns, n);
                    }
                }
            }
        }
        Ok(taken)
    }

    /// Completes what the engine finished, and the waiting requests it answered: used entries,
    /// one publish per queue.
    pub(super) fn complete(
        &self,
        engine: &mut dyn Engine,
        queues: &mut [Served],
        mem: &GuestMem,
        parked: &mut Vec<Parked>,
    ) -> usize {
        let mut touched = Touched::default();
        // Read once, at the first completion of this pass.
        let mut now = None;
        // As in `serve`: written at once until one must wait for `before_publish`.
        let mut deferring = false;
        let mut n = engine.poll(&mut |id, len, tally| {
            deferring = deferring || self.handler.publish_due();
            if deferring {
                defer(queues, id, len, None, tally, &mut touched);
            } else {
                self.finish(queues, mem, id, len, None, tally, &mut now);
                touch(&mut touched, (id >> 16) as usize);
            }
        });
        if !parked.is_empty() {
            n += engine.poll_waits(&mut |id, reply, tally| {
                let Some(i) = parked.iter().position(|p| p.id == id) else { return };
                let open = queues.get((id >> 16) as usize).is_some_and(|q| q.attached && !q.broken);
                if open {
                    let p = parked.swap_remove(i);
                    let len = write_reply(mem, &p.reply, reply);
                    let tally = Tally { class: p.class, ..tally };
                    deferring = deferring || self.handler.publish_due();
                    if deferring {
                        defer(queues, id, len, Some(p.started), tally, &mut touched);
                    } else {
                        self.finish(queues, mem, id, len, Some(p.started), tally, &mut now);
                        touch(&mut touched, (id >> 16) as usize);
                    }
                } else {
                    let keep = &reply[..reply.len().min(MAX_WAIT_REPLY)];
                    parked[i].answer = heapless::Vec::from_slice(keep).ok();
                    parked[i].tally = Tally { class: parked[i].class, ..tally };
                }
            });
            // Answers that came while their queue's ring was not mapped.
            let mut i = 0;
            while i < parked.len() {
                let slot = (parked[i].id >> 16) as usize;
                let open = queues.get(slot).is_some_and(|q| q.attached && !q.broken);
                match &parked[i].answer {
                    Some(_) if open => {
                        let p = parked.swap_remove(i);
                        let answer = p.answer.unwrap_or_default();
                        let len = write_reply(mem, &p.reply, &answer);
                        deferring = deferring || self.handler.publish_due();
                        if deferring {
                            defer(queues, p.id, len, Some(p.started), p.tally, &mut touched);
                        } else {
                            self.finish(queues, mem, p.id, len, Some(p.started), p.tally, &mut now);
                            touch(&mut touched, slot);
                        }
                        n += 1;
                    }
                    _ => i += 1,
                }
            }
        }
        if touched.bits == 0 && !touched.overflow {
            return n; // the common round: the engine finished nothing
        }
        // As in `serve`: what the deferred replies name is made safe before they are written.
        if deferring {
            self.before_publish();
        }
        for slot in 0..queues.len() {
            if (slot < 64 && touched.bits & (1 << slot) == 0) || (slot >= 64 && !touched.overflow) {
                continue;
            }
            let mut finished = std::mem::take(&mut queues[slot].finished);
            for (head, len, waited, tally) in finished.drain(..) {
                let id = ((slot as u64) << 16) | u64::from(head);
                self.finish(queues, mem, id, len, waited, tally, &mut now);
            }
            queues[slot].finished = finished;
        }
        crate::crash_point::reached(crate::crash_point::CrashPoint::Returned);
        for (slot, q) in queues.iter_mut().enumerate() {
            if (slot < 64 && touched.bits & (1 << slot) != 0) || (slot >= 64 && touched.overflow) {
                if let Err(e) = q.queue.publish_used(mem) {
                    debug!("queue {}: {e}", q.queue.index());
                }
            }
        }
        n
    }

    /// Pushes the used entry of engine request `id` (not yet published): a pending one, or one
    /// that waited since the clock read `waited`, and counts it (`tally`; a pending request's
    /// class is the one it was submitted with). `now`: the clock reading of this completion
    /// pass, read at its first completion.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        queues: &mut [Served],
        mem: &GuestMem,
        id: u64,
        len: u32,
        waited: Option<u64>,
        tally: Tally,
        now: &mut Option<u64>,
    ) {
        let (slot, head) = ((id >> 16) as usize, (id & 0xffff) as u16);
        let Some(q) = queues.get_mut(slot) else { return };
        let counters = self.counters(q.stat);
        if let Some(c) = counters {
            sub_one(if waited.is_some() { &c.waiting } else { &c.in_flight });
        }
        if q.broken || q.queue.push_used(mem, head, len).is_err() {
            return;
        }
        if let Some(c) = counters {
            add(&c.requests, 1);
        }
        let (started, tally) = match waited {
            Some(t) => (Some(t), tally),
            None => match q.starts.get(usize::from(head)) {
                Some(&(t, class)) => (Some(t), Tally { class, ..tally }),
                None => (None, Tally { class: OpClass::Other, ..tally }),
            },
        };
        let mine = self.stats.poller(self.id);
        mine.count(counters, tally);
        if let (Some(clock), Some(t0)) = (&self.clock, started) {
            let t1 = *now.get_or_insert_with(|| clock.now());
            mine.class(tally.class).time(clock.ns(t0, t1), 1);
        }
    }

    /// Waits for every in-flight engine request (completing them) before rings or memory change.
    /// Waiting requests ([`Outcome::Wait`]) are not waited for.
    pub(super) fn drain(
        &self,
        engine: &mut Option<Box<dyn Engine>>,
        queues: &mut [Served],
        mem: &GuestMem,
        parked: &mut Vec<Parked>,
    ) {
        let Some(e) = engine.as_mut() else { return };
        let started = Instant::now();
        let mut warned = false;
        while e.in_flight() > 0 {
            if self.complete(e.as_mut(), queues, mem, parked) == 0 {
                std::hint::spin_loop();
                if !warned && started.elapsed() > Duration::from_secs(1) {
                    warn!("poller {}: waiting for {} in-flight requests", self.id, e.in_flight());
                    warned = true;
                }
            }
        }
    }

    pub(super) fn signal(&self, irqs: &Irqs, vector: u16, queue: u16, stat: usize) {
        if vector == NO_VECTOR {
            return;
        }
        let v = usize::from(vector);
        if self.msix.deliverable_or_pend(v) {
            if let Some(Some(fd)) = irqs.get(v) {
                match signal_eventfd(fd) {
                    Ok(Signalled::Done) => {}
                    Ok(Signalled::Stuck) => {
                        if self.msix.mark_broken() {
                            self.report(QueueError::InterruptStuck { queue, vector });
                        }
                    }
                    Err(e) => warn!("queue {queue}: interrupt on vector {v} failed: {e}"),
                }
                if let Some(c) = self.counters(stat) {
                    add(&c.interrupts, 1);
                }
            }
        }
    }
}
