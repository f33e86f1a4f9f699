//! The benchmark's results: JSON (everything, with raw samples), a Markdown
//! table per pod count with ratios against `ebpf`, and a PNG chart.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::{Summary, median};

/// One benchmark invocation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    /// When it started (RFC 3339).
    pub started: String,
    /// The command line that reproduces it.
    pub command: String,
    /// `--quick` (a harness check, not a measurement).
    pub quick: bool,
    /// Where it ran.
    pub machine: Machine,
    /// One per mode and pod count.
    pub runs: Vec<Run>,
    /// CRI status call throughput per pod count.
    pub cri: Vec<CriCalls>,
    /// The runtime's own start floor per pod count.
    #[serde(default)]
    pub floors: Vec<Floor>,
    /// Pod starts in flight at once, in evlet and in the floor
    /// (`--max-parallel-pod-starts`); None in runs before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_pod_starts: Option<usize>,
    /// Why the run stopped before its last pod count, if it did: the tables
    /// hold what was measured until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// The runtime's floor at one pod count (`evlet_bench::floor`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Floor {
    /// Pods.
    pub pods: usize,
    /// N pods started straight over CRI, all at once (seconds); the median
    /// of [`Floor::start_total_rounds_s`] when there were rounds.
    pub start_total_s: f64,
    /// Each round's start, when this pod count ran in rounds (small counts,
    /// whose one start is too short to compare alone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub start_total_rounds_s: Vec<f64>,
    /// One container's create + start in an existing sandbox at this density
    /// (runs before `kill_replacement` existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_start: Option<Summary>,
    /// SIGKILL of a container's init → its replacement created and started
    /// over CRI at once: the floor of "kill → replacement running".
    #[serde(default)]
    pub kill_replacement: Option<Summary>,
    /// containerd's own CPU time during the start (seconds), to compare with
    /// [`Run::start_containerd_cpu_s`].
    #[serde(default)]
    pub start_containerd_cpu_s: Option<f64>,
}

/// Where it ran.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Memory.
    pub memory_gib: f64,
    /// containerd's version.
    pub containerd: String,
    /// `release` or `debug`.
    pub evlet_profile: String,
}

