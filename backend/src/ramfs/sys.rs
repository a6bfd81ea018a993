//! The RAM filesystem's one system-level call: giving the allocator's free pages back to the
//! kernel.
//!
//! File data lives in 64 KiB chunks from the global allocator. glibc serves allocations of that
//! size from its heaps (below its mmap threshold, which also grows as blocks are freed), and a
//! freed chunk in the middle of a heap stays resident: a guest that writes a sparse file, then
//! deletes it, would leave the daemon's RSS where the writes took it. `malloc_trim(0)` releases
//! every whole free page of every heap (`MADV_DONTNEED`), not only the top of the main one.

/// Returns the allocator's free pages to the kernel (glibc; elsewhere a no-op).
pub(super) fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it only walks the allocator's own free lists under
    // the allocator's locks, and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
