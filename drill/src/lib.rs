//! `roost drill`: the crash-recovery drill operators run on their own hosts. It runs
//! `roost serve` as a child on a scratch (or given) data directory, streams batches through the
//! spool (creates and deletes over several shards, some meant to be rejected, some retried
//! with the same key), kills the child with SIGKILL at random moments and at named crash
//! points (`ROOST_CRASH_AT`), restarts it, and after every restart checks the invariants on
//! the files. Same seed, same drill (the batches and the kill schedule; where a random-moment
//! kill lands depends on timing). `roost drill --replicated` (`replicated`) is the failover
//! drill on two nodes (`node`), judged by `verdict`; `roost drill --cluster` (`cluster_strikes`)
//! strikes the leader of three, with a client (`probe`) measuring what a client waits (or,
//! with `--rolling`, restarts the nodes in turn, or with `--quiet-secs` only loads them);
//! all send the batches of `batches`.
//! Beside the spool files, each round of the one-node drill sends a quarter as many batches
//! over the stream socket (`stream_client`) and drops bulk files (`NAME.jsonl`, one batch per line,
//! at least a quarter as many lines, 50 to 200 a file: `bulk_judge`); all are judged together,
//! and every answer still claimed in the WAL is compared with its claim (`claims`).

//!
//! A crate of its own (`roost-drill`, issue 46) over the engine crate; the `roost` binary
//! runs it as `roost drill` and re-exports it as `roost::drill`.
#![forbid(unsafe_code)]

// The engine's parts, under the names they have inside the engine crate.
pub(crate) use roost_engine::{batch, config, control, intake, layout, ops, pipeline, spool};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roost_storage::RealStorage;
use serde_json::Value;

mod batches;
mod bulk_judge;
pub mod child;
mod claims;
mod cluster_final;
mod cluster_modes;
mod cluster_strikes;
mod node;
mod probe;
pub mod proxy;
mod replicated;
pub mod setup;
mod stream_client;
mod verdict;

pub use cluster_strikes::{run_cluster, ClusterMode, ClusterRun};
pub use replicated::run_replicated;

use self::batches::{Batches, Sent};
pub use self::setup::DrillOptions;
use self::setup::{pick_crash, read_result, read_shards, DRILL_CONFIG, READY_LIMIT, SHARDS};
use crate::batch::{BatchResult, Status};
use crate::pipeline::crash::CrashTarget;
use crate::spool::SpoolPaths;
use child::ServeChild;

/// Runs the drill; prints the report; returns the number of violations.
pub fn run(opts: &DrillOptions) -> anyhow::Result<usize> {
    std::fs::create_dir_all(&opts.data_dir)?;
    let mut d = Drill::new(opts)?;
    let rounds = opts.kills + 1;
    for round in 0..rounds {
        d.round(round, round + 1 == rounds)?;
    }
    d.report(rounds);
    Ok(d.violations.len())
}

/// The drill's state across rounds. Every random draw comes from `rng`, in a fixed order, so
/// the same seed gives the same batches and the same kill schedule.
struct Drill<'a> {
    opts: &'a DrillOptions,
    bin: PathBuf,
    sp: SpoolPaths,
    violations: Vec<String>,
    /// Spawn to "serving", per process start.
    recoveries: Vec<Duration>,
    /// The batches, and the random source of the whole drill.
    b: Batches,
    starts: usize,
    kill_log: Vec<String>,
    next_batch: usize,
    per_round: usize,
    /// The streamed batches and their answers.
    stream: stream_client::Streamed,
    /// The bulk files and what the restarts saw of them.
    bulk: bulk_judge::Bulk,
    /// Claims compared with their answers (`claims`), over every check.
    claims_compared: usize,
}

