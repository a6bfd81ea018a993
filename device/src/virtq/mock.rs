//! A driver-side writer of split and packed rings in a [`GuestMem`], for tests (feature
//! `test-utils`; always on in this crate's own tests).
//!
//! Why two driver-side implementations in the device's tests: this one, written from the virtio
//! spec beside the device's rings, knows packed rings and both layouts' event suppression, and
//! can write deliberately broken rings (raw descriptors, any avail index). The `virtio-queue`
//! crate's `mock` (its `test-utils` feature, a dev-dependency) is independent of this crate
//! altogether: the split-ring tests also build rings with it, so a layout mistake made the same
//! way in our device and in our mock cannot cancel out. (The host driver model in `tools/` is a
//! third, over the real socket.)
//!
//! ```text
//! split:  desc table at cfg.desc, avail ring at cfg.avail, used ring at cfg.used
//! packed: descriptor ring at cfg.desc, driver event area at cfg.avail, device event area at cfg.used
//! ```
//!
//! Indirect tables are placed from an address the test gives ([`SplitDriver::with_indirect_at`]);
//! buffers are wherever the test says: the mock only writes ring memory.

use std::sync::atomic::{fence, Ordering};

use vm_memory::{Bytes, GuestAddress};

use super::desc::{DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, PACKED_F_AVAIL, PACKED_F_USED};
use crate::memory::GuestMem;
use crate::pci::QueueConfig;

/// One buffer as the driver describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    /// Guest address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Device-writable (`VRING_DESC_F_WRITE`).
    pub write: bool,
}

impl Buf {
    /// A device-readable buffer.
    pub fn readable(addr: u64, len: u32) -> Self {
        Buf { addr, len, write: false }
    }

    /// A device-writable buffer.
    pub fn writable(addr: u64, len: u32) -> Self {
        Buf { addr, len, write: true }
    }

    fn flags(&self) -> u16 {
        if self.write {
            DESC_F_WRITE
        } else {
            0
        }
    }
}

/// A returned buffer read back from the used ring: (id, written length).
pub type UsedElem = (u16, u32);

fn raw_desc(addr: u64, len: u32, a: u16, b: u16) -> [u8; 16] {
    let mut raw = [0u8; 16];
    raw[0..8].copy_from_slice(&addr.to_le_bytes());
    raw[8..12].copy_from_slice(&len.to_le_bytes());
    raw[12..14].copy_from_slice(&a.to_le_bytes());
    raw[14..16].copy_from_slice(&b.to_le_bytes());
    raw
}

fn put_u16(mem: &GuestMem, at: u64, v: u16) {
    mem.write_obj(v.to_le(), GuestAddress(at)).expect("mock: ring memory not mapped");
}

fn get_u16(mem: &GuestMem, at: u64) -> u16 {
    u16::from_le(mem.read_obj(GuestAddress(at)).expect("mock: ring memory not mapped"))
}

fn get_u32(mem: &GuestMem, at: u64) -> u32 {
    u32::from_le(mem.read_obj(GuestAddress(at)).expect("mock: ring memory not mapped"))
}

/// Writes a plain (non-indirect) descriptor table of `bufs` at `at`, split layout, entries
/// linked in order; returns its byte length.
fn write_split_table(mem: &GuestMem, at: u64, bufs: &[Buf]) -> u32 {
    for (i, b) in bufs.iter().enumerate() {
        let last = i + 1 == bufs.len();
        let flags = b.flags() | if last { 0 } else { DESC_F_NEXT };
        let next = if last { 0 } else { i as u16 + 1 };
        let raw = raw_desc(b.addr, b.len, flags, next);
        mem.write_slice(&raw, GuestAddress(at + 16 * i as u64)).expect("mock: table not mapped");
    }
    16 * bufs.len() as u32
}

/// The driver side of a split ring.
pub struct SplitDriver<'m> {
    mem: &'m GuestMem,
    cfg: QueueConfig,
    /// Next free descriptor slot (descriptors are handed out round-robin).
    next_desc: u16,
    /// The driver's avail index.
    avail_idx: u16,
    /// Used entries read back so far.
    used_seen: u16,
    /// Where the next indirect table goes.
    indirect_at: u64,
}

