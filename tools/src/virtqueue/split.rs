//! Driver side of a split virtqueue, in the driver's guest memory.
//!
//! Layout (virtio 1.x, all little endian), each part in its own page-aligned block:
//!
//! | part | layout |
//! |---|---|
//! | descriptor table | `size` x {le64 addr, le32 len, le16 flags, le16 next} |
//! | avail (driver) ring | `le16 flags, le16 idx, le16 ring[size], le16 used_event` |
//! | used (device) ring | `le16 flags, le16 idx, {le32 id, le32 len}[size], le16 avail_event` |
//!
//! The driver never trusts the device's view: chains are tracked in a shadow (`next` links and
//! per-head in-flight records) and every used element is checked (index in range, head in flight,
//! written length within the chain's writable bytes, used index not running ahead of what is in
//! flight). Violations are [`QueueError::DeviceBug`].
//!
//! Notification follows Linux: with EVENT_IDX the driver kicks when `vring_need_event(avail_event,
//! new, old)`, otherwise unless the device set `VRING_USED_F_NO_NOTIFY`. Interrupt suppression:
//! `VRING_AVAIL_F_NO_INTERRUPT`, or `used_event` with EVENT_IDX.

use std::sync::atomic::{fence, Ordering};

use super::chain::{
    desc_bytes, vring_need_event, QueueError, Segment, Shadow, UsedElem, VRING_AVAIL_F_NO_INTERRUPT,
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_USED_F_NO_NOTIFY,
};
use crate::memory::{DmaBuf, GuestRam, MemoryError};

/// The driver side of one split virtqueue.
#[derive(Debug)]
pub struct SplitQueue {
    shadow: Shadow,
    desc: DmaBuf,
    avail: DmaBuf,
    used: DmaBuf,
    event_idx: bool,
    indirect: bool,
    next: Vec<u16>,
    free_head: u16,
    avail_idx: u16,
    num_added: u16,
    last_used: u16,
    avail_flags: u16,
}

impl SplitQueue {
    /// Allocates rings for a queue of `size` entries (power of two) in `mem`.
    pub fn new(
        mem: &GuestRam,
        index: u16,
        size: u16,
        event_idx: bool,
        indirect: bool,
    ) -> Result<SplitQueue, QueueError> {
        if size == 0 || !size.is_power_of_two() {
            return Err(QueueError::BadChain(format!("queue size {size} is not a power of two")));
        }
        let n = usize::from(size);
        let desc = mem.alloc_zeroed(16 * n, 4096)?;
        let avail = mem.alloc_zeroed(6 + 2 * n, 4096)?;
        let used = mem.alloc_zeroed(6 + 8 * n, 4096)?;
        let mut next = vec![0u16; n];
        for (i, x) in next.iter_mut().enumerate() {
            *x = ((i + 1) % n) as u16;
        }
        Ok(SplitQueue {
            shadow: Shadow::new(index, size),
            desc,
            avail,
            used,
            event_idx,
            indirect,
            next,
            free_head: 0,
            avail_idx: 0,
            num_added: 0,
            last_used: 0,
            avail_flags: 0,
        })
    }

    /// Frees the rings (the device must no longer use them).
    pub fn destroy(mut self, mem: &GuestRam) {
        self.shadow.destroy(mem);
        mem.free(self.desc);
        mem.free(self.avail);
        mem.free(self.used);
    }

