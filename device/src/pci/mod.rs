//! The virtio-fs PCI function: config space, BARs and the modern virtio-pci transport.
//!
//! Pure register model: no sockets, no threads. The vfio-user adapter turns region reads and
//! writes into calls here, and acts on the [`DeviceEvent`]s the writes return.
//!
//! ```text
//! Config space (256 bytes)
//!   0x00 vendor 0x1af4 | device 0x105a        0x04 command (IO, MEM, MASTER, INTx-disable RW) | status
//!   0x08 revision 1 | class 0x018000 (storage, other)
//!   0x10 BAR0 -                                0x14 BAR1 32-bit memory, MSI-X table + PBA (4 KiB)
//!   0x20 BAR4+BAR5 64-bit prefetchable memory, virtio structures (16 KiB)
//!   0x2c subsystem vendor 0x1af4 | subsystem 0x001a   0x34 capability pointer 0x40
//!   0x3c interrupt line (RW) | interrupt pin 0 (no INTx: MSI-X only)
//!   0x40 MSI-X capability (table in BAR1 @0, PBA in BAR1 @0x800)
//!   0x4c virtio common cfg cap   -> BAR4 @0x0000, 0x38 bytes
//!   0x5c virtio notify cap       -> BAR4 @0x3000, 4 KiB, notify_off_multiplier 4
//!   0x70 virtio ISR cap          -> BAR4 @0x1000, 1 byte
//!   0x80 virtio device cfg cap   -> BAR4 @0x2000, 40 bytes
//!   0x90 virtio PCI cfg access cap (window into the BARs through config space)
//!
//! BAR4 (VIRTIO_BAR), 16 KiB
//!   0x0000 common cfg: 0x00 le32 device_feature_select  0x04 le32 device_feature (RO)
//!          0x08 le32 driver_feature_select 0x0c le32 driver_feature  0x10 le16 msix_config
//!          0x12 le16 num_queues (RO)  0x14 u8 device_status  0x15 u8 config_generation (RO)
//!          0x16 le16 queue_select  0x18 le16 queue_size  0x1a le16 queue_msix_vector
//!          0x1c le16 queue_enable  0x1e le16 queue_notify_off (RO)
//!          0x20 le64 queue_desc  0x28 le64 queue_driver  0x30 le64 queue_device
//!   0x1000 ISR status (read clears)
//!   0x2000 device cfg: u8 tag[36], le32 num_request_queues (RO)
//!   0x3000 notify: queue N's doorbell at 4*N; a sparse-mmap area backed by shared memory
//! ```

pub mod msix;
pub mod state;

use std::sync::Arc;

use msix::{MsixShared, MsixTable, MSIX_BAR_SIZE, PBA_OFFSET};
use thiserror::Error;

/// PCI vendor id of virtio devices.
pub const VENDOR_ID: u16 = 0x1af4;
/// The virtio device id of a file system device (`VIRTIO_ID_FS`, 26).
pub const VIRTIO_ID_FS: u16 = virtio_bindings::virtio_ids::VIRTIO_ID_FS as u16;
/// PCI device id of a modern virtio-fs device (0x1040 + 26).
pub const DEVICE_ID: u16 = 0x1040 + VIRTIO_ID_FS;
/// BAR holding the MSI-X table and PBA.
pub const MSIX_BAR: u32 = 1;
/// BAR holding the virtio structures.
pub const VIRTIO_BAR: u32 = 4;
/// Size of [`VIRTIO_BAR`].
pub const VIRTIO_BAR_SIZE: u64 = 0x4000;
/// Common configuration offset in [`VIRTIO_BAR`].
pub const COMMON_OFFSET: u64 = 0x0;
/// Size of the common configuration structure.
pub const COMMON_SIZE: u64 = 0x38;
/// ISR offset in [`VIRTIO_BAR`].
pub const ISR_OFFSET: u64 = 0x1000;
/// Device configuration offset in [`VIRTIO_BAR`].
pub const DEVICE_CFG_OFFSET: u64 = 0x2000;
/// Size of the device configuration (tag + num_request_queues).
pub const DEVICE_CFG_SIZE: u64 = 40;
/// Notify area offset in [`VIRTIO_BAR`].
pub const NOTIFY_OFFSET: u64 = 0x3000;
/// Size of the notify area (one page: it is mmapped by the client).
pub const NOTIFY_SIZE: u64 = 0x1000;
/// Bytes between two queues' doorbells.
pub const NOTIFY_OFF_MULTIPLIER: u32 = 4;
/// Size of PCI config space.
pub const CONFIG_SPACE_SIZE: u64 = 256;
/// "No MSI-X vector".
pub const NO_VECTOR: u16 = 0xffff;

