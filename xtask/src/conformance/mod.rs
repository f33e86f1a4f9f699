//! `cargo xtask conformance`: upstream's e2e node conformance specs against
//! evlet, with upstream kubelet of the same release on the same machine as
//! the control.
//!
//! One run: build `e2e.test`, `ginkgo`, `agnhost` (and upstream `kubelet`)
//! from the pinned module (`cluster build --with ...`) and evlet from this
//! checkout; bring up the loopback cluster (idempotent, shared, never taken
//! down here) and, under the node lock, the containerd node; build the
//! suite's images and import them ([`images`]); list the selected specs
//! ([`suite::enumerate`]); then for each kubelet in turn: start it as the one
//! node `conf-<kubelet>` ([`kubelet`]), wait for the Node to be Ready, run
//! ginkgo ([`suite::run_pass`]), delete what is left of its pods, stop it by
//! PID, delete its Node. Finally [`report`] pairs the results, one row per
//! selected spec, with the reason for every difference and skip
//! ([`known`]). The node is taken down again only if this run brought it up.
//!
//! `--subset ci` ([`CI_SUBSET`]) is the short evlet-only run CI calls through
//! [`ci`]. Method and results: `conformance/README.md`, `conformance/results/`.

mod certs;
mod images;
mod known;
mod kubectl;
mod kubelet;
mod lock;
mod report;
mod suite;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use self::kubelet::{Kind, Which};
use self::report::{KubeletRun, Report, SpecResult};
use self::suite::{Selection, Spec};
use crate::cluster::{self, Cluster};
use crate::containerd::{self, Version};
use crate::node::Node;
use crate::{paths, sh};

/// Options of `cargo xtask conformance`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Ginkgo focus regex (default: `\[NodeConformance\]|\[sig-node\].*\[Conformance\]`).
    #[arg(long)]
    pub focus: Option<String>,
    /// Ginkgo skip regex (default: `\[Serial\]|\[Disruptive\]|\[Flaky\]`; none with --all).
    #[arg(long)]
    pub skip: Option<String>,
    /// Which kubelet: evlet, upstream or both (default both; evlet with --subset ci).
    #[arg(long)]
    pub kubelet: Option<Which>,
    /// containerd line of the node.
    #[arg(long, default_value = "1.7")]
    pub containerd: Version,
    /// Also the Serial, Disruptive and Flaky specs, one at a time after the rest.
    #[arg(long)]
    pub all: bool,
    /// A named subset instead of the focus: `ci` (evlet only, about 6 minutes).
    #[arg(long)]
    pub subset: Option<Subset>,
    /// Ginkgo processes running specs at once.
    #[arg(long, default_value_t = 4)]
    pub procs: u32,
    /// Where ginkgo's reports, the logs and report.md go (default
    /// `target/conformance/<UTC time>`).
    #[arg(long)]
    pub report_dir: Option<PathBuf>,
}

/// `--subset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Subset {
    /// [`CI_SUBSET`]: pods, containers, probes, hooks, volumes, downward API,
    /// ConfigMaps, Secrets, security contexts, logs, exec.
    Ci,
}

