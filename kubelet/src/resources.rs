//! Resource values of containers and pods, and the QoS class they give a pod
//! (upstream's `qos.GetPodQOS` and `resource.PodRequests`). Pure.

use k8s_openapi::api::core::v1::{Container, Pod};

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

/// A container's CPU (millicores) and memory (bytes) in `list`; a value that
/// is absent or does not parse is `None`.
pub fn values(c: &Container, list: List) -> (Option<i64>, Option<i64>) {
    let list = c.resources.as_ref().and_then(|r| match list {
        List::Limits => r.limits.as_ref(),
        List::Requests => r.requests.as_ref(),
    });
    let cpu = list
        .and_then(|l| l.get("cpu"))
        .and_then(|q| quantity::parse_milli(&q.0).ok());
    let mem = list
        .and_then(|l| l.get("memory"))
        .and_then(|q| quantity::parse(&q.0).ok());
    (cpu, mem)
}

/// Upstream's QoS classification (requests default to limits).
pub fn qos(pod: &Pod) -> Qos {
    let Some(spec) = &pod.spec else {
        return Qos::BestEffort;
    };
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
/// them (upstream's `PodRequests` / `PodLimits`, overhead excluded).
pub fn pod_totals(pod: &Pod, list: List) -> (i64, i64) {
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