/// Feature bits (virtio 1.2 section 6), as masks of the `virtio-bindings` bit numbers.
pub mod features {
    use virtio_bindings::{virtio_config as c, virtio_ring as r};
    /// Indirect descriptors.
    pub const INDIRECT_DESC: u64 = 1 << r::VIRTIO_RING_F_INDIRECT_DESC;
    /// used_event / avail_event notification suppression.
    pub const EVENT_IDX: u64 = 1 << r::VIRTIO_RING_F_EVENT_IDX;
    /// Modern (virtio 1.x) device.
    pub const VERSION_1: u64 = 1 << c::VIRTIO_F_VERSION_1;
    /// Packed virtqueue layout.
    pub const RING_PACKED: u64 = 1 << c::VIRTIO_F_RING_PACKED;
}

/// Device status bits (the `virtio-bindings` values).
pub mod status {
    use virtio_bindings::virtio_config as c;
    /// Guest OS found the device.
    pub const ACKNOWLEDGE: u8 = c::VIRTIO_CONFIG_S_ACKNOWLEDGE as u8;
    /// Guest OS knows how to drive it.
    pub const DRIVER: u8 = c::VIRTIO_CONFIG_S_DRIVER as u8;
    /// Driver is ready.
    pub const DRIVER_OK: u8 = c::VIRTIO_CONFIG_S_DRIVER_OK as u8;
    /// Feature negotiation complete.
    pub const FEATURES_OK: u8 = c::VIRTIO_CONFIG_S_FEATURES_OK as u8;
    /// Device hit an error it cannot recover from without a reset.
    pub const DEVICE_NEEDS_RESET: u8 = c::VIRTIO_CONFIG_S_NEEDS_RESET as u8;
    /// Driver gave up on the device.
    pub const FAILED: u8 = c::VIRTIO_CONFIG_S_FAILED as u8;
}

const CAP_MSIX: usize = 0x40;
const CAP_COMMON: usize = 0x4c;
const CAP_NOTIFY: usize = 0x5c;
const CAP_ISR: usize = 0x70;
const CAP_DEVICE: usize = 0x80;
const CAP_PCI_CFG: usize = 0x90;
const PCI_CFG_DATA: usize = CAP_PCI_CFG + 16;

/// A register access the model refuses.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AccessError {
    /// The region index names no region of this device.
    #[error("no region {0}")]
    NoRegion(u32),
    /// The access falls outside the region.
    #[error("access {offset:#x}+{len} outside region {region} of size {size:#x}")]
    OutOfRange {
        /// Region index.
        region: u32,
        /// Offset of the access.
        offset: u64,
        /// Length of the access.
        len: usize,
        /// Size of the region.
        size: u64,
    },
}

/// What the control plane must do after a register write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceEvent {
    /// The driver set DRIVER_OK: start serving these queues.
    Activate(Activation),
    /// The driver reset the device: stop the queues, drop in-flight work.
    Reset,
    /// A doorbell write arrived through the socket instead of the mapped notify page.
    Notify(u16),
}

/// Everything a poller needs to serve the device after DRIVER_OK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activation {
    /// Negotiated features.
    pub features: u64,
    /// Enabled queues.
    pub queues: Vec<QueueConfig>,
    /// MSI-X vector for configuration changes.
    pub config_vector: u16,
}

/// One queue as the driver configured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueConfig {
    /// Queue index (0 = hiprio).
    pub index: u16,
    /// Number of descriptors.
    pub size: u16,
    /// Descriptor table address.
    pub desc: u64,
    /// Driver (avail) ring address.
    pub avail: u64,
    /// Device (used) ring address.
    pub used: u64,
    /// MSI-X vector, or [`NO_VECTOR`].
    pub vector: u16,
}

#[derive(Debug, Clone, Copy)]
struct QueueRegs {
    cfg: QueueConfig,
    enabled: bool,
}

/// The modern virtio-fs PCI function.
#[derive(Debug)]
pub struct VirtioFsFunction {
    config: [u8; CONFIG_SPACE_SIZE as usize],
    wmask: [u8; CONFIG_SPACE_SIZE as usize],
    bar_sizes: [u64; 6],
    tag: [u8; 36],
    request_queues: u16,
    max_queue_size: u16,
    device_features: u64,
    device_feature_select: u32,
    driver_feature_select: u32,
    driver_features: u64,
    status: u8,
    config_generation: u8,
    msix_config: u16,
    queue_select: u16,
    queues: Vec<QueueRegs>,
    isr: u8,
    msix_table: MsixTable,
    msix: Arc<MsixShared>,
}

fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn get32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

