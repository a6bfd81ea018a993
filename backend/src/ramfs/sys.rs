//! Where the RAM filesystem's file data lives: 64 KiB chunks in one memfd, mapped shared
//! ([`ChunkStore`]). The memfd is a descriptor another process can be given and map: a live
//! update's successor finds every file's data where this process left it, without a copy. This
//! is the filesystem's only `unsafe` code: the mapping, and handing out each chunk's bytes; and
//! [`SharedBytes`], the same kind of mapping as one byte array (the NFS backend's UNSTABLE
//! store, handed over in place the same way).
//!
//! A chunk is a slot of the memfd, owned by one [`Chunk`] at a time (the free list never holds a
//! slot that is in use), so the `&mut [u8]` a chunk gives out aliases nothing. A freed chunk's
//! slot is kept resident for reuse (zeroed when taken again) while at most [`RESIDENT_FREE`]
//! are; past that its pages go back to the kernel (`FALLOCATE_PUNCH_HOLE`), and it reads as
//! zeros when taken again, like a slot never used; and once the filesystem holds no data at all,
//! every freed slot's pages go ([`ChunkStore::trim`]). So a guest that writes a sparse file and
//! deletes it leaves the daemon's memory where it was.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Bytes of one chunk of file data.
pub(super) const CHUNK: usize = 64 * 1024;
/// [`CHUNK`] as a file offset.
pub(super) const CHUNK64: u64 = CHUNK as u64;

/// Freed chunks kept resident for reuse at most (4 MiB); the rest are punched out.
pub(super) const RESIDENT_FREE: usize = 64;

/// The slots of the memfd that are not in use.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct FreeState {
    /// Freed slots whose pages are still resident.
    pub(super) resident: Vec<u32>,
    /// Freed slots whose pages were given back.
    pub(super) punched: Vec<u32>,
    /// Slots from this one on were never used.
    pub(super) next: u32,
}

/// The slots of the memfd that are not in use.
#[derive(Debug, Default)]
struct Free {
    /// Freed slots whose pages are still resident (and hold old data: zeroed when taken).
    resident: Vec<u32>,
    /// Freed slots whose pages were given back: they read as zeros.
    punched: Vec<u32>,
    /// Slots from this one on were never used (zeros).
    next: u32,
}

/// The file data of one RAM filesystem: a memfd of `slots` chunks, mapped shared.
#[derive(Debug)]
pub(super) struct ChunkStore {
    memfd: File,
    /// The mapping (dangling when `slots` is 0).
    base: NonNull<u8>,
    slots: u32,
    free: Mutex<Free>,
    /// The memfd's data is another process's now (a live update): freeing a chunk gives
    /// nothing back to the kernel, so no hole is punched into what the successor serves.
    given: std::sync::atomic::AtomicBool,
}

// SAFETY: `base` points to a shared mapping that lives as long as the store; the bytes of a slot
// are reached only through the one `Chunk` that owns it (see the module's documentation), and
// the free lists are behind a mutex.
unsafe impl Send for ChunkStore {}
// SAFETY: as above.
unsafe impl Sync for ChunkStore {}

/// A new, empty memfd named `name` (close-on-exec).
pub(crate) fn memfd(name: &str) -> io::Result<File> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: memfd_create reads the NUL-terminated name for the call only.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Bytes in a memfd, mapped shared: memory another process can be given and map (the NFS
/// backend's UNSTABLE store, whose writes a live update's successor takes over in place). Its
/// pages are taken as they are written (`MAP_NORESERVE`), so a large store costs nothing until
/// used, and failing to make one is an error, not an abort.
#[derive(Debug)]
pub(crate) struct SharedBytes {
    memfd: File,
    /// The mapping (dangling when `len` is 0).
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping lives as long as the value; its bytes are read through `&self` and
// written only through `&mut self`, so the borrow rules cover every access in this process.
unsafe impl Send for SharedBytes {}
// SAFETY: as above.
unsafe impl Sync for SharedBytes {}

impl SharedBytes {
    /// `len` zero bytes in a new memfd named `name`.
    pub(crate) fn new(name: &str, len: usize) -> io::Result<SharedBytes> {
        let memfd = memfd(name)?;
        memfd.set_len(len as u64)?;
        let base = ChunkStore::map(&memfd, len)?;
        Ok(SharedBytes { memfd, base, len })
    }

    /// The first `len` bytes of `memfd` (another process's, handed over).
    pub(crate) fn from_memfd(memfd: File, len: usize) -> io::Result<SharedBytes> {
        if memfd.metadata()?.len() < len as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the memfd is shorter than the store"));
        }
        let base = ChunkStore::map(&memfd, len)?;
        Ok(SharedBytes { memfd, base, len })
    }

    /// The memfd (to hand it over).
    pub(crate) fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `base` maps `len` bytes for as long as `self` lives; no `&mut` to them exists
        // while `&self` is borrowed.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }

    /// The bytes, to write.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }
}

impl Drop for SharedBytes {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made in `new` or `from_memfd`, of this length; the borrows of
            // its bytes ended with `self`'s.
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
        }
    }
}

