//! PLEG modes side by side on the real runtime and kernel.
//!
//! For each pod count N and each PLEG mode (`generic`, `cri-events`, `ebpf`) this starts
//! the release `evlet` on the same private containerd with N static pods and measures:
//! 1. batch start: N manifests written → each pod's container started (evlet's log,
//!    per pod and total), and → every container running (`/metrics`);
//! 2. idle CPU of evlet (its own cgroup2 `cpu.stat`) and of containerd (`/proc/<pid>/stat`)
//!    over a fixed window with N pods running, and evlet's RSS;
//! 3. container kills at random pods: SIGKILL of the init process (the ground truth)
//!    → the PLEG's ContainerDied event (evlet's JSON log) and → `/pods/<ns>/<name>`
//!    showing the container terminated, next to → CRI `ContainerStatus` reporting
//!    EXITED (polled every 1 ms: the floor of any agent that reads the runtime),
//!    and → the pod's replacement container running (`restartPolicy: Always`);
//!    every other kill is unobserved (nothing polls): kill → the replacement's
//!    `StartContainer` returned, from evlet's timeline, as the floor times it;
//! 4. OOM kills (10, one pod each): the kernel's first OOM message on `/dev/kmsg` (the
//!    head of its report, `invoked oom-killer`) → `OOMKilled` in the pod status, and
//!    (in `ebpf`) the victim's exit as the kernel recorded it → `OOMKilled`: the
//!    agent's part, without the kernel's teardown of the victim;
//! 5. once per N, the CRI status calls a relist makes (PodSandboxStatus + ContainerStatus)
//!    against the N real pods: calls/s and latency, one at a time and 8 in flight;
//! 6. once per N, before the agents, the runtime's floor (`evlet_bench::floor`):
//!    N pods started straight over CRI with evlet's configs and parallelism, and
//!    SIGKILL → replacement created and started at that density (the floor of
//!    kill → replacement).
//!
//! Small pod counts run in rounds (`--rounds`; 5 at 10 pods): the floor and
//! every mode again with fresh agents and pods, the samples pooled and the
//! starts' medians taken, since one 10-pod run gives one start of a second
//! and five kills of each kind.
//!
//! Output: `<out>/<timestamp>.json` (with every sample), `.md` (tables with ratios
//! against `ebpf`) and `.png`; full runs also refresh `latest.*`.
//!
//! Run it through xtask, which sets up the machine and the containerd 1.7 node:
//!
//! ```sh
//! cargo xtask bench                       # N = 10,100,500,1000, all modes
//! cargo xtask bench --quick               # N = 10, short windows: checks the harness
//! cargo xtask bench --pods 100 --modes generic,ebpf
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use evlet_bench::floor;
use evlet_bench::report::{self, CriCalls, Floor, Machine, Results, Run};
use evlet_bench::{
    Agent, AgentSpec, Endpoint, NODE, Summary, pleg_events, process_cpu, rss_mib, run_delay,
};
use evlet_cri::{
    ContainerFilter, ContainerId, Options, RuntimeClient, SandboxFilter, SandboxId, api,
};

#[derive(Debug, Parser)]
struct Args {
    /// Pod counts (`cargo xtask bench` passes its defaults).
    #[arg(long, value_delimiter = ',', required = true)]
    pods: Vec<usize>,
    /// PLEG modes, in order; the first also measures the CRI calls.
    #[arg(long, value_delimiter = ',', required = true)]
    modes: Vec<String>,
    /// N = 10 and short windows: proves the harness works, numbers are not comparable.
    #[arg(long)]
    quick: bool,
    /// The evlet binary.
    #[arg(long, env = "EVLET_BIN")]
    evlet: PathBuf,
    /// The build profile of that binary (for the report).
    #[arg(long, default_value = "release")]
    profile: String,
    /// Where results go.
    #[arg(long)]
    out: PathBuf,
    /// Scratch space (manifests, agent root, logs).
    #[arg(long)]
    work: PathBuf,
    /// The command line to print in the report.
    #[arg(long, default_value = "cargo xtask bench")]
    command: String,
    /// Container kills per run.
    #[arg(long)]
    kills: Option<usize>,
    /// OOM kills per run (one pod each).
    #[arg(long)]
    ooms: Option<usize>,
    /// Idle window per run, seconds.
    #[arg(long)]
    idle: Option<u64>,
    /// Rounds at each pod count, each with the floor and every mode afresh
    /// (new agents, new pods), pooled into one result: more samples where one
    /// run gives few. Default: 50 ÷ pods, from 1 to 5 (5 at 10 pods); 1 with
    /// `--quick`.
    #[arg(long)]
    rounds: Option<usize>,
    /// Pods started at once, by evlet (`--max-parallel-pod-starts`) and by the floor.
    #[arg(long, default_value_t = evlet::config::DEFAULT_PARALLEL_POD_STARTS)]
    parallel_pod_starts: usize,
}

