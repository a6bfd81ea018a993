//! `virtiofs-dpu`: the virtio-fs device daemon. Serves a vfio-user socket that QEMU's
//! `vfio-user-pci` (or our host driver model) attaches; the guest mounts the tag with
//! `mount -t virtiofs TAG /mnt`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use log::{error, warn, LevelFilter};
use virtiofs_backend::filesystem::CachePolicy;
use virtiofs_backend::passthrough::sandbox::SandboxMode;
use virtiofs_backend::passthrough::seccomp::SeccompMode;
use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::Policy;
use virtiofs_dpu::error_chain;
use virtiofs_dpu::ops::control_socket::ControlClient;
use virtiofs_dpu::ops::deploy;
use virtiofs_dpu::ops::logger::{self, LogFormat};
use virtiofs_dpu::ops::report::{self, Format, WatchError};
use virtiofs_dpu::settings::{
    keys, AllowCreate, CommandLine, DaemonOptions, DaemonSpec, FunctionKeys, LogSpec, Socket,
};
use virtiofs_dpu::update::{supervisor, Role};

/// virtio-fs device firmware served over vfio-user.
///
/// Signals: SIGINT and SIGTERM stop it cleanly; SIGUSR1 writes the statistics to the log (and
/// to --stats-file); SIGHUP is logged and otherwise ignored (there is nothing to reload: the
/// profile is read once, and the log and statistics files stay open).
#[derive(Parser, Debug)]
#[command(version, about, subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// vfio-user socket to listen on (a stale socket file is replaced). Not needed with --fd or
    /// under systemd socket activation (LISTEN_PID, LISTEN_FDS).
    #[arg(long)]
    socket_path: Option<PathBuf>,
    /// Serve the listening unix socket inherited as descriptor N (from a supervisor) instead of
    /// binding --socket-path.
    #[arg(long, value_name = "N", conflicts_with = "socket_path")]
    fd: Option<i32>,
    /// Group that owns the vfio-user sockets (a name or a gid), so that a QEMU or libvirt in
    /// that group, not root, can connect. Not the control socket's (--control-socket-group).
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Permission bits of the vfio-user sockets, octal (e.g. 0660; connecting needs write
    /// permission). Default: as the umask leaves them. Not the control socket's.
    #[arg(long, value_name = "MODE", value_parser = deploy::parse_mode)]
    socket_mode: Option<u32>,
    /// Serve JSON-RPC 2.0 on this unix socket (get_device, get_stats, reset_stats,
    /// set_log_level, list/create/delete_function, live_update; mode 0600 unless
    /// --control-socket-mode):
    /// read it with `virtiofs-dpu stats --control-socket PATH`.
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
    /// Group of the control socket (a name or a gid): its members may use it, besides root and
    /// the daemon's uid (each client's credentials are checked). Default: none.
    #[arg(long, value_name = "GROUP")]
    control_socket_group: Option<String>,
    /// Permission bits of the control socket, octal (e.g. 0660 with --control-socket-group).
    #[arg(long, value_name = "MODE", value_parser = deploy::parse_mode, default_value = "0600")]
    control_socket_mode: u32,
    /// Turn create_function on, limited to these share roots, socket directories and remote
    /// hosts: KIND=VALUE[,KIND=VALUE...] with KIND roots (a shared_dir must lie beneath one),
    /// sockets (a socket_path must be a name in one) or remotes (a remote's host). Repeatable.
    /// Without it create_function is refused.
    #[arg(long, value_name = "KIND=VALUE,...")]
    allow_create: Vec<String>,
    /// The most functions the daemon serves at once (the profile's and create_function's).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    max_functions: u16,
    /// Log level: off, error, warn, info, debug (every vfio-user command) or trace. Default:
    /// RUST_LOG if it is one of these, else info.
    #[arg(long, value_name = "LEVEL", value_parser = level_arg)]
    log_level: Option<LevelFilter>,
    /// Log lines as `text` or `json` (one object per line).
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// Log to the local syslog socket (/dev/log, facility daemon) instead of stderr.
    #[arg(long)]
    syslog: bool,
    /// Mount tag (overrides the profile's).
    #[arg(long)]
    tag: Option<String>,
    /// Hardware profile (TOML, see hw-configs/).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Serve this host directory (confined beneath it) instead of a RAM filesystem. Requests run
    /// with the guest caller's uid/gid; guest root is root on the directory, so mount it
    /// nosuid,nodev on the host.
    #[arg(long, value_name = "DIR")]
    shared_dir: Option<PathBuf>,
    /// Serve this NFS export instead: `nfs://HOST[:PORT]/EXPORT[?nfsport=N&mountport=M]`
    /// (NFSv3; PORT: the portmapper's, default 111; nfsport/mountport skip it), or
    /// `nfs://HOST[:PORT][,HOST[:PORT]...]/EXPORT?version=4.1` (NFSv4.1, locks kept on the
    /// server; PORT, else nfsport, else 2049; several addresses of one server spread the
    /// pollers). Overrides the profile's `remote`; the `nfs_*` profile keys tune it. Requests
    /// go with the guest caller's uid, gid and groups (AUTH_SYS).
    #[arg(long, value_name = "URL", conflicts_with = "shared_dir")]
    remote: Option<String>,
    /// With --shared-dir, how READ/WRITE/FSYNC are served: `hybrid` (zero-copy, inline when it
    /// cannot block, else on an io_uring per poller), `ring` (always on the io_uring) or `sync`
    /// (through the FUSE server with a bounce buffer).
    /// Default `hybrid`. With `[[function]]` tables, every shared directory's default.
    #[arg(long, value_name = "MODE")]
    io_mode: Option<IoMode>,
    /// What the guest kernel may cache, as virtiofsd's `--cache`: `never` (no entry or attribute
    /// caching, FOPEN_DIRECT_IO), `auto` (one second) or `always` (a day, page cache kept across
    /// opens). Default: `always` for the RAM filesystem (only the guest changes it), `auto` with
    /// --shared-dir (the host may change the directory too).
    #[arg(long, value_name = "POLICY")]
    cache: Option<CachePolicy>,
    /// With --shared-dir or --remote, how the daemon confines itself once its socket is bound:
    /// `namespace` (new mount, IPC and, with --shared-dir, network namespaces whose root is the
    /// shared directory, or for --remote an empty read-only one; needs root, the default for
    /// root) or `none` (the default otherwise).
    #[arg(long, value_name = "MODE")]
    sandbox: Option<SandboxMode>,
    /// With --shared-dir or --remote, what a system call outside the daemon's allowlist does:
    /// `trap` (the daemon logs the call's number and dies of SIGSYS), `kill` (the kernel kills
    /// it), `log` (allowed, logged by the kernel's audit) or `off` (no filter).
    /// Default `trap`.
    #[arg(long, value_name = "MODE")]
    seccomp: Option<SeccompMode>,
    /// With --shared-dir, a comma-separated list of what the guest may not create on the host:
    /// `device-nodes` (MKNOD of character/block devices), `setid` (set-user-id bits, and
    /// set-group-id bits outside directories), `file-caps` (`security.capability` xattrs); each
    /// then fails EPERM. All are allowed by default: refuse them unless the host mounts the
    /// share nosuid,nodev. With `[[function]]` tables, every shared directory's default (a
    /// function's `refuse` key overrides it).
    #[arg(long, value_name = "LIST", value_parser = Policy::refusing)]
    refuse: Option<Policy>,
    /// Write the statistics as JSON to this file at exit, and on SIGUSR1 while running
    /// (`{"device": {"queues": [...], "pollers": [...]}, "fuse": {"locks": ..., "io": ...}}`). The file is opened at
    /// start, before any sandbox.
    #[arg(long, value_name = "PATH")]
    stats_file: Option<PathBuf>,
    /// Serve extended attributes (SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR): the default,
    /// where virtiofsd's is off.
    #[arg(long, help_heading = "Filesystem (virtiofsd's options)", overrides_with = "no_xattr")]
    xattr: bool,
    /// Answer the extended-attribute requests ENOSYS, as virtiofsd without --xattr does (the
    /// guest kernel then stops sending them and getxattr(2) and setxattr(2) fail with
    /// EOPNOTSUPP); implies --no-posix-acl.
    #[arg(long, help_heading = "Filesystem (virtiofsd's options)", overrides_with = "xattr")]
    no_xattr: bool,
    /// Offer FUSE_POSIX_ACL: the guest kernel enforces POSIX ACLs and applies default ACLs
    /// (kept by the filesystem as system.posix_acl_* attributes). The default, where
    /// virtiofsd's is off; needs extended attributes.
    #[arg(
        long,
        help_heading = "Filesystem (virtiofsd's options)",
        overrides_with = "no_posix_acl",
        conflicts_with = "no_xattr"
    )]
    posix_acl: bool,
    /// Do not offer FUSE_POSIX_ACL (the guest kernel checks the mode bits only).
    #[arg(long, help_heading = "Filesystem (virtiofsd's options)", overrides_with = "posix_acl")]
    no_posix_acl: bool,
    /// Offer READDIRPLUS (directory listings carry each entry's attributes). The default,
    /// except with --cache never, as virtiofsd.
    #[arg(long, help_heading = "Filesystem (virtiofsd's options)", overrides_with = "no_readdirplus")]
    readdirplus: bool,
    /// Do not offer READDIRPLUS: the guest lists with READDIR and looks entries up one by one.
    #[arg(long, help_heading = "Filesystem (virtiofsd's options)", overrides_with = "readdirplus")]
    no_readdirplus: bool,
    /// Offer FUSE_WRITEBACK_CACHE (as virtiofsd's --writeback): the guest kernel keeps written
    /// data in its page cache and writes it back later in large requests; it then owns the size
    /// and the times. Faster buffered writes; what the guest had not written back is lost if it
    /// crashes, and the host sees data, size and times only once they are written back. Off by
    /// default. The RAM filesystem and --shared-dir (not --remote); needs a guest kernel with
    /// FUSE_HANDLE_KILLPRIV_V2 (Linux 5.11+), else it is not offered.
    #[arg(long, help_heading = "Filesystem (virtiofsd's options)", overrides_with = "no_writeback")]
    writeback: bool,
    /// Do not offer FUSE_WRITEBACK_CACHE (the default): every write reaches the device before
    /// write(2) returns.
    #[arg(long, help_heading = "Filesystem (virtiofsd's options)", overrides_with = "writeback")]
    no_writeback: bool,
    /// Set the soft and hard limit of open descriptors to N (raising the hard limit needs
    /// CAP_SYS_RESOURCE); 0 leaves the limit alone. Default: the soft limit raised to the hard
    /// one (the passthrough holds one descriptor per inode the guest knows).
    #[arg(long, value_name = "N", help_heading = "Filesystem (virtiofsd's options)")]
    rlimit_nofile: Option<u64>,
    /// Bytes of file data, extended attributes and ACLs the RAM filesystem may hold (K, M, G, T
    /// suffixes, powers of 1024); writes past it fail with ENOSPC. Overrides the profile's
    /// `ramfs_size`. Default 1G.
    #[arg(
        long,
        value_name = "SIZE",
        value_parser = keys::parse_ramfs_size,
        conflicts_with = "shared_dir",
        help_heading = "Filesystem (virtiofsd's options)"
    )]
    ramfs_size: Option<u64>,
    /// Inodes the RAM filesystem may hold, the root included; creating more fails with ENOSPC.
    /// Overrides the profile's `ramfs_inodes`. Default 1048576.
    #[arg(
        long,
        value_name = "N",
        value_parser = keys::parse_inodes,
        conflicts_with = "shared_dir",
        help_heading = "Filesystem (virtiofsd's options)"
    )]
    ramfs_inodes: Option<u64>,
    /// Accepted and ignored, with a warning: requests are served by the profile's pollers (one
    /// thread per `poller_cores` entry, each owning its queues and never blocking), not by a
    /// thread pool.
    #[arg(long, value_name = "N", help_heading = "virtiofsd options that do not apply")]
    thread_pool_size: Option<usize>,
    /// Refused (exit status 2): it prints a vhost-user backend's capabilities, and this daemon
    /// is a vfio-user device (QEMU's vfio-user-pci), not a vhost-user backend.
    #[arg(long, help_heading = "virtiofsd options that do not apply")]
    print_capabilities: bool,
    /// Run under a supervisor so that `virtiofs-dpu update` (the control socket's
    /// `live_update`) can replace the serving process with a new binary while the guests keep
    /// their mounts (every backend; needs --control-socket). A confined daemon then also makes
    /// RAM-filesystem functions at run time (create_function), its supervisor binding their
    /// sockets.
    #[arg(long, requires = "control_socket")]
    live_update: bool,
    /// With --live-update, the directory `update --binary PATH` may take a binary from
    /// (without it only the supervisor's own binary path, as a package update replaces it).
    #[arg(long, value_name = "DIR", requires = "live_update")]
    update_binary_dir: Option<PathBuf>,
    /// With --live-update, how often the supervisor restarts a serving process that died
    /// unasked (a crash, SIGKILL) before it gives up: at most N times in SECONDS (`0/0`: it
    /// does not; the daemon ends with the serving process, as before). The new process takes
    /// every function over from the checkpoints the supervisor kept: the client connections
    /// stay and the requests in flight are answered (a queue whose rings contradict its
    /// in-flight record asks for a reset instead; DESIGN.md, "Crash recovery").
    #[arg(long, value_name = "N/SECONDS", default_value = "5/60", requires = "live_update")]
    crash_limit: String,
    /// Refused (exit status 2), as are --migration-on-error, --migration-verify-handles and
    /// --migration-confirm-paths: the device does not migrate (it offers QEMU no VFIO
    /// migration support, so QEMU blocks migrating the VM), and accepting them would promise otherwise.
    #[arg(long, value_name = "MODE", help_heading = "virtiofsd options that do not apply")]
    migration_mode: Option<String>,
    /// Refused: see --migration-mode.
    #[arg(long, value_name = "WHAT", help_heading = "virtiofsd options that do not apply")]
    migration_on_error: Option<String>,
    /// Refused: see --migration-mode.
    #[arg(long, help_heading = "virtiofsd options that do not apply")]
    migration_verify_handles: bool,
    /// Refused: see --migration-mode.
    #[arg(long, help_heading = "virtiofsd options that do not apply")]
    migration_confirm_paths: bool,
}

