//! API-server mode end to end: the agent on the private real containerd,
//! joined to the real control plane (`support/cluster.rs`), each test a node
//! of its own whose pods the scheduler places. Pods arrive through the watch
//! and run for real; what evlet sends back (node, lease, status patches,
//! final deletes, mirror pods) is read from the apiserver's objects and its
//! audit log. An outage is the mock's (`support/apiserver.rs`): the real
//! server cannot be taken away from one agent alone.

#[path = "support/apiserver.rs"]
mod apiserver;
#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/promtool.rs"]
mod promtool;
mod support;

use std::time::Duration;

use cluster::{Api, Backend, api_e2e};
use evlet_cri::SandboxFilter;
use evlet_testkit::eventually;
use serde_json::json;
use support::{IMAGE, Running, World};

/// The agent joined to `api`, with a cluster DNS service (without one
/// ClusterFirst pods get a MissingClusterDNS warning, as upstream).
async fn start(w: &World, api: &Api) -> Running {
    let mut config = w.config();
    config.pods.cluster_dns = vec!["10.96.0.10".into()];
    config.pods.cluster_domain = "cluster.local".into();
    api.start(w, config).await
}

/// `/metrics` of an agent that ran one API pod to completion: the text
/// format with upstream's content type, passing `promtool check metrics`, and
/// upstream's metrics counting what happened.
async fn live_metrics_are_upstreams(agent: &Running, node: &str) {
    let (code, content_type, text) = support::http_get(
        agent.handles.address.expect("the read-only port"),
        "/metrics",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    promtool::check_metrics("live_metrics_are_upstreams", &text);
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{series} not in /metrics:\n{text}"))
    };
    assert!(value("kubelet_started_pods_total") >= 1.0);
    assert!(value("kubelet_started_containers_total{container_type=\"container\"}") >= 1.0);
    assert!(value("kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"}") >= 1.0);
    assert!(value("kubelet_runtime_operations_total{operation_type=\"start_container\"}") >= 1.0);
    assert!(value("kubelet_pod_worker_duration_seconds_count{operation_type=\"create\"}") >= 1.0);
    assert!(value("kubelet_pod_start_duration_seconds_count") >= 1.0);
    // The API pod was created, ran, and was observed running once.
    assert_eq!(value("kubelet_pod_start_sli_duration_seconds_count"), 1.0);
    assert_eq!(value(&format!("kubelet_node_name{{node=\"{node}\"}}")), 1.0);
    assert!(
        text.lines()
            .any(|l| l.starts_with("rest_client_requests_total{code=\"200\"")),
        "no successful API requests counted"
    );
    assert!(value("process_resident_memory_bytes") > 1e6);
}

/// The phases of the status patches sent for `pod`, consecutive repeats merged.
async fn patched_phases(api: &Api, pod: &str) -> Vec<String> {
    let mut phases: Vec<String> = api
        .requests_matching("PATCH", &format!("/pods/{pod}/status"))
        .await
        .iter()
        .filter_map(|r| {
            r.body.as_ref()?["status"]["phase"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    phases.dedup();
    phases
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_pod_runs_and_its_status_goes_pending_running_succeeded() {
    api_e2e(
        "an_api_pod_runs_and_its_status_goes_pending_running_succeeded",
        Backend::Real,
        |w, api| async move {
            let agent = start(&w, &api).await;
            let node = api.get("nodes", "", &w.name).await.expect("node");
            assert_eq!(
                node["status"]["nodeInfo"]["containerRuntimeVersion"]
                    .as_str()
                    .map(|v| v.starts_with("containerd://")),
                Some(true)
            );
            eventually(Duration::from_secs(10), "lease created", || async {
                api.get("leases", "kube-node-lease", &w.name).await
            })
            .await;

            let name = w.pod_name("job");
            let spec = json!({
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": IMAGE,
                                "command": ["/bin/sh", "-c", "sleep 3; exit 0"]}]
            });
            api.create("pods", api.ns(), api.pod(&w, "job", spec)).await;
            let done = api
                .wait_phase(&name, "Succeeded", Duration::from_secs(60))
                .await;
            assert_eq!(
                patched_phases(&api, &name).await,
                ["Pending", "Running", "Succeeded"]
            );
            let cs = &done["status"]["containerStatuses"][0];
            assert_eq!(cs["name"], "main");
            assert_eq!(cs["state"]["terminated"]["exitCode"], 0);
            assert_eq!(cs["state"]["terminated"]["reason"], "Completed");
            assert_eq!(done["status"]["hostIP"], "127.0.0.1");
            let running = api
                .requests_matching("PATCH", &format!("/pods/{name}/status"))
                .await
                .into_iter()
                .filter_map(|r| r.body)
                .find(|b| b["status"]["phase"] == "Running")
                .expect("a Running patch");
            let rcs = &running["status"]["containerStatuses"][0];
            assert!(rcs["state"]["running"]["startedAt"].is_string(), "{rcs}");
            assert!(
                rcs["containerID"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("containerd://"))
            );
            let uid = done["metadata"]["uid"].as_str().expect("uid");
            assert_eq!(running["metadata"]["uid"], uid, "UID precondition");
            // The kubelet's events (a cluster's scheduler records its own).
            let reasons = eventually(Duration::from_secs(10), "events recorded", || async {
                let reasons: Vec<String> = api
                    .list("events", api.ns())
                    .await
                    .iter()
                    .filter(|e| e["involvedObject"]["uid"] == uid)
                    .filter(|e| e["reportingComponent"] == "kubelet")
                    .filter_map(|e| e["reason"].as_str().map(str::to_owned))
                    .collect();
                (reasons.len() >= 3).then_some(reasons)
            })
            .await;
            assert_eq!(reasons, ["Pulled", "Created", "Started"]);
            live_metrics_are_upstreams(&agent, &w.name).await;
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_api_pod_is_terminated_gracefully_then_deleted_for_good() {
    api_e2e(
        "a_deleted_api_pod_is_terminated_gracefully_then_deleted_for_good",
        Backend::Real,
        |w, api| async move {
            let agent = start(&w, &api).await;
            let name = w.pod_name("web");
            // PID 1 ignores SIGTERM: the grace period runs out before SIGKILL.
            let spec = json!({
                "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "3600"]}]
            });
            api.create("pods", api.ns(), api.pod(&w, "web", spec)).await;
            let pod = api
                .wait_phase(&name, "Running", Duration::from_secs(60))
                .await;
            let uid = pod["metadata"]["uid"].as_str().expect("uid").to_owned();
            let deleted_at = std::time::Instant::now();
            api.delete_pod(api.ns(), &name, Some(2)).await;
            eventually(
                Duration::from_secs(30),
                "the pod object deleted",
                || async {
                    api.get("pods", api.ns(), &name)
                        .await
                        .is_none()
                        .then_some(())
                },
            )
            .await;
            let took = deleted_at.elapsed();
            assert!(
                took >= Duration::from_millis(1900),
                "waited the grace period: {took:?}"
            );
            // SIGKILL at 2 s, then removal, the last status and the final DELETE.
            assert!(
                took <= Duration::from_secs(5),
                "deleted soon after the grace period: {took:?}"
            );
            let deletes = api
                .requests_matching("DELETE", &format!("/pods/{name}"))
                .await;
            assert_eq!(deletes.len(), 1, "one final delete");
            let options = deletes[0].body.clone().expect("DeleteOptions");
            assert_eq!(options["gracePeriodSeconds"], 0);
            assert_eq!(options["preconditions"]["uid"], uid.as_str());
            let left = w
                .client
                .list_pod_sandbox(SandboxFilter::new().label(evlet::pod::labels::POD_UID, uid))
                .await
                .expect("list");
            assert!(
                left.is_empty(),
                "sandbox removed before the final delete: {left:?}"
            );
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn static_pods_get_mirror_pods_that_come_back_and_go_away() {
    api_e2e(
        "static_pods_get_mirror_pods_that_come_back_and_go_away",
        Backend::Real,
        |w, api| async move {
            let ns = api.ns().to_owned();
            w.write(
                "static.yaml",
                &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: mirrored, namespace: {ns}, labels: {{app: m}}}}\nspec:\n  containers:\n  - {{name: main, image: {IMAGE}, command: [sleep, '3600']}}\n"),
            );
            let agent = start(&w, &api).await;
            let name = w.pod_name("mirrored");
            let node_uid = api.get("nodes", "", &w.name).await.expect("node")["metadata"]["uid"].clone();
            let mirror = eventually(Duration::from_secs(30), "mirror pod created", || async {
                api.get("pods", &ns, &name).await
            })
            .await;
            assert!(mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string());
            assert_eq!(mirror["metadata"]["labels"]["app"], "m");
            assert_eq!(mirror["metadata"]["ownerReferences"][0]["kind"], "Node");
            assert_eq!(mirror["metadata"]["ownerReferences"][0]["uid"], node_uid);
            assert_eq!(mirror["spec"]["nodeName"], w.name.as_str());
            let running = api.wait_phase(&name, "Running", Duration::from_secs(60)).await;
            assert_eq!(running["metadata"]["uid"], mirror["metadata"]["uid"], "status via the mirror");

            api.delete_pod(&ns, &name, Some(0)).await;
            let again = eventually(Duration::from_secs(30), "mirror pod recreated", || async {
                api.get("pods", &ns, &name)
                    .await
                    .filter(|p| p["metadata"]["uid"] != mirror["metadata"]["uid"])
            })
            .await;
            assert!(again["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string());
            api.wait_phase(&name, "Running", Duration::from_secs(30)).await;

            w.remove("static.yaml");
            eventually(Duration::from_secs(30), "mirror pod deleted", || async {
                api.get("pods", &ns, &name).await.is_none().then_some(())
            })
            .await;
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_outage_keeps_pods_running_and_statuses_arrive_after_it() {
    // The mock: an outage of the one agent's API server, at will.
    api_e2e(
        "an_api_outage_keeps_pods_running_and_statuses_arrive_after_it",
        Backend::Mock,
        |w, api| async move {
            let agent = start(&w, &api).await;
            let keep = w.pod_name("keep");
            let short = w.pod_name("short");
            let ns = api.ns();
            api.create(
                "pods",
                ns,
                api.pod(&w, "keep", json!({
                    "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "3600"]}]
                })),
            )
            .await;
            api.create(
                "pods",
                ns,
                api.pod(
                    &w,
                    "short",
                    json!({
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": IMAGE,
                                        "command": ["/bin/sh", "-c", "sleep 6; exit 3"]}]
                    }),
                ),
            )
            .await;
            api.wait_phase(&short, "Running", Duration::from_secs(60))
                .await;
            let keep_id = agent.running_id(&keep, "main").await;
            api.mock().set_outage(true);
            // The local view sees the exit while the API server is away.
            agent
                .wait_status(
                    &short,
                    "short Failed locally",
                    Duration::from_secs(30),
                    |s| (s.phase.as_deref() == Some("Failed")).then_some(()),
                )
                .await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert_eq!(
                api.get("pods", ns, &short).await.expect("pod")["status"]["phase"],
                "Running",
                "nothing reached the API server during the outage"
            );
            assert_eq!(
                agent.running_id(&keep, "main").await,
                keep_id,
                "pods keep running"
            );
            let leases_before = api.requests_matching("PUT", "/leases/").await.len();
            api.mock().set_outage(false);
            let failed = api
                .wait_phase(&short, "Failed", Duration::from_secs(40))
                .await;
            assert_eq!(
                failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
                3
            );
            eventually(
                Duration::from_secs(20),
                "lease renewed after the outage",
                || async {
                    (api.requests_matching("PUT", "/leases/").await.len() > leases_before)
                        .then_some(())
                },
            )
            .await;
            assert_eq!(
                agent.running_id(&keep, "main").await,
                keep_id,
                "never restarted"
            );
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn what_the_node_lifecycle_controller_marks_after_an_outage_is_put_right() {
    api_e2e(
        "what_the_node_lifecycle_controller_marks_after_an_outage_is_put_right",
        Backend::Real,
        |w, api| async move {
            let agent = start(&w, &api).await;
            let ready = |node: &serde_json::Value| {
                apiserver::condition(node, "Ready")
                    .map(|c| (c["status"].clone(), c["reason"].clone()))
            };
            eventually(Duration::from_secs(30), "the node Ready", || async {
                let node = api.get("nodes", "", &w.name).await?;
                (ready(&node)? == (json!("True"), json!("KubeletReady"))).then_some(())
            })
            .await;
            let ns = api.ns().to_owned();
            let app = w.pod_name("app");
            api.create(
                "pods",
                &ns,
                api.pod(&w, "app", json!({
                    "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "3600"]}]
                })),
            )
            .await;
            let pod_ready = |pod: &serde_json::Value| {
                apiserver::condition(pod, "Ready").map(|c| c["status"].clone())
            };
            eventually(Duration::from_secs(60), "the pod Ready", || async {
                let pod = api.get("pods", &ns, &app).await?;
                (pod_ready(&pod)? == "True").then_some(())
            })
            .await;
            // What the node lifecycle controller writes when the Lease went
            // stale (an etcd or apiserver outage longer than its grace).
            api.modify(
                "nodes",
                "",
                &format!("{}/status", w.name),
                apiserver::mark_node_unknown,
            )
            .await;
            let marked = api.get("nodes", "", &w.name).await.expect("node");
            assert_eq!(
                ready(&marked),
                Some((json!("Unknown"), json!("NodeStatusUnknown"))),
                "the controller's mark is stored"
            );
            // And its MarkPodsNotReady.
            api.modify("pods", &ns, &format!("{app}/status"), |p| {
                for c in p["status"]["conditions"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                    .filter(|c| c["type"] == "Ready")
                {
                    c["status"] = json!("False");
                }
            })
            .await;
            let marked = api.get("pods", &ns, &app).await.expect("pod");
            assert_eq!(pod_ready(&marked), Some(json!("False")), "{marked:#}");
            // The status loops tick every 10 s; the next ticks put it right.
            eventually(Duration::from_secs(25), "the node Ready again", || async {
                let node = api.get("nodes", "", &w.name).await?;
                (ready(&node)? == (json!("True"), json!("KubeletReady"))).then_some(())
            })
            .await;
            eventually(Duration::from_secs(35), "the pod Ready again", || async {
                let pod = api.get("pods", &ns, &app).await?;
                (pod_ready(&pod)? == "True").then_some(())
            })
            .await;
            agent.stop().await;
        },
    )
    .await;
}
