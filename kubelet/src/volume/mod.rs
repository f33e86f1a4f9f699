//! The volume manager: a pod's volumes set up on disk before its containers
//! start, kept up to date on every sync, and torn down after the pod is gone.
//!
//! The desired state is the pod spec (only volumes some container mounts, as
//! upstream); the actual state is the disk under
//! `<root>/pods/<uid>/volumes/<plugin>/<name>` and the mount table, read
//! again each time, so an agent restart rediscovers whatever it had mounted
//! and set-up is idempotent. Plugins:
//! * `emptyDir`: a 0777 directory, or with `medium: Memory` a tmpfs sized by
//!   the smallest of `sizeLimit`, the pod's memory limit and the node's memory;
//! * `hostPath`: upstream's type checks ([`host_path`]);
//! * `downwardAPI`, `configMap`, `secret`, `projected`: files written by the
//!   [`atomic`] writer (secret and projected on a tmpfs), from [`sources`];
//! * `persistentVolumeClaim` bound to a `local` or `hostPath` volume.
//!
//! Any other type is refused with a `FailedMount` naming it, never dropped.
//! `subPath`s are bind-mounted from descriptors opened beneath the volume
//! ([`subpath`]); `fsGroup` is applied as upstream ([`ownership`]).

pub mod atomic;
mod empty_dir;
pub mod host_path;
pub mod mount;
pub mod ownership;
mod plugins;
pub mod sources;
pub mod subpath;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use evlet_cri::api;
use k8s_openapi::api::core::v1::{Container, Pod};

pub use sources::{NoApiServer, VolumeSources};

/// Why a pod's volumes are not ready: its containers wait (`ContainerCreating`)
/// and a `FailedMount` event says this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    /// A volume could not be set up (upstream's `MountVolume.SetUp failed`).
    #[error("MountVolume.SetUp failed for volume {volume:?} : {message}")]
    SetUp {
        /// The volume's name.
        volume: String,
        /// Why.
        message: String,
    },
    /// A volume no plugin here handles, or whose source cannot be resolved.
    #[error(
        "Unable to attach or mount volumes: unmounted volumes=[{volume}], unattached volumes=[], failed to process volumes=[{volume}]: {message}"
    )]
    Unprocessable {
        /// The volume's name.
        volume: String,
        /// Why.
        message: String,
    },
}

impl VolumeError {
    /// The volume it is about.
    pub fn volume(&self) -> &str {
        match self {
            VolumeError::SetUp { volume, .. } | VolumeError::Unprocessable { volume, .. } => volume,
        }
    }
}

/// A volume ready for the pod's containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// Where it is on the host.
    pub path: PathBuf,
    /// Mounted read-only whatever the mount says (configMap, secret, ...).
    pub read_only: bool,
}

/// The pod's volumes, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodVolumes {
    /// The pod's directory.
    pub pod_dir: PathBuf,
    /// Set-up volumes by name.
    pub ready: BTreeMap<String, Ready>,
}

/// Node facts the plugins need.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    /// The node's name (a local volume's node affinity).
    pub name: String,
    /// The node's labels (node affinity).
    pub labels: BTreeMap<String, String>,
    /// Memory the node can give pods, bytes (a memory-backed emptyDir's default size).
    pub memory: u64,
    /// Node allocatable (the downward API's `limits.*` a container does not set).
    pub allocatable: crate::cm::allocatable::Resources,
    /// The runtime's default handler makes recursive read-only mounts (CRI
    /// `Status` runtime handler features).
    pub recursive_read_only: bool,
}

/// A persistentVolumeClaim a pod's volume is set up from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedClaim {
    /// The pod's namespace.
    pub namespace: String,
    /// The claim's name.
    pub claim: String,
    /// Where the volume is on the host.
    pub path: PathBuf,
    /// A `local` PV (upstream measures those; a hostPath PV reports nothing).
    pub local: bool,
}

