//! [`Dsm::with_lock`]: a spin lock word in a window, taken and released with RDMA
//! compare-and-swap, whose word names its holder so that a dead holder's lock can be broken. The
//! logic runs over any [`Cas`], so it is tested against a word in memory.

use std::time::{Duration, Instant};

use crate::client::Dsm;
use crate::error::{DsmError, Result};

/// The shortest lease [`Dsm::with_lock`] takes: a shorter one (or another pod's shorter one)
/// would break live holders between two of their own verbs.
pub const MIN_LOCK_LEASE: Duration = Duration::from_secs(1);

/// The one verb a lock needs: compare-and-swap of a word; returns what the word held.
pub(crate) trait Cas {
    fn cas(&mut self, addr: u64, old: u64, new: u64) -> Result<u64>;
}

impl Cas for Dsm {
    fn cas(&mut self, addr: u64, old: u64, new: u64) -> Result<u64> {
        self.compare_and_swap(addr, old, new)
    }
}

impl Dsm {
    /// Take the spin lock word at `lock_addr` (0 = free), run `f`, release: also when `f` fails
    /// or panics. The lock word names its holder ([`lock_word`]: this pod's uid hash and a fresh
    /// epoch per acquisition), so a holder that died holding it is recognised: a waiter that sees
    /// the same word for longer than `lease` breaks the lock. Choose `lease` well above the longest
    /// `f`: a holder still running past it may be broken, and then gets
    /// [`DsmError::LockBroken`] even if `f` succeeded. A lease under [`MIN_LOCK_LEASE`] counts
    /// as that. Everyone touching what the lock guards must take it the same way.
    pub fn with_lock<T>(
        &mut self,
        lock_addr: u64,
        lease: Duration,
        f: impl FnOnce(&mut Dsm) -> Result<T>,
    ) -> Result<T> {
        self.lock_epoch = self.lock_epoch.wrapping_add(1);
        let me = lock_word(&self.config().uid, self.lock_epoch);
        locked(self, lock_addr, me, lease.max(MIN_LOCK_LEASE), f)
    }
}

/// Take the lock word at `addr` as `me`, run `f`, release (see [`Dsm::with_lock`]).
pub(crate) fn locked<C: Cas, T>(
    c: &mut C,
    addr: u64,
    me: u64,
    lease: Duration,
    f: impl FnOnce(&mut C) -> Result<T>,
) -> Result<T> {
    acquire(c, addr, me, lease)?;
    let mut held = Held {
        c,
        addr,
        me,
        released: false,
    };
    let out = f(&mut *held.c);
    let released = held.release();
    out.and_then(|v| released.map(|()| v))
}

/// Spin until the word at `addr` is `me`: taken free, or broken from a holder whose word did not
/// change for `lease` (a live holder takes each acquisition under a new epoch, so its word moves).
fn acquire<C: Cas>(c: &mut C, addr: u64, me: u64, lease: Duration) -> Result<()> {
    let mut seen = (0u64, Instant::now());
    let mut spins = 0u32;
    loop {
        let prev = c.cas(addr, 0, me)?;
        if prev == 0 {
            return Ok(());
        }
        if prev != seen.0 {
            seen = (prev, Instant::now());
        } else if seen.1.elapsed() >= lease && c.cas(addr, prev, me)? == prev {
            tracing::warn!(
                lock = addr,
                holder = prev >> 32,
                epoch = prev & 0xffff_ffff,
                ?lease,
                "broke a lock held past its lease (its holder is presumed dead)"
            );
            return Ok(());
        }
        spins += 1;
        if spins > 16 {
            std::thread::yield_now();
        }
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
struct Held<'a, C: Cas> {
    c: &'a mut C,
    addr: u64,
    me: u64,
    released: bool,
}

impl<C: Cas> Held<'_, C> {
    fn release(&mut self) -> Result<()> {
        self.released = true;
        let prev = self.c.cas(self.addr, self.me, 0)?;
        if prev != self.me {
            return Err(DsmError::LockBroken {
                addr: self.addr,
                now: prev,
            });
        }
        Ok(())
    }
}

