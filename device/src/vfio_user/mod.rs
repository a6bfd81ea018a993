//! The vfio-user adapter: the only part of the device that knows sockets.
//!
//! [`Server`] listens on a unix socket, serves one client at a time on a `mio` event loop (the
//! control plane), and translates vfio-user messages into calls on the device's control-plane
//! state ([`crate::control::DeviceState`]: registers, DMA table, interrupts, pollers). See
//! `server.rs` for the framing, `commands.rs` for the per-command rules, `wire.rs` for the format and `removal.rs` for how a
//! function is removed at run time (the device-request interrupt); [`socket_file`] binds a
//! socket path no live server holds and removes what a bind made; [`handover`] moves a running
//! server's function to another server (live update: `StopHandle::hand_over`,
//! `Server::take_over`).

mod commands;
pub mod handover;
mod removal;
mod server;
pub mod socket_file;
pub mod wire;

pub use removal::Removal;
pub use server::{Listener, Server, ServerError, StopHandle};
