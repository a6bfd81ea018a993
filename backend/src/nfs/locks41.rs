//! Byte-range and flock locks kept by an NFSv4.1 server: the lock state the engines share
//! ([`LockStates`]: a lock stateid per file and lock owner) and the SETLKW requests that wait
//! for a lock another client holds ([`RemoteWaits`], the filesystem's
//! [`RemoteLocks`]).
//!
//! **Owners.** A lock owner on the server is the client id (one per device function, shared by
//! its pollers' sessions) and an owner name: `p` and the FUSE POSIX lock owner for `fcntl`
//! locks, `f` and the FUSE handle for `flock` locks (which the open file owns, as the Linux
//! NFS client maps them: a whole-file lock). So two processes of one guest conflict on the
//! server as they would in one kernel, and every other client of the export (another device,
//! a host's NFS mount) sees them.
//!
//! **Waiting.** A SETLKW is parked by the server ([`crate::server::waits`]) and kept here; the
//! engines take the due ones in turn ([`RemoteWaits::due`]) and send a LOCK for each (the
//! blocking lock types, which tell the server a client waits), a background call with no guest
//! request behind it. Denied, the next try comes after a back-off (5 ms doubling up to 500 ms);
//! granted or failed, the wait ends and the generation moves, so the poller that parked it
//! answers it. A wait cancelled or interrupted while its LOCK is on the wire is let go when the
//! LOCK is granted (the engine sends LOCKU). At most [`MAX_WAITS`] waits at once (`ENOLCK`
//! beyond), and [`MAX_LOCK_STATES`] lock states. A flock owner that changes its lock's type
//! lets the old lock go first, as flock(2) converts ([`LockStates::held`]).
//!
//! **A session's end.** A device reset ends the guest's locks: their states become orphans
//! ([`Locks41::orphan_all`]), which the engines let go in the background (LOCKU of the whole
//! file, FREE_STATEID). DESTROY, or the INIT after the reset, orphans what is left with the
//! opens the handle table forgets (CLOSE) and the silly names of files unlinked while open
//! (REMOVE): [`Orphan`], taken in that order ([`Locks41::take_orphan`]: no CLOSE goes while a
//! lock state from its open may still be held, no REMOVE while the file may still be open).
//! The same mechanism ends what a FLUSH, a RELEASE or a wait's let-go failed to end: a cleanup
//! whose call failed goes again after a back-off, a bounded number of times
//! ([`Locks41::orphan_again`]), since the pollers' renewals keep the lease, and with it whatever
//! is left on the server, for the client's life.
//!
//! **Locks a server lost.** A file whose lock states the server no longer knows (it restarted:
//! found when a request through a handle of it finds its open unknown, or a lock call its lock
//! stateid) is marked ([`Locks41::lose`], [`Locks41::lose_locks`]) until its last handle closes: the engine answers EIO rather than open it
//! again, never letting a write that relied on a lock go through without it.
//!
//! [`Locks41`] holds the three, with the counters the engines keep ([`LockTotals`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::filesystem::{Context, Error, FileLock, LockRequest, LockType, RemoteLocks, Result};
use crate::nfs::keep::NfsKeep;
use crate::nfs::nodes::SILLY_LEN;
use crate::nfs::wire::nfs4::Stateid;
use crate::nfs::wire::Fh;

/// Waits kept at most.
pub const MAX_WAITS: usize = 1024;
/// Lock states (file and lock owner pairs) kept at most: a new one beyond is `ENOLCK`
/// ([`LockStates::full`]). Each is a lock owner's state on the server too, which the guest could
/// otherwise grow without bound (one per process or open file that locks a file, until its
/// FLUSH or the file's last close). The device's own lock table allows as many locks
/// (`locks::MAX_LOCKS`), and every lock state holds, or held, at least one lock.
pub const MAX_LOCK_STATES: usize = 1 << 16;
/// The first back-off of a denied wait; it doubles up to [`MAX_RETRY`].
pub const MIN_RETRY: Duration = Duration::from_millis(5);
/// The longest back-off between two tries of a waiting lock.
pub const MAX_RETRY: Duration = Duration::from_millis(500);

/// Who owns a lock (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A POSIX (`fcntl`) lock of this FUSE lock owner.
    Posix(u64),
    /// A `flock` lock of this FUSE handle.
    Flock(u64),
}

impl Owner {
    /// The owner of `req`'s lock.
    pub fn of(req: &LockRequest) -> Owner {
        if req.flock {
            Owner::Flock(req.fh)
        } else {
            Owner::Posix(req.owner)
        }
    }

    /// The owner an owner name stands for, if it is one of [`Owner::name`]'s.
    pub fn parse(name: &[u8]) -> Option<Owner> {
        let (&k, id) = name.split_first()?;
        let id = u64::from_le_bytes(id.try_into().ok()?);
        match k {
            b'p' => Some(Owner::Posix(id)),
            b'f' => Some(Owner::Flock(id)),
            _ => None,
        }
    }

    /// The owner name sent (`lock_owner4`'s `owner`, beside the client id).
    pub fn name(self) -> [u8; 9] {
        let (k, id) = match self {
            Owner::Posix(o) => (b'p', o),
            Owner::Flock(h) => (b'f', h),
        };
        let mut b = [0u8; 9];
        b[0] = k;
        b[1..].copy_from_slice(&id.to_le_bytes());
        b
    }
}

/// The lock stateids of every file and lock owner, shared by the engines. A lock owner's first
/// lock on a file goes from its open's stateid (`open_to_lock_owner4`); later ones use the lock
/// stateid the server gave then.
#[derive(Debug, Default)]
pub struct LockStates {
    inner: Mutex<HashMap<(u64, Owner), Kept>>,
    /// The records a crash leaves (`crate::nfs::keep`): which nodes hold lock state or lost
    /// it ([`Locks41::lose`]: both fail after a crash), marked as that changes (taken after
    /// `inner`).
    keep: Mutex<Option<Arc<NfsKeep>>>,
    /// Files whose lock states the server lost ([`Locks41::lose`]; taken after `keep`).
    lost: Mutex<Vec<u64>>,
    /// How many, as of the last change (read without the lock: [`Locks41::is_lost`]).
    lost_kept: AtomicUsize,
}

/// A node id's slot in the node table (`nodes::nodeid`: generation << 32 | slot + 1).
fn node_slot(nodeid: u64) -> Option<usize> {
    usize::try_from(nodeid & 0xffff_ffff).ok()?.checked_sub(1)
}

/// A lock state kept: its stateid, the type of the owner's last lock or unlock through it
/// (what a flock owner holds, the whole file: [`LockStates::held`]), the FUSE handle whose
/// open it came from (`open_to_lock_owner4`: [`LockStates::forget_from`]), and the ranges the
/// owner holds through it (what a reclaim after a server restart takes again: [`Held`]).
#[derive(Clone, Debug)]
struct Kept {
    stateid: Stateid,
    typ: LockType,
    from: u64,
    held: Held,
}

/// Ranges a lock owner holds on one file at most, as the device keeps them for a reclaim: an
/// owner with more (POSIX locks of alternating types, or holes punched in one) is not
/// reclaimable, and its file's locks are lost at a server restart as without reclaim.
pub const MAX_HELD_RANGES: usize = 32;

/// The ranges a lock owner holds on a file (inclusive ends, `OFFSET_MAX`: to the end), sorted
/// and apart, as POSIX keeps them: a lock replaces what it covers, an unlock cuts it out.
/// `None` once past [`MAX_HELD_RANGES`] (unknown: not reclaimable).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held(Option<Vec<(u64, u64, LockType)>>);

impl Held {
    fn new() -> Held {
        Held(Some(Vec::new()))
    }

    /// The ranges, if known.
    pub fn ranges(&self) -> Option<&[(u64, u64, LockType)]> {
        self.0.as_deref()
    }

    /// `lock` taken (or, `LockType::Unlock`, let go) by the owner.
    pub fn apply(&mut self, lock: &FileLock) {
        let Some(v) = self.0.as_mut() else { return };
        let (s, e) = (lock.start, lock.end.max(lock.start));
        let mut out: Vec<(u64, u64, LockType)> = Vec::with_capacity(v.len() + 2);
        for &(a, b, t) in v.iter() {
            if b < s || a > e {
                out.push((a, b, t));
                continue;
            }
            if a < s {
                out.push((a, s - 1, t));
            }
            if b > e {
                out.push((e + 1, b, t));
            }
        }
        if lock.typ != LockType::Unlock {
            out.push((s, e, lock.typ));
        }
        out.sort_unstable_by_key(|r| r.0);
        // Neighbours of one type are one range.
        let mut merged: Vec<(u64, u64, LockType)> = Vec::with_capacity(out.len());
        for r in out {
            match merged.last_mut() {
                Some(l) if l.2 == r.2 && l.1 != u64::MAX && l.1 + 1 == r.0 => l.1 = r.1,
                _ => merged.push(r),
            }
        }
        self.0 = (merged.len() <= MAX_HELD_RANGES).then_some(merged);
    }
}

