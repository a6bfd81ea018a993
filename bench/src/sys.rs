//! The benchmark's own system calls: the scheduling policy of the calling thread.

use std::io;

/// Puts the calling thread under `SCHED_FIFO` at `priority` (1-99; needs `CAP_SYS_NICE`), or
/// back under `SCHED_OTHER` with `None`.
pub fn set_realtime(priority: Option<i32>) -> io::Result<()> {
    let (policy, prio) = match priority {
        Some(p) => (libc::SCHED_FIFO, p),
        None => (libc::SCHED_OTHER, 0),
    };
    let param = libc::sched_param { sched_priority: prio };
    // SAFETY: `param` is a valid sched_param for the duration of the call; pid 0 is the calling
    // thread, whose policy alone changes.
    let r = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
