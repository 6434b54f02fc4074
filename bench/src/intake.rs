//! `roost-bench --intake` (issue 16, part 2): the same 10-op batches handed to roost one file
//! per batch, in bulk files of 1,000 lines and over the stream socket with 1, 4 and 64
//! connections, against the SQLite peer fed the same lines
//! (one transaction per batch, `synchronous=FULL`), beside the disk's own limits measured in
//! the same run: fdatasyncs per second and sequential write bandwidth. For roost it also
//! prints batches per WAL fdatasync, and for 4 KiB records the WAL's bytes per second as a
//! fraction of the sequential bandwidth. Rounds alternate roost and the peer; medians are
//! printed, and the stream's p50/p99 latency at half its 4-connection peak (an open loop on
//! one connection). Nothing is asserted about time; every result is checked (one result line
//! per batch line, each committed).
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
            batches: 1_000,
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
    let s0 = r.engine.figures().wal_syncs;
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
    let s1 = r.engine.figures().wal_syncs;
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

/// Stream connection counts measured.
const CONNS: [usize; 3] = [1, 4, 64];

/// Every batch's line for a stream run tagged `tag`.
fn stream_lines(tag: &str, n: usize, w: &Workload) -> Vec<Vec<u8>> {
    (0..n).map(|i| line(&format!("{tag}-{i}"), w)).collect()
}

/// Per connection count: roost batches/s, batches per WAL fdatasync, peer batches/s, one
/// figure per round.
type StreamRow = (usize, Vec<f64>, Vec<f64>, Vec<f64>);

/// One round of the stream cells, roost then the peer for each connection count.
fn stream_round(base: &Path, round: usize, n: usize, rows: &mut [StreamRow]) -> anyhow::Result<()> {
    let w = Workload {
        ops: 10,
        record_bytes: 100,
    };
    for row in rows.iter_mut() {
        let c = row.0;
        let dir = base.join(format!("roost-s{round}-{c}"));
        let r = Roost::start(&dir)?;
        let s0 = r.engine.figures().wal_syncs;
        let c0 = r.engine.stats.committed.load(Ordering::Relaxed);
        let lines = stream_lines(&format!("s{round}-{c}"), n, &w);
        let rate = crate::stream::burst(&dir.join("stream.sock"), &lines, c)?;
        let s1 = r.engine.figures().wal_syncs;
        let c1 = r.engine.stats.committed.load(Ordering::Relaxed);
        drop(r);
        let per_sync = (c1 - c0) as f64 / (s1 - s0).max(1) as f64;
        let peer_lines = stream_lines(&format!("q{round}-{c}"), n, &w);
        let p = crate::peer::stream(&base.join(format!("sqlite-s{round}-{c}")), &peer_lines, c)?;
        println!("round {round}: stream x{c}: roost {rate:.0}/s ({per_sync:.0} per WAL fdatasync), sqlite {p:.0}/s");
        row.1.push(rate);
        row.2.push(per_sync);
        row.3.push(p);
    }
    Ok(())
}

/// p50/p99 of the stream at `rate` (one connection, an open loop).
fn stream_latency(base: &Path, n: usize, rate: f64) -> anyhow::Result<(f64, f64)> {
    let w = Workload {
        ops: 10,
        record_bytes: 100,
    };
    let dir = base.join("roost-latency");
    let r = Roost::start(&dir)?;
    let lat = crate::stream::open_loop(&dir.join("stream.sock"), &stream_lines("lat", n, &w), rate);
    drop(r);
    lat
}

/// Per round: one file per batch, bulk files, and the peer on the same bulk lines.
#[derive(Default)]
struct FileRounds {
    files: Vec<f64>,
    bulk: Vec<f64>,
    peer: Vec<f64>,
    per_sync: Vec<f64>,
}

