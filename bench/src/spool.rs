//! Clients of a spool (the same for roost and the SQLite peer): a burst of files, closed-loop
//! clients that wait for each result, and an open loop at a fixed rate for latency. Results
//! are noticed through inotify on `out/` (with a polling fallback).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use notify::Watcher;
use roost::pipeline::Deliver;

pub struct Workload {
    pub ops: usize,
    pub record_bytes: usize,
}

pub fn body(key: &str, w: &Workload) -> Vec<u8> {
    let pad = "x".repeat(w.record_bytes.saturating_sub(30));
    let ops: Vec<String> = (0..w.ops)
        .map(|i| {
            format!(
                r#"{{"op":"create","shard":"s{}","record":{{"i":{i},"pad":"{pad}"}}}}"#,
                i % 4
            )
        })
        .collect();
    format!(r#"{{"request_key":"{key}","ops":[{}]}}"#, ops.join(",")).into_bytes()
}

/// Tells waiters when their result file appears in `out/`.
struct Results {
    waiters: Arc<Mutex<HashMap<String, Sender<Instant>>>>,
    /// Distinct result names seen: one rename can arrive as several events (inotify's
    /// MOVED_TO, and notify's "both" event naming the source and the target), so events are
    /// not counted, names are.
    seen: Arc<AtomicUsize>,
    out: PathBuf,
    _watcher: notify::RecommendedWatcher,
}

impl Results {
    fn watch(spool: &Path) -> anyhow::Result<Results> {
        let waiters: Arc<Mutex<HashMap<String, Sender<Instant>>>> =
            Arc::new(Mutex::new(HashMap::new()));
        let seen = Arc::new(AtomicUsize::new(0));
        let (w, s) = (waiters.clone(), seen.clone());
        let mut names: HashSet<String> = HashSet::new();
        let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            let Ok(ev) = ev else { return };
            let now = Instant::now();
            if !matches!(
                ev.kind,
                notify::EventKind::Create(_)
                    | notify::EventKind::Modify(notify::event::ModifyKind::Name(_))
            ) {
                return;
            }
            for p in ev.paths {
                let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
                    continue;
                };
                if name.starts_with('.') || !names.insert(name.to_owned()) {
                    continue;
                }
                s.store(names.len(), Ordering::Relaxed);
                if let Some(tx) = w.lock().ok().and_then(|mut m| m.remove(name)) {
                    let _ = tx.send(now);
                }
            }
        })?;
        let out = spool.join("out");
        watcher.watch(&out, notify::RecursiveMode::NonRecursive)?;
        Ok(Results {
            waiters,
            seen,
            out,
            _watcher: watcher,
        })
    }

    fn register(&self, name: &str) -> mpsc::Receiver<Instant> {
        let (tx, rx) = mpsc::channel();
        if let Ok(mut m) = self.waiters.lock() {
            m.insert(name.to_owned(), tx);
        }
        rx
    }

    /// Waits for `name`'s result; falls back to polling if an event was missed.
    fn wait(&self, name: &str, rx: &mpsc::Receiver<Instant>) -> anyhow::Result<Instant> {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(t) => return Ok(t),
                Err(_) if self.out.join(name).exists() => return Ok(Instant::now()),
                Err(_) if Instant::now() > until => anyhow::bail!("no result for {name} in 60 s"),
                Err(_) => {}
            }
        }
    }
}

fn drop_file(spool: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = spool.join("tmp").join(format!(".{name}"));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, spool.join("new").join(name))?;
    Ok(())
}

