//! The kubelet API. The read-only port (plain HTTP, no authentication, as
//! upstream's `readOnlyPort`): `/healthz`, `/pods` (a `v1.PodList` with
//! statuses), `/metrics` (Prometheus text; the prober's on `/metrics/probes`),
//! `/events` (pod events, e.g. OOM kills with the kernel's record),
//! `/debug/oom` (the kernel's OOM records), `/debug/pleg`, `/debug/eviction` and
//! `/debug/pods/{namespace}/{name}/timeline` (`debug`, what `evlet diag`
//! reads); the operator endpoints answer
//! there that debug endpoints are disabled. The secured port (`secure`: TLS,
//! `auth`) serves all of that and container logs (`logs`), exec, attach and
//! port-forward (`streaming`).

pub mod auth;
pub mod debug;
pub mod logs;
pub mod secure;
pub mod streaming;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::Pod;
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

async fn healthz(State(s): State<Arc<Served>>) -> Response {
    let mut lines = Vec::new();
    let mut ok = true;
    let mode = s.mode.lock().map(|m| m.clone()).unwrap_or_default();
    match s.health.check() {
        Ok(()) => lines.push(format!("[+]pleg ok (mode {mode})")),
        Err(e) => {
            ok = false;
            lines.push(format!(
                "[-]pleg failed: PLEG is not healthy: {e} (mode {mode})"
            ));
        }
    }
    for (name, check) in s.checks.results() {
        match check {
            Ok(()) => lines.push(format!("[+]{name} ok")),
            Err(e) => {
                ok = false;
                lines.push(format!("[-]{name} failed: {e}"));
            }
        }
    }
    let sources = if s.sources_ready.load(Ordering::Relaxed) {
        "[+]sources ok"
    } else {
        "[+]sources waiting for first snapshot"
    };
    lines.push(sources.into());
    lines.push(if ok {
        "healthz check passed".into()
    } else {
        "healthz check failed".into()
    });
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    (code, lines.join("\n") + "\n").into_response()
}

async fn pods(State(s): State<Arc<Served>>) -> Response {
    let items: Vec<Pod> = s
        .workers
        .views()
        .into_iter()
        .map(|v| {
            let mut pod = Arc::unwrap_or_clone(v.pod);
            pod.status = Some(v.status);
            pod
        })
        .collect();
    let body = serde_json::json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items });
    axum::Json(body).into_response()
}

/// One pod as a `v1.Pod` with its status, or 404.
async fn pod(
    State(s): State<Arc<Served>>,
    axum::extract::Path((namespace, name)): axum::extract::Path<(String, String)>,
) -> Response {
    match s.workers.find(&namespace, &name) {
        Some(v) => {
            let mut pod = Arc::unwrap_or_clone(v.pod);
            pod.status = Some(v.status);
            axum::Json(pod).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{name} not found\n"),
        )
            .into_response(),
    }
}

async fn events(State(s): State<Arc<Served>>) -> Response {
    axum::Json(s.diagnostics.events()).into_response()
}

async fn ooms(State(s): State<Arc<Served>>) -> Response {
    axum::Json(s.diagnostics.ooms()).into_response()
}

async fn metrics(State(s): State<Arc<Served>>) -> Response {
    let claims = s.volumes.mounted_claims();
    if let Ok(samples) =
        tokio::task::spawn_blocking(move || crate::stats::claim_stats(&claims)).await
    {
        s.metrics.volume_stats.set(&samples);
    }
    (
        [("content-type", crate::metrics::CONTENT_TYPE)],
        s.metrics.encode(),
    )
        .into_response()
}

/// The prober's metrics, apart from `/metrics` as upstream serves them.
async fn probe_metrics(State(s): State<Arc<Served>>) -> Response {
    (
        [("content-type", crate::metrics::CONTENT_TYPE)],
        s.metrics.probes.encode(),
    )
        .into_response()
}

/// `/stats/summary` (GET or POST; `?only_cpu_and_memory=true` for just those).
async fn stats_summary(
    State(s): State<Arc<Served>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let only = query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .any(|kv| kv == "only_cpu_and_memory=true");
    let views = s.workers.views();
    match s.stats.summary(&views, only).await {
        Ok(summary) => axum::Json(summary).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Error: {e}"),
        )
            .into_response(),
    }
}

/// `/metrics/resource`: what metrics-server scrapes.
async fn resource_metrics(State(s): State<Arc<Served>>) -> Response {
    let views = s.workers.views();
    match s.stats.summary(&views, true).await {
        Ok(summary) => (
            [("content-type", "text/plain; version=0.0.4")],
            crate::stats::resource_metrics(&summary),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Error: {e}"),
        )
            .into_response(),
    }
}

/// What the read-only port answers where the secured port has operator
/// endpoints (upstream's wording).
async fn debugging_disabled() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        "Debug endpoints are disabled.\n",
    )
        .into_response()
}

/// The read-only port's router: the routes both ports serve, and the
/// operator paths refused.
pub fn read_only_router(served: Arc<Served>) -> Router {
    let mut r = router(served);
    for prefix in [
        "run",
        "exec",
        "attach",
        "portForward",
        "containerLogs",
        "runningpods",
        "logs",
    ] {
        r = r.route(
            &format!("/{prefix}/{{*rest}}"),
            axum::routing::any(debugging_disabled),
        );
    }
    r
}

/// The routes both ports serve.
pub fn router(served: Arc<Served>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .route("/pods/{namespace}/{name}", get(pod))
        .route("/metrics", get(metrics))
        .route("/metrics/probes", get(probe_metrics))
        .route("/metrics/resource", get(resource_metrics))
        .route("/stats/summary", get(stats_summary).post(stats_summary))
        .route("/events", get(events))
        .route("/debug/oom", get(ooms))
        .route("/debug/pleg", get(debug::pleg))
        .route("/debug/eviction", get(debug::eviction))
        .route(
            "/debug/pods/{namespace}/{name}/timeline",
            get(debug::timeline),
        )
        .with_state(served)
}

/// Binds `address` and serves until `shutdown`; returns the bound address.
///
/// # Errors
/// If the address cannot be bound (names it).
pub async fn serve(
    address: SocketAddr,
    served: Arc<Served>,
    shutdown: CancellationToken,
) -> Result<SocketAddr, std::io::Error> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))?;
    let address = listener.local_addr()?;
    tracing::info!(%address, "serving /healthz, /pods, /metrics");
    tokio::spawn(async move {
        let result = axum::serve(listener, read_only_router(served))
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = result {
            tracing::error!(%e, "HTTP server failed");
        }
    });
    Ok(address)
}
