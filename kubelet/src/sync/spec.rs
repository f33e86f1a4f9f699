//! Pod spec → CRI configs: the sandbox config (metadata, labels, log directory,
//! cgroup parent, namespaces, host ports) and container configs (command, env,
//! mounts, resources as cgroup settings, security context, labels).

use std::collections::HashMap;
use std::path::PathBuf;

use evlet_cri::api;
use k8s_openapi::api::core::v1::{Container, Pod};
use sha2::{Digest as _, Sha256};

use super::env;
use crate::pod::{self, labels};
use crate::resources::{self, List, Qos, qos};
use crate::runtime::Kind;

/// Node-level facts the configs need.
#[derive(Debug, Clone, Default)]
pub struct NodeContext {
    /// The node's name.
    pub node_name: String,
    /// The agent's state directory (`--root-dir`).
    pub root_dir: PathBuf,
    /// The pods' cgroup names (the driver's spelling under `cgroupRoot`).
    pub cgroups: crate::cm::Names,
    /// The node's IP for `status.hostIP`.
    pub host_ip: Option<String>,
    /// Node memory capacity in bytes (for Burstable `oom_score_adj`).
    pub memory_capacity: i64,
    /// Node allocatable (the downward API's `limits.*` a container does not set).
    pub allocatable: crate::cm::allocatable::Resources,
    /// The node's DNS settings (`clusterDNS`, `clusterDomain`, `resolvConf`).
    pub dns: crate::dns::NodeDns,
    /// `seccompDefault`: containers without a profile get RuntimeDefault.
    pub seccomp_default: bool,
    /// Image pulls at once (`serializeImagePulls`: 1; 0 counts as 1).
    pub parallel_image_pulls: usize,
    /// Pod starts (new sandbox and its first containers) at once; 0 counts as 1.
    pub parallel_pod_starts: usize,
    /// `podLogsDir` (None: `<root_dir>/logs/pods`).
    pub pod_logs_dir: Option<PathBuf>,
    /// Where the log links for log shippers go (upstream's `/var/log/containers`).
    pub container_log_links: Option<PathBuf>,
    /// An OOM kill takes the container's every process (`memory.oom.group`):
    /// upstream's default on pure cgroup v2 unless `singleProcessOOMKill`.
    pub oom_group_kill: bool,
}

/// The pod's cgroup, its sandbox's `cgroup_parent`: `kubepods/pod<uid>` for
/// Guaranteed, `kubepods/burstable/pod<uid>` and `kubepods/besteffort/pod<uid>`
/// otherwise, as the node's cgroup driver spells them.
pub fn pod_cgroup(node: &NodeContext, pod: &Pod) -> String {
    node.cgroups.pod(pod)
}

/// `<root>/logs/pods/<namespace>_<name>_<uid>`, upstream's `/var/log/pods` layout.
pub fn log_dir(node: &NodeContext, pod: &Pod) -> PathBuf {
    log_dir_of(&pod_logs_dir(node), pod)
}

/// Where pods' log directories are.
pub fn pod_logs_dir(node: &NodeContext) -> PathBuf {
    node.pod_logs_dir
        .clone()
        .unwrap_or_else(|| node.root_dir.join("logs/pods"))
}

/// The link to a container's log for log shippers (upstream's
/// `<pod>_<namespace>_<container>-<id>.log`).
pub fn log_link(
    dir: &std::path::Path,
    pod: &str,
    namespace: &str,
    container: &str,
    id: &str,
) -> PathBuf {
    dir.join(format!("{pod}_{namespace}_{container}-{id}.log"))
}

/// The pod's log directory under `pod_logs_dir`.
pub fn log_dir_of(pod_logs_dir: &std::path::Path, pod: &Pod) -> PathBuf {
    pod_logs_dir.join(format!(
        "{}_{}_{}",
        pod::namespace(pod),
        pod::name(pod),
        pod::uid(pod)
    ))
}

/// `<root>/pods/<uid>`: the pod's volumes and other state.
pub fn pod_dir(node: &NodeContext, pod: &Pod) -> PathBuf {
    node.root_dir.join("pods").join(pod::uid(pod).0)
}

/// Hash of a container spec; a running container whose hash differs is restarted.
pub fn container_hash(c: &Container) -> String {
    let bytes = serde_json::to_vec(c).unwrap_or_default();
    hex::encode(&Sha256::digest(bytes)[..8])
}

fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    [
        (labels::POD_NAME.to_owned(), pod::name(pod).to_owned()),
        (
            labels::POD_NAMESPACE.to_owned(),
            pod::namespace(pod).to_owned(),
        ),
        (labels::POD_UID.to_owned(), pod::uid(pod).0),
    ]
    .into()
}

/// The pod's namespaces: the host's network, PID or IPC namespace when asked,
/// one PID namespace for the pod with `shareProcessNamespace`, else the
/// container's own.
pub fn namespaces(pod: &Pod) -> api::NamespaceOption {
    let spec = pod.spec.as_ref();
    let flag = |f: fn(&k8s_openapi::api::core::v1::PodSpec) -> Option<bool>| {
        spec.and_then(f).unwrap_or(false)
    };
    let ns_mode = |host: bool| if host { api::NamespaceMode::Node } else { api::NamespaceMode::Pod } as i32;
    api::NamespaceOption {
        network: ns_mode(flag(|s| s.host_network)),
        pid: if flag(|s| s.host_pid) {
            api::NamespaceMode::Node
        } else if flag(|s| s.share_process_namespace) {
            api::NamespaceMode::Pod
        } else {
            api::NamespaceMode::Container
        } as i32,
        ipc: ns_mode(flag(|s| s.host_ipc)),
        ..Default::default()
    }
}

/// Why a sandbox config cannot be made (the pod's names).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SandboxConfigError(pub String);

/// The sandbox config of attempt `attempt`: names and DNS (see [`crate::dns`]),
/// host ports, namespaces, the pod's security context, sysctls.
///
/// # Errors
/// A hostname or FQDN upstream would refuse, or a resolv.conf that does not parse.
pub fn sandbox_config(
    node: &NodeContext,
    pod: &Pod,
    attempt: u32,
) -> Result<api::PodSandboxConfig, SandboxConfigError> {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut sandbox_labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    sandbox_labels.extend(pod_labels(pod));
    let names = crate::dns::names(pod, &node.dns.cluster_domain).map_err(SandboxConfigError)?;
    let (resolver, _) = crate::dns::resolver(pod, &node.dns).map_err(SandboxConfigError)?;
    let port_mappings = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| api::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => api::Protocol::Udp as i32,
                Some("SCTP") => api::Protocol::Sctp as i32,
                _ => api::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let host_network = spec.host_network.unwrap_or(false);
    let psc = spec.security_context.clone().unwrap_or_default();
    Ok(api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: pod::name(pod).to_owned(),
            uid: pod::uid(pod).0,
            namespace: pod::namespace(pod).to_owned(),
            attempt,
        }),
        // A hostNetwork sandbox keeps the node's name (upstream).
        hostname: if host_network {
            String::new()
        } else {
            names.kernel
        },
        log_directory: log_dir(node, pod).display().to_string(),
        dns_config: Some(api::DnsConfig {
            servers: resolver.servers,
            searches: resolver.searches,
            options: resolver.options,
        }),
        port_mappings,
        labels: sandbox_labels,
        annotations: pod::annotations(pod).into_iter().collect(),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: pod_cgroup(node, pod),
            security_context: Some(super::security::sandbox(pod, namespaces(pod))),
            sysctls: psc
                .sysctls
                .iter()
                .flatten()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Linux resources of a container: CPU shares from requests, quota from limits,
/// memory limit, and `oom_score_adj` by QoS (upstream's policy). A container
/// without a limit of its own runs with the pod's (`spec.resources`), as
/// upstream's `getCPULimit` / `getMemoryLimit` give it; like upstream, a
/// container that requests no CPU then takes its shares from that limit.
pub fn linux_resources(
    node: &NodeContext,
    pod: &Pod,
    c: &Container,
) -> api::LinuxContainerResources {
    const PERIOD: i64 = 100_000;
    let (limit_cpu, limit_mem) = resources::container_limits(pod, c);
    let (own_cpu, own_mem) = resources::values(c, List::Limits);
    let (req_cpu, req_mem) = resources::values(c, List::Requests);
    let req_cpu = req_cpu.or(own_cpu).or(limit_cpu);
    let req_mem = req_mem.or(own_mem);
    let shares = req_cpu.map_or(2, |m| {
        i64::try_from(crate::cm::limits::milli_to_shares(m)).unwrap_or(i64::MAX)
    });
    let oom_score_adj = match qos(pod) {
        Qos::Guaranteed => -997,
        Qos::BestEffort => 1000,
        Qos::Burstable => burstable_oom_score_adj(node, pod, c, req_mem.unwrap_or(0)),
    };
    api::LinuxContainerResources {
        cpu_period: if limit_cpu.is_some() { PERIOD } else { 0 },
        // A zero or negative limit still gets upstream's smallest quota.
        cpu_quota: limit_cpu.map_or(0, |m| crate::cm::limits::milli_to_quota(m).unwrap_or(1000)),
        cpu_shares: shares,
        memory_limit_in_bytes: limit_mem.unwrap_or(0),
        oom_score_adj,
        unified: if node.oom_group_kill {
            [("memory.oom.group".to_owned(), "1".to_owned())].into()
        } else {
            HashMap::new()
        },
        ..Default::default()
    }
}

