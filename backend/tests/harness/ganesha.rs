//! An nfs-ganesha server for the NFS tests (the client's, the engine's allocation count, the
//! device's end to end): NFSv3 and NFSv4 over TCP with FSAL_VFS, exporting a temporary directory,
//! its NFS and MOUNT ports private and bound to 127.0.0.1 (clients are given both in the URL,
//! `?nfsport=&mountport=`, so several servers may run at once and none depends on which one the
//! portmapper knows last). [`Ganesha::kill`], [`Ganesha::start_again`] and [`Ganesha::restart`]
//! make the fault tests' outages (SIGKILL, then a new server on the same ports, with a new write
//! verifier); dropping the server stops it. NFSv4 clients use the NFS port: PUTROOTFH is the
//! pseudo root and the export is at the pseudo path [`Ganesha::export`] (no grace period after a
//! start unless [`Ganesha::start_with_grace`], owners as numeric strings).
//!
//! NFSv3 servers register with rpcbind at start (ganesha exits without one); one rpcbind serves
//! the machine: it is started here only if none listens on port 111, and stopped when the last
//! server of this test binary goes. Ganesha needs root (FSAL_VFS opens files by handle) and the
//! Debian packages `nfs-ganesha`, `nfs-ganesha-vfs` and `rpcbind`, which the project's test
//! command installs: without them the tests fail saying so (never skip).
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Servers of this binary start one at a time (two registering with rpcbind at once fail).
static STARTING: Mutex<()> = Mutex::new(());

/// The rpcbind this binary started, and how many servers use it.
static RPCBIND: Mutex<(Option<Child>, usize)> = Mutex::new((None, 0));

fn listening(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `program` on `PATH` or in the system directories (a test run by `sudo` may have a short
/// `PATH`).
fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into(), "/sbin".into()])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Why the server cannot run here (not root, a package missing), or `Ok`.
pub fn can_run() -> Result<(), String> {
    // SAFETY: a plain system call without arguments.
    if unsafe { libc::geteuid() } != 0 {
        return Err("the NFS tests need root: ganesha's FSAL_VFS opens files by handle".into());
    }
    if which("ganesha.nfsd").is_none() || which("rpcbind").is_none() {
        return Err("the NFS tests need nfs-ganesha, nfs-ganesha-vfs and rpcbind (Debian packages; \
                    the project's test command installs them)"
            .into());
    }
    Ok(())
}

/// Fails the test, saying why, unless the server can run here.
pub fn require() {
    if let Err(why) = can_run() {
        panic!("{why}");
    }
}

fn rpcbind_acquire() {
    let mut g = RPCBIND.lock().unwrap_or_else(|e| e.into_inner());
    g.1 += 1;
    if listening(111) {
        return;
    }
    let _ = std::fs::create_dir_all("/run/rpcbind");
    let child = Command::new(which("rpcbind").expect("rpcbind is installed"))
        .arg("-f")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rpcbind starts");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !listening(111) {
        assert!(Instant::now() < deadline, "rpcbind does not listen on port 111");
        std::thread::sleep(Duration::from_millis(20));
    }
    g.0 = Some(child);
}

