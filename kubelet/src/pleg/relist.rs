//! [`Relister`]: full and per-pod relists, the single writer of the pod cache.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::hints::ExitRecord;
use super::process::{ProcFs, Processes};
use super::{EventType, Health, PodLifecycleEvent};
use crate::cache::CacheWriter;
use crate::diagnostics::Diagnostics;
use crate::metrics::Metrics;
use crate::pod::PodUid;
use crate::runtime::{KernelMark, PodStatus, Runtime, RuntimePod, State};

/// Capacity of the PLEG → sync loop channel (upstream's `plegChannelCapacity`).
pub const CHANNEL_CAPACITY: usize = 1000;

/// Coarse state of a container or sandbox for event computation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coarse {
    Running,
    Exited,
    Unknown,
    NonExistent,
}

fn coarse(state: Option<State>) -> Coarse {
    match state {
        None => Coarse::NonExistent,
        Some(State::Running) => Coarse::Running,
        Some(State::Exited) => Coarse::Exited,
        Some(State::Created | State::Unknown) => Coarse::Unknown,
    }
}

/// Upstream's `computeEvents` for one container (or sandbox) ID.
fn compute(uid: &PodUid, id: &str, old: Coarse, new: Coarse) -> Vec<PodLifecycleEvent> {
    let ev = |kind| PodLifecycleEvent {
        uid: uid.clone(),
        kind,
        data: id.to_owned(),
    };
    if old == new {
        return vec![];
    }
    match new {
        Coarse::Running => vec![ev(EventType::ContainerStarted)],
        Coarse::Exited => vec![ev(EventType::ContainerDied)],
        // Unknown (incl. Created) is upstream's ContainerChanged, which is never sent.
        Coarse::Unknown => vec![],
        Coarse::NonExistent => match old {
            Coarse::Exited => vec![ev(EventType::ContainerRemoved)],
            _ => vec![
                ev(EventType::ContainerDied),
                ev(EventType::ContainerRemoved),
            ],
        },
    }
}

fn record_from_status(status: &PodStatus) -> RuntimePod {
    RuntimePod {
        sandboxes: status
            .sandboxes
            .iter()
            .map(|s| (s.id.to_string(), s.ready))
            .collect(),
        containers: status
            .containers
            .iter()
            .map(|c| (c.id.to_string(), c.state))
            .collect(),
        name: String::new(),
        namespace: String::new(),
    }
}

/// Events between two listings of one pod.
fn diff(
    uid: &PodUid,
    old: Option<&RuntimePod>,
    new: Option<&RuntimePod>,
) -> Vec<PodLifecycleEvent> {
    let empty = RuntimePod::default();
    let old = old.unwrap_or(&empty);
    let new = new.unwrap_or(&empty);
    let mut events = Vec::new();
    let ids: BTreeSet<&String> = old.containers.keys().chain(new.containers.keys()).collect();
    for id in ids {
        events.extend(compute(
            uid,
            id,
            coarse(old.containers.get(id).copied()),
            coarse(new.containers.get(id).copied()),
        ));
    }
    let sandbox_state =
        |ready: Option<&bool>| ready.map(|r| if *r { State::Running } else { State::Exited });
    let ids: BTreeSet<&String> = old.sandboxes.keys().chain(new.sandboxes.keys()).collect();
    for id in ids {
        events.extend(compute(
            uid,
            id,
            coarse(sandbox_state(old.sandboxes.get(id))),
            coarse(sandbox_state(new.sandboxes.get(id))),
        ));
    }
    events
}

/// The runtime's word on each container's init, for the kernel side
/// (`pleg::kernel::Binder` in `ebpf` mode): the relister gives it the PID the
/// runtime reports for each container (and sandbox) it first shows running.
pub trait Inits: Send + Sync + std::fmt::Debug {
    /// Is container `container`'s init still unknown to the kernel side?
    fn wants(&self, container: &str) -> bool;
    /// The runtime names `pid` as `container`'s init (`None`: it named none).
    fn bind(&self, container: &str, pid: Option<u32>);
    /// Forgets every container not in `present`.
    fn retain(&self, present: &HashSet<&str>);
}