/// The node the xtask brought up (its `node.env`).
#[derive(Debug, Clone)]
struct Node {
    endpoint: String,
    cgroup_root: String,
    image: String,
    containerd_pid: u32,
}

impl Node {
    fn from_env() -> Result<Self> {
        let var = |k: &str| {
            std::env::var(k)
                .with_context(|| format!("{k} is not set: run through `cargo xtask bench`"))
        };
        let dir = PathBuf::from(var("EVLET_NODE_DIR")?);
        let pid_file = dir.join("containerd.pid");
        let containerd_pid = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("reading {}", pid_file.display()))?
            .trim()
            .parse()
            .context("containerd pid file")?;
        Ok(Self {
            endpoint: var("EVLET_CRI_ENDPOINT")?,
            cgroup_root: format!("{}/bench", var("EVLET_CGROUP_ROOT")?),
            image: var("EVLET_TEST_IMAGE")?,
            containerd_pid,
        })
    }
}

/// Durations of the phases.
#[derive(Debug, Clone, Copy)]
struct Plan {
    kills: usize,
    ooms: usize,
    idle: Duration,
    settle: Duration,
    cri_window: Duration,
    poll: Duration,
}

const ADDRESS: &str = "127.0.0.1:10256";
const APP: &str = "app";

fn pod_name(i: usize) -> String {
    format!("b{i}-{NODE}")
}

fn manifest(i: usize, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: b{i}}}\nspec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: {APP}\n    image: {image}\n    command: [/bin/sleep, '86400']\n"
    )
}

fn oom_manifest(k: usize, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: oom{k}}}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: hog\n    image: {image}\n    command: [/bin/sh, -c, 'sleep 1; exec /bin/memhog 256']\n    resources: {{limits: {{memory: 64Mi}}}}\n"
    )
}

fn write_manifest(dir: &Path, name: &str, yaml: &str) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, yaml)?;
    std::fs::rename(&tmp, dir.join(name))?;
    Ok(())
}

/// The first container status of a pod JSON.
fn first_container(pod: &serde_json::Value) -> &serde_json::Value {
    &pod["status"]["containerStatuses"][0]
}

/// Polls one pod until `done` holds; the time it took, or `None` after `limit`.
async fn poll_pod(
    http: &Endpoint,
    name: &str,
    every: Duration,
    limit: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(pod)) = http.json(&format!("/pods/default/{name}")).await
            && done(&pod)
        {
            return Some(Instant::now());
        }
        tokio::time::sleep(every).await;
    }
    None
}

