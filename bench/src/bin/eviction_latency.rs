//! How soon the eviction manager notices memory pressure: the kernel's
//! notification against the 10 s timer.
//!
//! Starts `evlet` standalone on the private containerd with one hard
//! threshold, `memory.available` 1 GiB below what is available at its start,
//! once with `kernelMemcgNotification: true` and once with `false`. Each round
//! this harness allocates and touches enough memory to take the node 512 MiB
//! past the threshold, in a thread of its own (charged to the root memory
//! cgroup like any pod's memory), while a sampler reads the
//! agent's own numbers (`evlet::machine::NodeMemory`) every millisecond and
//! notes when `memory.available` crossed the threshold. The agent's
//! `/debug/eviction` names the first pass that found the threshold met after
//! the round began: its time minus the crossing is the detection latency (0
//! when the pass came before the sampler's next reading), the
//! "eviction decided" moment (standalone pods are static, so nothing is
//! evicted; the pass that would evict is what is timed). The memory is then
//! freed and the next round waits until it is back.
//!
//! Output: `<out>/eviction-latency-<timestamp>.{json,md,png}` (and
//! `latest-eviction-latency.*` for full runs):
//!
//! ```sh
//! cargo xtask bench --suite eviction            # 20 rounds per mode
//! cargo xtask bench --suite eviction --quick    # 3 rounds per mode
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use evlet::machine::NodeMemory;
use evlet_bench::{Agent, AgentSpec};
use serde::Serialize;

#[derive(Debug, Parser)]
struct Args {
    /// 3 rounds per mode: proves the harness works.
    #[arg(long)]
    quick: bool,
    /// The evlet binary.
    #[arg(long, env = "EVLET_BIN")]
    evlet: PathBuf,
    /// Where results go.
    #[arg(long)]
    out: PathBuf,
    /// Scratch space.
    #[arg(long)]
    work: PathBuf,
    /// The command line to print in the report.
    #[arg(long, default_value = "cargo xtask bench --suite eviction")]
    command: String,
}

/// Below the available memory at the agent's start.
const MARGIN: u64 = 1 << 30;
/// How far below the threshold each round's allocation takes the node.
const PAST: u64 = 1 << 29;

