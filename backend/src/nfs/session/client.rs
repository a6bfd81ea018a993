//! [`ClientShare`]: the client id that several sessions share (RFC 8881 2.10.1: a client may
//! have many sessions; each poller of a function has one, and every one of them must be the same
//! client to the server, or the function's opens and locks taken through one poller would
//! conflict with those taken through another).
//!
//! The share holds the client's owner id and verifier, the client id the server gave, and the
//! CREATE_SESSION sequence of that client id. The establishment calls that use or change them go
//! one at a time, whichever session sends them (`busy`): an EXCHANGE_ID, or a CREATE_SESSION
//! with its `csa_sequence`. A CREATE_SESSION whose reply did not come keeps the turn until its
//! session has an answer for it (the same sequence again is answered from the server's
//! CREATE_SESSION reply cache; another session sending it would be given the first one's
//! session). A session that finds the client id known takes it without an EXCHANGE_ID of its
//! own; one whose calls find the client id stale marks it so (by its epoch, the number of client
//! ids obtained, so that a late mark cannot undo a newer client id), and the next session to
//! need one sends the EXCHANGE_ID.
//!
//! RECLAIM_COMPLETE is sent once per client id, by the one session start that takes it
//! (`claim_reclaim_complete`: sessions starting together would each send it), unless
//! the share's owner reclaims state ([`ClientShare::owner_reclaims`]: the NFS filesystem, whose
//! opens and locks a server restart takes away): then a client id after the first is the
//! owner's to reclaim on ([`ClientShare::take_reclaim`]), and the owner sends RECLAIM_COMPLETE
//! when it is done ([`ClientShare::reclaim_done`]); until then [`ClientShare::reclaiming`]
//! says so (a call that finds its state unknown meanwhile waits for the reclaim rather than
//! take the state as lost). The last session that closes destroys the client id; the others
//! only their sessions.
//!
//! A short mutex guards the share: it is taken at establishment steps only (never per call).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::nfs::wire::nfs4::{ClientId, Verifier};

/// The state of the client id the sessions of one function share (see the module
/// documentation).
#[derive(Debug)]
pub struct ClientShare {
    owner: Vec<u8>,
    verifier: Verifier,
    inner: Mutex<Inner>,
    /// The client id last obtained (0: none yet), readable without the lock: the engines put it
    /// in the open and lock owners they send, and a call sent again on a session made anew
    /// must carry the new one.
    now: AtomicU64,
    /// The owner reclaims its state on a new client id ([`ClientShare::owner_reclaims`]).
    owner_reclaims: AtomicBool,
    /// The epoch whose reclaim is due or under way (0: none), readable without the lock.
    reclaiming: AtomicU64,
    /// The client id went to another process (a live update): no session of this one
    /// destroys it ([`ClientShare::hand_over`]).
    handed: AtomicBool,
}

/// A share as data (a live update: the process that takes the function over goes on as the
/// same client, its opens and locks the server's still; [`ClientShare::save`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShareState {
    /// The owner id.
    pub owner: Vec<u8>,
    /// The verifier (the client's incarnation: the same, or the server drops its state).
    pub verifier: Verifier,
    /// The client id.
    pub clientid: ClientId,
    /// The next CREATE_SESSION's `csa_sequence`, if known.
    pub cs_sequence: Option<u32>,
    /// The server's owner major id and scope.
    pub server: Option<(Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, Default)]
struct Inner {
    clientid: ClientId,
    /// Client ids obtained so far: the current one's number.
    epoch: u64,
    /// The current client id may be used (obtained, not found stale).
    valid: bool,
    /// The next CREATE_SESSION's `csa_sequence` is known (false: take the next EXCHANGE_ID's).
    sequence_known: bool,
    cs_sequence: u32,
    /// RECLAIM_COMPLETE was answered for the current client id; a session's start carries it.
    reclaimed: bool,
    reclaim_out: bool,
    /// The owner's reclaim is due on the current client id; an engine took it.
    reclaim_pending: bool,
    reclaim_taken: bool,
    /// A process started after a crash: the owner's state is to be taken back on the first
    /// client id too ([`ClientShare::recovered`]).
    recovered: bool,
    /// The session whose establishment call has the turn.
    busy: Option<u64>,
    /// Sessions made and not ended.
    sessions: usize,
    /// Session numbers given so far.
    next_session: u64,
    /// EXCHANGE_IDs answered, CREATE_SESSIONs answered with a session (all sessions).
    exchange_ids: u64,
    created: u64,
    /// The server's owner (`so_major_id`) and scope, from the last EXCHANGE_ID answered
    /// (several addresses are one server's only if these match).
    server: Option<ServerOwner>,
}

