//! Pod identity, the labels evlet puts on runtime objects, and defaulting.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Container, Pod};

/// A pod's UID.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(pub String);

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for PodUid {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// Runtime labels and annotations, the same keys upstream kubelet uses so tools
/// like `crictl` show evlet's pods as they show any kubelet's.
pub mod labels {
    /// Sandbox and container label: the pod's name.
    pub const POD_NAME: &str = "io.kubernetes.pod.name";
    /// Sandbox and container label: the pod's namespace.
    pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    /// Sandbox and container label: the pod's UID.
    pub const POD_UID: &str = "io.kubernetes.pod.uid";
    /// Container label: the container's name in the pod spec.
    pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
    /// Container annotation: hash of the container spec it was created from.
    pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
    /// Container annotation: the restart count at creation.
    pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
    /// Container annotation: the pod's grace period at creation (for orphan kills).
    pub const GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
    /// Container annotation: where the container writes its termination message.
    pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
    /// Container annotation: `File` or `FallbackToLogsOnError`.
    pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
    /// Container label: marks init containers (`init`, `sidecar`).
    pub const CONTAINER_KIND: &str = "evlet.io/container-kind";
    /// Pod annotation: where a static pod came from (`file`, `http`).
    pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
    /// Pod annotation: the static pod's content hash (also its UID).
    pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
    /// Pod annotation: when the source first saw the pod.
    pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
    /// Pod annotation on mirror pods.
    pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
    /// Pod annotation: the file a static pod was read from (evlet's own, for errors).
    pub const CONFIG_FILE: &str = "evlet.io/config.file";
}

/// The pod's UID (empty if unset).
pub fn uid(pod: &Pod) -> PodUid {
    PodUid(pod.metadata.uid.clone().unwrap_or_default())
}

/// `name_namespace`, upstream's "pod full name".
pub fn full_name(pod: &Pod) -> String {
    format!("{}_{}", name(pod), namespace(pod))
}

/// The pod's name.
pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

/// The pod's namespace (`default` if unset).
pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// `namespace/name`, for logs and errors.
pub fn key(pod: &Pod) -> String {
    format!("{}/{}", namespace(pod), name(pod))
}

/// The pod's restart policy (`Always` if unset).
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

/// The pod's grace period in seconds (30 if unset), as upstream.
pub fn grace_period(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30)
        .max(0)
}

/// Does `pod` use the ConfigMap (`secret` false) or Secret (`secret` true)
/// named `name`, in its containers' environment or its volumes?
pub fn refers_to(pod: &Pod, secret: bool, name: &str) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    let env = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.env_from.iter().flatten().any(|f| {
                if secret {
                    f.secret_ref.as_ref().is_some_and(|r| r.name == name)
                } else {
                    f.config_map_ref.as_ref().is_some_and(|r| r.name == name)
                }
            }) || c.env.iter().flatten().any(|e| {
                e.value_from.as_ref().is_some_and(|f| {
                    if secret {
                        f.secret_key_ref.as_ref().is_some_and(|r| r.name == name)
                    } else {
                        f.config_map_key_ref
                            .as_ref()
                            .is_some_and(|r| r.name == name)
                    }
                })
            })
        });
    env || spec.volumes.iter().flatten().any(|v| {
        let direct = if secret {
            v.secret
                .as_ref()
                .is_some_and(|s| s.secret_name.as_deref() == Some(name))
        } else {
            v.config_map.as_ref().is_some_and(|c| c.name == name)
        };
        direct
            || v.projected
                .iter()
                .flat_map(|p| p.sources.iter().flatten())
                .any(|s| {
                    if secret {
                        s.secret.as_ref().is_some_and(|r| r.name == name)
                    } else {
                        s.config_map.as_ref().is_some_and(|r| r.name == name)
                    }
                })
    })
}

/// True for a sidecar: an init container with `restartPolicy: Always`.
pub fn is_restartable_init(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The pod's annotations (empty map if none).
pub fn annotations(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default()
}

/// Is this a static pod (from a file or URL, not the API server)?
pub fn is_static(pod: &Pod) -> bool {
    matches!(
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(labels::CONFIG_SOURCE))
            .map(String::as_str),
        Some("file") | Some("http")
    )
}

/// The image pull policy a container gets when it names none (upstream's defaulting).
pub fn default_pull_policy(image: &str) -> &'static str {
    let tag = image.rsplit_once('/').map_or(image, |(_, last)| last);
    let has_digest = image.contains('@');
    match tag.split_once(':') {
        _ if has_digest => "IfNotPresent",
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// Fills the defaults upstream's API server would (restart policy, grace
/// period, pull policies, termination message fields, namespace).
pub fn apply_defaults(pod: &mut Pod) {
    if pod.metadata.namespace.as_deref().unwrap_or("").is_empty() {
        pod.metadata.namespace = Some("default".into());
    }
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        if c.image_pull_policy.is_none() {
            let policy = default_pull_policy(c.image.as_deref().unwrap_or(""));
            c.image_pull_policy = Some(policy.into());
        }
        c.termination_message_path
            .get_or_insert_with(|| "/dev/termination-log".into());
        c.termination_message_policy
            .get_or_insert_with(|| "File".into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_defaults_follow_the_tag() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("evlet.local/test:v1"), "IfNotPresent");
        assert_eq!(default_pull_policy("localhost:5000/app"), "Always");
        assert_eq!(default_pull_policy("app@sha256:abc"), "IfNotPresent");
    }
}
