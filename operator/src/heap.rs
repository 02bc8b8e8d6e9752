//! Giving freed heap back to the kernel. glibc's allocator keeps what a burst freed (the pages of
//! a million listed pods, a full pass over 100,000 nodes) mapped for reuse, so the operator's
//! RSS would stay at its peak; after such a burst the freed pages are returned.

/// What the allocator holds, in bytes (glibc's `mallinfo2`, summed over its arenas).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Held by live objects.
    pub in_use: usize,
    /// Free inside the heap (kept for reuse, or pages the kernel already took back).
    pub free: usize,
    /// Obtained from the kernel: heap plus mmapped blocks.
    pub obtained: usize,
}

/// Return free heap pages to the kernel (glibc only; elsewhere nothing to do), and log what
/// the heap holds after it: `in_use` against RSS tells live objects from fragmentation.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; it touches no live object.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
    if let Some(u) = usage() {
        tracing::info!(
            in_use_bytes = u.in_use,
            free_bytes = u.free,
            obtained_bytes = u.obtained,
            "heap given back"
        );
    }
}

/// What the allocator holds now (glibc only).
pub fn usage() -> Option<Usage> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        #[allow(unsafe_code)]
        let m = unsafe { libc::mallinfo2() };
        Some(Usage {
            in_use: m.uordblks + m.hblkhd,
            free: m.fordblks,
            obtained: m.arena + m.hblkhd,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

#[cfg(test)]
mod tests {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn usage_counts_a_live_allocation() {
        // Large enough that other tests' frees in between cannot hide it.
        const SIZE: usize = 256 << 20;
        let before = super::usage().expect("glibc").in_use;
        let held = vec![0u8; SIZE];
        let after = super::usage().expect("glibc").in_use;
        assert!(after >= before + SIZE / 2, "{before} -> {after}");
        drop(held);
    }
}
