//! The probe manager (upstream's `prober.Manager`): one task per (pod,
//! container, probe kind), started when a pod worker first syncs the pod and
//! stopped when the pod terminates (liveness and startup at the start of
//! termination, readiness when the pod is gone, as upstream).
//!
//! * [`worker`]: one probe's state machine (pure).
//! * `run`: one attempt of a probe spec (exec, HTTP, TCP, gRPC), retried when
//!   it could not run at all.
//!
//! Pod workers tell the prober what they last saw of a pod ([`Prober::observe`]);
//! the probe tasks probe it and keep their verdicts here, by container
//! instance ([`Prober::verdicts`], read by status and SyncPod). A verdict that
//! changes is sent to the sync loop as a [`ProbeUpdate`], which syncs the pod
//! at once (a liveness failure restarts the container without waiting for the
//! periodic sync).

mod run;
pub mod worker;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use evlet_cri::RuntimeClient;
use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::diagnostics::{Event, EventRecorder};
use crate::lock::lock;
use crate::metrics::Metrics;
use crate::pod::{self, PodUid};
use crate::probe::{Outcome, PodProbes, ProbeKind, Verdict};
pub use worker::{Instance, Target};
use worker::{Step, Worker};

/// A verdict that changed, for the sync loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeUpdate {
    /// The pod.
    pub uid: PodUid,
    /// The container's name.
    pub container: String,
    /// Which probe.
    pub kind: ProbeKind,
    /// The new verdict.
    pub verdict: Verdict,
}

type Key = (PodUid, String, ProbeKind);

/// What the probe tasks share.
#[derive(Debug)]
struct Shared {
    /// Runs exec probes.
    client: RuntimeClient,
    /// Unhealthy and ProbeWarning events.
    events: Arc<dyn EventRecorder>,
    /// `prober_probe_total`, `prober_probe_duration_seconds`.
    metrics: Arc<Metrics>,
    /// Verdicts by pod and container instance.
    verdicts: Mutex<HashMap<PodUid, PodProbes>>,
    /// What each pod's tasks probe, as pod workers last observed it.
    targets: Mutex<HashMap<PodUid, watch::Sender<Option<Arc<Target>>>>>,
    /// The running tasks; cancelling a token stops its task.
    workers: Mutex<HashMap<Key, CancellationToken>>,
    /// Changed verdicts go to the sync loop.
    updates: mpsc::UnboundedSender<ProbeUpdate>,
    /// When the agent started: a task spreads its first probe over one period
    /// only right after start (upstream's rule), so a restart does not probe
    /// every pod at once.
    started: Instant,
    /// Stops every task.
    shutdown: CancellationToken,
}

impl Shared {
    fn verdict(&self, uid: &PodUid, id: &str, kind: ProbeKind) -> Option<Verdict> {
        lock(&self.verdicts).get(uid).and_then(|p| p.get(id, kind))
    }

    /// Records (or, with `None`, forgets) a verdict; a change is sent on.
    fn set(&self, uid: &PodUid, container: &str, id: &str, kind: ProbeKind, v: Option<Verdict>) {
        let changed = {
            let mut all = lock(&self.verdicts);
            let probes = all.entry(uid.clone()).or_default();
            match v {
                Some(v) => probes.set(id, kind, v),
                None => {
                    probes.remove(id, kind);
                    false
                }
            }
        };
        if let (true, Some(verdict)) = (changed, v) {
            let _ = self.updates.send(ProbeUpdate {
                uid: uid.clone(),
                container: container.to_owned(),
                kind,
                verdict,
            });
        }
    }
}

/// The probe manager.
#[derive(Debug, Clone)]
pub struct Prober {
    shared: Arc<Shared>,
}

