//! `cargo xtask fuzz`: the libFuzzer targets in `kubelet/fuzz` (cargo-fuzz).
//!
//! Each target runs for `--time` seconds from a working corpus under
//! `target/fuzz/corpus/<target>`, seeded from `kubelet/fuzz/seeds/<target>`
//! (and, for manifests, `deploy/examples`). It reports executions and the
//! crashes libFuzzer saved; a crash fails the task and its input stays in
//! `kubelet/fuzz/artifacts/<target>` for `cargo +nightly fuzz run <target> <file>`.
//!
//! The targets are built without a sanitizer (`-s none`): the code under test
//! is safe Rust, so panics (overflow, indexing, unwraps) are what there is to
//! find, and an uninstrumented build is several times faster.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{paths, setup, sh};

/// Every fuzz target, with what it takes.
pub const TARGETS: &[(&str, &str)] = &[
    (
        "manifest",
        "static pod manifests: parse, default, validate, then actions, status and CRI configs",
    ),
    (
        "kubelet_config",
        "the KubeletConfiguration file, Go durations and --register-with-taints",
    ),
    (
        "cri_log",
        "CRI log records and tails of log files (logs, termination messages)",
    ),
    (
        "api_query",
        "the kubelet API's query strings (container logs, exec, port-forward) and paths",
    ),
    (
        "http_request",
        "raw bytes on a kubelet API port: request line, headers and body under the connection limits",
    ),
];

/// The cargo-fuzz release installed into the tools dir.
const CARGO_FUZZ: &str = "0.13.1";

/// Options of `cargo xtask fuzz`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Seconds each target runs.
    #[arg(long, default_value_t = 60)]
    pub time: u64,
    /// Targets to run (default: all).
    #[arg(long, value_delimiter = ',')]
    pub target: Vec<String>,
}

/// What one target's run found.
#[derive(Debug)]
pub struct Outcome {
    /// The target.
    pub target: String,
    /// Inputs executed.
    pub executions: u64,
    /// Crash inputs libFuzzer saved.
    pub crashes: Vec<PathBuf>,
}

fn fuzz_dir() -> PathBuf {
    paths::repo().join("kubelet/fuzz")
}

/// Where cargo-fuzz is installed: the machine's cache, shared by checkouts.
fn cargo_fuzz_root() -> PathBuf {
    paths::cache().join(format!("cargo-fuzz-{CARGO_FUZZ}"))
}

/// Installs cargo-fuzz into the shared cache (idempotent).
fn cargo_fuzz() -> Result<()> {
    let root = cargo_fuzz_root();
    let stamp = root.join("cargo-fuzz.stamp");
    let want = format!("cargo-fuzz {CARGO_FUZZ}\n");
    if root.join("bin/cargo-fuzz").is_file()
        && fs::read_to_string(&stamp).ok().as_deref() == Some(&want)
    {
        return Ok(());
    }
    eprintln!("fuzz: installing cargo-fuzz {CARGO_FUZZ}");
    sh::run(
        Command::new("cargo")
            .args([
                "install",
                "--locked",
                "cargo-fuzz",
                "--version",
                CARGO_FUZZ,
                "--root",
            ])
            .arg(&root),
    )
    .context("cannot install cargo-fuzz (needs crates.io)")?;
    fs::write(stamp, want)?;
    Ok(())
}

/// Copies the seeds of `target` into its working corpus.
fn seed(target: &str, corpus: &Path) -> Result<()> {
    fs::create_dir_all(corpus)?;
    let mut dirs = vec![fuzz_dir().join("seeds").join(target)];
    if target == "manifest" {
        dirs.push(paths::repo().join("deploy/examples"));
    }
    for dir in dirs {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if let Some(name) = path.file_name().filter(|_| path.is_file()) {
                fs::copy(&path, corpus.join(name))?;
            }
        }
    }
    Ok(())
}

fn artifacts(target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join("artifacts").join(target);
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("crash-"))
        })
        .collect();
    found.sort();
    found
}

/// libFuzzer's `stat::number_of_executed_units` (printed with `-print_final_stats=1`).
fn executions(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .filter_map(|v| v.trim().parse().ok())
        .next_back()
        .unwrap_or(0)
}

