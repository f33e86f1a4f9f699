//! The secured port (upstream's 10250): TLS, every request authenticated and
//! authorized before its handler runs, and the endpoints operators reach
//! through the API server: upstream's read-only routes, evlet's diagnostics
//! (`/pods/{namespace}/{name}`, `/events`, `/debug/*`: `nodes/proxy`), plus
//! container logs, exec, attach, port-forward, `/run` and `/configz`. Its
//! connections are served under the port's [`Limits`](super::Limits); one is
//! established (no longer closed for a newer one) when a request on it is
//! authenticated.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use axum::routing::{any, get, post};
use evlet_cri::ContainerId;
use tokio_util::sync::CancellationToken;

use super::auth::{Auth, User};
use super::connection::{self, Serving, Shown};
use super::limits::{Gate, Slot};
use super::{Served, logs, routes, streaming};
use crate::workers::PodView;

/// The verified client certificate's user of a connection, if any.
#[derive(Debug, Clone)]
struct PeerUser(Option<User>);

#[derive(Debug, Clone)]
struct Secure {
    served: Arc<Served>,
}

async fn authenticate(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    let cert = req.extensions().get::<PeerUser>().and_then(|p| p.0.clone());
    let path = req.uri().path().to_owned();
    let method = req.method().as_str().to_owned();
    match auth
        .check(cert.as_ref(), req.headers(), &method, &path)
        .await
    {
        Ok(user) => {
            tracing::debug!(user = %user.name, %method, %path, "kubelet API request");
            if let Some(slot) = req.extensions().get::<Slot>() {
                slot.established();
            }
            next.run(req).await
        }
        Err(refused) => (refused.status(), refused.to_string()).into_response(),
    }
}

fn not_found(message: String) -> Response {
    (StatusCode::NOT_FOUND, message).into_response()
}

fn find(s: &Served, namespace: &str, pod: &str) -> Option<PodView> {
    s.workers.find(namespace, pod)
}

fn in_spec(view: &PodView, container: &str) -> bool {
    view.pod.spec.as_ref().is_some_and(|spec| {
        spec.containers.iter().any(|c| c.name == container)
            || spec
                .init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
    })
}

async fn container_logs(
    State(s): State<Secure>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let request = match logs::parse_query(query.as_deref().unwrap_or("")) {
        Ok(r) => r,
        Err(answer) => return answer.into_response(),
    };
    let Some(view) = find(&s.served, &namespace, &pod) else {
        return not_found(format!("pod {pod:?} does not exist"));
    };
    if !in_spec(&view, &container) {
        return not_found(format!("container {container:?} not found in pod {pod:?}"));
    }
    match logs::container_id(&view.status, &pod, &container, request.previous) {
        Ok(id) => logs::stream(s.served.runtime.clone(), id, request).await,
        Err(message) => (StatusCode::BAD_REQUEST, message).into_response(),
    }
}

/// The path of exec and attach: the container, and the pod's UID when given.
fn exec_target(parts: &[String]) -> Option<(&str, &str, Option<&str>, &str)> {
    match parts {
        [ns, pod, container] => Some((ns, pod, None, container)),
        [ns, pod, uid, container] => Some((ns, pod, Some(uid), container)),
        _ => None,
    }
}