impl<C: Cas> Drop for Held<'_, C> {
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

    /// A lock word in memory; `holder` (when set) re-takes the lock under a new epoch every
    /// millisecond of real time from `since`, as a live holder does, until `frees_at` (real time,
    /// not a count of calls: a waiter descheduled past the lease must still see the word move).
    /// Counts the attempts to break a lock (a swap from a held word to another).
    #[derive(Default)]
    struct Word {
        value: u64,
        calls: u32,
        breaks: u32,
        holder: Option<(u64, Instant, Instant)>,
    }

    impl Cas for Word {
        fn cas(&mut self, _addr: u64, old: u64, new: u64) -> Result<u64> {
            self.calls += 1;
            if old != 0 && new != 0 {
                self.breaks += 1;
            }
            if let Some((h, since, frees_at)) = self.holder {
                let now = Instant::now();
                if now >= frees_at {
                    self.holder = None;
                    self.value = 0;
                } else {
                    let epochs = now.duration_since(since).as_millis();
                    self.value = h + u64::try_from(epochs).unwrap_or(u64::MAX >> 1);
                }
            }
            let prev = self.value;
            if prev == old {
                self.value = new;
            }
            Ok(prev)
        }
    }

    const LEASE: Duration = Duration::from_millis(50);

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

    #[test]
    fn the_lock_is_held_during_the_section_and_released_after_it_also_on_error() {
        let me = lock_word("u", 1);
        let mut w = Word::default();
        let got = locked(&mut w, 0, me, LEASE, |w| {
            assert_eq!(w.value, me, "held");
            Ok(5)
        });
        assert_eq!(got.unwrap(), 5);
        assert_eq!(w.value, 0, "released");
        let failed = locked(&mut w, 0, me, LEASE, |_| -> Result<()> {
            Err(DsmError::Unassigned { addr: 8 })
        });
        assert!(matches!(failed, Err(DsmError::Unassigned { addr: 8 })));
        assert_eq!(w.value, 0, "released after an error");
    }

    #[test]
    fn a_panic_in_the_section_releases_the_lock() {
        let me = lock_word("u", 1);
        let mut w = Word::default();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = locked(&mut w, 0, me, LEASE, |_| -> Result<()> {
                panic!("in the section")
            });
        }));
        assert!(unwound.is_err());
        assert_eq!(w.value, 0, "released while unwinding");
    }

    #[test]
    fn a_dead_holders_lock_is_broken_after_the_lease_a_live_holders_never() {
        let dead = lock_word("dead", 3);
        let me = lock_word("u", 1);
        let mut w = Word {
            value: dead,
            ..Word::default()
        };
        let started = Instant::now();
        locked(&mut w, 0, me, LEASE, |w| {
            assert_eq!(w.value, me);
            Ok(())
        })
        .unwrap();
        assert!(started.elapsed() >= LEASE, "not before the lease");
        assert_eq!((w.value, w.breaks), (0, 1));
        // A live holder re-takes the lock under new epochs for longer than the lease: the waiter
        // waits for it to be free instead of breaking it.
        let live = lock_word("live", 0);
        let started = Instant::now();
        let mut w = Word {
            value: live,
            holder: Some((live, started, started + LEASE * 4)),
            ..Word::default()
        };
        locked(&mut w, 0, me, LEASE, |w| {
            assert!(w.holder.is_none(), "taken only once the holder let go");
            Ok(())
        })
        .unwrap();
        assert!(started.elapsed() >= LEASE * 4);
        assert_eq!(w.breaks, 0, "a live holder's lock is never broken");
    }

    #[test]
    fn a_holder_whose_lock_was_broken_is_told_even_when_its_section_succeeded() {
        let me = lock_word("slow", 1);
        let other = lock_word("other", 9);
        let mut w = Word::default();
        let got = locked(&mut w, 0x40, me, LEASE, |w| {
            // Another waiter breaks the lock while this section runs.
            w.value = other;
            Ok(())
        });
        assert!(
            matches!(got, Err(DsmError::LockBroken { addr: 0x40, now }) if now == other),
            "{got:?}"
        );
        assert_eq!(w.value, other, "the new holder's word is left alone");
    }
}
