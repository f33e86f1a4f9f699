//! `cargo xtask bench`: the eBPF probes' own latency and cost
//! (`bench/src/bin/probe_latency.rs`), then the PLEG modes side by side
//! (`bench/src/bin/pleg_modes.rs`); `--suite probes`: what liveness and
//! readiness probing costs at density (`bench/src/bin/probe_cost.rs`);
//! `--suite eviction`: how soon memory pressure is noticed
//! (`bench/src/bin/eviction_latency.rs`).
//!
//! Sets up, builds evlet (release; `--quick` uses the debug build the tests
//! already made) and, for the `upstream` rows, upstream kubelet from the
//! pinned module, brings up the containerd 1.7 node (every mode, `cri-events`
//! and `upstream-evented` included, runs on the same runtime), runs the
//! harness with the node's environment, and takes the node down again.

use anyhow::{Context as _, Result};

use crate::cluster;
use crate::containerd::Version;
use crate::node::Node;
use crate::sh::cargo;
use crate::{paths, setup, sh};

/// Options of `cargo xtask bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Pod counts.
    #[arg(long, value_delimiter = ',', default_values = ["10", "100", "500", "1000"])]
    pods: Vec<usize>,
    /// PLEG modes of evlet, and the control: `upstream` (upstream kubelet of
    /// the pinned release, its default PLEG) and `upstream-evented` (with
    /// `EventedPLEG`).
    #[arg(long, value_delimiter = ',', default_values = ["generic", "cri-events", "ebpf", "upstream", "upstream-evented"])]
    modes: Vec<String>,
    /// N = 10, short windows, debug build, results under target/bench: checks the
    /// harness (CI), numbers are not for comparison.
    #[arg(long)]
    quick: bool,
    /// What to measure: `pleg` (the PLEG modes), `probes` (probe cost),
    /// `streams` (logs -f and exec through the kubelet API), `eviction`
    /// (memory-pressure detection, kernel against timer), or `all`.
    #[arg(long, value_enum, default_value = "pleg")]
    suite: Suite,
    /// Batch starts of the PLEG modes at each pod count, at least: rounds
    /// past the full ones time only the start, whose figure is then their
    /// median. Default 3 (1 with `--quick`).
    #[arg(long)]
    start_rounds: Option<usize>,
    /// Observed kills per mode and pod count (as many unobserved ones
    /// again): 30 by default; past 100, p99 is no longer the largest sample.
    #[arg(long)]
    kills: Option<usize>,
}

/// The benchmark suites.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Suite {
    /// The eBPF probes' latency and the PLEG modes side by side.
    Pleg,
    /// What liveness and readiness probes cost at 100 and 500 pods.
    Probes,
    /// `logs -f` throughput and exec round trips through the kubelet API.
    Streams,
    /// Memory-pressure detection: the kernel's notification against the timer.
    Eviction,
    /// All of them.
    All,
}