impl Args {
    /// The command line, typed: the daemon's flags and the function keys given.
    fn command_line(&self) -> Result<CommandLine, deploy::DeployError> {
        let pair = |on: bool, off: bool| if off { Some(false) } else { on.then_some(true) };
        let keys = FunctionKeys {
            shared_dir: self.shared_dir.clone(),
            remote: self.remote.clone(),
            cache: self.cache,
            refuse: self.refuse,
            io_mode: self.io_mode,
            xattr: pair(self.xattr, self.no_xattr),
            posix_acl: pair(self.posix_acl, self.no_posix_acl),
            readdirplus: pair(self.readdirplus, self.no_readdirplus),
            writeback: pair(self.writeback, self.no_writeback),
            ramfs_size: self.ramfs_size,
            ramfs_inodes: self.ramfs_inodes,
            ..FunctionKeys::default()
        };
        let socket = match (&self.socket_path, self.fd) {
            (_, Some(fd)) => Some(Socket::Fd(fd)),
            (Some(p), None) => Some(Socket::SocketPath(p.clone())),
            (None, None) => None,
        };
        Ok(CommandLine {
            config: self.config.clone(),
            socket,
            tag: self.tag.clone(),
            keys,
            sandbox: self.sandbox,
            seccomp: self.seccomp,
            ops: DaemonOptions {
                control_socket: self.control_socket.clone(),
                stats_file: self.stats_file.clone(),
                socket_group: self.socket_group.as_deref().map(deploy::group_id).transpose()?,
                socket_mode: self.socket_mode,
                control_socket_group: self
                    .control_socket_group
                    .as_deref()
                    .map(deploy::group_id)
                    .transpose()?,
                control_socket_mode: self.control_socket_mode,
                allow_create: AllowCreate::from_args(&self.allow_create)
                    .map_err(deploy::DeployError::Usage)?,
                max_functions: usize::from(self.max_functions),
                rlimit_nofile: self.rlimit_nofile,
                log: LogSpec { format: self.log_format, syslog: self.syslog },
            },
        })
    }

