//! Pod workers: one task per pod UID, serial per pod, coalescing updates.
//!
//! A worker's life is a small state machine ([`Phase`]): `Sync` (SyncPod until
//! the pod is deleted) → `Terminating` (stop containers within the grace period)
//! → `Terminated` (remove containers, sandboxes, volumes, cgroups) → done.
//! Before every sync it waits until the pod cache is newer than its previous
//! sync, so it never acts twice on a state that predates its own actions
//! (upstream's `GetNewerThan`; the duplicate-container bug of Evented PLEG).
//! A kill cancels an in-flight sync. Only the newest pending update is kept.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus as V1PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Retry;
use crate::cache::PodCache;
use crate::diagnostics::Source;
use crate::lock::lock;
use crate::metrics::Metrics;
use crate::pleg::hints::Hints;
use crate::pod::{self, PodUid};
use crate::probe::PodProbes;
use crate::prober::{Instance, Prober, Target};
use crate::runtime::{PodStatus, State};
use crate::status;
use crate::status::Waiting;
use crate::sync::actions::SpecHashes;
use crate::sync::{SyncOutcome, Syncer};

/// Upstream's default `syncFrequency`: a pod with nothing to do is synced
/// again after 100–150 % of it (upstream's `wait.Jitter(resyncInterval, 0.5)`).
/// `Config::sync_frequency` sets it.
pub const RESYNC: Duration = Duration::from_secs(60);
/// Upstream's `backOffPeriod` for sync errors (each wait is 100–150 % of it,
/// `wait.Jitter(backOffPeriod, 0.5)`).
pub const ERROR_BACKOFF: Duration = Duration::from_secs(10);
/// Upstream's sync loop syncs the pods whose resync came due on its 1 s
/// `syncTicker`; evlet's workers keep their own timers, due on the agent's
/// shared 1 s ticks ([`crate::clock::next_tick`]), so one wake-up serves every
/// pod due within that second. Shorter periods (tests) tick at a tenth of it.
pub const RESYNC_TICK: Duration = Duration::from_secs(1);

/// When a periodic resync due at `at` runs: on the next shared tick.
fn resync_at(at: Instant, period: Duration) -> Instant {
    crate::clock::on_tick(
        crate::clock::tick_origin(),
        at,
        RESYNC_TICK.min(period / 10),
    )
}

/// Where the statuses workers compute go beyond the local `/pods` view (the
/// API server's status manager). Declared here, by its consumer.
pub trait StatusSink: Send + Sync + std::fmt::Debug {
    /// The newest status computed for `pod`.
    fn set(&self, pod: &Pod, status: &V1PodStatus);
}

/// What the workers work with.
#[derive(Debug, Clone)]
pub struct Collaborators {
    /// Carries out SyncPod and termination.
    pub syncer: Arc<Syncer>,
    /// The pod cache (read side).
    pub cache: PodCache,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The hinted PLEG's hint set: a pod's relists wait while it syncs, and one
    /// relist follows a sync that made runtime calls (invariant 4). None: generic.
    pub hints: Option<Arc<Hints>>,
    /// Where computed statuses also go (API-server mode).
    pub status_sink: Option<Arc<dyn StatusSink>>,
    /// Mean period of a pod's periodic sync (`syncFrequency`).
    pub resync: Duration,
    /// Probes the pods' containers; its verdicts drive ready and restarts.
    pub prober: Prober,
}

/// What an update asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    /// The pod is new or its spec changed, or something happened to it: sync.
    Sync,
    /// The pod must stop: terminate with this grace period (None: the pod's own).
    Kill(Option<i64>),
}

/// A worker's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Running SyncPod.
    Sync,
    /// Stopping containers within the grace period.
    Terminating(Option<i64>),
    /// Removing what is left.
    Terminated,
    /// Failed for good while it ran (`activeDeadlineSeconds`): stopped, shown
    /// Failed, never started again; removed once its source drops it.
    Finished,
}

#[derive(Debug)]
struct Pending {
    pod: Arc<Pod>,
    kill: Option<Option<i64>>,
    /// Set by an eviction: the kill fails the pod with this reason and message.
    failure: Option<(String, String)>,
}

/// Is `new` the pod the worker holds (the same shared copy, or equal)?
fn same_pod(held: Option<&Arc<Pod>>, new: &Arc<Pod>) -> bool {
    held.is_some_and(|h| Arc::ptr_eq(h, new) || **h == **new)
}

