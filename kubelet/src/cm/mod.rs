//! The pods' cgroup tree, as upstream's container manager keeps it:
//! `<cgroup-root>/kubepods` limited to node allocatable, the QoS tiers
//! `kubepods/burstable` and `kubepods/besteffort`, and one cgroup per pod
//! (`kubepods/pod<uid>` for Guaranteed, under its tier otherwise) with the
//! limits its spec asks for, made before its sandbox. The runtime creates the
//! containers' cgroups below them.
//!
//! * [`allocatable`] (pure): capacity minus `kubeReserved`, `systemReserved`
//!   and the hard eviction thresholds.
//! * [`limits`] (pure): the limits of the pods' cgroup, of each pod and of the
//!   burstable tier, and the v1 and v2 files that carry them.
//! * [`systemd`]: the systemd driver's slice names (pure) and its D-Bus client.
//!
//! With the cgroupfs driver evlet makes the directories and writes the files:
//! on cgroup v1 (and hybrid hosts, as these machines) to the `cpu`, `memory`
//! and `pids` hierarchies; on pure v2 the controllers are enabled down the
//! tree (`cgroup.subtree_control`) and the v2 files written. With the systemd
//! driver (pure v2 only) systemd makes each cgroup as a slice unit with the
//! limits as its properties.

pub mod allocatable;
pub mod limits;
pub mod systemd;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;

use crate::resources::Qos;
pub use limits::Limits;

/// How cgroups are named and made (`cgroupDriver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Driver {
    /// Directories in the cgroup filesystems, made by evlet.
    #[default]
    Cgroupfs,
    /// Slice units, made by systemd over D-Bus.
    Systemd,
}

impl Driver {
    /// The configuration's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cgroupfs => "cgroupfs",
            Self::Systemd => "systemd",
        }
    }

    /// Parses `cgroupDriver`.
    ///
    /// # Errors
    /// Upstream's message for any other value.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "cgroupfs" => Ok(Self::Cgroupfs),
            "systemd" => Ok(Self::Systemd),
            other => Err(format!(
                "cgroupDriver: Unsupported value {other:?}: supported values: \"cgroupfs\", \"systemd\""
            )),
        }
    }
}

/// The paths of the pods' cgroups under a driver (pure): upstream's cgroup
/// names (`cgroupRoot`'s parts, then `kubepods`, the QoS tier, `pod<uid>`) as
/// the driver spells them. Each path is relative to a hierarchy's root and is
/// also what the runtime gets as `cgroup_parent`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Names {
    driver: Driver,
    /// `cgroupRoot`'s parts (a cgroupfs path, as upstream reads it).
    root: Vec<String>,
}

