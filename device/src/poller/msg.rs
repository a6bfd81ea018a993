//! What the control plane and the pollers tell each other: the messages for one function's part
//! of a poller ([`Msg`], posted as [`Post`]), the events pollers send back ([`Event`]: an
//! acknowledgement or a broken queue), and the function context ([`FnCtx`]) a function brings
//! to each poller it attaches to.

use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use super::engine::RequestHandler;
use super::parked::QueueState;
use crate::interrupt::Irqs;
use crate::memory::GuestMem;
use crate::pci::msix::MsixShared;
use crate::pci::QueueConfig;
use crate::stats::{DeviceCounters, LatencyClock};
use crate::virtq::QueueError;

/// A control message for one function's part of a poller.
pub(super) enum Msg {
    /// Serve these queues; those with a saved state ([`QueueState`]) resume where it says,
    /// with its waiting requests.
    Start {
        queues: Vec<QueueConfig>,
        features: u64,
        resume: Vec<QueueState>,
        /// Resume every queue from its in-flight record (crash recovery).
        recover: bool,
    },
    Stop,
    /// The quiet point of a handover (issue 22): held until the engine drained (no new request
    /// taken meanwhile), then every queue's [`QueueState`] is reported ([`Event::Frozen`]) and
    /// no request is taken until [`Msg::Thaw`] (the handover failed) or the function goes.
    Freeze,
    /// Takes requests again after [`Msg::Freeze`].
    Thaw,
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
pub(super) enum Post {
    To { fid: u64, seq: u64, msg: Msg },
    Shutdown,
}

/// What pollers tell a function's control plane.
#[derive(Debug)]
pub(super) enum Event {
    Ack {
        poller: usize,
        seq: u64,
    },
    Broken(QueueError),
    /// A poller's queues of the function at its quiet point: each queue's index and its state,
    /// `None` for a queue with a request out that cannot be handed over.
    Frozen(Vec<(u16, Option<QueueState>)>),
}

/// A function's part of a poller: what its messages carry and its requests are served with.
pub(super) struct FnCtx {
    /// The poller's id.
    pub(super) id: usize,
    pub(super) events: Sender<Event>,
    pub(super) wake_control: Arc<dyn Fn() + Send + Sync>,
    pub(super) handler: Arc<dyn RequestHandler>,
    pub(super) msix: Arc<MsixShared>,
    /// SIGBUS faults repaired in the function's DMA windows (`memory::sigbus`): when it moves,
    /// the client's memory went away under a request and the queues are broken.
    pub(super) faults: Arc<AtomicU64>,
    pub(super) stats: Arc<DeviceCounters>,
    /// The latency clock, if the profile measures latencies.
    pub(super) clock: Option<LatencyClock>,
    /// Doorbells arrive on the socket (and unpark us): ask for them before parking.
    pub(super) doorbells: bool,
    /// The function's in-flight records, if it keeps them: each split queue started keeps its
    /// own up to date.
    pub(super) track: Option<Arc<crate::virtq::track::TrackArea>>,
}
