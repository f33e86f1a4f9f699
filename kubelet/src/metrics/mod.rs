//! Prometheus metrics, served in the text format 0.0.4 as upstream kubelet
//! serves them (`/metrics`, `/metrics/probes`).
//!
//! Names, types, labels, buckets and help texts of the metrics upstream also
//! has are upstream's, with its `[ALPHA]`/`[BETA]` help prefix; a counter is
//! called `…_total` only where upstream's is (`kubelet_pleg_discard_events`,
//! `kubelet_evictions` are not). evlet's own start with `evlet_`.
//! `tests/upstream_metrics.rs` holds the list they are checked against.
//!
//! Map: this module registers and encodes; [`process`] reads `/proc/self` for
//! `process_*` at each scrape; [`runtime`] turns CRI calls into
//! `kubelet_runtime_operations_*` and names the operations as upstream does;
//! [`rest`] holds the API client's `rest_client_*`.

pub mod process;
pub mod rest;
pub mod runtime;
pub mod startup;

use prometheus::core::Collector;
use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric's kind, as the text format's `# TYPE` line says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Buckets, sum and count.
    Histogram,
}

impl Kind {
    /// `counter`, `gauge` or `histogram`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// One registered metric: what a scraper sees, with samples or not yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Described {
    /// The metric's name.
    pub name: String,
    /// Its kind.
    pub kind: Kind,
    /// Its label names, in order.
    pub labels: Vec<String>,
    /// A histogram's bucket bounds.
    pub buckets: Vec<f64>,
}

impl Described {
    /// The sample names it is exposed under.
    pub fn sample_names(&self) -> Vec<String> {
        let suffixes: &[&str] = match self.kind {
            Kind::Histogram => &["_bucket", "_sum", "_count"],
            Kind::Counter | Kind::Gauge => &[""],
        };
        suffixes
            .iter()
            .map(|s| format!("{}{s}", self.name))
            .collect()
    }
}

/// The stability prefix upstream's component-base puts before a help text.
const ALPHA: &str = "[ALPHA] ";

/// A registry that remembers what it registered: a family with no samples
/// yet is absent from the encoded text, yet a scraper may depend on it.
#[derive(Debug, Default)]
pub struct Catalog {
    registry: Registry,
    described: Vec<Described>,
}

impl Catalog {
    fn add<C: Collector + Clone + 'static>(&mut self, kind: Kind, metric: C) -> C {
        self.add_with_buckets(kind, metric, &[])
    }

    fn add_with_buckets<C: Collector + Clone + 'static>(
        &mut self,
        kind: Kind,
        metric: C,
        buckets: &[f64],
    ) -> C {
        for desc in metric.desc() {
            self.described.push(Described {
                name: desc.fq_name.clone(),
                kind,
                labels: desc.variable_labels.clone(),
                buckets: buckets.to_vec(),
            });
        }
        // Names are constants of this module, each registered once: a clash
        // is a programming error that `tests` below catch.
        if let Err(e) = self.registry.register(Box::new(metric.clone())) {
            tracing::error!(error = %e, "metric not registered");
        }
        metric
    }

    fn counter(&mut self, name: &str, help: &str) -> IntCounter {
        self.add(Kind::Counter, expect_valid(IntCounter::new(name, help)))
    }

    fn counter_vec(&mut self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(
            Kind::Counter,
            expect_valid(IntCounterVec::new(Opts::new(name, help), labels)),
        )
    }

    fn gauge(&mut self, name: &str, help: &str) -> IntGauge {
        self.add(Kind::Gauge, expect_valid(IntGauge::new(name, help)))
    }

    fn float_gauge(&mut self, name: &str, help: &str) -> Gauge {
        self.add(Kind::Gauge, expect_valid(Gauge::new(name, help)))
    }

    fn gauge_vec(&mut self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(
            Kind::Gauge,
            expect_valid(IntGaugeVec::new(Opts::new(name, help), labels)),
        )
    }

    fn float_gauge_vec(&mut self, name: &str, help: &str, labels: &[&str]) -> prometheus::GaugeVec {
        self.add(
            Kind::Gauge,
            expect_valid(prometheus::GaugeVec::new(Opts::new(name, help), labels)),
        )
    }

    fn histogram(&mut self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add_with_buckets(
            Kind::Histogram,
            expect_valid(Histogram::with_opts(opts)),
            buckets,
        )
    }

    fn histogram_vec(
        &mut self,
        name: &str,
        help: &str,
        buckets: &[f64],
        labels: &[&str],
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        self.add_with_buckets(
            Kind::Histogram,
            expect_valid(HistogramVec::new(opts, labels)),
            buckets,
        )
    }

    /// Everything registered.
    pub fn described(&self) -> &[Described] {
        &self.described
    }

    /// Every sample name this registry serves, with or without samples yet.
    pub fn exposed_names(&self) -> Vec<String> {
        self.described
            .iter()
            .flat_map(Described::sample_names)
            .collect()
    }

    /// The registry in the Prometheus text format 0.0.4 ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = TextEncoder::new().encode_utf8(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        out
    }
}

