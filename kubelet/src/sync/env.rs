//! Container environment: `env` values, the downward API (`fieldRef`,
//! `resourceFieldRef`), and `$(VAR)` expansion in commands and args.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::quantity;

/// Field paths `fieldRef` supports in env vars (upstream's list).
pub use crate::downward::supported_env_field as supported_field_path;

/// Facts known only at run time.
#[derive(Debug, Clone)]
pub struct Runtime<'a> {
    /// The pod IP (the sandbox exists before containers start).
    pub pod_ip: Option<&'a str>,
    /// The node's IP.
    pub host_ip: Option<&'a str>,
    /// The ConfigMaps and Secrets the container refers to (see [`super::objects`]).
    pub objects: &'a ApiObjects,
    /// The service variables (`KUBERNETES_SERVICE_HOST`, ...): `$(VAR)` can
    /// name them, and they are added after the pod's own, which win.
    pub services: &'a [(String, String)],
    /// The node's allocatable: what `limits.*` a container does not set
    /// shows (upstream's downward API defaults).
    pub allocatable: crate::cm::allocatable::Resources,
}

static NO_OBJECTS: ApiObjects = ApiObjects {
    config_maps: BTreeMap::new(),
    secrets: BTreeMap::new(),
};

impl Default for Runtime<'_> {
    fn default() -> Self {
        Self {
            pod_ip: None,
            host_ip: None,
            objects: &NO_OBJECTS,
            services: &[],
            allocatable: crate::cm::allocatable::Resources::default(),
        }
    }
}

/// The ConfigMaps and Secrets a container refers to, as fetched from the API
/// server (one missing from the map does not exist).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiObjects {
    /// ConfigMap name → data.
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
    /// Secret name → decoded data.
    pub secrets: BTreeMap<String, BTreeMap<String, String>>,
}

/// The ConfigMaps and Secrets a container's environment names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    /// ConfigMap names.
    pub config_maps: BTreeSet<String>,
    /// Secret names.
    pub secrets: BTreeSet<String>,
}

impl References {
    /// Names nothing.
    pub fn is_empty(&self) -> bool {
        self.config_maps.is_empty() && self.secrets.is_empty()
    }
}

/// Names of the ConfigMaps and Secrets `c`'s environment refers to.
pub fn references(c: &Container) -> References {
    let (mut cms, mut secrets) = (BTreeSet::new(), BTreeSet::new());
    for from in c.env_from.iter().flatten() {
        if let Some(r) = &from.config_map_ref {
            cms.insert(r.name.clone());
        }
        if let Some(r) = &from.secret_ref {
            secrets.insert(r.name.clone());
        }
    }
    for var in c.env.iter().flatten() {
        if let Some(from) = &var.value_from {
            if let Some(r) = &from.config_map_key_ref {
                cms.insert(r.name.clone());
            }
            if let Some(r) = &from.secret_key_ref {
                secrets.insert(r.name.clone());
            }
        }
    }
    References {
        config_maps: cms,
        secrets,
    }
}

/// A ConfigMap or a Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// A ConfigMap.
    ConfigMap,
    /// A Secret.
    Secret,
}

impl ObjectKind {
    /// `ConfigMap` or `Secret`, as in upstream's "couldn't find key" message.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::ConfigMap => "ConfigMap",
            ObjectKind::Secret => "Secret",
        }
    }

    /// `configmap` or `secret`, as in the API server's not-found message.
    pub fn lower(self) -> &'static str {
        match self {
            ObjectKind::ConfigMap => "configmap",
            ObjectKind::Secret => "secret",
        }
    }
}

/// What is wrong with one variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// A ConfigMap or Secret that is not optional does not exist.
    #[error("{} \"{name}\" not found (namespace {namespace})", kind.lower())]
    NotFound {
        /// ConfigMap or Secret.
        kind: ObjectKind,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A key that is not optional is missing from its ConfigMap or Secret.
    #[error("couldn't find key {key} in {} {namespace}/{name}", kind.as_str())]
    MissingKey {
        /// ConfigMap or Secret.
        kind: ObjectKind,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The key.
        key: String,
    },
    /// A `fieldRef` path the downward API does not offer.
    #[error("unsupported fieldRef {0:?}")]
    UnsupportedField(String),
    /// A `resourceFieldRef` resource the downward API does not offer.
    #[error("unsupported resource {0:?}")]
    UnsupportedResource(String),
    /// A resource value or divisor that is not a quantity.
    #[error(transparent)]
    Quantity(#[from] quantity::InvalidQuantity),
}

/// Why an env var could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("env var {name}: {problem}")]
pub struct EnvError {
    /// The variable (`envFrom <name>` for a whole ConfigMap or Secret).
    pub name: String,
    /// What is wrong.
    #[source]
    pub problem: Problem,
}

/// One ConfigMap or Secret lookup. `Ok(None)`: absent and optional.
fn lookup<'o>(
    pod: &Pod,
    objects: &'o ApiObjects,
    kind: ObjectKind,
    name: &str,
    optional: bool,
) -> Result<Option<&'o BTreeMap<String, String>>, Problem> {
    let map = match kind {
        ObjectKind::Secret => &objects.secrets,
        ObjectKind::ConfigMap => &objects.config_maps,
    };
    match map.get(name) {
        Some(data) => Ok(Some(data)),
        None if optional => Ok(None),
        None => Err(Problem::NotFound {
            kind,
            namespace: crate::pod::namespace(pod).to_owned(),
            name: name.to_owned(),
        }),
    }
}