/// Upstream's `GetContainerOOMScoreAdjust` for a Burstable pod's container
/// requesting `request` bytes of memory: `1000 - 1000 * request / capacity`,
/// the pod's unrequested own memory request shared among its containers; a
/// sidecar scores no higher than the app container requesting least; kept
/// between 3 (above Guaranteed pods' -997 + 1000) and 999 (below BestEffort).
fn burstable_oom_score_adj(node: &NodeContext, pod: &Pod, c: &Container, request: i64) -> i64 {
    // Widened arithmetic: a request of petabytes is valid input and must not
    // overflow (found by fuzzing).
    let cap = i128::from(node.memory_capacity.max(1));
    let rem = i128::from(resources::remaining_memory_request_per_container(pod));
    let adj_of = |request: i64| 1000 - 1000 * (i128::from(request) + rem) / cap;
    let mut adj = adj_of(request);
    if crate::pod::is_restartable_init(c)
        && let Some(least) = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|app| {
                let req = resources::values(app, List::Requests).1;
                req.or(resources::values(app, List::Limits).1).unwrap_or(0)
            })
            .min()
    {
        adj = adj.min(adj_of(least));
    }
    let adj = i64::try_from(adj).unwrap_or(i64::MIN);
    if adj < 3 {
        3
    } else if adj >= 1000 {
        999
    } else {
        adj
    }
}

/// Where the container writes its termination message (upstream's default
/// `/dev/termination-log`); None if the spec sets it empty.
pub fn termination_message_path(c: &Container) -> Option<&str> {
    match c.termination_message_path.as_deref() {
        Some("") => None,
        Some(p) => Some(p),
        None => Some("/dev/termination-log"),
    }
}

/// `<root>/pods/<uid>/containers/<name>`: where a container's termination
/// message files live.
pub fn container_dir(node: &NodeContext, pod: &Pod, name: &str) -> PathBuf {
    pod_dir(node, pod).join("containers").join(name)
}

/// Inputs of a container config beyond the spec.
#[derive(Debug, Clone)]
pub struct ContainerContext<'a> {
    /// Init, sidecar or app.
    pub kind: Kind,
    /// The restart count this instance gets (also the CRI attempt).
    pub restart_count: u32,
    /// The pod IP (for the downward API).
    pub pod_ip: Option<&'a str>,
    /// ConfigMaps and Secrets the env refers to (API-server mode).
    pub objects: &'a env::ApiObjects,
    /// Service variables (API-server mode).
    pub services: &'a [(String, String)],
    /// The host file mounted at the container's `terminationMessagePath`
    /// (made by the syncer), if it has one.
    pub termination_log: Option<&'a std::path::Path>,
    /// The container's volume mounts, made by the volume manager (subPaths
    /// already bound beneath their volumes).
    pub mounts: &'a [api::Mount],
}

