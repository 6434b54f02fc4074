//! `docs/bench-intake.svg`: roost beside the SQLite peer for each intake of `--intake`
//! (bars, batches/s), with the disk's fdatasync rate of the same run as a line (what one
//! batch per sync would reach).

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

/// One intake's bars: its name, roost's batches/s, the peer's (if fed the same way).
pub type Bar = (String, f64, Option<f64>);

pub fn plot(path: &Path, bars: &[Bar], sync_rate: f64) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (820, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let top = bars
        .iter()
        .flat_map(|(_, r, p)| [*r, p.unwrap_or(0.0)])
        .fold(sync_rate, f64::max)
        * 1.15;
    let n = bars.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "intake: batches/s of 10 creates (100 B), roost and the SQLite peer on the same lines",
            ("sans-serif", 15),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..n, 0f64..top)
        .map_err(|e| anyhow!("{e}"))?;
    let names: Vec<String> = bars.iter().map(|b| short(&b.0)).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len() * 2 + 1)
        .x_label_formatter(&|x| label(&names, *x))
        .y_desc("batches/s")
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    let roost: Vec<(f64, f64)> = (0..bars.len()).map(|i| (i as f64, bars[i].1)).collect();
    let peer: Vec<(f64, f64)> = bars
        .iter()
        .enumerate()
        .filter_map(|(i, b)| b.2.map(|p| (i as f64, p)))
        .collect();
    for (name, pts, color, dx) in [
        ("roost", roost, BLUE, 0.12),
        ("SQLite peer", peer, RED, 0.5),
    ] {
        chart
            .draw_series(pts.into_iter().map(|(x, y)| {
                Rectangle::new([(x + dx, 0.0), (x + dx + 0.36, y)], color.mix(0.8).filled())
            }))
            .map_err(|e| anyhow!("{e}"))?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    chart
        .draw_series(LineSeries::new(
            [(0.0, sync_rate), (n, sync_rate)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| anyhow!("{e}"))?
        .label("raw fdatasync/s (one batch per sync)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))
}

/// "roost, bulk files of 1,000" -> "bulk files of 1,000".
fn short(name: &str) -> String {
    name.trim_start_matches("roost, ").to_owned()
}

/// The intake's name under the middle of its pair of bars, nothing elsewhere.
fn label(names: &[String], x: f64) -> String {
    let i = x.floor();
    if (x - i - 0.5).abs() > 0.01 || i < 0.0 {
        return String::new();
    }
    names.get(i as usize).cloned().unwrap_or_default()
}
