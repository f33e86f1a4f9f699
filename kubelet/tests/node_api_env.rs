//! Container environments of API pods from the cluster, on the private real
//! containerd joined to the real control plane (`support/cluster.rs`):
//! `envFrom` a ConfigMap and `env` from a Secret that appears only later
//! (watched by name, as upstream), and the Services' variables.

#[path = "support/apiserver.rs"]
mod apiserver;
#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::time::Duration;

use cluster::{Backend, api_e2e};
use evlet_testkit::eventually;
use serde_json::json;
use support::IMAGE;

#[tokio::test(flavor = "multi_thread")]
async fn env_from_secrets_and_config_maps_waits_for_a_missing_secret() {
    api_e2e(
        "env_from_secrets_and_config_maps_waits_for_a_missing_secret",
        Backend::Real,
        |w, api| async move {
            let agent = api.start(&w, w.config()).await;
            let ns = api.ns();
            api.create(
                "configmaps",
                ns,
                json!({"metadata": {"name": "settings"}, "data": {"MODE": "fast"}}),
            )
            .await;
            let name = w.pod_name("envy");
            api.create(
                "pods",
                ns,
                api.pod(&w, "envy", json!({
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": IMAGE,
                        "command": ["/bin/sh", "-c", "test \"$PW\" = s3cret && test \"$CFG_MODE\" = fast"],
                        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
                        "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}]}]
                })),
            )
            .await;
            let waiting = eventually(Duration::from_secs(30), "CreateContainerConfigError", || async {
                let p = api.get("pods", ns, &name).await?;
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
                ns,
                json!({"metadata": {"name": "db"}, "data": {"pw": "czNjcmV0"}}),
            )
            .await;
            let done = api.wait_phase(&name, "Succeeded", Duration::from_secs(60)).await;
            assert_eq!(
                done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
                0,
                "the env had the secret and the prefixed ConfigMap key"
            );
            // The secret is watched (a list and watch on its name), not read per start.
            let reads = api
                .requests_matching("GET", &format!("/namespaces/{ns}/secrets"))
                .await;
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
async fn services_become_environment_variables() {
    api_e2e(
        "services_become_environment_variables",
        Backend::Real,
        |w, api| async move {
            let ns = api.ns();
            // The cluster's own `kubernetes` Service (the mock has none: made
            // as the apiserver makes it), seen from every namespace.
            if !api.is_real() {
                api.create("services", "default", json!({"metadata": {"name": "kubernetes"},
                    "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}}))
                    .await;
            }
            let master = api.get("services", "default", "kubernetes").await.expect("the kubernetes Service");
            let master_ip = master["spec"]["clusterIP"].as_str().expect("its IP").to_owned();
            let mut front = json!({"ports": [{"port": 8080, "protocol": "TCP"}]});
            if !api.is_real() {
                front["clusterIP"] = json!("10.96.7.7");
            }
            let front = api
                .create("services", ns, json!({"metadata": {"name": "web-front"}, "spec": front}))
                .await;
            let front_ip = front["spec"]["clusterIP"].as_str().expect("an IP allocated").to_owned();
            api.create("services", ns, json!({"metadata": {"name": "headless"},
                "spec": {"clusterIP": "None", "ports": [{"port": 9000}]}}))
                .await;
            let agent = api.start(&w, w.config()).await;
            let linked = w.pod_name("linked");
            api.create(
                "pods",
                ns,
                api.pod(&w, "linked", json!({
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": IMAGE, "command": ["/bin/sh", "-c", format!(
                        "test \"$KUBERNETES_SERVICE_HOST\" = {master_ip} && test \"$KUBERNETES_SERVICE_PORT\" = 443 \
                         && test \"$KUBERNETES_SERVICE_PORT_HTTPS\" = 443 && test \"$WEB_FRONT_SERVICE_HOST\" = {front_ip} \
                         && test \"$WEB_FRONT_PORT\" = tcp://{front_ip}:8080 \
                         && test \"$WEB_FRONT_PORT_8080_TCP_ADDR\" = {front_ip} && test -z \"$HEADLESS_SERVICE_HOST\"")]}]
                })),
            )
            .await;
            let unlinked = w.pod_name("unlinked");
            api.create(
                "pods",
                ns,
                api.pod(&w, "unlinked", json!({
                    "restartPolicy": "Never",
                    "enableServiceLinks": false,
                    "containers": [{"name": "main", "image": IMAGE, "command": ["/bin/sh", "-c", format!(
                        "test \"$KUBERNETES_SERVICE_HOST\" = {master_ip} && test -z \"$WEB_FRONT_SERVICE_HOST\"")]}]
                })),
            )
            .await;
            for pod in [&linked, &unlinked] {
                let done = api.wait_phase(pod, "Succeeded", Duration::from_secs(60)).await;
                assert_eq!(done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 0, "{pod}");
            }
            agent.stop().await;
        },
    )
    .await;
}
