//! The one start-up path, for a daemon of one function or of many: from a [`DaemonSpec`],
//!
//! 1. open each backend on the host's terms (a shared directory checked, an NFS export
//!    mounted), so that a daemon that cannot serve binds nothing;
//! 2. bind every socket (each function's, the control socket) and open the statistics file;
//! 3. confine: namespaces (the `confine` module);
//! 4. build each function's backend (a shared directory opened inside the sandbox's root);
//! 5. drop privileges and install the seccomp filter;
//! 6. spawn the pool of pollers, which inherit all of it;
//! 7. start the functions, then serve ([`serve::Serving`]) until a signal stops the daemon.
//!
//! `create_function` ([`crate::functions::FunctionSet::create`]) takes steps 1, 2, 4 and 7 for
//! one function of a daemon that is not confined.

mod confine;
mod serve;
mod take;

use std::process::ExitCode;
use std::sync::Arc;

use log::{error, info};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use virtiofs_backend::passthrough::DescriptorShare;
use virtiofs_device::config::ConfigError;
use virtiofs_device::poller::PollerPool;
use virtiofs_device::vfio_user::socket_file::SocketAccess;
use virtiofs_device::vfio_user::{self, Listener};

use crate::backends::{self, BackendError};
use crate::error_chain;
use crate::functions::{FunctionError, FunctionSet};
use crate::ops::control_socket::{BoundControlSocket, ControlAccess, ControlSocketError};
use crate::ops::deploy::{self, DeployError};
use crate::settings::{BackendSpec, DaemonSpec, Socket};
use crate::update::recovery::CheckpointKeeper;
use crate::update::{Role, Updater};
pub use serve::Serving;

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The profile asks for what this machine does not have.
    #[error("the pollers' profile")]
    Machine(#[source] ConfigError),
    /// The limit of open files could not be set.
    #[error("{0}")]
    Limit(String),
    /// `VIRTIOFS_DPU_CRASH_AT` names no crash point.
    #[error("{0}")]
    CrashPoint(String),
    /// A shared directory lies outside the sandbox's root, or the root is not there.
    #[error("{0}")]
    Sandbox(String),
    /// A function's backend could not be set up.
    #[error("function {tag:?}")]
    Backend {
        /// The function.
        tag: String,
        /// Why.
        #[source]
        source: BackendError,
    },
    /// An inherited socket cannot be used, or a socket's access cannot be set.
    #[error("socket")]
    Socket(#[source] DeployError),
    /// A function's socket cannot be bound.
    #[error("vfio-user socket")]
    Listen(#[source] vfio_user::ServerError),
    /// The control socket cannot be bound.
    #[error(transparent)]
    Control(ControlSocketError),
    /// The statistics file cannot be created.
    #[error("cannot create the statistics file")]
    StatsFile(#[source] std::io::Error),
    /// The signal handlers cannot be installed.
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
    /// The namespaces cannot be entered.
    #[error("sandbox")]
    Confine(#[source] virtiofs_backend::passthrough::sandbox::SandboxError),
    /// Privileges cannot be dropped.
    #[error("cannot drop privileges")]
    Privileges(#[source] std::io::Error),
    /// The seccomp filter cannot be installed.
    #[error("seccomp")]
    Seccomp(#[source] virtiofs_backend::passthrough::seccomp::SeccompError),
    /// The sandbox's `/proc/self/fd` cannot be duplicated for a shared directory.
    #[error("cannot duplicate the sandbox's /proc/self/fd")]
    ProcFd(#[source] std::io::Error),
    /// The pollers cannot start.
    #[error("cannot start the pollers")]
    Pollers(#[source] std::io::Error),
    /// A live update's takeover failed (the old process serves on).
    #[error("live update: {0}")]
    Takeover(String),
    /// The old process called the live update off (it serves on); not this process's failure.
    #[error("live update: {0}")]
    CalledOff(String),
    /// A function cannot start.
    #[error("function {tag:?}")]
    Function {
        /// The function.
        tag: String,
        /// Why.
        #[source]
        source: Box<FunctionError>,
    },
}

impl StartError {
    /// The exit status: 2 when what was asked for is wrong, 1 when it failed.
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Machine(_)
            | StartError::Sandbox(_)
            | StartError::StatsFile(_)
            | StartError::CrashPoint(_) => 2,
            StartError::Backend { source, .. } if source.is_usage() => 2,
            StartError::Socket(DeployError::BadFd { .. }) => 2,
            _ => 1,
        }
    }
}

/// Starts the daemon `spec` describes and serves it until a signal stops it: on its own, as
/// the serving process under a supervisor, or taking over from the old serving process
/// (`role`, [`crate::update`]).
pub fn run(spec: DaemonSpec, role: Role) -> ExitCode {
    let started = match role {
        Role::Alone => start(spec, None),
        Role::Serving { supervisor, checkpoints } => {
            let (defaults, confined) = (spec.defaults.clone(), spec.confinement.confined());
            let keeper = checkpoints.map(CheckpointKeeper::new);
            start(spec, keeper.clone()).map(|mut s| {
                let updater = Arc::new(Updater::new(supervisor, 0).with_recovery(keeper, 0));
                if confined {
                    s.functions.bind_through(updater.clone(), defaults);
                }
                s.updater = Some(updater);
                s
            })
        }
        Role::Taking { supervisor, peer, checkpoints, recovering } => {
            let keeper = checkpoints.map(CheckpointKeeper::new);
            take::take_over(spec, supervisor, peer, keeper, recovering)
        }
    };
    match started {
        Ok(serving) => serving.serve(),
        Err(StartError::CalledOff(why)) => {
            info!("{why}; this process ends");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!("{}", error_chain(&e));
            ExitCode::from(e.exit_code())
        }
    }
}

/// Steps 1 to 7 of the module's documentation.
/// `keeper`: where the functions' checkpoints go (a supervisor that recovers from crashes).
pub fn start(spec: DaemonSpec, keeper: Option<Arc<CheckpointKeeper>>) -> Result<Serving, StartError> {
    // Inherited sockets first: until they are claimed, any descriptor this process opens could
    // take the number of one that was named but not passed, and be adopted in its place.
    // A crash point a test asked for (only this, a first serving process, arms it: one that
    // recovers or takes over starts in `take.rs`).
    if let Some(p) = virtiofs_device::crash_point::arm_from_env().map_err(StartError::CrashPoint)? {
        log::warn!("crash point {p:?} armed ({})", virtiofs_device::crash_point::CRASH_AT);
    }
    let mut spec = spec;
    for f in &mut spec.functions {
        backends::keep_for_crash(f, keeper.is_some());
    }
    let mut inherited = spec.functions.iter().map(|f| adopt(&f.socket)).collect::<Result<Vec<_>, _>>()?;
    spec.pool.check_machine().map_err(StartError::Machine)?;
    let plan = confine::Plan::new(&spec)?;
    let mut opened = Vec::new();
    // The shared directories split the descriptor budget equally (see DescriptorShare).
    let shares = spec.functions.iter().filter(|f| matches!(f.backend, BackendSpec::SharedDir { .. })).count();
    for f in &spec.functions {
        let o = backends::open(f, plan.keeps_shares(), DescriptorShare::OneOf(shares))
            .map_err(|source| StartError::Backend { tag: f.tag().into(), source })?;
        opened.push(o);
    }
    set_nofile_limit(spec.ops.rlimit_nofile).map_err(StartError::Limit)?;
    let notifier = deploy::Notifier::from_env().map_err(StartError::Socket)?;
    // Every socket now, before any sandbox and before any thread.
    // The control socket first: a daemon whose control socket another serves binds nothing.
    let mut control = match &spec.ops.control_socket {
        Some(path) => {
            let access =
                ControlAccess { group: spec.ops.control_socket_group, mode: spec.ops.control_socket_mode };
            Some(BoundControlSocket::bind(path, access).map_err(StartError::Control)?)
        }
        None => None,
    };
    let access = (spec.ops.socket_group, spec.ops.socket_mode);
    let mut listeners = (spec.functions.iter().zip(inherited.iter_mut()))
        .map(|(f, l)| match (l.take(), &f.socket) {
            (_, Socket::SocketPath(path)) => bind(path, access),
            (Some(l), _) => {
                if access.0.is_some() || access.1.is_some() {
                    log::warn!(
                        "--socket-group and --socket-mode do not apply to an inherited socket ({})",
                        l.path().display()
                    );
                }
                Ok(l)
            }
            (None, Socket::Fd(fd) | Socket::ActivatedFd(fd)) => {
                Err(StartError::Socket(DeployError::BadFd { fd: *fd, why: "not claimed".into() }))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let started_at = std::time::Instant::now();
    let stats_file = spec.ops.stats_file.as_deref().map(serve::StatsFile::create).transpose();
    let stats_file = stats_file.map_err(StartError::StatsFile)?;
    let signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGUSR1, SIGHUP])
        .map_err(StartError::Signals)?;
    info!(
        "starting {} function(s); profile {}, {} poller(s) (cores {:?}, polling {:?}); sandbox {:?}, seccomp {:?}",
        spec.functions.len(),
        spec.profile_file.as_ref().map_or("(built-in default)".into(), |p| p.display().to_string()),
        spec.pool.pollers(),
        spec.pool.poller_cores,
        spec.pool.polling,
        spec.confinement.sandbox,
        spec.confinement.seccomp
    );
    let proc_fd = plan.enter(&mut listeners, control.as_mut())?;
    let mut built = Vec::new();
    for (i, (f, o)) in spec.functions.iter().zip(opened).enumerate() {
        let inside = match (plan.inside(i), &proc_fd) {
            (Some(p), Some(fd)) => Some((p, fd.try_clone().map_err(StartError::ProcFd)?)),
            _ => None,
        };
        let b = backends::build(f.fuse.server, o, inside)
            .map_err(|source| StartError::Backend { tag: f.tag().into(), source })?;
        built.push(b);
    }
    drop(proc_fd);
    plan.lock_down()?;
    // A thread: after the sandbox (entered only by a single-threaded process); its handler's
    // `rt_sigaction` and its `tgkill` are in the system-call filter.
    virtiofs_device::interrupt::start_watchdog();
    let pool = PollerPool::spawn(&spec.pool).map_err(StartError::Pollers)?;
    let defaults = (!spec.confinement.confined()).then(|| spec.defaults.clone());
    let why = "the daemon is confined (sandbox or seccomp) and can bind no new socket";
    let functions = Arc::new(FunctionSet::new(pool, defaults, why, spec.ops.max_functions));
    if let Some(k) = keeper {
        functions.keep_checkpoints(k);
    }
    let config = spec.describe();
    for ((f, l), b) in spec.functions.into_iter().zip(listeners).zip(built) {
        let tag = f.tag().to_string();
        functions.start(l, f, b).map_err(|e| StartError::Function { tag, source: Box::new(e) })?;
    }
    Ok(Serving { functions, config, control, notifier, signals, stats_file, started_at, updater: None })
}

/// A function's vfio-user socket: bound at its path with the group and mode asked for, or
/// adopted from the descriptor a supervisor passed.
/// Binds a socket path, with its access settings. Inherited descriptors were claimed by [`adopt`].
fn bind(path: &std::path::Path, (gid, mode): (Option<u32>, Option<u32>)) -> Result<Listener, StartError> {
    Listener::bind_with(path, SocketAccess { group: gid, mode }).map_err(StartError::Listen)
}

/// Claims an inherited listening socket (`--fd` or socket activation); `None` for a socket path.
fn adopt(socket: &Socket) -> Result<Option<Listener>, StartError> {
    let fd = match socket {
        Socket::SocketPath(_) => return Ok(None),
        Socket::Fd(fd) | Socket::ActivatedFd(fd) => *fd,
    };
    let l = deploy::adopt_listener(fd).map_err(StartError::Socket)?;
    let name = l.local_addr().ok().and_then(|a| a.as_pathname().map(|p| p.to_path_buf()));
    let name = name.unwrap_or_else(|| format!("fd {fd}").into());
    Listener::from_std(l, name).map(Some).map_err(StartError::Listen)
}

/// `--rlimit-nofile`: `Some(0)` leaves the limit alone, `Some(n)` sets soft and hard to `n`,
/// `None` raises the soft limit to the hard one.
fn set_nofile_limit(want: Option<u64>) -> Result<(), String> {
    use crate::sys;
    let (soft, hard) = sys::nofile_limit().map_err(|e| format!("cannot read RLIMIT_NOFILE: {e}"))?;
    let (new_soft, new_hard) = match want {
        Some(0) => return Ok(()),
        Some(n) => (n, n),
        None if soft == hard => return Ok(()),
        None => (hard, hard),
    };
    sys::set_nofile_limit(new_soft, new_hard).map_err(|e| {
        let hint = if new_hard > hard { " (raising the hard limit needs CAP_SYS_RESOURCE)" } else { "" };
        format!("--rlimit-nofile {new_hard}: cannot set the limit of open files (now soft {soft}, hard {hard}): {e}{hint}")
    })?;
    log::debug!("open files limit: soft {new_soft}, hard {new_hard} (was {soft}, {hard})");
    Ok(())
}
