//! Protocol conformance: one test per vfio-user command and per malformed variant, each driving a
//! real server over a real socket and checking the errno in the reply, then that the same
//! connection still serves a valid request.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use vfio_bindings::bindings::vfio as vb;
use virtiofs_device::config::{Doorbells, Profile};
use virtiofs_device::memory::memfd;
use virtiofs_device::poller::{Engine, Outcome, RequestHandler};
use virtiofs_device::vfio_user::wire::{self, cmd, Header};
use virtiofs_device::vfio_user::{Server, StopHandle};
use vm_memory::{ByteValued, VolatileSlice};
use vmm_sys_util::eventfd::EventFd;

/// Answers every request by writing 4 bytes "done"; optionally blocks until released.
struct TestHandler {
    calls: AtomicUsize,
    gate: Mutex<Option<(Sender<()>, Receiver<()>)>>,
    /// When set, requests go through a [`HeldEngine`] that completes them only once released.
    engine_release: Option<Arc<AtomicBool>>,
    engine_submitted: Arc<AtomicUsize>,
    /// The next request makes the handler panic.
    panic_next: AtomicBool,
    /// When set, requests go through a [`WaitEngine`] that answers them only once released.
    wait_release: Option<Arc<AtomicBool>>,
    /// `Engine::cancel_waits` calls.
    cancelled: Arc<AtomicUsize>,
    /// `RequestHandler::reset` calls.
    resets: AtomicUsize,
}

/// An engine whose requests all wait for an outside event ([`Outcome::Wait`]): it keeps only
/// their ids and answers "wait" once the test releases them.
struct WaitEngine {
    waiting: Vec<u64>,
    release: Arc<AtomicBool>,
    submitted: Arc<AtomicUsize>,
    cancelled: Arc<AtomicUsize>,
}

impl Engine for WaitEngine {
    fn submit(&mut self, id: u64, _q: u16, _r: &[VolatileSlice<'_>], _w: &[VolatileSlice<'_>]) -> Outcome {
        self.waiting.push(id);
        self.submitted.fetch_add(1, Ordering::SeqCst);
        Outcome::Wait
    }
    fn poll(&mut self, _done: &mut dyn FnMut(u64, u32)) -> usize {
        0
    }
    fn in_flight(&self) -> usize {
        0
    }
    fn poll_waits(&mut self, answer: &mut dyn FnMut(u64, &[u8])) -> usize {
        if !self.release.load(Ordering::SeqCst) {
            return 0;
        }
        let n = self.waiting.len();
        for id in self.waiting.drain(..) {
            answer(id, b"wait");
        }
        n
    }
    fn cancel_waits(&mut self) {
        if !self.waiting.is_empty() {
            self.cancelled.fetch_add(self.waiting.len(), Ordering::SeqCst);
        }
        self.waiting.clear();
    }
}

/// An asynchronous engine that writes its reply at once but reports completion only after the
/// test releases it.
struct HeldEngine {
    pending: Vec<(u64, u32)>,
    release: Arc<AtomicBool>,
    submitted: Arc<AtomicUsize>,
}

impl Engine for HeldEngine {
    fn submit(&mut self, id: u64, _q: u16, _r: &[VolatileSlice<'_>], w: &[VolatileSlice<'_>]) -> Outcome {
        w[0].copy_from(b"asyn");
        self.pending.push((id, 4));
        self.submitted.fetch_add(1, Ordering::SeqCst);
        Outcome::Pending
    }
    fn poll(&mut self, done: &mut dyn FnMut(u64, u32)) -> usize {
        if !self.release.load(Ordering::SeqCst) {
            return 0;
        }
        let n = self.pending.len();
        for (id, len) in self.pending.drain(..) {
            done(id, len);
        }
        n
    }
    fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

impl RequestHandler for TestHandler {
    fn handle(&self, _q: u16, readable: &[VolatileSlice<'_>], writable: &[VolatileSlice<'_>]) -> u32 {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.panic_next.swap(false, Ordering::SeqCst) {
            panic!("injected handler bug");
        }
        if let Some((entered, release)) = &*self.gate.lock().unwrap() {
            entered.send(()).unwrap();
            let _ = release.recv_timeout(Duration::from_secs(10));
        }
        let _ = readable;
        match writable.first() {
            Some(w) if w.len() >= 4 => {
                w.copy_from(b"done");
                4
            }
            _ => 0,
        }
    }

    fn engine(&self, _poller: usize) -> Option<Box<dyn Engine>> {
        if let Some(release) = self.wait_release.clone() {
            return Some(Box::new(WaitEngine {
                waiting: Vec::new(),
                release,
                submitted: self.engine_submitted.clone(),
                cancelled: self.cancelled.clone(),
            }));
        }
        let release = self.engine_release.clone()?;
        Some(Box::new(HeldEngine { pending: Vec::new(), release, submitted: self.engine_submitted.clone() }))
    }

