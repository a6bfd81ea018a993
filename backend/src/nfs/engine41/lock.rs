//! Locks kept by the server (`crate::nfs::locks41` has the shared state): GETLK is LOCKT, SETLK
//! LOCK (the owner's first lock on a file from the FUSE handle's open, later ones by its lock
//! stateid) or LOCKU; FLUSH of a lock owner and RELEASE let the owner's lock state go (LOCKU
//! of the whole file, FREE_STATEID) before they are answered, RELEASE before its CLOSE (which
//! would fail NFS4ERR_LOCKS_HELD). A SETLKW that must wait is tried from background slots
//! ([`start_try`], [`background`]): LOCK with the blocking types, no guest request behind it.
//!
//! Errors: DENIED is EAGAIN (GETLK: the lock in the way, with the process of its last lock when
//! its owner is one of this device's, else pid 0: the server does not say which
//! process holds it, as Linux's NFS client reports it), DEADLOCK EDEADLK, LOCK_RANGE and
//! LOCK_NOTSUPP ENOLCK (the request is well formed: the server cannot keep that lock; EINVAL
//! would blame the caller's arguments); a lock stateid the server no longer knows is forgotten
//! and its file marked lost (`Locks41::lose_locks`: EIO through the handles opened before,
//! until its last close): a LOCK under it is EIO, a LOCKU answered OK.

use std::time::Instant;

use super::reply::Flow;
use super::slot::{stateid_of, Kind, Slot, Step};
use crate::filesystem::{Error, FileLock, LockRequest, LockType, Reply};
use crate::nfs::conn::{CallError, CompoundReply};
use crate::nfs::convert::cred;
use crate::nfs::locks41::{After, Attempt, Counter, Locks41, Orphan, Owner, Tried};
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs4::{LockType as NfsLock, Nfsstat4, OpNum, OpRes, Stateid};
use crate::nfs::wire::Fh;
use crate::request::LockOp;
use crate::types::{Context, OFFSET_MAX};

/// The lock in the way of a DENIED: offset, length, type, and its owner when it is one of
/// this client's names (the client id it was given under, and the owner).
type InTheWay = (u64, u64, NfsLock, Option<(u64, Owner)>);

/// What a lock COMPOUND's reply says.
struct LockGot {
    failed: Option<(OpNum, Nfsstat4)>,
    /// The lock in the way (DENIED).
    denied: Option<InTheWay>,
    /// LOCK's or LOCKU's stateid.
    stateid: Option<Stateid>,
}

fn got(reply: &CompoundReply<'_>) -> Result<LockGot, Error> {
    let mut g = LockGot { failed: None, denied: None, stateid: None };
    for r in reply.results.clone() {
        match r.map_err(|_| Error::Io)? {
            OpRes::Failed { op, status, denied } => {
                g.failed = Some((op, status));
                g.denied = denied.map(|d| {
                    (
                        d.offset,
                        d.length,
                        d.locktype,
                        Owner::parse(d.owner.owner).map(|o| (d.owner.clientid, o)),
                    )
                });
            }
            OpRes::Lock(s) | OpRes::Locku(s) => g.stateid = Some(s),
            _ => {}
        }
    }
    if g.failed.is_none() && reply.status != Nfsstat4::Ok {
        // Failed at SEQUENCE or before any operation ran: never a success.
        g.failed = Some((OpNum::Sequence, reply.status));
    }
    Ok(g)
}

/// The guest's error for a lock operation's status.
fn lock_error(s: Nfsstat4) -> Error {
    match s {
        Nfsstat4::Denied => Error::from_errno(libc::EAGAIN),
        Nfsstat4::Deadlock => Error::from_errno(libc::EDEADLK),
        Nfsstat4::LockRange | Nfsstat4::LockNotSupp => Error::from_errno(libc::ENOLCK),
        s => super::attr::error(s),
    }
}

/// A stateid the server no longer knows (restarted, revoked, freed).
fn stale(s: Nfsstat4) -> bool {
    matches!(s, Nfsstat4::BadStateid | Nfsstat4::StaleStateid | Nfsstat4::OldStateid | Nfsstat4::Expired)
}

