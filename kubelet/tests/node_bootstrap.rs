//! TLS bootstrap and certificate rotation against the real upstream control
//! plane (`cargo xtask cluster up`): evlet starts with only a bootstrap
//! kubeconfig, its `node-csr-…` is approved and signed by the
//! controller-manager, the Node registers and is Ready with requests made as
//! `system:node:<name>`, the serving CSR (approved here, as an operator
//! does: the controller-manager never approves `kubelet-serving`) lets the
//! API server reach the secured port, a restart reuses both certificates,
//! and short-lived certificates (`expirationSeconds: 600`, the API's
//! minimum; a cluster started with a shorter `--cluster-signing-duration`
//! makes this faster) are rotated without a restart.
//!
//! It runs on the private containerd (root, like every `node_*` test) and
//! over the fake runtime (the cluster alone), each skipping loudly without a
//! cluster (a failure under `CI=true`); about 10 min (`cargo xtask cluster up;
//! cargo test -p evlet --test node_bootstrap`).

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use evlet::agent::{self, Handles};
use evlet::api::{ApiClient, Credentials};
use evlet::certificate::CertificateManager;
use evlet::config::{Authorization, Config, LogFormat, PlegMode, SecureServing};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// The cluster `cargo xtask cluster up` wrote `cluster.env` for.
#[derive(Debug, Clone)]
struct Cluster {
    kubectl: PathBuf,
    admin: PathBuf,
    bootstrap: PathBuf,
    ca: PathBuf,
}

/// The cluster, if it is up (`EVLET_CLUSTER_DIR`, default
/// `/var/lib/evlet-cluster`; `EVLET_CLUSTER_VERSION_DIR`, default `1.34`).
fn cluster() -> Result<Cluster, String> {
    let base =
        std::env::var("EVLET_CLUSTER_DIR").unwrap_or_else(|_| "/var/lib/evlet-cluster".into());
    let version = std::env::var("EVLET_CLUSTER_VERSION_DIR").unwrap_or_else(|_| "1.34".into());
    let env_file = Path::new(&base).join(version).join("cluster.env");
    let text = std::fs::read_to_string(&env_file).map_err(|e| {
        format!(
            "no cluster ({}: {e}); run `cargo xtask cluster up`",
            env_file.display()
        )
    })?;
    let var = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(PathBuf::from)
            .ok_or_else(|| format!("{} has no {k}", env_file.display()))
    };
    let c = Cluster {
        kubectl: var("EVLET_CLUSTER_KUBECTL")?,
        admin: var("EVLET_CLUSTER_ADMIN_KUBECONFIG")?,
        bootstrap: var("EVLET_CLUSTER_BOOTSTRAP_KUBECONFIG")?,
        ca: var("EVLET_CLUSTER_CA")?,
    };
    c.kubectl(&["get", "--raw", "/readyz"])
        .map_err(|e| format!("the cluster is not up (`cargo xtask cluster status`): {e}"))?;
    Ok(c)
}

impl Cluster {
    /// `kubectl --kubeconfig <admin> args…`: stdout, or stderr as the error.
    fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = std::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.admin)
            .arg("--request-timeout=10s")
            .args(args)
            .output()
            .map_err(|e| format!("{}: {e}", self.kubectl.display()))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn json(&self, args: &[&str]) -> Option<Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a).ok()?).ok()
    }

    /// The CSRs whose request names `system:node:<node>`: name → (user,
    /// signer, conditions).
    fn csrs(&self, node: &str) -> Vec<(String, String, String, Vec<String>)> {
        let want = format!("CN=system:node:{node}");
        let Some(list) = self.json(&["get", "csr"]) else {
            return Vec::new();
        };
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| subject(c).is_some_and(|s| s.contains(&want)))
            .map(|c| {
                let s = |p: &str| {
                    c.pointer(p)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                let conditions = c["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x["type"].as_str().map(str::to_owned))
                    .collect();
                (
                    s("/metadata/name"),
                    s("/spec/username"),
                    s("/spec/signerName"),
                    conditions,
                )
            })
            .collect()
    }
}

/// The subject of a CSR object's request.
fn subject(csr: &Value) -> Option<String> {
    use base64::Engine as _;
    use x509_parser::prelude::FromDer as _;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(csr["spec"]["request"].as_str()?)
        .ok()?;
    let der = match rustls_pemfile::read_one(&mut pem.as_slice()) {
        Ok(Some(rustls_pemfile::Item::Csr(der))) => der,
        _ => return None,
    };
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&der).ok()?;
    Some(req.certification_request_info.subject.to_string())
}

