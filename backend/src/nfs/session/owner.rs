//! The client's name for EXCHANGE_ID: its owner id ([`client_owner`]), one per device function,
//! the same across the daemon's restarts, and the host identity it is made from
//! ([`host_identity`], the only I/O of the session module, done once where the function is set
//! up).
//!
//! RFC 8881 2.4: the server knows a client by its owner id; a client that comes back with the
//! same owner (and a new verifier, a new incarnation) replaces its earlier incarnation, whose
//! opens and locks the server then drops at once instead of at the end of their lease; in the
//! server's grace period, the same owner is what lets a client reclaim its state. Two clients
//! with the same owner are one to the server (the second's EXCHANGE_ID takes the first's
//! state), so the owner must differ between every two functions that may serve the same export
//! at once: on two hosts (the host identity) or in one daemon (the function's tag). It must not
//! change when the daemon restarts, is updated or recovers from a crash (nothing in it is the
//! process's or the boot's), nor when the server is reached at another address (the server's
//! address is not in it: a server with several addresses sees one client; two servers keep
//! apart their own clients anyway).
//!
//! The host identity is systemd's machine id, which its documentation asks not to show on the
//! network: it goes into the owner only through a hash keyed by this use (as
//! `sd_id128_get_machine_app_specific` does), 64 bits of FNV-1a, which is enough to keep apart
//! the hosts of one server and stable across builds (std's hasher is not). Without a machine
//! id, the host name stands in.

use crate::nfs::wire::nfs4::OPAQUE_LIMIT;

/// What identifies this host: `/etc/machine-id`, else the host name (empty when neither is
/// readable). Read once, at set-up.
pub fn host_identity() -> Vec<u8> {
    if let Ok(id) = std::fs::read("/etc/machine-id") {
        let id = id.trim_ascii();
        if !id.is_empty() {
            return id.to_vec();
        }
    }
    std::fs::read("/proc/sys/kernel/hostname").map(|h| h.trim_ascii().to_vec()).unwrap_or_default()
}

/// 64-bit FNV-1a over `parts`, each followed by a 0 byte.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(&[0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The EXCHANGE_ID owner id of the function `function` (its tag) serving `export` (the export's
/// path on the server), on the host `host` ([`host_identity`]):
/// `virtiofs-dpu/HOSTHASH/FUNCTION:EXPORT`, where a function and export too long for the
/// owner's 1,024 bytes are replaced by their hash.
pub fn client_owner(host: &[u8], export: &str, function: &str) -> Vec<u8> {
    let host = fnv1a(&[b"virtiofs-dpu nfs4.1 client owner", host]);
    let mut out = format!("virtiofs-dpu/{host:016x}/").into_bytes();
    if out.len() + function.len() + 1 + export.len() <= OPAQUE_LIMIT as usize {
        out.extend_from_slice(function.as_bytes());
        out.push(b':');
        out.extend_from_slice(export.as_bytes());
    } else {
        let h = fnv1a(&[function.as_bytes(), export.as_bytes()]);
        out.extend_from_slice(format!("{h:016x}").as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{client_owner, fnv1a, host_identity};

    #[test]
    fn owners_are_stable_distinct_and_bounded() {
        let a = client_owner(b"0123456789abcdef0123456789abcdef", "/srv/export", "fs0");
        assert_eq!(a, client_owner(b"0123456789abcdef0123456789abcdef", "/srv/export", "fs0"));
        // The value itself is part of the contract: a restarted or updated daemon must send the
        // same owner, whatever its build.
        assert_eq!(fnv1a(&[b"a"]), 0x089b_e207_b544_f1e4);
        let s = String::from_utf8(a.clone()).unwrap();
        assert!(s.starts_with("virtiofs-dpu/") && s.ends_with("/fs0:/srv/export"), "{s}");
        assert!(!s.contains("0123456789abcdef"), "the machine id is not shown: {s}");
        assert_ne!(a, client_owner(b"another host", "/srv/export", "fs0"));
        assert_ne!(a, client_owner(b"0123456789abcdef0123456789abcdef", "/srv/export", "fs1"));
        assert_ne!(a, client_owner(b"0123456789abcdef0123456789abcdef", "/srv/other", "fs0"));
        let long = "x".repeat(2000);
        let b = client_owner(b"h", &long, "fs0");
        assert!(b.len() <= 1024);
        assert_ne!(b, client_owner(b"h", &long, "fs1"));
        let _ = host_identity();
    }
}
