//! End-to-end: the device serving a host directory (a `FuseHandler` over a `PassthroughFs`, every READ/WRITE/FSYNC
//! on a poller's io_uring), driven
//! by the host driver model over vfio-user: the ordinary workload, then crafted FUSE requests that
//! try to leave the shared directory. A canary file and directory beside it (watched with
//! inotify, snapshotted, and searched for in every reply) must stay untouched. The workloads run
//! on split and on packed virtqueues (`split::*`, `packed::*`): on the io_uring path the device
//! completes requests out of order.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};

use virtiofs_backend::passthrough::uring::IoMode;
use virtiofs_backend::passthrough::PassthroughConfig;
use virtiofs_backend::PassthroughFs;
use virtiofs_dpu::config::Profile;
use virtiofs_dpu::{FuseHandler, RunningDevice};
use virtiofs_tools::fuse_abi::{self as abi, opcode};
use virtiofs_tools::virtqueue::RingLayout;
use virtiofs_tools::{DriverOptions, FsDriver};

#[macro_use]
mod rings;
const ROOT: u64 = 1;
const RDWR: u32 = libc::O_RDWR as u32;
const SECRET: &[u8] = b"E2E-CANARY-SECRET-91c3f0";
const INNER: &str = "e2e-inner-canary-5a7d";

struct Setup {
    handler: std::sync::Arc<FuseHandler<PassthroughFs>>,
    base: tempfile::TempDir,
    share: PathBuf,
    device: Option<RunningDevice>,
    socket: PathBuf,
    inotify: std::fs::File,
    before: Vec<(PathBuf, Snapshot)>,
    outside_inos: Vec<u64>,
    ring: RingLayout,
}

#[derive(Debug, PartialEq, Eq)]
struct Snapshot(u64, u32, u64, u64, (i64, i64), (i64, i64), Vec<u8>);

fn snapshot(p: &Path) -> Snapshot {
    let m = std::fs::symlink_metadata(p).unwrap();
    let content = if m.is_dir() {
        let mut v: Vec<Vec<u8>> =
            std::fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name().as_bytes().to_vec()).collect();
        v.sort();
        v.join(&b'/')
    } else {
        std::fs::read(p).unwrap()
    };
    Snapshot(
        m.ino(),
        m.mode(),
        m.nlink(),
        m.size(),
        (m.mtime(), m.mtime_nsec()),
        (m.ctime(), m.ctime_nsec()),
        content,
    )
}

impl Setup {
    fn new() -> Setup {
        Self::with(IoMode::Ring, RingLayout::Split)
    }

    fn with(mode: IoMode, ring: RingLayout) -> Setup {
        let base = tempfile::tempdir().unwrap();
        let share = base.path().join("share");
        std::fs::create_dir(&share).unwrap();
        let canary = base.path().join("canary.txt");
        let cdir = base.path().join("canary_dir");
        std::fs::write(&canary, SECRET).unwrap();
        std::fs::create_dir(&cdir).unwrap();
        std::fs::write(cdir.join(INNER), SECRET).unwrap();
        let socket = base.path().join("dev.sock");
        let fs = PassthroughFs::new(PassthroughConfig::new(&share)).unwrap();
        let handler = std::sync::Arc::new(FuseHandler::new({
            let mut fs = fs;
            fs.set_io_mode(mode);
            fs
        }));
        let device =
            RunningDevice::start_with(&socket, Profile::default(), handler.clone()).expect("device starts");
        let watched = [canary, cdir.clone(), cdir.join(INNER), base.path().to_path_buf()];
        let before: Vec<(PathBuf, Snapshot)> = watched.iter().map(|p| (p.clone(), snapshot(p))).collect();
        let mut outside_inos: Vec<u64> = before.iter().map(|(_, s)| s.0).collect();
        outside_inos.push(std::fs::metadata(base.path().parent().unwrap()).unwrap().ino());
        // SAFETY: plain system call; the descriptor is owned by the File below.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a new descriptor nobody else owns.
        let inotify = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        for p in &watched {
            let c = CString::new(p.as_os_str().as_bytes()).unwrap();
            // SAFETY: `c` is NUL-terminated; the mask is a plain integer.
            assert!(unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_ALL_EVENTS) } >= 0);
        }
        Setup { handler, base, share, device: Some(device), socket, inotify, before, outside_inos, ring }
    }

    fn connect(&self) -> FsDriver {
        let mut d = FsDriver::connect(&self.socket, DriverOptions { ring: self.ring, ..Default::default() })
            .expect("driver brings the device up");
        assert_eq!(d.facts().ring, self.ring);
        d.init().unwrap();
        d
    }

    fn host(&self, rel: &str) -> PathBuf {
        self.share.join(rel)
    }

    fn canary_dir(&self) -> PathBuf {
        self.base.path().join("canary_dir")
    }

    /// Fails on any inotify event on the canaries (other than about the share itself), any
    /// change to them, and on an inode number of theirs in `inos`.
    fn check(&self, what: &str, inos: &[u64]) {
        use std::io::Read;
        let mut buf = [0u8; 8192];
        let mut events = Vec::new();
        while let Ok(n) = (&self.inotify).read(&mut buf) {
            let mut at = 0;
            while at + 16 <= n {
                let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
                let mask = u32::from_ne_bytes(buf[at + 4..at + 8].try_into().unwrap());
                let raw = &buf[at + 16..at + 16 + len];
                let name = String::from_utf8_lossy(&raw[..raw.iter().position(|&b| b == 0).unwrap_or(len)]);
                if name != "share" && name != "dev.sock" {
                    events.push((mask, name.into_owned()));
                }
                at += 16 + len;
            }
        }
        assert!(events.is_empty(), "{what}: inotify events outside the share: {events:x?}");
        for (p, s) in &self.before {
            assert_eq!(&snapshot(p), s, "{what}: {p:?} changed");
        }
        while (&self.inotify).read(&mut buf).is_ok() {}
        for ino in inos {
            assert!(!self.outside_inos.contains(ino), "{what}: a reply showed outside inode {ino}");
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(d) = self.device.take() {
            let _ = d.stop();
        }
    }
}

