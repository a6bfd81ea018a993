//! Named points where the serving process kills itself with SIGKILL when a test asks it to
//! (issue 24: crash recovery is tested at chosen points, not only where a kill from outside
//! happens to land).
//!
//! The daemon arms them once at start from `VIRTIOFS_DPU_CRASH_AT=POINT:N` ([`arm_from_env`];
//! only the first serving process does, never one that recovers or takes over, so a recovery
//! does not crash again): the N-th time POINT is reached, the process sends itself SIGKILL.
//! Unarmed (the normal case), reaching a point is a load of a value set once and a branch, per
//! queue with returns or needing an interrupt in a poller round (once per round for an
//! engine's completions) and per DMA_MAP message: never per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable that arms a point.
pub const CRASH_AT: &str = "VIRTIOFS_DPU_CRASH_AT";

/// Where the process can be made to die.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// A poller wrote a round's returns (used entries, the in-flight record's `pushed`) and
    /// has not published them (`returned`).
    Returned,
    /// A poller published returns and has not signalled the queue's interrupt (`published`).
    Published,
    /// The vfio-user server read a DMA_MAP message and has neither handled nor answered it
    /// (`dma-map`).
    DmaMapRead,
}

impl CrashPoint {
    fn parse(name: &str) -> Option<CrashPoint> {
        match name {
            "returned" => Some(CrashPoint::Returned),
            "published" => Some(CrashPoint::Published),
            "dma-map" => Some(CrashPoint::DmaMapRead),
            _ => None,
        }
    }
}

struct Armed {
    point: CrashPoint,
    /// Reaches left before the kill.
    left: AtomicU64,
}

static ARMED: OnceLock<Option<Armed>> = OnceLock::new();

/// Arms the point `VIRTIOFS_DPU_CRASH_AT` names (`POINT` or `POINT:N`, N >= 1, default 1), if
/// set; a value that names no point is an error (a test that thinks it crashes at a point must
/// not silently run without). Call once, before the pollers start; later calls do nothing.
pub fn arm_from_env() -> Result<Option<CrashPoint>, String> {
    let Ok(v) = std::env::var(CRASH_AT) else {
        let _ = ARMED.set(None);
        return Ok(None);
    };
    let (name, n) = match v.split_once(':') {
        Some((name, n)) => (name, n.parse::<u64>().ok().filter(|&n| n > 0)),
        None => (v.as_str(), Some(1)),
    };
    let (Some(point), Some(n)) = (CrashPoint::parse(name), n) else {
        return Err(format!("{CRASH_AT}={v}: expected returned, published or dma-map, then :N (N >= 1)"));
    };
    let _ = ARMED.set(Some(Armed { point, left: AtomicU64::new(n) }));
    Ok(Some(point))
}

/// The process reached `point`: if that point is armed and this is its N-th reach, it dies
/// here with SIGKILL.
#[inline]
pub fn reached(point: CrashPoint) {
    let Some(Some(a)) = ARMED.get() else { return };
    if a.point != point {
        return;
    }
    if a.left.fetch_sub(1, Ordering::AcqRel) == 1 {
        log::warn!("{CRASH_AT}: killing this process at {point:?}");
        // SAFETY: a plain system call on this process's own id; it does not return.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}
