//! Lifecycle hooks (`postStart`, `preStop`), as upstream's `HandlerRunner`:
//! `exec` through CRI `ExecSync` (no timeout of its own, no `$(VAR)`
//! expansion), `httpGet` to the pod IP (any answer is fine, only a transport
//! error fails), `sleep`. `tcpSocket` passes validation but, as upstream, it
//! cannot be run: the hook fails with upstream's "invalid handler" message.

use std::time::Duration;

use evlet_cri::ContainerId;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use super::Syncer;
use crate::pod;
use crate::probe::http;

/// Upstream's `format.Pod`: `name_namespace(uid)`.
fn pod_ref(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod::name(pod),
        pod::namespace(pod),
        pod::uid(pod)
    )
}

impl Syncer {
    /// Runs `handler` for container instance `id` of `c`.
    ///
    /// # Errors
    /// Why the hook failed, in upstream's words (never shown in events: it may
    /// hold a secret; it goes to the log and the container's waiting message).
    pub(super) async fn run_hook(
        &self,
        pod: &Pod,
        c: &Container,
        id: &ContainerId,
        handler: &LifecycleHandler,
        pod_ip: Option<&str>,
    ) -> Result<(), String> {
        let who = format!("for Container {:?} in Pod {:?}", c.name, pod_ref(pod));
        if let Some(exec) = &handler.exec {
            let cmd = exec.command.clone().unwrap_or_default();
            return match self.client.exec_sync(id, cmd.clone(), Duration::ZERO).await {
                Ok(out) if out.exit_code == 0 => Ok(()),
                Ok(out) => {
                    let output =
                        String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned();
                    Err(format!(
                        "Exec lifecycle hook ({cmd:?}) {who} failed - error: command {:?} exited with {}, message: {output:?}",
                        cmd.join(" "),
                        out.exit_code
                    ))
                }
                Err(e) => Err(format!(
                    "Exec lifecycle hook ({cmd:?}) {who} failed - error: {e}, message: \"\""
                )),
            };
        }
        if let Some(get) = &handler.http_get {
            let path = get.path.clone().unwrap_or_default();
            let request = http::Request::for_action(get, c, pod_ip, http::Purpose::Lifecycle)
                .map_err(|e| format!("HTTP lifecycle hook ({path}) {who} failed - error: {e}"))?;
            return http::hook(&request)
                .await
                .map_err(|e| format!("HTTP lifecycle hook ({path}) {who} failed - error: {e}"));
        }
        if let Some(sleep) = &handler.sleep {
            tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
            return Ok(());
        }
        Err(format!(
            "Cannot run handler: invalid handler: {}",
            if handler.tcp_socket.is_some() {
                "tcpSocket handlers are not supported (deprecated)"
            } else {
                "no handler"
            }
        ))
    }
}
