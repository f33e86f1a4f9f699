//! What probing costs at density, on the real runtime.
//!
//! For each pod count N and scenario, this starts the release `evlet` (`ebpf`
//! mode) on the private containerd with N static pods of one container each,
//! waits until every pod runs (and, with a readiness probe, is ready), lets it
//! settle, and over a fixed window measures:
//! * evlet's CPU (its own cgroup2 `cpu.stat`), containerd's and the shims'
//!   (`/proc/<pid>/stat`, every `containerd-shim*` process: exec probes run
//!   `runc exec` under them);
//! * probes run per second (`prober_probe_total` on `/metrics/probes`) against
//!   the rate asked (N ÷ period), and how many probes were late: a series
//!   that ran fewer than (window ÷ period) − 1 times missed more than one period.
//!
//! Scenarios: `none` (the same pods without probes: the baseline), `exec-10s`
//! (an exec liveness probe every 10 s, `true`), `http-1s` (an HTTP readiness
//! probe every 1 s against busybox `httpd` in the pod).
//!
//! Output: `<out>/probes-cost-<timestamp>.{json,md,png}` (and `latest-probe-cost.*`
//! for full runs). Run it through xtask, which brings up the containerd 1.7 node:
//!
//! ```sh
//! cargo xtask bench --suite probes            # N = 100, 500
//! cargo xtask bench --suite probes --quick    # N = 10, short windows
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use evlet_bench::{Agent, AgentSpec, process_cpu, rss_mib};
use serde::Serialize;

#[derive(Debug, Parser)]
struct Args {
    /// Pod counts.
    #[arg(long, value_delimiter = ',', default_values = ["100", "500"])]
    pods: Vec<usize>,
    /// N = 10 and short windows: proves the harness works.
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
    #[arg(long, default_value = "cargo xtask bench --suite probes")]
    command: String,
}

/// One scenario: the probe every pod gets.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    name: &'static str,
    /// Seconds between probes of one pod (0: no probe).
    period: u64,
    /// The container and its probe, in YAML.
    container: &'static str,
}

const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "none",
        period: 0,
        container: "    command: [/bin/sleep, '86400']\n",
    },
    Scenario {
        name: "exec-10s",
        period: 10,
        container: "    command: [/bin/sleep, '86400']\n    livenessProbe: {exec: {command: [/bin/true]}, periodSeconds: 10}\n",
    },
    Scenario {
        name: "http-1s",
        period: 1,
        container: "    command: [httpd, -f, -p, '8080', -h, /]\n    readinessProbe: {httpGet: {path: /etc/passwd, port: 8080}, periodSeconds: 1}\n",
    },
];

/// What one (scenario, N) run measured.
#[derive(Debug, Clone, Serialize)]
struct Run {
    scenario: String,
    pods: usize,
    window_s: f64,
    evlet_cpu_pct: f64,
    containerd_cpu_pct: f64,
    shims_cpu_pct: f64,
    evlet_rss_mib: f64,
    probes_asked_per_s: f64,
    probes_per_s: f64,
    failed_probes: u64,
    late_series: usize,
    series: usize,
}

#[derive(Debug, Serialize)]
struct Results {
    started: String,
    command: String,
    quick: bool,
    kernel: String,
    cpus: usize,
    runs: Vec<Run>,
}

fn manifest(i: usize, image: &str, s: Scenario) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: {image}\n{}",
        s.container
    )
}

/// CPU of every containerd shim.
fn shims_cpu() -> Duration {
    procfs::process::all_processes()
        .into_iter()
        .flatten()
        .flatten()
        .filter(|p| {
            p.stat()
                .is_ok_and(|s| s.comm.starts_with("containerd-shim"))
        })
        .filter_map(|p| process_cpu(p.pid as u32).ok())
        .sum()
}

/// `prober_probe_total` samples: (series labels without `result`, result) → count.
fn probe_counts(text: &str) -> HashMap<(String, String), f64> {
    let mut out = HashMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("prober_probe_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let result = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("result=\""))
            .map(|r| r.trim_end_matches(['"', '}']).to_owned())
            .unwrap_or_default();
        let series: String = labels
            .split(',')
            .filter(|kv| !kv.starts_with("result="))
            .collect::<Vec<_>>()
            .join(",");
        out.insert((series, result), value);
    }
    out
}

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
        Ok(Self {
            endpoint: var("EVLET_CRI_ENDPOINT")?,
            cgroup_root: format!("{}/probe-bench", var("EVLET_CGROUP_ROOT")?),
            image: var("EVLET_TEST_IMAGE")?,
            containerd_pid: std::fs::read_to_string(&pid_file)
                .with_context(|| format!("reading {}", pid_file.display()))?
                .trim()
                .parse()
                .context("containerd pid file")?,
        })
    }
}

