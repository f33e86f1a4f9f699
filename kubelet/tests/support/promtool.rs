//! `promtool` (installed by `cargo xtask setup` under `.tools/bin`, or named
//! by `EVLET_PROMTOOL`): outside CI a missing one skips loudly (past the test
//! harness's capture), under `CI=true` it fails, as every skip does
//! (`evlet_testkit::require`).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Counters upstream kubelet names without `_total` (and evlet with it):
/// the only lint findings `promtool check metrics` may report.
pub const UPSTREAM_UNSUFFIXED: &[&str] = &[
    "kubelet_pleg_discard_events",
    "kubelet_evictions",
    "kubelet_certificate_manager_client_expiration_renew_errors",
    "kubelet_server_expiration_renew_errors",
];

/// Runs `promtool args…` with `stdin` for test `test`; `None` if there is no
/// promtool outside CI.
pub fn run(test: &str, args: &[&str], stdin: &str) -> Option<Output> {
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
        Err(e) => {
            evlet_testkit::require(
                test,
                false,
                &format!(
                    "no promtool at {} ({e}); `cargo xtask setup` installs one",
                    promtool.display()
                ),
            );
            return None;
        }
    };
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).expect("promtool stdin");
    }
    Some(child.wait_with_output().expect("promtool"))
}

/// `promtool check metrics` on `text` for test `test`: panics on a parse
/// error or on any lint finding but upstream's own unsuffixed counters.
pub fn check_metrics(test: &str, text: &str) {
    let Some(out) = run(test, &["check", "metrics"], text) else {
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

#[test]
fn a_missing_promtool_skips_loudly_outside_ci_and_fails_under_ci() {
    let missing = "/nonexistent/promtool";
    let probe = |ci: Option<&str>| {
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
        cmd.args([
            "--exact",
            "promtool::a_missing_promtool_probe",
            "--nocapture",
        ])
        .env("EVLET_PROMTOOL", missing)
        .env("EVLET_PROMTOOL_PROBE", "1");
        match ci {
            Some(v) => cmd.env("CI", v),
            None => cmd.env_remove("CI"),
        };
        cmd.output().expect("run the probe")
    };
    let outside = probe(None);
    let text = String::from_utf8_lossy(&outside.stderr);
    assert!(outside.status.success(), "outside CI a skip passes: {text}");
    assert!(text.contains("SKIPPED"), "and says so: {text}");
    let inside = probe(Some("true"));
    assert!(
        !inside.status.success(),
        "under CI=true a missing promtool fails: {}",
        String::from_utf8_lossy(&inside.stdout)
    );
}

/// Run only by `a_missing_promtool_skips_loudly_outside_ci_and_fails_under_ci`.
#[test]
fn a_missing_promtool_probe() {
    if std::env::var_os("EVLET_PROMTOOL_PROBE").is_none() {
        return;
    }
    check_metrics("a_missing_promtool_probe", "# nothing\n");
}
