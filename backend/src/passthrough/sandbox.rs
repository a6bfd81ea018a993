//! Giving up what the daemon does not need once the shared directory is open.
//!
//! [`drop_privileges`] sets `PR_SET_NO_NEW_PRIVS` (nothing the process executes can gain
//! privileges), removes every capability but [`KEPT_CAPS`] from the bounding set, and keeps only
//! those in the permitted and effective sets (nothing inheritable). The kept set is virtiofsd's:
//! what serving a guest's root user needs, and setting the filesystem ids per request.
//! Dropped, among others: `CAP_SYS_ADMIN` (mounts, `trusted.*` xattrs), `CAP_DAC_READ_SEARCH`
//! (open-by-handle, which could reach any inode of the host filesystem), `CAP_SYS_PTRACE`,
//! `CAP_NET_*`, `CAP_SYS_MODULE`, `CAP_SYS_RAWIO`, `CAP_SETPCAP` (after use).
//!
//! Capabilities are per thread: call it before any other thread starts (the daemon does, before
//! the device's threads), and threads started afterwards inherit the reduced sets.
//!
//! Not done (a follow-up): a mount namespace with the shared directory as its root, a seccomp
//! filter of the system calls the daemon makes, and running as an unprivileged user with id
//! mapping.

use std::io;

use super::sys;

/// Capabilities kept (bit numbers from `linux/capability.h`).
pub const KEPT_CAPS: &[(u32, &str)] = &[
    (0, "CAP_CHOWN"),
    (1, "CAP_DAC_OVERRIDE"),
    (3, "CAP_FOWNER"),
    (4, "CAP_FSETID"),
    (6, "CAP_SETGID"),
    (7, "CAP_SETUID"),
    (27, "CAP_MKNOD"),
    (31, "CAP_SETFCAP"),
];

/// The kept capabilities as a mask.
pub fn kept_mask() -> u64 {
    KEPT_CAPS.iter().fold(0, |m, &(bit, _)| m | (1 << bit))
}

/// What [`drop_privileges`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// Capabilities removed from the bounding set.
    pub bounding: u32,
    /// Whether the process had privileges to drop (root); an unprivileged daemon only sets
    /// `NO_NEW_PRIVS`.
    pub privileged: bool,
}

/// Drops privileges as the module documentation says. Call on the main thread before other
/// threads start.
pub fn drop_privileges() -> io::Result<Dropped> {
    sys::set_no_new_privs()?;
    let mut bounding = 0;
    let kept = kept_mask();
    for cap in 0..64u32 {
        if kept & (1 << cap) != 0 {
            continue;
        }
        match sys::capbset_drop(cap) {
            Ok(()) => bounding += 1,
            // Past the last capability the kernel knows.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
            // Without CAP_SETPCAP (unprivileged): nothing to drop.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                return Ok(Dropped { bounding, privileged: false });
            }
            Err(e) => return Err(e),
        }
    }
    sys::capset(kept, kept, 0)?;
    Ok(Dropped { bounding, privileged: true })
}
