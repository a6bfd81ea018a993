//! The passthrough's data path on a poller: READ, WRITE and FSYNC straight between the host file
//! and the guest's buffers (no bounce copy), on an io_uring owned by the poller when they would
//! block; every other request through the [`Server`] synchronously.
//!
//! [`UringEngine::submit`] decodes a request once, with the server's decoder
//! ([`Request::parse`]), and serves READ (data straight into the guest's reply buffers after the
//! 16-byte reply header), WRITE (straight from the guest's payload buffers) and FSYNC; anything
//! else, anything unusual (a handle it does not know, a reply area too small, a WRITE that must
//! clear set-user-id under the writer's identity, a full ring) goes to the server decoded, which
//! answers it — errors included — exactly as without the engine (a SETLKW that has to wait comes
//! back as [`Submitted::Wait`]).
//!
//! How a transfer runs depends on the [`IoMode`]:
//! - [`IoMode::Ring`]: always `READV`/`WRITEV`/`FSYNC` on the ring; the request stays pending.
//! - [`IoMode::Hybrid`] (the default): first inline, zero-copy: `preadv2`/`pwritev2` with
//!   `RWF_NOWAIT` (page-cache hits complete at once, without the ring's round trip), or plainly on
//!   a memory-backed filesystem (tmpfs, ramfs: nothing to wait for; and io_uring cannot do them
//!   without a worker-thread hop there, as tmpfs lacks `FMODE_NOWAIT`). What would block — a
//!   page-cache miss, a filesystem without `RWF_NOWAIT`, an FSYNC to storage — goes on the ring
//!   from where the inline part stopped, so the poller never waits for storage.
//!
//! [`UringEngine::poll`] reaps completions from the completion ring without a system call
//! (completion polling); it enters the kernel only to submit. A short read or write (not at end
//! of file) is resubmitted for the rest, so a reply is only ever short at end of file, as with the
//! synchronous path.
//!
//! Safety contract: the caller (the device's poller) keeps every buffer of a pending request
//! mapped and untouched until `poll` reports it, and calls `poll` from the thread that submitted.
//! The engine keeps the request's open file (`Arc<Handle>`) and its iovec array alive until the
//! completion, so a concurrent RELEASE cannot close the descriptor under the kernel. This module
//! and `sys.rs` hold all the `unsafe` of the passthrough.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};
use vm_memory::{ByteValued, VolatileSlice};

use super::{sys, Handle, PassthroughFs};
use crate::abi::{self, InHeader, OutHeader};
use crate::io::Reader;
use crate::request::{NameBuf, Op, Request};
use crate::server::{LockWait, Served, Server};

const HDR: usize = std::mem::size_of::<OutHeader>();
const WRITE_OUT: usize = std::mem::size_of::<abi::WriteOut>();
/// Most buffers one reply header may span (a real driver uses one).
const HDR_PIECES: usize = 4;

/// What [`UringEngine::submit`] did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// Answered at once (synchronously): this many bytes of reply.
    Done(u32),
    /// On the ring: [`UringEngine::poll`] reports it.
    Pending,
    /// A SETLKW waiting for its lock ([`Served::Wait`]): the caller parks it (see
    /// [`crate::waits::LockWaits`]); the engine holds nothing of it.
    Wait(LockWait),
}

/// How READ, WRITE and FSYNC are served (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoMode {
    /// Through the server, synchronously, with a bounce buffer (no engine).
    Sync,
    /// Always on the ring.
    Ring,
    /// Inline when that cannot block, else on the ring.
    #[default]
    Hybrid,
}

impl std::str::FromStr for IoMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sync" => Ok(IoMode::Sync),
            "ring" => Ok(IoMode::Ring),
            "hybrid" => Ok(IoMode::Hybrid),
            other => Err(format!("unknown I/O mode {other:?} (sync, ring or hybrid)")),
        }
    }
}

/// Counters of an engine.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests completed inline, zero-copy, without the ring.
    pub inline_requests: u64,
    /// Requests served through the ring.
    pub async_requests: u64,
    /// Requests served synchronously.
    pub sync_requests: u64,
    /// Short transfers resubmitted for the rest.
    pub resubmits: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Fsync,
}

