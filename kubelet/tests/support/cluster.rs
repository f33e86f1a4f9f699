//! The API server a node test joins: the real upstream control plane
//! (`cargo xtask cluster up`, named by `EVLET_E2E_CLUSTER`) or the in-process
//! mock (`apiserver.rs`), behind one [`Api`], so a test body reads the same
//! against either.
//!
//! Against the real cluster each test is a node of its own: the agent holds a
//! client certificate for `system:node:<world name>` in `system:nodes`, minted
//! here from the cluster CA's key, so the Node authorizer and the
//! `NodeRestriction` admission judge every request it makes; its secured port
//! serves a certificate the same CA signed (SANs 127.0.0.1 and the node name),
//! which the apiserver verifies when it proxies `kubectl logs/exec/port-forward`.
//! The test's own reads and writes go as the cluster admin, in a namespace
//! named after the node. What the agent sent is read from the apiserver's
//! audit log, filtered by the node's user, so tests of other nodes running at
//! the same time do not mix in. When the test ends, its namespace, its Node
//! and the cluster-scoped objects it made are deleted, also after a failure.
//!
//! Tests about faults the real server cannot be made to produce (outages,
//! injected 5xx/429, compaction at will, short token lifetimes) use the mock;
//! ARCHITECTURE.md lists them.
#![allow(dead_code, reason = "each test binary uses a different part")]

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use evlet::api::ApiClient;
use evlet_testkit::eventually;
use serde_json::{Value, json};

use crate::apiserver::{MockApi, Recorded};

#[path = "audit.rs"]
mod audit;
#[path = "node_certs.rs"]
mod node_certs;
#[path = "real_api.rs"]
mod real_api;

use crate::support::{Running, World, e2e};
pub use real_api::RealApi;

/// The key of the `NoSchedule` taint a test node registers with on the
/// real cluster (its value: the node's name).
pub const TEST_TAINT: &str = "e2e.evlet.dev/node";

/// Which API server a test needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The real control plane: without `EVLET_E2E_CLUSTER` the test skips
    /// loudly (fails under `CI=true`).
    Real,
    /// The real control plane when `EVLET_E2E_CLUSTER` names one, else the
    /// mock (`vm-test`'s guests have no control plane; the test is not about
    /// the API server).
    RealOrMock,
    /// The mock: the test injects a fault the real server cannot produce.
    Mock,
}

/// Runs `body` as [`e2e`] does, with the API server `backend` asks for.
pub async fn api_e2e<F, Fut>(test: &str, backend: Backend, body: F)
where
    F: FnOnce(Arc<World>, Api) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let cluster = match backend {
        Backend::Mock => None,
        Backend::RealOrMock => ClusterEnv::from_env(),
        Backend::Real => {
            let env = ClusterEnv::from_env();
            if !evlet_testkit::require(
                test,
                env.is_some(),
                "no control plane (EVLET_E2E_CLUSTER is unset; `cargo xtask cluster up` writes \
                 the cluster.env it names)",
            ) {
                return;
            }
            env
        }
    };
    e2e(test, move |w| async move {
        let api = match cluster {
            Some(env) => Api::Real(RealApi::join(&w, env).await),
            None => Api::Mock(MockApi::new()),
        };
        body(w, api).await;
    })
    .await;
}

/// The cluster as `cargo xtask cluster up` describes it in `cluster.env`.
#[derive(Debug, Clone)]
pub struct ClusterEnv {
    /// The apiserver's URL.
    pub server: String,
    /// The cluster CA's certificate (every client's trust root).
    pub ca: PathBuf,
    /// Its key, beside it (`pki/ca.key`): signs the node's certificates.
    pub ca_key: PathBuf,
    /// The admin's kubeconfig (`system:masters`).
    pub admin_kubeconfig: PathBuf,
    /// The cluster's own kubectl.
    pub kubectl: PathBuf,
    /// The apiserver's audit log (node requests at `Request` level).
    pub audit_log: PathBuf,
    /// The cluster's directory: PKI, etcd data, logs and pid files.
    pub state_dir: PathBuf,
}

