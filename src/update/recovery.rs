//! Crash recovery (issue 24), the serving process's side: what it gives its supervisor to keep
//! so that a process started after it dies can take its functions over, and how such a
//! process serves a function whose backend's state died with it.
//!
//! A serving process under a supervisor gets a second channel to it (the checkpoint channel,
//! [`CHECKPOINT_FD`]) and sends on it, as they change: each function's checkpoint
//! ([`Kept::Function`]: a [`FunctionPart`] whose device part is
//! `DeviceState::checkpoint` and whose backend part is [`BackendPart::Fresh`], with every
//! descriptor of the function: listening socket, lock, client connection, DMA windows,
//! interrupt eventfds, doorbells' area and the queues' in-flight record), the control socket
//! once ([`Kept::Control`]), and the end of a function deleted ([`Kept::Forget`]). The
//! supervisor keeps the newest of each (`supervisor.rs`) and, when the process dies unasked,
//! replays them to a new one over the same exchange a live update uses (`daemon/take.rs`).
//!
//! The backends' state is not kept yet: a function taken over from a checkpoint of a started
//! device answers every request it finds in flight, and every new one, with `EIO`
//! ([`Ending`]), until its driver resets the device (the device does not signal anything for
//! it: a Linux guest sees `EIO` on that mount until the driver is rebound, or a new client
//! comes); then a RAM filesystem serves again, empty.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use virtiofs_backend::abi::{InHeader, OutHeader};
use virtiofs_backend::passthrough::keep::{DescriptorKeeper, HeldItem};
use virtiofs_device::poller::{Engine, Outcome, RequestHandler, Taken};
use virtiofs_device::stats::{OpClass, Tally};
use virtiofs_device::vfio_user::handover::{CheckpointSink, ServerHandover};
use vm_memory::VolatileSlice;

use super::backend::{Saved, SavesState};
use super::channel::Channel;
use super::state::{self, BackendPart, ControlPart, FunctionPart, Origin};
use super::ControlCopy;
use crate::functions::Keeper;

/// The environment variable naming a serving process's end of its checkpoint channel.
pub const CHECKPOINT_FD: &str = "VIRTIOFS_DPU_CHECKPOINT_FD";
/// The environment variable by which a supervisor says it understands [`Kept::Adopt`] (one
/// of an earlier version does not: a serving process then gives its descriptors itself).
pub const ADOPTS: &str = "VIRTIOFS_DPU_SUPERVISOR_ADOPTS";
/// The environment variable telling a new serving process that it takes over from a
/// checkpoint (its predecessor died), with how many recoveries the daemon had before.
pub const RECOVERING: &str = "VIRTIOFS_DPU_RECOVERING";

/// What a serving process gives its supervisor to keep (on the checkpoint channel).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kept {
    /// A function's checkpoint, replacing its previous one (descriptors: as [`FunctionPart`]
    /// orders them).
    Function(Box<FunctionPart>),
    /// The control socket (descriptors: the listener, then the lock if any).
    Control(ControlPart),
    /// The function is gone: drop its checkpoint. No descriptor.
    Forget {
        /// Its tag.
        tag: String,
    },
    /// Descriptors of the function's backend to hold (a shared directory's nodes and open
    /// handles: `passthrough::keep`), one per item, replacing any held under the same key.
    Hold {
        /// The function's tag.
        tag: String,
        /// Each descriptor's key and what it is.
        items: Vec<(u64, HeldItem)>,
    },
    /// The backend let these go: their descriptors close. No descriptor.
    Let {
        /// The function's tag.
        tag: String,
        /// Their keys.
        keys: Vec<u64>,
    },
    /// Every descriptor held for the function goes (it holds them anew next). No descriptor.
    LetAll {
        /// The function's tag.
        tag: String,
    },
    /// The function's held descriptors are those the process this one took over from (a
    /// live update: the same keys) holds for it, from the moment every checkpoint of that
    /// process is read, less those this one lets go meanwhile; every hold and let after this
    /// is this process's own. Sent before the function serves. No descriptor.
    Adopt {
        /// The function's tag.
        tag: String,
    },
}

