//! `cargo run --release -p roost-bench` with no option: roost end to end through the spool,
//! beside a SQLite spool consumer at the same durability and the raw disk, in one run (see
//! the crate's comment). Each part measures one thing and hands its figures to the table.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use roost_benchkit::{raw_bandwidth, raw_fdatasync, SyncFile};

use crate::ceiling::{fmt_rates, median};
use crate::spool::{self, burst, closed_loop, open_loop, Workload};
use crate::{bench_dir, peer, Roost};

/// Sizes; `quick` for the CI smoke run.
struct Sizes {
    burst: usize,
    clients: Vec<usize>,
    cell: Duration,
    restart_records: u64,
}

fn sizes() -> Sizes {
    if std::env::var_os("ROOST_BENCH_QUICK").is_some() {
        Sizes {
            burst: 200,
            clients: vec![1, 4],
            cell: Duration::from_millis(300),
            restart_records: 20_000,
        }
    } else {
        Sizes {
            burst: 10_000,
            clients: vec![1, 4, 16, 64],
            cell: Duration::from_secs(3),
            restart_records: 1_000_000,
        }
    }
}

/// Closed-loop cells per system and client count (the median is reported).
const REPS: usize = 3;

const SMALL: Workload = Workload {
    ops: 10,
    record_bytes: 100,
};
const LARGE: Workload = Workload {
    ops: 10,
    record_bytes: 4096,
};

/// The raw disk: fdatasyncs per second (1.2 KB appends) and sequential MB/s.
struct Raw {
    sync_rate: f64,
    bandwidth: f64,
}

/// The bursts: batches per second, and roost's batches per WAL fdatasync.
struct Bursts {
    roost: f64,
    per_sync: f64,
    peer: f64,
}

/// The closed-loop cells: (clients, median rate) per system, and roost's batches per WAL
/// fdatasync at the most clients.
struct Cells {
    roost: Vec<(usize, f64)>,
    peer: Vec<(usize, f64)>,
    per_sync_most: f64,
}

/// Latency at half the closed-loop peak: (rate, p50 s, p99 s).
type Latency = (f64, f64, f64);

/// Large records into the WAL: files in the burst, clients, and MB/s in each.
struct Large {
    files: usize,
    clients: usize,
    burst_mb: f64,
    mb: f64,
}

/// Restart: ms to ready, records, KiB of anonymous memory.
type Restart = (f64, f64, f64);

pub fn run() -> anyhow::Result<()> {
    let sz = sizes();
    let base = bench_dir();
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    println!(
        "roost end-to-end benchmark in {} (batches of {} creates of ~{} B)",
        base.display(),
        SMALL.ops,
        SMALL.record_bytes
    );
    let raw = raw_disk(&base, &sz)?;
    let (roost_dir, peer_dir) = (base.join("roost"), base.join("sqlite"));
    let bursts = bursts(&roost_dir, &peer_dir, &sz)?;
    let cells = cells(&roost_dir, &peer_dir, &sz)?;
    let latency = half_peak_latency(&roost_dir, &cells, &sz)?;
    let large = large_records(&base.join("roost-large"), &raw, &sz)?;
    let restart = restart(&base.join("restart"), &sz)?;
    print_table(&sz, &raw, &bursts, &cells, latency, &large, restart);
    let svg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/bench-throughput.svg");
    if std::env::var_os("ROOST_BENCH_QUICK").is_none() {
        plot(&svg, &cells.roost, &cells.peer, raw.sync_rate)?;
        println!("\nplot: {}", svg.display());
    }
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}

fn raw_disk(base: &Path, sz: &Sizes) -> anyhow::Result<Raw> {
    let sync_rate = raw_fdatasync(
        &base.join("raw-sync"),
        1200,
        Duration::from_secs(2),
        SyncFile::Append,
    )?
    .ops_per_sec;
    let bw_bytes = if sz.burst < 1000 { 32 << 20 } else { 256 << 20 };
    let bandwidth = raw_bandwidth(&base.join("raw-bw"), bw_bytes)?;
    println!(
        "raw disk: {sync_rate:.0} fdatasync/s (1.2 KB writes), {bandwidth:.0} MB/s sequential"
    );
    Ok(Raw {
        sync_rate,
        bandwidth,
    })
}

/// A burst per system. After its burst each system gets one second of a single client, not
/// counted: SQLite's first commit after a burst checkpoints the WAL the burst left behind
/// (seconds), which would otherwise land in the 1-client cell.
fn bursts(roost_dir: &Path, peer_dir: &Path, sz: &Sizes) -> anyhow::Result<Bursts> {
    let warm = Duration::from_secs(1).min(sz.cell);
    let r = Roost::start(roost_dir)?;
    let s0 = r.engine.figures().wal_syncs;
    let c0 = r.engine.stats.committed.load(Ordering::Relaxed);
    let roost = burst(&r.spool, sz.burst, &SMALL)?;
    let s1 = r.engine.figures().wal_syncs;
    let c1 = r.engine.stats.committed.load(Ordering::Relaxed);
    let per_sync = (c1 - c0) as f64 / (s1 - s0).max(1) as f64;
    println!("roost burst: {roost:.0} batches/s, {per_sync:.1} batches per WAL fdatasync");
    closed_loop(&r.spool, 1, warm, &SMALL)?;
    drop(r);
    let p = peer::Peer::start(peer_dir)?;
    let peer = burst(&p.spool, sz.burst, &SMALL)?;
    println!("sqlite burst: {peer:.0} batches/s");
    closed_loop(&p.spool, 1, warm, &SMALL)?;
    drop(p);
    Ok(Bursts {
        roost,
        per_sync,
        peer,
    })
}

