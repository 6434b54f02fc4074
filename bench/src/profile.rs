//! `roost-bench --ceiling-profile [N] [fsync|syncfs]` (issue 16, part 1): where a burst's time
//! goes, in syscalls. The real `roost serve` (the `roost` binary beside this one, or
//! `ROOST_BIN`) runs on a fresh journaled ext4 image; once it serves, `strace -c -f -p PID`
//! attaches to all its threads, a burst of N files (default 3,000; 10 creates of ~100 B) is
//! dropped into its spool, and once every result is out and nothing is in flight, strace is
//! interrupted (it detaches and writes its summary). Prints the syscalls per batch (every
//! kind the summary counts, the sync family first) next to roost's own counters over the same
//! burst from `roost status --json` (batches per WAL sync, results per `out/` round, shard
//! transactions and flushes). strace slows every syscall, which changes how batches group:
//! `--ceiling` prints the same counters without strace. Needs root and strace.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use roost::drill::child::ServeChild;
use roost_benchkit::bench_base;
use serde_json::Value;

use crate::loopfs::{clear_stale, is_root, sh, LoopMount};
use crate::spool::{burst_timed, check_burst, Workload};

/// Bound on every wait for the daemon or strace.
const LIMIT: Duration = Duration::from_secs(120);
/// Syscalls printed first, in this order, when the summary has them.
const SYNCS: [&str; 6] = [
    "fdatasync",
    "fsync",
    "msync",
    "syncfs",
    "sync_file_range",
    "sync",
];

/// `--ceiling-profile [N] [fsync|syncfs]`.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let n: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(
        if std::env::var_os("ROOST_BENCH_QUICK").is_some() {
            100
        } else {
            3_000
        },
    );
    let mode = args.get(1).map_or("fsync", String::as_str);
    ensure!(
        mode == "fsync" || mode == "syncfs",
        "result sync mode {mode:?}: fsync or syncfs"
    );
    ensure!(
        is_root(),
        "--ceiling-profile loop-mounts an ext4 image: run it as root"
    );
    sh("strace", &["-V"]).context("strace is needed (apt-get install strace)")?;
    let bin = crate::replication::roost_bin()?;
    let base = bench_base("target/bench-profile");
    clear_stale(&base);
    let _ = std::fs::remove_dir_all(&base);
    let mount = LoopMount::eager(&base, 2 << 30)?;
    let out = profile(&bin, &mount.dir, n, mode);
    drop(mount);
    let _ = std::fs::remove_dir_all(&base);
    let (summary, before, after) = out?;
    report(n, mode, &summary, &before, &after)
}

/// The daemon started, strace attached, the burst, strace stopped, the daemon stopped.
/// Returns strace's summary and `roost status` before and after the burst.
fn profile(
    bin: &Path,
    root: &Path,
    n: usize,
    mode: &str,
) -> anyhow::Result<(String, Value, Value)> {
    let dir = root.join("data");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let socket = root.join("roost.sock");
    let config = root.join("roost.toml");
    let text = format!(
        "control_socket = \"{}\"\nresult_sync = \"{mode}\"\n",
        socket.display()
    );
    std::fs::write(&config, text).with_context(|| format!("write {}", config.display()))?;
    let mut daemon = ServeChild::spawn(bin, &dir, &root.join("roost.log"), |c| {
        c.arg("--config")
            .arg(&config)
            .env_remove("RUNTIME_DIRECTORY");
    })?;
    daemon.ready(LIMIT)?;
    let before = status(&socket)?;
    let summary_path = root.join("strace.txt");
    let mut tracer = Tracer::attach(daemon.id(), &summary_path)?;
    let w = Workload {
        ops: 10,
        record_bytes: 100,
    };
    let spool = dir.join("spool");
    let b = burst_timed(&spool, n, &w)?;
    let after = settled(&socket)?;
    let threads = tracer.stop()?;
    println!("strace was attached to {threads} threads of roost serve");
    check_burst(&spool, &b, w.ops).context("burst results")?;
    println!(
        "burst of {n} under strace: {:.0} batches/s (strace slows every syscall)",
        b.rate
    );
    let st = daemon.stop(LIMIT)?;
    ensure!(st.success(), "roost serve stopped with {st}");
    let summary = std::fs::read_to_string(&summary_path)
        .with_context(|| format!("read {}", summary_path.display()))?;
    Ok((summary, before, after))
}

/// `strace -c -f -p PID -o FILE`, interrupted (SIGINT: it detaches and writes the summary) by
/// [`Tracer::stop`], killed at drop if still running.
struct Tracer {
    child: Child,
    log: PathBuf,
}

