//! A FUSE "kernel" over a [`PassthroughFs`] for the passthrough tests: builds requests as bytes,
//! hands them to `Server::handle`, decodes replies, and records every inode number a reply shows
//! so the escape tests can check none belongs to a file outside the shared directory. Also the
//! canary: files and a directory beside the shared directory, watched with inotify, that no
//! request may read, write, list, create in or stat.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::passthrough::{PassthroughConfig, PassthroughFs};
use virtiofs_backend::Server;
use vm_memory::{ByteValued, VolatileSlice};

pub const ROOT: u64 = abi::ROOT_ID;
pub const HDR: usize = std::mem::size_of::<abi::OutHeader>();
pub type R<T> = Result<T, i32>;
/// A READDIR entry: (ino, next offset, type, name).
pub type Dirent = (u64, u64, u32, Vec<u8>);
/// A READDIRPLUS entry: (entry, next offset, name).
pub type DirentPlus = (abi::EntryOut, u64, Vec<u8>);

pub fn parse<T: ByteValued + Default>(bytes: &[u8]) -> T {
    let mut t = T::default();
    let n = std::mem::size_of::<T>();
    t.as_mut_slice().copy_from_slice(&bytes[..n]);
    t
}

pub fn cstr(s: &[u8]) -> Vec<u8> {
    let mut v = s.to_vec();
    v.push(0);
    v
}

/// What a Linux 6.12 virtio-fs mount offers in INIT (no DAX).
pub const LINUX_FLAGS: u64 = abi::init::ASYNC_READ
    | abi::init::POSIX_LOCKS
    | abi::init::ATOMIC_O_TRUNC
    | abi::init::EXPORT_SUPPORT
    | abi::init::BIG_WRITES
    | abi::init::DONT_MASK
    | abi::init::FLOCK_LOCKS
    | abi::init::AUTO_INVAL_DATA
    | abi::init::DO_READDIRPLUS
    | abi::init::READDIRPLUS_AUTO
    | abi::init::ASYNC_DIO
    | abi::init::WRITEBACK_CACHE
    | abi::init::PARALLEL_DIROPS
    | abi::init::HANDLE_KILLPRIV
    | abi::init::POSIX_ACL
    | abi::init::MAX_PAGES
    | abi::init::HANDLE_KILLPRIV_V2
    | abi::init::SETXATTR_EXT
    | abi::init::INIT_EXT
    | abi::init::CREATE_SUPP_GROUP;

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

    pub fn host(&self, rel: &str) -> PathBuf {
        self.share.join(rel)
    }
}

pub struct Reply {
    pub n: usize,
    pub hdr: abi::OutHeader,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn result(self) -> R<Vec<u8>> {
        if self.hdr.error == 0 {
            Ok(self.body)
        } else {
            assert_eq!(self.n, HDR, "an error reply is a bare header");
            Err(-self.hdr.error)
        }
    }
}

/// One FUSE session against a passthrough of `tree.share`.
pub struct Fuse {
    pub srv: Server<PassthroughFs>,
    unique: Cell<u64>,
    pub uid: Cell<u32>,
    pub gid: Cell<u32>,
    /// Every inode number (attr.ino / d_ino) a reply showed.
    pub seen_inos: RefCell<Vec<u64>>,
    /// Every reply body, concatenated (searched for canary content).
    pub seen_bytes: RefCell<Vec<u8>>,
}

impl Fuse {
    pub fn new(root: &Path) -> Fuse {
        let f = Self::uninit(root);
        f.init(LINUX_FLAGS).expect("init");
        f
    }

    pub fn uninit(root: &Path) -> Fuse {
        let fs = PassthroughFs::new(PassthroughConfig::new(root)).expect("passthrough starts");
        Fuse {
            srv: Server::new(fs),
            unique: Cell::new(0),
            uid: Cell::new(0),
            gid: Cell::new(0),
            seen_inos: RefCell::default(),
            seen_bytes: RefCell::default(),
        }
    }

