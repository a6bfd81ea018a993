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

use thiserror::Error;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, VolatileMemory, VolatileSlice};

use crate::memory::GuestMem;
use crate::pci::QueueConfig;

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const DESC_F_INDIRECT: u16 = 4;
const AVAIL_F_NO_INTERRUPT: u16 = 1;
const USED_F_NO_NOTIFY: u16 = 1;

/// Most buffers one request may have (a 1 MiB FUSE write is ~260 descriptors).
pub const MAX_CHAIN_BUFS: usize = 1024;

/// A corrupt ring: the queue cannot be served until the driver resets the device.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum QueueError {
    /// Ring memory is not inside a mapped DMA window.
    #[error("ring of queue {0} is outside guest memory")]
    RingUnmapped(u16),
    /// Ring addresses are misaligned or the size is not a power of two.
    #[error("queue {0} is misconfigured (size or alignment)")]
    BadConfig(u16),
    /// The driver's avail index ran more than a ring ahead of the device.
    #[error("queue {queue}: avail index {avail} is {ahead} entries ahead (ring size {size})")]
    AvailOverrun {
        /// Queue index.
        queue: u16,
        /// The avail index read.
        avail: u16,
        /// How far ahead of the device it is.
        ahead: u16,
        /// Ring size.
        size: u16,
    },
    /// A head descriptor index out of range.
    #[error("queue {queue}: head descriptor {head} out of range")]
    BadHead {
        /// Queue index.
        queue: u16,
        /// The head index read.
        head: u16,
    },
}

/// A malformed descriptor chain: fails its own request only.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum ChainError {
    /// A descriptor's `next` is out of range.
    #[error("descriptor index {0} out of range")]
    BadIndex(u16),
    /// The chain is longer than its table: it loops.
    #[error("descriptor chain loops")]
    Loop,
    /// More buffers than [`MAX_CHAIN_BUFS`].
    #[error("descriptor chain too long")]
    TooLong,
    /// A device-readable buffer after a device-writable one.
    #[error("readable descriptor after a writable one")]
    ReadAfterWrite,
    /// Indirect descriptors were not negotiated, are nested, are combined with NEXT, or the
    /// table is empty or not a multiple of 16 bytes.
    #[error("invalid indirect descriptor")]
    BadIndirect,
    /// A buffer is not inside mapped guest memory.
    #[error("buffer {addr:#x}+{len:#x} is outside guest memory")]
    BadBuffer {
        /// Buffer address.
        addr: u64,
        /// Buffer length.
        len: u32,
    },
}

/// The buffers of one request, as guest-memory slices.
#[derive(Default)]
pub struct Chain<'m> {
    /// Head descriptor index (the id returned in the used ring).
    pub head: u16,
    /// Device-readable buffers, in order.
    pub readable: heapless::Vec<VolatileSlice<'m>, MAX_CHAIN_BUFS>,
    /// Device-writable buffers, in order.
    pub writable: heapless::Vec<VolatileSlice<'m>, MAX_CHAIN_BUFS>,
}

#[derive(Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

/// A descriptor table (a ring's or an indirect one) resolved to guest memory once, so that each
/// descriptor is one 16-byte volatile load instead of a region lookup and a byte copy.
pub(crate) struct DescTable<'m> {
    slice: VolatileSlice<'m>,
}

impl<'m> DescTable<'m> {
    /// The `entries`-long table at `addr`; `None` unless it lies inside one mapped region.
    pub(crate) fn new(mem: &'m GuestMem, addr: u64, entries: u32) -> Option<Self> {
        let len = usize::try_from(u64::from(entries) * 16).ok()?;
        mem.get_slice(GuestAddress(addr), len).ok().map(|slice| DescTable { slice })
    }

    /// The raw 16 bytes of descriptor `index` (`None` past the end).
    pub(crate) fn raw(&self, index: u16) -> Option<[u8; 16]> {
        self.slice.get_ref::<[u8; 16]>(usize::from(index) * 16).ok().map(|r| r.load())
    }

    fn split(&self, index: u16) -> Option<Desc> {
        let raw = self.raw(index)?;
        Some(Desc {
            addr: u64::from_le_bytes(raw[0..8].try_into().ok()?),
            len: u32::from_le_bytes(raw[8..12].try_into().ok()?),
            flags: u16::from_le_bytes([raw[12], raw[13]]),
            next: u16::from_le_bytes([raw[14], raw[15]]),
        })
    }
}

