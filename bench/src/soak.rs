//! `roost-bench --soak` (issue 14): does retention keep a long-running roost bounded? A steady
//! state of creates and deletes (the live data constant) is run twice on the same workload,
//! each run in a fresh process so its memory is its own: with retention (periodic checkpoints,
//! WAL and key-table retirement, a short request-key window, audit retention, shard
//! compaction) and without. Every tenth of the run it samples disk bytes per part, the
//! blocks the data directory holds, anonymous RSS and live request keys, then drops the
//! engine and reopens it (a restart without a final checkpoint, as after a kill: a graceful
//! stop would checkpoint first) and records the recovery's time and the WAL records it
//! replayed, and the anonymous RSS both of the run's process after the reopen and of a fresh
//! process that opened the same directory (`--soak-probe`: no allocator leftovers from the
//! engines dropped before). Prints both runs side by side and writes `docs/bench-soak.csv` and
//! `docs/bench-soak.svg`.
//!
//! `Engine::submit` is called directly from many threads (no spool files; each result file is
//! deleted once read, as a client does). Every hundredth batch also resubmits a recent batch
//! under its key, well inside the window: its answer must equal the first one, or the run
//! stops. That is the only check; no timing is asserted.
//!
//! `ROOST_SOAK_BATCHES=N` sets the soak's length, `ROOST_SOAK_SAMPLES=N` the samples (10),
//! `ROOST_SOAK_RUNS=retention` (or `no-retention`) runs one of the two only,
//! `ROOST_SOAK_CSV=PATH` writes the CSV there (the plot beside it, `.svg`) instead of
//! `docs/bench-soak.csv`, `ROOST_BENCH_QUICK=1` makes it tiny, `ROOST_BENCH_DIR` puts the
//! files elsewhere (default `target/bench-soak`), and `ROOST_BENCH_LOOP=1` (as root) runs on a
//! fresh journaled ext4 loop image instead, `ROOST_SOAK_KEEP=1` keeps the data directories
//! after the run (on the plain directory only). The CSV gets each row as it is sampled, so a run
//! stopped early keeps what it measured; `roost-bench --soak-report CSV` prints the table of a
//! CSV (rows matched by batches across runs) and writes its plot.

use std::collections::VecDeque;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context};
use roost::batch::{Batch, BatchResult};
use roost::config::Config;
use roost::pipeline::{one_answer, Deliver, Engine};
use roost_benchkit::{bench_base, rss_anon_kib};

use crate::loopfs::LoopMount;

mod report;

pub(crate) use report::append_line;
pub use report::soak_report;
use report::{plot, print_table, Row, CSV_HEADER, PARTS};

/// Shards the records spread over.
const SHARDS: u64 = 4;
/// Ops in a batch at most (small, so that 4 MiB WAL segments are allowed: a segment must
/// hold two of the largest claims).
const OPS_MAX: u32 = 10;
/// Creates per batch while populating.
const FILL_OPS: u64 = 10;
/// Every this many batches, one recent batch is resubmitted under its key.
const DUP_EVERY: u64 = 100;
/// Finished batches kept for resubmission.
const RECENT_MAX: usize = 4096;
/// The two runs, in the order they are run and printed.
const RUNS: [&str; 2] = ["retention", "no-retention"];

/// The soak's sizes, the same in the parent and in each run's process (from the environment).
struct SoakSizes {
    quick: bool,
    live: u64,
    batches: u64,
    samples: u64,
    threads: usize,
}

fn soak_sizes() -> SoakSizes {
    let quick = std::env::var_os("ROOST_BENCH_QUICK").is_some();
    let env = |name: &str| -> Option<u64> {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
    };
    SoakSizes {
        quick,
        live: if quick { 1_000 } else { 100_000 },
        batches: env("ROOST_SOAK_BATCHES").unwrap_or(if quick { 2_000 } else { 1_000_000 }),
        samples: env("ROOST_SOAK_SAMPLES").unwrap_or(if quick { 4 } else { 10 }),
        threads: if quick { 8 } else { 32 },
    }
}

