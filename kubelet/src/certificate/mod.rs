//! TLS bootstrap and certificate rotation, as upstream kubelet's
//! `pkg/kubelet/certificate` and client-go's `util/certificate` do them.
//!
//! * The client certificate (`--bootstrap-kubeconfig`, `rotateCertificates`):
//!   when the `--kubeconfig` file is missing or its certificate unusable, the
//!   bootstrap kubeconfig's credentials ask for `system:node:<name>` in
//!   `system:nodes` (CSR `node-csr-<hash>`, signer
//!   `kubernetes.io/kube-apiserver-client-kubelet`, an ECDSA P-256 key kept
//!   in `kubelet-client.key.tmp` until the certificate arrives); the pair goes
//!   to `<cert-dir>/kubelet-client-<date>.pem` behind the symlink
//!   `kubelet-client-current.pem`, and the kubeconfig is written to name it.
//!   With rotation the current certificate asks for its successor after
//!   70–90 % of its lifetime (the `selfnodeclient` approval).
//! * The serving certificate (`serverTLSBootstrap`): the same subject with
//!   the node's host name and IPs (signer `kubernetes.io/kubelet-serving`),
//!   `kubelet-server-*.pem`, always rotated.
//!
//! Map: [`rotation`] decides (pure); [`store`] keeps the pki files;
//! [`csr`] makes, submits and waits for CSRs; [`kubeconfig`] reads and
//! writes the kubeconfigs; [`current`] holds the certificate in use for
//! rustls (the API client's `ResolvesClientCert`, the secured port's
//! `ResolvesServerCert`); [`slot`] is one certificate's loop.
//!
//! Errors are retried by the loops with client-go's backoff (2 s doubling
//! to 32 s); only [`CertificateManager::new`]'s are fatal to a start.

pub mod csr;
pub mod current;
#[cfg(test)]
mod fake;
pub mod kubeconfig;
pub mod rotation;
pub mod slot;
pub mod store;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::metrics::CertificateMetrics;
use current::{Cell, ClientResolver, Issued, ServingResolver};
use rotation::{KubeconfigState, Rejections, Start, Template};
use slot::{Kind, Shared, Slot, WriteKubeconfig};
use store::Store;

/// A certificate that could not be had, naming the file or the CSR.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable certificate or key.
    #[error("{path}: {problem}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A kubeconfig cannot be used.
    #[error("kubeconfig {path}: {problem}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A key or request could not be made.
    #[error("making a key or certificate request: {0}")]
    Generate(String),
    /// The API server refused or failed a request about the CSR.
    #[error("CSR {csr}: {source}")]
    Api {
        /// The CSR.
        csr: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A CSR of the same name exists and was not made for this key.
    #[error("CSR {csr} exists and is not compatible: {problem}")]
    Incompatible {
        /// The CSR.
        csr: String,
        /// What differs.
        problem: String,
    },
    /// The CSR was denied.
    #[error("CSR {csr} is denied, reason: {reason}, message: {message}")]
    Denied {
        /// The CSR.
        csr: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The signer failed the CSR.
    #[error("CSR {csr} failed, reason: {reason}, message: {message}")]
    Failed {
        /// The CSR.
        csr: String,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The CSR was deleted (or replaced) while waited for.
    #[error("CSR {csr} was deleted")]
    Deleted {
        /// The CSR.
        csr: String,
    },
    /// The CSR was not issued in time.
    #[error("CSR {csr} was not issued within {after:?}")]
    Timeout {
        /// The CSR.
        csr: String,
        /// How long it was waited for.
        after: Duration,
    },
    /// What was issued cannot be used.
    #[error("CSR {csr}: the issued certificate cannot be used: {problem}")]
    Issued {
        /// The CSR.
        csr: String,
        /// Why.
        problem: String,
    },
    /// Nothing can ask for a certificate (no bootstrap credentials).
    #[error("no credentials to request a certificate with")]
    NoCredentials,
}

/// What the manager is asked to keep.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The node's name (`system:node:<name>`).
    pub node_name: String,
    /// `--cert-dir` (default `<root-dir>/pki`).
    pub cert_dir: PathBuf,
    /// `--kubeconfig`: read, and written after a bootstrap.
    pub kubeconfig: PathBuf,
    /// `--bootstrap-kubeconfig`.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `rotateCertificates` / `--rotate-certificates`.
    pub rotate_certificates: bool,
    /// `serverTLSBootstrap`: the node's host names and IPs for the serving
    /// certificate's SANs; None: the secured port keeps its own certificate.
    pub server_tls_bootstrap: Option<(Vec<String>, Vec<IpAddr>)>,
    /// `spec.expirationSeconds` of every CSR (client-go's
    /// `RequestedCertificateLifetime`); None, as upstream's kubelet asks.
    pub requested_duration: Option<Duration>,
    /// Where the manager reports.
    pub metrics: CertificateMetrics,
}

/// The clients CSRs are made with.
#[derive(Clone)]
pub struct Clients {
    /// The node's own client: renewals, and every serving-certificate CSR.
    pub node: kube::Client,
    /// The bootstrap kubeconfig's client (without rotation and without a
    /// bootstrap kubeconfig: the kubeconfig's own credentials); asks when
    /// there is no usable client certificate. None: nothing can.
    pub bootstrap: Option<kube::Client>,
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients")
            .field("bootstrap", &self.bootstrap.is_some())
            .finish_non_exhaustive()
    }
}

