//! The runtime's floor: what starting pods costs when only CRI calls are made.
//!
//! [`measure`] starts N pods straight over CRI with the parallelism evlet's pod
//! workers have (one task per pod, at most `parallel` starting at once, as
//! evlet's `--max-parallel-pod-starts`): `RunPodSandbox` and
//! `PodSandboxStatus` (for the IP, as evlet and upstream read it), then
//! `CreateContainer` and `StartContainer`, with the very configs evlet builds
//! (its own `sync::spec` builders and managed `/etc/hosts` on its own parsed
//! manifests), so the runtime does exactly the same work. Then, at that density, it SIGKILLs a
//! container's init and at once creates and starts its replacement: the floor
//! of "kill → replacement running" for an agent that knows of the death at
//! once (the runtime handles the old container's exit meanwhile, as it does
//! under evlet).
//!
//! The kills keep evlet's pace ([`crate::schedule`]): the first comes
//! [`crate::schedule::quiet_before_kills`] after the start, as evlet's do
//! after its batch start, and each is followed by a
//! [`crate::schedule::kill_gap`], as each of evlet's is.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use evlet::runtime::Kind;
use evlet::source::manifest::{self, StaticKind};
use evlet::sync::env::ApiObjects;
use evlet::sync::spec::{self, ContainerContext, NodeContext};
use evlet_cri::{ContainerId, RuntimeClient, SandboxFilter, SandboxId};
use k8s_openapi::api::core::v1::Pod;

use crate::{NODE, Summary};

/// The floor pods' names start with this (evlet's bench pods with `b`).
pub const PREFIX: &str = "floor";

/// What the floor run measured.
#[derive(Debug, Clone)]
pub struct Floor {
    /// N pods started at once: first call → last container started.
    pub start_total: Duration,
    /// containerd's own CPU time over that start.
    pub start_containerd_cpu: Duration,
    /// SIGKILL of a container's init → its replacement created and started,
    /// at density N and at evlet's pace of kills; `None` without samples.
    pub kill_replacement: Option<Summary>,
}

fn pods(n: usize, image: &str) -> Result<Vec<Pod>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let yaml = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {PREFIX}{i}}}\nspec:\n  restartPolicy: Always\n  containers:\n  - name: app\n    image: {image}\n    command: [/bin/sleep, '86400']\n"
        );
        let parsed = manifest::parse(&yaml, "floor", StaticKind::File, NODE);
        if let Some(e) = parsed.errors.first() {
            bail!("floor manifest: {e}");
        }
        out.extend(parsed.pods);
    }
    Ok(out)
}

/// A started floor pod: its sandbox, its IP and its container.
struct Started {
    sandbox: SandboxId,
    ip: Option<String>,
    container: ContainerId,
}

/// Starts one pod: sandbox (and its IP, which evlet reads after creating
/// one as upstream does), then its container.
async fn start_pod(
    client: &RuntimeClient,
    node: &NodeContext,
    pod: &Pod,
    restart_count: u32,
) -> Result<Started> {
    let sandbox_config = spec::sandbox_config(node, pod, 0)?;
    std::fs::create_dir_all(spec::log_dir(node, pod))?;
    let sandbox = client.run_pod_sandbox(sandbox_config.clone(), "").await?;
    let ip = client
        .pod_sandbox_status(&sandbox, false)
        .await?
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .filter(|ip| !ip.is_empty());
    let container =
        create_start_one(client, node, pod, &sandbox, ip.as_deref(), restart_count).await?;
    Ok(Started {
        sandbox,
        ip,
        container,
    })
}

async fn create_start_one(
    client: &RuntimeClient,
    node: &NodeContext,
    pod: &Pod,
    sandbox: &SandboxId,
    pod_ip: Option<&str>,
    restart_count: u32,
) -> Result<ContainerId> {
    let sandbox_config = spec::sandbox_config(node, pod, 0)?;
    let c = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .context("a container")?;
    let objects = ApiObjects::default();
    // The same termination message mount evlet gives every container.
    let dir = spec::container_dir(node, pod, &c.name);
    std::fs::create_dir_all(&dir)?;
    let log = dir.join(format!("{restart_count:08x}"));
    std::fs::write(&log, b"")?;
    // The same kubelet-managed /etc/hosts evlet mounts.
    let mounts: Vec<_> = evlet::sync::syncer::hosts_file(node, pod, c, pod_ip)?
        .into_iter()
        .collect();
    let config = spec::container_config(
        node,
        pod,
        c,
        &ContainerContext {
            kind: Kind::App,
            restart_count,
            pod_ip,
            objects: &objects,
            services: &[],
            termination_log: Some(&log),
            mounts: &mounts,
        },
    )?;
    let id = client
        .create_container(sandbox, config, sandbox_config)
        .await?;
    client.start_container(&id).await?;
    Ok(id)
}

