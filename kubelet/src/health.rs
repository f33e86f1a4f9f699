//! Health: why the node is not ready. The PLEG's health (`pleg::Health`) and
//! the runtime's (CRI `Status` every 5 s, [`watch_runtime`]) feed `/healthz`
//! and the Node's Ready condition, in upstream's words.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use evlet_cri::RuntimeClient;
use tokio_util::sync::CancellationToken;

use crate::lock::lock;

/// Upstream's runtime health check period (`runtimeState`).
pub const RUNTIME_CHECK: Duration = Duration::from_secs(5);

/// What a failing check says.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unhealthy {
    /// No full relist has succeeded yet.
    #[error("pleg has yet to be successful")]
    PlegNotYet,
    /// The last successful full relist is too old.
    #[error("pleg was last seen active {ago:?} ago; threshold is {threshold:?}")]
    PlegStale {
        /// Since the last successful full relist.
        ago: Duration,
        /// Upstream's 3 min, or twice the eBPF safety period.
        threshold: Duration,
    },
    /// The runtime does not answer CRI `Status`.
    #[error("container runtime is down: {0}")]
    RuntimeDown(#[source] Arc<evlet_cri::Error>),
    /// The runtime says it is not ready.
    #[error("container runtime not ready: RuntimeReady=false reason:{reason} message:{message}")]
    RuntimeNotReady {
        /// The runtime's reason.
        reason: String,
        /// The runtime's message.
        message: String,
    },
    /// The runtime's answer has no RuntimeReady condition.
    #[error("container runtime status check may not have completed yet")]
    RuntimeUnknown,
}

/// Why the node is not ready: the check that fails, and how.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{check} is not healthy: {problem}")]
pub struct NotReady {
    /// `PLEG` or `runtime`.
    pub check: &'static str,
    /// What it says.
    #[source]
    pub problem: Unhealthy,
}

/// Named health checks beyond the PLEG's, kept by their loops.
#[derive(Debug, Default)]
pub struct Checks {
    results: Mutex<Vec<(&'static str, Result<(), Unhealthy>)>>,
}

impl Checks {
    /// Records the newest result of check `name`.
    pub fn set(&self, name: &'static str, result: Result<(), Unhealthy>) {
        let mut results = lock(&self.results);
        results.retain(|(n, _)| *n != name);
        results.push((name, result));
    }

    /// Every check's newest result.
    pub fn results(&self) -> Vec<(&'static str, Result<(), Unhealthy>)> {
        lock(&self.results).clone()
    }

    /// The first failing check.
    ///
    /// # Errors
    /// [`NotReady`] naming it.
    pub fn ready(&self) -> Result<(), NotReady> {
        for (check, result) in self.results() {
            result.map_err(|problem| NotReady { check, problem })?;
        }
        Ok(())
    }
}

/// Is the runtime up and `RuntimeReady`?
///
/// # Errors
/// [`Unhealthy`] in upstream's words.
pub fn runtime_health(
    status: Result<evlet_cri::api::StatusResponse, evlet_cri::Error>,
) -> Result<(), Unhealthy> {
    let status = status.map_err(|e| Unhealthy::RuntimeDown(Arc::new(e)))?;
    let ready = status
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.r#type == "RuntimeReady");
    match ready {
        Some(c) if c.status => Ok(()),
        Some(c) => Err(Unhealthy::RuntimeNotReady {
            reason: c.reason.clone(),
            message: c.message.clone(),
        }),
        None => Err(Unhealthy::RuntimeUnknown),
    }
}

/// Keeps the `runtime` check (in `/healthz` and the node's Ready condition)
/// every [`RUNTIME_CHECK`] until `shutdown`.
pub async fn watch_runtime(
    client: RuntimeClient,
    checks: Arc<Checks>,
    shutdown: CancellationToken,
) {
    let mut tick = crate::clock::Ticks::every(RUNTIME_CHECK);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tick.tick() => {}
        }
        let health = runtime_health(client.status(false).await);
        if let Err(e) = &health {
            tracing::warn!(error = %e, "container runtime is unhealthy");
        }
        checks.set("runtime", health);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use evlet_cri::api::{RuntimeCondition, RuntimeStatus, StatusResponse};

    fn status(ready: bool) -> Result<StatusResponse, evlet_cri::Error> {
        Ok(StatusResponse {
            status: Some(RuntimeStatus {
                conditions: vec![RuntimeCondition {
                    r#type: "RuntimeReady".into(),
                    status: ready,
                    reason: if ready { "" } else { "ShimDown" }.into(),
                    message: String::new(),
                }],
            }),
            ..Default::default()
        })
    }

    #[test]
    fn the_runtime_is_healthy_only_when_it_says_runtime_ready() {
        assert!(runtime_health(status(true)).is_ok());
        let err = runtime_health(status(false)).expect_err("not ready");
        assert!(
            err.to_string()
                .contains("RuntimeReady=false reason:ShimDown"),
            "{err}"
        );
        let none = runtime_health(Ok(StatusResponse::default())).expect_err("no conditions");
        assert!(
            none.to_string().contains("may not have completed"),
            "{none}"
        );
    }
}
