//! Security contexts as upstream's `determineEffectiveSecurityContext`: the
//! container's fields over the pod's (user, group, non-root, SELinux,
//! seccomp, AppArmor), the container's own (capabilities, privileged,
//! read-only root, privilege escalation, `/proc` mount), the groups (fsGroup
//! first, then the pod's supplemental groups), and the sandbox's (privileged
//! if any container is, seccomp RuntimeDefault). Pure: the image's user comes
//! in as an argument.

use std::path::Path;

use evlet_cri::api;
use k8s_openapi::api::core::v1::{
    AppArmorProfile, Container, Pod, PodSecurityContext, SeccompProfile, SecurityContext,
};

/// Why a container's security context cannot be honoured (CreateContainerConfigError).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SecurityError(pub String);

/// The user an image runs as (CRI `ImageStatus`): a uid, or a name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageUser {
    /// Numeric uid, if the image names one.
    pub uid: Option<i64>,
    /// The user name, if the image names a non-numeric user.
    pub username: String,
}

impl ImageUser {
    /// The user of an image's CRI status (None: the image is not present).
    pub fn of(image: Option<api::Image>) -> Self {
        Self {
            uid: image.as_ref().and_then(|i| i.uid.as_ref()).map(|u| u.value),
            username: image.map(|i| i.username).unwrap_or_default(),
        }
    }
}

/// The paths `/proc` masks and makes read-only by default (upstream's
/// `DefaultProcMount`); `procMount: Unmasked` clears both.
const MASKED: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READONLY: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Upstream's `format.Pod`: `name_namespace(uid)`.
fn pod_ref(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        crate::pod::name(pod),
        crate::pod::namespace(pod),
        crate::pod::uid(pod)
    )
}

fn pod_sc(pod: &Pod) -> PodSecurityContext {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default()
}

/// Is any container of the pod privileged? (The sandbox is then, too.)
pub fn any_privileged(pod: &Pod) -> bool {
    pod.spec.iter().any(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.security_context.as_ref().and_then(|sc| sc.privileged) == Some(true))
    })
}

/// A seccomp profile as CRI takes it: container field, else pod field, else
/// `seccompDefault` (RuntimeDefault) or Unconfined; Localhost profiles live
/// under `<root-dir>/seccomp`.
fn seccomp(
    container: Option<&SeccompProfile>,
    pod: Option<&SeccompProfile>,
    seccomp_default: bool,
    root: &Path,
) -> Result<api::SecurityProfile, SecurityError> {
    use api::security_profile::ProfileType;
    let Some(p) = container.or(pod) else {
        return Ok(api::SecurityProfile {
            profile_type: if seccomp_default {
                ProfileType::RuntimeDefault
            } else {
                ProfileType::Unconfined
            } as i32,
            localhost_ref: String::new(),
        });
    };
    Ok(match p.type_.as_str() {
        "RuntimeDefault" => api::SecurityProfile {
            profile_type: ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        },
        "Localhost" => {
            let name = p
                .localhost_profile
                .as_deref()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    SecurityError(
                        "localhostProfile must be set if seccompProfile type is Localhost.".into(),
                    )
                })?;
            if Path::new(name)
                .components()
                .any(|c| c == std::path::Component::ParentDir)
                || name.starts_with('/')
            {
                return Err(SecurityError(format!(
                    "seccompProfile.localhostProfile {name:?} must be a relative path without '..'"
                )));
            }
            api::SecurityProfile {
                profile_type: ProfileType::Localhost as i32,
                localhost_ref: root.join("seccomp").join(name).display().to_string(),
            }
        }
        "Unconfined" => api::SecurityProfile {
            profile_type: ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        },
        // Validation refuses these pods; never run one less confined than asked.
        other => {
            return Err(SecurityError(format!(
                "unknown seccomp profile type: {other:?}"
            )));
        }
    })
}

