//! Cgroup limits from pod specs and node allocatable (pure), as upstream's
//! `ResourceConfigForPod`, QoS manager and node allocatable enforcement
//! compute them, and the files that carry them on cgroup v1 and v2.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::resources::{self, List, Qos, pod_totals_with_overhead};

/// The kernel's smallest `cpu.shares` (upstream's `MinShares`).
pub const MIN_SHARES: u64 = 2;
/// The kernel's largest `cpu.shares`.
pub const MAX_SHARES: u64 = 262_144;
/// Upstream's CFS period (100 ms).
pub const CPU_PERIOD: u64 = 100_000;
/// The smallest quota upstream sets (1 ms).
const MIN_QUOTA: i64 = 1000;

/// What one cgroup is limited to; None: not limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// `cpu.shares` (v2: converted to `cpu.weight`).
    pub cpu_shares: Option<u64>,
    /// CFS quota per [`CPU_PERIOD`] in µs.
    pub cpu_quota: Option<i64>,
    /// Memory limit in bytes.
    pub memory: Option<i64>,
    /// Process limit.
    pub pids: Option<i64>,
}

/// Upstream's `MilliCPUToShares`.
pub fn milli_to_shares(milli: i64) -> u64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    let shares = i128::from(milli) * 1024 / 1000;
    u64::try_from(shares)
        .unwrap_or(MAX_SHARES)
        .clamp(MIN_SHARES, MAX_SHARES)
}

/// Upstream's `MilliCPUToQuota` (None for no limit).
pub fn milli_to_quota(milli: i64) -> Option<i64> {
    if milli <= 0 {
        return None;
    }
    let quota = i128::from(milli) * i128::from(CPU_PERIOD) / 1000;
    Some(i64::try_from(quota).unwrap_or(i64::MAX).max(MIN_QUOTA))
}

/// The conversion of `cpu.shares` to cgroup v2's `cpu.weight` that upstream
/// kubelet and runc ≥ 1.3 use (opencontainers/cgroups'
/// `ConvertCPUSharesToCgroupV2Value` since kubernetes#131216 and
/// runc#4785): a quadratic in `log2(shares)` through the minimum (2 → 1),
/// the default (1024 → 100) and the maximum (262144 → 10000). The earlier
/// linear one made the default 39, below a v2 cgroup's own default of 100.
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares <= MIN_SHARES {
        return 1;
    }
    if shares >= MAX_SHARES {
        return 10_000;
    }
    #[expect(
        clippy::cast_precision_loss,
        reason = "shares < 2^18 are exact in an f64"
    )]
    let l = (shares as f64).log2();
    let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "the value lies in 1..=10000"
    )]
    let weight = 10_f64.powf(exponent).ceil() as u64;
    weight.clamp(1, 10_000)
}

/// The pod cgroup's limits (upstream's `ResourceConfigForPod` with CFS quota
/// enforced): Guaranteed pods get shares, quota and memory; Burstable ones
/// shares, and quota or memory only when every container declares that limit
/// or the pod itself does (`spec.resources`); BestEffort ones the minimum
/// shares. `pod_pids_limit` > 0 limits every pod. The pod's own resources
/// replace its containers' totals where it sets them, and its `spec.overhead`
/// counts as upstream counts it: in the requests (shares), and in the limits
/// the pod has (quota, memory).
pub fn for_pod(pod: &Pod, pod_pids_limit: i64) -> Limits {
    let (req_cpu, _) = pod_totals_with_overhead(pod, List::Requests);
    let (lim_cpu, lim_mem) = pod_totals_with_overhead(pod, List::Limits);
    let containers: Vec<&Container> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .collect();
    let own = resources::pod_level(pod).map_or((None, None), |p| p.limits);
    let declared = |cpu: bool| {
        let by_pod = if cpu { own.0 } else { own.1 };
        by_pod.is_some_and(|v| v > 0)
            || containers.iter().all(|c| {
                let (lc, lm) = resources::values(c, List::Limits);
                if cpu {
                    lc.unwrap_or(0) > 0
                } else {
                    lm.unwrap_or(0) > 0
                }
            })
    };
    let pids = (pod_pids_limit > 0).then_some(pod_pids_limit);
    match resources::qos(pod) {
        Qos::Guaranteed => Limits {
            cpu_shares: Some(milli_to_shares(req_cpu)),
            cpu_quota: milli_to_quota(lim_cpu),
            memory: (lim_mem > 0).then_some(lim_mem),
            pids,
        },
        Qos::Burstable => Limits {
            cpu_shares: Some(milli_to_shares(req_cpu)),
            cpu_quota: if declared(true) {
                milli_to_quota(lim_cpu)
            } else {
                None
            },
            memory: (declared(false) && lim_mem > 0).then_some(lim_mem),
            pids,
        },
        Qos::BestEffort => Limits {
            cpu_shares: Some(MIN_SHARES),
            pids,
            ..Limits::default()
        },
    }
}

