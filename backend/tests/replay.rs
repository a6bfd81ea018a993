//! Requests executed again after a crash (DESIGN.md, "Executing again"; the server's
//! `replay` module): each rule against the RAM filesystem through the server, a request sent
//! first as new and then again as taken again from the in-flight record, and the same requests
//! sent again as new, which keep their errors. Then the same rules over a filesystem whose
//! every request completes later on its engine (as NFS's do), whose synchronous methods are
//! not there: the LOOKUP and OPEN a rule asks for go through the engine too.

mod harness;

use harness::ram::Fuse;
use harness::*;
use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::filesystem::seam::{Completions, FsEngine, Started, Token};
use virtiofs_backend::filesystem::{self, Context, FileSystem, LockAccess, Reply};
use virtiofs_backend::io::Writer;
use virtiofs_backend::request::Request;
use virtiofs_backend::server::{serve_sync, PollerEngine, ReplayStats, Submitted};
use virtiofs_backend::RamFs;
use vm_memory::{ByteValued, VolatileSlice};

const S_IFMT: u32 = libc::S_IFMT;
const S_IFREG: u32 = libc::S_IFREG;
const S_IFDIR: u32 = libc::S_IFDIR;
const S_IFIFO: u32 = libc::S_IFIFO;
const S_IFLNK: u32 = libc::S_IFLNK;
const O_APPEND: u32 = libc::O_APPEND as u32;

/// A session with a directory everybody may write in (node id returned).
fn session() -> (Fuse, u64) {
    let f = Fuse::new();
    let dir = f.mkdir(ROOT, b"d", 0o777).unwrap().nodeid;
    f.chmod(dir, 0o777).unwrap();
    (f, dir)
}

fn stats(f: &Fuse) -> ReplayStats {
    f.srv.replay_stats()
}

/// CREATE executed again finds the file its first execution made: the same entry, and a
/// handle of its own that reads and writes it; sent again as new, `EEXIST`. A file that is
/// not the caller's, or a name that is not a file, stays `EEXIST`.
#[test]
fn create_executed_again_answers_the_file_it_made() {
    let (f, dir) = session();
    let flags = O_CREAT | O_EXCL | O_RDWR;
    let (e1, o1) = f.create(dir, b"f", 0o644, flags).unwrap();
    f.write(e1.nodeid, o1.fh, 0, b"first").unwrap();
    assert_eq!(f.create(dir, b"f", 0o644, flags).unwrap_err(), libc::EEXIST, "new: EEXIST");
    let (e2, o2) = f.replaying(|f| f.create(dir, b"f", 0o644, flags)).unwrap();
    assert_eq!((e2.nodeid, e2.generation), (e1.nodeid, e1.generation));
    assert_eq!(e2.attr.mode & S_IFMT, S_IFREG);
    assert_eq!(e2.attr.size, 5, "not truncated, not made again");
    assert_ne!(o2.fh, o1.fh, "a handle of its own");
    assert_eq!(f.read(e2.nodeid, o2.fh, 0, 16).unwrap(), b"first");
    f.write(e2.nodeid, o2.fh, 5, b"+again").unwrap();
    assert_eq!(f.read(e1.nodeid, o1.fh, 0, 16).unwrap(), b"first+again");
    // Another caller's file.
    assert_eq!(f.as_user(1000, 1000).replaying(|f| f.create(dir, b"f", 0o644, flags)), Err(libc::EEXIST));
    f.as_user(0, 0);
    // A directory of that name.
    f.mkdir(dir, b"sub", 0o755).unwrap();
    assert_eq!(f.replaying(|f| f.create(dir, b"sub", 0o644, flags)), Err(libc::EEXIST));
    // The first execution's lookup reference stays (the kernel never saw it).
    assert_eq!(f.fs().lookup_count(e1.nodeid), Some(2));
    let s = stats(&f);
    assert_eq!((s.requests, s.answered_as_first, s.refused), (3, 1, 0), "{s:?}");
}

