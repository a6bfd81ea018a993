//! The data plane: poller threads that own virtqueues and serve them by polling.
//!
//! Each poller owns a disjoint set of queues by value (`&mut`, no lock) and runs rounds: take the
//! requests the driver made available, hand each validated chain to the [`RequestHandler`], push
//! the used entries, publish the used index once per queue per round, then decide interrupts per
//! EVENT_IDX/NO_INTERRUPT and write each needed MSI-X eventfd once. While it polls, the rings are
//! all it reads: driver notifications are suppressed. With `polling = "busy"` a poller never
//! sleeps (a dedicated DPU core); with `"adaptive"`, after `idle_spin_us` without work it backs off
//! to sleeps of at most `idle_sleep_us` so that many devices can share few cores. With
//! `doorbells = "socket"` it turns notifications on before it parks, and a doorbell (a
//! REGION_WRITE to the notify area, which the control plane turns into [`PollerSet::kick`]) wakes
//! it; with `"shared"` the notify page is plain shared memory nobody reads and a parked poller
//! wakes at the end of its sleep. Any control message wakes it at once.
//!
//! Statistics: each poller writes its own block of [`crate::stats::DeviceCounters`] (see there).
//!
//! A handler may give each poller an [`Engine`] (an io_uring, say): requests it cannot finish at
//! once stay pending and are completed, out of order, from the same poller's later rounds.
//! Requests that wait on an outside event (one another request ends) are kept apart: see
//! [`Outcome::Wait`].
//!
//! The control plane talks to pollers only by messages ([`PollerSet`]): start/stop queues, a new
//! guest-memory snapshot, new interrupt eventfds. Every message is acknowledged after the poller
//! applied it *between* two requests, so once all pollers acknowledged a new memory snapshot no
//! request can still be using the old one: that is when DMA_UNMAP may be answered.

use std::fs::File;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, error, warn};
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress, VolatileSlice,
};

use crate::config::{Polling, Profile};
use crate::memory::GuestMem;
use crate::pci::msix::MsixShared;
use crate::pci::{QueueConfig, NO_VECTOR};
use crate::stats::{
    add, coarse_now_ns, sub_one, DeviceCounters, LatencyClock, OpClass, PollerCounters, QueueCounters, Tally,
};
use crate::virtq::{Chain, QueueError, Ring};

mod wait;
pub use wait::Readiness;
use wait::Wake;

/// Serves one request. Implemented by the FUSE server glue; the device knows nothing of FUSE.
pub trait RequestHandler: Send + Sync + 'static {
    /// Handles the request on `queue` whose device-readable buffers are `readable` and
    /// device-writable buffers are `writable`; returns the number of bytes written (the used
    /// length). Must not block for long: it runs on a poller that serves other queues too.
    fn handle(&self, queue: u16, readable: &[VolatileSlice<'_>], writable: &[VolatileSlice<'_>]) -> u32;

    /// [`Self::handle`], also telling the statistics what the request was ([`Tally`]: its
    /// class, errno and bytes of data). The poller calls this one; the default counts every
    /// request as [`OpClass::Other`], successful.
    fn handle_tallied(
        &self,
        queue: u16,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally) {
        (self.handle(queue, readable, writable), Tally::default())
    }

    /// The asynchronous engine of poller `poller` (for example an io_uring owned by that
    /// poller's core), or `None` to serve every request synchronously through [`Self::handle`].
    /// Called once on the poller's own thread when it starts.
    fn engine(&self, poller: usize) -> Option<Box<dyn Engine>> {
        let _ = poller;
        None
    }

    /// The device was reset (by the driver, by DEVICE_RESET, or because the client went away):
    /// every queue is stopped, no request is in flight and none waits any more. Drop what belonged
    /// to the driver's session and must not outlive the device. Called on the control plane
    /// thread, after every poller has stopped.
    fn reset(&self) {}
}

