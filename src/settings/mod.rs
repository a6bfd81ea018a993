//! What the daemon runs, as one typed value: a [`DaemonSpec`] of its pollers, its confinement
//! and its functions, each a [`FunctionSpec`] of a socket, a device profile, a backend and the
//! FUSE options.
//!
//! [`DaemonSpec::build`] reads the command line ([`CommandLine`]) and the profile file in one
//! pass: without `[[function]]` tables the daemon has one function, the command line's flags
//! over the profile's top level; with them, each table is a function over the top level's keys
//! and the flags (every function's defaults). `create_function` ([`FunctionSpec::from_rpc`])
//! reads its parameters into the same type over the same defaults. Both serialize: what
//! `get_device` and `list_functions` say the daemon runs is what it built. [`keys`] holds every
//! key table.

pub mod allow_create;
pub mod keys;

use std::path::{Path, PathBuf};

use serde::{Serialize, Serializer};
use virtiofs_backend::filesystem::CachePolicy;
use virtiofs_backend::nfs::fs::NfsOptions;
use virtiofs_backend::nfs::url::{NfsUrl, UrlError};
use virtiofs_backend::passthrough::sandbox::SandboxMode;
use virtiofs_backend::passthrough::seccomp::SeccompMode;
use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::Policy;
use virtiofs_backend::ramfs::RamFsConfig;
use virtiofs_backend::server::ServerOptions;
use virtiofs_device::config::{ConfigError, Profile};

use crate::ops::deploy::{self, DeployError};
use crate::ops::logger::LogFormat;
pub use allow_create::AllowCreate;
use keys::{take_keys, Level};
pub use keys::{FunctionKeys, KeyError, NfsKeys};

/// Where a function's vfio-user socket comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Socket {
    /// Bound at this path (a stale socket file is replaced).
    SocketPath(PathBuf),
    /// The listening socket inherited as this descriptor (`--fd`).
    Fd(i32),
    /// The listening socket systemd socket activation passed as this descriptor.
    ActivatedFd(i32),
}

/// The FUSE options a function's server offers at INIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FuseOptions {
    /// Extended attributes, READDIRPLUS, writeback caching.
    #[serde(flatten)]
    pub server: ServerOptions,
    /// FUSE_POSIX_ACL.
    pub posix_acl: bool,
}

/// A function's backend.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind")]
pub enum BackendSpec {
    /// A RAM filesystem.
    #[serde(rename = "ramfs")]
    Ram {
        /// What the guest kernel may cache.
        #[serde(serialize_with = "display")]
        cache: CachePolicy,
        /// Bytes of data, extended attributes and ACLs it may hold.
        size: u64,
        /// Inodes it may hold, the root included.
        inodes: u64,
    },
    /// A host directory (the io_uring passthrough).
    #[serde(rename = "passthrough")]
    SharedDir {
        /// The directory, as the host names it.
        shared_dir: PathBuf,
        /// What the guest kernel may cache.
        #[serde(serialize_with = "display")]
        cache: CachePolicy,
        /// How READ, WRITE and FSYNC are served.
        io_mode: IoMode,
        /// What the guest may not create on the host.
        #[serde(serialize_with = "refused")]
        refuse: Policy,
    },
    /// An NFSv3 export.
    #[serde(rename = "nfs")]
    Remote(RemoteSpec),
}

impl BackendSpec {
    /// `ramfs`, `passthrough` or `nfs`.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendSpec::Ram { .. } => "ramfs",
            BackendSpec::SharedDir { .. } => "passthrough",
            BackendSpec::Remote(_) => "nfs",
        }
    }

    /// What the guest kernel may cache.
    pub fn cache(&self) -> CachePolicy {
        match self {
            BackendSpec::Ram { cache, .. } | BackendSpec::SharedDir { cache, .. } => *cache,
            BackendSpec::Remote(r) => r.options.cache,
        }
    }
}

/// An NFS export and how it is served.
#[derive(Debug, Clone)]
pub struct RemoteSpec {
    /// The URL as given.
    pub url: String,
    /// The backend's options (the URL parsed, the `nfs_*` keys applied).
    pub options: NfsOptions,
}

