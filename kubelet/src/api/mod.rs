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
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::client::ConfigExt as _;

use crate::certificate::CertificateManager;
use crate::metrics::rest::RestClientMetrics;

/// A Kubernetes API client (kube-rs) for one node, with the metrics of its
/// requests.
#[derive(Clone)]
pub struct ApiClient {
    /// The client.
    pub client: kube::Client,
    /// What its requests report to (registered by the agent).
    pub metrics: RestClientMetrics,
    /// The node's certificates when evlet keeps them (`--bootstrap-kubeconfig`,
    /// `rotateCertificates`, `serverTLSBootstrap`): the agent serves the
    /// secured port with the serving one and registers their metrics.
    pub certificates: Option<Arc<CertificateManager>>,
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
    /// The certificate manager has no cluster to connect to.
    #[error("no kubeconfig names the API server (neither --kubeconfig nor --bootstrap-kubeconfig)")]
    NoCluster,
    /// The cluster of the certificate manager's kubeconfig is unusable.
    #[error(transparent)]
    Certificate(#[from] crate::certificate::Error),
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
            certificates: None,
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
        Ok(Self {
            client,
            metrics,
            certificates: None,
        })
    }

    /// A client of the cluster the manager names (the kubeconfig's server
    /// and CA) whose client certificate is the manager's current one, read
    /// on every TLS handshake: a rotated certificate serves the next
    /// connection without a restart, and connections made with an older one
    /// are not reused (upstream closes them). Answers are shown to the
    /// manager, which notices when the API server stops taking the
    /// certificate. The same layers as [`Self::from_kubeconfig`]: request
    /// metrics, the client-side rate limit, the timeouts, kube-rs's retry of
    /// 429/503/504.
    ///
    /// # Errors
    /// [`ApiError`] naming the kubeconfig.
    pub async fn with_certificates(manager: Arc<CertificateManager>) -> Result<Self, ApiError> {
        let cluster = manager.cluster().ok_or(ApiError::NoCluster)?;
        let path = cluster.path.clone();
        let client_error = |source| ApiError::Client {
            path: path.clone(),
            source,
        };
        let mut config = crate::certificate::kubeconfig::anonymous(cluster).await?;
        config.read_timeout = Some(Duration::from_secs(295));
        config.write_timeout = Some(Duration::from_secs(60));
        let mut tls = config.rustls_client_config().map_err(client_error)?;
        if let Some(resolver) = manager.client_resolver() {
            tls.client_auth_cert_resolver = resolver;
        }
        let server_name = match &config.tls_server_name {
            Some(n) => Some(
                rustls::pki_types::ServerName::try_from(n.clone()).map_err(|e| {
                    client_error(kube::Error::RustlsTls(
                        kube::client::RustlsTlsError::InvalidServerName(e),
                    ))
                })?,
            ),
            None => None,
        };
        let tls = Arc::new(tls);
        let timeouts = (
            config.connect_timeout,
            config.read_timeout,
            config.write_timeout,
        );
        let make = move || {
            let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
            http.enforce_http(false);
            // A session cache of its own: a TLS 1.3 resumption carries the
            // identity of the handshake it resumes, so a session made with
            // no or the old certificate must not serve the new one.
            let mut config = (*tls).clone();
            config.resumption = rustls::client::Resumption::default();
            let builder = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(config)
                .https_or_http();
            let builder = match &server_name {
                Some(n) => builder.with_server_name_resolver(
                    hyper_rustls::FixedServerNameResolver::new(n.clone()),
                ),
                None => builder,
            };
            let mut connector =
                hyper_timeout::TimeoutConnector::new(builder.enable_http1().wrap_connector(http));
            connector.set_connect_timeout(timeouts.0);
            connector.set_read_timeout(timeouts.1);
            connector.set_write_timeout(timeouts.2);
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(connector)
        };
        let generation = manager
            .client_generation()
            .unwrap_or_else(|| Arc::new(AtomicU64::new(0)));
        let transport = PerCertificate {
            current: Arc::new(std::sync::Mutex::new((
                generation.load(Ordering::SeqCst),
                make(),
            ))),
            make: Arc::new(make),
            generation,
        };
        let service = tower::ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.default_retry.then(|| {
                tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())
            }))
            .layer(config.extra_headers_layer().map_err(client_error)?)
            .map_err(tower::BoxError::from)
            .service(transport);
        let metrics = RestClientMetrics::new();
        let observer = Arc::clone(&manager);
        let client = kube::client::ClientBuilder::new(service, config.default_namespace.clone())
            .with_layer(&tower::util::MapResponseLayer::new(
                move |response: http::Response<hyper::body::Incoming>| {
                    observer.observe_status(response.status().as_u16());
                    response
                },
            ))
            .with_layer(&requests::RequestMetricsLayer::new(metrics.clone()))
            .with_layer(&ratelimit::RateLimitLayer::new(
                ratelimit::QPS,
                ratelimit::BURST,
            ))
            .build();
        Ok(Self {
            client,
            metrics,
            certificates: Some(manager),
        })
    }
}

