//! The batch start: N manifests written at once → every pod running, per
//! pod and in all, with the CPU the agent and containerd spent on it.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use evlet_cri::{ContainerFilter, ContainerId, RuntimeClient, api};

use crate::pods::{APP, manifest, pod_name, write_manifest};
use crate::report::Run;
use crate::{Agent, AgentKind, Endpoint, LogTail, Summary, log_time, process_cpu};

/// What a batch start needs of the node.
#[derive(Debug, Clone, Copy)]
pub struct Node<'a> {
    /// The runtime.
    pub client: &'a RuntimeClient,
    /// The pods' image.
    pub image: &'a str,
    /// containerd's PID (its CPU is measured too).
    pub containerd_pid: u32,
}

/// Writes `pods` manifests at once and waits until every pod runs.
///
/// Each pod's start is its manifest written → its container's
/// `StartContainer` returned, the end the floor times too. For evlet that
/// is its log's line (one it writes anyway); completion is watched in that
/// log, which costs evlet nothing: polling its HTTP endpoint would take its
/// CPU on the cores the runtime is starting pods on (`/metrics` reads every
/// veth's counters from `/proc/self/net/dev`, `/pods` serializes every
/// status), and the floor pays no such poll. Then `/metrics`'s running
/// containers gauge is polled every `poll` until it agrees: evlet's own
/// count of the pods running.
///
/// Upstream kubelet writes no such line at its default verbosity: its
/// `/metrics` gauge is polled every second until every container runs, and
/// each pod's start is then the runtime's record of its container's start
/// (`ContainerStatus.started_at`, read once the batch is done).
///
/// # Errors
/// If not every pod runs within 2 min + 1 s per pod, or the agent or the
/// runtime cannot be read.
pub async fn batch_start(
    agent: &Agent,
    node: Node<'_>,
    manifests: &Path,
    log: &Path,
    pods: usize,
    poll: Duration,
    run: &mut Run,
) -> Result<()> {
    let (agent0, containerd0) = (agent.cpu()?, process_cpu(node.containerd_pid)?);
    let (written, written_at) = (Instant::now(), jiff::Timestamp::now());
    for i in 0..pods {
        write_manifest(manifests, &format!("b{i}.yaml"), &manifest(i, node.image))?;
    }
    let deadline = written + Duration::from_secs(120 + pods as u64);
    let started = match agent.kind {
        AgentKind::Evlet => {
            let started = started_in_log(log, pods, poll, written, deadline).await?;
            all_running(&agent.http, pods, poll, written, deadline).await?;
            started
        }
        AgentKind::Upstream => {
            all_running(&agent.http, pods, Duration::from_secs(1), written, deadline).await?;
            started_in_runtime(node.client).await?
        }
    };
    run.start_running_s = Some(written.elapsed().as_secs_f64());
    run.start_poll_ms = poll.as_millis() as u64;
    run.start_evlet_cpu_s = Some(agent.cpu()?.saturating_sub(agent0).as_secs_f64());
    run.start_containerd_cpu_s = Some(
        process_cpu(node.containerd_pid)?
            .saturating_sub(containerd0)
            .as_secs_f64(),
    );
    let mut per_pod = Vec::with_capacity(pods);
    for i in 0..pods {
        let key = format!("default/{}", pod_name(i));
        let at = started
            .get(&key)
            .with_context(|| format!("no start of {key}'s container"))?;
        per_pod.push(Duration::try_from(at.duration_since(written_at)).unwrap_or_default());
    }
    run.start_total_s = per_pod
        .iter()
        .max()
        .copied()
        .unwrap_or_default()
        .as_secs_f64();
    run.start_per_pod = Summary::of(&per_pod);
    Ok(())
}

/// Each pod's first start (`namespace/name` → when), as evlet's log tells it.
async fn started_in_log(
    log: &Path,
    pods: usize,
    poll: Duration,
    written: Instant,
    deadline: Instant,
) -> Result<HashMap<String, jiff::Timestamp>> {
    let mut tail = LogTail::new(log);
    let mut started = HashMap::new();
    while started.len() < pods {
        tokio::time::sleep(poll).await;
        for line in tail.lines()? {
            if !line.contains("\"container started\"") {
                continue;
            }
            if let Some((pod, at)) = log_time(&line, first_start_of) {
                started.entry(pod).or_insert(at);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "only {} of {pods} containers started after {:?}",
                started.len(),
                written.elapsed()
            );
        }
    }
    Ok(started)
}

/// The pod (`namespace/name`) of a log line that tells its app container's
/// first start.
fn first_start_of(v: &serde_json::Value) -> Option<String> {
    let first_start =
        v["message"] == "container started" && v["container"] == APP && v["restart_count"] == 0;
    first_start.then(|| v["pod"].as_str().map(str::to_owned))?
}

/// Each running app container's start (`namespace/name` of its pod → when),
/// as the runtime recorded it.
async fn started_in_runtime(client: &RuntimeClient) -> Result<HashMap<String, jiff::Timestamp>> {
    use evlet::pod::labels::{POD_NAME, POD_NAMESPACE};
    let running = ContainerFilter::new().state(api::ContainerState::ContainerRunning);
    let mut started = HashMap::new();
    for c in client.list_containers(running).await? {
        if c.metadata.as_ref().is_none_or(|m| m.name != APP) {
            continue;
        }
        let (Some(ns), Some(name)) = (c.labels.get(POD_NAMESPACE), c.labels.get(POD_NAME)) else {
            continue;
        };
        let status = client
            .container_status(&ContainerId::new(c.id.clone()))
            .await?;
        let at = jiff::Timestamp::from_nanosecond(i128::from(status.started_at))?;
        started.insert(format!("{ns}/{name}"), at);
    }
    Ok(started)
}

/// Polls `kubelet_running_containers{container_state="running"}` in the
/// agent's `/metrics` every `poll` until it counts `pods`.
async fn all_running(
    http: &Endpoint,
    pods: usize,
    poll: Duration,
    written: Instant,
    deadline: Instant,
) -> Result<()> {
    loop {
        // An agent starting hundreds of pods on two cores may leave one poll
        // unanswered (upstream kubelet's `/metrics` did for 30 s at 500
        // pods): that poll counts as "not yet", up to the deadline.
        let running = match running_containers(http).await {
            Ok(n) if n >= pods => return Ok(()),
            Ok(n) => n.to_string(),
            Err(e) => format!("no answer ({e:#})"),
        };
        if Instant::now() > deadline {
            bail!(
                "/metrics: {running} of {pods} containers running after {:?}",
                written.elapsed()
            );
        }
        tokio::time::sleep(poll).await;
    }
}

/// `kubelet_running_containers{container_state="running"}` from `/metrics`;
/// 0 before the gauge has that series (upstream kubelet sets it at its first
/// relist that finds a container).
async fn running_containers(http: &Endpoint) -> Result<usize> {
    let (code, body) = http.get("/metrics").await?;
    if code != 200 {
        bail!("GET /metrics: HTTP {code}");
    }
    let text = std::str::from_utf8(&body).context("/metrics is not UTF-8")?;
    let Some(value) = text
        .lines()
        .find_map(|l| l.strip_prefix("kubelet_running_containers{container_state=\"running\"} "))
    else {
        return Ok(0);
    };
    let value: f64 = value.trim().parse().context("kubelet_running_containers")?;
    Ok(value as usize)
}
