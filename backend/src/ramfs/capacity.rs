//! What a [`RamFs`] holds against its limits ([`RamFsConfig`](super::RamFsConfig)): bytes of
//! file chunks, extended attributes and ACLs charged to the capacity, the count of live inodes,
//! the eviction of an inode nothing refers to any more (and the return of what it held), the
//! release of everything at DESTROY, and STATFS, which reports the remainder.

use std::sync::atomic::Ordering;

use super::node::{rd, wr, Body, Inode, BLOCK_SIZE, CHUNK, CHUNK64};
use super::{RamFs, NAME_MAX};

/// Bytes of chunks freed after which the allocator gives its free pages back to the kernel (one
/// trim per this much freed bounds what a guest alternating writes and truncations costs).
pub(super) const TRIM_AFTER: u64 = 4 << 20;
use crate::abi::ROOT_ID;
use crate::filesystem::{Error, Result, StatFs};

impl RamFs {
    /// Drops `inode` once nothing refers to it any more.
    pub(super) fn maybe_evict(&self, inode: &Inode) {
        if inode.ino == ROOT_ID {
            return;
        }
        let evicted = {
            let mut shard = wr(self.inodes.shard(inode.ino));
            let unused = inode.lookups.load(Ordering::Acquire) == 0
                && inode.opens.load(Ordering::Acquire) == 0
                && rd(&inode.meta).nlink == 0;
            if unused {
                shard.remove(&inode.ino)
            } else {
                None
            }
        };
        if let Some(gone) = evicted {
            self.free_inode(&gone);
        }
    }

    fn free_inode(&self, inode: &Inode) {
        self.ninodes.fetch_sub(1, Ordering::Relaxed);
        if let Body::File(data) = &inode.body {
            let mut data = wr(data);
            let n = data.chunks.len();
            data.chunks.clear();
            self.release_chunks(n);
        }
        let mut m = wr(&inode.meta);
        self.uncharge(m.xattr_bytes);
        m.xattr_bytes = 0;
    }

    /// Takes `bytes` of the capacity.
    pub(super) fn charge(&self, bytes: u64) -> Result<()> {
        let cap = self.cfg.capacity;
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_add(bytes).filter(|&n| n <= cap))
            .map(|_| ())
            .map_err(|_| Error::NoSpace)
    }

    pub(super) fn uncharge(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    pub(super) fn alloc_chunk(&self) -> Result<Box<[u8]>> {
        self.charge(CHUNK64)?;
        Ok(vec![0u8; CHUNK].into_boxed_slice())
    }

    /// Returns `n` chunks, already freed, to the capacity; once [`TRIM_AFTER`] bytes were freed
    /// since the allocator last gave memory back, or the filesystem holds no data any more, the
    /// allocator's free pages go back to the kernel ([`super::sys::return_free_memory`]): freed
    /// 64 KiB chunks stay in the allocator's heaps otherwise, and the daemon's RSS with them.
    pub(super) fn release_chunks(&self, n: usize) {
        if n == 0 {
            return;
        }
        let bytes = n as u64 * CHUNK64;
        self.uncharge(bytes);
        let freed = self.freed_since_trim.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if freed >= TRIM_AFTER || self.used.load(Ordering::Acquire) == 0 {
            self.freed_since_trim.store(0, Ordering::Release);
            super::sys::return_free_memory();
        }
    }

    /// Takes an inode of the inode limit and `bytes` of the capacity (its ACLs), or neither.
    pub(super) fn take_inode(&self, bytes: u64) -> Result<()> {
        self.ninodes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.cfg.max_inodes).then_some(n + 1))
            .map_err(|_| Error::NoSpace)?;
        if let Err(e) = self.charge(bytes) {
            self.ninodes.fetch_sub(1, Ordering::Relaxed);
            return Err(e);
        }
        Ok(())
    }

    /// Forgets every handle and lookup reference (DESTROY), dropping the inodes without a link.
    pub(super) fn drop_all(&self) {
        for shard in self.handles.shards.iter() {
            wr(shard).clear();
        }
        self.nhandles.store(0, Ordering::Release);
        let mut gone = Vec::new();
        for shard in self.inodes.shards.iter() {
            let mut shard = wr(shard);
            shard.retain(|_, inode| {
                inode.lookups.store(0, Ordering::Release);
                inode.opens.store(0, Ordering::Release);
                let keep = inode.ino == ROOT_ID || rd(&inode.meta).nlink > 0;
                if !keep {
                    gone.push(inode.clone());
                }
                keep
            });
        }
        for inode in gone {
            self.free_inode(&inode);
        }
    }

    /// STATFS: the capacity and inode limit, and what is left of them.
    pub(super) fn stat_fs(&self) -> StatFs {
        let bsize = u64::from(BLOCK_SIZE);
        let free = self.cfg.capacity.saturating_sub(self.used.load(Ordering::Relaxed)) / bsize;
        let ffree = self.cfg.max_inodes.saturating_sub(self.ninodes.load(Ordering::Relaxed));
        StatFs {
            blocks: self.cfg.capacity / bsize,
            bfree: free,
            bavail: free,
            files: self.cfg.max_inodes,
            ffree,
            bsize: BLOCK_SIZE,
            namelen: NAME_MAX as u32,
            frsize: BLOCK_SIZE,
        }
    }
}
