//! The NFS backend's per-poller engine ([`NfsEngine`], an [`FsEngine`] of the NFS filesystem,
//! which lends it the pollers' [`Shared`] state and nothing else): every FUSE request that needs
//! the server becomes one NFSv3 call, or a short sequence of them, on the poller's own
//! non-blocking connection ([`Conn`]), and completes from a later poll round.
//!
//! **Slots.** The engine keeps one slot per pending request, indexed by the server's [`Token`]
//! (so it has as many as the server has pending requests, preallocated to `slots_per_poller`
//! and kept when more ever come). A slot holds what the request needs after `start` returns:
//! the caller's credential, the file handles (copied from the node table), the names (copied:
//! the request's own are borrowed), a symlink's target, the arguments, and where its state
//! machine is (`Call`: the next NFS call). Requests that need two or more calls (LOOKUP or
//! GETATTR after a CREATE whose reply lacks the handle or attributes, SETATTR after an exclusive
//! CREATE or an `O_TRUNC` open, LOOKUP before a `RENAME_NOREPLACE`, READ/WRITE larger than the
//! server's transfer size, COMMIT then the replays of writes the server lost) go on from the
//! reply of one call to the next. A slot never holds guest buffers: READ data goes into the
//! reply buffers the server holds for the request ([`Completions::data`], asked by the
//! connection when the reply arrives), WRITE data comes from the held payload
//! ([`Completions::payload`], asked each time the call is sent).
//!
//! **Backlog.** At most `slots_per_poller` calls are on the wire (the connection's slots); a
//! request that finds them all busy waits in the engine's FIFO backlog, its arguments already
//! copied, and is sent when a call ends. So `Conn::call`'s `Full` never reaches the guest.
//!
//! **Bounded time.** Each request has a deadline (`timeout` after it started): the connection
//! ends every call in `timeout` at most (reconnecting and retransmitting meanwhile), and a
//! request past its deadline is not sent again (a backlogged one, or the next call of a
//! sequence) but ends with `EIO`. So a drain (DMA_UNMAP, queue stop) waits `timeout` plus one
//! call at most, however long the server is gone.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use vm_memory::VolatileSlice;

use super::conn::{CallError, Conn, Cred, Sink};
use super::convert::{
    access_bits, access_ok, cred, decode_dev, nfs_error, open_mask, sattr, stat, type_bits,
};
use super::nodes::{silly_name, OpenFile};
use super::shared::{EngineCell, Shared};
use super::unstable::{BackgroundClaim, EntryId};
use super::wire::nfs3::{
    access as access3, Args, CreateHow, Fattr, Fh, Ftype, Nfsstat, Res, Sattr, SetTime as NfsSetTime, Stable,
};
use crate::filesystem::seam::{Completions, FsEngine, Readiness, Started, Token};
use crate::filesystem::{self, DirEntry, Entry, Error, Opened, Reply, StatFs};
use crate::io::{Reader, Writer};
use crate::request::{Op, Request};
use crate::server::DirentWriter;

/// Longest name component NFSv3 servers take (and Linux sends).
const NAME_MAX: usize = 255;

/// Which FUSE operation a slot serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
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
enum Call {
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
struct Names {
    bytes: [u8; 2 * NAME_MAX],
    a: usize,
    b: usize,
}

impl Names {
    fn a(&self) -> &[u8] {
        &self.bytes[..self.a]
    }

    fn b(&self) -> &[u8] {
        &self.bytes[NAME_MAX..NAME_MAX + self.b]
    }

    fn set(&mut self, a: &[u8], b: &[u8]) -> Result<(), Error> {
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
struct Slot {
    busy: bool,
    token: Token,
    cred: Cred,
    nodeid: u64,
    kind: Kind,
    call: Call,
    deadline: Instant,
    /// The node's handle (the directory for name operations).
    fh: Fh,
    /// The second handle: RENAME's target directory, LINK's object.
    fh2: Fh,
    /// The object a sequence works on (created, looked up, replayed).
    obj: Fh,
    names: Names,
    /// A symlink's target (capacity kept).
    long: Vec<u8>,
    sattr: Sattr,
    /// SETATTR `obj` once it is known (exclusive CREATE, `O_TRUNC`).
    setattr_after: bool,
    exclusive: Option<[u8; 8]>,
    mknod: (Ftype, (u32, u32)),
    offset: u64,
    size: u32,
    done: u32,
    /// The count of the call on the wire (READ, WRITE, replay).
    chunk: u32,
    stable: Stable,
    /// The call to go on with once a COMMIT (and its replays) is done: a WRITE that found no
    /// room in the store, or a truncating SETATTR, of a file with stored writes commits them
    /// first, so no replay can ever land on top of what it wrote.
    then: Option<Call>,
    unstable: Option<EntryId>,
    replay: Option<EntryId>,
    /// Where the stored write being sent again goes, and its length (apart from `offset` and
    /// `chunk`: a WRITE that commits first goes on with its own after the replays).
    replay_at: u64,
    replay_len: u32,
    /// A WRITE that found the store full waits for room until then at most (one retransmission
    /// interval: a COMMIT that keeps failing must not hold writes until their deadline).
    room_until: Option<Instant>,
    /// The store's horizon when the slot's COMMIT was sent ([`super::unstable::UnstableStore::horizon`]).
    horizon: u64,
    flags: u32,
    /// ACCESS3 bits asked.
    mask: u32,
    /// The FUSE ACCESS mask asked (ACCESS).
    mask_req: u32,
    handle: u64,
    cookieverf: [u8; 8],
}

impl Slot {
    fn new(root: Fh) -> Self {
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
            room_until: None,
            horizon: 0,
            flags: 0,
            mask: 0,
            mask_req: 0,
            handle: 0,
            cookieverf: [0; 8],
        }
    }

    /// The arguments of the slot's next call.
    fn args(&self, plus: bool) -> Args<'_> {
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
}

/// What a reply means for its slot.
enum Flow {
    /// The request is answered.
    Done(filesystem::Result<Reply>),
    /// `slot.call` is the next call to send.
    Next,
    /// The server is busy (NFS3ERR_JUKEBOX): send the same call again a little later.
    Later,
}

/// How long a call the server answered JUKEBOX waits before it is sent again.
const JUKEBOX_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// The NFS engine of one poller (see the module documentation).
pub struct NfsEngine {
    conn: Option<Conn>,
    slots: Vec<Slot>,
    root: Fh,
    busy: usize,
    /// Requests waiting for a connection slot, oldest first.
    backlog: VecDeque<u32>,
    /// Slots whose next call goes out after this poll round's replies.
    next: Vec<u32>,
    /// Slots whose call goes again once the server was busy, and when.
    later: Vec<(u32, Instant)>,
    /// Slots waiting for the replay buffer (one replays at a time).
    replay_wait: VecDeque<u32>,
    replay_owner: Option<u32>,
    /// Where a stored write is copied to be sent again (allocated at the first replay).
    replay_buf: Vec<u8>,
    /// Slots whose WRITE found the store full and waits for a COMMIT to free room, oldest first.
    room_wait: VecDeque<u32>,
    /// The background COMMIT this engine has on the wire.
    background: Option<Background>,
    /// No background COMMIT before then (one failed: the server is busy or gone).
    background_after: Instant,
    cell: Arc<EngineCell>,
}

/// The connection tag of the background COMMIT (no slot has it: slots are request tokens).
const BACKGROUND_TAG: u32 = u32::MAX;

/// A COMMIT the engine sent on its own, the store past its high-water mark (no guest request
/// waits for it; it only frees the store).
struct Background {
    file: u64,
    horizon: u64,
    /// The store's one background COMMIT is this one while held.
    _claim: BackgroundClaim,
}

impl std::fmt::Debug for NfsEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfsEngine").field("busy", &self.busy).field("backlog", &self.backlog.len()).finish()
    }
}