fn rpcbind_release() {
    let mut g = RPCBIND.lock().unwrap_or_else(|e| e.into_inner());
    g.1 = g.1.saturating_sub(1);
    if g.1 == 0 {
        if let Some(mut c) = g.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One ganesha server over a temporary export (see the module documentation).
pub struct Ganesha {
    dir: tempfile::TempDir,
    nfs_port: u16,
    mount_port: u16,
    child: Option<Child>,
    starts: usize,
    /// NFSv4's `Lease_Lifetime` in seconds, when not ganesha's default (60).
    lease: Option<u32>,
    /// NFSv4's `Grace_Period` in seconds after every start (`None`: graceless).
    grace: Option<u32>,
}

impl Ganesha {
    /// A server exporting a new, empty directory, listening when this returns.
    pub fn start() -> Ganesha {
        Ganesha::start_with_lease(None)
    }

    /// [`Ganesha::start`] with an NFSv4 lease of `lease` seconds (ganesha's default is 60), for
    /// tests of lease renewal.
    pub fn start_with_lease(lease: Option<u32>) -> Ganesha {
        Ganesha::start_with(lease, None)
    }

    /// [`Ganesha::start`] with a grace period of `grace` seconds after every start (and a lease
    /// of `lease`): the clients its recovery directory knows reclaim their state in it, and
    /// every other OPEN or LOCK is answered NFS4ERR_GRACE until they are done or it ends.
    /// Ganesha ends it at once when no client is known (its first start).
    pub fn start_with_grace(grace: u32, lease: u32) -> Ganesha {
        Ganesha::start_with(Some(lease), Some(grace))
    }

    fn start_with(lease: Option<u32>, grace: Option<u32>) -> Ganesha {
        require();
        rpcbind_acquire();
        let dir = tempfile::Builder::new().prefix("nfs-ganesha-").tempdir().unwrap();
        std::fs::create_dir(dir.path().join("export")).unwrap();
        std::fs::create_dir(dir.path().join("recovery")).unwrap();
        let nfs_port = free_port();
        let mut mount_port = free_port();
        while mount_port == nfs_port {
            mount_port = free_port();
        }
        let mut g = Ganesha { dir, nfs_port, mount_port, child: None, starts: 0, lease, grace };
        g.write_conf();
        g.start_again();
        g
    }

    fn write_conf(&self) {
        let d = self.dir.path();
        let conf = format!(
            "NFS_CORE_PARAM {{ Bind_addr = 127.0.0.1; NFS_Port = {nfs}; MNT_Port = {mnt};\n\
             Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false; Protocols = 3, 4; }}\n\
             NFSv4 {{ {grace} RecoveryBackend = fs; RecoveryRoot = {d}/recovery; Only_Numeric_Owners = true;{lease} }}\n\
             EXPORT_DEFAULTS {{ Transports = TCP; SecType = sys; Squash = No_Root_Squash; }}\n\
             EXPORT {{ Export_Id = 1; Path = {d}/export; Pseudo = {d}/export; Access_Type = RW; Protocols = 3, 4;\n\
             FSAL {{ Name = VFS; }} }}\n\
             LOG {{ Default_Log_Level = EVENT; }}\n",
            nfs = self.nfs_port,
            mnt = self.mount_port,
            d = d.display(),
            lease = self.lease.map(|l| format!(" Lease_Lifetime = {l};")).unwrap_or_default(),
            grace = match self.grace {
                Some(g) => format!("Graceless = false; Grace_Period = {g};"),
                None => "Graceless = true;".to_string(),
            },
        );
        std::fs::write(d.join("ganesha.conf"), conf).unwrap();
    }

    /// Starts the server (again, after [`Ganesha::kill`] or [`Ganesha::stop`]) on the same
    /// ports and export; returns when it answers.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "already running");
        let _one = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        // Another machine-wide server registering with rpcbind at the same moment (another test
        // binary's) makes ganesha give up ("Cannot register"): try again a few times.
        for attempt in 0.. {
            match self.try_start() {
                Ok(()) => return,
                Err(text) if attempt < 10 && text.contains("Cannot register") => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(text) => panic!("ganesha exited at start:\n{text}"),
            }
        }
    }

    fn try_start(&mut self) -> Result<(), String> {
        let d = self.dir.path();
        let log = d.join("ganesha.log");
        // A fresh log: the start is seen by its "initialized" line.
        std::fs::write(&log, b"").unwrap();
        let child = Command::new(which("ganesha.nfsd").expect("ganesha.nfsd is installed"))
            .arg("-F")
            .arg("-f")
            .arg(d.join("ganesha.conf"))
            .arg("-L")
            .arg(&log)
            .arg("-p")
            .arg(d.join("ganesha.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ganesha.nfsd starts");
        self.child = Some(child);
        self.starts += 1;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                self.child = None;
                return Err(format!("({status})\n{text}"));
            }
            let up = std::fs::read_to_string(&log).unwrap_or_default().contains("NFS SERVER INITIALIZED");
            if up && listening(self.nfs_port) && listening(self.mount_port) {
                return Ok(());
            }
            assert!(Instant::now() < deadline, "ganesha did not come up on 127.0.0.1:{}", self.nfs_port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL then a new server on the same ports and export, answering when this returns.
    pub fn restart(&mut self) {
        self.kill();
        self.start_again();
    }

    /// SIGKILL: the server is gone at once, without a word to its clients.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, waiting for the exit (SIGKILL after 10 s).
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else { return };
        // SAFETY: plain system call on our own child's pid.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Sends `sig` to the server (SIGSTOP, SIGCONT: a server that stops answering for a while).
    #[allow(dead_code)]
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: a plain system call on our own child's pid.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// Whether the server is stopped (by SIGSTOP: every thread of it).
    pub fn stopped(&self) -> bool {
        let Some(c) = &self.child else { return false };
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", c.id())) else { return false };
        tasks.flatten().all(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // The state follows the command's closing parenthesis.
            stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
        })
    }

    /// Whether the server runs.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// The exported directory (the server's view: check data here directly).
    pub fn export(&self) -> PathBuf {
        self.dir.path().join("export")
    }

    /// `nfs://127.0.0.1/EXPORT?nfsport=N&mountport=M`.
    pub fn url(&self) -> String {
        format!(
            "nfs://127.0.0.1{}?nfsport={}&mountport={}",
            self.export().display(),
            self.nfs_port,
            self.mount_port
        )
    }

    /// `nfs://127.0.0.1/EXPORT?nfsport=N&version=4.1`: NFSv4.1, the export by its pseudo path
    /// (the same as its directory's path: `Pseudo` in the configuration).
    pub fn url41(&self) -> String {
        format!("nfs://127.0.0.1{}?nfsport={}&version=4.1", self.export().display(), self.nfs_port)
    }

    /// The NFS port.
    pub fn nfs_port(&self) -> u16 {
        self.nfs_port
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ganesha.log")).unwrap_or_default()
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        self.stop();
        rpcbind_release();
    }
}
