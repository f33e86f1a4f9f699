//! [`Syncer`]: executes SyncPod actions and pod termination against the runtime.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use evlet_cri::{RuntimeClient, SandboxId};
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::actions::{self, PodActions, Target};
use super::objects::EnvObjects;
use super::spec::{self, ContainerContext, NodeContext};
use crate::backoff::Backoff;
use crate::diagnostics::EventRecorder;
use crate::lock::lock;
use crate::metrics::Metrics;
use crate::pod;
use crate::probe::{PodProbes, ProbeKind};
use crate::runtime::{Kind, PodStatus, State};
use crate::status::Waiting;
use crate::volume::{PodVolumes, VolumeManager};

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
    /// The pod's volumes could not be torn down (a mount is busy).
    #[error("tearing down the pod's volumes: {0}")]
    TearDown(#[source] std::io::Error),
    /// The finished pod's cgroup could not be removed yet.
    #[error("removing the pod's cgroup: {0}")]
    Cgroup(#[source] crate::cm::CgroupError),
    /// The sync was cancelled (the pod is being terminated).
    #[error("sync cancelled")]
    Cancelled,
}

/// Carries out SyncPod actions and terminations.
#[derive(Debug)]
pub struct Syncer {
    pub(super) client: RuntimeClient,
    pub(super) node: NodeContext,
    /// CrashLoopBackOff per `<uid>/<container>`.
    pub(super) crash: Mutex<Backoff>,
    /// Image pull backoff per `<uid>/<image>`.
    pub(super) pulls: Mutex<Backoff>,
    /// Where Kubernetes-style events go (Pulled, Created, Started, Killing, BackOff).
    pub(super) events: Arc<dyn EventRecorder>,
    /// The ConfigMaps and Secrets referenced by env (the API server, or none).
    pub(super) objects: Arc<dyn EnvObjects>,
    /// Sets up and tears down the pods' volumes.
    pub(super) volumes: Arc<VolumeManager>,
    /// Makes the pods' cgroups with their limits.
    cgroups: Arc<crate::cm::CgroupManager>,
    /// Image pulls at once (`serializeImagePulls`: 1).
    pub(super) pull_slots: tokio::sync::Semaphore,
    /// Pod starts at once (`parallel_pod_starts`): a sync that creates a
    /// sandbox holds one until its containers are started.
    start_slots: tokio::sync::Semaphore,
    /// `kubelet_started_*`.
    pub(super) metrics: Arc<Metrics>,
}

impl Syncer {
    /// A syncer over `client` for node `node`, reading env objects from
    /// `objects`, mounting volumes with `volumes` and recording events in
    /// `events`, counting starts in `metrics`.
    pub fn new(
        client: RuntimeClient,
        node: NodeContext,
        objects: Arc<dyn EnvObjects>,
        volumes: Arc<VolumeManager>,
        cgroups: Arc<crate::cm::CgroupManager>,
        events: Arc<dyn EventRecorder>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let pull_slots = tokio::sync::Semaphore::new(node_pulls(&node));
        let start_slots = tokio::sync::Semaphore::new(
            node.parallel_pod_starts
                .clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
        );
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
            volumes,
            cgroups,
            pull_slots,
            start_slots,
            metrics,
        }
    }

    /// Adds to `pod`'s timeline (`evlet diag pod`).
    pub fn trace(&self, pod: &Pod, source: crate::diagnostics::Source, what: String) {
        self.events.trace(&pod::uid(pod).0, source, what);
    }

    /// Names `pod`'s timeline.
    pub fn name_pod(&self, pod: &Pod) {
        self.events
            .name_pod(&pod::uid(pod).0, pod::namespace(pod), pod::name(pod));
    }

    /// The pods' volumes.
    pub fn volumes(&self) -> &VolumeManager {
        &self.volumes
    }

    /// The pods' cgroup tree.
    pub fn cgroups(&self) -> &crate::cm::CgroupManager {
        &self.cgroups
    }

    pub(super) fn event(
        &self,
        pod: &Pod,
        container: &str,
        kind: &str,
        reason: &str,
        message: String,
    ) {
        self.events.record(crate::diagnostics::Event::about(
            pod,
            Some(container),
            kind,
            reason,
            message,
        ));
    }

    /// Records an event about the pod itself.
    pub(super) fn pod_event(&self, pod: &Pod, kind: &str, reason: &str, message: String) {
        self.events.record(crate::diagnostics::Event::about(
            pod, None, kind, reason, message,
        ));
    }

    /// Records an event about `pod` (for the pod workers).
    pub fn record_pod_event(&self, pod: &Pod, kind: &str, reason: &str, message: String) {
        self.pod_event(pod, kind, reason, message);
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
        hashes: &actions::SpecHashes,
        probes: &PodProbes,
        cancel: &CancellationToken,
    ) -> Result<SyncOutcome, SyncError> {
        let actions = actions::compute_with(pod, status, hashes, probes);
        let mut outcome = SyncOutcome {
            failed: actions.init_failed,
            ..Default::default()
        };
        // Volumes first, on every sync of a pod that runs (upstream's
        // WaitForAttachAndMount): changed ConfigMaps, Secrets and tokens reach
        // the files, and nothing starts without its data.
        let volumes = if !actions.kill_pod || actions.create_sandbox {
            match self.volumes.set_up(pod).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(pod = %pod::key(pod), volume = %e.volume(), error = %e, "volumes not ready; containers wait");
                    self.events.record(crate::diagnostics::Event::about(
                        pod,
                        None,
                        "Warning",
                        "FailedMount",
                        e.to_string(),
                    ));
                    outcome.retry_after = Some(VOLUME_RETRY);
                    return Ok(outcome);
                }
            }
        } else {
            PodVolumes::default()
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
            let grace = k.probe.and_then(|kind| probe_grace(pod, &k.name, kind));
            self.kill_container(pod, &k.id, &k.name, &k.reason, grace)
                .await?;
        }
        let attempt = if actions.create_sandbox {
            actions.attempt
        } else {
            actions
                .attempt
                .max(status.sandboxes.first().map_or(0, |s| s.attempt))
        };
        let sandbox_config = match spec::sandbox_config(&self.node, pod, attempt) {
            Ok(c) => c,
            Err(e) => {
                self.pod_event(
                    pod,
                    "Warning",
                    "FailedCreatePodSandBox",
                    format!("Failed to create pod sandbox: {e}"),
                );
                outcome.retry_after = Some(Duration::from_secs(10));
                return Ok(outcome);
            }
        };
        // A new sandbox waits for a start slot before its runtime deadline
        // starts: hundreds of RunPodSandbox calls at once only make each
        // slower (the runtime's CPU is the limit) until they time out.
        let mut start_slot = if actions.create_sandbox {
            tokio::select! {
                permit = self.start_slots.acquire() => permit.ok(),
                () = cancel.cancelled() => return Err(SyncError::Cancelled),
            }
        } else {
            None
        };
        let sandbox = if actions.create_sandbox {
            let log_dir = spec::log_dir(&self.node, pod);
            if let Err(e) = std::fs::create_dir_all(&log_dir) {
                tracing::warn!(dir = %log_dir.display(), %e, "cannot create pod log directory");
            }
            if let Ok((_, warnings)) = crate::dns::resolver(pod, &self.node.dns) {
                for w in warnings {
                    self.pod_event(pod, "Warning", w.reason, w.message);
                }
            }
            let handler = match self.objects.runtime_handler(pod).await {
                Ok(h) => h,
                Err(e) => {
                    self.pod_event(
                        pod,
                        "Warning",
                        "FailedCreatePodSandBox",
                        format!("Failed to create pod sandbox: {e}"),
                    );
                    outcome.retry_after = Some(Duration::from_secs(10));
                    return Ok(outcome);
                }
            };
            // The pod's cgroup with its spec's limits, before the runtime
            // puts the sandbox under it (upstream's `EnsureExists`).
            if let Err(e) = self.cgroups.ensure_pod(pod).await {
                self.pod_event(
                    pod,
                    "Warning",
                    "FailedCreatePodContainer",
                    format!("unable to ensure pod container exists: {e}"),
                );
                outcome.retry_after = Some(Duration::from_secs(10));
                return Ok(outcome);
            }
            outcome.changed = true;
            // Upstream counts the attempt, and a failure as an error.
            self.metrics.started_pods.inc();
            let asked = Instant::now();
            let id = match self
                .client
                .run_pod_sandbox(sandbox_config.clone(), &handler)
                .await
            {
                Ok(id) => id,
                Err(e) if e.is_retryable() => {
                    self.metrics.started_pods_errors.inc();
                    return Err(e.into());
                }
                Err(e) => {
                    self.metrics.started_pods_errors.inc();
                    self.pod_event(
                        pod,
                        "Warning",
                        "FailedCreatePodSandBox",
                        format!("Failed to create pod sandbox: {}", e.message),
                    );
                    outcome.retry_after = Some(Duration::from_secs(10));
                    return Ok(outcome);
                }
            };
            tracing::info!(pod = %pod::key(pod), sandbox = %id.short(), attempt = actions.attempt, "sandbox started");
            self.trace(
                pod,
                crate::diagnostics::Source::Cri,
                format!(
                    "RunPodSandbox: sandbox {} ready in {} ms",
                    id.short(),
                    asked.elapsed().as_millis()
                ),
            );
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
            let started = self
                .start_container(
                    pod,
                    status,
                    &sandbox,
                    &sandbox_config,
                    c,
                    kind,
                    pod_ip.as_deref(),
                    &volumes,
                    &mut start_slot,
                )
                .await;
            self.count_start(kind, &started);
            match started {
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

    /// `kubelet_started_containers_*` as upstream counts them: every attempt
    /// past the crash-loop backoff, and a failure by its waiting reason
    /// (`ErrImagePull`, `CreateContainerError`, `RunContainerError`, …).
    fn count_start(&self, kind: Kind, started: &Result<(), Start>) {
        let kind = crate::metrics::container_type(kind != Kind::App);
        let code = match started {
            Err(Start::Waiting(w, _)) if w.reason == "CrashLoopBackOff" => return,
            Ok(()) => None,
            Err(Start::Waiting(w, _)) => Some(w.reason.as_str()),
            // The runtime failed in a way worth retrying at once: upstream
            // would report the step's error; the start itself did not happen.
            Err(Start::Runtime(_)) => Some("RunContainerError"),
        };
        self.metrics
            .started_containers
            .with_label_values(&[kind])
            .inc();
        if let Some(code) = code {
            self.metrics
                .started_containers_errors
                .with_label_values(&[kind, code])
                .inc();
        }
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
        volumes: &PodVolumes,
        start_slot: &mut Option<tokio::sync::SemaphorePermit<'_>>,
    ) -> Result<(), Start> {
        let uid = pod::uid(pod);
        let previous = status.latest(&c.name);
        let restart_count = previous.map_or(0, |p| p.restart_count + 1);
        // CrashLoopBackOff: a container that exited before restarts only when its backoff expired.
        if let Some(prev) = previous.filter(|p| p.state == State::Exited) {
            // Keyed by the container's spec hash too, as upstream's
            // `getStableKey`: a changed container (a new image) starts with a
            // fresh back-off.
            let key = crash_key(&uid, c);
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
        let present = self
            .ensure_image(pod, c, sandbox_config, start_slot)
            .await?;
        let config_error = |message: String| {
            Start::Waiting(
                Waiting {
                    reason: "CreateContainerConfigError".into(),
                    message,
                },
                Some(Duration::from_secs(10)),
            )
        };
        if let Some(false) = pod.spec.as_ref().and_then(|s| s.host_users) {
            // User namespaces need ID mappings evlet does not make yet: refuse
            // rather than run the pod in the host's user namespace.
            return Err(config_error(
                "can't set `spec.hostUsers: false`: evlet does not support user namespaces".into(),
            ));
        }
        let image_user = match present {
            Some(image) => super::security::ImageUser::of(Some(image)),
            None => self.image_user(c).await.map_err(Start::Runtime)?,
        };
        super::security::verify_run_as_non_root(pod, c, &image_user)
            .map_err(|e| config_error(e.to_string()))?;
        let refs = super::env::references(c);
        let objects = self
            .objects
            .fetch(pod::namespace(pod), &refs)
            .await
            .map_err(|e| config_error(e.to_string()))?;
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let services = self
            .objects
            .service_env(pod::namespace(pod), links, !pod::is_static(pod))
            .await
            .map_err(|e| config_error(e.to_string()))?;
        let termination_log = match spec::termination_message_path(c) {
            Some(_) => Some(
                termination_log(&self.node, pod, &c.name)
                    .map_err(|e| config_error(e.to_string()))?,
            ),
            None => None,
        };
        // subPathExpr expands from the container's own env.
        let env: std::collections::BTreeMap<String, String> = if c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.sub_path_expr.as_deref().is_some_and(|e| !e.is_empty()))
        {
            let rt = super::env::Runtime {
                pod_ip,
                host_ip: self.node.host_ip.as_deref(),
                objects: &objects,
                services: &services,
                allocatable: self.node.allocatable,
            };
            super::env::build(pod, c, &rt)
                .map_err(|e| config_error(e.to_string()))?
                .into_iter()
                .collect()
        } else {
            Default::default()
        };
        let mut mounts = self
            .volumes
            .container_mounts(c, volumes, &env)
            .map_err(|e| config_error(e.to_string()))?;
        if let Some(hosts) =
            hosts_file(&self.node, pod, c, pod_ip).map_err(|e| config_error(e.to_string()))?
        {
            mounts.push(hosts);
        }
        let ctx = ContainerContext {
            kind,
            restart_count,
            pod_ip,
            objects: &objects,
            services: &services,
            termination_log: termination_log.as_deref(),
            mounts: &mounts,
        };
        let config = spec::container_config(&self.node, pod, c, &ctx)
            .map_err(|e| config_error(e.to_string()))?;
        let asked = Instant::now();
        let created = self
            .client
            .create_container(sandbox, config, sandbox_config.clone())
            .await;
        self.trace(
            pod,
            crate::diagnostics::Source::Cri,
            format!(
                "CreateContainer {}: {} in {} ms",
                c.name,
                created
                    .as_ref()
                    .map_or_else(|e| e.to_string(), |id| id.short().to_owned()),
                asked.elapsed().as_millis()
            ),
        );
        let id = match created {
            Ok(id) => {
                self.events
                    .name_container(&pod::uid(pod).0, id.as_str(), &c.name);
                id
            }
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
        self.link_log(pod, &c.name, &id, restart_count);
        let asked = Instant::now();
        let started = self.client.start_container(&id).await;
        self.trace(
            pod,
            crate::diagnostics::Source::Cri,
            format!(
                "StartContainer {} {}: {} in {} ms",
                c.name,
                id.short(),
                started
                    .as_ref()
                    .map_or_else(|e| e.to_string(), |()| "ok".into()),
                asked.elapsed().as_millis()
            ),
        );
        if let Err(e) = started {
            // A created container that did not start keeps a `runc init` in
            // its cgroup: remove it now rather than leave it to the next sync
            // or GC (CRI's RemoveContainer also removes one that did start
            // after all, say after a timeout; the next sync starts it again).
            match self.client.remove_container(&id).await {
                Err(rm) if !rm.is_not_found() => {
                    tracing::warn!(pod = %pod::key(pod), container = %c.name, id = %id.short(), error = %rm, "cannot remove a container that did not start");
                }
                _ => {
                    if let Some(dir) = &self.node.container_log_links {
                        let _ = std::fs::remove_file(spec::log_link(
                            dir,
                            pod::name(pod),
                            pod::namespace(pod),
                            &c.name,
                            id.as_str(),
                        ));
                    }
                }
            }
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
        // postStart runs before the sync ends, so the container is not shown
        // running before its hook finished (upstream).
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref())
            && let Err(message) = self.run_hook(pod, c, &id, hook, pod_ip).await
        {
            tracing::warn!(pod = %pod::key(pod), container = %c.name, error = %message, "postStart hook failed");
            // The message may hold a secret: the event does not carry it (upstream).
            self.event(
                pod,
                &c.name,
                "Warning",
                "FailedPostStartHook",
                "PostStartHook failed".into(),
            );
            if let Err(e) = self
                .kill_container(pod, &id, &c.name, "FailedPostStartHook", None)
                .await
            {
                tracing::warn!(pod = %pod::key(pod), container = %c.name, error = %e, "cannot kill a container whose postStart hook failed");
            }
            return Err(Start::Waiting(
                Waiting {
                    reason: "PostStartHookError".into(),
                    message,
                },
                None,
            ));
        }
        Ok(())
    }

    /// The user the container's image runs as (for `runAsNonRoot`), read
    /// from the runtime (after a pull: [`Self::ensure_image`] read no status).
    async fn image_user(
        &self,
        c: &Container,
    ) -> Result<super::security::ImageUser, evlet_cri::Error> {
        let image = c.image.clone().unwrap_or_default();
        let status = self.client.image_status(&image).await?;
        Ok(super::security::ImageUser::of(status))
    }

    /// Makes sure `c`'s image is present under its pull policy; returns the
    /// image's status when it was found present (its user is then known
    /// without a second `ImageStatus`), None after a pull.
    async fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox_config: &evlet_cri::api::PodSandboxConfig,
        start_slot: &mut Option<tokio::sync::SemaphorePermit<'_>>,
    ) -> Result<Option<evlet_cri::api::Image>, Start> {
        let image = c.image.clone().unwrap_or_default();
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| pod::default_pull_policy(&image).into());
        let status = || async {
            self.client
                .image_status(&image)
                .await
                .map_err(Start::Runtime)
        };
        match policy.as_str() {
            "Never" => {
                if let Some(found) = status().await? {
                    return Ok(Some(found));
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
            "IfNotPresent" => {
                if let Some(found) = status().await? {
                    self.event(
                        pod,
                        &c.name,
                        "Normal",
                        "Pulled",
                        format!("Container image {image:?} already present on machine"),
                    );
                    return Ok(Some(found));
                }
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
        // A pull can take minutes: other pods start meanwhile.
        start_slot.take();
        let credentials = self.pull_credentials(pod, c, &image).await;
        self.event(
            pod,
            &c.name,
            "Normal",
            "Pulling",
            format!("Pulling image {image:?}"),
        );
        // serializeImagePulls / maxParallelImagePulls.
        let _turn = self.pull_slots.acquire().await;
        let uid = pod::uid(pod).0;
        self.metrics.startup.pulling(&uid, crate::clock::unix_ns());
        let mut result = Err(evlet_cri::Error {
            call: "PullImage",
            object: Some(image.clone()),
            kind: evlet_cri::ErrorKind::Other,
            message: "no attempt".into(),
        });
        let attempts: Vec<Option<evlet_cri::api::AuthConfig>> = if credentials.is_empty() {
            vec![None]
        } else {
            credentials
                .into_iter()
                .map(|c| {
                    Some(evlet_cri::api::AuthConfig {
                        username: c.username,
                        password: c.password,
                        auth: c.auth,
                        server_address: c.server,
                        ..Default::default()
                    })
                })
                .collect()
        };
        for auth in attempts {
            result = self
                .client
                .pull_image(&image, auth, Some(sandbox_config.clone()))
                .await;
            if result.is_ok() {
                break;
            }
        }
        self.metrics.startup.pulled(&uid, crate::clock::unix_ns());
        match result {
            Ok(_) => {
                lock(&self.pulls).forget_prefix(&key);
                self.event(
                    pod,
                    &c.name,
                    "Normal",
                    "Pulled",
                    format!("Successfully pulled image {image:?}"),
                );
                Ok(None)
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
}

impl Syncer {
    /// The registry credentials of the pod's `imagePullSecrets` for `image`.
    /// Secrets that cannot be read are reported (upstream's
    /// `FailedToRetrieveImagePullSecret`) and the pull is tried without them.
    async fn pull_credentials(
        &self,
        pod: &Pod,
        c: &Container,
        image: &str,
    ) -> Vec<crate::credentials::Credential> {
        let names: std::collections::BTreeSet<String> = pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Vec::new();
        }
        let refs = super::env::References {
            secrets: names.clone(),
            ..Default::default()
        };
        let objects = self
            .objects
            .fetch(pod::namespace(pod), &refs)
            .await
            .unwrap_or_default();
        let missing: Vec<&str> = names
            .iter()
            .filter(|n| !objects.secrets.contains_key(*n))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            self.pod_event(
                pod,
                "Warning",
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    missing.join(", ")
                ),
            );
        }
        let mut keyring = crate::credentials::Keyring::default();
        for (name, data) in &objects.secrets {
            if let Err(e) = keyring.add_secret(name, data) {
                self.event(pod, &c.name, "Warning", "Failed", e.to_string());
            }
        }
        keyring.lookup(image)
    }
}

impl Syncer {
    /// Links the new container's log where log shippers look (upstream's
    /// `/var/log/containers/<pod>_<namespace>_<container>-<id>.log`).
    fn link_log(
        &self,
        pod: &Pod,
        container: &str,
        id: &evlet_cri::ContainerId,
        restart_count: u32,
    ) {
        let Some(dir) = &self.node.container_log_links else {
            return;
        };
        let link = spec::log_link(
            dir,
            pod::name(pod),
            pod::namespace(pod),
            container,
            id.as_str(),
        );
        let target = spec::log_path(&self.node, pod, container, restart_count);
        let made = std::fs::create_dir_all(dir).and_then(|()| {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&target, &link)
        });
        if let Err(e) = made {
            tracing::warn!(link = %link.display(), error = %e, "cannot link the container's log");
        }
    }
}

/// The CrashLoopBackOff key of container `c` of pod `uid`: `<uid>/<name>/<spec
/// hash>` (upstream's `getStableKey` has the spec hash too), under the pod's
/// `<uid>/` prefix that [`Syncer::forget`] drops.
fn crash_key(uid: &pod::PodUid, c: &Container) -> String {
    format!("{uid}/{}/{}", c.name, spec::container_hash(c))
}

/// The permits of the image pull semaphore.
fn node_pulls(node: &NodeContext) -> usize {
    node.parallel_image_pulls
        .clamp(1, tokio::sync::Semaphore::MAX_PERMITS)
}

/// How soon a pod whose volumes are not ready is synced again.
const VOLUME_RETRY: Duration = Duration::from_secs(3);

/// A new, empty termination message file for an instance of container
/// `name`: `<root>/pods/<uid>/containers/<name>/<8 hex>`, mode 0666 so any
/// user in the container can write it (upstream).
fn termination_log(
    node: &spec::NodeContext,
    pod: &Pod,
    name: &str,
) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = spec::container_dir(node, pod, name);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{:08x}", fastrand::u32(..)));
    std::fs::File::create(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    Ok(path)
}

/// The grace period of a kill because probe `kind` failed: the probe's own
/// `terminationGracePeriodSeconds`, unless the pod is being deleted with a
/// grace period of its own (upstream's `setTerminationGracePeriod`).
fn probe_grace(pod: &Pod, name: &str, kind: ProbeKind) -> Option<i64> {
    if pod.metadata.deletion_grace_period_seconds.is_some() {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let c = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)?;
    kind.of(c)?.termination_grace_period_seconds
}

/// Why a container did not start.
enum Start {
    /// Not started now; the pod status shows the reason; retry after the duration.
    Waiting(Waiting, Option<Duration>),
    /// The runtime is unavailable: abort the sync.
    Runtime(evlet_cri::Error),
}

/// The kubelet-managed `/etc/hosts` of a container, written into the pod's
/// directory (upstream: only once the pod has an IP, and not for a
/// container that mounts its own `/etc/hosts`).
pub fn hosts_file(
    node: &NodeContext,
    pod: &Pod,
    c: &Container,
    pod_ip: Option<&str>,
) -> std::io::Result<Option<evlet_cri::api::Mount>> {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let ips: Vec<String> = match (host_network, pod_ip) {
        (true, _) => node.host_ip.iter().cloned().collect(),
        (false, Some(ip)) => vec![ip.to_owned()],
        (false, None) => Vec::new(),
    };
    if ips.is_empty()
        || c.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/etc/hosts")
    {
        return Ok(None);
    }
    let Ok(names) = crate::dns::names(pod, &node.dns.cluster_domain) else {
        return Ok(None);
    };
    let node_hosts = if host_network {
        Some(std::fs::read_to_string("/etc/hosts")?)
    } else {
        None
    };
    let text = crate::dns::hosts_file(pod, &names, &ips, node_hosts.as_deref());
    let dir = spec::pod_dir(node, pod);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("etc-hosts");
    std::fs::write(&path, text)?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    Ok(Some(evlet_cri::api::Mount {
        container_path: "/etc/hosts".into(),
        host_path: path.display().to_string(),
        ..Default::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_container_gets_a_fresh_crash_back_off() {
        let uid = pod::PodUid::from("u1");
        let c: Container =
            serde_json::from_value(serde_json::json!({"name": "app", "image": "busybox"}))
                .expect("container");
        let mut updated = c.clone();
        updated.image = Some("nginx".into());
        assert_eq!(crash_key(&uid, &c), crash_key(&uid, &c.clone()));
        assert_ne!(crash_key(&uid, &c), crash_key(&uid, &updated));
        assert!(
            crash_key(&uid, &c).starts_with("u1/app/"),
            "forget's prefix"
        );
    }
}
