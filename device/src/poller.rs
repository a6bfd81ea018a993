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
//! REGION_WRITE to the notify area) wakes it: directly, as a sleeping poller also waits on the
//! client's socket ([`PollerSet::set_doorbell_source`]), or through the control plane's
//! [`PollerSet::kick`] once that thread has read the message; with `"shared"` the notify page is plain shared memory nobody reads and a parked poller
//! wakes at the end of its sleep. Any control message wakes it at once.
//!
//! Statistics: each poller writes its own block of [`crate::stats::DeviceCounters`] (see there).
//!
//! A handler may give each poller an [`Engine`] (an io_uring, say): requests it cannot finish at
//! once stay pending and are completed, out of order, from the same poller's later rounds.
//! Requests that wait on an outside event (one another request ends) are kept apart: see
//! [`Outcome::Wait`].
//!
//! The poller threads are a [`PollerPool`], which several functions (devices) of one daemon may
//! share: each function attaches a [`PollerSet`] to it, and each poller keeps that function's
//! queues, memory snapshot, eventfds, engine and waiting requests apart from the others'. A
//! function's messages touch only its own part of a poller; one that must wait for the
//! function's engine to drain is held while the poller goes on serving the other functions.
//!
//! The control plane talks to pollers only by messages ([`PollerSet`]): start/stop queues, a new
//! guest-memory snapshot, new interrupt eventfds. Every message is acknowledged after the poller
//! applied it *between* two requests, so once all pollers acknowledged a new memory snapshot no
//! request can still be using the old one: that is when DMA_UNMAP may be answered.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, error, warn};
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress, VolatileSlice,
};

use crate::config::{Placement, Polling, Profile, QueueMapping};
use crate::memory::GuestMem;
use crate::pci::msix::MsixShared;
use crate::pci::{QueueConfig, NO_VECTOR};
use crate::stats::{
    add, coarse_now_ns, sub_one, DeviceCounters, LatencyClock, OpClass, PollerCounters, QueueCounters, Tally,
};
use crate::virtq::{Chain, QueueError, Ring};

mod wait;
pub use wait::Readiness;
use wait::{Wake, MAX_POLL_FDS};

/// Serves one request. Implemented by the FUSE server glue; the device knows nothing of FUSE.
pub trait RequestHandler: Send + Sync + 'static {
    /// Handles the request on `queue` whose device-readable buffers are `readable` and
    /// device-writable buffers are `writable`; returns the number of bytes written (the used
    /// length) and what the request was for the statistics ([`Tally`]: its class, errno and
    /// bytes of data; `Tally::default()` counts it as [`OpClass::Other`], successful). Must not
    /// block for long: it runs on a poller that serves other queues too.
    fn handle(
        &self,
        queue: u16,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally);

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
    /// Starts the request `id` (opaque to the engine) on `queue`, and tells the statistics what
    /// it is ([`Tally`]). Its class counts whatever the outcome; its errno and bytes only for
    /// [`Outcome::Done`] (a pending request's come from [`Self::poll`], a waiting one's from
    /// [`Self::poll_waits`]).
    fn submit(
        &mut self,
        id: u64,
        queue: u16,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (Outcome, Tally);
    /// Reports finished [`Outcome::Pending`] requests as `(id, bytes written, tally)` (the
    /// tally's errno and bytes; its class is the one [`Self::submit`] gave); returns how many
    /// it reported.
    fn poll(&mut self, done: &mut dyn FnMut(u64, u32, Tally)) -> usize;
    /// [`Outcome::Pending`] requests submitted and not yet reported.
    fn in_flight(&self) -> usize;

    /// What an adaptive poller whose only work is pending requests (of this engine and of the
    /// other functions' on the same poller) may block on instead of polling ([`Readiness`]: a
    /// descriptor and a bound), asked each time it would spin for them; `None` (the default):
    /// poll every round.
    fn readiness(&self) -> Option<Readiness<'_>> {
        None
    }
    /// Answers [`Outcome::Wait`] requests whose event came, as `(id, reply bytes, tally)` (its
    /// errno and bytes; the class is the one [`Self::submit`] gave); returns how many. Called
    /// every round while any request waits.
    fn poll_waits(&mut self, answer: &mut dyn FnMut(u64, &[u8], Tally)) -> usize {
        let _ = answer;
        0
    }
    /// Forgets every [`Outcome::Wait`] request without answering it; the poller drops them too.
    /// Called before the queues stop or restart.
    fn cancel_waits(&mut self) {}
}