impl<'a> Drill<'a> {
    fn new(opts: &'a DrillOptions) -> anyhow::Result<Drill<'a>> {
        let config = opts.data_dir.join("drill.toml");
        std::fs::write(&config, DRILL_CONFIG)
            .with_context(|| format!("writing {}", config.display()))?;
        Ok(Drill {
            opts,
            bin: std::env::current_exe().context("locating the roost binary")?,
            sp: SpoolPaths::new(&opts.data_dir.join("data").join("spool")),
            violations: Vec::new(),
            recoveries: Vec::new(),
            b: Batches::new(opts.seed),
            starts: 0,
            kill_log: Vec::new(),
            next_batch: 0,
            per_round: opts.batches.div_ceil(opts.kills + 1),
            stream: stream_client::Streamed::new(&opts.data_dir.join("data")),
            bulk: bulk_judge::Bulk::default(),
            claims_compared: 0,
        })
    }

    /// One round: start a daemon, stream the round's batches, kill it (odd rounds at a named
    /// crash point, the N-th time it is reached; even rounds at a random moment; the last
    /// round is not killed), then restart and check.
    fn round(&mut self, round: usize, last: bool) -> anyhow::Result<()> {
        let crash = (!last && round % 2 == 1).then(|| pick_crash(&mut self.b.rng));
        let (mut child, fired) = self.start(round, crash)?;
        let mut killed = self.send_round(round, last, crash.is_some(), &mut child)?;
        if let (Some(p), false) = (crash, fired) {
            if child.died_within(Duration::from_secs(10)) {
                self.kill_log
                    .push(format!("round {round}: died at crash point {p}"));
            } else {
                self.kill_log.push(format!(
                    "round {round}: crash point {p} not reached in 10 s; SIGKILL"
                ));
            }
            killed = true;
        }
        if !killed && !last {
            self.kill_log
                .push(format!("round {round}: SIGKILL after the round's batches"));
        }
        drop(child); // SIGKILL if still running
        self.restart_and_check()
    }

    /// Starts `roost serve` with the log `drill-serve-N.log`, N counting process starts.
    fn spawn(&mut self, crash: Option<CrashTarget>) -> anyhow::Result<ServeChild> {
        let dir = &self.opts.data_dir;
        let log = dir.join(format!("drill-serve-{}.log", self.starts));
        self.starts += 1;
        let config = dir.join("drill.toml");
        ServeChild::spawn(&self.bin, &dir.join("data"), &log, |cmd| {
            cmd.arg("--config").arg(&config);
            if let Some(t) = crash {
                cmd.env("ROOST_CRASH_AT", t.to_string());
            }
        })
    }

    /// Starts the round's daemon and waits for its recovery; true with it if the crash point
    /// already fired during recovery (which finished an earlier batch): that is the round's
    /// kill, and the round carries on with a clean daemon.
    fn start(
        &mut self,
        round: usize,
        crash: Option<CrashTarget>,
    ) -> anyhow::Result<(ServeChild, bool)> {
        let mut child = self.spawn(crash)?;
        match child.ready(READY_LIMIT) {
            Ok(d) => {
                self.recoveries.push(d);
                Ok((child, false))
            }
            Err(_) if crash.is_some() && child.exited()?.is_some() => {
                let p = crash.map(|t| t.to_string()).unwrap_or_default();
                self.kill_log.push(format!(
                    "round {round}: died at crash point {p} during recovery"
                ));
                drop(child);
                let mut child = self.spawn(None)?;
                self.recoveries.push(child.ready(READY_LIMIT)?);
                Ok((child, true))
            }
            Err(e) => Err(e),
        }
    }

    /// Drops the round's batches into the spool, with its bulk files among them, while a
    /// quarter as many stream in; in a random-kill round, SIGKILLs the daemon a random delay
    /// after a random batch and returns true (bulk files not dropped by then are dropped
    /// after the kill, for the restart).
    fn send_round(
        &mut self,
        round: usize,
        last: bool,
        crash: bool,
        child: &mut ServeChild,
    ) -> anyhow::Result<bool> {
        let kill_at = self.b.rng.below(self.per_round as u64) as usize;
        let kill_delay = Duration::from_millis(self.b.rng.below(150));
        let quota = if last {
            self.opts.batches.saturating_sub(self.next_batch)
        } else {
            self.per_round
        };
        let streamed = (0..quota.div_ceil(4))
            .map(|k| self.b.fresh(&format!("r{round}s{k}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let first_at = if last || crash { 0 } else { kill_at };
        let bulk = self
            .bulk
            .plan_round(&mut self.b, (round, quota, first_at))?;
        let streaming = self.stream.start(streamed);
        let mut killed = false;
        for j in 0..quota {
            if self.next_batch >= self.opts.batches {
                break;
            }
            for (k, _) in bulk.iter().filter(|(_, at)| *at == j) {
                self.bulk.drop_file(&self.sp, *k)?;
            }
            let i = self.next_batch;
            self.next_batch += 1;
            self.b.send(&self.sp, i)?;
            if !last && !crash && j == kill_at {
                std::thread::sleep(kill_delay);
                child.kill();
                self.kill_log.push(format!(
                    "round {round}: SIGKILL at a random moment ({} ms after batch {i})",
                    kill_delay.as_millis()
                ));
                killed = true;
                break;
            }
        }
        for (k, _) in &bulk {
            self.bulk.drop_file(&self.sp, *k)?;
        }
        self.stream.finish(streaming)?;
        Ok(killed)
    }

    /// Notes the bulk files the dead daemon left unanswered, starts a clean daemon, waits
    /// for recovery and for every sent file and bulk file to have a result, checks the
    /// invariants on every answer (files, stream, bulk lines), kills it, and compares the
    /// answers with the claims in the WAL.
    fn restart_and_check(&mut self) -> anyhow::Result<()> {
        let data = self.opts.data_dir.join("data");
        let before = claims::read(&data).context("reading the wal before a restart")?;
        self.bulk.note_kill(&self.sp, &before);
        let mut c = self.spawn(None)?;
        self.recoveries.push(c.ready(READY_LIMIT)?);
        wait_drained(&self.sp, &self.b.sent, &self.bulk)?;
        let streamed = self.stream.recheck(&mut self.violations)?;
        let bulk = self.bulk.judge(&self.sp, &mut self.violations);
        let files = file_answers(&self.sp, &self.b.sent, &mut self.violations);
        let answers: Vec<(&Sent, &BatchResult)> = files
            .iter()
            .chain(&streamed)
            .chain(&bulk)
            .map(|(s, r)| (s, r))
            .collect();
        let found = check(&self.opts.data_dir, &answers, &mut self.b.live)?;
        self.violations.extend(found);
        c.kill();
        let after = claims::read(&data).context("reading the wal after a check")?;
        let (compared, found) = claims::against_answers(&after, &answers);
        self.claims_compared += compared;
        self.violations.extend(found);
        Ok(())
    }

    fn report(&self, rounds: usize) {
        let _ = writeln!(
            std::io::stdout(),
            "roost drill: seed {} , {} batches ({} files), {} rounds, {} process starts",
            self.opts.seed,
            self.b.bodies.len(),
            self.b.sent.len(),
            rounds,
            self.starts
        );
        for l in &self.kill_log {
            let _ = writeln!(std::io::stdout(), "  {l}");
        }
        let ms: Vec<u128> = self.recoveries.iter().map(Duration::as_millis).collect();
        let _ = writeln!(
            std::io::stdout(),
            "  kills: {}; recovery times (spawn to serving, ms): {ms:?}",
            self.kill_log.len()
        );
        let checkpoints: usize = (0..self.starts)
            .filter_map(|n| {
                let log = self.opts.data_dir.join(format!("drill-serve-{n}.log"));
                std::fs::read_to_string(log).ok()
            })
            .map(|text| text.matches("checkpoint wal_from=").count())
            .sum();
        let _ = writeln!(std::io::stdout(), "  checkpoints taken: {checkpoints}");
        self.report_answers();
        if self.violations.is_empty() {
            let _ = writeln!(std::io::stdout(), "  violations: none");
        } else {
            let _ = writeln!(std::io::stdout(), "  violations: {}", self.violations.len());
            for v in &self.violations {
                let _ = writeln!(std::io::stdout(), "    {v}");
            }
        }
    }

    /// The report's lines on the answers: the files', the stream's, the bulk files', and
    /// the claims compared with them.
    fn report_answers(&self) {
        let committed = self
            .b
            .sent
            .iter()
            .filter(|s| {
                read_result(&self.sp, &s.name).is_some_and(|r| r.status() == Status::Committed)
            })
            .count();
        let mut out = std::io::stdout();
        let _ = writeln!(
            out,
            "  results: {committed} committed of {} files",
            self.b.sent.len()
        );
        let _ = writeln!(
            out,
            "  streamed: {} batches, {} answers read before their round's kill, every one sent again after each restart",
            self.stream.len(),
            self.stream.read_in_rounds
        );
        let bulk = &self.bulk;
        let _ = writeln!(
            out,
            "  bulk: {} files, {} lines judged after each restart, {} committed; a kill left a file unanswered in new/ {} times, {} of them mid-file (lines claimed)",
            bulk.files.len(),
            bulk.lines(),
            bulk.committed,
            bulk.unfinished_at_kills,
            bulk.mid_file_kills
        );
        let _ = writeln!(
            out,
            "  wal: {} claims compared with their answers over the checks",
            self.claims_compared
        );
    }
}

fn wait_drained(sp: &SpoolPaths, sent: &[Sent], bulk: &bulk_judge::Bulk) -> anyhow::Result<()> {
    let until = Instant::now() + READY_LIMIT;
    loop {
        let missing = sent
            .iter()
            .filter(|s| !sp.out.join(&s.name).exists())
            .count();
        let bulk_done = bulk.drained(sp);
        if missing == 0 && bulk_done {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("{missing} dropped files have no result after 120 s (bulk files drained: {bulk_done})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every dropped file with its result; a file without one is a violation.
fn file_answers(
    sp: &SpoolPaths,
    sent: &[Sent],
    violations: &mut Vec<String>,
) -> Vec<(Sent, BatchResult)> {
    let mut out = Vec::new();
    for s in sent {
        match read_result(sp, &s.name) {
            None => violations.push(format!("{}: no result", s.name)),
            Some(r) => out.push((s.clone(), r)),
        }
    }
    out
}

/// The invariants, on the files, with the daemon idle: `verify`'s, no create twice, every
/// answer as expected (`answers`: the spool files' results, the streamed batches' answers
/// and the bulk files' result lines). Refreshes `live` from what the committed answers left.
fn check(
    dir: &Path,
    answers: &[(&Sent, &BatchResult)],
    live: &mut BTreeMap<u64, &'static str>,
) -> anyhow::Result<Vec<String>> {
    let data = dir.join("data");
    let report = crate::ops::verify::verify(RealStorage::shared(), &data);
    let mut violations: Vec<String> = report
        .violations
        .iter()
        .map(|v| format!("verify: {v}"))
        .collect();
    let (records, tags) = read_shards(&data)?;
    for (tag, n) in &tags {
        if *n > 1 {
            violations.push(format!("a create produced {n} records: {tag}"));
        }
    }
    let results: BTreeMap<&str, &BatchResult> =
        answers.iter().map(|(s, r)| (s.name.as_str(), *r)).collect();
    let deleted: HashSet<u64> = answers
        .iter()
        .filter(|(_, r)| r.status() == Status::Committed)
        .flat_map(|(_, r)| r.ops().iter().filter(|o| o.op == "delete").map(|o| o.id))
        .collect();
    live.clear();
    for (s, r) in answers {
        check_result(s, r, &results, &deleted, &records, live, &mut violations);
    }
    Ok(violations)
}

/// One batch's answer: a rejection where one was meant, a retry's answer equal to its
/// original's, every committed create present (unless a later batch deleted it).
fn check_result(
    s: &Sent,
    r: &BatchResult,
    results: &BTreeMap<&str, &BatchResult>,
    deleted: &HashSet<u64>,
    records: &HashMap<u64, (&'static str, Value)>,
    live: &mut BTreeMap<u64, &'static str>,
    violations: &mut Vec<String>,
) {
    if s.expect_rejected && r.status() == Status::Committed {
        violations.push(format!("{}: expected a rejection, got committed", s.name));
    }
    if let Some(o) = s.retry_of.as_deref().and_then(|orig| results.get(orig)) {
        if o.status() == Status::Committed && *o != r {
            let orig = s.retry_of.as_deref().unwrap_or_default();
            violations.push(format!(
                "{}: retry of {orig} got a different result",
                s.name
            ));
        }
    }
    if r.status() != Status::Committed || s.retry_of.is_some() {
        return;
    }
    for (k, op) in r.ops().iter().enumerate() {
        if op.op != "create" || deleted.contains(&op.id) {
            continue;
        }
        match records.get(&op.id) {
            None => violations.push(format!(
                "{} ({}): committed create {} of op {k} is missing",
                s.name, s.key, op.id
            )),
            Some((shard, v)) => {
                if *shard != op.shard || v["drill"] != s.key.as_str() {
                    violations.push(format!("{}: id {} holds {v} on {shard}", s.name, op.id));
                }
                if let Some(st) = SHARDS.iter().find(|x| **x == op.shard) {
                    live.insert(op.id, st);
                }
            }
        }
    }
}