fn cstr(s: &[u8]) -> Vec<u8> {
    let mut v = s.to_vec();
    v.push(0);
    v
}

/// A raw LOOKUP; the errno (0 on success) and the entry.
fn raw_lookup(d: &mut FsDriver, parent: u64, name: &[u8]) -> (i32, Option<abi::EntryOut>) {
    let (h, p) = d.call(1, opcode::LOOKUP, parent, &[&cstr(name)], abi::EntryOut::SIZE).unwrap();
    (-h.error, abi::EntryOut::decode(&p))
}

fn workload_on_a_shared_directory(ring: RingLayout) {
    let s = Setup::with(IoMode::Ring, ring);
    workload(&s);
    // 8 WRITEs, 8 READs and the FSYNC went through a poller's io_uring.
    assert!(s.handler.pending_requests() >= 17, "ring requests: {}", s.handler.pending_requests());
}

fn workload_in_hybrid_and_sync_modes(ring: RingLayout) {
    for mode in [IoMode::Hybrid, IoMode::Sync] {
        let s = Setup::with(mode, ring);
        workload(&s);
        if mode == IoMode::Sync {
            assert_eq!(s.handler.pending_requests(), 0);
        }
    }
}

fn workload(s: &Setup) {
    let mut d = s.connect();
    let dir = d.mkdir(ROOT, "dir", 0o755).unwrap();
    let (file, open) = d.create(dir.nodeid, "data", 0o644, RDWR).unwrap();
    let data: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    for (i, chunk) in data.chunks(128 << 10).enumerate() {
        assert_eq!(
            d.write(file.nodeid, open.fh, (i * (128 << 10)) as u64, chunk).unwrap() as usize,
            chunk.len()
        );
    }
    assert_eq!(std::fs::read(s.host("dir/data")).unwrap(), data, "the host file has the data");
    let mut back = Vec::new();
    for off in (0..data.len()).step_by(128 << 10) {
        back.extend(d.read(file.nodeid, open.fh, off as u64, 128 << 10).unwrap());
    }
    assert!(back == data);
    d.fsync(file.nodeid, open.fh, false).unwrap();
    d.release(file.nodeid, open.fh).unwrap();
    let attr = d.getattr(file.nodeid).unwrap();
    assert_eq!(attr.ino, std::fs::metadata(s.host("dir/data")).unwrap().ino());
    let dh = d.opendir(dir.nodeid).unwrap();
    let names: Vec<Vec<u8>> = d.readdir_all(dir.nodeid, dh.fh).unwrap().into_iter().map(|e| e.name).collect();
    assert!(names.contains(&b"data".to_vec()));
    d.releasedir(dir.nodeid, dh.fh).unwrap();
    d.rename(dir.nodeid, "data", ROOT, "renamed").unwrap();
    assert!(s.host("renamed").is_file());
    d.unlink(ROOT, "renamed").unwrap();
    d.rmdir(ROOT, "dir").unwrap();
    assert!(d.statfs(ROOT).unwrap().bsize > 0);
    d.shutdown().unwrap();
    s.check("workload", &[attr.ino]);
}