/// Writes N manifests at once and waits until every pod runs.
///
/// Each pod's start is its manifest written → its container's
/// `StartContainer` returned, from evlet's log (the line it writes anyway),
/// the end the floor times too. Completion is watched in that log, which
/// costs evlet nothing: polling its HTTP endpoint would take its CPU on the
/// cores the runtime is starting pods on (`/metrics` reads every veth's
/// counters from `/proc/self/net/dev`, `/pods` serializes every status), and
/// the floor pays no such poll. Then `/metrics`'s running containers gauge
/// is polled until it agrees: evlet's own count of the pods running.
async fn batch_start(
    agent: &Agent,
    manifests: &Path,
    log: &Path,
    node: &Node,
    pods: usize,
    plan: Plan,
    run: &mut Run,
) -> Result<()> {
    let (evlet0, containerd0) = (agent.cpu()?, process_cpu(node.containerd_pid)?);
    let (written, written_at) = (Instant::now(), jiff::Timestamp::now());
    for i in 0..pods {
        write_manifest(manifests, &format!("b{i}.yaml"), &manifest(i, &node.image))?;
    }
    let deadline = written + Duration::from_secs(120 + pods as u64);
    // Each pod's first start, as the tail reads the log.
    let mut tail = evlet_bench::LogTail::new(log);
    let mut started = std::collections::HashMap::new();
    while started.len() < pods {
        tokio::time::sleep(plan.poll).await;
        for line in tail.lines()? {
            if !line.contains("\"container started\"") {
                continue;
            }
            if let Some((pod, at)) = evlet_bench::log_time(&line, first_start_of) {
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
    loop {
        let running = running_containers(&agent.http).await?;
        if running >= pods {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "/metrics shows {running} of {pods} containers running after {:?}",
                written.elapsed()
            );
        }
        tokio::time::sleep(plan.poll).await;
    }
    run.start_running_s = Some(written.elapsed().as_secs_f64());
    run.start_poll_ms = plan.poll.as_millis() as u64;
    run.start_evlet_cpu_s = Some(agent.cpu()?.saturating_sub(evlet0).as_secs_f64());
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
            .with_context(|| format!("no `container started` line for {key} in the log"))?;
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

/// The pod (`namespace/name`) of a log line that tells its app container's
/// first start.
fn first_start_of(v: &serde_json::Value) -> Option<String> {
    let first_start =
        v["message"] == "container started" && v["container"] == APP && v["restart_count"] == 0;
    first_start.then(|| v["pod"].as_str().map(str::to_owned))?
}

/// `kubelet_running_containers{container_state="running"}` from `/metrics`.
async fn running_containers(http: &Endpoint) -> Result<usize> {
    let (code, body) = http.get("/metrics").await?;
    if code != 200 {
        bail!("GET /metrics: HTTP {code}");
    }
    let text = std::str::from_utf8(&body).context("/metrics is not UTF-8")?;
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix("kubelet_running_containers{container_state=\"running\"} "))
        .context("/metrics has no kubelet_running_containers{container_state=\"running\"}")?;
    let value: f64 = value.trim().parse().context("kubelet_running_containers")?;
    Ok(value as usize)
}

/// CPU of evlet and containerd over the idle window, and evlet's RSS at its end.
async fn idle(agent: &Agent, node: &Node, plan: Plan, run: &mut Run) -> Result<()> {
    tokio::time::sleep(plan.settle).await;
    let (e0, c0, t0) = (
        agent.cpu()?,
        process_cpu(node.containerd_pid)?,
        Instant::now(),
    );
    tokio::time::sleep(plan.idle).await;
    let (e1, c1, window) = (
        agent.cpu()?,
        process_cpu(node.containerd_pid)?,
        t0.elapsed(),
    );
    let pct = |a: Duration, b: Duration| {
        (b.saturating_sub(a)).as_secs_f64() / window.as_secs_f64() * 100.0
    };
    run.idle_window_s = window.as_secs_f64();
    run.evlet_cpu_pct = pct(e0, e1);
    run.containerd_cpu_pct = pct(c0, c1);
    run.evlet_rss_mib = rss_mib(agent.pid)?;
    Ok(())
}

/// Kills the app container of random distinct pods; returns (container ID, kill
/// wall time) for the event lookup and records kill → status.
///
/// The kills alternate between *observed* ones (the pod is polled every 1 ms
/// in `/pods`, until the status shows the kill and then until the replacement
/// runs, and its container over CRI: kill → status, → CRI exited,
/// → replacement running) and *unobserved* ones, where nothing polls while
/// the agent replaces the container: kill → replacement started is then read
/// from the agent's timeline, as the floor times it (a 1 ms CRI poll loads
/// the runtime while it creates and starts the replacement; the floor has none).
async fn kills(
    agent: &Agent,
    client: &RuntimeClient,
    pods: usize,
    plan: Plan,
    run: &mut Run,
) -> Result<Vec<(String, SystemTime)>> {
    let mut order: Vec<usize> = (0..pods).collect();
    fastrand::shuffle(&mut order);
    let mut killed = Vec::new();
    let mut to_status = Vec::new();
    let mut to_runtime = Vec::new();
    let mut to_replacement = Vec::new();
    let mut to_started = Vec::new();
    const LIMIT: Duration = Duration::from_secs(15);
    for (k, i) in order.into_iter().take(plan.kills * 2).enumerate() {
        let name = pod_name(i);
        let Some((id, pid)) = app_container(agent, client, &name, run).await? else {
            continue;
        };
        if k % 2 == 1 {
            match unobserved_kill(agent, &name, &id, pid, LIMIT).await {
                Ok(took) => to_started.push(took),
                Err(e) => run.errors.push(format!("{name}: {e:#}")),
            }
            tokio::time::sleep(Duration::from_millis(fastrand::u64(100..600))).await;
            continue;
        }
        let delay0 = Waits::now(agent.pid);
        let wall = SystemTime::now();
        let sent = Instant::now();
        if evlet_bench::sigkill(pid).is_err() {
            run.errors.push(format!("{name}: kill {pid} failed"));
            continue;
        }
        let cid = ContainerId::new(id.clone());
        // The kill shows as the old container terminated, or (once the
        // replacement runs) as its last state.
        let in_status = poll_pod(&agent.http, &name, Duration::from_millis(1), LIMIT, |p| {
            let c = first_container(p);
            (c["state"]["terminated"].is_object()
                && c["containerID"].as_str().is_some_and(|s| s.ends_with(&id)))
                || c["lastState"]["terminated"]["containerID"]
                    .as_str()
                    .is_some_and(|s| s.ends_with(&id))
        });
        let replaced = poll_pod(&agent.http, &name, Duration::from_millis(1), LIMIT, |p| {
            let c = first_container(p);
            c["state"]["running"].is_object()
                && c["containerID"].as_str().is_some_and(|s| !s.ends_with(&id))
        });
        // The floor any CRI-based agent has: when the runtime itself reports the exit.
        let in_runtime = async {
            while sent.elapsed() < LIMIT {
                if let Ok(c) = client.container_status(&cid).await
                    && c.state == api::ContainerState::ContainerExited as i32
                {
                    return Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            None
        };
        // The replacement is polled once the status has shown the kill, so that
        // the bench's own requests to the agent do not double while it is timed.
        let in_agent = async {
            let seen = in_status.await;
            let waited = delay0.since(agent.pid);
            (seen, waited, replaced.await)
        };
        let ((seen, waited, replacement), runtime) = tokio::join!(in_agent, in_runtime);
        if let Some(at) = seen {
            slow_timeline(agent, &name, "kill", wall, at - sent, waited, run).await;
        }
        match replacement {
            Some(at) => to_replacement.push(at - sent),
            None => run
                .errors
                .push(format!("{name}: no replacement running after {LIMIT:?}")),
        }
        match seen {
            Some(at) => to_status.push(at - sent),
            None => run
                .errors
                .push(format!("{name}: kill not in status after {LIMIT:?}")),
        }
        match runtime {
            Some(at) => to_runtime.push(at - sent),
            None => run
                .errors
                .push(format!("{name}: CRI never reported the exit")),
        }
        killed.push((id, wall));
        // Random phase against any periodic relist.
        tokio::time::sleep(Duration::from_millis(fastrand::u64(100..600))).await;
    }
    run.kill_to_status = Summary::of(&to_status);
    run.kill_to_runtime = Summary::of(&to_runtime);
    run.kill_to_replacement = Summary::of(&to_replacement);
    run.kill_to_started = Summary::of(&to_started);
    Ok(killed)
}

/// The ID and init PID of `name`'s app container (None, with the error
/// recorded, when the pod or its container cannot be found).
async fn app_container(
    agent: &Agent,
    client: &RuntimeClient,
    name: &str,
    run: &mut Run,
) -> Result<Option<(String, u32)>> {
    let Some(pod) = agent.http.json(&format!("/pods/default/{name}")).await? else {
        run.errors.push(format!("{name}: not in /pods"));
        return Ok(None);
    };
    let Some(id) = first_container(&pod)["containerID"]
        .as_str()
        .map(|s| s.trim_start_matches("containerd://").to_owned())
    else {
        run.errors.push(format!("{name}: no container ID"));
        return Ok(None);
    };
    let Some(pid) = client.container_pid(&ContainerId::new(id.clone())).await? else {
        run.errors.push(format!("{name}: no init pid"));
        return Ok(None);
    };
    Ok(Some((id, pid)))
}

/// SIGKILL of `name`'s container `id` (init `pid`) with nothing polling the
/// agent or the runtime; then, from the pod's timeline, the time from the
/// kill to the agent's `StartContainer` of the replacement returning (what
/// the floor times: kill → create and start returned).
async fn unobserved_kill(
    agent: &Agent,
    name: &str,
    id: &str,
    pid: u32,
    limit: Duration,
) -> Result<Duration> {
    let wall = SystemTime::now();
    let sent = Instant::now();
    evlet_bench::sigkill(pid).with_context(|| format!("kill {pid}"))?;
    let from = wall.duration_since(SystemTime::UNIX_EPOCH)?.as_nanos();
    let short = id.get(..12).unwrap_or(id);
    loop {
        // Well after an ebpf replacement; a generic one is read a few polls later.
        tokio::time::sleep(Duration::from_millis(250)).await;
        // Timelines are kept for the 256 pods touched last: at higher densities
        // a pod idle since its start has none until the agent notices the kill.
        let timeline = agent
            .http
            .json(&format!("/debug/pods/default/{name}/timeline"))
            .await?;
        let started = timeline.as_ref().and_then(|t| {
            first_entry(t, "cri", from, |what| {
                what.starts_with("StartContainer ")
                    && what.contains(": ok in ")
                    && !what.contains(short)
            })
        });
        if let Some(ns) = started {
            let took = u64::try_from(u128::from(ns) - from).context("a time past u64")?;
            return Ok(Duration::from_nanos(took));
        }
        if sent.elapsed() > limit {
            bail!("no replacement started {limit:?} after an unobserved kill");
        }
    }
}

/// How long the agent's threads and the bench's own had waited for a CPU
/// (schedstat `run_delay`, summed over threads), to tell which side a slow
/// status waited on: a poll is answered only when both get a CPU.
#[derive(Debug, Clone, Copy)]
struct Waits {
    agent: Option<Duration>,
    bench: Option<Duration>,
}

impl Waits {
    fn now(agent: u32) -> Self {
        Self {
            agent: run_delay(agent).ok(),
            bench: run_delay(std::process::id()).ok(),
        }
    }

    /// The waits from `self` to now.
    fn since(self, agent: u32) -> Self {
        let now = Self::now(agent);
        let d = |a: Option<Duration>, b: Option<Duration>| Some(b?.saturating_sub(a?));
        Self {
            agent: d(self.agent, now.agent),
            bench: d(self.bench, now.bench),
        }
    }
}

/// Keeps the timeline of a kill (or OOM kill) whose status took `took`,
/// from `at` (the kill) to the status, when it was slower than
/// [`report::SLOW_MS`]: which part of the agent the time went to, and how
/// long (`waited`) the agent's threads and the bench's waited for a CPU
/// meanwhile.
async fn slow_timeline(
    agent: &Agent,
    name: &str,
    what: &str,
    at: SystemTime,
    took: Duration,
    waited: Waits,
    run: &mut Run,
) {
    let ms = took.as_secs_f64() * 1000.0;
    if ms <= report::SLOW_MS {
        return;
    }
    let start = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    let end = start + took.as_nanos() as i64 + 5_000_000;
    let entries = match agent
        .http
        .json(&format!("/debug/pods/default/{name}/timeline"))
        .await
    {
        Ok(Some(t)) => t["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let ns = e["unixNs"].as_i64()?;
                (ns >= start - 1_000_000 && ns <= end).then(|| {
                    format!(
                        "{:+.1} {} {}",
                        (ns - start) as f64 / 1e6,
                        e["source"].as_str().unwrap_or("?"),
                        e["what"].as_str().unwrap_or("")
                    )
                })
            })
            .collect::<Vec<_>>()
            .join("; "),
        Ok(None) => "no timeline".to_owned(),
        Err(e) => format!("timeline: {e:#}"),
    };
    let ms_of = |d: Option<Duration>| {
        d.map_or("?".to_owned(), |d| {
            format!("{:.1}", d.as_secs_f64() * 1000.0)
        })
    };
    let waited = format!(
        "; meanwhile evlet's threads waited {} ms in all for a CPU, the bench's {} ms",
        ms_of(waited.agent),
        ms_of(waited.bench)
    );
    run.slow
        .push(format!("{what} {name} {ms:.1} ms: {entries}{waited}"));
}

/// When the kernel recorded the exit of `name`'s container init, from the
/// pod's timeline (its kernel time converted to wall time by the agent): the
/// first such exit after `after`, less a millisecond for the clocks' rounding;
/// with it, when the agent published the `OOMKilled` status after that exit
/// (the timeline's first such status entry), if it did. None in the modes
/// without kernel records.
async fn kernel_exit_and_status(
    agent: &Agent,
    name: &str,
    after: SystemTime,
) -> Option<(SystemTime, Option<SystemTime>)> {
    let from = after
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?
        .as_nanos()
        .saturating_sub(1_000_000);
    let timeline = agent
        .http
        .json(&format!("/debug/pods/default/{name}/timeline"))
        .await
        .ok()??;
    let exit = first_entry(&timeline, "kernel", from, |w| w.contains("exited"))?;
    let status = first_entry(&timeline, "status", u128::from(exit), |w| {
        w.contains("OOMKilled")
    });
    let at = |ns: u64| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns);
    Some((at(exit), status.map(at)))
}

/// The time (Unix ns) of the first entry of a pod's `timeline` from `source`
/// at or after `from` whose text passes `what`.
fn first_entry(
    timeline: &serde_json::Value,
    source: &str,
    from: u128,
    what: impl Fn(&str) -> bool,
) -> Option<u64> {
    timeline["entries"]
        .as_array()?
        .iter()
        .filter(|e| e["source"] == source && e["what"].as_str().is_some_and(&what))
        .filter_map(|e| u64::try_from(e["unixNs"].as_i64()?).ok())
        .find(|&ns| u128::from(ns) >= from)
}

/// Waits on `/dev/kmsg` for the kernel's first OOM message about `comm`
/// (`<comm> invoked oom-killer`, which heads the report the kernel prints
/// before it picks and kills a victim; or the kill's own line): when it
/// came, with the CPU waits of `agent` and the bench at that moment.
fn kmsg_oom(
    comm: &'static str,
    agent: u32,
) -> Result<tokio::sync::oneshot::Receiver<(Instant, Waits)>> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut kmsg = std::fs::File::open("/dev/kmsg").context("opening /dev/kmsg")?;
    kmsg.seek(SeekFrom::End(0))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 8192];
        // One record per read; ends when the message comes (or the process does).
        while let Ok(n) = kmsg.read(&mut buf) {
            let record = String::from_utf8_lossy(&buf[..n]);
            if record.contains(comm)
                && (record.contains("Killed process") || record.contains("oom-kill"))
            {
                let _ = tx.send((Instant::now(), Waits::now(agent)));
                return;
            }
        }
    });
    Ok(rx)
}

