//! A FUSE "kernel" for tests: builds requests as bytes, hands them to `Server::handle` as volatile
//! slices (optionally cut into many small buffers), and decodes the replies.
#![allow(dead_code)]

use std::cell::Cell;

use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::{RamFs, Server};
use vm_memory::{ByteValued, VolatileSlice};

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

/// Runs `handle` on `req` cut into `split`-byte buffers, with a `cap`-byte reply area cut into
/// `reply_split`-byte buffers.
pub fn handle_raw(srv: &Server<RamFs>, req: &[u8], split: usize, cap: usize, reply_split: usize) -> Reply {
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
        srv.handle(&readable, &writable)
    };
    let out: Vec<u8> = wbufs.concat();
    if n == 0 {
        return Reply { n, hdr: abi::OutHeader::default(), body: Vec::new() };
    }
    let hdr: abi::OutHeader = parse(&out);
    assert_eq!(hdr.len as usize, n, "header len matches the returned length");
    Reply { n, hdr, body: out[HDR..n].to_vec() }
}

/// One FUSE session against a RamFs, acting as caller `uid`/`gid`.
pub struct Fuse {
    pub srv: Server<RamFs>,
    unique: Cell<u64>,
    pub uid: Cell<u32>,
    pub gid: Cell<u32>,
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

impl Fuse {
    /// A fresh RamFs, not initialised.
    pub fn uninit() -> Self {
        Self::with_fs(RamFs::new())
    }

    /// A session over `fs`, not initialised.
    pub fn with_fs(fs: RamFs) -> Self {
        Fuse { srv: Server::new(fs), unique: Cell::new(0), uid: Cell::new(0), gid: Cell::new(0) }
    }

    /// A fresh RamFs after a Linux-6.12-like INIT.
    pub fn new() -> Self {
        let f = Self::uninit();
        let out = f.init(41, LINUX_FLAGS).expect("init");
        assert_eq!(out.minor, abi::KERNEL_MINOR_VERSION);
        f
    }

    pub fn fs(&self) -> &RamFs {
        self.srv.filesystem()
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
        let reply = handle_raw(&self.srv, &req, usize::MAX, HDR + (2 << 20), usize::MAX);
        if reply.n != 0 {
            let sent: abi::InHeader = parse(&req);
            assert_eq!(reply.hdr.unique, sent.unique, "reply echoes unique");
        }
        reply
    }

    /// Sends a request whose arguments are followed by the request extensions `ext`, with
    /// `total_extlen` as given (normally `ext.len() / 8`).
    pub fn call_ext(&self, op: u32, nodeid: u64, args: &[&[u8]], ext: &[u8], total_extlen: u16) -> Reply {
        let mut all: Vec<&[u8]> = args.to_vec();
        all.push(ext);
        let mut req = self.req(op, nodeid, &all);
        req[36..38].copy_from_slice(&total_extlen.to_ne_bytes());
        let reply = handle_raw(&self.srv, &req, usize::MAX, HDR + (2 << 20), usize::MAX);
        if reply.n != 0 {
            let sent: abi::InHeader = parse(&req);
            assert_eq!(reply.hdr.unique, sent.unique, "reply echoes unique");
        }
        reply
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
        let arg = abi::WriteIn { fh, offset, size: data.len() as u32, write_flags, ..Default::default() };
        let out: abi::WriteOut = parse(&self.call(opcode::WRITE, ino, &[arg.as_slice(), data]).result()?);
        Ok(out.size)
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

    pub fn statfs(&self) -> R<abi::Kstatfs> {
        let out: abi::StatfsOut = parse(&self.call(opcode::STATFS, ROOT, &[]).result()?);
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

    /// READDIRPLUS: (entry, next offset, name) per entry.
    pub fn readdirplus(&self, ino: u64, fh: u64, offset: u64, size: u32) -> R<Vec<DirentPlus>> {
        let body =
            self.call(opcode::READDIRPLUS, ino, &[Self::read_in(fh, offset, size).as_slice()]).result()?;
        let mut out = Vec::new();
        let mut at = 0;
        while at < body.len() {
            let d: abi::DirentPlus = parse(&body[at..]);
            let name = body[at + 152..at + 152 + d.dirent.namelen as usize].to_vec();
            assert_eq!(d.entry_out.attr.ino, d.dirent.ino);
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

impl Fuse {
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
