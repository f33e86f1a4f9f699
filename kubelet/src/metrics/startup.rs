//! `kubelet_pod_start_sli_duration_seconds`, as upstream's pod startup latency
//! tracker measures it: from the pod's creation to every regular container
//! running, minus the time spent pulling images and running init containers.
//! Only API pods first seen before they started are measured (a pod found
//! running after an agent restart is not); static pods are not.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use prometheus::Histogram;

use crate::lock::lock;

/// Per-pod pull windows, and the SLI histogram they feed.
#[derive(Debug)]
pub struct StartupTracker {
    /// The SLI histogram.
    pub sli: Histogram,
    pods: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    /// Unix ns of the first pull's start and the last pull's end.
    first_pull: Option<i64>,
    last_pulled: Option<i64>,
    /// Measured already, or not to be measured.
    done: bool,
}

impl StartupTracker {
    pub(super) fn new(sli: Histogram) -> Self {
        Self {
            sli,
            pods: Mutex::new(HashMap::new()),
        }
    }

    /// The pod's worker saw it for the first time.
    pub fn seen(&self, pod: &Pod) {
        let eligible = crate::pod::annotations(pod)
            .get(crate::pod::labels::CONFIG_SOURCE)
            .is_some_and(|s| s == "api")
            && pod.status.as_ref().is_none_or(|s| s.start_time.is_none());
        lock(&self.pods)
            .entry(crate::pod::uid(pod).0)
            .or_insert(Entry {
                done: !eligible,
                ..Entry::default()
            });
    }

    /// A pull for the pod `uid` starts at `now` (Unix ns).
    pub fn pulling(&self, uid: &str, now: i64) {
        if let Some(e) = lock(&self.pods).get_mut(uid) {
            e.first_pull.get_or_insert(now);
        }
    }

    /// A pull for the pod `uid` ended at `now`.
    pub fn pulled(&self, uid: &str, now: i64) {
        if let Some(e) = lock(&self.pods).get_mut(uid) {
            e.last_pulled = Some(now);
        }
    }

    /// The pod's status was published at `now` (Unix ns): observes the SLI
    /// once, when every regular container runs.
    pub fn published(&self, pod: &Pod, status: &PodStatus, now: i64) {
        let uid = crate::pod::uid(pod).0;
        let mut pods = lock(&self.pods);
        let Some(entry) = pods.get_mut(&uid).filter(|e| !e.done) else {
            return;
        };
        if let Some(seconds) = sli_seconds(pod, status, *entry, now) {
            entry.done = true;
            drop(pods);
            self.sli.observe(seconds);
        }
    }

    /// The pod is gone.
    pub fn forget(&self, uid: &str) {
        lock(&self.pods).remove(uid);
    }
}

/// Unix ns of an API time.
fn ns(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> i64 {
    i64::try_from(t.0.as_nanosecond()).unwrap_or(0)
}

/// The SLI of `pod` if `status` shows every regular container running.
fn sli_seconds(pod: &Pod, status: &PodStatus, entry: Entry, now: i64) -> Option<f64> {
    let created = ns(pod.metadata.creation_timestamp.as_ref()?);
    let wanted = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    let running = statuses
        .iter()
        .filter(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .is_some_and(|r| r.started_at.is_some())
        })
        .count();
    if wanted == 0 || running < wanted {
        return None;
    }
    let pulling = match (entry.first_pull, entry.last_pulled) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => 0,
    };
    // Init containers ran one after another: first start to last finish.
    let init: Vec<_> = status
        .init_container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .filter_map(|t| Some((ns(t.started_at.as_ref()?), ns(t.finished_at.as_ref()?))))
        .collect();
    let init_ns = match (
        init.iter().map(|(s, _)| *s).min(),
        init.iter().map(|(_, f)| *f).max(),
    ) {
        (Some(s), Some(f)) if f > s => f - s,
        _ => 0,
    };
    let total = now
        .saturating_sub(created)
        .saturating_sub(pulling)
        .saturating_sub(init_ns);
    Some(total.max(0) as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(source: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "d", "uid": "u1",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {"kubernetes.io/config.source": source}},
            "spec": {"containers": [{"name": "a", "image": "i"}]}
        }))
        .expect("pod")
    }

    fn running() -> PodStatus {
        serde_json::from_value(serde_json::json!({
            "initContainerStatuses": [{"name": "init", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "startedAt": "2026-01-01T00:00:03Z", "finishedAt": "2026-01-01T00:00:05Z"}}}],
            "containerStatuses": [{"name": "a", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-01-01T00:00:06Z"}}}]
        }))
        .expect("status")
    }

    const T0: i64 = 1_767_225_600_000_000_000;
    const S: i64 = 1_000_000_000;

    fn tracker() -> StartupTracker {
        StartupTracker::new(
            Histogram::with_opts(prometheus::HistogramOpts::new("t", "t")).expect("histogram"),
        )
    }

    #[test]
    fn pulls_and_init_containers_are_taken_out_once() {
        let t = tracker();
        let p = pod("api");
        t.seen(&p);
        t.pulling("u1", T0 + S);
        t.pulled("u1", T0 + 2 * S);
        t.published(&p, &PodStatus::default(), T0 + 3 * S);
        assert_eq!(t.sli.get_sample_count(), 0, "not running yet");
        t.published(&p, &running(), T0 + 7 * S);
        t.published(&p, &running(), T0 + 9 * S);
        assert_eq!(t.sli.get_sample_count(), 1);
        // 7 s since creation, minus 1 s of pulling and 2 s of init containers.
        assert!((t.sli.get_sample_sum() - 4.0).abs() < 1e-9);
    }

    #[test]
    fn static_pods_and_pods_already_started_are_not_measured() {
        let t = tracker();
        let p = pod("file");
        t.seen(&p);
        t.published(&p, &running(), T0 + 7 * S);
        let mut started = pod("api");
        started.status = Some(PodStatus {
            start_time: Some(crate::clock::now()),
            ..Default::default()
        });
        t.seen(&started);
        t.published(&started, &running(), T0 + 7 * S);
        assert_eq!(t.sli.get_sample_count(), 0);
    }
}
