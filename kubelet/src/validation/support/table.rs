//! How evlet treats every field of the pod types it runs: honoured on the
//! node, not the node's (the API server, scheduler or controllers act on it,
//! and upstream kubelet ignores it too), or refused naming the field. A test
//! walks the k8s-openapi types evlet builds with and fails on a field this
//! table does not classify, so a crate upgrade that adds a field fails CI
//! until it is classified; the README's list of refused fields and
//! `docs/pod-spec-support.md` are generated from it.

/// What evlet does with a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Honoured on the node, as upstream kubelet honours it.
    Node,
    /// Not the node's: who acts on it instead (upstream kubelet ignores it too).
    Elsewhere(&'static str),
    /// Refused, with the pod's field named, when set as described.
    Refused(&'static str),
}

use Treatment::Node as N;

const fn e(who: &'static str) -> Treatment {
    Treatment::Elsewhere(who)
}

const fn r(why: &'static str) -> Treatment {
    Treatment::Refused(why)
}

/// A type's fields and their treatment.
pub type Fields = &'static [(&'static str, Treatment)];

const NO_PLUGIN: Treatment = r("any value: evlet has no volume plugin for this type");

/// Every classified type (k8s-openapi's name) and its fields (their JSON names).
pub const TYPES: &[(&str, Fields)] = &[
    (
        "Pod",
        &[
            ("apiVersion", N),
            ("kind", N),
            ("metadata", N),
            ("spec", N),
            (
                "status",
                e("written by the node; read only for a finished pod's phase"),
            ),
        ],
    ),
    (
        "PodSpec",
        &[
            ("activeDeadlineSeconds", N),
            ("affinity", N),
            (
                "automountServiceAccountToken",
                e("the API server's ServiceAccount admission adds the token volume"),
            ),
            ("containers", N),
            ("dnsConfig", N),
            ("dnsPolicy", N),
            ("enableServiceLinks", N),
            (
                "ephemeralContainers",
                r("non-empty: evlet does not run ephemeral containers"),
            ),
            ("evictionResponders", e("the Eviction API's responders")),
            ("hostAliases", N),
            ("hostIPC", N),
            ("hostNetwork", N),
            ("hostPID", N),
            (
                "hostUsers",
                r("false: evlet does not support user namespaces"),
            ),
            ("hostname", N),
            ("hostnameOverride", N),
            ("imagePullSecrets", N),
            ("initContainers", N),
            ("nodeName", N),
            ("nodeSelector", N),
            ("os", N),
            ("overhead", N),
            ("preemptionPolicy", e("the scheduler's")),
            ("priority", N),
            (
                "priorityClassName",
                e("the API server resolves it into priority"),
            ),
            ("readinessGates", N),
            (
                "resourceClaims",
                r("non-empty: evlet does not support dynamic resource allocation"),
            ),
            ("resources", N),
            ("restartPolicy", N),
            ("runtimeClassName", N),
            ("schedulerName", e("the scheduler's")),
            ("schedulingGates", e("the scheduler's")),
            ("schedulingGroup", e("the scheduler's")),
            ("securityContext", N),
            (
                "serviceAccount",
                e("the API server copies it into serviceAccountName"),
            ),
            ("serviceAccountName", N),
            ("setHostnameAsFQDN", N),
            ("shareProcessNamespace", N),
            ("subdomain", N),
            ("terminationGracePeriodSeconds", N),
            ("tolerations", N),
            ("topologySpreadConstraints", e("the scheduler's")),
            ("volumes", N),
        ],
    ),
    (
        "Container",
        &[
            ("args", N),
            ("command", N),
            ("env", N),
            ("envFrom", N),
            ("image", N),
            ("imagePullPolicy", N),
            ("lifecycle", N),
            ("livenessProbe", N),
            ("name", N),
            ("ports", N),
            ("readinessProbe", N),
            (
                "resizePolicy",
                e("in-place resize, which evlet refuses with an UnsupportedPodSpec event"),
            ),
            ("resources", N),
            ("restartPolicy", N),
            (
                "restartPolicyRules",
                r("non-empty: evlet does not support container restart rules"),
            ),
            ("securityContext", N),
            ("startupProbe", N),
            ("stdin", N),
            ("stdinOnce", N),
            ("terminationMessagePath", N),
            ("terminationMessagePolicy", N),
            ("tty", N),
            (
                "volumeDevices",
                r("non-empty: evlet does not support raw block volumes"),
            ),
            ("volumeMounts", N),
            ("workingDir", N),
        ],
    ),
    (
        "ResourceRequirements",
        &[
            (
                "claims",
                r("non-empty: evlet does not support dynamic resource allocation"),
            ),
            ("limits", N),
            ("requests", N),
        ],
    ),
    (
        "Volume",
        &[
            ("name", N),
            ("awsElasticBlockStore", NO_PLUGIN),
            ("azureDisk", NO_PLUGIN),
            ("azureFile", NO_PLUGIN),
            ("cephfs", NO_PLUGIN),
            ("cinder", NO_PLUGIN),
            ("configMap", N),
            ("csi", NO_PLUGIN),
            ("downwardAPI", N),
            ("emptyDir", N),
            ("ephemeral", NO_PLUGIN),
            ("fc", NO_PLUGIN),
            ("flexVolume", NO_PLUGIN),
            ("flocker", NO_PLUGIN),
            ("gcePersistentDisk", NO_PLUGIN),
            ("gitRepo", NO_PLUGIN),
            ("glusterfs", NO_PLUGIN),
            ("hostPath", N),
            ("image", NO_PLUGIN),
            ("iscsi", NO_PLUGIN),
            ("nfs", NO_PLUGIN),
            ("persistentVolumeClaim", N),
            ("photonPersistentDisk", NO_PLUGIN),
            ("portworxVolume", NO_PLUGIN),
            ("projected", N),
            ("quobyte", NO_PLUGIN),
            ("rbd", NO_PLUGIN),
            ("scaleIO", NO_PLUGIN),
            ("secret", N),
            ("storageos", NO_PLUGIN),
            ("vsphereVolume", NO_PLUGIN),
        ],
    ),
    (
        "VolumeProjection",
        &[
            (
                "clusterTrustBundle",
                r("any value: evlet does not project cluster trust bundles"),
            ),
            ("configMap", N),
            ("downwardAPI", N),
            (
                "podCertificate",
                r("any value: evlet does not project pod certificates"),
            ),
            ("secret", N),
            ("serviceAccountToken", N),
        ],
    ),
    (
        "VolumeMount",
        &[
            (
                "bindMountOptions",
                r("non-empty: evlet does not apply extra bind-mount options"),
            ),
            ("mountPath", N),
            ("mountPropagation", N),
            ("name", N),
            ("readOnly", N),
            ("recursiveReadOnly", N),
            ("subPath", N),
            ("subPathExpr", N),
        ],
    ),
    (
        "SecurityContext",
        &[
            ("allowPrivilegeEscalation", N),
            ("appArmorProfile", N),
            ("capabilities", N),
            ("privileged", N),
            ("procMount", N),
            ("readOnlyRootFilesystem", N),
            ("runAsGroup", N),
            ("runAsNonRoot", N),
            ("runAsUser", N),
            ("seLinuxOptions", N),
            ("seccompProfile", N),
            (
                "windowsOptions",
                e("Windows nodes'; a Linux kubelet ignores it, as upstream"),
            ),
        ],
    ),
    (
        "PodSecurityContext",
        &[
            ("appArmorProfile", N),
            ("fsGroup", N),
            ("fsGroupChangePolicy", N),
            ("runAsGroup", N),
            ("runAsNonRoot", N),
            ("runAsUser", N),
            (
                "seLinuxChangePolicy",
                e(
                    "SELinux relabelling, which applies only where SELinux is enforced; evlet's runtime runs with SELinux off, where upstream's relabels nothing either",
                ),
            ),
            ("seLinuxOptions", N),
            ("seccompProfile", N),
            ("supplementalGroups", N),
            ("supplementalGroupsPolicy", N),
            ("sysctls", N),
            (
                "windowsOptions",
                e("Windows nodes'; a Linux kubelet ignores it, as upstream"),
            ),
        ],
    ),
    (
        "SeccompProfile",
        &[
            ("localhostProfile", N),
            (
                "type",
                r(
                    "other than RuntimeDefault, Unconfined or Localhost: never run less confined than asked",
                ),
            ),
        ],
    ),
    (
        "AppArmorProfile",
        &[
            ("localhostProfile", N),
            (
                "type",
                r(
                    "other than RuntimeDefault, Unconfined or Localhost: never run less confined than asked",
                ),
            ),
        ],
    ),
    ("Capabilities", &[("add", N), ("drop", N)]),
    (
        "SELinuxOptions",
        &[("level", N), ("role", N), ("type", N), ("user", N)],
    ),
    ("PodOS", &[("name", N)]),
    ("Sysctl", &[("name", N), ("value", N)]),
    (
        "Probe",
        &[
            ("exec", N),
            ("failureThreshold", N),
            ("grpc", N),
            ("httpGet", N),
            ("initialDelaySeconds", N),
            ("periodSeconds", N),
            ("successThreshold", N),
            ("tcpSocket", N),
            ("terminationGracePeriodSeconds", N),
            ("timeoutSeconds", N),
        ],
    ),
    (
        "GRPCAction",
        &[
            ("mode", r("TLS: evlet's gRPC probe speaks plaintext only")),
            ("port", N),
            ("service", N),
        ],
    ),
    (
        "HTTPGetAction",
        &[
            ("host", N),
            ("httpHeaders", N),
            ("path", N),
            ("port", N),
            (
                "protocol",
                r("other than HTTP/1.1: evlet's HTTP probes and hooks speak HTTP/1.1"),
            ),
            ("scheme", N),
        ],
    ),
    ("TCPSocketAction", &[("host", N), ("port", N)]),
    ("ExecAction", &[("command", N)]),
    ("SleepAction", &[("seconds", N)]),
    (
        "Lifecycle",
        &[
            ("postStart", N),
            ("preStop", N),
            (
                "stopSignal",
                r("any value: evlet's CRI cannot pass a stop signal to the runtime"),
            ),
        ],
    ),
    (
        "LifecycleHandler",
        &[("exec", N), ("httpGet", N), ("sleep", N), ("tcpSocket", N)],
    ),
    ("EnvVar", &[("name", N), ("value", N), ("valueFrom", N)]),
    (
        "EnvVarSource",
        &[
            ("configMapKeyRef", N),
            ("fieldRef", N),
            (
                "fileKeyRef",
                r("any value: evlet does not read env values from files"),
            ),
            ("resourceFieldRef", N),
            ("secretKeyRef", N),
        ],
    ),
    (
        "EnvFromSource",
        &[("configMapRef", N), ("prefix", N), ("secretRef", N)],
    ),
    (
        "ContainerPort",
        &[
            ("containerPort", N),
            ("hostIP", N),
            ("hostPort", N),
            ("name", N),
            ("protocol", N),
        ],
    ),
];

