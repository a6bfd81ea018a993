//! A function's backend set up from its [`BackendSpec`], in two steps: [`open`] on the host's
//! terms before the daemon binds a socket or confines itself (a shared directory checked, an
//! NFS export mounted: a daemon that cannot serve leaves no socket), then [`build`] once it is
//! confined (a shared directory opened again inside the sandbox's root), into the request
//! handler the function's queues are served by.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use virtiofs_backend::filesystem::CachePolicy;
use virtiofs_backend::nfs::fs::{NfsError, NfsFs, NfsOptions};
use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::{DescriptorShare, PassthroughConfig, Policy, SetupError};
use virtiofs_backend::ramfs::RamFsConfig;
use virtiofs_backend::server::ServerOptions;
use virtiofs_backend::session_record::SessionRecord;
use virtiofs_backend::{PassthroughFs, RamFs};
use virtiofs_device::poller::RequestHandler;

use crate::settings::{BackendSpec, FunctionSpec};
use crate::{FuseHandler, FuseStats};

/// Reads the FUSE side's statistics of a running function.
pub type FuseStatsFn = Arc<dyn Fn() -> FuseStats + Send + Sync>;

/// Why a backend could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The shared directory cannot be served.
    #[error("shared_dir {dir}")]
    SharedDir {
        /// The directory, as the host names it.
        dir: String,
        /// Why.
        #[source]
        source: SetupError,
    },
    /// The NFS export cannot be mounted.
    #[error("remote {url}")]
    Remote {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: NfsError,
    },
    /// The RAM filesystem's data store (a memfd) cannot be made.
    #[error("RAM filesystem: cannot make the memfd for its data")]
    Ram(#[source] std::io::Error),
    /// The record a FUSE session is kept in for a crash (a memfd) cannot be made.
    #[error("cannot make the memfd the FUSE session is kept in")]
    SessionRecord(#[source] std::io::Error),
}

impl BackendError {
    /// Whether the description is at fault (a directory that is not one), not the moment (a
    /// server that does not answer).
    pub fn is_usage(&self) -> bool {
        matches!(self, BackendError::SharedDir { .. })
    }
}

/// Makes the backend `spec` describes keep its state for a crash (`on`: the daemon is
/// supervised, issue 24) where it can: an NFS export keeps its tables in records
/// (`nfs::keep`). The others do not yet.
pub fn keep_for_crash(spec: &mut FunctionSpec, on: bool) {
    if let BackendSpec::Remote(r) = &mut spec.backend {
        r.options.keep = on;
    }
}

/// A backend opened on the host's terms ([`open`]).
pub enum Opened {
    /// A RAM filesystem of this configuration (made at [`build`]).
    Ram(RamFsConfig),
    /// A shared directory.
    SharedDir {
        /// The open directory; `None` when it is to be opened again inside a sandbox.
        fs: Option<Box<PassthroughFs>>,
        /// Its configuration (rooted on the host).
        cfg: PassthroughConfig,
        /// How READ, WRITE and FSYNC are served.
        io_mode: IoMode,
    },
    /// A mounted NFS export.
    Remote(Box<NfsFs>),
}

/// Opens `spec`'s backend on the calling thread, blocking: checks a shared directory (kept
/// open if `keep`; its nodes and handles limited to `share` of the daemon's descriptors),
/// mounts an NFS export.
pub fn open(spec: &FunctionSpec, keep: bool, share: DescriptorShare) -> Result<Opened, BackendError> {
    let posix_acl = spec.fuse.posix_acl;
    match &spec.backend {
        BackendSpec::Ram { cache, size, inodes } => {
            let mut cfg = RamFsConfig::default();
            (cfg.cache, cfg.capacity, cfg.max_inodes, cfg.posix_acl) = (*cache, *size, *inodes, posix_acl);
            Ok(Opened::Ram(cfg))
        }
        BackendSpec::SharedDir { shared_dir, cache, io_mode, refuse } => {
            let (cfg, io_mode) = (shared_config(shared_dir, *cache, *refuse, posix_acl, share), *io_mode);
            let fs = PassthroughFs::new(cfg.clone()).map_err(|source| shared(&cfg.root, source))?;
            Ok(Opened::SharedDir { fs: keep.then(|| Box::new(fs)), cfg, io_mode })
        }
        BackendSpec::Remote(r) => {
            log::info!(
                "NFS export {}, cache {}, timeout {:?}, retransmit {:?}, {} slots per poller",
                r.url,
                r.options.cache,
                r.options.timeout,
                r.options.retransmit,
                r.options.slots_per_poller
            );
            // The function's tag names the NFSv4.1 client (`client_owner`).
            let opts = NfsOptions { function: spec.tag().to_owned(), ..r.options.clone() };
            let fs =
                NfsFs::connect(opts).map_err(|source| BackendError::Remote { url: r.url.clone(), source })?;
            Ok(Opened::Remote(Box::new(fs)))
        }
    }
}

/// A shared directory's configuration (rooted on the host) and I/O mode, as `spec` describes
/// them; `None` for another backend.
pub fn passthrough_config(
    spec: &FunctionSpec,
    share: DescriptorShare,
) -> Option<(PassthroughConfig, IoMode)> {
    let BackendSpec::SharedDir { shared_dir, cache, io_mode, refuse } = &spec.backend else {
        return None;
    };
    Some((shared_config(shared_dir, *cache, *refuse, spec.fuse.posix_acl, share), *io_mode))
}

fn shared_config(
    dir: &Path,
    cache: CachePolicy,
    policy: Policy,
    posix_acl: bool,
    share: DescriptorShare,
) -> PassthroughConfig {
    let mut cfg = PassthroughConfig::new(dir);
    (cfg.cache, cfg.policy, cfg.posix_acl, cfg.descriptor_share) = (cache, policy, posix_acl, share);
    cfg
}

fn shared(dir: &Path, source: SetupError) -> BackendError {
    BackendError::SharedDir { dir: dir.display().to_string(), source }
}

/// A function's backend, set up: its request handler and its FUSE statistics.
pub struct Built {
    /// The handler the function's queues are served by.
    pub handler: Arc<dyn RequestHandler>,
    /// Its FUSE statistics.
    pub fuse: FuseStatsFn,
    /// The descriptors a shared directory's nodes and handles may take (0 for other backends).
    pub descriptors: u64,
    /// What gives its state to a live update's new process (`None`: this backend cannot be
    /// handed over yet).
    pub saver: Option<Arc<dyn crate::update::SavesState>>,
}

/// Builds the handler of a function whose FUSE server offers `options` over what [`open`]
/// opened. A shared directory that was not kept is opened at `inside` (its path inside the
/// sandbox's root) through the sandbox's `/proc/self/fd`, or again on the host without one.
pub fn build(
    options: ServerOptions,
    opened: Opened,
    inside: Option<(&Path, OwnedFd)>,
) -> Result<Built, BackendError> {
    Ok(match opened {
        Opened::Ram(cfg) => {
            let fs = RamFs::try_with_config(cfg).map_err(BackendError::Ram)?;
            let h = Arc::new(FuseHandler::with_options(fs, options));
            let s = h.clone();
            Built { handler: h.clone(), fuse: Arc::new(move || s.stats()), descriptors: 0, saver: Some(h) }
        }
        Opened::SharedDir { fs, mut cfg, io_mode } => {
            let fs = match (fs, inside) {
                (Some(fs), _) => *fs,
                (None, Some((path, proc_fd))) => {
                    cfg.root = path.to_path_buf();
                    PassthroughFs::with_proc_fd(cfg.clone(), proc_fd).map_err(|e| shared(&cfg.root, e))?
                }
                (None, None) => PassthroughFs::new(cfg.clone()).map_err(|e| shared(&cfg.root, e))?,
            };
            let mut fs = fs;
            fs.set_io_mode(io_mode);
            let descriptors = fs.descriptor_limit();
            let h = Arc::new(FuseHandler::with_options(fs, options));
            let s = h.clone();
            let stats = move || FuseStats { io: Some(s.server().filesystem().engine_stats()), ..s.stats() };
            Built { handler: h.clone(), fuse: Arc::new(stats), descriptors, saver: Some(h) }
        }
        Opened::Remote(fs) => {
            // Its tables are kept for a crash: its FUSE session too.
            let record = match fs.kept_files() {
                Some(_) => Some(SessionRecord::new().map_err(BackendError::SessionRecord)?),
                None => None,
            };
            let h = Arc::new(FuseHandler::with_options(*fs, options));
            if let Some(r) = record {
                h.server().keep_session(Arc::new(r));
            }
            let s = h.clone();
            let stats = move || FuseStats { nfs: Some(s.server().filesystem().stats()), ..s.stats() };
            Built { handler: h.clone(), fuse: Arc::new(stats), descriptors: 0, saver: Some(h) }
        }
    })
}