/// CREATE executed again opens the file with its flags minus `O_CREAT`, `O_EXCL` and
/// `O_TRUNC`: what the first execution wrote is not truncated, and the handle's access mode is
/// the asked one (a read-only CREATE cannot write).
#[test]
fn create_executed_again_opens_with_its_flags_without_creating_or_truncating() {
    let (f, dir) = session();
    let (e, o) = f.create(dir, b"f", 0o644, O_CREAT | O_RDWR).unwrap();
    f.write(e.nodeid, o.fh, 0, b"data").unwrap();
    let flags = O_CREAT | O_EXCL | O_TRUNC | O_RDONLY;
    let (e2, o2) = f.replaying(|f| f.create(dir, b"f", 0o644, flags)).unwrap();
    assert_eq!(e2.attr.size, 4);
    assert_eq!(f.read(e2.nodeid, o2.fh, 0, 8).unwrap(), b"data");
    assert_eq!(f.write(e2.nodeid, o2.fh, 0, b"x"), Err(libc::EBADF), "read-only as asked");
}

/// MKNOD, MKDIR and SYMLINK executed again answer the node their first execution made, if it
/// is of the asked type and the caller's; else `EEXIST`, as they do sent again as new.
#[test]
fn mknod_mkdir_symlink_executed_again_answer_the_node_they_made() {
    let (f, dir) = session();
    let fifo = f.mknod(dir, b"p", S_IFIFO | 0o644, 0).unwrap();
    let sub = f.mkdir(dir, b"s", 0o755).unwrap();
    let link = f.symlink(dir, b"l", b"target").unwrap();
    assert_eq!(f.mknod(dir, b"p", S_IFIFO | 0o644, 0), Err(libc::EEXIST));
    assert_eq!(f.mkdir(dir, b"s", 0o755), Err(libc::EEXIST));
    assert_eq!(f.symlink(dir, b"l", b"target"), Err(libc::EEXIST));
    f.replaying(|f| {
        let p = f.mknod(dir, b"p", S_IFIFO | 0o644, 0).unwrap();
        assert_eq!((p.nodeid, p.attr.mode & S_IFMT), (fifo.nodeid, S_IFIFO));
        let s = f.mkdir(dir, b"s", 0o755).unwrap();
        assert_eq!((s.nodeid, s.attr.mode & S_IFMT), (sub.nodeid, S_IFDIR));
        let l = f.symlink(dir, b"l", b"target").unwrap();
        assert_eq!((l.nodeid, l.attr.mode & S_IFMT), (link.nodeid, S_IFLNK));
        // Another type under the name.
        assert_eq!(f.mknod(dir, b"s", S_IFIFO | 0o644, 0), Err(libc::EEXIST));
        assert_eq!(f.mkdir(dir, b"p", 0o755), Err(libc::EEXIST));
        assert_eq!(f.symlink(dir, b"s", b"target"), Err(libc::EEXIST));
        // A regular file made by MKNOD (type bits 0 are a regular file).
        let file = f.mknod(dir, b"r", S_IFREG | 0o600, 0).unwrap();
        assert_eq!(f.mknod(dir, b"r", 0o600, 0).unwrap().nodeid, file.nodeid);
    });
    // Another caller's directory.
    assert_eq!(f.as_user(1000, 1000).replaying(|f| f.mkdir(dir, b"s", 0o755)), Err(libc::EEXIST));
    // The lookup references the checks took and did not answer with are dropped: the first
    // execution's and the one answered with stay.
    assert_eq!(f.fs().lookup_count(sub.nodeid), Some(2));
}

/// LINK executed again answers the link its first execution made, if the name is the
/// target's; a name of another inode stays `EEXIST`.
#[test]
fn link_executed_again_answers_the_link_it_made() {
    let (f, dir) = session();
    let (a, _) = f.create(dir, b"a", 0o644, O_CREAT | O_RDWR).unwrap();
    let (b, _) = f.create(dir, b"b", 0o644, O_CREAT | O_RDWR).unwrap();
    let l = f.link(a.nodeid, dir, b"l").unwrap();
    assert_eq!(l.attr.nlink, 2);
    assert_eq!(f.link(a.nodeid, dir, b"l"), Err(libc::EEXIST));
    let again = f.replaying(|f| f.link(a.nodeid, dir, b"l")).unwrap();
    assert_eq!((again.nodeid, again.attr.nlink), (a.nodeid, 2), "not linked twice");
    assert_eq!(f.replaying(|f| f.link(b.nodeid, dir, b"l")), Err(libc::EEXIST), "another inode's name");
    assert_eq!(f.replaying(|f| f.link(b.nodeid, dir, b"a")), Err(libc::EEXIST));
    let s = stats(&f);
    assert_eq!((s.requests, s.answered_as_first), (3, 1), "{s:?}");
}

