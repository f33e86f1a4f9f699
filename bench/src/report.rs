//! The benchmark's results: JSON (everything, with raw samples), a Markdown
//! table per pod count with ratios against `ebpf` ([`markdown`]), and a PNG
//! chart ([`chart`]); rounds of one pod count merged into one result.

mod chart;
mod markdown;

use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

pub use chart::{chart, register_font};
pub use markdown::markdown;

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
    /// over CRI at once: the floor of "kill → replacement running". The kills
    /// keep evlet's pace (`schedule`: as long after the start, the same gap
    /// after each); results before that pace was shared killed back to back
    /// as soon as the start ended.
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

impl Machine {
    /// This host: its kernel, CPUs and memory, with the runtime's version
    /// (`containerd`) and evlet's build `profile` as the caller knows them.
    pub fn here(containerd: String, profile: &str) -> Self {
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
        Self {
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
}

/// One agent (an evlet PLEG mode, or upstream kubelet) at one pod count.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Run {
    /// The PLEG mode, or `upstream` / `upstream-evented`.
    pub mode: String,
    /// Pods running during the run.
    pub pods: usize,
    /// Manifests written → the last pod's container started (`StartContainer`
    /// returned, evlet's log), seconds: the end the floor times. With rounds,
    /// this and the other start figures are the rounds' medians.
    pub start_total_s: f64,
    /// Each round's `start_total_s`, when this pod count ran in rounds (a
    /// fresh agent and pods each, as the floor's rounds; the idle window and
    /// the CRI calls are measured in the first only). Empty: a single run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub start_total_rounds_s: Vec<f64>,
    /// How many of the rounds had kills and OOM kills, whose samples the
    /// latencies pool; the others only timed the batch start
    /// (`--start-rounds`). 0 in results from before it was counted, where
    /// every round killed.
    #[serde(default)]
    pub kill_rounds: usize,
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
    /// evlet's resident memory after the idle window. The `evlet_*` figures
    /// are the agent's, upstream kubelet's in its rows.
    pub evlet_rss_mib: f64,
    /// The agent's CRI calls per second over the idle window (its
    /// `kubelet_runtime_operations_total`); none in results from before.
    #[serde(default)]
    pub idle_cri_calls_per_s: Option<f64>,
    /// SIGKILL of a container's init → the PLEG's ContainerDied event (evlet's log).
    pub kill_to_event: Option<Summary>,
    /// SIGKILL → `/pods/<ns>/<name>` shows the container terminated.
    pub kill_to_status: Option<Summary>,
    /// SIGKILL → the agent published that status, by its own timeline
    /// (evlet only): kill → status without the observer's part.
    #[serde(default)]
    pub kill_to_published: Option<Summary>,
    /// SIGKILL → CRI `ContainerStatus` says EXITED, on every observed kill:
    /// the floor of any agent that reads the runtime. In `ebpf` the agent is
    /// already creating the replacement meanwhile, which loads the runtime.
    pub kill_to_runtime: Option<Summary>,
    /// containerd's own exit lag: SIGKILL → CRI says EXITED, on the observed
    /// kills where it did so no later than `/pods` showed the kill, so before
    /// the agent began the replacement (`kills::exit_lag_before_agent`).
    /// In `generic` that is every kill (its relist reads the exit from CRI),
    /// in `ebpf` none (its status comes first): the figure to quote is
    /// `generic`'s.
    #[serde(default)]
    pub runtime_exit_lag: Option<Summary>,
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
    /// Every OOM kill with the delay its hog waited before allocating, drawn
    /// per pod (`oom::HOG_DELAY_MS`), in the order they ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oom_samples: Vec<OomSample>,
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

/// One OOM kill: its hog's delay, with the latencies it gave (None where
/// the figure did not come: an error, or a mode without kernel records).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OomSample {
    /// The pod (`oom<k>-<node>`).
    pub pod: String,
    /// The hog's wait after its container started, before it allocated (ms).
    pub hog_delay_ms: u64,
    /// The kernel's first OOM message → `OOMKilled` in `/pods` (ms).
    pub to_status_ms: Option<f64>,
    /// The victim's exit (kernel) → `OOMKilled` in `/pods` (ms).
    pub exit_to_status_ms: Option<f64>,
    /// The victim's exit → evlet published `OOMKilled` (timeline, ms).
    pub exit_to_published_ms: Option<f64>,
}

impl Run {
    /// Rounds of one mode at one pod count as one run: every sample of every
    /// round (start-only rounds have none but the starts'); the start
    /// figures' medians; the idle figures of the first round (the only one
    /// with an idle window). `None` without rounds.
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
            kill_to_published: all(|r| &r.kill_to_published),
            kill_to_runtime: all(|r| &r.kill_to_runtime),
            runtime_exit_lag: all(|r| &r.runtime_exit_lag),
            kill_rounds: rounds.iter().map(|r| r.kill_rounds).sum(),
            oom_samples: rounds.iter().flat_map(|r| r.oom_samples.clone()).collect(),
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
    fn start_only_rounds_add_their_starts_and_leave_the_kill_samples_alone() {
        let lag = |ms: &[u64]| {
            Summary::of(
                &ms.iter()
                    .map(|&ms| std::time::Duration::from_millis(ms))
                    .collect::<Vec<_>>(),
            )
        };
        let oom = |delay| OomSample {
            pod: "oom0-bench".into(),
            hog_delay_ms: delay,
            to_status_ms: Some(4.0),
            ..OomSample::default()
        };
        let full = Run {
            pods: 500,
            start_total_s: 69.0,
            runtime_exit_lag: lag(&[120, 90]),
            kill_rounds: 1,
            oom_samples: vec![oom(737), oom(1204)],
            evlet_rss_mib: 39.1,
            ..run(69.0, &[3, 4], 39.1)
        };
        let start_only = |s| Run {
            pods: 500,
            kill_rounds: 0,
            errors: Vec::new(),
            ..run(s, &[], 0.0)
        };
        let merged = Run::merge(vec![full, start_only(67.1), start_only(70.4)]).expect("rounds");
        assert_eq!(merged.start_total_s, 69.0);
        assert_eq!(merged.start_total_rounds_s, [69.0, 67.1, 70.4]);
        assert_eq!(merged.kill_rounds, 1);
        assert_eq!(merged.kill_to_status.expect("kills").n, 2);
        assert_eq!(
            merged.runtime_exit_lag.expect("exit lag").samples_ms,
            [90.0, 120.0]
        );
        let delays: Vec<u64> = merged.oom_samples.iter().map(|o| o.hog_delay_ms).collect();
        assert_eq!(delays, [737, 1204]);
        assert_eq!(merged.evlet_rss_mib, 39.1);
    }

    #[test]
    fn floor_rounds_take_the_median_start() {
        let floor = |s| Floor {
            pods: 100,
            start_total_s: s,
            start_total_rounds_s: Vec::new(),
            create_start: None,
            kill_replacement: None,
            start_containerd_cpu_s: None,
        };
        let merged = Floor::merge(vec![floor(8.9), floor(9.4), floor(8.7)]).expect("rounds");
        assert_eq!(merged.start_total_s, 8.9);
        assert_eq!(merged.start_total_rounds_s, [8.9, 9.4, 8.7]);
        let one = Floor::merge(vec![floor(8.9)]).expect("a round");
        assert!(one.start_total_rounds_s.is_empty());
    }
}