#[derive(Debug)]
struct Handle {
    pending: Arc<Mutex<Option<Pending>>>,
    wake: Arc<Notify>,
    /// Cancels the in-flight sync (not termination).
    cancel_sync: Arc<Mutex<CancellationToken>>,
    phase: Arc<Mutex<Phase>>,
}

/// The computed status of a pod as workers last saw it.
#[derive(Debug, Clone)]
pub struct PodView {
    /// The pod spec the worker works on (shared with the worker: no copy per publish).
    pub pod: Arc<Pod>,
    /// The computed status.
    pub status: V1PodStatus,
    /// The worker's phase.
    pub phase: Phase,
}

/// Shared by all workers.
#[derive(Debug)]
struct Shared {
    syncer: Arc<Syncer>,
    cache: PodCache,
    metrics: Arc<Metrics>,
    workers: Mutex<HashMap<PodUid, Handle>>,
    views: Mutex<BTreeMap<PodUid, PodView>>,
    /// Told when a worker finished (its pod fully removed).
    done: mpsc::UnboundedSender<PodUid>,
    /// The hinted PLEG's hint set: a pod's relists wait while it syncs, and one
    /// relist follows a sync that made runtime calls (invariant 4).
    hints: Option<Arc<Hints>>,
    /// Mean period of a pod's periodic sync.
    resync: Duration,
    /// Where computed statuses also go (API-server mode).
    status_sink: Option<Arc<dyn StatusSink>>,
    /// Probes the pods' containers.
    prober: Prober,
    shutdown: CancellationToken,
}

/// The set of pod workers.
#[derive(Debug, Clone)]
pub struct PodWorkers {
    shared: Arc<Shared>,
}

/// A pod status in one line: the phase and each container's state.
fn status_summary(s: &V1PodStatus) -> String {
    let state = |c: &k8s_openapi::api::core::v1::ContainerStatus| {
        let st = c.state.as_ref();
        if let Some(t) = st.and_then(|s| s.terminated.as_ref()) {
            format!(
                "{} terminated ({}, exit {})",
                c.name,
                t.reason.as_deref().unwrap_or(""),
                t.exit_code
            )
        } else if let Some(w) = st.and_then(|s| s.waiting.as_ref()) {
            format!("{} waiting ({})", c.name, w.reason.as_deref().unwrap_or(""))
        } else if st.and_then(|s| s.running.as_ref()).is_some() {
            format!("{} running{}", c.name, if c.ready { ", ready" } else { "" })
        } else {
            format!("{} unknown", c.name)
        }
    };
    let containers: Vec<String> = s
        .init_container_statuses
        .iter()
        .chain(s.container_statuses.iter())
        .flatten()
        .map(state)
        .collect();
    format!(
        "{}: {}",
        s.phase.as_deref().unwrap_or("Unknown"),
        containers.join("; ")
    )
}

fn now_time() -> Time {
    crate::clock::now()
}