    fn reset(&self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
    }
}

struct Dev {
    dir: tempfile::TempDir,
    stop: StopHandle,
    join: Option<JoinHandle<()>>,
    handler: Arc<TestHandler>,
}

impl Dev {
    fn start() -> Dev {
        Dev::start_with(None)
    }
    fn start_with(engine_release: Option<Arc<AtomicBool>>) -> Dev {
        Dev::start_engines(engine_release, None)
    }
    fn start_engines(engine_release: Option<Arc<AtomicBool>>, wait_release: Option<Arc<AtomicBool>>) -> Dev {
        let profile =
            Profile { request_queues: 2, queue_size: 16, doorbells: Doorbells::Shared, ..Profile::default() };
        Dev::start_profile(engine_release, wait_release, profile)
    }
    fn start_profile(
        engine_release: Option<Arc<AtomicBool>>,
        wait_release: Option<Arc<AtomicBool>>,
        profile: Profile,
    ) -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let handler = Arc::new(TestHandler {
            calls: AtomicUsize::new(0),
            gate: Mutex::new(None),
            engine_release,
            engine_submitted: Arc::new(AtomicUsize::new(0)),
            panic_next: AtomicBool::new(false),
            wait_release,
            cancelled: Arc::new(AtomicUsize::new(0)),
            resets: AtomicUsize::new(0),
        });
        let server = Server::bind(&dir.path().join("dev.sock"), &profile, handler.clone()).unwrap();
        let stop = server.stop_handle();
        let join = std::thread::spawn(move || {
            server.run().unwrap();
        });
        Dev { dir, stop, join: Some(join), handler }
    }
    fn path(&self) -> PathBuf {
        self.dir.path().join("dev.sock")
    }
    fn connect(&self) -> Client {
        let s = UnixStream::connect(self.path()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Client { s, id: 0 }
    }
    fn client(&self) -> Client {
        let mut c = self.connect();
        c.version();
        c
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(j) = self.join.take() {
            j.join().unwrap();
        }
    }
}

struct Client {
    s: UnixStream,
    id: u16,
}

#[derive(Debug)]
struct Reply {
    hdr: Header,
    payload: Vec<u8>,
    fds: Vec<File>,
}

impl Reply {
    fn errno(&self) -> i32 {
        assert_eq!(self.hdr.flags & 0xf, wire::FLAG_REPLY);
        if self.hdr.flags & wire::FLAG_ERROR != 0 {
            assert_ne!(self.hdr.error, 0, "error replies must carry an errno");
            self.hdr.error as i32
        } else {
            0
        }
    }
    fn ok(self) -> Reply {
        assert_eq!(self.errno(), 0, "unexpected error reply {:?}", self.hdr);
        self
    }
}

impl Client {
    fn send_raw(&mut self, bytes: &[u8], fds: &[RawFd]) {
        let n = wire::send_with_fds(&self.s, &[bytes], fds).unwrap();
        assert_eq!(n, bytes.len());
    }
    fn msg(&mut self, command: u16, flags: u32, payload: &[u8]) -> (u16, Vec<u8>) {
        self.id = self.id.wrapping_add(1);
        let h = Header { msg_id: self.id, command, msg_size: (16 + payload.len()) as u32, flags, error: 0 };
        let mut b = h.as_slice().to_vec();
        b.extend_from_slice(payload);
        (self.id, b)
    }
    fn recv(&mut self) -> Reply {
        let mut h = [0u8; 16];
        let mut fds = Vec::new();
        let mut got = 0;
        while got < 16 {
            let r = recv_blocking(&self.s, &mut h[got..], &mut fds);
            assert!(r > 0, "server closed the connection");
            got += r;
        }
        let hdr: Header = wire::read_obj(&h).unwrap();
        let mut payload = vec![0u8; hdr.msg_size as usize - 16];
        self.s.read_exact(&mut payload).unwrap();
        Reply { hdr, payload, fds }
    }
    fn call_fds(&mut self, command: u16, payload: &[u8], fds: &[RawFd]) -> Reply {
        let (id, b) = self.msg(command, 0, payload);
        self.send_raw(&b, fds);
        let r = self.recv();
        assert_eq!((r.hdr.msg_id, r.hdr.command), (id, command), "reply matches request");
        r
    }
    fn call(&mut self, command: u16, payload: &[u8]) -> Reply {
        self.call_fds(command, payload, &[])
    }
    fn version(&mut self) -> Reply {
        let mut p = wire::Version { major: 0, minor: 1 }.as_slice().to_vec();
        p.extend_from_slice(
            br#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096}}"#,
        );
        p.push(0);
        self.call(cmd::VERSION, &p).ok()
    }
    /// A valid request that must always work: DEVICE_GET_INFO.
    fn still_serves(&mut self) {
        let r = self
            .call(cmd::DEVICE_GET_INFO, wire::DeviceInfo { argsz: 16, ..Default::default() }.as_slice())
            .ok();
        let info: wire::DeviceInfo = wire::read_obj(&r.payload).unwrap();
        assert_eq!(info.num_regions, vb::VFIO_PCI_NUM_REGIONS);
    }
    fn region_read(&mut self, region: u32, offset: u64, count: u32) -> Reply {
        self.call(cmd::REGION_READ, wire::RegionAccess { offset, region, count }.as_slice())
    }
    fn read32(&mut self, region: u32, offset: u64) -> u32 {
        let r = self.region_read(region, offset, 4).ok();
        u32::from_le_bytes(r.payload[16..20].try_into().unwrap())
    }
    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Reply {
        let mut p = wire::RegionAccess { offset, region, count: data.len() as u32 }.as_slice().to_vec();
        p.extend_from_slice(data);
        self.call(cmd::REGION_WRITE, &p)
    }
    fn dma_map(&mut self, address: u64, size: u64, file: Option<&File>) -> Reply {
        let m = wire::DmaMap { argsz: 32, flags: 3, offset: 0, address, size };
        let fds: Vec<RawFd> = file.iter().map(|f| f.as_raw_fd()).collect();
        self.call_fds(cmd::DMA_MAP, m.as_slice(), &fds)
    }
    fn dma_unmap(&mut self, address: u64, size: u64, flags: u32) -> Reply {
        self.call(cmd::DMA_UNMAP, wire::DmaUnmap { argsz: 24, flags, address, size }.as_slice())
    }
    fn set_irqs(&mut self, flags: u32, start: u32, count: u32, data: &[u8], fds: &[RawFd]) -> Reply {
        let mut p = wire::IrqSet {
            argsz: (20 + data.len()) as u32,
            flags,
            index: vb::VFIO_PCI_MSIX_IRQ_INDEX,
            start,
            count,
        }
        .as_slice()
        .to_vec();
        p.extend_from_slice(data);
        self.call_fds(cmd::DEVICE_SET_IRQS, &p, fds)
    }
}

fn recv_blocking(s: &UnixStream, buf: &mut [u8], fds: &mut Vec<File>) -> usize {
    // The wire helper uses MSG_DONTWAIT; retry until data arrives or the read timeout passes.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match wire::recv_with_fds(s, buf, fds) {
            Ok(r) => return r.bytes,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
}

fn errno(r: Reply) -> i32 {
    r.errno()
}

#[test]
fn version_negotiates_capabilities() {
    let dev = Dev::start();
    let mut c = dev.connect();
    let r = c.version();
    let v: wire::Version = wire::read_obj(&r.payload).unwrap();
    assert_eq!((v.major, v.minor), (0, 1));
    let json = std::str::from_utf8(&r.payload[4..r.payload.len() - 1]).unwrap();
    let value: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(value["capabilities"]["max_data_xfer_size"], 1048576);
    assert_eq!(value["capabilities"]["max_msg_fds"], 16);
    assert!(value["capabilities"].get("max_dma_maps").is_none(), "only capabilities the client proposed");
    assert_eq!(*r.payload.last().unwrap(), 0, "JSON is NUL-terminated");
    // A second VERSION on the same connection is refused.
    let p = wire::Version { major: 0, minor: 1 }.as_slice().to_vec();
    assert_eq!(errno(c.call(cmd::VERSION, &p)), libc::EINVAL);
    c.still_serves();
}

#[test]
fn version_without_json_is_accepted() {
    let dev = Dev::start();
    let mut c = dev.connect();
    c.call(cmd::VERSION, wire::Version { major: 0, minor: 0 }.as_slice()).ok();
    c.still_serves();
}

#[test]
fn malformed_version_gets_einval_and_retry_works() {
    let dev = Dev::start();
    let mut c = dev.connect();
    for bad in
        [&b"{not json"[..], b"{\"capabilities\":{\"max_msg_fds\":\"x\"}}", b"[1,2]", b"{\"capabilities\":3}"]
    {
        let mut p = wire::Version { major: 0, minor: 1 }.as_slice().to_vec();
        p.extend_from_slice(bad);
        p.push(0);
        assert_eq!(errno(c.call(cmd::VERSION, &p)), libc::EINVAL, "{}", String::from_utf8_lossy(bad));
    }
    // Not NUL-terminated, and a payload too short for major/minor.
    let mut p = wire::Version { major: 0, minor: 1 }.as_slice().to_vec();
    p.extend_from_slice(b"{}");
    assert_eq!(errno(c.call(cmd::VERSION, &p)), libc::EINVAL);
    assert_eq!(errno(c.call(cmd::VERSION, &[0])), libc::EINVAL);
    assert_eq!(errno(c.call(cmd::VERSION, wire::Version { major: 1, minor: 0 }.as_slice())), libc::ENOTSUP);
    c.version();
    c.still_serves();
}

#[test]
fn commands_before_version_are_refused() {
    let dev = Dev::start();
    let mut c = dev.connect();
    let r = c.call(cmd::DEVICE_GET_INFO, wire::DeviceInfo { argsz: 16, ..Default::default() }.as_slice());
    assert_eq!(errno(r), libc::EINVAL);
    c.version();
    c.still_serves();
}

#[test]
fn short_header_size_gets_einval() {
    let dev = Dev::start();
    let mut c = dev.client();
    let h = Header { msg_id: 77, command: cmd::DEVICE_GET_INFO, msg_size: 8, flags: 0, error: 0 };
    c.send_raw(h.as_slice(), &[]);
    let r = c.recv();
    assert_eq!((r.hdr.msg_id, r.errno()), (77, libc::EINVAL));
    c.still_serves();
}

#[test]
fn truncated_header_then_disconnect_and_reconnect() {
    let dev = Dev::start();
    {
        let mut c = dev.client();
        let (_, b) =
            c.msg(cmd::DEVICE_GET_INFO, 0, wire::DeviceInfo { argsz: 16, ..Default::default() }.as_slice());
        c.send_raw(&b[..10], &[]);
    } // dropped mid-request
    let mut c = dev.client();
    c.still_serves();
}

#[test]
fn size_field_disagreeing_with_payload() {
    let dev = Dev::start();
    let mut c = dev.client();
    // REGION_WRITE whose count says 8 but carries 4 bytes.
    let mut p = wire::RegionAccess { offset: 0x3c, region: 7, count: 8 }.as_slice().to_vec();
    p.extend_from_slice(&[1, 2, 3, 4]);
    assert_eq!(errno(c.call(cmd::REGION_WRITE, &p)), libc::EINVAL);
    // DMA_MAP with a short payload, and with argsz wrong.
    assert_eq!(errno(c.call(cmd::DMA_MAP, &[0u8; 24])), libc::EINVAL);
    let m = wire::DmaMap { argsz: 16, flags: 3, offset: 0, address: 0, size: 4096 };
    assert_eq!(errno(c.call(cmd::DMA_MAP, m.as_slice())), libc::EINVAL);
    // REGION_READ with trailing garbage.
    let mut p = wire::RegionAccess { offset: 0, region: 7, count: 4 }.as_slice().to_vec();
    p.push(9);
    assert_eq!(errno(c.call(cmd::REGION_READ, &p)), libc::EINVAL);
    // GET_REGION_INFO with argsz smaller than the struct.
    let ri = wire::RegionInfo { argsz: 8, index: 7, ..Default::default() };
    assert_eq!(errno(c.call(cmd::DEVICE_GET_REGION_INFO, ri.as_slice())), libc::EINVAL);
    c.still_serves();
}

#[test]
fn unknown_and_unsupported_commands() {
    let dev = Dev::start();
    let mut c = dev.client();
    assert_eq!(errno(c.call(99, &[1, 2, 3])), libc::ENOSYS);
    assert_eq!(errno(c.call(cmd::REGION_WRITE_MULTI, &[0u8; 8])), libc::ENOTSUP);
    assert_eq!(errno(c.call(cmd::DEVICE_RESET, &[0u8; 4])), libc::EINVAL);
    c.still_serves();
}

#[test]
fn device_get_info() {
    let dev = Dev::start();
    let mut c = dev.client();
    let r =
        c.call(cmd::DEVICE_GET_INFO, wire::DeviceInfo { argsz: 16, ..Default::default() }.as_slice()).ok();
    let info: wire::DeviceInfo = wire::read_obj(&r.payload).unwrap();
    assert_eq!(info.flags, vb::VFIO_DEVICE_FLAGS_RESET | vb::VFIO_DEVICE_FLAGS_PCI);
    assert_eq!((info.num_regions, info.num_irqs), (9, 5));
}

#[test]
fn region_info_with_sparse_mmap_and_fd() {
    let dev = Dev::start();
    let mut c = dev.client();
    let ri = |index, argsz| wire::RegionInfo { argsz, index, ..Default::default() };
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, ri(7, 32).as_slice()).ok();
    let info: wire::RegionInfo = wire::read_obj(&r.payload).unwrap();
    assert_eq!(
        (info.size, info.flags),
        (256, vb::VFIO_REGION_INFO_FLAG_READ | vb::VFIO_REGION_INFO_FLAG_WRITE)
    );
    // BAR4, asked with too small a buffer: argsz tells the full size, no caps, no fd.
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, ri(4, 32).as_slice()).ok();
    let info: wire::RegionInfo = wire::read_obj(&r.payload).unwrap();
    assert_eq!((info.argsz, r.payload.len(), r.fds.len()), (64, 32, 0));
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, ri(4, 64).as_slice()).ok();
    let info: wire::RegionInfo = wire::read_obj(&r.payload).unwrap();
    assert_eq!(info.size, 0x4000);
    assert_ne!(info.flags & vb::VFIO_REGION_INFO_FLAG_MMAP, 0);
    assert_eq!(info.cap_offset, 32);
    let cap: wire::SparseMmapCap = wire::read_obj(&r.payload[32..]).unwrap();
    let area: wire::SparseArea = wire::read_obj(&r.payload[48..]).unwrap();
    assert_eq!((cap.id, cap.nr_areas, area.offset, area.size), (1, 1, 0x3000, 0x1000));
    assert_eq!(r.fds.len(), 1, "the notify area's fd comes with the reply");
    assert!(r.fds[0].metadata().unwrap().len() >= 0x4000);
    // BAR1 (MSI-X) exists, BAR0 does not.
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, ri(1, 32).as_slice()).ok();
    assert_eq!(wire::read_obj::<wire::RegionInfo>(&r.payload).unwrap().size, 0x1000);
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, ri(0, 32).as_slice()).ok();
    assert_eq!(wire::read_obj::<wire::RegionInfo>(&r.payload).unwrap().size, 0);
    assert_eq!(errno(c.call(cmd::DEVICE_GET_REGION_INFO, ri(9, 32).as_slice())), libc::EINVAL);
    c.still_serves();
}

