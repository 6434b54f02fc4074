//! `cargo run --release -p roost-bench`: roost end to end through the spool, side by side in
//! one run with what a user would pick instead (a SQLite spool consumer at the same
//! durability) and with the raw disk (an fdatasync loop and sequential bandwidth). Prints one
//! table and writes `docs/bench-throughput.svg` (throughput against client count).
//!
//! `ROOST_BENCH_QUICK=1` shrinks every size (a smoke run for CI); `ROOST_BENCH_SYNCFS=1` runs
//! roost with `result_sync = "syncfs"`; `ROOST_BENCH_DIR` puts the
//! files elsewhere (default `target/bench-e2e`). No timing here is asserted anywhere.
//!
//! `roost-bench --soak` is the soak benchmark of issue 14 instead (`soak.rs`): retention
//! against no retention over a long steady state of creates and deletes; `--replication` is
//! issue 15's (`replication.rs`): `ack = "local"` against `ack = "standby"` on real `roost
//! serve` processes on loopback; `--keys` is issue 25's (`keys.rs`): a real `roost serve`
//! fed bulk files until its request-key window holds 100M live keys, with its memory,
//! restart times, duplicate latency and throughput at milestones on the way.
#![forbid(unsafe_code)]

mod ceiling;
mod cluster;
mod compaction;
mod intake;
mod intake_plot;
mod keys;
mod keys_plot;
mod loopfs;
mod null;
mod peer;
mod profile;
mod replication;
mod soak;
mod spool;
mod stream;
mod synccost;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use roost::config::Config;
use roost::pipeline::crash::NoCrash;
use roost::pipeline::{Engine, EngineOptions};
use roost_benchkit::{bench_base, raw_bandwidth, raw_fdatasync, rss_anon_kib, SyncFile};
use roost_storage::RealStorage;

/// The allocator the `roost` binary uses (daemon/src/main.rs): roost runs in this process,
/// and so does the SQLite peer, which gets it too.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use crate::spool::{burst, closed_loop, open_loop, Workload};

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

/// A daemon under test: `roost serve` in this process, stopped gracefully at drop.
pub struct Roost {
    pub engine: Arc<Engine>,
    pub spool: PathBuf,
    stop: Arc<tokio::sync::Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The engine on the real disk over `dir` (spool in `dir/spool`), with `cfg` pointed at `dir`.
pub fn open_engine(dir: &Path, cfg: Config) -> Result<Engine, roost::error::EngineError> {
    Engine::open(EngineOptions {
        storage: RealStorage::shared(),
        config: Arc::new(Config {
            data_dir: dir.to_path_buf(),
            ..cfg
        }),
        crash: Arc::new(NoCrash),
        log_role: std::sync::Arc::new(roost::replica::Opener),
    })
}

impl Roost {
    /// Roost with `result_sync = "syncfs"` if `ROOST_BENCH_SYNCFS` is set, else the default.
    fn start(dir: &Path) -> anyhow::Result<Roost> {
        let mode = if std::env::var_os("ROOST_BENCH_SYNCFS").is_some() {
            roost::config::ResultSync::Syncfs
        } else {
            roost::config::ResultSync::Fsync
        };
        Roost::start_with(dir, mode)
    }