/// `plan.ooms` OOM kills, one pod after the other (each left exited). The
/// hog starts a second after its container, so the OOM strikes a running
/// container: one that strikes while the runtime's StartContainer call is
/// still out is published when that sync ends (tens of ms at 500 pods).
async fn oom(
    agent: &Agent,
    manifests: &Path,
    node: &Node,
    plan: Plan,
    run: &mut Run,
) -> Result<()> {
    let mut lat = Vec::new();
    let mut from_exit = Vec::new();
    let mut published = Vec::new();
    for k in 0..plan.ooms {
        let killed = kmsg_oom("memhog", agent.pid)?;
        write_manifest(
            manifests,
            &format!("oom{k}.yaml"),
            &oom_manifest(k, &node.image),
        )?;
        let name = format!("oom{k}-{NODE}");
        let seen = poll_pod(
            &agent.http,
            &name,
            Duration::from_millis(1),
            Duration::from_secs(60),
            |p| first_container(p)["state"]["terminated"]["reason"] == "OOMKilled",
        )
        .await;
        let kernel = tokio::time::timeout(Duration::from_secs(1), killed).await;
        match (seen, kernel) {
            (Some(seen), Ok(Ok((kernel, waits)))) => {
                let waited = waits.since(agent.pid);
                let took = seen.saturating_duration_since(kernel);
                lat.push(took);
                let at = SystemTime::now() - kernel.elapsed();
                let seen_at = SystemTime::now() - seen.elapsed();
                if let Some((exit, status)) = kernel_exit_and_status(agent, &name, at).await {
                    from_exit.push(seen_at.duration_since(exit).unwrap_or_default());
                    if let Some(status) = status {
                        published.push(status.duration_since(exit).unwrap_or_default());
                    }
                }
                slow_timeline(agent, &name, "OOM kill", at, took, waited, run).await;
            }
            (None, _) => run
                .errors
                .push(format!("{name}: OOMKilled not in status after 60 s")),
            (_, _) => run
                .errors
                .push(format!("{name}: no OOM message on /dev/kmsg")),
        }
    }
    run.oom_to_status = Summary::of(&lat);
    run.oom_exit_to_status = Summary::of(&from_exit);
    run.oom_exit_to_published = Summary::of(&published);
    run.oom_to_status_ms = run.oom_to_status.as_ref().map(|s| s.p50_ms);
    Ok(())
}

