//! The allocator's arenas, capped at process start.
//!
//! glibc's malloc gives each thread that meets contention an arena of its own, up to
//! eight per core, and each arena keeps what was freed in it. A worker taking uploads
//! (whose chunks are written from blocking threads) grew from 4 to 18 MiB of anonymous
//! memory before levelling off, over a few hundred uploads; the 3-minute soak read that
//! climb as a leak. With two arenas it levels off at 8 MiB within a few dozen uploads.

/// Caps the process at two malloc arenas, unless `MALLOC_ARENA_MAX` is set (glibc reads
/// it itself, and it wins). Call it first thing in `main`, before any thread starts.
pub fn cap_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: `mallopt` sets one of the allocator's tunables and touches no memory
        // of ours; M_ARENA_MAX takes any positive count. Arenas made before the call (none,
        // when no other thread has allocated yet) stay, and the cap holds for new ones.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}
