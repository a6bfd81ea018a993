//! A shared directory kept for a crash (issue 24): what a process started after the serving
//! one was killed needs to serve the guest's nodes and handles on.
//!
//! Nodes and handles are host descriptors, which die with the process that holds them, so the
//! daemon's supervisor holds a copy of each ([`DescriptorKeeper`]): a node's `O_PATH`
//! descriptor is given to it when the node is made, an open handle's file when it is opened
//! (under the table's or the handles' lock, before the request that made it is answered: a
//! descriptor sent is in the supervisor's socket even if this process dies the next moment),
//! and let go when the node goes or the handle is released. The node table's counts change on
//! every LOOKUP and FORGET, too often for a message each: they are records in a memfd the
//! supervisor holds ([`ShareKeep`]), a slot of four 64-bit words per node (head, node id, the
//! kernel's lookup references, a directory's parent), each written with one atomic store, the
//! head last, under the table's lock.
//!
//! A request's descriptors are queued ([`ShareKeep::queue_hold`], [`ShareKeep::queue_let`])
//! and given in one message per poller round ([`ShareKeep::flush`], called by the poller
//! before it publishes the round's replies: `FileSystem::before_publish`), so that the
//! supervisor has each descriptor before the guest can know its node or handle. A request
//! that answers with a node another request made and did not give yet gives the queue first
//! ([`ShareKeep::flush_through`]).
//!
//! Read back ([`ShareKeep::read`]), the records and the descriptors the supervisor held give
//! the same `PassthroughState` a live update hands over (`state.rs`); a node whose record is
//! gone (it went just before the kill) is dropped, and so is one whose descriptor was still
//! queued (its reply was never published: the guest does not know it). A node that got no
//! record, or a descriptor that could not be given, marks the records incomplete, and that
//! refuses the recovery (the function then ends as one whose state was lost).

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::{Deserialize, Serialize};

use crate::ramfs::sys::SharedWords;

/// Set in a held descriptor's key: an open handle (its handle id below), not a node.
pub const HANDLE_KEY: u64 = 1 << 63;

const MAGIC: u64 = u64::from_le_bytes(*b"VFDSHRK1");
const HEADER_WORDS: usize = 8;
const SLOT_WORDS: usize = 4;
/// A head's bits: the slot holds a node; the node is in the table (the kernel holds it).
const LIVE: u64 = 1 << 63;
const IN_TABLE: u64 = 1 << 62;
/// Header words: the next node id and handle id never given; set when a node got no slot.
const H_NEXT_ID: usize = 2;
const H_NEXT_FH: usize = 3;
const H_INCOMPLETE: usize = 4;
/// Header word: every node with an id up to this one that was in the table had its descriptor
/// given (raised after each flush; node ids are queued in the order they are given out).
const H_GIVEN_ID: usize = 5;

/// What the supervisor holds a descriptor as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeldItem {
    /// A node's `O_PATH` descriptor.
    Node {
        /// The host inode: `st_dev`, `st_ino`, mount id.
        key: (u64, u64, u64),
        /// Its file type (`S_IFMT` bits).
        kind: u32,
    },
    /// An open handle's file.
    Handle {
        /// Its node.
        node: u64,
        /// A directory handle.
        dir: bool,
        /// `O_RDONLY`, `O_WRONLY` or `O_RDWR`.
        access: i32,
        /// `RWF_NOWAIT` refused for reads (bit 0) or writes (bit 1).
        no_nowait: u8,
    },
}