/// A metric made from this module's constant names, help texts and buckets:
/// only a malformed definition can fail, and the unit tests construct every
/// one, so this cannot fail at run time.
fn expect_valid<M>(made: prometheus::Result<M>) -> M {
    made.expect("metric definitions are constants, checked by the unit tests")
}

/// The prober's metrics, on a registry of their own served at
/// `/metrics/probes` (as upstream; they are not on `/metrics`).
#[derive(Debug)]
pub struct ProbeMetrics {
    /// The `/metrics/probes` registry.
    pub catalog: Catalog,
    /// Probes run, by result (every attempt, below threshold or not):
    /// `probe_type`, `result`, `container`, `pod`, `namespace`, `pod_uid`.
    pub total: IntCounterVec,
    /// Seconds per healthy probe (upstream observes no failures):
    /// `probe_type`, `container`, `pod`, `namespace`.
    pub duration: HistogramVec,
    /// When the process started.
    pub start_time: Gauge,
}

impl Default for ProbeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ProbeMetrics {
    /// Creates and registers the prober's metrics.
    pub fn new() -> Self {
        let mut c = Catalog::default();
        let total = c.counter_vec(
            "prober_probe_total",
            "[BETA] Cumulative number of a liveness, readiness or startup probe for a container by result.",
            &["probe_type", "result", "container", "pod", "namespace", "pod_uid"],
        );
        let duration = c.histogram_vec(
            "prober_probe_duration_seconds",
            "[ALPHA] Duration in seconds for a probe response.",
            DEF_BUCKETS,
            &["probe_type", "container", "pod", "namespace"],
        );
        let start_time = c.float_gauge(
            "process_start_time_seconds",
            "[ALPHA] Start time of the process since unix epoch in seconds.",
        );
        start_time.set(process::start_time_seconds().unwrap_or(0.0));
        Self {
            catalog: c,
            total,
            duration,
            start_time,
        }
    }

    /// The registry in the text format.
    pub fn encode(&self) -> String {
        self.catalog.encode()
    }
}

/// Prometheus' `DefBuckets`, as upstream's relist and worker histograms use.
const DEF_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upstream's `podStartupDurationBuckets`.
const POD_START_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// Upstream's runtime-operation buckets: `ExponentialBuckets(.005, 2.5, 14)`.
fn runtime_buckets() -> Vec<f64> {
    (0..14).map(|i| 0.005 * 2.5f64.powi(i)).collect()
}

/// client-go's request latency buckets.
const REST_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// `container_type` of `kubelet_started_containers_*`.
pub fn container_type(init: bool) -> &'static str {
    if init { "init_container" } else { "container" }
}

