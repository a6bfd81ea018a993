//! The reclaim after a server restart (RFC 8881 8.4.2): when the function's sessions come back
//! under a new client id (`ClientShare::owner_reclaims`: every client id after the first),
//! one engine takes the reclaim ([`Reclaim::take`]) and sends, from one background slot, one
//! COMPOUND at a time:
//!
//! 1. for every open handle of a file, PUTFH OPEN(CLAIM_PREVIOUS, no delegation, the handle's
//!    share access, a new open owner); the stateid goes into the handle table in place of the
//!    old one (if the handle still has that: closed or opened anew meanwhile, the reclaimed
//!    open is closed in the background);
//! 2. for every lock state, the ranges its owner held (`LockStates` keeps them), each a LOCK
//!    with `reclaim` set: the first from the open reclaimed of the handle the state came from
//!    (or another reclaimed open of the file), the others by the lock stateid the first gave;
//! 3. RECLAIM_COMPLETE, after which the server ends its grace period for this client.
//!
//! Meanwhile a request that finds its open or lock state unknown waits for the reclaim
//! (`reopen::reclaiming`) and goes again with what it left. What cannot be reclaimed (the
//! server answers NO_GRACE, RECLAIM_BAD, RECLAIM_CONFLICT..., or a lock owner held more ranges
//! than the device keeps) is dealt with as before reclaim existed: an open is opened anew when
//! next used; a lock state's file is marked lost (`Locks41::lose_locks`: READ, WRITE and new
//! locks through it EIO until its last close), never silently unlocked. A call without an
//! answer is sent again, [`TRIES`] times in all, then counts as failed. Reclaims go as root
//! (the tables keep no caller's credential), as the orphans' cleanup does.
//!
//! The same pass runs in a process started after the serving one was killed (a crash:
//! `ClientShare::recovered`): the client comes back in a new incarnation, whose confirmation
//! makes the server drop the dead process's opens and locks, with no grace period:
//! RECLAIM_COMPLETE goes first, then each open handle is opened anew (OPEN CLAIM_FH,
//! `Step::Reopen`; a guest request that meets a handle's lost open meanwhile waits for it), and
//! the files that held locks are marked lost already (from the records), so there is no lock
//! to take back.
//!
//! Writes the server lost with its memory are the UNSTABLE store's to send again, at the
//! file's next COMMIT (its verifier changed: `commit`), not the reclaim's.

use std::sync::Arc;

use super::prepare::open_owner;
use super::slot::{state_bytes, stateid_of, Kind, Slot, Step};
use crate::filesystem::{FileLock, LockType};
use crate::nfs::conn::{CallError, CompoundReply, Cred};
use crate::nfs::locks41::{Counter, Orphan, Owner};
use crate::nfs::session::{Client, ClientShare};
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs4::{open_result, Delegation, Nfsstat4, OpNum, OpRes, Stateid};
use crate::nfs::wire::Fh;

/// Sends of one item without an answer before it counts as failed.
pub(super) const TRIES: u8 = 3;

/// What there is to reclaim, taken from the tables when the reclaim starts.
#[derive(Debug)]
enum Item {
    /// The open of FUSE handle `handle` (a file of `nodeid`, file handle `fh`), which had
    /// `old`.
    Open { handle: u64, nodeid: u64, fh: Fh, flags: u32, old: Stateid },
    /// Lock state `old` of `owner` on `nodeid`, from the open of handle `from`, holding
    /// `ranges` (`None`: more than the device keeps); `done` of them reclaimed so far, under
    /// `new`.
    Lock {
        nodeid: u64,
        owner: Owner,
        from: u64,
        old: Stateid,
        ranges: Option<Vec<(u64, u64, LockType)>>,
        done: usize,
        new: Option<Stateid>,
    },
    /// RECLAIM_COMPLETE.
    Complete,
}

/// One engine's reclaim (see the module documentation).
#[derive(Debug)]
pub(super) struct Reclaim {
    share: Arc<ClientShare>,
    client: Client,
    items: Vec<Item>,
    /// The item sent next (or on the wire).
    at: usize,
    /// Sends of it without an answer so far.
    tries: u8,
    /// Handles whose open was reclaimed (a lock state's first LOCK goes from one of them).
    reclaimed: Vec<(u64, u64)>,
    /// A recovery after a crash of the serving process: no grace period, the opens are
    /// opened anew (CLAIM_FH) rather than reclaimed.
    reopen: bool,
}

