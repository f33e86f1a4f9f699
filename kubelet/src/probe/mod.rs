//! The health checks themselves, as upstream's `pkg/probe`: an HTTP GET, a TCP
//! connect, a gRPC health check, a command run in the container. No pods here:
//! the [`prober`](crate::prober) runs these periodically for probes, and the
//! syncer for lifecycle hooks.
//!
//! Every check ends in an [`Outcome`], or a [`ProbeError`] when it could not
//! be run at all (upstream retries those and then discards them; they never
//! count toward a probe's thresholds).

pub mod exec;
pub mod grpc;
pub mod http;
pub mod tcp;

use std::time::Duration;

/// The agent's Kubernetes minor version in `User-Agent` headers (`kube-probe/1.35`).
pub const KUBE_VERSION: &str = "1.35";

/// The most of a check's output that is kept (upstream's 10 KiB).
pub const MAX_OUTPUT: usize = 10 * 1024;

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Healthy; the output (a response body, a command's output).
    Success(String),
    /// Healthy with something to say (an HTTP redirect not followed).
    Warning(String),
    /// Unhealthy; why (a status code, a refused connection, the output).
    Failure(String),
}

impl Outcome {
    /// Success or warning.
    pub fn healthy(&self) -> bool {
        !matches!(self, Outcome::Failure(_))
    }
}

/// A check that could not be run (a named port the container does not have,
/// a runtime that did not answer): not a verdict about the container.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProbeError(pub String);

/// What a probe or hook concluded, as upstream's `results.Result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Not yet known (a startup probe that has not finished).
    Unknown,
    /// Healthy.
    Success,
    /// Unhealthy.
    Failure,
}

/// The three kinds of container probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    /// Kills the container when it fails.
    Liveness,
    /// Drives the container's `ready`.
    Readiness,
    /// Holds back liveness and readiness until it succeeds; kills when it fails.
    Startup,
}

impl ProbeKind {
    /// Every kind, in the order upstream creates their workers.
    pub const ALL: [ProbeKind; 3] = [
        ProbeKind::Startup,
        ProbeKind::Readiness,
        ProbeKind::Liveness,
    ];

    /// `Liveness`, `Readiness`, `Startup` (event messages and metric labels).
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    /// The container's probe of this kind.
    pub fn of(
        self,
        c: &k8s_openapi::api::core::v1::Container,
    ) -> Option<&k8s_openapi::api::core::v1::Probe> {
        match self {
            ProbeKind::Liveness => c.liveness_probe.as_ref(),
            ProbeKind::Readiness => c.readiness_probe.as_ref(),
            ProbeKind::Startup => c.startup_probe.as_ref(),
        }
    }
}

/// The prober's verdicts about one pod's container instances (by container
/// ID: a restarted container starts with none). What status and SyncPod
/// read; the prober writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodProbes {
    verdicts: std::collections::BTreeMap<(String, ProbeKind), Verdict>,
}

impl PodProbes {
    /// The verdict of `kind` about container instance `id`, if any.
    pub fn get(&self, id: &str, kind: ProbeKind) -> Option<Verdict> {
        self.verdicts.get(&(id.to_owned(), kind)).copied()
    }

    /// Records a verdict; true if it changed.
    pub fn set(&mut self, id: &str, kind: ProbeKind, verdict: Verdict) -> bool {
        self.verdicts.insert((id.to_owned(), kind), verdict) != Some(verdict)
    }

    /// Forgets the verdict of `kind` about `id`.
    pub fn remove(&mut self, id: &str, kind: ProbeKind) {
        self.verdicts.remove(&(id.to_owned(), kind));
    }

    /// No verdicts at all.
    pub fn is_empty(&self) -> bool {
        self.verdicts.is_empty()
    }
}

