//! The sync loop (upstream's `syncLoop`): one task that `select!`s over pod
//! updates from the sources, PLEG events, probe verdicts, finished workers, the housekeeping
//! tick (2 s: orphan pods, backoff GC) and the container GC tick (1 min). It
//! never blocks on the runtime: every runtime call happens in a pod worker or
//! the PLEG.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::api::admission::{Allocatable, Usage};
use crate::api::status::StatusManager;
use crate::api::watched::Changed;
use crate::api::{self};
use crate::cache::PodCache;
use crate::metrics::Metrics;
use crate::pleg::PodLifecycleEvent;
use crate::pleg::hints::Hints;
use crate::pod::{self, PodUid, labels};
use crate::probe::{ProbeKind, Verdict};
use crate::prober::ProbeUpdate;
use crate::server::Served;
use crate::source::{Op, PodConfig, PodUpdate, Source, SourceMessage};
use crate::sync::Syncer;
use crate::workers::{PodWorkers, UpdateKind};

/// Upstream's `housekeepingPeriod`.
pub const HOUSEKEEPING: Duration = Duration::from_secs(2);
/// What the sync loop listens to.
#[derive(Debug)]
pub struct Inputs {
    /// Pod sources' snapshots and changes.
    pub sources: mpsc::Receiver<SourceMessage>,
    /// PLEG events.
    pub pleg: mpsc::Receiver<PodLifecycleEvent>,
    /// Workers that finished (their pods are gone).
    pub done: mpsc::UnboundedReceiver<PodUid>,
    /// Probe verdicts that changed.
    pub probes: mpsc::UnboundedReceiver<ProbeUpdate>,
    /// Watched ConfigMaps and Secrets that changed (API-server mode).
    pub objects: mpsc::UnboundedReceiver<Changed>,
    /// Pods whose service-account token needs refreshing (API-server mode).
    pub refresh: mpsc::UnboundedReceiver<PodUid>,
    /// Container collections asked for now (the eviction manager's node-level
    /// reclaim).
    pub reclaim: crate::container_gc::Requests,
}

/// The sync loop's state.
#[derive(Debug)]
pub struct SyncLoop {
    /// Merge of the sources.
    pub config: PodConfig,
    /// Desired pods by UID (upstream's pod manager).
    pub pods: BTreeMap<PodUid, Arc<Pod>>,
    /// The pod workers.
    pub workers: PodWorkers,
    /// The pod cache (orphans and container GC read it).
    pub cache: PodCache,
    /// Backoff GC and dead container removal.
    pub syncer: Arc<Syncer>,
    /// How many dead containers the container GC keeps.
    pub container_gc: crate::container_gc::Policy,
    /// The pods changed since the QoS cgroups were last brought in line.
    pub qos_stale: bool,
    /// What pods gone while the agent was down left behind was looked for.
    pub swept_orphans: bool,
    /// The cache's [`known_generation`](PodCache::known_generation) at which
    /// housekeeping found no orphaned pod, with no pod update since: until
    /// either changes there is none to look for.
    pub no_orphans_at: Option<u64>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// What the HTTP endpoint serves (sources-ready flag).
    pub served: Arc<Served>,
    /// The hinted PLEG's hints (agent-initiated removals are announced there).
    pub hints: Option<Arc<Hints>>,
    /// `allowedUnsafeSysctls` (admission).
    pub allowed_unsafe_sysctls: Vec<String>,
    /// What the node's runtime enforces: a pod asking for more is refused
    /// at admission, static or API (upstream's admission handlers).
    pub runtime_support: crate::validation::RuntimeSupport,
    /// The node's pressure conditions (admission refuses pods under them).
    pub pressure: watch::Receiver<crate::eviction::Pressure>,
    /// API-server mode.
    pub api: Option<ApiState>,
}

/// The sync loop's part of API-server mode.
#[derive(Debug)]
pub struct ApiState {
    /// The status manager (final deletes of gracefully deleted pods).
    pub manager: Arc<StatusManager>,
    /// Static pods, for the mirror manager.
    pub statics: watch::Sender<api::mirror::Statics>,
    /// What admission fits pods into.
    pub allocatable: Allocatable,
    /// This node's Node object (labels, taints) for admission; None until seen.
    pub node: Option<api::node::SelfWatch>,
    /// Pods rejected at admission (never started).
    pub rejected: BTreeSet<PodUid>,
    /// Deleted pods whose containers are gone; waiting for the watch to drop them.
    pub finished: BTreeSet<PodUid>,
}

