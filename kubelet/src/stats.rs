//! Resource usage in the kubelet stats API's shape (`stats/v1alpha1`
//! `Summary`, what `/stats/summary` serves and metrics-server reads): the
//! node from procfs and statvfs (CPU, memory, network, the root directory's
//! filesystem, process limits), the runtime's image filesystem and each
//! pod's containers from CRI stats (`ListContainerStats`, `PodSandboxStats`
//! for the network), emptyDir volumes and container logs measured on disk.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use evlet_cri::{ContainerFilter, RuntimeClient, SandboxId, api};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;

use crate::lock::lock;
use crate::workers::PodView;

/// `Summary`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// Each pod with a running sandbox.
    pub pods: Vec<PodStats>,
}

/// `NodeStats`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// The node's name.
    pub node_name: String,
    /// When the machine booted.
    pub start_time: Time,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Network (the default route's interface inline, all in `interfaces`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The root directory's filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    /// The runtime's filesystems.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    /// Process limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// `CPUStats`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When measured.
    pub time: Time,
    /// Usage rate in nanocores (since the previous measurement).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative usage in core-nanoseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

/// `MemoryStats`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When measured.
    pub time: Time,
    /// Limit (or capacity) minus the working set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Usage minus inactive file pages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Anonymous and swap cache memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    /// Major page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

/// `InterfaceStats`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    /// The interface.
    pub name: String,
    /// Bytes received.
    pub rx_bytes: Option<u64>,
    /// Receive errors.
    pub rx_errors: Option<u64>,
    /// Bytes sent.
    pub tx_bytes: Option<u64>,
    /// Send errors.
    pub tx_errors: Option<u64>,
}

/// `NetworkStats`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStats {
    /// When measured.
    pub time: Time,
    /// The default interface, inline.
    #[serde(flatten)]
    pub default: InterfaceStats,
    /// Every interface.
    pub interfaces: Vec<InterfaceStats>,
}

/// `FsStats`.
#[derive(Debug, Clone, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    /// When measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// Bytes available to unprivileged users.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Size of the filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Bytes used (by the object, or on the filesystem).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Free inodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    /// Inodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// Inodes used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

/// `RuntimeStats`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    /// Where images live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
}

/// `RlimitStats`.
#[derive(Debug, Clone, Serialize)]
pub struct RlimitStats {
    /// When measured.
    pub time: Time,
    /// `kernel.pid_max`.
    pub maxpid: u64,
    /// Processes now.
    pub curproc: u64,
}

/// `PodReference`.
#[derive(Debug, Clone, Serialize)]
pub struct PodReference {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
}

/// `PodStats`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// The pod.
    pub pod_ref: PodReference,
    /// When the pod started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// Its running containers.
    pub containers: Vec<ContainerStats>,
    /// CPU of its containers together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory of its containers together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The sandbox's network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// Its emptyDir volumes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volume: Vec<VolumeStats>,
    /// Writable layers, logs and emptyDir volumes together.
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    /// Its processes.
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
}

/// `ContainerStats`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// The container's name.
    pub name: String,
    /// When it started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Its writable layer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// Its log files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
}

/// `VolumeStats`.
#[derive(Debug, Clone, Serialize)]
pub struct VolumeStats {
    /// Usage.
    #[serde(flatten)]
    pub fs: FsStats,
    /// The volume's name.
    pub name: String,
}

/// A running container of a pod, as the runtime lists it, with its stats.
struct Running<'a> {
    id: &'a str,
    name: &'a str,
    created_at: i64,
    stats: &'a api::ContainerStats,
}

/// Why no summary could be made.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// The runtime's stats could not be read.
    #[error("failed to list container stats: {0}")]
    Runtime(#[from] evlet_cri::Error),
}

/// How long a directory's measured usage is reused (upstream measures
/// volumes once a minute).
const DU_TTL: Duration = Duration::from_secs(60);

/// A directory's bytes and inodes, and when they were measured.
type Measured = ((u64, u64), Instant);

/// Makes summaries; keeps the previous node CPU sample for the rate and
/// recent directory measurements.
#[derive(Debug)]
pub struct StatsProvider {
    runtime: RuntimeClient,
    root_dir: PathBuf,
    pod_logs_dir: PathBuf,
    node_name: String,
    last_cpu: Mutex<Option<(u64, Instant)>>,
    du: Mutex<HashMap<PathBuf, Measured>>,
    /// The root of the cgroup v1 memory controller (None on cgroup v2): the
    /// node's memory is read there, as upstream's cAdvisor does.
    memcg_v1_root: Option<PathBuf>,
    /// `<pids hierarchy>` and the pods' cgroup names: where a pod's
    /// `pids.current` is read.
    pids: Option<(PathBuf, crate::cm::Names)>,
}

