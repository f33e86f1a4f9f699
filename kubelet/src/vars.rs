//! Kubernetes' `$(VAR)` references in commands, arguments and env values:
//! `$(NAME)` becomes the variable's value, `$$` a literal `$`, and an unknown
//! name stays as written (upstream's `expansion.MappingFuncFor`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

/// Expands `$(VAR)` from `env`; `$$(VAR)` escapes; unknown references stay as written.
pub fn expand(input: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(escaped) = after.strip_prefix('$') {
            out.push('$');
            rest = escaped;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.get(name) {
                Some(v) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The container's env entries that have a literal `value` (no `valueFrom`),
/// expanded in order: what upstream expands a probe's exec command with
/// (`ExpandContainerCommandOnlyStatic`).
pub fn static_env(c: &Container) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in c.env.iter().flatten() {
        if e.value_from.is_none() {
            let value = expand(e.value.as_deref().unwrap_or(""), &env);
            env.insert(e.name.clone(), value);
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_commands_see_only_literal_values() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "env": [
                {"name": "A", "value": "one"},
                {"name": "B", "value": "$(A)-two"},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
            ]
        }))
        .expect("container");
        let env = static_env(&c);
        assert_eq!(expand("$(B) $(POD) $$(A)", &env), "one-two $(POD) $(A)");
    }
}
