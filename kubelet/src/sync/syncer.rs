//! [`Syncer`]: executes SyncPod actions and pod termination against the runtime.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use evlet_cri::{ContainerId, RuntimeClient, SandboxId};
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::actions::{self, PodActions, Target};
use super::objects::EnvObjects;
use super::recorder::EventRecorder;
use super::spec::{self, ContainerContext, NodeContext};
use crate::backoff::Backoff;
use crate::lock::lock;
use crate::pod;
use crate::runtime::{Kind, PodStatus, State};
use crate::status::Waiting;

/// Upstream's `minimumGracePeriodInSeconds`: SIGKILL never comes sooner.
pub const MIN_GRACE: Duration = Duration::from_secs(2);

/// What one sync did and when the worker should sync again.
#[derive(Debug, Clone, Default)]
pub struct SyncOutcome {
    /// Containers that could not be started, by name.
    pub waiting: BTreeMap<String, Waiting>,
    /// Sync again no later than this (a backoff expiring).
    pub retry_after: Option<Duration>,
    /// Runtime calls were made (the pod's state changed).
    pub changed: bool,
    /// The pod failed for good (an init container failed under `restartPolicy: Never`).
    pub failed: bool,
}

/// An error that ended a sync early.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A CRI call failed.
    #[error(transparent)]
    Runtime(#[from] evlet_cri::Error),
    /// The pod's volumes could not be prepared.
    #[error("{0}")]
    Volumes(String),
    /// The sync was cancelled (the pod is being terminated).
    #[error("sync cancelled")]
    Cancelled,
}

/// Carries out SyncPod actions and terminations.
#[derive(Debug)]
pub struct Syncer {
    client: RuntimeClient,
    node: NodeContext,
    /// CrashLoopBackOff per `<uid>/<container>`.
    crash: Mutex<Backoff>,
    /// Image pull backoff per `<uid>/<image>`.
    pulls: Mutex<Backoff>,
    /// Where Kubernetes-style events go (Pulled, Created, Started, Killing, BackOff).
    events: Arc<dyn EventRecorder>,
    /// The ConfigMaps and Secrets referenced by env (the API server, or none).
    objects: Arc<dyn EnvObjects>,
}

impl Syncer {
    /// A syncer over `client` for node `node`, reading env objects from
    /// `objects` and recording events in `events`.
    pub fn new(
        client: RuntimeClient,
        node: NodeContext,
        objects: Arc<dyn EnvObjects>,
        events: Arc<dyn EventRecorder>,
    ) -> Self {
        Self {
            client,
            node,
            crash: Mutex::new(Backoff::containers()),
            pulls: Mutex::new(Backoff::new(
                Duration::from_secs(10),
                Duration::from_secs(300),
            )),
            events,
            objects,
        }
    }

    fn event(&self, pod: &Pod, container: &str, kind: &str, reason: &str, message: String) {
        self.events.record(crate::diagnostics::Event::about(
            pod,
            Some(container),
            kind,
            reason,
            message,
        ));
    }

    /// The node context.
    pub fn node(&self) -> &NodeContext {
        &self.node
    }

    /// Forgets backoff state of a deleted pod, and expired entries.
    pub fn forget(&self, uid: &pod::PodUid) {
        let prefix = format!("{uid}/");
        lock(&self.crash).forget_prefix(&prefix);
        lock(&self.pulls).forget_prefix(&prefix);
    }

    /// Drops backoff entries idle for 10 minutes.
    pub fn gc(&self) {
        let now = Instant::now();
        lock(&self.crash).gc(now);
        lock(&self.pulls).gc(now);
    }

