//! The device side of a split virtqueue, with a strict, allocation-free descriptor walk.
//!
//! ```text
//! descriptor (16 bytes): le64 addr | le32 len | le16 flags (NEXT 1, WRITE 2, INDIRECT 4) | le16 next
//! avail ring: le16 flags (NO_INTERRUPT 1) | le16 idx | le16 ring[size] | le16 used_event
//! used ring:  le16 flags (NO_NOTIFY 1)    | le16 idx | {le32 id, le32 len}[size] | le16 avail_event
//! ```
//!
//! Why our own walk rather than `virtio_queue::DescriptorChain`: that iterator silently ends a
//! chain at an invalid descriptor (so a corrupt request would be served truncated), and its
//! `Reader`/`Writer` allocate per chain. Here every chain is validated up front — addresses inside
//! mapped memory, readable buffers before writable ones, no loops, well-formed indirect tables —
//! and a bad chain fails only its own request. A corrupt *ring* (an avail index that runs more
//! than a ring ahead, a head index out of range, rings outside guest memory) cannot be served at
//! all: the queue is marked broken and the device asks for a reset (DEVICE_NEEDS_RESET).

use std::sync::atomic::{fence, Ordering};

use virtio_bindings::virtio_ring as vr;
use vm_memory::{Bytes, GuestAddress};

use super::desc::{
    check_mapped, need_event, push_slices, Chain, ChainError, DescTable, QueueError, Signalled,
    DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE,
};
use super::track::{recover_split, QueueTrack};
use crate::memory::GuestMem;
use crate::pci::QueueConfig;

const AVAIL_F_NO_INTERRUPT: u16 = vr::VRING_AVAIL_F_NO_INTERRUPT as u16;
const USED_F_NO_NOTIFY: u16 = vr::VRING_USED_F_NO_NOTIFY as u16;

#[derive(Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

/// Descriptor `index` of `table` in the split layout (one 16-byte volatile load).
#[inline]
fn read_desc(table: &DescTable<'_>, index: u16) -> Option<Desc> {
    let (addr, len, flags, next) = table.get(index)?;
    Some(Desc { addr, len, flags, next })
}

/// A split virtqueue owned by one poller.
#[derive(Debug)]
pub struct SplitQueue {
    cfg: QueueConfig,
    event_idx: bool,
    indirect: bool,
    next_avail: u16,
    next_used: u16,
    /// Used entries published since the last interrupt, and the used index then.
    signalled: Signalled,
    /// Resumed from a saved state at these positions (used, avail): the used index `attach`
    /// finds must be the first.
    resumed: Option<(u16, u16)>,
    /// The in-flight record this queue keeps (crash recovery), if it keeps one.
    track: Option<QueueTrack>,
    /// Recovering after a crash: `attach` reads where the queue stood from the record.
    recovering: bool,
    /// Heads taken before a crash and not returned, to take again (oldest last).
    replay: Vec<u16>,
    /// The last take number given (in the record).
    seq: u32,
    /// Attached once already: a later attach (its rings mapped again after a DMA change)
    /// keeps the positions, with the chains still out.
    started: bool,
}

impl SplitQueue {
    /// A queue as configured by the driver, checked for alignment and size.
    pub fn new(cfg: QueueConfig, event_idx: bool, indirect: bool) -> Result<Self, QueueError> {
        let aligned =
            cfg.desc.is_multiple_of(16) && cfg.avail.is_multiple_of(2) && cfg.used.is_multiple_of(4);
        if !aligned || !cfg.size.is_power_of_two() {
            return Err(QueueError::BadConfig(cfg.index));
        }
        Ok(SplitQueue {
            cfg,
            event_idx,
            indirect,
            next_avail: 0,
            next_used: 0,
            signalled: Signalled::default(),
            resumed: None,
            track: None,
            recovering: false,
            replay: Vec::new(),
            seq: 0,
            started: false,
        })
    }