impl Serialize for RemoteSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let o = &self.options;
        let mut m = s.serialize_struct("RemoteSpec", 7)?;
        m.serialize_field("url", &self.url)?;
        m.serialize_field("cache", &o.cache.to_string())?;
        m.serialize_field("timeout_ms", &(o.timeout.as_millis() as u64))?;
        m.serialize_field("retransmit_ms", &(o.retransmit.as_millis() as u64))?;
        m.serialize_field("slots_per_poller", &o.slots_per_poller)?;
        m.serialize_field("max_nodes", &o.max_nodes)?;
        m.serialize_field("unstable_bytes", &o.unstable_bytes)?;
        m.end()
    }
}

/// Everything needed to start one function.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionSpec {
    /// Its vfio-user socket.
    #[serde(flatten)]
    pub socket: Socket,
    /// The device's shape (its tag included).
    pub profile: Profile,
    /// Its backend.
    pub backend: BackendSpec,
    /// What its FUSE server offers.
    pub fuse: FuseOptions,
    /// The pool's pollers it may use (`None`: all of them).
    pub pollers: Option<Vec<usize>>,
}

impl FunctionSpec {
    /// Its mount tag.
    pub fn tag(&self) -> &str {
        &self.profile.tag
    }

    /// `create_function`'s parameters (a function table) over the daemon's `defaults`.
    pub fn from_rpc(defaults: &Defaults, params: toml::Table) -> Result<FunctionSpec, SpecError> {
        from_table(Origin::Rpc, defaults, params)
    }

    /// One line of the function's main points, for the log.
    pub fn summary(&self) -> String {
        let p = &self.profile;
        let b = &self.backend;
        let on = |b: bool| if b { "on" } else { "off" };
        let detail = match b {
            BackendSpec::Ram { size, inodes, .. } => format!("size {size} bytes, {inodes} inodes"),
            BackendSpec::SharedDir { shared_dir, io_mode, refuse, .. } => format!(
                "{}, io {io_mode:?}, refusing [{}]",
                shared_dir.display(),
                keys::refused_names(refuse).join(",")
            )
            .to_lowercase(),
            BackendSpec::Remote(r) => format!("{}, timeout {} ms", r.url, r.options.timeout.as_millis()),
        };
        format!(
            "tag {:?}, {} request queue(s) of {} entries, {} rings, queue mapping {:?}, doorbells {}, backend {} (cache {}, {detail}), xattr {}, posix acl {}, readdirplus {}, writeback {}, latency histograms {}",
            p.tag,
            p.request_queues,
            p.queue_size,
            if p.packed_ring { "split or packed" } else { "split" },
            p.queue_mapping,
            if p.doorbells_on_socket() { "socket" } else { "shared" },
            b.kind(),
            b.cache(),
            on(self.fuse.server.xattr),
            on(self.fuse.posix_acl),
            on(self.fuse.server.readdirplus),
            on(self.fuse.server.writeback),
            on(p.latency_histograms),
        )
    }
}

/// How the daemon confines itself once its sockets are bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Confinement {
    /// Namespaces (`namespace`) or none.
    #[serde(serialize_with = "lower")]
    pub sandbox: SandboxMode,
    /// What a system call outside the allowlist does (`off`: no filter).
    #[serde(serialize_with = "lower")]
    pub seccomp: SeccompMode,
    /// The namespace's root when a function serves a host directory: the profile's
    /// `sandbox_root`, or the single function's `shared_dir`.
    pub sandbox_root: Option<PathBuf>,
    /// A function serves a host directory.
    pub shares: bool,
    /// A function serves an NFS export (the daemon keeps the network and TCP client calls).
    pub network: bool,
}

impl Confinement {
    /// Whether the daemon is confined (it can then bind no new socket nor open a new share).
    pub fn confined(&self) -> bool {
        self.sandbox == SandboxMode::Namespace || self.seccomp != SeccompMode::Off
    }
}

/// How the daemon logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LogSpec {
    /// `text` or `json`.
    pub format: LogFormat,
    /// To the local syslog socket rather than stderr.
    pub syslog: bool,
}

