//! The driver's options ([`DriverOptions`]) and the queue-full policies of its closed loop
//! ([`QueueFullPolicy`]).

use std::time::Duration;

use crate::virtqueue::RingLayout;

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
    /// The virtqueue layout: [`RingLayout::Packed`] requires VIRTIO_F_RING_PACKED (bring-up
    /// fails with [`DriverError::FeatureNotOffered`](super::DriverError::FeatureNotOffered) if
    /// the device does not offer it); [`RingLayout::Split`] (the default) never negotiates it.
    pub ring: RingLayout,
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
    /// Set an eventfd for the device-request interrupt (vfio's `VFIO_PCI_REQ_IRQ_INDEX`) when
    /// the device offers one, as QEMU's `vfio-user-pci` does at realize: the device signals it
    /// when it asks to be let go ([`FsDriver::removal_requested`](super::FsDriver::removal_requested)).
    pub request_irq: bool,
    /// Size BARs through config space (all-ones writes) and compare with the region sizes.
    pub check_bar_sizing: bool,
    /// Use the mmapped notify area when the device offers one.
    pub mmap_notify: bool,
    /// Spread requests round-robin over the request queues (else use
    /// [`FsDriver::use_queue`](super::FsDriver::use_queue)).
    pub spread_requests: bool,
    /// Timeout for vfio-user replies and for FUSE completions.
    pub timeout: Duration,
    /// What [`FsDriver::run_closed_loop`](super::FsDriver::run_closed_loop) does with a request
    /// whose virtqueue is full (the one-request calls and
    /// [`FsDriver::submit`](super::FsDriver::submit) return
    /// [`QueueError::Full`](crate::virtqueue::QueueError::Full) instead).
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
            ring: RingLayout::Split,
            event_idx: true,
            indirect_desc: true,
            use_interrupts: false,
            posted_writes: true,
            reset_on_connect: true,
            request_irq: true,
            check_bar_sizing: true,
            mmap_notify: true,
            spread_requests: false,
            timeout: Duration::from_secs(5),
            queue_full: QueueFullPolicy::default(),
        }
    }
}
