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
pub mod track;

pub use desc::{Chain, ChainError, QueueError, MAX_CHAIN_BUFS};
pub use packed::PackedQueue;
pub use split::SplitQueue;

use crate::memory::GuestMem;
use crate::pci::{features as f, QueueConfig};

/// Where a queue stands at a quiet point: what a process that takes the queue over resumes it
/// from (issue 22). Split rings keep the used position in guest memory as well (the used
/// index), packed rings only here (the wrap counters). Requests taken and not returned (a
/// SETLKW waiting, which the poller hands over with it) are `taken` and `out`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RingState {
    /// The queue's index.
    pub index: u16,
    /// The next position to return a request at; with nothing outstanding also the next to
    /// take one from.
    pub next: u16,
    /// Packed rings: the wrap counter at `next` (split rings: true).
    pub wrap: bool,
    /// With requests outstanding: the next position to take one from, and its wrap counter.
    #[serde(default)]
    pub taken: Option<(u16, bool)>,
    /// Packed rings: each outstanding buffer id with the ring slots its chain took.
    #[serde(default)]
    pub out: Vec<(u16, u16)>,
}

impl RingState {
    /// Requests taken and not returned.
    pub fn outstanding(&self) -> usize {
        match self.taken {
            None => 0,
            Some(_) if !self.out.is_empty() => self.out.len(),
            Some((avail, _)) => usize::from(avail.wrapping_sub(self.next)),
        }
    }
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
        let packed = features & f::RING_PACKED != 0;
        let size = cfg.size.max(1);
        let taken_ok = match state.taken {
            None => state.out.is_empty(),
            // Split: fewer outstanding than the ring holds; no buffer ids.
            Some((avail, _)) if !packed => avail.wrapping_sub(state.next) <= size && state.out.is_empty(),
            // Packed: a position inside the ring, each id once, inside the ring, its slots too.
            Some((avail, _)) => {
                let mut ids: Vec<u16> = state.out.iter().map(|o| o.0).collect();
                ids.sort_unstable();
                ids.dedup();
                let slots: u32 = state.out.iter().map(|o| u32::from(o.1)).sum();
                avail < size
                    && ids.len() == state.out.len()
                    && state.out.iter().all(|&(id, n)| id < size && n > 0)
                    && slots <= u32::from(size)
            }
        };
        if state.index != cfg.index || (packed && state.next >= size) || !taken_ok {
            return Err(QueueError::BadConfig(cfg.index));
        }
        let mut r = Ring::new(cfg, features)?;
        let taken = state.taken.unwrap_or((state.next, state.wrap));
        match &mut r {
            Ring::Split(q) => q.resume_at(state.next, taken.0),
            Ring::Packed(q) => q.resume_at((state.next, state.wrap), taken, &state.out),
        }
        Ok(r)
    }

    /// Starts this queue's in-flight record in `area` (crash recovery) and keeps it up to date
    /// from now on; false if the area has no record for it.
    pub fn keep_track(&mut self, area: &std::sync::Arc<track::TrackArea>) -> bool {
        let (index, size) = (self.index(), self.config().size);
        match self {
            Ring::Split(q) => area.start_queue(index, size).map(|t| q.keep_track(t)).is_some(),
            Ring::Packed(q) => area.start_packed(index, size).map(|t| q.keep_track(t)).is_some(),
        }
    }

    /// Goes on keeping this queue's record in `area` as a predecessor left it (a live update:
    /// the requests still out stay in it); false if there is none of this queue's layout and
    /// size (a predecessor that kept none).
    pub fn continue_track(&mut self, area: &std::sync::Arc<track::TrackArea>) -> bool {
        let Some(t) = area.queue(self.index(), self.config().size) else { return false };
        if t.size() != self.config().size || t.is_packed() != matches!(self, Ring::Packed(_)) {
            return false;
        }
        match self {
            Ring::Split(q) => {
                q.keep_track(t);
                q.take_seq_from_track();
            }
            Ring::Packed(q) => {
                q.keep_track(t);
                q.take_seqs_from_track();
            }
        }
        true
    }

    /// Resumes where this queue's in-flight record in `area` says it stood when its process
    /// died ([`SplitQueue::recover_from`], [`PackedQueue::recover_from`]); false if the area
    /// has no record for it.
    pub fn recover_from(&mut self, area: &std::sync::Arc<track::TrackArea>) -> bool {
        let Some(t) = area.queue(self.index(), self.config().size) else { return false };
        match self {
            Ring::Split(q) => q.recover_from(t),
            Ring::Packed(q) => q.recover_from(t),
        }
        true
    }

    /// Where the queue stands (positions, and what is outstanding).
    pub fn state(&self) -> RingState {
        let index = self.index();
        match self {
            Ring::Split(q) => {
                let (avail, used) = q.positions();
                let taken = (avail != used).then_some((avail, true));
                RingState { index, next: used, wrap: true, taken, out: Vec::new() }
            }
            Ring::Packed(q) => {
                let (avail, used) = q.positions();
                let out = q.outstanding();
                let taken = (!out.is_empty()).then_some(avail);
                RingState { index, next: used.0, wrap: used.1, taken, out }
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

    /// Takes the next request into `chain` (`chain.head` = the token to complete it with;
    /// `chain.replayed`: whether it is a chain in flight at a crash, taken again from the
    /// in-flight record before any new one).
    /// `Ok(None)`: nothing available; `Ok(Some(Err))`: a malformed chain to return unserved.
    pub fn next<'m>(
        &mut self,
        mem: &'m GuestMem,
        chain: &mut Chain<'m>,
    ) -> Result<Option<Result<(), ChainError>>, QueueError> {
        match self {
            Ring::Split(q) => {
                if let Some(head) = q.replayed() {
                    let r = q.chain(mem, head, chain);
                    chain.head = head;
                    chain.replayed = true;
                    return Ok(Some(r));
                }
                chain.replayed = false;
                if q.pending(mem)? == 0 {
                    return Ok(None);
                }
                let head = q.pop_head(mem)?;
                let r = q.chain(mem, head, chain);
                chain.head = head;
                Ok(Some(r))
            }
            Ring::Packed(q) => {
                // A buffer left to take again is the one `next` takes (before the ring's).
                chain.replayed = q.replaying();
                q.next(mem, chain)
            }
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
    /// Takes every available request without returning any.
    fn take_all(q: &mut Ring, mem: &GuestMem) -> Vec<u16> {
        let mut c = Chain::default();
        let mut taken = Vec::new();
        while let Some(r) = q.next(mem, &mut c).unwrap() {
            r.unwrap();
            taken.push(c.head);
        }
        taken
    }

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
        assert_eq!(q.state().outstanding(), 1, "a request is out");
        q.push_used(&mem, c.head, 7).unwrap();
        q.publish_used(&mem).unwrap();
        assert!(drv.next_used().is_some());
        let state = q.state();
        assert_eq!(state, RingState { index: 1, next: 7, wrap: true, taken: None, out: vec![] });
        let state: RingState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
        drop(q);

        let mut q = Ring::resume(cfg(4), 0, &state).unwrap();
        q.attach(&mem).unwrap();
        let heads: Vec<u16> = (0..3).map(|_| drv.push(&[Buf::writable(0x8000, 64)])).collect();
        assert_eq!(serve_all(&mut q, &mem), heads);
        assert_eq!((0..3).filter_map(|_| drv.next_used()).count(), 3);
        assert_eq!(drv.next_used(), None);

        let wrong = RingState { next: state.next + 1, ..state.clone() };
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
        let state = q.state();
        assert_eq!(state, RingState { index: 1, next: 1, wrap: false, taken: None, out: vec![] }, "one wrap");
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
        let state = q.state();
        let mut q = Ring::resume(cfg(4), features, &RingState { wrap: !state.wrap, ..state }).unwrap();
        q.attach(&mem).unwrap();
        drv.push(&[Buf::writable(0x8000, 64)], 0);
        let mut c = Chain::default();
        assert!(q.next(&mem, &mut c).unwrap().is_none());
    }

    /// Requests taken and not returned (SETLKWs waiting) move with the ring's state: a new
    /// ring resumed from it does not take them again, returns them later at their own heads
    /// (ids), and goes on with the driver's next requests, on both layouts; a state whose
    /// outstanding buffers do not fit the ring is refused.
    #[test]
    fn outstanding_requests_move_with_the_ring() {
        for packed in [false, true] {
            let mem = guest_memory(0x20000, None);
            let features = if packed { f::RING_PACKED } else { 0 };
            let mut split = SplitDriver::new(&mem, cfg(4));
            let mut pk = PackedDriver::new(&mem, cfg(4));
            let mut push = |id: u16| {
                if packed {
                    pk.push(&[Buf::writable(0x8000, 64)], id)
                } else {
                    split.push(&[Buf::writable(0x8000, 64)])
                }
            };
            let mut q = Ring::new(cfg(4), features).unwrap();
            q.attach(&mem).unwrap();
            // Three requests; the first and the third are answered, the second stays out.
            let heads: Vec<u16> = (0..3).map(&mut push).collect();
            assert_eq!(take_all(&mut q, &mem), heads);
            let state = q.state();
            assert_eq!(state.outstanding(), 3);
            let mut q2 = Ring::resume(cfg(4), features, &state).unwrap();
            q2.attach(&mem).unwrap();
            for h in [heads[0], heads[2]] {
                q2.push_used(&mem, h, 7).unwrap();
            }
            q2.publish_used(&mem).unwrap();
            let state = q2.state();
            assert_eq!(state.outstanding(), 1, "packed {packed}");
            let state: RingState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
            drop(q2);
            // The successor: the outstanding request is not taken again; new ones are.
            let mut q3 = Ring::resume(cfg(4), features, &state).unwrap();
            q3.attach(&mem).unwrap();
            let mut c = Chain::default();
            assert!(q3.next(&mem, &mut c).unwrap().is_none(), "packed {packed}: taken again");
            let more: Vec<u16> = [3u16, 0].into_iter().map(&mut push).collect();
            assert_eq!(take_all(&mut q3, &mem), more, "packed {packed}");
            for h in more {
                q3.push_used(&mem, h, 7).unwrap();
            }
            q3.push_used(&mem, heads[1], 9).unwrap();
            q3.publish_used(&mem).unwrap();
            assert_eq!(q3.state().outstanding(), 0, "packed {packed}");
            if packed {
                let mut bad = state.clone();
                bad.out.push(bad.out[0]);
                assert!(Ring::resume(cfg(4), features, &bad).is_err(), "an id twice");
                let bad = RingState { out: vec![(9, 1)], ..state.clone() };
                assert!(Ring::resume(cfg(4), features, &bad).is_err(), "an id past the ring");
            } else {
                let bad = RingState { taken: Some((state.next.wrapping_add(5), true)), ..state.clone() };
                assert!(Ring::resume(cfg(4), features, &bad).is_err(), "more out than the ring holds");
            }
        }
    }
}
