//! `promtool` (installed by `cargo xtask setup` under `.tools/bin`, or named
//! by `EVLET_PROMTOOL`): outside CI a missing one skips, in CI it fails.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Counters upstream kubelet names without `_total` (and evlet with it):
/// the only lint findings `promtool check metrics` may report.
pub const UPSTREAM_UNSUFFIXED: &[&str] = &["kubelet_pleg_discard_events", "kubelet_evictions"];

/// Runs `promtool args…` with `stdin`; `None` if there is no promtool outside CI.
pub fn run(args: &[&str], stdin: &str) -> Option<Output> {
    let promtool =
        std::env::var_os("EVLET_PROMTOOL").map_or_else(|| PathBuf::from("promtool"), PathBuf::from);
    let child = Command::new(&promtool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPED: no promtool ({e}); `cargo xtask setup` installs one");
            return None;
        }
        Err(e) => panic!("promtool is required in CI (`cargo xtask setup`): {e}"),
    };
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).expect("promtool stdin");
    }
    Some(child.wait_with_output().expect("promtool"))
}

/// `promtool check metrics` on `text`: panics on a parse error or on any lint
/// finding but upstream's own unsuffixed counters.
pub fn check_metrics(text: &str) {
    let Some(out) = run(&["check", "metrics"], text) else {
        return;
    };
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // Exit 0: clean; 3: lint findings only; anything else: the text did not parse.
    match out.status.code() {
        Some(0) => {}
        Some(3) => {
            let unexpected: Vec<&str> = report
                .lines()
                .filter(|l| !l.trim().is_empty())
                .filter(|l| {
                    !UPSTREAM_UNSUFFIXED
                        .iter()
                        .any(|m| *l == format!("{m} counter metrics should have \"_total\" suffix"))
                })
                .collect();
            assert!(
                unexpected.is_empty(),
                "promtool check metrics: {unexpected:#?}"
            );
        }
        code => panic!("promtool check metrics failed ({code:?}): {report}"),
    }
}