/// Removes every result file from `out/`.
pub fn clear_out(spool: &Path) {
    if let Ok(rd) = std::fs::read_dir(spool.join("out")) {
        for e in rd.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

static RUN: AtomicUsize = AtomicUsize::new(0);

fn run_id() -> usize {
    RUN.fetch_add(1, Ordering::Relaxed)
}

/// `n` files written to `tmp/`, then renamed into `new/` at once: batches per second until the
/// last result.
pub fn burst(spool: &Path, n: usize, w: &Workload) -> anyhow::Result<f64> {
    let b = burst_timed(spool, n, w)?;
    clear_out(spool);
    Ok(b.rate)
}

/// One burst's rate and when it ran: `start` is the first rename into `new/`, `end` the moment
/// the last result was seen.
pub struct BurstRun {
    pub rate: f64,
    pub start: Instant,
    pub end: Instant,
    /// The files' names (`out/NAME` holds each result; the request key is NAME without
    /// `.json`).
    pub names: Vec<String>,
}

/// [`burst`], leaving the results in `out/` (the caller clears them with [`clear_out`] once
/// it has measured what follows the burst).
pub fn burst_timed(spool: &Path, n: usize, w: &Workload) -> anyhow::Result<BurstRun> {
    let run = run_id();
    let res = Results::watch(spool)?;
    let names: Vec<String> = (0..n).map(|i| format!("burst{run}-{i}.json")).collect();
    for (i, name) in names.iter().enumerate() {
        std::fs::write(
            spool.join("tmp").join(name),
            body(&format!("burst{run}-{i}"), w),
        )?;
    }
    let start = Instant::now();
    for name in &names {
        std::fs::rename(spool.join("tmp").join(name), spool.join("new").join(name))?;
    }
    let until = Instant::now() + Duration::from_secs(600);
    loop {
        if res.seen.load(Ordering::Relaxed) >= n {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
        if res.seen.load(Ordering::Relaxed) < n && start.elapsed() > Duration::from_secs(1) {
            // Ground truth, in case events were coalesced or dropped.
            let done = std::fs::read_dir(spool.join("out"))?
                .flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .count();
            if done >= n {
                break;
            }
        }
        anyhow::ensure!(Instant::now() < until, "burst did not finish");
    }
    let end = Instant::now();
    Ok(BurstRun {
        rate: n as f64 / (end - start).as_secs_f64(),
        start,
        end,
        names,
    })
}

/// `clients` threads, each dropping a file and waiting for its result, for `dur`. Returns
/// batches per second and every latency.
pub fn closed_loop(
    spool: &Path,
    clients: usize,
    dur: Duration,
    w: &Workload,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    closed_loop_with(spool, clients, dur, w, Checks::Nothing)
}

/// What each client of [`closed_loop_checked`] checks once its result appears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checks {
    Nothing,
    /// The result: a committed result for its request key with one id per op
    /// ([`check_result`]).
    Result,
    /// The result, and that the input was already gone from `new/` when it appeared (README,
    /// "Spool": a committed batch's input goes first, so a client may reuse the name at
    /// once): for roost.
    ResultAndInputGone,
}

/// [`closed_loop`], where each client also reads its result before removing it and fails
/// the run unless it passes `checks`.
pub fn closed_loop_checked(
    spool: &Path,
    clients: usize,
    dur: Duration,
    w: &Workload,
    checks: Checks,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    closed_loop_with(spool, clients, dur, w, checks)
}

/// `checks` of the result of `key` (spool file `name`), which has just appeared; the input
/// is looked at first, as it was when the result appeared, and reported after the result.
fn check_answer(
    spool: &Path,
    name: &str,
    key: &str,
    ops: usize,
    checks: Checks,
) -> anyhow::Result<()> {
    if checks == Checks::Nothing {
        return Ok(());
    }
    let input = spool.join("new").join(name);
    let input_there = input.exists();
    let out = spool.join("out").join(name);
    let bytes = std::fs::read(&out).with_context(|| format!("read {}", out.display()))?;
    check_result(&bytes, key, ops).with_context(|| format!("result {}", out.display()))?;
    anyhow::ensure!(
        !(input_there && checks == Checks::ResultAndInputGone),
        "{} was still there when its committed result appeared (README, \"Spool\": the input goes first)",
        input.display()
    );
    Ok(())
}

fn closed_loop_with(
    spool: &Path,
    clients: usize,
    dur: Duration,
    w: &Workload,
    checks: Checks,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    let run = run_id();
    let res = Arc::new(Results::watch(spool)?);
    let start = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let (res, spool) = (res.clone(), spool.to_path_buf());
            let bodyw = Workload {
                ops: w.ops,
                record_bytes: w.record_bytes,
            };
            std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
                let mut lat = Vec::new();
                let mut i = 0;
                while start.elapsed() < dur {
                    let key = format!("cl{run}-{c}-{i}");
                    let name = format!("{key}.json");
                    let rx = res.register(&name);
                    let t = Instant::now();
                    drop_file(&spool, &name, &body(&key, &bodyw))?;
                    let done = res.wait(&name, &rx)?;
                    lat.push(done.saturating_duration_since(t));
                    check_answer(&spool, &name, &key, bodyw.ops, checks)?;
                    let _ = std::fs::remove_file(spool.join("out").join(&name));
                    i += 1;
                }
                Ok(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().map_err(|_| anyhow::anyhow!("client panicked"))??);
    }
    let rate = all.len() as f64 / start.elapsed().as_secs_f64();
    clear_out(spool);
    Ok((rate, all))
}

/// A result file must be one JSON object saying `committed` for `key`, with `ops` ids (a
/// number each), whichever system wrote it.
pub fn check_result(bytes: &[u8], key: &str, ops: usize) -> anyhow::Result<()> {
    let v: serde_json::Value = serde_json::from_slice(bytes).context("not JSON")?;
    anyhow::ensure!(
        v["status"] == "committed" && v["request_key"] == key,
        "not a committed result for {key}: {v}"
    );
    let ids = v["ops"].as_array().map_or(0, |a| {
        a.iter().filter(|o| o["id"].as_u64().is_some()).count()
    });
    anyhow::ensure!(
        ids == ops,
        "{ids} op ids in the result, {ops} expected: {v}"
    );
    Ok(())
}

/// Every result of a burst: present in `out/` and [`check_result`]-correct.
pub fn check_burst(spool: &Path, b: &BurstRun, ops: usize) -> anyhow::Result<()> {
    for name in &b.names {
        let out = spool.join("out").join(name);
        let bytes = std::fs::read(&out).with_context(|| format!("read {}", out.display()))?;
        let key = name.strip_suffix(".json").unwrap_or(name);
        check_result(&bytes, key, ops).with_context(|| format!("result {}", out.display()))?;
    }
    Ok(())
}

/// Files dropped at a fixed `rate` for `dur` (open loop); returns (p50, p99) seconds from the
/// rename into `new/` to the result file.
pub fn open_loop(
    spool: &Path,
    rate: f64,
    dur: Duration,
    w: &Workload,
) -> anyhow::Result<(f64, f64)> {
    let run = run_id();
    let res = Arc::new(Results::watch(spool)?);
    let interval = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let (tx, rx) = mpsc::channel::<(String, Instant, mpsc::Receiver<Instant>)>();
    let r2 = res.clone();
    let collector = std::thread::spawn(move || -> anyhow::Result<Vec<f64>> {
        let mut lat = Vec::new();
        for (name, sent, done) in rx {
            let t = r2.wait(&name, &done)?;
            lat.push(t.saturating_duration_since(sent).as_secs_f64());
        }
        Ok(lat)
    });
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < dur {
        let due = start + interval * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let name = format!("ol{run}-{i}.json");
        let done = res.register(&name);
        let b = body(&format!("ol{run}-{i}"), w);
        let tmp = spool.join("tmp").join(format!(".{name}"));
        std::fs::write(&tmp, &b)?;
        let sent = Instant::now();
        std::fs::rename(&tmp, spool.join("new").join(&name))?;
        tx.send((name, sent, done))
            .map_err(|_| anyhow::anyhow!("collector gone"))?;
        i += 1;
    }
    drop(tx);
    let mut lat = collector
        .join()
        .map_err(|_| anyhow::anyhow!("collector panicked"))??;
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    clear_out(spool);
    Ok((pct(0.50), pct(0.99)))
}

/// Fills a data directory with `records` records over `shards` shards through the real engine
/// (batches of 100 creates from 8 threads), for the restart measurement.
pub fn populate(dir: &Path, records: u64, shards: usize) -> anyhow::Result<()> {
    let engine = Arc::new(crate::open_engine(dir, roost::config::Config::default())?);
    let per_batch = 100u64;
    let batches = records.div_ceil(per_batch);
    let next = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (engine, next) = (engine.clone(), next.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                loop {
                    let b = next.fetch_add(1, Ordering::Relaxed) as u64;
                    if b >= batches {
                        return Ok(());
                    }
                    let ops: Vec<String> = (0..per_batch).map(|i| format!(r#"{{"op":"create","shard":"r{}","record":{{"b":{b},"i":{i},"name":"user-{b}-{i}","plan":"basic"}}}}"#, (b * per_batch + i) % shards as u64)).collect();
                    let text = format!(r#"{{"request_key":"fill-{b}","ops":[{}]}}"#, ops.join(","));
                    let batch = roost::batch::parse(text.as_bytes(), 1000).map_err(|e| anyhow::anyhow!(e.error))?;
                    let name = format!("fill-{b}.json");
                    engine.submit(&[(&batch, name.as_str())], Deliver::Files)?;
                }
            })
        })
        .collect();
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("populate thread panicked"))??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the input check sees an input left in `new/` beside its committed result, and
    /// only where it is asked for; a wrong result is reported as such first. Method: one
    /// spool, `out/k.json` committed, with and without `new/k.json`.
    #[test]
    fn the_input_check_fails_on_an_input_left_beside_its_result() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spool = dir.path();
        for d in ["new", "out"] {
            std::fs::create_dir_all(spool.join(d)).expect("mkdir");
        }
        let result = br#"{"request_key":"k","status":"committed","ops":[{"op":"create","shard":"s","id":1}]}"#;
        std::fs::write(spool.join("out/k.json"), result).expect("result");
        let check = |c| check_answer(spool, "k.json", "k", 1, c);
        assert!(check(Checks::ResultAndInputGone).is_ok(), "input gone");
        std::fs::write(spool.join("new/k.json"), b"{}").expect("input");
        let e = check(Checks::ResultAndInputGone).expect_err("input left");
        assert!(e.to_string().contains("still there"), "{e}");
        assert!(check(Checks::Result).is_ok(), "not asked for");
        assert!(check(Checks::Nothing).is_ok());
        let e = check_answer(spool, "k.json", "other", 1, Checks::ResultAndInputGone)
            .expect_err("another key's result");
        assert!(e.to_string().contains("result"), "{e}");
    }
}
