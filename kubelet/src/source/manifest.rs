//! Static pod manifests: parsing (YAML or JSON, one or many documents, `Pod` or
//! `List`), upstream's static-pod naming and UID, defaulting and validation.

use k8s_openapi::api::core::v1::Pod;
use sha2::{Digest as _, Sha256};

use crate::pod::{self, labels};
use crate::validation;

/// Where a static pod came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StaticKind {
    /// The manifest directory.
    File,
    /// The manifest URL.
    Http,
}

impl StaticKind {
    fn as_str(self) -> &'static str {
        match self {
            StaticKind::File => "file",
            StaticKind::Http => "http",
        }
    }
}

/// A manifest that could not become pods: names the file (or URL), the pod if
/// known, and the problem (with the field path for validation errors).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {}{message}", pod.as_deref().map(|p| format!("pod {p:?}: ")).unwrap_or_default())]
pub struct ManifestError {
    /// The file path or URL.
    pub origin: String,
    /// `namespace/name` if the document got that far.
    pub pod: Option<String>,
    /// What is wrong.
    pub message: String,
}

/// What one manifest yielded: the valid pods and an error per bad document.
#[derive(Debug, Clone, Default)]
pub struct Parsed {
    /// Pods ready to run (static naming, UID, defaults applied; validated).
    pub pods: Vec<Pod>,
    /// One error per document that was rejected.
    pub errors: Vec<ManifestError>,
}

/// Parses `text` read from `origin` into static pods for `node`.
///
/// A document that fails is reported and skipped; the others still yield pods.
pub fn parse(text: &str, origin: &str, kind: StaticKind, node: &str) -> Parsed {
    let mut out = Parsed::default();
    let err = |pod: Option<String>, message: String| ManifestError {
        origin: origin.to_owned(),
        pod,
        message,
    };
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = match <serde_yaml::Value as serde::Deserialize>::deserialize(doc) {
            Ok(serde_yaml::Value::Null) => continue,
            Ok(v) => v,
            Err(e) => {
                // The rest of the stream cannot be trusted after a syntax error
                // (and serde_yaml's iterator would keep repeating it).
                out.errors
                    .push(err(None, format!("document {}: cannot parse: {e}", i + 1)));
                break;
            }
        };
        let kind_field = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        let items: Vec<serde_yaml::Value> = match kind_field {
            "Pod" => vec![value],
            "List" | "PodList" => value
                .get("items")
                .and_then(|i| i.as_sequence())
                .cloned()
                .unwrap_or_default(),
            "" => {
                out.errors.push(err(
                    None,
                    format!(
                        "document {}: kind: Required value (expected \"Pod\" or \"List\")",
                        i + 1
                    ),
                ));
                continue;
            }
            other => {
                out.errors.push(err(None, format!("document {}: kind: Unsupported value {other:?}: only \"Pod\" (or a \"List\" of them) can be a static pod", i + 1)));
                continue;
            }
        };
        for item in items {
            match to_static_pod(item, origin, kind, node) {
                Ok(p) => out.pods.push(p),
                Err((pod, message)) => out.errors.push(err(pod, message)),
            }
        }
    }
    out
}

fn to_static_pod(
    item: serde_yaml::Value,
    origin: &str,
    kind: StaticKind,
    node: &str,
) -> Result<Pod, (Option<String>, String)> {
    let name_hint = item
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(|n| n.as_str())
        .map(|n| {
            let ns = item
                .get("metadata")
                .and_then(|m| m.get("namespace"))
                .and_then(|n| n.as_str())
                .unwrap_or("default");
            format!("{ns}/{n}")
        });
    if let Some(kind_field) = item.get("kind").and_then(|k| k.as_str())
        && kind_field != "Pod"
    {
        return Err((
            name_hint,
            format!("kind: Unsupported value {kind_field:?}: only \"Pod\" can be a static pod"),
        ));
    }
    let mut item = item;
    octal_modes(&mut item);
    let mut pod: Pod = serde_yaml::from_value(item)
        .map_err(|e| (name_hint.clone(), format!("cannot decode as a Pod: {e}")))?;
    validation::validate(&pod).map_err(|e| (name_hint.clone(), join(&e)))?;
    if let Some(resource) = api_reference(&pod) {
        return Err((
            name_hint,
            format!("static pods may not reference {resource}"),
        ));
    }
    // Upstream: the UID hashes the node, the source and the object; the name gets the node suffix.
    let serialized = serde_json::to_vec(&pod).unwrap_or_default();
    let mut hasher = Sha256::new();
    hasher.update(format!("host:{node}"));
    hasher.update(format!("{}:{origin}", kind.as_str()));
    hasher.update(&serialized);
    let uid = hex::encode(&hasher.finalize()[..16]);
    let name = format!("{}-{}", pod::name(&pod), node);
    pod.metadata.name = Some(name);
    pod.metadata.uid = Some(uid.clone());
    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(labels::CONFIG_SOURCE.into(), kind.as_str().into());
    annotations.insert(labels::CONFIG_HASH.into(), uid);
    annotations.insert(labels::CONFIG_FILE.into(), origin.into());
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node.to_owned());
    }
    pod::apply_defaults(&mut pod);
    // The suffixed name must still be valid (length).
    validation::validate(&pod).map_err(|e| (name_hint, join(&e)))?;
    Ok(pod)
}

