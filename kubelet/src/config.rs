//! Agent configuration: a `KubeletConfiguration`-style YAML file (upstream field
//! names where they exist) overridden by familiar command-line flags.

use std::net::SocketAddr;
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
    /// Address of the local HTTP endpoint (`/healthz`, `/pods`, `/metrics`).
    pub address: SocketAddr,
    /// Manifest directory rescan period (upstream `fileCheckFrequency`, 20 s).
    pub file_check_frequency: Duration,
    /// Manifest URL poll period (upstream `httpCheckFrequency`, 20 s).
    pub http_check_frequency: Duration,
    /// Mean period of a pod's periodic sync (upstream `syncFrequency`, 1 min;
    /// each sync is due after 0.5–1.5 times this).
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
    /// HTTP bind address.
    pub address: Option<String>,
    /// HTTP port (upstream's read-only port).
    pub read_only_port: Option<u16>,
    /// evlet: `ebpf`, `generic`, `cri-events`.
    pub pleg_mode: Option<PlegMode>,
    /// evlet: Go duration of the eBPF mode's safety relist.
    pub pleg_safety_relist_period: Option<String>,
    /// `--max-pods`.
    pub max_pods: Option<u32>,
    /// `--register-with-taints`.
    pub register_with_taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
}

const KNOWN: &[&str] = &[
    "apiVersion",
    "kind",
    "staticPodPath",
    "staticPodURL",
    "fileCheckFrequency",
    "httpCheckFrequency",
    "containerRuntimeEndpoint",
    "cgroupRoot",
    "address",
    "readOnlyPort",
    "plegMode",
    "plegSafetyRelistPeriod",
    "maxPods",
    "registerWithTaints",
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
        let cfg: Self = serde_yaml::from_value(value).map_err(|e| invalid(e.to_string()))?;
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
                parse_duration(v).map_err(|e| invalid(format!("{field}: {e}")))?;
            }
        }
        Ok(cfg)
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