#[test]
fn crafted_requests_stay_beneath_the_root() {
    let s = Setup::new();
    let mut d = s.connect();
    let mut inos = Vec::new();
    std::fs::write(s.host("f"), b"in").unwrap();
    std::fs::create_dir(s.host("sub")).unwrap();

    // Names with '/', "..", "." and NUL.
    for name in [&b"../canary.txt"[..], b"a/b", b"/etc/passwd", b"..//canary_dir", b"/"] {
        assert_eq!(raw_lookup(&mut d, ROOT, name).0, libc::EINVAL, "{name:?}");
        let mk = abi::MkdirIn { mode: 0o777, umask: 0 }.to_bytes();
        let (h, _) = d.call(1, opcode::MKDIR, ROOT, &[&mk, &cstr(name)], abi::EntryOut::SIZE).unwrap();
        assert_eq!(-h.error, libc::EINVAL);
        let cr = abi::CreateIn { flags: RDWR, mode: 0o666, umask: 0, open_flags: 0 }.to_bytes();
        let (h, _) = d.call(1, opcode::CREATE, ROOT, &[&cr, &cstr(name)], abi::EntryOut::SIZE + 16).unwrap();
        assert_eq!(-h.error, libc::EINVAL);
        let (h, _) =
            d.call(1, opcode::SYMLINK, ROOT, &[&cstr(name), &cstr(b"x")], abi::EntryOut::SIZE).unwrap();
        assert_eq!(-h.error, libc::EINVAL);
        let rn = abi::RenameIn { newdir: ROOT }.to_bytes();
        let (h, _) = d.call(1, opcode::RENAME, ROOT, &[&rn, &cstr(b"f"), &cstr(name)], 0).unwrap();
        assert_eq!(-h.error, libc::EINVAL);
        let (h, _) = d.call(1, opcode::RENAME, ROOT, &[&rn, &cstr(name), &cstr(b"stolen")], 0).unwrap();
        assert_eq!(-h.error, libc::EINVAL);
    }
    assert_eq!(raw_lookup(&mut d, ROOT, b".").0, libc::EINVAL);
    let (err, e) = raw_lookup(&mut d, ROOT, b"f\0../canary.txt");
    assert_eq!(err, 0, "the name ends at the NUL");
    inos.push(e.unwrap().attr.ino);
    // ".." at the root is the root, however often.
    let mut node = ROOT;
    for _ in 0..4 {
        let (err, e) = raw_lookup(&mut d, node, b"..");
        assert_eq!(err, 0);
        let e = e.unwrap();
        assert_eq!(e.nodeid, ROOT);
        inos.push(e.attr.ino);
        node = e.nodeid;
    }
    assert_eq!(raw_lookup(&mut d, node, b"canary.txt").0, libc::ENOENT);
    let sub = d.lookup(ROOT, "sub").unwrap();
    let (_, up) = raw_lookup(&mut d, sub.nodeid, b"..");
    assert_eq!(up.unwrap().nodeid, ROOT);

    // Symlinks pointing out, absolute and relative: looked up as links, never followed.
    let canary = s.base.path().join("canary.txt");
    let targets = [
        canary.to_str().unwrap().to_string(),
        s.canary_dir().to_str().unwrap().to_string(),
        "../canary.txt".into(),
        "../canary_dir".into(),
        "../../../../../../..".into(),
        "/".into(),
    ];
    for (i, t) in targets.iter().enumerate() {
        symlink(t, s.host(&format!("host{i}"))).unwrap();
        d.symlink(ROOT, &format!("guest{i}"), t).unwrap();
    }
    for (i, target) in targets.iter().enumerate() {
        for name in [format!("host{i}"), format!("guest{i}")] {
            let l = d.lookup(ROOT, &name).unwrap();
            inos.push(l.attr.ino);
            assert_eq!(l.attr.mode & libc::S_IFMT, libc::S_IFLNK);
            assert_eq!(d.readlink(l.nodeid).unwrap(), target.as_bytes());
            let a = d.getattr(l.nodeid).unwrap();
            inos.push(a.ino);
            assert_eq!(a.mode & libc::S_IFMT, libc::S_IFLNK);
            for flags in [libc::O_RDONLY, libc::O_RDWR | libc::O_TRUNC] {
                assert_eq!(d.open(l.nodeid, flags as u32).unwrap_err().fuse_errno(), Some(libc::ELOOP));
            }
            assert_eq!(d.opendir(l.nodeid).unwrap_err().fuse_errno(), Some(libc::ENOTDIR));
            assert_eq!(raw_lookup(&mut d, l.nodeid, INNER.as_bytes()).0, libc::ENOTDIR);
            assert_eq!(
                d.create(l.nodeid, "planted", 0o666, RDWR).unwrap_err().fuse_errno(),
                Some(libc::ENOTDIR)
            );
            assert_eq!(d.mkdir(l.nodeid, "planted", 0o777).unwrap_err().fuse_errno(), Some(libc::ENOTDIR));
            // CREATE over the link name itself, even with O_TRUNC, opens nothing.
            let err = d.create(ROOT, &name, 0o666, RDWR | libc::O_TRUNC as u32).unwrap_err().fuse_errno();
            assert_eq!(err, Some(libc::ELOOP));
        }
    }

    // A directory swapped for a symlink to the canary directory between LOOKUP and use.
    let sub_ino = sub.attr.ino;
    std::fs::rename(s.host("sub"), s.host("sub.moved")).unwrap();
    symlink(s.canary_dir(), s.host("sub")).unwrap();
    let (e, o) = d.create(sub.nodeid, "planted", 0o644, RDWR).unwrap();
    inos.push(e.attr.ino);
    d.release(e.nodeid, o.fh).unwrap();
    assert!(s.host("sub.moved/planted").is_file(), "created in the directory the node is");
    let dh = d.opendir(sub.nodeid).unwrap();
    let list = d.readdir_all(sub.nodeid, dh.fh).unwrap();
    inos.extend(list.iter().map(|e| e.ino));
    assert!(!list.iter().any(|e| e.name == INNER.as_bytes()));
    d.releasedir(sub.nodeid, dh.fh).unwrap();
    assert_eq!(d.getattr(sub.nodeid).unwrap().ino, sub_ino);
    // A file swapped likewise between LOOKUP and OPEN.
    let f = d.lookup(ROOT, "f").unwrap();
    std::fs::rename(s.host("f"), s.host("f.moved")).unwrap();
    symlink(&canary, s.host("f")).unwrap();
    let o = d.open(f.nodeid, RDWR | libc::O_TRUNC as u32).unwrap();
    d.write(f.nodeid, o.fh, 0, b"mine").unwrap();
    d.release(f.nodeid, o.fh).unwrap();
    assert_eq!(std::fs::read(s.host("f.moved")).unwrap(), b"mine");

    // Hard links and renames towards the outside: only node ids we issued, only into
    // directories.
    let link_to_dir = d.lookup(ROOT, "host1").unwrap();
    assert_eq!(d.link(f.nodeid, link_to_dir.nodeid, "x").unwrap_err().fuse_errno(), Some(libc::ENOTDIR));
    assert_eq!(d.link(f.nodeid, 999_999, "x").unwrap_err().fuse_errno(), Some(libc::ENOENT));
    assert_eq!(
        d.rename(ROOT, "f.moved", link_to_dir.nodeid, "x").unwrap_err().fuse_errno(),
        Some(libc::ENOTDIR)
    );
    assert_eq!(d.rename(ROOT, "f.moved", 999_999, "x").unwrap_err().fuse_errno(), Some(libc::ENOENT));
    assert_eq!(
        d.rename(link_to_dir.nodeid, INNER, ROOT, "stolen").unwrap_err().fuse_errno(),
        Some(libc::ENOTDIR)
    );
    let hl = d.link(link_to_dir.nodeid, ROOT, "hardlink-to-symlink").unwrap();
    assert_eq!(hl.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    // Special files are never opened.
    let fifo = d.mknod(ROOT, "fifo", libc::S_IFIFO | 0o666, 0).unwrap();
    assert_eq!(d.open(fifo.nodeid, libc::O_RDONLY as u32).unwrap_err().fuse_errno(), Some(libc::ENXIO));
    // The whole tree, listed: nothing from outside.
    let dh = d.opendir(ROOT).unwrap();
    let plus = d.readdirplus(ROOT, dh.fh, 0, 64 << 10).unwrap();
    for p in &plus {
        inos.push(p.dirent.ino);
        inos.push(p.entry.attr.ino);
    }
    d.releasedir(ROOT, dh.fh).unwrap();
    d.shutdown().unwrap();
    s.check("crafted", &inos);
}

on_both_layouts!(workload_on_a_shared_directory, workload_in_hybrid_and_sync_modes);
