//! The data path under the control plane: requests through a virtqueue and their interrupts, a
//! corrupt ring, DMA_UNMAP waiting for requests in flight (in the handler or an asynchronous
//! engine) but not for waiting ones, a reset dropping waiting requests, a panicking handler.
//!
//! The rings and chains are the driver model's (`FsDriver::submit_raw` on its virtqueues); the
//! handler answers "done" (or its engine "asyn"/"wait") into the first writable buffer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtiofs_tools::driver::{Completion, DriverOptions, FsDriver};
use virtiofs_tools::vfio_user::{command as cmd, DmaUnmap, DMA_MAP_FLAG_READ, DMA_MAP_FLAG_WRITE};
use virtiofs_tools::virtio::STATUS_NEEDS_RESET;

use crate::common::{errno, memfd, Dev, TIMEOUT};

/// Posts one request on request queue 1: a 16-byte readable buffer and a 64-byte writable one.
fn post(d: &mut FsDriver) -> u64 {
    d.submit_raw(1, &[&[0u8; 16]], &[64]).unwrap()
}

/// Checks that `c` carries `answer` (4 bytes, the used length).
fn assert_answer(c: &Completion, answer: &[u8; 4]) {
    assert_eq!((c.used_len, c.data.as_slice()), (4, &answer[..]), "used length and reply bytes");
}

/// Sends DMA_UNMAP of all of the driver's memory and checks that no reply comes within 300 ms
/// (while something the unmap must wait for is in flight); returns the message id.
fn unmap_all_and_see_it_wait(d: &mut FsDriver, what: &str) -> u16 {
    let (address, size) = (d.memory().iova_base(), d.memory().size());
    let u = DmaUnmap { argsz: 24, flags: 0, address, size };
    let id = d.client().send_command(cmd::DMA_UNMAP, 0, &u.to_bytes(), &[]).unwrap();
    let early = d.client().try_recv_message(Duration::from_millis(300)).unwrap();
    assert!(early.is_none(), "DMA_UNMAP acknowledged while {what} was in flight: {early:?}");
    id
}

/// Receives the reply to the DMA_UNMAP `id`, which must succeed.
fn unmap_reply(d: &mut FsDriver, id: u16) {
    let r = d.client().recv_message().unwrap();
    assert_eq!((r.header.msg_id, r.header.command, errno(&r)), (id, cmd::DMA_UNMAP, 0));
}

