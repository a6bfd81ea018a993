//! virtiofsd's user-facing options on the daemon, each checked through a real socket with the
//! host driver model: `--no-xattr` (the xattr requests answered ENOSYS, no POSIX_ACL offered),
//! `--no-posix-acl`, `--no-readdirplus` / `--readdirplus` (what INIT offers, `--cache never`
//! included), `--ramfs-size` / `--ramfs-inodes` and their profile keys (ENOSPC at the limit),
//! `--rlimit-nofile`, and the virtiofsd options that do not apply (refused or warned about,
//! with the reason), all of it in `--help`.

mod common;
use common::{wait_for, BIN};

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use virtiofs_tools::fuse_abi::{init_flags, opcode};
use virtiofs_tools::{DriverError, DriverOptions, FsDriver};

/// A daemon on a socket of its own, killed when dropped.
struct Daemon {
    child: Child,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(args: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("d.sock");
        let mut child = Command::new(BIN)
            .arg("--socket-path")
            .arg(&sock)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sock.exists() {
            if let Some(st) = child.try_wait().unwrap() {
                let mut err = String::new();
                child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
                panic!("daemon {args:?} exited with {st}:\n{err}");
            }
            assert!(Instant::now() < deadline, "socket did not appear");
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon { child, sock, _dir: dir }
    }

    fn driver(&self) -> FsDriver {
        // The socket file appears at bind(2), a moment before listen(2): a connection in between
        // is refused.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut d = loop {
            match FsDriver::connect(&self.sock, DriverOptions::default()) {
                Ok(d) => break d,
                Err(e) if Instant::now() < deadline && format!("{e:?}").contains("ConnectionRefused") => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("bring-up: {e:?}"),
            }
        };
        d.init().unwrap();
        d
    }

