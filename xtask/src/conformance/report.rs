//! The report: ginkgo's JSON reports read into one row per selected spec,
//! evlet's result next to upstream kubelet's, and the reason for every
//! difference and every skip; written as Markdown and JSON.
//!
//! Reading and rendering are pure (tested below); [`write`] only puts the
//! text where it belongs.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use super::known;
use super::kubelet::Kind;
use super::suite::{Selection, Spec};

/// One spec as ginkgo reported it.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecResult {
    /// Full text (container texts and the `It` text, space-joined).
    pub name: String,
    /// `file:line`.
    pub location: String,
    /// Ginkgo labels.
    pub labels: Vec<String>,
    /// Ginkgo's state: `passed`, `failed`, `skipped`, `timedout`, ...
    pub state: String,
    /// Seconds it took.
    pub seconds: f64,
    /// The failure (or runtime skip) message.
    pub message: String,
    /// What the spec wrote (`GinkgoWriter`: steps, events dumped on failure).
    pub output: String,
}

/// Reads a ginkgo JSON report (`--json-report`): every `It`.
///
/// # Errors
/// If the file is not a ginkgo report.
pub fn read_ginkgo_json(path: &Path) -> Result<Vec<SpecResult>> {
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_ginkgo_json(&text)
        .with_context(|| format!("{} is not a ginkgo JSON report", path.display()))
}

/// Parses a ginkgo JSON report's text.
pub fn parse_ginkgo_json(text: &str) -> Result<Vec<SpecResult>> {
    let reports: Value = serde_json::from_str(text)?;
    let mut out = Vec::new();
    for report in reports.as_array().context("not an array of reports")? {
        for spec in report["SpecReports"].as_array().into_iter().flatten() {
            if spec["LeafNodeType"] != "It" {
                continue;
            }
            let texts = spec["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .chain(spec["LeafNodeText"].as_str())
                .collect::<Vec<_>>()
                .join(" ");
            let mut labels: Vec<String> = spec["ContainerHierarchyLabels"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|l| l.as_array().into_iter().flatten())
                .chain(spec["LeafNodeLabels"].as_array().into_iter().flatten())
                .filter_map(|l| l.as_str().map(str::to_string))
                .collect();
            labels.sort();
            labels.dedup();
            let loc = &spec["LeafNodeLocation"];
            out.push(SpecResult {
                name: texts,
                location: format!(
                    "{}:{}",
                    loc["FileName"]
                        .as_str()
                        .unwrap_or("?")
                        .split_once("/test/")
                        .map_or_else(
                            || loc["FileName"].as_str().unwrap_or("?").to_string(),
                            |(_, p)| format!("test/{p}")
                        ),
                    loc["LineNumber"]
                ),
                labels,
                state: spec["State"].as_str().unwrap_or("?").to_string(),
                seconds: spec["RunTime"].as_f64().unwrap_or(0.0) / 1e9,
                message: spec["Failure"]["Message"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                output: spec["CapturedGinkgoWriterOutput"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            });
        }
    }
    Ok(out)
}

/// A spec's result under one kubelet.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It passed.
    Passed {
        /// Seconds.
        seconds: f64,
    },
    /// It failed (or panicked, timed out, was interrupted).
    Failed {
        /// Ginkgo's state word.
        state: String,
        /// Seconds.
        seconds: f64,
        /// The failure message.
        message: String,
        /// An image the spec needed that is not on the node, if its output says so.
        missing_image: Option<String>,
        /// A node other than the kubelet's own (`conf-*`) that a pod of the
        /// spec was scheduled to: the shared cluster had another Ready node.
        other_node: Option<String>,
    },
    /// Skipped, with the reason (the spec's own, or a known one).
    Skipped {
        /// Why.
        reason: String,
    },
    /// Selected but not run (an interrupted run).
    NotRun,
}

impl Outcome {
    /// From ginkgo's result for a spec (`None`: not in the report), given
    /// the known skip reason and whether the image `name` is on the node.
    pub fn of(
        result: Option<&SpecResult>,
        known_skip: Option<&str>,
        has_image: &dyn Fn(&str) -> bool,
    ) -> Self {
        if let Some(reason) = known_skip {
            return Outcome::Skipped {
                reason: reason.to_string(),
            };
        }
        let Some(r) = result else {
            return Outcome::NotRun;
        };
        match r.state.as_str() {
            "passed" => Outcome::Passed { seconds: r.seconds },
            "skipped" | "pending" if r.message.is_empty() => Outcome::NotRun,
            "skipped" | "pending" => Outcome::Skipped {
                reason: first_line(&r.message),
            },
            state => Outcome::Failed {
                state: state.to_string(),
                seconds: r.seconds,
                message: r.message.clone(),
                missing_image: missing_image(&format!("{}\n{}", r.message, r.output), has_image),
                other_node: other_node(&r.output),
            },
        }
    }

    /// A short cell for the table.
    pub fn cell(&self) -> String {
        match self {
            Outcome::Passed { seconds } => format!("pass ({seconds:.0}s)"),
            Outcome::Failed { state, seconds, .. } => {
                format!("**{}** ({seconds:.0}s)", fail_word(state))
            }
            Outcome::Skipped { .. } => "skipped".into(),
            Outcome::NotRun => "not run".into(),
        }
    }

    /// `passed`, `failed`, `skipped`, `not-run`.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Passed { .. } => "passed",
            Outcome::Failed { .. } => "failed",
            Outcome::Skipped { .. } => "skipped",
            Outcome::NotRun => "not-run",
        }
    }

    fn passed(&self) -> bool {
        matches!(self, Outcome::Passed { .. })
    }

    fn json(&self) -> Value {
        match self {
            Outcome::Passed { seconds } => json!({"result": "passed", "seconds": round1(*seconds)}),
            Outcome::Failed {
                state,
                seconds,
                message,
                missing_image,
                other_node,
            } => json!({
                "result": "failed",
                "state": state,
                "seconds": round1(*seconds),
                "message": truncate(message, 2000),
                "missing_image": missing_image,
                "other_node": other_node,
            }),
            Outcome::Skipped { reason } => json!({"result": "skipped", "reason": reason}),
            Outcome::NotRun => json!({"result": "not-run"}),
        }
    }
}

