//! The pods' cgroup tree (cgroupfs driver), as upstream's container manager
//! keeps it: `<cgroup-root>/kubepods` limited to node allocatable, the QoS
//! tiers `kubepods/burstable` and `kubepods/besteffort`, and one cgroup per
//! pod (`kubepods/pod<uid>` for Guaranteed, under its tier otherwise) with the
//! limits its spec asks for, made before its sandbox. The runtime creates the
//! containers' cgroups below them.
//!
//! * [`allocatable`] (pure): capacity minus `kubeReserved`, `systemReserved`
//!   and the hard eviction thresholds.
//! * [`limits`] (pure): the limits of the pods' cgroup, of each pod and of the
//!   burstable tier, and the v1 and v2 files that carry them.
//!
//! On cgroup v1 (and hybrid hosts, as these machines) the limits go to the
//! `cpu`, `memory` and `pids` hierarchies; on pure v2 the controllers are
//! enabled down the tree (`cgroup.subtree_control`) and the v2 files written.

pub mod allocatable;
pub mod limits;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;

use crate::resources::Qos;
pub use limits::Limits;

/// The cgroup of `pod` under the pods' cgroup `pods`: `<pods>/pod<uid>` for
/// Guaranteed, `<pods>/burstable/pod<uid>` and `<pods>/besteffort/pod<uid>`
/// otherwise.
pub fn pod_cgroup(pods: &str, pod: &Pod) -> String {
    let base = pods.trim_end_matches('/');
    let uid = crate::pod::uid(pod);
    match crate::resources::qos(pod) {
        Qos::Guaranteed => format!("{base}/pod{uid}"),
        Qos::Burstable => format!("{base}/burstable/pod{uid}"),
        Qos::BestEffort => format!("{base}/besteffort/pod{uid}"),
    }
}

/// Where the limits are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// cgroup v1: the root of each controller's hierarchy.
    V1 {
        /// `cpu` (often `cpu,cpuacct`).
        cpu: Option<PathBuf>,
        /// `memory`.
        memory: Option<PathBuf>,
        /// `pids`.
        pids: Option<PathBuf>,
    },
    /// Pure cgroup v2 at this root.
    V2(PathBuf),
    /// Nothing is written (the in-process fake runtime's tests).
    Off,
}

impl Layout {
    /// The host's layout: v1 controllers when mounted, else the v2 mount.
    pub fn detect() -> Self {
        let v1 = |c: &str| crate::cgroups::v1_controller_root(c);
        let (cpu, memory, pids) = (v1("cpu"), v1("memory"), v1("pids"));
        if cpu.is_some() || memory.is_some() || pids.is_some() {
            return Self::V1 { cpu, memory, pids };
        }
        crate::cgroups::v2_root().map_or(Self::Off, Self::V2)
    }
}

/// `singleProcessOOMKill: false` where the kernel cannot kill a group.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid configuration: singleProcessOOMKill must not be explicitly set to false when using cgroup v1"
)]
pub struct GroupOomKillOnV1;

/// Whether an OOM kill takes a container's every process (the runtime
/// writes `memory.oom.group`), as upstream decides it: on pure cgroup v2
/// unless `singleProcessOOMKill` is true; never on v1, where asking for it
/// is an error.
///
/// # Errors
/// [`GroupOomKillOnV1`] for `singleProcessOOMKill: false` on cgroup v1.
pub fn group_oom_kill(
    layout: &Layout,
    single_process: Option<bool>,
) -> Result<bool, GroupOomKillOnV1> {
    match layout {
        Layout::V2(_) => Ok(!single_process.unwrap_or(false)),
        Layout::V1 { .. } if single_process == Some(false) => Err(GroupOomKillOnV1),
        Layout::V1 { .. } | Layout::Off => Ok(false),
    }
}

/// Why a cgroup could not be made or limited.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct CgroupError {
    /// The directory or file.
    pub path: PathBuf,
    /// What the kernel said.
    pub source: std::io::Error,
}

/// Keeps the pods' cgroup tree.
#[derive(Debug)]
pub struct CgroupManager {
    layout: Layout,
    /// `<cgroup-root>/kubepods`, as the runtime's `cgroup_parent` names it.
    pods: String,
    /// `podPidsLimit` (≤ 0: none).
    pod_pids_limit: i64,
    /// The burstable tier's shares last written.
    burstable: Mutex<Option<u64>>,
}

