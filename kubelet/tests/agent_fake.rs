//! The whole agent (`agent::start`) over the fake runtime: fast, unprivileged
//! tests of what the wiring promises — orphans wait for every source, an
//! unusable eBPF falls back to `generic`, the HTTP endpoint serves health,
//! metrics, pods and the kernel's OOM records, each port serves its own
//! routes (the read-only port upstream's, the diagnostics only on the
//! secured port and the local socket), and the eviction manager's container
//! reclaim removes dead containers at once.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use evlet::agent::{self, Handles};
use evlet::config::{Config, LogFormat, PlegMode};
use evlet::pod::labels;
use evlet_cri::fake::FakeServer;
use evlet_cri::{Options, RuntimeClient, SandboxFilter, api};
use evlet_testkit::{eventually, within};
use http_body_util::BodyExt as _;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

const IMAGE: &str = "evlet.local/test:v1";

struct Agent {
    handles: Handles,
    shutdown: CancellationToken,
    _server: FakeServer,
    _root: tempfile::TempDir,
    _manifests: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn config(server: &FakeServer, root: &tempfile::TempDir, manifests: &tempfile::TempDir) -> Config {
    Config {
        node_name: "fake-node".into(),
        root_dir: root.path().to_path_buf(),
        pod_manifest_path: Some(manifests.path().to_path_buf()),
        manifest_url: None,
        runtime_endpoint: server.endpoint(),
        cgroup_root: "/evlet-fake-agent".into(),
        cgroup_driver: evlet::cm::Driver::Cgroupfs,
        http: evlet::config::HttpEndpoints {
            read_only: Some("127.0.0.1:0".parse().expect("address")),
            ..Default::default()
        },
        file_check_frequency: Duration::from_millis(200),
        http_check_frequency: Duration::from_millis(200),
        node_ip: Some("10.0.0.9".into()),
        pleg_mode: PlegMode::Generic,
        relist_period: Duration::from_millis(100),
        ebpf_relist_period: Duration::from_secs(2),
        ebpf_ring_bytes: 1 << 20,
        log_format: LogFormat::Text,
        api: None,
        max_pods: evlet::config::MAX_PODS,
        register_with_taints: Vec::new(),
        node_labels: Default::default(),
        secure: None,
        sync_frequency: evlet::workers::RESYNC,
        pods: Default::default(),
        // Memory only: the fake runtime's node has no pods to evict, and the
        // host's disk may be fuller than upstream's defaults allow.
        eviction: evlet::eviction::thresholds::parse(&evlet::eviction::thresholds::Config {
            hard: Some([("memory.available".to_owned(), "100Mi".to_owned())].into()),
            ..Default::default()
        })
        .expect("valid eviction settings"),
        image_gc: evlet::image_gc::Policy {
            high_threshold_percent: 100,
            low_threshold_percent: 80,
            ..Default::default()
        },
        pod_infra_container_image: None,
        container_gc: Default::default(),
        reservations: Default::default(),
        pod_pids_limit: -1,
        // The fake runtime's node: its cgroup tree is a directory of the test's.
        cgroup_layout: Some(evlet::cm::Layout::V1 {
            cpu: Some(root.path().join("cgroup/cpu")),
            memory: Some(root.path().join("cgroup/memory")),
            pids: Some(root.path().join("cgroup/pids")),
        }),
        single_process_oom_kill: None,
    }
}

async fn start(server: FakeServer, edit: impl FnOnce(&mut Config)) -> Agent {
    let root = tempfile::tempdir().expect("root");
    let manifests = tempfile::tempdir().expect("manifests");
    let mut config = config(&server, &root, &manifests);
    edit(&mut config);
    let shutdown = CancellationToken::new();
    let (handles, _task) = agent::start(config, shutdown.clone())
        .await
        .expect("agent starts");
    Agent {
        handles,
        shutdown,
        _server: server,
        _root: root,
        _manifests: manifests,
    }
}

/// A GET through the agent's router: status code and body.
async fn get(agent: &Agent, path: &str) -> (u16, String) {
    let router = evlet::server::local::router(Arc::clone(&agent.handles.served));
    let response = within(
        Duration::from_secs(5),
        path,
        router.oneshot(
            axum::http::Request::get(path)
                .body(Body::empty())
                .expect("request"),
        ),
    )
    .await
    .expect("infallible");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A pod in the runtime that no source knows (left by an earlier agent).
async fn runtime_pod(server: &FakeServer, uid: &str) -> RuntimeClient {
    let client = RuntimeClient::connect(&server.endpoint(), Options::default()).expect("client");
    let labels: std::collections::HashMap<String, String> = [
        (labels::POD_UID, uid),
        (labels::POD_NAME, "leftover"),
        (labels::POD_NAMESPACE, "default"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let config = api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "leftover".into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        labels,
        ..Default::default()
    };
    client.run_pod_sandbox(config, "").await.expect("sandbox");
    client
}

async fn sandboxes(client: &RuntimeClient) -> usize {
    client
        .list_pod_sandbox(SandboxFilter::new().label(labels::POD_UID, "leftover-uid".to_owned()))
        .await
        .expect("list")
        .iter()
        .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
        .count()
}

/// Upstream's `sourcesReady`: a pod the runtime has and no source wants is
/// removed only once every source has answered. An unreachable manifest URL
/// has not answered, so the pod lives on; once the URL answers (with no pods),
/// the pod is an orphan and goes.
#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_pod_stays_until_every_source_has_answered() {
    let server = FakeServer::start(&[IMAGE]).await.expect("fake runtime");
    let client = runtime_pod(&server, "leftover-uid").await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port();
    let agent = start(server, |c| {
        c.manifest_url = Some(format!("http://127.0.0.1:{port}/pods"));
    })
    .await;
    // Housekeeping runs every 2 s: give it three rounds.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        sandboxes(&client).await,
        1,
        "kept while the URL is unreachable"
    );
    assert!(get(&agent, "/healthz").await.1.contains("sources waiting"));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the URL's port");
    let app = axum::Router::new().route(
        "/pods",
        axum::routing::get(|| async { r#"{"apiVersion": "v1", "kind": "PodList", "items": []}"# }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    eventually(Duration::from_secs(15), "the orphan removed", || async {
        (sandboxes(&client).await == 0).then_some(())
    })
    .await;
}

/// A requested `ebpf` mode that cannot load falls back to `generic`, says so
/// in `/healthz` and `evlet_pleg_mode`, and the agent works.
#[tokio::test(flavor = "multi_thread")]
async fn an_ebpf_mode_that_cannot_load_falls_back_to_generic() {
    let server = FakeServer::start(&[IMAGE]).await.expect("fake runtime");
    // A ring buffer must be a power of two pages: no kernel accepts 3 bytes
    // (and without root nothing loads at all).
    let agent = start(server, |c| {
        c.pleg_mode = PlegMode::Ebpf;
        c.ebpf_ring_bytes = 3;
    })
    .await;
    assert!(agent.handles.ebpf.is_none() && agent.handles.hints.is_none());
    eventually(Duration::from_secs(5), "a healthy PLEG", || async {
        let (code, body) = get(&agent, "/healthz").await;
        (code == 200 && body.contains("[+]pleg ok (mode generic)")).then_some(())
    })
    .await;
    let (_, metrics) = get(&agent, "/metrics").await;
    assert!(
        metrics.contains(r#"evlet_pleg_mode{mode="generic"} 1"#),
        "{metrics}"
    );
}

/// `/healthz`, `/metrics`, `/pods`, `/events` and `/debug/oom` answer with
/// what the agent knows, in their formats.
#[tokio::test(flavor = "multi_thread")]
async fn the_http_endpoint_serves_health_metrics_pods_and_oom_records() {
    let server = FakeServer::start(&[IMAGE]).await.expect("fake runtime");
    let agent = start(server, |_| {}).await;
    std::fs::write(
        agent._manifests.path().join("web.yaml"),
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  containers:\n  - {{name: app, image: {IMAGE}}}\n"),
    )
    .expect("manifest");
    eventually(Duration::from_secs(10), "web running", || async {
        let (_, body) = get(&agent, "/pods/default/web-fake-node").await;
        body.contains(r#""phase":"Running""#).then_some(())
    })
    .await;
    let (code, health) = get(&agent, "/healthz").await;
    assert_eq!(code, 200, "{health}");
    assert!(
        health.contains("[+]runtime ok") || health.contains("[+]pleg ok"),
        "{health}"
    );
    let (code, metrics) = get(&agent, "/metrics").await;
    assert_eq!(code, 200);
    for name in [
        "kubelet_pleg_relist_duration_seconds_count",
        "kubelet_running_pods 1",
        "evlet_pleg_missed_events_total 0",
    ] {
        assert!(metrics.contains(name), "{name} in /metrics");
    }
    let (_, pods) = get(&agent, "/pods").await;
    let pods: serde_json::Value = serde_json::from_str(&pods).expect("PodList");
    assert_eq!(pods["kind"], "PodList");
    assert!(
        pods["items"][0]["status"]["podIP"].as_str().is_some(),
        "a pod IP"
    );
    assert_eq!(get(&agent, "/pods/default/nope").await.0, 404);

    assert_eq!(get(&agent, "/debug/oom").await.1, "[]");
    agent
        .handles
        .diagnostics
        .oom(evlet::diagnostics::OomRecord {
            namespace: "default".into(),
            pod: "web-fake-node".into(),
            pod_uid: "u".into(),
            container: "app".into(),
            container_id: "c".into(),
            pid: 42,
            tid: 42,
            comm: "hog".into(),
            cgroup_id: 7,
            anon_rss_kb: Some(1024),
            file_rss_kb: Some(0),
            shmem_rss_kb: Some(0),
            total_vm_kb: Some(2048),
            oom_score_adj: 1000,
            victim_is_init: Some(true),
            limit_hit: Some("pod".into()),
            memcg_limit_bytes: Some(64 << 20),
            levels: Vec::new(),
            time: "2026-11-23T00:00:00Z".into(),
        });
    let (_, ooms) = get(&agent, "/debug/oom").await;
    let ooms: serde_json::Value = serde_json::from_str(&ooms).expect("JSON");
    assert_eq!(ooms[0]["comm"], "hog");
    assert_eq!(ooms[0]["pid"], 42);
    let (_, events) = get(&agent, "/events").await;
    assert!(
        events.contains("OOMKilling") && events.contains("pid 42 (hog)"),
        "{events}"
    );
    assert!(
        events.contains("pod memory limit 67108864 bytes hit"),
        "{events}"
    );
}

/// The node-level reclaim's container collection (upstream's
/// `DeleteAllUnusedContainers` before an eviction for disk) runs at once, not
/// at the next GC period, waits until its removals are done and says how many
/// there were. As upstream's (`evictNonDeletedPods`), it takes a finished
/// pod's newest dead instance too, and then its stopped sandbox, which the
/// periodic collection keeps.
#[tokio::test(flavor = "multi_thread")]
async fn a_container_reclaim_removes_the_dead_containers_at_once() {
    let server = FakeServer::start(&[IMAGE]).await.expect("fake runtime");
    let client = RuntimeClient::connect(&server.endpoint(), Options::default()).expect("client");
    let agent = start(server, |c| {
        // Never collect on the timer.
        c.container_gc.period = Duration::from_secs(3600);
    })
    .await;
    std::fs::write(
        agent._manifests.path().join("once.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: once}}\nspec:\n  restartPolicy: Never\n  containers:\n  - {{name: app, image: {IMAGE}}}\n"
        ),
    )
    .expect("manifest");
    let containers = || async {
        client
            .list_containers(evlet_cri::ContainerFilter::new())
            .await
            .expect("containers")
    };
    let id = eventually(Duration::from_secs(10), "the container running", || async {
        containers()
            .await
            .into_iter()
            .find(|c| c.state == api::ContainerState::ContainerRunning as i32)
            .map(|c| evlet_cri::ContainerId::new(c.id))
    })
    .await;
    assert!(agent._server.runtime().exit_container(&id, 0, "Completed"));
    eventually(Duration::from_secs(10), "the exit in the cache", || async {
        agent
            .handles
            .cache
            .known()
            .iter()
            .flat_map(|p| p.containers.iter())
            .any(|c| c.id == id && c.state == evlet::runtime::State::Exited)
            .then_some(())
    })
    .await;
    // The pod completed: Succeeded, its sandbox stopped.
    eventually(
        Duration::from_secs(10),
        "the pod Succeeded, its sandbox stopped",
        || async {
            let done = agent.handles.workers.views().iter().any(|v| {
                v.pod.metadata.name.as_deref() == Some("once-fake-node")
                    && v.status.phase.as_deref() == Some("Succeeded")
            });
            let stopped = client
                .list_pod_sandbox(SandboxFilter::new())
                .await
                .ok()?
                .iter()
                .all(|s| s.state == api::PodSandboxState::SandboxNotready as i32);
            (done && stopped).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(containers().await.len(), 1, "the timer collected nothing");
    let removed = within(
        Duration::from_secs(10),
        "the reclaim",
        agent.handles.reclaim.collect(),
    )
    .await;
    assert_eq!(removed, Some(1));
    assert!(containers().await.is_empty(), "removed before the answer");
    let left = client
        .list_pod_sandbox(SandboxFilter::new())
        .await
        .expect("sandboxes");
    assert!(left.is_empty(), "the stopped sandbox goes too: {left:?}");
    // The status keeps the container's terminated state.
    let view = agent
        .handles
        .workers
        .views()
        .into_iter()
        .find(|v| v.pod.metadata.name.as_deref() == Some("once-fake-node"))
        .expect("the pod's view");
    assert_eq!(view.status.phase.as_deref(), Some("Succeeded"));
    let app = view
        .status
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .expect("the terminated state");
    assert_eq!(app.exit_code, 0);
}

/// The cgroup driver comes from the runtime when it says (`RuntimeConfig`,
/// upstream's `KubeletCgroupDriverFromCRI`), whatever the configuration says:
/// a runtime with `SystemdCgroup = true` makes the agent speak systemd, which
/// it refuses on this (v1-shaped) layout; without the call (containerd 1.6)
/// the configuration's stands.
#[tokio::test(flavor = "multi_thread")]
async fn the_cgroup_driver_is_the_runtimes() {
    let server = FakeServer::start(&[IMAGE]).await.expect("fake runtime");
    server.runtime().set_systemd_cgroup(true);
    let root = tempfile::tempdir().expect("root");
    let manifests = tempfile::tempdir().expect("manifests");
    let err = agent::start(config(&server, &root, &manifests), CancellationToken::new())
        .await
        .map(|_| ())
        .expect_err("systemd on v1 is refused");
    assert!(
        err.to_string()
            .starts_with("cgroupDriver: systemd needs pure cgroup v2"),
        "{err}"
    );
    // A runtime without RuntimeConfig: the configured cgroupfs.
    server.runtime().inject(
        "RuntimeConfig",
        evlet_cri::fake::Fault::Error(tonic::Code::Unimplemented, "unknown method".into()),
        None,
    );
    let agent = start(server, |_| {}).await;
    assert_eq!(agent.handles.served.configz["cgroupDriver"], "cgroupfs");
}

/// `curl` of `url` with `args`: status and body.
async fn curl(args: &[&str], url: &str) -> (u16, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .await
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("status");
    (code.parse().expect("code"), body.to_owned())
}

/// Upstream's read-only port serves health, pods, stats and metrics, and
/// refuses its operator paths; evlet's diagnostics (whose timelines carry
/// probe output) are on the secured port, as `nodes/proxy`, and on the
/// root-only local socket; the healthz port answers `ok`.
#[tokio::test(flavor = "multi_thread")]
async fn the_read_only_port_keeps_to_upstreams_paths_and_the_diagnostics_need_the_secured_port_or_the_node()
 {
    let server = FakeServer::start(&[IMAGE]).await.expect("fake runtime");
    let agent = start(server, |c| {
        c.http.healthz = Some("127.0.0.1:0".parse().expect("addr"));
        c.http.local_socket = Some(c.root_dir.join(evlet::server::local::SOCKET));
        c.secure = Some(evlet::config::SecureServing {
            address: "127.0.0.1:0".parse().expect("addr"),
            tls_cert_file: None,
            tls_private_key_file: None,
            client_ca_file: None,
            anonymous: true,
            token_webhook: None,
            authorization: evlet::config::Authorization::AlwaysAllow,
        });
    })
    .await;
    let ro = format!("http://{}", agent.handles.address.expect("read-only port"));
    for path in [
        "/healthz",
        "/pods",
        "/metrics",
        "/metrics/probes",
        "/metrics/resource",
    ] {
        assert_eq!(curl(&[], &format!("{ro}{path}")).await.0, 200, "{path}");
    }
    for path in [
        "/debug/oom",
        "/debug/pleg",
        "/debug/pods/default/p/timeline",
        "/containerLogs/default/p/c",
    ] {
        assert_eq!(
            curl(&[], &format!("{ro}{path}")).await,
            (405, "Debug endpoints are disabled.\n".into()),
            "{path}"
        );
    }
    for path in ["/events", "/pods/default/p"] {
        assert_eq!(curl(&[], &format!("{ro}{path}")).await.0, 404, "{path}");
    }
    let secure = format!(
        "https://{}",
        agent.handles.secure_address.expect("secured port")
    );
    assert_eq!(
        curl(&["-k"], &format!("{secure}/debug/oom")).await,
        (200, "[]".into())
    );
    assert_eq!(curl(&["-k"], &format!("{secure}/events")).await.0, 200);
    let socket = agent.handles.local_socket.clone().expect("local socket");
    let socket = socket.to_str().expect("a UTF-8 path");
    assert_eq!(
        curl(&["--unix-socket", socket], "http://localhost/debug/oom").await,
        (200, "[]".into())
    );
    assert_eq!(
        curl(&["--unix-socket", socket], "http://localhost/healthz")
            .await
            .0,
        200
    );
    let mode = std::fs::metadata(socket).expect("socket").permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600,
        "root only"
    );
    let healthz = format!(
        "http://{}/healthz",
        agent.handles.healthz_address.expect("healthz")
    );
    assert_eq!(curl(&[], &healthz).await, (200, "ok".into()));
    // `evlet diag` reads the diagnostics on the node over the socket, and
    // from elsewhere from the secured port with a kubeconfig's credentials
    // (here none: this port lets anonymous users in).
    let kubeconfig = agent._root.path().join("diag.kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://192.0.2.1:6443'}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .expect("kubeconfig");
    for how in [
        vec!["--socket".to_owned(), socket.to_owned()],
        vec![
            "--kubeconfig".to_owned(),
            kubeconfig.display().to_string(),
            "--server".to_owned(),
            secure.clone(),
            "--insecure-skip-tls-verify".to_owned(),
        ],
    ] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_evlet"))
            .arg("diag")
            .args(&how)
            .args(["-o", "json", "pleg"])
            .output()
            .await
            .expect("evlet diag");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("\"mode\": \"generic\""),
            "diag {how:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
