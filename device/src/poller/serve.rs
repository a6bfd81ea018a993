//! A poller thread ([`run`]): the per-round loop that takes control messages, serves every
//! attached function's queues, keeps its busy and idle time ([`Clock`]), and, when there is
//! nothing to do, spins, parks or blocks on its engines' readiness ([`Ctx::sleep`]).

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{debug, warn};

use super::attached::{Attached, COLD_STRIDE, QUIET_ROUNDS};
use super::msg::{Event, Msg, Post};
use super::wait::{Readiness, Wake, MAX_POLL_FDS};
use crate::memory::GuestMem;
use crate::stats::{add, coarse_now_ns, DeviceCounters, PollerCounters};
use crate::virtq::Chain;

/// Rounds in a row an adaptive poller polls engines whose requests are all it has before it
/// blocks on their readiness (each round's look is a system call or so: a few microseconds,
/// less than a remote round trip, enough for replies that stream in at depth).
const ENGINE_SPIN_ROUNDS: u32 = 4;
/// Most engines a poller blocks on at once; with more of them busy it polls.
const MAX_WAIT_FDS: usize = 32;

struct ExitFlag(Arc<[AtomicBool]>, usize);

impl Drop for ExitFlag {
    fn drop(&mut self) {
        self.0[self.1].store(true, Ordering::Release);
    }
}

/// A poller thread's own context.
pub(super) struct Ctx {
    pub(super) id: usize,
    pub(super) core: Option<usize>,
    pub(super) rx: Receiver<Post>,
    /// The pool's counters: this thread's time, rounds and parks.
    pub(super) stats: Arc<DeviceCounters>,
    pub(super) exited: Arc<[AtomicBool]>,
    pub(super) busy: bool,
    pub(super) spin: Duration,
    pub(super) sleep: Duration,
    /// Our wake-up while we block on our engines' readiness.
    pub(super) wake: Arc<Wake>,
}

/// Busy and idle time of a poller, from the coarse clock (see [`coarse_now_ns`]). A round is
/// busy if it took, completed or has pending requests; its state is known only at its end, so an
/// idle poller reads the clock as each round starts (while it has nothing to do), and a busy one
/// only when it turns idle and every [`CLOCK_ROUNDS`] rounds: nothing is read between a request's
/// arrival and its completion.
struct Clock {
    /// When the current spell began.
    mark: u64,
    busy: bool,
    /// Start of the current round, read only while idle.
    round_start: u64,
    /// Rounds run.
    rounds: u64,
    busy_ns: u64,
    idle_ns: u64,
}

/// Rounds between two clock reads of a poller that stays busy or idle.
const CLOCK_ROUNDS: u64 = 1024;

impl Clock {
    fn new() -> Self {
        let now = coarse_now_ns();
        Clock { mark: now, busy: false, round_start: now, rounds: 0, busy_ns: 0, idle_ns: 0 }
    }

    /// A round begins.
    #[inline]
    fn start_round(&mut self) {
        if !self.busy {
            self.round_start = coarse_now_ns();
        }
    }

    /// A round ended, `busy` or not.
    #[inline]
    fn end_round(&mut self, busy: bool, out: &PollerCounters) {
        self.rounds += 1;
        if busy != self.busy {
            // Idle to busy: the spell ended when this round began. Busy to idle: now (the idle
            // round itself, a short one, is counted busy).
            let at = if busy { self.round_start } else { coarse_now_ns() };
            self.close(at, busy, out);
        } else if self.rounds.is_multiple_of(CLOCK_ROUNDS) {
            self.close(coarse_now_ns(), busy, out);
        }
    }

    /// Ends the current spell at `at` and starts one that is `busy` or not; publishes the
    /// poller's time and rounds.
    fn close(&mut self, at: u64, busy: bool, out: &PollerCounters) {
        out.rounds.store(self.rounds, Ordering::Relaxed);
        let ns = at.saturating_sub(self.mark);
        if self.busy {
            self.busy_ns += ns;
            out.busy_ns.store(self.busy_ns, Ordering::Relaxed);
        } else {
            self.idle_ns += ns;
            out.idle_ns.store(self.idle_ns, Ordering::Relaxed);
        }
        (self.mark, self.busy) = (at.max(self.mark), busy);
    }
}

