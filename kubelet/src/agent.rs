//! The agent's wiring: [`start`] connects the runtime, starts the PLEG, the pod
//! workers, the pod sources, the HTTP endpoint and (with a kubeconfig) the API
//! loops, each in a step of its own, and hands them to the
//! [`SyncLoop`](crate::sync_loop::SyncLoop). No decisions are made here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use evlet_cri::{Options, RuntimeClient};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::api::admission::Allocatable;
use crate::api::objects::ApiEnvObjects;
use crate::api::pods::Mirrors;
use crate::api::services::ServiceCache;
use crate::api::status::StatusManager;
use crate::api::tokens::TokenManager;
use crate::api::volumes::{ApiClientHandle, ApiVolumeSources};
use crate::api::watched::ObjectCache;
use crate::api::{self, ApiClient};
use crate::cache::{self, CacheWriter, PodCache};
use crate::config::{self, Config, PlegMode};
use crate::diagnostics::{Diagnostics, Event, EventRecorder};
use crate::eviction::EvictionManager;
use crate::health::{self, Checks};
use crate::machine::Machine;
use crate::metrics::Metrics;
use crate::pleg::ebpf::EbpfSource;
use crate::pleg::hints::Hints;
use crate::pleg::process::ProcFs;
use crate::pleg::relist::{CHANNEL_CAPACITY, Relister};
use crate::pleg::{
    Health, PodLifecycleEvent, RELIST_THRESHOLD, cri_events, generic, hinted, restarts,
};
use crate::prober::Prober;
use crate::runtime::Runtime;
use crate::server::{self, Served};
use crate::source::{self, PodConfig, Source, SourceMessage};
use crate::sync::Syncer;
use crate::sync::objects::{EnvObjects, NoApiServer};
use crate::sync::spec::NodeContext;
use crate::sync_loop::{ApiState, Inputs, SyncLoop};
use crate::volume::{NodeFacts, VolumeManager, VolumeSources};
use crate::workers::{Collaborators, PodWorkers, StatusSink};

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
    /// The node-local socket could not be served.
    #[error(transparent)]
    Local(#[from] crate::server::local::LocalError),
    /// The secured port's TLS could not be set up.
    #[error("the secured kubelet API: {0}")]
    Tls(#[from] crate::server::tls::TlsError),
    /// The pods' cgroup could not be made or limited to node allocatable.
    #[error("the pods' cgroup (node allocatable): {0}")]
    Cgroups(#[from] crate::cm::CgroupError),
    /// `singleProcessOOMKill: false` on cgroup v1.
    #[error(transparent)]
    GroupOomKill(#[from] crate::cm::GroupOomKillOnV1),
    /// `cgroupDriver: systemd` on a host without pure cgroup v2.
    #[error(
        "cgroupDriver: systemd needs pure cgroup v2 (this host's cgroups are v1 or hybrid); use cgroupDriver: cgroupfs here"
    )]
    SystemdOnV1,
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
    /// The probe manager.
    pub prober: Prober,
    /// Where the secured kubelet API listens, if it is served.
    pub secure_address: Option<std::net::SocketAddr>,
    /// Where the read-only port (`/healthz`, `/pods`, `/metrics`, `/stats`)
    /// listens, if it is served.
    pub address: Option<std::net::SocketAddr>,
    /// Where upstream's healthz server listens, once it is bound.
    pub healthz_address: Option<std::net::SocketAddr>,
    /// The node-local socket (the read-only routes and the diagnostics), if served.
    pub local_socket: Option<std::path::PathBuf>,
    /// A container collection now (what the eviction manager's node-level
    /// reclaim asks for).
    pub reclaim: crate::container_gc::Reclaim,
}

/// Starts the agent; it runs until `shutdown` is cancelled.
///
/// # Errors
/// [`StartError`] if the root directory, the runtime or the HTTP address is unusable.
pub async fn start(
    mut config: Config,
    shutdown: CancellationToken,
) -> Result<(Handles, tokio::task::JoinHandle<()>), StartError> {
    if config.node_ip.is_none() {
        match config::detect_node_ip(&config.node_name) {
            Ok(ip) => {
                tracing::info!(node_ip = %ip, "detected the node's IP (no --node-ip)");
                config.node_ip = Some(ip);
            }
            Err(e) => tracing::warn!(error = %e, "pods get no hostIP"),
        }
    }
    std::fs::create_dir_all(&config.root_dir).map_err(|source| StartError::RootDir {
        path: config.root_dir.clone(),
        source,
    })?;
    let metrics = Arc::new(Metrics::with_clients(
        config
            .api
            .as_ref()
            .map(|api| api.metrics.clone())
            .unwrap_or_default(),
        config
            .api
            .as_ref()
            .and_then(|api| api.certificates.as_ref())
            .map(|c| c.metrics().clone())
            .unwrap_or_default(),
    ));
    metrics
        .node_name
        .with_label_values(&[&config.node_name])
        .set(1);
    let (client, runtime_version) = connect_runtime(&config, &metrics).await?;
    config.cgroup_driver = runtime_cgroup_driver(&config, &client).await?;
    let (events_tx, events_rx) = match &config.api {
        Some(_) => {
            let (tx, rx) = mpsc::channel(api::events::QUEUE);
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    let diagnostics = Arc::new(Diagnostics::durable(
        events_tx,
        config.root_dir.join("diag"),
    ));
    let flusher = tokio::spawn(flush_diagnostics(
        Arc::clone(&diagnostics),
        shutdown.clone(),
    ));
    let (writer, cache) = cache::new();
    let (pleg_tx, pleg_rx) = mpsc::channel::<PodLifecycleEvent>(CHANNEL_CAPACITY);
    let pleg = start_pleg(
        &config,
        &client,
        writer,
        pleg_tx,
        &cache,
        &metrics,
        &diagnostics,
        &shutdown,
    )
    .await;

    let machine = Machine::read(&config.root_dir);
    let manager = config.api.as_ref().map(|_| StatusManager::new());
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let (objects_tx, objects_rx) = mpsc::unbounded_channel();
    let (refresh_tx, refresh_rx) = mpsc::unbounded_channel();
    // API-mode: the watched ConfigMaps and Secrets and the tokens, shared by
    // env values and volumes; their changes sync the pods that use them.
    let readers = config.api.as_ref().map(|c| ApiReaders {
        objects: ObjectCache::new(c.client.clone(), objects_tx, shutdown.child_token()),
        services: ServiceCache::start(c.client.clone(), shutdown.child_token()),
        tokens: TokenManager::new(c.client.clone(), refresh_tx, shutdown.child_token()),
        client: c.client.clone(),
    });
    let runtime_status = client.status(false).await.ok();
    let recursive_read_only = runtime_status
        .as_ref()
        .and_then(|s| {
            s.runtime_handlers
                .iter()
                .find(|h| h.name.is_empty())
                .and_then(|h| h.features)
        })
        .is_some_and(|f| f.recursive_read_only_mounts);
    // What the runtime enforces, for admission and the Node's status.features.
    let runtime_support = crate::validation::RuntimeSupport {
        supplemental_groups_policy: runtime_status
            .as_ref()
            .and_then(|s| s.features)
            .is_some_and(|f| f.supplemental_groups_policy),
    };
    let syncer = build_syncer(
        &config,
        client.clone(),
        &machine,
        &diagnostics,
        &metrics,
        readers.as_ref(),
        recursive_read_only,
    )
    .await?;
    let (probe_tx, probe_rx) = mpsc::unbounded_channel();
    let prober = Prober::new(
        client.clone(),
        Arc::clone(&diagnostics) as Arc<dyn EventRecorder>,
        Arc::clone(&metrics),
        probe_tx,
        shutdown.child_token(),
    );
    let workers = PodWorkers::new(
        Collaborators {
            syncer: Arc::clone(&syncer),
            cache: cache.clone(),
            metrics: Arc::clone(&metrics),
            hints: pleg.hints.clone(),
            status_sink: manager.clone().map(|m| m as Arc<dyn StatusSink>),
            resync: config.sync_frequency,
            prober: prober.clone(),
        },
        done_tx,
        shutdown.child_token(),
    );

    let (src_tx, src_rx) = mpsc::channel::<SourceMessage>(64);
    let mut expected = start_static_sources(&config, &src_tx, &shutdown);
    let (served, endpoints) = start_server(
        &config,
        Collected {
            workers: &workers,
            pleg: &pleg,
            metrics: &metrics,
            diagnostics: &diagnostics,
            runtime: &client,
            cache: &cache,
            volumes: syncer.volumes(),
        },
        &shutdown,
    )
    .await?;
    let secure_address = start_secure(&config, &served, &shutdown).await?;
    let images = Arc::new(crate::image_gc::ImageGc::new(
        config.image_gc.clone(),
        crate::image_gc::Collaborators {
            runtime: client.clone(),
            stats: Arc::clone(&served.stats),
            recorder: Arc::clone(&diagnostics) as Arc<dyn EventRecorder>,
            metrics: Arc::clone(&metrics),
            node_name: config.node_name.clone(),
            pod_infra_image: config.pod_infra_container_image.clone(),
        },
    ));
    tokio::spawn(Arc::clone(&images).run(shutdown.child_token()));
    let (reclaim, reclaim_rx) = crate::container_gc::Reclaim::channel();
    let eviction = EvictionManager::new(
        config.eviction.clone(),
        crate::eviction::Collaborators {
            containers: reclaim.clone(),
            images,
            stats: Arc::clone(&served.stats),
            workers: workers.clone(),
            recorder: Arc::clone(&diagnostics) as Arc<dyn EventRecorder>,
            metrics: Arc::clone(&metrics),
            journal: Arc::clone(&served.eviction),
        },
    );
    let pressure = eviction.pressure();
    tokio::spawn(eviction.run(shutdown.child_token()));
    let running = cache.clone();
    tokio::spawn(crate::logrotate::run(
        client.clone(),
        move || running.running_containers(),
        crate::logrotate::Policy {
            max_size: config.pods.container_log_max_size,
            max_files: config.pods.container_log_max_files.max(2),
        },
        config.pods.container_log_monitor_interval,
        shutdown.child_token(),
    ));
    tokio::spawn(health::watch_runtime(
        client,
        Arc::clone(&served.checks),
        shutdown.child_token(),
    ));
    let api = match (&config.api, manager, events_rx) {
        (Some(api_client), Some(manager), Some(events_rx)) => {
            expected.push(Source::Api);
            Some(start_api(
                &config,
                api_client,
                manager,
                events_rx,
                &src_tx,
                &served,
                &machine,
                pressure.clone(),
                runtime_support,
                runtime_version,
                secure_address
                    .or(endpoints.read_only)
                    .map_or(0, |a| a.port()),
                &shutdown,
            ))
        }
        _ => None,
    };
    drop(src_tx);

    let sync_loop = SyncLoop {
        config: PodConfig::new(expected),
        pods: BTreeMap::new(),
        workers: workers.clone(),
        cache: cache.clone(),
        syncer,
        container_gc: config.container_gc,
        qos_stale: true,
        swept_orphans: false,
        no_orphans_at: None,
        metrics: Arc::clone(&metrics),
        served: Arc::clone(&served),
        hints: pleg.hints.clone(),
        allowed_unsafe_sysctls: config.pods.allowed_unsafe_sysctls.clone(),
        runtime_support,
        pressure,
        api,
    };
    let handles = Handles {
        workers,
        cache,
        metrics,
        served,
        diagnostics,
        ebpf: pleg.ebpf,
        hints: pleg.hints,
        prober,
        secure_address,
        address: endpoints.read_only,
        healthz_address: endpoints.healthz,
        local_socket: endpoints.local_socket,
        reclaim,
    };
    let inputs = Inputs {
        sources: src_rx,
        pleg: pleg_rx,
        done: done_rx,
        probes: probe_rx,
        objects: objects_rx,
        refresh: refresh_rx,
        reclaim: reclaim_rx,
    };
    // The agent's task ends once the sync loop stopped and the diagnostics
    // were written a last time.
    let task = tokio::spawn(async move {
        sync_loop.run(inputs, shutdown).await;
        let _ = flusher.await;
    });
    Ok((handles, task))
}

/// Connects to the runtime and asks its version (`containerd://1.7.24`).
/// The cgroup driver: the runtime's own when it says (`RuntimeConfig`, as
/// upstream's `KubeletCgroupDriverFromCRI` asks it: a kubelet that disagreed
/// with its runtime would name every pod cgroup differently), else the
/// configured one (runtimes without the call, containerd 1.6).
async fn runtime_cgroup_driver(
    config: &Config,
    client: &RuntimeClient,
) -> Result<crate::cm::Driver, StartError> {
    use crate::cm::Driver;
    use evlet_cri::api::CgroupDriver;
    let answer = match client.runtime_config().await {
        Ok(answer) => answer,
        Err(e) if e.kind == evlet_cri::ErrorKind::Unsupported => {
            tracing::info!(
                cgroup_driver = config.cgroup_driver.as_str(),
                "the runtime does not support RuntimeConfig; using cgroupDriver from the configuration"
            );
            return Ok(config.cgroup_driver);
        }
        Err(source) => {
            return Err(StartError::Runtime {
                endpoint: config.runtime_endpoint.clone(),
                source,
            });
        }
    };
    let Some(linux) = answer.linux else {
        return Ok(config.cgroup_driver);
    };
    let driver = match linux.cgroup_driver() {
        CgroupDriver::Systemd => Driver::Systemd,
        CgroupDriver::Cgroupfs => Driver::Cgroupfs,
    };
    if driver != config.cgroup_driver {
        tracing::warn!(
            configured = config.cgroup_driver.as_str(),
            runtime = driver.as_str(),
            "cgroupDriver differs from the runtime's; using the runtime's"
        );
    }
    tracing::info!(
        cgroup_driver = driver.as_str(),
        "using cgroup driver setting received from the CRI runtime"
    );
    Ok(driver)
}

async fn connect_runtime(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<(RuntimeClient, String), StartError> {
    let runtime_error = |source| StartError::Runtime {
        endpoint: config.runtime_endpoint.clone(),
        source,
    };
    let options = Options {
        observer: Some(Arc::new(crate::metrics::runtime::Observer(Arc::clone(
            metrics,
        )))),
        ..Options::default()
    };
    let client =
        RuntimeClient::connect(&config.runtime_endpoint, options).map_err(runtime_error)?;
    let version = client.version().await.map_err(runtime_error)?;
    tracing::info!(runtime = %version.runtime_name, version = %version.runtime_version, endpoint = %config.runtime_endpoint, node = %config.node_name, "connected to the container runtime");
    Ok((
        client,
        format!("{}://{}", version.runtime_name, version.runtime_version),
    ))
}

/// How often OOM records and pod timelines are written to `<root-dir>/diag`.
const DIAGNOSTICS_FLUSH: Duration = Duration::from_secs(2);

/// Writes the diagnostics every [`DIAGNOSTICS_FLUSH`], and once more at
/// shutdown.
async fn flush_diagnostics(diagnostics: Arc<Diagnostics>, shutdown: CancellationToken) {
    loop {
        let stopping = tokio::select! {
            () = shutdown.cancelled() => true,
            () = tokio::time::sleep_until(crate::clock::next_tick(DIAGNOSTICS_FLUSH)) => false,
        };
        // Nothing to write, nothing to wake a blocking thread for.
        if stopping || diagnostics.unflushed() {
            let d = Arc::clone(&diagnostics);
            let _ = tokio::task::spawn_blocking(move || d.flush()).await;
        }
        if stopping {
            return;
        }
    }
}

/// The PLEG that got started.
struct Pleg {
    mode: PlegMode,
    /// Hint set of the hinted modes (None: generic).
    hints: Option<Arc<Hints>>,
    ebpf: Option<Arc<EbpfSource>>,
    health: Arc<Health>,
}

/// Starts the requested PLEG (its hint source and the relister's driver), or
/// falls back to generic with one clear log line saying why.
#[expect(
    clippy::too_many_arguments,
    reason = "one call site; the arguments are the PLEG's inputs"
)]
async fn start_pleg(
    config: &Config,
    client: &RuntimeClient,
    writer: CacheWriter,
    events: mpsc::Sender<PodLifecycleEvent>,
    cache: &PodCache,
    metrics: &Arc<Metrics>,
    diagnostics: &Arc<Diagnostics>,
    shutdown: &CancellationToken,
) -> Pleg {
    let (mode, hints, ebpf) =
        start_hint_source(config, client, cache, metrics, diagnostics, shutdown).await;
    let health = Arc::new(match mode {
        PlegMode::Ebpf => {
            Health::with_threshold(RELIST_THRESHOLD.max(config.ebpf_relist_period * 2))
        }
        _ => Health::default(),
    });
    metrics.pleg_mode.with_label_values(&[mode.as_str()]).set(1);
    let relister = Relister::new(
        Runtime::new(client.clone()),
        writer,
        events,
        Arc::clone(metrics),
        Arc::clone(&health),
        Arc::clone(diagnostics),
    )
    .with_kernel(
        ebpf.as_ref().map(|source| {
            Arc::new(source.binder(Arc::new(ProcFs))) as Arc<dyn crate::pleg::relist::Inits>
        }),
        Arc::new(ProcFs),
    );
    match &hints {
        None => {
            tokio::spawn(generic::run(
                relister,
                config.relist_period,
                shutdown.child_token(),
            ));
        }
        Some(hints) => {
            tokio::spawn(restarts::run(
                client.clone(),
                Arc::clone(hints),
                shutdown.child_token(),
            ));
            let period = if mode == PlegMode::Ebpf {
                config.ebpf_relist_period
            } else {
                config.relist_period
            };
            tokio::spawn(hinted::run(
                relister,
                Arc::clone(hints),
                ebpf.as_ref().map(|source| source.quiet()),
                hinted::Timing::new(period),
                Arc::clone(metrics),
                shutdown.child_token(),
            ));
        }
    }
    Pleg {
        mode,
        hints,
        ebpf,
        health,
    }
}

/// Starts the requested mode's hint source; `generic` (no hints) if it cannot run.
async fn start_hint_source(
    config: &Config,
    client: &RuntimeClient,
    cache: &PodCache,
    metrics: &Arc<Metrics>,
    diagnostics: &Arc<Diagnostics>,
    shutdown: &CancellationToken,
) -> (PlegMode, Option<Arc<Hints>>, Option<Arc<EbpfSource>>) {
    let generic = (PlegMode::Generic, None, None);
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
                (PlegMode::CriEvents, Some(hints), None)
            }
            Err(err) => {
                tracing::warn!(
                    "PLEG mode cri-events is unavailable ({err}); running generic (relist every {:?})",
                    config.relist_period
                );
                generic
            }
        },
        PlegMode::Ebpf => {
            match EbpfSource::load(&cgroup_names(config).pods(), config.ebpf_ring_bytes) {
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
                    (PlegMode::Ebpf, Some(hints), Some(source))
                }
                Err(err) => {
                    tracing::warn!(
                        "PLEG mode ebpf is unavailable ({err}); running generic (relist every {:?})",
                        config.relist_period
                    );
                    generic
                }
            }
        }
    }
}

