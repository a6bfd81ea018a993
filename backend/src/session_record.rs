//! A FUSE session kept for a crash (issue 24): INIT's answer and the locks held, as JSON in a
//! memfd the daemon's supervisor holds, written whenever they change (at INIT, and at every
//! request that can change the locks), so that a process started after the serving one was
//! killed serves the guest's session on without a new INIT and with its locks held.
//!
//! The memfd has two halves: a change is written whole into the half not in use, then one
//! atomic store of the header word names it (half and length). A kill while a half is written
//! leaves the other, the session before that change; the change belongs to a request still in
//! flight, which runs again. A session too large for a half (more locks than fit) is not kept:
//! the header is cleared, and a process recovering finds no session (its function answers
//! with errors until it is reset, as one whose state is lost).

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::sync::Mutex;

use crate::ramfs::sys::SharedWords;
use crate::server::SessionState;

const MAGIC: u64 = u64::from_le_bytes(*b"VFDSESS1");
/// Bytes of each half (room for thousands of locks).
const HALF_WORDS: usize = 32 * 1024;
const HEADER_WORDS: usize = 4;
/// Header word 1: bit 63 = a session is kept; bit 62 = it is in the second half; the low 32
/// bits its length in bytes.
const KEPT: u64 = 1 << 63;
const SECOND: u64 = 1 << 62;

/// The record (see the module documentation).
#[derive(Debug)]
pub struct SessionRecord {
    words: SharedWords,
    /// The last JSON written (a change that writes the same is not written again), serialising
    /// writers.
    last: Mutex<Vec<u8>>,
}

impl SessionRecord {
    /// A new, empty record.
    pub fn new() -> std::io::Result<SessionRecord> {
        let words = SharedWords::new("virtiofs-session", HEADER_WORDS + 2 * HALF_WORDS)?;
        words.store(0, MAGIC);
        Ok(SessionRecord { words, last: Mutex::new(Vec::new()) })
    }

    /// The record in `memfd` (a dead process's), its header checked.
    pub fn open(memfd: File) -> Result<SessionRecord, String> {
        let words = SharedWords::from_memfd(memfd).map_err(|e| format!("the session record: {e}"))?;
        if words.len() < HEADER_WORDS + 2 * HALF_WORDS || words.load(0) != MAGIC {
            return Err("the session record is not this firmware's".into());
        }
        Ok(SessionRecord { words, last: Mutex::new(Vec::new()) })
    }

    /// The memfd (for the supervisor to hold).
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.words.memfd()
    }

    /// Keeps `state` (see the module documentation); `false` when it does not fit (then no
    /// session is kept until one fits again).
    pub fn write(&self, state: &SessionState) -> bool {
        self.write_with(|| state.clone())
    }

    /// Keeps the session `snapshot` gives, taken under the record's own lock, so that two
    /// writers' snapshots are written in the order they were taken (a later change is never
    /// overwritten by an earlier one); `false` when it does not fit.
    pub fn write_with(&self, snapshot: impl FnOnce() -> SessionState) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(json) = serde_json::to_vec(&snapshot()) else { return false };
        if *last == json {
            return true;
        }
        if json.len() > HALF_WORDS * 8 {
            self.words.store(1, 0);
            last.clear();
            return false;
        }
        let head = self.words.load(1);
        let second = head & KEPT != 0 && head & SECOND == 0;
        let at = HEADER_WORDS + if second { HALF_WORDS } else { 0 };
        for (k, chunk) in json.chunks(8).enumerate() {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.words.store(at + k, u64::from_le_bytes(b));
        }
        self.words.store(1, KEPT | if second { SECOND } else { 0 } | json.len() as u64);
        *last = json;
        true
    }

    /// The session kept, if one is.
    pub fn read(&self) -> Result<Option<SessionState>, String> {
        let head = self.words.load(1);
        if head & KEPT == 0 {
            return Ok(None);
        }
        let len = (head & 0xffff_ffff) as usize;
        if len > HALF_WORDS * 8 {
            return Err("the session record's length".into());
        }
        let at = HEADER_WORDS + if head & SECOND != 0 { HALF_WORDS } else { 0 };
        let bytes: Vec<u8> =
            (0..len.div_ceil(8)).flat_map(|k| self.words.load(at + k).to_le_bytes()).take(len).collect();
        serde_json::from_slice(&bytes).map(Some).map_err(|e| format!("the session record: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(negotiated: u64) -> SessionState {
        SessionState {
            version: crate::server::SESSION_STATE_VERSION,
            initialized: true,
            negotiated,
            locks: Vec::new(),
            waits: Default::default(),
        }
    }

    #[test]
    fn the_last_session_written_is_read_back_by_another_mapping() {
        let r = SessionRecord::new().unwrap();
        let again = || SessionRecord::open(r.memfd().try_clone_to_owned().unwrap().into()).unwrap();
        assert_eq!(again().read().unwrap(), None, "nothing kept yet");
        for n in 1..5 {
            assert!(r.write(&session(n)));
            assert_eq!(again().read().unwrap(), Some(session(n)));
        }
    }

    #[test]
    fn a_half_written_change_leaves_the_session_before_it() {
        let r = SessionRecord::new().unwrap();
        r.write(&session(1));
        // A kill while the next change was written: the other half holds garbage, the header
        // still names the first.
        let head = r.words.load(1);
        let other = HEADER_WORDS + if head & SECOND != 0 { 0 } else { HALF_WORDS };
        for k in 0..16 {
            r.words.store(other + k, u64::MAX);
        }
        assert_eq!(r.read().unwrap(), Some(session(1)));
    }

    #[test]
    fn a_record_of_another_kind_is_refused() {
        let other = SharedWords::new("x", 8).unwrap();
        assert!(SessionRecord::open(other.memfd().try_clone_to_owned().unwrap().into()).is_err());
    }
}
