//! virtio-fs device firmware: a poll-mode virtio-fs PCI function served over vfio-user.
//!
//! Parts, from the wire inwards (see `DESIGN.md`):
//! - [`vfio_user`]: the only module that knows sockets: the vfio-user protocol (framing,
//!   commands, replies, descriptors), mapped onto calls of the device state.
//! - [`control`]: the device's control-plane state: activation, resets, interrupts, broken
//!   queues, what each register event means; no sockets.
//! - [`pci`]: the PCI function and virtio-pci transport as a pure register model.
//! - [`memory`]: DMA windows mapped with vm-memory and published to pollers as snapshots.
//! - [`virtq`]: the device side of split and packed virtqueues (and, with the `test-utils`
//!   feature, a driver-side mock of both).
//! - [`poller`]: the data plane: threads that own virtqueues and hand requests to a
//!   [`poller::RequestHandler`].
//! - [`stats`]: per-poller counters and the [`stats::DeviceStats`] snapshot read from them.
//! - `interrupt`: the interrupt eventfds and how they are signalled without waiting.
//! - [`handover`]: a function's device state and descriptors, as handed to a process that
//!   takes it over (live update).
//! - [`config`]: hardware profiles.
#![deny(missing_docs)]

pub mod config;
pub mod control;
pub mod crash_point;
pub mod handover;
pub mod interrupt;
pub mod memory;
pub mod pci;
pub mod poller;
pub mod stats;
pub mod vfio_user;
pub mod virtq;