/// Little-endian 64-bit words in a memfd, mapped shared, each read and written with one atomic
/// load or store: a record another process reads after this one is killed (the NFS backend's
/// kept tables, `nfs::keep`). Words are addressed by index; an index past the end is ignored on
/// a store and reads as 0, so a caller's bad arithmetic cannot reach outside the mapping.
#[derive(Debug)]
pub(crate) struct SharedWords {
    memfd: File,
    /// The mapping (dangling when `words` is 0).
    base: NonNull<u8>,
    words: usize,
}

// SAFETY: the mapping lives as long as the value and is only reached through atomic loads and
// stores of aligned words inside it, which are sound from any thread and any process.
unsafe impl Send for SharedWords {}
// SAFETY: as above.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// `words` zero words in a new memfd named `name` (sparse: memory is taken as they are
    /// written).
    pub(crate) fn new(name: &str, words: usize) -> io::Result<SharedWords> {
        let memfd = memfd(name)?;
        let len = words.checked_mul(8).ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        memfd.set_len(len as u64)?;
        let base = ChunkStore::map(&memfd, len)?;
        Ok(SharedWords { memfd, base, words })
    }

    /// Every whole word of `memfd` (another process's), mapped again.
    pub(crate) fn from_memfd(memfd: File) -> io::Result<SharedWords> {
        let len = usize::try_from(memfd.metadata()?.len() / 8)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        let base = ChunkStore::map(&memfd, len * 8)?;
        Ok(SharedWords { memfd, base, words: len })
    }

    /// The memfd (to give it to the process that keeps it).
    pub(crate) fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// How many words it holds.
    pub(crate) fn len(&self) -> usize {
        self.words
    }

    fn word(&self, i: usize) -> Option<&std::sync::atomic::AtomicU64> {
        (i < self.words).then(|| {
            // SAFETY: `i < words`: the 8 bytes at `8 * i` lie in the mapping, which is
            // page-aligned (so the word is 8-aligned) and lives as long as `self`; an AtomicU64
            // has u64's size and alignment, and every access to these bytes is atomic.
            unsafe { &*(self.base.as_ptr().add(i * 8) as *const std::sync::atomic::AtomicU64) }
        })
    }

    /// Word `i` (0 past the end).
    pub(crate) fn load(&self, i: usize) -> u64 {
        self.word(i).map_or(0, |w| u64::from_le(w.load(std::sync::atomic::Ordering::Acquire)))
    }

    /// Raises word `i` to `v` if it is below (one compare-and-swap loop: concurrent raisers
    /// leave the largest); nothing past the end.
    pub(crate) fn raise(&self, i: usize, v: u64) {
        let Some(w) = self.word(i) else { return };
        let mut cur = w.load(std::sync::atomic::Ordering::Acquire);
        while u64::from_le(cur) < v {
            match w.compare_exchange_weak(
                cur,
                v.to_le(),
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// Stores `v` as word `i` (release order: what was stored before it is seen first by a
    /// reader that sees it); nothing past the end.
    pub(crate) fn store(&self, i: usize, v: u64) {
        if let Some(w) = self.word(i) {
            w.store(v.to_le(), std::sync::atomic::Ordering::Release);
        }
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        if self.words > 0 {
            // SAFETY: the mapping made in `new` or `from_memfd`, of this length; the references
            // `word` gave out borrowed `self` and ended with it.
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.words * 8) };
        }
    }
}

impl ChunkStore {
    /// A store for `bytes` of file data (rounded down to whole chunks), in a memfd named `name`.
    /// The memfd is sparse: memory is taken as chunks are written.
    pub(super) fn new(name: &str, bytes: u64) -> io::Result<Arc<ChunkStore>> {
        let slots = u32::try_from(bytes / CHUNK as u64).unwrap_or(u32::MAX);
        let len = slots as usize * CHUNK;
        let memfd = memfd(name)?;
        memfd.set_len(len as u64)?;
        let base = Self::map(&memfd, len)?;
        Ok(Arc::new(ChunkStore { memfd, base, slots, free: Mutex::default(), given: Default::default() }))
    }

