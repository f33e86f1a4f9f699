//! Client-side rate limit for API requests: a token bucket (upstream kubelet's
//! `kubeAPIQPS` 50, `kubeAPIBurst` 100), as a tower layer under the kube client.
//!
//! Each request reserves a token when it is issued and waits until its token
//! is due, so requests keep their order and a burst beyond the bucket is spread
//! at the configured rate instead of hitting the API server at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

/// Upstream kubelet's `kubeAPIQPS`.
pub const QPS: f64 = 50.0;
/// Upstream kubelet's `kubeAPIBurst`.
pub const BURST: u32 = 100;

#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    /// Tokens at `at`; negative when requests wait for future tokens.
    tokens: f64,
    at: Option<Instant>,
}

impl Bucket {
    /// Reserves one token; returns how long the request must wait for it.
    fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = self
            .at
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.qps).min(self.burst);
        self.at = Some(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

/// The layer: one bucket shared by every request of a client.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<Bucket>>,
}

impl RateLimitLayer {
    /// `qps` requests per second after a burst of `burst`.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            bucket: Arc::new(Mutex::new(Bucket {
                qps: qps.max(0.001),
                burst: f64::from(burst.max(1)),
                tokens: f64::from(burst.max(1)),
                at: None,
            })),
        }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            bucket: Arc::clone(&self.bucket),
        }
    }
}

/// The service of [`RateLimitLayer`].
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    bucket: Arc<Mutex<Bucket>>,
}

impl<S, R> tower::Service<R> for RateLimit<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let wait = crate::lock::lock(&self.bucket).reserve(Instant::now());
        // The inner future does nothing until polled, so the request leaves
        // only once its token is due.
        let fut = self.inner.call(req);
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            fut.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer as _, Service as _, ServiceExt as _};

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_and_the_rest_at_the_rate() {
        let start = Instant::now();
        let inner =
            tower::service_fn(|()| async { Ok::<_, std::convert::Infallible>(Instant::now()) });
        let mut svc = RateLimitLayer::new(50.0, 100).layer(inner);
        let mut calls = Vec::new();
        for _ in 0..150 {
            let ready = svc.ready().await.expect("ready");
            calls.push(tokio::spawn(ready.call(())));
        }
        let mut at = Vec::new();
        for c in calls {
            at.push(c.await.expect("task").expect("call") - start);
        }
        assert!(at[..100].iter().all(|d| d.is_zero()), "the burst");
        assert_eq!(at[100], Duration::from_millis(20));
        assert_eq!(at[149].as_millis(), 1000, "50 more at 50/s");
    }
}