/// Polls `check` every second for at most `limit`. `check` runs on a
/// blocking thread: kubectl waits for the API server, which may wait for
/// this very agent (its secured port, its webhook reviews).
async fn until<T: Send + 'static>(
    limit: Duration,
    what: &str,
    check: impl Fn() -> Option<T> + Send + Sync + 'static,
) -> T {
    let check = std::sync::Arc::new(check);
    let started = Instant::now();
    loop {
        let c = std::sync::Arc::clone(&check);
        if let Some(v) = tokio::task::spawn_blocking(move || c())
            .await
            .expect("the check does not panic")
        {
            return v;
        }
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Runs `f` (kubectl) on a blocking thread.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("the call does not panic")
}

/// The node's IP: not loopback, which the API server refuses to proxy to
/// ("address not allowed"), so its node proxy reaches the secured port.
fn proxyable_ip(node: &str) -> String {
    evlet::config::detect_node_ip(node).unwrap_or_else(|e| panic!("a non-loopback node IP: {e}"))
}

struct Agent {
    handles: Handles,
    manager: std::sync::Arc<CertificateManager>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Agent {
    async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(15), self.task).await;
    }
}

async fn start(c: &Cluster, base: &Config) -> Agent {
    let root = base.root_dir.clone();
    let node_ip = base.node_ip.clone().expect("a node IP");
    let shutdown = CancellationToken::new();
    let api = ApiClient::join(
        &root.join("kubelet.kubeconfig"),
        &base.node_name,
        &Credentials {
            bootstrap_kubeconfig: Some(c.bootstrap.clone()),
            rotate_certificates: true,
            server_tls_bootstrap: Some((
                vec![evlet::config::hostname()],
                vec![node_ip.parse().expect("node IP")],
            )),
            cert_dir: root.join("pki"),
            // The API's shortest: rotated after 7–9 minutes.
            requested_duration: Some(Duration::from_secs(600)),
        },
        &shutdown,
    )
    .await
    .expect("joins with the bootstrap kubeconfig");
    let manager = api
        .certificates
        .clone()
        .expect("evlet keeps the certificates");
    let mut config = base.clone();
    config.api = Some(api);
    config.secure = Some(SecureServing {
        address: format!("{node_ip}:0").parse().expect("address"),
        tls_cert_file: None,
        tls_private_key_file: None,
        // The API server's kubelet client certificate is signed by the cluster CA.
        client_ca_file: Some(c.ca.clone()),
        anonymous: false,
        token_webhook: Some(Duration::from_secs(120)),
        authorization: Authorization::Webhook {
            allow_ttl: Duration::from_secs(300),
            deny_ttl: Duration::from_secs(30),
        },
    });
    let (handles, task) = agent::start(config, shutdown.clone())
        .await
        .expect("agent starts");
    Agent {
        handles,
        manager,
        shutdown,
        task,
    }
}

