//! [`ApiEnvObjects`]: the ConfigMaps and Secrets a container's environment
//! names, read from the watched [`ObjectCache`] (the same cache volumes read).

use std::sync::Arc;

use super::watched::{Kind, ObjectCache};
use crate::sync::env::{ApiObjects, ObjectKind, References};
use crate::sync::objects::{BoxFuture, EnvObjects, ObjectsError};

/// Reads env objects from the watched objects.
#[derive(Debug, Clone)]
pub struct ApiEnvObjects(pub Arc<ObjectCache>);

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
                let data =
                    self.0
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
}
