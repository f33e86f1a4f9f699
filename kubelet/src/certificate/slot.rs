//! One certificate's loop (the client's or the serving one's), an explicit
//! state machine: [`State::Decide`] asks [`rotation::next`] what to do;
//! [`State::Wait`] sleeps until the rotation deadline (or the expiry), woken
//! early when the API server starts refusing the client certificate;
//! [`State::Request`] asks for a certificate (CSR, wait, store, swap);
//! [`State::Backoff`] waits after a failure (client-go's 2 s doubling to
//! 32 s); [`State::Stuck`] says, once, that nothing can ask for one.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::current::{Cell, Issued};
use super::rotation::{self, Fallback, Next, Reason, Request, Situation, Template};
use super::store::{self, Store};
use super::{Clients, Error, csr, kubeconfig};
use crate::backoff::Retry;
use crate::metrics::CertificateMetrics;

/// Which certificate a slot keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The API client's (`kubelet-client`).
    Client,
    /// The secured port's (`kubelet-server`, `serverTLSBootstrap`).
    Serving,
}

impl Kind {
    fn signer(self) -> &'static str {
        match self {
            Kind::Client => csr::CLIENT_SIGNER,
            Kind::Serving => csr::SERVING_SIGNER,
        }
    }

    fn usages(self) -> &'static [&'static str] {
        match self {
            Kind::Client => csr::CLIENT_USAGES,
            Kind::Serving => csr::SERVING_USAGES,
        }
    }

    /// `client` or `serving`, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Client => "client",
            Kind::Serving => "serving",
        }
    }
}

/// Where the node's kubeconfig goes once a bootstrap succeeds.
#[derive(Debug, Clone)]
pub struct WriteKubeconfig {
    /// `--kubeconfig`.
    pub path: std::path::PathBuf,
    /// The cluster it names (the bootstrap kubeconfig's server and CA).
    pub cluster: kubeconfig::Kubeconfig,
}

/// One certificate: its files, the cell rustls reads, what it asks for.
#[derive(Debug)]
pub struct Slot {
    /// Which certificate.
    pub kind: Kind,
    /// Its files.
    pub store: Store,
    /// The certificate in use.
    pub cell: Arc<Cell>,
    /// What is asked for; None: nothing can be (no node IP).
    pub template: Option<Template>,
    /// Rotate before expiry.
    pub rotate: bool,
    /// `spec.expirationSeconds` of its CSRs (None, as upstream's kubelet).
    pub requested_duration: Option<Duration>,
    /// A bootstrap writes the node's kubeconfig here (`--bootstrap-kubeconfig`).
    pub write_kubeconfig: Option<WriteKubeconfig>,
}

/// The loop's states.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum State {
    /// Decide what to do.
    Decide,
    /// Nothing until then.
    Wait(SystemTime),
    /// Ask now.
    Request(Request, Reason),
    /// After a failure.
    Backoff(Duration),
    /// Nothing can ask.
    Stuck(Reason),
}

/// The longest single sleep: the wall clock is read again after it (a
/// suspended machine, a clock step).
const MAX_SLEEP: Duration = Duration::from_secs(600);
/// How often a stuck slot looks again.
const STUCK_RETRY: Duration = Duration::from_secs(60);

/// What the loop shares with the manager.
#[derive(Debug)]
pub struct Shared<'a> {
    /// The clients CSRs are made with.
    pub clients: &'a Clients,
    /// The metrics the slot reports to.
    pub metrics: &'a CertificateMetrics,
    /// The API server refuses the client certificate (401s).
    pub rejected: &'a std::sync::atomic::AtomicBool,
    /// Woken when `rejected` is set.
    pub wake: &'a tokio::sync::Notify,
    /// Told about each new certificate.
    pub changed: &'a tokio::sync::watch::Sender<u64>,
}

impl Slot {
    fn fallback(&self, shared: &Shared<'_>) -> Fallback {
        match self.kind {
            Kind::Serving => Fallback::NodeClient,
            Kind::Client if shared.clients.bootstrap.is_some() => Fallback::Bootstrap,
            Kind::Client => Fallback::Nobody,
        }
    }

