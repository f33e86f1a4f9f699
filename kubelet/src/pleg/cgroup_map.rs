//! [`CgroupMap`]: which pod and container a cgroup v2 ID belongs to, and
//! which process is each container's init (invariant 9: only the init's exit
//! says a container stopped).
//!
//! Paths are parsed from cgroupfs (`.../pod<uid>/<id>`) and systemd
//! (`...-pod<uid>.slice/cri-containerd-<id>.scope`) layouts. A cgroup below a
//! container's own (Docker-in-Docker, a kind node, systemd or a runtime in a
//! container) is *nested*: it belongs to that container, but nothing in it is
//! taken for the container's init, and its removal says nothing.
//!
//! **Which process is the init is the runtime's word** ([`CgroupMap::bind`]:
//! the PID the runtime reports for the running container, with its start,
//! read once when a relist first shows it running). Only the exit of that very
//! process is the container's certain end. Until the runtime has named it, the
//! first process that exec'd in a PID namespace other than the initial one, at
//! the container cgroup's own depth, is *presumed* to be the init: its exit is
//! a hint the runtime decides. A presumption is never upgraded by a later
//! process, whatever PID namespace it heads (unshare, bwrap, a sandbox).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::process::Process;
use crate::pod::PodUid;

/// What a cgroup belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The pod.
    pub uid: PodUid,
    /// The container (or sandbox) ID; `None` for the pod's own cgroup.
    pub container: Option<String>,
    /// The cgroup is below the container's own (made inside the container).
    pub nested: bool,
    /// The presumed init (TGID): the first process that exec'd here in a PID
    /// namespace other than the initial one (own depth only).
    pub presumed: Option<u32>,
    /// The cgroup's path (relative to the cgroup2 mount; the same in every
    /// hierarchy with the cgroupfs driver).
    pub path: String,
}

/// Where a cgroup path lies in the pods' tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The pod.
    pub uid: PodUid,
    /// The container (or sandbox) ID; `None` for the pod's own cgroup.
    pub container: Option<String>,
    /// Deeper than the container's own cgroup.
    pub nested: bool,
}

/// Parses a cgroup path into pod UID and container ID (cgroupfs or systemd
/// layout), and whether it lies below the container's own cgroup.
pub fn parse_path(path: &str) -> Option<Place> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (i, uid) =
        (1..parts.len()).find_map(|i| pod_segment(&parts[..i], parts[i]).map(|u| (i, u)))?;
    let container = parts.get(i + 1).map(|c| {
        let c = c.strip_suffix(".scope").unwrap_or(c);
        c.rsplit_once('-').map_or(c, |(_, id)| id).to_owned()
    });
    Some(Place {
        uid: PodUid(uid),
        container,
        nested: parts.len() > i + 2,
    })
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
        /// Certain (the process the runtime named as the init): the kernel's
        /// record may go into the status before the runtime confirms it.
        exact: bool,
    },
    /// A process exited in a container whose init has not exec'd yet: worth a
    /// relist, but it says nothing certain about the container.
    BeforeInit(PodUid),
}

/// cgroup v2 ID → owner, and container ID → its init as the runtime names it.
#[derive(Debug, Default)]
pub struct CgroupMap {
    by_id: HashMap<u64, Owner>,
    /// The runtime's init of each container (or sandbox) it showed running;
    /// `None`: the runtime named none that lives (the presumption stands).
    inits: HashMap<String, Option<Process>>,
}

impl CgroupMap {
    /// Records a cgroup at `path` (relative to the cgroup2 mount).
    pub fn insert(&mut self, id: u64, path: &str) -> Option<&Owner> {
        let Place {
            uid,
            container,
            nested,
        } = parse_path(path)?;
        self.by_id.insert(
            id,
            Owner {
                uid,
                container,
                nested,
                presumed: None,
                path: path.to_owned(),
            },
        );
        self.by_id.get(&id)
    }

    /// Forgets a cgroup; the runtime's init of a container whose own cgroup
    /// it was goes with it.
    pub fn remove(&mut self, id: u64) -> Option<Owner> {
        let owner = self.by_id.remove(&id)?;
        if !owner.nested
            && let Some(container) = &owner.container
        {
            self.inits.remove(container);
        }
        Some(owner)
    }

    /// The owner of a cgroup.
    pub fn get(&self, id: u64) -> Option<&Owner> {
        self.by_id.get(&id)
    }

    /// Notes an exec in cgroup `id`: until the runtime names the init, the
    /// first process to exec in a (non-initial) PID namespace at a container
    /// cgroup's own depth is presumed to be its init. Processes of the
    /// initial PID namespace (runc's set-up stages, hostPID containers) are
    /// never presumed, and a presumption is never replaced.
    pub fn exec(&mut self, id: u64, tgid: u32, pid_ns: bool) {
        if let Some(o) = self.by_id.get_mut(&id)
            && o.container.is_some()
            && !o.nested
            && o.presumed.is_none()
            && pid_ns
        {
            o.presumed = Some(tgid);
        }
    }