/// UNLINK and RMDIR executed again succeed where their first execution removed the name;
/// sent again as new, `ENOENT`.
#[test]
fn unlink_and_rmdir_executed_again_succeed() {
    let (f, dir) = session();
    f.create(dir, b"f", 0o644, O_CREAT | O_RDWR).unwrap();
    f.mkdir(dir, b"s", 0o755).unwrap();
    f.unlink(dir, b"f").unwrap();
    f.rmdir(dir, b"s").unwrap();
    assert_eq!(f.unlink(dir, b"f"), Err(libc::ENOENT), "new: ENOENT");
    assert_eq!(f.rmdir(dir, b"s"), Err(libc::ENOENT));
    f.replaying(|f| {
        assert_eq!(f.unlink(dir, b"f"), Ok(()));
        assert_eq!(f.rmdir(dir, b"s"), Ok(()));
        // Other errors stand.
        f.mkdir(dir, b"t", 0o755).unwrap();
        assert_eq!(f.unlink(dir, b"t"), Err(libc::EISDIR));
    });
    assert_eq!(f.lookup(dir, b"f"), Err(libc::ENOENT));
}

/// RENAME executed again succeeds when the source is gone and the target is there (its first
/// execution moved it); not when the target is missing too, nor for `RENAME_EXCHANGE`.
#[test]
fn rename_executed_again_succeeds_when_the_target_is_there() {
    let (f, dir) = session();
    let other = f.mkdir(dir, b"o", 0o777).unwrap().nodeid;
    let (a, _) = f.create(dir, b"a", 0o644, O_CREAT | O_RDWR).unwrap();
    f.rename(dir, b"a", other, b"b").unwrap();
    assert_eq!(f.rename(dir, b"a", other, b"b"), Err(libc::ENOENT), "new: ENOENT");
    f.replaying(|f| {
        assert_eq!(f.rename(dir, b"a", other, b"b"), Ok(()));
        assert_eq!(f.rename2(dir, b"a", other, b"b", libc::RENAME_NOREPLACE), Ok(()));
        assert_eq!(f.rename(dir, b"a", other, b"c"), Err(libc::ENOENT), "no target either");
        assert_eq!(f.rename2(dir, b"a", other, b"b", libc::RENAME_EXCHANGE), Err(libc::ENOENT));
    });
    assert_eq!(f.lookup(other, b"b").unwrap().nodeid, a.nodeid);
    // The target's lookup references the checks took are dropped: CREATE's and the test's
    // LOOKUP's stay.
    assert_eq!(f.fs().lookup_count(a.nodeid), Some(2));
}

/// RELEASE, RELEASEDIR, FLUSH, FSYNC and FSYNCDIR executed again succeed on a handle their
/// first execution released; sent again as new, `EBADF`.
#[test]
fn handle_ops_executed_again_on_a_released_handle_succeed() {
    let (f, dir) = session();
    let (e, o) = f.create(dir, b"f", 0o644, O_CREAT | O_RDWR).unwrap();
    let dh = f.opendir(dir).unwrap();
    f.release(e.nodeid, o.fh).unwrap();
    f.releasedir(dir, dh).unwrap();
    assert_eq!(f.release(e.nodeid, o.fh), Err(libc::EBADF), "new: EBADF");
    assert_eq!(f.releasedir(dir, dh), Err(libc::EBADF));
    assert_eq!(f.flush(e.nodeid, o.fh), Err(libc::EBADF));
    assert_eq!(f.fsync(e.nodeid, o.fh, false), Err(libc::EBADF));
    assert_eq!(f.fsync(dir, dh, true), Err(libc::EBADF));
    f.replaying(|f| {
        assert_eq!(f.release(e.nodeid, o.fh), Ok(()));
        assert_eq!(f.releasedir(dir, dh), Ok(()));
        assert_eq!(f.flush(e.nodeid, o.fh), Ok(()));
        assert_eq!(f.fsync(e.nodeid, o.fh, false), Ok(()));
        assert_eq!(f.fsync(dir, dh, true), Ok(()));
    });
    let s = stats(&f);
    assert_eq!((s.requests, s.answered_as_first), (5, 5), "{s:?}");
}

