//! What a [`RamFs`] holds against its limits ([`RamFsConfig`](super::RamFsConfig)): bytes of
//! file chunks, extended attributes and ACLs charged to the capacity, the count of live inodes,
//! the eviction of an inode nothing refers to any more (and the return of what it held), the
//! release of everything at DESTROY, and STATFS, which reports the remainder.

use std::sync::atomic::Ordering;

use super::node::{Chunk, Inode, BLOCK_SIZE, CHUNK64};
use super::{RamFs, NAME_MAX};

use crate::abi::ROOT_ID;
use crate::filesystem::{Error, Result, StatFs};

impl RamFs {
    /// Drops `inode` once nothing refers to it any more.
    pub(super) fn maybe_evict(&self, inode: &Inode) {
        if inode.ino == ROOT_ID {
            return;
        }
        // Under the shard's lock: no reference can be handed out in between.
        let evicted = self
            .inodes
            .remove_if(inode.ino, |i| i.lookups() == 0 && i.opens() == 0 && i.meta_ref().nlink == 0);
        if let Some(gone) = evicted {
            self.free_inode(&gone);
        }
    }

    fn free_inode(&self, inode: &Inode) {
        self.ninodes.fetch_sub(1, Ordering::Relaxed);
        if let Some(mut data) = inode.data_mut() {
            let n = data.chunks.len();
            data.chunks.clear();
            self.release_chunks(n);
        }
        let mut m = inode.meta_mut();
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

    /// A chunk of zeros from the store, charged to the capacity.
    pub(super) fn alloc_chunk(&self) -> Result<Chunk> {
        self.charge(CHUNK64)?;
        self.store.alloc().ok_or_else(|| {
            // The store holds the capacity's worth of chunks; other charges (xattrs, ACLs) only
            // leave fewer.
            self.uncharge(CHUNK64);
            Error::NoSpace
        })
    }

    /// Returns `n` chunks, already freed (their slots back in the store, which gives memory
    /// back to the kernel, see [`super::sys`]), to the capacity.
    ///    /// Once the filesystem holds no data at all, the store gives every freed chunk's memory
    /// back.
    pub(super) fn release_chunks(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.uncharge(n as u64 * CHUNK64);
        if self.used.load(Ordering::Acquire) == 0 {
            self.store.trim();
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
        self.handles.retain(|_| false);
        self.nhandles.store(0, Ordering::Release);
        let mut gone = Vec::new();
        self.inodes.retain(|inode| {
            inode.clear_refs();
            let keep = inode.ino == ROOT_ID || inode.meta_ref().nlink > 0;
            if !keep {
                gone.push(inode.clone());
            }
            keep
        });
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
