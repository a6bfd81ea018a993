//! The start-up of a new serving process in a live update: instead of binding sockets and
//! building backends from nothing, it takes the old process's (`crate::update::give` is the
//! other side).
//!
//! It starts its pollers, says which state formats it reads, receives the control socket and
//! every function, and checks and builds each (the backend restored from its state, the
//! server from the device's state and descriptors) without serving any of them. Then it says
//! ready; only once the old process commits do its servers run (each resumes its queues where
//! they stood and signals their interrupts). Any failure before that is sent back as the
//! reason, and the process exits: the old one serves on.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::Duration;

use log::info;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use virtiofs_backend::nfs::fs::NfsOptions;
use virtiofs_backend::passthrough::state::PassthroughRestoring;
use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::DescriptorShare;
use virtiofs_backend::passthrough::PassthroughConfig;
use virtiofs_backend::ramfs::state::Restoring;
use virtiofs_device::config::Placement;
use virtiofs_device::poller::PollerPool;
use virtiofs_device::vfio_user::socket_file::SocketFiles;
use virtiofs_device::vfio_user::Server;

use super::{confine, serve, Serving, StartError};
use crate::backends::{self, Built, Opened};
use crate::functions::FunctionSet;
use crate::ops::control_socket::{BoundControlSocket, ControlAccess};
use crate::settings::{BackendSpec, DaemonSpec, FunctionSpec};
use crate::update::channel::Channel;
use crate::update::recovery::{CheckpointKeeper, Ending};
use crate::update::state::{self, Files, FunctionPart, Msg, Origin, PrecopyPart, FORMATS_READ};
use crate::update::{backend, Updater};

/// How long each message of the old process may take to come.
const PART_BOUND: Duration = Duration::from_secs(10);
/// How long the old process may take to commit once this one is ready.
const COMMIT_BOUND: Duration = Duration::from_secs(10);

/// How an error of [`receive`] says that the old process called the update off.
const CALLED_OFF: &str = "the old process called the update off";

/// A function built from its part, not serving yet.
struct Taken {
    server: Server,
    spec: FunctionSpec,
    placement: Placement,
    built: Built,
    origin: Origin,
}

/// Takes over from the old process at the other end of `peer`; the daemon `spec` describes is
/// this binary's reading of the same command line.
///
/// After a crash the supervisor is the other end (`recovering`: the recoveries the daemon had
/// before), replaying the checkpoints it kept ([`crate::update::recovery`]): the exchange is
/// the same; the functions' queues resume from their in-flight records, and a backend whose
/// state was not kept ([`state::BackendPart::Fresh`]) ends its requests with an error until
/// its driver resets the device. `keeper`: where this process's checkpoints go.
pub fn take_over(
    spec: DaemonSpec,
    supervisor: Channel,
    peer: Channel,
    keeper: Option<Arc<CheckpointKeeper>>,
    recovering: Option<u64>,
) -> Result<Serving, StartError> {
    let fail = |why: String| StartError::Takeover(why);
    let confined = match confine_as_started(&spec) {
        Ok(c) => c,
        Err(e) => {
            let _ = peer.send(&Msg::Refused { reason: crate::error_chain(&e) }, &[]);
            return Err(e);
        }
    };
    let started_at = std::time::Instant::now();
    let (stats_file, signals) = (confined.stats_file, confined.signals);
    virtiofs_device::interrupt::start_watchdog();
    let pool = PollerPool::spawn(&spec.pool).map_err(StartError::Pollers)?;
    // Before anything is frozen: the clock's calibration would otherwise fall in the pause.
    virtiofs_device::stats::calibrate_latency_clock();
    let why = "the daemon is confined (sandbox or seccomp) and can bind no new socket";
    let defaults = (!spec.confinement.confined()).then(|| spec.defaults.clone());
    let functions = Arc::new(FunctionSet::new(pool, defaults, why, spec.ops.max_functions));
    if let Some(k) = &keeper {
        functions.keep_checkpoints(k.clone());
    }
    let hello = Msg::Hello {
        reads: FORMATS_READ.to_vec(),
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
    };
    peer.send(&hello, &[]).map_err(|e| fail(crate::error_chain(&e)))?;
    let t = std::time::Instant::now();
    let received = receive(&spec, &confined.shares, &functions, &peer);
    log::debug!("live update: received and built every function in {:?}", t.elapsed());
    let (control, taken, (updates, recoveries_before)) = match received {
        Ok(r) => r,
        Err(why) if why.starts_with(CALLED_OFF) => return Err(StartError::CalledOff(why)),
        Err(why) => {
            let _ = peer.send(&Msg::Refused { reason: why.clone() }, &[]);
            return Err(fail(why));
        }
    };
    peer.send(&Msg::Ready, &[]).map_err(|e| fail(crate::error_chain(&e)))?;
    match peer.recv::<Msg>(COMMIT_BOUND) {
        Ok((Msg::Commit, _)) => {}
        Ok((Msg::Abort { reason }, _)) => {
            return Err(StartError::CalledOff(format!("{CALLED_OFF}: {reason}")))
        }
        Ok((other, _)) => return Err(fail(format!("expected commit, got {other:?}"))),
        Err(e) => return Err(fail(format!("no commit: {}", crate::error_chain(&e)))),
    }
    let n = taken.len();
    for s in taken.iter().filter_map(|t| t.built.saver.as_ref()) {
        s.taken_over();
    }
    for t in taken {
        let tag = t.spec.tag().to_string();
        functions
            .adopt(t.server, t.spec, t.placement, t.built, t.origin)
            .map_err(|e| StartError::Function { tag, source: Box::new(e) })?;
    }
    let (updates, recoveries) = match recovering {
        Some(r) => {
            info!("crash recovery {}: took over {n} function(s) from their checkpoints", r + 1);
            (updates, r + 1)
        }
        None => {
            info!("live update: took over {n} function(s) from the old process (update {})", updates + 1);
            (updates + 1, recoveries_before)
        }
    };
    let updater = Arc::new(Updater::new(supervisor, updates).with_recovery(keeper, recoveries));
    if spec.confinement.confined() {
        functions.bind_through(updater.clone(), spec.defaults.clone());
    }
    let updater = Some(updater);
    let config = spec.describe();
    Ok(Serving { functions, config, control, notifier: None, signals, stats_file, started_at, updater })
}

