//! The typed FUSE operations (INIT, LOOKUP, CREATE, READ, WRITE, locks, ...): each builds its
//! request as Linux's FUSE client does and checks the reply's shape (sizes, node ids, attribute
//! sanity) before handing it back.

use super::error::{DriverError, Result};
use super::state::{Completion, FsDriver, InitInfo, PAGE_SIZE};
use crate::fuse_abi::{self as abi, opcode, Dirent, DirentPlus, EntryOut, InHeader};

/// Linux's `FUSE_DEFAULT_MAX_PAGES_LIMIT`.
pub const MAX_PAGES_LIMIT: u16 = 256;

/// A lock request (GETLK, SETLK, SETLKW) as [`FsDriver::submit_lk`] sends it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockReq {
    /// File handle.
    pub fh: u64,
    /// Lock owner (the kernel's id for a process's file table).
    pub owner: u64,
    /// `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
    pub typ: i32,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive.
    pub end: u64,
    /// Pid of the requester.
    pub pid: u32,
    /// A flock(2) lock (`FUSE_LK_FLOCK`; whole file, owned by the handle).
    pub flock: bool,
}

impl FsDriver {
    fn exact(opcode: u32, p: &[u8], n: usize) -> Result<()> {
        if p.len() != n {
            return Err(DriverError::BadReply {
                opcode,
                reason: format!("payload {} bytes, expected {n}", p.len()),
            });
        }
        Ok(())
    }

    fn check_attr(opcode: u32, a: &abi::Attr) -> Result<()> {
        let fmt = a.mode & libc::S_IFMT;
        let valid = [
            libc::S_IFREG,
            libc::S_IFDIR,
            libc::S_IFLNK,
            libc::S_IFCHR,
            libc::S_IFBLK,
            libc::S_IFIFO,
            libc::S_IFSOCK,
        ]
        .contains(&fmt);
        if !valid || a.size > i64::MAX as u64 {
            return Err(DriverError::BadReply {
                opcode,
                reason: format!("invalid attributes: mode {:o} size {}", a.mode, a.size),
            });
        }
        Ok(())
    }

    fn entry(opcode: u32, p: &[u8], want_fmt: Option<u32>) -> Result<EntryOut> {
        Self::exact(opcode, p, EntryOut::SIZE)?;
        let e = EntryOut::decode(p).expect("length checked");
        let bad = |reason: String| DriverError::BadReply { opcode, reason };
        if opcode != opcode::LOOKUP && (e.nodeid == 0 || e.nodeid == 1) {
            return Err(bad(format!("new entry has nodeid {}", e.nodeid)));
        }
        if e.nodeid != 0 {
            Self::check_attr(opcode, &e.attr)?;
        }
        if let Some(f) = want_fmt {
            if e.attr.mode & libc::S_IFMT != f {
                return Err(bad(format!("entry mode {:o}, expected type {f:o}", e.attr.mode)));
            }
        }
        Ok(e)
    }

    /// FUSE_INIT with the flags Linux 6.12 sends for virtio-fs; validates the reply.
    pub fn init(&mut self) -> Result<InitInfo> {
        self.init_with_flags(abi::init_flags::LINUX_6_12_VIRTIOFS)
    }