    /// Keeps `track` up to date from now on: each chain taken and each return written.
    pub fn keep_track(&mut self, track: QueueTrack) {
        self.track = Some(track);
    }

    /// Resumes where `track` says the queue stood when the process that served it died:
    /// `attach` reads it back, publishes the returns written, and the chains in flight are
    /// taken again ([`Self::replayed`]) before any new one.
    pub fn recover_from(&mut self, track: QueueTrack) {
        self.track = Some(track);
        self.recovering = true;
    }

    /// Numbers the next takes on from the record's (a record a predecessor kept).
    pub fn take_seq_from_track(&mut self) {
        if let Some(t) = &self.track {
            self.seq = t.max_seq();
        }
    }

    /// The next head taken before a crash and not returned, if any is left to take again.
    #[inline]
    pub fn replayed(&mut self) -> Option<u16> {
        self.replay.pop()
    }

    /// The queue as the driver configured it.
    pub fn config(&self) -> &QueueConfig {
        &self.cfg
    }

    /// The next avail and used positions: equal when every request taken was returned.
    pub(super) fn positions(&self) -> (u16, u16) {
        (self.next_avail, self.next_used)
    }

    /// Resumes at the positions a queue had at a quiet point: the next used position `used`
    /// and the next to take from, `avail` (beyond `used` by the requests still outstanding).
    /// `attach` then checks `used` against the used index in guest memory.
    pub(super) fn resume_at(&mut self, used: u16, avail: u16) {
        self.next_avail = avail;
        self.next_used = used;
        self.signalled.reset(used);
        self.resumed = Some((used, avail));
    }

    /// Checks the rings lie in mapped memory and tells the driver not to notify us (poll mode).
    pub fn attach(&mut self, mem: &GuestMem) -> Result<(), QueueError> {
        let q = self.cfg.index;
        let n = u64::from(self.cfg.size);
        let ranges = [(self.cfg.desc, 16 * n), (self.cfg.avail, 6 + 2 * n), (self.cfg.used, 6 + 8 * n)];
        check_mapped(mem, q, &ranges)?;
        if self.started {
            // Mapped again after a DMA change under a live queue: where it stands is unchanged
            // (reading the used index again would take the chains still out a second time).
            return self.set_notify(mem, false);
        }
        let used_flags = if self.event_idx { 0 } else { USED_F_NO_NOTIFY };
        mem.store(used_flags.to_le(), GuestAddress(self.cfg.used), Ordering::Relaxed)
            .map_err(|_| QueueError::RingUnmapped(q))?;
        // Pick up where the used ring is (0 after reset).
        let used_idx: u16 = mem
            .load(GuestAddress(self.cfg.used + 2), Ordering::Acquire)
            .map_err(|_| QueueError::RingUnmapped(q))?;
        let mut used_idx = u16::from_le(used_idx);
        let mut avail = used_idx;
        // Returns published here for a crashed predecessor: signalled by the next round
        // (whatever was signalled when the queues started, which may have come first).
        let mut published_here = false;
        if self.recovering {
            let track = self.track.as_ref().ok_or(QueueError::BadConfig(q))?;
            let r = recover_split(track, &self.cfg, mem).map_err(|e| e.queue_error(q))?;
            self.recovering = false;
            if r.next_used != r.published {
                // Returns written before the crash and not published: published now.
                fence(Ordering::Release);
                mem.store(r.next_used.to_le(), GuestAddress(self.cfg.used + 2), Ordering::Release)
                    .map_err(|_| QueueError::RingUnmapped(q))?;
            }
            used_idx = r.next_used;
            avail = r.next_avail;
            log::info!(
                "queue {q}: recovered: {} return(s) published, {} chain(s) in flight taken again",
                r.next_used.wrapping_sub(r.published),
                r.in_flight.len()
            );
            self.replay = r.in_flight;
            self.replay.reverse();
            self.seq = r.last_seq;
            published_here = r.next_used != r.published;
            if published_here {
                self.signalled.reset(r.published);
            }
        } else if let Some((at, taken)) = self.resumed.take() {
            if at != used_idx {
                // The saved state and the ring disagree: another writer moved the used index.
                return Err(QueueError::ResumeMismatch { queue: q, saved: at, found: used_idx });
            }
            // Requests taken before the handover and still outstanding are not taken again.
            avail = taken;
        }
        self.next_used = used_idx;
        self.next_avail = avail;
        if published_here {
            self.signalled.returned();
        } else {
            self.signalled.reset(self.next_used);
        }
        if let Some(t) = &self.track {
            t.positions(used_idx, avail, self.seq);
        }
        self.started = true;
        // Poll mode: no notifications (with EVENT_IDX, an avail_event the driver does not pass).
        self.set_notify(mem, false)
    }

