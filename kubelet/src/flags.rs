//! The binary's flags, upstream kubelet's names and meanings
//! (`cmd/kubelet/app/options/options.go`) where evlet has the setting, and
//! how they and the config file make the agent's [`Config`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use evlet::config::{self, Config, KubeletConfiguration, LogFormat, PlegMode};

/// evlet: a Kubernetes node agent whose PLEG is driven by eBPF.
///
/// `evlet diag oom|pleg|pod` reads a running agent's diagnostics (see
/// `evlet diag --help`).
#[derive(Debug, Parser)]
#[command(name = "evlet", version)]
pub(crate) struct Flags {
    /// KubeletConfiguration YAML (kubelet.config.k8s.io/v1beta1); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Hard eviction thresholds (`memory.available<100Mi,nodefs.available<10%`).
    #[arg(long)]
    eviction_hard: Option<String>,
    /// Soft eviction thresholds (`memory.available<1Gi`).
    #[arg(long)]
    eviction_soft: Option<String>,
    /// Grace periods of the soft thresholds (`memory.available=1m30s`).
    #[arg(long)]
    eviction_soft_grace_period: Option<String>,
    /// Minimum reclaims (`memory.available=500Mi`).
    #[arg(long)]
    eviction_minimum_reclaim: Option<String>,
    /// How long a pressure condition outlives its thresholds (`5m0s`).
    #[arg(long)]
    eviction_pressure_transition_period: Option<String>,
    /// Grace period of pods evicted for soft thresholds, in seconds.
    #[arg(long)]
    eviction_max_pod_grace_period: Option<i64>,
    /// Image filesystem usage (percent) at which image GC starts (85).
    #[arg(long)]
    image_gc_high_threshold: Option<i32>,
    /// Image filesystem usage (percent) image GC frees down to (80).
    #[arg(long)]
    image_gc_low_threshold: Option<i32>,
    /// Minimum age of an image the image GC removes (`2m0s`).
    #[arg(long)]
    minimum_image_ttl_duration: Option<String>,
    /// An image the image GC never removes (the runtime's sandbox image is
    /// protected anyway: pinned by containerd ≥ 1.7, read from its config on 1.6).
    #[arg(long)]
    pod_infra_container_image: Option<String>,
    /// Minimum age of a dead container before it is garbage collected (`0s`).
    #[arg(long)]
    minimum_container_ttl_duration: Option<String>,
    /// Dead instances kept per container name of a pod (1; negative: no limit).
    #[arg(long, allow_negative_numbers = true)]
    maximum_dead_containers_per_container: Option<i32>,
    /// Dead containers kept on the node (-1: no limit).
    #[arg(long, allow_negative_numbers = true)]
    maximum_dead_containers: Option<i32>,
    /// Resources reserved for Kubernetes daemons (`cpu=100m,memory=256Mi`).
    #[arg(long)]
    kube_reserved: Option<String>,
    /// Resources reserved for the system (`memory=512Mi,pid=1000`).
    #[arg(long)]
    system_reserved: Option<String>,
    /// What node allocatable limits (`pods`, `none`).
    #[arg(long)]
    enforce_node_allocatable: Option<String>,
    /// Each pod's process limit (-1: none).
    #[arg(long, allow_negative_numbers = true)]
    pod_max_pids: Option<i64>,
    /// Static pod manifest directory (or file).
    #[arg(long)]
    pod_manifest_path: Option<PathBuf>,
    /// Static pod manifest URL (http://).
    #[arg(long)]
    manifest_url: Option<String>,
    /// CRI endpoint.
    #[arg(long)]
    container_runtime_endpoint: Option<String>,
    /// Node name instead of the hostname.
    #[arg(long)]
    hostname_override: Option<String>,
    /// State directory (pod volumes, logs under logs/pods).
    #[arg(long, default_value = "/var/lib/evlet")]
    pub root_dir: PathBuf,
    /// Root cgroup of the agent's pods (cgroupfs path).
    #[arg(long)]
    cgroup_root: Option<String>,
    /// The cgroup driver: cgroupfs or systemd (as the runtime's).
    #[arg(long)]
    cgroup_driver: Option<String>,
    /// The IP both the secured and the read-only port bind (upstream's
    /// `--address`; default 0.0.0.0). evlet's earlier `IP:PORT` is still
    /// read as the IP and `--read-only-port PORT`, with a warning.
    #[arg(long)]
    address: Option<String>,
    /// The read-only port (plain HTTP, no authentication: /healthz, /pods,
    /// /metrics, /stats); 0, the default, turns it off.
    #[arg(long)]
    read_only_port: Option<u16>,
    /// The port of the healthz server (default 10248; 0 turns it off).
    #[arg(long)]
    healthz_port: Option<u16>,
    /// The IP the healthz server binds (default 127.0.0.1).
    #[arg(long)]
    healthz_bind_address: Option<std::net::IpAddr>,
    /// The node's IP (status.hostIP).
    #[arg(long)]
    node_ip: Option<String>,
    /// PLEG mode.
    #[arg(long, value_enum)]
    pleg_mode: Option<PlegMode>,
    /// Log format (upstream's `--logging-format` too).
    #[arg(long, alias = "logging-format", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// kubeconfig of the API server to join; without it evlet runs standalone.
    /// With --bootstrap-kubeconfig it is written by evlet, naming
    /// `<root-dir>/pki/kubelet-client-current.pem`.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig (a bootstrap token) to request a client certificate with
    /// when the --kubeconfig file is missing or its certificate unusable
    /// (TLS bootstrap, as upstream's).
    #[arg(long)]
    bootstrap_kubeconfig: Option<PathBuf>,
    /// Request a new client certificate when 70–90 % of the current one's
    /// lifetime has passed (overrides `rotateCertificates`; default false).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    rotate_certificates: Option<bool>,
    /// Pods this node runs at most (admission, and the node's `pods` capacity).
    #[arg(long)]
    max_pods: Option<u32>,
    /// Taints the node registers with: `key=value:Effect,...`.
    #[arg(long)]
    register_with_taints: Option<String>,
    /// Labels the node registers with: `key=value,...` (the `kubernetes.io`
    /// and `k8s.io` namespaces only as upstream allows them).
    #[arg(long)]
    node_labels: Option<String>,
    /// The cluster DNS service's IPs, comma-separated (overrides `clusterDNS`).
    #[arg(long, value_delimiter = ',')]
    cluster_dns: Option<Vec<String>>,
    /// The cluster's domain (overrides `clusterDomain`).
    #[arg(long)]
    cluster_domain: Option<String>,
    /// The node's resolver file (overrides `resolvConf`; "" for none).
    #[arg(long)]
    resolv_conf: Option<PathBuf>,
    /// Pods whose sandbox and first containers are started at once (evlet's
    /// own; default 8). The others wait their turn before their runtime
    /// deadlines start, so a batch of hundreds does not time out in the runtime.
    #[arg(long)]
    max_parallel_pod_starts: Option<usize>,
    /// The secured kubelet API's port (default 10250; 0 turns it off).
    #[arg(long)]
    port: Option<u16>,
    /// The secured port's certificate (default: self-signed under `<root-dir>/pki`).
    #[arg(long)]
    tls_cert_file: Option<PathBuf>,
    /// The secured port's private key.
    #[arg(long)]
    tls_private_key_file: Option<PathBuf>,
    /// Client certificates signed by this CA authenticate as their CN.
    #[arg(long)]
    client_ca_file: Option<PathBuf>,
    /// Let requests without credentials in as `system:anonymous` (default false).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    anonymous_auth: Option<bool>,
    /// Check bearer tokens with the API server's TokenReview (API-server mode; default on there).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    authentication_token_webhook: Option<bool>,
    /// `Webhook` (SubjectAccessReview; the default in API-server mode) or `AlwaysAllow`.
    #[arg(long)]
    authorization_mode: Option<String>,
    /// The file whose exclusive lock makes this the node's only agent
    /// (default `<root-dir>/evlet.lock`).
    #[arg(long)]
    pub lock_file: Option<PathBuf>,
    /// Exit when another process opens the lock file, and wait for the lock
    /// instead of failing (upstream's hand-over between two agents).
    #[arg(long)]
    pub exit_on_lock_contention: bool,
}

