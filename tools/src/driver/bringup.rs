//! Bring-up and teardown: [`FsDriver::connect`] takes the device from a socket to DRIVER_OK as
//! QEMU's `vfio-user-pci` and Linux's `virtio_pci_modern` + `virtio_fs` would (the order is in
//! the driver module's doc); [`FsDriver::shutdown`] undoes it like a guest shutdown.

use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::Path;

use vfio_bindings::bindings::vfio::{
    VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_PCI_REQ_IRQ_INDEX,
    VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::error::{device, DriverError, Result};
use super::options::DriverOptions;
use super::state::{DeviceFacts, DriverStats, FsDriver, QueueState};
use crate::memory::GuestRam;
use crate::pci;
use crate::vfio_user::{
    Client, ClientCaps, DeviceInfo, IrqInfo, Region, DMA_MAP_FLAG_READ, DMA_MAP_FLAG_WRITE,
    DMA_UNMAP_FLAG_ALL,
};
use crate::virtio::{self, features, CapLocation, Layout, Transport};
use crate::virtqueue::{RingLayout, Virtqueue};

/// Size of `struct virtio_fs_config` the driver reads (`tag[36]` + `num_request_queues`).
pub const VIRTIO_FS_CONFIG_LEN: u64 = 40;

fn find_virtio_caps(c: &mut Client, region_sizes: &[u64]) -> Result<(Layout, Vec<pci::VirtioCap>)> {
    let caps = pci::walk_caps(c)?;
    let mut all = Vec::new();
    let mut msix = None;
    for cap in &caps {
        match cap.id {
            pci::PCI_CAP_ID_VNDR => all.push(pci::read_virtio_cap(c, cap.offset)?),
            pci::PCI_CAP_ID_MSIX => {
                if msix.is_some() {
                    return Err(device("two MSI-X capabilities"));
                }
                msix = Some(pci::read_msix_cap(c, cap.offset)?);
            }
            _ => {}
        }
    }
    // Linux takes the first capability of each type whose BAR is valid.
    let pick = |t: u8| -> Option<pci::VirtioCap> {
        all.iter()
            .find(|v| {
                v.cfg_type == t && v.bar < 6 && region_sizes.get(usize::from(v.bar)).copied().unwrap_or(0) > 0
            })
            .copied()
    };
    let check = |v: &pci::VirtioCap, what: &str, min: u64| -> Result<CapLocation> {
        let loc = CapLocation::from(v);
        let bar_size = region_sizes[usize::from(v.bar)];
        if loc.offset.checked_add(loc.length).is_none_or(|e| e > bar_size) {
            return Err(device(format!(
                "{what} structure {:#x}+{:#x} outside BAR {} ({bar_size:#x} bytes)",
                loc.offset, loc.length, v.bar
            )));
        }
        if loc.length < min {
            return Err(device(format!("{what} structure is {} bytes, need {min}", loc.length)));
        }
        Ok(loc)
    };
    let common = pick(pci::VIRTIO_PCI_CAP_COMMON_CFG).ok_or_else(|| device("no common cfg cap"))?;
    let notify = pick(pci::VIRTIO_PCI_CAP_NOTIFY_CFG).ok_or_else(|| device("no notify cap"))?;
    let devcfg = pick(pci::VIRTIO_PCI_CAP_DEVICE_CFG).ok_or_else(|| device("no device cfg cap"))?;
    let isr = pick(pci::VIRTIO_PCI_CAP_ISR_CFG);
    let layout = Layout {
        common: check(&common, "common cfg", u64::from(virtio::COMMON_CFG_MIN_LEN))?,
        notify: check(&notify, "notify", 2)?,
        notify_off_multiplier: notify.notify_off_multiplier,
        isr: isr.map(|i| check(&i, "ISR", 1)).transpose()?,
        device: check(&devcfg, "device cfg", VIRTIO_FS_CONFIG_LEN)?,
        msix,
    };
    if let Some(m) = msix {
        for (bar, off, len, what) in [
            (m.table_bar, m.table_offset, u64::from(m.table_size) * 16, "table"),
            (m.pba_bar, m.pba_offset, u64::from(m.table_size).div_ceil(64) * 8, "PBA"),
        ] {
            let size = region_sizes.get(usize::from(bar)).copied().unwrap_or(0);
            if u64::from(off) + len > size {
                return Err(device(format!(
                    "MSI-X {what} {off:#x}+{len:#x} outside BAR {bar} ({size:#x} bytes)"
                )));
            }
        }
    }
    Ok((layout, all))
}

fn proc_ids() -> (u32, u32, u32) {
    match std::fs::metadata("/proc/self") {
        Ok(m) => (m.uid(), m.gid(), std::process::id()),
        Err(_) => (0, 0, std::process::id()),
    }
}

impl FsDriver {
    /// Connects to the device at `socket` and brings it up to DRIVER_OK (no FUSE yet).
    pub fn connect(socket: &Path, opts: DriverOptions) -> Result<FsDriver> {
        let mut client = Client::connect(socket)?;
        client.set_timeout(opts.timeout)?;
        let version = client.version(&ClientCaps::default())?;

        // Device and region information, as QEMU's vfio_populate_device reads it.
        let Probed { info, regions, region_sizes, msix_info } = probe(&mut client)?;

        // Guest RAM.
        let mem = GuestRam::new(opts.mem_size, opts.iova_base)?;
        client.dma_map(
            DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE,
            0,
            mem.iova_base(),
            mem.size(),
            Some(mem.fd()),
        )?;
        if opts.reset_on_connect && info.flags & VFIO_DEVICE_FLAGS_RESET != 0 {
            client.device_reset()?;
        }

        let (bars, layout, msix) = check_pci(&mut client, &opts, &region_sizes)?;

        let mut transport = Transport::new(client, layout, opts.posted_writes);
        let mut notify_mapped = false;
        if opts.mmap_notify {
            if let Some(r) = regions[usize::from(layout.notify.bar)].as_ref() {
                notify_mapped = transport.map_notify(r)?;
            }
        }

        let (device_features, driver_features) = negotiate(&mut transport, &opts)?;

        // Device config (virtio_fs_read_tag, virtio_fs_setup_vqs).
        let (tag, num_request_queues) = read_fs_config(&mut transport)?;
        if num_request_queues == 0 {
            return Err(device("num_request_queues is 0"));
        }
        let num_queues = transport.num_queues()?;
        let nreq = u32::from(opts.request_queues.max(1)).min(num_request_queues) as u16;
        let nvqs = 1 + nreq;
        if u32::from(num_queues) < 1 + num_request_queues {
            return Err(device(format!(
                "num_queues {num_queues} < 1 + num_request_queues {num_request_queues}"
            )));
        }

        let Interrupts { per_vq_vectors, epoll, eventfds, req_count, req_eventfd } =
            setup_interrupts(&mut transport, &opts, &info, msix, &msix_info, nvqs)?;
        let (ring, queues) =
            setup_queues(&mut transport, &mem, &opts, driver_features, nvqs, per_vq_vectors)?;
        transport.add_status(virtio::STATUS_DRIVER_OK)?;
        let st = transport.status()?;
        if st & virtio::STATUS_NEEDS_RESET != 0 || st & virtio::STATUS_DRIVER_OK == 0 {
            return Err(device(format!("status {st:#x} after DRIVER_OK")));
        }

        let (uid, gid, pid) = proc_ids();
        let facts = DeviceFacts {
            version,
            info,
            region_sizes,
            bars,
            layout,
            device_features,
            driver_features,
            num_queues,
            tag,
            num_request_queues,
            msix_count: msix_info.count,
            req_count,
            per_vq_vectors,
            notify_mapped,
            ring,
        };
        let mut d = FsDriver {
            transport,
            mem,
            opts,
            facts,
            queues,
            eventfds,
            req_eventfd,
            epoll,
            pending: HashMap::new(),
            ready: VecDeque::new(),
            next_unique: 0,
            next_rr: 0,
            current_queue: 1,
            uid,
            gid,
            pid,
            init: None,
            stats: DriverStats::default(),
            completed_per_queue: vec![0; usize::from(nvqs)],
        };
        for i in 0..d.queues.len() {
            let q = &mut d.queues[i].vq;
            if d.opts.use_interrupts {
                q.enable_interrupts(&d.mem)?;
            } else {
                q.disable_interrupts(&d.mem)?;
            }
        }
        Ok(d)
    }

    /// Whether the device asked to be let go (its device-request interrupt fired) since the
    /// last call; always false without a device-request eventfd.
    pub fn removal_requested(&self) -> bool {
        self.req_eventfd.as_ref().is_some_and(|e| e.read().is_ok_and(|n| n > 0))
    }

    /// Waits up to `timeout` for the device-request interrupt.
    pub fn wait_removal_request(&self, timeout: std::time::Duration) -> Result<bool> {
        let Some(e) = &self.req_eventfd else { return Ok(false) };
        let epoll = Epoll::new()?;
        epoll.ctl(ControlOperation::Add, e.as_raw_fd(), EpollEvent::new(EventSet::IN, 0))?;
        let mut events = [EpollEvent::default()];
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        epoll.wait(ms, &mut events)?;
        Ok(self.removal_requested())
    }

    /// Lets the device go as a guest unplugging it and QEMU dropping it would: the driver's
    /// remove (virtio reset), then QEMU's unrealize (MSI-X and device-request eventfds cleared,
    /// the latter as a vfio-user client sends vfio's fd -1: DATA_EVENTFD, count 1, no
    /// descriptor), all DMA unmapped, and the connection closed.
    pub fn let_go(mut self) -> Result<()> {
        let timeout = self.opts.timeout;
        self.transport.reset(timeout)?;
        let c = self.transport.client();
        c.set_irqs(
            VFIO_PCI_MSIX_IRQ_INDEX,
            VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            0,
            &[],
            &[],
        )?;
        if self.req_eventfd.take().is_some() {
            c.set_irqs(
                VFIO_PCI_REQ_IRQ_INDEX,
                VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                0,
                1,
                &[],
                &[],
            )?;
        }
        c.dma_unmap(DMA_UNMAP_FLAG_ALL, 0, 0)?;
        Ok(())
    }

    /// Tears down like a guest shutdown: virtio reset, disable MSI-X eventfds, unmap all DMA.
    pub fn shutdown(mut self) -> Result<()> {
        let timeout = self.opts.timeout;
        self.transport.reset(timeout)?;
        self.transport.client().set_irqs(
            VFIO_PCI_MSIX_IRQ_INDEX,
            VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            0,
            &[],
            &[],
        )?;
        self.transport.client().dma_unmap(DMA_UNMAP_FLAG_ALL, 0, 0)?;
        Ok(())
    }
}

/// Reads tag and num_request_queues as Linux does: the tag byte by byte inside a
/// config_generation loop, then a 32-bit read.
fn read_fs_config(t: &mut Transport) -> Result<(String, u32)> {
    let mut tag = [0u8; 36];
    let mut tries = 0;
    loop {
        let g0 = t.config_generation()?;
        for (i, b) in tag.iter_mut().enumerate() {
            *b = t.device_read(i as u64, 1)? as u8;
        }
        let g1 = t.config_generation()?;
        if g0 == g1 {
            break;
        }
        tries += 1;
        if tries > 100 {
            return Err(device("config_generation never settles"));
        }
    }
    let n = t.device_read(36, 4)? as u32;
    let end = tag.iter().position(|&b| b == 0).unwrap_or(36);
    if end == 0 {
        return Err(device("empty tag"));
    }
    let s = std::str::from_utf8(&tag[..end])
        .map_err(|_| device(format!("tag {:?} is not UTF-8", &tag[..end])))?;
    Ok((s.to_string(), n))
}

/// What the device says of itself before any register is touched: its information, its regions
/// (the first nine), and its MSI-X interrupt information, each checked as QEMU's
/// `vfio_populate_device` would.
struct Probed {
    info: DeviceInfo,
    regions: Vec<Option<Region>>,
    region_sizes: Vec<u64>,
    msix_info: IrqInfo,
}

fn probe(client: &mut Client) -> Result<Probed> {
    // Device and region information, as QEMU's vfio_populate_device reads it.
    let info = client.device_info()?;
    if info.flags & VFIO_DEVICE_FLAGS_PCI == 0 {
        return Err(device(format!("DEVICE_GET_INFO flags {:#x} lack PCI", info.flags)));
    }
    if info.num_regions < pci::CONFIG_REGION + 1 || info.num_regions > 100 {
        return Err(device(format!("{} regions", info.num_regions)));
    }
    if info.num_irqs < VFIO_PCI_MSIX_IRQ_INDEX + 1 || info.num_irqs > 50 {
        return Err(device(format!("{} irq types", info.num_irqs)));
    }
    let mut regions: Vec<Option<Region>> = Vec::new();
    let mut region_sizes = Vec::new();
    for i in 0..info.num_regions.min(9) {
        let r = client.region_info(i)?;
        region_sizes.push(r.info.size);
        regions.push(Some(r));
    }
    let cfg = regions[pci::CONFIG_REGION as usize].as_ref().expect("read above");
    let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
    if cfg.info.flags & rw != rw || cfg.info.size < 256 {
        return Err(device(format!("config region flags {:#x} size {:#x}", cfg.info.flags, cfg.info.size)));
    }
    let msix_info = client.irq_info(VFIO_PCI_MSIX_IRQ_INDEX)?;
    if msix_info.flags & VFIO_IRQ_INFO_EVENTFD == 0 {
        return Err(device("MSI-X irq info lacks the EVENTFD flag"));
    }
    Ok(Probed { info, regions, region_sizes, msix_info })
}

/// Checks the PCI identity, the BARs against the regions and the virtio capabilities, and
/// enables memory decoding and bus mastering; returns the BARs, the virtio layout and the MSI-X
/// capability.
fn check_pci(
    client: &mut Client,
    opts: &DriverOptions,
    region_sizes: &[u64],
) -> Result<(Vec<pci::Bar>, Layout, pci::MsixCap)> {
    // PCI config space.
    let vendor = pci::cfg_read(client, pci::PCI_VENDOR_ID, 2)? as u16;
    let devid = pci::cfg_read(client, pci::PCI_DEVICE_ID, 2)? as u16;
    if vendor != pci::VIRTIO_PCI_VENDOR || devid != pci::VIRTIO_FS_DEVICE_ID {
        return Err(device(format!("PCI id {vendor:04x}:{devid:04x}, expected 1af4:105a")));
    }
    let bars = pci::read_bars(client, opts.check_bar_sizing)?;
    for b in &bars {
        let rsize = region_sizes.get(usize::from(b.index)).copied().unwrap_or(0);
        if b.io {
            return Err(device(format!("BAR {} is an I/O BAR", b.index)));
        }
        if opts.check_bar_sizing && b.sized != rsize {
            return Err(device(format!(
                "BAR {} sizes to {:#x} through config space but the region is {rsize:#x} bytes",
                b.index, b.sized
            )));
        }
        if rsize != 0 && !rsize.is_power_of_two() {
            return Err(device(format!("BAR {} size {rsize:#x} is not a power of two", b.index)));
        }
    }
    for (i, s) in region_sizes.iter().enumerate().take(6) {
        if *s != 0 && !bars.iter().any(|b| usize::from(b.index) == i) {
            return Err(device(format!("region {i} has {s:#x} bytes but config space shows no BAR {i}")));
        }
    }
    let (layout, _caps) = find_virtio_caps(client, region_sizes)?;
    let Some(msix) = layout.msix else {
        return Err(DriverError::Unsupported("device has no MSI-X capability".into()));
    };
    let cmd = pci::cfg_read(client, pci::PCI_COMMAND, 2)?;
    pci::cfg_write(
        client,
        pci::PCI_COMMAND,
        2,
        cmd | u32::from(pci::PCI_COMMAND_MEMORY | pci::PCI_COMMAND_MASTER),
    )?;
    Ok((bars, layout, msix))
}

/// virtio bring-up up to FEATURES_OK (`virtio_dev_probe`): returns the device's and the
/// driver's features.
fn negotiate(transport: &mut Transport, opts: &DriverOptions) -> Result<(u64, u64)> {
    // virtio bring-up (virtio_dev_probe).
    transport.reset(opts.timeout)?;
    transport.add_status(virtio::STATUS_ACKNOWLEDGE)?;
    transport.add_status(virtio::STATUS_DRIVER)?;
    let device_features = transport.device_features()?;
    if device_features & features::VERSION_1 == 0 {
        return Err(device("device does not offer VIRTIO_F_VERSION_1"));
    }
    let mut want =
        features::VERSION_1 | features::ACCESS_PLATFORM | features::ORDER_PLATFORM | features::RING_RESET;
    if opts.event_idx {
        want |= features::EVENT_IDX;
    }
    if opts.indirect_desc {
        want |= features::INDIRECT_DESC;
    }
    if opts.ring == RingLayout::Packed {
        if device_features & features::RING_PACKED == 0 {
            return Err(DriverError::FeatureNotOffered {
                name: "VIRTIO_F_RING_PACKED",
                bit: features::RING_PACKED.trailing_zeros(),
            });
        }
        want |= features::RING_PACKED;
    }
    let driver_features = device_features & want;
    transport.set_driver_features(driver_features)?;
    transport.add_status(virtio::STATUS_FEATURES_OK)?;
    let st = transport.status()?;
    if st & virtio::STATUS_FEATURES_OK == 0 {
        return Err(device(format!(
            "device cleared FEATURES_OK (status {st:#x}) for features {driver_features:#x}"
        )));
    }
    Ok((device_features, driver_features))
}

/// The interrupts a bring-up set: one eventfd per MSI-X vector (in `epoll`), and the
/// device-request eventfd if the device offers one.
struct Interrupts {
    per_vq_vectors: bool,
    epoll: Epoll,
    eventfds: Vec<EventFd>,
    req_count: u32,
    req_eventfd: Option<EventFd>,
}

fn setup_interrupts(
    transport: &mut Transport,
    opts: &DriverOptions,
    info: &DeviceInfo,
    msix: pci::MsixCap,
    msix_info: &IrqInfo,
    nvqs: u16,
) -> Result<Interrupts> {
    // MSI-X: one vector for config plus one per queue, else a shared one (Linux fallback).
    let table = u32::from(msix.table_size).min(msix_info.count);
    let per_vq_vectors = table > u32::from(nvqs);
    let nvec: u16 = if per_vq_vectors { nvqs + 1 } else { 2 };
    if table < 2 {
        return Err(DriverError::Unsupported(format!("only {table} MSI-X vectors")));
    }
    let ctrl_off = u64::from(msix.cap_offset) + 2;
    let ctrl = pci::cfg_read(transport.client(), ctrl_off, 2)? as u16;
    pci::cfg_write(
        transport.client(),
        ctrl_off,
        2,
        u32::from(ctrl | pci::PCI_MSIX_FLAGS_ENABLE | pci::PCI_MSIX_FLAGS_MASKALL),
    )?;
    let epoll = Epoll::new()?;
    let mut eventfds = Vec::new();
    for v in 0..nvec {
        let e = EventFd::new(EFD_NONBLOCK)?;
        epoll.ctl(ControlOperation::Add, e.as_raw_fd(), EpollEvent::new(EventSet::IN, u64::from(v)))?;
        eventfds.push(e);
    }
    let fds: Vec<RawFd> = eventfds.iter().map(|e| e.as_raw_fd()).collect();
    transport.client().set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        0,
        u32::from(nvec),
        &fds,
        &[],
    )?;
    pci::cfg_write(
        transport.client(),
        ctrl_off,
        2,
        u32::from((ctrl | pci::PCI_MSIX_FLAGS_ENABLE) & !pci::PCI_MSIX_FLAGS_MASKALL),
    )?;
    // The device-request interrupt, as QEMU's vfio_pci_register_req_notifier sets it up:
    // asked for after the MSI-X vectors, used only if the device offers at least one.
    let mut req_count = 0;
    let mut req_eventfd = None;
    if opts.request_irq && info.num_irqs > VFIO_PCI_REQ_IRQ_INDEX {
        let req = transport.client().irq_info(VFIO_PCI_REQ_IRQ_INDEX)?;
        req_count = req.count;
        if req.count >= 1 && req.flags & VFIO_IRQ_INFO_EVENTFD != 0 {
            let e = EventFd::new(EFD_NONBLOCK)?;
            transport.client().set_irqs(
                VFIO_PCI_REQ_IRQ_INDEX,
                VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                0,
                1,
                &[e.as_raw_fd()],
                &[],
            )?;
            req_eventfd = Some(e);
        }
    }
    let cv = transport.set_config_vector(0)?;
    if cv != 0 {
        return Err(device(format!("config_msix_vector reads back {cv:#x} after writing 0")));
    }
    Ok(Interrupts { per_vq_vectors, epoll, eventfds, req_count, req_eventfd })
}

