//! The binary's flags against upstream kubelet's command lines: a kubeadm
//! node's, and upstream's port flags.

use super::*;

/// `/var/lib/kubelet/config.yaml` as kubeadm writes it: its
/// `KubeletConfiguration` marshalled with every zero value.
const KUBEADM_CONFIG: &str = "\
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: \"\"
cpuManagerReconcilePeriod: 0s
crashLoopBackOff: {}
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: \"0\"
    text:
      infoBufferSize: \"0\"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
";

/// The command line of kubeadm's drop-in (kubernetes/release
/// `10-kubeadm.conf`): `$KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS
/// $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS`, with the
/// `kubeadm-flags.env` kubeadm writes and the node's extra arguments.
fn kubeadm_command_line(config: &std::path::Path) -> Vec<String> {
    let mut args = vec![
        "/usr/bin/kubelet".to_owned(),
        "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf".into(),
        "--kubeconfig=/etc/kubernetes/kubelet.conf".into(),
        format!("--config={}", config.display()),
    ];
    args.extend(
        [
            "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock",
            "--pod-infra-container-image=registry.k8s.io/pause:3.10",
            "--hostname-override=worker-1",
            "--register-with-taints=node-role.kubernetes.io/control-plane:NoSchedule",
            "--node-ip=192.0.2.10",
            "--v=2",
        ]
        .map(String::from),
    );
    args
}

#[test]
fn a_kubeadm_nodes_command_line_and_config_file_start_evlet_with_kubelets_meaning() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, KUBEADM_CONFIG).expect("config");
    let (args, ignored) =
        config::compat_args(kubeadm_command_line(&file)).expect("no flag refused");
    assert_eq!(ignored.len(), 1, "--v only: {ignored:?}");
    let flags = Flags::try_parse_from(args).expect("every flag is evlet's");
    assert_eq!(
        flags.kubeconfig.as_deref(),
        Some(std::path::Path::new("/etc/kubernetes/kubelet.conf"))
    );
    let (config, certificates) = effective(flags).expect("a usable configuration");
    assert_eq!(
        certificates.bootstrap_kubeconfig.as_deref(),
        Some(std::path::Path::new(
            "/etc/kubernetes/bootstrap-kubelet.conf"
        ))
    );
    assert!(certificates.rotate, "rotateCertificates");
    assert_eq!(
        config.runtime_endpoint,
        "unix:///var/run/containerd/containerd.sock"
    );
    assert_eq!(config.node_name, "worker-1");
    assert_eq!(config.node_ip.as_deref(), Some("192.0.2.10"));
    assert_eq!(config.register_with_taints.len(), 1);
    assert_eq!(
        config.pod_infra_container_image.as_deref(),
        Some("registry.k8s.io/pause:3.10")
    );
    assert_eq!(
        config.pod_manifest_path.as_deref(),
        Some(std::path::Path::new("/etc/kubernetes/manifests"))
    );
    assert_eq!(
        (config.sync_frequency, config.file_check_frequency),
        (evlet::workers::RESYNC, Duration::from_secs(20)),
        "zero durations are upstream's defaults"
    );
    let secure = config.secure.expect("the secured port");
    assert_eq!(secure.address, "0.0.0.0:10250".parse().expect("addr"));
    assert_eq!(secure.token_webhook, Some(Duration::from_secs(120)));
    assert_eq!(
        config.http.read_only, None,
        "kubeadm's nodes have no read-only port"
    );
    assert_eq!(
        config.http.healthz,
        Some("127.0.0.1:10248".parse().expect("addr")),
        "where kubeadm's kubelet-check looks"
    );
}

#[test]
fn upstreams_port_flags_keep_their_meaning_and_evlets_earlier_address_still_reads() {
    let parse = |extra: &[&str]| {
        let mut args = vec!["evlet", "--root-dir", "/r"];
        args.extend_from_slice(extra);
        effective(Flags::try_parse_from(args).expect("flags"))
            .expect("config")
            .0
    };
    let c = parse(&[
        "--address",
        "10.0.0.5",
        "--read-only-port",
        "10255",
        "--healthz-port",
        "0",
        "--anonymous-auth",
    ]);
    assert_eq!(
        c.http.read_only,
        Some("10.0.0.5:10255".parse().expect("addr"))
    );
    assert_eq!(c.http.healthz, None);
    assert_eq!(
        c.secure.map(|s| s.address),
        Some("10.0.0.5:10250".parse().expect("addr"))
    );
    let c = parse(&["--address", "127.0.0.1:10298", "--port", "0"]);
    assert_eq!(
        c.http.read_only,
        Some("127.0.0.1:10298".parse().expect("addr"))
    );
    assert_eq!(
        c.http.local_socket.as_deref(),
        Some(std::path::Path::new("/r/evlet.sock"))
    );
    let c = parse(&[
        "--healthz-bind-address",
        "0.0.0.0",
        "--healthz-port",
        "10249",
    ]);
    assert_eq!(c.http.healthz, Some("0.0.0.0:10249".parse().expect("addr")));
    assert_eq!(c.http.read_only, None, "off unless asked for");
}