impl<'m> SplitDriver<'m> {
    /// A driver of the queue `cfg` (rings zeroed: avail and used index 0).
    pub fn new(mem: &'m GuestMem, cfg: QueueConfig) -> Self {
        let n = u64::from(cfg.size);
        let zero = |at: u64, len: u64| {
            mem.write_slice(&vec![0u8; len as usize], GuestAddress(at)).expect("mock: ring not mapped")
        };
        zero(cfg.desc, 16 * n);
        zero(cfg.avail, 6 + 2 * n);
        zero(cfg.used, 6 + 8 * n);
        SplitDriver { mem, cfg, next_desc: 0, avail_idx: 0, used_seen: 0, indirect_at: 0 }
    }

    /// Places indirect tables from `addr` on.
    pub fn with_indirect_at(mut self, addr: u64) -> Self {
        self.indirect_at = addr;
        self
    }

    /// The queue configuration the device is given.
    pub fn config(&self) -> QueueConfig {
        self.cfg
    }

    /// Writes descriptor `index` of the table at `table` as is (for malformed chains).
    pub fn write_desc(&self, table: u64, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let raw = raw_desc(addr, len, flags, next);
        self.mem.write_slice(&raw, GuestAddress(table + 16 * u64::from(index))).expect("mock: not mapped");
    }

    fn take_desc(&mut self) -> u16 {
        let d = self.next_desc;
        self.next_desc = (self.next_desc + 1) % self.cfg.size;
        d
    }

    /// Writes `bufs` as a chain in the ring's table; returns its head (not yet available).
    pub fn add_chain(&mut self, bufs: &[Buf]) -> u16 {
        let slots: Vec<u16> = bufs.iter().map(|_| self.take_desc()).collect();
        for (i, b) in bufs.iter().enumerate() {
            let next = slots.get(i + 1).copied();
            let flags = b.flags() | if next.is_some() { DESC_F_NEXT } else { 0 };
            self.write_desc(self.cfg.desc, slots[i], b.addr, b.len, flags, next.unwrap_or(0));
        }
        slots[0]
    }

    /// Writes `bufs` as an indirect table and one ring descriptor pointing at it; returns the head.
    pub fn add_indirect(&mut self, bufs: &[Buf]) -> u16 {
        let table = self.indirect_at;
        let len = write_split_table(self.mem, table, bufs);
        self.indirect_at += u64::from(len).next_multiple_of(16);
        let head = self.take_desc();
        self.write_desc(self.cfg.desc, head, table, len, DESC_F_INDIRECT, 0);
        head
    }

    /// Puts `head` in the avail ring and publishes the new avail index (release order, as a
    /// driver must).
    pub fn make_available(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.cfg.size);
        put_u16(self.mem, self.cfg.avail + 4 + 2 * slot, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        fence(Ordering::Release);
        put_u16(self.mem, self.cfg.avail + 2, self.avail_idx);
    }

    /// [`Self::add_chain`] then [`Self::make_available`]; returns the head.
    pub fn push(&mut self, bufs: &[Buf]) -> u16 {
        let head = self.add_chain(bufs);
        self.make_available(head);
        head
    }

    /// Stores `idx` as the avail index, whatever the ring holds (for corrupt rings).
    pub fn set_avail_idx(&mut self, idx: u16) {
        self.avail_idx = idx;
        put_u16(self.mem, self.cfg.avail + 2, idx);
    }

    /// The avail ring's flags (`VRING_AVAIL_F_NO_INTERRUPT`).
    pub fn set_avail_flags(&self, flags: u16) {
        put_u16(self.mem, self.cfg.avail, flags);
    }

    /// `used_event` (EVENT_IDX): interrupt once the used index passes `idx`.
    pub fn set_used_event(&self, idx: u16) {
        put_u16(self.mem, self.cfg.avail + 4 + 2 * u64::from(self.cfg.size), idx);
    }

