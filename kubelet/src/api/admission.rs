//! Admission of API pods (upstream's `PredicateAdmitHandler`, resource part):
//! a pod is rejected if the node cannot hold it. Its status becomes phase
//! `Failed` with upstream's reason and message; it is never started.
//!
//! Static pods are not admitted here: upstream treats them as critical and
//! makes room for them instead of rejecting them.

use k8s_openapi::api::core::v1::{Node, Pod};

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU in millicores.
    pub cpu_milli: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Number of pods.
    pub pods: i64,
    /// The host ports they hold.
    pub ports: Vec<HostPort>,
}

impl Usage {
    /// The sum over `pods`.
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        let mut usage = Self::default();
        for p in pods {
            usage.add(p);
        }
        usage
    }

    fn add(&mut self, pod: &Pod) {
        let (cpu, mem) = requests(pod);
        self.ports.extend(host_ports(pod));
        self.cpu_milli = self.cpu_milli.saturating_add(cpu);
        self.memory = self.memory.saturating_add(mem);
        self.pods += 1;
    }
}

/// The pod's requests plus its `spec.overhead` (set from its RuntimeClass by
/// the API server), as upstream's resource fit counts them.
fn requests(pod: &Pod) -> (i64, i64) {
    crate::resources::pod_totals_with_overhead(pod, crate::resources::List::Requests)
}

/// Can evlet run `pod` as upstream would? A pod for another OS is rejected
/// as upstream rejects it (`PodOSNotSupported`); a pod using a field evlet
/// does not honour is rejected naming the field (`UnsupportedPodSpec`).
///
/// # Errors
/// The rejection, with every unsupported field in its message.
pub fn supported(pod: &Pod) -> Result<(), Rejection> {
    let Some(spec) = &pod.spec else {
        return Ok(());
    };
    if crate::validation::foreign_os(spec).is_some() {
        return Err(Rejection {
            reason: "PodOSNotSupported".into(),
            message: "Pod was rejected: Failed to admit pod as the OS field doesn't match node OS"
                .into(),
        });
    }
    if pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kubernetes.io/os"))
        .is_some_and(|os| os != "linux")
    {
        return Err(Rejection {
            reason: "PodOSSelectorNodeLabelDoesNotMatch".into(),
            message: "Pod was rejected: Failed to admit pod as the `kubernetes.io/os` label doesn't match node label".into(),
        });
    }
    let unsupported = crate::validation::unsupported(spec);
    if unsupported.is_empty() {
        return Ok(());
    }
    Err(Rejection {
        reason: "UnsupportedPodSpec".into(),
        message: format!(
            "Pod was rejected: {}",
            unsupported
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ),
    })
}

/// Can the node's runtime enforce what `pod` asks for? A pod asking for
/// `supplementalGroupsPolicy: Strict` on a runtime that does not report the
/// feature is rejected as upstream rejects it
/// (`SupplementalGroupsPolicyNotSupported`): containerd 1.6 and 1.7 would
/// merge the image's groups in silently.
///
/// # Errors
/// The rejection, naming the field.
pub fn runtime_supports(
    pod: &Pod,
    runtime: &crate::validation::RuntimeSupport,
) -> Result<(), Rejection> {
    let Some(spec) = &pod.spec else {
        return Ok(());
    };
    let refused = crate::validation::unsupported_by_runtime(spec, runtime);
    if refused.is_empty() {
        return Ok(());
    }
    Err(Rejection {
        reason: "SupplementalGroupsPolicyNotSupported".into(),
        message: format!(
            "Pod was rejected: {}",
            refused
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ),
    })
}

/// Does `pod` suit this node as the API server has it: its node selector and
/// required node affinity, host ports free, every `NoExecute` taint
/// tolerated? (Upstream's `generalFilter` beside the resource fit; static
/// pods skip the taints.)
///
/// # Errors
/// The first predicate that fails, with upstream's reason and message.
pub fn suits_node(pod: &Pod, node: &Node, used: &Usage) -> Result<(), Rejection> {
    let failed = |predicate: &str, why: &str| {
        Err(Rejection {
            reason: predicate.into(),
            message: format!("Pod was rejected: Predicate {predicate} failed: {why}"),
        })
    };
    let empty = std::collections::BTreeMap::new();
    let node_ref = crate::node_selector::NodeRef {
        name: node.metadata.name.as_deref().unwrap_or(""),
        labels: node.metadata.labels.as_ref().unwrap_or(&empty),
    };
    if !crate::node_selector::pod_matches(pod, node_ref) {
        return failed(
            "NodeAffinity",
            "node(s) didn't match Pod's node affinity/selector",
        );
    }
    if host_ports(pod)
        .iter()
        .any(|p| used.ports.iter().any(|u| u.conflicts(p)))
    {
        return failed(
            "NodePorts",
            "node(s) didn't have free ports for the requested pod ports",
        );
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    if !crate::pod::is_static(pod)
        && crate::node_selector::untolerated_no_execute(taints, tolerations).is_some()
    {
        return failed("TaintToleration", "node(s) had untolerated taint(s)");
    }
    Ok(())
}

/// A host port a pod asks for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostPort {
    /// `hostIP` ("0.0.0.0" when unset).
    pub ip: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// `hostPort`.
    pub port: i32,
}

