//! `virtiofs-dpu`: the virtio-fs device daemon. Serves a vfio-user socket that QEMU's
//! `vfio-user-pci` (or our host driver model) attaches; the guest mounts the tag with
//! `mount -t virtiofs TAG /mnt`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use log::{error, info, warn};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use virtiofs_backend::filesystem::CachePolicy;
use virtiofs_backend::nfs::fs::NfsFs;
use virtiofs_backend::passthrough::sandbox::{self, SandboxMode};
use virtiofs_backend::passthrough::seccomp::{self, Network, SeccompMode};
use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::PassthroughConfig;
use virtiofs_backend::ramfs::RamFsConfig;
use virtiofs_backend::{PassthroughFs, RamFs};
use virtiofs_device::stats::DeviceStats;
use virtiofs_device::vfio_user::Listener;
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::remote::{self, RemoteKeys};
use virtiofs_dpu::{FuseHandler, FuseStats, PassthroughHandler, RunningDevice};

/// virtio-fs device firmware served over vfio-user.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// vfio-user socket to listen on (a stale socket file is replaced).
    #[arg(long)]
    socket_path: PathBuf,
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
    /// Write the statistics as JSON to this file at exit, and on SIGUSR1 while running
    /// (`{"device": {"queues": [...], "pollers": [...]}, "fuse": {"locks": ..., "io": ...}}`). The file is opened at
    /// start, before any sandbox.
    #[arg(long, value_name = "PATH")]
    stats_file: Option<PathBuf>,
}

/// The statistics file: opened at start (a sandboxed daemon could not open it later), rewritten
/// in place at each report.
struct StatsFile(File);

impl StatsFile {
    fn create(path: &std::path::Path) -> std::io::Result<Self> {
        File::create(path).map(StatsFile)
    }

