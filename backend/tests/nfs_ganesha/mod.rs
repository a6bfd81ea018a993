//! Starts a private nfs-ganesha (NFSv3 over TCP, FSAL_VFS) exporting a directory, on 127.0.0.1
//! ports of its own, for tests: `Ganesha::start(export_dir)`; dropping it stops the server.
//!
//! NFSv3 needs the machine's one portmapper (rpcbind): a running one is reused, else one is
//! started and stopped again when the last server of this test process is dropped (cargo runs
//! test binaries one after another, so one process at a time needs it). Several ganeshas may run at once: each gets its
//! own ports, and clients are given the ports in the URL (`?nfsport=&mountport=`), so they
//! never depend on which one the portmapper knows last. ganesha needs root (FSAL_VFS uses
//! `open_by_handle_at`).
//!
//! `start_or_skip` returns `None` (with a message) where the server cannot run (no ganesha
//! installed, not root), unless `VIRTIOFS_REQUIRE_NFS=1` is set (CI), where that is a failure.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Ganesha {
    child: Option<Child>,
    dir: tempfile::TempDir,
    export: PathBuf,
    conf: PathBuf,
    pub nfs_port: u16,
    pub mount_port: u16,
}

fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn listening(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// The portmapper this process started, and how many of its servers use it.
struct Rpcbind {
    child: Option<Child>,
    users: usize,
}

static RPCBIND: Mutex<Rpcbind> = Mutex::new(Rpcbind { child: None, users: 0 });

/// Makes sure a portmapper listens on port 111 for one more server of this process.
fn rpcbind_acquire() {
    let mut r = RPCBIND.lock().unwrap_or_else(|e| e.into_inner());
    r.users += 1;
    if listening(111) {
        return;
    }
    let rpcbind = which("rpcbind").expect("rpcbind is not installed (Debian package rpcbind)");
    let _ = std::fs::create_dir_all("/run/rpcbind");
    let child = Command::new(rpcbind)
        .arg("-f")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start rpcbind");
    r.child = Some(child);
    let t0 = Instant::now();
    while !listening(111) {
        assert!(t0.elapsed() < Duration::from_secs(10), "rpcbind did not start listening on port 111");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One server of this process no longer needs the portmapper: the last one stops it if this
/// process started it (one started by someone else is left alone).
fn rpcbind_release() {
    let mut r = RPCBIND.lock().unwrap_or_else(|e| e.into_inner());
    r.users = r.users.saturating_sub(1);
    if r.users == 0 {
        if let Some(mut c) = r.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Ganesha {
    /// Whether a server can run here; `Err` says why not.
    pub fn can_run() -> Result<(), String> {
        if which("ganesha.nfsd").is_none() {
            return Err("ganesha.nfsd is not installed (Debian packages nfs-ganesha, nfs-ganesha-vfs)".into());
        }
        if !is_root() {
            return Err("nfs-ganesha's VFS FSAL needs root".into());
        }
        Ok(())
    }

    /// A server exporting a fresh temporary directory, or `None` where none can run (see the
    /// module's comment).
    pub fn start_or_skip() -> Option<Ganesha> {
        match Ganesha::can_run() {
            Ok(()) => Some(Ganesha::start(None)),
            Err(why) if std::env::var("VIRTIOFS_REQUIRE_NFS").as_deref() == Ok("1") => {
                panic!("NFS tests required but cannot run: {why}")
            }
            Err(why) => {
                eprintln!("skipping the nfs-ganesha test: {why}");
                None
            }
        }
    }

    /// Starts a server exporting `export_dir` (or a fresh directory inside its own temporary
    /// directory) and waits until MOUNT answers.
    pub fn start(export_dir: Option<&Path>) -> Ganesha {
        Ganesha::can_run().unwrap();
        rpcbind_acquire();
        let dir = tempfile::tempdir().unwrap();
        let export = match export_dir {
            Some(d) => d.canonicalize().unwrap(),
            None => {
                let e = dir.path().join("export");
                std::fs::create_dir(&e).unwrap();
                e
            }
        };
        std::fs::create_dir(dir.path().join("recovery")).unwrap();
        let (nfs_port, mount_port) = (free_port(), free_port());
        let conf = dir.path().join("ganesha.conf");
        std::fs::write(
            &conf,
            format!(
                "NFS_CORE_PARAM {{ Bind_addr = 127.0.0.1; NFS_Port = {nfs_port}; MNT_Port = {mount_port};\n\
                 \x20 Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false; Protocols = 3; }}\n\
                 NFSv4 {{ Graceless = true; RecoveryBackend = fs; RecoveryRoot = {rec}; Only_Numeric_Owners = true; }}\n\
                 EXPORT_DEFAULTS {{ Transports = TCP; SecType = sys; Squash = No_Root_Squash; }}\n\
                 EXPORT {{ Export_Id = 1; Path = {exp}; Pseudo = {exp}; Access_Type = RW; Protocols = 3;\n\
                 \x20 FSAL {{ Name = VFS; }} }}\n\
                 LOG {{ Default_Log_Level = EVENT; }}\n",
                rec = dir.path().join("recovery").display(),
                exp = export.display(),
            ),
        )
        .unwrap();
        let mut g = Ganesha { child: None, dir, export, conf, nfs_port, mount_port };
        g.spawn();
        g
    }

    fn spawn(&mut self) {
        // ganesha unregisters and registers NFS and MOUNT with the portmapper as it starts: two
        // starting at once can make one fail ("Cannot register NFS V3"). Starts are one at a time
        // in this process, and retried when another process raced us.
        static STARTING: Mutex<()> = Mutex::new(());
        let _one = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        let log = self.dir.path().join("ganesha.log");
        for attempt in 1.. {
            let _ = std::fs::remove_file(&log);
            match self.try_spawn(&log) {
                Ok(()) => return,
                Err(why) if why.contains("Cannot register") && attempt < 5 => {
                    std::thread::sleep(Duration::from_millis(100 * attempt));
                }
                Err(why) => panic!("{why}"),
            }
        }
    }

    fn try_spawn(&mut self, log: &Path) -> Result<(), String> {
        let child = Command::new(which("ganesha.nfsd").unwrap())
            .arg("-F")
            .arg("-f")
            .arg(&self.conf)
            .arg("-L")
            .arg(log)
            .arg("-p")
            .arg(self.dir.path().join("ganesha.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start ganesha.nfsd");
        self.child = Some(child);
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                let log = std::fs::read_to_string(log).unwrap_or_default();
                return Err(format!("ganesha.nfsd exited ({st}) at start; its log:\n{log}"));
            }
            if listening(self.nfs_port) && listening(self.mount_port) && self.mount_answers() {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(20) {
                self.stop();
                let log = std::fs::read_to_string(log).unwrap_or_default();
                return Err(format!("ganesha.nfsd did not come up in 20 s; its log:\n{log}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn mount_answers(&self) -> bool {
        let url: virtiofs_backend::nfs::url::NfsUrl = self.url().parse().unwrap();
        virtiofs_backend::nfs::setup::mount(&url, Duration::from_secs(2)).is_ok()
    }

    /// `nfs://127.0.0.1/EXPORT?nfsport=N&mountport=M`.
    pub fn url(&self) -> String {
        format!(
            "nfs://127.0.0.1{}?nfsport={}&mountport={}",
            self.export.display(),
            self.nfs_port,
            self.mount_port
        )
    }

    /// The exported directory.
    pub fn export(&self) -> &Path {
        &self.export
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ganesha.log")).unwrap_or_default()
    }

    /// Kills the server with SIGKILL (as a crash), waiting for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again (after [`Ganesha::kill`] or [`Ganesha::stop`]), same ports and
    /// export.
    pub fn restart(&mut self) {
        self.kill();
        let t0 = Instant::now();
        // The old sockets may linger a moment.
        while listening(self.nfs_port) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.spawn();
    }

    /// Stops the server with SIGTERM (SIGKILL after 5 s).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        self.stop();
        rpcbind_release();
    }
}
