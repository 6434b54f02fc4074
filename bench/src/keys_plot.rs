//! The figures of `roost-bench --keys` (`keys.rs`): one [`Row`] per milestone, its CSV line,
//! the table printed with each figure beside issue 25's goal, and `docs/keys-window.svg`
//! (four panels against live keys: RSS, restart, duplicate latency, bulk throughput, each
//! with its goal as a line).

use std::path::Path;

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Issue 25's goals.
pub const GOAL_RSS_MIB: f64 = 512.0;
pub const GOAL_RESTART_MS: f64 = 1000.0;
pub const GOAL_DUP_P99_MS: f64 = 2.0;
pub const GOAL_RATE_RATIO: f64 = 0.8;

/// What one milestone measured.
#[derive(Clone, Debug)]
pub struct Row {
    /// Keys sent (every line a new key), all answered.
    pub keys: u64,
    /// `live_keys` of `roost status --json`.
    pub live_keys: u64,
    /// The running daemon's VmRSS and RssAnon, KiB.
    pub rss_kib: u64,
    pub rss_anon_kib: u64,
    /// VmRSS and RssAnon of the daemon right after the graceful restart.
    pub fresh_rss_kib: u64,
    pub fresh_rss_anon_kib: u64,
    /// Bulk batches/s over the last files before the milestone.
    pub rate: f64,
    /// Bulk batches/s of the first stretch (the window nearly empty).
    pub baseline: f64,
    pub dup_p50_ms: f64,
    pub dup_p99_ms: f64,
    /// Whether the page cache was dropped before the duplicates.
    pub cold: bool,
    pub kill_restart_ms: f64,
    /// WAL records the restart after kill -9 replayed.
    pub replayed: u64,
    /// The graceful stop's time (it checkpoints).
    pub stop_ms: f64,
    pub graceful_restart_ms: f64,
    /// Blocks the data directory holds, bytes.
    pub disk_bytes: u64,
    /// `disk_bytes.keys` of `roost status --json`: the request-key table.
    pub keys_bytes: u64,
    pub secs: f64,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

impl Row {
    pub const CSV_HEADER: &'static str = "keys,live_keys,rss_kib,rss_anon_kib,fresh_rss_kib,fresh_rss_anon_kib,bulk_batches_per_s,empty_window_batches_per_s,dup_p50_ms,dup_p99_ms,dup_cold,kill9_restart_ms,kill9_wal_records_replayed,graceful_stop_ms,graceful_restart_ms,disk_bytes,keys_bytes,elapsed_s";

    pub fn to_csv(&self) -> String {
        format!(
            "{},{},{},{},{},{},{:.0},{:.0},{:.3},{:.3},{},{:.1},{},{:.1},{:.1},{},{},{:.1}",
            self.keys,
            self.live_keys,
            self.rss_kib,
            self.rss_anon_kib,
            self.fresh_rss_kib,
            self.fresh_rss_anon_kib,
            self.rate,
            self.baseline,
            self.dup_p50_ms,
            self.dup_p99_ms,
            u8::from(self.cold),
            self.kill_restart_ms,
            self.replayed,
            self.stop_ms,
            self.graceful_restart_ms,
            self.disk_bytes,
            self.keys_bytes,
            self.secs
        )
    }

    /// A row from its CSV line (as [`Row::to_csv`] wrote it).
    pub fn from_csv(line: &str) -> anyhow::Result<Row> {
        let f: Vec<&str> = line.trim().split(',').collect();
        if f.len() != 18 {
            return Err(anyhow!("{} fields, not 18: {line}", f.len()));
        }
        let u = |i: usize| -> anyhow::Result<u64> {
            f[i].parse()
                .map_err(|e| anyhow!("field {i} {:?}: {e}", f[i]))
        };
        let x = |i: usize| -> anyhow::Result<f64> {
            f[i].parse()
                .map_err(|e| anyhow!("field {i} {:?}: {e}", f[i]))
        };
        Ok(Row {
            keys: u(0)?,
            live_keys: u(1)?,
            rss_kib: u(2)?,
            rss_anon_kib: u(3)?,
            fresh_rss_kib: u(4)?,
            fresh_rss_anon_kib: u(5)?,
            rate: x(6)?,
            baseline: x(7)?,
            dup_p50_ms: x(8)?,
            dup_p99_ms: x(9)?,
            cold: u(10)? == 1,
            kill_restart_ms: x(11)?,
            replayed: u(12)?,
            stop_ms: x(13)?,
            graceful_restart_ms: x(14)?,
            disk_bytes: u(15)?,
            keys_bytes: u(16)?,
            secs: x(17)?,
        })
    }

