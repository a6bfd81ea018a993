//! The system calls of the interrupt watchdog: its signal's handler, and interrupting a thread.

use std::io;

/// The signal that ends a stuck eventfd write: a real-time one the daemon uses for nothing else.
fn interrupting_signal() -> libc::c_int {
    libc::SIGRTMIN() + 5
}

extern "C" fn do_nothing(_: libc::c_int) {}

/// Installs a handler that does nothing for the interrupting signal, without `SA_RESTART`: a
/// system call the signal arrives in fails `EINTR` instead of being restarted.
pub(super) fn install_interrupting_handler() -> io::Result<()> {
    // SAFETY: a zeroed `sigaction` is a valid empty one; the handler is an `extern "C"` function
    // that touches nothing (async-signal-safe); `sa_mask` is initialised by `sigemptyset`.
    let r = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = do_nothing as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0;
        libc::sigaction(interrupting_signal(), &sa, std::ptr::null_mut())
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's kernel id.
pub(super) fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// Sends the interrupting signal to thread `tid` of this process (a thread that has exited is
/// `ESRCH`, which is ignored: there is nothing left to interrupt).
pub(super) fn interrupt_thread(tid: i32) {
    // SAFETY: tgkill takes plain integers; a stale `tid` of this process at worst interrupts a
    // system call of another of our threads, which sees EINTR.
    unsafe {
        libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, interrupting_signal());
    }
}
