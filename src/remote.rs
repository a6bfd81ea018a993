//! The daemon's remote backend settings: `--remote nfs://HOST[:PORT]/EXPORT[?nfsport=N&mountport=M]`
//! and the profile keys that go with it, turned into the backend's [`NfsOptions`].
//!
//! The hardware profile ([`Profile`]) belongs to the device crate, which knows nothing of NFS;
//! the daemon's profile file may carry the remote keys beside the device's, so [`load_profile`]
//! takes those out ([`RemoteKeys`], unknown `nfs_*` keys rejected by name) and hands the rest to
//! [`Profile::from_toml`].

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use virtiofs_backend::filesystem::CachePolicy;
use virtiofs_backend::nfs::fs::NfsOptions;
use virtiofs_backend::nfs::url::{NfsUrl, UrlError};
use virtiofs_device::config::{ConfigError, Profile};

use crate::ops::options::{self, BackendProfile};

/// The remote backend's profile keys (all optional; `--remote` overrides `remote`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteKeys {
    /// `nfs://` URL of the export to serve.
    pub remote: Option<String>,
    /// A request the server has not answered by then ends with `EIO` (milliseconds).
    pub nfs_timeout_ms: Option<u64>,
    /// No reply by then: reconnect and send again (milliseconds).
    pub nfs_retransmit_ms: Option<u64>,
    /// Calls in flight per poller's connection.
    pub nfs_slots: Option<usize>,
    /// Node ids the guest kernel may hold at once.
    pub nfs_max_nodes: Option<usize>,
    /// Bytes of UNSTABLE writes kept until their COMMIT (0: every WRITE is FILE_SYNC).
    pub nfs_unstable_bytes: Option<usize>,
}

impl RemoteKeys {
    /// Whether a key names a remote setting (`remote`, `nfs_*`).
    fn is_remote_key(key: &str) -> bool {
        key == "remote" || key.starts_with("nfs_")
    }
}

/// Why the profile or the remote settings are not usable.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The profile file cannot be read or its device part is invalid.
    #[error(transparent)]
    Profile(#[from] ConfigError),
    /// A local backend's key (`ramfs_size`, `ramfs_inodes`) or the device's part is invalid.
    #[error(transparent)]
    Options(#[from] options::ProfileError),
    /// The profile file is not TOML.
    #[error("profile {path}: not a TOML table")]
    Toml {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: toml::de::Error,
    },
    /// A remote key is unknown or has the wrong type.
    #[error("profile {path}: remote keys")]
    Keys {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: toml::de::Error,
    },
    /// The `nfs://` URL is wrong.
    #[error("remote URL {url:?}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong.
        #[source]
        source: UrlError,
    },
    /// A remote key is out of range.
    #[error("{key}: {reason}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// Why.
        reason: &'static str,
    },
}

/// Reads a profile file: the device's keys become the [`Profile`], the remote ones
/// [`RemoteKeys`].
pub fn load_profile(path: &Path) -> Result<(Profile, BackendProfile, RemoteKeys), RemoteError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
    split_profile(&text, &path.display().to_string())
}

/// [`load_profile`] on the file's text (`path` names it in errors).
pub fn split_profile(text: &str, path: &str) -> Result<(Profile, BackendProfile, RemoteKeys), RemoteError> {
    let mut table: toml::Table =
        toml::from_str(text).map_err(|source| RemoteError::Toml { path: path.to_owned(), source })?;
    let mut remote = toml::Table::new();
    let keys: Vec<String> = table.keys().filter(|k| RemoteKeys::is_remote_key(k)).cloned().collect();
    for k in keys {
        if let Some(v) = table.remove(&k) {
            remote.insert(k, v);
        }
    }
    let keys = RemoteKeys::deserialize(remote)
        .map_err(|source| RemoteError::Keys { path: path.to_owned(), source })?;
    // The rest is the local backends' keys and the device's, checked by their own parsers
    // (unknown keys named there).
    let rest = toml::to_string(&table).unwrap_or_default();
    let (profile, backend) = options::parse_profile(&rest)?;
    Ok((profile, backend, keys))
}