/// The conflicting lock of a DENIED as FUSE's (inclusive end, `OFFSET_MAX` to the end).
fn conflict(offset: u64, length: u64, t: NfsLock) -> FileLock {
    let start = offset.min(OFFSET_MAX);
    let end = match length {
        0 | u64::MAX => OFFSET_MAX,
        n => offset.saturating_add(n - 1).min(OFFSET_MAX),
    };
    let typ = match t {
        NfsLock::Read | NfsLock::ReadW => LockType::Read,
        NfsLock::Write | NfsLock::WriteW => LockType::Write,
    };
    FileLock { start, end, typ, pid: 0 }
}

/// The shared lock state (a 4.1 export's).
fn locks(fs: &Shared) -> Result<&Locks41, Error> {
    fs.v41.as_ref().map(|_| &*fs.locks41).ok_or(Error::InvalidArgument)
}

/// GETLK, SETLK, or an unlocking SETLKW (the server checked the handle; a SETLKW that sets a
/// lock waits in [`Locks41`] and never comes here).
pub(super) fn prepare(fs: &Shared, slot: &mut Slot, l: &LockRequest) -> Result<Option<Reply>, Error> {
    let locks = locks(fs)?;
    slot.obj = fs.nodes.fh(slot.nodeid)?;
    let owner = Owner::of(l);
    slot.lock = l.lock;
    slot.handle = l.fh;
    slot.lock_owner = owner;
    slot.lock_name = owner.name();
    slot.lock_state = locks.states.get(slot.nodeid, owner);
    let step = match (l.op, l.lock.typ) {
        (LockOp::Get, _) => {
            slot.kind = Kind::Getlk;
            Step::Lockt
        }
        // Nothing kept: the owner holds nothing on the server.
        (_, LockType::Unlock) if slot.lock_state.is_none() => return Ok(Some(Reply::Empty)),
        (_, LockType::Unlock) => Step::Locku,
        (LockOp::Set, _) => {
            if locks.is_lost(slot.nodeid) {
                // The file's locks are gone from the server: no new one until its last close.
                return Err(Error::Io);
            }
            slot.stateid = open_stateid(fs, l.fh, slot.nodeid)?;
            room(locks, slot)?;
            first_step(locks, slot)
        }
        (LockOp::SetWait, _) => return Err(Error::InvalidArgument),
    };
    if step != Step::Lockt {
        slot.kind = Kind::Setlk;
        // Writes the server may have lost are on it again before the lock changes hands
        // (as Linux's client flushes before a lock operation): a replay after an unlock could
        // land over what the next holder wrote.
        slot.step = step;
        if super::commit::commit_first(fs, slot, Some(step), true) {
            return Ok(None);
        }
    }
    slot.step = step;
    Ok(None)
}

/// `ENOLCK` when the LOCK would make a lock state past [`crate::nfs::locks41::MAX_LOCK_STATES`].
fn room(locks: &Locks41, slot: &Slot) -> Result<(), Error> {
    if slot.lock_state.is_none() && locks.states.full(slot.nodeid, slot.lock_owner) {
        log::debug!("nfs4.1: lock states at their bound: ENOLCK");
        return Err(Error::from_errno(libc::ENOLCK));
    }
    Ok(())
}

/// A LOCK's first step: LOCKU first when a flock owner changes the type it holds (flock(2)
/// lets the old lock go before it takes or waits for the new one: two holders of LOCK_SH that
/// both ask LOCK_EX would otherwise wait for each other for ever), else the LOCK.
fn first_step(locks: &Locks41, slot: &mut Slot) -> Step {
    let held = locks.states.held(slot.nodeid, slot.lock_owner);
    slot.convert = matches!(slot.lock_owner, Owner::Flock(_))
        && slot.lock_state.is_some()
        && matches!(held, Some(t) if t != LockType::Unlock && t != slot.lock.typ);
    if slot.convert {
        Step::Locku
    } else {
        Step::Lock
    }
}

/// The LOCKU of a conversion (`slot.convert`) let the old lock go (`stateid`: the lock
/// state's, as LOCKU gave it): the LOCK comes next, under it.
fn converted(locks: &Locks41, slot: &mut Slot, stateid: Option<Stateid>) {
    let s = stateid.or(slot.lock_state);
    if let Some(s) = s {
        locks.states.set(slot.nodeid, slot.lock_owner, s, &unlock(&slot.lock), slot.handle);
    }
    slot.lock_state = s;
    slot.convert = false;
    slot.step = Step::Lock;
}

