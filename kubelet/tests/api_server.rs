//! API-server mode against the mocked API server (no containerd needed):
//! registration and adoption of the Node, the Lease cadence in paused time,
//! node status patches, the pod watch (410 Gone, outage) and the status
//! manager (retries, no regressions, final delete).

#[path = "support/apiserver.rs"]
mod apiserver;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use apiserver::MockApi;
use axum::http::Method;
use evlet::api::node::{self, NodeInput};
use evlet::api::pods::{self, Mirrors};
use evlet::api::status::StatusManager;
use evlet::source::{Source, SourceMessage};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

fn input(ready: Arc<AtomicBool>) -> NodeInput {
    NodeInput {
        name: "n1".into(),
        node_ip: Some("10.1.2.3".into()),
        hostname: "host-1".into(),
        max_pods: 110,
        taints: vec![],
        labels: [("node.kubernetes.io/pool".to_owned(), "edge".to_owned())].into(),
        root_dir: std::env::temp_dir(),
        runtime_version: "containerd://1.7.24".into(),
        runtime_support: Default::default(),
        port: 10255,
        pressure: watch::channel(evlet::eviction::Pressure::default()).1,
        reserved: Default::default(),
        ready: Arc::new(move || {
            if ready.load(Ordering::Relaxed) {
                Ok(())
            } else {
                Err(evlet::health::NotReady {
                    check: "PLEG",
                    problem: evlet::health::Unhealthy::PlegStale {
                        ago: std::time::Duration::from_secs(180),
                        threshold: std::time::Duration::from_secs(180),
                    },
                })
            }
        }),
    }
}

fn healthy() -> NodeInput {
    input(Arc::new(AtomicBool::new(true)))
}

fn lines(api: &MockApi) -> Vec<String> {
    api.requests().iter().map(|r| r.line()).collect()
}

