//! `roost-bench --closed-loop [CLIENTS] [SECS] [BURST]`: one closed-loop cell against roost
//! (after a burst of BURST files, to look at a daemon that has had one), with the mean time
//! per batch in each pipeline phase and roost's sync counts: the probe for profiling
//! (`perf record`, `valgrind --tool=callgrind`) and for trying a change quickly. Records of
//! `ROOST_BENCH_RECORD_BYTES` (default 100); `ROOST_BENCH_PEER=1` runs the SQLite peer
//! instead, `=durable-null` or `=durable-null-log` those consumers;
//! `ROOST_BENCH_OPEN_RATE=R` an open loop at R batches/s with each phase's quantiles.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use roost::pipeline::Engine;

use crate::spool::{burst, closed_loop, open_loop, Workload};
use crate::{bench_dir, ceiling, null, peer, Roost};

/// One probe cell: its clients and length, the burst before it, the batches.
struct Cell {
    clients: usize,
    dur: Duration,
    burst_first: usize,
    w: Workload,
}

impl Cell {
    /// The burst before the cell, if one is asked for, into `spool`; printed after `who`.
    fn burst_first(&self, spool: &Path, who: &str) -> anyhow::Result<()> {
        if self.burst_first > 0 {
            let rate = burst(spool, self.burst_first, &self.w)?;
            let n = self.burst_first;
            println!("{who}burst of {n} first: {rate:.0} batches/s");
        }
        Ok(())
    }
}

pub fn run(clients: usize, dur: Duration, burst_first: usize) -> anyhow::Result<()> {
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
    let cell = Cell {
        clients,
        dur,
        burst_first,
        w,
    };
    let peer = std::env::var("ROOST_BENCH_PEER").ok();
    let contract = match peer.as_deref() {
        Some("durable-null") => Some(null::Contract::Durable),
        Some("durable-null-log") => Some(null::Contract::DurableLog),
        _ => None,
    };
    let r = match (contract, peer) {
        (Some(contract), Some(name)) => {
            let n = null::NullConsumer::start(&base, ceiling::dnull_threads(), contract)?;
            let (rate, _) = closed_loop(&n.spool, clients, dur, &cell.w)?;
            println!("{name} {clients} clients: {rate:.0} batches/s");
            Ok(())
        }
        (_, Some(_)) => sqlite(&base, &cell),
        _ => roost(&base, &cell),
    };
    let _ = std::fs::remove_dir_all(&base);
    r
}

fn sqlite(base: &Path, cell: &Cell) -> anyhow::Result<()> {
    let p = peer::Peer::start(base)?;
    cell.burst_first(&p.spool, "sqlite ")?;
    let (clients, dur, w) = (cell.clients, cell.dur, &cell.w);
    let (rate, lat) = closed_loop(&p.spool, clients, dur, w)?;
    let max = lat.iter().max().copied().unwrap_or_default();
    println!("sqlite {clients} clients: {rate:.0} batches/s, slowest {max:?}");
    Ok(())
}

/// Wal appends, wal syncs, shard txns, shard flushes, audit syncs, results, result rounds.
fn counters(e: &Engine) -> [u64; 7] {
    let f = e.figures();
    let (a, s, au) = (f.wal_appends, f.wal_syncs, f.audit_syncs);
    let (ro, pu) = (f.result_rounds, f.results_published);
    let (t, f) = (
        e.stats.shard_txns.load(Ordering::Relaxed),
        e.stats.shard_flushes.load(Ordering::Relaxed),
    );
    [a, s, t, f, au, pu, ro]
}

fn roost(base: &Path, cell: &Cell) -> anyhow::Result<()> {
    let r = Roost::start(base)?;
    cell.burst_first(&r.spool, "")?;
    let (clients, dur, w) = (cell.clients, cell.dur, &cell.w);
    let open_rate = std::env::var("ROOST_BENCH_OPEN_RATE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok());
    if let Some(rate) = open_rate {
        return open(&r, rate, dur, w);
    }
    let e = r.engine.clone();
    let phases = e.stats.latency.phases();
    let before: Vec<(u64, u64)> = phases
        .iter()
        .map(|(_, h)| (h.count(), h.sum_us()))
        .collect();
    let c0 = counters(&e);
    let (rate, _) = closed_loop(&r.spool, clients, dur, w)?;
    let d: Vec<u64> = counters(&e).iter().zip(c0).map(|(b, a)| b - a).collect();
    println!("{clients} clients: {rate:.0} batches/s; wal {} appends / {} syncs; shards {} txns / {} flushes; audit {} syncs; results {} in {} rounds", d[0], d[1], d[2], d[3], d[4], d[5], d[6]);
    for ((name, h), (c0, u0)) in phases.iter().zip(before) {
        let n = (h.count() - c0).max(1);
        println!(
            "  {name:<7} mean {:>8.2} ms",
            (h.sum_us() - u0) as f64 / n as f64 / 1e3
        );
    }
    Ok(())
}

/// Open loop at a fixed rate: the client's p50/p99 next to the engine's own, by phase
/// (histogram bucket bounds), to see where a latency tail comes from.
fn open(r: &Roost, rate: f64, dur: Duration, w: &Workload) -> anyhow::Result<()> {
    let (p50, p99) = open_loop(&r.spool, rate, dur, w)?;
    println!(
        "open loop at {rate:.0}/s: client p50 {:.2} ms, p99 {:.2} ms",
        p50 * 1e3,
        p99 * 1e3
    );
    for (name, h) in &r.engine.stats.latency.phases() {
        let q = |x: f64| h.quantile_us(x).map_or(f64::NAN, |u| u as f64 / 1e3);
        println!(
            "  {name:<7} p50 <= {:>8.2} ms, p99 <= {:>8.2} ms (since start)",
            q(0.5),
            q(0.99)
        );
    }
    Ok(())
}