impl VirtioFsFunction {
    /// A function with `tag`, `request_queues` request queues of at most `max_queue_size`
    /// entries, offering `offered_features` (VERSION_1 is always offered).
    pub fn new(tag: &str, request_queues: u16, max_queue_size: u16, offered_features: u64) -> Self {
        let vectors = usize::from(request_queues) + 2; // config + hiprio + request queues
        let vectors = vectors.min(msix::MAX_VECTORS);
        let mut f = VirtioFsFunction {
            config: [0; CONFIG_SPACE_SIZE as usize],
            wmask: [0; CONFIG_SPACE_SIZE as usize],
            bar_sizes: [0, MSIX_BAR_SIZE, 0, 0, VIRTIO_BAR_SIZE, 0],
            tag: [0; 36],
            request_queues,
            max_queue_size,
            device_features: offered_features | features::VERSION_1,
            device_feature_select: 0,
            driver_feature_select: 0,
            driver_features: 0,
            status: 0,
            config_generation: 0,
            msix_config: NO_VECTOR,
            queue_select: 0,
            queues: Vec::new(),
            isr: 0,
            msix_table: MsixTable::new(vectors),
            msix: Arc::new(MsixShared::new(vectors)),
        };
        let n = tag.len().min(36);
        f.tag[..n].copy_from_slice(&tag.as_bytes()[..n]);
        f.build_config_space();
        f.reset_virtio();
        f
    }

    fn build_config_space(&mut self) {
        let c = &mut self.config;
        put16(c, 0x00, VENDOR_ID);
        put16(c, 0x02, DEVICE_ID);
        put16(c, 0x06, 1 << 4); // status: capabilities list
        c[0x08] = 1; // revision
        c[0x0a] = 0x80; // subclass: other
        c[0x0b] = 0x01; // class: mass storage
        put32(c, 0x14, 0); // BAR1: 32-bit memory
        put32(c, 0x20, 0b1100); // BAR4: 64-bit, prefetchable memory
        put16(c, 0x2c, VENDOR_ID);
        put16(c, 0x2e, VIRTIO_ID_FS);
        c[0x34] = CAP_MSIX as u8;
        c[0x3d] = 0; // no INTx: MSI-X only (an INTx we never raised would hang a fallback driver)
                     // MSI-X: table size N-1, table at BAR1+0, PBA at BAR1+0x800.
        c[CAP_MSIX] = 0x11;
        c[CAP_MSIX + 1] = CAP_COMMON as u8;
        put16(c, CAP_MSIX + 2, (self.msix.len() - 1) as u16);
        put32(c, CAP_MSIX + 4, MSIX_BAR);
        put32(c, CAP_MSIX + 8, PBA_OFFSET as u32 | MSIX_BAR);
        let mut vcap = |at: usize, next: usize, len: u8, cfg_type: u8, offset: u64, length: u64| {
            c[at] = 0x09;
            c[at + 1] = next as u8;
            c[at + 2] = len;
            c[at + 3] = cfg_type;
            c[at + 4] = VIRTIO_BAR as u8;
            put32(c, at + 8, offset as u32);
            put32(c, at + 12, length as u32);
        };
        vcap(CAP_COMMON, CAP_NOTIFY, 16, 1, COMMON_OFFSET, COMMON_SIZE);
        vcap(CAP_NOTIFY, CAP_ISR, 20, 2, NOTIFY_OFFSET, NOTIFY_SIZE);
        vcap(CAP_ISR, CAP_DEVICE, 16, 3, ISR_OFFSET, 1);
        vcap(CAP_DEVICE, CAP_PCI_CFG, 16, 4, DEVICE_CFG_OFFSET, DEVICE_CFG_SIZE);
        vcap(CAP_PCI_CFG, 0, 20, 5, 0, 0);
        c[CAP_PCI_CFG + 4] = 0;
        put32(c, CAP_NOTIFY + 16, NOTIFY_OFF_MULTIPLIER);

        let w = &mut self.wmask;
        put16(w, 0x04, 0x0407); // command: IO, memory, bus master, INTx disable
        put32(w, 0x14, !(MSIX_BAR_SIZE as u32 - 1)); // BAR1 address bits
        put32(w, 0x20, !(VIRTIO_BAR_SIZE as u32 - 1)); // BAR4 low address bits
        put32(w, 0x24, 0xffff_ffff); // BAR5: BAR4 high half
        w[0x3c] = 0xff; // interrupt line
        w[CAP_MSIX + 3] = 0xc0; // MSI-X enable + function mask
        w[CAP_PCI_CFG + 4] = 0xff; // bar
        put32(w, CAP_PCI_CFG + 8, 0xffff_ffff); // offset
        put32(w, CAP_PCI_CFG + 12, 0xffff_ffff); // length
        put32(w, PCI_CFG_DATA, 0xffff_ffff); // data
    }

