//! The host's cgroup hierarchies and pod cgroup cleanup (cgroupfs driver):
//! [`crate::cm`] makes a pod's cgroup before its sandbox; the agent removes it
//! once the pod is gone.

use std::path::{Path, PathBuf};

/// A mounted cgroup hierarchy: its root, whether it is cgroup2, and its
/// super options (a v1 hierarchy's controllers).
struct Mount {
    root: PathBuf,
    v2: bool,
    options: String,
}

/// Every mounted cgroup hierarchy, from `/proc/self/mountinfo`.
fn mounts() -> Vec<Mount> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut r = right.split_whitespace();
            let fstype = r.next()?;
            let options = r.nth(1).unwrap_or("");
            let root = left.split_whitespace().nth(4).filter(|p| !p.is_empty())?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| Mount {
                root: PathBuf::from(root),
                v2: fstype == "cgroup2",
                options: options.to_owned(),
            })
        })
        .collect()
}

/// Every mounted cgroup hierarchy root: the v1 controllers, the v2 unified
/// mount, or `/sys/fs/cgroup` itself on pure v2 hosts.
fn hierarchies() -> Vec<PathBuf> {
    mounts().into_iter().map(|m| m.root).collect()
}

/// Removes `dir` and the cgroups below it, deepest first; what cannot be
/// removed stays.
fn remove_tree(dir: &Path) {
    for child in children(dir) {
        remove_tree(&child);
    }
    let _ = std::fs::remove_dir(dir);
}

/// SIGKILLs the processes in `dir` and the cgroups below it; how many.
fn kill_tree(dir: &Path) -> usize {
    let mut killed = children(dir).iter().map(|c| kill_tree(c)).sum();
    for pid in procs(dir) {
        // SAFETY: kill(2) of a process inside a finished pod's own cgroup.
        if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
            killed += 1;
        }
    }
    killed
}

/// The cgroups right below `dir`.
fn children(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills the processes left in the finished pod's cgroup `path` and below
/// it, in every hierarchy, as upstream's pod container manager does before
/// it destroys a pod's cgroup (whatever runs there escaped its containers'
/// teardown); how many.
pub fn kill(path: &str) -> usize {
    kill_in(&hierarchies(), path)
}

/// [`kill`] in the hierarchies mounted at `roots`.
fn kill_in(roots: &[PathBuf], path: &str) -> usize {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        return 0;
    }
    let killed = roots.iter().map(|root| kill_tree(&root.join(rel))).sum();
    if killed > 0 {
        tracing::warn!(
            cgroup = path,
            killed,
            "killed processes left in a finished pod's cgroup"
        );
    }
    killed
}

/// Whether a process runs in the cgroup `dir` or below it.
pub fn has_processes(dir: &Path) -> bool {
    !procs(dir).is_empty() || children(dir).iter().any(|c| has_processes(c))
}

/// The processes in the cgroup `dir` (`cgroup.procs`).
fn procs(dir: &Path) -> Vec<libc::pid_t> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|&p| p > 0)
        .collect()
}

/// Removes the cgroup `path` (e.g. `/kubepods/burstable/pod<uid>`) and what is
/// below it in every hierarchy, killing the processes left in it ([`kill`]).
///
/// # Errors
/// The directory that is still there: a killed process the kernel has not
/// let go of yet, or a child cgroup the runtime still removes. The caller
/// tries again, as upstream's pod worker does.
pub fn remove(path: &str) -> Result<(), RemoveError> {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        return Ok(());
    }
    let roots = hierarchies();
    let killed = kill_in(&roots, path);
    let mut left = None;
    for root in &roots {
        let dir = root.join(rel);
        remove_tree(&dir);
        if left.is_none() && dir.is_dir() {
            left = Some(dir);
        }
    }
    match left {
        None => Ok(()),
        Some(dir) => Err(RemoveError { dir, killed }),
    }
}

/// A cgroup directory that could not be removed yet.
#[derive(Debug, thiserror::Error)]
#[error("{} is still busy ({killed} processes killed in it just now)", dir.display())]
pub struct RemoveError {
    /// The directory still there.
    pub dir: PathBuf,
    /// The processes killed in this attempt.
    pub killed: usize,
}

/// The root of the v1 hierarchy holding `controller` (`cpu`, `memory`, `pids`).
pub fn v1_controller_root(controller: &str) -> Option<PathBuf> {
    mounts()
        .into_iter()
        .find(|m| !m.v2 && m.options.split(',').any(|o| o == controller))
        .map(|m| m.root)
}

/// The cgroup2 mount of a pure v2 host (one whose root has controllers; the
/// unified mount of a hybrid host has none).
pub fn v2_root() -> Option<PathBuf> {
    mounts()
        .into_iter()
        .filter(|m| m.v2)
        .find(|m| {
            std::fs::read_to_string(m.root.join("cgroup.controllers"))
                .is_ok_and(|c| !c.trim().is_empty())
        })
        .map(|m| m.root)
}

/// Where memory limits live: the v1 `memory` hierarchy (hybrid hosts, as
/// these development machines) or a cgroup2 mount with the memory controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryHierarchy {
    /// cgroup v1 `memory` controller at this root.
    V1(PathBuf),
    /// cgroup v2 at this root.
    V2(PathBuf),
}

/// The root of the v1 `memory` controller (None on pure cgroup v2): where the
/// node's memory is read as upstream's cAdvisor reads it, and where usage
/// thresholds can be armed.
pub fn memcg_v1_root() -> Option<PathBuf> {
    match memory_hierarchy()? {
        MemoryHierarchy::V1(root) => Some(root),
        MemoryHierarchy::V2(_) => None,
    }
}

/// The host's memory hierarchy, if any.
pub fn memory_hierarchy() -> Option<MemoryHierarchy> {
    let mut v2 = None;
    for m in mounts() {
        if !m.v2 && m.options.split(',').any(|o| o == "memory") {
            return Some(MemoryHierarchy::V1(m.root));
        }
        if m.v2
            && std::fs::read_to_string(m.root.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        {
            v2 = Some(MemoryHierarchy::V2(m.root));
        }
    }
    v2
}
