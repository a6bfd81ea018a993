//! `FsDriver`: a userspace virtio-fs driver that brings the device up the way QEMU's
//! `vfio-user-pci` plus Linux's `virtio_fs` would, then sends FUSE requests down its queues.
//!
//! Bring-up, in order: VERSION; DEVICE_GET_INFO; GET_REGION_INFO for the PCI regions;
//! GET_IRQ_INFO (MSI-X); DMA_MAP of the driver's memfd; DEVICE_RESET (if the device says it is
//! resettable); config space: ids, BARs, capability list, virtio caps, MSI-X cap; command register
//! (memory + bus master); mmap of the notify area if offered; virtio reset, ACKNOWLEDGE, DRIVER,
//! feature negotiation, FEATURES_OK (re-read); device config (tag, num_request_queues); MSI-X
//! enable and SET_IRQS with one eventfd per vector; config vector; per-queue setup (size, ring
//! addresses, vector, notify offset); queue_enable for all queues; DRIVER_OK.
//!
//! Requests are laid out like Linux `virtio_fs_enqueue_req`: device-readable `fuse_in_header`,
//! then the in-arguments in one buffer, then data pages; device-writable `fuse_out_header`, the
//! out-arguments, then data pages. FORGET goes to the hiprio queue (0) as one 48-byte buffer.
//!
//! [`FsDriver::run_closed_loop`] keeps N requests outstanding (fio's iodepth) and handles a full
//! virtqueue per [`QueueFullPolicy`], Linux's before and since 6.11; see `driver/closed_loop.rs`.
//!
//! Replies are validated (the out header's `len` equals the used length, `unique` matches, errors
//! are negative errnos with no payload, fixed-size replies have their exact size) so a device bug
//! surfaces as [`DriverError::BadReply`] or [`DriverError::Queue`] instead of silent corruption.

use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use vfio_bindings::bindings::vfio::{
    VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::fuse_abi::{self as abi, opcode, Dirent, DirentPlus, EntryOut, InHeader, OutHeader};
use crate::memory::{DmaBuf, GuestRam, MemoryError};
use crate::pci::{self, Bar, PciError};
use crate::vfio_user::{
    Client, ClientCaps, ClientError, DeviceInfo, Region, VersionInfo, DMA_MAP_FLAG_READ, DMA_MAP_FLAG_WRITE,
    DMA_UNMAP_FLAG_ALL,
};
use crate::virtio::{self, features, CapLocation, Layout, Transport, TransportError};
use crate::virtqueue::{QueueError, Segment, SplitQueue};

mod closed_loop;

pub use closed_loop::{slot_pattern, IoDone, IoSpec, LoopConfig, LoopReport, MAX_IN_ARGS, MAX_OUT_ARGS};

/// Size of `struct virtio_fs_config` the driver reads (`tag[36]` + `num_request_queues`).
pub const VIRTIO_FS_CONFIG_LEN: u64 = 40;
/// Linux's `FUSE_DEFAULT_MAX_PAGES_LIMIT`.
pub const MAX_PAGES_LIMIT: u16 = 256;
/// Page size used for data segments.
pub const PAGE_SIZE: usize = 4096;

/// Options of the driver.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// Bytes of driver "guest RAM" shared with the device.
    pub mem_size: usize,
    /// DMA address of that memory (default 4 GiB, so addresses differ from file offsets).
    pub iova_base: u64,
    /// Wanted queue size (lowered to the device's maximum; power of two).
    pub queue_size: u16,
    /// Wanted request queues (lowered to what the device offers).
    pub request_queues: u16,
    /// Negotiate VIRTIO_F_EVENT_IDX if offered.
    pub event_idx: bool,
    /// Negotiate VIRTIO_F_INDIRECT_DESC if offered (then every multi-buffer chain is indirect).
    pub indirect_desc: bool,
    /// Wait for completions on the MSI-X eventfds instead of polling the used ring.
    pub use_interrupts: bool,
    /// Send BAR writes as posted (NO_REPLY) REGION_WRITEs, as QEMU does.
    pub posted_writes: bool,
    /// Send DEVICE_RESET before bring-up if the device supports it (QEMU does at machine reset).
    pub reset_on_connect: bool,
    /// Size BARs through config space (all-ones writes) and compare with the region sizes.
    pub check_bar_sizing: bool,
    /// Use the mmapped notify area when the device offers one.
    pub mmap_notify: bool,
    /// Spread requests round-robin over the request queues (else use [`FsDriver::use_queue`]).
    pub spread_requests: bool,
    /// Timeout for vfio-user replies and for FUSE completions.
    pub timeout: Duration,
    /// What [`FsDriver::run_closed_loop`] does with a request whose virtqueue is full (the
    /// one-request calls and [`FsDriver::submit`] return [`QueueError::Full`] instead).
    pub queue_full: QueueFullPolicy,
}

/// What the driver does with a request that finds its virtqueue full (no free descriptor).
///
/// Both park the request on a per-queue list, as Linux's `virtio_fs` does with `queued_reqs`;
/// they differ in when parked requests are tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum QueueFullPolicy {
    /// Linux before 6.11: a work item retries the parked requests 1 ms later
    /// ([`RETRY_DELAY`]); while the queue is still full it re-arms itself for another 1 ms and the
    /// request it could not place goes to the back of the list (`list_add_tail`). New requests
    /// still try the ring directly, so they can overtake parked ones.
    #[serde(rename = "retry-1ms")]
    Retry1ms,
    /// Linux 6.11 and later: parked requests wait in a FIFO that the completion path refills the
    /// ring from as soon as completions free descriptors; a new request queues behind them.
    #[default]
    #[serde(rename = "refill")]
    Refill,
}

/// How long the [`QueueFullPolicy::Retry1ms`] policy waits before retrying parked requests.
pub const RETRY_DELAY: Duration = Duration::from_millis(1);

impl QueueFullPolicy {
    /// Both policies, oldest first.
    pub const ALL: [QueueFullPolicy; 2] = [QueueFullPolicy::Retry1ms, QueueFullPolicy::Refill];

    /// The policy's name (`retry-1ms`, `refill`).
    pub fn name(self) -> &'static str {
        match self {
            QueueFullPolicy::Retry1ms => "retry-1ms",
            QueueFullPolicy::Refill => "refill",
        }
    }
}

impl std::fmt::Display for QueueFullPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for QueueFullPolicy {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        QueueFullPolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown queue-full policy {s:?} (retry-1ms or refill)"))
    }
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            mem_size: 64 << 20,
            iova_base: 1 << 32,
            queue_size: 128,
            request_queues: 1,
            event_idx: true,
            indirect_desc: true,
            use_interrupts: false,
            posted_writes: true,
            reset_on_connect: true,
            check_bar_sizing: true,
            mmap_notify: true,
            spread_requests: false,
            timeout: Duration::from_secs(5),
            queue_full: QueueFullPolicy::default(),
        }
    }
}

