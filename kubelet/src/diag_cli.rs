//! `evlet diag`: reads a running evlet's diagnostics over its read-only HTTP
//! endpoint (`--address`, default upstream's read-only port on localhost)
//! and shows them as tables, or as JSON with `-o json`.
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

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use evlet::diagnostics::OomRecord;
use evlet::diagnostics::timeline::PodTimeline;
use evlet::server::debug::{HistogramView, PlegView};
use http_body_util::BodyExt as _;

/// evlet's diagnostics, read from a running agent.
#[derive(Debug, Parser)]
#[command(name = "evlet diag")]
pub struct Diag {
    /// The agent's read-only HTTP address (`--address` of the agent).
    #[arg(long, global = true, default_value = "127.0.0.1:10255")]
    address: SocketAddr,
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
        let (status, body) = get(self.address, path).await?;
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

/// A plain HTTP/1 GET: status and body.
async fn get(address: SocketAddr, path: &str) -> Result<(u16, String)> {
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .with_context(|| format!("cannot reach evlet at {address} (is it running? --address)"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", address.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req))
        .await
        .context("evlet did not answer in 10 s")??;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
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

/// The `q` quantile of a histogram, interpolated within its bucket as
/// Prometheus' `histogram_quantile` does.
/// `/debug/eviction` as text: the kernel notifications, the passes by
/// trigger, the last pass, then a table of the passes that acted.
fn eviction_text(v: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let kernel = &v["kernel"];
    let _ = writeln!(
        out,
        "kernel notifications: {} memory cgroup threshold(s), PSI trigger {}",
        kernel["memcgThresholds"].as_u64().unwrap_or(0),
        if kernel["psi"].as_bool() == Some(true) {
            "armed"
        } else {
            "not armed"
        }
    );
    let passes: Vec<String> = v["passes"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let _ = writeln!(out, "passes: {}", passes.join(", "));
    let conditions = |p: &serde_json::Value| {
        let c: Vec<&str> = p["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str())
            .collect();
        if c.is_empty() {
            "none".to_owned()
        } else {
            c.join(" ")
        }
    };
    if v["last"].is_object() {
        let last = &v["last"];
        let _ = writeln!(
            out,
            "last pass: {} ({}), pressure: {}",
            format_time(last["atNs"].as_i64().unwrap_or(0)),
            last["trigger"].as_str().unwrap_or(""),
            conditions(last)
        );
    }
    let rows: Vec<Vec<String>> = v["acting"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let n = |k: &str| p[k].as_i64().map_or(String::new(), |x| x.to_string());
            vec![
                format_time(p["atNs"].as_i64().unwrap_or(0)),
                p["trigger"].as_str().unwrap_or("").to_owned(),
                p["signal"].as_str().unwrap_or("").to_owned(),
                n("threshold"),
                n("available"),
                p["evicted"].as_str().unwrap_or("-").to_owned(),
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("no pass has found a threshold met\n");
    } else {
        out.push_str(&table_text(
            &[
                "TIME",
                "TRIGGER",
                "SIGNAL",
                "THRESHOLD",
                "AVAILABLE",
                "EVICTED",
            ],
            &rows,
            true,
        ));
    }
    out
}

fn quantile(h: &HistogramView, q: f64) -> Option<f64> {
    if h.count == 0 {
        return None;
    }
    let rank = q * h.count as f64;
    let mut lower = (0.0, 0u64);
    for &(bound, count) in &h.buckets {
        if count as f64 >= rank {
            let in_bucket = (count - lower.1) as f64;
            let frac = if in_bucket > 0.0 {
                (rank - lower.1 as f64) / in_bucket
            } else {
                1.0
            };
            return Some(lower.0 + (bound - lower.0) * frac);
        }
        lower = (bound, count);
    }
    Some(lower.0)
}

fn seconds(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(s) if s < 1e-3 => format!("{:.0} µs", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.2} ms", s * 1e3),
        Some(s) => format!("{s:.2} s"),
    }
}

fn relist_rates(before: &PlegView, now: &PlegView, elapsed: Duration) -> BTreeMap<String, f64> {
    let secs = elapsed.as_secs_f64().max(1e-3);
    now.pod_relists
        .iter()
        .map(|(pod, n)| {
            let was = before.pod_relists.get(pod).copied().unwrap_or(0);
            (pod.clone(), n.saturating_sub(was) as f64 / secs)
        })
        .collect()
}

fn pleg_text(v: &PlegView, rates: Option<&BTreeMap<String, f64>>) -> String {
    let map = |m: &BTreeMap<String, u64>| {
        if m.is_empty() {
            "0".to_owned()
        } else {
            m.iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let ago = if v.last_full_relist > 0.0 {
        format!(
            "{:.1} s ago",
            evlet::clock::unix_ns() as f64 / 1e9 - v.last_full_relist
        )
    } else {
        "none yet".into()
    };
    let h = &v.hint_latency;
    let mut out = String::new();
    let mut row = |k: &str, val: String| out.push_str(&format!("{k:<24}{val}\n"));
    row(
        "mode",
        format!(
            "{} ({})",
            v.mode,
            v.unhealthy.as_deref().unwrap_or("healthy")
        ),
    );
    row("last full relist", ago);
    row(
        "hint latency",
        format!(
            "{} hints, p50 {}, p99 {}, max bucket {}",
            h.count,
            seconds(quantile(h, 0.5)),
            seconds(quantile(h, 0.99)),
            seconds(
                h.buckets
                    .iter()
                    .find(|(_, c)| *c == h.count)
                    .map(|(b, _)| *b)
            )
        ),
    );
    let r = &v.pod_relist_duration;
    row(
        "pod relists",
        format!(
            "{} relists, p50 {}, p99 {}",
            r.count,
            seconds(quantile(r, 0.5)),
            seconds(quantile(r, 0.99))
        ),
    );
    row("quiet proofs", v.quiet_proofs.to_string());
    row(
        "missed events",
        format!(
            "{} (in {} counting relists)",
            v.missed_events, v.counted_relists
        ),
    );
    row("ring-buffer lost", v.ringbuf_lost.to_string());
    row("discarded events", v.discarded_events.to_string());
    row("runtime disagreements", map(&v.runtime_disagreements));
    row("runtime exits lost", v.runtime_exit_lost.to_string());
    row(
        "unconfirmed exits given up",
        v.expectations_abandoned.to_string(),
    );
    row("awaiting the runtime", format!("{} pods", v.expectations));
    row("full relists", map(&v.full_relists));
    let mut pods: Vec<(&String, &u64)> = v.pod_relists.iter().collect();
    pods.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    if !pods.is_empty() {
        out.push_str("\nPOD RELISTS (most first)\n");
        for (pod, n) in pods.into_iter().take(15) {
            let rate = rates
                .and_then(|r| r.get(pod))
                .map_or_else(String::new, |r| format!("  {r:.1}/s"));
            out.push_str(&format!("  {pod:<48}{n:>8}{rate}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let h = HistogramView {
            count: 10,
            sum: 0.0,
            buckets: vec![(0.001, 0), (0.002, 10), (0.005, 10)],
        };
        assert_eq!(quantile(&h, 0.5), Some(0.0015));
        assert_eq!(quantile(&HistogramView::default(), 0.5), None);
    }

    #[test]
    fn the_eviction_journal_reads_as_a_table() {
        let v = serde_json::json!({
            "passes": {"memcg": 2, "timer": 7},
            "kernel": {"memcgThresholds": 1, "psi": true},
            "last": {"atNs": 0, "trigger": "memcg", "conditions": ["MemoryPressure"]},
            "acting": [{"atNs": 0, "trigger": "memcg", "conditions": ["MemoryPressure"],
                        "signal": "memory.available", "threshold": 104857600,
                        "available": 99614720, "evicted": "default/hog"}]
        });
        let text = eviction_text(&v);
        assert!(text.starts_with(
            "kernel notifications: 1 memory cgroup threshold(s), PSI trigger armed\npasses: memcg 2, timer 7\n"
        ), "{text}");
        assert!(text.contains("(memcg), pressure: MemoryPressure"), "{text}");
        let rows: Vec<&str> = text.lines().skip(3).collect();
        assert!(
            rows[0].starts_with("TIME") && rows[0].ends_with("EVICTED"),
            "{text}"
        );
        assert!(
            rows[1].contains("memory.available  104857600  99614720   default/hog"),
            "{text}"
        );
    }

    #[test]
    fn pods_are_namespace_slash_name() {
        assert_eq!(split_pod("a/b").ok(), Some(("a", "b")));
        for bad in ["a", "/b", "a/", "a/b/c"] {
            assert!(split_pod(bad).is_err(), "{bad}");
        }
    }
}
