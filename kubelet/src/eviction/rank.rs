//! Which pod goes first, and what its status says (upstream's rank functions
//! and `evictionMessage` in `pkg/kubelet/eviction/helpers.go`).
//!
//! - memory: pods whose usage exceeds their requests (or with no stats) first,
//!   then lower priority, then the larger usage above requests;
//! - disk bytes and inodes: the same with the pod's ephemeral storage;
//! - PIDs: lower priority, then more processes.

use std::cmp::Ordering;

use k8s_openapi::api::core::v1::Pod;

use super::thresholds::Signal;
use crate::stats::PodStats;

/// `SystemCriticalPriority`: pods at or above it are critical.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Upstream's `IsCriticalPod`: static and mirror pods, and pods of system
/// critical priority. They are never evicted and always admitted.
pub fn is_critical(pod: &Pod) -> bool {
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    crate::pod::is_static(pod)
        || mirror
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// A pod that may be evicted, with its stats if it has any.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// Its stats (None: not measured).
    pub stats: Option<&'a PodStats>,
}

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The pod's usage of what `signal` starves.
fn usage(signal: Signal, stats: &PodStats) -> Option<i64> {
    match signal {
        Signal::MemoryAvailable => stats.memory.as_ref()?.working_set_bytes.map(int),
        Signal::NodeFsAvailable | Signal::ImageFsAvailable => {
            stats.ephemeral_storage.as_ref()?.used_bytes.map(int)
        }
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => {
            stats.ephemeral_storage.as_ref()?.inodes_used.map(int)
        }
        Signal::PidAvailable => None,
    }
}

/// The pod's request of what `signal` starves.
fn request(signal: Signal, pod: &Pod) -> i64 {
    match signal {
        Signal::MemoryAvailable => crate::resources::memory_request_for_eviction(pod),
        Signal::NodeFsAvailable | Signal::ImageFsAvailable => pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .filter_map(|c| {
                let q = c
                    .resources
                    .as_ref()?
                    .requests
                    .as_ref()?
                    .get("ephemeral-storage")?;
                crate::quantity::parse(&q.0).ok()
            })
            .sum(),
        _ => 0,
    }
}

/// Sorts `pods` so that the first is the one to evict for `signal`.
pub fn rank(signal: Signal, pods: &mut [Candidate<'_>]) {
    pods.sort_by(|a, b| order(signal, a, b));
}

fn order(signal: Signal, a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    if signal == Signal::PidAvailable {
        // Upstream's rankPIDPressure: lower priority, then (pods without stats
        // first) more processes.
        let count = |c: &Candidate<'_>| {
            c.stats
                .map(|s| s.process_stats.and_then(|p| p.process_count).unwrap_or(0))
        };
        return priority(a.pod)
            .cmp(&priority(b.pod))
            .then_with(|| match (count(a), count(b)) {
                (None, Some(_)) => Ordering::Less,
                (Some(_), None) => Ordering::Greater,
                (x, y) => y.cmp(&x),
            });
    }
    let measured = |c: &Candidate<'_>| c.stats.and_then(|s| usage(signal, s));
    let (ua, ub) = (measured(a), measured(b));
    // Pods without stats first (upstream: "a pod with no stats is evicted first").
    match (ua, ub) {
        (None, Some(_)) => return Ordering::Less,
        (Some(_), None) => return Ordering::Greater,
        (None, None) => return priority(a.pod).cmp(&priority(b.pod)),
        (Some(_), Some(_)) => {}
    }
    let (ua, ub) = (ua.unwrap_or(0), ub.unwrap_or(0));
    let (ra, rb) = (request(signal, a.pod), request(signal, b.pod));
    let exceeds = |u: i64, r: i64| u > r;
    // Exceeding requests first.
    exceeds(ub, rb)
        .cmp(&exceeds(ua, ra))
        .then_with(|| priority(a.pod).cmp(&priority(b.pod)))
        // The larger usage above requests first.
        .then_with(|| (ub - rb).cmp(&(ua - ra)))
}