fn field(pod: &Pod, path: &str, rt: &Runtime<'_>) -> Option<String> {
    crate::downward::field(pod, path, rt.pod_ip, rt.host_ip)
}

fn resource(
    pod: &Pod,
    c: &Container,
    rt: &Runtime<'_>,
    resource: &str,
    divisor: Option<&str>,
) -> Result<String, Problem> {
    crate::downward::resource(pod, c, &rt.allocatable, resource, divisor).map_err(|e| match e {
        crate::downward::ResourceError::Unsupported(r) => Problem::UnsupportedResource(r),
        crate::downward::ResourceError::Quantity(q) => Problem::Quantity(q),
    })
}

/// The container's environment, in spec order, with `$(VAR)` references to
/// earlier variables expanded (as upstream).
///
/// # Errors
/// [`EnvError`] for a ConfigMap or Secret (or a key of one) that is missing
/// and not optional, or an unsupported field or resource.
pub fn build(
    pod: &Pod,
    c: &Container,
    rt: &Runtime<'_>,
) -> Result<Vec<(String, String)>, EnvError> {
    let mut out: Vec<(String, String)> = Vec::new();
    // envFrom first; `env` entries override them (upstream's order).
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let source = from
            .config_map_ref
            .as_ref()
            .map(|r| (ObjectKind::ConfigMap, &r.name, r.optional == Some(true)))
            .or_else(|| {
                from.secret_ref
                    .as_ref()
                    .map(|r| (ObjectKind::Secret, &r.name, r.optional == Some(true)))
            });
        let Some((kind, name, optional)) = source else {
            continue;
        };
        let data = lookup(pod, rt.objects, kind, name, optional).map_err(|problem| EnvError {
            name: format!("envFrom {name}"),
            problem,
        })?;
        for (k, v) in data.into_iter().flatten() {
            let key = format!("{prefix}{k}");
            out.retain(|(n, _)| n != &key);
            out.push((key, v.clone()));
        }
    }
    for var in c.env.iter().flatten() {
        let err = |problem: Problem| EnvError {
            name: var.name.clone(),
            problem,
        };
        let value = if let Some(from) = &var.value_from {
            if let Some(f) = &from.field_ref {
                field(pod, &f.field_path, rt)
                    .ok_or_else(|| err(Problem::UnsupportedField(f.field_path.clone())))?
            } else if let Some(r) = &from.resource_field_ref {
                resource(
                    pod,
                    c,
                    rt,
                    &r.resource,
                    r.divisor.as_ref().map(|d| d.0.as_str()),
                )
                .map_err(err)?
            } else if let Some((kind, name, key, optional)) = from
                .config_map_key_ref
                .as_ref()
                .map(|r| {
                    (
                        ObjectKind::ConfigMap,
                        &r.name,
                        &r.key,
                        r.optional == Some(true),
                    )
                })
                .or_else(|| {
                    from.secret_key_ref.as_ref().map(|r| {
                        (
                            ObjectKind::Secret,
                            &r.name,
                            &r.key,
                            r.optional == Some(true),
                        )
                    })
                })
            {
                let Some(data) = lookup(pod, rt.objects, kind, name, optional).map_err(err)? else {
                    continue;
                };
                match data.get(key) {
                    Some(v) => v.clone(),
                    None if optional => continue,
                    None => {
                        return Err(err(Problem::MissingKey {
                            kind,
                            namespace: crate::pod::namespace(pod).to_owned(),
                            name: name.clone(),
                            key: key.clone(),
                        }));
                    }
                }
            } else {
                String::new()
            }
        } else {
            // References resolve to the pod's variables so far, then services.
            let mut map: BTreeMap<String, String> = rt.services.iter().cloned().collect();
            map.extend(out.iter().cloned());
            expand(var.value.as_deref().unwrap_or(""), &map)
        };
        out.retain(|(k, _)| k != &var.name);
        out.push((var.name.clone(), value));
    }
    // Service variables the pod does not set itself (upstream's precedence).
    let own: BTreeSet<String> = out.iter().map(|(k, _)| k.clone()).collect();
    out.extend(
        rt.services
            .iter()
            .filter(|(k, _)| !own.contains(k))
            .cloned(),
    );
    Ok(out)
}

