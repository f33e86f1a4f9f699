//! The real control plane as one test's node sees it: the admin's client
//! for the test's own reads and writes (raw JSON over the REST paths, as the
//! mock's helpers take them), the node's credentials, and its requests from
//! the audit log.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use evlet_testkit::eventually;
use serde_json::{Value, json};

use super::{ClusterEnv, Serving};
use crate::apiserver::Recorded;
use crate::support::World;

/// The real control plane, as one test's node sees it.
#[derive(Clone)]
pub struct RealApi {
    inner: Arc<Inner>,
}

struct Inner {
    /// The cluster's files.
    env: ClusterEnv,
    /// The admin's client: the test's own reads and writes.
    admin: kube::Client,
    /// The test's namespace (the node's name).
    ns: String,
    /// The agent's kubeconfig (its client certificate).
    kubeconfig: PathBuf,
    /// The agent's serving pair.
    serving: Serving,
    /// The machine's non-loopback address (the apiserver's advertise address).
    host_ip: String,
    /// Holds the files above for the test's life.
    _files: tempfile::TempDir,
    /// The node's requests read from the audit log so far.
    audit: Arc<Mutex<super::audit::Audit>>,
    /// Cluster-scoped objects the test made (collection, name): deleted at the end.
    made: Arc<Mutex<Vec<(String, String)>>>,
}

/// The group and version of the objects of `coll`.
fn group_version(coll: &str) -> &'static str {
    match coll {
        "leases" => "coordination.k8s.io/v1",
        "runtimeclasses" => "node.k8s.io/v1",
        "clusterroles" | "clusterrolebindings" | "roles" | "rolebindings" => {
            "rbac.authorization.k8s.io/v1"
        }
        _ => "v1",
    }
}

/// The API path of `coll` in `ns` (cluster-scoped if empty), of the object
/// `name` if not empty.
pub fn path(coll: &str, ns: &str, name: &str) -> String {
    let mut p = match group_version(coll) {
        "v1" => "/api/v1".to_owned(),
        gv => format!("/apis/{gv}"),
    };
    if !ns.is_empty() {
        p.push_str(&format!("/namespaces/{ns}"));
    }
    p.push_str(&format!("/{coll}"));
    if !name.is_empty() {
        p.push_str(&format!("/{name}"));
    }
    p
}

/// The `kind` and `apiVersion` of an object of `coll`.
fn kind_of(coll: &str) -> (String, &'static str) {
    let kind = match coll {
        "persistentvolumeclaims" => "PersistentVolumeClaim".to_owned(),
        "persistentvolumes" => "PersistentVolume".to_owned(),
        "serviceaccounts" => "ServiceAccount".to_owned(),
        "configmaps" => "ConfigMap".to_owned(),
        "runtimeclasses" => "RuntimeClass".to_owned(),
        "clusterroles" => "ClusterRole".to_owned(),
        "clusterrolebindings" => "ClusterRoleBinding".to_owned(),
        "rolebindings" => "RoleBinding".to_owned(),
        // pods → Pod, secrets → Secret, ...
        other => {
            let mut chars = other.strip_suffix('s').unwrap_or(other).chars();
            chars
                .next()
                .map(|first| first.to_uppercase().chain(chars).collect())
                .unwrap_or_default()
        }
    };
    (kind, group_version(coll))
}

/// A request of `method` to `path` with a JSON body.
fn request_of(method: &str, path: &str, body: Option<&Value>) -> http::Request<Vec<u8>> {
    http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())
        .expect("a valid request")
}

/// The API's error code, if `e` is an answer of the server.
fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

