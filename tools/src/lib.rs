//! Host-side tools for virtiofs-dpu: a userspace virtio-fs driver model that talks to the device
//! over vfio-user exactly as QEMU's `vfio-user-pci` and the Linux virtio-fs driver would.
//!
//! Layers, bottom up:
//!
//! - [`vfio_user`]: a vfio-user client from the spec, with typed calls that validate every reply
//!   and a raw send/receive API for conformance tests.
//! - [`memory`]: the driver's "guest RAM", a memfd shared with the device by DMA_MAP.
//! - [`pci`]: config space (ids, BARs, capability list, virtio and MSI-X capabilities).
//! - [`virtio`]: the virtio-pci modern register interface (common config, notify, device config).
//! - [`virtqueue`]: the driver side of split and packed virtqueues, distrusting the device.
//! - [`fuse_abi`]: the FUSE wire structures, written independently of the backend crate.
//! - [`driver`]: [`driver::FsDriver`], which brings the device up and sends FUSE requests, one at
//!   a time or as a closed loop with Linux's queue-full policies ([`driver::QueueFullPolicy`]).
//!
//! The driver discovers everything from the device (PCI ids, capabilities, queue counts, tag),
//! like Linux does. The crate depends on neither the device, the backend nor the root crate
//! (tools/test.sh checks it with `cargo tree`), so its wire format and FUSE ABI stay an
//! independent implementation of the specifications. The benchmark that runs the device
//! in-process is the `virtiofs-bench` crate (bench/); the tests that start a device live in the
//! root crate's tests/ and the device's conformance tests.
#![deny(missing_docs)]

pub mod wire;

pub mod driver;
pub mod fuse_abi;
pub mod memory;
pub mod pci;
pub mod vfio_user;
pub mod virtio;
pub mod virtqueue;

pub use driver::{
    Completion, DeviceFacts, DriverError, DriverOptions, FsDriver, InitInfo, IoDone, IoSpec, LockReq,
    LoopConfig, LoopReport, QueueFullPolicy,
};
pub use vfio_user::{Client, ClientError};