    /// The used ring's flags (`VRING_USED_F_NO_NOTIFY`).
    pub fn used_flags(&self) -> u16 {
        get_u16(self.mem, self.cfg.used)
    }

    /// `avail_event` (EVENT_IDX): the avail index after which the device wants a doorbell.
    pub fn avail_event(&self) -> u16 {
        get_u16(self.mem, self.cfg.used + 4 + 8 * u64::from(self.cfg.size))
    }

    /// The device's published used index.
    pub fn used_idx(&self) -> u16 {
        get_u16(self.mem, self.cfg.used + 2)
    }

    /// The next used entry the device published, if any.
    pub fn next_used(&mut self) -> Option<UsedElem> {
        if self.used_idx() == self.used_seen {
            return None;
        }
        fence(Ordering::Acquire);
        let at = self.cfg.used + 4 + 8 * u64::from(self.used_seen % self.cfg.size);
        self.used_seen = self.used_seen.wrapping_add(1);
        Some((get_u32(self.mem, at) as u16, get_u32(self.mem, at + 4)))
    }
}

/// The driver side of a packed ring.
pub struct PackedDriver<'m> {
    mem: &'m GuestMem,
    cfg: QueueConfig,
    /// Next ring slot to fill, and the driver's wrap counter.
    next_avail: u16,
    avail_wrap: bool,
    /// Next ring slot to read a used descriptor from, and its wrap counter.
    next_used: u16,
    used_wrap: bool,
    /// Ring slots each outstanding buffer id took.
    slots: Vec<u16>,
    indirect_at: u64,
}

impl<'m> PackedDriver<'m> {
    /// A driver of the queue `cfg` (ring and event areas zeroed; both wrap counters 1).
    pub fn new(mem: &'m GuestMem, cfg: QueueConfig) -> Self {
        mem.write_slice(&vec![0u8; 16 * usize::from(cfg.size)], GuestAddress(cfg.desc))
            .expect("mock: ring not mapped");
        mem.write_slice(&[0u8; 4], GuestAddress(cfg.avail)).expect("mock: driver area not mapped");
        mem.write_slice(&[0u8; 4], GuestAddress(cfg.used)).expect("mock: device area not mapped");
        PackedDriver {
            mem,
            cfg,
            next_avail: 0,
            avail_wrap: true,
            next_used: 0,
            used_wrap: true,
            slots: vec![0; usize::from(cfg.size)],
            indirect_at: 0,
        }
    }

    /// Places indirect tables from `addr` on.
    pub fn with_indirect_at(mut self, addr: u64) -> Self {
        self.indirect_at = addr;
        self
    }

    /// The queue configuration the device is given.
    pub fn config(&self) -> QueueConfig {
        self.cfg
    }

    /// AVAIL/USED flags of an available descriptor for wrap counter `wrap`.
    pub fn avail_flags(wrap: bool) -> u16 {
        if wrap {
            PACKED_F_AVAIL
        } else {
            PACKED_F_USED
        }
    }

    /// Writes ring slot `slot` as is (for malformed rings): `flags` are stored last.
    pub fn write_desc(&self, slot: u16, addr: u64, len: u32, id: u16, flags: u16) {
        let at = self.cfg.desc + 16 * u64::from(slot);
        let raw = raw_desc(addr, len, id, 0);
        self.mem.write_slice(&raw[..14], GuestAddress(at)).expect("mock: ring not mapped");
        fence(Ordering::Release);
        put_u16(self.mem, at + 14, flags);
    }

