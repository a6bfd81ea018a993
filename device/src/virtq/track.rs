//! In-flight tracking (issue 24, crash recovery): where each queue stands, kept in memory
//! that outlives the serving process (a memfd its supervisor holds a descriptor of), so that a
//! process started after a crash knows which chains were taken and not returned, and which
//! returns were written but not published.
//!
//! ```text
//! area:   le64 magic | le32 version | le32 queues | (queue record, QUEUE_STRIDE bytes) * queues
//! record: le16 size | le16 0 | le16 pushed | le16 kind | le64 avail | le64 last | le64 slot[size]
//! avail:  the next avail position | the number of the take that moved it << 32
//! slot:   0 (the head is not in flight) or seq << 32 | IN_FLIGHT | the avail position it
//!         was taken at (seq: the take's number, from 1)
//! ```
//!
//! The data path writes it with plain stores, no system call and no lock. Taking head `h` from
//! avail position `a` as take `s` stores `slot[h]` (one 8-byte store), then `avail = (a + 1,
//! s)` (one more). Returning `h` at
//! used position `u` writes the used entry (guest memory), then `pushed = u + 1`, then
//! `slot[h] = 0`. The used index in guest memory is published later, once per round. A
//! process killed anywhere in between leaves a state [`recover_split`] reads back:
//!
//! - used entries in `[used index in guest memory, pushed)` were written and not published:
//!   they are published as they are, and their heads' slots cleared (killed before the clear);
//! - a head whose take number is the one after `avail`'s was being taken (killed before
//!   `avail` moved): it is taken again as any other available chain (positions cannot tell:
//!   a chain may be out while the ring goes round);
//! - every other set slot is a chain taken and not returned: it is executed again, in the order
//!   it was taken (its take number: a chain may stay out for any number of laps of the ring,
//!   a SETLKW for hours).
//!
//! A process killed between writing a used entry and storing `pushed` leaves that head in
//! flight: it runs again and its entry is written again at the same position. The record is
//! the device's word only: the guest's used index and avail ring are read from guest memory
//! and checked against it (a record the guest's memory contradicts is refused).
//!
//! A packed ring's returns overwrite descriptors in place (a used descriptor goes at the used
//! position, which may lie on the slots of a chain still out), so what was taken cannot be
//! read back from the ring: its record keeps, per buffer id in flight, a copy of the chain's
//! descriptors (at most [`PACKED_DESCS`]; a longer chain, which a driver that negotiated
//! indirect descriptors does not make, is taken but not recoverable), the ring slots it took
//! and the avail position it was taken from:
//!
//! ```text
//! packed record: le16 size | le16 0 | le16 0 | le16 1 | le64 avail | le64 last | ... |
//!                (le32 state | le32 at | le32 descs | le32 seq | desc[PACKED_DESCS]) [size]
//! position: slot | wrap << 15
//! last: the used position after the last return | its id << 16 | its take's seq << 32
//! state: 0, or IN_FLIGHT | the ring slots the chain took; seq: the take's number (from 1)
//! ```
//!
//! Taking buffer `id` writes its entry (`seq`, descriptors, `at`, then `state`), then `avail`
//! (the position after it and `seq`). Returning it writes the used descriptor (its flags last),
//! then `last` (one 8-byte store: the new used position, the id and its take's `seq`), then
//! clears `state`. Read back ([`recover_packed`]): an entry whose take number is the one after
//! `avail`'s was being taken (taken again from the ring); one that `last` names, id and `seq`, was returned (killed before the
//! clear); the used descriptor at the used position, if written in this lap for a buffer in
//! flight, was returned just before the process died (the position moves past it); every
//! other set entry is executed again from its copy. Not covered: a used descriptor written
//! just before the kill that the driver has already read and replaced by a new available one
//! (a full ring, in the nanoseconds between the flags and `last`): its buffer runs again.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use thiserror::Error;
use vm_memory::{Bytes, GuestAddress};

use crate::memory::shared::SharedWords;
use crate::memory::GuestMem;
use crate::pci::QueueConfig;

/// The area's first eight bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"vfdpu-if");
/// The area's format version.
pub const VERSION: u32 = 3;
/// Bytes of the area's header.
const HEADER: u64 = 16;
/// The largest split ring.
const MAX_SIZE: u64 = 32768;
/// Bytes of one queue's record: the four fields, then a slot per head of the largest ring
/// (the pages of the slots a smaller ring never uses are never touched, so never allocated).
pub const QUEUE_STRIDE: u64 = PACKED_BASE + PACKED_ENTRY * MAX_SIZE;
/// A set slot's marker bit.
const IN_FLIGHT: u32 = 1 << 16;

/// A split queue's slot for a head taken from avail position `at` as take number `seq`.
fn split_slot(at: u16, seq: u32) -> u64 {
    u64::from(seq) << 32 | u64::from(IN_FLIGHT) | u64::from(at)
}
/// Most descriptors of a packed chain the record copies.
pub const PACKED_DESCS: usize = 4;
/// Bytes of a packed ring's entry per buffer id.
const PACKED_ENTRY: u64 = 16 + 16 * PACKED_DESCS as u64;
/// Where a queue record's packed entries start (after the split slots).
const PACKED_BASE: u64 = SLOTS + 8 * MAX_SIZE;
/// Where a queue record's split slots start (after its header).
const SLOTS: u64 = 24;
/// The record's layout mark (at +6): split or packed.
const KIND_PACKED: u16 = 1;