/// The container's AppArmor profile: its field, the deprecated annotation
/// `container.apparmor.security.beta.kubernetes.io/<name>`, the pod's field
/// (upstream's order); None for the runtime's default handling.
fn apparmor(
    pod: &Pod,
    c: &Container,
    sc: &SecurityContext,
) -> Result<Option<AppArmorProfile>, SecurityError> {
    if let Some(p) = &sc.app_armor_profile {
        return Ok(Some(p.clone()));
    }
    let key = format!("container.apparmor.security.beta.kubernetes.io/{}", c.name);
    if let Some(value) = crate::pod::annotations(pod).get(&key) {
        let profile = match value.as_str() {
            "runtime/default" => Some(("RuntimeDefault", None)),
            "unconfined" => Some(("Unconfined", None)),
            v => v
                .strip_prefix("localhost/")
                .map(|n| ("Localhost", Some(n.to_owned()))),
        };
        if let Some((kind, name)) = profile {
            return Ok(Some(AppArmorProfile {
                type_: kind.into(),
                localhost_profile: name,
            }));
        }
    }
    Ok(pod_sc(pod).app_armor_profile)
}

fn apparmor_profile(p: &AppArmorProfile) -> Result<(api::SecurityProfile, String), SecurityError> {
    use api::security_profile::ProfileType;
    Ok(match p.type_.as_str() {
        "RuntimeDefault" => (
            api::SecurityProfile {
                profile_type: ProfileType::RuntimeDefault as i32,
                localhost_ref: String::new(),
            },
            "runtime/default".into(),
        ),
        "Unconfined" => (
            api::SecurityProfile {
                profile_type: ProfileType::Unconfined as i32,
                localhost_ref: String::new(),
            },
            "unconfined".into(),
        ),
        "Localhost" => {
            let name = p
                .localhost_profile
                .clone()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| SecurityError("missing localhost apparmor profile name".into()))?;
            (
                api::SecurityProfile {
                    profile_type: ProfileType::Localhost as i32,
                    localhost_ref: name.clone(),
                },
                format!("localhost/{name}"),
            )
        }
        other => {
            return Err(SecurityError(format!(
                "unknown apparmor profile type: {other:?}"
            )));
        }
    })
}

/// `runAsNonRoot` checked against the effective user (upstream's `verifyRunAsNonRoot`).
///
/// # Errors
/// Upstream's message when the container would run as root or cannot be shown not to.
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    image: &ImageUser,
) -> Result<(), SecurityError> {
    let psc = pod_sc(pod);
    let sc = c.security_context.clone().unwrap_or_default();
    if sc.run_as_non_root.or(psc.run_as_non_root) != Some(true) {
        return Ok(());
    }
    let who = format!("(pod: {:?}, container: {})", pod_ref(pod), c.name);
    match sc.run_as_user.or(psc.run_as_user) {
        Some(0) => Err(SecurityError(format!(
            "container's runAsUser breaks non-root policy {who}"
        ))),
        Some(_) => Ok(()),
        None => match image.uid {
            None if !image.username.is_empty() => Err(SecurityError(format!(
                "container has runAsNonRoot and image has non-numeric user ({}), cannot verify user is non-root {who}",
                image.username
            ))),
            None | Some(0) => Err(SecurityError(format!(
                "container has runAsNonRoot and image will run as root {who}"
            ))),
            Some(_) => Ok(()),
        },
    }
}

