//! How `evlet diag` reaches the agent. The diagnostics are not on the
//! read-only port, so it takes one of:
//! * the node-local socket (the default, `/var/lib/evlet/evlet.sock`; root on
//!   the node: the socket's mode and the peer's credentials are the
//!   authentication);
//! * `--kubeconfig` and `--node`: through the API server's node proxy
//!   (`/api/v1/nodes/<node>/proxy/debug/...`), as `kubectl get --raw` does;
//!   the API server reaches the secured port with its kubelet client
//!   certificate, and the kubeconfig's user needs `get` on `nodes/proxy`;
//! * `--kubeconfig` and `--server https://<node>:10250`: the secured port
//!   itself, with the kubeconfig's credentials (a client certificate the
//!   agent's `clientCAFile` signed, or a token the API server vouches for),
//!   its certificate checked against `--certificate-authority` (a
//!   self-signed one is `<root-dir>/pki/kubelet.crt`) unless
//!   `--insecure-skip-tls-verify`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use http_body_util::BodyExt as _;

/// Where the agent is, and the credentials to read it with.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// The agent's node-local socket (`<root-dir>/evlet.sock`; on the node, as root).
    #[arg(long, global = true, default_value = "/var/lib/evlet/evlet.sock")]
    socket: PathBuf,
    /// A kubeconfig whose user may `get` `nodes/proxy`: read through the API
    /// server (with --node) or from the secured port (with --server).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The node to read through the API server's node proxy.
    #[arg(long, global = true)]
    node: Option<String>,
    /// The agent's secured port (`https://<node-ip>:10250`), read directly.
    #[arg(long, global = true)]
    server: Option<String>,
    /// The CA of the secured port's certificate (with --server).
    #[arg(long, global = true)]
    certificate_authority: Option<PathBuf>,
    /// Do not check the secured port's certificate (with --server).
    #[arg(long, global = true)]
    insecure_skip_tls_verify: bool,
}

/// A way to the agent.
pub enum Transport {
    /// The node-local socket.
    Local(evlet::server::local::Client),
    /// An API client: the API server's node proxy, or the secured port.
    Api {
        /// The client.
        client: kube::Client,
        /// What the agent's paths are prefixed with (the node proxy's path).
        prefix: String,
        /// Where, for messages.
        shown: String,
    },
}

/// How long an answer may take.
const ANSWER: Duration = Duration::from_secs(10);

impl Target {
    /// The transport these flags ask for.
    ///
    /// # Errors
    /// Flags that do not go together, or a kubeconfig or CA that cannot be read.
    pub async fn connect(&self) -> Result<Transport> {
        let Some(kubeconfig) = &self.kubeconfig else {
            if self.node.is_some() || self.server.is_some() {
                bail!(
                    "--node and --server need --kubeconfig (the credentials to read the agent with)"
                );
            }
            if !self.socket.exists() {
                bail!(
                    "no evlet socket at {}: run `evlet diag` on the node as root (--socket <root-dir>/evlet.sock if evlet runs with another --root-dir), or read the agent from elsewhere with --kubeconfig and --node or --server",
                    self.socket.display()
                );
            }
            return Ok(Transport::Local(evlet::server::local::Client::new(
                self.socket.clone(),
            )));
        };
        let file = kube::config::Kubeconfig::read_from(kubeconfig)
            .with_context(|| format!("reading {}", kubeconfig.display()))?;
        let mut config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .with_context(|| format!("using {}", kubeconfig.display()))?;
        let (prefix, shown) = match (&self.node, &self.server) {
            (Some(node), None) => (
                format!("/api/v1/nodes/{node}/proxy"),
                format!("node {node} through {}", config.cluster_url),
            ),
            (None, Some(server)) => {
                config.cluster_url = server
                    .parse()
                    .with_context(|| format!("--server {server}: not a URL"))?;
                config.accept_invalid_certs = self.insecure_skip_tls_verify;
                config.tls_server_name = None;
                config.root_cert = match &self.certificate_authority {
                    Some(ca) => Some(read_ca(ca)?),
                    None => None,
                };
                (String::new(), server.clone())
            }
            _ => bail!(
                "with --kubeconfig, give --node (through the API server) or --server (the secured port)"
            ),
        };
        let client = kube::Client::try_from(config).context("building the API client")?;
        Ok(Transport::Api {
            client,
            prefix,
            shown,
        })
    }
}

/// The certificates of a PEM file, as DER.
fn read_ca(path: &std::path::Path) -> Result<Vec<Vec<u8>>> {
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let certs: Vec<Vec<u8>> = rustls_pemfile::certs(&mut pem.as_slice())
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("{}: not PEM certificates", path.display()))?;
    if certs.is_empty() {
        bail!("{}: no certificate", path.display());
    }
    Ok(certs)
}

impl Transport {
    /// Status and body of `GET <path>` on the agent.
    ///
    /// # Errors
    /// The agent cannot be reached or does not answer in 10 s.
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        match self {
            Transport::Local(client) => {
                let (status, body) = tokio::time::timeout(ANSWER, client.get(path))
                    .await
                    .context("evlet did not answer in 10 s")?
                    .with_context(|| {
                        format!(
                            "cannot reach evlet at {} (is it running? --socket)",
                            client.path().display()
                        )
                    })?;
                Ok((status, String::from_utf8_lossy(&body).into_owned()))
            }
            Transport::Api {
                client,
                prefix,
                shown,
            } => {
                let request = http::Request::get(format!("{prefix}{path}"))
                    .body(kube::client::Body::empty())?;
                let response = tokio::time::timeout(ANSWER, client.send(request))
                    .await
                    .context("evlet did not answer in 10 s")?
                    .with_context(|| format!("cannot reach evlet at {shown}"))?;
                let status = response.status().as_u16();
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .with_context(|| format!("reading the answer of {shown}"))?
                    .to_bytes();
                Ok((status, String::from_utf8_lossy(&body).into_owned()))
            }
        }
    }
}