/// Kill → ContainerDied from evlet's log.
fn events(log: &Path, killed: &[(String, SystemTime)], run: &mut Run) -> Result<()> {
    let seen = pleg_events(log, "ContainerDied")?;
    let mut lat = Vec::new();
    for (id, wall) in killed {
        let Some(at) = seen.get(id) else {
            run.errors.push(format!(
                "no ContainerDied event for {}",
                &id[..12.min(id.len())]
            ));
            continue;
        };
        let sent = jiff::Timestamp::try_from(*wall)?;
        let d = at.duration_since(sent);
        lat.push(Duration::try_from(d).unwrap_or_default());
    }
    run.kill_to_event = Summary::of(&lat);
    Ok(())
}

/// PodSandboxStatus + ContainerStatus against the running pods.
async fn cri_calls(client: &RuntimeClient, pods: usize, window: Duration) -> Result<CriCalls> {
    let containers = client.list_containers(ContainerFilter::new()).await?;
    let pairs: Arc<Vec<(SandboxId, ContainerId)>> = Arc::new(
        containers
            .into_iter()
            .filter(|c| {
                c.labels
                    .get("io.kubernetes.pod.name")
                    .is_some_and(|n| n.ends_with(&format!("-{NODE}")))
            })
            .map(|c| (SandboxId::new(c.pod_sandbox_id), ContainerId::new(c.id)))
            .collect(),
    );
    if pairs.is_empty() {
        bail!("no bench containers to query");
    }
    let one = |client: RuntimeClient, pairs: Arc<Vec<(SandboxId, ContainerId)>>| async move {
        let mut lat = Vec::new();
        let start = Instant::now();
        while start.elapsed() < window {
            let (s, c) = &pairs[fastrand::usize(..pairs.len())];
            let t = Instant::now();
            client.pod_sandbox_status(s, false).await?;
            client.container_status(c).await?;
            lat.push(t.elapsed());
        }
        anyhow::Ok((lat, start.elapsed()))
    };
    let (lat, took) = one(client.clone(), Arc::clone(&pairs)).await?;
    let sequential = 2.0 * lat.len() as f64 / took.as_secs_f64();
    let mut set = tokio::task::JoinSet::new();
    let start = Instant::now();
    for _ in 0..8 {
        set.spawn(one(client.clone(), Arc::clone(&pairs)));
    }
    let mut calls = 0;
    while let Some(r) = set.join_next().await {
        calls += 2 * r??.0.len();
    }
    Ok(CriCalls {
        pods,
        sequential_calls_per_s: sequential,
        pair_latency: Summary::of(&lat),
        concurrent8_calls_per_s: calls as f64 / start.elapsed().as_secs_f64(),
    })
}