/// Roost's and the peer's closed-loop cells, taking turns (each restarted on its own
/// directory for its cell): the machine's speed drifts, so cells of the same client count
/// are measured next to each other.
fn cells(roost_dir: &Path, peer_dir: &Path, sz: &Sizes) -> anyhow::Result<Cells> {
    let mut cells = Cells {
        roost: Vec::new(),
        peer: Vec::new(),
        per_sync_most: 0.0,
    };
    for &c in &sz.clients {
        // REPS cells per system, alternating which goes first; the median of each is kept.
        let (mut rr, mut pr) = (Vec::new(), Vec::new());
        let mut counts = RoostCounts::default();
        for rep in 0..REPS {
            for system in [rep % 2, 1 - rep % 2] {
                if system == 0 {
                    rr.push(roost_cell(roost_dir, c, sz, &mut counts)?);
                } else {
                    let p = peer::Peer::start(peer_dir)?;
                    pr.push(closed_loop(&p.spool, c, sz.cell, &SMALL)?.0);
                }
            }
        }
        let (rate, prate) = (median(&rr), median(&pr));
        let per_sync = counts.batches as f64 / counts.syncs.max(1) as f64;
        let per_round = counts.published as f64 / counts.rounds.max(1) as f64;
        println!("roost  {c:>2} clients: {rate:.0} batches/s (cells {}), {per_sync:.1} batches per WAL fdatasync, {per_round:.1} results per out/ round", fmt_rates(&rr));
        println!(
            "sqlite {c:>2} clients: {prate:.0} batches/s (cells {})",
            fmt_rates(&pr)
        );
        cells.per_sync_most = per_sync;
        cells.roost.push((c, rate));
        cells.peer.push((c, prate));
    }
    Ok(cells)
}

/// Roost's counters summed over its cells of one client count.
#[derive(Default)]
struct RoostCounts {
    batches: u64,
    syncs: u64,
    rounds: u64,
    published: u64,
}

/// One closed-loop cell of roost, started afresh on `dir`: its rate; its counters added.
fn roost_cell(dir: &Path, c: usize, sz: &Sizes, counts: &mut RoostCounts) -> anyhow::Result<f64> {
    let r = Roost::start(dir)?;
    let s0 = r.engine.figures().wal_syncs;
    let c0 = r.engine.stats.committed.load(Ordering::Relaxed);
    let (rate, _) = closed_loop(&r.spool, c, sz.cell, &SMALL)?;
    let s1 = r.engine.figures().wal_syncs;
    let c1 = r.engine.stats.committed.load(Ordering::Relaxed);
    let f = r.engine.figures();
    let (ro, pu) = (f.result_rounds, f.results_published);
    drop(r);
    counts.batches += c1 - c0;
    counts.syncs += s1 - s0;
    counts.rounds += ro;
    counts.published += pu;
    Ok(rate)
}

/// Half of the sustained (closed-loop) peak: the burst rate is not sustainable with clients
/// competing for the same cores and journal, and an overloaded open loop measures queueing.
fn half_peak_latency(roost_dir: &Path, cells: &Cells, sz: &Sizes) -> anyhow::Result<Latency> {
    let peak = cells.roost.iter().map(|x| x.1).fold(0.0, f64::max);
    let r = Roost::start(roost_dir)?;
    let (p50, p99) = open_loop(&r.spool, peak / 2.0, sz.cell, &SMALL)?;
    drop(r);
    println!(
        "roost latency at {:.0} batches/s (half of the closed-loop peak): p50 {:.2} ms, p99 {:.2} ms",
        peak / 2.0,
        p50 * 1e3,
        p99 * 1e3
    );
    Ok((peak / 2.0, p50, p99))
}