/// The sink of a `Conn::call`: the payload of the call being sent.
struct CallSink<'a> {
    payload: Option<Reader<'a>>,
    ended: bool,
}

impl Sink for CallSink<'_> {
    fn read_buffer(&mut self, _tag: u32) -> Option<Writer<'_>> {
        None
    }

    fn payload(&mut self, _tag: u32) -> Option<Reader<'_>> {
        self.payload.clone()
    }

    fn done(&mut self, _tag: u32, _res: Result<Res<'_>, CallError>) {
        self.ended = true;
    }
}

/// Why a slot's call did not go out.
#[derive(Debug)]
enum SendError {
    /// The connection refused it.
    Call(CallError),
    /// A WRITE found the store full, and a COMMIT (on the wire, or to be sent) will free room:
    /// it waits in the engine (`room_wait`).
    NoRoom,
}

impl From<CallError> for SendError {
    fn from(e: CallError) -> Self {
        SendError::Call(e)
    }
}

/// Sends slot `tag`'s next call (`payload`: a WRITE's or replay's data, from where the call
/// starts). WRITE data goes to the replay store first when it is to be sent UNSTABLE.
fn send(
    conn: &mut Conn,
    fs: &Shared,
    slot: &mut Slot,
    tag: u32,
    payload: Option<Reader<'_>>,
) -> Result<(), SendError> {
    let mut payload = payload;
    if slot.call == Call::Write {
        if let Some(p) = payload.as_mut() {
            p.truncate(slot.chunk as usize);
            let at = slot.offset + u64::from(slot.done);
            slot.unstable = fs.unstable.insert(slot.nodeid, &slot.fh, &slot.cred, at, p);
            slot.stable = if slot.unstable.is_some() { Stable::Unstable } else { Stable::FileSync };
            let now = Instant::now();
            if slot.unstable.is_none()
                && slot.room_until.is_none_or(|t| now < t)
                && fs.unstable.fits(p.bytes_left())
                && fs.unstable.room_may_come()
            {
                // Full, but a COMMIT frees room soon: wait for it (a retransmission interval
                // at most) and go UNSTABLE then.
                slot.room_until.get_or_insert(now + fs.retransmit);
                return Err(SendError::NoRoom);
            }
            if slot.unstable.is_none() && fs.unstable.enabled() {
                fs.unstable.count_full();
            }
            if slot.unstable.is_none() && fs.unstable.has_answered(slot.nodeid) {
                // No room and none to come: this one goes FILE_SYNC, after the file's stored
                // writes are committed (a replay must never land on top of it).
                slot.then = Some(Call::Write);
                slot.call = Call::Commit;
                payload = None;
            }
        }
    }
    if slot.call == Call::Commit {
        slot.horizon = fs.unstable.horizon();
    }
    let args = slot.args(slot.kind == Kind::Readdirplus);
    let mut sink = CallSink { payload, ended: false };
    let r = conn.call(tag, &slot.cred, &args, &mut sink);
    if r.is_err() || sink.ended {
        if let Some(id) = slot.unstable.take() {
            fs.unstable.remove(id);
        }
    }
    match r {
        Ok(()) if sink.ended => Err(CallError::Closed.into()),
        r => r.map_err(SendError::from),
    }
}

/// Sets a READ/WRITE slot's next chunk.
fn set_chunk(slot: &mut Slot, max: u32) {
    slot.chunk = (slot.size - slot.done).min(max);
}

fn entry(fs: &Shared, fh: &Fh, attr: &Fattr) -> filesystem::Result<Entry> {
    let ino = fs.nodes.reference(fh)?;
    let t = fs.cache.timeout();
    Ok(Entry { ino, generation: 0, attr: stat(attr), entry_timeout: t, attr_timeout: t })
}

/// The poll-time sink: replies go through the slots' state machines.
struct PollSink<'e, 'c> {
    fs: &'e Shared,
    slots: &'e mut [Slot],
    done: &'e mut Completions<'c>,
    next: &'e mut Vec<u32>,
    later: &'e mut Vec<(u32, Instant)>,
    replay: &'e [VolatileSlice<'e>],
    replay_owner: &'e mut Option<u32>,
    busy: &'e mut usize,
    background: &'e mut Option<Background>,
    background_after: &'e mut Instant,
    cell: &'e EngineCell,
}

/// Ends slot `i`'s request with `r`.
#[allow(clippy::too_many_arguments)]
fn complete(
    fs: &Shared,
    slot: &mut Slot,
    i: u32,
    r: filesystem::Result<Reply>,
    done: &mut Completions<'_>,
    busy: &mut usize,
    replay_owner: &mut Option<u32>,
    cell: &EngineCell,
) {
    if !slot.busy {
        return;
    }
    if let Some(id) = slot.unstable.take() {
        fs.unstable.remove(id);
    }
    slot.replay = None;
    if *replay_owner == Some(i) {
        *replay_owner = None;
    }
    if r.is_err() {
        EngineCell::bump(&cell.errors);
    }
    done.complete(slot.token, r);
    slot.busy = false;
    *busy -= 1;
}