/// What a full relist found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Pods whose listing changed.
    pub changed: Vec<PodUid>,
    /// Of those, the pods the caller's `announced` check said no hint covered.
    pub unannounced: Vec<PodUid>,
    /// Events sent (or discarded).
    pub events: usize,
}

/// One listing of the runtime, taken by [`Relister::list`].
#[derive(Debug)]
pub struct Listing {
    start: Instant,
    pods: BTreeMap<PodUid, RuntimePod>,
}

/// What [`Relister::apply_kernel_exits`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KernelApplied {
    /// The cache shows the accepted exits now (no read needed).
    pub shown: bool,
    /// Exits refused because their init process lives.
    pub refused: Vec<String>,
}

/// What a per-pod relist found.
#[derive(Debug, Clone)]
pub struct PodRelist {
    /// Whether the pod's listing changed.
    pub changed: bool,
    /// The status now in the cache.
    pub status: PodStatus,
}

/// The single writer of the pod cache.
#[derive(Debug)]
pub struct Relister {
    runtime: Runtime,
    cache: CacheWriter,
    /// The last listing of each pod (upstream's `podRecords`).
    records: BTreeMap<PodUid, RuntimePod>,
    /// Pods whose status read failed; re-read on the next full relist.
    reinspect: HashSet<PodUid>,
    events: mpsc::Sender<PodLifecycleEvent>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    /// Counts single-pod relists per pod (`evlet diag pleg`).
    diagnostics: Arc<Diagnostics>,
    last_full: Option<Instant>,
    /// Exits the kernel reported for certain, by container (or sandbox) ID:
    /// overlaid on every runtime read of their pod until the container is
    /// gone (design invariant 1: a container ID never runs again).
    kernel: HashMap<String, KernelEnd>,
    /// Where the runtime's init of each running container goes (`ebpf` mode).
    inits: Option<Arc<dyn Inits>>,
    /// Whether a kernel-reported init still lives: a record of a process
    /// that lives is refused (`/proc`; the fake runtime's table in tests).
    processes: Arc<dyn Processes>,
}

/// A kernel-reported end of a container, and whether the runtime agrees yet.
#[derive(Debug, Clone)]
struct KernelEnd {
    /// The pod the kernel said it belongs to: applied to that pod only.
    uid: PodUid,
    record: ExitRecord,
    /// The runtime shows it stopped (its fields were compared, once).
    confirmed: bool,
}

/// How far apart the kernel's and the runtime's finish times may be before
/// they count as a disagreement: the runtime notes the time when it
/// processed the exit, a few ms to a few s after the kernel.
const FINISH_TOLERANCE_NS: i64 = 2_000_000_000;

/// The reason a runtime would give the exit.
fn reason_of(record: &ExitRecord) -> &'static str {
    if record.oom {
        "OOMKilled"
    } else if record.exit_code == 0 {
        "Completed"
    } else {
        "Error"
    }
}

impl Relister {
    /// A relister writing `cache` and sending events on `events`.
    pub fn new(
        runtime: Runtime,
        cache: CacheWriter,
        events: mpsc::Sender<PodLifecycleEvent>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        diagnostics: Arc<Diagnostics>,
    ) -> Self {
        Self {
            diagnostics,
            runtime,
            cache,
            records: BTreeMap::new(),
            reinspect: HashSet::new(),
            events,
            metrics,
            health,
            last_full: None,
            kernel: HashMap::new(),
            inits: None,
            processes: Arc::new(ProcFs),
        }
    }

