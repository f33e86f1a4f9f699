//! Prometheus metrics (text format on `/metrics`). Names follow upstream kubelet
//! where the concept matches (`kubelet_pleg_*`, `kubelet_running_*`); evlet's own
//! start with `evlet_`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

/// Label set `{container_state="running"}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// created, running, exited, unknown.
    pub container_state: String,
}

/// Label set `{mode="ebpf"}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    /// The PLEG mode.
    pub mode: String,
}

/// Label set `{reason="lost_events"}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: String,
}

/// Label set `{field="exit_code"}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FieldLabel {
    /// The field.
    pub field: String,
}

/// Label set of OOM kills.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OomLabel {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
}

/// Label set of `prober_probe_total` (upstream's names and values).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeResultLabels {
    /// `Liveness`, `Readiness`, `Startup`.
    pub probe_type: String,
    /// `successful`, `failed`, `unknown`.
    pub result: String,
    /// Container name.
    pub container: String,
    /// Pod name.
    pub pod: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod UID.
    pub pod_uid: String,
}

/// Label set of `prober_probe_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    /// `Liveness`, `Readiness`, `Startup`.
    pub probe_type: String,
    /// Container name.
    pub container: String,
    /// Pod name.
    pub pod: String,
    /// Pod namespace.
    pub namespace: String,
}

/// The prober's metrics, on a registry of their own served at
/// `/metrics/probes` (as upstream; they are not on `/metrics`).
#[derive(Debug)]
pub struct ProbeMetrics {
    /// The `/metrics/probes` registry.
    pub registry: Registry,
    /// Every metric registered in it, with its type.
    names: Vec<(&'static str, MetricType)>,
    /// Probes run, by result (every attempt, below threshold or not).
    pub total: Family<ProbeResultLabels, Counter>,
    /// Seconds per healthy probe (upstream observes no failures).
    pub duration: Family<ProbeLabels, Histogram, fn() -> Histogram>,
}

impl Default for ProbeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ProbeMetrics {
    /// Creates and registers the prober's metrics.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let mut names = Vec::new();
        let mut reg = Registrar {
            registry: &mut registry,
            names: &mut names,
        };
        let total = Family::<ProbeResultLabels, Counter>::default();
        let duration: Family<ProbeLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(buckets_seconds()));
        reg.add(
            "prober_probe",
            "Cumulative number of a liveness, readiness or startup probe for a container by result.",
            total.clone(),
        );
        reg.add(
            "prober_probe_duration_seconds",
            "Duration in seconds for a probe response.",
            duration.clone(),
        );
        Self {
            registry,
            names,
            total,
            duration,
        }
    }

    /// Every sample name this registry serves, with or without samples yet.
    pub fn exposed_names(&self) -> Vec<String> {
        self.names
            .iter()
            .flat_map(|(name, kind)| sample_names(name, kind))
            .collect()
    }

    /// The registry in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Registers metrics and remembers their names and types: a family with no
/// samples yet is absent from the encoded text, yet its names are served.
struct Registrar<'a> {
    registry: &'a mut Registry,
    names: &'a mut Vec<(&'static str, MetricType)>,
}

impl Registrar<'_> {
    fn add<M: Metric + TypedMetric>(&mut self, name: &'static str, help: &str, metric: M) {
        self.names.push((name, M::TYPE));
        self.registry.register(name, help, metric);
    }
}

/// The sample names a metric of `kind` called `name` is exposed under
/// (prometheus-client's OpenMetrics text: counters end in `_total`).
fn sample_names(name: &str, kind: &MetricType) -> Vec<String> {
    let suffixes: &[&str] = match kind {
        MetricType::Counter => &["_total"],
        MetricType::Histogram => &["_bucket", "_sum", "_count"],
        MetricType::Info => &["_info"],
        _ => &[""],
    };
    suffixes.iter().map(|s| format!("{name}{s}")).collect()
}

