//! PCI configuration space as the driver sees it through the vfio-user config region.
//!
//! Config space is region 7 (`VFIO_PCI_CONFIG_REGION_INDEX`); every access is a REGION_READ or
//! REGION_WRITE of the width Linux would use. This module walks the capability list, decodes the
//! virtio vendor capabilities and the MSI-X capability, and reads/sizes the BARs.
//!
//! Header fields used:
//!
//! | offset | width | field |
//! |---|---|---|
//! | 0x00 | 2 | vendor id (0x1af4) |
//! | 0x02 | 2 | device id (0x105a for virtio-fs) |
//! | 0x04 | 2 | command (bit 1 memory space, bit 2 bus master) |
//! | 0x06 | 2 | status (bit 4 capability list) |
//! | 0x10 | 4 x 6 | BARs |
//! | 0x34 | 1 | capabilities pointer |
//!
//! `struct virtio_pci_cap` (cap id 0x09): `cap_vndr, cap_next, cap_len, cfg_type, bar, id,
//! padding[2], le32 offset, le32 length`; the notify cap adds `le32 notify_off_multiplier`.

use vfio_bindings::bindings::vfio::VFIO_PCI_CONFIG_REGION_INDEX;

use crate::vfio_user::{Client, ClientError};

/// Config region index.
pub const CONFIG_REGION: u32 = VFIO_PCI_CONFIG_REGION_INDEX;
/// Vendor id register.
pub const PCI_VENDOR_ID: u64 = 0x00;
/// Device id register.
pub const PCI_DEVICE_ID: u64 = 0x02;
/// Command register.
pub const PCI_COMMAND: u64 = 0x04;
/// Status register.
pub const PCI_STATUS: u64 = 0x06;
/// First BAR.
pub const PCI_BASE_ADDRESS_0: u64 = 0x10;
/// Capabilities pointer.
pub const PCI_CAPABILITY_LIST: u64 = 0x34;
/// Command: memory space enable.
pub const PCI_COMMAND_MEMORY: u16 = 1 << 1;
/// Command: bus master enable.
pub const PCI_COMMAND_MASTER: u16 = 1 << 2;
/// Status: capability list present.
pub const PCI_STATUS_CAP_LIST: u16 = 1 << 4;
/// Vendor-specific capability id (virtio).
pub const PCI_CAP_ID_VNDR: u8 = 0x09;
/// MSI-X capability id.
pub const PCI_CAP_ID_MSIX: u8 = 0x11;
/// MSI-X message control: enable.
pub const PCI_MSIX_FLAGS_ENABLE: u16 = 1 << 15;
/// MSI-X message control: function mask.
pub const PCI_MSIX_FLAGS_MASKALL: u16 = 1 << 14;

/// virtio vendor id.
pub const VIRTIO_PCI_VENDOR: u16 = 0x1af4;
/// virtio-fs modern device id (0x1040 + 26).
pub const VIRTIO_FS_DEVICE_ID: u16 = 0x105a;

/// virtio_pci_cap cfg_type: common configuration.
pub const VIRTIO_PCI_CAP_COMMON_CFG: u8 = 1;
/// cfg_type: notifications.
pub const VIRTIO_PCI_CAP_NOTIFY_CFG: u8 = 2;
/// cfg_type: ISR status.
pub const VIRTIO_PCI_CAP_ISR_CFG: u8 = 3;
/// cfg_type: device-specific configuration.
pub const VIRTIO_PCI_CAP_DEVICE_CFG: u8 = 4;
/// cfg_type: PCI configuration access.
pub const VIRTIO_PCI_CAP_PCI_CFG: u8 = 5;

/// Errors while reading or interpreting config space.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// A vfio-user access failed.
    #[error("config space access failed")]
    Client(#[from] ClientError),
    /// The device violates PCI or virtio-pci rules.
    #[error("bad PCI configuration: {0}")]
    Bad(String),
}

fn bad(s: impl Into<String>) -> PciError {
    PciError::Bad(s.into())
}

/// Reads `size` (1, 2 or 4) bytes of config space.
pub fn cfg_read(c: &mut Client, off: u64, size: usize) -> Result<u32, PciError> {
    Ok(c.read_le(CONFIG_REGION, off, size)? as u32)
}

