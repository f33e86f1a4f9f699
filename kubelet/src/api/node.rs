//! The Node object: registration (create, or adopt an existing one), its status
//! every 10 s (patched on change or every 5 min, like upstream with leases on),
//! and the Lease heartbeat `kube-node-lease/<node>` (40 s, renewed every 10 s).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

use super::{is_conflict, is_not_found};
use crate::backoff::Retry;
use crate::health::NotReady;
use crate::machine::Machine;

/// Upstream's `nodeStatusUpdateFrequency`.
pub const STATUS_UPDATE: Duration = Duration::from_secs(10);
/// Upstream's `nodeStatusReportFrequency`: an unchanged status is still sent this often.
pub const STATUS_REPORT: Duration = Duration::from_secs(300);
/// Upstream's `nodeLeaseDurationSeconds`.
pub const LEASE_DURATION_SECONDS: i32 = 40;
/// Upstream renews at a quarter of the duration.
pub const LEASE_RENEW: Duration = Duration::from_secs(10);
/// Namespace of node leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// Is the node ready? `Err` carries the reason (runtime down, PLEG unhealthy).
pub type Readiness = Arc<dyn Fn() -> Result<(), NotReady> + Send + Sync>;

/// What the node reports about itself.
#[derive(Clone)]
pub struct NodeInput {
    /// The node's name.
    pub name: String,
    /// `--node-ip`.
    pub node_ip: Option<String>,
    /// The machine's hostname.
    pub hostname: String,
    /// `maxPods`.
    pub max_pods: u32,
    /// `--register-with-taints`.
    pub taints: Vec<Taint>,
    /// `--node-labels` (beside the defaults, which win).
    pub labels: BTreeMap<String, String>,
    /// The root directory (its filesystem is `ephemeral-storage`).
    pub root_dir: PathBuf,
    /// `containerd://1.7.24`.
    pub runtime_version: String,
    /// What the runtime enforces (`status.features`).
    pub runtime_support: crate::validation::RuntimeSupport,
    /// The HTTP endpoint's port (`daemonEndpoints.kubeletEndpoint`).
    pub port: u16,
    /// Readiness of the runtime and the PLEG.
    pub ready: Readiness,
    /// The eviction manager's pressure conditions.
    pub pressure: tokio::sync::watch::Receiver<crate::eviction::Pressure>,
    /// What allocatable subtracts from capacity: reservations and the hard
    /// eviction thresholds.
    pub reserved: Reserved,
}

/// What the node's allocatable subtracts from its capacity.
#[derive(Debug, Clone, Default)]
pub struct Reserved {
    /// `kubeReserved`, `systemReserved`.
    pub reservations: crate::cm::allocatable::Reservations,
    /// The hard `memory.available` and `nodefs.available` thresholds.
    pub eviction: crate::eviction::Settings,
}

impl std::fmt::Debug for NodeInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeInput")
            .field("name", &self.name)
            .field("max_pods", &self.max_pods)
            .finish_non_exhaustive()
    }
}

fn os_image() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| "Linux".into())
}

fn kernel_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn machine_id() -> String {
    std::fs::read_to_string("/etc/machine-id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// `allocatable`: capacity minus `kubeReserved`, `systemReserved` and the hard
/// eviction thresholds (upstream's), in the capacity's units.
pub fn allocatable(
    machine: &Machine,
    max_pods: u32,
    reserved: &Reserved,
) -> BTreeMap<String, Quantity> {
    let a = reserved.reservations.allocatable(
        crate::cm::allocatable::Resources::of(machine),
        &reserved.eviction,
    );
    let cpu = if a.cpu_milli % 1000 == 0 {
        (a.cpu_milli / 1000).to_string()
    } else {
        format!("{}m", a.cpu_milli)
    };
    [
        ("cpu", cpu),
        ("memory", format!("{}Ki", a.memory / 1024)),
        (
            "ephemeral-storage",
            format!("{}Ki", a.ephemeral_storage / 1024),
        ),
        ("pods", max_pods.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), Quantity(v)))
    .collect()
}

/// `capacity`.
pub fn capacity(machine: &Machine, max_pods: u32) -> BTreeMap<String, Quantity> {
    [
        ("cpu", machine.cpus.to_string()),
        ("memory", format!("{}Ki", machine.memory / 1024)),
        ("ephemeral-storage", format!("{}Ki", machine.disk / 1024)),
        ("pods", max_pods.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), Quantity(v)))
    .collect()
}

