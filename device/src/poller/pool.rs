//! The poller threads and one function's handle on them: the [`PollerPool`] (threads spawned
//! from a profile, shared by the functions of a daemon; the placement of each function's
//! queues) and the [`PollerSet`] a function attaches to it, through which its control plane
//! sends messages and waits for their acknowledgement.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{error, warn};

use super::engine::RequestHandler;
use super::msg::{Event, FnCtx, Msg, Post};
use super::parked::QueueState;
use super::serve::{run, Ctx};
use super::wait::Wake;
use crate::config::{Placement, Polling, Profile, QueueMapping};
use crate::interrupt::Irqs;
use crate::memory::GuestMem;
use crate::pci::msix::MsixShared;
use crate::pci::QueueConfig;
use crate::stats::DeviceCounters;
use crate::virtq::track::TrackArea;
use crate::virtq::QueueError;

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

/// One function's handle on the pollers of a pool that serve its queues
/// ([`PollerSet::attach`]; a function alone attaches to a pool of its own).
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
    /// A broadcast went unacknowledged past [`BROADCAST_BOUND`]: the function is failed.
    stuck: bool,
    /// The queue states the pollers reported to [`Msg::Freeze`].
    frozen: Vec<(u16, Option<QueueState>)>,
}

/// Why a function could not be brought to its quiet point ([`PollerSet::freeze`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FreezeError {
    /// A request of this queue is out and cannot be handed over (its engine does not name it).
    #[error("queue {0} has a request out that cannot be handed over: not at a quiet point")]
    NotQuiet(u16),
    /// A poller did not take the message within its bound: the function is failed.
    #[error("a poller did not answer within its bound")]
    Unresponsive,
}

/// How long a function waits for its pollers to take a message before it gives up on them and
/// is failed (DEVICE_NEEDS_RESET): a poller serves many functions and applies messages between
/// rounds, so only a poller stuck in a system call (a hung backend) takes this long.
pub const BROADCAST_BOUND: Duration = Duration::from_secs(3);
/// The wait of a function already failed by [`BROADCAST_BOUND`].
const STUCK_BROADCAST_BOUND: Duration = Duration::from_millis(100);

/// What a function's pollers share with its control plane besides its handler.
pub struct FunctionShared {
    /// Its MSI-X table.
    pub msix: Arc<MsixShared>,
    /// SIGBUS faults repaired in its DMA windows.
    pub faults: Arc<AtomicU64>,
    /// Its queues' in-flight records, if it keeps them.
    pub track: Option<Arc<TrackArea>>,
}

impl PollerSet {
    /// Attaches a function shaped by `profile` to the pollers of `pool`, its queues placed as
    /// `placement` says; returns once every poller concerned has taken it.
    pub fn attach(
        pool: &PollerPool,
        profile: &Profile,
        placement: Placement,
        handler: Arc<dyn RequestHandler>,
        shared: FunctionShared,
        wake_control: Arc<dyn Fn() + Send + Sync>,
    ) -> Self {
        let FunctionShared { msix, faults, track } = shared;
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
            stuck: false,
            frozen: Vec::new(),
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
                track: track.clone(),
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
        // Once failed, the function waits for its stuck pollers only briefly (its removal too).
        let bound = if self.stuck { STUCK_BROADCAST_BOUND } else { BROADCAST_BOUND };
        while waiting.iter().any(|&w| w) {
            if started.elapsed() >= bound {
                // A poller stuck for this long is stuck in something of its own (the interrupt
                // watchdog ends a blocked eventfd write in milliseconds): this function stops
                // waiting for it and is failed; the message is still applied when it comes back.
                for (i, _) in waiting.iter().enumerate().filter(|(_, &w)| w) {
                    error!("poller {i} did not acknowledge within {bound:?}; failing the function");
                    self.broken.push(QueueError::Unresponsive(i));
                }
                self.stuck = true;
                return;
            }
            let left = bound.saturating_sub(started.elapsed()).min(Duration::from_secs(1));
            match self.events.recv_timeout(left) {
                Ok(Event::Ack { poller, seq: s }) if s == seq => waiting[poller] = false,
                Ok(Event::Ack { .. }) => {}
                Ok(Event::Broken(e)) => self.broken.push(e),
                Ok(Event::Frozen(states)) => self.frozen.extend(states),
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
        self.resume(queues, features, &[]);
    }

    /// Starts serving `queues` as [`Self::start`] does, those with a state in `states` resuming
    /// where it says (a function taken over at its quiet point, [`Self::freeze`]).
    pub fn resume(&mut self, queues: &[QueueConfig], features: u64, states: &[QueueState]) {
        self.start_with(queues, features, states, false);
    }

    /// Starts serving `queues` where the function's in-flight records say they stood when
    /// the process that served them died (issue 24; [`crate::virtq::track`]).
    pub fn recover(&mut self, queues: &[QueueConfig], features: u64) {
        self.start_with(queues, features, &[], true);
    }

    fn start_with(&mut self, queues: &[QueueConfig], features: u64, states: &[QueueState], recover: bool) {
        let placement = self.placement.clone();
        self.broadcast(|i| {
            let mine = |q: &u16| placement.poller_of(*q) == i;
            Msg::Start {
                queues: queues.iter().filter(|q| mine(&q.index)).copied().collect(),
                features,
                resume: states.iter().filter(|s| mine(&s.ring.index)).cloned().collect(),
                recover,
            }
        });
    }

    /// Brings the function to its quiet point (issue 22): its pollers take no new request, let
    /// the filesystem's engine finish every pending one and publish it; returns where each
    /// started queue stands, with the requests that wait (a SETLKW for its lock: state too).
    /// A queue with a request out that its engine cannot name is not quiet:
    /// [`FreezeError::NotQuiet`], and the function serves on as before. Until [`Self::thaw`]
    /// (or the function goes) no request is taken.
    pub fn freeze(&mut self) -> Result<Vec<QueueState>, FreezeError> {
        self.frozen.clear();
        self.broadcast(|_| Msg::Freeze);
        if self.stuck {
            return Err(FreezeError::Unresponsive);
        }
        let mut states = Vec::new();
        for (index, state) in std::mem::take(&mut self.frozen) {
            match state {
                Some(s) => states.push(s),
                None => {
                    self.thaw();
                    return Err(FreezeError::NotQuiet(index));
                }
            }
        }
        states.sort_unstable_by_key(|s| s.ring.index);
        Ok(states)
    }

    /// Takes requests again after [`Self::freeze`] (a handover that did not happen).
    pub fn thaw(&mut self) {
        self.broadcast(|_| Msg::Thaw);
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
