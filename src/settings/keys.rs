//! Every key a profile file, a `[[function]]` table or `create_function` may give, where each
//! may appear, and their typed reading.
//!
//! A table holds three kinds of keys: the daemon's ([`DAEMON_KEYS`]: its pollers and sandbox),
//! a function's own and its backend's ([`FUNCTION_KEYS`], read here into [`FunctionKeys`]), and
//! the device's (every other key: the device crate's `Profile` reads them and names the ones it
//! does not know). [`take_keys`] takes the first two kinds out of a table and leaves the device's.

use std::path::PathBuf;

use virtiofs_backend::filesystem::CachePolicy;
use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::Policy;

/// Keys of the daemon as a whole: the shared pollers (the device crate's [`Profile`] reads them)
/// and the sandbox's root. Top level only.
///
/// [`Profile`]: virtiofs_device::config::Profile
pub const DAEMON_KEYS: &[&str] =
    &["poller_cores", "polling", "idle_spin_us", "idle_sleep_us", "description", "sandbox_root"];

/// Where a key of [`FUNCTION_KEYS`] may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Only in a function's own table (`[[function]]`, `create_function`).
    Own,
    /// In a function's own table, or at the top level of a profile without `[[function]]`
    /// tables (the single function's).
    Backend,
    /// Anywhere: at the top level (every function's default, under the command line's flag) or
    /// in a function's own table.
    Default,
}

/// A function's own and its backend's keys, with where each may be given.
pub const FUNCTION_KEYS: &[(&str, Scope)] = &[
    ("socket_path", Scope::Own),
    ("pollers", Scope::Own),
    ("shared_dir", Scope::Backend),
    ("remote", Scope::Backend),
    ("cache", Scope::Default),
    ("refuse", Scope::Default),
    ("io_mode", Scope::Default),
    ("xattr", Scope::Default),
    ("posix_acl", Scope::Default),
    ("readdirplus", Scope::Default),
    ("writeback", Scope::Default),
    ("ramfs_size", Scope::Default),
    ("ramfs_inodes", Scope::Default),
    ("nfs_timeout_ms", Scope::Default),
    ("nfs_retransmit_ms", Scope::Default),
    ("nfs_slots", Scope::Default),
    ("nfs_max_nodes", Scope::Default),
    ("nfs_unstable_bytes", Scope::Default),
];

/// The largest value of each numeric key of [`FUNCTION_KEYS`], each sizing memory or time the
/// daemon spends on a function: a value above it is refused where it is read, naming the key
/// and the bound (a `create_function` client cannot make the daemon reserve without limit).
pub const BOUNDS: &[(&str, u64)] = &[
    // Bytes a RAM filesystem may hold: 1 TiB.
    ("ramfs_size", 1 << 40),
    // Inodes a RAM filesystem may hold.
    ("ramfs_inodes", 1 << 32),
    // An hour.
    ("nfs_timeout_ms", 3_600_000),
    ("nfs_retransmit_ms", 3_600_000),
    // Calls in flight per poller's connection.
    ("nfs_slots", 1 << 16),
    // Node ids the guest may hold (the node table's entries).
    ("nfs_max_nodes", 1 << 24),
    // Bytes of UNSTABLE writes kept until their COMMIT: 4 GiB.
    ("nfs_unstable_bytes", 1 << 32),
];

/// `n` if it is within `key`'s bound of [`BOUNDS`].
pub fn bounded(key: &str, n: u64) -> Result<u64, KeyError> {
    match BOUNDS.iter().find(|(k, _)| *k == key) {
        Some(&(_, max)) if n > max => Err(KeyError::new(key, format!("{n} is more than the bound, {max}"))),
        _ => Ok(n),
    }
}

/// Which table is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// A profile's top level; `functions`: the profile has `[[function]]` tables.
    Top {
        /// The profile lists its functions.
        functions: bool,
    },
    /// A function's own table (`[[function]]` or `create_function`'s params).
    Function,
}

/// A key that is misplaced, of the wrong type or out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{key}`: {reason}")]
pub struct KeyError {
    /// The key.
    pub key: String,
    /// What is wrong.
    pub reason: String,
}

impl KeyError {
    fn new(key: &str, reason: impl Into<String>) -> Self {
        KeyError { key: key.to_string(), reason: reason.into() }
    }
}

/// The NFS backend's keys (the `nfs_*` keys), each absent unless given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NfsKeys {
    /// `nfs_timeout_ms`: a request the server has not answered by then ends with `EIO`.
    pub timeout_ms: Option<u64>,
    /// `nfs_retransmit_ms`: no reply by then: reconnect and send again.
    pub retransmit_ms: Option<u64>,
    /// `nfs_slots`: calls in flight per poller's connection.
    pub slots: Option<usize>,
    /// `nfs_max_nodes`: node ids the guest kernel may hold at once.
    pub max_nodes: Option<usize>,
    /// `nfs_unstable_bytes`: bytes of UNSTABLE writes kept until their COMMIT (0: FILE_SYNC).
    pub unstable_bytes: Option<usize>,
}