pub(super) fn run(ctx: Ctx) {
    let _exit = ExitFlag(ctx.exited.clone(), ctx.id);
    if let Some(core) = ctx.core {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
            warn!("poller {}: cannot pin to core {core}", ctx.id);
        }
    }
    let mut fns: Vec<Attached> = Vec::new();
    let mut idle_rounds = 0u64;
    let mut idle_since = Instant::now();
    let mine = ctx.stats.poller(ctx.id);
    let mut clock = Clock::new();
    let mut round_no = 0u64;
    // A message the last look before blocking on the engines found (handled first).
    let mut stashed: Option<Post> = None;
    // Rounds in a row with nothing but engine requests in flight.
    let mut engine_idle = 0u32;
    // The last sleep ended on a doorbell source and no request came since: the message was not
    // a doorbell for us, and the source stays readable until the control plane has read it, so
    // the next sleep leaves the sources out (its wake-up still comes as a kick).
    let mut source_woke = false;
    // One buffer list per set of memory snapshots (it borrows them): building it costs a 24 KiB
    // memset, 18 % of the poller's instructions at QD=1, idle spinning included (callgrind).
    // It is rebuilt when a function's memory changes or a function comes or goes.
    'snapshot: loop {
        let snapshots: Vec<Arc<GuestMem>> = fns.iter().map(|a| a.mem.clone()).collect();
        let mut chain = Chain::default();
        loop {
            let mut changed = false;
            while let Some(post) = stashed.take().or_else(|| ctx.rx.try_recv().ok()) {
                match post {
                    Post::Shutdown => {
                        for a in &mut fns {
                            a.cancel_waits();
                            a.f.drain(&mut a.engine, &mut a.queues, &a.mem, &mut a.parked);
                        }
                        clock.close(coarse_now_ns(), false, mine);
                        return;
                    }
                    Post::To { fid, seq, msg: Msg::Attach(f) } => {
                        let engine = f.handler.engine(ctx.id);
                        let faults_seen = f.faults.load(Ordering::Acquire);
                        let _ = f.events.send(Event::Ack { poller: ctx.id, seq });
                        fns.push(Attached {
                            fid,
                            f,
                            mem: Arc::new(GuestMem::default()),
                            irqs: Arc::from(Vec::new()),
                            queues: Vec::new(),
                            parked: Vec::new(),
                            engine,
                            faults_seen,
                            deferred: VecDeque::new(),
                            detached: None,
                            quiet: 0,
                            source: None,
                            frozen: false,
                        });
                        changed = true;
                    }
                    Post::To { fid, seq, msg } => {
                        if let Some(a) = fns.iter_mut().find(|a| a.fid == fid) {
                            changed |= a.take(seq, msg);
                        }
                    }
                }
            }
            for a in fns.iter_mut().filter(|a| !a.deferred.is_empty()) {
                changed |= a.take_deferred();
            }
            let mut i = 0;
            while i < fns.len() {
                let Some(seq) = fns[i].detached else {
                    i += 1;
                    continue;
                };
                let a = fns.swap_remove(i);
                let events = a.f.events.clone();
                drop(a); // its engine ends here, on its own poller
                let _ = events.send(Event::Ack { poller: ctx.id, seq });
            }
            if changed {
                continue 'snapshot;
            }
            clock.start_round();
            let mut work = 0usize;
            round_no = round_no.wrapping_add(1);
            let shared = fns.len() > 1;
            let mut waiting = false;
            for (i, (a, snapshot)) in fns.iter_mut().zip(&snapshots).enumerate() {
                // A function quiet for long is looked at every COLD_STRIDE-th round only, so
                // that idle functions cost a busy one on the same poller little (see COLD_STRIDE).
                if shared && a.quiet >= QUIET_ROUNDS && !(round_no + i as u64).is_multiple_of(COLD_STRIDE) {
                    continue;
                }
                let n = a.round(snapshot, &mut chain);
                let pending = a.in_flight() > 0;
                waiting |= pending;
                // (A cold function has nothing in flight: it would not be cold.)
                let active = n > 0 || pending || !a.parked.is_empty() || !a.deferred.is_empty();
                a.quiet = if active { 0 } else { a.quiet.saturating_add(1) };
                work += n;
            }
            // Adaptive, and nothing but engine requests to wait for for a few rounds (replies
            // that stream in at depth come within them): block on the engines.
            engine_idle = if waiting && work == 0 { engine_idle.saturating_add(1) } else { 0 };
            let block = !ctx.busy && engine_idle > ENGINE_SPIN_ROUNDS && engines_can_wait(&fns);
            let busy = work > 0 || (waiting && !block);
            clock.end_round(busy, mine);
            if work > 0 {
                source_woke = false;
            }
            if block {
                (stashed, source_woke) = ctx.sleep(&mut fns, Sleep::Engines, !source_woke);
                clock.close(coarse_now_ns(), false, mine);
            } else if busy {
                if work > 0 {
                    idle_rounds = 0;
                }
            } else if fns.iter().all(|a| a.queues.is_empty()) {
                std::thread::park_timeout(Duration::from_millis(100));
                clock.close(coarse_now_ns(), false, mine); // idle time readable while it naps
            } else if ctx.busy {
                std::hint::spin_loop();
            } else {
                // Read the clock only every 64 idle rounds (it showed in profiles of the spin).
                idle_rounds += 1;
                if idle_rounds == 1 {
                    idle_since = Instant::now();
                } else if idle_rounds.is_multiple_of(64) && idle_since.elapsed() >= ctx.spin {
                    // Still idle next time: park again soon.
                    (stashed, source_woke) = ctx.sleep(&mut fns, Sleep::Park, !source_woke);
                    clock.close(coarse_now_ns(), false, mine);
                }
                std::hint::spin_loop();
            }
        }
    }
}

