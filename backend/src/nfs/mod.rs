//! The remote backend's NFS client (NFSv3 and NFSv4.1): our own, on the pollers' non-blocking
//! sockets.
//!
//! [`wire`] has the codecs (XDR, ONC RPC with AUTH_SYS, NFSv3, MOUNT v3, portmapper), each
//! encoding straight into a preallocated buffer and decoding in place from a received one;
//! [`conn`] is one non-blocking TCP connection (record marking, XIDs over a slot table,
//! retransmission, reconnection, timeouts) owned by one poller, carrying NFSv3 or NFSv4.1;
//! [`session`] is an NFSv4.1 session driven over such a connection; [`setup`] has the blocking
//! start-up calls of the control thread (portmapper, MOUNT); [`url`] parses `nfs://` URLs.
//!
//! The backend on top: [`fs`] ([`NfsFs`], the `FileSystem`, and its start-up, with
//! `start41`, NFSv4.1's), [`engine`] (the per-poller engine that maps each FUSE request onto
//! NFSv3 calls), [`engine41`] (the same onto NFSv4.1 COMPOUNDs over a session per poller), [`shared`] (the state the
//! filesystem lends the engines), [`nodes`] (node ids and open handles), [`unstable`] (the
//! UNSTABLE write replay store) and `convert` (NFS attributes, statuses and credentials as the
//! filesystem's types).
//!
//! The modules use each other in one direction only: `fs` uses `engine` and `engine41`, all use
//! `shared` and `convert`, and those use only the modules below them (`start41`, `nodes`,
//! `unstable`, `setup`, `conn`, `session`, `wire`), so no two modules here depend on each other.

pub mod conn;
mod convert;
pub mod engine;
pub mod engine41;
pub mod fs;
pub mod keep;
pub mod locks41;
pub mod nodes;
pub mod session;
pub mod setup;
pub mod shared;
mod start41;
pub mod state;
pub mod unstable;
pub mod url;
pub mod wire;

pub use fs::{NfsError, NfsFs, NfsOptions, NfsStats, SessionTotals};
pub use start41::Start41Error;
