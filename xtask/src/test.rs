//! `cargo xtask test`: every check and test, in the order CI runs them.
//!
//! Test targets are classified by name: `node_*` need a private containerd
//! (run once per containerd line with the node's environment), `kernel_*` need
//! root and the host kernel's eBPF; all others are plain tests. The agent's
//! end-to-end suite (`node_agent`) runs once per PLEG mode the line supports.
//! Before the node stage the upstream control plane (`cargo xtask cluster up
//! --version 1.34`) comes up, the API-mode suites join it
//! (`EVLET_E2E_CLUSTER=<its cluster.env>`), and afterwards it is left as it
//! was found: stopped again only if this run started it.
//! After the node suites, upstream's conformance CI subset runs against evlet
//! on the same cluster (`cargo xtask conformance --subset ci`).
//! Each fuzz target runs for a short bounded time (`--fuzz-time`), then
//! `cargo xtask bench --quick` proves the benchmark harness works. A privileged
//! test that cannot run fails under `CI=true` (see `evlet-testkit`).

use std::fs;
use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::cluster::{Cluster, Version as ClusterVersion};
use crate::containerd::Version;
use crate::node::Node;
use crate::sh::cargo;
use crate::{paths, setup, sh};

/// Options of `cargo xtask test`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// containerd lines the node tests run on.
    #[arg(long, value_delimiter = ',', default_values = ["1.6", "1.7", "2.1"])]
    containerd: Vec<Version>,
    /// Skip fmt and clippy.
    #[arg(long)]
    no_lint: bool,
    /// Skip the qemu kernel matrix.
    #[arg(long)]
    no_vm: bool,
    /// Skip the quick benchmark run.
    #[arg(long)]
    no_bench: bool,
    /// Skip the fuzz targets.
    #[arg(long)]
    no_fuzz: bool,
    /// Skip the conformance CI subset (`cargo xtask conformance --subset ci`).
    #[arg(long)]
    no_conformance: bool,
    /// Also the version-skew pass: the API-mode suites of [`SKEW_SUITES`] on
    /// containerd 2.1 against the newest served control plane (1.37), three
    /// minors ahead of evlet's own, as upstream allows.
    #[arg(long)]
    full: bool,
    /// Seconds each fuzz target runs.
    #[arg(long, default_value_t = 30)]
    fuzz_time: u64,
    /// Pods of the density test on each containerd line (the test's own
    /// default, 500, is for a run by hand: three lines of 500 at once do not
    /// fit CI's time on two cores).
    #[arg(long, default_value_t = 150)]
    density_pods: usize,
    /// Options of the kernel matrix.
    #[command(flatten)]
    vm: crate::vm::Options,
}

/// The workspace's test targets by what they need.
#[derive(Debug, Default)]
pub struct Targets {
    /// Tests that need nothing.
    pub plain: Vec<String>,
    /// Tests that need a private containerd.
    pub node: Vec<String>,
    /// Tests that need root and eBPF.
    pub kernel: Vec<String>,
}

/// Classifies the workspace's test targets by name prefix.
pub fn test_targets() -> Result<Targets> {
    let out = sh::output(&mut cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--locked",
    ]))?;
    let meta: serde_json::Value =
        serde_json::from_str(&out).context("cargo metadata printed invalid JSON")?;
    let mut targets = Targets::default();
    let packages = meta["packages"].as_array().cloned().unwrap_or_default();
    for target in packages
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
    {
        let is_test = target["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "test"));
        let Some(name) = target["name"].as_str().filter(|_| is_test) else {
            continue;
        };
        let list = if name.starts_with("node_") {
            &mut targets.node
        } else if name.starts_with("kernel_") {
            &mut targets.kernel
        } else {
            &mut targets.plain
        };
        list.push(name.to_owned());
    }
    Ok(targets)
}

/// The agent's end-to-end suite, run in every PLEG mode.
const E2E_SUITE: &str = "node_agent";

/// Suites that run on one containerd line only, and which: TLS bootstrap
/// and certificate rotation wait out a 10-minute certificate (the API's
/// shortest) and test the agent's API client, not the runtime, so one line
/// (the one whose other suites end first) carries them within CI's time.
const ONE_LINE_SUITES: &[(&str, Version)] = &[("node_bootstrap", Version::V1_6)];

/// Suites that take the shared control plane away (etcd restarted under a
/// running agent) and so run alone, on the line named, once every line's
/// other suites are done.
const SERIAL_SUITES: &[(&str, Version)] = &[("node_cluster_restart", Version::V1_7)];

