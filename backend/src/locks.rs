//! Advisory file locks, kept by the server for every backend: POSIX record locks
//! (`fcntl(F_GETLK/F_SETLK/F_SETLKW)`, and OFD locks, which the kernel sends the same way with the
//! open file as owner) and BSD `flock(2)` locks (`FUSE_LK_FLOCK`).
//!
//! POSIX locks are byte ranges held by lock owners (the kernel's `fl_owner`: the process's file
//! table, as an opaque 64-bit id), split and merged like the kernel's `posix_lock_inode`: one
//! owner's locks never overlap, adjacent ranges of the same type are one, and a new lock replaces
//! whatever the owner held under it (upgrade, downgrade, unlock of a middle piece). `flock` locks
//! are whole-file and owned by the open file (the FUSE handle): converting one removes the old
//! lock first and then takes the new one, so a conversion that has to wait has given up the old
//! lock meanwhile, as `flock(2)` documents. The two kinds never conflict with each other (as on
//! Linux).
//!
//! A request that conflicts fails with [`LockError::WouldBlock`], or, for SETLKW, becomes a
//! *waiter* ([`LockManager::set_or_wait`]) that its poller retries with
//! [`LockManager::poll_wait`]. Waiting never blocks a thread: every change that can let a waiter
//! go on (an unlock, a release, a grant, an interrupt, the end of the session) bumps
//! [`LockManager::generation`], one atomic counter; a poller with waiters compares it with the
//! value it saw last (one atomic load per round when nothing changed) and only then takes the
//! table's mutex. A poller without waiters does not look at all.
//!
//! Before a POSIX request waits, the wait-for graph of owners is searched from the owners that
//! block it (through what each of them is waiting for, recursively): if the search reaches the
//! requesting owner the request fails with [`LockError::Deadlock`] (`EDEADLK`), as Linux's
//! `posix_locks_deadlock` does. `flock` waits are not checked (Linux does not either).
//!
//! Everything a guest can make us hold is bounded: [`MAX_LOCKS_PER_FILE`] records per file,
//! [`MAX_LOCKS`] in all, [`MAX_WAITERS`] waiting requests and [`MAX_EARLY_INTERRUPTS`]
//! remembered interrupts; past a bound a request fails with [`LockError::NoLocks`] (`ENOLCK`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::types::{FileLock, LockType};

/// Most lock records (POSIX ranges and `flock` locks) one file may hold.
pub const MAX_LOCKS_PER_FILE: usize = 4096;
/// Most lock records all files together may hold.
pub const MAX_LOCKS: usize = 1 << 16;
/// Most requests waiting for a lock at once.
pub const MAX_WAITERS: usize = 1024;
/// Most interrupts remembered for requests not seen yet (the oldest is forgotten first).
pub const MAX_EARLY_INTERRUPTS: usize = 64;
pub use crate::types::OFFSET_MAX;
/// Most owners the deadlock search visits, and most waiters it expands; past either it gives up
/// and lets the request wait (Linux gives up after 10 steps).
const MAX_DEADLOCK_STEPS: usize = 64;

/// Why a lock request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// A conflicting lock is held (`EAGAIN`).
    #[error("a conflicting lock is held")]
    WouldBlock,
    /// Waiting would deadlock: the owners blocking the request wait for the requester
    /// (`EDEADLK`).
    #[error("waiting would deadlock")]
    Deadlock,
    /// Too many locks or waiting requests (`ENOLCK`).
    #[error("no locks available")]
    NoLocks,
    /// The waiting request was interrupted (`EINTR`).
    #[error("interrupted")]
    Interrupted,
    /// The session ended while the request waited (`EIO`).
    #[error("the session ended")]
    SessionEnded,
}

impl LockError {
    /// The errno this error is reported as.
    pub fn errno(self) -> i32 {
        match self {
            LockError::WouldBlock => libc::EAGAIN,
            LockError::Deadlock => libc::EDEADLK,
            LockError::NoLocks => libc::ENOLCK,
            LockError::Interrupted => libc::EINTR,
            LockError::SessionEnded => libc::EIO,
        }
    }
}

/// The kind of a lock request, with its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// A POSIX record (or OFD) lock of lock owner `owner`.
    Posix {
        /// The kernel's lock owner id.
        owner: u64,
    },
    /// A whole-file `flock(2)` lock of the open file `fh`.
    Flock {
        /// The FUSE file handle.
        fh: u64,
    },
}

/// A request waiting for a lock (see [`LockManager::set_or_wait`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaitId(u64);

impl WaitId {
    /// Its number (what [`LockManager::waiter_unique`] takes).
    pub fn get(self) -> u64 {
        self.0
    }
}

/// How [`LockManager::set_or_wait`] left a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOutcome {
    /// Done: the lock is held (or released).
    Done,
    /// It waits: ask [`LockManager::poll_wait`] after [`LockManager::generation`] changes.
    Wait(WaitId),
}

/// One file's locks as data ([`LockManager::save`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileLocksState {
    /// The file.
    pub ino: u64,
    /// POSIX records: owner, first byte, last byte (inclusive), write, pid.
    pub posix: Vec<(u64, u64, u64, bool, u32)>,
    /// `flock` locks: handle, write.
    pub flock: Vec<(u64, bool)>,
}

/// A request waiting for a lock, as data ([`LockManager::save`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WaiterState {
    /// Its wait id (what the device's engines name it by).
    pub id: u64,
    /// The FUSE unique of the request.
    pub unique: u64,
    /// The file.
    pub ino: u64,
    /// A POSIX request's lock owner; `None` for `flock`.
    pub owner: Option<u64>,
    /// A `flock` request's handle.
    pub fh: u64,
    /// First byte, last byte (inclusive), write, pid.
    pub lock: (u64, u64, bool, u32),
    /// Interrupted (`EINTR` at its next look), or still waiting.
    pub interrupted: bool,
}