#[test]
fn region_info_without_mmap_when_doorbells_come_through_the_socket() {
    let profile =
        Profile { request_queues: 2, queue_size: 16, doorbells: Doorbells::Socket, ..Profile::default() };
    let dev = Dev::start_profile(None, None, profile);
    let mut c = dev.client();
    let ri = wire::RegionInfo { argsz: 64, index: 4, ..Default::default() };
    let r = c.call(cmd::DEVICE_GET_REGION_INFO, ri.as_slice()).ok();
    let info: wire::RegionInfo = wire::read_obj(&r.payload).unwrap();
    assert_eq!(info.size, 0x4000);
    assert_eq!(info.flags, vb::VFIO_REGION_INFO_FLAG_READ | vb::VFIO_REGION_INFO_FLAG_WRITE, "not mmappable");
    assert_eq!((info.argsz, info.cap_offset, r.payload.len(), r.fds.len()), (32, 0, 32, 0));
    c.still_serves();
}

#[test]
fn irq_info() {
    let dev = Dev::start();
    let mut c = dev.client();
    let ii = |index| wire::IrqInfo { argsz: 16, index, ..Default::default() };
    let r = c.call(cmd::DEVICE_GET_IRQ_INFO, ii(vb::VFIO_PCI_MSIX_IRQ_INDEX).as_slice()).ok();
    let info: wire::IrqInfo = wire::read_obj(&r.payload).unwrap();
    assert_eq!(info.count, 4, "config + hiprio + 2 request queues");
    assert_ne!(info.flags & vb::VFIO_IRQ_INFO_EVENTFD, 0);
    let r = c.call(cmd::DEVICE_GET_IRQ_INFO, ii(vb::VFIO_PCI_MSI_IRQ_INDEX).as_slice()).ok();
    assert_eq!(wire::read_obj::<wire::IrqInfo>(&r.payload).unwrap().count, 0);
    assert_eq!(errno(c.call(cmd::DEVICE_GET_IRQ_INFO, ii(5).as_slice())), libc::EINVAL);
    c.still_serves();
}

