//! [`ApiVolumeSources`]: what volumes read from the API server. ConfigMaps and
//! Secrets come from the watched [`ObjectCache`], tokens from the
//! [`TokenManager`], claims and persistent volumes from a live GET (as
//! upstream's volume populator does).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;

use super::tokens::TokenManager;
use super::watched::{Kind, ObjectCache};
use crate::volume::sources::{Fut, ObjectData, SourceError, Token, TokenRequest, VolumeSources};

/// Volumes' API objects, from the API server.
#[derive(Debug, Clone)]
pub struct ApiVolumeSources {
    /// Watched ConfigMaps and Secrets.
    pub objects: Arc<ObjectCache>,
    /// Service-account tokens.
    pub tokens: Arc<TokenManager>,
    /// Claims and volumes.
    pub client: ApiClientHandle,
}

/// A kube client that prints as its role only.
#[derive(Clone)]
pub struct ApiClientHandle(pub kube::Client);

impl std::fmt::Debug for ApiClientHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiClientHandle")
    }
}

impl ApiVolumeSources {
    async fn object(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Result<ObjectData, SourceError> {
        match self.objects.get(kind, namespace, name).await {
            Ok(Some(data)) => Ok(ObjectData {
                data: (*data).clone(),
            }),
            Ok(None) => Err(SourceError::NotFound {
                kind: kind.lower(),
                name: name.to_owned(),
            }),
            Err(e) => Err(SourceError::Failed(e.to_string())),
        }
    }
}

fn get_error(kind: &'static str, name: &str, e: kube::Error) -> SourceError {
    match &e {
        kube::Error::Api(s) if s.code == 404 => SourceError::NotFound {
            kind,
            name: name.to_owned(),
        },
        _ => SourceError::Failed(e.to_string()),
    }
}

impl VolumeSources for ApiVolumeSources {
    fn config_map<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Fut<'a, Result<ObjectData, SourceError>> {
        Box::pin(self.object(Kind::ConfigMap, namespace, name))
    }

    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Fut<'a, Result<ObjectData, SourceError>> {
        Box::pin(self.object(Kind::Secret, namespace, name))
    }

    fn token<'a>(&'a self, request: &'a TokenRequest) -> Fut<'a, Result<Token, SourceError>> {
        Box::pin(async move {
            self.tokens
                .get(request)
                .await
                .map_err(|e| SourceError::Failed(e.to_string()))
        })
    }

    fn claim<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Fut<'a, Result<PersistentVolumeClaim, SourceError>> {
        Box::pin(async move {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.0.clone(), namespace);
            api.get(name)
                .await
                .map_err(|e| get_error("persistentvolumeclaim", name, e))
        })
    }

    fn volume<'a>(&'a self, name: &'a str) -> Fut<'a, Result<PersistentVolume, SourceError>> {
        Box::pin(async move {
            let api: Api<PersistentVolume> = Api::all(self.client.0.clone());
            api.get(name)
                .await
                .map_err(|e| get_error("persistentvolume", name, e))
        })
    }
}