    /// A store over the memfd of a filesystem taken over (issue 22): `slots` chunks, the free
    /// ones as `free` says; the slots in use are taken back with [`Self::claim`].
    pub(super) fn from_memfd(memfd: File, slots: u32, free: FreeState) -> io::Result<Arc<ChunkStore>> {
        let len = slots as usize * CHUNK;
        if memfd.metadata()?.len() < len as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the memfd is smaller than its slots"));
        }
        let base = Self::map(&memfd, len)?;
        let free = Free { resident: free.resident, punched: free.punched, next: free.next };
        Ok(Arc::new(ChunkStore { memfd, base, slots, free: Mutex::new(free), given: Default::default() }))
    }

    /// Maps `len` bytes of `memfd` shared (a dangling pointer for none).
    fn map(memfd: &File, len: usize) -> io::Result<NonNull<u8>> {
        if len == 0 {
            return Ok(NonNull::dangling());
        }
        // SAFETY: a new shared mapping of the memfd, at an address the kernel chooses; it
        // overlaps nothing of ours and is unmapped only in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                memfd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))
    }

    /// The chunk in slot `slot` of a store taken over: its data is the predecessor's. The
    /// caller claims each slot in use once (`ramfs::state` checks that before it claims any).
    pub(super) fn claim(self: &Arc<Self>, slot: u32) -> Option<Chunk> {
        (slot < self.slots).then(|| Chunk { store: self.clone(), slot })
    }

    /// The free lists, for a saved state.
    pub(super) fn free_state(&self) -> FreeState {
        let f = self.lock();
        FreeState { resident: f.resident.clone(), punched: f.punched.clone(), next: f.next }
    }

    /// How many chunks it holds at most.
    pub(super) fn slot_count(&self) -> u32 {
        self.slots
    }

    /// The memfd the data lives in (chunk `slot` at offset `slot * CHUNK`).
    pub(super) fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A chunk of zeros, or `None` when every slot is in use.
    pub(super) fn alloc(self: &Arc<Self>) -> Option<Chunk> {
        if self.given() {
            return None;
        }
        let (slot, dirty) = {
            let mut f = self.lock();
            if let Some(s) = f.resident.pop() {
                (s, true)
            } else if let Some(s) = f.punched.pop() {
                (s, false)
            } else if f.next < self.slots {
                f.next += 1;
                (f.next - 1, false)
            } else {
                return None;
            }
        };
        let mut c = Chunk { store: self.clone(), slot };
        if dirty {
            c.fill(0);
        }
        Some(c)
    }

    /// The data is handed over to a successor process (a live update): from now on freed
    /// chunks are neither reused nor given back, the memfd's contents are left as they are.
    pub(super) fn give_away(&self) {
        self.given.store(true, std::sync::atomic::Ordering::Release);
    }

    /// A store being taken over: its free slots are `free` (still given away: nothing is
    /// reused or freed until [`Self::take_back`]).
    pub(super) fn set_free(&self, free: FreeState) {
        *self.lock() = Free { resident: free.resident, punched: free.punched, next: free.next };
    }

    /// A store taken over is this process's from now on (after [`Self::give_away`] kept it
    /// untouched while the state was applied and the predecessor could still serve from it).
    pub(super) fn take_back(&self) {
        self.given.store(false, std::sync::atomic::Ordering::Release);
    }

    fn given(&self) -> bool {
        self.given.load(std::sync::atomic::Ordering::Acquire)
    }

    fn release(&self, slot: u32) {
        if self.given() {
            return;
        }
        let punch = {
            let mut f = self.lock();
            f.resident.push(slot);
            if f.resident.len() > RESIDENT_FREE {
                Some(f.resident.remove(0))
            } else {
                None
            }
        };
        if let Some(s) = punch {
            self.punch(s);
        }
    }

    /// Gives the memory of every freed slot back to the kernel (the filesystem holds no data any
    /// more: nothing is likely to be written soon).
    pub(super) fn trim(&self) {
        if self.given() {
            return;
        }
        let resident = std::mem::take(&mut self.lock().resident);
        for s in resident {
            self.punch(s);
        }
    }

    /// Gives the memory of free slot `s` back to the kernel, and files it as punched.
    fn punch(&self, s: u32) {
        let off = s as libc::off_t * CHUNK as libc::off_t;
        // SAFETY: fallocate on our own memfd over one slot no chunk owns; it touches no memory
        // of ours (the mapping's pages of the slot read as zeros afterwards).
        let r = unsafe {
            libc::fallocate(
                self.memfd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                CHUNK as libc::off_t,
            )
        };
        let mut f = self.lock();
        if r == 0 {
            f.punched.push(s);
        } else {
            // Not given back (a system-call filter without fallocate, say): stays resident.
            f.resident.push(s);
        }
    }

    /// Freed slots still resident, and freed slots given back to the kernel.
    #[cfg(test)]
    fn free_counts(&self) -> (usize, usize) {
        let f = self.lock();
        (f.resident.len(), f.punched.len())
    }
}