/// Why a tracking area could not be set up or read back.
#[derive(Debug, Error)]
pub enum TrackError {
    /// The memory file could not be made, sized or mapped.
    #[error("in-flight tracking memory")]
    Io(#[from] std::io::Error),
    /// The memory file could not be mapped.
    #[error("in-flight tracking memory cannot be mapped: {0}")]
    Map(String),
    /// The area is not one this firmware writes, or is too small for its queues.
    #[error("in-flight tracking area: {0}")]
    Format(String),
    /// A queue's record and the guest's rings disagree.
    #[error("queue {queue}: the in-flight record does not fit the ring: {why}")]
    Mismatch {
        /// The queue's index.
        queue: u16,
        /// What disagrees.
        why: String,
    },
    /// The rings are not in mapped memory.
    #[error("queue {0}: its rings are not mapped")]
    Unmapped(u16),
}

impl TrackError {
    /// What a queue `queue` that could not be recovered reports: its rings not mapped yet
    /// (attached again once they are), or a record it refuses (what disagrees is logged here).
    pub fn queue_error(self, queue: u16) -> crate::virtq::QueueError {
        match self {
            TrackError::Unmapped(_) => crate::virtq::QueueError::RingUnmapped(queue),
            e => {
                log::error!("{e}");
                crate::virtq::QueueError::Recovery { queue }
            }
        }
    }
}

/// One function's tracking area: a shared mapping of a memory file, a record per queue.
#[derive(Debug)]
pub struct TrackArea {
    words: SharedWords,
    file: File,
    queues: u32,
}

impl TrackArea {
    /// A new area for `queues` queues in a new memory file.
    pub fn create(queues: u16) -> Result<Arc<TrackArea>, TrackError> {
        let len = HEADER + u64::from(queues) * QUEUE_STRIDE;
        let file = crate::memory::memfd("virtiofs-inflight", len)?;
        let area = TrackArea::map(file, len, u32::from(queues))?;
        area.store64(0, MAGIC);
        area.store32(8, VERSION);
        area.store32(12, u32::from(queues));
        Ok(Arc::new(area))
    }

    /// The area another process wrote, from its memory file: its header checked.
    pub fn open(file: File) -> Result<Arc<TrackArea>, TrackError> {
        let len = file.metadata()?.len();
        if len < HEADER {
            return Err(TrackError::Format(format!("{len} bytes, shorter than its header")));
        }
        let head = TrackArea::map(file.try_clone()?, HEADER, 0)?;
        let (magic, version, queues) = (head.load64(0), head.load32(8), head.load32(12));
        if magic != MAGIC || version != VERSION {
            return Err(TrackError::Format(format!(
                "magic {magic:#x} version {version}, not this firmware's"
            )));
        }
        let want = HEADER + u64::from(queues) * QUEUE_STRIDE;
        if len < want {
            return Err(TrackError::Format(format!("{len} bytes for {queues} queues (needs {want})")));
        }
        Ok(Arc::new(TrackArea::map(file, want, queues)?))
    }

    fn map(file: File, len: u64, queues: u32) -> Result<TrackArea, TrackError> {
        let words = SharedWords::map(&file, len).map_err(TrackError::Map)?;
        Ok(TrackArea { words, file, queues })
    }

    /// The memory file (to hand to the process that keeps it).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The record of queue `index` for a ring of `size` entries, cleared: the queue starts.
    pub fn start_queue(self: &Arc<Self>, index: u16, size: u16) -> Option<QueueTrack> {
        let t = self.queue(index, size)?;
        t.area.store16(t.base, size);
        t.area.store16(t.base + 4, 0);
        t.area.store16(t.base + 6, 0);
        t.set_avail(0, 0);
        for h in 0..size {
            t.area.store64(t.slot(h), 0);
        }
        Some(t)
    }

    /// The record of packed queue `index` for a ring of `size` entries, cleared: the queue
    /// starts, its positions at slot 0 with wrap counters set.
    pub fn start_packed(self: &Arc<Self>, index: u16, size: u16) -> Option<QueueTrack> {
        let t = self.queue(index, size)?;
        t.area.store16(t.base, size);
        t.area.store16(t.base + 6, KIND_PACKED);
        t.set_avail(pos(0, true), 0);
        t.area.store64(t.base + 16, u64::from(pos(0, true)));
        for id in 0..size {
            t.area.store32(t.entry(id), 0);
        }
        Some(t)
    }

    /// The record of queue `index` as it stands, for a ring of `size` entries.
    pub fn queue(self: &Arc<Self>, index: u16, size: u16) -> Option<QueueTrack> {
        if u32::from(index) >= self.queues || u64::from(size) > MAX_SIZE || size == 0 {
            return None;
        }
        let base = HEADER + u64::from(index) * QUEUE_STRIDE;
        Some(QueueTrack { area: self.clone(), base, size })
    }

    #[inline]
    fn store16(&self, at: u64, v: u16) {
        self.words.store16(at, v);
    }

    #[inline]
    fn store32(&self, at: u64, v: u32) {
        self.words.store32(at, v);
    }

    #[inline]
    fn store_bytes(&self, at: u64, b: &[u8]) {
        self.words.store_bytes(at, b);
    }

    fn load_bytes(&self, at: u64, b: &mut [u8]) {
        self.words.load_bytes(at, b);
    }

    fn load16(&self, at: u64) -> u16 {
        self.words.load16(at)
    }

    fn load32(&self, at: u64) -> u32 {
        self.words.load32(at)
    }

    #[inline]
    fn store64(&self, at: u64, v: u64) {
        self.words.store64(at, v);
    }

    fn load64(&self, at: u64) -> u64 {
        self.words.load64(at)
    }

    /// The mapping's length (for checks).
    pub fn len(&self) -> u64 {
        self.words.len()
    }

    /// Whether the area has no queue.
    pub fn is_empty(&self) -> bool {
        self.queues == 0
    }
}

/// One split queue's record in a [`TrackArea`].
#[derive(Debug, Clone)]
pub struct QueueTrack {
    area: Arc<TrackArea>,
    base: u64,
    size: u16,
}

impl QueueTrack {
    #[inline]
    fn slot(&self, head: u16) -> u64 {
        self.base + SLOTS + 8 * u64::from(head)
    }

    /// The next avail position and the number of the last take that moved it (one store).
    #[inline]
    fn set_avail(&self, avail: u16, seq: u32) {
        self.area.store64(self.base + 8, u64::from(avail) | u64::from(seq) << 32);
    }

    /// [`Self::set_avail`]'s pair, as stored.
    fn avail(&self) -> (u16, u32) {
        let v = self.area.load64(self.base + 8);
        (v as u16, (v >> 32) as u32)
    }

