//! [`CgroupMap`]: which pod and container a cgroup v2 ID belongs to, and
//! which process is each container's init (invariant 9: only the init's exit
//! says a container stopped).
//!
//! Paths are parsed from cgroupfs (`.../pod<uid>/<id>`) and systemd
//! (`...-pod<uid>.slice/cri-containerd-<id>.scope`) layouts. The init is the
//! first process that exec'd in the container's cgroup, or, for containers
//! found by the start-up scan, the process that is PID 1 of its namespace.

use std::collections::HashMap;
use std::path::Path;

use crate::pod::PodUid;

/// What a cgroup belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The pod.
    pub uid: PodUid,
    /// The container (or sandbox) ID; `None` for the pod's own cgroup.
    pub container: Option<String>,
    /// The container's init process (TGID), once known.
    pub init: Option<u32>,
    /// The init is certain: PID 1 of its own PID namespace (not merely the
    /// first process that exec'd in the cgroup).
    pub init_exact: bool,
    /// The cgroup's path (relative to the cgroup2 mount; the same in every
    /// hierarchy with the cgroupfs driver).
    pub path: String,
}

/// Parses a cgroup path into pod UID and container ID (cgroupfs or systemd layout).
pub fn parse_path(path: &str) -> Option<(PodUid, Option<String>)> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (i, uid) =
        (1..parts.len()).find_map(|i| pod_segment(&parts[..i], parts[i]).map(|u| (i, u)))?;
    let container = parts.get(i + 1).map(|c| {
        let c = c.strip_suffix(".scope").unwrap_or(c);
        c.rsplit_once('-').map_or(c, |(_, id)| id).to_owned()
    });
    Some((PodUid(uid), container))
}

/// The UID of the pod whose cgroup `segment` is, below the path `above`
/// (the pods' cgroup or a QoS tier's), as upstream names it: cgroupfs
/// `kubepods[/burstable|/besteffort]/pod<uid>`, where the UID is taken whole
/// (even one with `-pod` in it); systemd `<parent's name>-pod<uid>.slice`
/// inside that parent slice, the UID's dashes escaped as `_`.
fn pod_segment(above: &[&str], segment: &str) -> Option<String> {
    let parent = *above.last()?;
    let uid = match segment.strip_suffix(".slice") {
        Some(stem) => {
            let (prefix, uid) = stem.rsplit_once("-pod")?;
            (parent.strip_suffix(".slice")? == prefix).then(|| uid.replace('_', "-"))?
        }
        None => {
            let tiered = matches!(parent, "burstable" | "besteffort")
                && above.len() >= 2
                && above[above.len() - 2] == "kubepods";
            (parent == "kubepods" || tiered)
                .then(|| segment.strip_prefix("pod"))??
                .to_owned()
        }
    };
    (!uid.is_empty()).then_some(uid)
}

/// What a process exit in a pod's cgroup means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitHint {
    /// The container's init exited: the container stopped.
    Init {
        /// The pod.
        uid: PodUid,
        /// The container (or sandbox) ID.
        container: String,
        /// Certain (the init is its PID namespace's PID 1): the kernel's
        /// record may go into the status before the runtime confirms it.
        exact: bool,
    },
    /// A process exited in a container whose init has not exec'd yet: worth a
    /// relist, but it says nothing certain about the container.
    BeforeInit(PodUid),
}

/// cgroup v2 ID → owner.
#[derive(Debug, Default)]
pub struct CgroupMap {
    by_id: HashMap<u64, Owner>,
}

impl CgroupMap {
    /// Records a cgroup at `path` (relative to the cgroup2 mount).
    pub fn insert(&mut self, id: u64, path: &str) -> Option<&Owner> {
        let (uid, container) = parse_path(path)?;
        self.by_id.insert(
            id,
            Owner {
                uid,
                container,
                init: None,
                init_exact: false,
                path: path.to_owned(),
            },
        );
        self.by_id.get(&id)
    }

    /// Forgets a cgroup.
    pub fn remove(&mut self, id: u64) -> Option<Owner> {
        self.by_id.remove(&id)
    }

    /// The owner of a cgroup.
    pub fn get(&self, id: u64) -> Option<&Owner> {
        self.by_id.get(&id)
    }

    /// Notes an exec in a container cgroup: the first PID-namespace init to
    /// exec is the container's init for certain; until one does, the first
    /// process inside a (non-initial) PID namespace to exec is presumed to be
    /// (containers sharing the pod's PID namespace have no init of their own).
    /// Processes of the initial PID namespace (runc's set-up stages, hostPID
    /// containers) are never taken for an init.
    pub fn exec(&mut self, id: u64, tgid: u32, pid_ns: bool, ns_init: bool) {
        if let Some(o) = self.by_id.get_mut(&id)
            && o.container.is_some()
            && !o.init_exact
            && pid_ns
            && (o.init.is_none() || ns_init)
        {
            o.init = Some(tgid);
            o.init_exact = ns_init;
        }
    }

