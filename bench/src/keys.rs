//! `roost-bench --keys` (issue 25, "memory and restart that do not grow with time"): a real
//! `roost serve` (the `roost` binary beside this one, or `ROOST_BIN`) on a fresh data
//! directory with the default configuration (no configuration file: the default 24 h
//! request-key window and checkpoint settings; sockets in the data directory) is fed bulk
//! files of single-batch lines, each under a new request key, until the window holds
//! `ROOST_BENCH_KEYS` live keys (default 100M). Each line creates one record and deletes the
//! record the same line of the file [`DEPTH`] files earlier created (its id read from that
//! file's result), so live records stay bounded (about `DEPTH` files' worth) while live keys
//! grow. [`DEPTH`] files are kept in flight; each file is written to `spool/tmp`, fsynced and
//! renamed into `spool/new` (the directory fsynced), its result read, checked (every line
//! committed) and deleted.
//!
//! At each milestone (1M, 2M, 5M, 10M, 20M, 50M, 100M keys, those below the target, and the
//! target) the files in flight are drained and it records: the daemon's VmRSS and RssAnon, the
//! live keys `roost status --json` reports, the data directory's allocated bytes and the key
//! table's; the bulk throughput of the last [`RATE_FILES`] files before it; then a kill -9
//! and the time from spawn until the control socket answers `status` (the WAL since the last
//! checkpoint replayed) and one new batch, a create on one of the shards in turn sent over
//! the stream socket, is committed (issue 44: a shard opens on first use, so the first
//! commit pays for its open), then SIGTERM (the graceful stop's time is recorded too: it
//! checkpoints) and the same restart time, the fresh daemon's VmRSS; then the page cache is
//! dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`, root only; without it the figure is
//! marked warm) and [`DUPS`] duplicates of random earlier lines (a uniform sample over every
//! line sent, the exact bytes sent) go one at a time over the stream socket: each answer must
//! equal the line's first result (without its `"line"`), and p50/p99 of their latency is
//! reported. The "empty window" baseline is the throughput of the first stretch, after the
//! first [`DEPTH`] files (which delete nothing).
//!
//! Writes `docs/keys-window.csv` (a row as each milestone is measured) and
//! `docs/keys-window.svg`; `ROOST_KEYS_CSV=PATH` writes them elsewhere (the plot beside it).
//! `ROOST_KEYS_RECORDS=1` is issue 44's records mode: lines only create (nothing is deleted),
//! so live records grow with live keys, over `ROOST_KEYS_SHARDS` shards (default 4); it
//! writes `docs/records.csv` by default. Every milestone also prints `status.memory`.
//!
//! `ROOST_BENCH_QUICK=1` makes it tiny (20,000 keys in files of 2,000 lines) and writes both
//! into `ROOST_BENCH_DIR` (default `target/bench-keys`, on the real disk; the daemon's data
//! directory and logs go in its `keys/`, removed after the run unless `ROOST_BENCH_KEEP` is
//! set). No figure is asserted; every answer is checked.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use roost::drill::child::ServeChild;
use roost_benchkit::bench_base;
use serde_json::Value;

use crate::keys_plot::{plot, Row};

/// Bulk files in flight at once (the daemon works on up to `bulk_files_in_flight_max`, 4).
const DEPTH: usize = 2;
/// The throughput at a milestone is over this many files before it (fewer if the stretch
/// since the last milestone is shorter).
const RATE_FILES: usize = 10;
/// Shards the records spread over (line `l` uses shard `l % shards`), unless
/// `ROOST_KEYS_SHARDS` says otherwise.
const SHARDS: usize = 4;
/// Lines kept for duplicates: a uniform sample over every line sent.
const RESERVOIR: usize = 4096;
/// Duplicates sent at each milestone (one at a time).
const DUPS: usize = 200;
/// Bound on every wait: a file's result, a start, a stop, an answer.
const LIMIT: Duration = Duration::from_secs(1800);

struct Sizes {
    quick: bool,
    /// `ROOST_KEYS_RECORDS=1` (issue 44): every line only creates, so live records grow with
    /// live keys; the CSV goes to `docs/records.csv` by default.
    records: bool,
    shards: usize,
    lines: usize,
    /// Files done at each milestone (each milestone's keys rounded up to whole files).
    milestones: Vec<usize>,
    dups: usize,
}

