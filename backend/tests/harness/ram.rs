//! The RAM filesystem's sessions: [`Fuse`] over a [`RamFs`].

use virtiofs_backend::RamFs;

use super::TestFs;

/// A session over a RAM filesystem.
pub type Fuse = super::Fuse<RamFs>;

impl super::Fuse<RamFs> {
    /// A fresh RamFs, not initialised.
    pub fn uninit() -> Self {
        Self::with_fs(RamFs::new())
    }

    /// A fresh RamFs after a Linux-6.12-like INIT.
    pub fn new() -> Self {
        Self::uninit().initialised()
    }
}

impl TestFs for RamFs {
    fn lookup_count(&self, ino: u64) -> Option<u64> {
        RamFs::lookup_count(self, ino)
    }
}
