//! The pod's own resources (`spec.resources`), checked as the API server's
//! `validatePodResources` checks them: CPU and memory only, each request at
//! most its limit, each request at least what the containers request
//! together, and no container limit above the pod's.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::Errors;
use crate::quantity;
use crate::resources::{self, List};

/// Parses `q` of resource `name` (CPU in millicores, else bytes).
fn parse(name: &str, q: &Quantity) -> Result<i64, quantity::InvalidQuantity> {
    if name == "cpu" {
        quantity::parse_milli(&q.0)
    } else {
        quantity::parse(&q.0)
    }
}

/// Adds every problem of `spec.resources` to `e`.
pub(super) fn validate_pod(spec: &PodSpec, e: &mut Errors) {
    let Some(res) = &spec.resources else {
        return;
    };
    if res.claims.as_ref().is_some_and(|c| !c.is_empty()) {
        e.add(
            "spec.resources.claims",
            "Forbidden: claims cannot be set for Resources at pod-level",
        );
    }
    let mut parsed: [BTreeMap<&str, i64>; 2] = [BTreeMap::new(), BTreeMap::new()];
    for (i, (kind, list)) in [("limits", &res.limits), ("requests", &res.requests)]
        .into_iter()
        .enumerate()
    {
        for (name, q) in list.iter().flatten() {
            let field = format!("spec.resources.{kind}[{name}]");
            if name.starts_with("hugepages-") {
                // Refused by `support::unsupported`.
                continue;
            }
            if !matches!(name.as_str(), "cpu" | "memory") {
                e.add(
                    field,
                    format!(
                        "Unsupported value: {name:?}: supported values: \"cpu\", \"hugepages-\", \"memory\""
                    ),
                );
                continue;
            }
            match parse(name, q) {
                Ok(v) if v < 0 => e.add(
                    field,
                    format!(
                        "Invalid value: {:?}: must be greater than or equal to 0",
                        q.0
                    ),
                ),
                Ok(v) => {
                    parsed[i].insert(name.as_str(), v);
                }
                Err(err) => e.add(field, format!("Invalid value: {err}")),
            }
        }
    }
    let [limits, requests] = &parsed;
    let raw = |list: &Option<BTreeMap<String, Quantity>>, name: &str| {
        list.as_ref()
            .and_then(|l| l.get(name))
            .map(|q| q.0.clone())
            .unwrap_or_default()
    };
    for (name, request) in requests {
        if let Some(limit) = limits.get(name)
            && request > limit
        {
            e.add(
                format!("spec.resources.requests[{name}]"),
                format!(
                    "Invalid value: {:?}: must be less than or equal to {name} limit of {}",
                    raw(&res.requests, name),
                    raw(&res.limits, name)
                ),
            );
        }
    }
    // The containers' aggregate requests (requests default to limits).
    let pod = k8s_openapi::api::core::v1::Pod {
        spec: Some(PodSpec {
            resources: None,
            ..spec.clone()
        }),
        ..Default::default()
    };
    let (cpu, memory) = resources::pod_totals(&pod, List::Requests);
    for (name, aggregate) in [("cpu", cpu), ("memory", memory)] {
        if let Some(request) = requests.get(name)
            && aggregate > *request
        {
            let aggregate = if name == "cpu" {
                format!("{aggregate}m")
            } else {
                aggregate.to_string()
            };
            e.add(
                format!("spec.resources.requests[{name}]"),
                format!(
                    "Invalid value: {:?}: must be greater than or equal to aggregate container requests of {aggregate}",
                    raw(&res.requests, name)
                ),
            );
        }
    }
    for (i, c) in spec.containers.iter().enumerate() {
        let (cpu, memory) = resources::values(c, List::Limits);
        for (name, limit) in [("cpu", cpu), ("memory", memory)] {
            if let (Some(own), Some(pod_limit)) = (limit, limits.get(name))
                && own > *pod_limit
            {
                e.add(
                    format!("spec.containers[{i}].resources.limits[{name}]"),
                    format!(
                        "Invalid value: must be less than or equal to pod limits of {}",
                        raw(&res.limits, name)
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    fn errors(yaml: &str) -> Vec<String> {
        let pod: Pod = serde_yaml::from_str(&format!(
            "metadata: {{name: p}}\nspec:\n{yaml}  containers:\n  - {{name: a, image: i, resources: {{requests: {{cpu: 300m, memory: 64Mi}}, limits: {{cpu: 400m}}}}}}\n  - {{name: b, image: i}}\n"
        ))
        .expect("pod");
        match super::super::validate(&pod) {
            Ok(()) => Vec::new(),
            Err(e) => e.errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn pod_level_cpu_and_memory_are_accepted() {
        assert_eq!(
            errors(
                "  resources: {requests: {cpu: 500m, memory: 128Mi}, limits: {cpu: '1', memory: 256Mi}}\n"
            ),
            Vec::<String>::new()
        );
        assert_eq!(errors("  resources: {}\n"), Vec::<String>::new());
    }

    #[test]
    fn pod_level_problems_name_their_fields() {
        assert_eq!(
            errors(
                "  resources: {requests: {cpu: 200m, memory: 1Gi, storage: 1Gi}, limits: {cpu: 300m, memory: 512Mi}}\n"
            ),
            [
                "spec.resources.requests[storage]: Unsupported value: \"storage\": supported values: \"cpu\", \"hugepages-\", \"memory\"",
                "spec.resources.requests[memory]: Invalid value: \"1Gi\": must be less than or equal to memory limit of 512Mi",
                "spec.resources.requests[cpu]: Invalid value: \"200m\": must be greater than or equal to aggregate container requests of 300m",
                "spec.containers[0].resources.limits[cpu]: Invalid value: must be less than or equal to pod limits of 300m",
            ]
        );
        assert_eq!(
            errors("  resources: {limits: {hugepages-2Mi: 2Mi, memory: 1Gi}}\n"),
            ["spec.resources.limits[hugepages-2Mi]: Forbidden: evlet does not support hugepages"]
        );
    }
}