/// Why a container config cannot be made (CreateContainerConfigError).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An env var.
    #[error(transparent)]
    Env(#[from] env::EnvError),
    /// The security context.
    #[error(transparent)]
    Security(#[from] super::security::SecurityError),
}

/// The CRI config of one container instance.
///
/// # Errors
/// An environment variable that cannot be computed (names the variable).
pub fn container_config(
    node: &NodeContext,
    pod: &Pod,
    c: &Container,
    ctx: &ContainerContext<'_>,
) -> Result<api::ContainerConfig, ConfigError> {
    let envs = env::build(
        pod,
        c,
        &env::Runtime {
            pod_ip: ctx.pod_ip,
            host_ip: node.host_ip.as_deref(),
            objects: ctx.objects,
            services: ctx.services,
            allocatable: node.allocatable,
        },
    )?;
    let env_map = envs.iter().cloned().collect();
    let expand_all = |v: &Option<Vec<String>>| {
        v.iter()
            .flatten()
            .map(|a| env::expand(a, &env_map))
            .collect::<Vec<_>>()
    };
    let mut container_labels = pod_labels(pod);
    container_labels.insert(labels::CONTAINER_NAME.into(), c.name.clone());
    container_labels.insert(labels::CONTAINER_KIND.into(), ctx.kind.as_str().into());
    let mut annotations: HashMap<String, String> = [
        (labels::CONTAINER_HASH.to_owned(), container_hash(c)),
        (
            labels::RESTART_COUNT.to_owned(),
            ctx.restart_count.to_string(),
        ),
        (
            labels::GRACE_PERIOD.to_owned(),
            pod::grace_period(pod).to_string(),
        ),
    ]
    .into();
    let mut mounts: Vec<api::Mount> = ctx.mounts.to_vec();
    if let (Some(host), Some(path)) = (ctx.termination_log, termination_message_path(c)) {
        mounts.push(api::Mount {
            container_path: path.to_owned(),
            host_path: host.display().to_string(),
            ..Default::default()
        });
        annotations.insert(labels::TERMINATION_MESSAGE_PATH.into(), path.to_owned());
        annotations.insert(
            labels::TERMINATION_MESSAGE_POLICY.into(),
            c.termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".into()),
        );
    }
    let security = super::security::container(
        pod,
        c,
        namespaces(pod),
        node.seccomp_default,
        &node.root_dir,
    )?;
    Ok(api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: c.name.clone(),
            attempt: ctx.restart_count,
        }),
        image: Some(api::ImageSpec {
            image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: expand_all(&c.command),
        args: expand_all(&c.args),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: envs
            .into_iter()
            .map(|(key, value)| api::KeyValue { key, value })
            .collect(),
        mounts,
        labels: container_labels,
        annotations,
        log_path: format!("{}/{}.log", c.name, ctx.restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(linux_resources(node, pod, c)),
            security_context: Some(security),
        }),
        ..Default::default()
    })
}

