//! A function's register state as data: what a process that takes the function over (a live
//! update's successor) needs to answer the client's register accesses exactly as the function
//! did. It serialises (serde: JSON, self-describing) with a format version; a state is checked
//! against the function it is restored into (same shape: tag, queue count, vector count, the
//! read-only parts of configuration space) and refused with a typed error otherwise.
//!
//! What it holds: configuration space (command register, BAR addresses, MSI-X control, the
//! `pci_cfg` window), the virtio common configuration (feature selects and the negotiated
//! features, status, configuration generation, the config vector, the selected queue, each
//! queue's size, ring addresses, vector and enable), the ISR, the MSI-X table and each vector's
//! mask and pending bits, and whether the function's interrupts were given up as broken. The
//! queues' run-time indices live with the pollers, not here.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::msix::MsixTable;
use super::{QueueConfig, QueueRegs, VirtioFsFunction, CONFIG_SPACE_SIZE};

/// The format version this firmware writes. A state of another version is refused
/// ([`StateError::Version`]); the previous release's format is read when there is one.
pub const FUNCTION_STATE_VERSION: u32 = 1;

/// One queue's registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRegState {
    /// Queue size the driver chose.
    pub size: u16,
    /// Descriptor table address.
    pub desc: u64,
    /// Driver (avail) ring address.
    pub avail: u64,
    /// Device (used) ring address.
    pub used: u64,
    /// MSI-X vector.
    pub vector: u16,
    /// `queue_enable`.
    pub enabled: bool,
}

/// A function's register state ([module documentation](self)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionState {
    /// [`FUNCTION_STATE_VERSION`] when written.
    pub version: u32,
    /// The virtio-fs tag (the function it was taken from).
    pub tag: String,
    /// Request queues (the queue count is one more: hiprio).
    pub request_queues: u16,
    /// Largest queue size offered.
    pub max_queue_size: u16,
    /// Configuration space, every byte.
    pub config: Vec<u8>,
    /// Features offered.
    pub device_features: u64,
    /// `device_feature_select`.
    pub device_feature_select: u32,
    /// `driver_feature_select`.
    pub driver_feature_select: u32,
    /// Features the driver accepted.
    pub driver_features: u64,
    /// Device status.
    pub status: u8,
    /// `config_generation`.
    pub config_generation: u8,
    /// `msix_config`.
    pub msix_config: u16,
    /// `queue_select`.
    pub queue_select: u16,
    /// Each queue's registers, hiprio first.
    pub queues: Vec<QueueRegState>,
    /// The ISR status byte.
    pub isr: u8,
    /// The MSI-X table: per vector, address low and high, data, vector control.
    pub msix_table: Vec<[u32; 4]>,
    /// Per vector, the mask bits the client set through vfio-user.
    pub msix_masks: Vec<u8>,
    /// Per vector, an interrupt held back while masked (the PBA).
    pub msix_pending: Vec<bool>,
    /// The function's interrupts were given up (a client that made them block).
    pub msix_broken: bool,
}

/// Why a state cannot be restored into a function.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StateError {
    /// Written by a format this firmware does not read.
    #[error("function state format {found}, this firmware reads {expected}")]
    Version {
        /// The state's version.
        found: u32,
        /// What this firmware reads.
        expected: u32,
    },
    /// The state is of a function of another shape.
    #[error("function state does not fit this function: {0}")]
    Shape(String),
}

impl VirtioFsFunction {
    /// The function's register state.
    pub fn save(&self) -> FunctionState {
        let tag_len = self.tag.iter().position(|&b| b == 0).unwrap_or(self.tag.len());
        FunctionState {
            version: FUNCTION_STATE_VERSION,
            tag: String::from_utf8_lossy(&self.tag[..tag_len]).into_owned(),
            request_queues: self.request_queues,
            max_queue_size: self.max_queue_size,
            config: self.config.to_vec(),
            device_features: self.device_features,
            device_feature_select: self.device_feature_select,
            driver_feature_select: self.driver_feature_select,
            driver_features: self.driver_features,
            status: self.status,
            config_generation: self.config_generation,
            msix_config: self.msix_config,
            queue_select: self.queue_select,
            queues: (self.queues.iter())
                .map(|q| QueueRegState {
                    size: q.cfg.size,
                    desc: q.cfg.desc,
                    avail: q.cfg.avail,
                    used: q.cfg.used,
                    vector: q.cfg.vector,
                    enabled: q.enabled,
                })
                .collect(),
            isr: self.isr,
            msix_table: self.msix_table.entries().to_vec(),
            msix_masks: self.msix.masks(),
            msix_pending: (0..self.msix.len()).map(|v| self.msix.is_pending(v)).collect(),
            msix_broken: self.msix.is_broken(),
        }
    }

