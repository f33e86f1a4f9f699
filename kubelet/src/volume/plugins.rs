//! The volume plugins: what each volume type needs from outside
//! ([`gather`], async: API objects, tokens, claims) and what it does on disk
//! ([`set_up`], blocking IO, run off the async threads).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{KeyToPath, PersistentVolume, Pod, Volume};

use super::atomic::{self, File};
use super::sources::{SourceError, TokenRequest, VolumeSources};
use super::{NodeFacts, Ready, VolumeError, empty_dir, host_path, ownership};

/// Upstream's default mode of projected files (`*DefaultMode`: 0644).
const DEFAULT_MODE: i32 = 0o644;

/// What a volume's set-up needs besides the pod.
#[derive(Debug)]
pub(super) enum Inputs {
    /// Nothing more (emptyDir, hostPath).
    Nothing,
    /// Files to write atomically, on a tmpfs when `memory`.
    Files {
        /// `kubernetes.io~configmap` and the like.
        plugin: &'static str,
        /// The payload.
        files: BTreeMap<String, File>,
        /// Backed by memory (secrets, projected).
        memory: bool,
    },
    /// A claim's persistent volume.
    Claim {
        /// The volume.
        pv: Box<PersistentVolume>,
        /// The pod mounts it read-only.
        read_only: bool,
    },
}

fn unprocessable(v: &Volume, message: impl Into<String>) -> VolumeError {
    VolumeError::Unprocessable {
        volume: v.name.clone(),
        message: message.into(),
    }
}

fn set_up_failed(v: &Volume, message: impl Into<String>) -> VolumeError {
    VolumeError::SetUp {
        volume: v.name.clone(),
        message: message.into(),
    }
}

/// The volume type's name for a refusal.
fn type_name(v: &Volume) -> &'static str {
    macro_rules! first {
        ($($field:ident => $name:literal),* $(,)?) => {
            $(if v.$field.is_some() { return $name; })*
        };
    }
    first!(
        csi => "csi", nfs => "nfs", iscsi => "iscsi", ephemeral => "ephemeral", image => "image",
        aws_elastic_block_store => "awsElasticBlockStore", azure_disk => "azureDisk",
        azure_file => "azureFile", cephfs => "cephfs", cinder => "cinder", fc => "fc",
        flex_volume => "flexVolume", flocker => "flocker", gce_persistent_disk => "gcePersistentDisk",
        git_repo => "gitRepo", glusterfs => "glusterfs", photon_persistent_disk => "photonPersistentDisk",
        portworx_volume => "portworxVolume", quobyte => "quobyte", rbd => "rbd", scale_io => "scaleIO",
        storageos => "storageos", vsphere_volume => "vsphereVolume",
    );
    "unknown"
}

/// The mode of a projected file: the item's, else the volume's default.
fn mode(item: Option<i32>, default: Option<i32>) -> u32 {
    item.or(default).unwrap_or(DEFAULT_MODE) as u32
}

/// Files from a ConfigMap's or Secret's keys (upstream's `MakePayload`).
fn payload(
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: Option<i32>,
    optional: bool,
    missing_key: &dyn Fn(&str) -> String,
) -> Result<BTreeMap<String, File>, String> {
    let mut out = BTreeMap::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data {
                out.insert(
                    k.clone(),
                    File {
                        data: v.clone(),
                        mode: mode(None, default_mode),
                    },
                );
            }
        }
        Some(items) => {
            for item in items {
                match data.get(&item.key) {
                    Some(v) => {
                        out.insert(
                            item.path.clone(),
                            File {
                                data: v.clone(),
                                mode: mode(item.mode, default_mode),
                            },
                        );
                    }
                    None if optional => {}
                    None => return Err(missing_key(&item.key)),
                }
            }
        }
    }
    Ok(out)
}

/// An optional object that does not exist is empty.
fn or_empty(
    found: Result<super::sources::ObjectData, SourceError>,
    optional: bool,
) -> Result<super::sources::ObjectData, SourceError> {
    match found {
        Err(SourceError::NotFound { .. }) if optional => Ok(Default::default()),
        other => other,
    }
}