    /// Asks the driver to notify after its next request (`on`, before the poller parks) or not
    /// to notify at all (while it polls). Without EVENT_IDX this is `VRING_USED_F_NO_NOTIFY`;
    /// with it, `avail_event`: the next index we will take (the driver rings when it makes that
    /// entry available), or one behind it, which the driver does not pass for another 65535
    /// requests. The caller orders this store before its next look at the avail index (a full
    /// fence), as the driver orders its avail index store before reading these fields.
    pub fn set_notify(&mut self, mem: &GuestMem, on: bool) -> Result<(), QueueError> {
        let q = self.cfg.index;
        if self.event_idx {
            let event = if on { self.next_avail } else { self.next_avail.wrapping_sub(1) };
            let at = GuestAddress(self.cfg.used + 4 + 8 * u64::from(self.cfg.size));
            mem.store(event.to_le(), at, Ordering::Relaxed).map_err(|_| QueueError::RingUnmapped(q))
        } else {
            let flags = if on { 0 } else { USED_F_NO_NOTIFY };
            mem.store(flags.to_le(), GuestAddress(self.cfg.used), Ordering::Relaxed)
                .map_err(|_| QueueError::RingUnmapped(q))
        }
    }

    /// Number of requests the driver has made available and we have not taken.
    #[inline]
    pub fn pending(&self, mem: &GuestMem) -> Result<u16, QueueError> {
        let q = self.cfg.index;
        let avail: u16 = mem
            .load(GuestAddress(self.cfg.avail + 2), Ordering::Acquire)
            .map_err(|_| QueueError::RingUnmapped(q))?;
        let avail = u16::from_le(avail);
        let ahead = avail.wrapping_sub(self.next_avail);
        if ahead > self.cfg.size {
            return Err(QueueError::AvailOverrun { queue: q, avail, ahead, size: self.cfg.size });
        }
        Ok(ahead.saturating_add(self.replay.len() as u16))
    }

    /// Takes the next available head index.
    #[inline]
    pub fn pop_head(&mut self, mem: &GuestMem) -> Result<u16, QueueError> {
        let q = self.cfg.index;
        let slot = u64::from(self.next_avail % self.cfg.size);
        let head: u16 = mem
            .load(GuestAddress(self.cfg.avail + 4 + 2 * slot), Ordering::Relaxed)
            .map_err(|_| QueueError::RingUnmapped(q))?;
        let head = u16::from_le(head);
        if head >= self.cfg.size {
            return Err(QueueError::BadHead { queue: q, head });
        }
        if let Some(t) = &self.track {
            self.seq = self.seq.wrapping_add(1).max(1);
            t.taken(head, self.next_avail, self.seq);
        }
        self.next_avail = self.next_avail.wrapping_add(1);
        Ok(head)
    }

