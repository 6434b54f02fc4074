//! Exhaustive crash schedules on the real pipeline (issue: prove the pipeline, part 2).
//!
//! Goal: for batches of up to 3 ops over 2 shards (creates and deletes, with and without a
//! rejected op), crash at every named point of the first attempt, then at every point of
//! the retry after it (two crashes per batch), recover, and check the five invariants of
//! RoostApplyBatch.tla on the files after every recovery and after the final retry.
//! Method: the real engine over the simulated disk; each crash is taken as a process crash
//! (everything written stays), a power loss (unsynced writes dropped) and a torn power loss
//! (a prefix of unsynced writes kept, the last one torn). The number of schedules is printed.
//! Beyond the model's five: a result the client could see after a crash stays the answer
//! (`AckedResultKept`: every later retry answers the same status and ids).
//! The mutant build (`--features roost/mutant-no-claim`) must fail this test.

use roost::batch::Batch;
use roost::crash::NthCrash;
use roost_tests::*;
use roost_wal::storage::{CrashMode, SimStorage};
use serde_json::json;
use std::sync::Arc;

const SHARDS: &[&str] = &["s1", "s2"];

fn c(shard: &str, tag: &str) -> serde_json::Value {
    json!({"op": "create", "shard": shard, "record": {"tag": tag}})
}
fn d(shard: &str, id: u64) -> serde_json::Value {
    json!({"op": "delete", "shard": shard, "id": id})
}

/// The base: ids 1 (s1) and 2 (s2) exist before each batch.
fn base() -> SimStorage {
    let disk = SimStorage::new();
    let setup = parse(&json!({"request_key": "setup", "ops": [c("s1", "o1"), c("s2", "o2")]}));
    run_batch(&disk, no_crash(), &setup, "setup.json").expect("setup");
    disk
}

fn batches() -> Vec<Batch> {
    let ops = vec![
        vec![c("s1", "a")],
        vec![d("s1", 1)],
        vec![c("s1", "a"), c("s2", "b")],
        vec![c("s1", "a"), d("s1", 1), c("s2", "b")],
        vec![d("s2", 2), c("s1", "a"), c("s1", "b")],
        vec![c("s2", "a"), c("s1", "b"), d("s2", 2)],
        vec![d("s1", 1), d("s2", 2), c("s2", "a")],
        vec![c("s1", "a"), d("s1", 999)], // rejected at op 1
        vec![c("s1", "a"), c("s2", "b"), d("s2", 1)], // rejected: id 1 is on s1
        vec![d("s1", 1), d("s1", 1)],     // rejected: second delete of the same id
    ];
    ops.into_iter()
        .enumerate()
        .map(|(i, ops)| parse(&json!({"request_key": format!("batch-{i}"), "ops": ops})))
        .collect()
}

const MODES: [CrashMode; 3] = [
    CrashMode::Process,
    CrashMode::PowerDrop,
    CrashMode::PowerTear { seed: 0 },
];

fn mode_with_seed(m: CrashMode, seed: u64) -> CrashMode {
    match m {
        CrashMode::PowerTear { .. } => CrashMode::PowerTear { seed },
        other => other,
    }
}