    /// FUSE_INIT with chosen flags.
    pub fn init_with_flags(&mut self, flags: u64) -> Result<InitInfo> {
        let op = opcode::INIT;
        let i = abi::InitIn {
            major: abi::FUSE_KERNEL_VERSION,
            minor: abi::FUSE_KERNEL_MINOR_VERSION,
            max_readahead: 128 << 10,
            flags: flags as u32,
            flags2: (flags >> 32) as u32,
            unused: [0; 11],
        }
        .to_bytes();
        let p = self.request(op, 0, &[&i], &[], abi::InitOut::SIZE, 0)?;
        Self::exact(op, &p, abi::InitOut::SIZE)?;
        let out = abi::InitOut::decode(&p).expect("length checked");
        let bad = |reason: String| DriverError::BadReply { opcode: op, reason };
        if out.major != abi::FUSE_KERNEL_VERSION {
            return Err(bad(format!("major {}", out.major)));
        }
        if out.minor > abi::FUSE_KERNEL_MINOR_VERSION {
            return Err(bad(format!(
                "minor {} above the requested {}",
                out.minor,
                abi::FUSE_KERNEL_MINOR_VERSION
            )));
        }
        let mut got = u64::from(out.flags);
        if out.flags & (abi::init_flags::INIT_EXT as u32) != 0 {
            got |= u64::from(out.flags2) << 32;
        }
        if got & !flags != 0 {
            return Err(bad(format!("server set flags {:#x} that were not offered", got & !flags)));
        }
        // Linux virtio-fs caps max_pages_limit at the virtqueue size minus FUSE_HEADER_OVERHEAD
        // (4), so that a request fits in the ring even without indirect descriptors.
        let vq_limit =
            self.queues[1..].iter().map(|q| q.vq.size()).min().unwrap_or(0).saturating_sub(4).max(1);
        let limit = MAX_PAGES_LIMIT.min(vq_limit);
        let max_pages =
            if got & abi::init_flags::MAX_PAGES != 0 { out.max_pages.clamp(1, limit) } else { 32.min(limit) };
        let max_write = out.max_write.max(4096).min(u32::from(max_pages) * PAGE_SIZE as u32);
        let info = InitInfo { out, flags_sent: flags, flags: got, max_write, max_pages };
        self.init = Some(info);
        Ok(info)
    }

    /// LOOKUP `name` in `parent`. A reply with nodeid 0 (negative entry) is `Err(Fuse ENOENT)`.
    pub fn lookup(&mut self, parent: u64, name: &str) -> Result<EntryOut> {
        let n = cstr(name);
        let p = self.request(opcode::LOOKUP, parent, &[&n], &[], EntryOut::SIZE, 0)?;
        let e = Self::entry(opcode::LOOKUP, &p, None)?;
        if e.nodeid == 0 {
            return Err(DriverError::Fuse { opcode: opcode::LOOKUP, errno: libc::ENOENT });
        }
        Ok(e)
    }

    fn attr_reply(op: u32, p: &[u8]) -> Result<abi::Attr> {
        Self::exact(op, p, abi::ATTR_OUT_SIZE)?;
        let a = abi::Attr::decode(&p[abi::AttrOutHead::SIZE..]).expect("length checked");
        Self::check_attr(op, &a)?;
        Ok(a)
    }

    /// GETATTR.
    pub fn getattr(&mut self, nodeid: u64) -> Result<abi::Attr> {
        let g = abi::GetattrIn::default().to_bytes();
        let p = self.request(opcode::GETATTR, nodeid, &[&g], &[], abi::ATTR_OUT_SIZE, 0)?;
        Self::attr_reply(opcode::GETATTR, &p)
    }

    /// SETATTR with a prepared `fuse_setattr_in`.
    pub fn setattr(&mut self, nodeid: u64, s: &abi::SetattrIn) -> Result<abi::Attr> {
        let b = s.to_bytes();
        let p = self.request(opcode::SETATTR, nodeid, &[&b], &[], abi::ATTR_OUT_SIZE, 0)?;
        Self::attr_reply(opcode::SETATTR, &p)
    }

    /// Truncates (SETATTR size, with the handle if given).
    pub fn truncate(&mut self, nodeid: u64, size: u64, fh: Option<u64>) -> Result<abi::Attr> {
        let mut s = abi::SetattrIn { valid: abi::fattr::SIZE, size, ..Default::default() };
        if let Some(fh) = fh {
            s.valid |= abi::fattr::FH;
            s.fh = fh;
        }
        let a = self.setattr(nodeid, &s)?;
        if a.size != size {
            return Err(DriverError::BadReply {
                opcode: opcode::SETATTR,
                reason: format!("size {} after truncating to {size}", a.size),
            });
        }
        Ok(a)
    }

    /// MKDIR.
    pub fn mkdir(&mut self, parent: u64, name: &str, mode: u32) -> Result<EntryOut> {
        let m = abi::MkdirIn { mode, umask: 0o022 }.to_bytes();
        let n = cstr(name);
        let p = self.request(opcode::MKDIR, parent, &[&m, &n], &[], EntryOut::SIZE, 0)?;
        Self::entry(opcode::MKDIR, &p, Some(libc::S_IFDIR))
    }