/// Why a poller sleeps ([`Ctx::sleep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sleep {
    /// An idle spell: nothing to do.
    Park,
    /// Nothing to do but requests pending on the engines: wait on their readiness too.
    Engines,
}

impl Ctx {
    /// Sleeps for up to `idle_sleep_us` (1 ms at most with requests waiting on an outside event:
    /// the event, a lock released through another poller, rings no doorbell here), in `poll(2)`
    /// on our wake-up, the functions' doorbell sources (if `sources`) and, for
    /// [`Sleep::Engines`], the readiness of every engine with requests in flight (bounded by
    /// their `within` too).
    ///
    /// With doorbells on the socket, first asks the driver of every live queue to ring after its
    /// next request, then looks at the rings and the messages once more (the driver stores its
    /// avail index, fences, then reads our suppression fields; we store those, fence, then read
    /// the avail index: one of us sees the other), so a request made at any moment either is
    /// seen here or rings the doorbell that wakes us; a message found is returned, to be handled
    /// first. Notifications are off again before polling resumes. Functions whose doorbells stay
    /// in shared memory are only looked at. Also returns whether a doorbell source ended the
    /// sleep (see `wait.rs`).
    fn sleep(&self, fns: &mut [Attached], why: Sleep, sources: bool) -> (Option<Post>, bool) {
        let waits = fns.iter().any(|a| !a.parked.is_empty());
        let mut sleep = if waits { self.sleep.min(Duration::from_millis(1)) } else { self.sleep };
        self.wake.arm();
        set_notify(fns, true);
        fence(Ordering::SeqCst);
        let msg = self.rx.try_recv().ok();
        let mut by_source = false;
        if msg.is_none() && !any_work(fns) {
            let mut ready: heapless::Vec<Readiness<'_>, MAX_WAIT_FDS> = heapless::Vec::new();
            if why == Sleep::Engines {
                for r in
                    fns.iter().filter(|a| a.in_flight() > 0).filter_map(|a| a.engine.as_ref()?.readiness())
                {
                    sleep = sleep.min(r.within);
                    // `engines_can_wait` bounded their number.
                    let _ = ready.push(r);
                }
            }
            let mut doorbells: heapless::Vec<BorrowedFd<'_>, MAX_POLL_FDS> = heapless::Vec::new();
            if sources {
                for fd in fns
                    .iter()
                    .filter(|a| a.f.doorbells && !a.queues.is_empty())
                    .filter_map(|a| a.source.as_ref())
                {
                    if doorbells.push(fd.as_fd()).is_err() {
                        break; // the rest wake us by their kicks
                    }
                }
            }
            let counters = self.stats.poller(self.id);
            add(if why == Sleep::Engines { &counters.engine_waits } else { &counters.parks }, 1);
            by_source = self.wake.wait(&ready, &doorbells, sleep);
            if by_source {
                add(&counters.doorbell_wakes, 1);
            }
        } else {
            self.wake.disarm();
        }
        set_notify(fns, false);
        (msg, by_source)
    }
}

/// Turns driver notifications on or off on every live queue of the functions whose doorbells
/// come through the socket (the others' stay in shared memory and are only looked at).
fn set_notify(fns: &mut [Attached], on: bool) {
    for a in fns.iter_mut().filter(|a| a.f.doorbells) {
        for q in a.queues.iter_mut().filter(|q| q.attached && !q.broken) {
            if let Err(e) = q.queue.set_notify(&a.mem, on) {
                debug!("queue {}: {e}", q.queue.index());
            }
        }
    }
}

/// Whether any live queue of any function has a request (or cannot tell).
fn any_work(fns: &[Attached]) -> bool {
    fns.iter().any(|a| {
        a.queues.iter().filter(|q| q.attached && !q.broken).any(|q| q.queue.has_work(&a.mem).unwrap_or(true))
    })
}

/// Whether the poller may block on its engines instead of polling them: it serves some queue,
/// and every engine with requests in flight (at most [`MAX_WAIT_FDS`]) offers a readiness.
fn engines_can_wait(fns: &[Attached]) -> bool {
    let mut pending = 0;
    for a in fns.iter().filter(|a| a.in_flight() > 0) {
        if a.engine.as_ref().and_then(|e| e.readiness()).is_none() {
            return false;
        }
        pending += 1;
    }
    pending > 0 && pending <= MAX_WAIT_FDS && fns.iter().any(|a| !a.queues.is_empty())
}
