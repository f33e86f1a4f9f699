//! Agent configuration: a `KubeletConfiguration`-style YAML file (upstream field
//! names where they exist) overridden by familiar command-line flags. The
//! kubelet API's endpoints are [`serving`]'s.

pub mod serving;

pub use serving::{
    AnonymousAuthentication, Authentication, Authorization, AuthorizationConfig, HttpEndpoints,
    SecureServing, ServingFlags, WebhookAuthentication, WebhookAuthorization, X509Authentication,
};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// How the PLEG learns about changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlegMode {
    /// Kernel tracepoints via eBPF as hints, a slow safety relist (default).
    Ebpf,
    /// Upstream's relist every second.
    Generic,
    /// CRI `GetContainerEvents` as hints (containerd ≥ 1.7), relist every second.
    CriEvents,
}

impl PlegMode {
    /// The name used in flags, metrics and health.
    pub fn as_str(self) -> &'static str {
        match self {
            PlegMode::Ebpf => "ebpf",
            PlegMode::Generic => "generic",
            PlegMode::CriEvents => "cri-events",
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's name.
    pub node_name: String,
    /// State directory: pod volumes, logs (`logs/pods`), checkpoints.
    pub root_dir: PathBuf,
    /// Static pod manifest directory or file.
    pub pod_manifest_path: Option<PathBuf>,
    /// Static pod manifest URL.
    pub manifest_url: Option<String>,
    /// CRI endpoint (`unix:///run/containerd/containerd.sock`).
    pub runtime_endpoint: String,
    /// Root of the agent's cgroups; pods go under `<cgroupRoot>/kubepods`.
    pub cgroup_root: String,
    /// `cgroupDriver`: how cgroups are named and made (cgroupfs or systemd;
    /// the runtime must be configured alike, containerd's `SystemdCgroup`).
    pub cgroup_driver: crate::cm::Driver,
    /// The read-only port, the healthz port and the node-local socket, and
    /// the limits of every endpoint.
    pub http: HttpEndpoints,
    /// Manifest directory rescan period (upstream `fileCheckFrequency`, 20 s).
    pub file_check_frequency: Duration,
    /// Manifest URL poll period (upstream `httpCheckFrequency`, 20 s).
    pub http_check_frequency: Duration,
    /// Period of a pod's periodic sync (upstream `syncFrequency`, 1 min;
    /// each sync is due after 1–1.5 times this, as upstream).
    pub sync_frequency: Duration,
    /// The node's IP (`status.hostIP`).
    pub node_ip: Option<String>,
    /// PLEG mode.
    pub pleg_mode: PlegMode,
    /// Period of the generic relist and of cri-events' relist (1 s).
    pub relist_period: Duration,
    /// Period of the eBPF mode's safety relist.
    pub ebpf_relist_period: Duration,
    /// Size of the eBPF ring buffer in bytes (a power of two ≥ the page size).
    pub ebpf_ring_bytes: u32,
    /// Log format.
    pub log_format: LogFormat,
    /// The API server (`--kubeconfig`); None: standalone.
    pub api: Option<crate::api::ApiClient>,
    /// `maxPods`: admission limit and the node's `pods` capacity.
    pub max_pods: u32,
    /// `--register-with-taints`.
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// What the node gives every pod: DNS, seccomp default, allowed sysctls.
    pub pods: PodSettings,
    /// The eviction manager's thresholds and periods.
    pub eviction: crate::eviction::Settings,
    /// The image garbage collector's thresholds and ages.
    pub image_gc: crate::image_gc::Policy,
    /// `--pod-infra-container-image`: an image the image GC never removes.
    pub pod_infra_container_image: Option<String>,
    /// How many dead containers are kept (`--maximum-dead-containers*`,
    /// `--minimum-container-ttl-duration`).
    pub container_gc: crate::container_gc::Policy,
    /// `kubeReserved`, `systemReserved`, `enforceNodeAllocatable`.
    pub reservations: crate::cm::allocatable::Reservations,
    /// `podPidsLimit` (≤ 0: none).
    pub pod_pids_limit: i64,
    /// Where the pods' cgroup tree is written; None: the host's hierarchies
    /// (tests over the in-process fake runtime point it at a directory).
    pub cgroup_layout: Option<crate::cm::Layout>,
    /// `singleProcessOOMKill`: None is upstream's default (on pure cgroup v2
    /// an OOM kill takes the container's every process, through
    /// `memory.oom.group`; on v1 only the process the kernel chose).
    pub single_process_oom_kill: Option<bool>,
    /// `--node-labels`: labels the node registers with, beside its defaults.
    pub node_labels: std::collections::BTreeMap<String, String>,
    /// The secured kubelet API (`port`, TLS, authentication, authorization);
    /// None: not served.
    pub secure: Option<SecureServing>,
}

/// Pod starts (sandbox and first containers) in flight at once by default;
/// chosen by `cargo xtask bench --suite pleg` at 100 and 1000 pods (ARCHITECTURE.md).
pub const DEFAULT_PARALLEL_POD_STARTS: usize = 8;

/// The node's settings for the pods it runs (KubeletConfiguration fields of the
/// same names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSettings {
    /// `clusterDNS`: the cluster DNS service's IPs (ClusterFirst pods use them).
    pub cluster_dns: Vec<String>,
    /// `clusterDomain` (no default upstream).
    pub cluster_domain: String,
    /// `resolvConf`: the node's resolver file (`/etc/resolv.conf`); None when
    /// set to "" (no host resolver config, as upstream).
    pub resolv_conf: Option<PathBuf>,
    /// `seccompDefault`: containers without a profile run RuntimeDefault.
    pub seccomp_default: bool,
    /// `allowedUnsafeSysctls`: sysctls (or `prefix*` patterns) allowed beyond the safe set.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// `serializeImagePulls` / `maxParallelImagePulls`: pulls at once (1: serialized).
    pub parallel_image_pulls: usize,
    /// `--max-parallel-pod-starts` (evlet's own): pods whose sandbox is being
    /// created and first containers started at once; the rest wait their turn
    /// before their runtime deadlines start.
    pub parallel_pod_starts: usize,
    /// `podLogsDir`: where containers' logs go (None: `<root-dir>/logs/pods`;
    /// the binary's default is upstream's `/var/log/pods`).
    pub pod_logs_dir: Option<PathBuf>,
    /// Where `<pod>_<namespace>_<container>-<id>.log` links to the logs go
    /// for log shippers (upstream's `/var/log/containers`); None: none.
    pub container_log_links: Option<PathBuf>,
    /// `containerLogMaxSize`: a log is rotated past this many bytes (10Mi).
    pub container_log_max_size: u64,
    /// `containerLogMaxFiles`: the log files kept per container, current included (5).
    pub container_log_max_files: usize,
    /// `containerLogMonitorInterval`: how often logs are checked (10 s).
    pub container_log_monitor_interval: Duration,
}