/// A guest memory range, kept as an address (the mapping outlives the request; see the
/// module's safety contract).
#[derive(Debug, Clone, Copy, Default)]
struct Range {
    addr: usize,
    len: usize,
}

struct Slot {
    id: u64,
    unique: u64,
    kind: Kind,
    handle: Option<Arc<Handle>>,
    /// Where the data goes (READ) or comes from (WRITE); consumed from the front on resubmits.
    iov: Vec<libc::iovec>,
    /// First iovec not fully transferred yet.
    iov_at: usize,
    offset: u64,
    want: usize,
    done: usize,
    datasync: bool,
    /// The reply header (and WRITE's `fuse_write_out`) in the writable buffers.
    reply: [Range; HDR_PIECES],
    reply_pieces: usize,
}

// SAFETY: the raw pointers in `iov` name guest memory that the poller keeps mapped for the life
// of the request (the module's safety contract); they are only handed to the kernel, never
// dereferenced by Rust code, so moving the slot between threads changes nothing.
unsafe impl Send for Slot {}

impl Slot {
    /// Skips `n` transferred bytes at the front of the iovecs.
    fn advance(&mut self, mut n: usize) {
        while n > 0 && self.iov_at < self.iov.len() {
            let v = &mut self.iov[self.iov_at];
            if v.iov_len <= n {
                n -= v.iov_len;
                self.iov_at += 1;
            } else {
                v.iov_base = (v.iov_base as usize + n) as *mut libc::c_void;
                v.iov_len -= n;
                n = 0;
            }
        }
    }

    fn new() -> Self {
        Slot {
            id: 0,
            unique: 0,
            kind: Kind::Read,
            handle: None,
            iov: Vec::new(),
            iov_at: 0,
            offset: 0,
            want: 0,
            done: 0,
            datasync: false,
            reply: [Range::default(); HDR_PIECES],
            reply_pieces: 0,
        }
    }
}

/// An io_uring for one poller. See the module documentation.
pub struct UringEngine {
    server: Arc<Server<PassthroughFs>>,
    mode: IoMode,
    ring: IoUring,
    slots: Vec<Slot>,
    free: Vec<u32>,
    in_flight: usize,
    /// Entries pushed since the last submit.
    queued: usize,
    stats: EngineStats,
    /// Scratch lists for `poll`, kept to avoid allocating per round.
    cqes: Vec<(u64, i32)>,
    resubmit: Vec<u32>,
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine").field("in_flight", &self.in_flight).field("stats", &self.stats).finish()
    }
}

