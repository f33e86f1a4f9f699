//! Pod sysctls admitted as upstream's sysctl admission handler: the safe set
//! (namespaced, isolated per pod) plus the node's `allowedUnsafeSysctls`; a
//! network sysctl with the host's network (or an IPC one with the host's IPC)
//! is refused, since it would change the node. Pure.

use k8s_openapi::api::core::v1::Pod;

/// Upstream's `SafeSysctlAllowlist` (the kernel-gated ones are old enough for
/// every kernel evlet supports: 5.10 and later).
pub const SAFE: [&str; 12] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// A pod refused for its sysctls: reason `SysctlForbidden`, upstream's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("forbidden sysctl: {0}")]
pub struct Forbidden(pub String);

/// Which namespace a sysctl lives in (None: not namespaced, never allowed).
fn namespace_of(name: &str) -> Option<&'static str> {
    if name.starts_with("net.") {
        Some("net")
    } else if name.starts_with("kernel.shm")
        || name.starts_with("kernel.msg")
        || name.starts_with("fs.mqueue.")
        || name == "kernel.sem"
    {
        Some("ipc")
    } else {
        None
    }
}

fn allowed(name: &str, unsafe_allowed: &[String]) -> bool {
    SAFE.contains(&name)
        || unsafe_allowed.iter().any(|a| match a.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => a == name,
        })
}

/// Checks `pod`'s sysctls against the safe set and `unsafe_allowed`.
///
/// # Errors
/// [`Forbidden`] naming the first sysctl that is not allowed.
pub fn admit(pod: &Pod, unsafe_allowed: &[String]) -> Result<(), Forbidden> {
    let Some(spec) = &pod.spec else {
        return Ok(());
    };
    for s in spec
        .security_context
        .iter()
        .flat_map(|sc| sc.sysctls.iter().flatten())
    {
        let name = s.name.replace('/', ".");
        if !allowed(&name, unsafe_allowed) {
            return Err(Forbidden(format!("{name:?} not allowlisted")));
        }
        match namespace_of(&name) {
            Some("net") if spec.host_network == Some(true) => {
                return Err(Forbidden(format!(
                    "{name:?} not allowed with host net enabled"
                )));
            }
            Some("ipc") if spec.host_ipc == Some(true) => {
                return Err(Forbidden(format!(
                    "{name:?} not allowed with host ipc enabled"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "metadata: {{name: p}}\nspec:\n  containers: [{{name: a}}]\n{spec}"
        ))
        .expect("pod")
    }

    #[test]
    fn safe_and_allowed_sysctls_pass_and_others_are_forbidden() {
        assert_eq!(
            admit(
                &pod(
                    "  securityContext: {sysctls: [{name: net.ipv4.tcp_syncookies, value: '1'}]}\n"
                ),
                &[]
            ),
            Ok(())
        );
        let unsafe_pod =
            pod("  securityContext: {sysctls: [{name: kernel.msgmax, value: '65536'}]}\n");
        assert_eq!(
            admit(&unsafe_pod, &[]).expect_err("unsafe").to_string(),
            "forbidden sysctl: \"kernel.msgmax\" not allowlisted"
        );
        assert_eq!(admit(&unsafe_pod, &["kernel.msg*".into()]), Ok(()));
        let host_net = pod(
            "  hostNetwork: true\n  securityContext: {sysctls: [{name: net.ipv4.tcp_syncookies, value: '1'}]}\n",
        );
        assert_eq!(
            admit(&host_net, &[]).expect_err("host net").to_string(),
            "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host net enabled"
        );
    }
}