/// What a function created at run time inherits: the profile's top-level device keys and the
/// function keys of the top level and the command line.
#[derive(Debug, Clone, Default)]
pub struct Defaults {
    /// The device keys (the device crate's [`Profile`] reads them).
    pub device: toml::Table,
    /// The function keys.
    pub keys: FunctionKeys,
    /// The group and the permission bits of a new socket (`--socket-group`, `--socket-mode`).
    pub socket_access: (Option<u32>, Option<u32>),
    /// What `create_function` may use (`--allow-create`, canonicalized); `None`: it is off.
    pub allow_create: Option<AllowCreate>,
}

/// What the daemon runs.
#[derive(Debug, Clone, Serialize)]
pub struct DaemonSpec {
    /// The profile file read, if any.
    pub profile_file: Option<PathBuf>,
    /// The pool of pollers every function shares (`poller_cores`, `polling`, `idle_*`).
    pub pool: Profile,
    /// How the daemon confines itself.
    #[serde(flatten)]
    pub confinement: Confinement,
    /// The functions started with the daemon.
    pub functions: Vec<FunctionSpec>,
    /// How the daemon is operated.
    #[serde(flatten)]
    pub ops: DaemonOptions,
    /// What `create_function` inherits.
    #[serde(skip)]
    pub defaults: Defaults,
}

/// The command line, typed: the daemon's flags, and the function keys it gives (every
/// function's defaults, over the profile's top level).
#[derive(Debug, Clone)]
pub struct CommandLine {
    /// `--config`.
    pub config: Option<PathBuf>,
    /// `--socket-path` or `--fd` (`None`: systemd socket activation, if any).
    pub socket: Option<Socket>,
    /// `--tag`.
    pub tag: Option<String>,
    /// The flags that are function keys (`--shared-dir`, `--cache`, `--refuse`, ...), given ones only.
    pub keys: FunctionKeys,
    /// `--sandbox`, if given.
    pub sandbox: Option<SandboxMode>,
    /// `--seccomp`, if given.
    pub seccomp: Option<SeccompMode>,
    /// `--control-socket`, `--control-socket-group`, `--control-socket-mode`, `--stats-file`,
    /// `--socket-group`, `--socket-mode`, `--rlimit-nofile`, `--log-format`, `--syslog`.
    pub ops: DaemonOptions,
}

/// How the daemon is operated: its control socket, statistics file, sockets' access, open
/// files limit and log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DaemonOptions {
    /// The JSON-RPC control socket.
    pub control_socket: Option<PathBuf>,
    /// The statistics file.
    pub stats_file: Option<PathBuf>,
    /// The group owning the sockets (a gid).
    pub socket_group: Option<u32>,
    /// The sockets' permission bits.
    pub socket_mode: Option<u32>,
    /// The group owning the control socket (a gid), whose members may use it.
    pub control_socket_group: Option<u32>,
    /// The control socket's permission bits (default 0600).
    pub control_socket_mode: u32,
    /// What `create_function` may use (`--allow-create`); `None`: it is off.
    pub allow_create: Option<AllowCreate>,
    /// The most functions served at once (`--max-functions`, default 64).
    pub max_functions: usize,
    /// `--rlimit-nofile` (`None`: the soft limit raised to the hard one; 0: left alone).
    pub rlimit_nofile: Option<u64>,
    /// How it logs.
    pub log: LogSpec,
}

/// Where a description comes from, for errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The command line over a profile's top level (or the default profile).
    CommandLine(Option<PathBuf>),
    /// A profile's `[[function]]` table (its index).
    Function(PathBuf, usize),
    /// `create_function`'s parameters.
    Rpc,
}

impl Origin {
    /// How a key is named to whoever gave it: `--io-mode` on the command line, `` `io_mode` ``
    /// in a table.
    fn key(&self, key: &str) -> String {
        match self {
            Origin::CommandLine(_) => format!("--{}", key.replace('_', "-")),
            _ => format!("`{key}`"),
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::CommandLine(None) => f.write_str("the command line"),
            Origin::CommandLine(Some(p)) => write!(f, "profile {}", p.display()),
            Origin::Function(p, i) => write!(f, "profile {}, function {i}", p.display()),
            Origin::Rpc => f.write_str("create_function"),
        }
    }
}

