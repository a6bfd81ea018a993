//! The UNSTABLE write replay store: what the NFS backend wrote with `stable = UNSTABLE` and the
//! server has not committed yet.
//!
//! An NFSv3 server may answer an UNSTABLE WRITE before the data is on stable storage; only a
//! COMMIT that returns the *same write verifier* as the WRITE did proves it is. A server that
//! restarted in between returns a new verifier and may have lost the data, so the client must
//! send it again (RFC 1813, 4.8). The device acknowledged the WRITE to the guest already, so the
//! data must be kept here until then: every UNSTABLE WRITE's payload is copied (once, at start)
//! into this preallocated, bounded store; the entry learns its verifier from the WRITE's reply;
//! a FLUSH or FSYNC of the file sends COMMIT and drops the entries whose verifier the COMMIT
//! returns, and sends the others again (FILE_SYNC) before it is acknowledged. When the store is
//! full the WRITE goes FILE_SYNC instead (nothing to keep), so the bound costs speed, never data.
//!
//! The store is shared by every poller (one file's WRITEs come through several queues) behind a
//! short mutex. Data lives in fixed 4 KiB pages linked into per-entry chains (entries are freed
//! out of order, per file); nothing allocates after construction.

use std::sync::{Mutex, MutexGuard};

use crate::io::Reader;
use crate::nfs::wire::nfs3::Fh;

/// Bytes per page of the store.
pub const PAGE: usize = 4096;

const NONE: u32 = u32::MAX;

/// Names one stored write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryId(u32);

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

#[derive(Clone, Copy)]
struct Entry {
    live: bool,
    file: u64,
    fh: Fh,
    offset: u64,
    len: u32,
    first: u32,
    verf: Verf,
    /// Order of the writes (replays go in it: a later write of the same bytes wins).
    seq: u64,
}

struct Inner {
    data: Vec<u8>,
    /// Next page of each page's chain (or of the free list).
    next: Vec<u32>,
    free_page: u32,
    free_pages: usize,
    entries: Vec<Entry>,
    free_entries: Vec<u32>,
    live: usize,
    seq: u64,
}

/// What a COMMIT's verifier meant for a file's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Committed {
    /// Entries the COMMIT covered (dropped).
    pub dropped: usize,
    /// Entries to send again.
    pub resend: usize,
    /// Entries whose WRITE is still on the wire (left alone).
    pub in_flight: usize,
}

/// A stored write to send again: where it goes.
#[derive(Debug, Clone, Copy)]
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

/// What the store did so far (plain numbers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnstableStats {
    /// Writes stored (sent UNSTABLE).
    pub stored: u64,
    /// Writes that found the store full (sent FILE_SYNC).
    pub full: u64,
    /// Writes sent again after a verifier change.
    pub resent: u64,
    /// Bytes stored now.
    pub bytes_now: u64,
}

/// The bounded store of uncommitted UNSTABLE writes (see the module documentation).
pub struct UnstableStore {
    inner: Mutex<Inner>,
    stats: Mutex<UnstableStats>,
    pages: usize,
}

impl std::fmt::Debug for UnstableStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnstableStore").field("pages", &self.pages).finish_non_exhaustive()
    }
}

