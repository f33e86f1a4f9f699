//! Pod termination over CRI: preStop hooks, SIGTERM, SIGKILL after the grace
//! period, removal of a terminated pod's containers, sandboxes, directories and
//! cgroups, and per-pod container GC.

use std::time::Duration;

use evlet_cri::ContainerId;
use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use super::Syncer;
use super::spec;
use crate::pod;
use crate::runtime::{Kind, PodStatus, State};

/// Upstream's `minimumGracePeriodInSeconds`: SIGKILL never comes sooner.
pub const MIN_GRACE: Duration = Duration::from_secs(2);

impl Syncer {
    /// Stops one container: its preStop hook first (bounded by the grace
    /// period), then SIGTERM, then SIGKILL after what is left of the grace
    /// period (at least 2 s).
    ///
    /// # Errors
    /// The StopContainer failure (a container already gone is fine).
    pub async fn kill_container(
        &self,
        pod: &Pod,
        id: &ContainerId,
        name: &str,
        grace: Option<i64>,
    ) -> Result<(), evlet_cri::Error> {
        let grace =
            Duration::from_secs(grace.unwrap_or_else(|| pod::grace_period(pod)).max(0) as u64);
        self.event(
            pod,
            name,
            "Normal",
            "Killing",
            format!("Stopping container {name}"),
        );
        let started = Instant::now();
        let spec = pod.spec.as_ref();
        let container = spec.and_then(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .find(|c| c.name == name)
        });
        if let Some(pre_stop) = container
            .and_then(|c| c.lifecycle.as_ref())
            .and_then(|l| l.pre_stop.as_ref())
            && !grace.is_zero()
        {
            let run = async {
                if let Some(cmd) = pre_stop.exec.as_ref().and_then(|e| e.command.clone()) {
                    match self.client.exec_sync(id, cmd, grace).await {
                        Ok(out) if out.exit_code != 0 => {
                            tracing::warn!(container = %name, exit_code = out.exit_code, "preStop hook failed")
                        }
                        Ok(_) => {
                            tracing::info!(pod = %pod::key(pod), container = %name, "preStop hook ran")
                        }
                        Err(e) => tracing::warn!(container = %name, %e, "preStop hook failed"),
                    }
                } else if let Some(sleep) = &pre_stop.sleep {
                    tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
                }
            };
            if tokio::time::timeout(grace, run).await.is_err() {
                tracing::warn!(container = %name, "preStop hook did not finish within the grace period");
            }
        }
        let remaining = grace
            .saturating_sub(started.elapsed())
            .max(if grace.is_zero() {
                Duration::ZERO
            } else {
                MIN_GRACE
            });
        match self.client.stop_container(id, remaining).await {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }

    /// Stops every running container of the pod (in parallel), then its sandboxes.
    ///
    /// # Errors
    /// The first StopContainer or StopPodSandbox failure.
    pub async fn kill_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        grace: Option<i64>,
    ) -> Result<(), evlet_cri::Error> {
        let running: Vec<_> = status
            .containers
            .iter()
            .filter(|c| matches!(c.state, State::Running | State::Created | State::Unknown))
            .collect();
        // Sidecars stop after the app containers, as upstream.
        let (sidecars, others): (Vec<_>, Vec<_>) =
            running.into_iter().partition(|c| c.kind == Kind::Sidecar);
        for group in [others, sidecars] {
            let results = futures_util::future::join_all(
                group
                    .iter()
                    .map(|c| self.kill_container(pod, &c.id, &c.name, grace)),
            )
            .await;
            results.into_iter().collect::<Result<Vec<()>, _>>()?;
        }
        for s in &status.sandboxes {
            if let Err(e) = self.client.stop_pod_sandbox(&s.id).await
                && !e.is_not_found()
            {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Removes every container and sandbox of a terminated pod, its volumes and cgroups.
    ///
    /// # Errors
    /// The first removal failure.
    pub async fn remove_pod(&self, pod: &Pod, status: &PodStatus) -> Result<(), evlet_cri::Error> {
        for c in &status.containers {
            if let Err(e) = self.client.remove_container(&c.id).await
                && !e.is_not_found()
            {
                return Err(e);
            }
        }
        for s in &status.sandboxes {
            self.client
                .stop_pod_sandbox(&s.id)
                .await
                .or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })?;
            self.client
                .remove_pod_sandbox(&s.id)
                .await
                .or_else(|e| if e.is_not_found() { Ok(()) } else { Err(e) })?;
        }
        let pod_dir = spec::pod_dir(&self.node, pod);
        if pod_dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&pod_dir)
        {
            tracing::warn!(dir = %pod_dir.display(), %e, "cannot remove pod directory");
        }
        let logs = spec::log_dir(&self.node, pod);
        let _ = std::fs::remove_dir_all(logs);
        crate::cgroups::remove(&spec::pod_cgroup(&self.node, pod));
        self.forget(&pod::uid(pod));
        Ok(())
    }

    /// Removes the container instances [`evictable`] names. Dead sandboxes
    /// stay until the pod is removed: removing one removes its containers, and
    /// the newest instance of a container (its restart count) may live in it.
    pub async fn gc_pod(&self, status: &PodStatus) {
        for id in evictable(status) {
            let _ = self.client.remove_container(id).await;
        }
    }
}

/// Upstream's per-pod container GC (`MaxPerPodContainer` = 1): of each
/// container name's exited instances, the newest stays (the status's
/// `lastState` and `kubectl logs --previous` read it); older ones go.
pub fn evictable(status: &PodStatus) -> Vec<&ContainerId> {
    let mut kept = std::collections::HashSet::new();
    status
        .containers
        .iter()
        .filter(|c| c.state == State::Exited)
        .filter(|c| !kept.insert(c.name.as_str()))
        .map(|c| &c.id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodUid;
    use crate::runtime::ContainerStatus;

    fn instance(name: &str, n: i64, state: State) -> ContainerStatus {
        ContainerStatus {
            id: ContainerId::new(format!("{name}{n}")),
            name: name.into(),
            kind: Kind::App,
            state,
            created_at: n,
            started_at: n,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: String::new(),
            hash: String::new(),
            restart_count: 0,
            kernel: None,
        }
    }

    #[test]
    fn gc_keeps_the_newest_dead_instance_of_each_container() {
        let mut status = PodStatus::empty(PodUid::from("p"));
        status.containers = vec![
            instance("a", 4, State::Running),
            instance("a", 3, State::Exited),
            instance("a", 2, State::Exited),
            instance("a", 1, State::Exited),
            instance("b", 2, State::Exited),
        ];
        let ids: Vec<&str> = evictable(&status).iter().map(|i| i.as_str()).collect();
        assert_eq!(ids, ["a2", "a1"], "a3 stays: it is a's last state");
    }
}
