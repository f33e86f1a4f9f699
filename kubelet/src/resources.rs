//! Resource values of containers and pods, and the QoS class they give a pod
//! (upstream's `qos.ComputePodQOS` and `resource.PodRequests`). Pure.
//!
//! A pod may set resources of its own (`spec.resources`, upstream's
//! PodLevelResources, on by default since 1.34): CPU and memory requests and
//! limits for the pod as a whole. Where it does, [`pod_level`] gives them
//! with upstream's defaulting applied, and they decide the pod's QoS class,
//! its totals, and the limits of its containers that set none.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::pod;
use crate::quantity;

/// A pod's Quality of Service class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    /// Every container has CPU and memory limits equal to its requests.
    Guaranteed,
    /// Some requests or limits.
    Burstable,
    /// No requests or limits at all.
    BestEffort,
}

impl Qos {
    /// The class name as in `status.qosClass`.
    pub fn as_str(self) -> &'static str {
        match self {
            Qos::Guaranteed => "Guaranteed",
            Qos::Burstable => "Burstable",
            Qos::BestEffort => "BestEffort",
        }
    }
}

/// Which list of a container's resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    /// `resources.requests`.
    Requests,
    /// `resources.limits`.
    Limits,
}

/// CPU (millicores) and memory (bytes); `None` where absent.
pub type Pair = (Option<i64>, Option<i64>);

/// The CPU and memory of a resource list; a value that does not parse is `None`.
fn of_list(list: Option<&BTreeMap<String, Quantity>>) -> Pair {
    let cpu = list
        .and_then(|l| l.get("cpu"))
        .and_then(|q| quantity::parse_milli(&q.0).ok());
    let mem = list
        .and_then(|l| l.get("memory"))
        .and_then(|q| quantity::parse(&q.0).ok());
    (cpu, mem)
}

/// A container's CPU (millicores) and memory (bytes) in `list`; a value that
/// is absent or does not parse is `None`.
pub fn values(c: &Container, list: List) -> Pair {
    of_list(c.resources.as_ref().and_then(|r| match list {
        List::Limits => r.limits.as_ref(),
        List::Requests => r.requests.as_ref(),
    }))
}

/// A pod's own CPU and memory requests and limits (`spec.resources`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodLevel {
    /// `spec.resources.requests`, defaulted as upstream.
    pub requests: Pair,
    /// `spec.resources.limits`, defaulted as upstream.
    pub limits: Pair,
}

/// The pod's own resources, if it sets any CPU or memory request or limit
/// (upstream's `IsPodLevelResourcesSet`; an empty `resources: {}` sets
/// none), with the API server's defaulting applied as upstream's
/// `SetDefaults_Pod` does (static pods get the same): with pod limits, a
/// missing pod request is the containers' aggregate request, else the pod
/// limit (`defaultPodRequests`); with pod requests and no pod limit, a pod
/// limit is the containers' aggregate limit where every container has one
/// (`defaultPodLimits`, the 1.36 fix).
pub fn pod_level(pod: &Pod) -> Option<PodLevel> {
    let res = pod.spec.as_ref()?.resources.as_ref()?;
    let (mut requests, mut limits) = (of_list(res.requests.as_ref()), of_list(res.limits.as_ref()));
    let set = |p: Pair| p.0.is_some() || p.1.is_some();
    if !set(requests) && !set(limits) {
        return None;
    }
    let aggregate_requests = pod_sum_present(pod, |c| {
        let (rc, rm) = values(c, List::Requests);
        let (lc, lm) = values(c, List::Limits);
        (rc.or(lc), rm.or(lm))
    });
    if res.limits.as_ref().is_some_and(|l| !l.is_empty()) {
        requests.0 = requests.0.or(aggregate_requests.0).or(limits.0);
        requests.1 = requests.1.or(aggregate_requests.1).or(limits.1);
    }
    if !set(limits) && set(requests) {
        let aggregate_limits = pod_sum_present(pod, |c| values(c, List::Limits));
        let all_have = |cpu: bool| {
            containers(pod).all(|c| {
                let (lc, lm) = values(c, List::Limits);
                if cpu { lc.is_some() } else { lm.is_some() }
            })
        };
        if all_have(true) {
            limits.0 = aggregate_limits.0;
        }
        if all_have(false) {
            limits.1 = aggregate_limits.1;
        }
    }
    Some(PodLevel { requests, limits })
}