/// A split virtqueue owned by one poller.
#[derive(Debug)]
pub struct SplitQueue {
    cfg: QueueConfig,
    event_idx: bool,
    indirect: bool,
    next_avail: u16,
    next_used: u16,
    /// Used index when the driver was last interrupted (for EVENT_IDX).
    signalled_used: u16,
    /// Used entries published since the last interrupt decision.
    unsignalled: bool,
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
            signalled_used: 0,
            unsignalled: false,
        })
    }

    /// Queue index.
    pub fn index(&self) -> u16 {
        self.cfg.index
    }

    /// MSI-X vector.
    pub fn vector(&self) -> u16 {
        self.cfg.vector
    }

    /// Checks the rings lie in mapped memory and tells the driver not to notify us (poll mode).
    pub fn attach(&mut self, mem: &GuestMem) -> Result<(), QueueError> {
        let q = self.cfg.index;
        let n = u64::from(self.cfg.size);
        let ranges = [(self.cfg.desc, 16 * n), (self.cfg.avail, 6 + 2 * n), (self.cfg.used, 6 + 8 * n)];
        for (addr, len) in ranges {
            if mem.get_slice(GuestAddress(addr), len as usize).is_err() {
                return Err(QueueError::RingUnmapped(q));
            }
        }
        let used_flags = if self.event_idx { 0 } else { USED_F_NO_NOTIFY };
        mem.store(used_flags.to_le(), GuestAddress(self.cfg.used), Ordering::Relaxed)
            .map_err(|_| QueueError::RingUnmapped(q))?;
        // Pick up where the used ring is (0 after reset), so a re-attach after a memory change
        // does not replay requests.
        let used_idx: u16 = mem
            .load(GuestAddress(self.cfg.used + 2), Ordering::Acquire)
            .map_err(|_| QueueError::RingUnmapped(q))?;
        self.next_used = u16::from_le(used_idx);
        self.next_avail = self.next_used;
        self.signalled_used = self.next_used;
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
        Ok(ahead)
    }

    /// Takes the next available head index.
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
        self.next_avail = self.next_avail.wrapping_add(1);
        Ok(head)
    }

    /// Validates the chain starting at `head` and maps its buffers into `chain` (cleared first;
    /// the caller reuses one `Chain` so that no 32 KiB buffer list is moved per request).
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
            let d = table.split(index).ok_or(ChainError::BadIndex(index))?;
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
    pub fn push_used(&mut self, mem: &GuestMem, head: u16, len: u32) -> Result<(), QueueError> {
        let slot = u64::from(self.next_used % self.cfg.size);
        let at = GuestAddress(self.cfg.used + 4 + 8 * slot);
        let mut elem = [0u8; 8];
        elem[..4].copy_from_slice(&u32::from(head).to_le_bytes());
        elem[4..].copy_from_slice(&len.to_le_bytes());
        mem.write_slice(&elem, at).map_err(|_| QueueError::RingUnmapped(self.cfg.index))?;
        self.next_used = self.next_used.wrapping_add(1);
        Ok(())
    }

    /// Publishes the used entries pushed so far (one index store per poll round).
    pub fn publish_used(&mut self, mem: &GuestMem) -> Result<(), QueueError> {
        fence(Ordering::Release);
        mem.store(self.next_used.to_le(), GuestAddress(self.cfg.used + 2), Ordering::Release)
            .map_err(|_| QueueError::RingUnmapped(self.cfg.index))?;
        self.unsignalled = true;
        Ok(())
    }

    /// Whether the driver wants an interrupt for what was published since the last one.
    pub fn needs_interrupt(&mut self, mem: &GuestMem) -> bool {
        if !self.unsignalled {
            return false;
        }
        self.unsignalled = false;
        // Order our used-index store before reading the driver's suppression fields.
        fence(Ordering::SeqCst);
        let (old, new) = (self.signalled_used, self.next_used);
        if self.event_idx {
            let at = GuestAddress(self.cfg.avail + 4 + 2 * u64::from(self.cfg.size));
            let Ok(event) = mem.load::<u16>(at, Ordering::Acquire) else {
                return true;
            };
            let event = u16::from_le(event);
            self.signalled_used = new;
            // vring_need_event: did new pass event since old?
            new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            let flags = mem.load::<u16>(GuestAddress(self.cfg.avail), Ordering::Acquire).unwrap_or(0);
            self.signalled_used = new;
            u16::from_le(flags) & AVAIL_F_NO_INTERRUPT == 0
        }
    }
}

