//! The status manager: pod workers hand it every computed status; it sends
//! each pod's newest one as a strategic-merge patch of `pods/<name>/status`.
//!
//! * Versioned: a status is sent only if it differs from the last one sent, and
//!   only the newest version of a pod is ever sent (one sender task, in order).
//! * No regressions: once a terminal phase (Succeeded/Failed) was sent, a
//!   non-terminal status for that pod is dropped.
//! * Static pods report through their mirror pod (same namespace and name, the
//!   mirror's UID as precondition), once the mirror exists.
//! * Failures (outage, 429, 5xx) keep the status pending and are retried with
//!   backoff; everything pending is also re-checked every 10 s (upstream's
//!   `syncPeriod`).
//! * Reconciled: the pod watch tells it what the API server holds
//!   ([`pods::Observer`]); a status sent 10 s or more ago whose phase or
//!   conditions another writer changed since (the node lifecycle controller
//!   marks pods not Ready when their node stopped reporting) is sent again,
//!   as upstream's `needsReconcile`.
//! * Deleted API pods that finished terminating get the final `DELETE` with
//!   grace period 0 and a UID precondition.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus as V1PodStatus};
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::pods::{self, Mirrors};
use super::{delete_exactly, is_not_found};
use crate::backoff::Retry;
use crate::pod::{self, PodUid};

/// Upstream's status manager `syncPeriod`.
pub const SYNC_PERIOD: Duration = Duration::from_secs(10);

/// Where a pod's status goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    namespace: String,
    name: String,
    /// UID of the API object (the mirror pod for static pods), if known.
    uid: Option<String>,
}

#[derive(Debug)]
struct Entry {
    target: Target,
    /// Static pods report through their mirror.
    is_static: bool,
    status: V1PodStatus,
    version: u64,
    sent_version: u64,
    sent_terminal: bool,
    /// When a version was last sent.
    sent_at: Option<tokio::time::Instant>,
}

#[derive(Debug, Default)]
struct State {
    pods: BTreeMap<PodUid, Entry>,
    /// Final deletes due: pod UID → target.
    deletes: BTreeMap<PodUid, Target>,
    mirrors: BTreeMap<(String, String), String>,
    next_version: u64,
    /// What the API server holds of each pod's status, by the API object's UID.
    held: BTreeMap<String, Held>,
}

/// The status manager (shared by workers, the sync loop and its sender task).
#[derive(Debug, Default)]
pub struct StatusManager {
    state: Mutex<State>,
    wake: Notify,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    crate::lock::lock(m)
}

fn terminal(status: &V1PodStatus) -> bool {
    matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
}

/// The patch upstream's status manager sends: the UID as a precondition and
/// the whole status, with the order of its conditions.
///
/// Conditions merge by `type`, so a field a condition no longer has must be
/// sent as `null` or the API server keeps the old one: upstream's two-way
/// merge patch does that against the status it last saw. Here every
/// condition's `reason` and `message` are always present, `null` when
/// unset, so `Ready` turning `True` drops `ContainersNotReady` and its message.
pub fn patch_body(uid: &str, status: &V1PodStatus) -> serde_json::Value {
    let order: Vec<serde_json::Value> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| serde_json::json!({"type": c.type_}))
        .collect();
    let mut status = serde_json::to_value(status).unwrap_or_default();
    if let Some(conditions) = status
        .get_mut("conditions")
        .and_then(serde_json::Value::as_array_mut)
    {
        for c in conditions
            .iter_mut()
            .filter_map(serde_json::Value::as_object_mut)
        {
            for field in ["reason", "message"] {
                c.entry(field).or_insert(serde_json::Value::Null);
            }
        }
    }
    if let Some(obj) = status.as_object_mut() {
        obj.insert("$setElementOrder/conditions".into(), order.into());
    }
    serde_json::json!({"metadata": {"uid": uid}, "status": status})
}

/// What reconciliation compares of a status the API server holds: the
/// phase and each condition's type and status.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    phase: Option<String>,
    conditions: Vec<(String, String)>,
}

impl Held {
    fn of(status: &V1PodStatus) -> Self {
        Self {
            phase: status.phase.clone(),
            conditions: status
                .conditions
                .iter()
                .flatten()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect(),
        }
    }

