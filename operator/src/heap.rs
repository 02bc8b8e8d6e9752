//! Giving freed heap back to the kernel. The operator binary allocates with mimalloc (see
//! `main.rs`), which keeps what a burst freed (the pages of a million listed pods, a full pass
//! over 100,000 nodes) for reuse a while; after such a burst `mi_collect` returns what the
//! calling thread's heap and the arenas hold free (pages freed on other threads mimalloc purges
//! itself after a short delay), and the resident set that leaves is logged.
//!
//! mimalloc's own counters are no use for that log on Linux: it commits whole arenas eagerly
//! (1 GiB for a process that holds a few MiB), and its `current_rss` is that same figure.

/// Return freed heap pages to the kernel, and log the resident set after it.
pub fn give_back() {
    // SAFETY: mi_collect only frees memory the allocator holds and no live object uses.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    tracing::info!(resident_bytes = resident().unwrap_or(0), "heap given back");
}

/// The process's resident set (`VmRSS` of `/proc/self/status`), in bytes; `None` without
/// `/proc`.
pub fn resident() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<usize>()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    #[allow(unsafe_code)]
    fn give_back_returns_a_freed_block_of_mimalloc_to_the_kernel() {
        // Large enough that other tests' allocations in between cannot hide it. This test binary
        // does not allocate with mimalloc, so the block is asked of it directly.
        const SIZE: usize = 256 << 20;
        let rss = || super::resident().expect("/proc/self/status");
        let before = rss();
        // SAFETY: a fresh block of SIZE bytes, written within its bounds, then freed once.
        let block = unsafe { libmimalloc_sys::mi_malloc(SIZE) }.cast::<u8>();
        assert!(!block.is_null());
        unsafe { std::ptr::write_bytes(block, 1, SIZE) };
        let held = rss();
        assert!(held >= before + SIZE / 2, "{before} -> {held}");
        unsafe { libmimalloc_sys::mi_free(block.cast()) };
        super::give_back();
        let after = rss();
        assert!(after + SIZE / 2 <= held, "{held} -> {after}");
    }
}