/// What the new process is once confined as the old one was started.
struct Confined {
    stats_file: Option<serve::StatsFile>,
    signals: signal_hook::iterator::Signals,
    shares: Shares,
}

/// How shared directories are opened in this process.
struct Shares {
    /// Each function's shared directory inside the sandbox's root, if it moved there.
    plan: confine::Plan,
    /// `/proc/self/fd` (the sandbox's, or the host's), to reopen nodes through; `None` in a
    /// daemon of no shared directory.
    proc_fd: Option<OwnedFd>,
    /// Shared directories the daemon started with (they split the descriptor budget).
    count: usize,
    /// This process's effective uid (the control socket's owner).
    uid: u32,
}

/// Steps 2, 3 and 5 of a start (`super::start`) with no socket to bind: the open files
/// limit, the statistics file and the signal handlers on the host's terms, then the same
/// namespaces, privileges and system-call filter as the old process (the sockets, shares'
/// nodes and DMA windows come as descriptors, so nothing needs the host's names after that).
/// On the process's only thread.
fn confine_as_started(spec: &DaemonSpec) -> Result<Confined, StartError> {
    // A socket inherited as the old process's was (`--fd`, activation through the
    // supervisor) is not served from here: the old process hands its listener over.
    for f in &spec.functions {
        if let crate::settings::Socket::Fd(fd) | crate::settings::Socket::ActivatedFd(fd) = f.socket {
            drop(crate::sys::adopt_inherited_fd(fd));
        }
    }
    super::set_nofile_limit(spec.ops.rlimit_nofile).map_err(StartError::Limit)?;
    // The descriptors to come (the supervisor counted the old process's), room made for them
    // now, while this process has one thread: a descriptor table grown later, with threads,
    // waits for an RCU grace period (6-14 ms measured) inside the guests' pause.
    if let Some(n) = std::env::var(crate::update::EXPECT_FDS).ok().and_then(|v| v.parse::<u32>().ok()) {
        std::env::remove_var(crate::update::EXPECT_FDS);
        if let Ok(null) = std::fs::File::open("/dev/null") {
            crate::sys::reserve_descriptors(&null, n.saturating_add(4096));
        }
    }
    let stats_file = spec.ops.stats_file.as_deref().map(serve::StatsFile::create).transpose();
    let stats_file = stats_file.map_err(StartError::StatsFile)?;
    let signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGUSR1, SIGHUP])
        .map_err(StartError::Signals)?;
    let plan = confine::Plan::new(spec)?;
    let count = spec.functions.iter().filter(|f| matches!(f.backend, BackendSpec::SharedDir { .. })).count();
    let proc_fd = match plan.enter(&mut [], None)? {
        Some(fd) => Some(fd),
        None if count > 0 || !spec.confinement.confined() => {
            let fd = std::fs::File::open("/proc/self/fd").map_err(StartError::ProcFd)?;
            Some(OwnedFd::from(fd))
        }
        None => None,
    };
    let uid = crate::sys::effective_uid();
    plan.lock_down()?;
    Ok(Confined { stats_file, signals, shares: Shares { plan, proc_fd, count, uid } })
}

