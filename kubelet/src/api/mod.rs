//! API-server mode: how evlet joins a cluster.
//!
//! * [`node`]: registration of the Node, its status every 10 s, the Lease heartbeat.
//! * [`pods`]: the pods bound to this node (LIST + WATCH), as a pod source, and the
//!   mirror pods seen there.
//! * [`status`]: the status manager (versioned, coalesced `pods/status` patches, the
//!   final delete of terminated pods).
//! * [`mirror`]: mirror pods of static pods.
//! * [`watched`]: the ConfigMaps and Secrets pods use, watched; [`objects`] and
//!   [`volumes`] read them for container environments and volumes.
//! * [`services`]: the cluster's Services, watched, for service env vars.
//! * [`tokens`]: service-account tokens (TokenRequest) for projected volumes.
//! * [`events`]: Kubernetes Events (aggregated repeats, per-pod rate limit).
//! * [`ratelimit`]: client-side QPS/burst (upstream's 50/100).
//! * [`requests`]: `rest_client_*` metrics of every request.
//! * [`admission`]: resource and pod-count admission with upstream's reasons.
//!
//! Every request is listed with its upstream counterpart in ARCHITECTURE.md. None of
//! these loops ever stops the agent: an unreachable API server is retried with
//! backoff while pods keep running.

pub mod admission;
pub mod events;
pub mod mirror;
pub mod node;
pub mod objects;
pub mod pods;
pub mod ratelimit;
pub mod requests;
pub mod reviews;
pub mod services;
pub mod status;
pub mod tokens;
pub mod volumes;
pub mod watched;

use std::fmt;
use std::path::Path;
use std::time::Duration;

use crate::metrics::rest::RestClientMetrics;

/// A Kubernetes API client (kube-rs) for one node, with the metrics of its
/// requests.
#[derive(Clone)]
pub struct ApiClient {
    /// The client.
    pub client: kube::Client,
    /// What its requests report to (registered by the agent).
    pub metrics: RestClientMetrics,
}

impl fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiClient")
    }
}

/// Why the API client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The kubeconfig could not be read or is invalid.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built from it.
    #[error("kubeconfig {path}: {source}")]
    Client {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

impl ApiClient {
    /// A client over an HTTP service (an in-process API server), with
    /// request metrics.
    pub fn over<S, B>(service: S) -> Self
    where
        S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>
            + Send
            + Clone
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let metrics = RestClientMetrics::new();
        let service = tower::Layer::layer(
            &requests::RequestMetricsLayer::new(metrics.clone()),
            service,
        );
        Self {
            client: kube::Client::new(service, "default"),
            metrics,
        }
    }

    /// A client from a kubeconfig file (its current context).
    ///
    /// # Errors
    /// [`ApiError`] naming the file if it cannot be read or used.
    pub async fn from_kubeconfig(path: &Path) -> Result<Self, ApiError> {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(path).map_err(|source| ApiError::Kubeconfig {
                path: path.to_owned(),
                source,
            })?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|source| ApiError::Kubeconfig {
                path: path.to_owned(),
                source,
            })?;
        // Upstream kubelet's runtime request timeout for API calls is 2 min at
        // most; watches set their own server-side timeout.
        config.read_timeout = Some(Duration::from_secs(295));
        config.write_timeout = Some(Duration::from_secs(60));
        let builder =
            kube::client::ClientBuilder::try_from(config).map_err(|source| ApiError::Client {
                path: path.to_owned(),
                source,
            })?;
        let metrics = RestClientMetrics::new();
        let client = builder
            .with_layer(&requests::RequestMetricsLayer::new(metrics.clone()))
            .with_layer(&ratelimit::RateLimitLayer::new(
                ratelimit::QPS,
                ratelimit::BURST,
            ))
            .build();
        Ok(Self { client, metrics })
    }
}

/// Is `err` the API server saying the object does not exist?
pub(crate) fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 404)
}

/// Is `err` a 409 (conflict or already exists)?
pub(crate) fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 409)
}

/// `DELETE` options that remove exactly the object with `uid`, at once (grace
/// period 0): a newer object of the same name is never hit.
pub(crate) fn delete_exactly(uid: Option<String>) -> kube::api::DeleteParams {
    kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid,
            resource_version: None,
        }),
        ..Default::default()
    }
}

/// Registers the node, then keeps its status, its lease and the mirror pods.
pub async fn run_node(
    client: kube::Client,
    input: node::NodeInput,
    statics: tokio::sync::watch::Receiver<mirror::Statics>,
    mirrors: tokio::sync::watch::Receiver<pods::Mirrors>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let Some(node) = node::register(&client, &input, &shutdown).await else {
        return;
    };
    let uid = node.metadata.uid.clone();
    tokio::spawn(node::run_lease(
        client.clone(),
        input.name.clone(),
        uid.clone(),
        shutdown.child_token(),
    ));
    tokio::spawn(mirror::run(
        client.clone(),
        input.name.clone(),
        uid,
        statics,
        mirrors,
        shutdown.child_token(),
    ));
    node::run_status(client, input, node, shutdown).await;
}

/// Tells the status manager which mirror pods exist.
pub async fn forward_mirrors(
    mut mirrors: tokio::sync::watch::Receiver<pods::Mirrors>,
    manager: std::sync::Arc<status::StatusManager>,
) {
    while mirrors.changed().await.is_ok() {
        let current = mirrors.borrow_and_update().clone();
        manager.set_mirrors(&current);
    }
}