/// The pods' cgroup names under `cgroupRoot`, as the cgroup driver spells them.
fn cgroup_names(config: &Config) -> crate::cm::Names {
    crate::cm::Names::new(config.cgroup_driver, &config.cgroup_root)
}

/// What API-server mode reads for pods: watched objects and tokens.
struct ApiReaders {
    objects: Arc<ObjectCache>,
    services: Arc<ServiceCache>,
    tokens: Arc<TokenManager>,
    client: kube::Client,
}

/// The syncer, reading env objects and volumes' objects from the API server in
/// API-server mode.
async fn build_syncer(
    config: &Config,
    client: RuntimeClient,
    machine: &Machine,
    diagnostics: &Arc<Diagnostics>,
    metrics: &Arc<Metrics>,
    readers: Option<&ApiReaders>,
    recursive_read_only: bool,
) -> Result<Arc<Syncer>, StartError> {
    // The pods' cgroup tree, limited to node allocatable before any pod runs.
    let layout = config
        .cgroup_layout
        .clone()
        .unwrap_or_else(crate::cm::Layout::detect);
    let oom_group_kill = crate::cm::group_oom_kill(&layout, config.single_process_oom_kill)?;
    // The systemd driver makes the tree through systemd (pure v2 only).
    let systemd = match (config.cgroup_driver, &layout) {
        (crate::cm::Driver::Cgroupfs, _) | (_, crate::cm::Layout::Off) => None,
        (crate::cm::Driver::Systemd, crate::cm::Layout::V1 { .. }) => {
            return Err(StartError::SystemdOnV1);
        }
        (crate::cm::Driver::Systemd, crate::cm::Layout::V2(_)) => Some(
            crate::cm::systemd::Systemd::connect()
                .await
                .map_err(crate::cm::CgroupError::from)?,
        ),
    };
    let cgroups = Arc::new(crate::cm::CgroupManager::new(
        layout,
        cgroup_names(config),
        systemd,
        config.pod_pids_limit,
    ));
    cgroups
        .ensure_node(
            &config
                .reservations
                .pods_cgroup(crate::cm::allocatable::Resources::of(machine)),
        )
        .await?;
    let allocatable = config.reservations.allocatable(
        crate::cm::allocatable::Resources::of(machine),
        &config.eviction,
    );
    let node = NodeContext {
        allocatable,
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
        cgroups: cgroup_names(config),
        host_ip: config.node_ip.clone(),
        pod_logs_dir: config.pods.pod_logs_dir.clone(),
        container_log_links: config.pods.container_log_links.clone(),
        memory_capacity: i64::try_from(machine.memory)
            .ok()
            .filter(|m| *m > 0)
            .unwrap_or(1 << 30),
        dns: crate::dns::NodeDns {
            cluster_dns: config.pods.cluster_dns.clone(),
            cluster_domain: config.pods.cluster_domain.clone(),
            resolv_conf: config.pods.resolv_conf.as_ref().and_then(|p| {
                std::fs::read_to_string(p)
                    .map_err(|e| tracing::warn!(path = %p.display(), error = %e, "cannot read resolvConf; pods get no host resolver config"))
                    .ok()
            }),
            node_ips: config.node_ip.iter().cloned().collect(),
        },
        seccomp_default: config.pods.seccomp_default,
        parallel_image_pulls: config.pods.parallel_image_pulls,
        parallel_pod_starts: config.pods.parallel_pod_starts,
        oom_group_kill,
    };
    let (objects, sources): (Arc<dyn EnvObjects>, Arc<dyn VolumeSources>) = match readers {
        Some(r) => (
            Arc::new(ApiEnvObjects {
                objects: Arc::clone(&r.objects),
                services: Arc::clone(&r.services),
                client: r.client.clone(),
            }),
            Arc::new(ApiVolumeSources {
                objects: Arc::clone(&r.objects),
                tokens: Arc::clone(&r.tokens),
                client: ApiClientHandle(r.client.clone()),
            }),
        ),
        None => (Arc::new(NoApiServer), Arc::new(crate::volume::NoApiServer)),
    };
    let volumes = Arc::new(VolumeManager::new(
        config.root_dir.clone(),
        sources,
        NodeFacts {
            name: config.node_name.clone(),
            labels: api::node::labels(&config.node_name),
            memory: machine.memory,
            allocatable,
            recursive_read_only,
        },
    ));
    Ok(Arc::new(Syncer::new(
        client,
        node,
        objects,
        volumes,
        cgroups,
        Arc::clone(diagnostics) as _,
        Arc::clone(metrics),
    )))
}

