//! evlet's metrics against upstream kubelet's (`tests/data/upstream-metrics.txt`,
//! with the upstream version it came from): every listed metric is served on
//! the same endpoint with the same name, type, labels and buckets.

use evlet::metrics::{Described, Metrics};

const LIST: &str = include_str!("data/upstream-metrics.txt");

fn buckets(name: &str) -> Vec<f64> {
    match name {
        "-" => Vec::new(),
        "def" => vec![
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ],
        "podstart" => vec![
            0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0,
            240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
        ],
        "runtime" => (0..14).map(|i| 0.005 * 2.5f64.powi(i)).collect(),
        "rest" => vec![
            0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
        ],
        other => panic!("unknown bucket set {other}"),
    }
}

#[test]
fn evlet_serves_upstreams_metrics_with_upstreams_names_types_labels_and_buckets() {
    let metrics = Metrics::new();
    let mut problems = Vec::new();
    let mut checked = 0;
    for line in LIST
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let [endpoint, name, kind, labels, bucket_set] = cols[..] else {
            panic!("malformed line {line:?}");
        };
        let served: &[Described] = match endpoint {
            "/metrics" => metrics.catalog.described(),
            "/metrics/probes" => metrics.probes.catalog.described(),
            other => panic!("unknown endpoint {other}"),
        };
        checked += 1;
        let Some(d) = served.iter().find(|d| d.name == name) else {
            problems.push(format!("{endpoint} {name}: not served"));
            continue;
        };
        if d.kind.as_str() != kind {
            problems.push(format!("{name}: {} instead of {kind}", d.kind.as_str()));
        }
        let mut ours = d.labels.clone();
        ours.sort();
        let theirs: Vec<String> = match labels {
            "-" => Vec::new(),
            l => l.split(',').map(str::to_owned).collect(),
        };
        if ours != theirs {
            problems.push(format!("{name}: labels {ours:?} instead of {theirs:?}"));
        }
        let want = buckets(bucket_set);
        let same = want.len() == d.buckets.len()
            && want
                .iter()
                .zip(&d.buckets)
                .all(|(a, b)| (a - b).abs() < 1e-9);
        if !same {
            problems.push(format!(
                "{name}: buckets {:?} instead of {want:?}",
                d.buckets
            ));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(checked >= 38, "{checked} metrics checked");
}

#[test]
fn upstream_metrics_carry_upstreams_stability_in_their_help() {
    let metrics = Metrics::new();
    metrics.pleg_discard_events.inc();
    metrics.started_pods.inc();
    let text = metrics.encode();
    for name in ["kubelet_pleg_discard_events", "kubelet_started_pods_total"] {
        assert!(
            text.contains(&format!("# HELP {name} [ALPHA] ")),
            "{name}: {text}"
        );
    }
    // The Go client's process metrics have no stability level.
    assert!(text.contains("# HELP process_cpu_seconds_total Total user"));
}