type Received = (Option<BoundControlSocket>, Vec<Taken>, (u64, u64));

/// Every part until the end, each checked and built.
fn receive(
    spec: &DaemonSpec,
    shares: &Shares,
    functions: &FunctionSet,
    peer: &Channel,
) -> Result<Received, String> {
    let mut control = None;
    let mut taken = Vec::new();
    let mut copies: HashMap<String, Copy> = HashMap::new();
    loop {
        let t = std::time::Instant::now();
        let (msg, files) = peer.recv::<Msg>(PART_BOUND).map_err(|e| crate::error_chain(&e))?;
        log::debug!("live update: a part received in {:?}", t.elapsed());
        let mut files = Files::new(files);
        match msg {
            Msg::Precopy(part) => {
                let tag = part.tag.clone();
                let t0 = std::time::Instant::now();
                let base = take_copy(spec, shares, *part, files)
                    .map_err(|why| format!("function {tag:?}: {why}"))?;
                log::debug!("live update: function {tag:?} built from its copy in {:?}", t0.elapsed());
                copies.insert(tag, base);
            }
            Msg::DropCopy { tag } => {
                files.finish()?;
                copies.remove(&tag);
            }
            Msg::PrecopyEnd => {
                files.finish()?;
                peer.send(&Msg::Precopied, &[]).map_err(|e| crate::error_chain(&e))?;
            }
            Msg::Control(part) => {
                let listener = UnixListener::from(OwnedFd::from(files.next("the control socket")?));
                let lock = if part.lock { Some(files.next("the control socket's lock")?) } else { None };
                files.finish()?;
                let access = ControlAccess {
                    group: spec.ops.control_socket_group,
                    mode: spec.ops.control_socket_mode,
                };
                let socket_files = SocketFiles::from_parts(part.socket_file, lock);
                let uid = shares.uid;
                control = Some(BoundControlSocket::handed(part.path, listener, socket_files, access, uid));
            }
            Msg::Function(part) => {
                let tag = part.tag.clone();
                let t0 = std::time::Instant::now();
                let copy = copies.remove(&tag);
                let t = take_function(spec, shares, functions, *part, files, copy, taken.len())
                    .map_err(|why| format!("function {tag:?}: {why}"))?;
                log::debug!("live update: function {tag:?} built in {:?}", t0.elapsed());
                taken.push(t);
            }
            Msg::End { updates, recoveries } => {
                files.finish()?;
                return Ok((control, taken, (updates, recoveries)));
            }
            // Called off while the parts came (a function that could not be frozen): no
            // refusal to send back; this process ends.
            Msg::Abort { reason } => return Err(format!("{CALLED_OFF}: {reason}")),
            other => return Err(format!("unexpected {other:?}")),
        }
    }
}

/// The description of function `tag`: this binary's reading of the command line and profile,
/// or of the table it was created with.
fn function_spec(spec: &DaemonSpec, tag: &str, origin: &Origin) -> Result<FunctionSpec, String> {
    match origin {
        Origin::Start => (spec.functions.iter().find(|f| f.tag() == tag))
            .cloned()
            .ok_or_else(|| "this binary's command line and profile have no function of this tag".into()),
        Origin::Created(table) => FunctionSpec::from_rpc(&spec.defaults, table.clone())
            .map_err(|e| format!("its create_function table: {}", crate::error_chain(&e))),
    }
}

/// A backend built from the copy its predecessor took while serving.
enum Copy {
    Ram(Box<Restoring>),
    Shared(Box<PassthroughRestoring>),
}

