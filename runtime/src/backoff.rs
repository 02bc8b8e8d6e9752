//! Exponential backoff: `initial`, doubling per failure, capped at `max`.

use std::time::Duration;

/// The delays between attempts: `initial * 2^(failures - 1)`, at most `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max }
    }

    /// The delay before the next attempt after `failures` failures in a row (`failures >= 1`;
    /// 0 is treated as 1).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// A [`Backoff`] with its failure count: for loops that retry one thing.
#[derive(Clone, Debug)]
pub struct Retry {
    backoff: Backoff,
    failures: u32,
}

impl Retry {
    pub const fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            failures: 0,
        }
    }

    /// Count one more failure and return how long to wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.backoff.delay(self.failures)
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Back to `initial` after a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<u128> = (1..=6).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(0), Duration::from_millis(100));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1), "no overflow");
    }

    #[test]
    fn retry_counts_and_resets() {
        let mut r = Retry::new(Backoff::new(Duration::from_secs(1), Duration::from_secs(5)));
        let first: Vec<u64> = (0..4).map(|_| r.next_delay().as_secs()).collect();
        assert_eq!(first, [1, 2, 4, 5]);
        assert_eq!(r.failures(), 4);
        r.reset();
        assert_eq!(r.next_delay(), Duration::from_secs(1));
    }
}
