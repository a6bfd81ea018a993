//! One handler per vfio-user command: each checks its payload (and the descriptors it came
//! with) and maps it onto a call of the device's control-plane state
//! ([`crate::control::DeviceState`]), answering a reply payload or an errno. The framing and the
//! connection are [`super::server`]'s.

use std::fs::File;

use log::{debug, warn};
use vfio_bindings::bindings::vfio as vb;
use vm_memory::ByteValued;

use super::wire;
use crate::control::{ControlError, DeviceState};
use crate::pci;

/// Largest REGION_READ/WRITE count we accept and announce (`max_data_xfer_size`).
pub const MAX_DATA_XFER: usize = 1 << 20;
/// Largest VERSION JSON we parse.
const MAX_VERSION_JSON: usize = 4096;

/// A command's reply: its payload and the descriptors it carries.
pub(super) type Reply = (Vec<u8>, Vec<File>);

/// Result of a command handler: reply payload (and fds), or an errno.
pub(super) type CmdResult = Result<Reply, i32>;

/// The empty reply.
pub(super) fn ok_empty() -> CmdResult {
    Ok((Vec::new(), Vec::new()))
}

pub(super) fn version(payload: &[u8], max_dma_maps: usize) -> CmdResult {
    let v = wire::read_obj::<wire::Version>(payload).ok_or(libc::EINVAL)?;
    if v.major != 0 {
        warn!("client wants protocol {}.{}; we speak 0.x", v.major, v.minor);
        return Err(libc::ENOTSUP);
    }
    let json = &payload[4..];
    let mut proposed: Vec<&str> = Vec::new();
    if json.len() > MAX_VERSION_JSON {
        return Err(libc::E2BIG);
    }
    if !json.is_empty() {
        let text = json.strip_suffix(&[0]).ok_or(libc::EINVAL)?;
        let value: serde_json::Value = serde_json::from_slice(text).map_err(|e| {
            warn!("malformed VERSION JSON: {e}");
            libc::EINVAL
        })?;
        let obj = value.as_object().ok_or(libc::EINVAL)?;
        if let Some(caps) = obj.get("capabilities") {
            let caps = caps.as_object().ok_or(libc::EINVAL)?;
            for key in ["max_msg_fds", "max_data_xfer_size", "pgsizes", "max_dma_maps"] {
                match caps.get(key) {
                    Some(v) if !v.is_u64() => {
                        warn!("VERSION capability {key} is not a number");
                        return Err(libc::EINVAL);
                    }
                    Some(_) => proposed.push(key),
                    None => {}
                }
            }
            if caps.get("pgsizes").and_then(|v| v.as_u64()).is_some_and(|p| p & 4096 == 0) {
                warn!("client does not support 4 KiB pages");
                return Err(libc::EINVAL);
            }
        }
    }
    // The reply's capabilities are a subset of the proposal: ours, for the keys the client named.
    let ours = [
        ("max_msg_fds", wire::MAX_MSG_FDS as u64),
        ("max_data_xfer_size", MAX_DATA_XFER as u64),
        ("pgsizes", 4096),
        ("max_dma_maps", max_dma_maps as u64),
    ];
    let reply_caps: serde_json::Map<String, serde_json::Value> = ours
        .iter()
        .filter(|(k, _)| proposed.contains(k))
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    let caps = serde_json::json!({ "capabilities": reply_caps });
    let mut out = wire::Version { major: 0, minor: v.minor.min(1) }.as_slice().to_vec();
    out.extend_from_slice(caps.to_string().as_bytes());
    out.push(0);
    Ok((out, Vec::new()))
}

pub(super) fn device_info(payload: &[u8]) -> CmdResult {
    let req = wire::read_obj::<wire::DeviceInfo>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 16 || (req.argsz as usize) < 16 {
        return Err(libc::EINVAL);
    }
    let info = wire::DeviceInfo {
        argsz: 16,
        flags: vb::VFIO_DEVICE_FLAGS_RESET | vb::VFIO_DEVICE_FLAGS_PCI,
        num_regions: vb::VFIO_PCI_NUM_REGIONS,
        num_irqs: vb::VFIO_PCI_NUM_IRQS,
    };
    Ok((info.as_slice().to_vec(), Vec::new()))
}