/// The running instance of `container` (its runtime ID).
fn running_container(view: &PodView, container: &str) -> Option<ContainerId> {
    view.status
        .container_statuses
        .iter()
        .flatten()
        .chain(view.status.init_container_statuses.iter().flatten())
        .find(|c| c.name == container)
        .filter(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
        .and_then(|c| c.container_id.as_deref())
        .map(|id| ContainerId::new(id.split_once("://").map_or(id, |(_, i)| i)))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Remote {
    Exec,
    Attach,
}

async fn remote(
    s: Secure,
    kind: Remote,
    path: String,
    query: Option<String>,
    req: Request,
) -> Response {
    let parts: Vec<String> = path.split('/').map(str::to_owned).collect();
    let Some((namespace, pod, uid, container)) = exec_target(&parts) else {
        return not_found("404 page not found".into());
    };
    let (options, command) = match streaming::parse_query(query.as_deref().unwrap_or("")) {
        Ok(o) => o,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let Some(view) = find(&s.served, namespace, pod) else {
        return not_found("pod does not exist".into());
    };
    if uid.is_some_and(|u| Some(u) != view.pod.metadata.uid.as_deref()) {
        return not_found("pod not found".into());
    }
    let Some(id) = running_container(&view, container) else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("container not found ({container:?})"),
        )
            .into_response();
    };
    if !streaming::is_upgrade(&req) {
        return streaming::upgrade_required();
    }
    let url = match kind {
        Remote::Exec => {
            s.served
                .runtime
                .exec(evlet_cri::api::ExecRequest {
                    container_id: id.to_string(),
                    cmd: command,
                    tty: options.tty,
                    stdin: options.stdin,
                    stdout: options.stdout,
                    stderr: options.stderr,
                })
                .await
        }
        Remote::Attach => {
            // Attach uses the container's own TTY setting (upstream).
            let tty = view
                .pod
                .spec
                .as_ref()
                .and_then(|spec| {
                    spec.containers
                        .iter()
                        .chain(spec.init_containers.iter().flatten())
                        .find(|c| c.name == container)
                })
                .and_then(|c| c.tty)
                .unwrap_or(false);
            s.served
                .runtime
                .attach(evlet_cri::api::AttachRequest {
                    container_id: id.to_string(),
                    stdin: options.stdin,
                    tty,
                    stdout: options.stdout,
                    stderr: options.stderr && !tty,
                })
                .await
        }
    };
    match url {
        Ok(url) => streaming::proxy(req, &url).await,
        Err(e) => runtime_error(&e),
    }
}

/// A CRI error as upstream's `streaming.WriteError` answers it.
fn runtime_error(e: &evlet_cri::Error) -> Response {
    let code = match e.kind {
        evlet_cri::ErrorKind::NotFound => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (code, e.to_string()).into_response()
}

async fn exec(
    State(s): State<Secure>,
    Path(path): Path<String>,
    RawQuery(q): RawQuery,
    req: Request,
) -> Response {
    remote(s, Remote::Exec, path, q, req).await
}

async fn attach(
    State(s): State<Secure>,
    Path(path): Path<String>,
    RawQuery(q): RawQuery,
    req: Request,
) -> Response {
    remote(s, Remote::Attach, path, q, req).await
}

async fn port_forward(
    State(s): State<Secure>,
    Path(path): Path<String>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let parts: Vec<&str> = path.split('/').collect();
    let (namespace, pod, uid) = match parts.as_slice() {
        [ns, pod] => (*ns, *pod, None),
        [ns, pod, uid] => (*ns, *pod, Some(*uid)),
        _ => return not_found("404 page not found".into()),
    };
    let ports = match streaming::parse_ports(query.as_deref().unwrap_or("")) {
        Ok(p) => p,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let Some(view) = find(&s.served, namespace, pod) else {
        return not_found("pod does not exist".into());
    };
    if uid.is_some_and(|u| Some(u) != view.pod.metadata.uid.as_deref()) {
        return not_found("pod not found".into());
    }
    let sandbox = s
        .served
        .cache
        .get(&crate::pod::uid(&view.pod))
        .and_then(|e| e.status.ok())
        .and_then(|st| {
            st.sandboxes
                .iter()
                .find(|sb| sb.ready)
                .map(|sb| sb.id.to_string())
        });
    let Some(sandbox) = sandbox else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("pod not found ({pod:?})"),
        )
            .into_response();
    };
    if !streaming::is_upgrade(&req) {
        return streaming::upgrade_required();
    }
    match s
        .served
        .runtime
        .port_forward(evlet_cri::api::PortForwardRequest {
            pod_sandbox_id: sandbox,
            port: ports,
        })
        .await
    {
        Ok(url) => streaming::proxy(req, &url).await,
        Err(e) => runtime_error(&e),
    }
}

/// `POST /run/{ns}/{pod}/[{uid}/]{container}?cmd=...`: runs the command
/// (split on spaces) and answers its combined output.
async fn run(
    State(s): State<Secure>,
    Path(path): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let parts: Vec<String> = path.split('/').map(str::to_owned).collect();
    let Some((namespace, pod, uid, container)) = exec_target(&parts) else {
        return not_found("404 page not found".into());
    };
    let cmd: Vec<String> = form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "cmd")
        .map(|(_, v)| v.split(' ').map(str::to_owned).collect())
        .unwrap_or_default();
    let Some(view) = find(&s.served, namespace, pod) else {
        return not_found("pod does not exist".into());
    };
    if uid.is_some_and(|u| Some(u) != view.pod.metadata.uid.as_deref()) {
        return not_found("pod not found".into());
    }
    let Some(id) = running_container(&view, container) else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("container not found ({container:?})"),
        )
            .into_response();
    };
    match s
        .served
        .runtime
        .exec_sync(&id, cmd, std::time::Duration::ZERO)
        .await
    {
        Ok(out) => {
            let mut body = out.stdout;
            body.extend_from_slice(&out.stderr);
            (StatusCode::OK, body).into_response()
        }
        Err(e) => runtime_error(&e),
    }
}

async fn configz(State(s): State<Secure>) -> Response {
    axum::Json(serde_json::json!({ "kubeletconfig": s.served.configz })).into_response()
}

/// `router` behind authentication and authorization: nothing in it runs
/// for a request `auth` refuses.
pub fn protect(router: Router, auth: Arc<Auth>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(auth, authenticate))
}

/// The secured router: upstream's routes, evlet's diagnostics and the
/// operator endpoints, all behind authentication and authorization.
pub fn router(served: Arc<Served>, auth: Arc<Auth>) -> Router {
    let state = Secure {
        served: Arc::clone(&served),
    };
    let operator = Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container_logs),
        )
        .route("/exec/{*path}", any(exec))
        .route("/attach/{*path}", any(attach))
        .route("/portForward/{*path}", any(port_forward))
        .route("/run/{*path}", post(run))
        .route("/configz", get(configz))
        .with_state(state.clone());
    let all = routes::common(Arc::clone(&served))
        .merge(routes::diagnostics(Arc::clone(&served)))
        .merge(operator);
    protect(all, auth)
}

/// Serves `router` over TLS on `listener` under `gate`'s limits until
/// `shutdown`. Each connection's verified client certificate (if any) is
/// handed to the auth layer.
pub fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    gate: Arc<Gate>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let limits = *gate.limits();
    let serving = Serving {
        router,
        limits,
        shown: Shown::Authenticated,
        shutdown: shutdown.clone(),
    };
    connection::accept_loop(
        listener,
        gate,
        shutdown,
        move |tcp: tokio::net::TcpStream, slot| {
            let acceptor = acceptor.clone();
            let serving = serving.clone();
            async move {
                let peer = tcp.peer_addr().ok();
                let handshake = tokio::select! {
                    () = slot.closed() => return,
                    done = tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(tcp)) => done,
                };
                let tls = match handshake {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        tracing::debug!(?peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(?peer, "TLS handshake timed out");
                        return;
                    }
                };
                let mut extensions = axum::http::Extensions::new();
                extensions.insert(PeerUser(super::tls::peer_user(tls.get_ref().1)));
                connection::serve(tls, slot, serving, extensions).await;
            }
        },
    )
}