/// Both runs' configuration: small segments everywhere (so that retirement and compaction
/// have whole segments to work with); they differ only in retention.
fn soak_config(retention: bool, sz: &SoakSizes) -> Config {
    let base = Config {
        batch_ops_max: OPS_MAX,
        spool_file_bytes_max: 64 << 10,
        wal_segment_bytes: 4 << 20,
        shard_segment_bytes: 4 << 20,
        ..Config::default()
    };
    if retention {
        Config {
            checkpoint_wal_bytes: if sz.quick { 128 << 10 } else { 8 << 20 },
            checkpoint_interval_ms: 10_000,
            request_key_window_secs: if sz.quick { 2 } else { 30 },
            audit_retain_bytes: Some(16 << 20),
            shard_compact_dead_fraction: 0.5,
            shard_compact_bytes_per_sec: 64 << 20,
            ..base
        }
    } else {
        Config {
            checkpoint_wal_bytes: u64::MAX,
            checkpoint_interval_ms: u64::MAX,
            request_key_window_secs: 100 * 365 * 86_400,
            audit_retain_bytes: None,
            audit_retain_secs: None,
            shard_compact_bytes_per_sec: 0,
            ..base
        }
    }
}

/// A finished batch kept for resubmission, with its first answer.
struct Sent {
    batch: Batch,
    result: BatchResult,
    at: Instant,
}

/// What the client threads share; it outlives each engine (a restart keeps the workload).
struct Load {
    /// Live records, oldest first: (shard, id). The next batch deletes the front.
    live: Mutex<VecDeque<(u64, u64)>>,
    /// The next soak batch's number.
    next: AtomicU64,
    recent: Mutex<VecDeque<Sent>>,
    duplicates: AtomicU64,
    /// A resubmission happens only this soon after the first answer (half the key window).
    resubmit_within: Duration,
    /// Set by the first thread that fails: the others stop.
    failed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The runs `ROOST_SOAK_RUNS` names (comma-separated), both by default.
fn soak_runs() -> anyhow::Result<Vec<&'static str>> {
    let Ok(names) = std::env::var("ROOST_SOAK_RUNS") else {
        return Ok(RUNS.to_vec());
    };
    names
        .split(',')
        .map(|n| {
            RUNS.into_iter()
                .find(|r| *r == n.trim())
                .with_context(|| format!("ROOST_SOAK_RUNS: {n:?} is none of {RUNS:?}"))
        })
        .collect()
}

/// Where the CSV goes (`None` at the quick sizes): `ROOST_SOAK_CSV`, else
/// `docs/bench-soak.csv`. Starts it with the header.
fn soak_csv(sz: &SoakSizes) -> anyhow::Result<Option<PathBuf>> {
    if sz.quick {
        return Ok(None);
    }
    let path = std::env::var_os("ROOST_SOAK_CSV").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/bench-soak.csv"),
        PathBuf::from,
    );
    std::fs::write(&path, format!("{CSV_HEADER}\n"))
        .with_context(|| format!("write {}", path.display()))?;
    Ok(Some(path))
}