fn refused(what: &str, e: impl Into<ControlError>) -> i32 {
    let e = e.into();
    warn!("{what}: {e}");
    e.errno()
}

pub(super) fn dma_map(dev: &mut DeviceState, payload: &[u8], mut fds: Vec<File>) -> CmdResult {
    let m = wire::read_obj::<wire::DmaMap>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 32 || m.argsz != 32 || fds.len() > 1 || m.flags & !3 != 0 {
        return Err(libc::EINVAL);
    }
    dev.dma_map(m.address, m.size, m.offset, fds.pop()).map_err(|e| refused("DMA_MAP", e))?;
    ok_empty()
}

pub(super) fn dma_unmap(dev: &mut DeviceState, payload: &[u8]) -> CmdResult {
    let u = wire::read_obj::<wire::DmaUnmap>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 24 || (u.argsz as usize) < 24 {
        return Err(libc::EINVAL);
    }
    let range = match u.flags {
        0 => Some((u.address, u.size)),
        vb::VFIO_DMA_UNMAP_FLAG_ALL if u.address == 0 && u.size == 0 => None,
        vb::VFIO_DMA_UNMAP_FLAG_GET_DIRTY_BITMAP => return Err(libc::ENOTSUP),
        _ => return Err(libc::EINVAL),
    };
    // Returns only once no poller can still touch the removed windows.
    dev.dma_unmap(range).map_err(|e| refused("DMA_UNMAP", e))?;
    let reply = wire::DmaUnmap { argsz: 24, ..u };
    Ok((reply.as_slice().to_vec(), Vec::new()))
}

pub(super) fn region_info(dev: &DeviceState, payload: &[u8]) -> CmdResult {
    let req = wire::read_obj::<wire::RegionInfo>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 32 || (req.argsz as usize) < 32 || req.index >= vb::VFIO_PCI_NUM_REGIONS {
        return Err(libc::EINVAL);
    }
    let size = dev.region_size(req.index);
    let mut info = wire::RegionInfo { argsz: 32, flags: 0, index: req.index, cap_offset: 0, size, offset: 0 };
    if size > 0 {
        info.flags = vb::VFIO_REGION_INFO_FLAG_READ | vb::VFIO_REGION_INFO_FLAG_WRITE;
    }
    let mut caps = Vec::new();
    let mut fds = Vec::new();
    let notify = if req.index == pci::VIRTIO_BAR {
        dev.notify_memory().map_err(|e| refused("REGION_INFO", e))?
    } else {
        None
    };
    if let Some(notify_mem) = notify {
        // The notify page is mmappable: guest doorbells land in shared memory, never on the socket.
        info.flags |= vb::VFIO_REGION_INFO_FLAG_MMAP | vb::VFIO_REGION_INFO_FLAG_CAPS;
        info.cap_offset = 32;
        let cap = wire::SparseMmapCap {
            id: vb::VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16,
            version: 1,
            next: 0,
            nr_areas: 1,
            reserved: 0,
        };
        let area = wire::SparseArea { offset: pci::NOTIFY_OFFSET, size: pci::NOTIFY_SIZE };
        caps.extend_from_slice(cap.as_slice());
        caps.extend_from_slice(area.as_slice());
        info.argsz = (32 + caps.len()) as u32;
        if req.argsz >= info.argsz {
            fds.push(notify_mem);
        } else {
            // Too small: the client asks again with argsz. cap_offset still says where the
            // caps will be (QEMU rejects CAPS with a cap_offset inside the fixed struct).
            caps.clear();
        }
    }
    let mut out = info.as_slice().to_vec();
    out.extend_from_slice(&caps);
    Ok((out, fds))
}

