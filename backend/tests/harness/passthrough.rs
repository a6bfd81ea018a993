//! The passthrough's sessions: [`Fuse`] over a [`PassthroughFs`] of a fresh host directory
//! ([`Tree`]), recording every reply so the escape tests can check that no inode number of a
//! file outside the shared directory shows. Also the canary: files and a directory beside the
//! shared directory, watched with inotify, that no request may read, write, list, create in or
//! stat.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use virtiofs_backend::passthrough::{PassthroughConfig, PassthroughFs};

use super::TestFs;

/// A session over a passthrough of a host directory.
pub type Fuse = super::Fuse<PassthroughFs>;

impl super::Fuse<PassthroughFs> {
    /// A passthrough of `root` after a Linux-6.12-like INIT.
    pub fn new(root: &Path) -> Self {
        Self::uninit(root).initialised()
    }

    /// A passthrough of `root` with the configuration `adjust` makes, after INIT.
    #[allow(dead_code)] // not every test binary uses it
    pub fn with_config(root: &Path, adjust: impl FnOnce(&mut PassthroughConfig)) -> Self {
        let mut cfg = PassthroughConfig::new(root);
        adjust(&mut cfg);
        let fs = PassthroughFs::new(cfg).expect("passthrough starts");
        let mut f = Self::with_fs(fs).recording();
        f.dot_attrs = false;
        f.initialised()
    }

    /// A passthrough of `root`, not initialised.
    pub fn uninit(root: &Path) -> Self {
        let fs = PassthroughFs::new(PassthroughConfig::new(root)).expect("passthrough starts");
        let mut f = Self::with_fs(fs).recording();
        f.dot_attrs = false;
        f
    }
}

impl TestFs for PassthroughFs {
    fn lookup_count(&self, ino: u64) -> Option<u64> {
        PassthroughFs::lookup_count(self, ino)
    }
}

/// The shared directory and what lies beside it.
pub struct Tree {
    pub base: tempfile::TempDir,
    pub share: PathBuf,
}

impl Tree {
    pub fn new() -> Tree {
        Self::with_base(tempfile::tempdir().unwrap())
    }

    /// A tree under `parent` (a tmpfs, say).
    pub fn new_in(parent: &Path) -> Tree {
        Self::with_base(tempfile::tempdir_in(parent).unwrap())
    }

    fn with_base(base: tempfile::TempDir) -> Tree {
        let share = base.path().join("share");
        std::fs::create_dir(&share).unwrap();
        // Others may search the share (the tests act as other users too).
        std::fs::set_permissions(&share, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        Tree { base, share }
    }

    /// A tree whose shared directory is like the root of a fresh RAM filesystem (root's, 0755),
    /// for the tests both backends run.
    pub fn like_ramfs() -> Tree {
        let t = Self::new();
        std::fs::set_permissions(&t.share, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        t
    }

    pub fn host(&self, rel: &str) -> PathBuf {
        self.share.join(rel)
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Everything observable about a path outside the share, without reading it through the server.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    ino: u64,
    mode: u32,
    uid: u32,
    nlink: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    content: Vec<u8>,
}

fn snapshot(p: &Path) -> Snapshot {
    let m = std::fs::symlink_metadata(p).unwrap();
    let content = if m.is_dir() {
        let mut names: Vec<Vec<u8>> =
            std::fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name().as_bytes().to_vec()).collect();
        names.sort();
        names.join(&b'/')
    } else {
        std::fs::read(p).unwrap()
    };
    Snapshot {
        ino: m.ino(),
        mode: m.mode(),
        uid: m.uid(),
        nlink: m.nlink(),
        size: m.size(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
        content,
    }
}

/// Files and a directory beside the share that no request may touch. `check` fails on any change
/// of their metadata or content, on any inotify event on them (open, read, write, create, list,
/// attribute change), on a reply showing one of their inode numbers, and on a reply carrying
/// their secret content or names.
pub struct Canary {
    pub file: PathBuf,
    pub dir: PathBuf,
    pub inner: PathBuf,
    pub secret: Vec<u8>,
    pub inner_name: Vec<u8>,
    watched: Vec<PathBuf>,
    before: Vec<Snapshot>,
    outside_inos: Vec<u64>,
    inotify: std::fs::File,
}

impl Canary {
    pub fn new(tree: &Tree) -> Canary {
        let base = tree.base.path();
        let file = base.join("canary.txt");
        let dir = base.join("canary_dir");
        let inner_name = b"inner-canary-4f1d2b".to_vec();
        let inner = dir.join(std::str::from_utf8(&inner_name).unwrap());
        let secret = b"CANARY-SECRET-7e3a9c51d0".to_vec();
        std::fs::write(&file, &secret).unwrap();
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(&inner, &secret).unwrap();
        for p in [&file, &dir, &inner] {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        }
        let watched = vec![file.clone(), dir.clone(), inner.clone(), base.to_path_buf()];
        let before: Vec<Snapshot> = watched.iter().map(|p| snapshot(p)).collect();
        let mut outside_inos: Vec<u64> = before.iter().map(|s| s.ino).collect();
        if let Some(parent) = base.parent() {
            outside_inos.push(std::fs::metadata(parent).unwrap().ino());
        }
        outside_inos.push(std::fs::metadata("/").unwrap().ino());
        // SAFETY: plain system call; the descriptor is owned by the File below.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1");
        // SAFETY: `fd` is a new descriptor nobody else owns.
        let inotify = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        for p in &watched {
            let c = CString::new(p.as_os_str().as_bytes()).unwrap();
            // SAFETY: `c` is NUL-terminated; the mask is a plain integer.
            let wd = unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_ALL_EVENTS) };
            assert!(wd >= 0, "inotify_add_watch {p:?}");
        }
        Canary { file, dir, inner, secret, inner_name, watched, before, outside_inos, inotify }
    }

    /// Inotify events since the last call, as (watched path index, mask, name), ignoring events
    /// about the share itself inside the base directory.
    fn events(&self) -> Vec<(u32, String)> {
        use std::io::Read;
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = match (&self.inotify).read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("inotify read: {e}"),
            };
            let mut at = 0;
            while at + 16 <= n {
                let mask = u32::from_ne_bytes(buf[at + 4..at + 8].try_into().unwrap());
                let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
                let raw = &buf[at + 16..at + 16 + len];
                let name = String::from_utf8_lossy(&raw[..raw.iter().position(|&b| b == 0).unwrap_or(len)]);
                at += 16 + len;
                if name == "share" {
                    continue;
                }
                out.push((mask, name.into_owned()));
            }
        }
        out
    }

    pub fn check(&self, fuse: &Fuse, what: &str) {
        let ev = self.events();
        assert!(ev.is_empty(), "{what}: inotify events outside the share: {ev:x?}");
        for (p, b) in self.watched.iter().zip(&self.before) {
            assert_eq!(&snapshot(p), b, "{what}: {p:?} changed");
        }
        // Snapshots read the canaries themselves: drain the events that caused.
        let _ = self.events();
        for ino in fuse.seen_inos.borrow().iter() {
            assert!(!self.outside_inos.contains(ino), "{what}: a reply showed outside inode {ino}");
        }
        let seen = fuse.seen_bytes.borrow();
        for needle in [&self.secret, &self.inner_name] {
            assert!(
                !seen.windows(needle.len()).any(|w| w == &needle[..]),
                "{what}: a reply carried canary bytes {:?}",
                String::from_utf8_lossy(needle)
            );
        }
    }
}
