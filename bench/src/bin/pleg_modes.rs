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
use evlet_bench::pods::cleanup;
use evlet_bench::report::{self, CriCalls, Floor, Machine, Results, Run};
use evlet_bench::schedule::{self, Rounds};
use evlet_bench::upstream::UpstreamSpec;
use evlet_bench::{Agent, AgentKind, AgentSpec, floor, kills, oom, process_cpu, rss_mib, start};
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
    /// Upstream kubelet, for the modes `upstream` and `upstream-evented`.
    #[arg(long)]
    upstream_kubelet: Option<PathBuf>,
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

/// The agent's count of its CRI calls (upstream's metric; evlet's too).
const CRI_CALLS: &str = "kubelet_runtime_operations_total";

/// CPU of the agent and containerd over the idle window, the agent's CRI
/// calls per second meanwhile (its `/metrics`, read at both ends), and its
/// RSS at the end.
async fn idle(agent: &Agent, node: &Node, plan: Plan, run: &mut Run) -> Result<()> {
    tokio::time::sleep(plan.settle).await;
    let calls0 = agent.http.counter(CRI_CALLS).await?;
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
    let calls = agent.http.counter(CRI_CALLS).await? - calls0;
    run.idle_cri_calls_per_s = Some(calls / window.as_secs_f64());
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

/// `Some(evented)` for the upstream kubelet modes: `upstream` (its default
/// PLEG) and `upstream-evented` (the `EventedPLEG` gate on).
fn upstream_mode(mode: &str) -> Option<bool> {
    match mode {
        "upstream" => Some(false),
        "upstream-evented" => Some(true),
        _ => None,
    }
}

/// Starts the agent of `mode`: evlet in that PLEG mode, or upstream kubelet.
async fn start_agent(
    ctx: &Ctx,
    mode: &str,
    pods: usize,
    manifests: &Path,
    root: PathBuf,
    log: &Path,
) -> Result<Agent> {
    if let Some(evented) = upstream_mode(mode) {
        let binary = ctx
            .args
            .upstream_kubelet
            .clone()
            .with_context(|| format!("mode {mode} needs --upstream-kubelet"))?;
        return Agent::start_upstream(&UpstreamSpec {
            binary,
            evented,
            manifests: manifests.to_owned(),
            state: root,
            endpoint: ctx.node.endpoint.clone(),
            cgroup_root: ctx.node.cgroup_root.clone(),
            address: ADDRESS.into(),
            // The batch and the OOM pods.
            max_pods: pods + ctx.plan.ooms,
            log: log.to_owned(),
        })
        .await;
    }
    Agent::start(&AgentSpec {
        binary: ctx.args.evlet.clone(),
        mode: mode.to_owned(),
        manifests: manifests.to_owned(),
        root,
        endpoint: ctx.node.endpoint.clone(),
        cgroup_root: ctx.node.cgroup_root.clone(),
        address: ADDRESS.into(),
        log: log.to_owned(),
        extra: vec![
            "--max-parallel-pod-starts".into(),
            ctx.args.parallel_pod_starts.to_string(),
            "--eviction-hard".into(),
            evlet_bench::EVICTION_HARD.into(),
        ],
    })
    .await
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
    evlet_testkit::upstream_kubelet::unmount_under(&root);
    for d in [&manifests, &root] {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d)?;
    }
    let log = ctx.args.work.join(match round {
        0 => format!("evlet-{mode}-{pods}.log"),
        k => format!("evlet-{mode}-{pods}-round{k}.log"),
    });
    let mut run = Run {
        mode: mode.to_owned(),
        pods,
        kill_rounds: usize::from(killing),
        ..Run::default()
    };
    eprintln!("bench: {mode} with {pods} pods: starting");
    let agent = start_agent(ctx, mode, pods, &manifests, root, &log).await?;
    let measured = async {
        let node = start::Node {
            client: &ctx.client,
            image: &ctx.node.image,
            containerd_pid: ctx.node.containerd_pid,
        };
        start::batch_start(
            &agent,
            node,
            &manifests,
            &log,
            pods,
            ctx.plan.poll,
            &mut run,
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
    let agent_kind = agent.kind;
    agent.stop().await?;
    let killed =
        measured.with_context(|| format!("{mode} with {pods} pods (log {})", log.display()))?;
    if killing && agent_kind == AgentKind::Evlet {
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
    if let Some(mode) = args.modes.iter().find(|m| upstream_mode(m).is_some())
        && args.upstream_kubelet.is_none()
    {
        bail!("mode {mode} needs --upstream-kubelet (cargo xtask bench builds it)");
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
