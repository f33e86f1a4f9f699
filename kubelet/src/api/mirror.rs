//! Mirror pods: the API server's read-only copy of each static pod, so the
//! cluster sees it (upstream's `MirrorClient`).
//!
//! A mirror pod has the static pod's name, namespace, labels and spec, the
//! annotation `kubernetes.io/config.mirror` set to the static pod's hash, and
//! the Node as owner. It is created when missing (also after someone deleted
//! it), replaced when its hash no longer matches, and deleted (UID
//! precondition) when its static pod is gone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::pods::Mirrors;
use super::{delete_exactly, is_conflict, is_not_found};
use crate::backoff::Retry;
use crate::pod::{self, labels};

/// Static pods by `(namespace, name)`.
pub type Statics = BTreeMap<(String, String), Arc<Pod>>;

/// Re-check period even without changes.
const PERIOD: Duration = Duration::from_secs(10);

fn hash(pod: &Pod) -> String {
    pod::annotations(pod)
        .get(labels::CONFIG_HASH)
        .cloned()
        .unwrap_or_else(|| pod::uid(pod).0)
}

/// The mirror pod of static pod `pod` on `node` (owned by the Node `node_uid`).
pub fn mirror_of(pod: &Pod, node: &str, node_uid: Option<&str>) -> Pod {
    let mut annotations = pod::annotations(pod);
    annotations.insert(labels::CONFIG_MIRROR.into(), hash(pod));
    let mut spec = pod.spec.clone().unwrap_or_default();
    spec.node_name = Some(node.to_owned());
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: node_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: node.to_owned(),
                    uid: uid.to_owned(),
                    controller: Some(true),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// What to do to bring the mirrors in line with the static pods.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Static pods (by key) whose mirror must be created.
    pub create: Vec<(String, String)>,
    /// Mirrors to delete: key and UID.
    pub delete: Vec<((String, String), String)>,
}

/// Compares static pods and mirror pods.
pub fn plan(statics: &Statics, mirrors: &Mirrors) -> Plan {
    let mut plan = Plan::default();
    for (key, p) in statics {
        match mirrors.get(key) {
            None => plan.create.push(key.clone()),
            Some(m) => {
                let current = pod::annotations(m)
                    .get(labels::CONFIG_MIRROR)
                    .cloned()
                    .unwrap_or_default();
                // A stale mirror is deleted; it is created again once it is gone.
                if current != hash(p) && m.metadata.deletion_timestamp.is_none() {
                    plan.delete
                        .push((key.clone(), m.metadata.uid.clone().unwrap_or_default()));
                }
            }
        }
    }
    for (key, m) in mirrors {
        if !statics.contains_key(key) && m.metadata.deletion_timestamp.is_none() {
            plan.delete
                .push((key.clone(), m.metadata.uid.clone().unwrap_or_default()));
        }
    }
    plan
}

/// Keeps mirror pods in line until `shutdown`.
pub async fn run(
    client: kube::Client,
    node: String,
    node_uid: Option<String>,
    mut statics: watch::Receiver<Statics>,
    mut mirrors: watch::Receiver<Mirrors>,
    shutdown: CancellationToken,
) {
    let mut backoff = Retry::new(Duration::from_millis(500), Duration::from_secs(30));
    loop {
        let wanted = statics.borrow_and_update().clone();
        let seen = mirrors.borrow_and_update().clone();
        let failed = apply(&client, &node, node_uid.as_deref(), &wanted, &seen).await;
        let delay = backoff.after(failed, PERIOD);
        tokio::select! {
            () = shutdown.cancelled() => return,
            r = statics.changed() => if r.is_err() { return },
            r = mirrors.changed() => if r.is_err() { return },
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// Carries out the plan; true if a request failed.
async fn apply(
    client: &kube::Client,
    node: &str,
    node_uid: Option<&str>,
    statics: &Statics,
    mirrors: &Mirrors,
) -> bool {
    let plan = plan(statics, mirrors);
    let mut failed = false;
    for ((ns, name), uid) in plan.delete {
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match api.delete(&name, &delete_exactly(Some(uid))).await {
            Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), "deleted mirror pod"),
            Err(e) if is_not_found(&e) || is_conflict(&e) => {}
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "deleting mirror pod failed");
                failed = true;
            }
        }
    }
    for key in plan.create {
        let Some(p) = statics.get(&key) else { continue };
        let api: Api<Pod> = Api::namespaced(client.clone(), &key.0);
        match api
            .create(&PostParams::default(), &mirror_of(p, node, node_uid))
            .await
        {
            Ok(_) => tracing::info!(pod = %format!("{}/{}", key.0, key.1), "created mirror pod"),
            // The watch has not shown it yet; the next pass sees it.
            Err(e) if is_conflict(&e) => {}
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{}", key.0, key.1), error = %e, "creating mirror pod failed");
                failed = true;
            }
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn static_pod(hash: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-n1", "namespace": "default", "uid": hash,
                "labels": {"app": "web"},
                "annotations": {"kubernetes.io/config.source": "file",
                                "kubernetes.io/config.hash": hash}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .expect("pod")
    }

    fn key() -> (String, String) {
        ("default".into(), "web-n1".into())
    }

    fn mirror(hash: &str, uid: &str) -> Pod {
        let mut m = mirror_of(&static_pod(hash), "n1", Some("node-uid"));
        m.metadata.uid = Some(uid.into());
        m
    }

    #[test]
    fn the_mirror_copies_the_static_pod_with_the_hash_and_node_owner() {
        let m = mirror_of(&static_pod("h1"), "n1", Some("node-uid"));
        assert_eq!(m.metadata.name.as_deref(), Some("web-n1"));
        assert_eq!(
            pod::annotations(&m)
                .get(labels::CONFIG_MIRROR)
                .map(String::as_str),
            Some("h1")
        );
        assert_eq!(m.metadata.uid, None, "the API server assigns the UID");
        let owner = &m.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Node", "node-uid")
        );
        assert_eq!(m.spec.and_then(|s| s.node_name).as_deref(), Some("n1"));
    }

    #[test]
    fn missing_mirrors_are_created_stale_and_orphaned_ones_deleted() {
        let statics: Statics = [(key(), Arc::new(static_pod("h2")))].into();
        assert_eq!(plan(&statics, &Mirrors::new()).create, [key()]);
        let current: Mirrors = [(key(), mirror("h2", "m1"))].into();
        assert_eq!(plan(&statics, &current), Plan::default());
        let stale: Mirrors = [(key(), mirror("h1", "m0"))].into();
        assert_eq!(plan(&statics, &stale).delete, [(key(), "m0".to_owned())]);
        assert_eq!(
            plan(&Statics::new(), &current).delete,
            [(key(), "m1".to_owned())]
        );
    }
}
