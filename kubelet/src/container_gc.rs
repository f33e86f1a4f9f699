//! Container garbage collection across the node's pods, as upstream's
//! `containerGC` decides it (pure: the sync loop's GC tick removes what
//! [`evictable`] names).
//!
//! An evict unit is one container name of one pod; its dead instances (the
//! running one never counts) older than the minimum age are candidates,
//! newest first. Each unit keeps at most `max_per_pod_container` of them (1:
//! the newest dead instance, which the status's `lastState` and
//! `kubectl logs --previous` read); with `max_containers` set, the units are
//! first cut to an equal share of it and then the oldest instances node-wide
//! go until the node holds no more than that.
//!
//! A pod whose content should be removed (upstream's
//! `ShouldPodContentBeRemoved`: an evicted pod) keeps nothing: every dead
//! instance of its containers goes, and then its stopped sandboxes
//! ([`dead_sandboxes`]); its status keeps the containers' terminated states
//! (see `status::compute`).
//!
//! [`Reclaim`] is how the eviction manager asks the sync loop (which owns the
//! pod cache the decision reads) for a collection now, as upstream's
//! node-level reclaim calls `DeleteAllUnusedContainers` before it evicts a
//! pod for disk.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use evlet_cri::{ContainerId, SandboxId};

use crate::pod::PodUid;
use crate::runtime::{PodStatus, State};

/// `--minimum-container-ttl-duration`, `--maximum-dead-containers-per-container`,
/// `--maximum-dead-containers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// A dead container created less than this ago stays (0).
    pub min_age: Duration,
    /// Dead instances kept per container name of a pod (1; negative: no limit).
    pub max_per_pod_container: i32,
    /// Dead containers kept on the node (-1: no limit).
    pub max_containers: i32,
    /// How often the GC runs (upstream's `ContainerGCPeriod`, 1 min).
    pub period: Duration,
}

/// Upstream's `ContainerGCPeriod`.
pub const PERIOD: Duration = Duration::from_secs(60);

impl Default for Policy {
    fn default() -> Self {
        Self {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
            period: PERIOD,
        }
    }
}

/// A dead container instance that may be removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dead {
    /// Its pod.
    pub pod: PodUid,
    /// Its name in the pod spec.
    pub name: String,
    /// The instance.
    pub id: ContainerId,
    /// When it was created (Unix ns).
    pub created_at: i64,
}

/// A handle on the sync loop's container GC: [`Reclaim::collect`] runs one
/// collection now and answers how many dead containers it removed.
#[derive(Debug, Clone)]
pub struct Reclaim(mpsc::Sender<oneshot::Sender<usize>>);

/// The sync loop's end of [`Reclaim`]: each request carries where the count goes.
pub type Requests = mpsc::Receiver<oneshot::Sender<usize>>;

impl Reclaim {
    /// A handle and the requests its holder makes.
    pub fn channel() -> (Self, Requests) {
        let (tx, rx) = mpsc::channel(4);
        (Self(tx), rx)
    }

    /// Runs a collection and waits until its removals are done; None if the
    /// sync loop is gone.
    pub async fn collect(&self) -> Option<usize> {
        let (tx, rx) = oneshot::channel();
        self.0.send(tx).await.ok()?;
        rx.await.ok()
    }
}

