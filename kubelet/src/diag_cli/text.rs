//! `evlet diag`'s text views of `/debug/eviction` and `/debug/pleg`.

use std::collections::BTreeMap;
use std::time::Duration;

use evlet::server::debug::{HistogramView, PlegView};

use super::{format_time, table_text};

/// `/debug/eviction` as text: the kernel notifications, the passes by
/// trigger, the last pass, then a table of the passes that acted.
pub(super) fn eviction_text(v: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let kernel = &v["kernel"];
    let _ = writeln!(
        out,
        "kernel notifications: {} memory cgroup threshold(s), PSI trigger {}",
        kernel["memcgThresholds"].as_u64().unwrap_or(0),
        if kernel["psi"].as_bool() == Some(true) {
            "armed"
        } else {
            "not armed"
        }
    );
    let passes: Vec<String> = v["passes"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let _ = writeln!(out, "passes: {}", passes.join(", "));
    let conditions = |p: &serde_json::Value| {
        let c: Vec<&str> = p["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str())
            .collect();
        if c.is_empty() {
            "none".to_owned()
        } else {
            c.join(" ")
        }
    };
    if v["last"].is_object() {
        let last = &v["last"];
        let _ = writeln!(
            out,
            "last pass: {} ({}), pressure: {}",
            format_time(last["atNs"].as_i64().unwrap_or(0)),
            last["trigger"].as_str().unwrap_or(""),
            conditions(last)
        );
    }
    let rows: Vec<Vec<String>> = v["acting"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let n = |k: &str| p[k].as_i64().map_or(String::new(), |x| x.to_string());
            vec![
                format_time(p["atNs"].as_i64().unwrap_or(0)),
                p["trigger"].as_str().unwrap_or("").to_owned(),
                p["signal"].as_str().unwrap_or("").to_owned(),
                n("threshold"),
                n("available"),
                p["evicted"].as_str().unwrap_or("-").to_owned(),
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("no pass has found a threshold met\n");
    } else {
        out.push_str(&table_text(
            &[
                "TIME",
                "TRIGGER",
                "SIGNAL",
                "THRESHOLD",
                "AVAILABLE",
                "EVICTED",
            ],
            &rows,
            true,
        ));
    }
    out
}

/// The `q` quantile of a histogram, interpolated within its bucket as
/// Prometheus' `histogram_quantile` does.
fn quantile(h: &HistogramView, q: f64) -> Option<f64> {
    if h.count == 0 {
        return None;
    }
    let rank = q * h.count as f64;
    let mut lower = (0.0, 0u64);
    for &(bound, count) in &h.buckets {
        if count as f64 >= rank {
            let in_bucket = (count - lower.1) as f64;
            let frac = if in_bucket > 0.0 {
                (rank - lower.1 as f64) / in_bucket
            } else {
                1.0
            };
            return Some(lower.0 + (bound - lower.0) * frac);
        }
        lower = (bound, count);
    }
    Some(lower.0)
}

fn seconds(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(s) if s < 1e-3 => format!("{:.0} µs", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.2} ms", s * 1e3),
        Some(s) => format!("{s:.2} s"),
    }
}

pub(super) fn relist_rates(
    before: &PlegView,
    now: &PlegView,
    elapsed: Duration,
) -> BTreeMap<String, f64> {
    let secs = elapsed.as_secs_f64().max(1e-3);
    now.pod_relists
        .iter()
        .map(|(pod, n)| {
            let was = before.pod_relists.get(pod).copied().unwrap_or(0);
            (pod.clone(), n.saturating_sub(was) as f64 / secs)
        })
        .collect()
}

pub(super) fn pleg_text(v: &PlegView, rates: Option<&BTreeMap<String, f64>>) -> String {
    let map = |m: &BTreeMap<String, u64>| {
        if m.is_empty() {
            "0".to_owned()
        } else {
            m.iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let ago = if v.last_full_relist > 0.0 {
        format!(
            "{:.1} s ago",
            evlet::clock::unix_ns() as f64 / 1e9 - v.last_full_relist
        )
    } else {
        "none yet".into()
    };
    let h = &v.hint_latency;
    let mut out = String::new();
    let mut row = |k: &str, val: String| out.push_str(&format!("{k:<24}{val}\n"));
    row(
        "mode",
        format!(
            "{} ({})",
            v.mode,
            v.unhealthy.as_deref().unwrap_or("healthy")
        ),
    );
    row("last full relist", ago);
    row(
        "hint latency",
        format!(
            "{} hints, p50 {}, p99 {}, max bucket {}",
            h.count,
            seconds(quantile(h, 0.5)),
            seconds(quantile(h, 0.99)),
            seconds(
                h.buckets
                    .iter()
                    .find(|(_, c)| *c == h.count)
                    .map(|(b, _)| *b)
            )
        ),
    );
    let r = &v.pod_relist_duration;
    row(
        "pod relists",
        format!(
            "{} relists, p50 {}, p99 {}",
            r.count,
            seconds(quantile(r, 0.5)),
            seconds(quantile(r, 0.99))
        ),
    );
    row("quiet proofs", v.quiet_proofs.to_string());
    row(
        "missed events",
        format!(
            "{} (in {} counting relists)",
            v.missed_events, v.counted_relists
        ),
    );
    row("ring-buffer lost", v.ringbuf_lost.to_string());
    row("discarded events", v.discarded_events.to_string());
    row("runtime disagreements", map(&v.runtime_disagreements));
    row("runtime exits lost", v.runtime_exit_lost.to_string());
    row(
        "unconfirmed exits given up",
        v.expectations_abandoned.to_string(),
    );
    row("awaiting the runtime", format!("{} pods", v.expectations));
    row("full relists", map(&v.full_relists));
    let mut pods: Vec<(&String, &u64)> = v.pod_relists.iter().collect();
    pods.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    if !pods.is_empty() {
        out.push_str("\nPOD RELISTS (most first)\n");
        for (pod, n) in pods.into_iter().take(15) {
            let rate = rates
                .and_then(|r| r.get(pod))
                .map_or_else(String::new, |r| format!("  {r:.1}/s"));
            out.push_str(&format!("  {pod:<48}{n:>8}{rate}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let h = HistogramView {
            count: 10,
            sum: 0.0,
            buckets: vec![(0.001, 0), (0.002, 10), (0.005, 10)],
        };
        assert_eq!(quantile(&h, 0.5), Some(0.0015));
        assert_eq!(quantile(&HistogramView::default(), 0.5), None);
    }

    #[test]
    fn the_eviction_journal_reads_as_a_table() {
        let v = serde_json::json!({
            "passes": {"memcg": 2, "timer": 7},
            "kernel": {"memcgThresholds": 1, "psi": true},
            "last": {"atNs": 0, "trigger": "memcg", "conditions": ["MemoryPressure"]},
            "acting": [{"atNs": 0, "trigger": "memcg", "conditions": ["MemoryPressure"],
                        "signal": "memory.available", "threshold": 104857600,
                        "available": 99614720, "evicted": "default/hog"}]
        });
        let text = eviction_text(&v);
        assert!(text.starts_with(
            "kernel notifications: 1 memory cgroup threshold(s), PSI trigger armed\npasses: memcg 2, timer 7\n"
        ), "{text}");
        assert!(text.contains("(memcg), pressure: MemoryPressure"), "{text}");
        let rows: Vec<&str> = text.lines().skip(3).collect();
        assert!(
            rows[0].starts_with("TIME") && rows[0].ends_with("EVICTED"),
            "{text}"
        );
        assert!(
            rows[1].contains("memory.available  104857600  99614720   default/hog"),
            "{text}"
        );
    }
}
