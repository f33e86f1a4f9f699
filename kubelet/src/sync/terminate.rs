//! Pod termination over CRI: preStop hooks, SIGTERM, SIGKILL after the grace
//! period, removal of a terminated pod's containers, sandboxes, directories and
//! cgroups, and per-pod container GC.

use std::time::Duration;

use evlet_cri::ContainerId;
use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use std::sync::Arc;

use super::spec;
use super::{SyncError, Syncer};
use crate::pod;
use crate::runtime::{Kind, PodStatus, State};

/// Upstream's `minimumGracePeriodInSeconds`: SIGKILL never comes sooner.
pub const MIN_GRACE: Duration = Duration::from_secs(2);

impl Syncer {
    /// Stops one container: its preStop hook first (bounded by the grace
    /// period), then SIGTERM, then SIGKILL after what is left of the grace
    /// period (at least 2 s). `message` is the `Killing` event's (empty:
    /// "Stopping container <name>").
    ///
    /// # Errors
    /// The StopContainer failure (a container already gone is fine).
    pub async fn kill_container(
        &self,
        pod: &Pod,
        id: &ContainerId,
        name: &str,
        message: &str,
        grace: Option<i64>,
    ) -> Result<(), evlet_cri::Error> {
        self.stop_container(pod, id, name, message, grace, None)
            .await
    }

    /// [`Self::kill_container`], with SIGTERM held back until `turn` resolves
    /// (sidecars wait for the app containers; the preStop hook does not wait).
    async fn stop_container(
        &self,
        pod: &Pod,
        id: &ContainerId,
        name: &str,
        message: &str,
        grace: Option<i64>,
        turn: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>>,
    ) -> Result<(), evlet_cri::Error> {
        let grace =
            Duration::from_secs(grace.unwrap_or_else(|| pod::grace_period(pod)).max(0) as u64);
        let message = if message.is_empty() {
            format!("Stopping container {name}")
        } else {
            message.to_owned()
        };
        self.event(pod, name, "Normal", "Killing", message);
        let started = Instant::now();
        let spec = pod.spec.as_ref();
        let container = spec.and_then(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .find(|c| c.name == name)
        });
        if let Some((c, pre_stop)) =
            container.and_then(|c| Some((c, c.lifecycle.as_ref()?.pre_stop.as_ref()?)))
            && !grace.is_zero()
        {
            let ip = self.pod_ip(pod).await;
            match tokio::time::timeout(grace, self.run_hook(pod, c, id, pre_stop, ip.as_deref()))
                .await
            {
                Ok(Ok(())) => {
                    tracing::info!(pod = %pod::key(pod), container = %name, "preStop hook ran")
                }
                Ok(Err(e)) => {
                    tracing::warn!(pod = %pod::key(pod), container = %name, error = %e, "preStop hook failed");
                    // The message may hold a secret: the event does not carry it (upstream).
                    self.event(
                        pod,
                        name,
                        "Warning",
                        "FailedPreStopHook",
                        "PreStopHook failed".into(),
                    );
                }
                Err(_) => {
                    tracing::warn!(pod = %pod::key(pod), container = %name, "preStop hook did not finish within the grace period")
                }
            }
        }
        if let Some(turn) = turn
            && !grace.is_zero()
        {
            let _ = tokio::time::timeout(grace.saturating_sub(started.elapsed()), turn).await;
        }
        let remaining = grace
            .saturating_sub(started.elapsed())
            .max(if grace.is_zero() {
                Duration::ZERO
            } else {
                MIN_GRACE
            });
        let asked = Instant::now();
        let result = self.client.stop_container(id, remaining).await;
        self.trace(
            pod,
            crate::diagnostics::Source::Cri,
            format!(
                "StopContainer {name} {} (timeout {} s): {} in {} ms",
                id.short(),
                remaining.as_secs(),
                result
                    .as_ref()
                    .map_or_else(|e| e.to_string(), |()| "ok".into()),
                asked.elapsed().as_millis()
            ),
        );
        match result {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }

    /// The pod's IP as the runtime reports it (for httpGet hooks).
    async fn pod_ip(&self, pod: &Pod) -> Option<String> {
        let uid = pod::uid(pod);
        let filter = evlet_cri::SandboxFilter::new().label(crate::pod::labels::POD_UID, uid.0);
        let sandbox = self
            .client
            .list_pod_sandbox(filter)
            .await
            .ok()?
            .into_iter()
            .max_by_key(|s| s.created_at)?;
        self.client
            .pod_sandbox_status(&evlet_cri::SandboxId::new(sandbox.id), false)
            .await
            .ok()?
            .status?
            .network
            .map(|n| n.ip)
            .filter(|ip| !ip.is_empty())
    }

