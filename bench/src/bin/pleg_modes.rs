//! PLEG modes side by side on the real runtime and kernel.
//!
//! For each pod count N and each PLEG mode (`generic`, `cri-events`, `ebpf`) this starts
//! the release `evlet` on the same private containerd with N static pods and measures:
//! 1. batch start: N manifests written → each pod's container started (evlet's log,
//!    per pod and total), and → every container running (`/metrics`);
//! 2. idle CPU of evlet (its own cgroup2 `cpu.stat`) and of containerd (`/proc/<pid>/stat`)
//!    over a fixed window with N pods running, and evlet's RSS;
//! 3. container kills at random pods (`evlet_bench::kills`): SIGKILL of the init
//!    process (the ground truth) → the PLEG's ContainerDied event (evlet's JSON log)
//!    and → `/pods/<ns>/<name>` showing the container terminated, next to → CRI
//!    `ContainerStatus` reporting EXITED (polled every 1 ms: the floor of any agent
//!    that reads the runtime; on the kills where it came before the agent's status,
//!    containerd's own exit lag, which `generic` measures unloaded by a replacement),
//!    and → the pod's replacement container running (`restartPolicy: Always`);
//!    every other kill is unobserved (nothing polls): kill → the replacement's
//!    `StartContainer` returned, from evlet's timeline, as the floor times it. The
//!    first kill comes `settle` after the batch start (and the idle window, in the
//!    first round), each kill is followed by a random 100–600 ms gap: the pace
//!    `evlet_bench::schedule` sets for evlet's kills and the floor's alike;
//! 4. OOM kills (10, one pod each; `evlet_bench::oom`): the kernel's first OOM message
//!    on `/dev/kmsg` (the head of its report, `invoked oom-killer`) → `OOMKilled` in the
//!    pod status, and (in `ebpf`) the victim's exit as the kernel recorded it →
//!    `OOMKilled`: the agent's part, without the kernel's teardown of the victim. Each
//!    hog allocates after its own random 0.5–1.5 s, kept with its sample, so the
//!    samples fall at every phase of `generic`'s 1 s relist;
//! 5. once per N, the CRI status calls a relist makes (PodSandboxStatus + ContainerStatus)
//!    against the N real pods: calls/s and latency, one at a time and 8 in flight;
//! 6. once per N, before the agents, the runtime's floor (`evlet_bench::floor`):
//!    N pods started straight over CRI with evlet's configs and parallelism, and
//!    SIGKILL → replacement created and started at that density (the floor of
//!    kill → replacement), at evlet's pace of kills.
//!
//! Small pod counts run in rounds (`--rounds`; 5 at 10 pods): the floor and
//! every mode again with fresh agents and pods, the samples pooled and the
//! starts' medians taken, since one 10-pod run gives one start of a second
//! and five kills of each kind. Batch starts run at least `--start-rounds`
//! times (3 in a full run, 1 with `--quick`): rounds past the full ones
//! start the floor's pods and each mode's, fresh, and time only that, so a
//! start of 100 pods or more is the median of three (the report says
//! "single run" where one round ran). The two extra rounds cost two more
//! batch starts of the floor and of each mode at every count from 100 pods
//! up (with their cleanups), most of it at 1000 pods.
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
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use evlet_bench::cri_calls::cri_calls;
use evlet_bench::pods::{APP, cleanup, manifest, pod_name, write_manifest};
use evlet_bench::report::{self, CriCalls, Floor, Machine, Results, Run};
use evlet_bench::schedule::{self, Rounds};
use evlet_bench::{Agent, AgentSpec, Endpoint, Summary, floor, kills, oom, process_cpu, rss_mib};
use evlet_cri::{Options, RuntimeClient};

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
    /// Batch starts at each pod count, at least: past `--rounds`, rounds
    /// that start the floor's pods and every mode's afresh and time only
    /// that; the start figures are the median. Default 3 (a no-op at 10
    /// pods, which has 5 full rounds); 1 with `--quick`.
    #[arg(long)]
    start_rounds: Option<usize>,
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
    /// From the batch start's end to the idle window, and to the first kill
    /// (after the idle window in the first round): evlet's and the floor's
    /// alike (`schedule::quiet_before_kills`).
    settle: Duration,
    cri_window: Duration,
    poll: Duration,
}