fn sizes() -> anyhow::Result<Sizes> {
    let quick = std::env::var_os("ROOST_BENCH_QUICK").is_some();
    let target: u64 = match std::env::var("ROOST_BENCH_KEYS") {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("ROOST_BENCH_KEYS={v:?} is not a number"))?,
        Err(_) if quick => 20_000,
        Err(_) => 100_000_000,
    };
    ensure!(target > 0, "ROOST_BENCH_KEYS must be > 0");
    let (lines, marks): (usize, &[u64]) = if quick {
        (2_000, &[6_000])
    } else {
        let m = 1_000_000;
        (100_000, &[m, 2 * m, 5 * m, 10 * m, 20 * m, 50 * m, 100 * m])
    };
    let mut milestones: Vec<usize> = marks
        .iter()
        .copied()
        .filter(|&m| m < target)
        .chain([target])
        .map(|m| m.div_ceil(lines as u64) as usize)
        .collect();
    milestones.dedup();
    let shards = match std::env::var("ROOST_KEYS_SHARDS") {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("ROOST_KEYS_SHARDS={v:?} is not a number"))?,
        Err(_) => SHARDS,
    };
    ensure!(shards > 0, "ROOST_KEYS_SHARDS must be > 0");
    Ok(Sizes {
        quick,
        records: std::env::var_os("ROOST_KEYS_RECORDS").is_some_and(|v| v == "1"),
        shards,
        lines,
        milestones,
        dups: if quick { 50 } else { DUPS },
    })
}

/// The daemon under test and where it keeps things.
struct Daemon {
    bin: PathBuf,
    base: PathBuf,
    dir: PathBuf,
    child: ServeChild,
    starts: usize,
    /// Shards the records spread over: each restart's first batch creates on the next.
    shards: usize,
}

impl Daemon {
    /// Starts `roost serve` on `dir` (no configuration file) and waits until it answers.
    fn start(bin: &Path, base: &Path, shards: usize) -> anyhow::Result<Daemon> {
        let dir = base.join("data");
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let (child, _) = spawn_ready(bin, &dir, &base.join("serve-0.log"))?;
        Ok(Daemon {
            bin: bin.to_path_buf(),
            base: base.to_path_buf(),
            dir,
            child,
            starts: 1,
            shards,
        })
    }

    fn spool(&self) -> PathBuf {
        self.dir.join("spool")
    }

    fn status(&self) -> anyhow::Result<Value> {
        let sock = self.dir.join("roost.sock");
        let text = roost::control::socket::request(&sock, "status")
            .with_context(|| format!("status over {}", sock.display()))?;
        serde_json::from_str(&text).with_context(|| format!("status JSON: {text}"))
    }

    /// Starts it again (the old process must be gone): the time until `status` answers and
    /// a new batch is committed.
    fn restart(&mut self) -> anyhow::Result<Duration> {
        let log = self.base.join(format!("serve-{}.log", self.starts));
        let shard = self.starts % self.shards;
        let key = format!("restart-{}-{}", std::process::id(), self.starts);
        self.starts += 1;
        let (child, ready) = spawn_ready(&self.bin, &self.dir, &log)?;
        self.child = child;
        let t = Instant::now();
        let line = format!(
            r#"{{"request_key":"{key}","ops":[{{"op":"create","shard":"s{shard}","record":{{}}}}]}}"#
        );
        let answer = one_answer(&self.dir.join("stream.sock"), &line)?;
        ensure!(
            answer["status"] == "committed",
            "the first batch after a restart: {answer}"
        );
        let commit = t.elapsed();
        eprintln!(
            "  restart: status after {:.0} ms, the first batch committed {:.0} ms later",
            ready.as_secs_f64() * 1e3,
            commit.as_secs_f64() * 1e3
        );
        Ok(ready + commit)
    }

    /// kill -9, then the restart's time and the WAL records it replayed.
    fn kill_restart(&mut self) -> anyhow::Result<(Duration, u64)> {
        self.child.kill();
        let took = self.restart()?;
        let replayed = self.status()?["recovery"]["records_replayed"]
            .as_u64()
            .context("status without recovery.records_replayed")?;
        Ok((took, replayed))
    }