/// How a request submitted to an [`Engine`] stands when `submit` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Finished: this many bytes were written to the writable buffers.
    Done(u32),
    /// Still running, on the request's buffers: [`Engine::poll`] will report it, in bounded
    /// time (the poller waits for it before memory or queues change).
    Pending,
    /// Waiting on an outside event that may take any time (another request releasing something
    /// it needs). The engine keeps nothing of the request's buffers; it answers it later with
    /// the reply's bytes through [`Engine::poll_waits`], which the poller copies into the
    /// request's writable buffers (at most [`MAX_WAIT_REPLY`] bytes).
    Wait,
}

/// Most reply bytes a waiting request ([`Outcome::Wait`]) can be answered with: the poller keeps
/// where this many bytes at the start of its writable buffers are.
pub const MAX_WAIT_REPLY: usize = 64;
/// Most writable buffers those bytes may be spread over (a reply split finer comes out short).
const WAIT_REPLY_PIECES: usize = 8;

/// A per-poller engine that completes requests asynchronously, polled on the same core (run to
/// completion: no hand-off to another thread).
///
/// A request can be left in two ways:
/// - [`Outcome::Pending`]: the engine works on the request's buffers. The poller guarantees that
///   they stay mapped and untouched by the device until `poll` reports it: it keeps the
///   guest-memory snapshot the request was submitted with, does not complete the descriptor
///   chain, and *drains* the engine (polls until `in_flight() == 0`) before it switches memory
///   snapshots or stops its queues. An engine may therefore hand the buffers' addresses to the
///   kernel (io_uring) and keep them until completion. A drain waits for as long as that takes,
///   so a pending request must finish in bounded time.
/// - [`Outcome::Wait`]: the request waits for an outside event, for as long as that takes (a
///   lock another request holds). The engine must not keep the request's buffers; the poller
///   remembers where the start of its writable buffers is (as guest addresses) and writes the
///   reply that [`Engine::poll_waits`] hands over, through whatever memory snapshot is current
///   then. Waiting requests are not `in_flight`: a drain does not wait for them, and they survive
///   memory changes (DMA_MAP and DMA_UNMAP are never held up by a wait). When the queues stop
///   or restart (device reset, client gone, shutdown) the poller first calls
///   [`Engine::cancel_waits`] and drops every waiting request unanswered: the driver that made
///   them has reset the queues.
pub trait Engine: Send {
    /// Starts the request `id` (opaque to the engine) on `queue`.
    fn submit(
        &mut self,
        id: u64,
        queue: u16,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> Outcome;
    /// Reports finished [`Outcome::Pending`] requests as `(id, bytes written)`; returns how many
    /// it reported.
    fn poll(&mut self, done: &mut dyn FnMut(u64, u32)) -> usize;
    /// [`Self::submit`], also telling the statistics what the request is ([`Tally`]). Its class
    /// counts whatever the outcome; its errno and bytes only for [`Outcome::Done`] (a pending
    /// request's come from [`Self::poll_tallied`], a waiting one's from [`Self::poll_waits_tallied`]).
    /// The poller calls this one; the default counts the request as [`OpClass::Other`].
    fn submit_tallied(
        &mut self,
        id: u64,
        queue: u16,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (Outcome, Tally) {
        (self.submit(id, queue, readable, writable), Tally::default())
    }
    /// [`Self::poll`], with each request's errno and bytes (its class is the one
    /// [`Self::submit_tallied`] gave). The poller calls this one.
    fn poll_tallied(&mut self, done: &mut dyn FnMut(u64, u32, Tally)) -> usize {
        self.poll(&mut |id, len| done(id, len, Tally::default()))
    }
    /// [`Self::poll_waits`], with each answer's errno and bytes (its class is the one
    /// [`Self::submit_tallied`] gave). The poller calls this one.
    fn poll_waits_tallied(&mut self, answer: &mut dyn FnMut(u64, &[u8], Tally)) -> usize {
        self.poll_waits(&mut |id, reply| answer(id, reply, Tally::default()))
    }
    /// [`Outcome::Pending`] requests submitted and not yet reported.
    fn in_flight(&self) -> usize;
    /// Answers [`Outcome::Wait`] requests whose event came, as `(id, reply bytes)`; returns how
    /// many. Called every round while any request waits.
    fn poll_waits(&mut self, answer: &mut dyn FnMut(u64, &[u8])) -> usize {
        let _ = answer;
        0
    }
    /// Forgets every [`Outcome::Wait`] request without answering it; the poller drops them too.
    /// Called before the queues stop or restart.
    fn cancel_waits(&mut self) {}
    /// What an adaptive poller whose only work is this engine's pending requests may block on
    /// instead of polling ([`Readiness`]: a descriptor and a bound), asked each time it would
    /// spin for them; `None` (the default): poll every round.
    fn readiness(&self) -> Option<Readiness<'_>> {
        None
    }
}

/// MSI-X eventfds by vector number, as set by DEVICE_SET_IRQS.
pub type Irqs = Arc<[Option<File>]>;

/// Rounds in a row an adaptive poller polls an engine whose requests are all it has before it
/// blocks on the engine's readiness (each round's look is a system call or so: a few
/// microseconds, less than a remote round trip, enough for replies that stream in at depth).
const ENGINE_SPIN_ROUNDS: u32 = 4;

/// Most requests a poller takes from one queue per round before moving to the next queue.
const ROUND_BUDGET: u16 = 64;

enum Msg {
    Start { queues: Vec<QueueConfig>, features: u64 },
    Stop,
    Memory(Arc<GuestMem>),
    Irqs(Irqs),
    Shutdown,
}

/// What pollers tell the control plane.
#[derive(Debug)]
enum Event {
    Ack { poller: usize, seq: u64 },
    Broken(QueueError),
}

struct PollerThread {
    tx: Sender<(u64, Msg)>,
    join: Option<JoinHandle<()>>,
    wake: Arc<Wake>,
}

impl PollerThread {
    fn wake(&self) {
        if let Some(j) = &self.join {
            self.wake.wake(j.thread());
        }
    }
}

/// The control plane's handle on all pollers of one device.
pub struct PollerSet {
    pollers: Vec<PollerThread>,
    /// Which poller serves which queue (the profile's queue mapping).
    profile: Profile,
    handler: Arc<dyn RequestHandler>,
    events: Receiver<Event>,
    seq: u64,
    broken: Vec<QueueError>,
    stats: Arc<DeviceCounters>,
}

struct Ctx {
    id: usize,
    core: Option<usize>,
    rx: Receiver<(u64, Msg)>,
    events: Sender<Event>,
    wake_control: Arc<dyn Fn() + Send + Sync>,
    handler: Arc<dyn RequestHandler>,
    msix: Arc<MsixShared>,
    /// SIGBUS faults repaired in the device's DMA windows (`memory::sigbus`): when it moves, the
    /// client's memory went away under a request and the queues are broken.
    faults: Arc<AtomicU64>,
    stats: Arc<DeviceCounters>,
    /// The latency clock, if the profile measures latencies.
    clock: Option<LatencyClock>,
    busy: bool,
    spin: Duration,
    sleep: Duration,
    /// Doorbells arrive on the socket (and unpark us): ask for them before parking.
    doorbells: bool,
    /// Our wake-up while we block on the engine's readiness.
    wake: Arc<Wake>,
}

impl PollerSet {
    /// Starts the pollers `profile` asks for. `wake_control` is called after a poller reports a
    /// broken queue, so the control plane can set DEVICE_NEEDS_RESET.
    pub fn spawn(
        profile: &Profile,
        handler: Arc<dyn RequestHandler>,
        msix: Arc<MsixShared>,
        faults: Arc<AtomicU64>,
        wake_control: Arc<dyn Fn() + Send + Sync>,
    ) -> std::io::Result<Self> {
        let (ev_tx, ev_rx) = channel();
        let stats = Arc::new(DeviceCounters::new(profile));
        let cores: Vec<Option<usize>> = if profile.poller_cores.is_empty() {
            vec![None]
        } else {
            profile.poller_cores.iter().map(|&c| Some(c)).collect()
        };
        let mut pollers = Vec::new();
        for (id, core) in cores.into_iter().enumerate() {
            let (tx, rx) = channel();
            let wake = Arc::new(Wake::new()?);
            let ctx = Ctx {
                id,
                core,
                rx,
                events: ev_tx.clone(),
                wake_control: wake_control.clone(),
                handler: handler.clone(),
                msix: msix.clone(),
                faults: faults.clone(),
                stats: stats.clone(),
                clock: stats.clock().cloned(),
                busy: profile.polling == Polling::Busy,
                spin: Duration::from_micros(profile.idle_spin_us),
                sleep: Duration::from_micros(profile.idle_sleep_us),
                doorbells: profile.doorbells_on_socket(),
                wake: wake.clone(),
            };
            let join = std::thread::Builder::new()
                .name(format!("poller-{id}"))
                .stack_size(4 << 20)
                .spawn(move || run(ctx))?;
            pollers.push(PollerThread { tx, join: Some(join), wake });
        }
        Ok(PollerSet {
            pollers,
            profile: profile.clone(),
            handler,
            events: ev_rx,
            seq: 0,
            broken: Vec::new(),
            stats,
        })
    }

