//! The FUSE layer of the virtio-fs device: it turns one request, given as the guest buffers of a
//! descriptor chain, into a filesystem operation and writes the reply back into the chain.
//!
//! Layers, bottom up: [`abi`] (wire structs and the protocol's limits, the only byte-casting
//! code), [`io`] (copying cursors over guest buffers), [`types`] (the plain values every layer
//! shares and the one errno mapping, a leaf), [`locks`] (the advisory lock table of every
//! backend), [`request`] (the decoder: one typed [`request::Request`] per FUSE request, every
//! untrusted argument checked, with the argument structs the filesystem's methods take),
//! [`filesystem`] (the [`filesystem::FileSystem`] trait and, in [`filesystem::seam`], the
//! asynchronous seam through which a filesystem may complete any operation later), [`server`]
//! (the session, the reply encoder and [`server::PollerEngine`], the one driver of a request; it
//! parks SETLKW requests that must wait in [`server::waits`]), and the backends: [`ramfs`] (an
//! in-memory POSIX filesystem), [`passthrough`] (a host directory, confined beneath it) and
//! [`nfs`] (an NFSv3 client and the filesystem on it). Nothing here knows about PCI, virtqueues
//! or vfio-user.
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
pub mod session_record;
pub mod types;

pub use passthrough::PassthroughFs;
pub use ramfs::RamFs;
pub use server::Server;