    /// Head `head` was taken from avail position `at`, as take number `seq` (never 0).
    #[inline]
    pub fn taken(&self, head: u16, at: u16, seq: u32) {
        self.area.store64(self.slot(head), split_slot(at, seq));
        self.set_avail(at.wrapping_add(1), seq);
    }

    /// Head `head`'s used entry was written; `next_used` is the position after it.
    #[inline]
    pub fn pushed(&self, head: u16, next_used: u16) {
        self.area.store16(self.base + 4, next_used);
        self.area.store64(self.slot(head), 0);
    }

    /// The queue (re)attached at used position `used` and avail position `avail`, its last
    /// take numbered `seq`.
    pub fn positions(&self, used: u16, avail: u16, seq: u32) {
        self.set_avail(avail, seq);
        self.area.store16(self.base + 4, used);
    }

    #[inline]
    fn entry(&self, id: u16) -> u64 {
        self.base + PACKED_BASE + PACKED_ENTRY * u64::from(id)
    }

    /// Packed: buffer `id` was taken from position `at`, its chain `descs` (the raw 16-byte
    /// descriptors, in ring order) taking `slots` ring slots; `avail` is the position after it.
    #[inline]
    pub fn packed_taken(
        &self,
        id: u16,
        seq: u32,
        at: (u16, bool),
        descs: &[[u8; 16]],
        slots: u16,
        avail: (u16, bool),
    ) {
        let e = self.entry(id);
        self.area.store32(e + 12, seq);
        let n = descs.len().min(PACKED_DESCS);
        for (i, d) in descs[..n].iter().enumerate() {
            self.area.store_bytes(e + 16 + 16 * i as u64, d);
        }
        // More than the record copies: in flight, but not to be executed again.
        let count = if descs.len() > PACKED_DESCS { u32::MAX } else { n as u32 };
        self.area.store32(e + 8, count);
        self.area.store32(e + 4, u32::from(pos(at.0, at.1)));
        self.area.store32(e, IN_FLIGHT | u32::from(slots));
        self.set_avail(pos(avail.0, avail.1), seq);
    }

    /// Packed: buffer `id` (taken as take `seq`) had its used descriptor written; `used` is
    /// the position after it.
    #[inline]
    pub fn packed_pushed(&self, id: u16, seq: u32, used: (u16, bool)) {
        let last = u64::from(pos(used.0, used.1)) | u64::from(id) << 16 | u64::from(seq) << 32;
        self.area.store64(self.base + 16, last);
        self.area.store32(self.entry(id), 0);
    }

    /// Packed: the queue (re)attached at these positions (`last` names no take: 0 is never a
    /// take's number).
    pub fn packed_positions(&self, used: (u16, bool), avail: (u16, bool), seq: u32) {
        self.set_avail(pos(avail.0, avail.1), seq);
        self.area.store64(self.base + 16, u64::from(pos(used.0, used.1)));
    }

    /// Whether the record is a packed ring's.
    pub fn is_packed(&self) -> bool {
        self.area.load16(self.base + 6) == KIND_PACKED
    }

    /// The highest take number in the record (new takes count on from it).
    pub fn max_seq(&self) -> u32 {
        let taken = self.avail().1;
        if self.is_packed() {
            (0..self.size).filter_map(|id| self.packed_seq(id)).fold(taken, u32::max)
        } else {
            (0..self.size).map(|h| (self.area.load64(self.slot(h)) >> 32) as u32).fold(taken, u32::max)
        }
    }

    /// Packed: buffer `id`'s take number if it is in flight.
    pub fn packed_seq(&self, id: u16) -> Option<u32> {
        let e = self.entry(id);
        (self.area.load32(e) != 0).then(|| self.area.load32(e + 12))
    }

    /// The ring size the record was started for.
    pub fn size(&self) -> u16 {
        self.area.load16(self.base)
    }
}

/// Where a split queue stands after a crash, read from its record and the guest's rings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitRecovery {
    /// The used index in guest memory when read.
    pub published: u16,
    /// The next used position: the entries up to it were written (publishing them is the
    /// first thing the queue does).
    pub next_used: u16,
    /// The next avail position to take.
    pub next_avail: u16,
    /// The heads taken and not returned, in the order they were taken: to execute again.
    pub in_flight: Vec<u16>,
    /// The highest take number in flight (new takes count on from it).
    pub last_seq: u32,
}

