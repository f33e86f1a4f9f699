//! A pod as the agent under test shows it: its status polled
//! ([`Endpoint::pod`]), its timeline (`/debug/pods/<ns>/<name>/timeline`),
//! and the CPU waits that tell which side a slow sample waited on.

use std::time::{Duration, Instant, SystemTime};

use crate::report::{Run, SLOW_MS};
use crate::{Agent, AgentKind, Endpoint, run_delay};

/// The first container status of a pod JSON.
pub fn first_container(pod: &serde_json::Value) -> &serde_json::Value {
    &pod["status"]["containerStatuses"][0]
}

/// Polls one pod every `every` until `done` holds; when it did, or `None`
/// after `limit`.
pub async fn poll_pod(
    http: &Endpoint,
    name: &str,
    every: Duration,
    limit: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(pod)) = http.pod(name).await
            && done(&pod)
        {
            return Some(Instant::now());
        }
        tokio::time::sleep(every).await;
    }
    None
}

/// How long the agent's threads and the bench's own had waited for a CPU
/// (schedstat `run_delay`, summed over threads), to tell which side a slow
/// status waited on: a poll is answered only when both get a CPU.
#[derive(Debug, Clone, Copy)]
pub struct Waits {
    agent: Option<Duration>,
    bench: Option<Duration>,
}

impl Waits {
    /// The waits so far of `agent` (a PID) and of this process.
    pub fn now(agent: u32) -> Self {
        Self {
            agent: run_delay(agent).ok(),
            bench: run_delay(std::process::id()).ok(),
        }
    }

    /// The waits from `self` to now.
    pub fn since(self, agent: u32) -> Self {
        let now = Self::now(agent);
        let d = |a: Option<Duration>, b: Option<Duration>| Some(b?.saturating_sub(a?));
        Self {
            agent: d(self.agent, now.agent),
            bench: d(self.bench, now.bench),
        }
    }
}

/// Keeps the timeline of a kill (or OOM kill) whose status took `took`,
/// from `at` (the kill) to the status, when it was slower than [`SLOW_MS`]:
/// which part of the agent the time went to, and how long (`waited`) the
/// agent's threads and the bench's waited for a CPU meanwhile.
pub async fn slow_timeline(
    agent: &Agent,
    name: &str,
    what: &str,
    at: SystemTime,
    took: Duration,
    waited: Waits,
    run: &mut Run,
) {
    let ms = took.as_secs_f64() * 1000.0;
    // Upstream kubelet keeps no timeline to say where the time went.
    if ms <= SLOW_MS || agent.kind == AgentKind::Upstream {
        return;
    }
    let start = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let end = start + took.as_nanos() as i64 + 5_000_000;
    let entries = match agent.http.timeline(name).await {
        Ok(Some(t)) => t["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let ns = e["unixNs"].as_i64()?;
                (ns >= start - 1_000_000 && ns <= end).then(|| {
                    format!(
                        "{:+.1} {} {}",
                        (ns - start) as f64 / 1e6,
                        e["source"].as_str().unwrap_or("?"),
                        e["what"].as_str().unwrap_or("")
                    )
                })
            })
            .collect::<Vec<_>>()
            .join("; "),
        Ok(None) => "no timeline".to_owned(),
        Err(e) => format!("timeline: {e:#}"),
    };
    let ms_of = |d: Option<Duration>| {
        d.map_or("?".to_owned(), |d| {
            format!("{:.1}", d.as_secs_f64() * 1000.0)
        })
    };
    let waited = format!(
        "; meanwhile evlet's threads waited {} ms in all for a CPU, the bench's {} ms",
        ms_of(waited.agent),
        ms_of(waited.bench)
    );
    run.slow
        .push(format!("{what} {name} {ms:.1} ms: {entries}{waited}"));
}

/// The time (Unix ns) of the first entry of a pod's `timeline` from `source`
/// at or after `from` whose text passes `what`.
pub fn first_entry(
    timeline: &serde_json::Value,
    source: &str,
    from: u128,
    what: impl Fn(&str) -> bool,
) -> Option<u64> {
    timeline["entries"]
        .as_array()?
        .iter()
        .filter(|e| e["source"] == source && e["what"].as_str().is_some_and(&what))
        .filter_map(|e| u64::try_from(e["unixNs"].as_i64()?).ok())
        .find(|&ns| u128::from(ns) >= from)
}
