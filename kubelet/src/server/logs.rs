//! `/containerLogs/{namespace}/{pod}/{container}`: a container's log as
//! upstream's `getContainerLogs` serves it. The query is a `PodLogOptions`
//! (`follow`, `previous`, `timestamps`, `sinceSeconds`, `sinceTime`,
//! `tailLines`, `limitBytes`, and the old `tail`); which instance's log is
//! read follows the container's status as upstream's
//! `validateContainerLogStatus` decides it, with its messages; the file is
//! the one the runtime names (CRI `ContainerStatus.logPath`), read record by
//! record and, with `follow`, until the container stops, across rotations.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};
use evlet_cri::{ContainerId, RuntimeClient};
use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;

use crate::logs::{ReadOptions, render, tail_start};

/// A log request's options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogRequest {
    /// Keep streaming while the container runs.
    pub follow: bool,
    /// The previous (terminated) instance.
    pub previous: bool,
    /// Prefix lines with their time.
    pub timestamps: bool,
    /// `sinceSeconds`.
    pub since_seconds: Option<i64>,
    /// `sinceTime`.
    pub since_time: Option<Timestamp>,
    /// `tailLines`.
    pub tail_lines: Option<i64>,
    /// `limitBytes`.
    pub limit_bytes: Option<i64>,
}

fn bad_request(message: &str) -> (StatusCode, String) {
    (
        StatusCode::BAD_REQUEST,
        format!("{{\"message\": \"{message}\"}}"),
    )
}

fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Parses and validates the query as upstream does: an undecodable query is
/// 400 `Unable to decode query.`, an invalid one 422 `Invalid request.`.
///
/// # Errors
/// The status and body to answer with.
pub fn parse_query(query: &str) -> Result<LogRequest, (StatusCode, String)> {
    let mut r = LogRequest::default();
    let undecodable = || bad_request("Unable to decode query.");
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let int = || value.parse::<i64>().map_err(|_| undecodable());
        match key.as_ref() {
            "follow" => r.follow = go_bool(&value).ok_or_else(undecodable)?,
            "previous" => r.previous = go_bool(&value).ok_or_else(undecodable)?,
            "timestamps" => r.timestamps = go_bool(&value).ok_or_else(undecodable)?,
            "sinceSeconds" => r.since_seconds = Some(int()?),
            "sinceTime" => r.since_time = Some(value.parse().map_err(|_| undecodable())?),
            "tailLines" => r.tail_lines = Some(int()?),
            // The old `tail`: a number, or `all`.
            "tail" if value == "all" => r.tail_lines = None,
            "tail" => r.tail_lines = Some(int()?),
            "limitBytes" => r.limit_bytes = Some(int()?),
            _ => {}
        }
    }
    let invalid = r.tail_lines.is_some_and(|n| n < 0)
        || r.limit_bytes.is_some_and(|n| n < 1)
        || r.since_seconds.is_some_and(|n| n < 1)
        || (r.since_seconds.is_some() && r.since_time.is_some());
    if invalid {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            "{\"message\": \"Invalid request.\"}".into(),
        ));
    }
    Ok(r)
}

fn statuses(status: &PodStatus) -> impl Iterator<Item = &ContainerStatus> {
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .chain(status.ephemeral_container_statuses.iter().flatten())
}

/// Which container instance's log to read (upstream's
/// `validateContainerLogStatus`), or the message why there is none.
///
/// # Errors
/// Upstream's message (answered with 400).
pub fn container_id(
    status: &PodStatus,
    pod: &str,
    container: &str,
    previous: bool,
) -> Result<String, String> {
    let Some(c) = statuses(status).find(|c| c.name == container) else {
        return Err(format!(
            "container {container:?} in pod {pod:?} is not available"
        ));
    };
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let last_id = last
        .and_then(|t| t.container_id.clone())
        .filter(|id| !id.is_empty());
    if previous {
        return last_id.ok_or_else(|| {
            format!("previous terminated container {container:?} in pod {pod:?} not found")
        });
    }
    let state = c.state.as_ref();
    let terminated_error = || format!("container {container:?} in pod {pod:?} is terminated");
    if state.and_then(|s| s.running.as_ref()).is_some() {
        return c.container_id.clone().ok_or_else(terminated_error);
    }
    if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
        return t
            .container_id
            .clone()
            .filter(|id| !id.is_empty())
            .or(last_id)
            .ok_or_else(terminated_error);
    }
    if last.is_some() {
        return last_id.ok_or_else(terminated_error);
    }
    if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
        let why = match w.reason.as_deref() {
            Some("ErrImagePull") => "image can't be pulled".to_owned(),
            Some("ImagePullBackOff") => "trying and failing to pull image".to_owned(),
            Some(other) => other.to_owned(),
            None => String::new(),
        };
        return Err(format!(
            "container {container:?} in pod {pod:?} is waiting to start: {why}"
        ));
    }
    Err(format!(
        "container {container:?} in pod {pod:?} is waiting to start - no logs yet"
    ))
}

