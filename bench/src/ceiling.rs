//! `roost-bench --ceiling` (issues 16 and 30): how close roost gets to the spool's own
//! ceiling. Six systems take the same batches (10 creates of ~100 B over 4 shards, one file
//! each): the null consumer (`null.rs`: the same file work, nothing stored, nothing synced:
//! the ceiling), the durable-null consumer (`null.rs`, issue 30: the same file work and the
//! least roost's result contract needs, each result fdatasynced before its rename and `out/`
//! fsynced once per round, on [`DNULL_THREADS`] threads, roost's batches in flight; nothing
//! stored), the same with a log (`Contract::DurableLog`: each batch's bytes appended to a
//! log and group-committed before its result is renamed: the least any store adds), roost
//! (in-process `serve`, default settings), roost with `result_sync =
//! "syncfs"` (one `syncfs` per result round instead of one fdatasync per result file), and the
//! SQLite peer (`peer.rs`). Each runs on two file systems: a fresh journaled ext4 image made
//! for it (`loopfs.rs`; one per system per round, what a server has) and a fresh directory on
//! the plain data directory (this machine's ext4 has no journal). In each run: a burst of N
//! files dropped at once (time until the last result), one uncounted second of one client,
//! then closed-loop cells of 1, 4 and 32 clients. Rounds rotate the order of the systems and
//! of the file systems; the median over rounds is printed with every round's figure.
//!
//! The table gives roost / durable-null per file system and figure, round by round: what
//! roost's store costs on top of its result contract (issue 30's goal: at least 0.9), and
//! roost / durable-null + log: what it costs beyond the log's own sync. On the journaled
//! image it also prints each system's device flush requests per batch (the loop device's
//! count, `/sys/block/loopN/stat`): the physical cost of each one's durability.
//!
//! For roost it also prints its own counters over the burst (after its durability tail has
//! settled): batches per WAL fdatasync, result files per `out/` round, shard flushes and
//! audit syncs per batch, and the syncs per batch they add up to.
//!
//! Checked (the run fails otherwise): every result file of a burst and of every closed-loop
//! batch is present and a committed result for its request key with one id per op. No timing
//! is asserted. `ROOST_BENCH_QUICK=1` makes it tiny (CI), `ROOST_BENCH_ROUNDS=N` sets the
//! rounds (3), `ROOST_BENCH_SECS` the closed-loop cell (2 s), `ROOST_BENCH_NULL_THREADS=N`
//! skips the null consumer's thread calibration, `ROOST_BENCH_DNULL_THREADS=N` sets the
//! durable-null's threads, `ROOST_BENCH_SYSTEMS=roost,sqlite` (any of null, durable-null,
//! durable-null-log, roost, roost-syncfs, sqlite) and `ROOST_BENCH_FS=journaled` (or plain) run a part
//! only, `ROOST_BENCH_DIR` puts the files elsewhere
//! (default `target/bench-ceiling`). The journaled runs need root; without it the run fails
//! unless `ROOST_ALLOW_NO_ROOT=1`, which skips them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roost::config::ResultSync;
use roost_benchkit::{bench_base, cell_duration};

use crate::loopfs::{clear_stale, is_root, LoopMount};
use crate::null::{Contract, NullConsumer};
use crate::peer::Peer;
use crate::spool::{burst_timed, check_burst, clear_out, closed_loop, closed_loop_checked, Checks};
use crate::spool::{BurstRun, Workload};
use crate::synccost::sync_costs;
use crate::Roost;

/// The batches: 10 creates of ~100 B over 4 shards, as the end-to-end bench.
const WORK: Workload = Workload {
    ops: 10,
    record_bytes: 100,
};
/// Thread counts the null consumer is tried with.
const NULL_THREADS: [usize; 3] = [1, 2, 4];
/// The durable-null consumer's threads: as many results in flight as roost's default
/// `batches_in_flight_max`, so both can group as many syncs.
const DNULL_THREADS: usize = 64;

