//! Crash, restart, then power loss (issue 13: recovery must never build on the page cache).
//!
//! Goal: after a process crash the page cache still holds what was written but never
//! synced. Recovery reads it; if it finishes a batch from a claim that is only in the cache
//! and answers it, a power loss a moment later takes the claim while the answer, the shard
//! frames and later batches built on them stay. Then the lsn is handed out again, the retry
//! of the first batch creates its records again, and the answer the client read is not
//! what the system says any more.
//! Method: the real engine over the simulated disk. For each batch, crash the process at
//! every named point of its run (the cache survives). Restart: recovery plus two new
//! batches. Count the syncs of that second run, then replay it with the power cut at every
//! one of them (`freeze_after_syncs`), dropping or tearing what was not synced. Restart
//! again, retry every batch, and check: recovery opens, every create exists at most once
//! (exactly once if committed, under the id of its answer), every answer visible after the
//! cut is the answer of the retry, and `roost verify` holds.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use roost::batch::{Batch, BatchOp, BatchResult, Status};
use roost::pipeline::crash::NthCrash;
use roost_storage::{CrashMode, SimFaults, SimStorage};
use roost_tests::*;
use serde_json::json;

const SHARDS: &[&str] = &["s1", "s2"];

fn c(shard: &str, tag: &str) -> serde_json::Value {
    json!({"op": "create", "shard": shard, "record": {"tag": tag}})
}

/// The disk with ids 1 (s1) and 2 (s2).
fn base() -> SimStorage {
    let disk = SimStorage::new();
    let setup = parse(&json!({"request_key": "setup", "ops": [c("s1", "o1"), c("s2", "o2")]}));
    run_batch(&disk, no_crash(), &setup, "setup.json").expect("setup");
    disk
}

/// The batches crashed in the first run.
fn first_batches() -> Vec<(Batch, &'static str)> {
    vec![
        (
            parse(&json!({"request_key": "a", "ops": [c("s1", "a1"), c("s2", "a2")]})),
            "a.json",
        ),
        (
            parse(
                &json!({"request_key": "b", "ops": [{"op": "delete", "shard": "s1", "id": 1}, c("s2", "b1")]}),
            ),
            "b.json",
        ),
    ]
}

/// The batches the second run takes after its recovery.
fn second_batches() -> Vec<(Batch, &'static str)> {
    vec![
        (
            parse(&json!({"request_key": "x", "ops": [c("s1", "x1"), c("s2", "x2")]})),
            "x.json",
        ),
        (
            parse(&json!({"request_key": "y", "ops": [c("s2", "y1")]})),
            "y.json",
        ),
    ]
}

/// Recovery, then the second run's batches; errors are what a crash test expects to see
/// only if the disk froze (they are not: a frozen disk still answers success).
fn second_run(disk: &SimStorage) -> Result<(), String> {
    let e = open_engine(disk, no_crash()).map_err(|e| format!("recovery: {e}"))?;
    for (b, name) in second_batches() {
        e.one_file(&b, name)
            .map_err(|err| format!("{name}: {err}"))?;
    }
    // Their durability round, where the serve loop runs it: its syncs are cut points too.
    e.settle()
        .map_err(|err| format!("durability round: {err}"))?;
    Ok(())
}

/// Every record with this tag, across shards: (shard, id).
fn holders(now: &Contents, tag: &str) -> Vec<(String, u64)> {
    let want = json!({"tag": tag}).to_string().into_bytes();
    now.iter()
        .flat_map(|(s, m)| {
            m.iter()
                .filter(|(_, v)| **v == want)
                .map(move |(id, _)| (s.clone(), *id))
        })
        .collect()
}

/// Every answer a client could have read on `frozen` before the power went (the live image
/// at the cut, including results renamed into `out/` whose directory sync had not happened).
fn read_before_cut(frozen: &SimStorage) -> BTreeMap<&'static str, BatchResult> {
    let all: Vec<(Batch, &str)> = first_batches()
        .into_iter()
        .chain(second_batches())
        .collect();
    all.iter()
        .filter_map(|(_, n)| {
            let path = data_dir().join("spool").join("out").join(n);
            let bytes = frozen.file_bytes_at_freeze(&path)?;
            serde_json::from_slice(&bytes).ok().map(|r| (*n, r))
        })
        .collect()
}

