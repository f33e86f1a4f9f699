//! Pod-spec fields evlet does not honour. A pod that sets one is refused
//! with the field's path and the reason, never run as if the field were
//! absent: static pods fail validation, API pods are rejected at admission.
//! [`table`] classifies every field of the pod types; [`unsupported`] finds
//! the refused ones in a spec, [`unsupported_by_runtime`] those the node's
//! runtime cannot do.

pub mod table;
#[cfg(test)]
mod walk;

use k8s_openapi::api::core::v1::{
    AppArmorProfile, Container, PodSpec, SeccompProfile, Volume, VolumeProjection,
};

use super::FieldError;

/// What the node's container runtime reports it can do (CRI `Status`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuntimeSupport {
    /// `features.supplemental_groups_policy`: `supplementalGroupsPolicy:
    /// Strict` is enforced (containerd 1.6 and 1.7 quietly merge instead).
    pub supplemental_groups_policy: bool,
}

/// Fields of `spec` the node's runtime cannot honour: upstream's admission
/// rejects them (`SupplementalGroupsPolicyNotSupported`).
pub fn unsupported_by_runtime(spec: &PodSpec, runtime: &RuntimeSupport) -> Vec<FieldError> {
    let strict = spec
        .security_context
        .as_ref()
        .and_then(|s| s.supplemental_groups_policy.as_deref())
        == Some("Strict");
    if strict && !runtime.supplemental_groups_policy {
        return vec![FieldError {
            field: "spec.securityContext.supplementalGroupsPolicy".into(),
            message: "Forbidden: Strict: the container runtime on this node does not support it (it would merge the image's groups silently)".into(),
        }];
    }
    Vec::new()
}

/// Every field of `spec` that evlet would have to ignore to run the pod.
pub fn unsupported(spec: &PodSpec) -> Vec<FieldError> {
    let mut found = Vec::new();
    let mut add = |field: String, message: &str| {
        found.push(FieldError {
            field,
            message: format!("Forbidden: {message}"),
        });
    };
    if spec
        .ephemeral_containers
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        add(
            "spec.ephemeralContainers".into(),
            "evlet does not run ephemeral containers",
        );
    }
    if spec.host_users == Some(false) {
        add(
            "spec.hostUsers".into(),
            "evlet does not support user namespaces",
        );
    }
    if let Some(sc) = &spec.security_context {
        profiles(
            "spec.securityContext",
            sc.seccomp_profile.as_ref(),
            sc.app_armor_profile.as_ref(),
            &mut add,
        );
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        volume(v, &format!("spec.volumes[{i}]"), &mut add);
    }
    if spec.resource_claims.as_ref().is_some_and(|r| !r.is_empty()) {
        add(
            "spec.resourceClaims".into(),
            "evlet does not support dynamic resource allocation",
        );
    }
    let pod_hugepages = spec.resources.iter().flat_map(|r| {
        [("limits", &r.limits), ("requests", &r.requests)]
            .into_iter()
            .flat_map(|(kind, list)| list.iter().flatten().map(move |(name, _)| (kind, name)))
    });
    for (kind, name) in pod_hugepages {
        if name.starts_with("hugepages-") {
            add(
                format!("spec.resources.{kind}[{name}]"),
                "evlet does not support hugepages",
            );
        }
    }
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("spec.containers[{i}]"), c)),
        );
    for (path, c) in containers {
        container(c, &path, &mut add);
    }
    found
}

/// A known seccomp or AppArmor profile type: anything else would run the
/// container less confined than asked (never a silent downgrade).
fn known_profile(kind: &str) -> bool {
    matches!(kind, "RuntimeDefault" | "Unconfined" | "Localhost")
}

fn profiles(
    path: &str,
    seccomp: Option<&SeccompProfile>,
    apparmor: Option<&AppArmorProfile>,
    add: &mut impl FnMut(String, &str),
) {
    if let Some(p) = seccomp.filter(|p| !known_profile(&p.type_)) {
        add(
            format!("{path}.seccompProfile.type"),
            &format!("{:?}: unknown seccomp profile type", p.type_),
        );
    }
    if let Some(p) = apparmor.filter(|p| !known_profile(&p.type_)) {
        add(
            format!("{path}.appArmorProfile.type"),
            &format!("{:?}: unknown AppArmor profile type", p.type_),
        );
    }
}