impl Sink for PollSink<'_, '_> {
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>> {
        let s = self.slots.get(tag as usize).filter(|s| s.busy && s.call == Call::Read)?;
        let mut w = self.done.data(s.token)?;
        w.split_at(s.done as usize).ok()?;
        Some(w)
    }

    fn payload(&mut self, tag: u32) -> Option<Reader<'_>> {
        let s = self.slots.get(tag as usize).filter(|s| s.busy)?;
        match s.call {
            Call::Write => {
                let mut r = self.done.payload(s.token)?;
                r.consume(s.done as usize).ok()?;
                r.truncate(s.chunk as usize);
                Some(r)
            }
            Call::Resend => {
                let mut r = Reader::new(self.replay);
                r.truncate(s.replay_len as usize);
                Some(r)
            }
            _ => None,
        }
    }

    fn done(&mut self, tag: u32, res: Result<Res<'_>, CallError>) {
        if tag == BACKGROUND_TAG {
            // The claim goes with it: the next background COMMIT may be sent.
            let Some(b) = self.background.take() else { return };
            match res {
                Ok(Res::Commit { verf }) => {
                    let c = self.fs.unstable.committed_background(b.file, verf, b.horizon);
                    if c.resend > 0 {
                        // Sent again at the file's next FLUSH, FSYNC or last close (or by a
                        // write that finds the store full of them).
                        log::info!(
                            "nfs: the server's write verifier changed: {} writes to send again",
                            c.resend
                        );
                    }
                }
                Ok(Res::Failed { status: Nfsstat::Stale, .. }) => self.fs.unstable.drop_file(b.file),
                r => {
                    log::debug!("nfs: background COMMIT failed: {:?}", r.err());
                    *self.background_after = Instant::now() + JUKEBOX_DELAY;
                }
            }
            return;
        }
        let i = tag;
        let Some(slot) = self.slots.get_mut(i as usize).filter(|s| s.busy) else { return };
        let flow = match res {
            Ok(res) => reply(self.fs, slot, res, self.done),
            Err(e) => {
                if matches!(e, CallError::TimedOut) {
                    EngineCell::bump(&self.cell.timed_out);
                }
                log::debug!("nfs: {:?} call of request {:?} ended: {e}", slot.call, slot.token);
                Flow::Done(Err(Error::Io))
            }
        };
        match flow {
            Flow::Done(r) => {
                complete(self.fs, slot, i, r, self.done, self.busy, self.replay_owner, self.cell);
            }
            Flow::Next => self.next.push(i),
            Flow::Later => {
                if let Some(id) = slot.unstable.take() {
                    self.fs.unstable.remove(id);
                }
                self.later.push((i, Instant::now() + JUKEBOX_DELAY));
            }
        }
    }
}