impl PodWorkers {
    /// Workers working with `c`. Finished pods are reported on `done`; they
    /// stop at `shutdown` (pods keep running).
    pub fn new(
        c: Collaborators,
        done: mpsc::UnboundedSender<PodUid>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                syncer: c.syncer,
                cache: c.cache,
                metrics: c.metrics,
                workers: Mutex::new(HashMap::new()),
                views: Mutex::new(BTreeMap::new()),
                done,
                hints: c.hints,
                resync: c.resync,
                status_sink: c.status_sink,
                prober: c.prober,
                shutdown,
            }),
        }
    }

    /// Queues an update for `pod`'s worker, starting the worker if needed.
    /// A kill cancels an in-flight sync; a later sync never undoes a kill.
    pub fn update(&self, pod: impl Into<Arc<Pod>>, kind: UpdateKind) {
        self.queue(pod.into(), kind, None);
    }

    /// Fails a running pod for good (an eviction): it is killed with `grace`
    /// and then shown `Failed` with `reason` and `message`, never started
    /// again, and removed once its source drops it. A pod without a worker, or
    /// one already terminating, is left alone: false.
    pub fn fail(
        &self,
        pod: impl Into<Arc<Pod>>,
        grace: Option<i64>,
        reason: &str,
        message: &str,
    ) -> bool {
        let pod = pod.into();
        let uid = pod::uid(&pod);
        let running = lock(&self.shared.workers)
            .get(&uid)
            .is_some_and(|h| *lock(&h.phase) == Phase::Sync);
        if running {
            self.queue(
                pod,
                UpdateKind::Kill(grace),
                Some((reason.to_owned(), message.to_owned())),
            );
        }
        running
    }

    fn queue(&self, pod: Arc<Pod>, kind: UpdateKind, failure: Option<(String, String)>) {
        let uid = pod::uid(&pod);
        let mut workers = lock(&self.shared.workers);
        let handle = workers.entry(uid.clone()).or_insert_with(|| {
            let handle = Handle {
                pending: Arc::new(Mutex::new(None)),
                wake: Arc::new(Notify::new()),
                cancel_sync: Arc::new(Mutex::new(CancellationToken::new())),
                phase: Arc::new(Mutex::new(Phase::Sync)),
            };
            let worker = Worker {
                uid: uid.clone(),
                shared: Arc::clone(&self.shared),
                pending: Arc::clone(&handle.pending),
                wake: Arc::clone(&handle.wake),
                cancel_sync: Arc::clone(&handle.cancel_sync),
                phase: Arc::clone(&handle.phase),
                first_seen: Instant::now(),
            };
            tokio::spawn(worker.run());
            handle
        });
        {
            let mut pending = lock(&handle.pending);
            let kill = match (kind, pending.as_ref().and_then(|p| p.kill)) {
                (UpdateKind::Kill(g), Some(prev)) => Some(match (g, prev) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }),
                (UpdateKind::Kill(g), None) => Some(g),
                (UpdateKind::Sync, prev) => prev,
            };
            let failure = failure.or_else(|| pending.as_mut().and_then(|p| p.failure.take()));
            *pending = Some(Pending { pod, kill, failure });
        }
        if matches!(kind, UpdateKind::Kill(_)) {
            lock(&handle.cancel_sync).cancel();
        }
        handle.wake.notify_one();
    }

    /// Shows a pod that has no worker (rejected at admission) with `status`.
    pub fn set_view(&self, pod: impl Into<Arc<Pod>>, status: V1PodStatus) {
        let pod = pod.into();
        if let Some(sink) = &self.shared.status_sink {
            sink.set(&pod, &status);
        }
        lock(&self.shared.views).insert(
            pod::uid(&pod),
            PodView {
                pod,
                status,
                phase: Phase::Terminated,
            },
        );
    }

    /// Does a worker exist for `uid`?
    pub fn has(&self, uid: &PodUid) -> bool {
        lock(&self.shared.workers).contains_key(uid)
    }

    /// The pods that have a worker.
    pub fn uids(&self) -> Vec<PodUid> {
        lock(&self.shared.workers).keys().cloned().collect()
    }

    /// Every pod with a worker (or a view) and its computed status.
    pub fn views(&self) -> Vec<PodView> {
        self.views_where(|_| true)
    }

    /// The views for which `keep` holds: only those are copied (a status
    /// copy per pod is what a view costs; periodic checks want few of them).
    pub fn views_where(&self, keep: impl Fn(&PodView) -> bool) -> Vec<PodView> {
        lock(&self.shared.views)
            .values()
            .filter(|v| keep(v))
            .cloned()
            .collect()
    }

    /// The view of the pod `namespace`/`name`.
    pub fn find(&self, namespace: &str, name: &str) -> Option<PodView> {
        lock(&self.shared.views)
            .values()
            .find(|v| {
                v.pod.metadata.name.as_deref() == Some(name)
                    && v.pod.metadata.namespace.as_deref().unwrap_or("default") == namespace
            })
            .cloned()
    }

    /// Has the pod's computed status a terminal phase (Succeeded, Failed)?
    /// Such a pod is no longer active: its requests count toward neither
    /// admission nor the QoS shares (upstream's `filterOutInactivePods`).
    pub fn is_terminal(&self, uid: &PodUid) -> bool {
        lock(&self.shared.views)
            .get(uid)
            .is_some_and(|v| matches!(v.status.phase.as_deref(), Some("Succeeded" | "Failed")))
    }

    /// The view of one pod.
    pub fn view(&self, uid: &PodUid) -> Option<PodView> {
        lock(&self.shared.views).get(uid).cloned()
    }

    /// Forgets a finished worker (called by the sync loop on a `done` message).
    pub fn forget(&self, uid: &PodUid) {
        lock(&self.shared.workers).remove(uid);
        lock(&self.shared.views).remove(uid);
        self.shared.metrics.startup.forget(&uid.0);
    }
}

