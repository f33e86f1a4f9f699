//! Volumes of API pods on the real runtime, against the real control plane
//! (`support/cluster.rs`): the service-account volume the apiserver's
//! admission adds (a bound token, the cluster CA, the namespace), a ConfigMap
//! update reaching its files atomically, a Secret on tmpfs, a missing
//! required ConfigMap holding the pod, and a claim bound to a local
//! persistent volume. A token refreshed before it expires is the mock's: the
//! real server issues no token shorter-lived than 10 minutes.

#[path = "support/apiserver.rs"]
mod apiserver;
#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::path::Path;
use std::time::Duration;

use cluster::{Api, Backend, api_e2e};
use evlet_testkit::eventually;
use serde_json::{Value, json};
use support::IMAGE;

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

/// What the ServiceAccount admission does on a real cluster, done by hand
/// for the mock: the default account, its CA ConfigMap, the
/// `kube-api-access` volume mounted at [`SA_DIR`] in every container.
async fn service_account(api: &Api, spec: Value) -> Value {
    if api.is_real() {
        return spec;
    }
    let ns = api.ns();
    if api.get("serviceaccounts", ns, "default").await.is_none() {
        api.create(
            "serviceaccounts",
            ns,
            json!({"metadata": {"name": "default"}}),
        )
        .await;
        api.create(
            "configmaps",
            ns,
            json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}}),
        )
        .await;
    }
    let mut spec = spec;
    spec["serviceAccountName"] = json!("default");
    spec["volumes"]
        .as_array_mut()
        .expect("the pod's volumes")
        .push(kube_api_access());
    for c in spec["containers"].as_array_mut().into_iter().flatten() {
        c["volumeMounts"]
            .as_array_mut()
            .expect("the container's mounts")
            .push(json!({"name": "kube-api-access-x7k2p", "mountPath": SA_DIR, "readOnly": true}));
    }
    spec
}