/// Splits the first `skip` bytes of `bufs` off as ranges (at most [`HDR_PIECES`]), then the next
/// `len` bytes as iovecs; `None` when the buffers are shorter.
fn carve(
    bufs: &[VolatileSlice<'_>],
    skip: usize,
    len: usize,
    iov: &mut Vec<libc::iovec>,
) -> Option<([Range; HDR_PIECES], usize)> {
    let mut head = [Range::default(); HDR_PIECES];
    let mut pieces = 0;
    let mut need_head = skip;
    let mut need_data = len;
    iov.clear();
    for b in bufs {
        let base = b.ptr_guard_mut().as_ptr() as usize;
        let mut at = 0;
        if need_head > 0 {
            let n = need_head.min(b.len());
            if n > 0 {
                if pieces == HDR_PIECES {
                    return None;
                }
                head[pieces] = Range { addr: base, len: n };
                pieces += 1;
            }
            need_head -= n;
            at = n;
        }
        if need_head == 0 && need_data > 0 && at < b.len() {
            let n = need_data.min(b.len() - at);
            iov.push(libc::iovec { iov_base: (base + at) as *mut libc::c_void, iov_len: n });
            need_data -= n;
        }
        if need_head == 0 && need_data == 0 {
            return Some((head, pieces));
        }
    }
    (need_head == 0 && need_data == 0).then_some((head, pieces))
}

impl UringEngine {
    /// A ring of `entries` for requests to `server`'s passthrough filesystem, serving transfers
    /// as `mode` says ([`IoMode::Sync`] is taken as [`IoMode::Hybrid`]: an engine has a ring).
    pub fn new(server: Arc<Server<PassthroughFs>>, entries: u32, mode: IoMode) -> std::io::Result<Self> {
        // A plain ring: the kernel delivers the task work of completions finished by its workers
        // by interrupting the poller (COOP_TASKRUN, which waits for us to enter the kernel,
        // measured slower and with a millisecond tail on a busy-polling thread).
        let ring = IoUring::new(entries)?;
        let mode = if mode == IoMode::Sync { IoMode::Hybrid } else { mode };
        let n = ring.params().sq_entries() as usize;
        let slots = (0..n).map(|_| Slot::new()).collect();
        let free = (0..n as u32).rev().collect();
        Ok(UringEngine {
            server,
            mode,
            ring,
            slots,
            free,
            in_flight: 0,
            queued: 0,
            stats: EngineStats::default(),
            cqes: Vec::with_capacity(n),
            resubmit: Vec::with_capacity(n),
        })
    }

    /// Requests on the ring.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// What the engine did so far.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// Serves one request: inline, on the ring, or at once through the server. `id` is the
    /// caller's. The request is decoded once ([`Request::parse`]); what this engine does not
    /// serve goes to the server decoded.
    pub fn submit(
        &mut self,
        id: u64,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> Submitted {
        let mut r = Reader::new(readable);
        let Ok(hdr) = r.read_obj::<InHeader>() else {
            self.stats.sync_requests += 1;
            return served(self.server.serve(readable, writable));
        };
        let mut names = NameBuf::new();
        let parsed = Request::parse(&hdr, r, &mut names, self.server.negotiated());
        if let Ok(req) = &parsed {
            match self.try_fast(id, req, writable) {
                Some(Submitted::Pending) => {
                    self.stats.async_requests += 1;
                    return Submitted::Pending;
                }
                Some(done) => {
                    self.stats.inline_requests += 1;
                    return done;
                }
                None => {}
            }
        }
        self.stats.sync_requests += 1;
        served(self.server.serve_parsed(&hdr, parsed, writable, true))
    }

    /// READ, WRITE or FSYNC without the server: `None` leaves the request to it.
    fn try_fast(&mut self, id: u64, req: &Request<'_>, writable: &[VolatileSlice<'_>]) -> Option<Submitted> {
        let &index = self.free.last()?;
        let fs = self.server.filesystem();
        let slot = &mut self.slots[index as usize];
        let (kind, fh, offset, want) = match req.op {
            Op::Read { fh, offset, size } => {
                let (reply, pieces) = carve(writable, HDR, size as usize, &mut slot.iov)?;
                slot.reply = reply;
                slot.reply_pieces = pieces;
                (Kind::Read, fh, offset, size as usize)
            }
            Op::Write { fh, offset, size, write_flags, ref data } => {
                // Clearing set-user-id needs the writer's identity: the synchronous path has it.
                let v2 = self.server.negotiated() & abi::init::HANDLE_KILLPRIV_V2 != 0;
                if !v2 || write_flags & abi::write_flags::KILL_SUIDGID != 0 {
                    return None;
                }
                slot.iov.clear();
                data.iovecs(&mut slot.iov);
                let mut none = Vec::new();
                let (reply, pieces) = carve(writable, HDR + WRITE_OUT, 0, &mut none)?;
                slot.reply = reply;
                slot.reply_pieces = pieces;
                (Kind::Write, fh, offset, size as usize)
            }
            Op::Fsync { fh, datasync } => {
                let mut none = Vec::new();
                let (reply, pieces) = carve(writable, HDR, 0, &mut none)?;
                slot.reply = reply;
                slot.reply_pieces = pieces;
                slot.datasync = datasync;
                (Kind::Fsync, fh, 0, 0)
            }
            _ => return None,
        };
        let hdr_nodeid = req.nodeid;
        // Unknown handles, directories and wrong nodes: the server says why.
        let Ok(handle) = fs.handle(fh, hdr_nodeid) else { return None };
        let in_range = matches!(offset.checked_add(want as u64), Some(end) if end <= i64::MAX as u64);
        if handle.dir.is_some() || !in_range {
            return None;
        }
        slot.id = id;
        slot.unique = req.unique;
        slot.kind = kind;
        slot.handle = Some(handle);
        slot.iov_at = 0;
        slot.offset = offset;
        slot.want = want;
        slot.done = 0;
        if self.mode == IoMode::Hybrid {
            if let Some(error) = self.inline(index, false) {
                let len = self.finish(index, error);
                self.slots[index as usize].handle = None;
                return Some(Submitted::Done(len));
            }
        }
        if !self.push(index) {
            // The ring is full or broken: finish here, waiting if need be (a reply must not be
            // short before the end of the file: the guest would take it for the end).
            let error = self.inline(index, true).unwrap_or(libc::EIO);
            let len = self.finish(index, error);
            self.slots[index as usize].handle = None;
            return Some(Submitted::Done(len));
        }
        self.free.pop();
        self.in_flight += 1;
        Some(Submitted::Pending)
    }

    /// Does the transfer of slot `index` (from `done` on) here. `Some(errno)` (0: success):
    /// finished, the reply can be written; `None`: the rest would block and goes on the ring.
    /// `blocking`: wait for storage rather than give up (only when the ring failed).
    fn inline(&mut self, index: u32, blocking: bool) -> Option<i32> {
        let slot = &mut self.slots[index as usize];
        let handle = slot.handle.clone()?;
        let fd = handle.file.as_raw_fd();
        let bit = match slot.kind {
            Kind::Fsync if handle.memory_backed || blocking => {
                return Some(match sys::fsync(handle.file.as_fd(), slot.datasync) {
                    Ok(()) => 0,
                    Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
                });
            }
            Kind::Fsync => return None,
            Kind::Read => 1u8,
            Kind::Write => 2u8,
        };
        let flags = if handle.memory_backed || blocking {
            0
        } else if handle.no_nowait.load(Ordering::Relaxed) & bit != 0 {
            return None;
        } else {
            libc::RWF_NOWAIT
        };
        while slot.done < slot.want {
            let iov = &slot.iov[slot.iov_at..];
            let pos = (slot.offset + slot.done as u64) as i64;
            let cnt = iov.len().min(1024) as libc::c_int;
            // SAFETY: the iovecs name the request's guest buffers (writable ones for a READ),
            // which the poller keeps mapped for the request (module safety contract); the kernel
            // reads or fills at most their lengths. `fd` is open: `handle` holds it.
            let r = unsafe {
                match slot.kind {
                    Kind::Read => libc::preadv2(fd, iov.as_ptr(), cnt, pos, flags),
                    _ => libc::pwritev2(fd, iov.as_ptr(), cnt, pos, flags),
                }
            };
            if r > 0 {
                slot.done += r as usize;
                slot.advance(r as usize);
                continue;
            }
            if r == 0 {
                return Some(0); // end of file
            }
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
            match errno {
                libc::EINTR => continue,
                libc::EAGAIN => return None,
                libc::EOPNOTSUPP if flags != 0 => {
                    handle.no_nowait.fetch_or(bit, Ordering::Relaxed);
                    return None;
                }
                _ if slot.done > 0 => return Some(0),
                e => return Some(e),
            }
        }
        Some(0)
    }

    /// Queues the (next part of the) transfer of slot `index`.
    fn push(&mut self, index: u32) -> bool {
        let slot = &self.slots[index as usize];
        let Some(handle) = &slot.handle else { return false };
        let fd = types::Fd(handle.file.as_raw_fd());
        let iov = &slot.iov[slot.iov_at..];
        let pos = slot.offset + slot.done as u64;
        let entry = match slot.kind {
            Kind::Read => opcode::Readv::new(fd, iov.as_ptr(), iov.len() as u32).offset(pos).build(),
            Kind::Write => opcode::Writev::new(fd, iov.as_ptr(), iov.len() as u32).offset(pos).build(),
            Kind::Fsync => {
                let flags =
                    if slot.datasync { types::FsyncFlags::DATASYNC } else { types::FsyncFlags::empty() };
                opcode::Fsync::new(fd).flags(flags).build()
            }
        }
        .user_data(u64::from(index));
        if self.ring.submission().is_full() {
            if self.ring.submit().is_err() {
                return false;
            }
            self.queued = 0;
        }
        // SAFETY: the entry's iovec array (`slot.iov`) and the buffers it names stay valid until
        // the completion is reaped: the slot is not reused before then, and the poller keeps the
        // guest buffers mapped (module safety contract). The file stays open through `handle`.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            return false;
        }
        self.queued += 1;
        true
    }

    /// Submits what was queued and reports finished requests as `(id, reply length)`.
    pub fn poll(&mut self, done: &mut dyn FnMut(u64, u32)) -> usize {
        let overflow = self.ring.submission().cq_overflow();
        if self.queued > 0 || (self.in_flight > 0 && overflow) {
            match self.ring.submit() {
                Ok(_) => self.queued = 0,
                Err(e) => log::warn!("passthrough io_uring: submit: {e}"),
            }
        }
        let mut reported = 0;
        let mut cqes = std::mem::take(&mut self.cqes);
        let mut resubmit = std::mem::take(&mut self.resubmit);
        cqes.clear();
        resubmit.clear();
        cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for &(user_data, res) in &cqes {
            let index = user_data as u32;
            let Some(slot) = self.slots.get_mut(index as usize) else { continue };
            if slot.handle.is_none() {
                continue;
            }
            let (error, finished) = match (slot.kind, res) {
                (Kind::Fsync, r) if r < 0 => (-r, true),
                (Kind::Fsync, _) => (0, true),
                (_, r) if r < 0 && slot.done > 0 => (0, true),
                (_, r) if r < 0 => (-r, true),
                (_, 0) => (0, true),
                (_, r) => {
                    slot.done += r as usize;
                    if slot.done >= slot.want {
                        (0, true)
                    } else {
                        // Short: skip what was transferred and go on.
                        slot.advance(r as usize);
                        (0, false)
                    }
                }
            };
            if !finished {
                resubmit.push(index);
                continue;
            }
            let len = self.finish(index, error);
            done(self.slots[index as usize].id, len);
            self.slots[index as usize].handle = None;
            self.free.push(index);
            self.in_flight -= 1;
            reported += 1;
        }
        for &index in &resubmit {
            self.stats.resubmits += 1;
            if !self.push(index) {
                let error = self.inline(index, true).unwrap_or(libc::EIO);
                let len = self.finish(index, error);
                done(self.slots[index as usize].id, len);
                self.slots[index as usize].handle = None;
                self.free.push(index);
                self.in_flight -= 1;
                reported += 1;
            }
        }
        self.cqes = cqes;
        self.resubmit = resubmit;
        reported
    }

    /// Writes the reply header (and WRITE's count) of slot `index`; returns the reply length.
    fn finish(&self, index: u32, error: i32) -> u32 {
        let slot = &self.slots[index as usize];
        let mut reply = [0u8; HDR + WRITE_OUT];
        let len = if error != 0 {
            HDR
        } else {
            match slot.kind {
                Kind::Read => HDR + slot.done.min(slot.want),
                Kind::Write => {
                    let out = abi::WriteOut { size: slot.done.min(slot.want) as u32, padding: 0 };
                    reply[HDR..].copy_from_slice(out.as_slice());
                    HDR + WRITE_OUT
                }
                Kind::Fsync => HDR,
            }
        };
        let hdr = OutHeader { len: len as u32, error: -error, unique: slot.unique };
        reply[..HDR].copy_from_slice(hdr.as_slice());
        let head = if error == 0 && slot.kind == Kind::Write { HDR + WRITE_OUT } else { HDR };
        let mut at = 0;
        for r in &slot.reply[..slot.reply_pieces] {
            if at >= head {
                break;
            }
            let n = r.len.min(head - at);
            // SAFETY: `r` is part of the request's writable buffers, which the poller keeps mapped
            // until this request is reported (module safety contract); `n <= r.len`.
            let dst = unsafe { VolatileSlice::new(r.addr as *mut u8, n) };
            dst.copy_from(&reply[at..at + n]);
            at += n;
        }
        len as u32
    }
}

fn served(s: Served) -> Submitted {
    match s {
        Served::Replied(n) => Submitted::Done(u32::try_from(n).unwrap_or(0)),
        Served::Wait(wait) => Submitted::Wait(wait),
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // The kernel may still write into guest buffers: wait (bounded) for what is in flight.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.in_flight > 0 && std::time::Instant::now() < deadline {
            let _ = self.ring.submit_and_wait(1);
            let n = self.poll(&mut |_, _| {});
            if n == 0 {
                std::thread::yield_now();
            }
        }
    }
}