/// The node suites line `version` runs alongside the other lines.
fn line_targets(node_targets: &[String], version: Version) -> Vec<String> {
    node_targets
        .iter()
        .filter(|t| {
            ONE_LINE_SUITES
                .iter()
                .all(|(suite, line)| t.as_str() != *suite || *line == version)
                && SERIAL_SUITES.iter().all(|(suite, _)| t.as_str() != *suite)
        })
        .cloned()
        .collect()
}

/// The serial suites among `node_targets` that line `version` runs.
fn serial_targets(node_targets: &[String], version: Version) -> Vec<String> {
    SERIAL_SUITES
        .iter()
        .filter(|(suite, line)| *line == version && node_targets.iter().any(|t| t == suite))
        .map(|(suite, _)| (*suite).to_owned())
        .collect()
}

/// The PLEG mode every node suite runs in on a containerd line. `ebpf`
/// (evlet's own mode, where "no missed events" is checked by counting
/// relists) on 1.6 and 2.1; `generic` on 1.7, as the control: upstream's
/// relist finds every change by polling, so it counts no missed events.
fn suite_mode(version: Version) -> &'static str {
    match version {
        Version::V1_7 => "generic",
        Version::V1_6 | Version::V2_1 => "ebpf",
    }
}

/// The PLEG modes a containerd line supports.
fn pleg_modes(version: Version) -> &'static [&'static str] {
    match version {
        Version::V1_6 => &["generic", "ebpf"],
        Version::V1_7 | Version::V2_1 => &["generic", "ebpf", "cri-events"],
    }
}

/// What a run in `mode` proves, for the log.
fn mode_note(mode: &str) -> &'static str {
    if mode == "generic" {
        " [control: upstream's 1 s relist; missed events are not counted]"
    } else {
        ""
    }
}

fn with_tests<'a>(mut args: Vec<&'a str>, tests: &'a [String]) -> Vec<&'a str> {
    for t in tests {
        args.extend(["--test", t.as_str()]);
    }
    args
}

/// A `cargo test` command as CI runs it: a privileged test that cannot run
/// fails instead of skipping, here as in CI.
fn cargo_test(args: &[&str]) -> Command {
    let mut cmd = cargo(args);
    cmd.env("CI", "true");
    cmd
}

/// Times a stage and says how long it took.
fn stage<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = Instant::now();
    let result = f();
    eprintln!(
        "test: stage {name} {} in {:.0?}",
        if result.is_ok() { "passed" } else { "FAILED" },
        started.elapsed()
    );
    result
}

/// The node suites `node_targets` on one containerd line, against the
/// line's own containerd; everything they print goes to `log`.
fn run_line(
    node: &Node,
    node_targets: &[String],
    density: usize,
    cluster_env: &Path,
    log: &Path,
) -> Result<()> {
    let mut out = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    // --no-fail-fast: every suite runs and reports, even after a failing one.
    let main = suite_mode(node.version);
    let mut suites: Vec<(Vec<&str>, &str)> = vec![(
        with_tests(vec!["test", "--locked", "--no-fail-fast"], node_targets),
        main,
    )];
    if node_targets.iter().any(|t| t == E2E_SUITE) {
        for mode in pleg_modes(node.version).iter().filter(|m| **m != main) {
            suites.push((vec!["test", "--locked", "--test", E2E_SUITE], mode));
        }
    }
    for (args, mode) in suites {
        let mut cmd = cargo_test(&args);
        cmd.envs(node.env())
            .env("EVLET_E2E_PLEG", mode)
            .env("EVLET_DENSITY_PODS", density.to_string())
            .env("EVLET_E2E_CLUSTER", cluster_env)
            .stdout(out.try_clone()?)
            .stderr(out.try_clone()?);
        let line = format!(
            "{} (EVLET_E2E_PLEG={mode}){}",
            sh::display(&cmd),
            mode_note(mode)
        );
        writeln!(out, "$ {line}")?;
        let started = Instant::now();
        let status = cmd
            .status()
            .with_context(|| format!("cannot start `{line}`"))?;
        writeln!(
            out,
            "test: `{line}`: {status} after {:.0?}",
            started.elapsed()
        )?;
        if !status.success() {
            bail!("`{line}` failed: {status}");
        }
    }
    Ok(())
}