/// The node's certificates: the client one (when bootstrapped or rotated)
/// and the serving one (`serverTLSBootstrap`), each kept by its own loop in
/// [`CertificateManager::run`] and read by rustls on every handshake.
///
/// # Guarantees
/// A certificate is in use only once its file and symlink are written; a
/// restart with a valid certificate makes no CSR.
#[derive(Debug)]
pub struct CertificateManager {
    client: Option<Slot>,
    serving: Option<Slot>,
    /// Where the node client's server and CA come from.
    cluster: Option<kubeconfig::Kubeconfig>,
    metrics: CertificateMetrics,
    /// 401s answered to the current client certificate, with the
    /// generation they were counted for.
    rejections: std::sync::Mutex<(u64, Rejections)>,
    /// The API server refuses the client certificate.
    rejected: AtomicBool,
    /// Wakes the client loop when `rejected` is set.
    wake: tokio::sync::Notify,
    /// Bumped with every new certificate.
    changed: tokio::sync::watch::Sender<u64>,
}

/// A certificate from `pair` when it is valid at `now`.
fn usable(pair: Option<store::Pair>, now: SystemTime) -> Option<Issued> {
    let issued = match pair.map(Issued::from_pair) {
        Some(Ok(i)) => i,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "ignoring an unusable certificate");
            return None;
        }
        None => return None,
    };
    (!issued.facts.expired(now)).then_some(issued)
}

impl CertificateManager {
    /// Reads the stores and kubeconfigs and decides how the node starts
    /// ([`rotation::start`]); nothing is requested yet.
    ///
    /// # Errors
    /// [`Error`] naming the file: a store that cannot be read or recovered,
    /// a bootstrap kubeconfig that cannot be read, a kubeconfig that cannot
    /// be written.
    pub fn new(s: Settings) -> Result<Self, Error> {
        let now = SystemTime::now();
        let state = kubeconfig::state(&s.kubeconfig, now);
        let start = rotation::start(
            &state,
            s.bootstrap_kubeconfig.is_some(),
            s.rotate_certificates,
        );
        let mut cluster = None;
        let client = match start {
            Start::Plain => None,
            start => {
                let store = Store::new(&s.cert_dir, store::CLIENT);
                store.recover()?;
                let template = Template::client(&s.node_name);
                let stored = usable(store.current()?, now)
                    .filter(|i| start != Start::Bootstrap || template.satisfied_by(&i.facts));
                let own = match start {
                    Start::Reuse | Start::Rotate => kubeconfig::read(&s.kubeconfig).ok(),
                    _ => None,
                };
                let initial = match (stored, &own) {
                    (Some(i), _) => Some(i),
                    (None, Some(kc)) => usable(kubeconfig::identity(kc).ok().flatten(), now),
                    (None, None) => None,
                };
                let bootstrap = match &s.bootstrap_kubeconfig {
                    Some(b) => Some(kubeconfig::read(b)?),
                    None => None,
                };
                cluster = own.clone().or(bootstrap.clone());
                if let KubeconfigState::Unusable(why) = &state {
                    tracing::warn!(kubeconfig = %s.kubeconfig.display(), why, "the kubeconfig cannot be used as it is");
                }
                let write_kubeconfig = bootstrap.map(|b| WriteKubeconfig {
                    path: s.kubeconfig.clone(),
                    cluster: b,
                });
                if start == Start::Bootstrap
                    && let (Some(i), Some(w)) = (&initial, &write_kubeconfig)
                {
                    // The store's certificate is still good: no new CSR,
                    // only the kubeconfig that names it.
                    kubeconfig::write(&w.path, &w.cluster, &store.current_path())?;
                    tracing::info!(file = %i.path.display(), "reusing the stored client certificate");
                }
                tracing::info!(
                    start = ?start, kubeconfig = %s.kubeconfig.display(),
                    certificate = initial.as_ref().map(|i| i.path.display().to_string()).as_deref().unwrap_or("none yet"),
                    rotate = s.rotate_certificates,
                    "client certificate"
                );
                let cell = Arc::new(Cell::default());
                if let Some(i) = initial {
                    cell.set(i);
                }
                Some(Slot {
                    kind: Kind::Client,
                    store,
                    cell,
                    template: Some(template),
                    rotate: s.rotate_certificates,
                    requested_duration: s.requested_duration,
                    write_kubeconfig,
                })
            }
        };
        let serving = match &s.server_tls_bootstrap {
            None => None,
            Some((hostnames, ips)) => {
                let store = Store::new(&s.cert_dir, store::SERVER);
                store.recover()?;
                let cell = Arc::new(Cell::default());
                if let Some(i) = usable(store.current()?, now) {
                    cell.set(i);
                }
                Some(Slot {
                    kind: Kind::Serving,
                    store,
                    cell,
                    template: Template::serving(&s.node_name, hostnames, ips),
                    rotate: true,
                    requested_duration: s.requested_duration,
                    write_kubeconfig: None,
                })
            }
        };
        for slot in client.iter().chain(&serving) {
            slot.report_expiry(&s.metrics);
        }
        Ok(Self {
            client,
            serving,
            cluster,
            metrics: s.metrics,
            rejections: std::sync::Mutex::default(),
            rejected: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            changed: tokio::sync::watch::channel(0).0,
        })
    }