/// Starts the static pod sources (manifest directory, manifest URL); returns
/// the sources the sync loop must hear from before removing orphans.
fn start_static_sources(
    config: &Config,
    tx: &mpsc::Sender<SourceMessage>,
    shutdown: &CancellationToken,
) -> Vec<Source> {
    let mut expected = Vec::new();
    if let Some(path) = &config.pod_manifest_path {
        expected.push(Source::File);
        let file = source::file::FileSource::new(path.clone(), config.node_name.clone());
        tokio::spawn(file.run(
            tx.clone(),
            config.file_check_frequency,
            shutdown.child_token(),
        ));
    }
    if let Some(url) = &config.manifest_url {
        expected.push(Source::Http);
        tokio::spawn(source::http::run(
            url.clone(),
            config.node_name.clone(),
            tx.clone(),
            config.http_check_frequency,
            shutdown.child_token(),
        ));
    }
    expected
}

/// What the HTTP endpoints serve from.
struct Collected<'a> {
    workers: &'a PodWorkers,
    pleg: &'a Pleg,
    metrics: &'a Arc<Metrics>,
    diagnostics: &'a Arc<Diagnostics>,
    runtime: &'a RuntimeClient,
    cache: &'a PodCache,
    volumes: &'a crate::volume::VolumeManager,
}