/// The CI subset: fragments of spec texts (each matches one or a few
/// specs); specs that watch for minutes (the "*not* be restarted" probes,
/// back-off caps) are left out.
pub const CI_SUBSET: &[&str] = &[
    "[sig-node] Pods should be submitted and removed",
    "[sig-node] Pods should get a host IP",
    "[sig-node] Pods should be updated",
    "[sig-node] Pods should allow activeDeadlineSeconds to be updated",
    "[sig-node] Pods should support remote command execution over websockets",
    "[sig-node] Pods should support retrieving logs from the container over websockets",
    "[sig-node] Containers should",
    "[sig-node] Container Runtime blackbox test on terminated container",
    "[sig-node] Probing container should be restarted with a exec \"cat /tmp/health\" liveness probe",
    "[sig-node] Probing container should be restarted with a /healthz http liveness probe",
    "[sig-node] Probing container with readiness probe should not be ready before initial delay",
    "[sig-node] Container Lifecycle Hook when create a pod with lifecycle hook should execute poststart exec hook",
    "[sig-node] Container Lifecycle Hook when create a pod with lifecycle hook should execute prestop exec hook",
    "[sig-node] InitContainer [NodeConformance] should invoke init containers on a RestartNever pod",
    "[sig-node] Kubelet when scheduling a busybox command in a pod should print the output to logs",
    "[sig-node] Kubelet when scheduling a read only busybox container",
    "[sig-node] Downward API should provide pod name, namespace and IP address as env vars",
    "[sig-node] ConfigMap should be consumable via environment variable",
    "[sig-node] Secrets should be consumable from pods in env vars",
    "[sig-node] Security Context When creating a container with runAsUser should run the container with uid 65534",
    "[sig-node] Security Context When creating a pod with privileged should run the container as unprivileged when false",
    "[sig-node] Security Context when creating containers with AllowPrivilegeEscalation should not allow privilege escalation when false",
    "[sig-storage] EmptyDir volumes should support (root,0644,tmpfs)",
    "[sig-storage] EmptyDir volumes should support (non-root,0666,default)",
    "[sig-storage] EmptyDir volumes volume on default medium should have the correct mode",
    "[sig-storage] ConfigMap should be consumable from pods in volume [NodeConformance]",
    "[sig-storage] ConfigMap updates should be reflected in volume",
    "[sig-storage] Secrets should be consumable from pods in volume [NodeConformance]",
    "[sig-storage] Secrets should be consumable from pods in volume as non-root with defaultMode and fsGroup set",
    "[sig-storage] Projected combined should project all components",
    "[sig-storage] Downward API volume should provide podname only",
    "[sig-storage] Downward API volume should update labels on modification",
    "[sig-storage] HostPath should support r/w",
];

/// What one invocation does.
#[derive(Debug, Clone)]
struct Plan {
    kinds: Vec<Kind>,
    containerd: Version,
    selection: Selection,
    procs: u32,
    report_dir: PathBuf,
    /// Write `conformance/results/latest.*` (the default selection, both kubelets).
    publish: bool,
    command: String,
}

impl Plan {
    fn new(options: &Options, date: &str) -> Self {
        let (focus, skip) = match options.subset {
            Some(Subset::Ci) => (
                CI_SUBSET
                    .iter()
                    .map(|f| suite::regex_quote(f))
                    .collect::<Vec<_>>()
                    .join("|"),
                suite::DEFAULT_SKIP.to_string(),
            ),
            None => (
                options
                    .focus
                    .clone()
                    .unwrap_or_else(|| suite::DEFAULT_FOCUS.to_string()),
                options.skip.clone().unwrap_or_else(|| {
                    if options.all {
                        String::new()
                    } else {
                        suite::DEFAULT_SKIP.to_string()
                    }
                }),
            ),
        };
        let which = options.kubelet.unwrap_or(if options.subset.is_some() {
            Which::Evlet
        } else {
            Which::Both
        });
        let default_selection =
            options.focus.is_none() && options.skip.is_none() && options.subset.is_none();
        let args: Vec<String> = std::env::args().skip(1).collect();
        Plan {
            kinds: which.kinds(),
            containerd: options.containerd,
            selection: Selection {
                focus,
                skip,
                known_skips: known::skips(),
            },
            procs: options.procs.max(1),
            report_dir: options.report_dir.clone().unwrap_or_else(|| {
                paths::repo()
                    .join("target/conformance")
                    .join(report::compact(date))
            }),
            publish: default_selection && which == Which::Both,
            command: format!("cargo xtask {}", args.join(" ")),
        }
    }
}

