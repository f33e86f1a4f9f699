//! Which memory limit an OOM kill hit: the container's, the pod's, the QoS
//! class's or the node's (`kubepods`). Each level's limit, failure counter
//! and peak usage are read when the kill is seen (`read`). The level hit
//! (`hit`) is the lowest whose failure counter moved since the agent last
//! looked: cgroup v2 `memory.events.local` `oom` (counted at the cgroup whose
//! limit was reached), cgroup v1 `memory.failcnt` plus `memory.memsw.failcnt`.
//! Where no counter moved (kernel 6.18 leaves v1 `failcnt` at 0 for these
//! cgroups, measured here), it is the lowest level whose peak usage
//! (`memory.peak`, v1 `max_usage_in_bytes`) reached its limit.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cgroups::MemoryHierarchy;

/// One level of a container's memory cgroups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Level {
    /// `container`, `pod`, `qos` or `node`.
    pub level: String,
    /// The cgroup path.
    pub path: String,
    /// Its memory limit in bytes (`None`: unlimited or unreadable).
    pub limit_bytes: Option<u64>,
    /// Its limit-failure counter (`memory.events.local` oom, or v1 failcnt).
    pub failures: Option<u64>,
    /// Its peak memory usage in bytes.
    #[serde(default)]
    pub peak_bytes: Option<u64>,
}

/// The cgroup paths above container cgroup `path`, up to the pods' root
/// `node_root`: (level, path), the container first.
pub fn ladder(path: &str, node_root: &str) -> Vec<(&'static str, String)> {
    let node_root = format!("/{}", node_root.trim_matches('/'));
    let mut out = vec![("container", path.to_owned())];
    let parent = |p: &str| p.rsplit_once('/').map(|(a, _)| a.to_owned());
    let Some(pod) = parent(path).filter(|p| p.starts_with(&node_root)) else {
        return out;
    };
    out.push(("pod", pod.clone()));
    let Some(above) = parent(&pod).filter(|p| p.starts_with(&node_root)) else {
        return out;
    };
    if above.ends_with("/burstable") || above.ends_with("/besteffort") {
        out.push(("qos", above));
    }
    out.push(("node", node_root));
    out
}

/// The host's memory hierarchy, looked up once.
pub fn hierarchy() -> Option<&'static MemoryHierarchy> {
    static HIERARCHY: std::sync::OnceLock<Option<MemoryHierarchy>> = std::sync::OnceLock::new();
    HIERARCHY
        .get_or_init(crate::cgroups::memory_hierarchy)
        .as_ref()
}

/// Reads every level's limit and counter under `hierarchy`.
pub fn read(hierarchy: &MemoryHierarchy, path: &str, node_root: &str) -> Vec<Level> {
    ladder(path, node_root)
        .into_iter()
        .map(|(level, path)| {
            let (limit_bytes, failures, peak_bytes) = match hierarchy {
                MemoryHierarchy::V1(root) => {
                    let dir = root.join(path.trim_start_matches('/'));
                    // With swap accounting the memory+swap counter (runc
                    // limits it to the memory limit) refuses charges first.
                    let failures = match (
                        number(&dir.join("memory.failcnt")),
                        number(&dir.join("memory.memsw.failcnt")),
                    ) {
                        (None, None) => None,
                        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
                    };
                    let peak = number(&dir.join("memory.max_usage_in_bytes"))
                        .max(number(&dir.join("memory.memsw.max_usage_in_bytes")));
                    (
                        number(&dir.join("memory.limit_in_bytes")).filter(|l| *l < 1 << 62),
                        failures,
                        peak,
                    )
                }
                MemoryHierarchy::V2(root) => {
                    let dir = root.join(path.trim_start_matches('/'));
                    (
                        number(&dir.join("memory.max")),
                        std::fs::read_to_string(dir.join("memory.events.local"))
                            .ok()
                            .and_then(|t| field(&t, "oom")),
                        number(&dir.join("memory.peak")),
                    )
                }
            };
            Level {
                level: level.into(),
                path,
                limit_bytes,
                failures,
                peak_bytes,
            }
        })
        .collect()
}

fn number(file: &Path) -> Option<u64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

fn field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The lowest level whose counter moved past `seen` (the counters at the
/// last look; a cgroup not seen before counts from 0), and `seen` updated;
/// without one, the lowest level whose peak reached its limit (within 1 %).
pub fn hit(levels: &[Level], seen: &mut HashMap<String, u64>) -> Option<Level> {
    let mut found = None;
    for l in levels {
        let Some(now) = l.failures else { continue };
        let before = seen.insert(l.path.clone(), now).unwrap_or(0);
        if found.is_none() && now > before {
            found = Some(l.clone());
        }
    }
    found.or_else(|| {
        levels
            .iter()
            .find(|l| match (l.limit_bytes, l.peak_bytes) {
                (Some(limit), Some(peak)) => peak >= limit - limit / 100,
                _ => false,
            })
            .cloned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(level: &str, path: &str, failures: u64) -> Level {
        Level {
            level: level.into(),
            path: path.into(),
            limit_bytes: Some(1 << 20),
            failures: Some(failures),
            peak_bytes: Some(1 << 19),
        }
    }

    #[test]
    fn the_ladder_names_container_pod_qos_and_node() {
        assert_eq!(
            ladder("/n1/kubepods/burstable/podu/c1", "/n1/kubepods"),
            [
                ("container", "/n1/kubepods/burstable/podu/c1".to_owned()),
                ("pod", "/n1/kubepods/burstable/podu".to_owned()),
                ("qos", "/n1/kubepods/burstable".to_owned()),
                ("node", "/n1/kubepods".to_owned()),
            ]
        );
        assert_eq!(
            ladder("/n1/kubepods/podu/c1", "n1/kubepods/")
                .iter()
                .map(|(l, _)| *l)
                .collect::<Vec<_>>(),
            ["container", "pod", "node"]
        );
    }

    #[test]
    fn the_lowest_level_whose_counter_moved_was_hit() {
        let mut seen = HashMap::new();
        let pod_hit = [level("container", "/c", 0), level("pod", "/p", 3)];
        assert_eq!(
            hit(&pod_hit, &mut seen).map(|l| l.level),
            Some("pod".into())
        );
        // Again with no counter moving: nothing new was hit.
        assert_eq!(hit(&pod_hit, &mut seen), None);
        let both = [level("container", "/c", 1), level("pod", "/p", 4)];
        assert_eq!(
            hit(&both, &mut seen).map(|l| l.level),
            Some("container".into())
        );
    }

    #[test]
    fn without_counters_the_lowest_level_at_its_limit_was_hit() {
        let at_limit = |level: &str, limit: Option<u64>, peak: u64| Level {
            level: level.into(),
            path: format!("/{level}"),
            limit_bytes: limit,
            failures: Some(0),
            peak_bytes: Some(peak),
        };
        let levels = [
            at_limit("container", Some(64 << 20), 10 << 20),
            at_limit("pod", Some(32 << 20), 32 << 20),
            at_limit("node", None, 32 << 20),
        ];
        assert_eq!(
            hit(&levels, &mut HashMap::new()).map(|l| l.level),
            Some("pod".into())
        );
    }
}
