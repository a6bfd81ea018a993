//! The virtio-pci modern transport, driven through vfio-user as Linux `virtio_pci_modern` does.
//!
//! Every register access is a REGION_READ/REGION_WRITE on the BAR named by the virtio capability,
//! with Linux's access widths (8-bit status, 16-bit queue registers, 64-bit addresses as two 32-bit
//! writes, low half first). The only exception is the notify area: when the device offers it as a
//! sparse-mmap area, the driver maps it and doorbell writes become plain stores, as in a VM.
//!
//! Common configuration (`struct virtio_pci_common_cfg`):
//!
//! | offset | width | field |
//! |---|---|---|
//! | 0x00 | 4 | device_feature_select |
//! | 0x04 | 4 | device_feature (ro) |
//! | 0x08 | 4 | driver_feature_select |
//! | 0x0c | 4 | driver_feature |
//! | 0x10 | 2 | config_msix_vector |
//! | 0x12 | 2 | num_queues (ro) |
//! | 0x14 | 1 | device_status |
//! | 0x15 | 1 | config_generation (ro) |
//! | 0x16 | 2 | queue_select |
//! | 0x18 | 2 | queue_size |
//! | 0x1a | 2 | queue_msix_vector |
//! | 0x1c | 2 | queue_enable |
//! | 0x1e | 2 | queue_notify_off (ro) |
//! | 0x20 | 8 | queue_desc |
//! | 0x28 | 8 | queue_driver (avail) |
//! | 0x30 | 8 | queue_device (used) |

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, FileOffset, MmapRegion, VolatileMemory};

use crate::pci::{MsixCap, VirtioCap};
use crate::vfio_user::{Client, ClientError, Region};

/// device_feature_select.
pub const COMMON_DFSELECT: u64 = 0x00;
/// device_feature.
pub const COMMON_DF: u64 = 0x04;
/// driver_feature_select.
pub const COMMON_GFSELECT: u64 = 0x08;
/// driver_feature.
pub const COMMON_GF: u64 = 0x0c;
/// config_msix_vector.
pub const COMMON_MSIX: u64 = 0x10;
/// num_queues.
pub const COMMON_NUMQ: u64 = 0x12;
/// device_status.
pub const COMMON_STATUS: u64 = 0x14;
/// config_generation.
pub const COMMON_CFGGENERATION: u64 = 0x15;
/// queue_select.
pub const COMMON_Q_SELECT: u64 = 0x16;
/// queue_size.
pub const COMMON_Q_SIZE: u64 = 0x18;
/// queue_msix_vector.
pub const COMMON_Q_MSIX: u64 = 0x1a;
/// queue_enable.
pub const COMMON_Q_ENABLE: u64 = 0x1c;
/// queue_notify_off.
pub const COMMON_Q_NOFF: u64 = 0x1e;
/// queue_desc.
pub const COMMON_Q_DESCLO: u64 = 0x20;
/// queue_driver.
pub const COMMON_Q_AVAILLO: u64 = 0x28;
/// queue_device.
pub const COMMON_Q_USEDLO: u64 = 0x30;
/// Smallest common config that holds all of the above.
pub const COMMON_CFG_MIN_LEN: u32 = 0x38;

/// Status: guest saw the device.
pub const STATUS_ACKNOWLEDGE: u8 = 1;
/// Status: guest has a driver.
pub const STATUS_DRIVER: u8 = 2;
/// Status: driver ready.
pub const STATUS_DRIVER_OK: u8 = 4;
/// Status: features accepted.
pub const STATUS_FEATURES_OK: u8 = 8;
/// Status: device needs reset.
pub const STATUS_NEEDS_RESET: u8 = 0x40;
/// Status: driver gave up.
pub const STATUS_FAILED: u8 = 0x80;

/// MSI-X "no vector".
pub const VIRTIO_MSI_NO_VECTOR: u16 = 0xffff;

