//! A pending request's slot on the NFSv4.1 engine: which FUSE operation it serves ([`Kind`]),
//! which COMPOUND it sends next ([`Step`]), what it holds between COMPOUNDs (handles, names,
//! what to set, the open stateid, where a READ or WRITE is), and [`Slot::with_ops`], which makes
//! the COMPOUND's operations from the slot whenever the session asks (the first send, and every
//! send again after a new session or a DELAY): nothing of a request is kept in encoded form.
//!
//! The leaf of the engine: every other part uses it, and it uses none of them.

use std::time::Instant;

use crate::filesystem::seam::Token;
use crate::filesystem::{self, Error, FileLock, LockType, Reply};
use crate::nfs::conn::Cred;
use crate::nfs::locks41::{Attempt, Owner};
use crate::nfs::shared::Limits;
use crate::nfs::unstable::EntryId;
use crate::nfs::wire::nfs4::{
    attr, share, Bitmap, ChannelAttrs, CreateHow4, CreateKind, DelegationType, Ftype4, LockType as NfsLock,
    Locker, Op, Open, OpenClaim, SetAttrs, Stable4, StateOwner, Stateid, Verifier,
};
use crate::nfs::wire::Fh;
use crate::types::OFFSET_MAX;

/// Longest name component sent (Linux's NAME_MAX).
pub(super) const NAME_MAX: usize = 255;

/// The attributes a FUSE `stat` needs.
pub(super) const STAT: Bitmap = Bitmap::of(&[
    attr::TYPE,
    attr::SIZE,
    attr::FILEID,
    attr::MODE,
    attr::NUMLINKS,
    attr::OWNER,
    attr::OWNER_GROUP,
    attr::RAWDEV,
    attr::SPACE_USED,
    attr::TIME_ACCESS,
    attr::TIME_METADATA,
    attr::TIME_MODIFY,
]);
/// READDIRPLUS's attributes of each entry: a `stat`, the handle, and why they are missing.
pub(super) const STAT_FH: Bitmap = Bitmap::of(&[
    attr::TYPE,
    attr::SIZE,
    attr::RDATTR_ERROR,
    attr::FILEHANDLE,
    attr::FILEID,
    attr::MODE,
    attr::NUMLINKS,
    attr::OWNER,
    attr::OWNER_GROUP,
    attr::RAWDEV,
    attr::SPACE_USED,
    attr::TIME_ACCESS,
    attr::TIME_METADATA,
    attr::TIME_MODIFY,
]);
/// READDIR's attributes of each entry: the type and the fileid.
pub(super) const TYPE_ID: Bitmap = Bitmap::of(&[attr::TYPE, attr::RDATTR_ERROR, attr::FILEID]);
/// STATFS.
pub(super) const STATFS: Bitmap = Bitmap::of(&[
    attr::FILES_AVAIL,
    attr::FILES_FREE,
    attr::FILES_TOTAL,
    attr::MAXNAME,
    attr::SPACE_AVAIL,
    attr::SPACE_FREE,
    attr::SPACE_TOTAL,
]);
/// The type alone (the check before a REMOVE).
pub(super) const TYPE: Bitmap = Bitmap::of(&[attr::TYPE]);
/// A directory's fileid (`.` and `..` of a listing).
pub(super) const FILEID: Bitmap = Bitmap::of(&[attr::FILEID]);

/// A reply's bytes besides READ's data or READDIR's entries, at most (RPC header, COMPOUND
/// header, SEQUENCE's result, PUTFH's, a GETATTR of the fileid, READ's or READDIR's header),
/// with room to spare.
const REPLY_OVERHEAD: u32 = 1024;
/// A call's bytes besides WRITE's data, at most (RPC header with an AUTH_SYS credential of 16
/// groups and a 255-byte machine name, COMPOUND header, SEQUENCE, PUTFH of a 128-byte handle,
/// WRITE's arguments), with room to spare.
const REQUEST_OVERHEAD: u32 = 2048;

/// The largest counts one call of a session carries: the start-up's transfer sizes within the
/// fore channel the server granted at CREATE_SESSION (less a COMPOUND's own bytes), which may
/// be smaller than asked: a READ past `maxresponsesize` fails REP_TOO_BIG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Caps {
    /// READ's count.
    pub(super) read: u32,
    /// WRITE's count.
    pub(super) write: u32,
    /// READDIR's `maxcount`.
    pub(super) dir: u32,
}