/// MSI-X eventfds by vector number, as set by DEVICE_SET_IRQS.
pub type Irqs = Arc<[Option<File>]>;

/// Most requests a poller takes from one queue per round before moving to the next queue.
const ROUND_BUDGET: u16 = 64;
/// Rounds in a row an adaptive poller polls engines whose requests are all it has before it
/// blocks on their readiness (each round's look is a system call or so: a few microseconds,
/// less than a remote round trip, enough for replies that stream in at depth).
const ENGINE_SPIN_ROUNDS: u32 = 4;
/// Most engines a poller blocks on at once; with more of them busy it polls.
const MAX_WAIT_FDS: usize = 32;
/// A control message for one function's part of a poller.
enum Msg {
    Start {
        queues: Vec<QueueConfig>,
        features: u64,
    },
    Stop,
    Memory(Arc<GuestMem>),
    Irqs(Irqs),
    /// The function joins this poller (its engine is made on the poller's thread).
    Attach(Box<FnCtx>),
    /// The function leaves this poller: its queues stop, its waits are dropped, its engine
    /// drains and ends.
    Detach,
    /// The function's doorbell source (readable when its client sent something), or none: a
    /// sleeping poller waits on it too (`wait.rs`).
    DoorbellSource(Option<Arc<OwnedFd>>),
}

/// What goes to a poller: one function's message, or the end of the pool.
enum Post {
    To { fid: u64, seq: u64, msg: Msg },
    Shutdown,
}

/// What pollers tell a function's control plane.
#[derive(Debug)]
enum Event {
    Ack { poller: usize, seq: u64 },
    Broken(QueueError),
}

/// The poller threads of a daemon, shared by every function attached to them ([`PollerSet`]).
///
/// Each poller serves the queues of several functions, each with its own memory snapshot,
/// interrupts, engine and counters; a function's messages (start, stop, memory, interrupts)
/// touch only that function's part of the poller. Cloning shares the pool; the threads end
/// when the last clone, and every [`PollerSet`] on it, is gone.
#[derive(Clone)]
pub struct PollerPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    txs: Vec<Sender<Post>>,
    threads: Vec<std::thread::Thread>,
    /// Each thread's wake-up while it blocks on its engines (see `wait.rs`): every unpark of a
    /// poller goes through [`PoolInner::wake`].
    wakes: Vec<Arc<Wake>>,
    joins: Vec<JoinHandle<()>>,
    /// Set by each poller thread as it exits (normally or by a panic).
    exited: Arc<[AtomicBool]>,
    /// The threads' own counters (busy and idle time, rounds, parks).
    stats: Arc<DeviceCounters>,
    next_fid: AtomicU64,
    profile: Profile,
}

struct ExitFlag(Arc<[AtomicBool]>, usize);

impl Drop for ExitFlag {
    fn drop(&mut self) {
        self.0[self.1].store(true, Ordering::Release);
    }
}

impl PollerPool {
    /// Starts the pollers `profile` asks for (`poller_cores`, polling mode, idle spin and sleep);
    /// no function is attached yet.
    pub fn spawn(profile: &Profile) -> std::io::Result<Self> {
        let cores = crate::config::cores_of(profile);
        let stats = Arc::new(DeviceCounters::pool(profile));
        let exited: Arc<[AtomicBool]> = cores.iter().map(|_| AtomicBool::new(false)).collect();
        let (mut txs, mut threads, mut joins, mut wakes) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (id, core) in cores.into_iter().enumerate() {
            let (tx, rx) = channel();
            let wake = Arc::new(Wake::new()?);
            let ctx = Ctx {
                id,
                core,
                rx,
                stats: stats.clone(),
                exited: exited.clone(),
                busy: profile.polling == Polling::Busy,
                spin: Duration::from_micros(profile.idle_spin_us),
                sleep: Duration::from_micros(profile.idle_sleep_us),
                wake: wake.clone(),
            };
            let join = std::thread::Builder::new()
                .name(format!("poller-{id}"))
                .stack_size(4 << 20)
                .spawn(move || run(ctx))?;
            txs.push(tx);
            threads.push(join.thread().clone());
            joins.push(join);
            wakes.push(wake);
        }
        let inner = PoolInner {
            txs,
            threads,
            wakes,
            joins,
            exited,
            stats,
            next_fid: AtomicU64::new(0),
            profile: profile.clone(),
        };
        Ok(PollerPool { inner: Arc::new(inner) })
    }