    /// The device's counters (read them with [`DeviceCounters::snapshot`]).
    pub fn stats(&self) -> &Arc<DeviceCounters> {
        &self.stats
    }

    /// Sends one message to each poller (built by `make`) and waits until all have applied it.
    fn broadcast(&mut self, mut make: impl FnMut(usize) -> Msg) {
        self.seq += 1;
        let seq = self.seq;
        let mut waiting: Vec<bool> = Vec::with_capacity(self.pollers.len());
        for (i, p) in self.pollers.iter().enumerate() {
            let sent = p.tx.send((seq, make(i))).is_ok();
            p.wake();
            waiting.push(sent);
        }
        let started = Instant::now();
        while waiting.iter().any(|&w| w) {
            match self.events.recv_timeout(Duration::from_secs(1)) {
                Ok(Event::Ack { poller, seq: s }) if s == seq => waiting[poller] = false,
                Ok(Event::Ack { .. }) => {}
                Ok(Event::Broken(e)) => self.broken.push(e),
                Err(RecvTimeoutError::Timeout) => {
                    // A poller that died cannot answer; everything else is only slow.
                    for (i, p) in self.pollers.iter().enumerate() {
                        if waiting[i] && p.join.as_ref().is_none_or(|j| j.is_finished()) {
                            error!("poller {i} has exited; not waiting for it");
                            waiting[i] = false;
                        }
                    }
                    warn!("pollers slow to acknowledge (waiting {:?})", started.elapsed());
                }
                Err(RecvTimeoutError::Disconnected) => {
                    error!("every poller has exited");
                    return;
                }
            }
        }
    }

