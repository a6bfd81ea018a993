//! MSI-X table and pending-bit array, and the mask state shared with the pollers.
//!
//! ```text
//! BAR 1 (MSIX_BAR), 4 KiB:
//!   0x000  table: 16 bytes per vector
//!          +0 le32 message address low | +4 le32 message address high
//!          +8 le32 message data        | +12 le32 vector control (bit 0: masked)
//!   0x800  PBA: one pending bit per vector, le64 words (read-only)
//! ```
//! Under vfio-user the interrupt itself is an eventfd per vector (DEVICE_SET_IRQS), and the client
//! owns MSI-X semantics: QEMU emulates the table, the PBA and the function mask for the guest and
//! never forwards them, so a device that gated delivery on its own table would never interrupt a
//! QEMU guest (the table resets to all-masked). The table here is therefore storage for clients
//! that read it back; what gates delivery is the vfio-user MASK/UNMASK action (SET_IRQS). A masked
//! vector's interrupt is recorded in its pending bit (visible in the PBA) and delivered on UNMASK.
//! Mask and pending bits are atomics so a poller reads them without a lock.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Offset of the PBA within the MSI-X BAR.
pub const PBA_OFFSET: u64 = 0x800;
/// Size of the MSI-X BAR.
pub const MSIX_BAR_SIZE: u64 = 0x1000;
/// Most vectors the table can hold in the space before the PBA.
pub const MAX_VECTORS: usize = (PBA_OFFSET / 16) as usize;

const MASK_VFIO: u8 = 2;

/// Mask and pending state of every vector, shared between the control plane and the pollers.
#[derive(Debug)]
pub struct MsixShared {
    masks: Box<[AtomicU8]>,
    pending: Box<[AtomicBool]>,
    /// A write to one of the function's interrupt eventfds found it full or waited for it
    /// (`interrupt::signal_eventfd`): no vector fires any more, for as long as the function's
    /// client stays (a device reset does not clear it).
    broken: AtomicBool,
}

impl MsixShared {
    /// State for `vectors` vectors, none masked through vfio-user (the reset state).
    pub fn new(vectors: usize) -> Self {
        MsixShared {
            masks: (0..vectors).map(|_| AtomicU8::new(0)).collect(),
            pending: (0..vectors).map(|_| AtomicBool::new(false)).collect(),
            broken: AtomicBool::new(false),
        }
    }

    /// Number of vectors.
    pub fn len(&self) -> usize {
        self.masks.len()
    }

    /// Whether there are no vectors.
    pub fn is_empty(&self) -> bool {
        self.masks.is_empty()
    }

    /// Whether `vector` may fire now. If not, records it as pending and returns false.
    pub fn deliverable_or_pend(&self, vector: usize) -> bool {
        let Some(m) = self.masks.get(vector) else {
            return false;
        };
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        if m.load(Ordering::Acquire) & MASK_VFIO == 0 {
            return true;
        }
        self.pending[vector].store(true, Ordering::Release);
        false
    }

    /// Marks the function's interrupts broken; true if they were not already.
    pub fn mark_broken(&self) -> bool {
        !self.broken.swap(true, Ordering::AcqRel)
    }

    /// Whether the function's interrupts are broken ([`MsixShared::mark_broken`]).
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Whether `vector`'s pending bit is set.
    pub fn is_pending(&self, vector: usize) -> bool {
        self.pending.get(vector).is_some_and(|p| p.load(Ordering::Acquire))
    }

    /// Clears and returns the pending bit of `vector` if it is deliverable now.
    pub fn take_pending_if_unmasked(&self, vector: usize) -> bool {
        let Some(m) = self.masks.get(vector) else {
            return false;
        };
        if m.load(Ordering::Acquire) & MASK_VFIO != 0 {
            return false;
        }
        self.pending[vector].swap(false, Ordering::AcqRel)
    }

    /// Applies a vfio-user MASK (`on`) or UNMASK action to `vector`.
    pub fn set_vfio_mask(&self, vector: usize, on: bool) {
        if let Some(m) = self.masks.get(vector) {
            if on {
                m.fetch_or(MASK_VFIO, Ordering::AcqRel);
            } else {
                m.fetch_and(!MASK_VFIO, Ordering::AcqRel);
            }
        }
    }

    /// Each vector's mask bits, for a saved state ([`super::state`]).
    pub fn masks(&self) -> Vec<u8> {
        self.masks.iter().map(|m| m.load(Ordering::Acquire)).collect()
    }

    /// Sets every vector's mask and pending bits and the broken flag from a saved state (the
    /// slices are as long as the vectors: [`super::state`] checks).
    pub fn restore(&self, masks: &[u8], pending: &[bool], broken: bool) {
        for (m, &v) in self.masks.iter().zip(masks) {
            m.store(v, Ordering::Release);
        }
        for (p, &v) in self.pending.iter().zip(pending) {
            p.store(v, Ordering::Release);
        }
        self.broken.store(broken, Ordering::Release);
    }