pub(crate) struct Sizes {
    quick: bool,
    burst: usize,
    clients: Vec<usize>,
    cell: Duration,
    rounds: usize,
    image_bytes: u64,
}

fn sizes() -> Sizes {
    let quick = std::env::var_os("ROOST_BENCH_QUICK").is_some();
    let rounds = std::env::var("ROOST_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0);
    Sizes {
        quick,
        burst: if quick { 100 } else { 3_000 },
        clients: if quick { vec![1, 4] } else { vec![1, 4, 32] },
        cell: if quick {
            Duration::from_millis(200)
        } else {
            cell_duration()
        },
        rounds: rounds.unwrap_or(if quick { 2 } else { 3 }),
        // Roost preallocates ~400 MiB (WAL, audit log, 4 shards, each with its spare); the
        // image is sparse, so only what is written takes room.
        image_bytes: 2 << 30,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fs {
    /// A fresh journaled ext4 image per system and round.
    Journaled,
    /// A fresh directory on the bench directory's own file system.
    Plain,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Null,
    DurableNull,
    DurableNullLog,
    Roost,
    RoostSyncfs,
    Sqlite,
}

const SYSTEMS: [System; 6] = [
    System::Null,
    System::DurableNull,
    System::DurableNullLog,
    System::Roost,
    System::RoostSyncfs,
    System::Sqlite,
];

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            System::Null => "null",
            System::DurableNull => "durable-null",
            System::DurableNullLog => "durable-null-log",
            System::Roost => "roost",
            System::RoostSyncfs => "roost-syncfs",
            System::Sqlite => "sqlite",
        })
    }
}

impl fmt::Display for Fs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fs::Journaled => "journaled",
            Fs::Plain => "plain",
        })
    }
}

/// A system running on a spool, stopped at drop.
enum Running {
    Null(NullConsumer),
    Roost(Roost),
    Sqlite(Peer),
}

impl Running {
    fn start(sys: System, dir: &Path, null_threads: usize) -> anyhow::Result<Running> {
        Ok(match sys {
            System::Null => {
                Running::Null(NullConsumer::start(dir, null_threads, Contract::Nothing)?)
            }
            System::DurableNull => Running::Null(NullConsumer::start(
                dir,
                dnull_threads(),
                Contract::Durable,
            )?),
            System::DurableNullLog => Running::Null(NullConsumer::start(
                dir,
                dnull_threads(),
                Contract::DurableLog,
            )?),
            System::Roost => Running::Roost(Roost::start_with(dir, ResultSync::Fsync)?),
            System::RoostSyncfs => Running::Roost(Roost::start_with(dir, ResultSync::Syncfs)?),
            System::Sqlite => Running::Sqlite(Peer::start(dir)?),
        })
    }

    /// What its closed-loop clients check. Roost promises a committed batch's input gone by
    /// the time its result appears (README, "Spool"), and its claim, recorded under the
    /// file's name, lets recovery publish the result again after a power loss. The null
    /// consumers and the SQLite peer have nothing that could, so they remove the input only
    /// once the result is durable: one more thing they leave out of roost's contract.
    fn checks(&self) -> Checks {
        match self {
            Running::Roost(_) => Checks::ResultAndInputGone,
            _ => Checks::Result,
        }
    }

    fn spool(&self) -> &Path {
        match self {
            Running::Null(n) => &n.spool,
            Running::Roost(r) => &r.spool,
            Running::Sqlite(p) => &p.spool,
        }
    }
}

/// Roost's own counters, as differences over the burst (its durability tail included).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counters {
    pub committed: u64,
    pub wal_syncs: u64,
    pub rounds: u64,
    pub published: u64,
    pub shard_txns: u64,
    pub shard_flushes: u64,
    pub audit_syncs: u64,
}

impl Counters {
    pub(crate) fn read(r: &Roost) -> Counters {
        let e = &r.engine;
        let f = e.figures();
        let (wal_syncs, audit_syncs) = (f.wal_syncs, f.audit_syncs);
        let (rounds, published) = (f.result_rounds, f.results_published);
        Counters {
            committed: e.stats.committed.load(Ordering::Relaxed),
            wal_syncs,
            rounds,
            published,
            shard_txns: e.stats.shard_txns.load(Ordering::Relaxed),
            shard_flushes: e.stats.shard_flushes.load(Ordering::Relaxed),
            audit_syncs,
        }
    }