/// The node's labels (upstream's defaults).
pub fn labels(name: &str) -> BTreeMap<String, String> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    [
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", arch),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", arch),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The defaults with `--node-labels` under them (a default is never overridden).
fn all_labels(input: &NodeInput) -> BTreeMap<String, String> {
    let mut all = input.labels.clone();
    all.extend(labels(&input.name));
    all
}

/// The Node object registration creates.
pub fn initial(input: &NodeInput, machine: &Machine) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(input.name.clone()),
            labels: Some(all_labels(input)),
            annotations: Some(
                [(
                    "volumes.kubernetes.io/controller-managed-attach-detach".to_owned(),
                    "true".to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!input.taints.is_empty()).then(|| input.taints.clone()),
            ..Default::default()
        }),
        status: Some(status(input, machine, None)),
    }
}

fn condition(
    kind: &str,
    ok_is_true: bool,
    bad: Option<String>,
    good_reason: &str,
    bad_reason: &str,
    good_message: &str,
    previous: Option<&NodeCondition>,
) -> NodeCondition {
    let healthy = bad.is_none();
    let status = if healthy == ok_is_true {
        "True"
    } else {
        "False"
    };
    let now = crate::clock::now();
    let transition = previous
        .filter(|p| p.status == status)
        .and_then(|p| p.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeCondition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        reason: Some(if healthy { good_reason } else { bad_reason }.to_owned()),
        message: Some(bad.unwrap_or_else(|| good_message.to_owned())),
        last_heartbeat_time: Some(now),
        last_transition_time: Some(transition),
    }
}

/// The node status now; `previous` keeps the conditions' transition times.
pub fn status(input: &NodeInput, machine: &Machine, previous: Option<&NodeStatus>) -> NodeStatus {
    let prev = |t: &str| {
        previous
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == t))
    };
    // The eviction manager's conditions, with upstream's messages.
    let pressure = *input.pressure.borrow();
    let memory = pressure
        .memory
        .then(|| "kubelet has insufficient memory available".to_owned());
    let disk = pressure
        .disk
        .then(|| "kubelet has disk pressure".to_owned());
    let pids = pressure
        .pid
        .then(|| "kubelet has insufficient PID available".to_owned());
    let ready = (input.ready)().err().map(|e| e.to_string());
    let conditions = vec![
        condition(
            "MemoryPressure",
            false,
            memory,
            "KubeletHasSufficientMemory",
            "KubeletHasInsufficientMemory",
            "kubelet has sufficient memory available",
            prev("MemoryPressure"),
        ),
        condition(
            "DiskPressure",
            false,
            disk,
            "KubeletHasNoDiskPressure",
            "KubeletHasDiskPressure",
            "kubelet has no disk pressure",
            prev("DiskPressure"),
        ),
        condition(
            "PIDPressure",
            false,
            pids,
            "KubeletHasSufficientPID",
            "KubeletHasInsufficientPID",
            "kubelet has sufficient PID available",
            prev("PIDPressure"),
        ),
        condition(
            "Ready",
            true,
            ready,
            "KubeletReady",
            "KubeletNotReady",
            "kubelet is posting ready status",
            prev("Ready"),
        ),
    ];
    let mut addresses = Vec::new();
    if let Some(ip) = &input.node_ip {
        addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: ip.clone(),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: input.hostname.clone(),
    });
    let capacity = capacity(machine, input.max_pods);
    NodeStatus {
        allocatable: Some(allocatable(machine, input.max_pods, &input.reserved)),
        capacity: Some(capacity),
        conditions: Some(conditions),
        addresses: Some(addresses),
        daemon_endpoints: Some(k8s_openapi::api::core::v1::NodeDaemonEndpoints {
            kubelet_endpoint: Some(k8s_openapi::api::core::v1::DaemonEndpoint {
                port: i32::from(input.port),
            }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH
                .replace("x86_64", "amd64")
                .replace("aarch64", "arm64"),
            boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|s| s.trim().to_owned())
                .unwrap_or_default(),
            container_runtime_version: input.runtime_version.clone(),
            kernel_version: kernel_version(),
            kube_proxy_version: String::new(),
            kubelet_version: format!("v1.34.0-evlet.{}", env!("CARGO_PKG_VERSION")),
            machine_id: machine_id(),
            operating_system: "linux".into(),
            os_image: os_image(),
            system_uuid: std::fs::read_to_string("/sys/class/dmi/id/product_uuid")
                .map(|s| s.trim().to_owned())
                .unwrap_or_default(),
            ..Default::default()
        }),
        // Upstream reports what the runtime enforces; the scheduler and the
        // API server's pod admission read it.
        features: Some(k8s_openapi::api::core::v1::NodeFeatures {
            supplemental_groups_policy: Some(input.runtime_support.supplemental_groups_policy),
        }),
        ..Default::default()
    }
}