#[test]
fn region_read_write_config_space() {
    let dev = Dev::start();
    let mut c = dev.client();
    assert_eq!(c.read32(7, 0), 0x105a_1af4);
    let r = c.region_write(7, 0x3c, &[0x0b]).ok();
    assert_eq!(r.payload.len(), 16, "write reply echoes offset/region/count");
    assert_eq!(c.read32(7, 0x3c) & 0xff, 0x0b);
    // Bad region, bad offset, offset overflow, oversized transfer.
    assert_eq!(errno(c.region_read(2, 0, 4)), libc::EINVAL);
    assert_eq!(errno(c.region_read(7, 254, 4)), libc::EINVAL);
    assert_eq!(errno(c.region_read(7, u64::MAX - 1, 4)), libc::EINVAL);
    assert_eq!(errno(c.region_read(12, 0, 4)), libc::EINVAL);
    assert_eq!(errno(c.region_read(4, 0, 2 << 20)), libc::E2BIG);
    assert_eq!(errno(c.region_read(4, 0x3ffe, 4)), libc::EINVAL, "past the end of BAR4 (notify area)");
    assert_eq!(errno(c.region_read(4, 0x4000, 4)), libc::EINVAL);
    assert_eq!(c.read32(4, 0x3000), 0, "notify area reads as zero");
    assert_eq!(errno(c.region_write(7, 0x100, &[1])), libc::EINVAL);
    c.still_serves();
}