    /// Back to the reset state: nothing masked, nothing pending.
    pub fn reset(&self) {
        for (m, p) in self.masks.iter().zip(self.pending.iter()) {
            m.store(0, Ordering::Release);
            p.store(false, Ordering::Release);
        }
    }
}

/// The MSI-X table proper (address/data words), owned by the control plane.
#[derive(Debug)]
pub struct MsixTable {
    entries: Vec<[u32; 4]>,
}

impl MsixTable {
    /// A table of `vectors` entries in the reset state.
    pub fn new(vectors: usize) -> Self {
        MsixTable { entries: vec![[0, 0, 0, 1]; vectors] }
    }

    /// Back to the reset state.
    pub fn reset(&mut self) {
        self.entries.iter_mut().for_each(|e| *e = [0, 0, 0, 1]);
    }

    /// The entries: per vector, address low and high, data, vector control.
    pub fn entries(&self) -> &[[u32; 4]] {
        &self.entries
    }

    /// A table of these entries (a saved state's; only the mask bit of vector control kept).
    pub fn from_entries(mut entries: Vec<[u32; 4]>) -> Self {
        entries.iter_mut().for_each(|e| e[3] &= 1);
        MsixTable { entries }
    }

    /// Reads `data.len()` bytes (1, 2, 4 or 8) at `offset` of the MSI-X BAR.
    pub fn read(&self, shared: &MsixShared, offset: u64, data: &mut [u8]) {
        data.fill(0);
        for (i, b) in data.iter_mut().enumerate() {
            let off = offset + i as u64;
            *b = if off < PBA_OFFSET {
                let (vec, word, byte) = ((off / 16) as usize, ((off % 16) / 4) as usize, off % 4);
                self.entries.get(vec).map_or(0, |e| (e[word] >> (8 * byte)) as u8)
            } else {
                let first = ((off - PBA_OFFSET) * 8) as usize;
                (0..8).fold(0u8, |acc, bit| acc | (u8::from(shared.is_pending(first + bit)) << bit))
            };
        }
    }

    /// Writes `data` at `offset` of the MSI-X BAR (the PBA is read-only).
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, &b) in data.iter().enumerate() {
            let off = offset + i as u64;
            if off >= PBA_OFFSET {
                continue; // PBA is read-only.
            }
            let (vec, word, byte) = ((off / 16) as usize, ((off % 16) / 4) as usize, off % 4);
            let Some(e) = self.entries.get_mut(vec) else {
                continue;
            };
            let shift = 8 * byte;
            e[word] = (e[word] & !(0xff << shift)) | (u32::from(b) << shift);
            if word == 3 {
                e[3] &= 1; // Only the mask bit is writable in vector control.
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vfio_mask_pends_and_unmask_delivers() {
        let s = MsixShared::new(3);
        let t = MsixTable::new(3);
        assert!(s.deliverable_or_pend(1), "reset state delivers");
        s.set_vfio_mask(1, true);
        assert!(!s.deliverable_or_pend(1));
        let mut pba = [0u8; 1];
        t.read(&s, PBA_OFFSET, &mut pba);
        assert_eq!(pba[0], 0b010);
        assert!(!s.take_pending_if_unmasked(1), "still masked");
        s.set_vfio_mask(1, false);
        assert!(s.take_pending_if_unmasked(1));
        assert!(!s.take_pending_if_unmasked(1));
        assert!(!s.deliverable_or_pend(7), "out-of-range vector never fires");
        s.set_vfio_mask(2, true);
        s.reset();
        assert!(s.deliverable_or_pend(2));
    }

    #[test]
    fn table_words_roundtrip() {
        let s = MsixShared::new(2);
        let mut t = MsixTable::new(2);
        t.write(16, &0xfee0_1000u32.to_le_bytes());
        t.write(16 + 8, &0x4041u32.to_le_bytes());
        t.write(16 + 12, &0xffff_ffffu32.to_le_bytes());
        let mut b = [0u8; 16];
        t.read(&s, 16, &mut b);
        assert_eq!(&b[0..4], &0xfee0_1000u32.to_le_bytes());
        assert_eq!(&b[8..12], &0x4041u32.to_le_bytes());
        assert_eq!(&b[12..16], &1u32.to_le_bytes(), "reserved control bits read as zero");
        t.write(PBA_OFFSET, &[0xff]);
        t.read(&s, PBA_OFFSET, &mut b[..1]);
        assert_eq!(b[0], 0, "PBA is read-only");
    }
}
