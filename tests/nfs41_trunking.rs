//! NFSv4.1 session trunking end to end: a device whose URL names two addresses of one ganesha
//! (`nfs://A,B/EXPORT?version=4.1`, each address a forwarder of the test's in front of the
//! server's port) spreads its pollers' connections over them; one address going away moves its
//! poller's calls to the other, with no request failing and the data on the export.

#[path = "../backend/tests/harness/ganesha.rs"]
mod ganesha;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ganesha::Ganesha;
use virtiofs_backend::nfs::{NfsFs, NfsOptions};
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::{FuseHandler, RunningDevice};
use virtiofs_tools::{DriverOptions, FsDriver};

const ROOT: u64 = 1;
const RDWR: u32 = libc::O_RDWR as u32;

/// A TCP forwarder to one address: another address of the same server, which the test can take
/// away (its listener closed and every connection through it shut).
struct Forward {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    /// Bytes carried, both ways.
    bytes: Arc<AtomicU64>,
}

impl Forward {
    fn start(to: SocketAddr) -> Forward {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), to)
    }

    /// A forwarder listening on `on` (where one that went away listened: the address is back).
    fn start_on(on: SocketAddr, to: SocketAddr) -> Forward {
        let listener = TcpListener::bind(on).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let bytes = Arc::new(AtomicU64::new(0));
        let (s, c, b) = (stop.clone(), conns.clone(), bytes.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(to) else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                {
                    let mut g = c.lock().unwrap();
                    g.push(client.try_clone().unwrap());
                    g.push(server.try_clone().unwrap());
                }
                for (mut from, mut into) in
                    [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    let b = b.clone();
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 256 << 10];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    b.fetch_add(n as u64, Ordering::Relaxed);
                                    if into.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = into.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Forward { addr, stop, conns, bytes }
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The address goes away: no new connection, and the ones through it are shut.
    fn kill(&self) {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        // The listener goes with its thread, at its next look.
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.kill();
    }
}

fn options(url: &str, dir: &tempfile::TempDir) -> NfsOptions {
    let mut opts = NfsOptions::new(url.parse().expect("the URL parses"));
    opts.function = dir.path().display().to_string();
    opts
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed)).collect()
}

#[test]
fn two_addresses_carry_the_pollers_and_one_going_away_moves_its_calls() {
    let g = Ganesha::start();
    let server = SocketAddr::from(([127, 0, 0, 1], g.nfs_port()));
    let (a, b) = (Forward::start(server), Forward::start(server));
    let url = format!("nfs://{},{}{}?version=4.1", a.addr, b.addr, g.export().display());
    let dir = tempfile::tempdir().unwrap();
    let fs = NfsFs::connect(options(&url, &dir)).expect("both addresses answer as one server");
    let socket = dir.path().join("nfs.sock");
    let handler = Arc::new(FuseHandler::new(fs));
    let profile = Profile { request_queues: 2, poller_cores: vec![0, 1], ..Default::default() };
    let device = RunningDevice::start_with(&socket, profile, handler.clone()).unwrap();
    let opts = DriverOptions { request_queues: 2, spread_requests: true, ..Default::default() };
    let mut d = FsDriver::connect(&socket, opts).unwrap();
    d.init().unwrap();

    let (a0, b0) = (a.bytes(), b.bytes());
    let (f, open) = d.create(ROOT, "trunk", 0o644, RDWR).unwrap();
    let block = 64 << 10;
    let mut expected = Vec::new();
    for i in 0..16u64 {
        let data = pattern(i as u8, block);
        d.write(f.nodeid, open.fh, i * block as u64, &data).unwrap();
        expected.extend_from_slice(&data);
    }
    assert!(d.completed_on(1) > 0 && d.completed_on(2) > 0, "both queues (pollers) served");
    let (a1, b1) = (a.bytes() - a0, b.bytes() - b0);
    assert!(
        a1 > 8 * block as u64 / 2 && b1 > 8 * block as u64 / 2,
        "each address carried a poller's writes: {a1} and {b1} bytes"
    );

    // The first address goes away under the device: its poller moves to the second.
    a.kill();
    for i in 16..32u64 {
        let data = pattern(i as u8, block);
        d.write(f.nodeid, open.fh, i * block as u64, &data).unwrap();
        expected.extend_from_slice(&data);
    }
    for i in 0..32u64 {
        let got = d.read(f.nodeid, open.fh, i * block as u64, block as u32).unwrap();
        assert!(got == expected[i as usize * block..(i as usize + 1) * block], "block {i} reads back");
    }
    let st = handler.server().filesystem().stats();
    eprintln!("after the move: {st:?}");
    assert!(st.address_moves >= 1, "a connection moved to the other address: {st:?}");

    // The first address comes back: within a probe interval (5 s) its poller's connection
    // goes back to it, and writes go through it again.
    let moved = st.address_moves;
    let a = Forward::start_on(a.addr, server);
    let t0 = std::time::Instant::now();
    let mut i = 32u64;
    while a.bytes() < block as u64 {
        assert!(t0.elapsed() < Duration::from_secs(15), "never back on the first address");
        let data = pattern(i as u8, block);
        d.write(f.nodeid, open.fh, i * block as u64, &data).unwrap();
        expected.extend_from_slice(&data);
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("back on the first address after {:?}", t0.elapsed());
    d.release(f.nodeid, open.fh).unwrap();
    let st = handler.server().filesystem().stats();
    assert!(st.address_moves > moved, "moved back: {st:?}");
    assert_eq!(st.errors, 0, "no request failed: {st:?}");
    assert!(std::fs::read(g.export().join("trunk")).unwrap() == expected, "every write is on the export");
    d.shutdown().unwrap();
    device.stop().unwrap();
}
