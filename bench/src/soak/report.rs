//! The soak's samples (`Row`) and how they are shown: the CSV, the table and the plot.

use std::path::Path;

use anyhow::{anyhow, ensure, Context};

/// One sample of a run.
#[derive(Clone, Debug, Default)]
pub(super) struct Row {
    pub(super) batches: u64,
    /// `Engine::disk_bytes`: wal, audit, keys, shards, checkpoint.
    pub(super) parts: [u64; 5],
    /// Blocks the data directory holds (`st_blocks`), spool included.
    pub(super) allocated: u64,
    /// Anonymous RSS of the run's process right after the reopen (it has opened and dropped
    /// an engine at every earlier sample, so the allocator's leftovers count too).
    pub(super) rss_kib: u64,
    /// Anonymous RSS of a fresh process right after it opened the same directory.
    pub(super) fresh_rss_kib: u64,
    pub(super) live_keys: u64,
    pub(super) restart_ms: f64,
    pub(super) replayed: u64,
    pub(super) checkpoints: u64,
    pub(super) reclaimed: u64,
    pub(super) duplicates: u64,
    pub(super) secs: f64,
}

pub(super) const PARTS: [&str; 5] = ["wal", "audit", "keys", "shards", "checkpoint"];
pub(super) const CSV_HEADER: &str = "run,batches,wal_bytes,audit_bytes,keys_bytes,shards_bytes,checkpoint_bytes,allocated_bytes,rss_anon_kib,fresh_rss_anon_kib,live_keys,restart_ms,wal_records_replayed,checkpoints,compaction_reclaimed_bytes,duplicates_checked,elapsed_s";

impl Row {
    pub(super) fn total(&self) -> u64 {
        self.parts.iter().sum()
    }

    pub(super) fn to_csv(&self, run: &str) -> String {
        let p = &self.parts;
        format!(
            "{run},{},{},{},{},{},{},{},{},{},{},{:.1},{},{},{},{},{:.1}",
            self.batches,
            p[0],
            p[1],
            p[2],
            p[3],
            p[4],
            self.allocated,
            self.rss_kib,
            self.fresh_rss_kib,
            self.live_keys,
            self.restart_ms,
            self.replayed,
            self.checkpoints,
            self.reclaimed,
            self.duplicates,
            self.secs
        )
    }

    pub(super) fn from_csv(line: &str) -> anyhow::Result<Row> {
        let f: Vec<&str> = line.split(',').collect();
        ensure!(f.len() == 17, "a soak row has 17 fields: {line:?}");
        let u = |i: usize| -> anyhow::Result<u64> {
            f[i].parse()
                .with_context(|| format!("field {i} of {line:?}"))
        };
        let x = |i: usize| -> anyhow::Result<f64> {
            f[i].parse()
                .with_context(|| format!("field {i} of {line:?}"))
        };
        Ok(Row {
            batches: u(1)?,
            parts: [u(2)?, u(3)?, u(4)?, u(5)?, u(6)?],
            allocated: u(7)?,
            rss_kib: u(8)?,
            fresh_rss_kib: u(9)?,
            live_keys: u(10)?,
            restart_ms: x(11)?,
            replayed: u(12)?,
            checkpoints: u(13)?,
            reclaimed: u(14)?,
            duplicates: u(15)?,
            secs: x(16)?,
        })
    }
}

pub(super) fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / 1048576.0)
}

