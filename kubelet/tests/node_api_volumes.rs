//! Volumes of API pods on the real runtime, against the mocked API server:
//! the default service-account volume (token, CA, namespace), a ConfigMap
//! update reaching its files atomically, a Secret on tmpfs, a token refreshed
//! before it expires, a missing required ConfigMap holding the pod, and a
//! claim bound to a local persistent volume.

#[path = "support/apiserver.rs"]
mod apiserver;
mod support;

use std::path::Path;
use std::time::Duration;

use apiserver::MockApi;
use evlet::api::ApiClient;
use evlet_testkit::eventually;
use serde_json::{Value, json};
use support::{IMAGE, Running, World, e2e};

async fn start(w: &World, api: &MockApi) -> Running {
    let mut config = w.config();
    config.api = Some(ApiClient::over(api.service()));
    let agent = w.start_with(config).await;
    eventually(Duration::from_secs(20), "node registered", || async {
        api.get("nodes", "", &w.name)
    })
    .await;
    agent
}

fn api_pod(w: &World, name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["nodeName"] = json!(w.name);
    json!({"metadata": {"name": w.pod_name(name), "namespace": "default"}, "spec": spec})
}

fn read(dir: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(name))
        .ok()
        .filter(|s| !s.is_empty())
}

fn out_volume(dir: &Path) -> Value {
    json!({"name": "out", "hostPath": {"path": dir.display().to_string()}})
}

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The volume the API server's ServiceAccount admission adds to every pod.
fn kube_api_access() -> Value {
    json!({"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
    ]}})
}

