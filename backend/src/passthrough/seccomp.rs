//! The system-call allowlist of the passthrough daemon once it serves (`--seccomp`), as
//! seccomp-BPF filters compiled with `seccompiler` for the build's architecture (x86_64 or
//! aarch64) and installed on every thread (`SECCOMP_FILTER_FLAG_TSYNC`; the daemon installs them
//! before its threads start, so they inherit them too).
//!
//! The list is what the daemon was seen to call after the filter point — the control plane
//! (mio/epoll, vfio-user messages with descriptors, DMA windows mapped from those, eventfd
//! interrupts), the pollers (parking, io_uring submission and completion), the passthrough
//! (`*at` calls on held descriptors, per-thread credentials and umask, xattrs through
//! `/proc/self/fd` entries) and the Rust runtime (threads, memory, signals). It was found with
//! `tools/seccomp-trace.sh --vm`: `strace -f` of the sandboxed daemon under virtiofs-bench and
//! under pjdfstest, fsx and escape.sh in a guest (every call after the daemon's `capset`), plus
//! the guest suites in `--seccomp=log` mode (the kernel's audit records in `dmesg`: that is how
//! `renameat` and `unlink` were found). Kept although those runs did not show them, for code
//! paths they do not take: `pread64`/`pwrite64` (`--io-mode=sync`), `io_uring_enter` (a ring
//! submission: `--io-mode=ring`, or storage that would block), `faccessat2`, `renameat2`,
//! `setxattr`/`listxattr`/`removexattr` (ACCESS, RENAME2 with flags, xattrs: the daemon tests
//! make them), `sched_setaffinity` (profiles with `poller_cores`), `sched_yield` (a full ring),
//! `mremap` and `brk` (the allocator), `clock_gettime` (when the vDSO cannot answer), `read` (mio's
//! waker when its eventfd would overflow), `getpid`/`tgkill` (the `SIGSYS` reporter, `abort`).
//! The daemon tests run every I/O mode and the whole FUSE workload under `--seccomp=kill`, and CI
//! runs the guest suites under the default `trap`.
//!
//! A few calls are allowed only with the arguments the daemon uses: `clone` only for threads
//! (`CLONE_THREAD`; no new processes), `unshare` only `CLONE_FS` (the per-thread filesystem
//! context of [`super::creds`]; no namespaces), `prctl` only `PR_SET_NAME` (thread names),
//! `ppoll` (a sleeping poller: its wake-up eventfd, engines and doorbell sources), `shutdown`
//! (the vfio-user connection when its client goes), `ioctl` only `FIONBIO`, `setsockopt` only `SO_SNDTIMEO`,
//! `getsockopt` only `SO_PEERCRED` (the control socket's check of its clients), `mmap`/`mprotect` never with
//! `PROT_EXEC`; no `socket` at all (the daemon opens none after binding). `clone3` passes its
//! flags in memory, where a filter cannot look, so a second filter makes it fail with `ENOSYS`,
//! and glibc falls back to `clone`.
//!
//! The NFS daemon (`--remote`) gets the same list plus what its pollers' TCP connections need
//! ([`Network::TcpClient`], [`allowlist_with`]): `socket` only for `AF_INET`/`AF_INET6` stream
//! sockets, `connect`, `getsockopt` also `SO_ERROR` (a non-blocking connect's outcome),
//! `setsockopt` also `TCP_NODELAY` and `SO_RCVTIMEO`, `getpeername`/`getsockname`, `readv`/`writev`, `shutdown`,
//! `poll` (the blocking UMNT call at exit).
//! No `bind` or `listen`: it reconnects, it never serves on the network.
//!
//! What happens to a call not on the list is the [`SeccompMode`]: the default, `trap`, has the
//! kernel send `SIGSYS`, whose handler writes the call's number to standard error before the
//! signal kills the process: a missing entry names itself in the daemon's log.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

use super::sys;

