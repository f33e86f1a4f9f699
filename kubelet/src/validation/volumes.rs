//! Volumes and volume mounts, validated as the API server does: exactly one
//! source per volume, absolute host paths without `..`, projected items'
//! paths relative and beneath the volume, `subPath`/`subPathExpr` relative
//! and without `..` (mutually exclusive), known mount propagation modes.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, KeyToPath, Volume, VolumeMount};

use super::{DNS_LABEL_MSG, Errors, is_dns_label};

/// How many sources a volume names (the API allows exactly one).
fn sources(v: &Volume) -> usize {
    [
        v.empty_dir.is_some(),
        v.host_path.is_some(),
        v.config_map.is_some(),
        v.secret.is_some(),
        v.downward_api.is_some(),
        v.projected.is_some(),
        v.persistent_volume_claim.is_some(),
        v.ephemeral.is_some(),
        v.csi.is_some(),
        v.nfs.is_some(),
        v.iscsi.is_some(),
        v.image.is_some(),
        v.aws_elastic_block_store.is_some(),
        v.azure_disk.is_some(),
        v.azure_file.is_some(),
        v.cephfs.is_some(),
        v.cinder.is_some(),
        v.fc.is_some(),
        v.flex_volume.is_some(),
        v.flocker.is_some(),
        v.gce_persistent_disk.is_some(),
        v.git_repo.is_some(),
        v.glusterfs.is_some(),
        v.photon_persistent_disk.is_some(),
        v.portworx_volume.is_some(),
        v.quobyte.is_some(),
        v.rbd.is_some(),
        v.scale_io.is_some(),
        v.storageos.is_some(),
        v.vsphere_volume.is_some(),
    ]
    .iter()
    .filter(|s| **s)
    .count()
}

/// Upstream's `validateLocalDescendingPath`: relative, no `..` element.
fn local_descending(p: &str, field: &str, e: &mut Errors) {
    if p.starts_with('/') {
        e.add(
            field,
            format!("Invalid value {p:?}: must be a relative path"),
        );
    } else if p.split('/').any(|part| part == "..") {
        e.add(field, format!("Invalid value {p:?}: must not contain '..'"));
    }
}

/// Upstream's `validateLocalNonReservedPath`: also not starting with `..`.
fn local_non_reserved(p: &str, field: &str, e: &mut Errors) {
    local_descending(p, field, e);
    if p.starts_with("..") && !p.starts_with("../") && p != ".." {
        e.add(
            field,
            format!("Invalid value {p:?}: must not start with '..'"),
        );
    }
    if p.is_empty() {
        e.add(field, "Required value");
    }
}

fn items(items: Option<&Vec<KeyToPath>>, field: &str, e: &mut Errors) {
    for (k, item) in items.into_iter().flatten().enumerate() {
        local_non_reserved(&item.path, &format!("{field}.items[{k}].path"), e);
        if let Some(mode) = item.mode.filter(|m| !(0..=0o777).contains(m)) {
            e.add(
                format!("{field}.items[{k}].mode"),
                format!("Invalid value: {mode}: must be a number between 0 and 0777 (octal), both inclusive"),
            );
        }
    }
}

/// Validates the pod's volumes; returns their names.
pub(super) fn validate(volumes: &[Volume], e: &mut Errors) -> HashSet<String> {
    let mut names = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let path = format!("spec.volumes[{i}]");
        if !is_dns_label(&v.name) {
            e.add(
                format!("{path}.name"),
                format!("Invalid value {:?}: {DNS_LABEL_MSG}", v.name),
            );
        } else if !names.insert(v.name.clone()) {
            e.add(
                format!("{path}.name"),
                format!("Duplicate value {:?}", v.name),
            );
        }
        match sources(v) {
            0 => e.add(path.clone(), "Required value: must specify a volume type"),
            1 => {}
            _ => e.add(
                path.clone(),
                "Forbidden: may not specify more than 1 volume type",
            ),
        }
        if let Some(hp) = &v.host_path {
            let field = format!("{path}.hostPath.path");
            if !hp.path.starts_with('/') {
                e.add(
                    field,
                    format!("Invalid value {:?}: must be an absolute path", hp.path),
                );
            } else if hp.path.split('/').any(|part| part == "..") {
                e.add(
                    field,
                    format!("Invalid value {:?}: must not contain '..'", hp.path),
                );
            }
            if let Some(t) = hp.type_.as_deref().filter(|t| {
                ![
                    "",
                    "DirectoryOrCreate",
                    "Directory",
                    "FileOrCreate",
                    "File",
                    "Socket",
                    "CharDevice",
                    "BlockDevice",
                ]
                .contains(t)
            }) {
                e.add(
                    format!("{path}.hostPath.type"),
                    format!("Unsupported value: {t:?}: supported values: \"\", \"BlockDevice\", \"CharDevice\", \"Directory\", \"DirectoryOrCreate\", \"File\", \"FileOrCreate\", \"Socket\""),
                );
            }
        }
        if let Some(cm) = &v.config_map {
            items(cm.items.as_ref(), &format!("{path}.configMap"), e);
        }
        if let Some(s) = &v.secret {
            items(s.items.as_ref(), &format!("{path}.secret"), e);
        }
        if let Some(d) = &v.downward_api {
            for (k, item) in d.items.iter().flatten().enumerate() {
                let field = format!("{path}.downwardAPI.items[{k}]");
                local_non_reserved(&item.path, &format!("{field}.path"), e);
                if let Some(f) = &item.field_ref
                    && !crate::downward::supported_volume_field(&f.field_path)
                {
                    e.add(
                        format!("{field}.fieldRef.fieldPath"),
                        format!("Unsupported value: {:?}", f.field_path),
                    );
                }
            }
        }
        if let Some(p) = &v.projected {
            for (k, source) in p.sources.iter().flatten().enumerate() {
                let field = format!("{path}.projected.sources[{k}]");
                if let Some(cm) = &source.config_map {
                    items(cm.items.as_ref(), &format!("{field}.configMap"), e);
                }
                if let Some(s) = &source.secret {
                    items(s.items.as_ref(), &format!("{field}.secret"), e);
                }
                if let Some(t) = &source.service_account_token {
                    local_non_reserved(&t.path, &format!("{field}.serviceAccountToken.path"), e);
                    if let Some(x) = t.expiration_seconds.filter(|x| *x < 600) {
                        e.add(
                            format!("{field}.serviceAccountToken.expirationSeconds"),
                            format!("Invalid value: {x}: may not specify a duration less than 10 minutes"),
                        );
                    }
                }
            }
        }
    }
    names
}

