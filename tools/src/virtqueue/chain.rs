//! What the split and packed rings share: the descriptor flags, the chain and error types, the
//! chain checks, the 16-byte descriptor encoding, the in-flight record and the pool of indirect
//! tables. A leaf module: it imports neither ring.

use crate::memory::{DmaBuf, GuestRam, MemoryError};

/// Descriptor flag: chain continues at `next` (split) or in the next ring slot (packed).
pub const VRING_DESC_F_NEXT: u16 = 1;
/// Descriptor flag: device writes this buffer.
pub const VRING_DESC_F_WRITE: u16 = 2;
/// Descriptor flag: buffer is an indirect descriptor table.
pub const VRING_DESC_F_INDIRECT: u16 = 4;
/// Used ring flag: device does not want notifications.
pub const VRING_USED_F_NO_NOTIFY: u16 = 1;
/// Avail ring flag: driver does not want interrupts.
pub const VRING_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Errors of a virtqueue.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Not enough free descriptors for the chain.
    #[error("queue full: {needed} descriptors needed, {free} free")]
    Full {
        /// Descriptors the chain needs.
        needed: u16,
        /// Descriptors free.
        free: u16,
    },
    /// The chain is malformed (empty, readable after writable, too long).
    #[error("invalid chain: {0}")]
    BadChain(String),
    /// The device broke the virtqueue protocol.
    #[error("device bug on queue {queue}: {reason}")]
    DeviceBug {
        /// Queue index.
        queue: u16,
        /// What was wrong.
        reason: String,
    },
    /// Guest memory access failed.
    #[error("guest memory")]
    Memory(#[from] MemoryError),
}

/// One buffer of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// DMA address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Device-writable.
    pub write: bool,
}

/// A completed chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsedElem {
    /// The token given at submission.
    pub token: u64,
    /// Bytes the device says it wrote.
    pub len: u32,
    /// Head descriptor index (split) or buffer id (packed).
    pub head: u16,
}

/// Returns whether the driver must notify (virtio `vring_need_event`).
pub fn vring_need_event(event_idx: u16, new_idx: u16, old: u16) -> bool {
    new_idx.wrapping_sub(event_idx).wrapping_sub(1) < new_idx.wrapping_sub(old)
}

/// What the driver remembers of a chain it made available.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    token: u64,
    /// Ring descriptors it occupies (1 when indirect).
    ndesc: u16,
    /// Device-writable bytes: the most a used entry may claim.
    writable: u64,
    indirect: Option<DmaBuf>,
}

/// The driver's own record of a ring, which the device is judged against: the chains in flight
/// under their slot (split: head index; packed: buffer id), the free descriptors, and the indirect
/// tables kept per slot.
#[derive(Debug)]
pub(super) struct Shadow {
    pub(super) index: u16,
    pub(super) size: u16,
    pub(super) num_free: u16,
    /// Chains in flight.
    pub(super) count: u16,
    in_flight: Vec<Option<InFlight>>,
    pub(super) pool: IndirectPool,
}

impl Shadow {
    pub(super) fn new(index: u16, size: u16) -> Shadow {
        let n = usize::from(size);
        Shadow { index, size, num_free: size, count: 0, in_flight: vec![None; n], pool: IndirectPool::new(n) }
    }

    /// Checks a chain and whether it fits now.
    pub(super) fn check(&self, segs: &[Segment], indirect: bool) -> Result<ChainShape, QueueError> {
        check_chain(segs, indirect, self.size, self.num_free)
    }

    pub(super) fn bug(&self, reason: String) -> QueueError {
        QueueError::DeviceBug { queue: self.index, reason }
    }

    /// Records chain `c` as in flight under `slot`.
    pub(super) fn start(&mut self, slot: u16, token: u64, c: &ChainShape, indirect: Option<DmaBuf>) {
        self.in_flight[usize::from(slot)] =
            Some(InFlight { token, ndesc: c.needed, writable: c.writable, indirect });
        self.num_free -= c.needed;
        self.count += 1;
    }

