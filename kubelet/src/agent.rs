//! The agent: wires sources, PLEG, pod workers and the HTTP endpoint together,
//! and runs the sync loop (upstream's `syncLoop`).
//!
//! The loop `select!`s over pod updates from the sources, PLEG events, finished
//! workers, the housekeeping tick (2 s: orphan pods, backoff GC) and the
//! container GC tick (1 min). It never blocks on the runtime: every runtime
//! call happens in a pod worker or the PLEG.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use evlet_cri::{Options, RuntimeClient};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::api::admission::{Allocatable, Usage};
use crate::api::pods::Mirrors;
use crate::api::status::StatusManager;
use crate::api::{self};
use crate::cache::{self, PodCache};
use crate::config::{self, Config, PlegMode};
use crate::diagnostics::Diagnostics;
use crate::metrics::{Metrics, ModeLabel};
use crate::pleg::ebpf::EbpfSource;
use crate::pleg::hints::Hints;
use crate::pleg::relist::{CHANNEL_CAPACITY, Relister};
use crate::pleg::{Health, PodLifecycleEvent, RELIST_THRESHOLD, cri_events, generic, hinted};
use crate::pod::{self, PodUid, labels};
use crate::runtime::Runtime;
use crate::server::{self, Served};
use crate::source::{self, Op, PodConfig, PodUpdate, Source, SourceMessage};
use crate::sync::Syncer;
use crate::sync::spec::NodeContext;
use crate::workers::{PodWorkers, UpdateKind};

/// Upstream's `housekeepingPeriod`.
pub const HOUSEKEEPING: Duration = Duration::from_secs(2);
/// Upstream's `ContainerGCPeriod`.
pub const CONTAINER_GC: Duration = Duration::from_secs(60);

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The root directory could not be created.
    #[error("root directory {path}: {source}")]
    RootDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The CRI endpoint is unusable.
    #[error("container runtime at {endpoint}: {source}")]
    Runtime {
        /// The endpoint.
        endpoint: String,
        /// The CRI error.
        #[source]
        source: evlet_cri::Error,
    },
    /// The HTTP endpoint could not be bound.
    #[error(transparent)]
    Http(#[from] std::io::Error),
}

/// A running agent's handles, for tests and the binary.
#[derive(Debug, Clone)]
pub struct Handles {
    /// The pod workers (views of every pod).
    pub workers: PodWorkers,
    /// The pod cache (read side).
    pub cache: PodCache,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// What the HTTP endpoint serves.
    pub served: Arc<Served>,
    /// OOM records and events.
    pub diagnostics: Arc<Diagnostics>,
    /// The eBPF source, in `ebpf` mode.
    pub ebpf: Option<Arc<EbpfSource>>,
    /// The hint set, in the hinted modes (tests ask it for counting relists).
    pub hints: Option<Arc<Hints>>,
}

/// The PLEG that got started.
struct Pleg {
    mode: PlegMode,
    /// Hint set of the hinted modes (None: generic).
    hints: Option<Arc<Hints>>,
    ebpf: Option<Arc<EbpfSource>>,
}

/// Starts the requested PLEG's hint source, or falls back to generic with one
/// clear log line saying why.
async fn start_pleg(
    config: &Config,
    client: &RuntimeClient,
    pods_cgroup: &str,
    cache: &PodCache,
    metrics: &Arc<Metrics>,
    diagnostics: &Arc<Diagnostics>,
    shutdown: &CancellationToken,
) -> Pleg {
    let generic = Pleg {
        mode: PlegMode::Generic,
        hints: None,
        ebpf: None,
    };
    match config.pleg_mode {
        PlegMode::Generic => {
            tracing::info!(
                "PLEG mode generic: relisting every {:?}",
                config.relist_period
            );
            generic
        }
        PlegMode::CriEvents => match cri_events::probe(client).await {
            Ok(()) => {
                let hints = Arc::new(Hints::default());
                tokio::spawn(cri_events::run(
                    client.clone(),
                    Arc::clone(&hints),
                    shutdown.child_token(),
                ));
                tracing::info!(
                    "PLEG mode cri-events: CRI container events as hints, relisting every {:?}",
                    config.relist_period
                );
                Pleg {
                    mode: PlegMode::CriEvents,
                    hints: Some(hints),
                    ebpf: None,
                }
            }
            Err(err) => {
                tracing::warn!(
                    "PLEG mode cri-events is unavailable ({err}); running generic (relist every {:?})",
                    config.relist_period
                );
                generic
            }
        },
        PlegMode::Ebpf => match EbpfSource::load(pods_cgroup, config.ebpf_ring_bytes) {
            Ok(source) => {
                let source = Arc::new(source);
                let hints = Arc::new(Hints::default());
                source.start(
                    Arc::clone(&hints),
                    Arc::clone(metrics),
                    cache.clone(),
                    Arc::clone(diagnostics),
                    shutdown.child_token(),
                );
                tracing::info!(hooks = %source.describe(), "PLEG mode ebpf: kernel events as hints, safety relist every {:?}", config.ebpf_relist_period);
                Pleg {
                    mode: PlegMode::Ebpf,
                    hints: Some(hints),
                    ebpf: Some(source),
                }
            }
            Err(err) => {
                tracing::warn!(
                    "PLEG mode ebpf is unavailable ({err}); running generic (relist every {:?})",
                    config.relist_period
                );
                generic
            }
        },
    }
}