/// A quantity as `resource.Quantity.String()` writes it: binary suffixes for
/// bytes (`95624Ki`), decimal ones for counts (`1k`), exact only.
pub fn quantity(v: i64, bytes: bool) -> String {
    let (base, suffixes): (i64, [&str; 7]) = if bytes {
        (1024, ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
    } else {
        (1000, ["", "k", "M", "G", "T", "P", "E"])
    };
    if bytes && v.abs() < 1024 {
        return v.to_string();
    }
    let (mut n, mut i) = (v, 0);
    while i < suffixes.len() - 1 && n != 0 && n % base == 0 {
        n /= base;
        i += 1;
    }
    format!("{n}{}", suffixes[i])
}

/// Upstream's eviction message: the resource, the threshold and what was
/// available, and every container using more than it requested.
pub fn message(
    signal: Signal,
    threshold: i64,
    available: i64,
    pod: &Pod,
    stats: Option<&PodStats>,
) -> String {
    let resource = signal.resource();
    let bytes = signal.is_bytes();
    let mut m = format!(
        "The node was low on resource: {resource}. Threshold quantity: {}, available: {}. ",
        quantity(threshold, bytes),
        quantity(available, bytes)
    );
    if signal != Signal::MemoryAvailable {
        return m;
    }
    let Some(stats) = stats else { return m };
    for cs in &stats.containers {
        let Some(c) = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .find(|c| c.name == cs.name)
        else {
            continue;
        };
        let requested = crate::resources::values(c, crate::resources::List::Requests)
            .1
            .unwrap_or(0);
        let Some(used) = cs
            .memory
            .as_ref()
            .and_then(|m| m.working_set_bytes)
            .map(int)
        else {
            continue;
        };
        if used > requested {
            m.push_str(&format!(
                "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                c.name,
                quantity(used, true),
                quantity(requested, true),
            ));
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{ContainerStats, MemoryStats, PodReference};

    fn pod(name: &str, priority: i32, request: Option<&str>, limit: Option<&str>) -> Pod {
        let resources = serde_json::json!({
            "requests": request.map(|r| serde_json::json!({"memory": r, "cpu": "100m"})),
            "limits": limit.map(|l| serde_json::json!({"memory": l, "cpu": "100m"})),
        });
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"priority": priority, "containers": [
                {"name": "app", "image": "x", "resources": resources}
            ]}
        }))
        .expect("pod")
    }

    fn stats(name: &str, working_set: u64) -> PodStats {
        let memory = MemoryStats {
            time: crate::clock::now(),
            available_bytes: None,
            usage_bytes: Some(working_set),
            working_set_bytes: Some(working_set),
            rss_bytes: None,
            page_faults: None,
            major_page_faults: None,
        };
        PodStats {
            pod_ref: PodReference {
                name: name.into(),
                namespace: "default".into(),
                uid: name.into(),
            },
            start_time: None,
            containers: vec![ContainerStats {
                name: "app".into(),
                start_time: None,
                cpu: None,
                memory: Some(memory.clone()),
                rootfs: None,
                logs: None,
            }],
            cpu: None,
            memory: Some(memory),
            network: None,
            volume: Vec::new(),
            ephemeral_storage: None,
            process_stats: Some(crate::stats::ProcessStats {
                process_count: Some(working_set >> 20),
            }),
        }
    }

    fn order_of(pods: &[(Pod, Option<PodStats>)]) -> Vec<String> {
        order_for(Signal::MemoryAvailable, pods)
    }

    fn order_for(signal: Signal, pods: &[(Pod, Option<PodStats>)]) -> Vec<String> {
        let mut c: Vec<Candidate<'_>> = pods
            .iter()
            .map(|(p, s)| Candidate {
                pod: p,
                stats: s.as_ref(),
            })
            .collect();
        rank(signal, &mut c);
        c.iter()
            .map(|c| crate::pod::name(c.pod).to_owned())
            .collect()
    }

    #[test]
    fn best_effort_goes_before_guaranteed_within_its_requests() {
        let pods = [
            (
                pod("guaranteed", 0, Some("1Gi"), Some("1Gi")),
                Some(stats("guaranteed", 900 << 20)),
            ),
            (
                pod("besteffort", 0, None, None),
                Some(stats("besteffort", 10 << 20)),
            ),
        ];
        assert_eq!(order_of(&pods), ["besteffort", "guaranteed"]);
    }

    #[test]
    fn exceeding_requests_then_priority_then_usage_above_requests() {
        let pods = [
            (
                pod("within", 0, Some("1Gi"), None),
                Some(stats("within", 500 << 20)),
            ),
            (
                pod("small-over", 0, Some("100Mi"), None),
                Some(stats("small-over", 150 << 20)),
            ),
            (
                pod("big-over", 0, Some("100Mi"), None),
                Some(stats("big-over", 900 << 20)),
            ),
            (
                pod("important-over", 1000, Some("100Mi"), None),
                Some(stats("important-over", 2000 << 20)),
            ),
            (pod("unmeasured", 1000, Some("1Gi"), None), None),
        ];
        assert_eq!(
            order_of(&pods),
            [
                "unmeasured",
                "big-over",
                "small-over",
                "important-over",
                "within"
            ]
        );
    }

    #[test]
    fn pid_pressure_ranks_by_priority_then_the_most_processes() {
        // `stats(name, n MiB)` counts n processes.
        let pods = [
            (pod("few", 0, None, None), Some(stats("few", 3 << 20))),
            (pod("many", 0, None, None), Some(stats("many", 300 << 20))),
            (
                pod("important", 10, None, None),
                Some(stats("important", 900 << 20)),
            ),
            (pod("unmeasured", 0, None, None), None),
        ];
        assert_eq!(
            order_for(Signal::PidAvailable, &pods),
            ["unmeasured", "many", "few", "important"]
        );
    }

    #[test]
    fn static_mirror_and_system_critical_pods_are_critical() {
        assert!(!is_critical(&pod("plain", 0, None, None)));
        assert!(is_critical(&pod(
            "system",
            SYSTEM_CRITICAL_PRIORITY,
            None,
            None
        )));
        let mut mirror = pod("mirror", 0, None, None);
        mirror.metadata.annotations =
            Some([("kubernetes.io/config.mirror".into(), "x".into())].into());
        assert!(is_critical(&mirror));
    }

    #[test]
    fn quantities_print_as_kubernetes_does() {
        assert_eq!(quantity(100 << 20, true), "100Mi");
        assert_eq!(quantity(97_918_976, true), "95624Ki");
        assert_eq!(quantity(1000, true), "1000");
        assert_eq!(quantity(1536, true), "1536");
        assert_eq!(quantity(4000, false), "4k");
        assert_eq!(quantity(4001, false), "4001");
    }

    #[test]
    fn the_message_names_the_threshold_and_the_containers_over_their_requests() {
        let p = pod("hog", 0, Some("64Mi"), Some("4Gi"));
        let s = stats("hog", 3 << 30);
        assert_eq!(
            message(Signal::MemoryAvailable, 100 << 20, 97_918_976, &p, Some(&s)),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 95624Ki. \
             Container app was using 3Gi, request is 64Mi, has larger consumption of memory. "
        );
    }
}
