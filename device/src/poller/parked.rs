//! The requests that wait on an outside event ([`Outcome::Wait`](super::engine::Outcome::Wait)): what a poller keeps of each
//! ([`Parked`]: where the start of its writable buffers is, as guest addresses that outlive
//! memory snapshots) and how the reply the engine hands over is written there.

use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress, VolatileSlice,
};

use super::engine::MAX_WAIT_REPLY;
use crate::memory::GuestMem;
use crate::stats::{OpClass, Tally};

/// Most writable buffers those bytes may be spread over (a reply split finer comes out short).
const WAIT_REPLY_PIECES: usize = 8;

/// A waiting request as data (issue 22, a live update): its chain's head, where its reply
/// goes, the reply if the engine gave it already, and the engine's name for it while it waits
/// ([`Engine::wait_tokens`](super::engine::Engine::wait_tokens)).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParkedState {
    /// The head (split) or buffer id (packed) of its descriptor chain.
    pub head: u16,
    /// Guest address and length of each piece of the start of its writable buffers.
    pub reply: Vec<(u64, u32)>,
    /// Its reply, when the engine gave it while the queue could not take it.
    pub answer: Option<Vec<u8>>,
    /// Its class, and the errno and data bytes of its answer.
    pub tally: (OpClass, u16, u32),
    /// The engine's name for it while it waits.
    pub token: Option<u64>,
}

/// A queue at its quiet point, as data: where its ring stands and the requests it keeps
/// waiting (each one of its outstanding chains).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueState {
    /// The ring's positions.
    #[serde(flatten)]
    pub ring: crate::virtq::RingState,
    /// Its waiting requests.
    #[serde(default)]
    pub parked: Vec<ParkedState>,
}

impl Parked {
    /// As data, with the engine's `token` for it (`None`: answered already, or unknown).
    pub(super) fn state(&self, token: Option<u64>) -> ParkedState {
        ParkedState {
            head: (self.id & 0xffff) as u16,
            reply: self.reply.to_vec(),
            answer: self.answer.as_ref().map(|a| a.to_vec()),
            tally: (self.class, self.tally.errno, self.tally.bytes),
            token,
        }
    }

    /// Back from data, as request `id` of this poller, taken `started`.
    pub(super) fn from_state(id: u64, p: &ParkedState, started: u64) -> Option<Parked> {
        let reply = heapless::Vec::from_slice(&p.reply).ok()?;
        let answer = match &p.answer {
            Some(a) => Some(heapless::Vec::from_slice(a).ok()?),
            None => None,
        };
        let (class, errno, bytes) = p.tally;
        Some(Parked { id, reply, answer, started, class, tally: Tally { class, errno, bytes } })
    }
}

/// A request that waits ([`Outcome::Wait`](super::engine::Outcome::Wait)).
pub(super) struct Parked {
    /// Its engine id (queue slot << 16 | head).
    pub(super) id: u64,
    /// Where its reply goes: guest addresses and lengths of the start of its writable buffers
    /// (addresses stay valid while memory snapshots change).
    pub(super) reply: heapless::Vec<(u64, u32), WAIT_REPLY_PIECES>,
    /// The reply, once the engine gave it, while the request's queue cannot take it (its ring
    /// is not mapped at the moment).
    pub(super) answer: Option<heapless::Vec<u8, MAX_WAIT_REPLY>>,
    /// Clock reading of the round that took it (0 without latency measurement).
    pub(super) started: u64,
    /// Its class.
    pub(super) class: OpClass,
    /// What the engine said of `answer`.
    pub(super) tally: Tally,
}

/// Guest addresses of the first [`MAX_WAIT_REPLY`] bytes of `bufs`, which lie in `mem`.
pub(super) fn guest_ranges(
    mem: &GuestMem,
    bufs: &[VolatileSlice<'_>],
) -> heapless::Vec<(u64, u32), WAIT_REPLY_PIECES> {
    let mut out = heapless::Vec::new();
    let mut left = MAX_WAIT_REPLY;
    for b in bufs {
        if left == 0 {
            break;
        }
        let host = b.ptr_guard().as_ptr() as usize;
        let gpa = mem.iter().find_map(|r| {
            let base = r.get_host_address(MemoryRegionAddress(0)).ok()? as usize;
            let off = host.checked_sub(base)?;
            (off < r.len() as usize).then(|| r.start_addr().0 + off as u64)
        });
        let Some(gpa) = gpa else { break };
        let n = b.len().min(left);
        if out.push((gpa, n as u32)).is_err() {
            break;
        }
        left -= n;
    }
    out
}

/// Writes `bytes` to the guest ranges `to`; returns how many bytes went in.
pub(super) fn write_reply(mem: &GuestMem, to: &[(u64, u32)], bytes: &[u8]) -> u32 {
    let mut at = 0;
    for &(gpa, len) in to {
        if at == bytes.len() {
            break;
        }
        let n = (len as usize).min(bytes.len() - at);
        if mem.write_slice(&bytes[at..at + n], GuestAddress(gpa)).is_err() {
            break;
        }
        at += n;
    }
    at as u32
}