impl HostPort {
    fn conflicts(&self, other: &Self) -> bool {
        let wildcard = |ip: &str| ip == "0.0.0.0" || ip == "::";
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || wildcard(&self.ip) || wildcard(&other.ip))
    }
}

/// The host ports of the pod's containers (init containers included).
fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| HostPort {
            ip: p
                .host_ip
                .clone()
                .filter(|ip| !ip.is_empty())
                .unwrap_or_else(|| "0.0.0.0".into()),
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            port: p.host_port.unwrap_or(0),
        })
        .collect()
}

/// Does `pod` fit next to the pods that use `used`? If it does, its requests
/// are added to `used`.
///
/// # Errors
/// The first resource that does not fit, in upstream's order: pods, cpu, memory.
pub fn admit(pod: &Pod, used: &mut Usage, node: &Allocatable) -> Result<(), Rejection> {
    let (used_cpu, used_mem, used_pods) = (used.cpu_milli, used.memory, used.pods);
    let (cpu, mem) = requests(pod);
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
    used.add(pod);
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn strict_supplemental_groups_need_a_runtime_that_enforces_them() {
        let pod: Pod = serde_yaml::from_str(
            "metadata: {name: p}\nspec:\n  securityContext: {supplementalGroupsPolicy: Strict}\n  containers: [{name: a, image: i}]\n",
        )
        .expect("pod");
        let lacking = crate::validation::RuntimeSupport::default();
        let r = runtime_supports(&pod, &lacking).expect_err("refused");
        assert_eq!(r.reason, "SupplementalGroupsPolicyNotSupported");
        assert!(
            r.message
                .contains("spec.securityContext.supplementalGroupsPolicy"),
            "{}",
            r.message
        );
        let enforcing = crate::validation::RuntimeSupport {
            supplemental_groups_policy: true,
        };
        assert!(runtime_supports(&pod, &enforcing).is_ok());
        let merge: Pod = serde_yaml::from_str(
            "metadata: {name: p}\nspec:\n  securityContext: {supplementalGroupsPolicy: Merge}\n  containers: [{name: a, image: i}]\n",
        )
        .expect("pod");
        assert!(runtime_supports(&merge, &lacking).is_ok());
    }

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
    fn unsupported_fields_and_other_oses_are_rejected_by_name() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i",
                "volumeDevices": [{"name": "v", "devicePath": "/dev/xvdb"}]}]}
        }))
        .expect("pod");
        let r = supported(&p).expect_err("rejected");
        assert_eq!(r.reason, "UnsupportedPodSpec");
        assert_eq!(
            r.message,
            "Pod was rejected: spec.containers[0].volumeDevices: Forbidden: evlet does not support raw block volumes"
        );
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"os": {"name": "windows"}, "containers": [{"name": "c", "image": "i"}]}
        }))
        .expect("pod");
        assert_eq!(
            supported(&p).expect_err("rejected").reason,
            "PodOSNotSupported"
        );
        assert_eq!(supported(&pod("1", "1Mi")), Ok(()));
    }

    #[test]
    fn runtime_class_overhead_counts_toward_the_fit() {
        let mut p = pod("500m", "256Mi");
        p.spec.as_mut().expect("spec").overhead = Some(
            [(
                "cpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("250m".into()),
            )]
            .into(),
        );
        let running = [pod("1500m", "1Mi")];
        let err = admit(&p, &mut Usage::of(&running), &NODE).expect_err("rejected");
        assert_eq!(err.reason, "OutOfcpu");
        assert!(
            err.message.contains("requested: 750, used: 1500"),
            "{}",
            err.message
        );
    }

    fn node(labels: serde_json::Value, taints: serde_json::Value) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": labels}, "spec": {"taints": taints}
        }))
        .expect("node")
    }

    #[test]
    fn selectors_host_ports_and_no_execute_taints_are_checked_against_the_node() {
        let n = node(
            serde_json::json!({"zone": "a"}),
            serde_json::json!([
                {"key": "maintenance", "effect": "NoExecute"},
                {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
            ]),
        );
        let with = |spec: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
                .expect("pod")
        };
        let tolerant = serde_json::json!([{"key": "maintenance", "operator": "Exists"}]);
        let ok = with(
            serde_json::json!({"containers": [{"name": "c", "image": "i",
            "ports": [{"containerPort": 80, "hostPort": 8080}]}],
            "nodeSelector": {"zone": "a"}, "tolerations": tolerant}),
        );
        assert_eq!(suits_node(&ok, &n, &Usage::default()), Ok(()));
        let err = suits_node(&ok, &n, &Usage::of([&ok])).expect_err("port taken");
        assert_eq!(err.reason, "NodePorts");
        assert_eq!(
            err.message,
            "Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
        );
        let elsewhere = with(
            serde_json::json!({"containers": [{"name": "c", "image": "i"}],
            "nodeSelector": {"zone": "b"}, "tolerations": tolerant}),
        );
        assert_eq!(
            suits_node(&elsewhere, &n, &Usage::default())
                .expect_err("affinity")
                .reason,
            "NodeAffinity"
        );
        let intolerant = with(serde_json::json!({"containers": [{"name": "c", "image": "i"}]}));
        assert_eq!(
            suits_node(&intolerant, &n, &Usage::default())
                .expect_err("taint")
                .reason,
            "TaintToleration"
        );
    }

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
        assert_eq!(crate::resources::pod_requests(&p).0, 1500);
    }
}