/// Where the endpoints besides the secured port were bound.
struct Bound {
    read_only: Option<std::net::SocketAddr>,
    healthz: Option<std::net::SocketAddr>,
    local_socket: Option<std::path::PathBuf>,
}

/// Binds the read-only port, the healthz port and the node-local socket
/// (each as configured).
async fn start_server(
    config: &Config,
    c: Collected<'_>,
    shutdown: &CancellationToken,
) -> Result<(Arc<Served>, Bound), StartError> {
    let served = Arc::new(Served {
        workers: c.workers.clone(),
        health: Arc::clone(&c.pleg.health),
        volumes: c.volumes.clone(),
        metrics: Arc::clone(c.metrics),
        mode: std::sync::Mutex::new(c.pleg.mode.as_str().into()),
        sources_ready: Default::default(),
        checks: Arc::new(Checks::default()),
        diagnostics: Arc::clone(c.diagnostics),
        runtime: c.runtime.clone(),
        cache: c.cache.clone(),
        configz: configz(config),
        eviction: Arc::default(),
        stats: Arc::new(crate::stats::StatsProvider::new(
            c.runtime.clone(),
            config.root_dir.clone(),
            config
                .pods
                .pod_logs_dir
                .clone()
                .unwrap_or_else(|| config.root_dir.join("logs/pods")),
            config.node_name.clone(),
            cgroup_names(config),
        )),
    });
    let http = &config.http;
    let read_only = match http.read_only {
        Some(address) => Some(
            server::serve(
                address,
                Arc::clone(&served),
                http.limits,
                shutdown.child_token(),
            )
            .await?,
        ),
        None => None,
    };
    let healthz = match http.healthz {
        Some(address) => start_healthz(address, http.limits, shutdown).await,
        None => None,
    };
    if let Some(path) = &http.local_socket {
        server::local::serve(
            path,
            server::local::router(Arc::clone(&served)),
            http.limits,
            shutdown.child_token(),
        )?;
    }
    let bound = Bound {
        read_only,
        healthz,
        local_socket: http.local_socket.clone(),
    };
    Ok((served, bound))
}