    fn reset_virtio(&mut self) {
        self.device_feature_select = 0;
        self.driver_feature_select = 0;
        self.driver_features = 0;
        self.status = 0;
        self.msix_config = NO_VECTOR;
        self.queue_select = 0;
        self.isr = 0;
        self.queues = (0..=self.request_queues)
            .map(|i| QueueRegs {
                cfg: QueueConfig {
                    index: i,
                    size: self.max_queue_size,
                    vector: NO_VECTOR,
                    ..Default::default()
                },
                enabled: false,
            })
            .collect();
    }

    /// Function-level reset (vfio-user DEVICE_RESET): virtio state, MSI-X and command register.
    pub fn reset(&mut self) {
        self.reset_virtio();
        self.msix_table.reset();
        self.msix.reset();
        put16(&mut self.config, 0x04, 0);
        self.config[CAP_MSIX + 3] = 0;
    }

    /// The mask state shared with the pollers.
    pub fn msix(&self) -> &Arc<MsixShared> {
        &self.msix
    }

    /// What the pollers serve while the driver has the device running (DRIVER_OK, no reset
    /// asked): the negotiated features and the enabled queues; `None` otherwise.
    pub fn activation(&self) -> Option<Activation> {
        let running = self.status & status::DRIVER_OK != 0 && self.status & status::DEVICE_NEEDS_RESET == 0;
        running.then(|| Activation {
            features: self.driver_features,
            queues: self.queues.iter().filter(|q| q.enabled).map(|q| q.cfg).collect(),
            config_vector: self.msix_config,
        })
    }

    /// Number of virtqueues (hiprio + request queues).
    pub fn num_queues(&self) -> u16 {
        self.request_queues + 1
    }

    /// The features the driver wrote (what it accepted, once FEATURES_OK is set).
    pub fn driver_features(&self) -> u64 {
        self.driver_features
    }

    /// Current device status.
    pub fn status(&self) -> u8 {
        self.status
    }

    /// Marks the device broken (a queue the driver corrupted). Returns the config vector to
    /// signal, if any.
    pub fn set_needs_reset(&mut self) -> Option<u16> {
        self.status |= status::DEVICE_NEEDS_RESET;
        self.isr |= 2; // configuration change
        (self.msix_config != NO_VECTOR).then_some(self.msix_config)
    }

    /// Size of region `index` (vfio-pci numbering: BARs 0-5, ROM 6, config 7, VGA 8); 0 if absent.
    pub fn region_size(&self, index: u32) -> u64 {
        match index {
            0..=5 => self.bar_sizes[index as usize],
            7 => CONFIG_SPACE_SIZE,
            _ => 0,
        }
    }

    fn check(&self, region: u32, offset: u64, len: usize) -> Result<(), AccessError> {
        let size = self.region_size(region);
        if size == 0 {
            return Err(AccessError::NoRegion(region));
        }
        match offset.checked_add(len as u64) {
            Some(end) if end <= size => Ok(()),
            _ => Err(AccessError::OutOfRange { region, offset, len, size }),
        }
    }