impl Reclaim {
    /// The reclaim due on `clientid` (the engine's session's), if nobody took it yet: what
    /// the tables hold now.
    pub(super) fn take(fs: &Shared, clientid: u64) -> Option<Reclaim> {
        let v = fs.v41.as_ref()?;
        let client = v.client.take_reclaim(clientid)?;
        let mut items = Vec::new();
        for (handle, f) in fs.handles.open_handles() {
            let old = stateid_of(f.state);
            if f.dir || old == Stateid::ANONYMOUS {
                continue;
            }
            let Ok(fh) = fs.nodes.fh(f.nodeid) else { continue };
            items.push(Item::Open { handle, nodeid: f.nodeid, fh, flags: f.flags, old });
        }
        for (nodeid, owner, old, from, held) in fs.locks41.states.all() {
            let ranges = held.ranges().map(<[_]>::to_vec);
            items.push(Item::Lock { nodeid, owner, from, old, ranges, done: 0, new: None });
        }
        if v.client.is_recovery() {
            // No grace period to reclaim in: RECLAIM_COMPLETE first (a server may refuse other
            // opens before it, RFC 8881 18.51.3), then the opens anew.
            items.insert(0, Item::Complete);
        } else {
            items.push(Item::Complete);
        }
        log::info!(
            "nfs4.1: {} (client id {:#x}): {} {} opens and {} lock states",
            if v.client.is_recovery() { "a new process after a crash" } else { "the server restarted" },
            client.clientid,
            if v.client.is_recovery() { "opening again" } else { "reclaiming" },
            items.iter().filter(|i| matches!(i, Item::Open { .. })).count(),
            items.iter().filter(|i| matches!(i, Item::Lock { .. })).count(),
        );
        let reopen = v.client.is_recovery();
        Some(Reclaim {
            share: v.client.clone(),
            client,
            items,
            at: 0,
            tries: 0,
            reclaimed: Vec::new(),
            reopen,
        })
    }

    /// The reclaim's engine goes before it ended: another engine may take it.
    pub(super) fn give_back(&self) {
        self.share.give_back_reclaim(self.client);
    }

    /// Whether the client id reclaimed on is still the current one (another restart ends
    /// this reclaim; the next client id has one of its own).
    pub(super) fn current(&self) -> bool {
        self.share.is_current(self.client)
    }

    /// Whether the call in background slot `slot` is this reclaim's (not an older one's, on an
    /// earlier client id: [`stale_reply`]).
    pub(super) fn owns(&self, slot: &Slot) -> bool {
        slot.reclaim_of == self.client.epoch
    }

    /// Fills background slot `slot` with the next item's call; `false` when nothing is left
    /// to send (items that no longer apply are passed by here).
    pub(super) fn fill(&mut self, fs: &Shared, slot: &mut Slot) -> bool {
        let locks = &fs.locks41;
        loop {
            let Some(item) = self.items.get_mut(self.at) else {
                // A recovery's last open went (its RECLAIM_COMPLETE went first).
                self.share.reclaim_done(self.client);
                return false;
            };
            slot.cred = Cred::ROOT;
            slot.reclaim_of = self.client.epoch;
            slot.kind = Kind::Reclaim;
            slot.frees.clear();
            slot.attempt = None;
            slot.orphan = None;
            slot.answer = None;
            slot.convert = false;
            match item {
                Item::Open { handle, nodeid, fh, flags, old } => {
                    let Some(f) = fs.handles.get(*handle).filter(|f| stateid_of(f.state) == *old) else {
                        // Closed, or opened anew, meanwhile.
                        self.at += 1;
                        continue;
                    };
                    // As the caller that opened it: a server that squashes root would refuse
                    // root the reclaim of a file only its owner may open.
                    slot.cred = opener(f.opener);
                    slot.nodeid = *nodeid;
                    slot.handle = *handle;
                    slot.fh = *fh;
                    slot.flags = *flags;
                    slot.stateid = *old;
                    slot.owner = open_owner(fs);
                    slot.step = if self.reopen { Step::Reopen } else { Step::ReclaimOpen };
                    return true;
                }
                Item::Lock { nodeid, owner, from, old, ranges, done, new } => {
                    let (nodeid, owner, from, old, done, new) = (*nodeid, *owner, *from, *old, *done, *new);
                    let range = ranges.as_ref().map(|r| r.get(done).copied());
                    if !locks.states.is(nodeid, owner, old) {
                        // Let go (FLUSH, RELEASE) meanwhile.
                        self.at += 1;
                        continue;
                    }
                    let Some(range) = range else {
                        log::warn!(
                            "nfs4.1: node {nodeid}: {owner:?} held more lock ranges than are kept: \
                             not reclaimed, the file's locks are lost"
                        );
                        self.lose(fs, nodeid, owner, None);
                        continue;
                    };
                    let Some((start, end, typ)) = range else {
                        // Nothing held under it: the server need not know it again (the next
                        // lock of the owner goes from the open).
                        locks.states.forget(nodeid, owner);
                        self.at += 1;
                        continue;
                    };
                    let open =
                        if done == 0 { self.open_for(fs, nodeid, from) } else { Some(Stateid::ANONYMOUS) };
                    let (Some(open), Ok(obj)) = (open, fs.nodes.fh(nodeid)) else {
                        log::warn!(
                            "nfs4.1: node {nodeid}: no open reclaimed to reclaim {owner:?}'s locks from"
                        );
                        self.lose(fs, nodeid, owner, new);
                        continue;
                    };
                    slot.nodeid = nodeid;
                    slot.handle = from;
                    // As the caller that opened the handle the lock came through (a LOCK needs
                    // read access or ownership on a server that squashes root).
                    if let Some(f) = fs.handles.get(from).filter(|f| f.nodeid == nodeid) {
                        slot.cred = opener(f.opener);
                    }
                    slot.obj = obj;
                    slot.stateid = open;
                    slot.lock = FileLock { start, end, typ, pid: 0 };
                    slot.lock_owner = owner;
                    slot.lock_name = owner.name();
                    slot.lock_state = new;
                    slot.step = Step::Lock;
                    return true;
                }
                Item::Complete => {
                    slot.nodeid = 0;
                    slot.step = Step::ReclaimComplete;
                    return true;
                }
            }
        }
    }