    /// CREATE (file, opened): returns the entry and the open reply.
    pub fn create(
        &mut self,
        parent: u64,
        name: &str,
        mode: u32,
        flags: u32,
    ) -> Result<(EntryOut, abi::OpenOut)> {
        let c = abi::CreateIn { flags, mode: mode | libc::S_IFREG, umask: 0o022, open_flags: 0 }.to_bytes();
        let n = cstr(name);
        let p =
            self.request(opcode::CREATE, parent, &[&c, &n], &[], EntryOut::SIZE + abi::OpenOut::SIZE, 0)?;
        Self::exact(opcode::CREATE, &p, EntryOut::SIZE + abi::OpenOut::SIZE)?;
        let e = Self::entry(opcode::CREATE, &p[..EntryOut::SIZE], Some(libc::S_IFREG))?;
        let o = abi::OpenOut::decode(&p[EntryOut::SIZE..]).expect("length checked");
        Ok((e, o))
    }

    /// MKNOD.
    pub fn mknod(&mut self, parent: u64, name: &str, mode: u32, rdev: u32) -> Result<EntryOut> {
        let m = abi::MknodIn { mode, rdev, umask: 0o022, padding: 0 }.to_bytes();
        let n = cstr(name);
        let p = self.request(opcode::MKNOD, parent, &[&m, &n], &[], EntryOut::SIZE, 0)?;
        Self::entry(opcode::MKNOD, &p, Some(mode & libc::S_IFMT))
    }

    fn open_common(&mut self, op: u32, nodeid: u64, flags: u32) -> Result<abi::OpenOut> {
        let o = abi::OpenIn { flags, open_flags: 0 }.to_bytes();
        let p = self.request(op, nodeid, &[&o], &[], abi::OpenOut::SIZE, 0)?;
        Self::exact(op, &p, abi::OpenOut::SIZE)?;
        Ok(abi::OpenOut::decode(&p).expect("length checked"))
    }

    /// OPEN.
    pub fn open(&mut self, nodeid: u64, flags: u32) -> Result<abi::OpenOut> {
        self.open_common(opcode::OPEN, nodeid, flags)
    }

    /// OPENDIR.
    pub fn opendir(&mut self, nodeid: u64) -> Result<abi::OpenOut> {
        self.open_common(opcode::OPENDIR, nodeid, (libc::O_RDONLY | libc::O_DIRECTORY) as u32)
    }

    fn read_in(fh: u64, offset: u64, size: u32) -> Vec<u8> {
        abi::ReadIn { fh, offset, size, ..Default::default() }.to_bytes()
    }

    /// READ of up to `len` bytes.
    pub fn read(&mut self, nodeid: u64, fh: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        let r = Self::read_in(fh, offset, len);
        let p = self.request(opcode::READ, nodeid, &[&r], &[], 0, len as usize)?;
        if p.len() > len as usize {
            return Err(DriverError::BadReply {
                opcode: opcode::READ,
                reason: format!("{} bytes for a {len}-byte read", p.len()),
            });
        }
        Ok(p)
    }

    /// WRITE; returns the count the server reports (checked to be at most `data.len()`).
    /// Larger than the negotiated `max_write` is refused, as the kernel never sends that.
    pub fn write(&mut self, nodeid: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        if let Some(i) = self.init {
            if data.len() > i.max_write as usize {
                return Err(DriverError::Unsupported(format!(
                    "write of {} bytes exceeds max_write {}",
                    data.len(),
                    i.max_write
                )));
            }
        }
        let w = abi::WriteIn { fh, offset, size: data.len() as u32, ..Default::default() }.to_bytes();
        let p = self.request(opcode::WRITE, nodeid, &[&w], data, abi::WriteOut::SIZE, 0)?;
        Self::exact(opcode::WRITE, &p, abi::WriteOut::SIZE)?;
        let o = abi::WriteOut::decode(&p).expect("length checked");
        if o.size as usize > data.len() {
            return Err(DriverError::BadReply {
                opcode: opcode::WRITE,
                reason: format!("wrote {} of {} bytes", o.size, data.len()),
            });
        }
        Ok(o.size)
    }