    /// Reads from region `region` at `offset`.
    /// A read of no bytes reads nothing and has no side effect (an ISR read clears it only when
    /// it reads it).
    pub fn read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), AccessError> {
        self.check(region, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        match region {
            7 => self.config_read(offset as usize, data),
            MSIX_BAR => self.msix_table.read(&self.msix, offset, data),
            VIRTIO_BAR => self.virtio_read(offset, data),
            _ => data.fill(0),
        }
        Ok(())
    }

    /// Writes to region `region` at `offset`; returns what the control plane must act on. A
    /// write of no bytes changes nothing.
    pub fn write(
        &mut self,
        region: u32,
        offset: u64,
        data: &[u8],
    ) -> Result<Option<DeviceEvent>, AccessError> {
        self.check(region, offset, data.len())?;
        if data.is_empty() {
            return Ok(None);
        }
        Ok(match region {
            7 => self.config_write(offset as usize, data),
            MSIX_BAR => {
                self.msix_table.write(offset, data);
                None
            }
            VIRTIO_BAR => self.virtio_write(offset, data),
            _ => None,
        })
    }

    fn config_read(&mut self, offset: usize, data: &mut [u8]) {
        let end = offset + data.len();
        data.copy_from_slice(&self.config[offset..end]);
        // A read of the PCI cfg access window reads the BAR it points at.
        if offset < PCI_CFG_DATA + 4 && end > PCI_CFG_DATA {
            let mut window = [0u8; 4];
            if let Some((bar, off, len)) = self.pci_cfg_target() {
                let _ = self.read(bar, off, &mut window[..len]);
            }
            for (i, b) in data.iter_mut().enumerate() {
                let at = offset + i;
                if (PCI_CFG_DATA..PCI_CFG_DATA + 4).contains(&at) {
                    *b = window[at - PCI_CFG_DATA];
                }
            }
        }
    }

    fn pci_cfg_target(&self) -> Option<(u32, u64, usize)> {
        let bar = u32::from(self.config[CAP_PCI_CFG + 4]);
        let off = u64::from(get32(&self.config, CAP_PCI_CFG + 8));
        let len = get32(&self.config, CAP_PCI_CFG + 12) as usize;
        (matches!(len, 1 | 2 | 4) && bar < 6 && off % len as u64 == 0).then_some((bar, off, len))
    }

    fn config_write(&mut self, offset: usize, data: &[u8]) -> Option<DeviceEvent> {
        for (i, &b) in data.iter().enumerate() {
            let at = offset + i;
            let m = self.wmask[at];
            self.config[at] = (self.config[at] & !m) | (b & m);
        }
        // Writes to BAR registers keep the type bits and the size alignment (BAR sizing).
        let bar1 = get32(&self.config, 0x14) & !(MSIX_BAR_SIZE as u32 - 1);
        put32(&mut self.config, 0x14, bar1);
        let bar4 = (get32(&self.config, 0x20) & !(VIRTIO_BAR_SIZE as u32 - 1)) | 0b1100;
        put32(&mut self.config, 0x20, bar4);
        if offset < PCI_CFG_DATA + 4 && offset + data.len() > PCI_CFG_DATA {
            if let Some((bar, off, len)) = self.pci_cfg_target() {
                let window: [u8; 4] =
                    self.config[PCI_CFG_DATA..PCI_CFG_DATA + 4].try_into().unwrap_or_default();
                return self.write(bar, off, &window[..len]).ok().flatten();
            }
        }
        None
    }

    fn virtio_read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        match offset {
            o if o < COMMON_OFFSET + COMMON_SIZE => self.common_read(o - COMMON_OFFSET, data),
            ISR_OFFSET => {
                data[0] = self.isr;
                self.isr = 0;
            }
            o if (DEVICE_CFG_OFFSET..DEVICE_CFG_OFFSET + DEVICE_CFG_SIZE).contains(&o) => {
                let mut cfg = [0u8; DEVICE_CFG_SIZE as usize];
                cfg[..36].copy_from_slice(&self.tag);
                put32(&mut cfg, 36, u32::from(self.request_queues));
                let start = (o - DEVICE_CFG_OFFSET) as usize;
                let n = data.len().min(cfg.len() - start);
                data[..n].copy_from_slice(&cfg[start..start + n]);
            }
            _ => {}
        }
    }

    fn virtio_write(&mut self, offset: u64, data: &[u8]) -> Option<DeviceEvent> {
        match offset {
            o if o < COMMON_OFFSET + COMMON_SIZE => self.common_write(o - COMMON_OFFSET, data),
            o if (NOTIFY_OFFSET..NOTIFY_OFFSET + NOTIFY_SIZE).contains(&o) => {
                let q = (o - NOTIFY_OFFSET) / u64::from(NOTIFY_OFF_MULTIPLIER);
                (q < u64::from(self.num_queues())).then_some(DeviceEvent::Notify(q as u16))
            }
            _ => None, // ISR and device config are read-only.
        }
    }

    fn selected(&mut self) -> Option<&mut QueueRegs> {
        self.queues.get_mut(usize::from(self.queue_select))
    }

    fn common_read(&mut self, off: u64, data: &mut [u8]) {
        let mut regs = [0u8; COMMON_SIZE as usize];
        put32(&mut regs, 0x00, self.device_feature_select);
        let dev_f = match self.device_feature_select {
            0 => self.device_features as u32,
            1 => (self.device_features >> 32) as u32,
            _ => 0,
        };
        put32(&mut regs, 0x04, dev_f);
        put32(&mut regs, 0x08, self.driver_feature_select);
        let drv_f = match self.driver_feature_select {
            0 => self.driver_features as u32,
            1 => (self.driver_features >> 32) as u32,
            _ => 0,
        };
        put32(&mut regs, 0x0c, drv_f);
        put16(&mut regs, 0x10, self.msix_config);
        put16(&mut regs, 0x12, self.num_queues());
        regs[0x14] = self.status;
        regs[0x15] = self.config_generation;
        put16(&mut regs, 0x16, self.queue_select);
        if let Some(q) = self.queues.get(usize::from(self.queue_select)) {
            put16(&mut regs, 0x18, q.cfg.size);
            put16(&mut regs, 0x1a, q.cfg.vector);
            put16(&mut regs, 0x1c, u16::from(q.enabled));
            put16(&mut regs, 0x1e, q.cfg.index);
            regs[0x20..0x28].copy_from_slice(&q.cfg.desc.to_le_bytes());
            regs[0x28..0x30].copy_from_slice(&q.cfg.avail.to_le_bytes());
            regs[0x30..0x38].copy_from_slice(&q.cfg.used.to_le_bytes());
        }
        let off = off as usize;
        let n = data.len().min(regs.len() - off);
        data[..n].copy_from_slice(&regs[off..off + n]);
    }

    fn common_write(&mut self, off: u64, data: &[u8]) -> Option<DeviceEvent> {
        // Registers are written whole; a partial write of a wider register updates those bytes.
        let mut regs = [0u8; COMMON_SIZE as usize];
        self.common_read(0, &mut regs);
        let off = off as usize;
        let n = data.len().min(regs.len() - off);
        regs[off..off + n].copy_from_slice(&data[..n]);
        let touched = |reg: usize, width: usize| off < reg + width && off + n > reg;
        let r16 = |reg: usize| u16::from_le_bytes([regs[reg], regs[reg + 1]]);
        let r64 = |reg: usize| u64::from_le_bytes(regs[reg..reg + 8].try_into().unwrap_or_default());
        let features_locked = self.status & status::FEATURES_OK != 0;
        let live = self.status & status::DRIVER_OK != 0;

        if touched(0x00, 4) {
            self.device_feature_select = get32(&regs, 0x00);
        }
        if touched(0x08, 4) {
            self.driver_feature_select = get32(&regs, 0x08);
        }
        if touched(0x0c, 4) && !features_locked {
            let v = u64::from(get32(&regs, 0x0c));
            match self.driver_feature_select {
                0 => self.driver_features = (self.driver_features & !0xffff_ffff) | v,
                1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (v << 32),
                _ => {}
            }
        }
        if touched(0x10, 2) {
            let v = r16(0x10);
            self.msix_config = if usize::from(v) < self.msix.len() { v } else { NO_VECTOR };
        }
        if touched(0x16, 2) {
            self.queue_select = r16(0x16);
        }
        if !live {
            let max = self.max_queue_size;
            let vectors = self.msix.len();
            if let Some(q) = self.selected() {
                if !q.enabled {
                    if touched(0x18, 2) {
                        let v = r16(0x18);
                        q.cfg.size = if v <= max { v } else { q.cfg.size };
                    }
                    if touched(0x20, 8) {
                        q.cfg.desc = r64(0x20);
                    }
                    if touched(0x28, 8) {
                        q.cfg.avail = r64(0x28);
                    }
                    if touched(0x30, 8) {
                        q.cfg.used = r64(0x30);
                    }
                }
                if touched(0x1a, 2) {
                    let v = r16(0x1a);
                    q.cfg.vector = if usize::from(v) < vectors { v } else { NO_VECTOR };
                }
                if touched(0x1c, 2) && r16(0x1c) == 1 {
                    q.enabled = true;
                }
            }
        }
        if touched(0x14, 1) {
            return self.write_status(regs[0x14]);
        }
        None
    }

    fn write_status(&mut self, new: u8) -> Option<DeviceEvent> {
        if new == 0 {
            self.reset_virtio();
            return Some(DeviceEvent::Reset);
        }
        let old = self.status;
        // Bits can only be set by the driver (clearing needs a reset); NEEDS_RESET is device-owned.
        let mut next = old | (new & !status::DEVICE_NEEDS_RESET);
        if next & status::FEATURES_OK != 0 && old & status::FEATURES_OK == 0 {
            let unknown = self.driver_features & !self.device_features != 0;
            if unknown || self.driver_features & features::VERSION_1 == 0 {
                next &= !status::FEATURES_OK; // The driver reads it back and gives up.
            }
        }
        if next & status::DRIVER_OK != 0 && next & status::FEATURES_OK == 0 {
            next &= !status::DRIVER_OK;
        }
        self.status = next;
        if next & status::DRIVER_OK != 0 && old & status::DRIVER_OK == 0 {
            return Some(DeviceEvent::Activate(Activation {
                features: self.driver_features,
                queues: self.queues.iter().filter(|q| q.enabled).map(|q| q.cfg).collect(),
                config_vector: self.msix_config,
            }));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rd(f: &mut VirtioFsFunction, region: u32, off: u64, len: usize) -> u64 {
        let mut b = [0u8; 8];
        f.read(region, off, &mut b[..len]).unwrap();
        u64::from_le_bytes(b)
    }
    fn wr(f: &mut VirtioFsFunction, region: u32, off: u64, len: usize, v: u64) -> Option<DeviceEvent> {
        f.write(region, off, &v.to_le_bytes()[..len]).unwrap()
    }
    fn func() -> VirtioFsFunction {
        VirtioFsFunction::new("myfs", 2, 256, features::EVENT_IDX | features::INDIRECT_DESC)
    }

    #[test]
    fn identity_and_capability_chain() {
        let mut f = func();
        assert_eq!(rd(&mut f, 7, 0, 4), 0x105a_1af4);
        assert_eq!(rd(&mut f, 7, 0x06, 2) & 0x10, 0x10);
        let mut at = rd(&mut f, 7, 0x34, 1);
        let mut seen = vec![];
        while at != 0 {
            let id = rd(&mut f, 7, at, 1);
            let ty = if id == 9 { rd(&mut f, 7, at + 3, 1) } else { 0 };
            seen.push((id, ty));
            at = rd(&mut f, 7, at + 1, 1);
        }
        assert_eq!(seen, vec![(0x11, 0), (9, 1), (9, 2), (9, 3), (9, 4), (9, 5)]);
        assert_eq!(rd(&mut f, 7, 0x40 + 2, 2) & 0x7ff, 3, "4 vectors: config + 3 queues");
    }

    #[test]
    fn bar_sizing() {
        let mut f = func();
        wr(&mut f, 7, 0x20, 4, 0xffff_ffff);
        wr(&mut f, 7, 0x24, 4, 0xffff_ffff);
        assert_eq!(rd(&mut f, 7, 0x20, 4), 0xffff_c00c);
        assert_eq!(rd(&mut f, 7, 0x24, 4), 0xffff_ffff);
        wr(&mut f, 7, 0x14, 4, 0xffff_ffff);
        assert_eq!(rd(&mut f, 7, 0x14, 4), 0xffff_f000);
        wr(&mut f, 7, 0x10, 4, 0xffff_ffff);
        assert_eq!(rd(&mut f, 7, 0x10, 4), 0, "BAR0 is not implemented");
        wr(&mut f, 7, 0x00, 4, 0);
        assert_eq!(rd(&mut f, 7, 0, 4), 0x105a_1af4, "ids are read-only");
    }

    #[test]
    fn init_sequence_activates() {
        let mut f = func();
        let c = |o| COMMON_OFFSET + o;
        wr(&mut f, 4, c(0x14), 1, 0);
        wr(&mut f, 4, c(0x14), 1, 3);
        wr(&mut f, 4, c(0x00), 4, 1);
        assert_eq!(rd(&mut f, 4, c(0x04), 4), 1, "VERSION_1 offered");
        wr(&mut f, 4, c(0x08), 4, 1);
        wr(&mut f, 4, c(0x0c), 4, 1);
        wr(&mut f, 4, c(0x08), 4, 0);
        wr(&mut f, 4, c(0x0c), 4, features::EVENT_IDX);
        wr(&mut f, 4, c(0x14), 1, 0xb);
        assert_eq!(rd(&mut f, 4, c(0x14), 1), 0xb);
        wr(&mut f, 4, c(0x10), 2, 0);
        assert_eq!(rd(&mut f, 4, c(0x10), 2), 0);
        for q in 0..3u64 {
            wr(&mut f, 4, c(0x16), 2, q);
            assert_eq!(rd(&mut f, 4, c(0x18), 2), 256);
            wr(&mut f, 4, c(0x18), 2, 128);
            wr(&mut f, 4, c(0x1a), 2, q + 1);
            assert_eq!(rd(&mut f, 4, c(0x1a), 2), q + 1);
            wr(&mut f, 4, c(0x20), 8, 0x10000 * (q + 1));
            wr(&mut f, 4, c(0x28), 8, 0x10000 * (q + 1) + 0x800);
            wr(&mut f, 4, c(0x30), 8, 0x10000 * (q + 1) + 0x1000);
            wr(&mut f, 4, c(0x1c), 2, 1);
            assert_eq!(rd(&mut f, 4, c(0x1e), 2), q);
        }
        wr(&mut f, 4, c(0x16), 2, 9);
        assert_eq!(rd(&mut f, 4, c(0x18), 2), 0, "absent queue reads size 0");
        wr(&mut f, 4, c(0x1a), 2, 77);
        let ev = wr(&mut f, 4, c(0x14), 1, 0xf).expect("activation");
        let DeviceEvent::Activate(a) = ev else { panic!("{ev:?}") };
        assert_eq!(a.features, features::VERSION_1 | features::EVENT_IDX);
        assert_eq!(a.queues.len(), 3);
        assert_eq!(
            a.queues[2],
            QueueConfig { index: 2, size: 128, desc: 0x30000, avail: 0x30800, used: 0x31000, vector: 3 }
        );
        // Registers are frozen while live.
        wr(&mut f, 4, c(0x16), 2, 1);
        wr(&mut f, 4, c(0x20), 8, 0xdead000);
        assert_eq!(rd(&mut f, 4, c(0x20), 8), 0x20000);
        assert_eq!(wr(&mut f, 4, c(0x14), 1, 0), Some(DeviceEvent::Reset));
        assert_eq!(rd(&mut f, 4, c(0x14), 1), 0);
    }

    #[test]
    fn features_ok_refused_without_version_1_or_with_unknown_bits() {
        let mut f = func();
        let c = |o| COMMON_OFFSET + o;
        wr(&mut f, 4, c(0x14), 1, 3);
        wr(&mut f, 4, c(0x14), 1, 0xb);
        assert_eq!(rd(&mut f, 4, c(0x14), 1), 3, "no VERSION_1");
        wr(&mut f, 4, c(0x08), 4, 1);
        wr(&mut f, 4, c(0x0c), 4, 1 | 1 << 20);
        wr(&mut f, 4, c(0x14), 1, 0xb);
        assert_eq!(rd(&mut f, 4, c(0x14), 1), 3, "unknown feature");
        assert_eq!(wr(&mut f, 4, c(0x14), 1, 0xf), None, "DRIVER_OK without FEATURES_OK");
    }

    #[test]
    fn device_config_isr_notify_and_bounds() {
        let mut f = func();
        let mut tag = [0u8; 36];
        f.read(4, DEVICE_CFG_OFFSET, &mut tag).unwrap();
        assert_eq!(&tag[..5], b"myfs\0");
        assert_eq!(rd(&mut f, 4, DEVICE_CFG_OFFSET + 36, 4), 2);
        assert_eq!(f.set_needs_reset(), None);
        assert_eq!(rd(&mut f, 4, ISR_OFFSET, 1), 2);
        assert_eq!(rd(&mut f, 4, ISR_OFFSET, 1), 0, "ISR read clears");
        assert_eq!(wr(&mut f, 4, NOTIFY_OFFSET + 8, 2, 2), Some(DeviceEvent::Notify(2)));
        assert_eq!(wr(&mut f, 4, NOTIFY_OFFSET + 12, 2, 3), None);
        assert_eq!(
            f.read(4, VIRTIO_BAR_SIZE - 2, &mut [0; 4]),
            Err(AccessError::OutOfRange {
                region: 4,
                offset: VIRTIO_BAR_SIZE - 2,
                len: 4,
                size: VIRTIO_BAR_SIZE
            })
        );
        assert_eq!(f.read(2, 0, &mut [0; 4]), Err(AccessError::NoRegion(2)));
        assert!(f.read(7, u64::MAX, &mut [0; 4]).is_err());
    }

    /// Fuzz finding (`vfio_user`, regression input `zero-length-isr-read`): a REGION_READ of
    /// 0 bytes at the ISR indexed the empty buffer and panicked the control plane.
    #[test]
    fn zero_length_accesses_are_no_ops() {
        let mut f = func();
        assert_eq!(f.set_needs_reset(), None);
        let at = [
            (4, 0),
            (4, COMMON_OFFSET + 0x16),
            (4, ISR_OFFSET),
            (4, DEVICE_CFG_OFFSET),
            (4, NOTIFY_OFFSET),
            (4, VIRTIO_BAR_SIZE),
            (MSIX_BAR, 0),
            (7, 0),
            (7, PCI_CFG_DATA as u64),
        ];
        for (region, off) in at {
            assert_eq!(f.read(region, off, &mut []), Ok(()), "read of 0 bytes at {region}:{off:#x}");
            assert_eq!(f.write(region, off, &[]), Ok(None), "write of 0 bytes at {region}:{off:#x}");
        }
        assert_eq!(rd(&mut f, 4, ISR_OFFSET, 1), 2, "a read of no bytes does not clear the ISR");
    }

    #[test]
    fn pci_cfg_window_reaches_the_bar() {
        let mut f = func();
        wr(&mut f, 7, CAP_PCI_CFG as u64 + 4, 1, 4);
        wr(&mut f, 7, CAP_PCI_CFG as u64 + 8, 4, DEVICE_CFG_OFFSET + 36);
        wr(&mut f, 7, CAP_PCI_CFG as u64 + 12, 4, 4);
        assert_eq!(rd(&mut f, 7, PCI_CFG_DATA as u64, 4), 2);
        wr(&mut f, 7, CAP_PCI_CFG as u64 + 8, 4, COMMON_OFFSET + 0x16);
        wr(&mut f, 7, CAP_PCI_CFG as u64 + 12, 4, 2);
        wr(&mut f, 7, PCI_CFG_DATA as u64, 2, 2);
        assert_eq!(rd(&mut f, 4, COMMON_OFFSET + 0x16, 2), 2, "queue_select written through the window");
    }

    #[test]
    fn msix_control_is_stored() {
        let mut f = func();
        wr(&mut f, 7, CAP_MSIX as u64 + 2, 2, 0x4000 | 0x8000 | 0x7ff);
        assert_eq!(rd(&mut f, 7, CAP_MSIX as u64 + 2, 2), 0xc003, "table size is read-only");
        f.reset();
        assert_eq!(rd(&mut f, 7, CAP_MSIX as u64 + 2, 2), 0x0003);
    }
}