/// Reads back where queue `cfg` stood from its record `track` and the rings in `mem` (see the
/// module's documentation); clears the slots of heads whose return was written and the head
/// being taken, so the record matches what it returns.
pub fn recover_split(
    track: &QueueTrack,
    cfg: &QueueConfig,
    mem: &GuestMem,
) -> Result<SplitRecovery, TrackError> {
    let q = cfg.index;
    let size = cfg.size;
    let bad = |why: String| TrackError::Mismatch { queue: q, why };
    if track.size() != size || track.size != size {
        return Err(bad(format!("recorded for {} entries, the ring has {size}", track.size())));
    }
    let load = |at: u64| -> Result<u16, TrackError> {
        mem.load::<u16>(GuestAddress(at), Ordering::Acquire)
            .map(u16::from_le)
            .map_err(|_| TrackError::Unmapped(q))
    };
    let published = load(cfg.used + 2)?;
    let avail_idx = load(cfg.avail + 2)?;
    let (next_avail, taken_seq) = track.avail();
    let next_used = track.area.load16(track.base + 4);
    let written = next_used.wrapping_sub(published);
    if written > size {
        return Err(bad(format!("{written} returns written past the used index {published}")));
    }
    let outstanding = next_avail.wrapping_sub(next_used);
    if outstanding > size {
        return Err(bad(format!("{outstanding} requests outstanding in a ring of {size}")));
    }
    if avail_idx.wrapping_sub(next_avail) > size {
        return Err(bad(format!("taken up to {next_avail}, the driver made {avail_idx} available")));
    }
    // Returns written and not published: their slots go (killed between `pushed` and the clear).
    for pos in 0..written {
        let slot = u64::from(published.wrapping_add(pos) % size);
        let id: u32 = mem
            .load(GuestAddress(cfg.used + 4 + 8 * slot), Ordering::Acquire)
            .map(u32::from_le)
            .map_err(|_| TrackError::Unmapped(q))?;
        let head =
            u16::try_from(id).ok().filter(|&h| h < size).ok_or_else(|| bad(format!("used entry {id}")))?;
        track.area.store64(track.slot(head), 0);
    }
    let mut in_flight: Vec<(u32, u16)> = Vec::new();
    for head in 0..size {
        let v = track.area.load64(track.slot(head));
        if v == 0 {
            continue;
        }
        let seq = (v >> 32) as u32;
        if v & 0xffff_0000 != u64::from(IN_FLIGHT) || seq == 0 {
            return Err(bad(format!("slot of head {head} reads {v:#x}")));
        }
        // The chain being taken when the process died (its take number past the last that
        // moved `avail`): taken again from the avail ring. A chain may stay out for any number
        // of laps, so positions say nothing here.
        if seq == next_seq(taken_seq) {
            track.area.store64(track.slot(head), 0);
            continue;
        }
        in_flight.push((seq, head));
    }
    if in_flight.len() != usize::from(outstanding) {
        return Err(bad(format!("{} heads in flight, {outstanding} outstanding", in_flight.len())));
    }
    // Oldest first: the order they were taken in (take numbers wrap after 2^32 requests,
    // which only changes the order).
    in_flight.sort_unstable_by_key(|a| a.0);
    // New takes are numbered on from the last one (a slot left by a take past it was cleared).
    let last_seq = taken_seq.max(in_flight.last().map_or(0, |a| a.0));
    Ok(SplitRecovery {
        published,
        next_used,
        next_avail,
        in_flight: in_flight.into_iter().map(|(_, h)| h).collect(),
        last_seq,
    })
}

/// The take number after `seq` (take numbers are never 0).
pub fn next_seq(seq: u32) -> u32 {
    seq.wrapping_add(1).max(1)
}

/// A packed ring position as the record keeps it.
fn pos(slot: u16, wrap: bool) -> u16 {
    slot | u16::from(wrap) << 15
}

fn unpos(p: u16) -> (u16, bool) {
    (p & 0x7fff, p & 0x8000 != 0)
}

/// A packed buffer in flight, read back: its id, the ring slots it took, and its chain's
/// descriptors (`None`: longer than the record copies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedInFlight {
    /// Buffer id.
    pub id: u16,
    /// Its take's number.
    pub seq: u32,
    /// Ring slots its chain took.
    pub slots: u16,
    /// The chain's raw descriptors.
    pub descs: Option<Vec<[u8; 16]>>,
}

/// Where a packed queue stands after a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedRecovery {
    /// The next used position and its wrap counter.
    pub next_used: (u16, bool),
    /// The next avail position and its wrap counter.
    pub next_avail: (u16, bool),
    /// The buffers taken and not returned, oldest first.
    pub in_flight: Vec<PackedInFlight>,
    /// The number of the last take (new takes are numbered on from it).
    pub last_seq: u32,
}

