//! `cargo xtask run`: evlet's main job on a local default: a private containerd
//! and the example static pods of `deploy/examples`. With `--cluster`, also
//! the local upstream control plane (`cargo xtask cluster up`), which evlet
//! joins as its node the way an upstream kubelet joins a cluster: a bootstrap
//! token, a client certificate from a CSR the controller-manager approves, and
//! a serving certificate from a `kubelet-serving` CSR that this task approves
//! as a cluster's operator would.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::cluster::{Cluster, Version as ClusterVersion};
use crate::containerd::Version;
use crate::node::Node;
use crate::{paths, setup, sh};

/// Where `run` serves `/healthz`, `/pods`, `/metrics` (the read-only port,
/// `--address 127.0.0.1 --read-only-port 10255`).
const ADDRESS: &str = "127.0.0.1:10255";

fn get(path: &str) -> Result<String> {
    let mut stream = TcpStream::connect(ADDRESS)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default())
}

/// One line per pod and container from `/pods`.
fn summary() -> Result<(String, bool)> {
    let pods: serde_json::Value = serde_json::from_str(&get("/pods")?)?;
    let mut out = String::new();
    let mut all_up = true;
    for pod in pods["items"].as_array().into_iter().flatten() {
        let phase = pod["status"]["phase"].as_str().unwrap_or("?");
        all_up &= phase == "Running" || phase == "Succeeded";
        out += &format!(
            "  pod {:<28} {:<10} ip {}\n",
            pod["metadata"]["name"].as_str().unwrap_or("?"),
            phase,
            pod["status"]["podIP"].as_str().unwrap_or("-")
        );
        let statuses = pod["status"]["initContainerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(
                pod["status"]["containerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten(),
            );
        for c in statuses {
            let state = c["state"]
                .as_object()
                .and_then(|s| s.keys().next().cloned())
                .unwrap_or_default();
            out += &format!(
                "    container {:<16} {:<11} restarts {}\n",
                c["name"].as_str().unwrap_or("?"),
                state,
                c["restartCount"]
            );
        }
    }
    let any = !out.is_empty();
    Ok((out, all_up && any))
}

/// Asks evlet to stop (SIGTERM to its PID) and waits for it.
fn stop_evlet(child: &mut std::process::Child) -> Result<()> {
    let pid = i32::try_from(child.id()).context("evlet's pid")?;
    // SAFETY: kill has no memory-safety preconditions; the child is ours.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    child.wait().context("waiting for evlet to stop")?;
    Ok(())
}

/// The node name evlet registers (`--hostname-override`).
const NODE_NAME: &str = "evlet-dev";

/// A value of the cluster's `cluster.env`.
fn cluster_var(cluster: &Cluster, name: &str) -> Result<String> {
    let env = std::fs::read_to_string(cluster.env_file())
        .with_context(|| format!("reading {}", cluster.env_file().display()))?;
    env.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
        .map(str::to_owned)
        .with_context(|| format!("{} names no {name}", cluster.env_file().display()))
}

/// The KubeletConfiguration of a node that joins `cluster`: serving
/// certificates from the cluster's signer, clients authenticated by the
/// cluster's CA and tokens, authorized by the API server (upstream's
/// production set-up, as kubeadm writes it).
fn cluster_config(cluster: &Cluster) -> String {
    let ca = cluster.pki().join("ca.crt");
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         rotateCertificates: true\nserverTLSBootstrap: true\n\
         authentication:\n  anonymous: {{enabled: false}}\n  webhook: {{enabled: true}}\n  x509: {{clientCAFile: {}}}\n\
         authorization: {{mode: Webhook}}\n",
        ca.display()
    )
}

/// Approves the node's pending `kubelet-serving` CSRs (as a cluster's
/// operator or approver does: the controller-manager never approves them).
/// Returns how many it approved.
fn approve_serving(kubectl: &str, admin: &std::path::Path) -> Result<usize> {
    let out = sh::output(Command::new(kubectl).arg("--kubeconfig").arg(admin).args([
        "get",
        "csr",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.signerName} {.spec.username} {.status.conditions[*].type}{\"\\n\"}{end}",
    ]))?;
    let mut approved = 0;
    for line in out.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let [name, "kubernetes.io/kubelet-serving", user] = fields.as_slice()
            && *user == format!("system:node:{NODE_NAME}")
        {
            sh::run(Command::new(kubectl).arg("--kubeconfig").arg(admin).args([
                "certificate",
                "approve",
                name,
            ]))?;
            approved += 1;
        }
    }
    Ok(approved)
}