impl LockStates {
    fn lock(&self) -> MutexGuard<'_, HashMap<(u64, Owner), Kept>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn kept(&self) -> MutexGuard<'_, Option<Arc<NfsKeep>>> {
        self.keep.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lost(&self) -> MutexGuard<'_, Vec<u64>> {
        self.lost.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks in the records whether each of `nodes` holds lock state now, or lost it (`g`:
    /// the table).
    fn mark(&self, g: &HashMap<(u64, Owner), Kept>, nodes: &[u64]) {
        let keep = self.kept();
        let Some(k) = keep.as_ref() else { return };
        let lost = self.lost();
        for &n in nodes {
            if let Some(i) = node_slot(n) {
                // A lock state that holds no range is no lock to lose.
                let holds =
                    g.iter().any(|((m, _), k)| *m == n && k.held.ranges().is_none_or(|r| !r.is_empty()));
                k.node_locked(i, holds || lost.contains(&n));
            }
        }
    }

    /// Marks `nodes` in the records anew (their lost marks changed).
    fn remark(&self, nodes: &[u64]) {
        let g = self.lock();
        self.mark(&g, nodes);
    }

    /// Keeps the marks in `keep` from now on, writing the present ones first (`None`: stops).
    pub(crate) fn keep_in(&self, keep: Option<Arc<NfsKeep>>) {
        let g = self.lock();
        *self.kept() = keep;
        let mut nodes: Vec<u64> = g.keys().map(|(n, _)| *n).collect();
        nodes.extend(self.lost().iter());
        self.mark(&g, &nodes);
    }

    /// The lock stateid of `owner` on node `nodeid`, if it has one.
    pub fn get(&self, nodeid: u64, owner: Owner) -> Option<Stateid> {
        self.lock().get(&(nodeid, owner)).map(|k| k.stateid)
    }

    /// The type of `owner`'s last lock (or unlock, `LockType::Unlock`) on `nodeid` through its
    /// kept lock state: for a flock owner, what it holds of the whole file.
    pub fn held(&self, nodeid: u64, owner: Owner) -> Option<LockType> {
        self.lock().get(&(nodeid, owner)).map(|k| k.typ)
    }

    /// The server gave (or updated) `owner`'s lock stateid on `nodeid`, for `lock` (or an
    /// unlock: `LockType::Unlock`) through FUSE handle `fh` (a new state came from its open; one
    /// kept keeps the handle it came from).
    /// An unlock of a state not kept (forgotten meanwhile: a FLUSH, a loss) keeps nothing.
    pub fn set(&self, nodeid: u64, owner: Owner, stateid: Stateid, lock: &FileLock, fh: u64) {
        let mut g = self.lock();
        if lock.typ == LockType::Unlock && !g.contains_key(&(nodeid, owner)) {
            return;
        }
        let k = g.entry((nodeid, owner)).or_insert_with(|| Kept {
            stateid,
            typ: lock.typ,
            from: fh,
            held: Held::new(),
        });
        k.stateid = stateid;
        k.typ = lock.typ;
        k.held.apply(lock);
        // Marked before the lock is answered: a crash after it finds the file locked (and one
        // after its last range went, not).
        self.mark(&g, &[nodeid]);
    }

    /// Whether any lock state of `nodeid` is kept.
    pub fn has_node(&self, nodeid: u64) -> bool {
        self.lock().keys().any(|(n, _)| *n == nodeid)
    }

    /// Every lock state kept, for a reclaim: node id, owner, stateid, the FUSE handle whose
    /// open it came from, and the ranges held.
    pub fn all(&self) -> Vec<(u64, Owner, Stateid, u64, Held)> {
        self.lock().iter().map(|(&(n, o), k)| (n, o, k.stateid, k.from, k.held.clone())).collect()
    }

    /// `owner`'s lock state on `nodeid` was reclaimed as `new`: kept in place of `old` if it is
    /// still `old` (the same `other`); whether it was (`false`: forgotten or changed meanwhile,
    /// the new one is the caller's to let go).
    pub fn reclaimed(&self, nodeid: u64, owner: Owner, old: Stateid, new: Stateid) -> bool {
        let mut g = self.lock();
        match g.get_mut(&(nodeid, owner)) {
            Some(k) if k.stateid.other == old.other => {
                k.stateid = new;
                true
            }
            _ => false,
        }
    }

    /// Whether `owner`'s lock state on `nodeid` is still `s` (the same `other`).
    pub fn is(&self, nodeid: u64, owner: Owner, s: Stateid) -> bool {
        self.lock().get(&(nodeid, owner)).is_some_and(|k| k.stateid.other == s.other)
    }

    /// Every lock state of `nodeid` that came from FUSE handle `fh`'s open (its RELEASE: the
    /// CLOSE of that open would fail LOCKS_HELD while one is held, and nobody's FLUSH names an
    /// OFD lock's owner), forgotten.
    pub fn forget_from(&self, nodeid: u64, fh: u64) -> Vec<Stateid> {
        let mut g = self.lock();
        let gone: Vec<Owner> =
            g.iter().filter(|((n, _), k)| *n == nodeid && k.from == fh).map(|((_, o), _)| *o).collect();
        let out = gone.iter().filter_map(|o| g.remove(&(nodeid, *o)).map(|k| k.stateid)).collect();
        self.mark(&g, &[nodeid]);
        out
    }

    /// `owner`'s lock state on `nodeid` is gone (freed, or the server lost it).
    pub fn forget(&self, nodeid: u64, owner: Owner) -> Option<Stateid> {
        let mut g = self.lock();
        let out = g.remove(&(nodeid, owner)).map(|k| k.stateid);
        self.mark(&g, &[nodeid]);
        out
    }

    /// Every lock state of `nodeid` (its last handle closed: its locks went with it).
    pub fn forget_node(&self, nodeid: u64) -> Vec<(Owner, Stateid)> {
        let mut g = self.lock();
        let gone: Vec<(Owner, Stateid)> =
            g.iter().filter(|((n, _), _)| *n == nodeid).map(|((_, o), k)| (*o, k.stateid)).collect();
        for (o, _) in &gone {
            g.remove(&(nodeid, *o));
        }
        self.mark(&g, &[nodeid]);
        gone
    }

    /// Every lock state (the session ended), each with its node id and owner.
    pub fn take_all(&self) -> Vec<(u64, Owner, Stateid)> {
        let mut g = self.lock();
        let all: Vec<(u64, Owner, Stateid)> = g.drain().map(|((n, o), k)| (n, o, k.stateid)).collect();
        let nodes: Vec<u64> = all.iter().map(|a| a.0).collect();
        self.mark(&g, &nodes);
        all
    }

    /// Whether a new lock state for `owner` on `nodeid` would pass [`MAX_LOCK_STATES`]
    /// (checked before its first LOCK is sent: calls in flight may pass it by as many as
    /// the engines' slots).
    pub fn full(&self, nodeid: u64, owner: Owner) -> bool {
        let g = self.lock();
        g.len() >= MAX_LOCK_STATES && !g.contains_key(&(nodeid, owner))
    }

    /// Lock states kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A lock state as data (a live update: the server's lock stateid, still the same client's).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LockStateSaved {
    /// The file.
    pub nodeid: u64,
    /// The owner: `p` (POSIX) or `f` (flock), and its number.
    pub owner: (char, u64),
    /// The lock stateid: seqid and `other`.
    pub stateid: (u32, [u8; 12]),
    /// The type of the owner's last lock or unlock through it: `r`, `w` or `u`.
    pub typ: char,
    /// The FUSE handle whose open it came from.
    pub from: u64,
    /// The ranges held (start, inclusive end, `r` or `w`), `None`: more than are kept.
    pub held: Option<Vec<(u64, u64, char)>>,
}

/// The lock state of a function as data ([`Locks41::save`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Locks41State {
    /// Every lock state kept.
    pub states: Vec<LockStateSaved>,
    /// Files whose locks the server lost (EIO until their last close).
    pub lost: Vec<u64>,
    /// The SETLKW requests waiting for a lock on the server (their descriptor chains move
    /// with the device's state, under these ids).
    #[serde(default)]
    pub waits: Vec<WaitSaved>,
    /// The last wait id given.
    #[serde(default)]
    pub next_wait: u64,
}

/// A SETLKW waiting on the server, as data ([`RemoteWaits::save`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WaitSaved {
    /// The wait id (the parked request's token names it).
    pub id: u64,
    /// The FUSE unique of the request.
    pub unique: u64,
    /// The file.
    pub nodeid: u64,
    /// The FUSE handle the lock comes through.
    pub fh: u64,
    /// The owner: `p` (POSIX) or `f` (flock), and its number.
    pub owner: (char, u64),
    /// The range (start, inclusive end), its type (`r` or `w`) and the pid.
    pub lock: (u64, u64, char, u32),
    /// The caller's credential.
    pub uid: u32,
    /// The caller's group.
    pub gid: u32,
    /// `None`: still waiting (tried again at once by the new process); `Some(0)`: granted,
    /// `Some(errno)`: failed, its answer not yet taken by the parked request.
    pub ended: Option<i32>,
}

