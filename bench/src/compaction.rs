//! `roost-bench --compaction-latency`: a batch's latency while a shard compacts, beside the
//! same stream with compaction off (issue 14: compaction is throttled so that intake latency
//! stays within 2x of the idle figure). One shard is filled with records of ~1 KB, most of
//! them deleted, then 6,000 more live records (so that the segment holding the deletes is
//! sealed), and a checkpoint puts them below the compaction horizon; then one client
//! submits single-create batches to that shard back to back, first with compaction off, then
//! (reopened) with it on, while the owner rewrites the dead segments. Nothing is asserted.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use roost::batch::{self, Batch};
use roost::config::Config;
use roost::pipeline::{one_answer, Deliver};
use roost_benchkit::bench_base;

use crate::open_engine;

/// Records created, of which all but one in twenty are deleted.
fn sizes() -> (u64, usize) {
    if std::env::var_os("ROOST_BENCH_QUICK").is_some() {
        (4_000, 200)
    } else {
        (200_000, 3_000)
    }
}

fn parse(v: serde_json::Value) -> anyhow::Result<Batch> {
    batch::parse(&serde_json::to_vec(&v)?, 1_000).map_err(|e| anyhow::anyhow!("{}", e.error))
}

fn config(rate: u64) -> Config {
    Config {
        shard_segment_bytes: 4 << 20,
        shard_compact_bytes_per_sec: rate,
        ..Config::default()
    }
}

/// Creates `n` records in batches of 100, then deletes 19 of every 20; returns nothing but
/// the directory's state.
fn populate(dir: &Path, n: u64) -> anyhow::Result<()> {
    let e = open_engine(dir, config(0))?;
    let pad = "x".repeat(1000);
    let mut ids = Vec::new();
    for b in 0..n.div_ceil(100) {
        let ops: Vec<_> = (0..100)
            .map(|i| serde_json::json!({"op": "create", "shard": "s", "record": {"i": b * 100 + i, "pad": pad}}))
            .collect();
        let b = parse(serde_json::json!({"request_key": format!("p{b}"), "ops": ops}))?;
        let r = one_answer(e.submit(&[(&b, "p.json")], Deliver::Files)?)?;
        ids.extend(r.ops().iter().map(|o| o.id));
    }
    let dead: Vec<u64> = ids.iter().copied().filter(|id| id % 20 != 0).collect();
    for (k, chunk) in dead.chunks(100).enumerate() {
        let ops: Vec<_> = chunk
            .iter()
            .map(|id| serde_json::json!({"op": "delete", "shard": "s", "id": id}))
            .collect();
        let b = parse(serde_json::json!({"request_key": format!("d{k}"), "ops": ops}))?;
        e.submit(&[(&b, "d.json")], Deliver::Files)?;
    }
    // Live filler after the deletes: the segment holding them is sealed, and compaction
    // counts a delete as final only once its whole segment is below the checkpoint.
    for b in 0..60 {
        let ops: Vec<_> = (0..100)
            .map(|i| serde_json::json!({"op": "create", "shard": "s", "record": {"f": b * 100 + i, "pad": pad}}))
            .collect();
        let b = parse(serde_json::json!({"request_key": format!("f{b}"), "ops": ops}))?;
        e.submit(&[(&b, "f.json")], Deliver::Files)?;
    }
    e.checkpoint()?;
    Ok(())
}

/// `count` single-create batches back to back; their latencies, sorted.
fn stream(dir: &Path, rate: u64, count: usize, tag: &str) -> anyhow::Result<(Vec<Duration>, u64)> {
    let e = open_engine(dir, config(rate))?;
    let mut lat = Vec::with_capacity(count);
    for i in 0..count {
        let b = parse(
            serde_json::json!({"request_key": format!("{tag}{i}"), "ops": [{"op": "create", "shard": "s", "record": {"i": i}}]}),
        )?;
        let t = Instant::now();
        e.submit(&[(&b, "s.json")], Deliver::Files)?;
        lat.push(t.elapsed());
    }
    let figures = e.shards().compaction().remove("s").unwrap_or_default();
    println!("  {tag}: {figures:?}");
    let reclaimed = figures.reclaimed_bytes;
    lat.sort();
    Ok((lat, reclaimed))
}

fn quantile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

pub fn run() -> anyhow::Result<()> {
    let (records, count) = sizes();
    let dir = bench_base("target/bench-compaction").join("data");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let t = Instant::now();
    populate(&dir, records)?;
    println!(
        "compaction latency: {records} records of ~1 KB on one shard (4 MiB segments), 95% deleted, checkpointed ({:.1} s)",
        t.elapsed().as_secs_f64()
    );
    let (off, _) = stream(&dir, 0, count, "off")?;
    let rate = 64 << 20;
    let t = Instant::now();
    let (on, reclaimed) = stream(&dir, rate, count, "on")?;
    let secs = t.elapsed().as_secs_f64();
    println!("| compaction | batches | p50 ms | p99 ms | max ms | reclaimed during the stream |");
    println!("|---|---|---|---|---|---|");
    for (name, l, r) in [("off", &off, 0), ("on, 64 MiB/s", &on, reclaimed)] {
        println!(
            "| {name} | {} | {:.2} | {:.2} | {:.2} | {:.1} MiB |",
            l.len(),
            quantile(l, 0.5),
            quantile(l, 0.99),
            quantile(l, 1.0),
            r as f64 / (1 << 20) as f64
        );
    }
    println!(
        "p99 with compaction / without: {:.2}x (the stream with compaction took {secs:.1} s)",
        quantile(&on, 0.99) / quantile(&off, 0.99).max(1e-9)
    );
    Ok(())
}