impl CgroupManager {
    /// A manager of the tree under `pods_cgroup` in `layout`.
    pub fn new(layout: Layout, pods_cgroup: &str, pod_pids_limit: i64) -> Self {
        Self {
            layout,
            pods: pods_cgroup.trim_end_matches('/').to_owned(),
            pod_pids_limit,
            burstable: Mutex::new(None),
        }
    }

    /// A manager that writes nothing.
    pub fn off() -> Self {
        Self::new(Layout::Off, "/", 0)
    }

    /// The pods' cgroup path (`<cgroup-root>/kubepods`).
    pub fn pods_cgroup(&self) -> &str {
        &self.pods
    }

    /// Makes `kubepods` with `limits` and its QoS tiers (besteffort with the
    /// minimum shares).
    ///
    /// # Errors
    /// The directory or file that could not be made or written.
    pub fn ensure_node(&self, limits: &Limits) -> Result<(), CgroupError> {
        self.ensure(&self.pods, limits)?;
        self.ensure(
            &format!("{}/besteffort", self.pods),
            &Limits {
                cpu_shares: Some(limits::MIN_SHARES),
                ..Limits::default()
            },
        )?;
        self.ensure(&format!("{}/burstable", self.pods), &Limits::default())
    }

    /// The pod's cgroup (`kubepods/burstable/pod<uid>`, ...), as its sandbox's
    /// `cgroup_parent`.
    pub fn pod_cgroup(&self, pod: &Pod) -> String {
        pod_cgroup(&self.pods, pod)
    }

    /// Makes the pod's cgroup with the limits its spec asks for.
    ///
    /// # Errors
    /// The directory or file that could not be made or written.
    pub fn ensure_pod(&self, pod: &Pod) -> Result<(), CgroupError> {
        self.ensure(
            &self.pod_cgroup(pod),
            &limits::for_pod(pod, self.pod_pids_limit),
        )
    }

    /// Sets the burstable tier's shares from the active pods' requests, when
    /// they changed.
    ///
    /// # Errors
    /// The file that could not be written.
    pub fn update_qos<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> Result<(), CgroupError> {
        let shares = limits::burstable_shares(pods);
        let mut last = crate::lock::lock(&self.burstable);
        if *last == Some(shares) {
            return Ok(());
        }
        self.ensure(
            &format!("{}/burstable", self.pods),
            &Limits {
                cpu_shares: Some(shares),
                ..Limits::default()
            },
        )?;
        *last = Some(shares);
        Ok(())
    }

    /// Makes `path` in every hierarchy and writes `limits`.
    fn ensure(&self, path: &str, limits: &Limits) -> Result<(), CgroupError> {
        let rel = path.trim_start_matches('/');
        match &self.layout {
            Layout::Off => Ok(()),
            Layout::V1 { cpu, memory, pids } => {
                for root in [cpu, memory, pids].into_iter().flatten() {
                    mkdir(&root.join(rel))?;
                }
                for (controller, file, value) in limits::v1_files(limits) {
                    let root = match controller {
                        "cpu" => cpu,
                        "memory" => memory,
                        _ => pids,
                    };
                    if let Some(root) = root {
                        write(&root.join(rel).join(file), &value)?;
                    }
                }
                Ok(())
            }
            Layout::V2(root) => {
                // Each ancestor hands its children the controllers the files need.
                let mut dir = root.clone();
                for part in Path::new(rel).components() {
                    enable_controllers(&dir)?;
                    dir.push(part);
                    mkdir(&dir)?;
                }
                for (_, file, value) in limits::v2_files(limits) {
                    write(&dir.join(file), &value)?;
                }
                Ok(())
            }
        }
    }
}

fn mkdir(dir: &Path) -> Result<(), CgroupError> {
    std::fs::create_dir_all(dir).map_err(|source| CgroupError {
        path: dir.to_owned(),
        source,
    })
}

fn write(file: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(file, value).map_err(|source| CgroupError {
        path: file.to_owned(),
        source,
    })
}

