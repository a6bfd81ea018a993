//! Pollers over rings written by the driver-side mock, both layouts: requests served at once,
//! pending in an engine and waiting, and the statistics each of them leaves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, VolatileSlice};

use super::*;
use crate::config::{Polling, Profile, QueueMapping};
use crate::pci::msix::MsixShared;
use crate::pci::{features, QueueConfig, NO_VECTOR};
use crate::stats::{DeviceStats, QueueStats, Tally};
use crate::virtq::mock::{guest_memory, Buf, PackedDriver, SplitDriver, UsedElem};

/// Serves requests by their first readable byte: 0 at once, 1 pending until `release`, 2
/// waiting until `grant`, 3 at once after holding the poller for [`SLOW`]; the reply is 4 bytes
/// `[kind; 4]`.
struct Handler {
    release: Arc<AtomicBool>,
    grant: Arc<AtomicBool>,
}

struct TestEngine {
    release: Arc<AtomicBool>,
    grant: Arc<AtomicBool>,
    pending: Vec<u64>,
    waiting: Vec<u64>,
}

fn kind(readable: &[VolatileSlice<'_>]) -> u8 {
    readable.first().and_then(|s| s.read_obj::<u8>(0).ok()).unwrap_or(0)
}

impl RequestHandler for Handler {
    fn handle(
        &self,
        _: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally) {
        let k = kind(readable);
        (writable[0].write_slice(&[k; 4], 0).map_or(0, |()| 4), Tally::default())
    }

    fn engine(&self, _: usize) -> Option<Box<dyn Engine>> {
        Some(Box::new(TestEngine {
            release: self.release.clone(),
            grant: self.grant.clone(),
            pending: Vec::new(),
            waiting: Vec::new(),
        }))
    }
}

impl Engine for TestEngine {
    fn submit(
        &mut self,
        id: u64,
        _: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (Outcome, Tally) {
        match kind(readable) {
            1 => {
                writable[0].write_slice(&[1; 4], 0).unwrap();
                self.pending.push(id);
                (Outcome::Pending, Tally::default())
            }
            2 => {
                self.waiting.push(id);
                (Outcome::Wait, Tally::default())
            }
            3 => {
                std::thread::sleep(SLOW);
                writable[0].write_slice(&[3; 4], 0).unwrap();
                (Outcome::Done(4), Tally::default())
            }
            k => {
                writable[0].write_slice(&[k; 4], 0).unwrap();
                (Outcome::Done(4), Tally::default())
            }
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, u32, Tally)) -> usize {
        if !self.release.load(Ordering::Acquire) {
            return 0;
        }
        let n = self.pending.len();
        self.pending.drain(..).for_each(|id| done(id, 4, Tally::default()));
        n
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }

    fn poll_waits(&mut self, answer: &mut dyn FnMut(u64, &[u8], Tally)) -> usize {
        if !self.grant.load(Ordering::Acquire) {
            return 0;
        }
        let n = self.waiting.len();
        self.waiting.drain(..).for_each(|id| answer(id, &[2; 4], Tally::default()));
        n
    }

    fn cancel_waits(&mut self) {
        self.waiting.clear();
    }

    fn wait_tokens(&self) -> Vec<(u64, u64)> {
        self.waiting.iter().map(|&id| (id, id + 1000)).collect()
    }

    fn adopt_wait(&mut self, id: u64, token: u64) -> bool {
        if token < 1000 {
            return false;
        }
        self.waiting.push(id);
        true
    }
}

/// Releases every pending and waiting request of the test engine when dropped.
struct Unblock(Arc<AtomicBool>, Arc<AtomicBool>);

impl Drop for Unblock {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
        self.1.store(true, Ordering::Release);
    }
}

/// Either driver-side mock.
enum Driver<'m> {
    Split(SplitDriver<'m>),
    Packed(PackedDriver<'m>),
}

impl Driver<'_> {
    /// Makes `bufs` available (as buffer `id` on a packed ring); returns the token the device
    /// returns it with (the head index on a split ring).
    fn push(&mut self, bufs: &[Buf], id: u16) -> u16 {
        match self {
            Driver::Split(d) => d.push(bufs),
            Driver::Packed(d) => d.push(bufs, id),
        }
    }

    fn next_used(&mut self) -> Option<UsedElem> {
        match self {
            Driver::Split(d) => d.next_used(),
            Driver::Packed(d) => d.next_used(),
        }
    }
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// How long a slow request keeps its poller busy: longer than two jiffies at HZ=100, so the
/// coarse clock sees it.
const SLOW: Duration = Duration::from_millis(25);

const REQ: u64 = 0x10000;
const REPLY: u64 = 0x11000;

#[test]
fn requests_served_pending_and_waiting_are_counted_on_both_layouts() {
    let mem = guest_memory(0x20000, None);
    let profile = Profile { polling: Polling::Busy, ..Profile::default() };
    let (release, grant) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let handler = Arc::new(Handler { release: release.clone(), grant: grant.clone() });
    let msix = Arc::new(MsixShared::new(3));
    let started = Instant::now();
    let mut pollers = own_pollers(&profile, handler, msix);
    let counters = pollers.stats().clone();
    pollers.set_memory(&mem);
    // Vector 1 is queue 1's; any file takes the 8-byte interrupt write.
    let irq = tempfile::tempfile().unwrap();
    pollers.set_irqs(&Arc::from(vec![None, Some(irq), None]));
    let queue1 = |stats: &DeviceStats| -> QueueStats { stats.queues[1].clone() };
    // A failed assertion must fail the test, not hang it: the pollers' drop waits for the
    // engine to drain, and the test engine answers only once released (dropped before them).
    let _unblock = Unblock(release.clone(), grant.clone());

    let mut served_before = 0;
    for packed in [false, true] {
        release.store(false, Ordering::Release);
        grant.store(false, Ordering::Release);
        let cfg = QueueConfig { index: 1, size: 8, desc: 0x1000, avail: 0x2000, used: 0x3000, vector: 1 };
        let mut drv = if packed {
            Driver::Packed(PackedDriver::new(&mem, cfg))
        } else {
            Driver::Split(SplitDriver::new(&mem, cfg))
        };
        let f = features::VERSION_1 | if packed { features::RING_PACKED } else { 0 };
        pollers.start(&[cfg], f);
        let layout = if packed { "packed" } else { "split" };

        let mut tokens = Vec::new();
        for (id, k) in [(0u16, 0u8), (1, 1), (2, 2)] {
            let (req, reply) = (REQ + 0x100 * u64::from(id), REPLY + 0x100 * u64::from(id));
            mem.write_obj(k, GuestAddress(req)).unwrap();
            tokens.push(drv.push(&[Buf::readable(req, 16), Buf::writable(reply, 64)], id));
        }
        // The at-once request comes back; the other two stay, one pending and one waiting. The
        // counters are the poller's plain stores, read from another thread: each comes to its
        // value, not all at one instant (seen under qemu-user: in_flight and waiting already 1,
        // requests not yet counted), so the test waits for all three.
        assert_eq!(wait_for("the request served at once", || drv.next_used()), (tokens[0], 4), "{layout}");
        let q = wait_for("one served, one pending and one waiting", || {
            let q = queue1(&pollers.stats().snapshot());
            (q.in_flight == 1 && q.waiting == 1 && q.requests == served_before + 1).then_some(q)
        });
        assert_eq!(q.requests, served_before + 1, "{layout}: {q:?}");
        assert!(drv.next_used().is_none());

        release.store(true, Ordering::Release);
        assert_eq!(wait_for("the pending request", || drv.next_used()), (tokens[1], 4), "{layout}");
        grant.store(true, Ordering::Release);
        assert_eq!(wait_for("the waiting request", || drv.next_used()), (tokens[2], 4), "{layout}");
        assert_eq!(mem.read_obj::<[u8; 4]>(GuestAddress(REPLY + 0x200)).unwrap(), [2; 4], "the wait's reply");

        // A chain with a buffer outside guest memory fails alone, counted as a bad chain.
        let bad = drv.push(&[Buf::readable(0x1f_0000, 16)], 3);
        assert_eq!(wait_for("the bad chain", || drv.next_used()), (bad, 0), "{layout}");
        // A slow request: busy time.
        mem.write_obj(3u8, GuestAddress(REQ + 0x300)).unwrap();
        let slow = drv.push(&[Buf::readable(REQ + 0x300, 16), Buf::writable(REPLY + 0x300, 64)], 4);
        assert_eq!(wait_for("the slow request", || drv.next_used()), (slow, 4), "{layout}");
        pollers.kick(1);
        // (Waited for together, as above: each counter comes to its value on its own.)
        let expected = (served_before + 5, 0, 0, if packed { 2 } else { 1 }, if packed { 2 } else { 1 });
        let q = wait_for("the counters (requests, in_flight, waiting, bad_chains, doorbells)", || {
            let q = queue1(&pollers.stats().snapshot());
            ((q.requests, q.in_flight, q.waiting, q.bad_chains, q.doorbells) == expected).then_some(q)
        });
        // No EVENT_IDX and interrupts not suppressed: one per round that returned something.
        // The test waits for each request before it sends the next, but a slow machine (qemu-user)
        // can still see two come back in one round: at least one interrupt, at most one per request.
        assert!(q.interrupts >= 1 && q.interrupts <= q.requests, "{layout}: {q:?}");
        served_before = q.requests;
        pollers.stop();
    }
    drop(pollers); // the pollers exit, their last spells counted
    let elapsed = u64::try_from(started.elapsed().as_nanos()).unwrap();
    let stats = counters.snapshot();
    let p = &stats.pollers[0];
    assert_eq!(p.queues, [0, 1]);
    assert!(p.rounds > 0, "{p:?}");
    // Two slow requests of 25 ms: at least 40 ms busy, whatever the jiffy (1 to 10 ms); busy and
    // idle time together no more than the test took, give or take a jiffy.
    assert!(p.busy_ns >= 40_000_000, "{p:?}");
    assert!(p.busy_ns + p.idle_ns <= elapsed + 10_000_000, "{p:?} in {elapsed} ns");
    assert_eq!(p.parks, 0, "busy polling never parks");
    assert_eq!(stats.queues[0].requests, 0, "nothing on hiprio");
}

/// Two functions on one shared poller (issue 14): while function A's memory change waits for
/// A's pending request to drain, function B's requests keep completing on the same poller; A's
/// change is acknowledged once its request completes, and detaching A leaves B serving.
#[test]
fn a_drain_of_one_function_does_not_hold_up_another_on_the_same_poller() {
    let profile = Profile { polling: Polling::Busy, ..Profile::default() };
    let pool = PollerPool::spawn(&profile).unwrap();
    let f = features::VERSION_1;
    let cfg = QueueConfig { index: 1, size: 8, desc: 0x1000, avail: 0x2000, used: 0x3000, vector: 1 };
    let function = |release: &Arc<AtomicBool>, ordinal| {
        let handler = Arc::new(Handler { release: release.clone(), grant: Arc::new(AtomicBool::new(false)) });
        let placement = pool.placement(QueueMapping::Spread, None, ordinal);
        let msix = Arc::new(MsixShared::new(3));
        PollerSet::attach(&pool, &profile, placement, handler, shared(msix), Arc::new(|| {}))
    };
    let (release_a, release_b) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let mut a = function(&release_a, 0);
    let mut b = function(&release_b, 1);
    assert_eq!((a.placement().poller_of(1), b.placement().poller_of(1)), (0, 0), "one poller serves both");
    let (mem_a, mem_b) = (guest_memory(0x20000, None), guest_memory(0x20000, None));
    a.set_memory(&mem_a);
    b.set_memory(&mem_b);
    a.start(&[cfg], f);
    b.start(&[cfg], f);
    let mut drv_a = SplitDriver::new(&mem_a, cfg);
    let mut drv_b = SplitDriver::new(&mem_b, cfg);

    // A's request stays pending in A's engine.
    mem_a.write_obj(1u8, GuestAddress(REQ)).unwrap();
    let held = drv_a.push(&[Buf::readable(REQ, 16), Buf::writable(REPLY, 64)]);
    wait_for("A's request pending", || (a.stats().snapshot().queues[1].in_flight == 1).then_some(()));
    // A's memory change must wait for it: on another thread, as a control plane would.
    let changed = Arc::new(AtomicBool::new(false));
    let remap = {
        let (changed, mem) = (changed.clone(), mem_a.clone());
        std::thread::spawn(move || {
            a.set_memory(&mem);
            changed.store(true, Ordering::Release);
            a
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    assert!(!changed.load(Ordering::Acquire), "A's memory change waits for A's pending request");
    // Meanwhile B's requests complete on the same poller.
    for i in 0..20u64 {
        let req = REQ + 0x100 * (i % 4);
        mem_b.write_obj(0u8, GuestAddress(req)).unwrap();
        let t = drv_b.push(&[Buf::readable(req, 16), Buf::writable(REPLY, 64)]);
        assert_eq!(wait_for("B's request", || drv_b.next_used()), (t, 4), "request {i}");
    }
    assert!(!changed.load(Ordering::Acquire));
    release_a.store(true, Ordering::Release);
    let mut a = remap.join().unwrap();
    assert!(changed.load(Ordering::Acquire));
    assert_eq!(wait_for("A's request", || drv_a.next_used()), (held, 4));
    // Each function's counters are its own.
    assert_eq!(a.stats().snapshot().queues[1].requests, 1);
    assert_eq!(b.stats().snapshot().queues[1].requests, 20);
    a.stop();
    drop(a); // A leaves the poller
    mem_b.write_obj(0u8, GuestAddress(REQ)).unwrap();
    let t = drv_b.push(&[Buf::readable(REQ, 16), Buf::writable(REPLY, 64)]);
    assert_eq!(wait_for("B after A left", || drv_b.next_used()), (t, 4));
    assert_eq!(b.stats().snapshot().queues[1].requests, 21);
}

/// Pending requests complete when a byte arrives on a socket (a remote server's reply, in
/// small), which the engine offers as its readiness.
struct SocketHandler {
    stream: std::os::unix::net::UnixStream,
    polls: Arc<std::sync::atomic::AtomicU64>,
}

struct SocketEngine {
    stream: std::os::unix::net::UnixStream,
    polls: Arc<std::sync::atomic::AtomicU64>,
    pending: Vec<u64>,
}

impl RequestHandler for SocketHandler {
    fn handle(&self, _: Taken, _: &[VolatileSlice<'_>], writable: &[VolatileSlice<'_>]) -> (u32, Tally) {
        (writable[0].write_slice(&[0; 4], 0).map_or(0, |()| 4), Tally::default())
    }

    fn engine(&self, _: usize) -> Option<Box<dyn Engine>> {
        let stream = self.stream.try_clone().unwrap();
        stream.set_nonblocking(true).unwrap();
        Some(Box::new(SocketEngine { stream, polls: self.polls.clone(), pending: Vec::new() }))
    }
}

impl Engine for SocketEngine {
    fn submit(
        &mut self,
        id: u64,
        _: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (Outcome, Tally) {
        let k = kind(readable);
        writable[0].write_slice(&[k; 4], 0).unwrap();
        if k == 1 {
            self.pending.push(id);
            (Outcome::Pending, Tally::default())
        } else {
            (Outcome::Done(4), Tally::default())
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, u32, Tally)) -> usize {
        self.polls.fetch_add(1, Ordering::Relaxed);
        let mut b = [0u8; 1];
        if self.pending.is_empty() || std::io::Read::read(&mut self.stream, &mut b).is_err() {
            return 0;
        }
        let n = self.pending.len();
        self.pending.drain(..).for_each(|id| done(id, 4, Tally::default()));
        n
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }

    fn readiness(&self) -> Option<Readiness<'_>> {
        use std::os::fd::AsFd;
        Some(Readiness { fd: Some(self.stream.as_fd()), writable: false, within: Duration::from_secs(30) })
    }
}

#[test]
fn an_adaptive_poller_blocks_on_its_engine_and_wakes_for_replies_messages_and_doorbells() {
    let mem = guest_memory(0x20000, None);
    // Sleeps and spins so long that only a wake-up can end a wait within the test.
    let profile = Profile {
        polling: Polling::Adaptive,
        idle_spin_us: 30_000_000,
        idle_sleep_us: 30_000_000,
        ..Profile::default()
    };
    let (ours, server) = std::os::unix::net::UnixStream::pair().unwrap();
    let polls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let handler = Arc::new(SocketHandler { stream: ours, polls: polls.clone() });
    let msix = Arc::new(MsixShared::new(3));
    let mut pollers = own_pollers(&profile, handler, msix);
    pollers.set_memory(&mem);
    let cfg = QueueConfig { index: 1, size: 8, desc: 0x1000, avail: 0x2000, used: 0x3000, vector: NO_VECTOR };
    let mut drv = Driver::Split(SplitDriver::new(&mem, cfg));
    pollers.start(&[cfg], features::VERSION_1);
    mem.write_obj(1u8, GuestAddress(REQ)).unwrap();
    let pending = drv.push(&[Buf::readable(REQ, 16), Buf::writable(REPLY, 64)], 0);
    wait_for("the request pending", || (pollers.stats().snapshot().queues[1].in_flight == 1).then_some(()));
    std::thread::sleep(Duration::from_millis(100));
    let before = polls.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(100));
    let spun = polls.load(Ordering::Relaxed) - before;
    assert!(spun < 50, "{spun} engine polls in 100 ms with nothing ready: it spins");
    assert!(pollers.stats().snapshot().pollers[0].engine_waits > 0);
    // A control message ends the wait at once (set_irqs waits for the acknowledgement).
    let t0 = Instant::now();
    pollers.set_irqs(&Arc::from(vec![None, None, None]));
    assert!(t0.elapsed() < Duration::from_secs(5), "the message waited {:?}", t0.elapsed());
    // So does a doorbell: a request served at once comes back while the other is pending.
    mem.write_obj(0u8, GuestAddress(REQ + 0x100)).unwrap();
    let quick = drv.push(&[Buf::readable(REQ + 0x100, 16), Buf::writable(REPLY + 0x100, 64)], 1);
    pollers.kick(1);
    assert_eq!(wait_for("the doorbell's request", || drv.next_used()), (quick, 4));
    // And the reply: the engine's descriptor becomes readable.
    std::io::Write::write_all(&mut &server, b"r").unwrap();
    assert_eq!(wait_for("the pending request", || drv.next_used()), (pending, 4));
    pollers.stop();
}

#[test]
fn a_parked_poller_wakes_on_its_doorbell_source_without_a_kick() {
    let mem = guest_memory(0x20000, None);
    // It parks after 1 ms and would sleep 30 s: only a wake-up can serve the request in time.
    let profile = Profile {
        polling: Polling::Adaptive,
        doorbells: crate::config::Doorbells::Socket,
        idle_spin_us: 1_000,
        idle_sleep_us: 30_000_000,
        ..Profile::default()
    };
    let handler = Arc::new(Handler { release: Default::default(), grant: Default::default() });
    let msix = Arc::new(MsixShared::new(3));
    let mut pollers = own_pollers(&profile, handler, msix);
    pollers.set_memory(&mem);
    let (source, client) = std::os::unix::net::UnixStream::pair().unwrap();
    pollers.set_doorbell_source(Some(std::os::fd::OwnedFd::from(source)));
    let cfg = QueueConfig { index: 1, size: 8, desc: 0x1000, avail: 0x2000, used: 0x3000, vector: NO_VECTOR };
    let mut drv = Driver::Split(SplitDriver::new(&mem, cfg));
    pollers.start(&[cfg], features::VERSION_1);
    let parked = || pollers.stats().snapshot().pollers[0].parks > 0;
    wait_for("the poller parked", || parked().then_some(()));
    // Asleep for good: no park for 100 ms (an early wake-up from the set-up messages is over).
    let parks = || pollers.stats().snapshot().pollers[0].parks;
    let mut last = parks();
    wait_for("the poller asleep", || {
        std::thread::sleep(Duration::from_millis(100));
        let now = parks();
        std::mem::replace(&mut last, now).eq(&now).then_some(())
    });
    // The driver makes a request available and "rings": a message on the client's socket, which
    // nobody reads and nobody turns into a kick.
    mem.write_obj(0u8, GuestAddress(REQ)).unwrap();
    let head = drv.push(&[Buf::readable(REQ, 16), Buf::writable(REPLY, 64)], 0);
    std::io::Write::write_all(&mut &client, b"doorbell").unwrap();
    assert_eq!(wait_for("the request, served after a direct wake-up", || drv.next_used()), (head, 4));
    assert!(pollers.stats().snapshot().pollers[0].doorbell_wakes >= 1);
    // The message stays unread: the next sleep leaves the source out instead of waking on it
    // in a loop, then takes it back once a wake-up came otherwise.
    let before = parks();
    std::thread::sleep(Duration::from_millis(200));
    let after = parks();
    assert!(after - before < 20, "{} parks in 200 ms on an unread message: it loops", after - before);
    // Taken back, the source wakes nobody: a request now waits for a kick.
    pollers.set_doorbell_source(None);
    mem.write_obj(0u8, GuestAddress(REQ + 0x100)).unwrap();
    let second = drv.push(&[Buf::readable(REQ + 0x100, 16), Buf::writable(REPLY + 0x100, 64)], 1);
    pollers.kick(1);
    assert_eq!(wait_for("the kicked request", || drv.next_used()), (second, 4));
    pollers.stop();
}

/// A function alone on a pool of its own, as `profile` places it.
fn own_pollers(profile: &Profile, handler: Arc<dyn RequestHandler>, msix: Arc<MsixShared>) -> PollerSet {
    let pool = PollerPool::spawn(profile).unwrap();
    PollerSet::attach(
        &pool,
        profile,
        crate::config::Placement::of_profile(profile),
        handler,
        shared(msix),
        Arc::new(|| {}),
    )
}

/// What a test function shares with its pollers: no faults, no in-flight records.
fn shared(msix: Arc<MsixShared>) -> crate::poller::FunctionShared {
    crate::poller::FunctionShared { msix, faults: Default::default(), track: None }
}

/// Issue 22, the quiet point of a handover, on both layouts: `freeze` waits for the engine's
/// pending request to complete (and publishes it), then no request is taken; a request that
/// waits (a SETLKW) is state: a frozen function thawed serves on with it still waiting, and a
/// new set of pollers resumed from the frozen states serves the request the driver made
/// meanwhile, goes on past the end of the ring, and answers the waiting request when its event
/// comes, at its own head, as if nothing happened.
#[test]
fn a_frozen_function_resumes_on_other_pollers_where_it_stood() {
    let mem = guest_memory(0x20000, None);
    let profile = Profile { polling: Polling::Busy, ..Profile::default() };
    for packed in [false, true] {
        let layout = if packed { "packed" } else { "split" };
        let (release, grant) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let _unblock = Unblock(release.clone(), grant.clone());
        let handler = Arc::new(Handler { release: release.clone(), grant: grant.clone() });
        let cfg =
            QueueConfig { index: 1, size: 8, desc: 0x1000, avail: 0x2000, used: 0x3000, vector: NO_VECTOR };
        let f = features::VERSION_1 | if packed { features::RING_PACKED } else { 0 };
        let mut drv = if packed {
            Driver::Packed(PackedDriver::new(&mem, cfg))
        } else {
            Driver::Split(SplitDriver::new(&mem, cfg))
        };
        let mut id = 0u16;
        // The waiting request's buffer id (and its buffers) stay its own until it is answered:
        // later requests skip it.
        let mut out: Option<u16> = None;
        let mut send = |drv: &mut Driver<'_>, k: u8| {
            if out == Some(id % 8) {
                id += 1;
            }
            if k == 2 {
                out = Some(id % 8);
            }
            let slot = u64::from(id % 8);
            mem.write_obj(k, GuestAddress(REQ + 0x100 * slot)).unwrap();
            let t = drv.push(
                &[Buf::readable(REQ + 0x100 * slot, 16), Buf::writable(REPLY + 0x100 * slot, 64)],
                id % 8,
            );
            id += 1;
            t
        };
        let mut old = own_pollers(&profile, handler.clone(), Arc::new(MsixShared::new(3)));
        old.set_memory(&mem);
        old.start(&[cfg], f);
        for _ in 0..5 {
            let t = send(&mut drv, 0);
            assert_eq!(wait_for("a request", || drv.next_used()), (t, 4), "{layout}");
        }
        // A waiting request is state: frozen with it, then thawed, the function serves on.
        let waiting = send(&mut drv, 2);
        wait_for("the request to wait", || (old.stats().snapshot().queues[1].waiting == 1).then_some(()));
        let states = old.freeze().expect("quiet with a request waiting");
        assert_eq!(states[0].parked.len(), 1, "{layout}");
        assert_eq!(states[0].ring.outstanding(), 1, "{layout}");
        old.thaw();
        let t = send(&mut drv, 0);
        assert_eq!(wait_for("a request after a thaw", || drv.next_used()), (t, 4), "{layout}");

        // A pending request: freeze waits for it, and it comes back.
        let pending = send(&mut drv, 1);
        wait_for("the request in the engine", || {
            (old.stats().snapshot().queues[1].in_flight == 1).then_some(())
        });
        let r = release.clone();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            r.store(true, Ordering::Release);
        });
        let states = old.freeze().expect("quiet once the pending request completed");
        releaser.join().unwrap();
        assert_eq!(drv.next_used(), Some((pending, 4)), "{layout}: completed before the quiet point");
        assert_eq!(states.len(), 1);
        assert_eq!(states[0].parked.len(), 1, "{layout}: the request still waits");
        // Frozen: a request made now is not taken.
        let during = send(&mut drv, 0);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(drv.next_used(), None, "{layout}: a frozen function took a request");
        drop(old);

        // The successor: other pollers, resumed from the states.
        let states: Vec<QueueState> = serde_json::from_str(&serde_json::to_string(&states).unwrap()).unwrap();
        let mut new = own_pollers(&profile, handler, Arc::new(MsixShared::new(3)));
        new.set_memory(&mem);
        new.resume(&[cfg], f, &states);
        assert_eq!(
            wait_for("the request made during the freeze", || drv.next_used()),
            (during, 4),
            "{layout}"
        );
        for _ in 0..12 {
            let t = send(&mut drv, 0);
            assert_eq!(wait_for("a request after the handover", || drv.next_used()), (t, 4), "{layout}");
        }
        assert_eq!(new.stats().snapshot().queues[1].waiting, 1, "{layout}: the waiting request moved");
        grant.store(true, Ordering::Release);
        assert_eq!(
            wait_for("the waiting request, answered by the new pollers", || drv.next_used()),
            (waiting, 4),
            "{layout}"
        );
        let t = send(&mut drv, 0);
        assert_eq!(wait_for("a request after it", || drv.next_used()), (t, 4), "{layout}");
        new.stop();
    }
}

/// Issue 22: a waiting request handed over that the new process's engine does not know (a
/// state that contradicts itself) breaks its queue, reported, rather than staying unanswered.
#[test]
fn a_waiting_request_the_new_engine_does_not_know_breaks_its_queue() {
    let mem = guest_memory(0x20000, None);
    let profile = Profile { polling: Polling::Busy, ..Profile::default() };
    let (release, grant) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let _unblock = Unblock(release.clone(), grant.clone());
    let handler = Arc::new(Handler { release, grant });
    let cfg = QueueConfig { index: 1, size: 8, desc: 0x1000, avail: 0x2000, used: 0x3000, vector: NO_VECTOR };
    let f = features::VERSION_1;
    let mut drv = SplitDriver::new(&mem, cfg);
    mem.write_obj(2u8, GuestAddress(REQ)).unwrap();
    drv.push(&[Buf::readable(REQ, 16), Buf::writable(REPLY, 64)]);
    let mut old = own_pollers(&profile, handler.clone(), Arc::new(MsixShared::new(3)));
    old.set_memory(&mem);
    old.start(&[cfg], f);
    wait_for("the request to wait", || (old.stats().snapshot().queues[1].waiting == 1).then_some(()));
    let mut states = old.freeze().expect("quiet with a request waiting");
    drop(old);
    states[0].parked[0].token = Some(5); // the test engine knows tokens from 1000 on
    let mut new = own_pollers(&profile, handler, Arc::new(MsixShared::new(3)));
    new.set_memory(&mem);
    new.resume(&[cfg], f, &states);
    let broken = wait_for("the queue to break", || {
        let b = new.take_broken();
        (!b.is_empty()).then_some(b)
    });
    assert!(matches!(broken[0], crate::virtq::QueueError::HandoverWait { queue: 1, .. }), "{broken:?}");
    new.stop();
}

/// Counts `before_publish` calls; a request of kind 3 takes 300 ms (synchronous, no engine);
/// `due`: whether it says a flush is due after each request.
struct FlushCounting {
    flushed: Arc<std::sync::atomic::AtomicU32>,
    due: bool,
}

impl RequestHandler for FlushCounting {
    fn handle(
        &self,
        _: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally) {
        let k = kind(readable);
        if k == 3 {
            std::thread::sleep(Duration::from_millis(300));
        }
        (writable[0].write_slice(&[k; 4], 0).map_or(0, |()| 4), Tally::default())
    }

    fn before_publish(&self) {
        self.flushed.fetch_add(1, Ordering::SeqCst);
    }

    fn publish_due(&self) -> bool {
        self.due
    }
}

/// While the handler says a flush is due, no reply of a round reaches the used ring before
/// its `before_publish` ran (a packed ring's used descriptor is visible as soon as it is
/// written; a split ring's written entries are published by a recovery): a quick request taken
/// with a slow one is seen only after the flush that precedes both returns, on each ring
/// layout. While none is due, a reply is written as its request ends (a packed ring shows it
/// before the slow one ends) and no flush is asked for.
#[test]
fn no_reply_is_written_before_the_handler_made_ready_what_it_names() {
    for (packed, due) in [(false, true), (true, true), (true, false)] {
        let mem = guest_memory(0x20000, None);
        let profile = Profile { polling: Polling::Busy, ..Profile::default() };
        let flushed = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let handler = Arc::new(FlushCounting { flushed: flushed.clone(), due });
        let msix = Arc::new(MsixShared::new(3));
        let mut pollers = own_pollers(&profile, handler, msix);
        pollers.set_memory(&mem);
        let irq = tempfile::tempfile().unwrap();
        pollers.set_irqs(&Arc::from(vec![None, Some(irq), None]));
        let cfg = QueueConfig { index: 1, size: 8, desc: 0x1000, avail: 0x2000, used: 0x3000, vector: 1 };
        let mut drv = if packed {
            Driver::Packed(PackedDriver::new(&mem, cfg))
        } else {
            Driver::Split(SplitDriver::new(&mem, cfg))
        };
        for (id, k) in [(0u16, 0u8), (1, 3)] {
            let (req, reply) = (REQ + 0x100 * u64::from(id), REPLY + 0x100 * u64::from(id));
            mem.write_obj(k, GuestAddress(req)).unwrap();
            drv.push(&[Buf::readable(req, 16), Buf::writable(reply, 64)], id);
        }
        let f = features::VERSION_1 | if packed { features::RING_PACKED } else { 0 };
        pollers.start(&[cfg], f);
        let _first = wait_for("the first reply", || drv.next_used());
        let layout = if packed { "packed" } else { "split" };
        if due {
            assert!(
                flushed.load(Ordering::SeqCst) >= 1,
                "{layout}: a reply was written before before_publish"
            );
        }
        let _ = wait_for("the slow reply", || drv.next_used());
        if !due {
            assert_eq!(flushed.load(Ordering::SeqCst), 0, "{layout}: a flush asked for with none due");
        }
        pollers.stop();
    }
}

/// [`Handler`]'s engine, with a flush always due, slow (a reply written before it would be
/// seen while it runs) and counted as it ends.
struct DueHandler {
    inner: Handler,
    flushed: Arc<std::sync::atomic::AtomicU32>,
}

impl RequestHandler for DueHandler {
    fn handle(
        &self,
        taken: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally) {
        self.inner.handle(taken, readable, writable)
    }

    fn engine(&self, poller: usize) -> Option<Box<dyn Engine>> {
        self.inner.engine(poller)
    }

    fn before_publish(&self) {
        std::thread::sleep(Duration::from_millis(50));
        self.flushed.fetch_add(1, Ordering::SeqCst);
    }

    fn publish_due(&self) -> bool {
        true
    }
}

/// The engine's completions wait for `before_publish` too: a pending request finished by the
/// engine, and a waiting one answered, reach the used ring only after a flush, on each ring
/// layout.
#[test]
fn engine_completions_are_written_only_after_the_handler_made_ready_what_they_name() {
    for packed in [false, true] {
        let mem = guest_memory(0x20000, None);
        let profile = Profile { polling: Polling::Busy, ..Profile::default() };
        let (release, grant) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let flushed = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let inner = Handler { release: release.clone(), grant: grant.clone() };
        let handler = Arc::new(DueHandler { inner, flushed: flushed.clone() });
        let msix = Arc::new(MsixShared::new(3));
        let mut pollers = own_pollers(&profile, handler, msix);
        pollers.set_memory(&mem);
        let irq = tempfile::tempfile().unwrap();
        pollers.set_irqs(&Arc::from(vec![None, Some(irq), None]));
        let _unblock = Unblock(release.clone(), grant.clone());
        let cfg = QueueConfig { index: 1, size: 8, desc: 0x1000, avail: 0x2000, used: 0x3000, vector: 1 };
        let mut drv = if packed {
            Driver::Packed(PackedDriver::new(&mem, cfg))
        } else {
            Driver::Split(SplitDriver::new(&mem, cfg))
        };
        for (id, k) in [(0u16, 1u8), (1, 2)] {
            let (req, reply) = (REQ + 0x100 * u64::from(id), REPLY + 0x100 * u64::from(id));
            mem.write_obj(k, GuestAddress(req)).unwrap();
            drv.push(&[Buf::readable(req, 16), Buf::writable(reply, 64)], id);
        }
        let f = features::VERSION_1 | if packed { features::RING_PACKED } else { 0 };
        pollers.start(&[cfg], f);
        let layout = if packed { "packed" } else { "split" };
        std::thread::sleep(Duration::from_millis(20));
        assert!(drv.next_used().is_none(), "{layout}: nothing finished yet");
        for (what, gate) in [("the pending request", &release), ("the waiting request", &grant)] {
            let before = flushed.load(Ordering::SeqCst);
            gate.store(true, Ordering::Release);
            let _ = wait_for(what, || drv.next_used());
            assert!(flushed.load(Ordering::SeqCst) > before, "{layout}: {what} was written before a flush");
        }
        pollers.stop();
    }
}
