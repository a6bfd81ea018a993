//! The remote backend's NFSv3 client: our own, on the pollers' non-blocking sockets.
//!
//! [`wire`] has the codecs (XDR, ONC RPC with AUTH_SYS, NFSv3, MOUNT v3, portmapper), each
//! encoding straight into a preallocated buffer and decoding in place from a received one;
//! [`conn`] is one non-blocking TCP connection (record marking, XIDs over a slot table,
//! retransmission, reconnection, timeouts) owned by one poller; [`setup`] has the blocking
//! start-up calls of the control thread (portmapper, MOUNT); [`url`] parses `nfs://` URLs.

pub mod conn;
pub mod setup;
pub mod url;
pub mod wire;
