//! The diagnostics views `evlet diag` reads: `/debug/pleg` (the PLEG's state
//! and counters), `/debug/pods/{namespace}/{name}/timeline` (a pod's
//! timeline); `/debug/oom` serves the OOM records as they are.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prometheus::core::Collector as _;
use serde::{Deserialize, Serialize};

use super::Served;

/// `/debug/pleg`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlegView {
    /// The active PLEG mode.
    pub mode: String,
    /// Why the PLEG is unhealthy, if it is.
    pub unhealthy: Option<String>,
    /// Unix time of the last successful full relist (0: none yet).
    pub last_full_relist: f64,
    /// Kernel event → pod cache updated.
    pub hint_latency: HistogramView,
    /// Single-pod relists' durations.
    pub pod_relist_duration: HistogramView,
    /// Freshness proven by a drained ring buffer instead of a CRI read.
    pub quiet_proofs: u64,
    /// Changes a counting full relist found that no hint announced.
    pub missed_events: u64,
    /// Full relists that counted missed events.
    pub counted_relists: u64,
    /// eBPF ring-buffer records lost in the kernel.
    pub ringbuf_lost: u64,
    /// PLEG events dropped (the sync loop's channel was full).
    pub discarded_events: u64,
    /// Full relists by why.
    pub full_relists: BTreeMap<String, u64>,
    /// Fields where the runtime disagreed with the kernel about an exit.
    pub runtime_disagreements: BTreeMap<String, u64>,
    /// Exits the kernel saw that the runtime still showed running 10 s later.
    pub runtime_exit_lost: u64,
    /// Kernel-reported exits the runtime never showed, given up on.
    #[serde(default)]
    pub expectations_abandoned: u64,
    /// Pods with a kernel-reported exit the runtime has not shown yet.
    pub expectations: i64,
    /// Single-pod relists per pod (namespace/name, or UID).
    pub pod_relists: BTreeMap<String, u64>,
}

/// A histogram's samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistogramView {
    /// Observations.
    pub count: u64,
    /// Their sum, seconds.
    pub sum: f64,
    /// (upper bound in seconds, cumulative count).
    pub buckets: Vec<(f64, u64)>,
}

impl HistogramView {
    fn of(h: &prometheus::Histogram) -> Self {
        let buckets = h
            .collect()
            .first()
            .and_then(|f| f.get_metric().first().cloned())
            .map(|m| {
                m.get_histogram()
                    .get_bucket()
                    .iter()
                    .map(|b| (b.upper_bound(), b.cumulative_count()))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            count: h.get_sample_count(),
            sum: h.get_sample_sum(),
            buckets,
        }
    }
}

/// A counter family's values by its one label.
fn by_label(v: &prometheus::IntCounterVec) -> BTreeMap<String, u64> {
    v.collect()
        .iter()
        .flat_map(|f| f.get_metric())
        .map(|m| {
            let label = m
                .get_label()
                .first()
                .map(|l| l.value().to_owned())
                .unwrap_or_default();
            (label, m.get_counter().get_value() as u64)
        })
        .collect()
}

/// Builds `/debug/pleg` from the served state.
pub fn pleg_view(s: &Served) -> PlegView {
    let m = &s.metrics;
    PlegView {
        mode: crate::lock::lock(&s.mode).clone(),
        unhealthy: s.health.check().err().map(|e| e.to_string()),
        last_full_relist: m.pleg_last_seen.get(),
        hint_latency: HistogramView::of(&m.pleg_hint_latency),
        pod_relist_duration: HistogramView::of(&m.pleg_pod_relist_duration),
        quiet_proofs: m.pleg_quiet_proofs.get(),
        missed_events: m.pleg_missed_events.get(),
        counted_relists: m.pleg_counted_relists.get(),
        ringbuf_lost: m.ebpf_ringbuf_lost.get(),
        discarded_events: m.pleg_discard_events.get(),
        full_relists: by_label(&m.pleg_full_relists),
        runtime_disagreements: by_label(&m.pleg_runtime_disagreements),
        runtime_exit_lost: m.runtime_exit_lost.get(),
        expectations_abandoned: m.pleg_expectations_abandoned.get(),
        expectations: m.pleg_expectations.get(),
        pod_relists: s.diagnostics.pod_relists().into_iter().collect(),
    }
}

pub(super) async fn pleg(State(s): State<Arc<Served>>) -> Response {
    axum::Json(pleg_view(&s)).into_response()
}

pub(super) async fn eviction(State(s): State<Arc<Served>>) -> Response {
    axum::Json(s.eviction.view()).into_response()
}

pub(super) async fn timeline(
    State(s): State<Arc<Served>>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    // A pod's timeline past the 256 kept is dropped, and started again by its
    // next kernel or CRI entry without a name (the worker names a pod once):
    // the running pod's UID finds it then.
    let found = s.diagnostics.timeline(&namespace, &name).or_else(|| {
        let uid = crate::pod::uid(&s.workers.find(&namespace, &name)?.pod);
        let mut t = s.diagnostics.timeline_of(&uid.0)?;
        t.namespace.clone_from(&namespace);
        t.name.clone_from(&name);
        Some(t)
    });
    match found {
        Some(t) => axum::Json(t).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no timeline of pod {namespace}/{name}"),
        )
            .into_response(),
    }
}