/// `l`'s range let go (what a LOCKU of it leaves).
fn unlock(l: &FileLock) -> FileLock {
    FileLock { typ: LockType::Unlock, ..*l }
}

/// The open stateid of FUSE handle `fh`, a file handle of `nodeid`.
fn open_stateid(fs: &Shared, fh: u64, nodeid: u64) -> Result<Stateid, Error> {
    let f = fs.handles.get(fh).filter(|f| f.nodeid == nodeid && !f.dir).ok_or(Error::BadHandle)?;
    Ok(stateid_of(f.state))
}

/// FLUSH by `lock_owner`: the close of a descriptor drops the process's POSIX locks on the
/// file; with lock state kept for it, that goes first. `None`: nothing to send.
pub(super) fn flush(fs: &Shared, slot: &mut Slot, lock_owner: u64) -> Option<()> {
    let locks = fs.v41.as_ref().map(|_| &*fs.locks41)?;
    let s = locks.states.forget(slot.nodeid, Owner::Posix(lock_owner))?;
    match fs.nodes.fh(slot.nodeid) {
        Ok(fh) => slot.obj = fh,
        Err(_) => return None,
    }
    slot.frees.push(s);
    slot.kind = Kind::Flush;
    slot.step = Step::Free;
    Some(())
}

/// RELEASE of handle `fh` of `nodeid` (closed in the table already; `obj` its file handle):
/// the lock states that go with it join `slot.frees`: the handle's flock lock, the lock owner
/// the kernel names (OFD locks), and at the file's last close whatever is left on it.
pub(super) fn release(fs: &Shared, slot: &mut Slot, nodeid: u64, fh: u64, lock_owner: u64) {
    if fs.v41.is_none() {
        return;
    }
    let states = &fs.locks41.states;
    if let Some(s) = states.forget(nodeid, Owner::Flock(fh)) {
        slot.frees.push(s);
    }
    if lock_owner != 0 {
        if let Some(s) = states.forget(nodeid, Owner::Posix(lock_owner)) {
            slot.frees.push(s);
        }
    }
    // Whatever came from this handle's open: an OFD lock's owner is the open file, which the
    // kernel names in RELEASE only with a flock held (`FUSE_RELEASE_FLOCK_UNLOCK`), and no
    // FLUSH names it.
    slot.frees.extend(states.forget_from(nodeid, fh));
    if !fs.nodes.has_opens(nodeid) {
        slot.frees.extend(states.forget_node(nodeid).into_iter().map(|(_, s)| s));
    }
}

