//! Image pulls over the fake CRI runtime: a private image is pulled with the
//! credentials of the pod's `imagePullSecrets` for its registry, and without
//! them the pull fails into `ErrImagePull` and then `ImagePullBackOff`.

#[path = "support/rig.rs"]
mod rig;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use evlet::pod::PodUid;
use evlet::sync::env::{ApiObjects, References};
use evlet::sync::objects::{EnvObjects, ObjectsError};
use evlet_testkit::eventually;
use futures_util::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use rig::{add, pod, rig_with};

const PRIVATE: &str = "registry.example.com/team/app:v1";

/// Two pull secrets of namespace `default`: one for the private registry,
/// one for another registry with other credentials.
#[derive(Debug)]
struct Secrets;

impl EnvObjects for Secrets {
    fn fetch<'a>(
        &'a self,
        _: &'a str,
        refs: &'a References,
    ) -> BoxFuture<'a, Result<ApiObjects, ObjectsError>> {
        let all: BTreeMap<String, BTreeMap<String, String>> = [
            (
                "regcred",
                r#"{"auths": {"https://registry.example.com/v1/": {"username": "alice", "password": "s3cret"}}}"#,
            ),
            (
                "elsewhere",
                r#"{"auths": {"quay.example.org": {"auth": "Ym9iOmh1bnRlcjI="}}}"#,
            ),
        ]
        .into_iter()
        .map(|(name, json)| {
            (
                name.to_owned(),
                [(".dockerconfigjson".to_owned(), json.to_owned())].into(),
            )
        })
        .collect();
        let secrets = all
            .into_iter()
            .filter(|(n, _)| refs.secrets.contains(n))
            .collect();
        Box::pin(std::future::ready(Ok(ApiObjects {
            secrets,
            ..Default::default()
        })))
    }

    fn runtime_handler<'a>(&'a self, _: &'a Pod) -> BoxFuture<'a, Result<String, ObjectsError>> {
        Box::pin(std::future::ready(Ok(String::new())))
    }

    fn service_env<'a>(
        &'a self,
        _: &'a str,
        _: bool,
        _: bool,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, ObjectsError>> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }
}

fn waiting_reason(rig: &rig::Rig, uid: &str) -> Option<String> {
    let view = rig.workers.view(&PodUid::from(uid))?;
    view.status
        .container_statuses?
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

#[tokio::test]
async fn pull_secrets_reach_the_runtime_for_their_registry_only() {
    let rig = rig_with(Arc::new(Secrets)).await;
    rig.server
        .runtime()
        .private_image(PRIVATE, "alice", "s3cret");
    let with = pod(
        "with",
        &format!(
            "  imagePullSecrets: [{{name: elsewhere}}, {{name: regcred}}]\n  containers: [{{name: app, image: {PRIVATE}, command: [sleep]}}]\n"
        ),
    );
    add(&rig, &with);
    eventually(
        Duration::from_secs(10),
        "the private image's container running",
        || async {
            let view = rig.workers.view(&PodUid::from("with"))?;
            let c = view.status.container_statuses?.first()?.clone();
            c.state?.running.map(|_| ())
        },
    )
    .await;
    let pulls = rig.server.runtime().pulls();
    let auth = pulls
        .iter()
        .find(|(image, _)| image == PRIVATE)
        .and_then(|(_, auth)| auth.clone())
        .expect("pulled with credentials");
    assert_eq!(
        (auth.username.as_str(), auth.password.as_str()),
        ("alice", "s3cret")
    );
    assert!(
        pulls
            .iter()
            .all(|(_, a)| a.as_ref().is_none_or(|a| a.username != "bob")),
        "the other registry's credentials were offered: {pulls:?}"
    );

    let without = pod(
        "without",
        "  containers: [{name: app, image: registry.example.com/team/app:v2, command: [sleep]}]\n",
    );
    rig.server
        .runtime()
        .private_image("registry.example.com/team/app:v2", "alice", "s3cret");
    add(&rig, &without);
    eventually(Duration::from_secs(10), "ErrImagePull", || async {
        (waiting_reason(&rig, "without")? == "ErrImagePull").then_some(())
    })
    .await;
    assert!(
        rig.server
            .runtime()
            .pulls()
            .iter()
            .any(|(image, auth)| image.ends_with("app:v2") && auth.is_none()),
        "pulled without credentials"
    );
}