    pub fn fs(&self) -> &PassthroughFs {
        self.srv.filesystem()
    }

    pub fn as_user(&self, uid: u32, gid: u32) -> &Self {
        self.uid.set(uid);
        self.gid.set(gid);
        self
    }

    pub fn raw(&self, op: u32, nodeid: u64, args: &[&[u8]]) -> Reply {
        self.raw_ext(op, nodeid, args, &[])
    }

    /// A request whose arguments are followed by the request extensions `ext` (whole 8-byte
    /// units, as `total_extlen` counts them).
    pub fn raw_ext(&self, op: u32, nodeid: u64, args: &[&[u8]], ext: &[u8]) -> Reply {
        self.unique.set(self.unique.get() + 2);
        let args: Vec<&[u8]> = args.iter().copied().chain((!ext.is_empty()).then_some(ext)).collect();
        let args = &args[..];
        let len = std::mem::size_of::<abi::InHeader>() + args.iter().map(|a| a.len()).sum::<usize>();
        let hdr = abi::InHeader {
            len: len as u32,
            opcode: op,
            unique: self.unique.get(),
            nodeid,
            uid: self.uid.get(),
            gid: self.gid.get(),
            pid: 42,
            total_extlen: (ext.len() / 8) as u16,
            padding: 0,
        };
        let mut req = hdr.as_slice().to_vec();
        for a in args {
            req.extend_from_slice(a);
        }
        let mut rbuf = req.clone();
        let mut wbuf = vec![0xa5u8; HDR + (2 << 20)];
        let n = {
            let readable = [VolatileSlice::from(&mut rbuf[..])];
            let writable = [VolatileSlice::from(&mut wbuf[..])];
            self.srv.handle(&readable, &writable)
        };
        if n == 0 {
            return Reply { n, hdr: abi::OutHeader::default(), body: Vec::new() };
        }
        let out: abi::OutHeader = parse(&wbuf);
        assert_eq!(out.len as usize, n);
        assert_eq!(out.unique, hdr.unique);
        let body = wbuf[HDR..n].to_vec();
        self.record(op, &body);
        Reply { n, hdr: out, body }
    }

    fn record(&self, op: u32, body: &[u8]) {
        self.seen_bytes.borrow_mut().extend_from_slice(body);
        let mut inos = self.seen_inos.borrow_mut();
        match op {
            opcode::LOOKUP
            | opcode::MKDIR
            | opcode::MKNOD
            | opcode::SYMLINK
            | opcode::LINK
            | opcode::CREATE
            | opcode::TMPFILE
                if body.len() >= std::mem::size_of::<abi::EntryOut>() =>
            {
                let e: abi::EntryOut = parse(body);
                inos.push(e.attr.ino);
            }
            opcode::GETATTR | opcode::SETATTR if body.len() >= std::mem::size_of::<abi::AttrOut>() => {
                let a: abi::AttrOut = parse(body);
                inos.push(a.attr.ino);
            }
            opcode::READDIR => {
                let mut at = 0;
                while at + 24 <= body.len() {
                    let d: abi::Dirent = parse(&body[at..]);
                    inos.push(d.ino);
                    at += abi::dirent_size(d.namelen as usize);
                }
            }
            opcode::READDIRPLUS => {
                let mut at = 0;
                while at + 152 <= body.len() {
                    let d: abi::DirentPlus = parse(&body[at..]);
                    inos.push(d.dirent.ino);
                    inos.push(d.entry_out.attr.ino);
                    at += abi::direntplus_size(d.dirent.namelen as usize);
                }
            }
            _ => {}
        }
    }