/// What a system call outside the allowlist does (`--seccomp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeccompMode {
    /// The kernel kills the process (`SECCOMP_RET_KILL_PROCESS`; the audit log names the call).
    Kill,
    /// `SIGSYS`: the daemon writes the call's number to its log, then dies of the signal.
    Trap,
    /// Allowed, but the kernel logs it (`SECCOMP_RET_LOG`: an audit record, `type=1326`, in the
    /// kernel log or the audit log), to find what the list lacks.
    Log,
    /// No filter.
    Off,
}

impl std::str::FromStr for SeccompMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kill" => Ok(SeccompMode::Kill),
            "trap" => Ok(SeccompMode::Trap),
            "log" => Ok(SeccompMode::Log),
            "off" | "none" => Ok(SeccompMode::Off),
            other => Err(format!("unknown seccomp mode {other:?} (kill, trap, log or off)")),
        }
    }
}

/// Why the filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The rules do not compile (a bug in the list).
    #[error("cannot build the seccomp filter")]
    Build(#[source] seccompiler::BackendError),
    /// The kernel refused the filter (no seccomp-BPF, or emulation that does not pass it on).
    #[error("cannot install the seccomp filter")]
    Install(#[source] seccompiler::Error),
    /// The `SIGSYS` reporter could not be installed.
    #[error("cannot install the SIGSYS handler")]
    Signal(#[source] std::io::Error),
}

/// What network access the daemon keeps beyond its vfio-user socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// None: no socket is made after the filter is in (the passthrough daemon).
    None,
    /// TCP client connections, made and made again by the pollers (the NFS daemon).
    TcpClient,
}

/// The architecture the daemon is built for.
#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
/// The architecture the daemon is built for.
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

/// One allowed system call: number, name (for the documentation and the tests) and argument
/// rules (empty: any arguments).
pub struct Allowed {
    /// The system call number on this architecture.
    pub nr: i64,
    /// Its name.
    pub name: &'static str,
    rules: Vec<SeccompRule>,
}

fn rule(conds: Vec<SeccompCondition>) -> SeccompRule {
    // Non-empty condition lists never fail to build.
    SeccompRule::new(conds).unwrap_or_else(|e| panic!("seccomp rule: {e}"))
}

/// A condition on argument `arg` as a 64-bit value (`unsigned long` arguments).
fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> SeccompCondition {
    // Argument indices below 6 never fail to build.
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
        .unwrap_or_else(|e| panic!("seccomp condition: {e}"))
}

/// A condition on argument `arg` as a 32-bit value (`int` arguments: the upper half of the
/// register is not defined).
fn cond32(arg: u8, op: SeccompCmpOp, value: u32) -> SeccompCondition {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, u64::from(value))
        .unwrap_or_else(|e| panic!("seccomp condition: {e}"))
}

/// Argument `arg`, an `int`, equals `value`.
fn arg32_eq(arg: u8, value: u32) -> SeccompRule {
    rule(vec![cond32(arg, SeccompCmpOp::Eq, value)])
}

macro_rules! allow {
    ($list:ident, $name:ident) => {
        $list.push(Allowed { nr: libc::$name, name: stringify!($name), rules: Vec::new() })
    };
    ($list:ident, $name:ident, $($rule:expr),+ $(,)?) => {
        $list.push(Allowed { nr: libc::$name, name: stringify!($name), rules: vec![$($rule),+] })
    };
}

