//! `rest_client_*`: the API requests of the agent's client, as client-go
//! counts them.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};

/// The request metrics of one API client. Made with the client (which
/// reports to them) and registered by [`super::Metrics::with_rest_client`].
#[derive(Debug, Clone)]
pub struct RestClientMetrics {
    /// Requests by `code`, `host`, `method`.
    pub requests: IntCounterVec,
    /// Seconds by `host`, `verb`.
    pub duration: HistogramVec,
}

impl Default for RestClientMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RestClientMetrics {
    /// New, unregistered metrics.
    pub fn new() -> Self {
        Self {
            requests: super::expect_valid(IntCounterVec::new(
                Opts::new(
                    "rest_client_requests_total",
                    "[BETA] Number of HTTP requests, partitioned by status code, method, and host.",
                ),
                &["code", "host", "method"],
            )),
            duration: super::expect_valid(HistogramVec::new(
                HistogramOpts::new(
                    "rest_client_request_duration_seconds",
                    "[BETA] Request latency in seconds. Broken down by verb, and host.",
                )
                .buckets(super::REST_BUCKETS.to_vec()),
                &["host", "verb"],
            )),
        }
    }

    /// One request with HTTP `method` to `host` answered `code` (client-go's
    /// `<error>` when no response came) after `elapsed`.
    pub fn observe(&self, method: &str, host: &str, code: Option<u16>, elapsed: Duration) {
        let code = code.map_or_else(|| "<error>".to_owned(), |c| c.to_string());
        self.requests
            .with_label_values(&[code.as_str(), host, method])
            .inc();
        self.duration
            .with_label_values(&[host, method])
            .observe(elapsed.as_secs_f64());
    }
}
