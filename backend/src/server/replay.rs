//! Requests executed again after a crash (DESIGN.md, "Crash recovery", "Executing again"):
//! a chain in flight when the serving process died is taken again from the in-flight record
//! and executed a second time. Its first execution may have changed the filesystem before the
//! crash, so the answer a second execution gets is not always the one the guest would have
//! seen. The rules here, the same for every backend, give it that answer where they can:
//!
//! - CREATE, MKNOD, MKDIR, SYMLINK and LINK answered `EEXIST`: the name is looked up in the
//!   parent; if the entry is of the asked type and owned by the caller (LINK: is the link's
//!   target), it is the answer (CREATE opens it too, with its flags minus `O_CREAT`, `O_EXCL`
//!   and `O_TRUNC`); else `EEXIST`.
//! - UNLINK and RMDIR answered `ENOENT`: success.
//! - RENAME answered `ENOENT` while the new name exists in the new directory: success (not
//!   with `RENAME_EXCHANGE`, whose first execution leaves both names).
//! - RELEASE, RELEASEDIR, FLUSH, FSYNC and FSYNCDIR answered `EBADF` or `ESTALE`: success.
//! - WRITE through a file opened `O_APPEND` (the flags the kernel sends with each WRITE): `EIO`
//!   without executing it, the offset the first one wrote at being unknown.
//! - Everything else: executed as it is, its answer stands.
//!
//! [`Rule::of`] decides which rule a request falls under; [`Replay`] walks it from the
//! filesystem's answer to the reply ([`Next`]): at most a LOOKUP and an OPEN more, which the
//! server runs the way it runs any request ([`super::PollerEngine`]: the filesystem's engine or
//! its synchronous methods), so a backend whose every request completes later (NFS) is served
//! alike. What the decisions cannot give back: a looked-up entry's lookup reference and a
//! created file's handle that the first execution made and the guest never saw stay until the
//! session ends (dropping a reference the first execution may not have taken would be worse).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::abi::opcode;
use crate::filesystem::{self, Context, Entry, Error, Reply};
use crate::request::{Op, Request};

/// The `open(2)` flags a CREATE's own open of an existing file leaves out.
const CREATE_ONLY: u32 = (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32;
const S_IFMT: u32 = libc::S_IFMT;
const S_IFREG: u32 = libc::S_IFREG;
const S_IFDIR: u32 = libc::S_IFDIR;
const S_IFLNK: u32 = libc::S_IFLNK;

/// What an existing entry must be for a creation's `EEXIST` to be its first execution's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// A node of type `kind` (`S_IF*`) owned by `uid` (MKNOD, MKDIR, SYMLINK).
    Node {
        /// The file type bits.
        kind: u32,
        /// The caller, who owns what it creates.
        uid: u32,
    },
    /// A regular file owned by `uid`, opened with `flags` (CREATE's, without `O_CREAT`,
    /// `O_EXCL` and `O_TRUNC`) to give CREATE's handle.
    Created {
        /// The caller.
        uid: u32,
        /// The flags to open it with.
        flags: u32,
    },
    /// The inode `ino` (LINK's target).
    Inode(u64),
}

impl Want {
    /// Whether `entry` is what the first execution made.
    fn matches(self, entry: &Entry) -> bool {
        let kind = entry.attr.mode & S_IFMT;
        match self {
            Want::Node { kind: k, uid } => entry.ino != 0 && kind == k && entry.attr.uid == uid,
            Want::Created { uid, .. } => entry.ino != 0 && kind == S_IFREG && entry.attr.uid == uid,
            Want::Inode(ino) => entry.ino != 0 && entry.ino == ino,
        }
    }
}