/// Starts the agent; it runs until `shutdown` is cancelled.
///
/// # Errors
/// [`StartError`] if the root directory, the runtime or the HTTP address is unusable.
pub async fn start(
    config: Config,
    shutdown: CancellationToken,
) -> Result<(Handles, tokio::task::JoinHandle<()>), StartError> {
    std::fs::create_dir_all(&config.root_dir).map_err(|source| StartError::RootDir {
        path: config.root_dir.clone(),
        source,
    })?;
    let client =
        RuntimeClient::connect(&config.runtime_endpoint, Options::default()).map_err(|source| {
            StartError::Runtime {
                endpoint: config.runtime_endpoint.clone(),
                source,
            }
        })?;
    let version = client
        .version()
        .await
        .map_err(|source| StartError::Runtime {
            endpoint: config.runtime_endpoint.clone(),
            source,
        })?;
    tracing::info!(runtime = %version.runtime_name, version = %version.runtime_version, endpoint = %config.runtime_endpoint, node = %config.node_name, "connected to the container runtime");

    let metrics = Arc::new(Metrics::new());
    let diagnostics = Arc::new(Diagnostics::default());
    let (writer, cache) = cache::new();
    let (pleg_tx, pleg_rx) = mpsc::channel::<PodLifecycleEvent>(CHANNEL_CAPACITY);
    let runtime = Runtime::new(client.clone());
    let pods_cgroup = format!("{}/kubepods", config.cgroup_root.trim_end_matches('/'));
    let pleg = start_pleg(
        &config,
        &client,
        &pods_cgroup,
        &cache,
        &metrics,
        &diagnostics,
        &shutdown,
    )
    .await;
    let health = Arc::new(match pleg.mode {
        PlegMode::Ebpf => {
            Health::with_threshold(RELIST_THRESHOLD.max(config.ebpf_relist_period * 2))
        }
        _ => Health::default(),
    });
    metrics
        .pleg_mode
        .get_or_create(&ModeLabel {
            mode: pleg.mode.as_str().into(),
        })
        .set(1);
    let relister = Relister::new(
        runtime.clone(),
        writer,
        pleg_tx,
        Arc::clone(&metrics),
        Arc::clone(&health),
    );
    match &pleg.hints {
        None => {
            tokio::spawn(generic::run(
                relister,
                config.relist_period,
                shutdown.child_token(),
            ));
        }
        Some(hints) => {
            let period = if pleg.mode == PlegMode::Ebpf {
                config.ebpf_relist_period
            } else {
                config.relist_period
            };
            tokio::spawn(hinted::run(
                relister,
                Arc::clone(hints),
                pleg.ebpf.as_ref().map(|source| source.quiet()),
                hinted::Timing::new(period),
                Arc::clone(&metrics),
                shutdown.child_token(),
            ));
        }
    }
    let mode = pleg.mode;

    let machine = api::node::Machine::read(&config.root_dir);
    let node = NodeContext {
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
        pods_cgroup,
        host_ip: config.node_ip.clone(),
        memory_capacity: i64::try_from(machine.memory)
            .ok()
            .filter(|m| *m > 0)
            .unwrap_or(1 << 30),
    };
    let client_for_health = client.clone();
    let syncer = Arc::new(Syncer::new(client, node));
    syncer.set_events(Arc::clone(&diagnostics));
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let workers = PodWorkers::new(
        Arc::clone(&syncer),
        cache.clone(),
        Arc::clone(&metrics),
        done_tx,
        pleg.hints.clone(),
        config.sync_frequency,
        shutdown.child_token(),
    );

    let (src_tx, src_rx) = mpsc::channel::<SourceMessage>(64);
    let mut expected = Vec::new();
    if let Some(path) = &config.pod_manifest_path {
        expected.push(Source::File);
        let file = source::file::FileSource::new(path.clone(), config.node_name.clone());
        tokio::spawn(file.run(
            src_tx.clone(),
            config.file_check_frequency,
            shutdown.child_token(),
        ));
    }
    if let Some(url) = &config.manifest_url {
        expected.push(Source::Http);
        tokio::spawn(source::http::run(
            url.clone(),
            config.node_name.clone(),
            src_tx.clone(),
            config.http_check_frequency,
            shutdown.child_token(),
        ));
    }
    let api = config.api.as_ref().map(|c| {
        expected.push(Source::Api);
        let (mirrors_tx, mirrors_rx) = watch::channel(Mirrors::new());
        tokio::spawn(api::pods::run(
            c.0.clone(),
            config.node_name.clone(),
            src_tx.clone(),
            mirrors_tx,
            shutdown.child_token(),
        ));
        syncer.set_api(c.clone());
        let (events_tx, events_rx) = mpsc::channel(api::events::QUEUE);
        diagnostics.set_sink(events_tx);
        tokio::spawn(api::events::run(
            c.0.clone(),
            config.node_name.clone(),
            events_rx,
            shutdown.child_token(),
        ));
        let manager = StatusManager::new();
        workers.set_status_sink(Arc::clone(&manager));
        tokio::spawn(Arc::clone(&manager).run(c.0.clone(), shutdown.child_token()));
        (c.0.clone(), manager, mirrors_rx)
    });
    drop(src_tx);

    let served = Arc::new(Served {
        workers: workers.clone(),
        health: Arc::clone(&health),
        metrics: Arc::clone(&metrics),
        mode: std::sync::Mutex::new(mode.as_str().into()),
        sources_ready: Default::default(),
        checks: Default::default(),
        diagnostics: Arc::clone(&diagnostics),
    });
    server::serve(config.address, Arc::clone(&served), shutdown.child_token()).await?;
    tokio::spawn(watch_runtime(
        client_for_health,
        Arc::clone(&served),
        shutdown.child_token(),
    ));

    let allocatable = Allocatable {
        cpu_milli: i64::try_from(machine.cpus)
            .unwrap_or(i64::MAX)
            .saturating_mul(1000),
        memory: i64::try_from(machine.memory).unwrap_or(i64::MAX),
        pods: i64::from(config.max_pods),
    };
    let api = api.map(|(client, manager, mirrors_rx)| {
        let ready_served = Arc::clone(&served);
        let input = api::node::NodeInput {
            name: config.node_name.clone(),
            node_ip: config.node_ip.clone(),
            hostname: config::hostname(),
            max_pods: config.max_pods,
            taints: config.register_with_taints.clone(),
            root_dir: config.root_dir.clone(),
            runtime_version: format!("{}://{}", version.runtime_name, version.runtime_version),
            port: config.address.port(),
            ready: Arc::new(move || ready_served.ready()),
        };
        let (statics_tx, statics_rx) = watch::channel(api::mirror::Statics::new());
        tokio::spawn(run_node(
            client,
            input,
            statics_rx,
            mirrors_rx.clone(),
            shutdown.child_token(),
        ));
        tokio::spawn(forward_mirrors(mirrors_rx, Arc::clone(&manager)));
        ApiState {
            manager,
            statics: statics_tx,
            allocatable,
            rejected: BTreeSet::new(),
            finished: BTreeSet::new(),
        }
    });

    let sync_loop = SyncLoop {
        config: PodConfig::new(expected),
        pods: BTreeMap::new(),
        workers: workers.clone(),
        cache: cache.clone(),
        syncer,
        metrics: Arc::clone(&metrics),
        served: Arc::clone(&served),
        hints: pleg.hints.clone(),
        api,
    };
    let handles = Handles {
        workers,
        cache,
        metrics,
        served,
        diagnostics,
        ebpf: pleg.ebpf.clone(),
        hints: pleg.hints.clone(),
    };
    let task = tokio::spawn(sync_loop.run(src_rx, pleg_rx, done_rx, shutdown));
    Ok((handles, task))
}