/// Validates one volume mount of container `c` at field path `p`.
pub(super) fn validate_mount(c: &Container, m: &VolumeMount, p: &str, e: &mut Errors) {
    let sub = m.sub_path.as_deref().unwrap_or("");
    let expr = m.sub_path_expr.as_deref().unwrap_or("");
    if !sub.is_empty() && !expr.is_empty() {
        e.add(
            format!("{p}.subPathExpr"),
            format!("Invalid value {expr:?}: subPathExpr and subPath are mutually exclusive"),
        );
    }
    if !sub.is_empty() {
        local_descending(sub, &format!("{p}.subPath"), e);
    }
    if !expr.is_empty() {
        local_descending(expr, &format!("{p}.subPathExpr"), e);
    }
    match m.mount_propagation.as_deref() {
        None | Some("None" | "HostToContainer") => {}
        Some("Bidirectional") => {
            if !c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false) {
                e.add(
                    format!("{p}.mountPropagation"),
                    "Forbidden: Bidirectional mount propagation is available only to privileged containers",
                );
            }
        }
        Some(other) => e.add(
            format!("{p}.mountPropagation"),
            format!("Unsupported value: {other:?}: supported values: \"Bidirectional\", \"HostToContainer\", \"None\""),
        ),
    }
    if let Some(rro) = m.recursive_read_only.as_deref() {
        if !["Disabled", "IfPossible", "Enabled"].contains(&rro) {
            e.add(
                format!("{p}.recursiveReadOnly"),
                format!("Unsupported value: {rro:?}: supported values: \"Disabled\", \"Enabled\", \"IfPossible\""),
            );
        } else if rro != "Disabled" && m.read_only != Some(true) {
            e.add(
                format!("{p}.recursiveReadOnly"),
                "Forbidden: may only be specified when readOnly is true",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::validation::validate;

    fn errors(spec: &str) -> Vec<String> {
        let pod =
            serde_yaml::from_str(&format!("metadata: {{name: p}}\nspec:\n{spec}")).expect("pod");
        match validate(&pod) {
            Ok(()) => Vec::new(),
            Err(e) => e.errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn every_volume_type_is_known_and_paths_stay_beneath_the_volume() {
        assert_eq!(
            errors(
                "  volumes:\n  - {name: a, downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}}\n  - {name: b, projected: {sources: [{downwardAPI: {items: [{path: ns, fieldRef: {fieldPath: metadata.namespace}}]}}]}}\n  - {name: c, nfs: {server: s, path: /x}}\n  containers: [{name: x, image: i, volumeMounts: [{name: a, mountPath: /a, subPathExpr: 'logs/$(POD)'}]}]\n"
            ),
            ["spec.volumes[2].nfs: Forbidden: evlet has no volume plugin for this volume type"],
            "a valid volume of a type evlet has no plugin for is refused, nothing else"
        );
        assert_eq!(
            errors(
                "  volumes:\n  - {name: a, hostPath: {path: /var/../etc, type: Dir}}\n  - {name: b, configMap: {name: c, items: [{key: k, path: ../../etc/passwd}]}}\n  - {name: c}\n  containers: [{name: x, image: i, volumeMounts: [{name: a, mountPath: /a, subPath: /etc}, {name: a, mountPath: /b, subPath: x/../../y, mountPropagation: Bidirectional}]}]\n"
            ),
            [
                "spec.volumes[0].hostPath.path: Invalid value \"/var/../etc\": must not contain '..'",
                "spec.volumes[0].hostPath.type: Unsupported value: \"Dir\": supported values: \"\", \"BlockDevice\", \"CharDevice\", \"Directory\", \"DirectoryOrCreate\", \"File\", \"FileOrCreate\", \"Socket\"",
                "spec.volumes[1].configMap.items[0].path: Invalid value \"../../etc/passwd\": must not contain '..'",
                "spec.volumes[2]: Required value: must specify a volume type",
                "spec.containers[0].volumeMounts[0].subPath: Invalid value \"/etc\": must be a relative path",
                "spec.containers[0].volumeMounts[1].subPath: Invalid value \"x/../../y\": must not contain '..'",
                "spec.containers[0].volumeMounts[1].mountPropagation: Forbidden: Bidirectional mount propagation is available only to privileged containers",
            ]
        );
    }
}