    pub(crate) fn since(self, b: Counters) -> Counters {
        Counters {
            committed: self.committed - b.committed,
            wal_syncs: self.wal_syncs - b.wal_syncs,
            rounds: self.rounds - b.rounds,
            published: self.published - b.published,
            shard_txns: self.shard_txns - b.shard_txns,
            shard_flushes: self.shard_flushes - b.shard_flushes,
            audit_syncs: self.audit_syncs - b.audit_syncs,
        }
    }

    /// Syncs per committed batch: WAL, shard flush rounds (an msync each when the shard has
    /// unflushed frames, so an upper bound), audit log, and the result files' (one fdatasync
    /// per file, or one syncfs per round) and `out/`'s (one per round).
    pub(crate) fn syncs_per_batch(&self, mode: ResultSync) -> f64 {
        let results = match mode {
            ResultSync::Fsync => self.published,
            ResultSync::Syncfs => self.rounds,
        };
        let all = self.wal_syncs + self.shard_flushes + self.audit_syncs + results + self.rounds;
        all as f64 / self.committed.max(1) as f64
    }
}

/// Waits (bounded) until roost has nothing in flight: the burst's durability tail is done.
pub(crate) fn settle(r: &Roost) {
    let until = Instant::now() + Duration::from_secs(10);
    while r.engine.stats.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
}

/// What one system did in one round on one file system.
#[derive(Clone, Debug, Default)]
struct Figures {
    burst: f64,
    /// Batches/s per client count, in `Sizes::clients` order.
    clients: Vec<f64>,
    counters: Option<Counters>,
    /// The durable-null's (`out/` rounds, results, log syncs, log records) over the burst.
    dnull_rounds: Option<(u64, u64, u64, u64)>,
    /// Device flush requests per batch: the burst, then each client count (`NAN` off a
    /// loop device).
    flushes: Vec<f64>,
}

/// Device flush requests per batch over `work` (which returns its batches), on a loop
/// device that counts them; `NAN` elsewhere.
fn flushes_per_batch<T>(
    mount: Option<&LoopMount>,
    work: impl FnOnce() -> anyhow::Result<(T, usize)>,
) -> anyhow::Result<(T, f64)> {
    let before = mount.and_then(LoopMount::flush_requests);
    let (out, batches) = work()?;
    let after = mount.and_then(LoopMount::flush_requests);
    let per = match (before, after) {
        (Some(b), Some(a)) if batches > 0 => (a - b) as f64 / batches as f64,
        _ => f64::NAN,
    };
    Ok((out, per))
}

/// One system on a started spool: the burst (checked), the uncounted warm-up, the cells.
fn measure(run: &Running, sz: &Sizes, mount: Option<&LoopMount>) -> anyhow::Result<Figures> {
    let spool = run.spool();
    let before = match run {
        Running::Roost(r) => Some(Counters::read(r)),
        _ => None,
    };
    let (rounds0, log0) = match run {
        Running::Null(n) => (n.round_stats(), n.log_stats()),
        _ => ((0, 0), (0, 0)),
    };
    // Roost's flushes over the burst include its durability tail (`settle`), done after
    // the last answer; in the cells each cell's tail falls in the next.
    let (b, burst_flushes) = flushes_per_batch(mount, || {
        let b: BurstRun = burst_timed(spool, sz.burst, &WORK)?;
        if let Running::Roost(r) = run {
            settle(r);
        }
        Ok((b, sz.burst))
    })?;
    let mut flushes = vec![burst_flushes];
    let dnull_rounds = match run {
        Running::Null(n) if n.round_stats() != (0, 0) => {
            let (r, p) = n.round_stats();
            let (ls, lr) = n.log_stats();
            Some((r - rounds0.0, p - rounds0.1, ls - log0.0, lr - log0.1))
        }
        _ => None,
    };
    // Settled above: the counters include the burst's durability tail.
    let counters = match (run, before) {
        (Running::Roost(r), Some(c0)) => Some(Counters::read(r).since(c0)),
        _ => None,
    };
    check_burst(spool, &b, WORK.ops).context("burst results")?;
    clear_out(spool);
    // SQLite's first commit after a burst checkpoints the WAL it left (seconds): not counted.
    closed_loop(spool, 1, Duration::from_secs(1).min(sz.cell), &WORK)?;
    let mut clients = Vec::new();
    for &c in &sz.clients {
        let (rate, per) = flushes_per_batch(mount, || {
            let (rate, lat) = closed_loop_checked(spool, c, sz.cell, &WORK, run.checks())?;
            anyhow::ensure!(!lat.is_empty(), "no batch finished with {c} clients");
            Ok((rate, lat.len()))
        })?;
        clients.push(rate);
        flushes.push(per);
    }
    Ok(Figures {
        burst: b.rate,
        clients,
        counters,
        dnull_rounds,
        flushes,
    })
}