/// Why the command line, the profile or a function's description was refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The profile file cannot be read.
    #[error("profile {path}: cannot read it")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The profile file is not TOML, or its `function` key is not an array of tables.
    #[error("profile {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A key is misplaced, of the wrong type or out of range.
    #[error("{origin}")]
    Key {
        /// Where.
        origin: Origin,
        /// The key and what is wrong.
        #[source]
        source: KeyError,
    },
    /// A device key is unknown or invalid.
    #[error("{origin}")]
    Device {
        /// Where.
        origin: Origin,
        /// The device's own error, which names the key.
        #[source]
        source: ConfigError,
    },
    /// An `nfs://` URL is wrong.
    #[error("{origin}: remote URL {url:?}")]
    Url {
        /// Where.
        origin: Origin,
        /// The URL as given.
        url: String,
        /// What is wrong.
        #[source]
        source: UrlError,
    },
    /// The keys do not go together.
    #[error("{origin}: {reason}")]
    Invalid {
        /// Where.
        origin: Origin,
        /// Why.
        reason: String,
    },
    /// The command line's flags do not go together.
    #[error("{0}")]
    CommandLine(String),
    /// The socket systemd passed cannot be used.
    #[error("socket activation")]
    Activation(#[source] DeployError),
}

impl DaemonSpec {
    /// The daemon the command line and its profile file describe.
    pub fn build(cli: &CommandLine) -> Result<DaemonSpec, SpecError> {
        let (mut top, tables) = match &cli.config {
            Some(path) => read_profile(path)?,
            None => (toml::Table::new(), None),
        };
        let top_origin = Origin::CommandLine(cli.config.clone());
        let level = Level::Top { functions: tables.is_some() };
        let (top_keys, sandbox_root) = take_keys(&mut top, level)
            .map_err(|source| SpecError::Key { origin: top_origin.clone(), source })?;
        let keys = cli.keys.clone().over(&top_keys);
        let mut device = top.clone();
        device.remove("tag");
        let defaults = Defaults {
            device,
            keys: FunctionKeys {
                socket_path: None,
                pollers: None,
                shared_dir: None,
                remote: None,
                ..keys.clone()
            },
            socket_access: (cli.ops.socket_group, cli.ops.socket_mode),
            allow_create: cli
                .ops
                .allow_create
                .as_ref()
                .map(AllowCreate::canonicalized)
                .transpose()
                .map_err(SpecError::CommandLine)?,
        };
        let single = tables.is_none();
        let (pool, functions) = match tables {
            Some(tables) => {
                refuse_function_flags(cli)?;
                if tables.is_empty() {
                    return Err(SpecError::CommandLine("the profile's [[function]] list is empty".into()));
                }
                let path = cli.config.clone().unwrap_or_default();
                let functions = tables
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| from_table(Origin::Function(path.clone(), i), &defaults, t))
                    .collect::<Result<Vec<_>, _>>()?;
                (device_profile(&top_origin, top)?, functions)
            }
            None => {
                let socket = match &cli.socket {
                    Some(s) => s.clone(),
                    None => match deploy::systemd_listen_fd().map_err(SpecError::Activation)? {
                        Some(fd) => Socket::ActivatedFd(fd),
                        None => return Err(SpecError::CommandLine(
                            "no socket: give --socket-path, --fd, or start under systemd socket activation"
                                .into(),
                        )),
                    },
                };
                if let Some(tag) = &cli.tag {
                    top.insert("tag".into(), toml::Value::String(tag.clone()));
                }
                let f = resolve(top_origin, top, &keys, &FunctionKeys::default(), socket)?;
                (f.profile.clone(), vec![f])
            }
        };
        let confinement = confinement(cli, &functions, sandbox_root, single)?;
        Ok(DaemonSpec {
            profile_file: cli.config.clone(),
            pool,
            confinement,
            functions,
            ops: cli.ops.clone(),
            defaults,
        })
    }

    /// What `get_device` says of the daemon itself (its functions are described one by one).
    pub fn describe(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            m.remove("functions");
        }
        v
    }
}