/// Every init and app container of the pod.
fn containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
}

/// [`pod_sum`] of values some container has (`None` where none has one).
fn pod_sum_present(pod: &Pod, of: impl Fn(&Container) -> Pair) -> Pair {
    let present = containers(pod).fold((false, false), |(c, m), x| {
        let (xc, xm) = of(x);
        (c || xc.is_some(), m || xm.is_some())
    });
    let (cpu, mem) = pod_sum(pod, |c| {
        let (xc, xm) = of(c);
        (xc.unwrap_or(0), xm.unwrap_or(0))
    });
    (present.0.then_some(cpu), present.1.then_some(mem))
}

/// The limits container `c` of `pod` runs with: its own, and where it sets
/// none, the pod's own limit (upstream's `getCPULimit` / `getMemoryLimit`
/// with pod-level resources).
pub fn container_limits(pod: &Pod, c: &Container) -> Pair {
    let (cpu, mem) = values(c, List::Limits);
    let pod_limits = pod_level(pod).map_or((None, None), |p| p.limits);
    (
        cpu.filter(|v| *v != 0)
            .or(pod_limits.0.filter(|v| *v != 0))
            .or(cpu),
        mem.filter(|v| *v != 0)
            .or(pod_limits.1.filter(|v| *v != 0))
            .or(mem),
    )
}

/// Upstream's QoS classification (requests default to limits). A pod with
/// resources of its own is classed by them alone (upstream's `resourceQOS`
/// of `spec.resources`), its containers' are not looked at.
pub fn qos(pod: &Pod) -> Qos {
    let Some(spec) = &pod.spec else {
        return Qos::BestEffort;
    };
    if let Some(level) = pod_level(pod) {
        return pod_level_qos(&level);
    }
    let mut any = false;
    let mut guaranteed = true;
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let (lc, lm) = values(c, List::Limits);
        let (rc, rm) = values(c, List::Requests);
        let (rc, rm) = (rc.or(lc), rm.or(lm));
        any |= lc.is_some() || lm.is_some() || rc.is_some() || rm.is_some();
        guaranteed &= lc.is_some() && lm.is_some() && rc == lc && rm == lm;
    }
    match (any, guaranteed) {
        (false, _) => Qos::BestEffort,
        (true, true) => Qos::Guaranteed,
        (true, false) => Qos::Burstable,
    }
}

/// Upstream's `resourceQOS` of pod-level resources: Guaranteed when CPU and
/// memory are both requested and each request equals its limit, BestEffort
/// when neither is requested nor limited, Burstable otherwise.
fn pod_level_qos(level: &PodLevel) -> Qos {
    let pairs = [
        (level.requests.0.unwrap_or(0), level.limits.0.unwrap_or(0)),
        (level.requests.1.unwrap_or(0), level.limits.1.unwrap_or(0)),
    ];
    if pairs.iter().any(|(request, limit)| request != limit) {
        return Qos::Burstable;
    }
    match (pairs[0].0 == 0, pairs[1].0 == 0) {
        (true, true) => Qos::BestEffort,
        (false, false) => Qos::Guaranteed,
        _ => Qos::Burstable,
    }
}

/// A pod's effective requests (millicores, bytes): the larger of the app
/// containers plus sidecars, and any one init container (upstream's
/// `PodRequests` without overhead). Requests default to limits, as the API
/// server's (and the static pod sources') defaulting does.
pub fn pod_requests(pod: &Pod) -> (i64, i64) {
    pod_totals(pod, List::Requests)
}

/// A pod's `spec.overhead` (millicores, bytes): what its RuntimeClass costs
/// beyond its containers, set by the API server's admission from the class.
pub fn overhead(pod: &Pod) -> (i64, i64) {
    let overhead = pod.spec.as_ref().and_then(|s| s.overhead.as_ref());
    let of = |name: &str, parse: fn(&str) -> Result<i64, quantity::InvalidQuantity>| {
        overhead
            .and_then(|o| o.get(name))
            .and_then(|q| parse(&q.0).ok())
            .unwrap_or(0)
    };
    (
        of("cpu", quantity::parse_milli),
        of("memory", quantity::parse),
    )
}