impl Names {
    /// The names under `cgroup_root` (a cgroupfs path such as `/`).
    pub fn new(driver: Driver, cgroup_root: &str) -> Self {
        Self {
            driver,
            root: cgroup_root
                .split('/')
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }

    /// The driver.
    pub fn driver(&self) -> Driver {
        self.driver
    }

    fn path(&self, parts: &[&str]) -> String {
        let all: Vec<&str> = self
            .root
            .iter()
            .map(String::as_str)
            .chain(parts.iter().copied())
            .collect();
        match self.driver {
            Driver::Cgroupfs => format!("/{}", all.join("/")),
            Driver::Systemd => systemd::slice_path(&all),
        }
    }

    /// The pods' cgroup (`/kubepods`, `/kubepods.slice`).
    pub fn pods(&self) -> String {
        self.path(&["kubepods"])
    }

    /// A QoS tier's cgroup (`/kubepods/burstable`,
    /// `/kubepods.slice/kubepods-burstable.slice`).
    pub fn tier(&self, tier: &str) -> String {
        self.path(&["kubepods", tier])
    }

    /// The cgroup of `pod`: `kubepods/pod<uid>` for Guaranteed,
    /// `kubepods/burstable/pod<uid>` and `kubepods/besteffort/pod<uid>`
    /// otherwise, as the driver spells them.
    pub fn pod(&self, pod: &Pod) -> String {
        self.pod_in(crate::resources::qos(pod), &crate::pod::uid(pod).0)
    }

    fn pod_in(&self, qos: Qos, uid: &str) -> String {
        let leaf = format!("pod{uid}");
        match qos {
            Qos::Guaranteed => self.path(&["kubepods", &leaf]),
            Qos::Burstable => self.path(&["kubepods", "burstable", &leaf]),
            Qos::BestEffort => self.path(&["kubepods", "besteffort", &leaf]),
        }
    }

    /// Every cgroup the pod `uid` may have, one per QoS class: where to look
    /// for the cgroup of a pod whose spec is unknown (an orphan found in the
    /// runtime) or changed class.
    pub fn pod_placements(&self, uid: &str) -> [String; 3] {
        [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort].map(|q| self.pod_in(q, uid))
    }

    /// The cgroups that hold pods' cgroups: the pods' own (Guaranteed pods
    /// are in it) and the two tiers.
    pub fn pod_parents(&self) -> [String; 3] {
        [self.pods(), self.tier("burstable"), self.tier("besteffort")]
    }

    /// The UID of the pod whose cgroup `leaf` is, a directory found in
    /// `parent` (one of [`Self::pod_parents`]): `pod<uid>`, with the systemd
    /// driver `<parent's name>-pod<uid>.slice`. None for anything else (a
    /// tier, a cgroup not made for a pod).
    pub fn pod_uid_of(&self, parent: &str, leaf: &str) -> Option<String> {
        let uid = match self.driver {
            Driver::Cgroupfs => leaf.strip_prefix("pod")?.to_owned(),
            Driver::Systemd => leaf
                .strip_suffix(".slice")?
                .rsplit_once("-pod")?
                .1
                .replace('_', "-"),
        };
        let path = format!("{}/{leaf}", parent.trim_end_matches('/'));
        (!uid.is_empty() && self.pod_placements(&uid).contains(&path)).then_some(uid)
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
pub enum CgroupError {
    /// A directory or file of the cgroup filesystem (cgroupfs driver).
    #[error("{path}: {source}")]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// systemd refused or failed (systemd driver).
    #[error(transparent)]
    Systemd(Box<systemd::SystemdError>),
    /// A cgroup that could not be removed yet (cgroupfs driver).
    #[error(transparent)]
    Busy(crate::cgroups::RemoveError),
}

impl From<systemd::SystemdError> for CgroupError {
    fn from(e: systemd::SystemdError) -> Self {
        Self::Systemd(Box::new(e))
    }
}

/// Keeps the pods' cgroup tree.
#[derive(Debug)]
pub struct CgroupManager {
    layout: Layout,
    names: Names,
    /// The systemd driver's connection (None: cgroupfs).
    systemd: Option<systemd::Systemd>,
    /// `podPidsLimit` (≤ 0: none).
    pod_pids_limit: i64,
    /// The burstable tier's shares last written.
    burstable: Mutex<Option<u64>>,
}

impl CgroupManager {
    /// A manager of the tree `names` spells in `layout`; `systemd` makes the
    /// cgroups when given (the systemd driver), else evlet does.
    pub fn new(
        layout: Layout,
        names: Names,
        systemd: Option<systemd::Systemd>,
        pod_pids_limit: i64,
    ) -> Self {
        Self {
            layout,
            names,
            systemd,
            pod_pids_limit,
            burstable: Mutex::new(None),
        }
    }

    /// A manager that writes nothing.
    pub fn off() -> Self {
        Self::new(Layout::Off, Names::default(), None, 0)
    }

    /// The names of the pods' cgroups.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// Makes `kubepods` with `limits` and its QoS tiers (besteffort with the
    /// minimum shares).
    ///
    /// # Errors
    /// The cgroup that could not be made or limited.
    pub async fn ensure_node(&self, limits: &Limits) -> Result<(), CgroupError> {
        self.ensure(&self.names.pods(), limits).await?;
        self.ensure(
            &self.names.tier("besteffort"),
            &Limits {
                cpu_shares: Some(limits::MIN_SHARES),
                ..Limits::default()
            },
        )
        .await?;
        self.ensure(&self.names.tier("burstable"), &Limits::default())
            .await
    }

    /// Makes the pod's cgroup with the limits its spec asks for.
    ///
    /// # Errors
    /// The cgroup that could not be made or limited.
    pub async fn ensure_pod(&self, pod: &Pod) -> Result<(), CgroupError> {
        self.ensure(
            &self.names.pod(pod),
            &limits::for_pod(pod, self.pod_pids_limit),
        )
        .await
    }

    /// Removes the pod's cgroup (the runtime removes the containers' below),
    /// wherever its QoS class put it: an orphan's spec, rebuilt from the
    /// runtime, carries no resources to tell.
    ///
    /// # Errors
    /// A cgroup still there (a container's the runtime has not removed yet,
    /// or a process not yet gone): the caller tries again.
    pub async fn remove_pod(&self, pod: &Pod) -> Result<(), CgroupError> {
        self.remove_uid(&crate::pod::uid(pod).0).await
    }

    /// [`Self::remove_pod`] for the pod `uid`.
    ///
    /// # Errors
    /// As [`Self::remove_pod`].
    pub async fn remove_uid(&self, uid: &str) -> Result<(), CgroupError> {
        if matches!(self.layout, Layout::Off) {
            return Ok(());
        }
        let mut first = Ok(());
        for path in self.names.pod_placements(uid) {
            let removed = match &self.systemd {
                Some(systemd) => {
                    // systemd stops the units in a slice, not a process
                    // someone moved into it: those are killed first.
                    crate::cgroups::kill(&path);
                    systemd.stop(&path).await.map_err(CgroupError::from)
                }
                None => crate::cgroups::remove(&path).map_err(CgroupError::Busy),
            };
            if first.is_ok() {
                first = removed;
            }
        }
        first
    }

    /// Where the pods' cgroups are read: the memory hierarchy on v1.
    fn listing_root(&self) -> Option<&Path> {
        match &self.layout {
            Layout::V1 { cpu, memory, pids } => memory.as_ref().or(cpu.as_ref()).or(pids.as_ref()),
            Layout::V2(root) => Some(root),
            Layout::Off => None,
        }
        .map(PathBuf::as_path)
    }

    /// Whether a process still runs in the cgroup of the pod `uid`.
    pub fn pod_has_processes(&self, uid: &str) -> bool {
        self.listing_root().is_some_and(|root| {
            self.names
                .pod_placements(uid)
                .iter()
                .any(|p| crate::cgroups::has_processes(&root.join(p.trim_start_matches('/'))))
        })
    }

    /// The UIDs of the pods that have a cgroup.
    pub fn pod_uids(&self) -> Vec<String> {
        let Some(root) = self.listing_root() else {
            return Vec::new();
        };
        let mut uids = Vec::new();
        for parent in self.names.pod_parents() {
            let Ok(entries) = std::fs::read_dir(root.join(parent.trim_start_matches('/'))) else {
                continue;
            };
            uids.extend(
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter_map(|e| self.names.pod_uid_of(&parent, e.file_name().to_str()?)),
            );
        }
        uids
    }

    /// Sets the burstable tier's shares from the active pods' requests, when
    /// they changed.
    ///
    /// # Errors
    /// The cgroup that could not be limited.
    pub async fn update_qos<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a Pod>,
    ) -> Result<(), CgroupError> {
        let shares = limits::burstable_shares(pods);
        if *crate::lock::lock(&self.burstable) == Some(shares) {
            return Ok(());
        }
        self.ensure(
            &self.names.tier("burstable"),
            &Limits {
                cpu_shares: Some(shares),
                ..Limits::default()
            },
        )
        .await?;
        *crate::lock::lock(&self.burstable) = Some(shares);
        Ok(())
    }

    /// Makes `path` and limits it: through systemd with that driver, else in
    /// every hierarchy.
    async fn ensure(&self, path: &str, limits: &Limits) -> Result<(), CgroupError> {
        if matches!(self.layout, Layout::Off) {
            return Ok(());
        }
        if let Some(systemd) = &self.systemd {
            return Ok(systemd.ensure(path, limits).await?);
        }
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
    std::fs::create_dir_all(dir).map_err(|source| CgroupError::Io {
        path: dir.to_owned(),
        source,
    })
}

fn write(file: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(file, value).map_err(|source| CgroupError::Io {
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
    #[tokio::test]
    async fn the_tree_and_the_files_land_where_the_runtime_expects_them() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = |c: &str| Some(dir.path().join(c));
        let m = CgroupManager::new(
            Layout::V1 {
                cpu: root("cpu"),
                memory: root("memory"),
                pids: root("pids"),
            },
            Names::new(Driver::Cgroupfs, "/evlet/"),
            None,
            100,
        );
        m.ensure_node(&Limits {
            cpu_shares: Some(2048),
            memory: Some(1 << 30),
            ..Limits::default()
        })
        .await
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
        assert_eq!(m.names().pod(&pod), "/evlet/kubepods/burstable/podu1");
        m.ensure_pod(&pod).await.expect("pod cgroup");
        assert_eq!(read("cpu/evlet/kubepods/burstable/podu1/cpu.shares"), "102");
        assert_eq!(
            read("memory/evlet/kubepods/burstable/podu1/memory.limit_in_bytes"),
            "67108864"
        );
        assert_eq!(read("pids/evlet/kubepods/burstable/podu1/pids.max"), "100");
        m.update_qos([&pod]).await.expect("qos");
        assert_eq!(read("cpu/evlet/kubepods/burstable/cpu.shares"), "102");
        // The pods with a cgroup are found by their directories' names.
        std::fs::create_dir_all(dir.path().join("memory/evlet/kubepods/podu3")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("memory/evlet/kubepods/besteffort/x"))
            .expect("mkdir");
        let mut uids = m.pod_uids();
        uids.sort();
        assert_eq!(uids, ["u1", "u3"]);
    }

    #[test]
    fn a_pods_cgroup_names_its_uid_under_either_driver() {
        let uid = "0b5c2e1a-8d3f-4e2b-9c1d-7f6e5d4c3b2a";
        for driver in [Driver::Cgroupfs, Driver::Systemd] {
            let names = Names::new(driver, "/evlet-node/");
            for (parent, path) in names.pod_parents().iter().zip(names.pod_placements(uid)) {
                let leaf = path.rsplit('/').next().expect("leaf");
                assert_eq!(
                    names.pod_uid_of(parent, leaf).as_deref(),
                    Some(uid),
                    "{path}"
                );
            }
            assert_eq!(names.pod_uid_of(&names.pods(), "pod"), None);
            assert_eq!(names.pod_uid_of(&names.pods(), "burstable"), None);
            assert_eq!(
                names.pod_uid_of(&names.tier("burstable"), "system.slice"),
                None
            );
        }
        let systemd = Names::new(Driver::Systemd, "/");
        assert_eq!(
            systemd.pod_uid_of(
                "/kubepods.slice/kubepods-besteffort.slice",
                "kubepods-burstable-podab_cd.slice"
            ),
            None,
            "a burstable pod's name under the besteffort tier"
        );
    }

    #[tokio::test]
    async fn on_v2_the_controllers_are_enabled_down_the_tree() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(
            dir.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids",
        )
        .expect("w");
        std::fs::write(dir.path().join("cgroup.subtree_control"), "cpu").expect("w");
        let m = CgroupManager::new(
            Layout::V2(dir.path().to_owned()),
            Names::new(Driver::Cgroupfs, "/"),
            None,
            0,
        );
        let pod: Pod = serde_yaml::from_str(
            "metadata: {name: p, uid: u2}\nspec:\n  containers:\n  - {name: a, image: i, resources: {limits: {cpu: 500m, memory: 64Mi}}}\n",
        )
        .expect("pod");
        m.ensure_pod(&pod).await.expect("pod cgroup");
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).expect(p);
        assert_eq!(read("cgroup.subtree_control"), "+memory +pids");
        assert_eq!(read("kubepods/podu2/cpu.max"), "50000 100000");
        assert_eq!(read("kubepods/podu2/memory.max"), "67108864");
        assert_eq!(read("kubepods/podu2/cpu.weight"), "59");
    }

    #[test]
    fn each_driver_spells_the_pods_cgroups_as_upstream() {
        let pod = |qos: &str| -> Pod {
            serde_yaml::from_str(&format!(
                "metadata: {{name: p, uid: 12-ab}}\nspec:\n  containers:\n  - {{name: a, image: i{qos}}}\n"
            ))
            .expect("pod")
        };
        let guaranteed = pod(", resources: {limits: {cpu: '1', memory: 1Gi}}");
        let burstable = pod(", resources: {requests: {cpu: '1'}}");
        let best_effort = pod("");
        let fs = Names::new(Driver::Cgroupfs, "/");
        assert_eq!(fs.pods(), "/kubepods");
        assert_eq!(fs.pod(&guaranteed), "/kubepods/pod12-ab");
        assert_eq!(fs.pod(&burstable), "/kubepods/burstable/pod12-ab");
        let sd = Names::new(Driver::Systemd, "/");
        assert_eq!(sd.pods(), "/kubepods.slice");
        assert_eq!(
            sd.tier("besteffort"),
            "/kubepods.slice/kubepods-besteffort.slice"
        );
        assert_eq!(
            sd.pod(&guaranteed),
            "/kubepods.slice/kubepods-pod12_ab.slice"
        );
        assert_eq!(
            sd.pod(&burstable),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_ab.slice"
        );
        assert_eq!(
            sd.pod(&best_effort),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_ab.slice"
        );
        assert_eq!(
            sd.pod_placements("12-ab"),
            [
                sd.pod(&guaranteed),
                sd.pod(&burstable),
                sd.pod(&best_effort)
            ]
        );
        // A cgroup root's parts lead every name.
        let nested = Names::new(Driver::Systemd, "/evlet-node/w1");
        assert_eq!(
            nested.pods(),
            "/evlet_node.slice/evlet_node-w1.slice/evlet_node-w1-kubepods.slice"
        );
        assert_eq!(
            Names::new(Driver::Cgroupfs, "/evlet-node/w1/").pods(),
            "/evlet-node/w1/kubepods"
        );
        assert_eq!(Driver::parse("systemd"), Ok(Driver::Systemd));
        assert!(Driver::parse("Systemd").is_err());
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