#[test]
fn every_crash_point_twice_per_batch_keeps_the_invariants() {
    let base_disk = base();
    let base_contents = contents(&base_disk, SHARDS);
    let mut schedules = 0u64;
    let mut seed = 1u64;
    let mut names = std::collections::BTreeSet::new();
    // Every failure, not just the first: the summary by invariant shows what a broken build
    // (the mutant) does.
    let mut failures: Vec<String> = Vec::new();
    let mut fail = |msg: String| failures.push(msg);
    for b in batches() {
        let first = points(&base_disk, &b);
        names.extend(first.iter().cloned());
        for c1 in 0..=first.len() as u64 {
            for mode in MODES {
                seed += 1;
                let mode = mode_with_seed(mode, seed);
                // Attempt 1, crashing at the c1-th point (0: no crash).
                let d1 = base_disk.crash(CrashMode::Process);
                let hook = if c1 == 0 { None } else { Some(c1) };
                let r1 = run_batch(&d1, Arc::new(NthCrash::new(hook)), &b, "b.json");
                if c1 == 0 {
                    let r = r1.expect("clean run");
                    if let Err(e) = check_invariants(&d1, SHARDS, &base_contents, &b, Some(&r)) {
                        fail(format!("clean {}: {e}", b.request_key));
                    }
                    schedules += 1;
                    break;
                }
                assert!(r1.is_err(), "crash point {c1} not reached");
                let after1 = d1.crash(mode);
                // What the client saw before the crash: an answer, once visible, must stay
                // the answer (same status, same ids) whatever recovery and retries do.
                let acked1 = visible_result(&after1, "b.json").unwrap_or_else(|e| {
                    fail(format!(
                        "{} crash at {} ({mode:?}): {e}",
                        b.request_key,
                        first[c1 as usize - 1]
                    ));
                    None
                });
                // Every crash point of the retry (recovery + resubmission) on a copy.
                let retry_points = {
                    let copy = after1.crash(CrashMode::Process);
                    let h = Arc::new(NthCrash::new(None));
                    let r = run_batch(&copy, h.clone(), &b, "b.json").unwrap_or_else(|e| {
                        panic!("{} c1={c1} {mode:?}: retry failed: {e}", b.request_key)
                    });
                    if let Err(e) = check_invariants(&copy, SHARDS, &base_contents, &b, Some(&r)) {
                        fail(format!(
                            "{} crash at {} ({mode:?}), retry: {e}",
                            b.request_key,
                            first[c1 as usize - 1]
                        ));
                    }
                    if let Some(a) = acked1.as_ref().filter(|a| **a != r) {
                        fail(format!(
                            "AckedResultKept: {} crash at {} ({mode:?}): the client saw {a:?}, the retry answered {r:?}",
                            b.request_key,
                            first[c1 as usize - 1]
                        ));
                    }
                    names.extend(h.reached());
                    h.reached().len() as u64
                };
                schedules += 1;
                for c2 in 1..=retry_points {
                    let d2 = after1.crash(CrashMode::Process);
                    let r2 = run_batch(&d2, Arc::new(NthCrash::new(Some(c2))), &b, "b.json");
                    assert!(r2.is_err(), "retry crash point {c2} not reached");
                    seed += 1;
                    let after2 = d2.crash(mode_with_seed(mode, seed));
                    let acked2 = visible_result(&after2, "b.json").unwrap_or_else(|e| {
                        fail(format!("{} c1={c1} c2={c2} {mode:?}: {e}", b.request_key));
                        None
                    });
                    // Recovery alone, then the invariants on the files.
                    let e = open_engine(&after2, no_crash()).unwrap_or_else(|e| {
                        panic!(
                            "{} recovery after c1={c1} c2={c2} {mode:?}: {e}",
                            b.request_key
                        )
                    });
                    drop(e);
                    if let Err(e) = check_invariants(&after2, SHARDS, &base_contents, &b, None) {
                        fail(format!(
                            "{} c1={c1} c2={c2} {mode:?} after recovery: {e}",
                            b.request_key
                        ));
                    }
                    // The final retry completes and converges.
                    let r = run_batch(&after2, no_crash(), &b, "b.json")
                        .unwrap_or_else(|e| panic!("final retry: {e}"));
                    if let Err(e) = check_invariants(&after2, SHARDS, &base_contents, &b, Some(&r))
                    {
                        fail(format!(
                            "{} c1={c1} ({}) c2={c2} {mode:?} final: {e}",
                            b.request_key,
                            first[c1 as usize - 1]
                        ));
                    }
                    for a in [&acked1, &acked2].into_iter().flatten() {
                        if *a != r {
                            fail(format!(
                                "AckedResultKept: {} c1={c1} ({}) c2={c2} {mode:?}: the client saw {a:?}, the final retry answered {r:?}",
                                b.request_key,
                                first[c1 as usize - 1]
                            ));
                        }
                    }
                    schedules += 1;
                }
            }
        }
    }
    let mut by_invariant: std::collections::BTreeMap<&str, usize> =
        std::collections::BTreeMap::new();
    for f in &failures {
        for inv in [
            "AckedResultKept",
            "NoPartialShard",
            "RejectedBatchWritesNothing",
            "AuditOnlyCommitted",
            "AtMostOnePerCreate",
            "RetryConverges",
        ] {
            if f.contains(inv) {
                *by_invariant.entry(inv).or_default() += 1;
            }
        }
    }
    if !failures.is_empty() {
        let dup = failures
            .iter()
            .find(|f| f.contains("produced"))
            .or(failures.first());
        panic!(
            "{} failed checks in {schedules} schedules, by invariant {by_invariant:?}; e.g.\n  {}\n  {}",
            failures.len(),
            failures[0],
            dup.map(String::as_str).unwrap_or("")
        );
    }
    let names: Vec<String> = names.into_iter().collect();
    println!("crash schedules: {schedules} (10 batches, 3 crash modes, 2 crashes each); points seen: {names:?}");
    eprintln!("crash schedules: {schedules}");
    assert!(schedules > 1000, "too few schedules: {schedules}");
    for p in [
        "after_plan",
        "after_claim_append",
        "after_claim_sync",
        "after_commit.0",
        "after_commit.1",
        "after_flush.1",
        "after_audit.2",
        "after_audit_sync",
        "after_done",
        "after_result",
        "after_input_removed",
    ] {
        assert!(
            names.iter().any(|n| n == p),
            "crash point {p} never exercised"
        );
    }
}