fn node_ready(c: &Cluster, node: &str) -> bool {
    c.json(&["get", "node", node]).is_some_and(|n| {
        n["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|x| x["type"] == "Ready" && x["status"] == "True")
    })
}

/// Approves this node's pending serving CSRs, as an operator (or an
/// approver such as kubelet-serving-cert-approver) does; returns how many.
fn approve_serving(c: &Cluster, node: &str) -> usize {
    let pending: Vec<String> = c
        .csrs(node)
        .into_iter()
        .filter(|(_, user, signer, conds)| {
            signer == "kubernetes.io/kubelet-serving"
                && *user == format!("system:node:{node}")
                && conds.is_empty()
        })
        .map(|(name, ..)| name)
        .collect();
    for name in &pending {
        let _ = c.kubectl(&["certificate", "approve", name]);
    }
    pending.len()
}

fn lease_renewed(c: &Cluster, node: &str) -> Option<String> {
    let lease = format!("lease/{node}");
    let args = [
        "get",
        "-n",
        "kube-node-lease",
        &lease,
        "-ojsonpath={.spec.renewTime}",
    ];
    c.kubectl(&args).ok()
}

async fn scenario(c: Cluster, base: Config) {
    let node = base.node_name.clone();
    let root = base.root_dir.clone();
    let kubeconfig = root.join("kubelet.kubeconfig");
    assert!(
        !kubeconfig.exists(),
        "only a bootstrap kubeconfig to start with"
    );
    let _tidy = Tidy {
        cluster: c.clone(),
        node: node.clone(),
    };

    // 1. Bootstrap: the controller-manager approves and signs node-csr-….
    let agent = start(&c, &base).await;
    let manager = std::sync::Arc::clone(&agent.manager);
    let (client_file, _) = until(
        Duration::from_secs(120),
        "the client certificate",
        move || manager.client_certificate(),
    )
    .await;
    let ours = blocking({
        let (c, node) = (c.clone(), node.clone());
        move || c.csrs(&node)
    })
    .await;
    let bootstrap_csr = ours
        .iter()
        .find(|(name, user, signer, conds)| {
            name.starts_with("node-csr-")
                && user.starts_with("system:bootstrap:")
                && signer == "kubernetes.io/kube-apiserver-client-kubelet"
                && conds.iter().any(|t| t == "Approved")
        })
        .unwrap_or_else(|| panic!("an approved node-csr from the bootstrap token: {ours:?}"));
    eprintln!(
        "bootstrap CSR {} approved; certificate {}",
        bootstrap_csr.0,
        client_file.display()
    );
    let pki = root.join("pki");
    assert!(std::fs::read_link(pki.join("kubelet-client-current.pem")).is_ok());
    assert!(!pki.join("kubelet-client.key.tmp").exists());
    let whoami = blocking({
        let (kubectl, kubeconfig) = (c.kubectl.clone(), kubeconfig.clone());
        move || {
            std::process::Command::new(kubectl)
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args([
                    "auth",
                    "whoami",
                    "-o",
                    "jsonpath={.status.userInfo.username}",
                ])
                .output()
                .expect("kubectl")
        }
    })
    .await;
    assert_eq!(
        String::from_utf8_lossy(&whoami.stdout),
        format!("system:node:{node}"),
        "the written kubeconfig authenticates as the node: {}",
        String::from_utf8_lossy(&whoami.stderr)
    );

    // The Node registers and is Ready (NodeRestriction lets only
    // system:node:<name> make it).
    let ready = {
        let (c, node) = (c.clone(), node.clone());
        move || node_ready(&c, &node).then_some(())
    };
    until(Duration::from_secs(120), "the Node Ready", ready.clone()).await;

    // 2. The serving certificate: approved here, then the API server
    // reaches the secured port and trusts it (--kubelet-certificate-authority).
    let approve = {
        let (c, node) = (c.clone(), node.clone());
        move || approve_serving(&c, &node)
    };
    until(Duration::from_secs(60), "a serving CSR to approve", {
        let approve = approve.clone();
        move || (approve() > 0).then_some(())
    })
    .await;
    let manager = std::sync::Arc::clone(&agent.manager);
    until(
        Duration::from_secs(60),
        "the serving certificate",
        move || manager.serving_certificate(),
    )
    .await;
    let proxied = until(
        Duration::from_secs(60),
        "the API server's proxy to the kubelet",
        {
            let (c, node) = (c.clone(), node.clone());
            move || match c.kubectl(&[
                "get",
                "--raw",
                &format!("/api/v1/nodes/{node}/proxy/healthz"),
            ]) {
                Ok(body) => Some(body),
                Err(e) => {
                    eprintln!("proxy to the kubelet: {e}");
                    None
                }
            }
        },
    )
    .await;
    assert!(
        proxied.contains("healthz check passed"),
        "through the API server: {proxied}"
    );
    let metrics = agent.handles.metrics.encode();
    let gauge = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} served"))
    };
    for name in [
        "kubelet_certificate_manager_client_ttl_seconds",
        "kubelet_certificate_manager_server_ttl_seconds",
    ] {
        let ttl = gauge(name);
        assert!(
            ttl > 0.0 && ttl <= 600.0,
            "{name} {ttl}: at most ten minutes"
        );
    }
    agent.stop().await;

    // 3. A restart reuses both certificates: no new CSR.
    let names = {
        let (c, node) = (c.clone(), node.clone());
        move || -> BTreeSet<String> { c.csrs(&node).into_iter().map(|c| c.0).collect() }
    };
    let before = blocking(names.clone()).await;
    let agent = start(&c, &base).await;
    assert_eq!(
        agent.manager.client_certificate().map(|c| c.0),
        Some(client_file.clone()),
        "the stored client certificate is reused"
    );
    assert!(agent.manager.serving_certificate().is_some());
    until(
        Duration::from_secs(120),
        "the Node Ready again",
        ready.clone(),
    )
    .await;
    assert_eq!(before, blocking(names).await, "a restart makes no CSR");

    // 4. Rotation without a restart: the node's own certificate asks
    // (selfnodeclient), the symlink moves, new connections use it.
    let (_, expires) = agent.manager.client_certificate().expect("in use");
    let limit = expires
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        + Duration::from_secs(60);
    eprintln!("waiting up to {limit:?} for the rotation (70–90 % of the lifetime)");
    let manager = std::sync::Arc::clone(&agent.manager);
    let first = client_file.clone();
    let (rotated, _) = until(limit, "the rotated client certificate", move || {
        approve();
        manager
            .client_certificate()
            .filter(|(path, _)| *path != first)
    })
    .await;
    assert_eq!(
        std::fs::read_link(pki.join("kubelet-client-current.pem")).ok(),
        Some(rotated.clone())
    );
    let now = blocking({
        let (c, node) = (c.clone(), node.clone());
        move || c.csrs(&node)
    })
    .await;
    assert!(
        now.iter().any(|(name, user, signer, conds)| {
            name.starts_with("csr-")
                && *user == format!("system:node:{node}")
                && signer == "kubernetes.io/kube-apiserver-client-kubelet"
                && conds.iter().any(|t| t == "Approved")
        }),
        "the renewal is asked by the node and approved: {now:?}"
    );
    // The heartbeat goes on with the new certificate: the Lease is renewed
    // after the rotation (renewTime has second precision).
    let lease = {
        let (c, node) = (c.clone(), node.clone());
        move || lease_renewed(&c, &node)
    };
    let renewed = blocking(lease.clone()).await;
    until(
        Duration::from_secs(60),
        "a Lease renewal after the rotation",
        move || (lease() != renewed).then_some(()),
    )
    .await;
    until(Duration::from_secs(10), "the Node still Ready", ready).await;
    agent.stop().await;
}