/// The sync loop's state.
struct SyncLoop {
    /// Merge of the sources.
    config: PodConfig,
    /// Desired pods by UID (upstream's pod manager).
    pods: BTreeMap<PodUid, Pod>,
    workers: PodWorkers,
    cache: PodCache,
    syncer: Arc<Syncer>,
    metrics: Arc<Metrics>,
    served: Arc<Served>,
    /// The hinted PLEG's hints (agent-initiated removals are announced there).
    hints: Option<Arc<Hints>>,
    /// API-server mode.
    api: Option<ApiState>,
}

/// The sync loop's part of API-server mode.
struct ApiState {
    manager: Arc<StatusManager>,
    /// Static pods, for the mirror manager.
    statics: watch::Sender<api::mirror::Statics>,
    allocatable: Allocatable,
    /// Pods rejected at admission (never started).
    rejected: BTreeSet<PodUid>,
    /// Deleted pods whose containers are gone; waiting for the watch to drop them.
    finished: BTreeSet<PodUid>,
}

/// Upstream's runtime health check period (`runtimeState`).
const RUNTIME_CHECK: Duration = Duration::from_secs(5);

/// Is the runtime up and `RuntimeReady`? `Err` in upstream's words.
fn runtime_health(
    status: Result<evlet_cri::api::StatusResponse, evlet_cri::Error>,
) -> Result<(), String> {
    let status = status.map_err(|e| format!("container runtime is down: {e}"))?;
    let ready = status
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.r#type == "RuntimeReady");
    match ready {
        Some(c) if c.status => Ok(()),
        Some(c) => Err(format!(
            "container runtime not ready: RuntimeReady=false reason:{} message:{}",
            c.reason, c.message
        )),
        None => Err("container runtime status check may not have completed yet".into()),
    }
}

