//! The UNSTABLE write replay store: what the NFS backend wrote with `stable = UNSTABLE` and the
//! server has not committed yet.
//!
//! An NFSv3 server may answer an UNSTABLE WRITE before the data is on stable storage; only a
//! COMMIT that returns the *same write verifier* as the WRITE did proves it is. A server that
//! restarted in between returns a new verifier and may have lost the data, so the client must
//! send it again (RFC 1813, 4.8). The device acknowledged the WRITE to the guest already, so the
//! data must be kept here until then: every UNSTABLE WRITE's payload is copied (once, at start)
//! into this preallocated, bounded store; the entry learns its verifier from the WRITE's reply,
//! and its place in the order of answers. A COMMIT covers the entries of its file answered
//! before it was sent ([`UnstableStore::horizon`]) with the verifier it returns; those written
//! under another, and every later write of the file, are sent again (FILE_SYNC) in the order
//! they were made, before a FLUSH or FSYNC is acknowledged.
//!
//! Past its high-water mark (half full) the engines COMMIT in the background, one COMMIT at a
//! time for the whole store ([`UnstableStore::begin_background`]), of the file with the most
//! answered bytes ([`UnstableStore::pick_commit`]); a write that finds the store full waits for
//! room while a COMMIT can free some, and goes FILE_SYNC only when none can, so the bound costs
//! speed, never data.
//!
//! The store is shared by every poller (one file's WRITEs come through several queues) behind a
//! short mutex. Data lives in fixed 4 KiB pages linked into per-entry chains (entries are freed
//! out of order, per file); nothing allocates after construction.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::keep::{KeptVerf, NfsKeep};
use crate::io::Reader;
use crate::nfs::conn::Cred;
use crate::nfs::wire::Fh;
use crate::ramfs::sys::SharedBytes;

/// Bytes per page of the store.
pub const PAGE: usize = 4096;

const NONE: u32 = u32::MAX;

/// Names one stored write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryId(u32, u64);

/// The verifier state of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verf {
    /// The WRITE is still on the wire.
    Unknown,
    /// The WRITE's reply gave this verifier.
    Known([u8; 8]),
    /// Parts of it got different verifiers, or a COMMIT showed a restart: send it again.
    Resend,
}

impl Verf {
    fn kept(self) -> KeptVerf {
        match self {
            Verf::Unknown => KeptVerf::Unknown,
            Verf::Known(v) => KeptVerf::Known(v),
            Verf::Resend => KeptVerf::Resend,
        }
    }
}

#[derive(Clone, Copy)]
struct Entry {
    live: bool,
    file: u64,
    fh: Fh,
    /// The writer's credential (a background COMMIT of the file goes with it).
    cred: Cred,
    offset: u64,
    len: u32,
    first: u32,
    verf: Verf,
    /// Order of the writes (replays go in it: a later write of the same bytes wins).
    seq: u64,
    /// When its WRITE's reply came (the store's answer count then): a COMMIT covers only the
    /// entries answered before it was sent.
    answered: u64,
}

struct Inner {
    /// The pages, in a memfd (a live update's successor maps the same bytes).
    data: SharedBytes,
    /// Next page of each page's chain (or of the free list).
    next: Vec<u32>,
    free_page: u32,
    free_pages: usize,
    entries: Vec<Entry>,
    free_entries: Vec<u32>,
    live: usize,
    /// Live entries marked [`Verf::Resend`].
    resend: usize,
    seq: u64,
    /// WRITE replies recorded so far (the horizon of a COMMIT sent now).
    answers: u64,
    /// The records kept for a crash (`nfs::keep`), written as entries change.
    keep: Option<Arc<NfsKeep>>,
    /// Files whose stored writes are being sent again, and by whom ([`UnstableStore::next_resend`]):
    /// one sender per file, so the replays land in the order the writes were made.
    resenders: Vec<(u64, u64)>,
}

impl Inner {
    fn used_bytes(&self, pages: usize) -> u64 {
        ((pages - self.free_pages) * PAGE) as u64
    }

    fn set_resend(&mut self, i: usize) {
        if self.entries[i].verf != Verf::Resend {
            self.entries[i].verf = Verf::Resend;
            self.resend += 1;
            self.keep_verf(i);
        }
    }

    /// Writes entry `i`'s verifier and answer number to the kept records.
    fn keep_verf(&self, i: usize) {
        if let Some(k) = &self.keep {
            let e = &self.entries[i];
            k.entry_verf(i, e.len, e.answered, e.verf.kept());
        }
    }

    /// Writes entry `i` whole to the kept records: its page chain, then the entry.
    fn keep_entry(&self, k: &NfsKeep, i: usize) {
        let e = &self.entries[i];
        if !e.live {
            return k.entry_gone(i);
        }
        let mut page = e.first;
        while page != NONE {
            let next = self.next[page as usize];
            k.page_next(page, next);
            page = next;
        }
        k.entry_made(i, e.file, &e.fh, &e.cred, e.offset, e.len, e.first, e.seq, e.answered, e.verf.kept());
    }

    fn keep_counters(&self) {
        if let Some(k) = &self.keep {
            k.store_counters(self.seq, self.answers, self.entries.len());
        }
    }

    /// Frees entry `i` and its pages.
    fn remove(&mut self, i: usize) {
        let e = self.entries[i];
        if !e.live {
            return;
        }
        let mut page = e.first;
        let mut n = 0;
        let mut last = page;
        while page != NONE {
            last = page;
            page = self.next[page as usize];
            n += 1;
        }
        self.next[last as usize] = self.free_page;
        self.free_page = e.first;
        self.free_pages += n;
        if e.verf == Verf::Resend {
            self.resend -= 1;
        }
        self.entries[i].live = false;
        if let Some(k) = &self.keep {
            k.entry_gone(i);
        }
        self.free_entries.push(i as u32);
        self.live -= 1;
    }