/// One markdown table, a row per sample of the first run, each cell the runs' figures at
/// those batches ("with retention / without"; "-" where a run has no such sample).
pub(super) fn print_table(runs: &[(String, Vec<Row>)]) {
    let Some((_, first)) = runs.first() else {
        return;
    };
    let names: Vec<&str> = runs.iter().map(|(n, _)| n.as_str()).collect();
    println!("\ncells: {} (MiB unless named)\n", names.join(" / "));
    println!("| batches | disk total | wal | audit | keys | shards | checkpoint KiB | allocated | RSS | RSS fresh | live keys | restart ms | records replayed |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for x in first {
        let at: Vec<Option<&Row>> = runs
            .iter()
            .map(|(_, rows)| rows.iter().find(|r| r.batches == x.batches))
            .collect();
        let pair = |f: &dyn Fn(&Row) -> String| {
            let cells: Vec<String> = at.iter().map(|r| r.map_or("-".into(), f)).collect();
            cells.join(" / ")
        };
        let part = |i: usize| pair(&|r: &Row| mib(r.parts[i]));
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            x.batches,
            pair(&|r: &Row| mib(r.total())),
            part(0),
            part(1),
            part(2),
            part(3),
            pair(&|r: &Row| format!("{:.1}", r.parts[4] as f64 / 1024.0)),
            pair(&|r: &Row| mib(r.allocated)),
            pair(&|r: &Row| format!("{:.0}", r.rss_kib as f64 / 1024.0)),
            pair(&|r: &Row| format!("{:.0}", r.fresh_rss_kib as f64 / 1024.0)),
            pair(&|r: &Row| r.live_keys.to_string()),
            pair(&|r: &Row| format!("{:.0}", r.restart_ms)),
            pair(&|r: &Row| r.replayed.to_string()),
        );
    }
    for (name, rows) in runs {
        if let Some(last) = rows.last() {
            println!(
                "{name}: {} checkpoints, {} MiB reclaimed by compaction, {} duplicate answers checked, {:.0} s of soak",
                last.checkpoints,
                mib(last.reclaimed),
                last.duplicates,
                last.secs
            );
        }
    }
}

pub(crate) fn append_line(path: &Path, line: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    writeln!(f, "{line}").with_context(|| format!("append to {}", path.display()))
}

/// `--soak-report CSV`: the table of a soak CSV (its runs in the order they first appear)
/// and its plot, written beside it (`.svg`).
pub fn soak_report(csv: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(csv).with_context(|| format!("read {}", csv.display()))?;
    let mut runs: Vec<(String, Vec<Row>)> = Vec::new();
    for line in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let row = Row::from_csv(line)?;
        let name = line.split(',').next().unwrap_or_default();
        match runs.iter_mut().find(|(n, _)| n == name) {
            Some((_, rows)) => rows.push(row),
            None => runs.push((name.to_owned(), vec![row])),
        }
    }
    print_table(&runs);
    let svg = csv.with_extension("svg");
    plot(&svg, &runs)?;
    println!("\nplot: {}", svg.display());
    Ok(())
}

/// Two panels against batches: disk bytes (total, and the WAL alone) and restart time.
pub(super) fn plot(path: &Path, runs: &[(String, Vec<Row>)]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let (left, right) = root.split_horizontally(450);
    let xmax = runs
        .iter()
        .flat_map(|(_, r)| r.iter().map(|r| r.batches))
        .max()
        .unwrap_or(1) as f64;
    let disk = |r: &Row| r.total() as f64 / 1048576.0;
    let wal = |r: &Row| r.parts[0] as f64 / 1048576.0;
    let restart = |r: &Row| r.restart_ms;
    panel(
        &left,
        "disk MiB (solid: all parts, dashed: WAL)",
        xmax,
        runs,
        &[&disk, &wal],
    )?;
    panel(
        &right,
        "restart ms (no final checkpoint)",
        xmax,
        runs,
        &[&restart],
    )?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

type Measure<'a> = &'a dyn Fn(&Row) -> f64;

fn panel<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    xmax: f64,
    runs: &[(String, Vec<Row>)],
    measures: &[Measure<'_>],
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    let ymax = runs
        .iter()
        .flat_map(|(_, rows)| rows.iter())
        .flat_map(|r| measures.iter().map(move |m| m(r)))
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..xmax.max(1.0), 0f64..ymax)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("batches")
        .x_label_formatter(&|x| {
            if xmax >= 5e6 {
                format!("{:.0}M", x / 1e6)
            } else {
                format!("{:.0}k", x / 1e3)
            }
        })
        .draw()
        .map_err(e)?;
    for ((name, rows), color) in runs.iter().zip([BLUE, RED]) {
        for (k, m) in measures.iter().enumerate() {
            let pts: Vec<(f64, f64)> = rows.iter().map(|r| (r.batches as f64, m(r))).collect();
            let style = color.stroke_width(if k == 0 { 2 } else { 1 });
            let series = if k == 0 {
                chart.draw_series(LineSeries::new(pts, style)).map_err(e)?
            } else {
                chart
                    .draw_series(DashedLineSeries::new(pts, 6, 4, style))
                    .map_err(e)?
            };
            if k == 0 {
                series
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    Ok(())
}
