//! The vfio-user adapter: the only part of the device that knows sockets.
//!
//! [`Server`] listens on a unix socket, serves one client at a time on a `mio` event loop (the
//! control plane), and translates vfio-user messages into calls on the PCI register model, the DMA
//! table and the pollers. See `server.rs` for the per-command rules and `wire.rs` for the format.

mod server;
pub mod wire;

pub use server::{Listener, Server, ServerError, StopHandle};