    /// Starts serving `queues`, each on the poller the profile's queue mapping gives it.
    pub fn start(&mut self, queues: &[QueueConfig], features: u64) {
        let profile = self.profile.clone();
        self.broadcast(|i| Msg::Start {
            queues: queues.iter().filter(|q| profile.poller_of(q.index) == i).copied().collect(),
            features,
        });
    }

    /// Stops serving every queue (device reset); returns once no poller touches a ring, after
    /// telling the handler ([`RequestHandler::reset`]).
    pub fn stop(&mut self) {
        self.broadcast(|_| Msg::Stop);
        self.handler.reset();
    }

    /// Publishes a new guest-memory snapshot; returns once no poller uses the previous one.
    pub fn set_memory(&mut self, mem: &Arc<GuestMem>) {
        self.broadcast(|_| Msg::Memory(mem.clone()));
    }

    /// Publishes new interrupt eventfds.
    pub fn set_irqs(&mut self, irqs: &Irqs) {
        self.broadcast(|_| Msg::Irqs(irqs.clone()));
    }

    /// Wakes the poller that owns `queue` now (a doorbell arrived through the socket).
    pub fn kick(&self, queue: u16) {
        self.stats.doorbell(queue);
        if let Some(p) = self.pollers.get(self.profile.poller_of(queue)) {
            p.wake();
        }
    }

