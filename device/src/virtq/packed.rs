//! The device side of a packed virtqueue (VIRTIO_F_RING_PACKED, virtio 1.1 section 2.7).
//!
//! ```text
//! descriptor ring (queue_desc): {le64 addr, le32 len, le16 id, le16 flags}[size]
//!     flags: NEXT 1, WRITE 2, INDIRECT 4, AVAIL 1<<7, USED 1<<15
//! driver event suppression (queue_driver): le16 off_wrap | le16 flags (0 enable, 1 disable, 2 desc)
//! device event suppression (queue_device): same layout, written by the device
//! ```
//! A descriptor is available when its AVAIL bit equals the device's avail wrap counter and its
//! USED bit does not. A chain continues in the following ring slots while NEXT is set; its buffer
//! id is in the last descriptor. The device returns a buffer by writing one used descriptor (id,
//! written length, AVAIL = USED = used wrap counter) at its used position, and moves that position
//! on by the number of ring slots the chain took, so buffers may complete out of order. The same
//! validation as for split rings applies: a bad chain fails its request, a corrupt ring (a chain
//! that never ends) stops the queue.

use std::sync::atomic::{fence, Ordering};

use virtio_bindings::virtio_ring as vr;
use vm_memory::{Bytes, GuestAddress};

use super::desc::{
    check_mapped, need_event, push_slices, Chain, ChainError, DescTable, QueueError, Signalled,
};
use super::desc::{DESC_F_INDIRECT as F_INDIRECT, DESC_F_NEXT as F_NEXT, DESC_F_WRITE as F_WRITE};
use super::desc::{
    PACKED_EVENT_DESC as EVENT_DESC, PACKED_EVENT_DISABLE as EVENT_DISABLE,
    PACKED_EVENT_ENABLE as EVENT_ENABLE, PACKED_F_AVAIL as F_AVAIL, PACKED_F_USED as F_USED,
};
use super::track::{recover_packed, PackedInFlight, QueueTrack, PACKED_DESCS};
use crate::memory::GuestMem;
use crate::pci::QueueConfig;

/// The wrap-counter bit of an event suppression `off_wrap`.
const EVENT_F_WRAP_CTR: u32 = vr::VRING_PACKED_EVENT_F_WRAP_CTR;

#[derive(Clone, Copy)]
struct PDesc {
    addr: u64,
    len: u32,
    id: u16,
    flags: u16,
}

/// Descriptor `index` of `table` in the packed layout (one 16-byte volatile load).
#[inline]
fn read_pdesc(table: &DescTable<'_>, index: u16) -> Option<PDesc> {
    let (addr, len, id, flags) = table.get(index)?;
    Some(PDesc { addr, len, id, flags })
}

/// Moves a ring position `n` slots on, flipping its wrap counter when it passes the end.
#[inline]
fn advance(pos: &mut u16, wrap: &mut bool, n: u16, size: u16) {
    let next = u32::from(*pos) + u32::from(n);
    if next >= u32::from(size) {
        *wrap = !*wrap;
        *pos = (next - u32::from(size)) as u16;
    } else {
        *pos = next as u16;
    }
}

/// A packed virtqueue owned by one poller.
#[derive(Debug)]
pub struct PackedQueue {
    cfg: QueueConfig,
    event_idx: bool,
    indirect: bool,
    next_avail: u16,
    avail_wrap: bool,
    next_used: u16,
    used_wrap: bool,
    /// Ring slots taken by each outstanding buffer id (to advance the used position).
    slots: Box<[u16]>,
    /// Buffers returned since the last interrupt, and the used position then.
    signalled: Signalled,
    /// The in-flight record this queue keeps (crash recovery), if it keeps one.
    track: Option<QueueTrack>,
    /// Recovering after a crash: `attach` reads where the queue stood from the record.
    recovering: bool,
    /// Buffers taken before a crash and not returned, to take again (oldest last).
    replay: Vec<PackedInFlight>,
    /// Each outstanding buffer id's take number (in the record), and the last one given.
    seqs: Box<[u32]>,
    seq: u32,
}

