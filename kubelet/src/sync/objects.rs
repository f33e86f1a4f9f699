//! [`EnvObjects`]: where the ConfigMaps and Secrets a container's environment
//! names come from. Declared here, by its consumer; API-server mode implements
//! it (`api::objects`), and [`NoApiServer`] stands in for it when evlet runs
//! standalone.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use k8s_openapi::api::core::v1::Pod;

use super::env::{ApiObjects, ObjectKind, References};

/// A boxed future, for the object-safe trait below.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why the objects could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    /// Standalone: there is no API server to ask (upstream's message).
    #[error("couldn't get {} {namespace}/{name}, no kubeClient defined", kind_word(*.kind))]
    NoApiServer {
        /// ConfigMap or Secret.
        kind: ObjectKind,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A RuntimeClass that cannot be resolved.
    #[error("{0}")]
    RuntimeClass(String),
    /// The services were never read (upstream: a non-static pod waits for them).
    #[error("services have not yet been read at least once, cannot construct envvars")]
    ServicesNotRead,
    /// The API server did not answer the read.
    #[error("{} {namespace}/{name}: {source}", .kind.lower())]
    Api {
        /// ConfigMap or Secret.
        kind: ObjectKind,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn kind_word(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::ConfigMap => "configMap",
        ObjectKind::Secret => "secret",
    }
}

/// Reads the ConfigMaps and Secrets a container's environment names.
///
/// # Errors
/// [`ObjectsError`]; an object that does not exist is not an error but left
/// out of the answer (the env builder applies `optional`). The syncer reports
/// an error as `CreateContainerConfigError` and retries after 10 s.
pub trait EnvObjects: Send + Sync + fmt::Debug {
    /// The objects in `refs` of namespace `namespace`.
    fn fetch<'a>(
        &'a self,
        namespace: &'a str,
        refs: &'a References,
    ) -> BoxFuture<'a, Result<ApiObjects, ObjectsError>>;

    /// The CRI runtime handler of the pod's `runtimeClassName` ("" without one).
    fn runtime_handler<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<String, ObjectsError>>;

    /// The service environment of a container in namespace `namespace`
    /// (`KUBERNETES_SERVICE_HOST`, ... and, with `links`, the namespace's
    /// services as Docker-link variables), in a stable order. With `wait`
    /// (API pods) the Services must have been listed once; a static pod takes
    /// what is known, so it never waits for the API server.
    fn service_env<'a>(
        &'a self,
        namespace: &'a str,
        links: bool,
        wait: bool,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, ObjectsError>>;
}

/// Standalone mode: no ConfigMap or Secret can be read. As upstream kubelet
/// without a kubeClient, a container that names one (even an optional one)
/// fails with `couldn't get configMap <ns>/<name>, no kubeClient defined`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoApiServer;

impl EnvObjects for NoApiServer {
    fn fetch<'a>(
        &'a self,
        namespace: &'a str,
        refs: &'a References,
    ) -> BoxFuture<'a, Result<ApiObjects, ObjectsError>> {
        let named = refs
            .config_maps
            .first()
            .map(|n| (ObjectKind::ConfigMap, n))
            .or_else(|| refs.secrets.first().map(|n| (ObjectKind::Secret, n)));
        let answer = match named {
            None => Ok(ApiObjects::default()),
            Some((kind, name)) => Err(ObjectsError::NoApiServer {
                kind,
                namespace: namespace.to_owned(),
                name: name.clone(),
            }),
        };
        Box::pin(std::future::ready(answer))
    }

    fn runtime_handler<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<String, ObjectsError>> {
        // Upstream without an API server uses the default handler whatever the
        // pod says; evlet refuses rather than run it differently.
        let answer = match pod
            .spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref())
        {
            None | Some("") => Ok(String::new()),
            Some(name) => Err(ObjectsError::RuntimeClass(format!(
                "runtimeClassName {name:?} cannot be resolved: evlet runs without an API server"
            ))),
        };
        Box::pin(std::future::ready(answer))
    }

    fn service_env<'a>(
        &'a self,
        _: &'a str,
        _: bool,
        _: bool,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, ObjectsError>> {
        // No services without an API server (upstream: no service variables at all).
        Box::pin(std::future::ready(Ok(Vec::new())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn standalone_refuses_any_named_object_with_upstreams_message() {
        let none = References::default();
        assert_eq!(
            NoApiServer.fetch("ns", &none).await.expect("nothing named"),
            ApiObjects::default()
        );
        let refs = References {
            secrets: ["db".to_owned()].into(),
            ..Default::default()
        };
        let err = NoApiServer.fetch("prod", &refs).await.expect_err("no API");
        assert_eq!(
            err.to_string(),
            "couldn't get secret prod/db, no kubeClient defined"
        );
    }
}