/// The dead containers of `pods` to remove at `now_ns` under `policy`; every
/// one old enough of the pods in `remove_all` (evicted pods).
pub fn evictable<'a>(
    pods: impl IntoIterator<Item = &'a PodStatus>,
    policy: &Policy,
    now_ns: i64,
    remove_all: &BTreeSet<PodUid>,
) -> Vec<Dead> {
    let newest_allowed =
        now_ns.saturating_sub(i64::try_from(policy.min_age.as_nanos()).unwrap_or(i64::MAX));
    // Units, each newest first.
    let mut units: BTreeMap<(&PodUid, &str), Vec<Dead>> = BTreeMap::new();
    for pod in pods {
        for c in &pod.containers {
            if c.state != State::Exited || c.created_at > newest_allowed {
                continue;
            }
            units.entry((&pod.uid, &c.name)).or_default().push(Dead {
                pod: pod.uid.clone(),
                name: c.name.clone(),
                id: c.id.clone(),
                created_at: c.created_at,
            });
        }
    }
    for unit in units.values_mut() {
        unit.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    }
    let mut removed = Vec::new();
    units.retain(|(uid, _), unit| {
        if remove_all.contains(*uid) {
            removed.append(unit);
            false
        } else {
            true
        }
    });
    let mut keep_per_unit = |units: &mut BTreeMap<_, Vec<Dead>>, keep: usize| {
        for unit in units.values_mut() {
            if unit.len() > keep {
                removed.extend(unit.drain(keep..));
            }
        }
    };
    if let Ok(keep) = usize::try_from(policy.max_per_pod_container) {
        keep_per_unit(&mut units, keep);
    }
    if let Ok(max) = usize::try_from(policy.max_containers) {
        let total = |units: &BTreeMap<_, Vec<Dead>>| units.values().map(Vec::len).sum::<usize>();
        if total(&units) > max {
            let share = (max / units.len().max(1)).max(1);
            keep_per_unit(&mut units, share);
        }
        let left = total(&units);
        if left > max {
            let mut all: Vec<Dead> = units.into_values().flatten().collect();
            all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
            removed.extend(all.into_iter().take(left - max));
        }
    }
    removed
}

/// Whether a finished pod's published status has caught up with its kill:
/// no container still shows running. Until then its containers are kept,
/// so the status can show their terminated states, which it keeps once the
/// containers are gone (a container removed first would be shown waiting).
pub fn status_settled(status: &k8s_openapi::api::core::v1::PodStatus) -> bool {
    status
        .container_statuses
        .iter()
        .chain(status.init_container_statuses.iter())
        .flatten()
        .all(|c| c.state.as_ref().is_none_or(|s| s.running.is_none()))
}