    /// Stops it and returns its log.
    fn stop(mut self) -> String {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
        let mut err = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        err
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn flags(d: &FsDriver) -> u64 {
    d.init_info().unwrap().flags
}

/// The errno of a raw request (0: success).
fn errno_of(d: &mut FsDriver, op: u32, nodeid: u64, parts: &[&[u8]], reply: usize) -> i32 {
    let (h, _) = d.call(1, op, nodeid, parts, reply).unwrap();
    -h.error
}

/// SETXATTR `name` = `value` on `nodeid`, in the layout the session negotiated.
fn setxattr(d: &mut FsDriver, nodeid: u64, name: &str, value: &[u8]) -> i32 {
    let mut arg = Vec::new();
    arg.extend_from_slice(&(value.len() as u32).to_le_bytes());
    arg.extend_from_slice(&0u32.to_le_bytes()); // flags
    if flags(d) & init_flags::SETXATTR_EXT != 0 {
        arg.extend_from_slice(&[0u8; 8]); // setxattr_flags, padding
    }
    let name = format!("{name}\0");
    errno_of(d, opcode::SETXATTR, nodeid, &[&arg, name.as_bytes(), value], 0)
}

fn getxattr_in(size: u32) -> Vec<u8> {
    let mut a = size.to_le_bytes().to_vec();
    a.extend_from_slice(&0u32.to_le_bytes());
    a
}

/// GETXATTR `name` of `nodeid`: the value, or the errno.
fn getxattr(d: &mut FsDriver, nodeid: u64, name: &str) -> Result<Vec<u8>, i32> {
    let name = format!("{name}\0");
    let (h, data) = d.call(1, opcode::GETXATTR, nodeid, &[&getxattr_in(64), name.as_bytes()], 64).unwrap();
    if h.error != 0 {
        return Err(-h.error);
    }
    Ok(data[..h.len as usize - 16].to_vec())
}

fn new_file(d: &mut FsDriver, name: &str) -> (u64, u64) {
    let (e, o) = d.create(1, name, 0o644, libc::O_RDWR as u32).unwrap();
    (e.nodeid, o.fh)
}

#[test]
fn xattrs_served_by_default_and_enosys_with_no_xattr() {
    let on = Daemon::start(&[]);
    let mut d = on.driver();
    let f = flags(&d);
    assert_ne!(f & init_flags::POSIX_ACL, 0, "POSIX_ACL offered by default: {f:#x}");
    assert_ne!(f & init_flags::SETXATTR_EXT, 0, "{f:#x}");
    let (ino, _) = new_file(&mut d, "f");
    assert_eq!(setxattr(&mut d, ino, "user.colour", b"blue"), 0);
    assert_eq!(getxattr(&mut d, ino, "user.colour"), Ok(b"blue".to_vec()));
    drop(d);
    let log = on.stop();
    assert!(log.contains("xattr on, posix acl on, readdirplus on"), "start-up line:\n{log}");

    let off = Daemon::start(&["--no-xattr"]);
    let mut d = off.driver();
    let f = flags(&d);
    assert_eq!(f & (init_flags::POSIX_ACL | init_flags::SETXATTR_EXT), 0, "no ACLs without xattrs: {f:#x}");
    let (ino, _) = new_file(&mut d, "f");
    // As virtiofsd without --xattr: ENOSYS, which the guest kernel turns into EOPNOTSUPP.
    assert_eq!(setxattr(&mut d, ino, "user.colour", b"blue"), libc::ENOSYS);
    assert_eq!(getxattr(&mut d, ino, "user.colour"), Err(libc::ENOSYS));
    assert_eq!(getxattr(&mut d, ino, "system.posix_acl_access"), Err(libc::ENOSYS));
    assert_eq!(errno_of(&mut d, opcode::LISTXATTR, ino, &[&getxattr_in(64)], 64), libc::ENOSYS);
    assert_eq!(errno_of(&mut d, opcode::REMOVEXATTR, ino, &[b"user.colour\0"], 0), libc::ENOSYS);
    // Everything else still works.
    d.getattr(ino).unwrap();
    drop(d);
    let log = off.stop();
    assert!(log.contains("xattr off, posix acl off"), "start-up line:\n{log}");
}

#[test]
fn no_posix_acl_keeps_xattrs() {
    let daemon = Daemon::start(&["--no-posix-acl"]);
    let mut d = daemon.driver();
    assert_eq!(flags(&d) & init_flags::POSIX_ACL, 0);
    let (ino, _) = new_file(&mut d, "f");
    assert_eq!(setxattr(&mut d, ino, "user.k", b"v"), 0);
    assert_eq!(getxattr(&mut d, ino, "user.k"), Ok(b"v".to_vec()));
}

#[test]
fn posix_acl_needs_xattrs() {
    let out = Command::new(BIN)
        .args(["--socket-path", "/nonexistent/s", "--no-xattr", "--posix-acl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--posix-acl") && err.contains("--no-xattr"), "{err}");
}

#[test]
fn readdirplus_offered_unless_disabled() {
    const RDP: u64 = init_flags::DO_READDIRPLUS | init_flags::READDIRPLUS_AUTO;
    for (args, offered) in [
        (&[][..], true),
        (&["--no-readdirplus"][..], false),
        (&["--readdirplus"][..], true),
        // As virtiofsd: off with --cache never (nothing it returns may be cached anyway), unless asked for.
        (&["--cache", "never"][..], false),
        (&["--cache", "never", "--readdirplus"][..], true),
    ] {
        let daemon = Daemon::start(args);
        let d = daemon.driver();
        let f = flags(&d);
        assert_eq!(f & RDP, if offered { RDP } else { 0 }, "{args:?}: INIT flags {f:#x}");
    }
    // The listing works either way (READDIR).
    let daemon = Daemon::start(&["--no-readdirplus"]);
    let mut d = daemon.driver();
    new_file(&mut d, "a");
    let dir = d.opendir(1).unwrap();
    let names: Vec<String> = d
        .readdir_all(1, dir.fh)
        .unwrap()
        .iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    assert!(names.iter().any(|n| n == "a"), "{names:?}");
}

fn enospc(r: Result<impl std::fmt::Debug, DriverError>) {
    match r {
        Err(e) => assert_eq!(e.fuse_errno(), Some(libc::ENOSPC), "{e}"),
        Ok(v) => panic!("expected ENOSPC, got {v:?}"),
    }
}

/// Fills a RAM filesystem of `size` bytes (file data is held in 64 KiB chunks).
fn fill_to_the_limit(d: &mut FsDriver, size: u64) {
    let (ino, fh) = new_file(d, "big");
    let chunk = vec![0xa5u8; 64 << 10];
    for i in 0..size / chunk.len() as u64 {
        assert_eq!(d.write(ino, fh, i * chunk.len() as u64, &chunk).unwrap(), chunk.len() as u32);
    }
    enospc(d.write(ino, fh, size, b"one byte more"));
    // Freeing space makes room again.
    d.truncate(ino, 0, Some(fh)).unwrap();
    assert_eq!(d.write(ino, fh, size, b"x").unwrap(), 1);
}

#[test]
fn ramfs_size_and_inodes_limits_from_flags() {
    let daemon = Daemon::start(&["--ramfs-size", "256K", "--ramfs-inodes", "3"]);
    let mut d = daemon.driver();
    let st = d.statfs(1).unwrap();
    assert_eq!(st.blocks * u64::from(st.bsize), 256 << 10, "STATFS reports the size");
    assert_eq!(st.files, 3, "STATFS reports the inode limit");
    fill_to_the_limit(&mut d, 256 << 10);
    // The root and "big" exist: one more inode, then ENOSPC.
    new_file(&mut d, "second");
    enospc(d.create(1, "third", 0o644, libc::O_RDWR as u32));
    enospc(d.mkdir(1, "dir", 0o755));
    drop(d);
    let log = daemon.stop();
    assert!(log.contains(&format!("size {} bytes, 3 inodes", 256 << 10)), "start-up line:\n{log}");
}

#[test]
fn ramfs_limits_from_the_profile_and_flags_override() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("p.toml");
    std::fs::write(&cfg, "queue_size = 64\nramfs_size = \"128K\"\nramfs_inodes = 2\n").unwrap();
    let daemon = Daemon::start(&["--config", cfg.to_str().unwrap()]);
    let mut d = daemon.driver();
    fill_to_the_limit(&mut d, 128 << 10);
    enospc(d.create(1, "second", 0o644, libc::O_RDWR as u32));
    drop(d);
    drop(daemon);

    let daemon = Daemon::start(&["--config", cfg.to_str().unwrap(), "--ramfs-inodes", "4"]);
    let mut d = daemon.driver();
    for n in ["a", "b", "c"] {
        new_file(&mut d, n);
    }
    enospc(d.create(1, "d", 0o644, libc::O_RDWR as u32));
    drop(d);
    drop(daemon);

    // Bad values name the key.
    std::fs::write(&cfg, "ramfs_inodes = 0\n").unwrap();
    let out = Command::new(BIN)
        .args(["--socket-path", dir.path().join("s").to_str().unwrap(), "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ramfs_inodes"));
    let out =
        Command::new(BIN).args(["--socket-path", "/nonexistent/s", "--ramfs-size", "12Q"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ramfs-size"));
}

/// `Max open files` soft and hard limits of process `pid`.
fn nofile(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_string();
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[3].to_string(), f[4].to_string())
}

#[test]
fn rlimit_nofile() {
    let daemon = Daemon::start(&["--rlimit-nofile", "300"]);
    assert_eq!(nofile(daemon.child.id()), ("300".into(), "300".into()));
    let mut d = daemon.driver();
    d.getattr(1).unwrap();
    drop(d);
    drop(daemon);

    // By default the soft limit is raised to the hard one; 0 leaves it alone. The shell lowers
    // the soft limit first and `exec`s the daemon (same pid).
    let dir = tempfile::tempdir().unwrap();
    for (extra, soft_after) in [("", None), ("--rlimit-nofile 0", Some("100"))] {
        let sock = dir.path().join(format!("s{}", extra.len()));
        let script = format!("ulimit -Sn 100 && exec \"$0\" --socket-path {} {extra}", sock.display());
        let mut child = Command::new("sh").args(["-c", &script, BIN]).stderr(Stdio::null()).spawn().unwrap();
        wait_for(&sock);
        let (soft, hard) = nofile(child.id());
        assert_eq!(soft, soft_after.map_or(hard.clone(), str::to_string), "{extra:?}");
        let _ = child.kill();
        let _ = child.wait();
    }

    // Raising the hard limit past what the process may: a clear error.
    let out = Command::new(BIN)
        .args([
            "--socket-path",
            dir.path().join("x").to_str().unwrap(),
            "--rlimit-nofile",
            "18446744073709551615",
        ])
        .output()
        .unwrap();
    if out.status.success() {
        return; // root with CAP_SYS_RESOURCE may (the kernel caps it at nr_open otherwise)
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--rlimit-nofile") && err.contains("open files"), "{err}");
}

#[test]
fn virtiofsd_options_that_do_not_apply() {
    for args in [
        &["--print-capabilities"][..],
        &["--migration-mode", "find-paths"][..],
        &["--migration-on-error", "guest-error"][..],
        &["--migration-verify-handles"][..],
        &["--migration-confirm-paths"][..],
    ] {
        let out = Command::new(BIN).args(["--socket-path", "/nonexistent/s"]).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(args[0]), "{args:?} named: {err}");
        let why =
            if args[0] == "--print-capabilities" { "not a vhost-user backend" } else { "does not migrate" };
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "nothing printed that could pass for capabilities");
    }
    // --thread-pool-size: accepted, served as always, with the reason it changes nothing.
    let daemon = Daemon::start(&["--thread-pool-size", "16"]);
    let mut d = daemon.driver();
    d.getattr(1).unwrap();
    drop(d);
    let log = daemon.stop();
    assert!(log.contains("--thread-pool-size 16: ignored") && log.contains("pollers"), "{log}");
}

#[test]
fn help_documents_every_option() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--xattr",
        "--no-xattr",
        "--posix-acl",
        "--no-posix-acl",
        "--readdirplus",
        "--no-readdirplus",
        "--rlimit-nofile",
        "--ramfs-size",
        "--ramfs-inodes",
        "--thread-pool-size",
        "--print-capabilities",
        "--migration-mode",
        "--migration-on-error",
        "--migration-verify-handles",
        "--migration-confirm-paths",
        "virtiofsd options that do not apply",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

#[test]
fn passthrough_takes_the_same_options() {
    let share = tempfile::tempdir().unwrap();
    let dir = share.path().to_str().unwrap();
    let daemon = Daemon::start(&["--shared-dir", dir, "--sandbox", "none", "--no-xattr", "--no-readdirplus"]);
    let mut d = daemon.driver();
    let f = flags(&d);
    assert_eq!(
        f & (init_flags::POSIX_ACL | init_flags::DO_READDIRPLUS | init_flags::READDIRPLUS_AUTO),
        0,
        "{f:#x}"
    );
    let (ino, fh) = new_file(&mut d, "f");
    // Served by the passthrough's per-poller engine path too: answered before the filesystem.
    assert_eq!(setxattr(&mut d, ino, "user.k", b"v"), libc::ENOSYS);
    assert_eq!(getxattr(&mut d, ino, "user.k"), Err(libc::ENOSYS));
    assert_eq!(d.write(ino, fh, 0, b"data").unwrap(), 4);
    drop(d);
    drop(daemon);

    let daemon = Daemon::start(&["--shared-dir", dir, "--sandbox", "none", "--no-posix-acl"]);
    let d = daemon.driver();
    assert_eq!(flags(&d) & init_flags::POSIX_ACL, 0);
    assert_ne!(flags(&d) & init_flags::DO_READDIRPLUS, 0);
    // The RAM filesystem's limits do not apply to a shared directory.
    let out = Command::new(BIN)
        .args(["--socket-path", "/nonexistent/s", "--shared-dir", dir, "--ramfs-size", "1G"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ramfs-size"));
}

#[test]
fn writeback_is_refused_with_the_nfs_backend() {
    // Checked before the export is mounted: no server is needed, and no socket is left.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let out = Command::new(BIN)
        .arg("--socket-path")
        .arg(&sock)
        .args(["--writeback", "--remote", "nfs://127.0.0.1/export"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--writeback") && err.contains("NFS backend"), "{err}");
    assert!(!sock.exists(), "no socket for a refused start");
}
