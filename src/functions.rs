//! Several virtio-fs functions in one daemon, served by one pool of pollers.
//!
//! A function is one device: its own vfio-user socket and control plane (a thread running
//! [`vfio_user::Server::run`]), register model, DMA table, memory snapshot, interrupts,
//! counters and backend (a RAM filesystem, a shared directory or an NFS export). What the
//! functions share is the pollers ([`PollerPool`]): each poller serves queues of several
//! functions, placed by [`PollerPool::placement`]. [`FunctionSet`] keeps the functions of a
//! daemon, by tag; each is started from its [`FunctionSpec`] (the daemon's start-up, or the
//! control socket's `create_function` through [`FunctionSet::create`]).
//!
//! The set is behind a mutex of the control path only (the control socket's thread, the
//! daemon's main thread): pollers never see it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use serde_json::Value;
use virtiofs_backend::passthrough::DescriptorShare;
use virtiofs_device::config::{Placement, Profile};
use virtiofs_device::poller::PollerPool;
use virtiofs_device::stats::{ClientState, DeviceStats};
use virtiofs_device::vfio_user::socket_file::SocketAccess;
use virtiofs_device::vfio_user::{self, Removal, StopHandle};

use crate::backends::{self, BackendError, Built};
use crate::settings::{Defaults, FunctionSpec, SpecError};
use crate::update::{Origin, SavesState};
use crate::{FuseStats, RunningDevice};

pub use crate::backends::FuseStatsFn;