/// `ProcessStats`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub struct ProcessStats {
    /// Processes in the pod's cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

fn now() -> Time {
    crate::clock::now()
}

fn val(v: Option<&api::UInt64Value>) -> Option<u64> {
    v.map(|v| v.value)
}

impl StatsProvider {
    /// A provider reading `runtime`, `root_dir` (volumes), `pod_logs_dir` and
    /// the pods' cgroups `cgroups` names (processes).
    pub fn new(
        runtime: RuntimeClient,
        root_dir: PathBuf,
        pod_logs_dir: PathBuf,
        node_name: String,
        cgroups: crate::cm::Names,
    ) -> Self {
        let pids = crate::cgroups::v1_controller_root("pids")
            .or_else(crate::cgroups::v2_root)
            .map(|root| (root, cgroups));
        Self {
            runtime,
            root_dir,
            pod_logs_dir,
            node_name,
            last_cpu: Mutex::default(),
            du: Mutex::default(),
            memcg_v1_root: crate::cgroups::memcg_v1_root(),
            pids,
        }
    }

    /// The processes in `pod`'s cgroup (`pids.current`).
    fn process_count(&self, pod: &k8s_openapi::api::core::v1::Pod) -> Option<u64> {
        let (root, pods) = self.pids.as_ref()?;
        let cgroup = pods.pod(pod);
        let path = root
            .join(cgroup.trim_start_matches('/'))
            .join("pids.current");
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    /// The summary of the node and of the pods in `views`; with
    /// `only_cpu_and_memory`, just those (upstream's `?only_cpu_and_memory=true`).
    ///
    /// # Errors
    /// [`StatsError`] when the runtime's container stats cannot be read.
    pub async fn summary(
        &self,
        views: &[PodView],
        only_cpu_and_memory: bool,
    ) -> Result<Summary, StatsError> {
        // As upstream's CRI stats provider: the pods' running containers as the
        // runtime lists them (the status may not show a just-started one yet),
        // each with its stats.
        let (running, stats) = tokio::try_join!(
            self.runtime.list_containers(
                ContainerFilter::new().state(api::ContainerState::ContainerRunning)
            ),
            self.runtime.list_container_stats(ContainerFilter::new()),
        )?;
        let by_id: HashMap<&str, &api::ContainerStats> = stats
            .iter()
            .filter_map(|s| s.attributes.as_ref().map(|a| (a.id.as_str(), s)))
            .collect();
        let mut by_pod: HashMap<&str, Vec<Running<'_>>> = HashMap::new();
        for c in &running {
            let (Some(uid), Some(stats)) = (
                c.labels.get(crate::pod::labels::POD_UID),
                by_id.get(c.id.as_str()),
            ) else {
                continue;
            };
            let name = c
                .labels
                .get(crate::pod::labels::CONTAINER_NAME)
                .map(String::as_str)
                .or_else(|| c.metadata.as_ref().map(|m| m.name.as_str()))
                .unwrap_or_default();
            by_pod.entry(uid.as_str()).or_default().push(Running {
                id: &c.id,
                name,
                created_at: c.created_at,
                stats,
            });
        }
        let mut pods = Vec::new();
        for view in views {
            let uid = crate::pod::uid(&view.pod);
            let running = by_pod.remove(uid.0.as_str()).unwrap_or_default();
            if let Some(p) = self.pod(view, running, only_cpu_and_memory).await {
                pods.push(p);
            }
        }
        Ok(Summary {
            node: self.node(only_cpu_and_memory).await,
            pods,
        })
    }

    async fn node(&self, only_cpu_and_memory: bool) -> NodeStats {
        use procfs::CurrentSI as _;
        let kernel = procfs::KernelStats::current().ok();
        let start_time = kernel
            .as_ref()
            .and_then(|k| {
                crate::clock::time_of(
                    i64::try_from(k.btime)
                        .unwrap_or(0)
                        .saturating_mul(1_000_000_000),
                )
            })
            .unwrap_or_else(now);
        let cpu = kernel.as_ref().map(|k| {
            let t = &k.total;
            let ticks = t.user
                + t.nice
                + t.system
                + t.irq.unwrap_or(0)
                + t.softirq.unwrap_or(0)
                + t.steal.unwrap_or(0);
            let per_tick = 1_000_000_000 / procfs::ticks_per_second().max(1);
            let usage = ticks.saturating_mul(per_tick);
            let instant = Instant::now();
            let rate = {
                let mut last = lock(&self.last_cpu);
                let rate = last.and_then(|(u, at)| {
                    let secs = instant.duration_since(at).as_secs_f64();
                    (secs > 0.0).then(|| (usage.saturating_sub(u) as f64 / secs) as u64)
                });
                *last = Some((usage, instant));
                rate
            };
            CpuStats {
                time: now(),
                usage_nano_cores: rate,
                usage_core_nano_seconds: Some(usage),
            }
        });
        let memory = self.node_memory();
        let mut node = NodeStats {
            node_name: self.node_name.clone(),
            start_time,
            cpu,
            memory,
            network: None,
            fs: None,
            runtime: None,
            rlimit: None,
        };
        if only_cpu_and_memory {
            return node;
        }
        node.network = host_network();
        let resources = self.node_resources(true).await;
        node.fs = resources.fs;
        node.runtime = resources.runtime;
        node.rlimit = resources.rlimit;
        node
    }

    fn node_memory(&self) -> Option<MemoryStats> {
        crate::machine::NodeMemory::read(self.memcg_v1_root.as_deref()).map(|m| MemoryStats {
            time: now(),
            available_bytes: Some(m.available()),
            usage_bytes: Some(m.usage),
            working_set_bytes: Some(m.working_set),
            rss_bytes: None,
            page_faults: None,
            major_page_faults: None,
        })
    }

    /// Where the pod's emptyDir volume `name` lives.
    pub fn empty_dir(&self, uid: &crate::pod::PodUid, name: &str) -> PathBuf {
        self.root_dir
            .join("pods")
            .join(&uid.0)
            .join("volumes/kubernetes.io~empty-dir")
            .join(name)
    }

    /// What the eviction signals are made of, without the runtime's per-pod
    /// work: the node's memory, filesystem, PIDs and (with `image_fs`, one
    /// `ImageFsInfo` call) the image filesystem.
    pub async fn node_resources(&self, image_fs: bool) -> NodeStats {
        use procfs::Current as _;
        let image_fs = if image_fs {
            self.image_fs().await
        } else {
            None
        };
        NodeStats {
            node_name: self.node_name.clone(),
            start_time: now(),
            cpu: None,
            memory: self.node_memory(),
            network: None,
            fs: filesystem(&self.root_dir),
            runtime: Some(RuntimeStats { image_fs }),
            rlimit: Some(RlimitStats {
                time: now(),
                maxpid: std::fs::read_to_string("/proc/sys/kernel/pid_max")
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0),
                curproc: procfs::LoadAverage::current().map_or(0, |l| u64::from(l.max)),
            }),
        }
    }

