//! The downward API: a pod's own fields and a container's resources, as env
//! values and as files of `downwardAPI` volumes (upstream's `fieldpath`
//! package). Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::cm::allocatable::Resources;
use crate::quantity;

/// Field paths `fieldRef` supports in env vars (upstream's list).
pub fn supported_env_field(path: &str) -> bool {
    matches!(
        path,
        "metadata.name"
            | "metadata.namespace"
            | "metadata.uid"
            | "spec.nodeName"
            | "spec.serviceAccountName"
            | "status.hostIP"
            | "status.hostIPs"
            | "status.podIP"
            | "status.podIPs"
    ) || path.starts_with("metadata.labels['")
        || path.starts_with("metadata.annotations['")
}

/// Field paths `fieldRef` supports in `downwardAPI` volume items: the pod's
/// metadata only (upstream's volume validation).
pub fn supported_volume_field(path: &str) -> bool {
    matches!(
        path,
        "metadata.name"
            | "metadata.namespace"
            | "metadata.uid"
            | "metadata.labels"
            | "metadata.annotations"
    ) || path.starts_with("metadata.labels['")
        || path.starts_with("metadata.annotations['")
}

/// The value of field `path` of `pod`, with the pod and host IPs known at run
/// time. None for a path it does not have.
pub fn field(pod: &Pod, path: &str, pod_ip: Option<&str>, host_ip: Option<&str>) -> Option<String> {
    let meta = &pod.metadata;
    let keyed = |prefix: &str, map: &Option<BTreeMap<String, String>>| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(
            map.as_ref()
                .and_then(|m| m.get(key))
                .cloned()
                .unwrap_or_default(),
        )
    };
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => Some(crate::pod::namespace(pod).to_owned()),
        "metadata.uid" => meta.uid.clone(),
        "metadata.labels" => Some(format_map(meta.labels.as_ref())),
        "metadata.annotations" => Some(format_map(meta.annotations.as_ref())),
        "spec.nodeName" => pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone()),
        "status.hostIP" | "status.hostIPs" => host_ip.map(str::to_owned),
        "status.podIP" | "status.podIPs" => pod_ip.map(str::to_owned),
        p if p.starts_with("metadata.labels['") => keyed("metadata.labels['", &meta.labels),
        p if p.starts_with("metadata.annotations['") => {
            keyed("metadata.annotations['", &meta.annotations)
        }
        _ => None,
    }
}

/// Labels or annotations as a downward API file: `key="value"` lines in key
/// order, values quoted as Go's `%q` (upstream's `fieldpath.FormatMap`).
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Go's `strconv.Quote`: double quotes, with `"`, `\` and non-printable
/// characters escaped.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Why a `resourceFieldRef` has no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// A resource the downward API does not offer.
    #[error("unsupported resource {0:?}")]
    Unsupported(String),
    /// A resource value or divisor that is not a quantity.
    #[error(transparent)]
    Quantity(#[from] quantity::InvalidQuantity),
}

