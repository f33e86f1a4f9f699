//! `emptyDir` (and the directories of projected volumes): a directory with
//! mode 0777 whatever the umask, or a tmpfs mounted on it.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The size of a memory-backed volume: the smallest of the node's memory, the
/// memory limit of the pod's cgroup (from its containers' limits, or its
/// own) and the volume's `sizeLimit` (upstream's `calculateEmptyDirMemorySize`).
pub fn memory_size(node_memory: u64, pod: &Pod, size_limit: Option<&Quantity>) -> u64 {
    let mut size = node_memory;
    if let Some(l) = crate::cm::limits::for_pod(pod, -1)
        .memory
        .and_then(|l| u64::try_from(l).ok())
        .filter(|l| *l > 0 && *l <= size)
    {
        size = l;
    }
    if let Some(l) = size_limit
        .and_then(|q| crate::quantity::parse(&q.0).ok())
        .and_then(|l| u64::try_from(l).ok())
        .filter(|l| *l > 0 && *l <= size)
    {
        size = l;
    }
    size
}

/// Makes `dir` (0777), with a tmpfs of `memory` bytes on it when asked.
/// Idempotent: an existing directory or tmpfs is kept.
///
/// # Errors
/// What failed, naming the directory.
pub fn set_up(dir: &Path, memory: Option<u64>) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let set_mode = || {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| format!("chmod {}: {e}", dir.display()))
    };
    let Some(size) = memory else {
        return set_mode();
    };
    if super::mount::fs_type(dir).as_deref() == Some("tmpfs") {
        return Ok(());
    }
    super::mount::tmpfs(dir, (size > 0).then_some(size))
        .map_err(|e| format!("cannot mount a tmpfs at {}: {e}", dir.display()))?;
    set_mode()
}

/// Upstream's emptyDir readiness: the ready file exists and so does the
/// volume (a tmpfs on it for a memory-backed one). A ready file without its
/// volume (removed by hand) is removed, so the volume is set up again.
pub fn is_ready(dir: &Path, ready: &Path, memory: bool) -> bool {
    if !ready.exists() {
        return false;
    }
    let there = if memory {
        super::mount::fs_type(dir).as_deref() == Some("tmpfs")
    } else {
        dir.is_dir()
    };
    if !there {
        tracing::warn!(ready = %ready.display(), volume = %dir.display(), "the volume's ready file exists but the volume does not; setting it up again");
        let _ = std::fs::remove_file(ready);
    }
    there
}

/// Writes the ready file (upstream's `SetReady`: `<pod>/plugins/<plugin>/<volume>/ready`).
///
/// # Errors
/// What failed, naming the file.
pub fn mark_ready(ready: &Path) -> Result<(), String> {
    if let Some(parent) = ready.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::write(ready, b"").map_err(|e| format!("cannot write {}: {e}", ready.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_of_node_pod_and_size_limit() {
        let pod = |limits: &str| -> Pod {
            serde_yaml::from_str(&format!(
                "spec:\n  containers:\n  - {{name: a, resources: {{limits: {{{limits}}}}}}}\n  - {{name: b, resources: {{limits: {{memory: 64Mi}}}}}}\n"
            ))
            .expect("pod")
        };
        let gib = 1 << 30;
        assert_eq!(memory_size(gib, &pod("memory: 64Mi"), None), 128 << 20);
        assert_eq!(
            memory_size(gib, &pod("cpu: 1"), None),
            gib,
            "a container without a limit"
        );
        assert_eq!(
            memory_size(gib, &pod("memory: 64Mi"), Some(&Quantity("16Mi".into()))),
            16 << 20
        );
        assert_eq!(
            memory_size(100, &pod("memory: 64Mi"), None),
            100,
            "the node is smaller"
        );
        let own: Pod = serde_yaml::from_str(
            "spec:\n  resources: {limits: {memory: 32Mi}}\n  containers:\n  - {name: a}\n",
        )
        .expect("pod");
        assert_eq!(
            memory_size(gib, &own, None),
            32 << 20,
            "the pod's own limit"
        );
    }

    #[test]
    fn a_disk_volume_is_world_writable() {
        let dir = tempfile::tempdir().expect("tmp");
        let v = dir.path().join("v");
        set_up(&v, None).expect("set up");
        let mode = std::fs::metadata(&v).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o777);
    }

    #[test]
    fn a_disk_volume_is_ready_once_marked_and_not_after_it_is_removed() {
        let dir = tempfile::tempdir().expect("tmp");
        let v = dir.path().join("v");
        let ready = dir.path().join("plugins/kubernetes.io~empty-dir/v/ready");
        assert!(!is_ready(&v, &ready, false), "never set up");
        set_up(&v, None).expect("set up");
        mark_ready(&ready).expect("ready");
        assert!(is_ready(&v, &ready, false));
        std::fs::remove_dir(&v).expect("rmdir");
        assert!(!is_ready(&v, &ready, false), "the volume is gone");
        assert!(!ready.exists(), "and so is its stale ready file");
    }
}
