//! The session's fore channel slots ([`Slots`]): per slot the sequence id the server last took,
//! whether a call holds it, and what is known after a call ended without a reply; which slots
//! may be used (the table the server granted, cut to its highest and target slot ids).
//!
//! A slot is taken lowest first, so the slots in use stay at the bottom of the table and the
//! `sa_highest_slotid` sent is low when few calls are out (the server may then shrink the table).

/// One slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Slot {
    /// The sequence id of the last request the server took on this slot (0: none yet); a new
    /// request carries one more.
    pub(super) acked: u32,
    /// A call holds the slot (from its send to its reply, or while it waits to be retried with
    /// the same sequence id).
    pub(super) busy: bool,
    /// The last call on the slot ended without a reply (time-out, garbage): the server may or
    /// may not have taken it. `acked` counts it as taken; a SEQ_MISORDERED on the next call
    /// says it was not.
    pub(super) uncertain: bool,
    /// A SEQ_MISORDERED already made the slot start again from sequence id 1.
    pub(super) restarted: bool,
}

/// The slot table of one session.
#[derive(Debug)]
pub(super) struct Slots {
    table: Vec<Slot>,
    /// Free slots: bit `i % 64` of word `i / 64`.
    free: Vec<u64>,
    /// Slots granted by CREATE_SESSION (at most `table.len()`).
    granted: u16,
    /// Slot ids below this may take new calls: `granted` cut to the server's highest and target
    /// slot ids (+ 1), and to a slot it refused.
    limit: u16,
}

impl Slots {
    /// A table of `n` slots (allocated once), none granted yet.
    pub(super) fn new(n: u16) -> Slots {
        Slots {
            table: vec![Slot::default(); usize::from(n)],
            free: vec![0; usize::from(n).div_ceil(64)],
            granted: 0,
            limit: 0,
        }
    }

    /// A new session with `granted` slots: every slot free, its sequence at 0.
    pub(super) fn reset(&mut self, granted: u32) {
        let n = (granted.min(self.table.len() as u32)) as u16;
        self.granted = n;
        self.limit = n;
        self.table.fill(Slot::default());
        self.free.fill(0);
        for i in 0..usize::from(n) {
            self.free[i / 64] |= 1 << (i % 64);
        }
    }

    #[cfg(test)]
    pub(super) fn get(&self, i: u16) -> Slot {
        self.table[usize::from(i)]
    }

    pub(super) fn get_mut(&mut self, i: u16) -> &mut Slot {
        &mut self.table[usize::from(i)]
    }

    /// Slots granted by the server for this session.
    #[cfg(test)]
    pub(super) fn granted(&self) -> u16 {
        self.granted
    }

    /// Slot ids below this take new calls.
    pub(super) fn limit(&self) -> u16 {
        self.limit
    }

    /// Takes the lowest free slot below the limit; returns it and the sequence id of a new
    /// request on it.
    pub(super) fn take(&mut self) -> Option<(u16, u32)> {
        for (w, word) in self.free.iter_mut().enumerate() {
            if *word == 0 {
                continue;
            }
            let i = w * 64 + word.trailing_zeros() as usize;
            if i >= usize::from(self.limit) {
                return None;
            }
            *word &= !(1 << (i % 64));
            let s = &mut self.table[i];
            s.busy = true;
            return Some((i as u16, s.acked.wrapping_add(1)));
        }
        None
    }

    /// The highest slot id in use (`sa_highest_slotid`), 0 when none.
    pub(super) fn highest_busy(&self) -> u32 {
        let n = usize::from(self.granted);
        for w in (0..self.free.len()).rev() {
            if w * 64 >= n {
                // Wholly past the granted slots (none granted yet, or fewer than asked).
                continue;
            }
            let valid = if (w + 1) * 64 <= n { u64::MAX } else { (1u64 << (n - w * 64)) - 1 };
            let busy = !self.free[w] & valid;
            if busy != 0 {
                return (w * 64 + 63 - busy.leading_zeros() as usize) as u32;
            }
        }
        0
    }

    /// Frees slot `i` (its sequence id as it is: the caller set it).
    pub(super) fn release(&mut self, i: u16) {
        let i = usize::from(i);
        if i < usize::from(self.granted) && self.table[i].busy {
            self.table[i].busy = false;
            self.free[i / 64] |= 1 << (i % 64);
        }
    }

    /// The server took request `seqid` on slot `i` and answered: the slot is free and in step.
    pub(super) fn answered(&mut self, i: u16, seqid: u32) {
        let s = &mut self.table[usize::from(i)];
        s.acked = seqid;
        s.uncertain = false;
        s.restarted = false;
        self.release(i);
    }

    /// Request `seqid` on slot `i` ended without a reply: counted as taken, maybe wrongly.
    pub(super) fn unanswered(&mut self, i: u16, seqid: u32) {
        let s = &mut self.table[usize::from(i)];
        s.acked = seqid;
        s.uncertain = true;
        self.release(i);
    }

    /// The server's `sr_highest_slotid` and `sr_target_highest_slotid`: new calls go only to
    /// slots up to both (calls on slots above them finish).
    pub(super) fn server_limits(&mut self, highest: u32, target: u32) {
        let cap = highest.min(target).saturating_add(1).min(u32::from(self.granted));
        self.limit = cap as u16;
    }

    /// The server refused slot `i` (BADSLOT): no new call goes to it or above.
    pub(super) fn refuse_from(&mut self, i: u16) {
        self.limit = self.limit.min(i);
    }
}

#[cfg(test)]
mod tests {
    use super::Slots;

    #[test]
    fn lowest_first_highest_busy_and_limits() {
        let mut s = Slots::new(130);
        assert_eq!(s.take(), None, "nothing granted before a session");
        assert_eq!(s.highest_busy(), 0, "three words, none granted: no shift past a word");
        s.reset(10);
        assert_eq!(s.highest_busy(), 0, "fewer granted than one word of a bigger table");
        s.reset(128);
        assert_eq!(s.granted(), 128);
        let taken: Vec<u16> = (0..128).map(|_| s.take().unwrap().0).collect();
        assert_eq!(taken, (0..128).collect::<Vec<u16>>());
        assert_eq!(s.take(), None);
        assert_eq!(s.highest_busy(), 127);
        s.answered(127, 1);
        s.answered(64, 1);
        assert_eq!(s.highest_busy(), 126);
        assert_eq!(s.take(), Some((64, 2)), "the lowest free slot, its next sequence id");
        for i in 0..127 {
            s.release(i);
        }
        assert_eq!(s.highest_busy(), 0);
        s.server_limits(9, 3);
        assert_eq!(s.limit(), 4, "cut to the target");
        assert_eq!((0..10).filter_map(|_| s.take()).count(), 4);
        s.server_limits(200, 200);
        assert_eq!(s.limit(), 128, "never above the slots granted");
        s.refuse_from(2);
        assert_eq!(s.limit(), 2);
        s.unanswered(0, 5);
        assert!(s.get(0).uncertain && !s.get(0).busy && s.get(0).acked == 5);
        s.reset(2);
        assert_eq!(s.get(0), super::Slot::default(), "a new session starts every slot over");
    }
}
