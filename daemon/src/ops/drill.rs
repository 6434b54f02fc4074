//! `roost drill`: the crash-recovery drill operators run on their own hosts. It runs
//! `roost serve` as a child on a scratch (or given) data directory, streams batches through the
//! spool (creates and deletes over several shards, some meant to be rejected, some retried
//! with the same key), kills the child with SIGKILL at random moments and at named crash
//! points (`ROOST_CRASH_AT`), restarts it, and after every restart checks the invariants on
//! the files. Same seed, same drill (the batches and the kill schedule; where a random-moment
//! kill lands depends on timing).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roost_shards::{Shard, ShardOptions};
use roost_wal::storage::{RealStorage, SplitMix};
use serde_json::{json, Value};

use crate::batch::{BatchResult, Status};
use crate::layout::SHARDS_DIR;
use crate::spool::SpoolPaths;

pub struct DrillOptions {
    pub data_dir: PathBuf,
    pub batches: usize,
    pub kills: usize,
    pub seed: u64,
}

const SHARDS: &[&str] = &["d0", "d1", "d2", "d3"];
const CRASH_POINTS: &[&str] = &[
    "after_plan",
    "after_claim_append",
    "after_claim_sync",
    "after_commit.0",
    "after_commit.1",
    "after_audit.0",
    "after_result",
    "after_flush.0",
    "after_audit_sync",
    "after_done",
];

struct Child2 {
    child: Child,
    log: PathBuf,
    started: Instant,
}

fn spawn(dir: &Path, n: usize, crash: Option<&str>) -> anyhow::Result<Child2> {
    let log = dir.join(format!("drill-serve-{n}.log"));
    let mut cmd = Command::new(std::env::current_exe().context("locating the roost binary")?);
    cmd.arg("serve")
        .arg("--data-dir")
        .arg(dir.join("data"))
        .env("ROOST_LOG", "info");
    match crash {
        Some(p) => cmd.env("ROOST_CRASH_AT", p),
        None => cmd.env_remove("ROOST_CRASH_AT"),
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);
    let child = cmd.spawn().context("starting roost serve")?;
    Ok(Child2 {
        child,
        log,
        started: Instant::now(),
    })
}