    /// Number of pollers.
    pub fn pollers(&self) -> usize {
        self.inner.txs.len()
    }

    /// The profile the pool was started with.
    pub fn profile(&self) -> &Profile {
        &self.inner.profile
    }

    /// The poller threads' own counters (time, rounds, parks).
    pub fn stats(&self) -> &Arc<DeviceCounters> {
        &self.inner.stats
    }

    /// The placement of the `ordinal`-th function of this pool: queues spread over every poller
    /// (or over `pollers`, indices into the pool, when given), rotated by the ordinal.
    pub fn placement(&self, mapping: QueueMapping, pollers: Option<&[usize]>, ordinal: usize) -> Placement {
        let n = self.pollers();
        let mut chosen: Vec<usize> = match pollers {
            Some(p) if !p.is_empty() => p.iter().copied().filter(|&i| i < n).collect(),
            _ => (0..n).collect(),
        };
        chosen.sort_unstable();
        chosen.dedup();
        if chosen.is_empty() {
            chosen.push(0);
        }
        let offset = ordinal % chosen.len();
        Placement {
            pollers: chosen,
            pool_pollers: n,
            cores: crate::config::cores_of(&self.inner.profile),
            mapping,
            offset,
        }
    }
}

impl PoolInner {
    /// Wakes poller `p`, parked or blocked on its engines.
    fn wake(&self, p: usize) {
        if let (Some(w), Some(t)) = (self.wakes.get(p), self.threads.get(p)) {
            w.wake(t);
        }
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        for (p, tx) in self.txs.iter().enumerate() {
            let _ = tx.send(Post::Shutdown);
            self.wake(p);
        }
        for j in self.joins.drain(..) {
            let _ = j.join();
        }
    }
}

/// One function's handle on the pollers that serve its queues (a pool of its own with
/// [`PollerSet::spawn`], a shared one with [`PollerSet::attach`]).
pub struct PollerSet {
    pool: PollerPool,
    fid: u64,
    /// Which pool poller serves which queue.
    placement: Placement,
    /// The pool pollers this function is attached to (those serving at least one of its queues).
    used: Vec<usize>,
    handler: Arc<dyn RequestHandler>,
    events: Receiver<Event>,
    seq: u64,
    broken: Vec<QueueError>,
    stats: Arc<DeviceCounters>,
}

/// A function's part of a poller: what its messages carry and its requests are served with.
struct FnCtx {
    /// The poller's id.
    id: usize,
    events: Sender<Event>,
    wake_control: Arc<dyn Fn() + Send + Sync>,
    handler: Arc<dyn RequestHandler>,
    msix: Arc<MsixShared>,
    /// SIGBUS faults repaired in the function's DMA windows (`memory::sigbus`): when it moves,
    /// the client's memory went away under a request and the queues are broken.
    faults: Arc<AtomicU64>,
    stats: Arc<DeviceCounters>,
    /// The latency clock, if the profile measures latencies.
    clock: Option<LatencyClock>,
    /// Doorbells arrive on the socket (and unpark us): ask for them before parking.
    doorbells: bool,
}

/// A poller thread's own context.
struct Ctx {
    id: usize,
    core: Option<usize>,
    rx: Receiver<Post>,
    /// The pool's counters: this thread's time, rounds and parks.
    stats: Arc<DeviceCounters>,
    exited: Arc<[AtomicBool]>,
    busy: bool,
    spin: Duration,
    sleep: Duration,
    /// Our wake-up while we block on our engines' readiness.
    wake: Arc<Wake>,
}

impl PollerSet {
    /// Starts the pollers `profile` asks for, serving one function: requests to `handler`,
    /// interrupts through `msix`. `wake_control` is called after a poller reports a broken
    /// queue, so the control plane can set DEVICE_NEEDS_RESET.
    pub fn spawn(
        profile: &Profile,
        handler: Arc<dyn RequestHandler>,
        msix: Arc<MsixShared>,
        faults: Arc<AtomicU64>,
        wake_control: Arc<dyn Fn() + Send + Sync>,
    ) -> std::io::Result<Self> {
        let pool = PollerPool::spawn(profile)?;
        Ok(Self::attach(&pool, profile, Placement::of_profile(profile), handler, msix, faults, wake_control))
    }