/// The treatment of `field` of type `of`, if classified.
pub fn treatment(of: &str, field: &str) -> Option<Treatment> {
    TYPES
        .iter()
        .find(|(t, _)| *t == of)?
        .1
        .iter()
        .find(|(f, _)| *f == field)
        .map(|(_, t)| *t)
}

/// The refused fields as a Markdown table (the README's); a type's fields
/// refused for one reason share a row.
pub fn refused_markdown() -> String {
    let mut out = String::from("| field | refused when |\n|---|---|\n");
    for (of, fields) in TYPES {
        let mut rows: Vec<(&str, Vec<&str>)> = Vec::new();
        for (field, treatment) in *fields {
            if let Treatment::Refused(why) = treatment {
                match rows.iter_mut().find(|(w, _)| w == why) {
                    Some((_, names)) => names.push(field),
                    None => rows.push((why, vec![field])),
                }
            }
        }
        for (why, names) in rows {
            let names = match names.as_slice() {
                [one] => format!("`{of}.{one}`"),
                many => format!(
                    "`{of}.` {}",
                    many.iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            out.push_str(&format!("| {names} | {why} |\n"));
        }
    }
    out
}

/// Every classified field as a Markdown document (`docs/pod-spec-support.md`).
pub fn full_markdown() -> String {
    let mut out = String::from(
        "# Pod-spec support\n\n\
         Generated from `kubelet/src/validation/support/table.rs` (a test checks this file \
         against it). **H**: honoured on the node as upstream kubelet honours it; **–**: not the \
         node's (who acts on it instead; upstream kubelet ignores it too); **R**: the pod is \
         refused, naming the field, when it is set as described.\n",
    );
    for (of, fields) in TYPES {
        out.push_str(&format!("\n## {of}\n\n| field | | |\n|---|---|---|\n"));
        for (field, treatment) in *fields {
            let (mark, note) = match treatment {
                Treatment::Node => ("H", ""),
                Treatment::Elsewhere(who) => ("–", *who),
                Treatment::Refused(why) => ("R", *why),
            };
            out.push_str(&format!("| `{field}` | {mark} | {note} |\n"));
        }
    }
    out
}
