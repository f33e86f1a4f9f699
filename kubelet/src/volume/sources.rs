//! Where volumes' API objects come from: ConfigMaps, Secrets, service-account
//! tokens, claims and their volumes. The API server implements it (watched
//! objects, the token manager); standalone, [`NoApiServer`] refuses, because
//! a static pod cannot reference API objects (upstream).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

/// A boxed future, so the trait stays object-safe.
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The data of a ConfigMap or Secret (Secret values decoded).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectData {
    /// Key → bytes (a ConfigMap's `data` and `binaryData`; a Secret's `data`).
    pub data: BTreeMap<String, Vec<u8>>,
}

/// A token for a projected `serviceAccountToken`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// The JWT.
    pub token: String,
    /// When it expires (Unix seconds).
    pub expires_at: i64,
}

/// What a `serviceAccountToken` projection asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenRequest {
    /// The pod's namespace.
    pub namespace: String,
    /// The service account.
    pub service_account: String,
    /// The audience ("" = the API server's).
    pub audience: String,
    /// Lifetime asked for, seconds.
    pub expiration_seconds: i64,
    /// The pod the token is bound to.
    pub pod_name: String,
    /// Its UID.
    pub pod_uid: String,
}

/// Why an object could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// It does not exist (`configmap "x" not found`).
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// `configmap`, `secret`, ...
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The API server could not be asked, or refused.
    #[error("{0}")]
    Failed(String),
}

/// The API objects volumes read.
pub trait VolumeSources: Send + Sync + fmt::Debug {
    /// A ConfigMap's data.
    fn config_map<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Fut<'a, Result<ObjectData, SourceError>>;
    /// A Secret's data.
    fn secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Fut<'a, Result<ObjectData, SourceError>>;
    /// A service-account token (cached, refreshed at 80 % of its lifetime).
    fn token<'a>(&'a self, request: &'a TokenRequest) -> Fut<'a, Result<Token, SourceError>>;
    /// A claim.
    fn claim<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> Fut<'a, Result<PersistentVolumeClaim, SourceError>>;
    /// A persistent volume.
    fn volume<'a>(&'a self, name: &'a str) -> Fut<'a, Result<PersistentVolume, SourceError>>;
}

/// Standalone: there is no API server to read objects from.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoApiServer;

fn standalone<T>(what: &str) -> Result<T, SourceError> {
    Err(SourceError::Failed(format!(
        "cannot read {what}: evlet runs without an API server (--kubeconfig)"
    )))
}

impl VolumeSources for NoApiServer {
    fn config_map<'a>(
        &'a self,
        _: &'a str,
        name: &'a str,
    ) -> Fut<'a, Result<ObjectData, SourceError>> {
        Box::pin(async move { standalone(&format!("configmap {name:?}")) })
    }
    fn secret<'a>(&'a self, _: &'a str, name: &'a str) -> Fut<'a, Result<ObjectData, SourceError>> {
        Box::pin(async move { standalone(&format!("secret {name:?}")) })
    }
    fn token<'a>(&'a self, r: &'a TokenRequest) -> Fut<'a, Result<Token, SourceError>> {
        Box::pin(async move {
            standalone(&format!(
                "a token of service account {:?}",
                r.service_account
            ))
        })
    }
    fn claim<'a>(
        &'a self,
        _: &'a str,
        name: &'a str,
    ) -> Fut<'a, Result<PersistentVolumeClaim, SourceError>> {
        Box::pin(async move { standalone(&format!("persistentvolumeclaim {name:?}")) })
    }
    fn volume<'a>(&'a self, name: &'a str) -> Fut<'a, Result<PersistentVolume, SourceError>> {
        Box::pin(async move { standalone(&format!("persistentvolume {name:?}")) })
    }
}