impl Drop for ChunkStore {
    fn drop(&mut self) {
        if self.slots > 0 {
            // SAFETY: the mapping made in `new`, of this length; no chunk is left (each holds
            // the store alive), so nothing refers to it any more.
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.slots as usize * CHUNK) };
        }
    }
}

/// One 64 KiB chunk of file data, a slot of its [`ChunkStore`]; freed when dropped.
#[derive(Debug)]
pub(super) struct Chunk {
    store: Arc<ChunkStore>,
    slot: u32,
}

impl Chunk {
    /// Its slot in the store's memfd.
    pub(super) fn slot(&self) -> u32 {
        self.slot
    }
}

impl std::ops::Deref for Chunk {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the slot lies inside the mapping (`slot < slots`), which outlives the chunk
        // (the chunk holds the store); only this chunk reaches these bytes.
        unsafe { std::slice::from_raw_parts(self.store.base.as_ptr().add(self.slot as usize * CHUNK), CHUNK) }
    }
}

impl std::ops::DerefMut for Chunk {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference to the bytes.
        unsafe {
            std::slice::from_raw_parts_mut(self.store.base.as_ptr().add(self.slot as usize * CHUNK), CHUNK)
        }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.store.release(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// A chunk's bytes are the memfd's at its slot; a reused slot reads as zeros whether it was
    /// kept resident or punched out; the store runs out at its size.
    #[test]
    fn chunks_are_slots_of_the_memfd() {
        let store = ChunkStore::new("test", 4 * CHUNK as u64 + 100).unwrap();
        assert_eq!(store.slot_count(), 4);
        let memfd = File::from(store.memfd().try_clone_to_owned().unwrap());
        let mut chunks: Vec<Chunk> = (0..4).map(|_| store.alloc().unwrap()).collect();
        assert!(store.alloc().is_none(), "a fifth chunk in a store of four");
        for (i, c) in chunks.iter_mut().enumerate() {
            assert!(c.iter().all(|&b| b == 0));
            c[..5].copy_from_slice(b"chunk");
            c[CHUNK - 1] = i as u8 + 1;
        }
        let mut buf = [0u8; 5];
        memfd.read_exact_at(&mut buf, chunks[2].slot() as u64 * CHUNK as u64).unwrap();
        assert_eq!(&buf, b"chunk");
        let slot = chunks[3].slot();
        chunks.truncate(3);
        let again = store.alloc().unwrap();
        assert_eq!(again.slot(), slot);
        assert!(again.iter().all(|&b| b == 0), "a reused slot holds old data");
        assert_eq!(store.free_counts(), (0, 0));
    }

    /// Past `RESIDENT_FREE` freed chunks the pages go back to the kernel, and a punched slot
    /// comes back as zeros.
    #[test]
    fn freed_chunks_past_the_resident_bound_are_punched_out() {
        let n = RESIDENT_FREE + 8;
        let store = ChunkStore::new("test", (n * CHUNK) as u64).unwrap();
        let chunks: Vec<Chunk> = (0..n)
            .map(|_| {
                let mut c = store.alloc().unwrap();
                c.fill(0xa5);
                c
            })
            .collect();
        let memfd = File::from(store.memfd().try_clone_to_owned().unwrap());
        let blocks = || {
            use std::os::unix::fs::MetadataExt;
            memfd.metadata().unwrap().blocks()
        };
        let per_chunk = CHUNK as u64 / 512;
        assert_eq!(blocks(), n as u64 * per_chunk, "every chunk written is in memory");
        drop(chunks);
        assert_eq!(store.free_counts(), (RESIDENT_FREE, 8));
        assert_eq!(blocks(), RESIDENT_FREE as u64 * per_chunk, "the punched chunks' memory is back");
        store.trim();
        assert_eq!(store.free_counts(), (0, n));
        assert_eq!(blocks(), 0, "trimmed, every free chunk's memory is back");
        let all: Vec<Chunk> = (0..n).map(|_| store.alloc().unwrap()).collect();
        assert!(all.iter().all(|c| c.iter().all(|&b| b == 0)));
    }
}