    /// Gives the runtime's init of every container it first shows running
    /// to `inits`, and judges kernel records by `processes`.
    #[must_use]
    pub fn with_kernel(
        mut self,
        inits: Option<Arc<dyn Inits>>,
        processes: Arc<dyn Processes>,
    ) -> Self {
        self.inits = inits;
        self.processes = processes;
        self
    }

    /// Puts the kernel's certain exits into `status`: containers the runtime
    /// still shows running show exited with the kernel's code, time and
    /// reason; where the runtime shows the exit too, the kernel's fields stand
    /// and disagreements are counted (once per container). Sandboxes whose
    /// pause died show not ready. Forgets exits of containers that are gone.
    fn overlay(&mut self, uid: &PodUid, status: &mut PodStatus) {
        if self.kernel.is_empty() {
            return;
        }
        for c in &mut status.containers {
            let Some(end) = self
                .kernel
                .get_mut(c.id.as_str())
                .filter(|end| end.uid == *uid)
            else {
                continue;
            };
            let record = end.record;
            if c.state == State::Exited && !end.confirmed {
                end.confirmed = true;
                let mut disagree = Vec::new();
                if c.exit_code != record.exit_code {
                    disagree.push((
                        "exit_code",
                        c.exit_code.to_string(),
                        record.exit_code.to_string(),
                    ));
                }
                if (c.reason == "OOMKilled") != record.oom {
                    disagree.push(("oom", c.reason.clone(), reason_of(&record).to_owned()));
                }
                if (c.finished_at - record.finished_unix_ns).abs() > FINISH_TOLERANCE_NS {
                    disagree.push((
                        "finished_at",
                        c.finished_at.to_string(),
                        record.finished_unix_ns.to_string(),
                    ));
                }
                for (field, runtime, kernel) in disagree {
                    self.metrics
                        .pleg_runtime_disagreements
                        .with_label_values(&[field])
                        .inc();
                    tracing::warn!(pod = %uid, container = %c.id, field, %runtime, %kernel, "the runtime disagrees with the kernel about an exit; the kernel's value stands");
                }
            }
            let confirmed = c.state == State::Exited;
            c.state = State::Exited;
            c.exit_code = record.exit_code;
            c.finished_at = record.finished_unix_ns;
            c.reason = reason_of(&record).to_owned();
            if !confirmed {
                c.message.clear();
            }
            c.kernel = Some(if confirmed {
                KernelMark::Confirmed
            } else {
                KernelMark::Unconfirmed
            });
        }
        for s in &mut status.sandboxes {
            if let Some(end) = self
                .kernel
                .get_mut(s.id.as_str())
                .filter(|end| end.uid == *uid)
            {
                end.confirmed |= !s.ready;
                s.ready = false;
            }
        }
    }

    /// The same for one pod's listing (state and readiness only).
    fn overlay_listing(&self, uid: &PodUid, pod: &mut RuntimePod) {
        if self.kernel.is_empty() {
            return;
        }
        let ended = |id: &String| self.kernel.get(id).is_some_and(|end| end.uid == *uid);
        for (id, state) in &mut pod.containers {
            if ended(id) {
                *state = State::Exited;
            }
        }
        for (id, ready) in &mut pod.sandboxes {
            if ended(id) {
                *ready = false;
            }
        }
    }

    /// Forgets kernel exits and inits of containers and sandboxes that no
    /// listing has.
    fn prune_kernel(&mut self, pods: &BTreeMap<PodUid, RuntimePod>) {
        if self.kernel.is_empty() && self.inits.is_none() {
            return;
        }
        let present: HashSet<&str> = pods
            .values()
            .flat_map(|p| p.containers.keys().chain(p.sandboxes.keys()))
            .map(String::as_str)
            .collect();
        self.kernel.retain(|id, _| present.contains(id.as_str()));
        if let Some(inits) = &self.inits {
            inits.retain(&present);
        }
    }