impl Child2 {
    /// Waits for the "serving" line: recovery is done. Returns the recovery time.
    fn ready(&mut self) -> anyhow::Result<Duration> {
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            if std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .contains("serving")
            {
                return Ok(self.started.elapsed());
            }
            if let Some(st) = self.child.try_wait()? {
                bail!(
                    "roost serve exited during recovery ({st}); log {}",
                    self.log.display()
                );
            }
            if Instant::now() > until {
                bail!(
                    "roost serve not ready after 120 s; log {}",
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `limit` for the child to die by itself (a crash point); true if it did.
    fn died_within(&mut self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}

impl Drop for Child2 {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One submitted file and what the drill expects of it.
struct Sent {
    name: String,
    key: String,
    /// Another file with the same key and content, whose result this one must equal.
    retry_of: Option<String>,
    expect_rejected: bool,
}

fn drop_file(sp: &SpoolPaths, name: &str, body: &[u8]) -> anyhow::Result<()> {
    let tmp = sp.tmp.join(format!(".{name}"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(body)?;
    f.sync_all()?;
    std::fs::rename(&tmp, sp.new.join(name))?;
    Ok(())
}

fn read_result(sp: &SpoolPaths, name: &str) -> Option<BatchResult> {
    std::fs::read(sp.out.join(name))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// Runs the drill; prints the report; returns the number of violations.
pub fn run(opts: &DrillOptions) -> anyhow::Result<usize> {
    let dir = opts.data_dir.clone();
    std::fs::create_dir_all(&dir)?;
    let sp = SpoolPaths::new(&dir.join("data").join("spool"));
    let mut rng = SplitMix(opts.seed);
    let mut violations: Vec<String> = Vec::new();
    let mut recoveries: Vec<Duration> = Vec::new();
    let mut sent: Vec<Sent> = Vec::new();
    let mut bodies: Vec<(String, Vec<u8>)> = Vec::new(); // key, body of every original batch
                                                         // Ids the drill believes live (from committed results it has read), for deletes.
    let mut live: BTreeMap<u64, &'static str> = BTreeMap::new();
    let rounds = opts.kills + 1;
    let per_round = opts.batches.div_ceil(rounds);
    let mut starts = 0;
    let mut kill_log = Vec::new();
    let mut next_batch = 0;
    for round in 0..rounds {
        // Odd rounds die at a named crash point (the N-th time it is reached), even rounds at
        // a random moment; the last round is not killed.
        let last = round + 1 == rounds;
        let crash = if !last && round % 2 == 1 {
            let p = CRASH_POINTS[rng.below(CRASH_POINTS.len() as u64) as usize];
            Some(format!("{p}#{}", 1 + rng.below(4)))
        } else {
            None
        };
        let mut child = spawn(&dir, starts, crash.as_deref())?;
        starts += 1;
        let mut fired = false;
        match child.ready() {
            Ok(d) => recoveries.push(d),
            // The crash point fired while recovery finished an earlier batch: that is this
            // round's kill; carry on with a clean daemon.
            Err(_) if crash.is_some() && child.child.try_wait()?.is_some() => {
                kill_log.push(format!(
                    "round {round}: died at crash point {} during recovery",
                    crash.as_deref().unwrap_or("")
                ));
                fired = true;
                drop(child);
                child = spawn(&dir, starts, None)?;
                starts += 1;
                recoveries.push(child.ready()?);
            }
            Err(e) => return Err(e),
        }
        let kill_at = rng.below(per_round as u64) as usize;
        let kill_delay = Duration::from_millis(rng.below(150));
        let mut killed = false;
        let quota = if last {
            opts.batches.saturating_sub(next_batch)
        } else {
            per_round
        };
        for j in 0..quota {
            if next_batch >= opts.batches {
                break;
            }
            let i = next_batch;
            next_batch += 1;
            let name = format!("b{i:06}.json");
            if rng.below(10) == 0 && !bodies.is_empty() {
                // A retry of an earlier batch: same key, same content, new file.
                let k = rng.below(bodies.len() as u64) as usize;
                let (key, body) = bodies[k].clone();
                let orig = sent
                    .iter()
                    .find(|s| s.key == key && s.retry_of.is_none())
                    .map(|s| s.name.clone());
                drop_file(&sp, &name, &body)?;
                sent.push(Sent {
                    name,
                    key,
                    retry_of: orig,
                    expect_rejected: false,
                });
            } else {
                let key = format!("drill-{}-{i}", opts.seed);
                let nops = 1 + rng.below(3) as usize;
                let mut ops = Vec::new();
                let mut expect_rejected = false;
                for k in 0..nops {
                    let r = rng.below(10);
                    if r < 2 && !live.is_empty() {
                        let pick = rng.below(live.len() as u64) as usize;
                        if let Some((&id, &shard)) = live.iter().nth(pick) {
                            live.remove(&id);
                            ops.push(json!({"op": "delete", "shard": shard, "id": id}));
                            continue;
                        }
                    }
                    if r == 2 {
                        expect_rejected = true;
                        ops.push(json!({"op": "delete", "shard": SHARDS[0], "id": 1u64 << 60}));
                        continue;
                    }
                    let shard = SHARDS[rng.below(SHARDS.len() as u64) as usize];
                    ops.push(
                        json!({"op": "create", "shard": shard, "record": {"drill": key, "op": k}}),
                    );
                }
                let body = serde_json::to_vec(&json!({"request_key": key, "ops": ops}))?;
                drop_file(&sp, &name, &body)?;
                bodies.push((key.clone(), body));
                sent.push(Sent {
                    name,
                    key,
                    retry_of: None,
                    expect_rejected,
                });
            }
            if !last && crash.is_none() && j == kill_at {
                std::thread::sleep(kill_delay);
                child.kill();
                killed = true;
                kill_log.push(format!(
                    "round {round}: SIGKILL at a random moment ({} ms after batch {i})",
                    kill_delay.as_millis()
                ));
                break;
            }
        }
        if let (Some(p), false) = (&crash, fired) {
            if child.died_within(Duration::from_secs(10)) {
                kill_log.push(format!("round {round}: died at crash point {p}"));
            } else {
                kill_log.push(format!(
                    "round {round}: crash point {p} not reached in 10 s; SIGKILL"
                ));
            }
            killed = true;
        }
        if !killed && !last {
            kill_log.push(format!("round {round}: SIGKILL after the round's batches"));
        }
        drop(child); // SIGKILL if still running
        restart_and_check(
            &dir,
            &sp,
            &sent,
            &mut live,
            &mut violations,
            &mut starts,
            &mut recoveries,
        )?;
    }
    let kills = kill_log.len();
    println!(
        "roost drill: seed {} , {} batches ({} files), {} rounds, {} process starts",
        opts.seed,
        bodies.len(),
        sent.len(),
        rounds,
        starts
    );
    for l in &kill_log {
        println!("  {l}");
    }
    let ms: Vec<u128> = recoveries.iter().map(Duration::as_millis).collect();
    println!("  kills: {kills}; recovery times (spawn to serving, ms): {ms:?}");
    let committed = sent
        .iter()
        .filter(|s| read_result(&sp, &s.name).is_some_and(|r| r.status() == Status::Committed))
        .count();
    println!("  results: {committed} committed of {} files", sent.len());
    if violations.is_empty() {
        println!("  violations: none");
    } else {
        println!("  violations: {}", violations.len());
        for v in &violations {
            println!("    {v}");
        }
    }
    Ok(violations.len())
}

/// Starts a clean daemon, waits for recovery and for every sent file to have a result,
/// checks the invariants, and kills it.
fn restart_and_check(
    dir: &Path,
    sp: &SpoolPaths,
    sent: &[Sent],
    live: &mut BTreeMap<u64, &'static str>,
    violations: &mut Vec<String>,
    starts: &mut usize,
    recoveries: &mut Vec<Duration>,
) -> anyhow::Result<()> {
    let mut c = spawn(dir, *starts, None)?;
    *starts += 1;
    recoveries.push(c.ready()?);
    wait_drained(sp, sent)?;
    check(dir, sp, sent, live, violations)?;
    c.kill();
    Ok(())
}

fn wait_drained(sp: &SpoolPaths, sent: &[Sent]) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let missing = sent
            .iter()
            .filter(|s| !sp.out.join(&s.name).exists())
            .count();
        if missing == 0 {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("{missing} dropped files have no result after 120 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The invariants, on the files, with the daemon idle.
fn check(
    dir: &Path,
    sp: &SpoolPaths,
    sent: &[Sent],
    live: &mut BTreeMap<u64, &'static str>,
    violations: &mut Vec<String>,
) -> anyhow::Result<()> {
    let data = dir.join("data");
    let report = super::verify::verify(RealStorage::shared(), &data);
    violations.extend(report.violations.iter().map(|v| format!("verify: {v}")));
    // Every record, by shard.
    let mut records: HashMap<u64, (&str, Value)> = HashMap::new();
    let mut tags: HashMap<String, usize> = HashMap::new();
    for s in SHARDS {
        let sdir = data.join(SHARDS_DIR).join(s);
        if !sdir.is_dir() {
            continue;
        }
        let sh = Shard::open(
            &sdir,
            ShardOptions {
                read_only: true,
                ..ShardOptions::default()
            },
        )?;
        for (id, rec) in sh.scan()? {
            let v: Value = serde_json::from_slice(&rec)?;
            *tags.entry(v.to_string()).or_default() += 1;
            records.insert(id, (s, v));
        }
    }
    for (tag, n) in &tags {
        if *n > 1 {
            violations.push(format!("a create produced {n} records: {tag}"));
        }
    }
    let mut deleted: HashSet<u64> = HashSet::new();
    let mut results: BTreeMap<&str, BatchResult> = BTreeMap::new();
    for s in sent {
        match read_result(sp, &s.name) {
            None => violations.push(format!("{}: no result", s.name)),
            Some(r) => {
                if r.status() == Status::Committed {
                    for op in r.ops().iter() {
                        if op.op == "delete" {
                            deleted.insert(op.id);
                        }
                    }
                }
                results.insert(&s.name, r);
            }
        }
    }
    live.clear();
    for s in sent {
        let Some(r) = results.get(s.name.as_str()) else {
            continue;
        };
        if s.expect_rejected && r.status() == Status::Committed {
            violations.push(format!("{}: expected a rejection, got committed", s.name));
        }
        if let Some(orig) = &s.retry_of {
            if let Some(o) = results.get(orig.as_str()) {
                if o.status() == Status::Committed && o != r {
                    violations.push(format!(
                        "{}: retry of {orig} got a different result",
                        s.name
                    ));
                }
            }
        }
        if r.status() != Status::Committed || s.retry_of.is_some() {
            continue;
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
    Ok(())
}
