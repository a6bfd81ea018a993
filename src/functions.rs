//! Several virtio-fs functions in one daemon, served by one pool of pollers.
//!
//! A function is one device: its own vfio-user socket and control plane (a thread running
//! [`vfio_user::Server::run`]), register model, DMA table, memory snapshot, interrupts,
//! counters and backend (a RAM filesystem, a shared directory or an NFS export). What the
//! functions share is the pollers ([`PollerPool`]): each poller serves queues of several
//! functions, placed by [`PollerPool::placement`]. [`FunctionSet`] keeps the functions of a
//! daemon, by tag; the profile's `[[function]]` tables and the control socket's
//! `create_function` are both parsed by [`parse_function`] into a [`FunctionSpec`].
//!
//! The set is behind a mutex of the control path only (the control socket's thread, the
//! daemon's main thread): pollers never see it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use serde_json::{json, Value};
use virtiofs_backend::filesystem::CachePolicy;
use virtiofs_backend::nfs::fs::NfsFs;
use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::PassthroughConfig;
use virtiofs_backend::ramfs::RamFsConfig;
use virtiofs_backend::server::ServerOptions;
use virtiofs_backend::{PassthroughFs, RamFs};
use virtiofs_device::config::{Placement, Profile};
use virtiofs_device::poller::{PollerPool, RequestHandler};
use virtiofs_device::stats::{ClientState, DeviceStats};
use virtiofs_device::vfio_user::{self, Removal, StopHandle};

use crate::{remote, FuseHandler, FuseStats, PassthroughHandler, RunningDevice};

/// Reads the FUSE side's statistics of a running function.
pub type FuseStatsFn = Arc<dyn Fn() -> FuseStats + Send + Sync>;

/// Profile keys that belong to the daemon (its pollers), not to one function.
pub const POOL_KEYS: &[&str] = &["poller_cores", "polling", "idle_spin_us", "idle_sleep_us", "description"];
/// A function table's own keys (the rest are the device's and the backends' profile keys).
pub const FUNCTION_KEYS: &[&str] = &["socket_path", "tag", "shared_dir", "cache", "pollers"];

/// Why a function could not be created, found or removed.
#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    /// The function's description is wrong (the message names the key).
    #[error("{0}")]
    Invalid(String),
    /// A function with this tag exists already.
    #[error("a function with tag {0:?} exists already")]
    Exists(String),
    /// No function has this tag.
    #[error("no function with tag {0:?}")]
    NotFound(String),
    /// The function is being removed already.
    #[error("function {0:?} is being removed already")]
    Removing(String),
    /// Functions cannot be added to this daemon now.
    #[error("functions cannot be created at run time: {0}")]
    Refused(&'static str),
    /// The backend could not be set up.
    #[error("backend")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The device could not start (its socket, its control plane).
    #[error("device")]
    Device(#[from] vfio_user::ServerError),
}

/// The backend of one function.
pub enum BackendSpec {
    /// A RAM filesystem.
    Ram(RamFsConfig),
    /// A host directory (the passthrough).
    SharedDir(PassthroughConfig),
    /// An NFSv3 export.
    Remote(Box<virtiofs_backend::nfs::fs::NfsOptions>, String),
}

impl BackendSpec {
    /// `ramfs`, `passthrough` or `nfs`.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendSpec::Ram(_) => "ramfs",
            BackendSpec::SharedDir(_) => "passthrough",
            BackendSpec::Remote(..) => "nfs",
        }
    }
}

/// Everything needed to start one function.
pub struct FunctionSpec {
    /// Its vfio-user socket.
    pub socket_path: PathBuf,
    /// The device's shape (its tag included).
    pub profile: Profile,
    /// Its backend.
    pub backend: BackendSpec,
    /// The pool's pollers it may use (`None`: all of them).
    pub pollers: Option<Vec<usize>>,
}

/// What a function table inherits from the daemon: its device keys (the profile file's,
/// without the daemon-wide ones) and the FUSE options of its command line.
#[derive(Clone, Default)]
pub struct Defaults {
    /// The profile file's device and backend keys, over which a function's own keys go.
    pub table: toml::Table,
    /// `--no-xattr`, `--no-readdirplus`.
    pub server_options: ServerOptions,
    /// POSIX ACLs offered.
    pub posix_acl: bool,
    /// `--cache`, when given.
    pub cache: Option<CachePolicy>,
    /// `--io-mode` for shared directories.
    pub io_mode: IoMode,
}