#[test]
fn oversized_message_is_drained() {
    let dev = Dev::start();
    let mut c = dev.client();
    let data = vec![0xa5u8; 2 << 20];
    let r = c.region_write(4, 0, &data);
    assert_eq!(r.errno(), libc::E2BIG);
    c.still_serves();
    assert_eq!(c.read32(7, 0), 0x105a_1af4);
}

#[test]
fn posted_writes_get_no_reply_even_on_error() {
    let dev = Dev::start();
    let mut c = dev.client();
    let mut p = wire::RegionAccess { offset: 0x3c, region: 7, count: 1 }.as_slice().to_vec();
    p.push(0x42);
    let (_, good) = c.msg(cmd::REGION_WRITE, wire::FLAG_NO_REPLY, &p);
    c.send_raw(&good, &[]);
    let mut bad = wire::RegionAccess { offset: 0, region: 3, count: 1 }.as_slice().to_vec();
    bad.push(1);
    let (_, bad) = c.msg(cmd::REGION_WRITE, wire::FLAG_NO_REPLY, &bad);
    c.send_raw(&bad, &[]);
    // The next reply is for this read, not for the posted writes.
    assert_eq!(c.read32(7, 0x3c) & 0xff, 0x42);
}

#[test]
fn dma_map_unmap_rules() {
    let dev = Dev::start();
    let mut c = dev.client();
    let mem = memfd("guest", 0x100000).unwrap();
    c.dma_map(0, 0x100000, Some(&mem)).ok();
    c.dma_map(0xfffc0000, 0x40000, None).ok(); // fd-less ROM window
    assert_eq!(errno(c.dma_map(0x80000, 0x1000, None)), libc::EEXIST);
    assert_eq!(errno(c.dma_map(0x200000, 0, None)), libc::EINVAL);
    assert_eq!(errno(c.dma_map(0x200000, 0x200000, Some(&mem))), libc::EINVAL, "file too small");
    // Two descriptors for one window.
    let m = wire::DmaMap { argsz: 32, flags: 3, offset: 0, address: 0x400000, size: 0x1000 };
    assert_eq!(
        errno(c.call_fds(cmd::DMA_MAP, m.as_slice(), &[mem.as_raw_fd(), mem.as_raw_fd()])),
        libc::EINVAL
    );
    assert_eq!(errno(c.dma_unmap(0x1000, 0x1000, 0)), libc::EINVAL, "splits a window");
    assert_eq!(errno(c.dma_unmap(0x500000, 0x1000, 0)), libc::ENOENT);
    assert_eq!(errno(c.dma_unmap(0, 0x1000, 1)), libc::ENOTSUP, "dirty bitmap");
    let r = c.dma_unmap(0, 0x100000, 0).ok();
    let u: wire::DmaUnmap = wire::read_obj(&r.payload).unwrap();
    assert_eq!((u.address, u.size), (0, 0x100000), "reply echoes the entry");
    c.dma_map(0, 0x80000, Some(&mem)).ok(); // arbitrary re-map
    assert_eq!(errno(c.dma_unmap(0, 0, 0x7)), libc::EINVAL);
    c.dma_unmap(0, 0, vb::VFIO_DMA_UNMAP_FLAG_ALL).ok();
    c.dma_map(0, 0x100000, Some(&mem)).ok();
    c.still_serves();
}

#[test]
fn unexpected_and_missing_fds() {
    let dev = Dev::start();
    let mut c = dev.client();
    let f = memfd("x", 4096).unwrap();
    let r = c.call_fds(
        cmd::DEVICE_GET_INFO,
        wire::DeviceInfo { argsz: 16, ..Default::default() }.as_slice(),
        &[f.as_raw_fd()],
    );
    assert_eq!(r.errno(), libc::EINVAL);
    let trig = vb::VFIO_IRQ_SET_DATA_EVENTFD | vb::VFIO_IRQ_SET_ACTION_TRIGGER;
    let e = EventFd::new(0).unwrap();
    assert_eq!(errno(c.set_irqs(trig, 0, 2, &[], &[e.as_raw_fd()])), libc::EINVAL, "one fd for two vectors");
    assert_eq!(errno(c.set_irqs(trig, 0, 1, &[], &[f.as_raw_fd()])), libc::EINVAL, "not an eventfd");
    assert_eq!(
        errno(c.set_irqs(trig, 3, 2, &[], &[e.as_raw_fd(), e.as_raw_fd()])),
        libc::EINVAL,
        "past the last vector"
    );
    // More descriptors than max_msg_fds.
    let many: Vec<RawFd> = vec![e.as_raw_fd(); 20];
    let m = wire::DmaMap { argsz: 32, flags: 3, offset: 0, address: 0, size: 0x1000 };
    let (_, b) = c.msg(cmd::DMA_MAP, 0, m.as_slice());
    let sent = wire::send_with_fds(&c.s, &[&b], &many);
    if sent.is_ok() {
        assert_eq!(c.recv().errno(), libc::EINVAL);
    }
    c.still_serves();
}

