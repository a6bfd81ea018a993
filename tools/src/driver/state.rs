//! The driver's state ([`FsDriver`]) and what it reports: the device facts learned at bring-up,
//! completions, counters; the small accessors every other part uses.

use std::collections::{HashMap, VecDeque};

use vmm_sys_util::epoll::Epoll;
use vmm_sys_util::eventfd::EventFd;

use super::error::{DriverError, Result};
use super::options::{DriverOptions, QueueFullPolicy};
use crate::fuse_abi::{self as abi, InHeader};
use crate::memory::{DmaBuf, GuestRam};
use crate::pci::Bar;
use crate::vfio_user::{Client, DeviceInfo, VersionInfo};
use crate::virtio::{Layout, Transport};
use crate::virtqueue::{RingLayout, Virtqueue};

/// Page size used for data segments.
pub const PAGE_SIZE: usize = 4096;

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
    /// Device-request interrupts the device offers (irq info count of `VFIO_PCI_REQ_IRQ_INDEX`).
    pub req_count: u32,
    /// Whether each queue has its own vector (else all share vector 1).
    pub per_vq_vectors: bool,
    /// Whether the notify area is mmapped.
    pub notify_mapped: bool,
    /// The virtqueue layout negotiated (packed when VIRTIO_F_RING_PACKED was accepted).
    pub ring: RingLayout,
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
pub(super) struct Pending {
    pub(super) queue: u16,
    /// The opcode of a FUSE request laid out by [`FsDriver::submit`] (its reply is checked as
    /// Linux's `virtio_fs_verify_response` does); `None` for raw chains.
    pub(super) fuse_opcode: Option<u32>,
    pub(super) in_buf: DmaBuf,
    pub(super) out_buf: Option<DmaBuf>,
    pub(super) out_len: usize,
}

pub(super) struct QueueState {
    pub(super) vq: Virtqueue,
    pub(super) notify_addr: u64,
    pub(super) vector: u16,
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
    pub(super) transport: Transport,
    pub(super) mem: GuestRam,
    pub(super) opts: DriverOptions,
    pub(super) facts: DeviceFacts,
    pub(super) queues: Vec<QueueState>,
    pub(super) eventfds: Vec<EventFd>,
    /// The device-request interrupt's eventfd, when one was set.
    pub(super) req_eventfd: Option<EventFd>,
    pub(super) epoll: Epoll,
    pub(super) pending: HashMap<u64, Pending>,
    pub(super) ready: VecDeque<Completion>,
    pub(super) next_unique: u64,
    pub(super) next_rr: u16,
    pub(super) current_queue: u16,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) pid: u32,
    pub(super) init: Option<InitInfo>,
    pub(super) stats: DriverStats,
    pub(super) completed_per_queue: Vec<u64>,
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

impl FsDriver {
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

    /// The addresses of queue `q`'s rings (split: descriptor table, avail ring, used ring;
    /// packed: descriptor ring, driver and device event areas), for tests that write them.
    pub fn queue_addrs(&self, q: u16) -> (u64, u64, u64) {
        self.queues[usize::from(q)].vq.addrs()
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

    pub(super) fn pick_queue(&mut self) -> u16 {
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

    pub(super) fn alloc_unique(&mut self) -> u64 {
        // Linux: FUSE_REQ_ID_STEP 2; bit 0 marks INTERRUPT requests.
        self.next_unique += 2;
        self.next_unique
    }

    pub(super) fn check_queue(&self, q: u16) -> Result<()> {
        if usize::from(q) >= self.queues.len() {
            return Err(DriverError::Unsupported(format!("no queue {q}")));
        }
        Ok(())
    }

    /// Where the device stands on queues `first..` (only those with requests in flight if
    /// `busy_only`), for a timeout message.
    pub(super) fn describe_queues(&self, first: usize, busy_only: bool) -> String {
        let v: Vec<String> = self.queues[first..]
            .iter()
            .filter(|q| !busy_only || q.vq.in_flight() > 0)
            .map(|q| q.vq.describe(&self.mem))
            .collect();
        v.join("; ")
    }

    pub(super) fn in_header(&self, opcode: u32, unique: u64, nodeid: u64, len: usize) -> InHeader {
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
}