/// The host path of a container instance's log.
pub fn log_path(node: &NodeContext, pod: &Pod, name: &str, restart_count: u32) -> PathBuf {
    log_dir(node, pod)
        .join(name)
        .join(format!("{restart_count}.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeContext {
        NodeContext {
            node_name: "n1".into(),
            root_dir: PathBuf::from("/var/lib/evlet"),
            cgroups: crate::cm::Names::new(crate::cm::Driver::Cgroupfs, "/"),
            host_ip: Some("192.0.2.1".into()),
            memory_capacity: 8 << 30,
            ..Default::default()
        }
    }

    fn pod(resources: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "metadata: {{name: web, namespace: prod, uid: u1}}\nspec:\n  containers:\n  - name: app\n    image: i:1\n    command: [sh, -c]\n    args: ['echo $(GREETING)']\n    env: [{{name: GREETING, value: hi}}]\n    ports: [{{containerPort: 80, hostPort: 8080}}]\n    resources: {resources}\n"
        ))
        .expect("pod")
    }

    #[test]
    fn qos_classes_and_cgroup_parents() {
        let g = pod("{limits: {cpu: 500m, memory: 64Mi}}");
        assert_eq!(qos(&g), Qos::Guaranteed);
        assert_eq!(pod_cgroup(&node(), &g), "/kubepods/podu1");
        let b = pod("{requests: {memory: 64Mi}}");
        assert_eq!(qos(&b), Qos::Burstable);
        assert_eq!(pod_cgroup(&node(), &b), "/kubepods/burstable/podu1");
        assert_eq!(qos(&pod("{}")), Qos::BestEffort);
    }

    #[test]
    fn resources_become_cgroup_settings() {
        let p = pod("{limits: {cpu: 500m, memory: 64Mi}}");
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let r = linux_resources(&node(), &p, c);
        assert_eq!(
            (
                r.cpu_shares,
                r.cpu_period,
                r.cpu_quota,
                r.memory_limit_in_bytes
            ),
            (512, 100_000, 50_000, 64 << 20)
        );
        assert_eq!(r.oom_score_adj, -997);
        let be = pod("{}");
        let r = linux_resources(&node(), &be, &be.spec.as_ref().expect("spec").containers[0]);
        assert_eq!((r.cpu_shares, r.cpu_quota, r.oom_score_adj), (2, 0, 1000));
    }

    #[test]
    fn huge_quantities_saturate_instead_of_overflowing() {
        // Found by fuzzing: `memory: 32Pi` in a Burstable pod overflowed the
        // oom_score_adj arithmetic.
        let p = pod("{requests: {cpu: 50m, memory: 32Pi}, limits: {cpu: '100000000000000'}}");
        let r = linux_resources(&node(), &p, &p.spec.as_ref().expect("spec").containers[0]);
        // Upstream's floor for Burstable: 1000 + Guaranteed's -997.
        assert_eq!((r.oom_score_adj, r.cpu_quota), (3, i64::MAX));
        let big = pod("{requests: {cpu: '9000000000000000'}}");
        let r = linux_resources(
            &node(),
            &big,
            &big.spec.as_ref().expect("spec").containers[0],
        );
        assert_eq!(r.cpu_shares, 262_144);
    }

    #[test]
    fn containers_without_limits_run_with_the_pods_own() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: web, uid: u1}\nspec:\n  resources: {requests: {cpu: 500m, memory: 2Gi}, limits: {cpu: '2', memory: 4Gi}}\n  initContainers:\n  - {name: side, image: i, restartPolicy: Always}\n  containers:\n  - {name: a, image: i, resources: {requests: {memory: 1Gi}}}\n  - {name: b, image: i, resources: {requests: {cpu: 100m}, limits: {cpu: 200m, memory: 512Mi}}}\n",
        )
        .expect("pod");
        let spec = p.spec.as_ref().expect("spec");
        let a = linux_resources(&node(), &p, &spec.containers[0]);
        // The pod's limits, and (upstream's quirk) CPU shares from the
        // inherited CPU limit, as a has no CPU request.
        assert_eq!(
            (a.cpu_shares, a.cpu_quota, a.memory_limit_in_bytes),
            (2048, 200_000, 4 << 30)
        );
        // The pod requests 2Gi; its containers 1.5Gi: 512Mi shared by three.
        // a: 1000 - 1000 * (1Gi + 512Mi/3) / 8Gi = 855.
        assert_eq!(a.oom_score_adj, 855);
        let b = linux_resources(&node(), &p, &spec.containers[1]);
        assert_eq!(
            (b.cpu_shares, b.cpu_quota, b.memory_limit_in_bytes),
            (102, 20_000, 512 << 20),
            "b's own limits"
        );
        // b: 1000 - 1000 * (512Mi + 512Mi/3) / 8Gi = 917.
        assert_eq!(b.oom_score_adj, 917);
        // The sidecar requests nothing, and scores no higher than the app
        // container requesting least (b).
        let side = linux_resources(
            &node(),
            &p,
            &spec.init_containers.as_ref().expect("init")[0],
        );
        assert_eq!(side.oom_score_adj, 917);
    }

    #[test]
    fn a_group_oom_kill_is_asked_for_only_where_the_node_uses_it() {
        let p = pod("{limits: {memory: 64Mi}}");
        let c = &p.spec.as_ref().expect("spec").containers[0];
        assert!(linux_resources(&node(), &p, c).unified.is_empty());
        let v2 = NodeContext {
            oom_group_kill: true,
            ..node()
        };
        let unified = linux_resources(&v2, &p, c).unified;
        assert_eq!(
            unified.into_iter().collect::<Vec<_>>(),
            [("memory.oom.group".to_owned(), "1".to_owned())]
        );
    }

    #[test]
    fn container_config_carries_labels_log_path_and_expanded_args() {
        let p = pod("{}");
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let cfg = container_config(
            &node(),
            &p,
            c,
            &ContainerContext {
                kind: Kind::App,
                restart_count: 2,
                pod_ip: None,
                objects: &super::env::ApiObjects::default(),
                services: &[],
                termination_log: None,
                mounts: &[],
            },
        )
        .expect("config");
        assert_eq!(cfg.args, ["echo hi"]);
        assert_eq!(cfg.log_path, "app/2.log");
        assert_eq!(cfg.metadata.map(|m| m.attempt), Some(2));
        assert_eq!(cfg.labels[labels::POD_UID], "u1");
        assert_eq!(cfg.annotations[labels::RESTART_COUNT], "2");
        let sandbox = sandbox_config(&node(), &p, 0).expect("sandbox config");
        assert_eq!(
            sandbox.log_directory,
            "/var/lib/evlet/logs/pods/prod_web_u1"
        );
        assert_eq!(sandbox.port_mappings[0].host_port, 8080);
    }
}