/// How the node gets its credentials beyond the kubeconfig: TLS bootstrap
/// and certificate rotation (upstream's flags and `KubeletConfiguration`
/// fields of the same names).
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// `--bootstrap-kubeconfig`.
    pub bootstrap_kubeconfig: Option<std::path::PathBuf>,
    /// `rotateCertificates`.
    pub rotate_certificates: bool,
    /// `serverTLSBootstrap`: the node's host names and IPs, the serving
    /// certificate's SANs.
    pub server_tls_bootstrap: Option<(Vec<String>, Vec<std::net::IpAddr>)>,
    /// Where the certificates are kept (`<root-dir>/pki`).
    pub cert_dir: std::path::PathBuf,
    /// `spec.expirationSeconds` of the CSRs (None, as upstream's kubelet;
    /// tests ask for short-lived certificates).
    pub requested_duration: Option<Duration>,
}

impl Credentials {
    /// Does evlet keep any certificate itself?
    pub fn managed(&self) -> bool {
        self.bootstrap_kubeconfig.is_some()
            || self.rotate_certificates
            || self.server_tls_bootstrap.is_some()
    }
}

impl ApiClient {
    /// The node's client: the kubeconfig's credentials as they are, or with
    /// TLS bootstrap and rotation the certificate manager's, whose loops
    /// start here and stop with `shutdown`. Without rotation a bootstrap
    /// blocks until the certificate arrives, as upstream's `LoadClientCert`
    /// blocks the kubelet's start; with rotation it goes on in the
    /// background (requests fail until then), as upstream's.
    ///
    /// # Errors
    /// [`ApiError`] naming the kubeconfig, or the certificate manager's file.
    pub async fn join(
        kubeconfig: &Path,
        node_name: &str,
        credentials: &Credentials,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> Result<Self, ApiError> {
        use crate::certificate::{Clients, Settings};
        if !credentials.managed() {
            return Self::from_kubeconfig(kubeconfig).await;
        }
        let manager = Arc::new(CertificateManager::new(Settings {
            node_name: node_name.to_owned(),
            cert_dir: credentials.cert_dir.clone(),
            kubeconfig: kubeconfig.to_owned(),
            bootstrap_kubeconfig: credentials.bootstrap_kubeconfig.clone(),
            rotate_certificates: credentials.rotate_certificates,
            server_tls_bootstrap: credentials.server_tls_bootstrap.clone(),
            requested_duration: credentials.requested_duration,
            metrics: crate::metrics::CertificateMetrics::new(),
        })?);
        let api = if manager.manages_client() {
            Self::with_certificates(Arc::clone(&manager)).await?
        } else {
            let mut api = Self::from_kubeconfig(kubeconfig).await?;
            api.certificates = Some(Arc::clone(&manager));
            api
        };
        let bootstrap = match &credentials.bootstrap_kubeconfig {
            Some(path) => Some(Self::from_kubeconfig(path).await?.client),
            // Rotation alone: the kubeconfig's own credentials ask when there
            // is no usable certificate (upstream's kubeadm path).
            None if manager.manages_client() => Self::from_kubeconfig(kubeconfig)
                .await
                .ok()
                .map(|a| a.client),
            None => None,
        };
        tokio::spawn(Arc::clone(&manager).run(
            Clients {
                node: api.client.clone(),
                bootstrap,
            },
            shutdown.child_token(),
        ));
        if manager.manages_client()
            && !credentials.rotate_certificates
            && manager.client_certificate().is_none()
        {
            tracing::info!(
                "waiting for the client certificate (TLS bootstrap: without rotateCertificates \
                 the start waits for it, as upstream's)"
            );
            tokio::select! {
                () = manager.client_ready() => {}
                () = shutdown.cancelled() => {}
            }
        }
        Ok(api)
    }
}

/// The HTTPS client the TLS connections are made with.
type Transport = hyper_util::client::legacy::Client<
    hyper_timeout::TimeoutConnector<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    >,
    kube::client::Body,
>;

/// One connection pool per client certificate: when the certificate
/// changes, the next request gets a new pool, and the old one's idle
/// connections close once its last request is answered (upstream closes
/// every connection on rotation, in-flight requests included).
#[derive(Clone)]
struct PerCertificate {
    /// The pool of the certificate generation it was made for.
    current: Arc<std::sync::Mutex<(u64, Transport)>>,
    /// Makes a new pool.
    make: Arc<dyn Fn() -> Transport + Send + Sync>,
    /// The manager's change counter.
    generation: Arc<AtomicU64>,
}

impl tower::Service<http::Request<kube::client::Body>> for PerCertificate {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = hyper_util::client::legacy::ResponseFuture;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let now = self.generation.load(Ordering::SeqCst);
        let transport = {
            let mut current = crate::lock::lock(&self.current);
            if current.0 != now {
                tracing::info!(
                    "the client certificate changed; new API connections use the new one"
                );
                *current = (now, (self.make)());
            }
            current.1.clone()
        };
        transport.request(req)
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
    held: node::SelfWatch,
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
    node::run_status(client, input, node, held, shutdown).await;
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