/// Writes `size` (1, 2 or 4) bytes of config space (never posted, as QEMU does for config).
pub fn cfg_write(c: &mut Client, off: u64, size: usize, v: u32) -> Result<(), PciError> {
    Ok(c.write_le(CONFIG_REGION, off, size, u64::from(v), false)?)
}

/// One entry of the capability list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciCap {
    /// Capability id.
    pub id: u8,
    /// Offset in config space.
    pub offset: u8,
}

/// Walks the capability list (status bit 4, pointer at 0x34).
pub fn walk_caps(c: &mut Client) -> Result<Vec<PciCap>, PciError> {
    let status = cfg_read(c, PCI_STATUS, 2)? as u16;
    if status & PCI_STATUS_CAP_LIST == 0 {
        return Err(bad("status register has no capability list bit"));
    }
    let mut ptr = (cfg_read(c, PCI_CAPABILITY_LIST, 1)? as u8) & 0xfc;
    let mut caps = Vec::new();
    // At most 48 capabilities fit in 256 bytes after the header; more means a loop.
    while ptr != 0 {
        if ptr < 0x40 {
            return Err(bad(format!("capability pointer {ptr:#x} inside the header")));
        }
        if caps.len() >= 48 {
            return Err(bad("capability list loops"));
        }
        let hdr = cfg_read(c, u64::from(ptr), 2)? as u16;
        caps.push(PciCap { id: hdr as u8, offset: ptr });
        ptr = ((hdr >> 8) as u8) & 0xfc;
    }
    Ok(caps)
}

/// A decoded `virtio_pci_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtioCap {
    /// Offset of the capability in config space.
    pub cap_offset: u8,
    /// cap_len.
    pub cap_len: u8,
    /// cfg_type.
    pub cfg_type: u8,
    /// BAR number.
    pub bar: u8,
    /// id (for multiple caps of a type).
    pub id: u8,
    /// Offset within the BAR.
    pub offset: u32,
    /// Length of the structure.
    pub length: u32,
    /// For the notify cap: notify_off_multiplier.
    pub notify_off_multiplier: u32,
}

/// Reads the virtio vendor capability at `off`, as Linux's `virtio_pci_find_capability` does
/// (byte reads of type and bar, dword reads of offset and length).
pub fn read_virtio_cap(c: &mut Client, off: u8) -> Result<VirtioCap, PciError> {
    let o = u64::from(off);
    let cap_len = cfg_read(c, o + 2, 1)? as u8;
    let cfg_type = cfg_read(c, o + 3, 1)? as u8;
    let bar = cfg_read(c, o + 4, 1)? as u8;
    let id = cfg_read(c, o + 5, 1)? as u8;
    if cap_len < 16 {
        return Err(bad(format!("virtio cap at {off:#x}: cap_len {cap_len} < 16")));
    }
    if u64::from(off) + u64::from(cap_len) > 256 {
        return Err(bad(format!("virtio cap at {off:#x}: cap_len {cap_len} runs past 256")));
    }
    let offset = cfg_read(c, o + 8, 4)?;
    let length = cfg_read(c, o + 12, 4)?;
    let mut notify_off_multiplier = 0;
    if cfg_type == VIRTIO_PCI_CAP_NOTIFY_CFG {
        if cap_len < 20 {
            return Err(bad(format!("notify cap at {off:#x}: cap_len {cap_len} < 20")));
        }
        notify_off_multiplier = cfg_read(c, o + 16, 4)?;
    }
    Ok(VirtioCap { cap_offset: off, cap_len, cfg_type, bar, id, offset, length, notify_off_multiplier })
}

/// The MSI-X capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixCap {
    /// Offset of the capability in config space.
    pub cap_offset: u8,
    /// Message control register value.
    pub control: u16,
    /// Number of table entries.
    pub table_size: u16,
    /// BAR of the table.
    pub table_bar: u8,
    /// Offset of the table in its BAR.
    pub table_offset: u32,
    /// BAR of the PBA.
    pub pba_bar: u8,
    /// Offset of the PBA in its BAR.
    pub pba_offset: u32,
}

