//! Pod cgroup cleanup (cgroupfs driver): runc creates a pod's cgroup path when
//! its first container starts; the agent removes it once the pod is gone.

use std::path::{Path, PathBuf};

/// Every mounted cgroup hierarchy root: the v1 controllers, the v2 unified
/// mount, or `/sys/fs/cgroup` itself on pure v2 hosts.
fn hierarchies() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            (fstype == "cgroup" || fstype == "cgroup2")
                .then(|| PathBuf::from(left.split_whitespace().nth(4).unwrap_or("")))
        })
        .filter(|p| !p.as_os_str().is_empty())
        .collect()
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        {
            remove_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Removes the cgroup `path` (e.g. `/kubepods/burstable/pod<uid>`) and what is
/// below it in every hierarchy. Cgroups that still hold processes stay (rmdir fails).
pub fn remove(path: &str) {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        return;
    }
    for root in hierarchies() {
        remove_tree(&root.join(rel));
    }
}
