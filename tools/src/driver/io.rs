//! Requests on the rings: laying a request out in guest memory and making it available
//! ([`FsDriver::submit`], [`FsDriver::submit_raw`]), collecting and checking completions by polling
//! or on the MSI-X eventfds, and the generic FUSE round trip ([`FsDriver::call`]).

use std::time::Instant;

use vmm_sys_util::epoll::EpollEvent;

use super::error::{device, DriverError, Result};
use super::state::{Completion, FsDriver, Pending, PAGE_SIZE};
use crate::fuse_abi::{InHeader, OutHeader};
use crate::memory::GuestRam;
use crate::virtqueue::Segment;

impl FsDriver {
    /// Adds a chain of `readable` buffers (each its own descriptor) followed by writable
    /// segments of the given lengths, and rings the doorbell if the device wants it. Returns
    /// the token. [`QueueError::Full`](crate::virtqueue::QueueError::Full) when the queue has no room.
    pub fn submit_raw(&mut self, queue: u16, readable: &[&[u8]], writable: &[u32]) -> Result<u64> {
        self.check_queue(queue)?;
        let token = self.alloc_unique();
        let in_len: usize = readable.iter().map(|r| r.len()).sum();
        let out_len: usize = writable.iter().map(|w| *w as usize).sum();
        let mut in_segs = Vec::new();
        let mut lens = Vec::new();
        for r in readable {
            lens.push(r.len());
        }
        self.submit_layout(queue, token, None, readable, &lens, in_len, writable, out_len, &mut in_segs)?;
        Ok(token)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit_layout(
        &mut self,
        queue: u16,
        token: u64,
        fuse_opcode: Option<u32>,
        parts: &[&[u8]],
        in_seg_lens: &[usize],
        in_len: usize,
        out_seg_lens: &[u32],
        out_len: usize,
        segs: &mut Vec<Segment>,
    ) -> Result<()> {
        let in_buf = self.mem.alloc(in_len.max(1), PAGE_SIZE)?;
        let out_buf = if out_len > 0 {
            match self.mem.alloc(out_len, PAGE_SIZE) {
                Ok(b) => Some(b),
                Err(e) => {
                    self.mem.free(in_buf);
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        let free = |mem: &GuestRam| {
            mem.free(in_buf);
            if let Some(b) = out_buf {
                mem.free(b);
            }
        };
        let mut off = 0u64;
        for p in parts {
            if let Err(e) = self.mem.write(in_buf.iova + off, p) {
                free(&self.mem);
                return Err(e.into());
            }
            off += p.len() as u64;
        }
        segs.clear();
        let mut off = 0u64;
        for &l in in_seg_lens {
            if l == 0 {
                continue;
            }
            segs.push(Segment { addr: in_buf.iova + off, len: l as u32, write: false });
            off += l as u64;
        }
        if let Some(ob) = out_buf {
            // Poison the reply area so bytes the device claims but did not write show up.
            if let Err(e) = self.mem.fill(ob.iova, out_len, 0xa5) {
                free(&self.mem);
                return Err(e.into());
            }
            let mut off = 0u64;
            for &l in out_seg_lens {
                if l == 0 {
                    continue;
                }
                segs.push(Segment { addr: ob.iova + off, len: l, write: true });
                off += u64::from(l);
            }
        }
        let qs = &mut self.queues[usize::from(queue)];
        if let Err(e) = qs.vq.add_chain(&self.mem, segs, token) {
            free(&self.mem);
            return Err(e.into());
        }
        self.pending.insert(token, Pending { queue, fuse_opcode, in_buf, out_buf, out_len });
        self.stats.submitted += 1;
        let qs = &mut self.queues[usize::from(queue)];
        if qs.vq.kick_prepare(&self.mem)? {
            let addr = qs.notify_addr;
            self.transport.notify(queue, addr)?;
        } else {
            self.stats.notifies_suppressed += 1;
        }
        Ok(())
    }

    /// Submits a FUSE request with Linux's buffer layout: in header | in args (one buffer) |
    /// in data (page buffers); out header | out args | out data (page buffers). Returns the
    /// unique (= token). `queue` 0 is hiprio.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &mut self,
        queue: u16,
        opcode: u32,
        nodeid: u64,
        in_args: &[&[u8]],
        in_data: &[u8],
        out_args: usize,
        out_data: usize,
    ) -> Result<u64> {
        self.check_queue(queue)?;
        let unique = self.alloc_unique();
        let args_len: usize = in_args.iter().map(|a| a.len()).sum();
        let total = InHeader::SIZE + args_len + in_data.len();
        let hdr = self.in_header(opcode, unique, nodeid, total).to_bytes();
        let mut parts: Vec<&[u8]> = vec![&hdr];
        parts.extend_from_slice(in_args);
        parts.push(in_data);
        let mut in_lens = vec![InHeader::SIZE, args_len];
        // Data pages: the header and args occupy the start of the buffer, so keep page
        // boundaries relative to the data start (Linux sends whole pages of the user buffer).
        let mut left = in_data.len();
        while left > 0 {
            let n = left.min(PAGE_SIZE);
            in_lens.push(n);
            left -= n;
        }
        let mut out_lens = vec![OutHeader::SIZE as u32];
        if out_args > 0 {
            out_lens.push(out_args as u32);
        }
        let mut left = out_data;
        while left > 0 {
            let n = left.min(PAGE_SIZE);
            out_lens.push(n as u32);
            left -= n;
        }
        let out_len = OutHeader::SIZE + out_args + out_data;
        let mut segs = Vec::new();
        self.submit_layout(
            queue,
            unique,
            Some(opcode),
            &parts,
            &in_lens,
            total,
            &out_lens,
            out_len,
            &mut segs,
        )?;
        Ok(unique)
    }

    /// Collects every completion available now (all queues), without waiting.
    pub fn poll_completions(&mut self) -> Result<Vec<Completion>> {
        self.reap()?;
        Ok(self.ready.drain(..).collect())
    }

    pub(super) fn reap(&mut self) -> Result<usize> {
        let mut n = 0;
        for i in 0..self.queues.len() {
            while let Some(u) = self.queues[i].vq.pop_used(&self.mem)? {
                let p = self.pending.remove(&u.token).ok_or_else(|| {
                    device(format!("completion for unknown token {} on queue {i}", u.token))
                })?;
                let data = match p.out_buf {
                    Some(b) => self.mem.read_vec(b.iova, (u.len as usize).min(p.out_len))?,
                    None => Vec::new(),
                };
                self.mem.free(p.in_buf);
                if let Some(b) = p.out_buf {
                    self.mem.free(b);
                }
                if let (Some(opcode), true) = (p.fuse_opcode, p.out_len > 0) {
                    if u.len as usize > p.out_len {
                        return Err(DriverError::BadReply {
                            opcode,
                            reason: format!(
                                "used length {} past the {} bytes of reply buffers",
                                u.len, p.out_len
                            ),
                        });
                    }
                    verify_response(opcode, u.len, &data, u.token)?;
                }
                self.ready.push_back(Completion { token: u.token, queue: p.queue, used_len: u.len, data });
                self.stats.completed += 1;
                self.completed_per_queue[i] += 1;
                n += 1;
            }
        }
        if n == 0 {
            self.stats.empty_polls += 1;
        }
        Ok(n)
    }

    /// Waits until at least one completion is available (polling or on eventfds, per the
    /// options) and returns all available ones.
    pub fn wait_completions(&mut self) -> Result<Vec<Completion>> {
        let deadline = Instant::now() + self.opts.timeout;
        loop {
            self.reap()?;
            if !self.ready.is_empty() {
                return Ok(self.ready.drain(..).collect());
            }
            if self.pending.is_empty() {
                return Ok(Vec::new());
            }
            self.wait_step(deadline)?;
        }
    }

    /// Waits for the completion of `token`, keeping others for later.
    pub fn wait_for(&mut self, token: u64) -> Result<Completion> {
        let deadline = Instant::now() + self.opts.timeout;
        loop {
            if let Some(pos) = self.ready.iter().position(|c| c.token == token) {
                return Ok(self.ready.remove(pos).expect("position is valid"));
            }
            if !self.pending.contains_key(&token) {
                return Err(DriverError::Unsupported(format!("token {token} is not in flight")));
            }
            if self.reap()? > 0 {
                continue;
            }
            self.wait_step(deadline)?;
        }
    }

    pub(super) fn wait_step(&mut self, deadline: Instant) -> Result<()> {
        let now = Instant::now();
        if now >= deadline {
            return Err(DriverError::Timeout(format!(
                "no completion within {:?}; {}",
                self.opts.timeout,
                self.describe_queues(0, true)
            )));
        }
        if !self.opts.use_interrupts {
            std::thread::yield_now();
            return Ok(());
        }
        // Re-arm and re-check before sleeping (Linux virtqueue_enable_cb + virtqueue_poll).
        for i in 0..self.queues.len() {
            if self.queues[i].vq.in_flight() > 0 && self.queues[i].vq.enable_interrupts(&self.mem)? {
                return Ok(());
            }
        }
        let ms = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as i32;
        let mut evs = [EpollEvent::default(); 16];
        let n = match self.epoll.wait(ms, &mut evs) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e.into()),
        };
        for ev in &evs[..n] {
            let v = ev.data() as usize;
            if let Some(e) = self.eventfds.get(v) {
                if let Ok(c) = e.read() {
                    self.stats.interrupts += c;
                }
            }
        }
        Ok(())
    }

    /// Reads and clears the eventfd counter of MSI-X vector `v` (0 if nothing pending).
    pub fn take_interrupts(&mut self, v: u16) -> u64 {
        self.eventfds.get(usize::from(v)).and_then(|e| e.read().ok()).unwrap_or(0)
    }

    /// Checks a FUSE reply against its request: returns the out header and the payload.
    pub fn parse_reply(c: &Completion, opcode: u32, unique: u64) -> Result<(OutHeader, Vec<u8>)> {
        let bad = |reason: String| DriverError::BadReply { opcode, reason };
        let h = verify_response(opcode, c.used_len, &c.data, unique)?;
        if h.error > 0 || h.error < -4095 {
            return Err(bad(format!("error {} is not a negative errno", h.error)));
        }
        if h.error != 0 && h.len as usize != OutHeader::SIZE {
            return Err(bad(format!("error {} with {} payload bytes", h.error, h.len - 16)));
        }
        Ok((h, c.data[OutHeader::SIZE..].to_vec()))
    }

    /// Sends a request whose in-arguments are `in_parts` (each its own descriptor) and waits for
    /// the reply (out header + `reply_capacity` bytes). FUSE errors are returned in the header,
    /// not as `Err`; protocol violations are `Err(BadReply)`.
    pub fn call(
        &mut self,
        queue: u16,
        opcode: u32,
        nodeid: u64,
        in_parts: &[&[u8]],
        reply_capacity: usize,
    ) -> Result<(OutHeader, Vec<u8>)> {
        self.check_queue(queue)?;
        let unique = self.alloc_unique();
        let args_len: usize = in_parts.iter().map(|a| a.len()).sum();
        let total = InHeader::SIZE + args_len;
        let hdr = self.in_header(opcode, unique, nodeid, total).to_bytes();
        let mut parts: Vec<&[u8]> = vec![&hdr];
        parts.extend_from_slice(in_parts);
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        let mut out_lens = vec![OutHeader::SIZE as u32];
        if reply_capacity > 0 {
            out_lens.push(reply_capacity as u32);
        }
        let mut segs = Vec::new();
        self.submit_layout(
            queue,
            unique,
            Some(opcode),
            &parts,
            &lens,
            total,
            &out_lens,
            OutHeader::SIZE + reply_capacity,
            &mut segs,
        )?;
        let c = self.wait_for(unique)?;
        Self::parse_reply(&c, opcode, unique)
    }

    /// Sends a request on the current request queue and returns the reply payload; a FUSE error
    /// becomes `Err(Fuse)`.
    pub(super) fn request(
        &mut self,
        opcode: u32,
        nodeid: u64,
        in_args: &[&[u8]],
        in_data: &[u8],
        out_args: usize,
        out_data: usize,
    ) -> Result<Vec<u8>> {
        let q = self.pick_queue();
        let unique = self.submit(q, opcode, nodeid, in_args, in_data, out_args, out_data)?;
        let c = self.wait_for(unique)?;
        let (h, payload) = Self::parse_reply(&c, opcode, unique)?;
        if h.error != 0 {
            return Err(DriverError::Fuse { opcode, errno: -h.error });
        }
        Ok(payload)
    }

    /// The completion of `token` if it has arrived, without waiting (others are kept for later).
    pub fn try_take(&mut self, token: u64) -> Result<Option<Completion>> {
        self.reap()?;
        Ok(self.ready.iter().position(|c| c.token == token).and_then(|i| self.ready.remove(i)))
    }

    /// Whether request `token` is still waiting for its completion.
    pub fn is_pending(&self, token: u64) -> bool {
        self.pending.contains_key(&token)
    }
}

/// The checks Linux 7.1's `virtio_fs_verify_response` makes of every reply before it looks at
/// it (a failure is EIO there, an error here): the used length covers the out header, the
/// header's `len` equals the used length, and its `unique` is the request's. Applied to every
/// completion of a FUSE request ([`FsDriver::submit`]) as it is collected, so every
/// end-to-end test enforces them, and again by [`FsDriver::parse_reply`] and the closed loop.
pub fn verify_response(opcode: u32, used_len: u32, data: &[u8], unique: u64) -> Result<OutHeader> {
    let bad = |reason: String| DriverError::BadReply { opcode, reason };
    if (used_len as usize) < OutHeader::SIZE {
        return Err(bad(format!("used length {used_len} shorter than fuse_out_header")));
    }
    let h = OutHeader::decode(data)
        .ok_or_else(|| bad(format!("{} reply bytes, shorter than fuse_out_header", data.len())))?;
    if h.len != used_len {
        return Err(bad(format!("out header len {} differs from used length {used_len}", h.len)));
    }
    if h.unique != unique {
        return Err(bad(format!("out header unique {} for request {unique}", h.unique)));
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(len: u32, error: i32, unique: u64) -> Vec<u8> {
        OutHeader { len, error, unique }.to_bytes().to_vec()
    }

    #[test]
    fn verify_response_applies_linux_7_1_checks() {
        assert!(verify_response(1, 16, &reply(16, 0, 7), 7).is_ok());
        assert!(verify_response(1, 15, &reply(16, 0, 7), 7).is_err(), "used length below the header");
        assert!(verify_response(1, 0, &[], 7).is_err(), "a bad chain's used length 0");
        assert!(verify_response(1, 32, &reply(16, 0, 7), 7).is_err(), "oh.len differs from used length");
        assert!(verify_response(1, 16, &reply(24, 0, 7), 7).is_err(), "oh.len differs from used length");
        assert!(verify_response(1, 16, &reply(16, 0, 8), 7).is_err(), "unique differs");
    }
}