fn owner_pair(o: Owner) -> (char, u64) {
    match o {
        Owner::Posix(n) => ('p', n),
        Owner::Flock(h) => ('f', h),
    }
}

fn owner_of_pair(p: (char, u64)) -> Result<Owner> {
    match p {
        ('p', n) => Ok(Owner::Posix(n)),
        ('f', h) => Ok(Owner::Flock(h)),
        _ => Err(Error::InvalidArgument),
    }
}

fn type_char(t: LockType) -> char {
    match t {
        LockType::Read => 'r',
        LockType::Write => 'w',
        LockType::Unlock => 'u',
    }
}

fn char_type(c: char) -> Result<LockType> {
    match c {
        'r' => Ok(LockType::Read),
        'w' => Ok(LockType::Write),
        'u' => Ok(LockType::Unlock),
        _ => Err(Error::InvalidArgument),
    }
}

/// A try of a waiting lock, for an engine to send ([`RemoteWaits::due`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The wait.
    pub id: u64,
    /// The file's node id.
    pub nodeid: u64,
    /// The FUSE handle the lock comes through (its open stateid).
    pub fh: u64,
    /// The lock's owner.
    pub owner: Owner,
    /// The range and type.
    pub lock: FileLock,
    /// The caller's credential.
    pub uid: u32,
    /// The caller's group.
    pub gid: u32,
}

/// How a try went ([`RemoteWaits::attempted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tried {
    /// LOCK granted.
    Granted,
    /// NFS4ERR_DENIED (or DELAY, GRACE): try again later.
    Denied,
    /// Another error: the wait ends with it.
    Failed(Error),
}

/// What the engine does after a try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Nothing more.
    Done,
    /// The lock was granted for a wait that was cancelled or interrupted meanwhile: let it go
    /// (LOCKU of the attempt's range).
    LetGo,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    /// Cancelled or interrupted (with the error to answer, `None`: no answer) while a try
    /// was on the wire.
    Dropping(Option<Error>),
    Ended(std::result::Result<(), Error>),
}

#[derive(Clone, Copy, Debug)]
struct Wait {
    id: u64,
    unique: u64,
    nodeid: u64,
    fh: u64,
    owner: Owner,
    lock: FileLock,
    uid: u32,
    gid: u32,
    state: State,
    /// A try is on the wire.
    out: bool,
    next_at: Instant,
    backoff: Duration,
}

#[derive(Debug, Default)]
struct Table {
    waits: Vec<Wait>,
    next_id: u64,
}

/// The SETLKW requests waiting for a lock on the server (see the module documentation).
#[derive(Debug, Default)]
pub struct RemoteWaits {
    inner: Mutex<Table>,
    /// `inner`'s waits, as of the last time its lock was let go (read without the lock: an
    /// engine's poll round looks here first, [`Locks41::idle`]).
    kept: AtomicUsize,
    generation: AtomicU64,
    /// How many tries were sent, and denied (data for the statistics).
    tries: AtomicU64,
    denied: AtomicU64,
    /// Saved for a live update ([`RemoteWaits::save`]): no try goes until
    /// [`RemoteWaits::thaw`] (the update called off), so the successor is the only one that
    /// tries them.
    frozen: AtomicBool,
}

/// A locked [`Table`] that publishes its length to `kept` as it is let go.
struct TableGuard<'a> {
    g: MutexGuard<'a, Table>,
    kept: &'a AtomicUsize,
}

impl std::ops::Deref for TableGuard<'_> {
    type Target = Table;
    fn deref(&self) -> &Table {
        &self.g
    }
}

impl std::ops::DerefMut for TableGuard<'_> {
    fn deref_mut(&mut self) -> &mut Table {
        &mut self.g
    }
}

impl Drop for TableGuard<'_> {
    fn drop(&mut self) {
        self.kept.store(self.g.waits.len(), Ordering::Release);
    }
}