/// Runs `cargo xtask conformance`.
///
/// # Errors
/// If a build, the cluster, the node or the report fails; failing specs
/// are results, not errors, except in the CI subset (see [`ci`]).
pub fn run(options: &Options) -> Result<()> {
    if options.subset == Some(Subset::Ci) {
        return ci_with(options);
    }
    let date = report::now_utc();
    let plan = Plan::new(options, &date);
    let report = execute(&plan, &date)?;
    println!("{}", report.headline());
    Ok(())
}

/// The CI subset against evlet on the containerd 1.7 node; fails if any of
/// its specs does not pass. This is what `cargo xtask test` calls.
///
/// # Errors
/// If the run cannot be made or a spec fails with evlet.
pub fn ci() -> Result<()> {
    ci_with(&Options {
        focus: None,
        skip: None,
        kubelet: Some(Which::Evlet),
        containerd: Version::V1_7,
        all: false,
        subset: Some(Subset::Ci),
        procs: 4,
        report_dir: None,
    })
}

/// The CI subset with `options` (its kubelet, containerd and processes).
fn ci_with(options: &Options) -> Result<()> {
    let date = report::now_utc();
    let plan = Plan::new(options, &date);
    let started = Instant::now();
    let report = execute(&plan, &date)?;
    let failed: Vec<&str> = report
        .rows
        .iter()
        .filter(|r| !matches!(r.evlet, Some(report::Outcome::Passed { .. })))
        .map(|r| r.spec.name.as_str())
        .collect();
    println!(
        "conformance (ci subset): {} in {}",
        report.headline(),
        suite::elapsed(started.elapsed())
    );
    if !failed.is_empty() {
        bail!(
            "{} specs of the conformance CI subset did not pass with evlet (report: {}):\n  {}",
            failed.len(),
            plan.report_dir.join("report.md").display(),
            failed.join("\n  ")
        );
    }
    Ok(())
}

/// The upstream programs and evlet.
struct Binaries {
    e2e: PathBuf,
    ginkgo: PathBuf,
    kubectl: PathBuf,
    agnhost: PathBuf,
    kubelet: PathBuf,
    evlet: PathBuf,
}

fn build(kinds: &[Kind]) -> Result<Binaries> {
    let mut with: Vec<String> = ["e2e.test", "ginkgo", "agnhost"].map(String::from).to_vec();
    if kinds.contains(&Kind::Upstream) {
        with.push("kubelet".into());
    }
    cluster::run(&cluster::Options {
        action: cluster::Action::Build { with },
        version: cluster::Version::V1_34,
    })?;
    let bin = paths::tools()
        .join("upstream")
        .join(cluster::Version::V1_34.release())
        .join("bin");
    let evlet = target_dir().join("debug/evlet");
    if kinds.contains(&Kind::Evlet) {
        sh::run(&mut sh::cargo(&[
            "build", "--locked", "-p", "evlet", "--bin", "evlet",
        ]))?;
    }
    Ok(Binaries {
        e2e: bin.join("e2e.test"),
        ginkgo: bin.join("ginkgo"),
        kubectl: bin.join("kubectl"),
        agnhost: bin.join("agnhost"),
        kubelet: bin.join("kubelet"),
        evlet,
    })
}

/// Cargo's target directory (`CARGO_TARGET_DIR`, else `target/`).
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                paths::repo().join(dir)
            }
        }
        None => paths::repo().join("target"),
    }
}

fn execute(plan: &Plan, date: &str) -> Result<Report> {
    sh::require_root("conformance")?;
    std::fs::create_dir_all(&plan.report_dir)?;
    let bins = build(&plan.kinds)?;
    let cluster = Cluster::new(cluster::Version::V1_34);
    cluster.up()?;
    let kubectl = kubectl::Kubectl {
        bin: bins.kubectl.clone(),
        kubeconfig: cluster.admin_kubeconfig(),
    };
    let lock = lock::acquire(plan.containerd)?;
    eprintln!("conformance: holding {}", lock.path.display());
    let node = Node::new(plan.containerd);
    let node_was_up = node.pid().is_some();
    node.up()?;
    let result = with_node(plan, date, &bins, &cluster, &kubectl, &node);
    if !node_was_up && let Err(e) = node.down() {
        eprintln!("conformance: node down failed: {e:#}");
    }
    drop(lock);
    result
}