/// After the cut: recovery opens, every batch retried, and the invariants hold; `acked` are
/// the answers read before the cut.
fn check_after_cut(
    disk: &SimStorage,
    acked: &BTreeMap<&str, BatchResult>,
    what: &str,
) -> Vec<String> {
    let mut bad = Vec::new();
    let all: Vec<(Batch, &str)> = first_batches()
        .into_iter()
        .chain(second_batches())
        .collect();
    let e = match open_engine(disk, no_crash()) {
        Ok(e) => e,
        Err(err) => return vec![format!("{what}: recovery refused to open: {err}")],
    };
    let mut answers = BTreeMap::new();
    for (b, name) in &all {
        match e.one_file(b, name) {
            Ok(r) => {
                answers.insert(*name, r);
            }
            Err(err) => bad.push(format!("{what}: retry of {name} failed: {err}")),
        }
    }
    drop(e);
    for (name, seen) in acked {
        if answers.get(name).is_some_and(|r| r != seen) {
            bad.push(format!(
                "AckedResultKept: {what}: {name} was answered {seen:?}, the retry says {:?}",
                answers.get(name)
            ));
        }
    }
    let now = contents(disk, SHARDS);
    for (b, name) in &all {
        let Some(r) = answers.get(name) else { continue };
        for (k, op) in b.ops.iter().enumerate() {
            let BatchOp::Create { record, shard, .. } = op else {
                continue;
            };
            let tag: serde_json::Value = serde_json::from_slice(record).unwrap_or_default();
            let tag = tag["tag"].as_str().unwrap_or_default().to_owned();
            let held = holders(&now, &tag);
            let want = (r.status() == Status::Committed).then(|| (shard.clone(), r.ops()[k].id));
            if held.len() > 1 {
                bad.push(format!(
                    "AtMostOnePerCreate: {what}: op {k} of {name} produced {} records",
                    held.len()
                ));
            } else if want.is_some() && held.first() != want.as_ref() {
                bad.push(format!(
                    "RetryConverges: {what}: op {k} of {name} answered {want:?}, the shards hold {held:?}"
                ));
            }
        }
    }
    let report = roost::ops::verify::verify(Arc::new(disk.clone()), &data_dir());
    if !report.ok() {
        bad.push(format!("{what}: verify: {:?}", report.violations));
    }
    bad
}

#[test]
fn a_power_loss_after_a_crash_and_restart_keeps_every_answer() {
    let base_disk = base();
    let mut schedules = 0u64;
    let mut failures = Vec::new();
    for (b, name) in first_batches() {
        let pts = points(&base_disk, &b);
        for (i, point) in pts.iter().enumerate() {
            let crashed = base_disk.crash(CrashMode::Process);
            let r = run_batch(
                &crashed,
                Arc::new(NthCrash::new(Some(i as u64 + 1))),
                &b,
                name,
            );
            assert!(r.is_err(), "crash point {point} not reached");
            let restarted = crashed.crash(CrashMode::Process);
            // How many syncs the second run makes, on a copy.
            let probe = restarted.crash(CrashMode::Process);
            second_run(&probe).unwrap_or_else(|e| panic!("{name} at {point}: {e}"));
            let syncs = probe.sync_count();
            for cut in 0..=syncs {
                for (m, mode) in [CrashMode::PowerDrop, CrashMode::PowerTear { seed: cut + 1 }]
                    .into_iter()
                    .enumerate()
                {
                    let d = restarted.crash(CrashMode::Process);
                    d.set_faults(SimFaults {
                        freeze_after_syncs: Some(cut),
                        ..SimFaults::default()
                    });
                    if let Err(e) = second_run(&d) {
                        panic!("{name} at {point}, cut {cut}: the frozen run failed: {e}");
                    }
                    let acked = read_before_cut(&d);
                    let after = d.crash(mode);
                    let what = format!(
                        "{name} crashed at {point}, power cut after sync {cut}/{syncs} (mode {m})"
                    );
                    failures.extend(check_after_cut(&after, &acked, &what));
                    schedules += 1;
                }
            }
        }
    }
    println!("crash-restart-power schedules: {schedules}");
    eprintln!("crash-restart-power schedules: {schedules}");
    assert!(schedules > 100, "too few schedules: {schedules}");
    assert!(
        failures.is_empty(),
        "{} failures in {schedules} schedules; first:\n  {}",
        failures.len(),
        failures
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}