/// One PLEG mode at one pod count.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Run {
    /// The PLEG mode.
    pub mode: String,
    /// Pods running during the run.
    pub pods: usize,
    /// Manifests written → the last pod's container started (`StartContainer`
    /// returned, evlet's log), seconds: the end the floor times. With rounds,
    /// this and the other start figures are the rounds' medians.
    pub start_total_s: f64,
    /// Each round's `start_total_s`, when this pod count ran in rounds (a
    /// fresh agent and pods each, as the floor's rounds; the idle window and
    /// the CRI calls are measured in the first only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub start_total_rounds_s: Vec<f64>,
    /// Manifest written → that pod's container started.
    pub start_per_pod: Option<Summary>,
    /// Manifests written → every container running in `/metrics` (seconds,
    /// to the poll's resolution).
    #[serde(default)]
    pub start_running_s: Option<f64>,
    /// How often evlet's log was read for the last start, then `/metrics`
    /// until its gauge agreed (in results up to 20261127T033853Z `/metrics`
    /// was polled from the first manifest on; up to 20261126T222418Z `/pods`
    /// was, for every start figure).
    pub start_poll_ms: u64,
    /// evlet's CPU time during the batch start (seconds).
    #[serde(default)]
    pub start_evlet_cpu_s: Option<f64>,
    /// containerd's own CPU time during the batch start (seconds; its shims
    /// and runc are other processes).
    #[serde(default)]
    pub start_containerd_cpu_s: Option<f64>,
    /// CPU over the idle window, percent of one core.
    pub idle_window_s: f64,
    /// evlet's CPU over the idle window, percent of one core.
    pub evlet_cpu_pct: f64,
    /// containerd's CPU over the idle window, percent of one core.
    pub containerd_cpu_pct: f64,
    /// evlet's resident memory after the idle window.
    pub evlet_rss_mib: f64,
    /// SIGKILL of a container's init → the PLEG's ContainerDied event (evlet's log).
    pub kill_to_event: Option<Summary>,
    /// SIGKILL → `/pods/<ns>/<name>` shows the container terminated.
    pub kill_to_status: Option<Summary>,
    /// SIGKILL → CRI `ContainerStatus` says EXITED (the runtime's floor).
    pub kill_to_runtime: Option<Summary>,
    /// SIGKILL → the pod's replacement container running in `/pods`.
    #[serde(default)]
    pub kill_to_replacement: Option<Summary>,
    /// SIGKILL → the agent's `StartContainer` of the replacement returned
    /// (its timeline), on kills nothing polls: the floor's measure.
    #[serde(default)]
    pub kill_to_started: Option<Summary>,
    /// The kernel's first OOM message about the hog (`… invoked oom-killer`,
    /// the head of its report, before it picks and kills the victim) →
    /// `OOMKilled` in `/pods/<ns>/<name>` (the median of [`Run::oom_to_status`]
    /// since it exists).
    pub oom_to_status_ms: Option<f64>,
    /// The same over every OOM kill of the run.
    #[serde(default)]
    pub oom_to_status: Option<Summary>,
    /// The victim's exit as the kernel recorded it (evlet's timeline; `ebpf`
    /// mode only) → `OOMKilled` in `/pods/<ns>/<name>`: the agent's own part
    /// of [`Run::oom_to_status`], without the kernel's teardown of the victim
    /// (from the OOM kill to the exit the victim frees its memory).
    #[serde(default)]
    pub oom_exit_to_status: Option<Summary>,
    /// The victim's exit → evlet published `OOMKilled`, both from evlet's
    /// timeline (`ebpf` mode only): [`Run::oom_exit_to_status`] without the
    /// bench's own `/pods` polls, whose answer grows with the pods (at 1000
    /// pods one poll takes longer than the agent does).
    #[serde(default)]
    pub oom_exit_to_published: Option<Summary>,
    /// Anything that went wrong in this run (a failed kill, a timeout).
    pub errors: Vec<String>,
    /// Kills and OOM kills whose status took longer than
    /// [`SLOW_MS`], each with the pod's timeline from the kill to the status
    /// (evlet's own record of where the time went).
    #[serde(default)]
    pub slow: Vec<String>,
}

/// A kill slower than this to the status has its timeline kept ([`Run::slow`]).
pub const SLOW_MS: f64 = 10.0;

impl Run {
    /// Rounds of one mode at one pod count as one run: every sample of every
    /// round; the start figures' medians; the idle figures of the first
    /// round (the only one with an idle window). `None` without rounds.
    pub fn merge(rounds: Vec<Self>) -> Option<Self> {
        if rounds.len() < 2 {
            return rounds.into_iter().next();
        }
        let all = |f: fn(&Self) -> &Option<Summary>| Summary::merged(rounds.iter().map(f));
        let mid = |f: fn(&Self) -> Option<f64>| median(rounds.iter().map(f));
        let oom_to_status = all(|r| &r.oom_to_status);
        let merged = Self {
            start_total_s: mid(|r| Some(r.start_total_s)).unwrap_or_default(),
            start_total_rounds_s: rounds.iter().map(|r| r.start_total_s).collect(),
            start_per_pod: all(|r| &r.start_per_pod),
            start_running_s: mid(|r| r.start_running_s),
            start_evlet_cpu_s: mid(|r| r.start_evlet_cpu_s),
            start_containerd_cpu_s: mid(|r| r.start_containerd_cpu_s),
            kill_to_event: all(|r| &r.kill_to_event),
            kill_to_status: all(|r| &r.kill_to_status),
            kill_to_runtime: all(|r| &r.kill_to_runtime),
            kill_to_replacement: all(|r| &r.kill_to_replacement),
            kill_to_started: all(|r| &r.kill_to_started),
            oom_to_status_ms: oom_to_status.as_ref().map(|s| s.p50_ms),
            oom_to_status,
            oom_exit_to_status: all(|r| &r.oom_exit_to_status),
            oom_exit_to_published: all(|r| &r.oom_exit_to_published),
            errors: rounds.iter().flat_map(|r| r.errors.clone()).collect(),
            slow: rounds.iter().flat_map(|r| r.slow.clone()).collect(),
            ..rounds[0].clone()
        };
        Some(merged)
    }
}

