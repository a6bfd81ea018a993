//! A FUSE "kernel" for the tests of every backend: builds requests as bytes, hands them to
//! the server's one pipeline (a synchronous `PollerEngine`) as volatile slices (optionally cut into many small buffers), and decodes the
//! replies into typed results. [`Fuse`] is generic over the [`FileSystem`]; what is truly
//! backend-specific (constructors, the passthrough's host tree and canary) lives in [`ram`] and
//! [`passthrough`]. A test that checks behaviour both backends share is one generic body run on
//! both (see [`both_backends!`]).
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::filesystem::FileSystem;
use virtiofs_backend::server::{PollerEngine, Submitted};
use virtiofs_backend::Server;
use vm_memory::{ByteValued, VolatileSlice};

pub mod passthrough;
pub mod ram;
pub mod writeback;

pub const ROOT: u64 = abi::ROOT_ID;
pub const HDR: usize = std::mem::size_of::<abi::OutHeader>();

/// A decoded reply.
#[derive(Debug)]
pub struct Reply {
    /// What `handle` returned.
    pub n: usize,
    pub hdr: abi::OutHeader,
    /// Reply bytes after the header (up to `hdr.len`).
    pub body: Vec<u8>,
}

impl Reply {
    /// The errno (positive), 0 on success.
    pub fn errno(&self) -> i32 {
        -self.hdr.error
    }

    pub fn result(self) -> Result<Vec<u8>, i32> {
        if self.hdr.error == 0 {
            Ok(self.body)
        } else {
            assert_eq!(self.n, HDR, "an error reply is a bare header");
            Err(-self.hdr.error)
        }
    }
}

/// Reads a `T` from the start of `bytes` (unaligned).
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

/// Builds a request: header (len computed) + args.
pub fn request(op: u32, nodeid: u64, unique: u64, uid: u32, gid: u32, args: &[&[u8]]) -> Vec<u8> {
    let len = std::mem::size_of::<abi::InHeader>() + args.iter().map(|a| a.len()).sum::<usize>();
    let hdr = abi::InHeader {
        len: len as u32,
        opcode: op,
        unique,
        nodeid,
        uid,
        gid,
        pid: 42,
        total_extlen: 0,
        padding: 0,
    };
    let mut v = hdr.as_slice().to_vec();
    for a in args {
        v.extend_from_slice(a);
    }
    v
}

