//! What a hostile client, guest or second process does to the `virtiofs-dpu` daemon, over its real
//! socket (issue 11): none of it may kill, freeze or take over the daemon, and the next client is
//! served. Each test is one finding of the issue.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_PCI_MSIX_IRQ_INDEX,
};
use virtiofs_tools::vfio_user::ClientCaps;
use virtiofs_tools::{Client, DriverOptions, FsDriver};
use vmm_sys_util::eventfd::EventFd;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofs-dpu");

/// The daemon as a subprocess, killed (and its socket directory removed) when dropped.
struct Daemon {
    child: Child,
    _dir: tempfile::TempDir,
    sock: std::path::PathBuf,
}

impl Daemon {
    fn start(extra: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("d.sock");
        Self::start_at(dir, sock, extra)
    }

    fn start_at(dir: tempfile::TempDir, sock: std::path::PathBuf, extra: &[&str]) -> Daemon {
        let mut args = vec!["--socket-path", sock.to_str().unwrap(), "--tag", "hostile"];
        args.extend_from_slice(extra);
        let log = std::fs::File::create(dir.path().join("daemon.log")).unwrap();
        let child = Command::new(BIN)
            .args(&args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start virtiofs-dpu");
        let mut d = Daemon { child, _dir: dir, sock };
        d.wait_for_socket();
        d
    }

    fn wait_for_socket(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&self.sock).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("daemon exited early: {status}: {}", self.log());
            }
            assert!(Instant::now() < deadline, "socket never appeared");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// A vfio-user client past VERSION (retrying while the previous client's hang-up is handled).
    fn client(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = Client::connect(&self.sock) {
                c.set_timeout(Duration::from_secs(5)).unwrap();
                if c.version(&ClientCaps::default()).is_ok() {
                    return c;
                }
            }
            assert!(Instant::now() < deadline, "server never accepted a session");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn driver(&self, opts: DriverOptions) -> FsDriver {
        FsDriver::connect(&self.sock, opts).unwrap_or_else(|e| panic!("bring-up: {e}; log:\n{}", self.log()))
    }

    /// A driver session that works: INIT and a GETATTR of the root.
    fn serves_a_new_client(&self) {
        let opts = DriverOptions { mem_size: 2 << 20, timeout: Duration::from_secs(5), ..Default::default() };
        let mut d = self.driver(opts);
        d.init().expect("INIT on a new connection");
        d.getattr(1).expect("GETATTR on a new connection");
        d.shutdown().unwrap();
    }

    /// SIGTERM; asserts the process is gone within `bound`.
    fn sigterm_gone_within(&mut self, bound: Duration) {
        let st = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(st.success());
        let start = Instant::now();
        loop {
            if self.child.try_wait().unwrap().is_some() {
                return;
            }
            if start.elapsed() > bound {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("daemon still running {bound:?} after SIGTERM: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking eventfd (no `EFD_NONBLOCK`) whose counter is 2^64-2: one more write would wait
/// until somebody reads it.
fn full_blocking_eventfd() -> EventFd {
    let e = EventFd::new(0).unwrap(); // no EFD_NONBLOCK
    e.write(u64::MAX - 1).unwrap();
    e
}

/// Issue 11, "blocking eventfd", control-plane side: SET_IRQS TRIGGER on a vector whose eventfd is
/// full and blocking used to block the control plane for ever; SIGTERM then never ended it.
#[test]
fn full_blocking_eventfd_on_trigger_neither_blocks_nor_outlives_sigterm() {
    let mut d = Daemon::start(&[]);
    let mut c = d.client();
    let efd = full_blocking_eventfd();
    let eventfd_trigger = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    c.set_irqs(VFIO_PCI_MSIX_IRQ_INDEX, eventfd_trigger, 0, 1, &[efd.as_raw_fd()], &[]).unwrap();
    // Trigger vector 0: the device writes the full eventfd. The reply must come.
    let trigger = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER;
    c.set_irqs(VFIO_PCI_MSIX_IRQ_INDEX, trigger, 0, 1, &[], &[]).expect("TRIGGER answered");
    c.set_irqs(VFIO_PCI_MSIX_IRQ_INDEX, trigger, 0, 1, &[], &[]).expect("and again");
    drop(c);
    d.serves_a_new_client();
    d.sigterm_gone_within(Duration::from_secs(1));
}

/// Issue 11, "blocking eventfd", poller side: a queue's vector given a full blocking eventfd after
/// DRIVER_OK used to block its poller on the first completion; no later request was served.
#[test]
fn full_blocking_eventfd_on_a_queue_vector_does_not_stop_the_poller() {
    let mut d = Daemon::start(&[]);
    let opts =
        DriverOptions { use_interrupts: true, timeout: Duration::from_millis(300), ..Default::default() };
    let mut drv = d.driver(opts);
    let efd = full_blocking_eventfd();
    let eventfd_trigger = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    for q in 0..=drv.request_queues() {
        let v = u32::from(drv.queue_vector(q));
        drv.client()
            .set_irqs(VFIO_PCI_MSIX_IRQ_INDEX, eventfd_trigger, v, 1, &[efd.as_raw_fd()], &[])
            .unwrap();
    }
    // Completions come (the driver finds them in the used ring once its wait for an interrupt
    // that cannot come ends); the poller goes on serving after each.
    drv.init().expect("INIT");
    for _ in 0..5 {
        drv.getattr(1).expect("GETATTR after the poller signalled a full eventfd");
    }
    drop(drv);
    d.serves_a_new_client();
    d.sigterm_gone_within(Duration::from_secs(1));
}

/// Issue 11, "CREATE over a FIFO" (passthrough): MKNOD a FIFO, then CREATE the same name without
/// O_EXCL. Poller 0 used to block in open() waiting for a writer, and every queue and the control
/// plane with it. Now the CREATE fails ENXIO at once and the daemon serves on; `--refuse
/// device-nodes` makes a device MKNOD fail EPERM.
#[test]
fn create_over_a_fifo_does_not_block_the_passthrough() {
    let share = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(&["--shared-dir", share.path().to_str().unwrap(), "--refuse", "device-nodes"]);
    let mut drv = d.driver(DriverOptions { timeout: Duration::from_secs(3), ..Default::default() });
    drv.init().unwrap();
    drv.mknod(1, "fifo", libc::S_IFIFO | 0o666, 0).unwrap();
    let e = drv.create(1, "fifo", 0o666, libc::O_WRONLY as u32).unwrap_err();
    assert_eq!(e.fuse_errno(), Some(libc::ENXIO), "{e}");
    let e = drv.mknod(1, "null", libc::S_IFCHR | 0o666, 0x103).unwrap_err();
    assert_eq!(e.fuse_errno(), Some(libc::EPERM), "{e}");
    drv.getattr(1).expect("the poller still serves");
    drv.shutdown().unwrap();
    d.serves_a_new_client();
    d.sigterm_gone_within(Duration::from_secs(1));
}

/// Runs the daemon on `sock` expecting it to refuse to start; returns its log.
fn refused_start(sock: &std::path::Path) -> String {
    let mut child = Command::new(BIN)
        .args(["--socket-path", sock.to_str().unwrap(), "--tag", "second"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run virtiofs-dpu");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the second daemon started on {} and kept running", sock.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success(), "second daemon must not start: {err}");
    err
}

/// Issue 11, "a second daemon on the same socket path": it used to unlink the live daemon's
/// socket and bind its own, leaving the first running with no socket. Now it refuses, naming the
/// problem, and the first serves on. A stale socket (nobody listening) is still replaced; a file
/// that is not a socket is its own error.
#[test]
fn a_live_socket_is_never_taken_over() {
    let mut d = Daemon::start(&[]);
    let log = refused_start(&d.sock);
    assert!(log.contains("served by another live daemon") && log.contains("lock file"), "{log}");
    assert!(d.sock.exists());
    d.serves_a_new_client();

    // A server that takes no lock (another program) is found by the connect probe.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("other.sock");
    let other = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let log = refused_start(&sock);
    assert!(log.contains("served by another live daemon") && log.contains("accepts connections"), "{log}");
    drop(other); // now stale: the file stays, nobody listens
    assert!(sock.exists());
    let mut d2 = Daemon::start_at(dir, sock, &[]);
    d2.serves_a_new_client();
    d2.sigterm_gone_within(Duration::from_secs(1));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain");
    std::fs::write(&file, b"not a socket").unwrap();
    let log = refused_start(&file);
    assert!(log.contains("exists and is not a socket"), "{log}");
    assert_eq!(std::fs::read(&file).unwrap(), b"not a socket");
    d.sigterm_gone_within(Duration::from_secs(1));
}

/// Issue 11, "already connected": a client that connects right after the previous one hung up
/// could be refused while that hang-up was still being handled. It now waits and is served:
/// no retry here, every connection must get its VERSION answered at the first try.
#[test]
fn the_next_client_is_served_right_after_a_hang_up() {
    let mut d = Daemon::start(&[]);
    for i in 0..100 {
        let mut c = Client::connect(&d.sock).unwrap();
        c.set_timeout(Duration::from_secs(5)).unwrap();
        c.version(&ClientCaps::default()).unwrap_or_else(|e| panic!("connection {i} refused: {e}"));
        // Half of them hang up with a DMA window mapped, so the reset has work to do.
        if i % 2 == 0 {
            let mem = virtiofs_device::memory::memfd("window", 1 << 20).unwrap();
            c.dma_map(3, 0, 1 << 32, 1 << 20, Some(mem.as_raw_fd())).unwrap();
        }
    }
    d.sigterm_gone_within(Duration::from_secs(1));
}

/// Issue 11, "SIGBUS": DMA_MAP a memfd window, put the queues' rings in it, reach DRIVER_OK, then
/// `ftruncate` the memfd to 0. The daemon used to die of SIGBUS within 0.1 s (the poller reading
/// the avail ring is enough). Now it repairs the faults with zero pages, marks the device
/// DEVICE_NEEDS_RESET, and serves the next client; with the passthrough and its sandbox too.
#[test]
fn client_memory_truncated_under_the_rings_is_survived() {
    let share = tempfile::tempdir().unwrap();
    let passthrough = ["--shared-dir", share.path().to_str().unwrap()];
    for (args, ring) in [
        (&[][..], virtiofs_tools::driver::RingLayout::Split),
        (&passthrough[..], virtiofs_tools::driver::RingLayout::Packed),
    ] {
        let mut d = Daemon::start(args);
        let mut drv = d.driver(DriverOptions { ring, timeout: Duration::from_secs(5), ..Default::default() });
        drv.init().unwrap();
        drv.getattr(1).unwrap();
        // From here on the driver's own view of that memory faults too: only registers are used.
        drv.memory().file().set_len(0).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            assert!(d.child.try_wait().unwrap().is_none(), "daemon died: {}", d.log());
            let status = drv.transport().status().expect("status register");
            if status & 0x40 != 0 {
                break; // DEVICE_NEEDS_RESET
            }
            assert!(Instant::now() < deadline, "device never asked for a reset (status {status:#x})");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200));
        assert!(d.child.try_wait().unwrap().is_none(), "daemon died: {}", d.log());
        drop(drv);
        d.serves_a_new_client();
        d.sigterm_gone_within(Duration::from_secs(1));
    }
}

/// Issue 11, "bounds": DMA windows used to be bounded only by RLIMIT_NOFILE (19,989 windows took
/// every descriptor). The profile bounds their number, their mapped bytes and the descriptors
/// they may take (`fd_reserve` kept free below the limit); past a bound DMA_MAP fails ENOSPC or
/// EMFILE and the daemon serves on.
#[test]
fn dma_windows_are_bounded_by_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("small.toml");
    std::fs::write(&cfg, "max_dma_windows = 8\nmax_dma_mib = 4\n").unwrap();
    let mut d = Daemon::start(&["--config", cfg.to_str().unwrap()]);
    let mut c = d.client();
    let mem = virtiofs_device::memory::memfd("window", 1 << 20).unwrap();
    let rw = 3;
    for i in 0..4u64 {
        c.dma_map(rw, 0, (1 << 32) + (i << 20), 1 << 20, Some(mem.as_raw_fd())).unwrap();
    }
    let e = c.dma_map(rw, 0, (1 << 32) + (4 << 20), 1 << 20, Some(mem.as_raw_fd())).unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOSPC), "mapped bytes past max_dma_mib: {e}");
    for i in 0..4u64 {
        c.dma_map(rw, 0, (2 << 32) + (i << 12), 1 << 12, None).unwrap();
    }
    let e = c.dma_map(rw, 0, 3 << 32, 1 << 12, None).unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOSPC), "windows past max_dma_windows: {e}");
    // Unmapping makes room again.
    c.dma_unmap(0, 1 << 32, 1 << 20).unwrap();
    c.dma_map(rw, 0, 1 << 32, 1 << 20, Some(mem.as_raw_fd())).unwrap();
    drop(c);
    d.serves_a_new_client();
    d.sigterm_gone_within(Duration::from_secs(1));