fn write_manifest(dir: &Path, name: &str, yaml: &str) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, yaml)?;
    std::fs::rename(&tmp, dir.join(name))?;
    Ok(())
}

async fn one(args: &Args, node: &Node, s: Scenario, pods: usize) -> Result<Run> {
    let (settle, window) = if args.quick {
        (Duration::from_secs(2), Duration::from_secs(12))
    } else {
        (Duration::from_secs(15), Duration::from_secs(60))
    };
    let manifests = args.work.join("probe-manifests");
    let root = args.work.join("probe-root");
    for d in [&manifests, &root] {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d)?;
    }
    for i in 0..pods {
        write_manifest(
            &manifests,
            &format!("p{i}.yaml"),
            &manifest(i, &node.image, s),
        )?;
    }
    let log = args.work.join(format!("probe-cost-{}-{pods}.log", s.name));
    let agent = Agent::start(&AgentSpec {
        binary: args.evlet.clone(),
        mode: "ebpf".into(),
        manifests: manifests.clone(),
        root,
        endpoint: node.endpoint.clone(),
        cgroup_root: node.cgroup_root.clone(),
        address: "127.0.0.1:10257".into(),
        log: log.clone(),
        extra: vec!["--eviction-hard".into(), evlet_bench::EVICTION_HARD.into()],
    })
    .await?;
    let measured = async {
        let deadline = Instant::now() + Duration::from_secs(180 + pods as u64);
        loop {
            let list = agent.http.json("/pods").await?.context("/pods")?;
            let items = list["items"].as_array().cloned().unwrap_or_default();
            let done = items
                .iter()
                .filter(|p| {
                    let c = &p["status"]["containerStatuses"][0];
                    c["state"]["running"].is_object() && (s.name != "http-1s" || c["ready"] == true)
                })
                .count();
            if done == pods {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{}: only {done} of {pods} pods running (and ready) (log {})",
                    s.name,
                    log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(settle).await;
        let probes = |agent: &Agent| {
            let http = agent.http.clone();
            async move {
                let (_, body) = http.get("/metrics/probes").await?;
                anyhow::Ok(probe_counts(&String::from_utf8_lossy(&body)))
            }
        };
        let c0 = probes(&agent).await?;
        let (e0, d0, s0, t0) = (
            agent.cpu()?,
            process_cpu(node.containerd_pid)?,
            shims_cpu(),
            Instant::now(),
        );
        tokio::time::sleep(window).await;
        let c1 = probes(&agent).await?;
        let (e1, d1, s1, took) = (
            agent.cpu()?,
            process_cpu(node.containerd_pid)?,
            shims_cpu(),
            t0.elapsed(),
        );
        let pct = |a: Duration, b: Duration| {
            b.saturating_sub(a).as_secs_f64() / took.as_secs_f64() * 100.0
        };
        let delta = |key: &(String, String)| {
            c1.get(key).copied().unwrap_or(0.0) - c0.get(key).copied().unwrap_or(0.0)
        };
        let total: f64 = c1.keys().map(delta).sum();
        let failed: f64 = c1.keys().filter(|(_, r)| r == "failed").map(delta).sum();
        let mut per_series: HashMap<&str, f64> = HashMap::new();
        for key in c1.keys() {
            *per_series.entry(key.0.as_str()).or_default() += delta(key);
        }
        let late = if s.period == 0 {
            0
        } else {
            let expected = took.as_secs_f64() / s.period as f64;
            per_series
                .values()
                .filter(|n| **n < expected.floor() - 1.0)
                .count()
        };
        anyhow::Ok(Run {
            scenario: s.name.into(),
            pods,
            window_s: took.as_secs_f64(),
            evlet_cpu_pct: pct(e0, e1),
            containerd_cpu_pct: pct(d0, d1),
            shims_cpu_pct: pct(s0, s1),
            evlet_rss_mib: rss_mib(agent.pid)?,
            probes_asked_per_s: if s.period == 0 {
                0.0
            } else {
                pods as f64 / s.period as f64
            },
            // No probes at all is 0, not -0.0.
            probes_per_s: if total > 0.0 {
                total / took.as_secs_f64()
            } else {
                0.0
            },
            failed_probes: failed.max(0.0) as u64,
            late_series: late,
            series: per_series.len(),
        })
    }
    .await;
    // Removing the manifests lets the agent stop and remove every pod.
    for i in 0..pods {
        let _ = std::fs::remove_file(manifests.join(format!("p{i}.yaml")));
    }
    let gone = Instant::now() + Duration::from_secs(120 + pods as u64 / 2);
    while Instant::now() < gone {
        let left = agent
            .http
            .json("/pods")
            .await
            .ok()
            .flatten()
            .and_then(|l| l["items"].as_array().map(Vec::len))
            .unwrap_or(0);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    agent.stop().await?;
    measured.with_context(|| format!("{} with {pods} pods (log {})", s.name, log.display()))
}

fn markdown(r: &Results) -> String {
    let mut out = format!(
        "Run {} on {} CPUs, kernel {}, containerd 1.7, evlet release build, `ebpf` mode.\nCommand: `{}`\n\n",
        r.started, r.cpus, r.kernel, r.command
    );
    out.push_str("| scenario | pods | probes/s asked | probes/s run | late series | failed | evlet CPU (%) | containerd CPU (%) | shims CPU (%) | evlet RSS (MiB) |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for run in &r.runs {
        out.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {} of {} | {} | {:.2} | {:.2} | {:.2} | {:.1} |\n",
            run.scenario,
            run.pods,
            run.probes_asked_per_s,
            run.probes_per_s,
            run.late_series,
            run.series,
            run.failed_probes,
            run.evlet_cpu_pct,
            run.containerd_cpu_pct,
            run.shims_cpu_pct,
            run.evlet_rss_mib,
        ));
    }
    out
}

