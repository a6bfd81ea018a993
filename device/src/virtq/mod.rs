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

/// Where a queue stands at a quiet point (every request taken was returned): what a process
/// that takes the queue over resumes it from (issue 22). Split rings keep it in guest memory as
/// well (the used index), packed rings only here (the wrap counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RingState {
    /// The queue's index.
    pub index: u16,
    /// The next position to take a request from, which is also the next to return one at.
    pub next: u16,
    /// Packed rings: the wrap counter at `next` (split rings: true).
    pub wrap: bool,
}

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

    /// The queue the driver configured, in the layout `features` negotiated, resuming where
    /// `state` says a quiet queue stood (a split ring's `attach` checks it against the used
    /// index in guest memory).
    pub fn resume(cfg: QueueConfig, features: u64, state: &RingState) -> Result<Ring, QueueError> {
        if state.index != cfg.index || state.next >= cfg.size.max(1) && features & f::RING_PACKED != 0 {
            return Err(QueueError::BadConfig(cfg.index));
        }
        let mut r = Ring::new(cfg, features)?;
        match &mut r {
            Ring::Split(q) => q.resume_at(state.next),
            Ring::Packed(q) => q.resume_at(state.next, state.wrap),
        }
        Ok(r)
    }

    /// Where the queue stands, if it is quiet: `None` while a request it took is not returned.
    pub fn quiet_state(&self) -> Option<RingState> {
        let index = self.index();
        match self {
            Ring::Split(q) => {
                let (avail, used) = q.positions();
                (avail == used).then_some(RingState { index, next: used, wrap: true })
            }
            Ring::Packed(q) => {
                let (avail, used) = q.positions();
                (avail == used).then_some(RingState { index, next: used.0, wrap: used.1 })
            }
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

#[cfg(test)]
mod tests {
    use super::mock::{guest_memory, Buf, PackedDriver, SplitDriver};
    use super::*;

    const RING: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;

    fn cfg(size: u16) -> QueueConfig {
        QueueConfig { index: 1, size, desc: RING, avail: AVAIL, used: USED, vector: 1 }
    }

    /// Takes and returns every available request; the heads or ids taken.
    fn serve_all(q: &mut Ring, mem: &GuestMem) -> Vec<u16> {
        let mut c = Chain::default();
        let mut taken = Vec::new();
        while let Some(r) = q.next(mem, &mut c).unwrap() {
            r.unwrap();
            taken.push(c.head);
        }
        for &t in &taken {
            q.push_used(mem, t, 7).unwrap();
        }
        q.publish_used(mem).unwrap();
        taken
    }

    /// A split queue is quiet only when every request taken was returned; resumed from its
    /// state (through JSON, as a successor process gets it) a new ring takes the driver's next
    /// requests where the old one stopped, past the ring's end; a state that disagrees with the
    /// used index in guest memory is refused at attach.
    #[test]
    fn a_split_ring_resumes_where_it_stood() {
        let mem = guest_memory(0x20000, None);
        let mut drv = SplitDriver::new(&mem, cfg(4));
        let mut q = Ring::new(cfg(4), 0).unwrap();
        q.attach(&mem).unwrap();
        for _ in 0..6 {
            drv.push(&[Buf::writable(0x8000, 64)]);
            assert_eq!(serve_all(&mut q, &mem).len(), 1);
            assert!(drv.next_used().is_some());
        }
        drv.push(&[Buf::writable(0x8000, 64)]);
        let mut c = Chain::default();
        q.next(&mem, &mut c).unwrap().unwrap().unwrap();
        assert_eq!(q.quiet_state(), None, "a request is out");
        q.push_used(&mem, c.head, 7).unwrap();
        q.publish_used(&mem).unwrap();
        assert!(drv.next_used().is_some());
        let state = q.quiet_state().expect("quiet");
        assert_eq!(state, RingState { index: 1, next: 7, wrap: true });
        let state: RingState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
        drop(q);

        let mut q = Ring::resume(cfg(4), 0, &state).unwrap();
        q.attach(&mem).unwrap();
        let heads: Vec<u16> = (0..3).map(|_| drv.push(&[Buf::writable(0x8000, 64)])).collect();
        assert_eq!(serve_all(&mut q, &mem), heads);
        assert_eq!((0..3).filter_map(|_| drv.next_used()).count(), 3);
        assert_eq!(drv.next_used(), None);

        let wrong = RingState { next: state.next + 1, ..state };
        let mut q = Ring::resume(cfg(4), 0, &wrong).unwrap();
        assert!(matches!(q.attach(&mem), Err(QueueError::ResumeMismatch { queue: 1, saved: 8, found: 10 })));
    }

    /// A packed queue's wrap counters live only in the device and the descriptors: resumed
    /// from its state after the ring wrapped, a new ring takes the next buffers and returns
    /// them where the driver looks for them, wrapping again.
    #[test]
    fn a_packed_ring_resumes_with_its_wrap_counter() {
        let mem = guest_memory(0x20000, None);
        let mut drv = PackedDriver::new(&mem, cfg(4));
        let features = f::RING_PACKED;
        let mut q = Ring::new(cfg(4), features).unwrap();
        q.attach(&mem).unwrap();
        for id in 0..5u16 {
            drv.push(&[Buf::writable(0x8000, 64)], id % 4);
            assert_eq!(serve_all(&mut q, &mem), [id % 4]);
            assert_eq!(drv.next_used(), Some((id % 4, 7)));
        }
        let state = q.quiet_state().expect("quiet");
        assert_eq!(state, RingState { index: 1, next: 1, wrap: false }, "one wrap: counter flipped");
        drop(q);
        let mut q = Ring::resume(cfg(4), features, &state).unwrap();
        q.attach(&mem).unwrap();
        for id in 5..12u16 {
            drv.push(&[Buf::writable(0x8000, 64)], id % 4);
            assert_eq!(serve_all(&mut q, &mem), [id % 4]);
            assert_eq!(drv.next_used(), Some((id % 4, 7)));
        }
        // Resumed with the wrong wrap counter, the ring sees the driver's next buffer as not
        // available: nothing is taken twice or out of turn.
        let state = q.quiet_state().unwrap();
        let mut q = Ring::resume(cfg(4), features, &RingState { wrap: !state.wrap, ..state }).unwrap();
        q.attach(&mem).unwrap();
        drv.push(&[Buf::writable(0x8000, 64)], 0);
        let mut c = Chain::default();
        assert!(q.next(&mem, &mut c).unwrap().is_none());
    }
}
