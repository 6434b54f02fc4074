//! `roost-bench`: one flag per benchmark, and the in-process daemon they share ([`Roost`]).
//! Without a flag, `cargo run --release -p roost-bench` is the end-to-end run
//! (`end_to_end.rs`): roost through the spool beside a SQLite spool consumer at the same
//! durability and the raw disk, one table and `docs/bench-throughput.svg`.
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
//! restart times, duplicate latency and throughput at milestones on the way;
//! `--closed-loop` is the probe for profiling one cell (`probe.rs`); `--pg` is issue 47's
//! PostgreSQL peer on the stream's closed loops (`pg.rs`); `--instructions` counts the
//! instructions per batch of each intake with callgrind (`instructions.rs`).
#![forbid(unsafe_code)]

mod ceiling;
mod cluster;
mod compaction;
mod end_to_end;
mod instructions;
mod intake;
mod intake_plot;
mod keys;
mod keys_plot;
mod loopfs;
mod null;
mod peer;
mod pg;
mod probe;
mod profile;
mod replication;
mod shard_gets;
mod soak;
mod spool;
mod stream;
mod synccost;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use roost::config::Config;
use roost::pipeline::crash::NoCrash;
use roost::pipeline::{Engine, EngineOptions};
use roost_benchkit::{bench_base, rss_anon_kib};
use roost_storage::RealStorage;

/// The allocator the `roost` binary uses (daemon/src/main.rs): roost runs in this process,
/// and so does the SQLite peer, which gets it too.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A daemon under test: `roost serve` in this process, stopped gracefully at drop.
pub struct Roost {
    pub engine: Arc<Engine>,
    pub spool: PathBuf,
    stop: Arc<tokio::sync::Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the engine on the real disk over `dir` opens with (spool in `dir/spool`), with `cfg`
/// pointed at `dir`.
fn engine_options(dir: &Path, cfg: Config) -> EngineOptions {
    EngineOptions {
        storage: RealStorage::shared(),
        config: Arc::new(Config {
            data_dir: dir.to_path_buf(),
            ..cfg
        }),
        crash: Arc::new(NoCrash),
        log_role: std::sync::Arc::new(roost::replica::Opener::default()),
    }
}

/// The engine on the real disk over `dir` (spool in `dir/spool`), with `cfg` pointed at `dir`.
pub fn open_engine(dir: &Path, cfg: Config) -> Result<Engine, roost::error::EngineError> {
    Engine::open(engine_options(dir, cfg))
}

/// [`open_engine`] with the replication state opened beside it, as `roost serve` holds them.
pub fn open_node(
    dir: &Path,
    cfg: Config,
) -> Result<roost::replica::Node, roost::error::EngineError> {
    roost::replica::Node::open(engine_options(dir, cfg), &|_, _, _| {})
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
        let node = open_node(dir, cfg)?;
        let engine = node.engine.clone();
        let stop = Arc::new(tokio::sync::Notify::new());
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            if let Err(err) = roost::serve::serve_until(node, s) {
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
    let records: usize = engine.shards().figures().values().map(|f| f.records).sum();
    let after = rss_anon_kib();
    println!("{ms:.0} {records} {}", after.saturating_sub(before));
    Ok(())
}

pub(crate) fn bench_dir() -> PathBuf {
    bench_base("target/bench-e2e")
}

/// `roost-bench --stream-load SOCKET CLIENTS SECS`: closed-loop stream clients (batches of
/// 10 creates of ~100 B, keys new to any daemon) against a running daemon's stream socket,
/// for `perf` and `strace` beside a daemon of one's own; prints the rate.
fn stream_load(args: &[String]) -> anyhow::Result<()> {
    let usage = "--stream-load SOCKET CLIENTS SECS";
    let socket = Path::new(args.first().context(usage)?);
    let clients = args.get(1).and_then(|s| s.parse().ok()).context(usage)?;
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).context(usage)?;
    let w = spool::Workload {
        ops: 10,
        record_bytes: 100,
    };
    let dur = Duration::from_secs_f64(secs);
    let rate = cluster::clients::stream_closed_loop(socket, clients, dur, &w)?;
    println!("{clients} stream clients: {rate:.0} batches/s");
    Ok(())
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
        Some("--shard-gets") => return shard_gets::main(&args[2..]),
        Some("--compaction-latency") => return compaction::run(),
        Some("--ceiling") => return ceiling::run(),
        Some("--ceiling-profile") => return profile::run(&args[2..]),
        Some("--soak") => return soak::soak(),
        Some("--replication") => return replication::run(),
        Some("--cluster") => return cluster::run(),
        Some("--null-pair") => return cluster::run_null_pair(),
        Some("--intake") => return intake::run(),
        Some("--pg") => return pg::run(),
        Some("--instructions") => return instructions::run(),
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
        Some("--stream-load") => return stream_load(&args[2..]),
        Some("--closed-loop") => {
            let clients = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
            let secs = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5.0);
            let burst_first = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(0);
            return probe::run(clients, Duration::from_secs_f64(secs), burst_first);
        }
        Some(_) => {
            eprintln!("usage: roost-bench [--ceiling | --stream-load SOCKET CLIENTS SECS | --ceiling-profile [N] [fsync|syncfs] | --soak | --replication | --cluster | --null-pair | --intake | --pg | --keys | --soak-report CSV | --soak-restart NAME DIR N] (ROOST_BENCH_QUICK=1 for tiny sizes, ROOST_BENCH_DIR=DIR for the files, ROOST_SOAK_BATCHES=N for the soak's length, ROOST_SOAK_SAMPLES=N, ROOST_SOAK_RUNS=retention|no-retention, ROOST_SOAK_CSV=PATH)");
            std::process::exit(2);
        }
        None => {}
    }
    end_to_end::run()
}