fn with_node(
    plan: &Plan,
    date: &str,
    bins: &Binaries,
    cluster: &Cluster,
    kubectl: &kubectl::Kubectl,
    node: &Node,
) -> Result<Report> {
    let listed = images::listed(&bins.e2e)?;
    let images = images::prepare(
        &listed,
        &images::Inputs {
            agnhost: bins.agnhost.clone(),
            module: images::module(),
        },
        plan.containerd,
    )?;
    let specs = suite::enumerate(&bins.e2e, &plan.selection, &plan.report_dir)?;
    eprintln!(
        "conformance: {} specs selected; {} left out as known here (list: {})",
        specs.len(),
        specs
            .iter()
            .filter(|s| s.known_skip(&plan.selection).is_some())
            .count(),
        plan.report_dir.join("selected.txt").display()
    );
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("installing the Ctrl-C handler")?;
    }
    let ip = kubelet::node_ip()?;
    let mut runs = Vec::new();
    let mut results: Vec<(Kind, Vec<SpecResult>)> = Vec::new();
    for &kind in &plan.kinds {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let binary = match kind {
            Kind::Evlet => &bins.evlet,
            Kind::Upstream => &bins.kubelet,
        };
        let mut run = KubeletRun {
            version: version(kind, binary),
            ..KubeletRun::default()
        };
        let started = Instant::now();
        let outcome = one_kubelet(
            kind, binary, plan, bins, cluster, kubectl, node, ip, &specs, &stop, &mut run,
        );
        run.seconds = started.elapsed().as_secs_f64();
        match outcome {
            Ok(list) => results.push((kind, list)),
            Err(e) => {
                eprintln!("conformance: {kind}: {e:#}");
                run.notes.push(format!(
                    "the run failed: {}",
                    report::truncate(&format!("{e:#}"), 600)
                ));
                results.push((kind, Vec::new()));
            }
        }
        runs.push((kind, run));
    }
    let has = |name: &str| images.has(name);
    let rows = report::rows(&specs, &plan.selection, &results, &has);
    let report = Report {
        date: date.to_string(),
        command: plan.command.clone(),
        machine: machine(plan.containerd),
        focus: plan.selection.focus.clone(),
        skip: plan.selection.skip.clone(),
        known_skips: plan
            .selection
            .known_skips
            .iter()
            .map(|(f, w)| (f.to_string(), w.to_string()))
            .collect(),
        kubelets: runs,
        images_built: images
            .built
            .iter()
            .map(|(n, h)| (n.clone(), h.to_string()))
            .collect(),
        images_missing: images.missing.clone(),
        rows,
    };
    let results_dir = plan
        .publish
        .then(|| paths::repo().join("conformance/results"));
    report::write(&report, &plan.report_dir, results_dir.as_deref())?;
    eprintln!(
        "conformance: report {}{}",
        plan.report_dir.join("report.md").display(),
        results_dir
            .map(|d| format!(" and {}", d.join("latest.md").display()))
            .unwrap_or_default()
    );
    Ok(report)
}