    /// Queues that pollers found corrupt since the last call.
    pub fn take_broken(&mut self) -> Vec<QueueError> {
        while let Ok(ev) = self.events.try_recv() {
            if let Event::Broken(e) = ev {
                self.broken.push(e);
            }
        }
        std::mem::take(&mut self.broken)
    }
}

impl Drop for PollerSet {
    fn drop(&mut self) {
        for p in &self.pollers {
            let _ = p.tx.send((0, Msg::Shutdown));
            p.wake();
        }
        for p in &mut self.pollers {
            if let Some(j) = p.join.take() {
                let _ = j.join();
            }
        }
    }
}

struct Served {
    queue: Ring,
    attached: bool,
    broken: bool,
    /// Index of its counters in the poller's block.
    stat: usize,
    /// Per head (buffer id), the clock reading of the round that took it and its class, for a
    /// request left pending in the engine.
    starts: Box<[(u64, OpClass)]>,
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

/// The queue slots with new used entries in one completion pass.
#[derive(Default)]
struct Touched {
    /// Bitmap of the first 64 slots.
    bits: u64,
    /// Any slot past those.
    overflow: bool,
}

/// A request that waits ([`Outcome::Wait`]).
struct Parked {
    /// Its engine id (queue slot << 16 | head).
    id: u64,
    /// Where its reply goes: guest addresses and lengths of the start of its writable buffers
    /// (addresses stay valid while memory snapshots change).
    reply: heapless::Vec<(u64, u32), WAIT_REPLY_PIECES>,
    /// The reply, once the engine gave it, while the request's queue cannot take it (its ring
    /// is not mapped at the moment).
    answer: Option<heapless::Vec<u8, MAX_WAIT_REPLY>>,
    /// Clock reading of the round that took it (0 without latency measurement).
    started: u64,
    /// Its class.
    class: OpClass,
    /// What the engine said of `answer`.
    tally: Tally,
}

/// Guest addresses of the first [`MAX_WAIT_REPLY`] bytes of `bufs`, which lie in `mem`.
fn guest_ranges(mem: &GuestMem, bufs: &[VolatileSlice<'_>]) -> heapless::Vec<(u64, u32), WAIT_REPLY_PIECES> {
    let mut out = heapless::Vec::new();
    let mut left = MAX_WAIT_REPLY;
    for b in bufs {
        if left == 0 {
            break;
        }
        let host = b.ptr_guard().as_ptr() as usize;
        let gpa = mem.iter().find_map(|r| {
            let base = r.get_host_address(MemoryRegionAddress(0)).ok()? as usize;
            let off = host.checked_sub(base)?;
            (off < r.len() as usize).then(|| r.start_addr().0 + off as u64)
        });
        let Some(gpa) = gpa else { break };
        let n = b.len().min(left);
        if out.push((gpa, n as u32)).is_err() {
            break;
        }
        left -= n;
    }
    out
}

/// Writes `bytes` to the guest ranges `to`; returns how many bytes went in.
fn write_reply(mem: &GuestMem, to: &[(u64, u32)], bytes: &[u8]) -> u32 {
    let mut at = 0;
    for &(gpa, len) in to {
        if at == bytes.len() {
            break;
        }
        let n = (len as usize).min(bytes.len() - at);
        if mem.write_slice(&bytes[at..at + n], GuestAddress(gpa)).is_err() {
            break;
        }
        at += n;
    }
    at as u32
}

/// Turns driver notifications on or off on every live queue.
fn notify(queues: &mut [Served], mem: &GuestMem, on: bool) {
    for q in queues.iter_mut().filter(|q| q.attached && !q.broken) {
        if let Err(e) = q.queue.set_notify(mem, on) {
            debug!("queue {}: {e}", q.queue.index());
        }
    }
}

/// Whether any live queue has a request (or cannot tell).
fn has_work(queues: &[Served], mem: &GuestMem) -> bool {
    queues.iter().filter(|q| q.attached && !q.broken).any(|q| q.queue.has_work(mem).unwrap_or(true))
}

fn run(ctx: Ctx) {
    if let Some(core) = ctx.core {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
            warn!("poller {}: cannot pin to core {core}", ctx.id);
        }
    }
    let mut mem: Arc<GuestMem> = Arc::new(GuestMem::default());
    let mut irqs: Irqs = Arc::from(Vec::new());
    let mut queues: Vec<Served> = Vec::new();
    let mut parked: Vec<Parked> = Vec::new();
    let mut engine = ctx.handler.engine(ctx.id);
    let mut idle_rounds = 0u64;
    let mut idle_since = Instant::now();
    let mine = ctx.stats.poller(ctx.id);
    let mut clock = Clock::new();
    let mut faults_seen = ctx.faults.load(Ordering::Acquire);
    // A message the last look before blocking on the engine found (handled first).
    let mut stashed: Option<(u64, Msg)> = None;
    // Rounds in a row with nothing but engine requests in flight.
    let mut engine_idle = 0u32;
    // One buffer list per memory snapshot (it borrows the snapshot): building it costs a 24 KiB
    // memset, 18 % of the poller's instructions at QD=1, idle spinning included (callgrind).
    'snapshot: loop {
        let snapshot = mem.clone();
        let mut chain = Chain::default();
        loop {
            while let Some((seq, msg)) = stashed.take().or_else(|| ctx.rx.try_recv().ok()) {
                // Waiting requests go with their queues (the driver reset them); they survive a
                // memory change, holding only guest addresses.
                if matches!(msg, Msg::Start { .. } | Msg::Stop | Msg::Shutdown) {
                    if let Some(e) = engine.as_mut() {
                        e.cancel_waits();
                    }
                    if !parked.is_empty() {
                        debug!(
                            "poller {}: dropping {} waiting requests with their queues",
                            ctx.id,
                            parked.len()
                        );
                    }
                    parked.clear();
                    for q in &queues {
                        if let Some(c) = ctx.counters(q.stat) {
                            c.waiting.store(0, Ordering::Relaxed);
                        }
                    }
                }
                // Nothing may still use the rings or the memory when they change.
                if matches!(msg, Msg::Start { .. } | Msg::Stop | Msg::Memory(_) | Msg::Shutdown) {
                    ctx.drain(&mut engine, &mut queues, &mem, &mut parked);
                }
                match msg {
                    Msg::Start { queues: cfgs, features: f } => {
                        faults_seen = ctx.faults.load(Ordering::Acquire);
                        queues = cfgs.into_iter().filter_map(|c| ctx.new_queue(c, f)).collect();
                        for q in &mut queues {
                            ctx.attach(q, &mem);
                        }
                    }
                    Msg::Stop => queues.clear(),
                    Msg::Memory(m) => {
                        mem = m;
                        for q in queues.iter_mut().filter(|q| !q.attached) {
                            ctx.attach(q, &mem);
                        }
                    }
                    Msg::Irqs(i) => irqs = i,
                    Msg::Shutdown => {
                        clock.close(coarse_now_ns(), false, mine);
                        return;
                    }
                }
                let _ = ctx.events.send(Event::Ack { poller: ctx.id, seq });
            }
            if !Arc::ptr_eq(&mem, &snapshot) {
                continue 'snapshot;
            }
            clock.start_round();
            let mut work = 0usize;
            for (slot, q) in queues.iter_mut().enumerate() {
                if !q.attached || q.broken {
                    continue;
                }
                match ctx.serve(slot, q, &snapshot, &mut chain, &mut engine, &mut parked) {
                    Ok(n) => work += n,
                    Err(QueueError::RingUnmapped(i)) => {
                        // Guest memory is being remapped under a live queue; wait for the new map.
                        debug!("queue {i}: ring not mapped, waiting for DMA_MAP");
                        q.attached = false;
                    }
                    Err(e) => {
                        q.broken = true;
                        ctx.report(e);
                    }
                }
            }
            if let Some(e) = engine.as_mut() {
                work += ctx.complete(e.as_mut(), &mut queues, &mem, &mut parked);
            }
            let faults = ctx.faults.load(Ordering::Relaxed);
            if faults != faults_seen {
                // Client memory went away under this round: what it read or wrote there was
                // zeros or lost. No queue goes on; the driver must reset the device.
                faults_seen = faults;
                for q in queues.iter_mut().filter(|q| !q.broken) {
                    q.broken = true;
                    ctx.report(QueueError::MemoryLost(q.queue.index()));
                }
            }
            for q in queues.iter_mut().filter(|q| q.attached && !q.broken) {
                if q.queue.needs_interrupt(&mem) {
                    ctx.signal(&irqs, q.queue.vector(), q.queue.index(), q.stat);
                }
            }
            let waiting = engine.as_ref().is_some_and(|e| e.in_flight() > 0);
            // Adaptive, and nothing but engine requests to wait for for a few rounds (replies
            // that stream in at depth come within them): block on the engine.
            engine_idle = if waiting && work == 0 { engine_idle + 1 } else { 0 };
            let ready = match &engine {
                Some(e) if engine_idle > ENGINE_SPIN_ROUNDS && !ctx.busy && !queues.is_empty() => {
                    e.readiness()
                }
                _ => None,
            };
            let busy = work > 0 || (waiting && ready.is_none());
            clock.end_round(busy, mine);
            if let Some(r) = ready {
                stashed = ctx.wait_engine(&mut queues, &mem, &r, !parked.is_empty());
                clock.close(coarse_now_ns(), false, mine);
            } else if busy {
                if work > 0 {
                    idle_rounds = 0;
                }
            } else if queues.is_empty() {
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
                    ctx.park(&mut queues, &mem, !parked.is_empty()); // still idle next time: park again soon
                    clock.close(coarse_now_ns(), false, mine);
                }
                std::hint::spin_loop();
            }
        }
    }
}