    /// The oldest live entry of `file` to send again.
    fn oldest_resend(&self, file: u64) -> Option<u64> {
        if self.resend == 0 {
            return None;
        }
        self.entries
            .iter()
            .filter(|e| e.live && e.file == file && e.verf == Verf::Resend)
            .map(|e| e.seq)
            .min()
    }
}

/// What a COMMIT's verifier meant for a file's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Committed {
    /// Entries the COMMIT covered (dropped).
    pub dropped: usize,
    /// Entries to send again.
    pub resend: usize,
    /// Entries whose WRITE is still on the wire, or was answered after the COMMIT was sent
    /// (left alone).
    pub in_flight: usize,
}

/// A stored write to send again: where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay {
    /// The entry (drop it with [`UnstableStore::remove`] once the server has it stably).
    pub id: EntryId,
    /// The file's handle.
    pub fh: Fh,
    /// Where.
    pub offset: u64,
    /// How many bytes (copied into the caller's buffer).
    pub len: u32,
}

/// What [`UnstableStore::next_resend`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// This write, its bytes copied: send it again.
    Send(Replay),
    /// Another request is sending the file's writes again: wait.
    Busy,
    /// None left: the sender's turn is over.
    Done,
    /// The buffer is shorter than the next write (its length).
    Short(usize),
}

impl Resend {
    /// The write to send again, if that is what was found.
    pub fn replay(self) -> Option<Replay> {
        match self {
            Resend::Send(r) => Some(r),
            _ => None,
        }
    }
}

/// A file whose stored writes a background COMMIT should cover ([`UnstableStore::pick_commit`]).
#[derive(Debug, Clone, Copy)]
pub struct CommitPick {
    /// The file (its node id).
    pub file: u64,
    /// Its handle.
    pub fh: Fh,
    /// The credential of its newest stored write.
    pub cred: Cred,
    /// Bytes of it the COMMIT may free (written and answered).
    pub bytes: u64,
}

/// What the store did so far (plain numbers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnstableStats {
    /// Writes stored (sent UNSTABLE).
    pub stored: u64,
    /// Writes that found the store full with nothing in it a COMMIT could free (sent FILE_SYNC).
    pub full: u64,
    /// Writes sent again after a verifier change.
    pub resent: u64,
    /// Bytes stored now.
    pub bytes_now: u64,
    /// The most bytes ever stored at once.
    #[serde(default)]
    pub high_water: u64,
    /// COMMITs the engines sent on their own (the store past its high-water mark), without a
    /// guest request.
    #[serde(default)]
    pub background_commits: u64,
    /// Bytes those COMMITs freed.
    #[serde(default)]
    pub background_freed: u64,
    /// Writes that found the store full and waited for a COMMIT to free room.
    #[serde(default)]
    pub waited: u64,
}

/// The bounded store of uncommitted UNSTABLE writes (see the module documentation).
pub struct UnstableStore {
    inner: Mutex<Inner>,
    stats: Mutex<UnstableStats>,
    pages: usize,
    /// Pages in use (a copy of the locked count, for the engines' per-round look).
    used: AtomicUsize,
    /// A background COMMIT is on the wire (one at a time, whichever poller sent it).
    commit_out: Arc<AtomicBool>,
}

impl std::fmt::Debug for UnstableStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnstableStore").field("pages", &self.pages).finish_non_exhaustive()
    }
}

/// A claim on the one background COMMIT of a store ([`UnstableStore::begin_background`]):
/// released when dropped (the COMMIT ended, or the engine that sent it went away).
#[derive(Debug)]
pub struct BackgroundClaim(Arc<AtomicBool>);

impl Drop for BackgroundClaim {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl UnstableStore {
    /// A store of `bytes` (rounded down to whole pages; 0: nothing is ever stored, every WRITE
    /// goes FILE_SYNC), in a memfd whose pages are taken as they are written. `Err`: the memfd
    /// or its mapping could not be made.
    pub fn new(bytes: usize) -> std::io::Result<Self> {
        let pages = (bytes / PAGE).min(NONE as usize - 1);
        let data = SharedBytes::new("virtiofs-nfs-unstable", pages * PAGE)?;
        Ok(Self::with_pages(data, pages))
    }

