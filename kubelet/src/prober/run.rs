//! One attempt of a probe spec against a container instance, as upstream's
//! `prober.runProbeWithRetries`: an attempt that could not run at all (a
//! named port the container lacks, a runtime that did not answer) is tried
//! up to three times and then reported as an error, which is never counted.

use std::time::Duration;

use evlet_cri::{ContainerId, RuntimeClient};
use k8s_openapi::api::core::v1::{Container, Probe};

use crate::probe::{self, Outcome, ProbeError};

/// Attempts of a probe that could not run (upstream's `maxProbeRetries`).
const TRIES: usize = 3;

/// Probes container instance `id` of `c` (in a pod at `ip`) with `p`.
///
/// # Errors
/// [`ProbeError`] if three attempts could not run the probe.
pub async fn attempt(
    client: &RuntimeClient,
    c: &Container,
    p: &Probe,
    id: &str,
    ip: Option<&str>,
) -> Result<Outcome, ProbeError> {
    let mut last = ProbeError("no attempt".into());
    for _ in 0..TRIES {
        match once(client, c, p, id, ip).await {
            Ok(outcome) => return Ok(outcome),
            Err(e) => last = e,
        }
    }
    Err(last)
}

async fn once(
    client: &RuntimeClient,
    c: &Container,
    p: &Probe,
    id: &str,
    ip: Option<&str>,
) -> Result<Outcome, ProbeError> {
    let timeout = Duration::from_secs(super::worker::Timing::of(p).timeout);
    let no_ip = || ProbeError("the pod has no IP yet".into());
    if let Some(exec) = &p.exec {
        // Only literal env values reach the command (upstream's
        // ExpandContainerCommandOnlyStatic).
        let env = crate::vars::static_env(c);
        let cmd = exec
            .command
            .iter()
            .flatten()
            .map(|a| crate::vars::expand(a, &env))
            .collect();
        return probe::exec::check(client, &ContainerId::new(id), cmd, timeout).await;
    }
    if let Some(http) = &p.http_get {
        let request = probe::http::Request::for_action(http, c, ip, probe::http::Purpose::Probe)?;
        return Ok(probe::http::check(&request, timeout).await);
    }
    if let Some(tcp) = &p.tcp_socket {
        let port = probe::resolve_port(&tcp.port, c)?;
        let host = tcp
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .or_else(|| ip.map(str::to_owned))
            .ok_or_else(no_ip)?;
        return Ok(probe::tcp::check(&host, port, timeout).await);
    }
    if let Some(grpc) = &p.grpc {
        let port = u16::try_from(grpc.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| ProbeError(format!("invalid port number: {}", grpc.port)))?;
        let host = ip.ok_or_else(no_ip)?;
        let service = grpc.service.as_deref().unwrap_or("");
        return Ok(probe::grpc::check(host, port, service, timeout).await);
    }
    Err(ProbeError(format!(
        "missing probe handler for container {}",
        c.name
    )))
}
