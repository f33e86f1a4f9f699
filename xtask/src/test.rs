//! `cargo xtask test`: every check and test, in the order CI runs them.
//!
//! Test targets are classified by name: `node_*` need a private containerd
//! (run once per containerd line with the node's environment), `kernel_*` need
//! root and the host kernel's eBPF; all others are plain tests. The agent's
//! end-to-end suite (`node_agent`) runs once per PLEG mode the line supports.
//! `cargo xtask bench --quick` then proves the benchmark harness works. A privileged
//! test that cannot run fails under `CI=true` (see `evlet-testkit`).

use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use crate::containerd::Version;
use crate::node::Node;
use crate::sh::cargo;
use crate::{setup, sh};

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

/// The PLEG modes beyond `generic` a containerd line supports.
fn pleg_modes(version: Version) -> &'static [&'static str] {
    match version {
        Version::V1_6 => &["ebpf"],
        Version::V1_7 | Version::V2_1 => &["ebpf", "cri-events"],
    }
}

fn with_tests<'a>(mut args: Vec<&'a str>, tests: &'a [String]) -> Vec<&'a str> {
    for t in tests {
        args.extend(["--test", t.as_str()]);
    }
    args
}

/// Runs the whole suite; the first failing stage ends it with an error.
pub fn test(options: &Options) -> Result<()> {
    let started = Instant::now();
    setup::setup()?;
    if !options.no_lint {
        sh::run(&mut cargo(&["fmt", "--all", "--", "--check"]))
            .context("formatting differs: run `cargo fmt --all`")?;
        sh::run(&mut cargo(&[
            "clippy",
            "--locked",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
    }
    let targets = test_targets()?;
    sh::run(&mut cargo(&with_tests(
        vec!["test", "--locked", "--lib", "--bins"],
        &targets.plain,
    )))?;
    sh::run(&mut cargo(&["test", "--locked", "--doc"]))?;
    if !targets.kernel.is_empty() {
        sh::run(&mut cargo(&with_tests(
            vec!["test", "--locked"],
            &targets.kernel,
        )))?;
    }
    let mut failures = Vec::new();
    for version in &options.containerd {
        if targets.node.is_empty() {
            break;
        }
        let node = Node::new(*version);
        let result = node.up().and_then(|()| {
            let mut cmd = cargo(&with_tests(vec!["test", "--locked"], &targets.node));
            cmd.envs(node.env()).env("EVLET_E2E_PLEG", "generic");
            sh::run(&mut cmd)?;
            if !targets.node.iter().any(|t| t == E2E_SUITE) {
                return Ok(());
            }
            for mode in pleg_modes(*version) {
                eprintln!("test: {E2E_SUITE} in PLEG mode {mode} on containerd {version:?}");
                let mut cmd = cargo(&["test", "--locked", "--test", E2E_SUITE]);
                cmd.envs(node.env()).env("EVLET_E2E_PLEG", mode);
                sh::run(&mut cmd).with_context(|| format!("{E2E_SUITE} in PLEG mode {mode}"))?;
            }
            Ok(())
        });
        let down = node.down();
        if let Err(err) = result {
            failures.push(format!("containerd {version}: {err:#}"));
        }
        if let Err(err) = down {
            failures.push(format!("containerd {version} teardown: {err:#}"));
        }
    }
    if !failures.is_empty() {
        bail!("node tests failed:\n{}", failures.join("\n"));
    }
    if !options.no_bench {
        crate::bench::bench(&crate::bench::Options::quick())
            .context("the benchmark harness (cargo xtask bench --quick)")?;
    }
    if !options.no_vm && !targets.kernel.is_empty() {
        crate::vm::vm_test(&options.vm, &targets.kernel)?;
    }
    eprintln!("test: all passed in {:.0?}", started.elapsed());
    Ok(())
}
