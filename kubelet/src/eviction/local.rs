//! Local storage limits (pure): upstream's `localStorageEviction` evicts a pod
//! whose emptyDir is over its `sizeLimit`, whose ephemeral storage is over the
//! sum of its containers' `limits.ephemeral-storage`, or one of whose
//! containers (writable layer and logs) is over its own limit, whatever the
//! node's signals say.

use k8s_openapi::api::core::v1::{Container, Pod, Volume};

use crate::stats::PodStats;

/// The signal label of each kind of limit (`kubelet_evictions`).
pub const EMPTY_DIR: &str = "emptydirfs.limit";
/// The pod's total.
pub const POD: &str = "ephemeralpodfs.limit";
/// One container's.
pub const CONTAINER: &str = "ephemeralcontainerfs.limit";

/// The pod's emptyDirs with a `sizeLimit`: name, the limit as written, bytes.
pub fn empty_dir_limits(pod: &Pod) -> Vec<(String, String, i64)> {
    volumes(pod)
        .filter_map(|v| {
            let (limit, text) = empty_dir_limit(v)?;
            Some((v.name.clone(), text.to_owned(), limit))
        })
        .collect()
}

fn volumes(pod: &Pod) -> impl Iterator<Item = &Volume> {
    pod.spec.iter().flat_map(|s| s.volumes.iter().flatten())
}

/// An emptyDir's `sizeLimit`: bytes and the text as written (None when not
/// an emptyDir, or absent, zero or unparsable).
fn empty_dir_limit(v: &Volume) -> Option<(i64, &str)> {
    let q = v.empty_dir.as_ref()?.size_limit.as_ref()?;
    let limit = crate::quantity::parse(&q.0).ok().filter(|l| *l > 0)?;
    Some((limit, q.0.as_str()))
}

/// Upstream's message for an emptyDir over its limit.
pub fn empty_dir_message(volume: &str, limit: &str) -> String {
    format!("Usage of EmptyDir volume {volume:?} exceeds the limit {limit:?}. ")
}

/// A container's `limits.ephemeral-storage`: bytes and the text as written
/// (None when absent, zero or unparsable).
fn container_limit(c: &Container) -> Option<(i64, &str)> {
    let q = c
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("ephemeral-storage")?;
    let bytes = crate::quantity::parse(&q.0).ok().filter(|b| *b > 0)?;
    Some((bytes, q.0.as_str()))
}

/// Does any container of `pod` limit its ephemeral storage (so its usage must
/// be measured)?
pub fn has_storage_limits(pod: &Pod) -> bool {
    pod.spec.iter().any(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| container_limit(c).is_some())
    })
}

/// Does `pod` limit its local storage at all (an emptyDir's `sizeLimit` or a
/// container's `limits.ephemeral-storage`)? Only such pods are measured.
pub fn limits_local_storage(pod: &Pod) -> bool {
    has_storage_limits(pod) || volumes(pod).any(|v| empty_dir_limit(v).is_some())
}

/// The pod's ephemeral storage limit (upstream's `PodLimits`): the app
/// containers' and sidecars' limits summed, or the largest init container's
/// with the sidecars before it; None when no container declares one.
fn pod_limit(pod: &Pod) -> Option<i64> {
    if !has_storage_limits(pod) {
        return None;
    }
    let (limit, _) =
        crate::resources::pod_sum(pod, |c| (container_limit(c).map_or(0, |(b, _)| b), 0));
    Some(limit)
}