impl ClusterEnv {
    /// The cluster `EVLET_E2E_CLUSTER` names, or None if it is unset.
    ///
    /// # Panics
    /// If the file it names cannot be read or lacks a variable.
    pub fn from_env() -> Option<Self> {
        let path = std::env::var_os("EVLET_E2E_CLUSTER").filter(|p| !p.is_empty())?;
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("EVLET_E2E_CLUSTER={}: {e}", path.to_string_lossy()));
        let var = |key: &str| -> PathBuf {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("{} has no {key}", path.to_string_lossy()))
        };
        let ca = var("EVLET_CLUSTER_CA");
        Some(Self {
            server: var("EVLET_CLUSTER_SERVER").display().to_string(),
            ca_key: ca.with_file_name("ca.key"),
            ca,
            admin_kubeconfig: var("EVLET_CLUSTER_ADMIN_KUBECONFIG"),
            kubectl: var("EVLET_CLUSTER_KUBECTL"),
            audit_log: var("EVLET_CLUSTER_AUDIT_LOG"),
            state_dir: var("EVLET_CLUSTER_STATE_DIR"),
        })
    }
}

/// The certificate and key the agent's secured port serves, and the CA its
/// clients' certificates must chain to.
#[derive(Debug, Clone)]
pub struct Serving {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// The API server of one test.
#[derive(Clone)]
pub enum Api {
    Mock(MockApi),
    Real(RealApi),
}

impl Api {
    /// The namespace the test's objects live in.
    pub fn ns(&self) -> &str {
        match self {
            Api::Mock(_) => "default",
            Api::Real(r) => r.ns(),
        }
    }

    /// The mock, for a fault only it can inject.
    ///
    /// # Panics
    /// On the real cluster.
    pub fn mock(&self) -> &MockApi {
        match self {
            Api::Mock(m) => m,
            Api::Real(_) => panic!("this step needs the mock API server"),
        }
    }

    /// True on the real control plane.
    pub fn is_real(&self) -> bool {
        matches!(self, Api::Real(_))
    }

    /// The agent's client: in process to the mock, or with the node's
    /// certificate to the real apiserver.
    pub async fn agent_client(&self) -> ApiClient {
        match self {
            Api::Mock(m) => ApiClient::over(m.service()),
            Api::Real(r) => ApiClient::from_kubeconfig(r.kubeconfig())
                .await
                .expect("the node's kubeconfig"),
        }
    }

    /// What the secured port serves on the real cluster (None: the agent's
    /// self-signed pair, which the mock does not verify).
    pub fn serving(&self) -> Option<Serving> {
        match self {
            Api::Mock(_) => None,
            Api::Real(r) => Some(r.serving().clone()),
        }
    }

    /// An address of this machine the API server proxies to (its node
    /// proxy refuses loopback): the real cluster's; None for the mock, which
    /// proxies to 127.0.0.1.
    pub fn host_ip(&self) -> Option<String> {
        match self {
            Api::Mock(_) => None,
            Api::Real(r) => Some(r.host_ip().to_owned()),
        }
    }

    /// The kubectl and kubeconfig a test runs kubectl with on the real
    /// cluster (the cluster's own build, as the admin).
    pub fn kubectl(&self) -> Option<(PathBuf, PathBuf)> {
        match self {
            Api::Mock(_) => None,
            Api::Real(r) => Some((r.env().kubectl.clone(), r.env().admin_kubeconfig.clone())),
        }
    }

    /// A pod `<name>-<node>` for this node, placed as a cluster places it:
    /// by the scheduler (a `kubernetes.io/hostname` node selector, and the
    /// toleration of the node's [`TEST_TAINT`]) on the real cluster; bound
    /// by `nodeName` on the mock, which has no scheduler.
    pub fn pod(&self, w: &World, name: &str, spec: Value) -> Value {
        let mut spec = spec;
        match self {
            Api::Mock(_) => spec["nodeName"] = json!(w.name),
            Api::Real(_) => {
                spec["nodeSelector"]["kubernetes.io/hostname"] = json!(w.name);
                let toleration = json!({"key": TEST_TAINT, "operator": "Equal",
                    "value": w.name, "effect": "NoSchedule"});
                match spec["tolerations"].as_array_mut() {
                    Some(list) => list.push(toleration),
                    None => spec["tolerations"] = json!([toleration]),
                }
            }
        }
        json!({"metadata": {"name": w.pod_name(name), "namespace": self.ns()}, "spec": spec})
    }

    /// A pod bound to this node by `nodeName`, past the scheduler: for tests
    /// of the kubelet's own admission of pods the scheduler would not place.
    pub fn bound_pod(&self, w: &World, name: &str, spec: Value) -> Value {
        let mut spec = spec;
        spec["nodeName"] = json!(w.name);
        json!({"metadata": {"name": w.pod_name(name), "namespace": self.ns()}, "spec": spec})
    }