/// The allowlist for this architecture (see the module documentation).
pub fn allowlist() -> Vec<Allowed> {
    let mut l = Vec::new();
    let no_exec = |arg| rule(vec![cond32(arg, SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64), 0)]);
    // Memory: the heap, thread stacks, DMA windows from the client's descriptors, io_uring rings.
    allow!(l, SYS_brk);
    allow!(l, SYS_mmap, no_exec(2));
    allow!(l, SYS_mprotect, no_exec(2));
    allow!(l, SYS_munmap);
    allow!(l, SYS_mremap);
    allow!(l, SYS_madvise);
    // Threads and their synchronisation.
    allow!(
        l,
        SYS_clone,
        rule(vec![cond(0, SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64), libc::CLONE_THREAD as u64)])
    );
    allow!(l, SYS_clone3); // refused with ENOSYS by the second filter, see `filters`
    allow!(l, SYS_futex);
    // A timed futex wait (a parked poller) interrupted by task work (an io_uring torn down while
    // the daemon runs, as when a function of a multi-function daemon is removed) resumes
    // through restart_syscall; it can only restart a call that was allowed.
    allow!(l, SYS_restart_syscall);
    allow!(l, SYS_set_robust_list);
    allow!(l, SYS_rseq);
    allow!(l, SYS_sched_yield);
    allow!(l, SYS_sched_getaffinity);
    allow!(l, SYS_sched_setaffinity);
    allow!(l, SYS_gettid);
    allow!(l, SYS_getpid);
    allow!(l, SYS_prctl, arg32_eq(0, libc::PR_SET_NAME as u32));
    allow!(l, SYS_exit);
    allow!(l, SYS_exit_group);
    allow!(l, SYS_clock_gettime);
    allow!(l, SYS_getrandom);
    // Signals: the SIGTERM/SIGINT self-pipe, the SIGSYS reporter, thread start and exit.
    allow!(l, SYS_rt_sigaction);
    allow!(l, SYS_rt_sigprocmask);
    allow!(l, SYS_rt_sigreturn);
    allow!(l, SYS_sigaltstack);
    allow!(l, SYS_tgkill);
    // Descriptors and the event loop.
    allow!(l, SYS_read);
    allow!(l, SYS_write);
    allow!(l, SYS_close);
    allow!(l, SYS_fcntl);
    allow!(l, SYS_ioctl, arg32_eq(1, libc::FIONBIO as u32));
    // Reading RLIMIT_NOFILE only (no new limit): the device keeps descriptors free below it.
    allow!(l, SYS_prlimit64, rule(vec![cond(0, SeccompCmpOp::Eq, 0), cond(2, SeccompCmpOp::Eq, 0)]));
    allow!(l, SYS_epoll_create1);
    allow!(l, SYS_epoll_ctl);
    allow!(l, SYS_epoll_pwait);
    #[cfg(target_arch = "x86_64")]
    allow!(l, SYS_epoll_wait);
    allow!(l, SYS_eventfd2);
    // A sleeping poller waits on its wake-up, its engines and its functions' doorbell sources.
    allow!(l, SYS_ppoll);
    // The vfio-user socket: one client at a time, descriptors with the messages; shut down when
    // the client goes (the pollers' copy of it, their doorbell source, is closed later).
    allow!(l, SYS_accept4);
    allow!(l, SYS_shutdown);
    allow!(l, SYS_recvmsg);
    allow!(l, SYS_sendmsg);
    allow!(l, SYS_recvfrom);
    allow!(l, SYS_sendto);
    allow!(
        l,
        SYS_setsockopt,
        rule(vec![
            cond32(1, SeccompCmpOp::Eq, libc::SOL_SOCKET as u32),
            cond32(2, SeccompCmpOp::Eq, libc::SO_SNDTIMEO as u32)
        ])
    );
    // The control socket checks each client's credentials (SO_PEERCRED).
    allow!(
        l,
        SYS_getsockopt,
        rule(vec![
            cond32(1, SeccompCmpOp::Eq, libc::SOL_SOCKET as u32),
            cond32(2, SeccompCmpOp::Eq, libc::SO_PEERCRED as u32)
        ])
    );
    allow!(l, SYS_memfd_create);
    allow!(l, SYS_ftruncate);
    // io_uring, one ring per poller.
    allow!(l, SYS_io_uring_setup);
    allow!(l, SYS_io_uring_enter);
    // The passthrough: names under held descriptors, reopening through /proc/self/fd.
    allow!(l, SYS_openat);
    allow!(l, SYS_openat2);
    allow!(l, SYS_statx);
    allow!(l, SYS_fstatfs);
    allow!(l, SYS_getdents64);
    allow!(l, SYS_lseek);
    allow!(l, SYS_mkdirat);
    allow!(l, SYS_mknodat);
    allow!(l, SYS_symlinkat);
    allow!(l, SYS_linkat);
    allow!(l, SYS_unlinkat);
    // The socket file removed at exit without the namespace sandbox (std's remove_file).
    #[cfg(target_arch = "x86_64")]
    allow!(l, SYS_unlink);
    allow!(l, SYS_renameat2);
    // glibc's renameat2 with no flags is renameat where the architecture has it.
    #[cfg(target_arch = "x86_64")]
    allow!(l, SYS_renameat);
    allow!(l, SYS_readlinkat);
    allow!(l, SYS_fchownat);
    allow!(l, SYS_fchmodat);
    allow!(l, SYS_utimensat);
    allow!(l, SYS_truncate);
    allow!(l, SYS_fallocate);
    allow!(l, SYS_fsync);
    allow!(l, SYS_fdatasync);
    allow!(l, SYS_syncfs);
    allow!(l, SYS_copy_file_range);
    allow!(l, SYS_faccessat2);
    allow!(l, SYS_fchdir);
    allow!(l, SYS_pread64);
    allow!(l, SYS_pwrite64);
    allow!(l, SYS_preadv2);
    allow!(l, SYS_pwritev2);
    allow!(l, SYS_getxattr);
    allow!(l, SYS_setxattr);
    allow!(l, SYS_listxattr);
    allow!(l, SYS_removexattr);
    // Per-request credentials, per thread.
    allow!(l, SYS_setfsuid);
    allow!(l, SYS_setfsgid);
    allow!(l, SYS_setgroups);
    allow!(l, SYS_umask);
    allow!(l, SYS_unshare, arg32_eq(0, libc::CLONE_FS as u32));
    l
}