/// The volume manager.
#[derive(Debug, Clone)]
pub struct VolumeManager {
    /// `<root-dir>`.
    root: PathBuf,
    /// ConfigMaps, Secrets, tokens, claims: the API server, or none.
    sources: Arc<dyn VolumeSources>,
    node: NodeFacts,
    /// The claims each pod's volumes are set up from, by pod UID.
    claims: Arc<std::sync::Mutex<BTreeMap<String, Vec<MountedClaim>>>>,
}

/// A mount's CRI propagation.
fn propagation(p: Option<&str>) -> i32 {
    match p {
        Some("HostToContainer") => api::MountPropagation::PropagationHostToContainer as i32,
        Some("Bidirectional") => api::MountPropagation::PropagationBidirectional as i32,
        _ => api::MountPropagation::PropagationPrivate as i32,
    }
}

/// Why a container's mounts could not be made (CreateContainerConfigError).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    /// A mount names a volume that is not set up.
    #[error("cannot find volume {volume:?} to mount into container {container:?}")]
    NoVolume {
        /// The volume.
        volume: String,
        /// The container.
        container: String,
    },
    /// A subPath could not be prepared.
    #[error(transparent)]
    SubPath(#[from] subpath::SubPathError),
    /// `recursiveReadOnly: Enabled` on a runtime that cannot do it.
    #[error(
        "volume {0:?} requested recursive read-only mode, but it is not supported by the runtime"
    )]
    RecursiveReadOnly(String),
    /// Bidirectional propagation in an unprivileged container.
    #[error(
        "Bidirectional mount propagation is available only to privileged containers (volumeMount {0:?})"
    )]
    Propagation(String),
}

impl VolumeManager {
    /// A manager keeping pods' volumes under `<root>/pods`, reading API
    /// objects from `sources`.
    pub fn new(root: PathBuf, sources: Arc<dyn VolumeSources>, node: NodeFacts) -> Self {
        Self {
            root,
            sources,
            node,
            claims: Arc::default(),
        }
    }

    /// Every claim pods' volumes are set up from now.
    pub fn mounted_claims(&self) -> Vec<MountedClaim> {
        crate::lock::lock(&self.claims)
            .values()
            .flatten()
            .cloned()
            .collect()
    }