/// A lock table's waiting requests as data ([`LockManager::save`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WaitsState {
    /// Every waiting request.
    pub waiters: Vec<WaiterState>,
    /// The last wait id given.
    pub next_wait: u64,
    /// INTERRUPTs that named no waiting request yet, oldest first.
    pub early: Vec<u64>,
}

/// One POSIX lock record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    owner: u64,
    start: u64,
    /// Inclusive.
    end: u64,
    write: bool,
    pid: u32,
}

impl Held {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    /// Overlapping or touching `start..=end`.
    fn touches(&self, start: u64, end: u64) -> bool {
        self.overlaps(start, end)
            || end.checked_add(1) == Some(self.start)
            || self.end.checked_add(1) == Some(start)
    }

    fn as_lock(&self) -> FileLock {
        let typ = if self.write { LockType::Write } else { LockType::Read };
        FileLock { start: self.start, end: self.end, typ, pid: self.pid }
    }
}

/// One `flock` lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Flock {
    fh: u64,
    write: bool,
}

/// The locks of one file.
#[derive(Debug, Default)]
struct FileLocks {
    posix: Vec<Held>,
    flock: Vec<Flock>,
}

impl FileLocks {
    fn len(&self) -> usize {
        self.posix.len() + self.flock.len()
    }

    /// The first POSIX lock of another owner that conflicts with `lock` (overlapping, and one
    /// of the two exclusive).
    fn posix_conflict(&self, owner: u64, lock: &FileLock) -> Option<&Held> {
        let write = lock.typ == LockType::Write;
        self.posix.iter().find(|h| h.owner != owner && h.overlaps(lock.start, lock.end) && (write || h.write))
    }

    /// The owners of every POSIX lock conflicting with `lock`, each once.
    fn blockers(&self, owner: u64, lock: &FileLock, out: &mut Vec<u64>) {
        let write = lock.typ == LockType::Write;
        for h in &self.posix {
            if h.owner != owner
                && h.overlaps(lock.start, lock.end)
                && (write || h.write)
                && !out.contains(&h.owner)
            {
                out.push(h.owner);
            }
        }
    }