/// Reads back where packed queue `cfg` stood from its record and its ring (see the module's
/// documentation), clearing the entries of buffers returned or being taken.
pub fn recover_packed(
    track: &QueueTrack,
    cfg: &QueueConfig,
    mem: &GuestMem,
) -> Result<PackedRecovery, TrackError> {
    let q = cfg.index;
    let size = cfg.size;
    let bad = |why: String| TrackError::Mismatch { queue: q, why };
    let a = &track.area;
    if track.size() != size || track.size != size || a.load16(track.base + 6) != KIND_PACKED {
        return Err(bad(format!(
            "recorded for {} entries or another layout, the ring has {size}",
            track.size()
        )));
    }
    let (avail_raw, taken_seq) = track.avail();
    let last = a.load64(track.base + 16);
    let (last_pos, last_id, last_seq) = (last as u16, (last >> 16) as u16, (last >> 32) as u32);
    let (avail, mut used) = (unpos(avail_raw), unpos(last_pos));
    if avail.0 >= size || used.0 >= size {
        return Err(bad(format!("positions {avail:?}, {used:?} past the ring")));
    }
    let mut entries: Vec<(u16, u16, u32, u32)> = Vec::new(); // (id, slots, order, seq)
    for id in 0..size {
        let e = track.entry(id);
        let state = a.load32(e);
        if state == 0 {
            continue;
        }
        let (slots, at, seq) = ((state & 0xffff) as u16, a.load32(e + 4), a.load32(e + 12));
        if state & !0x1ffff != 0 || state & IN_FLIGHT == 0 || slots == 0 || slots > size || at > 0xffff {
            return Err(bad(format!("entry of id {id} reads {state:#x}")));
        }
        let at = unpos(at as u16);
        if at.0 >= size {
            return Err(bad(format!("entry of id {id} taken at slot {}", at.0)));
        }
        // Being taken (killed before `avail` moved: its take number is past the last that
        // moved it): taken again from the ring. Returned (killed between `last` and the
        // clear): `last` names this very take.
        if seq == next_seq(taken_seq) || (id == last_id && seq == last_seq) {
            a.store32(e, 0);
            continue;
        }
        // A buffer may stay out for any number of laps: ordered by its take number.
        if seq == 0 {
            return Err(bad(format!("entry of id {id} has no take number")));
        }
        entries.push((id, slots, seq, seq));
    }
    // The used descriptor at the used position, if written in this lap for a buffer in flight:
    // returned just before the process died (killed between its flags and `last`).
    let at = cfg.desc + 16 * u64::from(used.0);
    let load16 = |at: u64| -> Result<u16, TrackError> {
        mem.load::<u16>(GuestAddress(at), Ordering::Acquire)
            .map(u16::from_le)
            .map_err(|_| TrackError::Unmapped(q))
    };
    let (id, flags) = (load16(at + 12)?, load16(at + 14)?);
    if (flags & (1 << 7) != 0) == used.1 && (flags & (1 << 15) != 0) == used.1 {
        if let Some(i) = entries.iter().position(|e| e.0 == id) {
            let (_, slots, _, _) = entries.remove(i);
            a.store32(track.entry(id), 0);
            let next = u32::from(used.0) + u32::from(slots);
            used = if next >= u32::from(size) {
                ((next - u32::from(size)) as u16, !used.1)
            } else {
                (next as u16, used.1)
            };
            track.packed_positions(used, avail, taken_seq);
        }
    }
    // Oldest first.
    entries.sort_unstable_by_key(|e| e.2);
    let out_slots: u32 = entries.iter().map(|e| u32::from(e.1)).sum();
    if out_slots > u32::from(size) {
        return Err(bad(format!("{out_slots} ring slots out in a ring of {size}")));
    }
    let mut in_flight = Vec::with_capacity(entries.len());
    for (id, slots, _, seq) in entries {
        let e = track.entry(id);
        let n = a.load32(e + 8);
        let descs = match n {
            u32::MAX => None,
            n if n == 0 || n as usize > PACKED_DESCS => {
                return Err(bad(format!("entry of id {id} copies {n} descriptors")));
            }
            n => {
                let mut v = vec![[0u8; 16]; n as usize];
                for (i, d) in v.iter_mut().enumerate() {
                    a.load_bytes(e + 16 + 16 * i as u64, d);
                }
                Some(v)
            }
        };
        in_flight.push(PackedInFlight { id, seq, slots, descs });
    }
    let last_seq = in_flight.iter().map(|b| b.seq).fold(taken_seq, u32::max);
    Ok(PackedRecovery { next_used: used, next_avail: avail, in_flight, last_seq })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtq::mock::{guest_memory, Buf, SplitDriver};
    use crate::virtq::{Chain, Ring};

    const SIZE: u16 = 8;

    fn cfg() -> QueueConfig {
        QueueConfig { index: 1, size: SIZE, desc: 0x1000, avail: 0x2000, used: 0x3000, vector: 1 }
    }

    /// A tracked queue, as a serving process starts it.
    fn tracked(area: &Arc<TrackArea>, mem: &GuestMem) -> Ring {
        let mut q = Ring::new(cfg(), 0).unwrap();
        assert!(q.keep_track(area));
        q.attach(mem).unwrap();
        q
    }

    /// The queue a process started after a crash makes of the same record.
    fn recovered(file: &File, mem: &GuestMem) -> Ring {
        let area = TrackArea::open(file.try_clone().unwrap()).unwrap();
        let mut q = Ring::new(cfg(), 0).unwrap();
        assert!(q.recover_from(&area));
        q.attach(mem).unwrap();
        q
    }

    fn take(q: &mut Ring, mem: &GuestMem) -> Option<u16> {
        let mut c = Chain::default();
        q.next(mem, &mut c).unwrap().map(|r| {
            r.unwrap();
            c.head
        })
    }

    fn take_all(q: &mut Ring, mem: &GuestMem) -> Vec<u16> {
        std::iter::from_fn(|| take(q, mem)).collect()
    }

    /// Every point a process can die at: between any two of its steps, the next process
    /// returns each request once, publishes what was written, and takes nothing twice.
    #[test]
    fn a_process_killed_anywhere_leaves_each_request_returned_once() {
        let mem = guest_memory(0x20000, None);
        let area = TrackArea::create(2).unwrap();
        let mut drv = SplitDriver::new(&mem, cfg());
        let mut q = tracked(&area, &mem);
        let heads: Vec<u16> = (0..5).map(|i| drv.push(&[Buf::writable(0x8000 + i * 0x100, 64)])).collect();
        // Taken: 0..4; returned and published: 0; returned, not published: 1; 2, 3 in flight.
        assert_eq!(take(&mut q, &mem), Some(heads[0]));
        assert_eq!(take(&mut q, &mem), Some(heads[1]));
        q.push_used(&mem, heads[0], 10).unwrap();
        q.publish_used(&mem).unwrap();
        assert_eq!(take(&mut q, &mem), Some(heads[2]));
        assert_eq!(take(&mut q, &mem), Some(heads[3]));
        q.push_used(&mem, heads[1], 11).unwrap();
        // Killed here (head 4 available, never taken).
        drop(q);
        assert_eq!(drv.next_used(), Some((heads[0], 10)));
        assert_eq!(drv.next_used(), None);
        let mut q = recovered(area.file(), &mem);
        assert_eq!(drv.next_used(), Some((heads[1], 11)), "the written return is published");
        assert!(q.needs_interrupt(&mem), "and signalled by the next round");
        // In flight first, in the order taken, then what was never taken.
        assert_eq!(take_all(&mut q, &mem), vec![heads[2], heads[3], heads[4]]);
        for h in [heads[3], heads[2], heads[4]] {
            q.push_used(&mem, h, 1).unwrap();
        }
        q.publish_used(&mem).unwrap();
        let got: Vec<u16> = std::iter::from_fn(|| drv.next_used().map(|u| u.0)).collect();
        assert_eq!(got, vec![heads[3], heads[2], heads[4]]);
        // A second crash right away: nothing is in flight, nothing is returned twice.
        drop(q);
        let mut q = recovered(area.file(), &mem);
        assert_eq!(take_all(&mut q, &mem), Vec::<u16>::new());
        assert_eq!(drv.next_used(), None);
    }

    /// Killed between writing the slot of a head taken and moving `avail`; between `pushed`
    /// and clearing the slot; between writing a used entry and `pushed`.
    #[test]
    fn each_torn_step_is_read_back() {
        let mem = guest_memory(0x20000, None);
        let area = TrackArea::create(2).unwrap();
        let mut drv = SplitDriver::new(&mem, cfg());
        let q = tracked(&area, &mem);
        drop(q);
        let t = area.queue(1, SIZE).unwrap();
        let a = drv.push(&[Buf::writable(0x8000, 64)]);
        // Taking `a` at position 0, killed before `avail` moved.
        area.store64(t.slot(a), split_slot(0, 1));
        let mut q = recovered(area.file(), &mem);
        assert_eq!(take_all(&mut q, &mem), vec![a], "taken once, as a new chain");
        // Returning `a` at used position 0: `pushed` stored, killed before the slot's clear.
        q.push_used(&mem, a, 5).unwrap();
        area.store64(t.slot(a), split_slot(0, 1));
        drop(q);
        let mut q = recovered(area.file(), &mem);
        assert_eq!(drv.next_used(), Some((a, 5)));
        assert_eq!(take_all(&mut q, &mem), Vec::<u16>::new(), "returned, not taken again");
        // Returning `b`: its used entry written, killed before `pushed`.
        let b = drv.push(&[Buf::writable(0x8100, 64)]);
        assert_eq!(take(&mut q, &mem), Some(b));
        drop(q);
        let slot = u64::from(1 % SIZE);
        mem.write_obj([u32::from(b).to_le(), 9u32.to_le()], GuestAddress(0x3000 + 4 + 8 * slot)).unwrap();
        let mut q = recovered(area.file(), &mem);
        assert_eq!(drv.next_used(), None, "not published: the entry was not counted");
        assert_eq!(take_all(&mut q, &mem), vec![b], "executed again");
        q.push_used(&mem, b, 3).unwrap();
        q.publish_used(&mem).unwrap();
        assert_eq!(drv.next_used(), Some((b, 3)));
    }

    /// A record the guest's rings contradict is refused, never trusted: returns written past
    /// what a ring holds, a slot of another format, more heads in flight than outstanding.
    #[test]
    fn a_record_the_rings_contradict_is_refused() {
        let mem = guest_memory(0x20000, None);
        let area = TrackArea::create(2).unwrap();
        let _drv = SplitDriver::new(&mem, cfg());
        drop(tracked(&area, &mem));
        let t = area.queue(1, SIZE).unwrap();
        let refused = |area: &Arc<TrackArea>| {
            let mut q = Ring::new(cfg(), 0).unwrap();
            q.recover_from(area);
            matches!(q.attach(&mem), Err(crate::virtq::QueueError::Recovery { .. }))
        };
        t.positions(SIZE + 1, SIZE + 1, 0);
        assert!(refused(&area), "returns written past the ring");
        t.positions(0, 0, 0);
        area.store64(t.slot(3), 0xdead_beef);
        assert!(refused(&area), "a slot of another format");
        area.store64(t.slot(3), split_slot(0xffff, 0));
        assert!(refused(&area), "no take number");
        area.store64(t.slot(3), split_slot(0xfff0, 7));
        assert!(refused(&area), "in flight, nothing outstanding");
        area.store64(t.slot(3), 0);
        area.store16(t.base, 4);
        assert!(refused(&area), "another ring size");
        area.store16(t.base, SIZE);
        assert!(!refused(&area));
        // Not an area of this firmware's.
        let file = crate::memory::memfd("t", 4096).unwrap();
        assert!(matches!(TrackArea::open(file), Err(TrackError::Format(_))));
        assert!(area.queue(2, SIZE).is_none(), "past the area's queues");
    }

    fn packed(area: &Arc<TrackArea>, mem: &GuestMem) -> Ring {
        let mut q = Ring::new(cfg(), crate::pci::features::RING_PACKED).unwrap();
        assert!(q.keep_track(area));
        q.attach(mem).unwrap();
        q
    }

    fn packed_recovered(file: &File, mem: &GuestMem) -> Ring {
        let area = TrackArea::open(file.try_clone().unwrap()).unwrap();
        let mut q = Ring::new(cfg(), crate::pci::features::RING_PACKED).unwrap();
        assert!(q.recover_from(&area));
        q.attach(mem).unwrap();
        q
    }

    /// Takes the next request, with its buffers' lengths (readable, writable).
    fn take_lens(q: &mut Ring, mem: &GuestMem) -> Option<(u16, Vec<usize>, Vec<usize>)> {
        let mut c = Chain::default();
        q.next(mem, &mut c).unwrap().map(|r| {
            r.unwrap();
            (
                c.head,
                c.readable.iter().map(|s| s.len()).collect(),
                c.writable.iter().map(|s| s.len()).collect(),
            )
        })
    }

    /// A packed ring's chain whose descriptors a return overwrote is executed again from the
    /// record's copy, with the same buffers; each buffer is returned once; a second crash at
    /// once finds nothing in flight.
    #[test]
    fn a_packed_chain_overwritten_by_a_return_runs_again_from_its_copy() {
        use crate::virtq::mock::PackedDriver;
        let mem = guest_memory(0x20000, None);
        let area = TrackArea::create(2).unwrap();
        let mut drv = PackedDriver::new(&mem, cfg());
        let mut q = packed(&area, &mem);
        drv.push(&[Buf::readable(0x8000, 40), Buf::writable(0x9000, 64)], 5);
        drv.push(&[Buf::readable(0x8100, 48)], 6);
        drv.push(&[Buf::readable(0x8200, 16), Buf::writable(0x9200, 32)], 7);
        let all: Vec<u16> = std::iter::from_fn(|| take_lens(&mut q, &mem).map(|t| t.0)).collect();
        assert_eq!(all, vec![5, 6, 7]);
        // 6 returns first: its used descriptor goes over 5's first descriptor (slot 0).
        q.push_used(&mem, 6, 3).unwrap();
        drop(q);
        assert_eq!(drv.next_used(), Some((6, 3)));
        let mut q = packed_recovered(area.file(), &mem);
        assert_eq!(take_lens(&mut q, &mem), Some((5, vec![40], vec![64])), "5 from its copy");
        assert_eq!(take_lens(&mut q, &mem), Some((7, vec![16], vec![32])));
        assert_eq!(take_lens(&mut q, &mem), None);
        q.push_used(&mem, 7, 1).unwrap();
        q.push_used(&mem, 5, 2).unwrap();
        assert_eq!(drv.next_used(), Some((7, 1)));
        assert_eq!(drv.next_used(), Some((5, 2)));
        // New requests go on past the ring's end.
        for i in 0..20u16 {
            let id = i % 4;
            drv.push(&[Buf::writable(0xa000, 8)], id);
            assert_eq!(take_lens(&mut q, &mem).map(|t| t.0), Some(id));
            q.push_used(&mem, id, 0).unwrap();
            assert_eq!(drv.next_used(), Some((id, 0)));
        }
        drop(q);
        let mut q = packed_recovered(area.file(), &mem);
        assert_eq!(take_lens(&mut q, &mem), None, "nothing in flight");
        assert_eq!(drv.next_used(), None);
    }

    /// Killed between a packed take's entry and `avail`; between `last` and the entry's clear;
    /// between a used descriptor's flags and `last`: each read back once, never twice.
    #[test]
    fn each_torn_packed_step_is_read_back() {
        use crate::virtq::mock::PackedDriver;
        let mem = guest_memory(0x20000, None);
        let area = TrackArea::create(2).unwrap();
        let mut drv = PackedDriver::new(&mem, cfg());
        let t = area.queue(1, SIZE).unwrap();
        let mut q = packed(&area, &mem);
        // Being taken: the entry is written, `avail` not moved.
        drv.push(&[Buf::writable(0x9000, 64)], 3);
        assert_eq!(take_lens(&mut q, &mem).map(|x| x.0), Some(3));
        drop(q);
        t.set_avail(pos(0, true), 0);
        let mut q = packed_recovered(area.file(), &mem);
        assert_eq!(take_lens(&mut q, &mem).map(|x| x.0), Some(3), "taken again from the ring");
        assert_eq!(take_lens(&mut q, &mem), None, "once");
        // Returned, `last` stored, the entry not cleared yet.
        let before = area.load32(t.entry(3));
        q.push_used(&mem, 3, 9).unwrap();
        area.store32(t.entry(3), before);
        drop(q);
        let mut q = packed_recovered(area.file(), &mem);
        assert_eq!(drv.next_used(), Some((3, 9)));
        assert_eq!(take_lens(&mut q, &mem), None, "returned: not run again");
        // The used descriptor written, `last` not: its position is found from the ring.
        drv.push(&[Buf::writable(0x9100, 64)], 4);
        assert_eq!(take_lens(&mut q, &mem).map(|x| x.0), Some(4));
        let (last, entry) = (area.load64(t.base + 16), area.load32(t.entry(4)));
        q.push_used(&mem, 4, 7).unwrap();
        area.store64(t.base + 16, last);
        area.store32(t.entry(4), entry);
        drop(q);
        let mut q = packed_recovered(area.file(), &mem);
        assert_eq!(drv.next_used(), Some((4, 7)));
        assert_eq!(take_lens(&mut q, &mem), None, "returned: not run again");
        drv.push(&[Buf::writable(0x9200, 8)], 1);
        assert_eq!(take_lens(&mut q, &mem).map(|x| x.0), Some(1));
        q.push_used(&mem, 1, 0).unwrap();
        assert_eq!(drv.next_used(), Some((1, 0)), "the used position moved past 4's return");
    }

    /// A packed chain longer than the record copies is not executed again: it comes back as a
    /// malformed chain (returned unserved), never left out.
    #[test]
    fn a_long_packed_chain_comes_back_unserved() {
        use crate::virtq::mock::PackedDriver;
        let mem = guest_memory(0x20000, None);
        let area = TrackArea::create(2).unwrap();
        let mut drv = PackedDriver::new(&mem, cfg());
        let mut q = packed(&area, &mem);
        let bufs: Vec<Buf> = (0..6u64).map(|i| Buf::writable(0x9000 + i * 0x100, 16)).collect();
        drv.push(&bufs, 2);
        assert_eq!(take_lens(&mut q, &mem).map(|x| x.2.len()), Some(6));
        drop(q);
        let mut q = packed_recovered(area.file(), &mem);
        let mut c = Chain::default();
        let r = q.next(&mem, &mut c).unwrap().expect("the buffer in flight");
        assert!(r.is_err() && c.head == 2, "{r:?}");
        q.push_used(&mem, 2, 0).unwrap();
        assert_eq!(drv.next_used(), Some((2, 0)));
    }

    /// A chain out while the ring goes round many times (a SETLKW waiting while other
    /// requests pass) is recovered, on both layouts.
    #[test]
    fn a_chain_out_for_many_laps_is_recovered() {
        use crate::virtq::mock::PackedDriver;
        let mem = guest_memory(0x20000, None);
        let area = TrackArea::create(2).unwrap();
        // Split.
        let mut drv = SplitDriver::new(&mem, cfg());
        let mut q = tracked(&area, &mem);
        let waiting = drv.push(&[Buf::writable(0x8000, 64)]);
        assert_eq!(take(&mut q, &mem), Some(waiting));
        for i in 0..1000u16 {
            // Heads other than the waiting one (the mock would reuse it).
            let h = (waiting + 1 + i % (SIZE - 1)) % SIZE;
            drv.write_desc(0x1000, h, 0x8100, 64, crate::virtq::desc::DESC_F_WRITE, 0);
            drv.make_available(h);
            assert_eq!(take(&mut q, &mem), Some(h));
            q.push_used(&mem, h, 1).unwrap();
            q.publish_used(&mem).unwrap();
            assert_eq!(drv.next_used(), Some((h, 1)));
        }
        drop(q);
        let mut q = recovered(area.file(), &mem);
        assert_eq!(take_all(&mut q, &mem), vec![waiting], "split: the chain out for 1000 requests");
        // Packed.
        let mut drv = PackedDriver::new(&mem, cfg());
        let mut q = packed(&area, &mem);
        drv.push(&[Buf::writable(0x8000, 64)], 0);
        assert_eq!(take_lens(&mut q, &mem).map(|t| t.0), Some(0));
        for i in 0..1000u16 {
            let id = 1 + i % 7;
            drv.push(&[Buf::writable(0x8100, 64)], id);
            assert_eq!(take_lens(&mut q, &mem).map(|t| t.0), Some(id));
            q.push_used(&mem, id, 1).unwrap();
            assert_eq!(drv.next_used(), Some((id, 1)));
        }
        drop(q);
        let mut q = packed_recovered(area.file(), &mem);
        assert_eq!(take_lens(&mut q, &mem), Some((0, vec![], vec![64])), "packed: out for 1000 requests");
        assert_eq!(take_lens(&mut q, &mem), None);
    }

    /// `Ring::next` marks the chains in flight at a crash, taken again from the record, as
    /// replayed, on both layouts, and clears the mark for every chain after them (the poller
    /// reuses one `Chain`); a process that did not crash marks none.
    #[test]
    fn chains_taken_again_are_marked_replayed_and_no_other() {
        use crate::virtq::mock::PackedDriver;
        let mem = guest_memory(0x20000, None);
        let area = TrackArea::create(2).unwrap();
        // One chain reused for every take, as the poller does.
        let mut c = Chain::default();
        let mut next = |q: &mut Ring| q.next(&mem, &mut c).unwrap().map(|r| r.map(|()| (c.head, c.replayed)));
        // Split: two chains in flight at the crash, one available and never taken.
        let mut drv = SplitDriver::new(&mem, cfg());
        let mut q = tracked(&area, &mem);
        let heads: Vec<u16> = (0..3).map(|i| drv.push(&[Buf::writable(0x8000 + i * 0x100, 64)])).collect();
        assert_eq!(next(&mut q), Some(Ok((heads[0], false))), "a first take");
        assert_eq!(next(&mut q), Some(Ok((heads[1], false))));
        drop(q);
        let mut q = recovered(area.file(), &mem);
        assert_eq!(next(&mut q), Some(Ok((heads[0], true))), "split: in flight at the crash");
        assert_eq!(next(&mut q), Some(Ok((heads[1], true))));
        assert_eq!(next(&mut q), Some(Ok((heads[2], false))), "split: never taken before");
        assert_eq!(next(&mut q), None);
        for h in &heads {
            q.push_used(&mem, *h, 1).unwrap();
        }
        q.publish_used(&mem).unwrap();
        let h = drv.push(&[Buf::writable(0x8400, 64)]);
        assert_eq!(next(&mut q), Some(Ok((h, false))), "split: a new chain after the recovery");
        // Packed: one buffer in flight at the crash, one available and never taken.
        let area = TrackArea::create(2).unwrap();
        let mem2 = guest_memory(0x20000, None);
        let mut c = Chain::default();
        let mut next =
            |q: &mut Ring| q.next(&mem2, &mut c).unwrap().map(|r| r.map(|()| (c.head, c.replayed)));
        let mut drv = PackedDriver::new(&mem2, cfg());
        let mut q = packed(&area, &mem2);
        drv.push(&[Buf::writable(0x8000, 64)], 5);
        assert_eq!(next(&mut q), Some(Ok((5, false))), "a first take");
        drv.push(&[Buf::writable(0x8100, 64)], 6);
        drop(q);
        let mut q = packed_recovered(area.file(), &mem2);
        assert_eq!(next(&mut q), Some(Ok((5, true))), "packed: in flight at the crash, from its copy");
        assert_eq!(next(&mut q), Some(Ok((6, false))), "packed: never taken before");
        assert_eq!(next(&mut q), None);
        q.push_used(&mem2, 5, 1).unwrap();
        q.push_used(&mem2, 6, 1).unwrap();
        drv.push(&[Buf::writable(0x8200, 64)], 1);
        assert_eq!(next(&mut q), Some(Ok((1, false))), "packed: a new chain after the recovery");
    }

    /// A chain out while the avail position comes back to where it was taken (two laps of a
    /// packed ring; 65,536 takes of a split one) is still in flight, not "being taken".
    #[test]
    fn a_chain_taken_where_avail_stands_again_is_still_in_flight() {
        use crate::virtq::mock::PackedDriver;
        let mem = guest_memory(0x20000, None);
        let area = TrackArea::create(2).unwrap();
        // Packed: 2 * SIZE - 1 one-slot buffers after buffer 0 brings `avail` back to slot 0
        // with the same wrap counter.
        let mut drv = PackedDriver::new(&mem, cfg());
        let mut q = packed(&area, &mem);
        drv.push(&[Buf::writable(0x8000, 64)], 0);
        assert_eq!(take_lens(&mut q, &mem).map(|t| t.0), Some(0));
        for i in 0..(2 * SIZE - 1) {
            let id = 1 + i % (SIZE - 1);
            drv.push(&[Buf::writable(0x8100, 64)], id);
            assert_eq!(take_lens(&mut q, &mem).map(|t| t.0), Some(id));
            q.push_used(&mem, id, 1).unwrap();
            assert_eq!(drv.next_used(), Some((id, 1)));
        }
        drop(q);
        let mut q = packed_recovered(area.file(), &mem);
        assert_eq!(take_lens(&mut q, &mem), Some((0, vec![], vec![64])), "packed: two laps");
        assert_eq!(take_lens(&mut q, &mem), None);
        // Split: 65,535 takes after the waiting one bring `avail` back to its position.
        let mut drv = SplitDriver::new(&mem, cfg());
        let mut q = tracked(&area, &mem);
        let waiting = drv.push(&[Buf::writable(0x8000, 64)]);
        assert_eq!(take(&mut q, &mem), Some(waiting));
        for i in 0..u32::from(u16::MAX) {
            let h = (waiting + 1 + (i % u32::from(SIZE - 1)) as u16) % SIZE;
            drv.write_desc(0x1000, h, 0x8100, 64, crate::virtq::desc::DESC_F_WRITE, 0);
            drv.make_available(h);
            assert_eq!(take(&mut q, &mem), Some(h));
            q.push_used(&mem, h, 1).unwrap();
            q.publish_used(&mem).unwrap();
            assert_eq!(drv.next_used(), Some((h, 1)));
        }
        drop(q);
        let mut q = recovered(area.file(), &mem);
        assert_eq!(take_all(&mut q, &mem), vec![waiting], "split: 65,536 takes later");
    }
}