/// Upstream's healthz server: a port it cannot bind is logged and tried
/// again every 5 s, and never stops the agent (`cmd/kubelet/app/server.go`).
async fn start_healthz(
    address: std::net::SocketAddr,
    limits: server::Limits,
    shutdown: &CancellationToken,
) -> Option<std::net::SocketAddr> {
    match server::serve_healthz(address, limits, shutdown.child_token()).await {
        Ok(bound) => Some(bound),
        Err(e) => {
            tracing::error!(error = %e, "failed to start healthz server; retrying every 5 s");
            let shutdown = shutdown.child_token();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(5)) => {}
                    }
                    match server::serve_healthz(address, limits, shutdown.clone()).await {
                        Ok(_) => return,
                        Err(e) => tracing::debug!(error = %e, "healthz server still not started"),
                    }
                }
            });
            None
        }
    }
}

/// The configuration `/configz` shows, in KubeletConfiguration's words.
fn configz(config: &Config) -> serde_json::Value {
    let secs = |d: Duration| format!("{}s", d.as_secs_f64());
    serde_json::json!({
        "staticPodPath": config.pod_manifest_path,
        "staticPodURL": config.manifest_url,
        "containerRuntimeEndpoint": config.runtime_endpoint,
        "cgroupRoot": config.cgroup_root,
        "cgroupDriver": config.cgroup_driver.as_str(),
        "fileCheckFrequency": secs(config.file_check_frequency),
        "httpCheckFrequency": secs(config.http_check_frequency),
        "syncFrequency": secs(config.sync_frequency),
        "maxPods": config.max_pods,
        "registerWithTaints": config.register_with_taints,
        "clusterDNS": config.pods.cluster_dns,
        "clusterDomain": config.pods.cluster_domain,
        "resolvConf": config.pods.resolv_conf,
        "seccompDefault": config.pods.seccomp_default,
        "allowedUnsafeSysctls": config.pods.allowed_unsafe_sysctls,
        "maxParallelImagePulls": config.pods.parallel_image_pulls,
        "plegMode": config.pleg_mode.as_str(),
        "plegSafetyRelistPeriod": secs(config.ebpf_relist_period),
        "port": config.secure.as_ref().map(|s| s.address.port()),
        "authentication": config.secure.as_ref().map(|s| serde_json::json!({
            "anonymous": {"enabled": s.anonymous},
            "webhook": {"enabled": s.token_webhook.is_some()},
            "x509": {"clientCAFile": s.client_ca_file},
        })),
        "authorization": config.secure.as_ref().map(|s| serde_json::json!({
            "mode": match s.authorization {
                config::Authorization::AlwaysAllow => "AlwaysAllow",
                config::Authorization::Webhook { .. } => "Webhook",
            },
        })),
    })
}

