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
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::cache::{self, PodCache};
use crate::config::{Config, PlegMode};
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

fn memory_capacity() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<i64>().ok())
        })
        .map_or(1 << 30, |kb| kb * 1024)
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
                period,
                Arc::clone(&metrics),
                shutdown.child_token(),
            ));
        }
    }
    let mode = pleg.mode;

    let node = NodeContext {
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
        pods_cgroup,
        host_ip: config.node_ip.clone(),
        memory_capacity: memory_capacity(),
    };
    let syncer = Arc::new(Syncer::new(client, node));
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let workers = PodWorkers::new(
        Arc::clone(&syncer),
        cache.clone(),
        Arc::clone(&metrics),
        done_tx,
        pleg.hints.clone(),
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

    let sync_loop = SyncLoop {
        config: PodConfig::new(expected),
        pods: BTreeMap::new(),
        workers: workers.clone(),
        cache: cache.clone(),
        syncer,
        metrics: Arc::clone(&metrics),
        served: Arc::clone(&served),
        hints: pleg.hints.clone(),
    };
    let handles = Handles {
        workers,
        cache,
        metrics,
        served,
        diagnostics,
        ebpf: pleg.ebpf.clone(),
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
                        for update in self.config.merge(source, pods) {
                            self.handle_update(update);
                        }
                        self.served.sources_ready.store(self.config.sources_ready(), Ordering::Relaxed);
                    }
                    Some(SourceMessage::Error(_, _)) => {
                        self.metrics.manifest_errors.inc();
                    }
                    None => sources_open = false,
                },
                Some(event) = pleg.recv() => self.handle_pleg(event),
                Some(uid) = done.recv() => {
                    self.workers.forget(&uid);
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

    fn handle_update(&mut self, update: PodUpdate) {
        for pod in update.pods {
            let uid = pod::uid(&pod);
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