/// The claims of a service-account token: a JWT's payload on the real
/// cluster, None for the mock's opaque tokens.
fn jwt_claims(token: &str) -> Option<Value> {
    use base64::Engine as _;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_service_account_volume_gives_the_pod_its_token_ca_and_namespace() {
    api_e2e(
        "the_default_service_account_volume_gives_the_pod_its_token_ca_and_namespace",
        Backend::Real,
        |w, api| async move {
            let ns = api.ns();
            let out = tempfile::tempdir().expect("out");
            let agent = api.start(&w, w.config()).await;
            let name = w.pod_name("sa");
            let spec = service_account(&api, json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [out_volume(out.path())],
                "containers": [{"name": "app", "image": IMAGE,
                    "command": ["sh", "-c", format!("cat {SA_DIR}/token > /out/token; cat {SA_DIR}/ca.crt > /out/ca; cat {SA_DIR}/namespace > /out/ns; stat -L -c %a {SA_DIR}/token > /out/mode; exec sleep 3600")],
                    "volumeMounts": [{"name": "out", "mountPath": "/out"}]}]
            }))
            .await;
            api.create("pods", ns, api.pod(&w, "sa", spec)).await;
            let token = eventually(Duration::from_secs(60), "the token read inside the pod", || async {
                read(out.path(), "mode").and_then(|_| read(out.path(), "token"))
            })
            .await;
            let pod = api.get("pods", ns, &name).await.expect("pod");
            match jwt_claims(&token) {
                // A token bound to the pod, signed by the cluster.
                Some(claims) if api.is_real() => {
                    let bound = &claims["kubernetes.io"];
                    assert_eq!(bound["namespace"], ns, "{claims}");
                    assert_eq!(bound["pod"]["name"], name.as_str(), "{claims}");
                    assert_eq!(bound["pod"]["uid"], pod["metadata"]["uid"], "{claims}");
                    assert_eq!(bound["serviceaccount"]["name"], "default", "{claims}");
                }
                _ => assert!(token.starts_with(&format!("token-default-{name}-")), "{token}"),
            }
            let root_ca = api.get("configmaps", ns, "kube-root-ca.crt").await.expect("the root CA");
            assert_eq!(read(out.path(), "ca").as_deref(), root_ca["data"]["ca.crt"].as_str());
            assert_eq!(read(out.path(), "ns").as_deref(), Some(ns));
            assert_eq!(read(out.path(), "mode").as_deref(), Some("644\n"));
            let request = api
                .requests_matching("POST", "/serviceaccounts/default/token")
                .await
                .into_iter()
                .next()
                .and_then(|r| r.body)
                .expect("a TokenRequest");
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
async fn a_config_map_update_reaches_the_files_atomically_and_secrets_live_in_memory() {
    api_e2e(
        "a_config_map_update_reaches_the_files_atomically_and_secrets_live_in_memory",
        Backend::Real,
        |w, api| async move {
            let ns = api.ns();
            api.create("configmaps", ns, json!({"metadata": {"name": "settings"}, "data": {"a": "v1", "b": "v1"}})).await;
            api.create("secrets", ns, json!({"metadata": {"name": "creds"}, "data": {"password": "aHVudGVyMg=="}})).await;
            let out = tempfile::tempdir().expect("out");
            let agent = api.start(&w, w.config()).await;
            // The reader resolves ..data once per round and reads both keys
            // from that version: a torn update would show two values.
            let reader = "while true; do d=$(readlink /cfg/..data); a=$(cat /cfg/$d/a 2>/dev/null); b=$(cat /cfg/$d/b 2>/dev/null); if [ -n \"$a\" ] && [ -n \"$b\" ]; then [ \"$a\" = \"$b\" ] || echo \"$a $b\" >> /out/torn; echo $a > /out/seen; fi; done";
            api.create(
                "pods",
                ns,
                api.pod(&w, "cfg", json!({
                    "terminationGracePeriodSeconds": 1,
                    "volumes": [
                        {"name": "cfg", "configMap": {"name": "settings"}},
                        {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 256}},
                        out_volume(out.path())
                    ],
                    "containers": [{"name": "app", "image": IMAGE,
                        "command": ["sh", "-c", format!("cat /creds/password > /out/password; stat -L -c %a /creds/password > /out/password-mode; df /creds | tail -1 > /out/creds-df; {reader}")],
                        "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}, {"name": "creds", "mountPath": "/creds"},
                                         {"name": "out", "mountPath": "/out"}]}]
                })),
            )
            .await;
            eventually(Duration::from_secs(60), "v1 seen inside the pod", || async {
                (read(out.path(), "seen").as_deref() == Some("v1\n")).then_some(())
            })
            .await;
            assert_eq!(read(out.path(), "password").as_deref(), Some("hunter2"));
            assert_eq!(read(out.path(), "password-mode").as_deref(), Some("400\n"));
            assert!(read(out.path(), "creds-df").is_some_and(|d| d.starts_with("tmpfs")), "secrets live in memory");

            let changed = tokio::time::Instant::now();
            api.modify("configmaps", ns, "settings", |cm| {
                cm["data"] = json!({"a": "v2", "b": "v2"});
            })
            .await;
            eventually(Duration::from_secs(30), "v2 seen inside the pod", || async {
                (read(out.path(), "seen").as_deref() == Some("v2\n")).then_some(())
            })
            .await;
            let took = changed.elapsed();
            assert!(took < Duration::from_secs(10), "the change reached the files after {took:?}");
            eprintln!("configmap change → file inside the pod: {took:?}");
            assert_eq!(read(out.path(), "torn"), None, "the reader never saw a mixed set");
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_service_account_token_is_refreshed_before_it_expires() {
    // The mock: tokens living 12 s (the real server's shortest is 10 min).
    api_e2e(
        "a_service_account_token_is_refreshed_before_it_expires",
        Backend::Mock,
        |w, api| async move {
            api.mock().set_token_lifetime(12);
            let out = tempfile::tempdir().expect("out");
            let agent = api.start(&w, w.config()).await;
            let spec = service_account(&api, json!({
                "terminationGracePeriodSeconds": 1,
                "volumes": [out_volume(out.path())],
                "containers": [{"name": "app", "image": IMAGE,
                    "command": ["sh", "-c", format!("while true; do cat {SA_DIR}/token > /out/token; sleep 0.2; done")],
                    "volumeMounts": [{"name": "out", "mountPath": "/out"}]}]
            }))
            .await;
            api.create("pods", api.ns(), api.pod(&w, "tok", spec)).await;
            let first = eventually(Duration::from_secs(60), "the token", || async {
                read(out.path(), "token")
            })
            .await;
            // Refreshed after about 10 s (80 % of the lifetime).
            eventually(Duration::from_secs(30), "a refreshed token", || async {
                read(out.path(), "token")
                    .filter(|t| *t != first && t.starts_with("token-"))
                    .map(|_| ())
            })
            .await;
            assert!(api.requests_matching("POST", "/serviceaccounts/default/token").await.len() >= 2);
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_config_map_holds_the_pod_and_an_optional_one_is_empty() {
    api_e2e(
        "a_missing_config_map_holds_the_pod_and_an_optional_one_is_empty",
        Backend::Real,
        |w, api| async move {
            let ns = api.ns();
            let out = tempfile::tempdir().expect("out");
            let agent = api.start(&w, w.config()).await;
            api.create(
                "pods",
                ns,
                api.pod(&w, "wait", json!({
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
            )
            .await;
            eventually(Duration::from_secs(30), "a FailedMount event", || async {
                api.list("events", ns).await.into_iter().find(|e| {
                    e["reason"] == "FailedMount"
                        && e["message"] == "MountVolume.SetUp failed for volume \"needed\" : configmap \"later\" not found"
                })
            })
            .await;
            let (sandboxes, _) = w.runtime_objects("wait").await;
            assert!(sandboxes.is_empty(), "nothing runs without its volume");
            api.create("configmaps", ns, json!({"metadata": {"name": "later"}, "data": {"k": "here"}})).await;
            eventually(Duration::from_secs(30), "the pod running with its data", || async {
                read(out.path(), "needed").filter(|n| n == "here").map(|_| ())
            })
            .await;
            assert_eq!(read(out.path(), "maybe").map(|s| s.trim().to_owned()).as_deref(), Some("0"));
            agent.stop().await;
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_bound_to_a_local_volume_mounts_its_path() {
    api_e2e(
        "a_claim_bound_to_a_local_volume_mounts_its_path",
        Backend::Real,
        |w, api| async move {
            let ns = api.ns();
            let pv = format!("local-{}", w.name);
            let disk = tempfile::tempdir().expect("local disk");
            let agent = api.start(&w, w.config()).await;
            let claim = api.create(
                "persistentvolumeclaims",
                ns,
                json!({"metadata": {"name": "data"}, "spec": {"volumeName": pv, "storageClassName": "",
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
            )
            .await;
            api.create(
                "persistentvolumes",
                "",
                json!({"metadata": {"name": pv}, "spec": {
                    "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "local": {"path": disk.path().display().to_string()},
                    "claimRef": {"namespace": ns, "name": "data", "uid": claim["metadata"]["uid"]},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [w.name.clone()]}]}]}}
                }}),
            )
            .await;
            api.create(
                "pods",
                ns,
                api.pod(&w, "pvc", json!({
                    "terminationGracePeriodSeconds": 1,
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                    "containers": [{"name": "app", "image": IMAGE,
                        "command": ["sh", "-c", "echo persisted > /data/file; exec sleep 3600"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]
                })),
            )
            .await;
            eventually(Duration::from_secs(60), "the file on the local disk", || async {
                read(disk.path(), "file").filter(|f| f == "persisted\n").map(|_| ())
            })
            .await;
            // Upstream's volume stats of the claim: the local disk's file system.
            let series = format!("kubelet_volume_stats_capacity_bytes{{namespace=\"{ns}\",persistentvolumeclaim=\"data\"}}");
            let capacity = |text: &str| -> Option<f64> {
                text.lines()
                    .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
            };
            let (_, _, text) = support::http_get(agent.handles.address.expect("the read-only port"), "/metrics").await;
            let disk_size = rustix::fs::statvfs(disk.path()).map(|s| (s.f_blocks * s.f_frsize) as f64).expect("statvfs");
            assert_eq!(capacity(&text), Some(disk_size), "{text}");
            api.delete_pod(ns, &w.pod_name("pvc"), Some(0)).await;
            let pods = w.root.path().join("pods");
            eventually(Duration::from_secs(30), "the pod torn down", || async {
                let left = std::fs::read_dir(&pods).map_or(0, |d| d.count());
                (left == 0).then_some(())
            })
            .await;
            assert_eq!(read(disk.path(), "file").as_deref(), Some("persisted\n"), "the local volume's data stays");
            let (_, _, text) = support::http_get(agent.handles.address.expect("the read-only port"), "/metrics").await;
            assert_eq!(capacity(&text), None, "the claim's stats go with the pod");
            agent.stop().await;
        },
    )
    .await;
}