    /// What a process exit in cgroup `id` means (invariant 9): the init of a
    /// container died (`exact` if it was the container's PID-namespace init and
    /// exits as one), a process of a container whose init is not known yet
    /// exited (runc's set-up stages do, before the entrypoint's exec), or
    /// nothing (`None`: noise, or not a container's cgroup).
    pub fn exit_hint(&self, id: u64, tgid: u32, ns_init: bool) -> Option<ExitHint> {
        let o = self.by_id.get(&id)?;
        let container = o.container.as_ref()?;
        match o.init {
            Some(init) if init == tgid => Some(ExitHint::Init {
                uid: o.uid.clone(),
                container: container.clone(),
                exact: o.init_exact && ns_init,
            }),
            Some(_) => None,
            None => Some(ExitHint::BeforeInit(o.uid.clone())),
        }
    }
}

/// The PID-1-of-its-namespace process in a cgroup (a container's init); of
/// several (a nested PID namespace inside the container), the shallowest.
pub fn namespace_init(dir: &Path) -> Option<u32> {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).ok()?;
    procs
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let levels: Vec<&str> = status
                .lines()
                .find(|l| l.starts_with("NSpid:"))?
                .split_whitespace()
                .skip(1)
                .collect();
            (levels.len() > 1 && levels.last() == Some(&"1")).then_some((levels.len(), pid))
        })
        .min()
        .map(|(_, pid)| pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroupfs_and_systemd_paths_name_pod_and_container() {
        assert_eq!(
            parse_path("/kubepods/burstable/pod1234-ab/c0ffee"),
            Some((PodUid::from("1234-ab"), Some("c0ffee".into())))
        );
        assert_eq!(
            parse_path("/evlet-node-16/kubepods/podu1"),
            Some((PodUid::from("u1"), None))
        );
        assert_eq!(
            parse_path(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice/cri-containerd-abc.scope"
            ),
            Some((PodUid::from("12-34"), Some("abc".into())))
        );
        assert_eq!(parse_path("/kubepods/burstable"), None);
        // A UID with `-pod` in it (the mock API server's; a static pod's
        // own `metadata.uid` can be any string) is taken whole.
        assert_eq!(
            parse_path("/e2e1-0/kubepods/besteffort/pod0b80-0003-mock-pods/c1"),
            Some((PodUid::from("0b80-0003-mock-pods"), Some("c1".into())))
        );
        assert_eq!(
            parse_path(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b80_0003_mock_pods.slice/cri-containerd-c1.scope"
            ),
            Some((PodUid::from("0b80-0003-mock-pods"), Some("c1".into())))
        );
        assert_eq!(
            parse_path(
                "/evlet_node.slice/evlet_node-kubepods.slice/evlet_node-kubepods-podu1.slice"
            ),
            Some((PodUid::from("u1"), None))
        );
        // Outside the pods' tree nothing is a pod's cgroup.
        assert_eq!(parse_path("/podman/c1"), None);
        assert_eq!(parse_path("/system.slice/podman-pod1.slice/c1"), None);
        assert_eq!(parse_path("/x/burstable/pod1/c1"), None);
    }

    #[test]
    fn only_the_init_exit_is_a_hint() {
        let mut map = CgroupMap::default();
        map.insert(7, "/kubepods/podu/c1");
        assert_eq!(
            map.exit_hint(7, 99, false),
            Some(ExitHint::BeforeInit(PodUid::from("u"))),
            "init unknown (runc's set-up stages): a plain hint, not the container's death"
        );
        map.exec(7, 80, false, false);
        assert_eq!(
            map.exit_hint(7, 80, false),
            Some(ExitHint::BeforeInit(PodUid::from("u"))),
            "runc's set-up stages (initial PID namespace) are never the init"
        );
        map.exec(7, 90, true, false);
        map.exec(7, 100, true, true);
        map.exec(7, 200, true, false);
        map.exec(7, 300, true, true);
        assert_eq!(
            map.exit_hint(7, 90, false),
            None,
            "a presumed init replaced by the real one"
        );
        assert_eq!(
            map.exit_hint(7, 200, false),
            None,
            "a later exec's exit is noise"
        );
        assert_eq!(
            map.exit_hint(7, 300, true),
            None,
            "a nested PID namespace's init is not the container's"
        );
        assert_eq!(
            map.exit_hint(7, 100, true),
            Some(ExitHint::Init {
                uid: PodUid::from("u"),
                container: "c1".into(),
                exact: true
            })
        );
        map.insert(9, "/kubepods/podu/shared");
        map.exec(9, 400, true, false);
        assert_eq!(
            map.exit_hint(9, 400, false),
            Some(ExitHint::Init {
                uid: PodUid::from("u"),
                container: "shared".into(),
                exact: false
            }),
            "a shared PID namespace: presumed, for the runtime to confirm"
        );
        map.insert(8, "/kubepods/podu");
        assert_eq!(
            map.exit_hint(8, 1, true),
            None,
            "the pod's own cgroup has no init"
        );
    }
}