    /// Moves the pod's runtime state toward its spec (upstream's `SyncPod`).
    ///
    /// # Errors
    /// A runtime failure that stops the sync (the worker retries with backoff);
    /// per-container failures are reported in [`SyncOutcome::waiting`] instead.
    pub async fn sync_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        cancel: &CancellationToken,
    ) -> Result<SyncOutcome, SyncError> {
        let actions = actions::compute(pod, status);
        let mut outcome = SyncOutcome {
            failed: actions.init_failed,
            ..Default::default()
        };
        if actions == PodActions::default()
            || actions
                == (PodActions {
                    sandbox: actions.sandbox.clone(),
                    ..Default::default()
                })
        {
            return Ok(outcome);
        }
        tracing::debug!(pod = %pod::key(pod), ?actions, "syncing pod");
        if actions.kill_pod {
            outcome.changed = true;
            self.kill_pod(pod, status, None).await?;
            if !actions.create_sandbox {
                return Ok(outcome);
            }
        }
        for k in &actions.kill {
            if cancel.is_cancelled() {
                return Err(SyncError::Cancelled);
            }
            tracing::info!(pod = %pod::key(pod), container = %k.name, reason = %k.reason, "killing container");
            outcome.changed = true;
            self.kill_container(pod, &k.id, &k.name, None).await?;
        }
        let sandbox = if actions.create_sandbox {
            spec::prepare_volumes(&self.node, pod).map_err(SyncError::Volumes)?;
            let log_dir = spec::log_dir(&self.node, pod);
            if let Err(e) = std::fs::create_dir_all(&log_dir) {
                tracing::warn!(dir = %log_dir.display(), %e, "cannot create pod log directory");
            }
            outcome.changed = true;
            let config = spec::sandbox_config(&self.node, pod, actions.attempt);
            let id = self.client.run_pod_sandbox(config, "").await?;
            tracing::info!(pod = %pod::key(pod), sandbox = %id.short(), attempt = actions.attempt, "sandbox started");
            id
        } else {
            match actions.sandbox.clone() {
                Some(id) => id,
                None => return Ok(outcome),
            }
        };
        let pod_ip = if actions.create_sandbox {
            self.client
                .pod_sandbox_status(&sandbox, false)
                .await?
                .status
                .and_then(|s| s.network)
                .map(|n| n.ip)
        } else {
            status.ip().map(str::to_owned)
        };
        let sandbox_config = spec::sandbox_config(
            &self.node,
            pod,
            actions
                .attempt
                .max(status.sandboxes.first().map_or(0, |s| s.attempt)),
        );
        let spec = pod.spec.clone().unwrap_or_default();
        for target in &actions.start {
            if cancel.is_cancelled() {
                return Err(SyncError::Cancelled);
            }
            let (c, kind) = match *target {
                Target::Init(i) => {
                    let Some(c) = spec.init_containers.as_ref().and_then(|v| v.get(i)) else {
                        continue;
                    };
                    (
                        c,
                        if pod::is_restartable_init(c) {
                            Kind::Sidecar
                        } else {
                            Kind::Init
                        },
                    )
                }
                Target::App(i) => {
                    let Some(c) = spec.containers.get(i) else {
                        continue;
                    };
                    (c, Kind::App)
                }
            };
            match self
                .start_container(
                    pod,
                    status,
                    &sandbox,
                    &sandbox_config,
                    c,
                    kind,
                    pod_ip.as_deref(),
                )
                .await
            {
                Ok(()) => outcome.changed = true,
                Err(Start::Waiting(w, retry)) => {
                    tracing::info!(pod = %pod::key(pod), container = %c.name, reason = %w.reason, message = %w.message, "container not started");
                    if let Some(r) = retry {
                        outcome.retry_after = Some(outcome.retry_after.map_or(r, |o| o.min(r)));
                    }
                    outcome.waiting.insert(c.name.clone(), w);
                    // A regular init container that did not start blocks the rest.
                    if kind == Kind::Init {
                        break;
                    }
                }
                Err(Start::Runtime(e)) => return Err(e.into()),
            }
        }
        Ok(outcome)
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one call site; the arguments are the start's inputs"
    )]
    async fn start_container(
        &self,
        pod: &Pod,
        status: &PodStatus,
        sandbox: &SandboxId,
        sandbox_config: &evlet_cri::api::PodSandboxConfig,
        c: &Container,
        kind: Kind,
        pod_ip: Option<&str>,
    ) -> Result<(), Start> {
        let uid = pod::uid(pod);
        let previous = status.latest(&c.name);
        let restart_count = previous.map_or(0, |p| p.restart_count + 1);
        // CrashLoopBackOff: a container that exited before restarts only when its backoff expired.
        if let Some(prev) = previous.filter(|p| p.state == State::Exited) {
            let key = format!("{uid}/{}", c.name);
            let finished = crate::clock::instant_of(prev.finished_at);
            let now = Instant::now();
            let mut crash = lock(&self.crash);
            if crash.in_backoff_since(&key, finished, now) {
                let delay = crash.get(&key);
                let retry = crash
                    .retry_at(&key, finished)
                    .saturating_duration_since(now);
                drop(crash);
                self.event(
                    pod,
                    &c.name,
                    "Warning",
                    "BackOff",
                    format!(
                        "Back-off restarting failed container {} in pod {}",
                        c.name,
                        pod::full_name(pod)
                    ),
                );
                return Err(Start::Waiting(
                    Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message: format!(
                            "back-off {}s restarting failed container={} pod={}",
                            delay.as_secs(),
                            c.name,
                            pod::full_name(pod)
                        ),
                    },
                    Some(retry),
                ));
            }
            crash.next(&key, now);
        }
        self.ensure_image(pod, c, sandbox_config).await?;
        let config_error = |message: String| {
            Start::Waiting(
                Waiting {
                    reason: "CreateContainerConfigError".into(),
                    message,
                },
                Some(Duration::from_secs(10)),
            )
        };
        let refs = super::env::references(c);
        let objects = self
            .objects
            .fetch(pod::namespace(pod), &refs)
            .await
            .map_err(|e| config_error(e.to_string()))?;
        let ctx = ContainerContext {
            kind,
            restart_count,
            pod_ip,
            objects: &objects,
        };
        let config = spec::container_config(&self.node, pod, c, &ctx)
            .map_err(|e| config_error(e.to_string()))?;
        let id = match self
            .client
            .create_container(sandbox, config, sandbox_config.clone())
            .await
        {
            Ok(id) => id,
            Err(e) if e.is_retryable() => return Err(Start::Runtime(e)),
            Err(e) => {
                return Err(Start::Waiting(
                    Waiting {
                        reason: "CreateContainerError".into(),
                        message: e.message,
                    },
                    Some(Duration::from_secs(10)),
                ));
            }
        };
        self.event(
            pod,
            &c.name,
            "Normal",
            "Created",
            format!("Created container: {}", c.name),
        );
        if let Err(e) = self.client.start_container(&id).await {
            if e.is_retryable() {
                return Err(Start::Runtime(e));
            }
            return Err(Start::Waiting(
                Waiting {
                    reason: "RunContainerError".into(),
                    message: e.message,
                },
                Some(Duration::from_secs(10)),
            ));
        }
        tracing::info!(pod = %pod::key(pod), container = %c.name, id = %id.short(), restart_count, "container started");
        self.event(
            pod,
            &c.name,
            "Normal",
            "Started",
            format!("Started container {}", c.name),
        );
        Ok(())
    }

    async fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox_config: &evlet_cri::api::PodSandboxConfig,
    ) -> Result<(), Start> {
        let image = c.image.clone().unwrap_or_default();
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| pod::default_pull_policy(&image).into());
        let present = || async {
            self.client
                .image_status(&image)
                .await
                .map(|s| s.is_some())
                .map_err(Start::Runtime)
        };
        match policy.as_str() {
            "Never" => {
                if present().await? {
                    return Ok(());
                }
                return Err(Start::Waiting(
                    Waiting {
                        reason: "ErrImageNeverPull".into(),
                        message: format!(
                            "Container image {image:?} is not present with pull policy of Never"
                        ),
                    },
                    Some(Duration::from_secs(10)),
                ));
            }
            "IfNotPresent" if present().await? => {
                self.event(
                    pod,
                    &c.name,
                    "Normal",
                    "Pulled",
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(());
            }
            _ => {}
        }
        let key = format!("{}/{image}", pod::uid(pod));
        let now = Instant::now();
        {
            let pulls = lock(&self.pulls);
            if pulls.get(&key) > Duration::ZERO
                && pulls.in_backoff_since(&key, now - Duration::from_millis(1), now)
            {
                return Err(Start::Waiting(
                    Waiting {
                        reason: "ImagePullBackOff".into(),
                        message: format!("Back-off pulling image {image:?}"),
                    },
                    Some(pulls.get(&key)),
                ));
            }
        }
        match self
            .client
            .pull_image(&image, Some(sandbox_config.clone()))
            .await
        {
            Ok(_) => {
                lock(&self.pulls).forget_prefix(&key);
                self.event(
                    pod,
                    &c.name,
                    "Normal",
                    "Pulled",
                    format!("Successfully pulled image {image:?}"),
                );
                Ok(())
            }
            Err(e) => {
                self.event(
                    pod,
                    &c.name,
                    "Warning",
                    "Failed",
                    format!("Failed to pull image {image:?}: {}", e.message),
                );
                let mut pulls = lock(&self.pulls);
                pulls.next(&key, now);
                Err(Start::Waiting(
                    Waiting {
                        reason: "ErrImagePull".into(),
                        message: format!("failed to pull image {image:?}: {}", e.message),
                    },
                    Some(pulls.get(&key)),
                ))
            }
        }
    }

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

    /// Removes dead container instances beyond the newest per container name
    /// (upstream's per-pod container GC keeps one). Dead sandboxes stay until the
    /// pod is removed: removing one removes its containers, and the newest
    /// instance of a container (its restart count) may live in it.
    pub async fn gc_pod(&self, status: &PodStatus) {
        let mut seen = std::collections::HashSet::new();
        for c in &status.containers {
            if !seen.insert(c.name.as_str()) && c.state == State::Exited {
                let _ = self.client.remove_container(&c.id).await;
            }
        }
    }
}

/// Why a container did not start.
enum Start {
    /// Not started now; the pod status shows the reason; retry after the duration.
    Waiting(Waiting, Option<Duration>),
    /// The runtime is unavailable: abort the sync.
    Runtime(evlet_cri::Error),
}