/// Every metric of the agent.
#[derive(Debug)]
pub struct Metrics {
    /// The `/metrics` registry.
    pub catalog: Catalog,
    /// Seconds per full relist.
    pub pleg_relist_duration: Histogram,
    /// Seconds between the starts of full relists.
    pub pleg_relist_interval: Histogram,
    /// Seconds per single-pod relist.
    pub pleg_pod_relist_duration: Histogram,
    /// PLEG events dropped because the sync loop's channel was full.
    pub pleg_discard_events: IntCounter,
    /// Unix time of the last successful full relist.
    pub pleg_last_seen: Gauge,
    /// Pods with a ready sandbox.
    pub running_pods: IntGauge,
    /// Containers by `container_state`.
    pub running_containers: IntGaugeVec,
    /// Kernel event → pod cache updated, seconds.
    pub pleg_hint_latency: Histogram,
    /// State changes a full relist found that no hint announced.
    pub pleg_missed_events: IntCounter,
    /// Full relists that counted missed events (periodic safety relists and
    /// verifications).
    pub pleg_counted_relists: IntCounter,
    /// Full relists done, by `reason`.
    pub pleg_full_relists: IntCounterVec,
    /// How long a kernel-reported exit waited for the runtime to show it, from
    /// the first read that did not, seconds.
    pub pleg_expectation_wait: Histogram,
    /// Pods with a kernel-reported exit the runtime has not shown yet.
    pub pleg_expectations: IntGauge,
    /// Fields (`field`) where the runtime's report of an exit disagreed with
    /// the kernel's; `running`: the kernel's reported init still lived.
    pub pleg_runtime_disagreements: IntCounterVec,
    /// Kernel-reported exits the runtime never showed, given up on.
    pub pleg_expectations_abandoned: IntCounter,
    /// Containers the kernel saw exit that the runtime still showed running
    /// 10 s later.
    pub runtime_exit_lost: IntCounter,
    /// Worker waits for a fresh status answered by a kernel quiet proof
    /// instead of a CRI re-read.
    pub pleg_quiet_proofs: IntCounter,
    /// eBPF ring-buffer records lost in the kernel.
    pub ebpf_ringbuf_lost: IntCounter,
    /// OOM kills seen by the kernel probes: `namespace`, `pod`, `container`.
    pub oom_kills: IntCounterVec,
    /// 1 for the active PLEG `mode`.
    pub pleg_mode: IntGaugeVec,
    /// Manifests rejected by static pod sources.
    pub manifest_errors: IntCounter,
    /// Seconds per pod sync, by `operation_type` (create, update, sync, kill).
    pub pod_worker_duration: HistogramVec,
    /// First seen → running, seconds.
    pub pod_start_duration: Histogram,
    /// Created → all containers started, without image pulls and init
    /// containers: the SLI and what it needs to know.
    pub startup: startup::StartupTracker,
    /// CRI calls, failures and seconds by `operation_type`.
    pub runtime: runtime::RuntimeOperations,
    /// Sandboxes started.
    pub started_pods: IntCounter,
    /// Sandboxes that failed to start.
    pub started_pods_errors: IntCounter,
    /// Containers started, by `container_type`.
    pub started_containers: IntCounterVec,
    /// Containers that failed to start, by `container_type` and `code`.
    pub started_containers_errors: IntCounterVec,
    /// 1 with the node's name as `node`.
    pub node_name: IntGaugeVec,
    /// Pods evicted, by `eviction_signal`.
    pub evictions: IntCounterVec,
    /// Images the image GC removed, by `reason` (`space`, `age`).
    pub image_garbage_collected: IntCounterVec,
    /// The API client's requests.
    pub rest_client: rest::RestClientMetrics,
    /// The client and serving certificates (TLS bootstrap and rotation).
    pub certificates: CertificateMetrics,
    /// PVC volume statistics, refreshed at each scrape.
    pub volume_stats: VolumeStatsGauges,
    /// `process_*`, refreshed at each scrape.
    pub process: process::ProcessMetrics,
    /// The prober's, served apart at `/metrics/probes`.
    pub probes: ProbeMetrics,
}

/// The six `kubelet_volume_stats_*` gauges, by `namespace` and
/// `persistentvolumeclaim`.
#[derive(Debug)]
pub struct VolumeStatsGauges {
    /// Capacity in bytes.
    pub capacity_bytes: prometheus::GaugeVec,
    /// Available bytes.
    pub available_bytes: prometheus::GaugeVec,
    /// Used bytes.
    pub used_bytes: prometheus::GaugeVec,
    /// Inodes.
    pub inodes: prometheus::GaugeVec,
    /// Free inodes.
    pub inodes_free: prometheus::GaugeVec,
    /// Used inodes.
    pub inodes_used: prometheus::GaugeVec,
}