    // Descriptors: with more kept free than the limit allows, no window with a descriptor fits.
    std::fs::write(&cfg, "fd_reserve = 1099511627776\n").unwrap();
    let mut d = Daemon::start(&["--config", cfg.to_str().unwrap()]);
    let mut c = d.client();
    let e = c.dma_map(rw, 0, 1 << 32, 1 << 20, Some(mem.as_raw_fd())).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EMFILE), "{e}");
    c.dma_map(rw, 0, 1 << 32, 1 << 20, None).unwrap();
    drop(c);
    d.sigterm_gone_within(Duration::from_secs(1));
}

/// Issue 21, "tenants stay apart": a DMA window on a file whose page faults can wait for ever (a
/// FUSE mount, a hung NFS mount; here a plain file on a disk filesystem, which DMA_MAP cannot tell
/// from those) would hang the poller that touches it. DMA_MAP takes only files on shmem (a memfd,
/// `/dev/shm`) or hugetlbfs and refuses the others with ENODEV, mapping nothing; the client's
/// session goes on.
#[test]
fn dma_windows_only_from_memory_that_cannot_fault_for_ever() {
    let mut d = Daemon::start(&[]);
    let mut c = d.client();
    let rw = 3;
    // target/tmp is on the root filesystem (ext4 here), unlike /tmp on many hosts.
    let disk = tempfile::tempfile_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    disk.set_len(1 << 20).unwrap();
    let magic = fs_magic(env!("CARGO_TARGET_TMPDIR"));
    assert!(
        magic != 0x0102_1994 && magic != 0x9584_58f6,
        "test precondition: CARGO_TARGET_TMPDIR is on tmpfs"
    );
    let e = c.dma_map(rw, 0, 1 << 32, 1 << 20, Some(disk.as_raw_fd())).unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENODEV), "a window on a disk file: {e}");
    assert!(d.log().contains("not tmpfs/memfd or hugetlbfs"), "{}", d.log());
    // Nothing was mapped at that address: a memfd window takes the same range.
    let mem = virtiofs_device::memory::memfd("window", 1 << 20).unwrap();
    c.dma_map(rw, 0, 1 << 32, 1 << 20, Some(mem.as_raw_fd())).unwrap();
    // A /dev/shm file is on tmpfs, and maps too.
    if let Ok(shm) = tempfile::tempfile_in("/dev/shm") {
        shm.set_len(1 << 20).unwrap();
        c.dma_map(rw, 0, 2 << 32, 1 << 20, Some(shm.as_raw_fd())).unwrap();
    }
    c.dma_unmap(0, 1 << 32, 1 << 20).unwrap();
    drop(c);
    d.serves_a_new_client();
    d.sigterm_gone_within(Duration::from_secs(1));
}

