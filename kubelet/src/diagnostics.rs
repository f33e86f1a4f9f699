//! OOM diagnostics and Kubernetes-style events kept by the agent.
//!
//! The kernel's OOM record (victim, RSS, time) is kept here and attached to a
//! Warning event about the pod; the container's `OOMKilled` reason in the pod
//! status comes from the kernel's exit record of its init (design invariant 1,
//! revised), not from here. `/events` and `/debug/oom` serve these; the
//! API-server mode also posts the events.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

/// How many records and events are kept (oldest dropped first).
pub const KEEP: usize = 1000;

/// What the kernel told about one OOM kill.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
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
        format!(
            "container {} OOM-killed: pid {} ({}){rss}, oom_score_adj {}",
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

/// A Kubernetes-style event about a pod.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Event {
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
}

impl EventRecorder for Diagnostics {
    fn record(&self, event: Event) {
        self.event(event);
    }
}

/// The agent's diagnostic records.
#[derive(Debug, Default)]
pub struct Diagnostics {
    ooms: Mutex<VecDeque<OomRecord>>,
    events: Mutex<VecDeque<Event>>,
    /// Where events also go (the API server's event recorder), if joined.
    sink: Option<tokio::sync::mpsc::Sender<Event>>,
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

    /// Records an OOM kill and the Warning event about it.
    pub fn oom(&self, record: OomRecord) {
        tracing::warn!(pod = %format!("{}/{}", record.namespace, record.pod), container = %record.container, "{}", record.message());
        self.event(Event {
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
        push(&self.ooms, record);
    }

    /// Records an event (and hands it to the API recorder, if any; when that
    /// one is backed up the event stays local only).
    pub fn event(&self, event: Event) {
        if let Some(sink) = &self.sink {
            let _ = sink.try_send(event.clone());
        }
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
