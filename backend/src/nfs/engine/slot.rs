//! A pending request's slot and the little types its state machine runs on: which FUSE
//! operation it serves ([`Kind`]), its next NFS call ([`Call`]), what it holds between calls
//! ([`Slot`]: handles, names, arguments, where a READ or WRITE is), what a reply means for it
//! ([`Flow`]) and what preparing a request came to ([`Prepared`]).
//!
//! The leaf of the engine: every operation family uses it, and it uses none of them.

use std::time::Instant;

use crate::filesystem::seam::Token;
use crate::filesystem::{self, Error, Reply};
use crate::nfs::conn::Cred;
use crate::nfs::convert::{cred, open_mask};
use crate::nfs::unstable::EntryId;
use crate::nfs::wire::nfs3::{Args, CreateHow, Ftype, Sattr, Stable};
use crate::nfs::wire::Fh;
use crate::request::Request;

/// Longest name component NFSv3 servers take (and Linux sends).
pub(super) const NAME_MAX: usize = 255;

/// Which FUSE operation a slot serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Lookup,
    Getattr,
    Setattr,
    Access,
    Readlink,
    Symlink,
    Mknod,
    Mkdir,
    Create,
    Unlink,
    Rmdir,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Statfs,
    /// FLUSH, FSYNC, RELEASE with uncommitted writes: COMMIT, then replays.
    Commit,
    Readdir,
    Readdirplus,
}

/// The next NFS call of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    /// LOOKUP of `names.a` in `fh` (a lookup, or the object a CREATE made).
    LookupName,
    /// LOOKUP of `names.b` in `fh2` (RENAME_NOREPLACE's check).
    LookupTarget,
    /// GETATTR of `obj`.
    GetattrObj,
    /// SETATTR of `obj` with `sattr`.
    SetattrObj,
    Access,
    Readlink,
    Symlink,
    Mknod,
    CreateFile,
    Mkdir,
    Remove,
    Rmdir,
    Rename,
    Link,
    Read,
    Write,
    Fsstat,
    Commit,
    /// A stored UNSTABLE write sent again (FILE_SYNC), from the engine's replay buffer.
    Resend,
    Readdir,
}

/// Room for the names of one request.
pub(super) struct Names {
    bytes: [u8; 2 * NAME_MAX],
    pub(super) a: usize,
    pub(super) b: usize,
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
}

/// One pending request (see the module documentation).
pub(super) struct Slot {
    pub(super) busy: bool,
    pub(super) token: Token,
    pub(super) cred: Cred,
    pub(super) nodeid: u64,
    pub(super) kind: Kind,
    pub(super) call: Call,
    pub(super) deadline: Instant,
    /// The node's handle (the directory for name operations).
    pub(super) fh: Fh,
    /// The second handle: RENAME's target directory, LINK's object.
    pub(super) fh2: Fh,
    /// The object a sequence works on (created, looked up, replayed).
    pub(super) obj: Fh,
    pub(super) names: Names,
    /// A symlink's target (capacity kept).
    pub(super) long: Vec<u8>,
    pub(super) sattr: Sattr,
    /// SETATTR `obj` once it is known (exclusive CREATE, `O_TRUNC`).
    pub(super) setattr_after: bool,
    pub(super) exclusive: Option<[u8; 8]>,
    pub(super) mknod: (Ftype, (u32, u32)),
    pub(super) offset: u64,
    pub(super) size: u32,
    pub(super) done: u32,
    /// The count of the call on the wire (READ, WRITE, replay).
    pub(super) chunk: u32,
    pub(super) stable: Stable,
    /// The call to go on with once a COMMIT (and its replays) is done: a WRITE that found no
    /// room in the store, or a truncating SETATTR, of a file with stored writes commits them
    /// first, so no replay can ever land on top of what it wrote.
    pub(super) then: Option<Call>,
    pub(super) unstable: Option<EntryId>,
    pub(super) replay: Option<EntryId>,
    /// Where the stored write being sent again goes, and its length (apart from `offset` and
    /// `chunk`: a WRITE that commits first goes on with its own after the replays).
    pub(super) replay_at: u64,
    pub(super) replay_len: u32,
    /// The sender number this request holds the file's turn at resending by, while it does.
    pub(super) resending: Option<u64>,
    /// A WRITE that found the store full waits for room until then at most (one retransmission
    /// interval: a COMMIT that keeps failing must not hold writes until their deadline).
    pub(super) room_until: Option<Instant>,
    /// The store's horizon when the slot's COMMIT was sent
    /// ([`crate::nfs::unstable::UnstableStore::horizon`]).
    pub(super) horizon: u64,
    pub(super) flags: u32,
    /// ACCESS3 bits asked.
    pub(super) mask: u32,
    /// The FUSE ACCESS mask asked (ACCESS).
    pub(super) mask_req: u32,
    pub(super) handle: u64,
    pub(super) cookieverf: [u8; 8],
}