    /// The runtime's image filesystem: capacity and availability of the
    /// filesystem it is on, the runtime's own usage.
    pub async fn image_fs(&self) -> Option<FsStats> {
        let info = self.runtime.image_fs_info().await.ok()?;
        let fs = info.image_filesystems.first()?;
        let mount = fs.fs_id.as_ref().map(|i| PathBuf::from(&i.mountpoint));
        let mut stats = mount.as_deref().and_then(filesystem).unwrap_or_default();
        stats.used_bytes = val(fs.used_bytes.as_ref());
        stats.inodes_used = val(fs.inodes_used.as_ref());
        Some(stats)
    }

    async fn pod(
        &self,
        view: &PodView,
        mut running: Vec<Running<'_>>,
        only_cpu_and_memory: bool,
    ) -> Option<PodStats> {
        let pod = &view.pod;
        let uid = crate::pod::uid(pod);
        // Spec order, as the status lists them.
        let order = |name: &str| {
            pod.spec
                .iter()
                .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
                .position(|c| c.name == name)
                .unwrap_or(usize::MAX)
        };
        running.sort_by_key(|r| (order(r.name), r.created_at));
        let mut containers = Vec::new();
        for r in running {
            let s = r.stats;
            // The status's start time when it shows this instance running, else
            // the runtime's creation time (upstream uses the latter).
            let start_time = view
                .status
                .container_statuses
                .iter()
                .flatten()
                .chain(view.status.init_container_statuses.iter().flatten())
                .filter(|cs| {
                    cs.container_id
                        .as_deref()
                        .is_some_and(|i| i.split_once("://").map_or(i, |(_, x)| x) == r.id)
                })
                .find_map(|cs| cs.state.as_ref()?.running.as_ref()?.started_at.clone())
                .or_else(|| crate::clock::time_of(r.created_at));
            containers.push(ContainerStats {
                name: r.name.to_owned(),
                start_time,
                cpu: s.cpu.as_ref().map(|c| CpuStats {
                    time: now(),
                    usage_nano_cores: val(c.usage_nano_cores.as_ref()),
                    usage_core_nano_seconds: val(c.usage_core_nano_seconds.as_ref()),
                }),
                memory: s.memory.as_ref().map(|m| MemoryStats {
                    time: now(),
                    available_bytes: val(m.available_bytes.as_ref()),
                    usage_bytes: val(m.usage_bytes.as_ref()),
                    working_set_bytes: val(m.working_set_bytes.as_ref()),
                    rss_bytes: val(m.rss_bytes.as_ref()),
                    page_faults: val(m.page_faults.as_ref()),
                    major_page_faults: val(m.major_page_faults.as_ref()),
                }),
                rootfs: (!only_cpu_and_memory)
                    .then_some(s.writable_layer.as_ref())
                    .flatten()
                    .map(|w| FsStats {
                        time: Some(now()),
                        used_bytes: val(w.used_bytes.as_ref()),
                        inodes_used: val(w.inodes_used.as_ref()),
                        ..FsStats::default()
                    }),
                logs: (!only_cpu_and_memory).then(|| {
                    let dir = crate::sync::spec::log_dir_of(&self.pod_logs_dir, pod).join(r.name);
                    self.usage(&dir)
                }),
            });
        }
        if containers.is_empty() {
            return None;
        }
        let sum = |f: &dyn Fn(&ContainerStats) -> Option<u64>| -> Option<u64> {
            containers
                .iter()
                .map(f)
                .try_fold(0_u64, |acc, v| v.map(|v| acc.saturating_add(v)))
        };
        let cpu = Some(CpuStats {
            time: now(),
            usage_nano_cores: sum(&|c| c.cpu.as_ref()?.usage_nano_cores),
            usage_core_nano_seconds: sum(&|c| c.cpu.as_ref()?.usage_core_nano_seconds),
        });
        let memory = Some(MemoryStats {
            time: now(),
            available_bytes: None,
            usage_bytes: sum(&|c| c.memory.as_ref()?.usage_bytes),
            working_set_bytes: sum(&|c| c.memory.as_ref()?.working_set_bytes),
            rss_bytes: sum(&|c| c.memory.as_ref()?.rss_bytes),
            page_faults: sum(&|c| c.memory.as_ref()?.page_faults),
            major_page_faults: sum(&|c| c.memory.as_ref()?.major_page_faults),
        });
        let mut stats = PodStats {
            pod_ref: PodReference {
                name: crate::pod::name(pod).to_owned(),
                namespace: crate::pod::namespace(pod).to_owned(),
                uid: uid.0.clone(),
            },
            start_time: view.status.start_time.clone(),
            containers,
            cpu,
            memory,
            network: None,
            volume: Vec::new(),
            ephemeral_storage: None,
            process_stats: Some(ProcessStats {
                process_count: self.process_count(pod),
            }),
        };
        if only_cpu_and_memory {
            return Some(stats);
        }
        stats.network = self.pod_network(view).await;
        for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            if v.empty_dir.is_some() {
                let dir = self.empty_dir(&uid, &v.name);
                stats.volume.push(VolumeStats {
                    fs: self.usage(&dir),
                    name: v.name.clone(),
                });
            }
        }
        let parts = stats
            .containers
            .iter()
            .flat_map(|c| [c.rootfs.as_ref(), c.logs.as_ref()])
            .flatten()
            .chain(stats.volume.iter().map(|v| &v.fs));
        let (mut used, mut inodes) = (0_u64, 0_u64);
        for p in parts {
            used = used.saturating_add(p.used_bytes.unwrap_or(0));
            inodes = inodes.saturating_add(p.inodes_used.unwrap_or(0));
        }
        let mut eph = filesystem(&self.root_dir).unwrap_or_default();
        eph.used_bytes = Some(used);
        eph.inodes_used = Some(inodes);
        stats.ephemeral_storage = Some(eph);
        Some(stats)
    }

    async fn pod_network(&self, view: &PodView) -> Option<NetworkStats> {
        let id = self
            .runtime
            .list_pod_sandbox(
                evlet_cri::SandboxFilter::new()
                    .label(crate::pod::labels::POD_UID, crate::pod::uid(&view.pod).0)
                    .state(api::PodSandboxState::SandboxReady),
            )
            .await
            .ok()?
            .into_iter()
            .next()?
            .id;
        let stats = self
            .runtime
            .pod_sandbox_stats(&SandboxId::new(&id))
            .await
            .ok()?;
        let net = stats.linux?.network?;
        let iface = |i: &api::NetworkInterfaceUsage| InterfaceStats {
            name: i.name.clone(),
            rx_bytes: val(i.rx_bytes.as_ref()),
            rx_errors: val(i.rx_errors.as_ref()),
            tx_bytes: val(i.tx_bytes.as_ref()),
            tx_errors: val(i.tx_errors.as_ref()),
        };
        let default = net.default_interface.as_ref().map(iface)?;
        Some(NetworkStats {
            time: now(),
            default,
            interfaces: net.interfaces.iter().map(iface).collect(),
        })
    }

    /// Bytes and inodes under `dir`, measured at most once a minute.
    fn usage(&self, dir: &Path) -> FsStats {
        let cached = lock(&self.du)
            .get(dir)
            .filter(|(_, at)| at.elapsed() < DU_TTL)
            .map(|(v, _)| *v);
        let (bytes, inodes) = cached.unwrap_or_else(|| {
            let v = disk_usage(dir);
            let mut du = lock(&self.du);
            du.retain(|_, (_, at)| at.elapsed() < DU_TTL);
            du.insert(dir.to_owned(), (v, Instant::now()));
            v
        });
        FsStats {
            time: Some(now()),
            used_bytes: Some(bytes),
            inodes_used: Some(inodes),
            ..FsStats::default()
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The summary as upstream's `/metrics/resource` (what metrics-server
/// scrapes): node, pod and container CPU seconds and working sets, container
/// start times, with the sample times in milliseconds.
pub fn resource_metrics(summary: &Summary) -> String {
    use std::fmt::Write as _;
    let ms = |t: &Time| t.0.as_millisecond();
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64, i64)>| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value, at) in samples {
            let _ = writeln!(out, "{name}{labels} {value} {at}");
        }
    };
    let node = &summary.node;
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        node.cpu
            .iter()
            .filter_map(|c| {
                Some((
                    String::new(),
                    c.usage_core_nano_seconds? as f64 / 1e9,
                    ms(&c.time),
                ))
            })
            .collect(),
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        node.memory
            .iter()
            .filter_map(|m| Some((String::new(), m.working_set_bytes? as f64, ms(&m.time))))
            .collect(),
    );
    let pod_labels = |p: &PodStats| {
        format!(
            "namespace=\"{}\",pod=\"{}\"",
            escape(&p.pod_ref.namespace),
            escape(&p.pod_ref.name)
        )
    };
    let container_labels = |p: &PodStats, c: &ContainerStats| {
        format!("{{container=\"{}\",{}}}", escape(&c.name), pod_labels(p))
    };
    let per_container =
        |f: &dyn Fn(&ContainerStats) -> Option<(f64, i64)>| -> Vec<(String, f64, i64)> {
            summary
                .pods
                .iter()
                .flat_map(|p| {
                    p.containers
                        .iter()
                        .filter_map(move |c| f(c).map(|(v, t)| (container_labels(p, c), v, t)))
                })
                .collect()
        };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        per_container(&|c| {
            c.cpu
                .as_ref()
                .and_then(|cpu| Some((cpu.usage_core_nano_seconds? as f64 / 1e9, ms(&cpu.time))))
        }),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        per_container(&|c| {
            c.memory
                .as_ref()
                .and_then(|m| Some((m.working_set_bytes? as f64, ms(&m.time))))
        }),
    );
    family(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        per_container(&|c| {
            c.start_time
                .as_ref()
                .map(|t| (t.0.as_second() as f64, ms(t)))
        }),
    );
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        summary
            .pods
            .iter()
            .filter_map(|p| {
                let c = p.cpu.as_ref()?;
                Some((
                    format!("{{{}}}", pod_labels(p)),
                    c.usage_core_nano_seconds? as f64 / 1e9,
                    ms(&c.time),
                ))
            })
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        summary
            .pods
            .iter()
            .filter_map(|p| {
                let m = p.memory.as_ref()?;
                Some((
                    format!("{{{}}}", pod_labels(p)),
                    m.working_set_bytes? as f64,
                    ms(&m.time),
                ))
            })
            .collect(),
    );
    let _ = writeln!(
        out,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise"
    );
    let _ = writeln!(out, "# TYPE resource_scrape_error gauge");
    let _ = writeln!(out, "resource_scrape_error 0");
    out
}

