//! Serving one port's connections under its [`Limits`]: the accept loop
//! (room first, from the port's [`Gate`]), and each connection's HTTP/1
//! with a watchdog that closes it when its request headers take longer than
//! the header timeout or it idles longer than the idle timeout, as Go's
//! http.Server does with `ReadHeaderTimeout` and `IdleTimeout`.
//!
//! The watchdog follows the connection through [`Watched`], the stream under
//! hyper: the first byte of a request starts the header clock, the service
//! being called stops it, and the end of the response's body starts the idle
//! clock. A response that streams (logs with `follow`) or a connection
//! upgraded to exec or port-forward is never cut by these clocks.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::limits::{Gate, Limits, Slot};
use crate::lock::lock;

/// Where a connection is in its request cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request's first byte since `since`; `first` for the
    /// connection's first request (whose header clock runs from the start).
    Idle { since: Instant, first: bool },
    /// A request's head is arriving, since its first byte.
    Head { since: Instant },
    /// Requests being answered (their responses' bodies not yet done).
    Busy { requests: usize },
}

/// The watchdog's view of a connection, shared by the stream, the service
/// and the watchdog.
#[derive(Debug)]
struct Clock {
    phase: Mutex<Phase>,
    /// Woken when the phase changes, so the watchdog re-reads its deadline.
    changed: Notify,
}

impl Clock {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            phase: Mutex::new(Phase::Idle {
                since: Instant::now(),
                first: true,
            }),
            changed: Notify::new(),
        })
    }

    /// Bytes arrived: an idle connection starts a request head.
    fn bytes_read(&self) {
        let mut phase = lock(&self.phase);
        if let Phase::Idle { first, since } = *phase {
            // The first request's clock runs from the start (Go's
            // `ReadHeaderTimeout` for a new connection).
            *phase = Phase::Head {
                since: if first { since } else { Instant::now() },
            };
            drop(phase);
            self.changed.notify_one();
        }
    }

    fn request_started(&self) {
        let mut phase = lock(&self.phase);
        *phase = match *phase {
            Phase::Busy { requests } => Phase::Busy {
                requests: requests + 1,
            },
            _ => Phase::Busy { requests: 1 },
        };
        drop(phase);
        self.changed.notify_one();
    }

    fn request_done(&self) {
        let mut phase = lock(&self.phase);
        if let Phase::Busy { requests } = *phase {
            *phase = if requests > 1 {
                Phase::Busy {
                    requests: requests - 1,
                }
            } else {
                Phase::Idle {
                    since: Instant::now(),
                    first: false,
                }
            };
        }
        drop(phase);
        self.changed.notify_one();
    }

    /// When the connection is cut if nothing changes, and why.
    fn deadline(&self, limits: &Limits) -> Option<(Instant, &'static str)> {
        match *lock(&self.phase) {
            Phase::Idle { since, first: true } | Phase::Head { since } => Some((
                since + limits.header_read_timeout,
                "request headers took too long",
            )),
            Phase::Idle { since, .. } => Some((since + limits.idle_timeout, "idle")),
            Phase::Busy { .. } => None,
        }
    }
}

/// A connection's stream as hyper sees it: reads tell the watchdog a request
/// head began. It also holds the connection's [`Slot`], so a stream upgraded
/// to exec or port-forward keeps its slot until it closes.
#[derive(Debug)]
pub(crate) struct Watched<T> {
    inner: T,
    clock: Arc<Clock>,
    _slot: Slot,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.bytes_read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A response body that tells the watchdog when it is done (sent, or
/// dropped with the connection).
struct Tracked {
    inner: axum::body::Body,
    _done: Done,
}

/// Ends a request in the watchdog's view when dropped.
struct Done(Arc<Clock>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.request_done();
    }
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// When a connection stops being pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shown {
    /// At its first request's headers (ports without authentication).
    FirstRequest,
    /// When a request is authenticated: the auth layer calls
    /// [`Slot::established`] through the request's extensions.
    Authenticated,
}

/// What a connection is served with.
#[derive(Debug, Clone)]
pub(crate) struct Serving {
    /// The routes.
    pub router: Router,
    /// The port's limits.
    pub limits: Limits,
    /// When the connection is established.
    pub shown: Shown,
    /// Ends every connection.
    pub shutdown: CancellationToken,
}

/// Serves HTTP/1 on `io` until the client is done, a clock runs out, the
/// gate closes it for a newer connection, or shutdown. `extensions` go into
/// every request (a TLS peer's user).
pub(crate) async fn serve<T>(
    io: T,
    slot: Slot,
    serving: Serving,
    extensions: axum::http::Extensions,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let clock = Clock::new();
    let limits = serving.limits;
    let io = Watched {
        inner: io,
        clock: Arc::clone(&clock),
        _slot: slot.clone(),
    };
    let service = {
        let clock = Arc::clone(&clock);
        let slot = slot.clone();
        let router = serving.router.clone();
        let shown = serving.shown;
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            clock.request_started();
            let done = Done(Arc::clone(&clock));
            if shown == Shown::FirstRequest {
                slot.established();
            }
            req.extensions_mut().extend(extensions.clone());
            req.extensions_mut().insert(slot.clone());
            let router = router.clone();
            async move {
                let response = router.oneshot(req.map(axum::body::Body::new)).await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|inner| Tracked { inner, _done: done }),
                )
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .max_header_size(limits.max_header_bytes)
        // Go reads headers through a buffer 4 KiB larger than MaxHeaderBytes.
        .max_buf_size((limits.max_header_bytes + 4096).max(8192));
    let conn = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    loop {
        let deadline = clock.deadline(&limits);
        let changed = clock.changed.notified();
        tokio::select! {
            result = &mut conn => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "kubelet API connection ended");
                }
                return;
            }
            () = serving.shutdown.cancelled() => return,
            () = slot.closed() => {
                tracing::debug!("kubelet API connection closed for a newer one (too many pending connections)");
                return;
            }
            () = changed => {}
            () = sleep_until(deadline.map(|(at, _)| at)) => {
                if let Some((at, why)) = clock.deadline(&limits)
                    && at <= Instant::now()
                {
                    tracing::debug!(reason = why, "kubelet API connection cut");
                    return;
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A listener the accept loop takes connections from.
pub(crate) trait Accept: Send + 'static {
    /// A connection.
    type Io: Send + 'static;
    /// The next connection.
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        tokio::net::TcpListener::accept(self).await.map(|(s, _)| s)
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        tokio::net::UnixListener::accept(self).await.map(|(s, _)| s)
    }
}

/// Accepts connections and hands each, once the gate has room for it (a
/// free slot, or a pending connection closed for it), with its slot to
/// `handle` on a task of its own, until `shutdown`. While it waits for room
/// nothing more is accepted: later clients wait in the listen backlog.
pub(crate) fn accept_loop<L, H, F>(
    listener: L,
    gate: Arc<Gate>,
    shutdown: CancellationToken,
    handle: H,
) -> tokio::task::JoinHandle<()>
where
    L: Accept,
    H: Fn(L::Io, Slot) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let io = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(io) => io,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a kubelet API connection failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let permit = tokio::select! {
                () = shutdown.cancelled() => return,
                permit = gate.room() => match permit {
                    Some(p) => p,
                    None => return,
                },
            };
            tokio::spawn(handle(io, gate.admit(permit)));
        }
    })
}
