//! Driver side of the virtqueues, in the driver's guest memory: split rings ([`split`], virtio 1.2
//! section 2.7) and packed rings ([`packed`], section 2.8), behind one type, [`Virtqueue`], so that
//! the driver and its closed loop do not care which layout was negotiated.
//!
//! Both are written from the specification (cross-checked with Linux's `virtio_ring.c`), not from
//! the device crate, and both distrust the device: every used entry is checked against the
//! driver's own shadow of what is in flight (an id in range and in flight, a written length within
//! the chain's writable bytes), and a violation is [`QueueError::DeviceBug`], never a panic.
//!
//! What the two share is in `chain.rs`: the chain checks, the descriptor encoding (both layouts use
//! 16-byte descriptors `le64 addr, le32 len` followed by two 16-bit fields, in a different order),
//! the in-flight record and the pool of indirect tables (Linux allocates one per request; a reused
//! table keeps the driver model's allocator out of the request path).

use crate::memory::GuestRam;

mod chain;
pub mod packed;
pub mod split;

pub use chain::{
    vring_need_event, QueueError, Segment, UsedElem, VRING_AVAIL_F_NO_INTERRUPT, VRING_DESC_F_INDIRECT,
    VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_USED_F_NO_NOTIFY,
};
pub use packed::PackedQueue;
pub use split::SplitQueue;

/// Which virtqueue layout the driver asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum RingLayout {
    /// Split virtqueues (descriptor table, avail ring, used ring): every device has them.
    #[default]
    #[serde(rename = "split")]
    Split,
    /// Packed virtqueues (VIRTIO_F_RING_PACKED): one descriptor ring written by both sides.
    #[serde(rename = "packed")]
    Packed,
}

impl RingLayout {
    /// Both layouts.
    pub const ALL: [RingLayout; 2] = [RingLayout::Split, RingLayout::Packed];

    /// The layout's name (`split`, `packed`).
    pub fn name(self) -> &'static str {
        match self {
            RingLayout::Split => "split",
            RingLayout::Packed => "packed",
        }
    }
}

impl std::fmt::Display for RingLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One virtqueue of either layout: the calls the driver makes, dispatched without a virtual call.
#[derive(Debug)]
pub enum Virtqueue {
    /// A split ring.
    Split(SplitQueue),
    /// A packed ring.
    Packed(PackedQueue),
}

macro_rules! each {
    ($self:ident, $q:ident => $e:expr) => {
        match $self {
            Virtqueue::Split($q) => $e,
            Virtqueue::Packed($q) => $e,
        }
    };
}

impl Virtqueue {
    /// Allocates a queue of `layout` with `size` entries (power of two) in `mem`.
    pub fn new(
        layout: RingLayout,
        mem: &GuestRam,
        index: u16,
        size: u16,
        event_idx: bool,
        indirect: bool,
    ) -> Result<Virtqueue, QueueError> {
        Ok(match layout {
            RingLayout::Split => Virtqueue::Split(SplitQueue::new(mem, index, size, event_idx, indirect)?),
            RingLayout::Packed => Virtqueue::Packed(PackedQueue::new(mem, index, size, event_idx, indirect)?),
        })
    }

    /// The layout.
    pub fn layout(&self) -> RingLayout {
        match self {
            Virtqueue::Split(_) => RingLayout::Split,
            Virtqueue::Packed(_) => RingLayout::Packed,
        }
    }

    /// Frees the rings (the device must no longer use them).
    pub fn destroy(self, mem: &GuestRam) {
        each!(self, q => q.destroy(mem))
    }

    /// Queue index.
    pub fn index(&self) -> u16 {
        each!(self, q => q.index())
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        each!(self, q => q.size())
    }

    /// The three addresses for `queue_desc`, `queue_driver` and `queue_device`: descriptor
    /// table, avail ring, used ring (split); descriptor ring, driver and device event
    /// suppression (packed).
    pub fn addrs(&self) -> (u64, u64, u64) {
        match self {
            Virtqueue::Split(q) => (q.desc_addr(), q.avail_addr(), q.used_addr()),
            Virtqueue::Packed(q) => (q.ring_addr(), q.driver_event_addr(), q.device_event_addr()),
        }
    }

    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        each!(self, q => q.num_free())
    }

    /// Chains submitted and not yet completed.
    pub fn in_flight(&self) -> u16 {
        each!(self, q => q.in_flight())
    }

    /// Adds a chain (readable segments first, then writable) and makes it available.
    pub fn add_chain(&mut self, mem: &GuestRam, segs: &[Segment], token: u64) -> Result<u16, QueueError> {
        each!(self, q => q.add_chain(mem, segs, token))
    }

    /// Whether the device wants a notification for what was added since the last call.
    pub fn kick_prepare(&mut self, mem: &GuestRam) -> Result<bool, QueueError> {
        each!(self, q => q.kick_prepare(mem))
    }

    /// Takes the next used element, if any, after validating it.
    pub fn pop_used(&mut self, mem: &GuestRam) -> Result<Option<UsedElem>, QueueError> {
        each!(self, q => q.pop_used(mem))
    }

    /// Whether completions are pending.
    pub fn has_used(&self, mem: &GuestRam) -> Result<bool, QueueError> {
        each!(self, q => q.has_used(mem))
    }

    /// Asks the device not to interrupt.
    pub fn disable_interrupts(&mut self, mem: &GuestRam) -> Result<(), QueueError> {
        each!(self, q => q.disable_interrupts(mem))
    }

    /// Asks for an interrupt at the next used entry; returns whether entries are already pending.
    pub fn enable_interrupts(&mut self, mem: &GuestRam) -> Result<bool, QueueError> {
        each!(self, q => q.enable_interrupts(mem))
    }

    /// Where the device stands, for a timeout message.
    pub fn describe(&self, mem: &GuestRam) -> String {
        each!(self, q => q.describe(mem))
    }
}