/// What holds a function's descriptors for it across a crash (the daemon's supervisor).
pub trait DescriptorKeeper: Send + Sync {
    /// Holds a copy of each of `fds` under its item's key (a node id, or a handle id with
    /// [`HANDLE_KEY`]); `false`: they could not be given (a crash would not be recovered).
    fn hold(&self, items: &[(u64, HeldItem)], fds: &[BorrowedFd<'_>]) -> bool;
    /// Lets the descriptors of `keys` go.
    fn let_go(&self, keys: &[u64]);
    /// Lets every descriptor held for the function go (before all are held anew).
    fn let_all_go(&self);
    /// Takes as the function's held descriptors those its predecessor holds (a live update:
    /// the same nodes and handles under the same keys) instead of being given them again;
    /// `false`: it cannot, and they are to be given.
    fn adopt(&self) -> bool {
        false
    }
}

/// A node's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRecord {
    /// Its slot.
    pub slot: u32,
    /// Its node id.
    pub id: u64,
    /// In the table: the kernel's lookup references (`None`: out of the table, held by a
    /// handle or a child directory).
    pub refs: Option<u64>,
    /// A directory's parent node (0: none).
    pub parent: u64,
}

/// What holds a queued descriptor open until it is given (a node, a handle).
pub type QueuedFd = Arc<dyn AsFd + Send + Sync>;

/// A change queued for the keeper.
enum Queued {
    Hold(u64, HeldItem, QueuedFd),
    Let(u64),
}

/// The changes not given to the keeper yet, in order; the last one's number.
#[derive(Default)]
struct Pending {
    items: Vec<Queued>,
    last: u64,
}

/// The records and the descriptor keeper (see the module documentation).
pub struct ShareKeep {
    words: SharedWords,
    slots: usize,
    free: Mutex<Vec<u32>>,
    keeper: OnceLock<Arc<dyn DescriptorKeeper>>,
    /// A descriptor could not be given: logged once.
    failed: AtomicBool,
    /// Changes queued for the keeper.
    pending: Mutex<Pending>,
    /// Handed over to a successor (a live update's commit): the records and the keeper are
    /// the successor's business now, and this process's share, going away, changes neither.
    detached: AtomicBool,
    /// The number of the last change queued, and of the last one given (each flush gives
    /// every change queued before it, under `giving`, so these only grow).
    queued: AtomicU64,
    given: AtomicU64,
    giving: Mutex<()>,
}

impl std::fmt::Debug for ShareKeep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShareKeep").field("slots", &self.slots).finish_non_exhaustive()
    }
}

impl ShareKeep {
    /// Records for `slots` nodes in a new memfd (sparse), every slot free.
    pub fn create(slots: usize) -> std::io::Result<ShareKeep> {
        let words = SharedWords::new("virtiofs-share-kept", HEADER_WORDS + slots * SLOT_WORDS)?;
        words.store(1, slots as u64);
        words.store(0, MAGIC);
        Ok(Self::with(words, slots, &Default::default()))
    }

    /// The records in `memfd` (a dead process's), their header checked; the slots of
    /// [`Self::read`]'s records stay in use until [`Self::release_unused`].
    pub fn open(memfd: File) -> Result<ShareKeep, String> {
        let words = SharedWords::from_memfd(memfd).map_err(|e| format!("the share's records: {e}"))?;
        if words.len() < HEADER_WORDS || words.load(0) != MAGIC {
            return Err("the share's records are not this firmware's".into());
        }
        let slots = usize::try_from(words.load(1)).unwrap_or(usize::MAX);
        if HEADER_WORDS.saturating_add(slots.saturating_mul(SLOT_WORDS)) > words.len() {
            return Err("the share's records are shorter than their header says".into());
        }
        let used: std::collections::HashSet<u32> = (0..slots as u32)
            .filter(|&s| words.load(HEADER_WORDS + s as usize * SLOT_WORDS) & LIVE != 0)
            .collect();
        Ok(Self::with(words, slots, &used))
    }

    fn with(words: SharedWords, slots: usize, used: &std::collections::HashSet<u32>) -> ShareKeep {
        let free = (0..slots as u32).rev().filter(|s| !used.contains(s)).collect();
        ShareKeep {
            words,
            slots,
            free: Mutex::new(free),
            keeper: OnceLock::new(),
            failed: AtomicBool::new(false),
            pending: Mutex::new(Pending::default()),
            detached: AtomicBool::new(false),
            queued: AtomicU64::new(0),
            given: AtomicU64::new(0),
            giving: Mutex::new(()),
        }
    }