impl Caps {
    /// The caps of `limits` within `fore` (`None`: no session yet, the limits alone).
    pub(super) fn new(limits: &Limits, fore: Option<&ChannelAttrs>) -> Caps {
        let fit = |limit: u32, channel: Option<u32>, overhead: u32| {
            let Some(channel) = channel else { return limit };
            let room = channel.saturating_sub(overhead);
            // Whole pages when there is room for one; never below 512 bytes (a server granting
            // less fails its calls, as it asked).
            let room = if room >= 4096 { room & !4095 } else { room.max(512) };
            limit.min(room)
        };
        let reply = fore.map(|f| f.maxresponsesize);
        let request = fore.map(|f| f.maxrequestsize);
        Caps {
            read: fit(limits.read, reply, REPLY_OVERHEAD),
            write: fit(limits.write, request, REQUEST_OVERHEAD),
            dir: fit(limits.read.max(limits.write), reply, REPLY_OVERHEAD),
        }
    }
}

/// Which FUSE operation a slot serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Lookup,
    Getattr,
    Setattr,
    Access,
    Readlink,
    Statfs,
    Open,
    Create,
    /// MKNOD of a regular file: OPEN(create) and CLOSE.
    MknodReg,
    /// MKNOD of another type, MKDIR, SYMLINK: CREATE.
    Make,
    Link,
    Unlink,
    Rmdir,
    Rename,
    Read,
    Write,
    Readdir,
    Readdirplus,
    Release,
    /// GETLK: LOCKT.
    Getlk,
    /// SETLK, or an unlocking SETLKW: LOCK or LOCKU.
    Setlk,
    /// FLUSH of a lock owner with lock state on the file: its locks go.
    Flush,
    /// A waiting lock's try (background, no guest request): LOCK with a blocking type.
    Try,
    /// A lock granted to a wait that ended meanwhile (background): LOCKU.
    LetGo,
    /// A lock state of an ended session (background): LOCKU and FREE_STATEID.
    Orphan,
    /// An open of an ended session (background): CLOSE.
    OrphanOpen,
    /// A reclaim after a server restart (background, `reclaim`): an open, a lock state's
    /// ranges, RECLAIM_COMPLETE.
    Reclaim,
    /// A silly name of an ended session (background): REMOVE.
    OrphanSilly,
    /// FLUSH or FSYNC of a file with stored UNSTABLE writes: COMMIT (and the lock states a
    /// FLUSH lets go, after it).
    Commit,
    /// A COMMIT the engine sends on its own, the store past its high-water mark (background).
    BgCommit,
}