    /// Whether what the kubelet owns of `sent` differs here: the phase, or
    /// the status of a condition it sent.
    fn differs(&self, sent: &V1PodStatus) -> bool {
        self.phase != sent.phase
            || sent.conditions.iter().flatten().any(|c| {
                self.conditions
                    .iter()
                    .find(|(t, _)| *t == c.type_)
                    .is_none_or(|(_, s)| *s != c.status)
            })
    }
}

impl State {
    /// Marks for sending again each status sent at least [`SYNC_PERIOD`]
    /// ago (the watch has shown the patch by then) that the API server no
    /// longer holds.
    fn reconcile(&mut self) {
        let State {
            pods,
            held,
            next_version,
            ..
        } = self;
        for (uid, e) in pods.iter_mut() {
            if e.version > e.sent_version || e.sent_at.is_none_or(|at| at.elapsed() < SYNC_PERIOD) {
                continue;
            }
            let Some(held) = e.target.uid.as_deref().and_then(|t| held.get(t)) else {
                continue;
            };
            if held.differs(&e.status) {
                tracing::debug!(pod = %uid, held = ?held, "the API server's status of the pod differs from the one sent; sending it again");
                *next_version += 1;
                e.version = *next_version;
            }
        }
    }
}

impl pods::Observer for StatusManager {
    fn seen(&self, pod: &Pod) {
        if let (Some(uid), Some(status)) = (&pod.metadata.uid, &pod.status) {
            lock(&self.state).held.insert(uid.clone(), Held::of(status));
        }
    }

    fn gone(&self, uid: &str) {
        lock(&self.state).held.remove(uid);
    }

    fn relisted(&self, pods: &mut dyn Iterator<Item = &Pod>) {
        lock(&self.state).held = pods
            .filter_map(|p| Some((p.metadata.uid.clone()?, Held::of(p.status.as_ref()?))))
            .collect();
    }
}

impl crate::workers::StatusSink for StatusManager {
    fn set(&self, pod: &Pod, status: &V1PodStatus) {
        StatusManager::set(self, pod, status);
    }
}

impl StatusManager {
    /// A new manager.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Records `pod`'s newest computed status. Pods of the API source and static
    /// pods (through their mirror) are reported; others are ignored.
    pub fn set(&self, pod: &Pod, status: &V1PodStatus) {
        let source = pod::annotations(pod)
            .get(crate::pod::labels::CONFIG_SOURCE)
            .cloned()
            .unwrap_or_default();
        let is_static = pod::is_static(pod);
        if source != "api" && !is_static {
            return;
        }
        let uid = pod::uid(pod);
        let mut state = lock(&self.state);
        let key = (pod::namespace(pod).to_owned(), pod::name(pod).to_owned());
        let target_uid = if is_static {
            state.mirrors.get(&key).cloned()
        } else {
            Some(uid.0.clone())
        };
        let target = Target {
            namespace: key.0,
            name: key.1,
            uid: target_uid,
        };
        state.next_version += 1;
        let version = state.next_version;
        match state.pods.get_mut(&uid) {
            Some(e) if e.status == *status && e.target == target => return,
            Some(e) => {
                e.status = status.clone();
                e.target = target;
                e.version = version;
            }
            None => {
                state.pods.insert(
                    uid,
                    Entry {
                        target,
                        is_static,
                        status: status.clone(),
                        version,
                        sent_version: 0,
                        sent_terminal: false,
                        sent_at: None,
                    },
                );
            }
        }
        drop(state);
        self.wake.notify_one();
    }

    /// The mirror pods now on the API server (their UIDs are the targets of
    /// static pods' statuses). A new or recreated mirror gets the status again.
    pub fn set_mirrors(&self, mirrors: &Mirrors) {
        let mut state = lock(&self.state);
        state.mirrors = mirrors
            .iter()
            .filter_map(|(k, p)| p.metadata.uid.clone().map(|u| (k.clone(), u)))
            .collect();
        let State { pods, mirrors, .. } = &mut *state;
        let mut changed = false;
        for e in pods.values_mut().filter(|e| e.is_static) {
            let uid = mirrors
                .get(&(e.target.namespace.clone(), e.target.name.clone()))
                .cloned();
            if uid != e.target.uid {
                e.target.uid = uid;
                e.sent_version = 0;
                e.sent_terminal = false;
                changed = true;
            }
        }
        drop(state);
        if changed {
            self.wake.notify_one();
        }
    }