/// The sandboxes of an evicted pod to remove once `dead` (this collection's
/// containers) are gone: the stopped ones, when no container of the pod is
/// left (upstream's sandbox GC keeps a sandbox that still has containers).
pub fn dead_sandboxes(pod: &PodStatus, dead: &[ContainerId]) -> Vec<SandboxId> {
    if pod.containers.iter().any(|c| !dead.contains(&c.id)) {
        return Vec::new();
    }
    pod.sandboxes
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::ContainerStatus;

    fn instance(name: &str, n: i64, state: State) -> ContainerStatus {
        ContainerStatus::test(name, n, state)
    }

    fn pod(uid: &str, containers: Vec<ContainerStatus>) -> PodStatus {
        let mut p = PodStatus::empty(PodUid::from(uid));
        p.containers = containers;
        p
    }

    fn ids(d: &[Dead]) -> Vec<&str> {
        let mut v: Vec<&str> = d.iter().map(|d| d.id.as_str()).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn the_newest_dead_instance_of_each_container_stays() {
        let p = pod(
            "p",
            vec![
                instance("a", 4, State::Running),
                instance("a", 3, State::Exited),
                instance("a", 1, State::Exited),
                instance("a", 2, State::Exited),
                instance("b", 2, State::Exited),
            ],
        );
        let gone = evictable(&[p], &Policy::default(), 100, &BTreeSet::new());
        assert_eq!(ids(&gone), ["a1", "a2"], "a3 stays: it is a's last state");
    }

    #[test]
    fn a_status_that_still_shows_a_container_running_is_not_settled() {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
            PodStatus as V1,
        };
        let with = |state: ContainerState| V1 {
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                state: Some(state),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert!(!status_settled(&with(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        })));
        assert!(status_settled(&with(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                ..Default::default()
            }),
            ..Default::default()
        })));
        assert!(status_settled(&V1::default()));
    }

    #[test]
    fn an_evicted_pod_keeps_no_dead_container_and_then_no_sandbox() {
        let mut evicted = pod(
            "e",
            vec![
                instance("a", 3, State::Exited),
                instance("a", 1, State::Exited),
                instance("b", 2, State::Exited),
                instance("c", 95, State::Exited),
            ],
        );
        evicted.sandboxes.push(crate::runtime::SandboxStatus {
            id: SandboxId::new("s"),
            ready: false,
            created_at: 1,
            attempt: 0,
            ip: None,
        });
        let other = pod("p", vec![instance("a", 2, State::Exited)]);
        let remove_all = BTreeSet::from([PodUid::from("e")]);
        let policy = Policy {
            min_age: Duration::from_nanos(10),
            ..Policy::default()
        };
        // c95 is younger than the minimum age: it and the sandbox stay.
        let gone = evictable([&evicted, &other], &policy, 100, &remove_all);
        assert_eq!(ids(&gone), ["a1", "a3", "b2"]);
        let dead: Vec<ContainerId> = gone.iter().map(|d| d.id.clone()).collect();
        assert!(dead_sandboxes(&evicted, &dead).is_empty());
        // Later every container goes, and with them the stopped sandbox.
        let gone = evictable([&evicted, &other], &policy, 200, &remove_all);
        let dead: Vec<ContainerId> = gone.iter().map(|d| d.id.clone()).collect();
        assert_eq!(dead_sandboxes(&evicted, &dead), [SandboxId::new("s")]);
        // A pod not evicted keeps its newest dead instance and its sandbox.
        assert!(!dead.contains(&ContainerId::new("a2")));
    }

    #[test]
    fn an_evicted_pod_without_containers_loses_its_stopped_sandbox_only() {
        // Its containers went in an earlier pass, while the sandbox was still
        // being stopped; nothing is left to remove but the sandbox.
        let mut evicted = pod("e", Vec::new());
        let sandbox = |id: &str, ready| crate::runtime::SandboxStatus {
            id: SandboxId::new(id),
            ready,
            created_at: 1,
            attempt: 0,
            ip: None,
        };
        evicted.sandboxes.push(sandbox("s", true));
        assert!(
            dead_sandboxes(&evicted, &[]).is_empty(),
            "a ready sandbox stays"
        );
        evicted.sandboxes[0].ready = false;
        evicted.sandboxes.push(sandbox("t", true));
        assert_eq!(dead_sandboxes(&evicted, &[]), [SandboxId::new("s")]);
    }

    #[test]
    fn young_dead_containers_stay_for_the_minimum_age() {
        let p = pod(
            "p",
            vec![
                instance("a", 90, State::Exited),
                instance("a", 50, State::Exited),
                instance("a", 10, State::Exited),
            ],
        );
        let policy = Policy {
            min_age: Duration::from_nanos(30),
            ..Policy::default()
        };
        // At 100 only a50 and a10 are old enough: a50 is the unit's newest.
        assert_eq!(
            ids(&evictable(&[p], &policy, 100, &BTreeSet::new())),
            ["a10"]
        );
    }

    #[test]
    fn a_node_limit_cuts_units_to_a_share_then_the_oldest_go() {
        let pods = [
            pod(
                "p",
                vec![
                    instance("a", 10, State::Exited),
                    instance("a", 9, State::Exited),
                    instance("a", 8, State::Exited),
                ],
            ),
            pod(
                "q",
                vec![
                    instance("b", 7, State::Exited),
                    instance("c", 1, State::Exited),
                ],
            ),
        ];
        let unlimited = Policy {
            max_per_pod_container: -1,
            max_containers: -1,
            ..Policy::default()
        };
        assert!(evictable(&pods, &unlimited, 100, &BTreeSet::new()).is_empty());
        // 5 dead, limit 4 over 3 units: share 1 each (a10, b7, c1 stay).
        let node = Policy {
            max_per_pod_container: -1,
            max_containers: 4,
            ..Policy::default()
        };
        assert_eq!(
            ids(&evictable(&pods, &node, 100, &BTreeSet::new())),
            ["a8", "a9"]
        );
        // Limit 2: the share is still 1, then the oldest of those go.
        let tight = Policy {
            max_containers: 2,
            ..node
        };
        assert_eq!(
            ids(&evictable(&pods, &tight, 100, &BTreeSet::new())),
            ["a8", "a9", "c1"]
        );
        // Limit 0: every dead container.
        let none = Policy {
            max_containers: 0,
            ..node
        };
        assert_eq!(evictable(&pods, &none, 100, &BTreeSet::new()).len(), 5);
    }
}
