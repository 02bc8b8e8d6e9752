//! [`Dsm::with_lock`]: a spin lock word in a window, taken and released with RDMA
//! compare-and-swap, whose word names its holder so that a dead holder's lock can be broken.

use std::time::{Duration, Instant};

use crate::client::Dsm;
use crate::error::Result;

impl Dsm {
    /// Take the spin lock word at `lock_addr` (0 = free), run `f`, release: also when `f` fails
    /// or panics. The lock word names its holder ([`lock_word`]: this pod's uid hash and a fresh
    /// epoch per acquisition), so a holder that died holding it is recognised: a waiter that sees
    /// the same word for longer than `lease` breaks the lock. Choose `lease` well above the longest
    /// `f`: a holder still running past it may be broken. Everyone touching what the lock guards
    /// must take it the same way.
    pub fn with_lock<T>(
        &mut self,
        lock_addr: u64,
        lease: Duration,
        f: impl FnOnce(&mut Dsm) -> Result<T>,
    ) -> Result<T> {
        self.lock_epoch = self.lock_epoch.wrapping_add(1);
        let me = lock_word(&self.config().uid, self.lock_epoch);
        let mut seen = (0u64, Instant::now());
        let mut spins = 0u32;
        loop {
            let prev = self.compare_and_swap(lock_addr, 0, me)?;
            if prev == 0 {
                break;
            }
            if prev != seen.0 {
                seen = (prev, Instant::now());
            } else if seen.1.elapsed() >= lease
                && self.compare_and_swap(lock_addr, prev, me)? == prev
            {
                tracing::warn!(
                    lock = lock_addr,
                    holder = prev >> 32,
                    epoch = prev & 0xffff_ffff,
                    ?lease,
                    "broke a lock held past its lease (its holder is presumed dead)"
                );
                break;
            }
            spins += 1;
            if spins > 16 {
                std::thread::yield_now();
            }
        }
        let mut held = Held {
            dsm: self,
            addr: lock_addr,
            me,
            released: false,
        };
        let out = f(&mut *held.dsm);
        let released = held.release();
        out.and_then(|v| released.map(|()| v))
    }
}

/// The lock word of a [`Dsm::with_lock`] holder: a hash of its pod uid (FNV-1a, never 0) in the
/// high half, its acquisition's epoch in the low half.
pub fn lock_word(uid: &str, epoch: u32) -> u64 {
    let hash = uid.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    (u64::from(hash.max(1)) << 32) | u64::from(epoch)
}

/// A taken lock, released when dropped if not before (an error or a panic in the critical
/// section).
struct Held<'a> {
    dsm: &'a mut Dsm,
    addr: u64,
    me: u64,
    released: bool,
}

impl Held<'_> {
    fn release(&mut self) -> Result<()> {
        self.released = true;
        let prev = self.dsm.compare_and_swap(self.addr, self.me, 0)?;
        if prev != self.me {
            tracing::warn!(
                lock = self.addr,
                now = prev,
                "the lock was broken while held (the critical section outlived its lease)"
            );
        }
        Ok(())
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.released
            && let Err(e) = self.release()
        {
            tracing::warn!(lock = self.addr, error = %e, "releasing a lock failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_word_names_its_holder_and_acquisition() {
        let w = lock_word("2c6a1b0e-uid", 7);
        assert_eq!(w & 0xffff_ffff, 7);
        assert_eq!(w >> 32, lock_word("2c6a1b0e-uid", 8) >> 32, "same holder");
        assert_ne!(w >> 32, lock_word("another-uid", 7) >> 32);
        assert_ne!(lock_word("", 0), 0, "never the free word");
        // Stable across builds and versions (FNV-1a): peers of two versions agree on holders.
        assert_eq!(lock_word("a", 0) >> 32, 0xe40c_292c);
    }
}
