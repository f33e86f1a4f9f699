//! OOM diagnostics, pod timelines and Kubernetes-style events kept by the agent.
//!
//! The kernel's OOM record (victim, RSS, the memory limit it hit, time) is
//! kept here and attached to a Warning event about the pod; the container's
//! `OOMKilled` reason in the pod status comes from the kernel's exit record of
//! its init (design invariant 1, revised), not from here. `/events`,
//! `/debug/oom` and `/debug/pods/…/timeline` serve these (and `evlet diag`
//! reads them); the API-server mode also posts the events.
//!
//! Map: [`timeline`] keeps each pod's timeline (pure); [`memcg`] reads and
//! decides which cgroup level's memory limit an OOM kill hit; [`store`] writes
//! OOM records and timelines under `<root-dir>/diag` so they survive a restart.

pub mod memcg;
pub mod store;
pub mod timeline;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

pub use timeline::Source;

/// How many records and events are kept (oldest dropped first).
pub const KEEP: usize = 1000;

/// What the kernel told about one OOM kill.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OomRecord {
    /// Pod namespace (empty if the cgroup was not a pod's).
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Pod UID.
    pub pod_uid: String,
    /// Container name (empty if unknown).
    pub container: String,
    /// Container ID.
    pub container_id: String,
    /// Victim process ID (host PID namespace) and thread ID.
    pub pid: u32,
    /// Victim thread ID.
    pub tid: u32,
    /// Victim command.
    pub comm: String,
    /// cgroup v2 ID of the victim.
    pub cgroup_id: u64,
    /// Anonymous RSS (KiB), if the kernel reports it.
    pub anon_rss_kb: Option<u64>,
    /// File RSS (KiB).
    pub file_rss_kb: Option<u64>,
    /// Shared-memory RSS (KiB).
    pub shmem_rss_kb: Option<u64>,
    /// Total VM (KiB).
    pub total_vm_kb: Option<u64>,
    /// `oom_score_adj` of the victim.
    pub oom_score_adj: i32,
    /// Whether the victim was the container's init (its death ends the
    /// container) or another of its processes (`None`: init not known).
    #[serde(default)]
    pub victim_is_init: Option<bool>,
    /// The level whose memory limit was hit (`container`, `pod`, `qos`,
    /// `node`), if the counters tell.
    #[serde(default)]
    pub limit_hit: Option<String>,
    /// That level's memory limit in bytes.
    #[serde(default)]
    pub memcg_limit_bytes: Option<u64>,
    /// Every level's limit and failure counter when the kill was seen.
    #[serde(default)]
    pub levels: Vec<memcg::Level>,
    /// When (RFC 3339).
    pub time: String,
}

impl OomRecord {
    /// A one-line description for event messages.
    pub fn message(&self) -> String {
        let rss = match (self.anon_rss_kb, self.file_rss_kb, self.total_vm_kb) {
            (Some(a), Some(f), Some(t)) => {
                format!(", anon-rss {a} KiB, file-rss {f} KiB, total-vm {t} KiB")
            }
            _ => String::new(),
        };
        let limit = match (&self.limit_hit, self.memcg_limit_bytes) {
            (Some(level), Some(bytes)) => format!(", {level} memory limit {bytes} bytes hit"),
            (Some(level), None) => format!(", {level} memory limit hit"),
            _ => String::new(),
        };
        let victim = match self.victim_is_init {
            Some(true) => " (the container's init)",
            Some(false) => " (not the container's init)",
            None => "",
        };
        format!(
            "container {} OOM-killed: pid {} ({}){victim}{rss}{limit}, oom_score_adj {}",
            if self.container.is_empty() {
                "?"
            } else {
                &self.container
            },
            self.pid,
            self.comm,
            self.oom_score_adj
        )
    }
}

/// A Kubernetes-style event about a pod (or, with `node`, about the node).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// About the node (`pod` and `podUid` hold its name), not a pod.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub node: bool,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Upstream reason (`OOMKilling`, `BackOff`, ...).
    pub reason: String,
    /// Human-readable details.
    pub message: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Pod UID.
    pub pod_uid: String,
    /// The container it is about, if one (`involvedObject.fieldPath`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Where the container is in the spec: `spec.containers{name}`, or
    /// `spec.initContainers{name}` for an init container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field_path: Option<String>,
    /// When (RFC 3339).
    pub time: String,
}

impl Event {
    /// An event about `pod` (and its container `container`) happening now.
    pub fn about(
        pod: &k8s_openapi::api::core::v1::Pod,
        container: Option<&str>,
        kind: &str,
        reason: &str,
        message: String,
    ) -> Self {
        Self {
            node: false,
            kind: kind.into(),
            reason: reason.into(),
            message,
            namespace: crate::pod::namespace(pod).into(),
            pod: crate::pod::name(pod).into(),
            pod_uid: crate::pod::uid(pod).0,
            container: container.map(str::to_owned),
            field_path: container.map(|c| field_path(pod, c)),
            time: crate::clock::now().0.to_string(),
        }
    }