/// What the reply `res` to slot's current call means.
fn reply(fs: &Shared, slot: &mut Slot, res: Res<'_>, done: &mut Completions<'_>) -> Flow {
    use Flow::{Done, Next};
    let unexpected = || {
        log::warn!("nfs: unexpected reply to {:?}", slot.call);
        Done(Err(Error::Io))
    };
    // Failures first: a few are steps of a sequence, not errors.
    if let Res::Failed { status, .. } = res {
        return match (slot.call, status) {
            (_, Nfsstat::Jukebox) => Flow::Later,
            (Call::LookupTarget, Nfsstat::NoEnt) => {
                slot.call = Call::Rename;
                Next
            }
            (Call::CreateFile, Nfsstat::Exist) if slot.exclusive.is_none() && slot.kind == Kind::Create => {
                // Created meanwhile by someone else: open it (truncated if asked).
                slot.setattr_after = slot.flags & libc::O_TRUNC as u32 != 0;
                slot.sattr = Sattr { size: Some(0), ..Sattr::default() };
                slot.call = Call::LookupName;
                Next
            }
            (Call::Commit, Nfsstat::Stale) => {
                // The file is gone: nothing of it can be committed any more.
                fs.unstable.drop_file(slot.nodeid);
                Done(Err(nfs_error(status)))
            }
            _ => Done(Err(nfs_error(status))),
        };
    }
    match (slot.call, res) {
        (Call::LookupName, Res::Lookup { fh, .. }) if slot.kind == Kind::Unlink => {
            match fs.nodes.open_node(&fh) {
                // Open: renamed to its silly name until the last close (as Linux's NFS client).
                Some(n) => {
                    slot.handle = n;
                    slot.fh2 = slot.fh;
                    let a = slot.names.a;
                    let mut old = [0u8; NAME_MAX];
                    old[..a].copy_from_slice(slot.names.a());
                    if slot.names.set(&old[..a], &silly_name(n)).is_err() {
                        return Done(Err(Error::NameTooLong));
                    }
                    slot.call = Call::Rename;
                }
                None => slot.call = Call::Remove,
            }
            Next
        }
        (Call::LookupName, Res::Lookup { fh, attr, .. }) => after_object(fs, slot, fh, attr),
        (Call::LookupTarget, Res::Lookup { .. }) => Done(Err(Error::Exists)),
        (Call::GetattrObj, Res::Attr(a)) => finish(fs, slot, &a),
        (Call::SetattrObj, Res::Setattr { attr }) => match attr {
            Some(a) => finish(fs, slot, &a),
            None => {
                slot.call = Call::GetattrObj;
                Next
            }
        },
        (Call::Access, Res::Access { access, .. }) => {
            if !access_ok(slot.mask_fuse(), access) {
                return Done(Err(Error::AccessDenied));
            }
            if slot.kind != Kind::Open {
                return Done(Ok(Reply::Empty));
            }
            if slot.flags & libc::O_TRUNC as u32 != 0 {
                slot.obj = slot.fh;
                slot.sattr = Sattr { size: Some(0), ..Sattr::default() };
                slot.call = Call::SetattrObj;
                return Next;
            }
            open_file(fs, slot)
        }
        (Call::Readlink, Res::Readlink { target, .. }) => {
            let Some(mut w) = done.data(slot.token) else { return Done(Err(Error::Io)) };
            if target.len() > w.available() {
                return Done(Err(Error::NameTooLong));
            }
            match w.write_all(target) {
                Ok(()) => Done(Ok(Reply::Data(target.len()))),
                Err(e) => Done(Err(e.into())),
            }
        }
        (Call::Symlink | Call::Mknod | Call::CreateFile | Call::Mkdir, Res::Created { fh, attr, .. }) => {
            if slot.exclusive.is_some() {
                // The verifier is in the times: set the mode and real times now.
                slot.setattr_after = true;
            }
            match fh {
                Some(fh) => after_object(fs, slot, fh, attr),
                None => {
                    slot.call = Call::LookupName;
                    Next
                }
            }
        }
        (Call::Rename, Res::Changed { .. }) if slot.kind == Kind::Unlink => {
            fs.nodes.set_silly(slot.handle, slot.fh);
            Done(Ok(Reply::Empty))
        }
        (Call::Remove | Call::Rmdir | Call::Rename, Res::Changed { .. }) => Done(Ok(Reply::Empty)),
        (Call::Link, Res::Changed { attr }) => {
            let fh = slot.fh2;
            after_object(fs, slot, fh, attr)
        }
        (Call::Read, Res::Read { count, eof, .. }) => {
            let count = count.min(slot.chunk);
            slot.done += count;
            if eof || count == 0 || slot.done >= slot.size {
                Done(Ok(Reply::Data(slot.done as usize)))
            } else {
                set_chunk(slot, fs.limits.read);
                Next
            }
        }
        (Call::Write, Res::Write { count, committed, verf, .. }) => {
            if let Some(id) = slot.unstable.take() {
                fs.unstable.written(id, verf, committed == Stable::FileSync && count == slot.chunk);
            }
            let count = count.min(slot.chunk);
            if count == 0 {
                return Done(Err(Error::Io));
            }
            slot.done += count;
            if slot.done >= slot.size {
                Done(Ok(Reply::Written(slot.done as usize)))
            } else {
                set_chunk(slot, fs.limits.write);
                Next
            }
        }
        (Call::Fsstat, Res::Fsstat { tbytes, fbytes, abytes, tfiles, ffiles, .. }) => {
            const B: u64 = 4096;
            Done(Ok(Reply::StatFs(StatFs {
                blocks: tbytes / B,
                bfree: fbytes / B,
                bavail: abytes / B,
                files: tfiles,
                ffree: ffiles,
                bsize: B as u32,
                namelen: NAME_MAX as u32,
                frsize: B as u32,
            })))
        }
        (Call::Commit, Res::Commit { verf }) => {
            let c = fs.unstable.committed(slot.nodeid, verf, slot.horizon);
            if c.resend > 0 {
                log::info!("nfs: the server's write verifier changed: sending {} writes again", c.resend);
                slot.call = Call::Resend;
                Next
            } else if let Some(call) = slot.then.take() {
                slot.call = call;
                Next
            } else {
                Done(Ok(Reply::Empty))
            }
        }
        (Call::Resend, Res::Write { count, .. }) => {
            if count < slot.replay_len {
                return Done(Err(Error::Io));
            }
            if let Some(id) = slot.replay.take() {
                fs.unstable.remove(id);
            }
            // The next stored write of the file, if any.
            Next
        }
        (Call::Readdir, Res::Dir { verf, entries, eof, .. }) => {
            let Some(mut w) = done.data(slot.token) else { return Done(Err(Error::Io)) };
            let plus = slot.kind == Kind::Readdirplus;
            let mut out = DirentWriter::new(&mut w);
            // The cookie of the last entry given, and whether every entry of the reply fit.
            let mut last = 0;
            let mut all = true;
            for e in entries {
                let Ok(e) = e else {
                    return Done(Err(Error::Io));
                };
                if e.name.is_empty()
                    || e.name.len() > NAME_MAX
                    || e.name.contains(&b'/')
                    || e.name.contains(&0)
                {
                    continue;
                }
                let typ = e.attr.map_or(0, |a| type_bits(a.ftype) >> 12);
                let d = DirEntry { ino: e.fileid, offset: e.cookie, typ, name: e.name };
                if !plus {
                    if !out.add(&d) {
                        all = false;
                        break;
                    }
                    last = e.cookie;
                    continue;
                }
                let dots = e.name == b"." || e.name == b"..";
                let looked_up = match (e.fh, e.attr) {
                    (Some(fh), Some(a)) if !dots => entry(fs, &fh, &a).ok(),
                    _ => None,
                };
                let ent = looked_up.unwrap_or(Entry {
                    attr: e.attr.as_ref().map(stat).unwrap_or_default(),
                    ..Entry::default()
                });
                let ent = if looked_up.is_none() { Entry { ino: 0, ..ent } } else { ent };
                if !out.add_plus(&d, &ent) {
                    if looked_up.is_some() {
                        fs.nodes.forget(ent.ino, 1);
                    }
                    all = false;
                    break;
                }
                last = e.cookie;
            }
            fs.handles.set_cookieverf(slot.handle, verf, if eof && all { last } else { 0 });
            Done(Ok(Reply::Data(out.bytes_written())))
        }
        _ => unexpected(),
    }
}

impl Slot {
    /// The FUSE access mask the slot's ACCESS call checks.
    fn mask_fuse(&self) -> u32 {
        if self.kind == Kind::Open {
            open_mask(self.flags)
        } else {
            self.mask_req
        }
    }
}

/// The object of a sequence is known: SETATTR it if asked, fetch missing attributes, or finish.
fn after_object(fs: &Shared, slot: &mut Slot, fh: Fh, attr: Option<Fattr>) -> Flow {
    slot.obj = fh;
    if slot.setattr_after {
        slot.setattr_after = false;
        slot.call = Call::SetattrObj;
        return Flow::Next;
    }
    match attr {
        Some(a) => finish(fs, slot, &a),
        None => {
            slot.call = Call::GetattrObj;
            Flow::Next
        }
    }
}

