//! Which specs run, and running them: `e2e.test` to enumerate, `ginkgo` to run.
//!
//! The selection is a ginkgo focus and skip over each spec's full text
//! (container texts and the `It` text joined by spaces, where the e2e
//! framework writes its tags: `[NodeConformance]`, `[Conformance]`,
//! `[Serial]`). `e2e.test --ginkgo.dry-run` lists the selected specs with
//! their labels without touching the cluster; those are the report's rows.
//! Specs that need what cannot exist here ([`super::known`]'s skips) are
//! added to the skip of the real run and reported with the reason.
//!
//! The run is `ginkgo --procs=N` over the prebuilt `e2e.test`. Specs labelled
//! `Serial`, `Disruptive` or `Flaky` (only with `--all`) run afterwards in a
//! second pass with one process, one at a time. Ginkgo's output goes to
//! `ginkgo.log`; the terminal gets a line per failure and a progress line.

use std::fs;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::report::{self, SpecResult};

/// The default focus: node conformance and sig-node's conformance specs.
pub const DEFAULT_FOCUS: &str = r"\[NodeConformance\]|\[sig-node\].*\[Conformance\]";
/// The default skip.
pub const DEFAULT_SKIP: &str = r"\[Serial\]|\[Disruptive\]|\[Flaky\]";
/// Labels of the specs that run one at a time (second pass).
const SERIAL_LABELS: &[&str] = &["Serial", "Disruptive", "Flaky"];

/// A selection of specs.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Ginkgo focus (a spec runs if its text matches).
    pub focus: String,
    /// Ginkgo skip (empty: none).
    pub skip: String,
    /// Known skips: text fragments of specs that cannot pass here, with why.
    pub known_skips: Vec<(&'static str, &'static str)>,
}

/// One spec of the selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Full text.
    pub name: String,
    /// `file:line`.
    pub location: String,
    /// Ginkgo labels (`NodeConformance`, `Serial`, ...).
    pub labels: Vec<String>,
}

impl Spec {
    /// Whether the spec runs in the one-at-a-time pass.
    pub fn serial(&self) -> bool {
        self.labels
            .iter()
            .any(|l| SERIAL_LABELS.contains(&l.as_str()))
    }

    /// The known skip reason of this spec, if any.
    pub fn known_skip<'a>(&self, selection: &'a Selection) -> Option<&'a str> {
        selection
            .known_skips
            .iter()
            .find(|(fragment, _)| self.name.contains(fragment))
            .map(|(_, why)| *why)
    }
}

/// Escapes `s` for a Go (RE2) regular expression.
pub fn regex_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Selection {
    /// The skip of the real run: the selection's and the known skips'.
    pub fn run_skip(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if !self.skip.is_empty() {
            parts.push(self.skip.clone());
        }
        parts.extend(self.known_skips.iter().map(|(f, _)| regex_quote(f)));
        parts.join("|")
    }
}

/// Lists the selected specs with `e2e.test --ginkgo.dry-run` (no cluster
/// is touched); `dir` keeps its report and output.
pub fn enumerate(e2e: &Path, selection: &Selection, dir: &Path) -> Result<Vec<Spec>> {
    fs::create_dir_all(dir)?;
    let json = dir.join("dry-run.json");
    let log = fs::File::create(dir.join("dry-run.log"))?;
    let mut cmd = Command::new(e2e);
    cmd.arg("--ginkgo.dry-run")
        .arg(format!("--ginkgo.focus={}", selection.focus))
        .arg("--ginkgo.no-color")
        .arg("--ginkgo.silence-skips")
        .arg(format!("--ginkgo.json-report={}", json.display()))
        .arg("--provider=skeleton")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if !selection.skip.is_empty() {
        cmd.arg(format!("--ginkgo.skip={}", selection.skip));
    }
    let status = cmd
        .status()
        .context("cannot run e2e.test --ginkgo.dry-run")?;
    if !status.success() {
        bail!(
            "e2e.test --ginkgo.dry-run failed ({status}); see {}",
            dir.join("dry-run.log").display()
        );
    }
    let results = report::read_ginkgo_json(&json)?;
    let specs: Vec<Spec> = results
        .into_iter()
        .filter(|r| r.state == "passed")
        .map(|r| Spec {
            name: r.name,
            location: r.location,
            labels: r.labels,
        })
        .collect();
    let _ = fs::remove_file(&json);
    let list: String = specs
        .iter()
        .map(|s| format!("{}\t{}\n", s.location, s.name))
        .collect();
    fs::write(dir.join("selected.txt"), list)?;
    Ok(specs)
}

