//! Upstream kubelet as the agent under test: the control the bench's evlet
//! rows are compared with, on the same containerd, static pods and observer.
//!
//! Standalone, as evlet runs in the bench: no kubeconfig, the pods from a
//! static pod directory, its state under the bench's work directory. It
//! reads one `KubeletConfiguration` ([`config`]); it runs the way
//! `evlet_testkit::upstream_kubelet` describes, so it changes neither the
//! host's sysctls nor its iptables. The bench reads it where a user would:
//! the read-only port (`/healthz`, `/pods`, `/metrics`).

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{Context as _, Result};
use evlet_testkit::upstream_kubelet;
use serde_json::json;

use crate::{Agent, AgentKind, EVICTION_HARD, Endpoint, NODE};

/// How to start upstream kubelet.
#[derive(Debug, Clone)]
pub struct UpstreamSpec {
    /// The kubelet binary.
    pub binary: PathBuf,
    /// With the `EventedPLEG` feature gate (containerd ≥ 1.7).
    pub evented: bool,
    /// `staticPodPath`.
    pub manifests: PathBuf,
    /// Everything it writes: `root` (`--root-dir`), `pods` (`podLogsDir`),
    /// `pki`, `sysctl`, `config.json`.
    pub state: PathBuf,
    /// `containerRuntimeEndpoint`.
    pub endpoint: String,
    /// `cgroupRoot` (the cgroupfs driver).
    pub cgroup_root: String,
    /// The read-only port's `IP:PORT`.
    pub address: String,
    /// `maxPods`.
    pub max_pods: usize,
    /// Where its log goes.
    pub log: PathBuf,
}

/// The secured port, off upstream's 10250 so another kubelet on the machine
/// does not collide (nothing in the bench uses it).
const PORT: u16 = 10450;
/// Upstream's healthz port, likewise moved.
const HEALTHZ_PORT: u16 = 10448;

/// The `KubeletConfiguration` of the bench's upstream kubelet: evlet's bench
/// settings in upstream's words (the cgroupfs driver under the node's cgroup
/// root, the read-only port, [`EVICTION_HARD`], image GC off), anonymous
/// access with `AlwaysAllow` as a standalone kubelet has, `maxPods` raised to
/// the bench's count, and no host changes (`protectKernelDefaults`, no
/// iptables chains).
///
/// # Errors
/// If [`EVICTION_HARD`] or `address` does not parse.
pub fn config(spec: &UpstreamSpec) -> Result<serde_json::Value> {
    let address: std::net::SocketAddr = spec
        .address
        .parse()
        .with_context(|| format!("read-only address {:?}: expected IP:PORT", spec.address))?;
    let mut eviction = serde_json::Map::new();
    for pair in EVICTION_HARD.split(',') {
        let (signal, value) = pair
            .split_once('<')
            .with_context(|| format!("eviction threshold {pair:?}"))?;
        eviction.insert(signal.into(), value.into());
    }
    let mut gates = serde_json::Map::new();
    if spec.evented {
        gates.insert("EventedPLEG".into(), true.into());
    }
    Ok(json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": spec.endpoint,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": spec.cgroup_root,
        "staticPodPath": spec.manifests,
        "address": address.ip().to_string(),
        "readOnlyPort": address.port(),
        "port": PORT,
        "healthzPort": HEALTHZ_PORT,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {
            "anonymous": { "enabled": true },
            "webhook": { "enabled": false },
        },
        "authorization": { "mode": "AlwaysAllow" },
        "maxPods": spec.max_pods.max(110),
        "evictionHard": eviction,
        // As evlet's `--image-gc-high-threshold 100`: the bench's image
        // cannot be pulled again.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "podLogsDir": spec.state.join("pods"),
        "resolvConf": "/etc/resolv.conf",
        "failSwapOn": false,
        "protectKernelDefaults": true,
        "makeIPTablesUtilChains": false,
        "featureGates": gates,
    }))
}

impl Agent {
    /// Starts upstream kubelet and waits until its read-only `/healthz`
    /// answers `ok`.
    ///
    /// # Errors
    /// If its state cannot be made, it cannot start, or it is not healthy
    /// within a minute.
    pub async fn start_upstream(spec: &UpstreamSpec) -> Result<Self> {
        let root = spec.state.join("root");
        upstream_kubelet::unmount_under(&spec.state);
        let _ = std::fs::remove_dir_all(&spec.state);
        for dir in [&root, &spec.state.join("pods")] {
            std::fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
        }
        let config_file = spec.state.join("config.json");
        std::fs::write(&config_file, serde_json::to_vec_pretty(&config(spec)?)?)?;
        let sysctl = spec.state.join("sysctl");
        upstream_kubelet::write_sysctls(&sysctl)?;
        upstream_kubelet::ensure_cgroup_root(&spec.cgroup_root)?;
        upstream_kubelet::share_mount(&root)?;
        let args = vec![
            format!("--config={}", config_file.display()),
            format!("--root-dir={}", root.display()),
            format!("--cert-dir={}", spec.state.join("pki").display()),
            format!("--hostname-override={NODE}"),
            "--node-ip=127.0.0.1".to_owned(),
        ];
        let log = std::fs::File::create(&spec.log)
            .with_context(|| format!("creating {}", spec.log.display()))?;
        let mut cmd =
            tokio::process::Command::from(upstream_kubelet::command(&spec.binary, &args, &sysctl));
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .current_dir(&spec.state)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", spec.binary.display()))?;
        let http = Endpoint::read_only(&spec.address);
        let agent = Self::adopt(child, AgentKind::Upstream, http, Some(spec.state.clone()))?;
        agent.healthy(&spec.log, |text| Ok(text == "ok")).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(evented: bool) -> UpstreamSpec {
        UpstreamSpec {
            binary: "/b/kubelet".into(),
            evented,
            manifests: "/w/manifests".into(),
            state: "/w/upstream".into(),
            endpoint: "unix:///n/containerd.sock".into(),
            cgroup_root: "/evlet-node-17/bench".into(),
            address: "127.0.0.1:10256".into(),
            max_pods: 1000,
            log: "/w/kubelet.log".into(),
        }
    }

    #[test]
    fn the_config_is_evlets_bench_settings_in_upstreams_words() {
        let c = config(&spec(false)).expect("a config");
        assert_eq!(c["staticPodPath"], "/w/manifests");
        assert_eq!(c["readOnlyPort"], 10256);
        assert_eq!(c["address"], "127.0.0.1");
        assert_eq!(c["cgroupRoot"], "/evlet-node-17/bench");
        assert_eq!(c["maxPods"], 1000);
        assert_eq!(c["evictionHard"]["memory.available"], "100Mi");
        assert_eq!(c["evictionHard"]["imagefs.available"], "1%");
        assert_eq!(c["imageGCHighThresholdPercent"], 100);
        assert_eq!(c["protectKernelDefaults"], true);
        assert!(c["featureGates"].as_object().expect("gates").is_empty());
        let small = config(&UpstreamSpec {
            max_pods: 10,
            ..spec(true)
        })
        .expect("a config");
        assert_eq!(small["maxPods"], 110, "never below upstream's default");
        assert_eq!(small["featureGates"]["EventedPLEG"], true);
    }
}
