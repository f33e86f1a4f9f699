//! The kubelet's own admission of API pods, on the private real containerd
//! joined to the real control plane (`support/cluster.rs`): a pod that does
//! not fit is rejected `OutOfcpu`, a finished pod's requests are free again,
//! and a node selector is checked against the live Node. Pods the scheduler
//! would not place are bound by `nodeName`, as a client that bypasses the
//! scheduler does: the kubelet's admission is what is under test.

#[path = "support/apiserver.rs"]
mod apiserver;
#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::time::Duration;

use cluster::{Backend, api_e2e};
use evlet_cri::SandboxFilter;
use serde_json::json;
use support::IMAGE;

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_that_does_not_fit_is_rejected_out_of_cpu_and_never_started() {
    api_e2e(
        "a_pod_that_does_not_fit_is_rejected_out_of_cpu_and_never_started",
        Backend::Real,
        |w, api| async move {
            let agent = api.start(&w, w.config()).await;
            let name = w.pod_name("huge");
            let spec = json!({
                "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "3600"],
                                "resources": {"requests": {"cpu": "1000"}}}]
            });
            api.create("pods", api.ns(), api.bound_pod(&w, "huge", spec))
                .await;
            let failed = api
                .wait_phase(&name, "Failed", Duration::from_secs(30))
                .await;
            assert_eq!(failed["status"]["reason"], "OutOfcpu");
            let message = failed["status"]["message"].as_str().unwrap_or_default();
            assert!(
                message.starts_with(
                    "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000000"
                ),
                "{message}"
            );
            let uid = failed["metadata"]["uid"].as_str().expect("uid").to_owned();
            let sandboxes = w
                .client
                .list_pod_sandbox(SandboxFilter::new().label(evlet::pod::labels::POD_UID, uid))
                .await
                .expect("list");
            assert!(sandboxes.is_empty(), "never started");
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_pods_requests_are_free_for_the_next_pod() {
    api_e2e(
        "a_finished_pods_requests_are_free_for_the_next_pod",
        Backend::Real,
        |w, api| async move {
            let agent = api.start(&w, w.config()).await;
            let node = api.get("nodes", "", &w.name).await.expect("the Node");
            let allocatable = node["status"]["allocatable"]["cpu"]
                .as_str()
                .and_then(|q| evlet::quantity::parse_milli(q).ok())
                .expect("allocatable cpu");
            // Each pod asks for three quarters of the node's CPU: two never fit together.
            let request = format!("{}m", allocatable * 3 / 4);
            let job = |command: &str| {
                json!({
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": IMAGE, "command": ["sh", "-c", command],
                                    "resources": {"requests": {"cpu": request}}}]
                })
            };
            let ns = api.ns();
            api.create("pods", ns, api.pod(&w, "first", job("exit 0")))
                .await;
            api.wait_phase(&w.pod_name("first"), "Succeeded", Duration::from_secs(60))
                .await;
            // Upstream admits against its active pods: the Succeeded one no
            // longer counts (nor does it for the scheduler, which places this one).
            api.create("pods", ns, api.pod(&w, "second", job("exec sleep 3600")))
                .await;
            api.wait_phase(&w.pod_name("second"), "Running", Duration::from_secs(60))
                .await;
            // While the second runs, a third of the same size does not fit
            // (bound past the scheduler, which would leave it pending).
            api.create("pods", ns, api.bound_pod(&w, "third", job("exec sleep 3600")))
                .await;
            let third = api
                .wait_phase(&w.pod_name("third"), "Failed", Duration::from_secs(30))
                .await;
            assert_eq!(third["status"]["reason"], "OutOfcpu", "{third:#}");
            api.delete_pod(ns, &w.pod_name("second"), Some(0)).await;
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn admission_reads_the_live_node_and_admits_once_it_is_labelled() {
    api_e2e(
        "admission_reads_the_live_node_and_admits_once_it_is_labelled",
        Backend::Real,
        |w, api| async move {
            let agent = api.start(&w, w.config()).await;
            let ns = api.ns();
            // The node lacks the label the pod selects: rejected as upstream.
            let ssd = w.pod_name("ssd");
            let sleeper = |grace: i64| {
                json!({"nodeSelector": {"disk": "ssd"},
                    "terminationGracePeriodSeconds": grace,
                    "containers": [{"name": "main", "image": IMAGE, "command": ["/bin/sleep", "3600"]}]})
            };
            api.create("pods", ns, api.bound_pod(&w, "ssd", sleeper(30)))
                .await;
            let rejected = api.wait_phase(&ssd, "Failed", Duration::from_secs(30)).await;
            assert_eq!(rejected["status"]["reason"], "NodeAffinity");
            assert_eq!(
                rejected["status"]["message"],
                "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
            );
            // An administrator labels the node; the next such pod is placed
            // there and admitted.
            api.modify("nodes", "", &w.name, |n| {
                n["metadata"]["labels"]["disk"] = json!("ssd");
            })
            .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let ssd2 = w.pod_name("ssd2");
            api.create("pods", ns, api.pod(&w, "ssd2", sleeper(1))).await;
            api.wait_phase(&ssd2, "Running", Duration::from_secs(60))
                .await;
            // The Node was watched by name, not listed per pod.
            let selector = format!("fieldSelector=metadata.name%3D{}", w.name);
            assert!(
                api.requests_matching("GET", "/api/v1/nodes")
                    .await
                    .iter()
                    .any(|r| r.query.contains("watch=true") && r.query.contains(&selector)),
                "a watch of the node"
            );
            agent.stop().await;
        },
    )
    .await;
}