/// The answer of a sequence whose object and attributes are known.
fn finish(fs: &Shared, slot: &mut Slot, a: &Fattr) -> Flow {
    let t = fs.cache.timeout();
    let r = match slot.kind {
        Kind::Getattr | Kind::Setattr => Ok(Reply::Attr(stat(a), t)),
        Kind::Open => return open_file(fs, slot),
        Kind::Create => entry(fs, &slot.obj, a).and_then(|e| {
            let file =
                OpenFile { nodeid: e.ino, flags: slot.flags, dir: false, cookieverf: [0; 8], eof_at: 0 };
            let opened = fs.nodes.opened(e.ino).and_then(|()| match fs.handles.open(file) {
                Ok(fh) => Ok(fh),
                Err(err) => {
                    fs.nodes.closed(e.ino);
                    Err(err)
                }
            });
            match opened {
                Ok(fh) => Ok(Reply::Created(e, Opened { fh, open_flags: fs.cache.file_open_flags() })),
                Err(err) => {
                    fs.nodes.forget(e.ino, 1);
                    Err(err)
                }
            }
        }),
        _ => entry(fs, &slot.obj, a).map(Reply::Entry),
    };
    Flow::Done(r)
}

/// OPEN's answer: a device-side handle.
fn open_file(fs: &Shared, slot: &Slot) -> Flow {
    Flow::Done(open_handle(fs, slot.nodeid, slot.flags, false))
}

fn open_handle(fs: &Shared, nodeid: u64, flags: u32, dir: bool) -> filesystem::Result<Reply> {
    fs.nodes.opened(nodeid)?;
    let file = OpenFile { nodeid, flags, dir, cookieverf: [0; 8], eof_at: 0 };
    match fs.handles.open(file) {
        Ok(fh) => {
            let open_flags = if dir { fs.cache.dir_open_flags() } else { fs.cache.file_open_flags() };
            Ok(Reply::Open(Opened { fh, open_flags }))
        }
        Err(e) => {
            fs.nodes.closed(nodeid);
            Err(e)
        }
    }
}

impl NfsEngine {
    /// The engine of poller `poller` of `fs`, with a connection of its own (connecting in the
    /// background: the first calls wait in it until it is up).
    pub fn new(fs: &impl AsRef<Shared>, poller: usize) -> Self {
        let fs = fs.as_ref();
        let conn = match Conn::new(fs.conn_config()) {
            Ok(c) => Some(c),
            Err(e) => {
                log::error!("nfs: poller {poller}: no connection to {}: {e}", fs.mounted.nfs_addr);
                None
            }
        };
        let root = fs.mounted.root;
        let n = fs.slots;
        let cell = Arc::new(EngineCell::default());
        fs.register(cell.clone());
        NfsEngine {
            conn,
            slots: (0..n).map(|_| Slot::new(root)).collect(),
            root,
            busy: 0,
            backlog: VecDeque::with_capacity(n),
            next: Vec::with_capacity(n),
            later: Vec::with_capacity(n),
            replay_wait: VecDeque::with_capacity(n),
            replay_owner: None,
            replay_buf: Vec::new(),
            room_wait: VecDeque::with_capacity(n),
            background: None,
            background_after: Instant::now(),
            cell,
        }
    }