/// Runs one target for `seconds`.
fn run_one(target: &str, seconds: u64) -> Result<Outcome> {
    let corpus = paths::repo().join("target/fuzz/corpus").join(target);
    seed(target, &corpus)?;
    let before = artifacts(target).len();
    // cargo-fuzz builds release code with one codegen unit per crate by
    // default; 16 build the targets in 7 minutes instead of 9 on two cores,
    // and run them at 83–100 % of the speed (measured on `manifest` and
    // `cri_log`, 10 s each on the same corpus).
    let mut cmd = sh::cargo(&[
        "+nightly",
        "fuzz",
        "run",
        "-s",
        "none",
        "--codegen-units",
        "16",
        target,
    ]);
    // The build lives in the machine's cache: a fresh checkout rebuilds
    // only evlet itself, not every dependency (7 minutes on two cores).
    let path = std::env::join_paths(
        std::iter::once(cargo_fuzz_root().join("bin"))
            .chain(std::env::split_paths(&paths::path_with_tools())),
    )?;
    cmd.current_dir(paths::repo().join("kubelet"))
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", paths::cache().join("fuzz-build"))
        .arg(&corpus)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .args([
            "-print_final_stats=1",
            "-rss_limit_mb=4096",
            "-max_len=65536",
        ]);
    let line = sh::display(&cmd);
    eprintln!("$ {line}");
    let out = cmd
        .output()
        .with_context(|| format!("cannot start `{line}`"))?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    let log_path = paths::repo()
        .join("target/fuzz")
        .join(format!("{target}.log"));
    fs::write(&log_path, &log)?;
    let crashes: Vec<PathBuf> = artifacts(target).into_iter().skip(before).collect();
    if !out.status.success() && crashes.is_empty() {
        bail!(
            "`{line}` failed ({}) without saving a crash; its log is {}",
            out.status,
            log_path.display()
        );
    }
    Ok(Outcome {
        target: target.to_owned(),
        executions: executions(&log),
        crashes,
    })
}

/// Runs the chosen targets; fails if any crashed.
pub fn fuzz(options: &Options) -> Result<Vec<Outcome>> {
    setup::setup()?;
    cargo_fuzz()?;
    let chosen: Vec<&str> = if options.target.is_empty() {
        TARGETS.iter().map(|(name, _)| *name).collect()
    } else {
        for t in &options.target {
            if !TARGETS.iter().any(|(name, _)| name == t) {
                bail!(
                    "no fuzz target {t:?}; the targets are {}",
                    TARGETS
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        options.target.iter().map(String::as_str).collect()
    };
    let mut outcomes = Vec::new();
    for target in chosen {
        let outcome = run_one(target, options.time)?;
        eprintln!(
            "fuzz: {target}: {} executions in {} s, {} crash(es)",
            outcome.executions,
            options.time,
            outcome.crashes.len()
        );
        outcomes.push(outcome);
    }
    let crashed: Vec<String> = outcomes
        .iter()
        .flat_map(|o| {
            o.crashes
                .iter()
                .map(|c| format!("{}: {}", o.target, c.display()))
        })
        .collect();
    if !crashed.is_empty() {
        bail!(
            "fuzzing found crashes (reproduce with `cargo +nightly fuzz run <target> <file>` in kubelet/):\n{}",
            crashed.join("\n")
        );
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_stats_give_the_executions() {
        let log = "#1024\tpulse  cov: 10\nDone 52 runs in 2 second(s)\n\
                   stat::number_of_executed_units: 5210\nstat::average_exec_per_sec:     2605\n";
        assert_eq!(executions(log), 5210);
        assert_eq!(executions("no stats"), 0);
    }

    #[test]
    fn every_target_has_a_source_and_seeds() {
        for (name, _) in TARGETS {
            assert!(
                fuzz_dir()
                    .join("fuzz_targets")
                    .join(format!("{name}.rs"))
                    .is_file(),
                "{name}.rs"
            );
            assert!(fuzz_dir().join("seeds").join(name).is_dir(), "seeds/{name}");
        }
    }
}