impl UnstableStore {
    /// A store of `bytes` (rounded down to whole pages; 0: nothing is ever stored, every WRITE
    /// goes FILE_SYNC).
    pub fn new(bytes: usize) -> Self {
        let pages = (bytes / PAGE).min(NONE as usize - 1);
        let next = (0..pages as u32).map(|i| if i + 1 < pages as u32 { i + 1 } else { NONE }).collect();
        let free_page = if pages > 0 { 0 } else { NONE };
        let inner = Inner {
            data: vec![0; pages * PAGE],
            next,
            free_page,
            free_pages: pages,
            entries: Vec::with_capacity(pages),
            free_entries: Vec::with_capacity(pages),
            live: 0,
            seq: 0,
        };
        UnstableStore { inner: Mutex::new(inner), stats: Mutex::default(), pages }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self, f: impl FnOnce(&mut UnstableStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Whether anything can be stored at all.
    pub fn enabled(&self) -> bool {
        self.pages > 0
    }

    /// Stores the bytes `data` has left (not consuming it) as a write of `file` (`fh`) at
    /// `offset`; `None` when there is no room (send it FILE_SYNC).
    pub fn insert(&self, file: u64, fh: &Fh, offset: u64, data: &Reader<'_>) -> Option<EntryId> {
        let len = data.bytes_left();
        let need = len.div_ceil(PAGE).max(1);
        let mut inner = self.lock();
        if need > inner.free_pages || u32::try_from(len).is_err() {
            drop(inner);
            self.bump(|s| s.full += 1);
            return None;
        }
        let first = inner.free_page;
        let mut r = data.clone();
        let mut page = first;
        let mut last = first;
        for k in 0..need {
            let n = (len - k * PAGE).min(PAGE);
            let at = page as usize * PAGE;
            if r.read_exact(&mut inner.data[at..at + n]).is_err() {
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
        let e = Entry { live: true, file, fh: *fh, offset, len: len as u32, first, verf: Verf::Unknown, seq };
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
        let bytes = ((self.pages - inner.free_pages) * PAGE) as u64;
        drop(inner);
        self.bump(|s| {
            s.stored += 1;
            s.bytes_now = bytes;
        });
        Some(EntryId(id))
    }

    /// The WRITE of `id` was answered with `verf`; `stable`: the server says it is on stable
    /// storage already (FILE_SYNC), so the entry goes.
    pub fn written(&self, id: EntryId, verf: [u8; 8], stable: bool) {
        if stable {
            return self.remove(id);
        }
        let mut inner = self.lock();
        let Some(e) = inner.entries.get_mut(id.0 as usize).filter(|e| e.live) else { return };
        e.verf = match e.verf {
            Verf::Unknown => Verf::Known(verf),
            Verf::Known(v) if v == verf => Verf::Known(v),
            _ => Verf::Resend,
        };
    }

    /// Drops entry `id` (its WRITE failed, or the data is stable now).
    pub fn remove(&self, id: EntryId) {
        let mut inner = self.lock();
        let Some(e) = inner.entries.get(id.0 as usize).copied().filter(|e| e.live) else { return };
        let mut page = e.first;
        let mut n = 0;
        let mut last = page;
        while page != NONE {
            last = page;
            page = inner.next[page as usize];
            n += 1;
        }
        inner.next[last as usize] = inner.free_page;
        inner.free_page = e.first;
        inner.free_pages += n;
        inner.entries[id.0 as usize].live = false;
        inner.free_entries.push(id.0);
        inner.live -= 1;
        let bytes = ((self.pages - inner.free_pages) * PAGE) as u64;
        drop(inner);
        self.bump(|s| s.bytes_now = bytes);
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

    /// A COMMIT of `file` returned `verf`: the entries written under it go, those written under
    /// another are marked to be sent again.
    pub fn committed(&self, file: u64, verf: [u8; 8]) -> Committed {
        let mut out = Committed::default();
        let mut drop_ids = [0u32; 64];
        loop {
            let mut n = 0;
            {
                let mut inner = self.lock();
                for (i, e) in inner.entries.iter_mut().enumerate() {
                    if !e.live || e.file != file {
                        continue;
                    }
                    match e.verf {
                        Verf::Known(v) if v == verf => {
                            if n < drop_ids.len() {
                                drop_ids[n] = i as u32;
                                n += 1;
                            }
                        }
                        Verf::Known(_) => {
                            e.verf = Verf::Resend;
                        }
                        Verf::Resend | Verf::Unknown => {}
                    }
                }
                if n == 0 {
                    out.resend = inner
                        .entries
                        .iter()
                        .filter(|e| e.live && e.file == file && e.verf == Verf::Resend)
                        .count();
                    out.in_flight = inner
                        .entries
                        .iter()
                        .filter(|e| e.live && e.file == file && e.verf == Verf::Unknown)
                        .count();
                }
            }
            if n == 0 {
                return out;
            }
            for &i in &drop_ids[..n] {
                self.remove(EntryId(i));
            }
            out.dropped += n;
        }
    }

    /// The next entry of `file` to send again (the oldest: replays keep the order the writes
    /// were made in), its bytes copied into `out` (which must hold them: one WRITE of the
    /// server's `wtmax` at most); `None` when there is none.
    pub fn next_resend(&self, file: u64, out: &mut [u8]) -> Option<Replay> {
        let inner = self.lock();
        let (i, e) = inner
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.live && e.file == file && e.verf == Verf::Resend)
            .min_by_key(|(_, e)| e.seq)?;
        let len = e.len as usize;
        if len > out.len() {
            return None;
        }
        let mut page = e.first;
        let mut at = 0;
        while at < len && page != NONE {
            let n = (len - at).min(PAGE);
            let src = page as usize * PAGE;
            out[at..at + n].copy_from_slice(&inner.data[src..src + n]);
            at += n;
            page = inner.next[page as usize];
        }
        let r = Replay { id: EntryId(i as u32), fh: e.fh, offset: e.offset, len: e.len };
        drop(inner);
        self.bump(|s| s.resent += 1);
        Some(r)
    }

    /// Drops every entry of `file` (it is gone on the server, or forgotten).
    pub fn drop_file(&self, file: u64) {
        loop {
            let id = {
                let inner = self.lock();
                if inner.live == 0 {
                    return;
                }
                match inner.entries.iter().position(|e| e.live && e.file == file) {
                    Some(i) => EntryId(i as u32),
                    None => return,
                }
            };
            self.remove(id);
        }
    }

    /// Marks every entry of `file` to be sent again (a WRITE reply showed the server's
    /// verifier changed under it).
    pub fn mark_resend(&self, file: u64) {
        let mut inner = self.lock();
        for e in inner.entries.iter_mut().filter(|e| e.live && e.file == file) {
            if matches!(e.verf, Verf::Known(_)) {
                e.verf = Verf::Resend;
            }
        }
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

    fn fh() -> Fh {
        Fh::new(b"file").unwrap()
    }

    #[test]
    fn kept_until_a_commit_with_the_same_verifier() {
        let s = UnstableStore::new(4 * PAGE);
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let a = with_reader(&data, |r| s.insert(7, &fh(), 100, r)).unwrap();
        let b = with_reader(b"small", |r| s.insert(7, &fh(), 0, r)).unwrap();
        let c = with_reader(b"other", |r| s.insert(8, &fh(), 0, r)).unwrap();
        assert_eq!(with_reader(b"x", |r| s.insert(7, &fh(), 0, r)), None, "4 pages used: full");
        assert_eq!(s.stats().full, 1);
        s.written(a, [1; 8], false);
        s.written(b, [2; 8], false);
        // COMMIT with verifier 2: b is covered, a was written under an earlier server instance.
        let r = s.committed(7, [2; 8]);
        assert_eq!(r, Committed { dropped: 1, resend: 1, in_flight: 0 });
        let mut out = vec![0u8; 8192];
        let replay = s.next_resend(7, &mut out).unwrap();
        assert_eq!((replay.id, replay.offset, replay.len), (a, 100, 5000));
        assert_eq!(&out[..5000], &data[..]);
        s.remove(replay.id);
        assert!(s.next_resend(7, &mut out).is_none());
        assert!(!s.has(7));
        assert!(s.has(8), "another file's write stays (in flight)");
        assert_eq!(s.committed(8, [2; 8]), Committed { dropped: 0, resend: 0, in_flight: 1 });
        s.written(c, [3; 8], true);
        assert!(s.is_empty());
        // All pages are free again.
        let big = vec![9u8; 4 * PAGE];
        assert!(with_reader(&big, |r| s.insert(1, &fh(), 0, r)).is_some());
    }

    #[test]
    fn replays_go_in_the_order_the_writes_were_made() {
        let s = UnstableStore::new(8 * PAGE);
        let a = with_reader(b"first", |r| s.insert(1, &fh(), 0, r)).unwrap();
        let b = with_reader(b"other", |r| s.insert(2, &fh(), 0, r)).unwrap();
        s.remove(b);
        // The second write of file 1 reuses the freed entry slot (before `a` in the table).
        let c = with_reader(b"second", |r| s.insert(1, &fh(), 0, r)).unwrap();
        assert_eq!(c, b);
        s.written(a, [1; 8], false);
        s.written(c, [1; 8], false);
        assert_eq!(s.committed(1, [2; 8]).resend, 2);
        let mut out = [0u8; PAGE];
        let r = s.next_resend(1, &mut out).unwrap();
        assert_eq!((r.id, &out[..5]), (a, &b"first"[..]));
        s.remove(r.id);
        let r = s.next_resend(1, &mut out).unwrap();
        assert_eq!((r.id, &out[..6]), (c, &b"second"[..]));
    }

    #[test]
    fn an_empty_store_stores_nothing() {
        let s = UnstableStore::new(0);
        assert!(!s.enabled());
        assert_eq!(with_reader(b"x", |r| s.insert(1, &fh(), 0, r)), None);
    }

    #[test]
    fn verifier_changing_between_parts_means_resend() {
        let s = UnstableStore::new(PAGE);
        let a = with_reader(b"abc", |r| s.insert(1, &fh(), 0, r)).unwrap();
        s.written(a, [1; 8], false);
        s.written(a, [2; 8], false);
        assert_eq!(s.committed(1, [2; 8]).resend, 1);
    }
}
