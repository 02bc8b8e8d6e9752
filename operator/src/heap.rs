//! Giving freed heap back to the kernel. glibc's allocator keeps what a burst freed (the pages of
//! a million listed pods, a full pass over 100,000 nodes) mapped for reuse, so the operator's
//! RSS would stay at its peak; after such a burst the freed pages are returned.

/// Return free heap pages to the kernel (glibc only; elsewhere nothing to do).
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; it touches no live object.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}
