//! Pod spec validation: every problem is reported with the field path that has it
//! (`spec.containers[1].image`), the way the API server words them.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::quantity;

/// One invalid field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.containers[0].ports[1].containerPort`.
    pub field: String,
    /// What is wrong, e.g. `Required value`.
    pub message: String,
}

/// A pod that failed validation, with all its field errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod:?} is invalid: {}", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Invalid {
    /// `namespace/name` (or whatever of it is known).
    pub pod: String,
    /// Every problem found.
    pub errors: Vec<FieldError>,
}

mod handlers;
mod resources;
mod support;
mod volumes;

pub use support::{RuntimeSupport, foreign_os, table, unsupported, unsupported_by_runtime};

struct Errors(Vec<FieldError>);

impl Errors {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A label value: at most 63 characters of alphanumerics, `-`, `_` and `.`,
/// beginning and ending with an alphanumeric (or empty).
///
/// # Errors
/// What is wrong, in upstream's words.
pub fn label_value(s: &str) -> Result<(), &'static str> {
    let edge = |b: Option<&u8>| b.is_none_or(u8::is_ascii_alphanumeric);
    if s.len() > 63 {
        Err("must be no more than 63 characters")
    } else if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        || !edge(s.as_bytes().first())
        || !edge(s.as_bytes().last())
    {
        Err(
            "a valid label must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
        )
    } else {
        Ok(())
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name that
/// is a non-empty label value.
///
/// # Errors
/// What is wrong, in upstream's words.
pub fn label_key(s: &str) -> Result<(), &'static str> {
    let name = match s.rsplit_once('/') {
        Some((prefix, name)) => {
            if !is_dns_subdomain(prefix) {
                return Err("prefix part must be a lowercase RFC 1123 subdomain");
            }
            name
        }
        None => s,
    };
    if name.is_empty() {
        return Err("name part must be non-empty");
    }
    label_value(name).map_err(|_| {
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63)"
    })
}

const DNS_LABEL_MSG: &str =
    "must be a lowercase RFC 1123 label (a-z, 0-9, '-', at most 63 characters)";

/// Validates a pod as the agent will run it.
///
/// # Errors
/// [`Invalid`] listing every invalid field.
pub fn validate(pod: &Pod) -> Result<(), Invalid> {
    let mut e = Errors(Vec::new());
    let name = pod.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        e.add("metadata.name", "Required value");
    } else if !is_dns_subdomain(&name) {
        e.add(
            "metadata.name",
            format!("Invalid value {name:?}: must be a lowercase RFC 1123 subdomain"),
        );
    }
    if let Some(ns) = pod
        .metadata
        .namespace
        .as_deref()
        .filter(|ns| !is_dns_label(ns))
    {
        e.add(
            "metadata.namespace",
            format!("Invalid value {ns:?}: {DNS_LABEL_MSG}"),
        );
    }
    let Some(spec) = &pod.spec else {
        e.add("spec", "Required value");
        return finish(pod, e);
    };
    if let Some(policy) = spec.restart_policy.as_deref()
        && !["Always", "OnFailure", "Never"].contains(&policy)
    {
        e.add("spec.restartPolicy", format!("Unsupported value {policy:?}: supported values: \"Always\", \"OnFailure\", \"Never\""));
    }
    if spec.termination_grace_period_seconds.is_some_and(|g| g < 0) {
        e.add(
            "spec.terminationGracePeriodSeconds",
            "must be greater than or equal to 0",
        );
    }
    if spec.containers.is_empty() {
        e.add("spec.containers", "Required value");
    }
    e.0.extend(unsupported(spec));
    resources::validate_pod(spec, &mut e);
    if let Some(os) = foreign_os(spec) {
        e.add(
            "spec.os.name",
            format!("Unsupported value {os:?}: this node runs \"linux\""),
        );
    }
    let volumes = volumes::validate(spec.volumes.as_deref().unwrap_or_default(), &mut e);
    let grace = spec.termination_grace_period_seconds.unwrap_or(30);
    let mut names = HashSet::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let path = format!("spec.initContainers[{i}]");
        validate_container(c, &path, &volumes, &mut names, &mut e);
        handlers::validate(c, &path, !crate::pod::is_restartable_init(c), grace, &mut e);
        if let Some(policy) = c.restart_policy.as_deref()
            && policy != "Always"
        {
            e.add(
                format!("{path}.restartPolicy"),
                format!("Unsupported value {policy:?}: supported values: \"Always\""),
            );
        }
    }
    for (i, c) in spec.containers.iter().enumerate() {
        let path = format!("spec.containers[{i}]");
        validate_container(c, &path, &volumes, &mut names, &mut e);
        handlers::validate(c, &path, false, grace, &mut e);
        if c.restart_policy.is_some() {
            e.add(
                format!("{path}.restartPolicy"),
                "Forbidden: may not be set for non-init containers",
            );
        }
    }
    finish(pod, e)
}