    /// Fills slot `i` for `req`; `Err` answers it at once, `Ok(None)` too (with the reply).
    fn prepare(&mut self, fs: &Shared, i: usize, req: &Request<'_>) -> Result<Option<Reply>, Error> {
        let slot = &mut self.slots[i];
        slot.cred = cred(&req.ctx);
        slot.nodeid = req.nodeid;
        slot.done = 0;
        slot.setattr_after = false;
        slot.exclusive = None;
        slot.then = None;
        slot.room_until = None;
        slot.unstable = None;
        slot.replay = None;
        slot.sattr = Sattr::default();
        slot.deadline = Instant::now() + fs.timeout;
        let node = |n: u64| fs.nodes.fh(n);
        let (kind, call) = match req.op {
            Op::Lookup { name } => {
                slot.fh = node(req.nodeid)?;
                slot.names.set(name, b"")?;
                (Kind::Lookup, Call::LookupName)
            }
            Op::Getattr { .. } => {
                slot.obj = node(req.nodeid)?;
                (Kind::Getattr, Call::GetattrObj)
            }
            Op::Setattr(a) => {
                slot.obj = node(req.nodeid)?;
                slot.fh = slot.obj;
                slot.sattr = sattr(a);
                if a.size.is_some() && fs.unstable.has_answered(req.nodeid) {
                    // A truncate after stored writes: commit them first (a replay after it
                    // would bring the cut data back).
                    slot.then = Some(Call::SetattrObj);
                    (Kind::Setattr, Call::Commit)
                } else {
                    (Kind::Setattr, Call::SetattrObj)
                }
            }
            Op::Access { mask } => {
                slot.fh = node(req.nodeid)?;
                // F_OK (0): the node exists if the server answers for its handle.
                slot.mask_req = mask;
                slot.mask = if mask == 0 { access3::READ } else { access_bits(mask) };
                (Kind::Access, Call::Access)
            }
            Op::Readlink => {
                slot.fh = node(req.nodeid)?;
                (Kind::Readlink, Call::Readlink)
            }
            Op::Symlink { name, target } => {
                slot.fh = node(req.nodeid)?;
                slot.names.set(name, b"")?;
                if target.len() > libc::PATH_MAX as usize {
                    return Err(Error::NameTooLong);
                }
                slot.long.clear();
                slot.long.extend_from_slice(target);
                (Kind::Symlink, Call::Symlink)
            }
            Op::Mknod { name, mode, rdev, .. } => {
                slot.fh = node(req.nodeid)?;
                slot.names.set(name, b"")?;
                slot.sattr.mode = Some(mode & 0o7777);
                let ftype = match mode & libc::S_IFMT {
                    libc::S_IFREG => None,
                    libc::S_IFIFO => Some(Ftype::Fifo),
                    libc::S_IFSOCK => Some(Ftype::Sock),
                    libc::S_IFCHR => Some(Ftype::Chr),
                    libc::S_IFBLK => Some(Ftype::Blk),
                    _ => return Err(Error::InvalidArgument),
                };
                match ftype {
                    Some(t) => {
                        slot.mknod = (t, decode_dev(rdev));
                        (Kind::Mknod, Call::Mknod)
                    }
                    // A regular file: CREATE, failing if it exists as mknod(2) does.
                    None => {
                        slot.flags = libc::O_EXCL as u32;
                        (Kind::Mknod, Call::CreateFile)
                    }
                }
            }
            Op::Mkdir { name, mode, .. } => {
                slot.fh = node(req.nodeid)?;
                slot.names.set(name, b"")?;
                slot.sattr.mode = Some(mode & 0o7777);
                (Kind::Mkdir, Call::Mkdir)
            }
            Op::Create { name, mode, flags, .. } => {
                slot.fh = node(req.nodeid)?;
                slot.names.set(name, b"")?;
                slot.flags = flags;
                slot.sattr.mode = Some(mode & 0o7777);
                if flags & libc::O_EXCL as u32 != 0 {
                    // EXCLUSIVE (safe across retransmission), then SETATTR: the verifier
                    // occupies the times until then.
                    slot.exclusive = Some(fs.create_verf());
                    slot.sattr.atime = NfsSetTime::ServerTime;
                    slot.sattr.mtime = NfsSetTime::ServerTime;
                }
                (Kind::Create, Call::CreateFile)
            }
            Op::Unlink { name } => {
                slot.fh = node(req.nodeid)?;
                slot.names.set(name, b"")?;
                // A file still open somewhere is renamed, not removed: LOOKUP first to know.
                let call = if fs.nodes.any_open() { Call::LookupName } else { Call::Remove };
                (Kind::Unlink, call)
            }
            Op::Rmdir { name } => {
                slot.fh = node(req.nodeid)?;
                slot.names.set(name, b"")?;
                (Kind::Rmdir, Call::Rmdir)
            }
            Op::Rename { oldname, newdir, newname, flags } => {
                if flags & libc::RENAME_EXCHANGE != 0 {
                    // NFSv3 has no atomic exchange.
                    return Err(Error::InvalidArgument);
                }
                let (a, b) = fs.nodes.fh2(req.nodeid, newdir)?;
                slot.fh = a;
                slot.fh2 = b;
                slot.names.set(oldname, newname)?;
                let call =
                    if flags & libc::RENAME_NOREPLACE != 0 { Call::LookupTarget } else { Call::Rename };
                (Kind::Rename, call)
            }
            Op::Link { oldnodeid, name } => {
                let (dir, obj) = fs.nodes.fh2(req.nodeid, oldnodeid)?;
                slot.fh = dir;
                slot.fh2 = obj;
                slot.names.set(name, b"")?;
                (Kind::Link, Call::Link)
            }
            Op::Open { flags, .. } => {
                slot.fh = node(req.nodeid)?;
                slot.flags = flags;
                slot.mask = access_bits(open_mask(flags));
                (Kind::Open, Call::Access)
            }
            Op::Opendir { flags } => {
                node(req.nodeid)?;
                return open_handle(fs, req.nodeid, flags, true).map(Some);
            }
            Op::Read { fh, offset, size } => {
                check_handle(fs, fh, req.nodeid)?;
                slot.fh = node(req.nodeid)?;
                slot.offset = offset;
                // Cut at the end of the offset space: no call's offset (`offset` plus what came
                // so far) can overflow, however few bytes the server gives per call.
                let size = u32::try_from(u64::MAX - offset).map_or(size, |room| size.min(room));
                slot.size = size;
                if size == 0 {
                    return Ok(Some(Reply::Data(0)));
                }
                set_chunk(slot, fs.limits.read);
                (Kind::Read, Call::Read)
            }
            Op::Write { fh, offset, size, .. } => {
                check_handle(fs, fh, req.nodeid)?;
                if offset.checked_add(u64::from(size)).is_none_or(|end| end > fs.limits.max_file) {
                    return Err(Error::FileTooLarge);
                }
                slot.fh = node(req.nodeid)?;
                slot.offset = offset;
                slot.size = size;
                if size == 0 {
                    return Ok(Some(Reply::Written(0)));
                }
                set_chunk(slot, fs.limits.write);
                (Kind::Write, Call::Write)
            }
            Op::Statfs => {
                slot.fh = node(req.nodeid)?;
                (Kind::Statfs, Call::Fsstat)
            }
            Op::Flush { .. } | Op::Fsync { .. } => {
                if !fs.unstable.has(req.nodeid) {
                    return Ok(Some(Reply::Empty));
                }
                slot.fh = node(req.nodeid)?;
                (Kind::Commit, Call::Commit)
            }
            Op::Release { fh, .. } => {
                // Everything goes by the node of the handle closed, not the request's node id
                // (a guest could name another node: its writes would be dropped, or the silly
                // name of the wrong file removed and the right one left on the server). The
                // node's file handle is taken first: the close may free the node.
                let before = fs.handles.get(fh).map(|f| (f.nodeid, node(f.nodeid).ok()));
                let Some(f) = fs.handles.close(fh) else { return Ok(Some(Reply::Empty)) };
                let nodeid = f.nodeid;
                slot.nodeid = nodeid;
                if let Some(dir) = fs.nodes.closed(nodeid) {
                    // The last close of a file unlinked while open: its data is of no use any
                    // more, and its silly name goes.
                    fs.unstable.drop_file(nodeid);
                    slot.fh = dir;
                    slot.names.set(&silly_name(nodeid), b"")?;
                    slot.kind = Kind::Unlink;
                    slot.call = Call::Remove;
                    return Ok(None);
                }
                match before {
                    // The last handle of a file with uncommitted writes: commit them.
                    Some((n, Some(h)))
                        if n == nodeid && fs.unstable.has(nodeid) && !fs.nodes.has_opens(nodeid) =>
                    {
                        slot.fh = h;
                        (Kind::Commit, Call::Commit)
                    }
                    _ => return Ok(Some(Reply::Empty)),
                }
            }
            Op::Releasedir { fh, .. } => {
                if let Some(f) = fs.handles.close(fh) {
                    let _ = fs.nodes.closed(f.nodeid);
                }
                return Ok(Some(Reply::Empty));
            }
            // NFSv3 directory operations are synchronous on the server (RFC 1813, 3.3.21).
            Op::Fsyncdir { .. } => return Ok(Some(Reply::Empty)),
            Op::Readdir { fh, offset, size } | Op::Readdirplus { fh, offset, size } => {
                let f =
                    fs.handles.get(fh).filter(|f| f.dir && f.nodeid == req.nodeid).ok_or(Error::BadHandle)?;
                slot.fh = node(req.nodeid)?;
                slot.handle = fh;
                slot.offset = offset;
                if offset != 0 && offset == f.eof_at {
                    // The last listing reached the end here: nothing more (the kernel asks once
                    // more after the last entry; NFSv3 would answer an empty eof).
                    return Ok(Some(Reply::Data(0)));
                }
                slot.cookieverf = if offset == 0 { [0; 8] } else { f.cookieverf };
                slot.size = size.clamp(512, fs.limits.read);
                // READDIRPLUS replies carry handles and attributes: room for about twice as much.
                slot.chunk =
                    slot.size.saturating_mul(2).saturating_add(1024).min(fs.limits.read.max(fs.limits.write));
                let kind =
                    if matches!(req.op, Op::Readdir { .. }) { Kind::Readdir } else { Kind::Readdirplus };
                (kind, Call::Readdir)
            }
            // What NFSv3 cannot do: ENOSYS, on which the kernel stops asking and falls back
            // (xattrs: EOPNOTSUPP to the caller; fallocate: EOPNOTSUPP; lseek: computed locally
            // from the size; copy_file_range: a copy through the page cache; O_TMPFILE:
            // EOPNOTSUPP; statx: GETATTR; syncfs: nothing to do per FUSE).
            Op::Setxattr { .. }
            | Op::Getxattr { .. }
            | Op::Listxattr { .. }
            | Op::Removexattr { .. }
            | Op::Fallocate { .. }
            | Op::Lseek { .. }
            | Op::CopyFileRange { .. }
            | Op::Tmpfile { .. }
            | Op::Statx { .. }
            | Op::Syncfs => return Err(Error::NotImplemented),
            // The session's own: never here.
            Op::Init(_)
            | Op::Destroy
            | Op::Forget { .. }
            | Op::BatchForget { .. }
            | Op::Interrupt { .. }
            | Op::Lock(_) => return Err(Error::InvalidArgument),
        };
        slot.kind = kind;
        slot.call = call;
        Ok(None)
    }