/// One ginkgo pass.
#[derive(Debug, Clone)]
pub struct Pass {
    /// Short name (`parallel`, `serial`): the report's subdirectory.
    pub name: &'static str,
    /// Parallel processes.
    pub procs: u32,
    /// Ginkgo label filter.
    pub label_filter: String,
    /// Specs expected to run (for progress).
    pub expected: usize,
}

/// The passes for `specs`: the parallel one, and the one-at-a-time one when
/// any selected spec is `Serial`, `Disruptive` or `Flaky`.
pub fn passes(specs: &[Spec], selection: &Selection, procs: u32) -> Vec<Pass> {
    let runnable = |s: &&Spec| s.known_skip(selection).is_none();
    let parallel = specs
        .iter()
        .filter(runnable)
        .filter(|s| !s.serial())
        .count();
    let serial = specs.iter().filter(runnable).filter(|s| s.serial()).count();
    let not_serial = SERIAL_LABELS
        .iter()
        .map(|l| format!("!{l}"))
        .collect::<Vec<_>>()
        .join(" && ");
    let mut out = vec![Pass {
        name: "parallel",
        procs,
        label_filter: not_serial,
        expected: parallel,
    }];
    if serial > 0 {
        out.push(Pass {
            name: "serial",
            procs: 1,
            label_filter: SERIAL_LABELS.join(" || "),
            expected: serial,
        });
    }
    out
}

/// Where a kubelet's suite runs and what it runs against.
#[derive(Debug)]
pub struct Target<'a> {
    /// `ginkgo`.
    pub ginkgo: &'a Path,
    /// `e2e.test`.
    pub e2e: &'a Path,
    /// The admin kubeconfig.
    pub kubeconfig: &'a Path,
    /// The report directory of this kubelet.
    pub dir: PathBuf,
    /// A label for progress lines (`evlet`).
    pub label: String,
}