/// Binds and serves the secured kubelet API, if configured.
async fn start_secure(
    config: &Config,
    served: &Arc<Served>,
    shutdown: &CancellationToken,
) -> Result<Option<std::net::SocketAddr>, StartError> {
    let Some(secure) = &config.secure else {
        return Ok(None);
    };
    let reviews: Option<Arc<dyn server::auth::Reviews>> = config
        .api
        .as_ref()
        .map(|c| Arc::new(api::reviews::ApiReviews::new(c.client.clone())) as _);
    let mode = match (secure.authorization, &reviews) {
        (
            config::Authorization::Webhook {
                allow_ttl,
                deny_ttl,
            },
            Some(r),
        ) => server::auth::Mode::Webhook {
            reviews: Arc::clone(r),
            allow_ttl,
            deny_ttl,
        },
        _ => server::auth::Mode::AlwaysAllow,
    };
    let auth = Arc::new(server::auth::Auth::new(server::auth::Settings {
        node: config.node_name.clone(),
        anonymous: secure.anonymous,
        tokens: secure
            .token_webhook
            .zip(reviews.clone())
            .map(|(ttl, r)| (r, ttl)),
        mode,
    }));
    let ips = config
        .node_ip
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .chain([std::net::IpAddr::from([127, 0, 0, 1])])
        .collect();
    // serverTLSBootstrap: the certificate manager's serving certificate.
    let bootstrapped = config
        .api
        .as_ref()
        .and_then(|api| api.certificates.as_ref())
        .and_then(|c| c.server_resolver());
    let tls = match bootstrapped {
        Some(resolver) => {
            server::tls::server_config_with(resolver, secure.client_ca_file.as_deref())?
        }
        None => server::tls::server_config(&server::tls::TlsSettings {
            cert_file: secure.tls_cert_file.clone(),
            key_file: secure.tls_private_key_file.clone(),
            client_ca_file: secure.client_ca_file.clone(),
            cert_dir: config.root_dir.join("pki"),
            hostname: config::hostname(),
            ips,
        })?,
    };
    let (listener, address) = server::bind(secure.address).await?;
    tracing::info!(%address, anonymous = secure.anonymous, webhook_authn = secure.token_webhook.is_some(), authorization = ?secure.authorization, "serving the secured kubelet API");
    server::secure::serve(
        listener,
        tls,
        server::secure::router(Arc::clone(served), auth),
        server::Gate::new(config.http.limits),
        shutdown.child_token(),
    );
    Ok(Some(address))
}