#[expect(clippy::too_many_arguments, reason = "one call site; the run's parts")]
fn one_kubelet(
    kind: Kind,
    binary: &Path,
    plan: &Plan,
    bins: &Binaries,
    cluster: &Cluster,
    kubectl: &kubectl::Kubectl,
    node: &Node,
    ip: std::net::Ipv4Addr,
    specs: &[Spec],
    stop: &Arc<AtomicBool>,
    run: &mut KubeletRun,
) -> Result<Vec<SpecResult>> {
    let dir = plan.report_dir.join(kind.name());
    std::fs::create_dir_all(&dir)?;
    // A previous, aborted run's Node would be adopted with stale status.
    kubectl.delete_node(&kind.node_name())?;
    kubelet::ensure_cgroup_root(&node.cgroup_root())?;
    let setup = kubelet::prepare(kind, node, cluster, ip, dir.join("kubelet.log"))?;
    let mut running = kubelet::start(&setup, binary)?;
    let body = (|| -> Result<Vec<SpecResult>> {
        kubectl.wait_ready(&setup.node_name, Duration::from_secs(180), || {
            running.check_alive()
        })?;
        if kind == Kind::Evlet
            && let Some(health) = running.healthz()
        {
            let mode = health
                .split("(mode ")
                .nth(1)
                .and_then(|m| m.split(')').next())
                .unwrap_or("?");
            run.version = format!("{} (PLEG mode {mode})", run.version);
        }
        let target = suite::Target {
            ginkgo: &bins.ginkgo,
            e2e: &bins.e2e,
            kubeconfig: &cluster.admin_kubeconfig(),
            dir: dir.clone(),
            label: kind.name().to_string(),
        };
        // Another Ready node in the shared cluster can get the suite's pods:
        // look every 15 s while the suite runs, and say so in the report.
        let watching = Arc::new(AtomicBool::new(true));
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let watcher = {
            let (watching, seen, kubectl) = (watching.clone(), seen.clone(), kubectl.clone());
            let ours = setup.node_name.clone();
            std::thread::spawn(move || {
                while watching.load(Ordering::Relaxed) {
                    if let Ok(others) = kubectl.other_ready_nodes(&ours) {
                        let mut seen = lock_vec(&seen);
                        for other in others {
                            if !seen.contains(&other) {
                                eprintln!(
                                    "conformance: WARNING: node {other} is Ready too; the scheduler \
                                     may put the suite's pods there"
                                );
                                seen.push(other);
                            }
                        }
                    }
                    for _ in 0..15 {
                        if !watching.load(Ordering::Relaxed) {
                            return;
                        }
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            })
        };
        let mut all = Vec::new();
        for pass in suite::passes(specs, &plan.selection, plan.procs) {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            note_other_nodes(kubectl, &setup.node_name, run);
            running.check_alive()?;
            all.extend(suite::run_pass(&target, &plan.selection, &pass, stop)?);
            note_other_nodes(kubectl, &setup.node_name, run);
            if let Err(e) = running.check_alive() {
                run.notes
                    .push(format!("{kind} exited during the suite: {e:#}"));
            }
        }
        // Specs whose pods another engineer's node got are run again, once.
        let contaminated: Vec<String> = all
            .iter()
            .filter(|r| r.state != "passed" && r.state != "skipped")
            .filter(|r| report::other_node(&r.output).is_some())
            .map(|r| r.name.clone())
            .collect();
        if !contaminated.is_empty() && !stop.load(Ordering::Relaxed) {
            eprintln!(
                "conformance: [{kind}] {} specs had pods on another node; running them again",
                contaminated.len()
            );
            let again = Selection {
                focus: contaminated
                    .iter()
                    .map(|n| suite::regex_quote(n))
                    .collect::<Vec<_>>()
                    .join("|"),
                ..plan.selection.clone()
            };
            let pass = suite::Pass {
                name: "rerun",
                procs: plan.procs,
                label_filter: String::new(),
                expected: contaminated.len(),
            };
            running.check_alive()?;
            let rerun = suite::run_pass(&target, &again, &pass, stop)?;
            run.notes.push(format!(
                "{} specs had pods scheduled to another engineer's node and were run again",
                contaminated.len()
            ));
            for r in rerun.into_iter().filter(|r| contaminated.contains(&r.name)) {
                if let Some(slot) = all.iter_mut().find(|a| a.name == r.name) {
                    *slot = r;
                }
            }
        }
        watching.store(false, Ordering::Relaxed);
        let _ = watcher.join();
        for other in lock_vec(&seen).iter() {
            if !run.other_nodes.contains(other) {
                run.other_nodes.push(other.clone());
            }
        }
        Ok(all)
    })();
    // Whatever happened: no pod of ours left, the kubelet stopped by PID,
    // its Node deleted, its mounts and log links gone.
    if let Err(e) = kubectl.clean_up_after(&setup.node_name, Duration::from_secs(300)) {
        eprintln!("conformance: cleaning up after {kind}: {e:#}");
        run.notes.push(format!("clean-up: {e:#}"));
    }
    let stopped = running.stop();
    if let Err(e) = kubectl.delete_node(&setup.node_name) {
        eprintln!("conformance: cannot delete node {}: {e:#}", setup.node_name);
    }
    kubelet::unmount_under(&setup.state);
    kubelet::remove_log_links(&setup.pod_logs());
    stopped?;
    body
}

/// The list behind a poison-tolerant lock.
fn lock_vec(m: &std::sync::Mutex<Vec<String>>) -> std::sync::MutexGuard<'_, Vec<String>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn note_other_nodes(kubectl: &kubectl::Kubectl, ours: &str, run: &mut KubeletRun) {
    if let Ok(others) = kubectl.other_ready_nodes(ours) {
        for other in others {
            if !run.other_nodes.contains(&other) {
                eprintln!(
                    "conformance: WARNING: node {other} is Ready too; the scheduler may put the \
                     suite's pods there"
                );
                run.other_nodes.push(other);
            }
        }
    }
}

fn version(kind: Kind, binary: &Path) -> String {
    let out = sh::output(Command::new(binary).arg("--version")).unwrap_or_default();
    let line = out.lines().next().unwrap_or("").trim().to_string();
    match kind {
        Kind::Evlet => format!("{line} (debug build of this checkout)"),
        Kind::Upstream => format!("kubelet {line}"),
    }
}

fn machine(version: Version) -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = sh::output(Command::new("uname").arg("-r")).unwrap_or_default();
    let containerd = containerd::binaries(version)
        .ok()
        .and_then(|b| sh::output(Command::new(b.containerd).arg("--version")).ok())
        .and_then(|v| v.split_whitespace().nth(2).map(str::to_string))
        .unwrap_or_else(|| version.to_string());
    let cgroup = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "cgroup v2"
    } else {
        "cgroup v1 (hybrid)"
    };
    format!(
        "{cpus} CPUs, kernel {}, {cgroup}, containerd {containerd}, cluster {} on loopback",
        kernel.trim(),
        cluster::Version::V1_34.release()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            focus: None,
            skip: None,
            kubelet: None,
            containerd: Version::V1_7,
            all: false,
            subset: None,
            procs: 4,
            report_dir: Some(PathBuf::from("/r")),
        }
    }

    #[test]
    fn the_default_run_is_both_kubelets_and_publishes() {
        let plan = Plan::new(&options(), "2026-11-27T21:00:00Z");
        assert_eq!(plan.kinds, Kind::BOTH.to_vec());
        assert_eq!(plan.selection.focus, suite::DEFAULT_FOCUS);
        assert_eq!(plan.selection.skip, suite::DEFAULT_SKIP);
        assert!(plan.publish);
        let all = Plan::new(
            &Options {
                all: true,
                ..options()
            },
            "d",
        );
        assert_eq!(all.selection.skip, "");
        assert!(all.publish);
    }

    #[test]
    fn the_ci_subset_is_evlet_only_quoted_and_not_published() {
        let plan = Plan::new(
            &Options {
                subset: Some(Subset::Ci),
                ..options()
            },
            "d",
        );
        assert_eq!(plan.kinds, vec![Kind::Evlet]);
        assert!(!plan.publish);
        assert!(
            plan.selection
                .focus
                .starts_with(r"\[sig-node\] Pods should be submitted and removed|")
        );
        assert!(
            plan.selection
                .focus
                .contains(r#"exec "cat /tmp/health" liveness"#)
        );
        let focused = Plan::new(
            &Options {
                focus: Some("x".into()),
                ..options()
            },
            "d",
        );
        assert!(!focused.publish);
    }
}
