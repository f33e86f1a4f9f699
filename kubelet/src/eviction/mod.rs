//! The eviction manager: keeps the node alive when memory, disk or PIDs run
//! low, as upstream's `pkg/kubelet/eviction` does.
//!
//! Each pass observes the node's signals (no runtime call: memory from the
//! root memory cgroup or `/proc/meminfo`, filesystems by `statvfs`, PIDs from
//! procfs, the image filesystem by one `ImageFsInfo`), evaluates the
//! thresholds ([`decide`]), publishes the node's pressure conditions, and when
//! a threshold is due evicts one pod ([`rank`]): killed with a grace period of
//! 1 s (hard) or `evictionMaxPodGracePeriod` (soft), then shown `Failed` with
//! reason `Evicted`, upstream's message, a `DisruptionTarget` condition and a
//! Warning event. It then waits for that pod's containers to stop (30 s at
//! most) and evaluates again. Critical pods (static, mirror, system
//! priority) are never evicted.
//!
//! Passes run every 10 s and, with `kernelMemcgNotification` (on by
//! default), at once when the kernel says memory changed ([`notify`]): a
//! usage threshold on the v1 root memory cgroup placed exactly where
//! `memory.available` crosses each memory threshold, and a PSI trigger.
//!
//! Before the thresholds, each pass evicts a pod over its own local storage
//! limits ([`local`]: emptyDir `sizeLimit`, the containers'
//! `limits.ephemeral-storage`), as upstream's `localStorageEviction`.
//!
//! Map: [`thresholds`] parses the configuration; [`decide`] is the pure
//! evaluation; [`rank`] orders pods and words the message; [`local`] decides
//! local storage limits; [`notify`] holds
//! the kernel's notifications; [`journal`] keeps what the passes did for
//! `/debug/eviction`; this module is the loop and its IO.

pub mod decide;
pub mod journal;
pub mod local;
pub mod notify;
pub mod rank;
pub mod thresholds;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::diagnostics::{Event, EventRecorder};
use crate::metrics::Metrics;
use crate::pod::PodUid;
use crate::stats::StatsProvider;
use crate::workers::{Phase, PodView, PodWorkers};
pub use decide::Pressure;
pub use thresholds::{Settings, Signal, Threshold};

/// Upstream's `immediateEvictionGracePeriodSeconds`: the grace of a pod
/// evicted for a hard threshold.
pub const HARD_EVICTION_GRACE: i64 = 1;

/// How long a pass waits for an evicted pod's containers to stop
/// (upstream's `podCleanupTimeout`).
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The PSI trigger: tasks stalled on memory for 150 ms within 2 s. The window
/// is a multiple of 2 s, which kernels require of triggers made without
/// `CAP_SYS_RESOURCE` (measured here: a 1 s window is refused with EINVAL).
pub const PSI_TRIGGER: &str = "some 150000 2000000";

/// How often the kernel thresholds' crossing points are checked (and re-armed
/// when they moved): inactive file pages count as available, so the usage at
/// which `memory.available` crosses a threshold moves with them.
pub const REARM: Duration = Duration::from_secs(1);

/// The node's inactive file pages in bytes (`Inactive(file)` of
/// `/proc/meminfo`). Read every [`REARM`], so only that line is parsed: the
/// whole file into procfs' `Meminfo` was most of an idle pass's cost.
fn global_inactive_file() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    inactive_file_of(&text)
}

fn inactive_file_of(meminfo: &str) -> Option<u64> {
    let value = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("Inactive(file):"))?
        .trim()
        .strip_suffix("kB")?;
    value.trim().parse::<u64>().ok()?.checked_mul(1024)
}

/// Why a pass ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The 10 s timer (or a soft threshold's grace ending).
    Timer,
    /// The v1 memory cgroup usage threshold fired.
    Memcg,
    /// The PSI memory trigger fired.
    Psi,
    /// The pass right after an eviction.
    AfterEviction,
}

impl Trigger {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timer => "timer",
            Self::Memcg => "memcg",
            Self::Psi => "psi",
            Self::AfterEviction => "after-eviction",
        }
    }
}