/// The keys of [`FUNCTION_KEYS`] one table (or the command line) gives, each absent unless
/// given; [`FunctionKeys::over`] layers them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FunctionKeys {
    /// `socket_path`: the function's vfio-user socket.
    pub socket_path: Option<PathBuf>,
    /// `pollers`: the pool pollers the function may use.
    pub pollers: Option<Vec<usize>>,
    /// `shared_dir`: serve this host directory.
    pub shared_dir: Option<PathBuf>,
    /// `remote`: serve this NFSv3 export (`nfs://`).
    pub remote: Option<String>,
    /// `cache`: what the guest kernel may cache.
    pub cache: Option<CachePolicy>,
    /// `refuse`: what a shared directory's guest may not create.
    pub refuse: Option<Policy>,
    /// `io_mode`: how a shared directory serves READ, WRITE and FSYNC.
    pub io_mode: Option<IoMode>,
    /// `xattr`: serve extended attributes.
    pub xattr: Option<bool>,
    /// `posix_acl`: offer FUSE_POSIX_ACL.
    pub posix_acl: Option<bool>,
    /// `readdirplus`: offer READDIRPLUS.
    pub readdirplus: Option<bool>,
    /// `writeback`: offer FUSE_WRITEBACK_CACHE.
    pub writeback: Option<bool>,
    /// `ramfs_size`: bytes the RAM filesystem may hold.
    pub ramfs_size: Option<u64>,
    /// `ramfs_inodes`: inodes the RAM filesystem may hold.
    pub ramfs_inodes: Option<u64>,
    /// The `nfs_*` keys.
    pub nfs: NfsKeys,
}

impl FunctionKeys {
    /// These keys over `base`: each key given here wins, the others are `base`'s.
    pub fn over(self, base: &FunctionKeys) -> FunctionKeys {
        let b = base.clone();
        FunctionKeys {
            socket_path: self.socket_path.or(b.socket_path),
            pollers: self.pollers.or(b.pollers),
            shared_dir: self.shared_dir.or(b.shared_dir),
            remote: self.remote.or(b.remote),
            cache: self.cache.or(b.cache),
            refuse: self.refuse.or(b.refuse),
            io_mode: self.io_mode.or(b.io_mode),
            xattr: self.xattr.or(b.xattr),
            posix_acl: self.posix_acl.or(b.posix_acl),
            readdirplus: self.readdirplus.or(b.readdirplus),
            writeback: self.writeback.or(b.writeback),
            ramfs_size: self.ramfs_size.or(b.ramfs_size),
            ramfs_inodes: self.ramfs_inodes.or(b.ramfs_inodes),
            nfs: NfsKeys {
                timeout_ms: self.nfs.timeout_ms.or(b.nfs.timeout_ms),
                retransmit_ms: self.nfs.retransmit_ms.or(b.nfs.retransmit_ms),
                slots: self.nfs.slots.or(b.nfs.slots),
                max_nodes: self.nfs.max_nodes.or(b.nfs.max_nodes),
                unstable_bytes: self.nfs.unstable_bytes.or(b.nfs.unstable_bytes),
            },
        }
    }

    /// The names of the keys given that only a shared directory uses.
    pub fn shared_dir_only(&self) -> Vec<&'static str> {
        [(self.refuse.is_some(), "refuse"), (self.io_mode.is_some(), "io_mode")]
            .into_iter()
            .filter_map(|(given, k)| given.then_some(k))
            .collect()
    }
}

/// Takes the daemon's and the function's keys out of `table` (read at `level`), leaving the
/// device's; the function's come back typed. `sandbox_root` (top level only) is taken out too
/// and returned; the pollers' keys stay (the device's [`Profile`] reads them).
///
/// [`Profile`]: virtiofs_device::config::Profile
pub fn take_keys(table: &mut toml::Table, level: Level) -> Result<(FunctionKeys, Option<PathBuf>), KeyError> {
    let mut sandbox_root = None;
    if let Some(v) = table.remove("sandbox_root") {
        match level {
            Level::Function => return Err(KeyError::new("sandbox_root", daemon_wide())),
            Level::Top { functions: false } => {
                return Err(KeyError::new("sandbox_root", "is for a profile with [[function]] tables"))
            }
            Level::Top { functions: true } => sandbox_root = Some(PathBuf::from(string(&v, "sandbox_root")?)),
        }
    }
    if level == Level::Function {
        if let Some(k) = table.keys().find(|k| DAEMON_KEYS.contains(&k.as_str())) {
            return Err(KeyError::new(k, daemon_wide()));
        }
    }
    let mut keys = FunctionKeys::default();
    for &(key, scope) in FUNCTION_KEYS {
        let Some(v) = table.remove(key) else { continue };
        match (scope, level) {
            (Scope::Own, Level::Top { .. }) => {
                return Err(KeyError::new(key, "is a function's: give it in a [[function]] table"))
            }
            (Scope::Backend, Level::Top { functions: true }) => {
                return Err(KeyError::new(
                    key,
                    "at the top level of a profile with [[function]] tables: give each function's backend in its table",
                ))
            }
            _ => read_key(&mut keys, key, &v)?,
        }
    }
    Ok((keys, sandbox_root))
}