/// A lock step's reply, for a guest request's slot.
pub(super) fn reply(fs: &Shared, slot: &mut Slot, res: Result<CompoundReply<'_>, CallError>) -> Flow {
    let r = match res {
        Ok(r) => got(&r),
        Err(e) => {
            log::debug!("nfs4.1: {:?} of request {:?} ended: {e}", slot.step, slot.token);
            Err(Error::Io)
        }
    };
    let g = match r {
        Ok(g) => g,
        // No reply: the lock state goes again as an orphan (the pollers' renewals would keep
        // it, and a CLOSE after it would fail LOCKS_HELD).
        Err(_) if slot.step == Step::Free => {
            free_again(&fs.locks41, slot);
            return freed(&fs.locks41, slot, false);
        }
        Err(e) => return Flow::Done(Err(e)),
    };
    let locks = &fs.locks41;
    if slot.step != Step::Free
        && matches!(g.failed, None | Some((OpNum::Lock | OpNum::Lockt | OpNum::Locku, _)))
    {
        locks.count(Counter::Call);
    }
    if let Some((_, s)) = g.failed.filter(|(_, s)| stale(*s)) {
        if let Some(flow) = refresh(fs, slot, s) {
            return flow;
        }
    }
    match (slot.step, g.failed) {
        (Step::Free, failed) => {
            if let Some((op, s)) = failed {
                log::debug!("nfs4.1: letting a lock state of node {} go: {op:?} {s:?}", slot.nodeid);
                if !stale(s) {
                    free_again(locks, slot);
                }
            }
            freed(locks, slot, failed.is_none())
        }
        (Step::Lockt, None) => Flow::Done(Ok(Reply::Lock(FileLock { typ: LockType::Unlock, ..slot.lock }))),
        (Step::Lockt, Some((OpNum::Lockt, Nfsstat4::Denied))) => {
            locks.count(Counter::Denied);
            match g.denied {
                Some((o, l, t, owner)) => {
                    // A lock of this device's (this client id, one of our owner names) is named
                    // by its process, as a local lock is; another client's by pid 0.
                    let ours = fs.v41.as_ref().and_then(|v| v.client.clientid());
                    let pid = match owner {
                        Some((c, owner)) if Some(c) == ours => locks.pid_of(owner),
                        _ => 0,
                    };
                    Flow::Done(Ok(Reply::Lock(FileLock { pid, ..conflict(o, l, t) })))
                }
                None => Flow::Done(Err(Error::Io)),
            }
        }
        (Step::Lock, None) => match g.stateid {
            Some(s) => {
                locks.states.set(slot.nodeid, slot.lock_owner, s, &slot.lock, slot.handle);
                locks.note_pid(slot.lock_owner, slot.lock.pid);
                Flow::Done(Ok(Reply::Empty))
            }
            None => Flow::Done(Err(Error::Io)),
        },
        (Step::Lock, Some((OpNum::Lock, s))) if stale(s) && slot.lock_state.is_some() => {
            // The owner's locks on the file are gone from the server: not taken anew as its
            // first, which would hide the loss.
            forget_stale(locks, slot, s);
            Flow::Done(Err(Error::Io))
        }
        (Step::Lock, Some((OpNum::Lock, Nfsstat4::Denied))) => {
            locks.count(Counter::Denied);
            Flow::Done(Err(lock_error(Nfsstat4::Denied)))
        }
        (Step::Locku, None) if slot.convert => {
            converted(locks, slot, g.stateid);
            Flow::Next
        }
        (Step::Locku, None) => {
            if let Some(s) = g.stateid.or(slot.lock_state) {
                locks.states.set(slot.nodeid, slot.lock_owner, s, &unlock(&slot.lock), slot.handle);
            }
            Flow::Done(Ok(Reply::Empty))
        }
        (Step::Locku, Some((OpNum::Locku, s))) if stale(s) => {
            // The server holds nothing under it any more: unlocked (a conversion: its lock
            // is lost).
            forget_stale(locks, slot, s);
            Flow::Done(if slot.convert { Err(Error::Io) } else { Ok(Reply::Empty) })
        }
        (_, Some((op, s))) => {
            if stale(s) {
                // The open is lost (a restart): any lock state kept of the file is too.
                locks.lose(slot.nodeid);
                log::warn!(
                    "nfs4.1: {op:?} of node {}: {s:?} (the open or the lock state is gone)",
                    slot.nodeid
                );
            }
            Flow::Done(Err(lock_error(s)))
        }
        _ => Flow::Done(Err(Error::Io)),
    }
}

/// A LOCK or LOCKU of `slot` found its state unknown (`s`): if the states it used changed
/// since it went (a reclaim after a server restart took them back), it goes again with them;
/// while a reclaim is under way it waits for it (`reopen::RECLAIM_WAIT`, within its deadline);
/// a file whose locks were lost is EIO for a LOCK, done for a LOCKU. `None`: the loss is real,
/// as the caller handles it.
fn refresh(fs: &Shared, slot: &mut Slot, s: Nfsstat4) -> Option<Flow> {
    if !matches!(slot.step, Step::Lock | Step::Locku) {
        return None;
    }
    let locks = &fs.locks41;
    if locks.is_lost(slot.nodeid) {
        log::debug!("nfs4.1: {:?} of node {}: {s:?}, its locks lost", slot.step, slot.nodeid);
        return Some(Flow::Done(if slot.step == Step::Lock || slot.convert {
            Err(Error::Io)
        } else {
            Ok(Reply::Empty)
        }));
    }
    let lock_state = locks.states.get(slot.nodeid, slot.lock_owner);
    let open = open_stateid(fs, slot.handle, slot.nodeid).ok();
    let moved = lock_state.map(|l| l.other) != slot.lock_state.map(|l| l.other)
        || (slot.lock_state.is_none() && open.is_some_and(|o| o.other != slot.stateid.other));
    if moved {
        slot.lock_state = lock_state;
        if let Some(o) = open {
            slot.stateid = o;
        }
        if slot.step == Step::Locku && lock_state.is_none() {
            // Nothing kept now: the server holds nothing of the owner's there.
            return Some(Flow::Done(Ok(Reply::Empty)));
        }
        return Some(Flow::Next);
    }
    if super::reopen::reclaiming(fs) {
        return Some(Flow::After(super::reopen::RECLAIM_WAIT));
    }
    None
}

