//! Zero heap allocations per request in steady state, on the device's poller threads.
//!
//! A counting global allocator (the backend tests' `harness/counting.rs`) counts allocations made
//! on threads that have marked themselves as pollers; a wrapper handler marks the poller thread
//! when it creates the poller's engine (the path every request then takes, as in the daemon) or
//! on its first synchronous request. After a
//! warm-up, a few thousand 4 KiB reads and writes (and getattrs) must allocate nothing on the
//! poller, on split and on packed virtqueues (one test for both: the counter is process-wide).

use std::sync::Arc;

use virtiofs_backend::RamFs;
use virtiofs_device::poller::{Engine, RequestHandler, Taken};
use virtiofs_device::stats::Tally;
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::{FuseHandler, RunningDevice};
use virtiofs_tools::virtqueue::RingLayout;
use virtiofs_tools::{DriverOptions, FsDriver};
use vm_memory::VolatileSlice;

#[path = "../backend/tests/harness/counting.rs"]
mod counting;

struct Marking(FuseHandler<RamFs>);

impl RequestHandler for Marking {
    fn handle(
        &self,
        taken: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally) {
        counting::count_here(true);
        self.0.handle(taken, readable, writable)
    }

    /// Called on the poller's thread when it starts: requests then go through the engine (the
    /// daemon's path), which the marking covers from here on.
    fn engine(&self, poller: usize) -> Option<Box<dyn Engine>> {
        counting::count_here(true);
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
    let start = counting::counted();
    for i in 0..512 {
        round(&mut d, i);
    }
    let before = counting::counted();
    // The file's data chunks were allocated on the poller during warm-up: the hook works.
    assert!(before > start, "no poller allocation seen during warm-up: the counting hook is broken");
    assert_eq!(d.facts().ring, ring);
    let n = 3000;
    for i in 0..n {
        round(&mut d, i);
    }
    let allocs = counting::counted() - before;
    assert_eq!(allocs, 0, "{ring}: {allocs} heap allocations on the poller for {} requests", 3 * n);
    d.shutdown().unwrap();
    dev.stop().unwrap();
}