/// A pod's requests or limits with its [`overhead`] (upstream's
/// `PodRequests` / `PodLimits` with the overhead included): requests carry
/// the whole overhead, limits only where the pod has a limit (upstream adds
/// it "to non-zero limits").
pub fn pod_totals_with_overhead(pod: &Pod, list: List) -> (i64, i64) {
    let (cpu, mem) = pod_totals(pod, list);
    let (oc, om) = overhead(pod);
    let add = |v: i64, o: i64| {
        if list == List::Requests || v != 0 {
            v.saturating_add(o)
        } else {
            v
        }
    };
    (add(cpu, oc), add(mem, om))
}

/// A pod's requests or limits (millicores, bytes) as [`pod_requests`] counts
/// them (upstream's `PodRequests` / `PodLimits`, overhead excluded): a
/// resource the pod itself sets (non-zero) is the pod's, any other its
/// containers' aggregate.
pub fn pod_totals(pod: &Pod, list: List) -> (i64, i64) {
    let (cpu, mem) = containers_total(pod, list);
    let Some(level) = pod_level(pod) else {
        return (cpu, mem);
    };
    let (pc, pm) = match list {
        List::Requests => level.requests,
        List::Limits => level.limits,
    };
    (
        pc.filter(|v| *v != 0).unwrap_or(cpu),
        pm.filter(|v| *v != 0).unwrap_or(mem),
    )
}

/// The memory request the eviction manager ranks a pod by (upstream's
/// `GetResourceRequestQuantity`): the pod's own when it sets resources of
/// its own (0 if those have no memory request; its containers are not
/// looked at), else its containers'; with the overhead when non-zero.
pub fn memory_request_for_eviction(pod: &Pod) -> i64 {
    let request = match pod_level(pod) {
        Some(level) => level.requests.1.unwrap_or(0),
        None => containers_total(pod, List::Requests).1,
    };
    if request == 0 {
        0
    } else {
        request.saturating_add(overhead(pod).1)
    }
}

/// What of the pod's own memory request its containers do not request,
/// shared evenly among all of them, init containers included (upstream's
/// `remainingPodMemReqPerContainer`, for `oom_score_adj`); 0 when the pod
/// requests no memory itself.
pub fn remaining_memory_request_per_container(pod: &Pod) -> i64 {
    let Some(request) = pod_level(pod)
        .and_then(|p| p.requests.1)
        .filter(|r| *r != 0)
    else {
        return 0;
    };
    let n = containers(pod).count().max(1);
    request.saturating_sub(containers_total(pod, List::Requests).1)
        / i64::try_from(n).unwrap_or(i64::MAX)
}

/// The containers' aggregate requests or limits (upstream's
/// `AggregateContainerRequests` / `AggregateContainerLimits`).
fn containers_total(pod: &Pod, list: List) -> (i64, i64) {
    pod_sum(pod, |c| {
        let (cpu, mem) = values(c, list);
        if list == List::Requests {
            let (lc, lm) = values(c, List::Limits);
            (cpu.or(lc).unwrap_or(0), mem.or(lm).unwrap_or(0))
        } else {
            (cpu.unwrap_or(0), mem.unwrap_or(0))
        }
    })
}