/// The backend of a function built from the copy its predecessor took while serving.
fn take_copy(
    spec: &DaemonSpec,
    shares: &Shares,
    part: PrecopyPart,
    mut files: Files,
) -> Result<Copy, String> {
    let fspec = function_spec(spec, &part.tag, &part.origin)?;
    match &fspec.backend {
        BackendSpec::Ram { .. } => match backends::open(&fspec, true, DescriptorShare::OneOf(1)) {
            Ok(Opened::Ram(cfg)) => {
                let memfd = files.next("the RAM filesystem's data")?;
                files.finish()?;
                backend::restore_copy(cfg, part.backend, memfd).map(|r| Copy::Ram(Box::new(r)))
            }
            Ok(_) => Err("this binary serves it from another backend".into()),
            Err(e) => Err(crate::error_chain(&e)),
        },
        BackendSpec::SharedDir { .. } => {
            let (cfg, _, proc_fd) = share_setup(spec, shares, &fspec, &part.origin)?;
            backend::restore_passthrough_copy(cfg, proc_fd, part.backend, files.rest())
                .map(|r| Copy::Shared(Box::new(r)))
        }
        BackendSpec::Remote(_) => Err("an NFS export sends no copy".into()),
    }
}

/// How this process serves the shared directory of `fspec`: its configuration (the root
/// where the sandbox put it, for a function the daemon started with), I/O mode, and a
/// `/proc/self/fd` to reopen nodes through.
fn share_setup(
    spec: &DaemonSpec,
    shares: &Shares,
    fspec: &FunctionSpec,
    origin: &Origin,
) -> Result<(PassthroughConfig, IoMode, OwnedFd), String> {
    let share = DescriptorShare::OneOf(shares.count.max(1));
    let Some((mut cfg, io_mode)) = backends::passthrough_config(fspec, share) else {
        return Err("this binary serves it from another backend".into());
    };
    let at = spec.functions.iter().position(|f| f.tag() == fspec.tag());
    if let (Origin::Start, Some(inside)) = (origin, at.and_then(|i| shares.plan.inside(i))) {
        cfg.root = inside.to_path_buf();
    }
    let proc_fd = (shares.proc_fd.as_ref())
        .ok_or("no /proc/self/fd to serve a shared directory with")?
        .try_clone()
        .map_err(|e| format!("cannot duplicate /proc/self/fd: {e}"))?;
    Ok((cfg, io_mode, proc_fd))
}