/// Reads the MSI-X capability at `off`.
pub fn read_msix_cap(c: &mut Client, off: u8) -> Result<MsixCap, PciError> {
    let o = u64::from(off);
    let control = cfg_read(c, o + 2, 2)? as u16;
    let table = cfg_read(c, o + 4, 4)?;
    let pba = cfg_read(c, o + 8, 4)?;
    Ok(MsixCap {
        cap_offset: off,
        control,
        table_size: (control & 0x7ff) + 1,
        table_bar: (table & 7) as u8,
        table_offset: table & !7,
        pba_bar: (pba & 7) as u8,
        pba_offset: pba & !7,
    })
}

/// A BAR as decoded from config space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bar {
    /// BAR number (0-5).
    pub index: u8,
    /// I/O space BAR (bit 0).
    pub io: bool,
    /// 64-bit memory BAR (occupies index and index + 1).
    pub is_64: bool,
    /// Prefetchable.
    pub prefetchable: bool,
    /// Size from the all-ones sizing sequence (0 if the device does not implement it).
    pub sized: u64,
}

/// Reads BAR type bits and, if `size_them`, sizes each BAR by writing all ones and restoring the
/// original value (as the Linux PCI core does, with memory decode disabled meanwhile). Returns
/// the BARs that are implemented (non-zero type or size).
pub fn read_bars(c: &mut Client, size_them: bool) -> Result<Vec<Bar>, PciError> {
    let cmd = cfg_read(c, PCI_COMMAND, 2)? as u16;
    if size_them && cmd & PCI_COMMAND_MEMORY != 0 {
        cfg_write(c, PCI_COMMAND, 2, u32::from(cmd & !PCI_COMMAND_MEMORY))?;
    }
    let mut bars = Vec::new();
    let mut i = 0u8;
    while i < 6 {
        let reg = PCI_BASE_ADDRESS_0 + 4 * u64::from(i);
        let orig = cfg_read(c, reg, 4)?;
        let io = orig & 1 != 0;
        let is_64 = !io && (orig >> 1) & 3 == 2;
        if is_64 && i == 5 {
            return Err(bad("BAR 5 claims to be 64-bit"));
        }
        let prefetchable = !io && orig & 8 != 0;
        let mut sized = 0u64;
        if size_them {
            cfg_write(c, reg, 4, 0xffff_ffff)?;
            let lo = cfg_read(c, reg, 4)?;
            cfg_write(c, reg, 4, orig)?;
            let mut mask = if io {
                u64::from(lo & !3) | 0xffff_ffff_0000_0000
            } else {
                u64::from(lo & !0xf) | 0xffff_ffff_0000_0000
            };
            if is_64 {
                let reg_hi = reg + 4;
                let orig_hi = cfg_read(c, reg_hi, 4)?;
                cfg_write(c, reg_hi, 4, 0xffff_ffff)?;
                let hi = cfg_read(c, reg_hi, 4)?;
                cfg_write(c, reg_hi, 4, orig_hi)?;
                mask = (u64::from(hi) << 32) | (mask & 0xffff_ffff);
            }
            if mask & 0xffff_ffff != 0 || (is_64 && mask != 0) {
                sized = (!mask).wrapping_add(1);
                if !is_64 {
                    sized &= 0xffff_ffff;
                }
            }
        }
        if orig != 0 || sized != 0 {
            bars.push(Bar { index: i, io, is_64, prefetchable, sized });
        }
        i += if is_64 { 2 } else { 1 };
    }
    if size_them && cmd & PCI_COMMAND_MEMORY != 0 {
        cfg_write(c, PCI_COMMAND, 2, u32::from(cmd))?;
    }
    Ok(bars)
}

#[cfg(test)]
mod tests {
    #[test]
    fn size_mask_math() {
        // 16 KiB 64-bit BAR: lo reads 0xffffc00c, hi 0xffffffff.
        let lo: u32 = 0xffff_c00c;
        let hi: u32 = 0xffff_ffff;
        let mask = (u64::from(hi) << 32) | u64::from(lo & !0xf);
        assert_eq!((!mask).wrapping_add(1), 0x4000);
    }
}