impl RemoteWaits {
    fn lock(&self) -> TableGuard<'_> {
        TableGuard { g: self.inner.lock().unwrap_or_else(|e| e.into_inner()), kept: &self.kept }
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The next wait due for a try at `now`, marked as tried (the engine sends its LOCK and
    /// reports with [`RemoteWaits::attempted`]).
    pub fn due(&self, now: Instant) -> Option<Attempt> {
        let mut g = self.lock();
        if self.frozen.load(Ordering::Acquire) {
            return None;
        }
        let w = g.waits.iter_mut().find(|w| w.state == State::Waiting && !w.out && w.next_at <= now)?;
        w.out = true;
        self.tries.fetch_add(1, Ordering::Relaxed);
        Some(Attempt {
            id: w.id,
            nodeid: w.nodeid,
            fh: w.fh,
            owner: w.owner,
            lock: w.lock,
            uid: w.uid,
            gid: w.gid,
        })
    }

    /// When the next try is due (for a poller that would otherwise sleep).
    pub fn next_due(&self) -> Option<Instant> {
        let g = self.lock();
        if self.frozen.load(Ordering::Acquire) {
            return None;
        }
        g.waits.iter().filter(|w| w.state == State::Waiting && !w.out).map(|w| w.next_at).min()
    }

    /// The try of wait `id` went `how`; `now` dates a retry.
    pub fn attempted(&self, id: u64, how: Tried, now: Instant) -> After {
        let mut g = self.lock();
        let Some(w) = g.waits.iter_mut().find(|w| w.id == id) else {
            // Forgotten meanwhile (cancelled with no try out cannot happen; be safe).
            return if how == Tried::Granted { After::LetGo } else { After::Done };
        };
        w.out = false;
        match (w.state, how) {
            (State::Dropping(answer), _) => {
                let after = if how == Tried::Granted { After::LetGo } else { After::Done };
                match answer {
                    Some(e) => w.state = State::Ended(Err(e)),
                    None => g.waits.retain(|w| w.id != id),
                }
                self.bump();
                after
            }
            (State::Waiting, Tried::Granted) => {
                w.state = State::Ended(Ok(()));
                self.bump();
                After::Done
            }
            (State::Waiting, Tried::Failed(e)) => {
                w.state = State::Ended(Err(e));
                self.bump();
                After::Done
            }
            (State::Waiting, Tried::Denied) => {
                self.denied.fetch_add(1, Ordering::Relaxed);
                w.next_at = now + w.backoff;
                w.backoff = (w.backoff * 2).min(MAX_RETRY);
                After::Done
            }
            (State::Ended(_), _) => After::Done,
        }
    }

    /// Waits kept now.
    pub fn len(&self) -> usize {
        self.lock().waits.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tries sent and tries denied so far.
    pub fn tries(&self) -> (u64, u64) {
        (self.tries.load(Ordering::Relaxed), self.denied.load(Ordering::Relaxed))
    }

    /// Every wait as data, and the last id given, for a process that goes on as the same
    /// client (a live update); from now on no try goes ([`RemoteWaits::thaw`] lets them go
    /// again). `Err` while a try is on the wire (its answer would be this process's only).
    pub fn save(&self) -> std::result::Result<(Vec<WaitSaved>, u64), String> {
        let g = self.lock();
        if g.waits.iter().any(|w| w.out) {
            return Err("a try of a SETLKW waiting on the NFSv4.1 server is on the wire".into());
        }
        let waits = g
            .waits
            .iter()
            .map(|w| WaitSaved {
                id: w.id,
                unique: w.unique,
                nodeid: w.nodeid,
                fh: w.fh,
                owner: owner_pair(w.owner),
                lock: (w.lock.start, w.lock.end, type_char(w.lock.typ), w.lock.pid),
                uid: w.uid,
                gid: w.gid,
                ended: match w.state {
                    State::Ended(Ok(())) => Some(0),
                    State::Ended(Err(e)) => Some(e.errno()),
                    // No try is out, so none is being dropped.
                    State::Waiting | State::Dropping(_) => None,
                },
            })
            .collect();
        // Under the table's lock: an engine's `due` after this sees it.
        self.frozen.store(true, Ordering::Release);
        Ok((waits, g.next_id))
    }

    /// The update the waits were saved for was called off: they are tried again here.
    pub fn thaw(&self) {
        if self.frozen.swap(false, Ordering::AcqRel) {
            self.bump();
        }
    }

    /// Waits a predecessor saved ([`RemoteWaits::save`]), into this empty table; each is tried
    /// at once. `Err` for a bad owner, type, range or id.
    fn restore(&self, waits: &[WaitSaved], next_id: u64) -> Result<()> {
        if waits.len() > MAX_WAITS {
            return Err(Error::InvalidArgument);
        }
        let mut g = self.lock();
        let now = Instant::now();
        for w in waits {
            let (start, end, typ, pid) = w.lock;
            let typ = char_type(typ)?;
            if w.id == 0 || w.id > next_id || start > end || typ == LockType::Unlock {
                return Err(Error::InvalidArgument);
            }
            if g.waits.iter().any(|o| o.id == w.id) {
                return Err(Error::InvalidArgument);
            }
            let state = match w.ended {
                None => State::Waiting,
                Some(0) => State::Ended(Ok(())),
                Some(e) => State::Ended(Err(Error::from_errno(e))),
            };
            g.waits.push(Wait {
                id: w.id,
                unique: w.unique,
                nodeid: w.nodeid,
                fh: w.fh,
                owner: owner_of_pair(w.owner)?,
                lock: FileLock { start, end, typ, pid },
                uid: w.uid,
                gid: w.gid,
                state,
                out: false,
                next_at: now,
                backoff: MIN_RETRY,
            });
        }
        g.next_id = next_id;
        drop(g);
        self.bump();
        Ok(())
    }

    /// Ends wait `id` without a lock: with `answer` (`EINTR`), or none (cancelled).
    fn drop_wait(&self, g: &mut Table, id: u64, answer: Option<Error>) -> bool {
        let Some(w) = g.waits.iter_mut().find(|w| w.id == id) else { return false };
        if w.state != State::Waiting {
            if answer.is_none() {
                // Cancelled after it ended (or while interrupted): nobody will ask for its
                // answer, and it must not hold one of the [`MAX_WAITS`] for the process's life.
                // A granted one's lock state is kept in [`LockStates`] (set before the wait
                // ended), so it goes with the session's other locks ([`Locks41::orphan_all`]
                // at the reset, or at the next INIT or DESTROY); one interrupted with its try
                // out is let go when the try is granted ([`RemoteWaits::attempted`]: LetGo).
                g.waits.retain(|w| w.id != id);
            }
            return false;
        }
        if w.out {
            w.state = State::Dropping(answer);
        } else {
            match answer {
                Some(e) => w.state = State::Ended(Err(e)),
                None => g.waits.retain(|w| w.id != id),
            }
        }
        self.bump();
        true
    }
}

impl RemoteLocks for RemoteWaits {
    fn wait(&self, ctx: &Context, ino: u64, lock: &LockRequest, unique: u64) -> Result<u64> {
        let mut g = self.lock();
        if g.waits.len() >= MAX_WAITS {
            return Err(Error::Os(libc::ENOLCK));
        }
        g.next_id += 1;
        let id = g.next_id;
        g.waits.push(Wait {
            id,
            unique,
            nodeid: ino,
            fh: lock.fh,
            owner: Owner::of(lock),
            lock: lock.lock,
            uid: ctx.uid,
            gid: ctx.gid,
            state: State::Waiting,
            out: false,
            next_at: Instant::now(),
            backoff: MIN_RETRY,
        });
        drop(g);
        // The first try goes at the engines' next poll.
        self.bump();
        Ok(id)
    }

    fn poll(&self, id: u64) -> Option<Result<()>> {
        let mut g = self.lock();
        let at = g.waits.iter().position(|w| w.id == id);
        let Some(at) = at else {
            // Not kept here (lost): the request ends rather than wait for ever.
            return Some(Err(Error::Io));
        };
        match g.waits[at].state {
            State::Ended(r) => {
                g.waits.swap_remove(at);
                Some(r)
            }
            _ => None,
        }
    }

    fn cancel(&self, id: u64) {
        let mut g = self.lock();
        self.drop_wait(&mut g, id, None);
    }

    fn interrupt(&self, unique: u64) -> bool {
        let mut g = self.lock();
        let Some(id) = g.waits.iter().find(|w| w.unique == unique && w.state == State::Waiting).map(|w| w.id)
        else {
            return false;
        };
        self.drop_wait(&mut g, id, Some(Error::Os(libc::EINTR)))
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn unique_of(&self, id: u64) -> Option<u64> {
        self.lock().waits.iter().find(|w| w.id == id).map(|w| w.unique)
    }
}

/// What the engines did with locks, all pollers together (plain numbers, `NfsStats::locks`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LockTotals {
    /// LOCK, LOCKT and LOCKU answered (guest requests and the waits' tries).
    pub calls: u64,
    /// Of them, NFS4ERR_DENIED (a conflicting lock).
    pub denied: u64,
    /// Lock states let go (LOCKU of the whole file and FREE_STATEID: FLUSH, RELEASE, the end
    /// of a session).
    pub freed: u64,
    /// Lock stateids the server no longer knew (forgotten, their file marked lost:
    /// [`Locks41::lose_locks`]).
    pub stale: u64,
    /// SETLKW requests that waited on the server.
    pub waits: u64,
    /// Tries of waiting locks sent.
    pub tries: u64,
    /// Of them, denied (tried again later).
    pub tries_denied: u64,
    /// Reclaims after a server restart (each ended with RECLAIM_COMPLETE).
    pub reclaims: u64,
    /// Opens reclaimed in the server's grace period.
    pub opens_reclaimed: u64,
    /// Opens whose reclaim failed (opened anew when next used, if their file had no locks).
    pub opens_not_reclaimed: u64,
    /// Lock states reclaimed with every range they held.
    pub locks_reclaimed: u64,
    /// Lock states whose reclaim failed (their file EIO until its last close).
    pub locks_not_reclaimed: u64,
}

/// The NFSv4.1 lock state of one device function, shared by its engines: the lock stateids,
/// the waits, the orphans of an ended session, and the counters.
#[derive(Debug, Default)]
pub struct Locks41 {
    /// The lock stateid of every file and lock owner.
    pub states: LockStates,
    /// The SETLKW requests waiting for a lock on the server.
    pub waits: RemoteWaits,
    orphans: Mutex<Orphans>,
    /// Orphans waiting or on the wire, as of the last time `orphans` was let go (read without
    /// the lock, [`Locks41::idle`]).
    orphans_kept: AtomicUsize,
    calls: AtomicU64,
    denied: AtomicU64,
    freed: AtomicU64,
    stale: AtomicU64,
    waited: AtomicU64,
    reclaims: AtomicU64,
    opens_reclaimed: AtomicU64,
    opens_not_reclaimed: AtomicU64,
    locks_reclaimed: AtomicU64,
    locks_not_reclaimed: AtomicU64,
    /// The process of each POSIX lock owner's last lock granted here (a GETLK that finds a
    /// lock of this device's in the way names it, as a local lock would; another client's is
    /// pid 0). Bounded: forgotten all at once past [`MAX_PIDS`] owners.
    pids: Mutex<HashMap<u64, u32>>,
}

/// Owners whose pid is kept at most ([`Locks41::note_pid`]).
pub const MAX_PIDS: usize = 4096;

/// A counter of [`Locks41`] ([`Locks41::count`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// A lock call answered.
    Call,
    /// A lock call denied.
    Denied,
    /// A lock state let go.
    Freed,
    /// A lock stateid the server no longer knew.
    Stale,
    /// A reclaim after a server restart ended (RECLAIM_COMPLETE sent).
    Reclaim,
    /// An open reclaimed (CLAIM_PREVIOUS).
    OpenReclaimed,
    /// An open not reclaimed.
    OpenNotReclaimed,
    /// A lock state reclaimed (every range it held: LOCK with `reclaim`).
    LockReclaimed,
    /// A lock state not reclaimed (its file's locks lost).
    LockNotReclaimed,
}

/// State of an ended session for the engines to end on the server (background calls, root's
/// credential: the tables keep no caller's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Orphan {
    /// A lock state, with its file's handle: LOCKU of the whole file, FREE_STATEID.
    Lock(Fh, Stateid),
    /// An open, with its file's handle: CLOSE.
    Open(Fh, Stateid),
    /// A silly name (a file unlinked while open) in this directory: REMOVE.
    Silly(Fh, [u8; SILLY_LEN]),
    /// A lock granted to a wait that ended meanwhile, whose LOCKU failed: LOCKU of this range
    /// under the owner's lock state (which stays: the owner may hold other locks).
    Unlock(Fh, Stateid, FileLock),
}