fn cluster_objects(api: &MockApi) {
    api.create(
        "serviceaccounts",
        "default",
        json!({"metadata": {"name": "default"}}),
    );
    api.create(
        "configmaps",
        "default",
        json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}}),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_service_account_volume_gives_the_pod_its_token_ca_and_namespace() {
    e2e(
        "the_default_service_account_volume_gives_the_pod_its_token_ca_and_namespace",
        |w| async move {
            let api = MockApi::new();
            cluster_objects(&api);
            let out = tempfile::tempdir().expect("out");
            let agent = start(&w, &api).await;
            let name = w.pod_name("sa");
            api.create(
                "pods",
                "default",
                api_pod(&w, "sa", json!({
                    "serviceAccountName": "default",
                    "terminationGracePeriodSeconds": 1,
                    "volumes": [kube_api_access(), out_volume(out.path())],
                    "containers": [{"name": "app", "image": IMAGE,
                        "command": ["sh", "-c", format!("cat {SA_DIR}/token > /out/token; cat {SA_DIR}/ca.crt > /out/ca; cat {SA_DIR}/namespace > /out/ns; stat -L -c %a {SA_DIR}/token > /out/mode; exec sleep 3600")],
                        "volumeMounts": [{"name": "kube-api-access-x7k2p", "mountPath": SA_DIR, "readOnly": true}, {"name": "out", "mountPath": "/out"}]}]
                })),
            );
            let token = eventually(Duration::from_secs(60), "the token read inside the pod", || async {
                read(out.path(), "mode").and_then(|_| read(out.path(), "token"))
            })
            .await;
            assert!(token.starts_with(&format!("token-default-{name}-")), "{token}");
            assert_eq!(read(out.path(), "ca").as_deref(), Some("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"));
            assert_eq!(read(out.path(), "ns").as_deref(), Some("default"));
            assert_eq!(read(out.path(), "mode").as_deref(), Some("644\n"));
            let request = api
                .requests_matching("POST", "/serviceaccounts/default/token")
                .into_iter()
                .next()
                .and_then(|r| r.body)
                .expect("a TokenRequest");
            let pod = api.get("pods", "default", &name).expect("pod");
            assert_eq!(request["spec"]["expirationSeconds"], 3607);
            assert_eq!(request["spec"]["boundObjectRef"]["kind"], "Pod");
            assert_eq!(request["spec"]["boundObjectRef"]["name"], name.as_str());
            assert_eq!(request["spec"]["boundObjectRef"]["uid"], pod["metadata"]["uid"]);
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_config_map_update_reaches_the_files_atomically_and_a_token_is_refreshed() {
    e2e(
        "a_config_map_update_reaches_the_files_atomically_and_a_token_is_refreshed",
        |w| async move {
            let api = MockApi::new();
            cluster_objects(&api);
            // Tokens live 12 s: refreshed after about 10 s.
            api.set_token_lifetime(12);
            api.create("configmaps", "default", json!({"metadata": {"name": "settings"}, "data": {"a": "v1", "b": "v1"}}));
            api.create("secrets", "default", json!({"metadata": {"name": "creds"}, "data": {"password": "aHVudGVyMg=="}}));
            let out = tempfile::tempdir().expect("out");
            let agent = start(&w, &api).await;
            // The reader resolves ..data once per round and reads both keys
            // from that version: a torn update would show two values.
            let reader = "while true; do d=$(readlink /cfg/..data); a=$(cat /cfg/$d/a 2>/dev/null); b=$(cat /cfg/$d/b 2>/dev/null); if [ -n \"$a\" ] && [ -n \"$b\" ]; then [ \"$a\" = \"$b\" ] || echo \"$a $b\" >> /out/torn; echo $a > /out/seen; fi; cat /sa/token > /out/token; done";
            api.create(
                "pods",
                "default",
                api_pod(&w, "cfg", json!({
                    "terminationGracePeriodSeconds": 1,
                    "volumes": [
                        {"name": "cfg", "configMap": {"name": "settings"}},
                        {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 256}},
                        kube_api_access(),
                        out_volume(out.path())
                    ],
                    "containers": [{"name": "app", "image": IMAGE,
                        "command": ["sh", "-c", format!("cat /creds/password > /out/password; stat -L -c %a /creds/password > /out/password-mode; df /creds | tail -1 > /out/creds-df; {reader}")],
                        "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}, {"name": "creds", "mountPath": "/creds"},
                                         {"name": "kube-api-access-x7k2p", "mountPath": "/sa"}, {"name": "out", "mountPath": "/out"}]}]
                })),
            );
            eventually(Duration::from_secs(60), "v1 seen inside the pod", || async {
                (read(out.path(), "seen").as_deref() == Some("v1\n")).then_some(())
            })
            .await;
            assert_eq!(read(out.path(), "password").as_deref(), Some("hunter2"));
            assert_eq!(read(out.path(), "password-mode").as_deref(), Some("400\n"));
            assert!(read(out.path(), "creds-df").is_some_and(|d| d.starts_with("tmpfs")), "secrets live in memory");
            // The loop rewrites the file: read it when it is not mid-write.
            let first_token = eventually(Duration::from_secs(5), "the token", || async {
                read(out.path(), "token")
            })
            .await;

            let changed = tokio::time::Instant::now();
            api.modify("configmaps", "default", "settings", |cm| {
                cm["data"] = json!({"a": "v2", "b": "v2"});
            });
            eventually(Duration::from_secs(30), "v2 seen inside the pod", || async {
                (read(out.path(), "seen").as_deref() == Some("v2\n")).then_some(())
            })
            .await;
            let took = changed.elapsed();
            assert!(took < Duration::from_secs(10), "the change reached the files after {took:?}");
            eprintln!("configmap change → file inside the pod: {took:?}");
            assert_eq!(read(out.path(), "torn"), None, "the reader never saw a mixed set");

            eventually(Duration::from_secs(30), "a refreshed token", || async {
                read(out.path(), "token")
                    .filter(|t| *t != first_token && t.starts_with("token-"))
                    .map(|_| ())
            })
            .await;
            assert!(api.requests_matching("POST", "/serviceaccounts/default/token").len() >= 2);
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_config_map_holds_the_pod_and_an_optional_one_is_empty() {
    e2e(
        "a_missing_config_map_holds_the_pod_and_an_optional_one_is_empty",
        |w| async move {
            let api = MockApi::new();
            let out = tempfile::tempdir().expect("out");
            let agent = start(&w, &api).await;
            let name = w.pod_name("wait");
            api.create(
                "pods",
                "default",
                api_pod(&w, "wait", json!({
                    "terminationGracePeriodSeconds": 1,
                    "volumes": [
                        {"name": "needed", "configMap": {"name": "later"}},
                        {"name": "maybe", "configMap": {"name": "never", "optional": true}},
                        out_volume(out.path())
                    ],
                    "containers": [{"name": "app", "image": IMAGE,
                        "command": ["sh", "-c", "ls -A /maybe | grep -v '^\\.\\.' | wc -l > /out/maybe; cat /needed/k > /out/needed; exec sleep 3600"],
                        "volumeMounts": [{"name": "needed", "mountPath": "/needed"}, {"name": "maybe", "mountPath": "/maybe"}, {"name": "out", "mountPath": "/out"}]}]
                })),
            );
            eventually(Duration::from_secs(30), "a FailedMount event", || async {
                api.list("events").into_iter().find(|e| {
                    e["reason"] == "FailedMount"
                        && e["message"] == "MountVolume.SetUp failed for volume \"needed\" : configmap \"later\" not found"
                })
            })
            .await;
            let (sandboxes, _) = w.runtime_objects("wait").await;
            assert!(sandboxes.is_empty(), "nothing runs without its volume");
            api.create("configmaps", "default", json!({"metadata": {"name": "later"}, "data": {"k": "here"}}));
            eventually(Duration::from_secs(30), "the pod running with its data", || async {
                read(out.path(), "needed").filter(|n| n == "here").map(|_| ())
            })
            .await;
            assert_eq!(read(out.path(), "maybe").map(|s| s.trim().to_owned()).as_deref(), Some("0"));
            let _ = name;
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_bound_to_a_local_volume_mounts_its_path() {
    e2e(
        "a_claim_bound_to_a_local_volume_mounts_its_path",
        |w| async move {
            let api = MockApi::new();
            let disk = tempfile::tempdir().expect("local disk");
            let agent = start(&w, &api).await;
            let claim = api.create(
                "persistentvolumeclaims",
                "default",
                json!({"metadata": {"name": "data"}, "spec": {"volumeName": "local-pv", "accessModes": ["ReadWriteOnce"]}, "status": {"phase": "Bound"}}),
            );
            api.create(
                "persistentvolumes",
                "",
                json!({"metadata": {"name": "local-pv"}, "spec": {
                    "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "local": {"path": disk.path().display().to_string()},
                    "claimRef": {"namespace": "default", "name": "data", "uid": claim["metadata"]["uid"]},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [w.name.clone()]}]}]}}
                }, "status": {"phase": "Bound"}}),
            );
            api.create(
                "pods",
                "default",
                api_pod(&w, "pvc", json!({
                    "terminationGracePeriodSeconds": 1,
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                    "containers": [{"name": "app", "image": IMAGE,
                        "command": ["sh", "-c", "echo persisted > /data/file; exec sleep 3600"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]
                })),
            );
            eventually(Duration::from_secs(60), "the file on the local disk", || async {
                read(disk.path(), "file").filter(|f| f == "persisted\n").map(|_| ())
            })
            .await;
            // Upstream's volume stats of the claim: the local disk's file system.
            let series = "kubelet_volume_stats_capacity_bytes{namespace=\"default\",persistentvolumeclaim=\"data\"}";
            let capacity = |text: &str| -> Option<f64> {
                text.lines()
                    .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            };
            let (_, _, text) = support::http_get(agent.handles.address, "/metrics").await;
            let disk_size = rustix::fs::statvfs(disk.path()).map(|s| (s.f_blocks * s.f_frsize) as f64).expect("statvfs");
            assert_eq!(capacity(&text), Some(disk_size), "{text}");
            api.delete_pod("default", &w.pod_name("pvc"), Some(0));
            let pods = w.root.path().join("pods");
            eventually(Duration::from_secs(30), "the pod torn down", || async {
                let left = std::fs::read_dir(&pods).map_or(0, |d| d.count());
                (left == 0).then_some(())
            })
            .await;
            assert_eq!(read(disk.path(), "file").as_deref(), Some("persisted\n"), "the local volume's data stays");
            let (_, _, text) = support::http_get(agent.handles.address, "/metrics").await;
            assert_eq!(capacity(&text), None, "the claim's stats go with the pod");
            agent.stop().await;
        },
    )
    .await;
}