/// The lock state `slot` used is unknown to the server (`s`: it restarted, or revoked it): the
/// state is forgotten and the file marked ([`Locks41::lose_locks`]), so no READ or WRITE through
/// a handle opened before goes on without the lock the guest believes it holds.
fn forget_stale(locks: &Locks41, slot: &mut Slot, s: Nfsstat4) {
    log::warn!(
        "nfs4.1: lock state of node {} unknown to the server ({s:?}): its locks are lost, EIO until its last close",
        slot.nodeid
    );
    locks.count(Counter::Stale);
    locks.states.forget(slot.nodeid, slot.lock_owner);
    locks.lose_locks(slot.nodeid);
    slot.lock_state = None;
}

/// The LOCKU and FREE_STATEID of the last of `slot.frees` (a FLUSH's or RELEASE's) failed
/// otherwise than on a stateid the server no longer knows: it goes again as an orphan
/// ([`Locks41::orphan_again`], bounded).
fn free_again(locks: &Locks41, slot: &Slot) {
    if let Some(&s) = slot.frees.last() {
        locks.orphan_again(Orphan::Lock(slot.obj, s), 0);
    }
}

/// One lock state of `slot.frees` was let go (`ok`: the server said so): the next, the CLOSE
/// of a RELEASE, or the answer.
fn freed(locks: &Locks41, slot: &mut Slot, ok: bool) -> Flow {
    slot.frees.pop();
    if ok {
        locks.count(Counter::Freed);
    }
    if !slot.frees.is_empty() {
        return Flow::Next;
    }
    if slot.kind == Kind::Release {
        if let Some(step) = slot.release_step() {
            slot.step = step;
            return Flow::Next;
        }
    }
    // A FLUSH's COMMIT that failed before: its answer.
    Flow::Done(slot.answer.take().unwrap_or(Ok(Reply::Empty)))
}

/// Fills background slot `slot` with the try `a` of a waiting lock. An error ends the wait.
pub(super) fn start_try(fs: &Shared, slot: &mut Slot, a: Attempt) -> Result<(), Error> {
    let locks = locks(fs)?;
    if locks.is_lost(a.nodeid) {
        return Err(Error::Io);
    }
    slot.obj = fs.nodes.fh(a.nodeid)?;
    slot.stateid = open_stateid(fs, a.fh, a.nodeid)?;
    slot.nodeid = a.nodeid;
    slot.cred = cred(&Context { uid: a.uid, gid: a.gid, pid: 0, supp_gid: None });
    slot.lock = a.lock;
    slot.handle = a.fh;
    slot.lock_owner = a.owner;
    slot.lock_name = a.owner.name();
    slot.lock_state = locks.states.get(a.nodeid, a.owner);
    slot.frees.clear();
    room(locks, slot)?;
    slot.attempt = Some(a);
    slot.kind = Kind::Try;
    slot.step = first_step(locks, slot);
    Ok(())
}

/// Fills background slot `slot` with an orphaned lock state to let go.
pub(super) fn start_orphan(slot: &mut Slot, fh: Fh, s: Stateid) {
    slot.obj = fh;
    slot.nodeid = 0;
    slot.cred = crate::nfs::conn::Cred::ROOT;
    slot.frees.clear();
    slot.frees.push(s);
    slot.attempt = None;
    slot.kind = Kind::Orphan;
    slot.step = Step::Free;
}