/// Stops and removes every sandbox of the benchmark's node.
async fn cleanup(client: &RuntimeClient) -> Result<()> {
    let sandboxes = client.list_pod_sandbox(SandboxFilter::new()).await?;
    let ids: Vec<SandboxId> = sandboxes
        .into_iter()
        .filter(|s| {
            s.labels
                .get("io.kubernetes.pod.name")
                .is_some_and(|n| n.ends_with(&format!("-{NODE}")))
        })
        .map(|s| SandboxId::new(s.id))
        .collect();
    for chunk in ids.chunks(8) {
        let mut set = tokio::task::JoinSet::new();
        for id in chunk {
            let (client, id) = (client.clone(), id.clone());
            set.spawn(async move { evlet_bench::remove_sandbox(&client, &id).await });
        }
        while let Some(r) = set.join_next().await {
            r??;
        }
    }
    Ok(())
}

/// Removes the pod cgroups the runtime left of the removed pods (the floor's
/// and the last run's), so the next timed start finds the node as it was.
async fn remove_pod_cgroups(ctx: &Ctx) -> Result<()> {
    let removed = evlet_bench::remove_pod_cgroups(&ctx.node.cgroup_root).await?;
    if removed > 0 {
        eprintln!("bench: removed {removed} pod cgroups left by removed pods");
    }
    Ok(())
}