/// Large records: WAL bytes per second measured from the WAL's own append counter (bytes the
/// claims took), in a burst (the pipeline's capacity) and with closed-loop clients.
fn large_records(dir: &Path, raw: &Raw, sz: &Sizes) -> anyhow::Result<Large> {
    let r = Roost::start(dir)?;
    let clients = *sz.clients.last().unwrap_or(&1);
    let wal_bytes = |r: &Roost| r.engine.wal().append_bytes();
    let files = sz.burst / 4;
    let b0 = wal_bytes(&r);
    let burst_rate = burst(&r.spool, files, &LARGE)?;
    // Over the burst's own interval (first rename to last result), as its rate is.
    let burst_secs = files as f64 / burst_rate;
    let burst_mb = (wal_bytes(&r) - b0) as f64 / burst_secs / 1e6;
    let b0 = wal_bytes(&r);
    let t = Instant::now();
    let (rate, _) = closed_loop(&r.spool, clients, sz.cell, &LARGE)?;
    let mb = (wal_bytes(&r) - b0) as f64 / t.elapsed().as_secs_f64() / 1e6;
    drop(r);
    println!("roost large records ({} x {} B): burst of {files} files {burst_rate:.0} batches/s = {burst_mb:.1} MB/s into the WAL ({:.0}% of sequential bandwidth); {clients} clients {rate:.0} batches/s = {mb:.1} MB/s ({:.0}%)", LARGE.ops, LARGE.record_bytes, 100.0 * burst_mb / raw.bandwidth, 100.0 * mb / raw.bandwidth);
    Ok(Large {
        files,
        clients,
        burst_mb,
        mb,
    })
}

/// Records over 8 shards, then the time to ready and the index's memory in a fresh process
/// (`--restart-probe`).
fn restart(dir: &Path, sz: &Sizes) -> anyhow::Result<Restart> {
    spool::populate(dir, sz.restart_records, 8)?;
    let out = std::process::Command::new(std::env::current_exe()?)
        .arg("--restart-probe")
        .arg(dir)
        .output()?;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let v: Vec<f64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let (ready_ms, recs, kib) = (
        v.first().copied().unwrap_or(f64::NAN),
        v.get(1).copied().unwrap_or(0.0),
        v.get(2).copied().unwrap_or(0.0),
    );
    println!("restart: {recs:.0} records over 8 shards ready in {ready_ms:.0} ms; {:.1} bytes of memory per record", kib * 1024.0 / recs.max(1.0));
    Ok((ready_ms, recs, kib))
}

fn print_table(
    sz: &Sizes,
    raw: &Raw,
    b: &Bursts,
    cells: &Cells,
    (half_peak, p50, p99): Latency,
    large: &Large,
    (ready_ms, recs, kib): Restart,
) {
    let (sync_rate, bandwidth) = (raw.sync_rate, raw.bandwidth);
    println!();
    println!("| measure | roost | SQLite peer | raw disk | ratio |");
    println!("|---|---|---|---|---|");
    println!("| burst of {} files, batches/s | {:.0} | {:.0} | {sync_rate:.0} fdatasync/s | roost/peer {:.1}x |", sz.burst, b.roost, b.peer, b.roost / b.peer);
    for ((c, a), (_, p)) in cells.roost.iter().zip(&cells.peer) {
        println!("| {c} closed-loop clients, batches/s | {a:.0} | {p:.0} | {sync_rate:.0} fdatasync/s | roost/peer {:.1}x |", a / p);
    }
    println!(
        "| batches per WAL fdatasync, {} clients | {:.1} | | | |",
        large.clients, cells.per_sync_most
    );
    println!(
        "| batches per WAL fdatasync, burst | {:.1} | | | |",
        b.per_sync
    );
    println!("| WAL MB/s, 10 x 4 KiB records, burst of {} files | {:.1} | | {bandwidth:.0} MB/s sequential | {:.2} of bandwidth |", large.files, large.burst_mb, large.burst_mb / bandwidth);
    println!("| WAL MB/s, 10 x 4 KiB records, {} clients | {:.1} | | {bandwidth:.0} MB/s sequential | {:.2} of bandwidth |", large.clients, large.mb, large.mb / bandwidth);
    println!(
        "| latency p50 / p99 at {half_peak:.0} batches/s (half the closed-loop peak), ms | {:.2} / {:.2} | | | |",
        p50 * 1e3,
        p99 * 1e3
    );
    println!("| restart to ready, {recs:.0} records / 8 shards, ms | {ready_ms:.0} | | | |");
    println!(
        "| index memory, bytes per record | {:.1} | | | |",
        kib * 1024.0 / recs.max(1.0)
    );
}

fn plot(
    path: &Path,
    roost: &[(usize, f64)],
    peer: &[(usize, f64)],
    sync_rate: f64,
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ymax = roost
        .iter()
        .chain(peer)
        .map(|x| x.1)
        .fold(sync_rate, f64::max)
        * 1.15;
    let xmax = roost.iter().map(|x| x.0).max().unwrap_or(64) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "batches/s against closed-loop clients (10 creates of 100 B each)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d((1f64..xmax * 1.1).log_scale(), 0f64..ymax)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("clients")
        .y_desc("batches/s")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let series = [("roost", roost, BLUE), ("SQLite peer", peer, RED)];
    for (name, pts, color) in series {
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|(c, r)| (*c as f64, *r)),
                color.stroke_width(2),
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        chart
            .draw_series(
                pts.iter()
                    .map(|(c, r)| Circle::new((*c as f64, *r), 3, color.filled())),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .draw_series(LineSeries::new(
            [(1.0, sync_rate), (xmax * 1.1, sync_rate)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .label("fdatasync bound (one batch per sync)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