impl Ctx {
    fn new_queue(&self, cfg: QueueConfig, f: u64) -> Option<Served> {
        match Ring::new(cfg, f) {
            Ok(queue) => {
                let stat = match self.stats.place(cfg.index) {
                    Some((p, local)) if p == self.id => local,
                    _ => usize::MAX, // not a queue of ours by the profile: not counted
                };
                let starts = vec![(0, OpClass::Other); usize::from(cfg.size)].into_boxed_slice();
                Some(Served { queue, attached: false, broken: false, stat, starts })
            }
            Err(e) => {
                self.report(e);
                None
            }
        }
    }

    /// The counters of this poller's `stat`-th queue.
    #[inline]
    fn counters(&self, stat: usize) -> Option<&QueueCounters> {
        self.stats.poller(self.id).queue(stat)
    }

    fn attach(&self, q: &mut Served, mem: &GuestMem) {
        match q.queue.attach(mem) {
            Ok(()) => q.attached = true,
            Err(QueueError::RingUnmapped(i)) => debug!("queue {i}: rings not mapped yet"),
            Err(e) => {
                q.broken = true;
                self.report(e);
            }
        }
    }

    /// Parks for up to `sleep`. With doorbells on the socket, first asks the driver of every live
    /// queue to ring after its next request and looks at the rings once more (the driver stores
    /// its avail index, fences, then reads our suppression fields; we store those, fence, then
    /// read the avail index: one of us sees the other), so a request made at any moment either
    /// is seen here or rings the doorbell that unparks us. Notifications are off again before
    /// polling resumes.
    ///
    /// With requests waiting on an outside event (`waits`) the sleep is at most 1 ms: the event
    /// (a lock released through another poller) rings no doorbell here.
    fn park(&self, queues: &mut [Served], mem: &GuestMem, waits: bool) {
        let sleep = if waits { self.sleep.min(Duration::from_millis(1)) } else { self.sleep };
        let parks = &self.stats.poller(self.id).parks;
        if !self.doorbells {
            add(parks, 1);
            std::thread::park_timeout(sleep);
            return;
        }
        notify(queues, mem, true);
        fence(Ordering::SeqCst);
        if !has_work(queues, mem) {
            add(parks, 1);
            std::thread::park_timeout(sleep);
        }
        notify(queues, mem, false);
    }