    /// An event about the node `node` happening now (upstream's node events go
    /// to namespace `default`, the node's name as its UID).
    pub fn about_node(node: &str, kind: &str, reason: &str, message: String) -> Self {
        Self {
            node: true,
            kind: kind.into(),
            reason: reason.into(),
            message,
            namespace: "default".into(),
            pod: node.into(),
            pod_uid: node.into(),
            container: None,
            field_path: None,
            time: crate::clock::now().0.to_string(),
        }
    }
}

/// The container's `involvedObject.fieldPath` as upstream writes it.
fn field_path(pod: &k8s_openapi::api::core::v1::Pod, container: &str) -> String {
    let spec = pod.spec.as_ref();
    let init = spec
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == container));
    let ephemeral = spec
        .and_then(|s| s.ephemeral_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == container));
    let list = if init {
        "initContainers"
    } else if ephemeral {
        "ephemeralContainers"
    } else {
        "containers"
    };
    format!("spec.{list}{{{container}}}")
}

/// Records Kubernetes-style events (the syncer's Pulled, Created, Started,
/// Killing, BackOff; the prober's Unhealthy). [`Diagnostics`] implements it:
/// the local `/events` list, forwarded to the API server in API-server mode.
pub trait EventRecorder: Send + Sync + std::fmt::Debug {
    /// Records `event`. Never blocks and never fails: a recorder that cannot
    /// keep up drops events, it does not slow the caller down.
    fn record(&self, event: Event);

    /// Adds to the timeline of the pod `uid` (`evlet diag pod`). Never blocks
    /// on IO; a recorder without timelines ignores it.
    fn trace(&self, uid: &str, source: Source, what: String) {
        let _ = (uid, source, what);
    }

    /// Names the timeline of the pod `uid`.
    fn name_pod(&self, uid: &str, namespace: &str, name: &str) {
        let _ = (uid, namespace, name);
    }

    /// Notes that the pod `uid`'s container `id` is named `name`.
    fn name_container(&self, uid: &str, id: &str, name: &str) {
        let _ = (uid, id, name);
    }
}

impl EventRecorder for Diagnostics {
    fn record(&self, event: Event) {
        self.event(event);
    }

    fn trace(&self, uid: &str, source: Source, what: String) {
        Diagnostics::trace(self, uid, source, what);
    }

    fn name_pod(&self, uid: &str, namespace: &str, name: &str) {
        crate::lock::lock(&self.timelines).name(uid, namespace, name);
    }

    fn name_container(&self, uid: &str, id: &str, name: &str) {
        crate::lock::lock(&self.timelines).name_container(uid, id, name);
    }
}

/// The agent's diagnostic records.
#[derive(Debug, Default)]
pub struct Diagnostics {
    ooms: Mutex<VecDeque<OomRecord>>,
    events: Mutex<VecDeque<Event>>,
    timelines: Mutex<timeline::Timelines>,
    /// Memory-limit failure counters at the last OOM kill, by cgroup path.
    memcg_seen: Mutex<HashMap<String, u64>>,
    /// Where events also go (the API server's event recorder), if joined.
    sink: Option<tokio::sync::mpsc::Sender<Event>>,
    /// `<root-dir>/diag`, where [`Diagnostics::flush`] writes.
    dir: Option<PathBuf>,
    /// OOM records changed since the last flush.
    ooms_dirty: AtomicBool,
}

fn push<T>(q: &Mutex<VecDeque<T>>, v: T) {
    let mut q = crate::lock::lock(q);
    if q.len() >= KEEP {
        q.pop_front();
    }
    q.push_back(v);
}

impl Diagnostics {
    /// Records kept here, and events also sent to `sink` (API-server mode).
    pub fn new(sink: Option<tokio::sync::mpsc::Sender<Event>>) -> Self {
        Self {
            sink,
            ..Self::default()
        }
    }

    /// Records kept here and, by [`Diagnostics::flush`], in `dir`; what an
    /// earlier run left there is loaded.
    pub fn durable(sink: Option<tokio::sync::mpsc::Sender<Event>>, dir: PathBuf) -> Self {
        let (ooms, pods) = store::load(&dir);
        if !ooms.is_empty() || !pods.is_empty() {
            tracing::info!(dir = %dir.display(), ooms = ooms.len(), pods = pods.len(), "loaded the diagnostics of the last run");
        }
        Self {
            sink,
            ooms: Mutex::new(ooms.into_iter().rev().take(KEEP).rev().collect()),
            timelines: Mutex::new(timeline::Timelines::from_loaded(pods)),
            dir: Some(dir),
            ..Self::default()
        }
    }