/// Keeps the `runtime` health check (in `/healthz` and the node's Ready condition).
async fn watch_runtime(client: RuntimeClient, served: Arc<Served>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(RUNTIME_CHECK);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let health = runtime_health(client.status(false).await);
        if let Err(e) = &health {
            tracing::warn!(error = %e, "container runtime is unhealthy");
        }
        let mut checks = served.checks.lock().unwrap_or_else(|p| p.into_inner());
        checks.retain(|(name, _)| name != "runtime");
        checks.push(("runtime".into(), health));
    }
}

/// Registers the node, then keeps its status, its lease and the mirror pods.
async fn run_node(
    client: kube::Client,
    input: api::node::NodeInput,
    statics: watch::Receiver<api::mirror::Statics>,
    mirrors: watch::Receiver<Mirrors>,
    shutdown: CancellationToken,
) {
    let Some(node) = api::node::register(&client, &input, &shutdown).await else {
        return;
    };
    let uid = node.metadata.uid.clone();
    tokio::spawn(api::node::run_lease(
        client.clone(),
        input.name.clone(),
        uid.clone(),
        shutdown.child_token(),
    ));
    tokio::spawn(api::mirror::run(
        client.clone(),
        input.name.clone(),
        uid,
        statics,
        mirrors,
        shutdown.child_token(),
    ));
    api::node::run_status(client, input, node, shutdown).await;
}

/// Tells the status manager which mirror pods exist.
async fn forward_mirrors(mut mirrors: watch::Receiver<Mirrors>, manager: Arc<StatusManager>) {
    while mirrors.changed().await.is_ok() {
        let current = mirrors.borrow_and_update().clone();
        manager.set_mirrors(&current);
    }
}