/// One PVC-backed volume's file system numbers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VolumeStatsSample {
    /// The pod's namespace.
    pub namespace: String,
    /// The claim's name.
    pub claim: String,
    /// Bytes of the file system.
    pub capacity_bytes: f64,
    /// Free bytes for unprivileged users.
    pub available_bytes: f64,
    /// Bytes in use.
    pub used_bytes: f64,
    /// Inodes of the file system.
    pub inodes: f64,
    /// Free inodes.
    pub inodes_free: f64,
    /// Inodes in use.
    pub inodes_used: f64,
}

impl VolumeStatsGauges {
    fn new(c: &mut Catalog) -> Self {
        let labels = &["namespace", "persistentvolumeclaim"];
        let mut g = |key: &str, help: &str| {
            c.float_gauge_vec(&format!("kubelet_volume_stats_{key}"), help, labels)
        };
        Self {
            capacity_bytes: g("capacity_bytes", "[ALPHA] Capacity in bytes of the volume"),
            available_bytes: g(
                "available_bytes",
                "[ALPHA] Number of available bytes in the volume",
            ),
            used_bytes: g("used_bytes", "[ALPHA] Number of used bytes in the volume"),
            inodes: g("inodes", "[ALPHA] Maximum number of inodes in the volume"),
            inodes_free: g("inodes_free", "[ALPHA] Number of free inodes in the volume"),
            inodes_used: g("inodes_used", "[ALPHA] Number of used inodes in the volume"),
        }
    }

    /// Replaces every series with `samples` (one per claim, first wins).
    pub fn set(&self, samples: &[VolumeStatsSample]) {
        let all = [
            &self.capacity_bytes,
            &self.available_bytes,
            &self.used_bytes,
            &self.inodes,
            &self.inodes_free,
            &self.inodes_used,
        ];
        for g in all {
            g.reset();
        }
        let mut seen = std::collections::HashSet::new();
        for s in samples {
            if !seen.insert((&s.namespace, &s.claim)) {
                continue;
            }
            let l = [s.namespace.as_str(), s.claim.as_str()];
            self.capacity_bytes
                .with_label_values(&l)
                .set(s.capacity_bytes);
            self.available_bytes
                .with_label_values(&l)
                .set(s.available_bytes);
            self.used_bytes.with_label_values(&l).set(s.used_bytes);
            self.inodes.with_label_values(&l).set(s.inodes);
            self.inodes_free.with_label_values(&l).set(s.inodes_free);
            self.inodes_used.with_label_values(&l).set(s.inodes_used);
        }
    }
}

/// Upstream's certificate rotation buckets: a minute to four years.
const CERTIFICATE_AGE_BUCKETS: &[f64] = &[
    60.0,
    3600.0,
    14400.0,
    86400.0,
    604800.0,
    2592000.0,
    7776000.0,
    15552000.0,
    31104000.0,
    124416000.0,
];

