//! What both ring layouts share: the descriptor flags, the descriptor table read as one 16-byte
//! volatile load per descriptor, the validated buffer list of one request ([`Chain`]) and the
//! errors a ring or a chain can have. The split and packed modules import this one; it imports
//! neither.

use std::sync::atomic::{fence, Ordering};

use thiserror::Error;
use virtio_bindings::virtio_ring as vr;
use vm_memory::{Address, GuestAddress, GuestMemoryBackend, VolatileMemory, VolatileSlice};

use crate::memory::GuestMem;

/// Descriptor flag: the chain continues (split: at `next`; packed: in the following slot).
pub const DESC_F_NEXT: u16 = vr::VRING_DESC_F_NEXT as u16;
/// Descriptor flag: the buffer is device-writable.
pub const DESC_F_WRITE: u16 = vr::VRING_DESC_F_WRITE as u16;
/// Descriptor flag: the buffer is a table of descriptors.
pub const DESC_F_INDIRECT: u16 = vr::VRING_DESC_F_INDIRECT as u16;

/// Packed descriptor flag: available (equal to the driver's wrap counter when made available).
pub const PACKED_F_AVAIL: u16 = 1 << vr::VRING_PACKED_DESC_F_AVAIL;
/// Packed descriptor flag: used.
pub const PACKED_F_USED: u16 = 1 << vr::VRING_PACKED_DESC_F_USED;
/// Event suppression: notify/interrupt after every buffer.
pub const PACKED_EVENT_ENABLE: u16 = vr::VRING_PACKED_EVENT_FLAG_ENABLE as u16;
/// Event suppression: never.
pub const PACKED_EVENT_DISABLE: u16 = vr::VRING_PACKED_EVENT_FLAG_DISABLE as u16;
/// Event suppression: when the ring position in `off_wrap` is passed (needs EVENT_IDX).
pub const PACKED_EVENT_DESC: u16 = vr::VRING_PACKED_EVENT_FLAG_DESC as u16;

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
    /// Guest memory the queue used went away under the device (the client shrank a DMA
    /// window's file: a SIGBUS, repaired with zero pages).
    #[error("queue {0}: client memory went away under the device (SIGBUS)")]
    MemoryLost(u16),
    /// A poller of the function did not take a control message within its bound.
    #[error("poller {0} did not answer within its bound")]
    Unresponsive(usize),
    /// The queue's interrupt eventfd was full or made a write wait: the client handed over a
    /// descriptor to block the device on; the function's interrupts are off.
    #[error("queue {queue}: interrupt eventfd of vector {vector} is full or blocks; interrupts off")]
    InterruptStuck {
        /// The queue being signalled.
        queue: u16,
        /// Its MSI-X vector.
        vector: u16,
    },
    /// A queue resumed from a saved state found the used index elsewhere than the state says.
    #[error("queue {queue}: resumed at used index {saved}, the ring's is {found}")]
    ResumeMismatch {
        /// Queue index.
        queue: u16,
        /// The saved position.
        saved: u16,
        /// The used index in guest memory.
        found: u16,
    },
    /// A queue recovering after a crash whose in-flight record the rings contradict (what
    /// disagrees is logged where it is found).
    #[error("queue {queue}: cannot recover: its in-flight record and its rings disagree")]
    Recovery {
        /// Queue index.
        queue: u16,
    },
    /// A waiting request handed over by another process that this process's engine does not
    /// know (its queue cannot go on: the request would never be answered).
    #[error("queue {queue}: waiting request {head} handed over, unknown to the backend")]
    HandoverWait {
        /// Queue index.
        queue: u16,
        /// Its head (or buffer id).
        head: u16,
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
    /// Head descriptor index (split) or buffer id (packed): the token returned in the used ring.
    pub head: u16,
    /// Device-readable buffers, in order.
    pub readable: heapless::Vec<VolatileSlice<'m>, MAX_CHAIN_BUFS>,
    /// Device-writable buffers, in order.
    pub writable: heapless::Vec<VolatileSlice<'m>, MAX_CHAIN_BUFS>,
    /// The chain was taken before a crash of the process that served the queue and is being
    /// executed again, from the in-flight record (DESIGN.md, "Crash recovery", "Executing
    /// again"); false for a chain taken for the first time. Set by [`super::Ring::next`] for
    /// every chain it takes.
    pub replayed: bool,
}

/// A descriptor table (a ring's or an indirect one) resolved to guest memory once, so that each
/// descriptor is one 16-byte volatile load instead of a region lookup and a byte copy.
pub(crate) struct DescTable<'m> {
    slice: VolatileSlice<'m>,
}

impl<'m> DescTable<'m> {
    /// The `entries`-long table at `addr`; `None` unless it lies inside one mapped region.
    #[inline]
    pub(crate) fn new(mem: &'m GuestMem, addr: u64, entries: u32) -> Option<Self> {
        let len = usize::try_from(u64::from(entries) * 16).ok()?;
        mem.get_slice(GuestAddress(addr), len).ok().map(|slice| DescTable { slice })
    }

    /// Descriptor `index` (`None` past the end), read as one 16-byte load: its address, its
    /// length and the two 16-bit words after them (split: flags, next; packed: id, flags).
    #[inline]
    pub(crate) fn get(&self, index: u16) -> Option<(u64, u32, u16, u16)> {
        let raw = self.slice.get_ref::<[u8; 16]>(usize::from(index) * 16).ok()?.load();
        Some((
            u64::from_le_bytes(raw[0..8].try_into().ok()?),
            u32::from_le_bytes(raw[8..12].try_into().ok()?),
            u16::from_le_bytes([raw[12], raw[13]]),
            u16::from_le_bytes([raw[14], raw[15]]),
        ))
    }
}

/// When the driver was last interrupted, for both layouts' interrupt decision (once per poll
/// round): whether buffers were returned since, and the used position then.
#[derive(Debug, Default)]
pub(crate) struct Signalled {
    returned: bool,
    used: u16,
}

impl Signalled {
    /// Buffers were returned (made visible to the driver).
    #[inline]
    pub(crate) fn returned(&mut self) {
        self.returned = true;
    }

    /// Starts over at used position `used` (nothing returned yet).
    pub(crate) fn reset(&mut self, used: u16) {
        (self.returned, self.used) = (false, used);
    }

    /// If buffers were returned since the last decision: `(used position then, now)`, `now`
    /// recorded for the next one. Orders the caller's used-ring stores before its reads of the
    /// driver's suppression fields (a full fence).
    #[inline]
    pub(crate) fn take(&mut self, now: u16) -> Option<(u16, u16)> {
        if !self.returned {
            return None;
        }
        self.returned = false;
        fence(Ordering::SeqCst);
        let old = std::mem::replace(&mut self.used, now);
        Some((old, now))
    }
}

/// `vring_need_event`: whether the used position, moving from `old` to `new`, passed `event`.
#[inline]
pub(crate) fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Checks that each `(address, length)` of queue `queue`'s ring areas lies in mapped memory.
pub(crate) fn check_mapped(mem: &GuestMem, queue: u16, ranges: &[(u64, u64)]) -> Result<(), QueueError> {
    for &(addr, len) in ranges {
        let len = usize::try_from(len).map_err(|_| QueueError::RingUnmapped(queue))?;
        if mem.get_slice(GuestAddress(addr), len).is_err() {
            return Err(QueueError::RingUnmapped(queue));
        }
    }
    Ok(())
}

/// Maps the guest buffer `addr`+`len` onto `out` (one slice, or one per DMA window it spans).
#[inline]
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
