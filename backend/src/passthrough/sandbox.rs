//! Confining the daemon once its sockets are bound: what it can name, what it may do, and which
//! system calls it may make. The daemon's start-up (the root crate's `daemon::confine`) calls,
//! in this order, on its only thread, after binding every socket and before the pollers or any
//! function's control plane start a thread:
//!
//! 1. [`enter_namespace`] (`--sandbox=namespace`, the default when running as root, for a daemon
//!    whose functions share host directories; [`enter_namespace_keeping_network`] for one whose
//!    functions are all NFS exports, which must keep reaching the server): new mount,
//!    IPC and network namespaces (the vfio-user socket is already bound and the guest memory
//!    descriptors arrive over it). Every mount becomes a slave, recursively, so nothing mounted or
//!    unmounted here reaches the host. A fresh procfs is mounted (`subset=pid,hidepid=invisible`
//!    where the kernel has them, 5.8+) and its `/proc/self/fd` bind-mounted over `/proc`, and a
//!    descriptor on that is kept: the passthrough reopens nodes through it; as the root of a
//!    mount detached with the old root, `..` from it leads nowhere. Then the shared directory is
//!    bind-mounted onto itself (recursively: mounts below it come along), `pivot_root` makes it
//!    the root, and the old root is detached (`MNT_DETACH`). From here no path the daemon forms,
//!    however wrong, names a host file outside the shared directory: `/` is the shared directory,
//!    `..` stops there, and the passthrough opens its root (and with it every node) afresh in
//!    the new root, so no descriptor opened before the switch can lead back out.
//! 2. once every function's backend is built, [`drop_privileges_keeping`] ([`KEPT_CAPS`] for a
//!    daemon with shares, as [`drop_privileges`]; [`NFS_KEPT_CAPS`], none, for NFS exports
//!    only): `PR_SET_NO_NEW_PRIVS` (nothing the process executes can gain
//!    privileges), every capability but the kept ones removed from the bounding set, and only
//!    those kept in the permitted and effective sets (nothing inheritable). The kept set is
//!    virtiofsd's: what serving a guest's root user needs, and setting the filesystem ids and the
//!    supplementary group per request. Dropped, among others: `CAP_SYS_ADMIN` (mounts, namespaces,
//!    `trusted.*` xattrs), `CAP_DAC_READ_SEARCH` (open-by-handle, which could reach any inode of
//!    the host filesystem), `CAP_SYS_PTRACE`, `CAP_NET_*`, `CAP_SYS_MODULE`, `CAP_SYS_RAWIO`,
//!    `CAP_SETPCAP` (after use).
//! 3. [`seccomp::install`](super::seccomp::install): the system-call allowlist.
//!
//! Namespaces and capabilities are per thread: threads started afterwards inherit them, which is
//! why all of this happens before the device's threads exist ([`enter_namespace`] refuses to run
//! in a process that already has more than one thread).
//!
//! The NFS daemon (`virtiofs-dpu --remote`) is confined by the same steps in a mode of its own:
//! [`enter_namespace_keeping_network`] makes new mount and IPC namespaces whose root is an empty,
//! read-only tmpfs (the daemon names no file once it serves), but keeps the host's network
//! namespace (its pollers connect to the server again after an outage);
//! [`drop_privileges_keeping`] with [`NFS_KEPT_CAPS`] (none: the caller's credentials travel in
//! the RPC's AUTH_SYS, nothing is done as them locally); and the allowlist with
//! [`Network::TcpClient`](super::seccomp::Network::TcpClient) (TCP sockets and what connecting
//! and reconnecting need).
//!
//! Not done: a PID namespace (it needs a fork, and the daemon's pid is what the harness and
//! the tests watch; the fresh procfs hides other processes where `hidepid` is available), and
//! running as an unprivileged user with uid/gid mappings. When the daemon exits from inside the
//! namespace its socket file stays behind (the path no longer names it); the next start
//! replaces it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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

/// Capabilities the NFS daemon keeps: none (see the module documentation).
pub const NFS_KEPT_CAPS: &[(u32, &str)] = &[];

/// The kept capabilities as a mask.
pub fn kept_mask() -> u64 {
    mask_of(KEPT_CAPS)
}

fn mask_of(caps: &[(u32, &str)]) -> u64 {
    caps.iter().fold(0, |m, &(bit, _)| m | (1 << bit))
}

/// How the daemon confines what it can name (`--sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxMode {
    /// New mount, IPC and network namespaces with the shared directory as the root
    /// ([`enter_namespace`]).
    Namespace,
    /// None: the daemon sees the host's filesystem (the passthrough still resolves every name
    /// beneath the shared directory, see [`super`]).
    None,
}

