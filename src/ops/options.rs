//! The daemon's profile file with the backend's keys beside the device's (`ramfs_size`,
//! `ramfs_inodes`), and the parsers of virtiofsd-style option values (sizes such as `1G`).
//!
//! The device crate's [`Profile`] knows nothing of filesystems and rejects keys it does not
//! know, so the daemon takes its own keys out of the file's table first and hands the device
//! the rest: a typo in either still names the key.

use std::path::Path;

use serde::Deserialize;
use virtiofs_device::config::{ConfigError, Profile};

/// The keys of a profile file that belong to the backend rather than the device.
pub const BACKEND_KEYS: &[&str] = &["ramfs_size", "ramfs_inodes"];

/// Why a profile file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// A device key (or the file itself): the device's own error, which names the key.
    #[error(transparent)]
    Device(#[from] ConfigError),
    /// A backend key has a value of the wrong type or out of range.
    #[error("invalid value for `{key}`: {reason}")]
    Backend {
        /// The offending key.
        key: &'static str,
        /// Why it is rejected.
        reason: String,
    },
}

/// The backend's keys of a profile (absent: the command line's flag or the default applies).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendProfile {
    /// `ramfs_size`: bytes of file data, extended attributes and ACLs the RAM filesystem may
    /// hold (an integer, or a string with a K, M, G or T suffix, powers of 1024).
    pub ramfs_size: Option<u64>,
    /// `ramfs_inodes`: inodes the RAM filesystem may hold, the root included (at least 1).
    pub ramfs_inodes: Option<u64>,
}

/// A size as a profile gives it: a number of bytes or a string such as `"512M"`.
#[derive(Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

/// Reads and validates a profile file: the device's profile and the backend's keys.
pub fn read_profile(path: &Path) -> Result<(Profile, BackendProfile), ProfileError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
    parse_profile(&text)
}

/// Parses and validates a profile's TOML text: the device's profile and the backend's keys.
pub fn parse_profile(text: &str) -> Result<(Profile, BackendProfile), ProfileError> {
    let mut table: toml::Table = toml::from_str(text).map_err(ConfigError::Parse)?;
    let mut backend = BackendProfile::default();
    if let Some(v) = table.remove("ramfs_size") {
        let bad = |reason: String| ProfileError::Backend { key: "ramfs_size", reason };
        let size: SizeValue =
            v.try_into().map_err(|_| bad("expected bytes (an integer) or a size such as \"1G\"".into()))?;
        backend.ramfs_size = Some(match size {
            SizeValue::Bytes(n) => n,
            SizeValue::Text(s) => parse_size(&s).map_err(bad)?,
        });
    }
    if let Some(v) = table.remove("ramfs_inodes") {
        let bad = |reason: String| ProfileError::Backend { key: "ramfs_inodes", reason };
        let n: u64 = v.try_into().map_err(|_| bad("expected a positive integer".into()))?;
        backend.ramfs_inodes = Some(check_inodes(n).map_err(bad)?);
    }
    let profile: Profile = toml::Value::Table(table).try_into().map_err(ConfigError::Parse)?;
    profile.validate()?;
    Ok((profile, backend))
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
    check_inodes(n)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn backend_keys_beside_the_device_keys() {
        let (p, b) = parse_profile("queue_size = 256\nramfs_size = \"64M\"\nramfs_inodes = 1000\n").unwrap();
        assert_eq!(p.queue_size, 256);
        assert_eq!(b, BackendProfile { ramfs_size: Some(64 << 20), ramfs_inodes: Some(1000) });
        let (_, b) = parse_profile("ramfs_size = 8192\n").unwrap();
        assert_eq!(b.ramfs_size, Some(8192));
        assert_eq!(parse_profile("").unwrap().1, BackendProfile::default());
        // Errors name the key, device or backend.
        let e = parse_profile("ramfs_inodes = 0\n").unwrap_err().to_string();
        assert!(e.contains("ramfs_inodes"), "{e}");
        let e = parse_profile("ramfs_size = \"lots\"\n").unwrap_err().to_string();
        assert!(e.contains("ramfs_size"), "{e}");
        let e = parse_profile("ramfs_size = true\n").unwrap_err().to_string();
        assert!(e.contains("ramfs_size"), "{e}");
        let e = parse_profile("ramfs_sise = 1\n").unwrap_err().to_string();
        assert!(e.contains("ramfs_sise"), "{e}");
        let e = parse_profile("queue_size = 100\n").unwrap_err().to_string();
        assert!(e.contains("queue_size"), "{e}");
    }

    #[test]
    fn shipped_profiles_still_parse() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/hw-configs");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let (p, _) = read_profile(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert_eq!(p, Profile::from_file(&path).unwrap());
            }
        }
    }
}