#[test]
fn set_irqs_assign_trigger_mask_disable() {
    let dev = Dev::start();
    let mut c = dev.client();
    let e0 = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let e1 = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let trig_fd = vb::VFIO_IRQ_SET_DATA_EVENTFD | vb::VFIO_IRQ_SET_ACTION_TRIGGER;
    c.set_irqs(trig_fd, 0, 2, &[], &[e0.as_raw_fd(), e1.as_raw_fd()]).ok();
    // Client-side trigger (DATA_NONE) reaches the eventfds.
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 2, &[], &[]).ok();
    assert_eq!((e0.read().unwrap(), e1.read().unwrap()), (1, 1));
    // DATA_BOOL selects vectors.
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_BOOL | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 2, &[0, 1], &[]).ok();
    assert!(e0.read().is_err());
    assert_eq!(e1.read().unwrap(), 1);
    // Masked: pends; unmask delivers.
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_MASK, 1, 1, &[], &[]).ok();
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 1, 1, &[], &[]).ok();
    assert!(e1.read().is_err());
    let pba = c.region_read(1, 0x800, 1).ok();
    assert_eq!(pba.payload[16] & 0b10, 0b10, "pending bit visible in the PBA");
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_UNMASK, 1, 1, &[], &[]).ok();
    assert_eq!(e1.read().unwrap(), 1);
    // Per-vector disable (eventfd with no fds), then count 0 disables everything.
    c.set_irqs(trig_fd, 0, 1, &[], &[]).ok();
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 2, &[], &[]).ok();
    assert!(e0.read().is_err());
    assert_eq!(e1.read().unwrap(), 1);
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 0, &[], &[]).ok();
    c.set_irqs(vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 2, &[], &[]).ok();
    assert!(e1.read().is_err());
    // Malformed: two data kinds, bool array of the wrong length, argsz too small.
    let both = vb::VFIO_IRQ_SET_DATA_NONE | vb::VFIO_IRQ_SET_DATA_BOOL | vb::VFIO_IRQ_SET_ACTION_TRIGGER;
    assert_eq!(errno(c.set_irqs(both, 0, 1, &[], &[])), libc::EINVAL);
    assert_eq!(
        errno(c.set_irqs(vb::VFIO_IRQ_SET_DATA_BOOL | vb::VFIO_IRQ_SET_ACTION_TRIGGER, 0, 2, &[1], &[])),
        libc::EINVAL
    );
    let p = wire::IrqSet { argsz: 8, flags: trig_fd, index: 2, start: 0, count: 1 };
    assert_eq!(errno(c.call(cmd::DEVICE_SET_IRQS, p.as_slice())), libc::EINVAL);
    c.still_serves();
}

#[test]
fn device_reset_returns_registers_to_reset_state() {
    let dev = Dev::start();
    let mut c = dev.client();
    c.region_write(4, 0x14, &[3]).ok(); // ACKNOWLEDGE | DRIVER
    assert_eq!(c.read32(4, 0x14) & 0xff, 3);
    c.call(cmd::DEVICE_RESET, &[]).ok();
    assert_eq!(c.read32(4, 0x14) & 0xff, 0);
    c.still_serves();
}

#[test]
fn second_client_is_refused_while_one_is_served() {
    let dev = Dev::start();
    let mut c = dev.client();
    let mut other = UnixStream::connect(dev.path()).unwrap();
    other.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(other.read(&mut b).unwrap_or(0), 0, "second connection is closed");
    c.still_serves();
    drop(c);
    // After the first client leaves, a new one is served.
    let mut c = dev.client();
    c.still_serves();
}

// ---- a minimal virtio driver, enough to prove the data path and DMA_UNMAP's wait ----

const RING: u64 = 0x10000; // desc table; avail at +0x1000; used at +0x2000
const BUF: u64 = 0x20000;

fn activate(c: &mut Client, mem: &File, e: &EventFd) {
    c.dma_map(0, 0x100000, Some(mem)).ok();
    let trig_fd = vb::VFIO_IRQ_SET_DATA_EVENTFD | vb::VFIO_IRQ_SET_ACTION_TRIGGER;
    c.set_irqs(trig_fd, 2, 1, &[], &[e.as_raw_fd()]).ok();
    let w = |c: &mut Client, off: u64, v: &[u8]| {
        c.region_write(4, off, v).ok();
    };
    w(c, 0x14, &[0]);
    w(c, 0x14, &[3]);
    w(c, 0x08, &1u32.to_le_bytes());
    w(c, 0x0c, &1u32.to_le_bytes()); // VERSION_1
    w(c, 0x14, &[0xb]);
    assert_eq!(c.read32(4, 0x14) & 0xff, 0xb);
    w(c, 0x16, &1u16.to_le_bytes()); // queue 1
    w(c, 0x18, &16u16.to_le_bytes());
    w(c, 0x1a, &2u16.to_le_bytes());
    w(c, 0x20, &RING.to_le_bytes());
    w(c, 0x28, &(RING + 0x1000).to_le_bytes());
    w(c, 0x30, &(RING + 0x2000).to_le_bytes());
    w(c, 0x1c, &1u16.to_le_bytes());
    w(c, 0x14, &[0xf]);
}

