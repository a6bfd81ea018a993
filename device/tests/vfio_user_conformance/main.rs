//! Protocol conformance of the device's vfio-user server: one test per vfio-user command and per
//! malformed variant, each driving a real server over a real socket and checking the errno in the
//! reply, then that the same connection still serves a valid request.
//!
//! The client side is the host driver model (`virtiofs_tools`): its vfio-user client with the raw
//! send/receive API, its wire structures, and for the data path its `FsDriver` and virtqueues.
//! Nothing here encodes a message with the device's own wire structures, so a layout mistake in
//! either implementation fails a test instead of cancelling out. The device side is the real
//! `Server` with a `RequestHandler` of the test's own ([`common::TestHandler`]).
//!
//! - [`framing`]: VERSION, headers, sizes, unknown commands, posted writes, garbage, clients;
//! - [`regions`]: DEVICE_GET_INFO, region info, region access, DEVICE_RESET;
//! - [`dma`]: DMA_MAP/DMA_UNMAP rules, file descriptors, pipelined maps;
//! - [`irqs`]: IRQ info and DEVICE_SET_IRQS;
//! - [`data_path`]: requests through a virtqueue, interrupts, a corrupt ring, DMA_UNMAP waiting for
//!   in-flight requests, asynchronous and waiting engines, a panicking handler;
//! - [`handover`]: a running server hands its function over to another (live update) under a
//!   connected driver.

mod common;
mod data_path;
mod dma;
mod framing;
mod handover;
mod irqs;
mod regions;