    /// SIGTERM, then the restart's time; also how long the stop took.
    fn graceful_restart(&mut self) -> anyhow::Result<(Duration, Duration)> {
        let t = Instant::now();
        let st = self.child.stop(LIMIT)?;
        ensure!(
            st.success(),
            "roost serve stopped with {st}; log {}",
            self.child.log_path().display()
        );
        let stop = t.elapsed();
        Ok((stop, self.restart()?))
    }
}

/// Spawns `roost serve` and polls its control socket until it answers `status` (recovery is
/// done by then: the socket is bound after it): the daemon and the time from spawn.
fn spawn_ready(bin: &Path, dir: &Path, log: &Path) -> anyhow::Result<(ServeChild, Duration)> {
    let sock = dir.join("roost.sock");
    let t = Instant::now();
    let mut child = ServeChild::spawn(bin, dir, log, |c| {
        c.env_remove("RUNTIME_DIRECTORY");
    })?;
    loop {
        if roost::control::socket::request(&sock, "status").is_ok() {
            return Ok((child, t.elapsed()));
        }
        if let Some(st) = child.exited()? {
            bail!("roost serve exited ({st}) at start; log {}", log.display());
        }
        ensure!(
            t.elapsed() < LIMIT,
            "roost serve did not answer status within {LIMIT:?}; log {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// VmRSS and RssAnon of process `pid`, KiB.
fn rss_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{path} has no {name}"))
    };
    Ok((field("VmRSS:")?, field("RssAnon:")?))
}

/// A line sent, with its first answer (the result line without `"line"`).
struct Sent {
    line: String,
    answer: Value,
}

/// A bulk file in flight.
struct InFlight {
    name: String,
    text: String,
}

/// The client's state across the run.
struct Feed {
    lines: usize,
    shards: usize,
    /// Lines only create (records mode): nothing is deleted.
    create_only: bool,
    next_file: usize,
    /// Create ids by line of the files answered whose records are not deleted yet, oldest first.
    ids: VecDeque<Vec<u64>>,
    in_flight: VecDeque<InFlight>,
    reservoir: Vec<Sent>,
    seen: u64,
    rng: u64,
    /// This stretch: its start, then each file's lines and when its result was read.
    done: Vec<(usize, Instant)>,
}

impl Feed {
    fn new(sz: &Sizes) -> Feed {
        Feed {
            lines: sz.lines,
            shards: sz.shards,
            create_only: sz.records,
            next_file: 0,
            ids: VecDeque::new(),
            in_flight: VecDeque::new(),
            reservoir: Vec::with_capacity(RESERVOIR),
            seen: 0,
            rng: 0x9e37_79b9_7f4a_7c15,
            done: vec![(0, Instant::now())],
        }
    }

    /// splitmix64: the sample and the picks, the same every run.
    fn next_rand(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// File `f`'s text: line `l` is key `k<f*lines+l>`, one create and (from file `DEPTH` on)
    /// the delete of what line `l` of file `f - DEPTH` created.
    fn file_text(&self, f: usize) -> anyhow::Result<String> {
        let victims = if f >= DEPTH && !self.create_only {
            Some(
                self.ids
                    .front()
                    .context("no ids of an earlier file to delete")?,
            )
        } else {
            None
        };
        let mut text = String::with_capacity(self.lines * 140);
        for l in 0..self.lines {
            let (n, s) = (f * self.lines + l, l % self.shards);
            let create = format!(r#"{{"op":"create","shard":"s{s}","record":{{"n":{n}}}}}"#);
            let delete = match victims {
                Some(v) => {
                    let id = v.get(l).context("an earlier file's result is short")?;
                    format!(r#",{{"op":"delete","shard":"s{s}","id":{id}}}"#)
                }
                None => String::new(),
            };
            text.push_str(&format!(
                r#"{{"request_key":"k{n}","ops":[{create}{delete}]}}"#
            ));
            text.push('\n');
        }
        Ok(text)
    }
}

/// Writes `text` to `spool/tmp/NAME`, fsyncs it, renames it into `spool/new/` and fsyncs that
/// directory (the safe delivery `roost submit` makes).
fn deliver(spool: &Path, name: &str, text: &str) -> anyhow::Result<()> {
    let tmp = spool.join("tmp").join(name);
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("write {}", tmp.display()))?;
    let new = spool.join("new");
    std::fs::rename(&tmp, new.join(name)).with_context(|| format!("rename {name} into new/"))?;
    std::fs::File::open(&new)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("fsync {}", new.display()))
}

/// Submits the next file.
fn submit_next(d: &Daemon, feed: &mut Feed) -> anyhow::Result<()> {
    let f = feed.next_file;
    let text = feed.file_text(f)?;
    if f >= DEPTH && !feed.create_only {
        feed.ids.pop_front();
    }
    let name = format!("keys-{f:07}.jsonl");
    deliver(&d.spool(), &name, &text)?;
    feed.in_flight.push_back(InFlight { name, text });
    feed.next_file += 1;
    Ok(())
}

/// Waits for the oldest file's result, checks it, keeps its create ids, samples its lines
/// into the reservoir and deletes the result.
fn finish_oldest(d: &mut Daemon, feed: &mut Feed) -> anyhow::Result<()> {
    let Some(fl) = feed.in_flight.pop_front() else {
        return Ok(());
    };
    let out = d.spool().join("out").join(&fl.name);
    let t = Instant::now();
    while !out.exists() {
        if let Some(st) = d.child.exited()? {
            bail!(
                "roost serve exited ({st}) while {} was in flight; log {}",
                fl.name,
                d.child.log_path().display()
            );
        }
        ensure!(
            t.elapsed() < LIMIT,
            "{}: no result within {LIMIT:?}",
            fl.name
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let result =
        std::fs::read_to_string(&out).with_context(|| format!("read {}", out.display()))?;
    let answers: Vec<&str> = result.lines().filter(|l| !l.is_empty()).collect();
    let sent: Vec<&str> = fl.text.lines().collect();
    ensure!(
        answers.len() == sent.len(),
        "{}: {} result lines for {} batches",
        fl.name,
        answers.len(),
        sent.len()
    );
    let mut ids = Vec::with_capacity(sent.len());
    for (a, s) in answers.iter().zip(&sent) {
        let v: Value = serde_json::from_str(a).with_context(|| format!("{}: {a}", fl.name))?;
        ensure!(v["status"] == "committed", "{}: {a}", fl.name);
        ids.push(
            v["ops"][0]["id"]
                .as_u64()
                .with_context(|| format!("{}: no create id in {a}", fl.name))?,
        );
        sample(feed, s, v);
    }
    feed.ids.push_back(ids);
    std::fs::remove_file(&out).with_context(|| format!("remove {}", out.display()))?;
    feed.done.push((sent.len(), Instant::now()));
    Ok(())
}

/// Reservoir sampling (algorithm R): after `seen` lines each is kept with equal chance.
fn sample(feed: &mut Feed, line: &str, mut answer: Value) {
    feed.seen += 1;
    let slot = if feed.reservoir.len() < RESERVOIR {
        None
    } else {
        match (feed.next_rand() % feed.seen) as usize {
            j if j < RESERVOIR => Some(j),
            _ => return,
        }
    };
    if let Some(m) = answer.as_object_mut() {
        m.remove("line");
    }
    let sent = Sent {
        line: line.to_owned(),
        answer,
    };
    match slot {
        Some(j) => feed.reservoir[j] = sent,
        None => feed.reservoir.push(sent),
    }
}

/// Feeds files until `files` are answered, [`DEPTH`] in flight; then waits until `new/` holds
/// none of them (an answered file leaves `new/` a moment after its result).
fn feed_until(d: &mut Daemon, feed: &mut Feed, files: usize) -> anyhow::Result<()> {
    while feed.next_file < files || !feed.in_flight.is_empty() {
        while feed.next_file < files && feed.in_flight.len() < DEPTH {
            submit_next(d, feed)?;
        }
        finish_oldest(d, feed)?;
    }
    let new = d.spool().join("new");
    let t = Instant::now();
    loop {
        let left = std::fs::read_dir(&new)
            .with_context(|| format!("read {}", new.display()))?
            .count();
        if left == 0 {
            return Ok(());
        }
        ensure!(
            t.elapsed() < LIMIT,
            "{left} files still in {}",
            new.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Batches per second over the last `files` files of the stretch (after the first `skip`).
fn stretch_rate(done: &[(usize, Instant)], skip: usize, files: usize) -> f64 {
    let n = done.len().saturating_sub(1 + skip).min(files);
    if n == 0 {
        return f64::NAN;
    }
    let from = done.len() - 1 - n;
    let lines: usize = done[from + 1..].iter().map(|x| x.0).sum();
    let secs = done[done.len() - 1]
        .1
        .duration_since(done[from].1)
        .as_secs_f64();
    lines as f64 / secs.max(1e-9)
}

/// `sync; echo 3 > /proc/sys/vm/drop_caches`: `Ok(())` if the caches were dropped, else why not.
fn drop_caches() -> Result<(), String> {
    let st = std::process::Command::new("sync")
        .status()
        .map_err(|e| format!("sync: {e}"))?;
    if !st.success() {
        return Err(format!("sync exited {st}"));
    }
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
        .map_err(|e| format!("/proc/sys/vm/drop_caches: {e}"))
}

/// `n` random lines of the sample sent again one at a time over the stream socket: each
/// answer must be the first one; the latencies in ms, sorted.
fn duplicates(d: &Daemon, feed: &mut Feed, n: usize) -> anyhow::Result<Vec<f64>> {
    let stream = connect_stream(&d.dir.join("stream.sock"))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut w = stream.try_clone().context("clone the stream socket")?;
    let mut r = BufReader::new(stream);
    let mut lat = Vec::with_capacity(n);
    let mut answer = String::new();
    // The page cache was just dropped: the first answers also page the daemon's code and
    // the stream path back in. Three new keys first (not timed) warm those, not the sampled
    // keys' index blocks and table records, which stay cold.
    for i in 0..3 {
        let key = format!("warm-{}-{i}", feed.next_rand());
        let line = format!(
            r#"{{"request_key":"{key}","ops":[{{"op":"create","shard":"s0","record":{{}}}}]}}"#
        );
        w.write_all(format!("{line}\n").as_bytes())
            .context("send a warm-up batch")?;
        answer.clear();
        ensure!(
            r.read_line(&mut answer)? > 0,
            "the stream closed before a warm-up answer"
        );
    }
    for _ in 0..n.min(feed.reservoir.len()) {
        let i = (feed.next_rand() % feed.reservoir.len() as u64) as usize;
        let s = &feed.reservoir[i];
        let t = Instant::now();
        w.write_all(format!("{}\n", s.line).as_bytes())
            .context("send a duplicate")?;
        answer.clear();
        let got = r
            .read_line(&mut answer)
            .context("read a duplicate's answer")?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        ensure!(got > 0, "the stream closed before a duplicate's answer");
        let v: Value =
            serde_json::from_str(&answer).with_context(|| format!("answer: {answer}"))?;
        ensure!(
            v == s.answer,
            "a duplicate's answer differs: first {}, again {answer}",
            s.answer
        );
    }
    lat.sort_by(f64::total_cmp);
    Ok(lat)
}

/// Sends `line` on a new stream connection and returns its answer.
fn one_answer(sock: &Path, line: &str) -> anyhow::Result<Value> {
    let stream = connect_stream(sock)?;
    stream.set_read_timeout(Some(LIMIT))?;
    let mut w = stream.try_clone().context("clone the stream socket")?;
    w.write_all(format!("{line}\n").as_bytes())
        .context("send a batch")?;
    let mut answer = String::new();
    ensure!(
        BufReader::new(stream).read_line(&mut answer)? > 0,
        "the stream closed before an answer to {line}"
    );
    serde_json::from_str(&answer).with_context(|| format!("answer: {answer}"))
}

/// Connects to the stream socket, retrying for a while: it is bound a moment after the
/// control socket.
fn connect_stream(sock: &Path) -> anyhow::Result<UnixStream> {
    let t = Instant::now();
    loop {
        match UnixStream::connect(sock) {
            Ok(s) => return Ok(s),
            Err(e) if t.elapsed() > Duration::from_secs(30) => {
                return Err(e).with_context(|| format!("connect to {}", sock.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// Everything measured at a milestone (the files in flight drained first).
fn milestone(d: &mut Daemon, feed: &mut Feed, sz: &Sizes, t0: Instant) -> anyhow::Result<Row> {
    let st = d.status()?;
    let live_keys = st["live_keys"]
        .as_u64()
        .context("status without live_keys")?;
    let keys_bytes = st["disk_bytes"]["keys"].as_u64().unwrap_or(0);
    eprintln!("  status.memory: {}", st["memory"]);
    let (rss, anon) = rss_kib(d.child.id())?;
    // The first stretch's first DEPTH files delete nothing: left out, as from the baseline.
    let first = feed.next_file + 1 == feed.done.len();
    let skip = if first && feed.done.len() > DEPTH + 1 {
        DEPTH
    } else {
        0
    };
    let rate = stretch_rate(&feed.done, skip, RATE_FILES);
    let disk = crate::soak::allocated_bytes(&d.dir);
    let (kill, replayed) = d.kill_restart()?;
    let (stop, graceful) = d.graceful_restart()?;
    let (fresh, fresh_anon) = rss_kib(d.child.id())?;
    let cold = drop_caches();
    if let Err(why) = &cold {
        eprintln!("  page cache not dropped ({why}): the duplicate figures are warm");
    }
    let lat = duplicates(d, feed, sz.dups)?;
    Ok(Row {
        keys: (feed.next_file * feed.lines) as u64,
        live_keys,
        rss_kib: rss,
        rss_anon_kib: anon,
        fresh_rss_kib: fresh,
        fresh_rss_anon_kib: fresh_anon,
        rate,
        baseline: f64::NAN,
        dup_p50_ms: quantile(&lat, 0.5),
        dup_p99_ms: quantile(&lat, 0.99),
        cold: cold.is_ok(),
        kill_restart_ms: kill.as_secs_f64() * 1e3,
        replayed,
        stop_ms: stop.as_secs_f64() * 1e3,
        graceful_restart_ms: graceful.as_secs_f64() * 1e3,
        disk_bytes: disk,
        keys_bytes,
        secs: t0.elapsed().as_secs_f64(),
    })
}

/// Where the CSV goes: `ROOST_KEYS_CSV`, else `docs/keys-window.csv`, or `base` in quick mode.
fn csv_path(sz: &Sizes, base: &Path) -> PathBuf {
    match std::env::var_os("ROOST_KEYS_CSV") {
        Some(p) => PathBuf::from(p),
        None if sz.quick => base.join("keys-window.csv"),
        None if sz.records => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/records.csv"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/keys-window.csv"),
    }
}

/// `--keys`: the run, the table, the CSV and the plot.
pub fn run() -> anyhow::Result<()> {
    let sz = sizes()?;
    let bin = crate::replication::roost_bin()?;
    // Its own folder inside ROOST_BENCH_DIR (shared with the other smoke runs in CI).
    let root = bench_base("target/bench-keys");
    let base = root.join("keys");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let csv = csv_path(&sz, &root);
    std::fs::write(&csv, format!("{}\n", Row::CSV_HEADER))
        .with_context(|| format!("write {}", csv.display()))?;
    let last = sz.milestones.last().copied().unwrap_or(0);
    let ops = if sz.records {
        "1 create each, nothing deleted"
    } else {
        "1 create + 1 delete each"
    };
    println!(
        "roost keys-window bench in {} ({}): {} keys in bulk files of {} lines ({ops}) over {} shards, {DEPTH} in flight, default configuration",
        base.display(), bin.display(), last * sz.lines, sz.lines, sz.shards
    );
    let mut d = Daemon::start(&bin, &base, sz.shards)?;
    let mut feed = Feed::new(&sz);
    let (t0, mut rows, mut baseline) = (Instant::now(), Vec::new(), f64::NAN);
    for &files in &sz.milestones {
        feed_until(&mut d, &mut feed, files)?;
        if rows.is_empty() {
            // After the first DEPTH files (they delete nothing), if there are more.
            let skip = if feed.done.len() > DEPTH + 1 {
                DEPTH
            } else {
                0
            };
            baseline = stretch_rate(&feed.done, skip, usize::MAX);
        }
        let row = Row {
            baseline,
            ..milestone(&mut d, &mut feed, &sz, t0)?
        };
        eprintln!("  {}", row.summary());
        crate::soak::append_line(&csv, &row.to_csv())?;
        rows.push(row);
        feed.done = vec![(0, Instant::now())];
    }
    let st = d.child.stop(LIMIT)?;
    ensure!(st.success(), "roost serve stopped with {st}");
    crate::keys_plot::print_table(&rows);
    let svg = csv.with_extension("svg");
    plot(&svg, &rows)?;
    println!("\ncsv: {}, plot: {}", csv.display(), svg.display());
    if std::env::var_os("ROOST_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}