impl SyncLoop {
    async fn run(
        mut self,
        mut sources: mpsc::Receiver<SourceMessage>,
        mut pleg: mpsc::Receiver<PodLifecycleEvent>,
        mut done: mpsc::UnboundedReceiver<PodUid>,
        shutdown: CancellationToken,
    ) {
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
        let mut gc = tokio::time::interval(CONTAINER_GC);
        let mut sources_open = true;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => {
                    tracing::info!("sync loop stopping; pods keep running");
                    return;
                }
                msg = sources.recv(), if sources_open => match msg {
                    Some(SourceMessage::Snapshot(source, pods)) => {
                        let updates = self.config.merge(source, pods);
                        self.handle_updates(source, updates);
                    }
                    Some(SourceMessage::Changes { source, upserts, removed }) => {
                        let updates = self.config.apply(source, upserts, removed);
                        self.handle_updates(source, updates);
                    }
                    Some(SourceMessage::Error(_, _)) => {
                        self.metrics.manifest_errors.inc();
                    }
                    None => sources_open = false,
                },
                Some(event) = pleg.recv() => self.handle_pleg(event),
                Some(uid) = done.recv() => {
                    self.workers.forget(&uid);
                    if let Some(api) = &mut self.api
                        && let Some(pod) = self.pods.get(&uid)
                        && pod.metadata.deletion_timestamp.is_some()
                        && pod::annotations(pod).get(labels::CONFIG_SOURCE).map(String::as_str) == Some("api")
                    {
                        // Graceful deletion done: the final DELETE (grace 0).
                        api.manager.delete(pod);
                        api.finished.insert(uid);
                        continue;
                    }
                    if let Some(pod) = self.pods.get(&uid).cloned() {
                        // Re-added while terminating: start it again.
                        self.workers.update(pod, UpdateKind::Sync);
                    }
                }
                _ = housekeeping.tick() => self.housekeeping(),
                _ = gc.tick() => self.container_gc(),
            }
        }
    }

    fn handle_updates(&mut self, source: Source, updates: Vec<PodUpdate>) {
        for update in updates {
            self.handle_update(update);
        }
        if source != Source::Api {
            // Static pods come from the file and HTTP sources only.
            self.publish_statics();
        }
        self.served
            .sources_ready
            .store(self.config.sources_ready(), Ordering::Relaxed);
    }

    fn handle_update(&mut self, update: PodUpdate) {
        // What admitted pods use, summed once per update, not once per pod.
        let mut usage = None;
        for pod in update.pods {
            let uid = pod::uid(&pod);
            if update.source == Source::Api && self.api_handled(update.op, &pod, &mut usage) {
                continue;
            }
            match update.op {
                Op::Add | Op::Update => {
                    tracing::info!(pod = %pod::key(&pod), source = update.source.as_str(), op = ?update.op, "pod update");
                    self.pods.insert(uid, pod.clone());
                    let kind = match pod.metadata.deletion_timestamp {
                        Some(_) => UpdateKind::Kill(pod.metadata.deletion_grace_period_seconds),
                        None => UpdateKind::Sync,
                    };
                    self.workers.update(pod, kind);
                }
                Op::Remove => {
                    if let Some(api) = &mut self.api {
                        api.manager.forget(&uid);
                        if api.finished.remove(&uid) {
                            self.pods.remove(&uid);
                            continue;
                        }
                    }
                    tracing::info!(pod = %pod::key(&pod), source = update.source.as_str(), "pod removed from its source; terminating");
                    self.pods.remove(&uid);
                    self.workers.update(pod, UpdateKind::Kill(None));
                }
                Op::Reconcile => {
                    self.pods.insert(uid, pod);
                }
            }
        }
    }

    /// API pods the sync loop settles itself: rejected or already terminal pods
    /// are not started. True if `pod` needs nothing more.
    fn api_handled(&mut self, op: Op, pod: &Pod, usage: &mut Option<Usage>) -> bool {
        let Some(api) = &mut self.api else {
            return false;
        };
        let uid = pod::uid(pod);
        if api.rejected.contains(&uid) {
            match op {
                Op::Remove => {
                    api.rejected.remove(&uid);
                    api.manager.forget(&uid);
                    self.workers.forget(&uid);
                }
                _ if pod.metadata.deletion_timestamp.is_some() => api.manager.delete(pod),
                _ => {}
            }
            return true;
        }
        if op != Op::Add || self.workers.has(&uid) {
            return false;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed"))
            && pod.metadata.deletion_timestamp.is_none()
        {
            // Finished before (e.g. before a restart of evlet): not run again.
            tracing::info!(pod = %pod::key(pod), phase = ?phase, "API pod is terminal; not starting it");
            api.rejected.insert(uid);
            return true;
        }
        let used = usage.get_or_insert_with(|| {
            Usage::of(
                self.pods
                    .iter()
                    .filter(|(u, _)| !api.rejected.contains(*u))
                    .map(|(_, p)| p),
            )
        });
        match api::admission::admit(pod, used, &api.allocatable) {
            Ok(()) => false,
            Err(rejection) => {
                tracing::warn!(pod = %pod::key(pod), reason = %rejection.reason, message = %rejection.message, "pod rejected at admission");
                api.rejected.insert(uid);
                let status = crate::status::compute(
                    pod,
                    &crate::runtime::PodStatus::empty(pod::uid(pod)),
                    &crate::status::Extra {
                        rejected: Some((&rejection.reason, &rejection.message)),
                        start_time: Some(crate::status::now()),
                        ..Default::default()
                    },
                );
                self.workers.set_view(pod.clone(), status);
                true
            }
        }
    }

    /// Sends the static pods to the mirror manager.
    fn publish_statics(&self) {
        if let Some(api) = &self.api {
            let statics: api::mirror::Statics = self
                .pods
                .values()
                .filter(|p| pod::is_static(p))
                .map(|p| {
                    (
                        (pod::namespace(p).to_owned(), pod::name(p).to_owned()),
                        p.clone(),
                    )
                })
                .collect();
            api.statics.send_if_modified(|current| {
                let changed = *current != statics;
                if changed {
                    *current = statics;
                }
                changed
            });
        }
    }

    fn handle_pleg(&mut self, event: PodLifecycleEvent) {
        if event.kind == crate::pleg::EventType::ContainerRemoved {
            return;
        }
        if let Some(pod) = self.pods.get(&event.uid) {
            self.workers.update(pod.clone(), UpdateKind::Sync);
        }
    }

    /// Orphans: pods the runtime has that no source wants and no worker owns.
    /// Only once every source has reported (`sourcesReady`), like upstream.
    fn housekeeping(&mut self) {
        self.syncer.gc();
        if !self.config.sources_ready() {
            return;
        }
        let desired: BTreeSet<&PodUid> = self.pods.keys().collect();
        for status in self.cache.known() {
            if desired.contains(&status.uid) || self.workers.has(&status.uid) {
                continue;
            }
            let running = status.any_running() || status.sandboxes.iter().any(|s| s.ready);
            tracing::info!(pod = %status.uid, name = %status.name, namespace = %status.namespace, running, "removing orphaned pod");
            let orphan = orphan_pod(&status);
            self.workers.update(orphan, UpdateKind::Kill(None));
        }
    }

    fn container_gc(&mut self) {
        for status in self.cache.known() {
            let mut names = BTreeSet::new();
            let extra = status
                .containers
                .iter()
                .any(|c| !names.insert(c.name.as_str()));
            if extra {
                let syncer = Arc::clone(&self.syncer);
                let hints = self.hints.clone();
                tokio::spawn(async move {
                    // The agent's own removals must not look like external changes.
                    if let Some(h) = &hints {
                        h.suspend(status.uid.clone());
                    }
                    syncer.gc_pod(&status).await;
                    if let Some(h) = &hints {
                        h.resume(status.uid.clone(), true);
                    }
                });
            }
        }
    }
}

/// A pod object for a runtime pod the agent has no spec of: enough to terminate
/// and remove it (grace period from its containers' annotation, else 30 s).
fn orphan_pod(status: &crate::runtime::PodStatus) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some(status.name.clone());
    pod.metadata.namespace = Some(status.namespace.clone());
    pod.metadata.uid = Some(status.uid.0.clone());
    pod.metadata.annotations =
        Some([(labels::CONFIG_SOURCE.to_owned(), "orphan".to_owned())].into());
    pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        termination_grace_period_seconds: Some(30),
        ..Default::default()
    });
    pod
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
        assert_eq!(runtime_health(status(true)), Ok(()));
        let err = runtime_health(status(false)).expect_err("not ready");
        assert!(err.contains("RuntimeReady=false reason:ShimDown"), "{err}");
        let none = runtime_health(Ok(StatusResponse::default())).expect_err("no conditions");
        assert!(none.contains("may not have completed"), "{none}");
    }
}