/// The `burstable` QoS cgroup's shares: the Burstable pods' CPU requests,
/// overhead included (upstream's QoS manager); `besteffort` always has
/// [`MIN_SHARES`].
pub fn burstable_shares<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> u64 {
    let milli = pods
        .into_iter()
        .filter(|p| resources::qos(p) == Qos::Burstable)
        .map(|p| pod_totals_with_overhead(p, List::Requests).0)
        .fold(0_i64, i64::saturating_add);
    milli_to_shares(milli)
}

/// A cgroup file and the value written to it.
pub type File = (&'static str, &'static str, String);

/// The v1 files (controller, file, value) that carry `l`.
pub fn v1_files(l: &Limits) -> Vec<File> {
    let mut files = Vec::new();
    if let Some(s) = l.cpu_shares {
        files.push(("cpu", "cpu.shares", s.to_string()));
    }
    if let Some(q) = l.cpu_quota {
        files.push(("cpu", "cpu.cfs_period_us", CPU_PERIOD.to_string()));
        files.push(("cpu", "cpu.cfs_quota_us", q.to_string()));
    }
    if let Some(m) = l.memory {
        files.push(("memory", "memory.limit_in_bytes", m.to_string()));
    }
    if let Some(p) = l.pids {
        files.push(("pids", "pids.max", p.to_string()));
    }
    files
}