/// Why a function could not be created, found or removed.
#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    /// The function's description is wrong (the message names the key).
    #[error("{0}")]
    Invalid(String),
    /// The function's description is wrong (the error names the key).
    #[error(transparent)]
    Spec(Box<SpecError>),
    /// A function with this tag exists already.
    #[error("a function with tag {0:?} exists already")]
    Exists(String),
    /// No function has this tag.
    #[error("no function with tag {0:?}")]
    NotFound(String),
    /// The function is being removed already.
    #[error("function {0:?} is being removed already")]
    Removing(String),
    /// `create_function` is off (no `--allow-create`), or the function uses what it does not
    /// allow.
    #[error("{0}")]
    NotAllowed(String),
    /// The daemon serves as many functions as `--max-functions` allows.
    #[error("the daemon serves {0} functions already, the most --max-functions allows")]
    TooMany(usize),
    /// Functions cannot be added to this daemon now.
    #[error("functions cannot be created at run time: {0}")]
    Refused(&'static str),
    /// A live update is handing the functions over: none is made or removed meanwhile (it
    /// would be missing from the handover, or vanish from under it).
    #[error("a live update is under way: try again when it has ended")]
    Updating,
    /// The backend could not be set up.
    #[error("backend")]
    Backend(#[from] BackendError),
    /// The device could not start (its socket, its control plane).
    #[error("device")]
    Device(#[from] vfio_user::ServerError),
}

impl From<SpecError> for FunctionError {
    fn from(e: SpecError) -> Self {
        FunctionError::Spec(Box::new(e))
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
    /// What it was started from.
    pub spec: FunctionSpec,
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
    spec: FunctionSpec,
    placement: Placement,
    /// The running device; `None` once [`FunctionSet::delete`] took it to remove it.
    device: Option<RunningDevice>,
    stop: StopHandle,
    fuse: FuseStatsFn,
    /// The descriptors its shared directory's nodes and handles may take (0: another backend).
    descriptors: u64,
    /// Where its description comes from (a live update's new process reads it again).
    origin: Origin,
    /// What gives its backend's state to a live update (`None`: it cannot be handed over).
    saver: Option<Arc<dyn SavesState>>,
}

impl Function {
    fn info(&self) -> FunctionInfo {
        let profile = &self.spec.profile;
        FunctionInfo {
            tag: self.tag.clone(),
            socket_path: self.socket.clone(),
            backend: self.spec.backend.kind().into(),
            request_queues: profile.request_queues,
            queue_size: profile.queue_size,
            queue_pollers: self.queue_pollers(),
            client: self.stop.client(),
            memory_bytes: memory_per_function(profile, &self.placement),
            state: if self.device.is_some() { FunctionState::Serving } else { FunctionState::Removing },
            spec: self.spec.clone(),
        }
    }

    fn queue_pollers(&self) -> Vec<usize> {
        (0..=self.spec.profile.request_queues).map(|q| self.placement.poller_of(q)).collect()
    }

    /// What `get_device` says of it: its spec, and where its queues run.
    fn config(&self) -> Value {
        let mut v = serde_json::to_value(&self.spec).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            m.insert("queue_pollers".into(), self.queue_pollers().into());
            let doorbells = if self.spec.profile.doorbells_on_socket() { "socket" } else { "shared" };
            m.insert("doorbells_effective".into(), doorbells.into());
        }
        v
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

/// One function as a live update sees it ([`FunctionSet::handover_list`]).
pub struct HandoverEntry {
    /// Its tag.
    pub tag: String,
    /// Its backend's kind.
    pub backend: &'static str,
    /// Where its description comes from.
    pub origin: Origin,
    /// Its running device.
    pub stop: StopHandle,
    /// Its backend's saver.
    pub saver: Option<Arc<dyn SavesState>>,
}

/// Who binds and removes the sockets of functions made at run time when this process cannot
/// reach host paths (a confined daemon: its supervisor, `crate::update`).
pub trait SocketBinder: Send + Sync {
    /// Binds `path` (checked by the binder against `--allow-create sockets=DIR`).
    fn bind(&self, path: &Path) -> Result<vfio_user::Listener, String>;
    /// Removes the socket file at `path` if no server holds it.
    fn unlink(&self, path: &Path);
}

/// Who keeps the functions' checkpoints across a crash of this process (issue 24: its
/// supervisor, `crate::update::recovery`).
pub trait Keeper: Send + Sync {
    /// Where the checkpoints of function `tag` (made as `origin` says) go.
    /// `backend`: what gives the checkpoint's backend part (`SavesState::kept`).
    fn sink(
        &self,
        tag: &str,
        origin: &Origin,
        backend: Option<Arc<dyn SavesState>>,
    ) -> Arc<dyn vfio_user::handover::CheckpointSink>;
    /// Function `tag` is gone: its checkpoint is dropped.
    fn forget(&self, tag: &str);
    /// What holds function `tag`'s backend descriptors across a crash.
    fn descriptors(&self, tag: &str) -> Arc<dyn virtiofs_backend::passthrough::keep::DescriptorKeeper>;
}

/// Makes `built`'s backend keep its state for a crash through `keeper` where it can (a
/// shared directory: its records and descriptors); a failure is logged (a crash would then
/// end the function).
fn keep_descriptors(keeper: &Arc<dyn Keeper>, tag: &str, built: &Built) {
    if let Some(saver) = &built.saver {
        if let Err(why) = saver.keep_descriptors(keeper.descriptors(tag)) {
            log::warn!("function {tag:?}: its backend is not kept for a crash: {why}");
        }
    }
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
    /// The most functions served at once (`--max-functions`).
    max: usize,
    /// A confined daemon's supervisor, binding and removing run-time functions' sockets.
    binder: Option<Arc<dyn SocketBinder>>,
    /// A live update took the handover list and has not ended (see [`Self::handover_list`]).
    updating: bool,
    /// Who keeps the checkpoints (a supervised daemon that recovers from crashes).
    keeper: Option<Arc<dyn Keeper>>,
}

impl FunctionSet {
    /// A set of functions on `pool`; `defaults`: what `create_function` inherits (`None`
    /// refuses it, saying `why`: a confined daemon can bind no new socket).
    /// At most `max` functions are served at once.
    pub fn new(pool: PollerPool, defaults: Option<Defaults>, why: &'static str, max: usize) -> Self {
        let inner = Inner {
            functions: Vec::new(),
            next_ordinal: 0,
            defaults,
            refused: why,
            max,
            binder: None,
            updating: false,
            keeper: None,
        };
        FunctionSet { pool, inner: Mutex::new(inner) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A confined daemon makes functions at run time after all, through `binder` (its
    /// supervisor binds their sockets and removes them): RAM filesystems only (its sandbox has
    /// no host directory to open and its filter may have no network), inheriting `defaults`.
    pub fn bind_through(&self, binder: Arc<dyn SocketBinder>, defaults: Defaults) {
        let mut inner = self.lock();
        if inner.defaults.is_none() {
            inner.defaults = Some(defaults);
            inner.binder = Some(binder);
        }
    }

    /// From now on every function started keeps its queues' in-flight records and gives
    /// `keeper` a checkpoint whenever its state changes (issue 24). Call before any starts.
    pub fn keep_checkpoints(&self, keeper: Arc<dyn Keeper>) {
        self.lock().keeper = Some(keeper);
    }

    /// Whether functions keep checkpoints (and their in-flight records).
    pub fn keeps_checkpoints(&self) -> bool {
        self.lock().keeper.is_some()
    }

    /// The shared pollers.
    pub fn pool(&self) -> &PollerPool {
        &self.pool
    }

    /// Starts the function `spec` describes on `listener` (bound earlier), served by `built`
    /// (its backend, set up).
    pub fn start(
        &self,
        listener: vfio_user::Listener,
        spec: FunctionSpec,
        built: Built,
    ) -> Result<FunctionInfo, FunctionError> {
        self.start_from(listener, spec, built, Origin::Start)
    }

    fn start_from(
        &self,
        listener: vfio_user::Listener,
        spec: FunctionSpec,
        built: Built,
        origin: Origin,
    ) -> Result<FunctionInfo, FunctionError> {
        let mut inner = self.lock();
        if inner.updating {
            return Err(FunctionError::Updating);
        }
        let placement = self.placement(&inner, &spec, 0)?;
        let mut profile = spec.profile.clone();
        profile.inflight_tracking |= inner.keeper.is_some();
        let mut server = vfio_user::Server::on_pool(
            listener,
            &profile,
            built.handler.clone(),
            &self.pool,
            placement.clone(),
        )?;
        if let Some(k) = &inner.keeper {
            keep_descriptors(k, spec.tag(), &built);
            server.keep_checkpoints(k.sink(spec.tag(), &origin, built.saver.clone()));
        }
        let device = RunningDevice::run_server(server, spec.tag())?;
        self.insert(&mut inner, spec, placement, device, built, origin)
    }

    /// What holds function `tag`'s backend descriptors across a crash, when functions keep
    /// checkpoints.
    pub fn descriptor_keeper(
        &self,
        tag: &str,
    ) -> Option<Arc<dyn virtiofs_backend::passthrough::keep::DescriptorKeeper>> {
        self.lock().keeper.as_ref().map(|k| k.descriptors(tag))
    }

    /// Where the queues of a new function `spec` describes go (checked against the functions
    /// there are); `after`: functions that will be placed before it.
    fn placement(
        &self,
        inner: &Inner,
        spec: &FunctionSpec,
        after: usize,
    ) -> Result<Placement, FunctionError> {
        let tag = spec.tag();
        if inner.functions.iter().any(|f| f.tag == tag) {
            return Err(FunctionError::Exists(tag.into()));
        }
        if inner.functions.len() >= inner.max {
            return Err(FunctionError::TooMany(inner.functions.len()));
        }
        let pollers = spec.pollers.as_deref();
        if let Some(p) = pollers.and_then(|p| p.iter().find(|&&p| p >= self.pool.pollers())) {
            return Err(FunctionError::Invalid(format!(
                "`pollers`: poller {p} does not exist (the daemon has {})",
                self.pool.pollers()
            )));
        }
        Ok(self.pool.placement(spec.profile.queue_mapping, pollers, inner.next_ordinal + after))
    }

    /// Where a function taken over in a live update goes, as [`Self::adopt`] will place it
    /// (functions are taken in their predecessor's order).
    pub fn place(&self, spec: &FunctionSpec, after: usize) -> Result<Placement, FunctionError> {
        self.placement(&self.lock(), spec, after)
    }

    /// Serves a function taken over in a live update ([`vfio_user::Server::take_over`] made
    /// `server` with `placement` from [`Self::place`]).
    pub fn adopt(
        &self,
        server: vfio_user::Server,
        spec: FunctionSpec,
        placement: Placement,
        built: Built,
        origin: Origin,
    ) -> Result<FunctionInfo, FunctionError> {
        let mut inner = self.lock();
        self.placement(&inner, &spec, 0)?;
        let mut server = server;
        if let Some(k) = &inner.keeper {
            keep_descriptors(k, spec.tag(), &built);
            server.keep_checkpoints(k.sink(spec.tag(), &origin, built.saver.clone()));
        }
        let device = RunningDevice::run_server(server, spec.tag())?;
        self.insert(&mut inner, spec, placement, device, built, origin)
    }

    fn insert(
        &self,
        inner: &mut Inner,
        spec: FunctionSpec,
        placement: Placement,
        device: RunningDevice,
        built: Built,
        origin: Origin,
    ) -> Result<FunctionInfo, FunctionError> {
        inner.next_ordinal += 1;
        let stop = device.stop_handle();
        let f = Function {
            tag: spec.tag().to_string(),
            socket: device.socket_path().to_path_buf(),
            spec,
            placement,
            device: Some(device),
            stop,
            fuse: built.fuse,
            descriptors: built.descriptors,
            origin,
            saver: built.saver,
        };
        let info = f.info();
        log::info!("function {:?} on {}: {}", info.tag, info.socket_path.display(), f.spec.summary());
        log::info!("function {:?}: queues on pollers {:?}", info.tag, info.queue_pollers);
        inner.functions.push(f);
        Ok(info)
    }

    /// `create_function`: reads `params` (a function table) over the daemon's defaults, sets
    /// up the backend (mounts an export, opens a directory: blocking), binds the socket and
    /// starts the function.
    pub fn create(&self, params: toml::Table) -> Result<FunctionInfo, FunctionError> {
        let defaults = {
            let inner = self.lock();
            if inner.updating {
                return Err(FunctionError::Updating);
            }
            inner.defaults.clone().ok_or(FunctionError::Refused(inner.refused))?
        };
        let Some(allowed) = &defaults.allow_create else {
            return Err(FunctionError::NotAllowed(
                "create_function is off: start the daemon with --allow-create sockets=DIR[,roots=DIR][,remotes=HOST]"
                    .into(),
            ));
        };
        {
            let inner = self.lock();
            if inner.functions.len() >= inner.max {
                return Err(FunctionError::TooMany(inner.functions.len()));
            }
        }
        let origin = Origin::Created(params.clone());
        let mut spec = FunctionSpec::from_rpc(&defaults, params)?;
        let binder = self.lock().binder.clone();
        if let Some(binder) = binder {
            // Confined: the supervisor checks the socket path (this process cannot resolve it).
            if !matches!(spec.backend, crate::settings::BackendSpec::Ram { .. }) {
                return Err(FunctionError::NotAllowed(
                    "a confined daemon makes RAM-filesystem functions only at run time (its sandbox \
                     has no host directory to share and its filter may have no network)"
                        .into(),
                ));
            }
            if self.contains(spec.tag()) {
                return Err(FunctionError::Exists(spec.tag().into()));
            }
            let crate::settings::Socket::SocketPath(path) = &spec.socket else {
                return Err(FunctionError::Invalid("`socket_path` is required".into()));
            };
            let opened = backends::open(&spec, true, self.descriptor_share())?;
            let listener = binder.bind(path).map_err(FunctionError::NotAllowed)?;
            let built = backends::build(spec.fuse.server, opened, None)?;
            return self.start_from(listener, spec, built, origin);
        }
        allowed.check(&mut spec).map_err(FunctionError::NotAllowed)?;
        backends::keep_for_crash(&mut spec, self.keeps_checkpoints());
        if self.contains(spec.tag()) {
            return Err(FunctionError::Exists(spec.tag().into()));
        }
        let crate::settings::Socket::SocketPath(path) = &spec.socket else {
            return Err(FunctionError::Invalid("`socket_path` is required".into()));
        };
        let opened = backends::open(&spec, true, self.descriptor_share())?;
        let (group, mode) = defaults.socket_access;
        let listener = vfio_user::Listener::bind_with(path, SocketAccess { group, mode })?;
        let built = backends::build(spec.fuse.server, opened, None)?;
        self.start_from(listener, spec, built, origin)
    }

    /// The daemon's defaults for functions created at run time (`None` when it makes none).
    pub fn defaults(&self) -> Option<Defaults> {
        self.lock().defaults.clone()
    }

    /// What a live update needs of every serving function, in creation order: its tag, where
    /// its description comes from, its running device's handle and its backend's saver (`None`
    /// if it cannot be handed over). `Err` names a function being removed. From now on until
    /// [`Self::handover_ended`] no function is made or removed.
    pub fn handover_list(&self) -> Result<Vec<HandoverEntry>, FunctionError> {
        let mut inner = self.lock();
        let list: Result<Vec<_>, _> = (inner.functions.iter())
            .map(|f| match f.device {
                None => Err(FunctionError::Removing(f.tag.clone())),
                Some(_) => Ok(HandoverEntry {
                    tag: f.tag.clone(),
                    backend: f.spec.backend.kind(),
                    origin: f.origin.clone(),
                    stop: f.stop.clone(),
                    saver: f.saver.clone(),
                }),
            })
            .collect();
        inner.updating = list.is_ok();
        list
    }

    /// The live update that took the handover list failed: functions may be made and removed
    /// again (after a handover that went through, this process ends refusing them).
    pub fn handover_ended(&self) {
        self.lock().updating = false;
    }

    /// The descriptor share of a shared directory created now: what the running ones leave of
    /// the budget, at most an equal part (see `DescriptorShare::Left`).
    fn descriptor_share(&self) -> DescriptorShare {
        let inner = self.lock();
        let running = inner.functions.iter().filter(|f| f.descriptors > 0);
        let (taken, running) =
            running.fold((0u64, 0usize), |(t, n), f| (t.saturating_add(f.descriptors), n + 1));
        DescriptorShare::Left { taken, running }
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
            if inner.updating {
                return Err(FunctionError::Updating);
            }
            let f = inner.functions.iter_mut().find(|f| f.tag == tag);
            let f = f.ok_or_else(|| FunctionError::NotFound(tag.into()))?;
            f.device.take().ok_or_else(|| FunctionError::Removing(tag.into()))?
        };
        // Outside the lock: the others stay listable while this one's client lets it go.
        let result = device.remove();
        let (socket, binder) = {
            let mut inner = self.lock();
            let socket = inner.functions.iter().find(|f| f.tag == tag).map(|f| f.socket.clone());
            inner.functions.retain(|f| f.tag != tag);
            if let Some(k) = &inner.keeper {
                k.forget(tag);
            }
            (socket, inner.binder.clone())
        };
        // A confined process cannot reach a socket file outside its sandbox: its supervisor
        // removes it (if it is still there and nobody serves it).
        if let (Some(b), Some(p)) = (binder, socket) {
            b.unlink(&p);
        }
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
        Some((f.stop.clone(), f.fuse.clone(), f.config()))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// From the moment a live update takes the handover list until it ends, no function is
    /// made or removed (one made then would be missing from the handover and lost at the
    /// commit); a failed update lets them be made and removed again.
    #[test]
    fn no_function_is_made_or_removed_while_an_update_hands_them_over() {
        let pool = PollerPool::spawn(&virtiofs_device::config::Profile::default()).unwrap();
        let set = FunctionSet::new(pool, None, "not in this test", 4);
        assert!(set.handover_list().unwrap().is_empty());
        assert!(matches!(set.delete("x"), Err(FunctionError::Updating)));
        assert!(matches!(set.create(toml::Table::new()), Err(FunctionError::Updating)));
        set.handover_ended();
        assert!(matches!(set.delete("x"), Err(FunctionError::NotFound(_))));
        assert!(matches!(set.create(toml::Table::new()), Err(FunctionError::Refused(_))));
    }
}