/// Bytes (allocated blocks) and inodes under `dir`, not crossing into other
/// filesystems (upstream's `du` and `find -xdev`).
pub fn disk_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(root) = std::fs::symlink_metadata(dir) else {
        return (0, 0);
    };
    let dev = root.dev();
    let (mut bytes, mut inodes) = (root.blocks() * 512, 1_u64);
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.dev() != dev {
                continue;
            }
            bytes = bytes.saturating_add(m.blocks() * 512);
            inodes += 1;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, inodes)
}

/// `kubelet_volume_stats_*` of the claims pods use: the file system of each
/// `local` PV, as upstream measures it (statfs); hostPath PVs report nothing.
pub fn claim_stats(
    claims: &[crate::volume::MountedClaim],
) -> Vec<crate::metrics::VolumeStatsSample> {
    claims
        .iter()
        .filter(|c| c.local)
        .filter_map(|c| {
            let fs = filesystem(&c.path)?;
            let f = |v: Option<u64>| v.unwrap_or(0) as f64;
            Some(crate::metrics::VolumeStatsSample {
                namespace: c.namespace.clone(),
                claim: c.claim.clone(),
                capacity_bytes: f(fs.capacity_bytes),
                available_bytes: f(fs.available_bytes),
                used_bytes: f(fs.used_bytes),
                inodes: f(fs.inodes),
                inodes_free: f(fs.inodes_free),
                inodes_used: f(fs.inodes_used),
            })
        })
        .collect()
}