/// A volume of a type no plugin of evlet's handles, named as upstream's
/// volume manager names it, and projections evlet cannot make.
fn volume(v: &Volume, path: &str, add: &mut impl FnMut(String, &str)) {
    for (field, treatment) in table::TYPES
        .iter()
        .find(|(t, _)| *t == "Volume")
        .map(|(_, f)| *f)
        .unwrap_or_default()
    {
        if matches!(treatment, table::Treatment::Refused(_)) && volume_has(v, field) {
            add(
                format!("{path}.{field}"),
                "evlet has no volume plugin for this volume type",
            );
        }
    }
    for (j, source) in v
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
        .enumerate()
    {
        projection(source, &format!("{path}.projected.sources[{j}]"), add);
    }
}

fn projection(s: &VolumeProjection, path: &str, add: &mut impl FnMut(String, &str)) {
    if s.cluster_trust_bundle.is_some() {
        add(
            format!("{path}.clusterTrustBundle"),
            "evlet does not project cluster trust bundles",
        );
    }
    if s.pod_certificate.is_some() {
        add(
            format!("{path}.podCertificate"),
            "evlet does not project pod certificates",
        );
    }
}

/// Is the volume source named `field` (its JSON name) set?
fn volume_has(v: &Volume, field: &str) -> bool {
    match field {
        "awsElasticBlockStore" => v.aws_elastic_block_store.is_some(),
        "azureDisk" => v.azure_disk.is_some(),
        "azureFile" => v.azure_file.is_some(),
        "cephfs" => v.cephfs.is_some(),
        "cinder" => v.cinder.is_some(),
        "csi" => v.csi.is_some(),
        "ephemeral" => v.ephemeral.is_some(),
        "fc" => v.fc.is_some(),
        "flexVolume" => v.flex_volume.is_some(),
        "flocker" => v.flocker.is_some(),
        "gcePersistentDisk" => v.gce_persistent_disk.is_some(),
        "gitRepo" => v.git_repo.is_some(),
        "glusterfs" => v.glusterfs.is_some(),
        "image" => v.image.is_some(),
        "iscsi" => v.iscsi.is_some(),
        "nfs" => v.nfs.is_some(),
        "photonPersistentDisk" => v.photon_persistent_disk.is_some(),
        "portworxVolume" => v.portworx_volume.is_some(),
        "quobyte" => v.quobyte.is_some(),
        "rbd" => v.rbd.is_some(),
        "scaleIO" => v.scale_io.is_some(),
        "storageos" => v.storageos.is_some(),
        "vsphereVolume" => v.vsphere_volume.is_some(),
        _ => false,
    }
}