    pub fn summary(&self) -> String {
        format!(
            "{} keys ({} live): RSS {:.0} MiB, {:.0} batches/s, restart {:.0} ms after kill -9 ({} replayed) / {:.0} ms after a graceful stop ({:.0} ms), duplicates p50 {:.2} / p99 {:.2} ms{}, disk {:.0} MiB, {:.0} s",
            self.keys,
            self.live_keys,
            mib(self.rss_kib),
            self.rate,
            self.kill_restart_ms,
            self.replayed,
            self.graceful_restart_ms,
            self.stop_ms,
            self.dup_p50_ms,
            self.dup_p99_ms,
            if self.cold { " (cold)" } else { " (warm)" },
            self.disk_bytes as f64 / 1048576.0,
            self.secs
        )
    }
}

/// The table, one row per milestone, then the last milestone's figures beside the goals.
pub fn print_table(rows: &[Row]) {
    println!("\n| live keys | RSS MiB (anon) | RSS after restart MiB (anon) | bulk batches/s | / empty window | duplicate p50 / p99 ms | restart ms, kill -9 / graceful | graceful stop ms | WAL records replayed | disk MiB | key table MiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {:.0} ({:.0}) | {:.0} ({:.0}) | {:.0} | {:.2} | {:.2} / {:.2}{} | {:.0} / {:.0} | {:.0} | {} | {:.0} | {:.0} |",
            r.live_keys,
            mib(r.rss_kib),
            mib(r.rss_anon_kib),
            mib(r.fresh_rss_kib),
            mib(r.fresh_rss_anon_kib),
            r.rate,
            r.rate / r.baseline,
            r.dup_p50_ms,
            r.dup_p99_ms,
            if r.cold { "" } else { " (warm)" },
            r.kill_restart_ms,
            r.graceful_restart_ms,
            r.stop_ms,
            r.replayed,
            r.disk_bytes as f64 / 1048576.0,
            r.keys_bytes as f64 / 1048576.0,
        );
    }
    let Some(r) = rows.last() else {
        return;
    };
    let per_key = r.rss_kib as f64 * 1024.0 / r.live_keys.max(1) as f64;
    println!(
        "\nat {} live keys (issue 25's goals are at 100M):",
        r.live_keys
    );
    println!(
        "  RSS {:.0} MiB ({per_key:.1} B per live key); goal <= {GOAL_RSS_MIB:.0} MiB",
        mib(r.rss_kib)
    );
    println!(
        "  restart {:.0} ms after kill -9, {:.0} ms after a graceful stop; goal <= {GOAL_RESTART_MS:.0} ms",
        r.kill_restart_ms, r.graceful_restart_ms
    );
    println!(
        "  duplicate answer p99 {:.2} ms ({}); goal <= {GOAL_DUP_P99_MS} ms",
        r.dup_p99_ms,
        if r.cold {
            "page cache dropped"
        } else {
            "warm: the page cache could not be dropped"
        }
    );
    println!(
        "  bulk {:.0} batches/s = {:.2} of the empty window's {:.0}; goal >= {GOAL_RATE_RATIO}",
        r.rate,
        r.rate / r.baseline,
        r.baseline
    );
}

type Series<'a> = (&'a str, &'a dyn Fn(&Row) -> f64, RGBColor);

/// Four panels against live keys (log scale), each with its goal as a dashed line.
/// `roost-bench --keys-plot CSV`: the table and the plot (beside the CSV) of rows already
/// measured, e.g. after a row measured by hand was added.
pub fn replot(csv: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(csv).map_err(|e| anyhow!("{}: {e}", csv.display()))?;
    let rows = text
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(Row::from_csv)
        .collect::<anyhow::Result<Vec<Row>>>()?;
    print_table(&rows);
    plot(&csv.with_extension("svg"), &rows)
}

pub fn plot(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let panels = root.split_evenly((2, 2));
    let rss = |r: &Row| mib(r.rss_kib);
    let fresh = |r: &Row| mib(r.fresh_rss_kib);
    let kill = |r: &Row| r.kill_restart_ms;
    let graceful = |r: &Row| r.graceful_restart_ms;
    let p50 = |r: &Row| r.dup_p50_ms;
    let p99 = |r: &Row| r.dup_p99_ms;
    let rate = |r: &Row| r.rate;
    let base = rows.first().map_or(f64::NAN, |r| r.baseline) * GOAL_RATE_RATIO;
    let specs: [(&str, f64, Vec<Series<'_>>); 4] = [
        (
            "daemon RSS, MiB",
            GOAL_RSS_MIB,
            vec![("running", &rss, BLUE), ("after restart", &fresh, RED)],
        ),
        (
            "restart to status, ms",
            GOAL_RESTART_MS,
            vec![
                ("after kill -9", &kill, BLUE),
                ("after SIGTERM", &graceful, RED),
            ],
        ),
        (
            "duplicate answer, cold cache, ms",
            GOAL_DUP_P99_MS,
            vec![("p50", &p50, BLUE), ("p99", &p99, RED)],
        ),
        (
            "bulk batches/s (goal: 0.8 of the empty window)",
            base,
            vec![("batches/s", &rate, BLUE)],
        ),
    ];
    for (area, (title, goal, series)) in panels.iter().zip(specs) {
        panel(area, title, goal, rows, &series)?;
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    goal: f64,
    rows: &[Row],
    series: &[Series<'_>],
) -> anyhow::Result<()> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    let x = |r: &Row| r.live_keys.max(1) as f64;
    let xmin = rows.iter().map(x).fold(f64::INFINITY, f64::min).min(1e6);
    let xmax = rows.iter().map(x).fold(1.0, f64::max).max(xmin * 10.0);
    let ymax = rows
        .iter()
        .flat_map(|r| series.iter().map(move |s| (s.1)(r)))
        .filter(|v| v.is_finite())
        .fold(if goal.is_finite() { goal } else { 1.0 }, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d((xmin / 1.5..xmax * 1.5).log_scale(), 0f64..ymax)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("live keys")
        .x_label_formatter(&|v| {
            if *v >= 1e6 {
                format!("{:.0}M", v / 1e6)
            } else {
                format!("{:.0}k", v / 1e3)
            }
        })
        .draw()
        .map_err(e)?;
    for (name, f, color) in series {
        let pts: Vec<(f64, f64)> = rows.iter().map(|r| (x(r), f(r))).collect();
        let color = *color;
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(e)?;
    }
    if goal.is_finite() {
        let line = [(xmin / 1.5, goal), (xmax * 1.5, goal)];
        chart
            .draw_series(DashedLineSeries::new(line, 6, 4, BLACK.stroke_width(1)))
            .map_err(e)?
            .label("goal")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
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
