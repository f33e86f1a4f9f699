//! A GET-only client of the agent under test: evlet's node-local socket, or
//! a kubelet's read-only port (upstream kubelet's rows).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Where the bench reads the agent.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// evlet's node-local socket (`<root-dir>/evlet.sock`: `/healthz`,
    /// `/pods`, `/metrics`, and the diagnostics `/pods/<ns>/<name>` and
    /// `/debug/*`, which the read-only port does not serve).
    Local(evlet::server::local::Client),
    /// A kubelet's read-only port (`http://IP:PORT`): `/healthz`, `/pods`,
    /// `/metrics`, as upstream serves them.
    ReadOnly {
        /// `http://IP:PORT`.
        base: String,
        /// Plain HTTP/1.
        client: Client<HttpConnector, Empty<Bytes>>,
    },
}

impl Endpoint {
    /// evlet's node-local socket under its root directory `root`.
    pub fn new(root: &Path) -> Self {
        Self::Local(evlet::server::local::Client::new(
            root.join(evlet::server::local::SOCKET),
        ))
    }

    /// The read-only port at `address` (`IP:PORT`).
    pub fn read_only(address: &str) -> Self {
        Self::ReadOnly {
            base: format!("http://{address}"),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Status code and body of `GET <path>`.
    ///
    /// # Errors
    /// If the connection fails or the answer takes over 30 s.
    pub async fn get(&self, path: &str) -> Result<(u16, Bytes)> {
        match self {
            Self::Local(client) => Ok(client.get(path).await?),
            Self::ReadOnly { base, client } => {
                let uri: hyper::Uri = format!("{base}{path}").parse()?;
                let answer = async {
                    let response = client.get(uri).await?;
                    let code = response.status().as_u16();
                    let body = response.into_body().collect().await?.to_bytes();
                    anyhow::Ok((code, body))
                };
                tokio::time::timeout(TIMEOUT, answer)
                    .await
                    .with_context(|| format!("GET {base}{path}: no answer in {TIMEOUT:?}"))?
            }
        }
    }

    /// `GET <path>` as JSON; `None` on 404.
    ///
    /// # Errors
    /// On connection failure, another non-200 status, or invalid JSON.
    pub async fn json(&self, path: &str) -> Result<Option<serde_json::Value>> {
        let (code, body) = self.get(path).await?;
        match code {
            200 => Ok(Some(serde_json::from_slice(&body)?)),
            404 => Ok(None),
            _ => bail!("GET {path}: HTTP {code}"),
        }
    }

    /// The pod `default/<name>` as the agent shows it: evlet's
    /// `/pods/<ns>/<name>`, or its item in the read-only port's `/pods`.
    ///
    /// # Errors
    /// As [`Endpoint::json`].
    pub async fn pod(&self, name: &str) -> Result<Option<serde_json::Value>> {
        match self {
            Self::Local(_) => self.json(&format!("/pods/default/{name}")).await,
            Self::ReadOnly { .. } => {
                let Some(mut list) = self.json("/pods").await? else {
                    return Ok(None);
                };
                let items = list["items"].as_array_mut().context("/pods has no items")?;
                Ok(items
                    .iter()
                    .position(|p| p["metadata"]["name"] == name)
                    .map(|i| items.swap_remove(i)))
            }
        }
    }

    /// How often a pod is polled while a kill is timed: every millisecond
    /// through evlet's one-pod route; every 10 ms through the read-only
    /// port, where each poll serializes every pod (polling that back to
    /// back would spend the kubelet's CPU on the bench).
    pub fn poll_every(&self) -> Duration {
        match self {
            Self::Local(_) => Duration::from_millis(1),
            Self::ReadOnly { .. } => Duration::from_millis(10),
        }
    }

    /// The pod's timeline (evlet's `/debug/pods/<ns>/<name>/timeline`);
    /// `None` where the agent keeps none.
    ///
    /// # Errors
    /// As [`Endpoint::json`].
    pub async fn timeline(&self, name: &str) -> Result<Option<serde_json::Value>> {
        match self {
            Self::Local(_) => {
                self.json(&format!("/debug/pods/default/{name}/timeline"))
                    .await
            }
            Self::ReadOnly { .. } => Ok(None),
        }
    }

    /// The sum of a counter's series in `/metrics` (0 when it has none).
    ///
    /// # Errors
    /// If `/metrics` cannot be read.
    pub async fn counter(&self, name: &str) -> Result<f64> {
        let (code, body) = self.get("/metrics").await?;
        if code != 200 {
            bail!("GET /metrics: HTTP {code}");
        }
        let text = std::str::from_utf8(&body).context("/metrics is not UTF-8")?;
        Ok(sum_of(text, name))
    }
}

/// The sum of the samples of metric `name` (every label set) in a
/// Prometheus text exposition.
pub fn sum_of(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.chars().next()? {
                '{' => rest.rsplit_once('}')?.1,
                ' ' => rest,
                _ => return None,
            };
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_sums_every_label_set_of_that_name_only() {
        let text = "# HELP kubelet_runtime_operations_total x\n\
                    kubelet_runtime_operations_total{operation_type=\"list_containers\"} 12\n\
                    kubelet_runtime_operations_total{operation_type=\"version\"} 3\n\
                    kubelet_runtime_operations_total_extra 100\n\
                    kubelet_runtime_operations_errors_total{operation_type=\"x\"} 7\n";
        assert_eq!(sum_of(text, "kubelet_runtime_operations_total"), 15.0);
        assert_eq!(sum_of("plain 2.5\n", "plain"), 2.5);
        assert_eq!(sum_of("", "plain"), 0.0);
    }
}
