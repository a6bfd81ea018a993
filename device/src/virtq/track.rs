//! In-flight tracking (issue 24, crash recovery): where each split queue stands, kept in memory
//! that outlives the serving process (a memfd its supervisor holds a descriptor of), so that a
//! process started after a crash knows which chains were taken and not returned, and which
//! returns were written but not published.
//!
//! ```text
//! area:   le64 magic | le32 version | le32 queues | (queue record, QUEUE_STRIDE bytes) * queues
//! record: le16 size | le16 avail | le16 pushed | le16 0 | le32 slot[size]
//! slot:   0 (the head is not in flight) or IN_FLIGHT | the avail position it was taken at
//! ```
//!
//! The data path writes it with plain stores, no system call and no lock. Taking head `h` from
//! avail position `a` stores `slot[h] = IN_FLIGHT | a`, then `avail = a + 1`. Returning `h` at
//! used position `u` writes the used entry (guest memory), then `pushed = u + 1`, then
//! `slot[h] = 0`. The used index in guest memory is published later, once per round. A
//! process killed anywhere in between leaves a state [`recover_split`] reads back:
//!
//! - used entries in `[used index in guest memory, pushed)` were written and not published:
//!   they are published as they are, and their heads' slots cleared (killed before the clear);
//! - a head whose slot is set at the avail position `avail` itself was being taken (killed
//!   before `avail` moved): it is taken again as any other available chain;
//! - every other set slot is a chain taken and not returned: it is executed again, in the order
//!   it was taken.
//!
//! A process killed between writing a used entry and storing `pushed` leaves that head in
//! flight: it runs again and its entry is written again at the same position. The record is
//! the device's word only: the guest's used index and avail ring are read from guest memory
//! and checked against it (a record the guest's memory contradicts is refused).
//!
//! Packed rings are not tracked (their returns overwrite the avail descriptors in place, so
//! what was taken cannot be read back from the ring): a function with a packed ring is not
//! recovered.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use thiserror::Error;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryRegion, GuestRegionMmap, MemoryRegionAddress};

use crate::memory::GuestMem;
use crate::pci::QueueConfig;

/// The area's first eight bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"vfdpu-if");
/// The area's format version.
pub const VERSION: u32 = 1;
/// Bytes of the area's header.
const HEADER: u64 = 16;
/// The largest split ring.
const MAX_SIZE: u64 = 32768;
/// Bytes of one queue's record: the four fields, then a slot per head of the largest ring
/// (the pages of the slots a smaller ring never uses are never touched, so never allocated).
pub const QUEUE_STRIDE: u64 = 8 + 4 * MAX_SIZE;
/// A set slot's marker bit.
const IN_FLIGHT: u32 = 1 << 16;

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