    /// Makes `bufs` available as buffer `id` in the next ring slots (the head's flags written
    /// last, as a driver must); returns `id`.
    pub fn push(&mut self, bufs: &[Buf], id: u16) -> u16 {
        let descs: Vec<(u64, u32, u16)> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| (b.addr, b.len, b.flags() | if i + 1 < bufs.len() { DESC_F_NEXT } else { 0 }))
            .collect();
        self.push_raw(&descs, id)
    }

    /// Makes `bufs` available as buffer `id` through one indirect descriptor; returns `id`.
    pub fn push_indirect(&mut self, bufs: &[Buf], id: u16) -> u16 {
        let table = self.indirect_at;
        let mut len = 0;
        for (i, b) in bufs.iter().enumerate() {
            // Packed indirect tables have no NEXT: the entries are read in order.
            let raw = raw_desc(b.addr, b.len, 0, b.flags());
            self.mem.write_slice(&raw, GuestAddress(table + 16 * i as u64)).expect("mock: not mapped");
            len += 16;
        }
        self.indirect_at += u64::from(len).next_multiple_of(16);
        self.push_raw(&[(table, len, DESC_F_INDIRECT)], id)
    }

    /// Makes descriptors `(addr, len, flags without AVAIL/USED)` available as buffer `id`, one
    /// ring slot each, id in every descriptor; the head's flags go last.
    pub fn push_raw(&mut self, descs: &[(u64, u32, u16)], id: u16) -> u16 {
        let (head, head_wrap) = (self.next_avail, self.avail_wrap);
        for (i, &(addr, len, flags)) in descs.iter().enumerate() {
            let flags = flags | Self::avail_flags(self.avail_wrap);
            if i == 0 {
                let raw = raw_desc(addr, len, id, 0);
                let at = self.cfg.desc + 16 * u64::from(self.next_avail);
                self.mem.write_slice(&raw[..14], GuestAddress(at)).expect("mock: ring not mapped");
            } else {
                self.write_desc(self.next_avail, addr, len, id, flags);
            }
            self.next_avail += 1;
            if self.next_avail == self.cfg.size {
                self.next_avail = 0;
                self.avail_wrap = !self.avail_wrap;
            }
        }
        if let Some(s) = self.slots.get_mut(usize::from(id)) {
            *s = descs.len() as u16;
        }
        let head_flags = descs.first().map_or(0, |d| d.2) | Self::avail_flags(head_wrap);
        fence(Ordering::Release);
        put_u16(self.mem, self.cfg.desc + 16 * u64::from(head) + 14, head_flags);
        id
    }

    /// The next buffer the device returned, if any.
    pub fn next_used(&mut self) -> Option<UsedElem> {
        let at = self.cfg.desc + 16 * u64::from(self.next_used);
        let flags = get_u16(self.mem, at + 14);
        let used =
            (flags & PACKED_F_AVAIL != 0) == self.used_wrap && (flags & PACKED_F_USED != 0) == self.used_wrap;
        if !used {
            return None;
        }
        fence(Ordering::Acquire);
        let (len, id) = (get_u32(self.mem, at + 8), get_u16(self.mem, at + 12));
        let taken = self.slots.get(usize::from(id)).copied().unwrap_or(1).max(1);
        let next = self.next_used + taken;
        if next >= self.cfg.size {
            self.next_used = next - self.cfg.size;
            self.used_wrap = !self.used_wrap;
        } else {
            self.next_used = next;
        }
        Some((id, len))
    }

    /// Flags of ring slot `slot`.
    pub fn flags_at(&self, slot: u16) -> u16 {
        get_u16(self.mem, self.cfg.desc + 16 * u64::from(slot) + 14)
    }

    /// The driver event suppression area: `off_wrap` and flags (ENABLE, DISABLE, DESC).
    pub fn set_driver_event(&self, off_wrap: u16, flags: u16) {
        put_u16(self.mem, self.cfg.avail, off_wrap);
        put_u16(self.mem, self.cfg.avail + 2, flags);
    }

    /// The device event suppression flags (what the device wants in the way of doorbells).
    pub fn device_event_flags(&self) -> u16 {
        get_u16(self.mem, self.cfg.used + 2)
    }
}

/// A fresh guest memory of `size` bytes at address 0 (one DMA window over a temporary file), and
/// optionally a second window `(address, size)`.
pub fn guest_memory(size: u64, second: Option<(u64, u64)>) -> std::sync::Arc<GuestMem> {
    let mut t = crate::memory::DmaTable::default();
    for (addr, len) in std::iter::once((0, size)).chain(second) {
        let f = crate::memory::memfd("mock-guest", len).expect("mock: memfd");
        t.map(addr, len, 0, Some(f)).expect("mock: map");
    }
    t.snapshot()
}