/// How often a followed log is checked when nothing new was written.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// How often a followed log's container is asked whether it still runs.
const RUNNING_CHECK: Duration = Duration::from_secs(1);
/// Bytes read at a time.
const CHUNK: usize = 64 * 1024;

/// Streams the log of container `id` (a `containerd://` ID) as `request` asks.
pub async fn stream(runtime: RuntimeClient, id: String, request: LogRequest) -> Response {
    let cid = ContainerId::new(id.split_once("://").map_or(id.as_str(), |(_, i)| i));
    let path = match runtime.container_status(&cid).await {
        Ok(s) if !s.log_path.is_empty() => PathBuf::from(s.log_path),
        Ok(_) | Err(_) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("unable to retrieve container logs for {id}"),
            )
                .into_response();
        }
    };
    let now = Timestamp::now();
    let since = request
        .since_seconds
        .and_then(|s| {
            now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                .ok()
        })
        .into_iter()
        .chain(request.since_time)
        .max();
    let opts = ReadOptions {
        since,
        timestamps: request.timestamps,
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let running = Arc::new(move || {
        let runtime = runtime.clone();
        let cid = cid.clone();
        async move {
            runtime
                .container_status(&cid)
                .await
                .is_ok_and(|s| s.state == evlet_cri::api::ContainerState::ContainerRunning as i32)
        }
    });
    tokio::spawn(async move {
        let path_shown = path.clone();
        let reader = Reader {
            path,
            opts,
            tail: request.tail_lines.and_then(|n| u64::try_from(n).ok()),
            limit: request.limit_bytes.and_then(|n| u64::try_from(n).ok()),
            follow: request.follow,
        };
        if let Err(e) = reader.run(&tx, running).await {
            tracing::warn!(error = %e, path = %path_shown.display(), "reading a container log failed");
            let _ = tx.send(Err(e)).await;
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("Content-Type", "text/plain")
        .body(Body::from_stream(FlushedEnd::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A body stream that ends one poll after its last item: hyper flushes what
/// it wrote when the body is pending, so the last data chunk goes out (its
/// own TLS record) before the terminating `0\r\n\r\n` chunk.
///
/// Upstream's kubelet flushes every write of a log (`flushwriter`), so its
/// end chunk never travels with data. Go's HTTP client returns the last data
/// together with `io.EOF` when both are in one record, and the API server's
/// websocket log streaming (`wsstream.messageCopy`) drops data that comes
/// with `io.EOF`: `kubectl logs` over a websocket, and the conformance spec
/// "Pods should support retrieving logs from the container over websockets",
/// got an empty log from evlet whenever a short log fit one write.
struct FlushedEnd<S> {
    /// The log's chunks.
    inner: S,
    /// The inner stream ended and one `Pending` was returned since.
    ended: bool,
}

impl<S> FlushedEnd<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            ended: false,
        }
    }
}

impl<S: futures_util::Stream + Unpin> futures_util::Stream for FlushedEnd<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        if self.ended {
            return Poll::Ready(None);
        }
        match std::pin::Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(None) => {
                self.ended = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            other => other,
        }
    }
}

struct Reader {
    path: PathBuf,
    opts: ReadOptions,
    tail: Option<u64>,
    limit: Option<u64>,
    follow: bool,
}

/// The file and where reading stopped; a rotation (the runtime's new file
/// at the same path) starts over at the new file's beginning.
struct Open {
    file: std::fs::File,
    inode: u64,
}

fn open(path: &std::path::Path) -> std::io::Result<Open> {
    use std::os::unix::fs::MetadataExt as _;
    let file = std::fs::File::open(path)?;
    let inode = file.metadata()?.ino();
    Ok(Open { file, inode })
}

impl Reader {
    async fn run<F, Fut>(
        self,
        tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
        running: Arc<F>,
    ) -> std::io::Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        use std::os::unix::fs::MetadataExt as _;
        let mut current = open(&self.path)?;
        if let Some(n) = self.tail {
            let at = tail_start(&mut current.file, n)?;
            current.file.seek(SeekFrom::Start(at))?;
        }
        // Without follow, a tail counts the lines it sends (upstream's limited mode).
        let mut lines_left = self.tail.filter(|_| !self.follow);
        let mut budget = self.limit;
        let mut pending: Vec<u8> = Vec::new();
        let mut buf = vec![0_u8; CHUNK];
        let mut last_check = tokio::time::Instant::now();
        loop {
            let n = current.file.read(&mut buf)?;
            if n > 0 {
                pending.extend_from_slice(&buf[..n]);
                let mut out = Vec::new();
                let mut consumed = 0;
                while let Some(end) = pending[consumed..].iter().position(|b| *b == b'\n') {
                    let line = &pending[consumed..consumed + end];
                    consumed += end + 1;
                    if let Some(bytes) = render(&String::from_utf8_lossy(line), &self.opts)
                        && !push(&mut out, bytes, &mut budget, &mut lines_left)
                    {
                        send(tx, out).await;
                        return Ok(());
                    }
                }
                pending.drain(..consumed);
                if !send(tx, out).await {
                    return Ok(());
                }
                continue;
            }
            // End of file.
            if !self.follow {
                if !pending.is_empty()
                    && let Some(bytes) = render(&String::from_utf8_lossy(&pending), &self.opts)
                {
                    let mut out = Vec::new();
                    push(&mut out, bytes, &mut budget, &mut lines_left);
                    send(tx, out).await;
                }
                return Ok(());
            }
            if tx.is_closed() {
                return Ok(());
            }
            if last_check.elapsed() >= RUNNING_CHECK {
                last_check = tokio::time::Instant::now();
                let rotated = std::fs::metadata(&self.path).is_ok_and(|m| m.ino() != current.inode);
                if rotated {
                    // Whatever the old file still had was read above.
                    current = open(&self.path)?;
                    pending.clear();
                    continue;
                }
                if !running().await {
                    // Drain what was written before it stopped, then end.
                    let n = current.file.read(&mut buf)?;
                    if n == 0 {
                        return Ok(());
                    }
                    current
                        .file
                        .seek(SeekFrom::Current(-i64::try_from(n).unwrap_or(0)))?;
                    continue;
                }
            }
            tokio::time::sleep(FOLLOW_POLL).await;
        }
    }
}