pub(super) fn irq_info(dev: &DeviceState, payload: &[u8]) -> CmdResult {
    let req = wire::read_obj::<wire::IrqInfo>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 16 || (req.argsz as usize) < 16 || req.index >= vb::VFIO_PCI_NUM_IRQS {
        return Err(libc::EINVAL);
    }
    let (flags, count) = irq_shape(dev, req.index);
    let info = wire::IrqInfo { argsz: 16, flags, index: req.index, count };
    Ok((info.as_slice().to_vec(), Vec::new()))
}

/// Flags and vector count of interrupt index `index`: MSI-X has the device's vectors, the
/// device request (`VFIO_PCI_REQ_IRQ_INDEX`) one interrupt as vfio-pci offers it (not maskable,
/// not resizable), the others (INTx, MSI, error) none.
fn irq_shape(dev: &DeviceState, index: u32) -> (u32, u32) {
    match index {
        vb::VFIO_PCI_MSIX_IRQ_INDEX => {
            (vb::VFIO_IRQ_INFO_EVENTFD | vb::VFIO_IRQ_INFO_MASKABLE, dev.msix_vectors() as u32)
        }
        vb::VFIO_PCI_REQ_IRQ_INDEX => (vb::VFIO_IRQ_INFO_EVENTFD | vb::VFIO_IRQ_INFO_NORESIZE, 1),
        _ => (vb::VFIO_IRQ_INFO_EVENTFD, 0),
    }
}

/// SET_IRQS of the device-request interrupt, as vfio-pci's `vfio_pci_set_req_trigger` takes
/// it: only the TRIGGER action (MASK and UNMASK: ENOTTY, the kernel's answer), `start` 0 and
/// `count` at most 1; count 0 with DATA_NONE clears the eventfd; count 1 with DATA_EVENTFD sets
/// it (one descriptor) or clears it (none: how a vfio-user client sends vfio's fd -1), with
/// DATA_NONE or DATA_BOOL (a nonzero byte) signals it (the loopback test vfio allows).
fn set_req_irq(dev: &mut DeviceState, s: &wire::IrqSet, data: &[u8], mut fds: Vec<File>) -> CmdResult {
    let data_kind = s.flags & vb::VFIO_IRQ_SET_DATA_TYPE_MASK;
    if s.flags & vb::VFIO_IRQ_SET_ACTION_TYPE_MASK != vb::VFIO_IRQ_SET_ACTION_TRIGGER {
        return Err(libc::ENOTTY);
    }
    if s.start != 0 || s.count > 1 {
        return Err(libc::EINVAL);
    }
    match (data_kind, s.count) {
        (vb::VFIO_IRQ_SET_DATA_NONE, 0) if data.is_empty() && fds.is_empty() => {
            dev.set_request_eventfd(None).map_err(|e| refused("SET_IRQS", e))?;
        }
        (vb::VFIO_IRQ_SET_DATA_NONE, 1) if data.is_empty() && fds.is_empty() => {
            dev.request_removal();
        }
        (vb::VFIO_IRQ_SET_DATA_BOOL, 1) if data.len() == 1 && fds.is_empty() => {
            if data[0] != 0 {
                dev.request_removal();
            }
        }
        (vb::VFIO_IRQ_SET_DATA_EVENTFD, 1) if data.is_empty() && fds.len() <= 1 => {
            dev.set_request_eventfd(fds.pop()).map_err(|e| refused("SET_IRQS", e))?;
        }
        _ => return Err(libc::EINVAL),
    }
    ok_empty()
}