/// Who the server says it is (EXCHANGE_ID's `eir_server_owner` major id and `eir_server_scope`):
/// two addresses that answer the same are one server's, which session trunking needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerOwner {
    /// `so_major_id`.
    pub major: Vec<u8>,
    /// `eir_server_scope`.
    pub scope: Vec<u8>,
}

/// A client id as a session holds it: the id and its epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Client {
    /// The client id.
    pub clientid: ClientId,
    /// Its number among the client ids obtained.
    pub epoch: u64,
}

/// What a session may do next to establish itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn<T> {
    /// Go on with this.
    Go(T),
    /// Another session's establishment call is out: look again a little later.
    Wait,
}

/// How a CREATE_SESSION ended, for the share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    /// A session: the sequence moved on.
    Session,
    /// No answer (or DELAY): the same sequence goes again, by the same session.
    Unanswered,
    /// SEQ_MISORDERED: the sequence is not the server's; the next EXCHANGE_ID gives it.
    Misordered,
    /// STALE_CLIENTID.
    Stale,
    /// Another error: the turn goes; the sequence is kept.
    Failed,
}

/// Counters of the share (data).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShareStats {
    /// Client ids obtained (EXCHANGE_IDs that gave one).
    pub exchange_ids: u64,
    /// Sessions created on any client id of the share.
    pub sessions_created: u64,
    /// Sessions alive now.
    pub sessions: usize,
}

impl ClientShare {
    /// A share for the client `owner` (EXCHANGE_ID's `co_ownerid`, [`super::client_owner`]) in
    /// its incarnation `verifier` (`co_verifier`).
    pub fn new(owner: Vec<u8>, verifier: Verifier) -> ClientShare {
        ClientShare {
            owner,
            verifier,
            inner: Mutex::new(Inner::default()),
            now: AtomicU64::new(0),
            owner_reclaims: AtomicBool::new(false),
            reclaiming: AtomicU64::new(0),
            handed: AtomicBool::new(false),
        }
    }

    /// The share as data, for a process that goes on as this client (a live update); `Err`
    /// while it is not settled: no client id, an establishment call or a reclaim under way.
    pub fn save(&self) -> Result<ShareState, String> {
        let g = self.lock();
        if !g.valid {
            return Err("the NFSv4.1 client has no client id now".into());
        }
        if g.busy.is_some() {
            return Err("an NFSv4.1 session is being established".into());
        }
        if g.reclaim_pending || !g.reclaimed {
            return Err("the NFSv4.1 client's state is being reclaimed".into());
        }
        Ok(ShareState {
            owner: self.owner.clone(),
            verifier: self.verifier,
            clientid: g.clientid,
            cs_sequence: g.sequence_known.then_some(g.cs_sequence),
            server: g.server.as_ref().map(|o| (o.major.clone(), o.scope.clone())),
        })
    }

    /// The share `s` describes: the same client, its client id current (the first of this
    /// share: nothing to reclaim), its reclaim done; sessions join it without an EXCHANGE_ID.
    pub fn restore(s: &ShareState) -> ClientShare {
        let share = ClientShare::new(s.owner.clone(), s.verifier);
        {
            let mut g = share.lock();
            g.clientid = s.clientid;
            g.epoch = 1;
            g.valid = true;
            g.sequence_known = s.cs_sequence.is_some();
            g.cs_sequence = s.cs_sequence.unwrap_or(0);
            g.reclaimed = true;
            g.server = s
                .server
                .as_ref()
                .map(|(major, scope)| ServerOwner { major: major.clone(), scope: scope.clone() });
        }
        share.now.store(s.clientid, Ordering::Release);
        share
    }

    /// A share for a process started after the serving one was killed (a crash): the same
    /// client `owner` in a new incarnation `verifier` (the server drops the dead process's
    /// opens and locks when the new one is confirmed). The owner's reclaim is due on its first
    /// client id already ([`ClientShare::reclaiming`] from now: the handles' opens are to be
    /// opened again before the guest's requests go).
    pub fn recovered(owner: Vec<u8>, verifier: Verifier) -> ClientShare {
        let share = ClientShare::new(owner, verifier);
        share.owner_reclaims();
        share.lock().recovered = true;
        share.reclaiming.store(u64::MAX, Ordering::Release);
        share
    }

