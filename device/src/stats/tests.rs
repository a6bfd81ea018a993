//! The counters as the pollers and the control plane write them, and the snapshots, histograms
//! and baselines read from them.

use super::counters::{add, sub_one, RING_PACKED};
use super::*;
use crate::config::{Profile, QueueMapping};

#[test]
fn counters_land_in_their_queue_and_poller() {
    let profile = Profile {
        request_queues: 3,
        poller_cores: vec![0, 1],
        queue_mapping: QueueMapping::RequestQueues,
        ..Default::default()
    };
    let c = DeviceCounters::new(&profile);
    // Request queue k on poller (k-1) mod 2, hiprio on poller 0.
    assert_eq!(
        (c.place(0), c.place(1), c.place(2), c.place(3)),
        (Some((0, 0)), Some((0, 1)), Some((1, 0)), Some((0, 2)))
    );
    assert_eq!(c.place(4), None);
    let (p, local) = c.place(2).unwrap();
    let q = c.poller(p).queue(local).unwrap();
    add(&q.requests, 5);
    add(&q.in_flight, 2);
    sub_one(&q.in_flight);
    add(&c.poller(1).rounds, 7);
    c.doorbell(2);
    c.doorbell(9); // no such queue: ignored
    let s = c.snapshot();
    assert_eq!(s.requests(), [0, 0, 5, 0]);
    assert_eq!(s.doorbells(), [0, 0, 1, 0]);
    assert_eq!(
        s.queues[2],
        QueueStats { queue: 2, poller: 1, requests: 5, doorbells: 1, in_flight: 1, ..Default::default() }
    );
    assert_eq!(s.pollers[1].queues, [2]);
    assert_eq!((s.pollers[1].rounds, s.pollers[1].core), (7, Some(1)));
    assert_eq!(s.pollers[0].queues, [0, 1, 3]);
    let json = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<DeviceStats>(&json).unwrap(), s);
}

#[test]
fn buckets_are_log_linear_and_contiguous() {
    assert_eq!(bucket_high(BUCKETS - 1), u64::MAX);
    for i in 0..BUCKETS - 1 {
        assert_eq!(bucket_of(bucket_low(i)), i, "bucket {i}");
        assert_eq!(bucket_of(bucket_high(i) - 1), i, "top of bucket {i}");
        assert!(bucket_high(i) > bucket_low(i));
        // Every bucket past the linear part is within 1/16 of its low end.
        assert!((bucket_high(i) - bucket_low(i)) * 16 <= bucket_low(i).max(16), "bucket {i}");
    }
    assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    assert_eq!(bucket_of(1 << 40), BUCKETS - 1);
}

#[test]
fn histograms_count_merge_and_subtract() {
    let profile = Profile { poller_cores: vec![0, 1], request_queues: 1, ..Default::default() };
    let c = DeviceCounters::new(&profile);
    let (p0, p1) = (c.poller(0), c.poller(1));
    let q = p1.queue(0);
    // 1000 reads of 1 us..1000 us on poller 1, 10 writes of 5 us on poller 0.
    for i in 1..=1000u64 {
        p1.count(q, Tally { class: OpClass::Read, errno: 0, bytes: 4096 });
        p1.class(OpClass::Read).time(i * 1000, 1);
    }
    p0.count(None, Tally { class: OpClass::Write, errno: 28, bytes: 0 });
    p0.class(OpClass::Write).time(5000, 10);
    p0.count(None, Tally { class: OpClass::Other, errno: 999, bytes: 0 });
    let s = c.snapshot();
    let read = s.class(OpClass::Read).unwrap();
    assert_eq!((read.requests, read.bytes, read.histogram.count), (1000, 4096 * 1000, 1000));
    assert_eq!(read.histogram.buckets.iter().map(|b| b.count).sum::<u64>(), 1000);
    assert_eq!(read.histogram.max_ns, 1_000_000);
    let l = read.latency;
    for (got, want) in
        [(l.p50_ns, 500_000u64), (l.p90_ns, 900_000), (l.p99_ns, 990_000), (l.p999_ns, 999_000)]
    {
        assert!(got >= want && got <= want + want / 16, "{got} for {want}");
    }
    assert_eq!(l.mean_ns, 500_500);
    assert_eq!(s.queues[1].bytes_read, 4096 * 1000);
    let write = s.class(OpClass::Write).unwrap();
    assert_eq!((write.requests, write.errors, write.histogram.count), (1, 1, 10));
    assert_eq!(s.errors, [ErrnoCount { errno: 0, count: 1 }, ErrnoCount { errno: 28, count: 1 }]);
    // A reset: the next snapshot less this one.
    p1.count(q, Tally { class: OpClass::Read, errno: 0, bytes: 10 });
    p1.class(OpClass::Read).time(2_000, 1);
    let d = c.snapshot().since(&s);
    let read = d.class(OpClass::Read).unwrap();
    assert_eq!((read.requests, read.bytes, read.histogram.count), (1, 10, 1));
    assert_eq!(read.histogram.buckets.len(), 1);
    assert!(read.latency.max_ns >= 2_000 && read.latency.max_ns < 2_000 + 2_000 / 16);
    assert!(d.errors.is_empty());
    assert_eq!(d.queues[1].bytes_read, 10);
    let json = serde_json::to_string(&d).unwrap();
    assert_eq!(serde_json::from_str::<DeviceStats>(&json).unwrap(), d);
    // A device that took this one over continues its counters: the sum, and back.
    let taker = DeviceCounters::new(&profile);
    taker.carry(c.snapshot());
    let t = taker.poller(1);
    t.count(t.queue(0), Tally { class: OpClass::Read, errno: 0, bytes: 7 });
    t.class(OpClass::Read).time(3_000, 1);
    let sum = taker.snapshot();
    let read = sum.class(OpClass::Read).unwrap();
    assert_eq!((read.requests, read.bytes, read.histogram.count), (1002, 4096 * 1000 + 17, 1002));
    assert_eq!(sum.queues[1].bytes_read, 4096 * 1000 + 17);
    assert_eq!(sum.errors, s.errors);
    assert_eq!(sum.since(&c.snapshot()).class(OpClass::Read).unwrap().requests, 1);
}

#[test]
fn client_state_is_published() {
    let c = DeviceCounters::new(&Profile::default());
    c.client_connected(true);
    c.driver_state(0xf, RING_PACKED | 1 << 32);
    c.reset_done();
    let s = c.client();
    assert!(s.connected && s.packed_ring);
    assert_eq!((s.connections, s.driver_status, s.resets), (1, 0xf, 1));
    c.client_connected(false);
    assert!(!c.client().connected);
}