    /// Gives the kernel side the runtime's init of each container and sandbox
    /// of `status` that the runtime shows running and the kernel side does
    /// not know yet (one verbose status call each, once per container).
    async fn bind_inits(&self, status: &PodStatus) {
        let Some(inits) = &self.inits else {
            return;
        };
        let client = &self.runtime.client;
        for c in &status.containers {
            if c.state == State::Running && inits.wants(c.id.as_str()) {
                match client.container_pid(&c.id).await {
                    Ok(pid) => inits.bind(c.id.as_str(), pid),
                    Err(err) => {
                        tracing::debug!(container = %c.id, %err, "cannot read the runtime's init; the next read tries again");
                    }
                }
            }
        }
        for s in &status.sandboxes {
            if s.ready && inits.wants(s.id.as_str()) {
                match client.sandbox_pid(&s.id).await {
                    Ok(pid) => inits.bind(s.id.as_str(), pid),
                    Err(err) => {
                        tracing::debug!(sandbox = %s.id, %err, "cannot read the runtime's init; the next read tries again");
                    }
                }
            }
        }
    }

    /// Records exits the kernel reported for certain and puts them into the
    /// cache at once, without a runtime read, with their PLEG events.
    ///
    /// A record whose process still lives is refused (the kernel side named
    /// the wrong process): it is counted as a `running` disagreement, logged
    /// once, and returned in [`KernelApplied::refused`]; the status keeps the
    /// runtime's word, so no replacement is started beside a live instance.
    /// [`KernelApplied::shown`] is false if the cached entry lacks one of the
    /// containers (it was created after the last read): the caller reads the
    /// pod, and the read overlays them.
    pub fn apply_kernel_exits(
        &mut self,
        uid: &PodUid,
        exits: &BTreeMap<String, ExitRecord>,
    ) -> KernelApplied {
        let mut applied = KernelApplied::default();
        for (id, record) in exits {
            if self.kernel.contains_key(id) {
                continue;
            }
            if record.process.alive(self.processes.as_ref()) {
                self.metrics
                    .pleg_runtime_disagreements
                    .with_label_values(&["running"])
                    .inc();
                tracing::warn!(pod = %uid, container = %id, pid = record.process.pid, "the kernel reported this container's init exited, but that process lives; the runtime's word stands");
                self.diagnostics.trace(
                    &uid.0,
                    crate::diagnostics::Source::Pleg,
                    format!(
                        "kernel exit of {} refused: its init (pid {}) lives",
                        evlet_cri::ids::short(id),
                        record.process.pid
                    ),
                );
                applied.refused.push(id.clone());
                continue;
            }
            self.kernel.insert(
                id.clone(),
                KernelEnd {
                    uid: uid.clone(),
                    record: *record,
                    confirmed: false,
                },
            );
        }
        let accepted: Vec<&String> = exits
            .keys()
            .filter(|id| !applied.refused.contains(id))
            .collect();
        if accepted.is_empty() {
            return applied;
        }
        let Some(Ok(cached)) = self.cache.reader().get(uid).map(|e| e.status) else {
            return applied;
        };
        let mut status = (*cached).clone();
        let known = accepted.iter().all(|id| {
            status.containers.iter().any(|c| c.id.as_str() == *id)
                || status.sandboxes.iter().any(|s| s.id.as_str() == *id)
        });
        if !known {
            return applied;
        }
        let at = Instant::now();
        self.overlay(uid, &mut status);
        let record = record_from_status(&status);
        let events = diff(uid, self.records.get(uid), Some(&record));
        if let Some(old) = self.records.get_mut(uid) {
            old.sandboxes = record.sandboxes;
            old.containers = record.containers;
        }
        if !events.is_empty() {
            self.update_gauges(&self.records);
        }
        self.cache.set(uid, Ok(status), at);
        self.send(events);
        applied.shown = true;
        applied
    }

    /// Has the kernel reported `id`'s end for certain (and is it still known)?
    pub fn has_kernel_exit(&self, id: &str) -> bool {
        self.kernel.contains_key(id)
    }