/// File modes written the YAML 1.1 way (`defaultMode: 0644`, `mode: 0400`),
/// as upstream's YAML decoder reads them: octal. The YAML 1.2 parser here
/// reads a leading-zero number as a string; only the `mode` and `defaultMode`
/// fields (always integers in a pod) are converted, so a quoted "0644" in a
/// label or env value stays text.
fn octal_modes(v: &mut serde_yaml::Value) {
    match v {
        serde_yaml::Value::Mapping(map) => {
            for (k, val) in map.iter_mut() {
                let is_mode = matches!(k.as_str(), Some("mode" | "defaultMode"));
                if is_mode
                    && let Some(text) = val.as_str()
                    && text.len() > 1
                    && text.starts_with('0')
                    && text.bytes().all(|b| (b'0'..=b'7').contains(&b))
                    && let Ok(n) = i64::from_str_radix(text, 8)
                {
                    *val = serde_yaml::Value::Number(n.into());
                } else {
                    octal_modes(val);
                }
            }
        }
        serde_yaml::Value::Sequence(items) => items.iter_mut().for_each(octal_modes),
        _ => {}
    }
}

/// The first API object a pod refers to, in upstream's words and order
/// (`podutil.HasAPIObjectReference`): a static pod may reference none, since
/// the node may have no API server and may not read those objects (upstream
/// refuses such manifests since 1.34).
fn api_reference(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if spec
        .service_account_name
        .as_deref()
        .is_some_and(|s| !s.is_empty())
    {
        return Some("serviceaccounts".into());
    }
    let containers = || {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
    };
    let secret_refs = spec
        .image_pull_secrets
        .as_ref()
        .is_some_and(|s| !s.is_empty())
        || containers().any(|c| {
            c.env_from.iter().flatten().any(|f| f.secret_ref.is_some())
                || c.env.iter().flatten().any(|e| {
                    e.value_from
                        .as_ref()
                        .is_some_and(|f| f.secret_key_ref.is_some())
                })
        });
    if secret_refs {
        return Some("secrets".into());
    }
    let config_map_refs = containers().any(|c| {
        c.env_from
            .iter()
            .flatten()
            .any(|f| f.config_map_ref.is_some())
            || c.env.iter().flatten().any(|e| {
                e.value_from
                    .as_ref()
                    .is_some_and(|f| f.config_map_key_ref.is_some())
            })
    });
    if config_map_refs {
        return Some("configmaps".into());
    }
    if spec.resource_claims.as_ref().is_some_and(|r| !r.is_empty()) {
        return Some("resourceclaims".into());
    }
    for v in spec.volumes.iter().flatten() {
        let found = if v.config_map.is_some() {
            "configmaps (via configmap volumes)"
        } else if v.secret.is_some() {
            "secrets (via secret volumes)"
        } else if v.csi.is_some() {
            "csidrivers (via CSI volumes)"
        } else if v.glusterfs.is_some() {
            "endpoints (via glusterFS volumes)"
        } else if v.persistent_volume_claim.is_some() {
            "persistentvolumeclaims"
        } else if v.ephemeral.is_some() {
            "persistentvolumeclaims (via ephemeral volumes)"
        } else if v.azure_file.is_some() {
            "secrets (via azureFile volumes)"
        } else if let Some(p) = &v.projected {
            match p.sources.iter().flatten().find_map(|s| {
                if s.config_map.is_some() {
                    Some("configmaps (via projected volumes)")
                } else if s.secret.is_some() {
                    Some("secrets (via projected volumes)")
                } else if s.service_account_token.is_some() {
                    Some("serviceaccounts (via projected volumes)")
                } else if s.cluster_trust_bundle.is_some() {
                    Some("clustertrustbundles")
                } else if s.pod_certificate.is_some() {
                    Some("podcertificates")
                } else {
                    None
                }
            }) {
                Some(r) => r,
                None => continue,
            }
        } else {
            continue;
        };
        return Some(found.into());
    }
    None
}