/// One function: its description found (or read again), its backend restored (from `copy`,
/// when its predecessor sent one ahead), its server built on this process's pollers.
fn take_function(
    spec: &DaemonSpec,
    shares: &Shares,
    functions: &FunctionSet,
    mut part: FunctionPart,
    mut files: Files,
    copy: Option<Copy>,
    index: usize,
) -> Result<Taken, String> {
    let fspec = function_spec(spec, &part.tag, &part.origin)?;
    let t = std::time::Instant::now();
    let handover = state::server_handover(&mut part, &mut files)?;
    let FunctionPart { backend: part_backend, origin, .. } = part;
    let options = fspec.fuse.server;
    let mut fspec = fspec;
    fspec.profile.inflight_tracking |= functions.keeps_checkpoints();
    let built = match (&fspec.backend, &part_backend) {
        (_, state::BackendPart::Fresh) => {
            files.finish()?;
            let active = part.device.function.status & virtiofs_device::pci::status::DRIVER_OK != 0;
            fresh(&fspec, active)
        }
        (BackendSpec::SharedDir { .. }, state::BackendPart::PassthroughKept { held, incomplete }) => {
            let records = files.next("the share's records")?;
            let session = files.next("the FUSE session's record")?;
            let held_files = files.rest();
            let keeper = functions.descriptor_keeper(fspec.tag());
            let recovered = if *incomplete {
                Err("the supervisor may miss descriptors of its nodes or handles".to_string())
            } else {
                share_setup(spec, shares, &fspec, &origin).and_then(|(cfg, io_mode, proc_fd)| {
                    backend::recover_passthrough(
                        options, cfg, io_mode, proc_fd, held, records, session, held_files, keeper,
                    )
                })
            };
            match recovered {
                Ok(b) => b,
                Err(why) => {
                    log::error!(
                        "function {:?}: its shared directory cannot be recovered: {why}",
                        fspec.tag()
                    );
                    let active = part.device.function.status & virtiofs_device::pci::status::DRIVER_OK != 0;
                    fresh(&fspec, active)
                }
            }
        }
        _ => match &fspec.backend {
            BackendSpec::Ram { .. } => match backends::open(&fspec, true, DescriptorShare::OneOf(1)) {
                Ok(Opened::Ram(cfg)) => {
                    // The changes since the copy, or the whole state (format 2, or a copy given up
                    // because more changed than its logs keep: the copy is dropped).
                    let from = match (&part_backend, copy) {
                        (state::BackendPart::RamfsChanges { .. }, Some(Copy::Ram(base))) => {
                            backend::RamfsFrom::Copy(base)
                        }
                        (state::BackendPart::RamfsChanges { .. }, _) => {
                            return Err("its changes came without a copy to apply them to".into())
                        }
                        _ => backend::RamfsFrom::Whole(files.next("the RAM filesystem's data")?),
                    };
                    files.finish()?;
                    backend::restore(options, cfg, part_backend, from)?
                }
                Ok(_) => return Err("this binary serves it from another backend".into()),
                Err(e) => return Err(crate::error_chain(&e)),
            },
            BackendSpec::SharedDir { .. } => {
                let (cfg, io_mode, proc_fd) = share_setup(spec, shares, &fspec, &origin)?;
                let copy = match copy {
                    Some(Copy::Shared(base)) => Some(*base),
                    _ => None,
                };
                backend::restore_passthrough(
                    options,
                    cfg,
                    io_mode,
                    proc_fd,
                    part_backend,
                    files.rest(),
                    copy,
                )?
            }
            BackendSpec::Remote(r) => {
                let opts = NfsOptions { keep: functions.keeps_checkpoints(), ..r.options.clone() };
                let data = files.next("the UNSTABLE store's data")?;
                if let state::BackendPart::NfsKept = part_backend {
                    let records = files.next("the NFS records")?;
                    let session = files.next("the FUSE session's record")?;
                    files.finish()?;
                    match backend::recover_nfs(options, opts, data, records, session) {
                        Ok(b) => b,
                        Err(why) => {
                            log::error!(
                                "function {:?}: its NFS state cannot be recovered: {why}",
                                fspec.tag()
                            );
                            let active =
                                part.device.function.status & virtiofs_device::pci::status::DRIVER_OK != 0;
                            fresh(&fspec, active)
                        }
                    }
                } else {
                    let records = files.rest().into_iter().next();
                    backend::restore_nfs(options, opts, part_backend, data, records)?
                }
            }
        },
    };
    let restored = t.elapsed();
    let placement = functions.place(&fspec, index).map_err(|e| crate::error_chain(&e))?;
    let server = Server::take_over(
        handover,
        &fspec.profile,
        built.handler.clone(),
        functions.pool(),
        placement.clone(),
    )
    .map_err(|e| crate::error_chain(&e))?;
    log::debug!(
        "live update: backend restored in {restored:?}, server built in {:?}",
        t.elapsed() - restored
    );
    Ok(Taken { server, spec: fspec, placement, built, origin })
}

/// The backend of a function taken over from a checkpoint, whose state died with the process
/// that served it: its requests end with `EIO` until the driver resets the device, then a RAM
/// filesystem opened anew (empty) serves; other backends go on ending them (their full
/// recovery needs their state kept, which is not done yet).
fn fresh(fspec: &FunctionSpec, active: bool) -> Built {
    let inner = match &fspec.backend {
        BackendSpec::Ram { .. } => backends::open(fspec, true, DescriptorShare::OneOf(1))
            .and_then(|o| backends::build(fspec.fuse.server, o, None))
            .map_err(|e| {
                log::warn!(
                    "function {:?}: no RAM filesystem after the reset: {}",
                    fspec.tag(),
                    crate::error_chain(&e)
                )
            })
            .ok(),
        _ => None,
    };
    log::warn!(
        "function {:?}: its backend's state was lost in the crash; its requests end with EIO{}",
        fspec.tag(),
        if inner.is_some() { " until the driver resets the device" } else { "" }
    );
    let fuse = match &inner {
        Some(b) => b.fuse.clone(),
        None => Arc::new(crate::FuseStats::default) as crate::backends::FuseStatsFn,
    };
    let (inner, saver) = match inner {
        Some(b) => (Some(b.handler), b.saver),
        None => (None, None),
    };
    let ending = Ending::new(inner, saver, active);
    let saver = Some(ending.clone() as Arc<dyn crate::update::SavesState>);
    Built { handler: ending, fuse, descriptors: 0, saver }
}