/// Container `c`'s `resource` (`limits.cpu`, `requests.memory`, ...) of
/// `pod` in units of `divisor`, rounded up (upstream's
/// `ExtractContainerResourceValue`). A zero divisor is 1 (1 core for CPU), as
/// upstream's: the API server stores an unset `divisor` as `"0"`, so this is
/// what every `resourceFieldRef` written without one carries. A limit the
/// container does not set is
/// the pod's own (`spec.resources`), else the node's `allocatable`, as
/// upstream's `defaultPodLimitsForDownwardAPI` fills it in.
///
/// # Errors
/// [`ResourceError`] for an unknown resource or a bad quantity.
pub fn resource(
    pod: &Pod,
    c: &Container,
    allocatable: &Resources,
    resource: &str,
    divisor: Option<&str>,
) -> Result<String, ResourceError> {
    let unsupported = || ResourceError::Unsupported(resource.to_owned());
    let (kind, name) = resource.split_once('.').ok_or_else(unsupported)?;
    let res = c.resources.as_ref();
    let list = match kind {
        "limits" => res.and_then(|r| r.limits.as_ref()),
        "requests" => res.and_then(|r| r.requests.as_ref()),
        _ => return Err(unsupported()),
    };
    // A request the container does not set is its limit (the API server's
    // and the static pod sources' defaulting).
    let q = list
        .and_then(|l| l.get(name))
        .or_else(|| {
            (kind == "requests")
                .then(|| {
                    res.and_then(|r| r.limits.as_ref())
                        .and_then(|l| l.get(name))
                })
                .flatten()
        })
        .map(|q| q.0.as_str());
    let cpu = name == "cpu";
    let value = match q {
        Some(q) if cpu => quantity::parse_milli(q)?,
        Some(q) => quantity::parse(q)?,
        None => 0,
    };
    let value = if kind == "limits" && value == 0 {
        let (pod_cpu, pod_memory) =
            crate::resources::pod_level(pod).map_or((None, None), |p| p.limits);
        match name {
            "cpu" => pod_cpu.filter(|v| *v != 0).unwrap_or(allocatable.cpu_milli),
            "memory" => pod_memory.filter(|v| *v != 0).unwrap_or(allocatable.memory),
            "ephemeral-storage" => allocatable.ephemeral_storage,
            _ => value,
        }
    } else {
        value
    };
    let div = match divisor {
        Some(d) if cpu => quantity::parse_milli(d)?,
        Some(d) => quantity::parse(d)?,
        None => 0,
    };
    let div = match div {
        0 if cpu => 1000,
        0 => 1,
        d => d,
    };
    Ok(((value + div - 1) / div).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_limits_are_the_pods_own_else_the_nodes_allocatable() {
        let node = Resources {
            cpu_milli: 1900,
            memory: 8 << 30,
            ephemeral_storage: 100 << 30,
            pids: 0,
        };
        let pod = |resources: &str| -> Pod {
            serde_yaml::from_str(&format!(
                "spec:\n{resources}  containers:\n  - {{name: a, resources: {{limits: {{memory: 64Mi}}}}}}\n"
            ))
            .expect("pod")
        };
        let get = |p: &Pod, r: &str, d: Option<&str>| {
            let c = &p.spec.as_ref().expect("spec").containers[0];
            resource(p, c, &node, r, d).expect("value")
        };
        let plain = pod("");
        assert_eq!(get(&plain, "limits.cpu", Some("1m")), "1900");
        assert_eq!(
            get(&plain, "limits.memory", None),
            (64u64 << 20).to_string()
        );
        assert_eq!(
            get(&plain, "requests.memory", Some("1Mi")),
            "64",
            "defaults to the limit"
        );
        assert_eq!(get(&plain, "requests.cpu", None), "0");
        assert_eq!(get(&plain, "limits.ephemeral-storage", Some("1Gi")), "100");
        let own = pod("  resources: {limits: {cpu: 500m, memory: 1Gi}}\n");
        assert_eq!(get(&own, "limits.cpu", Some("1m")), "500");
        assert_eq!(get(&own, "limits.cpu", None), "1", "rounded up");
        // The API server stores an unset divisor as "0": upstream reads 1.
        assert_eq!(get(&own, "limits.cpu", Some("0")), "1");
        assert_eq!(
            get(&own, "limits.memory", Some("0")),
            (64u64 << 20).to_string()
        );
        assert_eq!(
            get(&own, "limits.memory", Some("1Mi")),
            "64",
            "the container's own"
        );
    }

    #[test]
    fn maps_are_sorted_lines_quoted_as_go_does() {
        let m: BTreeMap<String, String> = [
            ("b".to_owned(), "two words".to_owned()),
            ("a".to_owned(), "say \"hi\"\n".to_owned()),
        ]
        .into();
        assert_eq!(
            format_map(Some(&m)),
            "a=\"say \\\"hi\\\"\\n\"\nb=\"two words\""
        );
        assert_eq!(format_map(None), "");
        assert_eq!(go_quote("é\u{1}"), "\"é\\x01\"");
    }
}
