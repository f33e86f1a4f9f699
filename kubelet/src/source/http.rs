//! The manifest URL source: fetched every period; a failed fetch or parse keeps
//! the last good snapshot and reports the error.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::manifest::{self, ManifestError, StaticKind};
use super::{SourceMessage, config::Source};

/// Fetches `url` (plain `http://`) and turns the body into static pods.
async fn fetch(url: &str, node: &str) -> Result<manifest::Parsed, ManifestError> {
    let err = |message: String| ManifestError {
        origin: url.to_owned(),
        pod: None,
        message,
    };
    let uri: hyper::Uri = url.parse().map_err(|e| err(format!("invalid URL: {e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(err("only http:// manifest URLs are supported".into()));
    }
    let client: Client<_, http_body_util::Empty<hyper::body::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let resp = tokio::time::timeout(Duration::from_secs(10), client.get(uri))
        .await
        .map_err(|_| err("no answer within 10s".into()))?
        .map_err(|e| err(format!("fetch failed: {e}")))?;
    if !resp.status().is_success() {
        return Err(err(format!("HTTP {}", resp.status())));
    }
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| err(format!("reading body: {e}")))?
        .to_bytes();
    let text = String::from_utf8(body.to_vec()).map_err(|_| err("body is not UTF-8".into()))?;
    Ok(manifest::parse(&text, url, StaticKind::Http, node))
}

/// Polls `url` every `period` until `cancel`.
pub async fn run(
    url: String,
    node: String,
    tx: mpsc::Sender<SourceMessage>,
    period: Duration,
    cancel: CancellationToken,
) {
    let mut last: Option<Vec<Pod>> = None;
    let mut last_errors: Vec<ManifestError> = Vec::new();
    loop {
        let (pods, errors) = match fetch(&url, &node).await {
            Ok(parsed) => (Some(parsed.pods), parsed.errors),
            Err(e) => (None, vec![e]),
        };
        if errors != last_errors {
            for e in &errors {
                tracing::error!(source = "http", error = %e, "rejected manifest URL content");
                let _ = tx.send(SourceMessage::Error(Source::Http, e.clone())).await;
            }
            last_errors = errors;
        }
        // A failed fetch keeps the last snapshot. Before the first answer the
        // source has not reported: as upstream (`sourceURL.extractFromURL`),
        // only an answer (an empty body included) marks it seen, so pods the
        // runtime has are not taken for orphans while the URL is unreachable.
        if let Some(pods) = pods.or_else(|| last.clone())
            && last.as_ref() != Some(&pods)
        {
            last = Some(pods.clone());
            if tx
                .send(SourceMessage::Snapshot(
                    Source::Http,
                    pods.into_iter().map(Arc::new).collect(),
                ))
                .await
                .is_err()
            {
                return;
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}
