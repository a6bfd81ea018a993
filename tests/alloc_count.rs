//! Zero heap allocations per request in steady state, on the device's poller threads.
//!
//! A counting global allocator counts allocations made on threads that have marked themselves as
//! pollers; a wrapper handler marks the poller thread when it creates the poller's engine (the
//! path every request then takes, as in the daemon) or on its first synchronous request. After a
//! warm-up, a few thousand 4 KiB reads and writes (and getattrs) must allocate nothing on the
//! poller, on split and on packed virtqueues (one test for both: the counter is process-wide).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtiofs_backend::RamFs;
use virtiofs_device::poller::{Engine, RequestHandler};
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::{FuseHandler, RunningDevice};
use virtiofs_tools::virtqueue::RingLayout;
use virtiofs_tools::{DriverOptions, FsDriver};
use vm_memory::VolatileSlice;

struct Counting;

static POLLER_ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static IS_POLLER: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if IS_POLLER.try_with(|p| p.get()).unwrap_or(false) {
        POLLER_ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to the system allocator unchanged; counting touches only an
// atomic and a const-initialised thread-local, neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded with the caller's layout, which satisfies System's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by System with `layout` (every allocation goes through us).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as for alloc.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: `ptr`/`layout` come from a previous System allocation; new_size is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

struct Marking(FuseHandler<RamFs>);

impl RequestHandler for Marking {
    fn handle(&self, queue: u16, readable: &[VolatileSlice<'_>], writable: &[VolatileSlice<'_>]) -> u32 {
        IS_POLLER.with(|p| p.set(true));
        self.0.handle(queue, readable, writable)
    }

    /// Called on the poller's thread when it starts: requests then go through the engine (the
    /// daemon's path), which the marking covers from here on.
    fn engine(&self, poller: usize) -> Option<Box<dyn Engine>> {
        IS_POLLER.with(|p| p.set(true));
        self.0.engine(poller)
    }
}

#[test]
fn steady_state_requests_do_not_allocate_on_the_poller() {
    for ring in RingLayout::ALL {
        steady_state(ring);
    }
}

fn steady_state(ring: RingLayout) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("alloc.sock");
    let handler = Arc::new(Marking(FuseHandler::new(RamFs::new())));
    let dev = RunningDevice::start_with(&sock, Profile::default(), handler).unwrap();
    let mut d = FsDriver::connect(&sock, DriverOptions { ring, ..Default::default() }).unwrap();
    d.init().unwrap();
    let (file, open) = d.create(1, "f", 0o644, libc::O_RDWR as u32).unwrap();
    let block = vec![0x5au8; 4096];
    let round = |d: &mut FsDriver, i: u64| {
        let off = (i * 4096) % (1 << 20);
        d.write(file.nodeid, open.fh, off, &block).unwrap();
        assert_eq!(d.read(file.nodeid, open.fh, off, 4096).unwrap().len(), 4096);
        d.getattr(file.nodeid).unwrap();
    };
    // Warm-up: file data chunks, handle tables and the poller's own state reach steady size.
    let start = POLLER_ALLOCS.load(Ordering::Relaxed);
    for i in 0..512 {
        round(&mut d, i);
    }
    let before = POLLER_ALLOCS.load(Ordering::Relaxed);
    // The file's data chunks were allocated on the poller during warm-up: the hook works.
    assert!(before > start, "no poller allocation seen during warm-up: the counting hook is broken");
    assert_eq!(d.facts().ring, ring);
    let n = 3000;
    for i in 0..n {
        round(&mut d, i);
    }
    let allocs = POLLER_ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(allocs, 0, "{ring}: {allocs} heap allocations on the poller for {} requests", 3 * n);
    d.shutdown().unwrap();
    dev.stop().unwrap();
}