    pub fn init(&self, flags: u64) -> R<abi::InitOut> {
        let mut v = abi::InitInCompat { major: 7, minor: 41, max_readahead: 131072, flags: flags as u32 }
            .as_slice()
            .to_vec();
        v.extend_from_slice(abi::InitInExt { flags2: (flags >> 32) as u32, unused: [0; 11] }.as_slice());
        let body = self.raw(opcode::INIT, 0, &[&v]).result()?;
        let mut full = body;
        full.resize(64, 0);
        Ok(parse(&full))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> R<abi::EntryOut> {
        Ok(parse(&self.raw(opcode::LOOKUP, parent, &[&cstr(name)]).result()?))
    }

    pub fn forget(&self, ino: u64, n: u64) {
        assert_eq!(self.raw(opcode::FORGET, ino, &[abi::ForgetIn { nlookup: n }.as_slice()]).n, 0);
    }

    pub fn getattr(&self, ino: u64) -> R<abi::Attr> {
        let arg = abi::GetattrIn::default();
        let out: abi::AttrOut = parse(&self.raw(opcode::GETATTR, ino, &[arg.as_slice()]).result()?);
        Ok(out.attr)
    }

    pub fn setattr(&self, ino: u64, arg: abi::SetattrIn) -> R<abi::Attr> {
        let out: abi::AttrOut = parse(&self.raw(opcode::SETATTR, ino, &[arg.as_slice()]).result()?);
        Ok(out.attr)
    }

    pub fn chmod(&self, ino: u64, mode: u32) -> R<abi::Attr> {
        self.setattr(ino, abi::SetattrIn { valid: abi::fattr::MODE, mode, ..Default::default() })
    }

    pub fn chown(&self, ino: u64, uid: u32, gid: u32) -> R<abi::Attr> {
        let valid = abi::fattr::UID | abi::fattr::GID;
        self.setattr(ino, abi::SetattrIn { valid, uid, gid, ..Default::default() })
    }

    pub fn truncate(&self, ino: u64, size: u64, fh: Option<u64>) -> R<abi::Attr> {
        let mut a = abi::SetattrIn { valid: abi::fattr::SIZE, size, ..Default::default() };
        if let Some(fh) = fh {
            a.valid |= abi::fattr::FH;
            a.fh = fh;
        }
        self.setattr(ino, a)
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32) -> R<abi::EntryOut> {
        self.mkdir_umask(parent, name, mode, 0)
    }

    pub fn mkdir_umask(&self, parent: u64, name: &[u8], mode: u32, umask: u32) -> R<abi::EntryOut> {
        let arg = abi::MkdirIn { mode, umask };
        Ok(parse(&self.raw(opcode::MKDIR, parent, &[arg.as_slice(), &cstr(name)]).result()?))
    }

    pub fn mknod(&self, parent: u64, name: &[u8], mode: u32, rdev: u32) -> R<abi::EntryOut> {
        let arg = abi::MknodIn { mode, rdev, umask: 0, padding: 0 };
        Ok(parse(&self.raw(opcode::MKNOD, parent, &[arg.as_slice(), &cstr(name)]).result()?))
    }

    pub fn create(&self, parent: u64, name: &[u8], mode: u32, flags: u32) -> R<(abi::EntryOut, u64)> {
        let arg = abi::CreateIn { flags, mode, umask: 0, open_flags: 0 };
        let body = self.raw(opcode::CREATE, parent, &[arg.as_slice(), &cstr(name)]).result()?;
        assert_eq!(body.len(), 128 + 16);
        let open: abi::OpenOut = parse(&body[128..]);
        Ok((parse(&body), open.fh))
    }

    pub fn tmpfile(&self, parent: u64, mode: u32, flags: u32) -> R<(abi::EntryOut, u64)> {
        let arg = abi::CreateIn { flags, mode, umask: 0, open_flags: 0 };
        let body = self.raw(opcode::TMPFILE, parent, &[arg.as_slice(), b"/\0"]).result()?;
        let open: abi::OpenOut = parse(&body[128..]);
        Ok((parse(&body), open.fh))
    }

    pub fn open(&self, ino: u64, flags: u32) -> R<u64> {
        let arg = abi::OpenIn { flags, open_flags: 0 };
        let out: abi::OpenOut = parse(&self.raw(opcode::OPEN, ino, &[arg.as_slice()]).result()?);
        Ok(out.fh)
    }

    pub fn opendir(&self, ino: u64) -> R<u64> {
        let arg = abi::OpenIn::default();
        let out: abi::OpenOut = parse(&self.raw(opcode::OPENDIR, ino, &[arg.as_slice()]).result()?);
        Ok(out.fh)
    }

    pub fn release(&self, ino: u64, fh: u64) -> R<()> {
        let arg = abi::ReleaseIn { fh, ..Default::default() };
        self.raw(opcode::RELEASE, ino, &[arg.as_slice()]).result().map(drop)
    }

    pub fn releasedir(&self, ino: u64, fh: u64) -> R<()> {
        let arg = abi::ReleaseIn { fh, ..Default::default() };
        self.raw(opcode::RELEASEDIR, ino, &[arg.as_slice()]).result().map(drop)
    }

    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> R<Vec<u8>> {
        let arg = abi::ReadIn { fh, offset, size, ..Default::default() };
        self.raw(opcode::READ, ino, &[arg.as_slice()]).result()
    }

    pub fn write(&self, ino: u64, fh: u64, offset: u64, data: &[u8]) -> R<u32> {
        self.write_flags(ino, fh, offset, data, 0)
    }

    pub fn write_flags(&self, ino: u64, fh: u64, offset: u64, data: &[u8], write_flags: u32) -> R<u32> {
        let arg = abi::WriteIn { fh, offset, size: data.len() as u32, write_flags, ..Default::default() };
        let out: abi::WriteOut = parse(&self.raw(opcode::WRITE, ino, &[arg.as_slice(), data]).result()?);
        Ok(out.size)
    }

    pub fn fsync(&self, ino: u64, fh: u64, dir: bool) -> R<()> {
        let arg = abi::FsyncIn { fh, fsync_flags: 0, padding: 0 };
        let op = if dir { opcode::FSYNCDIR } else { opcode::FSYNC };
        self.raw(op, ino, &[arg.as_slice()]).result().map(drop)
    }

    pub fn flush(&self, ino: u64, fh: u64) -> R<()> {
        let arg = abi::FlushIn { fh, ..Default::default() };
        self.raw(opcode::FLUSH, ino, &[arg.as_slice()]).result().map(drop)
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> R<()> {
        self.raw(opcode::UNLINK, parent, &[&cstr(name)]).result().map(drop)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> R<()> {
        self.raw(opcode::RMDIR, parent, &[&cstr(name)]).result().map(drop)
    }

    pub fn rename(&self, olddir: u64, old: &[u8], newdir: u64, new: &[u8]) -> R<()> {
        self.rename2(olddir, old, newdir, new, 0)
    }

    pub fn rename2(&self, olddir: u64, old: &[u8], newdir: u64, new: &[u8], flags: u32) -> R<()> {
        let arg = abi::Rename2In { newdir, flags, padding: 0 };
        self.raw(opcode::RENAME2, olddir, &[arg.as_slice(), &cstr(old), &cstr(new)]).result().map(drop)
    }

    pub fn link(&self, ino: u64, newparent: u64, name: &[u8]) -> R<abi::EntryOut> {
        let arg = abi::LinkIn { oldnodeid: ino };
        Ok(parse(&self.raw(opcode::LINK, newparent, &[arg.as_slice(), &cstr(name)]).result()?))
    }

    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8]) -> R<abi::EntryOut> {
        Ok(parse(&self.raw(opcode::SYMLINK, parent, &[&cstr(name), &cstr(target)]).result()?))
    }

    pub fn readlink(&self, ino: u64) -> R<Vec<u8>> {
        self.raw(opcode::READLINK, ino, &[]).result()
    }

    pub fn statfs(&self, ino: u64) -> R<abi::Kstatfs> {
        let out: abi::StatfsOut = parse(&self.raw(opcode::STATFS, ino, &[]).result()?);
        Ok(out.st)
    }

    pub fn access(&self, ino: u64, mask: u32) -> R<()> {
        let arg = abi::AccessIn { mask, padding: 0 };
        self.raw(opcode::ACCESS, ino, &[arg.as_slice()]).result().map(drop)
    }

    /// READDIR from `offset`: (ino, next offset, type, name) per entry.
    pub fn readdir(&self, ino: u64, fh: u64, offset: u64, size: u32) -> R<Vec<Dirent>> {
        let arg = abi::ReadIn { fh, offset, size, ..Default::default() };
        let body = self.raw(opcode::READDIR, ino, &[arg.as_slice()]).result()?;
        let mut out = Vec::new();
        let mut at = 0;
        while at < body.len() {
            let d: abi::Dirent = parse(&body[at..]);
            out.push((d.ino, d.off, d.typ, body[at + 24..at + 24 + d.namelen as usize].to_vec()));
            at += abi::dirent_size(d.namelen as usize);
        }
        Ok(out)
    }

    /// Every name of directory node `ino`, paging through READDIR with small buffers.
    pub fn list(&self, ino: u64) -> R<Vec<Vec<u8>>> {
        let fh = self.opendir(ino)?;
        let mut names = Vec::new();
        let mut off = 0;
        loop {
            let page = self.readdir(ino, fh, off, 128)?;
            let Some(last) = page.last() else { break };
            off = last.1;
            names.extend(page.into_iter().map(|e| e.3));
        }
        self.releasedir(ino, fh)?;
        names.sort();
        Ok(names)
    }

    /// READDIRPLUS: (entry, next offset, name) per entry.
    pub fn readdirplus(&self, ino: u64, fh: u64, offset: u64, size: u32) -> R<Vec<DirentPlus>> {
        let arg = abi::ReadIn { fh, offset, size, ..Default::default() };
        let body = self.raw(opcode::READDIRPLUS, ino, &[arg.as_slice()]).result()?;
        let mut out = Vec::new();
        let mut at = 0;
        while at < body.len() {
            let d: abi::DirentPlus = parse(&body[at..]);
            let name = body[at + 152..at + 152 + d.dirent.namelen as usize].to_vec();
            out.push((d.entry_out, d.dirent.off, name));
            at += abi::direntplus_size(d.dirent.namelen as usize);
        }
        Ok(out)
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: u32) -> R<()> {
        let arg = abi::SetxattrIn { size: value.len() as u32, flags, setxattr_flags: 0, padding: 0 };
        self.raw(opcode::SETXATTR, ino, &[arg.as_slice(), &cstr(name), value]).result().map(drop)
    }

    pub fn getxattr(&self, ino: u64, name: &[u8], size: u32) -> R<Vec<u8>> {
        let arg = abi::GetxattrIn { size, padding: 0 };
        self.raw(opcode::GETXATTR, ino, &[arg.as_slice(), &cstr(name)]).result()
    }

    pub fn listxattr(&self, ino: u64, size: u32) -> R<Vec<u8>> {
        let arg = abi::GetxattrIn { size, padding: 0 };
        self.raw(opcode::LISTXATTR, ino, &[arg.as_slice()]).result()
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> R<()> {
        self.raw(opcode::REMOVEXATTR, ino, &[&cstr(name)]).result().map(drop)
    }
}

/// A `FUSE_EXT_GROUPS` request extension as the kernel builds it (`get_create_supp_group`).
pub fn groups_ext(groups: &[u32]) -> Vec<u8> {
    let size = (8 + 4 + 4 * groups.len() + 7) & !7;
    let mut v = abi::ExtHeader { size: size as u32, typ: abi::ext::GROUPS }.as_slice().to_vec();
    v.extend_from_slice(&(groups.len() as u32).to_ne_bytes());
    for g in groups {
        v.extend_from_slice(&g.to_ne_bytes());
    }
    v.resize(size, 0);
    v
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