/// Upstream's `podEphemeralStorageLimitEviction` then
/// `containerEphemeralStorageLimitEviction`: the signal label and message of
/// the first limit `pod` is over, by its `stats` (a container's usage is its
/// writable layer and its logs: the image filesystem is not dedicated here).
pub fn over_limit(pod: &Pod, stats: &PodStats) -> Option<(&'static str, String)> {
    let used = |v: Option<u64>| i64::try_from(v.unwrap_or(0)).unwrap_or(i64::MAX);
    if let Some(limit) = pod_limit(pod) {
        let total = used(stats.ephemeral_storage.as_ref().and_then(|e| e.used_bytes));
        if total > limit {
            return Some((
                POD,
                format!(
                    "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                    super::rank::quantity(limit, true)
                ),
            ));
        }
    }
    let spec = pod.spec.as_ref()?;
    for cs in &stats.containers {
        let Some((limit, text)) = spec
            .containers
            .iter()
            .find(|c| c.name == cs.name)
            .and_then(container_limit)
        else {
            continue;
        };
        let usage = used(cs.rootfs.as_ref().and_then(|f| f.used_bytes))
            .saturating_add(used(cs.logs.as_ref().and_then(|f| f.used_bytes)));
        if usage > limit {
            return Some((
                CONTAINER,
                format!(
                    "Container {} exceeded its local ephemeral storage limit {text:?}. ",
                    cs.name
                ),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{ContainerStats, FsStats};

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(&format!("metadata: {{name: p, uid: u}}\nspec:\n{yaml}")).expect("pod")
    }

    fn fs(bytes: u64) -> Option<FsStats> {
        Some(FsStats {
            used_bytes: Some(bytes),
            ..FsStats::default()
        })
    }

    fn stats(total: u64, containers: &[(&str, u64, u64)]) -> PodStats {
        PodStats {
            pod_ref: crate::stats::PodReference {
                name: "p".into(),
                namespace: "default".into(),
                uid: "u".into(),
            },
            start_time: None,
            containers: containers
                .iter()
                .map(|(name, rootfs, logs)| ContainerStats {
                    name: (*name).into(),
                    start_time: None,
                    cpu: None,
                    memory: None,
                    rootfs: fs(*rootfs),
                    logs: fs(*logs),
                })
                .collect(),
            cpu: None,
            memory: None,
            network: None,
            volume: Vec::new(),
            ephemeral_storage: fs(total),
            process_stats: None,
        }
    }

    const TWO: &str = "  containers:\n  - {name: a, image: i, resources: {limits: {ephemeral-storage: 10Mi}}}\n  - {name: b, image: i}\n";

    #[test]
    fn a_container_over_its_limit_is_named_with_the_limit_as_written() {
        let p = pod(TWO);
        assert!(has_storage_limits(&p));
        // a: 6 + 5 MiB > 10Mi, while the pod's total (10 MiB) is not over it.
        let s = stats(10 << 20, &[("a", 6 << 20, 5 << 20), ("b", 0, 0)]);
        let (signal, message) = over_limit(&p, &s).expect("over");
        assert_eq!(signal, CONTAINER);
        assert_eq!(
            message,
            "Container a exceeded its local ephemeral storage limit \"10Mi\". "
        );
        assert_eq!(over_limit(&p, &stats(1 << 20, &[("a", 1 << 20, 0)])), None);
    }

    #[test]
    fn the_pods_total_counts_against_the_sum_of_its_containers_limits() {
        let p = pod(TWO);
        // The unlimited container's and volumes' usage count in the total.
        let s = stats(11 << 20, &[("a", 1 << 20, 0), ("b", 10 << 20, 0)]);
        assert_eq!(
            over_limit(&p, &s),
            Some((
                POD,
                "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. "
                    .to_owned()
            ))
        );
        let unlimited = pod("  containers:\n  - {name: a, image: i}\n");
        assert!(!has_storage_limits(&unlimited));
        assert_eq!(over_limit(&unlimited, &s), None);
    }

    #[test]
    fn empty_dir_limits_and_their_message() {
        let p = pod(
            "  containers:\n  - {name: a, image: i}\n  volumes:\n  - {name: cache, emptyDir: {sizeLimit: 10Mi}}\n  - {name: scratch, emptyDir: {}}\n",
        );
        assert_eq!(
            empty_dir_limits(&p),
            [("cache".to_owned(), "10Mi".to_owned(), 10 << 20)]
        );
        assert_eq!(
            empty_dir_message("cache", "10Mi"),
            "Usage of EmptyDir volume \"cache\" exceeds the limit \"10Mi\". "
        );
    }
}