/// The allowlist for this architecture with the network access `net` (see the module
/// documentation): [`allowlist`], plus for [`Network::TcpClient`] the TCP client's calls.
pub fn allowlist_with(net: Network) -> Vec<Allowed> {
    let mut l = allowlist();
    if net == Network::None {
        return l;
    }
    if let Some(s) = l.iter_mut().find(|a| a.nr == libc::SYS_setsockopt) {
        s.rules.push(rule(vec![
            cond32(1, SeccompCmpOp::Eq, libc::IPPROTO_TCP as u32),
            cond32(2, SeccompCmpOp::Eq, libc::TCP_NODELAY as u32),
        ]));
        // The blocking UMNT call's read timeout.
        s.rules.push(rule(vec![
            cond32(1, SeccompCmpOp::Eq, libc::SOL_SOCKET as u32),
            cond32(2, SeccompCmpOp::Eq, libc::SO_RCVTIMEO as u32),
        ]));
    }
    let stream = |family: i32| {
        rule(vec![
            cond32(0, SeccompCmpOp::Eq, family as u32),
            // The type without SOCK_NONBLOCK and SOCK_CLOEXEC.
            cond32(1, SeccompCmpOp::MaskedEq(0xf), libc::SOCK_STREAM as u32),
        ])
    };
    allow!(l, SYS_socket, stream(libc::AF_INET), stream(libc::AF_INET6));
    allow!(l, SYS_connect);
    if let Some(g) = l.iter_mut().find(|a| a.nr == libc::SYS_getsockopt) {
        g.rules.push(rule(vec![
            cond32(1, SeccompCmpOp::Eq, libc::SOL_SOCKET as u32),
            cond32(2, SeccompCmpOp::Eq, libc::SO_ERROR as u32),
        ]));
    }
    allow!(l, SYS_getpeername);
    allow!(l, SYS_getsockname);
    allow!(l, SYS_readv);
    allow!(l, SYS_writev);
    // The blocking MOUNT UMNT when the daemon stops (std's connect with a timeout polls; ppoll
    // is on the base list).
    #[cfg(target_arch = "x86_64")]
    allow!(l, SYS_poll);
    l
}

/// The compiled filters (see [`filters`]).
pub struct Filters {
    /// Fails `clone3` with `ENOSYS`, allows everything else.
    pub clone3: BpfProgram,
    /// The allowlist; calls outside it get the mode's action.
    pub allow: BpfProgram,
}

impl Filters {
    /// Installs both on the calling thread only (`clone3` first: once the allowlist is in, the
    /// `prctl` and `seccomp` calls that install a filter are refused).
    pub fn apply_to_this_thread(&self) -> Result<(), SeccompError> {
        seccompiler::apply_filter(&self.clone3).map_err(SeccompError::Install)?;
        seccompiler::apply_filter(&self.allow).map_err(SeccompError::Install)
    }