struct Worker {
    uid: PodUid,
    shared: Arc<Shared>,
    pending: Arc<Mutex<Option<Pending>>>,
    wake: Arc<Notify>,
    cancel_sync: Arc<Mutex<CancellationToken>>,
    phase: Arc<Mutex<Phase>>,
    /// When the agent saw the pod first (`kubelet_pod_start_duration_seconds`).
    first_seen: Instant,
}

impl Worker {
    fn take(&self) -> Option<Pending> {
        lock(&self.pending).take()
    }

    fn sync_started(&self) {
        if let Some(h) = &self.shared.hints {
            h.suspend(self.uid.clone());
        }
    }

    fn sync_finished(&self, changed: bool) {
        if let Some(h) = &self.shared.hints {
            h.resume(self.uid.clone(), changed);
        }
    }

    /// Computes and publishes the status, unless its inputs are the ones of
    /// the last publish (a periodic sync of a quiet pod: the same pod, the same
    /// cached runtime status, the same waiting reasons and probe verdicts):
    /// then nothing changed. What was published goes to the prober too.
    /// The pod-start metrics: first seen → Running the first time a
    /// published status turns Running (not for a pod found running), and the
    /// startup SLI.
    fn observe_start(&self, memo: Option<&Published>, pod: &Pod, computed: &V1PodStatus) {
        let running = |s: &V1PodStatus| s.phase.as_deref() == Some("Running");
        let metrics = &self.shared.metrics;
        if running(computed)
            && let Some(before) = memo.and_then(|m| m.status.as_ref())
            && !running(before)
        {
            metrics
                .pod_start_duration
                .observe(self.first_seen.elapsed().as_secs_f64());
        }
        metrics
            .startup
            .published(pod, computed, crate::clock::unix_ns());
    }

    fn publish(
        &self,
        memo: &mut Option<Published>,
        pod: &Arc<Pod>,
        runtime: &Arc<PodStatus>,
        extra: &status::Extra<'_>,
        phase: Phase,
    ) {
        let probes = self.shared.prober.verdicts(&self.uid);
        let inputs = Published {
            pod: Arc::clone(pod),
            runtime: Arc::clone(runtime),
            waiting: extra.waiting.cloned(),
            start_time: extra.start_time.clone(),
            host_ip: extra.host_ip.map(str::to_owned),
            failed: extra.failed,
            failure: extra.failure.map(|(r, m)| (r.to_owned(), m.to_owned())),
            phase,
            probes,
            status: None,
        };
        if memo.as_ref().is_some_and(|m| m.same(&inputs)) {
            return;
        }
        let extra = status::Extra {
            probes: Some(&inputs.probes),
            previous: memo.as_ref().and_then(|m| m.status.as_ref()),
            now: Some(now_time()),
            ..extra.clone()
        };
        let computed = status::compute(pod, runtime, &extra);
        self.observe_start(memo.as_ref(), pod, &computed);
        let summary = status_summary(&computed);
        let changed = memo
            .as_ref()
            .and_then(|m| m.status.as_ref())
            .is_none_or(|before| status_summary(before) != summary);
        self.shared
            .prober
            .observe(&self.uid, probe_target(pod, runtime, &computed));
        if let Some(sink) = &self.shared.status_sink {
            sink.set(pod, &computed);
        }
        lock(&self.shared.views).insert(
            self.uid.clone(),
            PodView {
                pod: Arc::clone(pod),
                status: computed.clone(),
                phase,
            },
        );
        if changed {
            // Stamped once the status is served (`/pods`, the status sink).
            self.shared.syncer.trace(pod, Source::Status, summary);
        }
        *memo = Some(Published {
            status: Some(computed),
            ..inputs
        });
    }