    /// The pod finished terminating after deletion: delete its API object
    /// (grace period 0, UID precondition) once its last status went out.
    pub fn delete(&self, pod: &Pod) {
        let uid = pod::uid(pod);
        lock(&self.state).deletes.insert(
            uid.clone(),
            Target {
                namespace: pod::namespace(pod).to_owned(),
                name: pod::name(pod).to_owned(),
                uid: Some(uid.0),
            },
        );
        self.wake.notify_one();
    }

    /// Forgets a pod that is gone from its source.
    pub fn forget(&self, uid: &PodUid) {
        lock(&self.state).pods.remove(uid);
    }

    /// Pods with a status not yet sent, and deletes due (for tests and `/healthz`).
    pub fn pending(&self) -> usize {
        let state = lock(&self.state);
        state
            .pods
            .values()
            .filter(|e| e.version > e.sent_version && e.target.uid.is_some())
            .count()
            + state.deletes.len()
    }

    /// Sends statuses and deletes until `shutdown`.
    pub async fn run(self: Arc<Self>, client: kube::Client, shutdown: CancellationToken) {
        let mut backoff = Retry::new(Duration::from_millis(500), Duration::from_secs(30));
        loop {
            let failed = self.sync_once(&client).await;
            let delay = backoff.after(failed, SYNC_PERIOD);
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.wake.notified(), if !failed => {}
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// One pass over everything due; true if any request failed.
    async fn sync_once(&self, client: &kube::Client) -> bool {
        let mut failed = false;
        let due: Vec<(PodUid, Target, V1PodStatus, u64)> = {
            let mut state = lock(&self.state);
            state.reconcile();
            let mut due = Vec::new();
            for (uid, e) in state.pods.iter_mut() {
                if e.version <= e.sent_version || e.target.uid.is_none() {
                    continue;
                }
                if e.sent_terminal && !terminal(&e.status) {
                    tracing::debug!(pod = %uid, "not sending a non-terminal status after a terminal one");
                    e.sent_version = e.version;
                    continue;
                }
                due.push((uid.clone(), e.target.clone(), e.status.clone(), e.version));
            }
            due
        };
        for (uid, target, status, version) in due {
            let Some(target_uid) = target.uid.as_deref() else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
            let body = patch_body(target_uid, &status);
            match api
                .patch_status(
                    &target.name,
                    &PatchParams::default(),
                    &Patch::Strategic(&body),
                )
                .await
            {
                Ok(_) => {
                    let mut state = lock(&self.state);
                    if let Some(e) = state.pods.get_mut(&uid) {
                        e.sent_version = e.sent_version.max(version);
                        e.sent_terminal |= terminal(&status);
                        e.sent_at = Some(tokio::time::Instant::now());
                    }
                }
                Err(e) if is_not_found(&e) => {
                    tracing::debug!(pod = %uid, "pod is gone from the API server; status dropped");
                    if let Some(e) = lock(&self.state).pods.get_mut(&uid) {
                        e.sent_version = e.sent_version.max(version);
                    }
                }
                Err(e) => {
                    tracing::warn!(pod = %format!("{}/{}", target.namespace, target.name), error = %e, "patching pod status failed; will retry");
                    failed = true;
                }
            }
        }
        let deletes: Vec<(PodUid, Target)> = {
            let state = lock(&self.state);
            state
                .deletes
                .iter()
                // The last status goes out before the object goes away.
                .filter(|(uid, _)| {
                    state
                        .pods
                        .get(*uid)
                        .is_none_or(|e| e.version <= e.sent_version)
                })
                .map(|(u, t)| (u.clone(), t.clone()))
                .collect()
        };
        for (uid, target) in deletes {
            let api: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
            match api
                .delete(&target.name, &delete_exactly(target.uid.clone()))
                .await
            {
                Ok(_) => {
                    tracing::info!(pod = %format!("{}/{}", target.namespace, target.name), "deleted the terminated pod from the API server");
                    let mut state = lock(&self.state);
                    state.deletes.remove(&uid);
                    state.pods.remove(&uid);
                }
                Err(e) if is_not_found(&e) || super::is_conflict(&e) => {
                    // Gone already, or a different pod (UID precondition) took the name.
                    let mut state = lock(&self.state);
                    state.deletes.remove(&uid);
                    state.pods.remove(&uid);
                }
                Err(e) => {
                    tracing::warn!(pod = %format!("{}/{}", target.namespace, target.name), error = %e, "deleting the terminated pod failed; will retry");
                    failed = true;
                }
            }
        }
        failed
    }

    /// UIDs with deletes pending (for tests).
    pub fn deletes_pending(&self) -> BTreeSet<PodUid> {
        lock(&self.state).deletes.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_pod(uid: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": uid,
                          "annotations": {"kubernetes.io/config.source": "api"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .expect("pod")
    }

    fn phase(p: &str) -> V1PodStatus {
        V1PodStatus {
            phase: Some(p.into()),
            ..Default::default()
        }
    }

    #[test]
    fn only_changed_statuses_get_new_versions() {
        let m = StatusManager::default();
        let pod = api_pod("u1");
        m.set(&pod, &phase("Pending"));
        assert_eq!(m.pending(), 1);
        let v1 = lock(&m.state).pods[&PodUid::from("u1")].version;
        m.set(&pod, &phase("Pending"));
        assert_eq!(lock(&m.state).pods[&PodUid::from("u1")].version, v1);
        m.set(&pod, &phase("Running"));
        assert!(lock(&m.state).pods[&PodUid::from("u1")].version > v1);
    }

    #[test]
    fn static_pods_wait_for_their_mirror_and_local_pods_are_ignored() {
        let m = StatusManager::default();
        let mut local = api_pod("u2");
        local.metadata.annotations = None;
        m.set(&local, &phase("Running"));
        assert_eq!(m.pending(), 0, "a pod of no reporting source");
        let mut stat = api_pod("u3");
        stat.metadata.annotations =
            Some([("kubernetes.io/config.source".to_owned(), "file".to_owned())].into());
        m.set(&stat, &phase("Running"));
        assert_eq!(m.pending(), 0, "no mirror yet");
        let mut mirror = api_pod("mirror-uid");
        mirror.metadata.annotations =
            Some([("kubernetes.io/config.mirror".to_owned(), "h".to_owned())].into());
        m.set_mirrors(&[(("ns".to_owned(), "p".to_owned()), mirror)].into());
        assert_eq!(m.pending(), 1);
        let target = lock(&m.state).pods[&PodUid::from("u3")].target.clone();
        assert_eq!(target.uid.as_deref(), Some("mirror-uid"));
    }

    #[test]
    fn the_patch_carries_the_uid_precondition_and_condition_order() {
        let mut s = phase("Running");
        s.conditions = Some(vec![
            k8s_openapi::api::core::v1::PodCondition {
                type_: "Initialized".into(),
                status: "True".into(),
                ..Default::default()
            },
            k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            },
        ]);
        let body = patch_body("u1", &s);
        assert_eq!(body["metadata"]["uid"], "u1");
        assert_eq!(body["status"]["phase"], "Running");
        assert_eq!(
            body["status"]["$setElementOrder/conditions"],
            serde_json::json!([{"type": "Initialized"}, {"type": "Ready"}])
        );
    }

    #[test]
    fn a_condition_without_a_reason_or_message_clears_the_old_ones() {
        let mut s = phase("Running");
        s.conditions = Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]);
        let body = patch_body("u1", &s);
        let ready = &body["status"]["conditions"][0];
        assert_eq!(ready["status"], "True");
        // null in a strategic merge patch removes the field the API server
        // kept from `Ready=False` (ContainersNotReady).
        assert!(ready.get("reason").is_some_and(serde_json::Value::is_null));
        assert!(ready.get("message").is_some_and(serde_json::Value::is_null));
        s.conditions = Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: Some("ContainersNotReady".into()),
            ..Default::default()
        }]);
        assert_eq!(
            patch_body("u1", &s)["status"]["conditions"][0]["reason"],
            "ContainersNotReady"
        );
    }
}