/// Sets up `nvqs` queues in `mem` (`vp_modern` `setup_vq`) and enables them together; returns
/// the ring layout and the queues.
fn setup_queues(
    transport: &mut Transport,
    mem: &GuestRam,
    opts: &DriverOptions,
    driver_features: u64,
    nvqs: u16,
    per_vq_vectors: bool,
) -> Result<(RingLayout, Vec<QueueState>)> {
    // Queues (vp_modern setup_vq), enabled together at the end.
    let event_idx = driver_features & features::EVENT_IDX != 0;
    let indirect = driver_features & features::INDIRECT_DESC != 0;
    let ring =
        if driver_features & features::RING_PACKED != 0 { RingLayout::Packed } else { RingLayout::Split };
    let mut queues = Vec::new();
    for q in 0..nvqs {
        let max = transport.queue_size(q)?;
        if max == 0 {
            return Err(device(format!("queue {q} has size 0")));
        }
        if transport.queue_enabled(q)? {
            return Err(device(format!("queue {q} is enabled before setup")));
        }
        let mut size = opts.queue_size.min(max);
        if !size.is_power_of_two() {
            size = 1 << (15 - size.leading_zeros());
        }
        let vq = Virtqueue::new(ring, mem, q, size, event_idx, indirect)?;
        transport.set_queue_size(q, size)?;
        let (desc, driver, device_area) = vq.addrs();
        transport.set_queue_addrs(q, desc, driver, device_area)?;
        let vector = if per_vq_vectors { q + 1 } else { 1 };
        let rb = transport.set_queue_vector(q, vector)?;
        if rb != vector {
            return Err(device(format!(
                "queue {q}: queue_msix_vector reads back {rb:#x} after writing {vector}"
            )));
        }
        let noff = transport.queue_notify_off(q)?;
        let notify_addr = transport.notify_offset(noff)?;
        queues.push(QueueState { vq, notify_addr, vector });
    }
    for q in 0..nvqs {
        transport.enable_queue(q)?;
    }
    for q in 0..nvqs {
        if !transport.queue_enabled(q)? {
            return Err(device(format!("queue {q}: queue_enable reads 0 after enabling")));
        }
        let got = transport.queue_addrs(q)?;
        let vq = &queues[usize::from(q)].vq;
        if got != vq.addrs() {
            return Err(device(format!("queue {q}: ring addresses read back as {got:x?}")));
        }
    }
    Ok((ring, queues))
}