pub use crate::vars::expand;

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_yaml::from_str(
            "metadata: {name: web, namespace: prod, uid: u-1, labels: {app: shop}}\nspec:\n  nodeName: n1\n  containers:\n  - name: app\n    image: i\n    resources: {limits: {cpu: 500m, memory: 64Mi}}\n    env:\n    - {name: A, value: one}\n    - {name: B, value: '$(A)-two $$(A) $(NOPE)'}\n    - name: POD\n      valueFrom: {fieldRef: {fieldPath: metadata.name}}\n    - name: APP\n      valueFrom: {fieldRef: {fieldPath: \"metadata.labels['app']\"}}\n    - name: IP\n      valueFrom: {fieldRef: {fieldPath: status.podIP}}\n    - name: MEM\n      valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}\n    - name: CPU\n      valueFrom: {resourceFieldRef: {resource: limits.cpu}}\n",
        )
        .expect("pod")
    }

    #[test]
    fn values_downward_api_and_expansion() {
        let p = pod();
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let env = build(
            &p,
            c,
            &Runtime {
                pod_ip: Some("10.0.0.7"),
                ..Default::default()
            },
        )
        .expect("env");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("B"), Some("one-two $(A) $(NOPE)"));
        assert_eq!(get("POD"), Some("web"));
        assert_eq!(get("APP"), Some("shop"));
        assert_eq!(get("IP"), Some("10.0.0.7"));
        assert_eq!(get("MEM"), Some("64"));
        assert_eq!(
            get("CPU"),
            Some("1"),
            "cpu rounds up to whole cores by default"
        );
    }

    #[test]
    fn a_missing_secret_names_the_variable() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: s}\nspec:\n  containers:\n  - name: app\n    image: i\n    env:\n    - name: PW\n      valueFrom: {secretKeyRef: {name: db, key: pw}}\n",
        )
        .expect("pod");
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let err = build(&p, c, &Runtime::default()).expect_err("no secret");
        assert_eq!(err.name, "PW");
    }

    #[test]
    fn config_maps_and_secrets_fill_env_and_env_from_with_prefix_and_overrides() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: s, namespace: prod}\nspec:\n  containers:\n  - name: app\n    image: i\n    envFrom:\n    - {configMapRef: {name: settings}, prefix: CFG_}\n    - {secretRef: {name: absent, optional: true}}\n    env:\n    - name: CFG_MODE\n      value: override\n    - name: PW\n      valueFrom: {secretKeyRef: {name: db, key: pw}}\n    - name: OPT\n      valueFrom: {configMapKeyRef: {name: settings, key: nope, optional: true}}\n",
        )
        .expect("pod");
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let refs = references(c);
        assert_eq!(
            refs.config_maps.into_iter().collect::<Vec<_>>(),
            ["settings"]
        );
        assert_eq!(
            refs.secrets.into_iter().collect::<Vec<_>>(),
            ["absent", "db"]
        );
        let objects = ApiObjects {
            config_maps: [(
                "settings".to_owned(),
                [("MODE", "fast"), ("LEVEL", "3")]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into(),
            )]
            .into(),
            secrets: [(
                "db".to_owned(),
                [("pw".to_owned(), "s3cret".to_owned())].into(),
            )]
            .into(),
        };
        let rt = Runtime {
            objects: &objects,
            ..Default::default()
        };
        let env = build(&p, c, &rt).expect("env");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("CFG_LEVEL"), Some("3"));
        assert_eq!(get("CFG_MODE"), Some("override"));
        assert_eq!(get("PW"), Some("s3cret"));
        assert_eq!(get("OPT"), None);

        let none = ApiObjects::default();
        let rt = Runtime {
            objects: &none,
            ..Default::default()
        };
        let err = build(&p, c, &rt).expect_err("settings missing");
        assert_eq!(err.name, "envFrom settings");
        assert!(
            err.problem
                .to_string()
                .contains("configmap \"settings\" not found"),
            "{err}"
        );
        let no_key = ApiObjects {
            secrets: [("db".to_owned(), BTreeMap::new())].into(),
            config_maps: [("settings".to_owned(), BTreeMap::new())].into(),
        };
        let rt = Runtime {
            objects: &no_key,
            ..Default::default()
        };
        let err = build(&p, c, &rt).expect_err("key missing");
        assert_eq!(err.name, "PW");
        assert_eq!(
            err.problem.to_string(),
            "couldn't find key pw in Secret prod/db"
        );
    }
}