    /// Attaches a function shaped by `profile` to the pollers of `pool`, its queues placed as
    /// `placement` says; returns once every poller concerned has taken it.
    pub fn attach(
        pool: &PollerPool,
        profile: &Profile,
        placement: Placement,
        handler: Arc<dyn RequestHandler>,
        msix: Arc<MsixShared>,
        faults: Arc<AtomicU64>,
        wake_control: Arc<dyn Fn() + Send + Sync>,
    ) -> Self {
        let (ev_tx, ev_rx) = channel();
        let stats = Arc::new(DeviceCounters::placed(profile, &placement, Some(pool.stats().clone())));
        let mut used: Vec<usize> = (0..=profile.request_queues).map(|q| placement.poller_of(q)).collect();
        used.sort_unstable();
        used.dedup();
        used.retain(|&p| p < pool.pollers());
        let fid = pool.inner.next_fid.fetch_add(1, Ordering::Relaxed);
        let mut set = PollerSet {
            pool: pool.clone(),
            fid,
            placement,
            used,
            handler: handler.clone(),
            events: ev_rx,
            seq: 0,
            broken: Vec::new(),
            stats: stats.clone(),
        };
        let doorbells = profile.doorbells_on_socket();
        set.broadcast(|id| {
            Msg::Attach(Box::new(FnCtx {
                id,
                events: ev_tx.clone(),
                wake_control: wake_control.clone(),
                handler: handler.clone(),
                msix: msix.clone(),
                faults: faults.clone(),
                stats: stats.clone(),
                clock: stats.clock().cloned(),
                doorbells,
            }))
        });
        set
    }

    /// The device's counters (read them with [`DeviceCounters::snapshot`]).
    pub fn stats(&self) -> &Arc<DeviceCounters> {
        &self.stats
    }