/// The CRI security context of container `c` of `pod`.
///
/// # Errors
/// A seccomp or AppArmor profile that cannot be expressed.
pub fn container(
    pod: &Pod,
    c: &Container,
    namespaces: api::NamespaceOption,
    seccomp_default: bool,
    root: &Path,
) -> Result<api::LinuxContainerSecurityContext, SecurityError> {
    let psc = pod_sc(pod);
    let sc = c.security_context.clone().unwrap_or_default();
    let caps = sc.capabilities.clone().unwrap_or_default();
    let unmasked = sc.proc_mount.as_deref() == Some("Unmasked");
    let privileged = sc.privileged.unwrap_or(false);
    let seccomp = seccomp(
        sc.seccomp_profile.as_ref(),
        psc.seccomp_profile.as_ref(),
        seccomp_default,
        root,
    )?;
    let (apparmor, apparmor_profile) = match apparmor(pod, c, &sc)? {
        Some(p) => {
            let (profile, name) = apparmor_profile(&p)?;
            (Some(profile), name)
        }
        None => (None, String::new()),
    };
    let selinux = sc
        .se_linux_options
        .clone()
        .or(psc.se_linux_options.clone())
        .map(|o| api::SeLinuxOption {
            user: o.user.unwrap_or_default(),
            role: o.role.unwrap_or_default(),
            r#type: o.type_.unwrap_or_default(),
            level: o.level.unwrap_or_default(),
        });
    // The deprecated string too: runtimes older than CRI 1.30 (containerd 1.6)
    // only read that one (upstream sets both).
    #[expect(deprecated, reason = "containerd 1.6 reads only the deprecated field")]
    let context = api::LinuxContainerSecurityContext {
        capabilities: Some(api::Capability {
            add_capabilities: caps.add.unwrap_or_default(),
            drop_capabilities: caps.drop.unwrap_or_default(),
            ..Default::default()
        }),
        privileged,
        namespace_options: Some(namespaces),
        selinux_options: selinux,
        run_as_user: sc
            .run_as_user
            .or(psc.run_as_user)
            .map(|v| api::Int64Value { value: v }),
        run_as_group: sc
            .run_as_group
            .or(psc.run_as_group)
            .map(|v| api::Int64Value { value: v }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        // fsGroup first, then the pod's supplemental groups (upstream).
        supplemental_groups: psc
            .fs_group
            .into_iter()
            .chain(psc.supplemental_groups.clone().unwrap_or_default())
            .collect(),
        supplemental_groups_policy: match psc.supplemental_groups_policy.as_deref() {
            Some("Strict") => api::SupplementalGroupsPolicy::Strict as i32,
            _ => api::SupplementalGroupsPolicy::Merge as i32,
        },
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        masked_paths: if unmasked || privileged {
            Vec::new()
        } else {
            MASKED.iter().map(|p| (*p).to_owned()).collect()
        },
        readonly_paths: if unmasked || privileged {
            Vec::new()
        } else {
            READONLY.iter().map(|p| (*p).to_owned()).collect()
        },
        seccomp: Some(seccomp),
        apparmor,
        apparmor_profile,
        ..Default::default()
    };
    Ok(context)
}

/// The sandbox's security context: privileged if any container is, seccomp
/// always RuntimeDefault (upstream), the pod's user, group and groups.
pub fn sandbox(pod: &Pod, namespaces: api::NamespaceOption) -> api::LinuxSandboxSecurityContext {
    let psc = pod_sc(pod);
    api::LinuxSandboxSecurityContext {
        namespace_options: Some(namespaces),
        run_as_user: psc.run_as_user.map(|v| api::Int64Value { value: v }),
        run_as_group: psc.run_as_group.map(|v| api::Int64Value { value: v }),
        supplemental_groups: psc
            .fs_group
            .into_iter()
            .chain(psc.supplemental_groups.clone().unwrap_or_default())
            .collect(),
        privileged: any_privileged(pod),
        seccomp: Some(api::SecurityProfile {
            profile_type: api::security_profile::ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "metadata: {{name: p, namespace: ns, uid: u}}\nspec:\n{yaml}"
        ))
        .expect("pod")
    }

    fn ns() -> api::NamespaceOption {
        api::NamespaceOption::default()
    }

    #[test]
    fn the_container_overrides_the_pod_and_fs_group_comes_first() {
        let p = pod(
            "  securityContext: {runAsUser: 1000, runAsGroup: 2000, fsGroup: 3000, supplementalGroups: [4000], seccompProfile: {type: RuntimeDefault}}\n  containers:\n  - {name: a, securityContext: {runAsUser: 1001, capabilities: {add: [NET_ADMIN]}, allowPrivilegeEscalation: false}}\n",
        );
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let sc = container(&p, c, ns(), false, Path::new("/var/lib/evlet")).expect("sc");
        assert_eq!(sc.run_as_user.map(|u| u.value), Some(1001));
        assert_eq!(sc.run_as_group.map(|u| u.value), Some(2000));
        assert_eq!(sc.supplemental_groups, [3000, 4000]);
        assert!(sc.no_new_privs);
        assert_eq!(
            sc.seccomp.map(|s| s.profile_type),
            Some(api::security_profile::ProfileType::RuntimeDefault as i32)
        );
        assert_eq!(sc.masked_paths.len(), 11, "the default /proc mask");
    }

    #[test]
    fn localhost_profiles_and_the_default() {
        let p = pod(
            "  containers:\n  - {name: a, securityContext: {seccompProfile: {type: Localhost, localhostProfile: audit.json}, appArmorProfile: {type: Localhost, localhostProfile: k8s-deny}}}\n  - {name: b}\n",
        );
        let spec = p.spec.as_ref().expect("spec");
        let a = container(&p, &spec.containers[0], ns(), false, Path::new("/r")).expect("a");
        assert_eq!(
            a.seccomp.map(|s| s.localhost_ref),
            Some("/r/seccomp/audit.json".into())
        );
        assert_eq!(
            a.apparmor.map(|p| p.localhost_ref),
            Some("k8s-deny".into()),
            "AppArmor names a profile, not a path"
        );
        let b = container(&p, &spec.containers[1], ns(), true, Path::new("/r")).expect("b");
        assert_eq!(
            b.seccomp.map(|s| s.profile_type),
            Some(api::security_profile::ProfileType::RuntimeDefault as i32),
            "seccompDefault"
        );
        let bad = pod(
            "  containers:\n  - {name: a, securityContext: {seccompProfile: {type: Localhost}}}\n",
        );
        assert!(
            container(
                &bad,
                &bad.spec.as_ref().expect("spec").containers[0],
                ns(),
                false,
                Path::new("/r")
            )
            .is_err()
        );
    }

    #[test]
    fn run_as_non_root_is_checked_against_the_image_user() {
        let p = pod("  securityContext: {runAsNonRoot: true}\n  containers: [{name: a}]\n");
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let root = ImageUser {
            uid: Some(0),
            username: String::new(),
        };
        assert_eq!(
            verify_run_as_non_root(&p, c, &root).expect_err("root").0,
            "container has runAsNonRoot and image will run as root (pod: \"p_ns(u)\", container: a)"
        );
        assert!(
            verify_run_as_non_root(
                &p,
                c,
                &ImageUser {
                    uid: Some(1000),
                    username: String::new()
                }
            )
            .is_ok()
        );
        let named = ImageUser {
            uid: None,
            username: "app".into(),
        };
        assert!(
            verify_run_as_non_root(&p, c, &named)
                .expect_err("named")
                .0
                .contains("non-numeric user (app)")
        );
        let by_uid = pod(
            "  securityContext: {runAsNonRoot: true, runAsUser: 1000}\n  containers: [{name: a}]\n",
        );
        assert!(
            verify_run_as_non_root(
                &by_uid,
                &by_uid.spec.as_ref().expect("spec").containers[0],
                &root
            )
            .is_ok()
        );
    }

    #[test]
    fn a_privileged_container_makes_the_sandbox_privileged() {
        let p = pod(
            "  containers:\n  - {name: a}\n  - {name: b, securityContext: {privileged: true}}\n",
        );
        assert!(sandbox(&p, ns()).privileged);
        let sc = container(
            &p,
            &p.spec.as_ref().expect("spec").containers[1],
            ns(),
            false,
            Path::new("/r"),
        )
        .expect("sc");
        assert!(sc.privileged && sc.masked_paths.is_empty());
    }
}