    /// Queue index.
    pub fn index(&self) -> u16 {
        self.shadow.index
    }
    /// Queue size.
    pub fn size(&self) -> u16 {
        self.shadow.size
    }
    /// DMA address of the descriptor table.
    pub fn desc_addr(&self) -> u64 {
        self.desc.iova
    }
    /// DMA address of the avail ring.
    pub fn avail_addr(&self) -> u64 {
        self.avail.iova
    }
    /// DMA address of the used ring.
    pub fn used_addr(&self) -> u64 {
        self.used.iova
    }
    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        self.shadow.num_free
    }
    /// Chains submitted and not yet completed.
    pub fn in_flight(&self) -> u16 {
        self.shadow.count
    }

    fn write_desc(
        mem: &GuestRam,
        table: u64,
        i: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> Result<(), MemoryError> {
        mem.write(table + 16 * u64::from(i), &desc_bytes(addr, len, flags, next))
    }

    /// Adds a chain (readable segments first, then writable) and makes it available. Uses an
    /// indirect table when negotiated and the chain has more than one segment (as Linux does).
    /// Returns the head index. Call [`SplitQueue::kick_prepare`] to decide on notifying.
    pub fn add_chain(&mut self, mem: &GuestRam, segs: &[Segment], token: u64) -> Result<u16, QueueError> {
        let c = self.shadow.check(segs, self.indirect)?;
        let head = self.free_head;
        let mut indirect = None;
        if c.indirect {
            let n = segs.len();
            let table = self.shadow.pool.write_table(mem, head, segs, |i, s| {
                let mut f = if s.write { VRING_DESC_F_WRITE } else { 0 };
                let nx = if i + 1 < n {
                    f |= VRING_DESC_F_NEXT;
                    (i + 1) as u16
                } else {
                    0
                };
                desc_bytes(s.addr, s.len, f, nx)
            })?;
            let r = Self::write_desc(
                mem,
                self.desc.iova,
                head,
                table.iova,
                (16 * n) as u32,
                VRING_DESC_F_INDIRECT,
                0,
            );
            if let Err(e) = r {
                self.shadow.pool.put_back(mem, head, table);
                return Err(e.into());
            }
            self.free_head = self.next[usize::from(head)];
            indirect = Some(table);
        } else {
            let mut i = head;
            for (k, s) in segs.iter().enumerate() {
                let mut f = if s.write { VRING_DESC_F_WRITE } else { 0 };
                let nx = self.next[usize::from(i)];
                if k + 1 < segs.len() {
                    f |= VRING_DESC_F_NEXT;
                }
                Self::write_desc(mem, self.desc.iova, i, s.addr, s.len, f, nx)?;
                if k + 1 < segs.len() {
                    i = nx;
                }
            }
            self.free_head = self.next[usize::from(i)];
        }
        self.shadow.start(head, token, &c, indirect);
        // Publish: ring entry, then (release) the index.
        let slot = self.avail_idx % self.shadow.size;
        mem.write(self.avail.iova + 4 + 2 * u64::from(slot), &head.to_le_bytes())?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.num_added = self.num_added.wrapping_add(1);
        mem.store_u16(self.avail.iova + 2, self.avail_idx, Ordering::Release)?;
        Ok(head)
    }

    /// Whether the device wants a notification for what was added since the last call
    /// (Linux `virtqueue_kick_prepare_split`).
    pub fn kick_prepare(&mut self, mem: &GuestRam) -> Result<bool, QueueError> {
        fence(Ordering::SeqCst);
        let new = self.avail_idx;
        let old = new.wrapping_sub(self.num_added);
        self.num_added = 0;
        if self.event_idx {
            let ev = mem.load_u16(self.used.iova + 4 + 8 * u64::from(self.shadow.size), Ordering::Acquire)?;
            Ok(vring_need_event(ev, new, old))
        } else {
            let f = mem.load_u16(self.used.iova, Ordering::Acquire)?;
            Ok(f & VRING_USED_F_NO_NOTIFY == 0)
        }
    }

    /// The device's used index.
    pub fn device_used_idx(&self, mem: &GuestRam) -> Result<u16, QueueError> {
        Ok(mem.load_u16(self.used.iova + 2, Ordering::Acquire)?)
    }

    /// The device's used-ring flags.
    pub fn used_flags(&self, mem: &GuestRam) -> Result<u16, QueueError> {
        Ok(mem.load_u16(self.used.iova, Ordering::Acquire)?)
    }

    /// Whether completions are pending.
    pub fn has_used(&self, mem: &GuestRam) -> Result<bool, QueueError> {
        Ok(self.device_used_idx(mem)? != self.last_used)
    }

    /// Where the device stands, for a timeout message.
    pub fn describe(&self, mem: &GuestRam) -> String {
        format!(
            "queue {}: {} in flight, device used idx {:?}",
            self.shadow.index,
            self.shadow.count,
            self.device_used_idx(mem).ok()
        )
    }

    /// Takes the next used element, if any, after validating it, and frees its descriptors.
    pub fn pop_used(&mut self, mem: &GuestRam) -> Result<Option<UsedElem>, QueueError> {
        let used_idx = self.device_used_idx(mem)?;
        if used_idx == self.last_used {
            return Ok(None);
        }
        let pending = used_idx.wrapping_sub(self.last_used);
        if pending > self.shadow.count {
            return Err(self.shadow.bug(format!(
                "used idx {used_idx} is {pending} ahead of the driver's {} with only {} chains in flight",
                self.last_used, self.shadow.count
            )));
        }
        let slot = self.last_used % self.shadow.size;
        let mut e = [0u8; 8];
        mem.read(self.used.iova + 4 + 8 * u64::from(slot), &mut e)?;
        let id = u32::from_le_bytes(e[0..4].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(e[4..8].try_into().expect("4 bytes"));
        let head = id as u16;
        let (token, ndesc) = self.shadow.finish(mem, id, len, format_args!("used ring slot {slot}"))?;
        // Free the chain using the shadow links (not the device-visible table).
        let mut last = head;
        for _ in 1..ndesc {
            last = self.next[usize::from(last)];
        }
        self.next[usize::from(last)] = self.free_head;
        self.free_head = head;
        self.last_used = self.last_used.wrapping_add(1);
        if self.event_idx && self.avail_flags & VRING_AVAIL_F_NO_INTERRUPT == 0 {
            mem.store_u16(self.used_event_addr(), self.last_used, Ordering::Release)?;
        }
        Ok(Some(UsedElem { token, len, head }))
    }

    fn used_event_addr(&self) -> u64 {
        self.avail.iova + 4 + 2 * u64::from(self.shadow.size)
    }

    /// Asks the device not to interrupt (Linux `virtqueue_disable_cb_split`).
    pub fn disable_interrupts(&mut self, mem: &GuestRam) -> Result<(), QueueError> {
        if self.avail_flags & VRING_AVAIL_F_NO_INTERRUPT == 0 {
            self.avail_flags |= VRING_AVAIL_F_NO_INTERRUPT;
            if self.event_idx {
                mem.store_u16(self.used_event_addr(), 0, Ordering::Release)?;
            } else {
                mem.store_u16(self.avail.iova, self.avail_flags, Ordering::Release)?;
            }
        }
        Ok(())
    }

    /// Asks for an interrupt at the next used entry; returns whether entries are already pending
    /// (Linux `virtqueue_enable_cb` followed by `virtqueue_poll`).
    pub fn enable_interrupts(&mut self, mem: &GuestRam) -> Result<bool, QueueError> {
        if self.avail_flags & VRING_AVAIL_F_NO_INTERRUPT != 0 {
            self.avail_flags &= !VRING_AVAIL_F_NO_INTERRUPT;
            if !self.event_idx {
                mem.store_u16(self.avail.iova, self.avail_flags, Ordering::Release)?;
            }
        }
        mem.store_u16(self.used_event_addr(), self.last_used, Ordering::Release)?;
        fence(Ordering::SeqCst);
        self.has_used(mem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal in-test "device": consumes avail entries and writes used ones.
    struct FakeDevice {
        last_avail: u16,
        used_idx: u16,
    }

    impl FakeDevice {
        fn complete_one(&mut self, mem: &GuestRam, q: &SplitQueue, len: u32) -> bool {
            let avail_idx = mem.load_u16(q.avail_addr() + 2, Ordering::Acquire).unwrap();
            if avail_idx == self.last_avail {
                return false;
            }
            let slot = self.last_avail % q.size();
            let head = mem.read_vec(q.avail_addr() + 4 + 2 * u64::from(slot), 2).unwrap();
            self.last_avail = self.last_avail.wrapping_add(1);
            self.put_used(mem, q, u32::from(u16::from_le_bytes([head[0], head[1]])), len);
            true
        }
        fn put_used(&mut self, mem: &GuestRam, q: &SplitQueue, id: u32, len: u32) {
            let slot = self.used_idx % q.size();
            let mut e = id.to_le_bytes().to_vec();
            e.extend_from_slice(&len.to_le_bytes());
            mem.write(q.used_addr() + 4 + 8 * u64::from(slot), &e).unwrap();
            self.used_idx = self.used_idx.wrapping_add(1);
            mem.store_u16(q.used_addr() + 2, self.used_idx, Ordering::Release).unwrap();
        }
    }

    fn segs(mem: &GuestRam, n_read: usize, n_write: usize) -> Vec<Segment> {
        let mut v = Vec::new();
        for i in 0..n_read + n_write {
            let b = mem.alloc(64, 8).unwrap();
            v.push(Segment { addr: b.iova, len: 64, write: i >= n_read });
        }
        v
    }

    #[test]
    fn need_event() {
        assert!(vring_need_event(0, 1, 0));
        assert!(!vring_need_event(1, 1, 0));
        assert!(vring_need_event(5, 10, 3));
        assert!(!vring_need_event(10, 10, 3));
        assert!(vring_need_event(0xffff, 0, 0xfffe));
    }

    #[test]
    fn fill_full_and_recycle() {
        let mem = GuestRam::new(1 << 20, 1 << 32).unwrap();
        let mut q = SplitQueue::new(&mem, 1, 8, false, false).unwrap();
        let mut dev = FakeDevice { last_avail: 0, used_idx: 0 };
        let s = segs(&mem, 2, 2);
        q.add_chain(&mem, &s, 1).unwrap();
        q.add_chain(&mem, &s, 2).unwrap();
        assert_eq!(q.num_free(), 0);
        assert!(matches!(q.add_chain(&mem, &s[..1], 3), Err(QueueError::Full { needed: 1, free: 0 })));
        // Device asks for notifications by default.
        assert!(q.kick_prepare(&mem).unwrap());
        assert!(dev.complete_one(&mem, &q, 10));
        let u = q.pop_used(&mem).unwrap().unwrap();
        assert_eq!((u.token, u.len), (1, 10));
        assert_eq!(q.num_free(), 4);
        assert!(q.pop_used(&mem).unwrap().is_none());
        // Many rounds wrap the indexes and reuse descriptors.
        for t in 10..300u64 {
            q.add_chain(&mem, &s, t).unwrap();
            assert!(dev.complete_one(&mem, &q, 0));
            assert!(dev.complete_one(&mem, &q, 0) || q.in_flight() > 0);
            while let Some(u) = q.pop_used(&mem).unwrap() {
                assert!(u.token == 2 || u.token >= 10);
            }
        }
        assert_eq!(q.num_free(), 8);
    }

    #[test]
    fn indirect_uses_one_descriptor() {
        let mem = GuestRam::new(1 << 20, 1 << 32).unwrap();
        let mut q = SplitQueue::new(&mem, 1, 4, true, true).unwrap();
        let s = segs(&mem, 3, 3);
        for t in 0..4 {
            q.add_chain(&mem, &s, t).unwrap();
        }
        assert_eq!(q.num_free(), 0);
        let d = mem.read_vec(q.desc_addr(), 16).unwrap();
        assert_eq!(u16::from_le_bytes([d[12], d[13]]), VRING_DESC_F_INDIRECT);
        assert_eq!(u32::from_le_bytes(d[8..12].try_into().unwrap()), 6 * 16);
    }

    #[test]
    fn device_bugs_are_detected() {
        let mem = GuestRam::new(1 << 20, 1 << 32).unwrap();
        let mut q = SplitQueue::new(&mem, 2, 8, false, false).unwrap();
        let mut dev = FakeDevice { last_avail: 0, used_idx: 0 };
        let s = segs(&mem, 1, 1);
        let head = q.add_chain(&mem, &s, 7).unwrap();
        // Length larger than the writable part.
        dev.put_used(&mem, &q, u32::from(head), 65);
        assert!(matches!(q.pop_used(&mem), Err(QueueError::DeviceBug { .. })));
        // Fresh queue: id not in flight.
        let mut q = SplitQueue::new(&mem, 2, 8, false, false).unwrap();
        let mut dev = FakeDevice { last_avail: 0, used_idx: 0 };
        q.add_chain(&mem, &s, 7).unwrap();
        dev.put_used(&mem, &q, 5, 0);
        assert!(matches!(q.pop_used(&mem), Err(QueueError::DeviceBug { .. })));
        // Fresh queue: used idx runs ahead.
        let mut q = SplitQueue::new(&mem, 2, 8, false, false).unwrap();
        q.add_chain(&mem, &s, 7).unwrap();
        mem.store_u16(q.used_addr() + 2, 3, Ordering::Release).unwrap();
        assert!(matches!(q.pop_used(&mem), Err(QueueError::DeviceBug { .. })));
    }

    #[test]
    fn notification_suppression() {
        let mem = GuestRam::new(1 << 20, 1 << 32).unwrap();
        let s = segs(&mem, 1, 1);
        // NO_NOTIFY.
        let mut q = SplitQueue::new(&mem, 1, 8, false, false).unwrap();
        mem.store_u16(q.used_addr(), VRING_USED_F_NO_NOTIFY, Ordering::Release).unwrap();
        q.add_chain(&mem, &s, 1).unwrap();
        assert!(!q.kick_prepare(&mem).unwrap());
        // EVENT_IDX: avail_event = 0 means "kick when idx moves past 0".
        let mut q = SplitQueue::new(&mem, 1, 8, true, false).unwrap();
        q.add_chain(&mem, &s, 1).unwrap();
        assert!(q.kick_prepare(&mem).unwrap());
        q.add_chain(&mem, &s, 2).unwrap();
        assert!(!q.kick_prepare(&mem).unwrap());
        // Interrupt suppression writes used_event / flags.
        q.disable_interrupts(&mem).unwrap();
        assert_eq!(mem.load_u16(q.avail_addr() + 4 + 16, Ordering::Acquire).unwrap(), 0);
        let mut q2 = SplitQueue::new(&mem, 1, 8, false, false).unwrap();
        q2.disable_interrupts(&mem).unwrap();
        assert_eq!(mem.load_u16(q2.avail_addr(), Ordering::Acquire).unwrap(), 1);
        assert!(!q2.enable_interrupts(&mem).unwrap());
        assert_eq!(mem.load_u16(q2.avail_addr(), Ordering::Acquire).unwrap(), 0);
    }
}
