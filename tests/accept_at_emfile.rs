//! Issue 11, "bounds": while the daemon is out of descriptors (EMFILE), a connection waiting in
//! the listener's backlog used to stay there until another connection arrived: the listener is
//! edge-triggered and does not report the same backlog again. It is now accepted as soon as a
//! descriptor is free (accept is retried on a timer while it fails for want of one).
//!
//! Over the daemon's real socket: a client's DMA windows hold descriptors in the daemon; the
//! test lowers the daemon's RLIMIT_NOFILE (prlimit on its pid) so that every descriptor below
//! the limit is taken, connects a second client (its accept fails EMFILE), unmaps one window,
//! and watches the freed descriptor number come back as the second client's socket.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use virtiofs_tools::vfio_user::ClientCaps;
use virtiofs_tools::Client;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofs-dpu");

/// The daemon as a subprocess, killed when dropped. It binds its socket before its pollers start
/// (they start once it is confined), so "the socket exists" does not mean "every descriptor it
/// keeps is open": the tests wait for its `READY=1` on a `NOTIFY_SOCKET` of their own, sent once
/// it serves, before they count its descriptors.
struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
    sock: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start() -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("d.sock");
        let log = std::fs::File::create(dir.path().join("daemon.log")).unwrap();
        let notify_path = dir.path().join("notify.sock");
        let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
        notify.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let child = Command::new(BIN)
            .args(["--socket-path", sock.to_str().unwrap(), "--tag", "emfile"])
            .env("RUST_LOG", "info")
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start virtiofs-dpu");
        let d = Daemon { child, dir, sock };
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = [0u8; 256];
        loop {
            assert!(Instant::now() < deadline, "the daemon never said READY=1: {}", d.log());
            if let Ok(n) = notify.recv(&mut buf) {
                if std::str::from_utf8(&buf[..n]).is_ok_and(|m| m.lines().any(|l| l == "READY=1")) {
                    break;
                }
            }
        }
        assert!(d.sock.exists(), "ready without its socket: {}", d.log());
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// The daemon's descriptors: number and what it names.
    fn fds(&self) -> Vec<(i32, PathBuf)> {
        let dir = format!("/proc/{}/fd", self.child.id());
        let mut v: Vec<(i32, PathBuf)> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let e = e.ok()?;
                let n: i32 = e.file_name().to_str()?.parse().ok()?;
                Some((n, std::fs::read_link(e.path()).ok()?))
            })
            .collect();
        v.sort();
        v
    }

    /// Sets the daemon's soft RLIMIT_NOFILE (the hard limit stays).
    fn set_nofile(&self, soft: u64) {
        let pid = self.child.id() as libc::pid_t;
        let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: plain system calls on our own child with valid pointers to locals.
        let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
        assert_eq!(rc, 0, "prlimit get: {}", std::io::Error::last_os_error());
        let new = libc::rlimit { rlim_cur: soft, rlim_max: old.rlim_max };
        // SAFETY: as above.
        let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "prlimit set: {}", std::io::Error::last_os_error());
    }

    /// Lowers the limit to `first_free` (every descriptor below it is taken: `fds`), connects a
    /// client, and waits until the daemon failed to accept it (and took no descriptor).
    fn connect_at_emfile(&self, fds: &[(i32, PathBuf)], first_free: i32) -> Client {
        self.set_nofile(first_free as u64);
        let mut c = Client::connect(&self.sock).unwrap();
        c.set_timeout(Duration::from_secs(5)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.log().contains("accept: ") {
            assert!(Instant::now() < deadline, "the daemon never failed an accept: {}", self.log());
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(self.fds(), fds, "the daemon's descriptors changed while it had none free");
        c
    }
}

/// The lowest descriptor number not in `fds` (where the next one would go).
fn first_free(fds: &[(i32, PathBuf)]) -> i32 {
    (0..).find(|n| fds.iter().all(|(f, _)| f != n)).unwrap()
}

fn is_socket(p: &Path) -> bool {
    p.to_str().is_some_and(|s| s.starts_with("socket:"))
}

#[test]
fn a_connection_in_the_backlog_is_accepted_as_soon_as_a_descriptor_is_free() {
    let mut d = Daemon::start();
    let mut a = Client::connect(&d.sock).unwrap();
    a.set_timeout(Duration::from_secs(5)).unwrap();
    a.version(&ClientCaps::default()).unwrap();
    // Three windows, each a memfd of its own the daemon keeps open (DMA_MAP takes only shmem or
    // hugetlbfs files); /proc/PID/fd names a memfd "/memfd:NAME (deleted)".
    let windows: Vec<(PathBuf, std::fs::File, u64)> = (0..3u64)
        .map(|i| {
            let name = format!("window-{}-{i}", std::process::id());
            let path = PathBuf::from(format!("/memfd:{name} (deleted)"));
            let f = virtiofs_device::memory::memfd(&name, 1 << 20).unwrap();
            let iova = (1 << 32) + (i << 20);
            a.dma_map(3, 0, iova, 1 << 20, Some(f.as_raw_fd())).unwrap();
            (path, f, iova)
        })
        .collect();
    let fds = d.fds();
    let first_free = first_free(&fds);
    // The window whose descriptor is lowest: freeing it frees a number below the limit.
    let (win_fd, iova) = windows
        .iter()
        .filter_map(|(path, _, iova)| fds.iter().find(|(_, p)| p == path).map(|(n, _)| (*n, *iova)))
        .min()
        .expect("the daemon holds the windows' descriptors");
    assert!(win_fd < first_free, "window descriptor {win_fd} past the first free one {first_free}: {fds:?}");

    let mut b = d.connect_at_emfile(&fds, first_free);

    // One descriptor frees: the waiting connection takes it, without another one arriving.
    let unmapped = Instant::now();
    a.dma_unmap(0, iova, 1 << 20).unwrap();
    let deadline = unmapped + Duration::from_secs(2);
    let window = &windows.iter().find(|(_, _, i)| *i == iova).unwrap().0;
    loop {
        // The window's descriptor closes (maybe after the reply: the pollers pass an epoch
        // first), and the waiting connection's socket takes its number.
        match d.fds().into_iter().find(|(n, _)| *n == win_fd) {
            Some((_, p)) if is_socket(&p) => break,
            Some((_, p)) => assert!(&p == window, "descriptor {win_fd} reused for {p:?}"),
            None => {}
        }
        assert!(
            Instant::now() < deadline,
            "the connection in the backlog was not accepted within 2 s of a descriptor freeing: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("accepted {:?} after the descriptor freed", unmapped.elapsed());

    // The first client hangs up; the second, accepted meanwhile, is served.
    drop(a);
    b.version(&ClientCaps::default())
        .unwrap_or_else(|e| panic!("second client not served: {e}: {}", d.log()));
    assert!(d.child.try_wait().unwrap().is_none(), "daemon died: {}", d.log());
}

/// The same with no event at all for the daemon when the descriptor frees (its limit is raised
/// from outside): the retry timer alone accepts the waiting connection.
#[test]
fn the_retry_timer_alone_accepts_once_the_limit_allows() {
    let mut d = Daemon::start();
    let fds = d.fds();
    let first_free = first_free(&fds);
    let mut b = d.connect_at_emfile(&fds, first_free);
    let raised = Instant::now();
    d.set_nofile(first_free as u64 + 64);
    b.version(&ClientCaps::default())
        .unwrap_or_else(|e| panic!("waiting client not served: {e}: {}", d.log()));
    eprintln!("served {:?} after the limit was raised", raised.elapsed());
    assert!(d.child.try_wait().unwrap().is_none(), "daemon died: {}", d.log());
}