/// The status with heartbeat times removed: what "changed" is judged on.
fn comparable(status: &NodeStatus) -> serde_json::Value {
    let mut s = status.clone();
    for c in s.conditions.iter_mut().flatten() {
        c.last_heartbeat_time = None;
    }
    serde_json::to_value(s).unwrap_or_default()
}

/// Whether a condition of `new` differs, heartbeat aside, from the one in
/// `held` (or `held` lacks it).
fn conditions_differ(held: &NodeStatus, new: &NodeStatus) -> bool {
    let held = held.conditions.as_deref().unwrap_or_default();
    new.conditions.iter().flatten().any(|c| {
        held.iter().find(|h| h.type_ == c.type_).is_none_or(|h| {
            h.status != c.status
                || h.reason != c.reason
                || h.message != c.message
                || h.last_transition_time != c.last_transition_time
        })
    })
}

/// Registers the node: POST, and on AlreadyExists adopt the existing object
/// (GET, then patch its labels and status). Retries with backoff (100 ms to 7 s)
/// until it succeeds or `shutdown`; returns the registered Node.
pub async fn register(
    client: &kube::Client,
    input: &NodeInput,
    shutdown: &CancellationToken,
) -> Option<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut backoff = Retry::new(Duration::from_millis(100), Duration::from_secs(7));
    loop {
        let machine = Machine::read(&input.root_dir);
        let node = initial(input, &machine);
        let result = match nodes.create(&PostParams::default(), &node).await {
            Ok(created) => {
                tracing::info!(node = %input.name, "registered the node with the API server");
                Ok(created)
            }
            Err(e) if is_conflict(&e) => adopt(&nodes, input, &node).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(node) => return Some(node),
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(node = %input.name, error = %e, retry_in = ?delay, "node registration failed");
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Adopts an existing Node: keeps its spec, sets evlet's default labels and the
/// current status in one strategic-merge patch of `nodes/<name>/status`.
async fn adopt(nodes: &Api<Node>, input: &NodeInput, wanted: &Node) -> Result<Node, kube::Error> {
    let existing = nodes.get(&input.name).await?;
    tracing::info!(node = %input.name, "node already exists; adopting it");
    let mut labels = existing.metadata.labels.clone().unwrap_or_default();
    labels.extend(labels_of(wanted));
    let patch = serde_json::json!({
        "metadata": {"labels": labels},
        "status": wanted.status,
    });
    nodes
        .patch_status(
            &input.name,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
}

fn labels_of(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

/// Sends the node status every [`STATUS_UPDATE`]: a strategic-merge patch of
/// `nodes/<name>/status` when it changed (heartbeats aside) or every [`STATUS_REPORT`].
/// "Changed" is judged against what was last sent and against the Node the
/// API server holds (`held`, the agent's watch of its own Node), as upstream
/// compares with the Node it fetched: a condition another writer changed
/// (the node lifecycle controller's `Unknown` after missed Lease renewals) is
/// put right at the next tick, not at the next 5-minute report.
/// Before each, brings the Node's pressure taints in line ([`pressure_taints`])
/// until the API server refuses that with 403 (`NodeRestriction` forbids a
/// node to modify its own taints); then never again.
pub async fn run_status(
    client: kube::Client,
    input: NodeInput,
    registered: Node,
    held: SelfWatch,
    shutdown: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut last_sent = registered.status.clone();
    let mut last_report = tokio::time::Instant::now();
    let mut backoff = Retry::new(Duration::from_millis(200), Duration::from_secs(7));
    let mut delay = STATUS_UPDATE;
    let mut pressure = input.pressure.clone();
    // The pressure the Node's taints were last brought in line with (None:
    // not yet, or the last try failed).
    let mut tainted_for = None;
    // Set once the API server refused the taints (`NodeRestriction` forbids
    // a node to modify its own): its node lifecycle controller sets them.
    let mut taints_forbidden = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
            // A pressure condition changed: report it now, not at the next tick.
            Ok(()) = pressure.changed() => {}
        }
        let now = *pressure.borrow();
        if tainted_for != Some(now) && !taints_forbidden {
            match reconcile_pressure_taints(&nodes, &input.name, now).await {
                Ok(()) => tainted_for = Some(now),
                Err(kube::Error::Api(status)) if status.code == 403 => {
                    taints_forbidden = true;
                    tracing::info!(node = %input.name, reason = %status.message, "the API server does not let this node set its pressure taints (NodeRestriction); leaving them to the node lifecycle controller");
                }
                Err(e) => {
                    tainted_for = None;
                    tracing::warn!(node = %input.name, error = %e, "updating the node's pressure taints failed");
                }
            }
        }
        let machine = Machine::read(&input.root_dir);
        let api_status = held.current().and_then(|n| n.status.clone());
        let new = status(&input, &machine, api_status.as_ref().or(last_sent.as_ref()));
        let changed = last_sent.as_ref().map(comparable) != Some(comparable(&new))
            || api_status.is_some_and(|h| conditions_differ(&h, &new));
        if !changed && last_report.elapsed() < STATUS_REPORT {
            delay = STATUS_UPDATE;
            continue;
        }
        let patch = serde_json::json!({ "status": new });
        match nodes
            .patch_status(
                &input.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => {
                if changed {
                    tracing::debug!(node = %input.name, "node status changed; patched");
                }
                last_sent = Some(new);
                last_report = tokio::time::Instant::now();
                backoff.reset();
                delay = STATUS_UPDATE;
            }
            Err(e) => {
                delay = backoff.next_delay().min(STATUS_UPDATE);
                tracing::warn!(node = %input.name, error = %e, retry_in = ?delay, "updating node status failed");
            }
        }
    }
}

/// The `NoSchedule` taint of each pressure condition (the keys of the node
/// lifecycle controller's `TaintNodesByCondition`).
pub const PRESSURE_TAINTS: [&str; 3] = [
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/pid-pressure",
];

/// The node's taints with the pressure taints matching `pressure`; None when
/// `existing` already matches. Other taints stay as they are.
pub fn pressure_taints(
    existing: &[Taint],
    pressure: crate::eviction::Pressure,
) -> Option<Vec<Taint>> {
    let wanted = [pressure.memory, pressure.disk, pressure.pid];
    let has = |key: &str| {
        existing
            .iter()
            .any(|t| t.key == key && t.effect == "NoSchedule")
    };
    if PRESSURE_TAINTS
        .iter()
        .zip(wanted)
        .all(|(key, on)| has(key) == on)
    {
        return None;
    }
    let mut taints: Vec<Taint> = existing
        .iter()
        .filter(|t| !(PRESSURE_TAINTS.contains(&t.key.as_str()) && t.effect == "NoSchedule"))
        .cloned()
        .collect();
    for (key, on) in PRESSURE_TAINTS.iter().zip(wanted) {
        if on {
            taints.push(Taint {
                key: (*key).to_owned(),
                effect: "NoSchedule".into(),
                ..Default::default()
            });
        }
    }
    Some(taints)
}

/// Brings the Node's pressure taints in line with `pressure`: a merge patch
/// of `spec.taints` guarded by the resourceVersion read (a conflict is tried
/// again at the next status update).
async fn reconcile_pressure_taints(
    nodes: &Api<Node>,
    name: &str,
    pressure: crate::eviction::Pressure,
) -> Result<(), kube::Error> {
    let node = nodes.get(name).await?;
    let existing = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let Some(taints) = pressure_taints(&existing, pressure) else {
        return Ok(());
    };
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": taints},
    });
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    tracing::info!(node = %name, ?pressure, "node pressure taints updated");
    Ok(())
}