    /// Sends slot `i`'s next call from a poll round (after a reply, or from the backlog).
    fn send_next(&mut self, fs: &Shared, i: u32, done: &mut Completions<'_>) {
        let Some(conn) = self.conn.as_mut() else {
            return self.end(fs, i, Err(Error::Io), done);
        };
        let slot = &mut self.slots[i as usize];
        if !slot.busy {
            return;
        }
        if Instant::now() > slot.deadline {
            EngineCell::bump(&self.cell.timed_out);
            return self.end(fs, i, Err(Error::Io), done);
        }
        let r = match slot.call {
            Call::Write => {
                let payload =
                    done.payload(slot.token).and_then(|mut p| p.consume(slot.done as usize).ok().map(|()| p));
                match payload {
                    Some(p) => send(conn, fs, slot, i, Some(p)),
                    None => return self.end(fs, i, Err(Error::Io), done),
                }
            }
            Call::Resend => {
                if self.replay_owner.is_some_and(|o| o != i) {
                    self.replay_wait.push_back(i);
                    return;
                }
                let want = fs.limits.write as usize;
                if self.replay_buf.len() < want {
                    self.replay_buf.resize(want, 0);
                }
                let Some(r) = fs.unstable.next_resend(slot.nodeid, &mut self.replay_buf) else {
                    // Everything the server lost is on it again.
                    if self.replay_owner == Some(i) {
                        self.replay_owner = None;
                    }
                    return match slot.then.take() {
                        Some(call) => {
                            slot.call = call;
                            self.send_next(fs, i, done)
                        }
                        None => self.end(fs, i, Ok(Reply::Empty), done),
                    };
                };
                self.replay_owner = Some(i);
                slot.obj = r.fh;
                slot.replay_at = r.offset;
                slot.replay_len = r.len;
                slot.replay = Some(r.id);
                let slices = [VolatileSlice::from(&mut self.replay_buf[..])];
                let mut p = Reader::new(&slices);
                p.truncate(r.len as usize);
                send(conn, fs, slot, i, Some(p))
            }
            _ => send(conn, fs, slot, i, None),
        };
        match r {
            Ok(()) => EngineCell::bump(&self.cell.calls),
            Err(SendError::Call(CallError::Full)) => {
                EngineCell::bump(&self.cell.backlogged);
                self.backlog.push_back(i);
            }
            Err(SendError::NoRoom) => self.room_wait.push_back(i),
            Err(SendError::Call(e)) => {
                log::debug!("nfs: call of request {i} not sent: {e}");
                self.end(fs, i, Err(Error::Io), done);
            }
        }
    }

    /// Sends a background COMMIT when the store is past its high-water mark (or a write here
    /// waits for room) and none is on the wire: of the file with the most answered bytes stored,
    /// as its newest writer. No guest request waits for it; its reply frees the store.
    fn maybe_commit(&mut self, fs: &Shared, now: Instant) {
        let wanted = fs.unstable.past_high_water() || !self.room_wait.is_empty();
        if self.background.is_some() || !wanted || now < self.background_after {
            return;
        }
        let Some(conn) = self.conn.as_mut() else { return };
        let Some(claim) = fs.unstable.begin_background() else { return };
        let Some(pick) = fs.unstable.pick_commit() else { return };
        let horizon = fs.unstable.horizon();
        let args = Args::Commit { fh: &pick.fh, offset: 0, count: 0 };
        let mut sink = CallSink { payload: None, ended: false };
        match conn.call(BACKGROUND_TAG, &pick.cred, &args, &mut sink) {
            Ok(()) if !sink.ended => {
                EngineCell::bump(&self.cell.calls);
                fs.unstable.count_background();
                self.background = Some(Background { file: pick.file, horizon, _claim: claim });
            }
            // The connection is full or down: the next round tries again.
            r => log::trace!("nfs: background COMMIT not sent: {r:?}"),
        }
    }

    /// Writes waiting for room in the store go on once there is some, or once none can come
    /// (they go FILE_SYNC then); past their deadline they end with EIO.
    fn retry_room(&mut self, fs: &Shared, now: Instant, done: &mut Completions<'_>) {
        for _ in 0..self.room_wait.len() {
            let Some(i) = self.room_wait.pop_front() else { break };
            let slot = &self.slots[i as usize];
            if now > slot.deadline {
                EngineCell::bump(&self.cell.timed_out);
                self.end(fs, i, Err(Error::Io), done);
            } else if fs.unstable.has_room(slot.chunk as usize)
                || !fs.unstable.room_may_come()
                || slot.room_until.is_some_and(|t| now >= t)
            {
                self.send_next(fs, i, done);
            } else {
                self.room_wait.push_back(i);
            }
        }
    }