pub(super) fn set_irqs(dev: &mut DeviceState, payload: &[u8], fds: Vec<File>) -> CmdResult {
    let s = wire::read_obj::<wire::IrqSet>(payload).ok_or(libc::EINVAL)?;
    // argsz is not checked against the payload: QEMU sends the kernel-style argsz (which counts
    // the eventfd array) while the descriptors travel as SCM_RIGHTS, not in the payload.
    if (s.argsz as usize) < 20 || s.index >= vb::VFIO_PCI_NUM_IRQS {
        return Err(libc::EINVAL);
    }
    let data_kind = s.flags & vb::VFIO_IRQ_SET_DATA_TYPE_MASK;
    let action = s.flags & vb::VFIO_IRQ_SET_ACTION_TYPE_MASK;
    let unknown = s.flags & !(vb::VFIO_IRQ_SET_DATA_TYPE_MASK | vb::VFIO_IRQ_SET_ACTION_TYPE_MASK);
    if unknown != 0 || !data_kind.is_power_of_two() || !action.is_power_of_two() {
        return Err(libc::EINVAL);
    }
    let data = &payload[20..];
    if s.index == vb::VFIO_PCI_REQ_IRQ_INDEX {
        return set_req_irq(dev, &s, data, fds);
    }
    let (_, count) = irq_shape(dev, s.index);
    // count 0 with DATA_NONE + TRIGGER: disable every interrupt of the index.
    if s.count == 0 {
        if data_kind != vb::VFIO_IRQ_SET_DATA_NONE
            || action != vb::VFIO_IRQ_SET_ACTION_TRIGGER
            || s.start != 0
            || !data.is_empty()
            || !fds.is_empty()
        {
            return Err(libc::EINVAL);
        }
        if s.index == vb::VFIO_PCI_MSIX_IRQ_INDEX {
            dev.clear_irq_eventfds();
        }
        return ok_empty();
    }
    // Only MSI-X has vectors past here (the others have count 0), so the index is MSI-X.
    let end = s.start.checked_add(s.count).ok_or(libc::EINVAL)?;
    if end > count {
        return Err(libc::EINVAL);
    }
    let (start, n) = (s.start as usize, s.count as usize);
    let selected: Option<Vec<bool>> = match data_kind {
        vb::VFIO_IRQ_SET_DATA_NONE if data.is_empty() && fds.is_empty() => None,
        vb::VFIO_IRQ_SET_DATA_BOOL if data.len() == n && fds.is_empty() => {
            Some(data.iter().map(|&b| b != 0).collect())
        }
        vb::VFIO_IRQ_SET_DATA_EVENTFD if data.is_empty() => {
            if action != vb::VFIO_IRQ_SET_ACTION_TRIGGER {
                return Err(libc::ENOTSUP); // no mask/unmask notification eventfds
            }
            dev.set_irq_eventfds(start, n, fds).map_err(|e| refused("SET_IRQS", e))?;
            return ok_empty();
        }
        _ => return Err(libc::EINVAL),
    };
    let selected = selected.as_deref();
    let r = match action {
        vb::VFIO_IRQ_SET_ACTION_MASK => dev.mask_vectors(start, n, selected, true),
        vb::VFIO_IRQ_SET_ACTION_UNMASK => dev.mask_vectors(start, n, selected, false),
        _ => dev.trigger_vectors(start, n, selected),
    };
    r.map_err(|e| refused("SET_IRQS", e))?;
    ok_empty()
}

pub(super) fn region_read(dev: &mut DeviceState, payload: &[u8]) -> CmdResult {
    let a = wire::read_obj::<wire::RegionAccess>(payload).ok_or(libc::EINVAL)?;
    if payload.len() != 16 {
        return Err(libc::EINVAL);
    }
    if a.count as usize > MAX_DATA_XFER {
        return Err(libc::E2BIG);
    }
    let mut out = a.as_slice().to_vec();
    let mut data = vec![0u8; a.count as usize];
    dev.region_read(a.region, a.offset, &mut data).map_err(access_refused)?;
    out.extend_from_slice(&data);
    Ok((out, Vec::new()))
}

pub(super) fn region_write(dev: &mut DeviceState, payload: &[u8]) -> CmdResult {
    let a = wire::read_obj::<wire::RegionAccess>(payload).ok_or(libc::EINVAL)?;
    if a.count as usize > MAX_DATA_XFER {
        return Err(libc::E2BIG);
    }
    if payload.len() != 16 + a.count as usize {
        return Err(libc::EINVAL);
    }
    dev.region_write(a.region, a.offset, &payload[16..]).map_err(access_refused)?;
    Ok((a.as_slice()[..16].to_vec(), Vec::new()))
}

fn access_refused(e: pci::AccessError) -> i32 {
    debug!("region access refused: {e}");
    libc::EINVAL
}
