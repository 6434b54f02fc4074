//! `roost-bench --pg` (issue 47): PostgreSQL 15 as a peer of roost's stream socket, both on
//! the same fresh journaled ext4 image (`loopfs.rs`; one per round), beside the image's raw
//! fdatasync rates (appending, and overwriting written blocks). The same batches (10 creates
//! of ~100 B, a unique request key each) go to both from closed-loop clients in Rust, each a
//! thread with its own connection and one batch outstanding, for a fixed time per cell, after
//! one uncounted second of one client: roost's through `cluster/clients.rs`'s stream client
//! against the bench's in-process `roost serve` (default settings), PostgreSQL's as one call
//! of the server-side function `apply_batch` (the idempotency-key pattern: `pg/server.rs`)
//! per batch, on a server the bench starts itself (`fsync` and `synchronous_commit` on,
//! `shared_buffers = 256MB`) and stops at the end.
//!
//! Checked (the run fails otherwise): every roost answer is committed for its key; every
//! PostgreSQL answer is committed for its key with 10 distinct ids; once per run a second
//! call with an answered key returns the same answer; after each cell the server holds one
//! stored answer and 10 records per batch answered. No timing is asserted.
//!
//! `ROOST_BENCH_ROUNDS` (3; quick 1), `ROOST_BENCH_SECS` (the cell, 5 s; quick 1 s),
//! `ROOST_BENCH_DIR` (default `target/bench-pg`), `ROOST_BENCH_QUICK=1` (CI: one round, one
//! second per cell, and the plain directory if no image can be made, said in the output).

mod server;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context};
use roost_benchkit::{bench_base, raw_fdatasync, SyncFile};

use crate::ceiling::{fmt_rates, median};
use crate::cluster::clients::stream_closed_loop;
use crate::loopfs::{clear_stale, is_root, LoopMount};
use crate::spool::{body, Workload};
use crate::Roost;
use server::{PgServer, CALL};

/// The batches: 10 creates of ~100 B over 4 shards, as every other bench.
const WORK: Workload = Workload {
    ops: 10,
    record_bytes: 100,
};
/// Closed-loop client counts.
const CLIENTS: [usize; 4] = [1, 4, 16, 64];
/// The image: sparse, so only what is written takes room (roost preallocates ~400 MiB, the
/// PostgreSQL cluster and its WAL take a few hundred MiB more).
const IMAGE_BYTES: u64 = 4 << 30;
/// Batches one PostgreSQL client sends at most in a cell (a bound on the loop).
const PG_BATCHES_MAX: usize = 1_000_000;

struct Sizes {
    quick: bool,
    cell: Duration,
    rounds: usize,
}

fn sizes() -> Sizes {
    let quick = std::env::var_os("ROOST_BENCH_QUICK").is_some();
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<f64>().ok());
    Sizes {
        quick,
        cell: Duration::from_secs_f64(env("ROOST_BENCH_SECS").unwrap_or(if quick {
            1.0
        } else {
            5.0
        })),
        rounds: env("ROOST_BENCH_ROUNDS")
            .map(|r| r.max(1.0) as usize)
            .unwrap_or(if quick { 1 } else { 3 }),
    }
}

/// One round's figures: per client count (in [`CLIENTS`] order), batches/s of each.
#[derive(Default)]
struct Round {
    roost: Vec<f64>,
    pg: Vec<f64>,
    /// The image's raw fdatasync rate, 1.2 KB appended per sync (the bench's raw figure).
    fdatasync: f64,
    /// The same over written blocks of a small file (a pure data overwrite: one device
    /// flush per sync, nothing for the journal; what a preallocated log can reach).
    overwrite: f64,
}

/// Where a round runs: a fresh journaled image, or (quick, no image possible) a directory.
struct Place {
    dir: PathBuf,
    _mount: Option<LoopMount>,
}

