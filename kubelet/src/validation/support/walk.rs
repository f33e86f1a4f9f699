//! The classification is complete: every field k8s-openapi's pod types have
//! (their `Deserialize` names them all) is in [`table::TYPES`], nothing there
//! is stale, every refusal is real, and the docs say what the table says.

use k8s_openapi::api::core::v1 as core;
use serde::de::{self, Deserialize, Deserializer, Visitor};

use super::table::{self, Treatment};

/// The field list a type's `Deserialize` asks for (k8s-openapi passes every
/// field's JSON name to `deserialize_struct`).
struct FieldNames(Option<(&'static str, &'static [&'static str])>);

#[derive(Debug)]
struct Stop;

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field names taken")
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Stop
    }
}

impl<'de> Deserializer<'de> for &mut FieldNames {
    type Error = Stop;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        self.0 = Some((name, fields));
        Err(Stop)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

fn fields_of<T: for<'de> Deserialize<'de>>() -> (&'static str, &'static [&'static str]) {
    let mut probe = FieldNames(None);
    let _ = T::deserialize(&mut probe);
    probe.0.expect("a struct type")
}

/// The pod types evlet builds with, as k8s-openapi names them.
fn walked() -> Vec<(&'static str, &'static [&'static str])> {
    vec![
        fields_of::<core::Pod>(),
        fields_of::<core::PodSpec>(),
        fields_of::<core::Container>(),
        fields_of::<core::ResourceRequirements>(),
        fields_of::<core::Volume>(),
        fields_of::<core::VolumeProjection>(),
        fields_of::<core::VolumeMount>(),
        fields_of::<core::SecurityContext>(),
        fields_of::<core::PodSecurityContext>(),
        fields_of::<core::SeccompProfile>(),
        fields_of::<core::AppArmorProfile>(),
        fields_of::<core::Capabilities>(),
        fields_of::<core::SELinuxOptions>(),
        fields_of::<core::PodOS>(),
        fields_of::<core::Sysctl>(),
        fields_of::<core::Probe>(),
        fields_of::<core::GRPCAction>(),
        fields_of::<core::HTTPGetAction>(),
        fields_of::<core::TCPSocketAction>(),
        fields_of::<core::ExecAction>(),
        fields_of::<core::SleepAction>(),
        fields_of::<core::Lifecycle>(),
        fields_of::<core::LifecycleHandler>(),
        fields_of::<core::EnvVar>(),
        fields_of::<core::EnvVarSource>(),
        fields_of::<core::EnvFromSource>(),
        fields_of::<core::ContainerPort>(),
    ]
}

#[test]
fn every_field_of_the_pod_types_is_honoured_refused_or_not_the_nodes() {
    let mut missing = Vec::new();
    for (of, fields) in walked() {
        for field in fields {
            if table::treatment(of, field).is_none() {
                missing.push(format!("{of}.{field}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "fields no row of validation::support::table classifies (honour them or refuse \
         them, then add them): {missing:?}"
    );
}

#[test]
fn the_table_names_no_field_the_types_do_not_have() {
    let walked = walked();
    for (of, fields) in table::TYPES {
        let known = walked
            .iter()
            .find(|(t, _)| t == of)
            .unwrap_or_else(|| panic!("{of} is classified but not walked"));
        for (field, _) in *fields {
            assert!(known.1.contains(field), "{of}.{field} no longer exists");
        }
    }
}

/// A spec that sets each refused field as its row describes.
fn sample(of: &str, field: &str) -> Option<&'static str> {
    Some(match (of, field) {
        ("PodSpec", "ephemeralContainers") => "ephemeralContainers: [{name: d, image: i}]",
        ("PodSpec", "hostUsers") => "hostUsers: false",
        ("PodSpec", "resourceClaims") => "resourceClaims: [{name: gpu}]",
        ("Container", "restartPolicyRules") => {
            "containers: [{name: a, image: i, restartPolicy: Always, restartPolicyRules: [{action: Restart, exitCodes: {operator: In, values: [42]}}]}]"
        }
        ("Container", "volumeDevices") => {
            "containers: [{name: a, image: i, volumeDevices: [{name: v, devicePath: /dev/x}]}]"
        }
        ("ResourceRequirements", "claims") => {
            "containers: [{name: a, image: i, resources: {claims: [{name: gpu}]}}]"
        }
        ("VolumeProjection", "clusterTrustBundle") => {
            "volumes: [{name: v, projected: {sources: [{clusterTrustBundle: {name: b, path: p}}]}}]"
        }
        ("VolumeProjection", "podCertificate") => {
            "volumes: [{name: v, projected: {sources: [{podCertificate: {signerName: a/b, keyType: ED25519, credentialBundlePath: c}}]}}]"
        }
        ("VolumeMount", "bindMountOptions") => {
            "containers: [{name: a, image: i, volumeMounts: [{name: v, mountPath: /v, bindMountOptions: [noexec]}]}]"
        }
        ("SeccompProfile", "type") => "securityContext: {seccompProfile: {type: Permissive}}",
        ("AppArmorProfile", "type") => {
            "containers: [{name: a, image: i, securityContext: {appArmorProfile: {type: Lax}}}]"
        }
        ("GRPCAction", "mode") => {
            "containers: [{name: a, image: i, livenessProbe: {grpc: {port: 9, mode: TLS}}}]"
        }
        ("HTTPGetAction", "protocol") => {
            "containers: [{name: a, image: i, readinessProbe: {httpGet: {port: 80, protocol: HTTP/2}}}]"
        }
        ("Lifecycle", "stopSignal") => {
            "containers: [{name: a, image: i, lifecycle: {stopSignal: SIGUSR1}}]"
        }
        ("EnvVarSource", "fileKeyRef") => {
            "containers: [{name: a, image: i, env: [{name: E, valueFrom: {fileKeyRef: {volumeName: v, path: p, key: k}}}]}]"
        }
        ("Volume", volume) => {
            return Some(Box::leak(
                format!("volumes: [{{name: v, {volume}: {{}}}}]").into_boxed_str(),
            ));
        }
        _ => return None,
    })
}

#[test]
fn every_refused_field_is_refused_naming_it() {
    for (of, fields) in table::TYPES {
        for (field, treatment) in *fields {
            if !matches!(treatment, Treatment::Refused(_)) {
                continue;
            }
            let yaml = sample(of, field)
                .unwrap_or_else(|| panic!("no sample pod sets the refused {of}.{field}"));
            let yaml = if yaml.contains("containers:") {
                yaml.to_owned()
            } else {
                format!("{yaml}\ncontainers: [{{name: a, image: i}}]")
            };
            let spec: core::PodSpec =
                serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("{of}.{field}: {e}"));
            let refused = super::unsupported(&spec);
            assert!(
                refused.iter().any(|e| e.field.ends_with(field)),
                "{of}.{field} set as its row says, and not refused: {refused:?}"
            );
        }
    }
}

/// Rewrites the generated docs when `EVLET_UPDATE_SUPPORT_DOCS` is set,
/// else checks them.
fn check_generated(path: &str, generated: &str, begin: Option<(&str, &str)>) {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let (before, current, after) = match begin {
        Some((open, close)) => {
            let a = text
                .find(open)
                .unwrap_or_else(|| panic!("{path} has no {open}"))
                + open.len();
            let b = text[a..]
                .find(close)
                .unwrap_or_else(|| panic!("{path} has no {close}"))
                + a;
            (&text[..a], &text[a..b], &text[b..])
        }
        None => ("", text.as_str(), ""),
    };
    let want = match begin {
        Some(_) => format!("\n{generated}"),
        None => generated.to_owned(),
    };
    if current == want {
        return;
    }
    if std::env::var_os("EVLET_UPDATE_SUPPORT_DOCS").is_some() {
        std::fs::write(&file, format!("{before}{want}{after}")).expect("write the docs");
        return;
    }
    panic!(
        "{path} is not what validation::support::table says; regenerate it with \
         EVLET_UPDATE_SUPPORT_DOCS=1 cargo test -p evlet --lib support"
    );
}

#[test]
fn the_readme_and_the_support_doc_say_what_the_table_says() {
    check_generated(
        "README.md",
        &table::refused_markdown(),
        Some((
            "<!-- refused fields: generated from validation::support::table -->",
            "<!-- end of refused fields -->",
        )),
    );
    check_generated("docs/pod-spec-support.md", &table::full_markdown(), None);
}