/// Enables `cpu`, `memory` and `pids` for `dir`'s children where `dir` has them.
fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let available = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    let missing: Vec<String> = ["cpu", "memory", "pids"]
        .into_iter()
        .filter(|c| {
            available.split_whitespace().any(|a| a == *c)
                && !enabled.split_whitespace().any(|e| e == *c)
        })
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    write(&dir.join("cgroup.subtree_control"), &missing.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1-shaped tree in a temporary directory (plain files stand in for
    /// the kernel's).
    #[test]
    fn the_tree_and_the_files_land_where_the_runtime_expects_them() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = |c: &str| Some(dir.path().join(c));
        let m = CgroupManager::new(
            Layout::V1 {
                cpu: root("cpu"),
                memory: root("memory"),
                pids: root("pids"),
            },
            "/evlet/kubepods/",
            100,
        );
        m.ensure_node(&Limits {
            cpu_shares: Some(2048),
            memory: Some(1 << 30),
            ..Limits::default()
        })
        .expect("node");
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).expect(p);
        assert_eq!(read("cpu/evlet/kubepods/cpu.shares"), "2048");
        assert_eq!(
            read("memory/evlet/kubepods/memory.limit_in_bytes"),
            "1073741824"
        );
        assert_eq!(read("cpu/evlet/kubepods/besteffort/cpu.shares"), "2");
        let pod: Pod = serde_yaml::from_str(
            "metadata: {name: p, uid: u1}\nspec:\n  containers:\n  - {name: a, image: i, resources: {requests: {cpu: 100m}, limits: {memory: 64Mi}}}\n",
        )
        .expect("pod");
        assert_eq!(m.pod_cgroup(&pod), "/evlet/kubepods/burstable/podu1");
        m.ensure_pod(&pod).expect("pod cgroup");
        assert_eq!(read("cpu/evlet/kubepods/burstable/podu1/cpu.shares"), "102");
        assert_eq!(
            read("memory/evlet/kubepods/burstable/podu1/memory.limit_in_bytes"),
            "67108864"
        );
        assert_eq!(read("pids/evlet/kubepods/burstable/podu1/pids.max"), "100");
        m.update_qos([&pod]).expect("qos");
        assert_eq!(read("cpu/evlet/kubepods/burstable/cpu.shares"), "102");
    }

    #[test]
    fn on_v2_the_controllers_are_enabled_down_the_tree() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(
            dir.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids",
        )
        .expect("w");
        std::fs::write(dir.path().join("cgroup.subtree_control"), "cpu").expect("w");
        let m = CgroupManager::new(Layout::V2(dir.path().to_owned()), "/kubepods", 0);
        let pod: Pod = serde_yaml::from_str(
            "metadata: {name: p, uid: u2}\nspec:\n  containers:\n  - {name: a, image: i, resources: {limits: {cpu: 500m, memory: 64Mi}}}\n",
        )
        .expect("pod");
        m.ensure_pod(&pod).expect("pod cgroup");
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).expect(p);
        assert_eq!(read("cgroup.subtree_control"), "+memory +pids");
        assert_eq!(read("kubepods/podu2/cpu.max"), "50000 100000");
        assert_eq!(read("kubepods/podu2/memory.max"), "67108864");
        assert_eq!(read("kubepods/podu2/cpu.weight"), "20");
    }

    #[test]
    fn a_group_oom_kill_is_upstreams_default_on_v2_only() {
        let v1 = Layout::V1 {
            cpu: None,
            memory: None,
            pids: None,
        };
        let v2 = Layout::V2(PathBuf::from("/sys/fs/cgroup"));
        assert!(!group_oom_kill(&v1, None).expect("v1 default"));
        assert!(!group_oom_kill(&v1, Some(true)).expect("v1 single"));
        assert_eq!(
            group_oom_kill(&v1, Some(false)).map_err(|e| e.to_string()),
            Err("invalid configuration: singleProcessOOMKill must not be explicitly set to false when using cgroup v1".to_owned())
        );
        assert!(group_oom_kill(&v2, None).expect("v2 default"));
        assert!(group_oom_kill(&v2, Some(false)).expect("v2 group"));
        assert!(!group_oom_kill(&v2, Some(true)).expect("v2 single"));
    }
}
