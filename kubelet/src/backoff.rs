//! Backoff. [`Backoff`]: per-key exponential backoff, as upstream's
//! `flowcontrol.Backoff`, for CrashLoopBackOff (10 s doubling to 300 s) and
//! image pull backoff. [`Retry`]: the one policy of a single retry loop (API
//! calls, the CRI event stream, the PLEG dispatcher, pod workers' sync
//! errors), shared with the CRI client.
//!
//! An entry resets once `2 × max` passed since its last failure (10 minutes
//! for containers): a container that ran that long starts over at 10 s.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

pub use evlet_cri::Retry;

/// CrashLoopBackOff's first delay (upstream `containerBackOffPeriod`).
pub const CONTAINER_INITIAL: Duration = Duration::from_secs(10);
/// CrashLoopBackOff's cap (upstream `MaxContainerBackOff`).
pub const CONTAINER_MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy)]
struct Entry {
    backoff: Duration,
    last_update: Instant,
}

/// Backoff state by key.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

impl Backoff {
    /// Backoff starting at `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    /// Upstream's container backoff (10 s → 300 s).
    pub fn containers() -> Self {
        Self::new(CONTAINER_INITIAL, CONTAINER_MAX)
    }

    fn expired(&self, e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.last_update) > self.max * 2
    }

    /// Records a failure of `key` at `now`: the first (or first after a reset)
    /// sets the delay to `initial`, later ones double it up to `max`.
    pub fn next(&mut self, key: &str, now: Instant) {
        let initial = self.initial;
        let max = self.max;
        let fresh = self.entries.get(key).is_none_or(|e| self.expired(e, now));
        let entry = self.entries.entry(key.to_owned()).or_insert(Entry {
            backoff: initial,
            last_update: now,
        });
        entry.backoff = if fresh {
            initial
        } else {
            (entry.backoff * 2).min(max)
        };
        entry.last_update = now;
    }

    /// The current delay of `key` (zero if none).
    pub fn get(&self, key: &str) -> Duration {
        self.entries.get(key).map_or(Duration::ZERO, |e| e.backoff)
    }

    /// True if less than `key`'s delay has passed since `event` (e.g. the container's finish).
    pub fn in_backoff_since(&self, key: &str, event: Instant, now: Instant) -> bool {
        let Some(e) = self.entries.get(key) else {
            return false;
        };
        if self.expired(e, now) {
            return false;
        }
        now.saturating_duration_since(event) < e.backoff
    }

    /// When `key` may be retried, counting from `event`.
    pub fn retry_at(&self, key: &str, event: Instant) -> Instant {
        event + self.get(key)
    }

    /// Forgets entries not updated for `2 × max` (upstream's GC).
    pub fn gc(&mut self, now: Instant) {
        let max = self.max;
        self.entries
            .retain(|_, e| now.saturating_duration_since(e.last_update) <= max * 2);
    }

    /// Forgets every key starting with `prefix` (a deleted pod's containers).
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn crash_loop_delays_double_from_10s_to_300s() {
        let mut b = Backoff::containers();
        let mut delays = Vec::new();
        for _ in 0..8 {
            b.next("c", Instant::now());
            delays.push(b.get("c").as_secs());
            tokio::time::advance(b.get("c")).await;
        }
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_applies_from_the_last_failure() {
        let mut b = Backoff::containers();
        let finished = Instant::now();
        b.next("c", finished);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(b.in_backoff_since("c", finished, Instant::now()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!b.in_backoff_since("c", finished, Instant::now()));
        assert!(!b.in_backoff_since("other", finished, Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn ten_minutes_without_failure_resets_the_delay() {
        let mut b = Backoff::containers();
        for _ in 0..5 {
            b.next("c", Instant::now());
        }
        assert_eq!(b.get("c"), Duration::from_secs(160));
        tokio::time::advance(Duration::from_secs(601)).await;
        b.next("c", Instant::now());
        assert_eq!(b.get("c"), Duration::from_secs(10));
    }
}