impl Place {
    fn make(base: &Path, quick: bool) -> anyhow::Result<Place> {
        let made = if is_root() {
            LoopMount::eager(base, IMAGE_BYTES)
        } else {
            Err(anyhow!("not root"))
        };
        match made {
            Ok(m) => {
                println!(
                    "fresh journaled ext4 image {} on {}",
                    m.device(),
                    m.dir.display()
                );
                Ok(Place {
                    dir: m.dir.clone(),
                    _mount: Some(m),
                })
            }
            Err(e) if quick => {
                let dir = base.join("plain");
                println!("NOT on a journaled image ({e:#}): on the plain directory {} (ROOST_BENCH_QUICK)", dir.display());
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("create {}", dir.display()))?;
                Ok(Place { dir, _mount: None })
            }
            Err(e) => Err(e.context("--pg runs on a fresh journaled ext4 image and needs root")),
        }
    }
}

/// `--pg`: the rounds, then the table.
pub fn run() -> anyhow::Result<()> {
    let sz = sizes();
    let base = bench_base("target/bench-pg");
    clear_stale(&base);
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    println!(
        "roost vs PostgreSQL 15 in {}: {} rounds, closed-loop clients {CLIENTS:?} for {:?} each; batches of {} creates of ~{} B",
        base.display(), sz.rounds, sz.cell, WORK.ops, WORK.record_bytes
    );
    let mut rounds = Vec::new();
    for r in 0..sz.rounds {
        let round = one_round(&base.join(format!("round{r}")), r, &sz)
            .with_context(|| format!("round {r}"))?;
        println!(
            "round {r}: roost {}/s, PostgreSQL {}/s, raw fdatasync {:.0}/s appending, {:.0}/s overwriting",
            fmt_rates(&round.roost),
            fmt_rates(&round.pg),
            round.fdatasync,
            round.overwrite
        );
        rounds.push(round);
    }
    print_table(&rounds);
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}

/// A fresh place; its raw fdatasync rate; then PostgreSQL's cells and roost's (the order
/// alternates with the round), each system alone on the image while it is measured.
fn one_round(dir: &Path, r: usize, sz: &Sizes) -> anyhow::Result<Round> {
    let place = Place::make(dir, sz.quick)?;
    let (append, overwrite) = raw_syncs(&place.dir, sz)?;
    let mut round = Round {
        fdatasync: append,
        overwrite,
        ..Round::default()
    };
    let even = r.is_multiple_of(2);
    for pg_first in [even, !even] {
        if pg_first {
            round.pg = pg_cells(&place.dir.join("pg"), r, sz)?;
        } else {
            round.roost = roost_cells(&place.dir.join("roost"), sz)?;
        }
    }
    Ok(round)
}

/// One uncounted client before the cells of each system (a fresh server's first batches
/// pay for its start: caches, the first WAL segment): a second, quick 0.2 s.
fn warm_up(sz: &Sizes) -> Duration {
    Duration::from_secs_f64(if sz.quick { 0.2 } else { 1.0 })
}

/// The image's raw fdatasync rates, one writer of 1.2 KB per sync: appending, and
/// overwriting the first 100 writes' blocks again and again (each file removed after).
fn raw_syncs(dir: &Path, sz: &Sizes) -> anyhow::Result<(f64, f64)> {
    let dur = Duration::from_secs_f64(if sz.quick { 0.5 } else { 2.0 });
    let rate = |name: &str, file: SyncFile| {
        let path = dir.join(name);
        let r = raw_fdatasync(&path, 1200, dur, file)
            .with_context(|| format!("raw fdatasync on {}", path.display()));
        let _ = std::fs::remove_file(&path);
        r.map(|r| r.ops_per_sec)
    };
    let append = rate("raw-append", SyncFile::Append)?;
    let overwrite = rate(
        "raw-overwrite",
        SyncFile::Preallocated {
            file_bytes: 1200 * 100,
            wrap_bytes: 1200 * 100,
        },
    )?;
    Ok((append, overwrite))
}