impl Options {
    /// What `cargo xtask test` runs: the harness end to end, no timing checks.
    pub fn quick() -> Self {
        Self {
            pods: vec![10],
            // Upstream kubelet's default PLEG only: `upstream-evented` runs
            // the same harness code.
            modes: ["generic", "cri-events", "ebpf", "upstream"]
                .map(String::from)
                .to_vec(),
            quick: true,
            suite: Suite::All,
            start_rounds: None,
            kills: None,
        }
    }
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// Runs the benchmark; results go to `bench/results` (`target/bench/results` with `--quick`).
pub fn bench(options: &Options) -> Result<()> {
    setup::setup()?;
    let profile = if options.quick { "debug" } else { "release" };
    let mut build = vec!["build", "--locked", "-p", "evlet", "--bin", "evlet"];
    if !options.quick {
        build.push("--release");
    }
    sh::run(&mut cargo(&build)).context("building evlet")?;
    let repo = paths::repo();
    let evlet = repo.join("target").join(profile).join("evlet");
    let out = if options.quick {
        repo.join("target/bench/results")
    } else {
        repo.join("bench/results")
    };
    let mut command = format!(
        "cargo xtask bench --pods {} --modes {}",
        join(&options.pods),
        join(&options.modes)
    );
    if options.quick {
        command = "cargo xtask bench --quick".into();
    }
    if let Some(n) = options.start_rounds {
        command += &format!(" --start-rounds {n}");
    }
    if let Some(n) = options.kills {
        command += &format!(" --kills {n}");
    }
    let pleg = matches!(options.suite, Suite::Pleg | Suite::All);
    let probe_cost = matches!(options.suite, Suite::Probes | Suite::All);
    let streams = matches!(options.suite, Suite::Streams | Suite::All);
    let eviction = matches!(options.suite, Suite::Eviction | Suite::All);
    if pleg {
        let mut probes = vec!["run", "--locked", "-q", "-p", "evlet-bench"];
        if !options.quick {
            probes.push("--release");
        }
        probes.extend(["--bin", "probe_latency", "--"]);
        if options.quick {
            probes.push("--quick");
        }
        sh::run(cargo(&probes).arg("--out").arg(&out)).context("the probe benchmark failed")?;
    }
    // The control: upstream kubelet, built from the pinned module (a warm Go
    // cache relinks it in seconds).
    let upstream = if pleg && options.modes.iter().any(|m| m.starts_with("upstream")) {
        Some(cluster::kubelet(cluster::Version::V1_34).context("building upstream kubelet")?)
    } else {
        None
    };
    let node = Node::new(Version::V1_7);
    let harness = |bin: &str, extra: Vec<String>| -> Result<()> {
        let mut args: Vec<String> = ["run", "--locked", "-q", "-p", "evlet-bench"]
            .map(String::from)
            .to_vec();
        if !options.quick {
            args.push("--release".into());
        }
        args.extend(["--bin".into(), bin.into(), "--".into()]);
        args.extend(extra);
        if options.quick {
            args.push("--quick".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = cargo(&args);
        cmd.envs(node.env())
            .arg("--evlet")
            .arg(&evlet)
            .arg("--out")
            .arg(&out)
            .arg("--work")
            .arg(repo.join("target/bench/work"));
        sh::run(&mut cmd).with_context(|| format!("the benchmark {bin} failed"))
    };
    let result = node.up().and_then(|()| {
        if pleg {
            let pods = if options.quick {
                "10".to_owned()
            } else {
                join(&options.pods)
            };
            let mut extra = vec![
                "--pods".into(),
                pods,
                "--modes".into(),
                join(&options.modes),
                "--profile".into(),
                profile.into(),
                "--command".into(),
                command.clone(),
            ];
            if let Some(n) = options.start_rounds {
                extra.extend(["--start-rounds".into(), n.to_string()]);
            }
            if let Some(n) = options.kills {
                extra.extend(["--kills".into(), n.to_string()]);
            }
            if let Some(kubelet) = &upstream {
                extra.extend(["--upstream-kubelet".into(), kubelet.display().to_string()]);
            }
            harness("pleg_modes", extra)?;
        }
        if probe_cost {
            let command = if options.quick {
                "cargo xtask bench --suite probes --quick".to_owned()
            } else {
                "cargo xtask bench --suite probes".to_owned()
            };
            harness("probe_cost", vec!["--command".into(), command])?;
        }
        if streams {
            let command = if options.quick {
                "cargo xtask bench --suite streams --quick".to_owned()
            } else {
                "cargo xtask bench --suite streams".to_owned()
            };
            harness("stream_cost", vec!["--command".into(), command])?;
        }
        if eviction {
            let command = if options.quick {
                "cargo xtask bench --suite eviction --quick".to_owned()
            } else {
                "cargo xtask bench --suite eviction".to_owned()
            };
            harness("eviction_latency", vec!["--command".into(), command])?;
        }
        Ok(())
    });
    let down = node.down();
    result?;
    down
}
