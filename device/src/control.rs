//! The device's control-plane state, apart from any transport: what a client's commands act on.
//!
//! [`DeviceState`] owns the PCI register model ([`crate::pci`]), the DMA table
//! ([`crate::memory`]), the pollers ([`crate::poller`]) and the interrupt eventfds, and decides
//! what happens on each [`DeviceEvent`] a register write returns: activation starts the queues on
//! their pollers, a driver reset stops them, a doorbell through the socket wakes the queue's
//! poller. It also owns the device's own resets (function-level, and back to power-on when the
//! client goes away), the MSI-X masks as the client sets them, and the broken-queue path: a
//! poller that finds a corrupt ring reports it, and the state sets DEVICE_NEEDS_RESET and
//! signals the configuration vector.
//!
//! A daemon of several functions has one `DeviceState` per function ([`DeviceState::on_pool`]),
//! their queues served by shared pollers ([`crate::poller::PollerPool`]).
//!
//! It knows nothing of sockets or of a wire format: the vfio-user adapter
//! (`vfio_user`) decodes messages, checks their fields and calls the methods here (as
//! SPDK splits `vfu_virtio.c` from its transport, and cloud-hypervisor has `transport/`). Every
//! method runs on the control plane's thread.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use log::{debug, info, warn};
use thiserror::Error;

use crate::config::{Placement, Profile};
use crate::handover::{
    DeviceHandover, DeviceSnapshot, HandoverError, HandoverFiles, WindowState, SNAPSHOT_VERSION,
};
use crate::interrupt::{is_eventfd, set_nonblocking, signal_eventfd, Irqs, Signalled};
use crate::memory::{self, DmaTable, MemoryError};
use crate::pci::{self, features, AccessError, DeviceEvent, VirtioFsFunction};
use crate::poller::{FunctionShared, PollerPool, PollerSet, RequestHandler};
use crate::stats::{DeviceCounters, DeviceStats};
use crate::virtq::track::TrackArea;