struct Ctx {
    args: Args,
    node: Node,
    client: RuntimeClient,
    plan: Plan,
}

/// One mode at one pod count, in round `round`: only the first round
/// measures the idle window (and, if `measure_cri`, the CRI calls).
async fn one(
    ctx: &Ctx,
    mode: &str,
    pods: usize,
    round: usize,
    measure_cri: bool,
) -> Result<(Run, Option<CriCalls>)> {
    let manifests = ctx.args.work.join("manifests");
    let root = ctx.args.work.join("root");
    for d in [&manifests, &root] {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d)?;
    }
    let log = ctx.args.work.join(match round {
        0 => format!("evlet-{mode}-{pods}.log"),
        k => format!("evlet-{mode}-{pods}-round{k}.log"),
    });
    let spec = AgentSpec {
        binary: ctx.args.evlet.clone(),
        mode: mode.to_owned(),
        manifests: manifests.clone(),
        root,
        endpoint: ctx.node.endpoint.clone(),
        cgroup_root: ctx.node.cgroup_root.clone(),
        address: ADDRESS.into(),
        log: log.clone(),
        extra: vec![
            "--max-parallel-pod-starts".into(),
            ctx.args.parallel_pod_starts.to_string(),
        ],
    };
    let mut run = Run {
        mode: mode.to_owned(),
        pods,
        ..Run::default()
    };
    eprintln!("bench: {mode} with {pods} pods: starting");
    let agent = Agent::start(&spec).await?;
    let measured = async {
        batch_start(
            &agent, &manifests, &log, &ctx.node, pods, ctx.plan, &mut run,
        )
        .await?;
        eprintln!(
            "bench: {mode} with {pods} pods: all running after {:.1}s{}",
            run.start_total_s,
            if round == 0 { "; idle window" } else { "" }
        );
        if round == 0 {
            idle(&agent, &ctx.node, ctx.plan, &mut run).await?;
        } else {
            tokio::time::sleep(ctx.plan.settle).await;
        }
        eprintln!("bench: {mode} with {pods} pods: kills");
        let killed = kills(&agent, &ctx.client, pods, ctx.plan, &mut run).await?;
        oom(&agent, &manifests, &ctx.node, ctx.plan, &mut run).await?;
        anyhow::Ok(killed)
    }
    .await;
    agent.stop().await?;
    let killed =
        measured.with_context(|| format!("{mode} with {pods} pods (log {})", log.display()))?;
    events(&log, &killed, &mut run)?;
    let cri = if measure_cri && round == 0 {
        Some(cri_calls(&ctx.client, pods, ctx.plan.cri_window).await?)
    } else {
        None
    };
    Ok((run, cri))
}