/// Runs one pass; returns its spec results (read from ginkgo's JSON report).
/// A failing suite is not an error; a ginkgo that produced no report is.
/// `stop` interrupts the run (SIGINT to ginkgo, which cleans up).
pub fn run_pass(
    target: &Target<'_>,
    selection: &Selection,
    pass: &Pass,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<SpecResult>> {
    let dir = target.dir.join(pass.name);
    fs::create_dir_all(&dir)?;
    let log_path = dir.join("ginkgo.log");
    let mut log = fs::File::create(&log_path)?;
    let mut cmd = Command::new(target.ginkgo);
    cmd.arg("run")
        .arg(format!("--procs={}", pass.procs))
        .args(["--no-color", "--silence-skips", "--timeout=24h"])
        .arg(format!("--output-dir={}", dir.display()))
        .args(["--json-report=report.json", "--junit-report=junit.xml"])
        .arg(format!("--focus={}", selection.focus));
    if !pass.label_filter.is_empty() {
        cmd.arg(format!("--label-filter={}", pass.label_filter));
    }
    let skip = selection.run_skip();
    if !skip.is_empty() {
        cmd.arg(format!("--skip={skip}"));
    }
    cmd.arg(target.e2e)
        .arg("--")
        .arg(format!("--kubeconfig={}", target.kubeconfig.display()))
        .arg("--provider=skeleton")
        // Another engineer's stale node must not hold the suite up.
        .arg("--allowed-not-ready-nodes=-1")
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    writeln!(log, "$ {}", crate::sh::display(&cmd))?;
    eprintln!(
        "conformance: [{}] {} pass: {} specs, {} at once (log {})",
        target.label,
        pass.name,
        pass.expected,
        pass.procs,
        log_path.display()
    );
    let mut child = cmd.spawn().context("cannot start ginkgo")?;
    let stdout = child.stdout.take().context("ginkgo stdout")?;
    let stderr = child.stderr.take().context("ginkgo stderr")?;
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    for mut stream in [
        Box::new(stdout) as Box<dyn std::io::Read + Send>,
        Box::new(stderr),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let started = Instant::now();
    let mut progress = Progress::default();
    let mut last_line = Instant::now();
    let mut interrupted = false;
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(chunk) => {
                log.write_all(&chunk)?;
                for event in progress.feed(&chunk) {
                    if let Event::Failed(state, name) = event {
                        eprintln!("conformance: [{}] {state}: {name}", target.label);
                    }
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if stop.load(Ordering::Relaxed) && !interrupted {
            interrupted = true;
            eprintln!("conformance: interrupting ginkgo (it deletes its namespaces)");
            // SAFETY: kill(2) of our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        }
        if last_line.elapsed() > Duration::from_secs(60) || progress.take_changed(10) {
            eprintln!(
                "conformance: [{}] {} pass: {}/{} specs done, {} failed, {}",
                target.label,
                pass.name,
                progress.done,
                pass.expected,
                progress.failed,
                elapsed(started.elapsed())
            );
            last_line = Instant::now();
        }
    }
    let status = child.wait()?;
    eprintln!(
        "conformance: [{}] {} pass ended ({status}) after {}: {} done, {} failed",
        target.label,
        pass.name,
        elapsed(started.elapsed()),
        progress.done,
        progress.failed
    );
    let report = dir.join("report.json");
    if !report.exists() {
        bail!(
            "ginkgo wrote no report ({status}); last lines of {}:\n{}",
            log_path.display(),
            super::kubelet::tail(&log_path, 30)
        );
    }
    report::read_ginkgo_json(&report)
}

/// `1h02m03s`.
pub fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// What the progress reader saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// A spec finished well.
    Passed,
    /// A spec failed: ginkgo's state word and the spec's text.
    Failed(String, String),
}

/// Reads ginkgo's default (succinct) output as it comes: a `•` per finished
/// spec, `• [FAILED] [12.3 seconds]` and the spec's text on the next line
/// for a failure (also `PANICKED`, `TIMEDOUT`, `INTERRUPTED`).
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes of a character the last chunk cut.
    tail: Vec<u8>,
    /// Text not yet understood.
    pending: String,
    /// A failure whose text line has not come yet.
    awaiting: Option<String>,
    /// Specs finished.
    pub done: usize,
    /// Specs failed.
    pub failed: usize,
    reported: usize,
}

const BULLET: &str = "•";
/// The state words ginkgo prints after the bullet of a spec that did not pass.
const FAILURES: &[&str] = &["FAILED", "PANICKED", "TIMEDOUT", "INTERRUPTED", "ABORTED"];

impl Progress {
    /// Takes more output; returns the events it completes.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Event> {
        let mut bytes = std::mem::take(&mut self.tail);
        bytes.extend_from_slice(chunk);
        // A character cut by the chunk's end waits for the next chunk.
        let cut = match std::str::from_utf8(&bytes) {
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            _ => bytes.len(),
        };
        self.tail = bytes.split_off(cut);
        self.pending.push_str(&String::from_utf8_lossy(&bytes));
        let text = std::mem::take(&mut self.pending);
        let mut events = Vec::new();
        let mut consumed = 0;
        let mut rest = text.as_str();
        loop {
            if let Some(state) = self.awaiting.clone() {
                // The failure's spec text is the next non-empty line.
                let Some(nl) = rest.find('\n') else { break };
                let line = rest[..nl].trim();
                consumed += nl + 1;
                rest = &rest[nl + 1..];
                if line.is_empty() {
                    continue;
                }
                self.awaiting = None;
                events.push(Event::Failed(state, line.to_string()));
                continue;
            }
            let Some(at) = rest.find(BULLET) else {
                consumed += rest.len();
                break;
            };
            let after = &rest[at + BULLET.len()..];
            let failure = FAILURES
                .iter()
                .find(|w| after.starts_with(&format!(" [{w}]")));
            let undecided = failure.is_none()
                && FAILURES
                    .iter()
                    .any(|w| format!(" [{w}]").starts_with(after));
            if undecided {
                // Wait for the rest: " [FAILED]" may be on its way.
                consumed += at;
                break;
            }
            self.done += 1;
            match failure {
                Some(word) => {
                    self.failed += 1;
                    self.awaiting = Some((*word).to_string());
                    let nl = after.find('\n').map_or(after.len(), |n| n + 1);
                    consumed += at + BULLET.len() + nl;
                    rest = &after[nl..];
                }
                None => {
                    events.push(Event::Passed);
                    consumed += at + BULLET.len();
                    rest = after;
                }
            }
        }
        self.pending = text[consumed..].to_string();
        events
    }

    /// True once `every` more specs finished since the last true.
    pub fn take_changed(&mut self, every: usize) -> bool {
        if self.done >= self.reported + every {
            self.reported = self.done;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, labels: &[&str]) -> Spec {
        Spec {
            name: name.into(),
            location: "x.go:1".into(),
            labels: labels.iter().map(|l| l.to_string()).collect(),
        }
    }

    #[test]
    fn known_skips_join_the_skip_quoted() {
        let sel = Selection {
            focus: DEFAULT_FOCUS.into(),
            skip: DEFAULT_SKIP.into(),
            known_skips: vec![
                ("should be able to pull image", "registry"),
                ("a (b) [c]", "x"),
            ],
        };
        assert_eq!(
            sel.run_skip(),
            r"\[Serial\]|\[Disruptive\]|\[Flaky\]|should be able to pull image|a \(b\) \[c\]"
        );
        let none = Selection {
            skip: String::new(),
            known_skips: vec![],
            ..sel
        };
        assert_eq!(none.run_skip(), "");
    }

    #[test]
    fn serial_specs_get_a_one_at_a_time_pass_and_known_skips_are_not_expected() {
        let sel = Selection {
            focus: String::new(),
            skip: String::new(),
            known_skips: vec![("pull", "registry")],
        };
        let specs = vec![
            spec("a", &["NodeConformance"]),
            spec("b pull", &[]),
            spec("c", &["Serial", "Disruptive"]),
        ];
        let p = passes(&specs, &sel, 4);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].procs, p[0].expected), (4, 1));
        assert_eq!(p[0].label_filter, "!Serial && !Disruptive && !Flaky");
        assert_eq!((p[1].procs, p[1].expected), (1, 1));
        assert_eq!(passes(&specs[..2], &sel, 4).len(), 1);
    }

    #[test]
    fn progress_counts_bullets_and_names_failures_across_chunks() {
        let mut p = Progress::default();
        let mut events = p.feed("Running Suite\n••".as_bytes());
        events.extend(p.feed("•".as_bytes()));
        events.extend(p.feed("\n------------------------------\n• [FAIL".as_bytes()));
        events.extend(p.feed(
            "ED] [61.2 seconds]\n[sig-node] Pods should x [NodeConformance]\n/x.go:3\n•".as_bytes(),
        ));
        events.extend(p.feed(" [TIMEDOUT] [600 seconds]\n\n[sig-node] slow one\n".as_bytes()));
        assert_eq!(p.done, 5);
        assert_eq!(p.failed, 2);
        assert_eq!(
            events,
            vec![
                Event::Passed,
                Event::Passed,
                Event::Passed,
                Event::Failed(
                    "FAILED".into(),
                    "[sig-node] Pods should x [NodeConformance]".into()
                ),
                Event::Failed("TIMEDOUT".into(), "[sig-node] slow one".into()),
            ]
        );
    }

    #[test]
    fn elapsed_reads_as_minutes_or_hours() {
        assert_eq!(elapsed(Duration::from_secs(75)), "1m15s");
        assert_eq!(elapsed(Duration::from_secs(3723)), "1h02m03s");
    }
}