/// What the eviction manager works with.
#[derive(Debug, Clone)]
pub struct Collaborators {
    /// Removes dead containers before pods are evicted for disk (node-level
    /// reclaim, first).
    pub containers: crate::container_gc::Reclaim,
    /// Frees disk before pods are evicted for it (node-level reclaim).
    pub images: Arc<crate::image_gc::ImageGc>,
    /// Reads the node's signals and the pods' usage.
    pub stats: Arc<StatsProvider>,
    /// The pods (active ones are candidates) and their kill.
    pub workers: PodWorkers,
    /// Where the Evicted events go.
    pub recorder: Arc<dyn EventRecorder>,
    /// `kubelet_evictions`.
    pub metrics: Arc<Metrics>,
    /// What the passes did (`/debug/eviction`).
    pub journal: Arc<journal::Journal>,
}

/// The eviction manager (upstream's `managerImpl`).
#[derive(Debug)]
pub struct EvictionManager {
    settings: Settings,
    c: Collaborators,
    pressure: watch::Sender<Pressure>,
    /// The v1 memory controller's root, where memory thresholds are armed.
    memcg_v1_root: Option<PathBuf>,
    /// Set once "no pod to evict" was logged for the current episode, so a
    /// node under pressure with only critical pods says it once, not every 10 s.
    stuck: AtomicBool,
}

/// Was the pod evicted (upstream's `PodIsEvicted`: phase Failed, reason
/// `Evicted`)? Its containers and sandboxes are then removed by the GC.
pub fn is_evicted(status: &k8s_openapi::api::core::v1::PodStatus) -> bool {
    status.phase.as_deref() == Some("Failed") && status.reason.as_deref() == Some("Evicted")
}

