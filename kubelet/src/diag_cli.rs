//! `evlet diag`: reads a running evlet's diagnostics and shows them as
//! tables, or as JSON with `-o json`. On the node, as root, it reads them
//! over the node-local socket (`--socket`, default
//! `/var/lib/evlet/evlet.sock`); from anywhere, with `--kubeconfig`, through
//! the API server's node proxy (`--node`) or from the secured port itself
//! (`--server`), as a user allowed `nodes/proxy` ([`transport`]). The
//! read-only port does not serve them (upstream's serves no such paths, and
//! the timelines carry probe output).
//!
//! * `diag oom [--follow] [--since 1h] [--pod ns/name]`: the kernel's OOM
//!   kills, with the victim, its RSS, the memory limit it hit and at which
//!   cgroup level, and whether the container's init died.
//! * `diag pleg [--follow]`: the PLEG's mode, health, hint latency, quiet
//!   proofs, missed events, ring-buffer losses, runtime disagreements and
//!   lost exits, full relists and per-pod relists (per second with `--follow`).
//! * `diag pod ns/name [--follow]`: the pod's timeline.
//! * `diag eviction`: the eviction manager's passes, what woke them, the
//!   kernel notifications armed, and the recent passes that found a
//!   threshold met (signal, threshold, available, the pod evicted).
//!
//! A binary-only module: it is a client of the agent, not part of it.

mod text;
mod transport;

use std::io::IsTerminal as _;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use evlet::diagnostics::OomRecord;
use evlet::diagnostics::timeline::PodTimeline;
use evlet::server::debug::PlegView;
use text::{eviction_text, pleg_text, relist_rates};

/// evlet's diagnostics, read from a running agent.
#[derive(Debug, Parser)]
#[command(name = "evlet diag")]
pub struct Diag {
    /// Where the agent is.
    #[command(flatten)]
    target: transport::Target,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value = "table")]
    output: Output,
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
enum What {
    /// OOM kills the kernel reported.
    Oom {
        /// Keep printing new kills.
        #[arg(long)]
        follow: bool,
        /// Only kills this recent (`90s`, `10m`, `1h`).
        #[arg(long)]
        since: Option<String>,
        /// Only kills in this pod (`namespace/name`).
        #[arg(long)]
        pod: Option<String>,
    },
    /// The PLEG's state and counters.
    Pleg {
        /// Refresh every second, with rates.
        #[arg(long)]
        follow: bool,
    },
    /// The eviction manager's passes and evictions.
    Eviction,
    /// A pod's timeline: kernel events, CRI calls, PLEG events, syncs,
    /// statuses, probe results and events.
    Pod {
        /// `namespace/name`.
        pod: String,
        /// Keep printing new entries.
        #[arg(long)]
        follow: bool,
    },
}

const POLL: Duration = Duration::from_secs(1);

/// Runs `evlet diag …` (`args`: `diag` and what follows it).
pub fn main(args: Vec<String>) -> Result<()> {
    let diag =
        Diag::parse_from(std::iter::once("evlet diag".to_owned()).chain(args.into_iter().skip(1)));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(diag.run())
}

impl Diag {
    async fn run(&self) -> Result<()> {
        let transport = self.target.connect().await?;
        let this = Connected {
            diag: self,
            transport,
        };
        this.run().await
    }
}

/// `evlet diag` with its way to the agent.
struct Connected<'a> {
    diag: &'a Diag,
    transport: transport::Transport,
}

impl std::ops::Deref for Connected<'_> {
    type Target = Diag;
    fn deref(&self) -> &Diag {
        self.diag
    }
}