/// Where a run's files go: a fresh journaled image at `dir`, or `dir` itself.
struct Place {
    mount: Option<LoopMount>,
    dir: PathBuf,
}

impl Place {
    fn make(fs: Fs, dir: &Path, sz: &Sizes) -> anyhow::Result<Place> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let mount = match fs {
            Fs::Journaled => Some(LoopMount::eager(dir, sz.image_bytes)?),
            Fs::Plain => None,
        };
        let root = mount.as_ref().map_or(dir.to_path_buf(), |m| m.dir.clone());
        Ok(Place {
            mount,
            dir: root.join("data"),
        })
    }
}

/// One system, one round, one file system, on fresh ground; everything removed after.
fn run_one(
    base: &Path,
    fs: Fs,
    sys: System,
    round: usize,
    sz: &Sizes,
    null_threads: usize,
) -> anyhow::Result<Figures> {
    let dir = base.join(format!("r{round}-{fs}-{sys}"));
    let place = Place::make(fs, &dir, sz)?;
    let figures = {
        let run = Running::start(sys, &place.dir, null_threads)
            .with_context(|| format!("start {sys} on {}", place.dir.display()))?;
        measure(&run, sz, place.mount.as_ref())
            .with_context(|| format!("{sys} on {fs}, round {round}"))
    };
    // The system is stopped (dropped) before its file system goes.
    drop(place.mount);
    let _ = std::fs::remove_dir_all(&dir);
    figures
}