impl SyncLoop {
    /// Runs until `shutdown`: pod updates from the sources, PLEG events,
    /// finished workers, housekeeping and container GC.
    pub async fn run(mut self, inputs: Inputs, shutdown: CancellationToken) {
        let Inputs {
            mut sources,
            mut pleg,
            mut done,
            mut probes,
            mut objects,
            mut refresh,
            mut reclaim,
        } = inputs;
        let mut housekeeping = crate::clock::Ticks::every(HOUSEKEEPING);
        let mut gc = crate::clock::Ticks::every(self.container_gc.period);
        let mut sources_open = true;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => {
                    tracing::info!("sync loop stopping; pods keep running");
                    return;
                }
                msg = sources.recv(), if sources_open => match msg {
                    Some(SourceMessage::Snapshot(source, pods)) => {
                        let pods = self.without_duplicate_names(source, pods);
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
                Some(update) = probes.recv() => self.handle_probe(update),
                Some(changed) = objects.recv() => self.handle_object(&changed),
                Some(uid) = refresh.recv() => {
                    if let Some(pod) = self.pods.get(&uid) {
                        self.workers.update(pod.clone(), UpdateKind::Sync);
                    }
                }
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
                () = housekeeping.tick() => self.housekeeping().await,
                () = gc.tick() => {
                    self.container_gc(false);
                    // Pods that finished since leave the QoS shares (upstream
                    // brings the QoS cgroups in line every minute).
                    self.qos_stale = true;
                }
                Some(reply) = reclaim.recv() => {
                    let (removed, removals) = self.container_gc(true);
                    tokio::spawn(async move {
                        for r in removals {
                            let _ = r.await;
                        }
                        let _ = reply.send(removed);
                    });
                }
            }
        }
    }