fn machine(containerd: String, profile: &str) -> Machine {
    let memory_kib: f64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| {
                l.strip_prefix("MemTotal:")?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0.0);
    Machine {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory_gib: memory_kib / 1024.0 / 1024.0,
        containerd,
        evlet_profile: profile.to_owned(),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.quick {
        args.pods = vec![10];
    }
    let plan = if args.quick {
        Plan {
            kills: args.kills.unwrap_or(3),
            ooms: args.ooms.unwrap_or(1),
            idle: Duration::from_secs(args.idle.unwrap_or(3)),
            settle: Duration::from_secs(1),
            cri_window: Duration::from_secs(1),
            poll: Duration::from_millis(100),
        }
    } else {
        Plan {
            kills: args.kills.unwrap_or(30),
            ooms: args.ooms.unwrap_or(10),
            idle: Duration::from_secs(args.idle.unwrap_or(120)),
            settle: Duration::from_secs(5),
            cri_window: Duration::from_secs(10),
            poll: Duration::from_millis(100),
        }
    };
    let node = Node::from_env()?;
    // The floor starts every pod at once: at 500 pods containerd answers some
    // RunPodSandbox calls after more than the agent's 2 min deadline. The floor
    // measures the runtime, so its calls wait as long as the runtime takes.
    let options = Options {
        request_timeout: Duration::from_secs(900),
        ..Options::default()
    };
    let client = RuntimeClient::connect(&node.endpoint, options)?;
    let version = client.version().await?;
    std::fs::create_dir_all(&args.work)?;
    std::fs::create_dir_all(&args.out)?;
    let started = jiff::Timestamp::now();
    let mut results = Results {
        started: started.strftime("%Y-%m-%d %H:%M UTC").to_string(),
        command: args.command.clone(),
        quick: args.quick,
        machine: machine(
            format!("{} {}", version.runtime_name, version.runtime_version),
            &args.profile,
        ),
        runs: Vec::new(),
        cri: Vec::new(),
        floors: Vec::new(),
        parallel_pod_starts: Some(args.parallel_pod_starts),
        failure: None,
    };
    let ctx = Ctx {
        args,
        node,
        client,
        plan,
    };
    cleanup(&ctx.client).await?;
    floor::cleanup(&ctx.client).await?;
    remove_pod_cgroups(&ctx).await?;
    let stem = ctx
        .args
        .out
        .join(started.strftime("%Y%m%dT%H%M%SZ").to_string());
    for &pods in &ctx.args.pods {
        if let Err(err) = measure_count(&ctx, pods, &mut results).await {
            // What was measured before the failure is kept.
            results.failure = Some(format!("{pods} pods: {err:#}"));
            write(&results, &stem)?;
            eprintln!(
                "bench: partial results in {}.{{json,md,png}}",
                stem.display()
            );
            return Err(err);
        }
        // Each finished pod count is on disk at once: a later failure keeps it.
        write(&results, &stem)?;
    }
    if !results.quick {
        for ext in ["json", "md", "png"] {
            std::fs::copy(
                stem.with_extension(ext),
                ctx.args.out.join(format!("latest.{ext}")),
            )?;
        }
    }
    println!("{}", report::markdown(&results));
    eprintln!("bench: results in {}.{{json,md,png}}", stem.display());
    let errors: usize = results.runs.iter().map(|r| r.errors.len()).sum();
    if errors > 0 {
        bail!("{errors} measurement(s) failed; see the errors in the report");
    }
    Ok(())
}

/// Writes the results so far as `<stem>.{json,md,png}`.
fn write(results: &Results, stem: &Path) -> Result<()> {
    std::fs::write(
        stem.with_extension("json"),
        serde_json::to_string_pretty(results)?,
    )?;
    std::fs::write(stem.with_extension("md"), report::markdown(results))?;
    report::chart(results, &stem.with_extension("png"))
}

/// The floor and every mode at one pod count, in as many rounds as the
/// count has; each pod count's results go into `results` when done.
async fn measure_count(ctx: &Ctx, pods: usize, results: &mut Results) -> Result<()> {
    let rounds = if ctx.args.quick {
        1
    } else {
        ctx.args.rounds.unwrap_or((50 / pods.max(1)).clamp(1, 5))
    };
    let mut floors = Vec::new();
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); ctx.args.modes.len()];
    let measured = async {
        for round in 0..rounds {
            if rounds > 1 {
                eprintln!("bench: {pods} pods, round {} of {rounds}", round + 1);
            }
            floors.push(floor_round(ctx, pods).await?);
            for (k, mode) in ctx.args.modes.iter().enumerate() {
                let (run, cri) = match one(ctx, mode, pods, round, k == 0).await {
                    Ok(done) => done,
                    Err(err) => {
                        eprintln!("bench: cleaning up after the failure");
                        let _ = cleanup(&ctx.client).await;
                        return Err(err);
                    }
                };
                results.cri.extend(cri);
                runs[k].push(run);
                cleanup(&ctx.client)
                    .await
                    .with_context(|| format!("removing the pods of {mode} with {pods} pods"))?;
                remove_pod_cgroups(ctx).await?;
            }
        }
        anyhow::Ok(())
    }
    .await;
    // The rounds done so far count even when a later one failed.
    results.floors.extend(Floor::merge(floors));
    results.runs.extend(runs.into_iter().filter_map(Run::merge));
    measured
}

/// The runtime's floor with `pods` pods, once.
async fn floor_round(ctx: &Ctx, pods: usize) -> Result<Floor> {
    eprintln!("bench: the runtime's floor with {pods} pods");
    let floor_root = ctx.args.work.join("floor-root");
    let spec = floor::Spec {
        root: &floor_root,
        cgroup_root: &ctx.node.cgroup_root,
        image: &ctx.node.image,
        n: pods,
        samples: ctx.plan.kills.min(pods),
        parallel: ctx.args.parallel_pod_starts,
        containerd_pid: ctx.node.containerd_pid,
    };
    let measured = floor::measure(&ctx.client, &spec).await;
    floor::cleanup(&ctx.client).await?;
    let measured = measured.context("the CRI-only floor")?;
    remove_pod_cgroups(ctx).await?;
    eprintln!(
        "bench: floor with {pods} pods: all started after {:.1}s",
        measured.start_total.as_secs_f64()
    );
    Ok(Floor {
        pods,
        start_total_s: measured.start_total.as_secs_f64(),
        start_total_rounds_s: Vec::new(),
        start_containerd_cpu_s: Some(measured.start_containerd_cpu.as_secs_f64()),
        create_start: None,
        kill_replacement: measured.kill_replacement,
    })
}