/// The node suites of every containerd line: the nodes come up one after the
/// other (their downloads share one private APT cache), then each line runs
/// in parallel on its own containerd (two agents on one runtime would take
/// each other's pods for orphans). Each line's output is printed whole when it
/// ends. The API-mode suites of every line join the one control plane whose
/// `cluster.env` is `cluster_env`, each test as a node of its own.
fn node_suites(options: &Options, node_targets: &[String], cluster_env: &Path) -> Vec<String> {
    let mut failures = Vec::new();
    let mut up = Vec::new();
    for version in &options.containerd {
        let node = Node::new(*version);
        match node.up() {
            Ok(()) => up.push(node),
            Err(err) => failures.push(format!("containerd {version}: node up: {err:#}")),
        }
    }
    let logs = paths::repo().join("target/test-logs");
    if let Err(err) = fs::create_dir_all(&logs) {
        failures.push(format!("{}: {err}", logs.display()));
        return failures;
    }
    std::thread::scope(|scope| {
        let running: Vec<_> = up
            .iter()
            .map(|node| {
                let log = logs.join(format!("node-{}.log", node.version));
                let handle = scope.spawn({
                    let log = log.clone();
                    move || {
                        let started = Instant::now();
                        (
                            run_line(
                                node,
                                &line_targets(node_targets, node.version),
                                options.density_pods,
                                cluster_env,
                                &log,
                            ),
                            started.elapsed(),
                        )
                    }
                });
                (node, log, handle)
            })
            .collect();
        for (node, log, handle) in running {
            let (result, took) = handle.join().unwrap_or_else(|_| {
                (
                    Err(anyhow::anyhow!("the test thread panicked")),
                    Duration::ZERO,
                )
            });
            report(node, "node suites", result, took, &log, &mut failures);
        }
    });
    for node in &up {
        let serial = serial_targets(node_targets, node.version);
        if serial.is_empty() {
            continue;
        }
        let log = logs.join(format!("node-{}-serial.log", node.version));
        let started = Instant::now();
        let result = run_line(node, &serial, options.density_pods, cluster_env, &log);
        report(
            node,
            "serial suites",
            result,
            started.elapsed(),
            &log,
            &mut failures,
        );
    }
    for node in &up {
        if let Err(err) = node.down() {
            failures.push(format!("containerd {} teardown: {err:#}", node.version));
        }
    }
    failures
}

/// Prints how `what` (node or serial suites) ended on `node`'s line and its
/// whole log; a failure joins `failures`.
fn report(
    node: &Node,
    what: &str,
    result: Result<()>,
    took: Duration,
    log: &Path,
    failures: &mut Vec<String>,
) {
    eprintln!(
        "\n======== containerd {}: {what} {} in {took:.0?} ({}) ========",
        node.version,
        if result.is_ok() { "passed" } else { "FAILED" },
        log.display()
    );
    eprintln!("{}", fs::read_to_string(log).unwrap_or_default());
    if let Err(err) = result {
        failures.push(format!("containerd {} {what}: {err:#}", node.version));
    }
}

/// The API-mode suites the version-skew pass runs against the newest control
/// plane.
const SKEW_SUITES: &[&str] = &["node_api", "node_api_volumes", "node_kubectl"];

/// The version-skew pass (`--full`): [`SKEW_SUITES`] on containerd 2.1
/// against the 1.37 control plane, left as it was found.
fn skew(options: &Options) -> Result<()> {
    let cluster = TestCluster::up(ClusterVersion::V1_37)?;
    let node = Node::new(Version::V2_1);
    let log = paths::repo().join("target/test-logs/skew-1.37.log");
    let result = node.up().and_then(|()| {
        let suites: Vec<String> = SKEW_SUITES.iter().map(|s| (*s).to_string()).collect();
        run_line(
            &node,
            &suites,
            options.density_pods,
            &cluster.env_file(),
            &log,
        )
    });
    eprintln!("{}", fs::read_to_string(&log).unwrap_or_default());
    let down = node.down();
    let left = cluster.leave();
    result.and(down).and(left)
}

/// An upstream control plane (1.34, evlet's own minor, for every line; 1.37
/// for the skew pass) the API-mode node suites join, and whether this run
/// started it: afterwards it is left as `up` found it.
struct TestCluster {
    /// The cluster.
    cluster: Cluster,
    /// True if no component ran before: this run stops it again.
    started: bool,
}

impl TestCluster {
    /// Brings the cluster of `version` up (idempotent), noting whether it
    /// was down.
    fn up(version: ClusterVersion) -> Result<Self> {
        let cluster = Cluster::new(version);
        let started = cluster.is_down();
        cluster.up()?;
        Ok(Self { cluster, started })
    }

    /// The `cluster.env` the node suites read (`EVLET_E2E_CLUSTER`).
    fn env_file(&self) -> std::path::PathBuf {
        self.cluster.env_file()
    }