impl Tracer {
    fn attach(pid: u32, summary: &Path) -> anyhow::Result<Tracer> {
        let log = summary.with_extension("log");
        let err =
            std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let child = Command::new("strace")
            .args(["-c", "-w", "-f", "-o"])
            .arg(summary)
            .args(["-p", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .context("start strace")?;
        let t = Tracer {
            child,
            log: log.clone(),
        };
        // strace says "Process N attached" once per thread; wait for the first, then a moment
        // for the others.
        let until = Instant::now() + LIMIT;
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("attached")
        {
            ensure!(Instant::now() < until, "strace did not attach to {pid}");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        Ok(t)
    }

    /// Stops tracing; returns the threads strace was attached to.
    fn stop(&mut self) -> anyhow::Result<usize> {
        sh("kill", &["-INT", &self.child.id().to_string()])?;
        let st = self.child.wait().context("wait for strace")?;
        // strace detaches, writes its summary, then dies of the SIGINT it was sent (or exits
        // with 0); anything else is an error.
        use std::os::unix::process::ExitStatusExt;
        if st.code() != Some(0) && st.signal() != Some(2) {
            bail!("strace ended with {st}");
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        Ok(log.lines().filter(|l| l.contains(" attached")).count())
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `roost status --json` over the control socket (retried until it answers, bounded).
fn status(socket: &Path) -> anyhow::Result<Value> {
    let until = Instant::now() + LIMIT;
    loop {
        match roost::control::socket::request(socket, "status") {
            Ok(text) => return serde_json::from_str(&text).context("status JSON"),
            Err(e) if Instant::now() > until => {
                return Err(e).context(format!("status of {}", socket.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The status once nothing is in flight (the burst's durability tail done), bounded.
fn settled(socket: &Path) -> anyhow::Result<Value> {
    let until = Instant::now() + LIMIT;
    loop {
        let s = status(socket)?;
        if s["in_flight"].as_u64() == Some(0) || Instant::now() > until {
            std::thread::sleep(Duration::from_millis(50));
            return status(socket);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One row of strace's `-c -w` table: wall-clock time inside the call, summed over threads.
struct Row {
    name: String,
    calls: u64,
    seconds: f64,
    usecs_per_call: u64,
}

/// The rows of strace's `-c` table (`% time, seconds, usecs/call, calls, [errors,] syscall`).
fn parse_summary(text: &str) -> Vec<Row> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = *f.last()?;
            let row = Row {
                name: name.to_owned(),
                calls: f.get(3)?.parse().ok()?,
                seconds: f.get(1)?.parse().ok()?,
                usecs_per_call: f.get(2)?.parse().ok()?,
            };
            (f.len() >= 5 && name != "total").then_some(row)
        })
        .collect()
}

fn report(
    n: usize,
    mode: &str,
    summary: &str,
    before: &Value,
    after: &Value,
) -> anyhow::Result<()> {
    let d = |k: &str| {
        after[k]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(before[k].as_u64().unwrap_or(0))
    };
    let committed = d("committed");
    ensure!(
        committed as usize >= n,
        "{committed} batches committed, {n} dropped"
    );
    let per = |x: u64| x as f64 / committed.max(1) as f64;
    println!(
        "roost (result_sync = {mode}) over the burst, its own counters: {committed} batches, {} WAL syncs ({:.1} batches per sync), {} results in {} out/ rounds ({:.1} per round), {} shard txns and {} shard flushes ({:.2} per batch)",
        d("wal_syncs"), committed as f64 / d("wal_syncs").max(1) as f64,
        d("results_published"), d("result_rounds"),
        d("results_published") as f64 / d("result_rounds").max(1) as f64,
        d("shard_txns"), d("shard_flushes"), per(d("shard_flushes"))
    );
    let mut calls = parse_summary(summary);
    ensure!(
        !calls.is_empty(),
        "no syscall table in strace's summary:\n{summary}"
    );
    let rank = |s: &str| SYNCS.iter().position(|x| *x == s).unwrap_or(SYNCS.len());
    calls.sort_by(|a, b| {
        rank(&a.name)
            .cmp(&rank(&b.name))
            .then(b.calls.cmp(&a.calls))
    });
    let syncs: u64 = calls
        .iter()
        .filter(|r| rank(&r.name) < SYNCS.len())
        .map(|r| r.calls)
        .sum();
    println!("syncs of every kind: {syncs} = {:.2} per batch", per(syncs));
    println!("| syscall | calls | per batch | wall s in calls, all threads | us per call |");
    println!("|---|---|---|---|---|");
    for r in calls.iter().take(24) {
        println!(
            "| {} | {} | {:.2} | {:.2} | {} |",
            r.name,
            r.calls,
            per(r.calls),
            r.seconds,
            r.usecs_per_call
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// strace's `-c` table, with and without an errors column, and its footer.
    #[test]
    fn strace_summary_rows_are_read() {
        let text = "% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 61.10    4.770000       11084       430           fdatasync
  2.00    0.070000         225       300         4 unlink
------ ----------- ----------- --------- --------- ----------------
100.00    7.800000                  1234        12 total
";
        let rows = parse_summary(text);
        let got: Vec<(&str, u64, u64)> = rows
            .iter()
            .map(|r| (r.name.as_str(), r.calls, r.usecs_per_call))
            .collect();
        assert_eq!(got, [("fdatasync", 430, 11084), ("unlink", 300, 225)]);
        assert!((rows[0].seconds - 4.77).abs() < 1e-9);
    }
}