impl SandboxMode {
    /// The default: [`SandboxMode::Namespace`] when running as root (creating namespaces needs
    /// `CAP_SYS_ADMIN`), else [`SandboxMode::None`].
    pub fn default_for_this_process() -> Self {
        if sys::geteuid() == 0 {
            SandboxMode::Namespace
        } else {
            SandboxMode::None
        }
    }
}

impl std::str::FromStr for SandboxMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "namespace" => Ok(SandboxMode::Namespace),
            "none" => Ok(SandboxMode::None),
            other => Err(format!("unknown sandbox mode {other:?} (namespace or none)")),
        }
    }
}

/// Why the daemon could not confine itself.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Other threads exist; they would stay outside the namespaces.
    #[error("the process already runs {0} threads; the sandbox must be entered before any starts")]
    Threads(usize),
    /// The shared directory cannot be resolved.
    #[error("cannot resolve the shared directory {path}")]
    SharedDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `unshare` failed: no privilege to create namespaces.
    #[error("cannot create mount, IPC and network namespaces (run as root, or use --sandbox=none)")]
    Unshare(#[source] io::Error),
    /// A mount step failed.
    #[error("sandbox: cannot {what}")]
    Mount {
        /// What was tried.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// What [`enter_namespace`] leaves the daemon.
#[derive(Debug)]
pub struct Confined {
    /// `/proc/self/fd` of a procfs mounted in the new namespace, for
    /// [`PassthroughFs::with_proc_fd`](super::PassthroughFs::with_proc_fd).
    pub proc_self_fd: OwnedFd,
    /// The shared directory as the host names it (it is `/` now).
    pub shared_dir: PathBuf,
    /// Whether the fresh procfs got `subset=pid,hidepid=invisible`.
    pub proc_restricted: bool,
}

fn cpath(p: &Path) -> io::Result<CString> {
    sys::cstring(p.as_os_str().as_bytes())
}

fn mount_err(what: &'static str) -> impl FnOnce(io::Error) -> SandboxError {
    move |source| SandboxError::Mount { what, source }
}

/// The number of threads of this process (`/proc/self/task`).
fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Enters new mount, IPC and network namespaces whose root is `shared_dir` (see the module
/// documentation). Call on the only thread of the process. Afterwards `/` is the shared
/// directory: open the passthrough's root as `/`, with the returned `/proc/self/fd`.
pub fn enter_namespace(shared_dir: &Path) -> Result<Confined, SandboxError> {
    enter_namespace_with(shared_dir, false)
}

/// As [`enter_namespace`]; `keep_network`: stay in the host's network namespace (a daemon
/// that also serves NFS exports, whose pollers connect to their servers).
pub fn enter_namespace_with(shared_dir: &Path, keep_network: bool) -> Result<Confined, SandboxError> {
    let threads = thread_count().map_err(mount_err("count the threads in /proc/self/task"))?;
    if threads != 1 {
        return Err(SandboxError::Threads(threads));
    }
    let dir = std::fs::canonicalize(shared_dir)
        .map_err(|source| SandboxError::SharedDir { path: shared_dir.to_path_buf(), source })?;
    let cdir = cpath(&dir).map_err(|source| SandboxError::SharedDir { path: dir.clone(), source })?;
    let net = if keep_network { 0 } else { libc::CLONE_NEWNET };
    sys::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC | net).map_err(SandboxError::Unshare)?;
    // Nothing done in here propagates to the host (mounts made there still show up here).
    sys::mount(None, c"/", None, libc::MS_SLAVE | libc::MS_REC, None)
        .map_err(mount_err("make the mounts slaves"))?;

    // A procfs of our own, and its /proc/self/fd as a mount root of its own.
    let proc_flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RELATIME;
    let proc_restricted = match sys::mount(
        Some(c"proc"),
        c"/proc",
        Some(c"proc"),
        proc_flags,
        Some(c"subset=pid,hidepid=invisible"),
    ) {
        Ok(()) => true,
        // Before Linux 5.8 procfs has neither option.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            sys::mount(Some(c"proc"), c"/proc", Some(c"proc"), proc_flags, None)
                .map_err(mount_err("mount a procfs on /proc"))?;
            false
        }
        Err(e) => return Err(mount_err("mount a procfs on /proc")(e)),
    };
    sys::mount(Some(c"/proc/self/fd"), c"/proc", None, libc::MS_BIND, None)
        .map_err(mount_err("bind-mount /proc/self/fd on /proc"))?;
    let proc_self_fd =
        sys::open(c"/proc", libc::O_PATH | libc::O_DIRECTORY).map_err(mount_err("open /proc/self/fd"))?;

    let old_root =
        sys::open(c"/", libc::O_PATH | libc::O_DIRECTORY).map_err(mount_err("open the old root"))?;
    let shared =
        sys::open(&cdir, libc::O_PATH | libc::O_DIRECTORY).map_err(mount_err("open the shared directory"))?;
    let same = |a: &OwnedFd, b: &OwnedFd| -> io::Result<bool> {
        let (x, y) = (sys::fstatx(a.as_fd())?, sys::fstatx(b.as_fd())?);
        Ok(x.stx_mnt_id == y.stx_mnt_id
            && x.stx_ino == y.stx_ino
            && x.stx_dev_major == y.stx_dev_major
            && x.stx_dev_minor == y.stx_dev_minor)
    };
    if same(&shared, &old_root).map_err(mount_err("compare the shared directory with the root"))? {
        // Sharing the root itself: nothing to pivot, but the two mounts on /proc must not show
        // in the share (the descriptor keeps the /proc/self/fd one alive).
        for what in ["detach the /proc/self/fd bind mount", "detach the private procfs"] {
            sys::umount2(c"/proc", libc::MNT_DETACH).map_err(mount_err(what))?;
        }
        sys::fchdir(old_root.as_fd()).map_err(mount_err("enter the root"))?;
        return Ok(Confined { proc_self_fd, shared_dir: dir, proc_restricted });
    }
    drop(shared);
    // The shared directory as a mount of its own (pivot_root wants one), submounts included.
    sys::mount(Some(&cdir), &cdir, None, libc::MS_BIND | libc::MS_REC, None)
        .map_err(mount_err("bind-mount the shared directory onto itself"))?;
    let new_root =
        sys::open(&cdir, libc::O_PATH | libc::O_DIRECTORY).map_err(mount_err("open the new root"))?;
    sys::fchdir(new_root.as_fd()).map_err(mount_err("enter the shared directory"))?;
    // The old root goes on top of the new one, then away.
    sys::pivot_root(c".", c".").map_err(mount_err("pivot_root into the shared directory"))?;
    sys::fchdir(old_root.as_fd()).map_err(mount_err("enter the old root"))?;
    sys::mount(None, c".", None, libc::MS_SLAVE | libc::MS_REC, None)
        .map_err(mount_err("make the old root a slave"))?;
    sys::umount2(c".", libc::MNT_DETACH).map_err(mount_err("detach the old root"))?;
    drop(old_root);
    sys::fchdir(new_root.as_fd()).map_err(mount_err("enter the new root"))?;
    Ok(Confined { proc_self_fd, shared_dir: dir, proc_restricted })
}

/// Enters new mount and IPC namespaces, not a network one, whose root is an empty read-only
/// tmpfs (for the NFS daemon, see the module documentation). Call on the only thread of the
/// process, after everything the daemon needs from the host's filesystem is open.
pub fn enter_namespace_keeping_network() -> Result<(), SandboxError> {
    let threads = thread_count().map_err(mount_err("count the threads in /proc/self/task"))?;
    if threads != 1 {
        return Err(SandboxError::Threads(threads));
    }
    sys::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC).map_err(SandboxError::Unshare)?;
    sys::mount(None, c"/", None, libc::MS_SLAVE | libc::MS_REC, None)
        .map_err(mount_err("make the mounts slaves"))?;
    let old_root =
        sys::open(c"/", libc::O_PATH | libc::O_DIRECTORY).map_err(mount_err("open the old root"))?;
    // The new root: an empty tmpfs, read-only from the start, mounted (in this namespace only)
    // on a directory every Linux system has.
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    sys::mount(Some(c"none"), c"/proc", Some(c"tmpfs"), flags, Some(c"size=4k,mode=0555"))
        .map_err(mount_err("mount an empty tmpfs for the new root"))?;
    let new_root =
        sys::open(c"/proc", libc::O_PATH | libc::O_DIRECTORY).map_err(mount_err("open the new root"))?;
    sys::fchdir(new_root.as_fd()).map_err(mount_err("enter the new root"))?;
    sys::pivot_root(c".", c".").map_err(mount_err("pivot_root into the empty root"))?;
    sys::fchdir(old_root.as_fd()).map_err(mount_err("enter the old root"))?;
    sys::mount(None, c".", None, libc::MS_SLAVE | libc::MS_REC, None)
        .map_err(mount_err("make the old root a slave"))?;
    sys::umount2(c".", libc::MNT_DETACH).map_err(mount_err("detach the old root"))?;
    drop(old_root);
    sys::fchdir(new_root.as_fd()).map_err(mount_err("enter the new root"))?;
    Ok(())
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
    drop_privileges_keeping(KEPT_CAPS)
}

/// [`drop_privileges`], keeping the capabilities `kept` instead of [`KEPT_CAPS`].
pub fn drop_privileges_keeping(kept: &[(u32, &str)]) -> io::Result<Dropped> {
    sys::set_no_new_privs()?;
    let mut bounding = 0;
    let kept = mask_of(kept);
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