/// One function's tracking area: a shared mapping of a memory file, a record per queue.
#[derive(Debug)]
pub struct TrackArea {
    region: GuestRegionMmap<()>,
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
        let size = usize::try_from(len).map_err(|_| TrackError::Format("too large".into()))?;
        let region =
            GuestRegionMmap::from_range(GuestAddress(0), size, Some(FileOffset::new(file.try_clone()?, 0)))
                .map_err(|e| TrackError::Map(e.to_string()))?;
        Ok(TrackArea { region, file, queues })
    }

    /// The memory file (to hand to the process that keeps it).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The record of queue `index` for a ring of `size` entries, cleared: the queue starts.
    pub fn start_queue(self: &Arc<Self>, index: u16, size: u16) -> Option<QueueTrack> {
        let t = self.queue(index, size)?;
        t.area.store16(t.base, size);
        t.area.store16(t.base + 2, 0);
        t.area.store16(t.base + 4, 0);
        for h in 0..size {
            t.area.store32(t.slot(h), 0);
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
        let _ = self.region.store(v.to_le(), MemoryRegionAddress(at), Ordering::Release);
    }

    #[inline]
    fn store32(&self, at: u64, v: u32) {
        let _ = self.region.store(v.to_le(), MemoryRegionAddress(at), Ordering::Release);
    }

    fn store64(&self, at: u64, v: u64) {
        let _ = self.region.write_obj(v.to_le(), MemoryRegionAddress(at));
    }

    fn load16(&self, at: u64) -> u16 {
        u16::from_le(self.region.load(MemoryRegionAddress(at), Ordering::Acquire).unwrap_or(0))
    }

    fn load32(&self, at: u64) -> u32 {
        u32::from_le(self.region.load(MemoryRegionAddress(at), Ordering::Acquire).unwrap_or(0))
    }

    fn load64(&self, at: u64) -> u64 {
        u64::from_le(self.region.read_obj(MemoryRegionAddress(at)).unwrap_or(0))
    }

    /// The mapping's length (for checks).
    pub fn len(&self) -> u64 {
        self.region.len()
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
        self.base + 8 + 4 * u64::from(head)
    }

    /// Head `head` was taken from avail position `at`.
    #[inline]
    pub fn taken(&self, head: u16, at: u16) {
        self.area.store32(self.slot(head), IN_FLIGHT | u32::from(at));
        self.area.store16(self.base + 2, at.wrapping_add(1));
    }

    /// Head `head`'s used entry was written; `next_used` is the position after it.
    #[inline]
    pub fn pushed(&self, head: u16, next_used: u16) {
        self.area.store16(self.base + 4, next_used);
        self.area.store32(self.slot(head), 0);
    }

    /// The queue (re)attached at used position `used` and avail position `avail`.
    pub fn positions(&self, used: u16, avail: u16) {
        self.area.store16(self.base + 2, avail);
        self.area.store16(self.base + 4, used);
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
    let next_avail = track.area.load16(track.base + 2);
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
        track.area.store32(track.slot(head), 0);
    }
    // The chain being taken when the process died: taken again from the avail ring.
    if avail_idx != next_avail {
        let at = u64::from(next_avail % size);
        let head = load(cfg.avail + 4 + 2 * at)?;
        if head < size && track.area.load32(track.slot(head)) == IN_FLIGHT | u32::from(next_avail) {
            track.area.store32(track.slot(head), 0);
        }
    }
    let mut in_flight: Vec<(u16, u16)> = Vec::new();
    for head in 0..size {
        let v = track.area.load32(track.slot(head));
        if v == 0 {
            continue;
        }
        let at = (v & 0xffff) as u16;
        // Taken before `next_avail`, and no earlier than the oldest outstanding position.
        let age = next_avail.wrapping_sub(at);
        if v & !0x1ffff != 0 || v & IN_FLIGHT == 0 || age == 0 || age > size {
            return Err(bad(format!("slot of head {head} reads {v:#x}")));
        }
        in_flight.push((age, head));
    }
    if in_flight.len() != usize::from(outstanding) {
        return Err(bad(format!("{} heads in flight, {outstanding} outstanding", in_flight.len())));
    }
    // Oldest first: the order they were taken in.
    in_flight.sort_unstable_by_key(|a| std::cmp::Reverse(a.0));
    Ok(SplitRecovery {
        published,
        next_used,
        next_avail,
        in_flight: in_flight.into_iter().map(|(_, h)| h).collect(),
    })
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
        assert!(q.keep_track(area.start_queue(1, SIZE).unwrap()));
        q.attach(mem).unwrap();
        q
    }

    /// The queue a process started after a crash makes of the same record.
    fn recovered(file: &File, mem: &GuestMem) -> Ring {
        let area = TrackArea::open(file.try_clone().unwrap()).unwrap();
        let mut q = Ring::new(cfg(), 0).unwrap();
        assert!(q.recover_from(area.queue(1, SIZE).unwrap()));
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
        area.store32(t.slot(a), IN_FLIGHT);
        let mut q = recovered(area.file(), &mem);
        assert_eq!(take_all(&mut q, &mem), vec![a], "taken once, as a new chain");
        // Returning `a` at used position 0: `pushed` stored, killed before the slot's clear.
        q.push_used(&mem, a, 5).unwrap();
        area.store32(t.slot(a), IN_FLIGHT);
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
        let drv = SplitDriver::new(&mem, cfg());
        drop(tracked(&area, &mem));
        let t = area.queue(1, SIZE).unwrap();
        let refused = |area: &Arc<TrackArea>| {
            let mut q = Ring::new(cfg(), 0).unwrap();
            q.recover_from(area.queue(1, SIZE).unwrap());
            matches!(q.attach(&mem), Err(crate::virtq::QueueError::Recovery { .. }))
        };
        t.positions(SIZE + 1, SIZE + 1);
        assert!(refused(&area), "returns written past the ring");
        t.positions(0, 0);
        area.store32(t.slot(3), 0xdead_beef);
        assert!(refused(&area), "a slot of another format");
        area.store32(t.slot(3), IN_FLIGHT | 0xffff);
        assert!(refused(&area), "in flight, nothing outstanding");
        area.store32(t.slot(3), 0);
        area.store16(t.base, 4);
        assert!(refused(&area), "another ring size");
        area.store16(t.base, SIZE);
        assert!(!refused(&area));
        drop(drv);
        // Not an area of this firmware's.
        let file = crate::memory::memfd("t", 4096).unwrap();
        assert!(matches!(TrackArea::open(file), Err(TrackError::Format(_))));
        assert!(area.queue(2, SIZE).is_none(), "past the area's queues");
    }
}