impl PackedQueue {
    /// A queue as configured by the driver (any size from 1 to 32768; 16-byte aligned ring).
    pub fn new(cfg: QueueConfig, event_idx: bool, indirect: bool) -> Result<Self, QueueError> {
        let aligned =
            cfg.desc.is_multiple_of(16) && cfg.avail.is_multiple_of(4) && cfg.used.is_multiple_of(4);
        if !aligned || cfg.size == 0 || cfg.size > 32768 {
            return Err(QueueError::BadConfig(cfg.index));
        }
        Ok(PackedQueue {
            cfg,
            event_idx,
            indirect,
            next_avail: 0,
            avail_wrap: true,
            next_used: 0,
            used_wrap: true,
            slots: vec![0; usize::from(cfg.size)].into_boxed_slice(),
            signalled: Signalled::default(),
            track: None,
            recovering: false,
            replay: Vec::new(),
            seqs: vec![0; usize::from(cfg.size)].into_boxed_slice(),
            seq: 0,
        })
    }

    /// Keeps `track` up to date from now on: each buffer taken (with a copy of its chain's
    /// descriptors) and each return written.
    pub fn keep_track(&mut self, track: QueueTrack) {
        self.track = Some(track);
    }

    /// Takes the take numbers of the buffers still out from the record (a record a
    /// predecessor kept), and numbers new takes on from them.
    pub fn take_seqs_from_track(&mut self) {
        let Some(t) = &self.track else { return };
        for id in 0..self.cfg.size {
            if self.slots[usize::from(id)] > 0 {
                if let Some(seq) = t.packed_seq(id) {
                    self.seqs[usize::from(id)] = seq;
                }
            }
        }
        self.seq = t.max_seq();
    }

    /// Resumes where `track` says the queue stood when the process that served it died:
    /// `attach` reads it back, and the buffers in flight are taken again (from the record's
    /// copies of their chains) before any new one.
    pub fn recover_from(&mut self, track: QueueTrack) {
        self.track = Some(track);
        self.recovering = true;
    }

    /// The queue as the driver configured it.
    pub fn config(&self) -> &QueueConfig {
        &self.cfg
    }

    /// The next avail and used positions with their wrap counters: equal when every buffer
    /// taken was returned.
    pub(super) fn positions(&self) -> ((u16, bool), (u16, bool)) {
        ((self.next_avail, self.avail_wrap), (self.next_used, self.used_wrap))
    }

    /// Resumes at the positions a queue had at a quiet point: the next used position `used`,
    /// the next to take from `avail`, and the buffers still outstanding (id, ring slots its
    /// chain took; checked by the caller to lie in the ring).
    pub(super) fn resume_at(&mut self, used: (u16, bool), avail: (u16, bool), out: &[(u16, u16)]) {
        (self.next_avail, self.avail_wrap) = avail;
        (self.next_used, self.used_wrap) = used;
        self.slots.iter_mut().for_each(|s| *s = 0);
        for &(id, n) in out {
            if let Some(s) = self.slots.get_mut(usize::from(id)) {
                *s = n;
            }
        }
        self.signalled.reset(used.0);
    }

    /// The buffers taken and not returned: (id, ring slots its chain took).
    pub(super) fn outstanding(&self) -> Vec<(u16, u16)> {
        (self.slots.iter().enumerate()).filter(|(_, &n)| n > 0).map(|(id, &n)| (id as u16, n)).collect()
    }

    /// Checks the ring and event areas lie in mapped memory and disables driver notifications.
    pub fn attach(&mut self, mem: &GuestMem) -> Result<(), QueueError> {
        let q = self.cfg.index;
        let ranges =
            [(self.cfg.desc, 16 * u64::from(self.cfg.size)), (self.cfg.avail, 4), (self.cfg.used, 4)];
        check_mapped(mem, q, &ranges)?;
        if self.recovering {
            let track = self.track.as_ref().ok_or(QueueError::BadConfig(q))?;
            let r = recover_packed(track, &self.cfg, mem).map_err(|e| e.queue_error(q))?;
            self.recovering = false;
            log::info!("queue {q}: recovered: {} chain(s) in flight taken again", r.in_flight.len());
            (self.next_used, self.used_wrap) = r.next_used;
            (self.next_avail, self.avail_wrap) = r.next_avail;
            self.slots.iter_mut().for_each(|s| *s = 0);
            for b in &r.in_flight {
                self.slots[usize::from(b.id)] = b.slots;
                self.seqs[usize::from(b.id)] = b.seq;
            }
            self.seq = r.last_seq;
            self.signalled.reset(self.next_used);
            self.replay = r.in_flight;
            self.replay.reverse();
        } else if let Some(t) = &self.track {
            t.packed_positions(
                (self.next_used, self.used_wrap),
                (self.next_avail, self.avail_wrap),
                self.seq,
            );
        }
        // Poll mode: the device never wants a notification.
        self.set_notify(mem, false)
    }