/// This node's Node object as the API server has it (its labels and taints
/// as an administrator left them), watched for admission.
#[derive(Clone)]
pub struct SelfWatch {
    store: kube::runtime::reflector::Store<Node>,
}

impl std::fmt::Debug for SelfWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelfWatch").finish_non_exhaustive()
    }
}

impl SelfWatch {
    /// Starts watching the Node `name`; the watch stops at `shutdown`.
    pub fn start(client: kube::Client, name: &str, shutdown: CancellationToken) -> Self {
        use futures_util::StreamExt as _;
        use kube::runtime::{WatchStreamExt as _, reflector, watcher};
        let (store, writer) = reflector::store();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher::watcher(Api::<Node>::all(client), config)
            .default_backoff()
            .reflect(writer)
            .applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    next = stream.next() => match next {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => tracing::debug!(error = %e, "node watch failed; retrying"),
                        None => return,
                    },
                }
            }
        });
        Self { store }
    }

    /// Resolves once the watch has stored its first list (the node
    /// informer's `HasSynced`: the Node, or that there is none yet); never
    /// if the watch stops before.
    pub async fn synced(&self) {
        if self.store.wait_until_ready().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// The Node as last seen, if it has been seen.
    pub fn current(&self) -> Option<Arc<Node>> {
        self.store.state().into_iter().next()
    }
}