/// What the floor starts, where, and how.
#[derive(Debug, Clone, Copy)]
pub struct Spec<'a> {
    /// The floor's own root directory (pod logs, managed files).
    pub root: &'a Path,
    /// The node's cgroup root for the pods.
    pub cgroup_root: &'a str,
    /// The pods' image.
    pub image: &'a str,
    /// Pods started at once.
    pub n: usize,
    /// Kill → replacement samples after the start (none in a round that
    /// only times the start).
    pub samples: usize,
    /// The wait from the start's end to the first kill: the round's
    /// [`crate::schedule::quiet_before_kills`], as evlet waits.
    pub quiet: Duration,
    /// Pods starting at most at once.
    pub parallel: usize,
    /// containerd's PID, for its CPU time over the start.
    pub containerd_pid: u32,
}

/// Starts `n` pods over CRI at once and times it (and containerd's CPU time
/// over it); then, `quiet` later, `samples` kills at that density, each
/// answered by its replacement at once and followed by a
/// [`crate::schedule::kill_gap`]. Cleans up after itself.
///
/// # Errors
/// A CRI failure (the floor pods are removed either way by [`cleanup`]).
pub async fn measure(client: &RuntimeClient, spec: &Spec<'_>) -> Result<Floor> {
    let &Spec {
        root,
        cgroup_root,
        image,
        n,
        samples,
        quiet,
        parallel,
        containerd_pid,
    } = spec;
    let node = Arc::new(NodeContext {
        node_name: NODE.into(),
        root_dir: root.to_path_buf(),
        cgroups: evlet::cm::Names::new(evlet::cm::Driver::Cgroupfs, cgroup_root),
        host_ip: None,
        memory_capacity: 1 << 30,
        ..Default::default()
    });
    let pods = pods(n, image)?;
    let cpu0 = crate::process_cpu(containerd_pid)?;
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    for pod in pods.iter().cloned() {
        let (client, node, slots) = (client.clone(), Arc::clone(&node), Arc::clone(&slots));
        set.spawn(async move {
            let _slot = slots.acquire().await;
            start_pod(&client, &node, &pod, 0).await.map(|s| (pod, s))
        });
    }
    let mut started_pods = Vec::new();
    while let Some(r) = set.join_next().await {
        started_pods.push(r??);
    }
    let start_total = started.elapsed();
    let start_containerd_cpu = crate::process_cpu(containerd_pid)?.saturating_sub(cpu0);
    let mut lat = Vec::new();
    if samples > 0 {
        tokio::time::sleep(quiet).await;
    }
    for (k, (pod, started)) in started_pods.iter().take(samples).enumerate() {
        let pid = client
            .container_pid(&started.container)
            .await?
            .context("no init pid of a floor container")?;
        let t = Instant::now();
        crate::sigkill(pid).with_context(|| format!("kill {pid}"))?;
        create_start_one(
            client,
            &node,
            pod,
            &started.sandbox,
            started.ip.as_deref(),
            1 + u32::try_from(k).unwrap_or(0),
        )
        .await?;
        lat.push(t.elapsed());
        tokio::time::sleep(crate::schedule::kill_gap()).await;
    }
    Ok(Floor {
        start_total,
        start_containerd_cpu,
        kill_replacement: Summary::of(&lat),
    })
}

/// Stops and removes the floor pods.
///
/// # Errors
/// A CRI failure.
pub async fn cleanup(client: &RuntimeClient) -> Result<()> {
    let sandboxes = client.list_pod_sandbox(SandboxFilter::new()).await?;
    for s in sandboxes.into_iter().filter(|s| {
        s.labels
            .get("io.kubernetes.pod.name")
            .is_some_and(|n| n.starts_with(PREFIX) && n.ends_with(&format!("-{NODE}")))
    }) {
        crate::remove_sandbox(client, &SandboxId::new(s.id)).await?;
    }
    Ok(())
}