    /// Whether the share's reclaim is a recovery's (after a crash: there is no grace period;
    /// opens are opened anew, not reclaimed).
    pub fn is_recovery(&self) -> bool {
        self.lock().recovered
    }

    /// The client id went to another process (a live update): the sessions of this one end
    /// without destroying it.
    pub fn hand_over(&self) {
        self.handed.store(true, Ordering::Release);
    }

    /// The share's owner keeps state a server restart takes away (opens, locks) and reclaims it
    /// itself on every client id after the first, then sends RECLAIM_COMPLETE (see the module
    /// documentation). Set before the first session starts.
    pub fn owner_reclaims(&self) {
        self.owner_reclaims.store(true, Ordering::Release);
    }

    /// Whether the owner's reclaim is due or under way (one atomic load).
    pub fn reclaiming(&self) -> bool {
        self.reclaiming.load(Ordering::Acquire) != 0
    }

    /// The owner's reclaim on client id `clientid`, if it is due there and nobody took it: the
    /// caller sends the reclaims, then RECLAIM_COMPLETE, then [`ClientShare::reclaim_done`] (or
    /// [`ClientShare::give_back_reclaim`]).
    pub fn take_reclaim(&self, clientid: ClientId) -> Option<Client> {
        let mut g = self.lock();
        if !(g.valid && g.reclaim_pending && !g.reclaim_taken && g.clientid == clientid) {
            return None;
        }
        g.reclaim_taken = true;
        Some(Client { clientid, epoch: g.epoch })
    }

    /// The reclaim taken on `client` was not finished (its engine went): another may take it.
    pub fn give_back_reclaim(&self, client: Client) {
        let mut g = self.lock();
        if g.epoch == client.epoch {
            g.reclaim_taken = false;
        }
    }

    /// Whether `client` is still the current client id (a reclaim on an older one is over).
    pub fn is_current(&self, client: Client) -> bool {
        self.is_current_epoch(client.epoch)
    }