impl Default for PodSettings {
    fn default() -> Self {
        Self {
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: Some(PathBuf::from("/etc/resolv.conf")),
            seccomp_default: false,
            allowed_unsafe_sysctls: Vec::new(),
            parallel_image_pulls: 1,
            parallel_pod_starts: DEFAULT_PARALLEL_POD_STARTS,
            pod_logs_dir: None,
            container_log_links: None,
            container_log_max_size: 10 << 20,
            container_log_max_files: 5,
            container_log_monitor_interval: Duration::from_secs(10),
        }
    }
}

/// Checks the pod settings as upstream validates its configuration.
///
/// # Errors
/// Upstream's message naming the option.
pub fn check_pod_settings(pods: &PodSettings) -> Result<(), String> {
    if pods.parallel_pod_starts == 0 {
        return Err("invalid configuration: --max-parallel-pod-starts must be at least 1".into());
    }
    for ip in &pods.cluster_dns {
        if ip.parse::<std::net::IpAddr>().is_err() {
            return Err(format!(
                "invalid configuration: clusterDNS (--cluster-dns) {ip} is not a valid IP address"
            ));
        }
    }
    if !pods.cluster_domain.is_empty()
        && !pods.cluster_domain.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
    {
        return Err(format!(
            "invalid configuration: clusterDomain (--cluster-domain) {:?} is not a valid DNS subdomain",
            pods.cluster_domain
        ));
    }
    Ok(())
}

/// Upstream's default `maxPods`.
pub const MAX_PODS: u32 = 110;

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not a valid KubeletConfiguration.
    #[error("config file {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (names the field).
        message: String,
    },
}

