//! `roost-bench --records` (issue 44, "memory and restart that do not grow with the records
//! kept"): a real `roost serve` (`ROOST_BIN`, or the `roost` beside this binary) on a fresh
//! data directory with the default configuration is fed bulk files of single-op create
//! batches (unique request keys, no deletes) until its shards hold `ROOST_BENCH_RECORDS` live
//! records (default 100M), spread over `ROOST_BENCH_SHARDS` shards (default 1; line `l` goes
//! to shard `s<l % shards>`). Two files are in flight; each is written to `spool/tmp`,
//! fsynced, renamed into `spool/new`, its result checked (every line committed) and deleted.
//!
//! It reports: the fill's time; bulk throughput over the first [`RATE_FILES`] files (an empty
//! store) and the last ones (at N); the largest VmRSS seen while the last files were
//! answered, with `status.memory`. Then, for the filling binary and for `ROOST_BIN_COMPARE`
//! if set (say, the main branch's `roost`, measured on the same data directory): kill -9 and
//! the time until a fresh `serve` answers `status` and one new batch commits; SIGTERM and the
//! same; VmRSS and `status.memory` after that restart; then the page cache dropped (root
//! only, else the figures are marked warm) and [`GETS`] (`ROOST_BENCH_GETS`) `roost get` of
//! random ids made in the fill, one process each, each answer checked, p50/p99.
//!
//! Rows go to stdout and to `ROOST_RECORDS_CSV` (default `target/bench-records/records.csv`),
//! appended. `ROOST_BENCH_QUICK=1`: 20,000 records in files of 2,000 lines. The data
//! directory (in `ROOST_BENCH_DIR`, default `target/bench-records`) is removed after the run
//! unless `ROOST_BENCH_KEEP` is set. No figure is asserted; every answer is checked.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use roost_benchkit::bench_base;
use serde_json::Value;

use crate::keys::{connect_stream, deliver, drop_caches, quantile, rss_kib, Daemon, LIMIT};

/// Throughput is over this many files at the start (empty store) and at the end (N records).
const RATE_FILES: usize = 10;
/// `roost get` calls timed after each restart (`ROOST_BENCH_GETS` to change).
const GETS: usize = 200;
/// (shard, id, record's `n`) sampled from the fill for the gets.
const SAMPLE: usize = 4096;

struct Fill {
    lines: usize,
    files: usize,
    shards: usize,
    /// (lines, when answered) per file, from the start.
    done: Vec<(usize, Instant)>,
    peak_rss_kib: u64,
    sample: Vec<(usize, u64, usize)>,
    seen: u64,
    rng: u64,
}

impl Fill {
    fn next_rand(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn file_text(&self, f: usize) -> String {
        let mut text = String::with_capacity(self.lines * 100);
        for l in 0..self.lines {
            let n = f * self.lines + l;
            let s = l % self.shards;
            text.push_str(&format!(
                r#"{{"request_key":"r{n}","ops":[{{"op":"create","shard":"s{s}","record":{{"n":{n}}}}}]}}"#
            ));
            text.push('\n');
        }
        text
    }

    /// Batches per second over files `from..to` of the fill.
    fn rate(&self, from: usize, to: usize) -> f64 {
        let (from, to) = (from.min(self.done.len() - 1), to.min(self.done.len() - 1));
        let lines: usize = self.done[from + 1..=to].iter().map(|x| x.0).sum();
        let secs = self.done[to].1.duration_since(self.done[from].1);
        lines as f64 / secs.as_secs_f64().max(1e-9)
    }
}

fn env_num(name: &str, quick: usize, full: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("{name}={v:?} is not a number")),
        Err(_) if std::env::var_os("ROOST_BENCH_QUICK").is_some() => Ok(quick),
        Err(_) => Ok(full),
    }
}