/// Fills background slot `slot` with the LOCKU of `lock` under lock state `s` (a lock granted
/// to a wait that ended, whose first LOCKU failed).
pub(super) fn start_unlock(slot: &mut Slot, fh: Fh, s: Stateid, lock: FileLock) {
    slot.obj = fh;
    slot.nodeid = 0;
    slot.cred = crate::nfs::conn::Cred::ROOT;
    slot.frees.clear();
    slot.attempt = None;
    slot.lock = lock;
    slot.lock_state = Some(s);
    slot.convert = false;
    slot.kind = Kind::LetGo;
    slot.step = Step::Locku;
}

/// A background slot's call could not go or ended without a reply it can use: a try is
/// reported denied (another comes after its back-off).
pub(super) fn abandon(locks: &Locks41, slot: &mut Slot, now: Instant) {
    if let Some(a) = slot.attempt.take() {
        if locks.waits.attempted(a.id, Tried::Denied, now) == After::LetGo {
            log::debug!("nfs4.1: a try of wait {} was abandoned while its wait ended", a.id);
        }
    }
    slot.busy = false;
}

/// A background slot's reply: whether its (next) step is to be sent; otherwise it is free.
pub(super) fn background(
    locks: &Locks41,
    slot: &mut Slot,
    res: Result<CompoundReply<'_>, CallError>,
    now: Instant,
    reclaiming: bool,
) -> bool {
    let g = match res.map_err(|_| Error::Io).and_then(|r| got(&r)) {
        Ok(g) => g,
        Err(_) => {
            // No reply (a time-out, the session's end) or one that does not decode: a try
            // goes again later (the same owner's LOCK of the same range is granted again if
            // this one was); so does a LOCKU or an orphan, a bounded number of times.
            super::orphan::requeue(locks, slot, true);
            abandon(locks, slot, now);
            return false;
        }
    };
    match slot.kind {
        Kind::Try => {
            let Some(a) = slot.attempt else { return false };
            locks.count(Counter::Call);
            let tried = match g.failed {
                None if slot.step == Step::Locku => {
                    // A flock conversion's old lock is gone: now the LOCK.
                    converted(locks, slot, g.stateid);
                    return true;
                }
                None => match g.stateid {
                    Some(s) => {
                        locks.states.set(a.nodeid, a.owner, s, &a.lock, a.fh);
                        locks.note_pid(a.owner, a.lock.pid);
                        Tried::Granted
                    }
                    None => Tried::Failed(Error::Io),
                },
                // A restart's reclaim is under way: the try goes again after it, with the
                // states it leaves (`start_try` reads them anew).
                Some((_, s)) if stale(s) && reclaiming => Tried::Denied,
                Some((OpNum::Lock | OpNum::Locku, s)) if stale(s) && slot.lock_state.is_some() => {
                    forget_stale(locks, slot, s);
                    Tried::Failed(Error::Io)
                }
                Some((_, s)) if stale(s) => {
                    locks.lose(a.nodeid);
                    Tried::Failed(lock_error(s))
                }
                Some((_, Nfsstat4::Denied)) => {
                    locks.count(Counter::Denied);
                    Tried::Denied
                }
                Some((_, Nfsstat4::Grace | Nfsstat4::Delay)) => Tried::Denied,
                Some((_, s)) => Tried::Failed(lock_error(s)),
            };
            slot.attempt = None;
            if locks.waits.attempted(a.id, tried, now) == After::LetGo {
                // Granted to a wait that ended meanwhile: let it go.
                slot.lock_state = g.stateid;
                slot.kind = Kind::LetGo;
                slot.step = Step::Locku;
                return slot.lock_state.is_some();
            }
            false
        }
        Kind::LetGo => {
            locks.count(Counter::Call);
            match g.failed {
                Some((op, s)) => {
                    log::debug!("nfs4.1: letting go of a lock granted too late: {op:?} {s:?}");
                    if !stale(s) {
                        super::orphan::requeue(locks, slot, true);
                    }
                }
                None if slot.nodeid != 0 => {
                    // The grant's range is no longer held (a reclaim would take it again).
                    if let Some(s) = g.stateid.or(slot.lock_state) {
                        locks.states.set(slot.nodeid, slot.lock_owner, s, &unlock(&slot.lock), slot.handle);
                    }
                }
                None => {}
            }
            false
        }
        _ => {
            if let Some((op, s)) = g.failed {
                log::debug!("nfs4.1: letting an orphaned lock state go: {op:?} {s:?}");
                if !stale(s) {
                    super::orphan::requeue(locks, slot, true);
                }
            } else {
                locks.count(Counter::Freed);
            }
            false
        }
    }
}

