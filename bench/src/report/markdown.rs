//! The Markdown report of the PLEG modes benchmark: a table per pod count
//! with ratios against `ebpf`, the CRI status calls, and the runtime's floor.

use std::fmt::Write as _;

use super::{Floor, Results, Run, SLOW_MS};

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

/// Rows whose figures are samples (pooled over rounds) or the idle window's.
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
    ("kill → status published p50 (ms, timeline)", |r| {
        Some(r.kill_to_published.as_ref()?.p50_ms)
    }),
    ("kill → status published p99 (ms, timeline)", |r| {
        Some(r.kill_to_published.as_ref()?.p99_ms)
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
    ("kill → CRI exited p50 (ms, every observed kill)", |r| {
        Some(r.kill_to_runtime.as_ref()?.p50_ms)
    }),
    ("kill → CRI exited p99 (ms, every observed kill)", |r| {
        Some(r.kill_to_runtime.as_ref()?.p99_ms)
    }),
    (
        "containerd's exit lag p50 (ms, kill → CRI exited before the agent's status)",
        |r| Some(r.runtime_exit_lag.as_ref()?.p50_ms),
    ),
    (
        "containerd's exit lag p99 (ms, kill → CRI exited before the agent's status)",
        |r| Some(r.runtime_exit_lag.as_ref()?.p99_ms),
    ),
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
    ("idle agent CPU (% of a core)", |r| Some(r.evlet_cpu_pct)),
    ("idle containerd CPU (% of a core)", |r| {
        Some(r.containerd_cpu_pct)
    }),
    ("agent RSS (MiB)", |r| Some(r.evlet_rss_mib)),
    ("idle agent CRI calls per second", |r| {
        r.idle_cri_calls_per_s
    }),
    ("start per pod p50 (ms)", |r| {
        Some(r.start_per_pod.as_ref()?.p50_ms)
    }),
    ("start per pod p99 (ms)", |r| {
        Some(r.start_per_pod.as_ref()?.p99_ms)
    }),
];

/// Rows whose figures are one per round, the rounds' median: labelled with
/// how many rounds ([`start_label`]).
const START_METRICS: &[Metric] = &[
    ("start all pods (s)", |r| Some(r.start_total_s)),
    ("start: all running in /metrics (s)", |r| r.start_running_s),
    ("start: agent CPU (s)", |r| r.start_evlet_cpu_s),
    ("start: containerd CPU (s)", |r| r.start_containerd_cpu_s),
];

/// What a start figure from `rounds` rounds is: "single run" (one round, or
/// results from before rounds were kept) or "median of N".
fn start_note(rounds: usize) -> String {
    if rounds > 1 {
        format!("median of {rounds}")
    } else {
        "single run".to_owned()
    }
}

/// A start row's label (`"start all pods (s)"`) with [`start_note`] in its
/// parentheses: `"start all pods (s, single run)"`.
fn start_label(name: &str, rounds: usize) -> String {
    let note = start_note(rounds);
    match name.strip_suffix(')') {
        Some(open) => format!("{open}, {note})"),
        None => format!("{name} ({note})"),
    }
}

/// The floor's start cell: the figure and [`start_note`].
fn floor_start(f: &Floor) -> String {
    format!(
        "{:.1} ({})",
        f.start_total_s,
        start_note(f.start_total_rounds_s.len())
    )
}

/// The sentence under a pod count's table that ran in `rounds` rounds
/// (> 1), `kill_rounds` of them with kills (0: results from before
/// start-only rounds, where every round killed); `starts` lists each
/// round's start per mode and the floor's.
fn rounds_note(rounds: usize, kill_rounds: usize, starts: &[String]) -> String {
    let samples = match kill_rounds {
        0 => "the latencies pool every round's samples".to_owned(),
        k if k >= rounds => "the latencies pool every round's samples".to_owned(),
        1 => format!(
            "the latencies are the first round's (the other {} only time the start)",
            rounds - 1
        ),
        k => format!(
            "the latencies pool the first {k} rounds' samples (the other {} only time the start)",
            rounds - k
        ),
    };
    format!(
        "{rounds} rounds, each with a fresh agent and fresh pods: the start figures are the \
         rounds' medians, {samples}, the idle figures are the first round's. Start all pods \
         per round (s): {}.",
        starts.join("; ")
    )
}

/// The table rows of the runs at one pod count (`runs`, `ebpf` among them
/// or not) that ran in `rounds` rounds.
fn rows(out: &mut String, runs: &[&Run], rounds: usize) {
    let ebpf = runs.iter().find(|r| r.mode == "ebpf");
    let others: Vec<&&Run> = runs.iter().filter(|r| r.mode != "ebpf").collect();
    let labelled = METRICS
        .iter()
        .map(|(name, get)| ((*name).to_owned(), get))
        .chain(
            START_METRICS
                .iter()
                .map(|(name, get)| (start_label(name, rounds), get)),
        );
    for (name, get) in labelled {
        let _ = write!(out, "| {name} |");
        for r in runs {
            let _ = write!(out, " {} |", fmt_ms(get(r)));
        }
        if let Some(e) = ebpf {
            for r in &others {
                let _ = write!(out, " {} |", ratio(get(r), get(e)));
            }
        }
        *out += "\n";
    }
}

/// The Markdown report: one table per pod count.
pub fn markdown(results: &Results) -> String {
    let m = &results.machine;
    let mut out = format!(
        "Run {} on {} CPUs, {:.0} GiB, kernel {}, {}, evlet {} build{}.\n\
         Command: `{}`\n\n\
         The agents run with `--eviction-hard {}`: the disk thresholds at 1 %, so that a \
         host disk fuller than upstream's defaults allow does not put the node under \
         DiskPressure (whose reclaim every 10 s is not a healthy node's idle cost).\n",
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
        results.command,
        crate::EVICTION_HARD,
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
        let has_ebpf = runs.iter().any(|r| r.mode == "ebpf");
        let others = runs.iter().filter(|r| r.mode != "ebpf").count();
        let _ = write!(out, "\n### {pods} pods\n\n| metric |");
        for r in &runs {
            let _ = write!(out, " {} |", r.mode);
        }
        for r in runs.iter().filter(|r| r.mode != "ebpf") {
            let _ = write!(out, " {} ÷ ebpf |", r.mode);
        }
        out += "\n|---|";
        out += &"---:|".repeat(runs.len() + if has_ebpf { others } else { 0 });
        out += "\n";
        let rounds = runs
            .iter()
            .map(|r| r.start_total_rounds_s.len())
            .max()
            .unwrap_or(0);
        rows(&mut out, &runs, rounds);
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
            let kill_rounds = runs.iter().map(|r| r.kill_rounds).max().unwrap_or(0);
            let _ = writeln!(out, "\n{}", rounds_note(rounds, kill_rounds, &starts));
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
                "| {} | {} | {} | {} | {} |",
                f.pods,
                floor_start(f),
                fmt_ms(f.start_containerd_cpu_s),
                fmt_ms(sample.map(|s| s.p50_ms)),
                fmt_ms(sample.map(|s| s.p99_ms)),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Summary;
    use crate::report::Machine;

    #[test]
    fn figures_keep_the_digits_a_target_needs() {
        assert_eq!(fmt_ms(Some(0.177)), "0.18");
        assert_eq!(fmt_ms(Some(6.43)), "6.4");
        assert_eq!(fmt_ms(Some(254.4)), "254");
        assert_eq!(fmt_ms(None), "–");
    }

    #[test]
    fn start_rows_say_whether_they_are_one_run_or_a_median() {
        assert_eq!(
            start_label("start all pods (s)", 0),
            "start all pods (s, single run)"
        );
        assert_eq!(
            start_label("start all pods (s)", 1),
            "start all pods (s, single run)"
        );
        assert_eq!(
            start_label("start: agent CPU (s)", 3),
            "start: agent CPU (s, median of 3)"
        );
        assert_eq!(start_label("start", 5), "start (median of 5)");
    }

    #[test]
    fn the_rounds_note_says_which_rounds_the_latencies_come_from() {
        let starts = ["ebpf 9.50, 9.70, 9.60".to_owned()];
        let note = rounds_note(3, 1, &starts);
        assert!(
            note.contains("the latencies are the first round's (the other 2 only time the start)"),
            "{note}"
        );
        assert!(
            note.ends_with("per round (s): ebpf 9.50, 9.70, 9.60."),
            "{note}"
        );
        let note = rounds_note(5, 2, &starts);
        assert!(
            note.contains("pool the first 2 rounds' samples (the other 3"),
            "{note}"
        );
        for kill_rounds in [0, 5] {
            let note = rounds_note(5, kill_rounds, &starts);
            assert!(note.contains("pool every round's samples"), "{note}");
        }
    }

    fn results(runs: Vec<Run>, floors: Vec<Floor>) -> Results {
        Results {
            started: "2026-11-28 10:00 UTC".into(),
            command: "cargo xtask bench".into(),
            quick: false,
            machine: Machine {
                kernel: "6.18".into(),
                cpus: 2,
                memory_gib: 24.0,
                containerd: "containerd 1.7.24".into(),
                evlet_profile: "release".into(),
            },
            runs,
            cri: Vec::new(),
            floors,
            parallel_pod_starts: Some(8),
            failure: None,
        }
    }

    fn run(mode: &str, pods: usize, rounds: &[f64], exit_lag_ms: &[u64]) -> Run {
        let lag: Vec<_> = exit_lag_ms
            .iter()
            .map(|&ms| Duration::from_millis(ms))
            .collect();
        Run {
            mode: mode.into(),
            pods,
            start_total_s: rounds[rounds.len() / 2],
            start_total_rounds_s: if rounds.len() > 1 {
                rounds.to_vec()
            } else {
                Vec::new()
            },
            runtime_exit_lag: Summary::of(&lag),
            kill_rounds: 1,
            ..Run::default()
        }
    }

    fn floor(pods: usize, rounds: &[f64]) -> Floor {
        Floor {
            pods,
            start_total_s: rounds[rounds.len() / 2],
            start_total_rounds_s: if rounds.len() > 1 {
                rounds.to_vec()
            } else {
                Vec::new()
            },
            create_start: None,
            kill_replacement: None,
            start_containerd_cpu_s: None,
        }
    }

    fn row<'a>(md: &'a str, pods: usize, label: &str) -> &'a str {
        let table = md
            .split(&format!("### {pods} pods"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {pods}-pod table in\n{md}"));
        table
            .lines()
            .find(|l| l.starts_with(&format!("| {label} |")))
            .unwrap_or_else(|| panic!("no row {label:?} in\n{table}"))
    }

    #[test]
    fn the_report_labels_single_starts_and_medians_and_rows_the_exit_lag() {
        let md = markdown(&results(
            vec![
                run("ebpf", 100, &[9.6, 9.4, 9.9], &[]),
                run("generic", 100, &[9.8, 9.7, 10.1], &[41, 60, 52]),
                run("ebpf", 500, &[67.1], &[]),
                run("generic", 500, &[69.0], &[120]),
            ],
            vec![floor(100, &[8.9, 9.1, 8.8]), floor(500, &[70.2])],
        ));
        assert_eq!(
            row(&md, 100, "start all pods (s, median of 3)"),
            "| start all pods (s, median of 3) | 9.4 | 9.7 | 1.0× |"
        );
        assert_eq!(
            row(&md, 500, "start all pods (s, single run)"),
            "| start all pods (s, single run) | 67.1 | 69.0 | 1.0× |"
        );
        // The exit lag is generic's alone: ebpf's status always comes first.
        assert_eq!(
            row(
                &md,
                100,
                "containerd's exit lag p99 (ms, kill → CRI exited before the agent's status)"
            ),
            "| containerd's exit lag p99 (ms, kill → CRI exited before the agent's status) | – | 60.0 | – |"
        );
        assert!(md.contains("3 rounds, each with a fresh agent"), "{md}");
        assert!(md.contains("| 100 | 9.1 (median of 3) |"), "{md}");
        assert!(md.contains("| 500 | 70.2 (single run) |"), "{md}");
    }
}