    /// Device event suppression: ENABLE (`on`: the driver notifies after each batch, before the
    /// poller parks) or DISABLE (while it polls). The caller fences before its next look at the
    /// ring.
    pub fn set_notify(&mut self, mem: &GuestMem, on: bool) -> Result<(), QueueError> {
        let flags = if on { EVENT_ENABLE } else { EVENT_DISABLE };
        mem.store(flags.to_le(), GuestAddress(self.cfg.used + 2), Ordering::Release)
            .map_err(|_| QueueError::RingUnmapped(self.cfg.index))
    }

    fn desc_available(&self, flags: u16) -> bool {
        (flags & F_AVAIL != 0) == self.avail_wrap && (flags & F_USED != 0) != self.avail_wrap
    }

    fn advance_avail(&mut self, n: u16) {
        advance(&mut self.next_avail, &mut self.avail_wrap, n, self.cfg.size);
    }

    /// Whether buffers taken before a crash are left to take again: [`Self::next`] takes them
    /// first, from the record's copies.
    #[inline]
    pub fn replaying(&self) -> bool {
        !self.replay.is_empty()
    }

    /// Whether the next ring slot holds an available buffer.
    #[inline]
    pub fn has_work(&self, mem: &GuestMem) -> Result<bool, QueueError> {
        if !self.replay.is_empty() {
            return Ok(true);
        }
        let at = GuestAddress(self.cfg.desc + 16 * u64::from(self.next_avail) + 14);
        let flags: u16 =
            mem.load(at, Ordering::Acquire).map_err(|_| QueueError::RingUnmapped(self.cfg.index))?;
        Ok(self.desc_available(u16::from_le(flags)))
    }