fn daemon_wide() -> &'static str {
    "is daemon-wide (the pollers and the sandbox are shared): not a function key"
}

/// Reads one key of [`FUNCTION_KEYS`] into `keys`.
fn read_key(keys: &mut FunctionKeys, key: &str, v: &toml::Value) -> Result<(), KeyError> {
    let bad = |reason: String| KeyError::new(key, reason);
    match key {
        "socket_path" => keys.socket_path = Some(PathBuf::from(string(v, key)?)),
        "pollers" => {
            let list: Vec<usize> =
                v.clone().try_into().map_err(|_| bad("must be a list of poller indices".into()))?;
            keys.pollers = Some(list);
        }
        "shared_dir" => keys.shared_dir = Some(PathBuf::from(string(v, key)?)),
        "remote" => keys.remote = Some(string(v, key)?),
        "cache" => keys.cache = Some(string(v, key)?.parse().map_err(bad)?),
        "io_mode" => keys.io_mode = Some(string(v, key)?.parse().map_err(bad)?),
        "refuse" => keys.refuse = Some(refuse(v).map_err(bad)?),
        "xattr" => keys.xattr = Some(boolean(v, key)?),
        "posix_acl" => keys.posix_acl = Some(boolean(v, key)?),
        "readdirplus" => keys.readdirplus = Some(boolean(v, key)?),
        "writeback" => keys.writeback = Some(boolean(v, key)?),
        "ramfs_size" => {
            keys.ramfs_size = Some(bounded(
                key,
                match v {
                    toml::Value::Integer(n) => {
                        u64::try_from(*n).map_err(|_| bad("must not be negative".into()))?
                    }
                    toml::Value::String(s) => parse_size(s).map_err(bad)?,
                    _ => return Err(bad("expected bytes (an integer) or a size such as \"1G\"".into())),
                },
            )?)
        }
        "ramfs_inodes" => keys.ramfs_inodes = Some(check_inodes(integer(v, key)?).map_err(bad)?),
        "nfs_timeout_ms" => keys.nfs.timeout_ms = Some(integer(v, key)?),
        "nfs_retransmit_ms" => keys.nfs.retransmit_ms = Some(integer(v, key)?),
        "nfs_slots" => keys.nfs.slots = Some(index(v, key)?),
        "nfs_max_nodes" => keys.nfs.max_nodes = Some(index(v, key)?),
        "nfs_unstable_bytes" => keys.nfs.unstable_bytes = Some(index(v, key)?),
        other => return Err(KeyError::new(other, "unknown key")),
    }
    Ok(())
}

fn string(v: &toml::Value, key: &str) -> Result<String, KeyError> {
    v.as_str().map(str::to_string).ok_or_else(|| KeyError::new(key, "must be a string"))
}

fn boolean(v: &toml::Value, key: &str) -> Result<bool, KeyError> {
    v.as_bool().ok_or_else(|| KeyError::new(key, "must be true or false"))
}

/// A non-negative integer within the key's bound ([`BOUNDS`]).
fn integer(v: &toml::Value, key: &str) -> Result<u64, KeyError> {
    let n = v
        .as_integer()
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| KeyError::new(key, "must be a non-negative integer"))?;
    bounded(key, n)
}

fn index(v: &toml::Value, key: &str) -> Result<usize, KeyError> {
    usize::try_from(integer(v, key)?).map_err(|_| KeyError::new(key, "too large"))
}

/// `refuse`: a comma-separated string (as `--refuse` takes it) or a list of names.
fn refuse(v: &toml::Value) -> Result<Policy, String> {
    match v {
        toml::Value::String(s) => Policy::refusing(s),
        toml::Value::Array(a) => {
            let names: Option<Vec<&str>> = a.iter().map(toml::Value::as_str).collect();
            let names = names.ok_or_else(|| format!("expected names among {}", Policy::NAMES.join(", ")))?;
            Policy::refusing(&names.join(","))
        }
        _ => Err(format!("expected a list of names among {}", Policy::NAMES.join(", "))),
    }
}