    /// Does the runtime (not the kernel) show container or sandbox `id` of
    /// `status` stopped? For a kernel-reported exit, whether the runtime has
    /// confirmed it.
    pub fn runtime_shows_stopped(&self, status: &PodStatus, id: &str) -> bool {
        match self.kernel.get(id).filter(|end| end.uid == status.uid) {
            Some(end) => end.confirmed,
            None => status.shows_stopped(id),
        }
    }

    fn send(&self, events: Vec<PodLifecycleEvent>) -> usize {
        let n = events.len();
        for e in events {
            tracing::debug!(target: "evlet::pleg::event", pod = %e.uid, kind = ?e.kind, id = %e.data, "pleg event");
            if self.events.try_send(e).is_err() {
                self.metrics.pleg_discard_events.inc();
                tracing::error!("event channel is full, discarding this relist cycle's event");
            }
        }
        n
    }

    async fn update_cache(
        &mut self,
        uid: &PodUid,
        at: Instant,
    ) -> Result<PodStatus, evlet_cri::Error> {
        match self.runtime.pod_status(uid).await {
            Ok(mut status) => {
                self.reinspect.remove(uid);
                self.bind_inits(&status).await;
                self.overlay(uid, &mut status);
                self.cache.set(uid, Ok(status.clone()), at);
                Ok(status)
            }
            Err(err) => {
                tracing::warn!(pod = %uid, %err, "reading pod status failed; will retry");
                self.reinspect.insert(uid.clone());
                // A runtime that is down says nothing about the pod: keep the last good entry.
                if !err.is_retryable() {
                    self.cache.set(uid, Err(err.clone().into()), at);
                }
                Err(err)
            }
        }
    }

    /// Lists everything, updates the cache for pods that changed, emits events,
    /// and bumps the cache's global stamp ([`Relister::list`] then [`Relister::apply`]).
    ///
    /// # Errors
    /// The listing's CRI error; the health stamp is then not renewed (upstream).
    pub async fn relist_all(&mut self) -> Result<Report, evlet_cri::Error> {
        let listing = self.list().await?;
        Ok(self.apply(listing, None).await)
    }

    /// Lists every sandbox and container: the first half of a full relist.
    ///
    /// # Errors
    /// The listing's CRI error.
    pub async fn list(&mut self) -> Result<Listing, evlet_cri::Error> {
        let start = Instant::now();
        if let Some(prev) = self.last_full {
            self.metrics
                .pleg_relist_interval
                .observe((start - prev).as_secs_f64());
        }
        self.last_full = Some(start);
        let pods = self.runtime.pods().await?;
        Ok(Listing { start, pods })
    }