/// The next COMPOUND of a slot (after the session's SEQUENCE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// PUTFH(`fh`) LOOKUP(`a`) GETFH GETATTR.
    Lookup,
    /// PUTFH(`obj`) GETATTR.
    Getattr,
    /// PUTFH(`obj`) SETATTR(`stateid`, `sattr`) GETATTR.
    Setattr,
    /// PUTFH(`fh`) ACCESS(`mask`).
    Access,
    /// PUTFH(`fh`) READLINK.
    Readlink,
    /// PUTFH(`fh`) GETATTR(the STATFS attributes).
    Statfs,
    /// PUTFH(`fh`) OPEN(CLAIM_FH) [SETATTR(size 0) for `O_TRUNC`].
    OpenFh,
    /// PUTFH(`fh`) OPEN(create `a`) GETFH [SETATTR(`sattr2`)] GETATTR [CLOSE for MKNOD].
    OpenCreate,
    /// The rest of an OPEN's COMPOUND answered DELAY or GRACE after the OPEN ran (`opened`):
    /// PUTFH(`obj`) (or PUTFH(`fh`) LOOKUP(`a`) GETFH without it) [SETATTR(`stateid`, `sattr2`)]
    /// [GETATTR: CREATE, MKNOD] [CLOSE: MKNOD].
    OpenRest,
    /// PUTFH(`fh`) CREATE(`make`, `a`, `sattr`) GETFH GETATTR.
    Create,
    /// PUTFH(`fh2`: the file) SAVEFH PUTFH(`fh`: the directory) LINK(`a`) RESTOREFH GETATTR.
    Link,
    /// PUTFH(`fh`) LOOKUP(`a`) GETFH GETATTR(type): what an UNLINK or RMDIR removes.
    Probe,
    /// PUTFH(`fh`) REMOVE(`a`).
    Remove,
    /// PUTFH(`fh2`) LOOKUP(`b`): RENAME_NOREPLACE's check.
    ProbeTarget,
    /// PUTFH(`fh`) SAVEFH PUTFH(`fh2`) RENAME(`a`, `b`).
    Rename,
    /// PUTFH(`fh`) READ(`stateid`): the last operation, its data placed in the reply buffers.
    Read,
    /// PUTFH(`fh`) WRITE(`stateid`, `stable`), the data from the request's payload (stored
    /// first when UNSTABLE4: `commit`).
    Write,
    /// PUTFH(`fh`) GETATTR(fileid) READDIR(`cookie`, `cookieverf`).
    Readdir,
    /// PUTFH(`obj`) CLOSE(`stateid`); a silly name's REMOVE goes after it as a COMPOUND of its
    /// own (`Remove`), whatever the CLOSE came to.
    Close,
    /// PUTFH(`obj`) DELEGRETURN(`deleg`).
    Delegreturn,
    /// PUTFH(`obj`) LOCKT(`lock`, `lock_name`).
    Lockt,
    /// PUTFH(`obj`) LOCK(`lock`; by `lock_state`, or from the open `stateid` as `lock_name`'s
    /// first lock on the file).
    Lock,
    /// PUTFH(`obj`) LOCKU(`lock`'s range, `lock_state`).
    Locku,
    /// PUTFH(`obj`) LOCKU(the whole file) FREE_STATEID: the last of `frees`.
    Free,
    /// PUTFH(`fh`) OPEN(CLAIM_FH, the share of `flags`, a new `owner`): a handle's open the
    /// server no longer knows opened again, then `resume` goes again (`reopen`).
    Reopen,
    /// PUTFH(`fh`) OPEN(CLAIM_PREVIOUS, no delegation, the share of `flags`, a new `owner`): a
    /// handle's open reclaimed after a server restart (`reclaim`).
    ReclaimOpen,
    /// RECLAIM_COMPLETE: the reclaim is over (`reclaim`).
    ReclaimComplete,
    /// PUTFH(`obj`) COMMIT of the whole file: its stored UNSTABLE writes (`commit`), then
    /// `Resend` if the server's write verifier changed, then `then`.
    Commit,
    /// PUTFH(`obj`) WRITE(the anonymous stateid, `replay_at`, FILE_SYNC4, `replay_len` bytes of
    /// the engine's replay buffer): a stored write the server lost, sent again (`commit`).
    Resend,
}

impl Slot {
    /// Keeps a READ's, WRITE's or READDIR's counts within `caps` (before each send: the
    /// session's grant is known once it is established).
    pub(super) fn clamp(&mut self, caps: Caps) {
        let cap = match self.step {
            Step::Read => caps.read,
            Step::Write => caps.write,
            Step::Readdir => caps.dir,
            _ => return,
        };
        self.max = cap;
        self.chunk = self.chunk.min(cap);
    }

    /// A RELEASE's step once its lock states are let go: CLOSE of its open, or the REMOVE of its
    /// silly name; `None`: nothing left to send.
    pub(super) fn release_step(&self) -> Option<Step> {
        if self.stateid != Stateid::ANONYMOUS {
            Some(Step::Close)
        } else if self.silly {
            Some(Step::Remove)
        } else {
            None
        }
    }
}

impl Step {
    /// A step of the lock operations (answered by `lock`).
    pub(super) fn is_lock(self) -> bool {
        matches!(self, Step::Lockt | Step::Lock | Step::Locku | Step::Free)
    }
}

/// What CREATE makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Make {
    Dir,
    Symlink,
    Dev(Ftype4, u32, u32),
    Sock,
    Fifo,
}

/// Room for the names of one request.
pub(super) struct Names {
    bytes: [u8; 2 * NAME_MAX],
    a: usize,
    b: usize,
}

