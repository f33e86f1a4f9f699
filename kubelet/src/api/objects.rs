//! [`ApiEnvObjects`]: the ConfigMaps and Secrets a container's environment
//! names, read from the API server (a GET of each when the container starts).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use crate::sync::env::{ApiObjects, ObjectKind, References};
use crate::sync::objects::{BoxFuture, EnvObjects, ObjectsError};

/// Reads env objects with a kube client.
#[derive(Clone)]
pub struct ApiEnvObjects(pub kube::Client);

impl std::fmt::Debug for ApiEnvObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiEnvObjects")
    }
}

fn api_error(kind: ObjectKind, namespace: &str, name: &str, e: kube::Error) -> ObjectsError {
    ObjectsError::Api {
        kind,
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        source: Box::new(e),
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
            let api: kube::Api<ConfigMap> = kube::Api::namespaced(self.0.clone(), namespace);
            for name in &refs.config_maps {
                let cm = api
                    .get_opt(name)
                    .await
                    .map_err(|e| api_error(ObjectKind::ConfigMap, namespace, name, e))?;
                if let Some(cm) = cm {
                    objects
                        .config_maps
                        .insert(name.clone(), cm.data.unwrap_or_default());
                }
            }
            let api: kube::Api<Secret> = kube::Api::namespaced(self.0.clone(), namespace);
            for name in &refs.secrets {
                let secret = api
                    .get_opt(name)
                    .await
                    .map_err(|e| api_error(ObjectKind::Secret, namespace, name, e))?;
                if let Some(secret) = secret {
                    let mut data: BTreeMap<String, String> = secret
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                        .collect();
                    data.extend(secret.string_data.unwrap_or_default());
                    objects.secrets.insert(name.clone(), data);
                }
            }
            Ok(objects)
        })
    }
}