    /// Releases a pod that will run nothing again ([`Syncer::release_finished`]),
    /// once; a failure is tried again in a second.
    async fn release_once(
        &self,
        released: &mut bool,
        pod: &Pod,
        next_resync: &mut Option<Instant>,
    ) {
        if *released {
            return;
        }
        match self.shared.syncer.release_finished(pod).await {
            Ok(()) => *released = true,
            Err(e) => {
                tracing::warn!(pod = %pod::key(pod), error = %e, "releasing a finished pod's volumes and cgroup failed; retrying");
                *next_resync = Some(Instant::now() + Duration::from_secs(1));
            }
        }
    }

    /// Waits for a cache entry newer than `since`, unless shutting down. In the
    /// hinted PLEG modes nothing relists a quiet pod by itself, so the worker asks
    /// (the dispatcher relists it or proves it quiet).
    async fn fresh(&self, since: Instant) -> Option<Arc<PodStatus>> {
        if let Some(h) = &self.shared.hints
            && self.shared.cache.fresh(&self.uid, since).is_none()
        {
            h.fresh(self.uid.clone(), since);
        }
        tokio::select! {
            () = self.shared.shutdown.cancelled() => None,
            entry = self.shared.cache.newer_than(&self.uid, since) => Some(match entry.status {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(pod = %self.uid, error = %e, "pod cache has an error; syncing with an empty status");
                    Arc::new(PodStatus::empty(self.uid.clone()))
                }
            }),
        }
    }

    async fn run(self) {
        let mut pod: Option<Arc<Pod>> = None;
        // The spec hashes of `pod`'s containers, computed once per spec.
        let mut hashes = SpecHashes::default();
        let mut published: Option<Published> = None;
        let mut last_sync: Option<Instant> = None;
        let mut next_resync: Option<Instant> = None;
        let mut waiting: BTreeMap<String, Waiting> = BTreeMap::new();
        let mut failed = false;
        // Set when the pod failed while running (activeDeadlineSeconds).
        let mut failure: Option<(String, String)> = None;
        // Set when the source deleted the pod (its kill is not a failure's).
        let mut deleted = false;
        // Set once a finished pod's volumes and cgroup are released.
        let mut released = false;
        let mut errors = Retry::fixed(ERROR_BACKOFF).jitter(1.0, 1.5);
        // When the pod started on this node: set at its first sync.
        let mut start_time: Option<Time> = None;
        let host_ip = self.shared.syncer.node().host_ip.clone();
        // Set when the current phase must run without waiting (a phase changed).
        let mut run_now = false;
        // Upstream's update type of the next sync, for its duration metric:
        // `create` first, `update` after a changed pod, else `sync` (PLEG
        // events, probes, the resync timer).
        let mut operation = "create";
        loop {
            if let Some(p) = self.take() {
                let same = same_pod(pod.as_ref(), &p.pod);
                if pod.is_none() {
                    self.shared.metrics.startup.seen(&p.pod);
                    self.shared.syncer.name_pod(&p.pod);
                } else if operation != "create" && !same {
                    operation = "update";
                }
                if p.failure.is_some() {
                    failure = p.failure;
                } else if p.kill.is_some() {
                    // The source deleted it: it goes, failed or not.
                    deleted = true;
                }
                if let Some(grace) = p.kill {
                    let mut phase = lock(&self.phase);
                    match *phase {
                        Phase::Sync => *phase = Phase::Terminating(grace),
                        Phase::Finished => *phase = Phase::Terminated,
                        _ => {}
                    }
                }
                if !same {
                    hashes = SpecHashes::of(&p.pod);
                }
                // The latest copy: the one the sync loop holds too.
                pod = Some(p.pod);
            } else if !run_now {
                // Wait for an update or the resync timer.
                let sleep = async {
                    match next_resync {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = self.shared.shutdown.cancelled() => return,
                    () = self.wake.notified() => continue,
                    () = sleep => {}
                }
            }
            run_now = false;
            let Some(current) = pod.clone() else { continue };
            let phase = *lock(&self.phase);
            match phase {
                Phase::Sync => {
                    let since = last_sync.unwrap_or_else(first_since);
                    let Some(runtime) = self.fresh(since).await else {
                        return;
                    };
                    // Take a kill that arrived while waiting before syncing.
                    if lock(&self.pending)
                        .as_ref()
                        .is_some_and(|p| p.kill.is_some())
                    {
                        continue;
                    }
                    let started_at = start_time
                        .get_or_insert_with(|| pod_start_time(&current, &runtime))
                        .clone();
                    if let Some(left) = deadline_left(&current, &started_at)
                        && left.is_zero()
                    {
                        // activeDeadlineSeconds: the pod fails and is killed (upstream).
                        let message =
                            "Pod was active on the node longer than the specified deadline";
                        self.shared.syncer.record_pod_event(
                            &current,
                            "Normal",
                            "DeadlineExceeded",
                            message.into(),
                        );
                        tracing::info!(pod = %pod::key(&current), "active deadline exceeded; killing the pod");
                        failure = Some(("DeadlineExceeded".into(), message.into()));
                        *lock(&self.phase) = Phase::Terminating(None);
                        run_now = true;
                        continue;
                    }
                    // Like upstream's SyncPod: what the runtime says goes out before
                    // any action, so an exit is visible while the sync reacts to it.
                    let extra = sync_extra(&waiting, &started_at, host_ip.as_deref(), failed);
                    self.publish(&mut published, &current, &runtime, &extra, Phase::Sync);
                    let token = {
                        let mut t = lock(&self.cancel_sync);
                        *t = CancellationToken::new();
                        t.clone()
                    };
                    let started = Instant::now();
                    // Probe the pod's containers (idempotent), and act on the verdicts.
                    self.shared.prober.add_pod(&current);
                    let probes = self.shared.prober.verdicts(&self.uid);
                    self.sync_started();
                    // Boxed, like the two below: a sync's future is tens of KiB,
                    // and inline it would make every idle worker that large.
                    let result = Box::pin(
                        self.shared
                            .syncer
                            .sync_pod(&current, &runtime, &hashes, &probes, &token),
                    )
                    .await;
                    // Upstream stamps the end: a relist made while the sync ran may show
                    // its half-done work (a container created, not yet started).
                    last_sync = Some(Instant::now());
                    self.shared
                        .metrics
                        .pod_worker_duration
                        .with_label_values(&[operation])
                        .observe(started.elapsed().as_secs_f64());
                    let took = started.elapsed().as_millis();
                    match &result {
                        Ok(o) if o.changed => self.shared.syncer.trace(
                            &current,
                            Source::Sync,
                            format!("sync ({operation}) acted in {took} ms"),
                        ),
                        Ok(_) => {}
                        Err(e) => self.shared.syncer.trace(
                            &current,
                            Source::Sync,
                            format!("sync ({operation}) failed after {took} ms: {e}"),
                        ),
                    }
                    operation = "sync";
                    let (at, changed) = match result {
                        Ok(SyncOutcome {
                            waiting: w,
                            retry_after,
                            changed,
                            failed: f,
                        }) => {
                            waiting = w;
                            failed |= f;
                            let jitter = self.shared.resync.mul_f64(1.0 + 0.5 * fastrand::f64());
                            let at = match retry_after {
                                Some(r) if r < jitter => Instant::now() + r,
                                // The periodic resync, on the shared ticks.
                                _ => resync_at(Instant::now() + jitter, self.shared.resync),
                            };
                            (at, changed)
                        }
                        Err(e) => {
                            tracing::warn!(pod = %pod::key(&current), error = %e, "sync failed; retrying");
                            (Instant::now() + errors.next_delay(), true)
                        }
                    };
                    self.sync_finished(changed);
                    next_resync = Some(at);
                    // The status reflects the cache as the sync saw it, with this
                    // sync's waiting reasons; the next relist's event refreshes it.
                    // Sync again when the active deadline comes.
                    if let Some(left) = deadline_left(&current, &started_at) {
                        next_resync = next_resync.map(|n| n.min(Instant::now() + left));
                    }
                    let extra = sync_extra(&waiting, &started_at, host_ip.as_deref(), failed);
                    self.publish(&mut published, &current, &runtime, &extra, Phase::Sync);
                    // A pod that completed (Succeeded, or Failed under its
                    // restart policy) runs nothing again: once its sandbox
                    // is stopped its volumes and cgroup go, as upstream's
                    // SyncTerminatedPod frees a terminal pod's.
                    let terminal = published
                        .as_ref()
                        .and_then(|p| p.status.as_ref())
                        .is_some_and(|s| {
                            matches!(s.phase.as_deref(), Some("Succeeded" | "Failed"))
                        });
                    if terminal
                        && !runtime.any_running()
                        && runtime.sandboxes.iter().all(|s| !s.ready)
                    {
                        self.release_once(&mut released, &current, &mut next_resync)
                            .await;
                    }
                }
                Phase::Terminating(grace) => {
                    let since = last_sync.unwrap_or_else(first_since);
                    let Some(runtime) = self.fresh(since).await else {
                        return;
                    };
                    // Readiness is still probed while the pod terminates (upstream).
                    self.shared.prober.stop_liveness_and_startup(&current);
                    if let Some((reason, message)) = &failure {
                        // A pod that failed while running (its active deadline)
                        // says so at once, as upstream's status does; the kill
                        // takes its grace period meanwhile.
                        let extra = status::Extra {
                            start_time: Some(
                                start_time
                                    .get_or_insert_with(|| pod_start_time(&current, &runtime))
                                    .clone(),
                            ),
                            host_ip: host_ip.as_deref(),
                            failed,
                            failure: Some((reason.as_str(), message.as_str())),
                            ..Default::default()
                        };
                        self.publish(
                            &mut published,
                            &current,
                            &runtime,
                            &extra,
                            Phase::Terminating(grace),
                        );
                    }
                    self.sync_started();
                    let started = Instant::now();
                    let result =
                        Box::pin(self.shared.syncer.kill_pod(&current, &runtime, grace)).await;
                    self.shared
                        .metrics
                        .pod_worker_duration
                        .with_label_values(&["kill"])
                        .observe(started.elapsed().as_secs_f64());
                    self.shared.syncer.trace(
                        &current,
                        Source::Sync,
                        match &result {
                            Ok(()) => format!("kill done in {} ms", started.elapsed().as_millis()),
                            Err(e) => format!("kill failed: {e}"),
                        },
                    );
                    self.sync_finished(true);
                    last_sync = Some(Instant::now());
                    match result {
                        Ok(()) => {
                            tracing::info!(pod = %pod::key(&current), "pod terminated");
                            let mut phase = lock(&self.phase);
                            if failure.is_some()
                                && !deleted
                                && lock(&self.pending)
                                    .as_ref()
                                    .is_none_or(|p| p.kill.is_none())
                            {
                                // Failed while running: it stays, stopped and Failed.
                                *phase = Phase::Finished;
                            } else {
                                *phase = Phase::Terminated;
                                run_now = true;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(pod = %pod::key(&current), error = %e, "terminating pod failed; retrying");
                            next_resync = Some(Instant::now() + Duration::from_secs(1));
                        }
                    }
                    let extra = status::Extra {
                        waiting: None,
                        start_time: Some(
                            start_time
                                .get_or_insert_with(|| pod_start_time(&current, &runtime))
                                .clone(),
                        ),
                        host_ip: host_ip.as_deref(),
                        failed,
                        failure: failure.as_ref().map(|(r, m)| (r.as_str(), m.as_str())),
                        ..Default::default()
                    };
                    let phase = *lock(&self.phase);
                    self.publish(&mut published, &current, &runtime, &extra, phase);
                }
                Phase::Finished => {
                    // Nothing runs; the status shows the failure and, as the
                    // PLEG reports them, the containers' final states.
                    next_resync = None;
                    let since = last_sync.unwrap_or_else(first_since);
                    let Some(runtime) = self.fresh(since).await else {
                        return;
                    };
                    last_sync = Some(Instant::now());
                    self.release_once(&mut released, &current, &mut next_resync)
                        .await;
                    let extra = status::Extra {
                        start_time: start_time.clone(),
                        host_ip: host_ip.as_deref(),
                        failed,
                        failure: failure.as_ref().map(|(r, m)| (r.as_str(), m.as_str())),
                        ..Default::default()
                    };
                    self.publish(&mut published, &current, &runtime, &extra, Phase::Finished);
                }
                Phase::Terminated => {
                    let since = last_sync.unwrap_or_else(first_since);
                    let Some(runtime) = self.fresh(since).await else {
                        return;
                    };
                    self.sync_started();
                    let result = Box::pin(self.shared.syncer.remove_pod(&current, &runtime)).await;
                    self.sync_finished(true);
                    last_sync = Some(Instant::now());
                    match result {
                        Ok(()) => {
                            self.shared.prober.remove_pod(&self.uid);
                            tracing::info!(pod = %pod::key(&current), "pod removed");
                            let _ = self.shared.done.send(self.uid.clone());
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(pod = %pod::key(&current), error = %e, "removing pod failed; retrying");
                            next_resync = Some(Instant::now() + Duration::from_secs(1));
                        }
                    }
                }
            }
        }
    }
}

/// The inputs of the last published status, and what it was.
#[derive(Debug)]
struct Published {
    pod: Arc<Pod>,
    runtime: Arc<PodStatus>,
    waiting: Option<BTreeMap<String, Waiting>>,
    start_time: Option<Time>,
    host_ip: Option<String>,
    failed: bool,
    failure: Option<(String, String)>,
    phase: Phase,
    probes: PodProbes,
    /// The status published (None in a candidate not yet computed).
    status: Option<V1PodStatus>,
}

impl Published {
    fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.pod, &other.pod)
            && Arc::ptr_eq(&self.runtime, &other.runtime)
            && self.waiting == other.waiting
            && self.start_time == other.start_time
            && self.host_ip == other.host_ip
            && self.failed == other.failed
            && self.failure == other.failure
            && self.phase == other.phase
            && self.probes == other.probes
    }
}