    /// Replaces the file's contents with the device's and the FUSE side's statistics.
    fn write(&self, stats: &DeviceStats, fuse: &FuseStats) {
        let report = serde_json::json!({ "device": stats, "fuse": fuse });
        let mut text = report.to_string();
        text.push('\n');
        let r = self.0.set_len(0).and_then(|()| self.0.write_all_at(text.as_bytes(), 0));
        if let Err(e) = r {
            warn!("cannot write the statistics file: {e}");
        }
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let matches = Args::command().get_matches();
    let args = match Args::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    let (mut profile, remote_keys) = match &args.config {
        Some(path) => match remote::load_profile(path) {
            Ok(p) => p,
            Err(e) => {
                error!("{}", error_chain(&e));
                return ExitCode::from(2);
            }
        },
        None => (Profile::default(), RemoteKeys::default()),
    };
    let remote_url = args.remote.clone().or_else(|| remote_keys.remote.clone());
    if let Err(msg) = check_backend_flags(&matches, &args, remote_url.is_some()) {
        error!("{msg}");
        return ExitCode::from(2);
    }
    if let Some(tag) = args.tag.clone() {
        profile.tag = tag;
    }
    if let Err(e) = profile.validate().and_then(|()| profile.check_machine()) {
        error!("{}", error_chain(&e));
        return ExitCode::from(2);
    }
    let stats_file = match args.stats_file.as_deref().map(StatsFile::create).transpose() {
        Ok(f) => f,
        Err(e) => {
            error!("cannot create the statistics file: {e}");
            return ExitCode::from(2);
        }
    };
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGUSR1]) {
        Ok(s) => s,
        Err(e) => {
            error!("cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    info!(
        "tag {:?}, {} request queue(s) of up to {} entries",
        profile.tag, profile.request_queues, profile.queue_size
    );
    let fuse_stats: FuseStatsFn;
    let started = match &args.shared_dir {
        None if remote_url.is_some() => {
            let url = remote_url.as_deref().unwrap_or_default();
            match confine_and_serve_remote(url, &remote_keys, &args, profile) {
                Ok((started, stats)) => {
                    fuse_stats = stats;
                    started
                }
                Err(code) => return code,
            }
        }
        None => {
            let mut cfg = RamFsConfig::default();
            cfg.cache = args.cache.unwrap_or(cfg.cache);
            info!("RAM filesystem, cache {}", cfg.cache);
            let handler = Arc::new(FuseHandler::new(RamFs::with_config(cfg)));
            let h = handler.clone();
            fuse_stats = Box::new(move || h.stats());
            RunningDevice::start_with(&args.socket_path, profile, handler)
        }
        Some(dir) => match confine_and_serve(dir, &args, profile) {
            Ok((started, stats)) => {
                fuse_stats = stats;
                started
            }
            Err(code) => return code,
        },
    };
    let device = match started {
        Ok(d) => d,
        Err(e) => {
            error!("{}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    for sig in signals.forever() {
        if sig != SIGUSR1 {
            info!("signal {sig}: shutting down");
            break;
        }
        if let Some(f) = &stats_file {
            f.write(&device.stats(), &fuse_stats());
        }
    }
    match device.stop() {
        Ok(stats) => {
            let per_queue: Vec<String> =
                stats.requests().iter().enumerate().map(|(i, n)| format!("q{i}={n}")).collect();
            info!("requests per queue: {}", per_queue.join(" "));
            info!("bad chains per queue: {:?}", stats.bad_chains());
            if let Some(f) = &stats_file {
                f.write(&stats, &fuse_stats());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!("{}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// `--shared-dir`: checks the directory, binds the socket, confines the process (namespaces,
/// capabilities, seccomp: see `virtiofs_backend::passthrough::sandbox`) and only then starts the
/// device's threads, which inherit all of it.
fn confine_and_serve(
    dir: &std::path::Path,
    args: &Args,
    profile: Profile,
) -> Result<(Started, FuseStatsFn), ExitCode> {
    let fail = |code: u8, e: &dyn std::error::Error| {
        error!("{}", error_chain(e));
        ExitCode::from(code)
    };
    let config = |root: &std::path::Path| {
        let mut cfg = PassthroughConfig::new(root);
        cfg.cache = args.cache.unwrap_or(cfg.cache);
        cfg
    };
    // The directory is checked on the host's terms first (the same errors in every mode).
    let fs = PassthroughFs::new(config(dir)).map_err(|e| fail(2, &e))?;
    info!("shared directory {}, cache {}", dir.display(), config(dir).cache);
    let mode = args.sandbox.unwrap_or_else(SandboxMode::default_for_this_process);
    let mut listener = Listener::bind(&args.socket_path).map_err(|e| fail(1, &e))?;
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
    let handler = Arc::new(PassthroughHandler::new(fs, args.io_mode));
    let h = handler.clone();
    Ok((RunningDevice::start_on(listener, profile, handler), Box::new(move || h.stats())))
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
    Ok(())
}

/// `--remote` (or the profile's `remote`): mounts the NFS export on this thread (blocking,
/// before any other thread exists), binds the socket, confines the process in the NFS mode of
/// the sandbox (mount and IPC namespaces with an empty read-only root but the host's network,
/// no capabilities, the allowlist with the TCP client's calls: see
/// `virtiofs_backend::passthrough::sandbox`) and only then starts the device, whose pollers
/// each connect to the server.
fn confine_and_serve_remote(
    url: &str,
    keys: &RemoteKeys,
    args: &Args,
    profile: Profile,
) -> Result<(Started, FuseStatsFn), ExitCode> {
    let fail = |code: u8, e: &dyn std::error::Error| {
        error!("{}", error_chain(e));
        ExitCode::from(code)
    };
    let opts = remote::nfs_options(url, keys, args.cache).map_err(|e| fail(2, &e))?;
    info!(
        "NFS export {url}, cache {}, timeout {:?}, retransmit {:?}, {} slots per poller",
        opts.cache, opts.timeout, opts.retransmit, opts.slots_per_poller
    );
    let fs = NfsFs::connect(opts).map_err(|e| fail(1, &e))?;
    let mut listener = Listener::bind(&args.socket_path).map_err(|e| fail(1, &e))?;
    match args.sandbox.unwrap_or_else(SandboxMode::default_for_this_process) {
        SandboxMode::None => info!("NFS export: no sandbox (--sandbox=none)"),
        SandboxMode::Namespace => {
            sandbox::enter_namespace_keeping_network().map_err(|e| fail(1, &e))?;
            listener.keep_socket_file();
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
    let handler = Arc::new(FuseHandler::new(fs));
    let h = handler.clone();
    let stats = move || FuseStats { nfs: Some(h.server().filesystem().stats()), ..h.stats() };
    Ok((RunningDevice::start_on(listener, profile, handler), Box::new(stats)))
}

/// What starting the device gave.
type Started = Result<RunningDevice, virtiofs_device::vfio_user::ServerError>;
/// Reads the FUSE side's statistics of the running handler.
type FuseStatsFn = Box<dyn Fn() -> FuseStats>;

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