    /// Blocks on the engine's readiness `r` and our wake-up (see `wait.rs`), with the same
    /// doorbell protocol as [`Self::park`]: notifications on, then one more look at the rings
    /// (and the messages: one found is returned, to be handled first) before blocking. The wait
    /// is bounded by the engine's `within` and `idle_sleep_us` (1 ms at most with requests
    /// waiting on an outside event).
    fn wait_engine(
        &self,
        queues: &mut [Served],
        mem: &GuestMem,
        r: &Readiness<'_>,
        waits: bool,
    ) -> Option<(u64, Msg)> {
        let mut sleep = r.within.min(self.sleep);
        if waits {
            sleep = sleep.min(Duration::from_millis(1));
        }
        self.wake.arm();
        if self.doorbells {
            notify(queues, mem, true);
        }
        fence(Ordering::SeqCst);
        let msg = self.rx.try_recv().ok();
        if msg.is_none() && !has_work(queues, mem) {
            add(&self.stats.poller(self.id).engine_waits, 1);
            self.wake.wait(r, sleep);
        } else {
            self.wake.disarm();
        }
        if self.doorbells {
            notify(queues, mem, false);
        }
        msg
    }

    fn report(&self, e: QueueError) {
        error!("poller {}: {e}; device needs reset", self.id);
        let _ = self.events.send(Event::Broken(e));
        (self.wake_control)();
    }