fn roost_cells(dir: &Path, sz: &Sizes) -> anyhow::Result<Vec<f64>> {
    let roost = Roost::start(dir)?;
    let socket = dir.join("stream.sock");
    stream_closed_loop(&socket, 1, warm_up(sz), &WORK).context("roost, the warm-up")?;
    let mut rates = Vec::new();
    for c in CLIENTS {
        let rate = stream_closed_loop(&socket, c, sz.cell, &WORK)
            .with_context(|| format!("roost, {c} stream clients"))?;
        rates.push(rate);
    }
    drop(roost);
    Ok(rates)
}

fn pg_cells(dir: &Path, r: usize, sz: &Sizes) -> anyhow::Result<Vec<f64>> {
    let server = PgServer::start(dir)?;
    let (_, mut answered) = pg_closed_loop(&server, &format!("pg{r}-warm"), 1, warm_up(sz))
        .context("PostgreSQL, the warm-up")?;
    let mut rates = Vec::new();
    for c in CLIENTS {
        let (rate, n) = pg_closed_loop(&server, &format!("pg{r}-{c}"), c, sz.cell)
            .with_context(|| format!("PostgreSQL, {c} clients"))?;
        answered += n;
        check_stored(&server, answered)?;
        rates.push(rate);
    }
    if r == 0 {
        check_idempotent(&server, &format!("pg{r}-1-0-0"))?;
    }
    Ok(rates)
}