impl Prober {
    /// A prober running exec probes over `client`, recording events in
    /// `events` and sending changed verdicts on `updates`; its tasks stop at
    /// `shutdown`.
    pub fn new(
        client: RuntimeClient,
        events: Arc<dyn EventRecorder>,
        metrics: Arc<Metrics>,
        updates: mpsc::UnboundedSender<ProbeUpdate>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                client,
                events,
                metrics,
                verdicts: Mutex::new(HashMap::new()),
                targets: Mutex::new(HashMap::new()),
                workers: Mutex::new(HashMap::new()),
                updates,
                started: Instant::now(),
                shutdown,
            }),
        }
    }

    /// Starts the tasks of `pod`'s probes that do not run yet (its app
    /// containers and sidecars; other init containers have no probes).
    /// Idempotent: called on every sync, as upstream's `AddPod`. A changed
    /// probe spec is not picked up by a running task (as upstream).
    pub fn add_pod(&self, pod: &Arc<Pod>) {
        let Some(spec) = &pod.spec else {
            return;
        };
        let uid = pod::uid(pod);
        let never = pod::restart_policy(pod) == "Never";
        let containers = spec.containers.iter().map(|c| (c, !never)).chain(
            spec.init_containers
                .iter()
                .flatten()
                .filter(|c| pod::is_restartable_init(c))
                .map(|c| (c, true)),
        );
        let mut workers = lock(&self.shared.workers);
        for (c, restarts) in containers {
            for kind in ProbeKind::ALL {
                let Some(probe) = kind.of(c) else {
                    continue;
                };
                let key = (uid.clone(), c.name.clone(), kind);
                if workers.contains_key(&key) {
                    continue;
                }
                let stop = self.shared.shutdown.child_token();
                workers.insert(key, stop.clone());
                let target = lock(&self.shared.targets)
                    .entry(uid.clone())
                    .or_insert_with(|| watch::channel(None).0)
                    .subscribe();
                let task = Task {
                    shared: Arc::clone(&self.shared),
                    pod: Arc::clone(pod),
                    uid: uid.clone(),
                    container: c.clone(),
                    probe: probe.clone(),
                    worker: Worker::new(kind, c, probe, restarts),
                };
                tokio::spawn(task.run(target, stop));
            }
        }
    }

    /// What a pod worker last saw of the pod: its tasks probe that.
    pub fn observe(&self, uid: &PodUid, target: Target) {
        let targets = lock(&self.shared.targets);
        if let Some(tx) = targets.get(uid) {
            tx.send_if_modified(|current| {
                let changed = current.as_deref() != Some(&target);
                if changed {
                    *current = Some(Arc::new(target));
                }
                changed
            });
        }
    }

    /// Stops the liveness and startup probes of `pod`'s app containers (the
    /// pod is terminating; its readiness is still probed, as upstream).
    pub fn stop_liveness_and_startup(&self, pod: &Pod) {
        let uid = pod::uid(pod);
        let workers = lock(&self.shared.workers);
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            for kind in [ProbeKind::Liveness, ProbeKind::Startup] {
                if let Some(stop) = workers.get(&(uid.clone(), c.name.clone(), kind)) {
                    stop.cancel();
                }
            }
        }
    }

    /// Stops every probe of the pod and forgets its verdicts (it is gone).
    pub fn remove_pod(&self, uid: &PodUid) {
        for (key, stop) in lock(&self.shared.workers).iter() {
            if key.0 == *uid {
                stop.cancel();
            }
        }
        lock(&self.shared.targets).remove(uid);
        lock(&self.shared.verdicts).remove(uid);
    }

    /// The verdicts about the pod's container instances.
    pub fn verdicts(&self, uid: &PodUid) -> PodProbes {
        lock(&self.shared.verdicts)
            .get(uid)
            .cloned()
            .unwrap_or_default()
    }

    /// Probe tasks running now (tests and metrics).
    pub fn tasks(&self) -> usize {
        lock(&self.shared.workers).len()
    }
}

/// One probe task: a [`Worker`] and what it needs to probe.
struct Task {
    shared: Arc<Shared>,
    pod: Arc<Pod>,
    uid: PodUid,
    container: Container,
    probe: Probe,
    worker: Worker,
}