/// API-server mode: the pod watch, the event recorder, the status manager,
/// and the node (registration, status, lease, mirror pods).
#[expect(
    clippy::too_many_arguments,
    reason = "one call site; the arguments are the API loops' inputs"
)]
fn start_api(
    config: &Config,
    api_client: &ApiClient,
    manager: Arc<StatusManager>,
    events: mpsc::Receiver<Event>,
    sources: &mpsc::Sender<SourceMessage>,
    served: &Arc<Served>,
    machine: &Machine,
    pressure: tokio::sync::watch::Receiver<crate::eviction::Pressure>,
    runtime_support: crate::validation::RuntimeSupport,
    runtime_version: String,
    kubelet_port: u16,
    shutdown: &CancellationToken,
) -> ApiState {
    let client = api_client.client.clone();
    let (mirrors_tx, mirrors_rx) = watch::channel(Mirrors::new());
    let node = api::node::SelfWatch::start(
        api_client.client.clone(),
        &config.node_name,
        shutdown.child_token(),
    );
    tokio::spawn(api::pods::run(
        client.clone(),
        config.node_name.clone(),
        {
            let node = node.clone();
            async move { node.synced().await }
        },
        sources.clone(),
        mirrors_tx,
        Arc::clone(&manager) as Arc<dyn api::pods::Observer>,
        shutdown.child_token(),
    ));
    tokio::spawn(api::events::run(
        client.clone(),
        config.node_name.clone(),
        events,
        shutdown.child_token(),
    ));
    tokio::spawn(Arc::clone(&manager).run(client.clone(), shutdown.child_token()));
    let ready_served = Arc::clone(served);
    let input = api::node::NodeInput {
        name: config.node_name.clone(),
        node_ip: config.node_ip.clone(),
        hostname: config::hostname(),
        max_pods: config.max_pods,
        taints: config.register_with_taints.clone(),
        labels: config.node_labels.clone(),
        root_dir: config.root_dir.clone(),
        runtime_version,
        runtime_support,
        port: kubelet_port,
        ready: Arc::new(move || ready_served.ready()),
        pressure,
        reserved: api::node::Reserved {
            reservations: config.reservations,
            eviction: config.eviction.clone(),
        },
    };
    let (statics_tx, statics_rx) = watch::channel(api::mirror::Statics::new());
    tokio::spawn(api::run_node(
        client,
        input,
        node.clone(),
        statics_rx,
        mirrors_rx.clone(),
        shutdown.child_token(),
    ));
    tokio::spawn(api::forward_mirrors(mirrors_rx, Arc::clone(&manager)));
    ApiState {
        manager,
        statics: statics_tx,
        allocatable: {
            let a = config.reservations.allocatable(
                crate::cm::allocatable::Resources::of(machine),
                &config.eviction,
            );
            Allocatable {
                cpu_milli: a.cpu_milli,
                memory: a.memory,
                pods: i64::from(config.max_pods),
            }
        },
        node: Some(node),
        rejected: BTreeSet::new(),
        finished: BTreeSet::new(),
    }
}