fn join(e: &validation::Invalid) -> String {
    e.errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers: [{name: app, image: evlet.local/test:v1}]\n---\n\
        apiVersion: v1\nkind: Pod\nmetadata: {name: db, namespace: data}\nspec:\n  containers: [{name: app, image: evlet.local/test:v1}]\n";

    #[test]
    fn several_pods_get_static_names_and_stable_uids() {
        let a = parse(TWO, "/etc/pods/x.yaml", StaticKind::File, "node1");
        assert!(a.errors.is_empty(), "{:?}", a.errors);
        let names: Vec<_> = a.pods.iter().map(crate::pod::key).collect();
        assert_eq!(names, ["default/web-node1", "data/db-node1"]);
        let b = parse(TWO, "/etc/pods/x.yaml", StaticKind::File, "node1");
        assert_eq!(
            a.pods[0].metadata.uid, b.pods[0].metadata.uid,
            "same content, same UID"
        );
        let other_node = parse(TWO, "/etc/pods/x.yaml", StaticKind::File, "node2");
        assert_ne!(a.pods[0].metadata.uid, other_node.pods[0].metadata.uid);
        assert_eq!(
            a.pods[0]
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref()),
            Some("Always")
        );
    }

    #[test]
    fn json_lists_are_accepted() {
        let json = r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"i:1"}]}}]}"#;
        let parsed = parse(json, "http://x/pods", StaticKind::Http, "n");
        assert_eq!(parsed.pods.len(), 1);
        assert_eq!(
            crate::pod::annotations(&parsed.pods[0])[labels::CONFIG_SOURCE],
            "http"
        );
    }

    #[test]
    fn a_bad_document_is_reported_with_file_pod_and_field_and_others_survive() {
        let text = format!(
            "{TWO}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: broken}}\nspec:\n  containers: [{{name: app}}]\n"
        );
        let parsed = parse(&text, "/etc/pods/x.yaml", StaticKind::File, "n");
        assert_eq!(parsed.pods.len(), 2);
        assert_eq!(parsed.errors.len(), 1);
        assert_eq!(
            parsed.errors[0].to_string(),
            "/etc/pods/x.yaml: pod \"default/broken\": spec.containers[0].image: Required value"
        );
    }

    #[test]
    fn yaml_1_1_octal_modes_read_as_upstream_reads_them() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {code: \"0644\"}}\nspec:\n  volumes: [{name: d, downwardAPI: {defaultMode: 0644, items: [{path: n, mode: 0400, fieldRef: {fieldPath: metadata.name}}]}}]\n  containers: [{name: a, image: i}]\n";
        let parsed = parse(text, "/p/x.yaml", StaticKind::File, "n");
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let d = parsed.pods[0]
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .and_then(|v| v[0].downward_api.clone())
            .expect("volume");
        assert_eq!(d.default_mode, Some(0o644));
        assert_eq!(d.items.expect("items")[0].mode, Some(0o400));
        assert_eq!(
            parsed.pods[0]
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("code"))
                .map(String::as_str),
            Some("0644")
        );
    }

    #[test]
    fn static_pods_may_not_reference_api_objects() {
        for (spec, resource) in [
            (
                "  serviceAccountName: builder\n  containers: [{name: a, image: i}]\n",
                "serviceaccounts",
            ),
            (
                "  volumes: [{name: s, secret: {secretName: x}}]\n  containers: [{name: a, image: i}]\n",
                "secrets (via secret volumes)",
            ),
            (
                "  volumes: [{name: t, projected: {sources: [{serviceAccountToken: {path: token}}]}}]\n  containers: [{name: a, image: i}]\n",
                "serviceaccounts (via projected volumes)",
            ),
            (
                "  containers: [{name: a, image: i, envFrom: [{configMapRef: {name: c}}]}]\n",
                "configmaps",
            ),
        ] {
            let text = format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n{spec}");
            let parsed = parse(&text, "/p/x.yaml", StaticKind::File, "n");
            assert_eq!(
                parsed.errors.first().map(|e| e.message.as_str()),
                Some(format!("static pods may not reference {resource}").as_str())
            );
        }
        let ok = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  volumes: [{name: d, downwardAPI: {items: [{path: n, fieldRef: {fieldPath: metadata.name}}]}}]\n  containers: [{name: a, image: i}]\n";
        assert!(
            parse(ok, "/p/x.yaml", StaticKind::File, "n")
                .errors
                .is_empty()
        );
    }

    #[test]
    fn syntax_errors_and_foreign_kinds_name_the_document() {
        let parsed = parse(
            "kind: Pod\nmetadata: [unclosed\n",
            "/p/bad.yaml",
            StaticKind::File,
            "n",
        );
        assert!(
            parsed.errors[0]
                .to_string()
                .starts_with("/p/bad.yaml: document 1: cannot parse"),
            "{:?}",
            parsed.errors
        );
        let parsed = parse("kind: Deployment\n", "/p/d.yaml", StaticKind::File, "n");
        assert!(
            parsed.errors[0]
                .message
                .contains("Unsupported value \"Deployment\"")
        );
    }
}