impl Names {
    pub(super) fn a(&self) -> &[u8] {
        &self.bytes[..self.a]
    }

    pub(super) fn b(&self) -> &[u8] {
        &self.bytes[NAME_MAX..NAME_MAX + self.b]
    }

    pub(super) fn set(&mut self, a: &[u8], b: &[u8]) -> Result<(), Error> {
        if a.len() > NAME_MAX || b.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        self.bytes[..a.len()].copy_from_slice(a);
        self.bytes[NAME_MAX..NAME_MAX + b.len()].copy_from_slice(b);
        self.a = a.len();
        self.b = b.len();
        Ok(())
    }

    /// Keeps `a`, sets `b`.
    pub(super) fn set_b(&mut self, b: &[u8]) -> Result<(), Error> {
        if b.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        self.bytes[NAME_MAX..NAME_MAX + b.len()].copy_from_slice(b);
        self.b = b.len();
        Ok(())
    }
}

/// One pending request (see the module documentation).
pub(super) struct Slot {
    pub(super) busy: bool,
    pub(super) token: Token,
    pub(super) cred: Cred,
    pub(super) nodeid: u64,
    pub(super) kind: Kind,
    pub(super) step: Step,
    pub(super) deadline: Instant,
    /// The node's handle (the directory of name operations, the file of I/O).
    pub(super) fh: Fh,
    /// The second handle: RENAME's target directory, LINK's file.
    pub(super) fh2: Fh,
    /// The object a step works on (GETATTR, SETATTR, CLOSE, DELEGRETURN).
    pub(super) obj: Fh,
    pub(super) names: Names,
    /// A symlink's target (capacity kept).
    pub(super) long: Vec<u8>,
    /// What SETATTR, CREATE or OPEN(create) sets.
    pub(super) sattr: SetAttrs,
    /// What the SETATTR after an OPEN sets (`O_TRUNC`; the times after an exclusive create).
    pub(super) sattr2: Option<SetAttrs>,
    /// The open stateid used (READ, WRITE, SETATTR of the size, CLOSE).
    pub(super) stateid: Stateid,
    /// A delegation to return.
    pub(super) deleg: Stateid,
    /// An OPEN that ran (its stateid, result flags and delegation) while the rest of its
    /// COMPOUND did not.
    pub(super) opened: Option<(Stateid, u32, Option<Stateid>)>,
    /// `obj` is the file's handle (an OPEN's rest).
    pub(super) have_obj: bool,
    /// The open owner of an OPEN: a number unique for the client's life.
    pub(super) owner: [u8; 8],
    pub(super) exclusive: Option<Verifier>,
    pub(super) make: Make,
    /// `open(2)` flags.
    pub(super) flags: u32,
    pub(super) offset: u64,
    pub(super) size: u32,
    pub(super) done: u32,
    /// The count of the READ or WRITE on the wire; READDIR's `maxcount`.
    pub(super) chunk: u32,
    /// The largest `chunk` of this request's calls ([`Caps`]).
    pub(super) max: u32,
    /// ACCESS4 bits asked.
    pub(super) mask: u32,
    /// The FUSE ACCESS mask asked.
    pub(super) mask_req: u32,
    /// The FUSE handle (READDIR, RELEASE), or the node an UNLINK renames to its silly name.
    pub(super) handle: u64,
    /// READDIR: the server's cookie to list from, its verifier, and how many of `.` and `..`
    /// go first.
    pub(super) cookie: u64,
    pub(super) cookieverf: Verifier,
    pub(super) dots: u8,
    /// RELEASE of a file unlinked while open: its silly name (`a` in the directory `fh`) goes
    /// after the CLOSE.
    pub(super) silly: bool,
    /// The answer, once a last step (a DELEGRETURN, the CLOSE of an open that could not be
    /// kept) is done.
    pub(super) answer: Option<filesystem::Result<Reply>>,
    /// A lock's range and type (GETLK, SETLK, a try).
    pub(super) lock: FileLock,
    /// Its owner, and the owner's name on the server.
    pub(super) lock_owner: Owner,
    pub(super) lock_name: [u8; 9],
    /// The owner's lock stateid on the file (`None`: its first lock there, from the open).
    pub(super) lock_state: Option<Stateid>,
    /// A flock owner changes its lock's type: its LOCKU goes first (`Step::Locku`), then the
    /// LOCK, as flock(2) converts a lock.
    pub(super) convert: bool,
    /// Lock states to let go before the answer (FLUSH, RELEASE), the last first.
    pub(super) frees: Vec<Stateid>,
    /// The try a background slot sends.
    pub(super) attempt: Option<Attempt>,
    /// The orphan a background slot ends, with its tries before this one, until its call ends.
    pub(super) orphan: Option<(crate::nfs::locks41::Orphan, u8)>,
    /// The handle's open was opened again for this request (once: a second loss is EIO).
    pub(super) reopened: bool,
    /// The step a re-open goes back to.
    pub(super) resume: Step,
    /// The WRITE chunk on the wire, stored in the UNSTABLE replay store (`commit`).
    pub(super) unstable: Option<EntryId>,
    /// How the WRITE goes: UNSTABLE4 when stored, else FILE_SYNC4.
    pub(super) stable: Stable4,
    /// The store's answer count when the COMMIT went (what it covers).
    pub(super) horizon: u64,
    /// The step after a COMMIT and its resends (a WRITE that found the store full, a
    /// truncating SETATTR, a FLUSH's or RELEASE's lock states and CLOSE).
    pub(super) then: Option<Step>,
    /// A WRITE that found the store full waits for room until then at most.
    pub(super) room_until: Option<Instant>,
    /// The stored write sent again (`Step::Resend`), at `replay_at`, `replay_len` bytes.
    pub(super) replay: Option<EntryId>,
    pub(super) replay_at: u64,
    pub(super) replay_len: u32,
    /// The client id epoch of the reclaim whose call a background slot carries (`reclaim`).
    pub(super) reclaim_of: u64,
    /// The sender number this request holds the file's turn at resending by, while it does.
    pub(super) resending: Option<u64>,
    /// Stored writes go again with the request's handle's open (as it is when each is sent),
    /// after the anonymous stateid was refused (ACCESS or PERM: a file made read-only after it
    /// was opened for writing).
    pub(super) resend_open: bool,
}