fn post(mem: &File, slot: u16, head: u16) {
    use std::os::unix::fs::FileExt;
    let d = |i: u16, addr: u64, len: u32, flags: u16, next: u16| {
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_all_at(&raw, RING + 16 * u64::from(i)).unwrap();
    };
    d(head, BUF, 16, 1, head + 1);
    d(head + 1, BUF + 0x1000 * u64::from(head), 64, 2, 0);
    mem.write_all_at(&head.to_le_bytes(), RING + 0x1000 + 4 + 2 * u64::from(slot)).unwrap();
    mem.write_all_at(&(slot + 1).to_le_bytes(), RING + 0x1000 + 2).unwrap();
}

fn used_idx(mem: &File) -> u16 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 2];
    mem.read_exact_at(&mut b, RING + 0x2000 + 2).unwrap();
    u16::from_le_bytes(b)
}

#[test]
fn requests_are_served_and_interrupt() {
    let dev = Dev::start();
    let mut c = dev.client();
    let mem = memfd("guest", 0x100000).unwrap();
    let e = EventFd::new(0).unwrap();
    activate(&mut c, &mem, &e);
    post(&mem, 0, 0);
    assert_eq!(e.read().unwrap(), 1, "MSI-X eventfd signalled");
    assert_eq!(used_idx(&mem), 1);
    let mut reply = [0u8; 4];
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut reply, BUF).unwrap();
    assert_eq!(&reply, b"done");
    assert_eq!(dev.handler.calls.load(Ordering::SeqCst), 1);
}

#[test]
fn corrupt_avail_ring_sets_needs_reset() {
    let dev = Dev::start();
    let mut c = dev.client();
    let mem = memfd("guest", 0x100000).unwrap();
    let e = EventFd::new(0).unwrap();
    activate(&mut c, &mem, &e);
    std::os::unix::fs::FileExt::write_all_at(&mem, &100u16.to_le_bytes(), RING + 0x1000 + 2).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c.read32(4, 0x14) & 0x40 == 0 {
        assert!(std::time::Instant::now() < deadline, "DEVICE_NEEDS_RESET never set");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Reset and the device is usable again.
    c.region_write(4, 0x14, &[0]).ok();
    assert_eq!(c.read32(4, 0x14) & 0xff, 0);
    c.still_serves();
}

#[test]
fn dma_unmap_waits_for_in_flight_requests() {
    let dev = Dev::start();
    let (entered_tx, entered_rx) = channel();
    let (release_tx, release_rx) = channel();
    *dev.handler.gate.lock().unwrap() = Some((entered_tx, release_rx));
    let mut c = dev.client();
    let mem = memfd("guest", 0x100000).unwrap();
    let e = EventFd::new(0).unwrap();
    activate(&mut c, &mem, &e);
    post(&mem, 0, 0);
    entered_rx.recv_timeout(Duration::from_secs(10)).expect("request reached the handler");
    let (_, b) = c.msg(
        cmd::DMA_UNMAP,
        0,
        wire::DmaUnmap { argsz: 24, flags: 0, address: 0, size: 0x100000 }.as_slice(),
    );
    c.send_raw(&b, &[]);
    // While the handler holds the request, the unmap must not be acknowledged.
    std::thread::sleep(Duration::from_millis(300));
    let early = wire::recv_with_fds(&c.s, &mut [0u8; 16], &mut Vec::new());
    assert!(
        early.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "DMA_UNMAP acknowledged while a request was in flight: {early:?}"
    );
    release_tx.send(()).unwrap();
    let r = c.recv();
    assert_eq!((r.hdr.command, r.errno()), (cmd::DMA_UNMAP, 0));
    assert_eq!(used_idx(&mem), 1, "the request completed before the unmap was acknowledged");
}

/// Deterministic pseudo-random bytes (xorshift), so a failure replays.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn garbage_never_kills_the_server() {
    let dev = Dev::start();
    for seed in 1..=8u64 {
        // Unframed noise after a valid VERSION.
        let c = dev.client();
        let _ = wire::send_with_fds(&c.s, &[&noise(seed, 4096)], &[]);
        drop(c);
        // Framed messages with random commands and payloads (sizes kept honest so the stream
        // stays framed): each gets a reply, and the connection still serves.
        let mut c = dev.client();
        for i in 0..64u64 {
            let body = noise(seed * 1000 + i, (i as usize * 7) % 200);
            let command = (body.first().copied().unwrap_or(0) % 20) as u16;
            if command == cmd::VERSION || command == cmd::DMA_UNMAP || command == cmd::DEVICE_RESET {
                continue;
            }
            let r = c.call(command, &body);
            let _ = r.errno();
        }
        c.still_serves();
    }
}

#[test]
fn pipelined_maps_keep_descriptors_with_their_message() {
    // QEMU sends DMA_MAP/DMA_UNMAP asynchronously, back to back; descriptors must stay with the
    // message that carried them even when the server reads several messages at once.
    let dev = Dev::start();
    let mut c = dev.client();
    let mem = memfd("guest", 0x100000).unwrap();
    let mut ids = Vec::new();
    for i in 0..200u64 {
        let addr = (i % 2) * 0x100000;
        let m = wire::DmaMap { argsz: 32, flags: 3, offset: 0, address: addr, size: 0x100000 };
        let (id, b) = c.msg(cmd::DMA_MAP, 0, m.as_slice());
        c.send_raw(&b, &[mem.as_raw_fd()]);
        ids.push(id);
        let u = wire::DmaUnmap { argsz: 24, flags: 0, address: addr, size: 0x100000 };
        let (id, b) = c.msg(cmd::DMA_UNMAP, 0, u.as_slice());
        c.send_raw(&b, &[]);
        ids.push(id);
    }
    for id in ids {
        let r = c.recv();
        assert_eq!(r.hdr.msg_id, id);
        assert_eq!(r.errno(), 0, "command {} failed", r.hdr.command);
    }
    c.still_serves();
}