const ADDRESS: &str = "127.0.0.1:10256";

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
/// measures the idle window (and, if `measure_cri`, the CRI calls); a round
/// not `killing` only times the batch start.
async fn one(
    ctx: &Ctx,
    mode: &str,
    pods: usize,
    round: usize,
    killing: bool,
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
            "--eviction-hard".into(),
            evlet_bench::EVICTION_HARD.into(),
        ],
    };
    let mut run = Run {
        mode: mode.to_owned(),
        pods,
        kill_rounds: usize::from(killing),
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
            match (killing, round) {
                (false, _) => "; start only",
                (true, 0) => "; idle window",
                (true, _) => "",
            }
        );
        if !killing {
            return anyhow::Ok(Vec::new());
        }
        // As long from the start's end to the first kill as the floor waits
        // (`floor_round`); in the first round the idle window fills it.
        let quiet = schedule::quiet_before_kills(round, ctx.plan.settle, ctx.plan.idle);
        let first_kill = tokio::time::Instant::now() + quiet;
        if round == 0 {
            idle(&agent, &ctx.node, ctx.plan, &mut run).await?;
        }
        tokio::time::sleep_until(first_kill).await;
        eprintln!("bench: {mode} with {pods} pods: kills");
        let killed = kills::kills(&agent, &ctx.client, pods, ctx.plan.kills, &mut run).await?;
        let (image, ooms) = (&ctx.node.image, ctx.plan.ooms);
        oom::oom(&agent, &manifests, image, ooms, &mut run).await?;
        anyhow::Ok(killed)
    }
    .await;
    agent.stop().await?;
    let killed =
        measured.with_context(|| format!("{mode} with {pods} pods (log {})", log.display()))?;
    if killing {
        kills::kill_events(&log, &killed, &mut run)?;
    }
    let cri = if measure_cri && round == 0 {
        Some(cri_calls(&ctx.client, pods, ctx.plan.cri_window).await?)
    } else {
        None
    };
    Ok((run, cri))
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
        machine: Machine::here(
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
/// count has (`schedule::Rounds`: the full ones, then those that only time
/// the start); each pod count's results go into `results` when done.
async fn measure_count(ctx: &Ctx, pods: usize, results: &mut Results) -> Result<()> {
    let args = &ctx.args;
    let rounds = Rounds::of(pods, args.quick, args.rounds, args.start_rounds);
    let mut floors = Vec::new();
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); ctx.args.modes.len()];
    let measured = async {
        for round in 0..rounds.total {
            let killing = rounds.kills_in(round);
            if rounds.total > 1 {
                let only = if killing { "" } else { ", the start only" };
                let total = rounds.total;
                eprintln!("bench: {pods} pods, round {} of {total}{only}", round + 1);
            }
            floors.push(floor_round(ctx, pods, round, killing).await?);
            for (k, mode) in ctx.args.modes.iter().enumerate() {
                let (run, cri) = match one(ctx, mode, pods, round, killing, k == 0).await {
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

/// The runtime's floor with `pods` pods, once, in round `round`: its kills
/// (if the round is `killing`) at evlet's pace, the first as long after the
/// start as evlet's first (`schedule::quiet_before_kills`).
async fn floor_round(ctx: &Ctx, pods: usize, round: usize, killing: bool) -> Result<Floor> {
    eprintln!("bench: the runtime's floor with {pods} pods");
    let floor_root = ctx.args.work.join("floor-root");
    let spec = floor::Spec {
        root: &floor_root,
        cgroup_root: &ctx.node.cgroup_root,
        image: &ctx.node.image,
        n: pods,
        samples: if killing { ctx.plan.kills.min(pods) } else { 0 },
        quiet: schedule::quiet_before_kills(round, ctx.plan.settle, ctx.plan.idle),
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
