//! The routes of the kubelet API's ports, as upstream's `server.go` installs
//! them: [`common`] are upstream's `InstallAuthNotRequiredHandlers` (served
//! by the read-only port, and behind authentication by the secured one);
//! [`read_only`] adds upstream's `InstallDebuggingDisabledHandlers`;
//! [`diagnostics`] are evlet's own views (`/pods/{namespace}/{name}`,
//! `/events`, `/debug/*`), served only where a client is authorized (the
//! secured port, as `nodes/proxy`) or on the node itself (the local socket);
//! [`healthz`] is upstream's healthz server (`healthzPort`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::Pod;

use super::{Served, debug};

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
/// endpoints (upstream's wording and status).
async fn debugging_disabled() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        "Debug endpoints are disabled.\n",
    )
        .into_response()
}

/// The read-only port's router: upstream's routes without authentication,
/// and its operator paths (and evlet's `/debug/*`) refused.
pub fn read_only(served: Arc<Served>) -> Router {
    let mut r = common(served);
    // Upstream's `InstallDebuggingDisabledHandlers` paths; `/debug/` covers
    // upstream's `/debug/pprof/` and evlet's diagnostics, which carry probe
    // output and are served only where a client is authorized.
    for prefix in [
        "run",
        "exec",
        "attach",
        "portForward",
        "containerLogs",
        "runningpods",
        "logs",
        "debug",
    ] {
        r = r
            .route(
                &format!("/{prefix}"),
                axum::routing::any(debugging_disabled),
            )
            .route(
                &format!("/{prefix}/{{*rest}}"),
                axum::routing::any(debugging_disabled),
            );
    }
    r
}

/// Upstream's routes that need no authorization of their own (its
/// `InstallAuthNotRequiredHandlers`): health, the pod list, stats and metrics.
pub fn common(served: Arc<Served>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .route("/metrics", get(metrics))
        .route("/metrics/probes", get(probe_metrics))
        .route("/metrics/resource", get(resource_metrics))
        .route("/stats/summary", get(stats_summary).post(stats_summary))
        .with_state(served)
}

/// evlet's own views: one pod with its status, the events it recorded, and
/// the diagnostics `evlet diag` reads.
pub fn diagnostics(served: Arc<Served>) -> Router {
    Router::new()
        .route("/pods/{namespace}/{name}", get(pod))
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

/// Upstream's healthz server (`healthzBindAddress`:`healthzPort`): its
/// handler with no checks but `ping`, so `ok` while the agent runs
/// (`cmd/kubelet/app/server.go`, `healthz.InstallHandler(mux)`).
pub fn healthz_port() -> Router {
    async fn ok() -> &'static str {
        "ok"
    }
    Router::new()
        .route("/healthz", get(ok))
        .route("/healthz/ping", get(ok))
}