/// `clients` threads, each with its own connection (made before the clock starts), calling
/// `apply_batch` for batches `{tag}-{client}-{i}` one at a time for `dur`. Batches per
/// second over all, and how many were answered.
fn pg_closed_loop(
    server: &PgServer,
    tag: &str,
    clients: usize,
    dur: Duration,
) -> anyhow::Result<(f64, usize)> {
    let conns = (0..clients)
        .map(|_| server.connect())
        .collect::<anyhow::Result<Vec<_>>>()?;
    let ready = Barrier::new(clients + 1);
    let total = AtomicUsize::new(0);
    let (ready, total_ref) = (&ready, &total);
    let start = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(i, conn)| {
                s.spawn(move || {
                    ready.wait();
                    let n = pg_client(conn, &format!("{tag}-{i}"), dur)?;
                    total_ref.fetch_add(n, Ordering::Relaxed);
                    Ok::<_, anyhow::Error>(())
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        for h in handles {
            h.join()
                .map_err(|_| anyhow!("a PostgreSQL client thread panicked"))??;
        }
        Ok::<_, anyhow::Error>(start)
    })?;
    let n = total.load(Ordering::Relaxed);
    Ok((n as f64 / start.elapsed().as_secs_f64(), n))
}

/// One connection's closed loop; how many batches were answered (each checked).
fn pg_client(mut conn: postgres::Client, tag: &str, dur: Duration) -> anyhow::Result<usize> {
    let stmt = conn.prepare(CALL).context("prepare apply_batch")?;
    let start = Instant::now();
    let mut sent = 0;
    while sent < PG_BATCHES_MAX && start.elapsed() < dur {
        let key = format!("{tag}-{sent}");
        let line = String::from_utf8(body(&key, &WORK)).context("a batch body")?;
        let row = conn
            .query_one(&stmt, &[&line])
            .with_context(|| format!("apply_batch for {key}"))?;
        let answer: String = row
            .try_get(0)
            .with_context(|| format!("the answer to {key}"))?;
        check_answer(&answer, &key)?;
        sent += 1;
    }
    Ok(sent)
}

/// An answer: committed, for `key`, with `WORK.ops` distinct ids.
fn check_answer(answer: &str, key: &str) -> anyhow::Result<()> {
    let v: serde_json::Value =
        serde_json::from_str(answer).with_context(|| format!("the answer to {key}: {answer}"))?;
    ensure!(v["status"] == "committed", "the answer to {key}: {answer}");
    ensure!(
        v["request_key"] == key,
        "the answer to {key} names another key: {answer}"
    );
    let mut ids: Vec<i64> = v["ids"]
        .as_array()
        .with_context(|| format!("the answer to {key} has no ids: {answer}"))?
        .iter()
        .filter_map(serde_json::Value::as_i64)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ensure!(
        ids.len() == WORK.ops,
        "the answer to {key} has {} distinct ids, not {}: {answer}",
        ids.len(),
        WORK.ops
    );
    Ok(())
}

/// The server holds one stored answer and `WORK.ops` records and audit rows per batch
/// answered so far.
fn check_stored(server: &PgServer, answered: usize) -> anyhow::Result<()> {
    let mut c = server.connect()?;
    let row = c
        .query_one(
            "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM records), \
             (SELECT count(*) FROM audit)",
            &[],
        )
        .context("count the stored rows")?;
    let got: Vec<i64> = (0..3)
        .map(|i| row.try_get(i))
        .collect::<Result<_, _>>()
        .context("read the counts")?;
    let want = [answered, answered * WORK.ops, answered * WORK.ops].map(|n| n as i64);
    ensure!(
        got == want,
        "PostgreSQL holds requests/records/audit rows {got:?} after {answered} answered batches, not {want:?}"
    );
    Ok(())
}

/// A second call with an answered key returns the same answer, and stores nothing more.
fn check_idempotent(server: &PgServer, key: &str) -> anyhow::Result<()> {
    let mut c = server.connect()?;
    let stored: String = c
        .query_one(
            "SELECT answer::text FROM requests WHERE request_key = $1",
            &[&key],
        )
        .with_context(|| format!("the stored answer to {key}"))?
        .try_get(0)
        .with_context(|| format!("the stored answer to {key}"))?;
    let before: i64 = c
        .query_one("SELECT count(*) FROM records", &[])
        .and_then(|r| r.try_get(0))
        .context("count records")?;
    let line = String::from_utf8(body(key, &WORK)).context("a batch body")?;
    let again: String = c
        .query_one(CALL, &[&line])
        .and_then(|r| r.try_get(0))
        .with_context(|| format!("apply_batch again for {key}"))?;
    let after: i64 = c
        .query_one("SELECT count(*) FROM records", &[])
        .and_then(|r| r.try_get(0))
        .context("count records")?;
    if again != stored || after != before {
        bail!("a second call for {key} answered {again} ({} records after, {before} before), not the stored {stored}", after);
    }
    println!(
        "idempotency checked: a second call for {key} returned its stored answer, nothing stored"
    );
    Ok(())
}

/// The table: medians over rounds, each round's figure beside.
fn print_table(rounds: &[Round]) {
    let sync: Vec<f64> = rounds.iter().map(|r| r.fdatasync).collect();
    let over: Vec<f64> = rounds.iter().map(|r| r.overwrite).collect();
    println!("\n| clients | roost batches/s | PostgreSQL batches/s | roost / PG | raw fdatasync/s, appending | raw fdatasync/s, overwriting |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for (i, c) in CLIENTS.iter().enumerate() {
        let roost: Vec<f64> = rounds.iter().map(|r| r.roost[i]).collect();
        let pg: Vec<f64> = rounds.iter().map(|r| r.pg[i]).collect();
        let ratios: Vec<String> = roost
            .iter()
            .zip(&pg)
            .map(|(a, b)| format!("{:.2}", a / b))
            .collect();
        println!(
            "| {c} | {:.0} ({}) | {:.0} ({}) | {:.2}x ({}) | {:.0} ({}) | {:.0} ({}) |",
            median(&roost),
            fmt_rates(&roost),
            median(&pg),
            fmt_rates(&pg),
            median(&roost) / median(&pg),
            ratios.join("/"),
            median(&sync),
            fmt_rates(&sync),
            median(&over),
            fmt_rates(&over)
        );
    }
}