    /// Puts `state` into this function, which must have its shape (built with the same tag,
    /// queue count and queue size). Nothing changes if it is refused.
    pub fn restore(&mut self, state: &FunctionState) -> Result<(), StateError> {
        self.check_state(state)?;
        self.config.copy_from_slice(&state.config);
        self.device_features = state.device_features;
        self.device_feature_select = state.device_feature_select;
        self.driver_feature_select = state.driver_feature_select;
        self.driver_features = state.driver_features;
        self.status = state.status;
        self.config_generation = state.config_generation;
        self.msix_config = state.msix_config;
        self.queue_select = state.queue_select;
        for (i, (regs, q)) in self.queues.iter_mut().zip(&state.queues).enumerate() {
            *regs = QueueRegs {
                cfg: QueueConfig {
                    index: i as u16,
                    size: q.size,
                    desc: q.desc,
                    avail: q.avail,
                    used: q.used,
                    vector: q.vector,
                },
                enabled: q.enabled,
            };
        }
        self.isr = state.isr;
        self.msix_table = MsixTable::from_entries(state.msix_table.clone());
        self.msix.restore(&state.msix_masks, &state.msix_pending, state.msix_broken);
        Ok(())
    }

    /// Whether `state` fits this function.
    fn check_state(&self, state: &FunctionState) -> Result<(), StateError> {
        if state.version != FUNCTION_STATE_VERSION {
            return Err(StateError::Version { found: state.version, expected: FUNCTION_STATE_VERSION });
        }
        let shape = |what: String| Err(StateError::Shape(what));
        let mine = self.save();
        if state.tag != mine.tag {
            return shape(format!("tag {:?}, this function's is {:?}", state.tag, mine.tag));
        }
        if (state.request_queues, state.max_queue_size) != (self.request_queues, self.max_queue_size) {
            return shape(format!(
                "{} request queues of {} entries, this function has {} of {}",
                state.request_queues, state.max_queue_size, self.request_queues, self.max_queue_size
            ));
        }
        let vectors = self.msix.len();
        if state.config.len() != CONFIG_SPACE_SIZE as usize
            || state.queues.len() != self.queues.len()
            || state.msix_table.len() != vectors
            || state.msix_masks.len() != vectors
            || state.msix_pending.len() != vectors
        {
            return shape("configuration space, queue or vector counts differ".into());
        }
        // The read-only bytes of configuration space are what this firmware builds: a state
        // whose identity, capabilities or BAR types differ is another device.
        if let Some(at) =
            (0..state.config.len()).find(|&i| (state.config[i] ^ self.config[i]) & !self.wmask[i] != 0)
        {
            return shape(format!("read-only configuration space byte {at:#x} differs"));
        }
        if state.device_features != self.device_features {
            return shape(format!(
                "offered features {:#x}, this function offers {:#x}",
                state.device_features, self.device_features
            ));
        }
        if state.driver_features & !self.device_features != 0 {
            return shape("negotiated features this function does not offer".into());
        }
        if let Some(q) = state.queues.iter().find(|q| q.size > self.max_queue_size) {
            return shape(format!("queue size {} over {}", q.size, self.max_queue_size));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::msix::MSIX_BAR_SIZE;
    use super::super::{features, COMMON_OFFSET, VIRTIO_BAR_SIZE};
    use super::*;

    const CFG: u32 = 7;
    const MSIX: u32 = 1;
    const VIRTIO: u32 = 4;

    fn func() -> VirtioFsFunction {
        VirtioFsFunction::new("state", 2, 256, features::EVENT_IDX | features::INDIRECT_DESC)
    }

    fn wr(f: &mut VirtioFsFunction, region: u32, off: u64, len: usize, v: u64) {
        f.write(region, off, &v.to_le_bytes()[..len]).unwrap();
    }

    /// Every byte a client can read: configuration space, the MSI-X BAR (table and PBA) and the
    /// virtio BAR's common configuration (of every queue), ISR (which clears when read: read
    /// once, last) and device configuration.
    fn everything(f: &mut VirtioFsFunction) -> Vec<u8> {
        let mut out = Vec::new();
        let mut read = |f: &mut VirtioFsFunction, region, len: u64| {
            let mut b = vec![0u8; len as usize];
            for off in 0..len {
                f.read(region, off, &mut b[off as usize..off as usize + 1]).unwrap();
            }
            out.extend_from_slice(&b);
        };
        read(f, CFG, CONFIG_SPACE_SIZE);
        read(f, MSIX, MSIX_BAR_SIZE);
        // The common configuration of each queue (queue_select walks them).
        let common = |f: &mut VirtioFsFunction, out: &mut Vec<u8>| {
            let mut b = vec![0u8; 0x38];
            f.read(VIRTIO, COMMON_OFFSET, &mut b).unwrap();
            out.extend_from_slice(&b);
        };
        let selected = {
            let mut b = [0u8; 2];
            f.read(VIRTIO, COMMON_OFFSET + 0x16, &mut b).unwrap();
            u16::from_le_bytes(b)
        };
        for q in 0..3u64 {
            wr(f, VIRTIO, COMMON_OFFSET + 0x16, 2, q);
            common(f, &mut out);
        }
        wr(f, VIRTIO, COMMON_OFFSET + 0x16, 2, u64::from(selected));
        let mut rest = vec![0u8; (VIRTIO_BAR_SIZE - COMMON_OFFSET - 0x38) as usize];
        f.read(VIRTIO, COMMON_OFFSET + 0x38, &mut rest).unwrap();
        out.extend_from_slice(&rest);
        out
    }

    /// A function brought up through its registers (BARs placed, MSI-X on with a vector masked
    /// and one interrupt pending on it, features negotiated, queues set up and enabled, a
    /// queue other than 0 selected), saved, written as JSON, read back and restored into a new
    /// function reads the same in every byte, and saves to the same state.
    #[test]
    fn a_restored_function_reads_as_the_saved_one() {
        let mut f = func();
        let c = |o| COMMON_OFFSET + o;
        wr(&mut f, CFG, 0x04, 2, 0x0006);
        wr(&mut f, CFG, 0x14, 4, 0xfe00_0000);
        wr(&mut f, CFG, 0x20, 4, 0xfd00_0000);
        wr(&mut f, CFG, 0x24, 4, 0x1);
        wr(&mut f, CFG, 0x40 + 3, 1, 0x80); // MSI-X enable
        for v in 0..4u64 {
            wr(&mut f, MSIX, v * 16, 4, 0xfee0_0000 + v * 0x10);
            wr(&mut f, MSIX, v * 16 + 8, 4, 0x40 + v);
            wr(&mut f, MSIX, v * 16 + 12, 4, u64::from(v == 2));
        }
        wr(&mut f, VIRTIO, c(0x14), 1, 1 | 2);
        wr(&mut f, VIRTIO, c(0x08), 4, 1);
        wr(&mut f, VIRTIO, c(0x0c), 4, 1);
        wr(&mut f, VIRTIO, c(0x08), 4, 0);
        wr(&mut f, VIRTIO, c(0x0c), 4, features::EVENT_IDX);
        wr(&mut f, VIRTIO, c(0x14), 1, 1 | 2 | 8);
        wr(&mut f, VIRTIO, c(0x10), 2, 0);
        for q in 0..3u64 {
            wr(&mut f, VIRTIO, c(0x16), 2, q);
            wr(&mut f, VIRTIO, c(0x18), 2, 64 << q);
            wr(&mut f, VIRTIO, c(0x1a), 2, q + 1);
            wr(&mut f, VIRTIO, c(0x20), 8, 0x10000 * (q + 1));
            wr(&mut f, VIRTIO, c(0x28), 8, 0x10000 * (q + 1) + 0x800);
            wr(&mut f, VIRTIO, c(0x30), 8, 0x10000 * (q + 1) + 0x1000);
            wr(&mut f, VIRTIO, c(0x1c), 2, 1);
        }
        wr(&mut f, VIRTIO, c(0x14), 1, 1 | 2 | 8 | 4);
        wr(&mut f, VIRTIO, c(0x16), 2, 1);
        f.msix().set_vfio_mask(2, true);
        assert!(!f.msix().deliverable_or_pend(2), "masked: pends");

        let state = f.save();
        let json = serde_json::to_string(&state).unwrap();
        let back: FunctionState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state);
        let mut g = func();
        g.restore(&back).unwrap();
        assert_eq!(g.save(), state);
        assert_eq!(everything(&mut g), everything(&mut f));
        assert!(g.msix().is_pending(2) && !g.msix().deliverable_or_pend(2), "still masked and pending");
        g.msix().set_vfio_mask(2, false);
        assert!(g.msix().take_pending_if_unmasked(2), "the held interrupt is delivered once unmasked");
    }

    /// A state of another format version, or of a function of another shape, is refused and the
    /// function is left as it was.
    #[test]
    fn a_state_that_does_not_fit_is_refused() {
        let saved = func().save();
        let mut g = func();
        let before = g.save();
        let refused = |state: FunctionState, g: &mut VirtioFsFunction| g.restore(&state).unwrap_err();
        let mut s = saved.clone();
        s.version = FUNCTION_STATE_VERSION + 1;
        assert_eq!(
            refused(s, &mut g),
            StateError::Version { found: FUNCTION_STATE_VERSION + 1, expected: FUNCTION_STATE_VERSION }
        );
        for change in [
            (|s: &mut FunctionState| s.tag = "other".into()) as fn(&mut FunctionState),
            |s| s.request_queues = 3,
            |s| s.queues.pop().map(drop).unwrap_or(()),
            |s| s.msix_masks.push(0),
            |s| s.config[0] ^= 1, // vendor id: read-only
            |s| s.device_features |= 1 << 40,
            |s| s.driver_features |= 1 << 41,
            |s| s.queues[0].size = 1024,
        ] {
            let mut s = saved.clone();
            change(&mut s);
            assert!(matches!(refused(s, &mut g), StateError::Shape(_)));
            assert_eq!(g.save(), before, "a refused state changed the function");
        }
        let mut other = VirtioFsFunction::new("state", 1, 256, features::EVENT_IDX | features::INDIRECT_DESC);
        assert!(matches!(other.restore(&saved), Err(StateError::Shape(_))));
    }
}
