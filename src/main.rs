//! `virtiofs-dpu`: the virtio-fs device daemon. Serves a vfio-user socket that QEMU's
//! `vfio-user-pci` (or our host driver model) attaches; the guest mounts the tag with
//! `mount -t virtiofs TAG /mnt`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use log::{error, info, warn, LevelFilter};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use virtiofs_backend::filesystem::CachePolicy;
use virtiofs_backend::nfs::fs::NfsFs;
use virtiofs_backend::passthrough::sandbox::{self, SandboxMode};
use virtiofs_backend::passthrough::seccomp::{self, Network, SeccompMode};
use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::{PassthroughConfig, Policy};
use virtiofs_backend::ramfs::RamFsConfig;
use virtiofs_backend::server::ServerOptions;
use virtiofs_backend::{PassthroughFs, RamFs};
use virtiofs_device::poller::{PollerPool, RequestHandler};
use virtiofs_device::stats::DeviceStats;
use virtiofs_device::vfio_user::Listener;
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::functions::{Defaults, FunctionSet, FuseStatsFn};
use virtiofs_dpu::ops::control_socket::{BoundControlSocket, ControlClient, ControlState};
use virtiofs_dpu::ops::deploy;
use virtiofs_dpu::ops::logger::{self, LogFormat};
use virtiofs_dpu::ops::options::{self, BackendProfile};
use virtiofs_dpu::ops::report::{self, StatsReport};
use virtiofs_dpu::remote::{self, RemoteKeys};
use virtiofs_dpu::{error_chain, FuseHandler, FuseStats, PassthroughHandler};

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
    /// Group that owns the vfio-user socket and the control socket (a name or a gid), so that a
    /// QEMU or libvirt in that group, not root, can connect.
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Permission bits of the vfio-user socket and the control socket, octal (e.g. 0660;
    /// connecting needs write permission). Default: as the umask leaves them.
    #[arg(long, value_name = "MODE", value_parser = deploy::parse_mode)]
    socket_mode: Option<u32>,
    /// Serve JSON-RPC 2.0 on this unix socket (get_device, get_stats, reset_stats,
    /// set_log_level): read it with `virtiofs-dpu stats --control-socket PATH`.
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
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
    /// Serve this NFSv3 export instead: `nfs://HOST[:PORT]/EXPORT[?nfsport=N&mountport=M]`
    /// (PORT: the portmapper's, default 111; nfsport/mountport skip it). Overrides the
    /// profile's `remote`; the `nfs_*` profile keys tune it. Requests go with the guest
    /// caller's uid, gid and groups (AUTH_SYS).
    #[arg(long, value_name = "URL", conflicts_with = "shared_dir")]
    remote: Option<String>,
    /// With --shared-dir, how READ/WRITE/FSYNC are served: `hybrid` (zero-copy, inline when it
    /// cannot block, else on an io_uring per poller), `ring` (always on the io_uring) or `sync`
    /// (through the FUSE server with a bounce buffer).
    #[arg(long, value_name = "MODE", default_value = "hybrid", requires = "shared_dir")]
    io_mode: IoMode,
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
    #[arg(long, value_name = "MODE", default_value = "trap")]
    seccomp: SeccompMode,
    /// With --shared-dir, a comma-separated list of what the guest may not create on the host:
    /// `device-nodes` (MKNOD of character/block devices), `setid` (set-user-id bits, and
    /// set-group-id bits outside directories), `file-caps` (`security.capability` xattrs); each
    /// then fails EPERM. All are allowed by default: refuse them unless the host mounts the
    /// share nosuid,nodev.
    #[arg(long, value_name = "LIST", value_parser = Policy::refusing, requires = "shared_dir")]
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
        value_parser = options::parse_size,
        conflicts_with = "shared_dir",
        help_heading = "Filesystem (virtiofsd's options)"
    )]
    ramfs_size: Option<u64>,
    /// Inodes the RAM filesystem may hold, the root included; creating more fails with ENOSPC.
    /// Overrides the profile's `ramfs_inodes`. Default 1048576.
    #[arg(
        long,
        value_name = "N",
        value_parser = options::parse_inodes,
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
    /// What the FUSE server offers, from --no-xattr and --(no-)readdirplus.
    fn server_options(&self) -> ServerOptions {
        let never = self.cache == Some(CachePolicy::Never);
        ServerOptions {
            xattr: !self.no_xattr,
            readdirplus: self.readdirplus || (!self.no_readdirplus && !never),
            writeback: self.writeback,
        }
    }

    /// Whether FUSE_POSIX_ACL is offered: unless --no-posix-acl or --no-xattr.
    fn posix_acl(&self) -> bool {
        !self.no_posix_acl && !self.no_xattr
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

    /// The RAM filesystem's configuration: the flags over the profile's keys over the defaults.
    fn ramfs_config(&self, keys: &BackendProfile) -> RamFsConfig {
        let mut cfg = RamFsConfig::default();
        cfg.cache = self.cache.unwrap_or(cfg.cache);
        cfg.capacity = self.ramfs_size.or(keys.ramfs_size).unwrap_or(cfg.capacity);
        cfg.max_inodes = self.ramfs_inodes.or(keys.ramfs_inodes).unwrap_or(cfg.max_inodes);
        cfg.posix_acl = self.posix_acl();
        cfg
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
    let fail = |e: &dyn std::error::Error| {
        eprintln!("virtiofs-dpu stats: {}", error_chain(e));
        ExitCode::FAILURE
    };
    if a.watch.is_some_and(|w| !(w > 0.0 && w.is_finite())) {
        eprintln!("virtiofs-dpu stats: --watch needs a positive number of seconds");
        return ExitCode::from(2);
    }
    let mut client = match ControlClient::connect(&a.control_socket) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let tags: Vec<Option<String>> = match &a.function {
        Some(t) => vec![Some(t.clone())],
        None if a.prometheus => vec![None],
        None => match client.call("list_functions", serde_json::Value::Null) {
            Ok(serde_json::Value::Array(l)) if l.len() > 1 => {
                l.iter().map(|f| f["tag"].as_str().map(str::to_string)).collect()
            }
            // One function, or a daemon without list_functions: the first (only) one.
            _ => vec![None],
        },
    };
    let mut prev: Vec<Option<StatsReport>> = vec![None; tags.len()];
    loop {
        for (tag, prev) in tags.iter().zip(prev.iter_mut()) {
            let params = tag.as_ref().map_or(serde_json::Value::Null, |t| serde_json::json!({ "tag": t }));
            let value = match client.call("get_stats", params) {
                Ok(v) => v,
                Err(e) => return fail(&e),
            };
            let now: StatsReport = match serde_json::from_value(value.clone()) {
                Ok(r) => r,
                Err(e) => return fail(&e),
            };
            let shown = match &*prev {
                Some(p) => now.since(p),
                None => now.clone(),
            };
            let text = if a.json {
                format!("{}\n", serde_json::to_string(&shown).unwrap_or_default())
            } else if a.prometheus {
                report::prometheus(&now)
            } else {
                report::table(&shown)
            };
            print!("{text}");
            if (a.watch.is_some() || tags.len() > 1) && !a.json && !a.prometheus {
                println!();
            }
            *prev = Some(now);
        }
        let Some(w) = a.watch else { return ExitCode::SUCCESS };
        std::thread::sleep(std::time::Duration::from_secs_f64(w));
    }
}

/// The statistics file: opened at start (a sandboxed daemon could not open it later), rewritten
/// in place at each report.
struct StatsFile(File);

impl StatsFile {
    fn create(path: &std::path::Path) -> std::io::Result<Self> {
        File::create(path).map(StatsFile)
    }

    /// Replaces the file's contents with the functions' statistics: the first one's as
    /// `device` and `fuse`, and with several functions every one under `functions`.
    fn write(&self, all: &[(String, DeviceStats, FuseStats)]) {
        let Some((_, stats, fuse)) = all.first() else { return };
        let mut report = serde_json::json!({ "device": stats, "fuse": fuse });
        if all.len() > 1 {
            let each: Vec<serde_json::Value> = all
                .iter()
                .map(|(tag, d, f)| serde_json::json!({"tag": tag, "device": d, "fuse": f}))
                .collect();
            report["functions"] = serde_json::Value::Array(each);
        }
        let mut text = report.to_string();
        text.push('\n');
        let r = self.0.set_len(0).and_then(|()| self.0.write_all_at(text.as_bytes(), 0));
        if let Err(e) = r {
            warn!("cannot write the statistics file: {e}");
        }
    }

    /// [`Self::write`] of the running functions.
    fn write_all(&self, functions: &FunctionSet) {
        let all: Vec<(String, DeviceStats, FuseStats)> = functions
            .tags()
            .into_iter()
            .filter_map(|t| functions.stats(Some(&t)).map(|(d, f)| (t, d, f)))
            .collect();
        self.write(&all);
    }
}

fn main() -> ExitCode {
    let matches = Args::command().get_matches();
    let args = match Args::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    if let Some(Command::Stats(a)) = &args.command {
        return stats_command(a);
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
    // The profile file's table; its `[[function]]` array, if any, makes a daemon of several
    // functions (the rest are the daemon's keys and the functions' defaults).
    let (mut file_table, function_tables, sandbox_root) = match &args.config {
        Some(path) => match read_table(path) {
            Ok((t, f)) => {
                let root = t.get("sandbox_root").map(|v| v.as_str().map(PathBuf::from));
                match root {
                    Some(None) => {
                        error!("profile {}: `sandbox_root` must be a path", path.display());
                        return ExitCode::from(2);
                    }
                    Some(Some(_)) if f.is_none() => {
                        error!(
                            "profile {}: `sandbox_root` is for a profile with [[function]] tables",
                            path.display()
                        );
                        return ExitCode::from(2);
                    }
                    r => (t, f, r.flatten()),
                }
            }
            Err(e) => {
                error!("profile {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
        None => (toml::Table::new(), None, None),
    };
    let (mut profile, backend_keys, remote_keys) = match &args.config {
        Some(path) => {
            if function_tables.is_some() {
                // The daemon-wide part: every key a function table may override stays a default.
                file_table.retain(|k, _| k != "remote" && k != "sandbox_root" && !k.starts_with("nfs_"));
            }
            match remote::split_profile(
                &toml::to_string(&file_table).unwrap_or_default(),
                &path.display().to_string(),
            ) {
                Ok(p) => p,
                Err(e) => {
                    error!("profile {}: {}", path.display(), error_chain(&e));
                    return ExitCode::from(2);
                }
            }
        }
        None => (Profile::default(), BackendProfile::default(), RemoteKeys::default()),
    };
    if let Some(tables) = function_tables {
        return serve_functions(&args, &matches, profile, &file_table, tables, sandbox_root);
    }
    let remote_url = args.remote.clone().or_else(|| remote_keys.remote.clone());
    if let Err(msg) = check_backend_flags(&matches, &args, remote_url.is_some()) {
        error!("{msg}");
        return ExitCode::from(2);
    }
    if (args.shared_dir.is_some() || remote_url.is_some()) && backend_keys != BackendProfile::default() {
        warn!("the profile's ramfs_size and ramfs_inodes apply to the RAM filesystem only");
    }
    if let Err(e) = set_nofile_limit(args.rlimit_nofile) {
        error!("{e}");
        return ExitCode::FAILURE;
    }
    if let Some(tag) = args.tag.clone() {
        profile.tag = tag;
    }
    if let Err(e) = profile.validate().and_then(|()| profile.check_machine()) {
        let from = args
            .config
            .as_ref()
            .map_or("the default profile".to_string(), |p| format!("profile {}", p.display()));
        error!("{from}: {}", error_chain(&e));
        return ExitCode::from(2);
    }
    let notifier = match deploy::Notifier::from_env() {
        Ok(n) => n,
        Err(e) => {
            error!("{}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let gid = match args.socket_group.as_deref().map(deploy::group_id).transpose() {
        Ok(g) => g,
        Err(e) => {
            error!("{}", error_chain(&e));
            return ExitCode::from(2);
        }
    };
    let remote_fs = match remote_url.as_deref() {
        Some(url) => match mount_remote(url, &remote_keys, &args) {
            Ok(fs) => Some(fs),
            Err(code) => return code,
        },
        None => None,
    };
    let listener = match bind_vfio_user(&args, gid) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let mut control = match args.control_socket.as_deref().map(BoundControlSocket::bind).transpose() {
        Ok(c) => c,
        Err(e) => {
            error!("{}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    if let Some(c) = &control {
        if let Err(e) = deploy::set_socket_access(c.path(), gid, args.socket_mode) {
            error!("{}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    }
    let started_at = std::time::Instant::now();
    let (stats_file, signals) = match stats_file_and_signals(&args) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let config = effective_config(&args, &profile, &backend_keys, remote_url.as_deref(), &remote_keys);
    info!("starting: {}", startup_line(&config));
    let runtime_ok = match (&args.shared_dir, remote_fs.is_some()) {
        (None, false) => true,
        _ => {
            args.sandbox.unwrap_or_else(SandboxMode::default_for_this_process) == SandboxMode::None
                && args.seccomp == SeccompMode::Off
        }
    };
    let kind = config["backend"]["kind"].as_str().map_or("ramfs", |k| {
        if k == "nfs" {
            "nfs"
        } else if k == "passthrough" {
            "passthrough"
        } else {
            "ramfs"
        }
    });
    let (listener, handler, fuse_stats): Confined = match (args.shared_dir.as_deref(), remote_fs) {
        (None, Some(fs)) => match confine_and_serve_remote(fs, &args, listener, control.as_mut()) {
            Ok(c) => c,
            Err(code) => return code,
        },
        (None, None) => {
            let cfg = args.ramfs_config(&backend_keys);
            let handler = Arc::new(FuseHandler::with_options(RamFs::with_config(cfg), args.server_options()));
            let h = handler.clone();
            (listener, handler, Arc::new(move || h.stats()))
        }
        (Some(dir), _) => match confine_and_serve(dir, &args, listener, control.as_mut()) {
            Ok(c) => c,
            Err(code) => return code,
        },
    };
    // The pollers start only now, once the process is confined: they inherit it.
    let pool = match PollerPool::spawn(&profile) {
        Ok(p) => p,
        Err(e) => {
            error!("cannot start the pollers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let defaults = runtime_ok.then(|| function_defaults(&args, &file_table));
    let functions = Arc::new(FunctionSet::new(
        pool,
        defaults,
        "the daemon is confined (sandbox or seccomp) and can bind no new socket",
    ));
    if let Err(e) = functions.start(listener, profile, handler, fuse_stats, kind, None, config.clone()) {
        error!("{}", error_chain(&e));
        return ExitCode::FAILURE;
    }
    serve(functions, config, control, notifier, signals, stats_file, started_at)
}

/// The statistics file (opened now, before any sandbox) and the signal handlers.
fn stats_file_and_signals(
    args: &Args,
) -> Result<(Option<StatsFile>, signal_hook::iterator::Signals), ExitCode> {
    let stats_file = args.stats_file.as_deref().map(StatsFile::create).transpose().map_err(|e| {
        error!("cannot create the statistics file: {e}");
        ExitCode::from(2)
    })?;
    let signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGUSR1, SIGHUP]).map_err(|e| {
        error!("cannot install signal handlers: {e}");
        ExitCode::FAILURE
    })?;
    Ok((stats_file, signals))
}

/// Reads a profile file's table and takes its `[[function]]` array out.
fn read_table(path: &std::path::Path) -> Result<(toml::Table, Option<Vec<toml::Table>>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| e.to_string())?;
    let functions = match table.remove("function") {
        None => None,
        Some(toml::Value::Array(a)) => {
            let mut out = Vec::new();
            for (i, v) in a.into_iter().enumerate() {
                match v {
                    toml::Value::Table(t) => out.push(t),
                    _ => return Err(format!("function {i}: not a table (write [[function]])")),
                }
            }
            Some(out)
        }
        Some(_) => return Err("`function` must be an array of tables ([[function]])".into()),
    };
    Ok((table, functions))
}

/// A daemon of several functions from the profile's `[[function]]` tables, on one pool of
/// pollers. Every socket is bound first; then, when a function serves a host directory, the
/// process is confined as a `--shared-dir` daemon is, with `sandbox_root` (a directory holding
/// every function's `shared_dir`) as its root, each function's passthrough opened beneath its
/// own directory there; only then do the backends, the pollers and the control planes start.
fn serve_functions(
    args: &Args,
    m: &clap::ArgMatches,
    profile: Profile,
    file_table: &toml::Table,
    tables: Vec<toml::Table>,
    sandbox_root: Option<PathBuf>,
) -> ExitCode {
    use virtiofs_dpu::functions::{BackendSpec, Built};
    let fail = |code: u8, e: &dyn std::error::Error| {
        error!("{}", error_chain(e));
        ExitCode::from(code)
    };
    let given = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    for flag in ["socket_path", "fd", "shared_dir", "remote", "tag", "ramfs_size", "ramfs_inodes"] {
        if given(flag) {
            error!(
                "--{}: the profile lists functions ([[function]]): give each one's settings in its table",
                flag.replace('_', "-")
            );
            return ExitCode::from(2);
        }
    }
    if tables.is_empty() {
        error!("the profile's [[function]] list is empty");
        return ExitCode::from(2);
    }
    if let Err(e) = profile.check_machine() {
        return fail(2, &e);
    }
    let gid = match args.socket_group.as_deref().map(deploy::group_id).transpose() {
        Ok(g) => g,
        Err(e) => return fail(2, &e),
    };
    let defaults = function_defaults(args, file_table);
    let mut specs = Vec::new();
    for (i, t) in tables.into_iter().enumerate() {
        match virtiofs_dpu::functions::parse_function(&defaults, t) {
            Ok(spec) => specs.push(spec),
            Err(e) => {
                error!("function {i}: {}", error_chain(&e));
                return ExitCode::from(2);
            }
        }
    }
    let shared = specs.iter().any(|s| matches!(s.backend, BackendSpec::SharedDir(_)));
    let remote = specs.iter().any(|s| matches!(s.backend, BackendSpec::Remote(..)));
    let host = shared || remote;
    if !host && (given("sandbox") || given("seccomp")) {
        error!("--sandbox and --seccomp apply when a function has a shared_dir or a remote");
        return ExitCode::from(2);
    }
    let mode = if shared {
        args.sandbox.unwrap_or_else(SandboxMode::default_for_this_process)
    } else {
        SandboxMode::None
    };
    let seccomp = if host { args.seccomp } else { SeccompMode::Off };
    // With a namespace, every shared directory as a path beneath the sandbox root.
    let mut inside: Vec<Option<PathBuf>> = Vec::new();
    let root = match (mode, &sandbox_root) {
        (SandboxMode::Namespace, _) if remote => {
            error!("functions with a remote and a namespace sandbox: not supported yet (the namespace would take the network); use --sandbox none");
            return ExitCode::from(2);
        }
        (SandboxMode::Namespace, None) => {
            error!("functions with a shared_dir under --sandbox namespace need `sandbox_root` in the profile (a directory holding every function's shared_dir), or --sandbox none");
            return ExitCode::from(2);
        }
        (SandboxMode::Namespace, Some(r)) => match std::fs::canonicalize(r) {
            Ok(r) => Some(r),
            Err(e) => {
                error!("sandbox_root {}: {e}", r.display());
                return ExitCode::from(2);
            }
        },
        (SandboxMode::None, _) => None,
    };
    for spec in &specs {
        let BackendSpec::SharedDir(cfg) = &spec.backend else {
            inside.push(None);
            continue;
        };
        // Checked on the host's terms first, as --shared-dir is.
        if let Err(e) = PassthroughFs::new(cfg.clone()) {
            error!("function {:?}: shared_dir {}: {}", spec.profile.tag, cfg.root.display(), error_chain(&e));
            return ExitCode::from(2);
        }
        let Some(root) = &root else {
            inside.push(None);
            continue;
        };
        let beneath = std::fs::canonicalize(&cfg.root)
            .ok()
            .and_then(|d| d.strip_prefix(root).ok().map(|r| std::path::Path::new("/").join(r)));
        match beneath {
            Some(p) => inside.push(Some(p)),
            None => {
                error!(
                    "function {:?}: shared_dir {} is not beneath sandbox_root {}",
                    spec.profile.tag,
                    cfg.root.display(),
                    root.display()
                );
                return ExitCode::from(2);
            }
        }
    }
    if let Err(e) = set_nofile_limit(args.rlimit_nofile) {
        error!("{e}");
        return ExitCode::FAILURE;
    }
    let notifier = match deploy::Notifier::from_env() {
        Ok(n) => n,
        Err(e) => return fail(1, &e),
    };
    // Every socket now, before any sandbox and before any thread.
    let mut listeners = Vec::new();
    for spec in &specs {
        match Listener::bind(&spec.socket_path) {
            Ok(l) => listeners.push(l),
            Err(e) => return fail(1, &e),
        }
        if let Err(e) = deploy::set_socket_access(&spec.socket_path, gid, args.socket_mode) {
            return fail(1, &e);
        }
    }
    let mut control = match args.control_socket.as_deref().map(BoundControlSocket::bind).transpose() {
        Ok(c) => c,
        Err(e) => return fail(1, &e),
    };
    if let Some(c) = &control {
        if let Err(e) = deploy::set_socket_access(c.path(), gid, args.socket_mode) {
            return fail(1, &e);
        }
    }
    let started_at = std::time::Instant::now();
    let (stats_file, signals) = match stats_file_and_signals(args) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let mut proc_fd = None;
    if let Some(root) = &root {
        // Where each socket is once the root is the sandbox root (canonical paths, on the host
        // still): a socket beneath it is removed through that path when its function goes; one
        // elsewhere cannot be reached from inside and stays (DESIGN.md, "Functions").
        let canonical_root = std::fs::canonicalize(root).ok();
        let inside: Vec<Option<PathBuf>> = listeners
            .iter()
            .map(|l| {
                let sock = std::fs::canonicalize(l.path()).ok()?;
                let rel = sock.strip_prefix(canonical_root.as_deref()?).ok()?;
                Some(std::path::Path::new("/").join(rel))
            })
            .collect();
        let confined = match sandbox::enter_namespace(root) {
            Ok(c) => c,
            Err(e) => return fail(1, &e),
        };
        for (l, inside) in listeners.iter_mut().zip(inside) {
            match inside {
                Some(p) => l.socket_file_now_at(p),
                None => l.keep_socket_file(),
            }
        }
        if let Some(c) = control.as_mut() {
            c.keep_socket_file();
        }
        info!(
            "sandbox: new mount, IPC and network namespaces; root is now {} (every function's shared_dir beneath it)",
            root.display()
        );
        proc_fd = Some(confined.proc_self_fd);
    }
    // The backends, on this thread: each passthrough opened inside the new root.
    let mut built = Vec::new();
    for (spec, inside) in specs.iter_mut().zip(&inside) {
        let backend = std::mem::replace(&mut spec.backend, BackendSpec::Ram(Default::default()));
        let backend = match (backend, inside) {
            (BackendSpec::SharedDir(mut cfg), Some(p)) => {
                cfg.root = p.clone();
                BackendSpec::SharedDir(cfg)
            }
            (b, _) => b,
        };
        let fd = match (&proc_fd, matches!(backend, BackendSpec::SharedDir(_))) {
            (Some(fd), true) => match fd.try_clone() {
                Ok(f) => Some(f),
                Err(e) => {
                    error!("cannot duplicate the sandbox's /proc/self/fd: {e}");
                    return ExitCode::FAILURE;
                }
            },
            _ => None,
        };
        match Built::new(backend, defaults.server_options, defaults.io_mode, fd) {
            Ok(b) => built.push(b),
            Err(e) => {
                error!("function {:?}: {}", spec.profile.tag, error_chain(&e));
                return ExitCode::FAILURE;
            }
        }
    }
    drop(proc_fd);
    if host {
        let caps = if shared { sandbox::KEPT_CAPS } else { sandbox::NFS_KEPT_CAPS };
        match sandbox::drop_privileges_keeping(caps) {
            Ok(d) if d.privileged => {
                info!("no_new_privs, {} capabilities dropped from the bounding set", d.bounding)
            }
            Ok(_) => info!("unprivileged, no_new_privs set"),
            Err(e) => return fail(1, &e),
        }
        let net = if remote { Network::TcpClient } else { Network::None };
        if let Err(e) = seccomp::install_with(seccomp, net) {
            return fail(1, &e);
        }
    }
    let confined = mode == SandboxMode::Namespace || seccomp != SeccompMode::Off;
    let pool = match PollerPool::spawn(&profile) {
        Ok(p) => p,
        Err(e) => {
            error!("cannot start the pollers: {e}");
            return ExitCode::FAILURE;
        }
    };
    info!(
        "starting {} functions on {} shared poller(s) (cores {:?}, polling {:?}); sandbox {:?}, seccomp {:?}",
        specs.len(),
        pool.pollers(),
        profile.poller_cores,
        profile.polling,
        mode,
        seccomp
    );
    let functions = Arc::new(FunctionSet::new(
        pool,
        (!confined).then(|| defaults.clone()),
        "the daemon is confined (sandbox or seccomp) and can bind no new socket",
    ));
    for ((spec, listener), b) in specs.into_iter().zip(listeners).zip(built) {
        let tag = spec.profile.tag.clone();
        if let Err(e) =
            functions.start_built(listener, spec.profile, spec.pollers.as_deref(), spec.socket_path, b)
        {
            error!("function {tag:?}: {}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    }
    let config = serde_json::json!({
        "profile_file": args.config,
        "profile": profile,
        "sandbox_root": root,
        "sandbox": format!("{mode:?}").to_lowercase(),
        "seccomp": format!("{seccomp:?}").to_lowercase(),
        "functions": functions.list(),
        "control_socket": args.control_socket,
    });
    serve(functions, config, control, notifier, signals, stats_file, started_at)
}

/// The defaults a run-time function inherits: the profile file's device keys, the command
/// line's FUSE options.
fn function_defaults(args: &Args, file_table: &toml::Table) -> Defaults {
    let mut d = Defaults::from_profile_table(file_table);
    d.server_options = args.server_options();
    d.posix_acl = args.posix_acl();
    d.cache = args.cache;
    d.io_mode = args.io_mode;
    d
}

/// Serves the functions until a signal stops the daemon: the control socket, readiness, the
/// statistics on SIGUSR1, the orderly stop.
fn serve(
    functions: Arc<FunctionSet>,
    config: serde_json::Value,
    control: Option<BoundControlSocket>,
    notifier: Option<deploy::Notifier>,
    mut signals: signal_hook::iterator::Signals,
    stats_file: Option<StatsFile>,
    started_at: std::time::Instant,
) -> ExitCode {
    let control = match control {
        None => None,
        Some(bound) => {
            let state = ControlState { functions: functions.clone(), config, started: started_at };
            match bound.serve(state) {
                Ok(c) => {
                    info!("control socket {}", c.path().display());
                    Some(c)
                }
                Err(e) => {
                    error!("{}", error_chain(&e));
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    if let Some(n) = &notifier {
        match n.notify(&format!("READY=1\nMAINPID={}", std::process::id())) {
            Ok(()) => info!("told the service manager READY=1"),
            Err(e) => warn!("{}", error_chain(&e)),
        }
    }
    for sig in signals.forever() {
        match sig {
            SIGUSR1 => {
                for tag in functions.tags() {
                    if let Some((d, fuse)) = functions.stats(Some(&tag)) {
                        log_stats(&tag, &d, &fuse);
                    }
                }
                if let Some(f) = &stats_file {
                    f.write_all(&functions);
                }
            }
            SIGHUP => info!("SIGHUP: nothing to reload (the profile is read at start); ignored"),
            _ => {
                info!("signal {sig}: shutting down");
                exit_anyway_after(SHUTDOWN_BOUND);
                break;
            }
        }
    }
    if let Some(Err(e)) = notifier.as_ref().map(|n| n.notify("STOPPING=1")) {
        warn!("{}", error_chain(&e));
    }
    if let Some(c) = control {
        c.stop();
    }
    let mut code = ExitCode::SUCCESS;
    let mut finals = Vec::new();
    for (tag, result, fuse) in functions.stop_all() {
        match result {
            Ok(stats) => {
                let per_queue: Vec<String> =
                    stats.requests().iter().enumerate().map(|(i, n)| format!("q{i}={n}")).collect();
                info!("{tag}: requests per queue: {}", per_queue.join(" "));
                info!("{tag}: bad chains per queue: {:?}", stats.bad_chains());
                finals.push((tag, stats, fuse));
            }
            Err(e) => {
                error!("{tag}: {}", error_chain(&e));
                code = ExitCode::FAILURE;
            }
        }
    }
    if let Some(f) = &stats_file {
        f.write(&finals);
    }
    code
}

/// `--shared-dir`: checks the directory, binds the socket, confines the process (namespaces,
/// capabilities, seccomp: see `virtiofs_backend::passthrough::sandbox`) and only then starts the
/// device's threads, which inherit all of it.
fn confine_and_serve(
    dir: &std::path::Path,
    args: &Args,
    mut listener: Listener,
    control: Option<&mut BoundControlSocket>,
) -> Result<Confined, ExitCode> {
    let fail = |code: u8, e: &dyn std::error::Error| {
        error!("{}", error_chain(e));
        ExitCode::from(code)
    };
    let config = |root: &std::path::Path| {
        let mut cfg = PassthroughConfig::new(root);
        cfg.cache = args.cache.unwrap_or(cfg.cache);
        cfg.policy = args.refuse.unwrap_or_default();
        cfg.posix_acl = args.posix_acl();
        cfg
    };
    // The directory is checked on the host's terms first (the same errors in every mode).
    let fs = PassthroughFs::new(config(dir)).map_err(|e| fail(2, &e))?;
    info!("shared directory {}, cache {}", dir.display(), config(dir).cache);
    let mode = args.sandbox.unwrap_or_else(SandboxMode::default_for_this_process);
    let fs = match mode {
        SandboxMode::None => {
            info!("shared directory {}: no sandbox (--sandbox=none)", dir.display());
            fs
        }
        SandboxMode::Namespace => {
            drop(fs);
            let confined = sandbox::enter_namespace(dir).map_err(|e| fail(1, &e))?;
            // The path no longer names the socket (it would name a file in the share).
            listener.keep_socket_file();
            if let Some(c) = control {
                c.keep_socket_file();
            }
            info!(
                "sandbox: new mount, IPC and network namespaces; root is now {} (procfs {})",
                confined.shared_dir.display(),
                if confined.proc_restricted { "subset=pid,hidepid=invisible" } else { "unrestricted" }
            );
            // Everything the passthrough holds is opened here, inside the new root.
            PassthroughFs::with_proc_fd(config(std::path::Path::new("/")), confined.proc_self_fd)
                .map_err(|e| fail(1, &e))?
        }
    };
    match sandbox::drop_privileges() {
        Ok(d) if d.privileged => info!(
            "no_new_privs, {} capabilities dropped from the bounding set, kept {}",
            d.bounding,
            sandbox::KEPT_CAPS.iter().map(|c| c.1).collect::<Vec<_>>().join(",")
        ),
        Ok(_) => info!("unprivileged, no_new_privs set"),
        Err(e) => return Err(fail(1, &e)),
    }
    seccomp::install(args.seccomp).map_err(|e| fail(1, &e))?;
    match args.seccomp {
        SeccompMode::Off => info!("seccomp: off"),
        m => info!("seccomp: {} system calls allowed, others: {m:?}", seccomp::allowlist().len()),
    }
    let handler = Arc::new(PassthroughHandler::with_options(fs, args.io_mode, args.server_options()));
    let h = handler.clone();
    Ok((listener, handler, Arc::new(move || h.stats())))
}

/// The backend flags that need a host backend (`--shared-dir` or a remote) and the ones that
/// exclude each other, as given on the command line.
fn check_backend_flags(m: &clap::ArgMatches, args: &Args, remote: bool) -> Result<(), String> {
    let given = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    if args.shared_dir.is_some() && remote {
        return Err(
            "--shared-dir and a remote (--remote or the profile's `remote`) exclude each other".into()
        );
    }
    if args.shared_dir.is_none() && !remote {
        for flag in ["sandbox", "seccomp"] {
            if given(flag) {
                return Err(format!("--{flag} needs --shared-dir or --remote"));
            }
        }
    }
    if remote && given("io_mode") {
        return Err("--io-mode is for --shared-dir".into());
    }
    if remote && args.writeback {
        return Err(
            "--writeback is for the RAM filesystem and --shared-dir: the NFS backend does not offer it"
                .into(),
        );
    }
    Ok(())
}

/// `--remote` (or the profile's `remote`): mounts the NFS export on this thread (blocking,
/// before any other thread exists and before the socket is bound, so a daemon that cannot mount
/// leaves no socket); [`confine_and_serve_remote`] then confines the process in the NFS mode of
/// the sandbox (mount and IPC namespaces with an empty read-only root but the host's network,
/// no capabilities, the allowlist with the TCP client's calls: see
/// `virtiofs_backend::passthrough::sandbox`) and only then starts the device, whose pollers
/// each connect to the server.
fn mount_remote(url: &str, keys: &RemoteKeys, args: &Args) -> Result<NfsFs, ExitCode> {
    let fail = |code: u8, e: &dyn std::error::Error| {
        error!("{}", error_chain(e));
        ExitCode::from(code)
    };
    let opts = remote::nfs_options(url, keys, args.cache).map_err(|e| fail(2, &e))?;
    info!(
        "NFS export {url}, cache {}, timeout {:?}, retransmit {:?}, {} slots per poller",
        opts.cache, opts.timeout, opts.retransmit, opts.slots_per_poller
    );
    NfsFs::connect(opts).map_err(|e| fail(1, &e))
}

/// Serves the mounted export `fs` on `listener` once the process is confined (see
/// [`mount_remote`]).
fn confine_and_serve_remote(
    fs: NfsFs,
    args: &Args,
    mut listener: Listener,
    control: Option<&mut BoundControlSocket>,
) -> Result<Confined, ExitCode> {
    let fail = |code: u8, e: &dyn std::error::Error| {
        error!("{}", error_chain(e));
        ExitCode::from(code)
    };
    match args.sandbox.unwrap_or_else(SandboxMode::default_for_this_process) {
        SandboxMode::None => info!("NFS export: no sandbox (--sandbox=none)"),
        SandboxMode::Namespace => {
            sandbox::enter_namespace_keeping_network().map_err(|e| fail(1, &e))?;
            listener.keep_socket_file();
            if let Some(c) = control {
                c.keep_socket_file();
            }
            info!("sandbox: new mount and IPC namespaces (the network kept for the NFS server), root an empty read-only tmpfs");
        }
    }
    match sandbox::drop_privileges_keeping(sandbox::NFS_KEPT_CAPS) {
        Ok(d) if d.privileged => info!("no_new_privs, {} capabilities dropped, none kept", d.bounding),
        Ok(_) => info!("unprivileged, no_new_privs set"),
        Err(e) => return Err(fail(1, &e)),
    }
    seccomp::install_with(args.seccomp, Network::TcpClient).map_err(|e| fail(1, &e))?;
    match args.seccomp {
        SeccompMode::Off => info!("seccomp: off"),
        m => info!(
            "seccomp: {} system calls allowed (TCP client included), others: {m:?}",
            seccomp::allowlist_with(Network::TcpClient).len()
        ),
    }
    let handler = Arc::new(FuseHandler::with_options(fs, args.server_options()));
    let h = handler.clone();
    let stats = move || FuseStats { nfs: Some(h.server().filesystem().stats()), ..h.stats() };
    Ok((listener, handler, Arc::new(stats)))
}

/// A confined process's socket, handler and FUSE statistics, ready to start.
type Confined = (Listener, Arc<dyn RequestHandler>, FuseStatsFn);

/// The vfio-user socket: the descriptor of `--fd` or of systemd socket activation, or
/// `--socket-path` bound now, given the group and mode asked for.
fn bind_vfio_user(args: &Args, gid: Option<u32>) -> Result<Listener, ExitCode> {
    let fail = |code: u8, e: &dyn std::error::Error| {
        error!("{}", error_chain(e));
        ExitCode::from(code)
    };
    let fd = match args.fd {
        Some(fd) => Some(fd),
        None if args.socket_path.is_none() => deploy::systemd_listen_fd().map_err(|e| fail(2, &e))?,
        None => None,
    };
    if let Some(fd) = fd {
        let l = deploy::adopt_listener(fd).map_err(|e| fail(2, &e))?;
        let name = l.local_addr().ok().and_then(|a| a.as_pathname().map(|p| p.to_path_buf()));
        let name = name.unwrap_or_else(|| PathBuf::from(format!("fd {fd}")));
        if gid.is_some() || args.socket_mode.is_some() {
            warn!(
                "--socket-group and --socket-mode do not apply to an inherited socket ({})",
                name.display()
            );
        }
        return Listener::from_std(l, name).map_err(|e| fail(1, &e));
    }
    let Some(path) = &args.socket_path else {
        error!("no socket: give --socket-path, --fd, or start under systemd socket activation");
        return Err(ExitCode::from(2));
    };
    let listener = Listener::bind(path).map_err(|e| fail(1, &e))?;
    deploy::set_socket_access(path, gid, args.socket_mode).map_err(|e| fail(1, &e))?;
    Ok(listener)
}

/// The effective configuration, as `get_device` reports it and the start-up line summarizes.
fn effective_config(
    args: &Args,
    profile: &Profile,
    backend_keys: &BackendProfile,
    remote_url: Option<&str>,
    keys: &RemoteKeys,
) -> serde_json::Value {
    let pollers: Vec<serde_json::Value> = (0..profile.pollers())
        .map(|p| {
            let queues: Vec<u16> =
                (0..=profile.request_queues).filter(|&q| profile.poller_of(q) == p).collect();
            serde_json::json!({"poller": p, "core": profile.poller_cores.get(p), "queues": queues})
        })
        .collect();
    let opts = args.server_options();
    let backend = match &args.shared_dir {
        None if remote_url.is_some() => {
            match remote::nfs_options(remote_url.unwrap_or_default(), keys, args.cache) {
                Ok(o) => serde_json::json!({
                    "kind": "nfs",
                    "url": remote_url,
                    "cache": o.cache.to_string(),
                    "timeout_ms": o.timeout.as_millis() as u64,
                    "retransmit_ms": o.retransmit.as_millis() as u64,
                    "slots_per_poller": o.slots_per_poller,
                    "max_nodes": o.max_nodes,
                    "unstable_bytes": o.unstable_bytes,
                    "sandbox": format!("{:?}", args.sandbox.unwrap_or_else(SandboxMode::default_for_this_process)).to_lowercase(),
                    "seccomp": format!("{:?}", args.seccomp).to_lowercase(),
                }),
                Err(e) => serde_json::json!({"kind": "nfs", "url": remote_url, "error": e.to_string()}),
            }
        }
        None => {
            let cfg = args.ramfs_config(backend_keys);
            serde_json::json!({
                "kind": "ramfs",
                "cache": cfg.cache.to_string(),
                "size": cfg.capacity,
                "inodes": cfg.max_inodes,
                "xattr": opts.xattr,
                "posix_acl": cfg.posix_acl,
                "readdirplus": opts.readdirplus,
                "writeback": opts.writeback,
            })
        }
        Some(dir) => serde_json::json!({
            "kind": "passthrough",
            "shared_dir": dir,
            "cache": args.cache.unwrap_or(PassthroughConfig::new(dir).cache).to_string(),
            "xattr": opts.xattr,
            "posix_acl": args.posix_acl(),
            "readdirplus": opts.readdirplus,
            "writeback": opts.writeback,
            "io_mode": format!("{:?}", args.io_mode).to_lowercase(),
            "sandbox": format!("{:?}", args.sandbox.unwrap_or_else(SandboxMode::default_for_this_process)).to_lowercase(),
            "seccomp": format!("{:?}", args.seccomp).to_lowercase(),
        }),
    };
    serde_json::json!({
        "profile_file": args.config,
        "profile": profile,
        "doorbells_effective": if profile.doorbells_on_socket() { "socket" } else { "shared" },
        "pollers": pollers,
        "backend": backend,
        "socket": args.socket_path,
        "fd": args.fd,
        "control_socket": args.control_socket,
        "stats_file": args.stats_file,
        "log": {"level": log::max_level().to_string().to_lowercase(), "format": args.log_format, "syslog": args.syslog},
    })
}

/// One line of the effective configuration's main points.
fn startup_line(c: &serde_json::Value) -> String {
    let p = &c["profile"];
    let b = &c["backend"];
    let s = |v: &serde_json::Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
    format!(
        "profile {}, tag {}, {} request queue(s) of {} entries, {} poller(s) (cores {}), polling {}, doorbells {}, {} rings{}, backend {} (cache {}{}{}, xattr {}, posix acl {}, readdirplus {}{}), latency histograms {}",
        c["profile_file"].as_str().unwrap_or("(built-in default)"),
        p["tag"],
        p["request_queues"],
        p["queue_size"],
        c["pollers"].as_array().map_or(0, Vec::len),
        if p["poller_cores"].as_array().is_some_and(|a| !a.is_empty()) { p["poller_cores"].to_string() } else { "any".into() },
        s(&p["polling"]),
        s(&c["doorbells_effective"]),
        if p["packed_ring"].as_bool() == Some(true) { "split or packed" } else { "split" },
        format_args!(", queue mapping {}", s(&p["queue_mapping"])),
        s(&b["kind"]),
        s(&b["cache"]),
        match (b.get("shared_dir"), b.get("url")) {
            (Some(d), _) => format!(", {} io {} sandbox {} seccomp {}", s(d), s(&b["io_mode"]), s(&b["sandbox"]), s(&b["seccomp"])),
            (None, Some(u)) => format!(", {} timeout {} ms sandbox {} seccomp {}", s(u), b["timeout_ms"], s(&b["sandbox"]), s(&b["seccomp"])),
            (None, None) => String::new(),
        },
        b.get("size").map_or(String::new(), |n| format!(", size {n} bytes, {} inodes", b["inodes"])),
        onoff(&b["xattr"]),
        onoff(&b["posix_acl"]),
        onoff(&b["readdirplus"]),
        if b["writeback"].as_bool() == Some(true) { ", writeback on" } else { "" },
        if p["latency_histograms"].as_bool() == Some(true) { "on" } else { "off" },
    )
}

fn onoff(v: &serde_json::Value) -> &'static str {
    if v.as_bool() == Some(true) {
        "on"
    } else {
        "off"
    }
}

/// `--rlimit-nofile`: `Some(0)` leaves the limit alone, `Some(n)` sets soft and hard to `n`,
/// `None` raises the soft limit to the hard one.
fn set_nofile_limit(want: Option<u64>) -> Result<(), String> {
    use virtiofs_dpu::sys;
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

/// SIGUSR1: the statistics in the log, one line for the queues and one for the classes.
fn log_stats(tag: &str, d: &DeviceStats, fuse: &FuseStats) {
    let queues: Vec<String> = d
        .queues
        .iter()
        .map(|q| {
            format!(
                "q{}: requests={} read={}B written={}B errors={} bad_chains={} interrupts={} doorbells={} in_flight={} waiting={}",
                q.queue, q.requests, q.bytes_read, q.bytes_written, q.errors, q.bad_chains, q.interrupts, q.doorbells, q.in_flight, q.waiting
            )
        })
        .collect();
    info!("statistics of {tag}: {}", queues.join("; "));
    let classes: Vec<String> = d
        .classes
        .iter()
        .filter(|c| c.requests > 0)
        .map(|c| {
            let l = &c.latency;
            format!(
                "{}: requests={} errors={} p50={:.2}us p99={:.2}us p99.9={:.2}us max={:.2}us",
                c.class.name(),
                c.requests,
                c.errors,
                l.p50_ns as f64 / 1e3,
                l.p99_ns as f64 / 1e3,
                l.p999_ns as f64 / 1e3,
                l.max_ns as f64 / 1e3
            )
        })
        .collect();
    info!("statistics: {}", if classes.is_empty() { "no requests".to_string() } else { classes.join("; ") });
    let pollers: Vec<String> = d
        .pollers
        .iter()
        .map(|p| {
            format!(
                "poller {}: busy={}ms idle={}ms parks={}",
                p.poller,
                p.busy_ns / 1_000_000,
                p.idle_ns / 1_000_000,
                p.parks
            )
        })
        .collect();
    info!(
        "statistics: {}; lock requests getlk={} setlk={} setlkw={}",
        pollers.join("; "),
        fuse.locks.getlk,
        fuse.locks.setlk,
        fuse.locks.setlkw
    );
}

/// How long a signalled daemon may take to stop before it exits anyway.
const SHUTDOWN_BOUND: std::time::Duration = std::time::Duration::from_millis(800);

/// Ends the process `bound` from now if the orderly stop has not finished by then: no client can
/// keep the daemon alive after SIGTERM (a thread stuck on a descriptor the client controls).
fn exit_anyway_after(bound: std::time::Duration) {
    let _ = std::thread::Builder::new().name("shutdown-bound".into()).spawn(move || {
        // park_timeout (a futex wait) rather than sleep: nanosleep is not in the seccomp allowlist.
        let deadline = std::time::Instant::now() + bound;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            std::thread::park_timeout(left);
        }
        error!("shutdown did not finish within {bound:?}; exiting");
        std::process::exit(1);
    });
}
