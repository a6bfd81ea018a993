//! File data of [`RamFs`]: READ and WRITE straight between a file's sparse chunks and guest
//! memory, COPY_FILE_RANGE between chunks, FALLOCATE (allocation and hole punching), LSEEK
//! (`SEEK_DATA`/`SEEK_HOLE` from the chunk map), truncation, and relatime. Chunks come from the
//! capacity ([`super::capacity`]); a write or copy the capacity cuts short is short, not failed.

use std::collections::btree_map;

use super::consts::{
    FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, O_ACCMODE, O_APPEND, O_RDONLY, O_WRONLY, SEEK_CUR, SEEK_DATA,
    SEEK_END, SEEK_HOLE, SEEK_SET, S_IFDIR,
};
use super::node::{coarse_secs, now, Body, FileData, Inode, Meta, CHUNK, CHUNK64};
use super::{RamFs, MAX_COPY, MAX_FILE_SIZE};
use crate::abi;
use crate::filesystem::{Context, CopyFileRangeArgs, Error, Result, WriteArgs};
use crate::io::{Reader, Writer};

impl RamFs {
    /// Sets the size of a file whose data and meta locks the caller holds.
    pub(super) fn truncate_locked(&self, data: &mut FileData, m: &mut Meta, size: u64) {
        if size < m.size {
            let dropped = data.chunks.split_off(&size.div_ceil(CHUNK64));
            let n = dropped.len();
            drop(dropped); // freed before the release, which may give the memory back
            self.release_chunks(n);
            let tail = (size % CHUNK64) as usize;
            if tail != 0 {
                if let Some(chunk) = data.chunks.get_mut(&(size / CHUNK64)) {
                    chunk[tail..].fill(0);
                }
            }
        }
        m.size = size;
        m.blocks = data.blocks();
    }

    fn write_chunks(
        &self,
        data: &mut FileData,
        offset: u64,
        len: usize,
        r: &mut Reader<'_>,
    ) -> Result<usize> {
        let mut done = 0;
        while done < len {
            let pos = offset + done as u64;
            let at = (pos % CHUNK64) as usize;
            let n = (CHUNK - at).min(len - done);
            let chunk = match data.chunks.entry(pos / CHUNK64) {
                btree_map::Entry::Occupied(e) => e.into_mut(),
                btree_map::Entry::Vacant(v) => match self.alloc_chunk() {
                    Ok(c) => v.insert(c),
                    Err(e) if done == 0 => return Err(e),
                    Err(_) => break,
                },
            };
            r.read_exact(&mut chunk[at..at + n])?;
            done += n;
        }
        Ok(done)
    }

    /// Copies `count` bytes at `off_in` of `src` (`None`: `dst` itself) to `off_out` of `dst`, a
    /// piece within one chunk of each at a time: holes in the source stay holes, or zero what the
    /// destination had there. Short when the capacity runs out after something was copied.
    fn copy_chunks(
        &self,
        src: Option<&FileData>,
        dst: &mut FileData,
        off_in: u64,
        off_out: u64,
        count: usize,
    ) -> Result<usize> {
        let mut bounce = [0u8; 4096];
        let mut done = 0;
        while done < count {
            let (pi, po) = (off_in + done as u64, off_out + done as u64);
            let (ai, ao) = ((pi % CHUNK64) as usize, (po % CHUNK64) as usize);
            let (ci, co) = (pi / CHUNK64, po / CHUNK64);
            let n = (CHUNK - ai).min(CHUNK - ao).min(count - done);
            if !src.unwrap_or(dst).chunks.contains_key(&ci) {
                if let Some(to) = dst.chunks.get_mut(&co) {
                    to[ao..ao + n].fill(0);
                }
                done += n;
                continue;
            }
            if let btree_map::Entry::Vacant(v) = dst.chunks.entry(co) {
                match self.alloc_chunk() {
                    Ok(c) => {
                        v.insert(c);
                    }
                    Err(e) if done == 0 => return Err(e),
                    Err(_) => break,
                }
            }
            match src {
                Some(s) => {
                    if let (Some(from), Some(to)) = (s.chunks.get(&ci), dst.chunks.get_mut(&co)) {
                        to[ao..ao + n].copy_from_slice(&from[ai..ai + n]);
                    }
                }
                None if ci == co => {
                    if let Some(c) = dst.chunks.get_mut(&co) {
                        c.copy_within(ai..ai + n, ao);
                    }
                }
                None => {
                    // Two chunks of one map: through a small buffer.
                    let mut at = 0;
                    while at < n {
                        let k = (n - at).min(bounce.len());
                        if let Some(from) = dst.chunks.get(&ci) {
                            bounce[..k].copy_from_slice(&from[ai + at..ai + at + k]);
                        }
                        if let Some(to) = dst.chunks.get_mut(&co) {
                            to[ao + at..ao + at + k].copy_from_slice(&bounce[..k]);
                        }
                        at += k;
                    }
                }
            }
            done += n;
        }
        Ok(done)
    }