impl Task {
    async fn run(
        mut self,
        mut target: watch::Receiver<Option<Arc<Target>>>,
        stop: CancellationToken,
    ) {
        let period = Duration::from_secs(self.worker.timing.period);
        if self.shared.started.elapsed() < period {
            let jitter = period.mul_f64(fastrand::f64());
            tokio::select! {
                () = stop.cancelled() => return self.finish(),
                () = tokio::time::sleep(jitter) => {}
            }
        }
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticker.tick() => {}
                changed = target.changed(), if self.triggered_by_changes() => {
                    if changed.is_err() {
                        break;
                    }
                    // Upstream probes readiness at once when the status shows
                    // a container not ready (a new instance gets ready without
                    // waiting a period).
                    ticker.reset();
                }
            }
            let current = target.borrow_and_update().clone();
            let step = {
                let shared = &self.shared;
                let (uid, name, kind) = (&self.uid, &self.container.name, self.worker.kind);
                let mut set = |id: &str, v| shared.set(uid, name, id, kind, v);
                self.worker.step(
                    current.as_deref(),
                    crate::clock::unix_ns(),
                    |id| shared.verdict(uid, id, ProbeKind::Startup) == Some(Verdict::Success),
                    &mut set,
                )
            };
            let id = match step {
                Step::Stop => break,
                Step::Wait => continue,
                Step::Probe(id) => id,
            };
            let ip = current.as_ref().and_then(|t| t.ip.clone());
            let started = Instant::now();
            let attempt = tokio::select! {
                () = stop.cancelled() => break,
                a = run::attempt(&self.shared.client, &self.container, &self.probe, &id, ip.as_deref()) => a,
            };
            self.account(attempt, &id, started.elapsed());
        }
        self.finish();
    }

    /// Readiness tasks also wake when the pod's observed state changes while
    /// the container is not ready.
    fn triggered_by_changes(&self) -> bool {
        self.worker.kind == ProbeKind::Readiness
            && self.worker.instance().is_none_or(|id| {
                self.shared.verdict(&self.uid, id, ProbeKind::Readiness) != Some(Verdict::Success)
            })
    }

    /// Events, metrics and thresholds of one attempt.
    fn account(
        &mut self,
        attempt: Result<Outcome, crate::probe::ProbeError>,
        id: &str,
        took: Duration,
    ) {
        let kind = self.worker.kind;
        let event = |reason: &str, message: String| {
            self.shared.events.record(Event::about(
                &self.pod,
                Some(&self.container.name),
                "Warning",
                reason,
                message,
            ));
        };
        let outcome = match attempt {
            Ok(o) => o,
            Err(e) => {
                // Could not probe at all: reported, never counted (upstream).
                event(
                    "Unhealthy",
                    format!(
                        "{} probe errored and resulted in unknown state: {e}",
                        kind.as_str()
                    ),
                );
                return;
            }
        };
        let healthy = outcome.healthy();
        match &outcome {
            Outcome::Failure(output) => {
                event(
                    "Unhealthy",
                    format!("{} probe failed: {output}", kind.as_str()),
                );
            }
            Outcome::Warning(output) => {
                event(
                    "ProbeWarning",
                    format!("{} probe warning: {output}", kind.as_str()),
                );
            }
            Outcome::Success(_) => {}
        }
        let probes = &self.shared.metrics.probes;
        probes
            .total
            .with_label_values(&self.result_labels(if healthy { "successful" } else { "failed" }))
            .inc();
        if healthy {
            probes
                .duration
                .with_label_values(&self.labels())
                .observe(took.as_secs_f64());
        }
        let verdict = if healthy {
            Verdict::Success
        } else {
            Verdict::Failure
        };
        if let Some(v) = self.worker.record(verdict) {
            self.shared
                .set(&self.uid, &self.container.name, id, kind, Some(v));
        }
    }

    /// `prober_probe_duration_seconds`' labels: probe_type, container, pod, namespace.
    fn labels(&self) -> [&str; 4] {
        [
            self.worker.kind.as_str(),
            &self.container.name,
            pod::name(&self.pod),
            pod::namespace(&self.pod),
        ]
    }

    /// `prober_probe_total`'s labels: probe_type, result, container, pod,
    /// namespace, pod_uid.
    fn result_labels<'a>(&'a self, result: &'a str) -> [&'a str; 6] {
        [
            self.worker.kind.as_str(),
            result,
            &self.container.name,
            pod::name(&self.pod),
            pod::namespace(&self.pod),
            &self.uid.0,
        ]
    }

    /// Forgets the task's verdict and metric series, and the task itself.
    fn finish(self) {
        let kind = self.worker.kind;
        if let Some(id) = self.worker.instance() {
            self.shared
                .set(&self.uid, &self.container.name, id, kind, None);
        }
        let probes = &self.shared.metrics.probes;
        for result in ["successful", "failed", "unknown"] {
            let _ = probes
                .total
                .remove_label_values(&self.result_labels(result));
        }
        let _ = probes.duration.remove_label_values(&self.labels());
        lock(&self.shared.workers).remove(&(self.uid.clone(), self.container.name.clone(), kind));
    }
}