/// A WRITE through a file opened `O_APPEND` executed again is refused with `EIO`, not
/// executed; other WRITEs run again (the same bytes at the same offset).
#[test]
fn an_append_write_executed_again_is_refused() {
    let (f, dir) = session();
    let (e, o) = f.create(dir, b"f", 0o644, O_CREAT | O_RDWR | O_APPEND).unwrap();
    let append = |f: &Fuse, offset: u64, data: &[u8]| {
        let arg =
            abi::WriteIn { fh: o.fh, offset, size: data.len() as u32, flags: O_APPEND, ..Default::default() };
        let r = f.call(opcode::WRITE, e.nodeid, &[arg.as_slice(), data]).result()?;
        Ok::<_, i32>(parse::<abi::WriteOut>(&r).size)
    };
    assert_eq!(append(&f, 0, b"abc"), Ok(3));
    assert_eq!(f.replaying(|f| append(f, 0, b"abc")), Err(libc::EIO));
    assert_eq!(f.getattr(e.nodeid).unwrap().size, 3, "not written again");
    assert_eq!(append(&f, 3, b"def"), Ok(3), "new: written");
    assert_eq!(f.replaying(|f| f.write(e.nodeid, o.fh, 0, b"ABC")), Ok(3), "without O_APPEND: run again");
    assert_eq!(f.read(e.nodeid, o.fh, 0, 8).unwrap(), b"ABCdef");
    let s = stats(&f);
    assert_eq!((s.requests, s.refused), (2, 1), "{s:?}");
}

/// Everything else is executed as it is: reads and lookups, their errors too.
#[test]
fn other_requests_executed_again_run_as_they_are() {
    let (f, dir) = session();
    let (e, o) = f.create(dir, b"f", 0o644, O_CREAT | O_RDWR).unwrap();
    f.write(e.nodeid, o.fh, 0, b"x").unwrap();
    f.replaying(|f| {
        assert_eq!(f.lookup(dir, b"f").unwrap().nodeid, e.nodeid);
        assert_eq!(f.lookup(dir, b"nope"), Err(libc::ENOENT));
        assert_eq!(f.read(e.nodeid, o.fh, 0, 4).unwrap(), b"x");
        assert_eq!(f.getattr(e.nodeid).unwrap().size, 1);
        assert_eq!(f.access(e.nodeid, libc::R_OK as u32), Ok(()));
    });
    let s = stats(&f);
    assert_eq!((s.requests, s.answered_as_first, s.refused), (5, 0, 0), "{s:?}");
}

// The same rules over a filesystem whose every request completes later.

/// The RAM filesystem behind an engine that answers every request on its next poll; its
/// synchronous methods are not there (`ENOSYS`) but those the server calls itself.
struct LaterFs {
    ram: RamFs,
}

impl FileSystem for LaterFs {
    fn init(&self, capable: u64) -> filesystem::Result<u64> {
        self.ram.init(capable)
    }

    fn forget(&self, ctx: &Context, ino: u64, nlookup: u64) {
        self.ram.forget(ctx, ino, nlookup)
    }

    fn lock_handle(&self, ctx: &Context, ino: u64, fh: u64, access: LockAccess) -> filesystem::Result<()> {
        self.ram.lock_handle(ctx, ino, fh, access)
    }

    fn has_open_handles(&self, ino: u64) -> bool {
        self.ram.has_open_handles(ino)
    }

    fn engine(&self, _poller: usize) -> Option<Box<dyn FsEngine<Self>>> {
        Some(Box::new(Later { ready: Vec::new(), started: 0 }))
    }
}

/// Serves each request at start into its buffers, and completes it on the next poll.
struct Later {
    ready: Vec<(Token, filesystem::Result<Reply>)>,
    started: usize,
}

impl FsEngine<LaterFs> for Later {
    fn start(&mut self, fs: &LaterFs, token: Token, req: &mut Request<'_>, data: &mut Writer<'_>) -> Started {
        self.started += 1;
        self.ready.push((token, serve_sync(&fs.ram, req, data)));
        Started::Pending
    }

    fn poll(&mut self, _fs: &LaterFs, done: &mut Completions<'_>) {
        for (token, reply) in self.ready.drain(..) {
            done.complete(token, reply);
        }
    }

    fn in_flight(&self) -> usize {
        self.ready.len()
    }
}

/// A poller's engine over a [`LaterFs`] session.
struct Async {
    fuse: harness::Fuse<LaterFs>,
    engine: PollerEngine<LaterFs>,
}

impl Async {
    fn new() -> Self {
        let fuse = harness::Fuse::with_fs(LaterFs { ram: RamFs::new() }).initialised();
        let engine = PollerEngine::for_poller(fuse.srv.clone(), 0);
        Async { fuse, engine }
    }