impl Orphan {
    /// The order orphans end in: lock states, then opens, then silly names.
    pub fn phase(&self) -> usize {
        match self {
            Orphan::Lock(..) | Orphan::Unlock(..) => 0,
            Orphan::Open(..) => 1,
            Orphan::Silly(..) => 2,
        }
    }
}

/// Tries of one orphan at most ([`Locks41::orphan_again`]): then it is left to the lease.
pub const MAX_ORPHAN_TRIES: u8 = 5;
/// The wait before an orphan's second try; it doubles with each.
pub const ORPHAN_RETRY: Duration = Duration::from_millis(200);

/// An orphan waiting: its tries so far, and when it may go.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    orphan: Orphan,
    tries: u8,
    at: Instant,
}

/// The orphans waiting, and how many of each phase are on the wire.
#[derive(Debug, Default)]
struct Orphans {
    waiting: Vec<Waiting>,
    out: [u32; 3],
}

/// A locked [`Orphans`] that publishes how many there are to `kept` as it is let go.
struct OrphansGuard<'a> {
    g: MutexGuard<'a, Orphans>,
    kept: &'a AtomicUsize,
}

impl std::ops::Deref for OrphansGuard<'_> {
    type Target = Orphans;
    fn deref(&self) -> &Orphans {
        &self.g
    }
}

impl std::ops::DerefMut for OrphansGuard<'_> {
    fn deref_mut(&mut self) -> &mut Orphans {
        &mut self.g
    }
}

impl Drop for OrphansGuard<'_> {
    fn drop(&mut self) {
        let n = self.g.waiting.len() + self.g.out.iter().map(|&n| n as usize).sum::<usize>();
        self.kept.store(n, Ordering::Release);
    }
}

impl Orphans {
    /// The phase whose orphans may go (the first with any waiting, once no orphan of an
    /// earlier phase is out).
    fn phase(&self) -> Option<usize> {
        let phase = self.waiting.iter().map(|w| w.orphan.phase()).min()?;
        (!self.out[..phase].iter().any(|&n| n > 0)).then_some(phase)
    }

    /// The index of the next orphan that may go at `now`.
    fn next(&self, now: Instant) -> Option<usize> {
        let phase = self.phase()?;
        self.waiting.iter().position(|w| w.orphan.phase() == phase && w.at <= now)
    }
}

impl Locks41 {
    fn orphans(&self) -> OrphansGuard<'_> {
        OrphansGuard { g: self.orphans.lock().unwrap_or_else(|e| e.into_inner()), kept: &self.orphans_kept }
    }

    /// Nothing for the engines' background slots: no orphan waits or is out, no SETLKW waits.
    /// Two atomic loads: every engine asks at every poll round.
    pub fn idle(&self) -> bool {
        self.orphans_kept.load(Ordering::Acquire) == 0 && self.waits.kept.load(Ordering::Acquire) == 0
    }

    fn lost(&self) -> MutexGuard<'_, Vec<u64>> {
        self.states.lost()
    }

    /// A lock of `owner` was granted to process `pid`.
    pub fn note_pid(&self, owner: Owner, pid: u32) {
        let Owner::Posix(o) = owner else { return };
        let mut g = self.pids.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() >= MAX_PIDS && !g.contains_key(&o) {
            g.clear();
        }
        g.insert(o, pid);
    }

    /// The process of `owner`'s last lock granted here (0: unknown).
    pub fn pid_of(&self, owner: Owner) -> u32 {
        let Owner::Posix(o) = owner else { return 0 };
        self.pids.lock().unwrap_or_else(|e| e.into_inner()).get(&o).copied().unwrap_or(0)
    }

    /// Counts one `c`.
    pub fn count(&self, c: Counter) {
        let a = match c {
            Counter::Call => &self.calls,
            Counter::Denied => &self.denied,
            Counter::Freed => &self.freed,
            Counter::Stale => &self.stale,
            Counter::Reclaim => &self.reclaims,
            Counter::OpenReclaimed => &self.opens_reclaimed,
            Counter::OpenNotReclaimed => &self.opens_not_reclaimed,
            Counter::LockReclaimed => &self.locks_reclaimed,
            Counter::LockNotReclaimed => &self.locks_not_reclaimed,
        };
        a.fetch_add(1, Ordering::Relaxed);
    }

    /// The session ended: every lock state becomes an orphan to let go, with its file's
    /// handle (`fh` of a node id: from the node table, before it forgets them).
    pub fn orphan_all(&self, fh: impl Fn(u64) -> Option<Fh>) {
        let all = self.states.take_all();
        let mut o = self.orphans();
        let now = Instant::now();
        for (node, _, s) in all {
            match fh(node) {
                Some(f) => o.waiting.push(Waiting { orphan: Orphan::Lock(f, s), tries: 0, at: now }),
                None => log::debug!("nfs4.1: the lock state of node {node} has no handle: left to the lease"),
            }
        }
    }

    /// The session ended with `orphan` still on the server: the engines end it.
    pub fn orphan(&self, orphan: Orphan) {
        self.orphans().waiting.push(Waiting { orphan, tries: 0, at: Instant::now() });
    }

    /// An orphan to end at `now`, if any may go (see [`Orphan::phase`]), with its tries so
    /// far; the engine reports its end with [`Locks41::orphan_ended`], after
    /// [`Locks41::orphan_again`] if it failed.
    pub fn take_orphan(&self, now: Instant) -> Option<(Orphan, u8)> {
        let mut o = self.orphans();
        let i = o.next(now)?;
        let w = o.waiting.swap_remove(i);
        o.out[w.orphan.phase()] += 1;
        Some((w.orphan, w.tries))
    }

    /// `orphan`, taken after `tries` tries, could not be sent: it waits again, untried.
    pub fn put_back(&self, orphan: Orphan, tries: u8) {
        self.orphans().waiting.push(Waiting { orphan, tries, at: Instant::now() });
    }

    /// `orphan`'s try (after `tries` before it) failed, or a release's LOCKU or CLOSE did:
    /// it goes again after a back-off, at most [`MAX_ORPHAN_TRIES`] tries in all (then it is
    /// left to the lease, which the pollers' renewals keep: logged). Called before
    /// [`Locks41::orphan_ended`] of the failed try, so no later phase goes in between.
    pub fn orphan_again(&self, orphan: Orphan, tries: u8) {
        let tries = tries.saturating_add(1);
        if tries >= MAX_ORPHAN_TRIES {
            log::warn!("nfs4.1: {orphan:?} failed {tries} times: left on the server");
            return;
        }
        let at = Instant::now() + ORPHAN_RETRY * (1 << (tries - 1));
        self.orphans().waiting.push(Waiting { orphan, tries, at });
    }

    /// When the next orphan may go, if any waits (for a poller that would otherwise sleep).
    pub fn next_orphan_at(&self) -> Option<Instant> {
        let o = self.orphans();
        let phase = o.phase()?;
        o.waiting.iter().filter(|w| w.orphan.phase() == phase).map(|w| w.at).min()
    }

    /// The call of an orphan of `phase` ended (answered, failed, or abandoned).
    pub fn orphan_ended(&self, phase: usize) {
        if let Some(n) = self.orphans().out.get_mut(phase) {
            *n = n.saturating_sub(1);
        }
    }

    /// Whether an orphan may be taken now.
    pub fn has_orphans(&self) -> bool {
        self.orphans().next(Instant::now()).is_some()
    }

    /// Orphans waiting or on the wire.
    pub fn orphans_left(&self) -> usize {
        let o = self.orphans();
        o.waiting.len() + o.out.iter().map(|&n| n as usize).sum::<usize>()
    }

    /// The server lost the lock states of node `nodeid` (it restarted): they are forgotten,
    /// and the file marked until its last handle closes ([`Locks41::found`]). Whether it had
    /// any (or was marked already).
    pub fn lose(&self, nodeid: u64) -> bool {
        let had = self.states.has_node(nodeid);
        if had {
            // Marked first: the records never show the file neither locked nor lost.
            self.lose_locks(nodeid);
        }
        self.states.forget_node(nodeid);
        had || self.is_lost(nodeid)
    }

    /// Whether node `nodeid` is marked ([`Locks41::lose`], [`Locks41::lose_locks`]): a READ,
    /// WRITE or size change through a handle of it is EIO. One atomic load while no file is.
    pub fn is_lost(&self, nodeid: u64) -> bool {
        self.states.lost_kept.load(Ordering::Acquire) != 0 && self.lost().contains(&nodeid)
    }

    /// A lock state of node `nodeid` was found unknown to the server (forgotten by the
    /// caller): the file is marked as [`Locks41::lose`] marks it, whether or not another lock
    /// state of it is kept. Its other lock states are kept (the next READ or WRITE that finds
    /// the open lost forgets them), so a LOCKU under a state the server still holds is sent.
    pub fn lose_locks(&self, nodeid: u64) {
        {
            let mut lost = self.lost();
            if lost.contains(&nodeid) {
                return;
            }
            lost.push(nodeid);
            self.states.lost_kept.store(lost.len(), Ordering::Release);
        }
        self.states.remark(&[nodeid]);
    }

    /// The last handle of `nodeid` closed: its mark goes.
    pub fn found(&self, nodeid: u64) {
        {
            let mut lost = self.lost();
            if !lost.contains(&nodeid) {
                return;
            }
            lost.retain(|&n| n != nodeid);
            self.states.lost_kept.store(lost.len(), Ordering::Release);
        }
        self.states.remark(&[nodeid]);
    }

    /// The session ended: every handle closed, every mark goes.
    pub fn found_all(&self) {
        let gone = {
            let mut lost = self.lost();
            self.states.lost_kept.store(0, Ordering::Release);
            std::mem::take(&mut *lost)
        };
        self.states.remark(&gone);
    }

    /// The lock state as data, with the SETLKWs waiting on the server, for a process that goes
    /// on as the same client (a live update); from then on no try goes here until
    /// [`RemoteWaits::thaw`]. `Err` while something is under way that is not data: a try of a
    /// waiting SETLKW on the wire, a cleanup (an orphan) to send or on the wire.
    pub fn save(&self) -> std::result::Result<Locks41State, String> {
        if self.orphans_left() > 0 {
            return Err("NFSv4.1 opens or locks of an ended session are being let go".into());
        }
        // Last: from here on no try goes (the caller thaws them should the update not be made).
        let (waits, next_wait) = self.waits.save()?;
        let states = self
            .states
            .lock()
            .iter()
            .map(|(&(nodeid, owner), k)| LockStateSaved {
                nodeid,
                owner: owner_pair(owner),
                stateid: (k.stateid.seqid, k.stateid.other),
                typ: type_char(k.typ),
                from: k.from,
                held: k.held.ranges().map(|r| r.iter().map(|&(a, b, t)| (a, b, type_char(t))).collect()),
            })
            .collect();
        Ok(Locks41State { states, lost: self.lost().clone(), waits, next_wait })
    }

    /// The lock state `s` describes (a live update's).
    pub fn restore(s: &Locks41State) -> Result<Locks41> {
        let l = Locks41::default();
        {
            let mut g = l.states.lock();
            for k in &s.states {
                let owner = owner_of_pair(k.owner)?;
                let held = match &k.held {
                    Some(r) => Held(Some(
                        r.iter().map(|&(a, b, t)| Ok((a, b, char_type(t)?))).collect::<Result<Vec<_>>>()?,
                    )),
                    None => Held(None),
                };
                let stateid = Stateid { seqid: k.stateid.0, other: k.stateid.1 };
                g.insert((k.nodeid, owner), Kept { stateid, typ: char_type(k.typ)?, from: k.from, held });
            }
        }
        {
            let mut lost = l.lost();
            lost.extend(&s.lost);
            l.states.lost_kept.store(lost.len(), Ordering::Release);
        }
        l.waits.restore(&s.waits, s.next_wait)?;
        Ok(l)
    }

    /// The counters continue from `t` (a predecessor's, at a live update).
    pub fn continue_from(&self, t: &LockTotals) {
        let set = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        set(&self.calls, t.calls);
        set(&self.denied, t.denied);
        set(&self.freed, t.freed);
        set(&self.stale, t.stale);
        set(&self.waited, t.waits);
        set(&self.waits.tries, t.tries);
        set(&self.waits.denied, t.tries_denied);
        set(&self.reclaims, t.reclaims);
        set(&self.opens_reclaimed, t.opens_reclaimed);
        set(&self.opens_not_reclaimed, t.opens_not_reclaimed);
        set(&self.locks_reclaimed, t.locks_reclaimed);
        set(&self.locks_not_reclaimed, t.locks_not_reclaimed);
    }

    /// The counters.
    pub fn totals(&self) -> LockTotals {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (tries, tries_denied) = self.waits.tries();
        LockTotals {
            calls: g(&self.calls),
            denied: g(&self.denied),
            freed: g(&self.freed),
            stale: g(&self.stale),
            waits: g(&self.waited),
            tries,
            tries_denied,
            reclaims: g(&self.reclaims),
            opens_reclaimed: g(&self.opens_reclaimed),
            opens_not_reclaimed: g(&self.opens_not_reclaimed),
            locks_reclaimed: g(&self.locks_reclaimed),
            locks_not_reclaimed: g(&self.locks_not_reclaimed),
        }
    }

    /// A SETLKW starts waiting ([`RemoteLocks::wait`] of [`RemoteWaits`], counted).
    fn waited(&self) {
        self.waited.fetch_add(1, Ordering::Relaxed);
    }
}