/// `--soak`: both runs (or those `ROOST_SOAK_RUNS` names), each in its own process, then the
/// table, the CSV and the plot.
pub fn soak() -> anyhow::Result<()> {
    let sz = soak_sizes();
    let names = soak_runs()?;
    let csv = soak_csv(&sz)?;
    let base = bench_base("target/bench-soak");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let mount = if std::env::var_os("ROOST_BENCH_LOOP").is_some() {
        Some(LoopMount::new(&base, 16 << 30)?)
    } else {
        None
    };
    let root = mount.as_ref().map_or(base.clone(), |m| m.dir.clone());
    println!(
        "roost soak in {}: {} live records over {SHARDS} shards, {} batches of 1 create + 1 delete from {} threads, {} samples",
        root.display(), sz.live, sz.batches, sz.threads, sz.samples
    );
    let mut runs = Vec::new();
    for name in names {
        let t = Instant::now();
        let rows = run_child(name, &root.join(name), csv.as_deref())?;
        println!("{name}: {:.0} s", t.elapsed().as_secs_f64());
        runs.push((name.to_owned(), rows));
    }
    print_table(&runs);
    if let Some(csv) = csv {
        let svg = csv.with_extension("svg");
        plot(&svg, &runs)?;
        println!("\ncsv: {}, plot: {}", csv.display(), svg.display());
    }
    drop(mount);
    if std::env::var_os("ROOST_SOAK_KEEP").is_some() {
        println!("kept {} (ROOST_SOAK_KEEP)", base.display());
    } else {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}

/// Runs `--soak-run NAME DIR` in a fresh process; its rows come back on stdout, and each is
/// appended to `csv` as it comes.
fn run_child(name: &str, dir: &Path, csv: Option<&Path>) -> anyhow::Result<Vec<Row>> {
    let exe = std::env::current_exe().context("current_exe")?;
    let mut child = Command::new(exe)
        .arg("--soak-run")
        .arg(name)
        .arg(dir)
        .stdout(Stdio::piped())
        .spawn()
        .context("spawn the soak run")?;
    let out = child.stdout.take().context("the soak run's stdout")?;
    let mut rows = Vec::new();
    for line in std::io::BufReader::new(out).lines() {
        let line = line.context("read the soak run's output")?;
        if let Some(line) = line.strip_prefix("SOAK ") {
            rows.push(Row::from_csv(line)?);
            if let Some(csv) = csv {
                append_line(csv, line)?;
            }
        }
    }
    let status = child.wait().context("wait for the soak run")?;
    ensure!(status.success(), "soak run {name} failed: {status}");
    Ok(rows)
}

/// `--soak-run NAME DIR`: one run, its rows printed as `SOAK <csv>` lines.
pub fn soak_run(name: &str, dir: &Path) -> anyhow::Result<()> {
    let sz = soak_sizes();
    let retention = match name {
        "retention" => true,
        "no-retention" => false,
        _ => bail!("--soak-run retention|no-retention DIR, not {name:?}"),
    };
    let cfg = soak_config(retention, &sz);
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let load = Load {
        live: Mutex::new(VecDeque::new()),
        next: AtomicU64::new(0),
        recent: Mutex::new(VecDeque::new()),
        duplicates: AtomicU64::new(0),
        resubmit_within: Duration::from_secs(cfg.request_key_window_secs) / 2,
        failed: AtomicBool::new(false),
    };
    let mut engine = open(dir, &cfg)?;
    populate(&engine, &load, sz.live, sz.threads)?;
    let start = Instant::now();
    let (mut checkpoints, mut reclaimed) = (0, 0);
    for i in 0..=sz.samples {
        let until = sz.batches * i / sz.samples;
        if i > 0 {
            checkpoints += drive(&engine, &load, until, sz.threads, retention)?;
        }
        let mut row = measure(&engine, dir);
        reclaimed += row.reclaimed;
        drop(engine);
        let fresh_rss_kib = probe(name, dir)?;
        let t = Instant::now();
        engine = open(dir, &cfg)?;
        let report = engine.figures().recovery;
        row = Row {
            batches: until,
            rss_kib: rss_anon_kib(),
            fresh_rss_kib,
            restart_ms: report.duration.as_secs_f64() * 1e3,
            replayed: report.wal_records,
            checkpoints,
            reclaimed,
            duplicates: load.duplicates.load(Ordering::Relaxed),
            secs: start.elapsed().as_secs_f64(),
            ..row
        };
        println!("SOAK {}", row.to_csv(name));
        eprintln!(
            "  {name}: {until} batches, disk {:.1} MiB, restart {:.0} ms ({:.0} ms open), {} records replayed, {:.0} s",
            row.total() as f64 / 1048576.0,
            row.restart_ms,
            t.elapsed().as_secs_f64() * 1e3,
            row.replayed,
            row.secs
        );
    }
    drop(engine);
    if std::env::var_os("ROOST_SOAK_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(())
}

/// `--soak-restart NAME DIR N`: opens `dir` with run NAME's configuration `n` times (each
/// a restart without a final checkpoint, as after a kill: nothing is written between) and
/// prints each recovery's time in ms, then the median. For measuring the restart of kept
/// soak directories side by side on a quiet machine.
pub fn soak_restart(name: &str, dir: &Path, n: usize) -> anyhow::Result<()> {
    let cfg = soak_config(name == "retention", &soak_sizes());
    let mut ms = Vec::new();
    for _ in 0..n.max(1) {
        let engine = open(dir, &cfg)?;
        ms.push(engine.figures().recovery.duration.as_secs_f64() * 1e3);
        drop(engine);
    }
    let mut sorted = ms.clone();
    sorted.sort_by(f64::total_cmp);
    let text: Vec<String> = ms.iter().map(|m| format!("{m:.0}")).collect();
    println!(
        "{}: restarts {} ms, median {:.0} ms",
        dir.display(),
        text.join(" "),
        sorted[sorted.len() / 2]
    );
    Ok(())
}

/// The anonymous RSS of a fresh process (`--soak-probe NAME DIR`) once it has opened `dir`.
fn probe(name: &str, dir: &Path) -> anyhow::Result<u64> {
    let exe = std::env::current_exe().context("current_exe")?;
    let out = Command::new(exe)
        .arg("--soak-probe")
        .arg(name)
        .arg(dir)
        .output()
        .context("run the soak probe")?;
    ensure!(
        out.status.success(),
        "soak probe failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .with_context(|| format!("soak probe printed {text:?}"))
}

/// `--soak-probe NAME DIR`: opens `dir` with run NAME's configuration and prints the
/// process's anonymous RSS in KiB.
pub fn soak_probe(name: &str, dir: &Path) -> anyhow::Result<()> {
    let cfg = soak_config(name == "retention", &soak_sizes());
    let engine = open(dir, &cfg)?;
    println!("{}", rss_anon_kib());
    drop(engine);
    Ok(())
}

fn open(dir: &Path, cfg: &Config) -> anyhow::Result<Engine> {
    crate::open_engine(dir, cfg.clone())
        .with_context(|| format!("open the engine on {}", dir.display()))
}

/// What a sample reads from the running engine (the restart fields are filled in after).
fn measure(engine: &Engine, dir: &Path) -> Row {
    let mut parts = [0; 5];
    for (name, bytes) in engine.disk_bytes() {
        if let Some(i) = PARTS.iter().position(|p| *p == name) {
            parts[i] = bytes;
        }
    }
    Row {
        parts,
        allocated: allocated_bytes(dir),
        live_keys: engine.figures().live_keys() as u64,
        reclaimed: engine
            .shards()
            .compaction()
            .values()
            .map(|c| c.reclaimed_bytes)
            .sum(),
        ..Row::default()
    }
}

/// Bytes of the blocks every file under `dir` holds (what `du` counts; unreadable entries
/// count as nothing).
pub(crate) fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => m.blocks() * 512 + allocated_bytes(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// Submits `batch` as `name`, then deletes its result file as a client that read it would.
fn submit(engine: &Engine, batch: &Batch, name: &str) -> anyhow::Result<BatchResult> {
    let r = engine
        .submit(&[(batch, name)], Deliver::Files)
        .and_then(one_answer)
        .with_context(|| format!("submit {name}"))?;
    let out = engine.spool().out.join(name);
    std::fs::remove_file(&out).with_context(|| format!("remove {}", out.display()))?;
    Ok(r)
}

fn parse(text: &str) -> anyhow::Result<Batch> {
    roost::batch::parse(text.as_bytes(), OPS_MAX).map_err(|e| anyhow!("bad batch: {}", e.error))
}

/// `live` records over the shards, in batches of `FILL_OPS` creates from `threads` threads.
fn populate(engine: &Engine, load: &Load, live: u64, threads: usize) -> anyhow::Result<()> {
    let next = AtomicU64::new(0);
    let batches = live.div_ceil(FILL_OPS);
    let fill = |b: u64| -> anyhow::Result<()> {
        let ops: Vec<String> = (0..FILL_OPS)
            .map(|i| create_op((b * FILL_OPS + i) % SHARDS, b * FILL_OPS + i))
            .collect();
        let text = format!(r#"{{"request_key":"fill-{b}","ops":[{}]}}"#, ops.join(","));
        let r = submit(engine, &parse(&text)?, &format!("fill-{b}.json"))?;
        ensure!(
            matches!(r, BatchResult::Committed { .. }),
            "fill-{b}: {r:?}"
        );
        let mut q = lock(&load.live);
        for op in r.ops() {
            let s = op
                .shard
                .trim_start_matches('s')
                .parse()
                .context("shard name")?;
            q.push_back((s, op.id));
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| loop {
                    match next.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        (n < batches).then_some(n + 1)
                    }) {
                        Ok(b) => fill(b)?,
                        Err(_) => return Ok(()),
                    }
                })
            })
            .collect();
        join_all(hs)
    })
}