/// Activates the device, posts one request and waits until the engine holds it (and a little more,
/// so that a wrong early completion would have happened).
fn one_request_in_the_engine(dev: &Dev) -> (Client, File, EventFd) {
    let mut c = dev.client();
    let mem = memfd("guest", 0x100000).unwrap();
    let e = EventFd::new(0).unwrap();
    activate(&mut c, &mem, &e);
    post(&mem, 0, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while dev.handler.engine_submitted.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "request never reached the engine");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(100));
    (c, mem, e)
}

#[test]
fn engine_requests_complete_asynchronously_and_unmap_waits_for_them() {
    let release = Arc::new(AtomicBool::new(false));
    let dev = Dev::start_with(Some(release.clone()));
    let (mut c, mem, _e) = one_request_in_the_engine(&dev);
    assert_eq!(used_idx(&mem), 0, "a pending request must not be completed");
    let (_, b) = c.msg(
        cmd::DMA_UNMAP,
        0,
        wire::DmaUnmap { argsz: 24, flags: 0, address: 0, size: 0x100000 }.as_slice(),
    );
    c.send_raw(&b, &[]);
    std::thread::sleep(Duration::from_millis(300));
    let early = wire::recv_with_fds(&c.s, &mut [0u8; 16], &mut Vec::new());
    assert!(
        early.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "DMA_UNMAP acknowledged while an engine request was in flight: {early:?}"
    );
    release.store(true, Ordering::SeqCst);
    let r = c.recv();
    assert_eq!((r.hdr.command, r.errno()), (cmd::DMA_UNMAP, 0));
    assert_eq!(used_idx(&mem), 1, "the engine request completed before the unmap was acknowledged");
    let mut reply = [0u8; 4];
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut reply, BUF).unwrap();
    assert_eq!(&reply, b"asyn");
    assert_eq!(dev.handler.calls.load(Ordering::SeqCst), 0, "the engine, not handle(), served it");
}

#[test]
fn waiting_requests_do_not_hold_up_unmap_and_go_with_a_reset() {
    let release = Arc::new(AtomicBool::new(false));
    let dev = Dev::start_engines(None, Some(release.clone()));
    let (mut c, mem, e) = one_request_in_the_engine(&dev);
    assert_eq!(used_idx(&mem), 0, "a waiting request must not be completed");
    // Memory changes do not wait for it: DMA_MAP and DMA_UNMAP of another window are answered
    // while it waits.
    let extra = memfd("extra", 0x10000).unwrap();
    let t0 = std::time::Instant::now();
    assert_eq!(c.dma_map(0x400000, 0x10000, Some(&extra)).errno(), 0);
    assert_eq!(c.dma_unmap(0x400000, 0x10000, 0).errno(), 0);
    assert!(t0.elapsed() < Duration::from_secs(2), "DMA changes waited for a waiting request");
    assert_eq!(used_idx(&mem), 0);
    // The answer goes into the request's writable buffer, through the current memory.
    release.store(true, Ordering::SeqCst);
    e.read().unwrap();
    assert_eq!(used_idx(&mem), 1);
    let mut reply = [0u8; 4];
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut reply, BUF).unwrap();
    assert_eq!(&reply, b"wait");
    let mut used = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut used, RING + 0x2000 + 4).unwrap();
    assert_eq!(u32::from_le_bytes(used[4..8].try_into().unwrap()), 4, "used length of the answer");
    // A request that waits when the driver resets the device is dropped unanswered, and the
    // handler hears of the reset.
    release.store(false, Ordering::SeqCst);
    post(&mem, 1, 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while dev.handler.engine_submitted.load(Ordering::SeqCst) < 2 {
        assert!(std::time::Instant::now() < deadline, "second request never reached the engine");
        std::thread::sleep(Duration::from_millis(1));
    }
    let resets = dev.handler.resets.load(Ordering::SeqCst);
    c.region_write(4, 0x14, &[0]).ok();
    assert_eq!(c.read32(4, 0x14) & 0xff, 0, "reset");
    assert_eq!(dev.handler.cancelled.load(Ordering::SeqCst), 1, "the waiting request was cancelled");
    assert!(dev.handler.resets.load(Ordering::SeqCst) > resets, "RequestHandler::reset was called");
    release.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(used_idx(&mem), 1, "nothing is answered into a reset queue");
    assert_eq!(dev.handler.calls.load(Ordering::SeqCst), 0, "the engine, not handle(), served them");
}

#[test]
fn a_panicking_handler_fails_one_request_not_the_device() {
    let dev = Dev::start();
    dev.handler.panic_next.store(true, Ordering::SeqCst);
    let mut c = dev.client();
    let mem = memfd("guest", 0x100000).unwrap();
    let e = EventFd::new(0).unwrap();
    activate(&mut c, &mem, &e);
    post(&mem, 0, 0);
    e.read().unwrap();
    assert_eq!(used_idx(&mem), 1, "the request that hit the bug is completed (failed)");
    post(&mem, 1, 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while used_idx(&mem) < 2 {
        assert!(std::time::Instant::now() < deadline, "the poller stopped serving after a handler panic");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(dev.handler.calls.load(Ordering::SeqCst), 2);
    c.still_serves();
}