/// The subset of `kubelet.config.k8s.io/v1beta1` `KubeletConfiguration` evlet reads,
/// plus its own `pleg*` fields.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    /// Must be `kubelet.config.k8s.io/v1beta1` if set.
    pub api_version: Option<String>,
    /// Must be `KubeletConfiguration` if set.
    pub kind: Option<String>,
    /// `--pod-manifest-path`.
    pub static_pod_path: Option<PathBuf>,
    /// `--manifest-url`.
    #[serde(rename = "staticPodURL")]
    pub static_pod_url: Option<String>,
    /// Go duration, e.g. `20s`.
    pub file_check_frequency: Option<String>,
    /// Go duration.
    pub http_check_frequency: Option<String>,
    /// Go duration of the periodic pod sync.
    pub sync_frequency: Option<String>,
    /// `--container-runtime-endpoint`.
    pub container_runtime_endpoint: Option<String>,
    /// `--cgroup-root`.
    pub cgroup_root: Option<String>,
    /// `cgroupDriver`: `cgroupfs` or `systemd`.
    pub cgroup_driver: Option<String>,
    /// The IP both ports bind (`--address`; default 0.0.0.0).
    pub address: Option<String>,
    /// The read-only port (`--read-only-port`; 0, the default: off).
    pub read_only_port: Option<u16>,
    /// Upstream's healthz server's port (`--healthz-port`; 10248, 0: off).
    pub healthz_port: Option<u16>,
    /// Its IP (`--healthz-bind-address`; 127.0.0.1).
    pub healthz_bind_address: Option<String>,
    /// evlet: `ebpf`, `generic`, `cri-events`.
    pub pleg_mode: Option<PlegMode>,
    /// evlet: Go duration of the eBPF mode's safety relist.
    pub pleg_safety_relist_period: Option<String>,
    /// `--max-pods`.
    pub max_pods: Option<u32>,
    /// `--register-with-taints`.
    pub register_with_taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
    /// Cluster DNS service IPs.
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    /// The cluster's DNS domain.
    pub cluster_domain: Option<String>,
    /// The node's resolver file ("" for none).
    pub resolv_conf: Option<String>,
    /// RuntimeDefault seccomp for containers without a profile.
    pub seccomp_default: Option<bool>,
    /// Unsafe sysctls pods may set.
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    /// One image pull at a time.
    pub serialize_image_pulls: Option<bool>,
    /// Image pulls at once when not serialized.
    pub max_parallel_image_pulls: Option<i32>,
    /// Where containers' logs go (`/var/log/pods`).
    pub pod_logs_dir: Option<PathBuf>,
    /// A log is rotated past this size (a quantity, `10Mi`).
    pub container_log_max_size: Option<String>,
    /// Log files kept per container (5, at least 2).
    pub container_log_max_files: Option<i64>,
    /// How often logs are checked for rotation (`10s`).
    pub container_log_monitor_interval: Option<String>,
    /// The secured port (10250; 0: off).
    pub port: Option<u16>,
    /// The serving certificate.
    pub tls_cert_file: Option<PathBuf>,
    /// The serving key.
    pub tls_private_key_file: Option<PathBuf>,
    /// Rotate the client certificate before it expires
    /// (`--rotate-certificates`; upstream's default false, kubeadm sets it).
    pub rotate_certificates: Option<bool>,
    /// The secured port's certificate from a `kubernetes.io/kubelet-serving`
    /// CSR, rotated (default false).
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: Option<bool>,
    /// How clients of the secured port authenticate.
    #[serde(default)]
    pub authentication: Authentication,
    /// How their requests are authorized.
    #[serde(default)]
    pub authorization: AuthorizationConfig,
    /// Hard eviction thresholds (`memory.available: 100Mi`).
    pub eviction_hard: Option<BTreeMap<String, String>>,
    /// Soft eviction thresholds.
    pub eviction_soft: Option<BTreeMap<String, String>>,
    /// The soft thresholds' grace periods (Go durations).
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    /// The least an eviction reclaims beyond a threshold.
    pub eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    /// How long a pressure condition outlives its threshold (Go duration).
    pub eviction_pressure_transition_period: Option<String>,
    /// The grace period of a pod evicted for a soft threshold.
    pub eviction_max_pod_grace_period: Option<i64>,
    /// Unnamed signals keep their default thresholds.
    pub merge_default_eviction_settings: Option<bool>,
    /// Kernel memory notifications wake the eviction manager (evlet: on).
    pub kernel_memcg_notification: Option<bool>,
    /// Image filesystem usage (percent) that starts image GC (85).
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: Option<i32>,
    /// The usage image GC frees down to (80).
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: Option<i32>,
    /// An image younger than this is never removed (Go duration, `2m`).
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<String>,
    /// An image unused for longer is removed (Go duration; `0s`: never).
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: Option<String>,
    /// Resources reserved for Kubernetes daemons (`cpu`, `memory`,
    /// `ephemeral-storage`, `pid`).
    pub kube_reserved: Option<BTreeMap<String, String>>,
    /// Resources reserved for the system.
    pub system_reserved: Option<BTreeMap<String, String>>,
    /// `pods` (default), `none`; `kube-reserved`/`system-reserved` are refused.
    pub enforce_node_allocatable: Option<Vec<String>>,
    /// Each pod's process limit (-1: none).
    pub pod_pids_limit: Option<i64>,
    /// Must be true (evlet always makes the QoS tiers).
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: Option<bool>,
    /// Only the process the OOM killer chose dies, never its container's
    /// others (default false on cgroup v2; v1 cannot kill a group).
    #[serde(rename = "singleProcessOOMKill")]
    pub single_process_oom_kill: Option<bool>,
}

const KNOWN: &[&str] = &[
    "apiVersion",
    "kind",
    "staticPodPath",
    "staticPodURL",
    "fileCheckFrequency",
    "httpCheckFrequency",
    "syncFrequency",
    "cgroupDriver",
    "containerRuntimeEndpoint",
    "cgroupRoot",
    "address",
    "readOnlyPort",
    "healthzPort",
    "healthzBindAddress",
    "plegMode",
    "plegSafetyRelistPeriod",
    "maxPods",
    "registerWithTaints",
    "clusterDNS",
    "clusterDomain",
    "resolvConf",
    "seccompDefault",
    "allowedUnsafeSysctls",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "podLogsDir",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "containerLogMonitorInterval",
    "port",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "rotateCertificates",
    "serverTLSBootstrap",
    "authentication",
    "authorization",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMinimumReclaim",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "mergeDefaultEvictionSettings",
    "kernelMemcgNotification",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "kubeReserved",
    "systemReserved",
    "enforceNodeAllocatable",
    "podPidsLimit",
    "cgroupsPerQOS",
    "singleProcessOOMKill",
];