impl Slot {
    pub(super) fn new(root: Fh) -> Self {
        Slot {
            busy: false,
            token: Token(0),
            cred: Cred { uid: 0, gid: 0, ngroups: 0, groups: [0; 16] },
            nodeid: 0,
            kind: Kind::Getattr,
            call: Call::GetattrObj,
            deadline: Instant::now(),
            fh: root,
            fh2: root,
            obj: root,
            names: Names { bytes: [0; 2 * NAME_MAX], a: 0, b: 0 },
            long: Vec::new(),
            sattr: Sattr::default(),
            setattr_after: false,
            exclusive: None,
            mknod: (Ftype::Fifo, (0, 0)),
            offset: 0,
            size: 0,
            done: 0,
            chunk: 0,
            stable: Stable::FileSync,
            then: None,
            unstable: None,
            replay: None,
            replay_at: 0,
            replay_len: 0,
            resending: None,
            room_until: None,
            horizon: 0,
            flags: 0,
            mask: 0,
            mask_req: 0,
            handle: 0,
            cookieverf: [0; 8],
        }
    }

    /// Starts the slot over for `req` (its credential, node and deadline; nothing of the
    /// request it served before carries over to the sequence).
    pub(super) fn begin(&mut self, req: &Request<'_>, deadline: Instant) {
        self.cred = cred(&req.ctx);
        self.nodeid = req.nodeid;
        self.done = 0;
        self.setattr_after = false;
        self.exclusive = None;
        self.then = None;
        self.room_until = None;
        self.unstable = None;
        self.replay = None;
        self.sattr = Sattr::default();
        self.deadline = deadline;
    }

    /// The arguments of the slot's next call.
    pub(super) fn args(&self, plus: bool) -> Args<'_> {
        let a = self.names.a();
        match self.call {
            Call::LookupName => Args::Lookup { dir: &self.fh, name: a },
            Call::LookupTarget => Args::Lookup { dir: &self.fh2, name: self.names.b() },
            Call::GetattrObj => Args::Getattr { fh: &self.obj },
            Call::SetattrObj => Args::Setattr { fh: &self.obj, attr: &self.sattr, guard_ctime: None },
            Call::Access => Args::Access { fh: &self.fh, mask: self.mask },
            Call::Readlink => Args::Readlink { fh: &self.fh },
            Call::Symlink => Args::Symlink { dir: &self.fh, name: a, attr: &self.sattr, target: &self.long },
            Call::Mknod => Args::Mknod {
                dir: &self.fh,
                name: a,
                ftype: self.mknod.0,
                attr: &self.sattr,
                rdev: self.mknod.1,
            },
            Call::CreateFile => {
                let how = match self.exclusive {
                    Some(verf) => CreateHow::Exclusive(verf),
                    None => CreateHow::Guarded(&self.sattr),
                };
                Args::Create { dir: &self.fh, name: a, how }
            }
            Call::Mkdir => Args::Mkdir { dir: &self.fh, name: a, attr: &self.sattr },
            Call::Remove => Args::Remove { dir: &self.fh, name: a },
            Call::Rmdir => Args::Rmdir { dir: &self.fh, name: a },
            Call::Rename => {
                Args::Rename { from_dir: &self.fh, from_name: a, to_dir: &self.fh2, to_name: self.names.b() }
            }
            Call::Link => Args::Link { fh: &self.fh2, dir: &self.fh, name: a },
            Call::Read => {
                Args::Read { fh: &self.fh, offset: self.offset + u64::from(self.done), count: self.chunk }
            }
            Call::Write => Args::Write {
                fh: &self.fh,
                offset: self.offset + u64::from(self.done),
                count: self.chunk,
                stable: self.stable,
            },
            Call::Fsstat => Args::Fsstat { fh: &self.fh },
            Call::Commit => Args::Commit { fh: &self.fh, offset: 0, count: 0 },
            Call::Resend => Args::Write {
                fh: &self.obj,
                offset: self.replay_at,
                count: self.replay_len,
                stable: Stable::FileSync,
            },
            Call::Readdir if plus => Args::Readdirplus {
                dir: &self.fh,
                cookie: self.offset,
                verf: self.cookieverf,
                dircount: self.size,
                maxcount: self.chunk,
            },
            Call::Readdir => {
                Args::Readdir { dir: &self.fh, cookie: self.offset, verf: self.cookieverf, count: self.size }
            }
        }
    }

    /// The FUSE access mask the slot's ACCESS call checks.
    pub(super) fn mask_fuse(&self) -> u32 {
        if self.kind == Kind::Open {
            open_mask(self.flags)
        } else {
            self.mask_req
        }
    }
}

/// What a reply means for its slot.
pub(super) enum Flow {
    /// The request is answered.
    Done(filesystem::Result<Reply>),
    /// `slot.call` is the next call to send.
    Next,
    /// The server is busy (NFS3ERR_JUKEBOX): send the same call again a little later.
    Later,
}

/// How long a call the server answered JUKEBOX waits before it is sent again.
pub(super) const JUKEBOX_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// What preparing a request came to.
pub(super) enum Prepared {
    /// Send `Call` for a request of `Kind` (the slot holds its arguments).
    Send(Kind, Call),
    /// Answered at once, with no call to the server.
    Answered(Reply),
}

/// A reply that is not one to the slot's call: the request ends with `EIO`.
pub(super) fn unexpected(call: Call) -> Flow {
    log::warn!("nfs: unexpected reply to {call:?}");
    Flow::Done(Err(Error::Io))
}