    /// Does it keep the client certificate? (False: the kubeconfig's own
    /// credentials are used as they are.)
    pub fn manages_client(&self) -> bool {
        self.client.is_some()
    }

    /// The kubeconfig whose server and CA the node's client uses: the
    /// `--kubeconfig` when it is usable, else the bootstrap kubeconfig.
    pub fn cluster(&self) -> Option<&kubeconfig::Kubeconfig> {
        self.cluster.as_ref()
    }

    /// The API client's certificate resolver; None when the client
    /// certificate is not managed.
    pub fn client_resolver(&self) -> Option<Arc<dyn rustls::client::ResolvesClientCert>> {
        self.client
            .as_ref()
            .map(|s| Arc::new(ClientResolver(Arc::clone(&s.cell))) as _)
    }

    /// Counts the client certificate's changes (the API client retires
    /// connections made before one, as upstream closes them).
    pub fn client_generation(&self) -> Option<Arc<std::sync::atomic::AtomicU64>> {
        self.client.as_ref().map(|s| s.cell.generation())
    }

    /// The secured port's certificate resolver (`serverTLSBootstrap`).
    pub fn server_resolver(&self) -> Option<Arc<dyn rustls::server::ResolvesServerCert>> {
        self.serving
            .as_ref()
            .map(|s| Arc::new(ServingResolver(Arc::clone(&s.cell))) as _)
    }

    /// The metrics it reports to.
    pub fn metrics(&self) -> &CertificateMetrics {
        &self.metrics
    }

    /// The client certificate in use: its file and expiry.
    pub fn client_certificate(&self) -> Option<(PathBuf, SystemTime)> {
        let c = self.client.as_ref()?.cell.get()?;
        Some((c.path.clone(), c.facts.not_after))
    }

    /// The serving certificate in use: its file and expiry.
    pub fn serving_certificate(&self) -> Option<(PathBuf, SystemTime)> {
        let c = self.serving.as_ref()?.cell.get()?;
        Some((c.path.clone(), c.facts.not_after))
    }

    /// Records the status of an answer to a request made with the client
    /// certificate: lasting 401s ([`Rejections`]) mean the API server no
    /// longer takes it, and the client loop goes back to bootstrap.
    pub fn observe_status(&self, status: u16) {
        let Some(slot) = &self.client else { return };
        let Some(current) = slot.cell.get() else {
            return;
        };
        if current.facts.expired(SystemTime::now()) {
            return;
        }
        let generation = slot.cell.generation().load(Ordering::SeqCst);
        let rejected = {
            let mut r = crate::lock::lock(&self.rejections);
            if r.0 != generation {
                *r = (generation, Rejections::default());
            }
            r.1.observe(status == 401, std::time::Instant::now())
        };
        if rejected && !self.rejected.swap(true, Ordering::SeqCst) {
            tracing::error!(
                certificate = %current.path.display(),
                "the API server answers 401 Unauthorized to the client certificate: it was \
                 revoked, or the cluster's CA changed"
            );
            self.wake.notify_one();
        }
    }

    /// Waits until a client certificate is in use (the blocking bootstrap
    /// without rotation, as upstream's `LoadClientCert`); at once when the
    /// client certificate is not managed.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn client_ready(&self) {
        let Some(slot) = &self.client else { return };
        let mut changed = self.changed.subscribe();
        let _ = changed.wait_for(|_| slot.cell.get().is_some()).await;
    }

    /// Keeps the certificates until `shutdown`: one loop each.
    pub async fn run(self: Arc<Self>, clients: Clients, shutdown: CancellationToken) {
        let shared = || Shared {
            clients: &clients,
            metrics: &self.metrics,
            rejected: &self.rejected,
            wake: &self.wake,
            changed: &self.changed,
        };
        let client = async {
            if let Some(s) = &self.client {
                s.run(shared(), shutdown.clone()).await;
            }
        };
        let serving = async {
            if let Some(s) = &self.serving {
                // The node's client asks for it: not before it has a
                // certificate (anonymous CSRs are refused).
                tokio::select! {
                    () = self.client_ready() => {}
                    () = shutdown.cancelled() => return,
                }
                s.run(shared(), shutdown.clone()).await;
            }
        };
        tokio::join!(client, serving);
    }
}

/// `--cert-dir`'s default: `<root-dir>/pki` (upstream's `/var/lib/kubelet/pki`).
pub fn default_cert_dir(root_dir: &Path) -> PathBuf {
    root_dir.join("pki")
}