impl Slot {
    pub(super) fn new(root: Fh) -> Self {
        Slot {
            busy: false,
            token: Token(0),
            cred: Cred::ROOT,
            nodeid: 0,
            kind: Kind::Getattr,
            step: Step::Getattr,
            deadline: Instant::now(),
            fh: root,
            fh2: root,
            obj: root,
            names: Names { bytes: [0; 2 * NAME_MAX], a: 0, b: 0 },
            long: Vec::new(),
            sattr: SetAttrs::NONE,
            sattr2: None,
            stateid: Stateid::ANONYMOUS,
            deleg: Stateid::ANONYMOUS,
            opened: None,
            have_obj: false,
            owner: [0; 8],
            exclusive: None,
            make: Make::Dir,
            flags: 0,
            offset: 0,
            size: 0,
            done: 0,
            chunk: 0,
            max: 0,
            mask: 0,
            mask_req: 0,
            handle: 0,
            cookie: 0,
            cookieverf: [0; 8],
            dots: 0,
            silly: false,
            answer: None,
            lock: FileLock { start: 0, end: 0, typ: LockType::Unlock, pid: 0 },
            lock_owner: Owner::Posix(0),
            lock_name: [0; 9],
            lock_state: None,
            convert: false,
            frees: Vec::new(),
            attempt: None,
            orphan: None,
            reopened: false,
            resume: Step::Getattr,
            unstable: None,
            stable: Stable4::FileSync,
            horizon: 0,
            then: None,
            room_until: None,
            replay: None,
            replay_at: 0,
            replay_len: 0,
            reclaim_of: 0,
            resending: None,
            resend_open: false,
        }
    }

    /// The slot's lock type on the wire (the blocking types for a try, which tell the server
    /// the client waits).
    fn locktype(&self) -> NfsLock {
        match (self.lock.typ, self.kind == Kind::Try) {
            (LockType::Read, false) => NfsLock::Read,
            (LockType::Read, true) => NfsLock::ReadW,
            (_, false) => NfsLock::Write,
            (_, true) => NfsLock::WriteW,
        }
    }