impl Connected<'_> {
    async fn run(&self) -> Result<()> {
        match &self.what {
            What::Oom { follow, since, pod } => {
                let since = since
                    .as_deref()
                    .map(evlet::config::parse_duration)
                    .transpose()
                    .context("--since")?;
                let pod = pod.as_deref().map(split_pod).transpose()?;
                self.oom(*follow, since, pod).await
            }
            What::Pleg { follow } => self.pleg(*follow).await,
            What::Eviction => {
                let view: serde_json::Value = self.get("/debug/eviction").await?;
                match self.output {
                    Output::Json => println!("{}", serde_json::to_string_pretty(&view)?),
                    Output::Table => print!("{}", eviction_text(&view)),
                }
                Ok(())
            }
            What::Pod { pod, follow } => self.pod(split_pod(pod)?, *follow).await,
        }
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        let (status, body) = self.transport.get(path).await?;
        if status != 200 {
            bail!("{path}: HTTP {status}: {}", body.trim());
        }
        serde_json::from_str(&body).with_context(|| format!("{path}: unexpected answer"))
    }

    async fn oom(
        &self,
        follow: bool,
        since: Option<Duration>,
        pod: Option<(&str, &str)>,
    ) -> Result<()> {
        let cutoff = since
            .map(|d| evlet::clock::unix_ns() - i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        let mut shown = 0usize;
        let mut header = self.output == Output::Table;
        loop {
            let records: Vec<OomRecord> = self.get("/debug/oom").await?;
            let new: Vec<&OomRecord> = records
                .iter()
                .skip(shown.min(records.len()))
                .filter(|r| cutoff.is_none_or(|c| parse_time(&r.time).is_some_and(|t| t >= c)))
                .filter(|r| pod.is_none_or(|(ns, name)| r.namespace == ns && r.pod == name))
                .collect();
            shown = records.len();
            match self.output {
                Output::Json if follow => {
                    for r in new {
                        println!("{}", serde_json::to_string(r)?);
                    }
                }
                Output::Json => println!("{}", serde_json::to_string_pretty(&new)?),
                Output::Table => {
                    let rows: Vec<Vec<String>> = new.iter().map(|r| oom_row(r)).collect();
                    print_table(
                        &[
                            "TIME",
                            "POD",
                            "CONTAINER",
                            "PID",
                            "COMM",
                            "VICTIM",
                            "ANON-RSS",
                            "LIMIT-HIT",
                            "LIMIT",
                        ],
                        &rows,
                        header,
                    );
                    header = false;
                }
            }
            if !follow {
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn pleg(&self, follow: bool) -> Result<()> {
        let mut before: Option<(PlegView, std::time::Instant)> = None;
        loop {
            let view: PlegView = self.get("/debug/pleg").await?;
            match self.output {
                Output::Json if follow => println!("{}", serde_json::to_string(&view)?),
                Output::Json => println!("{}", serde_json::to_string_pretty(&view)?),
                Output::Table => {
                    if follow && std::io::stdout().is_terminal() {
                        print!("\x1b[2J\x1b[H");
                    }
                    let rates = before
                        .as_ref()
                        .map(|(b, at)| relist_rates(b, &view, at.elapsed()));
                    print!("{}", pleg_text(&view, rates.as_ref()));
                }
            }
            if !follow {
                return Ok(());
            }
            before = Some((view, std::time::Instant::now()));
            tokio::time::sleep(POLL).await;
        }
    }

    async fn pod(&self, (namespace, name): (&str, &str), follow: bool) -> Result<()> {
        let path = format!("/debug/pods/{namespace}/{name}/timeline");
        let mut shown: Option<i64> = None;
        let mut header = self.output == Output::Table;
        loop {
            let t: PodTimeline = self.get(&path).await?;
            let start = t.entries.front().map_or(0, |e| e.unix_ns);
            let new: Vec<_> = t
                .entries
                .iter()
                .filter(|e| shown.is_none_or(|s| e.unix_ns > s))
                .collect();
            if let Some(last) = t.entries.back() {
                shown = Some(last.unix_ns);
            }
            match self.output {
                Output::Json if follow => {
                    for e in new {
                        println!("{}", serde_json::to_string(e)?);
                    }
                }
                Output::Json => println!("{}", serde_json::to_string_pretty(&t)?),
                Output::Table => {
                    if header {
                        println!("pod {namespace}/{name} (UID {})", t.uid);
                    }
                    let rows: Vec<Vec<String>> = new
                        .iter()
                        .map(|e| {
                            vec![
                                format_time(e.unix_ns),
                                format!("+{:.3}s", (e.unix_ns - start) as f64 / 1e9),
                                e.source.as_str().to_owned(),
                                e.what.clone(),
                            ]
                        })
                        .collect();
                    print_table(&["TIME", "SINCE-FIRST", "SOURCE", "WHAT"], &rows, header);
                    header = false;
                }
            }
            if !follow {
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

fn split_pod(s: &str) -> Result<(&str, &str)> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns, name))
        }
        _ => bail!("pod {s:?}: expected namespace/name"),
    }
}

fn parse_time(s: &str) -> Option<i64> {
    let t: k8s_openapi::jiff::Timestamp = s.parse().ok()?;
    i64::try_from(t.as_nanosecond()).ok()
}

fn format_time(unix_ns: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(unix_ns))
        .map(|t| format!("{t:.3}"))
        .unwrap_or_else(|_| unix_ns.to_string())
}

fn oom_row(r: &OomRecord) -> Vec<String> {
    let opt = |v: Option<u64>, unit: &str| v.map_or_else(|| "-".into(), |v| format!("{v}{unit}"));
    vec![
        parse_time(&r.time).map_or_else(|| r.time.clone(), format_time),
        format!("{}/{}", r.namespace, r.pod),
        if r.container.is_empty() {
            "?".into()
        } else {
            r.container.clone()
        },
        r.pid.to_string(),
        r.comm.clone(),
        match r.victim_is_init {
            Some(true) => "init".into(),
            Some(false) => "child".into(),
            None => "?".into(),
        },
        opt(r.anon_rss_kb, " KiB"),
        r.limit_hit.clone().unwrap_or_else(|| "?".into()),
        opt(r.memcg_limit_bytes, " B"),
    ]
}

fn print_table(header: &[&str], rows: &[Vec<String>], with_header: bool) {
    print!("{}", table_text(header, rows, with_header));
}

/// Columns padded to their widest cell, the last one unpadded.
fn table_text(header: &[&str], rows: &[Vec<String>], with_header: bool) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: Vec<&str>| {
        let n = cells.len();
        let mut out = String::new();
        for (i, (cell, w)) in cells.into_iter().zip(&widths).enumerate() {
            if i + 1 == n {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        text.push_str(out.trim_end());
        text.push('\n');
    };
    if with_header {
        line(header.to_vec());
    }
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_namespace_slash_name() {
        assert_eq!(split_pod("a/b").ok(), Some(("a", "b")));
        for bad in ["a", "/b", "a/", "a/b/c"] {
            assert!(split_pod(bad).is_err(), "{bad}");
        }
    }
}