/// Feature bits.
#[allow(missing_docs)]
pub mod features {
    pub const VIRTIO_FS_F_NOTIFICATION: u64 = 1 << 0;
    pub const INDIRECT_DESC: u64 = 1 << 28;
    pub const EVENT_IDX: u64 = 1 << 29;
    pub const VERSION_1: u64 = 1 << 32;
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
    pub const RING_PACKED: u64 = 1 << 34;
    pub const IN_ORDER: u64 = 1 << 35;
    pub const ORDER_PLATFORM: u64 = 1 << 36;
    pub const SR_IOV: u64 = 1 << 37;
    pub const NOTIFICATION_DATA: u64 = 1 << 38;
    pub const RING_RESET: u64 = 1 << 40;
}

/// Errors of the transport.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A vfio-user access failed.
    #[error("register access failed")]
    Client(#[from] ClientError),
    /// The device does not behave like a virtio-pci device.
    #[error("device misbehaves: {0}")]
    Device(String),
}

fn dev_err(s: impl Into<String>) -> TransportError {
    TransportError::Device(s.into())
}

/// Where a virtio structure lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapLocation {
    /// BAR (= vfio-user region index).
    pub bar: u8,
    /// Offset in the BAR.
    pub offset: u64,
    /// Length.
    pub length: u64,
}

impl From<&VirtioCap> for CapLocation {
    fn from(c: &VirtioCap) -> Self {
        CapLocation { bar: c.bar, offset: u64::from(c.offset), length: u64::from(c.length) }
    }
}

/// The virtio structures found in config space.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Common configuration.
    pub common: CapLocation,
    /// Notification area.
    pub notify: CapLocation,
    /// notify_off_multiplier.
    pub notify_off_multiplier: u32,
    /// ISR status.
    pub isr: Option<CapLocation>,
    /// Device configuration.
    pub device: CapLocation,
    /// MSI-X capability.
    pub msix: Option<MsixCap>,
}

struct NotifyMap {
    bar: u8,
    start: u64,
    len: u64,
    map: MmapRegion,
}

/// Register access to a virtio-pci device over vfio-user.
pub struct Transport {
    client: Client,
    layout: Layout,
    notify_map: Option<NotifyMap>,
    posted: bool,
    notifies_mmio: u64,
    notifies_msg: u64,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("layout", &self.layout)
            .field("notify_mapped", &self.notify_map.is_some())
            .field("posted", &self.posted)
            .finish()
    }
}

impl Transport {
    /// Wraps a connected client. `posted` makes BAR writes NO_REPLY (as QEMU does).
    pub fn new(client: Client, layout: Layout, posted: bool) -> Transport {
        Transport { client, layout, notify_map: None, posted, notifies_mmio: 0, notifies_msg: 0 }
    }

