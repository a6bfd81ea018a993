//! Running one operation with the caller's identity, on the calling thread only.
//!
//! [`Guard::enter`] switches the thread's filesystem uid and gid (raw `setfsuid`/`setfsgid`: per
//! thread, unlike glibc's set*id wrappers, which change every thread of the process) and switches
//! them back when dropped. While the filesystem uid is not 0 the kernel also masks the filesystem
//! capabilities (`CAP_DAC_OVERRIDE`, `CAP_FOWNER`, `CAP_CHOWN`, `CAP_FSETID`, `CAP_MKNOD`, ...) out
//! of the thread's effective set, so the host kernel's permission checks are those of the caller.
//!
//! The caller's supplementary group, when the request carries one (`FUSE_CREATE_SUPP_GROUP`: the
//! kernel names the parent directory's group on a creation when the caller is a member through a
//! supplementary group), becomes the thread's only supplementary group for the operation (raw
//! `setgroups`: this thread only; glibc's `setgroups` would change every thread), so the host
//! grants what group membership grants the caller.
//!
//! The first use on a thread also prepares it: no supplementary groups (the daemon's own, root's
//! group 0 say, must not lend a guest user their access), and a filesystem context of its own
//! (`unshare(CLONE_FS)`) so that [`set_umask`] and [`enter_dir`] apply to this thread only.

use std::cell::Cell;
use std::io;
use std::os::fd::BorrowedFd;

use super::sys;

#[derive(Clone, Copy)]
struct ThreadState {
    /// `Some` once the thread is prepared: the ids it rests at between operations.
    rest: Option<(u32, u32)>,
    /// The thread may set its supplementary groups (the daemon has `CAP_SETGID`).
    groups: bool,
    /// The umask last set on this thread's private filesystem context.
    umask: u32,
    /// [`enter_dir`] set the working directory.
    in_dir: bool,
}

thread_local! {
    static STATE: Cell<ThreadState> =
        const { Cell::new(ThreadState { rest: None, groups: false, umask: u32::MAX, in_dir: false }) };
}

fn prepare() -> io::Result<ThreadState> {
    let st = STATE.with(Cell::get);
    if st.rest.is_some() {
        return Ok(st);
    }
    sys::unshare_fs()?;
    sys::umask(0);
    // Only root (or CAP_SETGID) may change groups; an unprivileged daemon keeps its own, which
    // are then all the access any caller can get anyway.
    let groups = match sys::set_thread_groups(&[]) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => false,
        Err(e) => return Err(e),
    };
    let rest = (sys::setfsuid(u32::MAX), sys::setfsgid(u32::MAX));
    let st = ThreadState { rest: Some(rest), groups, umask: 0, in_dir: false };
    STATE.with(|s| s.set(st));
    Ok(st)
}

/// The caller's identity on this thread until dropped.
#[must_use = "the identity lasts as long as the guard"]
pub struct Guard {
    switched: bool,
    /// A supplementary group was set (and is cleared on drop).
    grouped: bool,
    rest: (u32, u32),
}

impl Guard {
    /// Switches the calling thread's filesystem ids to `uid`/`gid`, and its supplementary groups
    /// to `supp_gid` alone if given. Fails with `EPERM` when the daemon may not take that
    /// identity (it lacks `CAP_SETUID`/`CAP_SETGID`). An unprivileged daemon ignores `supp_gid`
    /// (its own groups stay; see the module documentation).
    pub fn enter(uid: u32, gid: u32, supp_gid: Option<u32>) -> io::Result<Guard> {
        let st = prepare()?;
        let rest = st.rest.unwrap_or((uid, gid));
        let mut guard = Guard { switched: false, grouped: false, rest };
        if let Some(g) = supp_gid.filter(|&g| st.groups && g != gid) {
            sys::set_thread_groups(&[g])?;
            guard.grouped = true;
        }
        if (uid, gid) == rest {
            return Ok(guard);
        }
        // Group first: changing it needs CAP_SETGID, which is not a filesystem capability, but
        // this order is the conventional one and never needs privileges we just gave up.
        sys::setfsgid(gid);
        sys::setfsuid(uid);
        guard.switched = true;
        if sys::setfsgid(u32::MAX) != gid || sys::setfsuid(u32::MAX) != uid {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        Ok(guard)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.switched {
            sys::setfsuid(self.rest.0);
            sys::setfsgid(self.rest.1);
        }
        if self.grouped {
            if let Err(e) = sys::set_thread_groups(&[]) {
                // Cannot happen with CAP_SETGID (checked when the thread was prepared); a thread
                // left with a group would lend it to later callers, so do not go on.
                log::error!("passthrough: cannot clear the supplementary group: {e}");
                std::process::abort();
            }
        }
    }
}

/// Makes `dir` the calling thread's working directory, once per thread (later calls do nothing):
/// the passthrough names `/proc/self/fd` entries relative to it in path-based calls (xattrs,
/// truncate). The thread has its own filesystem context (see the module documentation), so
/// nothing else changes directory.
pub fn enter_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    let st = prepare()?;
    if !st.in_dir {
        sys::fchdir(dir)?;
        STATE.with(|s| s.set(ThreadState { in_dir: true, ..st }));
    }
    Ok(())
}

/// Sets the umask the host kernel applies to the calling thread's next creations (the thread
/// has its own filesystem context, see the module documentation).
pub fn set_umask(mask: u32) -> io::Result<()> {
    prepare()?;
    let mask = mask & 0o777;
    if STATE.with(Cell::get).umask != mask {
        sys::umask(mask);
        STATE.with(|s| {
            let mut st = s.get();
            st.umask = mask;
            s.set(st);
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_switches_and_restores_this_thread_only() {
        use std::sync::mpsc::channel;
        let me = sys::setfsuid(u32::MAX);
        let (switched_tx, switched_rx) = channel();
        let (checked_tx, checked_rx) = channel::<()>();
        // The switch happens on a thread of its own; this (harness) thread watches its own ids.
        let worker = std::thread::spawn(move || {
            let (uid, gid) = prepare().unwrap().rest.unwrap();
            if uid != 0 {
                switched_tx.send(false).unwrap();
                return; // unprivileged test run: nothing to switch to
            }
            {
                let _g = Guard::enter(1234, 5678, None).unwrap();
                assert_eq!(sys::setfsuid(u32::MAX), 1234);
                assert_eq!(sys::setfsgid(u32::MAX), 5678);
                switched_tx.send(true).unwrap();
                checked_rx.recv().unwrap();
            }
            assert_eq!(sys::setfsuid(u32::MAX), uid);
            assert_eq!(sys::setfsgid(u32::MAX), gid);
        });
        if switched_rx.recv().unwrap() {
            assert_eq!(sys::setfsuid(u32::MAX), me, "another thread keeps its ids");
            checked_tx.send(()).unwrap();
        }
        worker.join().unwrap();
    }
}
