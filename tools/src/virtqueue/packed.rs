//! Driver side of a packed virtqueue (virtio 1.2 section 2.8, VIRTIO_F_RING_PACKED), in the
//! driver's guest memory.
//!
//! Layout (all little endian), each part in its own page-aligned block:
//!
//! | part | written by | layout |
//! |---|---|---|
//! | descriptor ring (`queue_desc`) | both | `size` x {le64 addr, le32 len, le16 id, le16 flags} |
//! | driver event suppression (`queue_driver`) | driver | `le16 off_wrap, le16 flags` |
//! | device event suppression (`queue_device`) | device | `le16 off_wrap, le16 flags` |
//!
//! **Making buffers available.** Both sides keep a wrap counter starting at 1. The driver writes a
//! chain into consecutive ring slots from `next_avail`, every descriptor carrying the chain's
//! buffer id, `VIRTQ_DESC_F_AVAIL` equal to its wrap counter and `VIRTQ_DESC_F_USED` the inverse;
//! the counter flips after the last slot of the ring. The first descriptor's flags are stored last,
//! with release ordering, so the device never sees half a chain. With VIRTIO_F_INDIRECT_DESC a
//! chain of more than one segment is one `VIRTQ_DESC_F_INDIRECT` descriptor pointing at a table of
//! descriptors whose only flag is `WRITE` (Linux does the same).
//!
//! **Used buffers.** The device overwrites slots with used descriptors (`AVAIL` = `USED` = its
//! wrap counter), one per buffer, in the order it *completes* them: not necessarily the order they
//! were made available. The driver polls the slot at `next_used`, takes the buffer id from it and
//! skips as many slots as that buffer occupied (its own record, not the device's word), flipping
//! its used wrap counter past the end. Buffer ids come from a free list, so any completion order
//! works. The device is not trusted: an id out of range or not in flight, a written length above the
//! chain's writable bytes, or a used descriptor while nothing is in flight is
//! [`QueueError::DeviceBug`]. Following the spec, the length of a used descriptor without
//! `VIRTQ_DESC_F_WRITE` is ignored (taken as 0).
//!
//! **Notifications** (Linux `virtqueue_kick_prepare_packed`): after a full fence the driver reads
//! the device event suppression area as one 32-bit snapshot; `RING_EVENT_FLAGS_DISABLE` means no
//! doorbell, `ENABLE` one, and `DESC` (with VIRTIO_F_EVENT_IDX) a doorbell when the descriptor
//! at `off_wrap` (offset, wrap counter in bit 15) was among those just made available
//! (`vring_need_event` over ring offsets, the event moved back one lap when its wrap counter is not
//! the driver's). **Interrupts**: the driver writes its own area: `DISABLE`; `ENABLE`; or, with
//! EVENT_IDX, `off_wrap` = the next slot it will read and then `DESC`, refreshed after every used
//! buffer taken (Linux `virtqueue_get_buf_ctx_packed`).

use std::sync::atomic::{fence, Ordering};