fn file_rounds(base: &Path, sz: &Sizes, small: &Workload) -> anyhow::Result<FileRounds> {
    let mut fr = FileRounds::default();
    for round in 0..sz.rounds {
        let r = Roost::start(&base.join(format!("roost{round}")))?;
        let files = burst(&r.spool, sz.batches / 4, small)?;
        let b = roost_bulk(&r, &bulk_files(&format!("b{round}"), sz.batches, small))?;
        drop(r);
        let p = crate::peer::bulk(
            &base.join(format!("sqlite{round}")),
            &bulk_files(&format!("p{round}"), sz.batches, small),
        )?;
        println!(
            "round {round}: roost files {files:.0}/s, roost bulk {:.0}/s ({:.0} batches per WAL fdatasync), sqlite bulk {p:.0}/s",
            b.rate, b.per_sync
        );
        fr.files.push(files);
        fr.bulk.push(b.rate);
        fr.per_sync.push(b.per_sync);
        fr.peer.push(p);
    }
    Ok(fr)
}

/// The table's rows, medians of the rounds: label, roost's batches/s, batches per WAL
/// fdatasync, the SQLite peer's batches/s (none for one file per batch).
fn table_rows(
    files: Vec<f64>,
    (bulk, per_sync, peer): (Vec<f64>, Vec<f64>, Vec<f64>),
    srows: &[StreamRow],
) -> Vec<(String, f64, Option<f64>, Option<f64>)> {
    let mut rows = vec![
        (
            "roost, one file per batch".to_owned(),
            median(files),
            None,
            None,
        ),
        (
            "roost, bulk files of 1,000".to_owned(),
            median(bulk),
            Some(median(per_sync)),
            Some(median(peer)),
        ),
    ];
    for (c, rate, ps, p) in srows {
        rows.push((
            format!("roost, stream x{c}"),
            median(rate.clone()),
            Some(median(ps.clone())),
            Some(median(p.clone())),
        ));
    }
    rows
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
    let FileRounds {
        files,
        bulk,
        peer,
        per_sync,
    } = file_rounds(&base, &sz, &small)?;
    let mut srows: Vec<StreamRow> = CONNS.iter().map(|&c| (c, vec![], vec![], vec![])).collect();
    for round in 0..sz.rounds {
        stream_round(&base, round, sz.batches, &mut srows)?;
    }
    let peak4 = srows
        .iter()
        .find(|r| r.0 == 4)
        .map_or(0.0, |r| median(r.1.clone()));
    let (p50, p99) = stream_latency(&base, sz.batches / 4, peak4 / 2.0)?;
    let r = Roost::start(&base.join("roost-4k"))?;
    let big = roost_bulk(&r, &bulk_files("k", sz.batches / 4, &large))?;
    drop(r);
    let rows = table_rows(files, (bulk.clone(), per_sync, peer.clone()), &srows);
    print_table(&rows);
    println!("\nstream latency at {:.0} batches/s (half the 4-connection peak), one connection: p50 {p50:.1} ms, p99 {p99:.1} ms", peak4 / 2.0);
    println!(
        "\nroost bulk / SQLite peer: {:.1}x\n4 KiB records in bulk: {:.0} batches/s, WAL {:.0} MB/s = {:.2} of the {bandwidth:.0} MB/s sequential bandwidth",
        median(bulk) / median(peer).max(1e-9),
        big.rate,
        big.wal_mb_per_sec,
        big.wal_mb_per_sec / bandwidth.max(1e-9)
    );
    if std::env::var_os("ROOST_BENCH_QUICK").is_none() {
        let svg =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/bench-intake.svg");
        let bars: Vec<crate::intake_plot::Bar> =
            rows.iter().map(|r| (r.0.clone(), r.1, r.3)).collect();
        crate::intake_plot::plot(&svg, &bars, sync.ops_per_sec)?;
        println!("\nplot: {}", svg.display());
    }
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}

/// (intake, roost batches/s, batches per WAL fdatasync, SQLite peer batches/s on the same
/// lines).
fn print_table(rows: &[(String, f64, Option<f64>, Option<f64>)]) {
    println!("\n| intake | roost batches/s (median) | batches per WAL fdatasync | SQLite peer, same lines | roost / peer |");
    println!("|---|---|---|---|---|");
    for (name, rate, ps, peer) in rows {
        let ps = ps.map_or("-".to_owned(), |p| format!("{p:.0}"));
        let (p, x) = peer.map_or(("-".to_owned(), "-".to_owned()), |p| {
            (format!("{p:.0}"), format!("{:.1}x", rate / p.max(1e-9)))
        });
        println!("| {name} | {rate:.0} | {ps} | {p} | {x} |");
    }
}