/// With `[[function]]` tables, the flags that describe one function are refused.
fn refuse_function_flags(cli: &CommandLine) -> Result<(), SpecError> {
    let k = &cli.keys;
    let socket =
        cli.socket.as_ref().map(|s| if matches!(s, Socket::Fd(_)) { "--fd" } else { "--socket-path" });
    let given = [
        socket,
        k.shared_dir.as_ref().map(|_| "--shared-dir"),
        k.remote.as_ref().map(|_| "--remote"),
        cli.tag.as_ref().map(|_| "--tag"),
        k.ramfs_size.map(|_| "--ramfs-size"),
        k.ramfs_inodes.map(|_| "--ramfs-inodes"),
    ];
    match given.into_iter().flatten().next() {
        Some(flag) => Err(SpecError::CommandLine(format!(
            "{flag}: the profile lists functions ([[function]]): give each one's settings in its table"
        ))),
        None => Ok(()),
    }
}

/// Reads a profile file's table and takes its `[[function]]` array out.
fn read_profile(path: &Path) -> Result<(toml::Table, Option<Vec<toml::Table>>), SpecError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| SpecError::Read { path: path.into(), source })?;
    let file = |reason: String| SpecError::File { path: path.into(), reason };
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| file(e.to_string()))?;
    let functions = match table.remove("function") {
        None => None,
        Some(toml::Value::Array(a)) => Some(
            a.into_iter()
                .enumerate()
                .map(|(i, v)| match v {
                    toml::Value::Table(t) => Ok(t),
                    _ => Err(file(format!("function {i}: not a table (write [[function]])"))),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(_) => return Err(file("`function` must be an array of tables ([[function]])".into())),
    };
    Ok((table, functions))
}

/// A function's own table (a `[[function]]` entry or `create_function`'s parameters) over the
/// daemon's defaults.
fn from_table(origin: Origin, defaults: &Defaults, mut t: toml::Table) -> Result<FunctionSpec, SpecError> {
    let (own, _) = take_keys(&mut t, Level::Function)
        .map_err(|source| SpecError::Key { origin: origin.clone(), source })?;
    let invalid = |reason: &str| SpecError::Invalid { origin: origin.clone(), reason: reason.into() };
    if !t.contains_key("tag") {
        return Err(invalid("`tag` is required"));
    }
    let socket = own.socket_path.clone().ok_or_else(|| invalid("`socket_path` is required"))?;
    if origin == Origin::Rpc {
        let relative = |p: &Option<PathBuf>| p.as_ref().is_some_and(|p| !p.is_absolute());
        if relative(&own.shared_dir) || relative(&own.socket_path) {
            return Err(invalid("`shared_dir` and `socket_path` must be absolute paths"));
        }
    }
    let mut device = defaults.device.clone();
    device.extend(t);
    let keys = own.clone().over(&defaults.keys);
    resolve(origin, device, &keys, &own, Socket::SocketPath(socket))
}

/// The device profile a table's device keys describe.
fn device_profile(origin: &Origin, device: toml::Table) -> Result<Profile, SpecError> {
    let err = |source| SpecError::Device { origin: origin.clone(), source };
    let profile: Profile = toml::Value::Table(device).try_into().map_err(|e| err(ConfigError::Parse(e)))?;
    profile.validate().map_err(err)?;
    Ok(profile)
}

/// One function from its device keys and its function keys (`keys`: all that apply, `own`:
/// the ones its own table gave, which must apply to its backend).
fn resolve(
    origin: Origin,
    device: toml::Table,
    keys: &FunctionKeys,
    own: &FunctionKeys,
    socket: Socket,
) -> Result<FunctionSpec, SpecError> {
    let invalid = |reason: String| SpecError::Invalid { origin: origin.clone(), reason };
    let profile = device_profile(&origin, device)?;
    let xattr = keys.xattr.unwrap_or(true);
    if keys.posix_acl == Some(true) && !xattr {
        return Err(invalid(format!(
            "{} needs extended attributes ({} refuses them)",
            origin.key("posix_acl"),
            origin.key("no_xattr")
        )));
    }
    // On the command line every key given is the function's own.
    let own = if matches!(origin, Origin::CommandLine(_)) { keys } else { own };
    let backend = match (&keys.shared_dir, &keys.remote) {
        (Some(_), Some(_)) => {
            return Err(invalid(format!(
                "{} and a remote ({} or the profile's `remote`) exclude each other",
                origin.key("shared_dir"),
                origin.key("remote")
            )))
        }
        (Some(dir), None) => BackendSpec::SharedDir {
            shared_dir: dir.clone(),
            cache: keys.cache.unwrap_or(CachePolicy::Auto),
            io_mode: keys.io_mode.unwrap_or_default(),
            refuse: keys.refuse.unwrap_or_default(),
        },
        (None, Some(url)) => BackendSpec::Remote(remote(&origin, url, keys)?),
        (None, None) => {
            let d = RamFsConfig::default();
            BackendSpec::Ram {
                cache: keys.cache.unwrap_or(d.cache),
                size: keys.ramfs_size.unwrap_or(d.capacity),
                inodes: keys.ramfs_inodes.unwrap_or(d.max_inodes),
            }
        }
    };
    if !matches!(backend, BackendSpec::SharedDir { .. }) {
        if let Some(k) = own.shared_dir_only().first() {
            return Err(invalid(format!("{} is for {}", origin.key(k), origin.key("shared_dir"))));
        }
    }
    let remote = matches!(backend, BackendSpec::Remote(_));
    if remote && keys.writeback == Some(true) {
        return Err(invalid(format!(
            "{} is for the RAM filesystem and {}: the NFS backend does not offer it",
            origin.key("writeback"),
            origin.key("shared_dir")
        )));
    }
    if !matches!(backend, BackendSpec::Ram { .. }) && (own.ramfs_size.is_some() || own.ramfs_inodes.is_some())
    {
        log::warn!("{origin}: ramfs_size and ramfs_inodes apply to the RAM filesystem only");
    }
    let server = ServerOptions {
        xattr,
        readdirplus: keys.readdirplus.unwrap_or(backend.cache() != CachePolicy::Never),
        writeback: keys.writeback.unwrap_or(false),
    };
    let fuse = FuseOptions { server, posix_acl: keys.posix_acl.unwrap_or(true) && xattr };
    Ok(FunctionSpec { socket, profile, backend, fuse, pollers: keys.pollers.clone() })
}

/// The NFS backend's options for `url` and the `nfs_*` keys (default cache `auto`:
/// close-to-open).
fn remote(origin: &Origin, url: &str, keys: &FunctionKeys) -> Result<RemoteSpec, SpecError> {
    let parsed: NfsUrl =
        url.parse().map_err(|source| SpecError::Url { origin: origin.clone(), url: url.into(), source })?;
    let bad = |key: &str, reason: &str| SpecError::Key {
        origin: origin.clone(),
        source: KeyError { key: key.into(), reason: reason.into() },
    };
    let mut o = NfsOptions::new(parsed);
    o.cache = keys.cache.unwrap_or(CachePolicy::Auto);
    let ms = |key: &str, v: u64| match v {
        0 => Err(bad(key, "must be at least 1 ms")),
        v if v > 3_600_000 => Err(bad(key, "must be at most an hour")),
        v => Ok(std::time::Duration::from_millis(v)),
    };
    let n = &keys.nfs;
    if let Some(v) = n.timeout_ms {
        o.timeout = ms("nfs_timeout_ms", v)?;
    }
    if let Some(v) = n.retransmit_ms {
        o.retransmit = ms("nfs_retransmit_ms", v)?;
    }
    if o.retransmit > o.timeout {
        return Err(bad("nfs_retransmit_ms", "must not be longer than nfs_timeout_ms"));
    }
    if let Some(v) = n.slots {
        if v == 0 || v > 1 << 16 {
            return Err(bad("nfs_slots", "must be 1 to 65536"));
        }
        o.slots_per_poller = v;
    }
    if let Some(v) = n.max_nodes {
        if v < 16 {
            return Err(bad("nfs_max_nodes", "must be at least 16"));
        }
        o.max_nodes = v;
    }
    if let Some(v) = n.unstable_bytes {
        o.unstable_bytes = v;
    }
    Ok(RemoteSpec { url: url.into(), options: o })
}

/// The NFS backend's options for `url` and the `nfs_*` keys of `keys` (as `--remote` takes
/// them).
pub fn nfs_options(url: &str, keys: &FunctionKeys) -> Result<NfsOptions, SpecError> {
    remote(&Origin::CommandLine(None), url, keys).map(|r| r.options)
}

/// How the daemon confines itself, given its functions: only a function serving a host
/// directory or an NFS export confines it (`--sandbox`, `--seccomp`).
fn confinement(
    cli: &CommandLine,
    functions: &[FunctionSpec],
    sandbox_root: Option<PathBuf>,
    single: bool,
) -> Result<Confinement, SpecError> {
    let shares: Vec<&Path> = functions
        .iter()
        .filter_map(|f| match &f.backend {
            BackendSpec::SharedDir { shared_dir, .. } => Some(shared_dir.as_path()),
            _ => None,
        })
        .collect();
    let network = functions.iter().any(|f| matches!(f.backend, BackendSpec::Remote(_)));
    let shared = !shares.is_empty();
    if !shared && !network {
        let given = [cli.sandbox.map(|_| "--sandbox"), cli.seccomp.map(|_| "--seccomp")];
        if let Some(flag) = given.into_iter().flatten().next() {
            return Err(SpecError::CommandLine(format!(
                "{flag} needs --shared-dir or --remote (or a function with a shared_dir or a remote)"
            )));
        }
        return Ok(Confinement {
            sandbox: SandboxMode::None,
            seccomp: SeccompMode::Off,
            sandbox_root: None,
            shares: false,
            network: false,
        });
    }
    let sandbox = cli.sandbox.unwrap_or_else(SandboxMode::default_for_this_process);
    let seccomp = cli.seccomp.unwrap_or(SeccompMode::Trap);
    let sandbox_root = match sandbox {
        SandboxMode::None => None,
        SandboxMode::Namespace if shared => match sandbox_root {
            Some(r) => Some(r),
            // The single function's (a profile without [[function]] tables has no sandbox_root).
            None if single => Some(shares[0].to_path_buf()),
            None => {
                return Err(SpecError::CommandLine(
                    "functions with a shared_dir under --sandbox namespace need `sandbox_root` in the profile (a directory holding every function's shared_dir), or --sandbox none".into(),
                ))
            }
        },
        SandboxMode::Namespace => None,
    };
    Ok(Confinement { sandbox, seccomp, sandbox_root, shares: shared, network })
}

fn display<T: std::fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn lower<T: std::fmt::Debug, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{v:?}").to_lowercase())
}

fn refused<S: Serializer>(p: &Policy, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(keys::refused_names(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(config: Option<PathBuf>) -> CommandLine {
        CommandLine {
            config,
            socket: Some(Socket::SocketPath("/run/a.sock".into())),
            tag: None,
            keys: FunctionKeys::default(),
            sandbox: None,
            seccomp: None,
            ops: DaemonOptions {
                control_socket: None,
                stats_file: None,
                socket_group: None,
                socket_mode: None,
                control_socket_group: None,
                control_socket_mode: 0o600,
                allow_create: None,
                max_functions: 64,
                rlimit_nofile: None,
                log: LogSpec { format: LogFormat::Text, syslog: false },
            },
        }
    }

    fn profile(text: &str) -> (tempfile::NamedTempFile, PathBuf) {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        let p = f.path().to_path_buf();
        (f, p)
    }

    #[test]
    fn the_command_line_is_a_one_function_daemon() {
        let (_f, path) = profile("tag = \"t\"\nqueue_size = 256\nramfs_size = \"64M\"\n");
        let mut c = cli(Some(path));
        c.keys.ramfs_size = Some(1 << 20);
        c.keys.xattr = Some(false);
        let spec = DaemonSpec::build(&c).unwrap();
        assert_eq!(spec.functions.len(), 1);
        let f = &spec.functions[0];
        assert_eq!((f.tag(), f.profile.queue_size), ("t", 256));
        // The flag over the profile's key.
        assert!(matches!(f.backend, BackendSpec::Ram { size: 1048576, cache: CachePolicy::Always, .. }));
        assert!(!f.fuse.server.xattr && !f.fuse.posix_acl, "no xattr, no ACLs");
        assert_eq!(spec.confinement.sandbox, SandboxMode::None);
        let v = serde_json::to_value(f).unwrap();
        assert_eq!(
            (v["socket_path"].as_str(), v["backend"]["kind"].as_str()),
            (Some("/run/a.sock"), Some("ramfs"))
        );
        // The share policy without a share is refused, naming the flag.
        c.keys.refuse = Some(Policy::refusing("device-nodes").unwrap());
        let e = DaemonSpec::build(&c).unwrap_err().to_string();
        assert!(e.contains("--refuse is for --shared-dir"), "{e}");
    }

    #[test]
    fn function_tables_inherit_the_top_level_and_the_flags() {
        let (_f, path) = profile(
            "queue_size = 256\ncache = \"never\"\nrefuse = \"setid\"\n\n\
             [[function]]\nsocket_path = \"/run/a.sock\"\ntag = \"a\"\nshared_dir = \"/srv/a\"\nrefuse = \"device-nodes\"\n\n\
             [[function]]\nsocket_path = \"/run/b.sock\"\ntag = \"b\"\nshared_dir = \"/srv/b\"\nqueue_size = 128\n",
        );
        let mut c = cli(Some(path.clone()));
        c.socket = None;
        c.sandbox = Some(SandboxMode::None);
        c.keys.io_mode = Some(IoMode::Ring);
        let spec = DaemonSpec::build(&c).unwrap();
        let [a, b] = &spec.functions[..] else { panic!("two functions") };
        let BackendSpec::SharedDir { refuse, io_mode, cache, .. } = &a.backend else { panic!("{a:?}") };
        assert_eq!(
            (keys::refused_names(refuse), *io_mode, *cache),
            (vec!["device-nodes"], IoMode::Ring, CachePolicy::Never)
        );
        let BackendSpec::SharedDir { refuse, .. } = &b.backend else { panic!("{b:?}") };
        assert_eq!(keys::refused_names(refuse), ["setid"]);
        assert_eq!((a.profile.queue_size, b.profile.queue_size), (256, 128));
        assert!(!a.fuse.server.readdirplus, "cache never: no READDIRPLUS");
        // create_function's parameters over the same defaults.
        let params: toml::Table = serde_json::from_value(serde_json::json!({
            "socket_path": "/run/c.sock", "tag": "c", "refuse": ["device-nodes", "file-caps"], "shared_dir": "/srv/c"
        }))
        .unwrap();
        let f = FunctionSpec::from_rpc(&spec.defaults, params).unwrap();
        let BackendSpec::SharedDir { refuse, io_mode, .. } = &f.backend else { panic!("{f:?}") };
        assert_eq!(
            (keys::refused_names(refuse), *io_mode),
            (vec!["device-nodes", "file-caps"], IoMode::Ring)
        );
        // Unknown keys, and keys that do not apply, are named with where they were given.
        let params: toml::Table =
            toml::from_str("socket_path = \"/run/d.sock\"\ntag = \"d\"\nrefuse = \"setid\"\n").unwrap();
        let e = crate::error_chain(&FunctionSpec::from_rpc(&spec.defaults, params).unwrap_err());
        assert!(e.contains("create_function") && e.contains("`refuse` is for `shared_dir`"), "{e}");
        let params: toml::Table =
            toml::from_str("socket_path = \"/run/d.sock\"\ntag = \"d\"\nqueue_sise = 1\n").unwrap();
        let e = crate::error_chain(&FunctionSpec::from_rpc(&spec.defaults, params).unwrap_err());
        assert!(e.contains("create_function") && e.contains("queue_sise"), "{e}");
        // A backend at the top level of a listing profile is misplaced.
        let (_g, path) = profile("remote = \"nfs://h/e\"\n[[function]]\nsocket_path = \"/s\"\ntag = \"a\"\n");
        let e = crate::error_chain(&DaemonSpec::build(&cli(Some(path))).unwrap_err());
        assert!(e.contains("`remote`"), "{e}");
    }

    #[test]
    fn shipped_profiles_build() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/hw-configs");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let spec = DaemonSpec::build(&cli(Some(path.clone())));
                let spec = spec.unwrap_or_else(|e| panic!("{}: {}", path.display(), crate::error_chain(&e)));
                assert_eq!(spec.pool, Profile::from_file(&path).unwrap(), "{}", path.display());
            }
        }
    }
}