    fn handle_updates(&mut self, source: Source, updates: Vec<PodUpdate>) {
        for update in updates {
            self.handle_update(update);
        }
        self.qos_stale = true;
        self.no_orphans_at = None;
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
            if update.source != Source::Api
                && update.op == Op::Add
                && !self.workers.has(&uid)
                && let Err(rejection) = self.static_admission(&pod)
            {
                // A static pod refused at admission shows Failed and never runs.
                tracing::warn!(pod = %pod::key(&pod), reason = %rejection.reason, message = %rejection.message, "static pod rejected at admission");
                let status = crate::status::compute(
                    &pod,
                    &crate::runtime::PodStatus::empty(uid.clone()),
                    &crate::status::Extra {
                        rejected: Some((&rejection.reason, &rejection.message)),
                        start_time: Some(crate::clock::now()),
                        ..Default::default()
                    },
                );
                self.workers.set_view(pod, status);
                continue;
            }
            match update.op {
                Op::Add | Op::Update => {
                    let mut pod = pod;
                    if update.op == Op::Update {
                        self.refuse_new_fields(&pod);
                        self.keep_pod_resources(&mut pod);
                    }
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
                    // Upstream's HandlePodReconcile: the conditions of a pod's
                    // readiness gates are set by others on its status, so a
                    // status change of a gated pod syncs it and its Ready
                    // condition follows the gates.
                    let gated = pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.readiness_gates.as_ref())
                        .is_some_and(|g| !g.is_empty());
                    self.pods.insert(uid.clone(), pod.clone());
                    if gated && pod.metadata.deletion_timestamp.is_none() && self.workers.has(&uid)
                    {
                        self.workers.update(pod, UpdateKind::Sync);
                    }
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
            // Active pods only (upstream's `GetActivePods`): a finished pod's
            // requests are free again.
            Usage::of(
                self.pods
                    .iter()
                    .filter(|(u, _)| !api.rejected.contains(*u) && !self.workers.is_terminal(u))
                    .map(|(_, p)| &**p),
            )
        });
        let node = api.node.as_ref().and_then(api::node::SelfWatch::current);
        let pressure = *self.pressure.borrow();
        let admitted = api::admission::supported(pod)
            .and_then(|()| api::admission::runtime_supports(pod, &self.runtime_support))
            .and_then(|()| {
                crate::eviction::admit(pod, pressure)
                    .map_err(|(reason, message)| api::admission::Rejection { reason, message })
            })
            .and_then(|()| {
                crate::sysctls::admit(pod, &self.allowed_unsafe_sysctls).map_err(|e| {
                    api::admission::Rejection {
                        reason: "SysctlForbidden".into(),
                        message: format!("Pod was rejected: {e}"),
                    }
                })
            })
            .and_then(|()| match &node {
                Some(node) => api::admission::suits_node(pod, node, used),
                None => Ok(()),
            })
            .and_then(|()| api::admission::admit(pod, used, &api.allocatable));
        match admitted {
            Ok(()) => false,
            Err(rejection) => {
                tracing::warn!(pod = %pod::key(pod), reason = %rejection.reason, message = %rejection.message, "pod rejected at admission");
                api.rejected.insert(uid);
                let status = crate::status::compute(
                    pod,
                    &crate::runtime::PodStatus::empty(pod::uid(pod)),
                    &crate::status::Extra {
                        rejected: Some((&rejection.reason, &rejection.message)),
                        start_time: Some(crate::clock::now()),
                        ..Default::default()
                    },
                );
                self.workers.set_view(pod.clone(), status);
                true
            }
        }
    }

    /// The admission of a static pod (its fields were validated when it was
    /// read): unsafe sysctls, and what the node's runtime cannot enforce.
    fn static_admission(&self, pod: &Pod) -> Result<(), api::admission::Rejection> {
        crate::sysctls::admit(pod, &self.allowed_unsafe_sysctls).map_err(|e| {
            api::admission::Rejection {
                reason: "SysctlForbidden".into(),
                message: format!("Pod was rejected: {e}"),
            }
        })?;
        api::admission::runtime_supports(pod, &self.runtime_support)
    }

    /// An update that adds a field evlet does not honour to a running pod
    /// (an ephemeral container from `kubectl debug`): the pod keeps running
    /// as it was and a Warning event names the field.
    fn refuse_new_fields(&self, pod: &Pod) {
        let (Some(old), Some(spec)) = (self.pods.get(&pod::uid(pod)), pod.spec.as_ref()) else {
            return;
        };
        let before: BTreeSet<String> = old
            .spec
            .as_ref()
            .map(|s| {
                crate::validation::unsupported(s)
                    .into_iter()
                    .map(|e| e.to_string())
                    .collect()
            })
            .unwrap_or_default();
        for e in crate::validation::unsupported(spec) {
            let message = e.to_string();
            if !before.contains(&message) {
                tracing::warn!(pod = %pod::key(pod), field = %e.field, "pod update uses a field evlet does not honour");
                self.syncer
                    .record_pod_event(pod, "Warning", "UnsupportedPodSpec", message);
            }
        }
    }

    /// Upstream resizes a pod's own resources in place (its
    /// InPlacePodLevelResourcesVerticalScaling); evlet does not: a running
    /// pod keeps the `spec.resources` it started with (its cgroup, its
    /// containers' limits and its QoS class stay consistent), and a Warning
    /// event says so.
    fn keep_pod_resources(&self, pod: &mut Arc<Pod>) {
        let Some(old) = self.pods.get(&pod::uid(pod)) else {
            return;
        };
        let old = old.spec.as_ref().and_then(|s| s.resources.clone());
        if pod.spec.as_ref().is_none_or(|s| s.resources == old) {
            return;
        }
        let pod = Arc::make_mut(pod);
        if let Some(spec) = pod.spec.as_mut() {
            spec.resources = old;
        }
        tracing::warn!(pod = %pod::key(pod), "pod update changes spec.resources, which evlet does not resize in place");
        self.syncer.record_pod_event(
            pod,
            "Warning",
            "UnsupportedPodSpec",
            "spec.resources: Forbidden: evlet does not resize pod-level resources in place; the pod keeps the resources it started with".into(),
        );
    }

    /// A static source's pods with one pod per full name (`name_namespace`):
    /// the first in the source's order (file names sorted) is kept and the
    /// others are refused with upstream's `FailedValidation` event.
    fn without_duplicate_names(&self, source: Source, pods: Vec<Arc<Pod>>) -> Vec<Arc<Pod>> {
        if source == Source::Api {
            return pods;
        }
        let mut seen = BTreeSet::new();
        pods.into_iter()
            .filter(|p| {
                let unique = seen.insert(pod::full_name(p));
                if !unique {
                    let message = format!(
                        "Error validating pod {}_{}({}) from {} due to duplicate pod name {:?}, ignoring",
                        pod::name(p),
                        pod::namespace(p),
                        pod::uid(p),
                        source.as_str(),
                        pod::name(p)
                    );
                    tracing::warn!(pod = %pod::key(p), "{message}");
                    self.syncer.record_pod_event(p, "Warning", "FailedValidation", message);
                }
                unique
            })
            .collect()
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
                        Arc::clone(p),
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
        self.served.diagnostics.trace(
            &event.uid.0,
            crate::diagnostics::Source::Pleg,
            format!("{:?} {}", event.kind, evlet_cri::ids::short(&event.data)),
        );
        if event.kind == crate::pleg::EventType::ContainerRemoved {
            return;
        }
        if let Some(pod) = self.pods.get(&event.uid) {
            self.workers.update(pod.clone(), UpdateKind::Sync);
        }
    }

    /// A changed probe verdict syncs its pod at once (upstream's
    /// `handleProbeSync`): SyncPod restarts a container that failed its
    /// liveness or startup probe, and the status shows readiness. A liveness
    /// success changes nothing.
    fn handle_probe(&mut self, update: ProbeUpdate) {
        self.served.diagnostics.trace(
            &update.uid.0,
            crate::diagnostics::Source::Probe,
            format!(
                "{} probe of {}: {:?}",
                update.kind.as_str(),
                update.container,
                update.verdict
            ),
        );
        if update.kind == ProbeKind::Liveness && update.verdict == Verdict::Success {
            return;
        }
        if let Some(pod) = self.pods.get(&update.uid) {
            tracing::debug!(pod = %pod::key(pod), container = %update.container, probe = update.kind.as_str(), verdict = ?update.verdict, "probe verdict changed");
            self.workers.update(pod.clone(), UpdateKind::Sync);
        }
    }

    /// A watched ConfigMap or Secret changed: the pods that use it sync now, so
    /// their volumes (and, on a restart, their env) get the new data.
    fn handle_object(&mut self, changed: &Changed) {
        let secret = changed.kind == crate::api::watched::Kind::Secret;
        for pod in self.pods.values().filter(|p| {
            pod::namespace(p) == changed.namespace && pod::refers_to(p, secret, &changed.name)
        }) {
            tracing::debug!(pod = %pod::key(pod), object = %changed.name, "an object the pod uses changed");
            self.workers.update(pod.clone(), UpdateKind::Sync);
        }
    }

    /// The desired pods that are still active: not Succeeded or Failed
    /// (upstream's `GetActivePods`, what admission and the QoS shares count).
    fn active_pods(&self) -> impl Iterator<Item = (&PodUid, &Pod)> {
        self.pods
            .iter()
            .filter(|(uid, _)| !self.workers.is_terminal(uid))
            .map(|(uid, p)| (uid, &**p))
    }

    /// Orphans: pods the runtime has that no source wants and no worker owns.
    /// Only once every source has reported (`sourcesReady`), like upstream.
    async fn housekeeping(&mut self) {
        self.syncer.gc();
        // The burstable tier's CPU shares follow its desired pods' requests:
        // summed again only after the pods changed, written only when the sum did.
        if self.qos_stale {
            let active: Vec<&Pod> = self.active_pods().map(|(_, p)| p).collect();
            match self.syncer.cgroups().update_qos(active).await {
                Ok(()) => self.qos_stale = false,
                Err(e) => tracing::warn!(error = %e, "cannot update the QoS cgroups"),
            }
        }
        if !self.config.sources_ready() {
            return;
        }
        // Leftovers of pods gone while the agent was down go as soon as the
        // sources tell which pods are wanted, then with each container GC.
        if !self.swept_orphans {
            self.clean_orphans();
        }
        // At hundreds of pods, looking every 2 s at each was most of what an
        // idle agent spent: looked at again only when a pod came or went.
        let generation = self.cache.known_generation();
        if self.no_orphans_at == Some(generation) {
            return;
        }
        let undesired = self.cache.known_where(|s| !self.pods.contains_key(&s.uid));
        self.no_orphans_at = undesired.is_empty().then_some(generation);
        for status in undesired {
            if self.workers.has(&status.uid) {
                continue;
            }
            let running = status.any_running() || status.sandboxes.iter().any(|s| s.ready);
            tracing::info!(pod = %status.uid, name = %status.name, namespace = %status.namespace, running, "removing orphaned pod");
            let orphan = orphan_pod(&status);
            self.workers.update(orphan, UpdateKind::Kill(None));
        }
    }

    /// Removes what pods neither desired, nor worked on, nor in the runtime
    /// left behind: their directories (an agent that went down mid-way, a pod
    /// removed while it was down) and their cgroups (upstream's
    /// cleanupOrphanedPodCgroups). Only once every source has reported, like
    /// orphaned pods, and the runtime has been listed whole (a pod it still
    /// runs keeps its own until its worker has stopped it gracefully).
    fn clean_orphans(&mut self) {
        if !self.config.sources_ready() || self.cache.global().is_none() {
            return;
        }
        self.swept_orphans = true;
        let keep: BTreeSet<String> = self
            .pods
            .keys()
            .chain(self.workers.uids().iter())
            .map(|u| u.0.clone())
            .chain(self.cache.known().iter().map(|s| s.uid.0.clone()))
            .collect();
        // Listed in this turn, where no pod is added between the listing and `keep`.
        let cgroups: Vec<String> = self
            .syncer
            .cgroups()
            .pod_uids()
            .into_iter()
            .filter(|uid| !keep.contains(uid))
            .collect();
        let syncer = Arc::clone(&self.syncer);
        tokio::spawn(async move {
            syncer.remove_orphan_cgroups(&cgroups).await;
            syncer.clean_orphan_dirs(keep).await;
        });
    }

    /// One container collection: how many dead containers it removes, and
    /// the tasks removing them. A node-level reclaim (`reclaim`, the eviction
    /// manager's) also takes every dead container and stopped sandbox of the
    /// pods that finished (upstream's `evictNonDeletedPods`).
    fn container_gc(&mut self, reclaim: bool) -> (usize, Vec<tokio::task::JoinHandle<()>>) {
        self.clean_orphans();
        // Evicted pods keep no container (upstream's ShouldPodContentBeRemoved,
        // once all sources are ready), nor finished ones in a reclaim.
        let remove_all: BTreeSet<PodUid> = if self.config.sources_ready() {
            self.workers
                .views_where(|v| {
                    (crate::eviction::is_evicted(&v.status)
                        && crate::container_gc::status_settled(&v.status))
                        || (reclaim
                            && matches!(v.status.phase.as_deref(), Some("Succeeded" | "Failed")))
                })
                .into_iter()
                .map(|v| pod::uid(&v.pod))
                .collect()
        } else {
            BTreeSet::new()
        };
        let known = self.cache.known();
        let dead = crate::container_gc::evictable(
            known.iter().map(|p| &**p),
            &self.container_gc,
            crate::clock::unix_ns(),
            &remove_all,
        );
        let removed = dead.len();
        let mut by_pod: BTreeMap<PodUid, Vec<evlet_cri::ContainerId>> = BTreeMap::new();
        for d in dead {
            by_pod.entry(d.pod).or_default().push(d.id);
        }
        let mut removals = Vec::new();
        for status in known {
            let ids = by_pod.remove(&status.uid).unwrap_or_default();
            // An evicted pod's stopped sandboxes go once no container is left,
            // also in a later pass than its containers' (the sandbox may still
            // have been ready then, or the pod never had a container).
            let sandboxes = if remove_all.contains(&status.uid) {
                crate::container_gc::dead_sandboxes(&status, &ids)
            } else {
                Vec::new()
            };
            if ids.is_empty() && sandboxes.is_empty() {
                continue;
            }
            let syncer = Arc::clone(&self.syncer);
            let hints = self.hints.clone();
            removals.push(tokio::spawn(async move {
                // The agent's own removals must not look like external changes.
                if let Some(h) = &hints {
                    h.suspend(status.uid.clone());
                }
                syncer.remove_dead(&status, &ids).await;
                syncer.remove_sandboxes(&sandboxes).await;
                if let Some(h) = &hints {
                    h.resume(status.uid.clone(), true);
                }
            }));
        }
        (removed, removals)
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
    // Upstream restores the grace period from the containers' annotations;
    // 30 s (the API default) when none says.
    let grace = status
        .containers
        .iter()
        .filter_map(|c| c.grace_period)
        .max()
        .unwrap_or(30);
    pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        termination_grace_period_seconds: Some(grace),
        ..Default::default()
    });
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ContainerStatus, PodStatus, State};

    fn container(grace: Option<i64>) -> ContainerStatus {
        ContainerStatus {
            grace_period: grace,
            ..ContainerStatus::test("app", 1, State::Running)
        }
    }

    #[test]
    fn an_orphan_is_killed_with_the_grace_period_its_containers_were_made_with() {
        let grace = |containers: Vec<ContainerStatus>| {
            let mut status = PodStatus::empty(PodUid("u".into()));
            status.containers = containers;
            orphan_pod(&status)
                .spec
                .and_then(|s| s.termination_grace_period_seconds)
        };
        assert_eq!(grace(vec![container(Some(1))]), Some(1));
        assert_eq!(grace(vec![container(None)]), Some(30), "the API default");
    }
}
