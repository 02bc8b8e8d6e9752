//! Client-side pacing of the operator's writes: a token bucket (`qps` tokens a second, at most
//! `burst` saved up), the same shape as client-go's default rate limiter.
//!
//! A 100,000-node rollout plans 100,000 RoceNode writes in one pass; sent back to back they
//! would take the API server's whole share of the operator's priority level and starve its own
//! watches and the Lease. The bucket keeps the operator a polite client, and [`TokenBucket::take`]
//! is pure (time is an argument), so the arithmetic is tested without a clock.

use std::time::{Duration, Instant};

/// Default sustained writes a second: a 10% wave of a 100,000-node fabric (10,000 RoceNodes) goes
/// out in under two minutes, far below what one priority level of the API server serves.
pub const DEFAULT_QPS: f64 = 100.0;
/// Default burst: a small fabric's whole pass (hundreds of writes) goes out at once.
pub const DEFAULT_BURST: u32 = 200;

/// A token bucket; `qps <= 0` means no limit.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket: the first `burst` writes go at once.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            tokens: burst,
            last: None,
        }
    }

    /// No pacing at all.
    pub fn unlimited() -> Self {
        Self::new(0.0, 1)
    }

    pub fn is_unlimited(&self) -> bool {
        // NaN and negatives too: the CLI refuses them, a library caller gets no pacing.
        self.qps.is_nan() || self.qps <= 0.0
    }

    /// How many writes may go out together: a second's worth of tokens, no more than the burst
    /// (what the user allowed at once) nor `most`, at least 1 (all of `most` when unlimited).
    /// Sent together, they wake the process once, not once each; the rate over any window
    /// longer than that second is unchanged.
    pub fn batch(&self, most: usize) -> usize {
        if self.is_unlimited() {
            return most.max(1);
        }
        // Truncation is the point: whole writes; NaN was handled above.
        let one_second = self.qps.min(self.burst).min(most as f64).floor() as usize;
        one_second.clamp(1, most.max(1))
    }

    /// Take one token at `now`; returns how long to wait before the write it pays for may go.
    /// A caller that waits and then writes stays within `qps` over any window longer than
    /// `burst / qps`.
    pub fn take(&mut self, now: Instant) -> Duration {
        if self.is_unlimited() {
            return Duration::ZERO;
        }
        if let Some(last) = self.last {
            let refill = now.saturating_duration_since(last).as_secs_f64() * self.qps;
            self.tokens = (self.tokens + refill).min(self.burst);
        }
        self.last = Some(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            // In debt: the write goes once the debt is paid back.
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_goes_at_once_then_writes_are_spaced_by_one_over_qps() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 3);
        for _ in 0..3 {
            assert_eq!(b.take(t0), Duration::ZERO);
        }
        assert_eq!(b.take(t0), Duration::from_millis(100));
        assert_eq!(b.take(t0), Duration::from_millis(200));
    }

    #[test]
    fn idle_time_refills_up_to_the_burst_only() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 2);
        b.take(t0);
        b.take(t0);
        // An hour idle saves up two tokens, not 36,000.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(b.take(later), Duration::ZERO);
        assert_eq!(b.take(later), Duration::ZERO);
        assert!(b.take(later) > Duration::ZERO);
    }

    #[test]
    fn writes_that_wait_as_told_never_exceed_qps_plus_burst() {
        // 1,000 writes, each sent when the bucket says: they span at least (n - burst) / qps.
        let t0 = Instant::now();
        let mut b = TokenBucket::new(100.0, 20);
        let mut now = t0;
        for _ in 0..1000 {
            now += b.take(now);
        }
        let span = now - t0;
        assert!(span >= Duration::from_secs_f64(979.0 / 100.0), "{span:?}");
        assert!(span <= Duration::from_secs_f64(981.0 / 100.0), "{span:?}");
    }

    #[test]
    fn a_batch_is_a_second_of_writes_within_its_bounds() {
        assert_eq!(TokenBucket::new(100.0, 200).batch(128), 100);
        assert_eq!(TokenBucket::new(1000.0, 200).batch(128), 128);
        assert_eq!(
            TokenBucket::new(100.0, 10).batch(128),
            10,
            "never past the burst"
        );
        assert_eq!(TokenBucket::new(3.0, 2).batch(128), 2);
        assert_eq!(TokenBucket::new(0.5, 1).batch(128), 1);
        assert_eq!(TokenBucket::unlimited().batch(16), 16);
        assert_eq!(TokenBucket::unlimited().batch(0), 1);
    }

    #[test]
    fn zero_qps_is_no_limit() {
        let mut b = TokenBucket::new(0.0, 1);
        let t0 = Instant::now();
        for _ in 0..10_000 {
            assert_eq!(b.take(t0), Duration::ZERO);
        }
        assert!(TokenBucket::unlimited().is_unlimited());
    }
}