    /// The memfd (for the supervisor to hold).
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.words.memfd()
    }

    /// How many nodes it has room for.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Gives the descriptors to `keeper` from now on (once).
    pub fn set_keeper(&self, keeper: Arc<dyn DescriptorKeeper>) {
        let _ = self.keeper.set(keeper);
    }

    /// Whether descriptors go to a keeper.
    pub fn has_keeper(&self) -> bool {
        self.keeper.get().is_some()
    }

    /// A free slot for a new node; `None` when all are taken: the node is then not kept, and
    /// the records say so (a recovery is refused: the guest may hold a node it cannot find).
    pub fn alloc(&self) -> Option<u32> {
        let slot = self.free.lock().unwrap_or_else(PoisonError::into_inner).pop();
        if slot.is_none() {
            self.words.store(H_INCOMPLETE, 1);
            if !self.failed.swap(true, Ordering::Relaxed) {
                log::warn!("passthrough: no record slot for a node: a crash would end this share");
            }
        }
        slot
    }

    /// Node ids from `id` on and handle ids from `fh` on were never given (stored before an
    /// id is given, under the lock that gives it, so a recovery never gives one again).
    pub fn next_ids(&self, id: u64, fh: u64) {
        self.words.raise(H_NEXT_ID, id);
        self.words.raise(H_NEXT_FH, fh);
    }

    /// The node and handle ids never given, as stored by [`Self::next_ids`].
    pub fn next_ids_kept(&self) -> (u64, u64) {
        (self.words.load(H_NEXT_ID), self.words.load(H_NEXT_FH))
    }

    /// Whether a node went without a record (see [`Self::alloc`]).
    pub fn incomplete(&self) -> bool {
        self.words.load(H_INCOMPLETE) != 0
    }

    /// Stops writing the records and giving the keeper anything (the share was handed over
    /// to a live update's successor; a recovery may still read these records).
    pub fn detach(&self) {
        self.detached.store(true, Ordering::Release);
    }

    fn is_detached(&self) -> bool {
        self.detached.load(Ordering::Acquire)
    }

    /// Writes node `r`'s record (body, then head).
    pub fn write(&self, r: &NodeRecord) {
        let at = HEADER_WORDS + r.slot as usize * SLOT_WORDS;
        if r.slot as usize >= self.slots || self.is_detached() {
            return;
        }
        self.words.store(at + 1, r.id);
        self.words.store(at + 2, r.refs.unwrap_or(0));
        self.words.store(at + 3, r.parent);
        self.words.store(at, LIVE | if r.refs.is_some() { IN_TABLE } else { 0 });
    }

    /// Node `id` in `slot` is gone: its record is cleared, its slot free, its descriptor let go
    /// (queued: its hold was given, as the queue held the node until then).
    pub fn gone(&self, slot: u32, id: u64) {
        if self.is_detached() {
            return;
        }
        if (slot as usize) < self.slots {
            self.words.store(HEADER_WORDS + slot as usize * SLOT_WORDS, 0);
            self.free.lock().unwrap_or_else(PoisonError::into_inner).push(slot);
        }
        self.queue_let(id);
    }

    /// Every record in use.
    pub fn read(&self) -> Vec<NodeRecord> {
        (0..self.slots as u32)
            .filter_map(|slot| {
                let at = HEADER_WORDS + slot as usize * SLOT_WORDS;
                let head = self.words.load(at);
                (head & LIVE != 0).then(|| NodeRecord {
                    slot,
                    id: self.words.load(at + 1),
                    refs: (head & IN_TABLE != 0).then(|| self.words.load(at + 2)),
                    parent: self.words.load(at + 3),
                })
            })
            .collect()
    }

    /// Clears the records of the slots not in `used` and frees them (after a recovery, which
    /// kept the nodes of `used`).
    pub fn release_unused(&self, used: &std::collections::HashSet<u32>) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        free.clear();
        for slot in (0..self.slots as u32).rev() {
            if !used.contains(&slot) {
                self.words.store(HEADER_WORDS + slot as usize * SLOT_WORDS, 0);
                free.push(slot);
            }
        }
    }

    /// Gives `fds` to the keeper now (nothing is queued: the records are being set up); a
    /// failure marks the records incomplete.
    pub fn hold(&self, items: &[(u64, HeldItem)], fds: &[BorrowedFd<'_>]) {
        let Some(k) = self.keeper.get() else { return };
        if !k.hold(items, fds) {
            self.not_given();
        }
    }

    /// Whether changes are queued and not given ([`Self::flush`] has something to do).
    pub fn due(&self) -> bool {
        self.given.load(Ordering::Acquire) < self.queued.load(Ordering::Acquire)
    }

    /// Something was lost on the way to the keeper (a flush that did not end): a recovery is
    /// refused.
    pub fn mark_incomplete(&self) {
        self.not_given();
    }

    /// A descriptor did not reach the keeper: a recovery would miss it.
    fn not_given(&self) {
        self.words.store(H_INCOMPLETE, 1);
        if !self.failed.swap(true, Ordering::Relaxed) {
            log::warn!("passthrough: a descriptor could not be given to the supervisor: a crash would end this share");
        }
    }

    /// Queues `fd` for the keeper under `key` as `item` (given at the next [`Self::flush`],
    /// held open until then); its change number for [`Self::flush_through`] (0: no keeper).
    pub fn queue_hold(&self, key: u64, item: HeldItem, fd: QueuedFd) -> u64 {
        if self.keeper.get().is_none() {
            return 0;
        }
        self.queue(Queued::Hold(key, item, fd))
    }

    /// Queues letting `key`'s descriptor go.
    pub fn queue_let(&self, key: u64) {
        if self.keeper.get().is_some() {
            self.queue(Queued::Let(key));
        }
    }

    fn queue(&self, q: Queued) -> u64 {
        if self.is_detached() {
            return 0;
        }
        let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        p.items.push(q);
        p.last += 1;
        self.queued.store(p.last, Ordering::Release);
        p.last
    }

    /// Gives the keeper every change queued so far, in order, as few messages as the order
    /// allows (a run of holds is one message). Cheap when nothing is queued.
    pub fn flush(&self) {
        if self.given.load(Ordering::Acquire) >= self.queued.load(Ordering::Acquire) {
            return;
        }
        let Some(k) = self.keeper.get() else { return };
        let _giving = self.giving.lock().unwrap_or_else(PoisonError::into_inner);
        if self.given.load(Ordering::Acquire) >= self.queued.load(Ordering::Acquire) {
            return; // given by the flush this one waited for
        }
        let (items, last) = {
            let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            (std::mem::take(&mut p.items), p.last)
        };
        let mut at = 0;
        while at < items.len() {
            let hold = matches!(items[at], Queued::Hold(..));
            let n = items[at..].iter().take_while(|q| matches!(q, Queued::Hold(..)) == hold).count();
            let run = &items[at..at + n];
            if hold {
                let mut held = Vec::with_capacity(n);
                let mut fds = Vec::with_capacity(n);
                for q in run {
                    if let Queued::Hold(key, item, fd) = q {
                        held.push((*key, item.clone()));
                        fds.push(fd.as_fd());
                    }
                }
                if k.hold(&held, &fds) {
                    let nodes = held.iter().map(|(key, _)| *key).filter(|key| key & HANDLE_KEY == 0);
                    if let Some(top) = nodes.max() {
                        self.words.raise(H_GIVEN_ID, top);
                    }
                } else {
                    self.not_given();
                }
            } else {
                let keys: Vec<u64> = run
                    .iter()
                    .filter_map(|q| if let Queued::Let(key) = q { Some(*key) } else { None })
                    .collect();
                k.let_go(&keys);
            }
            at += n;
        }
        self.given.store(last, Ordering::Release);
        // The nodes and handles held for the queue may go now (their lets queue anew).
        drop(items);
    }

    /// Flushes until nothing is queued (a flush's own drops may queue lets), a few times at
    /// most; whether the queue is empty (the share may be taken over as it is: a live
    /// update's quiet point, nothing else runs).
    pub fn drain(&self) -> bool {
        for _ in 0..4 {
            if !self.due() {
                return true;
            }
            self.flush();
        }
        !self.due()
    }

    /// Every node up to `id` was given (or needs no hold: the keeper took it over).
    pub fn given_through(&self, id: u64) {
        self.words.raise(H_GIVEN_ID, id);
    }

    /// The node id up to which every node's descriptor was given ([`Self::given_through`],
    /// each flush).
    pub fn given_id(&self) -> u64 {
        self.words.load(H_GIVEN_ID)
    }

    /// Gives the queue if change `seq` ([`Self::queue_hold`]'s) was not given yet.
    pub fn flush_through(&self, seq: u64) {
        if seq > self.given.load(Ordering::Acquire) {
            self.flush();
        }
    }

    /// Lets the descriptors of `keys` go.
    pub fn let_go(&self, keys: &[u64]) {
        if let Some(k) = self.keeper.get() {
            k.let_go(keys);
        }
    }

    /// Takes the predecessor's held descriptors (see [`DescriptorKeeper::adopt`]); `false`:
    /// none is set or it cannot.
    pub fn adopt(&self) -> bool {
        self.keeper.get().is_some_and(|k| k.adopt())
    }

    /// Lets every descriptor go.
    pub fn let_all_go(&self) {
        if let Some(k) = self.keeper.get() {
            k.let_all_go();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_by_another_mapping_and_slots_are_reused() {
        let k = ShareKeep::create(4).unwrap();
        let a = k.alloc().unwrap();
        let b = k.alloc().unwrap();
        k.write(&NodeRecord { slot: a, id: 1, refs: Some(1), parent: 0 });
        k.write(&NodeRecord { slot: b, id: 7, refs: None, parent: 1 });
        let again = ShareKeep::open(k.memfd().try_clone_to_owned().unwrap().into()).unwrap();
        let mut r = again.read();
        r.sort_by_key(|r| r.id);
        assert_eq!(
            r,
            vec![
                NodeRecord { slot: a, id: 1, refs: Some(1), parent: 0 },
                NodeRecord { slot: b, id: 7, refs: None, parent: 1 },
            ]
        );
        // The reopened records keep those slots taken.
        let c = again.alloc().unwrap();
        assert!(c != a && c != b);
        k.gone(b, 7);
        assert_eq!(k.read().len(), 1);
        assert_eq!(k.alloc(), Some(b), "a freed slot is taken again");
    }

    /// A keeper that records what it was given (and refuses holds when told to).
    #[derive(Default)]
    struct Recorder {
        got: Mutex<Vec<String>>,
        refuse: AtomicBool,
    }

    impl DescriptorKeeper for Recorder {
        fn hold(&self, items: &[(u64, HeldItem)], fds: &[BorrowedFd<'_>]) -> bool {
            assert_eq!(items.len(), fds.len());
            let keys: Vec<String> = items.iter().map(|(k, _)| k.to_string()).collect();
            self.got.lock().unwrap().push(format!("hold {}", keys.join(",")));
            !self.refuse.load(Ordering::Relaxed)
        }
        fn let_go(&self, keys: &[u64]) {
            let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            self.got.lock().unwrap().push(format!("let {}", keys.join(",")));
        }
        fn let_all_go(&self) {
            self.got.lock().unwrap().push("let all".into());
        }
    }

    fn item() -> HeldItem {
        HeldItem::Node { key: (1, 2, 3), kind: libc::S_IFREG }
    }

    /// Queued changes reach the keeper only at a flush, in order, a run of holds as one
    /// message; the queue holds each descriptor open until then; a flush through a change
    /// already given sends nothing; a hold refused marks the records incomplete.
    #[test]
    fn queued_descriptors_are_given_in_order_at_the_flush() {
        let k = ShareKeep::create(4).unwrap();
        let rec = Arc::new(Recorder::default());
        assert_eq!(
            k.queue_hold(1, item(), Arc::new(tempfile::tempfile().unwrap())),
            0,
            "no keeper: nothing queued"
        );
        k.set_keeper(rec.clone());
        let file: QueuedFd = Arc::new(tempfile::tempfile().unwrap());
        let weak = Arc::downgrade(&file);
        let a = k.queue_hold(10, item(), file);
        let b = k.queue_hold(11, item(), Arc::new(tempfile::tempfile().unwrap()));
        k.queue_let(7);
        let c = k.queue_hold(12, item(), Arc::new(tempfile::tempfile().unwrap()));
        assert!(a < b && b < c);
        assert!(rec.got.lock().unwrap().is_empty(), "nothing given before the flush");
        assert!(weak.upgrade().is_some(), "the queue holds the descriptor open");
        k.flush_through(b);
        assert_eq!(*rec.got.lock().unwrap(), ["hold 10,11", "let 7", "hold 12"]);
        assert!(weak.upgrade().is_none(), "let go once given");
        k.flush_through(c);
        k.flush();
        assert_eq!(rec.got.lock().unwrap().len(), 3, "nothing more to give");
        assert!(!k.incomplete());
        rec.refuse.store(true, Ordering::Relaxed);
        k.queue_hold(13, item(), Arc::new(tempfile::tempfile().unwrap()));
        k.flush();
        assert!(k.incomplete(), "a descriptor not given marks the records incomplete");
    }

    #[test]
    fn records_of_another_kind_are_refused() {
        let other = SharedWords::new("x", 64).unwrap();
        assert!(ShareKeep::open(other.memfd().try_clone_to_owned().unwrap().into()).is_err());
    }
}