/// Waits for file `name`'s result, checks every line committed, samples its creates.
fn finish(d: &mut Daemon, fill: &mut Fill, f: usize, name: &str) -> anyhow::Result<()> {
    let out = d.spool().join("out").join(name);
    let t = Instant::now();
    while !out.exists() {
        if let Some(st) = d.child.exited()? {
            anyhow::bail!("roost serve exited ({st}) with {name} in flight");
        }
        ensure!(t.elapsed() < LIMIT, "{name}: no result within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let text = std::fs::read_to_string(&out).with_context(|| format!("read {}", out.display()))?;
    let mut n = 0;
    for (l, a) in text.lines().filter(|l| !l.is_empty()).enumerate() {
        let v: Value = serde_json::from_str(a).with_context(|| format!("{name}: {a}"))?;
        ensure!(v["status"] == "committed", "{name}: {a}");
        let id = v["ops"][0]["id"].as_u64().context("no create id")?;
        fill.seen += 1;
        let slot = if fill.sample.len() < SAMPLE {
            None
        } else {
            match (fill.next_rand() % fill.seen) as usize {
                j if j < SAMPLE => Some(j),
                _ => {
                    n += 1;
                    continue;
                }
            }
        };
        let s = (l % fill.shards, id, f * fill.lines + l);
        match slot {
            Some(j) => fill.sample[j] = s,
            None => fill.sample.push(s),
        }
        n += 1;
    }
    ensure!(
        n == fill.lines,
        "{name}: {n} results for {} lines",
        fill.lines
    );
    std::fs::remove_file(&out).with_context(|| format!("remove {}", out.display()))?;
    fill.done.push((n, Instant::now()));
    if fill.done.len() + RATE_FILES > fill.files {
        fill.peak_rss_kib = fill.peak_rss_kib.max(rss_kib(d.child.id())?.0);
    }
    Ok(())
}

fn fill_store(d: &mut Daemon, fill: &mut Fill) -> anyhow::Result<()> {
    let mut in_flight = std::collections::VecDeque::new();
    for f in 0..fill.files {
        let name = format!("rec-{f:07}.jsonl");
        deliver(&d.spool(), &name, &fill.file_text(f))?;
        in_flight.push_back((f, name));
        if in_flight.len() >= 2 {
            if let Some((g, n)) = in_flight.pop_front() {
                finish(d, fill, g, &n)?;
            }
        }
    }
    while let Some((g, n)) = in_flight.pop_front() {
        finish(d, fill, g, &n)?;
    }
    Ok(())
}

/// One new batch over the stream socket, until its answer says committed.
fn commit_one(d: &Daemon, key: &str) -> anyhow::Result<()> {
    let stream = connect_stream(&d.dir.join("stream.sock"))?;
    stream.set_read_timeout(Some(LIMIT))?;
    let mut w = stream.try_clone().context("clone the stream socket")?;
    let line = format!(
        r#"{{"request_key":"{key}","ops":[{{"op":"create","shard":"s0","record":{{}}}}]}}"#
    );
    w.write_all(format!("{line}\n").as_bytes())?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer)?;
    ensure!(answer.contains("\"committed\""), "answer {answer}");
    Ok(())
}

/// Restarts with `bin` (the old process gone): ms until `status` answers and until a batch
/// commits.
fn restart(d: &mut Daemon, bin: &Path, key: &str) -> anyhow::Result<(f64, f64)> {
    d.bin = bin.to_path_buf();
    let t = Instant::now();
    let status = d.restart()?;
    commit_one(d, key)?;
    Ok((status.as_secs_f64() * 1e3, t.elapsed().as_secs_f64() * 1e3))
}

/// `roost get` of sampled ids, one process each: latencies in ms, sorted.
fn gets(d: &Daemon, bin: &Path, fill: &mut Fill) -> anyhow::Result<Vec<f64>> {
    let n = env_num("ROOST_BENCH_GETS", GETS, GETS)?;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n.min(fill.sample.len()) {
        let pick = (fill.next_rand() % fill.sample.len() as u64) as usize;
        let (s, id, n) = fill.sample[pick];
        let t = Instant::now();
        let out = std::process::Command::new(bin)
            .args(["get", &format!("s{s}"), &id.to_string(), "--data-dir"])
            .arg(&d.dir)
            .output()
            .context("run roost get")?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && text.contains(&format!("\"n\":{n}")),
            "roost get s{s} {id}: {} {text}",
            out.status
        );
    }
    lat.sort_by(f64::total_cmp);
    Ok(lat)
}

fn memory(d: &Daemon) -> String {
    let m = d.status().map(|s| s["memory"].clone()).unwrap_or_default();
    let mib = |k: &str| m[k].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64;
    format!(
        "shard_index {:.0} MiB, rss_file {:.0} MiB, other {:.0} MiB",
        mib("shard_index_bytes"),
        mib("rss_file_bytes"),
        mib("other_bytes")
    )
}