/// What the prober probes: the pod's IP, whether it is over, and the newest
/// instance of each container.
fn probe_target(pod: &Pod, runtime: &PodStatus, computed: &V1PodStatus) -> Target {
    let containers = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .filter_map(|c| {
            let latest = runtime.latest(&c.name)?;
            Some((
                c.name.clone(),
                Instance {
                    id: latest.id.as_str().to_owned(),
                    running: latest.state == State::Running,
                    terminated: latest.state == State::Exited,
                    started_at: latest.started_at,
                },
            ))
        })
        .collect();
    Target {
        ip: computed.pod_ip.clone(),
        terminal: matches!(computed.phase.as_deref(), Some("Succeeded" | "Failed")),
        containers,
    }
}

/// When the pod started on this node: the API server's record (it survives
/// an agent restart), else its oldest sandbox, else now (upstream keeps the
/// first `startTime` it set).
fn pod_start_time(pod: &Pod, runtime: &PodStatus) -> Time {
    pod.status
        .as_ref()
        .and_then(|s| s.start_time.clone())
        .or_else(|| {
            runtime
                .sandboxes
                .iter()
                .map(|s| s.created_at)
                .filter(|t| *t > 0)
                .min()
                .and_then(crate::clock::time_of)
        })
        .unwrap_or_else(now_time)
}