    fn serve<'m>(
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
        while taken < usize::from(ROUND_BUDGET) {
            let Some(valid) = q.next(mem, chain)? else { break };
            taken += 1;
            let token = chain.head;
            let len = match valid {
                Ok(()) => {
                    let room: usize = chain.writable.iter().map(|s| s.len()).sum();
                    let room = u32::try_from(room).unwrap_or(u32::MAX);
                    // A bug in a handler must cost one request, not the poller (and with it the
                    // device): a panic fails the request like a malformed chain.
                    let call = std::panic::catch_unwind(AssertUnwindSafe(|| match engine {
                        Some(e) => {
                            let id = ((slot as u64) << 16) | u64::from(token);
                            e.submit_tallied(id, q.index(), &chain.readable, &chain.writable)
                        }
                        None => {
                            let (len, tally) =
                                self.handler.handle_tallied(q.index(), &chain.readable, &chain.writable);
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
            q.push_used(mem, token, len)?;
            completed += 1;
        }
        if completed > 0 {
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
    fn complete(
        &self,
        engine: &mut dyn Engine,
        queues: &mut [Served],
        mem: &GuestMem,
        parked: &mut Vec<Parked>,
    ) -> usize {
        let mut touched = Touched::default();
        // Read once, at the first completion of this pass.
        let mut now = None;
        let mut n = engine.poll_tallied(&mut |id, len, tally| {
            self.finish(queues, mem, id, len, None, tally, &mut now, &mut touched);
        });
        if !parked.is_empty() {
            n += engine.poll_waits_tallied(&mut |id, reply, tally| {
                let Some(i) = parked.iter().position(|p| p.id == id) else { return };
                let open = queues.get((id >> 16) as usize).is_some_and(|q| q.attached && !q.broken);
                if open {
                    let p = parked.swap_remove(i);
                    let len = write_reply(mem, &p.reply, reply);
                    let tally = Tally { class: p.class, ..tally };
                    self.finish(queues, mem, id, len, Some(p.started), tally, &mut now, &mut touched);
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
                        self.finish(queues, mem, p.id, len, Some(p.started), p.tally, &mut now, &mut touched);
                        n += 1;
                    }
                    _ => i += 1,
                }
            }
        }
        if touched.bits == 0 && !touched.overflow {
            return n; // the common round: the engine finished nothing
        }
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
        touched: &mut Touched,
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
        if slot < 64 {
            touched.bits |= 1 << slot;
        } else {
            touched.overflow = true;
        }
    }

    /// Waits for every in-flight engine request (completing them) before rings or memory change.
    /// Waiting requests ([`Outcome::Wait`]) are not waited for.
    fn drain(
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

    fn signal(&self, irqs: &Irqs, vector: u16, queue: u16, stat: usize) {
        if vector == NO_VECTOR {
            return;
        }
        let v = usize::from(vector);
        if self.msix.deliverable_or_pend(v) {
            if let Some(Some(fd)) = irqs.get(v) {
                // A full counter (the driver has not read it for 2^64-2 interrupts) is an
                // interrupt already pending: never wait for it.
                if let Err(e) = crate::control::signal_eventfd(fd) {
                    warn!("queue {queue}: interrupt on vector {v} failed: {e}");
                }
                if let Some(c) = self.counters(stat) {
                    add(&c.interrupts, 1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