impl RealApi {
    /// Joins the cluster as `w`'s node: clears what an earlier run of the
    /// same name may have left, makes the test's namespace (waiting for its
    /// default ServiceAccount and root CA ConfigMap, as pods need them) and
    /// the node's credentials, and registers the clean-up.
    pub async fn join(w: &World, env: ClusterEnv) -> Self {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&env.admin_kubeconfig).expect("admin kubeconfig"),
            &Default::default(),
        )
        .await
        .expect("admin kubeconfig");
        let admin = kube::Client::try_from(config).expect("admin client");
        let ns = w.name.clone();
        clear(&admin, &w.name, true).await;
        let created = admin
            .request::<Value>(request_of(
                "POST",
                "/api/v1/namespaces",
                Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})),
            ))
            .await;
        created.unwrap_or_else(|e| panic!("namespace {ns}: {e}"));
        for (coll, name) in [
            ("serviceaccounts", "default"),
            ("configmaps", "kube-root-ca.crt"),
        ] {
            eventually(
                Duration::from_secs(60),
                &format!("{coll}/{name} in the new namespace"),
                || async {
                    admin
                        .request::<Value>(request_of("GET", &path(coll, &ns, name), None))
                        .await
                        .ok()
                },
            )
            .await;
        }
        // The machine's address as the cluster knows it (the apiserver's
        // advertise address, its `kubernetes` endpoint): an address the
        // apiserver proxies to, where it refuses loopback.
        let slice = admin
            .request::<Value>(request_of(
                "GET",
                "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes",
                None,
            ))
            .await
            .expect("the kubernetes EndpointSlice");
        let host_ip = slice["endpoints"][0]["addresses"][0]
            .as_str()
            .expect("the apiserver's address")
            .to_owned();
        let files = tempfile::tempdir().expect("credentials dir");
        let (kubeconfig, serving) =
            super::node_certs::credentials(&env, &w.name, &host_ip, files.path());
        let audit = Arc::new(Mutex::new(super::audit::Audit::from_now(
            &env.audit_log,
            &format!("system:node:{}", w.name),
        )));
        let made: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        w.on_cleanup({
            let (admin, node, made) = (admin.clone(), w.name.clone(), Arc::clone(&made));
            async move {
                let made = std::mem::take(&mut *made.lock().unwrap_or_else(|p| p.into_inner()));
                for (coll, name) in made {
                    let _ = admin
                        .request_text(request_of("DELETE", &path(&coll, "", &name), None))
                        .await;
                }
                clear(&admin, &node, false).await;
            }
        });
        Self {
            inner: Arc::new(Inner {
                env,
                admin,
                ns,
                kubeconfig,
                serving,
                host_ip,
                _files: files,
                audit,
                made,
            }),
        }
    }

    /// The test's namespace (the node's name).
    pub fn ns(&self) -> &str {
        &self.inner.ns
    }

    /// The agent's kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.inner.kubeconfig
    }

    /// The agent's serving pair.
    pub fn serving(&self) -> &Serving {
        &self.inner.serving
    }

    /// The machine's address the apiserver reaches a node at: its node
    /// proxy refuses loopback addresses ("address not allowed").
    pub fn host_ip(&self) -> &str {
        &self.inner.host_ip
    }

    /// The cluster.
    pub fn env(&self) -> &ClusterEnv {
        &self.inner.env
    }

    /// The object, if it exists (other errors are printed and read as None:
    /// callers poll).
    pub async fn get(&self, coll: &str, ns: &str, name: &str) -> Option<Value> {
        let answer = self
            .inner
            .admin
            .request::<Value>(request_of("GET", &path(coll, ns, name), None))
            .await;
        match answer {
            Ok(v) => Some(v),
            Err(e) if code(&e) == Some(404) => None,
            Err(e) => {
                eprintln!("GET {}: {e}", path(coll, ns, name));
                None
            }
        }
    }

    /// The objects of `coll` in `ns` (every namespace if empty).
    pub async fn list(&self, coll: &str, ns: &str) -> Vec<Value> {
        let list = self
            .inner
            .admin
            .request::<Value>(request_of("GET", &path(coll, ns, ""), None))
            .await
            .unwrap_or_else(|e| panic!("list {coll} in {ns:?}: {e}"));
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Creates `obj` as the admin; a cluster-scoped object is deleted when
    /// the test ends.
    pub async fn create(&self, coll: &str, ns: &str, obj: Value) -> Value {
        let mut obj = obj;
        let (kind, api_version) = kind_of(coll);
        obj["kind"] = json!(kind);
        obj["apiVersion"] = json!(api_version);
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let created = self
            .inner
            .admin
            .request::<Value>(request_of("POST", &path(coll, ns, ""), Some(&obj)))
            .await
            .unwrap_or_else(|e| panic!("create {coll} {ns}/{name}: {e}"));
        if ns.is_empty() && coll != "nodes" {
            self.inner
                .made
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((coll.to_owned(), name));
        }
        created
    }

    /// Reads, changes and writes back an object, again after a conflict.
    pub async fn modify(&self, coll: &str, ns: &str, name: &str, f: impl Fn(&mut Value)) {
        for _ in 0..10 {
            let Some(mut obj) = self.get(coll, ns, name).await else {
                return;
            };
            f(&mut obj);
            let put = self
                .inner
                .admin
                .request::<Value>(request_of("PUT", &path(coll, ns, name), Some(&obj)))
                .await;
            match put {
                Ok(_) => return,
                Err(e) if code(&e) == Some(409) => continue,
                Err(e) => panic!("update {coll} {ns}/{name}: {e}"),
            }
        }
        panic!("update {coll} {ns}/{name}: a conflict every time");
    }

    /// Deletes a pod as `kubectl delete` does (graceful if grace > 0 or unset).
    pub async fn delete_pod(&self, ns: &str, name: &str, grace: Option<i64>) {
        let options =
            json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace});
        let deleted = self
            .inner
            .admin
            .request_text(request_of(
                "DELETE",
                &path("pods", ns, name),
                Some(&options),
            ))
            .await;
        match deleted {
            Ok(_) => {}
            Err(e) if code(&e) == Some(404) => {}
            Err(e) => panic!("delete pod {ns}/{name}: {e}"),
        }
    }

    /// A ServiceAccount `name` in the test's namespace and a token for it
    /// (as the admin asks TokenRequest); with its user name.
    pub async fn token_for(&self, name: &str) -> (String, String) {
        let ns = self.ns().to_owned();
        self.create("serviceaccounts", &ns, json!({"metadata": {"name": name}}))
            .await;
        let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600}});
        let issued = self
            .inner
            .admin
            .request::<Value>(request_of(
                "POST",
                &format!("{}/token", path("serviceaccounts", &ns, name)),
                Some(&request),
            ))
            .await
            .unwrap_or_else(|e| panic!("a token for {ns}/{name}: {e}"));
        let token = issued["status"]["token"].as_str().expect("a token");
        (
            token.to_owned(),
            format!("system:serviceaccount:{ns}:{name}"),
        )
    }

    /// A ClusterRole allowing `get` and `create` of `nodes/<subresource>`
    /// (`*`: the cluster's own `system:kubelet-api-admin`, as the
    /// apiserver's) and its binding to `user`; deleted when the test ends.
    pub async fn allow(&self, user: &str, subresource: &str) {
        let name = format!(
            "evlet-e2e:{}:{user}:{}",
            self.ns(),
            subresource.replace('*', "all")
        );
        let role = if subresource == "*" {
            "system:kubelet-api-admin".to_owned()
        } else {
            let rule = json!({"apiGroups": [""], "resources": [format!("nodes/{subresource}")],
                "verbs": ["get", "create"]});
            self.create(
                "clusterroles",
                "",
                json!({"metadata": {"name": name}, "rules": [rule]}),
            )
            .await;
            name.clone()
        };
        self.create("clusterrolebindings", "", json!({"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}))
            .await;
    }

    /// The node's requests of `method` whose path contains `needle`, from
    /// the audit log.
    pub async fn requests_matching(&self, method: &str, needle: &str) -> Vec<Recorded> {
        // The apiserver logs a request when its handler returns, just after
        // the response went out: a request whose effect the test saw may be
        // a moment behind in the log.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let audit = Arc::clone(&self.inner.audit);
        let all = tokio::task::spawn_blocking(move || {
            let mut audit = audit.lock().unwrap_or_else(|p| p.into_inner());
            audit.read_new();
            audit.records.clone()
        })
        .await
        .expect("audit reader");
        all.into_iter()
            .filter(|r| r.method == method && r.path.contains(needle))
            .collect()
    }
}

/// Deletes what a node named `node` left: pods bound to it (at once, in
/// every namespace), the namespace of its name, and the Node; with `wait`,
/// waits until the namespace is gone.
async fn clear(admin: &kube::Client, node: &str, wait: bool) {
    let pods = admin
        .request::<Value>(request_of(
            "GET",
            &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
            None,
        ))
        .await
        .map(|l| l["items"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default();
    let now = json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0});
    let in_ns = admin
        .request::<Value>(request_of("GET", &path("pods", node, ""), None))
        .await
        .map(|l| l["items"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default();
    for pod in pods.iter().chain(&in_ns) {
        let (Some(ns), Some(name)) = (
            pod["metadata"]["namespace"].as_str(),
            pod["metadata"]["name"].as_str(),
        ) else {
            continue;
        };
        let _ = admin
            .request_text(request_of("DELETE", &path("pods", ns, name), Some(&now)))
            .await;
    }
    let ns_path = format!("/api/v1/namespaces/{node}");
    let _ = admin
        .request_text(request_of("DELETE", &ns_path, None))
        .await;
    let _ = admin
        .request_text(request_of("DELETE", &path("nodes", "", node), None))
        .await;
    if !wait {
        return;
    }
    // A namespace of this name still terminating would refuse new objects:
    // wait for it to go (quick once its pods are gone).
    eventually(
        Duration::from_secs(120),
        &format!("namespace {node} deleted"),
        || async {
            let gone = admin
                .request::<Value>(request_of("GET", &ns_path, None))
                .await
                .err()
                .and_then(|e| code(&e))
                == Some(404);
            gone.then_some(())
        },
    )
    .await;
}