    /// Applies a listing: re-reads the pods whose listing changed into the
    /// cache, emits their events, and stamps the cache and PLEG health with the
    /// listing's start. With `announced`, a changed pod for which it returns
    /// false is reported in [`Report::unannounced`].
    pub async fn apply(
        &mut self,
        listing: Listing,
        announced: Option<&(dyn Fn(&PodUid) -> bool + Sync)>,
    ) -> Report {
        let Listing { start, mut pods } = listing;
        self.prune_kernel(&pods);
        for (uid, pod) in &mut pods {
            self.overlay_listing(uid, pod);
        }
        self.update_gauges(&pods);
        let mut report = Report::default();
        let uids: BTreeSet<PodUid> = self.records.keys().chain(pods.keys()).cloned().collect();
        for uid in uids {
            let events = diff(&uid, self.records.get(&uid), pods.get(&uid));
            let changed = !events.is_empty()
                || self
                    .records
                    .get(&uid)
                    .map(|r| (&r.sandboxes, &r.containers))
                    != pods.get(&uid).map(|r| (&r.sandboxes, &r.containers));
            if !changed && !self.reinspect.contains(&uid) {
                continue;
            }
            if changed {
                report.changed.push(uid.clone());
                if announced.is_some_and(|announced| !announced(&uid)) {
                    report.unannounced.push(uid.clone());
                }
            }
            match pods.get(&uid) {
                Some(record) => {
                    if self.update_cache(&uid, start).await.is_err() {
                        // Keep the old record so the change is seen again next time.
                        continue;
                    }
                    self.records.insert(uid.clone(), record.clone());
                }
                None => {
                    self.records.remove(&uid);
                    self.cache
                        .set(&uid, Ok(PodStatus::empty(uid.clone())), start);
                }
            }
            report.events += self.send(events);
        }
        self.cache.update_time(start);
        self.health.record(start);
        self.metrics.pleg_last_seen.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
        );
        self.metrics
            .pleg_relist_duration
            .observe(start.elapsed().as_secs_f64());
        report
    }

    /// Re-reads one pod, updates its cache entry and emits its events.
    ///
    /// # Errors
    /// The CRI error (the pod's entry keeps its last good status).
    pub async fn relist_pod(&mut self, uid: &PodUid) -> Result<PodRelist, evlet_cri::Error> {
        let start = Instant::now();
        let status = self.update_cache(uid, start).await?;
        if !self.kernel.is_empty() {
            let present: HashSet<&str> = status
                .containers
                .iter()
                .map(|c| c.id.as_str())
                .chain(status.sandboxes.iter().map(|s| s.id.as_str()))
                .collect();
            let known: Vec<&String> = self
                .records
                .get(uid)
                .map(|r| r.containers.keys().chain(r.sandboxes.keys()).collect())
                .unwrap_or_default();
            let gone: Vec<String> = known
                .into_iter()
                .filter(|id| !present.contains(id.as_str()))
                .cloned()
                .collect();
            for id in gone {
                self.kernel.remove(&id);
            }
        }
        let record = record_from_status(&status);
        let old = self.records.get(uid);
        let events = diff(
            uid,
            old,
            Some(&record).filter(|r| !r.sandboxes.is_empty() || !r.containers.is_empty()),
        );
        let changed = !events.is_empty()
            || old.map(|o| (&o.sandboxes, &o.containers))
                != Some((&record.sandboxes, &record.containers));
        if record.sandboxes.is_empty() && record.containers.is_empty() {
            self.records.remove(uid);
        } else {
            let mut record = record;
            if let Some(o) = old {
                record.name = o.name.clone();
                record.namespace = o.namespace.clone();
            }
            self.records.insert(uid.clone(), record);
        }
        // The running pods and containers are counted at every change, as
        // upstream's every relist does, not only at the safety relists.
        if changed {
            self.update_gauges(&self.records);
        }
        self.send(events);
        self.metrics
            .pleg_pod_relist_duration
            .observe(start.elapsed().as_secs_f64());
        self.diagnostics.relisted(&uid.0);
        Ok(PodRelist { changed, status })
    }

    /// Does the runtime show container (or sandbox) `id` of pod `uid` stopped
    /// (exited, not ready, or gone)? One status call, no cache write: the cheap
    /// poll of an exit the kernel reported before the runtime.
    ///
    /// # Errors
    /// The CRI error of the status call (other than not-found).
    pub async fn shows_stopped(&self, uid: &PodUid, id: &str) -> Result<bool, evlet_cri::Error> {
        let client = &self.runtime.client;
        if self
            .records
            .get(uid)
            .is_some_and(|r| r.sandboxes.contains_key(id))
        {
            return match client
                .pod_sandbox_status(&evlet_cri::SandboxId::new(id.to_owned()), false)
                .await
            {
                Ok(resp) => Ok(resp.status.is_none_or(|s| {
                    s.state != evlet_cri::api::PodSandboxState::SandboxReady as i32
                })),
                Err(e) if e.is_not_found() => Ok(true),
                Err(e) => Err(e),
            };
        }
        match client
            .container_status(&evlet_cri::ContainerId::new(id.to_owned()))
            .await
        {
            Ok(s) => Ok(stopped(Some(State::from_cri(s.state)))),
            Err(e) if e.is_not_found() => Ok(true),
            Err(e) => Err(e),
        }
    }

    fn update_gauges(&self, pods: &BTreeMap<PodUid, RuntimePod>) {
        let running = pods
            .values()
            .filter(|p| p.sandboxes.values().any(|r| *r))
            .count();
        self.metrics.running_pods.set(running as i64);
        let mut counts: BTreeMap<&str, i64> = [
            ("created", 0),
            ("running", 0),
            ("exited", 0),
            ("unknown", 0),
        ]
        .into();
        for state in pods.values().flat_map(|p| p.containers.values()) {
            let key = match state {
                State::Created => "created",
                State::Running => "running",
                State::Exited => "exited",
                State::Unknown => "unknown",
            };
            *counts.entry(key).or_default() += 1;
        }
        for (state, n) in counts {
            self.metrics
                .running_containers
                .with_label_values(&[state])
                .set(n);
        }
    }

    /// Vouches that `uid` has not changed up to `time` without reading the
    /// runtime (the dispatcher proved it quiet). A pod no listing has shown
    /// anything of, with no entry yet (a new pod's first sync), is vouched
    /// for as empty once a full listing was made: anything made for it since
    /// would have been hinted. False for a failed entry.
    pub fn touch(&self, uid: &PodUid, time: Instant) -> bool {
        let unseen = self.last_full.is_some() && !self.records.contains_key(uid);
        self.cache.touch(uid, time, unseen)
    }

    /// Is `uid`'s entry already newer than `since` (a relist made since the
    /// wait was asked for answers it)?
    pub fn answers(&self, uid: &PodUid, since: Instant) -> bool {
        self.cache.reader().fresh(uid, since).is_some()
    }

    /// The pods of the last listing.
    pub fn known_pods(&self) -> impl Iterator<Item = &PodUid> {
        self.records.keys()
    }
}