fn join_all(hs: Vec<std::thread::ScopedJoinHandle<'_, anyhow::Result<()>>>) -> anyhow::Result<()> {
    let mut first = Ok(());
    for h in hs {
        let r = h
            .join()
            .map_err(|_| anyhow!("a soak thread panicked"))
            .and_then(|r| r);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

fn create_op(shard: u64, n: u64) -> String {
    format!(
        r#"{{"op":"create","shard":"s{shard}","record":{{"n":{n},"name":"user-{n}","plan":"basic","pad":"{}"}}}}"#,
        "x".repeat(48)
    )
}

/// Soak batches up to number `until` from `threads` threads; with `checkpoints`, a thread
/// takes a checkpoint whenever one is due (the serve loop's job, not running here). Returns
/// the checkpoints taken.
fn drive(
    engine: &Engine,
    load: &Load,
    until: u64,
    threads: usize,
    checkpoints: bool,
) -> anyhow::Result<u64> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let cp = checkpoints.then(|| s.spawn(|| checkpointer(engine, &stop)));
        let hs: Vec<_> = (0..threads)
            .map(|_| s.spawn(|| worker(engine, load, until)))
            .collect();
        let r = join_all(hs);
        stop.store(true, Ordering::Relaxed);
        let taken = match cp {
            Some(h) => h
                .join()
                .map_err(|_| anyhow!("the checkpointer panicked"))??,
            None => 0,
        };
        r.map(|()| taken)
    })
}