    /// Stops the cluster if this run started it; one that was (even partly)
    /// up before stays up.
    fn leave(self) -> Result<()> {
        if self.started {
            self.cluster.down(false)
        } else {
            eprintln!(
                "test: cluster {} was up before the run; left up",
                self.cluster.version
            );
            Ok(())
        }
    }
}

/// A plain `cargo build` (PATH without `.tools/bin`, as a developer's shell
/// has it) still builds the kernel programs after setup: the loader's build
/// script finds `bpf-linker` in `.tools/bin`. Its own target directory, so
/// the check really links the probes.
fn plain_cargo_builds_the_probes() -> Result<()> {
    let tools = paths::tools_bin();
    let path: Vec<_> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).filter(|d| *d != tools).collect())
        .unwrap_or_default();
    let mut cmd = Command::new("cargo");
    cmd.current_dir(paths::repo())
        .env("PATH", std::env::join_paths(path)?)
        .env("CARGO_TARGET_DIR", paths::repo().join("target/plain-cargo"))
        .args(["check", "--locked", "-p", "evlet-ebpf"]);
    sh::run(&mut cmd).context("a plain `cargo check -p evlet-ebpf` (no .tools/bin on PATH) failed")
}

/// Runs the whole suite; the first failing stage ends it with an error.
pub fn test(options: &Options) -> Result<()> {
    let started = Instant::now();
    setup::setup()?;
    if !options.no_lint {
        stage("lint", || {
            sh::run(&mut cargo(&["fmt", "--all", "--", "--check"]))
                .context("formatting differs: run `cargo fmt --all`")?;
            sh::run(&mut cargo(&[
                "clippy",
                "--locked",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))
        })?;
    }
    let targets = test_targets()?;
    stage("build", || {
        sh::run(&mut cargo_test(&["test", "--locked", "--no-run"]))?;
        plain_cargo_builds_the_probes()
    })?;
    stage("plain tests", || {
        sh::run(&mut cargo_test(&with_tests(
            vec!["test", "--locked", "--lib", "--bins"],
            &targets.plain,
        )))?;
        sh::run(&mut cargo_test(&["test", "--locked", "--doc"]))
    })?;
    if !targets.kernel.is_empty() {
        stage("kernel tests", || {
            sh::run(&mut cargo_test(&with_tests(
                vec!["test", "--locked"],
                &targets.kernel,
            )))
        })?;
    }
    if !options.no_fuzz {
        stage("fuzz", || {
            crate::fuzz::fuzz(&crate::fuzz::Options {
                time: options.fuzz_time,
                target: Vec::new(),
            })
            .map(|_| ())
        })?;
    }
    if !targets.node.is_empty() {
        let cluster = stage("cluster up", || TestCluster::up(ClusterVersion::V1_34))?;
        let tested = stage("node tests", || {
            let failures = node_suites(options, &targets.node, &cluster.env_file());
            if failures.is_empty() {
                Ok(())
            } else {
                bail!("node tests failed:\n{}", failures.join("\n"))
            }
        });
        // Upstream's own specs, on the same cluster once the lines are done
        // with their nodes (it takes the 1.7 node's lock).
        let conformance = if options.no_conformance || tested.is_err() {
            Ok(())
        } else {
            stage("conformance (ci subset)", crate::conformance::ci)
        };
        stage("cluster down (if started here)", || cluster.leave())?;
        tested?;
        conformance?;
        if options.full {
            stage("version skew (1.37 control plane)", || skew(options))?;
        }
    }
    if !options.no_bench {
        stage("bench --quick", || {
            crate::bench::bench(&crate::bench::Options::quick())
                .context("the benchmark harness (cargo xtask bench --quick)")
        })?;
    }
    if !options.no_vm && !targets.kernel.is_empty() {
        stage("vm-test", || {
            crate::vm::vm_test(&options.vm, &targets.kernel)
        })?;
    }
    eprintln!("test: all passed in {:.0?}", started.elapsed());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn serial_and_one_line_suites_leave_the_parallel_lines() {
        let all = names(&["node_api", "node_bootstrap", "node_cluster_restart"]);
        assert_eq!(
            line_targets(&all, Version::V1_6),
            names(&["node_api", "node_bootstrap"])
        );
        assert_eq!(line_targets(&all, Version::V1_7), names(&["node_api"]));
        assert_eq!(
            serial_targets(&all, Version::V1_7),
            names(&["node_cluster_restart"])
        );
        assert!(serial_targets(&all, Version::V2_1).is_empty());
        assert!(serial_targets(&names(&["node_api"]), Version::V1_7).is_empty());
    }
}
