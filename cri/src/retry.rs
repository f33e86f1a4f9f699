//! [`Retry`]: the one retry policy of evlet's loops — exponential, capped,
//! optionally jittered.
//!
//! It lives in this crate, the lowest one the agent depends on, so that the
//! CRI client's read retries and the agent's own loops (API server calls, the
//! CRI event stream, the PLEG dispatcher, pod workers) share one
//! implementation. The per-key CrashLoopBackOff is the agent's
//! (`evlet::backoff::Backoff`): it keys delays by container and resets them by
//! age, which a single retry loop does not need.

use std::time::Duration;

/// Exponential backoff for one retry loop: `initial`, doubling up to `max`,
/// each delay multiplied by a random factor in `[low, high]` if jittered.
///
/// # Guarantees
/// Without jitter the delays are exact (tests in paused time rely on it).
#[derive(Debug, Clone)]
pub struct Retry {
    initial: Duration,
    max: Duration,
    next: Duration,
    /// The factor range applied to each delay; `(1.0, 1.0)`: no jitter.
    jitter: (f64, f64),
}

impl Retry {
    /// `initial` doubling to `max`, without jitter.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
            jitter: (1.0, 1.0),
        }
    }

    /// The same delay every time (e.g. upstream's 10 s pod-worker error backoff).
    pub fn fixed(delay: Duration) -> Self {
        Self::new(delay, delay)
    }

    /// Multiplies every delay by a uniformly random factor in `[low, high]`,
    /// so that many loops failing together do not retry together.
    pub fn jitter(mut self, low: f64, high: f64) -> Self {
        self.jitter = (low.min(high), low.max(high));
        self
    }

    /// The delay before the next try; the one after doubles (up to the cap).
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        let (low, high) = self.jitter;
        if low == high && low == 1.0 {
            return delay;
        }
        delay.mul_f64(low + fastrand::f64() * (high - low))
    }

    /// Starts over at the initial delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }

    /// The wait after one pass of a periodic loop: the next backoff delay if
    /// it failed, else `period` (and the backoff starts over).
    pub fn after(&mut self, failed: bool, period: Duration) -> Duration {
        if failed {
            self.next_delay()
        } else {
            self.reset();
            period
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_the_cap_and_start_over_after_a_success() {
        let mut r = Retry::new(Duration::from_millis(200), Duration::from_secs(1));
        let delays: Vec<u128> = (0..5).map(|_| r.next_delay().as_millis()).collect();
        assert_eq!(delays, [200, 400, 800, 1000, 1000]);
        assert_eq!(
            r.after(false, Duration::from_secs(10)),
            Duration::from_secs(10)
        );
        assert_eq!(
            r.after(true, Duration::from_secs(10)),
            Duration::from_millis(200)
        );
    }

    #[test]
    fn jitter_stays_within_its_factors() {
        let mut r = Retry::fixed(Duration::from_secs(10)).jitter(0.5, 1.0);
        for _ in 0..100 {
            let d = r.next_delay();
            assert!(
                d >= Duration::from_secs(5) && d <= Duration::from_secs(10),
                "{d:?}"
            );
        }
    }
}