    /// The POSIX locks after `owner` sets (or, with [`LockType::Unlock`], clears) `lock`,
    /// replacing whatever the owner held there; `None` when another owner's lock conflicts.
    fn posix_after(&self, owner: u64, lock: &FileLock) -> Option<Vec<Held>> {
        let (mut start, mut end) = (lock.start, lock.end);
        let write = match lock.typ {
            LockType::Unlock => None,
            LockType::Read => Some(false),
            LockType::Write => Some(true),
        };
        if write.is_some() && self.posix_conflict(owner, lock).is_some() {
            return None;
        }
        // Grow the new range over the owner's same-type locks it touches (they are disjoint, so
        // the growth only covers bytes already held that way); those merge into it.
        if let Some(w) = write {
            loop {
                let grown = self
                    .posix
                    .iter()
                    .filter(|h| h.owner == owner && h.write == w && h.touches(start, end))
                    .fold((start, end), |(s, e), h| (s.min(h.start), e.max(h.end)));
                if grown == (start, end) {
                    break;
                }
                (start, end) = grown;
            }
        }
        let mut next = Vec::with_capacity(self.posix.len() + 2);
        for h in &self.posix {
            if h.owner != owner || !h.overlaps(start, end) {
                next.push(*h);
                continue;
            }
            // The owner's lock under the new range: keep what sticks out on either side, unless
            // it merges.
            if write == Some(h.write) {
                continue;
            }
            if h.start < start {
                next.push(Held { end: start - 1, ..*h });
            }
            if h.end > end {
                next.push(Held { start: end + 1, ..*h });
            }
        }
        if let Some(w) = write {
            next.push(Held { owner, start, end, write: w, pid: lock.pid });
        }
        Some(next)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WaitState {
    Waiting,
    Interrupted,
    Ended,
}

#[derive(Debug)]
struct Waiter {
    /// The FUSE unique of the request (what an INTERRUPT names).
    unique: u64,
    ino: u64,
    kind: LockKind,
    lock: FileLock,
    state: WaitState,
}

#[derive(Debug, Default)]
struct State {
    files: HashMap<u64, FileLocks>,
    /// Lock records of all files.
    records: usize,
    waiters: HashMap<u64, Waiter>,
    next_wait: u64,
    /// INTERRUPTs that named no waiting request (it may not have arrived yet), oldest first.
    early: VecDeque<u64>,
    /// Something changed that a waiter may be waiting for.
    dirty: bool,
}

impl State {
    /// Sets or clears `lock` on `ino` for `kind`. All or nothing, except that a `flock`
    /// conversion gives up the old lock even when the new one has to wait.
    fn apply(&mut self, ino: u64, kind: LockKind, lock: &FileLock) -> Result<(), LockError> {
        let unlock = lock.typ == LockType::Unlock;
        let Some(file) =
            (if unlock { self.files.get_mut(&ino) } else { Some(self.files.entry(ino).or_default()) })
        else {
            return Ok(());
        };
        let result = match kind {
            LockKind::Posix { owner } => match file.posix_after(owner, lock) {
                None => Err(LockError::WouldBlock),
                Some(next) => {
                    let total = self.records - file.posix.len() + next.len();
                    if next.len() + file.flock.len() > MAX_LOCKS_PER_FILE || total > MAX_LOCKS {
                        Err(LockError::NoLocks)
                    } else {
                        if next != file.posix {
                            self.dirty = true;
                        }
                        file.posix = next;
                        self.records = total;
                        Ok(())
                    }
                }
            },
            LockKind::Flock { fh } => {
                let write = lock.typ == LockType::Write;
                let mine = file.flock.iter().position(|f| f.fh == fh);
                if let Some(i) = mine {
                    if !unlock && file.flock[i].write == write {
                        return Ok(());
                    }
                    file.flock.swap_remove(i);
                    self.records -= 1;
                    self.dirty = true;
                }
                if unlock {
                    Ok(())
                } else if file.flock.iter().any(|f| write || f.write) {
                    Err(LockError::WouldBlock)
                } else if file.len() + 1 > MAX_LOCKS_PER_FILE || self.records + 1 > MAX_LOCKS {
                    Err(LockError::NoLocks)
                } else {
                    file.flock.push(Flock { fh, write });
                    self.records += 1;
                    Ok(())
                }
            }
        };
        if file.len() == 0 {
            self.files.remove(&ino);
        }
        result
    }

    /// Whether `owner` waiting for `lock` on `ino` closes a cycle of owners waiting for each
    /// other.
    fn deadlocks(&self, ino: u64, owner: u64, lock: &FileLock) -> bool {
        let mut stack = Vec::new();
        if let Some(file) = self.files.get(&ino) {
            file.blockers(owner, lock, &mut stack);
        }
        let mut seen: Vec<u64> = Vec::new();
        let mut expanded = 0;
        while let Some(o) = stack.pop() {
            if o == owner {
                return true;
            }
            if seen.contains(&o) {
                continue;
            }
            if seen.len() == MAX_DEADLOCK_STEPS {
                return false;
            }
            seen.push(o);
            for w in self.waiters.values() {
                let LockKind::Posix { owner: wo } = w.kind else { continue };
                if wo != o || w.state != WaitState::Waiting {
                    continue;
                }
                expanded += 1;
                if expanded > MAX_DEADLOCK_STEPS {
                    return false;
                }
                if let Some(file) = self.files.get(&w.ino) {
                    let before = stack.len();
                    file.blockers(wo, &w.lock, &mut stack);
                    // `blockers` skips owners already on the stack: keep only the new ones
                    // that were not visited yet.
                    let mut i = before;
                    while i < stack.len() {
                        if seen.contains(&stack[i]) && stack[i] != owner {
                            stack.swap_remove(i);
                        } else {
                            i += 1;
                        }
                    }
                }
            }
        }
        false
    }

    fn release(&mut self, ino: u64, keep: impl Fn(&Held) -> bool, fh: Option<u64>) {
        let Some(file) = self.files.get_mut(&ino) else { return };
        let before = file.len();
        file.posix.retain(keep);
        if let Some(fh) = fh {
            file.flock.retain(|f| f.fh != fh);
        }
        let dropped = before - file.len();
        if dropped > 0 {
            self.records -= dropped;
            self.dirty = true;
        }
        if file.len() == 0 {
            self.files.remove(&ino);
        }
    }
}

/// The lock table of a session: every file's locks and the requests waiting for one. Shared by
/// all pollers (`&self` everywhere); see the module documentation.
#[derive(Debug, Default)]
pub struct LockManager {
    state: Mutex<State>,
    generation: AtomicU64,
}

impl LockManager {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bumps the generation if `st` changed in a way a waiter may care about.
    fn publish(&self, st: &mut State) {
        if std::mem::take(&mut st.dirty) {
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// Changes whenever a waiting request may be able to go on.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// GETLK: the first POSIX lock of another owner than `owner` on `ino` that conflicts with
    /// `lock` (whose type is a lock, not [`LockType::Unlock`]), with the pid of its holder.
    pub fn test(&self, ino: u64, owner: u64, lock: &FileLock) -> Option<FileLock> {
        let st = self.state();
        st.files.get(&ino)?.posix_conflict(owner, lock).map(Held::as_lock)
    }

    /// SETLK: sets or clears `lock` on `ino` at once, or fails with [`LockError::WouldBlock`].
    pub fn set(&self, ino: u64, kind: LockKind, lock: &FileLock) -> Result<(), LockError> {
        let mut st = self.state();
        let r = st.apply(ino, kind, lock);
        self.publish(&mut st);
        r
    }

    /// SETLKW: sets or clears `lock` on `ino`, or, when a conflicting lock is held, registers
    /// the request `unique` as a waiter. Fails instead with [`LockError::Deadlock`] when the
    /// wait would close a cycle, [`LockError::NoLocks`] when too many requests wait, and
    /// [`LockError::Interrupted`] when an INTERRUPT for `unique` came first.
    pub fn set_or_wait(
        &self,
        ino: u64,
        kind: LockKind,
        lock: &FileLock,
        unique: u64,
    ) -> Result<SetOutcome, LockError> {
        let mut st = self.state();
        let r = match st.apply(ino, kind, lock) {
            Ok(()) => Ok(SetOutcome::Done),
            Err(LockError::WouldBlock) => {
                if let Some(i) = st.early.iter().position(|&u| u == unique) {
                    st.early.remove(i);
                    Err(LockError::Interrupted)
                } else if matches!(kind, LockKind::Posix { owner } if st.deadlocks(ino, owner, lock)) {
                    Err(LockError::Deadlock)
                } else if st.waiters.len() >= MAX_WAITERS {
                    Err(LockError::NoLocks)
                } else {
                    st.next_wait += 1;
                    let id = st.next_wait;
                    st.waiters
                        .insert(id, Waiter { unique, ino, kind, lock: *lock, state: WaitState::Waiting });
                    Ok(SetOutcome::Wait(WaitId(id)))
                }
            }
            Err(e) => Err(e),
        };
        self.publish(&mut st);
        r
    }

    /// Tries a waiting request again: `None` while it still has to wait, else how it ended
    /// (granted, interrupted, session ended, or too many locks now). A finished waiter is gone.
    pub fn poll_wait(&self, id: WaitId) -> Option<Result<(), LockError>> {
        let mut st = self.state();
        let Some(w) = st.waiters.get(&id.0) else {
            return Some(Err(LockError::SessionEnded));
        };
        let (ino, kind, lock, state) = (w.ino, w.kind, w.lock, w.state);
        let r = match state {
            WaitState::Interrupted => Some(Err(LockError::Interrupted)),
            WaitState::Ended => Some(Err(LockError::SessionEnded)),
            WaitState::Waiting => match st.apply(ino, kind, &lock) {
                Err(LockError::WouldBlock) => None,
                r => {
                    // A grant changes the table (a downgrade may free others); say so.
                    st.dirty = true;
                    Some(r)
                }
            },
        };
        if r.is_some() {
            st.waiters.remove(&id.0);
        }
        self.publish(&mut st);
        r
    }

    /// Forgets a waiting request without an answer (the device dropped it: reset, shutdown).
    pub fn cancel_wait(&self, id: WaitId) {
        let mut st = self.state();
        st.waiters.remove(&id.0);
    }

    /// INTERRUPT of request `unique`: a waiting request ends with [`LockError::Interrupted`]
    /// (true). Otherwise (false) the interrupt is remembered, in case the request it names has
    /// not arrived yet (it may come on another queue, served by another poller).
    pub fn interrupt(&self, unique: u64) -> bool {
        let mut guard = self.state();
        let st = &mut *guard;
        let found = st.waiters.values_mut().find(|w| w.unique == unique && w.state == WaitState::Waiting);
        let hit = match found {
            Some(w) => {
                w.state = WaitState::Interrupted;
                st.dirty = true;
                true
            }
            None => {
                if !st.early.contains(&unique) {
                    if st.early.len() == MAX_EARLY_INTERRUPTS {
                        st.early.pop_front();
                    }
                    st.early.push_back(unique);
                }
                false
            }
        };
        self.publish(st);
        hit
    }

    /// Takes the INTERRUPT remembered for request `unique` if one came before it
    /// ([`LockManager::interrupt`]): whether there was one. For a SETLKW that waits elsewhere
    /// (a filesystem's [`crate::filesystem::RemoteLocks`]), which must end with `EINTR` as
    /// [`LockManager::set_or_wait`] ends one here.
    pub fn take_early_interrupt(&self, unique: u64) -> bool {
        let mut st = self.state();
        let Some(i) = st.early.iter().position(|&u| u == unique) else { return false };
        st.early.remove(i);
        self.publish(&mut st);
        true
    }

    /// FLUSH (a descriptor of `ino` is closed): drops every POSIX lock of `owner` on it.
    pub fn release_owner(&self, ino: u64, owner: u64) {
        let mut st = self.state();
        st.release(ino, |h| h.owner != owner, None);
        self.publish(&mut st);
    }

    /// RELEASE of handle `fh` of `ino`: drops its `flock` lock, and the POSIX (OFD) locks of
    /// `owner` when the kernel names one.
    pub fn release_handle(&self, ino: u64, fh: u64, owner: Option<u64>) {
        let mut st = self.state();
        match owner {
            Some(owner) => st.release(ino, |h| h.owner != owner, Some(fh)),
            None => st.release(ino, |_| true, Some(fh)),
        }
        self.publish(&mut st);
    }

    /// Drops every lock of `ino` (its last handle is gone, so nobody can hold one).
    pub fn clear_file(&self, ino: u64) {
        let mut st = self.state();
        if let Some(file) = st.files.remove(&ino) {
            st.records -= file.len();
            st.dirty = true;
        }
        self.publish(&mut st);
    }

    /// The session ended (INIT of a new one, DESTROY): every lock goes, every waiter ends with
    /// [`LockError::SessionEnded`], remembered interrupts are forgotten.
    pub fn end_session(&self) {
        let mut st = self.state();
        st.files = HashMap::new();
        st.records = 0;
        st.early = VecDeque::new();
        for w in st.waiters.values_mut() {
            w.state = WaitState::Ended;
        }
        st.dirty = true;
        self.publish(&mut st);
    }

    /// Lock records held, all files together.
    pub fn lock_count(&self) -> usize {
        self.state().records
    }

    /// Every lock held and every request waiting, as data (issue 22: a process that takes the
    /// session over; the device hands each waiting request's descriptor chain over with it).
    /// A waiter whose session ended is not saved (its request is answered `EIO` as the old
    /// process's device resets).
    pub fn save(&self) -> (Vec<FileLocksState>, WaitsState) {
        let st = self.state();
        let mut waiters: Vec<WaiterState> = (st.waiters.iter())
            .filter(|(_, w)| w.state != WaitState::Ended)
            .map(|(&id, w)| {
                let (owner, fh) = match w.kind {
                    LockKind::Posix { owner } => (Some(owner), 0),
                    LockKind::Flock { fh } => (None, fh),
                };
                let l = &w.lock;
                WaiterState {
                    id,
                    unique: w.unique,
                    ino: w.ino,
                    owner,
                    fh,
                    lock: (l.start, l.end, l.typ == LockType::Write, l.pid),
                    interrupted: w.state == WaitState::Interrupted,
                }
            })
            .collect();
        waiters.sort_unstable_by_key(|w| w.id);
        let waits =
            WaitsState { waiters, next_wait: st.next_wait, early: st.early.iter().copied().collect() };
        let mut files: Vec<FileLocksState> = (st.files.iter())
            .map(|(&ino, f)| FileLocksState {
                ino,
                posix: f.posix.iter().map(|h| (h.owner, h.start, h.end, h.write, h.pid)).collect(),
                flock: f.flock.iter().map(|l| (l.fh, l.write)).collect(),
            })
            .collect();
        files.sort_unstable_by_key(|f| f.ino);
        (files, waits)
    }

    /// Puts saved locks into this table, which must hold none; `Err` names what is wrong with
    /// them (an empty range, overlapping records of one owner, one handle's flock twice) and
    /// leaves the table empty.
    pub fn restore(&self, files: &[FileLocksState], waits: &WaitsState) -> Result<(), String> {
        let mut st = self.state();
        if st.records != 0 || !st.waiters.is_empty() {
            return Err("the table is not empty".into());
        }
        let mut table = HashMap::new();
        let mut records = 0;
        for f in files {
            let mut posix: Vec<Held> = (f.posix.iter())
                .map(|&(owner, start, end, write, pid)| Held { owner, start, end, write, pid })
                .collect();
            posix.sort_unstable_by_key(|h| (h.owner, h.start));
            for pair in posix.windows(2) {
                if pair[0].owner == pair[1].owner && pair[0].end >= pair[1].start {
                    return Err(format!("inode {}: overlapping records of owner {}", f.ino, pair[0].owner));
                }
            }
            if let Some(h) = posix.iter().find(|h| h.start > h.end) {
                return Err(format!("inode {}: an empty range {}..={}", f.ino, h.start, h.end));
            }
            let flock: Vec<Flock> = f.flock.iter().map(|&(fh, write)| Flock { fh, write }).collect();
            let handles: std::collections::HashSet<u64> = flock.iter().map(|l| l.fh).collect();
            if handles.len() != flock.len() {
                return Err(format!("inode {}: a handle's flock twice", f.ino));
            }
            records += posix.len() + flock.len();
            table.insert(f.ino, FileLocks { posix, flock });
        }
        if waits.waiters.len() > MAX_WAITERS || waits.early.len() > MAX_EARLY_INTERRUPTS {
            return Err("more waiting requests or early interrupts than the table holds".into());
        }
        let mut waiters = HashMap::with_capacity(waits.waiters.len());
        for w in &waits.waiters {
            let (start, end, write, pid) = w.lock;
            if w.id == 0 || w.id > waits.next_wait || start > end || waiters.contains_key(&w.id) {
                return Err(format!("waiting request {}: a bad id or range", w.id));
            }
            let kind = match w.owner {
                Some(owner) => LockKind::Posix { owner },
                None => LockKind::Flock { fh: w.fh },
            };
            let typ = if write { LockType::Write } else { LockType::Read };
            let state = if w.interrupted { WaitState::Interrupted } else { WaitState::Waiting };
            let lock = FileLock { start, end, typ, pid };
            waiters.insert(w.id, Waiter { unique: w.unique, ino: w.ino, kind, lock, state });
        }
        st.files = table;
        st.records = records;
        st.waiters = waiters;
        st.next_wait = waits.next_wait;
        st.early = waits.early.iter().copied().collect();
        st.dirty = true;
        self.publish(&mut st);
        Ok(())
    }

    /// The FUSE unique of waiting request `id`, if it waits (a process that took the session
    /// over parks it again).
    pub fn waiter_unique(&self, id: u64) -> Option<(WaitId, u64)> {
        self.state().waiters.get(&id).map(|w| (WaitId(id), w.unique))
    }

    /// Requests waiting for a lock.
    pub fn waiter_count(&self) -> usize {
        self.state().waiters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: u64 = 10;

    fn lk(typ: LockType, start: u64, end: u64) -> FileLock {
        FileLock { start, end, typ, pid: 7 }
    }

    fn px(owner: u64) -> LockKind {
        LockKind::Posix { owner }
    }

    /// Issue 22: the table as data and back (a session taken over), waiting requests
    /// included: a waiter taken over is granted when the conflict goes, an interrupted one ends
    /// `EINTR`, an early interrupt still meets its request; a saved table that contradicts
    /// itself is refused and nothing is restored.
    #[test]
    fn locks_saved_and_restored_conflict_as_before() {
        let m = LockManager::new();
        m.set(F, px(1), &lk(LockType::Write, 0, 99)).unwrap();
        m.set(F, px(1), &lk(LockType::Read, 200, 299)).unwrap();
        m.set(F + 1, px(2), &lk(LockType::Read, 0, 0)).unwrap();
        let (saved, waits) = m.save();
        assert_eq!(waits, WaitsState::default());
        let n = LockManager::new();
        n.restore(&saved, &waits).unwrap();
        assert_eq!(n.save().0, saved);
        assert_eq!(n.lock_count(), 3);
        assert_eq!(n.set(F, px(3), &lk(LockType::Read, 50, 60)), Err(LockError::WouldBlock));
        assert_eq!(n.set(F, px(3), &lk(LockType::Read, 250, 260)), Ok(()), "read beside read");
        assert!(n.restore(&saved, &waits).is_err(), "restored into a table that is not empty");
        // Requests waiting move with the table.
        let SetOutcome::Wait(a) = n.set_or_wait(F, px(4), &lk(LockType::Write, 0, 0), 77).unwrap() else {
            panic!("waits")
        };
        let SetOutcome::Wait(b) = n.set_or_wait(F, px(5), &lk(LockType::Write, 10, 10), 78).unwrap() else {
            panic!("waits")
        };
        assert!(n.interrupt(78));
        assert!(!n.interrupt(99), "an interrupt before its request");
        let (files, waits) = n.save();
        assert_eq!(waits.waiters.len(), 2);
        let json = serde_json::to_string(&waits).unwrap();
        let o = LockManager::new();
        o.restore(&files, &serde_json::from_str(&json).unwrap()).unwrap();
        let (wa, ua) = o.waiter_unique(a.0).unwrap();
        assert_eq!(ua, 77);
        assert_eq!(o.poll_wait(wa), None, "still waits for owner 1");
        assert_eq!(o.poll_wait(o.waiter_unique(b.0).unwrap().0), Some(Err(LockError::Interrupted)));
        o.release_owner(F, 1);
        assert_eq!(o.poll_wait(wa), Some(Ok(())), "granted once owner 1 let go");
        assert_eq!(o.set_or_wait(F, px(6), &lk(LockType::Write, 0, 0), 99), Err(LockError::Interrupted));
        assert!(o.waiter_unique(a.0).is_none());
        let SetOutcome::Wait(c) = o.set_or_wait(F, px(7), &lk(LockType::Write, 0, 0), 80).unwrap() else {
            panic!("waits")
        };
        assert!(c.0 > b.0, "wait ids go on");
        // Contradicting tables.
        for bad in [
            vec![FileLocksState {
                ino: F,
                posix: vec![(1, 0, 9, true, 1), (1, 5, 20, false, 1)],
                flock: vec![],
            }],
            vec![FileLocksState { ino: F, posix: vec![(1, 9, 0, true, 1)], flock: vec![] }],
            vec![FileLocksState { ino: F, posix: vec![], flock: vec![(3, true), (3, false)] }],
        ] {
            let t = LockManager::new();
            assert!(t.restore(&bad, &WaitsState::default()).is_err(), "{bad:?}");
            assert_eq!(t.lock_count(), 0);
        }
    }

    fn ranges(m: &LockManager, ino: u64, owner: u64) -> Vec<(u64, u64, bool)> {
        let st = m.state();
        let mut v: Vec<_> = st
            .files
            .get(&ino)
            .map(|f| f.posix.iter().filter(|h| h.owner == owner).map(|h| (h.start, h.end, h.write)).collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    #[test]
    fn split_merge_upgrade_downgrade() {
        let m = LockManager::new();
        m.set(F, px(1), &lk(LockType::Write, 0, 99)).unwrap();
        // Unlocking the middle splits.
        m.set(F, px(1), &lk(LockType::Unlock, 40, 59)).unwrap();
        assert_eq!(ranges(&m, F, 1), [(0, 39, true), (60, 99, true)]);
        assert_eq!(m.lock_count(), 2);
        // A read lock over the gap and into both neighbours downgrades those bytes.
        m.set(F, px(1), &lk(LockType::Read, 30, 69)).unwrap();
        assert_eq!(ranges(&m, F, 1), [(0, 29, true), (30, 69, false), (70, 99, true)]);
        // Upgrade the read range: everything merges into one write lock.
        m.set(F, px(1), &lk(LockType::Write, 30, 69)).unwrap();
        assert_eq!(ranges(&m, F, 1), [(0, 99, true)]);
        // Adjacent same-type ranges merge; to-EOF ranges do not overflow.
        m.set(F, px(1), &lk(LockType::Write, 100, OFFSET_MAX)).unwrap();
        assert_eq!(ranges(&m, F, 1), [(0, OFFSET_MAX, true)]);
        m.set(F, px(1), &lk(LockType::Write, u64::MAX, u64::MAX)).unwrap();
        assert_eq!(ranges(&m, F, 1), [(0, OFFSET_MAX, true), (u64::MAX, u64::MAX, true)]);
        m.set(F, px(1), &lk(LockType::Unlock, 0, u64::MAX)).unwrap();
        assert!(ranges(&m, F, 1).is_empty());
        assert_eq!(m.lock_count(), 0);
        assert!(m.state().files.is_empty(), "an empty file table is dropped");
    }

    #[test]
    fn conflicts_and_getlk() {
        let m = LockManager::new();
        m.set(F, px(1), &FileLock { pid: 100, ..lk(LockType::Read, 0, 9) }).unwrap();
        m.set(F, px(2), &FileLock { pid: 200, ..lk(LockType::Read, 5, 14) }).unwrap();
        assert_eq!(m.set(F, px(3), &lk(LockType::Write, 9, 9)), Err(LockError::WouldBlock));
        m.set(F, px(3), &FileLock { pid: 300, ..lk(LockType::Write, 15, 20) }).unwrap();
        // GETLK reports the conflicting lock with its holder's pid.
        let c = m.test(F, 4, &lk(LockType::Read, 0, 100)).unwrap();
        assert_eq!((c.start, c.end, c.typ, c.pid), (15, 20, LockType::Write, 300));
        let c = m.test(F, 4, &lk(LockType::Write, 12, 12)).unwrap();
        assert_eq!((c.start, c.end, c.typ, c.pid), (5, 14, LockType::Read, 200));
        assert!(m.test(F, 4, &lk(LockType::Read, 0, 14)).is_none(), "readers share");
        assert!(m.test(F, 3, &lk(LockType::Write, 15, 20)).is_none(), "own locks never conflict");
        assert!(m.test(F + 1, 4, &lk(LockType::Write, 0, 100)).is_none(), "other files are apart");
        // An owner may upgrade only where nobody else reads; a refused request changes nothing.
        assert_eq!(m.set(F, px(1), &lk(LockType::Write, 0, 9)), Err(LockError::WouldBlock));
        assert_eq!(ranges(&m, F, 1), [(0, 9, false)]);
        m.release_owner(F, 2);
        m.set(F, px(1), &lk(LockType::Write, 0, 9)).unwrap();
    }

    #[test]
    fn owner_and_handle_release() {
        let m = LockManager::new();
        m.set(F, px(1), &lk(LockType::Write, 0, 9)).unwrap();
        m.set(F, px(1), &lk(LockType::Write, 20, 29)).unwrap();
        m.set(F + 1, px(1), &lk(LockType::Write, 0, 9)).unwrap();
        m.set(F, px(2), &lk(LockType::Read, 40, 49)).unwrap();
        m.set(F, LockKind::Flock { fh: 5 }, &lk(LockType::Read, 0, OFFSET_MAX)).unwrap();
        assert_eq!(m.lock_count(), 5);
        // FLUSH drops the owner's locks on that file only.
        m.release_owner(F, 1);
        assert!(ranges(&m, F, 1).is_empty());
        assert_eq!(ranges(&m, F + 1, 1), [(0, 9, true)]);
        assert_eq!(ranges(&m, F, 2), [(40, 49, false)]);
        // RELEASE drops the handle's flock (and the named owner's locks).
        m.release_handle(F, 5, Some(2));
        assert_eq!(m.lock_count(), 1);
        m.set(F, LockKind::Flock { fh: 6 }, &lk(LockType::Write, 0, OFFSET_MAX)).unwrap();
        m.clear_file(F + 1);
        m.clear_file(F);
        assert_eq!(m.lock_count(), 0);
    }

    #[test]
    fn flock_conversion() {
        let m = LockManager::new();
        let (a, b) = (LockKind::Flock { fh: 1 }, LockKind::Flock { fh: 2 });
        let sh = lk(LockType::Read, 0, OFFSET_MAX);
        let ex = lk(LockType::Write, 0, OFFSET_MAX);
        m.set(F, a, &sh).unwrap();
        m.set(F, b, &sh).unwrap();
        m.set(F, a, &sh).unwrap();
        assert_eq!(m.lock_count(), 2, "taking the same lock again changes nothing");
        // Upgrading while another file shares fails, and (like flock(2)) gave up the shared lock.
        assert_eq!(m.set(F, a, &ex), Err(LockError::WouldBlock));
        assert_eq!(m.lock_count(), 1);
        // Now b may upgrade; a may not share.
        m.set(F, b, &ex).unwrap();
        assert_eq!(m.set(F, a, &sh), Err(LockError::WouldBlock));
        // Downgrade, then a shares again.
        m.set(F, b, &sh).unwrap();
        m.set(F, a, &sh).unwrap();
        // POSIX and flock locks do not interact.
        m.set(F, px(9), &lk(LockType::Write, 0, OFFSET_MAX)).unwrap();
        m.set(F, b, &lk(LockType::Unlock, 0, 0)).unwrap();
        assert_eq!(m.lock_count(), 2);
    }

    #[test]
    fn waiters_are_granted_when_the_conflict_goes() {
        let m = LockManager::new();
        m.set(F, px(1), &lk(LockType::Write, 0, 99)).unwrap();
        let g0 = m.generation();
        let SetOutcome::Wait(w) = m.set_or_wait(F, px(2), &lk(LockType::Read, 50, 50), 11).unwrap() else {
            panic!("a conflicting SETLKW waits")
        };
        assert_eq!(m.poll_wait(w), None);
        assert_eq!(m.waiter_count(), 1);
        // Unrelated changes do not grant it; they do move the generation.
        m.set(F, px(1), &lk(LockType::Write, 200, 300)).unwrap();
        assert_ne!(m.generation(), g0);
        assert_eq!(m.poll_wait(w), None);
        // A downgrade of the blocking range lets the reader in.
        let g1 = m.generation();
        m.set(F, px(1), &lk(LockType::Read, 0, 99)).unwrap();
        assert_ne!(m.generation(), g1);
        assert_eq!(m.poll_wait(w), Some(Ok(())));
        assert_eq!(m.waiter_count(), 0);
        assert_eq!(ranges(&m, F, 2), [(50, 50, false)]);
        // No conflict: SETLKW is done at once.
        assert_eq!(m.set_or_wait(F, px(3), &lk(LockType::Read, 0, 9), 13), Ok(SetOutcome::Done));
    }

    #[test]
    fn interrupts_before_and_after_the_request() {
        let m = LockManager::new();
        m.set(F, px(1), &lk(LockType::Write, 0, 99)).unwrap();
        let SetOutcome::Wait(w) = m.set_or_wait(F, px(2), &lk(LockType::Write, 0, 0), 21).unwrap() else {
            panic!("waits")
        };
        let g = m.generation();
        assert!(m.interrupt(21));
        assert_ne!(m.generation(), g, "an interrupt wakes the waiter's poller");
        assert_eq!(m.poll_wait(w), Some(Err(LockError::Interrupted)));
        assert_eq!(m.waiter_count(), 0);
        // The INTERRUPT arrives first (another queue): the request then fails at once...
        assert!(!m.interrupt(23));
        assert_eq!(m.set_or_wait(F, px(2), &lk(LockType::Write, 0, 0), 23), Err(LockError::Interrupted));
        // ...once: the interrupt is used up.
        assert!(matches!(m.set_or_wait(F, px(2), &lk(LockType::Write, 0, 0), 23), Ok(SetOutcome::Wait(_))));
        // ...and is moot if the lock can be had at once.
        assert!(!m.interrupt(25));
        assert_eq!(m.set_or_wait(F, px(2), &lk(LockType::Write, 500, 500), 25), Ok(SetOutcome::Done));
        // Remembered interrupts are bounded.
        for u in 0..10 * MAX_EARLY_INTERRUPTS as u64 {
            m.interrupt(1000 + 2 * u);
        }
        assert_eq!(m.state().early.len(), MAX_EARLY_INTERRUPTS);
        // A request that waits elsewhere takes its early interrupt, once.
        let m = LockManager::new();
        assert!(!m.interrupt(31));
        assert!(!m.take_early_interrupt(33));
        assert!(m.take_early_interrupt(31));
        assert!(!m.take_early_interrupt(31));
    }

    #[test]
    fn deadlock_detection() {
        let m = LockManager::new();
        // Two owners: 1 holds byte 0 and waits for byte 1, which 2 holds; 2 asking for byte 0
        // would close the cycle.
        m.set(F, px(1), &lk(LockType::Write, 0, 0)).unwrap();
        m.set(F, px(2), &lk(LockType::Write, 1, 1)).unwrap();
        let SetOutcome::Wait(w1) = m.set_or_wait(F, px(1), &lk(LockType::Write, 1, 1), 1).unwrap() else {
            panic!("waits")
        };
        assert_eq!(m.set_or_wait(F, px(2), &lk(LockType::Write, 0, 0), 2), Err(LockError::Deadlock));
        // SETLK does not wait, so it cannot deadlock: it is just refused.
        assert_eq!(m.set(F, px(2), &lk(LockType::Write, 0, 0)), Err(LockError::WouldBlock));
        // A third owner waiting for byte 0 is no cycle.
        let SetOutcome::Wait(w3) = m.set_or_wait(F, px(3), &lk(LockType::Read, 0, 0), 3).unwrap() else {
            panic!("waits")
        };
        // Across files and through three owners: 3 waits for 1 (file F), 1 waits for 2; 2 asking
        // for something 3 holds on another file closes 2 -> 3 -> 1 -> 2.
        m.set(F + 1, px(3), &lk(LockType::Write, 0, 0)).unwrap();
        assert_eq!(m.set_or_wait(F + 1, px(2), &lk(LockType::Read, 0, 0), 4), Err(LockError::Deadlock));
        // Owner 2 unlocks: 1 gets byte 1, then 3 still waits for 1's byte 0.
        m.set(F, px(2), &lk(LockType::Unlock, 0, OFFSET_MAX)).unwrap();
        assert_eq!(m.poll_wait(w1), Some(Ok(())));
        assert_eq!(m.poll_wait(w3), None);
        m.release_owner(F, 1);
        assert_eq!(m.poll_wait(w3), Some(Ok(())));
        // flock waits are never reported as deadlocks (Linux does not check them either).
        let (a, b) = (LockKind::Flock { fh: 1 }, LockKind::Flock { fh: 2 });
        let ex = lk(LockType::Write, 0, OFFSET_MAX);
        m.set(F + 2, a, &ex).unwrap();
        m.set(F + 3, b, &ex).unwrap();
        assert!(matches!(m.set_or_wait(F + 3, a, &ex, 7), Ok(SetOutcome::Wait(_))));
        assert!(matches!(m.set_or_wait(F + 2, b, &ex, 8), Ok(SetOutcome::Wait(_))));
    }

    #[test]
    fn session_end_and_cancel() {
        let m = LockManager::new();
        m.set(F, px(1), &lk(LockType::Write, 0, 0)).unwrap();
        let SetOutcome::Wait(a) = m.set_or_wait(F, px(2), &lk(LockType::Write, 0, 0), 1).unwrap() else {
            panic!("waits")
        };
        let SetOutcome::Wait(b) = m.set_or_wait(F, px(3), &lk(LockType::Write, 0, 0), 3).unwrap() else {
            panic!("waits")
        };
        m.cancel_wait(b);
        assert_eq!(m.waiter_count(), 1);
        m.interrupt(99);
        m.end_session();
        assert_eq!(m.lock_count(), 0);
        assert_eq!(m.poll_wait(a), Some(Err(LockError::SessionEnded)));
        assert_eq!(m.poll_wait(b), Some(Err(LockError::SessionEnded)), "an unknown waiter has ended");
        assert!(m.state().early.is_empty());
    }

    #[test]
    fn bounded() {
        let m = LockManager::new();
        for i in 0..MAX_LOCKS_PER_FILE as u64 {
            m.set(F, px(1), &lk(LockType::Read, i * 2, i * 2)).unwrap();
        }
        assert_eq!(m.set(F, px(1), &lk(LockType::Read, 1 << 40, 1 << 40)), Err(LockError::NoLocks));
        assert_eq!(
            m.set(F, LockKind::Flock { fh: 1 }, &lk(LockType::Read, 0, 0)),
            Err(LockError::NoLocks),
            "flock records count too"
        );
        // Filling a gap merges and is always possible.
        m.set(F, px(1), &lk(LockType::Read, 1, 1)).unwrap();
        // The total over all files is bounded too.
        let m = LockManager::new();
        let per = 16;
        let mut failed = None;
        for i in 0..(MAX_LOCKS as u64 + 1) {
            if let Err(e) = m.set(i / per, px(1), &lk(LockType::Read, (i % per) * 2, (i % per) * 2)) {
                failed = Some((i, e));
                break;
            }
        }
        assert_eq!(failed, Some((MAX_LOCKS as u64, LockError::NoLocks)));
        assert_eq!(m.lock_count(), MAX_LOCKS);
        // Waiters are bounded.
        let m = LockManager::new();
        m.set(F, px(0), &lk(LockType::Write, 0, OFFSET_MAX)).unwrap();
        for o in 1..=MAX_WAITERS as u64 {
            assert!(matches!(
                m.set_or_wait(F, px(o), &lk(LockType::Read, 0, 0), o * 2),
                Ok(SetOutcome::Wait(_))
            ));
        }
        assert_eq!(m.set_or_wait(F, px(5000), &lk(LockType::Read, 0, 0), 1), Err(LockError::NoLocks));
        assert_eq!(m.waiter_count(), MAX_WAITERS);
    }

    #[test]
    fn deadlock_search_is_bounded() {
        // A chain of owners: owner i holds byte i and waits for byte i + 1 (held by i + 1).
        let chain = |len: u64| {
            let m = LockManager::new();
            for i in 1..=len {
                m.set(F, px(i), &lk(LockType::Write, i, i)).unwrap();
            }
            for i in 1..len {
                assert!(matches!(
                    m.set_or_wait(F, px(i), &lk(LockType::Write, i + 1, i + 1), i),
                    Ok(SetOutcome::Wait(_))
                ));
            }
            // The last owner asks for byte 1: the cycle len -> 1 -> 2 -> ... -> len.
            m.set_or_wait(F, px(len), &lk(LockType::Write, 1, 1), 1000)
        };
        assert_eq!(chain(10), Err(LockError::Deadlock));
        assert_eq!(chain(MAX_DEADLOCK_STEPS as u64), Err(LockError::Deadlock));
        // Longer than the search goes: not detected (Linux stops after 10 owners), it waits.
        assert!(matches!(chain(2 * MAX_DEADLOCK_STEPS as u64), Ok(SetOutcome::Wait(_))));
    }
}