/// Is a container in `state` (None: gone) stopped as far as an exit is concerned?
pub fn stopped(state: Option<State>) -> bool {
    matches!(state, None | Some(State::Exited))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: &[(&str, State)]) -> RuntimePod {
        RuntimePod {
            sandboxes: [("s1".to_owned(), true)].into(),
            containers: containers
                .iter()
                .map(|(id, s)| ((*id).to_owned(), *s))
                .collect(),
            ..Default::default()
        }
    }

    fn kinds(events: &[PodLifecycleEvent]) -> Vec<(EventType, &str)> {
        events.iter().map(|e| (e.kind, e.data.as_str())).collect()
    }

    #[test]
    fn state_changes_map_to_upstream_events() {
        let uid = PodUid::from("p");
        let created = pod(&[("c1", State::Created)]);
        let running = pod(&[("c1", State::Running)]);
        let exited = pod(&[("c1", State::Exited)]);
        let gone = pod(&[]);
        assert_eq!(
            kinds(&diff(&uid, None, Some(&created))),
            [(EventType::ContainerStarted, "s1")],
            "created is ContainerChanged: not sent"
        );
        assert_eq!(
            kinds(&diff(&uid, Some(&created), Some(&running))),
            [(EventType::ContainerStarted, "c1")]
        );
        assert_eq!(
            kinds(&diff(&uid, Some(&running), Some(&exited))),
            [(EventType::ContainerDied, "c1")]
        );
        assert_eq!(
            kinds(&diff(&uid, Some(&exited), Some(&gone))),
            [(EventType::ContainerRemoved, "c1")]
        );
        assert_eq!(
            kinds(&diff(&uid, Some(&running), Some(&gone))),
            [
                (EventType::ContainerDied, "c1"),
                (EventType::ContainerRemoved, "c1")
            ]
        );
        assert!(diff(&uid, Some(&running), Some(&running)).is_empty());
    }
}