/// Downward API items as files.
fn downward_files(
    pod: &Pod,
    node: &NodeFacts,
    items: &[k8s_openapi::api::core::v1::DownwardAPIVolumeFile],
    default_mode: Option<i32>,
) -> Result<BTreeMap<String, File>, String> {
    let mut out = BTreeMap::new();
    for item in items {
        let text = if let Some(f) = &item.field_ref {
            if !crate::downward::supported_volume_field(&f.field_path) {
                return Err(format!("unsupported fieldRef {:?}", f.field_path));
            }
            crate::downward::field(pod, &f.field_path, None, None).unwrap_or_default()
        } else if let Some(r) = &item.resource_field_ref {
            let name = r.container_name.as_deref().unwrap_or("");
            let c = pod
                .spec
                .iter()
                .flat_map(|s| {
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten())
                })
                .find(|c| c.name == name)
                .ok_or_else(|| format!("container {name:?} not found for resourceFieldRef"))?;
            crate::downward::resource(
                pod,
                c,
                &node.allocatable,
                &r.resource,
                r.divisor.as_ref().map(|d| d.0.as_str()),
            )
            .map_err(|e| e.to_string())?
        } else {
            continue;
        };
        out.insert(
            item.path.clone(),
            File {
                data: text.into_bytes(),
                mode: mode(item.mode, default_mode),
            },
        );
    }
    Ok(out)
}

fn fs_owned(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .is_some_and(|sc| sc.fs_group.is_some() || sc.run_as_user.is_some())
}

/// Fetches what volume `v` of `pod` needs from outside.
///
/// # Errors
/// [`VolumeError`] naming the volume: a missing object or key, a claim that
/// is not bound, a type no plugin handles.
pub(super) async fn gather(
    sources: &dyn VolumeSources,
    node: &NodeFacts,
    pod: &Pod,
    v: &Volume,
) -> Result<Inputs, VolumeError> {
    let ns = crate::pod::namespace(pod);
    if v.empty_dir.is_some() || v.host_path.is_some() {
        return Ok(Inputs::Nothing);
    }
    if let Some(d) = &v.downward_api {
        let files = downward_files(
            pod,
            node,
            d.items.as_deref().unwrap_or_default(),
            d.default_mode,
        )
        .map_err(|e| set_up_failed(v, e))?;
        return Ok(Inputs::Files {
            plugin: "kubernetes.io~downward-api",
            files,
            memory: false,
        });
    }
    if let Some(cm) = &v.config_map {
        let optional = cm.optional == Some(true);
        let data = or_empty(sources.config_map(ns, &cm.name).await, optional)
            .map_err(|e| set_up_failed(v, e.to_string()))?;
        let files = payload(
            &data.data,
            cm.items.as_ref(),
            cm.default_mode,
            optional,
            &|k| format!("configmap references non-existent config key: {k}"),
        )
        .map_err(|e| set_up_failed(v, e))?;
        return Ok(Inputs::Files {
            plugin: "kubernetes.io~configmap",
            files,
            memory: false,
        });
    }
    if let Some(s) = &v.secret {
        let optional = s.optional == Some(true);
        let name = s.secret_name.clone().unwrap_or_default();
        let data = or_empty(sources.secret(ns, &name).await, optional)
            .map_err(|e| set_up_failed(v, e.to_string()))?;
        let files = payload(
            &data.data,
            s.items.as_ref(),
            s.default_mode,
            optional,
            &|k| format!("references non-existent secret key: {k}"),
        )
        .map_err(|e| set_up_failed(v, e))?;
        return Ok(Inputs::Files {
            plugin: "kubernetes.io~secret",
            files,
            memory: true,
        });
    }
    if let Some(p) = &v.projected {
        let mut files = BTreeMap::new();
        let mut errors = Vec::new();
        for source in p.sources.iter().flatten() {
            let part = if let Some(cm) = &source.config_map {
                let optional = cm.optional == Some(true);
                match or_empty(sources.config_map(ns, &cm.name).await, optional) {
                    Ok(data) => payload(
                        &data.data,
                        cm.items.as_ref(),
                        p.default_mode,
                        optional,
                        &|k| format!("configmap references non-existent config key: {k}"),
                    ),
                    Err(e) => Err(e.to_string()),
                }
            } else if let Some(s) = &source.secret {
                let optional = s.optional == Some(true);
                match or_empty(sources.secret(ns, &s.name).await, optional) {
                    Ok(data) => payload(
                        &data.data,
                        s.items.as_ref(),
                        p.default_mode,
                        optional,
                        &|k| format!("references non-existent secret key: {k}"),
                    ),
                    Err(e) => Err(e.to_string()),
                }
            } else if let Some(d) = &source.downward_api {
                downward_files(
                    pod,
                    node,
                    d.items.as_deref().unwrap_or_default(),
                    p.default_mode,
                )
            } else if let Some(t) = &source.service_account_token {
                let request = TokenRequest {
                    namespace: ns.to_owned(),
                    service_account: pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.service_account_name.clone())
                        .filter(|s| !s.is_empty())
                        .unwrap_or_else(|| "default".into()),
                    audience: t.audience.clone().unwrap_or_default(),
                    expiration_seconds: t.expiration_seconds.unwrap_or(3600),
                    pod_name: crate::pod::name(pod).to_owned(),
                    pod_uid: crate::pod::uid(pod).0,
                };
                match sources.token(&request).await {
                    // With fsGroup, 0600 becomes 0640 through the ownership change (upstream).
                    Ok(token) => Ok([(
                        t.path.clone(),
                        File {
                            data: token.token.into_bytes(),
                            mode: if fs_owned(pod) {
                                0o600
                            } else {
                                mode(None, p.default_mode)
                            },
                        },
                    )]
                    .into()),
                    Err(e) => Err(e.to_string()),
                }
            } else {
                Err("unsupported projected volume source (clusterTrustBundle and podCertificate are not supported)".into())
            };
            match part {
                Ok(part) => files.extend(part),
                Err(e) => errors.push(e),
            }
        }
        return match errors.len() {
            0 => Ok(Inputs::Files {
                plugin: "kubernetes.io~projected",
                files,
                memory: true,
            }),
            1 => Err(set_up_failed(v, errors.remove(0))),
            _ => Err(set_up_failed(v, format!("[{}]", errors.join(", ")))),
        };
    }
    if let Some(claim) = &v.persistent_volume_claim {
        let wrap = |e: String| {
            unprocessable(
                v,
                format!("error processing PVC {ns}/{}: {e}", claim.claim_name),
            )
        };
        let pvc = sources
            .claim(ns, &claim.claim_name)
            .await
            .map_err(|e| wrap(format!("failed to fetch PVC from API server: {e}")))?;
        if pvc.metadata.deletion_timestamp.is_some() {
            return Err(wrap("PVC is being deleted".into()));
        }
        if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
            return Err(wrap("PVC is not bound".into()));
        }
        let pv_name = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| wrap("PVC has empty pvc.Spec.VolumeName".into()))?;
        let pv = sources
            .volume(&pv_name)
            .await
            .map_err(|e| wrap(format!("failed to fetch PV {pv_name} from API server: {e}")))?;
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        match claim_ref {
            None => {
                return Err(wrap(format!(
                    "found PV object {pv_name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
                )));
            }
            Some(r) if r.uid.is_some() && r.uid != pvc.metadata.uid => {
                return Err(wrap(format!(
                    "found PV object {pv_name} but its pv.Spec.ClaimRef.UID {} does not point to claim.UID {}",
                    r.uid.clone().unwrap_or_default(),
                    pvc.metadata.uid.clone().unwrap_or_default()
                )));
            }
            Some(_) => {}
        }
        let spec = pv.spec.as_ref();
        if spec.is_none_or(|s| s.local.is_none() && s.host_path.is_none()) {
            return Err(wrap(format!(
                "PV {pv_name} is neither a local nor a hostPath volume: only those are supported here (CSI and network volumes are not)"
            )));
        }
        return Ok(Inputs::Claim {
            pv: Box::new(pv),
            read_only: claim.read_only == Some(true),
        });
    }
    Err(unprocessable(
        v,
        format!(
            "failed to get Plugin from volumeSpec for volume {:?} err=no volume plugin matched (volume type {:?} is not supported by evlet)",
            v.name,
            type_name(v)
        ),
    ))
}