/// A virtqueue of either layout, as negotiated (VIRTIO_F_RING_PACKED or not).
#[derive(Debug)]
pub enum Ring {
    /// Split virtqueue.
    Split(SplitQueue),
    /// Packed virtqueue.
    Packed(crate::packed::PackedQueue),
}

impl Ring {
    /// The queue the driver configured, in the layout `features` negotiated.
    pub fn new(cfg: QueueConfig, features: u64) -> Result<Ring, QueueError> {
        use crate::pci::features as f;
        let (event_idx, indirect) = (features & f::EVENT_IDX != 0, features & f::INDIRECT_DESC != 0);
        if features & f::RING_PACKED != 0 {
            crate::packed::PackedQueue::new(cfg, event_idx, indirect).map(Ring::Packed)
        } else {
            SplitQueue::new(cfg, event_idx, indirect).map(Ring::Split)
        }
    }

    /// Queue index.
    pub fn index(&self) -> u16 {
        match self {
            Ring::Split(q) => q.index(),
            Ring::Packed(q) => q.index(),
        }
    }

    /// MSI-X vector.
    pub fn vector(&self) -> u16 {
        match self {
            Ring::Split(q) => q.vector(),
            Ring::Packed(q) => q.vector(),
        }
    }

    /// Checks the ring lies in mapped memory and turns driver notifications off.
    pub fn attach(&mut self, mem: &GuestMem) -> Result<(), QueueError> {
        match self {
            Ring::Split(q) => q.attach(mem),
            Ring::Packed(q) => q.attach(mem),
        }
    }

    /// Asks the driver for a notification after its next request (`on`) or for none (see
    /// [`SplitQueue::set_notify`]; packed rings use the device event suppression flags).
    pub fn set_notify(&mut self, mem: &GuestMem, on: bool) -> Result<(), QueueError> {
        match self {
            Ring::Split(q) => q.set_notify(mem, on),
            Ring::Packed(q) => q.set_notify(mem, on),
        }
    }

    /// Whether a request is waiting (a cheap check: one or two loads).
    pub fn has_work(&self, mem: &GuestMem) -> Result<bool, QueueError> {
        match self {
            Ring::Split(q) => Ok(q.pending(mem)? > 0),
            Ring::Packed(q) => q.has_work(mem),
        }
    }

    /// Takes the next request into `chain` (`chain.head` = the token to complete it with).
    /// `Ok(None)`: nothing available; `Ok(Some(Err))`: a malformed chain to return unserved.
    pub fn next<'m>(
        &mut self,
        mem: &'m GuestMem,
        chain: &mut Chain<'m>,
    ) -> Result<Option<Result<(), ChainError>>, QueueError> {
        match self {
            Ring::Split(q) => {
                if q.pending(mem)? == 0 {
                    return Ok(None);
                }
                let head = q.pop_head(mem)?;
                let r = q.chain(mem, head, chain);
                chain.head = head;
                Ok(Some(r))
            }
            Ring::Packed(q) => q.next(mem, chain),
        }
    }

    /// Returns request `token` with `len` bytes written.
    pub fn push_used(&mut self, mem: &GuestMem, token: u16, len: u32) -> Result<(), QueueError> {
        match self {
            Ring::Split(q) => q.push_used(mem, token, len),
            Ring::Packed(q) => q.push_used(mem, token, len),
        }
    }

    /// Makes the returned requests visible (split: one used-index store per round; packed
    /// descriptors are visible as they are written).
    pub fn publish_used(&mut self, mem: &GuestMem) -> Result<(), QueueError> {
        match self {
            Ring::Split(q) => q.publish_used(mem),
            Ring::Packed(_) => Ok(()),
        }
    }

    /// Whether the driver wants an interrupt now.
    pub fn needs_interrupt(&mut self, mem: &GuestMem) -> bool {
        match self {
            Ring::Split(q) => q.needs_interrupt(mem),
            Ring::Packed(q) => q.needs_interrupt(mem),
        }
    }
}