/// Capacity, availability and inodes of the filesystem holding `path`.
pub fn filesystem(path: &Path) -> Option<FsStats> {
    let st = rustix::fs::statvfs(path).ok()?;
    let frsize = st.f_frsize;
    Some(FsStats {
        time: Some(now()),
        available_bytes: Some(st.f_bavail.saturating_mul(frsize)),
        capacity_bytes: Some(st.f_blocks.saturating_mul(frsize)),
        used_bytes: Some(
            st.f_blocks
                .saturating_sub(st.f_bfree)
                .saturating_mul(frsize),
        ),
        inodes_free: Some(st.f_ffree),
        inodes: Some(st.f_files),
        inodes_used: Some(st.f_files.saturating_sub(st.f_ffree)),
    })
}

/// The host's interfaces (loopback left out), the default route's first.
fn host_network() -> Option<NetworkStats> {
    let devs = procfs::net::dev_status().ok()?;
    let default_iface = std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|t| {
            t.lines()
                .skip(1)
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|f| f.get(1) == Some(&"00000000"))
                .and_then(|f| f.first().map(|s| (*s).to_owned()))
        });
    let mut interfaces: Vec<InterfaceStats> = devs
        .values()
        .filter(|d| d.name != "lo")
        .map(|d| InterfaceStats {
            name: d.name.clone(),
            rx_bytes: Some(d.recv_bytes),
            rx_errors: Some(d.recv_errs),
            tx_bytes: Some(d.sent_bytes),
            tx_errors: Some(d.sent_errs),
        })
        .collect();
    interfaces.sort_by(|a, b| a.name.cmp(&b.name));
    let default = interfaces
        .iter()
        .find(|i| Some(&i.name) == default_iface.as_ref())
        .or(interfaces.first())
        .cloned()?;
    Some(NetworkStats {
        time: now(),
        default,
        interfaces,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_usage_counts_files_and_directories() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/a"), vec![1_u8; 64 * 1024]).expect("write");
        let (bytes, inodes) = disk_usage(dir.path());
        assert_eq!(inodes, 3);
        assert!(bytes >= 64 * 1024, "{bytes}");
        assert_eq!(disk_usage(&dir.path().join("missing")), (0, 0));
    }

    #[test]
    fn the_root_filesystem_has_a_size() {
        let fs = filesystem(Path::new("/")).expect("statvfs");
        assert!(fs.capacity_bytes.unwrap_or(0) > 0);
        assert!(fs.available_bytes <= fs.capacity_bytes);
    }

    #[test]
    fn summaries_serialize_in_the_stats_api_shape() {
        let s = FsStats {
            used_bytes: Some(5),
            ..FsStats::default()
        };
        let v = serde_json::to_value(VolumeStats {
            fs: s,
            name: "cache".into(),
        })
        .expect("json");
        assert_eq!(v, serde_json::json!({"usedBytes": 5, "name": "cache"}));
    }
}