/// A taint of `--register-with-taints` that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("taint {taint:?}: {problem}")]
pub struct InvalidTaint {
    /// The taint as written.
    pub taint: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// Label namespaces and labels of `kubernetes.io`/`k8s.io` a node may set
/// on itself (upstream's `kubeletapis.KubeletLabels` and namespaces).
const NODE_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];
const NODE_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// Parses `--node-labels` (`key=value,key=value`) and refuses what upstream
/// refuses: labels in the `kubernetes.io` or `k8s.io` namespaces other than
/// the well-known ones and those under `kubelet.kubernetes.io` and
/// `node.kubernetes.io` (a node may not give itself, say, a role).
///
/// # Errors
/// Names the malformed pair, or lists the forbidden labels as upstream does.
pub fn parse_node_labels(s: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut labels = std::collections::BTreeMap::new();
    let mut forbidden = Vec::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(format!("invalid label {pair:?}: want key=value"));
        };
        if let Err(e) = crate::validation::label_key(key) {
            return Err(format!("invalid label key {key:?}: {e}"));
        }
        if let Err(e) = crate::validation::label_value(value) {
            return Err(format!("invalid label value {value:?} of {key:?}: {e}"));
        }
        let namespace = key.split_once('/').map_or("", |(ns, _)| ns);
        let restricted =
            |suffix: &str| namespace == suffix || namespace.ends_with(&format!(".{suffix}"));
        let allowed = NODE_LABELS.contains(&key)
            || NODE_LABEL_NAMESPACES
                .iter()
                .any(|ns| namespace == *ns || namespace.ends_with(&format!(".{ns}")));
        if (restricted("kubernetes.io") || restricted("k8s.io")) && !allowed {
            forbidden.push(key.to_owned());
        }
        labels.insert(key.to_owned(), value.to_owned());
    }
    if !forbidden.is_empty() {
        return Err(format!(
            "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: {forbidden:?}\n\
             --node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix \
             (kubelet.kubernetes.io, node.kubernetes.io) or be in the specifically allowed set \
             ({})",
            NODE_LABELS.join(", ")
        ));
    }
    Ok(labels)
}

/// Parses `--register-with-taints` (`key=value:Effect,key:Effect`).
///
/// # Errors
/// [`InvalidTaint`] naming the bad taint.
pub fn parse_taints(s: &str) -> Result<Vec<k8s_openapi::api::core::v1::Taint>, InvalidTaint> {
    s.split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            let t = t.trim();
            let invalid = |problem| InvalidTaint {
                taint: t.to_owned(),
                problem,
            };
            let (kv, effect) = t
                .rsplit_once(':')
                .ok_or_else(|| invalid("expected key[=value]:Effect"))?;
            if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                return Err(invalid(
                    "effect must be NoSchedule, PreferNoSchedule or NoExecute",
                ));
            }
            let (key, value) = match kv.split_once('=') {
                Some((k, v)) => (k, Some(v.to_owned())),
                None => (kv, None),
            };
            if key.is_empty() {
                return Err(invalid("empty key"));
            }
            Ok(k8s_openapi::api::core::v1::Taint {
                key: key.to_owned(),
                value,
                effect: effect.to_owned(),
                time_added: None,
            })
        })
        .collect()
}

/// A duration that is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?} (expected e.g. \"20s\", \"1m30s\", \"500ms\")")]
pub struct InvalidDuration(pub String);

/// Parses a Go duration (`1h2m3s`, `500ms`, `20s`).
///
/// # Errors
/// [`InvalidDuration`] naming the bad text.
pub fn parse_duration(s: &str) -> Result<Duration, InvalidDuration> {
    let bad = || InvalidDuration(s.to_owned());
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(bad()),
        };
        // A value too large for a Duration is an error, not a panic.
        total = Duration::try_from_secs_f64(value * secs)
            .ok()
            .and_then(|d| total.checked_add(d))
            .ok_or_else(bad)?;
        rest = &rest[unit_end..];
    }
    Ok(total)
}

impl KubeletConfiguration {
    /// Reads and checks a config file; unknown fields are logged, not fatal.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file and the field.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Upstream's defaulting (`pkg/kubelet/apis/config/v1beta1/defaults.go`)
    /// gives a zero duration and an empty string their defaults, and kubeadm
    /// writes its config file that way (`syncFrequency: 0s`,
    /// `containerRuntimeEndpoint: ""`): such fields are read as unset.
    fn unset_zero_values(&mut self) {
        let zero = |v: &mut Option<String>| {
            if v.as_deref()
                .is_some_and(|s| parse_duration(s).is_ok_and(|d| d.is_zero()))
            {
                *v = None;
            }
        };
        zero(&mut self.sync_frequency);
        zero(&mut self.file_check_frequency);
        zero(&mut self.http_check_frequency);
        zero(&mut self.image_minimum_gc_age);
        zero(&mut self.eviction_pressure_transition_period);
        zero(&mut self.authentication.webhook.cache_ttl);
        zero(&mut self.authorization.webhook.cache_authorized_ttl);
        zero(&mut self.authorization.webhook.cache_unauthorized_ttl);
        for v in [
            &mut self.container_runtime_endpoint,
            &mut self.cgroup_driver,
            &mut self.address,
            &mut self.healthz_bind_address,
            &mut self.authorization.mode,
        ] {
            if v.as_deref() == Some("") {
                *v = None;
            }
        }
    }