pub(crate) fn push_slices<'m>(
    mem: &'m GuestMem,
    addr: u64,
    len: u32,
    out: &mut heapless::Vec<VolatileSlice<'m>, MAX_CHAIN_BUFS>,
) -> Result<(), ChainError> {
    let bad = ChainError::BadBuffer { addr, len };
    let start = GuestAddress(addr);
    if start.checked_add(u64::from(len)).is_none() {
        return Err(bad);
    }
    // Fast path: the buffer lies in one region.
    if let Ok(s) = mem.get_slice(start, len as usize) {
        return out.push(s).map_err(|_| ChainError::TooLong);
    }
    // A buffer spanning adjacent DMA windows.
    let mut covered = 0usize;
    for s in mem.get_slices(start, len as usize) {
        let s = s.map_err(|_| bad)?;
        covered += s.len();
        out.push(s).map_err(|_| ChainError::TooLong)?;
    }
    if covered == len as usize {
        Ok(())
    } else {
        Err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::DmaTable;

    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;

    fn setup(size: u16) -> (std::sync::Arc<GuestMem>, SplitQueue) {
        let mut t = DmaTable::default();
        let f = tempfile::tempfile().unwrap();
        f.set_len(0x20000).unwrap();
        t.map(0, 0x20000, 0, Some(f)).unwrap();
        let mem = t.snapshot();
        let cfg = QueueConfig { index: 1, size, desc: DESC, avail: AVAIL, used: USED, vector: 1 };
        let mut q = SplitQueue::new(cfg, true, true).unwrap();
        q.attach(&mem).unwrap();
        (mem, q)
    }

    fn desc(mem: &GuestMem, table: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_slice(&raw, GuestAddress(table + 16 * u64::from(i))).unwrap();
    }

    fn make_avail(mem: &GuestMem, heads: &[u16]) {
        for (i, h) in heads.iter().enumerate() {
            mem.write_obj(*h, GuestAddress(AVAIL + 4 + 2 * i as u64)).unwrap();
        }
        mem.write_obj(heads.len() as u16, GuestAddress(AVAIL + 2)).unwrap();
    }

    #[test]
    fn simple_chain_roundtrip() {
        let (mem, mut q) = setup(8);
        desc(&mem, DESC, 0, 0x8000, 40, DESC_F_NEXT, 1);
        desc(&mem, DESC, 1, 0x9000, 100, DESC_F_WRITE, 0);
        make_avail(&mem, &[0]);
        assert_eq!(q.pending(&mem), Ok(1));
        let h = q.pop_head(&mem).unwrap();
        let mut c = Chain::default();
        q.chain(&mem, h, &mut c).unwrap();
        assert_eq!((c.readable.len(), c.writable.len()), (1, 1));
        assert_eq!((c.readable[0].len(), c.writable[0].len()), (40, 100));
        q.push_used(&mem, h, 16).unwrap();
        q.publish_used(&mem).unwrap();
        assert_eq!(mem.read_obj::<u16>(GuestAddress(USED + 2)).unwrap(), 1);
        assert_eq!(mem.read_obj::<u32>(GuestAddress(USED + 8)).unwrap(), 16);
        // used_event = 0: the driver wants an interrupt for entry 0.
        assert!(q.needs_interrupt(&mem));
        assert!(!q.needs_interrupt(&mem), "nothing new");
    }

    #[test]
    fn indirect_chain() {
        let (mem, q) = setup(8);
        desc(&mem, 0x5000, 0, 0x8000, 40, DESC_F_NEXT, 1);
        desc(&mem, 0x5000, 1, 0x9000, 4096, DESC_F_WRITE | DESC_F_NEXT, 2);
        desc(&mem, 0x5000, 2, 0xa000, 4096, DESC_F_WRITE, 0);
        desc(&mem, DESC, 3, 0x5000, 48, DESC_F_INDIRECT, 0);
        let mut c = Chain::default();
        q.chain(&mem, 3, &mut c).unwrap();
        assert_eq!((c.readable.len(), c.writable.len()), (1, 2));
    }

    #[test]
    fn malformed_chains_fail_alone() {
        let (mem, q) = setup(8);
        // Loop: 0 -> 1 -> 0.
        desc(&mem, DESC, 0, 0x8000, 8, DESC_F_NEXT, 1);
        desc(&mem, DESC, 1, 0x8000, 8, DESC_F_NEXT, 0);
        assert_eq!(q.chain(&mem, 0, &mut Chain::default()).err(), Some(ChainError::Loop));
        // next out of range.
        desc(&mem, DESC, 2, 0x8000, 8, DESC_F_NEXT, 99);
        assert_eq!(q.chain(&mem, 2, &mut Chain::default()).err(), Some(ChainError::BadIndex(99)));
        // readable after writable.
        desc(&mem, DESC, 3, 0x8000, 8, DESC_F_WRITE | DESC_F_NEXT, 4);
        desc(&mem, DESC, 4, 0x8000, 8, 0, 0);
        assert_eq!(q.chain(&mem, 3, &mut Chain::default()).err(), Some(ChainError::ReadAfterWrite));
        // buffer outside memory, and one that wraps the address space.
        desc(&mem, DESC, 5, 0x1f000, 0x2000, 0, 0);
        assert!(matches!(q.chain(&mem, 5, &mut Chain::default()), Err(ChainError::BadBuffer { .. })));
        desc(&mem, DESC, 5, u64::MAX - 4, 100, 0, 0);
        assert!(matches!(q.chain(&mem, 5, &mut Chain::default()), Err(ChainError::BadBuffer { .. })));
        // indirect with NEXT, nested indirect, bad size.
        desc(&mem, DESC, 6, 0x5000, 32, DESC_F_INDIRECT | DESC_F_NEXT, 7);
        assert_eq!(q.chain(&mem, 6, &mut Chain::default()).err(), Some(ChainError::BadIndirect));
        desc(&mem, 0x5000, 0, 0x6000, 16, DESC_F_INDIRECT, 0);
        desc(&mem, DESC, 6, 0x5000, 16, DESC_F_INDIRECT, 0);
        assert_eq!(q.chain(&mem, 6, &mut Chain::default()).err(), Some(ChainError::BadIndirect));
        desc(&mem, DESC, 6, 0x5000, 17, DESC_F_INDIRECT, 0);
        assert_eq!(q.chain(&mem, 6, &mut Chain::default()).err(), Some(ChainError::BadIndirect));
        // Loop inside an indirect table.
        desc(&mem, 0x5000, 0, 0x8000, 8, DESC_F_NEXT, 1);
        desc(&mem, 0x5000, 1, 0x8000, 8, DESC_F_NEXT, 0);
        desc(&mem, DESC, 7, 0x5000, 32, DESC_F_INDIRECT, 0);
        assert_eq!(q.chain(&mem, 7, &mut Chain::default()).err(), Some(ChainError::Loop));
    }

    #[test]
    fn corrupt_rings_break_the_queue() {
        let (mem, mut q) = setup(8);
        mem.write_obj(9u16, GuestAddress(AVAIL + 2)).unwrap();
        assert!(matches!(q.pending(&mem), Err(QueueError::AvailOverrun { .. })));
        make_avail(&mem, &[8]);
        assert_eq!(q.pop_head(&mem), Err(QueueError::BadHead { queue: 1, head: 8 }));
        let cfg = QueueConfig { index: 2, size: 6, desc: DESC, avail: AVAIL, used: USED, vector: 0 };
        assert_eq!(SplitQueue::new(cfg, false, false).err(), Some(QueueError::BadConfig(2)));
        let cfg = QueueConfig { index: 2, size: 8, desc: 0x1ffc0, avail: AVAIL, used: USED, vector: 0 };
        let mut far = SplitQueue::new(cfg, false, false).unwrap();
        assert_eq!(far.attach(&mem), Err(QueueError::RingUnmapped(2)));
    }

    #[test]
    fn event_idx_suppresses() {
        let (mem, mut q) = setup(8);
        // Driver asks for an interrupt only after entry 2 (used_event = 2).
        mem.write_obj(2u16, GuestAddress(AVAIL + 4 + 2 * 8)).unwrap();
        for _ in 0..2 {
            q.push_used(&mem, 0, 0).unwrap();
            q.publish_used(&mem).unwrap();
            assert!(!q.needs_interrupt(&mem));
        }
        q.push_used(&mem, 0, 0).unwrap();
        q.publish_used(&mem).unwrap();
        assert!(q.needs_interrupt(&mem));
    }
}