/// A persistent volume's required node affinity, checked against this node.
fn node_affinity_ok(pv: &PersistentVolume, facts: &NodeFacts) -> bool {
    let Some(required) = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    crate::node_selector::selector_matches(
        required,
        crate::node_selector::NodeRef {
            name: &facts.name,
            labels: &facts.labels,
        },
    )
}

/// Applies `fsGroup` at set-up; a failure is logged and the volume still
/// set up, as upstream's emptyDir ignores `ChangePermissions`' error.
fn change_ownership(dir: &Path, gid: u32, read_only: bool, on_root_mismatch: bool) {
    match ownership::apply(dir, gid, read_only, on_root_mismatch) {
        Ok(walked) => tracing::debug!(volume = %dir.display(), gid, ?walked, "fsGroup applied"),
        Err(e) => tracing::warn!(error = %e, "fsGroup not applied"),
    }
}

/// Sets volume `v` of `pod` up under the pod's directory `pod_dir`.
///
/// # Errors
/// [`VolumeError::SetUp`] naming the volume and what failed.
pub(super) fn set_up(
    pod_dir: &Path,
    node: &NodeFacts,
    pod: &Pod,
    v: &Volume,
    inputs: Inputs,
) -> Result<Ready, VolumeError> {
    let sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let fs_group = sc
        .and_then(|s| s.fs_group)
        .and_then(|g| u32::try_from(g).ok());
    let on_root_mismatch =
        sc.and_then(|s| s.fs_group_change_policy.as_deref()) == Some("OnRootMismatch");
    let volumes = pod_dir.join("volumes");
    if let Some(ed) = &v.empty_dir {
        let dir = volumes.join("kubernetes.io~empty-dir").join(&v.name);
        let memory = match ed.medium.as_deref() {
            None | Some("") => false,
            Some("Memory") => true,
            Some(other) => {
                return Err(set_up_failed(
                    v,
                    format!("unknown storage medium {other:?}"),
                ));
            }
        };
        // Set up once, as upstream's emptyDir: its ready file says the
        // directory (and its fsGroup) are done, so a later sync never walks
        // what the pod's containers write.
        let ready = pod_dir
            .join("plugins/kubernetes.io~empty-dir")
            .join(&v.name)
            .join("ready");
        if !empty_dir::is_ready(&dir, &ready, memory) {
            let size =
                memory.then(|| empty_dir::memory_size(node.memory, pod, ed.size_limit.as_ref()));
            empty_dir::set_up(&dir, size).map_err(|e| set_up_failed(v, e))?;
            if let Some(gid) = fs_group {
                change_ownership(&dir, gid, false, on_root_mismatch);
            }
            empty_dir::mark_ready(&ready).map_err(|e| set_up_failed(v, e))?;
        }
        return Ok(Ready {
            path: dir,
            read_only: false,
        });
    }
    if let Some(hp) = &v.host_path {
        host_path::set_up(&hp.path, hp.type_.as_deref()).map_err(|e| set_up_failed(v, e))?;
        return Ok(Ready {
            path: PathBuf::from(&hp.path),
            read_only: false,
        });
    }
    match inputs {
        Inputs::Nothing => Err(unprocessable(v, "no volume plugin matched")),
        Inputs::Files {
            plugin,
            files,
            memory,
        } => {
            let dir = volumes.join(plugin).join(&v.name);
            empty_dir::set_up(
                &dir,
                memory.then(|| empty_dir::memory_size(node.memory, pod, None)),
            )
            .map_err(|e| set_up_failed(v, e))?;
            let set_perms = |ts: &Path| {
                if let Some(gid) = fs_group {
                    change_ownership(ts, gid, true, false);
                }
            };
            atomic::write(&dir, &files, &set_perms).map_err(|e| set_up_failed(v, e.to_string()))?;
            Ok(Ready {
                path: dir,
                read_only: true,
            })
        }
        Inputs::Claim { pv, read_only } => {
            let name = pv.metadata.name.clone().unwrap_or_default();
            if !node_affinity_ok(&pv, node) {
                return Err(VolumeError::SetUp {
                    volume: v.name.clone(),
                    message: "MountVolume.NodeAffinity check failed: no matching NodeSelectorTerms"
                        .into(),
                });
            }
            let spec = pv.spec.as_ref();
            if let Some(hp) = spec.and_then(|s| s.host_path.as_ref()) {
                host_path::set_up(&hp.path, hp.type_.as_deref())
                    .map_err(|e| set_up_failed(v, e))?;
                return Ok(Ready {
                    path: PathBuf::from(&hp.path),
                    read_only,
                });
            }
            let local = spec
                .and_then(|s| s.local.as_ref())
                .ok_or_else(|| set_up_failed(v, "neither local nor hostPath"))?;
            if local.path.is_empty() {
                return Err(set_up_failed(
                    v,
                    format!("LocalVolume volume {name:?} path is empty"),
                ));
            }
            if Path::new(&local.path)
                .components()
                .any(|c| c == std::path::Component::ParentDir)
            {
                return Err(set_up_failed(
                    v,
                    format!("invalid path: {} must not contain '..'", local.path),
                ));
            }
            let dir = volumes.join("kubernetes.io~local-volume").join(&name);
            if !super::mount::is_mount_point(&dir) {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| set_up_failed(v, format!("mkdir {}: {e}", dir.display())))?;
                super::mount::bind(Path::new(&local.path), &dir).map_err(|e| {
                    set_up_failed(v, format!("mount {} at {}: {e}", local.path, dir.display()))
                })?;
                if let (Some(gid), false) = (fs_group, read_only) {
                    change_ownership(&dir, gid, false, on_root_mismatch);
                }
            }
            Ok(Ready {
                path: dir,
                read_only,
            })
        }
    }
}