/// Tags of background calls: this bit and the slot's index (guest slots are the server's
/// tokens, far below).
pub(super) const BG_TAG: u32 = 1 << 31;

/// Background slots of one engine: how many tries (and let-gos) it has on the wire at most.
const BG_SLOTS: usize = 4;

/// An engine's background lock calls: the tries of waiting locks, the let-gos, the orphans.
pub(super) struct Background {
    pub(super) slots: Vec<Slot>,
    /// Slots whose next step goes after this poll round's replies.
    pub(super) next: Vec<u32>,
    pub(super) locks: std::sync::Arc<Locks41>,
    /// The reclaim after a server restart this engine took (`reclaim`), until it ends.
    pub(super) reclaim: Option<super::reclaim::Reclaim>,
}

impl Background {
    pub(super) fn new(fs: &Shared, root: Fh) -> Background {
        Background {
            slots: (0..BG_SLOTS).map(|_| Slot::new(root)).collect(),
            next: Vec::with_capacity(BG_SLOTS),
            locks: fs.locks41.clone(),
            reclaim: None,
        }
    }

    /// The index of a background call's tag.
    pub(super) fn index(tag: u32) -> Option<usize> {
        (tag & BG_TAG != 0).then_some((tag & !BG_TAG) as usize)
    }

    /// A free slot, if any.
    pub(super) fn free(&self) -> Option<usize> {
        self.slots.iter().position(|s| !s.busy)
    }

    /// When the engine should look for work even if the connection has nothing: now with
    /// orphans, or at the next try's time; `None` when no slot is free.
    pub(super) fn due(&self) -> Option<Instant> {
        if self.reclaim.is_some() && !self.reclaim_out() {
            self.free()?;
            return Some(Instant::now());
        }
        if self.locks.idle() {
            return None;
        }
        self.free()?;
        if self.locks.has_orphans() {
            return Some(Instant::now());
        }
        match (self.locks.next_orphan_at(), self.locks.waits.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the reclaim's call is on the wire.
    pub(super) fn reclaim_out(&self) -> bool {
        self.slots.iter().any(|s| s.busy && s.kind == Kind::Reclaim)
    }

    /// The engine goes: tries on the wire are tried again by another engine.
    pub(super) fn abandon_all(&mut self, now: Instant) {
        for s in &mut self.slots {
            if s.busy {
                abandon(&self.locks, s, now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_go_both_ways_between_fuse_and_nfsv4() {
        let mut s = Slot::new(Fh::EMPTY);
        s.lock = FileLock { start: 10, end: 19, typ: LockType::Write, pid: 1 };
        assert_eq!(s.range(), (10, 10));
        s.lock.end = OFFSET_MAX;
        assert_eq!(s.range(), (10, u64::MAX), "to the end of the file");
        assert_eq!(
            conflict(10, 10, NfsLock::WriteW),
            FileLock { start: 10, end: 19, typ: LockType::Write, pid: 0 }
        );
        assert_eq!(conflict(0, u64::MAX, NfsLock::Read).end, OFFSET_MAX);
        // A server's odd answers still make a lock the kernel takes (start <= end <= OFFSET_MAX).
        let c = conflict(u64::MAX - 5, 100, NfsLock::Read);
        assert_eq!((c.start, c.end), (OFFSET_MAX, OFFSET_MAX));
        assert_eq!(conflict(5, 0, NfsLock::Read).end, OFFSET_MAX);
        assert_eq!(lock_error(Nfsstat4::LockRange), Error::from_errno(libc::ENOLCK));
        assert_eq!(lock_error(Nfsstat4::Deadlock), Error::from_errno(libc::EDEADLK));
        assert!(stale(Nfsstat4::OldStateid) && !stale(Nfsstat4::Denied));
    }
}