    /// Relatime: bump atime when it is older than mtime/ctime or a day old.
    fn touch_atime(&self, inode: &Inode) {
        if atime_stale(&inode.meta_ref()) {
            let now = now();
            inode.update(|m| m.atime = now);
        }
    }
}

/// Whether a read should update atime (relatime): atime is not newer than mtime or ctime, or is
/// a day old. The day is measured on the coarse clock (no TSC read; it lags by at most a tick,
/// so the update can come that much later); the time stored is the precise one.
fn atime_stale(m: &Meta) -> bool {
    m.atime <= m.mtime || m.atime <= m.ctime || coarse_secs().saturating_sub(m.atime.sec) >= 24 * 3600
}

fn read_chunks(data: &FileData, offset: u64, len: usize, w: &mut Writer<'_>) -> Result<()> {
    let mut done = 0;
    while done < len {
        let pos = offset + done as u64;
        let at = (pos % CHUNK64) as usize;
        let n = (CHUNK - at).min(len - done);
        match data.chunks.get(&(pos / CHUNK64)) {
            Some(chunk) => w.write_all(&chunk[at..at + n])?,
            None => w.write_zeros(n)?,
        }
        done += n;
    }
    Ok(())
}

impl RamFs {
    /// READ: up to `size` bytes at `offset` into the reply, holes as zeros.
    pub(super) fn read_data(
        &self,
        _ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        w: &mut Writer<'_>,
    ) -> Result<usize> {
        // The kernel checks the descriptor's access mode; it may read through any handle of the
        // file (e.g. for page cache fills), so none is enforced here.
        let h = self.handle(fh, ino)?;
        let Body::File(data) = &h.inode.body else {
            return Err(if h.inode.kind == S_IFDIR { Error::IsDir } else { Error::InvalidArgument });
        };
        let (n, stale) = {
            let data = data.read();
            // One look at the attributes: the size (stable while we hold `data`: every size
            // change holds it for writing) and whether atime is due.
            let (size_now, stale) = {
                let m = h.inode.meta_ref();
                (m.size, atime_stale(&m))
            };
            if offset >= size_now {
                (0, stale)
            } else {
                let n = u64::from(size).min(size_now - offset) as usize;
                read_chunks(&data, offset, n, w)?;
                (n, stale)
            }
        };
        if stale {
            let now = now();
            h.inode.update(|m| m.atime = now);
        }
        Ok(n)
    }

    /// WRITE: `size` bytes at `offset` from the request, short if the capacity runs out.
    pub(super) fn write_data(
        &self,
        ctx: &Context,
        ino: u64,
        args: &WriteArgs,
        r: &mut Reader<'_>,
    ) -> Result<usize> {
        let WriteArgs { fh, offset, size, write_flags, .. } = *args;
        let h = self.handle(fh, ino)?;
        if h.flags & O_ACCMODE == O_RDONLY {
            return Err(Error::BadHandle);
        }
        let Body::File(_) = &h.inode.body else {
            return Err(Error::InvalidArgument);
        };
        let len = size as usize;
        offset.checked_add(u64::from(size)).filter(|&end| end <= MAX_FILE_SIZE).ok_or(Error::FileTooLarge)?;
        if len == 0 {
            return Ok(0);
        }
        let mut data = h.inode.data_mut().ok_or(Error::InvalidArgument)?;
        let written = self.write_chunks(&mut data, offset, len, r)?;
        let now = now();
        let mut m = h.inode.meta_mut();
        m.size = m.size.max(offset + written as u64);
        m.blocks = data.blocks();
        m.mtime = now;
        m.ctime = now;
        let kill = self.kills_suid(ctx, write_flags & abi::write_flags::KILL_SUIDGID != 0);
        if kill || m.fcaps {
            self.kill_priv(&h.inode, &mut m, ctx, kill);
        }
        Ok(written)
    }