    /// Checks the text of a config file read from `path` (named in errors).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the file and the field.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.into(),
            message,
        };
        let value: serde_yaml::Value =
            serde_yaml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        if let Some(map) = value.as_mapping() {
            for key in map.keys().filter_map(|k| k.as_str()) {
                if !KNOWN.contains(&key) {
                    tracing::warn!(file = %path.display(), field = key, "ignoring KubeletConfiguration field evlet does not support");
                }
            }
        }
        let mut cfg: Self = serde_yaml::from_value(value).map_err(|e| invalid(e.to_string()))?;
        cfg.unset_zero_values();
        if let Some(v) = cfg
            .api_version
            .as_deref()
            .filter(|v| *v != "kubelet.config.k8s.io/v1beta1")
        {
            return Err(invalid(format!(
                "apiVersion: Unsupported value {v:?}: expected \"kubelet.config.k8s.io/v1beta1\""
            )));
        }
        if let Some(k) = cfg.kind.as_deref().filter(|k| *k != "KubeletConfiguration") {
            return Err(invalid(format!(
                "kind: Unsupported value {k:?}: expected \"KubeletConfiguration\""
            )));
        }
        for (field, value) in [
            ("fileCheckFrequency", &cfg.file_check_frequency),
            ("httpCheckFrequency", &cfg.http_check_frequency),
            ("syncFrequency", &cfg.sync_frequency),
            ("plegSafetyRelistPeriod", &cfg.pleg_safety_relist_period),
        ] {
            if let Some(v) = value {
                let d = parse_duration(v).map_err(|e| invalid(format!("{field}: {e}")))?;
                // A zero period would busy-loop the loop it drives.
                if d < Duration::from_millis(100) {
                    return Err(invalid(format!(
                        "{field}: Invalid value {v:?}: must be at least 100ms"
                    )));
                }
            }
        }
        if let Some(n) = cfg.max_parallel_image_pulls {
            if n < 1 {
                return Err(invalid(format!(
                    "invalid configuration: maxParallelImagePulls {n} must be a positive number"
                )));
            }
            if n > 1 && cfg.serialize_image_pulls != Some(false) {
                return Err(invalid(
                    "invalid configuration: maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls (--serialize-image-pulls) is set to false".into(),
                ));
            }
        }
        if let Some(q) = &cfg.container_log_max_size
            && crate::quantity::parse(q).is_err()
        {
            return Err(invalid(format!(
                "containerLogMaxSize: Invalid value {q:?}: must be a quantity"
            )));
        }
        if let Some(n) = cfg.container_log_max_files
            && n < 2
        {
            return Err(invalid(format!(
                "invalid configuration: containerLogMaxFiles ({n}) must be 2 or greater"
            )));
        }
        if let Some(v) = &cfg.container_log_monitor_interval {
            let d = parse_duration(v)
                .map_err(|e| invalid(format!("containerLogMonitorInterval: {e}")))?;
            if d < Duration::from_secs(3) {
                return Err(invalid(format!(
                    "invalid configuration: containerLogMonitorInterval {v} must be a positive time duration greater than or equal to 3s"
                )));
            }
        }
        check_pod_settings(&cfg.pod_settings()).map_err(invalid)?;
        cfg.eviction_settings().map_err(invalid)?;
        cfg.image_gc_policy().map_err(invalid)?;
        cfg.reservations().map_err(invalid)?;
        if cfg.cgroups_per_qos == Some(false) {
            return Err(invalid(
                "cgroupsPerQOS: Unsupported value false: evlet always makes the pods' QoS cgroups"
                    .into(),
            ));
        }
        Ok(cfg)
    }

    /// The node allocatable reservations this file asks for (none reserved,
    /// `pods` enforced by default, as upstream).
    ///
    /// # Errors
    /// Upstream's messages naming the field.
    pub fn reservations(&self) -> Result<crate::cm::allocatable::Reservations, String> {
        use crate::cm::allocatable::{parse_enforce, parse_reserved};
        Ok(crate::cm::allocatable::Reservations {
            kube: parse_reserved(
                "kubeReserved",
                &self.kube_reserved.clone().unwrap_or_default(),
            )?,
            system: parse_reserved(
                "systemReserved",
                &self.system_reserved.clone().unwrap_or_default(),
            )?,
            enforce_pods: parse_enforce(
                self.enforce_node_allocatable
                    .as_deref()
                    .unwrap_or(&["pods".to_owned()]),
            )?,
        })
    }

    /// The image GC policy this file asks for, upstream's defaults for the rest.
    ///
    /// # Errors
    /// Upstream's message naming the field.
    pub fn image_gc_policy(&self) -> Result<crate::image_gc::Policy, String> {
        let d = crate::image_gc::Policy::default();
        let age = |field: &str, v: &Option<String>, default| {
            v.as_deref()
                .map(|t| parse_duration(t).map_err(|e| format!("{field}: {e}")))
                .transpose()
                .map(|d| d.unwrap_or(default))
        };
        let policy = crate::image_gc::Policy {
            high_threshold_percent: self
                .image_gc_high_threshold_percent
                .unwrap_or(d.high_threshold_percent),
            low_threshold_percent: self
                .image_gc_low_threshold_percent
                .unwrap_or(d.low_threshold_percent),
            min_age: age("imageMinimumGCAge", &self.image_minimum_gc_age, d.min_age)?,
            max_age: age("imageMaximumGCAge", &self.image_maximum_gc_age, d.max_age)?,
            period: d.period,
        };
        policy.validate()?;
        Ok(policy)
    }

    /// The eviction settings this file asks for, upstream's defaults for the rest.
    ///
    /// # Errors
    /// A message naming the field and the signal.
    pub fn eviction_settings(&self) -> Result<crate::eviction::Settings, String> {
        let mut soft_grace = BTreeMap::new();
        for (signal, text) in self.eviction_soft_grace_period.iter().flatten() {
            let d = parse_duration(text)
                .map_err(|e| format!("evictionSoftGracePeriod[{signal}]: {e}"))?;
            soft_grace.insert(signal.clone(), d);
        }
        let pressure_transition = self
            .eviction_pressure_transition_period
            .as_deref()
            .map(|t| {
                parse_duration(t).map_err(|e| format!("evictionPressureTransitionPeriod: {e}"))
            })
            .transpose()?;
        crate::eviction::thresholds::parse(&crate::eviction::thresholds::Config {
            hard: self.eviction_hard.clone(),
            soft: self.eviction_soft.clone().unwrap_or_default(),
            soft_grace,
            min_reclaim: self.eviction_minimum_reclaim.clone().unwrap_or_default(),
            pressure_transition,
            max_pod_grace: self.eviction_max_pod_grace_period,
            merge_defaults: self.merge_default_eviction_settings.unwrap_or(false),
            kernel_notification: self.kernel_memcg_notification,
        })
        .map_err(|e| e.to_string())
    }

    /// The pod settings this file asks for, upstream's defaults for the rest.
    pub fn pod_settings(&self) -> PodSettings {
        let d = PodSettings::default();
        let serialize = self
            .serialize_image_pulls
            .unwrap_or(self.max_parallel_image_pulls.is_none_or(|n| n < 2));
        PodSettings {
            cluster_dns: self.cluster_dns.clone().unwrap_or_default(),
            cluster_domain: self
                .cluster_domain
                .clone()
                .unwrap_or_default()
                .trim_end_matches('.')
                .to_owned(),
            resolv_conf: match self.resolv_conf.as_deref() {
                None => d.resolv_conf,
                Some("") => None,
                Some(p) => Some(PathBuf::from(p)),
            },
            pod_logs_dir: Some(
                self.pod_logs_dir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("/var/log/pods")),
            ),
            container_log_links: Some(PathBuf::from("/var/log/containers")),
            container_log_max_size: self
                .container_log_max_size
                .as_deref()
                .and_then(|q| crate::quantity::parse(q).ok())
                .and_then(|b| u64::try_from(b).ok())
                .unwrap_or(d.container_log_max_size),
            container_log_max_files: self
                .container_log_max_files
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(d.container_log_max_files),
            container_log_monitor_interval: self
                .container_log_monitor_interval
                .as_deref()
                .and_then(|v| parse_duration(v).ok())
                .unwrap_or(d.container_log_monitor_interval),
            seccomp_default: self.seccomp_default.unwrap_or(false),
            allowed_unsafe_sysctls: self.allowed_unsafe_sysctls.clone().unwrap_or_default(),
            parallel_image_pulls: if serialize {
                1
            } else {
                self.max_parallel_image_pulls
                    .and_then(|n| usize::try_from(n).ok())
                    .unwrap_or(usize::MAX >> 1)
            },
            parallel_pod_starts: d.parallel_pod_starts,
        }
    }
}

