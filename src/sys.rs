//! The root crate's system calls: every `unsafe` block of the daemon's own code lives here, each
//! with its `// SAFETY:` reason (the device's and the backend's are in their own `sys` modules).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Takes ownership of descriptor `fd`, inherited open from the process that started this one
/// (`--fd N`, systemd socket activation). Checks through `/proc/self/fd` that it is open, so
/// that no closed or reused number is adopted; the caller checks what kind of file it is.
///
/// Call it at most once per descriptor, at start-up: the returned `OwnedFd` must be its only
/// owner, which nothing else in the process can be before the call (no code of ours opened it,
/// and start-up has not handed it to anything).
pub fn adopt_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 3 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "0, 1 and 2 are stdin, stdout and stderr"));
    }
    // Open: its /proc entry exists (and `fcntl(F_GETFD)` agrees, for a /proc of another pid
    // namespace).
    std::fs::read_link(format!("/proc/self/fd/{fd}"))?;
    // SAFETY: `F_GETFD` on any integer reads the descriptor's flags and touches no memory.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is open (checked just above) and was inherited, not opened by this process:
    // no `File`, socket or other owner in this process holds it, and this function's contract
    // (once per descriptor, at start-up) keeps a second `OwnedFd` from being made, so the one
    // made here is its only owner and closes it exactly once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The soft and hard limits of open descriptors (`RLIMIT_NOFILE`).
pub fn nofile_limit() -> io::Result<(u64, u64)> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid, writable `rlimit` that the call fills.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((r.rlim_cur, r.rlim_max))
}

/// Sets the soft and hard limits of open descriptors (`RLIMIT_NOFILE`). Raising the hard limit
/// needs `CAP_SYS_RESOURCE`; neither can exceed `/proc/sys/fs/nr_open`.
pub fn set_nofile_limit(soft: u64, hard: u64) -> io::Result<()> {
    let r = libc::rlimit { rlim_cur: soft, rlim_max: hard };
    // SAFETY: `r` is a valid `rlimit` the call only reads.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The credentials of a unix socket's peer as the kernel recorded them when it connected
/// (`SO_PEERCRED`): its pid, effective uid and effective gid.
pub fn peer_credentials(fd: &impl std::os::fd::AsFd) -> io::Result<(i32, u32, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the descriptor is open (borrowed for the call); `cred` is a valid, writable
    // `ucred` of `len` bytes, which the kernel fills and `len` says how much of it it wrote.
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "SO_PEERCRED: short answer"));
    }
    Ok((cred.pid, cred.uid, cred.gid))
}

/// This process's effective uid.
pub fn effective_uid() -> u32 {
    // SAFETY: `geteuid` takes no arguments, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

/// Waits until `fd` is readable (or its peer hung up) for at most `timeout`: true if it is.
pub fn wait_readable(fd: &impl std::os::fd::AsFd, timeout: std::time::Duration) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd { fd: fd.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // `ppoll`, not `poll`: it is the one in the confined daemon's system-call allowlist (and
    // the one aarch64 has).
    let secs = libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX);
    let ts = libc::timespec { tv_sec: secs, tv_nsec: timeout.subsec_nanos().into() };
    loop {
        // SAFETY: `p` is one valid, writable `pollfd` and `ts` a valid timespec; the
        // descriptor is borrowed for the call; no signal mask is passed.
        let n = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether descriptor `fd` stays open in a program this process executes (clears or sets
/// `FD_CLOEXEC`): how the supervisor passes a serving process its descriptors.
pub fn set_inherited(fd: &impl std::os::fd::AsFd, inherited: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = fd.as_fd().as_raw_fd();
    // SAFETY: `F_GETFD` and `F_SETFD` on a borrowed, open descriptor read and set its flags;
    // no memory is touched.
    let r = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags < 0 {
            flags
        } else if inherited {
            libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC)
        } else {
            libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC)
        }
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends signal `sig` to process `pid` (a child of this process's).
pub fn signal_process(pid: u32, sig: i32) -> io::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: `kill` takes two integers and touches no memory of this process.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks the kernel to send this process `sig` when the thread that started it ends (its
/// supervisor: `PR_SET_PDEATHSIG`), then checks that the parent is still `parent`: a serving
/// process does not outlive its supervisor. False if the parent is gone already.
pub fn end_with_parent(parent: u32, sig: i32) -> io::Result<bool> {
    // SAFETY: `PR_SET_PDEATHSIG` takes a signal number and touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `getppid` takes no arguments and cannot fail.
    Ok(unsafe { libc::getppid() } as u32 == parent)
}

/// Grows this process's descriptor table at once to hold descriptor number `n` (if the limit
/// allows; otherwise nothing happens): taking many descriptors one by one would grow it by
/// doubling, and in a process of several threads each growth waits for an RCU grace period
/// (`expand_fdtable`), milliseconds each on a busy machine. The table never shrinks.
/// `any` is an open descriptor of this process (duplicated and closed again).
pub fn reserve_descriptors(any: &impl std::os::fd::AsFd, n: u32) {
    use std::os::fd::AsRawFd;
    let Ok(n) = libc::c_int::try_from(n) else { return };
    // SAFETY: F_DUPFD_CLOEXEC of a descriptor we borrow makes a new one at or above `n` (or
    // fails); it is closed at once and nothing else refers to it.
    let fd = unsafe { libc::fcntl(any.as_fd().as_raw_fd(), libc::F_DUPFD_CLOEXEC, n) };
    if fd < 0 {
        return;
    }
    // SAFETY: `fd` was just made by fcntl and is owned by nobody else.
    unsafe { libc::close(fd) };
}