/// The durable-null consumer's threads: `ROOST_BENCH_DNULL_THREADS`, else [`DNULL_THREADS`].
pub(crate) fn dnull_threads() -> usize {
    std::env::var("ROOST_BENCH_DNULL_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(DNULL_THREADS)
}

/// The null consumer's thread count: `ROOST_BENCH_NULL_THREADS`, or the best median burst of
/// [`NULL_THREADS`] on fresh ground (journaled if allowed), printed.
fn pick_null_threads(base: &Path, fs: Fs, sz: &Sizes) -> anyhow::Result<usize> {
    if let Some(n) = std::env::var("ROOST_BENCH_NULL_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
    {
        println!("null consumer: {n} threads (ROOST_BENCH_NULL_THREADS)");
        return Ok(n);
    }
    let reps = if sz.quick { 1 } else { 3 };
    let mut rates: Vec<(usize, Vec<f64>)> = NULL_THREADS.iter().map(|&t| (t, vec![])).collect();
    for rep in 0..reps {
        for k in 0..rates.len() {
            let i = (k + rep) % rates.len();
            let t = rates[i].0;
            let dir = base.join(format!("null-threads-{t}"));
            let place = Place::make(fs, &dir, sz)?;
            let rate = {
                let n = NullConsumer::start(&place.dir, t, Contract::Nothing)?;
                let b = burst_timed(&n.spool, sz.burst, &WORK)?;
                check_burst(&n.spool, &b, WORK.ops).context("null consumer's burst")?;
                b.rate
            };
            drop(place.mount);
            let _ = std::fs::remove_dir_all(&dir);
            rates[i].1.push(rate);
        }
    }
    let med: Vec<(usize, f64)> = rates.iter().map(|(t, v)| (*t, median(v))).collect();
    let best = med
        .iter()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(1, |(t, _)| t);
    let shown: Vec<String> = rates
        .iter()
        .map(|(t, v)| format!("{t} threads {:.0} ({})", median(v), fmt_rates(v)))
        .collect();
    println!(
        "null consumer, burst of {} on {fs}: {}; using {best}",
        sz.burst,
        shown.join(", ")
    );
    Ok(best)
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(crate) fn fmt_rates(v: &[f64]) -> String {
    v.iter()
        .map(|r| format!("{r:.0}"))
        .collect::<Vec<_>>()
        .join("/")
}

/// Every round's figures: (round, fs, system) -> figures.
type Results = Vec<(usize, Fs, System, Figures)>;

/// `--ceiling`: calibration, the rounds, the table.
pub fn run() -> anyhow::Result<()> {
    let sz = sizes();
    let base = bench_base("target/bench-ceiling");
    clear_stale(&base);
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let fss = file_systems()?;
    let systems = systems()?;
    println!(
        "roost ceiling benchmark in {}: {} rounds on {:?}; burst of {} files, closed-loop clients {:?} for {:?} each; batches of {} creates of ~{} B",
        base.display(), sz.rounds, fss, sz.burst, sz.clients, sz.cell, WORK.ops, WORK.record_bytes
    );
    for &fs in &fss {
        raw_sync(&base, fs, &sz)?;
    }
    let null_threads = if systems.contains(&System::Null) {
        pick_null_threads(&base, fss[0], &sz)?
    } else {
        0
    };
    let mut all: Results = Vec::new();
    for round in 0..sz.rounds {
        let mut fs_order = fss.clone();
        let k = round % fs_order.len();
        fs_order.rotate_left(k);
        for fs in fs_order {
            let mut order = systems.clone();
            let k = round % order.len();
            order.rotate_left(k);
            for sys in order {
                let f = run_one(&base, fs, sys, round, &sz, null_threads)?;
                print_run(round, fs, sys, &f, &sz);
                all.push((round, fs, sys, f));
            }
        }
    }
    for &fs in &fss {
        print_table(&all, fs, &sz, null_threads);
    }
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}

/// `ROOST_BENCH_SYSTEMS` (names, comma-separated), else all four.
fn systems() -> anyhow::Result<Vec<System>> {
    let Ok(list) = std::env::var("ROOST_BENCH_SYSTEMS") else {
        return Ok(SYSTEMS.to_vec());
    };
    list.split(',')
        .map(|name| {
            SYSTEMS
                .iter()
                .copied()
                .find(|s| s.to_string() == name.trim())
                .with_context(|| format!("ROOST_BENCH_SYSTEMS: no system {name:?} (null, durable-null, durable-null-log, roost, roost-syncfs, sqlite)"))
        })
        .collect()
}

/// The file systems to run on: both as root (or the one `ROOST_BENCH_FS` names); only the
/// plain one with `ROOST_ALLOW_NO_ROOT=1`.
fn file_systems() -> anyhow::Result<Vec<Fs>> {
    if is_root() {
        return Ok(match std::env::var("ROOST_BENCH_FS").as_deref() {
            Ok("journaled") => vec![Fs::Journaled],
            Ok("plain") => vec![Fs::Plain],
            _ => vec![Fs::Journaled, Fs::Plain],
        });
    }
    if std::env::var_os("ROOST_ALLOW_NO_ROOT").is_some() {
        println!("not root: the journaled ext4 runs are skipped (ROOST_ALLOW_NO_ROOT=1)");
        return Ok(vec![Fs::Plain]);
    }
    bail!("--ceiling loop-mounts ext4 images and needs root (ROOST_ALLOW_NO_ROOT=1 runs the plain directory only)")
}

/// What one sync costs on fresh ground of `fs` (`synccost.rs`: one second of each loop,
/// quick 0.2), printed.
fn raw_sync(base: &Path, fs: Fs, sz: &Sizes) -> anyhow::Result<()> {
    let dir = base.join(format!("raw-{fs}"));
    let place = Place::make(fs, &dir, sz)?;
    let secs = if sz.quick { 0.2 } else { 1.0 };
    let costs = sync_costs(&place.dir, Duration::from_secs_f64(secs))
        .with_context(|| format!("raw syncs on {fs}"));
    drop(place.mount);
    let _ = std::fs::remove_dir_all(&dir);
    let shown: Vec<String> = costs?
        .iter()
        .map(|(what, r)| format!("{what} {r:.0}/s"))
        .collect();
    println!("raw syncs, {fs}, one thread: {}", shown.join(", "));
    Ok(())
}

fn print_run(round: usize, fs: Fs, sys: System, f: &Figures, sz: &Sizes) {
    let cells: Vec<String> = sz
        .clients
        .iter()
        .zip(&f.clients)
        .map(|(c, r)| format!("{c} clients {r:.0}"))
        .collect();
    let dnull = f.dnull_rounds.map_or(String::new(), |(r, p, ls, lr)| {
        let log = match ls {
            0 => String::new(),
            _ => format!(", {:.1} records per log sync", lr as f64 / ls as f64),
        };
        format!(
            "; burst: {:.1} results per out/ round{log}",
            p as f64 / r.max(1) as f64
        )
    });
    let extra = f.counters.map_or(dnull, |c| {
        format!(
            "; burst: {:.1} batches per WAL sync, {:.1} results per out/ round",
            c.committed as f64 / c.wal_syncs.max(1) as f64,
            c.published as f64 / c.rounds.max(1) as f64
        )
    });
    println!(
        "round {round} {fs:>9} {sys:<12} burst {:.0}, {}{extra}",
        f.burst,
        cells.join(", ")
    );
}

/// One measure of one system on `fs`, every round in round order.
fn series(all: &Results, fs: Fs, sys: System, pick: &dyn Fn(&Figures) -> f64) -> Vec<f64> {
    all.iter()
        .filter(|(_, f, s, _)| *f == fs && *s == sys)
        .map(|(_, _, _, x)| pick(x))
        .collect()
}

/// `a / b` round by round (the two ran minutes apart at most), then the median.
fn ratio(a: &[f64], b: &[f64]) -> String {
    let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    let rounds: Vec<String> = r.iter().map(|x| format!("{x:.2}")).collect();
    format!("**{:.2}** ({})", median(&r), rounds.join("/"))
}

/// Columns: each system run, then these ratios where both systems ran.
const RATIOS: [(System, System, &str); 7] = [
    (System::Roost, System::DurableNull, "roost / durable-null"),
    (
        System::Roost,
        System::DurableNullLog,
        "roost / durable-null + log",
    ),
    (
        System::RoostSyncfs,
        System::DurableNull,
        "roost syncfs / durable-null",
    ),
    (System::Roost, System::Null, "roost / ceiling"),
    (System::DurableNull, System::Null, "durable-null / ceiling"),
    (System::Roost, System::Sqlite, "roost / SQLite"),
    (System::RoostSyncfs, System::Roost, "syncfs / fsync"),
];

fn heading(sys: System) -> &'static str {
    match sys {
        System::Null => "null (ceiling)",
        System::DurableNull => "durable-null",
        System::DurableNullLog => "durable-null + log",
        System::Roost => "roost",
        System::RoostSyncfs => "roost syncfs",
        System::Sqlite => "SQLite peer",
    }
}

fn print_table(all: &Results, fs: Fs, sz: &Sizes, null_threads: usize) {
    let ran: Vec<System> = SYSTEMS
        .into_iter()
        .filter(|s| all.iter().any(|(_, f, x, _)| *f == fs && x == s))
        .collect();
    let ratios: Vec<_> = RATIOS
        .iter()
        .filter(|(a, b, _)| ran.contains(a) && ran.contains(b))
        .collect();
    println!();
    println!("{fs} file system, batches/s, median over {} rounds (each round's figure in brackets; ratios are the median of each round's ratio); null consumer with {null_threads} threads (0: not run), durable-null with {}", sz.rounds, dnull_threads());
    let mut head: Vec<&str> = ran.iter().map(|s| heading(*s)).collect();
    head.extend(ratios.iter().map(|r| r.2));
    println!("| measure | {} |", head.join(" | "));
    println!("|---{}|", "|---".repeat(head.len()));
    // None: the burst; Some(i): the i-th client count.
    let mut rows = vec![(format!("burst of {} files", sz.burst), None)];
    for (i, c) in sz.clients.iter().enumerate() {
        rows.push((format!("{c} closed-loop clients"), Some(i)));
    }
    for (name, which) in &rows {
        let pick = |f: &Figures| match which {
            None => f.burst,
            Some(i) => f.clients.get(*i).copied().unwrap_or(f64::NAN),
        };
        let s = |sys| series(all, fs, sys, &pick);
        let mut cells: Vec<String> = ran
            .iter()
            .map(|sys| {
                let v = s(*sys);
                format!("{:.0} ({})", median(&v), fmt_rates(&v))
            })
            .collect();
        cells.extend(ratios.iter().map(|(a, b, _)| ratio(&s(*a), &s(*b))));
        println!("| {name} | {} |", cells.join(" | "));
    }
    if fs == Fs::Journaled {
        print_flushes(all, &ran, &rows);
    }
    print_counters(all, fs);
}

/// The journaled image's device flush requests per batch, median over rounds: the physical
/// cost each system pays for its durability, beside its rate.
fn print_flushes(all: &Results, ran: &[System], rows: &[(String, Option<usize>)]) {
    println!();
    println!("device flush requests per batch on the journaled image (the loop device's count), median over rounds");
    let head: Vec<&str> = ran.iter().map(|s| heading(*s)).collect();
    println!("| measure | {} |", head.join(" | "));
    println!("|---{}|", "|---".repeat(head.len()));
    for (name, which) in rows {
        let at = which.map_or(0, |i| i + 1);
        let pick = |f: &Figures| f.flushes.get(at).copied().unwrap_or(f64::NAN);
        let cells: Vec<String> = ran
            .iter()
            .map(|sys| format!("{:.2}", median(&series(all, Fs::Journaled, *sys, &pick))))
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
}

/// Roost's own counters over the burst, median over rounds.
fn print_counters(all: &Results, fs: Fs) {
    println!();
    println!("roost during the burst on {fs} (its own counters, median over rounds)");
    println!("| | batches per WAL sync | results per out/ round | shard txns per batch | shard flush rounds per batch | audit syncs per batch | syncs per batch, at most |");
    println!("|---|---|---|---|---|---|---|");
    for (sys, mode) in [
        (System::Roost, ResultSync::Fsync),
        (System::RoostSyncfs, ResultSync::Syncfs),
    ] {
        let per = |f: &dyn Fn(&Counters) -> f64| {
            let v: Vec<f64> = all
                .iter()
                .filter(|(_, x, s, _)| *x == fs && *s == sys)
                .filter_map(|(_, _, _, x)| x.counters.as_ref().map(f))
                .collect();
            median(&v)
        };
        if !all.iter().any(|(_, x, s, _)| *x == fs && *s == sys) {
            continue;
        }
        let b = |c: &Counters| c.committed.max(1) as f64;
        println!(
            "| {sys} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} |",
            per(&|c| b(c) / c.wal_syncs.max(1) as f64),
            per(&|c| c.published as f64 / c.rounds.max(1) as f64),
            per(&|c| c.shard_txns as f64 / b(c)),
            per(&|c| c.shard_flushes as f64 / b(c)),
            per(&|c| c.audit_syncs as f64 / b(c)),
            per(&|c| c.syncs_per_batch(mode)),
        );
    }
}
