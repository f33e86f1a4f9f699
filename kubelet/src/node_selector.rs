//! Node selection as the scheduler and the kubelet's admission judge it:
//! node selector terms (labels and the `metadata.name` field), a pod's
//! `nodeSelector` and required node affinity, and taints against tolerations.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration,
};

/// What of a node selection looks at.
#[derive(Debug, Clone, Copy)]
pub struct NodeRef<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.labels`.
    pub labels: &'a BTreeMap<String, String>,
}

fn requirement(node: NodeRef<'_>, req: &NodeSelectorRequirement, field: bool) -> bool {
    let value = if field {
        (req.key == "metadata.name").then_some(node.name)
    } else {
        node.labels.get(&req.key).map(String::as_str)
    };
    let values = req.values.as_deref().unwrap_or_default();
    let listed = |v: &str| values.iter().any(|x| x == v);
    match req.operator.as_str() {
        "In" => value.is_some_and(listed),
        "NotIn" => value.is_none_or(|v| !listed(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        op @ ("Gt" | "Lt") => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if op == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

/// Does `node` satisfy every requirement of `term`? An empty term matches nothing.
pub fn term_matches(term: &NodeSelectorTerm, node: NodeRef<'_>) -> bool {
    (term
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
        || term.match_fields.as_ref().is_some_and(|f| !f.is_empty()))
        && term
            .match_expressions
            .iter()
            .flatten()
            .all(|r| requirement(node, r, false))
        && term
            .match_fields
            .iter()
            .flatten()
            .all(|r| requirement(node, r, true))
}

/// Does `node` satisfy any term of `selector`?
pub fn selector_matches(selector: &NodeSelector, node: NodeRef<'_>) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|t| term_matches(t, node))
}

/// Does `node` satisfy the pod's `nodeSelector` and its required node affinity?
pub fn pod_matches(pod: &Pod, node: NodeRef<'_>) -> bool {
    let Some(spec) = &pod.spec else {
        return true;
    };
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    let affinity_ok = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_none_or(|required| selector_matches(required, node));
    selector_ok && affinity_ok
}

/// Does any of `tolerations` tolerate `taint`?
pub fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| toleration_matches(t, taint))
}

fn toleration_matches(t: &Toleration, taint: &Taint) -> bool {
    let effect_ok = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = t.key.as_deref().unwrap_or("");
    let key_ok = key.is_empty() || key == taint.key;
    let value_ok = match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    };
    // An empty key matches every key only with Exists.
    effect_ok && key_ok && value_ok && (!key.is_empty() || t.operator.as_deref() == Some("Exists"))
}

/// The first `NoExecute` taint of `taints` that no toleration tolerates.
pub fn untolerated_no_execute<'a>(
    taints: &'a [Taint],
    tolerations: &[Toleration],
) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoExecute")
        .find(|taint| !tolerates(tolerations, taint))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .expect("pod")
    }

    #[test]
    fn node_selector_and_required_affinity_must_both_match() {
        let labels: BTreeMap<String, String> =
            [("zone".into(), "a".into()), ("gen".into(), "5".into())].into();
        let node = NodeRef {
            name: "n1",
            labels: &labels,
        };
        let p = pod(
            serde_json::json!({"containers": [], "nodeSelector": {"zone": "a"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["6"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]}}}}),
        );
        assert!(pod_matches(&p, node));
        let p = pod(serde_json::json!({"containers": [], "nodeSelector": {"zone": "b"}}));
        assert!(!pod_matches(&p, node));
        let p = pod(serde_json::json!({"containers": [],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}}}));
        assert!(!pod_matches(&p, node));
    }

    #[test]
    fn only_untolerated_no_execute_taints_count() {
        let taint = |key: &str, value: Option<&str>, effect: &str| Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        };
        let taints = [
            taint("dedicated", Some("db"), "NoSchedule"),
            taint("maintenance", Some("yes"), "NoExecute"),
        ];
        assert_eq!(
            untolerated_no_execute(&taints, &[]).map(|t| t.key.as_str()),
            Some("maintenance")
        );
        let equal: Toleration = serde_json::from_value(serde_json::json!(
            {"key": "maintenance", "value": "yes", "effect": "NoExecute"}))
        .expect("t");
        assert_eq!(untolerated_no_execute(&taints, &[equal]), None);
        let wrong_value: Toleration = serde_json::from_value(serde_json::json!(
            {"key": "maintenance", "value": "no"}))
        .expect("t");
        assert!(untolerated_no_execute(&taints, &[wrong_value]).is_some());
        let everything: Toleration =
            serde_json::from_value(serde_json::json!({"operator": "Exists"})).expect("t");
        assert_eq!(untolerated_no_execute(&taints, &[everything]), None);
    }
}
