//! The files in `deploy/` an operator installs are checked against the code
//! they configure: the example `KubeletConfiguration` loads, the Prometheus
//! alert rules pass the real `promtool check rules`, and every metric the
//! rules and the Grafana dashboard query is one evlet serves (or one of the
//! upstream names the dashboard marks as not served yet).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use evlet::config::{self, KubeletConfiguration};
use evlet::metrics::Metrics;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
}

/// The sample names `/metrics` and `/metrics/probes` serve.
fn served() -> BTreeSet<String> {
    let metrics = Metrics::new();
    let mut names: BTreeSet<String> = metrics.exposed_names().into_iter().collect();
    names.extend(metrics.probes.catalog.exposed_names());
    names
}

/// The metric names a PromQL expression uses (evlet's, upstream kubelet's and
/// the prober's namespaces).
fn metric_names(expr: &str) -> Vec<String> {
    const PREFIXES: &[&str] = &["evlet_", "kubelet_", "prober_"];
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let boundary = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if boundary && PREFIXES.iter().any(|p| expr[i..].starts_with(p)) {
            let end = expr[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(expr.len(), |n| i + n);
            out.push(expr[i..end].to_owned());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

fn dashboard_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                dashboard_exprs(v, out);
            }
        }
        _ => {}
    }
}

fn rule_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy("prometheus/evlet-alerts.yaml")).expect("rules");
    let rules: serde_yaml::Value = serde_yaml::from_str(&text).expect("rules YAML");
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("every rule is an alert");
            let expr = rule["expr"].as_str().expect("expr");
            out.push((name.to_owned(), expr.to_owned()));
        }
    }
    out
}

#[test]
fn the_example_kubelet_configuration_loads_as_it_is() {
    let path = deploy("config/kubelet-config.yaml");
    let cfg = KubeletConfiguration::load(&path).expect("the example config loads");
    config::check_pod_settings(&cfg.pod_settings()).expect("its pod settings are valid");
    assert_eq!(cfg.pod_settings().cluster_domain, "cluster.local");
}

#[test]
fn every_metric_the_alerts_and_the_dashboard_query_is_served() {
    let served = served();
    assert!(
        served.contains("evlet_pleg_missed_events_total"),
        "{served:?}"
    );
    let mut missing = Vec::new();
    let rules = rule_exprs();
    assert!(rules.len() >= 6, "the alerts the issue names: {rules:?}");
    for (alert, expr) in &rules {
        for name in metric_names(expr) {
            if !served.contains(&name) {
                missing.push(format!("alert {alert}: {name}"));
            }
        }
    }
    let text = std::fs::read_to_string(deploy("grafana/evlet-dashboard.json")).expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "the dashboard's queries: {exprs:?}");
    for expr in &exprs {
        for name in metric_names(expr) {
            if !served.contains(&name) {
                missing.push(format!("dashboard: {name} in {expr}"));
            }
        }
    }
    assert!(missing.is_empty(), "not served by evlet: {missing:#?}");
}

#[test]
fn the_alert_rules_pass_promtool() {
    let rules = deploy("prometheus/evlet-alerts.yaml");
    let Some(out) = promtool::run(
        "the_alert_rules_pass_promtool",
        &["check", "rules", &rules.to_string_lossy()],
        "",
    ) else {
        return;
    };
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool check rules: {text}");
    assert!(text.contains("SUCCESS"), "{text}");
}

#[path = "support/promtool.rs"]
mod promtool;

#[test]
fn the_metrics_text_passes_promtool_check_metrics() {
    let metrics = Metrics::new();
    // One sample in every family that has none until something happens.
    metrics.pleg_discard_events.inc();
    metrics
        .evictions
        .with_label_values(&["memory.available"])
        .inc();
    metrics
        .runtime
        .observe("StartContainer", std::time::Duration::from_millis(5), None);
    metrics
        .pod_worker_duration
        .with_label_values(&["create"])
        .observe(0.2);
    metrics.node_name.with_label_values(&["n1"]).set(1);
    metrics
        .started_containers_errors
        .with_label_values(&["container", "ErrImagePull"])
        .inc();
    metrics.rest_client.observe(
        "GET",
        "10.0.0.1:6443",
        Some(200),
        std::time::Duration::from_millis(3),
    );
    metrics
        .volume_stats
        .set(&[evlet::metrics::VolumeStatsSample {
            namespace: "default".into(),
            claim: "data".into(),
            capacity_bytes: 1e9,
            ..Default::default()
        }]);
    promtool::check_metrics(
        "the_metrics_text_passes_promtool_check_metrics",
        &metrics.encode(),
    );
    metrics
        .probes
        .total
        .with_label_values(&["Liveness", "successful", "c", "p", "default", "u"])
        .inc();
    promtool::check_metrics(
        "the_metrics_text_passes_promtool_check_metrics",
        &metrics.probes.encode(),
    );
}