    fn empty_reply(&mut self, op: u32, nodeid: u64, args: &[&[u8]]) -> Result<()> {
        let p = self.request(op, nodeid, args, &[], 0, 0)?;
        Self::exact(op, &p, 0)
    }

    /// RELEASE.
    pub fn release(&mut self, nodeid: u64, fh: u64) -> Result<()> {
        let r = abi::ReleaseIn { fh, ..Default::default() }.to_bytes();
        self.empty_reply(opcode::RELEASE, nodeid, &[&r])
    }

    /// RELEASEDIR.
    pub fn releasedir(&mut self, nodeid: u64, fh: u64) -> Result<()> {
        let r = abi::ReleaseIn { fh, ..Default::default() }.to_bytes();
        self.empty_reply(opcode::RELEASEDIR, nodeid, &[&r])
    }

    /// FLUSH.
    pub fn flush(&mut self, nodeid: u64, fh: u64) -> Result<()> {
        self.flush_owner(nodeid, fh, 0)
    }

    /// FLUSH on behalf of lock owner `lock_owner` (a close(2): the owner's POSIX locks go).
    pub fn flush_owner(&mut self, nodeid: u64, fh: u64, lock_owner: u64) -> Result<()> {
        let f = abi::FlushIn { fh, lock_owner, ..Default::default() }.to_bytes();
        self.empty_reply(opcode::FLUSH, nodeid, &[&f])
    }

    /// RELEASE of a file that used flock(2): `FUSE_RELEASE_FLOCK_UNLOCK` with `lock_owner`.
    pub fn release_flock(&mut self, nodeid: u64, fh: u64, lock_owner: u64) -> Result<()> {
        let r = abi::ReleaseIn {
            fh,
            release_flags: abi::FUSE_RELEASE_FLOCK_UNLOCK,
            lock_owner,
            ..Default::default()
        }
        .to_bytes();
        self.empty_reply(opcode::RELEASE, nodeid, &[&r])
    }

    /// Submits GETLK, SETLK or SETLKW (`op`) on `queue` without waiting for the reply; returns
    /// its unique. Collect the result with [`FsDriver::lk_result`].
    pub fn submit_lk(&mut self, queue: u16, op: u32, nodeid: u64, req: &LockReq) -> Result<u64> {
        let arg = abi::LkIn {
            fh: req.fh,
            owner: req.owner,
            lk_start: req.start,
            lk_end: req.end,
            lk_typ: req.typ as u32,
            lk_pid: req.pid,
            lk_flags: if req.flock { abi::FUSE_LK_FLOCK } else { 0 },
            padding: 0,
        }
        .to_bytes();
        let out = if op == opcode::GETLK { abi::FileLock::SIZE } else { 0 };
        self.submit(queue, op, nodeid, &[&arg], &[], out, 0)
    }

    /// Waits for the lock request `unique` (from [`FsDriver::submit_lk`]) and checks its reply:
    /// the lock a GETLK reports, `None` for SETLK/SETLKW; a FUSE error is `Err(Fuse)`.
    pub fn lk_result(&mut self, op: u32, unique: u64) -> Result<Option<abi::FileLock>> {
        let c = self.wait_for(unique)?;
        Self::lk_reply(&c, op)
    }

    /// Checks the reply `c` of a lock request `op`, as [`FsDriver::lk_result`].
    pub fn lk_reply(c: &Completion, op: u32) -> Result<Option<abi::FileLock>> {
        let (h, p) = Self::parse_reply(c, op, c.token)?;
        if h.error != 0 {
            return Err(DriverError::Fuse { opcode: op, errno: -h.error });
        }
        if op != opcode::GETLK {
            Self::exact(op, &p, 0)?;
            return Ok(None);
        }
        Self::exact(op, &p, abi::FileLock::SIZE)?;
        let lk = abi::FileLock::decode(&p).expect("length checked");
        let typ = lk.typ as i32;
        if ![libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK].contains(&typ)
            || (typ != libc::F_UNLCK && (lk.start > lk.end || lk.end > abi::OFFSET_MAX))
        {
            return Err(DriverError::BadReply { opcode: op, reason: format!("invalid lock {lk:?}") });
        }
        Ok(Some(lk))
    }

