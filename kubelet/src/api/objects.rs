//! [`ApiEnvObjects`]: what a container's start reads from the API server:
//! the ConfigMaps and Secrets its environment names (from the watched
//! [`ObjectCache`], the same cache volumes read), the Services of its
//! environment (the [`ServiceCache`]), and the pod's RuntimeClass.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;

use super::services::ServiceCache;
use super::watched::{Kind, ObjectCache};
use crate::sync::env::{ApiObjects, ObjectKind, References};
use crate::sync::objects::{BoxFuture, EnvObjects, ObjectsError};

/// How long a container's start waits for the first list of Services.
const SERVICES_WAIT: Duration = Duration::from_secs(10);

/// Reads env objects, services and RuntimeClasses from the API server.
#[derive(Clone)]
pub struct ApiEnvObjects {
    /// Watched ConfigMaps and Secrets.
    pub objects: Arc<ObjectCache>,
    /// Watched Services.
    pub services: Arc<ServiceCache>,
    /// RuntimeClass reads.
    pub client: kube::Client,
}

impl std::fmt::Debug for ApiEnvObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiEnvObjects")
            .field("objects", &self.objects)
            .field("services", &self.services)
            .finish_non_exhaustive()
    }
}

impl EnvObjects for ApiEnvObjects {
    fn fetch<'a>(
        &'a self,
        namespace: &'a str,
        refs: &'a References,
    ) -> BoxFuture<'a, Result<ApiObjects, ObjectsError>> {
        Box::pin(async move {
            let mut objects = ApiObjects::default();
            let wanted = refs
                .config_maps
                .iter()
                .map(|n| (ObjectKind::ConfigMap, Kind::ConfigMap, n))
                .chain(
                    refs.secrets
                        .iter()
                        .map(|n| (ObjectKind::Secret, Kind::Secret, n)),
                );
            for (kind, watched, name) in wanted {
                let data = self
                    .objects
                    .get(watched, namespace, name)
                    .await
                    .map_err(|e| ObjectsError::Api {
                        kind,
                        namespace: namespace.to_owned(),
                        name: name.clone(),
                        source: Box::new(e),
                    })?;
                let Some(data) = data else { continue };
                let text = data
                    .iter()
                    .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect();
                match kind {
                    ObjectKind::ConfigMap => objects.config_maps.insert(name.clone(), text),
                    ObjectKind::Secret => objects.secrets.insert(name.clone(), text),
                };
            }
            Ok(objects)
        })
    }

    fn runtime_handler<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<String, ObjectsError>> {
        Box::pin(async move {
            let Some(name) = pod
                .spec
                .as_ref()
                .and_then(|s| s.runtime_class_name.as_deref())
                .filter(|n| !n.is_empty())
            else {
                return Ok(String::new());
            };
            let api: kube::Api<RuntimeClass> = kube::Api::all(self.client.clone());
            match api.get_opt(name).await {
                Ok(Some(rc)) => Ok(rc.handler),
                Ok(None) => Err(ObjectsError::RuntimeClass(format!(
                    "runtimeclass.node.k8s.io {name:?} not found"
                ))),
                Err(e) => Err(ObjectsError::RuntimeClass(format!(
                    "failed to lookup RuntimeClass {name}: {e}"
                ))),
            }
        })
    }

    fn service_env<'a>(
        &'a self,
        namespace: &'a str,
        links: bool,
        wait: bool,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, ObjectsError>> {
        Box::pin(async move {
            if wait && !self.services.wait_ready(SERVICES_WAIT).await {
                return Err(ObjectsError::ServicesNotRead);
            }
            Ok(self.services.env(namespace, links))
        })
    }
}