/// What is left of the pod's `activeDeadlineSeconds` (None: it has none).
fn deadline_left(pod: &Pod, started: &Time) -> Option<Duration> {
    let seconds = pod.spec.as_ref()?.active_deadline_seconds?;
    let started_ns = i128::from(started.0.as_second()) * 1_000_000_000
        + i128::from(started.0.subsec_nanosecond());
    let end_ns = started_ns + i128::from(seconds.max(0)) * 1_000_000_000;
    let left = end_ns - i128::from(crate::clock::unix_ns());
    Some(Duration::from_nanos(u64::try_from(left).unwrap_or(0)))
}

/// The status inputs of a pod in the Sync phase.
fn sync_extra<'a>(
    waiting: &'a BTreeMap<String, Waiting>,
    start_time: &Time,
    host_ip: Option<&'a str>,
    failed: bool,
) -> status::Extra<'a> {
    status::Extra {
        waiting: Some(waiting),
        start_time: Some(start_time.clone()),
        host_ip,
        failed,
        ..Default::default()
    }
}

/// What a worker's first wait for the cache asks for: what the runtime had
/// when the pod came, give or take how far a kernel quiet proof lags (so a
/// new pod's emptiness is proven, not read).
fn first_since() -> Instant {
    Instant::now() - crate::pleg::ebpf::IN_FLIGHT - Duration::from_millis(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_resyncs_fall_on_the_shared_ticks() {
        let origin = crate::clock::tick_origin();
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // Upstream's 60 s period: the 1 s ticks.
        assert_eq!(resync_at(origin + ms(61_200), s(60)), origin + s(62));
        // A test's 1 s period: 100 ms ticks, so it stays near 1–1.5 s.
        assert_eq!(resync_at(origin + ms(1_230), s(1)), origin + ms(1_300));
    }
}