    /// SETLK on the current request queue.
    pub fn setlk(&mut self, nodeid: u64, req: &LockReq) -> Result<()> {
        let q = self.pick_queue();
        let u = self.submit_lk(q, opcode::SETLK, nodeid, req)?;
        self.lk_result(opcode::SETLK, u).map(drop)
    }

    /// GETLK on the current request queue: the conflicting lock, or one of type `F_UNLCK`.
    pub fn getlk(&mut self, nodeid: u64, req: &LockReq) -> Result<abi::FileLock> {
        let q = self.pick_queue();
        let u = self.submit_lk(q, opcode::GETLK, nodeid, req)?;
        Ok(self.lk_result(opcode::GETLK, u)?.expect("GETLK replies carry a lock"))
    }

    /// INTERRUPT of request `unique` on the hiprio queue (one buffer, no reply, as Linux would
    /// lay it out: its own unique is `unique | FUSE_INT_REQ_BIT`); waits for the used entry.
    pub fn interrupt(&mut self, unique: u64) -> Result<()> {
        let token = unique | abi::FUSE_INT_REQ_BIT;
        if self.pending.contains_key(&token) {
            return Err(DriverError::Unsupported(format!("an INTERRUPT of {unique} is in flight")));
        }
        let len = InHeader::SIZE + abi::InterruptIn::SIZE;
        let mut b = self.in_header(opcode::INTERRUPT, token, 0, len).to_bytes();
        abi::InterruptIn { unique }.encode_into(&mut b);
        let mut segs = Vec::new();
        self.submit_layout(0, token, Some(opcode::INTERRUPT), &[&b], &[len], len, &[], 0, &mut segs)?;
        let c = self.wait_for(token)?;
        if c.used_len != 0 {
            return Err(DriverError::BadReply {
                opcode: opcode::INTERRUPT,
                reason: format!("used length {} for a request without reply buffers", c.used_len),
            });
        }
        Ok(())
    }

    /// FSYNC.
    pub fn fsync(&mut self, nodeid: u64, fh: u64, datasync: bool) -> Result<()> {
        let f = abi::FsyncIn { fh, fsync_flags: u32::from(datasync), padding: 0 }.to_bytes();
        self.empty_reply(opcode::FSYNC, nodeid, &[&f])
    }