    /// Has the runtime not yet been asked for container `id`'s init?
    pub fn wants(&self, container: &str) -> bool {
        !self.inits.contains_key(container)
    }

    /// The runtime says `init` is container `container`'s init process
    /// (`None`: it named none that lives). The first word stands: a container
    /// has one init for its life.
    pub fn bind(&mut self, container: &str, init: Option<Process>) {
        self.inits.entry(container.to_owned()).or_insert(init);
    }

    /// The runtime's init of `container`, if it named one.
    pub fn bound(&self, container: &str) -> Option<Process> {
        self.inits.get(container).copied().flatten()
    }

    /// Forgets the inits of containers not in `present` (they are gone).
    pub fn retain_inits(&mut self, present: &HashSet<&str>) {
        self.inits.retain(|id, _| present.contains(id.as_str()));
    }

    /// What the exit of `process` in cgroup `id` means (invariant 9): the
    /// container's init died (`exact` if it is the process the runtime named),
    /// a process of a container whose init is not known yet exited (runc's
    /// set-up stages do, before the entrypoint's exec), or nothing (`None`:
    /// noise, a nested cgroup, or not a container's cgroup).
    pub fn exit_hint(&self, id: u64, process: Process) -> Option<ExitHint> {
        let o = self.by_id.get(&id)?;
        let container = o.container.as_ref()?;
        let init = |exact| ExitHint::Init {
            uid: o.uid.clone(),
            container: container.clone(),
            exact,
        };
        if let Some(bound) = self.bound(container) {
            // The runtime's init, wherever it moved (a nested cgroup too).
            return (bound == process).then(|| init(true));
        }
        if o.nested {
            return None;
        }
        match o.presumed {
            Some(presumed) if presumed == process.pid => Some(init(false)),
            Some(_) => None,
            None => Some(ExitHint::BeforeInit(o.uid.clone())),
        }
    }

    /// Is `tgid` the init of the container that owns cgroup `id` (the
    /// runtime's, else the presumed one)? `None` when no init is known.
    pub fn is_init(&self, id: u64, tgid: u32) -> Option<bool> {
        let o = self.by_id.get(&id)?;
        let container = o.container.as_ref()?;
        match self.bound(container) {
            Some(bound) => Some(bound.pid == tgid),
            None => o.presumed.map(|p| p == tgid),
        }
    }
}