/// The names a [`Policy`] refuses, as `refuse` and `--refuse` give them.
pub fn refused_names(p: &Policy) -> Vec<&'static str> {
    [(p.device_nodes, "device-nodes"), (p.setid, "setid"), (p.file_caps, "file-caps")]
        .into_iter()
        .filter_map(|(allowed, name)| (!allowed).then_some(name))
        .collect()
}

/// Parses a size: bytes, or a number with a `K`, `M`, `G` or `T` suffix (powers of 1024;
/// `KiB`, `MB` and so on are read the same way), as `--ramfs-size` and `ramfs_size` take it.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 =
        num.parse().map_err(|_| format!("{s:?}: expected a number of bytes, or one with K, M, G or T"))?;
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("{s:?}: more than 2^64 bytes"))
}

/// Checks an inode limit: at least the root directory.
pub fn check_inodes(n: u64) -> Result<u64, String> {
    if n == 0 {
        return Err("at least 1 (the root directory)".into());
    }
    Ok(n)
}

/// `--ramfs-inodes`'s parser.
pub fn parse_inodes(s: &str) -> Result<u64, String> {
    let n: u64 = s.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
    bounded("ramfs_inodes", check_inodes(n)?).map_err(|e| e.to_string())
}

/// `--ramfs-size`'s parser: a size ([`parse_size`]) within `ramfs_size`'s bound.
pub fn parse_ramfs_size(s: &str) -> Result<u64, String> {
    bounded("ramfs_size", parse_size(s)?).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert!(parse_size("1X").is_err() && parse_size("").is_err() && parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn function_keys_come_out_typed_and_the_device_keys_stay() {
        let mut t = table(
            "queue_size = 256\nramfs_size = \"64M\"\nramfs_inodes = 1000\nrefuse = [\"device-nodes\", \"setid\"]\n\
             cache = \"never\"\nxattr = false\nnfs_slots = 8\n",
        );
        let (k, root) = take_keys(&mut t, Level::Function).unwrap();
        assert_eq!(root, None);
        assert_eq!((k.ramfs_size, k.ramfs_inodes), (Some(64 << 20), Some(1000)));
        let refused = k.refuse.unwrap();
        assert!(!refused.device_nodes && !refused.setid && refused.file_caps);
        assert_eq!(refused_names(&refused), ["device-nodes", "setid"]);
        assert_eq!((k.cache, k.xattr, k.nfs.slots), (Some(CachePolicy::Never), Some(false), Some(8)));
        assert_eq!(t.keys().collect::<Vec<_>>(), ["queue_size"]);
        let mut t = table("refuse = \"file-caps\"\n");
        assert!(!take_keys(&mut t, Level::Top { functions: true }).unwrap().0.refuse.unwrap().file_caps);
    }

    #[test]
    fn misplaced_and_bad_keys_are_named() {
        let err = |text: &str, level| take_keys(&mut table(text), level).unwrap_err();
        let e = err("poller_cores = [1]\n", Level::Function);
        assert!(e.key == "poller_cores" && e.reason.contains("daemon-wide"), "{e}");
        let e = err("socket_path = \"/s\"\n", Level::Top { functions: false });
        assert_eq!(e.key, "socket_path");
        let e = err("remote = \"nfs://h/e\"\n", Level::Top { functions: true });
        assert_eq!(e.key, "remote");
        assert!(take_keys(&mut table("remote = \"nfs://h/e\"\n"), Level::Top { functions: false }).is_ok());
        let e = err("sandbox_root = \"/srv\"\n", Level::Top { functions: false });
        assert!(e.to_string().contains("sandbox_root"), "{e}");
        for (text, key) in [
            ("ramfs_inodes = 0\n", "ramfs_inodes"),
            ("ramfs_size = \"lots\"\n", "ramfs_size"),
            ("ramfs_size = true\n", "ramfs_size"),
            ("refuse = \"devices\"\n", "refuse"),
            ("io_mode = 3\n", "io_mode"),
            ("cache = \"sometimes\"\n", "cache"),
            ("nfs_slots = -1\n", "nfs_slots"),
        ] {
            assert_eq!(err(text, Level::Function).key, key, "{text}");
        }
        // Every numeric key has a bound, refused one past it and taken at it.
        for &(key, max) in BOUNDS {
            let e = err(&format!("{key} = {}\n", max + 1), Level::Function);
            assert!(e.key == key && e.reason.contains(&max.to_string()), "{e}");
            assert!(take_keys(&mut table(&format!("{key} = {max}\n")), Level::Function).is_ok(), "{key}");
        }
        assert!(err("ramfs_size = \"2T\"\n", Level::Function).key == "ramfs_size");
        assert!(parse_ramfs_size("2T").unwrap_err().contains("ramfs_size") && parse_ramfs_size("1T").is_ok());
        assert!(parse_inodes("4294967297").is_err());
    }
}
