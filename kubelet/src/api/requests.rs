//! Counts and times every API request (`rest_client_*`), as a tower layer
//! under the kube client, the way client-go's transport reports them.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::metrics::rest::RestClientMetrics;

/// The layer: every request of a client reports to `metrics`.
#[derive(Debug, Clone)]
pub struct RequestMetricsLayer {
    metrics: RestClientMetrics,
}

impl RequestMetricsLayer {
    /// A layer reporting to `metrics`.
    pub fn new(metrics: RestClientMetrics) -> Self {
        Self { metrics }
    }
}

impl<S> tower::Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestMetrics {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service of [`RequestMetricsLayer`].
#[derive(Debug, Clone)]
pub struct RequestMetrics<S> {
    inner: S,
    metrics: RestClientMetrics,
}

impl<S, B, R> tower::Service<http::Request<B>> for RequestMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.method().as_str().to_owned();
        let host = host_of(req.uri());
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            let code = result.as_ref().ok().map(|r| r.status().as_u16());
            metrics.observe(&method, &host, code, started.elapsed());
            result
        })
    }
}

/// `host:port` of a request (client-go's `host` label).
fn host_of(uri: &http::Uri) -> String {
    uri.authority()
        .map_or_else(String::new, |a| a.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer as _, ServiceExt as _};

    #[tokio::test]
    async fn counts_requests_by_code_host_and_method() {
        let metrics = RestClientMetrics::new();
        let inner = tower::service_fn(|req: http::Request<()>| async move {
            let code = if req.uri().path() == "/missing" {
                404
            } else {
                200
            };
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(code)
                    .body(())
                    .expect("response"),
            )
        });
        let svc = RequestMetricsLayer::new(metrics.clone()).layer(inner);
        for path in ["/api", "/api", "/missing"] {
            let req = http::Request::get(format!("https://10.0.0.1:6443{path}"))
                .body(())
                .expect("request");
            svc.clone().oneshot(req).await.expect("call");
        }
        let count = |code: &str| {
            metrics
                .requests
                .with_label_values(&[code, "10.0.0.1:6443", "GET"])
                .get()
        };
        assert_eq!((count("200"), count("404")), (2, 1));
        assert_eq!(
            metrics
                .duration
                .with_label_values(&["10.0.0.1:6443", "GET"])
                .get_sample_count(),
            3
        );
    }
}