    /// The refusal of a virtiofsd option this daemon does not take, if one was given.
    fn refused_option(&self) -> Option<String> {
        if self.print_capabilities {
            return Some(
                "--print-capabilities: prints a vhost-user backend's capabilities, and virtiofs-dpu is a \
                 vfio-user device (QEMU's -device vfio-user-pci), not a vhost-user backend: it has none to print"
                    .into(),
            );
        }
        let migration = [
            self.migration_mode.as_ref().map(|_| "--migration-mode"),
            self.migration_on_error.as_ref().map(|_| "--migration-on-error"),
            self.migration_verify_handles.then_some("--migration-verify-handles"),
            self.migration_confirm_paths.then_some("--migration-confirm-paths"),
        ];
        migration.into_iter().flatten().next().map(|flag| {
            format!(
                "{flag}: this device does not migrate (it offers QEMU no VFIO migration support, so QEMU \
                 blocks migrating the VM); drop the --migration-* options"
            )
        })
    }
}

fn level_arg(s: &str) -> Result<LevelFilter, String> {
    virtiofs_dpu::ops::control_socket::parse_level(s)
        .ok_or_else(|| format!("{s:?}: expected off, error, warn, info, debug or trace"))
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print a running daemon's statistics from its control socket: a table (IOPS and MiB/s per
    /// queue, latency percentiles per operation class), JSON or the Prometheus text format.
    Stats(StatsArgs),
    /// Replace a running daemon (started with --live-update) with a new process of its binary,
    /// or of --binary: every function is handed over and the guests keep their mounts. Prints
    /// what happened as JSON; on a failure the old process serves on and the reason is printed.
    Update(UpdateArgs),
}