fn fail_word(state: &str) -> &str {
    match state {
        "failed" => "FAIL",
        "timedout" => "TIMEOUT",
        "panicked" => "PANIC",
        "interrupted" => "INTERRUPTED",
        other => other,
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The first image named in a pull failure that is not on the node.
pub fn missing_image(text: &str, has_image: &dyn Fn(&str) -> bool) -> Option<String> {
    for marker in [
        "Failed to pull image \"",
        "Back-off pulling image \"",
        "image \"",
    ] {
        for piece in text.split(marker).skip(1) {
            if let Some(name) = piece.split('"').next()
                && !name.is_empty()
                && !name.contains(' ')
                && !has_image(name)
            {
                return Some(name.to_string());
            }
        }
    }
    None
}

/// The first node not named `conf-*` that the spec's output shows a pod
/// scheduled to (`Successfully assigned <ns>/<pod> to <node>`).
pub fn other_node(output: &str) -> Option<String> {
    output
        .split("Successfully assigned ")
        .skip(1)
        .filter_map(|rest| rest.split_once(" to ").map(|(_, n)| n))
        .filter_map(|n| n.split(|c: char| c.is_whitespace() || c == '"').next())
        .find(|n| !n.is_empty() && !n.starts_with("conf-"))
        .map(str::to_string)
}

/// One row: a selected spec and its results.
#[derive(Debug, Clone)]
pub struct Row {
    /// The spec.
    pub spec: Spec,
    /// evlet's result (None: evlet was not run).
    pub evlet: Option<Outcome>,
    /// Upstream kubelet's result.
    pub upstream: Option<Outcome>,
    /// Why the results differ, why the spec was skipped or why it fails on both.
    pub note: String,
}

impl Row {
    /// Whether the kubelets that ran disagree (pass vs not pass).
    pub fn differs(&self) -> bool {
        match (&self.evlet, &self.upstream) {
            (Some(e), Some(u)) => e.passed() != u.passed(),
            _ => false,
        }
    }
}

/// Builds the rows: every selected spec, each kubelet's outcome, the note.
pub fn rows(
    specs: &[Spec],
    selection: &Selection,
    results: &[(Kind, Vec<SpecResult>)],
    has_image: &dyn Fn(&str) -> bool,
) -> Vec<Row> {
    let outcome = |kind: Kind, spec: &Spec| -> Option<Outcome> {
        let (_, list) = results.iter().find(|(k, _)| *k == kind)?;
        let result = list.iter().find(|r| r.name == spec.name);
        Some(Outcome::of(result, spec.known_skip(selection), has_image))
    };
    let mut rows: Vec<Row> = specs
        .iter()
        .map(|spec| {
            let evlet = outcome(Kind::Evlet, spec);
            let upstream = outcome(Kind::Upstream, spec);
            let mut row = Row {
                spec: spec.clone(),
                evlet,
                upstream,
                note: String::new(),
            };
            row.note = note(&row);
            row
        })
        .collect();
    rows.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
    rows
}

/// The note of a row: a known explanation, else what the results say.
fn note(row: &Row) -> String {
    let any_not_pass = [&row.evlet, &row.upstream]
        .iter()
        .any(|o| matches!(o, Some(o) if !o.passed()));
    if !any_not_pass {
        return String::new();
    }
    if let Some(k) = known::explain(&row.spec.name) {
        return k.note();
    }
    let mut parts = Vec::new();
    for (who, o) in [("evlet", &row.evlet), ("upstream", &row.upstream)] {
        match o {
            Some(Outcome::Skipped { reason }) => {
                parts.push(format!("skipped: {reason}"));
                break;
            }
            Some(Outcome::Failed {
                other_node: Some(node),
                ..
            }) => parts.push(format!(
                "{who}: a pod went to node {node}, another engineer's node in the shared cluster: not this kubelet's result"
            )),
            Some(Outcome::Failed {
                missing_image: Some(image),
                ..
            }) => parts.push(format!("{who}: needs image {image}, which cannot be built here")),
            Some(Outcome::Failed { message, .. }) => {
                parts.push(format!("{who}: {}", truncate(&first_line(message), 300)));
            }
            Some(Outcome::NotRun) => parts.push(format!("{who}: not run (interrupted)")),
            _ => {}
        }
    }
    parts.dedup();
    parts.join("; ")
}

/// What is known of each kubelet's run.
#[derive(Debug, Clone, Default)]
pub struct KubeletRun {
    /// `evlet 0.1.0 (pleg ebpf)`, `Kubernetes v1.34.4`.
    pub version: String,
    /// Wall time of its suite, seconds.
    pub seconds: f64,
    /// Other Ready nodes seen while it ran (the scheduler could use them).
    pub other_nodes: Vec<String>,
    /// Anything worth a line (a pass that failed to start, ...).
    pub notes: Vec<String>,
}

/// Everything the report says.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// UTC time of the run's start, `2026-11-27T21:00:00Z`.
    pub date: String,
    /// The command line.
    pub command: String,
    /// The machine: CPUs, kernel, containerd.
    pub machine: String,
    /// The selection.
    pub focus: String,
    /// Its skip.
    pub skip: String,
    /// Known skips (fragment, why).
    pub known_skips: Vec<(String, String)>,
    /// Per kubelet that ran.
    pub kubelets: Vec<(Kind, KubeletRun)>,
    /// Images built (name, how).
    pub images_built: Vec<(String, String)>,
    /// Images the suite lists that were not built.
    pub images_missing: Vec<String>,
    /// The rows.
    pub rows: Vec<Row>,
}

impl Report {
    fn passes(&self, kind: Kind) -> Option<usize> {
        self.kubelets.iter().any(|(k, _)| *k == kind).then(|| {
            self.rows
                .iter()
                .filter(|r| matches!(if kind == Kind::Evlet { &r.evlet } else { &r.upstream }, Some(o) if o.passed()))
                .count()
        })
    }

    /// "evlet passes N of M; upstream kubelet on the same machine passes K of M".
    pub fn headline(&self) -> String {
        let m = self.rows.len();
        let e = self.passes(Kind::Evlet);
        let u = self.passes(Kind::Upstream);
        match (e, u) {
            (Some(n), Some(k)) => format!(
                "evlet passes {n} of {m}; upstream kubelet on the same machine passes {k} of {m}"
            ),
            (Some(n), None) => format!("evlet passes {n} of {m} (upstream kubelet not run)"),
            (None, Some(k)) => format!("upstream kubelet passes {k} of {m} (evlet not run)"),
            (None, None) => format!("{m} specs selected, no kubelet run"),
        }
    }

    fn count(&self, kind: Kind, word: &str) -> usize {
        self.rows
            .iter()
            .filter(|r| {
                let o = if kind == Kind::Evlet {
                    &r.evlet
                } else {
                    &r.upstream
                };
                o.as_ref().is_some_and(|o| o.word() == word)
            })
            .count()
    }

    /// The Markdown report.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# Node conformance: evlet and upstream kubelet\n");
        let _ = writeln!(s, "**{}**\n", self.headline());
        let _ = writeln!(s, "- Run: {} (`{}`)", self.date, self.command);
        let _ = writeln!(s, "- Machine: {}", self.machine);
        let _ = writeln!(s, "- Focus: `{}`; skip: `{}`", self.focus, self.skip);
        for (kind, run) in &self.kubelets {
            let _ = writeln!(
                s,
                "- {kind}: {}; {} passed, {} failed, {} skipped, {} not run; suite {}",
                run.version,
                self.count(*kind, "passed"),
                self.count(*kind, "failed"),
                self.count(*kind, "skipped"),
                self.count(*kind, "not-run"),
                super::suite::elapsed(std::time::Duration::from_secs_f64(run.seconds)),
            );
            if !run.other_nodes.is_empty() {
                let _ = writeln!(
                    s,
                    "  - other Ready nodes during the run (the scheduler could use them): {}",
                    run.other_nodes.join(", ")
                );
            }
            for note in &run.notes {
                let _ = writeln!(s, "  - {note}");
            }
        }
        let _ = writeln!(s, "\nMethod: [conformance/README.md](../README.md).\n");

        let differences: Vec<&Row> = self.rows.iter().filter(|r| r.differs()).collect();
        let _ = writeln!(s, "## Differences ({})\n", differences.len());
        if differences.is_empty() {
            let _ = writeln!(s, "None.\n");
        } else {
            table(&mut s, &differences);
        }
        let skipped: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| {
                matches!(r.evlet, Some(Outcome::Skipped { .. }))
                    || matches!(r.upstream, Some(Outcome::Skipped { .. }))
            })
            .collect();
        let _ = writeln!(s, "## Skipped ({})\n", skipped.len());
        if skipped.is_empty() {
            let _ = writeln!(s, "None.\n");
        } else {
            table(&mut s, &skipped);
        }
        let both: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| {
                matches!(r.evlet, Some(Outcome::Failed { .. }))
                    && matches!(r.upstream, Some(Outcome::Failed { .. }))
            })
            .collect();
        if !both.is_empty() {
            let _ = writeln!(s, "## Failing with both kubelets ({})\n", both.len());
            table(&mut s, &both);
        }
        let _ = writeln!(s, "## Images\n");
        for (name, how) in &self.images_built {
            let _ = writeln!(s, "- `{name}`: {how}");
        }
        if !self.images_missing.is_empty() {
            let _ = writeln!(
                s,
                "- Not built here (no recipe; a spec that needs one fails or is skipped, as noted): {}",
                self.images_missing
                    .iter()
                    .map(|i| format!("`{i}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let _ = writeln!(s, "\n## All specs ({})\n", self.rows.len());
        let all: Vec<&Row> = self.rows.iter().collect();
        table(&mut s, &all);
        s
    }

    /// The JSON report.
    pub fn json(&self) -> Value {
        json!({
            "headline": self.headline(),
            "date": self.date,
            "command": self.command,
            "machine": self.machine,
            "selection": {
                "focus": self.focus,
                "skip": self.skip,
                "known_skips": self.known_skips.iter().map(|(f, w)| json!({"fragment": f, "why": w})).collect::<Vec<_>>(),
            },
            "kubelets": self.kubelets.iter().map(|(k, r)| (k.name().to_string(), json!({
                "version": r.version,
                "seconds": round1(r.seconds),
                "passed": self.count(*k, "passed"),
                "failed": self.count(*k, "failed"),
                "skipped": self.count(*k, "skipped"),
                "not_run": self.count(*k, "not-run"),
                "other_ready_nodes": r.other_nodes,
                "notes": r.notes,
            }))).collect::<serde_json::Map<_, _>>(),
            "images": {
                "built": self.images_built.iter().map(|(n, h)| json!({"name": n, "how": h})).collect::<Vec<_>>(),
                "not_built": self.images_missing,
            },
            "specs": self.rows.iter().map(|r| json!({
                "name": r.spec.name,
                "location": r.spec.location,
                "evlet": r.evlet.as_ref().map(Outcome::json),
                "upstream": r.upstream.as_ref().map(Outcome::json),
                "differs": r.differs(),
                "note": r.note,
            })).collect::<Vec<_>>(),
        })
    }
}

fn table(s: &mut String, rows: &[&Row]) {
    let _ = writeln!(s, "| spec | evlet | upstream | note |");
    let _ = writeln!(s, "|---|---|---|---|");
    for r in rows {
        let cell = |o: &Option<Outcome>| o.as_ref().map_or_else(|| "—".to_string(), Outcome::cell);
        let _ = writeln!(
            s,
            "| {} <br>`{}` | {} | {} | {} |",
            md(&r.spec.name),
            r.spec.location,
            cell(&r.evlet),
            cell(&r.upstream),
            md(&r.note)
        );
    }
    let _ = writeln!(s);
}

fn md(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The first non-empty line of `text`.
pub fn first_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

/// `text` cut to `n` characters.
pub fn truncate(text: &str, n: usize) -> String {
    if text.chars().count() <= n {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(n).collect::<String>())
    }
}

/// Writes `report.md` and `report.json` into `dir`, and when `results` is
/// given also `latest.*` and the dated copies there.
///
/// # Errors
/// If a file cannot be written.
pub fn write(report: &Report, dir: &Path, results: Option<&Path>) -> Result<()> {
    let md = report.markdown();
    let json = serde_json::to_string_pretty(&report.json())? + "\n";
    fs::create_dir_all(dir)?;
    fs::write(dir.join("report.md"), &md)?;
    fs::write(dir.join("report.json"), &json)?;
    if let Some(results) = results {
        fs::create_dir_all(results)?;
        let stamp = compact(&report.date);
        for (name, text) in [
            ("latest.md".to_string(), &md),
            ("latest.json".to_string(), &json),
            (format!("{stamp}.md"), &md),
            (format!("{stamp}.json"), &json),
        ] {
            let path = results.join(&name);
            fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    Ok(())
}

/// `2026-11-27T21:00:00Z` → `20261127T210000Z`.
pub fn compact(date: &str) -> String {
    date.chars().filter(|c| *c != '-' && *c != ':').collect()
}

/// The current UTC time as `2026-11-27T21:00:00Z`.
pub fn now_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    utc(secs)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (Howard Hinnant's civil_from_days).
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const GINKGO: &str = r#"[{"SpecReports": [
      {"LeafNodeType": "BeforeSuite", "State": "passed"},
      {"ContainerHierarchyTexts": ["[sig-node] Pods"], "ContainerHierarchyLabels": [["sig-node"]],
       "LeafNodeType": "It", "LeafNodeText": "should be submitted [NodeConformance]",
       "LeafNodeLabels": ["NodeConformance"],
       "LeafNodeLocation": {"FileName": "k8s.io/kubernetes@v1.34.4/test/e2e/common/node/pods.go", "LineNumber": 227},
       "State": "passed", "RunTime": 12500000000},
      {"ContainerHierarchyTexts": ["[sig-node] Pods"], "LeafNodeType": "It", "LeafNodeText": "should pull",
       "LeafNodeLocation": {"FileName": "k8s.io/kubernetes@v1.34.4/test/e2e/common/node/runtime.go", "LineNumber": 9},
       "State": "failed", "RunTime": 300000000000,
       "Failure": {"Message": "timed out waiting for the condition\nmore"},
       "CapturedGinkgoWriterOutput": "Warning  Failed  Failed to pull image \"registry.k8s.io/e2e-test-images/kitten:1.7\": no route"}
    ]}]"#;

    fn spec(name: &str) -> Spec {
        Spec {
            name: name.into(),
            location: "x.go:1".into(),
            labels: vec![],
        }
    }

    #[test]
    fn ginkgo_reports_become_one_result_per_it() {
        let r = parse_ginkgo_json(GINKGO).expect("parse");
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0].name,
            "[sig-node] Pods should be submitted [NodeConformance]"
        );
        assert_eq!(r[0].location, "test/e2e/common/node/pods.go:227");
        assert_eq!(r[0].labels, vec!["NodeConformance", "sig-node"]);
        assert_eq!(r[0].state, "passed");
        assert!((r[0].seconds - 12.5).abs() < 1e-9);
        assert_eq!(r[1].state, "failed");
    }

    #[test]
    fn rows_pair_the_kubelets_and_explain_a_missing_image() {
        let r = parse_ginkgo_json(GINKGO).expect("parse");
        let specs = vec![
            spec("[sig-node] Pods should be submitted [NodeConformance]"),
            spec("[sig-node] Pods should pull"),
            spec("[sig-node] never ran"),
            spec("[sig-node] known one"),
        ];
        let selection = Selection {
            focus: String::new(),
            skip: String::new(),
            known_skips: vec![("known one", "needs a registry")],
        };
        let has = |name: &str| name.contains("agnhost");
        let rows = rows(
            &specs,
            &selection,
            &[(Kind::Evlet, r.clone()), (Kind::Upstream, r)],
            &has,
        );
        let find = |n: &str| rows.iter().find(|r| r.spec.name.contains(n)).expect(n);
        assert!(matches!(
            find("submitted").evlet,
            Some(Outcome::Passed { .. })
        ));
        let pull = find("should pull");
        assert!(!pull.differs());
        assert_eq!(
            pull.note,
            "evlet: needs image registry.k8s.io/e2e-test-images/kitten:1.7, which cannot be built here; upstream: needs image registry.k8s.io/e2e-test-images/kitten:1.7, which cannot be built here"
        );
        assert_eq!(find("never ran").evlet, Some(Outcome::NotRun));
        assert_eq!(find("known one").note, "skipped: needs a registry");
        let report = Report {
            kubelets: vec![
                (Kind::Evlet, KubeletRun::default()),
                (Kind::Upstream, KubeletRun::default()),
            ],
            rows,
            ..Report::default()
        };
        assert_eq!(
            report.headline(),
            "evlet passes 1 of 4; upstream kubelet on the same machine passes 1 of 4"
        );
        let md = report.markdown();
        assert!(md.contains("## Differences (0)"));
        assert!(md.contains("## Skipped (1)"));
        assert_eq!(report.json()["specs"].as_array().map(Vec::len), Some(4));
    }

    #[test]
    fn a_difference_is_pass_against_not_pass() {
        let passed = Some(Outcome::Passed { seconds: 1.0 });
        let failed = Some(Outcome::Failed {
            state: "failed".into(),
            seconds: 1.0,
            message: "boom\nat x".into(),
            missing_image: None,
            other_node: None,
        });
        let mut row = Row {
            spec: spec("[sig-node] an unknown spec nobody explained"),
            evlet: failed,
            upstream: passed.clone(),
            note: String::new(),
        };
        assert!(row.differs());
        assert_eq!(note(&row), "evlet: boom");
        row.upstream = None;
        assert!(!row.differs());
    }

    #[test]
    fn a_pod_scheduled_to_another_node_is_found_in_the_output() {
        let out = "event for a: { } Scheduled: Successfully assigned ns/a to conf-evlet\n\
                   event for b: { } Scheduled: Successfully assigned ns/b to e2e6836-0\n";
        assert_eq!(other_node(out).as_deref(), Some("e2e6836-0"));
        assert_eq!(
            other_node("Successfully assigned ns/a to conf-upstream"),
            None
        );
    }

    #[test]
    fn dates_are_utc_and_compact() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_795_813_200), "2026-11-27T21:00:00Z");
        assert_eq!(compact("2026-11-27T21:00:00Z"), "20261127T210000Z");
    }
}