    /// The open a lock state's first reclaimed LOCK goes from: handle `from`'s, or another
    /// handle's of the file, if reclaimed.
    fn open_for(&self, fs: &Shared, nodeid: u64, from: u64) -> Option<Stateid> {
        let of =
            |h: u64| fs.handles.get(h).filter(|f| f.nodeid == nodeid && !f.dir).map(|f| stateid_of(f.state));
        let mine = self.reclaimed.iter().find(|(h, _)| *h == from).and_then(|(h, _)| of(*h));
        mine.or_else(|| self.reclaimed.iter().filter(|(_, n)| *n == nodeid).find_map(|(h, _)| of(*h)))
    }

    /// The lock state of `owner` on `nodeid` was not reclaimed: forgotten, its file marked
    /// lost; what was reclaimed of it (`new`) is let go in the background. The next item.
    fn lose(&mut self, fs: &Shared, nodeid: u64, owner: Owner, new: Option<Stateid>) {
        let locks = &fs.locks41;
        locks.count(Counter::LockNotReclaimed);
        locks.states.forget(nodeid, owner);
        locks.lose_locks(nodeid);
        if let (Some(s), Ok(fh)) = (new, fs.nodes.fh(nodeid)) {
            locks.orphan(Orphan::Lock(fh, s));
        }
        self.at += 1;
        self.tries = 0;
    }

