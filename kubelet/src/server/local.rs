//! The node-local socket: a Unix socket under the root directory
//! (`<root-dir>/evlet.sock`, mode 0600) that serves the read-only routes and
//! evlet's diagnostics to root on the node, without TLS or credentials: the
//! file's mode and the peer's credentials (`SO_PEERCRED`: root, or the
//! agent's own user) are the authentication. It is how `evlet diag` and the
//! benches read the agent on the node, whether or not the secured port is
//! served (a standalone node serves it only with client certificates).
//! Upstream has no such socket; it is evlet's own, beside the ports.
//!
//! [`Client`] is its client.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

use super::connection::{self, Serving, Shown};
use super::{Gate, Limits, Served, routes};

/// The socket's file name under the root directory.
pub const SOCKET: &str = "evlet.sock";

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// It could not be bound (or a stale one removed, or its mode set).
    #[error("cannot serve the local socket {path}: {source}")]
    Bind {
        /// The socket's path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// The routes the socket serves: the read-only port's and the diagnostics.
pub fn router(served: Arc<Served>) -> axum::Router {
    routes::read_only(Arc::clone(&served)).merge(routes::diagnostics(served))
}

/// Binds `path` (replacing a stale socket of an earlier run), makes it 0600
/// and serves `router` there until `shutdown`, to root and the agent's user only.
///
/// # Errors
/// [`LocalError`] naming the path.
pub fn serve(
    path: &Path,
    router: axum::Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, LocalError> {
    let failed = |source| LocalError::Bind {
        path: path.to_owned(),
        source,
    };
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(failed(e)),
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(failed)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(failed)?;
    tracing::info!(path = %path.display(), "serving the node-local socket (diagnostics)");
    let serving = Serving {
        router,
        limits,
        shown: Shown::FirstRequest,
        shutdown: shutdown.clone(),
    };
    let own = rustix::process::geteuid().as_raw();
    Ok(connection::accept_loop(
        listener,
        Gate::new(limits),
        shutdown,
        move |stream: tokio::net::UnixStream, slot| {
            let serving = serving.clone();
            async move {
                match stream.peer_cred() {
                    Ok(cred) if cred.uid() == 0 || cred.uid() == own => {
                        connection::serve(stream, slot, serving, axum::http::Extensions::new())
                            .await;
                    }
                    Ok(cred) => {
                        tracing::warn!(
                            uid = cred.uid(),
                            "refused a local socket client that is not root"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read a local socket client's credentials")
                    }
                }
            }
        },
    ))
}

/// A GET client of the local socket, keeping connections alive between requests.
#[derive(Debug, Clone)]
pub struct Client {
    client: HyperClient<Connector, http_body_util::Empty<Bytes>>,
    path: PathBuf,
}

/// Connects every request to the socket, whatever its URI says.
#[derive(Debug, Clone)]
struct Connector(Arc<PathBuf>);

impl tower::Service<hyper::Uri> for Connector {
    type Response = TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: hyper::Uri) -> Self::Future {
        let path = Arc::clone(&self.0);
        Box::pin(async move {
            tokio::net::UnixStream::connect(path.as_path())
                .await
                .map(TokioIo::new)
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot connect to {}: {e}", path.display()),
                    )
                })
        })
    }
}

/// Why a request over the local socket failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request could not be made or answered.
    #[error("GET {path} over {socket}: {message}")]
    Request {
        /// The socket.
        socket: PathBuf,
        /// The request's path.
        path: String,
        /// What failed.
        message: String,
    },
}

impl Client {
    /// A client of the socket at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        Self {
            client: HyperClient::builder(hyper_util::rt::TokioExecutor::new())
                .build(Connector(Arc::new(path.clone()))),
            path,
        }
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Status code and body of `GET <path>`.
    ///
    /// # Errors
    /// [`ClientError`] when the socket cannot be reached or the answer read.
    pub async fn get(&self, path: &str) -> Result<(u16, Bytes), ClientError> {
        let failed = |message: String| ClientError::Request {
            socket: self.path.clone(),
            path: path.to_owned(),
            message,
        };
        let uri: hyper::Uri = format!("http://localhost{path}")
            .parse()
            .map_err(|e| failed(format!("{e}")))?;
        let resp = self
            .client
            .get(uri)
            .await
            .map_err(|e| failed(format!("{e:#}")))?;
        let code = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| failed(e.to_string()))?
            .to_bytes();
        Ok((code, body))
    }
}