/// The rule a request executed again falls under (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Executed as it is; its answer stands.
    AsItIs,
    /// Refused with `EIO`, not executed: a WRITE through a file opened `O_APPEND`.
    RefuseAppend,
    /// `ENOENT` answers success: UNLINK, RMDIR.
    GoneIsDone,
    /// `EBADF` or `ESTALE` answers success: RELEASE, RELEASEDIR, FLUSH, FSYNC, FSYNCDIR.
    ClosedIsDone,
    /// `ENOENT` answers success if `newname` exists in `newdir`: RENAME, RENAME2 without
    /// `RENAME_EXCHANGE`.
    Renamed {
        /// The target directory.
        newdir: u64,
        /// The new name (a copy: the request's buffers do not outlive a pending request).
        newname: Box<[u8]>,
    },
    /// `EEXIST` answers the entry `name` in `parent` if it is what `want` says: CREATE,
    /// MKNOD, MKDIR, SYMLINK, LINK.
    Made {
        /// The directory.
        parent: u64,
        /// The new name (a copy).
        name: Box<[u8]>,
        /// What the entry must be.
        want: Want,
    },
}

impl Rule {
    /// The rule of `req`, executed again.
    pub(crate) fn of(req: &Request<'_>) -> Rule {
        let (parent, uid) = (req.nodeid, req.ctx.uid);
        let made = |name: &[u8], want: Want| Rule::Made { parent, name: name.into(), want };
        match &req.op {
            Op::Write { args, .. } if args.flags & libc::O_APPEND as u32 != 0 => Rule::RefuseAppend,
            Op::Create(args) => made(args.name, Want::Created { uid, flags: args.flags & !CREATE_ONLY }),
            Op::Mknod(args) => {
                // A type of 0 is a regular file (`mknod(2)`).
                let kind = match args.mode & S_IFMT {
                    0 => S_IFREG,
                    k => k,
                };
                made(args.name, Want::Node { kind, uid })
            }
            Op::Mkdir { name, .. } => made(name, Want::Node { kind: S_IFDIR, uid }),
            Op::Symlink { name, .. } => made(name, Want::Node { kind: S_IFLNK, uid }),
            Op::Link { oldnodeid, name } => made(name, Want::Inode(*oldnodeid)),
            Op::Unlink { .. } | Op::Rmdir { .. } => Rule::GoneIsDone,
            Op::Rename(args) if args.flags & libc::RENAME_EXCHANGE == 0 => {
                Rule::Renamed { newdir: args.newdir, newname: args.newname.into() }
            }
            Op::Release { .. }
            | Op::Releasedir { .. }
            | Op::Flush { .. }
            | Op::Fsync { .. }
            | Op::Fsyncdir { .. } => Rule::ClosedIsDone,
            _ => Rule::AsItIs,
        }
    }

    /// Whether the request is refused without being executed, and with what.
    pub(crate) fn refusal(&self) -> Option<Error> {
        matches!(self, Rule::RefuseAppend).then_some(Error::Io)
    }

    /// Whether the rule may change the answer (else the request is served as a first one).
    pub(crate) fn matters(&self) -> bool {
        !matches!(self, Rule::AsItIs)
    }
}

/// Where a replayed request's answer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The request itself runs.
    Executing,
    /// The LOOKUP of its name runs.
    LookingUp,
    /// CREATE: the OPEN of the entry found runs.
    Opening(Entry),
}

/// A request executed again, from its own answer to its reply: [`Replay::next`] is handed
/// each answer (the request's, then the LOOKUP's or OPEN's it asked for) and says what comes
/// next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Replay {
    rule: Rule,
    step: Step,
    ctx: Context,
    unique: u64,
}

/// What comes after an answer ([`Replay::next`]).
#[derive(Debug)]
pub(crate) enum Next<'r> {
    /// Reply with `reply`. `forget`: a lookup reference the replay took and does not hand to
    /// the kernel, to drop (`FileSystem::forget`, one). `changed`: the reply is not the
    /// filesystem's answer to the request (counted, [`ReplayStats::answered_as_first`]).
    Answer {
        /// The reply.
        reply: filesystem::Result<Reply>,
        /// A node to drop one lookup reference on.
        forget: Option<u64>,
        /// The reply was changed by the rule.
        changed: bool,
    },
    /// Run this request (a LOOKUP or an OPEN, as the caller) and hand its answer to
    /// [`Replay::next`].
    Run(Request<'r>),
}

