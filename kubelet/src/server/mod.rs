//! The kubelet API, on up to four endpoints ([`routes`] says which routes
//! each serves, after upstream's `pkg/kubelet/server/server.go`):
//! * the read-only port (upstream's `readOnlyPort` on `address`; plain HTTP,
//!   no authentication; 0 turns it off): `/healthz`, `/pods`, `/metrics`,
//!   `/metrics/probes`, `/metrics/resource`, `/stats/summary`, and upstream's
//!   "Debug endpoints are disabled." on the operator paths and `/debug/`;
//! * the secured port ([`secure`]: TLS, [`auth`]): all of that and evlet's
//!   diagnostics (`/pods/{namespace}/{name}`, `/events`, `/debug/*`, as
//!   `nodes/proxy`), container logs ([`logs`]), exec, attach and
//!   port-forward ([`streaming`]), `/run` and `/configz`;
//! * upstream's healthz server (`healthzBindAddress`:`healthzPort`): `ok`;
//! * the node-local socket ([`local`], root only): the read-only routes and
//!   the diagnostics, what `evlet diag` reads on the node.
//!
//! Every endpoint serves its connections under [`Limits`] ([`connection`]).

pub mod auth;
pub mod auth_cache;
pub(crate) mod connection;
pub mod debug;
pub mod limits;
pub mod local;
pub mod logs;
pub mod routes;
pub mod secure;
pub mod streaming;
pub mod tls;

pub use limits::{Gate, Limits};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::health::{Checks, NotReady};
use crate::metrics::Metrics;
use crate::pleg::Health;
use crate::workers::PodWorkers;

/// What the endpoint serves.
#[derive(Debug)]
pub struct Served {
    /// Pod views.
    pub workers: PodWorkers,
    /// PLEG health.
    pub health: Arc<Health>,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// The active PLEG mode.
    pub mode: std::sync::Mutex<String>,
    /// Every pod source has reported.
    pub sources_ready: AtomicBool,
    /// OOM records and events.
    pub diagnostics: Arc<crate::diagnostics::Diagnostics>,
    /// Extra health checks (the runtime), by name.
    pub checks: Arc<Checks>,
    /// The runtime (logs, exec, attach, port-forward).
    pub runtime: evlet_cri::RuntimeClient,
    /// The pod cache (a pod's sandbox for port-forward).
    pub cache: crate::cache::PodCache,
    /// The effective configuration, as `/configz` shows it.
    pub configz: serde_json::Value,
    /// Resource usage (`/stats/summary`, `/metrics/resource`).
    pub stats: Arc<crate::stats::StatsProvider>,
    /// The pods' volumes (`kubelet_volume_stats_*`).
    pub volumes: crate::volume::VolumeManager,
    /// What the eviction manager did (`/debug/eviction`).
    pub eviction: Arc<crate::eviction::journal::Journal>,
}

impl Served {
    /// Is the node ready (PLEG healthy, every extra check passing)?
    ///
    /// # Errors
    /// [`NotReady`] naming the failing check, in upstream's words.
    pub fn ready(&self) -> Result<(), NotReady> {
        self.health.check().map_err(|problem| NotReady {
            check: "PLEG",
            problem,
        })?;
        self.checks.ready()
    }
}

/// Binds `address`, returning the listener and the address it got (port 0
/// picks a free one).
///
/// # Errors
/// The address cannot be bound (names it).
pub async fn bind(
    address: SocketAddr,
) -> Result<(tokio::net::TcpListener, SocketAddr), std::io::Error> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// Serves `router` as plain HTTP on `listener` under `gate`'s limits until
/// `shutdown`: the read-only port ([`routes::read_only`]) and the healthz
/// port ([`routes::healthz_port`]).
pub fn serve_plain(
    listener: tokio::net::TcpListener,
    router: Router,
    gate: Arc<Gate>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let serving = connection::Serving {
        router,
        limits: *gate.limits(),
        shown: connection::Shown::FirstRequest,
        shutdown: shutdown.clone(),
    };
    connection::accept_loop(listener, gate, shutdown, move |tcp, slot| {
        connection::serve(tcp, slot, serving.clone(), axum::http::Extensions::new())
    })
}

/// Binds the read-only port at `address` and serves it until `shutdown`;
/// returns the bound address.
///
/// # Errors
/// If the address cannot be bound (names it).
pub async fn serve(
    address: SocketAddr,
    served: Arc<Served>,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<SocketAddr, std::io::Error> {
    let (listener, address) = bind(address).await?;
    tracing::info!(%address, "serving the read-only port (/healthz, /pods, /metrics, /stats)");
    serve_plain(
        listener,
        routes::read_only(served),
        Gate::new(limits),
        shutdown,
    );
    Ok(address)
}

/// Binds upstream's healthz port at `address` and serves it until
/// `shutdown`; returns the bound address.
///
/// # Errors
/// If the address cannot be bound (names it).
pub async fn serve_healthz(
    address: SocketAddr,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<SocketAddr, std::io::Error> {
    let (listener, address) = bind(address).await?;
    tracing::info!(%address, "serving /healthz (healthzPort)");
    serve_plain(
        listener,
        routes::healthz_port(),
        Gate::new(limits),
        shutdown,
    );
    Ok(address)
}
