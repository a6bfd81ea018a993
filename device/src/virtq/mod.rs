//! Virtqueues, device side: the split ring ([`split`]) and the packed ring ([`packed`]) behind
//! one type, [`Ring`], so that the poller does not care which layout the driver negotiated.
//!
//! Modules, none importing one that imports it back:
//! - [`desc`]: what both layouts share: descriptor flags, the descriptor table read as one
//!   16-byte volatile load per descriptor, the request's buffer list ([`Chain`]), the errors;
//! - [`split`] and [`packed`]: the two layouts, siblings that import only `desc`;
//! - this module: [`Ring`], which picks one of them per queue;
//! - `mock` (feature `test-utils`, and in this crate's tests): a driver-side writer of both
//!   layouts for tests.
//!
//! Why our own walk rather than `virtio_queue::DescriptorChain`: that iterator silently ends a
//! chain at an invalid descriptor, and its `Reader`/`Writer` allocate per chain. Every chain is
//! validated before the handler sees it, and a bad chain fails only its own request; a corrupt
//! ring stops its queue and the device asks for a reset.

pub mod desc;
#[cfg(any(test, feature = "test-utils"))]
pub mod mock;
pub mod packed;
pub mod split;

pub use desc::{Chain, ChainError, QueueError, MAX_CHAIN_BUFS};
pub use packed::PackedQueue;
pub use split::SplitQueue;

use crate::memory::GuestMem;
use crate::pci::{features as f, QueueConfig};

/// A virtqueue of either layout, as negotiated (VIRTIO_F_RING_PACKED or not).
#[derive(Debug)]
pub enum Ring {
    /// Split virtqueue.
    Split(SplitQueue),
    /// Packed virtqueue.
    Packed(PackedQueue),
}

impl Ring {
    /// The queue the driver configured, in the layout `features` negotiated.
    pub fn new(cfg: QueueConfig, features: u64) -> Result<Ring, QueueError> {
        let (event_idx, indirect) = (features & f::EVENT_IDX != 0, features & f::INDIRECT_DESC != 0);
        if features & f::RING_PACKED != 0 {
            PackedQueue::new(cfg, event_idx, indirect).map(Ring::Packed)
        } else {
            SplitQueue::new(cfg, event_idx, indirect).map(Ring::Split)
        }
    }

    /// The queue as the driver configured it.
    pub fn config(&self) -> &QueueConfig {
        match self {
            Ring::Split(q) => q.config(),
            Ring::Packed(q) => q.config(),
        }
    }

    /// Queue index.
    pub fn index(&self) -> u16 {
        self.config().index
    }

    /// MSI-X vector.
    pub fn vector(&self) -> u16 {
        self.config().vector
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

    /// Whether the driver wants an interrupt now (called for every queue every round: inlined
    /// into the poller, the layouts' own checks not).
    #[inline]
    pub fn needs_interrupt(&mut self, mem: &GuestMem) -> bool {
        match self {
            Ring::Split(q) => q.needs_interrupt(mem),
            Ring::Packed(q) => q.needs_interrupt(mem),
        }
    }
}