impl Replay {
    /// `req`, executed again under `rule` (a rule that [`Rule::matters`]).
    pub(crate) fn new(req: &Request<'_>, rule: Rule) -> Replay {
        Replay { rule, step: Step::Executing, ctx: req.ctx, unique: req.unique }
    }

    /// The caller of the request.
    pub(crate) fn ctx(&self) -> Context {
        self.ctx
    }

    /// What comes after the answer `r` to the step that ran.
    pub(crate) fn next(&mut self, r: filesystem::Result<Reply>) -> Next<'_> {
        let answer = |reply, forget, changed| Next::Answer { reply, forget, changed };
        match (self.step, &self.rule) {
            (Step::Executing, Rule::GoneIsDone) if r == Err(Error::NotFound) => {
                answer(Ok(Reply::Empty), None, true)
            }
            (Step::Executing, Rule::ClosedIsDone) if matches!(r, Err(e) if e == Error::BadHandle || e.errno() == libc::ESTALE) => {
                answer(Ok(Reply::Empty), None, true)
            }
            (Step::Executing, Rule::Renamed { newdir, newname }) if r == Err(Error::NotFound) => {
                self.step = Step::LookingUp;
                Next::Run(self.request(*newdir, Op::Lookup { name: newname }))
            }
            (Step::Executing, Rule::Made { parent, name, .. }) if r == Err(Error::Exists) => {
                self.step = Step::LookingUp;
                Next::Run(self.request(*parent, Op::Lookup { name }))
            }
            (Step::Executing, _) => answer(r, None, false),
            (Step::LookingUp, Rule::Renamed { .. }) => match r {
                // The new name is there: the first execution renamed it.
                Ok(Reply::Entry(e)) if e.ino != 0 => answer(Ok(Reply::Empty), Some(e.ino), true),
                _ => answer(Err(Error::NotFound), None, false),
            },
            (Step::LookingUp, Rule::Made { want, .. }) => match r {
                Ok(Reply::Entry(e)) if want.matches(&e) => match *want {
                    Want::Created { flags, .. } => {
                        self.step = Step::Opening(e);
                        let open = Op::Open { flags, kill_priv: false };
                        Next::Run(self.request(e.ino, open))
                    }
                    Want::Node { .. } | Want::Inode(_) => answer(Ok(Reply::Entry(e)), None, true),
                },
                Ok(Reply::Entry(e)) if e.ino != 0 => answer(Err(Error::Exists), Some(e.ino), false),
                _ => answer(Err(Error::Exists), None, false),
            },
            (Step::Opening(e), _) => match r {
                Ok(Reply::Open(opened)) => answer(Ok(Reply::Created(e, opened)), None, true),
                // The file is there and is the caller's, but cannot be opened again as asked
                // (a mode that let only the creating open write): that open's error.
                Err(err) => answer(Err(err), Some(e.ino), false),
                Ok(_) => answer(Err(Error::Io), Some(e.ino), false),
            },
            // No other rule asks for a LOOKUP.
            (Step::LookingUp, _) => answer(r, None, false),
        }
    }

    /// A LOOKUP or OPEN of the replay's, on `nodeid`, as the caller.
    fn request<'r>(&self, nodeid: u64, op: Op<'r>) -> Request<'r> {
        let opcode = match op {
            Op::Open { .. } => opcode::OPEN,
            _ => opcode::LOOKUP,
        };
        Request { unique: self.unique, nodeid, opcode, ctx: self.ctx, op }
    }
}

/// What the server did with requests executed again after a crash ([`super::Server::replay_stats`]);
/// serialisable, for the daemon's statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplayStats {
    /// Requests executed again (taken again from the in-flight record).
    pub requests: u64,
    /// Of them, answered as their first execution would have been rather than with the
    /// filesystem's answer to the second (an error turned into success, an entry looked up).
    pub answered_as_first: u64,
    /// Of them, refused with `EIO` without being executed (WRITE through an `O_APPEND` file).
    pub refused: u64,
}