/// Serves one request at once, as a poller without a filesystem engine would (the server's one
/// pipeline, [`PollerEngine::synchronous`]); returns the reply's length.
pub fn serve<F: FileSystem>(
    srv: &Arc<Server<F>>,
    readable: &[VolatileSlice<'_>],
    writable: &[VolatileSlice<'_>],
) -> usize {
    serve_as(srv, false, readable, writable)
}

/// [`serve`], the request executed again after a crash if `replayed`.
pub fn serve_as<F: FileSystem>(
    srv: &Arc<Server<F>>,
    replayed: bool,
    readable: &[VolatileSlice<'_>],
    writable: &[VolatileSlice<'_>],
) -> usize {
    match PollerEngine::synchronous(srv.clone()).submit_as(0, replayed, readable, writable) {
        Submitted::Done(n) => n as usize,
        other => panic!("a synchronous engine answers at once, not {other:?}"),
    }
}

/// Runs `handle` on `req` cut into `split`-byte buffers, with a `cap`-byte reply area cut into
/// `reply_split`-byte buffers.
pub fn handle_raw<F: FileSystem>(
    srv: &Arc<Server<F>>,
    req: &[u8],
    split: usize,
    cap: usize,
    reply_split: usize,
) -> Reply {
    handle_raw_as(srv, req, split, cap, reply_split, false)
}

/// [`handle_raw`], the request executed again after a crash if `replayed`.
pub fn handle_raw_as<F: FileSystem>(
    srv: &Arc<Server<F>>,
    req: &[u8],
    split: usize,
    cap: usize,
    reply_split: usize,
    replayed: bool,
) -> Reply {
    let mut rbufs: Vec<Vec<u8>> = req.chunks(split.max(1)).map(|c| c.to_vec()).collect();
    let mut wbufs: Vec<Vec<u8>> = if cap == 0 {
        Vec::new()
    } else {
        (0..cap)
            .step_by(reply_split.max(1))
            .map(|at| vec![0xa5u8; reply_split.max(1).min(cap - at)])
            .collect()
    };
    let n = {
        let readable: Vec<VolatileSlice<'_>> =
            rbufs.iter_mut().map(|b| VolatileSlice::from(&mut b[..])).collect();
        let writable: Vec<VolatileSlice<'_>> =
            wbufs.iter_mut().map(|b| VolatileSlice::from(&mut b[..])).collect();
        serve_as(srv, replayed, &readable, &writable)
    };
    let out: Vec<u8> = wbufs.concat();
    if n == 0 {
        return Reply { n, hdr: abi::OutHeader::default(), body: Vec::new() };
    }
    let hdr: abi::OutHeader = parse(&out);
    assert_eq!(hdr.len as usize, n, "header len matches the returned length");
    Reply { n, hdr, body: out[HDR..n].to_vec() }
}

/// One FUSE session against a filesystem `F`, acting as caller `uid`/`gid`.
pub struct Fuse<F: FileSystem> {
    pub srv: Arc<Server<F>>,
    unique: Cell<u64>,
    pub uid: Cell<u32>,
    pub gid: Cell<u32>,
    /// Requests are sent as executed again after a crash ([`Self::replaying`]).
    pub replayed: Cell<bool>,
    /// Whether replies are recorded in `seen_inos` and `seen_bytes` (the escape tests check them).
    record: bool,
    /// Every inode number (attr.ino / d_ino) a reply showed.
    pub seen_inos: RefCell<Vec<u64>>,
    /// Every reply body, concatenated (searched for canary content).
    pub seen_bytes: RefCell<Vec<u8>>,
    /// Whether READDIRPLUS gives `.` and `..` attributes (the RAM filesystem fills in their inode
    /// numbers; the passthrough sends them empty, node id and inode number 0: the kernel takes
    /// neither a reference nor attributes from them).
    pub dot_attrs: bool,
}

pub fn init_in(minor: u32, flags: u64) -> Vec<u8> {
    let mut v =
        abi::InitInCompat { major: 7, minor, max_readahead: 131072, flags: flags as u32 }.as_slice().to_vec();
    if flags & abi::init::INIT_EXT != 0 {
        let ext = abi::InitInExt { flags2: (flags >> 32) as u32, unused: [0; 11] };
        v.extend_from_slice(ext.as_slice());
    }
    v
}

/// What Linux 6.12 offers in INIT for a virtio-fs mount (`fuse_send_init`; no DAX).
pub const LINUX_FLAGS: u64 = abi::init::ASYNC_READ
    | abi::init::POSIX_LOCKS
    | abi::init::ATOMIC_O_TRUNC
    | abi::init::EXPORT_SUPPORT
    | abi::init::BIG_WRITES
    | abi::init::DONT_MASK
    | abi::init::SPLICE_WRITE
    | abi::init::SPLICE_MOVE
    | abi::init::SPLICE_READ
    | abi::init::FLOCK_LOCKS
    | abi::init::HAS_IOCTL_DIR
    | abi::init::AUTO_INVAL_DATA
    | abi::init::DO_READDIRPLUS
    | abi::init::READDIRPLUS_AUTO
    | abi::init::ASYNC_DIO
    | abi::init::WRITEBACK_CACHE
    | abi::init::NO_OPEN_SUPPORT
    | abi::init::PARALLEL_DIROPS
    | abi::init::HANDLE_KILLPRIV
    | abi::init::POSIX_ACL
    | abi::init::ABORT_ERROR
    | abi::init::MAX_PAGES
    | abi::init::CACHE_SYMLINKS
    | abi::init::NO_OPENDIR_SUPPORT
    | abi::init::EXPLICIT_INVAL_DATA
    | abi::init::HANDLE_KILLPRIV_V2
    | abi::init::SETXATTR_EXT
    | abi::init::INIT_EXT
    | abi::init::SECURITY_CTX
    | abi::init::CREATE_SUPP_GROUP
    | abi::init::HAS_EXPIRE_ONLY
    | abi::init::DIRECT_IO_ALLOW_MMAP
    | abi::init::NO_EXPORT_SUPPORT
    | abi::init::HAS_RESEND
    | abi::init::ALLOW_IDMAP
    | abi::init::SUBMOUNTS
    | abi::init::PASSTHROUGH;

/// An older kernel: Linux 6.12's offer without `HANDLE_KILLPRIV_V2`, `SETXATTR_EXT` and
/// `POSIX_ACL`.
pub const OLD_FLAGS: u64 =
    LINUX_FLAGS & !(abi::init::HANDLE_KILLPRIV_V2 | abi::init::SETXATTR_EXT | abi::init::POSIX_ACL);

pub type R<T> = Result<T, i32>;
/// A READDIR entry: (ino, next offset, type, name).
pub type Dirent = (u64, u64, u32, Vec<u8>);
/// A READDIRPLUS entry: (entry, next offset, name).
pub type DirentPlus = (abi::EntryOut, u64, Vec<u8>);

/// What the generic tests ask of a backend beyond [`FileSystem`].
pub trait TestFs: FileSystem {
    /// Lookup references the kernel holds on node `ino` (`None` once the node is gone).
    fn lookup_count(&self, ino: u64) -> Option<u64>;
}

/// A repeatable pseudo-random source (xorshift64, `seed` not 0): each call gives a number
/// below its argument (0 for 0 or 1).
#[allow(dead_code)] // not every test binary uses it
pub fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n.max(1)
    }
}

/// `(entry, open)` of CREATE or TMPFILE as `(entry, file handle)`.
pub fn with_fh((entry, open): (abi::EntryOut, abi::OpenOut)) -> (abi::EntryOut, u64) {
    (entry, open.fh)
}

impl<F: FileSystem> Fuse<F> {
    /// A session over `fs`, not initialised.
    pub fn with_fs(fs: F) -> Self {
        Fuse {
            srv: Arc::new(Server::new(fs)),
            unique: Cell::new(0),
            uid: Cell::new(0),
            gid: Cell::new(0),
            replayed: Cell::new(false),
            record: false,
            seen_inos: RefCell::default(),
            seen_bytes: RefCell::default(),
            dot_attrs: true,
        }
    }

    /// The same session with the server offering what `options` allow (before INIT).
    #[allow(dead_code)] // not every test binary uses it
    pub fn with_server_options(mut self, options: virtiofs_backend::server::ServerOptions) -> Self {
        let srv = Arc::into_inner(self.srv).expect("the session's server is not shared before INIT");
        self.srv = Arc::new(srv.with_options(options));
        self
    }

    /// The session after a Linux-6.12-like INIT.
    pub fn initialised(self) -> Self {
        let out = self.init(41, LINUX_FLAGS).expect("init");
        assert_eq!(out.minor, abi::KERNEL_MINOR_VERSION);
        self
    }

    /// Records every reply from now on (see `seen_inos`, `seen_bytes`).
    pub fn recording(mut self) -> Self {
        self.record = true;
        self
    }

    pub fn fs(&self) -> &F {
        self.srv.filesystem()
    }

    /// Runs `f` with every request sent as executed again after a crash (taken again from
    /// the device's in-flight record).
    pub fn replaying<T>(&self, f: impl FnOnce(&Self) -> T) -> T {
        self.replayed.set(true);
        let r = f(self);
        self.replayed.set(false);
        r
    }

    pub fn as_user(&self, uid: u32, gid: u32) -> &Self {
        self.uid.set(uid);
        self.gid.set(gid);
        self
    }

    pub fn next_unique(&self) -> u64 {
        self.unique.set(self.unique.get() + 2);
        self.unique.get()
    }

    pub fn req(&self, op: u32, nodeid: u64, args: &[&[u8]]) -> Vec<u8> {
        request(op, nodeid, self.next_unique(), self.uid.get(), self.gid.get(), args)
    }

    /// Sends a request in one buffer with a roomy reply area.
    pub fn call(&self, op: u32, nodeid: u64, args: &[&[u8]]) -> Reply {
        let req = self.req(op, nodeid, args);
        self.send(op, &req)
    }

    /// Sends a request whose arguments are followed by the request extensions `ext`, with
    /// `total_extlen` as given (normally `ext.len() / 8`, see [`Self::call_with_ext`]).
    pub fn call_ext(&self, op: u32, nodeid: u64, args: &[&[u8]], ext: &[u8], total_extlen: u16) -> Reply {
        let mut all: Vec<&[u8]> = args.to_vec();
        all.push(ext);
        let mut req = self.req(op, nodeid, &all);
        req[36..38].copy_from_slice(&total_extlen.to_ne_bytes());
        self.send(op, &req)
    }

    /// [`Self::call_ext`] with `total_extlen` counting the whole 8-byte units of `ext`.
    pub fn call_with_ext(&self, op: u32, nodeid: u64, args: &[&[u8]], ext: &[u8]) -> Reply {
        self.call_ext(op, nodeid, args, ext, (ext.len() / 8) as u16)
    }

    fn send(&self, op: u32, req: &[u8]) -> Reply {
        let reply =
            handle_raw_as(&self.srv, req, usize::MAX, HDR + (2 << 20), usize::MAX, self.replayed.get());
        if reply.n != 0 {
            let sent: abi::InHeader = parse(req);
            assert_eq!(reply.hdr.unique, sent.unique, "reply echoes unique");
            if self.record {
                self.record(op, &reply.body);
            }
        }
        reply
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

    pub fn init(&self, minor: u32, flags: u64) -> R<abi::InitOut> {
        let body = self.call(opcode::INIT, 0, &[&init_in(minor, flags)]).result()?;
        let mut full = body.clone();
        full.resize(64, 0);
        Ok(parse(&full))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> R<abi::EntryOut> {
        Ok(parse(&self.call(opcode::LOOKUP, parent, &[&cstr(name)]).result()?))
    }

    pub fn forget(&self, ino: u64, n: u64) {
        let r = self.call(opcode::FORGET, ino, &[abi::ForgetIn { nlookup: n }.as_slice()]);
        assert_eq!(r.n, 0, "FORGET has no reply");
    }

    pub fn getattr(&self, ino: u64) -> R<abi::Attr> {
        let arg = abi::GetattrIn::default();
        let out: abi::AttrOut = parse(&self.call(opcode::GETATTR, ino, &[arg.as_slice()]).result()?);
        Ok(out.attr)
    }

    pub fn setattr(&self, ino: u64, arg: abi::SetattrIn) -> R<abi::Attr> {
        let out: abi::AttrOut = parse(&self.call(opcode::SETATTR, ino, &[arg.as_slice()]).result()?);
        Ok(out.attr)
    }

    pub fn chmod(&self, ino: u64, mode: u32) -> R<abi::Attr> {
        self.setattr(ino, abi::SetattrIn { valid: abi::fattr::MODE, mode, ..Default::default() })
    }

    pub fn chown(&self, ino: u64, uid: Option<u32>, gid: Option<u32>) -> R<abi::Attr> {
        let mut a = abi::SetattrIn::default();
        if let Some(u) = uid {
            a.valid |= abi::fattr::UID;
            a.uid = u;
        }
        if let Some(g) = gid {
            a.valid |= abi::fattr::GID;
            a.gid = g;
        }
        self.setattr(ino, a)
    }

    /// Whether the caller lacks CAP_FSETID and the kernel would say so (HANDLE_KILLPRIV_V2): the
    /// test "kernel" takes non-root callers to lack it, as the server does without V2.
    pub fn kernel_kills(&self) -> bool {
        self.uid.get() != 0 && self.srv.negotiated() & abi::init::HANDLE_KILLPRIV_V2 != 0
    }

    pub fn truncate(&self, ino: u64, size: u64) -> R<abi::Attr> {
        let mut valid = abi::fattr::SIZE;
        if self.kernel_kills() {
            valid |= abi::fattr::KILL_SUIDGID;
        }
        self.setattr(ino, abi::SetattrIn { valid, size, ..Default::default() })
    }

    /// A truncate through open handle `fh` (`ftruncate`).
    pub fn ftruncate(&self, ino: u64, size: u64, fh: u64) -> R<abi::Attr> {
        let mut valid = abi::fattr::SIZE | abi::fattr::FH;
        if self.kernel_kills() {
            valid |= abi::fattr::KILL_SUIDGID;
        }
        self.setattr(ino, abi::SetattrIn { valid, size, fh, ..Default::default() })
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32) -> R<abi::EntryOut> {
        // With DONT_MASK negotiated the kernel sends the process umask for us to apply; tests that
        // care pass their own (see `mkdir_umask`).
        self.mkdir_umask(parent, name, mode, 0)
    }

    pub fn mkdir_umask(&self, parent: u64, name: &[u8], mode: u32, umask: u32) -> R<abi::EntryOut> {
        let arg = abi::MkdirIn { mode, umask };
        Ok(parse(&self.call(opcode::MKDIR, parent, &[arg.as_slice(), &cstr(name)]).result()?))
    }

    pub fn mknod(&self, parent: u64, name: &[u8], mode: u32, rdev: u32) -> R<abi::EntryOut> {
        let arg = abi::MknodIn { mode, rdev, umask: 0, padding: 0 };
        Ok(parse(&self.call(opcode::MKNOD, parent, &[arg.as_slice(), &cstr(name)]).result()?))
    }

    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: u32,
    ) -> R<(abi::EntryOut, abi::OpenOut)> {
        let open_flags = if self.kernel_kills() && flags & O_TRUNC != 0 { abi::OPEN_KILL_SUIDGID } else { 0 };
        let arg = abi::CreateIn { flags, mode, umask: 0, open_flags };
        let body = self.call(opcode::CREATE, parent, &[arg.as_slice(), &cstr(name)]).result()?;
        assert_eq!(body.len(), 128 + 16);
        Ok((parse(&body), parse(&body[128..])))
    }

    pub fn open(&self, ino: u64, flags: u32) -> R<u64> {
        let open_flags = if self.kernel_kills() && flags & O_TRUNC != 0 { abi::OPEN_KILL_SUIDGID } else { 0 };
        let arg = abi::OpenIn { flags, open_flags };
        let out: abi::OpenOut = parse(&self.call(opcode::OPEN, ino, &[arg.as_slice()]).result()?);
        Ok(out.fh)
    }

    pub fn opendir(&self, ino: u64) -> R<u64> {
        let arg = abi::OpenIn::default();
        let out: abi::OpenOut = parse(&self.call(opcode::OPENDIR, ino, &[arg.as_slice()]).result()?);
        Ok(out.fh)
    }

    pub fn release(&self, ino: u64, fh: u64) -> R<()> {
        let arg = abi::ReleaseIn { fh, ..Default::default() };
        self.call(opcode::RELEASE, ino, &[arg.as_slice()]).result().map(|_| ())
    }

    pub fn releasedir(&self, ino: u64, fh: u64) -> R<()> {
        let arg = abi::ReleaseIn { fh, ..Default::default() };
        self.call(opcode::RELEASEDIR, ino, &[arg.as_slice()]).result().map(|_| ())
    }

    pub fn read_in(fh: u64, offset: u64, size: u32) -> abi::ReadIn {
        abi::ReadIn { fh, offset, size, ..Default::default() }
    }

    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> R<Vec<u8>> {
        self.call(opcode::READ, ino, &[Self::read_in(fh, offset, size).as_slice()]).result()
    }

    pub fn write(&self, ino: u64, fh: u64, offset: u64, data: &[u8]) -> R<u32> {
        let write_flags = if self.kernel_kills() { abi::write_flags::KILL_SUIDGID } else { 0 };
        self.write_flags(ino, fh, offset, data, write_flags)
    }

    /// A WRITE with `write_flags` as given.
    pub fn write_flags(&self, ino: u64, fh: u64, offset: u64, data: &[u8], write_flags: u32) -> R<u32> {
        let arg = abi::WriteIn { fh, offset, size: data.len() as u32, write_flags, ..Default::default() };
        let out: abi::WriteOut = parse(&self.call(opcode::WRITE, ino, &[arg.as_slice(), data]).result()?);
        Ok(out.size)
    }

    pub fn fsync(&self, ino: u64, fh: u64, dir: bool) -> R<()> {
        let arg = abi::FsyncIn { fh, fsync_flags: 0, padding: 0 };
        let op = if dir { opcode::FSYNCDIR } else { opcode::FSYNC };
        self.call(op, ino, &[arg.as_slice()]).result().map(drop)
    }

    pub fn flush(&self, ino: u64, fh: u64) -> R<()> {
        let arg = abi::FlushIn { fh, ..Default::default() };
        self.call(opcode::FLUSH, ino, &[arg.as_slice()]).result().map(drop)
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> R<()> {
        self.call(opcode::UNLINK, parent, &[&cstr(name)]).result().map(|_| ())
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> R<()> {
        self.call(opcode::RMDIR, parent, &[&cstr(name)]).result().map(|_| ())
    }

    pub fn rename(&self, olddir: u64, old: &[u8], newdir: u64, new: &[u8]) -> R<()> {
        let arg = abi::RenameIn { newdir };
        self.call(opcode::RENAME, olddir, &[arg.as_slice(), &cstr(old), &cstr(new)]).result().map(|_| ())
    }

    pub fn rename2(&self, olddir: u64, old: &[u8], newdir: u64, new: &[u8], flags: u32) -> R<()> {
        let arg = abi::Rename2In { newdir, flags, padding: 0 };
        self.call(opcode::RENAME2, olddir, &[arg.as_slice(), &cstr(old), &cstr(new)]).result().map(|_| ())
    }

    pub fn link(&self, ino: u64, newparent: u64, name: &[u8]) -> R<abi::EntryOut> {
        let arg = abi::LinkIn { oldnodeid: ino };
        Ok(parse(&self.call(opcode::LINK, newparent, &[arg.as_slice(), &cstr(name)]).result()?))
    }

    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8]) -> R<abi::EntryOut> {
        Ok(parse(&self.call(opcode::SYMLINK, parent, &[&cstr(name), &cstr(target)]).result()?))
    }

    pub fn readlink(&self, ino: u64) -> R<Vec<u8>> {
        self.call(opcode::READLINK, ino, &[]).result()
    }

    pub fn access(&self, ino: u64, mask: u32) -> R<()> {
        let arg = abi::AccessIn { mask, padding: 0 };
        self.call(opcode::ACCESS, ino, &[arg.as_slice()]).result().map(|_| ())
    }

    pub fn statfs(&self, ino: u64) -> R<abi::Kstatfs> {
        let out: abi::StatfsOut = parse(&self.call(opcode::STATFS, ino, &[]).result()?);
        Ok(out.st)
    }

    /// READDIR: (ino, next offset, type, name) per entry.
    pub fn readdir(&self, ino: u64, fh: u64, offset: u64, size: u32) -> R<Vec<Dirent>> {
        let body = self.call(opcode::READDIR, ino, &[Self::read_in(fh, offset, size).as_slice()]).result()?;
        assert!(body.len() <= size as usize);
        let mut out = Vec::new();
        let mut at = 0;
        while at < body.len() {
            let d: abi::Dirent = parse(&body[at..]);
            let name = body[at + 24..at + 24 + d.namelen as usize].to_vec();
            out.push((d.ino, d.off, d.typ, name));
            at += abi::dirent_size(d.namelen as usize);
        }
        assert_eq!(at, body.len(), "records are padded to 8 bytes");
        Ok(out)
    }

    /// Every name of directory node `ino`, sorted, paging through READDIR with small buffers.
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
        let body =
            self.call(opcode::READDIRPLUS, ino, &[Self::read_in(fh, offset, size).as_slice()]).result()?;
        let mut out = Vec::new();
        let mut at = 0;
        while at < body.len() {
            let d: abi::DirentPlus = parse(&body[at..]);
            let name = body[at + 152..at + 152 + d.dirent.namelen as usize].to_vec();
            let dot = name == b"." || name == b"..";
            if dot && !self.dot_attrs {
                assert_eq!((d.entry_out.nodeid, d.entry_out.attr.ino), (0, 0), "an empty entry for {name:?}");
            } else {
                assert_eq!(d.entry_out.attr.ino, d.dirent.ino);
            }
            out.push((d.entry_out, d.dirent.off, name));
            at += abi::direntplus_size(d.dirent.namelen as usize);
        }
        Ok(out)
    }
}

/// A GETXATTR/LISTXATTR answer: the size (asked with size 0) or the bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

pub const ACL_USER_OBJ: u16 = 0x01;
pub const ACL_USER: u16 = 0x02;
pub const ACL_GROUP_OBJ: u16 = 0x04;
pub const ACL_GROUP: u16 = 0x08;
pub const ACL_MASK: u16 = 0x10;
pub const ACL_OTHER: u16 = 0x20;

/// A `system.posix_acl_*` value from (tag, perm, id) entries.
pub fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

impl<F: FileSystem> Fuse<F> {
    /// SETXATTR as the kernel sends it (16-byte argument with SETXATTR_EXT, else 8 bytes).
    pub fn setxattr_ext(&self, ino: u64, name: &[u8], value: &[u8], flags: u32, ext_flags: u32) -> R<()> {
        let arg = abi::SetxattrIn { size: value.len() as u32, flags, setxattr_flags: ext_flags, padding: 0 };
        let len = if self.srv.negotiated() & abi::init::SETXATTR_EXT != 0 { 16 } else { 8 };
        let bytes = &vm_memory::ByteValued::as_slice(&arg)[..len];
        self.call(opcode::SETXATTR, ino, &[bytes, &cstr(name), value]).result().map(|_| ())
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: u32) -> R<()> {
        self.setxattr_ext(ino, name, value, flags, 0)
    }

    pub fn getxattr(&self, ino: u64, name: &[u8], size: u32) -> R<Xattr> {
        let arg = abi::GetxattrIn { size, padding: 0 };
        let body = self
            .call(opcode::GETXATTR, ino, &[vm_memory::ByteValued::as_slice(&arg), &cstr(name)])
            .result()?;
        Ok(if size == 0 { Xattr::Size(parse::<abi::GetxattrOut>(&body).size) } else { Xattr::Data(body) })
    }

    /// The value, asked with a roomy buffer.
    pub fn xattr(&self, ino: u64, name: &[u8]) -> R<Vec<u8>> {
        match self.getxattr(ino, name, 1 << 16)? {
            Xattr::Data(v) => Ok(v),
            Xattr::Size(_) => unreachable!(),
        }
    }

    pub fn listxattr(&self, ino: u64, size: u32) -> R<Xattr> {
        let arg = abi::GetxattrIn { size, padding: 0 };
        let body = self.call(opcode::LISTXATTR, ino, &[vm_memory::ByteValued::as_slice(&arg)]).result()?;
        Ok(if size == 0 { Xattr::Size(parse::<abi::GetxattrOut>(&body).size) } else { Xattr::Data(body) })
    }

    /// The attribute names, asked with a roomy buffer.
    pub fn xattr_names(&self, ino: u64) -> R<Vec<Vec<u8>>> {
        match self.listxattr(ino, 1 << 16)? {
            Xattr::Data(v) => {
                assert!(v.is_empty() || v.ends_with(&[0]));
                Ok(v.split(|&b| b == 0).filter(|n| !n.is_empty()).map(|n| n.to_vec()).collect())
            }
            Xattr::Size(_) => unreachable!(),
        }
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> R<()> {
        self.call(opcode::REMOVEXATTR, ino, &[&cstr(name)]).result().map(|_| ())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn lk(
        &self,
        op: u32,
        ino: u64,
        fh: u64,
        owner: u64,
        typ: i32,
        start: u64,
        end: u64,
    ) -> R<abi::FileLock> {
        let arg = abi::LkIn {
            fh,
            owner,
            lk: abi::FileLock { start, end, typ: typ as u32, pid: owner as u32 },
            lk_flags: 0,
            padding: 0,
        };
        let body = self.call(op, ino, &[vm_memory::ByteValued::as_slice(&arg)]).result()?;
        Ok(if op == opcode::GETLK { parse::<abi::LkOut>(&body).lk } else { abi::FileLock::default() })
    }

    pub fn setlk(&self, ino: u64, fh: u64, owner: u64, typ: i32, start: u64, end: u64) -> R<()> {
        self.lk(opcode::SETLK, ino, fh, owner, typ, start, end).map(|_| ())
    }

    pub fn getlk(&self, ino: u64, fh: u64, owner: u64, typ: i32, start: u64, end: u64) -> R<abi::FileLock> {
        self.lk(opcode::GETLK, ino, fh, owner, typ, start, end)
    }

    pub fn lseek(&self, ino: u64, fh: u64, offset: u64, whence: i32) -> R<u64> {
        let arg = abi::LseekIn { fh, offset, whence: whence as u32, padding: 0 };
        let body = self.call(opcode::LSEEK, ino, &[vm_memory::ByteValued::as_slice(&arg)]).result()?;
        Ok(parse::<abi::LseekOut>(&body).offset)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        ino_in: u64,
        fh_in: u64,
        off_in: u64,
        ino_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> R<u32> {
        let arg = abi::CopyFileRangeIn { fh_in, off_in, nodeid_out: ino_out, fh_out, off_out, len, flags: 0 };
        let body =
            self.call(opcode::COPY_FILE_RANGE, ino_in, &[vm_memory::ByteValued::as_slice(&arg)]).result()?;
        Ok(parse::<abi::WriteOut>(&body).size)
    }

    pub fn tmpfile(
        &self,
        parent: u64,
        mode: u32,
        flags: u32,
        umask: u32,
    ) -> R<(abi::EntryOut, abi::OpenOut)> {
        let arg = abi::CreateIn { flags, mode, umask, open_flags: 0 };
        let body =
            self.call(opcode::TMPFILE, parent, &[vm_memory::ByteValued::as_slice(&arg), b"/\0"]).result()?;
        assert_eq!(body.len(), 128 + 16);
        Ok((parse(&body), parse(&body[128..])))
    }

    pub fn statx(&self, ino: u64) -> R<abi::StatxOut> {
        let arg = abi::StatxIn { sx_mask: 0xfff, ..Default::default() };
        Ok(parse(&self.call(opcode::STATX, ino, &[vm_memory::ByteValued::as_slice(&arg)]).result()?))
    }
}

/// A `FUSE_EXT_GROUPS` request extension as the kernel builds it (`get_create_supp_group`): an
/// 8-byte header, `nr_groups`, the groups, padded to 8 bytes.
pub fn groups_ext(groups: &[u32]) -> Vec<u8> {
    let body = 4 + 4 * groups.len();
    let size = (8 + body + 7) & !7;
    let mut v = abi::ExtHeader { size: size as u32, typ: abi::ext::GROUPS }.as_slice().to_vec();
    v.extend_from_slice(&(groups.len() as u32).to_ne_bytes());
    for g in groups {
        v.extend_from_slice(&g.to_ne_bytes());
    }
    v.resize(size, 0);
    v
}

pub const O_RDONLY: u32 = libc::O_RDONLY as u32;
pub const O_WRONLY: u32 = libc::O_WRONLY as u32;
pub const O_RDWR: u32 = libc::O_RDWR as u32;
pub const O_CREAT: u32 = libc::O_CREAT as u32;
pub const O_EXCL: u32 = libc::O_EXCL as u32;
pub const O_TRUNC: u32 = libc::O_TRUNC as u32;

/// Runs the generic test bodies named on both backends: for each `body`, a module `body` with
/// the tests `ramfs` (a fresh [`ram`] session) and `passthrough` (a session over a fresh host
/// tree whose shared directory is like the RAM filesystem's root, see
/// [`passthrough::Tree::like_ramfs`]). A body is `fn body<F: TestFs>(f: &Fuse<F>)`. Bodies
/// listed after `as_root:` act as other users, which the passthrough does with `setfsuid`: their
/// passthrough test does nothing unless it runs as root, as the passthrough's own identity tests.
#[macro_export]
macro_rules! both_backends {
    (as_root: $($body:ident),* $(,)?) => {
        $( $crate::both_backends!(@one $body, $crate::harness::passthrough::is_root()); )*
    };
    ($($body:ident),* $(,)?) => {
        $( $crate::both_backends!(@one $body, true); )*
    };
    (@one $body:ident, $run_passthrough:expr) => {
        mod $body {
            #[test]
            fn ramfs() {
                super::$body(&$crate::harness::ram::Fuse::new());
            }

            #[test]
            fn passthrough() {
                if !$run_passthrough {
                    return;
                }
                let t = $crate::harness::passthrough::Tree::like_ramfs();
                super::$body(&$crate::harness::passthrough::Fuse::new(&t.share));
            }
        }
    };
}
