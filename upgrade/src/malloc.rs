//! The allocator's arenas and its large-block threshold, set at process start.
//!
//! glibc's malloc gives each thread that meets contention an arena of its own, up to
//! eight per core, and each arena keeps what was freed in it. A worker taking uploads
//! (whose chunks are written from blocking threads) grew from 4 to 18 MiB of anonymous
//! memory before levelling off, over a few hundred uploads; the 3-minute soak read that
//! climb as a leak. With two arenas it levels off at 8 MiB within a few dozen uploads.
//!
//! Two arenas still kept a few MiB that came and went: glibc raises its threshold for
//! serving a block from its own map (`mmap`) to the size of each such block freed, so
//! after the first upload's 1 MiB hashing buffer every later one came from an arena, and
//! the arena's top was trimmed only past twice that. 80 uploads of 0.1–3 MiB took a
//! worker from 16.6 to 19.1–22.3 MiB, up and down with the order of frees (the soak
//! failed once on a 10% step of its upload worker); with the threshold fixed at glibc's
//! default, 128 KiB, it stayed at 17.2–17.6 MiB. Blocks that large are rare on the hot
//! path (a batch's buffers), and a burst of 20,000 tasks ran as fast either way (six
//! runs each, within their spread).

/// glibc's default threshold, fixed: blocks from 128 KiB come from `mmap` and go back
/// when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Caps the process at two malloc arenas and fixes the threshold above which a block is
/// mapped on its own ([`MMAP_THRESHOLD`]), unless `MALLOC_ARENA_MAX` or
/// `MALLOC_MMAP_THRESHOLD_` is set (glibc reads them itself, and they win). Call it first
/// thing in `main`, before any thread starts.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        set_unless("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, 2);
        set_unless(
            "MALLOC_MMAP_THRESHOLD_",
            libc::M_MMAP_THRESHOLD,
            MMAP_THRESHOLD,
        );
    }
}

/// Sets the allocator's tunable `param` to `value` unless the environment variable
/// `var` sets it already.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_unless(var: &str, param: libc::c_int, value: libc::c_int) {
    if std::env::var_os(var).is_some() {
        return;
    }
    // SAFETY: `mallopt` sets one of the allocator's tunables and touches no memory of
    // ours; M_ARENA_MAX takes any positive count and M_MMAP_THRESHOLD any size up to
    // 32 MiB on 64-bit (setting it also stops glibc from moving it). Arenas made before
    // the call (none, when no other thread has allocated yet) stay, and the settings hold
    // for what comes after.
    unsafe {
        libc::mallopt(param, value);
    }
}