impl Floor {
    /// Rounds of the floor at one pod count as one: the starts' median, every
    /// kill → replacement sample. `None` without rounds.
    pub fn merge(rounds: Vec<Self>) -> Option<Self> {
        if rounds.len() < 2 {
            return rounds.into_iter().next();
        }
        let merged = Self {
            start_total_s: median(rounds.iter().map(|f| Some(f.start_total_s))).unwrap_or_default(),
            start_total_rounds_s: rounds.iter().map(|f| f.start_total_s).collect(),
            start_containerd_cpu_s: median(rounds.iter().map(|f| f.start_containerd_cpu_s)),
            kill_replacement: Summary::merged(rounds.iter().map(|f| &f.kill_replacement)),
            ..rounds[0].clone()
        };
        Some(merged)
    }
}

/// CRI status calls against the real runtime with `pods` pods (the PLEG cost model).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CriCalls {
    /// Pods in the runtime.
    pub pods: usize,
    /// PodSandboxStatus + ContainerStatus, one pair at a time.
    pub sequential_calls_per_s: f64,
    /// Latency of one pair.
    pub pair_latency: Option<Summary>,
    /// The same with 8 pairs in flight.
    pub concurrent8_calls_per_s: f64,
}

/// A figure with three significant digits at most, two decimals under 1
/// (an idle CPU of 0.177 % is not "0.2" against a 0.2 % target).
fn fmt_ms(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) if v < 1.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.1}"),
        None => "–".into(),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.1}×", a / b),
        _ => "–".into(),
    }
}

