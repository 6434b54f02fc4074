//! `roost-bench --intake` (issue 16, part 2): the same 10-op batches handed to roost one file
//! per batch and in bulk files of 1,000 lines, against the SQLite peer fed the same lines
//! (one transaction per batch, `synchronous=FULL`), beside the disk's own limits measured in
//! the same run: fdatasyncs per second and sequential write bandwidth. For roost it also
//! prints batches per WAL fdatasync, and for 4 KiB records the WAL's bytes per second as a
//! fraction of the sequential bandwidth. Rounds alternate roost and the peer; medians are
//! printed. Nothing is asserted about time; every result is checked (one result line per
//! batch line, each committed).
//!
//! `ROOST_BENCH_QUICK=1` makes it tiny; `ROOST_BENCH_DIR` puts the files elsewhere.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use roost_benchkit::{bench_base, raw_bandwidth, raw_fdatasync, SyncFile};

use crate::spool::{burst, Workload};
use crate::Roost;

/// Lines per bulk file.
const LINES: usize = 1_000;

struct Sizes {
    batches: usize,
    rounds: usize,
}

fn sizes() -> Sizes {
    if std::env::var_os("ROOST_BENCH_QUICK").is_some() {
        Sizes {
            batches: 2_000,
            rounds: 1,
        }
    } else {
        Sizes {
            batches: 20_000,
            rounds: 3,
        }
    }
}

/// One batch's JSON line.
fn line(key: &str, w: &Workload) -> Vec<u8> {
    crate::spool::body(key, w)
}

/// `n` batches as bulk files of [`LINES`] lines: (name, lines).
fn bulk_files(tag: &str, n: usize, w: &Workload) -> Vec<(String, Vec<Vec<u8>>)> {
    (0..n.div_ceil(LINES))
        .map(|f| {
            let lines = (f * LINES..((f + 1) * LINES).min(n))
                .map(|i| line(&format!("{tag}-{i}"), w))
                .collect();
            (format!("{tag}-{f}.jsonl"), lines)
        })
        .collect()
}

/// What one roost bulk run measured.
struct BulkRun {
    rate: f64,
    per_sync: f64,
    wal_mb_per_sec: f64,
}

/// Drops every bulk file at once (written to `tmp/`, renamed into `new/`), waits for every
/// `out/NAME`, checks each holds one committed result per line.
fn roost_bulk(r: &Roost, files: &[(String, Vec<Vec<u8>>)]) -> anyhow::Result<BulkRun> {
    let sp = &r.spool;
    for (name, lines) in files {
        std::fs::write(sp.join("tmp").join(name), lines.join(&b'\n'))
            .with_context(|| format!("write {name}"))?;
    }
    let (_, s0) = r.engine.wal_stats();
    let c0 = r.engine.stats.committed.load(Ordering::Relaxed);
    let b0 = r.engine.wal().append_bytes();
    let start = Instant::now();
    for (name, _) in files {
        std::fs::rename(sp.join("tmp").join(name), sp.join("new").join(name))?;
    }
    let until = start + Duration::from_secs(600);
    for (name, lines) in files {
        let out = sp.join("out").join(name);
        while !out.exists() {
            ensure!(Instant::now() < until, "{name}: no result after 600 s");
            std::thread::sleep(Duration::from_millis(2));
        }
        check_result(&out, lines.len())?;
    }
    let el = start.elapsed().as_secs_f64();
    let (_, s1) = r.engine.wal_stats();
    let c1 = r.engine.stats.committed.load(Ordering::Relaxed);
    let b1 = r.engine.wal().append_bytes();
    crate::spool::clear_out(sp);
    let n: usize = files.iter().map(|f| f.1.len()).sum();
    Ok(BulkRun {
        rate: n as f64 / el,
        per_sync: (c1 - c0) as f64 / (s1 - s0).max(1) as f64,
        wal_mb_per_sec: (b1 - b0) as f64 / el / 1e6,
    })
}

/// A bulk result: `lines` result lines, each committed.
fn check_result(path: &Path, lines: usize) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let got: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    ensure!(
        got.len() == lines,
        "{}: {} result lines for {lines} batches",
        path.display(),
        got.len()
    );
    for l in got {
        let v: serde_json::Value =
            serde_json::from_str(l).with_context(|| format!("{}: {l}", path.display()))?;
        ensure!(v["status"] == "committed", "{}: {l}", path.display());
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// `roost-bench --intake`.
pub fn run() -> anyhow::Result<()> {
    let sz = sizes();
    let base = bench_base("target/bench-intake");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let sync = raw_fdatasync(
        &base.join("raw-sync"),
        1200,
        Duration::from_secs(2),
        SyncFile::Append,
    )?;
    let bandwidth = raw_bandwidth(&base.join("raw-bw"), 256 << 20)?;
    println!(
        "roost intake benchmark in {}: {} ten-op batches per run, {} rounds\nraw disk: {:.0} fdatasync/s, {bandwidth:.0} MB/s sequential",
        base.display(), sz.batches, sz.rounds, sync.ops_per_sec
    );
    let small = Workload {
        ops: 10,
        record_bytes: 100,
    };
    let large = Workload {
        ops: 10,
        record_bytes: 4096,
    };
    let (mut files, mut bulk, mut peer, mut per_sync) = (vec![], vec![], vec![], vec![]);
    for round in 0..sz.rounds {
        let r = Roost::start(&base.join(format!("roost{round}")))?;
        files.push(burst(&r.spool, sz.batches / 4, &small)?);
        let b = roost_bulk(&r, &bulk_files(&format!("b{round}"), sz.batches, &small))?;
        bulk.push(b.rate);
        per_sync.push(b.per_sync);
        drop(r);
        let p = crate::peer::bulk(
            &base.join(format!("sqlite{round}")),
            &bulk_files(&format!("p{round}"), sz.batches, &small),
        )?;
        peer.push(p);
        println!(
            "round {round}: roost files {:.0}/s, roost bulk {:.0}/s ({:.0} batches per WAL fdatasync), sqlite bulk {p:.0}/s",
            files[round], b.rate, b.per_sync
        );
    }
    let r = Roost::start(&base.join("roost-4k"))?;
    let big = roost_bulk(&r, &bulk_files("k", sz.batches / 4, &large))?;
    drop(r);
    print_table(&[
        ("roost, one file per batch", median(files), None),
        (
            "roost, bulk files of 1,000",
            median(bulk.clone()),
            Some(median(per_sync)),
        ),
        ("SQLite peer, same lines", median(peer.clone()), None),
    ]);
    println!(
        "\nroost bulk / SQLite peer: {:.1}x\n4 KiB records in bulk: {:.0} batches/s, WAL {:.0} MB/s = {:.2} of the {bandwidth:.0} MB/s sequential bandwidth",
        median(bulk) / median(peer).max(1e-9),
        big.rate,
        big.wal_mb_per_sec,
        big.wal_mb_per_sec / bandwidth.max(1e-9)
    );
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}

fn print_table(rows: &[(&str, f64, Option<f64>)]) {
    println!("\n| intake | batches/s (median) | batches per WAL fdatasync |");
    println!("|---|---|---|");
    for (name, rate, ps) in rows {
        let ps = ps.map_or("-".to_owned(), |p| format!("{p:.0}"));
        println!("| {name} | {rate:.0} | {ps} |");
    }
}