    fn end(&mut self, fs: &Shared, i: u32, r: filesystem::Result<Reply>, done: &mut Completions<'_>) {
        let slot = &mut self.slots[i as usize];
        complete(fs, slot, i, r, done, &mut self.busy, &mut self.replay_owner, &self.cell);
    }

    fn publish(&self) {
        if let Some(c) = &self.conn {
            let s = c.stats();
            EngineCell::set(&self.cell.retransmits, s.retransmits);
            EngineCell::set(&self.cell.reconnects, s.reconnects);
            EngineCell::set(&self.cell.bad_replies, s.bad_replies);
        }
    }
}

/// `fh` must be an open handle of `nodeid` (not a directory).
fn check_handle(fs: &Shared, fh: u64, nodeid: u64) -> Result<(), Error> {
    match fs.handles.get(fh) {
        Some(f) if f.nodeid == nodeid && !f.dir => Ok(()),
        _ => Err(Error::BadHandle),
    }
}

impl<F: AsRef<Shared>> FsEngine<F> for NfsEngine {
    fn start(&mut self, fs: &F, token: Token, req: &mut Request<'_>, _data: &mut Writer<'_>) -> Started {
        let fs = fs.as_ref();
        EngineCell::bump(&self.cell.requests);
        let i = token.index();
        if i >= self.slots.len() {
            // More pending requests than ever before (the server's table grew): kept from now.
            let root = self.root;
            self.slots.resize_with(i + 1, || Slot::new(root));
        }
        if self.slots[i].busy {
            return Started::Done(Err(Error::Io));
        }
        match self.prepare(fs, i, req) {
            Ok(Some(reply)) => return Started::Done(Ok(reply)),
            Err(e) => {
                EngineCell::bump(&self.cell.errors);
                return Started::Done(Err(e));
            }
            Ok(None) => {}
        }
        let Some(conn) = self.conn.as_mut() else {
            EngineCell::bump(&self.cell.errors);
            return Started::Done(Err(Error::Io));
        };
        let slot = &mut self.slots[i];
        slot.token = token;
        slot.busy = true;
        self.busy += 1;
        let payload = match &req.op {
            Op::Write { data, .. } => Some(data.clone()),
            _ => None,
        };
        let tag = i as u32;
        // Requests queue behind a backlog: order is kept.
        let r = if self.backlog.is_empty() {
            send(conn, fs, slot, tag, payload)
        } else {
            Err(CallError::Full.into())
        };
        match r {
            Ok(()) => {
                EngineCell::bump(&self.cell.calls);
                Started::Pending
            }
            Err(SendError::Call(CallError::Full)) => {
                EngineCell::bump(&self.cell.backlogged);
                self.backlog.push_back(tag);
                Started::Pending
            }
            Err(SendError::NoRoom) => {
                fs.unstable.count_waited();
                self.room_wait.push_back(tag);
                Started::Pending
            }
            Err(SendError::Call(e)) => {
                log::debug!("nfs: request not sent: {e}");
                slot.busy = false;
                self.busy -= 1;
                EngineCell::bump(&self.cell.errors);
                Started::Done(Err(Error::Io))
            }
        }
    }

    fn poll(&mut self, fs: &F, done: &mut Completions<'_>) {
        let fs = fs.as_ref();
        if self.busy == 0 && self.background.is_none() {
            return;
        }
        let now = Instant::now();
        if let Some(conn) = self.conn.as_mut() {
            let slices = [VolatileSlice::from(&mut self.replay_buf[..])];
            let mut sink = PollSink {
                fs,
                slots: &mut self.slots,
                done,
                next: &mut self.next,
                later: &mut self.later,
                replay: &slices,
                replay_owner: &mut self.replay_owner,
                busy: &mut self.busy,
                background: &mut self.background,
                background_after: &mut self.background_after,
                cell: &self.cell,
            };
            conn.poll(now, &mut sink);
        }
        let mut next = std::mem::take(&mut self.next);
        for &i in &next {
            self.send_next(fs, i, done);
        }
        next.clear();
        self.next = next;
        // Calls the server was too busy for, once their delay is over.
        let mut k = 0;
        while k < self.later.len() {
            let (i, at) = self.later[k];
            if now >= at {
                self.later.swap_remove(k);
                self.send_next(fs, i, done);
            } else {
                k += 1;
            }
        }
        // The replay buffer is free: the first waiting slot takes it.
        if self.replay_owner.is_none() {
            if let Some(i) = self.replay_wait.pop_front() {
                self.send_next(fs, i, done);
            }
        }
        for _ in 0..self.replay_wait.len() {
            let Some(i) = self.replay_wait.pop_front() else { break };
            if now > self.slots[i as usize].deadline {
                EngineCell::bump(&self.cell.timed_out);
                self.end(fs, i, Err(Error::Io), done);
            } else {
                self.replay_wait.push_back(i);
            }
        }
        self.retry_room(fs, now, done);
        // The backlog, oldest first, while there is room on the connection.
        let mut n = self.backlog.len();
        while n > 0 {
            n -= 1;
            let Some(i) = self.backlog.pop_front() else { break };
            let before = self.backlog.len();
            self.send_next(fs, i, done);
            if self.backlog.len() > before {
                // Still full: it went back to the end; restore the order and stop.
                if let Some(j) = self.backlog.pop_back() {
                    self.backlog.push_front(j);
                }
                break;
            }
        }
        self.maybe_commit(fs, now);
        self.publish();
    }

    fn in_flight(&self) -> usize {
        self.busy
    }

    fn readiness(&self) -> Option<Readiness<'_>> {
        let conn = self.conn.as_ref()?;
        let now = Instant::now();
        let (fd, writable, mut within) = conn.readiness(now);
        // Calls the server was too busy for go again at their time.
        if let Some(at) = self.later.iter().map(|l| l.1).min() {
            within = within.min(at.saturating_duration_since(now));
        }
        if !self.room_wait.is_empty() {
            // Room in the store may come from another poller's COMMIT: no descriptor says so.
            within = within.min(ROOM_LOOK);
        }
        Some(Readiness { fd, writable, within })
    }
}

/// How often a poller blocked on its connection looks whether writes waiting for room in the
/// store can go (the room may come from another poller's COMMIT).
const ROOM_LOOK: std::time::Duration = std::time::Duration::from_millis(1);