    /// One READDIR of up to `size` bytes from `offset`.
    pub fn readdir(&mut self, nodeid: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<Dirent>> {
        let r = Self::read_in(fh, offset, size);
        let p = self.request(opcode::READDIR, nodeid, &[&r], &[], 0, size as usize)?;
        abi::parse_dirents(&p).map_err(|reason| DriverError::BadReply { opcode: opcode::READDIR, reason })
    }

    /// READDIR until an empty reply (4 KiB at a time, as Linux does).
    pub fn readdir_all(&mut self, nodeid: u64, fh: u64) -> Result<Vec<Dirent>> {
        let mut all: Vec<Dirent> = Vec::new();
        let mut off = 0;
        for _ in 0..100_000 {
            let v = self.readdir(nodeid, fh, off, PAGE_SIZE as u32)?;
            let Some(last) = v.last() else {
                return Ok(all);
            };
            if last.off == off {
                return Err(DriverError::BadReply {
                    opcode: opcode::READDIR,
                    reason: format!("offset cookie does not advance past {off}"),
                });
            }
            off = last.off;
            all.extend(v);
        }
        Err(DriverError::BadReply { opcode: opcode::READDIR, reason: "directory never ends".into() })
    }

    /// One READDIRPLUS of up to `size` bytes from `offset`.
    pub fn readdirplus(&mut self, nodeid: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<DirentPlus>> {
        let r = Self::read_in(fh, offset, size);
        let p = self.request(opcode::READDIRPLUS, nodeid, &[&r], &[], 0, size as usize)?;
        abi::parse_direntplus(&p)
            .map_err(|reason| DriverError::BadReply { opcode: opcode::READDIRPLUS, reason })
    }

    /// RENAME.
    pub fn rename(&mut self, parent: u64, name: &str, newparent: u64, newname: &str) -> Result<()> {
        let r = abi::RenameIn { newdir: newparent }.to_bytes();
        let (a, b) = (cstr(name), cstr(newname));
        self.empty_reply(opcode::RENAME, parent, &[&r, &a, &b])
    }

    /// RENAME2 with flags.
    pub fn rename2(
        &mut self,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        flags: u32,
    ) -> Result<()> {
        let r = abi::Rename2In { newdir: newparent, flags, padding: 0 }.to_bytes();
        let (a, b) = (cstr(name), cstr(newname));
        self.empty_reply(opcode::RENAME2, parent, &[&r, &a, &b])
    }

    /// UNLINK.
    pub fn unlink(&mut self, parent: u64, name: &str) -> Result<()> {
        let n = cstr(name);
        self.empty_reply(opcode::UNLINK, parent, &[&n])
    }

    /// RMDIR.
    pub fn rmdir(&mut self, parent: u64, name: &str) -> Result<()> {
        let n = cstr(name);
        self.empty_reply(opcode::RMDIR, parent, &[&n])
    }

    /// STATFS.
    pub fn statfs(&mut self, nodeid: u64) -> Result<abi::StatfsOut> {
        let p = self.request(opcode::STATFS, nodeid, &[], &[], abi::StatfsOut::SIZE, 0)?;
        Self::exact(opcode::STATFS, &p, abi::StatfsOut::SIZE)?;
        Ok(abi::StatfsOut::decode(&p).expect("length checked"))
    }

    /// SYMLINK `name` -> `target` in `parent`.
    pub fn symlink(&mut self, parent: u64, name: &str, target: &str) -> Result<EntryOut> {
        let (n, t) = (cstr(name), cstr(target));
        let p = self.request(opcode::SYMLINK, parent, &[&n, &t], &[], EntryOut::SIZE, 0)?;
        Self::entry(opcode::SYMLINK, &p, Some(libc::S_IFLNK))
    }

    /// READLINK (Linux asks for one page).
    pub fn readlink(&mut self, nodeid: u64) -> Result<Vec<u8>> {
        let p = self.request(opcode::READLINK, nodeid, &[], &[], 0, PAGE_SIZE)?;
        if p.is_empty() {
            return Err(DriverError::BadReply {
                opcode: opcode::READLINK,
                reason: "empty link target".into(),
            });
        }
        Ok(p)
    }

    /// LINK existing `nodeid` as `newname` in `newparent`.
    pub fn link(&mut self, nodeid: u64, newparent: u64, newname: &str) -> Result<EntryOut> {
        let l = abi::LinkIn { oldnodeid: nodeid }.to_bytes();
        let n = cstr(newname);
        let p = self.request(opcode::LINK, newparent, &[&l, &n], &[], EntryOut::SIZE, 0)?;
        let e = Self::entry(opcode::LINK, &p, None)?;
        if e.nodeid != nodeid {
            return Err(DriverError::BadReply {
                opcode: opcode::LINK,
                reason: format!("link returned node {} for node {nodeid}", e.nodeid),
            });
        }
        Ok(e)
    }

    /// FORGET on the hiprio queue (one 48-byte buffer, no reply); waits for the used entry.
    pub fn forget(&mut self, nodeid: u64, nlookup: u64) -> Result<()> {
        let unique = self.alloc_unique();
        let mut b =
            self.in_header(opcode::FORGET, unique, nodeid, InHeader::SIZE + abi::ForgetIn::SIZE).to_bytes();
        abi::ForgetIn { nlookup }.encode_into(&mut b);
        let mut segs = Vec::new();
        let len = b.len();
        self.submit_layout(0, unique, Some(opcode::FORGET), &[&b], &[len], len, &[], 0, &mut segs)?;
        let c = self.wait_for(unique)?;
        if c.used_len != 0 {
            return Err(DriverError::BadReply {
                opcode: opcode::FORGET,
                reason: format!("used length {} for a request without reply buffers", c.used_len),
            });
        }
        Ok(())
    }
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}