    /// Takes the next available buffer into `chain` (`chain.head` = buffer id). `Ok(None)`: none
    /// available; `Ok(Some(Err))`: a malformed chain, to be returned unserved.
    #[inline]
    pub fn next<'m>(
        &mut self,
        mem: &'m GuestMem,
        chain: &mut Chain<'m>,
    ) -> Result<Option<Result<(), ChainError>>, QueueError> {
        let q = self.cfg.index;
        let size = self.cfg.size;
        if let Some(b) = self.replay.pop() {
            // Taken before a crash: its chain from the record's copy (the ring's slots may hold
            // used descriptors by now).
            chain.readable.clear();
            chain.writable.clear();
            chain.head = b.id;
            let Some(descs) = b.descs else { return Ok(Some(Err(ChainError::BadIndirect))) };
            for raw in &descs {
                let d = PDesc {
                    addr: u64::from_le_bytes(raw[..8].try_into().unwrap_or_default()),
                    len: u32::from_le_bytes(raw[8..12].try_into().unwrap_or_default()),
                    id: u16::from_le_bytes([raw[12], raw[13]]),
                    flags: u16::from_le_bytes([raw[14], raw[15]]),
                };
                if let Err(e) = self.take_desc(mem, &d, chain) {
                    return Ok(Some(Err(e)));
                }
            }
            return Ok(Some(Ok(())));
        }
        let ring = DescTable::new(mem, self.cfg.desc, u32::from(size)).ok_or(QueueError::RingUnmapped(q))?;
        if !self.has_work(mem)? {
            return Ok(None);
        }
        let start = (self.next_avail, self.avail_wrap);
        let mut copies = [[0u8; 16]; PACKED_DESCS + 1];
        // Order the flags read before the rest of the chain (the driver writes the head's flags
        // last): the head descriptor is read again below, after the fence, so its address and
        // length cannot be older than its flags.
        fence(Ordering::Acquire);
        chain.readable.clear();
        chain.writable.clear();
        let mut error = None;
        let mut slot = self.next_avail;
        let mut taken: u16 = 0;
        let id;
        loop {
            let d = read_pdesc(&ring, slot).ok_or(QueueError::RingUnmapped(q))?;
            if self.track.is_some() {
                if let Some(c) = copies.get_mut(usize::from(taken)) {
                    c[..8].copy_from_slice(&d.addr.to_le_bytes());
                    c[8..12].copy_from_slice(&d.len.to_le_bytes());
                    c[12..14].copy_from_slice(&d.id.to_le_bytes());
                    c[14..].copy_from_slice(&d.flags.to_le_bytes());
                }
            }
            taken += 1;
            if error.is_none() {
                error = self.take_desc(mem, &d, chain).err();
            }
            if d.flags & F_NEXT == 0 {
                id = d.id;
                break;
            }
            if taken >= size {
                // The chain never ends inside the ring: the driver corrupted it.
                return Err(QueueError::BadHead { queue: q, head: self.next_avail });
            }
            slot = if slot + 1 == size { 0 } else { slot + 1 };
        }
        if id >= size {
            return Err(QueueError::BadHead { queue: q, head: id });
        }
        self.slots[usize::from(id)] = taken;
        self.advance_avail(taken);
        if let Some(t) = &self.track {
            self.seq = self.seq.wrapping_add(1).max(1);
            self.seqs[usize::from(id)] = self.seq;
            let n = usize::from(taken).min(PACKED_DESCS + 1);
            t.packed_taken(id, self.seq, start, &copies[..n], taken, (self.next_avail, self.avail_wrap));
        }
        chain.head = id;
        Ok(Some(error.map_or(Ok(()), Err)))
    }

    fn take_desc<'m>(&self, mem: &'m GuestMem, d: &PDesc, chain: &mut Chain<'m>) -> Result<(), ChainError> {
        if d.flags & F_INDIRECT != 0 {
            if !self.indirect || d.flags & F_NEXT != 0 || d.len == 0 || !d.len.is_multiple_of(16) {
                return Err(ChainError::BadIndirect);
            }
            let entries = d.len / 16;
            if entries > 1 << 16 {
                return Err(ChainError::BadIndirect);
            }
            let bad = ChainError::BadBuffer { addr: d.addr, len: d.len };
            let table = DescTable::new(mem, d.addr, entries).ok_or(bad)?;
            for i in 0..entries as u16 {
                let e = read_pdesc(&table, i).ok_or(bad)?;
                if e.flags & F_INDIRECT != 0 {
                    return Err(ChainError::BadIndirect);
                }
                Self::take_buffer(mem, &e, chain)?;
            }
            return Ok(());
        }
        Self::take_buffer(mem, d, chain)
    }

    fn take_buffer<'m>(mem: &'m GuestMem, d: &PDesc, chain: &mut Chain<'m>) -> Result<(), ChainError> {
        let writable = d.flags & F_WRITE != 0;
        if !writable && !chain.writable.is_empty() {
            return Err(ChainError::ReadAfterWrite);
        }
        if d.len > 0 {
            let list = if writable { &mut chain.writable } else { &mut chain.readable };
            push_slices(mem, d.addr, d.len, list)?;
        }
        Ok(())
    }

    /// Returns buffer `id` with `len` bytes written.
    #[inline]
    pub fn push_used(&mut self, mem: &GuestMem, id: u16, len: u32) -> Result<(), QueueError> {
        let q = self.cfg.index;
        let taken = self.slots.get(usize::from(id)).copied().unwrap_or(0);
        if taken == 0 {
            return Err(QueueError::BadHead { queue: q, head: id });
        }
        self.slots[usize::from(id)] = 0;
        let at = self.cfg.desc + 16 * u64::from(self.next_used);
        // id and len first; the flags, which hand the slot back, after a release barrier.
        mem.write_slice(&len.to_le_bytes(), GuestAddress(at + 8)).map_err(|_| QueueError::RingUnmapped(q))?;
        mem.write_slice(&id.to_le_bytes(), GuestAddress(at + 12)).map_err(|_| QueueError::RingUnmapped(q))?;
        let mut flags = if self.used_wrap { F_AVAIL | F_USED } else { 0 };
        if len > 0 {
            flags |= F_WRITE;
        }
        fence(Ordering::Release);
        mem.store(flags.to_le(), GuestAddress(at + 14), Ordering::Release)
            .map_err(|_| QueueError::RingUnmapped(q))?;
        advance(&mut self.next_used, &mut self.used_wrap, taken, self.cfg.size);
        if let Some(t) = &self.track {
            t.packed_pushed(id, self.seqs[usize::from(id)], (self.next_used, self.used_wrap));
        }
        self.signalled.returned();
        Ok(())
    }

    /// Whether the driver wants an interrupt for the buffers returned since the last one.
    pub fn needs_interrupt(&mut self, mem: &GuestMem) -> bool {
        let Some((old, new)) = self.signalled.take(self.next_used) else {
            return false;
        };
        let mut raw = [0u8; 4];
        if mem.read_slice(&mut raw, GuestAddress(self.cfg.avail)).is_err() {
            return true;
        }
        let off_wrap = u16::from_le_bytes([raw[0], raw[1]]);
        match u16::from_le_bytes([raw[2], raw[3]]) {
            EVENT_DISABLE => false,
            EVENT_DESC if self.event_idx => {
                let mut off = off_wrap & !(1 << EVENT_F_WRAP_CTR);
                if (off_wrap >> EVENT_F_WRAP_CTR != 0) != self.used_wrap {
                    off = off.wrapping_sub(self.cfg.size);
                }
                need_event(off, new, old)
            }
            EVENT_ENABLE | EVENT_DESC => true,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtq::mock::{guest_memory, Buf, PackedDriver};

    const RING: u64 = 0x1000;
    const DRV: u64 = 0x2000;
    const DEV: u64 = 0x3000;

    fn setup(size: u16, event_idx: bool) -> (std::sync::Arc<GuestMem>, QueueConfig, PackedQueue) {
        let mem = guest_memory(0x20000, None);
        let cfg = QueueConfig { index: 1, size, desc: RING, avail: DRV, used: DEV, vector: 1 };
        let q = PackedQueue::new(cfg, event_idx, true).unwrap();
        (mem, cfg, q)
    }

    #[test]
    fn chains_wrap_and_complete_out_of_order() {
        let (mem, cfg, mut q) = setup(4, false);
        let mut drv = PackedDriver::new(&mem, cfg);
        q.attach(&mem).unwrap();
        assert_eq!(drv.device_event_flags(), EVENT_DISABLE);
        let mut c = Chain::default();
        assert!(q.next(&mem, &mut c).unwrap().is_none(), "empty ring");
        // Chain A (id 0): 2 descriptors; chain B (id 1): 1.
        drv.push(&[Buf::readable(0x8000, 40), Buf::writable(0x9000, 100)], 0);
        drv.push(&[Buf::writable(0xa000, 64)], 1);
        q.next(&mem, &mut c).unwrap().unwrap().unwrap();
        assert_eq!((c.head, c.readable.len(), c.writable.len()), (0, 1, 1));
        q.next(&mem, &mut c).unwrap().unwrap().unwrap();
        assert_eq!((c.head, c.readable.len(), c.writable.len()), (1, 0, 1));
        assert!(q.next(&mem, &mut c).unwrap().is_none());
        // Complete B first: used descriptor at slot 0, then A at slot 1.
        q.push_used(&mem, 1, 8).unwrap();
        assert_eq!(drv.flags_at(0) & (F_AVAIL | F_USED), F_AVAIL | F_USED);
        assert_eq!(drv.next_used(), Some((1, 8)));
        q.push_used(&mem, 0, 16).unwrap();
        assert_eq!(drv.next_used(), Some((0, 16)));
        assert_eq!(drv.next_used(), None);
        // Next round wraps: slot 3 then slot 0 with the flipped wrap counter.
        drv.push(&[Buf::readable(0x8000, 8), Buf::writable(0x9000, 8)], 2);
        assert_eq!(drv.flags_at(0) & (F_AVAIL | F_USED), F_USED, "driver wrap counter 0");
        q.next(&mem, &mut c).unwrap().unwrap().unwrap();
        assert_eq!((c.head, c.readable.len(), c.writable.len()), (2, 1, 1));
        q.push_used(&mem, 2, 0).unwrap();
        // Used position was 3 (after 1 + 2 slots); this used entry is at slot 3 with wrap=1.
        assert_eq!(drv.flags_at(3) & (F_AVAIL | F_USED), F_AVAIL | F_USED);
        assert_eq!(drv.next_used(), Some((2, 0)));
        assert!(q.push_used(&mem, 2, 0).is_err(), "a buffer is returned only once");
        // Another lap on the flipped counters: the device's used wrap is 0 now.
        drv.push(&[Buf::writable(0x9000, 8)], 3);
        q.next(&mem, &mut c).unwrap().unwrap().unwrap();
        q.push_used(&mem, 3, 4).unwrap();
        assert_eq!(drv.next_used(), Some((3, 4)));
    }

    #[test]
    fn indirect_and_malformed() {
        let (mem, cfg, mut q) = setup(8, false);
        let mut drv = PackedDriver::new(&mem, cfg).with_indirect_at(0x5000);
        q.attach(&mem).unwrap();
        let mut c = Chain::default();
        drv.push_indirect(&[Buf::readable(0x8000, 40), Buf::writable(0x9000, 4096)], 3);
        q.next(&mem, &mut c).unwrap().unwrap().unwrap();
        assert_eq!((c.head, c.readable.len(), c.writable.len()), (3, 1, 1));
        // Readable after writable: the request fails, the ring goes on.
        drv.push(&[Buf::writable(0x9000, 8), Buf::readable(0x8000, 8)], 4);
        assert_eq!(q.next(&mem, &mut c).unwrap().unwrap(), Err(ChainError::ReadAfterWrite));
        assert_eq!(c.head, 4);
        // Buffer outside memory.
        drv.push(&[Buf::readable(0x1f000, 0x2000)], 5);
        assert!(matches!(q.next(&mem, &mut c).unwrap().unwrap(), Err(ChainError::BadBuffer { .. })));
        // Indirect combined with NEXT.
        drv.push_raw(&[(0x5000, 32, F_INDIRECT | F_NEXT), (0x8000, 8, 0)], 6);
        assert_eq!(q.next(&mem, &mut c).unwrap().unwrap(), Err(ChainError::BadIndirect));
        // An id out of range corrupts the ring.
        drv.push(&[Buf::readable(0x8000, 8)], 99);
        assert!(q.next(&mem, &mut c).is_err());
    }

    #[test]
    fn endless_chain_breaks_the_queue() {
        let (mem, cfg, mut q) = setup(4, false);
        let drv = PackedDriver::new(&mem, cfg);
        q.attach(&mem).unwrap();
        for i in 0..4 {
            drv.write_desc(i, 0x8000, 8, 0, PackedDriver::avail_flags(true) | F_NEXT);
        }
        assert!(q.next(&mem, &mut Chain::default()).is_err());
    }

    #[test]
    fn event_suppression() {
        let (mem, cfg, mut q) = setup(8, true);
        let mut drv = PackedDriver::new(&mem, cfg);
        q.attach(&mem).unwrap();
        let mut c = Chain::default();
        for i in 0..3 {
            drv.push(&[Buf::writable(0x9000, 8)], i);
        }
        // Driver: disabled.
        drv.set_driver_event(0, EVENT_DISABLE);
        q.next(&mem, &mut c).unwrap().unwrap().unwrap();
        q.push_used(&mem, 0, 0).unwrap();
        assert!(!q.needs_interrupt(&mem));
        // Driver: interrupt when the used position passes 2 (wrap 1).
        drv.set_driver_event(2 | 0x8000, EVENT_DESC);
        q.next(&mem, &mut c).unwrap().unwrap().unwrap();
        q.push_used(&mem, 1, 0).unwrap();
        assert!(!q.needs_interrupt(&mem), "used position 2 has not passed the event");
        q.next(&mem, &mut c).unwrap().unwrap().unwrap();
        q.push_used(&mem, 2, 0).unwrap();
        assert!(q.needs_interrupt(&mem));
        drv.set_driver_event(0, EVENT_ENABLE);
        assert!(!q.needs_interrupt(&mem), "nothing new");
        // Device side: DISABLE while polling, ENABLE before parking.
        q.set_notify(&mem, true).unwrap();
        assert_eq!(drv.device_event_flags(), EVENT_ENABLE);
        q.set_notify(&mem, false).unwrap();
        assert_eq!(drv.device_event_flags(), EVENT_DISABLE);
    }
}