    /// FALLOCATE: allocate the range (mode 0 or `KEEP_SIZE`) or punch a hole in it.
    pub(super) fn allocate(
        &self,
        ctx: &Context,
        ino: u64,
        fh: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> Result<()> {
        let h = self.handle(fh, ino)?;
        if h.flags & O_ACCMODE == O_RDONLY {
            return Err(Error::BadHandle);
        }
        let Body::File(_) = &h.inode.body else {
            return Err(if h.inode.kind == S_IFDIR { Error::IsDir } else { Error::NotSupported });
        };
        if length == 0 {
            return Err(Error::InvalidArgument);
        }
        let end = offset.checked_add(length).filter(|&e| e <= MAX_FILE_SIZE).ok_or(Error::FileTooLarge)?;
        let mut data = h.inode.data_mut().ok_or(Error::InvalidArgument)?;
        let now = now();
        // Like any modification through a descriptor (`file_modified`): times, and privileges
        // (the kernel's clearing request never reaches us with HANDLE_KILLPRIV).
        let modified = |m: &mut Meta| {
            m.mtime = now;
            m.ctime = now;
            self.kill_priv(&h.inode, m, ctx, ctx.uid != 0);
        };
        if mode == 0 || mode == FALLOC_FL_KEEP_SIZE {
            let mut result = Ok(());
            for idx in offset / CHUNK64..=(end - 1) / CHUNK64 {
                if let btree_map::Entry::Vacant(v) = data.chunks.entry(idx) {
                    match self.alloc_chunk() {
                        Ok(c) => {
                            v.insert(c);
                        }
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    }
                }
            }
            let mut m = h.inode.meta_mut();
            m.blocks = data.blocks();
            if result.is_ok() {
                if mode == 0 && end > m.size {
                    m.size = end;
                }
                modified(&mut m);
            }
            result
        } else if mode == FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE {
            let mut m = h.inode.meta_mut();
            let end = end.min(m.size);
            if offset < end {
                // Whole chunks go (found through the map, never by walking the range, which
                // may be huge); the partial chunks at either end are zeroed.
                let first_full = offset.div_ceil(CHUNK64);
                let end_full = end / CHUNK64;
                if first_full < end_full {
                    let mut middle = data.chunks.split_off(&first_full);
                    let mut tail = middle.split_off(&end_full);
                    let n = middle.len();
                    drop(middle); // freed before the release, which may give the memory back
                    self.release_chunks(n);
                    data.chunks.append(&mut tail);
                }
                for (from, to) in
                    [(offset, end.min(first_full * CHUNK64)), (offset.max(end_full * CHUNK64), end)]
                {
                    if from < to {
                        if let Some(chunk) = data.chunks.get_mut(&(from / CHUNK64)) {
                            let at = (from % CHUNK64) as usize;
                            chunk[at..at + (to - from) as usize].fill(0);
                        }
                    }
                }
            }
            m.blocks = data.blocks();
            modified(&mut m);
            Ok(())
        } else {
            Err(Error::NotSupported)
        }
    }

    /// LSEEK, `SEEK_DATA`/`SEEK_HOLE` answered from the chunk map.
    pub(super) fn seek(&self, _ctx: &Context, ino: u64, fh: u64, offset: u64, whence: u32) -> Result<u64> {
        let h = self.handle(fh, ino)?;
        let Body::File(data) = &h.inode.body else {
            return Err(Error::InvalidArgument);
        };
        // Offsets are `loff_t`: the top half of u64 is negative.
        let signed = offset as i64;
        match whence {
            // Handles keep no position (I/O is positional), so SEEK_CUR counts from 0, as it does
            // for virtiofsd; the kernel answers both itself anyway.
            SEEK_SET | SEEK_CUR if signed >= 0 => Ok(offset),
            SEEK_SET | SEEK_CUR => Err(Error::InvalidArgument),
            SEEK_END => {
                let size = h.inode.meta_ref().size as i64;
                match size.checked_add(signed) {
                    Some(pos) if pos >= 0 => Ok(pos as u64),
                    _ => Err(Error::InvalidArgument),
                }
            }
            SEEK_DATA | SEEK_HOLE => {
                let data = data.read();
                let size = h.inode.meta_ref().size;
                if offset >= size {
                    return Err(Error::NoSuchAddress);
                }
                let first = offset / CHUNK64;
                if whence == SEEK_DATA {
                    // Chunks past the size (fallocate KEEP_SIZE) hold no data.
                    match data.chunks.range(first..).next() {
                        Some((&idx, _)) if idx * CHUNK64 < size => Ok(offset.max(idx * CHUNK64)),
                        _ => Err(Error::NoSuchAddress),
                    }
                } else {
                    let mut idx = first;
                    for (&i, _) in data.chunks.range(first..) {
                        if i != idx {
                            break;
                        }
                        idx += 1;
                    }
                    // The end of the file is a hole too.
                    Ok(offset.max(idx * CHUNK64).min(size))
                }
            }
            _ => Err(Error::InvalidArgument),
        }
    }

    /// COPY_FILE_RANGE: at most [`MAX_COPY`] bytes, chunk to chunk.
    pub(super) fn copy_range(&self, ctx: &Context, ino_in: u64, args: &CopyFileRangeArgs) -> Result<usize> {
        let CopyFileRangeArgs { fh_in, off_in, nodeid_out: ino_out, fh_out, off_out, len } = *args;
        // `flags` is 0: the request decoder refuses anything else, for every backend.
        let hin = self.handle(fh_in, ino_in)?;
        let hout = self.handle(fh_out, ino_out)?;
        if hin.inode.kind == S_IFDIR || hout.inode.kind == S_IFDIR {
            return Err(Error::IsDir);
        }
        let (Body::File(din), Body::File(_)) = (&hin.inode.body, &hout.inode.body) else {
            return Err(Error::InvalidArgument);
        };
        let dout = || hout.inode.data_mut().ok_or(Error::InvalidArgument);
        if hin.flags & O_ACCMODE == O_WRONLY
            || hout.flags & O_ACCMODE == O_RDONLY
            || hout.flags & O_APPEND != 0
        {
            return Err(Error::BadHandle);
        }
        if off_in > MAX_FILE_SIZE || off_out > MAX_FILE_SIZE {
            return Err(Error::InvalidArgument);
        }
        if off_in.checked_add(len).is_none() || off_out.checked_add(len).is_none() {
            return Err(Error::Overflow);
        }
        let same = hin.inode.ino == hout.inode.ino;
        // Two files: data locks in inode-number order (a copy the other way cannot deadlock us).
        let (mut gout, gin) = if same {
            (dout()?, None)
        } else if hin.inode.ino < hout.inode.ino {
            let gin = din.read();
            (dout()?, Some(gin))
        } else {
            let gout = dout()?;
            (gout, Some(din.read()))
        };
        let size_in = hin.inode.meta_ref().size;
        let mut count = if off_in >= size_in { 0 } else { len.min(size_in - off_in) };
        if off_out >= MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        count = count.min(MAX_FILE_SIZE - off_out);
        if same && off_out < off_in + count && off_in < off_out + count {
            return Err(Error::InvalidArgument);
        }
        let count = count.min(MAX_COPY) as usize;
        if count == 0 {
            return Ok(0);
        }
        let copied = self.copy_chunks(gin.as_deref(), &mut gout, off_in, off_out, count)?;
        {
            let now = now();
            let mut m = hout.inode.meta_mut();
            m.size = m.size.max(off_out + copied as u64);
            m.blocks = gout.blocks();
            m.mtime = now;
            m.ctime = now;
            self.kill_priv(&hout.inode, &mut m, ctx, ctx.uid != 0);
        }
        drop(gin);
        drop(gout);
        self.touch_atime(&hin.inode);
        Ok(copied)
    }
}