    /// Checks a used entry naming `id` with `len` bytes written (`place`: where it was found, for
    /// the message) and ends its chain. Returns the chain's token and ring descriptors; on error
    /// the chain stays in flight.
    pub(super) fn finish(
        &mut self,
        mem: &GuestRam,
        id: u32,
        len: u32,
        place: std::fmt::Arguments<'_>,
    ) -> Result<(u64, u16), QueueError> {
        if id >= u32::from(self.size) {
            return Err(self.bug(format!("used id {id} ({place}) >= queue size {}", self.size)));
        }
        let slot = id as u16;
        let Some(f) = self.in_flight[usize::from(slot)] else {
            return Err(self.bug(format!("used id {id} ({place}) is not a chain in flight")));
        };
        if u64::from(len) > f.writable {
            return Err(self.bug(format!(
                "used len {len} ({place}) exceeds the {} writable bytes of chain {id}",
                f.writable
            )));
        }
        self.in_flight[usize::from(slot)] = None;
        self.num_free += f.ndesc;
        self.count -= 1;
        if let Some(t) = f.indirect {
            self.pool.put_back(mem, slot, t);
        }
        Ok((f.token, f.ndesc))
    }

    /// Frees every indirect table (the device must no longer use the ring).
    pub(super) fn destroy(&mut self, mem: &GuestRam) {
        for f in self.in_flight.iter_mut().filter_map(Option::take) {
            if let Some(b) = f.indirect {
                mem.free(b);
            }
        }
        self.pool.destroy(mem);
    }
}

/// A chain that passed [`check_chain`].
pub(super) struct ChainShape {
    /// Ring descriptors it takes.
    pub(super) needed: u16,
    pub(super) writable: u64,
    /// Whether it goes in an indirect table.
    pub(super) indirect: bool,
}

/// Checks a chain (non-empty, readable before writable, fits the ring) and whether there is room.
fn check_chain(segs: &[Segment], indirect: bool, size: u16, free: u16) -> Result<ChainShape, QueueError> {
    if segs.is_empty() {
        return Err(QueueError::BadChain("empty chain".into()));
    }
    if segs.windows(2).any(|w| w[0].write && !w[1].write) {
        return Err(QueueError::BadChain("readable segment after a writable one".into()));
    }
    let writable: u64 = segs.iter().filter(|s| s.write).map(|s| u64::from(s.len)).sum();
    let indirect = indirect && segs.len() > 1;
    let needed: u16 = if indirect {
        1
    } else {
        u16::try_from(segs.len()).map_err(|_| QueueError::BadChain("chain longer than 65535".into()))?
    };
    if needed > size {
        return Err(QueueError::BadChain(format!("chain of {needed} descriptors exceeds queue size {size}")));
    }
    if needed > free {
        return Err(QueueError::Full { needed, free });
    }
    Ok(ChainShape { needed, writable, indirect })
}

/// A 16-byte descriptor: `le64 addr, le32 len`, then two 16-bit fields (split: flags, next;
/// packed: id, flags).
pub(super) fn desc_bytes(addr: u64, len: u32, a: u16, b: u16) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[12..14].copy_from_slice(&a.to_le_bytes());
    d[14..16].copy_from_slice(&b.to_le_bytes());
    d
}

/// Indirect tables kept per slot (split: head index; packed: buffer id) for reuse.
#[derive(Debug)]
pub(super) struct IndirectPool {
    tables: Vec<Option<DmaBuf>>,
    scratch: Vec<u8>,
}

impl IndirectPool {
    fn new(n: usize) -> IndirectPool {
        IndirectPool { tables: vec![None; n], scratch: Vec::new() }
    }

    /// Fills the table of `slot` (reused if large enough) with one descriptor per segment,
    /// `encode(i, segment)`, in one write, and hands it out until [`IndirectPool::put_back`].
    pub(super) fn write_table(
        &mut self,
        mem: &GuestRam,
        slot: u16,
        segs: &[Segment],
        encode: impl Fn(usize, &Segment) -> [u8; 16],
    ) -> Result<DmaBuf, QueueError> {
        let n = segs.len();
        let table = match self.tables[usize::from(slot)].take() {
            Some(t) if t.len >= 16 * n => t,
            old => {
                if let Some(t) = old {
                    mem.free(t);
                }
                mem.alloc(16 * n, 16)?
            }
        };
        self.scratch.clear();
        for (i, s) in segs.iter().enumerate() {
            self.scratch.extend_from_slice(&encode(i, s));
        }
        if let Err(e) = mem.write(table.iova, &self.scratch) {
            mem.free(table);
            return Err(e.into());
        }
        Ok(table)
    }

    /// Keeps `table` for the next chain of `slot`.
    pub(super) fn put_back(&mut self, mem: &GuestRam, slot: u16, table: DmaBuf) {
        if let Some(old) = self.tables[usize::from(slot)].replace(table) {
            mem.free(old);
        }
    }

    fn destroy(&mut self, mem: &GuestRam) {
        for b in self.tables.iter_mut().filter_map(Option::take) {
            mem.free(b);
        }
    }
}