/// A function's backend descriptors given to the supervisor ([`Kept::Hold`]).
struct FunctionDescriptors {
    chan: Arc<KeptChannel>,
    tag: String,
}

impl DescriptorKeeper for FunctionDescriptors {
    fn hold(&self, items: &[(u64, HeldItem)], fds: &[BorrowedFd<'_>]) -> bool {
        let msg = Kept::Hold { tag: self.tag.clone(), items: items.to_vec() };
        let chan = self.chan.chan.lock().unwrap_or_else(|e| e.into_inner());
        if self.chan.closed.load(Ordering::Acquire) {
            return true; // handed over: the successor keeps its own
        }
        match chan.send(&msg, fds) {
            Ok(()) => {
                self.chan.sent.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                log::warn!("descriptors not held by the supervisor: {}", crate::error_chain(&e));
                self.chan.failed.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    fn let_go(&self, keys: &[u64]) {
        send(&self.chan, &Kept::Let { tag: self.tag.clone(), keys: keys.to_vec() }, &[]);
    }

    fn let_all_go(&self) {
        send(&self.chan, &Kept::LetAll { tag: self.tag.clone() }, &[]);
    }

    fn adopt(&self) -> bool {
        if std::env::var_os(ADOPTS).is_none_or(|v| v != "1") {
            return false;
        }
        // Not sent (the supervisor gone): the descriptors are given instead (which fails too).
        send(&self.chan, &Kept::Adopt { tag: self.tag.clone() }, &[])
    }
}

/// The serving process's end of the checkpoint channel (shared by every function's sink).
pub struct CheckpointKeeper(Arc<KeptChannel>);

/// The checkpoint channel and what went through it.
struct KeptChannel {
    chan: Mutex<Channel>,
    /// Closed by this process (it handed every function over): nothing more is sent.
    closed: AtomicBool,
    /// Checkpoints sent, and those that could not be.
    sent: AtomicU64,
    failed: AtomicU64,
}

/// Checkpoints given to the supervisor (a statistic: `get_stats`'s `checkpoints`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointCounts {
    /// Sent.
    pub sent: u64,
    /// Not sent (the supervisor gone or not reading).
    pub failed: u64,
}

/// Sends `msg` with `fds` on `k`'s channel; whether it was sent. A failure is logged and
/// counted (the supervisor is gone, and this process ends with it, or it stopped reading: a
/// crash now would not be recovered from this state).
fn send(k: &KeptChannel, msg: &Kept, fds: &[OwnedFd]) -> bool {
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let chan = k.chan.lock().unwrap_or_else(|e| e.into_inner());
    if k.closed.load(Ordering::Acquire) {
        return false;
    }
    match chan.send(msg, &borrowed) {
        Ok(()) => {
            k.sent.fetch_add(1, Ordering::Relaxed);
            true
        }
        Err(e) => {
            log::warn!("checkpoint not kept: {}", crate::error_chain(&e));
            k.failed.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

impl CheckpointKeeper {
    /// Over `chan`.
    pub fn new(chan: Channel) -> Arc<Self> {
        let k = KeptChannel {
            chan: Mutex::new(chan),
            closed: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        };
        Arc::new(CheckpointKeeper(Arc::new(k)))
    }

    /// The checkpoints sent so far, and those that could not be.
    pub fn counts(&self) -> CheckpointCounts {
        CheckpointCounts {
            sent: self.0.sent.load(Ordering::Relaxed),
            failed: self.0.failed.load(Ordering::Relaxed),
        }
    }

    /// Ends the channel (this process handed every function over and exits): once the
    /// supervisor has read it to its end and heard of the commit, it gives what this process
    /// held to its successor. Nothing is sent after.
    pub fn close(&self) {
        let chan = self.0.chan.lock().unwrap_or_else(|e| e.into_inner());
        self.0.closed.store(true, Ordering::Release);
        let _ = chan.socket().shutdown(std::net::Shutdown::Write);
    }

    /// Gives the supervisor the control socket (once, when it starts being served).
    pub fn keep_control(&self, copy: &ControlCopy) {
        let parts = copy.files.handed_over().and_then(|f| Ok((f, copy.listener.try_clone()?)));
        let (files, listener) = match parts {
            Ok(p) => p,
            Err(e) => return log::warn!("control socket: not kept for crash recovery: {e}"),
        };
        let (socket_file, lock) = files.into_parts();
        let part = ControlPart { path: copy.path.clone(), socket_file, lock: lock.is_some() };
        let mut fds: Vec<OwnedFd> = vec![listener.into()];
        fds.extend(lock.map(OwnedFd::from));
        send(&self.0, &Kept::Control(part), &fds);
    }
}

impl Keeper for CheckpointKeeper {
    fn sink(
        &self,
        tag: &str,
        origin: &Origin,
        backend: Option<Arc<dyn SavesState>>,
    ) -> Arc<dyn CheckpointSink> {
        Arc::new(FunctionSink { chan: self.0.clone(), tag: tag.to_string(), origin: origin.clone(), backend })
    }

    fn forget(&self, tag: &str) {
        send(&self.0, &Kept::Forget { tag: tag.to_string() }, &[]);
    }

    fn descriptors(&self, tag: &str) -> Arc<dyn DescriptorKeeper> {
        Arc::new(FunctionDescriptors { chan: self.0.clone(), tag: tag.to_string() })
    }
}

/// One function's checkpoints, sent as [`Kept::Function`].
struct FunctionSink {
    chan: Arc<KeptChannel>,
    tag: String,
    origin: Origin,
    /// What gives the backend's part ([`SavesState::kept`]); `Fresh` without it.
    backend: Option<Arc<dyn SavesState>>,
}

impl CheckpointSink for FunctionSink {
    fn checkpoint(&self, h: ServerHandover) {
        let (path, socket_file, lock, client, device, mut fds) = state::server_part(h);
        fds.extend(state::device_files(device.files));
        let backend = match self.backend.as_ref().and_then(|b| b.kept()) {
            Some(Ok((part, files))) => {
                fds.extend(files);
                part
            }
            Some(Err(why)) => {
                log::warn!("function {:?}: its backend's records are not in the checkpoint: {why}", self.tag);
                BackendPart::Fresh
            }
            None => BackendPart::Fresh,
        };
        let part = FunctionPart {
            tag: self.tag.clone(),
            origin: self.origin.clone(),
            path,
            socket_file,
            lock,
            client,
            device: device.snapshot,
            backend,
        };
        send(&self.chan, &Kept::Function(Box::new(part)), &fds);
    }
}

/// The handler of a function taken over from a checkpoint whose backend's state is gone: every
/// request is answered with `EIO` (FORGET and BATCH_FORGET, which have no reply, with
/// nothing) until the driver resets the device; then `inner`, a backend opened anew, serves,
/// or, without one, `EIO` goes on.
pub struct Ending {
    inner: Option<Arc<dyn RequestHandler>>,
    /// What hands the fresh backend over in a live update (once the function was reset).
    saver: Option<Arc<dyn SavesState>>,
    ended: Arc<AtomicBool>,
}

impl Ending {
    /// Ending until the next reset, then `inner` (handed over by `saver` in a live update);
    /// `active`: whether the driver had started the device (DRIVER_OK) when the process died.
    /// A device it had not started has no FUSE session to end: `inner` serves at once (the
    /// driver goes on to DRIVER_OK and FUSE_INIT without another reset).
    pub fn new(
        inner: Option<Arc<dyn RequestHandler>>,
        saver: Option<Arc<dyn SavesState>>,
        active: bool,
    ) -> Arc<Self> {
        let ended = active || inner.is_none();
        Arc::new(Ending { inner, saver, ended: Arc::new(AtomicBool::new(ended)) })
    }

    /// The fresh backend's saver while it serves; why not while the function still ends.
    fn serving_saver(&self) -> Result<&Arc<dyn SavesState>, String> {
        if self.ended.load(Ordering::Acquire) {
            return Err("its state was lost in a crash and its driver has not reset it yet".into());
        }
        self.saver.as_ref().ok_or_else(|| "its backend's state was lost in a crash".into())
    }
}

/// A live update hands over the fresh backend once the function was reset (before that there
/// is nothing to hand over, and the update is refused naming why).
impl SavesState for Ending {
    fn precopy(&self) -> Option<Saved> {
        match self.serving_saver() {
            Ok(s) => s.precopy(),
            Err(why) => Some(Err(why)),
        }
    }

    fn forget_precopy(&self) {
        if let Some(s) = &self.saver {
            s.forget_precopy();
        }
    }

    fn called_off(&self) {
        if let Some(s) = &self.saver {
            s.called_off();
        }
    }

    fn save(&self) -> Saved {
        self.serving_saver()?.save()
    }

    fn handed_over(&self) {
        if let Some(s) = &self.saver {
            s.handed_over();
        }
    }

    fn taken_over(&self) {
        if let Some(s) = &self.saver {
            s.taken_over();
        }
    }
}

/// Answers the request in `readable` with `EIO` in `writable` (nothing for FORGET and
/// BATCH_FORGET, which have no reply): the used length and the tally.
fn end_request(readable: &[VolatileSlice<'_>], writable: &[VolatileSlice<'_>]) -> (u32, Tally) {
    let tally = Tally { class: OpClass::Other, errno: libc::EIO as u16, bytes: 0 };
    let mut r = virtiofs_backend::io::Reader::new(readable);
    let Ok(hdr) = r.read_obj::<InHeader>() else { return (0, tally) };
    if NO_REPLY.contains(&hdr.opcode) {
        return (0, Tally { errno: 0, ..tally });
    }
    let out =
        OutHeader { len: std::mem::size_of::<OutHeader>() as u32, error: -libc::EIO, unique: hdr.unique };
    let mut w = virtiofs_backend::io::Writer::new(writable);
    match w.write_obj(&out) {
        Ok(()) => (out.len, tally),
        Err(_) => (0, tally),
    }
}

/// A poller's engine of an [`Ending`] function: the fresh backend's, which it serves once the
/// function was reset; until then every request ends at once.
struct EndingEngine {
    inner: Box<dyn Engine>,
    ended: Arc<AtomicBool>,
}

impl Engine for EndingEngine {
    fn submit(
        &mut self,
        id: u64,
        taken: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (Outcome, Tally) {
        if self.ended.load(Ordering::Acquire) {
            let (len, tally) = end_request(readable, writable);
            return (Outcome::Done(len), tally);
        }
        self.inner.submit(id, taken, readable, writable)
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, u32, Tally)) -> usize {
        self.inner.poll(done)
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    fn readiness(&self) -> Option<virtiofs_device::poller::Readiness<'_>> {
        self.inner.readiness()
    }

    fn poll_waits(&mut self, answer: &mut dyn FnMut(u64, &[u8], Tally)) -> usize {
        self.inner.poll_waits(answer)
    }

    fn cancel_waits(&mut self) {
        self.inner.cancel_waits()
    }

    fn wait_tokens(&self) -> Vec<(u64, u64)> {
        self.inner.wait_tokens()
    }

    fn adopt_wait(&mut self, id: u64, token: u64) -> bool {
        self.inner.adopt_wait(id, token)
    }
}

/// FUSE's FORGET and BATCH_FORGET: no reply.
const NO_REPLY: [u32; 2] = [2, 42];

impl RequestHandler for Ending {
    fn handle(
        &self,
        taken: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally) {
        if let Some(inner) = self.inner.as_ref().filter(|_| !self.ended.load(Ordering::Acquire)) {
            return inner.handle(taken, readable, writable);
        }
        end_request(readable, writable)
    }

    fn engine(&self, poller: usize) -> Option<Box<dyn Engine>> {
        let inner = self.inner.as_ref()?.engine(poller)?;
        Some(Box::new(EndingEngine { inner, ended: self.ended.clone() }))
    }

    fn before_publish(&self) {
        if let Some(inner) = &self.inner {
            inner.before_publish();
        }
    }

    fn publish_due(&self) -> bool {
        self.inner.as_ref().is_some_and(|i| i.publish_due())
    }

    fn reset(&self) {
        if let Some(inner) = &self.inner {
            inner.reset();
            if self.ended.swap(false, Ordering::AcqRel) {
                log::info!(
                    "a function that lost its state in a crash was reset by its driver: it serves again"
                );
            }
        }
    }
}