#[derive(clap::Args, Debug)]
struct UpdateArgs {
    /// The daemon's --control-socket.
    #[arg(long, value_name = "PATH")]
    control_socket: PathBuf,
    /// The new binary (in the daemon's --update-binary-dir); default: the daemon's own path.
    #[arg(long, value_name = "PATH")]
    binary: Option<PathBuf>,
}

/// `virtiofs-dpu update`.
fn update_command(a: &UpdateArgs) -> ExitCode {
    let params = match &a.binary {
        Some(b) => serde_json::json!({ "binary": b }),
        None => serde_json::Value::Null,
    };
    let r = ControlClient::connect(&a.control_socket).and_then(|mut c| {
        let _ = c.set_timeout(std::time::Duration::from_secs(60));
        c.call("live_update", params)
    });
    match r {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("virtiofs-dpu update: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The supervisor of a `--live-update` daemon.
fn supervise(args: &Args, spec: &DaemonSpec) -> ExitCode {
    let binary = match std::env::current_exe() {
        Ok(b) => b,
        Err(e) => {
            error!("--live-update: cannot find this binary's path: {e}");
            return ExitCode::from(2);
        }
    };
    let binary_dir =
        match args.update_binary_dir.as_ref().map(|d| d.canonicalize().map_err(|e| (d, e))).transpose() {
            Ok(d) => d,
            Err((d, e)) => {
                error!("--update-binary-dir {}: {e}", d.display());
                return ExitCode::from(2);
            }
        };
    let sockets = supervisor::SocketRules::of(spec);
    // A socket-activated daemon's socket goes on to every serving process.
    let activated = spec.functions.iter().find_map(|f| match f.socket {
        virtiofs_dpu::settings::Socket::ActivatedFd(fd) => Some(fd),
        _ => None,
    });
    let activated = match activated.map(virtiofs_dpu::sys::adopt_inherited_fd).transpose() {
        Ok(fd) => fd,
        Err(e) => {
            error!("socket activation: {e}");
            return ExitCode::from(2);
        }
    };
    let crash_limit = match supervisor::CrashLimit::parse(&args.crash_limit) {
        Ok(l) => l,
        Err(e) => {
            error!("--crash-limit {}: {e}", args.crash_limit);
            return ExitCode::from(2);
        }
    };
    let args = std::env::args_os().skip(1).collect();
    let launch = supervisor::Launch { binary, args, binary_dir, sockets, activated, crash_limit };
    supervisor::run(launch)
}

#[derive(clap::Args, Debug)]
struct StatsArgs {
    /// The daemon's --control-socket.
    #[arg(long, value_name = "PATH")]
    control_socket: PathBuf,
    /// Print get_stats's result as JSON.
    #[arg(long, conflicts_with = "prometheus")]
    json: bool,
    /// Print the Prometheus text exposition format (for a node exporter's textfile collector).
    #[arg(long)]
    prometheus: bool,
    /// Only this function (by tag); default: every function of the daemon (the Prometheus
    /// format: the first one, its metric names carry no function label).
    #[arg(long, value_name = "TAG")]
    function: Option<String>,
    /// Print again every SECONDS, like `iostat SECONDS`: the first report covers the time since
    /// the start (or the last reset_stats), each later one the last interval.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<f64>,
}

/// `virtiofs-dpu stats`.
fn stats_command(a: &StatsArgs) -> ExitCode {
    let Some(every) = a
        .watch
        .map(std::time::Duration::try_from_secs_f64)
        .transpose()
        .ok()
        .filter(|w| w.is_none_or(|w| !w.is_zero()))
    else {
        eprintln!("virtiofs-dpu stats: --watch needs a positive number of seconds");
        return ExitCode::from(2);
    };
    let format = match (a.json, a.prometheus) {
        (true, _) => Format::Json,
        (_, true) => Format::Prometheus,
        _ => Format::Table,
    };
    let result = ControlClient::connect(&a.control_socket).map_err(WatchError::from).and_then(|mut c| {
        report::watch(&mut c, a.function.as_deref(), format, every, &mut std::io::stdout().lock())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("virtiofs-dpu stats: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match &args.command {
        Some(Command::Stats(a)) => return stats_command(a),
        Some(Command::Update(a)) => return update_command(a),
        None => {}
    }
    let level = args
        .log_level
        .or_else(|| std::env::var("RUST_LOG").ok().and_then(|v| v.parse().ok()))
        .unwrap_or(LevelFilter::Info);
    if let Err(e) = logger::init(level, args.log_format, args.syslog) {
        eprintln!("virtiofs-dpu: {}", error_chain(&e));
        return ExitCode::from(2);
    }
    if let Some(why) = args.refused_option() {
        error!("{why}");
        return ExitCode::from(2);
    }
    if let Some(n) = args.thread_pool_size {
        warn!(
            "--thread-pool-size {n}: ignored: requests are served by the profile's pollers (one thread per \
             poller_cores entry, each owning its queues), not by a thread pool"
        );
    }
    let spec = args
        .command_line()
        .map_err(|e| error_chain(&e))
        .and_then(|cli| DaemonSpec::build(&cli).map_err(|e| error_chain(&e)));
    let role = match Role::from_env() {
        Ok(r) => r,
        Err(e) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    match spec {
        Ok(spec) if args.live_update && matches!(role, Role::Alone) => supervise(&args, &spec),
        Ok(spec) => virtiofs_dpu::daemon::run(spec, role),
        Err(e) => {
            error!("{e}");
            ExitCode::from(2)
        }
    }
}