    /// The slot's lock range as NFSv4's offset and length (u64::MAX: to the end of the file,
    /// FUSE's `OFFSET_MAX` end).
    pub(super) fn range(&self) -> (u64, u64) {
        let l = &self.lock;
        let length = if l.end >= OFFSET_MAX { u64::MAX } else { l.end - l.start + 1 };
        (l.start, length)
    }

    /// The share access an open with the slot's `flags` asks (`O_TRUNC` writes), and no
    /// delegation.
    fn share_access(&self) -> u32 {
        let a = match self.flags & libc::O_ACCMODE as u32 {
            x if x == libc::O_WRONLY as u32 => share::ACCESS_WRITE,
            x if x == libc::O_RDWR as u32 => share::ACCESS_BOTH,
            _ => share::ACCESS_READ,
        };
        let a = if self.flags & libc::O_TRUNC as u32 != 0 { a | share::ACCESS_WRITE } else { a };
        a | share::WANT_NO_DELEG
    }

    /// Gives `send` the operations of the slot's next COMPOUND (without SEQUENCE); `clientid`:
    /// the session's, for the open owner.
    pub(super) fn with_ops(&self, clientid: u64, send: &mut dyn FnMut(&[Op<'_>])) {
        let mut ops = [Op::Getfh; 8];
        let mut n = 0;
        let mut push = |op| {
            ops[n] = op;
            n += 1;
        };
        let a = self.names.a();
        match self.step {
            Step::Lookup => {
                push(Op::Putfh { fh: &self.fh });
                push(Op::Lookup { name: a });
                push(Op::Getfh);
                push(Op::Getattr { attrs: STAT });
            }
            Step::Getattr => {
                push(Op::Putfh { fh: &self.obj });
                push(Op::Getattr { attrs: STAT });
            }
            Step::Setattr => {
                push(Op::Putfh { fh: &self.obj });
                push(Op::Setattr { stateid: self.stateid, attrs: &self.sattr });
                push(Op::Getattr { attrs: STAT });
            }
            Step::Access => {
                push(Op::Putfh { fh: &self.fh });
                push(Op::Access { mask: self.mask });
            }
            Step::Readlink => {
                push(Op::Putfh { fh: &self.fh });
                push(Op::Readlink);
            }
            Step::Statfs => {
                push(Op::Putfh { fh: &self.fh });
                push(Op::Getattr { attrs: STATFS });
            }
            Step::OpenFh | Step::OpenCreate | Step::Reopen => {
                let create = if self.step != Step::OpenCreate {
                    None
                } else if let Some(verf) = self.exclusive {
                    Some(CreateHow4::Exclusive41 { verf, attrs: &self.sattr })
                } else if self.kind == Kind::MknodReg {
                    Some(CreateHow4::Guarded(&self.sattr))
                } else {
                    Some(CreateHow4::Unchecked(&self.sattr))
                };
                let claim = if self.step == Step::OpenCreate { OpenClaim::Null(a) } else { OpenClaim::Fh };
                push(Op::Putfh { fh: &self.fh });
                push(Op::Open(Open {
                    share_access: self.share_access(),
                    share_deny: share::DENY_NONE,
                    owner: StateOwner { clientid, owner: &self.owner },
                    create,
                    claim,
                }));
                if self.step == Step::OpenCreate {
                    push(Op::Getfh);
                }
                if let Some(s) = self.sattr2.as_ref().filter(|_| self.step != Step::Reopen) {
                    push(Op::Setattr { stateid: Stateid::CURRENT, attrs: s });
                }
                if self.step == Step::OpenCreate {
                    push(Op::Getattr { attrs: STAT });
                }
                if self.kind == Kind::MknodReg && self.step != Step::Reopen {
                    push(Op::Close { stateid: Stateid::CURRENT });
                }
            }
            Step::OpenRest => {
                let stateid = self.opened.map_or(Stateid::ANONYMOUS, |o| o.0);
                if self.have_obj {
                    push(Op::Putfh { fh: &self.obj });
                } else {
                    push(Op::Putfh { fh: &self.fh });
                    push(Op::Lookup { name: a });
                    push(Op::Getfh);
                }
                if let Some(s) = &self.sattr2 {
                    push(Op::Setattr { stateid, attrs: s });
                }
                if self.kind != Kind::Open {
                    push(Op::Getattr { attrs: STAT });
                }
                if self.kind == Kind::MknodReg {
                    push(Op::Close { stateid });
                }
            }
            Step::Create => {
                let kind = match self.make {
                    Make::Dir => CreateKind::Dir,
                    Make::Symlink => CreateKind::Link(&self.long),
                    Make::Dev(Ftype4::Blk, ma, mi) => CreateKind::Blk(ma, mi),
                    Make::Dev(_, ma, mi) => CreateKind::Chr(ma, mi),
                    Make::Sock => CreateKind::Sock,
                    Make::Fifo => CreateKind::Fifo,
                };
                push(Op::Putfh { fh: &self.fh });
                push(Op::Create { kind, name: a, attrs: &self.sattr });
                push(Op::Getfh);
                push(Op::Getattr { attrs: STAT });
            }
            Step::Link => {
                // LINK: the saved handle is the file, the current one the directory
                // (RFC 8881 18.9.3); RESTOREFH makes the file current for its attributes.
                push(Op::Putfh { fh: &self.fh2 });
                push(Op::Savefh);
                push(Op::Putfh { fh: &self.fh });
                push(Op::Link { name: a });
                push(Op::Restorefh);
                push(Op::Getattr { attrs: STAT });
            }
            Step::Probe => {
                push(Op::Putfh { fh: &self.fh });
                push(Op::Lookup { name: a });
                push(Op::Getfh);
                push(Op::Getattr { attrs: TYPE });
            }
            Step::Remove => {
                push(Op::Putfh { fh: &self.fh });
                push(Op::Remove { name: a });
            }
            Step::ProbeTarget => {
                push(Op::Putfh { fh: &self.fh2 });
                push(Op::Lookup { name: self.names.b() });
            }
            Step::Rename => {
                // RENAME: the saved handle is the source directory, the current one the
                // target's (RFC 8881 18.26.3).
                push(Op::Putfh { fh: &self.fh });
                push(Op::Savefh);
                push(Op::Putfh { fh: &self.fh2 });
                push(Op::Rename { old: a, new: self.names.b() });
            }
            Step::Read => {
                push(Op::Putfh { fh: &self.fh });
                push(Op::Read {
                    stateid: self.stateid,
                    offset: self.offset + u64::from(self.done),
                    count: self.chunk,
                });
            }
            Step::Write => {
                push(Op::Putfh { fh: &self.fh });
                push(Op::Write {
                    stateid: self.stateid,
                    offset: self.offset + u64::from(self.done),
                    stable: self.stable,
                    count: self.chunk,
                });
            }
            Step::Commit => {
                push(Op::Putfh { fh: &self.obj });
                push(Op::Commit { offset: 0, count: 0 });
            }
            Step::Resend => {
                // The anonymous stateid (`stateid`, set so when the resend is filled): the
                // file's opens may be unknown to a restarted server, or none left.
                push(Op::Putfh { fh: &self.obj });
                push(Op::Write {
                    stateid: self.stateid,
                    offset: self.replay_at,
                    stable: Stable4::FileSync,
                    count: self.replay_len,
                });
            }
            Step::Readdir => {
                let attrs = if self.kind == Kind::Readdirplus { STAT_FH } else { TYPE_ID };
                push(Op::Putfh { fh: &self.fh });
                push(Op::Getattr { attrs: FILEID });
                push(Op::Readdir {
                    cookie: self.cookie,
                    verf: self.cookieverf,
                    dircount: self.size,
                    maxcount: self.chunk,
                    attrs,
                });
            }
            Step::Close => {
                push(Op::Putfh { fh: &self.obj });
                push(Op::Close { stateid: self.stateid });
            }
            Step::Delegreturn => {
                push(Op::Putfh { fh: &self.obj });
                push(Op::Delegreturn { stateid: self.deleg });
            }
            Step::Lockt => {
                let (offset, length) = self.range();
                push(Op::Putfh { fh: &self.obj });
                push(Op::Lockt {
                    locktype: self.locktype(),
                    offset,
                    length,
                    owner: StateOwner { clientid, owner: &self.lock_name },
                });
            }
            Step::Lock => {
                let (offset, length) = self.range();
                // Lock owners' seqids are 0 in NFSv4.1 (the session orders calls: RFC 8881
                // 18.10.3), and the lock stateid goes with seqid 0, "the current one" (8.2.2):
                // two pollers' calls of one owner may reach the server in either order.
                let locker = match self.lock_state {
                    Some(s) => Locker::Existing { lock_stateid: current(s) },
                    None => Locker::New {
                        open_stateid: self.stateid,
                        owner: StateOwner { clientid, owner: &self.lock_name },
                    },
                };
                push(Op::Putfh { fh: &self.obj });
                let reclaim = self.kind == Kind::Reclaim;
                push(Op::Lock { locktype: self.locktype(), reclaim, offset, length, locker });
            }
            Step::ReclaimOpen => {
                push(Op::Putfh { fh: &self.fh });
                push(Op::Open(Open {
                    share_access: self.share_access(),
                    share_deny: share::DENY_NONE,
                    owner: StateOwner { clientid, owner: &self.owner },
                    create: None,
                    claim: OpenClaim::Previous(DelegationType::None),
                }));
            }
            Step::ReclaimComplete => push(Op::ReclaimComplete { one_fs: false }),
            Step::Locku => {
                let (offset, length) = self.range();
                if let Some(s) = self.lock_state {
                    push(Op::Putfh { fh: &self.obj });
                    push(Op::Locku { locktype: NfsLock::Write, stateid: current(s), offset, length });
                }
            }
            Step::Free => {
                if let Some(&s) = self.frees.last() {
                    push(Op::Putfh { fh: &self.obj });
                    push(Op::Locku {
                        locktype: NfsLock::Write,
                        stateid: current(s),
                        offset: 0,
                        length: u64::MAX,
                    });
                    push(Op::FreeStateid { stateid: current(s) });
                }
            }
        }
        send(&ops[..n]);
    }
}

/// `s` with seqid 0: whatever its current seqid is on the server (RFC 8881 8.2.2).
fn current(s: Stateid) -> Stateid {
    Stateid { seqid: 0, other: s.other }
}

/// A stateid as the handle table keeps it.
pub(crate) fn state_bytes(s: Stateid) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&s.seqid.to_be_bytes());
    b[4..].copy_from_slice(&s.other);
    b
}