impl RemoteLocks for Locks41 {
    fn wait(&self, ctx: &Context, ino: u64, lock: &LockRequest, unique: u64) -> Result<u64> {
        let id = self.waits.wait(ctx, ino, lock, unique)?;
        self.waited();
        Ok(id)
    }

    fn poll(&self, id: u64) -> Option<Result<()>> {
        self.waits.poll(id)
    }

    fn cancel(&self, id: u64) {
        self.waits.cancel(id)
    }

    fn interrupt(&self, unique: u64) -> bool {
        self.waits.interrupt(unique)
    }

    fn generation(&self) -> u64 {
        self.waits.generation()
    }

    fn unique_of(&self, id: u64) -> Option<u64> {
        self.waits.unique_of(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::LockOp;

    fn req(owner: u64) -> LockRequest {
        LockRequest {
            op: LockOp::SetWait,
            fh: 7,
            owner,
            lock: FileLock { start: 0, end: 99, typ: LockType::Write, pid: 1 },
            flock: false,
        }
    }

    fn ctx() -> Context {
        Context { uid: 1000, gid: 100, pid: 1, supp_gid: None }
    }

    fn whole(typ: LockType) -> FileLock {
        FileLock { start: 0, end: crate::types::OFFSET_MAX, typ, pid: 1 }
    }

    fn lk(start: u64, end: u64, typ: LockType) -> FileLock {
        FileLock { start, end, typ, pid: 1 }
    }

    #[test]
    fn the_lock_state_saved_is_the_lock_state_restored_with_its_waits() {
        let l = Locks41::default();
        let st = Stateid { seqid: 3, other: [7; 12] };
        l.states.set(5, Owner::Posix(1), st, &lk(0, 9, LockType::Write), 7);
        l.states.set(5, Owner::Posix(1), st, &lk(20, 29, LockType::Read), 7);
        l.states.set(6, Owner::Flock(8), st, &whole(LockType::Read), 8);
        l.lose_locks(9);
        let saved = l.save().unwrap();
        let r = Locks41::restore(&saved).unwrap();
        let mut a = l.states.all();
        let mut b = r.states.all();
        a.sort_by_key(|x| (x.0, x.3));
        b.sort_by_key(|x| (x.0, x.3));
        assert_eq!(a, b);
        assert!(r.is_lost(9) && !r.is_lost(5));
        assert_eq!(r.states.held(6, Owner::Flock(8)), Some(LockType::Read));
        // That update called off: the waits are tried here again.
        l.waits.thaw();
        // Waits: one waiting, one granted whose answer is not taken yet, one interrupted.
        let waiting = l.waits.wait(&ctx(), 5, &req(3), 77).unwrap();
        let granted = l.waits.wait(&ctx(), 5, &req(4), 78).unwrap();
        let interrupted = l.waits.wait(&ctx(), 6, &LockRequest { flock: true, ..req(5) }, 79).unwrap();
        let now = Instant::now();
        let a = l.waits.due(now).unwrap();
        assert_eq!(a.id, waiting);
        // A try on the wire holds the save back (its answer would be this process's only).
        assert!(l.save().is_err(), "a try is out");
        l.waits.attempted(a.id, Tried::Denied, now);
        let b = l.waits.due(now).unwrap();
        assert_eq!(b.id, granted);
        l.waits.attempted(b.id, Tried::Granted, now);
        assert!(l.waits.interrupt(79));
        let saved = l.save().unwrap();
        assert_eq!(saved.waits.len(), 3);
        assert_eq!(saved.next_wait, interrupted);
        // Saved: no try goes here any more, until the update is called off.
        let later = now + Duration::from_secs(5);
        assert_eq!(l.waits.due(later), None);
        assert_eq!(l.waits.next_due(), None);
        l.waits.thaw();
        assert_eq!(l.waits.due(later).map(|a| a.id), Some(waiting));
        // The successor: the same ids and uniques, each answered as it was or tried at once.
        let r = Locks41::restore(&saved).unwrap();
        assert_eq!(r.waits.unique_of(waiting), Some(77));
        assert_eq!(r.waits.poll(granted), Some(Ok(())));
        assert_eq!(r.waits.poll(interrupted), Some(Err(Error::Os(libc::EINTR))));
        assert_eq!(r.waits.poll(waiting), None, "still waiting");
        let t = r.waits.due(Instant::now()).unwrap();
        assert_eq!(
            (t.id, t.nodeid, t.fh, t.owner, t.lock, t.uid),
            (waiting, 5, 7, Owner::Posix(3), req(3).lock, 1000)
        );
        let next = r.waits.wait(&ctx(), 5, &req(6), 80).unwrap();
        assert!(next > interrupted, "ids go on after the saved ones");
        // A bad saved wait is refused.
        let mut bad = saved.clone();
        bad.waits[0].lock.2 = 'u';
        assert!(Locks41::restore(&bad).is_err());
        let mut bad = saved;
        bad.waits[1].id = bad.waits[0].id;
        assert!(Locks41::restore(&bad).is_err());
    }

    #[test]
    fn the_ranges_held_follow_posix_and_stop_being_known_past_their_bound() {
        use LockType::{Read as R, Unlock as U, Write as W};
        let mut h = Held::new();
        h.apply(&lk(0, 99, W));
        h.apply(&lk(200, 299, W));
        assert_eq!(h.ranges().unwrap(), &[(0, 99, W), (200, 299, W)][..]);
        // A read lock over the middle of both: it replaces what it covers.
        h.apply(&lk(50, 249, R));
        assert_eq!(h.ranges().unwrap(), &[(0, 49, W), (50, 249, R), (250, 299, W)][..]);
        // A hole, then the same type next to a range: one range.
        h.apply(&lk(100, 149, U));
        assert_eq!(h.ranges().unwrap(), &[(0, 49, W), (50, 99, R), (150, 249, R), (250, 299, W)][..]);
        h.apply(&lk(100, 149, R));
        assert_eq!(h.ranges().unwrap(), &[(0, 49, W), (50, 249, R), (250, 299, W)][..]);
        // To the end of the file, then all of it let go.
        h.apply(&lk(1000, crate::types::OFFSET_MAX, W));
        assert_eq!(h.ranges().unwrap().last(), Some(&(1000, crate::types::OFFSET_MAX, W)));
        h.apply(&whole(U));
        assert_eq!(h.ranges().unwrap(), &[][..]);
        // Alternating types past the bound: unknown, for good.
        for i in 0..=MAX_HELD_RANGES as u64 {
            h.apply(&lk(2 * i, 2 * i, if i % 2 == 0 { R } else { W }));
        }
        assert_eq!(h.ranges(), None);
        h.apply(&whole(U));
        assert_eq!(h.ranges(), None, "once unknown, never known again");
        // A kept state's ranges, and a reclaim that finds it changed.
        let s = LockStates::default();
        let (old, new) = (Stateid { seqid: 1, other: [1; 12] }, Stateid { seqid: 1, other: [2; 12] });
        s.set(5, Owner::Posix(1), old, &lk(0, 9, W), 7);
        s.set(5, Owner::Posix(1), Stateid { seqid: 2, ..old }, &lk(20, 29, R), 8);
        let all = s.all();
        assert_eq!(all.len(), 1);
        assert_eq!((all[0].3, all[0].4.ranges().unwrap()), (7, &[(0, 9, W), (20, 29, R)][..]));
        assert!(s.is(5, Owner::Posix(1), old), "the same state, a later seqid");
        assert!(s.reclaimed(5, Owner::Posix(1), old, new));
        assert!(!s.reclaimed(5, Owner::Posix(1), old, new), "changed meanwhile");
        assert_eq!(s.get(5, Owner::Posix(1)), Some(new));
    }

    #[test]
    fn the_engines_see_idle_without_a_lock_only_when_nothing_waits() {
        let l = Locks41::default();
        assert!(l.idle(), "nothing at first");
        let id = l.waits.wait(&ctx(), 5, &req(3), 77).unwrap();
        assert!(!l.idle(), "a wait");
        let a = l.waits.due(Instant::now()).unwrap();
        l.waits.attempted(a.id, Tried::Granted, Instant::now());
        assert!(!l.idle(), "ended, its answer not taken yet");
        assert_eq!(l.waits.poll(id), Some(Ok(())));
        assert!(l.idle(), "answered");
        let fh = Fh::new(b"f").unwrap();
        l.orphan(Orphan::Open(fh, Stateid::default()));
        assert!(!l.idle(), "an orphan waits");
        let (o, _) = l.take_orphan(Instant::now()).unwrap();
        assert!(!l.idle(), "an orphan is out");
        l.orphan_ended(o.phase());
        assert!(l.idle(), "ended");
    }

    #[test]
    fn a_denied_wait_is_tried_again_later_and_granted_ends_it() {
        let w = RemoteWaits::default();
        let g0 = w.generation();
        let id = w.wait(&ctx(), 5, &req(3), 77).unwrap();
        assert_ne!(w.generation(), g0);
        assert_eq!(w.poll(id), None);
        let t0 = Instant::now();
        let a = w.due(t0).unwrap();
        assert_eq!((a.id, a.nodeid, a.fh, a.owner, a.uid), (id, 5, 7, Owner::Posix(3), 1000));
        assert_eq!(w.due(t0), None, "one try at a time");
        assert_eq!(w.attempted(id, Tried::Denied, t0), After::Done);
        assert_eq!(w.due(t0), None, "not before its back-off");
        assert_eq!(w.next_due(), Some(t0 + MIN_RETRY));
        let a = w.due(t0 + MIN_RETRY).unwrap();
        w.attempted(a.id, Tried::Denied, t0 + MIN_RETRY);
        assert_eq!(w.next_due(), Some(t0 + MIN_RETRY * 3), "the back-off doubles");
        let g1 = w.generation();
        let a = w.due(t0 + MIN_RETRY * 3).unwrap();
        assert_eq!(w.attempted(a.id, Tried::Granted, t0), After::Done);
        assert_ne!(w.generation(), g1);
        assert_eq!(w.poll(id), Some(Ok(())));
        assert!(w.is_empty());
        assert_eq!(w.tries(), (3, 2));
    }

    #[test]
    fn interrupted_or_cancelled_under_a_try_the_lock_is_let_go() {
        let w = RemoteWaits::default();
        let id = w.wait(&ctx(), 5, &req(3), 77).unwrap();
        let a = w.due(Instant::now()).unwrap();
        assert!(w.interrupt(77));
        assert_eq!(w.poll(id), None, "its try is still out");
        assert_eq!(w.attempted(a.id, Tried::Granted, Instant::now()), After::LetGo);
        assert_eq!(w.poll(id), Some(Err(Error::Os(libc::EINTR))));

        let id = w.wait(&ctx(), 5, &req(4), 78).unwrap();
        let a = w.due(Instant::now()).unwrap();
        w.cancel(id);
        assert_eq!(w.attempted(a.id, Tried::Granted, Instant::now()), After::LetGo);
        assert!(w.is_empty(), "a cancelled wait is forgotten");

        // With no try out: at once.
        let id = w.wait(&ctx(), 5, &req(5), 79).unwrap();
        assert!(w.interrupt(79));
        assert_eq!(w.poll(id), Some(Err(Error::Os(libc::EINTR))));
        let id = w.wait(&ctx(), 5, &req(6), 80).unwrap();
        w.cancel(id);
        assert!(w.is_empty());
        assert_eq!(w.poll(id), Some(Err(Error::Io)), "an unknown wait ends, never waits for ever");
    }

    #[test]
    fn a_wait_cancelled_after_it_ended_leaves_no_entry() {
        let w = RemoteWaits::default();
        // Far more than the table holds: none stays behind.
        for i in 0..2 * MAX_WAITS as u64 {
            let id = w.wait(&ctx(), 5, &req(i), i).unwrap();
            let now = Instant::now();
            let a = w.due(now).unwrap();
            match i % 3 {
                // Granted, then cancelled before its poller asked (a reset).
                0 => assert_eq!(w.attempted(a.id, Tried::Granted, now), After::Done),
                // Interrupted with its try out, then cancelled: the grant is let go.
                1 => assert!(w.interrupt(i)),
                // Ended with an error nobody asked for.
                _ => assert_eq!(w.attempted(a.id, Tried::Failed(Error::Io), now), After::Done),
            }
            w.cancel(id);
            if i % 3 == 1 {
                assert_eq!(w.attempted(a.id, Tried::Granted, now), After::LetGo);
            }
            assert!(w.is_empty(), "wait {i} stayed");
        }
        // And a granted wait's lock state goes with the session's others.
        let l = Locks41::default();
        let id = l.wait(&ctx(), 5, &req(1), 1).unwrap();
        let now = Instant::now();
        let a = l.waits.due(now).unwrap();
        let st = Stateid { seqid: 1, other: [3; 12] };
        l.states.set(a.nodeid, a.owner, st, &a.lock, a.fh);
        l.waits.attempted(a.id, Tried::Granted, now);
        l.cancel(id);
        assert!(l.waits.is_empty());
        let fh = Fh::new(b"file").unwrap();
        l.orphan_all(|_| Some(fh));
        assert_eq!(l.take_orphan(Instant::now()), Some((Orphan::Lock(fh, st), 0)));
    }

    #[test]
    fn a_failed_orphan_goes_again_later_a_bounded_number_of_times_and_keeps_its_phase() {
        let l = Locks41::default();
        let st = Stateid { seqid: 1, other: [9; 12] };
        let fh = Fh::new(b"file").unwrap();
        l.orphan(Orphan::Open(fh, st));
        l.orphan(Orphan::Lock(fh, st));
        let t0 = Instant::now();
        let (o, tries) = l.take_orphan(t0).unwrap();
        assert_eq!((o, tries), (Orphan::Lock(fh, st), 0));
        // Not sent (no room): back at once, untried.
        l.put_back(o, tries);
        l.orphan_ended(0);
        let (o, tries) = l.take_orphan(Instant::now()).unwrap();
        assert_eq!((o, tries), (Orphan::Lock(fh, st), 0));
        // Failed: again after a back-off, and the CLOSE still waits for it.
        l.orphan_again(o, tries);
        l.orphan_ended(0);
        assert_eq!(l.take_orphan(Instant::now()), None, "neither before its back-off nor the CLOSE");
        let at = l.next_orphan_at().unwrap();
        assert!(at >= t0 + ORPHAN_RETRY, "{at:?}");
        let mut tries = 1;
        let mut now = at;
        loop {
            let (o, t) = l.take_orphan(now).unwrap();
            assert_eq!((o, t), (Orphan::Lock(fh, st), tries));
            l.orphan_again(o, t);
            l.orphan_ended(0);
            tries += 1;
            match l.next_orphan_at() {
                Some(at) if l.orphans().waiting.iter().any(|w| w.orphan.phase() == 0) => now = at,
                _ => break,
            }
        }
        assert_eq!(tries, MAX_ORPHAN_TRIES, "given up after its last try");
        assert_eq!(l.take_orphan(now).map(|(o, _)| o), Some(Orphan::Open(fh, st)));
        // A range a wait was granted too late goes before the opens too.
        let lk = FileLock { start: 0, end: 9, typ: LockType::Write, pid: 1 };
        assert_eq!(Orphan::Unlock(fh, st, lk).phase(), 0);
    }

    #[test]
    fn waits_are_bounded_and_a_failure_ends_one() {
        let w = RemoteWaits::default();
        for i in 0..MAX_WAITS as u64 {
            w.wait(&ctx(), 5, &req(i), i).unwrap();
        }
        assert_eq!(w.wait(&ctx(), 5, &req(0), 0), Err(Error::Os(libc::ENOLCK)));
        let a = w.due(Instant::now()).unwrap();
        w.attempted(a.id, Tried::Failed(Error::Io), Instant::now());
        assert_eq!(w.poll(a.id), Some(Err(Error::Io)));
        assert_eq!(w.unique_of(2), Some(1));
    }

    #[test]
    fn orphans_end_lock_states_then_opens_then_silly_names() {
        let l = Locks41::default();
        let st = Stateid { seqid: 1, other: [9; 12] };
        let fh = Fh::new(b"file").unwrap();
        l.states.set(5, Owner::Posix(1), st, &whole(LockType::Write), 7);
        l.orphan(Orphan::Silly(fh, [b'x'; SILLY_LEN]));
        l.orphan(Orphan::Open(fh, st));
        l.orphan_all(|_| Some(fh));
        assert_eq!(l.orphans_left(), 3);
        let now = Instant::now();
        assert_eq!(l.take_orphan(now), Some((Orphan::Lock(fh, st), 0)));
        assert!(!l.has_orphans(), "no CLOSE while a lock state from its open may be held");
        assert_eq!(l.take_orphan(now), None);
        l.orphan_ended(0);
        assert_eq!(l.take_orphan(now), Some((Orphan::Open(fh, st), 0)));
        assert_eq!(l.take_orphan(now), None, "no REMOVE while the file may be open");
        l.orphan_ended(1);
        assert!(matches!(l.take_orphan(now), Some((Orphan::Silly(..), 0))));
        l.orphan_ended(2);
        l.orphan_ended(2);
        assert_eq!(l.orphans_left(), 0, "an end too many is no underflow");
        // A server that lost a file's lock states: marked until its last close.
        l.states.set(6, Owner::Flock(3), st, &whole(LockType::Read), 3);
        assert!(!l.lose(7), "no lock state: nothing lost");
        assert!(l.lose(6) && l.lose(6), "marked, and stays so");
        assert!(l.states.is_empty());
        l.found(6);
        assert!(!l.lose(6));
        // A lock state found unknown by a lock call marks its file, with no state left.
        l.lose_locks(8);
        assert!(l.lose(8), "marked without a lock state kept");
        l.found(8);
        assert!(!l.lose(8));
    }

    #[test]
    fn lock_states_are_per_file_and_owner() {
        let s = LockStates::default();
        let st = Stateid { seqid: 1, other: [9; 12] };
        s.set(5, Owner::Posix(1), st, &whole(LockType::Write), 7);
        s.set(5, Owner::Flock(7), st, &whole(LockType::Read), 7);
        s.set(6, Owner::Posix(1), st, &whole(LockType::Write), 8);
        assert_eq!(s.get(5, Owner::Posix(1)), Some(st));
        assert_eq!(s.held(5, Owner::Flock(7)), Some(LockType::Read));
        assert_eq!(s.held(5, Owner::Flock(8)), None);
        // Each remembers the handle whose open it came from, not a later one's.
        s.set(5, Owner::Posix(9), st, &whole(LockType::Write), 4);
        s.set(5, Owner::Posix(9), st, &whole(LockType::Read), 7);
        assert_eq!(s.forget_from(5, 4), vec![st]);
        assert_eq!(s.forget_from(5, 4), vec![]);
        assert_eq!(s.get(5, Owner::Posix(2)), None);
        assert_eq!(s.forget_node(5).len(), 2);
        assert_eq!(s.len(), 1);
        assert_eq!(s.take_all(), vec![(6, Owner::Posix(1), st)]);
        assert!(s.is_empty());
        assert_ne!(Owner::Posix(7).name(), Owner::Flock(7).name());
        for o in [Owner::Posix(7), Owner::Flock(u64::MAX)] {
            assert_eq!(Owner::parse(&o.name()), Some(o), "a name parses back");
        }
        assert_eq!(Owner::parse(b"p1234567"), None, "eight bytes is not a name of ours");
        assert_eq!(Owner::parse(b"x12345678"), None);
        assert_eq!(Owner::parse(b""), None);
    }

    #[test]
    fn lock_states_are_bounded() {
        let s = LockStates::default();
        let st = Stateid { seqid: 1, other: [9; 12] };
        for o in 0..MAX_LOCK_STATES as u64 {
            assert!(!s.full(5, Owner::Posix(o)));
            s.set(5, Owner::Posix(o), st, &whole(LockType::Write), 1);
        }
        assert!(s.full(5, Owner::Posix(u64::MAX)), "a new one past the bound");
        assert!(s.full(6, Owner::Posix(0)), "on another file too");
        assert!(!s.full(5, Owner::Posix(3)), "one kept goes on");
        s.forget(5, Owner::Posix(3));
        assert!(!s.full(5, Owner::Posix(u64::MAX)), "room again");
    }
}