    /// Which pool poller serves which queue.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Sends one message to each poller of this function (built by `make`) and waits until all
    /// have applied it.
    fn broadcast(&mut self, mut make: impl FnMut(usize) -> Msg) {
        self.seq += 1;
        let seq = self.seq;
        let pool = &self.pool.inner;
        let mut waiting: Vec<bool> = vec![false; pool.txs.len()];
        for &p in &self.used {
            let sent = pool.txs[p].send(Post::To { fid: self.fid, seq, msg: make(p) }).is_ok();
            pool.wake(p);
            waiting[p] = sent;
        }
        let started = Instant::now();
        while waiting.iter().any(|&w| w) {
            match self.events.recv_timeout(Duration::from_secs(1)) {
                Ok(Event::Ack { poller, seq: s }) if s == seq => waiting[poller] = false,
                Ok(Event::Ack { .. }) => {}
                Ok(Event::Broken(e)) => self.broken.push(e),
                Err(RecvTimeoutError::Timeout) => {
                    // A poller that died cannot answer; everything else is only slow.
                    for (i, w) in waiting.iter_mut().enumerate() {
                        if *w && pool.exited[i].load(Ordering::Acquire) {
                            error!("poller {i} has exited; not waiting for it");
                            *w = false;
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

    /// Starts serving `queues`, each on the poller the placement gives it.
    pub fn start(&mut self, queues: &[QueueConfig], features: u64) {
        let placement = self.placement.clone();
        self.broadcast(|i| Msg::Start {
            queues: queues.iter().filter(|q| placement.poller_of(q.index) == i).copied().collect(),
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

    /// Gives the pollers the function's doorbell source: a descriptor that turns readable when
    /// a doorbell may have arrived (with doorbells through the transport, the client's
    /// connection), or takes it back (`None`). A sleeping poller waits on it as well as on its
    /// wake-up, so a doorbell wakes it without a second thread in between; the pollers only poll
    /// it, never read it. Whoever owns the connection must shut it down when it ends, as the
    /// pollers' copy keeps it open until they have applied `None`.
    pub fn set_doorbell_source(&mut self, fd: Option<OwnedFd>) {
        let fd = fd.map(Arc::new);
        self.broadcast(|_| Msg::DoorbellSource(fd.clone()));
    }

    /// Wakes the poller that owns `queue` now (a doorbell arrived through the socket).
    pub fn kick(&self, queue: u16) {
        self.stats.doorbell(queue);
        self.pool.inner.wake(self.placement.poller_of(queue));
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
    /// The function leaves its pollers (queues stopped, engines drained and dropped); a pool of
    /// its own then ends with it.
    fn drop(&mut self) {
        self.broadcast(|_| Msg::Detach);
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

/// A function's part of one poller: its queues there, the memory snapshot and interrupts they
/// are served with, its engine and its waiting requests.
struct Attached {
    fid: u64,
    f: Box<FnCtx>,
    mem: Arc<GuestMem>,
    irqs: Irqs,
    queues: Vec<Served>,
    parked: Vec<Parked>,
    engine: Option<Box<dyn Engine>>,
    faults_seen: u64,
    /// Messages held until the engine has drained, in arrival order; while any is held the
    /// function's queues give no new requests (its pending ones complete), and the poller goes
    /// on serving the other functions.
    deferred: VecDeque<(u64, Msg)>,
    /// Detached: the sequence number to acknowledge once its engine is gone.
    detached: Option<u64>,
    /// Rounds in a row this function had nothing to do (no request, nothing pending).
    quiet: u32,
    /// Its doorbell source ([`Msg::DoorbellSource`]).
    source: Option<Arc<OwnedFd>>,
}

/// Rounds without work after which a function of a shared poller turns cold.
const QUIET_ROUNDS: u32 = 1 << 16;
/// A cold function is looked at every this many rounds (its queues, engine, faults): on a poller
/// with many idle functions a round costs the busy ones a sixteenth of the idle ones' checks
/// (each an avail-index load from that function's memory), and an idle function's first request
/// waits at most this many (then short) rounds; any request or pending work makes it hot again.
const COLD_STRIDE: u64 = 16;

impl Attached {
    fn in_flight(&self) -> usize {
        self.engine.as_ref().map_or(0, |e| e.in_flight())
    }

    /// Drops the waiting requests (their queues are going away).
    fn cancel_waits(&mut self) {
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
    fn take(&mut self, seq: u64, msg: Msg) -> bool {
        // Waiting requests go with their queues (the driver reset them); they survive a memory
        // change, holding only guest addresses.
        if matches!(msg, Msg::Start { .. } | Msg::Stop | Msg::Detach) {
            self.cancel_waits();
        }
        let drains = matches!(msg, Msg::Start { .. } | Msg::Stop | Msg::Memory(_) | Msg::Detach);
        if !self.deferred.is_empty() || (drains && self.in_flight() > 0) {
            self.deferred.push_back((seq, msg));
            return false;
        }
        self.apply(seq, msg)
    }

    /// Applies the held messages once the engine has drained.
    fn take_deferred(&mut self) -> bool {
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
            Msg::Start { queues: cfgs, features: f } => {
                self.faults_seen = self.f.faults.load(Ordering::Acquire);
                self.queues = cfgs.into_iter().filter_map(|c| self.f.new_queue(c, f)).collect();
                for q in &mut self.queues {
                    self.f.attach(q, &self.mem);
                }
            }
            Msg::Stop => self.queues.clear(),
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

    /// One poll round of this function's queues on memory `snapshot` (the function's current
    /// one); returns the work done.
    fn round<'m>(&mut self, snapshot: &'m GuestMem, chain: &mut Chain<'m>) -> usize {
        let mut work = 0usize;
        let f = &self.f;
        if self.deferred.is_empty() {
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
        if let Some(e) = self.engine.as_mut() {
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
                f.signal(&self.irqs, q.queue.vector(), q.queue.index(), q.stat);
            }
        }
        work
    }
}

fn run(ctx: Ctx) {
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

impl FnCtx {
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
                            e.submit(id, q.index(), &chain.readable, &chain.writable)
                        }
                        None => {
                            let (len, tally) =
                                self.handler.handle(q.index(), &chain.readable, &chain.writable);
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
        let mut n = engine.poll(&mut |id, len, tally| {
            self.finish(queues, mem, id, len, None, tally, &mut now, &mut touched);
        });
        if !parked.is_empty() {
            n += engine.poll_waits(&mut |id, reply, tally| {
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
