//! Pod-spec fields evlet does not honour. A pod that sets one is refused
//! with the field's path and the reason, never run as if the field were
//! absent: static pods fail validation, API pods are rejected at admission.

use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::FieldError;

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

fn container(c: &Container, path: &str, add: &mut impl FnMut(String, &str)) {
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