/// The v2 files (controller, file, value) that carry `l`.
pub fn v2_files(l: &Limits) -> Vec<File> {
    let mut files = Vec::new();
    if let Some(s) = l.cpu_shares {
        files.push(("cpu", "cpu.weight", shares_to_weight(s).to_string()));
    }
    if let Some(q) = l.cpu_quota {
        files.push(("cpu", "cpu.max", format!("{q} {CPU_PERIOD}")));
    }
    if let Some(m) = l.memory {
        files.push(("memory", "memory.max", m.to_string()));
    }
    if let Some(p) = l.pids {
        files.push(("pids", "pids.max", p.to_string()));
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(&format!("metadata: {{name: p, uid: u}}\nspec:\n{yaml}")).expect("pod")
    }

    #[test]
    fn upstreams_conversions() {
        assert_eq!(milli_to_shares(0), 2);
        assert_eq!(milli_to_shares(1), 2);
        assert_eq!(milli_to_shares(100), 102);
        assert_eq!(milli_to_shares(1000), 1024);
        assert_eq!(milli_to_shares(i64::MAX), MAX_SHARES);
        assert_eq!(milli_to_quota(0), None);
        assert_eq!(milli_to_quota(5), Some(1000));
        assert_eq!(milli_to_quota(250), Some(25_000));
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 100);
        assert_eq!(shares_to_weight(512), 59);
        assert_eq!(shares_to_weight(102), 17);
        assert_eq!(shares_to_weight(MAX_SHARES), 10_000);
    }

    #[test]
    fn a_guaranteed_pod_gets_shares_quota_and_memory() {
        let p = pod(
            "  containers:\n  - {name: a, image: i, resources: {limits: {cpu: 500m, memory: 64Mi}}}\n  - {name: b, image: i, resources: {limits: {cpu: 250m, memory: 32Mi}}}\n",
        );
        let l = for_pod(&p, 0);
        assert_eq!(
            l,
            Limits {
                cpu_shares: Some(768),
                cpu_quota: Some(75_000),
                memory: Some(96 << 20),
                pids: None,
            }
        );
        assert_eq!(
            v1_files(&l),
            [
                ("cpu", "cpu.shares", "768".to_owned()),
                ("cpu", "cpu.cfs_period_us", "100000".to_owned()),
                ("cpu", "cpu.cfs_quota_us", "75000".to_owned()),
                ("memory", "memory.limit_in_bytes", "100663296".to_owned()),
            ]
        );
        assert_eq!(
            v2_files(&l),
            [
                ("cpu", "cpu.weight", "80".to_owned()),
                ("cpu", "cpu.max", "75000 100000".to_owned()),
                ("memory", "memory.max", "100663296".to_owned()),
            ]
        );
    }

    #[test]
    fn a_burstable_pod_is_limited_only_where_every_container_declares_a_limit() {
        let p = pod(
            "  initContainers:\n  - {name: init, image: i, resources: {requests: {cpu: '2'}, limits: {cpu: '2', memory: 16Mi}}}\n  containers:\n  - {name: a, image: i, resources: {requests: {cpu: 100m}, limits: {cpu: 500m, memory: 64Mi}}}\n  - {name: b, image: i, resources: {requests: {cpu: 200m}, limits: {cpu: 500m}}}\n",
        );
        let l = for_pod(&p, 1024);
        // Requests: max(300m, init 2) = 2 CPUs; limits: max(1 CPU, 2 CPUs).
        assert_eq!(l.cpu_shares, Some(2048));
        assert_eq!(l.cpu_quota, Some(200_000));
        assert_eq!(l.memory, None, "b declares no memory limit");
        assert_eq!(l.pids, Some(1024));
    }

    #[test]
    fn the_runtime_class_overhead_adds_to_requests_and_to_the_limits_the_pod_has() {
        let overhead = "  overhead: {cpu: 250m, memory: 120Mi}\n";
        let guaranteed = pod(&format!(
            "{overhead}  containers:\n  - {{name: a, image: i, resources: {{limits: {{cpu: 500m, memory: 64Mi}}}}}}\n"
        ));
        assert_eq!(
            for_pod(&guaranteed, 0),
            Limits {
                cpu_shares: Some(768),
                cpu_quota: Some(75_000),
                memory: Some(184 << 20),
                pids: None,
            }
        );
        // No memory limit: the overhead makes none; the CPU limit grows.
        let burstable = pod(&format!(
            "{overhead}  containers:\n  - {{name: a, image: i, resources: {{requests: {{cpu: 100m}}, limits: {{cpu: 500m}}}}}}\n"
        ));
        let l = for_pod(&burstable, 0);
        assert_eq!(
            (l.cpu_shares, l.cpu_quota, l.memory),
            (Some(358), Some(75_000), None)
        );
        assert_eq!(burstable_shares([&burstable]), 358);
    }

    #[test]
    fn a_pods_own_resources_replace_its_containers_totals() {
        // Pod limits only: the requests default to them, so the pod is
        // Guaranteed.
        let guaranteed = pod(
            "  resources: {limits: {cpu: '1', memory: 256Mi}}\n  containers:\n  - {name: a, image: i}\n",
        );
        assert_eq!(resources::qos(&guaranteed), Qos::Guaranteed);
        assert_eq!(
            for_pod(&guaranteed, 0),
            Limits {
                cpu_shares: Some(1024),
                cpu_quota: Some(100_000),
                memory: Some(256 << 20),
                pids: None,
            }
        );
        // A container's request (its limit) is the pod's default CPU
        // request instead: Burstable, limited by the pod's limits.
        let defaulted = pod(
            "  resources: {limits: {cpu: '1', memory: 256Mi}}\n  containers:\n  - {name: a, image: i}\n  - {name: b, image: i, resources: {limits: {cpu: 200m}}}\n",
        );
        assert_eq!(resources::qos(&defaulted), Qos::Burstable);
        assert_eq!(
            for_pod(&defaulted, 0),
            Limits {
                cpu_shares: Some(204),
                cpu_quota: Some(100_000),
                memory: Some(256 << 20),
                pids: None,
            }
        );
        // Pod requests below its limits: Burstable, and limited by the pod's
        // limits although no container declares one.
        let burstable = pod(
            "  resources: {requests: {cpu: 250m, memory: 64Mi}, limits: {cpu: 500m, memory: 128Mi}}\n  containers:\n  - {name: a, image: i}\n",
        );
        assert_eq!(resources::qos(&burstable), Qos::Burstable);
        let l = for_pod(&burstable, 0);
        assert_eq!(
            (l.cpu_shares, l.cpu_quota, l.memory),
            (Some(256), Some(50_000), Some(128 << 20))
        );
        // Pod requests only, and a container without limits: no limit.
        let requests_only = pod(
            "  resources: {requests: {memory: 64Mi}}\n  containers:\n  - {name: a, image: i, resources: {requests: {cpu: 100m}}}\n",
        );
        let l = for_pod(&requests_only, 0);
        assert_eq!(
            (l.cpu_shares, l.cpu_quota, l.memory),
            (Some(102), None, None),
            "the CPU request is the containers' (the pod sets none)"
        );
        assert_eq!(burstable_shares([&burstable, &requests_only]), 358);
    }

    #[test]
    fn a_best_effort_pod_gets_the_minimum_shares() {
        let p = pod("  containers:\n  - {name: a, image: i}\n");
        assert_eq!(
            for_pod(&p, -1),
            Limits {
                cpu_shares: Some(2),
                ..Limits::default()
            }
        );
    }

    #[test]
    fn the_burstable_tier_shares_sum_the_burstable_pods_requests() {
        let burstable =
            pod("  containers:\n  - {name: a, image: i, resources: {requests: {cpu: 300m}}}\n");
        let guaranteed = pod(
            "  containers:\n  - {name: a, image: i, resources: {limits: {cpu: '1', memory: 1Gi}}}\n",
        );
        let best = pod("  containers:\n  - {name: a, image: i}\n");
        assert_eq!(
            burstable_shares([&burstable, &burstable, &guaranteed, &best]),
            614
        );
        assert_eq!(burstable_shares([&best]), 2);
    }
}