/// A probe's or hook's port: a number, or the name of one of the container's
/// ports (upstream's `ResolveContainerPort`).
///
/// # Errors
/// `port "x" not found`, or `invalid port number: N`.
pub fn resolve_port(
    port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
    c: &k8s_openapi::api::core::v1::Container,
) -> Result<u16, ProbeError> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .ok_or_else(|| ProbeError(format!("port {name:?} not found")))?,
    };
    u16::try_from(number)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ProbeError(format!("invalid port number: {number}")))
}

/// Keeps the last `max` bytes' worth of whole characters of `bytes` as text.
pub fn tail_text(bytes: &[u8], max: usize) -> String {
    let start = bytes.len().saturating_sub(max);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

/// Keeps the first `max` bytes of `bytes` as text.
pub fn head_text(bytes: &[u8], max: usize) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(max)]).into_owned()
}

/// `host:port`, with brackets around an IPv6 address (Go's `net.JoinHostPort`).
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Connects a TCP socket to `host:port` within `timeout`. (Upstream's probe
/// dialer also sets a 1 s `SO_LINGER`; here that would block a runtime thread
/// on every close, so sockets close normally.)
///
/// # Errors
/// The connection error in Go's words (`dial tcp 10.0.0.2:80: connect:
/// connection refused`), or `i/o timeout`.
pub async fn dial(
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<tokio::net::TcpStream, String> {
    let addr = join_host_port(host, port);
    let connect = async {
        let resolved = tokio::net::lookup_host(&addr)
            .await
            .map_err(|e| format!("dial tcp: lookup {host}: {e}"))?
            .next()
            .ok_or_else(|| format!("dial tcp: lookup {host}: no such host"))?;
        let socket = if resolved.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        }
        .map_err(|e| format!("dial tcp {addr}: socket: {e}"))?;
        socket
            .connect(resolved)
            .await
            .map_err(|e| format!("dial tcp {addr}: connect: {}", go_error(&e)))
    };
    match tokio::time::timeout(timeout, connect).await {
        Ok(r) => r,
        Err(_) => Err(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// An IO error worded as Go's syscall errors (`connection refused`).
fn go_error(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::ConnectionReset => "connection reset by peer".into(),
        std::io::ErrorKind::TimedOut => "connection timed out".into(),
        _ => {
            let text = e.to_string();
            // "No route to host (os error 113)" → "no route to host"
            let text = text.split(" (os error").next().unwrap_or(&text);
            let mut chars = text.chars();
            chars
                .next()
                .map(|c| c.to_lowercase().chain(chars).collect())
                .unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_hosts_get_brackets() {
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
        assert_eq!(join_host_port("fd00::1", 80), "[fd00::1]:80");
        assert_eq!(join_host_port("[fd00::1]", 80), "[fd00::1]:80");
    }

    #[test]
    fn ports_resolve_by_number_or_name() {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let c: k8s_openapi::api::core::v1::Container = serde_json::from_value(
            serde_json::json!({"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}),
        )
        .expect("container");
        assert_eq!(resolve_port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert_eq!(
            resolve_port(&IntOrString::String("grpc".into()), &c),
            Err(ProbeError("port \"grpc\" not found".into()))
        );
        assert_eq!(
            resolve_port(&IntOrString::Int(70000), &c),
            Err(ProbeError("invalid port number: 70000".into()))
        );
    }

    #[test]
    fn verdicts_are_per_container_instance() {
        let mut p = PodProbes::default();
        assert!(p.set("a", ProbeKind::Readiness, Verdict::Failure));
        assert!(
            !p.set("a", ProbeKind::Readiness, Verdict::Failure),
            "unchanged"
        );
        assert!(p.set("a", ProbeKind::Readiness, Verdict::Success));
        assert_eq!(p.get("b", ProbeKind::Readiness), None);
        assert_eq!(p.get("a", ProbeKind::Liveness), None);
    }

    #[tokio::test]
    async fn a_refused_connection_reads_as_go_says_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let err = dial("127.0.0.1", port, Duration::from_secs(1))
            .await
            .expect_err("nothing listens");
        assert_eq!(
            err,
            format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
        );
    }
}