    /// Starts the agent with `config` joined to this API server, and waits
    /// until its Node is registered. On the real cluster the Node registers
    /// with a `NoSchedule` taint of its own ([`TEST_TAINT`]), which only this
    /// test's pods tolerate: the scheduler places no one else's pods there
    /// (other tests', a conformance run's), nor this test's pods elsewhere.
    pub async fn start(&self, w: &World, config: evlet::config::Config) -> Running {
        let mut config = config;
        config.api = Some(self.agent_client().await);
        if self.is_real() {
            config
                .register_with_taints
                .push(k8s_openapi::api::core::v1::Taint {
                    key: TEST_TAINT.into(),
                    value: Some(w.name.clone()),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                });
        }
        let agent = w.start_with(config).await;
        eventually(Duration::from_secs(20), "node registered", || async {
            self.get("nodes", "", &w.name).await
        })
        .await;
        agent
    }

    /// The object, if it exists.
    pub async fn get(&self, coll: &str, ns: &str, name: &str) -> Option<Value> {
        match self {
            Api::Mock(m) => m.get(coll, ns, name),
            Api::Real(r) => r.get(coll, ns, name).await,
        }
    }

    /// The objects of `coll` in `ns` (every namespace if empty).
    pub async fn list(&self, coll: &str, ns: &str) -> Vec<Value> {
        match self {
            Api::Mock(m) => m
                .list(coll)
                .into_iter()
                .filter(|o| ns.is_empty() || o["metadata"]["namespace"] == ns)
                .collect(),
            Api::Real(r) => r.list(coll, ns).await,
        }
    }

    /// Creates `obj` as a client would; returns it as stored.
    pub async fn create(&self, coll: &str, ns: &str, obj: Value) -> Value {
        match self {
            Api::Mock(m) => m.create(coll, ns, obj),
            Api::Real(r) => r.create(coll, ns, obj).await,
        }
    }

    /// Changes an object as another client would (`f` may run again after a
    /// conflict on the real server).
    pub async fn modify(&self, coll: &str, ns: &str, name: &str, f: impl Fn(&mut Value)) {
        match self {
            Api::Mock(m) => m.modify(coll, ns, name, f),
            Api::Real(r) => r.modify(coll, ns, name, f).await,
        }
    }

    /// Deletes a pod as `kubectl delete` does (graceful if bound and grace > 0).
    pub async fn delete_pod(&self, ns: &str, name: &str, grace: Option<i64>) {
        match self {
            Api::Mock(m) => m.delete_pod(ns, name, grace),
            Api::Real(r) => r.delete_pod(ns, name, grace).await,
        }
    }

    /// The agent's requests whose method is `method` and path contains
    /// `needle`, in order: the mock's record, or the audit log's.
    pub async fn requests_matching(&self, method: &str, needle: &str) -> Vec<Recorded> {
        match self {
            Api::Mock(m) => m.requests_matching(method, needle),
            Api::Real(r) => r.requests_matching(method, needle).await,
        }
    }

    /// A bearer token the API server authenticates, and its user: a
    /// ServiceAccount's (TokenRequest) on the real cluster, one the mock's
    /// TokenReview accepts otherwise.
    pub async fn token_for(&self, name: &str) -> (String, String) {
        match self {
            Api::Mock(m) => {
                let token = format!("{name}-token");
                m.add_token(&token, name, &[]);
                (token, name.to_owned())
            }
            Api::Real(r) => r.token_for(name).await,
        }
    }

    /// Lets `user` use the kubelet API's `subresource` of nodes (`*`: all):
    /// RBAC (a ClusterRole and its binding) on the real cluster.
    pub async fn allow(&self, user: &str, subresource: &str) {
        match self {
            Api::Mock(m) => m.allow(user, subresource),
            Api::Real(r) => r.allow(user, subresource).await,
        }
    }

    /// Waits until the API shows `pod` (in the test's namespace) in `phase`.
    pub async fn wait_phase(&self, pod: &str, phase: &str, limit: Duration) -> Value {
        eventually(limit, &format!("{pod} {phase} in the API"), || async {
            self.get("pods", self.ns(), pod)
                .await
                .filter(|p| p["status"]["phase"] == phase)
        })
        .await
    }
}