/// The certificate manager's metrics, upstream's names. Made before the
/// agent (the manager starts first) and registered by
/// [`Metrics::with_clients`]; the TTL gauges are computed at each scrape from
/// the expiry the manager sets (+Inf without a certificate, as upstream's).
#[derive(Debug, Clone)]
pub struct CertificateMetrics {
    /// Failed client certificate requests.
    pub client_renew_errors: IntCounter,
    /// Seconds until the client certificate expires.
    pub client_ttl: Gauge,
    /// Failed serving certificate requests.
    pub server_renew_errors: IntCounter,
    /// Seconds until the serving certificate expires.
    pub server_ttl: Gauge,
    /// How long serving certificates lived before they were rotated.
    pub server_rotation: Histogram,
    /// The client certificate's expiry, Unix seconds; `i64::MIN`: none.
    client_expiry: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// The serving certificate's.
    server_expiry: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl Default for CertificateMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl CertificateMetrics {
    /// New, unregistered metrics.
    pub fn new() -> Self {
        let alpha = |help: &str| format!("{ALPHA}{help}");
        let none = || std::sync::Arc::new(std::sync::atomic::AtomicI64::new(i64::MIN));
        Self {
            client_renew_errors: expect_valid(IntCounter::new(
                "kubelet_certificate_manager_client_expiration_renew_errors",
                alpha("Counter of certificate renewal errors."),
            )),
            client_ttl: expect_valid(Gauge::new(
                "kubelet_certificate_manager_client_ttl_seconds",
                alpha(
                    "Gauge of the TTL (time-to-live) of the Kubelet's client certificate. The value is in seconds until certificate expiry (negative if already expired). If client certificate is invalid or unused, the value will be +INF.",
                ),
            )),
            server_renew_errors: expect_valid(IntCounter::new(
                "kubelet_server_expiration_renew_errors",
                alpha("Counter of certificate renewal errors."),
            )),
            server_ttl: expect_valid(Gauge::new(
                "kubelet_certificate_manager_server_ttl_seconds",
                alpha(
                    "Gauge of the shortest TTL (time-to-live) of the Kubelet's serving certificate. The value is in seconds until certificate expiry (negative if already expired). If serving certificate is invalid or unused, the value will be +INF.",
                ),
            )),
            server_rotation: expect_valid(Histogram::with_opts(
                HistogramOpts::new(
                    "kubelet_certificate_manager_server_rotation_seconds",
                    alpha(
                        "Histogram of the number of seconds the previous certificate lived before being rotated.",
                    ),
                )
                .buckets(CERTIFICATE_AGE_BUCKETS.to_vec()),
            )),
            client_expiry: none(),
            server_expiry: none(),
        }
    }

    fn register(self, c: &mut Catalog) -> Self {
        Self {
            client_renew_errors: c.add(Kind::Counter, self.client_renew_errors),
            client_ttl: c.add(Kind::Gauge, self.client_ttl),
            server_renew_errors: c.add(Kind::Counter, self.server_renew_errors),
            server_ttl: c.add(Kind::Gauge, self.server_ttl),
            server_rotation: c.add_with_buckets(
                Kind::Histogram,
                self.server_rotation,
                CERTIFICATE_AGE_BUCKETS,
            ),
            client_expiry: self.client_expiry,
            server_expiry: self.server_expiry,
        }
    }

    /// The client certificate in use expires then (None: there is none).
    pub fn set_client_expiry(&self, not_after: Option<std::time::SystemTime>) {
        self.client_expiry.store(
            unix_or_none(not_after),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The serving certificate in use expires then (None: there is none).
    pub fn set_server_expiry(&self, not_after: Option<std::time::SystemTime>) {
        self.server_expiry.store(
            unix_or_none(not_after),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Sets the TTL gauges for `now`.
    pub fn refresh(&self, now: std::time::SystemTime) {
        let now = unix_or_none(Some(now));
        for (expiry, gauge) in [
            (&self.client_expiry, &self.client_ttl),
            (&self.server_expiry, &self.server_ttl),
        ] {
            let at = expiry.load(std::sync::atomic::Ordering::Relaxed);
            gauge.set(if at == i64::MIN {
                f64::INFINITY
            } else {
                // Whole seconds, as upstream truncates.
                at.saturating_sub(now) as f64
            });
        }
    }
}

fn unix_or_none(t: Option<std::time::SystemTime>) -> i64 {
    let Some(t) = t else { return i64::MIN };
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric (with API client metrics no client
    /// reports to).
    pub fn new() -> Self {
        Self::with_rest_client(rest::RestClientMetrics::new())
    }

    /// Creates and registers every metric, with the API client's.
    pub fn with_rest_client(rest_client: rest::RestClientMetrics) -> Self {
        Self::with_clients(rest_client, CertificateMetrics::new())
    }

    /// Creates and registers every metric, with the API client's requests
    /// and its certificates'.
    pub fn with_clients(
        rest_client: rest::RestClientMetrics,
        certificates: CertificateMetrics,
    ) -> Self {
        let mut c = Catalog::default();
        let alpha = |help: &str| format!("{ALPHA}{help}");
        let rt = runtime_buckets();
        Self {
            pleg_relist_duration: c.histogram(
                "kubelet_pleg_relist_duration_seconds",
                &alpha("Duration in seconds for relisting pods in PLEG."),
                DEF_BUCKETS,
            ),
            pleg_relist_interval: c.histogram(
                "kubelet_pleg_relist_interval_seconds",
                &alpha("Interval in seconds between relisting in PLEG."),
                DEF_BUCKETS,
            ),
            pleg_pod_relist_duration: c.histogram(
                "evlet_pleg_pod_relist_duration_seconds",
                "Duration in seconds of single-pod relists in PLEG",
                LATENCY_BUCKETS,
            ),
            pleg_discard_events: c.counter(
                "kubelet_pleg_discard_events",
                &alpha("The number of discard events in PLEG."),
            ),
            pleg_last_seen: c.float_gauge(
                "kubelet_pleg_last_seen_seconds",
                &alpha("Timestamp in seconds when PLEG was last seen active."),
            ),
            running_pods: c.gauge(
                "kubelet_running_pods",
                &alpha("Number of pods that have a running pod sandbox"),
            ),
            running_containers: c.gauge_vec(
                "kubelet_running_containers",
                &alpha("Number of containers currently running"),
                &["container_state"],
            ),
            pleg_hint_latency: c.histogram(
                "evlet_pleg_hint_latency_seconds",
                "Kernel event timestamp to pod cache updated",
                LATENCY_BUCKETS,
            ),
            pleg_missed_events: c.counter(
                "evlet_pleg_missed_events_total",
                "State changes found by a global relist with no preceding hint",
            ),
            pleg_counted_relists: c.counter(
                "evlet_pleg_counted_relists_total",
                "Full relists that counted missed events",
            ),
            pleg_full_relists: c.counter_vec(
                "evlet_pleg_full_relists_total",
                "Full relists done, by why they were needed",
                &["reason"],
            ),
            pleg_expectation_wait: c.histogram(
                "evlet_pleg_expectation_wait_seconds",
                "How long a kernel-reported exit waited for the runtime to show it",
                WAIT_BUCKETS,
            ),
            pleg_expectations: c.gauge(
                "evlet_pleg_expectations",
                "Pods with a kernel-reported exit the runtime has not shown yet",
            ),
            pleg_runtime_disagreements: c.counter_vec(
                "evlet_pleg_runtime_disagreements_total",
                "Fields where the runtime's report of an exit disagreed with the kernel's",
                &["field"],
            ),
            pleg_expectations_abandoned: c.counter(
                "evlet_pleg_expectations_abandoned_total",
                "Kernel-reported exits the runtime never showed, no longer waited for",
            ),
            runtime_exit_lost: c.counter(
                "evlet_runtime_exit_lost_total",
                "Containers the kernel saw exit that the runtime still showed running 10 s later",
            ),
            pleg_quiet_proofs: c.counter(
                "evlet_pleg_quiet_proofs_total",
                "Pod status freshness proven by a drained eBPF ring buffer instead of a CRI re-read",
            ),
            ebpf_ringbuf_lost: c.counter(
                "evlet_ebpf_ringbuf_lost_total",
                "eBPF ring buffer records lost in the kernel",
            ),
            oom_kills: c.counter_vec(
                "evlet_oom_kills_total",
                "OOM kills seen by the kernel probes",
                &["namespace", "pod", "container"],
            ),
            pleg_mode: c.gauge_vec(
                "evlet_pleg_mode",
                "1 for the active PLEG mode",
                &["mode"],
            ),
            manifest_errors: c.counter(
                "evlet_manifest_errors_total",
                "Static pod manifests rejected",
            ),
            pod_worker_duration: c.histogram_vec(
                "kubelet_pod_worker_duration_seconds",
                &alpha(
                    "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
                ),
                DEF_BUCKETS,
                &["operation_type"],
            ),
            pod_start_duration: c.histogram(
                "kubelet_pod_start_duration_seconds",
                &alpha(
                    "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
                ),
                POD_START_BUCKETS,
            ),
            startup: startup::StartupTracker::new(c.histogram(
                "kubelet_pod_start_sli_duration_seconds",
                &alpha(
                    "Duration in seconds to start a pod, excluding time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch",
                ),
                POD_START_BUCKETS,
            )),
            runtime: runtime::RuntimeOperations {
                total: c.counter_vec(
                    "kubelet_runtime_operations_total",
                    &alpha("Cumulative number of runtime operations by operation type."),
                    &["operation_type"],
                ),
                errors: c.counter_vec(
                    "kubelet_runtime_operations_errors_total",
                    &alpha("Cumulative number of runtime operation errors by operation type."),
                    &["operation_type"],
                ),
                duration: c.histogram_vec(
                    "kubelet_runtime_operations_duration_seconds",
                    &alpha("Duration in seconds of runtime operations. Broken down by operation type."),
                    &rt,
                    &["operation_type"],
                ),
            },
            started_pods: c.counter(
                "kubelet_started_pods_total",
                &alpha("Cumulative number of pods started"),
            ),
            started_pods_errors: c.counter(
                "kubelet_started_pods_errors_total",
                &alpha("Cumulative number of errors when starting pods"),
            ),
            started_containers: c.counter_vec(
                "kubelet_started_containers_total",
                &alpha("Cumulative number of containers started"),
                &["container_type"],
            ),
            started_containers_errors: c.counter_vec(
                "kubelet_started_containers_errors_total",
                &alpha("Cumulative number of errors when starting containers"),
                &["container_type", "code"],
            ),
            node_name: c.gauge_vec(
                "kubelet_node_name",
                &alpha("The node's name. The count is always 1."),
                &["node"],
            ),
            evictions: c.counter_vec(
                "kubelet_evictions",
                &alpha("Cumulative number of pod evictions by eviction signal"),
                &["eviction_signal"],
            ),
            image_garbage_collected: c.counter_vec(
                "kubelet_image_garbage_collected_total",
                &alpha(
                    "Total number of images garbage collected by the kubelet, whether through disk usage or image age.",
                ),
                &["reason"],
            ),
            rest_client: rest::RestClientMetrics {
                requests: c.add(Kind::Counter, rest_client.requests),
                duration: c.add_with_buckets(Kind::Histogram, rest_client.duration, REST_BUCKETS),
            },
            certificates: certificates.register(&mut c),
            volume_stats: VolumeStatsGauges::new(&mut c),
            process: process::ProcessMetrics::new(&mut c),
            probes: ProbeMetrics::new(),
            catalog: c,
        }
    }

    /// `/metrics` in the text format, `process_*` read just now.
    pub fn encode(&self) -> String {
        self.process.refresh();
        self.certificates.refresh(std::time::SystemTime::now());
        self.catalog.encode()
    }

    /// Every sample name `/metrics` serves, with or without samples yet.
    pub fn exposed_names(&self) -> Vec<String> {
        self.catalog.exposed_names()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_registers_once_under_a_unique_name() {
        let m = Metrics::new();
        let mut names: Vec<_> = m.catalog.described().iter().map(|d| &d.name).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate metric names");
        // Every family registered: the registry holds as many as described.
        let gathered = m.catalog.registry.gather().len();
        assert!(gathered <= n);
        assert!(n > 40, "{n} metrics");
    }

    #[test]
    fn encodes_upstream_names_without_added_suffixes() {
        let m = Metrics::new();
        m.pleg_discard_events.inc();
        m.runtime
            .observe("RunPodSandbox", std::time::Duration::from_millis(3), None);
        let text = m.encode();
        assert!(text.contains("\nkubelet_pleg_discard_events 1\n"), "{text}");
        assert!(text.contains("# TYPE kubelet_pleg_discard_events counter"));
        assert!(
            text.contains("kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"} 1")
        );
        assert!(text.contains("# HELP kubelet_pleg_discard_events [ALPHA] "));
        assert!(text.contains("process_resident_memory_bytes "));
    }

    #[test]
    fn certificate_ttls_are_infinite_until_a_certificate_is_in_use() {
        let m = Metrics::new();
        let text = m.encode();
        // The prometheus crate writes +Inf as `inf`, which Prometheus' parser reads.
        assert!(
            text.contains("\nkubelet_certificate_manager_client_ttl_seconds inf\n"),
            "{text}"
        );
        let now = std::time::SystemTime::now();
        m.certificates
            .set_server_expiry(Some(now + std::time::Duration::from_secs(3600)));
        m.certificates.refresh(now);
        assert_eq!(m.certificates.server_ttl.get(), 3600.0);
        m.certificates
            .set_server_expiry(Some(now - std::time::Duration::from_secs(5)));
        m.certificates.refresh(now);
        assert_eq!(m.certificates.server_ttl.get(), -5.0);
        assert!(text.contains("# TYPE kubelet_server_expiration_renew_errors counter"));
    }

    #[test]
    fn runtime_buckets_are_upstreams_exponential_ones() {
        let b = runtime_buckets();
        assert_eq!(b.len(), 14);
        assert!((b[1] - 0.0125).abs() < 1e-12);
        assert!((b[13] - 745.0580596923828).abs() < 1e-9);
    }
}