    /// Stops every running container of the pod, then its sandboxes. All
    /// containers start stopping at once (their preStop hooks run at once);
    /// sidecars get SIGTERM only after every app container and every later
    /// sidecar has stopped, so they stop in reverse order (upstream's
    /// termination ordering).
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
        // Sidecars in reverse spec order; each waits for the app containers
        // and for the sidecars after it.
        let order: Vec<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .filter(|c| pod::is_restartable_init(c))
            .map(|c| c.name.as_str())
            .rev()
            .collect();
        let (done_tx, done_rx) = tokio::sync::watch::channel(0usize);
        let apps = running.iter().filter(|c| c.kind != Kind::Sidecar).count();
        let stops = running.iter().map(|c| {
            let done_tx = &done_tx;
            let mut done_rx = done_rx.clone();
            // How many stops must finish first: every app container, and the
            // sidecars after this one.
            let before = match order.iter().position(|n| *n == c.name) {
                Some(k) if c.kind == Kind::Sidecar => {
                    apps + running
                        .iter()
                        .filter(|o| o.kind == Kind::Sidecar)
                        .filter(|o| {
                            order
                                .iter()
                                .position(|n| *n == o.name)
                                .is_some_and(|j| j < k)
                        })
                        .count()
                }
                _ => 0,
            };
            async move {
                let turn: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
                    (before > 0).then(|| {
                        Box::pin(async move {
                            let _ = done_rx.wait_for(|n| *n >= before).await;
                        }) as _
                    });
                let result = self
                    .stop_container(pod, &c.id, &c.name, "", grace, turn)
                    .await;
                done_tx.send_modify(|n| *n += 1);
                result
            }
        });
        futures_util::future::join_all(stops)
            .await
            .into_iter()
            .collect::<Result<Vec<()>, _>>()?;
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
    /// The first removal failure, or a volume that could not be unmounted
    /// (the pod's directory stays then; the worker tries again).
    pub async fn remove_pod(&self, pod: &Pod, status: &PodStatus) -> Result<(), SyncError> {
        for c in &status.containers {
            if let Err(e) = self.client.remove_container(&c.id).await
                && !e.is_not_found()
            {
                return Err(e.into());
            }
            self.unlink_log(status, &c.name, &c.id);
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
        self.release_finished(pod).await?;
        let logs = spec::log_dir(&self.node, pod);
        let _ = std::fs::remove_dir_all(logs);
        self.forget(&pod::uid(pod));
        Ok(())
    }

    /// Frees what a pod that failed while running (evicted, past its active
    /// deadline) no longer needs, as upstream's `SyncTerminatedPod` does for
    /// a terminal pod: its volumes are unmounted and removed (an emptyDir's
    /// content with them) and its cgroup goes. Its stopped containers and
    /// sandbox stay for its status and logs until the pod is removed (an
    /// evicted pod's: until the container GC removes them).
    ///
    /// # Errors
    /// A volume that could not be unmounted, or a cgroup not yet removable
    /// (the worker tries again).
    pub async fn release_finished(&self, pod: &Pod) -> Result<(), SyncError> {
        let volumes = Arc::clone(&self.volumes);
        let uid = pod::uid(pod).0;
        tokio::task::spawn_blocking(move || volumes.tear_down(&uid))
            .await
            .map_err(|e| SyncError::TearDown(std::io::Error::other(e)))?
            .map_err(SyncError::TearDown)?;
        self.cgroups()
            .remove_pod(pod)
            .await
            .map_err(SyncError::Cgroup)
    }

    /// Removes the cgroups of the pods `uids`, which are gone (neither
    /// desired, nor worked on, nor in the runtime as last listed); one still
    /// busy is tried again in the next pass. One where a process runs is
    /// left alone: the runtime may still have that pod (a listing that
    /// missed it), which only its worker stops, gracefully.
    pub async fn remove_orphan_cgroups(&self, uids: &[String]) {
        for uid in uids {
            if self.cgroups().pod_has_processes(uid) {
                tracing::warn!(pod = %uid, "the cgroup of a pod that is gone still has processes; leaving it");
                continue;
            }
            tracing::info!(pod = %uid, "removing the cgroup of a pod that is gone");
            if let Err(e) = self.cgroups().remove_uid(uid).await {
                tracing::warn!(pod = %uid, error = %e, "cannot remove an orphaned pod cgroup");
            }
        }
    }

    /// Tears down the directories (and mounts) of pods that are gone: not in
    /// `keep` (the pods the agent knows, by UID). They are left by pods removed
    /// while the agent was down, or whose removal failed half-way.
    pub async fn clean_orphan_dirs(&self, keep: std::collections::BTreeSet<String>) {
        let volumes = Arc::clone(&self.volumes);
        let result = tokio::task::spawn_blocking(move || {
            for uid in volumes.pod_dirs() {
                if keep.contains(&uid) {
                    continue;
                }
                tracing::info!(pod = %uid, "removing the directory of a pod that is gone");
                if let Err(e) = volumes.tear_down(&uid) {
                    tracing::warn!(pod = %uid, error = %e, "cannot remove an orphaned pod directory");
                }
            }
        })
        .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "orphaned pod directory cleanup failed");
        }
    }

    /// Removes the dead container instances `ids` of the pod `status` (the
    /// container GC's choice) and their log links. Dead sandboxes stay until
    /// the pod is removed (an evicted pod's: until its containers are gone):
    /// removing one removes its containers, and the newest instance of a
    /// container (its restart count) may live in it.
    pub async fn remove_dead(&self, status: &PodStatus, ids: &[ContainerId]) {
        for id in ids {
            if self.client.remove_container(id).await.is_ok()
                && let Some(c) = status.containers.iter().find(|c| &c.id == id)
            {
                self.unlink_log(status, &c.name, id);
            }
        }
    }

    /// Removes the stopped sandboxes `ids` of an evicted pod (the container
    /// GC's choice, once the pod's containers are gone).
    pub async fn remove_sandboxes(&self, ids: &[evlet_cri::SandboxId]) {
        for id in ids {
            if let Err(e) = self.client.remove_pod_sandbox(id).await
                && !e.is_not_found()
            {
                tracing::warn!(sandbox = %id, error = %e, "cannot remove an evicted pod's sandbox");
            }
        }
    }

    /// Removes a removed container's log link.
    fn unlink_log(&self, status: &PodStatus, container: &str, id: &evlet_cri::ContainerId) {
        if let Some(dir) = &self.node.container_log_links {
            let link = spec::log_link(dir, &status.name, &status.namespace, container, id.as_str());
            let _ = std::fs::remove_file(link);
        }
    }
}
