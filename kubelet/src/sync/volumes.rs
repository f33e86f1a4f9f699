//! The IO side of the pod's volumes: the directories its emptyDir volumes
//! and `DirectoryOrCreate` hostPaths need before its sandbox starts.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;

use super::spec::{self, NodeContext};

/// A volume whose directory could not be made.
#[derive(Debug, thiserror::Error)]
#[error("volume {volume}: {}: {source}", path.display())]
pub struct VolumeError {
    /// The volume's name in the pod spec.
    pub volume: String,
    /// The directory.
    pub path: PathBuf,
    /// The IO error.
    #[source]
    pub source: std::io::Error,
}

/// Creates the pod's emptyDir volumes and its `DirectoryOrCreate` hostPaths.
///
/// # Errors
/// [`VolumeError`] naming the volume and the directory it failed on.
pub fn prepare(node: &NodeContext, pod: &Pod) -> Result<(), VolumeError> {
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        let path = if v.empty_dir.is_some() {
            spec::volume_path(node, pod, &v.name)
        } else {
            v.host_path
                .as_ref()
                .filter(|hp| hp.type_.as_deref() == Some("DirectoryOrCreate"))
                .map(|hp| PathBuf::from(&hp.path))
        };
        if let Some(path) = path {
            std::fs::create_dir_all(&path).map_err(|source| VolumeError {
                volume: v.name.clone(),
                path,
                source,
            })?;
        }
    }
    Ok(())
}
