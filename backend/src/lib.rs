//! The FUSE layer of the virtio-fs device: it turns one request, given as the guest buffers of a
//! descriptor chain, into a filesystem operation and writes the reply back into the chain.
//!
//! Layers, bottom up: [`abi`] (wire structs and the protocol's limits, the only byte-casting
//! code), [`io`] (copying cursors over guest buffers), [`filesystem`] (the
//! [`filesystem::FileSystem`] trait, its plain types and, in [`filesystem::seam`], the
//! asynchronous seam through which a filesystem may complete any operation later), [`request`] (the decoder: one typed
//! [`request::Request`] per FUSE request, every untrusted argument checked), [`server`] (executes
//! decoded requests and encodes replies; it keeps the advisory locks of every backend in
//! [`locks`] and parks SETLKW requests that must wait, which a poller's engine keeps in
//! [`server::waits`]), [`ramfs`] (an in-memory POSIX filesystem) and [`passthrough`] (a host directory,
//! confined beneath it). Nothing here knows about PCI, virtqueues or vfio-user.
#![deny(missing_docs)]

pub mod abi;
pub mod filesystem;
pub mod io;
pub mod locks;
pub mod nfs;
pub mod passthrough;
pub mod ramfs;
pub mod request;
pub mod server;
pub mod types;

pub use passthrough::PassthroughFs;
pub use ramfs::RamFs;
pub use server::Server;