fn chart(r: &Results, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    evlet_bench::report::register_font()?;
    let root = BitMapBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let labels: Vec<String> = r
        .runs
        .iter()
        .map(|x| format!("{} ×{}", x.scenario, x.pods))
        .collect();
    let top = r
        .runs
        .iter()
        .map(|x| x.evlet_cpu_pct + x.containerd_cpu_pct + x.shims_cpu_pct)
        .fold(1.0_f64, f64::max)
        * 1.15;
    let mut c = ChartBuilder::on(&root)
        .caption(
            "CPU while probing (% of a core): evlet, containerd, shims",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0..labels.len(), 0.0..top)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(labels.len())
        .x_label_formatter(&|i| labels.get(*i).cloned().unwrap_or_default())
        .y_desc("% of a core")
        .draw()?;
    for (i, run) in r.runs.iter().enumerate() {
        let mut base = 0.0;
        for (value, color) in [
            (run.evlet_cpu_pct, BLUE),
            (run.containerd_cpu_pct, RED),
            (run.shims_cpu_pct, GREEN),
        ] {
            c.draw_series(std::iter::once(Rectangle::new(
                [(i, base), (i + 1, base + value)],
                color.mix(0.6).filled(),
            )))?;
            base += value;
        }
    }
    root.present()?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.quick {
        args.pods = vec![10];
    }
    let node = Node::from_env()?;
    std::fs::create_dir_all(&args.work)?;
    std::fs::create_dir_all(&args.out)?;
    let started = jiff::Timestamp::now();
    let mut results = Results {
        started: started.strftime("%Y-%m-%d %H:%M UTC").to_string(),
        command: args.command.clone(),
        quick: args.quick,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        runs: Vec::new(),
    };
    for &pods in &args.pods {
        for s in SCENARIOS {
            eprintln!("bench: probe cost, {} with {pods} pods", s.name);
            let run = one(&args, &node, s, pods).await?;
            eprintln!(
                "bench: {} ×{pods}: {:.1} probes/s (asked {:.1}), evlet {:.2} %, containerd {:.2} %, shims {:.2} %",
                s.name,
                run.probes_per_s,
                run.probes_asked_per_s,
                run.evlet_cpu_pct,
                run.containerd_cpu_pct,
                run.shims_cpu_pct
            );
            results.runs.push(run);
        }
    }
    let md = markdown(&results);
    evlet_bench::report::write_results(
        &args.out,
        "probe-cost",
        started,
        &results,
        &md,
        results.quick,
        |png| chart(&results, png),
    )?;
    println!("{md}");
    let late: usize = results.runs.iter().map(|r| r.late_series).sum();
    if late > 0 && !results.quick {
        eprintln!("bench: {late} probe series ran late (missed more than one period)");
    }
    Ok(())
}