/// The backend's options for `url` (from `--remote` or the profile's `remote`), the profile's
/// remote keys and `--cache` (default `auto`: close-to-open).
pub fn nfs_options(
    url: &str,
    keys: &RemoteKeys,
    cache: Option<CachePolicy>,
) -> Result<NfsOptions, RemoteError> {
    let parsed: NfsUrl = url.parse().map_err(|source| RemoteError::Url { url: url.to_owned(), source })?;
    let mut o = NfsOptions::new(parsed);
    o.cache = cache.unwrap_or(CachePolicy::Auto);
    let ms = |key: &'static str, v: u64| match v {
        0 => Err(RemoteError::Invalid { key, reason: "must be at least 1 ms" }),
        v if v > 3_600_000 => Err(RemoteError::Invalid { key, reason: "must be at most an hour" }),
        v => Ok(Duration::from_millis(v)),
    };
    if let Some(v) = keys.nfs_timeout_ms {
        o.timeout = ms("nfs_timeout_ms", v)?;
    }
    if let Some(v) = keys.nfs_retransmit_ms {
        o.retransmit = ms("nfs_retransmit_ms", v)?;
    }
    if o.retransmit > o.timeout {
        return Err(RemoteError::Invalid {
            key: "nfs_retransmit_ms",
            reason: "must not be longer than nfs_timeout_ms",
        });
    }
    if let Some(v) = keys.nfs_slots {
        if v == 0 || v > 1 << 16 {
            return Err(RemoteError::Invalid { key: "nfs_slots", reason: "must be 1 to 65536" });
        }
        o.slots_per_poller = v;
    }
    if let Some(v) = keys.nfs_max_nodes {
        if v < 16 {
            return Err(RemoteError::Invalid { key: "nfs_max_nodes", reason: "must be at least 16" });
        }
        o.max_nodes = v;
    }
    if let Some(v) = keys.nfs_unstable_bytes {
        o.unstable_bytes = v;
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_keys_are_split_from_the_device_profile() {
        let text = "tag = \"nfsfs\"\nrequest_queues = 2\nremote = \"nfs://127.0.0.1/srv?nfsport=2049&mountport=20048\"\n\
                    nfs_timeout_ms = 5000\nnfs_slots = 32\n";
        let (profile, _, keys) = split_profile(text, "t.toml").unwrap();
        assert_eq!(profile.tag, "nfsfs");
        assert_eq!(profile.request_queues, 2);
        assert_eq!(keys.nfs_timeout_ms, Some(5000));
        let o = nfs_options(keys.remote.as_deref().unwrap(), &keys, None).unwrap();
        assert_eq!(o.url.export, "/srv");
        assert_eq!(o.url.nfsport, Some(2049));
        assert_eq!(o.url.mountport, Some(20048));
        assert_eq!(o.timeout, Duration::from_secs(5));
        assert_eq!(o.slots_per_poller, 32);
        assert_eq!(o.retransmit, NfsOptions::RETRANSMIT);
        assert_eq!(o.cache, CachePolicy::Auto);
    }

    #[test]
    fn unknown_or_bad_keys_are_named() {
        let e = split_profile("nfs_timeout = 5\n", "t.toml").unwrap_err();
        assert!(format!("{:?}", e).contains("nfs_timeout"), "{e:?}");
        let e = split_profile("queue_size = 3\n", "t.toml").unwrap_err();
        assert!(e.to_string().contains("queue_size"), "{e}");
        let keys = RemoteKeys { nfs_timeout_ms: Some(0), ..RemoteKeys::default() };
        let e = nfs_options("nfs://h/e", &keys, None).unwrap_err();
        assert!(e.to_string().contains("nfs_timeout_ms"), "{e}");
        let keys =
            RemoteKeys { nfs_timeout_ms: Some(1000), nfs_retransmit_ms: Some(2000), ..Default::default() };
        assert!(nfs_options("nfs://h/e", &keys, None).is_err());
        let e = nfs_options("http://h/e", &RemoteKeys::default(), None).unwrap_err();
        assert!(matches!(e, RemoteError::Url { .. }), "{e:?}");
    }
}