/// The filesystem type (`f_type`, the 32-bit magic) at `path`, read with `stat -f` so that this
/// test file needs no `unsafe`.
fn fs_magic(path: &str) -> u32 {
    let out = Command::new("stat").args(["-f", "-c", "%t", path]).output().unwrap();
    u32::from_str_radix(String::from_utf8_lossy(&out.stdout).trim(), 16).unwrap()
}

/// The daemon's memory in KiB: anonymous (heap) and file pages (its code), and the RAM
/// filesystem's data, which lives in a memfd of its own (its allocated blocks, found through
/// `/proc/PID/fd`). Other shared memory (the client's DMA windows the daemon touched) is the
/// client's and not counted.
fn rss_kib(pid: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).expect("field of /proc/PID/status");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let data: u64 = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|l| l.to_string_lossy().starts_with("/memfd:virtiofs-ramfs"))
        })
        .map(|e| std::fs::metadata(e.path()).map_or(0, |m| m.blocks() / 2))
        .sum();
    field("RssAnon:") + field("RssFile:") + data
}

/// Issue 11, "bounds", RAM filesystem: its RSS went from 4 to 139 MB after sparse writes and
/// stayed there after unlink. Freed data now goes back to the kernel: once every file is
/// deleted the daemon's RSS (anonymous, file and shared-memory pages: the data lives in a
/// memfd) is back within 10 % of what it was.
#[test]
fn the_ram_filesystem_returns_memory_when_files_go() {
    let mut d = Daemon::start(&[]);
    let mut drv = d.driver(DriverOptions { timeout: Duration::from_secs(10), ..Default::default() });
    drv.init().unwrap();
    let pid = d.child.id();
    // Warm up what a session allocates anyway (one file written and removed).
    let (e, o) = drv.create(1, "warm", 0o644, libc::O_RDWR as u32).unwrap();
    drv.write(e.nodeid, o.fh, 0, &[1u8; 4096]).unwrap();
    drv.release(e.nodeid, o.fh).unwrap();
    drv.unlink(1, "warm").unwrap();
    drv.forget(e.nodeid, 1).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let before = rss_kib(pid);
    // Sparse files: 64 KiB written every 128 KiB (64 MiB of data), then a second pass of
    // 4 KiB writes into the holes, each taking a chunk of its own.
    let block = vec![0x5au8; 64 << 10];
    let mut files = Vec::new();
    for f in 0..32 {
        let name = format!("sparse-{f}");
        let (e, o) = drv.create(1, &name, 0o644, libc::O_RDWR as u32).unwrap();
        for i in 0..32u64 {
            drv.write(e.nodeid, o.fh, i * (128 << 10), &block).unwrap();
        }
        for i in 0..32u64 {
            drv.write(e.nodeid, o.fh, i * (128 << 10) + (64 << 10), &block[..4096]).unwrap();
        }
        files.push((name, e.nodeid, o.fh));
    }
    let full = rss_kib(pid);
    assert!(full > before + 50_000, "the writes took memory: {before} KiB -> {full} KiB");
    // Half the files truncated, the other half unlinked (still open), then all released.
    for (i, (name, node, fh)) in files.iter().enumerate() {
        if i % 2 == 0 {
            drv.truncate(*node, 0, Some(*fh)).unwrap();
        }
        drv.unlink(1, name).unwrap();
    }
    for (_, node, fh) in &files {
        drv.release(*node, *fh).unwrap();
        drv.forget(*node, 1).unwrap();
    }
    drv.getattr(1).unwrap(); // FORGET has no reply: a request after it orders them
    std::thread::sleep(Duration::from_millis(100));
    let after = rss_kib(pid);
    eprintln!("RSS {before} KiB before, {full} KiB full, {after} KiB after");
    assert!(
        after <= before + before / 10,
        "RSS {before} KiB before, {full} KiB full, {after} KiB after deleting everything"
    );
    drv.shutdown().unwrap();
    d.sigterm_gone_within(Duration::from_secs(1));
}