impl Defaults {
    /// The defaults of a daemon whose profile file's table is `file` (its `[[function]]` array
    /// and daemon-wide keys are left out here).
    pub fn from_profile_table(file: &toml::Table) -> Self {
        let table = file
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "function" | "remote") && !POOL_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Defaults { table, posix_acl: true, ..Defaults::default() }
    }
}

/// Parses one function's table (a profile's `[[function]]` entry, or `create_function`'s
/// params): `socket_path` and `tag` (both required), a backend (`shared_dir`, or `remote` with
/// the `nfs_*` keys, else a RAM filesystem with `ramfs_size` and `ramfs_inodes`), `cache`,
/// `pollers` (indices into the daemon's `poller_cores`), and any device key of the profile
/// (`request_queues`, `queue_size`, `max_dma_windows`, ...), which override the daemon's.
pub fn parse_function(defaults: &Defaults, mut t: toml::Table) -> Result<FunctionSpec, FunctionError> {
    let invalid = |s: String| FunctionError::Invalid(s);
    if let Some(k) = t.keys().find(|k| POOL_KEYS.contains(&k.as_str())) {
        return Err(invalid(format!("`{k}` is daemon-wide (the pollers are shared): not a function key")));
    }
    let string = |t: &mut toml::Table, key: &str| -> Result<Option<String>, FunctionError> {
        match t.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(FunctionError::Invalid(format!("`{key}` must be a string"))),
        }
    };
    let socket_path =
        string(&mut t, "socket_path")?.ok_or_else(|| invalid("`socket_path` is required".into()))?;
    let tag = string(&mut t, "tag")?.ok_or_else(|| invalid("`tag` is required".into()))?;
    let shared_dir = string(&mut t, "shared_dir")?;
    let cache = match string(&mut t, "cache")? {
        None => defaults.cache,
        Some(c) => Some(c.parse::<CachePolicy>().map_err(|e| invalid(format!("`cache`: {e}")))?),
    };
    let pollers = match t.remove("pollers") {
        None => None,
        Some(v) => {
            let p: Vec<usize> =
                v.try_into().map_err(|_| invalid("`pollers` must be a list of poller indices".into()))?;
            Some(p)
        }
    };
    let mut table = defaults.table.clone();
    table.remove("tag");
    for (k, v) in t {
        table.insert(k, v);
    }
    table.insert("tag".into(), toml::Value::String(tag));
    let text = toml::to_string(&table).map_err(|e| invalid(e.to_string()))?;
    let (profile, ram_keys, remote_keys) =
        remote::split_profile(&text, "function").map_err(|e| invalid(crate::error_chain(&e)))?;
    let remote_url = remote_keys.remote.clone();
    let backend = match (shared_dir, remote_url) {
        (Some(_), Some(_)) => return Err(invalid("`shared_dir` and `remote` exclude each other".into())),
        (Some(dir), None) => {
            let mut cfg = PassthroughConfig::new(&dir);
            cfg.cache = cache.unwrap_or(cfg.cache);
            cfg.posix_acl = defaults.posix_acl;
            BackendSpec::SharedDir(cfg)
        }
        (None, Some(url)) => {
            let o = remote::nfs_options(&url, &remote_keys, cache)
                .map_err(|e| invalid(crate::error_chain(&e)))?;
            BackendSpec::Remote(Box::new(o), url)
        }
        (None, None) => {
            let mut cfg = RamFsConfig::default();
            cfg.cache = cache.unwrap_or(cfg.cache);
            cfg.capacity = ram_keys.ramfs_size.unwrap_or(cfg.capacity);
            cfg.max_inodes = ram_keys.ramfs_inodes.unwrap_or(cfg.max_inodes);
            cfg.posix_acl = defaults.posix_acl;
            BackendSpec::Ram(cfg)
        }
    };
    Ok(FunctionSpec { socket_path: PathBuf::from(socket_path), profile, backend, pollers })
}

/// A function's backend, set up: its request handler, its FUSE statistics and what
/// `get_device` says of it.
pub struct Built {
    /// The handler the function's queues are served by.
    pub handler: Arc<dyn RequestHandler>,
    /// Its FUSE statistics.
    pub fuse: FuseStatsFn,
    /// The backend as `get_device` reports it.
    pub config: Value,
    /// `ramfs`, `passthrough` or `nfs`.
    pub kind: &'static str,
}