    /// The reply to the item's call; `true` when the reclaim is over.
    pub(super) fn reply(&mut self, fs: &Shared, res: Result<CompoundReply<'_>, CallError>) -> bool {
        let locks = &fs.locks41;
        // What the call came to: the failed operation's status, and the stateid it gave (and
        // whether an OPEN came with what this client does not keep).
        let mut deleg = false;
        let got = match &res {
            Err(e) => {
                self.tries += 1;
                if self.tries < TRIES {
                    log::debug!("nfs4.1: a reclaim call got no answer ({e}): again");
                    return false;
                }
                Err(Nfsstat4::Delay)
            }
            Ok(r) => {
                let mut failed = None;
                let mut stateid = None;
                for op in r.results.clone() {
                    match op {
                        Ok(OpRes::Failed { op, status, .. }) => failed = Some((op, status)),
                        Ok(OpRes::Open(o)) => {
                            stateid = Some(o.stateid);
                            deleg = o.rflags & open_result::CONFIRM != 0
                                || matches!(o.delegation, Delegation::Read { .. } | Delegation::Write { .. });
                        }
                        Ok(OpRes::Lock(s)) => stateid = Some(s),
                        Ok(_) => {}
                        Err(_) => failed = Some((OpNum::Sequence, Nfsstat4::ServerFault)),
                    }
                }
                if failed.is_none() && r.status != Nfsstat4::Ok {
                    failed = Some((OpNum::Sequence, r.status));
                }
                match failed {
                    Some((OpNum::ReclaimComplete, Nfsstat4::CompleteAlready)) => Ok(None),
                    Some((_, s)) => Err(s),
                    None => Ok(stateid),
                }
            }
        };
        self.tries = 0;
        let Some(item) = self.items.get_mut(self.at) else { return true };
        match item {
            Item::Open { handle, nodeid, fh, old, .. } => {
                match got {
                    Ok(Some(new)) if deleg => {
                        // A delegation despite WANT_NO_DELEG (or NFSv4.0's confirmation): not
                        // kept, as `reopen` does; the handle's next use opens it anew.
                        locks.orphan(Orphan::Open(*fh, new));
                        locks.count(Counter::OpenNotReclaimed);
                    }
                    Ok(Some(new)) => {
                        let kept = fs.handles.replace_state(*handle, state_bytes(*old), state_bytes(new));
                        if kept == Some(state_bytes(new)) {
                            locks.count(Counter::OpenReclaimed);
                            self.reclaimed.push((*handle, *nodeid));
                        } else {
                            // Closed or opened anew meanwhile: this one is nobody's.
                            locks.orphan(Orphan::Open(*fh, new));
                        }
                    }
                    Ok(None) | Err(_) => {
                        log::warn!("nfs4.1: node {nodeid}: an open was not reclaimed: {got:?}");
                        locks.count(Counter::OpenNotReclaimed);
                    }
                }
                self.at += 1;
            }
            Item::Lock { nodeid, owner, old, ranges, done, new, .. } => match got {
                Ok(Some(s)) => {
                    *new = Some(s);
                    *done += 1;
                    if *done >= ranges.as_ref().map_or(0, Vec::len) {
                        let (nodeid, owner, old) = (*nodeid, *owner, *old);
                        if locks.states.reclaimed(nodeid, owner, old, s) {
                            locks.count(Counter::LockReclaimed);
                        } else if let Ok(fh) = fs.nodes.fh(nodeid) {
                            // Let go meanwhile: so is what was reclaimed.
                            locks.orphan(Orphan::Lock(fh, s));
                        }
                        self.at += 1;
                    }
                }
                Ok(None) | Err(_) => {
                    let (nodeid, owner, new) = (*nodeid, *owner, *new);
                    log::warn!(
                        "nfs4.1: node {nodeid}: {owner:?}'s locks were not reclaimed ({got:?}): \
                         the file is EIO until its last close"
                    );
                    self.lose(fs, nodeid, owner, new);
                }
            },
            Item::Complete => {
                if let Err(s) = got {
                    // The grace period ends at its time anyway.
                    log::warn!("nfs4.1: RECLAIM_COMPLETE failed: {s:?}");
                }
                locks.count(Counter::Reclaim);
                if self.at + 1 < self.items.len() {
                    // A recovery's: the opens go after it.
                    self.at += 1;
                    return false;
                }
                self.share.reclaim_done(self.client);
                let t = locks.totals();
                log::info!(
                    "nfs4.1: reclaim done: opens {} reclaimed, {} not; lock states {} reclaimed, {} not (totals)",
                    t.opens_reclaimed,
                    t.opens_not_reclaimed,
                    t.locks_reclaimed,
                    t.locks_not_reclaimed
                );
                self.at = self.items.len();
                return true;
            }
        }
        false
    }
}

/// The reply to a call of a reclaim that ended (another restart came; the session sent the
/// call again on the new client id): nothing of it is kept; an open or lock state it got on
/// the new server is nobody's and is let go in the background.
pub(super) fn stale_reply(fs: &Shared, slot: &Slot, res: Result<CompoundReply<'_>, CallError>) {
    let Ok(r) = res else { return };
    for op in r.results.clone() {
        match op {
            Ok(OpRes::Open(o)) => fs.locks41.orphan(Orphan::Open(slot.fh, o.stateid)),
            Ok(OpRes::Lock(s)) => fs.locks41.orphan(Orphan::Lock(slot.obj, s)),
            _ => {}
        }
    }
    log::debug!("nfs4.1: the reply to a call of an ended reclaim ({:?}) was let go", slot.step);
}

/// The credential of a handle's opener (uid, gid), without supplementary groups.
fn opener((uid, gid): (u32, u32)) -> Cred {
    Cred { uid, gid, ..Cred::ROOT }
}