use super::chain::{
    desc_bytes, vring_need_event, QueueError, Segment, Shadow, UsedElem, VRING_DESC_F_INDIRECT,
    VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use crate::memory::{DmaBuf, GuestRam};

/// Descriptor flag: available (equals the driver's wrap counter when made available).
pub const VIRTQ_DESC_F_AVAIL: u16 = 1 << 7;
/// Descriptor flag: used (equals the device's wrap counter when used).
pub const VIRTQ_DESC_F_USED: u16 = 1 << 15;
/// Event suppression flags: events enabled.
pub const RING_EVENT_FLAGS_ENABLE: u16 = 0;
/// Event suppression flags: events disabled.
pub const RING_EVENT_FLAGS_DISABLE: u16 = 1;
/// Event suppression flags: an event only for the descriptor at `off_wrap` (needs EVENT_IDX).
pub const RING_EVENT_FLAGS_DESC: u16 = 2;
/// Bit of `off_wrap` holding the wrap counter.
pub const RING_EVENT_WRAP_BIT: u16 = 15;
/// Most entries of a packed virtqueue.
pub const MAX_PACKED_SIZE: u16 = 1 << 15;

/// The flags that mark a descriptor available with driver wrap counter `wrap`.
pub fn avail_flags(wrap: bool) -> u16 {
    if wrap {
        VIRTQ_DESC_F_AVAIL
    } else {
        VIRTQ_DESC_F_USED
    }
}

/// Whether `flags` mark a descriptor used for a reader whose used wrap counter is `wrap`.
pub fn is_used(flags: u16, wrap: bool) -> bool {
    let avail = flags & VIRTQ_DESC_F_AVAIL != 0;
    let used = flags & VIRTQ_DESC_F_USED != 0;
    avail == used && used == wrap
}

/// Ring position `pos` with wrap counter `wrap`, moved on by `n` slots of a ring of `size`.
fn advance(pos: u16, wrap: bool, n: u16, size: u16) -> (u16, bool) {
    let end = u32::from(pos) + u32::from(n);
    if end >= u32::from(size) {
        ((end - u32::from(size)) as u16, !wrap)
    } else {
        (end as u16, wrap)
    }
}

/// `off_wrap` of ring offset `off` with wrap counter `wrap`.
fn off_wrap(off: u16, wrap: bool) -> u16 {
    off | (u16::from(wrap) << RING_EVENT_WRAP_BIT)
}

/// The driver side of one packed virtqueue.
#[derive(Debug)]
pub struct PackedQueue {
    shadow: Shadow,
    ring: DmaBuf,
    driver_event: DmaBuf,
    device_event: DmaBuf,
    event_idx: bool,
    indirect: bool,
    /// Next slot to fill, and the driver ring wrap counter.
    next_avail: u16,
    avail_wrap: bool,
    /// Next slot the device will write a used descriptor to, and the used wrap counter.
    next_used: u16,
    used_wrap: bool,
    /// Ring slots made available since the last [`PackedQueue::kick_prepare`].
    num_added: u16,
    /// Free buffer ids, linked through `id_next`.
    free_id: u16,
    id_next: Vec<u16>,
    /// What the driver last wrote to its event suppression flags.
    event_flags: u16,
}

impl PackedQueue {
    /// Allocates the ring and event areas of a queue of `size` entries (1..=2^15) in `mem`.
    pub fn new(
        mem: &GuestRam,
        index: u16,
        size: u16,
        event_idx: bool,
        indirect: bool,
    ) -> Result<PackedQueue, QueueError> {
        if size == 0 || size > MAX_PACKED_SIZE {
            return Err(QueueError::BadChain(format!("packed queue size {size} is not in 1..=32768")));
        }
        let n = usize::from(size);
        let ring = mem.alloc_zeroed(16 * n, 4096)?;
        let driver_event = mem.alloc_zeroed(4, 4096)?;
        let device_event = mem.alloc_zeroed(4, 4096)?;
        Ok(PackedQueue {
            shadow: Shadow::new(index, size),
            ring,
            driver_event,
            device_event,
            event_idx,
            indirect,
            next_avail: 0,
            avail_wrap: true,
            next_used: 0,
            used_wrap: true,
            num_added: 0,
            free_id: 0,
            id_next: (1..=size).collect(),
            event_flags: RING_EVENT_FLAGS_ENABLE,
        })
    }

    /// Frees the ring and event areas (the device must no longer use them).
    pub fn destroy(mut self, mem: &GuestRam) {
        self.shadow.destroy(mem);
        mem.free(self.ring);
        mem.free(self.driver_event);
        mem.free(self.device_event);
    }

    /// Queue index.
    pub fn index(&self) -> u16 {
        self.shadow.index
    }
    /// Queue size.
    pub fn size(&self) -> u16 {
        self.shadow.size
    }
    /// DMA address of the descriptor ring (`queue_desc`).
    pub fn ring_addr(&self) -> u64 {
        self.ring.iova
    }
    /// DMA address of the driver event suppression area (`queue_driver`).
    pub fn driver_event_addr(&self) -> u64 {
        self.driver_event.iova
    }
    /// DMA address of the device event suppression area (`queue_device`).
    pub fn device_event_addr(&self) -> u64 {
        self.device_event.iova
    }
    /// Free ring slots.
    pub fn num_free(&self) -> u16 {
        self.shadow.num_free
    }
    /// Buffers made available and not yet used.
    pub fn in_flight(&self) -> u16 {
        self.shadow.count
    }
    /// Next slot the driver reads a used descriptor from, and its used wrap counter.
    pub fn next_used(&self) -> (u16, bool) {
        (self.next_used, self.used_wrap)
    }

    fn slot_addr(&self, slot: u16) -> u64 {
        self.ring.iova + 16 * u64::from(slot)
    }

    /// Makes a chain (readable segments first, then writable) available. Uses an indirect table
    /// when negotiated and the chain has more than one segment. Returns the buffer id. Call
    /// [`PackedQueue::kick_prepare`] to decide on notifying.
    pub fn add_chain(&mut self, mem: &GuestRam, segs: &[Segment], token: u64) -> Result<u16, QueueError> {
        let c = self.shadow.check(segs, self.indirect)?;
        let id = self.free_id;
        let head = self.next_avail;
        let head_wrap = self.avail_wrap;
        let (head_bytes, head_flags, indirect) = if c.indirect {
            let n = segs.len();
            let table = self.shadow.pool.write_table(mem, id, segs, |_, s| {
                desc_bytes(s.addr, s.len, 0, if s.write { VRING_DESC_F_WRITE } else { 0 })
            })?;
            let d = desc_bytes(table.iova, (16 * n) as u32, id, 0);
            (d, VRING_DESC_F_INDIRECT | avail_flags(head_wrap), Some(table))
        } else {
            // Every descriptor but the first goes out whole; the first waits for its flags.
            let (mut slot, mut wrap) = (head, head_wrap);
            let mut first = None;
            for (k, s) in segs.iter().enumerate() {
                let mut f = if s.write { VRING_DESC_F_WRITE } else { 0 };
                if k + 1 < segs.len() {
                    f |= VRING_DESC_F_NEXT;
                }
                if k == 0 {
                    first = Some((desc_bytes(s.addr, s.len, id, 0), f | avail_flags(wrap)));
                } else {
                    mem.write(self.slot_addr(slot), &desc_bytes(s.addr, s.len, id, f | avail_flags(wrap)))?;
                }
                (slot, wrap) = advance(slot, wrap, 1, self.shadow.size);
            }
            let (d, f) = first.expect("a chain has a first segment");
            (d, f, None)
        };
        let at = self.slot_addr(head);
        let published = mem
            .write(at, &head_bytes[..14])
            .and_then(|()| mem.store_u16(at + 14, head_flags, Ordering::Release));
        if let Err(e) = published {
            if let Some(t) = indirect {
                self.shadow.pool.put_back(mem, id, t);
            }
            return Err(e.into());
        }
        (self.next_avail, self.avail_wrap) = advance(head, head_wrap, c.needed, self.shadow.size);
        self.free_id = self.id_next[usize::from(id)];
        self.num_added = self.num_added.wrapping_add(c.needed);
        self.shadow.start(id, token, &c, indirect);
        Ok(id)
    }

    /// Whether the device wants a notification for what was made available since the last call
    /// (Linux `virtqueue_kick_prepare_packed`).
    pub fn kick_prepare(&mut self, mem: &GuestRam) -> Result<bool, QueueError> {
        fence(Ordering::SeqCst);
        let new = self.next_avail;
        let old = new.wrapping_sub(self.num_added);
        self.num_added = 0;
        let snapshot = mem.load_u32(self.device_event.iova, Ordering::Acquire)?;
        let flags = (snapshot >> 16) as u16;
        if flags != RING_EVENT_FLAGS_DESC {
            return Ok(flags != RING_EVENT_FLAGS_DISABLE);
        }
        let ow = snapshot as u16;
        let mut event = ow & !(1 << RING_EVENT_WRAP_BIT);
        if (ow >> RING_EVENT_WRAP_BIT != 0) != self.avail_wrap {
            event = event.wrapping_sub(self.shadow.size);
        }
        Ok(vring_need_event(event, new, old))
    }

    /// The device event suppression area: (`off_wrap`, `flags`).
    pub fn device_event(&self, mem: &GuestRam) -> Result<(u16, u16), QueueError> {
        let s = mem.load_u32(self.device_event.iova, Ordering::Acquire)?;
        Ok((s as u16, (s >> 16) as u16))
    }

    /// The driver event suppression area as the driver wrote it: (`off_wrap`, `flags`).
    pub fn driver_event(&self, mem: &GuestRam) -> Result<(u16, u16), QueueError> {
        let s = mem.load_u32(self.driver_event.iova, Ordering::Acquire)?;
        Ok((s as u16, (s >> 16) as u16))
    }

    fn used_flags(&self, mem: &GuestRam) -> Result<u16, QueueError> {
        Ok(mem.load_u16(self.slot_addr(self.next_used) + 14, Ordering::Acquire)?)
    }

    /// Whether a used descriptor waits at the next slot.
    pub fn has_used(&self, mem: &GuestRam) -> Result<bool, QueueError> {
        Ok(is_used(self.used_flags(mem)?, self.used_wrap))
    }

    /// Where the device stands, for a timeout message.
    pub fn describe(&self, mem: &GuestRam) -> String {
        format!(
            "queue {}: {} in flight, next used slot {} (wrap {}) has flags {:?}, device event {:?}",
            self.shadow.index,
            self.shadow.count,
            self.next_used,
            u8::from(self.used_wrap),
            self.used_flags(mem).ok(),
            self.device_event(mem).ok()
        )
    }

    /// Takes the used descriptor at the next slot, if any, after validating it, and frees the
    /// slots and the id of its buffer.
    pub fn pop_used(&mut self, mem: &GuestRam) -> Result<Option<UsedElem>, QueueError> {
        let flags = self.used_flags(mem)?;
        if !is_used(flags, self.used_wrap) {
            return Ok(None);
        }
        let slot = self.next_used;
        if self.shadow.count == 0 {
            return Err(self.shadow.bug(format!("used descriptor in slot {slot} with no buffer in flight")));
        }
        // The acquire load of the flags orders this read after the device's writes.
        let mut d = [0u8; 16];
        mem.read(self.slot_addr(slot), &mut d)?;
        let raw_len = u32::from_le_bytes(d[8..12].try_into().expect("4 bytes"));
        let id = u16::from_le_bytes([d[12], d[13]]);
        let len = if flags & VRING_DESC_F_WRITE != 0 { raw_len } else { 0 };
        let (token, ndesc) = self.shadow.finish(mem, u32::from(id), len, format_args!("ring slot {slot}"))?;
        (self.next_used, self.used_wrap) = advance(slot, self.used_wrap, ndesc, self.shadow.size);
        self.id_next[usize::from(id)] = self.free_id;
        self.free_id = id;
        if self.event_flags == RING_EVENT_FLAGS_DESC {
            mem.store_u16(
                self.driver_event.iova,
                off_wrap(self.next_used, self.used_wrap),
                Ordering::Release,
            )?;
            fence(Ordering::SeqCst);
        }
        Ok(Some(UsedElem { token, len, head: id }))
    }

    fn set_event_flags(&mut self, mem: &GuestRam, flags: u16) -> Result<(), QueueError> {
        self.event_flags = flags;
        Ok(mem.store_u16(self.driver_event.iova + 2, flags, Ordering::Release)?)
    }

    /// Asks the device not to interrupt (Linux `virtqueue_disable_cb_packed`).
    pub fn disable_interrupts(&mut self, mem: &GuestRam) -> Result<(), QueueError> {
        if self.event_flags != RING_EVENT_FLAGS_DISABLE {
            self.set_event_flags(mem, RING_EVENT_FLAGS_DISABLE)?;
        }
        Ok(())
    }

    /// Asks for an interrupt at the next used descriptor; returns whether one is already there
    /// (Linux `virtqueue_enable_cb_prepare_packed` followed by `virtqueue_poll_packed`).
    pub fn enable_interrupts(&mut self, mem: &GuestRam) -> Result<bool, QueueError> {
        if self.event_idx {
            // Offset and wrap counter before the flags that make the device look at them.
            mem.store_u16(
                self.driver_event.iova,
                off_wrap(self.next_used, self.used_wrap),
                Ordering::Release,
            )?;
        }
        if self.event_flags == RING_EVENT_FLAGS_DISABLE {
            let f = if self.event_idx { RING_EVENT_FLAGS_DESC } else { RING_EVENT_FLAGS_ENABLE };
            self.set_event_flags(mem, f)?;
        }
        fence(Ordering::SeqCst);
        self.has_used(mem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal in-test device, from the spec: reads available descriptors in ring order and
    /// writes used ones in the order it is told to complete them.
    struct FakeDevice {
        next_avail: u16,
        avail_wrap: bool,
        next_used: u16,
        used_wrap: bool,
    }

    /// A buffer the fake device took: id, ring slots, descriptors (addr, len, flags).
    #[derive(Debug)]
    struct Taken {
        id: u16,
        slots: u16,
        descs: Vec<(u64, u32, u16)>,
    }

    impl FakeDevice {
        fn new() -> FakeDevice {
            FakeDevice { next_avail: 0, avail_wrap: true, next_used: 0, used_wrap: true }
        }

        fn take(&mut self, mem: &GuestRam, q: &PackedQueue) -> Option<Taken> {
            let mut descs = Vec::new();
            let (mut slot, mut wrap) = (self.next_avail, self.avail_wrap);
            loop {
                let d = mem.read_vec(q.ring_addr() + 16 * u64::from(slot), 16).unwrap();
                let flags = u16::from_le_bytes([d[14], d[15]]);
                let avail = flags & VIRTQ_DESC_F_AVAIL != 0;
                let used = flags & VIRTQ_DESC_F_USED != 0;
                if avail != wrap || used == wrap {
                    assert!(descs.is_empty(), "half a chain is visible");
                    return None;
                }
                let addr = u64::from_le_bytes(d[0..8].try_into().unwrap());
                let len = u32::from_le_bytes(d[8..12].try_into().unwrap());
                let id = u16::from_le_bytes([d[12], d[13]]);
                descs.push((addr, len, flags));
                slot += 1;
                if slot == q.size() {
                    slot = 0;
                    wrap = !wrap;
                }
                if flags & VRING_DESC_F_NEXT == 0 {
                    let slots = descs.len() as u16;
                    self.next_avail = slot;
                    self.avail_wrap = wrap;
                    return Some(Taken { id, slots, descs });
                }
            }
        }

        fn put_used(&mut self, mem: &GuestRam, q: &PackedQueue, id: u16, slots: u16, len: u32) {
            let at = q.ring_addr() + 16 * u64::from(self.next_used);
            let mut f = if self.used_wrap { VIRTQ_DESC_F_AVAIL | VIRTQ_DESC_F_USED } else { 0 };
            if len > 0 {
                f |= VRING_DESC_F_WRITE;
            }
            mem.write(at + 8, &len.to_le_bytes()).unwrap();
            mem.write(at + 12, &id.to_le_bytes()).unwrap();
            mem.store_u16(at + 14, f, Ordering::Release).unwrap();
            self.next_used += slots;
            if self.next_used >= q.size() {
                self.next_used -= q.size();
                self.used_wrap = !self.used_wrap;
            }
        }

        fn complete(&mut self, mem: &GuestRam, q: &PackedQueue, t: &Taken, len: u32) {
            self.put_used(mem, q, t.id, t.slots, len);
        }

        fn set_event(&self, mem: &GuestRam, q: &PackedQueue, off_wrap: u16, flags: u16) {
            mem.write(q.device_event_addr(), &off_wrap.to_le_bytes()).unwrap();
            mem.write(q.device_event_addr() + 2, &flags.to_le_bytes()).unwrap();
        }
    }

    fn segs(mem: &GuestRam, n_read: usize, n_write: usize) -> Vec<Segment> {
        (0..n_read + n_write)
            .map(|i| Segment { addr: mem.alloc(64, 8).unwrap().iova, len: 64, write: i >= n_read })
            .collect()
    }

    #[test]
    fn chains_wrap_the_ring_and_complete_out_of_order() {
        let mem = GuestRam::new(1 << 20, 1 << 32).unwrap();
        // 3-descriptor chains on an 8-slot ring: chains straddle the end of the ring.
        let mut q = PackedQueue::new(&mem, 1, 8, false, false).unwrap();
        let mut dev = FakeDevice::new();
        let s = segs(&mem, 1, 2);
        q.add_chain(&mem, &s, 100).unwrap();
        q.add_chain(&mem, &s, 101).unwrap();
        assert_eq!(q.num_free(), 2);
        assert!(matches!(q.add_chain(&mem, &s, 102), Err(QueueError::Full { needed: 3, free: 2 })));
        assert!(q.pop_used(&mem).unwrap().is_none());
        let mut next_token = 102u64;
        let mut taken = vec![dev.take(&mem, &q).unwrap(), dev.take(&mem, &q).unwrap()];
        assert!(dev.take(&mem, &q).is_none());
        let mut tokens_of = std::collections::HashMap::from([(0u16, 100u64), (1, 101)]);
        assert_eq!(taken[0].descs.len(), 3);
        assert_eq!(taken[0].descs[2].2 & VRING_DESC_F_WRITE, VRING_DESC_F_WRITE);
        let mut done = 0;
        for round in 0..200 {
            // Always complete the newest: the first buffer stays in flight while the ring wraps.
            let t = taken.pop().unwrap();
            dev.complete(&mem, &q, &t, (10 + round) % 128);
            let u = q.pop_used(&mem).unwrap().expect("a used buffer");
            assert_eq!(u.head, t.id);
            assert_eq!((u.token, u.len), (tokens_of.remove(&t.id).unwrap(), (10 + round) % 128));
            assert!(q.pop_used(&mem).unwrap().is_none());
            done += 1;
            let id = q.add_chain(&mem, &s, next_token).unwrap();
            tokens_of.insert(id, next_token);
            next_token += 1;
            taken.push(dev.take(&mem, &q).unwrap());
        }
        assert_eq!(done, 200);
        assert_eq!(q.in_flight(), 2);
        for t in taken.drain(..).rev() {
            dev.complete(&mem, &q, &t, 0);
        }
        while q.pop_used(&mem).unwrap().is_some() {}
        assert_eq!((q.num_free(), q.in_flight()), (8, 0));
        // 200 rounds of 3 slots wrapped the 8-slot ring many times.
        assert!(next_token > 100 + 8);
    }

    #[test]
    fn a_chain_as_long_as_the_ring_flips_the_wrap_counter() {
        // Linux once kept the counter when a chain of exactly `size` descriptors started mid-ring.
        let mem = GuestRam::new(1 << 20, 1 << 32).unwrap();
        let mut q = PackedQueue::new(&mem, 1, 4, false, false).unwrap();
        let mut dev = FakeDevice::new();
        let s = segs(&mem, 2, 2);
        q.add_chain(&mem, &s[..1], 1).unwrap();
        let t = dev.take(&mem, &q).unwrap();
        dev.complete(&mem, &q, &t, 0);
        q.pop_used(&mem).unwrap().unwrap();
        q.add_chain(&mem, &s, 2).unwrap();
        assert_eq!((q.next_avail, q.avail_wrap), (1, false), "slots 1, 2, 3, 0: one full lap");
        let t = dev.take(&mem, &q).unwrap();
        assert_eq!((t.slots, t.descs.len()), (4, 4));
        dev.complete(&mem, &q, &t, 128);
        assert_eq!(q.pop_used(&mem).unwrap().unwrap().token, 2);
        assert_eq!(q.next_used(), (1, false));
        q.add_chain(&mem, &s[..1], 3).unwrap();
        let t = dev.take(&mem, &q).expect("the device sees the next lap's descriptor");
        dev.complete(&mem, &q, &t, 0);
        assert_eq!(q.pop_used(&mem).unwrap().unwrap().token, 3);
    }

    #[test]
    fn indirect_uses_one_slot_with_a_flagless_table() {
        let mem = GuestRam::new(1 << 20, 1 << 32).unwrap();
        let mut q = PackedQueue::new(&mem, 1, 4, true, true).unwrap();
        let s = segs(&mem, 2, 3);
        for t in 0..4 {
            q.add_chain(&mem, &s, t).unwrap();
        }
        assert_eq!(q.num_free(), 0);
        let mut dev = FakeDevice::new();
        let t = dev.take(&mem, &q).unwrap();
        assert_eq!(t.descs.len(), 1);
        let (table, len, flags) = t.descs[0];
        assert_eq!(flags, VRING_DESC_F_INDIRECT | VIRTQ_DESC_F_AVAIL);
        assert_eq!(len, 5 * 16);
        let entries = mem.read_vec(table, 5 * 16).unwrap();
        for (i, e) in entries.chunks(16).enumerate() {
            let f = u16::from_le_bytes([e[14], e[15]]);
            assert_eq!(f, if i >= 2 { VRING_DESC_F_WRITE } else { 0 }, "entry {i}");
            assert_eq!(u64::from_le_bytes(e[0..8].try_into().unwrap()), s[i].addr);
        }
        // Completing it frees one slot and the table is reused for the next chain of that id.
        dev.complete(&mem, &q, &t, 3 * 64);
        let u = q.pop_used(&mem).unwrap().unwrap();
        assert_eq!((u.token, u.len), (0, 192));
        let id = q.add_chain(&mem, &s, 9).unwrap();
        assert_eq!(id, t.id);
        for _ in 0..3 {
            dev.take(&mem, &q).unwrap();
        }
        let t2 = dev.take(&mem, &q).unwrap();
        assert_eq!((t2.id, t2.descs[0].0), (id, table), "indirect table reused");
    }

    #[test]
    fn device_bugs_are_typed_errors() {
        let mem = GuestRam::new(1 << 20, 1 << 32).unwrap();
        let s = segs(&mem, 1, 1);
        let fresh = |mem: &GuestRam| PackedQueue::new(mem, 3, 8, false, false).unwrap();
        // Used descriptor with nothing in flight.
        let q0 = fresh(&mem);
        let mut q = q0;
        FakeDevice::new().put_used(&mem, &q, 0, 1, 0);
        assert!(matches!(q.pop_used(&mem), Err(QueueError::DeviceBug { queue: 3, .. })));
        // Id out of range.
        let mut q = fresh(&mem);
        q.add_chain(&mem, &s, 1).unwrap();
        FakeDevice::new().put_used(&mem, &q, 8, 2, 0);
        assert!(matches!(q.pop_used(&mem), Err(QueueError::DeviceBug { .. })));
        // Id not in flight.
        let mut q = fresh(&mem);
        q.add_chain(&mem, &s, 1).unwrap();
        FakeDevice::new().put_used(&mem, &q, 5, 2, 0);
        let e = q.pop_used(&mem).unwrap_err();
        assert!(e.to_string().contains("device bug"), "{e}");
        // Written length above the writable bytes; the buffer stays in flight.
        let mut q = fresh(&mem);
        let id = q.add_chain(&mem, &s, 1).unwrap();
        FakeDevice::new().put_used(&mem, &q, id, 2, 65);
        assert!(matches!(q.pop_used(&mem), Err(QueueError::DeviceBug { .. })));
        assert_eq!(q.in_flight(), 1);
        // A length without VIRTQ_DESC_F_WRITE is ignored, as the spec says.
        let mut q = fresh(&mem);
        let id = q.add_chain(&mem, &s[..1], 1).unwrap();
        let at = q.ring_addr();
        mem.write(at + 8, &1000u32.to_le_bytes()).unwrap();
        mem.write(at + 12, &id.to_le_bytes()).unwrap();
        mem.store_u16(at + 14, VIRTQ_DESC_F_AVAIL | VIRTQ_DESC_F_USED, Ordering::Release).unwrap();
        assert_eq!(q.pop_used(&mem).unwrap().unwrap().len, 0);
    }

    #[test]
    fn device_event_suppression_decides_the_doorbell() {
        let mem = GuestRam::new(1 << 20, 1 << 32).unwrap();
        let s = segs(&mem, 1, 1);
        let dev = FakeDevice::new();
        let mut q = PackedQueue::new(&mem, 1, 8, true, false).unwrap();
        // ENABLE (the zeroed area): every batch kicks.
        q.add_chain(&mem, &s, 1).unwrap();
        assert!(q.kick_prepare(&mem).unwrap());
        // DISABLE: none.
        dev.set_event(&mem, &q, 0, RING_EVENT_FLAGS_DISABLE);
        q.add_chain(&mem, &s, 2).unwrap();
        assert!(!q.kick_prepare(&mem).unwrap());
        // DESC at slot 6 of this lap: the batch covering slots 4..6 does not reach it, 6..8 does.
        dev.set_event(&mem, &q, off_wrap(6, true), RING_EVENT_FLAGS_DESC);
        q.add_chain(&mem, &s, 3).unwrap();
        assert!(!q.kick_prepare(&mem).unwrap());
        q.add_chain(&mem, &s, 4).unwrap();
        assert!(q.kick_prepare(&mem).unwrap());
        // The ring is full and the next slot is 0 of the next lap (wrap 0).
        assert_eq!((q.next_avail, q.avail_wrap), (0, false));
        let mut d = FakeDevice::new();
        for _ in 0..4 {
            let t = d.take(&mem, &q).unwrap();
            d.complete(&mem, &q, &t, 0);
            q.pop_used(&mem).unwrap().unwrap();
        }
        // An event for slot 0 of the lap that just started is reached by the next batch; one for
        // slot 7 of the old lap is behind.
        dev.set_event(&mem, &q, off_wrap(0, false), RING_EVENT_FLAGS_DESC);
        q.add_chain(&mem, &s, 5).unwrap();
        assert!(q.kick_prepare(&mem).unwrap());
        dev.set_event(&mem, &q, off_wrap(7, true), RING_EVENT_FLAGS_DESC);
        q.add_chain(&mem, &s, 6).unwrap();
        assert!(!q.kick_prepare(&mem).unwrap());
    }

    #[test]
    fn driver_event_suppression_is_written() {
        let mem = GuestRam::new(1 << 20, 1 << 32).unwrap();
        let s = segs(&mem, 1, 1);
        // Without EVENT_IDX: DISABLE and ENABLE.
        let mut q = PackedQueue::new(&mem, 1, 4, false, false).unwrap();
        q.disable_interrupts(&mem).unwrap();
        assert_eq!(q.driver_event(&mem).unwrap().1, RING_EVENT_FLAGS_DISABLE);
        assert!(!q.enable_interrupts(&mem).unwrap());
        assert_eq!(q.driver_event(&mem).unwrap().1, RING_EVENT_FLAGS_ENABLE);
        // With EVENT_IDX: DESC at the next used slot, moved on with every used buffer.
        let mut q = PackedQueue::new(&mem, 1, 4, true, false).unwrap();
        q.disable_interrupts(&mem).unwrap();
        let mut dev = FakeDevice::new();
        let one = &s[..1];
        for t in 0..3 {
            q.add_chain(&mem, one, t).unwrap();
        }
        assert!(!q.enable_interrupts(&mem).unwrap());
        assert_eq!(q.driver_event(&mem).unwrap(), (off_wrap(0, true), RING_EVENT_FLAGS_DESC));
        for _ in 0..3 {
            let t = dev.take(&mem, &q).unwrap();
            dev.complete(&mem, &q, &t, 0);
        }
        assert!(q.enable_interrupts(&mem).unwrap(), "used buffers are pending");
        for _ in 0..3 {
            q.pop_used(&mem).unwrap().unwrap();
        }
        assert_eq!(q.driver_event(&mem).unwrap(), (off_wrap(3, true), RING_EVENT_FLAGS_DESC));
        for t in 3..6 {
            q.add_chain(&mem, one, t).unwrap();
            let b = dev.take(&mem, &q).unwrap();
            dev.complete(&mem, &q, &b, 0);
            assert_eq!(q.pop_used(&mem).unwrap().unwrap().token, t);
        }
        // Six one-slot buffers on a four-slot ring: slot 2 of the second lap.
        assert_eq!(q.next_used(), (2, false));
        assert_eq!(q.driver_event(&mem).unwrap(), (off_wrap(2, false), RING_EVENT_FLAGS_DESC));
    }
}