impl Built {
    /// Sets up `backend` (mounts an NFS export, opens a shared directory: on the calling thread,
    /// blocking). A shared directory is opened through `proc_fd` (the `/proc/self/fd` of a
    /// sandbox) when given.
    pub fn new(
        backend: BackendSpec,
        options: ServerOptions,
        io_mode: IoMode,
        proc_fd: Option<std::os::fd::OwnedFd>,
    ) -> Result<Built, FunctionError> {
        let failed = |e: Box<dyn std::error::Error + Send + Sync>| FunctionError::Backend(e);
        Ok(match backend {
            BackendSpec::Ram(cfg) => {
                let config = json!({"kind": "ramfs", "cache": cfg.cache.to_string(), "size": cfg.capacity, "inodes": cfg.max_inodes});
                let h = Arc::new(FuseHandler::with_options(RamFs::with_config(cfg), options));
                let s = h.clone();
                Built { handler: h, fuse: Arc::new(move || s.stats()), config, kind: "ramfs" }
            }
            BackendSpec::SharedDir(cfg) => {
                let config = json!({"kind": "passthrough", "shared_dir": cfg.root, "cache": cfg.cache.to_string(), "io_mode": format!("{io_mode:?}").to_lowercase()});
                let fs = match proc_fd {
                    Some(fd) => PassthroughFs::with_proc_fd(cfg, fd),
                    None => PassthroughFs::new(cfg),
                }
                .map_err(|e| failed(Box::new(e)))?;
                let h = Arc::new(PassthroughHandler::with_options(fs, io_mode, options));
                let s = h.clone();
                Built { handler: h, fuse: Arc::new(move || s.stats()), config, kind: "passthrough" }
            }
            BackendSpec::Remote(opts, url) => {
                let config = json!({"kind": "nfs", "url": url, "cache": opts.cache.to_string()});
                let fs = NfsFs::connect(*opts).map_err(|e| failed(Box::new(e)))?;
                let h = Arc::new(FuseHandler::with_options(fs, options));
                let s = h.clone();
                let stats = move || FuseStats { nfs: Some(s.server().filesystem().stats()), ..s.stats() };
                Built { handler: h, fuse: Arc::new(stats), config, kind: "nfs" }
            }
        })
    }
}

/// What `list_functions` says of one function.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionInfo {
    /// Its mount tag.
    pub tag: String,
    /// Its vfio-user socket.
    pub socket_path: PathBuf,
    /// `ramfs`, `passthrough` or `nfs`.
    pub backend: String,
    /// Request queues and queue size.
    pub request_queues: u16,
    /// Largest queue size.
    pub queue_size: u16,
    /// Which pool poller serves which queue (index = queue).
    pub queue_pollers: Vec<usize>,
    /// Its client.
    pub client: ClientState,
    /// Bytes the function's own structures take (counters and histograms, the queues' slot
    /// arrays at their largest size), apart from its backend's data and the client's memory.
    pub memory_bytes: u64,
    /// `serving`, or `removing` while `delete_function` waits for its client to let it go.
    pub state: FunctionState,
}

/// Where a function is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FunctionState {
    /// It serves its socket.
    Serving,
    /// `delete_function` asked its client to let it go and waits (at most `remove_timeout_ms`).
    Removing,
}

/// A function removed by [`FunctionSet::delete`]: its final statistics and how its client
/// let it go.
#[derive(Debug)]
pub struct Removed {
    /// The device's final statistics.
    pub stats: DeviceStats,
    /// How the removal ended.
    pub how: Removal,
}

struct Function {
    tag: String,
    socket: PathBuf,
    backend: &'static str,
    profile: Profile,
    placement: Placement,
    /// The running device; `None` once [`FunctionSet::delete`] took it to remove it.
    device: Option<RunningDevice>,
    stop: StopHandle,
    fuse: FuseStatsFn,
    config: Value,
}

impl Function {
    fn info(&self) -> FunctionInfo {
        FunctionInfo {
            tag: self.tag.clone(),
            socket_path: self.socket.clone(),
            backend: self.backend.into(),
            request_queues: self.profile.request_queues,
            queue_size: self.profile.queue_size,
            queue_pollers: (0..=self.profile.request_queues).map(|q| self.placement.poller_of(q)).collect(),
            client: self.stop.client(),
            memory_bytes: memory_per_function(&self.profile, &self.placement),
            state: if self.device.is_some() { FunctionState::Serving } else { FunctionState::Removing },
        }
    }
}