    /// Sets the expiry the TTL gauge shows.
    pub fn report_expiry(&self, metrics: &CertificateMetrics) {
        let at = self.cell.get().map(|c| c.facts.not_after);
        match self.kind {
            Kind::Client => metrics.set_client_expiry(at),
            Kind::Serving => metrics.set_server_expiry(at),
        }
    }

    /// Runs until `shutdown`. Never panics out: every failure is logged,
    /// counted and retried.
    pub async fn run(&self, shared: Shared<'_>, shutdown: CancellationToken) {
        let mut state = State::Decide;
        let mut retry =
            Retry::new(Duration::from_secs(2), Duration::from_secs(32)).jitter(1.0, 1.1);
        let mut jitter = (u64::MAX, 0.0);
        let mut last = None;
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            state = match state {
                State::Decide => {
                    let generation = self
                        .cell
                        .generation()
                        .load(std::sync::atomic::Ordering::SeqCst);
                    if jitter.0 != generation {
                        // One place in the 70–90 % window per certificate.
                        jitter = (generation, fastrand::f64());
                    }
                    let current = self.cell.get();
                    let next = rotation::next(&Situation {
                        current: current.as_ref().map(|c| &c.facts),
                        template: self.template.as_ref(),
                        now: SystemTime::now(),
                        rotate: self.rotate,
                        rejected: self.kind == Kind::Client
                            && shared.rejected.load(std::sync::atomic::Ordering::SeqCst),
                        fallback: self.fallback(&shared),
                        jitter: jitter.1,
                    });
                    if last != Some(next) {
                        self.say(next, current.as_deref());
                        last = Some(next);
                    }
                    match next {
                        Next::Request(r, why) => State::Request(r, why),
                        Next::WaitUntil(t) => State::Wait(t),
                        Next::Stuck(why) => State::Stuck(why),
                    }
                }
                State::Wait(until) => {
                    let left = until
                        .duration_since(SystemTime::now())
                        .unwrap_or_default()
                        .min(MAX_SLEEP);
                    self.pause(left, &shared, &shutdown).await;
                    State::Decide
                }
                State::Stuck(_) => {
                    self.pause(STUCK_RETRY, &shared, &shutdown).await;
                    State::Decide
                }
                State::Backoff(d) => {
                    self.pause(d, &shared, &shutdown).await;
                    State::Decide
                }
                State::Request(request, why) => {
                    let attempt = tokio::select! {
                        () = shutdown.cancelled() => return,
                        r = self.request(request, &shared) => r,
                    };
                    match attempt {
                        Ok(()) => {
                            retry.reset();
                            last = None;
                            State::Decide
                        }
                        Err(e) => {
                            match self.kind {
                                Kind::Client => shared.metrics.client_renew_errors.inc(),
                                Kind::Serving => shared.metrics.server_renew_errors.inc(),
                            }
                            let delay = retry.next_delay();
                            tracing::warn!(
                                certificate = self.kind.as_str(), error = %e, why = why.as_str(),
                                retry_in = ?delay, "could not get a new certificate"
                            );
                            State::Backoff(delay)
                        }
                    }
                }
            };
        }
    }

    /// Sleeps `d`, woken early by a rejection of the client certificate.
    async fn pause(&self, d: Duration, shared: &Shared<'_>, shutdown: &CancellationToken) {
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = tokio::time::sleep(d) => {}
            () = shared.wake.notified(), if self.kind == Kind::Client => {}
        }
    }

    /// Says what the loop decided, once per decision.
    fn say(&self, next: Next, current: Option<&Issued>) {
        let kind = self.kind.as_str();
        let expired_at = current.map(|c| kubeconfig::humantime(c.facts.not_after));
        match next {
            Next::WaitUntil(t) if self.rotate => tracing::info!(
                certificate = kind,
                expires = expired_at.as_deref().unwrap_or("-"),
                rotation_deadline = %kubeconfig::humantime(t),
                "certificate in use; renewed at the rotation deadline (70–90 % of its lifetime)"
            ),
            Next::WaitUntil(_) => tracing::info!(
                certificate = kind,
                expires = expired_at.as_deref().unwrap_or("-"),
                "certificate in use; not rotated (rotateCertificates is off): replaced through \
                 bootstrap when it expires"
            ),
            Next::Request(Request::Bootstrap, Reason::Expired) => tracing::error!(
                certificate = kind,
                expired = expired_at.as_deref().unwrap_or("-"),
                "the client certificate expired; going back to bootstrap with --bootstrap-kubeconfig"
            ),
            Next::Request(Request::Bootstrap, Reason::Rejected) => tracing::error!(
                certificate = kind,
                "the API server refuses the client certificate (401 Unauthorized); going back to \
                 bootstrap with --bootstrap-kubeconfig"
            ),
            Next::Request(r, why) => tracing::info!(
                certificate = kind, request = ?r, why = why.as_str(),
                "requesting a certificate"
            ),
            Next::Stuck(Reason::Missing) if self.template.is_none() => tracing::error!(
                certificate = kind,
                "no node IP to request a serving certificate for (serverTLSBootstrap): set --node-ip"
            ),
            Next::Stuck(why) => tracing::error!(
                certificate = kind,
                why = why.as_str(),
                expired = expired_at.as_deref().unwrap_or("-"),
                "no usable client certificate and no --bootstrap-kubeconfig to request one with: \
                 API requests fail until the kubeconfig's certificate is replaced"
            ),
        }
    }

    /// One request: a CSR for a key, waited for, stored and put in use.
    async fn request(&self, request: Request, shared: &Shared<'_>) -> Result<(), Error> {
        let Some(template) = &self.template else {
            return Err(Error::NoCredentials);
        };
        let (client, key, name, bound) = match request {
            Request::Bootstrap => {
                let client = shared
                    .clients
                    .bootstrap
                    .as_ref()
                    .ok_or(Error::NoCredentials)?;
                let key = self.store.tmp_key()?;
                let name = csr::digested_name(&key.public_key_der(), template, self.kind.usages());
                (client, key, Some(name), csr::BOOTSTRAP_WAIT)
            }
            Request::Renew => (
                &shared.clients.node,
                store::new_key()?,
                None,
                csr::RENEW_WAIT,
            ),
        };
        let pem = csr::request_pem(template, &key)?;
        let object = csr::object(
            name.as_deref(),
            &pem,
            self.kind.signer(),
            self.kind.usages(),
            self.requested_duration,
        );
        let (name, uid) = csr::submit(client, &object).await?;
        tracing::info!(certificate = self.kind.as_str(), csr = %name, signer = self.kind.signer(), "CSR created");
        let chain = match csr::wait(client, &name, &uid, bound).await {
            Ok(chain) => chain,
            Err(e @ (Error::Denied { .. } | Error::Failed { .. })) => {
                // A denial is final for that CSR, and the bootstrap CSR's
                // name follows its key: the next try asks with a new key,
                // so a new CSR an operator can approve.
                if request == Request::Bootstrap {
                    self.store.remove_tmp_key();
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let cert_pem = String::from_utf8(chain).map_err(|_| Error::Issued {
            csr: name.clone(),
            problem: "the certificate is not PEM text".into(),
        })?;
        let key_pem = key.serialize_pem();
        let file = self
            .store
            .update(&cert_pem, &key_pem, SystemTime::now())
            .map_err(|e| Error::Issued {
                csr: name.clone(),
                problem: e.to_string(),
            })?;
        let pair = store::parse_pair(cert_pem.as_bytes(), key_pem.as_bytes(), &file)?;
        let issued = Issued::from_pair(pair)?;
        let valid_until = kubeconfig::humantime(issued.facts.not_after);
        if request == Request::Bootstrap {
            self.store.remove_tmp_key();
            if let Some(w) = &self.write_kubeconfig {
                kubeconfig::write(&w.path, &w.cluster, &self.store.current_path())?;
                tracing::info!(kubeconfig = %w.path.display(), "wrote the node's kubeconfig");
            }
        }
        let now = SystemTime::now();
        if let Some(old) = self.cell.set(issued)
            && self.kind == Kind::Serving
        {
            let age = now.duration_since(old.facts.not_before).unwrap_or_default();
            shared.metrics.server_rotation.observe(age.as_secs_f64());
        }
        if self.kind == Kind::Client {
            shared
                .rejected
                .store(false, std::sync::atomic::Ordering::SeqCst);
        }
        self.report_expiry(shared.metrics);
        shared.changed.send_modify(|n| *n += 1);
        tracing::info!(
            certificate = self.kind.as_str(), csr = %name, file = %file.display(),
            valid_until = %valid_until, "new certificate in use"
        );
        Ok(())
    }
}