type Metric = (&'static str, fn(&Run) -> Option<f64>);

const METRICS: &[Metric] = &[
    ("kill → PLEG event p50 (ms)", |r| {
        Some(r.kill_to_event.as_ref()?.p50_ms)
    }),
    ("kill → PLEG event p99 (ms)", |r| {
        Some(r.kill_to_event.as_ref()?.p99_ms)
    }),
    ("kill → status p50 (ms)", |r| {
        Some(r.kill_to_status.as_ref()?.p50_ms)
    }),
    ("kill → status p99 (ms)", |r| {
        Some(r.kill_to_status.as_ref()?.p99_ms)
    }),
    ("kill → status max (ms)", |r| {
        Some(r.kill_to_status.as_ref()?.max_ms)
    }),
    ("kill → replacement running p50 (ms)", |r| {
        Some(r.kill_to_replacement.as_ref()?.p50_ms)
    }),
    ("kill → replacement running p99 (ms)", |r| {
        Some(r.kill_to_replacement.as_ref()?.p99_ms)
    }),
    (
        "kill → replacement started p50 (ms, timeline, unobserved)",
        |r| Some(r.kill_to_started.as_ref()?.p50_ms),
    ),
    (
        "kill → replacement started p99 (ms, timeline, unobserved)",
        |r| Some(r.kill_to_started.as_ref()?.p99_ms),
    ),
    ("kill → CRI exited p50 (ms, runtime floor)", |r| {
        Some(r.kill_to_runtime.as_ref()?.p50_ms)
    }),
    ("kill → CRI exited p99 (ms, runtime floor)", |r| {
        Some(r.kill_to_runtime.as_ref()?.p99_ms)
    }),
    ("OOM → OOMKilled p50 (ms)", |r| {
        r.oom_to_status
            .as_ref()
            .map(|s| s.p50_ms)
            .or(r.oom_to_status_ms)
    }),
    ("OOM → OOMKilled p99 (ms)", |r| {
        Some(r.oom_to_status.as_ref()?.p99_ms)
    }),
    ("OOM: init exit (kernel) → OOMKilled p50 (ms)", |r| {
        Some(r.oom_exit_to_status.as_ref()?.p50_ms)
    }),
    ("OOM: init exit (kernel) → OOMKilled p99 (ms)", |r| {
        Some(r.oom_exit_to_status.as_ref()?.p99_ms)
    }),
    (
        "OOM: init exit (kernel) → OOMKilled published p50 (ms, timeline)",
        |r| Some(r.oom_exit_to_published.as_ref()?.p50_ms),
    ),
    (
        "OOM: init exit (kernel) → OOMKilled published p99 (ms, timeline)",
        |r| Some(r.oom_exit_to_published.as_ref()?.p99_ms),
    ),
    ("idle evlet CPU (% of a core)", |r| Some(r.evlet_cpu_pct)),
    ("idle containerd CPU (% of a core)", |r| {
        Some(r.containerd_cpu_pct)
    }),
    ("evlet RSS (MiB)", |r| Some(r.evlet_rss_mib)),
    ("start per pod p50 (ms)", |r| {
        Some(r.start_per_pod.as_ref()?.p50_ms)
    }),
    ("start per pod p99 (ms)", |r| {
        Some(r.start_per_pod.as_ref()?.p99_ms)
    }),
    ("start all pods (s)", |r| Some(r.start_total_s)),
    ("start: all running in /metrics (s)", |r| r.start_running_s),
    ("start: evlet CPU (s)", |r| r.start_evlet_cpu_s),
    ("start: containerd CPU (s)", |r| r.start_containerd_cpu_s),
];

/// The Markdown report: one table per pod count.
pub fn markdown(results: &Results) -> String {
    let m = &results.machine;
    let mut out = format!(
        "Run {} on {} CPUs, {:.0} GiB, kernel {}, {}, evlet {} build{}.\n\
         Command: `{}`\n",
        results.started,
        m.cpus,
        m.memory_gib,
        m.kernel,
        m.containerd,
        m.evlet_profile,
        if results.quick {
            " (--quick: short windows, not for comparison)"
        } else {
            ""
        },
        results.command
    );
    if let Some(failure) = &results.failure {
        let _ = write!(
            out,
            "\n**Stopped early**, at {failure}. The tables hold what was measured before.\n"
        );
    }
    let mut counts: Vec<usize> = results.runs.iter().map(|r| r.pods).collect();
    counts.dedup();
    for pods in counts {
        let runs: Vec<&Run> = results.runs.iter().filter(|r| r.pods == pods).collect();
        let ebpf = runs.iter().find(|r| r.mode == "ebpf");
        let others: Vec<&&Run> = runs.iter().filter(|r| r.mode != "ebpf").collect();
        let _ = write!(out, "\n### {pods} pods\n\n| metric |");
        for r in &runs {
            let _ = write!(out, " {} |", r.mode);
        }
        for r in &others {
            let _ = write!(out, " {} ÷ ebpf |", r.mode);
        }
        out += "\n|---|";
        out += &"---:|".repeat(runs.len() + if ebpf.is_some() { others.len() } else { 0 });
        out += "\n";
        for (name, get) in METRICS {
            let _ = write!(out, "| {name} |");
            for r in &runs {
                let _ = write!(out, " {} |", fmt_ms(get(r)));
            }
            if let Some(e) = ebpf {
                for r in &others {
                    let _ = write!(out, " {} |", ratio(get(r), get(e)));
                }
            }
            out += "\n";
        }
        let rounds = runs
            .iter()
            .map(|r| r.start_total_rounds_s.len())
            .max()
            .unwrap_or(0);
        if rounds > 1 {
            let list = |v: &[f64]| {
                v.iter()
                    .map(|s| format!("{s:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut starts: Vec<String> = runs
                .iter()
                .map(|r| format!("{} {}", r.mode, list(&r.start_total_rounds_s)))
                .collect();
            if let Some(f) = results.floors.iter().find(|f| f.pods == pods) {
                starts.push(format!("floor {}", list(&f.start_total_rounds_s)));
            }
            let _ = writeln!(
                out,
                "\n{rounds} rounds, each with a fresh agent and fresh pods: the start figures are \
                 the rounds' medians, the latencies pool every round's samples, the idle \
                 figures are the first round's. Start all pods per round (s): {}.",
                starts.join("; ")
            );
        }
        let errors: Vec<String> = runs
            .iter()
            .flat_map(|r| r.errors.iter().map(move |e| format!("{}: {e}", r.mode)))
            .collect();
        if !errors.is_empty() {
            let _ = writeln!(out, "\nErrors: {}", errors.join("; "));
        }
        let slow: Vec<String> = runs
            .iter()
            .flat_map(|r| r.slow.iter().map(move |s| format!("- {}: {s}", r.mode)))
            .collect();
        if !slow.is_empty() {
            let _ = writeln!(
                out,
                "\nSlower than {} ms to the status, with the pod's timeline from the kill (ms):\n\n{}",
                SLOW_MS,
                slow.join("\n")
            );
        }
    }
    if !results.cri.is_empty() {
        out += "\n### CRI status calls (PodSandboxStatus + ContainerStatus)\n\n\
                | pods | sequential calls/s | pair p50 (ms) | pair p99 (ms) | 8 in flight calls/s |\n\
                |---:|---:|---:|---:|---:|\n";
        for c in &results.cri {
            let _ = writeln!(
                out,
                "| {} | {:.0} | {} | {} | {:.0} |",
                c.pods,
                c.sequential_calls_per_s,
                fmt_ms(c.pair_latency.as_ref().map(|s| s.p50_ms)),
                fmt_ms(c.pair_latency.as_ref().map(|s| s.p99_ms)),
                c.concurrent8_calls_per_s
            );
        }
    }
    if !results.floors.is_empty() {
        out += "\n### The runtime's floor (CRI only, evlet's configs and parallelism)\n\n";
        if let Some(n) = results.parallel_pod_starts {
            let _ = writeln!(out, "Pods started at once, here and in evlet: {n}.\n");
        }
        out += "| pods | start all pods (s) | start: containerd CPU (s) | kill → replacement started p50 (ms) | p99 (ms) |\n\
                |---:|---:|---:|---:|---:|\n";
        for f in &results.floors {
            // Runs before the kill → replacement floor timed a plain create + start.
            let sample = f.kill_replacement.as_ref().or(f.create_start.as_ref());
            let _ = writeln!(
                out,
                "| {} | {:.1} | {} | {} | {} |",
                f.pods,
                f.start_total_s,
                fmt_ms(f.start_containerd_cpu_s),
                fmt_ms(sample.map(|s| s.p50_ms)),
                fmt_ms(sample.map(|s| s.p99_ms)),
            );
        }
    }
    out
}

/// Writes `<out>/<name>-<timestamp>.{json,md,png}` (the PNG drawn by
/// `chart`) and, for a full run, copies them to `latest-<name>.*`.
///
/// # Errors
/// If a file cannot be written or the chart cannot be drawn.
pub fn write_results<T: serde::Serialize>(
    out: &Path,
    name: &str,
    started: jiff::Timestamp,
    results: &T,
    md: &str,
    quick: bool,
    chart: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let stem = out.join(format!("{name}-{}", started.strftime("%Y%m%dT%H%M%SZ")));
    std::fs::write(
        stem.with_extension("json"),
        serde_json::to_string_pretty(results)?,
    )?;
    std::fs::write(stem.with_extension("md"), md)?;
    chart(&stem.with_extension("png"))?;
    if !quick {
        for ext in ["json", "md", "png"] {
            std::fs::copy(
                stem.with_extension(ext),
                out.join(format!("latest-{name}.{ext}")),
            )?;
        }
    }
    Ok(())
}

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Registers DejaVu Sans as the charts' `sans-serif` (once per process).
///
/// # Errors
/// If the font file is missing or unusable.
pub fn register_font() -> Result<()> {
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if DONE.get().is_some() {
        return Ok(());
    }
    let font = std::fs::read(FONT).with_context(|| {
        format!("reading {FONT} (Debian fonts-dejavu-core; run `cargo xtask setup`)")
    })?;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| anyhow::anyhow!("{FONT} is not a usable font"))?;
    let _ = DONE.set(());
    Ok(())
}

fn colour(mode: &str) -> RGBColor {
    match mode {
        "ebpf" => RGBColor(0x1b, 0x9e, 0x77),
        "generic" => RGBColor(0xd9, 0x5f, 0x02),
        _ => RGBColor(0x75, 0x70, 0xb3),
    }
}

/// The chart: kill → status distributions per mode at the largest pod count
/// (left) and idle evlet CPU against the pod count (right).
///
/// # Errors
/// If the font is missing or the PNG cannot be written.
pub fn chart(results: &Results, path: &Path) -> Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(700);
    let modes: Vec<String> = {
        let mut m: Vec<String> = results.runs.iter().map(|r| r.mode.clone()).collect();
        m.sort();
        m.dedup();
        m
    };
    let largest = results.runs.iter().map(|r| r.pods).max().unwrap_or(0);

    let max_ms = results
        .runs
        .iter()
        .filter_map(|r| r.kill_to_status.as_ref().map(|s| s.max_ms))
        .fold(10.0_f64, f64::max);
    let mut cdf = ChartBuilder::on(&left)
        .caption(
            format!("kill → status, {largest} pods (CDF)"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((1.0_f64..max_ms * 1.5).log_scale(), 0.0_f64..1.0)?;
    cdf.configure_mesh()
        .x_desc("milliseconds (log)")
        .y_desc("fraction of kills")
        .draw()?;
    for mode in &modes {
        let Some(s) = results
            .runs
            .iter()
            .find(|r| r.pods == largest && &r.mode == mode)
            .and_then(|r| r.kill_to_status.as_ref())
        else {
            continue;
        };
        let n = s.samples_ms.len() as f64;
        let points = s
            .samples_ms
            .iter()
            .enumerate()
            .map(|(i, &v)| (v.max(1.0), (i + 1) as f64 / n));
        let c = colour(mode);
        cdf.draw_series(LineSeries::new(points, c.stroke_width(3)))?
            .label(mode.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    cdf.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;

    let max_cpu = results
        .runs
        .iter()
        .map(|r| r.evlet_cpu_pct)
        .fold(0.1_f64, f64::max);
    let mut cpu = ChartBuilder::on(&right)
        .caption("idle evlet CPU vs pods", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(
            (1.0_f64..(largest.max(10) as f64) * 1.5).log_scale(),
            (0.001_f64..max_cpu * 2.0).log_scale(),
        )?;
    cpu.configure_mesh()
        .x_desc("pods (log)")
        .y_desc("% of one core (log)")
        .draw()?;
    for mode in &modes {
        let mut points: Vec<(f64, f64)> = results
            .runs
            .iter()
            .filter(|r| &r.mode == mode)
            .map(|r| (r.pods as f64, r.evlet_cpu_pct.max(0.001)))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let c = colour(mode);
        cpu.draw_series(LineSeries::new(points.clone(), c.stroke_width(3)))?
            .label(mode.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
        cpu.draw_series(points.into_iter().map(|p| Circle::new(p, 5, c.filled())))?;
    }
    cpu.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start_s: f64, kills_ms: &[u64], rss: f64) -> Run {
        let kills: Vec<_> = kills_ms
            .iter()
            .map(|&ms| std::time::Duration::from_millis(ms))
            .collect();
        Run {
            mode: "ebpf".into(),
            pods: 10,
            start_total_s: start_s,
            evlet_rss_mib: rss,
            kill_to_status: Summary::of(&kills),
            errors: vec![format!("round at {start_s}")],
            ..Run::default()
        }
    }

    #[test]
    fn rounds_merge_into_every_sample_and_the_median_start() {
        let merged = Run::merge(vec![
            run(0.9, &[3, 4], 22.0),
            run(0.7, &[], 30.0),
            run(0.8, &[9, 2, 5], 31.0),
        ])
        .expect("three rounds");
        assert_eq!(merged.start_total_s, 0.8);
        assert_eq!(merged.start_total_rounds_s, [0.9, 0.7, 0.8]);
        let kills = merged.kill_to_status.expect("kills");
        assert_eq!(kills.samples_ms, [2.0, 3.0, 4.0, 5.0, 9.0]);
        assert_eq!((kills.n, kills.p50_ms, kills.max_ms), (5, 4.0, 9.0));
        // The idle figures are the first round's, the only one with a window.
        assert_eq!(merged.evlet_rss_mib, 22.0);
        assert_eq!(merged.errors.len(), 3);
        // One round is left as it was.
        let one = Run::merge(vec![run(0.9, &[3], 22.0)]).expect("a round");
        assert!(one.start_total_rounds_s.is_empty());
        assert!(Run::merge(Vec::new()).is_none());
    }

    #[test]
    fn figures_keep_the_digits_a_target_needs() {
        assert_eq!(fmt_ms(Some(0.177)), "0.18");
        assert_eq!(fmt_ms(Some(6.43)), "6.4");
        assert_eq!(fmt_ms(Some(254.4)), "254");
        assert_eq!(fmt_ms(None), "–");
    }
}
