//! The hint-driven dispatcher of the `ebpf` and `cri-events` modes.
//!
//! One task owns the [`Relister`]. In priority order it runs: a full relist when
//! one is needed (start, lost events, a reader or runtime restart) or due (the
//! safety period), then per-pod relists of hinted pods that are not in a SyncPod.
//! A failed relist is retried with backoff and is followed by a full relist once
//! the runtime answers again. Changes that a *periodic* full relist finds without
//! a preceding hint are counted as missed events (upstream's unbuilt
//! `kube_pod_missed_events`).
//!
//! The kernel is faster than the runtime: a container's init has exited, but
//! containerd has not yet reaped it and still says RUNNING. So a hint with a
//! kernel origin *expects* a change: while the pod's relist shows none, it is
//! re-read after 1, 2, 4 … ms (capped at 5 ms) for up to 5 s.
//!
//! A pod worker waiting for a status newer than its last sync (a resync, an
//! update) does not need a CRI read when nothing changed: in `ebpf` mode the
//! reader drains the ring buffer on request ([`Quiet`]), and a pod with no hint,
//! no expectation and no SyncPod running after that has its entry vouched for
//! as of the drain. At 500 idle pods this replaces ~8 re-reads a second
//! (one per pod per 30–90 s resync) with none.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ebpf::Quiet;
use super::hints::{Hints, Next};
use super::relist::Relister;
use crate::metrics::Metrics;

const PERIODIC: &str = "periodic safety relist";
/// How long a hinted pod is re-read while the runtime has not caught up.
const EXPECT_FOR: Duration = Duration::from_secs(5);
/// The longest gap between those re-reads. containerd shows an exit 40–70 ms
/// after the kernel (it deletes the task first); 5 ms keeps the detection
/// within a few ms of that, for ~3 CRI calls per re-read.
const EXPECT_STEP: Duration = Duration::from_millis(5);
/// How long a quiet proof may take before the pods are relisted instead.
const PROVE_FOR: Duration = Duration::from_secs(1);

/// A hint whose change the runtime has not shown yet.
#[derive(Debug, Clone, Copy)]
struct Expect {
    origin: u64,
    since: Instant,
    due: Instant,
    attempt: u32,
}

/// Runs until `cancel`; a full relist runs first. With `quiet` (the `ebpf`
/// mode), a worker's wait for a fresh status is answered by a kernel quiet
/// proof when the pod has no hint; otherwise, and in `cri-events` mode, the pod
/// is relisted.
pub async fn run(
    mut relister: Relister,
    hints: Arc<Hints>,
    quiet: Option<Arc<Quiet>>,
    period: Duration,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut next_full = Instant::now() + period;
    let mut failures: u32 = 0;
    let mut expecting: std::collections::BTreeMap<crate::pod::PodUid, Expect> = Default::default();
    hints.full("start");
    loop {
        if cancel.is_cancelled() {
            return;
        }
        let now = Instant::now();
        let due = expecting
            .iter()
            .find(|(_, e)| e.due <= now)
            .map(|(uid, e)| (uid.clone(), e.origin));
        let work = if now >= next_full {
            Next::Full(PERIODIC.into())
        } else if let Some((uid, origin)) = due {
            Next::Pod(uid, Some(origin))
        } else {
            hints.next()
        };
        let failed = match work {
            Next::Full(reason) => {
                let hinted = hints.take_hinted();
                let count_missed = reason == PERIODIC;
                match relister.relist_all(count_missed.then_some(&hinted)).await {
                    Ok(report) => {
                        next_full = Instant::now() + period;
                        if !count_missed {
                            tracing::info!(%reason, changed = report.changed.len(), "full relist");
                        }
                        false
                    }
                    Err(err) => {
                        tracing::warn!(%reason, %err, "full relist failed; retrying");
                        hints.full(reason);
                        true
                    }
                }
            }
            Next::Pod(uid, origin) => match relister.relist_pod(&uid).await {
                Ok(changed) => {
                    tracing::debug!(pod = %uid, changed, "pod relisted");
                    match origin {
                        Some(origin) if changed => {
                            expecting.remove(&uid);
                            let latency = evlet_ebpf::monotonic_ns().saturating_sub(origin);
                            metrics.pleg_hint_latency.observe(latency as f64 / 1e9);
                        }
                        Some(origin) => {
                            let now = Instant::now();
                            let e = expecting.entry(uid.clone()).or_insert(Expect {
                                origin,
                                since: now,
                                due: now,
                                attempt: 0,
                            });
                            e.origin = e.origin.min(origin);
                            e.attempt += 1;
                            e.due =
                                now + Duration::from_millis(1 << e.attempt.min(5)).min(EXPECT_STEP);
                            if now.duration_since(e.since) > EXPECT_FOR {
                                tracing::debug!(pod = %uid, "a hint brought no change in the runtime");
                                expecting.remove(&uid);
                            }
                        }
                        None => {}
                    }
                    false
                }
                Err(err) => {
                    hints.retry(uid, origin);
                    if err.is_retryable() {
                        // The runtime went away: once it answers, re-read everything.
                        hints.full(format!("runtime unavailable: {err}"));
                    }
                    true
                }
            },
            Next::Fresh(mut wanted) => {
                // A pod with a relist coming (hint, expectation, SyncPod end or
                // full relist) needs nothing here; checked again after the proof,
                // which may bring new hints.
                let pending =
                    |uid: &crate::pod::PodUid| expecting.contains_key(uid) || !hints.settled(uid);
                wanted.retain(|(uid, _)| !pending(uid));
                let proven = match &quiet {
                    Some(q) if !wanted.is_empty() => q.prove(PROVE_FOR).await,
                    _ => None,
                };
                for (uid, since) in wanted {
                    if pending(&uid) {
                        continue;
                    }
                    if proven.is_some_and(|at| at > since && relister.touch(&uid, at)) {
                        metrics.pleg_quiet_proofs.inc();
                    } else {
                        hints.pod(uid, None);
                    }
                }
                false
            }
            Next::Idle => {
                let wake = expecting
                    .values()
                    .map(|e| e.due)
                    .min()
                    .map_or(next_full, |d| d.min(next_full));
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = hints.changed() => {}
                    () = tokio::time::sleep_until(wake) => {}
                }
                false
            }
        };
        if failed {
            failures += 1;
            let backoff = Duration::from_millis(100 << failures.min(6)).min(Duration::from_secs(5));
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
        } else {
            failures = 0;
        }
    }
}