/// Sets up, brings the node up (and with `cluster` the control plane), builds
/// and runs evlet with the example pods. With `duration`, stops evlet after
/// that long (pods keep running, as with any kubelet).
pub fn run(
    version: Version,
    cluster: Option<ClusterVersion>,
    duration: Option<u64>,
    args: &[String],
) -> Result<()> {
    setup::setup()?;
    let node = Node::new(version);
    node.up()?;
    let cluster = cluster.map(Cluster::new);
    if let Some(cluster) = &cluster {
        cluster.up()?;
    }
    sh::run(&mut sh::cargo(&["build", "--locked", "--package", "evlet"]))?;
    let evlet = paths::repo().join("target/debug/evlet");
    let root = node.dir.join("evlet");
    let mut cmd = Command::new(&evlet);
    let mut kubectl = None;
    if let Some(cluster) = &cluster {
        std::fs::create_dir_all(&root)?;
        let config = root.join("kubelet-config.yaml");
        std::fs::write(&config, cluster_config(cluster))?;
        cmd.arg("--config")
            .arg(&config)
            .arg("--bootstrap-kubeconfig")
            .arg(cluster.bootstrap_kubeconfig())
            .arg("--kubeconfig")
            .arg(root.join("kubelet.kubeconfig"))
            .args(["--node-ip", "127.0.0.1"]);
        kubectl = Some((
            cluster_var(cluster, "EVLET_CLUSTER_KUBECTL")?,
            cluster.admin_kubeconfig(),
        ));
    }
    cmd.arg("--container-runtime-endpoint")
        .arg(node.endpoint())
        .arg("--pod-manifest-path")
        .arg(paths::repo().join("deploy/examples"))
        .arg("--root-dir")
        .arg(&root)
        .args([
            "--cgroup-root",
            &node.cgroup_root(),
            "--hostname-override",
            NODE_NAME,
            "--address",
            "127.0.0.1",
            "--read-only-port",
            "10255",
        ])
        .args(args);
    // Ctrl-C (SIGINT to the whole terminal group) or a SIGTERM to this task
    // stops evlet by its PID and ends quietly; the node and its pods stay.
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("installing the Ctrl-C handler")?;
    }
    eprintln!("$ {}", sh::display(&cmd));
    let mut child = cmd.spawn().context("cannot start evlet")?;
    let started = Instant::now();
    let mut shown = false;
    let mut serving_approved = kubectl.is_none();
    loop {
        if !serving_approved && let Some((kubectl, admin)) = &kubectl {
            serving_approved = approve_serving(kubectl, admin).unwrap_or(0) > 0;
        }
        if stop.load(Ordering::Relaxed) {
            stop_evlet(&mut child)?;
            eprintln!("evlet stopped; the node and its pods keep running");
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            if duration.is_some() && shown {
                return Ok(());
            }
            bail!("evlet exited: {status}");
        }
        if !shown
            && let Ok((text, all_up)) = summary()
            && (all_up || started.elapsed() > Duration::from_secs(60))
        {
            println!(
                "evlet is running the example pods (http://{ADDRESS}/pods, /healthz, /metrics):\n{text}"
            );
            println!("{}", get("/healthz").unwrap_or_default().trim_end());
            if let Some((kubectl, admin)) = &kubectl {
                let nodes =
                    sh::output(Command::new(kubectl).arg("--kubeconfig").arg(admin).args([
                        "get",
                        "nodes,pods",
                        "-A",
                        "-o",
                        "wide",
                    ]))
                    .unwrap_or_default();
                println!(
                    "evlet joined the local control plane as node {NODE_NAME} in {:.1} s:\n{nodes}\n\
                     Try: {kubectl} --kubeconfig {} get nodes,pods -A",
                    started.elapsed().as_secs_f64(),
                    admin.display()
                );
            }
            println!(
                "Ctrl-C stops evlet; `cargo xtask node down --containerd {version}` removes the node and its pods."
            );
            shown = true;
        }
        if let Some(limit) = duration
            && started.elapsed() > Duration::from_secs(limit)
        {
            stop_evlet(&mut child)?;
            if !shown {
                bail!("the example pods did not come up within {limit} s");
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