#[test]
fn requests_are_served_and_interrupt() {
    let dev = Dev::start();
    let mut d = dev.driver_with(DriverOptions { use_interrupts: true, ..Default::default() });
    let t = post(&mut d);
    assert_answer(&d.wait_for(t).unwrap(), b"done");
    // The queue's MSI-X eventfd was signalled (the driver may have consumed it while waiting).
    let vector = d.queue_vector(1);
    let deadline = Instant::now() + TIMEOUT;
    let mut interrupts = d.stats().interrupts;
    while interrupts == 0 {
        assert!(Instant::now() < deadline, "no MSI-X interrupt for the completion");
        interrupts += d.take_interrupts(vector);
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    interrupts += d.take_interrupts(vector);
    assert_eq!(interrupts, 1, "one interrupt for one completion");
    assert_eq!(dev.handler.calls.load(Ordering::SeqCst), 1);
}

#[test]
fn corrupt_avail_ring_sets_needs_reset() {
    let dev = Dev::start();
    let mut d = dev.driver();
    // The driver model writes only valid rings: corrupt its avail index by hand (100 entries
    // published on a 16-entry queue) and ring the doorbell.
    let (_, avail, _) = d.transport().queue_addrs(1).unwrap();
    d.memory().store_u16(avail + 2, 100, Ordering::Release).unwrap();
    let notify_off = d.transport().queue_notify_off(1).unwrap();
    let addr = d.transport().notify_offset(notify_off).unwrap();
    d.transport().notify(1, addr).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while d.transport().status().unwrap() & STATUS_NEEDS_RESET == 0 {
        assert!(Instant::now() < deadline, "DEVICE_NEEDS_RESET never set");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Reset and the device is usable again.
    d.transport().set_status(0).unwrap();
    assert_eq!(d.transport().status().unwrap(), 0);
    assert_eq!(d.client().device_info().unwrap().num_regions, 9);
}

#[test]
fn dma_unmap_waits_for_in_flight_requests() {
    let dev = Dev::start();
    let (entered_tx, entered_rx) = channel();
    let (release_tx, release_rx) = channel();
    *dev.handler.gate.lock().unwrap() = Some((entered_tx, release_rx));
    let mut d = dev.driver();
    post(&mut d);
    entered_rx.recv_timeout(TIMEOUT).expect("request reached the handler");
    // While the handler holds the request, the unmap must not be acknowledged.
    let id = unmap_all_and_see_it_wait(&mut d, "a request");
    release_tx.send(()).unwrap();
    unmap_reply(&mut d, id);
    let done = d.poll_completions().unwrap();
    assert_eq!(done.len(), 1, "the request completed before the unmap was acknowledged");
    assert_answer(&done[0], b"done");
}

/// Brings the driver up, posts one request and waits until the engine holds it.
fn one_request_in_the_engine(dev: &Dev) -> (FsDriver, u64) {
    let mut d = dev.driver();
    let t = post(&mut d);
    dev.wait_engine_submitted(1);
    (d, t)
}

#[test]
fn engine_requests_complete_asynchronously_and_unmap_waits_for_them() {
    let release = Arc::new(AtomicBool::new(false));
    let dev = Dev::start_with(Some(release.clone()));
    let (mut d, _) = one_request_in_the_engine(&dev);
    assert!(d.poll_completions().unwrap().is_empty(), "a pending request must not be completed");
    let id = unmap_all_and_see_it_wait(&mut d, "an engine request");
    release.store(true, Ordering::SeqCst);
    unmap_reply(&mut d, id);
    let done = d.poll_completions().unwrap();
    assert_eq!(done.len(), 1, "the engine request completed before the unmap was acknowledged");
    assert_answer(&done[0], b"asyn");
    assert_eq!(dev.handler.calls.load(Ordering::SeqCst), 0, "the engine, not handle(), served it");
}

#[test]
fn waiting_requests_do_not_hold_up_unmap_and_go_with_a_reset() {
    let release = Arc::new(AtomicBool::new(false));
    let dev = Dev::start_engines(None, Some(release.clone()));
    let (mut d, t) = one_request_in_the_engine(&dev);
    assert!(d.poll_completions().unwrap().is_empty(), "a waiting request must not be completed");
    // Memory changes do not wait for it: DMA_MAP and DMA_UNMAP of another window are answered
    // while it waits.
    let extra = memfd(0x10000);
    let t0 = Instant::now();
    let rw = DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE;
    d.client().dma_map(rw, 0, 0x400000, 0x10000, Some(std::os::fd::AsRawFd::as_raw_fd(&extra))).unwrap();
    d.client().dma_unmap(0, 0x400000, 0x10000).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "DMA changes waited for a waiting request");
    assert!(d.poll_completions().unwrap().is_empty());
    // The answer goes into the request's writable buffer, through the current memory, with its
    // used length.
    release.store(true, Ordering::SeqCst);
    assert_answer(&d.wait_for(t).unwrap(), b"wait");
    // A request that waits when the driver resets the device is dropped unanswered, and the
    // handler hears of the reset.
    release.store(false, Ordering::SeqCst);
    post(&mut d);
    dev.wait_engine_submitted(2);
    let resets = dev.handler.resets.load(Ordering::SeqCst);
    d.transport().set_status(0).unwrap();
    assert_eq!(d.transport().status().unwrap(), 0, "reset");
    assert_eq!(dev.handler.cancelled.load(Ordering::SeqCst), 1, "the waiting request was cancelled");
    assert!(dev.handler.resets.load(Ordering::SeqCst) > resets, "RequestHandler::reset was called");
    release.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    assert!(d.poll_completions().unwrap().is_empty(), "nothing is answered into a reset queue");
    assert_eq!(dev.handler.calls.load(Ordering::SeqCst), 0, "the engine, not handle(), served them");
}

#[test]
fn a_panicking_handler_fails_one_request_not_the_device() {
    let dev = Dev::start();
    dev.handler.panic_next.store(true, Ordering::SeqCst);
    let mut d = dev.driver();
    let t = post(&mut d);
    let failed = d.wait_for(t).unwrap();
    assert_eq!(failed.used_len, 0, "the request that hit the bug is completed (failed)");
    // The poller still serves.
    let t = post(&mut d);
    assert_answer(&d.wait_for(t).unwrap(), b"done");
    assert_eq!(dev.handler.calls.load(Ordering::SeqCst), 2);
    assert_eq!(d.client().device_info().unwrap().num_regions, 9);
}