    /// Installs both on every thread of the process (`SECCOMP_FILTER_FLAG_TSYNC`).
    pub fn apply_to_all_threads(&self) -> Result<(), SeccompError> {
        seccompiler::apply_filter_all_threads(&self.clone3).map_err(SeccompError::Install)?;
        seccompiler::apply_filter_all_threads(&self.allow).map_err(SeccompError::Install)
    }
}

/// The filters for `mode`: the allowlist (calls outside it get `mode`'s action) and one that
/// fails `clone3` with `ENOSYS` (see the module documentation). `None` for [`SeccompMode::Off`].
pub fn filters(mode: SeccompMode) -> Result<Option<Filters>, SeccompError> {
    filters_with(mode, Network::None)
}

/// [`filters`] over [`allowlist_with`]`(net)`.
pub fn filters_with(mode: SeccompMode, net: Network) -> Result<Option<Filters>, SeccompError> {
    let mismatch = match mode {
        SeccompMode::Kill => SeccompAction::KillProcess,
        SeccompMode::Trap => SeccompAction::Trap,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Off => return Ok(None),
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for a in allowlist_with(net) {
        rules.entry(a.nr).or_default().extend(a.rules);
    }
    let allow =
        SeccompFilter::new(rules, mismatch, SeccompAction::Allow, ARCH).map_err(SeccompError::Build)?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        ARCH,
    )
    .map_err(SeccompError::Build)?;
    Ok(Some(Filters {
        clone3: clone3.try_into().map_err(SeccompError::Build)?,
        allow: allow.try_into().map_err(SeccompError::Build)?,
    }))
}

/// Installs the filters for `mode` on every thread of the process (and so on every thread
/// started later); for [`SeccompMode::Trap`] first the `SIGSYS` reporter. Sets
/// `PR_SET_NO_NEW_PRIVS` (the kernel requires it for an unprivileged filter).
pub fn install(mode: SeccompMode) -> Result<(), SeccompError> {
    install_with(mode, Network::None)
}