/// The stateid the handle table keeps.
pub(crate) fn stateid_of(b: [u8; 16]) -> Stateid {
    let mut other = [0u8; 12];
    other.copy_from_slice(&b[4..]);
    Stateid { seqid: u32::from_be_bytes([b[0], b[1], b[2], b[3]]), other }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_sizes_keep_within_the_fore_channel_granted() {
        let limits = Limits { read: 1 << 20, write: 1 << 20, dir: 8192, max_file: u64::MAX };
        assert_eq!(Caps::new(&limits, None), Caps { read: 1 << 20, write: 1 << 20, dir: 1 << 20 });
        let granted = |req: u32, rep: u32| ChannelAttrs {
            headerpadsize: 0,
            maxrequestsize: req,
            maxresponsesize: rep,
            maxresponsesize_cached: 8192,
            maxoperations: 16,
            maxrequests: 64,
            rdma_ird: None,
        };
        // What the session asks (max_io and 8 KiB, max_io and 4 KiB): nothing cut.
        let asked = granted((1 << 20) + 8192, (1 << 20) + 4096);
        assert_eq!(Caps::new(&limits, Some(&asked)), Caps { read: 1 << 20, write: 1 << 20, dir: 1 << 20 });
        // A server that grants 64 KiB replies and 32 KiB requests: whole pages below them.
        let small = Caps::new(&limits, Some(&granted(32 << 10, 64 << 10)));
        assert_eq!(small, Caps { read: 60 << 10, write: 28 << 10, dir: 60 << 10 });
        // Absurd grants: never 0 (a count of 0 would never move on).
        let tiny = Caps::new(&limits, Some(&granted(0, 100)));
        assert_eq!((tiny.read, tiny.write), (512, 512));
        let mut s = Slot::new(Fh::EMPTY);
        s.step = Step::Read;
        s.chunk = 1 << 20;
        s.clamp(small);
        assert_eq!((s.chunk, s.max), (60 << 10, 60 << 10));
    }
}