/// The fixed memory of one function's device structures: its counters (a block per pool
/// poller with the latency histograms of every class) and, per queue, the slot array of
/// request start times; the backend's data and the client's memory are not counted.
pub fn memory_per_function(profile: &Profile, placement: &Placement) -> u64 {
    const CLASSES: u64 = 4;
    const BUCKET: u64 = 8;
    let histograms =
        if profile.latency_histograms { virtiofs_device::stats::BUCKETS as u64 * BUCKET } else { 0 };
    let per_poller = CLASSES * (128 + histograms) + 256 * 8 + 128 * 4;
    let queues = u64::from(profile.request_queues) + 1;
    let per_queue = 128 + 128 + u64::from(profile.queue_size) * 16;
    placement.pool_pollers as u64 * per_poller + queues * per_queue
}

/// The functions of a daemon and the pollers they share.
pub struct FunctionSet {
    pool: PollerPool,
    inner: Mutex<Inner>,
}

struct Inner {
    functions: Vec<Function>,
    /// Placement rotation of the next function.
    next_ordinal: usize,
    /// What a run-time function inherits; `None` when the daemon cannot make new ones.
    defaults: Option<Defaults>,
    /// Why new functions are refused (when `defaults` is `None`).
    refused: &'static str,
}

impl FunctionSet {
    /// A set of functions on `pool`; `defaults`: what `create_function` inherits (`None`
    /// refuses it, saying `why`: a confined daemon can bind no new socket).
    pub fn new(pool: PollerPool, defaults: Option<Defaults>, why: &'static str) -> Self {
        let inner = Inner { functions: Vec::new(), next_ordinal: 0, defaults, refused: why };
        FunctionSet { pool, inner: Mutex::new(inner) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared pollers.
    pub fn pool(&self) -> &PollerPool {
        &self.pool
    }

    /// Starts a function on `listener` (bound earlier) whose requests go to `handler`; `fuse`
    /// reads its FUSE statistics, `config` is what `get_device` reports of it.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &self,
        listener: vfio_user::Listener,
        profile: Profile,
        handler: Arc<dyn RequestHandler>,
        fuse: FuseStatsFn,
        backend: &'static str,
        pollers: Option<&[usize]>,
        config: Value,
    ) -> Result<FunctionInfo, FunctionError> {
        let mut inner = self.lock();
        let tag = profile.tag.clone();
        if inner.functions.iter().any(|f| f.tag == tag) {
            return Err(FunctionError::Exists(tag));
        }
        if let Some(p) = pollers.and_then(|p| p.iter().find(|&&p| p >= self.pool.pollers())) {
            return Err(FunctionError::Invalid(format!(
                "`pollers`: poller {p} does not exist (the daemon has {})",
                self.pool.pollers()
            )));
        }
        let placement = self.pool.placement(profile.queue_mapping, pollers, inner.next_ordinal);
        let socket = listener.path().to_path_buf();
        let device =
            RunningDevice::start_on_pool(listener, profile.clone(), handler, &self.pool, placement.clone())?;
        inner.next_ordinal += 1;
        let stop = device.stop_handle();
        let f =
            Function { tag, socket, backend, profile, placement, device: Some(device), stop, fuse, config };
        let info = f.info();
        log::info!(
            "function {:?} on {}: {} backend, queues on pollers {:?}",
            info.tag,
            info.socket_path.display(),
            info.backend,
            info.queue_pollers
        );
        inner.functions.push(f);
        Ok(info)
    }

    /// Creates and starts the function `spec` describes: binds its socket, sets up its backend.
    pub fn create(
        &self,
        spec: FunctionSpec,
        options: ServerOptions,
        io_mode: IoMode,
    ) -> Result<FunctionInfo, FunctionError> {
        if self.contains(&spec.profile.tag) {
            return Err(FunctionError::Exists(spec.profile.tag.clone()));
        }
        let listener = vfio_user::Listener::bind(&spec.socket_path)?;
        let built = Built::new(spec.backend, options, io_mode, None)?;
        self.start_built(listener, spec.profile, spec.pollers.as_deref(), spec.socket_path, built)
    }

    /// Starts a function whose socket is bound and whose backend is set up.
    pub fn start_built(
        &self,
        listener: vfio_user::Listener,
        profile: Profile,
        pollers: Option<&[usize]>,
        socket_path: PathBuf,
        built: Built,
    ) -> Result<FunctionInfo, FunctionError> {
        let config = json!({"profile": profile, "backend": built.config, "socket": socket_path});
        self.start(listener, profile, built.handler, built.fuse, built.kind, pollers, config)
    }

    /// `create_function`: parses `params` over the daemon's defaults and starts the function.
    pub fn create_from(&self, params: toml::Table) -> Result<FunctionInfo, FunctionError> {
        let defaults = {
            let inner = self.lock();
            inner.defaults.clone().ok_or(FunctionError::Refused(inner.refused))?
        };
        let mut spec = parse_function(&defaults, params)?;
        if let BackendSpec::SharedDir(cfg) = &mut spec.backend {
            if !cfg.root.is_absolute() {
                return Err(FunctionError::Invalid("`shared_dir` must be an absolute path".into()));
            }
        }
        self.create(spec, defaults.server_options, defaults.io_mode)
    }

    /// Whether a function has this tag.
    pub fn contains(&self, tag: &str) -> bool {
        self.lock().functions.iter().any(|f| f.tag == tag)
    }

    /// Removes the function `tag` as a surprise removal would, but asked first: its socket
    /// takes no new client, its client is sent the device-request interrupt (QEMU then unplugs
    /// the device from the guest, whose driver resets it) and is served until it hangs up, or
    /// disconnected once the function's `remove_timeout_ms` ran out (at once if it set no
    /// device-request eventfd); then its queues leave the pollers and its socket file goes.
    /// Blocks for as long; meanwhile [`Self::list`] shows it `removing`. Returns its final
    /// statistics and how it went.
    pub fn delete(&self, tag: &str) -> Result<Removed, FunctionError> {
        let device = {
            let mut inner = self.lock();
            let f = inner.functions.iter_mut().find(|f| f.tag == tag);
            let f = f.ok_or_else(|| FunctionError::NotFound(tag.into()))?;
            f.device.take().ok_or_else(|| FunctionError::Removing(tag.into()))?
        };
        // Outside the lock: the others stay listable while this one's client lets it go.
        let result = device.remove();
        self.lock().functions.retain(|f| f.tag != tag);
        let (stats, how) = result?;
        log::info!("function {tag:?} removed: {how}");
        Ok(Removed { stats, how })
    }

    /// Every function, in creation order.
    pub fn list(&self) -> Vec<FunctionInfo> {
        self.lock().functions.iter().map(Function::info).collect()
    }

    /// The tags, in creation order.
    pub fn tags(&self) -> Vec<String> {
        self.lock().functions.iter().map(|f| f.tag.clone()).collect()
    }

    /// The running device of `tag` (the first function with `None`), with its FUSE statistics
    /// and configuration.
    pub fn get(&self, tag: Option<&str>) -> Option<(StopHandle, FuseStatsFn, Value)> {
        let inner = self.lock();
        let f = match tag {
            None => inner.functions.first(),
            Some(t) => inner.functions.iter().find(|f| f.tag == t),
        }?;
        Some((f.stop.clone(), f.fuse.clone(), f.config.clone()))
    }

    /// The statistics of `tag` (the first function with `None`).
    pub fn stats(&self, tag: Option<&str>) -> Option<(DeviceStats, FuseStats)> {
        self.get(tag).map(|(d, fuse, _)| (d.stats(), fuse()))
    }

    /// Stops every function; returns each one's tag and final statistics.
    pub fn stop_all(&self) -> Vec<(String, Result<DeviceStats, vfio_user::ServerError>, FuseStats)> {
        let all = std::mem::take(&mut self.lock().functions);
        all.into_iter()
            .map(|f| {
                // One being removed is stopped here; the removal waiting for it then ends.
                let r = match f.device {
                    Some(d) => d.stop(),
                    None => {
                        f.stop.stop();
                        Ok(f.stop.stats())
                    }
                };
                (f.tag, r, (f.fuse)())
            })
            .collect()
    }

    /// The socket paths of the functions.
    pub fn sockets(&self) -> Vec<PathBuf> {
        self.lock().functions.iter().map(|f| f.socket.clone()).collect()
    }

    /// Whether `path` is one of the functions' sockets.
    pub fn serves(&self, path: &Path) -> bool {
        self.lock().functions.iter().any(|f| f.socket == path)
    }
}