/// The restarts and gets with `bin` on the filled store; one CSV row.
fn measure(d: &mut Daemon, bin: &Path, fill: &mut Fill, tag: &str) -> anyhow::Result<String> {
    d.child.kill();
    let (kill_status, kill_commit) = restart(d, bin, &format!("{tag}-after-kill"))?;
    let st = d.child.stop(LIMIT)?;
    ensure!(st.success(), "roost serve stopped with {st}");
    let (term_status, term_commit) = restart(d, bin, &format!("{tag}-after-term"))?;
    let (rss, anon) = rss_kib(d.child.id())?;
    let mem = memory(d);
    let cold = drop_caches();
    let lat = gets(d, bin, fill)?;
    println!(
        "{tag} ({}): kill -9 restart {kill_status:.0} ms to status, {kill_commit:.0} ms to a commit; \
SIGTERM restart {term_status:.0} / {term_commit:.0} ms; after restart VmRSS {} MiB (anon {} MiB), {mem}; \
roost get p50 {:.1} ms p99 {:.1} ms ({})",
        bin.display(),
        rss / 1024,
        anon / 1024,
        quantile(&lat, 0.5),
        quantile(&lat, 0.99),
        if cold.is_ok() { "cold" } else { "warm" }
    );
    Ok(format!(
        "{tag},{},{},{kill_status:.0},{kill_commit:.0},{term_status:.0},{term_commit:.0},{},{},{:.2},{:.2},{}",
        fill.files * fill.lines,
        fill.shards,
        rss,
        anon,
        quantile(&lat, 0.5),
        quantile(&lat, 0.99),
        cold.is_ok() as u8
    ))
}

/// `--records`: fill, measure, print and append the CSV rows.
pub fn run() -> anyhow::Result<()> {
    let records = env_num("ROOST_BENCH_RECORDS", 20_000, 100_000_000)?;
    let shards = env_num("ROOST_BENCH_SHARDS", 1, 1)?.max(1);
    let lines = env_num("ROOST_BENCH_LINES", 2_000, 100_000)?.max(1);
    let bin = crate::replication::roost_bin()?;
    let compare = std::env::var_os("ROOST_BIN_COMPARE").map(PathBuf::from);
    let root = bench_base("target/bench-records");
    let base = root.join("records");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let mut fill = Fill {
        lines,
        files: records.div_ceil(lines),
        shards,
        done: vec![(0, Instant::now())],
        peak_rss_kib: 0,
        sample: Vec::new(),
        seen: 0,
        rng: 0x1234_5678,
    };
    let mut d = Daemon::start(&bin, &base)?;
    fill.done = vec![(0, Instant::now())];
    fill_store(&mut d, &mut fill)?;
    let secs = fill.done[fill.done.len() - 1]
        .1
        .duration_since(fill.done[0].1);
    let (empty, at_n) = (
        fill.rate(0, RATE_FILES),
        fill.rate(fill.files.saturating_sub(RATE_FILES), fill.files),
    );
    println!(
        "filled {} records on {shards} shard(s) in {:.0} s with {}: {empty:.0} batches/s empty, {at_n:.0} at N ({:.2}); \
peak VmRSS while answering {} MiB; {}",
        fill.files * lines,
        secs.as_secs_f64(),
        bin.display(),
        at_n / empty,
        fill.peak_rss_kib / 1024,
        memory(&d)
    );
    let csv = std::env::var_os("ROOST_RECORDS_CSV")
        .map_or_else(|| root.join("records.csv"), PathBuf::from);
    let mut rows = vec![format!(
        "fill,{},{shards},{:.0},{empty:.0},{at_n:.0},{},,,,,,",
        fill.files * lines,
        secs.as_secs_f64(),
        fill.peak_rss_kib
    )];
    rows.push(measure(&mut d, &bin, &mut fill, "this")?);
    if let Some(other) = &compare {
        rows.push(measure(&mut d, other, &mut fill, "compare")?);
    }
    let st = d.child.stop(LIMIT)?;
    ensure!(st.success(), "roost serve stopped with {st}");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&csv)
        .with_context(|| format!("open {}", csv.display()))?;
    for r in rows {
        writeln!(f, "{r}").with_context(|| format!("write {}", csv.display()))?;
    }
    println!("csv: {}", csv.display());
    if std::env::var_os("ROOST_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}