    /// Validates the chain starting at `head` and maps its buffers into `chain` (cleared first;
    /// the caller reuses one `Chain` so that no 32 KiB buffer list is moved per request).
    #[inline]
    pub fn chain<'m>(&self, mem: &'m GuestMem, head: u16, chain: &mut Chain<'m>) -> Result<(), ChainError> {
        chain.head = head;
        chain.readable.clear();
        chain.writable.clear();
        // The ring's table was checked to be mapped at attach; memory changes re-attach.
        let mut table =
            DescTable::new(mem, self.cfg.desc, u32::from(self.cfg.size)).ok_or(ChainError::BadIndex(head))?;
        let mut table_len = self.cfg.size;
        let mut index = head;
        let mut indirect = false;
        let mut seen = 0u32;
        loop {
            seen += 1;
            if seen > u32::from(table_len) + u32::from(!indirect) {
                return Err(ChainError::Loop);
            }
            let d = read_desc(&table, index).ok_or(ChainError::BadIndex(index))?;
            if d.flags & DESC_F_INDIRECT != 0 {
                let bad =
                    !self.indirect || indirect || d.flags & DESC_F_NEXT != 0 || d.len == 0 || d.len % 16 != 0;
                let entries = d.len / 16;
                if bad || entries > u32::from(u16::MAX) {
                    return Err(ChainError::BadIndirect);
                }
                table = DescTable::new(mem, d.addr, entries)
                    .ok_or(ChainError::BadBuffer { addr: d.addr, len: d.len })?;
                (table_len, index, indirect, seen) = (entries as u16, 0, true, 0);
                continue;
            }
            let writable = d.flags & DESC_F_WRITE != 0;
            if !writable && !chain.writable.is_empty() {
                return Err(ChainError::ReadAfterWrite);
            }
            if d.len > 0 {
                let list = if writable { &mut chain.writable } else { &mut chain.readable };
                push_slices(mem, d.addr, d.len, list)?;
            }
            if d.flags & DESC_F_NEXT == 0 {
                return Ok(());
            }
            if d.next >= table_len {
                return Err(ChainError::BadIndex(d.next));
            }
            index = d.next;
        }
    }

    /// Returns a request to the driver with `len` bytes written.
    #[inline]
    pub fn push_used(&mut self, mem: &GuestMem, head: u16, len: u32) -> Result<(), QueueError> {
        let slot = u64::from(self.next_used % self.cfg.size);
        let at = GuestAddress(self.cfg.used + 4 + 8 * slot);
        let mut elem = [0u8; 8];
        elem[..4].copy_from_slice(&u32::from(head).to_le_bytes());
        elem[4..].copy_from_slice(&len.to_le_bytes());
        mem.write_slice(&elem, at).map_err(|_| QueueError::RingUnmapped(self.cfg.index))?;
        self.next_used = self.next_used.wrapping_add(1);
        if let Some(t) = &self.track {
            t.pushed(head, self.next_used);
        }
        Ok(())
    }

    /// Publishes the used entries pushed so far (one index store per poll round).
    #[inline]
    pub fn publish_used(&mut self, mem: &GuestMem) -> Result<(), QueueError> {
        fence(Ordering::Release);
        mem.store(self.next_used.to_le(), GuestAddress(self.cfg.used + 2), Ordering::Release)
            .map_err(|_| QueueError::RingUnmapped(self.cfg.index))?;
        self.signalled.returned();
        Ok(())
    }

    /// Whether the driver wants an interrupt for what was published since the last one.
    pub fn needs_interrupt(&mut self, mem: &GuestMem) -> bool {
        let Some((old, new)) = self.signalled.take(self.next_used) else {
            return false;
        };
        if self.event_idx {
            let at = GuestAddress(self.cfg.avail + 4 + 2 * u64::from(self.cfg.size));
            let Ok(event) = mem.load::<u16>(at, Ordering::Acquire) else {
                return true;
            };
            need_event(u16::from_le(event), new, old)
        } else {
            let flags = mem.load::<u16>(GuestAddress(self.cfg.avail), Ordering::Acquire).unwrap_or(0);
            u16::from_le(flags) & AVAIL_F_NO_INTERRUPT == 0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtq::mock::{guest_memory, Buf, SplitDriver};

    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;
    const INDIRECT: u64 = 0x5000;

    fn setup(size: u16) -> (std::sync::Arc<GuestMem>, QueueConfig) {
        let mem = guest_memory(0x20000, None);
        (mem, QueueConfig { index: 1, size, desc: DESC, avail: AVAIL, used: USED, vector: 1 })
    }

    fn queue(mem: &GuestMem, cfg: QueueConfig) -> SplitQueue {
        let mut q = SplitQueue::new(cfg, true, true).unwrap();
        q.attach(mem).unwrap();
        q
    }

    #[test]
    fn simple_chain_roundtrip() {
        let (mem, cfg) = setup(8);
        let mut drv = SplitDriver::new(&mem, cfg);
        let mut q = queue(&mem, cfg);
        drv.push(&[Buf::readable(0x8000, 40), Buf::writable(0x9000, 100)]);
        assert_eq!(q.pending(&mem), Ok(1));
        let h = q.pop_head(&mem).unwrap();
        let mut c = Chain::default();
        q.chain(&mem, h, &mut c).unwrap();
        assert_eq!((c.readable.len(), c.writable.len()), (1, 1));
        assert_eq!((c.readable[0].len(), c.writable[0].len()), (40, 100));
        q.push_used(&mem, h, 16).unwrap();
        assert_eq!(drv.next_used(), None, "not published yet");
        q.publish_used(&mem).unwrap();
        assert_eq!(drv.next_used(), Some((h, 16)));
        // used_event = 0: the driver wants an interrupt for entry 0.
        assert!(q.needs_interrupt(&mem));
        assert!(!q.needs_interrupt(&mem), "nothing new");
    }

    #[test]
    fn indirect_chain() {
        let (mem, cfg) = setup(8);
        let mut drv = SplitDriver::new(&mem, cfg).with_indirect_at(INDIRECT);
        let q = queue(&mem, cfg);
        let bufs = [Buf::readable(0x8000, 40), Buf::writable(0x9000, 4096), Buf::writable(0xa000, 4096)];
        let head = drv.add_indirect(&bufs);
        let mut c = Chain::default();
        q.chain(&mem, head, &mut c).unwrap();
        assert_eq!((c.readable.len(), c.writable.len()), (1, 2));
    }

    #[test]
    fn malformed_chains_fail_alone() {
        let (mem, cfg) = setup(8);
        let drv = SplitDriver::new(&mem, cfg);
        let q = queue(&mem, cfg);
        let d = |i, addr, len, flags, next| drv.write_desc(DESC, i, addr, len, flags, next);
        let ind = |i, addr, len, flags, next| drv.write_desc(INDIRECT, i, addr, len, flags, next);
        // Loop: 0 -> 1 -> 0.
        d(0, 0x8000, 8, DESC_F_NEXT, 1);
        d(1, 0x8000, 8, DESC_F_NEXT, 0);
        assert_eq!(q.chain(&mem, 0, &mut Chain::default()).err(), Some(ChainError::Loop));
        // next out of range.
        d(2, 0x8000, 8, DESC_F_NEXT, 99);
        assert_eq!(q.chain(&mem, 2, &mut Chain::default()).err(), Some(ChainError::BadIndex(99)));
        // readable after writable.
        d(3, 0x8000, 8, DESC_F_WRITE | DESC_F_NEXT, 4);
        d(4, 0x8000, 8, 0, 0);
        assert_eq!(q.chain(&mem, 3, &mut Chain::default()).err(), Some(ChainError::ReadAfterWrite));
        // buffer outside memory, and one that wraps the address space.
        d(5, 0x1f000, 0x2000, 0, 0);
        assert!(matches!(q.chain(&mem, 5, &mut Chain::default()), Err(ChainError::BadBuffer { .. })));
        d(5, u64::MAX - 4, 100, 0, 0);
        assert!(matches!(q.chain(&mem, 5, &mut Chain::default()), Err(ChainError::BadBuffer { .. })));
        // indirect with NEXT, nested indirect, bad size.
        d(6, INDIRECT, 32, DESC_F_INDIRECT | DESC_F_NEXT, 7);
        assert_eq!(q.chain(&mem, 6, &mut Chain::default()).err(), Some(ChainError::BadIndirect));
        ind(0, 0x6000, 16, DESC_F_INDIRECT, 0);
        d(6, INDIRECT, 16, DESC_F_INDIRECT, 0);
        assert_eq!(q.chain(&mem, 6, &mut Chain::default()).err(), Some(ChainError::BadIndirect));
        d(6, INDIRECT, 17, DESC_F_INDIRECT, 0);
        assert_eq!(q.chain(&mem, 6, &mut Chain::default()).err(), Some(ChainError::BadIndirect));
        // Loop inside an indirect table.
        ind(0, 0x8000, 8, DESC_F_NEXT, 1);
        ind(1, 0x8000, 8, DESC_F_NEXT, 0);
        d(7, INDIRECT, 32, DESC_F_INDIRECT, 0);
        assert_eq!(q.chain(&mem, 7, &mut Chain::default()).err(), Some(ChainError::Loop));
        // Indirect descriptors not negotiated.
        let mut plain = SplitQueue::new(cfg, true, false).unwrap();
        plain.attach(&mem).unwrap();
        d(6, INDIRECT, 16, DESC_F_INDIRECT, 0);
        ind(0, 0x8000, 8, 0, 0);
        assert_eq!(plain.chain(&mem, 6, &mut Chain::default()).err(), Some(ChainError::BadIndirect));
    }

    #[test]
    fn corrupt_rings_break_the_queue() {
        let (mem, cfg) = setup(8);
        let mut drv = SplitDriver::new(&mem, cfg);
        let mut q = queue(&mem, cfg);
        drv.set_avail_idx(9);
        assert!(matches!(q.pending(&mem), Err(QueueError::AvailOverrun { .. })));
        drv.set_avail_idx(0);
        drv.make_available(8);
        assert_eq!(q.pop_head(&mem), Err(QueueError::BadHead { queue: 1, head: 8 }));
        let cfg = QueueConfig { index: 2, size: 6, desc: DESC, avail: AVAIL, used: USED, vector: 0 };
        assert_eq!(SplitQueue::new(cfg, false, false).err(), Some(QueueError::BadConfig(2)));
        let cfg = QueueConfig { index: 2, size: 8, desc: 0x1ffc0, avail: AVAIL, used: USED, vector: 0 };
        let mut far = SplitQueue::new(cfg, false, false).unwrap();
        assert_eq!(far.attach(&mem), Err(QueueError::RingUnmapped(2)));
    }

    #[test]
    fn event_idx_suppresses() {
        let (mem, cfg) = setup(8);
        let drv = SplitDriver::new(&mem, cfg);
        let mut q = queue(&mem, cfg);
        // Driver asks for an interrupt only after entry 2 (used_event = 2).
        drv.set_used_event(2);
        for _ in 0..2 {
            q.push_used(&mem, 0, 0).unwrap();
            q.publish_used(&mem).unwrap();
            assert!(!q.needs_interrupt(&mem));
        }
        q.push_used(&mem, 0, 0).unwrap();
        q.publish_used(&mem).unwrap();
        assert!(q.needs_interrupt(&mem));
    }

    #[test]
    fn notification_suppression_fields() {
        let (mem, cfg) = setup(8);
        let mut drv = SplitDriver::new(&mem, cfg);
        // EVENT_IDX: avail_event one behind the next index taken while polling, at it when parked.
        let mut q = queue(&mem, cfg);
        assert_eq!(drv.avail_event(), u16::MAX);
        drv.push(&[Buf::writable(0x9000, 8)]);
        assert!(q.pending(&mem).unwrap() == 1 && q.pop_head(&mem).is_ok());
        q.set_notify(&mem, true).unwrap();
        assert_eq!(drv.avail_event(), 1);
        q.set_notify(&mem, false).unwrap();
        assert_eq!(drv.avail_event(), 0);
        // Without EVENT_IDX: VRING_USED_F_NO_NOTIFY, and the driver's NO_INTERRUPT is obeyed.
        let mut q = SplitQueue::new(cfg, false, false).unwrap();
        q.attach(&mem).unwrap();
        assert_eq!(drv.used_flags(), USED_F_NO_NOTIFY);
        q.set_notify(&mem, true).unwrap();
        assert_eq!(drv.used_flags(), 0);
        drv.set_avail_flags(AVAIL_F_NO_INTERRUPT);
        q.push_used(&mem, 0, 0).unwrap();
        q.publish_used(&mem).unwrap();
        assert!(!q.needs_interrupt(&mem));
        drv.set_avail_flags(0);
        q.push_used(&mem, 0, 0).unwrap();
        q.publish_used(&mem).unwrap();
        assert!(q.needs_interrupt(&mem));
    }

    /// Rings built by `virtio-queue`'s own driver mock (independent of ours), served by our
    /// queue: direct chains, an indirect table in a second DMA window, used entries read back
    /// through that mock's used ring.
    #[test]
    fn rings_from_virtio_queue_mock() {
        use virtio_queue::desc::{split::Descriptor, RawDescriptor};
        use virtio_queue::mock::MockSplitQueue;
        // virtio-queue's mock puts indirect tables at 0x3000_0000.
        let mem = guest_memory(0x20000, Some((0x3000_0000, 0x10000)));
        let mut vq = MockSplitQueue::create(&*mem, GuestAddress(0x1000), 16);
        let raw = |addr, len, flags, next| RawDescriptor::from(Descriptor::new(addr, len, flags, next));
        // Its descriptor allocator hands out index 0 to every chain it builds, so its indirect
        // chain goes first and our chains after it (from index 1).
        vq.add_indirect_chain(3).unwrap();
        vq.add_desc_chains(
            &[
                raw(0x8000, 40, DESC_F_NEXT, 2),
                raw(0x9000, 100, DESC_F_WRITE, 0),
                raw(0xa000, 64, DESC_F_WRITE, 0),
            ],
            1,
        )
        .unwrap();
        let cfg = QueueConfig {
            index: 1,
            size: 16,
            desc: vq.desc_table_addr().0,
            avail: vq.avail_addr().0,
            used: vq.used_addr().0,
            vector: 1,
        };
        let mut q = SplitQueue::new(cfg, false, true).unwrap();
        q.attach(&mem).unwrap();
        assert_eq!(q.pending(&mem), Ok(3));
        let mut c = Chain::default();
        let mut heads = Vec::new();
        let mut shapes = Vec::new();
        for _ in 0..3 {
            let h = q.pop_head(&mem).unwrap();
            q.chain(&mem, h, &mut c).unwrap();
            shapes.push((c.readable.len(), c.writable.len()));
            heads.push(h);
        }
        assert_eq!(heads, [0, 1, 3]);
        assert_eq!(shapes, [(3, 0), (1, 1), (0, 1)], "virtio-queue's indirect chain: 3 readable buffers");
        // Out of order, as an engine completes them.
        for (&h, len) in heads.iter().rev().zip([64u32, 100, 0]) {
            q.push_used(&mem, h, len).unwrap();
        }
        q.publish_used(&mem).unwrap();
        assert_eq!(vq.used().idx().load(), 3);
        let first = vq.used().ring().ref_at(0).unwrap().load();
        assert_eq!((first.id(), first.len()), (3, 64));
        let last = vq.used().ring().ref_at(2).unwrap().load();
        assert_eq!((last.id(), last.len()), (0, 0));
    }
}