    /// The vfio-user client (for config space and raw access).
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Consumes the transport, returning the client.
    pub fn into_client(self) -> Client {
        self.client
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Whether doorbells go through an mmapped area.
    pub fn notify_mapped(&self) -> bool {
        self.notify_map.is_some()
    }

    /// (doorbells written to the mmapped area, doorbells sent as REGION_WRITE).
    pub fn notify_counts(&self) -> (u64, u64) {
        (self.notifies_mmio, self.notifies_msg)
    }

    /// Maps the part of `region` (the notify cap's BAR) that covers the notify structure, if the
    /// device offers it as mappable. Returns whether it did.
    pub fn map_notify(&mut self, region: &Region) -> Result<bool, TransportError> {
        let n = self.layout.notify;
        if u32::from(n.bar) != region.info.index {
            return Err(dev_err("map_notify given the wrong region"));
        }
        let Some(fd) = region.fd.as_ref() else {
            return Ok(false);
        };
        let area = region
            .mappable_areas()
            .into_iter()
            .find(|a| a.offset <= n.offset && n.offset + n.length <= a.offset + a.size);
        let Some(area) = area else {
            return Ok(false);
        };
        let file = fd.try_clone().map_err(|e| dev_err(format!("cannot dup the region fd: {e}")))?;
        let map = MmapRegion::from_file(
            FileOffset::new(file, region.info.offset + area.offset),
            area.size as usize,
        )
        .map_err(|e| {
            dev_err(format!(
                "cannot mmap BAR {} area {:#x}+{:#x} at fd offset {:#x}: {e}",
                n.bar, area.offset, area.size, region.info.offset
            ))
        })?;
        self.notify_map = Some(NotifyMap { bar: n.bar, start: area.offset, len: area.size, map });
        Ok(true)
    }

    fn read(&mut self, loc: CapLocation, off: u64, size: usize) -> Result<u64, TransportError> {
        if off + size as u64 > loc.length {
            return Err(dev_err(format!("register {off:#x} beyond structure length {:#x}", loc.length)));
        }
        Ok(self.client.read_le(u32::from(loc.bar), loc.offset + off, size)?)
    }

    fn write(&mut self, loc: CapLocation, off: u64, size: usize, v: u64) -> Result<(), TransportError> {
        if off + size as u64 > loc.length {
            return Err(dev_err(format!("register {off:#x} beyond structure length {:#x}", loc.length)));
        }
        Ok(self.client.write_le(u32::from(loc.bar), loc.offset + off, size, v, self.posted)?)
    }

    /// Reads a common-config register.
    pub fn common_read(&mut self, off: u64, size: usize) -> Result<u64, TransportError> {
        self.read(self.layout.common, off, size)
    }

    /// Writes a common-config register.
    pub fn common_write(&mut self, off: u64, size: usize, v: u64) -> Result<(), TransportError> {
        self.write(self.layout.common, off, size, v)
    }

    /// Reads device-config bytes.
    pub fn device_read(&mut self, off: u64, size: usize) -> Result<u64, TransportError> {
        self.read(self.layout.device, off, size)
    }

    /// Device status.
    pub fn status(&mut self) -> Result<u8, TransportError> {
        Ok(self.common_read(COMMON_STATUS, 1)? as u8)
    }

    /// Writes device status.
    pub fn set_status(&mut self, s: u8) -> Result<(), TransportError> {
        self.common_write(COMMON_STATUS, 1, u64::from(s))
    }

    /// Linux `virtio_add_status`: read, OR in `bit`, write.
    pub fn add_status(&mut self, bit: u8) -> Result<(), TransportError> {
        let s = self.status()?;
        self.set_status(s | bit)
    }

    /// Linux `vp_reset`: write 0, then poll until the device reads back 0.
    pub fn reset(&mut self, timeout: Duration) -> Result<(), TransportError> {
        self.set_status(0)?;
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.status()?;
            if s == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(dev_err(format!("status still {s:#x} after reset")));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The 64 device feature bits (select 0 and 1).
    pub fn device_features(&mut self) -> Result<u64, TransportError> {
        self.common_write(COMMON_DFSELECT, 4, 0)?;
        let lo = self.common_read(COMMON_DF, 4)?;
        self.common_write(COMMON_DFSELECT, 4, 1)?;
        let hi = self.common_read(COMMON_DF, 4)?;
        Ok(lo | (hi << 32))
    }

    /// Writes the 64 driver feature bits.
    pub fn set_driver_features(&mut self, f: u64) -> Result<(), TransportError> {
        self.common_write(COMMON_GFSELECT, 4, 0)?;
        self.common_write(COMMON_GF, 4, f & 0xffff_ffff)?;
        self.common_write(COMMON_GFSELECT, 4, 1)?;
        self.common_write(COMMON_GF, 4, f >> 32)
    }

    /// num_queues.
    pub fn num_queues(&mut self) -> Result<u16, TransportError> {
        Ok(self.common_read(COMMON_NUMQ, 2)? as u16)
    }

    /// config_generation.
    pub fn config_generation(&mut self) -> Result<u8, TransportError> {
        Ok(self.common_read(COMMON_CFGGENERATION, 1)? as u8)
    }

    /// Writes config_msix_vector and returns what reads back.
    pub fn set_config_vector(&mut self, v: u16) -> Result<u16, TransportError> {
        self.common_write(COMMON_MSIX, 2, u64::from(v))?;
        Ok(self.common_read(COMMON_MSIX, 2)? as u16)
    }

    fn select(&mut self, q: u16) -> Result<(), TransportError> {
        self.common_write(COMMON_Q_SELECT, 2, u64::from(q))
    }

    /// Max size of queue `q` (0 = not available).
    pub fn queue_size(&mut self, q: u16) -> Result<u16, TransportError> {
        self.select(q)?;
        Ok(self.common_read(COMMON_Q_SIZE, 2)? as u16)
    }

    /// queue_enable of queue `q`.
    pub fn queue_enabled(&mut self, q: u16) -> Result<bool, TransportError> {
        self.select(q)?;
        Ok(self.common_read(COMMON_Q_ENABLE, 2)? != 0)
    }

    /// Sets the size of queue `q`.
    pub fn set_queue_size(&mut self, q: u16, n: u16) -> Result<(), TransportError> {
        self.select(q)?;
        self.common_write(COMMON_Q_SIZE, 2, u64::from(n))
    }

    fn write64(&mut self, off: u64, v: u64) -> Result<(), TransportError> {
        self.common_write(off, 4, v & 0xffff_ffff)?;
        self.common_write(off + 4, 4, v >> 32)
    }

    /// Sets the ring addresses of queue `q` (Linux `vp_modern_queue_address`).
    pub fn set_queue_addrs(
        &mut self,
        q: u16,
        desc: u64,
        avail: u64,
        used: u64,
    ) -> Result<(), TransportError> {
        self.select(q)?;
        self.write64(COMMON_Q_DESCLO, desc)?;
        self.write64(COMMON_Q_AVAILLO, avail)?;
        self.write64(COMMON_Q_USEDLO, used)
    }

    /// Reads back the ring addresses of queue `q`.
    pub fn queue_addrs(&mut self, q: u16) -> Result<(u64, u64, u64), TransportError> {
        self.select(q)?;
        let mut r = [0u64; 3];
        for (i, off) in [COMMON_Q_DESCLO, COMMON_Q_AVAILLO, COMMON_Q_USEDLO].iter().enumerate() {
            let lo = self.common_read(*off, 4)?;
            let hi = self.common_read(off + 4, 4)?;
            r[i] = lo | (hi << 32);
        }
        Ok((r[0], r[1], r[2]))
    }

    /// Writes queue_msix_vector of `q`; returns what reads back.
    pub fn set_queue_vector(&mut self, q: u16, v: u16) -> Result<u16, TransportError> {
        self.select(q)?;
        self.common_write(COMMON_Q_MSIX, 2, u64::from(v))?;
        Ok(self.common_read(COMMON_Q_MSIX, 2)? as u16)
    }

    /// queue_notify_off of `q`.
    pub fn queue_notify_off(&mut self, q: u16) -> Result<u16, TransportError> {
        self.select(q)?;
        Ok(self.common_read(COMMON_Q_NOFF, 2)? as u16)
    }

    /// Sets queue_enable = 1 for `q`.
    pub fn enable_queue(&mut self, q: u16) -> Result<(), TransportError> {
        self.select(q)?;
        self.common_write(COMMON_Q_ENABLE, 2, 1)
    }

    /// Offset in the notify BAR of queue `q`'s doorbell, checked against the notify length.
    pub fn notify_offset(&self, notify_off: u16) -> Result<u64, TransportError> {
        let n = self.layout.notify;
        let rel = u64::from(notify_off) * u64::from(self.layout.notify_off_multiplier);
        if rel + 2 > n.length {
            return Err(dev_err(format!(
                "queue_notify_off {notify_off} x multiplier {} is beyond the notify area ({:#x} bytes)",
                self.layout.notify_off_multiplier, n.length
            )));
        }
        Ok(n.offset + rel)
    }

    /// Rings queue `q`'s doorbell (16-bit write of the queue index) at BAR offset `addr`.
    pub fn notify(&mut self, q: u16, addr: u64) -> Result<(), TransportError> {
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(m) = &self.notify_map {
            if u32::from(m.bar) == u32::from(self.layout.notify.bar)
                && addr >= m.start
                && addr + 2 <= m.start + m.len
            {
                m.map
                    .as_volatile_slice()
                    .store(q.to_le(), (addr - m.start) as usize, Ordering::Release)
                    .map_err(|e| dev_err(format!("doorbell store failed: {e}")))?;
                self.notifies_mmio += 1;
                return Ok(());
            }
        }
        self.notifies_msg += 1;
        let bar = u32::from(self.layout.notify.bar);
        Ok(self.client.write_le(bar, addr, 2, u64::from(q), self.posted)?)
    }
}
