//! The null-data backend (`--backend null`): the device in-process with a handler that answers
//! READ and WRITE at once without touching file data, as DPFS's null backend does; every other
//! request goes to the RAM filesystem. Comparing it with the RAM filesystem separates the cost of
//! the transport (rings, poller, FUSE header) from that of the backend (lookup, copy, locks).

use vm_memory::VolatileSlice;

use virtiofs_backend::RamFs;
use virtiofs_device::poller::{RequestHandler, Taken};
use virtiofs_device::stats::Tally;
use virtiofs_dpu::FuseHandler;

const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
const FUSE_READ: u32 = 15;
const FUSE_WRITE: u32 = 16;

/// Answers READ/WRITE with their full size and no data; the rest goes to a RAM filesystem.
pub struct NullData {
    inner: FuseHandler<RamFs>,
}

impl NullData {
    /// A handler over an empty RAM filesystem.
    pub fn new() -> Self {
        NullData { inner: FuseHandler::synchronous(RamFs::new()) }
    }
}

impl Default for NullData {
    fn default() -> Self {
        Self::new()
    }
}

/// Copies the first `buf.len()` bytes of a scattered buffer; returns how many there were.
fn gather(slices: &[VolatileSlice<'_>], buf: &mut [u8]) -> usize {
    let mut done = 0;
    for s in slices {
        if done == buf.len() {
            break;
        }
        let n = s.len().min(buf.len() - done);
        if let Ok(sub) = s.subslice(0, n) {
            sub.copy_to(&mut buf[done..done + n]);
        }
        done += n;
    }
    done
}

/// Writes `data` across a scattered buffer; returns whether it all fit.
fn scatter(slices: &[VolatileSlice<'_>], data: &[u8]) -> bool {
    let mut done = 0;
    for s in slices {
        if done == data.len() {
            break;
        }
        let n = s.len().min(data.len() - done);
        if let Ok(sub) = s.subslice(0, n) {
            sub.copy_from(&data[done..done + n]);
        }
        done += n;
    }
    done == data.len()
}

impl RequestHandler for NullData {
    fn handle(
        &self,
        taken: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally) {
        // fuse_in_header, then fuse_read_in / fuse_write_in: size at offset 16 of either.
        let mut head = [0u8; IN_HEADER + 24];
        if gather(readable, &mut head) == head.len() {
            let word = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4 bytes"));
            let opcode = word(4);
            let unique = &head[8..16];
            let size = word(IN_HEADER + 16);
            let room: usize = writable.iter().map(|s| s.len()).sum();
            let reply = match opcode {
                FUSE_READ => Some((OUT_HEADER + size as usize).min(room)),
                FUSE_WRITE => Some(OUT_HEADER + 8),
                _ => None,
            };
            if let Some(len) = reply {
                let mut out = [0u8; OUT_HEADER + 8];
                out[0..4].copy_from_slice(&(len as u32).to_le_bytes());
                out[8..16].copy_from_slice(unique);
                out[16..20].copy_from_slice(&size.to_le_bytes());
                let n = if opcode == FUSE_WRITE { OUT_HEADER + 8 } else { OUT_HEADER };
                let len = if scatter(writable, &out[..n]) { len as u32 } else { 0 };
                return (len, Tally::default());
            }
        }
        self.inner.handle(taken, readable, writable)
    }
}
