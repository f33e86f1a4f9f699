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