fn finish(pod: &Pod, e: Errors) -> Result<(), Invalid> {
    if e.0.is_empty() {
        return Ok(());
    }
    Err(Invalid {
        pod: format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            pod.metadata.name.as_deref().unwrap_or("<unnamed>")
        ),
        errors: e.0,
    })
}

fn validate_container(
    c: &Container,
    path: &str,
    volumes: &HashSet<String>,
    names: &mut HashSet<String>,
    e: &mut Errors,
) {
    if !is_dns_label(&c.name) {
        e.add(
            format!("{path}.name"),
            format!("Invalid value {:?}: {DNS_LABEL_MSG}", c.name),
        );
    } else if !names.insert(c.name.clone()) {
        e.add(
            format!("{path}.name"),
            format!("Duplicate value {:?}", c.name),
        );
    }
    match c.image.as_deref() {
        None | Some("") => e.add(format!("{path}.image"), "Required value"),
        Some(image) if image.trim() != image => e.add(
            format!("{path}.image"),
            format!("Invalid value {image:?}: must not have leading or trailing whitespace"),
        ),
        Some(_) => {}
    }
    if let Some(policy) = c.image_pull_policy.as_deref()
        && !["Always", "IfNotPresent", "Never"].contains(&policy)
    {
        e.add(format!("{path}.imagePullPolicy"), format!("Unsupported value {policy:?}: supported values: \"Always\", \"IfNotPresent\", \"Never\""));
    }
    for (j, port) in c.ports.iter().flatten().enumerate() {
        let p = format!("{path}.ports[{j}]");
        if !(1..=65535).contains(&port.container_port) {
            e.add(
                format!("{p}.containerPort"),
                format!(
                    "Invalid value: {}: must be between 1 and 65535, inclusive",
                    port.container_port
                ),
            );
        }
        if let Some(hp) = port.host_port
            && !(0..=65535).contains(&hp)
        {
            e.add(
                format!("{p}.hostPort"),
                format!("Invalid value: {hp}: must be between 0 and 65535, inclusive"),
            );
        }
        if let Some(proto) = port.protocol.as_deref()
            && !["TCP", "UDP", "SCTP"].contains(&proto)
        {
            e.add(
                format!("{p}.protocol"),
                format!(
                    "Unsupported value {proto:?}: supported values: \"TCP\", \"UDP\", \"SCTP\""
                ),
            );
        }
    }
    if let Some(res) = &c.resources {
        for (kind, list) in [("limits", &res.limits), ("requests", &res.requests)] {
            for (name, q) in list.iter().flatten() {
                let field = format!("{path}.resources.{kind}[{name}]");
                let parsed = if name == "cpu" {
                    quantity::parse_milli(&q.0)
                } else {
                    quantity::parse(&q.0)
                };
                if let Err(err) = parsed {
                    e.add(field, format!("Invalid value: {err}"));
                }
            }
        }
        for name in ["cpu", "memory"] {
            let get = |list: &Option<
                std::collections::BTreeMap<
                    String,
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity,
                >,
            >| {
                list.as_ref().and_then(|l| l.get(name)).and_then(|q| {
                    if name == "cpu" {
                        quantity::parse_milli(&q.0).ok()
                    } else {
                        quantity::parse(&q.0).ok()
                    }
                })
            };
            if let (Some(limit), Some(request)) = (get(&res.limits), get(&res.requests))
                && request > limit
            {
                e.add(
                    format!("{path}.resources.requests[{name}]"),
                    format!("Invalid value: must be less than or equal to {name} limit"),
                );
            }
        }
    }
    for (j, env) in c.env.iter().flatten().enumerate() {
        let p = format!("{path}.env[{j}]");
        if env.name.is_empty() || env.name.contains('=') {
            e.add(
                format!("{p}.name"),
                format!(
                    "Invalid value {:?}: must be a non-empty name without '='",
                    env.name
                ),
            );
        }
        if let Some(from) = &env.value_from {
            let n = [
                from.field_ref.is_some(),
                from.resource_field_ref.is_some(),
                from.config_map_key_ref.is_some(),
                from.secret_key_ref.is_some(),
            ]
            .iter()
            .filter(|s| **s)
            .count();
            if n != 1 {
                e.add(format!("{p}.valueFrom"), "Invalid value: must specify exactly one of fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef");
            }
            if env.value.is_some() {
                e.add(
                    format!("{p}.valueFrom"),
                    "Invalid value: may not be specified when `value` is not empty",
                );
            }
            if let Some(f) = &from.field_ref
                && !crate::downward::supported_env_field(&f.field_path)
            {
                e.add(
                    format!("{p}.valueFrom.fieldRef.fieldPath"),
                    format!("Unsupported value {:?}", f.field_path),
                );
            }
        }
    }
    for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
        let p = format!("{path}.volumeMounts[{j}]");
        if !volumes.contains(&m.name) {
            e.add(format!("{p}.name"), format!("Not found: {:?}", m.name));
        }
        if !m.mount_path.starts_with('/') {
            e.add(
                format!("{p}.mountPath"),
                format!("Invalid value {:?}: must be an absolute path", m.mount_path),
            );
        }
        volumes::validate_mount(c, m, &p, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).expect("test pod parses")
    }

    #[test]
    fn a_plain_pod_is_valid() {
        let p = pod(
            "metadata: {name: web}\nspec:\n  containers:\n  - {name: app, image: evlet.local/test:v1}\n",
        );
        assert_eq!(validate(&p), Ok(()));
    }

    #[test]
    fn errors_name_the_field() {
        let p = pod(
            "metadata: {name: Web_1}\nspec:\n  restartPolicy: Sometimes\n  containers:\n  - {name: app, image: ''}\n  - name: app\n    image: x\n    ports: [{containerPort: 70000}]\n    resources: {limits: {memory: 12Q}}\n",
        );
        let err = validate(&p).expect_err("invalid");
        let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "spec.restartPolicy",
                "spec.containers[0].image",
                "spec.containers[1].name",
                "spec.containers[1].ports[0].containerPort",
                "spec.containers[1].resources.limits[memory]"
            ]
        );
        assert!(
            err.to_string()
                .contains("spec.containers[0].image: Required value"),
            "{err}"
        );
    }

    #[test]
    fn mounts_must_name_a_declared_volume() {
        let p = pod(
            "metadata: {name: v}\nspec:\n  volumes: [{name: data, emptyDir: {}}]\n  containers:\n  - name: app\n    image: x\n    volumeMounts: [{name: other, mountPath: /data}]\n",
        );
        let err = validate(&p).expect_err("invalid");
        assert_eq!(
            err.errors[0].field,
            "spec.containers[0].volumeMounts[0].name"
        );
    }
}