/// Upstream's rule for a pod's amount of a resource from its containers'
/// (`of`, two resources at once): the app containers and sidecars summed, or
/// the largest init container with the sidecars before it, whichever is larger.
pub fn pod_sum(pod: &Pod, of: impl Fn(&Container) -> (i64, i64)) -> (i64, i64) {
    let Some(spec) = pod.spec.as_ref() else {
        return (0, 0);
    };
    let (mut cpu, mut mem) = (0_i64, 0_i64);
    let (mut init_cpu, mut init_mem) = (0_i64, 0_i64);
    let (mut sidecar_cpu, mut sidecar_mem) = (0_i64, 0_i64);
    for c in spec.init_containers.iter().flatten() {
        let (c_cpu, c_mem) = of(c);
        if pod::is_restartable_init(c) {
            sidecar_cpu = sidecar_cpu.saturating_add(c_cpu);
            sidecar_mem = sidecar_mem.saturating_add(c_mem);
        } else {
            init_cpu = init_cpu.max(sidecar_cpu.saturating_add(c_cpu));
            init_mem = init_mem.max(sidecar_mem.saturating_add(c_mem));
        }
    }
    for c in &spec.containers {
        let (c_cpu, c_mem) = of(c);
        cpu = cpu.saturating_add(c_cpu);
        mem = mem.saturating_add(c_mem);
    }
    (
        cpu.saturating_add(sidecar_cpu).max(init_cpu),
        mem.saturating_add(sidecar_mem).max(init_mem),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(resources: &str, containers: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "metadata: {{name: p}}\nspec:\n  resources: {resources}\n  containers:\n{containers}"
        ))
        .expect("pod")
    }

    const PLAIN: &str = "  - {name: a, image: i}\n";

    #[test]
    fn empty_pod_level_resources_set_nothing() {
        let p = pod(
            "{}",
            "  - {name: a, image: i, resources: {limits: {cpu: 1, memory: 1Gi}}}\n",
        );
        assert_eq!(pod_level(&p), None);
        assert_eq!(qos(&p), Qos::Guaranteed, "the container decides");
    }

    #[test]
    fn pod_requests_default_to_the_containers_then_to_the_pod_limits() {
        let p = pod(
            "{limits: {cpu: '2', memory: 1Gi}}",
            "  - {name: a, image: i, resources: {requests: {cpu: 100m}}}\n  - {name: b, image: i, resources: {limits: {cpu: 200m}}}\n",
        );
        let level = pod_level(&p).expect("set");
        assert_eq!(level.requests, (Some(300), Some(1 << 30)));
        assert_eq!(qos(&p), Qos::Burstable);
        assert_eq!(pod_totals(&p, List::Requests), (300, 1 << 30));
        assert_eq!(pod_totals(&p, List::Limits), (2000, 1 << 30));
    }

    #[test]
    fn pod_limits_default_to_the_containers_only_where_every_one_has_one() {
        let p = pod(
            "{requests: {cpu: 500m, memory: 256Mi}}",
            "  - {name: a, image: i, resources: {limits: {cpu: 200m, memory: 64Mi}}}\n  - {name: b, image: i, resources: {limits: {cpu: 300m}}}\n",
        );
        let level = pod_level(&p).expect("set");
        assert_eq!(level.limits, (Some(500), None));
        assert_eq!(qos(&p), Qos::Burstable);
        // With any pod limit set, nothing is defaulted from the containers.
        let p = pod(
            "{requests: {cpu: 500m}, limits: {memory: 1Gi}}",
            "  - {name: a, image: i, resources: {limits: {cpu: 1}}}\n",
        );
        assert_eq!(pod_level(&p).expect("set").limits, (None, Some(1 << 30)));
    }

    #[test]
    fn pod_level_qos_looks_at_the_pod_alone() {
        assert_eq!(
            qos(&pod("{limits: {cpu: 1, memory: 1Gi}}", PLAIN)),
            Qos::Guaranteed
        );
        assert_eq!(qos(&pod("{requests: {cpu: 1}}", PLAIN)), Qos::Burstable);
        // Only CPU at pod level: memory counts as 0/0, so Burstable, whatever
        // the containers say.
        assert_eq!(
            qos(&pod(
                "{limits: {cpu: 1}}",
                "  - {name: a, image: i, resources: {limits: {memory: 1Gi}}}\n"
            )),
            Qos::Burstable
        );
    }

    #[test]
    fn eviction_ranks_by_the_pods_own_memory_request_alone() {
        let p = pod(
            "{requests: {cpu: 1}}",
            "  - {name: a, image: i, resources: {requests: {memory: 1Gi}}}\n",
        );
        assert_eq!(
            memory_request_for_eviction(&p),
            0,
            "no pod-level memory request"
        );
        let p = pod(
            "{requests: {memory: 2Gi}}",
            "  - {name: a, image: i, resources: {requests: {memory: 1Gi}}}\n",
        );
        assert_eq!(memory_request_for_eviction(&p), 2 << 30);
        assert_eq!(remaining_memory_request_per_container(&p), 1 << 30);
    }
}