/// A request of the client the device refuses (each maps to the errno the transport reports).
#[derive(Debug, Error)]
pub enum ControlError {
    /// A DMA table change was refused.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A register access was refused.
    #[error("region access refused")]
    Access(#[from] AccessError),
    /// Interrupt vectors past the device's.
    #[error("interrupt vectors {start}+{count} do not exist ({vectors} vectors)")]
    NoVectors {
        /// First vector named.
        start: usize,
        /// How many.
        count: usize,
        /// Vectors the device has.
        vectors: usize,
    },
    /// As many eventfds as vectors are needed (or none, to clear them).
    #[error("{fds} eventfds for {count} vectors")]
    EventfdCount {
        /// Descriptors given.
        fds: usize,
        /// Vectors named.
        count: usize,
    },
    /// An interrupt descriptor that is not an eventfd.
    #[error("descriptor {0} is not an eventfd")]
    NotEventfd(usize),
    /// An interrupt eventfd could not be made non-blocking.
    #[error("cannot make eventfd {0} non-blocking")]
    Eventfd(usize, #[source] io::Error),
    /// The notify memory could not be shared.
    #[error("cannot share the notify memory")]
    NotifyMemory(#[source] io::Error),
}

impl ControlError {
    /// The errno the transport reports.
    pub fn errno(&self) -> i32 {
        match self {
            ControlError::Memory(e) => e.errno(),
            ControlError::NotifyMemory(_) => libc::EIO,
            _ => libc::EINVAL,
        }
    }
}

/// Control-plane state of the device, independent of any one connection.
pub struct DeviceState {
    func: VirtioFsFunction,
    dma: DmaTable,
    pollers: PollerSet,
    /// MSI-X eventfds by vector (the device has no INTx, MSI or error interrupts).
    msix_fds: Vec<Option<File>>,
    /// The device-request interrupt's eventfd (vfio's `VFIO_PCI_REQ_IRQ_INDEX`, one interrupt):
    /// signalled when the function is to go away ([`Self::request_removal`]); QEMU's
    /// `vfio-user-pci` then asks the guest to unplug the device through its slot.
    req_fd: Option<File>,
    /// Backing of the mmappable notify area; `None` when doorbells come through the transport
    /// (the area is then trapped: every doorbell is a register write that wakes a poller).
    notify_mem: Option<File>,
    /// Where the running queues of a function taken over stand, until
    /// [`Self::start_taken`] resumes them.
    taken: Option<Vec<crate::poller::QueueState>>,
    /// The queues' in-flight records (the profile's `inflight_tracking`).
    track: Option<Arc<TrackArea>>,
    /// Made by [`Self::take_over`]: the running queues resume from their in-flight records.
    recovering: bool,
    /// Bumped by every change of what a checkpoint holds ([`Self::epoch`]).
    epoch: u64,
}

impl DeviceState {
    /// A device shaped by `profile` whose queues are served by the shared pollers of `pool`,
    /// as `placement` says (one function among several of a daemon, or a pool of its own);
    /// its requests go to `handler`. Its registers, DMA table, interrupts and counters are its
    /// own. `wake_control` is called from a poller that found a corrupt ring: the control
    /// plane then calls [`Self::check_broken_queues`].
    pub fn on_pool(
        profile: &Profile,
        pool: &PollerPool,
        placement: Placement,
        handler: Arc<dyn RequestHandler>,
        wake_control: Arc<dyn Fn() + Send + Sync>,
    ) -> io::Result<Self> {
        let track = if profile.inflight_tracking {
            Some(TrackArea::create(profile.request_queues.saturating_add(1)).map_err(io::Error::other)?)
        } else {
            None
        };
        Self::with_track(profile, pool, placement, handler, wake_control, track)
    }

    /// [`Self::on_pool`], keeping its queues' in-flight records in `track`.
    fn with_track(
        profile: &Profile,
        pool: &PollerPool,
        placement: Placement,
        handler: Arc<dyn RequestHandler>,
        wake_control: Arc<dyn Fn() + Send + Sync>,
        track: Option<Arc<TrackArea>>,
    ) -> io::Result<Self> {
        let mut offered = features::EVENT_IDX | features::INDIRECT_DESC;
        if profile.packed_ring {
            offered |= features::RING_PACKED;
        }
        let func = VirtioFsFunction::new(&profile.tag, profile.request_queues, profile.queue_size, offered);
        let dma = DmaTable::with_limits(profile.dma_limits());
        let msix = func.msix().clone();
        let shared = FunctionShared { msix, faults: dma.faults().clone(), track: track.clone() };
        let pollers = PollerSet::attach(pool, profile, placement, handler, shared, wake_control);
        let notify_mem = if profile.doorbells_on_socket() {
            None
        } else {
            Some(memory::memfd("virtiofs-notify", pci::VIRTIO_BAR_SIZE)?)
        };
        let vectors = func.msix().len();
        let msix_fds = (0..vectors).map(|_| None).collect();
        Ok(DeviceState {
            func,
            dma,
            pollers,
            msix_fds,
            req_fd: None,
            notify_mem,
            taken: None,
            track,
            recovering: false,
            epoch: 0,
        })
    }

    /// The memory file of the queues' in-flight records, if the profile keeps them (for the
    /// process that keeps it across a crash).
    pub fn inflight_record(&self) -> Option<&File> {
        self.track.as_ref().map(|t| t.file())
    }

    /// The device's counters, readable from any thread.
    pub fn counters(&self) -> &Arc<DeviceCounters> {
        self.pollers.stats()
    }

    /// A snapshot of the device's statistics.
    pub fn stats(&self) -> DeviceStats {
        self.counters().snapshot()
    }

    /// Back to power-on (the client went away): queues stopped, no DMA windows, no interrupts,
    /// registers reset.
    pub fn power_on_reset(&mut self) {
        self.func.reset();
        self.pollers.stop();
        let removed = self.dma.clear();
        self.pollers.set_memory(&self.dma.snapshot());
        drop(removed); // no poller can touch them now: their SIGBUS watch may end
        self.msix_fds.iter_mut().for_each(|f| *f = None);
        self.req_fd = None;
        self.counters().removal_interrupt(false);
        self.publish_irqs();
        self.counters().reset_done();
        self.publish_state();
    }

    /// Gives the pollers the transport's doorbell source (see
    /// [`PollerSet::set_doorbell_source`]): a descriptor readable when the client may have rung
    /// a doorbell, or `None` when the client is gone. Only with doorbells through the transport
    /// (with the notify area in shared memory nothing rings there).
    pub fn set_doorbell_source(&mut self, fd: Option<OwnedFd>) {
        if self.notify_mem.is_none() {
            self.pollers.set_doorbell_source(fd);
        }
    }

    /// Publishes the status register and the driver's features for the statistics' readers.
    fn publish_state(&mut self) {
        self.epoch += 1;
        self.counters().driver_state(self.func.status(), self.func.driver_features());
    }

    /// Function-level reset: registers reset and queues stopped; DMA windows and interrupts stay.
    pub fn function_reset(&mut self) {
        info!("device reset");
        self.func.reset();
        self.pollers.stop();
        self.counters().reset_done();
        self.publish_state();
    }

    /// Sets DEVICE_NEEDS_RESET (and signals the configuration vector) if a poller found a
    /// corrupt ring since the last call.
    pub fn check_broken_queues(&mut self) {
        let broken = self.pollers.take_broken();
        if broken.is_empty() {
            return;
        }
        for e in &broken {
            warn!("{e}: setting DEVICE_NEEDS_RESET");
        }
        if let Some(v) = self.func.set_needs_reset() {
            self.signal(v);
        }
        self.publish_state();
    }

    /// Adds a DMA window (mapped if it comes with a file); returns once every poller sees it.
    pub fn dma_map(
        &mut self,
        address: u64,
        size: u64,
        offset: u64,
        file: Option<File>,
    ) -> Result<(), MemoryError> {
        let has_fd = file.is_some();
        debug!("DMA_MAP {address:#x}+{size:#x} offset {offset:#x} fd {has_fd}");
        self.dma.map(address, size, offset, file)?;
        self.epoch += 1;
        if has_fd {
            self.pollers.set_memory(&self.dma.snapshot());
        }
        Ok(())
    }

    /// Removes the DMA windows in `address..address+size` (all of them with `None`); returns
    /// only once no poller can still touch them.
    pub fn dma_unmap(&mut self, range: Option<(u64, u64)>) -> Result<(), MemoryError> {
        let removed = match range {
            Some((address, size)) => self.dma.unmap(address, size)?,
            None => self.dma.clear(),
        };
        self.epoch += 1;
        self.pollers.set_memory(&self.dma.snapshot());
        drop(removed); // no poller can touch them now: their SIGBUS watch may end
        Ok(())
    }

    /// Most DMA windows a client may map (what VERSION announces as `max_dma_maps`).
    pub fn max_dma_windows(&self) -> usize {
        self.dma.limits().max_windows.min(memory::MAX_DMA_MAPS)
    }

    /// Size of region `index` (vfio-pci numbering); 0 if absent.
    pub fn region_size(&self, index: u32) -> u64 {
        self.func.region_size(index)
    }

    /// A descriptor of the memory behind the notify area, when the client may map it (doorbells
    /// in shared memory); `Ok(None)` when doorbells are register writes.
    pub fn notify_memory(&self) -> Result<Option<File>, ControlError> {
        self.notify_mem.as_ref().map(|f| f.try_clone().map_err(ControlError::NotifyMemory)).transpose()
    }

    /// Number of MSI-X vectors.
    pub fn msix_vectors(&self) -> usize {
        self.msix_fds.len()
    }

    fn check_vectors(&self, start: usize, count: usize) -> Result<std::ops::Range<usize>, ControlError> {
        let vectors = self.msix_vectors();
        match start.checked_add(count) {
            Some(end) if end <= vectors => Ok(start..end),
            _ => Err(ControlError::NoVectors { start, count, vectors }),
        }
    }

    /// Sets the eventfds of vectors `start..start+count` (`fds` empty: clears them).
    pub fn set_irq_eventfds(
        &mut self,
        start: usize,
        count: usize,
        fds: Vec<File>,
    ) -> Result<(), ControlError> {
        let range = self.check_vectors(start, count)?;
        if !fds.is_empty() && fds.len() != count {
            return Err(ControlError::EventfdCount { fds: fds.len(), count });
        }
        if let Some(bad) = fds.iter().position(|f| !is_eventfd(f)) {
            return Err(ControlError::NotEventfd(bad));
        }
        for (i, f) in fds.iter().enumerate() {
            set_nonblocking(f).map_err(|e| ControlError::Eventfd(i, e))?;
        }
        let mut fds = fds.into_iter();
        for v in range {
            self.msix_fds[v] = fds.next();
        }
        self.publish_irqs();
        Ok(())
    }

    /// Sets the device-request interrupt's eventfd (`None`: clears it).
    pub fn set_request_eventfd(&mut self, fd: Option<File>) -> Result<(), ControlError> {
        if let Some(f) = &fd {
            if !is_eventfd(f) {
                return Err(ControlError::NotEventfd(0));
            }
            set_nonblocking(f).map_err(|e| ControlError::Eventfd(0, e))?;
        }
        self.counters().removal_interrupt(fd.is_some());
        self.req_fd = fd;
        self.epoch += 1;
        Ok(())
    }

    /// Signals the device-request interrupt, if the client set its eventfd: the device asks to
    /// be let go (QEMU's `vfio-user-pci` then unplugs it from the guest, whose driver resets it,
    /// and the client hangs up). Returns whether there was an eventfd to signal.
    pub fn request_removal(&self) -> bool {
        match &self.req_fd {
            Some(f) => {
                // Full or blocking: the client will not take the request; it is only a request.
                if let Ok(Signalled::Stuck) = signal_eventfd(f) {
                    log::warn!("device-request eventfd is full or blocks");
                }
                true
            }
            None => false,
        }
    }

    /// Drops every interrupt eventfd.
    pub fn clear_irq_eventfds(&mut self) {
        self.msix_fds.iter_mut().for_each(|f| *f = None);
        self.publish_irqs();
    }

    /// Masks or unmasks the vectors of `start..start+count` for which `selected` is true (all
    /// with `None`); an unmasked vector that was pending is signalled.
    pub fn mask_vectors(
        &mut self,
        start: usize,
        count: usize,
        selected: Option<&[bool]>,
        masked: bool,
    ) -> Result<(), ControlError> {
        self.epoch += 1;
        for v in self.selected(start, count, selected)? {
            self.func.msix().set_vfio_mask(v, masked);
            if !masked && self.func.msix().take_pending_if_unmasked(v) {
                self.signal(v as u16);
            }
        }
        Ok(())
    }

    /// Signals the vectors of `start..start+count` for which `selected` is true (all with
    /// `None`), as their queues would (pending if masked).
    pub fn trigger_vectors(
        &mut self,
        start: usize,
        count: usize,
        selected: Option<&[bool]>,
    ) -> Result<(), ControlError> {
        for v in self.selected(start, count, selected)? {
            self.signal(v as u16);
        }
        Ok(())
    }

    fn selected(
        &self,
        start: usize,
        count: usize,
        selected: Option<&[bool]>,
    ) -> Result<Vec<usize>, ControlError> {
        let range = self.check_vectors(start, count)?;
        Ok(match selected {
            None => range.collect(),
            Some(on) => range.zip(on).filter(|(_, &on)| on).map(|(v, _)| v).collect(),
        })
    }

    /// Reads registers of region `region` at `offset`.
    pub fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
        self.func.read(region, offset, data)
    }

    /// Writes registers of region `region` at `offset`, and acts on what the write means:
    /// activation starts the queues, a driver reset stops them, a doorbell wakes a poller.
    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), AccessError> {
        match self.func.write(region, offset, data)? {
            Some(DeviceEvent::Activate(act)) => {
                info!("driver ready: features {:#x}, {} queues", act.features, act.queues.len());
                self.pollers.set_memory(&self.dma.snapshot());
                self.pollers.start(&act.queues, act.features);
            }
            Some(DeviceEvent::Reset) => {
                debug!("virtio reset by the driver");
                self.pollers.stop();
                self.counters().reset_done();
            }
            Some(DeviceEvent::Notify(q)) => {
                debug!("doorbell for queue {q} through the transport");
                self.pollers.kick(q);
                return Ok(());
            }
            None => {}
        }
        self.publish_state();
        Ok(())
    }

    /// Brings the function to its quiet point and gives its device state and descriptors for a
    /// successor to take over (issue 22; [`crate::handover`]). This device stays as it was, its
    /// pollers taking no request: drop it once the successor serves, or call
    /// [`Self::resume_serving`] if the handover does not go through (done here already when
    /// this fails).
    pub fn hand_over(&mut self) -> Result<DeviceHandover, HandoverError> {
        let rings = match self.func.activation() {
            Some(_) => self.pollers.freeze()?,
            None => Vec::new(),
        };
        let mut h = self.export_state(rings).inspect_err(|_| self.resume_serving())?;
        // The queues' in-flight record goes along: the taker goes on writing it, so that the
        // requests still out (a SETLKW waiting) stay in it for a crash after the update.
        match self.track.as_ref().map(|t| t.file().try_clone()).transpose() {
            Ok(f) => {
                h.snapshot.inflight = f.is_some();
                h.files.inflight = f;
            }
            Err(e) => {
                self.resume_serving();
                return Err(e.into());
            }
        }
        Ok(h)
    }

    /// A count that moves whenever something a [`Self::checkpoint`] holds changed (registers,
    /// DMA windows, interrupt descriptors): the transport takes a checkpoint when it moved.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The device's state and descriptors as a process started after a crash resumes from
    /// (issue 24; [`Self::take_over`]), taken while it serves: no ring positions (the queues'
    /// in-flight record, which comes along, says where they stand) and nothing frozen.
    pub fn checkpoint(&self) -> Result<DeviceHandover, HandoverError> {
        let mut h = self.export_state(Vec::new())?;
        // The counters start again from zero after a crash: a checkpoint stays small.
        h.snapshot.stats = DeviceStats::default();
        h.snapshot.checkpoint = true;
        h.files.inflight = self.track.as_ref().map(|t| t.file().try_clone()).transpose()?;
        h.snapshot.inflight = h.files.inflight.is_some();
        Ok(h)
    }

    /// The registers, windows and interrupt descriptors, with `rings`.
    fn export_state(&self, rings: Vec<crate::poller::QueueState>) -> Result<DeviceHandover, HandoverError> {
        let mut files = HandoverFiles::default();
        let mut windows = Vec::new();
        for (address, size, file) in self.dma.export()? {
            let offset = file.map(|(f, off)| {
                files.windows.push(f);
                off
            });
            windows.push(WindowState { address, size, offset });
        }
        for f in self.msix_fds.iter().flatten() {
            files.msix.push(f.try_clone()?);
        }
        files.request = self.req_fd.as_ref().map(File::try_clone).transpose()?;
        files.notify = self.notify_mem.as_ref().map(File::try_clone).transpose()?;
        let snapshot = DeviceSnapshot {
            version: SNAPSHOT_VERSION,
            function: self.func.save(),
            rings,
            windows,
            msix_fds: self.msix_fds.iter().map(Option::is_some).collect(),
            request_fd: self.req_fd.is_some(),
            notify_mem: self.notify_mem.is_some(),
            stats: self.counters().snapshot(),
            inflight: false,
            checkpoint: false,
        };
        Ok(DeviceHandover { snapshot, files })
    }

    /// Takes requests again after [`Self::hand_over`] (the successor did not take over).
    pub fn resume_serving(&mut self) {
        if self.func.activation().is_some() {
            self.pollers.thaw();
        }
    }

    /// A device shaped by `profile` (as [`Self::on_pool`] makes one) that takes over the
    /// function `handover` describes: the same registers, DMA windows and interrupts, and its
    /// running queues resumed where they stood. A completion the predecessor published but did
    /// not signal is covered: every running queue's vector is signalled once (a spurious
    /// interrupt costs the driver one look at its used ring).
    ///
    /// A [`Self::checkpoint`] (its snapshot marks an in-flight record) is taken over the same
    /// way by a process started after a crash (issue 24): the device keeps the same record,
    /// and its running queues resume where the record says ([`crate::virtq::track`]): the
    /// returns written are published, the chains in flight are taken again.
    pub fn take_over(
        profile: &Profile,
        pool: &PollerPool,
        placement: Placement,
        handler: Arc<dyn RequestHandler>,
        wake_control: Arc<dyn Fn() + Send + Sync>,
        handover: DeviceHandover,
    ) -> Result<Self, HandoverError> {
        let DeviceHandover { snapshot: s, files } = handover;
        if s.version != SNAPSHOT_VERSION {
            return Err(HandoverError::Version { found: s.version, expected: SNAPSHOT_VERSION });
        }
        let mismatch = |what: &str| HandoverError::Files(what.to_string());
        let t = std::time::Instant::now();
        let mut dev = match (s.inflight, files.inflight) {
            (true, Some(f)) => {
                let track = TrackArea::open(f).map_err(|e| HandoverError::Files(e.to_string()))?;
                let mut dev = Self::with_track(profile, pool, placement, handler, wake_control, Some(track))?;
                dev.recovering = s.checkpoint;
                dev
            }
            (false, None) => Self::on_pool(profile, pool, placement, handler, wake_control)?,
            _ => return Err(mismatch("the in-flight record")),
        };
        let attached = t.elapsed();
        dev.func.restore(&s.function)?;
        dev.counters().carry(s.stats.clone());
        let mut window_files = files.windows.into_iter();
        for w in &s.windows {
            let file = match w.offset {
                Some(_) => Some(window_files.next().ok_or_else(|| mismatch("fewer window files"))?),
                None => None,
            };
            dev.dma.map(w.address, w.size, w.offset.unwrap_or(0), file)?;
        }
        if window_files.next().is_some() {
            return Err(mismatch("more window files"));
        }
        if s.msix_fds.len() != dev.msix_fds.len() {
            return Err(mismatch("another number of vectors"));
        }
        let mut msix = files.msix.into_iter();
        for (slot, &set) in dev.msix_fds.iter_mut().zip(&s.msix_fds) {
            if set {
                let f = msix.next().ok_or_else(|| mismatch("fewer interrupt eventfds"))?;
                if !is_eventfd(&f) {
                    return Err(mismatch("an interrupt descriptor is not an eventfd"));
                }
                set_nonblocking(&f)?;
                *slot = Some(f);
            }
        }
        if msix.next().is_some() {
            return Err(mismatch("more interrupt eventfds"));
        }
        dev.req_fd = match (s.request_fd, files.request) {
            (true, Some(f)) if is_eventfd(&f) => Some(f),
            (false, None) => None,
            _ => return Err(mismatch("the device-request eventfd")),
        };
        match (s.notify_mem, files.notify, dev.notify_mem.is_some()) {
            (true, Some(f), true) => dev.notify_mem = Some(f),
            (false, None, false) => {}
            _ => return Err(mismatch("the doorbells' area (the profiles' doorbells differ?)")),
        }
        dev.counters().removal_interrupt(dev.req_fd.is_some());
        let checked = t.elapsed();
        dev.publish_irqs();
        dev.pollers.set_memory(&dev.dma.snapshot());
        dev.taken = Some(s.rings);
        log::debug!(
            "taken over: attached to the pollers in {attached:?}, registers, windows and interrupts by {checked:?}, \
             published to the pollers by {:?}",
            t.elapsed()
        );
        dev.publish_state();
        Ok(dev)
    }

    /// Resumes the running queues of a device [`Self::take_over`] made, where they stood, and
    /// signals each one's vector once. Until this is called the device takes no request, so
    /// a taker that was built but not committed to leaves the rings to its predecessor.
    pub fn start_taken(&mut self) {
        let Some(rings) = self.taken.take() else { return };
        if let Some(act) = self.func.activation() {
            if std::mem::take(&mut self.recovering) {
                self.pollers.recover(&act.queues, act.features);
            } else {
                self.pollers.resume(&act.queues, act.features, &rings);
            }
            for q in &act.queues {
                self.signal(q.vector);
            }
        }
    }

    fn publish_irqs(&mut self) {
        self.epoch += 1;
        let irqs: Irqs = self.msix_fds.iter().map(|f| f.as_ref().and_then(|f| f.try_clone().ok())).collect();
        self.pollers.set_irqs(&irqs);
    }

    fn signal(&self, vector: u16) {
        let v = usize::from(vector);
        if self.func.msix().deliverable_or_pend(v) {
            if let Some(Some(f)) = self.msix_fds.get(v) {
                if let Ok(Signalled::Stuck) = signal_eventfd(f) {
                    if self.func.msix().mark_broken() {
                        log::error!("interrupt eventfd of vector {v} is full or blocks; interrupts off");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Doorbells;
    use crate::poller::Taken;
    use crate::stats::Tally;
    use vm_memory::VolatileSlice;

    struct Nothing;
    impl RequestHandler for Nothing {
        fn handle(&self, _: Taken, _: &[VolatileSlice<'_>], _: &[VolatileSlice<'_>]) -> (u32, Tally) {
            (0, Tally::default())
        }
    }

    /// The device state driven without any transport: registers, doorbells, DMA windows and
    /// interrupt descriptors.
    #[test]
    fn device_state_without_a_transport() {
        let profile = Profile { doorbells: Doorbells::Socket, ..Profile::default() };
        let pool = PollerPool::spawn(&profile).unwrap();
        let placement = Placement::of_profile(&profile);
        let mut dev =
            DeviceState::on_pool(&profile, &pool, placement, Arc::new(Nothing), Arc::new(|| {})).unwrap();
        let mut id = [0u8; 4];
        dev.region_read(7, 0, &mut id).unwrap();
        assert_eq!(u32::from_le_bytes(id), 0x105a_1af4);
        assert!(dev.notify_memory().unwrap().is_none(), "doorbells are register writes");
        // A doorbell of queue 1 through the notify area is taken and counted.
        dev.region_write(pci::VIRTIO_BAR, pci::NOTIFY_OFFSET + 4, &1u16.to_le_bytes()).unwrap();
        assert_eq!(dev.stats().doorbells(), [0, 1]);
        assert!(matches!(dev.region_write(2, 0, &[0]), Err(AccessError::NoRegion(2))));

        assert_eq!(dev.msix_vectors(), 3, "config + hiprio + one request queue");
        let file = tempfile::tempfile().unwrap();
        let e = dev.set_irq_eventfds(0, 1, vec![file]).unwrap_err();
        assert!(matches!(e, ControlError::NotEventfd(0)) && e.errno() == libc::EINVAL, "{e}");
        let e = dev.set_irq_eventfds(2, 2, Vec::new()).unwrap_err();
        assert!(matches!(e, ControlError::NoVectors { start: 2, count: 2, vectors: 3 }), "{e}");
        dev.set_irq_eventfds(0, 3, Vec::new()).unwrap();
        // A trigger under a mask pends; the unmask delivers it.
        dev.mask_vectors(1, 1, None, true).unwrap();
        dev.trigger_vectors(0, 2, Some(&[false, true])).unwrap();
        assert!(dev.func.msix().is_pending(1) && !dev.func.msix().is_pending(0));
        dev.mask_vectors(0, 3, None, false).unwrap();
        assert!(!dev.func.msix().is_pending(1));

        let window = memory::memfd("test", 0x4000).unwrap();
        dev.dma_map(0x10000, 0x4000, 0, Some(window)).unwrap();
        let e = dev.dma_unmap(Some((0x40000, 0x1000))).unwrap_err();
        assert_eq!(ControlError::from(e).errno(), libc::ENOENT);
        dev.dma_unmap(Some((0x10000, 0x4000))).unwrap();
        dev.power_on_reset();
    }

    use crate::pci::QueueConfig;
    use vm_memory::Bytes;

    /// Serves each request with 4 bytes `[first readable byte; 4]`.
    struct Echo;
    impl RequestHandler for Echo {
        fn handle(
            &self,
            _: Taken,
            readable: &[VolatileSlice<'_>],
            writable: &[VolatileSlice<'_>],
        ) -> (u32, Tally) {
            let k = readable.first().and_then(|r| r.read_obj::<u8>(0).ok()).unwrap_or(0);
            (writable[0].write_slice(&[k; 4], 0).map_or(0, |()| 4), Tally::default())
        }
    }

    /// The driver side of the test: either layout over the window's memory.
    struct Drv<'m> {
        mem: &'m memory::GuestMem,
        split: crate::virtq::mock::SplitDriver<'m>,
        packed: crate::virtq::mock::PackedDriver<'m>,
        is_packed: bool,
        n: u16,
    }

    impl Drv<'_> {
        /// Makes a request available; its token.
        fn send(&mut self) -> u16 {
            use crate::virtq::mock::Buf;
            use vm_memory::{Bytes, GuestAddress};
            let at = 0x10000 + 0x100 * u64::from(self.n % 8);
            self.mem.write_obj(7u8, GuestAddress(at)).unwrap();
            let bufs = [Buf::readable(at, 16), Buf::writable(at + 0x80, 16)];
            let t = if self.is_packed { self.packed.push(&bufs, self.n % 8) } else { self.split.push(&bufs) };
            self.n += 1;
            t
        }

        fn used(&mut self) -> Option<(u16, u32)> {
            if self.is_packed {
                self.packed.next_used()
            } else {
                self.split.next_used()
            }
        }

        /// The next completion, waited for.
        fn wait_used(&mut self) -> (u16, u32) {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                if let Some(u) = self.used() {
                    return u;
                }
                assert!(std::time::Instant::now() < deadline, "no completion");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    fn common(d: &mut DeviceState, off: u64, len: usize, v: u64) {
        d.region_write(pci::VIRTIO_BAR, pci::COMMON_OFFSET + off, &v.to_le_bytes()[..len]).unwrap();
    }

    /// Every register byte a client reads: configuration space, the MSI-X table and PBA, and
    /// the common configuration of queue 1.
    fn registers(d: &mut DeviceState) -> Vec<u8> {
        let mut out = vec![0u8; 256 + 0x1000 + 0x38];
        d.region_read(7, 0, &mut out[..256]).unwrap();
        for (i, b) in out[256..256 + 0x1000].chunks_mut(4).enumerate() {
            d.region_read(1, 4 * i as u64, b).unwrap();
        }
        d.region_read(pci::VIRTIO_BAR, pci::COMMON_OFFSET, &mut out[256 + 0x1000..]).unwrap();
        out
    }

    /// Issue 22, a function's device handed over within one process, on both layouts: brought
    /// up through its registers with a DMA window and an interrupt eventfd, serving a driver;
    /// handed over at its quiet point (a request made then waits), its snapshot through JSON and
    /// its descriptors to a new device on other pollers, which reads the same registers, serves
    /// the waiting request and twelve more past the ring's end, and signals the queue's vector on
    /// taking over. A snapshot of another version is refused, and the old device serves on.
    #[test]
    fn a_device_hands_over_to_a_new_one_and_the_driver_goes_on() {
        use vm_memory::{FileOffset, GuestAddress};
        const SIZE: u64 = 0x20000;
        for is_packed in [false, true] {
            let layout = if is_packed { "packed" } else { "split" };
            let profile = Profile { doorbells: Doorbells::Socket, packed_ring: true, ..Profile::default() };
            let pool = PollerPool::spawn(&profile).unwrap();
            let placement = Placement::of_profile(&profile);
            let mut old =
                DeviceState::on_pool(&profile, &pool, placement.clone(), Arc::new(Echo), Arc::new(|| {}))
                    .unwrap();
            let window = memory::memfd("handover-test", SIZE).unwrap();
            let mem = memory::GuestMem::from_ranges_with_files([(
                GuestAddress(0),
                SIZE as usize,
                Some(FileOffset::new(window.try_clone().unwrap(), 0)),
            )])
            .unwrap();
            old.dma_map(0, SIZE, 0, Some(window)).unwrap();
            let irq = File::from(rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).unwrap());
            let irq_file = irq.try_clone().unwrap();
            // The eventfd's counter, read (and so cleared); 0 if nothing was signalled.
            let taken = |f: &File| {
                use std::io::Read;
                let mut b = [0u8; 8];
                (&*f).read(&mut b).map_or(0, |_| u64::from_ne_bytes(b))
            };
            old.set_irq_eventfds(2, 1, vec![irq_file]).unwrap();
            common(&mut old, 0x14, 1, 1 | 2);
            common(&mut old, 0x08, 4, 1);
            common(&mut old, 0x0c, 4, 1 | if is_packed { 4 } else { 0 }); // VERSION_1, RING_PACKED
            common(&mut old, 0x14, 1, 1 | 2 | 8);
            let cfg = QueueConfig { index: 1, size: 8, desc: 0x1000, avail: 0x2000, used: 0x3000, vector: 2 };
            common(&mut old, 0x16, 2, 1);
            common(&mut old, 0x18, 2, 8);
            common(&mut old, 0x1a, 2, 2);
            common(&mut old, 0x20, 8, cfg.desc);
            common(&mut old, 0x28, 8, cfg.avail);
            common(&mut old, 0x30, 8, cfg.used);
            common(&mut old, 0x1c, 2, 1);
            common(&mut old, 0x14, 1, 1 | 2 | 8 | 4);
            let mut drv = Drv {
                mem: &mem,
                split: crate::virtq::mock::SplitDriver::new(&mem, cfg),
                packed: crate::virtq::mock::PackedDriver::new(&mem, cfg),
                is_packed,
                n: 0,
            };
            for _ in 0..5 {
                let t = drv.send();
                assert_eq!(drv.wait_used(), (t, 4), "{layout}");
            }

            // A snapshot of another version: refused; the old device serves on.
            let mut h = old.hand_over().unwrap();
            h.snapshot.version += 1;
            let r = DeviceState::take_over(
                &profile,
                &pool,
                placement.clone(),
                Arc::new(Echo),
                Arc::new(|| {}),
                h,
            );
            assert!(matches!(r, Err(HandoverError::Version { .. })), "{layout}");
            old.resume_serving();
            let t = drv.send();
            assert_eq!(drv.wait_used(), (t, 4), "{layout}: the old device after a refused handover");

            let h = old.hand_over().unwrap();
            let waiting = drv.send();
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(drv.used(), None, "{layout}: a handed-over device took a request");
            let before = registers(&mut old);
            let snapshot: DeviceSnapshot =
                serde_json::from_str(&serde_json::to_string(&h.snapshot).unwrap()).unwrap();
            let h = DeviceHandover { snapshot, files: h.files };
            taken(&irq); // what the old device signalled
            let pool2 = PollerPool::spawn(&profile).unwrap();
            let mut new =
                DeviceState::take_over(&profile, &pool2, placement, Arc::new(Echo), Arc::new(|| {}), h)
                    .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(drv.used(), None, "{layout}: a taker not started took a request");
            drop(old);
            new.start_taken();
            assert_eq!(registers(&mut new), before, "{layout}: the registers read the same");
            assert!(taken(&irq) >= 1, "{layout}: the vector was signalled on taking over");
            assert_eq!(drv.wait_used(), (waiting, 4), "{layout}: the request made during the handover");
            for _ in 0..12 {
                let t = drv.send();
                assert_eq!(drv.wait_used(), (t, 4), "{layout}");
            }
            new.power_on_reset();
        }
    }
}
