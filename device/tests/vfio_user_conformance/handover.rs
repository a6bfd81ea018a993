//! A running server hands its function over to a new server in the same process (issue 22's
//! device and transport layers; the second process is not built yet): the driver model stays
//! connected throughout and does not notice, on both ring layouts and both doorbell paths.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use virtiofs_device::config::{Doorbells, Placement, Profile};
use virtiofs_device::poller::PollerPool;
use virtiofs_device::vfio_user::Server;
use virtiofs_tools::driver::{DriverOptions, FsDriver, RingLayout};
use virtiofs_tools::virtio::STATUS_NEEDS_RESET;

use crate::common::Dev;

fn post(d: &mut FsDriver) -> u64 {
    d.submit_raw(1, &[&[0u8; 16]], &[64]).unwrap()
}

/// Waits for request `t`: answered by the engine ("asyn").
fn served(d: &mut FsDriver, t: u64) {
    let c = d.wait_for(t).unwrap();
    assert_eq!((c.used_len, c.data.as_slice()), (4, &b"asyn"[..]));
}

/// Brought up and serving through server A; a request made while A hands over waits, and one
/// in A's engine completes before the quiet point. A handover not taken (said so, refused by a
/// taker of another shape, or no answer at all) leaves A serving; one
/// taken moves the socket, the client (its next messages go to B), the registers, the DMA
/// windows, the interrupts and the rings to server B on another pool: the waiting request and
/// forty more (past the 16-entry ring's end) are served by B with its interrupts (the driver
/// waits on them), and the device status has no NEEDS_RESET.
#[test]
fn a_server_hands_its_function_over_and_the_driver_goes_on() {
    for (ring, doorbells) in [(RingLayout::Split, Doorbells::Socket), (RingLayout::Packed, Doorbells::Shared)]
    {
        let what = format!("{ring:?} ring, doorbells {doorbells:?}");
        let profile = Profile { request_queues: 2, queue_size: 16, doorbells, ..Profile::default() };
        let release = Arc::new(AtomicBool::new(true));
        let mut dev = Dev::start_profile(Some(release.clone()), None, profile.clone());
        let opts = DriverOptions { ring, use_interrupts: true, ..Default::default() };
        let mut d = dev.driver_with(opts);
        for _ in 0..5 {
            let t = post(&mut d);
            served(&mut d, t);
        }

        // Not taken: A serves on.
        let (h, answer) = dev.stop_handle().hand_over().unwrap();
        drop(h);
        answer.not_taken();
        let t = post(&mut d);
        served(&mut d, t);
        // A taker of another shape (three request queues) refuses the state, and A serves on.
        let (h, answer) = dev.stop_handle().hand_over().unwrap();
        let other = Profile { request_queues: 3, ..profile.clone() };
        let pool = PollerPool::spawn(&other).unwrap();
        let e = Server::take_over(h, &other, dev.handler.clone(), &pool, Placement::of_profile(&other))
            .err()
            .unwrap_or_else(|| panic!("{what}: a function of another shape took over"));
        assert!(e.to_string().contains("register state"), "{what}: {e}");
        answer.not_taken();
        let t = post(&mut d);
        served(&mut d, t);
        // No answer at all (the asker went away): A serves on as well.
        let (h, answer) = dev.stop_handle().hand_over().unwrap();
        drop((h, answer));
        let t = post(&mut d);
        served(&mut d, t);
        assert!(dev.path().exists(), "{what}: a handover not taken removed the socket file");

        // A request in A's engine when the handover is asked completes first.
        release.store(false, Ordering::SeqCst);
        let in_engine = post(&mut d);
        dev.wait_engine_submitted(9);
        let r = release.clone();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            r.store(true, Ordering::SeqCst);
        });
        let (h, answer) = dev.stop_handle().hand_over().unwrap();
        releaser.join().unwrap();
        served(&mut d, in_engine);
        let waiting = post(&mut d);
        let pool = PollerPool::spawn(&profile).unwrap();
        let b = Server::take_over(h, &profile, dev.handler.clone(), &pool, Placement::of_profile(&profile))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let stop_b = b.stop_handle();
        answer.taken();
        let join_b = std::thread::spawn(move || b.run().unwrap());
        served(&mut d, waiting);
        for _ in 0..40 {
            let t = post(&mut d);
            served(&mut d, t);
        }
        // The driver waits on its interrupts (use_interrupts): B signalled them, as it counts.
        let q = stop_b.stats().queues[1].clone();
        assert!(q.interrupts > 0, "{what}: no interrupt from B: {q:?}");
        let status = d.transport().status().unwrap();
        assert_eq!(status & STATUS_NEEDS_RESET, 0, "{what}: status {status:#x}");
        assert!(stop_b.client().connected, "{what}: B serves the client");
        assert!(stop_b.stats().requests().iter().sum::<u64>() >= 41, "{what}: B served the requests");
        // The socket is B's: A is gone (its stop is a no-op), the file stays while B runs.
        drop(d);
        let socket = dev.path();
        let _dir = dev.take_dir();
        drop(dev);
        assert!(stop_b.removal().is_none());
        assert!(socket.exists(), "{what}: A took the socket file with it");
        stop_b.stop();
        join_b.join().unwrap();
        assert!(!socket.exists(), "{what}: B left its socket file behind");
    }
}
