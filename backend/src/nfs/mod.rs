//! The remote backend's NFSv3 client: our own, on the pollers' non-blocking sockets.
//!
//! [`wire`] has the codecs (XDR, ONC RPC with AUTH_SYS, NFSv3, MOUNT v3, portmapper), each
//! encoding straight into a preallocated buffer and decoding in place from a received one;
//! [`conn`] is one non-blocking TCP connection (record marking, XIDs over a slot table,
//! retransmission, reconnection, timeouts) owned by one poller; [`setup`] has the blocking
//! start-up calls of the control thread (portmapper, MOUNT); [`url`] parses `nfs://` URLs.
//!
//! The backend on top: [`fs`] ([`NfsFs`], the `FileSystem`, and its start-up), [`engine`] (the
//! per-poller engine that maps each FUSE request onto NFSv3 calls), [`nodes`] (node ids and
//! open handles) and [`unstable`] (the UNSTABLE write replay store).

pub mod conn;
pub mod engine;
pub mod fs;
pub mod nodes;
pub mod setup;
pub mod unstable;
pub mod url;
pub mod wire;

pub use fs::{NfsError, NfsFs, NfsOptions, NfsStats};
