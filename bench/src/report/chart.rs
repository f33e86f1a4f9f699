//! The PNG chart of the PLEG modes benchmark, and the font every bench's
//! chart draws with.

use std::path::Path;

use anyhow::{Context as _, Result};
use plotters::prelude::*;

use super::Results;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Registers DejaVu Sans as the charts' `sans-serif` (once per process).
///
/// # Errors
/// If the font file is missing or unusable.
pub fn register_font() -> Result<()> {
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if DONE.get().is_some() {
        return Ok(());
    }
    let font = std::fs::read(FONT).with_context(|| {
        format!("reading {FONT} (Debian fonts-dejavu-core; run `cargo xtask setup`)")
    })?;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| anyhow::anyhow!("{FONT} is not a usable font"))?;
    let _ = DONE.set(());
    Ok(())
}

fn colour(mode: &str) -> RGBColor {
    match mode {
        "ebpf" => RGBColor(0x1b, 0x9e, 0x77),
        "generic" => RGBColor(0xd9, 0x5f, 0x02),
        "upstream" => RGBColor(0xe7, 0x29, 0x8a),
        "upstream-evented" => RGBColor(0x66, 0xa6, 0x1e),
        _ => RGBColor(0x75, 0x70, 0xb3),
    }
}

/// The chart: kill → status distributions per mode at the largest pod count
/// (left) and the agents' idle CPU against the pod count (right).
///
/// # Errors
/// If the font is missing or the PNG cannot be written.
pub fn chart(results: &Results, path: &Path) -> Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(700);
    let modes: Vec<String> = {
        let mut m: Vec<String> = results.runs.iter().map(|r| r.mode.clone()).collect();
        m.sort();
        m.dedup();
        m
    };
    let largest = results.runs.iter().map(|r| r.pods).max().unwrap_or(0);

    let max_ms = results
        .runs
        .iter()
        .filter_map(|r| r.kill_to_status.as_ref().map(|s| s.max_ms))
        .fold(10.0_f64, f64::max);
    let mut cdf = ChartBuilder::on(&left)
        .caption(
            format!("kill → status, {largest} pods (CDF)"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((1.0_f64..max_ms * 1.5).log_scale(), 0.0_f64..1.0)?;
    cdf.configure_mesh()
        .x_desc("milliseconds (log)")
        .y_desc("fraction of kills")
        .draw()?;
    for mode in &modes {
        let Some(s) = results
            .runs
            .iter()
            .find(|r| r.pods == largest && &r.mode == mode)
            .and_then(|r| r.kill_to_status.as_ref())
        else {
            continue;
        };
        let n = s.samples_ms.len() as f64;
        let points = s
            .samples_ms
            .iter()
            .enumerate()
            .map(|(i, &v)| (v.max(1.0), (i + 1) as f64 / n));
        let c = colour(mode);
        cdf.draw_series(LineSeries::new(points, c.stroke_width(3)))?
            .label(mode.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    cdf.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;

    let max_cpu = results
        .runs
        .iter()
        .map(|r| r.evlet_cpu_pct)
        .fold(0.1_f64, f64::max);
    let mut cpu = ChartBuilder::on(&right)
        .caption("idle agent CPU vs pods", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(
            (1.0_f64..(largest.max(10) as f64) * 1.5).log_scale(),
            (0.001_f64..max_cpu * 2.0).log_scale(),
        )?;
    cpu.configure_mesh()
        .x_desc("pods (log)")
        .y_desc("% of one core (log)")
        .draw()?;
    for mode in &modes {
        let mut points: Vec<(f64, f64)> = results
            .runs
            .iter()
            .filter(|r| &r.mode == mode)
            .map(|r| (r.pods as f64, r.evlet_cpu_pct.max(0.001)))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let c = colour(mode);
        cpu.draw_series(LineSeries::new(points.clone(), c.stroke_width(3)))?
            .label(mode.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
        cpu.draw_series(points.into_iter().map(|p| Circle::new(p, 5, c.filled())))?;
    }
    cpu.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
