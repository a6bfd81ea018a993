//! The system calls of the passthrough filesystem, as small safe functions: every `unsafe` block of
//! the passthrough lives here (and in `uring.rs` for the ring), each with its `// SAFETY:` reason.
//!
//! Conventions: names are `&CStr` (the caller validated them as single path components), file
//! descriptors are borrowed (`BorrowedFd`) or returned owned (`OwnedFd`), failures are
//! `io::Error`s carrying the host errno. Nothing here follows a symlink unless the function says
//! so: the path-based calls given a `/proc/self/fd` entry ([`FdPath`]) resolve its magic link,
//! which lands on the very inode the descriptor holds (a symlink inode stays a symlink; it is
//! never followed further).

use std::ffi::{CStr, CString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The empty path, for `AT_EMPTY_PATH` calls on a descriptor itself.
pub const EMPTY: &CStr = c"";

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    let fd = check_long(fd)?;
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned `fd` as a new descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat2(dirfd, name, {flags | O_CLOEXEC, mode, resolve})`.
pub fn openat2(
    dirfd: BorrowedFd<'_>,
    name: &CStr,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    /// `struct open_how` (`linux/openat2.h`; libc's is non-exhaustive).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow { flags: (flags | libc::O_CLOEXEC) as u32 as u64, mode: u64::from(mode), resolve };
    // SAFETY: `name` is NUL-terminated, `how` is a valid `open_how` whose size we pass; the kernel
    // only reads both during the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd.as_raw_fd(),
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    owned(fd)
}

/// `openat(dirfd, name, flags | O_CLOEXEC, mode)`; used on the `/proc/self/fd` directory only.
pub fn openat(dirfd: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated and only read during the call.
    let fd = unsafe { libc::openat(dirfd.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    owned(libc::c_long::from(fd))
}

/// `open(path, flags | O_CLOEXEC)`, for the start-up opens of the shared directory and `/proc`.
pub fn open(path: &CStr, flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: `path` is NUL-terminated and only read during the call.
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
    owned(libc::c_long::from(fd))
}

/// `statx(dirfd, name, flags | AT_STATX_SYNC_AS_STAT, basic stats | btime | mount id)`.
pub fn statx(dirfd: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<libc::statx> {
    let mut buf = MaybeUninit::<libc::statx>::zeroed();
    let mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME | libc::STATX_MNT_ID;
    // SAFETY: `name` is NUL-terminated, `buf` is a writable `statx` the kernel fills.
    check(unsafe {
        libc::statx(
            dirfd.as_raw_fd(),
            name.as_ptr(),
            flags | libc::AT_STATX_SYNC_AS_STAT,
            mask,
            buf.as_mut_ptr(),
        )
    })?;
    // SAFETY: zero-initialised plain-old-data, filled by a successful statx.
    Ok(unsafe { buf.assume_init() })
}

/// The attributes of the inode `fd` refers to (never following a symlink).
pub fn fstatx(fd: BorrowedFd<'_>) -> io::Result<libc::statx> {
    statx(fd, EMPTY, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW)
}

/// `fstatfs(fd)` (works on `O_PATH` descriptors).
pub fn fstatfs(fd: BorrowedFd<'_>) -> io::Result<libc::statfs64> {
    let mut buf = MaybeUninit::<libc::statfs64>::zeroed();
    // SAFETY: `buf` is a writable `statfs64` the kernel fills.
    check(unsafe { libc::fstatfs64(fd.as_raw_fd(), buf.as_mut_ptr()) })?;
    // SAFETY: zero-initialised plain-old-data, filled by a successful fstatfs.
    Ok(unsafe { buf.assume_init() })
}

/// `mkdirat(dirfd, name, mode)`.
pub fn mkdirat(dirfd: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and only read during the call.
    check(unsafe { libc::mkdirat(dirfd.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

/// `mknodat(dirfd, name, mode, dev)`.
pub fn mknodat(dirfd: BorrowedFd<'_>, name: &CStr, mode: u32, dev: u64) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and only read during the call.
    check(unsafe { libc::mknodat(dirfd.as_raw_fd(), name.as_ptr(), mode, dev) }).map(drop)
}

/// `symlinkat(target, dirfd, name)`: the link's text is `target`, never resolved here.
pub fn symlinkat(target: &CStr, dirfd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated and only read during the call.
    check(unsafe { libc::symlinkat(target.as_ptr(), dirfd.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// `unlinkat(dirfd, name, flags)` (`AT_REMOVEDIR` for directories).
pub fn unlinkat(dirfd: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and only read during the call.
    check(unsafe { libc::unlinkat(dirfd.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `renameat2(olddir, oldname, newdir, newname, flags)`.
pub fn renameat2(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated and only read during the call.
    check(unsafe {
        libc::renameat2(olddir.as_raw_fd(), oldname.as_ptr(), newdir.as_raw_fd(), newname.as_ptr(), flags)
    })
    .map(drop)
}

/// `linkat(olddir, oldname, newdir, newname, flags)`.
pub fn linkat(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
    flags: i32,
) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated and only read during the call.
    check(unsafe {
        libc::linkat(olddir.as_raw_fd(), oldname.as_ptr(), newdir.as_raw_fd(), newname.as_ptr(), flags)
    })
    .map(drop)
}

/// The text of the symlink `fd` refers to (`readlinkat(fd, "")`).
pub fn readlink_fd(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` is writable for its length, which we pass; the path is the empty string.
    let n = check_size(unsafe {
        libc::readlinkat(fd.as_raw_fd(), EMPTY.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)` (`u32::MAX` leaves one alone).
pub fn fchown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: the path is the empty string; nothing is written.
    check(unsafe { libc::fchownat(fd.as_raw_fd(), EMPTY.as_ptr(), uid, gid, flags) }).map(drop)
}

/// `fchmodat(dirfd, name, mode, 0)`; used with the `/proc/self/fd` directory.
pub fn fchmodat(dirfd: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and only read during the call.
    check(unsafe { libc::fchmodat(dirfd.as_raw_fd(), name.as_ptr(), mode, 0) }).map(drop)
}

/// `fchmod(fd, mode)` on an open (not `O_PATH`) descriptor.
pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: plain system call on a borrowed descriptor.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }).map(drop)
}

/// `utimensat(dirfd, name, times, flags)`.
pub fn utimensat(
    dirfd: BorrowedFd<'_>,
    name: &CStr,
    times: &[libc::timespec; 2],
    flags: i32,
) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and `times` two valid timespecs; both only read.
    check(unsafe { libc::utimensat(dirfd.as_raw_fd(), name.as_ptr(), times.as_ptr(), flags) }).map(drop)
}

/// `truncate(path, len)`; `path` is a `/proc/self/fd` entry relative to the working directory.
pub fn truncate(path: &CStr, len: u64) -> io::Result<()> {
    let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: `path` is NUL-terminated and only read during the call.
    check(unsafe { libc::truncate64(path.as_ptr(), len) }).map(drop)
}

/// `ftruncate(fd, len)`.
pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: plain system call on a borrowed descriptor.
    check(unsafe { libc::ftruncate64(fd.as_raw_fd(), len) }).map(drop)
}

/// `fsync(fd)`, or `fdatasync(fd)` when `datasync`.
pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> io::Result<()> {
    // SAFETY: plain system calls on a borrowed descriptor.
    check(unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })
    .map(drop)
}

/// `syncfs(fd)`.
pub fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain system call on a borrowed descriptor.
    check(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}

/// `fallocate(fd, mode, offset, len)`.
pub fn fallocate(fd: BorrowedFd<'_>, mode: u32, offset: u64, len: u64) -> io::Result<()> {
    let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: plain system call on a borrowed descriptor.
    check(unsafe { libc::fallocate64(fd.as_raw_fd(), mode as i32, off, len) }).map(drop)
}

/// `lseek(fd, offset, whence)`; returns the new offset.
pub fn lseek(fd: BorrowedFd<'_>, offset: u64, whence: u32) -> io::Result<u64> {
    let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: plain system call on a borrowed descriptor.
    let r = unsafe { libc::lseek64(fd.as_raw_fd(), off, whence as i32) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as u64)
    }
}

/// `copy_file_range(fd_in, &off_in, fd_out, &off_out, len, 0)`; returns the bytes copied.
pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    off_in: u64,
    fd_out: BorrowedFd<'_>,
    off_out: u64,
    len: usize,
) -> io::Result<usize> {
    let mut off_in = i64::try_from(off_in).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut off_out = i64::try_from(off_out).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: the offsets are valid `loff_t`s the kernel updates; no buffer is involved.
    check_size(unsafe {
        libc::copy_file_range(fd_in.as_raw_fd(), &mut off_in, fd_out.as_raw_fd(), &mut off_out, len, 0)
    })
}

/// `getdents64(fd, buf)`; returns the bytes of `linux_dirent64` records written to `buf`.
pub fn getdents64(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its length, which we pass.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
    Ok(check_long(n)? as usize)
}

/// `faccessat2(fd, "", mode, AT_EMPTY_PATH | AT_EACCESS)`: checked with the thread's filesystem
/// ids, not the real ones.
pub fn faccess_fd(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_EACCESS;
    // SAFETY: the path is the empty string; nothing is written.
    let r = unsafe { libc::syscall(libc::SYS_faccessat2, fd.as_raw_fd(), EMPTY.as_ptr(), mode, flags) };
    check_long(r).map(drop)
}

/// `getxattr(path, name, buf)`; with an empty `buf`, the size of the value.
pub fn getxattr(path: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the strings are NUL-terminated; `buf` is writable for its length, which we pass
    // (a null pointer with length 0 asks for the size only).
    check_size(unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf_ptr(buf), buf.len()) })
}

/// `listxattr(path, buf)`; with an empty `buf`, the size of the list.
pub fn listxattr(path: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `path` is NUL-terminated; `buf` is writable for its length, which we pass.
    check_size(unsafe { libc::listxattr(path.as_ptr(), buf_ptr(buf).cast(), buf.len()) })
}

/// `setxattr(path, name, value, flags)`.
pub fn setxattr(path: &CStr, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    // SAFETY: the strings are NUL-terminated; `value` is readable for its length.
    check(unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), flags) })
        .map(drop)
}

/// `removexattr(path, name)`.
pub fn removexattr(path: &CStr, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated and only read.
    check(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

fn buf_ptr(buf: &mut [u8]) -> *mut libc::c_void {
    if buf.is_empty() {
        std::ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    }
}

/// Sets the calling thread's filesystem user id; returns the previous one. (The raw system call
/// changes this thread only.) `u32::MAX` changes nothing and reads the current value.
pub fn setfsuid(uid: u32) -> u32 {
    // SAFETY: no memory is involved; the kernel validates the id.
    unsafe { libc::syscall(libc::SYS_setfsuid, uid) as u32 }
}

/// Sets the calling thread's filesystem group id; returns the previous one (see [`setfsuid`]).
pub fn setfsgid(gid: u32) -> u32 {
    // SAFETY: no memory is involved; the kernel validates the id.
    unsafe { libc::syscall(libc::SYS_setfsgid, gid) as u32 }
}

/// Sets the calling thread's supplementary groups (the raw call: this thread only).
pub fn set_thread_groups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: `groups` is readable for the length we pass.
    check_long(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) }).map(drop)
}

/// Gives the calling thread its own root, working directory and umask (`unshare(CLONE_FS)`).
pub fn unshare_fs() -> io::Result<()> {
    // SAFETY: no memory is involved.
    check(unsafe { libc::unshare(libc::CLONE_FS) }).map(drop)
}

/// Sets the umask of the calling thread's filesystem context; returns the previous one.
pub fn umask(mask: u32) -> u32 {
    // SAFETY: no memory is involved.
    unsafe { libc::umask(mask & 0o777) }
}

/// `prctl(PR_SET_NO_NEW_PRIVS, 1)`.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: no memory is involved.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(drop)
}

/// Removes capability `cap` from the bounding set (`PR_CAPBSET_DROP`); `EINVAL` for a capability
/// the kernel does not know.
pub fn capbset_drop(cap: u32) -> io::Result<()> {
    // SAFETY: no memory is involved.
    check(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) }).map(drop)
}

/// Sets the calling thread's effective, permitted and inheritable capability sets (64-bit masks;
/// `capset(2)` version 3). Threads started afterwards inherit them.
pub fn capset(effective: u64, permitted: u64, inheritable: u64) -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let hdr = Header { version: VERSION_3, pid: 0 };
    let split = |m: u64| (m as u32, (m >> 32) as u32);
    let (e0, e1) = split(effective);
    let (p0, p1) = split(permitted);
    let (i0, i1) = split(inheritable);
    let data = [
        Data { effective: e0, permitted: p0, inheritable: i0 },
        Data { effective: e1, permitted: p1, inheritable: i1 },
    ];
    // SAFETY: `hdr` and `data` are the version-3 structures the call reads (two data elements).
    check_long(unsafe { libc::syscall(libc::SYS_capset, &hdr as *const Header, data.as_ptr()) }).map(drop)
}

/// `unshare(flags)`: the calling thread leaves the namespaces (or shared contexts) `flags` name.
pub fn unshare(flags: i32) -> io::Result<()> {
    // SAFETY: no memory is involved.
    check(unsafe { libc::unshare(flags) }).map(drop)
}

fn opt_ptr(s: Option<&CStr>) -> *const libc::c_char {
    s.map_or(std::ptr::null(), CStr::as_ptr)
}

/// `mount(source, target, fstype, flags, data)`; `None` passes a null pointer.
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    // SAFETY: every pointer is null or a NUL-terminated string only read during the call
    // (`data` is a mount option string for the filesystems we mount).
    check(unsafe {
        libc::mount(opt_ptr(source), target.as_ptr(), opt_ptr(fstype), flags, opt_ptr(data).cast())
    })
    .map(drop)
}

/// `umount2(target, flags)`.
pub fn umount2(target: &CStr, flags: i32) -> io::Result<()> {
    // SAFETY: `target` is NUL-terminated and only read during the call.
    check(unsafe { libc::umount2(target.as_ptr(), flags) }).map(drop)
}

/// `pivot_root(new_root, put_old)`.
pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated and only read during the call.
    check_long(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) }).map(drop)
}

/// `fchdir(fd)`: the calling thread's filesystem context (the process's, unless the thread
/// unshared it) gets `fd` as its working directory.
pub fn fchdir(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain system call on a borrowed descriptor.
    check(unsafe { libc::fchdir(fd.as_raw_fd()) }).map(drop)
}

/// The calling process's effective user id.
pub fn geteuid() -> u32 {
    // SAFETY: no preconditions, no memory involved.
    unsafe { libc::geteuid() }
}

/// `SIGSYS` handler for a seccomp filter that traps: writes one line naming the refused system
/// call to standard error, then has the signal kill the process (`SA_RESETHAND` restored the
/// default action; the `SIGSYS` raised here is blocked until the handler returns, then delivered).
/// Only async-signal-safe work: formatting into a stack buffer, `write(2)`, `raise(3)`.
extern "C" fn sigsys_handler(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    /// The `SIGSYS` part of `siginfo_t` (`_sigsys` in the kernel's union; libc does not name it).
    #[repr(C)]
    struct SigsysInfo {
        signo: i32,
        errno: i32,
        code: i32,
        _pad: i32,
        call_addr: *mut libc::c_void,
        syscall: i32,
        arch: u32,
    }
    let nr = if info.is_null() {
        -1
    } else {
        // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler; for a seccomp
        // SIGSYS its union holds `_sigsys`, laid out as `SigsysInfo` on 64-bit Linux.
        unsafe { (*info.cast::<SigsysInfo>()).syscall }
    };
    let mut buf = [0u8; 160];
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        let n = bytes.len().min(buf.len() - len);
        buf[len..len + n].copy_from_slice(&bytes[..n]);
        len += n;
    };
    put(b"virtiofs-dpu: seccomp: system call ");
    let mut digits = [0u8; 12];
    let mut i = digits.len();
    let mut v = nr.unsigned_abs();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if nr < 0 {
        put(b"-");
    }
    put(&digits[i..]);
    put(b" is not in the allowlist (--seccomp=log runs on and logs each one)\n");
    // SAFETY: `buf` is readable for `len` bytes; write(2) and raise(3) are async-signal-safe.
    unsafe {
        let _ = libc::write(2, buf.as_ptr().cast(), len);
        libc::raise(libc::SIGSYS);
    }
}

/// Installs the `SIGSYS` handler that reports a call a trapping seccomp filter refused: one line
/// naming the call on standard error, then death by the signal (once: `SA_RESETHAND`).
pub fn install_sigsys_reporter() -> io::Result<()> {
    // SAFETY: zeroed `sigaction` is a valid "no flags, empty mask" value we then fill in.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = sigsys_handler;
    sa.sa_sigaction = handler as libc::sighandler_t;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND;
    // SAFETY: `sa` is a valid sigaction whose handler only does async-signal-safe work; the old
    // action is not wanted (null).
    check(unsafe { libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) }).map(drop)
}

/// Runs `child` in a forked child process whose standard error goes to a pipe; returns its wait
/// status and what it wrote there. For tests of process-wide state (a seccomp filter) that must
/// not touch the test process: `child` may only make system calls (no allocation, no locks: other
/// threads of the parent may have held them at the fork) and its return value is the child's
/// exit status.
#[cfg(test)]
pub fn in_child(child: impl FnOnce() -> i32) -> io::Result<(i32, Vec<u8>)> {
    use std::io::Read;
    let mut fds = [0; 2];
    // SAFETY: `fds` is a writable array of two ints.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: the kernel just returned both descriptors; nobody else owns them.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child runs only `child`, which by contract makes plain system calls, then
    // leaves with `_exit` (no destructors, no atexit handlers).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: plain system calls on descriptors this process holds; then `_exit` ends it.
        unsafe {
            libc::dup2(wr.as_raw_fd(), 2);
            libc::_exit(child());
        }
    }
    drop(wr);
    let mut out = Vec::new();
    let _ = std::fs::File::from(rd).read_to_end(&mut out);
    let mut status = 0;
    loop {
        // SAFETY: `status` is a writable int; `pid` is our child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok((status, out));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What [`probe`] tries, in a child under a seccomp filter.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
pub enum Probe {
    /// Calls the daemon makes (`getpid`, `openat`, `close`, `unshare(CLONE_FS)`), and `clone3`,
    /// which must fail with `ENOSYS`. Returns 0 if all behaved.
    Allowed,
    /// `socket(AF_INET, SOCK_STREAM)`.
    Socket,
    /// `mount` of a tmpfs on a path that does not exist (harmless should the filter fail).
    Mount,
    /// `clone(SIGCHLD)`: a new process.
    Fork,
    /// `unshare(CLONE_NEWNS)`.
    UnshareNs,
    /// An executable anonymous mapping.
    ExecMmap,
}

/// Makes the calls `p` names (see [`Probe`]); returns an exit status for [`in_child`]: 0 when
/// everything went as the filter should let it (or 1 when a forbidden call returned).
#[cfg(test)]
pub fn probe(p: Probe) -> i32 {
    // SAFETY: plain system calls with valid (or deliberately null, where the filter must decide
    // before the kernel reads anything) arguments; a `clone` that succeeds is left at once.
    unsafe {
        match p {
            Probe::Allowed => {
                if libc::getpid() <= 0 {
                    return 2;
                }
                let fd = libc::openat(libc::AT_FDCWD, c"/".as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                if fd < 0 || libc::close(fd) != 0 {
                    return 3;
                }
                if libc::unshare(libc::CLONE_FS) != 0 {
                    return 4;
                }
                let r = libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize);
                if r != -1 || *libc::__errno_location() != libc::ENOSYS {
                    return 5;
                }
                0
            }
            Probe::Socket => {
                libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                1
            }
            Probe::Mount => {
                let target = c"/nonexistent-virtiofs-dpu-seccomp-probe";
                libc::mount(c"none".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null());
                1
            }
            Probe::Fork => {
                let r = libc::syscall(
                    libc::SYS_clone,
                    libc::SIGCHLD as libc::c_ulong,
                    0usize,
                    0usize,
                    0usize,
                    0usize,
                );
                if r == 0 {
                    libc::_exit(0);
                }
                1
            }
            Probe::UnshareNs => {
                libc::unshare(libc::CLONE_NEWNS);
                1
            }
            Probe::ExecMmap => {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_EXEC,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                1
            }
        }
    }
}

/// Raises the soft limit on open files to the hard limit; returns the new limit.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = MaybeUninit::<libc::rlimit64>::zeroed();
    // SAFETY: `lim` is a writable rlimit64 the kernel fills.
    check(unsafe { libc::getrlimit64(libc::RLIMIT_NOFILE, lim.as_mut_ptr()) })?;
    // SAFETY: zero-initialised plain-old-data, filled by a successful getrlimit.
    let mut lim = unsafe { lim.assume_init() };
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit64, only read.
        check(unsafe { libc::setrlimit64(libc::RLIMIT_NOFILE, &lim) })?;
    }
    Ok(lim.rlim_cur)
}

/// A NUL-terminated decimal file descriptor number, the name of its entry in `/proc/self/fd`,
/// without allocating. Path-based calls use it relative to a `/proc/self/fd` directory descriptor
/// (`*at`) or to a working directory set to it (see `creds::enter_dir`): a sandboxed daemon has
/// no `/proc` in its root.
pub struct FdPath {
    buf: [u8; 16],
    len: usize,
}

impl FdPath {
    /// The `/proc/self/fd` entry of `fd`.
    pub fn new(fd: BorrowedFd<'_>) -> Self {
        let mut buf = [0u8; 16];
        let mut digits = [0u8; 12];
        let mut n = fd.as_raw_fd().unsigned_abs();
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let d = &digits[i..];
        buf[..d.len()].copy_from_slice(d);
        // buf[d.len()] is already the NUL.
        FdPath { buf, len: d.len() + 1 }
    }

    /// `N`, relative to the `/proc/self/fd` directory.
    pub fn name(&self) -> &CStr {
        CStr::from_bytes_with_nul(&self.buf[..self.len]).unwrap_or(EMPTY)
    }
}

/// A bytes-to-`CString` conversion for symlink targets and xattr names (`EINVAL` on a NUL).
pub fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn fd_path_formats_the_number() {
        let f = std::fs::File::open("/").unwrap();
        let p = FdPath::new(f.as_fd());
        let n = f.as_raw_fd().to_string();
        assert_eq!(p.name().to_bytes(), n.as_bytes());
    }
}