/// Upstream kubelet flags evlet does not implement and that change nothing
/// it would do differently: accepted, with one warning line each (name,
/// takes a value, why it is harmless).
const HARMLESS_FLAGS: &[(&str, bool, &str)] = &[
    ("v", true, "log verbosity is set with RUST_LOG"),
    ("vmodule", true, "log verbosity is set with RUST_LOG"),
    ("log-flush-frequency", true, "logs are not buffered"),
    ("logtostderr", true, "evlet logs to stderr"),
    (
        "register-node",
        true,
        "with --kubeconfig evlet always registers its node",
    ),
    (
        "fail-swap-on",
        true,
        "evlet does not refuse to start with swap on",
    ),
    (
        "cloud-provider",
        true,
        "only \"\" and \"external\" exist upstream; evlet sets no cloud fields",
    ),
    (
        "image-service-endpoint",
        true,
        "images are served by the runtime endpoint",
    ),
    (
        "runtime-cgroups",
        true,
        "the runtime's cgroup is the runtime's own business",
    ),
    (
        "kubelet-cgroups",
        true,
        "evlet runs in the cgroup it was started in",
    ),
    (
        "experimental-mounter-path",
        true,
        "deprecated upstream; mounts are made directly",
    ),
    (
        "register-schedulable",
        true,
        "deprecated upstream; use --register-with-taints",
    ),
];

/// Upstream kubelet flags that, ignored, would make evlet less safe or run
/// pods differently than asked: refused, with the reason.
const REFUSED_FLAGS: &[(&str, &str)] = &[(
    "feature-gates",
    "evlet has no feature gates; each feature is on or refused",
)];

/// Parses upstream's map flags: `a<1,b<2` (`sep` `<`: the eviction
/// thresholds) or `a=1,b=2`.
///
/// # Errors
/// The pair that has no separator or an empty key.
pub fn parse_pairs(s: &str, sep: char) -> Result<BTreeMap<String, String>, String> {
    let mut map = BTreeMap::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once(sep)
            .filter(|(k, _)| !k.trim().is_empty())
            .ok_or_else(|| format!("malformed pair {pair:?}, expected \"key{sep}value\""))?;
        map.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(map)
}

/// Splits the command line into what evlet parses and one warning per
/// harmless upstream flag it drops.
///
/// # Errors
/// A refused upstream flag, with the reason.
pub fn compat_args(args: Vec<String>) -> Result<(Vec<String>, Vec<String>), String> {
    let mut kept = Vec::with_capacity(args.len());
    let mut warnings = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| {
            arg.strip_prefix('-')
                .filter(|f| f.starts_with("v=") || *f == "v")
        }) else {
            kept.push(arg);
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (flag, None),
        };
        if let Some((_, why)) = REFUSED_FLAGS.iter().find(|(n, _)| *n == name) {
            return Err(format!("flag --{name} is refused: {why}"));
        }
        if let Some((_, takes_value, why)) = HARMLESS_FLAGS.iter().find(|(n, _, _)| *n == name) {
            if *takes_value && inline.is_none() {
                it.next();
            }
            warnings.push(format!("flag --{name} is accepted and ignored: {why}"));
            continue;
        }
        kept.push(arg);
    }
    Ok((kept, warnings))
}