/// Appends `bytes` within the byte budget and line count; false when either
/// is used up (stop reading).
fn push(
    out: &mut Vec<u8>,
    mut bytes: Vec<u8>,
    budget: &mut Option<u64>,
    lines: &mut Option<u64>,
) -> bool {
    if let Some(left) = budget {
        let take = usize::try_from(*left)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        bytes.truncate(take);
        *left -= take as u64;
    }
    out.extend_from_slice(&bytes);
    if let Some(n) = lines {
        *n = n.saturating_sub(1);
        if *n == 0 {
            return false;
        }
    }
    budget.is_none_or(|left| left > 0)
}

async fn send(tx: &mpsc::Sender<Result<Bytes, std::io::Error>>, out: Vec<u8>) -> bool {
    out.is_empty() || tx.send(Ok(Bytes::from(out))).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_and_invalid_ones_are_refused_as_upstream() {
        let r = parse_query("follow=true&tailLines=10&timestamps=1&sinceSeconds=5").expect("valid");
        assert!(r.follow && r.timestamps);
        assert_eq!((r.tail_lines, r.since_seconds), (Some(10), Some(5)));
        assert_eq!(parse_query("tail=all").expect("all").tail_lines, None);
        assert_eq!(parse_query("tail=3").expect("tail").tail_lines, Some(3));
        let (code, body) = parse_query("follow=maybe").expect_err("undecodable");
        assert_eq!(
            (code, body.as_str()),
            (
                StatusCode::BAD_REQUEST,
                "{\"message\": \"Unable to decode query.\"}"
            )
        );
        for q in [
            "tailLines=-1",
            "limitBytes=0",
            "sinceSeconds=0",
            "sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z",
        ] {
            let (code, body) = parse_query(q).expect_err(q);
            assert_eq!(
                (code, body.as_str()),
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "{\"message\": \"Invalid request.\"}"
                ),
                "{q}"
            );
        }
    }

    fn status(yaml: &str) -> PodStatus {
        serde_yaml::from_str(yaml).expect("status")
    }

    #[test]
    fn the_instance_follows_the_status_with_upstreams_messages() {
        let s = status(
            "containerStatuses:\n\
             - {name: app, image: i, imageID: x, ready: true, restartCount: 1, containerID: 'containerd://new',\n\
                state: {running: {}}, lastState: {terminated: {exitCode: 1, containerID: 'containerd://old'}}}\n\
             - {name: wait, image: i, imageID: x, ready: false, restartCount: 0, state: {waiting: {reason: ImagePullBackOff}}}\n\
             - {name: fresh, image: i, imageID: x, ready: false, restartCount: 0, state: {waiting: {reason: ContainerCreating}}}\n",
        );
        assert_eq!(
            container_id(&s, "p", "app", false).as_deref(),
            Ok("containerd://new")
        );
        assert_eq!(
            container_id(&s, "p", "app", true).as_deref(),
            Ok("containerd://old")
        );
        assert_eq!(
            container_id(&s, "p", "wait", false),
            Err("container \"wait\" in pod \"p\" is waiting to start: trying and failing to pull image".into())
        );
        assert_eq!(
            container_id(&s, "p", "fresh", true),
            Err("previous terminated container \"fresh\" in pod \"p\" not found".into())
        );
        assert_eq!(
            container_id(&s, "p", "fresh", false),
            Err("container \"fresh\" in pod \"p\" is waiting to start: ContainerCreating".into())
        );
        assert_eq!(
            container_id(&s, "p", "ghost", false),
            Err("container \"ghost\" in pod \"p\" is not available".into())
        );
    }

    #[tokio::test]
    async fn a_tail_with_a_byte_limit_stops_cleanly() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("0.log");
        std::fs::write(
            &path,
            "2026-01-01T00:00:00Z stdout F one\n2026-01-01T00:00:01Z stdout P tw\n2026-01-01T00:00:01Z stdout F o\n2026-01-01T00:00:02Z stderr F three\n",
        )
        .expect("write");
        let read = |tail, limit| {
            let path = path.clone();
            async move {
                let (tx, mut rx) = mpsc::channel(8);
                let reader = Reader {
                    path,
                    opts: ReadOptions::default(),
                    tail,
                    limit,
                    follow: false,
                };
                reader
                    .run(&tx, Arc::new(|| async { false }))
                    .await
                    .expect("read");
                drop(tx);
                let mut all = Vec::new();
                while let Some(Ok(b)) = rx.recv().await {
                    all.extend_from_slice(&b);
                }
                String::from_utf8(all).expect("utf8")
            }
        };
        assert_eq!(read(None, None).await, "one\ntwo\nthree\n");
        assert_eq!(
            read(Some(2), None).await,
            "o\nthree\n",
            "tails count records"
        );
        assert_eq!(read(None, Some(6)).await, "one\ntw");
    }

    /// Records what the server writes between flushes.
    struct Flushes {
        current: Vec<u8>,
        flushed: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    }

    impl tokio::io::AsyncRead for Flushes {
        fn poll_read(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            _: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            // The request was read already (see below); the client waits.
            std::task::Poll::Pending
        }
    }

    impl tokio::io::AsyncWrite for Flushes {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.current.extend_from_slice(buf);
            std::task::Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if !self.current.is_empty() {
                let chunk = std::mem::take(&mut self.current);
                self.flushed.lock().expect("lock").push(chunk);
            }
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            self.poll_flush(cx)
        }
    }

    #[tokio::test]
    async fn the_end_chunk_is_flushed_apart_from_the_last_data() {
        // A whole log sent before the body is first polled: the case where
        // data and end used to share one write (and one TLS record).
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(8);
        tx.send(Ok(Bytes::from_static(b"container is alive\n")))
            .await
            .expect("send");
        drop(tx);
        let body = Body::from_stream(FlushedEnd::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        let flushed = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let io = Flushes {
            current: Vec::new(),
            flushed: std::sync::Arc::clone(&flushed),
        };
        let body = std::sync::Mutex::new(Some(body));
        let service = hyper::service::service_fn(move |_req| {
            let body = body
                .lock()
                .expect("lock")
                .take()
                .unwrap_or_else(Body::empty);
            async move {
                Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .status(StatusCode::OK)
                        .body(body)
                        .expect("response"),
                )
            }
        });
        // hyper reads the request from a prefix of the IO.
        let request = b"GET /containerLogs/ns/p/c HTTP/1.1\r\nHost: k\r\n\r\n".to_vec();
        let io = Prefixed {
            prefix: request,
            io,
        };
        let conn = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(io), service);
        let _ = tokio::time::timeout(std::time::Duration::from_millis(500), conn).await;
        let flushed = flushed.lock().expect("lock").clone();
        let text: Vec<String> = flushed
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect();
        let data = text
            .iter()
            .position(|t| t.contains("container is alive"))
            .expect("the data was written");
        let end = text
            .iter()
            .position(|t| t.ends_with("0\r\n\r\n"))
            .expect("the end chunk was written");
        assert!(
            end > data && !text[data].contains("0\r\n\r\n"),
            "the end chunk shares a flush with the data: {text:?}"
        );
    }

    /// Reads `prefix` first, then whatever `io` gives.
    struct Prefixed {
        prefix: Vec<u8>,
        io: Flushes,
    }

    impl tokio::io::AsyncRead for Prefixed {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if self.prefix.is_empty() {
                return std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
            }
            let n = self.prefix.len().min(buf.remaining());
            let head: Vec<u8> = self.prefix.drain(..n).collect();
            buf.put_slice(&head);
            std::task::Poll::Ready(Ok(()))
        }
    }

    impl tokio::io::AsyncWrite for Prefixed {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
        }
    }
}