/// The PID-1-of-its-namespace process in a container's own cgroup: the
/// presumed init of a container found by a scan (the runtime names the
/// real one at the next relist). Of several (a nested PID namespace inside
/// the container), the shallowest.
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

    fn place(uid: &str, container: Option<&str>, nested: bool) -> Option<Place> {
        Some(Place {
            uid: PodUid::from(uid),
            container: container.map(str::to_owned),
            nested,
        })
    }

    #[test]
    fn cgroupfs_and_systemd_paths_name_pod_and_container() {
        assert_eq!(
            parse_path("/kubepods/burstable/pod1234-ab/c0ffee"),
            place("1234-ab", Some("c0ffee"), false)
        );
        assert_eq!(
            parse_path("/evlet-node-16/kubepods/podu1"),
            place("u1", None, false)
        );
        assert_eq!(
            parse_path(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice/cri-containerd-abc.scope"
            ),
            place("12-34", Some("abc"), false)
        );
        assert_eq!(parse_path("/kubepods/burstable"), None);
        // A UID with `-pod` in it (the mock API server's; a static pod's
        // own `metadata.uid` can be any string) is taken whole.
        assert_eq!(
            parse_path("/e2e1-0/kubepods/besteffort/pod0b80-0003-mock-pods/c1"),
            place("0b80-0003-mock-pods", Some("c1"), false)
        );
        assert_eq!(
            parse_path(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b80_0003_mock_pods.slice/cri-containerd-c1.scope"
            ),
            place("0b80-0003-mock-pods", Some("c1"), false)
        );
        assert_eq!(
            parse_path(
                "/evlet_node.slice/evlet_node-kubepods.slice/evlet_node-kubepods-podu1.slice"
            ),
            place("u1", None, false)
        );
        // Outside the pods' tree nothing is a pod's cgroup.
        assert_eq!(parse_path("/podman/c1"), None);
        assert_eq!(parse_path("/system.slice/podman-pod1.slice/c1"), None);
        assert_eq!(parse_path("/x/burstable/pod1/c1"), None);
    }

    #[test]
    fn cgroups_made_inside_a_container_are_nested_at_any_depth() {
        assert_eq!(
            parse_path("/kubepods/podu/c1/init"),
            place("u", Some("c1"), true),
            "Docker-in-Docker moves its processes to <container>/init"
        );
        assert_eq!(
            parse_path("/kubepods/besteffort/podu/c1/kubelet.slice/kubepods/podv/c2"),
            place("u", Some("c1"), true),
            "a kind node's pods belong to the outer container, nested"
        );
        assert_eq!(
            parse_path(
                "/kubepods.slice/kubepods-podu.slice/cri-containerd-c1.scope/system.slice/x.service"
            ),
            place("u", Some("c1"), true),
            "systemd in a container"
        );
    }

    fn p(pid: u32, start: u64) -> Process {
        Process {
            pid,
            start_ticks: start,
        }
    }

    fn init(container: &str, exact: bool) -> Option<ExitHint> {
        Some(ExitHint::Init {
            uid: PodUid::from("u"),
            container: container.into(),
            exact,
        })
    }

    #[test]
    fn before_the_runtime_names_the_init_the_first_namespaced_exec_is_presumed() {
        let mut map = CgroupMap::default();
        map.insert(7, "/kubepods/podu/c1");
        assert_eq!(
            map.exit_hint(7, p(99, 1)),
            Some(ExitHint::BeforeInit(PodUid::from("u"))),
            "init unknown (runc's set-up stages): a plain hint, not the container's death"
        );
        map.exec(7, 80, false);
        assert_eq!(
            map.exit_hint(7, p(80, 1)),
            Some(ExitHint::BeforeInit(PodUid::from("u"))),
            "runc's set-up stages (initial PID namespace) are never the init"
        );
        map.exec(7, 90, true);
        map.exec(7, 100, true);
        assert_eq!(map.exit_hint(7, p(90, 1)), init("c1", false));
        assert_eq!(
            map.exit_hint(7, p(100, 1)),
            None,
            "a later process never replaces the presumption, whatever namespace it heads"
        );
        map.insert(8, "/kubepods/podu");
        assert_eq!(
            map.exit_hint(8, p(1, 1)),
            None,
            "the pod's own cgroup has no init"
        );
    }

    #[test]
    fn only_the_process_the_runtime_named_is_the_certain_init() {
        let mut map = CgroupMap::default();
        map.insert(7, "/kubepods/podu/c1");
        map.exec(7, 100, true);
        assert!(map.wants("c1"));
        map.bind("c1", Some(p(100, 500)));
        assert!(!map.wants("c1"));
        map.bind("c1", Some(p(300, 900)));
        assert_eq!(map.bound("c1"), Some(p(100, 500)), "the first word stands");
        assert_eq!(map.exit_hint(7, p(100, 500)), init("c1", true));
        assert_eq!(
            map.exit_hint(7, p(100, 501)),
            None,
            "a reused PID is another process"
        );
        assert_eq!(
            map.exit_hint(7, p(300, 900)),
            None,
            "a nested PID namespace's init is not the container's"
        );
        assert_eq!(map.is_init(7, 100), Some(true));
        assert_eq!(map.is_init(7, 300), Some(false));
    }

    #[test]
    fn a_shared_or_host_pid_namespace_gets_a_certain_init_from_the_runtime() {
        let mut map = CgroupMap::default();
        // hostPID: the init execs in the initial PID namespace, so nothing is
        // presumed; a later `unshare -fp` heads a new PID namespace.
        map.insert(9, "/kubepods/podu/host");
        map.exec(9, 400, false);
        map.exec(9, 401, true);
        assert_eq!(
            map.exit_hint(9, p(401, 7)),
            init("host", false),
            "before the runtime's word only a presumption, for the runtime to confirm"
        );
        map.bind("host", Some(p(400, 6)));
        assert_eq!(map.exit_hint(9, p(401, 7)), None);
        assert_eq!(map.exit_hint(9, p(400, 6)), init("host", true));
    }

    #[test]
    fn nested_cgroups_never_end_their_container_except_by_its_own_init() {
        let mut map = CgroupMap::default();
        map.insert(7, "/kubepods/podu/c1");
        map.insert(70, "/kubepods/podu/c1/inner");
        map.exec(70, 500, true);
        assert_eq!(
            map.exit_hint(70, p(500, 1)),
            None,
            "unbound: nested is noise"
        );
        map.bind("c1", Some(p(100, 5)));
        assert_eq!(map.exit_hint(70, p(500, 1)), None);
        assert_eq!(
            map.exit_hint(70, p(100, 5)),
            init("c1", true),
            "the runtime's init moved into a nested cgroup (DinD's /init) still ends it"
        );
        let nested = map.remove(70).expect("nested owner");
        assert!(nested.nested);
        assert_eq!(
            map.bound("c1"),
            Some(p(100, 5)),
            "a nested removal keeps the init"
        );
        map.remove(7);
        assert!(map.wants("c1"), "the container's own removal forgets it");
    }

    #[test]
    fn inits_of_gone_containers_are_forgotten() {
        let mut map = CgroupMap::default();
        map.bind("a", Some(p(1, 1)));
        map.bind("b", None);
        map.retain_inits(&["a"].into());
        assert!(!map.wants("a"));
        assert!(map.wants("b"));
    }
}