/// The node's IP when `--node-ip` is not given, as upstream looks for it: the
/// hostname if it is an IP, then the addresses the node's name resolves to,
/// then the address of the interface of the default route. Loopback,
/// link-local, multicast and unspecified addresses are never chosen.
///
/// # Errors
/// Upstream's `can't get ip address of node <name>` when nothing qualifies.
pub fn detect_node_ip(node_name: &str) -> Result<String, String> {
    use std::net::{IpAddr, ToSocketAddrs as _, UdpSocket};
    let usable = |ip: &IpAddr| {
        !ip.is_loopback()
            && !ip.is_unspecified()
            && !ip.is_multicast()
            && !matches!(ip, IpAddr::V4(v4) if v4.is_link_local())
            && !matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
    };
    if let Ok(ip) = node_name.parse::<IpAddr>()
        && usable(&ip)
    {
        return Ok(ip.to_string());
    }
    let resolved: Vec<IpAddr> = (node_name, 0)
        .to_socket_addrs()
        .map(|a| a.map(|s| s.ip()).collect())
        .unwrap_or_default();
    if let Some(ip) = resolved
        .iter()
        .find(|ip| ip.is_ipv4() && usable(ip))
        .or_else(|| resolved.iter().find(|ip| usable(ip)))
    {
        return Ok(ip.to_string());
    }
    // The source address the kernel picks for the default route (a UDP
    // "connect" sends nothing).
    let routed = UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.1:9").map(|()| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip());
    match routed {
        Ok(ip) if usable(&ip) => Ok(ip.to_string()),
        Ok(ip) => Err(format!(
            "can't get ip address of node {node_name}. error: the default route's address {ip} is not usable"
        )),
        Err(e) => Err(format!(
            "can't get ip address of node {node_name}. error: {e}"
        )),
    }
}

