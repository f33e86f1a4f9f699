//! API-server mode end to end: the agent on the private real containerd,
//! joined to the mocked API server (`support/apiserver.rs`). Pods arrive
//! through the watch and run for real; what evlet sends back (node, lease,
//! status patches, final deletes, mirror pods) is read off the mock.

#[path = "support/apiserver.rs"]
mod apiserver;
#[path = "support/promtool.rs"]
mod promtool;
mod support;

use std::time::Duration;

use apiserver::MockApi;
use evlet::api::ApiClient;
use evlet_cri::SandboxFilter;
use evlet_testkit::eventually;
use serde_json::{Value, json};
use support::{IMAGE, Running, World, e2e};

async fn start(w: &World, api: &MockApi) -> Running {
    let mut config = w.config();
    config.api = Some(ApiClient::over(api.service()));
    // A cluster has its DNS service (without one ClusterFirst pods get a
    // MissingClusterDNS warning, as upstream).
    config.pods.cluster_dns = vec!["10.96.0.10".into()];
    config.pods.cluster_domain = "cluster.local".into();
    let agent = w.start_with(config).await;
    eventually(Duration::from_secs(20), "node registered", || async {
        api.get("nodes", "", &w.name)
    })
    .await;
    agent
}

/// `/metrics` of an agent that ran one API pod to completion: the text
/// format with upstream's content type, passing `promtool check metrics`, and
/// upstream's metrics counting what happened.
async fn live_metrics_are_upstreams(agent: &Running, node: &str) {
    let (code, content_type, text) = support::http_get(agent.handles.address, "/metrics").await;
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

fn api_pod(w: &World, name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["nodeName"] = json!(w.name);
    json!({"metadata": {"name": w.pod_name(name), "namespace": "default"}, "spec": spec})
}

/// The phases of the status patches sent for `pod`, consecutive repeats merged.
fn patched_phases(api: &MockApi, pod: &str) -> Vec<String> {
    let mut phases: Vec<String> = api
        .requests_matching("PATCH", &format!("/pods/{pod}/status"))
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

async fn wait_api_phase(api: &MockApi, pod: &str, phase: &str, limit: Duration) -> Value {
    eventually(limit, &format!("{pod} {phase} in the API"), || async {
        api.get("pods", "default", pod)
            .filter(|p| p["status"]["phase"] == phase)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_pod_runs_and_its_status_goes_pending_running_succeeded() {
    e2e(
        "an_api_pod_runs_and_its_status_goes_pending_running_succeeded",
        |w| async move {
            let api = MockApi::new();
            let agent = start(&w, &api).await;
            let node = api.get("nodes", "", &w.name).expect("node");
            assert_eq!(
                node["status"]["nodeInfo"]["containerRuntimeVersion"]
                    .as_str()
                    .map(|v| v.starts_with("containerd://")),
                Some(true)
            );
            eventually(Duration::from_secs(10), "lease created", || async {
                api.get("leases", "kube-node-lease", &w.name)
            })
            .await;

            let name = w.pod_name("job");
            api.create(
                "pods",
                "default",
                api_pod(
                    &w,
                    "job",
                    json!({
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": IMAGE,
                                        "command": ["/bin/sh", "-c", "sleep 3; exit 0"]}]
                    }),
                ),
            );
            let done = wait_api_phase(&api, &name, "Succeeded", Duration::from_secs(60)).await;
            assert_eq!(
                patched_phases(&api, &name),
                ["Pending", "Running", "Succeeded"]
            );
            let cs = &done["status"]["containerStatuses"][0];
            assert_eq!(cs["name"], "main");
            assert_eq!(cs["state"]["terminated"]["exitCode"], 0);
            assert_eq!(cs["state"]["terminated"]["reason"], "Completed");
            assert_eq!(done["status"]["hostIP"], "127.0.0.1");
            let running = api
                .requests_matching("PATCH", &format!("/pods/{name}/status"))
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
            let reasons = eventually(Duration::from_secs(10), "events recorded", || async {
                let reasons: Vec<String> = api
                    .list("events")
                    .iter()
                    .filter(|e| e["involvedObject"]["uid"] == uid)
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
    e2e(
        "a_deleted_api_pod_is_terminated_gracefully_then_deleted_for_good",
        |w| async move {
            let api = MockApi::new();
            let agent = start(&w, &api).await;
            let name = w.pod_name("web");
            // PID 1 ignores SIGTERM: the grace period runs out before SIGKILL.
            api.create(
                "pods",
                "default",
                api_pod(&w, "web", json!({
                    "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "3600"]}]
                })),
            );
            let pod = wait_api_phase(&api, &name, "Running", Duration::from_secs(60)).await;
            let uid = pod["metadata"]["uid"].as_str().expect("uid").to_owned();
            let deleted_at = std::time::Instant::now();
            api.delete_pod("default", &name, Some(2));
            eventually(
                Duration::from_secs(30),
                "the pod object deleted",
                || async { api.get("pods", "default", &name).is_none().then_some(()) },
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
            let deletes = api.requests_matching("DELETE", &format!("/pods/{name}"));
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
    e2e(
        "static_pods_get_mirror_pods_that_come_back_and_go_away",
        |w| async move {
            let api = MockApi::new();
            w.write(
                "static.yaml",
                &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: mirrored, labels: {{app: m}}}}\nspec:\n  containers:\n  - {{name: main, image: {IMAGE}, command: [sleep, '3600']}}\n"),
            );
            let agent = start(&w, &api).await;
            let name = w.pod_name("mirrored");
            let node_uid = api.get("nodes", "", &w.name).expect("node")["metadata"]["uid"].clone();
            let mirror = eventually(Duration::from_secs(30), "mirror pod created", || async {
                api.get("pods", "default", &name)
            })
            .await;
            assert!(mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string());
            assert_eq!(mirror["metadata"]["labels"]["app"], "m");
            assert_eq!(mirror["metadata"]["ownerReferences"][0]["kind"], "Node");
            assert_eq!(mirror["metadata"]["ownerReferences"][0]["uid"], node_uid);
            assert_eq!(mirror["spec"]["nodeName"], w.name.as_str());
            let running = wait_api_phase(&api, &name, "Running", Duration::from_secs(60)).await;
            assert_eq!(running["metadata"]["uid"], mirror["metadata"]["uid"], "status via the mirror");

            api.delete_pod("default", &name, Some(0));
            let again = eventually(Duration::from_secs(30), "mirror pod recreated", || async {
                api.get("pods", "default", &name)
                    .filter(|p| p["metadata"]["uid"] != mirror["metadata"]["uid"])
            })
            .await;
            assert!(again["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string());
            wait_api_phase(&api, &name, "Running", Duration::from_secs(30)).await;

            w.remove("static.yaml");
            eventually(Duration::from_secs(30), "mirror pod deleted", || async {
                api.get("pods", "default", &name).is_none().then_some(())
            })
            .await;
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_that_does_not_fit_is_rejected_out_of_cpu_and_never_started() {
    e2e(
        "a_pod_that_does_not_fit_is_rejected_out_of_cpu_and_never_started",
        |w| async move {
            let api = MockApi::new();
            let agent = start(&w, &api).await;
            let name = w.pod_name("huge");
            api.create(
                "pods",
                "default",
                api_pod(&w, "huge", json!({
                    "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "3600"],
                                    "resources": {"requests": {"cpu": "1000"}}}]
                })),
            );
            let failed = wait_api_phase(&api, &name, "Failed", Duration::from_secs(30)).await;
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
    e2e(
        "a_finished_pods_requests_are_free_for_the_next_pod",
        |w| async move {
            let api = MockApi::new();
            let agent = start(&w, &api).await;
            let node = api.get("nodes", "", &w.name).expect("the Node");
            let allocatable = node["status"]["allocatable"]["cpu"]
                .as_str()
                .and_then(|q| evlet::quantity::parse_milli(q).ok())
                .expect("allocatable cpu");
            // Each pod asks for three quarters of the node's CPU: two never fit together.
            let request = format!("{}m", allocatable * 3 / 4);
            let job = |name: &str, command: &str| {
                api_pod(&w, name, json!({
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": IMAGE, "command": ["sh", "-c", command],
                                    "resources": {"requests": {"cpu": request}}}]
                }))
            };
            api.create("pods", "default", job("first", "exit 0"));
            wait_api_phase(&api, &w.pod_name("first"), "Succeeded", Duration::from_secs(60)).await;
            // Upstream admits against its active pods: the Succeeded one no longer counts.
            api.create("pods", "default", job("second", "exec sleep 3600"));
            wait_api_phase(&api, &w.pod_name("second"), "Running", Duration::from_secs(60)).await;
            // While the second runs, a third of the same size does not fit.
            api.create("pods", "default", job("third", "exec sleep 3600"));
            let third = wait_api_phase(&api, &w.pod_name("third"), "Failed", Duration::from_secs(30)).await;
            assert_eq!(third["status"]["reason"], "OutOfcpu", "{third:#}");
            api.delete_pod("default", &w.pod_name("second"), Some(0));
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_outage_keeps_pods_running_and_statuses_arrive_after_it() {
    e2e(
        "an_api_outage_keeps_pods_running_and_statuses_arrive_after_it",
        |w| async move {
            let api = MockApi::new();
            let agent = start(&w, &api).await;
            let keep = w.pod_name("keep");
            let short = w.pod_name("short");
            api.create(
                "pods",
                "default",
                api_pod(&w, "keep", json!({
                    "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "3600"]}]
                })),
            );
            api.create(
                "pods",
                "default",
                api_pod(
                    &w,
                    "short",
                    json!({
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": IMAGE,
                                        "command": ["/bin/sh", "-c", "sleep 6; exit 3"]}]
                    }),
                ),
            );
            wait_api_phase(&api, &short, "Running", Duration::from_secs(60)).await;
            let keep_id = agent.running_id(&keep, "main").await;
            api.set_outage(true);
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
                api.get("pods", "default", &short).expect("pod")["status"]["phase"],
                "Running",
                "nothing reached the API server during the outage"
            );
            assert_eq!(
                agent.running_id(&keep, "main").await,
                keep_id,
                "pods keep running"
            );
            let leases_before = api.requests_matching("PUT", "/leases/").len();
            api.set_outage(false);
            let failed = wait_api_phase(&api, &short, "Failed", Duration::from_secs(40)).await;
            assert_eq!(
                failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
                3
            );
            eventually(
                Duration::from_secs(20),
                "lease renewed after the outage",
                || async {
                    (api.requests_matching("PUT", "/leases/").len() > leases_before).then_some(())
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
async fn env_from_secrets_and_config_maps_waits_for_a_missing_secret() {
    e2e(
        "env_from_secrets_and_config_maps_waits_for_a_missing_secret",
        |w| async move {
            let api = MockApi::new();
            let agent = start(&w, &api).await;
            api.create(
                "configmaps",
                "default",
                json!({"metadata": {"name": "settings"}, "data": {"MODE": "fast"}}),
            );
            let name = w.pod_name("envy");
            api.create(
                "pods",
                "default",
                api_pod(&w, "envy", json!({
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": IMAGE,
                        "command": ["/bin/sh", "-c", "test \"$PW\" = s3cret && test \"$CFG_MODE\" = fast"],
                        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
                        "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}]}]
                })),
            );
            let waiting = eventually(Duration::from_secs(30), "CreateContainerConfigError", || async {
                let p = api.get("pods", "default", &name)?;
                let w = p["status"]["containerStatuses"][0]["state"]["waiting"].clone();
                (w["reason"] == "CreateContainerConfigError").then_some(w)
            })
            .await;
            assert!(
                waiting["message"].as_str().is_some_and(|m| m.contains("secret \"db\" not found")),
                "{waiting}"
            );
            // base64 of "s3cret", as the API server stores Secret data.
            api.create(
                "secrets",
                "default",
                json!({"metadata": {"name": "db"}, "data": {"pw": "czNjcmV0"}}),
            );
            let done = wait_api_phase(&api, &name, "Succeeded", Duration::from_secs(60)).await;
            assert_eq!(
                done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
                0,
                "the env had the secret and the prefixed ConfigMap key"
            );
            // The secret is watched (a list and watch on its name), not read per start.
            let reads = api.requests_matching("GET", "/namespaces/default/secrets");
            assert!(
                reads.iter().any(|r| r.query.contains("watch=true")
                    && r.query.contains("fieldSelector=metadata.name%3Ddb")),
                "{:?}",
                reads.iter().map(|r| format!("{} ?{}", r.path, r.query)).collect::<Vec<_>>()
            );
            assert!(
                reads.iter().all(|r| !r.path.ends_with("/secrets/db")),
                "no GET of the object itself"
            );
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn services_become_environment_variables_and_admission_reads_the_live_node() {
    e2e(
        "services_become_environment_variables_and_admission_reads_the_live_node",
        |w| async move {
            let api = MockApi::new();
            for (name, spec) in [
                ("kubernetes", json!({"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]})),
                ("web-front", json!({"clusterIP": "10.96.7.7", "ports": [{"port": 8080, "protocol": "TCP"}]})),
                ("headless", json!({"clusterIP": "None", "ports": [{"port": 9000}]})),
            ] {
                api.create("services", "default", json!({"metadata": {"name": name}, "spec": spec}));
            }
            let agent = start(&w, &api).await;
            let linked = w.pod_name("linked");
            api.create(
                "pods",
                "default",
                api_pod(&w, "linked", json!({
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": IMAGE, "command": ["/bin/sh", "-c",
                        "test \"$KUBERNETES_SERVICE_HOST\" = 10.96.0.1 && test \"$KUBERNETES_SERVICE_PORT\" = 443 \
                         && test \"$KUBERNETES_SERVICE_PORT_HTTPS\" = 443 && test \"$WEB_FRONT_SERVICE_HOST\" = 10.96.7.7 \
                         && test \"$WEB_FRONT_PORT\" = tcp://10.96.7.7:8080 \
                         && test \"$WEB_FRONT_PORT_8080_TCP_ADDR\" = 10.96.7.7 && test -z \"$HEADLESS_SERVICE_HOST\""]}]
                })),
            );
            let unlinked = w.pod_name("unlinked");
            api.create(
                "pods",
                "default",
                api_pod(&w, "unlinked", json!({
                    "restartPolicy": "Never",
                    "enableServiceLinks": false,
                    "containers": [{"name": "main", "image": IMAGE, "command": ["/bin/sh", "-c",
                        "test \"$KUBERNETES_SERVICE_HOST\" = 10.96.0.1 && test -z \"$WEB_FRONT_SERVICE_HOST\""]}]
                })),
            );
            for pod in [&linked, &unlinked] {
                let done = wait_api_phase(&api, pod, "Succeeded", Duration::from_secs(60)).await;
                assert_eq!(done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 0, "{pod}");
            }

            // The node lacks the label the pod selects: rejected as upstream.
            let ssd = w.pod_name("ssd");
            api.create(
                "pods",
                "default",
                api_pod(&w, "ssd", json!({"nodeSelector": {"disk": "ssd"},
                    "containers": [{"name": "main", "image": IMAGE, "command": ["/bin/sleep", "3600"]}]})),
            );
            let rejected = wait_api_phase(&api, &ssd, "Failed", Duration::from_secs(30)).await;
            assert_eq!(rejected["status"]["reason"], "NodeAffinity");
            assert_eq!(
                rejected["status"]["message"],
                "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
            );
            // An administrator labels the node; the next such pod is admitted.
            api.modify("nodes", "", &w.name, |n| n["metadata"]["labels"]["disk"] = json!("ssd"));
            tokio::time::sleep(Duration::from_secs(1)).await;
            let ssd2 = w.pod_name("ssd2");
            api.create(
                "pods",
                "default",
                api_pod(&w, "ssd2", json!({"nodeSelector": {"disk": "ssd"},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": IMAGE, "command": ["/bin/sleep", "3600"]}]})),
            );
            wait_api_phase(&api, &ssd2, "Running", Duration::from_secs(60)).await;
            // The Node was watched by name, not listed per pod.
            assert!(
                api.requests_matching("GET", "/api/v1/nodes")
                    .iter()
                    .any(|r| r.query.contains("watch=true") && r.query.contains(&format!("fieldSelector=metadata.name%3D{}", w.name))),
                "a watch of the node"
            );
            agent.stop().await;
        },
    )
    .await;
}