#[tokio::test(start_paused = true)]
async fn first_registration_creates_the_node_with_capacity_labels_and_conditions() {
    let api = MockApi::new();
    let token = CancellationToken::new();
    let node = node::register(&api.client(), &healthy(), &token)
        .await
        .expect("registered");
    assert!(
        node.metadata.uid.is_some(),
        "the server's object comes back"
    );
    assert_eq!(lines(&api), ["POST /api/v1/nodes"]);
    let body = api.requests()[0].body.clone().expect("body");
    assert_eq!(body["metadata"]["name"], "n1");
    assert_eq!(body["metadata"]["labels"]["kubernetes.io/hostname"], "n1");
    assert_eq!(body["metadata"]["labels"]["kubernetes.io/os"], "linux");
    assert!(body["metadata"]["labels"]["kubernetes.io/arch"].is_string());
    assert_eq!(
        body["metadata"]["labels"]["node.kubernetes.io/pool"],
        "edge"
    );
    assert_eq!(body["status"]["capacity"]["pods"], "110");
    assert!(
        body["status"]["capacity"]["cpu"]
            .as_str()
            .is_some_and(|c| c.parse::<u32>().is_ok_and(|n| n >= 1))
    );
    assert_eq!(
        body["status"]["nodeInfo"]["containerRuntimeVersion"],
        "containerd://1.7.24"
    );
    assert_eq!(
        body["status"]["addresses"],
        json!([{"type": "InternalIP", "address": "10.1.2.3"}, {"type": "Hostname", "address": "host-1"}])
    );
    let ready = body["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .expect("Ready condition");
    assert_eq!(ready["status"], "True");
    assert_eq!(ready["reason"], "KubeletReady");
}

#[tokio::test(start_paused = true)]
async fn an_existing_node_is_adopted_keeping_its_spec_and_labels() {
    let api = MockApi::new();
    api.create(
        "nodes",
        "",
        json!({"metadata": {"name": "n1", "labels": {"team": "storage"}},
               "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}),
    );
    let token = CancellationToken::new();
    node::register(&api.client(), &healthy(), &token)
        .await
        .expect("adopted");
    assert_eq!(
        lines(&api),
        [
            "POST /api/v1/nodes",
            "GET /api/v1/nodes/n1",
            "PATCH /api/v1/nodes/n1/status"
        ]
    );
    let patch = &api.requests()[2];
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    let stored = api.get("nodes", "", "n1").expect("node");
    assert_eq!(stored["metadata"]["labels"]["team"], "storage");
    assert_eq!(
        stored["metadata"]["labels"]["node.kubernetes.io/pool"],
        "edge"
    );
    assert_eq!(stored["metadata"]["labels"]["kubernetes.io/hostname"], "n1");
    assert_eq!(stored["spec"]["taints"][0]["key"], "dedicated");
    assert_eq!(stored["status"]["capacity"]["pods"], "110");
}

#[tokio::test(start_paused = true)]
async fn registration_retries_through_server_errors() {
    let api = MockApi::new();
    api.fail(Method::POST, "/api/v1/nodes", 500, 2);
    let token = CancellationToken::new();
    let start = tokio::time::Instant::now();
    node::register(&api.client(), &healthy(), &token)
        .await
        .expect("registered");
    assert_eq!(api.requests_matching("POST", "/api/v1/nodes").len(), 3);
    // Backoff 100 ms then 200 ms.
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(api.get("nodes", "", "n1").is_some());
}

fn secs(at: tokio::time::Instant, start: tokio::time::Instant) -> f64 {
    (at - start).as_secs_f64()
}

#[tokio::test(start_paused = true)]
async fn the_lease_is_created_then_renewed_every_ten_seconds() {
    let api = MockApi::new();
    let token = CancellationToken::new();
    let start = tokio::time::Instant::now();
    tokio::spawn(node::run_lease(
        api.client(),
        "n1".into(),
        Some("node-uid".into()),
        token.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(35)).await;
    token.cancel();
    let reqs = api.requests();
    let summary: Vec<(String, u64)> = reqs
        .iter()
        .map(|r| (r.line(), secs(r.at, start).round() as u64))
        .collect();
    let path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    assert_eq!(
        summary,
        [
            (format!("GET {path}/n1"), 0),
            (format!("POST {path}"), 0),
            (format!("PUT {path}/n1"), 10),
            (format!("PUT {path}/n1"), 20),
            (format!("PUT {path}/n1"), 30),
        ]
    );
    let lease = api
        .get("leases", "kube-node-lease", "n1")
        .expect("lease exists");
    assert_eq!(lease["spec"]["holderIdentity"], "n1");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
    assert_eq!(lease["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(lease["metadata"]["ownerReferences"][0]["uid"], "node-uid");
    let renew_times: Vec<String> = reqs[2..]
        .iter()
        .filter_map(|r| {
            r.body.as_ref()?["spec"]["renewTime"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(renew_times.len(), 3, "each PUT carries a renewTime");
}

#[tokio::test(start_paused = true)]
async fn lease_renewal_backs_off_in_an_outage_and_refetches_after_a_conflict() {
    let api = MockApi::new();
    let token = CancellationToken::new();
    let start = tokio::time::Instant::now();
    tokio::spawn(node::run_lease(
        api.client(),
        "n1".into(),
        None,
        token.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(5)).await;
    api.set_outage(true);
    tokio::time::sleep(Duration::from_secs(10)).await; // until t = 15 s
    api.set_outage(false);
    tokio::time::sleep(Duration::from_secs(3)).await; // t = 18 s
    // Failed at 10, 10.2, 10.6, 11.4, 13.0; the retry at 16.2 s fetches and renews.
    let after: Vec<(String, f64)> = api
        .requests()
        .iter()
        .filter(|r| r.at > start + Duration::from_secs(5))
        .map(|r| (r.method.clone(), secs(r.at, start)))
        .collect();
    assert_eq!(
        after.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(),
        ["GET", "PUT"],
        "{after:?}"
    );
    assert!((after[0].1 - 16.2).abs() < 0.05, "{after:?}");
    // Someone else writes the lease: the next PUT conflicts (409), and evlet
    // fetches the new version before renewing again.
    api.modify("leases", "kube-node-lease", "n1", |l| {
        l["metadata"]["labels"] = json!({"touched": "yes"})
    });
    let mark = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(12)).await;
    token.cancel();
    let seq: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.at >= mark)
        .map(|r| r.method.clone())
        .collect();
    assert_eq!(seq, ["PUT", "GET", "PUT"], "409, re-fetch, renew");
    let lease = api.get("leases", "kube-node-lease", "n1").expect("lease");
    assert_eq!(
        lease["metadata"]["labels"]["touched"], "yes",
        "the other write is kept"
    );
}

/// Registers node n1 and starts its status loop (watching its own Node, as
/// the agent does) until `token`; returns when the loop started.
async fn run_status(
    api: &MockApi,
    input: NodeInput,
    token: &CancellationToken,
) -> tokio::time::Instant {
    let registered = node::register(&api.client(), &input, token)
        .await
        .expect("registered");
    tokio::spawn(node::run_status(
        api.client(),
        input,
        registered,
        node::SelfWatch::start(api.client(), "n1", token.child_token()),
        token.clone(),
    ));
    tokio::time::Instant::now()
}

#[tokio::test(start_paused = true)]
async fn node_status_is_patched_on_change_and_otherwise_every_five_minutes() {
    let api = MockApi::new();
    let ready = Arc::new(AtomicBool::new(true));
    let input = input(Arc::clone(&ready));
    let token = CancellationToken::new();
    let start = run_status(&api, input, &token).await;
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert!(
        api.requests_matching("PATCH", "/status").is_empty(),
        "nothing changed, nothing sent"
    );
    ready.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(10)).await; // t = 55 s
    let patches = api.requests_matching("PATCH", "/api/v1/nodes/n1/status");
    assert_eq!(patches.len(), 1);
    assert!((secs(patches[0].at, start) - 50.0).abs() < 0.5);
    let stored = api.get("nodes", "", "n1").expect("node");
    let cond = apiserver::condition(&stored, "Ready").expect("Ready");
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "KubeletNotReady");
    assert!(cond["message"].as_str().is_some_and(|m| m.contains("PLEG")));
    tokio::time::sleep(Duration::from_secs(300)).await; // t = 355 s
    token.cancel();
    let patches = api.requests_matching("PATCH", "/api/v1/nodes/n1/status");
    let at: Vec<u64> = patches
        .iter()
        .map(|p| secs(p.at, start).round() as u64)
        .collect();
    assert_eq!(at, [50, 350], "then only the 5-minute report");
}

#[tokio::test(start_paused = true)]
async fn a_condition_another_writer_changed_is_put_right_at_the_next_tick() {
    let api = MockApi::new();
    let input = healthy();
    let token = CancellationToken::new();
    let start = run_status(&api, input, &token).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(api.requests_matching("PATCH", "/status").is_empty());
    // What the node lifecycle controller writes when the Lease went stale.
    api.modify("nodes", "", "n1", apiserver::mark_node_unknown);
    tokio::time::sleep(Duration::from_secs(10)).await; // t = 22 s
    let patches = api.requests_matching("PATCH", "/api/v1/nodes/n1/status");
    assert_eq!(patches.len(), 1, "put right at the next 10 s tick");
    assert!((secs(patches[0].at, start) - 20.0).abs() < 0.5);
    let stored = api.get("nodes", "", "n1").expect("node");
    let ready = apiserver::condition(&stored, "Ready").expect("Ready");
    assert_eq!(ready["status"], "True", "{ready:#}");
    assert_eq!(ready["reason"], "KubeletReady");
    tokio::time::sleep(Duration::from_secs(60)).await;
    token.cancel();
    assert_eq!(
        api.requests_matching("PATCH", "/api/v1/nodes/n1/status")
            .len(),
        1,
        "and nothing more once the API holds it"
    );
}

#[tokio::test(start_paused = true)]
async fn pressure_conditions_taint_the_node_no_schedule_and_untaint_it() {
    let api = MockApi::new();
    api.create(
        "nodes",
        "",
        json!({"metadata": {"name": "n1"},
               "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}),
    );
    let (pressure, rx) = watch::channel(evlet::eviction::Pressure::default());
    let mut input = healthy();
    input.pressure = rx;
    let token = CancellationToken::new();
    run_status(&api, input, &token).await;
    let taints = || {
        let node = api.get("nodes", "", "n1").expect("node");
        node["spec"]["taints"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .map(|t| {
                        format!(
                            "{}:{}",
                            t["key"].as_str().unwrap_or(""),
                            t["effect"].as_str().unwrap_or("")
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(taints(), ["dedicated:NoSchedule"], "no pressure, no taint");
    pressure.send_replace(evlet::eviction::Pressure {
        memory: true,
        disk: true,
        pid: false,
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        taints(),
        [
            "dedicated:NoSchedule",
            "node.kubernetes.io/memory-pressure:NoSchedule",
            "node.kubernetes.io/disk-pressure:NoSchedule"
        ]
    );
    // The patch is guarded by the resourceVersion it read.
    let patch = api
        .requests_matching("PATCH", "/api/v1/nodes/n1")
        .into_iter()
        .find(|r| r.body.as_ref().is_some_and(|b| !b["spec"].is_null()))
        .and_then(|r| r.body)
        .expect("a spec patch");
    assert!(patch["metadata"]["resourceVersion"].is_string(), "{patch}");
    pressure.send_replace(evlet::eviction::Pressure::default());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        taints(),
        ["dedicated:NoSchedule"],
        "an administrator's taint stays"
    );
    token.cancel();
}

fn pod(name: &str, node: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "evlet.local/test:v1"}]},
        "status": {"phase": "Pending"}
    })
}

async fn next_message(rx: &mut mpsc::Receiver<SourceMessage>) -> SourceMessage {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a message in time")
        .expect("source open")
}

async fn next_snapshot(rx: &mut mpsc::Receiver<SourceMessage>) -> Vec<Pod> {
    match next_message(rx).await {
        SourceMessage::Snapshot(Source::Api, pods) => pods.iter().map(|p| (**p).clone()).collect(),
        other => panic!("expected a snapshot, got {other:?}"),
    }
}

/// The next changes message, as (names of upserted pods, uids removed).
async fn next_changes(rx: &mut mpsc::Receiver<SourceMessage>) -> (Vec<String>, Vec<String>) {
    match next_message(rx).await {
        SourceMessage::Changes {
            source: Source::Api,
            upserts,
            removed,
        } => (
            names(&upserts.iter().map(|p| (**p).clone()).collect::<Vec<_>>()),
            removed.into_iter().map(|u| u.0).collect(),
        ),
        other => panic!("expected changes, got {other:?}"),
    }
}

fn pods_uid(pods: &[Pod], name: &str) -> String {
    pods.iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .and_then(|p| p.metadata.uid.clone())
        .expect("the pod and its uid")
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn the_pod_watch_sends_this_nodes_pods_and_relists_after_410_gone() {
    let api = MockApi::new();
    api.create("pods", "default", pod("a", "n1"));
    api.create("pods", "default", pod("other", "n2"));
    let (tx, mut rx) = mpsc::channel(16);
    let (mirrors_tx, mut mirrors_rx) = watch::channel(Mirrors::new());
    let token = CancellationToken::new();
    tokio::spawn(pods::run(
        api.client(),
        "n1".into(),
        std::future::ready(()),
        tx,
        mirrors_tx,
        StatusManager::new() as Arc<dyn pods::Observer>,
        token.clone(),
    ));
    let first = next_snapshot(&mut rx).await;
    assert_eq!(names(&first), ["a"]);
    assert!(
        mirrors_rx.borrow_and_update().is_empty(),
        "no mirror pods yet"
    );
    let annotations = first[0].metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("kubernetes.io/config.source")
            .map(String::as_str),
        Some("api")
    );
    let list = &api.requests_matching("GET", "/api/v1/pods")[0];
    assert!(
        list.query.contains("fieldSelector=spec.nodeName%3Dn1"),
        "{}",
        list.query
    );

    // After the first list only what changed is sent.
    api.create("pods", "default", pod("b", "n1"));
    assert_eq!(next_changes(&mut rx).await, (vec!["b".to_owned()], vec![]));

    let mut mirror = pod("static-n1", "n1");
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
    api.create("pods", "default", mirror);
    tokio::time::timeout(Duration::from_secs(10), mirrors_rx.changed())
        .await
        .expect("mirrors in time")
        .expect("mirror channel open");
    assert!(
        mirrors_rx
            .borrow_and_update()
            .contains_key(&("default".to_owned(), "static-n1".to_owned()))
    );
    assert!(rx.try_recv().is_err(), "mirror pods are not pods to run");

    // The watch is cut and history compacted: resuming gets 410 Gone, so the
    // watcher lists again, and a pod added meanwhile is not missed.
    let lists_before = api
        .requests_matching("GET", "/api/v1/pods")
        .iter()
        .filter(|r| !r.query.contains("watch=true"))
        .count();
    api.set_outage(true);
    api.create("pods", "default", pod("c", "n1"));
    api.compact();
    api.set_outage(false);
    let after = next_snapshot(&mut rx).await;
    assert_eq!(names(&after), ["a", "b", "c"]);
    let lists_after = api
        .requests_matching("GET", "/api/v1/pods")
        .iter()
        .filter(|r| !r.query.contains("watch=true"))
        .count();
    assert!(lists_after > lists_before, "relisted after 410 Gone");

    let a_uid = pods_uid(&after, "a");
    api.delete_pod("default", "a", Some(0));
    assert_eq!(next_changes(&mut rx).await, (vec![], vec![a_uid]));
    token.cancel();
}

fn status(phase: &str) -> PodStatus {
    PodStatus {
        phase: Some(phase.into()),
        ..Default::default()
    }
}

fn as_pod(v: &serde_json::Value) -> Pod {
    let mut p: Pod = serde_json::from_value(v.clone()).expect("pod");
    p.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("kubernetes.io/config.source".into(), "api".into());
    p
}

#[tokio::test(start_paused = true)]
async fn statuses_are_patched_retried_never_regress_and_the_pod_is_finally_deleted() {
    let api = MockApi::new();
    let stored = api.create("pods", "default", pod("p1", "n1"));
    let p = as_pod(&stored);
    let uid = p.metadata.uid.clone().expect("uid");
    let manager = StatusManager::new();
    let token = CancellationToken::new();
    tokio::spawn(Arc::clone(&manager).run(api.client(), token.clone()));

    manager.set(&p, &status("Pending"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let patches = api.requests_matching("PATCH", "/api/v1/namespaces/default/pods/p1/status");
    assert_eq!(patches.len(), 1);
    assert_eq!(
        patches[0].content_type.as_deref(),
        Some("application/strategic-merge-patch+json")
    );
    let body = patches[0].body.clone().expect("body");
    assert_eq!(body["metadata"]["uid"], uid.as_str());
    assert_eq!(body["status"]["phase"], "Pending");

    // Throttled (429), then a server error: the newest status still arrives, after backoff.
    api.fail(Method::PATCH, "/pods/p1/status", 429, 1);
    api.fail(Method::PATCH, "/pods/p1/status", 503, 1);
    manager.set(&p, &status("Running"));
    manager.set(&p, &status("Running"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stored = api.get("pods", "default", "p1").expect("pod");
    assert_eq!(stored["status"]["phase"], "Running");
    assert_eq!(manager.pending(), 0);
    assert_eq!(
        api.requests_matching("PATCH", "/pods/p1/status").len(),
        4,
        "Pending, 429, 503, Running (two equal sets are one version)"
    );

    manager.set(&p, &status("Succeeded"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    manager.set(&p, &status("Running"));
    tokio::time::sleep(Duration::from_secs(15)).await;
    let stored = api.get("pods", "default", "p1").expect("pod");
    assert_eq!(
        stored["status"]["phase"], "Succeeded",
        "a terminal phase is never overwritten"
    );

    manager.delete(&p);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let deletes = api.requests_matching("DELETE", "/api/v1/namespaces/default/pods/p1");
    assert_eq!(deletes.len(), 1);
    let options = deletes[0].body.clone().expect("DeleteOptions");
    assert_eq!(options["gracePeriodSeconds"], 0);
    assert_eq!(options["preconditions"]["uid"], uid.as_str());
    assert!(api.get("pods", "default", "p1").is_none());
    token.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_status_another_writer_changed_is_sent_again() {
    let api = MockApi::new();
    let p = as_pod(&api.create("pods", "default", pod("p3", "n1")));
    let manager = StatusManager::new();
    let token = CancellationToken::new();
    tokio::spawn(Arc::clone(&manager).run(api.client(), token.clone()));
    let (tx, _rx) = mpsc::channel(16);
    let (mirrors_tx, _mirrors_rx) = watch::channel(Mirrors::new());
    tokio::spawn(pods::run(
        api.client(),
        "n1".into(),
        std::future::ready(()),
        tx,
        mirrors_tx,
        Arc::clone(&manager) as Arc<dyn pods::Observer>,
        token.clone(),
    ));
    let ready = |s: &str| k8s_openapi::api::core::v1::PodCondition {
        type_: "Ready".into(),
        status: s.into(),
        ..Default::default()
    };
    let running = PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![ready("True")]),
        ..Default::default()
    };
    manager.set(&p, &running);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let patches = || api.requests_matching("PATCH", "/pods/p3/status").len();
    assert_eq!(patches(), 1, "sent once, and the API holds it");
    // What the node lifecycle controller writes when the node stopped reporting.
    api.modify("pods", "default", "p3", |p| {
        p["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
    });
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(patches(), 2, "sent again within a sync period");
    let stored = api.get("pods", "default", "p3").expect("pod");
    assert_eq!(stored["status"]["conditions"][0]["status"], "True");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(patches(), 2, "and no more once the API holds it");
    token.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_final_delete_never_removes_a_new_pod_of_the_same_name() {
    let api = MockApi::new();
    let old = as_pod(&api.create("pods", "default", pod("p2", "n1")));
    api.delete_pod("default", "p2", Some(0));
    api.create("pods", "default", pod("p2", "n1"));
    let manager = StatusManager::new();
    let token = CancellationToken::new();
    tokio::spawn(Arc::clone(&manager).run(api.client(), token.clone()));
    manager.delete(&old);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(api.requests_matching("DELETE", "/pods/p2").len(), 1);
    assert!(
        api.get("pods", "default", "p2").is_some(),
        "the UID precondition protects the new pod"
    );
    assert!(manager.deletes_pending().is_empty(), "409 ends the attempt");
    token.cancel();
}

fn event(reason: &str, message: &str) -> evlet::diagnostics::Event {
    evlet::diagnostics::Event {
        node: false,
        kind: "Warning".into(),
        reason: reason.into(),
        message: message.into(),
        namespace: "default".into(),
        pod: "crashy".into(),
        pod_uid: "uid-crashy".into(),
        container: Some("app".into()),
        field_path: Some("spec.containers{app}".into()),
        time: "2026-11-23T08:00:00Z".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn repeated_events_are_aggregated_and_a_flood_is_rate_limited() {
    let api = MockApi::new();
    let (tx, rx) = mpsc::channel(1000);
    let token = CancellationToken::new();
    tokio::spawn(evlet::api::events::run(
        api.client(),
        "n1".into(),
        rx,
        token.clone(),
    ));
    let back_off = "Back-off restarting failed container app in pod crashy_default";
    for _ in 0..3 {
        tx.send(event("BackOff", back_off)).await.expect("send");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        api.requests_matching("POST", "/namespaces/default/events")
            .len(),
        1
    );
    assert_eq!(
        api.requests_matching("PATCH", "/namespaces/default/events/")
            .len(),
        2
    );
    let stored = api.list("events");
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["count"], 3);
    assert_eq!(stored[0]["reason"], "BackOff");
    assert_eq!(stored[0]["involvedObject"]["uid"], "uid-crashy");
    assert_eq!(
        stored[0]["involvedObject"]["fieldPath"],
        "spec.containers{app}"
    );
    assert_eq!(stored[0]["source"]["component"], "kubelet");

    // 100 distinct events at once: the pod's bucket (25, 3 used) lets 22 through.
    for i in 0..100 {
        tx.send(event("Failed", &format!("attempt {i}")))
            .await
            .expect("send");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(api.list("events").len(), 1 + 22);
    // Five minutes later one more token has come.
    tokio::time::sleep(Duration::from_secs(301)).await;
    tx.send(event("Failed", "later")).await.expect("send");
    tx.send(event("Failed", "later still")).await.expect("send");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(api.list("events").len(), 1 + 22 + 1);
    token.cancel();
}

#[tokio::test]
async fn a_kubeconfig_client_registers_over_http_with_its_token() {
    let api = MockApi::new();
    let addr = api.serve_http().await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: mock\n  cluster: {{server: \"http://{addr}\"}}\nusers:\n- name: evlet\n  user: {{token: node-token}}\ncontexts:\n- name: mock\n  context: {{cluster: mock, user: evlet}}\ncurrent-context: mock\n"
        ),
    )
    .expect("write kubeconfig");
    let client = evlet::api::ApiClient::from_kubeconfig(&path)
        .await
        .expect("client");
    let token = CancellationToken::new();
    node::register(&client.client, &healthy(), &token)
        .await
        .expect("registered");
    let reqs = api.requests();
    assert_eq!(reqs[0].line(), "POST /api/v1/nodes");
    assert_eq!(reqs[0].authorization.as_deref(), Some("Bearer node-token"));

    let missing = dir.path().join("nope");
    let err = evlet::api::ApiClient::from_kubeconfig(&missing)
        .await
        .expect_err("no file");
    assert!(err.to_string().contains("nope"), "{err}");
}

/// Sends one raw request to the mock and returns the status code.
async fn raw(
    api: &MockApi,
    method: &str,
    path: &str,
    content_type: &str,
    body: serde_json::Value,
) -> u16 {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(serde_json::to_vec(&body).expect("json"))
        .expect("request");
    match api.client().request_text(request).await {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("unexpected client error {e}"),
    }
}

/// The mock is as strict as the API server where a mistake of evlet's
/// would otherwise pass unnoticed: patch formats, strategic-merge order
/// directives, the kind and namespace of created objects.
#[tokio::test]
async fn the_mock_refuses_what_the_api_server_refuses() {
    let api = MockApi::new();
    api.create(
        "pods",
        "default",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
    );
    let path = "/api/v1/namespaces/default/pods/p/status";
    let conditions = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    assert_eq!(
        raw(&api, "PATCH", path, "application/json", conditions.clone()).await,
        415,
        "a PATCH must name a patch format"
    );
    assert_eq!(
        raw(
            &api,
            "PATCH",
            path,
            "application/strategic-merge-patch+json",
            conditions.clone()
        )
        .await,
        200
    );
    let bad_order = json!({"status": {
        "$setElementOrder/conditions": [{"type": "Initialized"}],
        "conditions": [{"type": "Ready", "status": "True"}]
    }});
    assert_eq!(
        raw(
            &api,
            "PATCH",
            path,
            "application/strategic-merge-patch+json",
            bad_order
        )
        .await,
        400,
        "an element missing from $setElementOrder"
    );
    let good_order = json!({"status": {
        "$setElementOrder/conditions": [{"type": "Initialized"}, {"type": "Ready"}],
        "conditions": [{"type": "Ready", "status": "True"}]
    }});
    assert_eq!(
        raw(
            &api,
            "PATCH",
            path,
            "application/strategic-merge-patch+json",
            good_order
        )
        .await,
        200
    );
    // A resourceVersion in a patch is a precondition; a merge patch replaces lists.
    let node_path = "/api/v1/nodes/n9";
    api.create(
        "nodes",
        "",
        json!({"metadata": {"name": "n9"}, "spec": {"taints": [
            {"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}]}}),
    );
    let stale = json!({"metadata": {"resourceVersion": "999999"}, "spec": {"taints": []}});
    assert_eq!(
        raw(
            &api,
            "PATCH",
            node_path,
            "application/merge-patch+json",
            stale
        )
        .await,
        409,
        "a stale resourceVersion"
    );
    let rv = api.get("nodes", "", "n9").expect("node")["metadata"]["resourceVersion"].clone();
    let current = json!({"metadata": {"resourceVersion": rv},
                         "spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}});
    assert_eq!(
        raw(
            &api,
            "PATCH",
            node_path,
            "application/merge-patch+json",
            current
        )
        .await,
        200
    );
    assert_eq!(
        api.get("nodes", "", "n9").expect("node")["spec"]["taints"],
        json!([{"key": "b", "effect": "NoSchedule"}]),
        "the list replaced whole"
    );
    let wrong_kind = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}});
    assert_eq!(
        raw(
            &api,
            "POST",
            "/api/v1/namespaces/default/pods",
            "application/json",
            wrong_kind
        )
        .await,
        400
    );
    let wrong_ns =
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "namespace": "other"}});
    assert_eq!(
        raw(
            &api,
            "POST",
            "/api/v1/namespaces/default/pods",
            "application/json",
            wrong_ns
        )
        .await,
        400
    );
}