fn lease_for(name: &str, node_uid: Option<&str>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(LEASE_NAMESPACE.to_owned()),
            owner_references: node_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: name.to_owned(),
                    uid: uid.to_owned(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_owned()),
            lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
            renew_time: Some(MicroTime(crate::clock::now().0)),
            ..Default::default()
        }),
    }
}

/// Keeps `kube-node-lease/<node>` renewed: GET (CREATE if absent) once, then a
/// PUT with a fresh `renewTime` every [`LEASE_RENEW`]. A failed or conflicting
/// update drops the cached lease and retries with backoff (200 ms to 7 s).
pub async fn run_lease(
    client: kube::Client,
    name: String,
    node_uid: Option<String>,
    shutdown: CancellationToken,
) {
    let leases: Api<Lease> = Api::namespaced(client, LEASE_NAMESPACE);
    let mut current: Option<Lease> = None;
    let mut backoff = Retry::new(Duration::from_millis(200), Duration::from_secs(7));
    loop {
        let result = match current.take() {
            None => match leases.get(&name).await {
                Ok(lease) => renew(&leases, &name, lease).await,
                Err(e) if is_not_found(&e) => {
                    leases
                        .create(
                            &PostParams::default(),
                            &lease_for(&name, node_uid.as_deref()),
                        )
                        .await
                }
                Err(e) => Err(e),
            },
            Some(lease) => renew(&leases, &name, lease).await,
        };
        let delay = match result {
            Ok(lease) => {
                current = Some(lease);
                backoff.reset();
                LEASE_RENEW
            }
            Err(e) => {
                let d = backoff.next_delay();
                tracing::warn!(node = %name, error = %e, conflict = is_conflict(&e), retry_in = ?d, "renewing the node lease failed");
                d
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

async fn renew(leases: &Api<Lease>, name: &str, mut lease: Lease) -> Result<Lease, kube::Error> {
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some(name.to_owned());
    spec.lease_duration_seconds = Some(LEASE_DURATION_SECONDS);
    spec.renew_time = Some(MicroTime(crate::clock::now().0));
    leases.replace(name, &PostParams::default(), &lease).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_taints_follow_the_conditions_and_leave_others_alone() {
        use crate::eviction::Pressure;
        let admin = Taint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        assert_eq!(
            pressure_taints(std::slice::from_ref(&admin), Pressure::default()),
            None
        );
        let memory = Pressure {
            memory: true,
            ..Pressure::default()
        };
        let tainted = pressure_taints(std::slice::from_ref(&admin), memory).expect("changed");
        assert_eq!(tainted.len(), 2);
        assert_eq!(tainted[0], admin);
        assert_eq!(tainted[1].key, "node.kubernetes.io/memory-pressure");
        assert_eq!(tainted[1].effect, "NoSchedule");
        assert_eq!(pressure_taints(&tainted, memory), None, "already in line");
        let disk = Pressure {
            disk: true,
            ..Pressure::default()
        };
        let swapped = pressure_taints(&tainted, disk).expect("changed");
        let keys: Vec<&str> = swapped.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["dedicated", "node.kubernetes.io/disk-pressure"]);
        assert_eq!(
            pressure_taints(&swapped, Pressure::default()),
            Some(vec![admin])
        );
    }

    fn input(ready: Result<(), NotReady>) -> NodeInput {
        NodeInput {
            name: "n1".into(),
            node_ip: Some("10.0.0.5".into()),
            hostname: "host".into(),
            max_pods: 110,
            taints: vec![],
            labels: BTreeMap::new(),
            root_dir: "/".into(),
            runtime_version: "containerd://1.7.24".into(),
            runtime_support: crate::validation::RuntimeSupport {
                supplemental_groups_policy: true,
            },
            port: 10255,
            ready: Arc::new(move || ready.clone()),
            pressure: tokio::sync::watch::channel(crate::eviction::Pressure::default()).1,
            reserved: Reserved::default(),
        }
    }

    const MACHINE: Machine = Machine {
        cpus: 2,
        memory: 24 << 30,
        memory_available: 20 << 30,
        disk: 100 << 30,
        disk_available: 50 << 30,
        pid_max: 4_194_304,
        pids: 300,
    };

    fn cond<'a>(s: &'a NodeStatus, t: &str) -> &'a NodeCondition {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t)
            .expect("condition")
    }

    #[test]
    fn a_healthy_node_is_ready_without_pressure() {
        let s = status(&input(Ok(())), &MACHINE, None);
        assert_eq!(cond(&s, "Ready").status, "True");
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("KubeletReady"));
        for t in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
            assert_eq!(cond(&s, t).status, "False", "{t}");
        }
        let cap = s.capacity.expect("capacity");
        assert_eq!(cap["cpu"].0, "2");
        assert_eq!(cap["memory"].0, format!("{}Ki", 24 << 20));
        assert_eq!(cap["pods"].0, "110");
        let addresses = s.addresses.expect("addresses");
        assert_eq!(addresses[0].type_, "InternalIP");
        assert_eq!(addresses[0].address, "10.0.0.5");
    }

    #[test]
    fn an_unhealthy_pleg_makes_the_node_not_ready_with_the_reason() {
        let ok = status(&input(Ok(())), &MACHINE, None);
        let bad = status(
            &input(Err(NotReady {
                check: "PLEG",
                problem: crate::health::Unhealthy::PlegStale {
                    ago: Duration::from_secs(240),
                    threshold: Duration::from_secs(180),
                },
            })),
            &MACHINE,
            Some(&ok),
        );
        let ready = cond(&bad, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
        assert!(ready.message.as_deref().is_some_and(|m| m.contains("PLEG")));
        assert_ne!(comparable(&ok), comparable(&bad), "a change to patch");
    }

    #[test]
    fn the_eviction_managers_pressure_is_the_conditions_and_heartbeats_alone_are_no_change() {
        let mut under = input(Ok(()));
        under.pressure = tokio::sync::watch::channel(crate::eviction::Pressure {
            memory: true,
            disk: true,
            pid: false,
        })
        .1;
        let s = status(&under, &MACHINE, None);
        let memory = cond(&s, "MemoryPressure");
        assert_eq!(memory.status, "True");
        assert_eq!(
            memory.reason.as_deref(),
            Some("KubeletHasInsufficientMemory")
        );
        assert_eq!(
            memory.message.as_deref(),
            Some("kubelet has insufficient memory available")
        );
        assert_eq!(cond(&s, "DiskPressure").status, "True");
        assert_eq!(cond(&s, "PIDPressure").status, "False");
        let again = status(&under, &MACHINE, Some(&s));
        assert_eq!(comparable(&s), comparable(&again));
        assert_eq!(
            cond(&s, "MemoryPressure").last_transition_time,
            cond(&again, "MemoryPressure").last_transition_time
        );
    }
}