/// Upstream's admission under pressure: critical pods always; under memory
/// pressure alone, pods that are not BestEffort or that tolerate the
/// memory-pressure taint; under any other pressure, nothing else.
///
/// # Errors
/// Upstream's reason (`Evicted`) and message (`The node had condition:
/// [MemoryPressure]. `).
pub fn admit(
    pod: &k8s_openapi::api::core::v1::Pod,
    pressure: Pressure,
) -> Result<(), (String, String)> {
    if !pressure.any() || rank::is_critical(pod) {
        return Ok(());
    }
    if pressure
        == (Pressure {
            memory: true,
            ..Pressure::default()
        })
    {
        if crate::resources::qos(pod) != crate::resources::Qos::BestEffort {
            return Ok(());
        }
        let taint = k8s_openapi::api::core::v1::Taint {
            key: "node.kubernetes.io/memory-pressure".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or_default();
        if crate::node_selector::tolerates(tolerations, &taint) {
            return Ok(());
        }
    }
    let names: Vec<&str> = pressure
        .conditions()
        .into_iter()
        .map(thresholds::Condition::as_str)
        .collect();
    Err((
        "Evicted".into(),
        format!("The node had condition: [{}]. ", names.join(" ")),
    ))
}

impl EvictionManager {
    /// A manager with `settings`; read its pressure with
    /// [`EvictionManager::pressure`] before running it.
    pub fn new(settings: Settings, c: Collaborators) -> Self {
        let (pressure, _) = watch::channel(Pressure::default());
        let memcg_v1_root = crate::cgroups::memcg_v1_root();
        Self {
            settings,
            c,
            pressure,
            memcg_v1_root,
            stuck: AtomicBool::new(false),
        }
    }

    /// The node's pressure conditions, as they change.
    pub fn pressure(&self) -> watch::Receiver<Pressure> {
        self.pressure.subscribe()
    }

    fn image_fs_needed(&self) -> bool {
        self.settings.thresholds.iter().any(|t| {
            matches!(
                t.signal,
                Signal::ImageFsAvailable | Signal::ImageFsInodesFree
            )
        })
    }

    /// Where the root memory cgroup's usage makes `memory.available` cross
    /// each memory threshold (upstream's `capacity - threshold +
    /// inactive_file`). Empty without a v1 memory controller.
    fn arm_points(&self) -> Vec<u64> {
        let Some(root) = &self.memcg_v1_root else {
            return Vec::new();
        };
        let Some(m) = crate::machine::NodeMemory::read(Some(root)) else {
            return Vec::new();
        };
        let inactive = i64::try_from(m.usage.saturating_sub(m.working_set)).unwrap_or(0);
        let capacity = i64::try_from(m.capacity).unwrap_or(i64::MAX);
        self.settings
            .thresholds
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable)
            .filter_map(|t| u64::try_from(capacity - t.value.of(capacity) + inactive).ok())
            .collect()
    }

    /// Whether the root memory cgroup's usage is already past one of `points`.
    fn passed(&self, points: &[u64]) -> bool {
        let Some(root) = &self.memcg_v1_root else {
            return false;
        };
        std::fs::read_to_string(root.join("memory.usage_in_bytes"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .is_some_and(|usage| points.iter().any(|p| usage > *p))
    }

    /// Arms one kernel usage threshold at each of `points`.
    fn arm_memcg(&self, points: &[u64]) -> Vec<notify::MemcgThreshold> {
        let Some(root) = &self.memcg_v1_root else {
            return Vec::new();
        };
        points
            .iter()
            .filter_map(|at| match notify::MemcgThreshold::arm(root, *at) {
                Ok(n) => Some(n),
                Err(e) => {
                    tracing::warn!(cgroup = %root.display(), error = %e, "cannot arm a memory cgroup threshold; the 10 s evaluation remains");
                    None
                }
            })
            .collect()
    }

    /// Runs passes until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut state = decide::State::default();
        let has_memory = self
            .settings
            .thresholds
            .iter()
            .any(|t| t.signal == Signal::MemoryAvailable);
        let kernel = self.settings.kernel_notification && has_memory;
        let psi = kernel
            .then(|| {
                notify::PsiTrigger::arm(std::path::Path::new("/proc/pressure/memory"), PSI_TRIGGER)
                    .map_err(|e| tracing::info!(error = %e, "no PSI memory trigger"))
                    .ok()
            })
            .flatten();
        let mut trigger = Trigger::Timer;
        loop {
            let evicted = self.pass(&mut state, trigger).await;
            if let Some(uid) = evicted {
                self.wait_for_cleanup(&uid, &shutdown).await;
                trigger = Trigger::AfterEviction;
                continue;
            }
            let period = state
                .next_due(&self.settings, std::time::Instant::now())
                .map_or(self.settings.monitoring, |d| {
                    d.min(self.settings.monitoring)
                });
            let memory_met = state.memory_met(&self.settings);
            let Some(t) = self
                .wait(
                    Instant::now() + period,
                    kernel,
                    memory_met,
                    psi.as_ref(),
                    &shutdown,
                )
                .await
            else {
                return;
            };
            trigger = t;
        }
    }

    /// Waits for the next pass: `until`, a memory cgroup threshold crossing
    /// or a PSI event. The thresholds are re-armed every [`REARM`] when their
    /// crossing point moved (inactive file pages come and go), so the kernel's
    /// point stays where `memory.available` crosses. None: shutting down.
    ///
    /// The kernel signals crossings only: usage that went past a point
    /// between its computation and its arming (a pass that read the node just
    /// before the crossing, then armed after it) would never be signalled.
    /// So each arming is followed by a reading, and a point already passed
    /// wakes a pass at once, unless the last pass (`memory_met`) already saw
    /// the threshold met and did what it could.
    async fn wait(
        &self,
        until: Instant,
        kernel: bool,
        memory_met: bool,
        psi: Option<&notify::PsiTrigger>,
        shutdown: &CancellationToken,
    ) -> Option<Trigger> {
        enum Woke {
            Trigger(Trigger),
            Rearm,
            Stop,
        }
        let mut points = Vec::new();
        let mut memcg = Vec::new();
        // The node's inactive file pages when the points were computed: a
        // cheap global reading (`/proc/meminfo`, no memory cgroup statistics
        // flush) decides whether to compute them again.
        let mut inactive_then: Option<u64> = None;
        loop {
            let inactive_now = kernel.then(global_inactive_file).flatten();
            let drifted = match (inactive_then, inactive_now) {
                (Some(a), Some(b)) => a.abs_diff(b) > 1 << 20,
                _ => true,
            };
            if kernel && drifted {
                inactive_then = inactive_now;
                let now = self.arm_points();
                // Moved by more than 1 MiB: arm the new points (then drop the old).
                let moved = now.len() != points.len()
                    || now
                        .iter()
                        .zip(&points)
                        .any(|(a, b): (&u64, &u64)| a.abs_diff(*b) > 1 << 20);
                if moved {
                    memcg = self.arm_memcg(&now);
                    points = now;
                    self.c.journal.kernel(journal::Kernel {
                        memcg_thresholds: memcg.len(),
                        psi: psi.is_some(),
                    });
                    if !memory_met && !memcg.is_empty() && self.passed(&points) {
                        return Some(Trigger::Memcg);
                    }
                }
            }
            let crossed = async {
                if memcg.is_empty() {
                    return std::future::pending().await;
                }
                let waits = memcg.iter().map(|m| Box::pin(m.crossed()));
                let _ = futures_util::future::select_all(waits).await;
            };
            let stalled = async {
                match psi {
                    Some(p) => {
                        let _ = p.fired().await;
                    }
                    None => std::future::pending().await,
                }
            };
            let rearm = async {
                if kernel && !points.is_empty() {
                    tokio::time::sleep_until(crate::clock::next_tick(REARM)).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            let woke = tokio::select! {
                () = shutdown.cancelled() => Woke::Stop,
                () = tokio::time::sleep_until(until) => Woke::Trigger(Trigger::Timer),
                () = crossed => Woke::Trigger(Trigger::Memcg),
                () = stalled => Woke::Trigger(Trigger::Psi),
                () = rearm => Woke::Rearm,
            };
            match woke {
                Woke::Stop => return None,
                Woke::Trigger(t) => return Some(t),
                Woke::Rearm => {}
            }
        }
    }

    /// One evaluation; evicts at most one pod, whose UID it returns.
    async fn pass(&self, state: &mut decide::State, trigger: Trigger) -> Option<PodUid> {
        let node = self.c.stats.node_resources(self.image_fs_needed()).await;
        let observations = decide::observe(&node);
        let eval = state.evaluate(&self.settings, &observations, std::time::Instant::now());
        self.pressure.send_if_modified(|p| {
            let changed = *p != eval.pressure;
            if changed {
                tracing::info!(pressure = ?eval.pressure, "node pressure conditions changed");
            }
            *p = eval.pressure;
            changed
        });
        self.c.journal.pass(journal::Pass {
            at_ns: crate::clock::unix_ns(),
            trigger: trigger.as_str(),
            conditions: eval
                .pressure
                .conditions()
                .into_iter()
                .map(thresholds::Condition::as_str)
                .collect(),
            signal: eval.act_on.as_ref().map(|(t, _, _)| t.signal.as_str()),
            threshold: eval.act_on.as_ref().map(|(_, q, _)| *q),
            available: eval.act_on.as_ref().map(|(_, _, a)| *a),
            evicted: None,
        });
        // Pods over their own local storage limits go first (upstream's
        // localStorageEviction), whatever the node's signals say.
        if let Some(uid) = self.local_storage().await {
            return Some(uid);
        }
        let Some((threshold, quantity, available)) = eval.act_on else {
            self.stuck.store(false, Ordering::Relaxed);
            return None;
        };
        tracing::debug!(
            signal = threshold.signal.as_str(),
            trigger = trigger.as_str(),
            available,
            threshold = quantity,
            "eviction threshold met; attempting to reclaim"
        );
        if self.reclaim_node_level(state, threshold.signal).await {
            return None;
        }
        self.evict_one(&threshold, quantity, available).await
    }

    /// Upstream's `reclaimNodeLevelResources`: for a disk signal, dead
    /// containers and then unused images go first; true when that was enough
    /// (no threshold met any more, minimum reclaim included), so no pod is
    /// evicted.
    async fn reclaim_node_level(&self, state: &decide::State, signal: Signal) -> bool {
        if !signal.is_disk() {
            return false;
        }
        match self.c.containers.collect().await {
            Some(removed) => tracing::info!(
                signal = signal.as_str(),
                removed,
                "eviction manager: deleted unused containers"
            ),
            None => tracing::info!(
                signal = signal.as_str(),
                "eviction manager: unexpected error when attempting to reduce resource pressure: the container garbage collector is gone"
            ),
        }
        match self.c.images.delete_unused().await {
            Ok(freed) => tracing::info!(
                signal = signal.as_str(),
                freed,
                "eviction manager: deleted unused images"
            ),
            Err(e) => {
                tracing::info!(signal = signal.as_str(), error = %e, "eviction manager: unexpected error when attempting to reduce resource pressure")
            }
        }
        let node = self.c.stats.node_resources(self.image_fs_needed()).await;
        let observations = decide::observe(&node);
        if state.met_now(&self.settings, &observations).is_empty() {
            tracing::info!(
                signal = signal.as_str(),
                "eviction manager: able to reduce resource pressure without evicting pods"
            );
            return true;
        }
        false
    }

    async fn evict_one(&self, t: &Threshold, quantity: i64, available: i64) -> Option<PodUid> {
        let views: Vec<_> = self.c.workers.views_where(|v| {
            v.phase == Phase::Sync
                && !matches!(v.status.phase.as_deref(), Some("Succeeded" | "Failed"))
                && !rank::is_critical(&v.pod)
        });
        // Only the candidates' usage is read, and only when there are some: a
        // node of static pods under pressure costs the runtime nothing.
        let summary = if views.is_empty() {
            None
        } else {
            let memory_only = t.signal == Signal::MemoryAvailable;
            match self.c.stats.summary(&views, memory_only).await {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "eviction: pod stats unavailable; ranking without them");
                    None
                }
            }
        };
        let by_uid: HashMap<&str, &crate::stats::PodStats> = summary
            .iter()
            .flat_map(|s| s.pods.iter())
            .map(|p| (p.pod_ref.uid.as_str(), p))
            .collect();
        let uids: Vec<String> = views.iter().map(|v| crate::pod::uid(&v.pod).0).collect();
        let mut candidates: Vec<rank::Candidate<'_>> = views
            .iter()
            .zip(&uids)
            .map(|(v, uid)| rank::Candidate {
                pod: &v.pod,
                stats: by_uid.get(uid.as_str()).copied(),
            })
            .collect();
        rank::rank(t.signal, &mut candidates);
        for c in candidates {
            let pod = c.pod;
            let grace = if t.is_hard() {
                HARD_EVICTION_GRACE
            } else {
                let own = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds);
                own.map_or(self.settings.max_pod_grace, |g| {
                    g.min(self.settings.max_pod_grace)
                })
            };
            let message = rank::message(t.signal, quantity, available, pod, c.stats);
            if !self.evict(pod, grace, t.signal.as_str(), message) {
                continue;
            }
            self.stuck.store(false, Ordering::Relaxed);
            return Some(crate::pod::uid(pod));
        }
        if !self.stuck.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                signal = t.signal.as_str(),
                available,
                threshold = quantity,
                "eviction manager: threshold met but no pod can be evicted (critical pods are never evicted)"
            );
        }
        None
    }

    /// Evicts `pod` for `signal` (a threshold's signal or a local limit's
    /// label): the worker fails it with `message`, a Warning `Evicted` event,
    /// `kubelet_evictions`, the journal. False: its worker was not running it.
    fn evict(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
        grace: i64,
        signal: &'static str,
        message: String,
    ) -> bool {
        if !self
            .c
            .workers
            .fail(pod.clone(), Some(grace), "Evicted", &message)
        {
            return false;
        }
        tracing::info!(pod = %crate::pod::key(pod), grace, signal, %message, "eviction manager: evicting pod");
        self.c
            .recorder
            .record(Event::about(pod, None, "Warning", "Evicted", message));
        self.c.metrics.evictions.with_label_values(&[signal]).inc();
        self.c.journal.evicted(crate::pod::key(pod), signal);
        true
    }

    /// Evicts the first active pod with an emptyDir volume over its
    /// `sizeLimit` (measured now, by walking only those volumes), as upstream's
    /// `emptyDirLimitEviction`: grace 0, upstream's message, no
    /// `DisruptionTarget` condition, `kubelet_evictions{eviction_signal="emptydirfs.limit"}`.
    async fn local_storage(&self) -> Option<PodUid> {
        // Critical pods are never evicted, for their storage neither; only
        // pods that limit their local storage are looked at.
        let views: Vec<PodView> = self.c.workers.views_where(|v| {
            v.phase == Phase::Sync
                && local::limits_local_storage(&v.pod)
                && !rank::is_critical(&v.pod)
        });
        for view in &views {
            let pod = &view.pod;
            let uid = crate::pod::uid(pod);
            for (name, text, limit) in local::empty_dir_limits(pod) {
                let dir = self.c.stats.empty_dir(&uid, &name);
                let Ok((used, _)) =
                    tokio::task::spawn_blocking(move || crate::stats::disk_usage(&dir)).await
                else {
                    continue;
                };
                if i64::try_from(used).unwrap_or(i64::MAX) <= limit {
                    continue;
                }
                tracing::debug!(pod = %crate::pod::key(pod), volume = %name, used, limit, "emptyDir over its sizeLimit");
                if !self.evict(
                    pod,
                    0,
                    local::EMPTY_DIR,
                    local::empty_dir_message(&name, &text),
                ) {
                    break;
                }
                return Some(uid);
            }
        }
        // Only pods that limit their ephemeral storage are measured.
        let limited: Vec<PodView> = views
            .into_iter()
            .filter(|v| local::has_storage_limits(&v.pod))
            .collect();
        if limited.is_empty() {
            return None;
        }
        let summary = match self.c.stats.summary(&limited, false).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "eviction: pods' storage usage unavailable");
                return None;
            }
        };
        for view in &limited {
            let uid = crate::pod::uid(&view.pod);
            let Some(stats) = summary.pods.iter().find(|p| p.pod_ref.uid == uid.0) else {
                continue;
            };
            if let Some((signal, message)) = local::over_limit(&view.pod, stats)
                && self.evict(&view.pod, 0, signal, message)
            {
                return Some(uid);
            }
        }
        None
    }

    /// Waits until the evicted pod's worker stopped its containers (its phase
    /// left `Terminating`), at most [`CLEANUP_TIMEOUT`].
    async fn wait_for_cleanup(&self, uid: &PodUid, shutdown: &CancellationToken) {
        let until = Instant::now() + CLEANUP_TIMEOUT;
        while Instant::now() < until {
            let busy = self
                .c
                .workers
                .view(uid)
                .is_some_and(|v| matches!(v.phase, Phase::Sync | Phase::Terminating(_)));
            if !busy {
                return;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        tracing::warn!(pod = %uid, "eviction manager: the evicted pod did not stop within 30 s");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(value).expect("pod")
    }

    #[test]
    fn inactive_file_is_read_from_its_line_in_bytes() {
        let meminfo = "MemTotal:       24576000 kB\nActive(file):     512000 kB\nInactive(file):   204800 kB\nUnevictable:           0 kB\n";
        assert_eq!(inactive_file_of(meminfo), Some(204_800 * 1024));
        assert_eq!(inactive_file_of("MemTotal: 1 kB\n"), None);
        assert_eq!(inactive_file_of("Inactive(file): lots kB\n"), None);
        // The real file has it, and it agrees with procfs' reading.
        use procfs::Current as _;
        let procfs = procfs::Meminfo::current()
            .ok()
            .and_then(|m| m.inactive_file);
        let ours = global_inactive_file();
        assert!(ours.is_some(), "/proc/meminfo has Inactive(file)");
        if let (Some(a), Some(b)) = (ours, procfs) {
            assert!(a.abs_diff(b) < 64 << 20, "ours {a}, procfs {b}");
        }
    }

    #[test]
    fn memory_pressure_refuses_best_effort_pods_only_and_disk_pressure_refuses_all() {
        let best_effort = pod(serde_json::json!({
            "metadata": {"name": "be", "uid": "1"},
            "spec": {"containers": [{"name": "c", "image": "x"}]}
        }));
        let burstable = pod(serde_json::json!({
            "metadata": {"name": "bu", "uid": "2"},
            "spec": {"containers": [{"name": "c", "image": "x",
                "resources": {"requests": {"memory": "10Mi"}}}]}
        }));
        let tolerant = pod(serde_json::json!({
            "metadata": {"name": "t", "uid": "3"},
            "spec": {"containers": [{"name": "c", "image": "x"}],
                "tolerations": [{"key": "node.kubernetes.io/memory-pressure",
                    "operator": "Exists", "effect": "NoSchedule"}]}
        }));
        let memory = Pressure {
            memory: true,
            ..Pressure::default()
        };
        assert_eq!(
            admit(&best_effort, memory),
            Err((
                "Evicted".into(),
                "The node had condition: [MemoryPressure]. ".into()
            ))
        );
        assert_eq!(admit(&burstable, memory), Ok(()));
        assert_eq!(admit(&tolerant, memory), Ok(()));
        let disk = Pressure {
            memory: true,
            disk: true,
            ..Pressure::default()
        };
        assert_eq!(
            admit(&burstable, disk).expect_err("refused").1,
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
        assert_eq!(admit(&burstable, Pressure::default()), Ok(()));
    }
}