    /// Sends request `op` (executed again if `replayed`) and polls until it is answered;
    /// returns the reply and the polls that took.
    fn call(&mut self, op: u32, nodeid: u64, args: &[&[u8]], replayed: bool) -> (harness::Reply, usize) {
        let mut req = self.fuse.req(op, nodeid, args);
        let mut out = vec![0u8; HDR + 4096];
        let mut polls = 0;
        let n = {
            let readable = [VolatileSlice::from(&mut req[..])];
            let writable = [VolatileSlice::from(&mut out[..])];
            let mut n = match self.engine.submit_as(7, replayed, &readable, &writable) {
                Submitted::Done(n) => Some(n),
                Submitted::Pending => None,
                Submitted::Wait(w) => panic!("{w:?}"),
            };
            while n.is_none() {
                polls += 1;
                assert!(polls < 10, "answered in a few polls");
                self.engine.poll(&mut |id, len, _| {
                    assert_eq!(id, 7);
                    n = Some(len);
                });
            }
            assert_eq!(self.engine.in_flight(), 0);
            n.unwrap_or(0) as usize
        };
        let hdr: abi::OutHeader = parse(&out);
        assert_eq!(hdr.len as usize, n);
        (harness::Reply { n, hdr, body: out[HDR..n].to_vec() }, polls)
    }
}

/// Over an engine-only filesystem, CREATE executed again goes LOOKUP and OPEN through the
/// engine, each completed on a later poll, and answers the file its first execution made; the
/// other rules too.
#[test]
fn the_rules_hold_over_a_filesystem_whose_requests_complete_later() {
    let mut a = Async::new();
    let create = abi::CreateIn { flags: O_CREAT | O_EXCL | O_RDWR, mode: 0o644, umask: 0, open_flags: 0 };
    let (r, polls) = a.call(opcode::CREATE, ROOT, &[create.as_slice(), &cstr(b"f")], false);
    assert_eq!((r.errno(), polls), (0, 1));
    let first: abi::EntryOut = parse(&r.body);
    let (r, _) = a.call(opcode::CREATE, ROOT, &[create.as_slice(), &cstr(b"f")], false);
    assert_eq!(r.errno(), libc::EEXIST, "new: EEXIST");
    let (r, polls) = a.call(opcode::CREATE, ROOT, &[create.as_slice(), &cstr(b"f")], true);
    assert_eq!((r.errno(), polls), (0, 3), "CREATE, LOOKUP, OPEN: each on a poll");
    assert_eq!(r.body.len(), 128 + 16);
    let again: abi::EntryOut = parse(&r.body);
    let open: abi::OpenOut = parse(&r.body[128..]);
    assert_eq!(again.nodeid, first.nodeid);
    assert!(a.fuse.fs().ram.has_open_handles(first.nodeid) && open.fh != 0);
    // MKDIR over a file: LOOKUP, then EEXIST; the reference the LOOKUP took is dropped.
    let mkdir = abi::MkdirIn { mode: 0o755, umask: 0 };
    let (r, polls) = a.call(opcode::MKDIR, ROOT, &[mkdir.as_slice(), &cstr(b"f")], true);
    assert_eq!((r.errno(), polls), (libc::EEXIST, 2));
    assert_eq!(a.fuse.fs().ram.lookup_count(first.nodeid), Some(2));
    // UNLINK twice.
    let (r, _) = a.call(opcode::UNLINK, ROOT, &[&cstr(b"f")], false);
    assert_eq!(r.errno(), 0);
    let (r, _) = a.call(opcode::UNLINK, ROOT, &[&cstr(b"f")], false);
    assert_eq!(r.errno(), libc::ENOENT);
    let (r, polls) = a.call(opcode::UNLINK, ROOT, &[&cstr(b"f")], true);
    assert_eq!((r.errno(), polls), (0, 1));
    // RENAME whose target is there.
    let (r, _) = a.call(opcode::MKDIR, ROOT, &[mkdir.as_slice(), &cstr(b"d")], false);
    assert_eq!(r.errno(), 0);
    let rename = abi::RenameIn { newdir: ROOT };
    let (r, _) = a.call(opcode::RENAME, ROOT, &[rename.as_slice(), &cstr(b"d"), &cstr(b"e")], false);
    assert_eq!(r.errno(), 0);
    let (r, polls) = a.call(opcode::RENAME, ROOT, &[rename.as_slice(), &cstr(b"d"), &cstr(b"e")], true);
    assert_eq!((r.errno(), polls), (0, 2), "RENAME, LOOKUP");
    let s = a.fuse.srv.replay_stats();
    assert_eq!((s.requests, s.answered_as_first), (4, 3), "{s:?}");
}