    /// Whether the client id of `epoch` is the current one.
    pub fn is_current_epoch(&self, epoch: u64) -> bool {
        let g = self.lock();
        g.valid && g.epoch == epoch
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The owner id.
    pub fn owner(&self) -> &[u8] {
        &self.owner
    }

    /// The verifier.
    pub fn verifier(&self) -> Verifier {
        self.verifier
    }

    /// The counters.
    pub fn stats(&self) -> ShareStats {
        let g = self.lock();
        ShareStats { exchange_ids: g.exchange_ids, sessions_created: g.created, sessions: g.sessions }
    }

    /// A new session joins: its number.
    pub(super) fn join(&self) -> u64 {
        let mut g = self.lock();
        g.sessions += 1;
        g.next_session += 1;
        g.next_session
    }

    /// Session `me` ends (closed or dropped): whether it was the last, which then destroys the
    /// client id. Gives up the turn if it had it.
    pub(super) fn leave(&self, me: u64) -> bool {
        let mut g = self.lock();
        if g.busy == Some(me) {
            g.busy = None;
        }
        g.sessions = g.sessions.saturating_sub(1);
        g.sessions == 0 && !self.handed.load(Ordering::Acquire)
    }

    /// Session `me` needs a client id: the current one (`Go(Some)`), or the turn to send an
    /// EXCHANGE_ID (`Go(None)`), or `Wait`.
    pub(super) fn client(&self, me: u64) -> Turn<Option<Client>> {
        let mut g = self.lock();
        if g.valid && g.busy.is_none_or(|b| b == me) {
            if g.busy == Some(me) {
                g.busy = None;
            }
            return Turn::Go(Some(Client { clientid: g.clientid, epoch: g.epoch }));
        }
        match g.busy {
            Some(b) if b != me => Turn::Wait,
            _ => {
                g.busy = Some(me);
                Turn::Go(None)
            }
        }
    }

    /// The client id the sessions use now, if one is valid (a lock owner in another client's
    /// name is told from one of ours by it).
    pub fn clientid(&self) -> Option<ClientId> {
        let g = self.lock();
        g.valid.then_some(g.clientid)
    }

    /// The client id last obtained (0 before the first), without taking the share's lock.
    pub fn clientid_now(&self) -> ClientId {
        self.now.load(Ordering::Acquire)
    }

    /// Who the server said it is at the last EXCHANGE_ID.
    pub fn server_owner(&self) -> Option<ServerOwner> {
        self.lock().server.clone()
    }

    /// Session `me`'s EXCHANGE_ID was answered: `clientid`, `sequence` (`eir_sequenceid`),
    /// confirmed or not, by the server `server`. Returns the client id the session now has.
    /// Gives up the turn.
    pub(super) fn exchanged(
        &self,
        me: u64,
        clientid: ClientId,
        sequence: u32,
        confirmed: bool,
        server: (&[u8], &[u8]),
    ) -> Client {
        let mut g = self.lock();
        if g.server.as_ref().is_none_or(|o| o.major != server.0 || o.scope != server.1) {
            // Allocates at an establishment step only.
            g.server = Some(ServerOwner { major: server.0.to_vec(), scope: server.1.to_vec() });
        }
        if g.busy == Some(me) {
            g.busy = None;
        }
        g.exchange_ids += 1;
        let same = g.valid && g.clientid == clientid;
        if !same || !confirmed {
            g.epoch += 1;
            g.reclaimed = false;
            g.reclaim_out = false;
            // A client id after the first: the owner's state went with the old one.
            g.reclaim_pending = (g.epoch > 1 || g.recovered) && self.owner_reclaims.load(Ordering::Acquire);
            g.reclaim_taken = false;
            self.reclaiming.store(if g.reclaim_pending { g.epoch } else { 0 }, Ordering::Release);
        }
        // A confirmed client id this share already sends CREATE_SESSIONs for keeps its
        // sequence (every one of them went through here); otherwise the server's is taken.
        if !(same && confirmed && g.sequence_known) {
            g.cs_sequence = sequence;
            g.sequence_known = true;
        }
        g.clientid = clientid;
        g.valid = true;
        self.now.store(clientid, Ordering::Release);
        Client { clientid, epoch: g.epoch }
    }

    /// Session `me`'s EXCHANGE_ID failed (no answer, an error): gives up the turn.
    pub(super) fn exchange_failed(&self, me: u64) {
        let mut g = self.lock();
        if g.busy == Some(me) {
            g.busy = None;
        }
    }

    /// Session `me` may send CREATE_SESSION on `client`: its `csa_sequence` (the turn is kept
    /// until [`ClientShare::created`]); `Go(None)` when `client` is no longer the current
    /// client id (get another); `Wait` while another session has the turn.
    pub(super) fn create(&self, me: u64, client: Client) -> Turn<Option<u32>> {
        let mut g = self.lock();
        if !g.valid || g.epoch != client.epoch || !g.sequence_known {
            if g.busy == Some(me) {
                g.busy = None;
            }
            return Turn::Go(None);
        }
        match g.busy {
            Some(b) if b != me => Turn::Wait,
            _ => {
                g.busy = Some(me);
                Turn::Go(Some(g.cs_sequence))
            }
        }
    }

    /// Session `me`'s CREATE_SESSION on `client` ended so.
    pub(super) fn created(&self, me: u64, client: Client, how: Created) {
        let mut g = self.lock();
        let current = g.valid && g.epoch == client.epoch;
        match how {
            Created::Unanswered => return,
            Created::Session => {
                g.created += 1;
                if current {
                    g.cs_sequence = g.cs_sequence.wrapping_add(1);
                }
            }
            Created::Misordered if current => g.sequence_known = false,
            Created::Stale if current => g.valid = false,
            _ => {}
        }
        if g.busy == Some(me) {
            g.busy = None;
        }
    }

    /// A call of a session on `client` was answered STALE_CLIENTID: the client id is gone
    /// (unless a newer one was obtained meanwhile).
    pub(super) fn stale(&self, client: Client) {
        let mut g = self.lock();
        if g.epoch == client.epoch {
            g.valid = false;
        }
    }

    /// Whether a session starting on `client` is to send RECLAIM_COMPLETE: not yet sent, and
    /// no reclaim of the owner's due (the owner sends it after its reclaims).
    #[cfg(test)]
    pub(super) fn reclaim_due(&self, client: Client) -> bool {
        let g = self.lock();
        !(g.epoch == client.epoch && (g.reclaimed || g.reclaim_pending))
    }

    /// Whether the start of a session on `client` is to carry RECLAIM_COMPLETE (not yet
    /// answered, no reclaim of the owner's due), taken by one session at a time: sessions starting together send it once; the one that
    /// took it gives it back if its call got no answer for it ([`Self::reclaim_unsent`]).
    pub(super) fn claim_reclaim_complete(&self, client: Client) -> bool {
        let mut g = self.lock();
        if g.epoch != client.epoch || g.reclaimed || g.reclaim_pending || g.reclaim_out {
            return false;
        }
        g.reclaim_out = true;
        true
    }

    /// The RECLAIM_COMPLETE a session took ([`Self::claim_reclaim_complete`]) was not answered:
    /// the next start carries it.
    pub(super) fn reclaim_unsent(&self, client: Client) {
        let mut g = self.lock();
        if g.epoch == client.epoch {
            g.reclaim_out = false;
        }
    }

    /// RECLAIM_COMPLETE was answered (or COMPLETE_ALREADY) for `client`, or the owner's reclaim
    /// ended there.
    pub fn reclaim_done(&self, client: Client) {
        let mut g = self.lock();
        if g.epoch == client.epoch {
            g.reclaimed = true;
            g.reclaim_out = false;
            g.reclaim_pending = false;
            g.reclaim_taken = false;
            g.recovered = false;
            self.reclaiming.store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_session_exchanges_the_others_take_its_client_id() {
        let s = ClientShare::new(b"o".to_vec(), *b"verifier");
        let (a, b) = (s.join(), s.join());
        assert_eq!(s.client(a), Turn::Go(None));
        assert_eq!(s.client(b), Turn::Wait);
        let c = s.exchanged(a, 7, 1, false, (b"srv", b""));
        assert_eq!(s.client(b), Turn::Go(Some(c)));
        // CREATE_SESSIONs go one at a time, in sequence.
        assert_eq!(s.create(a, c), Turn::Go(Some(1)));
        assert_eq!(s.create(b, c), Turn::Wait);
        s.created(a, c, Created::Unanswered);
        assert_eq!(s.create(b, c), Turn::Wait, "an unanswered CREATE_SESSION keeps the turn");
        assert_eq!(s.create(a, c), Turn::Go(Some(1)), "and goes again with its sequence");
        s.created(a, c, Created::Session);
        assert_eq!(s.create(b, c), Turn::Go(Some(2)));
        s.created(b, c, Created::Session);
        assert_eq!(s.stats().sessions_created, 2);
        assert_eq!(s.stats().exchange_ids, 1);
    }

    #[test]
    fn a_stale_mark_of_an_older_client_id_is_ignored() {
        let s = ClientShare::new(b"o".to_vec(), *b"verifier");
        let a = s.join();
        assert_eq!(s.client(a), Turn::Go(None));
        let old = s.exchanged(a, 7, 1, false, (b"srv", b""));
        s.stale(old);
        assert_eq!(s.client(a), Turn::Go(None));
        let new = s.exchanged(a, 8, 1, false, (b"srv", b""));
        s.stale(old);
        assert_eq!(s.client(a), Turn::Go(Some(new)));
        assert_eq!(s.create(a, old), Turn::Go(None), "a CREATE_SESSION on the old id is refused");
        assert!(s.reclaim_due(new));
        s.reclaim_done(new);
        assert!(!s.reclaim_due(new));
    }

    #[test]
    fn a_confirmed_client_id_keeps_the_shares_sequence_unless_misordered() {
        let s = ClientShare::new(b"o".to_vec(), *b"verifier");
        let a = s.join();
        s.client(a);
        let c = s.exchanged(a, 7, 5, false, (b"srv", b""));
        assert_eq!(s.create(a, c), Turn::Go(Some(5)));
        s.created(a, c, Created::Session);
        // Another EXCHANGE_ID of the same client (confirmed now): the share knows better.
        let c = s.exchanged(a, 7, 5, true, (b"srv", b""));
        assert_eq!(s.create(a, c), Turn::Go(Some(6)));
        s.created(a, c, Created::Misordered);
        let c = s.exchanged(a, 7, 9, true, (b"srv", b""));
        assert_eq!(s.create(a, c), Turn::Go(Some(9)), "after SEQ_MISORDERED the server's is taken");
    }

    #[test]
    fn the_last_session_to_leave_destroys_the_client_id_and_a_leaver_frees_the_turn() {
        let s = ClientShare::new(b"o".to_vec(), *b"verifier");
        let (a, b) = (s.join(), s.join());
        assert_eq!(s.client(a), Turn::Go(None));
        assert!(!s.leave(a));
        assert_eq!(s.client(b), Turn::Go(None), "the turn went with its session");
        assert!(s.leave(b));
    }
}