/// TLS bootstrap and rotation, as the flags and the config file ask.
#[derive(Debug, Clone)]
pub(crate) struct Certificates {
    /// `--bootstrap-kubeconfig`.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `rotateCertificates`.
    pub rotate: bool,
    /// `serverTLSBootstrap`.
    pub server_tls_bootstrap: bool,
}

impl Certificates {
    fn from(flags: &Flags, file: &KubeletConfiguration) -> Result<Self> {
        let c = Self {
            bootstrap_kubeconfig: flags.bootstrap_kubeconfig.clone(),
            rotate: flags
                .rotate_certificates
                .or(file.rotate_certificates)
                .unwrap_or(false),
            server_tls_bootstrap: file.server_tls_bootstrap.unwrap_or(false),
        };
        if flags.kubeconfig.is_none() {
            if c.bootstrap_kubeconfig.is_some() {
                anyhow::bail!(
                    "--bootstrap-kubeconfig needs --kubeconfig: the file the node's kubeconfig is written to"
                );
            }
            if c.server_tls_bootstrap {
                anyhow::bail!("serverTLSBootstrap needs an API server (--kubeconfig)");
            }
        }
        Ok(c)
    }
}

/// The configuration the flags and the config file make, and what to do
/// about certificates.
///
/// # Errors
/// A flag or field that cannot be used, named.
pub(crate) fn effective(flags: Flags) -> Result<(Config, Certificates)> {
    let mut file = match &flags.config {
        Some(path) => KubeletConfiguration::load(path)?,
        None => KubeletConfiguration::default(),
    };
    let certificates = Certificates::from(&flags, &file)?;
    // The eviction flags override the file's fields, as upstream's do.
    let pairs = |flag: &str, v: &Option<String>, sep: char| {
        v.as_deref()
            .map(|s| config::parse_pairs(s, sep).map_err(|e| anyhow::anyhow!("--{flag}: {e}")))
            .transpose()
    };
    if let Some(m) = pairs("eviction-hard", &flags.eviction_hard, '<')? {
        file.eviction_hard = Some(m);
    }
    if let Some(m) = pairs("eviction-soft", &flags.eviction_soft, '<')? {
        file.eviction_soft = Some(m);
    }
    if let Some(m) = pairs(
        "eviction-soft-grace-period",
        &flags.eviction_soft_grace_period,
        '=',
    )? {
        file.eviction_soft_grace_period = Some(m);
    }
    if let Some(m) = pairs(
        "eviction-minimum-reclaim",
        &flags.eviction_minimum_reclaim,
        '=',
    )? {
        file.eviction_minimum_reclaim = Some(m);
    }
    if let Some(p) = flags.eviction_pressure_transition_period.clone() {
        file.eviction_pressure_transition_period = Some(p);
    }
    if let Some(g) = flags.eviction_max_pod_grace_period {
        file.eviction_max_pod_grace_period = Some(g);
    }
    if let Some(p) = flags.image_gc_high_threshold {
        file.image_gc_high_threshold_percent = Some(p);
    }
    if let Some(p) = flags.image_gc_low_threshold {
        file.image_gc_low_threshold_percent = Some(p);
    }
    if let Some(a) = flags.minimum_image_ttl_duration.clone() {
        file.image_minimum_gc_age = Some(a);
    }
    if let Some(m) = pairs("kube-reserved", &flags.kube_reserved, '=')? {
        file.kube_reserved = Some(m);
    }
    if let Some(m) = pairs("system-reserved", &flags.system_reserved, '=')? {
        file.system_reserved = Some(m);
    }
    if let Some(e) = &flags.enforce_node_allocatable {
        file.enforce_node_allocatable = Some(
            e.split(',')
                .map(str::trim)
                .filter(|o| !o.is_empty())
                .map(str::to_owned)
                .collect(),
        );
    }
    if let Some(n) = flags.pod_max_pids {
        file.pod_pids_limit = Some(n);
    }
    let reservations = file.reservations().map_err(anyhow::Error::msg)?;
    let image_gc = file.image_gc_policy().map_err(anyhow::Error::msg)?;
    let container_gc = {
        let d = evlet::container_gc::Policy::default();
        evlet::container_gc::Policy {
            min_age: flags
                .minimum_container_ttl_duration
                .as_deref()
                .map(config::parse_duration)
                .transpose()
                .context("--minimum-container-ttl-duration")?
                .unwrap_or(d.min_age),
            max_per_pod_container: flags
                .maximum_dead_containers_per_container
                .unwrap_or(d.max_per_pod_container),
            max_containers: flags.maximum_dead_containers.unwrap_or(d.max_containers),
            period: d.period,
        }
    };
    let duration = |v: Option<&String>, default: Duration| -> Result<Duration> {
        v.map(|s| config::parse_duration(s).map_err(anyhow::Error::from))
            .transpose()
            .map(|d| d.unwrap_or(default))
    };
    let mut pods = file.pod_settings();
    let eviction = file.eviction_settings().map_err(anyhow::Error::msg)?;
    if let Some(dns) = flags.cluster_dns {
        pods.cluster_dns = dns.into_iter().filter(|s| !s.is_empty()).collect();
    }
    if let Some(domain) = flags.cluster_domain {
        pods.cluster_domain = domain;
    }
    if let Some(path) = flags.resolv_conf {
        pods.resolv_conf = (!path.as_os_str().is_empty()).then_some(path);
    }
    if let Some(n) = flags.max_parallel_pod_starts {
        pods.parallel_pod_starts = n;
    }
    config::check_pod_settings(&pods).map_err(anyhow::Error::msg)?;
    let (address, legacy_port) = flags
        .address
        .as_deref()
        .map(config::serving::parse_address_flag)
        .transpose()
        .map_err(anyhow::Error::msg)?
        .map_or((None, None), |(ip, port)| (Some(ip), port));
    if let (Some(ip), Some(port)) = (address, legacy_port) {
        tracing::warn!(
            "--address {ip}:{port} is deprecated: --address takes an IP for both ports, as upstream's; use --address {ip} --read-only-port {port}"
        );
    }
    let serving = config::ServingFlags {
        address,
        port: flags.port,
        read_only_port: flags.read_only_port.or(legacy_port),
        healthz_port: flags.healthz_port,
        healthz_bind_address: flags.healthz_bind_address,
        tls_cert_file: flags.tls_cert_file.clone(),
        tls_private_key_file: flags.tls_private_key_file.clone(),
        client_ca_file: flags.client_ca_file.clone(),
        anonymous_auth: flags.anonymous_auth,
        token_webhook: flags.authentication_token_webhook,
        authorization_mode: flags.authorization_mode.clone(),
    };
    let secure = file
        .secure_serving(&serving, flags.kubeconfig.is_some())
        .map_err(anyhow::Error::msg)
        .context("the secured kubelet API")?;
    let http = file
        .endpoints(&serving, &flags.root_dir, evlet::server::Limits::default())
        .map_err(anyhow::Error::msg)?;
    let node_labels = match &flags.node_labels {
        Some(s) => config::parse_node_labels(s).map_err(anyhow::Error::msg)?,
        None => Default::default(),
    };
    let cgroup_driver = evlet::cm::Driver::parse(
        flags
            .cgroup_driver
            .as_deref()
            .or(file.cgroup_driver.as_deref())
            .unwrap_or("cgroupfs"),
    )
    .map_err(anyhow::Error::msg)?;
    if certificates.server_tls_bootstrap && secure.is_some() && file.tls_cert_file.is_some() {
        tracing::warn!("serverTLSBootstrap: tlsCertFile and tlsPrivateKeyFile are not served");
    }
    let config = Config {
        node_name: config::node_name(flags.hostname_override.as_deref()),
        root_dir: flags.root_dir,
        pod_manifest_path: flags.pod_manifest_path.or(file.static_pod_path),
        manifest_url: flags.manifest_url.or(file.static_pod_url),
        runtime_endpoint: flags
            .container_runtime_endpoint
            .or(file.container_runtime_endpoint)
            .unwrap_or_else(|| "unix:///run/containerd/containerd.sock".into()),
        cgroup_root: flags
            .cgroup_root
            .or(file.cgroup_root)
            .unwrap_or_else(|| "/".into()),
        cgroup_driver,
        http,
        file_check_frequency: duration(
            file.file_check_frequency.as_ref(),
            Duration::from_secs(20),
        )?,
        http_check_frequency: duration(
            file.http_check_frequency.as_ref(),
            Duration::from_secs(20),
        )?,
        sync_frequency: duration(file.sync_frequency.as_ref(), evlet::workers::RESYNC)?,
        node_ip: flags.node_ip,
        pleg_mode: flags.pleg_mode.or(file.pleg_mode).unwrap_or(PlegMode::Ebpf),
        relist_period: evlet::pleg::generic::RELIST_PERIOD,
        ebpf_relist_period: duration(
            file.pleg_safety_relist_period.as_ref(),
            Duration::from_secs(120),
        )?,
        ebpf_ring_bytes: evlet_ebpf::Config::default().ring_bytes,
        log_format: flags.log_format,
        api: None,
        max_pods: flags.max_pods.or(file.max_pods).unwrap_or(config::MAX_PODS),
        register_with_taints: match &flags.register_with_taints {
            Some(s) => config::parse_taints(s)
                .map_err(anyhow::Error::from)
                .context("--register-with-taints")?,
            None => file.register_with_taints.clone().unwrap_or_default(),
        },
        pods,
        eviction,
        image_gc,
        pod_infra_container_image: flags.pod_infra_container_image,
        container_gc,
        reservations,
        pod_pids_limit: file.pod_pids_limit.unwrap_or(-1),
        cgroup_layout: None,
        single_process_oom_kill: file.single_process_oom_kill,
        node_labels,
        secure,
    };
    Ok((config, certificates))
}

#[cfg(test)]
mod tests;
