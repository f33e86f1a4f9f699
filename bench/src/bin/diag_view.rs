//! Draws what `evlet diag` shows as a PNG for the README: a pod's timeline
//! from a container kill to its replacement running (one row per entry,
//! milliseconds from the kernel's exit record) and the PLEG view's counters.
//!
//! ```sh
//! evlet diag -o json pod default/web > pod.json
//! evlet diag -o json pleg > pleg.json
//! cargo run -p evlet-bench --bin diag_view -- pod.json pleg.json docs/diag.png
//! ```

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Parser;
use evlet::diagnostics::timeline::{PodTimeline, Source};
use evlet::server::debug::PlegView;
use plotters::prelude::*;

#[derive(Debug, Parser)]
struct Args {
    /// `evlet diag -o json pod NS/NAME` output.
    pod: PathBuf,
    /// `evlet diag -o json pleg` output.
    pleg: PathBuf,
    /// The PNG to write.
    out: PathBuf,
}

fn colour(s: Source) -> RGBColor {
    match s {
        Source::Kernel => RGBColor(0xd6, 0x27, 0x28),
        Source::Pleg => RGBColor(0x1f, 0x77, 0xb4),
        Source::Status => RGBColor(0x2c, 0xa0, 0x2c),
        Source::Cri => RGBColor(0x94, 0x67, 0xbd),
        Source::Sync => RGBColor(0x8c, 0x56, 0x4b),
        Source::Event => RGBColor(0x44, 0x44, 0x44),
        Source::Probe => RGBColor(0xff, 0x7f, 0x0e),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let pod: PodTimeline = serde_json::from_slice(&std::fs::read(&args.pod)?)
        .with_context(|| format!("{}: a pod timeline", args.pod.display()))?;
    let pleg: PlegView = serde_json::from_slice(&std::fs::read(&args.pleg)?)
        .with_context(|| format!("{}: a PLEG view", args.pleg.display()))?;
    let kill = pod
        .entries
        .iter()
        .rev()
        .find(|e| e.source == Source::Kernel)
        .context("the timeline has no kernel entry (kill a container first)")?
        .unix_ns;
    // From the kill to the replacement running again.
    let mut window = Vec::new();
    for e in pod.entries.iter().filter(|e| e.unix_ns >= kill) {
        window.push(e);
        if e.source == Source::Status && e.what.contains("running") {
            break;
        }
    }
    let ms = |e: &evlet::diagnostics::timeline::Entry| ((e.unix_ns - kill) as f64 / 1e6).max(0.05);
    let end_ms = window.iter().map(|e| ms(e)).fold(1.0_f64, f64::max);

    evlet_bench::report::register_font()?;
    let root = BitMapBackend::new(&args.out, (1400, 60 + 34 * window.len() as u32 + 80))
        .into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(1020);
    let rows = window.len() as f64;
    let mut chart = ChartBuilder::on(&left)
        .caption(
            format!(
                "evlet diag pod {}/{}: a SIGKILLed container, kill → replacement running",
                pod.namespace, pod.name
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(10)
        .build_cartesian_2d((0.04_f64..end_ms * 40.0).log_scale(), -rows..0.5)?;
    chart
        .configure_mesh()
        .x_desc("milliseconds after the kernel's exit record (log)")
        .disable_y_axis()
        .disable_y_mesh()
        .draw()?;
    for (i, e) in window.iter().enumerate() {
        let (x, y) = (ms(e), -(i as f64));
        let c = colour(e.source);
        chart.draw_series(std::iter::once(Circle::new((x, y), 6, c.filled())))?;
        let mut label: String = e.what.chars().take(60).collect();
        if e.what.chars().count() > 60 {
            label.push('…');
        }
        chart.draw_series(std::iter::once(Text::new(
            format!(
                "{:.1} ms  {}: {label}",
                (e.unix_ns - kill) as f64 / 1e6,
                e.source.as_str()
            ),
            (x * 1.25, y + 0.2),
            ("sans-serif", 15).into_font().color(&c),
        )))?;
    }

    let lines = [
        format!("evlet diag pleg: mode {}", pleg.mode),
        format!("health: {}", pleg.unhealthy.as_deref().unwrap_or("healthy")),
        format!("hints: {}", pleg.hint_latency.count),
        format!("single-pod relists: {}", pleg.pod_relist_duration.count),
        format!("quiet proofs: {}", pleg.quiet_proofs),
        format!("missed events: {}", pleg.missed_events),
        format!("ring-buffer lost: {}", pleg.ringbuf_lost),
        format!("discarded events: {}", pleg.discarded_events),
        format!("runtime exits lost: {}", pleg.runtime_exit_lost),
        format!(
            "runtime disagreements: {}",
            pleg.runtime_disagreements.values().sum::<u64>()
        ),
        format!(
            "full relists: {}",
            pleg.full_relists
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ];
    for (i, line) in lines.iter().enumerate() {
        right.draw(&Text::new(
            line.clone(),
            (20, 40 + 36 * i as i32),
            ("sans-serif", if i == 0 { 22 } else { 18 }),
        ))?;
    }
    root.present()?;
    println!("wrote {}", args.out.display());
    Ok(())
}