    /// A store of `pages` pages over `data`, every page free.
    fn with_pages(data: SharedBytes, pages: usize) -> Self {
        let next = (0..pages as u32).map(|i| if i + 1 < pages as u32 { i + 1 } else { NONE }).collect();
        let free_page = if pages > 0 { 0 } else { NONE };
        let inner = Inner {
            data,
            next,
            free_page,
            free_pages: pages,
            entries: Vec::with_capacity(pages),
            free_entries: Vec::with_capacity(pages),
            live: 0,
            resend: 0,
            seq: 0,
            answers: 0,
            keep: None,
            resenders: Vec::new(),
        };
        UnstableStore {
            inner: Mutex::new(inner),
            stats: Mutex::default(),
            pages,
            used: AtomicUsize::new(0),
            commit_out: Arc::new(AtomicBool::new(false)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self, f: impl FnOnce(&mut UnstableStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Publishes the bytes in use after a change (under the lock).
    fn publish(&self, inner: &Inner) -> u64 {
        self.used.store(self.pages - inner.free_pages, Ordering::Relaxed);
        inner.used_bytes(self.pages)
    }

    fn set_bytes(&self, bytes: u64) {
        self.bump(|s| {
            s.bytes_now = bytes;
            s.high_water = s.high_water.max(bytes);
        });
    }

    /// Pages of the store.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// A copy of the memfd the store's bytes are in.
    pub fn memfd(&self) -> std::io::Result<std::fs::File> {
        Ok(std::fs::File::from(self.lock().data.memfd().try_clone_to_owned()?))
    }

    /// Whether anything can be stored at all.
    pub fn enabled(&self) -> bool {
        self.pages > 0
    }

    /// Whether a write of `len` bytes could ever be stored (the store holds that much).
    pub fn fits(&self, len: usize) -> bool {
        len.div_ceil(PAGE).max(1) <= self.pages && u32::try_from(len).is_ok()
    }

    /// Whether a write of `len` bytes finds room now (no lock: a hint, [`Self::insert`] decides).
    pub fn has_room(&self, len: usize) -> bool {
        len.div_ceil(PAGE).max(1) + self.used.load(Ordering::Relaxed) <= self.pages
    }

    /// Whether the store is at or past its high-water mark (half of it), where the engines
    /// commit in the background (no lock).
    pub fn past_high_water(&self) -> bool {
        self.pages > 0 && self.used.load(Ordering::Relaxed) * 2 >= self.pages
    }

    /// Whether waiting can bring room: a background COMMIT is on the wire, or something is
    /// stored that a COMMIT can free (answered, or answered once its WRITE's reply comes).
    pub fn room_may_come(&self) -> bool {
        if self.commit_out.load(Ordering::Acquire) {
            return true;
        }
        let inner = self.lock();
        inner.live > inner.resend
    }

    /// Claims the store's one background COMMIT; `None` while another is on the wire.
    pub fn begin_background(&self) -> Option<BackgroundClaim> {
        self.commit_out
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| BackgroundClaim(self.commit_out.clone()))
    }

    /// Counts a background COMMIT sent.
    pub fn count_background(&self) {
        self.bump(|s| s.background_commits += 1);
    }

    /// Counts a write sent FILE_SYNC for want of room.
    pub fn count_full(&self) {
        self.bump(|s| s.full += 1);
    }

    /// Counts a write that waits for room.
    pub fn count_waited(&self) {
        self.bump(|s| s.waited += 1);
    }

    /// The file whose answered stored writes are the most bytes (what a background COMMIT
    /// frees most by), with the handle and the credential of its newest write; `None` when
    /// nothing stored is answered with a verifier yet.
    pub fn pick_commit(&self) -> Option<CommitPick> {
        // Few files are written at once: the first eight distinct ones seen are counted.
        let mut best: [(u64, u64, u32, u64); 8] = [(0, 0, NONE, 0); 8];
        let mut n = 0;
        let inner = self.lock();
        for (i, e) in inner.entries.iter().enumerate() {
            if !e.live || !matches!(e.verf, Verf::Known(_)) {
                continue;
            }
            let bytes = u64::from(e.len).div_ceil(PAGE as u64) * PAGE as u64;
            match best[..n].iter_mut().find(|b| b.0 == e.file) {
                Some(b) => {
                    b.1 += bytes;
                    if e.seq > b.3 {
                        (b.2, b.3) = (i as u32, e.seq);
                    }
                }
                None if n < 8 => {
                    best[n] = (e.file, bytes, i as u32, e.seq);
                    n += 1;
                }
                None => {}
            }
        }
        let b = best[..n].iter().max_by_key(|b| b.1)?;
        let e = &inner.entries[b.2 as usize];
        Some(CommitPick { file: b.0, fh: e.fh, cred: e.cred, bytes: b.1 })
    }

    /// Stores the bytes `data` has left (not consuming it) as a write of `file` (`fh`) by
    /// `cred` at `offset`; `None` when there is no room.
    pub fn insert(&self, file: u64, fh: &Fh, cred: &Cred, offset: u64, data: &Reader<'_>) -> Option<EntryId> {
        let len = data.bytes_left();
        let need = len.div_ceil(PAGE).max(1);
        let mut inner = self.lock();
        if need > inner.free_pages || u32::try_from(len).is_err() {
            return None;
        }
        let first = inner.free_page;
        let mut r = data.clone();
        let mut page = first;
        let mut last = first;
        for k in 0..need {
            let n = (len - k * PAGE).min(PAGE);
            let at = page as usize * PAGE;
            if r.read_exact(&mut inner.data.bytes_mut()[at..at + n]).is_err() {
                // The payload is shorter than it said: nothing is stored (the pages stay free).
                return None;
            }
            last = page;
            page = inner.next[page as usize];
        }
        // Detach the chain from the free list.
        inner.free_page = inner.next[last as usize];
        inner.next[last as usize] = NONE;
        inner.free_pages -= need;
        inner.seq += 1;
        let seq = inner.seq;
        let e = Entry {
            live: true,
            file,
            fh: *fh,
            cred: *cred,
            offset,
            len: len as u32,
            first,
            verf: Verf::Unknown,
            seq,
            answered: 0,
        };
        let id = match inner.free_entries.pop() {
            Some(i) => {
                inner.entries[i as usize] = e;
                i
            }
            None => {
                inner.entries.push(e);
                (inner.entries.len() - 1) as u32
            }
        };
        inner.live += 1;
        // The counters first: a record never holds an order number past them.
        inner.keep_counters();
        if let Some(k) = &inner.keep {
            inner.keep_entry(k, id as usize);
        }
        let bytes = self.publish(&inner);
        drop(inner);
        self.bump(|s| {
            s.stored += 1;
            s.bytes_now = bytes;
            s.high_water = s.high_water.max(bytes);
        });
        Some(EntryId(id, seq))
    }

    /// The WRITE of `id` was answered with `verf`; `stable`: the server says it is on stable
    /// storage already (FILE_SYNC), so the entry goes. A write answered while an older write of
    /// the file waits to be sent again is sent again after it too (the replays keep the order).
    pub fn written(&self, id: EntryId, verf: [u8; 8], stable: bool) {
        if stable {
            return self.remove(id);
        }
        let mut inner = self.lock();
        let i = id.0 as usize;
        let Some(e) = inner.entries.get(i).copied().filter(|e| e.live && e.seq == id.1) else { return };
        inner.answers += 1;
        // The counter first: a record never holds an answer number past it.
        inner.keep_counters();
        inner.entries[i].answered = inner.answers;
        match e.verf {
            Verf::Unknown => inner.entries[i].verf = Verf::Known(verf),
            Verf::Known(v) if v == verf => {}
            _ => inner.set_resend(i),
        }
        if inner.entries[i].verf != Verf::Resend && inner.oldest_resend(e.file).is_some_and(|s| s < e.seq) {
            inner.set_resend(i);
        }
        inner.keep_verf(i);
    }

    /// Stops writing the records (they are another process's now).
    pub(super) fn unkeep(&self) {
        self.lock().keep = None;
    }

    /// Keeps the store in `keep` from now on (crash recovery, `nfs::keep`), writing what it
    /// holds first: every entry slot, and those past its last cleared.
    pub(super) fn keep_in(&self, keep: Arc<NfsKeep>) {
        let mut inner = self.lock();
        let (_, _, _, kept_slots) = keep.store_header();
        for i in 0..inner.entries.len() {
            inner.keep_entry(&keep, i);
        }
        for i in inner.entries.len()..kept_slots {
            keep.entry_gone(i);
        }
        inner.keep = Some(keep);
        inner.keep_counters();
    }

    /// Drops entry `id` (its WRITE failed, or the data is stable now).
    pub fn remove(&self, id: EntryId) {
        let mut inner = self.lock();
        if inner.entries.get(id.0 as usize).is_none_or(|e| !e.live || e.seq != id.1) {
            // Gone already (dropped with its file, its slot another write's now).
            return;
        }
        inner.remove(id.0 as usize);
        let bytes = self.publish(&inner);
        drop(inner);
        self.set_bytes(bytes);
    }

    /// Whether `file` has stored writes the server answered (a COMMIT would cover them or
    /// replay them; those still on the wire are concurrent with whatever asks).
    pub fn has_answered(&self, file: u64) -> bool {
        let inner = self.lock();
        inner.live > 0 && inner.entries.iter().any(|e| e.live && e.file == file && e.verf != Verf::Unknown)
    }

    /// Whether `file` has stored writes.
    pub fn has(&self, file: u64) -> bool {
        let inner = self.lock();
        inner.live > 0 && inner.entries.iter().any(|e| e.live && e.file == file)
    }

    /// The horizon of a COMMIT sent now: it covers the writes answered so far (the server had
    /// them before it got the COMMIT), not those answered later (it may have had them after).
    pub fn horizon(&self) -> u64 {
        self.lock().answers
    }

    /// A COMMIT of `file`, sent at `horizon` ([`Self::horizon`]), returned `verf`: the entries
    /// written under it and answered before the horizon go; those written under another (the
    /// server restarted) are marked to be sent again, and so is every later write of the file
    /// (replays go in the order of the writes, so the newest bytes land last).
    pub fn committed(&self, file: u64, verf: [u8; 8], horizon: u64) -> Committed {
        let mut out = Committed::default();
        let mut inner = self.lock();
        if inner.live == 0 {
            return out;
        }
        for i in 0..inner.entries.len() {
            let e = inner.entries[i];
            if !e.live || e.file != file {
                continue;
            }
            if matches!(e.verf, Verf::Known(v) if v != verf) {
                inner.set_resend(i);
            }
        }
        let oldest = inner.oldest_resend(file);
        let before = inner.free_pages;
        for i in 0..inner.entries.len() {
            let e = inner.entries[i];
            if !e.live || e.file != file {
                continue;
            }
            match e.verf {
                Verf::Known(_) if oldest.is_some_and(|s| s < e.seq) => {
                    inner.set_resend(i);
                    out.resend += 1;
                }
                Verf::Known(_) if e.answered <= horizon => {
                    inner.remove(i);
                    out.dropped += 1;
                }
                Verf::Resend => out.resend += 1,
                Verf::Known(_) | Verf::Unknown => out.in_flight += 1,
            }
        }
        let freed = ((inner.free_pages - before) * PAGE) as u64;
        let bytes = self.publish(&inner);
        drop(inner);
        if freed > 0 {
            self.set_bytes(bytes);
        }
        out
    }

    /// [`Self::committed`] for a background COMMIT (its freed bytes are counted apart).
    pub fn committed_background(&self, file: u64, verf: [u8; 8], horizon: u64) -> Committed {
        let before = self.used.load(Ordering::Relaxed);
        let c = self.committed(file, verf, horizon);
        let freed = before.saturating_sub(self.used.load(Ordering::Relaxed));
        self.bump(|s| s.background_freed += (freed * PAGE) as u64);
        c
    }

    /// [`Self::next_resend`] into an engine's replay buffer `buf`, grown first to `want` bytes
    /// (the mount's largest write) and again to the entry's length should one be longer: never
    /// [`Resend::Short`].
    pub fn next_resend_into(&self, file: u64, sender: u64, buf: &mut Vec<u8>, want: usize) -> Resend {
        if buf.len() < want {
            buf.resize(want, 0);
        }
        loop {
            match self.next_resend(file, sender, buf) {
                Resend::Short(len) => buf.resize(len, 0),
                other => return other,
            }
        }
    }

    /// The next entry of `file` to send again (the oldest: replays keep the order the writes
    /// were made in) by `sender` (a number naming the request that sends them), its bytes
    /// copied into `out`. One sender per file at a time: another gets [`Resend::Busy`] until
    /// the first has none left ([`Resend::Done`], which ends its turn) or ends it
    /// ([`UnstableStore::end_resend`]). [`Resend::Short`]: `out` cannot hold the entry (its
    /// length given; the turn is kept).
    pub fn next_resend(&self, file: u64, sender: u64, out: &mut [u8]) -> Resend {
        let mut inner = self.lock();
        match inner.resenders.iter().find(|r| r.0 == file) {
            Some(&(_, s)) if s != sender => return Resend::Busy,
            Some(_) => {}
            None => inner.resenders.push((file, sender)),
        }
        let next = inner
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.live && e.file == file && e.verf == Verf::Resend)
            .min_by_key(|(_, e)| e.seq)
            .map(|(i, e)| (i, *e));
        let Some((i, e)) = next else {
            inner.resenders.retain(|r| r.0 != file);
            return Resend::Done;
        };
        let len = e.len as usize;
        if len > out.len() {
            return Resend::Short(len);
        }
        let mut page = e.first;
        let mut at = 0;
        while at < len && page != NONE {
            let n = (len - at).min(PAGE);
            let src = page as usize * PAGE;
            out[at..at + n].copy_from_slice(&inner.data.bytes()[src..src + n]);
            at += n;
            page = inner.next[page as usize];
        }
        let r = Replay { id: EntryId(i as u32, e.seq), fh: e.fh, offset: e.offset, len: e.len };
        drop(inner);
        self.bump(|s| s.resent += 1);
        Resend::Send(r)
    }

    /// `sender`'s turn at sending `file`'s writes again ends before it sent them all (its
    /// request failed or ended): another may take it.
    pub fn end_resend(&self, file: u64, sender: u64) {
        self.lock().resenders.retain(|r| !(r.0 == file && r.1 == sender));
    }

    /// Drops every entry of `file` (it is gone on the server, or forgotten).
    pub fn drop_file(&self, file: u64) {
        let mut inner = self.lock();
        if inner.live == 0 {
            return;
        }
        for i in 0..inner.entries.len() {
            if inner.entries[i].live && inner.entries[i].file == file {
                inner.remove(i);
            }
        }
        let bytes = self.publish(&inner);
        drop(inner);
        self.set_bytes(bytes);
    }

    /// Stored writes now.
    pub fn len(&self) -> usize {
        self.lock().live
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters.
    pub fn stats(&self) -> UnstableStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store as data (a live update, while no request runs): every entry, in slot order,
    /// with the pages that hold its bytes (as runs), and the memfd the pages are in, which the
    /// successor maps: nothing is copied. `Err` while a WRITE is on the wire.
    pub fn save(&self) -> Result<(UnstableState, std::fs::File), String> {
        let inner = self.lock();
        let mut entries = Vec::with_capacity(inner.live);
        for (slot, e) in inner.entries.iter().enumerate().filter(|(_, e)| e.live) {
            let verf = match e.verf {
                Verf::Unknown => return Err("an UNSTABLE WRITE is on the wire".into()),
                Verf::Known(v) => Some(v),
                Verf::Resend => None,
            };
            let mut pages: Vec<(u32, u32)> = Vec::new();
            let mut page = e.first;
            while page != NONE {
                match pages.last_mut() {
                    Some((first, n)) if *first + *n == page => *n += 1,
                    _ => pages.push((page, 1)),
                }
                page = inner.next[page as usize];
            }
            let c = &e.cred;
            entries.push(EntryState {
                file: e.file,
                fh: e.fh.as_bytes().to_vec(),
                cred: (c.uid, c.gid, c.groups[..usize::from(c.ngroups).min(16)].to_vec()),
                offset: e.offset,
                len: e.len,
                pages,
                verf,
                seq: e.seq,
                answered: e.answered,
                slot: Some(slot as u32),
            });
        }
        let memfd =
            inner.data.memfd().try_clone_to_owned().map_err(|e| format!("the UNSTABLE memfd: {e}"))?;
        let state = UnstableState {
            pages: self.pages,
            seq: inner.seq,
            answers: inner.answers,
            entries,
            stats: self.stats(),
        };
        Ok((state, std::fs::File::from(memfd)))
    }

    /// The store `state` describes over `memfd` (as [`Self::save`] gave them): the same pages,
    /// mapped again. `bytes`: this process's configured size, which must be the state's.
    pub fn restore(
        bytes: usize,
        state: &UnstableState,
        memfd: std::fs::File,
    ) -> Result<UnstableStore, String> {
        let pages = (bytes / PAGE).min(NONE as usize - 1);
        if pages != state.pages {
            return Err(format!(
                "the UNSTABLE store had {} pages, this process is configured for {pages} (nfs_unstable_bytes changed)",
                state.pages
            ));
        }
        let data =
            SharedBytes::from_memfd(memfd, pages * PAGE).map_err(|e| format!("the UNSTABLE memfd: {e}"))?;
        let store = UnstableStore::with_pages(data, pages);
        {
            let mut inner = store.lock();
            let mut used = vec![false; pages];
            let mut unslotted = Vec::new();
            for e in &state.entries {
                let fh = Fh::new(&e.fh).ok_or("an UNSTABLE entry's file handle")?;
                if e.cred.2.len() > 16 || e.seq > state.seq || e.answered > state.answers {
                    return Err("an UNSTABLE entry out of order".into());
                }
                let count: u64 = e.pages.iter().map(|&(_, n)| u64::from(n)).sum();
                if count != (e.len as usize).div_ceil(PAGE).max(1) as u64 {
                    return Err("an UNSTABLE entry's pages do not hold its length".into());
                }
                // Chain its pages, each in the store and used once.
                let mut chain =
                    e.pages.iter().flat_map(|&(first, n)| (0..n).map(move |k| first.checked_add(k)));
                let mut prev: Option<u32> = None;
                let mut first = NONE;
                for p in chain.by_ref() {
                    let p =
                        p.filter(|&p| (p as usize) < pages).ok_or("an UNSTABLE page outside the store")?;
                    if std::mem::replace(&mut used[p as usize], true) {
                        return Err("an UNSTABLE page held twice".into());
                    }
                    match prev {
                        Some(q) => inner.next[q as usize] = p,
                        None => first = p,
                    }
                    prev = Some(p);
                }
                if let Some(q) = prev {
                    inner.next[q as usize] = NONE;
                }
                let mut groups = [0u32; 16];
                groups[..e.cred.2.len()].copy_from_slice(&e.cred.2);
                let cred = Cred { uid: e.cred.0, gid: e.cred.1, ngroups: e.cred.2.len() as u8, groups };
                let verf = e.verf.map_or(Verf::Resend, Verf::Known);
                if verf == Verf::Resend {
                    inner.resend += 1;
                }
                let entry = Entry {
                    live: true,
                    file: e.file,
                    fh,
                    cred,
                    offset: e.offset,
                    len: e.len,
                    first,
                    verf,
                    seq: e.seq,
                    answered: e.answered,
                };
                match e.slot {
                    Some(s) if (s as usize) < pages => {
                        let s = s as usize;
                        if inner.entries.len() <= s {
                            let dead = Entry { live: false, ..entry };
                            inner.entries.resize(s + 1, dead);
                        } else if inner.entries[s].live {
                            return Err(format!("UNSTABLE entry slot {s} twice"));
                        }
                        inner.entries[s] = entry;
                    }
                    Some(s) => return Err(format!("UNSTABLE entry slot {s} past the store")),
                    None => unslotted.push(entry),
                }
                inner.live += 1;
            }
            inner.entries.extend(unslotted);
            let inner = &mut *inner;
            inner
                .free_entries
                .extend((0..inner.entries.len() as u32).rev().filter(|&i| !inner.entries[i as usize].live));
            // Every other page is free, in order.
            inner.free_page = NONE;
            inner.free_pages = 0;
            let mut tail: Option<u32> = None;
            for p in (0..pages as u32).filter(|&p| !used[p as usize]) {
                match tail {
                    Some(t) => inner.next[t as usize] = p,
                    None => inner.free_page = p,
                }
                tail = Some(p);
                inner.free_pages += 1;
            }
            if let Some(t) = tail {
                inner.next[t as usize] = NONE;
            }
            inner.seq = state.seq;
            inner.answers = state.answers;
            store.publish(inner);
        }
        *store.stats.lock().unwrap_or_else(|e| e.into_inner()) = state.stats;
        Ok(store)
    }
}

/// An UNSTABLE store as data (a live update); its pages are in the memfd that goes with it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnstableState {
    /// Pages of the store.
    pub pages: usize,
    /// The order counter.
    pub seq: u64,
    /// WRITE replies recorded so far.
    pub answers: u64,
    /// Every stored write.
    pub entries: Vec<EntryState>,
    /// The counters.
    pub stats: UnstableStats,
}

/// One stored write.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EntryState {
    /// Its node.
    pub file: u64,
    /// Its file handle.
    pub fh: Vec<u8>,
    /// The writer: uid, gid, groups.
    pub cred: (u32, u32, Vec<u32>),
    /// Where.
    pub offset: u64,
    /// How many bytes.
    pub len: u32,
    /// The pages holding them, in order, as runs (first page, count).
    pub pages: Vec<(u32, u32)>,
    /// The verifier its WRITE's reply gave; `None`: to be sent again.
    pub verf: Option<[u8; 8]>,
    /// Its place in the order of writes.
    pub seq: u64,
    /// Its place in the order of answers.
    pub answered: u64,
    /// Its slot in the store (kept so that the crash records, `nfs::keep`, name the same
    /// entries after a live update); `None`: the next free one.
    #[serde(default)]
    pub slot: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::VolatileSlice;

    fn with_reader<R>(bytes: &[u8], f: impl FnOnce(&Reader<'_>) -> R) -> R {
        let mut b = bytes.to_vec();
        let bufs = [VolatileSlice::from(&mut b[..])];
        f(&Reader::new(&bufs))
    }

    const CRED: Cred = Cred { uid: 1, gid: 2, ngroups: 0, groups: [0; 16] };

    fn fh() -> Fh {
        Fh::new(b"file").unwrap()
    }

    #[test]
    fn kept_until_a_commit_with_the_same_verifier() {
        let s = UnstableStore::new(4 * PAGE).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let a = with_reader(&data, |r| s.insert(7, &fh(), &CRED, 100, r)).unwrap();
        let b = with_reader(b"small", |r| s.insert(7, &fh(), &CRED, 0, r)).unwrap();
        let c = with_reader(b"other", |r| s.insert(8, &fh(), &CRED, 0, r)).unwrap();
        assert_eq!(with_reader(b"x", |r| s.insert(7, &fh(), &CRED, 0, r)), None, "4 pages used: full");
        assert!(!s.has_room(1) && s.past_high_water());
        s.written(a, [1; 8], false);
        s.written(b, [2; 8], false);
        // COMMIT with verifier 2: a was written under an earlier server instance, so it goes
        // again, and b (written after it) goes again after it.
        let r = s.committed(7, [2; 8], s.horizon());
        assert_eq!(r, Committed { dropped: 0, resend: 2, in_flight: 0 });
        let mut out = vec![0u8; 8192];
        let replay = s.next_resend(7, 1, &mut out).replay().unwrap();
        assert_eq!((replay.id, replay.offset, replay.len), (a, 100, 5000));
        assert_eq!(&out[..5000], &data[..]);
        s.remove(replay.id);
        let replay = s.next_resend(7, 1, &mut out).replay().unwrap();
        assert_eq!((replay.id, &out[..5]), (b, &b"small"[..]));
        s.remove(replay.id);
        assert!(s.next_resend(7, 1, &mut out).replay().is_none());
        assert!(!s.has(7));
        assert!(s.has(8), "another file's write stays (in flight)");
        assert_eq!(s.committed(8, [2; 8], s.horizon()), Committed { dropped: 0, resend: 0, in_flight: 1 });
        s.written(c, [3; 8], true);
        assert!(s.is_empty());
        // All pages are free again.
        let big = vec![9u8; 4 * PAGE];
        assert!(with_reader(&big, |r| s.insert(1, &fh(), &CRED, 0, r)).is_some());
    }

    #[test]
    fn one_sender_at_a_time_resends_a_file_and_a_stale_id_touches_nothing() {
        let s = UnstableStore::new(8 * PAGE).unwrap();
        let a = with_reader(b"first", |r| s.insert(1, &fh(), &CRED, 0, r)).unwrap();
        let b = with_reader(b"second", |r| s.insert(1, &fh(), &CRED, 0, r)).unwrap();
        s.written(a, [1; 8], false);
        s.written(b, [1; 8], false);
        assert_eq!(s.committed(1, [2; 8], s.horizon()).resend, 2);
        let mut out = vec![0u8; 16];
        let first = s.next_resend(1, 10, &mut out).replay().unwrap();
        assert_eq!(first.id, a);
        assert_eq!(s.next_resend(1, 20, &mut out), Resend::Busy, "the file's turn is sender 10's");
        assert_eq!(s.next_resend(1, 10, &mut [0u8; 2]), Resend::Short(5), "too short a buffer");
        s.remove(first.id);
        // The first write's slot taken by another write: the stale id touches nothing.
        let c = with_reader(b"third", |r| s.insert(2, &fh(), &CRED, 0, r)).unwrap();
        assert_eq!(c.0, a.0);
        s.remove(a);
        s.written(a, [9; 8], true);
        assert!(s.has(2), "the new write of the slot stays");
        // Sender 10 ends early (its request failed): sender 20 takes the turn, in order.
        s.end_resend(1, 10);
        assert_eq!(s.next_resend(1, 20, &mut out).replay().map(|r| r.id), Some(b));
        s.remove(b);
        assert_eq!(s.next_resend(1, 20, &mut out), Resend::Done);
        assert_eq!(s.next_resend(1, 10, &mut out), Resend::Done, "the turn ended with the last");
    }

    #[test]
    fn replays_go_in_the_order_the_writes_were_made() {
        let s = UnstableStore::new(8 * PAGE).unwrap();
        let a = with_reader(b"first", |r| s.insert(1, &fh(), &CRED, 0, r)).unwrap();
        let b = with_reader(b"other", |r| s.insert(2, &fh(), &CRED, 0, r)).unwrap();
        s.remove(b);
        // The second write of file 1 reuses the freed entry slot (before `a` in the table).
        let c = with_reader(b"second", |r| s.insert(1, &fh(), &CRED, 0, r)).unwrap();
        assert_eq!(c.0, b.0, "the same slot");
        assert_ne!(c, b, "another write: a stale id of the slot's last one touches nothing");
        s.written(a, [1; 8], false);
        s.written(c, [1; 8], false);
        assert_eq!(s.committed(1, [2; 8], s.horizon()).resend, 2);
        let mut out = [0u8; PAGE];
        let r = s.next_resend(1, 1, &mut out).replay().unwrap();
        assert_eq!((r.id, &out[..5]), (a, &b"first"[..]));
        s.remove(r.id);
        let r = s.next_resend(1, 1, &mut out).replay().unwrap();
        assert_eq!((r.id, &out[..6]), (c, &b"second"[..]));
    }

    #[test]
    fn an_empty_store_stores_nothing() {
        let s = UnstableStore::new(0).unwrap();
        assert!(!s.enabled());
        assert_eq!(with_reader(b"x", |r| s.insert(1, &fh(), &CRED, 0, r)), None);
    }

    #[test]
    fn verifier_changing_between_parts_means_resend() {
        let s = UnstableStore::new(PAGE).unwrap();
        let a = with_reader(b"abc", |r| s.insert(1, &fh(), &CRED, 0, r)).unwrap();
        s.written(a, [1; 8], false);
        s.written(a, [2; 8], false);
        assert_eq!(s.committed(1, [2; 8], s.horizon()).resend, 1);
    }

    #[test]
    fn a_commit_covers_only_writes_answered_before_it_was_sent() {
        let s = UnstableStore::new(8 * PAGE).unwrap();
        let a = with_reader(b"a", |r| s.insert(1, &fh(), &CRED, 0, r)).unwrap();
        let b = with_reader(b"b", |r| s.insert(1, &fh(), &CRED, 10, r)).unwrap();
        s.written(a, [1; 8], false);
        let horizon = s.horizon();
        // b's reply comes after the COMMIT went out: the server may have had it after the COMMIT.
        s.written(b, [1; 8], false);
        assert_eq!(s.committed(1, [1; 8], horizon), Committed { dropped: 1, resend: 0, in_flight: 1 });
        assert_eq!(s.len(), 1);
        assert_eq!(s.committed(1, [1; 8], s.horizon()).dropped, 1);
        assert!(s.is_empty());
    }

    #[test]
    fn writes_after_one_the_server_lost_are_sent_again_after_it() {
        let s = UnstableStore::new(8 * PAGE).unwrap();
        let old = with_reader(b"old", |r| s.insert(1, &fh(), &CRED, 0, r)).unwrap();
        s.written(old, [1; 8], false);
        // The server restarted: a later write of the same bytes is answered under the new verifier.
        let new = with_reader(b"new", |r| s.insert(1, &fh(), &CRED, 0, r)).unwrap();
        let later = with_reader(b"later", |r| s.insert(1, &fh(), &CRED, 0, r)).unwrap();
        s.written(new, [2; 8], false);
        let c = s.committed(1, [2; 8], s.horizon());
        assert_eq!(c, Committed { dropped: 0, resend: 2, in_flight: 1 }, "new must land after old again");
        // A write answered after that goes again too, after both.
        s.written(later, [2; 8], false);
        let mut out = [0u8; PAGE];
        let mut order = Vec::new();
        while let Some(r) = s.next_resend(1, 1, &mut out).replay() {
            order.push(out[..r.len as usize].to_vec());
            s.remove(r.id);
        }
        assert_eq!(order, [&b"old"[..], b"new", b"later"]);
        assert!(s.is_empty());
    }

    #[test]
    fn the_background_commit_picks_the_file_with_most_answered_bytes() {
        let s = UnstableStore::new(16 * PAGE).unwrap();
        assert!(s.pick_commit().is_none());
        let big = vec![1u8; 3 * PAGE];
        let a = with_reader(&big, |r| s.insert(5, &fh(), &CRED, 0, r)).unwrap();
        let other = Cred { uid: 7, ..CRED };
        let b = with_reader(b"x", |r| s.insert(6, &fh(), &CRED, 0, r)).unwrap();
        let c = with_reader(b"y", |r| s.insert(6, &fh(), &other, 0, r)).unwrap();
        let d = with_reader(&big, |r| s.insert(7, &fh(), &CRED, 0, r)).unwrap();
        assert!(s.pick_commit().is_none(), "nothing answered yet");
        for id in [a, b, c] {
            s.written(id, [1; 8], false);
        }
        let p = s.pick_commit().unwrap();
        assert_eq!((p.file, p.bytes), (5, 3 * PAGE as u64), "file 7's write is still on the wire");
        s.committed_background(5, [1; 8], s.horizon());
        let p = s.pick_commit().unwrap();
        assert_eq!((p.file, p.bytes, p.cred.uid), (6, 2 * PAGE as u64, 7), "the newest write's credential");
        assert_eq!(s.stats().background_freed, 3 * PAGE as u64);
        assert!(s.room_may_come(), "d will be answered");
        s.remove(d);
        assert_eq!(s.stats().high_water, 8 * PAGE as u64);
    }

    #[test]
    fn one_background_commit_at_a_time() {
        let s = UnstableStore::new(PAGE).unwrap();
        let claim = s.begin_background().unwrap();
        assert!(s.begin_background().is_none());
        assert!(s.room_may_come(), "a COMMIT is on the wire");
        drop(claim);
        assert!(s.begin_background().is_some());
        assert!(!s.room_may_come(), "nothing stored, nothing on the wire");
    }

    /// Issue 22: a store given to another process holds the same writes there, with their
    /// verifiers, order and bytes (the same memfd, mapped again): a COMMIT with the verifier of
    /// one drops it, one written under another is replayed, in order; the counters continue;
    /// another store size, a page held twice or outside the store are refused.
    #[test]
    fn a_store_handed_over_commits_and_replays_as_the_old_one_would() {
        let s = UnstableStore::new(8 * PAGE).unwrap();
        let data: Vec<u8> = (0..6000u32).map(|i| (i * 7) as u8).collect();
        let a = with_reader(&data, |r| s.insert(7, &fh(), &CRED, 100, r)).unwrap();
        let b = with_reader(b"later", |r| s.insert(7, &fh(), &CRED, 0, r)).unwrap();
        let c = with_reader(b"other", |r| s.insert(8, &fh(), &CRED, 0, r)).unwrap();
        s.written(a, [1; 8], false);
        s.written(b, [2; 8], false);
        assert!(s.save().is_err(), "c's WRITE is on the wire: not a quiet point");
        s.written(c, [2; 8], false);
        let (state, memfd) = s.save().unwrap();
        assert_eq!(state.entries.iter().map(|e| e.pages.iter().map(|p| p.1).sum::<u32>()).sum::<u32>(), 4);
        let json = serde_json::to_string(&state).unwrap();
        let again = memfd.try_clone().unwrap();
        let r = UnstableStore::restore(8 * PAGE, &serde_json::from_str(&json).unwrap(), memfd).unwrap();
        assert_eq!((r.len(), r.stats().stored, r.stats().bytes_now), (3, 3, s.stats().bytes_now));
        assert!(r.has_answered(7) && r.has_answered(8));
        assert_eq!(r.committed(8, [2; 8], r.horizon()), Committed { dropped: 1, resend: 0, in_flight: 0 });
        assert_eq!(r.committed(7, [2; 8], r.horizon()), Committed { dropped: 0, resend: 2, in_flight: 0 });
        let mut out = vec![0u8; 8192];
        let first = r.next_resend(7, 1, &mut out).replay().unwrap();
        assert_eq!((first.offset, first.len), (100, 6000));
        assert_eq!(&out[..6000], &data[..], "the same bytes, in the same memory");
        r.remove(first.id);
        let second = r.next_resend(7, 1, &mut out).replay().unwrap();
        assert_eq!(&out[..5], b"later");
        r.remove(second.id);
        assert!(r.is_empty());
        let big = vec![1u8; 8 * PAGE];
        assert!(with_reader(&big, |rd| r.insert(1, &fh(), &CRED, 0, rd)).is_some(), "every page freed");

        assert!(
            UnstableStore::restore(2 * PAGE, &state, again.try_clone().unwrap()).is_err(),
            "another size"
        );
        let mut twice = state.clone();
        twice.entries[1].pages = twice.entries[0].pages.clone();
        twice.entries[1].len = twice.entries[0].len;
        assert!(
            UnstableStore::restore(8 * PAGE, &twice, again.try_clone().unwrap()).is_err(),
            "a page twice"
        );
        let mut outside = state.clone();
        outside.entries[2].pages = vec![(8, 1)];
        assert!(UnstableStore::restore(8 * PAGE, &outside, again).is_err(), "a page past the store");
    }
}