fn checkpointer(engine: &Engine, stop: &AtomicBool) -> anyhow::Result<u64> {
    let mut taken = 0;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if engine.checkpoint_due() && engine.checkpoint().context("checkpoint")?.is_some() {
            taken += 1;
        }
    }
    Ok(taken)
}

fn worker(engine: &Engine, load: &Load, until: u64) -> anyhow::Result<()> {
    while !load.failed.load(Ordering::Relaxed) {
        let Ok(b) = load
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < until).then_some(n + 1)
            })
        else {
            return Ok(());
        };
        let r = step(engine, load, b);
        if r.is_err() {
            load.failed.store(true, Ordering::Relaxed);
            return r;
        }
    }
    Ok(())
}

/// Soak batch `b`: create a record, delete the oldest live one; every `DUP_EVERY`th also
/// resubmits a recent batch.
fn step(engine: &Engine, load: &Load, b: u64) -> anyhow::Result<()> {
    let shard = b % SHARDS;
    let victim = lock(&load.live).pop_front();
    let delete = victim
        .map(|(s, id)| format!(r#",{{"op":"delete","shard":"s{s}","id":{id}}}"#))
        .unwrap_or_default();
    let text = format!(
        r#"{{"request_key":"soak-{b}","ops":[{}{delete}]}}"#,
        create_op(shard, b)
    );
    let batch = parse(&text)?;
    let r = submit(engine, &batch, &format!("soak-{b}.json"))?;
    let BatchResult::Committed { ops, .. } = &r else {
        bail!("soak-{b} was not committed: {r:?}");
    };
    let id = ops
        .iter()
        .find(|o| o.op == "create")
        .map(|o| o.id)
        .with_context(|| format!("soak-{b}: no create in {r:?}"))?;
    lock(&load.live).push_back((shard, id));
    {
        let mut recent = lock(&load.recent);
        if recent.len() >= RECENT_MAX {
            recent.pop_front();
        }
        recent.push_back(Sent {
            batch,
            result: r,
            at: Instant::now(),
        });
    }
    if b % DUP_EVERY == DUP_EVERY - 1 {
        resubmit(engine, load, b)?;
    }
    Ok(())
}

/// Resubmits the oldest kept batch (if it is well inside the key window): the answer must be
/// the first one, unchanged. The batch may be below a checkpoint, its WAL retired, or from
/// before a restart.
fn resubmit(engine: &Engine, load: &Load, b: u64) -> anyhow::Result<()> {
    let pick = lock(&load.recent)
        .front()
        .filter(|s| s.at.elapsed() < load.resubmit_within)
        .map(|s| (s.batch.clone(), s.result.clone()));
    let Some((batch, first)) = pick else {
        return Ok(());
    };
    let again = submit(engine, &batch, &format!("dup-{b}.json"))?;
    ensure!(
        again == first,
        "duplicate answer differs for {}: first {first:?}, again {again:?}",
        batch.request_key
    );
    load.duplicates.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
