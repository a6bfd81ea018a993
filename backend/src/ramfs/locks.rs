//! POSIX record locks of one file (`fcntl(F_GETLK/F_SETLK)`): byte ranges held by lock owners,
//! split and merged like `posix_lock_inode` does, so one owner's locks never overlap and adjacent
//! ranges of the same type are one.
//!
//! Nothing here waits: a conflicting request fails with [`Error::WouldBlock`]. SETLKW needs the
//! device to park a request and answer it later, which `Server::handle` cannot do yet; that is why
//! the server does not offer `FUSE_POSIX_LOCKS` (the guest kernel then keeps POSIX locks itself).

use crate::filesystem::{Error, FileLock, LockType, Result};

/// Most lock records one file may hold (a guest choosing ranges cannot make us allocate more).
pub(super) const MAX_LOCKS: usize = 4096;
/// Most lock records the whole filesystem may hold.
pub(super) const MAX_LOCKS_TOTAL: u64 = 1 << 20;
/// Records one [`LockTable::set`] may add at most (a range split in two, plus the new one).
pub(super) const MAX_GROWTH: u64 = 2;

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
}

/// The locks held on one file.
#[derive(Debug, Default)]
pub(super) struct LockTable {
    held: Vec<Held>,
}

impl LockTable {
    /// The first lock of another owner that conflicts with `lock` (overlapping, and one of the
    /// two exclusive).
    pub(super) fn conflict(&self, owner: u64, lock: &FileLock) -> Option<FileLock> {
        let write = lock.typ == LockType::Write;
        self.held
            .iter()
            .find(|h| h.owner != owner && h.overlaps(lock.start, lock.end) && (write || h.write))
            .map(|h| FileLock {
                start: h.start,
                end: h.end,
                typ: if h.write { LockType::Write } else { LockType::Read },
                pid: h.pid,
            })
    }

    /// Sets (or, with [`LockType::Unlock`], clears) `lock.start..=lock.end` for `owner`, replacing
    /// whatever the owner held there. All or nothing.
    pub(super) fn set(&mut self, owner: u64, lock: &FileLock) -> Result<()> {
        let (mut start, mut end) = (lock.start, lock.end);
        let write = match lock.typ {
            LockType::Unlock => None,
            LockType::Read => Some(false),
            LockType::Write => Some(true),
        };
        if write.is_some() && self.conflict(owner, lock).is_some() {
            return Err(Error::WouldBlock);
        }
        // Grow the new range over the owner's same-type locks it touches (they are disjoint, so
        // the growth only covers bytes already held that way); those merge into it.
        if let Some(w) = write {
            loop {
                let grown = self
                    .held
                    .iter()
                    .filter(|h| h.owner == owner && h.write == w && h.touches(start, end))
                    .fold((start, end), |(s, e), h| (s.min(h.start), e.max(h.end)));
                if grown == (start, end) {
                    break;
                }
                (start, end) = grown;
            }
        }
        let mut next = Vec::with_capacity(self.held.len() + 2);
        for h in &self.held {
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
        if next.len() > MAX_LOCKS {
            return Err(Error::NoLocks);
        }
        self.held = next;
        Ok(())
    }

    /// Number of lock records.
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }

    /// Drops every lock of `owner` (its process closed a descriptor of the file).
    pub(super) fn release_owner(&mut self, owner: u64) {
        self.held.retain(|h| h.owner != owner);
    }

    /// Drops every lock.
    pub(super) fn clear(&mut self) {
        self.held = Vec::new();
    }

    #[cfg(test)]
    fn ranges(&self, owner: u64) -> Vec<(u64, u64, bool)> {
        let mut v: Vec<_> =
            self.held.iter().filter(|h| h.owner == owner).map(|h| (h.start, h.end, h.write)).collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lk(typ: LockType, start: u64, end: u64) -> FileLock {
        FileLock { start, end, typ, pid: 7 }
    }

    #[test]
    fn split_and_merge() {
        let mut t = LockTable::default();
        t.set(1, &lk(LockType::Write, 0, 99)).unwrap();
        // Unlocking the middle splits.
        t.set(1, &lk(LockType::Unlock, 40, 59)).unwrap();
        assert_eq!(t.ranges(1), [(0, 39, true), (60, 99, true)]);
        // A read lock over the gap and into both neighbours converts those bytes.
        t.set(1, &lk(LockType::Read, 30, 69)).unwrap();
        assert_eq!(t.ranges(1), [(0, 29, true), (30, 69, false), (70, 99, true)]);
        // Write over the read range: everything merges into one write lock.
        t.set(1, &lk(LockType::Write, 30, 69)).unwrap();
        assert_eq!(t.ranges(1), [(0, 99, true)]);
        // Adjacent same-type ranges merge; to-EOF ranges do not overflow.
        t.set(1, &lk(LockType::Write, 100, u64::MAX)).unwrap();
        assert_eq!(t.ranges(1), [(0, u64::MAX, true)]);
        t.set(1, &lk(LockType::Unlock, 0, u64::MAX)).unwrap();
        assert!(t.ranges(1).is_empty());
    }

    #[test]
    fn conflicts_between_owners() {
        let mut t = LockTable::default();
        t.set(1, &lk(LockType::Read, 0, 9)).unwrap();
        t.set(2, &lk(LockType::Read, 5, 14)).unwrap();
        assert_eq!(t.set(3, &lk(LockType::Write, 9, 9)), Err(Error::WouldBlock));
        assert!(t.set(3, &lk(LockType::Write, 15, 20)).is_ok());
        let c = t.conflict(4, &lk(LockType::Read, 0, 100)).unwrap();
        assert_eq!((c.start, c.end, c.typ), (15, 20, LockType::Write));
        assert!(t.conflict(3, &lk(LockType::Write, 15, 20)).is_none(), "own locks never conflict");
        // An owner may upgrade only where nobody else reads.
        assert_eq!(t.set(1, &lk(LockType::Write, 0, 9)), Err(Error::WouldBlock));
        assert_eq!(t.ranges(1), [(0, 9, false)], "a refused request changes nothing");
        t.release_owner(2);
        assert!(t.set(1, &lk(LockType::Write, 0, 9)).is_ok());
    }

    #[test]
    fn bounded() {
        let mut t = LockTable::default();
        for i in 0..MAX_LOCKS as u64 {
            t.set(1, &lk(LockType::Read, i * 2, i * 2)).unwrap();
        }
        assert_eq!(t.set(1, &lk(LockType::Read, 1 << 40, 1 << 40)), Err(Error::NoLocks));
        // Filling a gap merges and is always possible.
        assert!(t.set(1, &lk(LockType::Read, 1, 1)).is_ok());
    }
}