/// Errors of the driver.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// vfio-user failure.
    #[error("vfio-user")]
    Client(#[from] ClientError),
    /// Config space problem.
    #[error("PCI")]
    Pci(#[from] PciError),
    /// Register access or transport-level device misbehaviour.
    #[error("virtio transport")]
    Transport(#[from] TransportError),
    /// Guest memory problem.
    #[error("guest memory")]
    Memory(#[from] MemoryError),
    /// Virtqueue problem (includes `QueueError::Full`).
    #[error("virtqueue")]
    Queue(#[from] QueueError),
    /// The device does something a virtio-fs device must not.
    #[error("device misbehaves: {0}")]
    Device(String),
    /// A FUSE reply breaks the protocol.
    #[error("bad FUSE reply to opcode {opcode}: {reason}")]
    BadReply {
        /// Request opcode.
        opcode: u32,
        /// What was wrong.
        reason: String,
    },
    /// The FUSE server answered with an error.
    #[error("FUSE opcode {opcode} failed with errno {errno}")]
    Fuse {
        /// Request opcode.
        opcode: u32,
        /// Positive errno.
        errno: i32,
    },
    /// No completion within the timeout.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The driver cannot do this.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// OS error (eventfd, epoll).
    #[error("OS error")]
    Io(#[from] std::io::Error),
}

impl DriverError {
    /// Whether this is a queue-full condition.
    pub fn is_queue_full(&self) -> bool {
        matches!(self, DriverError::Queue(QueueError::Full { .. }))
    }
    /// The FUSE errno, if the server returned one.
    pub fn fuse_errno(&self) -> Option<i32> {
        match self {
            DriverError::Fuse { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// Result type of the driver.
pub type Result<T> = std::result::Result<T, DriverError>;

fn device(s: impl Into<String>) -> DriverError {
    DriverError::Device(s.into())
}

/// What the device reported during bring-up.
#[derive(Debug, Clone)]
pub struct DeviceFacts {
    /// VERSION reply.
    pub version: VersionInfo,
    /// DEVICE_GET_INFO reply.
    pub info: DeviceInfo,
    /// Region sizes by index (0 for absent).
    pub region_sizes: Vec<u64>,
    /// BARs from config space.
    pub bars: Vec<Bar>,
    /// Virtio structure locations.
    pub layout: Layout,
    /// Feature bits offered.
    pub device_features: u64,
    /// Feature bits accepted.
    pub driver_features: u64,
    /// num_queues from common config.
    pub num_queues: u16,
    /// Tag from device config.
    pub tag: String,
    /// num_request_queues from device config.
    pub num_request_queues: u32,
    /// MSI-X vectors the device offers (irq info count).
    pub msix_count: u32,
    /// Whether each queue has its own vector (else all share vector 1).
    pub per_vq_vectors: bool,
    /// Whether the notify area is mmapped.
    pub notify_mapped: bool,
}

/// A completed request.
#[derive(Debug, Clone)]
pub struct Completion {
    /// Token (the FUSE unique for FUSE requests).
    pub token: u64,
    /// Queue it completed on.
    pub queue: u16,
    /// Used length reported by the device.
    pub used_len: u32,
    /// The device-writable bytes, concatenated, truncated to `used_len`.
    pub data: Vec<u8>,
}

/// A lock request (GETLK, SETLK, SETLKW) as [`FsDriver::submit_lk`] sends it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockReq {
    /// File handle.
    pub fh: u64,
    /// Lock owner (the kernel's id for a process's file table).
    pub owner: u64,
    /// `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
    pub typ: i32,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive.
    pub end: u64,
    /// Pid of the requester.
    pub pid: u32,
    /// A flock(2) lock (`FUSE_LK_FLOCK`; whole file, owned by the handle).
    pub flock: bool,
}

/// FUSE_INIT outcome.
#[derive(Debug, Clone, Copy)]
pub struct InitInfo {
    /// The reply.
    pub out: abi::InitOut,
    /// Flags sent.
    pub flags_sent: u64,
    /// Flags the server accepted.
    pub flags: u64,
    /// Effective max write.
    pub max_write: u32,
    /// Effective max pages.
    pub max_pages: u16,
}

#[derive(Debug)]
struct Pending {
    queue: u16,
    in_buf: DmaBuf,
    out_buf: Option<DmaBuf>,
    out_len: usize,
}

struct QueueState {
    vq: SplitQueue,
    notify_addr: u64,
    vector: u16,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct DriverStats {
    /// Requests submitted.
    pub submitted: u64,
    /// Completions collected.
    pub completed: u64,
    /// Doorbells rung.
    pub notifies: u64,
    /// Doorbells skipped because the device did not want them.
    pub notifies_suppressed: u64,
    /// Eventfd wake-ups consumed.
    pub interrupts: u64,
    /// Used-ring polls that found nothing.
    pub empty_polls: u64,
}

/// The userspace virtio-fs driver.
pub struct FsDriver {
    transport: Transport,
    mem: GuestRam,
    opts: DriverOptions,
    facts: DeviceFacts,
    queues: Vec<QueueState>,
    eventfds: Vec<EventFd>,
    epoll: Epoll,
    pending: HashMap<u64, Pending>,
    ready: VecDeque<Completion>,
    next_unique: u64,
    next_rr: u16,
    current_queue: u16,
    uid: u32,
    gid: u32,
    pid: u32,
    init: Option<InitInfo>,
    stats: DriverStats,
    completed_per_queue: Vec<u64>,
}

impl std::fmt::Debug for FsDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsDriver")
            .field("facts", &self.facts)
            .field("in_flight", &self.pending.len())
            .field("stats", &self.stats)
            .finish()
    }
}

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
            return Err(device(format!(
                "config region flags {:#x} size {:#x}",
                cfg.info.flags, cfg.info.size
            )));
        }
        let msix_info = client.irq_info(VFIO_PCI_MSIX_IRQ_INDEX)?;
        if msix_info.flags & VFIO_IRQ_INFO_EVENTFD == 0 {
            return Err(device("MSI-X irq info lacks the EVENTFD flag"));
        }

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

        // PCI config space.
        let vendor = pci::cfg_read(&mut client, pci::PCI_VENDOR_ID, 2)? as u16;
        let devid = pci::cfg_read(&mut client, pci::PCI_DEVICE_ID, 2)? as u16;
        if vendor != pci::VIRTIO_PCI_VENDOR || devid != pci::VIRTIO_FS_DEVICE_ID {
            return Err(device(format!("PCI id {vendor:04x}:{devid:04x}, expected 1af4:105a")));
        }
        let bars = pci::read_bars(&mut client, opts.check_bar_sizing)?;
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
        let (layout, _caps) = find_virtio_caps(&mut client, &region_sizes)?;
        let Some(msix) = layout.msix else {
            return Err(DriverError::Unsupported("device has no MSI-X capability".into()));
        };
        let cmd = pci::cfg_read(&mut client, pci::PCI_COMMAND, 2)?;
        pci::cfg_write(
            &mut client,
            pci::PCI_COMMAND,
            2,
            cmd | u32::from(pci::PCI_COMMAND_MEMORY | pci::PCI_COMMAND_MASTER),
        )?;

        let mut transport = Transport::new(client, layout, opts.posted_writes);
        let mut notify_mapped = false;
        if opts.mmap_notify {
            if let Some(r) = regions[usize::from(layout.notify.bar)].as_ref() {
                notify_mapped = transport.map_notify(r)?;
            }
        }

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
        let driver_features = device_features & want;
        transport.set_driver_features(driver_features)?;
        transport.add_status(virtio::STATUS_FEATURES_OK)?;
        let st = transport.status()?;
        if st & virtio::STATUS_FEATURES_OK == 0 {
            return Err(device(format!(
                "device cleared FEATURES_OK (status {st:#x}) for features {driver_features:#x}"
            )));
        }

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
        let cv = transport.set_config_vector(0)?;
        if cv != 0 {
            return Err(device(format!("config_msix_vector reads back {cv:#x} after writing 0")));
        }

        // Queues (vp_modern setup_vq), enabled together at the end.
        let event_idx = driver_features & features::EVENT_IDX != 0;
        let indirect = driver_features & features::INDIRECT_DESC != 0;
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
            let vq = SplitQueue::new(&mem, q, size, event_idx, indirect)?;
            transport.set_queue_size(q, size)?;
            transport.set_queue_addrs(q, vq.desc_addr(), vq.avail_addr(), vq.used_addr())?;
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
            if got != (vq.desc_addr(), vq.avail_addr(), vq.used_addr()) {
                return Err(device(format!("queue {q}: ring addresses read back as {got:x?}")));
            }
        }
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
            per_vq_vectors,
            notify_mapped,
        };
        let mut d = FsDriver {
            transport,
            mem,
            opts,
            facts,
            queues,
            eventfds,
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

    /// What was learned during bring-up.
    pub fn facts(&self) -> &DeviceFacts {
        &self.facts
    }

    /// Options in use.
    pub fn options(&self) -> &DriverOptions {
        &self.opts
    }

    /// Counters.
    pub fn stats(&self) -> DriverStats {
        let mut s = self.stats;
        let (m, r) = self.transport.notify_counts();
        s.notifies = m + r;
        s
    }

    /// Completions collected on queue `q` so far.
    pub fn completed_on(&self, q: u16) -> u64 {
        self.completed_per_queue.get(usize::from(q)).copied().unwrap_or(0)
    }

    /// (doorbells through the mmapped area, doorbells as REGION_WRITE).
    pub fn notify_counts(&self) -> (u64, u64) {
        self.transport.notify_counts()
    }

    /// The driver's guest memory.
    pub fn memory(&self) -> &GuestRam {
        &self.mem
    }

    /// The transport (register access, vfio-user client).
    pub fn transport(&mut self) -> &mut Transport {
        &mut self.transport
    }

    /// The vfio-user client.
    pub fn client(&mut self) -> &mut Client {
        self.transport.client()
    }

    /// Number of request queues in use.
    pub fn request_queues(&self) -> u16 {
        self.queues.len() as u16 - 1
    }

    /// Size of queue `q`.
    pub fn queue_size(&self, q: u16) -> u16 {
        self.queues[usize::from(q)].vq.size()
    }

    /// MSI-X vector of queue `q`.
    pub fn queue_vector(&self, q: u16) -> u16 {
        self.queues[usize::from(q)].vector
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Changes the queue-full policy of later closed loops.
    pub fn set_queue_full(&mut self, policy: QueueFullPolicy) {
        self.opts.queue_full = policy;
    }

    /// Sends typed operations to request queue `q` (1..=N).
    pub fn use_queue(&mut self, q: u16) {
        assert!(q >= 1 && usize::from(q) < self.queues.len(), "no request queue {q}");
        self.current_queue = q;
    }

    /// FUSE_INIT result, once [`FsDriver::init`] ran.
    pub fn init_info(&self) -> Option<InitInfo> {
        self.init
    }

    fn pick_queue(&mut self) -> u16 {
        if self.opts.spread_requests {
            let n = self.request_queues();
            self.next_rr = (self.next_rr % n) + 1;
            self.next_rr
        } else {
            self.current_queue
        }
    }

    /// The unique the next request will get (Linux numbers them in steps of 2).
    pub fn peek_next_unique(&self) -> u64 {
        self.next_unique + 2
    }

    fn alloc_unique(&mut self) -> u64 {
        // Linux: FUSE_REQ_ID_STEP 2; bit 0 marks INTERRUPT requests.
        self.next_unique += 2;
        self.next_unique
    }

    fn check_queue(&self, q: u16) -> Result<()> {
        if usize::from(q) >= self.queues.len() {
            return Err(DriverError::Unsupported(format!("no queue {q}")));
        }
        Ok(())
    }

    /// Adds a chain of `readable` buffers (each its own descriptor) followed by writable
    /// segments of the given lengths, and rings the doorbell if the device wants it. Returns
    /// the token. [`QueueError::Full`] when the queue has no room.
    pub fn submit_raw(&mut self, queue: u16, readable: &[&[u8]], writable: &[u32]) -> Result<u64> {
        self.check_queue(queue)?;
        let token = self.alloc_unique();
        let in_len: usize = readable.iter().map(|r| r.len()).sum();
        let out_len: usize = writable.iter().map(|w| *w as usize).sum();
        let mut in_segs = Vec::new();
        let mut lens = Vec::new();
        for r in readable {
            lens.push(r.len());
        }
        self.submit_layout(queue, token, readable, &lens, in_len, writable, out_len, &mut in_segs)?;
        Ok(token)
    }

    #[allow(clippy::too_many_arguments)]
    fn submit_layout(
        &mut self,
        queue: u16,
        token: u64,
        parts: &[&[u8]],
        in_seg_lens: &[usize],
        in_len: usize,
        out_seg_lens: &[u32],
        out_len: usize,
        segs: &mut Vec<Segment>,
    ) -> Result<()> {
        let in_buf = self.mem.alloc(in_len.max(1), PAGE_SIZE)?;
        let out_buf = if out_len > 0 {
            match self.mem.alloc(out_len, PAGE_SIZE) {
                Ok(b) => Some(b),
                Err(e) => {
                    self.mem.free(in_buf);
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        let free = |mem: &GuestRam| {
            mem.free(in_buf);
            if let Some(b) = out_buf {
                mem.free(b);
            }
        };
        let mut off = 0u64;
        for p in parts {
            if let Err(e) = self.mem.write(in_buf.iova + off, p) {
                free(&self.mem);
                return Err(e.into());
            }
            off += p.len() as u64;
        }
        segs.clear();
        let mut off = 0u64;
        for &l in in_seg_lens {
            if l == 0 {
                continue;
            }
            segs.push(Segment { addr: in_buf.iova + off, len: l as u32, write: false });
            off += l as u64;
        }
        if let Some(ob) = out_buf {
            // Poison the reply area so bytes the device claims but did not write show up.
            if let Err(e) = self.mem.fill(ob.iova, out_len, 0xa5) {
                free(&self.mem);
                return Err(e.into());
            }
            let mut off = 0u64;
            for &l in out_seg_lens {
                if l == 0 {
                    continue;
                }
                segs.push(Segment { addr: ob.iova + off, len: l, write: true });
                off += u64::from(l);
            }
        }
        let qs = &mut self.queues[usize::from(queue)];
        if let Err(e) = qs.vq.add_chain(&self.mem, segs, token) {
            free(&self.mem);
            return Err(e.into());
        }
        self.pending.insert(token, Pending { queue, in_buf, out_buf, out_len });
        self.stats.submitted += 1;
        let qs = &mut self.queues[usize::from(queue)];
        if qs.vq.kick_prepare(&self.mem)? {
            let addr = qs.notify_addr;
            self.transport.notify(queue, addr)?;
        } else {
            self.stats.notifies_suppressed += 1;
        }
        Ok(())
    }

    fn in_header(&self, opcode: u32, unique: u64, nodeid: u64, len: usize) -> InHeader {
        InHeader {
            len: len as u32,
            opcode,
            unique,
            nodeid,
            uid: self.uid,
            gid: self.gid,
            pid: self.pid,
            total_extlen: 0,
            padding: 0,
        }
    }

    /// Submits a FUSE request with Linux's buffer layout: in header | in args (one buffer) |
    /// in data (page buffers); out header | out args | out data (page buffers). Returns the
    /// unique (= token). `queue` 0 is hiprio.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &mut self,
        queue: u16,
        opcode: u32,
        nodeid: u64,
        in_args: &[&[u8]],
        in_data: &[u8],
        out_args: usize,
        out_data: usize,
    ) -> Result<u64> {
        self.check_queue(queue)?;
        let unique = self.alloc_unique();
        let args_len: usize = in_args.iter().map(|a| a.len()).sum();
        let total = InHeader::SIZE + args_len + in_data.len();
        let hdr = self.in_header(opcode, unique, nodeid, total).to_bytes();
        let mut parts: Vec<&[u8]> = vec![&hdr];
        parts.extend_from_slice(in_args);
        parts.push(in_data);
        let mut in_lens = vec![InHeader::SIZE, args_len];
        // Data pages: the header and args occupy the start of the buffer, so keep page
        // boundaries relative to the data start (Linux sends whole pages of the user buffer).
        let mut left = in_data.len();
        while left > 0 {
            let n = left.min(PAGE_SIZE);
            in_lens.push(n);
            left -= n;
        }
        let mut out_lens = vec![OutHeader::SIZE as u32];
        if out_args > 0 {
            out_lens.push(out_args as u32);
        }
        let mut left = out_data;
        while left > 0 {
            let n = left.min(PAGE_SIZE);
            out_lens.push(n as u32);
            left -= n;
        }
        let out_len = OutHeader::SIZE + out_args + out_data;
        let mut segs = Vec::new();
        self.submit_layout(queue, unique, &parts, &in_lens, total, &out_lens, out_len, &mut segs)?;
        Ok(unique)
    }

    /// Collects every completion available now (all queues), without waiting.
    pub fn poll_completions(&mut self) -> Result<Vec<Completion>> {
        self.reap()?;
        Ok(self.ready.drain(..).collect())
    }

    fn reap(&mut self) -> Result<usize> {
        let mut n = 0;
        for i in 0..self.queues.len() {
            while let Some(u) = self.queues[i].vq.pop_used(&self.mem)? {
                let p = self.pending.remove(&u.token).ok_or_else(|| {
                    device(format!("completion for unknown token {} on queue {i}", u.token))
                })?;
                let data = match p.out_buf {
                    Some(b) => self.mem.read_vec(b.iova, (u.len as usize).min(p.out_len))?,
                    None => Vec::new(),
                };
                self.mem.free(p.in_buf);
                if let Some(b) = p.out_buf {
                    self.mem.free(b);
                }
                self.ready.push_back(Completion { token: u.token, queue: p.queue, used_len: u.len, data });
                self.stats.completed += 1;
                self.completed_per_queue[i] += 1;
                n += 1;
            }
        }
        if n == 0 {
            self.stats.empty_polls += 1;
        }
        Ok(n)
    }

    /// Waits until at least one completion is available (polling or on eventfds, per the
    /// options) and returns all available ones.
    pub fn wait_completions(&mut self) -> Result<Vec<Completion>> {
        let deadline = Instant::now() + self.opts.timeout;
        loop {
            self.reap()?;
            if !self.ready.is_empty() {
                return Ok(self.ready.drain(..).collect());
            }
            if self.pending.is_empty() {
                return Ok(Vec::new());
            }
            self.wait_step(deadline)?;
        }
    }

    /// Waits for the completion of `token`, keeping others for later.
    pub fn wait_for(&mut self, token: u64) -> Result<Completion> {
        let deadline = Instant::now() + self.opts.timeout;
        loop {
            if let Some(pos) = self.ready.iter().position(|c| c.token == token) {
                return Ok(self.ready.remove(pos).expect("position is valid"));
            }
            if !self.pending.contains_key(&token) {
                return Err(DriverError::Unsupported(format!("token {token} is not in flight")));
            }
            if self.reap()? > 0 {
                continue;
            }
            self.wait_step(deadline)?;
        }
    }

    fn wait_step(&mut self, deadline: Instant) -> Result<()> {
        let now = Instant::now();
        if now >= deadline {
            let stuck: Vec<String> = self
                .queues
                .iter()
                .filter(|q| q.vq.in_flight() > 0)
                .map(|q| {
                    format!(
                        "queue {}: {} in flight, device used idx {:?}",
                        q.vq.index(),
                        q.vq.in_flight(),
                        q.vq.device_used_idx(&self.mem).ok()
                    )
                })
                .collect();
            return Err(DriverError::Timeout(format!(
                "no completion within {:?}; {}",
                self.opts.timeout,
                stuck.join("; ")
            )));
        }
        if !self.opts.use_interrupts {
            std::thread::yield_now();
            return Ok(());
        }
        // Re-arm and re-check before sleeping (Linux virtqueue_enable_cb + virtqueue_poll).
        for i in 0..self.queues.len() {
            if self.queues[i].vq.in_flight() > 0 && self.queues[i].vq.enable_interrupts(&self.mem)? {
                return Ok(());
            }
        }
        let ms = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as i32;
        let mut evs = [EpollEvent::default(); 16];
        let n = match self.epoll.wait(ms, &mut evs) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e.into()),
        };
        for ev in &evs[..n] {
            let v = ev.data() as usize;
            if let Some(e) = self.eventfds.get(v) {
                if let Ok(c) = e.read() {
                    self.stats.interrupts += c;
                }
            }
        }
        Ok(())
    }

    /// Reads and clears the eventfd counter of MSI-X vector `v` (0 if nothing pending).
    pub fn take_interrupts(&mut self, v: u16) -> u64 {
        self.eventfds.get(usize::from(v)).and_then(|e| e.read().ok()).unwrap_or(0)
    }

    /// Checks a FUSE reply against its request: returns the out header and the payload.
    pub fn parse_reply(c: &Completion, opcode: u32, unique: u64) -> Result<(OutHeader, Vec<u8>)> {
        let bad = |reason: String| DriverError::BadReply { opcode, reason };
        if (c.used_len as usize) < OutHeader::SIZE {
            return Err(bad(format!("used length {} shorter than fuse_out_header", c.used_len)));
        }
        let h = OutHeader::decode(&c.data).expect("length checked");
        if h.len != c.used_len {
            return Err(bad(format!("out header len {} differs from used length {}", h.len, c.used_len)));
        }
        if h.unique != unique {
            return Err(bad(format!("out header unique {} for request {unique}", h.unique)));
        }
        if h.error > 0 || h.error < -4095 {
            return Err(bad(format!("error {} is not a negative errno", h.error)));
        }
        if h.error != 0 && h.len as usize != OutHeader::SIZE {
            return Err(bad(format!("error {} with {} payload bytes", h.error, h.len - 16)));
        }
        Ok((h, c.data[OutHeader::SIZE..].to_vec()))
    }

    /// Sends a request whose in-arguments are `in_parts` (each its own descriptor) and waits for
    /// the reply (out header + `reply_capacity` bytes). FUSE errors are returned in the header,
    /// not as `Err`; protocol violations are `Err(BadReply)`.
    pub fn call(
        &mut self,
        queue: u16,
        opcode: u32,
        nodeid: u64,
        in_parts: &[&[u8]],
        reply_capacity: usize,
    ) -> Result<(OutHeader, Vec<u8>)> {
        self.check_queue(queue)?;
        let unique = self.alloc_unique();
        let args_len: usize = in_parts.iter().map(|a| a.len()).sum();
        let total = InHeader::SIZE + args_len;
        let hdr = self.in_header(opcode, unique, nodeid, total).to_bytes();
        let mut parts: Vec<&[u8]> = vec![&hdr];
        parts.extend_from_slice(in_parts);
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        let mut out_lens = vec![OutHeader::SIZE as u32];
        if reply_capacity > 0 {
            out_lens.push(reply_capacity as u32);
        }
        let mut segs = Vec::new();
        self.submit_layout(
            queue,
            unique,
            &parts,
            &lens,
            total,
            &out_lens,
            OutHeader::SIZE + reply_capacity,
            &mut segs,
        )?;
        let c = self.wait_for(unique)?;
        Self::parse_reply(&c, opcode, unique)
    }

    /// Sends a request on the current request queue and returns the reply payload; a FUSE error
    /// becomes `Err(Fuse)`.
    fn request(
        &mut self,
        opcode: u32,
        nodeid: u64,
        in_args: &[&[u8]],
        in_data: &[u8],
        out_args: usize,
        out_data: usize,
    ) -> Result<Vec<u8>> {
        let q = self.pick_queue();
        let unique = self.submit(q, opcode, nodeid, in_args, in_data, out_args, out_data)?;
        let c = self.wait_for(unique)?;
        let (h, payload) = Self::parse_reply(&c, opcode, unique)?;
        if h.error != 0 {
            return Err(DriverError::Fuse { opcode, errno: -h.error });
        }
        Ok(payload)
    }

    fn exact(opcode: u32, p: &[u8], n: usize) -> Result<()> {
        if p.len() != n {
            return Err(DriverError::BadReply {
                opcode,
                reason: format!("payload {} bytes, expected {n}", p.len()),
            });
        }
        Ok(())
    }

    fn check_attr(opcode: u32, a: &abi::Attr) -> Result<()> {
        let fmt = a.mode & libc::S_IFMT;
        let valid = [
            libc::S_IFREG,
            libc::S_IFDIR,
            libc::S_IFLNK,
            libc::S_IFCHR,
            libc::S_IFBLK,
            libc::S_IFIFO,
            libc::S_IFSOCK,
        ]
        .contains(&fmt);
        if !valid || a.size > i64::MAX as u64 {
            return Err(DriverError::BadReply {
                opcode,
                reason: format!("invalid attributes: mode {:o} size {}", a.mode, a.size),
            });
        }
        Ok(())
    }

    fn entry(opcode: u32, p: &[u8], want_fmt: Option<u32>) -> Result<EntryOut> {
        Self::exact(opcode, p, EntryOut::SIZE)?;
        let e = EntryOut::decode(p).expect("length checked");
        let bad = |reason: String| DriverError::BadReply { opcode, reason };
        if opcode != opcode::LOOKUP && (e.nodeid == 0 || e.nodeid == 1) {
            return Err(bad(format!("new entry has nodeid {}", e.nodeid)));
        }
        if e.nodeid != 0 {
            Self::check_attr(opcode, &e.attr)?;
        }
        if let Some(f) = want_fmt {
            if e.attr.mode & libc::S_IFMT != f {
                return Err(bad(format!("entry mode {:o}, expected type {f:o}", e.attr.mode)));
            }
        }
        Ok(e)
    }

    /// FUSE_INIT with the flags Linux 6.12 sends for virtio-fs; validates the reply.
    pub fn init(&mut self) -> Result<InitInfo> {
        self.init_with_flags(abi::init_flags::LINUX_6_12_VIRTIOFS)
    }

    /// FUSE_INIT with chosen flags.
    pub fn init_with_flags(&mut self, flags: u64) -> Result<InitInfo> {
        let op = opcode::INIT;
        let i = abi::InitIn {
            major: abi::FUSE_KERNEL_VERSION,
            minor: abi::FUSE_KERNEL_MINOR_VERSION,
            max_readahead: 128 << 10,
            flags: flags as u32,
            flags2: (flags >> 32) as u32,
            unused: [0; 11],
        }
        .to_bytes();
        let p = self.request(op, 0, &[&i], &[], abi::InitOut::SIZE, 0)?;
        Self::exact(op, &p, abi::InitOut::SIZE)?;
        let out = abi::InitOut::decode(&p).expect("length checked");
        let bad = |reason: String| DriverError::BadReply { opcode: op, reason };
        if out.major != abi::FUSE_KERNEL_VERSION {
            return Err(bad(format!("major {}", out.major)));
        }
        if out.minor > abi::FUSE_KERNEL_MINOR_VERSION {
            return Err(bad(format!(
                "minor {} above the requested {}",
                out.minor,
                abi::FUSE_KERNEL_MINOR_VERSION
            )));
        }
        let mut got = u64::from(out.flags);
        if out.flags & (abi::init_flags::INIT_EXT as u32) != 0 {
            got |= u64::from(out.flags2) << 32;
        }
        if got & !flags != 0 {
            return Err(bad(format!("server set flags {:#x} that were not offered", got & !flags)));
        }
        // Linux virtio-fs caps max_pages_limit at the virtqueue size minus FUSE_HEADER_OVERHEAD
        // (4), so that a request fits in the ring even without indirect descriptors.
        let vq_limit =
            self.queues[1..].iter().map(|q| q.vq.size()).min().unwrap_or(0).saturating_sub(4).max(1);
        let limit = MAX_PAGES_LIMIT.min(vq_limit);
        let max_pages =
            if got & abi::init_flags::MAX_PAGES != 0 { out.max_pages.clamp(1, limit) } else { 32.min(limit) };
        let max_write = out.max_write.max(4096).min(u32::from(max_pages) * PAGE_SIZE as u32);
        let info = InitInfo { out, flags_sent: flags, flags: got, max_write, max_pages };
        self.init = Some(info);
        Ok(info)
    }

    /// LOOKUP `name` in `parent`. A reply with nodeid 0 (negative entry) is `Err(Fuse ENOENT)`.
    pub fn lookup(&mut self, parent: u64, name: &str) -> Result<EntryOut> {
        let n = cstr(name);
        let p = self.request(opcode::LOOKUP, parent, &[&n], &[], EntryOut::SIZE, 0)?;
        let e = Self::entry(opcode::LOOKUP, &p, None)?;
        if e.nodeid == 0 {
            return Err(DriverError::Fuse { opcode: opcode::LOOKUP, errno: libc::ENOENT });
        }
        Ok(e)
    }

    fn attr_reply(op: u32, p: &[u8]) -> Result<abi::Attr> {
        Self::exact(op, p, abi::ATTR_OUT_SIZE)?;
        let a = abi::Attr::decode(&p[abi::AttrOutHead::SIZE..]).expect("length checked");
        Self::check_attr(op, &a)?;
        Ok(a)
    }

    /// GETATTR.
    pub fn getattr(&mut self, nodeid: u64) -> Result<abi::Attr> {
        let g = abi::GetattrIn::default().to_bytes();
        let p = self.request(opcode::GETATTR, nodeid, &[&g], &[], abi::ATTR_OUT_SIZE, 0)?;
        Self::attr_reply(opcode::GETATTR, &p)
    }

    /// SETATTR with a prepared `fuse_setattr_in`.
    pub fn setattr(&mut self, nodeid: u64, s: &abi::SetattrIn) -> Result<abi::Attr> {
        let b = s.to_bytes();
        let p = self.request(opcode::SETATTR, nodeid, &[&b], &[], abi::ATTR_OUT_SIZE, 0)?;
        Self::attr_reply(opcode::SETATTR, &p)
    }

    /// Truncates (SETATTR size, with the handle if given).
    pub fn truncate(&mut self, nodeid: u64, size: u64, fh: Option<u64>) -> Result<abi::Attr> {
        let mut s = abi::SetattrIn { valid: abi::fattr::SIZE, size, ..Default::default() };
        if let Some(fh) = fh {
            s.valid |= abi::fattr::FH;
            s.fh = fh;
        }
        let a = self.setattr(nodeid, &s)?;
        if a.size != size {
            return Err(DriverError::BadReply {
                opcode: opcode::SETATTR,
                reason: format!("size {} after truncating to {size}", a.size),
            });
        }
        Ok(a)
    }

    /// MKDIR.
    pub fn mkdir(&mut self, parent: u64, name: &str, mode: u32) -> Result<EntryOut> {
        let m = abi::MkdirIn { mode, umask: 0o022 }.to_bytes();
        let n = cstr(name);
        let p = self.request(opcode::MKDIR, parent, &[&m, &n], &[], EntryOut::SIZE, 0)?;
        Self::entry(opcode::MKDIR, &p, Some(libc::S_IFDIR))
    }

    /// CREATE (file, opened): returns the entry and the open reply.
    pub fn create(
        &mut self,
        parent: u64,
        name: &str,
        mode: u32,
        flags: u32,
    ) -> Result<(EntryOut, abi::OpenOut)> {
        let c = abi::CreateIn { flags, mode: mode | libc::S_IFREG, umask: 0o022, open_flags: 0 }.to_bytes();
        let n = cstr(name);
        let p =
            self.request(opcode::CREATE, parent, &[&c, &n], &[], EntryOut::SIZE + abi::OpenOut::SIZE, 0)?;
        Self::exact(opcode::CREATE, &p, EntryOut::SIZE + abi::OpenOut::SIZE)?;
        let e = Self::entry(opcode::CREATE, &p[..EntryOut::SIZE], Some(libc::S_IFREG))?;
        let o = abi::OpenOut::decode(&p[EntryOut::SIZE..]).expect("length checked");
        Ok((e, o))
    }

    /// MKNOD.
    pub fn mknod(&mut self, parent: u64, name: &str, mode: u32, rdev: u32) -> Result<EntryOut> {
        let m = abi::MknodIn { mode, rdev, umask: 0o022, padding: 0 }.to_bytes();
        let n = cstr(name);
        let p = self.request(opcode::MKNOD, parent, &[&m, &n], &[], EntryOut::SIZE, 0)?;
        Self::entry(opcode::MKNOD, &p, Some(mode & libc::S_IFMT))
    }

    fn open_common(&mut self, op: u32, nodeid: u64, flags: u32) -> Result<abi::OpenOut> {
        let o = abi::OpenIn { flags, open_flags: 0 }.to_bytes();
        let p = self.request(op, nodeid, &[&o], &[], abi::OpenOut::SIZE, 0)?;
        Self::exact(op, &p, abi::OpenOut::SIZE)?;
        Ok(abi::OpenOut::decode(&p).expect("length checked"))
    }

    /// OPEN.
    pub fn open(&mut self, nodeid: u64, flags: u32) -> Result<abi::OpenOut> {
        self.open_common(opcode::OPEN, nodeid, flags)
    }

    /// OPENDIR.
    pub fn opendir(&mut self, nodeid: u64) -> Result<abi::OpenOut> {
        self.open_common(opcode::OPENDIR, nodeid, (libc::O_RDONLY | libc::O_DIRECTORY) as u32)
    }

    fn read_in(fh: u64, offset: u64, size: u32) -> Vec<u8> {
        abi::ReadIn { fh, offset, size, ..Default::default() }.to_bytes()
    }

    /// READ of up to `len` bytes.
    pub fn read(&mut self, nodeid: u64, fh: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        let r = Self::read_in(fh, offset, len);
        let p = self.request(opcode::READ, nodeid, &[&r], &[], 0, len as usize)?;
        if p.len() > len as usize {
            return Err(DriverError::BadReply {
                opcode: opcode::READ,
                reason: format!("{} bytes for a {len}-byte read", p.len()),
            });
        }
        Ok(p)
    }

    /// WRITE; returns the count the server reports (checked to be at most `data.len()`).
    /// Larger than the negotiated `max_write` is refused, as the kernel never sends that.
    pub fn write(&mut self, nodeid: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        if let Some(i) = self.init {
            if data.len() > i.max_write as usize {
                return Err(DriverError::Unsupported(format!(
                    "write of {} bytes exceeds max_write {}",
                    data.len(),
                    i.max_write
                )));
            }
        }
        let w = abi::WriteIn { fh, offset, size: data.len() as u32, ..Default::default() }.to_bytes();
        let p = self.request(opcode::WRITE, nodeid, &[&w], data, abi::WriteOut::SIZE, 0)?;
        Self::exact(opcode::WRITE, &p, abi::WriteOut::SIZE)?;
        let o = abi::WriteOut::decode(&p).expect("length checked");
        if o.size as usize > data.len() {
            return Err(DriverError::BadReply {
                opcode: opcode::WRITE,
                reason: format!("wrote {} of {} bytes", o.size, data.len()),
            });
        }
        Ok(o.size)
    }

    fn empty_reply(&mut self, op: u32, nodeid: u64, args: &[&[u8]]) -> Result<()> {
        let p = self.request(op, nodeid, args, &[], 0, 0)?;
        Self::exact(op, &p, 0)
    }

    /// RELEASE.
    pub fn release(&mut self, nodeid: u64, fh: u64) -> Result<()> {
        let r = abi::ReleaseIn { fh, ..Default::default() }.to_bytes();
        self.empty_reply(opcode::RELEASE, nodeid, &[&r])
    }

    /// RELEASEDIR.
    pub fn releasedir(&mut self, nodeid: u64, fh: u64) -> Result<()> {
        let r = abi::ReleaseIn { fh, ..Default::default() }.to_bytes();
        self.empty_reply(opcode::RELEASEDIR, nodeid, &[&r])
    }

    /// FLUSH.
    pub fn flush(&mut self, nodeid: u64, fh: u64) -> Result<()> {
        self.flush_owner(nodeid, fh, 0)
    }

    /// FLUSH on behalf of lock owner `lock_owner` (a close(2): the owner's POSIX locks go).
    pub fn flush_owner(&mut self, nodeid: u64, fh: u64, lock_owner: u64) -> Result<()> {
        let f = abi::FlushIn { fh, lock_owner, ..Default::default() }.to_bytes();
        self.empty_reply(opcode::FLUSH, nodeid, &[&f])
    }

    /// RELEASE of a file that used flock(2): `FUSE_RELEASE_FLOCK_UNLOCK` with `lock_owner`.
    pub fn release_flock(&mut self, nodeid: u64, fh: u64, lock_owner: u64) -> Result<()> {
        let r = abi::ReleaseIn {
            fh,
            release_flags: abi::FUSE_RELEASE_FLOCK_UNLOCK,
            lock_owner,
            ..Default::default()
        }
        .to_bytes();
        self.empty_reply(opcode::RELEASE, nodeid, &[&r])
    }

    /// Submits GETLK, SETLK or SETLKW (`op`) on `queue` without waiting for the reply; returns
    /// its unique. Collect the result with [`FsDriver::lk_result`].
    pub fn submit_lk(&mut self, queue: u16, op: u32, nodeid: u64, req: &LockReq) -> Result<u64> {
        let arg = abi::LkIn {
            fh: req.fh,
            owner: req.owner,
            lk_start: req.start,
            lk_end: req.end,
            lk_typ: req.typ as u32,
            lk_pid: req.pid,
            lk_flags: if req.flock { abi::FUSE_LK_FLOCK } else { 0 },
            padding: 0,
        }
        .to_bytes();
        let out = if op == opcode::GETLK { abi::FileLock::SIZE } else { 0 };
        self.submit(queue, op, nodeid, &[&arg], &[], out, 0)
    }

    /// Waits for the lock request `unique` (from [`FsDriver::submit_lk`]) and checks its reply:
    /// the lock a GETLK reports, `None` for SETLK/SETLKW; a FUSE error is `Err(Fuse)`.
    pub fn lk_result(&mut self, op: u32, unique: u64) -> Result<Option<abi::FileLock>> {
        let c = self.wait_for(unique)?;
        Self::lk_reply(&c, op)
    }

    /// Checks the reply `c` of a lock request `op`, as [`FsDriver::lk_result`].
    pub fn lk_reply(c: &Completion, op: u32) -> Result<Option<abi::FileLock>> {
        let (h, p) = Self::parse_reply(c, op, c.token)?;
        if h.error != 0 {
            return Err(DriverError::Fuse { opcode: op, errno: -h.error });
        }
        if op != opcode::GETLK {
            Self::exact(op, &p, 0)?;
            return Ok(None);
        }
        Self::exact(op, &p, abi::FileLock::SIZE)?;
        let lk = abi::FileLock::decode(&p).expect("length checked");
        let typ = lk.typ as i32;
        if ![libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK].contains(&typ)
            || (typ != libc::F_UNLCK && (lk.start > lk.end || lk.end > abi::OFFSET_MAX))
        {
            return Err(DriverError::BadReply { opcode: op, reason: format!("invalid lock {lk:?}") });
        }
        Ok(Some(lk))
    }

    /// The completion of `token` if it has arrived, without waiting (others are kept for later).
    pub fn try_take(&mut self, token: u64) -> Result<Option<Completion>> {
        self.reap()?;
        Ok(self.ready.iter().position(|c| c.token == token).and_then(|i| self.ready.remove(i)))
    }

    /// Whether request `token` is still waiting for its completion.
    pub fn is_pending(&self, token: u64) -> bool {
        self.pending.contains_key(&token)
    }

    /// SETLK on the current request queue.
    pub fn setlk(&mut self, nodeid: u64, req: &LockReq) -> Result<()> {
        let q = self.pick_queue();
        let u = self.submit_lk(q, opcode::SETLK, nodeid, req)?;
        self.lk_result(opcode::SETLK, u).map(drop)
    }

    /// GETLK on the current request queue: the conflicting lock, or one of type `F_UNLCK`.
    pub fn getlk(&mut self, nodeid: u64, req: &LockReq) -> Result<abi::FileLock> {
        let q = self.pick_queue();
        let u = self.submit_lk(q, opcode::GETLK, nodeid, req)?;
        Ok(self.lk_result(opcode::GETLK, u)?.expect("GETLK replies carry a lock"))
    }

    /// INTERRUPT of request `unique` on the hiprio queue (one buffer, no reply, as Linux would
    /// lay it out: its own unique is `unique | FUSE_INT_REQ_BIT`); waits for the used entry.
    pub fn interrupt(&mut self, unique: u64) -> Result<()> {
        let token = unique | abi::FUSE_INT_REQ_BIT;
        if self.pending.contains_key(&token) {
            return Err(DriverError::Unsupported(format!("an INTERRUPT of {unique} is in flight")));
        }
        let len = InHeader::SIZE + abi::InterruptIn::SIZE;
        let mut b = self.in_header(opcode::INTERRUPT, token, 0, len).to_bytes();
        abi::InterruptIn { unique }.encode_into(&mut b);
        let mut segs = Vec::new();
        self.submit_layout(0, token, &[&b], &[len], len, &[], 0, &mut segs)?;
        let c = self.wait_for(token)?;
        if c.used_len != 0 {
            return Err(DriverError::BadReply {
                opcode: opcode::INTERRUPT,
                reason: format!("used length {} for a request without reply buffers", c.used_len),
            });
        }
        Ok(())
    }

    /// FSYNC.
    pub fn fsync(&mut self, nodeid: u64, fh: u64, datasync: bool) -> Result<()> {
        let f = abi::FsyncIn { fh, fsync_flags: u32::from(datasync), padding: 0 }.to_bytes();
        self.empty_reply(opcode::FSYNC, nodeid, &[&f])
    }

    /// One READDIR of up to `size` bytes from `offset`.
    pub fn readdir(&mut self, nodeid: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<Dirent>> {
        let r = Self::read_in(fh, offset, size);
        let p = self.request(opcode::READDIR, nodeid, &[&r], &[], 0, size as usize)?;
        abi::parse_dirents(&p).map_err(|reason| DriverError::BadReply { opcode: opcode::READDIR, reason })
    }

    /// READDIR until an empty reply (4 KiB at a time, as Linux does).
    pub fn readdir_all(&mut self, nodeid: u64, fh: u64) -> Result<Vec<Dirent>> {
        let mut all: Vec<Dirent> = Vec::new();
        let mut off = 0;
        for _ in 0..100_000 {
            let v = self.readdir(nodeid, fh, off, PAGE_SIZE as u32)?;
            let Some(last) = v.last() else {
                return Ok(all);
            };
            if last.off == off {
                return Err(DriverError::BadReply {
                    opcode: opcode::READDIR,
                    reason: format!("offset cookie does not advance past {off}"),
                });
            }
            off = last.off;
            all.extend(v);
        }
        Err(DriverError::BadReply { opcode: opcode::READDIR, reason: "directory never ends".into() })
    }

    /// One READDIRPLUS of up to `size` bytes from `offset`.
    pub fn readdirplus(&mut self, nodeid: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<DirentPlus>> {
        let r = Self::read_in(fh, offset, size);
        let p = self.request(opcode::READDIRPLUS, nodeid, &[&r], &[], 0, size as usize)?;
        abi::parse_direntplus(&p)
            .map_err(|reason| DriverError::BadReply { opcode: opcode::READDIRPLUS, reason })
    }

    /// RENAME.
    pub fn rename(&mut self, parent: u64, name: &str, newparent: u64, newname: &str) -> Result<()> {
        let r = abi::RenameIn { newdir: newparent }.to_bytes();
        let (a, b) = (cstr(name), cstr(newname));
        self.empty_reply(opcode::RENAME, parent, &[&r, &a, &b])
    }

    /// RENAME2 with flags.
    pub fn rename2(
        &mut self,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        flags: u32,
    ) -> Result<()> {
        let r = abi::Rename2In { newdir: newparent, flags, padding: 0 }.to_bytes();
        let (a, b) = (cstr(name), cstr(newname));
        self.empty_reply(opcode::RENAME2, parent, &[&r, &a, &b])
    }

    /// UNLINK.
    pub fn unlink(&mut self, parent: u64, name: &str) -> Result<()> {
        let n = cstr(name);
        self.empty_reply(opcode::UNLINK, parent, &[&n])
    }

    /// RMDIR.
    pub fn rmdir(&mut self, parent: u64, name: &str) -> Result<()> {
        let n = cstr(name);
        self.empty_reply(opcode::RMDIR, parent, &[&n])
    }

    /// STATFS.
    pub fn statfs(&mut self, nodeid: u64) -> Result<abi::StatfsOut> {
        let p = self.request(opcode::STATFS, nodeid, &[], &[], abi::StatfsOut::SIZE, 0)?;
        Self::exact(opcode::STATFS, &p, abi::StatfsOut::SIZE)?;
        Ok(abi::StatfsOut::decode(&p).expect("length checked"))
    }

    /// SYMLINK `name` -> `target` in `parent`.
    pub fn symlink(&mut self, parent: u64, name: &str, target: &str) -> Result<EntryOut> {
        let (n, t) = (cstr(name), cstr(target));
        let p = self.request(opcode::SYMLINK, parent, &[&n, &t], &[], EntryOut::SIZE, 0)?;
        Self::entry(opcode::SYMLINK, &p, Some(libc::S_IFLNK))
    }

    /// READLINK (Linux asks for one page).
    pub fn readlink(&mut self, nodeid: u64) -> Result<Vec<u8>> {
        let p = self.request(opcode::READLINK, nodeid, &[], &[], 0, PAGE_SIZE)?;
        if p.is_empty() {
            return Err(DriverError::BadReply {
                opcode: opcode::READLINK,
                reason: "empty link target".into(),
            });
        }
        Ok(p)
    }

    /// LINK existing `nodeid` as `newname` in `newparent`.
    pub fn link(&mut self, nodeid: u64, newparent: u64, newname: &str) -> Result<EntryOut> {
        let l = abi::LinkIn { oldnodeid: nodeid }.to_bytes();
        let n = cstr(newname);
        let p = self.request(opcode::LINK, newparent, &[&l, &n], &[], EntryOut::SIZE, 0)?;
        let e = Self::entry(opcode::LINK, &p, None)?;
        if e.nodeid != nodeid {
            return Err(DriverError::BadReply {
                opcode: opcode::LINK,
                reason: format!("link returned node {} for node {nodeid}", e.nodeid),
            });
        }
        Ok(e)
    }

    /// FORGET on the hiprio queue (one 48-byte buffer, no reply); waits for the used entry.
    pub fn forget(&mut self, nodeid: u64, nlookup: u64) -> Result<()> {
        let unique = self.alloc_unique();
        let mut b =
            self.in_header(opcode::FORGET, unique, nodeid, InHeader::SIZE + abi::ForgetIn::SIZE).to_bytes();
        abi::ForgetIn { nlookup }.encode_into(&mut b);
        let mut segs = Vec::new();
        let len = b.len();
        self.submit_layout(0, unique, &[&b], &[len], len, &[], 0, &mut segs)?;
        let c = self.wait_for(unique)?;
        if c.used_len != 0 {
            return Err(DriverError::BadReply {
                opcode: opcode::FORGET,
                reason: format!("used length {} for a request without reply buffers", c.used_len),
            });
        }
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

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
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
