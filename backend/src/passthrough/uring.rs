//! The passthrough's data path on a poller: READ, WRITE and FSYNC straight between the host file
//! and the guest's buffers (no bounce copy), on an io_uring owned by the poller when they would
//! block. [`Ring`] is the passthrough's per-poller engine on the filesystem seam
//! ([`crate::filesystem::seam::FsEngine`], made by [`PassthroughFs`]'s `FileSystem::engine`): the server
//! decodes every request once and starts it here; READ, WRITE and FSYNC on an open file are
//! served by the ring, everything else, and anything unusual (a handle it does not know, a WRITE
//! that must clear set-user-id under the writer's identity, no free slot), is handed back
//! ([`Started::Sync`]) and answered by the synchronous methods, exactly as without the engine.
//! The server writes every reply header (at completion, into the buffers it holds for the
//! pending request).
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
//! [`Ring::poll`](crate::filesystem::seam::FsEngine::poll) reaps completions from the completion ring without
//! a system call (completion polling); it enters the kernel only to submit. A short read or write
//! (not at end of file) is resubmitted for the rest, so a reply is only ever short at end of
//! file, as with the synchronous path. Storage answers in bounded time, which is what the seam's
//! drain rule needs.
//!
//! Safety contract (the seam's buffer rule): the device's poller keeps every buffer of a pending
//! request mapped and untouched until it is reported, and calls the engine from the thread that
//! created it. The ring keeps the request's open file (`Arc<Handle>`) and its iovec array alive
//! until the completion, so a concurrent RELEASE cannot close the descriptor under the kernel.
//! This module and `sys.rs` hold all the system-call `unsafe` of the passthrough.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};

use super::{sys, Handle, PassthroughFs};
use crate::abi;
use crate::filesystem::seam::{Completions, FsEngine, Started, Token};
use crate::filesystem::{Error, Reply};
use crate::io::Writer;
use crate::request::{Op, ReadArgs, Request, WriteArgs};

/// How READ, WRITE and FSYNC are served (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
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

/// Counters of an engine (one poller's, or all pollers' added up:
/// [`PassthroughFs::engine_stats`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EngineStats {
    /// Requests completed inline, zero-copy, without the ring.
    pub inline_requests: u64,
    /// Requests served through the ring.
    pub async_requests: u64,
    /// Requests handed back to the synchronous methods.
    pub sync_requests: u64,
    /// Short transfers resubmitted for the rest.
    pub resubmits: u64,
}

impl std::ops::AddAssign for EngineStats {
    fn add_assign(&mut self, o: Self) {
        self.inline_requests += o.inline_requests;
        self.async_requests += o.async_requests;
        self.sync_requests += o.sync_requests;
        self.resubmits += o.resubmits;
    }
}

/// One poller's counters, written only by that poller (relaxed stores, no read-modify-write
/// shared with another core) and read by anyone; a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct StatsCell {
    inline_requests: AtomicU64,
    async_requests: AtomicU64,
    sync_requests: AtomicU64,
    resubmits: AtomicU64,
}

impl StatsCell {
    fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> EngineStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EngineStats {
            inline_requests: g(&self.inline_requests),
            async_requests: g(&self.async_requests),
            sync_requests: g(&self.sync_requests),
            resubmits: g(&self.resubmits),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Fsync,
}

struct Slot {
    token: Token,
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
            token: Token(0),
            kind: Kind::Read,
            handle: None,
            iov: Vec::new(),
            iov_at: 0,
            offset: 0,
            want: 0,
            done: 0,
            datasync: false,
        }
    }

    /// The reply to the finished transfer (`error`: 0 or an errno).
    fn reply(&self, error: i32) -> crate::filesystem::Result<Reply> {
        if error != 0 {
            return Err(Error::from_errno(error));
        }
        let n = self.done.min(self.want);
        Ok(match self.kind {
            Kind::Read => Reply::Data(n),
            Kind::Write => Reply::Written(n),
            Kind::Fsync => Reply::Empty,
        })
    }
}

/// The passthrough's engine on one poller: an io_uring and its request slots. See the module
/// documentation.
pub struct Ring {
    mode: IoMode,
    ring: IoUring,
    slots: Vec<Slot>,
    free: Vec<u32>,
    in_flight: usize,
    /// Entries pushed since the last submit.
    queued: usize,
    stats: Arc<StatsCell>,
    /// Scratch lists for `poll`, kept to avoid allocating per round.
    cqes: Vec<(u64, i32)>,
    resubmit: Vec<u32>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("in_flight", &self.in_flight).field("stats", &self.stats.get()).finish()
    }
}

impl Ring {
    /// A ring of `entries`, serving transfers as `mode` says ([`IoMode::Sync`] is taken as
    /// [`IoMode::Hybrid`]: an engine has a ring).
    pub fn new(entries: u32, mode: IoMode) -> std::io::Result<Self> {
        // A plain ring: the kernel delivers the task work of completions finished by its workers
        // by interrupting the poller (COOP_TASKRUN, which waits for us to enter the kernel,
        // measured slower and with a millisecond tail on a busy-polling thread).
        let ring = IoUring::new(entries)?;
        let mode = if mode == IoMode::Sync { IoMode::Hybrid } else { mode };
        let n = ring.params().sq_entries() as usize;
        let slots = (0..n).map(|_| Slot::new()).collect();
        let free = (0..n as u32).rev().collect();
        Ok(Ring {
            mode,
            ring,
            slots,
            free,
            in_flight: 0,
            queued: 0,
            stats: Arc::default(),
            cqes: Vec::with_capacity(n),
            resubmit: Vec::with_capacity(n),
        })
    }