fn container(c: &Container, path: &str, add: &mut impl FnMut(String, &str)) {
    if let Some(sc) = &c.security_context {
        profiles(
            &format!("{path}.securityContext"),
            sc.seccomp_profile.as_ref(),
            sc.app_armor_profile.as_ref(),
            add,
        );
    }
    if c.lifecycle
        .as_ref()
        .is_some_and(|l| l.stop_signal.is_some())
    {
        add(
            format!("{path}.lifecycle.stopSignal"),
            "evlet's CRI cannot pass a stop signal to the runtime",
        );
    }
    for (i, env) in c.env.iter().flatten().enumerate() {
        if env
            .value_from
            .as_ref()
            .is_some_and(|v| v.file_key_ref.is_some())
        {
            add(
                format!("{path}.env[{i}].valueFrom.fileKeyRef"),
                "evlet does not read env values from files",
            );
        }
    }
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        if m.bind_mount_options.as_ref().is_some_and(|o| !o.is_empty()) {
            add(
                format!("{path}.volumeMounts[{i}].bindMountOptions"),
                "evlet does not apply extra bind-mount options",
            );
        }
    }
    let http = |h: Option<&k8s_openapi::api::core::v1::HTTPGetAction>| {
        h.and_then(|h| h.protocol.as_deref())
            .is_some_and(|p| p != "HTTP/1.1")
    };
    let hooks = c.lifecycle.iter().flat_map(|l| {
        [("postStart", &l.post_start), ("preStop", &l.pre_stop)]
            .into_iter()
            .map(|(k, h)| {
                (
                    format!("lifecycle.{k}"),
                    h.as_ref().and_then(|h| h.http_get.as_ref()),
                )
            })
    });
    let probes = [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ];
    let probe_gets = probes.iter().map(|(k, p)| {
        (
            (*k).to_owned(),
            p.as_ref().and_then(|p| p.http_get.as_ref()),
        )
    });
    for (kind, get) in hooks.chain(probe_gets) {
        if http(get) {
            add(
                format!("{path}.{kind}.httpGet.protocol"),
                "other than HTTP/1.1: evlet's HTTP probes and hooks speak HTTP/1.1",
            );
        }
    }
    for (kind, probe) in probes {
        if probe
            .as_ref()
            .and_then(|p| p.grpc.as_ref())
            .and_then(|g| g.mode.as_deref())
            == Some("TLS")
        {
            add(
                format!("{path}.{kind}.grpc.mode"),
                "TLS: evlet's gRPC probe speaks plaintext only",
            );
        }
    }
    if c.volume_devices.as_ref().is_some_and(|d| !d.is_empty()) {
        add(
            format!("{path}.volumeDevices"),
            "evlet does not support raw block volumes",
        );
    }
    if c.restart_policy_rules
        .as_ref()
        .is_some_and(|r| !r.is_empty())
    {
        add(
            format!("{path}.restartPolicyRules"),
            "evlet does not support container restart rules",
        );
    }
    if c.resources
        .as_ref()
        .and_then(|r| r.claims.as_ref())
        .is_some_and(|cl| !cl.is_empty())
    {
        add(
            format!("{path}.resources.claims"),
            "evlet does not support dynamic resource allocation",
        );
    }
    let lists = c
        .resources
        .iter()
        .flat_map(|r| [("limits", &r.limits), ("requests", &r.requests)]);
    for (kind, list) in lists {
        for name in list.iter().flatten().map(|(n, _)| n) {
            if name.starts_with("hugepages-") {
                add(
                    format!("{path}.resources.{kind}[{name}]"),
                    "evlet does not support hugepages",
                );
            }
        }
    }
}

/// The OS a pod asks for (`spec.os.name`) when it is not Linux: upstream
/// rejects such a pod at admission (`PodOSNotSupported`).
pub fn foreign_os(spec: &PodSpec) -> Option<&str> {
    spec.os
        .as_ref()
        .map(|os| os.name.as_str())
        .filter(|name| *name != "linux")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> PodSpec {
        serde_yaml::from_str(yaml).expect("spec")
    }

    #[test]
    fn a_plain_pod_uses_nothing_unsupported() {
        let s = spec(
            "containers: [{name: a, image: i, resources: {limits: {cpu: 1}}}]\nos: {name: linux}\n",
        );
        assert!(unsupported(&s).is_empty());
        assert_eq!(foreign_os(&s), None);
    }

    #[test]
    fn each_unsupported_field_is_named() {
        let s = spec(
            "containers:\n- {name: a, image: i, volumeDevices: [{name: v, devicePath: /dev/xvda}]}\n\
             initContainers:\n- {name: b, image: i, resources: {claims: [{name: gpu}], requests: {hugepages-1Gi: 1Gi}}}\n\
             ephemeralContainers: [{name: dbg, image: i}]\n\
             resourceClaims: [{name: gpu}]\n\
             resources: {limits: {cpu: 1, hugepages-2Mi: 4Mi}}\n\
             os: {name: windows}\n",
        );
        let fields: Vec<String> = unsupported(&s).into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "spec.ephemeralContainers",
                "spec.resourceClaims",
                "spec.resources.limits[hugepages-2Mi]",
                "spec.initContainers[0].resources.claims",
                "spec.initContainers[0].resources.requests[hugepages-1Gi]",
                "spec.containers[0].volumeDevices",
            ]
        );
        assert_eq!(foreign_os(&s), Some("windows"));
    }
}