    /// `<root>/pods/<uid>`.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root.join("pods").join(uid)
    }

    /// Sets up (or brings up to date) every volume `pod`'s containers mount.
    /// Idempotent: what is already there is kept, changed API objects are
    /// written again atomically.
    ///
    /// # Errors
    /// The first volume that could not be set up, named.
    pub async fn set_up(&self, pod: &Pod) -> Result<PodVolumes, VolumeError> {
        let uid = crate::pod::uid(pod).0;
        let pod_dir = self.pod_dir(&uid);
        let used: std::collections::BTreeSet<&str> = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .map(|m| m.name.as_str())
            .collect();
        let mut ready = BTreeMap::new();
        let mut claims = Vec::new();
        let namespace = crate::pod::namespace(pod);
        for v in pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter(|v| used.contains(v.name.as_str()))
        {
            let inputs = plugins::gather(self.sources.as_ref(), &self.node, pod, v).await?;
            let claim = match (&inputs, &v.persistent_volume_claim) {
                (plugins::Inputs::Claim { pv, .. }, Some(c)) => Some((
                    c.claim_name.clone(),
                    pv.spec.as_ref().is_some_and(|s| s.local.is_some()),
                )),
                _ => None,
            };
            let node = self.node.clone();
            let dir = pod_dir.clone();
            let pod = pod.clone();
            let volume = v.clone();
            let done = tokio::task::spawn_blocking(move || {
                plugins::set_up(&dir, &node, &pod, &volume, inputs)
            })
            .await
            .map_err(|e| VolumeError::SetUp {
                volume: v.name.clone(),
                message: format!("set-up task failed: {e}"),
            })??;
            if let Some((claim, local)) = claim {
                claims.push(MountedClaim {
                    namespace: namespace.to_owned(),
                    claim,
                    path: done.path.clone(),
                    local,
                });
            }
            ready.insert(v.name.clone(), done);
        }
        crate::lock::lock(&self.claims).insert(uid, claims);
        Ok(PodVolumes { pod_dir, ready })
    }

    /// The CRI mounts of container `c` (its `volumeMounts`, subPaths bound
    /// beneath their volumes), with `env` for `subPathExpr`.
    ///
    /// # Errors
    /// [`MountError`] naming the mount.
    pub fn container_mounts(
        &self,
        c: &Container,
        volumes: &PodVolumes,
        env: &BTreeMap<String, String>,
    ) -> Result<Vec<api::Mount>, MountError> {
        let privileged = c
            .security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false);
        let mut out = Vec::new();
        for (index, m) in c.volume_mounts.iter().flatten().enumerate() {
            let ready = volumes
                .ready
                .get(&m.name)
                .ok_or_else(|| MountError::NoVolume {
                    volume: m.name.clone(),
                    container: c.name.clone(),
                })?;
            if m.mount_propagation.as_deref() == Some("Bidirectional") && !privileged {
                return Err(MountError::Propagation(m.name.clone()));
            }
            let sub = match (
                m.sub_path_expr.as_deref().filter(|s| !s.is_empty()),
                m.sub_path.as_deref(),
            ) {
                (Some(expr), _) => Some(subpath::expand(expr, env)?),
                (None, Some(s)) if !s.is_empty() => Some(s.to_owned()),
                _ => None,
            };
            let host = match sub {
                Some(sub) => {
                    subpath::check(&sub)?;
                    subpath::prepare(&subpath::Request {
                        pod_dir: &volumes.pod_dir,
                        volume: &m.name,
                        volume_path: &ready.path,
                        container: &c.name,
                        index,
                        mount: &m.name,
                        sub: &sub,
                    })?
                }
                None => ready.path.clone(),
            };
            let read_only = m.read_only.unwrap_or(false) || ready.read_only;
            let recursive = match m.recursive_read_only.as_deref() {
                Some("Enabled") if !self.node.recursive_read_only => {
                    return Err(MountError::RecursiveReadOnly(m.name.clone()));
                }
                Some("Enabled") => true,
                Some("IfPossible") => self.node.recursive_read_only,
                _ => false,
            };
            out.push(api::Mount {
                container_path: m.mount_path.clone(),
                host_path: host.display().to_string(),
                readonly: read_only,
                propagation: propagation(m.mount_propagation.as_deref()),
                recursive_read_only: read_only && recursive,
                ..Default::default()
            });
        }
        Ok(out)
    }

    /// Pod directories under `<root>/pods`, by UID.
    pub fn pod_dirs(&self) -> Vec<String> {
        std::fs::read_dir(self.root.join("pods"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Tears down everything of pod `uid`: every mount under its directory
    /// (subPaths, tmpfs, local volumes) is unmounted, then the directory is
    /// removed. Works from the disk alone, so it also cleans up after an agent
    /// that died mid-way.
    ///
    /// # Errors
    /// A mount that could not be removed: the directory is kept then (its
    /// files may be a volume's, as upstream refuses for "volume paths are
    /// still present on disk").
    pub fn tear_down(&self, uid: &str) -> std::io::Result<()> {
        crate::lock::lock(&self.claims).remove(uid);
        let dir = self.pod_dir(uid);
        tear_down_dir(&dir)
    }
}

/// Unmounts everything under `dir` and removes it.
fn tear_down_dir(dir: &Path) -> std::io::Result<()> {
    subpath::clean(dir)?;
    for point in mount::mounts_under(dir) {
        mount::unmount(&point)?;
    }
    let left = mount::mounts_under(dir);
    if !left.is_empty() {
        return Err(std::io::Error::other(format!(
            "orphaned pod directory {} found, but volume paths are still mounted: {left:?}",
            dir.display()
        )));
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