/// The server's counters of [`ReplayStats`] (only requests executed again touch them).
#[derive(Debug, Default)]
pub(crate) struct ReplayCounters {
    requests: AtomicU64,
    answered_as_first: AtomicU64,
    refused: AtomicU64,
}

impl ReplayCounters {
    /// One more request executed again.
    pub(crate) fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// One more answered as its first execution would have been.
    pub(crate) fn answered_as_first(&self) {
        self.answered_as_first.fetch_add(1, Ordering::Relaxed);
    }

    /// One more refused.
    pub(crate) fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub(crate) fn snapshot(&self) -> ReplayStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ReplayStats {
            requests: get(&self.requests),
            answered_as_first: get(&self.answered_as_first),
            refused: get(&self.refused),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filesystem::{Opened, Stat};
    use crate::request::{CreateArgs, MknodArgs, RenameArgs, WriteArgs};

    const CTX: Context = Context { uid: 1000, gid: 100, pid: 7, supp_gid: None };

    fn req(nodeid: u64, op: Op<'_>) -> Request<'_> {
        Request { unique: 9, nodeid, opcode: 0, ctx: CTX, op }
    }

    fn entry(ino: u64, mode: u32, uid: u32) -> Entry {
        Entry { ino, attr: Stat { ino, mode, uid, ..Stat::default() }, ..Entry::default() }
    }

    /// The request a step asks to run: (opcode, node, name or open flags).
    fn run(next: Next<'_>) -> (u32, u64, Vec<u8>, u32) {
        match next {
            Next::Run(r) => {
                assert_eq!((r.ctx, r.unique), (CTX, 9), "as the caller");
                match r.op {
                    Op::Lookup { name } => (r.opcode, r.nodeid, name.to_vec(), 0),
                    Op::Open { flags, kill_priv } => {
                        assert!(!kill_priv);
                        (r.opcode, r.nodeid, Vec::new(), flags)
                    }
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        }
    }

    fn answer(next: Next<'_>) -> (filesystem::Result<Reply>, Option<u64>, bool) {
        match next {
            Next::Answer { reply, forget, changed } => (reply, forget, changed),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_operation_has_its_rule() {
        let append = WriteArgs { fh: 1, offset: 0, size: 0, write_flags: 0, flags: libc::O_APPEND as u32 };
        let data = crate::io::Reader::new(&[]);
        assert_eq!(Rule::of(&req(2, Op::Write { args: append, data })), Rule::RefuseAppend);
        let plain = WriteArgs { flags: libc::O_WRONLY as u32, ..append };
        let data = crate::io::Reader::new(&[]);
        assert_eq!(Rule::of(&req(2, Op::Write { args: plain, data })), Rule::AsItIs);
        assert_eq!(Rule::RefuseAppend.refusal(), Some(Error::Io));
        assert_eq!(Rule::of(&req(2, Op::Unlink { name: b"a" })), Rule::GoneIsDone);
        assert_eq!(Rule::of(&req(2, Op::Rmdir { name: b"a" })), Rule::GoneIsDone);
        for op in [
            Op::Release { fh: 1, flags: 0, lock_owner: 0, flock_unlock: false },
            Op::Releasedir { fh: 1, flags: 0 },
            Op::Flush { fh: 1, lock_owner: 0 },
            Op::Fsync { fh: 1, datasync: false },
            Op::Fsyncdir { fh: 1, datasync: true },
        ] {
            assert_eq!(Rule::of(&req(2, op)), Rule::ClosedIsDone);
        }
        let rename = RenameArgs { oldname: b"a", newdir: 5, newname: b"b", flags: 0 };
        assert_eq!(
            Rule::of(&req(2, Op::Rename(rename))),
            Rule::Renamed { newdir: 5, newname: (*b"b").into() }
        );
        let exchange = RenameArgs { flags: libc::RENAME_EXCHANGE, ..rename };
        assert_eq!(Rule::of(&req(2, Op::Rename(exchange))), Rule::AsItIs);
        let create = CreateArgs {
            name: b"f",
            mode: 0o644,
            flags: (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_RDWR | libc::O_APPEND) as u32,
            umask: 0,
            kill_priv: true,
        };
        let want = Want::Created { uid: 1000, flags: (libc::O_RDWR | libc::O_APPEND) as u32 };
        assert_eq!(
            Rule::of(&req(2, Op::Create(create))),
            Rule::Made { parent: 2, name: (*b"f").into(), want }
        );
        let mknod = MknodArgs { name: b"n", mode: 0o600, rdev: 0, umask: 0 };
        let node = |kind| Want::Node { kind, uid: 1000 };
        let made = |name: &[u8], want| Rule::Made { parent: 2, name: name.into(), want };
        assert_eq!(Rule::of(&req(2, Op::Mknod(mknod))), made(b"n", node(S_IFREG)), "type 0: a file");
        let fifo = MknodArgs { mode: libc::S_IFIFO | 0o600, ..mknod };
        assert_eq!(Rule::of(&req(2, Op::Mknod(fifo))), made(b"n", node(libc::S_IFIFO)));
        assert_eq!(
            Rule::of(&req(2, Op::Mkdir { name: b"d", mode: 0o755, umask: 0 })),
            made(b"d", node(S_IFDIR))
        );
        assert_eq!(Rule::of(&req(2, Op::Symlink { name: b"l", target: b"t" })), made(b"l", node(S_IFLNK)));
        assert_eq!(Rule::of(&req(2, Op::Link { oldnodeid: 8, name: b"h" })), made(b"h", Want::Inode(8)));
        for op in
            [Op::Lookup { name: b"a" }, Op::Getattr { fh: None }, Op::Open { flags: 0, kill_priv: false }]
        {
            let rule = Rule::of(&req(2, op));
            assert!(rule == Rule::AsItIs && !rule.matters() && rule.refusal().is_none());
        }
    }

    /// CREATE: `EEXIST`, a LOOKUP, an OPEN with the flags that neither create nor truncate,
    /// and the entry with the new handle; a file that is not the caller's, or not a file, stays
    /// `EEXIST` and its lookup reference is dropped.
    #[test]
    fn create_goes_exists_lookup_open_created() {
        let flags = (libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY) as u32;
        let args = CreateArgs { name: b"f", mode: 0o644, flags, umask: 0, kill_priv: false };
        let r = req(3, Op::Create(args));
        let mut p = Replay::new(&r, Rule::of(&r));
        assert_eq!(run(p.next(Err(Error::Exists))), (opcode::LOOKUP, 3, b"f".to_vec(), 0));
        let e = entry(40, S_IFREG | 0o644, 1000);
        assert_eq!(run(p.next(Ok(Reply::Entry(e)))), (opcode::OPEN, 40, Vec::new(), libc::O_WRONLY as u32));
        let opened = Opened { fh: 77, open_flags: 0 };
        assert_eq!(answer(p.next(Ok(Reply::Open(opened)))), (Ok(Reply::Created(e, opened)), None, true));
        // The OPEN fails: its error, and the reference the LOOKUP took goes.
        let mut p = Replay::new(&r, Rule::of(&r));
        let _ = run(p.next(Err(Error::Exists)));
        let _ = run(p.next(Ok(Reply::Entry(e))));
        assert_eq!(answer(p.next(Err(Error::AccessDenied))), (Err(Error::AccessDenied), Some(40), false));
        // Not the caller's; not a file; not found (gone meanwhile).
        for found in [Ok(Reply::Entry(entry(41, S_IFREG, 0))), Ok(Reply::Entry(entry(42, S_IFDIR, 1000)))] {
            let mut p = Replay::new(&r, Rule::of(&r));
            let _ = run(p.next(Err(Error::Exists)));
            let ino = match found {
                Ok(Reply::Entry(e)) => e.ino,
                _ => 0,
            };
            assert_eq!(answer(p.next(found)), (Err(Error::Exists), Some(ino), false));
        }
        let mut p = Replay::new(&r, Rule::of(&r));
        let _ = run(p.next(Err(Error::Exists)));
        assert_eq!(answer(p.next(Err(Error::NotFound))), (Err(Error::Exists), None, false));
        // Success, or another error, stands.
        let created = Ok(Reply::Created(e, opened));
        assert_eq!(answer(Replay::new(&r, Rule::of(&r)).next(created)), (created, None, false));
        let nospace = Err(Error::NoSpace);
        assert_eq!(answer(Replay::new(&r, Rule::of(&r)).next(nospace)), (nospace, None, false));
    }

    /// MKDIR and LINK: the entry found is the answer if it is what they make.
    #[test]
    fn mkdir_and_link_answer_the_entry_found() {
        let r = req(3, Op::Mkdir { name: b"d", mode: 0o755, umask: 0 });
        let mut p = Replay::new(&r, Rule::of(&r));
        assert_eq!(run(p.next(Err(Error::Exists))), (opcode::LOOKUP, 3, b"d".to_vec(), 0));
        let d = entry(50, S_IFDIR | 0o755, 1000);
        assert_eq!(answer(p.next(Ok(Reply::Entry(d)))), (Ok(Reply::Entry(d)), None, true));
        let r = req(3, Op::Link { oldnodeid: 60, name: b"h" });
        let mut p = Replay::new(&r, Rule::of(&r));
        let _ = run(p.next(Err(Error::Exists)));
        let h = entry(60, S_IFREG, 0);
        assert_eq!(answer(p.next(Ok(Reply::Entry(h)))), (Ok(Reply::Entry(h)), None, true), "any owner");
        let mut p = Replay::new(&r, Rule::of(&r));
        let _ = run(p.next(Err(Error::Exists)));
        let other = entry(61, S_IFREG, 1000);
        assert_eq!(answer(p.next(Ok(Reply::Entry(other)))), (Err(Error::Exists), Some(61), false));
    }

    /// UNLINK, RMDIR: `ENOENT` is success; RELEASE and the like: `EBADF` and `ESTALE` are;
    /// other errors stand.
    #[test]
    fn gone_and_closed_are_done() {
        let r = req(3, Op::Unlink { name: b"a" });
        let next = |e| answer(Replay::new(&r, Rule::of(&r)).next(Err(e)));
        assert_eq!(next(Error::NotFound), (Ok(Reply::Empty), None, true));
        assert_eq!(next(Error::AccessDenied), (Err(Error::AccessDenied), None, false));
        let r = req(3, Op::Flush { fh: 4, lock_owner: 0 });
        let next = |e| answer(Replay::new(&r, Rule::of(&r)).next(Err(e)));
        assert_eq!(next(Error::BadHandle), (Ok(Reply::Empty), None, true));
        assert_eq!(next(Error::from_errno(libc::ESTALE)), (Ok(Reply::Empty), None, true));
        assert_eq!(next(Error::Io), (Err(Error::Io), None, false));
    }

    /// RENAME: `ENOENT` and the target there is success (the target's reference dropped);
    /// without the target, `ENOENT`.
    #[test]
    fn rename_is_done_when_the_target_is_there() {
        let args = RenameArgs { oldname: b"a", newdir: 5, newname: b"b", flags: 0 };
        let r = req(3, Op::Rename(args));
        let mut p = Replay::new(&r, Rule::of(&r));
        assert_eq!(run(p.next(Err(Error::NotFound))), (opcode::LOOKUP, 5, b"b".to_vec(), 0));
        assert_eq!(
            answer(p.next(Ok(Reply::Entry(entry(70, S_IFREG, 0))))),
            (Ok(Reply::Empty), Some(70), true)
        );
        let mut p = Replay::new(&r, Rule::of(&r));
        let _ = run(p.next(Err(Error::NotFound)));
        assert_eq!(answer(p.next(Err(Error::NotFound))), (Err(Error::NotFound), None, false));
        let mut p = Replay::new(&r, Rule::of(&r));
        assert_eq!(answer(p.next(Err(Error::NotEmpty))), (Err(Error::NotEmpty), None, false));
    }
}