/// Leaves the cluster as found when the scenario ends, also after a
/// failure: the Node, its Lease and its CSRs go.
struct Tidy {
    cluster: Cluster,
    node: String,
}

impl Drop for Tidy {
    fn drop(&mut self) {
        let (c, node) = (&self.cluster, self.node.as_str());
        let _ = c.kubectl(&["delete", "node", node, "--wait=false"]);
        let _ = c.kubectl(&[
            "delete",
            "lease",
            "-n",
            "kube-node-lease",
            node,
            "--wait=false",
        ]);
        for (name, ..) in c.csrs(node) {
            let _ = c.kubectl(&["delete", "csr", &name, "--wait=false"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_bootstraps_registers_restarts_and_rotates_on_containerd() {
    const TEST: &str = "node_bootstraps_registers_restarts_and_rotates_on_containerd";
    let c = cluster();
    if !evlet_testkit::require(TEST, c.is_ok(), c.as_ref().err().map_or("", String::as_str)) {
        return;
    }
    let Ok(c) = c else { return };
    support::e2e(TEST, move |w| async move {
        let mut config = w.config();
        config.node_ip = Some(proxyable_ip(&config.node_name));
        scenario(c, config).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_bootstraps_registers_restarts_and_rotates_over_the_fake_runtime() {
    const TEST: &str = "node_bootstraps_registers_restarts_and_rotates_over_the_fake_runtime";
    let c = cluster();
    if !evlet_testkit::require(TEST, c.is_ok(), c.as_ref().err().map_or("", String::as_str)) {
        return;
    }
    let Ok(c) = c else { return };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env();
    let filter = filter.unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(filter)
        .try_init();
    let fake = evlet_cri::fake::FakeServer::start(&[support::IMAGE]).await;
    let server = fake.expect("fake runtime");
    let root = tempfile::tempdir().expect("root");
    let manifests = tempfile::tempdir().expect("manifests");
    let config = Config {
        node_name: format!("boot-fake-{}", std::process::id()),
        root_dir: root.path().to_path_buf(),
        pod_manifest_path: Some(manifests.path().to_path_buf()),
        manifest_url: None,
        runtime_endpoint: server.endpoint(),
        cgroup_root: "/evlet-fake-bootstrap".into(),
        cgroup_driver: evlet::cm::Driver::Cgroupfs,
        http: evlet::config::HttpEndpoints {
            read_only: Some("127.0.0.1:0".parse().expect("address")),
            ..Default::default()
        },
        file_check_frequency: Duration::from_secs(2),
        http_check_frequency: Duration::from_secs(20),
        node_ip: Some(proxyable_ip(&format!("boot-fake-{}", std::process::id()))),
        pleg_mode: PlegMode::Generic,
        relist_period: Duration::from_secs(1),
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
        eviction: support::test_eviction(),
        image_gc: support::test_image_gc(),
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
    };
    scenario(c, config).await;
    drop(server);
}
