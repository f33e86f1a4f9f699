//! The wall clock and conversions between CRI times (Unix nanoseconds), API
//! times and monotonic instants. The only module of the ground floor that reads
//! the wall clock: pure code gets the time as an argument.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;

/// Wall-clock Unix nanoseconds now.
pub fn unix_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A CRI time (Unix ns) as an API `Time`; `None` for 0 ("not yet").
pub fn time_of(unix_ns: i64) -> Option<Time> {
    if unix_ns <= 0 {
        return None;
    }
    let secs = unix_ns / 1_000_000_000;
    let nanos = i32::try_from(unix_ns % 1_000_000_000).unwrap_or(0);
    k8s_openapi::jiff::Timestamp::new(secs, nanos)
        .ok()
        .map(Time)
}

/// The current time as an API `Time`.
pub fn now() -> Time {
    time_of(unix_ns()).unwrap_or(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
}

/// A CRI time (Unix ns) as a monotonic instant (now, if it lies in the future).
pub fn instant_of(unix_ns_then: i64) -> Instant {
    let ago =
        Duration::from_nanos(u64::try_from(unix_ns().saturating_sub(unix_ns_then)).unwrap_or(0));
    Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)
}

/// The origin of the agent's shared ticks: the first time one is asked for.
pub fn tick_origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// The first tick of `origin + k · tick` at or after `at` (`at` itself when
/// it lies before `origin` or `tick` is zero).
pub fn on_tick(origin: Instant, at: Instant, tick: Duration) -> Instant {
    if tick.is_zero() || at <= origin {
        return at;
    }
    let ticks = (at - origin).as_nanos().div_ceil(tick.as_nanos());
    u32::try_from(ticks)
        .ok()
        .and_then(|t| tick.checked_mul(t))
        .map_or(at, |d| origin + d)
}

/// The next shared tick of `period` after now. Periodic work waits for it
/// rather than for "now + period", so every timer whose period is a whole
/// number of seconds fires at the same instants: an idle agent wakes once
/// for all of them, and its wake-ups were most of its CPU.
pub fn next_tick(period: Duration) -> Instant {
    on_tick(
        tick_origin(),
        Instant::now() + Duration::from_nanos(1),
        period,
    )
}

/// A periodic timer on the shared ticks ([`next_tick`]). Its first tick
/// completes at once, as `tokio::time::interval`'s; a tick that could not be
/// taken in time is skipped, so later ones stay on the shared instants.
#[derive(Debug)]
pub struct Ticks {
    immediate: bool,
    interval: tokio::time::Interval,
}

impl Ticks {
    /// Ticks every `period`.
    pub fn every(period: Duration) -> Self {
        let mut interval = tokio::time::interval_at(next_tick(period), period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        Self {
            immediate: true,
            interval,
        }
    }

    /// Completes at the next tick (cancel-safe).
    pub async fn tick(&mut self) {
        if std::mem::take(&mut self.immediate) {
            return;
        }
        self.interval.tick().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_fall_on_the_shared_ticks() {
        let origin = Instant::now();
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(on_tick(origin, origin + ms(61_200), s(1)), origin + s(62));
        assert_eq!(on_tick(origin, origin + s(75), s(1)), origin + s(75));
        // Two timers due within the same second fire together.
        assert_eq!(
            on_tick(origin, origin + ms(80_010), s(1)),
            on_tick(origin, origin + ms(80_990), s(1))
        );
        // A 2 s period's ticks are among a 1 s period's.
        assert_eq!(on_tick(origin, origin + ms(3_100), s(2)), origin + s(4));
        // Nothing before the origin moves; a zero tick moves nothing.
        assert_eq!(on_tick(origin + s(5), origin, s(1)), origin);
        assert_eq!(
            on_tick(origin, origin + ms(1_500), s(0)),
            origin + ms(1_500)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ticks_come_at_once_then_on_the_shared_instants() {
        let origin = tick_origin();
        let period = Duration::from_secs(2);
        tokio::time::advance(Duration::from_millis(700)).await;
        let mut ticks = Ticks::every(period);
        let before = Instant::now();
        ticks.tick().await;
        assert_eq!(Instant::now(), before);
        for _ in 0..3 {
            ticks.tick().await;
            // tokio's timer wheel fires in whole milliseconds of its own start.
            let off = (Instant::now() - origin).as_nanos() % period.as_nanos();
            let ms = Duration::from_millis(1).as_nanos();
            assert!(
                off < ms || period.as_nanos() - off < ms,
                "{off} ns off a tick"
            );
        }
    }
}