/// Every metric of the agent.
#[derive(Debug)]
pub struct Metrics {
    /// The registry serving `/metrics`.
    pub registry: Registry,
    /// Every metric registered in it, with its type.
    names: Vec<(&'static str, MetricType)>,
    /// Seconds per full relist.
    pub pleg_relist_duration: Histogram,
    /// Seconds between the starts of full relists.
    pub pleg_relist_interval: Histogram,
    /// Seconds per single-pod relist.
    pub pleg_pod_relist_duration: Histogram,
    /// PLEG events dropped because the sync loop's channel was full.
    pub pleg_discard_events: Counter,
    /// Unix time of the last successful full relist.
    pub pleg_last_seen: Gauge<f64, AtomicU64>,
    /// Pods with a ready sandbox.
    pub running_pods: Gauge,
    /// Containers by state.
    pub running_containers: Family<StateLabel, Gauge>,
    /// Kernel event → pod cache updated, seconds.
    pub pleg_hint_latency: Histogram,
    /// State changes a full relist found that no hint announced.
    pub pleg_missed_events: Counter,
    /// Full relists that counted missed events (periodic safety relists and
    /// verifications).
    pub pleg_counted_relists: Counter,
    /// Full relists done, by why they were needed.
    pub pleg_full_relists: Family<ReasonLabel, Counter>,
    /// How long a kernel-reported exit waited for the runtime to show it, from
    /// the first read that did not, seconds.
    pub pleg_expectation_wait: Histogram,
    /// Pods with a kernel-reported exit the runtime has not shown yet.
    pub pleg_expectations: Gauge,
    /// Fields where the runtime's report of an exit disagreed with the kernel's.
    pub pleg_runtime_disagreements: Family<FieldLabel, Counter>,
    /// Containers the kernel saw exit that the runtime still showed running
    /// 10 s later.
    pub runtime_exit_lost: Counter,
    /// Worker waits for a fresh status answered by a kernel quiet proof
    /// instead of a CRI re-read.
    pub pleg_quiet_proofs: Counter,
    /// eBPF ring-buffer records lost in the kernel.
    pub ebpf_ringbuf_lost: Counter,
    /// OOM kills seen by the kernel probes.
    pub oom_kills: Family<OomLabel, Counter>,
    /// 1 for the active PLEG mode.
    pub pleg_mode: Family<ModeLabel, Gauge>,
    /// Manifests rejected by static pod sources.
    pub manifest_errors: Counter,
    /// Seconds per pod sync.
    pub pod_worker_duration: Histogram,
    /// The prober's, served apart at `/metrics/probes`.
    pub probes: ProbeMetrics,
}

fn buckets_seconds() -> impl Iterator<Item = f64> {
    // Prometheus' DefBuckets, as upstream's relist histograms use.
    [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ]
    .into_iter()
}

fn buckets_wait() -> impl Iterator<Item = f64> {
    [
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ]
    .into_iter()
}

fn buckets_latency() -> impl Iterator<Item = f64> {
    [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ]
    .into_iter()
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let mut names = Vec::new();
        let mut reg = Registrar {
            registry: &mut registry,
            names: &mut names,
        };
        let m = Self {
            pleg_relist_duration: Histogram::new(buckets_seconds()),
            pleg_relist_interval: Histogram::new(buckets_seconds()),
            pleg_pod_relist_duration: Histogram::new(buckets_latency()),
            pleg_discard_events: Counter::default(),
            pleg_last_seen: Gauge::default(),
            running_pods: Gauge::default(),
            running_containers: Family::default(),
            pleg_hint_latency: Histogram::new(buckets_latency()),
            pleg_missed_events: Counter::default(),
            pleg_counted_relists: Counter::default(),
            pleg_full_relists: Family::default(),
            pleg_expectation_wait: Histogram::new(buckets_wait()),
            pleg_expectations: Gauge::default(),
            pleg_runtime_disagreements: Family::default(),
            runtime_exit_lost: Counter::default(),
            pleg_quiet_proofs: Counter::default(),
            ebpf_ringbuf_lost: Counter::default(),
            oom_kills: Family::default(),
            pleg_mode: Family::default(),
            manifest_errors: Counter::default(),
            pod_worker_duration: Histogram::new(buckets_seconds()),
            probes: ProbeMetrics::new(),
            registry: Registry::default(),
            names: Vec::new(),
        };
        reg.add(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG",
            m.pleg_relist_duration.clone(),
        );
        reg.add(
            "kubelet_pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG",
            m.pleg_relist_interval.clone(),
        );
        reg.add(
            "kubelet_pleg_pod_relist_duration_seconds",
            "Duration in seconds of single-pod relists in PLEG",
            m.pleg_pod_relist_duration.clone(),
        );
        reg.add(
            "kubelet_pleg_discard_events",
            "The number of discard events in PLEG",
            m.pleg_discard_events.clone(),
        );
        reg.add(
            "kubelet_pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active",
            m.pleg_last_seen.clone(),
        );
        reg.add(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
            m.running_pods.clone(),
        );
        reg.add(
            "kubelet_running_containers",
            "Number of containers currently running",
            m.running_containers.clone(),
        );
        reg.add(
            "evlet_pleg_hint_latency_seconds",
            "Kernel event timestamp to pod cache updated",
            m.pleg_hint_latency.clone(),
        );
        reg.add(
            "evlet_pleg_missed_events",
            "State changes found by a global relist with no preceding hint",
            m.pleg_missed_events.clone(),
        );
        reg.add(
            "evlet_pleg_counted_relists",
            "Full relists that counted missed events",
            m.pleg_counted_relists.clone(),
        );
        reg.add(
            "evlet_pleg_full_relists",
            "Full relists done, by why they were needed",
            m.pleg_full_relists.clone(),
        );
        reg.add(
            "evlet_pleg_expectation_wait_seconds",
            "How long a kernel-reported exit waited for the runtime to show it",
            m.pleg_expectation_wait.clone(),
        );
        reg.add(
            "evlet_pleg_expectations",
            "Pods with a kernel-reported exit the runtime has not shown yet",
            m.pleg_expectations.clone(),
        );
        reg.add(
            "evlet_pleg_runtime_disagreements",
            "Fields where the runtime's report of an exit disagreed with the kernel's",
            m.pleg_runtime_disagreements.clone(),
        );
        reg.add(
            "evlet_runtime_exit_lost",
            "Containers the kernel saw exit that the runtime still showed running 10 s later",
            m.runtime_exit_lost.clone(),
        );
        reg.add(
            "evlet_pleg_quiet_proofs",
            "Pod status freshness proven by a drained eBPF ring buffer instead of a CRI re-read",
            m.pleg_quiet_proofs.clone(),
        );
        reg.add(
            "evlet_ebpf_ringbuf_lost",
            "eBPF ring buffer records lost in the kernel",
            m.ebpf_ringbuf_lost.clone(),
        );
        reg.add(
            "evlet_oom_kills",
            "OOM kills seen by the kernel probes",
            m.oom_kills.clone(),
        );
        reg.add(
            "evlet_pleg_mode",
            "1 for the active PLEG mode",
            m.pleg_mode.clone(),
        );
        reg.add(
            "evlet_manifest_errors",
            "Static pod manifests rejected",
            m.manifest_errors.clone(),
        );
        reg.add(
            "kubelet_pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod",
            m.pod_worker_duration.clone(),
        );
        Self {
            registry,
            names,
            ..m
        }
    }

    /// Every sample name this registry serves, with or without samples yet.
    pub fn exposed_names(&self) -> Vec<String> {
        self.names
            .iter()
            .flat_map(|(name, kind)| sample_names(name, kind))
            .collect()
    }

    /// The registry in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