#[derive(Debug, Clone, Serialize)]
struct Latency {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    samples: Vec<f64>,
    /// What woke the pass that noticed, per round.
    triggers: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Results {
    started: String,
    build: String,
    command: String,
    quick: bool,
    kernel: String,
    cpus: usize,
    cgroup: String,
    rounds: usize,
    kernel_notification: Latency,
    timer_only: Latency,
}

fn available() -> Result<u64> {
    Ok(NodeMemory::read(evlet::cgroups::memcg_v1_root().as_deref())
        .context("cannot read the node's memory")?
        .available())
}

/// Samples `memory.available` every millisecond; keeps the first moment it
/// was below `threshold` (Unix ns).
fn sample(threshold: u64, crossed: Arc<AtomicI64>, stop: Arc<AtomicBool>) {
    let root = evlet::cgroups::memcg_v1_root();
    while !stop.load(Ordering::Relaxed) {
        let now = evlet::clock::unix_ns();
        if let Some(m) = NodeMemory::read(root.as_deref())
            && m.available() < threshold
        {
            let _ = crossed.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Touches `bytes` of fresh memory and holds it.
fn hog(bytes: usize) -> Vec<u8> {
    let mut v = vec![0_u8; bytes];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    v
}

/// The first acting pass at or after `since` (the round's start) in
/// `/debug/eviction`.
async fn noticed(agent: &Agent, since: i64) -> Result<Option<(i64, String)>> {
    let view = agent
        .http
        .json("/debug/eviction")
        .await?
        .context("/debug/eviction")?;
    Ok(view["acting"].as_array().and_then(|passes| {
        passes.iter().find_map(|p| {
            let at = p["atNs"].as_i64()?;
            (at >= since).then(|| (at, p["trigger"].as_str().unwrap_or("").to_owned()))
        })
    }))
}

fn percentiles(samples: Vec<f64>, triggers: Vec<String>) -> Latency {
    let mut sorted = samples.clone();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
        sorted.get(i).copied().unwrap_or(0.0)
    };
    Latency {
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: at(1.0),
        samples,
        triggers,
    }
}

async fn run_mode(args: &Args, kernel: bool, rounds: usize) -> Result<Latency> {
    let var = |k: &str| {
        std::env::var(k).with_context(|| format!("{k} is not set: run through `cargo xtask bench`"))
    };
    let name = if kernel { "kernel" } else { "timer" };
    let dir = args.work.join(format!("eviction-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let threshold = available()?.saturating_sub(MARGIN);
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             evictionHard: {{memory.available: {}Ki}}\nkernelMemcgNotification: {kernel}\n",
            threshold >> 10
        ),
    )?;
    let agent = Agent::start(&AgentSpec {
        binary: args.evlet.clone(),
        mode: "ebpf".into(),
        manifests,
        root: dir.join("root"),
        endpoint: var("EVLET_CRI_ENDPOINT")?,
        cgroup_root: format!("{}/eviction-bench", var("EVLET_CGROUP_ROOT")?),
        address: "127.0.0.1:10257".into(),
        log: dir.join("evlet.log"),
        extra: vec!["--config".into(), config.display().to_string()],
    })
    .await?;
    let measured = rounds_of(&agent, threshold, rounds).await;
    agent.stop().await?;
    let (samples, triggers) = measured?;
    Ok(percentiles(samples, triggers))
}

async fn rounds_of(
    agent: &Agent,
    threshold: u64,
    rounds: usize,
) -> Result<(Vec<f64>, Vec<String>)> {
    let mut samples = Vec::new();
    let mut triggers = Vec::new();
    for round in 0..rounds {
        // Memory back above the threshold with room, so the next crossing is one.
        let back = Instant::now() + Duration::from_secs(60);
        while available()? < threshold + MARGIN / 2 {
            if Instant::now() > back {
                bail!("round {round}: memory did not come back above the threshold");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Start at a random point of the agent's 10 s period: a round that
        // began right after the last pass would always wait most of it.
        tokio::time::sleep(Duration::from_millis(300 + fastrand::u64(0..10_000))).await;
        let crossed = Arc::new(AtomicI64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = std::thread::spawn({
            let (c, s) = (Arc::clone(&crossed), Arc::clone(&stop));
            move || sample(threshold, c, s)
        });
        let round_start = evlet::clock::unix_ns();
        // Sized from what is available now (the page cache moves it between
        // rounds): the node ends `PAST` below the threshold.
        let bytes = usize::try_from(available()?.saturating_sub(threshold) + PAST)?;
        let held = tokio::task::spawn_blocking(move || hog(bytes)).await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let found = loop {
            let at = crossed.load(Ordering::Relaxed);
            if at != 0
                && let Some(found) = noticed(agent, round_start).await?
            {
                break Some((at, found));
            }
            if Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let held_available = available()?;
        stop.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        drop(held);
        let Some((at, (pass, trigger))) = found else {
            let seen = crossed.load(Ordering::Relaxed) != 0;
            bail!(
                "round {round}: no pass noticed the crossing within 30 s (the sampler {} it; \
                 {} MiB held, threshold {} MiB, available {} MiB while held)",
                if seen { "saw" } else { "did not see" },
                bytes >> 20,
                threshold >> 20,
                held_available >> 20
            );
        };
        // A pass before the sampler's reading: within its 1 ms resolution.
        samples.push((pass - at).max(0) as f64 / 1e6);
        triggers.push(trigger);
    }
    Ok((samples, triggers))
}

fn markdown(r: &Results) -> String {
    let count = |l: &Latency, t: &str| l.triggers.iter().filter(|x| *x == t).count();
    format!(
        "Run {} on {} CPUs, kernel {} ({}), evlet {} build, standalone on containerd 1.7.\nCommand: `{}`\n\n\
         memory.available crossing its hard threshold → the eviction manager's pass that acts on it, {} rounds per mode:\n\n\
         | wake-up | p50 (ms) | p99 (ms) | max (ms) | passes woken by the kernel |\n|---|---:|---:|---:|---:|\n\
         | kernel notification (memcg threshold + PSI) | {:.1} | {:.1} | {:.1} | {} of {} |\n\
         | 10 s timer only | {:.1} | {:.1} | {:.1} | {} of {} |\n",
        r.started,
        r.cpus,
        r.kernel,
        r.cgroup,
        r.build,
        r.command,
        r.rounds,
        r.kernel_notification.p50_ms,
        r.kernel_notification.p99_ms,
        r.kernel_notification.max_ms,
        count(&r.kernel_notification, "memcg") + count(&r.kernel_notification, "psi"),
        r.rounds,
        r.timer_only.p50_ms,
        r.timer_only.p99_ms,
        r.timer_only.max_ms,
        count(&r.timer_only, "memcg") + count(&r.timer_only, "psi"),
        r.rounds,
    )
}

fn chart(r: &Results, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    evlet_bench::report::register_font()?;
    let root = BitMapBackend::new(path, (720, 380)).into_drawing_area();
    root.fill(&WHITE)?;
    let bars = [
        ("kernel p50", r.kernel_notification.p50_ms, BLUE),
        ("kernel p99", r.kernel_notification.p99_ms, BLUE),
        ("timer p50", r.timer_only.p50_ms, RED),
        ("timer p99", r.timer_only.p99_ms, RED),
    ];
    let top = bars.iter().map(|b| b.1).fold(10.0_f64, f64::max) * 2.0;
    let mut c = ChartBuilder::on(&root)
        .caption(
            "memory pressure: threshold crossed → eviction pass (ms, log scale)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0..bars.len(), (0.1..top).log_scale())?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len())
        .x_label_formatter(&|i| bars.get(*i).map(|b| b.0.to_owned()).unwrap_or_default())
        .y_desc("ms")
        .draw()?;
    for (i, (_, v, color)) in bars.iter().enumerate() {
        c.draw_series(std::iter::once(Rectangle::new(
            [(i, 0.1), (i + 1, v.max(0.1))],
            color.mix(0.6).filled(),
        )))?;
    }
    root.present()?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.out)?;
    let rounds = if args.quick { 3 } else { 20 };
    let started = jiff::Timestamp::now();
    let kernel = run_mode(&args, true, rounds).await?;
    let timer = run_mode(&args, false, rounds).await?;
    let results = Results {
        started: started.strftime("%Y-%m-%d %H:%M UTC").to_string(),
        build: if args.evlet.components().any(|c| c.as_os_str() == "release") {
            "release".into()
        } else {
            "debug".into()
        },
        command: args.command.clone(),
        quick: args.quick,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cgroup: if evlet::cgroups::memcg_v1_root().is_some() {
            "cgroup v1 memory controller".into()
        } else {
            "cgroup v2".into()
        },
        rounds,
        kernel_notification: kernel,
        timer_only: timer,
    };
    let md = markdown(&results);
    evlet_bench::report::write_results(
        &args.out,
        "eviction-latency",
        started,
        &results,
        &md,
        results.quick,
        |png| chart(&results, png),
    )?;
    println!("{md}");
    Ok(())
}
