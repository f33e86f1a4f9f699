//! Admission of API pods (upstream's `PredicateAdmitHandler`, resource part):
//! a pod is rejected if the node cannot hold it. Its status becomes phase
//! `Failed` with upstream's reason and message; it is never started.
//!
//! Static pods are not admitted here: upstream treats them as critical and
//! makes room for them instead of rejecting them.

use k8s_openapi::api::core::v1::Pod;

use crate::resources::pod_requests;

/// What the node can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocatable {
    /// CPU in millicores.
    pub cpu_milli: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// `maxPods`.
    pub pods: i64,
}

/// Why a pod was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// `OutOfcpu`, `OutOfmemory`, `OutOfpods`.
    pub reason: String,
    /// Upstream's message.
    pub message: String,
}

/// What the admitted, not terminated pods request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU in millicores.
    pub cpu_milli: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Number of pods.
    pub pods: i64,
}

impl Usage {
    /// The sum over `pods`.
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        let mut usage = Self::default();
        for p in pods {
            usage.add(pod_requests(p));
        }
        usage
    }

    fn add(&mut self, (cpu, mem): (i64, i64)) {
        self.cpu_milli = self.cpu_milli.saturating_add(cpu);
        self.memory = self.memory.saturating_add(mem);
        self.pods += 1;
    }
}

/// Does `pod` fit next to the pods that use `used`? If it does, its requests
/// are added to `used`.
///
/// # Errors
/// The first resource that does not fit, in upstream's order: pods, cpu, memory.
pub fn admit(pod: &Pod, used: &mut Usage, node: &Allocatable) -> Result<(), Rejection> {
    let (used_cpu, used_mem, used_pods) = (used.cpu_milli, used.memory, used.pods);
    let (cpu, mem) = pod_requests(pod);
    let reject = |resource: &str, reason: &str, requested: i64, used: i64, capacity: i64| {
        Err(Rejection {
            reason: reason.into(),
            message: format!(
                "Pod was rejected: Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
            ),
        })
    };
    if used_pods + 1 > node.pods {
        return reject("pods", "OutOfpods", 1, used_pods, node.pods);
    }
    if cpu > 0 && used_cpu.saturating_add(cpu) > node.cpu_milli {
        return reject("cpu", "OutOfcpu", cpu, used_cpu, node.cpu_milli);
    }
    if mem > 0 && used_mem.saturating_add(mem) > node.memory {
        return reject("memory", "OutOfmemory", mem, used_mem, node.memory);
    }
    used.add((cpu, mem));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu: &str, mem: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": cpu, "memory": mem}}}]}
        }))
        .expect("pod")
    }

    const NODE: Allocatable = Allocatable {
        cpu_milli: 2000,
        memory: 1 << 30,
        pods: 3,
    };

    #[test]
    fn pods_that_fit_are_admitted() {
        let running = [pod("500m", "256Mi"), pod("1", "256Mi")];
        assert_eq!(
            admit(&pod("500m", "512Mi"), &mut Usage::of(&running), &NODE),
            Ok(())
        );
    }

    #[test]
    fn too_much_cpu_is_out_of_cpu_with_upstreams_message() {
        let running = [pod("1500m", "1Mi")];
        let err = admit(&pod("1", "1Mi"), &mut Usage::of(&running), &NODE).expect_err("rejected");
        assert_eq!(err.reason, "OutOfcpu");
        assert_eq!(
            err.message,
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 1000, used: 1500, capacity: 2000"
        );
    }

    #[test]
    fn too_much_memory_and_too_many_pods_are_rejected() {
        let err = admit(&pod("1m", "2Gi"), &mut Usage::default(), &NODE).expect_err("rejected");
        assert_eq!(err.reason, "OutOfmemory");
        let three = [pod("1m", "1Mi"), pod("1m", "1Mi"), pod("1m", "1Mi")];
        let err = admit(&pod("1m", "1Mi"), &mut Usage::of(&three), &NODE).expect_err("rejected");
        assert_eq!(err.reason, "OutOfpods");
    }

    #[test]
    fn init_containers_count_by_their_largest_and_sidecars_add_up() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [
                    {"name": "i1", "image": "i", "resources": {"requests": {"cpu": "1500m"}}},
                    {"name": "side", "image": "i", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "200m"}}}
                ],
                "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "300m"}}}]
            }
        }))
        .expect("pod");
        assert_eq!(pod_requests(&p).0, 1500);
    }
}