    /// Whether [`Self::flush`] has anything to write.
    pub fn unflushed(&self) -> bool {
        self.dir.is_some()
            && (self.ooms_dirty.load(Ordering::Relaxed)
                || crate::lock::lock(&self.timelines).has_changes())
    }

    /// Writes what changed since the last flush (blocking IO: call it off
    /// the runtime's threads). Failures are logged; records stay in memory.
    pub fn flush(&self) {
        let Some(dir) = &self.dir else { return };
        if self.ooms_dirty.swap(false, Ordering::Relaxed)
            && let Err(e) = store::save_ooms(dir, &self.ooms())
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot write the OOM records");
        }
        let (changed, dropped) = crate::lock::lock(&self.timelines).take_changes();
        for pod in &changed {
            if let Err(e) = store::save_pod(dir, pod) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot write a pod timeline");
                break;
            }
        }
        for uid in dropped {
            store::remove_pod(dir, &uid);
        }
    }

    /// Adds to the timeline of the pod `uid`, now.
    pub fn trace(&self, uid: &str, source: Source, what: String) {
        crate::lock::lock(&self.timelines).record(uid, crate::clock::unix_ns(), source, what);
    }

    /// Counts a single-pod relist of `uid`.
    pub fn relisted(&self, uid: &str) {
        crate::lock::lock(&self.timelines).relisted(uid);
    }

    /// The timeline of `namespace/name`.
    pub fn timeline(&self, namespace: &str, name: &str) -> Option<timeline::PodTimeline> {
        crate::lock::lock(&self.timelines)
            .find(namespace, name)
            .cloned()
    }

    /// The timeline of the pod `uid`.
    pub fn timeline_of(&self, uid: &str) -> Option<timeline::PodTimeline> {
        crate::lock::lock(&self.timelines).get(uid).cloned()
    }

    /// The namespace, name and container name the timelines know for the pod
    /// `uid` and its container `id` (empty where unknown).
    pub fn identify(&self, uid: &str, id: &str) -> Option<(String, String, String)> {
        crate::lock::lock(&self.timelines).identify(uid, id)
    }

    /// Single-pod relists per pod with a timeline.
    pub fn pod_relists(&self) -> Vec<(String, u64)> {
        crate::lock::lock(&self.timelines).relists()
    }

    /// Which level of `levels` an OOM kill hit, from the failure counters
    /// since the last kill.
    pub fn limit_hit(&self, levels: &[memcg::Level]) -> Option<memcg::Level> {
        memcg::hit(levels, &mut crate::lock::lock(&self.memcg_seen))
    }

    /// Records an OOM kill and the Warning event about it.
    pub fn oom(&self, record: OomRecord) {
        tracing::warn!(pod = %format!("{}/{}", record.namespace, record.pod), container = %record.container, "{}", record.message());
        self.event(Event {
            node: false,
            kind: "Warning".into(),
            reason: "OOMKilling".into(),
            message: record.message(),
            namespace: record.namespace.clone(),
            pod: record.pod.clone(),
            pod_uid: record.pod_uid.clone(),
            container: Some(record.container.clone()),
            field_path: Some(format!("spec.containers{{{}}}", record.container)),
            time: record.time.clone(),
        });
        self.trace(&record.pod_uid, Source::Kernel, record.message());
        push(&self.ooms, record);
        self.ooms_dirty.store(true, Ordering::Relaxed);
    }

    /// Records an event (and hands it to the API recorder, if any; when that
    /// one is backed up the event stays local only).
    pub fn event(&self, event: Event) {
        if let Some(sink) = &self.sink {
            let _ = sink.try_send(event.clone());
        }
        self.trace(
            &event.pod_uid,
            Source::Event,
            format!("{} {}: {}", event.kind, event.reason, event.message),
        );
        push(&self.events, event);
    }

    /// Every kept OOM record, oldest first.
    pub fn ooms(&self) -> Vec<OomRecord> {
        crate::lock::lock(&self.ooms).iter().cloned().collect()
    }

    /// Every kept event, oldest first.
    pub fn events(&self) -> Vec<Event> {
        crate::lock::lock(&self.events).iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_about_init_containers_point_at_init_containers() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"initContainers": [{"name": "setup"}], "containers": [{"name": "app"}]}
        }))
        .expect("pod");
        let path = |c| Event::about(&pod, Some(c), "Normal", "Started", String::new()).field_path;
        assert_eq!(path("setup").as_deref(), Some("spec.initContainers{setup}"));
        assert_eq!(path("app").as_deref(), Some("spec.containers{app}"));
        assert_eq!(
            Event::about(&pod, None, "Normal", "Scheduled", String::new()).field_path,
            None
        );
    }
}
