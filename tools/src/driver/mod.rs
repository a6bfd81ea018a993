//! `FsDriver`: a userspace virtio-fs driver that brings the device up the way QEMU's
//! `vfio-user-pci` plus Linux's `virtio_fs` would, then sends FUSE requests down its queues.
//!
//! Bring-up, in order: VERSION; DEVICE_GET_INFO; GET_REGION_INFO for the PCI regions;
//! GET_IRQ_INFO (MSI-X); DMA_MAP of the driver's memfd; DEVICE_RESET (if the device says it is
//! resettable); config space: ids, BARs, capability list, virtio caps, MSI-X cap; command register
//! (memory + bus master); mmap of the notify area if offered; virtio reset, ACKNOWLEDGE, DRIVER,
//! feature negotiation (VIRTIO_F_RING_PACKED only if [`DriverOptions::ring`] asks for it, and
//! then the device must offer it, else [`DriverError::FeatureNotOffered`]), FEATURES_OK
//! (re-read); device config (tag, num_request_queues); MSI-X enable and SET_IRQS with one eventfd
//! per vector; config vector; per-queue setup (size, ring addresses, vector, notify offset);
//! queue_enable for all queues; DRIVER_OK. The queues are [`crate::virtqueue::Virtqueue`]s of
//! the negotiated layout, split or packed; nothing above them depends on which.
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
//!
//! Modules, by concern (each imports only the ones before it, never this one):
//!
//! | module | what |
//! |---|---|
//! | `options.rs` | [`DriverOptions`], [`QueueFullPolicy`] |
//! | `error.rs` | [`DriverError`] |
//! | `state.rs` | [`FsDriver`]'s fields, [`DeviceFacts`], [`Completion`], counters, accessors |
//! | `bringup.rs` | [`FsDriver::connect`] (the sequence above), [`FsDriver::shutdown`] |
//! | `io.rs` | request layout, submission, completion polling and waiting, [`FsDriver::call`] |
//! | `ops.rs` | the typed FUSE operations and their reply checks |
//! | `closed_loop.rs` | [`FsDriver::run_closed_loop`] |

mod bringup;
mod closed_loop;
mod error;
mod io;
mod ops;
mod options;
mod state;

pub use crate::virtqueue::RingLayout;
pub use bringup::VIRTIO_FS_CONFIG_LEN;
pub use closed_loop::{slot_pattern, IoDone, IoSpec, LoopConfig, LoopReport, MAX_IN_ARGS, MAX_OUT_ARGS};
pub use error::{DriverError, Result};
pub use io::verify_response;
pub use ops::{LockReq, MAX_PAGES_LIMIT};
pub use options::{DriverOptions, QueueFullPolicy, RETRY_DELAY};
pub use state::{Completion, DeviceFacts, DriverStats, FsDriver, InitInfo, PAGE_SIZE};