    /// What the engine did so far.
    pub fn stats(&self) -> EngineStats {
        self.stats.get()
    }

    pub(crate) fn stats_cell(&self) -> Arc<StatsCell> {
        self.stats.clone()
    }

    /// Sets slot `index` up for READ, WRITE or FSYNC; `None` leaves the request to the
    /// synchronous methods.
    fn prepare(
        &mut self,
        fs: &PassthroughFs,
        index: u32,
        req: &Request<'_>,
        data: &Writer<'_>,
    ) -> Option<()> {
        let slot = &mut self.slots[index as usize];
        slot.iov.clear();
        let (kind, fh, offset, want) = match req.op {
            Op::Read(ReadArgs { fh, offset, size }) => {
                data.iovecs(&mut slot.iov);
                (Kind::Read, fh, offset, size as usize)
            }
            Op::Write { args: WriteArgs { fh, offset, size, write_flags, .. }, data: ref payload } => {
                // Clearing set-user-id needs the writer's identity: the synchronous path has it.
                if !fs.session_has(abi::init::HANDLE_KILLPRIV_V2)
                    || write_flags & abi::write_flags::KILL_SUIDGID != 0
                {
                    return None;
                }
                payload.iovecs(&mut slot.iov);
                (Kind::Write, fh, offset, size as usize)
            }
            Op::Fsync { fh, datasync } => {
                slot.datasync = datasync;
                (Kind::Fsync, fh, 0, 0)
            }
            _ => return None,
        };
        // Unknown handles, directories and wrong nodes: the synchronous path says why.
        let handle = fs.handle(fh, req.nodeid).ok()?;
        let in_range = matches!(offset.checked_add(want as u64), Some(end) if end <= i64::MAX as u64);
        if handle.dir.is_some() || !in_range {
            return None;
        }
        slot.kind = kind;
        slot.handle = Some(handle);
        slot.iov_at = 0;
        slot.offset = offset;
        slot.want = want;
        slot.done = 0;
        Some(())
    }

    /// Ends slot `index`'s request here (not pending): its reply.
    fn finish_now(&mut self, index: u32, error: i32) -> Started {
        let slot = &mut self.slots[index as usize];
        let reply = slot.reply(error);
        slot.handle = None;
        Started::Done(reply)
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

    /// Reports slot `index` finished to `done` and frees it.
    fn complete(&mut self, index: u32, error: i32, done: &mut Completions<'_>) {
        let slot = &mut self.slots[index as usize];
        done.complete(slot.token, slot.reply(error));
        slot.handle = None;
        self.free.push(index);
        self.in_flight -= 1;
    }
}

impl FsEngine<PassthroughFs> for Ring {
    fn start(
        &mut self,
        fs: &PassthroughFs,
        token: Token,
        req: &mut Request<'_>,
        data: &mut Writer<'_>,
    ) -> Started {
        let Some(&index) = self.free.last() else {
            StatsCell::bump(&self.stats.sync_requests);
            return Started::Sync;
        };
        if self.prepare(fs, index, req, data).is_none() {
            StatsCell::bump(&self.stats.sync_requests);
            return Started::Sync;
        }
        self.slots[index as usize].token = token;
        if self.mode == IoMode::Hybrid {
            if let Some(error) = self.inline(index, false) {
                StatsCell::bump(&self.stats.inline_requests);
                return self.finish_now(index, error);
            }
        }
        if !self.push(index) {
            // The ring is full or broken: finish here, waiting if need be (a reply must not be
            // short before the end of the file: the guest would take it for the end).
            StatsCell::bump(&self.stats.inline_requests);
            let error = self.inline(index, true).unwrap_or(libc::EIO);
            return self.finish_now(index, error);
        }
        StatsCell::bump(&self.stats.async_requests);
        self.free.pop();
        self.in_flight += 1;
        Started::Pending
    }

    /// Submits what was queued and completes finished requests.
    fn poll(&mut self, _fs: &PassthroughFs, done: &mut Completions<'_>) {
        let overflow = self.ring.submission().cq_overflow();
        if self.queued > 0 || (self.in_flight > 0 && overflow) {
            match self.ring.submit() {
                Ok(_) => self.queued = 0,
                Err(e) => log::warn!("passthrough io_uring: submit: {e}"),
            }
        }
        if self.in_flight == 0 {
            return;
        }
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
            if finished {
                self.complete(index, error, done);
            } else {
                resubmit.push(index);
            }
        }
        for &index in &resubmit {
            StatsCell::bump(&self.stats.resubmits);
            if !self.push(index) {
                let error = self.inline(index, true).unwrap_or(libc::EIO);
                self.complete(index, error, done);
            }
        }
        self.cqes = cqes;
        self.resubmit = resubmit;
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel may still write into guest buffers: wait (bounded) for what is in flight.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.in_flight > 0 && std::time::Instant::now() < deadline {
            let _ = self.ring.submit_and_wait(1);
            let mut cqes = std::mem::take(&mut self.cqes);
            cqes.clear();
            cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for &(user_data, _) in &cqes {
                if let Some(slot) = self.slots.get_mut(user_data as usize) {
                    if slot.handle.take().is_some() {
                        self.in_flight -= 1;
                    }
                }
            }
            if cqes.is_empty() {
                std::thread::yield_now();
            }
            self.cqes = cqes;
        }
        let s = self.stats.get();
        log::debug!(
            "io_uring engine: {} requests inline, {} on the ring, {} synchronous, {} resubmits",
            s.inline_requests,
            s.async_requests,
            s.sync_requests,
            s.resubmits
        );
    }
}