/// The node name: the override, else the hostname (lowercased, as upstream).
pub fn node_name(override_name: Option<&str>) -> String {
    if let Some(n) = override_name.filter(|n| !n.is_empty()) {
        return n.to_lowercase();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".into())
}

/// The machine's hostname (lowercase).
pub fn hostname() -> String {
    node_name(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_parse_and_bad_ones_are_named() {
        let t = parse_taints("dedicated=evlet:NoSchedule,gpu:NoExecute").expect("taints");
        assert_eq!(t.len(), 2);
        assert_eq!(
            (
                t[0].key.as_str(),
                t[0].value.as_deref(),
                t[0].effect.as_str()
            ),
            ("dedicated", Some("evlet"), "NoSchedule")
        );
        assert_eq!((t[1].key.as_str(), t[1].value.as_deref()), ("gpu", None));
        let err = parse_taints("a=b:Sometimes").expect_err("bad effect");
        assert!(err.to_string().contains("a=b:Sometimes"), "{err}");
    }

    #[test]
    fn upstream_flags_are_accepted_with_a_warning_or_refused_with_a_reason() {
        let args: Vec<String> = [
            "evlet",
            "--v=2",
            "--fail-swap-on",
            "false",
            "--root-dir",
            "/r",
            "--cloud-provider=",
        ]
        .map(String::from)
        .to_vec();
        let (kept, warnings) = compat_args(args).expect("accepted");
        assert_eq!(kept, ["evlet", "--root-dir", "/r"]);
        assert_eq!(warnings.len(), 3);
        assert!(warnings[1].starts_with("flag --fail-swap-on is accepted and ignored"));
        let err = compat_args(vec!["evlet".into(), "--feature-gates=A=true".into()])
            .expect_err("refused");
        assert!(err.starts_with("flag --feature-gates is refused"), "{err}");
    }

    #[test]
    fn tls_bootstrap_fields_are_read_by_upstreams_names() {
        let cfg = KubeletConfiguration::parse(
            "rotateCertificates: true\nserverTLSBootstrap: true\n",
            Path::new("c.yaml"),
        )
        .expect("valid");
        assert_eq!(cfg.rotate_certificates, Some(true));
        assert_eq!(cfg.server_tls_bootstrap, Some(true));
        assert!(KNOWN.contains(&"rotateCertificates") && KNOWN.contains(&"serverTLSBootstrap"));
        let none = KubeletConfiguration::default();
        assert_eq!(
            (none.rotate_certificates, none.server_tls_bootstrap),
            (None, None)
        );
    }

    #[test]
    fn image_gc_fields_become_the_policy_with_upstreams_checks() {
        let cfg = KubeletConfiguration::parse(
            "imageGCHighThresholdPercent: 90\n\
             imageGCLowThresholdPercent: 70\n\
             imageMinimumGCAge: 5m\n\
             imageMaximumGCAge: 168h\n",
            Path::new("c.yaml"),
        )
        .expect("valid");
        let p = cfg.image_gc_policy().expect("policy");
        assert_eq!(
            (p.high_threshold_percent, p.low_threshold_percent),
            (90, 70)
        );
        assert_eq!(p.min_age, Duration::from_secs(300));
        assert_eq!(p.max_age, Duration::from_secs(168 * 3600));
        let defaults = KubeletConfiguration::default()
            .image_gc_policy()
            .expect("defaults");
        assert_eq!(defaults, crate::image_gc::Policy::default());
        let err = KubeletConfiguration::parse(
            "imageGCHighThresholdPercent: 70\nimageGCLowThresholdPercent: 90\n",
            Path::new("c.yaml"),
        )
        .expect_err("low over high")
        .to_string();
        assert!(
            err.contains("imageGCLowThresholdPercent (--image-gc-low-threshold) 90 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 70"),
            "{err}"
        );
        let err = KubeletConfiguration::parse("imageMinimumGCAge: soon\n", Path::new("c.yaml"))
            .expect_err("bad duration")
            .to_string();
        assert!(err.contains("imageMinimumGCAge"), "{err}");
    }

    #[test]
    fn eviction_flags_and_fields_become_thresholds_naming_bad_ones() {
        let hard = parse_pairs("memory.available<500Mi, nodefs.available<5%", '<').expect("pairs");
        assert_eq!(hard["memory.available"], "500Mi");
        assert_eq!(hard["nodefs.available"], "5%");
        assert!(parse_pairs("memory.available=1Gi", '<').is_err());
        let cfg = KubeletConfiguration::parse(
            "evictionHard: {memory.available: 1Gi}\n\
             evictionSoft: {memory.available: 2Gi}\n\
             evictionSoftGracePeriod: {memory.available: 1m30s}\n\
             evictionPressureTransitionPeriod: 30s\n",
            Path::new("c.yaml"),
        )
        .expect("valid");
        let s = cfg.eviction_settings().expect("settings");
        assert_eq!(s.thresholds.len(), 2);
        assert_eq!(s.thresholds[1].grace, Duration::from_secs(90));
        assert_eq!(s.pressure_transition, Duration::from_secs(30));
        let err = KubeletConfiguration::parse(
            "evictionSoft: {memory.available: 2Gi}\n",
            Path::new("c.yaml"),
        )
        .expect_err("no grace period")
        .to_string();
        assert!(
            err.contains(
                "evictionSoftGracePeriod[memory.available]: grace period must be specified"
            ),
            "{err}"
        );
    }

    #[test]
    fn node_labels_parse_and_a_node_may_not_give_itself_a_role() {
        let l = parse_node_labels(
            "team=storage, node.kubernetes.io/pool=edge,topology.kubernetes.io/zone=a",
        )
        .expect("labels");
        assert_eq!(l.len(), 3);
        assert_eq!(l["node.kubernetes.io/pool"], "edge");
        let err =
            parse_node_labels("node-role.kubernetes.io/control-plane=,a=b").expect_err("refused");
        assert!(
            err.starts_with("unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [\"node-role.kubernetes.io/control-plane\"]"),
            "{err}"
        );
        assert!(parse_node_labels("sub.k8s.io/x=y").is_err());
        assert!(parse_node_labels("foo.kubelet.kubernetes.io/x=y").is_ok());
        assert!(
            parse_node_labels("novalue")
                .expect_err("pair")
                .contains("want key=value")
        );
        assert!(
            parse_node_labels("a=-bad")
                .expect_err("value")
                .contains("invalid label value")
        );
        assert!(
            parse_node_labels("Bad_Prefix/x=y")
                .expect_err("key")
                .contains("invalid label key")
        );
    }

    #[test]
    fn both_cgroup_drivers_are_read_from_the_file() {
        let ok = "kind: KubeletConfiguration\ncgroupDriver: cgroupfs\nsyncFrequency: 30s\n";
        let cfg = KubeletConfiguration::parse(ok, Path::new("c.yaml")).expect("valid");
        assert_eq!(cfg.sync_frequency.as_deref(), Some("30s"));
        assert_eq!(cfg.cgroup_driver.as_deref(), Some("cgroupfs"));
        let text = "kind: KubeletConfiguration\ncgroupDriver: systemd\n";
        let cfg = KubeletConfiguration::parse(text, Path::new("c.yaml")).expect("valid");
        assert_eq!(cfg.cgroup_driver.as_deref(), Some("systemd"));
    }

    #[test]
    fn cluster_dns_must_be_ips() {
        let text = "kind: KubeletConfiguration\nclusterDNS: [10.96.0.10, kube-dns]\n";
        let err = KubeletConfiguration::parse(text, Path::new("c.yaml")).expect_err("invalid");
        assert!(
            err.to_string()
                .contains("clusterDNS (--cluster-dns) kube-dns is not a valid IP address"),
            "{err}"
        );
        let text =
            "kind: KubeletConfiguration\nclusterDNS: [10.96.0.10]\nclusterDomain: cluster.local.\n";
        let cfg = KubeletConfiguration::parse(text, Path::new("c.yaml")).expect("valid");
        assert_eq!(cfg.pod_settings().cluster_domain, "cluster.local");
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("20").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("99999999999999999999999h").is_err());
        assert!(parse_duration("18446744073709551615s1h").is_err());
    }

    #[test]
    fn config_files_are_checked_and_name_the_field() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: /etc/pods\nfileCheckFrequency: 5s\nplegMode: generic\nauthentication: {}\n").expect("write");
        let cfg = KubeletConfiguration::load(&path).expect("valid");
        assert_eq!(cfg.static_pod_path.as_deref(), Some(Path::new("/etc/pods")));
        assert_eq!(cfg.pleg_mode, Some(PlegMode::Generic));
        std::fs::write(
            &path,
            "kind: KubeletConfiguration\nhttpCheckFrequency: soon\n",
        )
        .expect("write");
        let err = KubeletConfiguration::load(&path).expect_err("invalid");
        assert!(
            err.to_string()
                .contains("httpCheckFrequency: invalid duration \"soon\""),
            "{err}"
        );
    }
}