/// [`install`] with the network access `net`.
pub fn install_with(mode: SeccompMode, net: Network) -> Result<(), SeccompError> {
    let Some(f) = filters_with(mode, net)? else {
        return Ok(());
    };
    if mode == SeccompMode::Trap {
        sys::install_sigsys_reporter().map_err(SeccompError::Signal)?;
    }
    f.apply_to_all_threads()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_has_no_duplicates_and_builds_in_every_mode() {
        let list = allowlist();
        let mut nrs: Vec<i64> = list.iter().map(|a| a.nr).collect();
        nrs.sort_unstable();
        nrs.dedup();
        assert_eq!(nrs.len(), list.len(), "a system call is listed twice");
        for mode in [SeccompMode::Kill, SeccompMode::Trap, SeccompMode::Log] {
            let f = filters(mode).unwrap().unwrap();
            assert!(!f.allow.is_empty() && !f.clone3.is_empty());
        }
        assert!(filters(SeccompMode::Off).unwrap().is_none());
        // Nothing that would undo the confinement or start something new.
        for name in [
            "SYS_mount",
            "SYS_umount2",
            "SYS_pivot_root",
            "SYS_chroot",
            "SYS_execve",
            "SYS_execveat",
            "SYS_ptrace",
            "SYS_socket",
            "SYS_connect",
            "SYS_open_by_handle_at",
            "SYS_setns",
            "SYS_kexec_load",
            "SYS_bpf",
            "SYS_seccomp",
        ] {
            assert!(list.iter().all(|a| a.name != name), "{name} is allowed");
        }
    }

    #[test]
    fn the_tcp_client_list_adds_sockets_and_still_forbids_the_rest() {
        let list = allowlist_with(Network::TcpClient);
        let mut nrs: Vec<i64> = list.iter().map(|a| a.nr).collect();
        nrs.sort_unstable();
        nrs.dedup();
        assert_eq!(nrs.len(), list.len(), "a system call is listed twice");
        for name in ["SYS_socket", "SYS_connect", "SYS_getsockopt", "SYS_readv", "SYS_writev"] {
            assert!(list.iter().any(|a| a.name == name), "{name} is not allowed");
        }
        let setsockopt = list.iter().find(|a| a.nr == libc::SYS_setsockopt).unwrap();
        assert_eq!(setsockopt.rules.len(), 3, "SO_SNDTIMEO, TCP_NODELAY and SO_RCVTIMEO");
        for name in
            ["SYS_mount", "SYS_bind", "SYS_listen", "SYS_execve", "SYS_ptrace", "SYS_setns", "SYS_seccomp"]
        {
            assert!(list.iter().all(|a| a.name != name), "{name} is allowed");
        }
        for mode in [SeccompMode::Kill, SeccompMode::Trap, SeccompMode::Log] {
            assert!(filters_with(mode, Network::TcpClient).unwrap().is_some());
        }
    }

    /// With the TCP client's list (in a forked child) a TCP connection can be tried (refused by
    /// the closed port: the calls went through) and a UDP socket kills the child with `SIGSYS`.
    #[test]
    fn tcp_client_filter_allows_stream_sockets_only() {
        let f = filters_with(SeccompMode::Kill, Network::TcpClient).unwrap().unwrap();
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (status, _) = sys::in_child(|| {
            if f.apply_to_this_thread().is_err() {
                return 90;
            }
            match std::net::TcpStream::connect(("127.0.0.1", port)) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => 0,
                _ => 91,
            }
        })
        .unwrap();
        assert!(libc::WIFEXITED(status), "a TCP connect killed the child: status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "the TCP connect was not refused by the closed port");
        let (status, _) = sys::in_child(|| {
            if f.apply_to_this_thread().is_err() {
                return 90;
            }
            i32::from(std::net::UdpSocket::bind("127.0.0.1:0").is_ok())
        })
        .unwrap();
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
            "UDP: status {status:#x}"
        );
    }

    // Under qemu-user (the aarch64 check) the emulator refuses to install seccomp filters, so
    // these two run only natively (tools/aarch64-check.sh skips them).

    /// In a forked child (the filter is per process): allowed calls work, `clone3` fails with
    /// ENOSYS, and a forbidden call (`socket`, `mount`, a process-creating `clone`, `unshare` of
    /// a namespace, executable memory) kills the child with `SIGSYS`.
    #[test]
    fn filter_kills_on_a_forbidden_call_and_lets_allowed_ones_through() {
        let f = filters(SeccompMode::Kill).unwrap().unwrap();
        let (status, _) = sys::in_child(|| {
            if f.apply_to_this_thread().is_err() {
                return 90;
            }
            sys::probe(sys::Probe::Allowed)
        })
        .unwrap();
        assert!(libc::WIFEXITED(status), "allowed calls killed the child: status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "an allowed call failed (see sys::probe)");
        for probe in [
            sys::Probe::Socket,
            sys::Probe::Mount,
            sys::Probe::Fork,
            sys::Probe::UnshareNs,
            sys::Probe::ExecMmap,
        ] {
            let (status, _) = sys::in_child(|| {
                if f.apply_to_this_thread().is_err() {
                    return 90;
                }
                sys::probe(probe)
            })
            .unwrap();
            assert!(
                libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
                "{probe:?}: child not killed by SIGSYS (status {status:#x})"
            );
        }
    }

    /// In trap mode the SIGSYS handler names the call before the process dies of the signal.
    #[test]
    fn trap_mode_reports_the_call_and_dies_of_sigsys() {
        let f = filters(SeccompMode::Trap).unwrap().unwrap();
        let (status, stderr) = sys::in_child(|| {
            if sys::install_sigsys_reporter().is_err() {
                return 91;
            }
            if f.apply_to_this_thread().is_err() {
                return 90;
            }
            sys::probe(sys::Probe::Socket)
        })
        .unwrap();
        assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS, "status {status:#x}");
        let report = String::from_utf8_lossy(&stderr);
        let expect = format!("system call {} is not in the allowlist", libc::SYS_socket);
        assert!(report.contains(&expect), "report: {report:?}");
    }
}