    /// Default settings (64 batches in flight) but for how result files are made durable.
    pub(crate) fn start_with(
        dir: &Path,
        result_sync: roost::config::ResultSync,
    ) -> anyhow::Result<Roost> {
        let cfg = Config {
            batches_in_flight_max: 64,
            result_sync,
            ..Config::default()
        };
        let engine = Arc::new(open_engine(dir, cfg)?);
        let stop = Arc::new(tokio::sync::Notify::new());
        let (e, s) = (engine.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            if let Err(err) = roost::serve::serve_until(e, s) {
                eprintln!("roost serve failed: {err}");
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        Ok(Roost {
            engine,
            spool: dir.join("spool"),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Roost {
    fn drop(&mut self) {
        self.stop.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `roost-bench --restart-probe DIR`: open the engine (recovery) and report the time to ready
/// and the anonymous memory it holds, in a fresh process so nothing else is counted.
fn restart_probe(dir: &Path) -> anyhow::Result<()> {
    let before = rss_anon_kib();
    let t = Instant::now();
    let engine = open_engine(dir, Config::default())?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let records: usize = engine.shard_counts().values().sum();
    let after = rss_anon_kib();
    println!("{ms:.0} {records} {}", after.saturating_sub(before));
    Ok(())
}

/// `roost-bench --closed-loop [CLIENTS] [SECS] [BURST]`: one closed-loop cell against roost
/// (after a burst of BURST files, to look at a daemon that has had one; records of
/// `ROOST_BENCH_RECORD_BYTES`, default 100; `ROOST_BENCH_PEER=1` for the peer, `=durable-null` or `=durable-null-log` for those
/// consumers), with the
/// mean time per batch in each pipeline phase and the fsync counts: the probe for profiling
/// (`perf record`, `valgrind --tool=callgrind`) and for trying a change quickly.
fn closed_loop_probe(clients: usize, dur: Duration, burst_first: usize) -> anyhow::Result<()> {
    let base = bench_dir().join("probe");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    let w = Workload {
        ops: 10,
        record_bytes: std::env::var("ROOST_BENCH_RECORD_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100),
    };
    let peer = std::env::var("ROOST_BENCH_PEER").unwrap_or_default();
    let contract = match peer.as_str() {
        "durable-null" => Some(null::Contract::Durable),
        "durable-null-log" => Some(null::Contract::DurableLog),
        _ => None,
    };
    if let Some(contract) = contract {
        let n = null::NullConsumer::start(&base, ceiling::dnull_threads(), contract)?;
        let (rate, _) = closed_loop(&n.spool, clients, dur, &w)?;
        println!("{peer} {clients} clients: {rate:.0} batches/s");
        return Ok(());
    }
    if std::env::var_os("ROOST_BENCH_PEER").is_some() {
        let p = peer::Peer::start(&base)?;
        if burst_first > 0 {
            let rate = burst(&p.spool, burst_first, &w)?;
            println!("sqlite burst of {burst_first} first: {rate:.0} batches/s");
        }
        let (rate, lat) = closed_loop(&p.spool, clients, dur, &w)?;
        let max = lat.iter().max().copied().unwrap_or_default();
        println!("sqlite {clients} clients: {rate:.0} batches/s, slowest {max:?}");
        return Ok(());
    }
    let r = Roost::start(&base)?;
    if burst_first > 0 {
        let rate = burst(&r.spool, burst_first, &w)?;
        println!("burst of {burst_first} first: {rate:.0} batches/s");
    }
    let e = r.engine.clone();
    let phases = e.stats.latency.phases();
    let before: Vec<(u64, u64)> = phases
        .iter()
        .map(|(_, h)| (h.count(), h.sum_us()))
        .collect();
    // wal appends, wal syncs, shard txns, shard flushes, audit syncs, results, result rounds
    let counters = || {
        let ((a, s), (_, au), (ro, pu)) = (e.wal_stats(), e.audit_stats(), e.publish_stats());
        let (t, f) = (
            e.stats.shard_txns.load(Ordering::Relaxed),
            e.stats.shard_flushes.load(Ordering::Relaxed),
        );
        [a, s, t, f, au, pu, ro]
    };
    let c0 = counters();
    if let Some(rate) = std::env::var("ROOST_BENCH_OPEN_RATE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        // Open loop at a fixed rate: the client's p50/p99 next to the engine's own, by phase
        // (histogram bucket bounds), to see where a latency tail comes from.
        let (p50, p99) = open_loop(&r.spool, rate, dur, &w)?;
        println!(
            "open loop at {rate:.0}/s: client p50 {:.2} ms, p99 {:.2} ms",
            p50 * 1e3,
            p99 * 1e3
        );
        for (name, h) in &phases {
            let q = |x: f64| h.quantile_us(x).map_or(f64::NAN, |u| u as f64 / 1e3);
            println!(
                "  {name:<7} p50 <= {:>8.2} ms, p99 <= {:>8.2} ms (since start)",
                q(0.5),
                q(0.99)
            );
        }
        drop(r);
        let _ = std::fs::remove_dir_all(&base);
        return Ok(());
    }
    let (rate, _) = closed_loop(&r.spool, clients, dur, &w)?;
    let d: Vec<u64> = counters().iter().zip(c0).map(|(b, a)| b - a).collect();
    println!("{clients} clients: {rate:.0} batches/s; wal {} appends / {} syncs; shards {} txns / {} flushes; audit {} syncs; results {} in {} rounds", d[0], d[1], d[2], d[3], d[4], d[5], d[6]);
    for ((name, h), (c0, u0)) in phases.iter().zip(before) {
        let n = (h.count() - c0).max(1);
        println!(
            "  {name:<7} mean {:>8.2} ms",
            (h.sum_us() - u0) as f64 / n as f64 / 1e3
        );
    }
    drop(r);
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}

/// Closed-loop cells per system and client count (the median is reported).
const REPS: usize = 3;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn fmt_rates(v: &[f64]) -> String {
    v.iter()
        .map(|r| format!("{r:.0}"))
        .collect::<Vec<_>>()
        .join("/")
}

fn bench_dir() -> PathBuf {
    bench_base("target/bench-e2e")
}

fn main() -> anyhow::Result<()> {
    // As the `roost` binary does: roost runs in this process.
    roost::no_transparent_huge_pages();
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--restart-probe") => {
            return restart_probe(Path::new(args.get(2).context("--restart-probe DIR")?))
        }
        Some("--populate") => {
            // `--populate DIR RECORDS`: fill DIR for `--restart-probe DIR` (profiling restart).
            let dir = Path::new(args.get(2).context("--populate DIR RECORDS")?);
            let n = args
                .get(3)
                .and_then(|s| s.parse().ok())
                .unwrap_or(1_000_000);
            return spool::populate(dir, n, 8);
        }
        Some("--compaction-latency") => return compaction::run(),
        Some("--ceiling") => return ceiling::run(),
        Some("--ceiling-profile") => return profile::run(&args[2..]),
        Some("--soak") => return soak::soak(),
        Some("--replication") => return replication::run(),
        Some("--cluster") => return cluster::run(),
        Some("--intake") => return intake::run(),
        Some("--keys") => return keys::run(),
        Some("--keys-plot") => {
            let csv = Path::new(args.get(2).context("--keys-plot CSV")?);
            return keys_plot::replot(csv);
        }
        Some("--soak-run") => {
            // One run of the soak, in its own process (`soak.rs`): `--soak-run NAME DIR`.
            let name = args.get(2).context("--soak-run NAME DIR")?;
            let dir = Path::new(args.get(3).context("--soak-run NAME DIR")?);
            return soak::soak_run(name, dir);
        }
        Some("--soak-probe") => {
            let name = args.get(2).context("--soak-probe NAME DIR")?;
            let dir = Path::new(args.get(3).context("--soak-probe NAME DIR")?);
            return soak::soak_probe(name, dir);
        }
        Some("--soak-restart") => {
            let usage = "--soak-restart NAME DIR N";
            let name = args.get(2).context(usage)?;
            let dir = Path::new(args.get(3).context(usage)?);
            let n = args.get(4).and_then(|n| n.parse().ok()).unwrap_or(5);
            return soak::soak_restart(name, dir, n);
        }
        Some("--soak-report") => {
            return soak::soak_report(Path::new(args.get(2).context("--soak-report CSV")?));
        }
        Some("--closed-loop") => {
            let clients = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
            let secs = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5.0);
            let burst_first = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(0);
            return closed_loop_probe(clients, Duration::from_secs_f64(secs), burst_first);
        }
        Some(_) => {
            eprintln!("usage: roost-bench [--ceiling | --ceiling-profile [N] [fsync|syncfs] | --soak | --replication | --cluster | --intake | --keys | --soak-report CSV | --soak-restart NAME DIR N] (ROOST_BENCH_QUICK=1 for tiny sizes, ROOST_BENCH_DIR=DIR for the files, ROOST_SOAK_BATCHES=N for the soak's length, ROOST_SOAK_SAMPLES=N, ROOST_SOAK_RUNS=retention|no-retention, ROOST_SOAK_CSV=PATH)");
            std::process::exit(2);
        }
        None => {}
    }
    let sz = sizes();
    let base = bench_dir();
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    let small = Workload {
        ops: 10,
        record_bytes: 100,
    };
    let large = Workload {
        ops: 10,
        record_bytes: 4096,
    };
    println!(
        "roost end-to-end benchmark in {} (batches of {} creates of ~{} B)",
        base.display(),
        small.ops,
        small.record_bytes
    );

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

    // Bursts, then the closed-loop cells with roost and the peer taking turns (each restarted
    // on its own directory for its cell): the machine's speed drifts, so cells of the same
    // client count are measured next to each other. After its burst each system gets one
    // second of a single client, not counted: SQLite's first commit after a burst checkpoints
    // the WAL the burst left behind (seconds), which would otherwise land in the 1-client cell.
    let (roost_dir, peer_dir) = (base.join("roost"), base.join("sqlite"));
    let warm = Duration::from_secs(1).min(sz.cell);
    let r = Roost::start(&roost_dir)?;
    let (_, s0) = r.engine.wal_stats();
    let c0 = r.engine.stats.committed.load(Ordering::Relaxed);
    let roost_burst = burst(&r.spool, sz.burst, &small)?;
    let (_, s1) = r.engine.wal_stats();
    let c1 = r.engine.stats.committed.load(Ordering::Relaxed);
    let burst_per_sync = (c1 - c0) as f64 / (s1 - s0).max(1) as f64;
    println!(
        "roost burst: {roost_burst:.0} batches/s, {burst_per_sync:.1} batches per WAL fdatasync"
    );
    closed_loop(&r.spool, 1, warm, &small)?;
    drop(r);
    let p = peer::Peer::start(&peer_dir)?;
    let peer_burst = burst(&p.spool, sz.burst, &small)?;
    println!("sqlite burst: {peer_burst:.0} batches/s");
    closed_loop(&p.spool, 1, warm, &small)?;
    drop(p);
    let mut roost_cl = Vec::new();
    let mut peer_cl = Vec::new();
    let mut per_sync_64 = 0.0;
    for &c in &sz.clients {
        // REPS cells per system, alternating which goes first; the median of each is kept.
        let (mut rr, mut pr) = (Vec::new(), Vec::new());
        let (mut batches, mut syncs, mut rounds, mut published) = (0u64, 0u64, 0u64, 0u64);
        for rep in 0..REPS {
            for system in [rep % 2, 1 - rep % 2] {
                if system == 0 {
                    let r = Roost::start(&roost_dir)?;
                    let (_, s0) = r.engine.wal_stats();
                    let c0 = r.engine.stats.committed.load(Ordering::Relaxed);
                    let (rate, _) = closed_loop(&r.spool, c, sz.cell, &small)?;
                    let (_, s1) = r.engine.wal_stats();
                    let c1 = r.engine.stats.committed.load(Ordering::Relaxed);
                    let (ro, pu) = r.engine.publish_stats();
                    drop(r);
                    (batches, syncs) = (batches + c1 - c0, syncs + s1 - s0);
                    (rounds, published) = (rounds + ro, published + pu);
                    rr.push(rate);
                } else {
                    let p = peer::Peer::start(&peer_dir)?;
                    let (rate, _) = closed_loop(&p.spool, c, sz.cell, &small)?;
                    drop(p);
                    pr.push(rate);
                }
            }
        }
        let (rate, prate) = (median(&mut rr), median(&mut pr));
        let batches_per_sync = batches as f64 / syncs.max(1) as f64;
        println!("roost  {c:>2} clients: {rate:.0} batches/s (cells {}), {batches_per_sync:.1} batches per WAL fdatasync, {:.1} results per out/ round", fmt_rates(&rr), published as f64 / rounds.max(1) as f64);
        println!(
            "sqlite {c:>2} clients: {prate:.0} batches/s (cells {})",
            fmt_rates(&pr)
        );
        if c == *sz.clients.last().unwrap_or(&1) {
            per_sync_64 = batches_per_sync;
        }
        roost_cl.push((c, rate));
        peer_cl.push((c, prate));
    }
    // Half of the sustained (closed-loop) peak: the burst rate is not sustainable with clients
    // competing for the same cores and journal, and an overloaded open loop measures queueing.
    let peak = roost_cl.iter().map(|x| x.1).fold(0.0, f64::max);
    let r = Roost::start(&roost_dir)?;
    let (p50, p99) = open_loop(&r.spool, peak / 2.0, sz.cell, &small)?;
    drop(r);
    println!(
        "roost latency at {:.0} batches/s (half of the closed-loop peak): p50 {:.2} ms, p99 {:.2} ms",
        peak / 2.0,
        p50 * 1e3,
        p99 * 1e3
    );

    // Large records: WAL bytes per second measured from the WAL's own append counter
    // (bytes the claims took), in a burst (the pipeline's capacity) and with closed-loop
    // clients.
    let r = Roost::start(&base.join("roost-large"))?;
    let max_clients = *sz.clients.last().unwrap_or(&1);
    let wal_bytes = |r: &Roost| r.engine.wal().append_bytes();
    let b0 = wal_bytes(&r);
    let large_burst = burst(&r.spool, sz.burst / 4, &large)?;
    // Over the burst's own interval (first rename to last result), as its rate is.
    let burst_secs = (sz.burst / 4) as f64 / large_burst;
    let burst_mb = (wal_bytes(&r) - b0) as f64 / burst_secs / 1e6;
    let b0 = wal_bytes(&r);
    let t = Instant::now();
    let (large_rate, _) = closed_loop(&r.spool, max_clients, sz.cell, &large)?;
    let wal_mb = (wal_bytes(&r) - b0) as f64 / t.elapsed().as_secs_f64() / 1e6;
    println!("roost large records ({} x {} B): burst of {} files {large_burst:.0} batches/s = {burst_mb:.1} MB/s into the WAL ({:.0}% of sequential bandwidth); {max_clients} clients {large_rate:.0} batches/s = {wal_mb:.1} MB/s ({:.0}%)", large.ops, large.record_bytes, sz.burst / 4, 100.0 * burst_mb / bandwidth, 100.0 * wal_mb / bandwidth);
    drop(r);

    // restart: records over 8 shards, then READY time and index memory in a fresh process
    let rdir = base.join("restart");
    spool::populate(&rdir, sz.restart_records, 8)?;
    let out = std::process::Command::new(std::env::current_exe()?)
        .arg("--restart-probe")
        .arg(&rdir)
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

    // the table
    println!();
    println!("| measure | roost | SQLite peer | raw disk | ratio |");
    println!("|---|---|---|---|---|");
    println!("| burst of {} files, batches/s | {roost_burst:.0} | {peer_burst:.0} | {sync_rate:.0} fdatasync/s | roost/peer {:.1}x |", sz.burst, roost_burst / peer_burst);
    for ((c, a), (_, b)) in roost_cl.iter().zip(&peer_cl) {
        println!("| {c} closed-loop clients, batches/s | {a:.0} | {b:.0} | {sync_rate:.0} fdatasync/s | roost/peer {:.1}x |", a / b);
    }
    println!("| batches per WAL fdatasync, {max_clients} clients | {per_sync_64:.1} | | | |");
    println!("| batches per WAL fdatasync, burst | {burst_per_sync:.1} | | | |");
    println!("| WAL MB/s, 10 x 4 KiB records, burst of {} files | {burst_mb:.1} | | {bandwidth:.0} MB/s sequential | {:.2} of bandwidth |", sz.burst / 4, burst_mb / bandwidth);
    println!("| WAL MB/s, 10 x 4 KiB records, {max_clients} clients | {wal_mb:.1} | | {bandwidth:.0} MB/s sequential | {:.2} of bandwidth |", wal_mb / bandwidth);
    println!(
        "| latency p50 / p99 at {:.0} batches/s (half the closed-loop peak), ms | {:.2} / {:.2} | | | |",
        peak / 2.0,
        p50 * 1e3,
        p99 * 1e3
    );
    println!("| restart to ready, {recs:.0} records / 8 shards, ms | {ready_ms:.0} | | | |");
    println!(
        "| index memory, bytes per record | {:.1} | | | |",
        kib * 1024.0 / recs.max(1.0)
    );

    let svg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/bench-throughput.svg");
    if std::env::var_os("ROOST_BENCH_QUICK").is_none() {
        plot(&svg, &roost_cl, &peer_cl, sync_rate)?;
        println!("\nplot: {}", svg.display());
    }
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
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
