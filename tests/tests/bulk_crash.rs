//! Crash schedules for bulk files (issue 16): a kill or a power cut at every named point of a
//! bulk file's run, then recovery and the retry of the same file, must give the very bytes
//! of a crash-free run's result file (same statuses, same ids), with every create on its
//! shard once, and nothing published before the end.
//!
//! Method: the real engine over the simulated disk, the bulk worker's own line loop
//! (`roost::intake::bulk_files::answer_lines`) with one thread, so a crash-free run is
//! deterministic: once with one line per group, once with every line in one group
//! (`Engine::submit`: one planner pass, one sync, one flush per shard for all of them). For every point the clean run reaches, a process crash, a power loss and
//! a torn power loss there; reopen (recovery), run the file again, publish, compare. Last,
//! the input coming back after its result (a power cut between the result's sync and that of
//! `new/`) gives the same bytes again.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use roost::config::Config;
use roost::intake::bulk_files::answer_lines;
use roost::intake::bulk_lines::{self as bulk, Limits};
use roost::pipeline::crash::{CrashHook, NthCrash};
use roost::pipeline::records::WalEntry;
use roost::pipeline::Engine;
use roost_storage::{CrashMode, SimStorage};
use roost_tests::*;
use serde_json::{json, Value};

const NAME: &str = "load.jsonl";
/// What [`run`]'s error starts with when the crash came in the durability round.
const ROUND: &str = "durability round: ";
const SHARDS: &[&str] = &["s1", "s2"];

/// One thread taking groups of `group` lines.
fn tune(group: usize) -> impl Fn(&mut Config) {
    move |c: &mut Config| {
        c.bulk_in_flight = group;
        c.bulk_group_lines = group;
    }
}

fn create(key: &str, shards: &[&str]) -> String {
    let ops: Vec<Value> = shards
        .iter()
        .map(|s| json!({"op": "create", "shard": s, "record": {"key": key, "shard": s}}))
        .collect();
    json!({"request_key": key, "ops": ops}).to_string()
}

/// Creates over both shards, a delete of a record made before, a rejected delete, a
/// malformed line, a duplicate line and a conflict.
fn body() -> String {
    [
        create("a", &["s1", "s2"]),
        create("b", &["s2"]),
        json!({"request_key": "del", "ops": [{"op": "delete", "shard": "s1", "id": 1}]})
            .to_string(),
        json!({"request_key": "rej", "ops": [{"op": "delete", "shard": "s2", "id": 999}]})
            .to_string(),
        r#"{"request_key":"bad","ops":["#.to_owned(),
        create("a", &["s1", "s2"]),
        create("b", &["s1"]),
        create("c", &["s1"]),
    ]
    .join("\n")
}

/// The disk with id 1 on s1 and the bulk file in `new/`.
fn base() -> SimStorage {
    let disk = SimStorage::new();
    let setup = parse(
        &json!({"request_key": "setup", "ops": [{"op": "create", "shard": "s1", "record": {"key": "setup"}}]}),
    );
    run_batch(&disk, no_crash(), &setup, "setup.json").expect("setup");
    let new = data_dir().join("spool/new").join(NAME);
    disk.put_file_bytes(&new, body().into_bytes());
    disk
}

/// Runs the bulk file on `disk` to its result (published), as the serve worker does; the
/// result bytes, or the engine's error (a crash).
fn run(disk: &SimStorage, crash: Arc<dyn CrashHook>, group: usize) -> Result<Vec<u8>, String> {
    let e: Engine = open_engine_with(disk, crash, tune(group)).map_err(|e| format!("open: {e}"))?;
    let text = body();
    let lines = bulk::lines(text.as_bytes(), &Limits::of(e.config()))?;
    let never = || false;
    let answers = answer_lines(&e, NAME, &lines, &never).map_err(|e| e.to_string())?;
    let answers = answers.ok_or("the file was left for later")?;
    e.answer_file(NAME, &answers, true)
        .map_err(|e| e.to_string())?;
    // The durability round the serve loop runs once the lines waited `tail_round_ms`: after
    // the result file, so a crash there finds it published.
    e.settle().map_err(|e| format!("{ROUND}{e}"))?;
    Ok(answers)
}

/// Every create of a committed line on its shard once, under the ids of its result line.
fn check_records(disk: &SimStorage, result: &[u8]) -> Result<(), String> {
    let now = contents(disk, SHARDS);
    let mut expected: BTreeMap<(String, u64), usize> = BTreeMap::new();
    for line in String::from_utf8_lossy(result).lines() {
        let r: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        for op in r["ops"].as_array().into_iter().flatten() {
            if op["op"] == "create" {
                let shard = op["shard"].as_str().unwrap_or("").to_owned();
                let id = op["id"].as_u64().unwrap_or(0);
                *expected.entry((shard, id)).or_default() += 1;
            }
        }
    }
    for ((shard, id), n) in expected {
        let held = now.get(&shard).is_some_and(|m| m.contains_key(&id));
        if !held {
            return Err(format!(
                "{shard}/{id} answered as created, not on the shard"
            ));
        }
        if n > 2 {
            return Err(format!("{shard}/{id} answered {n} times"));
        }
    }
    let records: usize = now.values().map(|m| m.len()).sum();
    let lines = String::from_utf8_lossy(result);
    // setup (deleted by "del") + a: 2 + b: 1 + c: 1.
    if records != 4 {
        return Err(format!(
            "{records} records on the shards, want 4: {now:?} {lines}"
        ));
    }
    Ok(())
}

/// The retry's result against the crash-free one: the very bytes, but for the lsns when
/// the crash moved them (recovery appends `done` records where the crash-free group had its
/// later claims), and then every lsn a line cites must be its key's record in the WAL.
fn same_answers(disk: &SimStorage, retry: &[u8], want: &str) -> Result<(), String> {
    let got = String::from_utf8_lossy(retry);
    if got == want {
        return Ok(());
    }
    let strip = |t: &str| -> Result<Vec<Value>, String> {
        let mut out = Vec::new();
        for line in t.lines() {
            let mut v: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
            if let Some(o) = v.as_object_mut() {
                o.remove("lsn");
                // A conflict's reason names the lsn it conflicts with.
                if o.get("status").is_some_and(|s| s == "conflict") {
                    o.remove("reason");
                }
            }
            out.push(v);
        }
        Ok(out)
    };
    if strip(&got)? != strip(want)? {
        return Err(format!(
            "the retry's result differs beyond lsns:\n{got}\nwant:\n{want}"
        ));
    }
    let wal = wal_entries(Arc::new(disk.clone()), &data_dir());
    for line in got.lines() {
        let v: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let (Some(lsn), Some(key)) = (v["lsn"].as_u64(), v["request_key"].as_str()) else {
            continue;
        };
        let cited = wal.iter().find(|(l, _)| *l == lsn).map(|(_, e)| e);
        match cited {
            Some(WalEntry::Claim(c)) if c.request_key == key => {}
            other => return Err(format!("{line}: lsn {lsn} holds {other:?}")),
        }
    }
    Ok(())
}

#[test]
fn crashes_at_every_point_give_the_same_result_file() {
    schedules(1);
}

#[test]
fn crashes_at_every_point_of_one_group_give_the_same_result_file() {
    schedules(8);
}

/// Every point of a clean run with groups of `group` lines, in every crash mode.
fn schedules(group: usize) {
    let hook = Arc::new(NthCrash::new(None));
    let clean = base();
    let reference = run(&clean, hook.clone(), group).expect("clean run");
    let points = hook.reached();
    assert!(points.len() > 20, "{points:?}");
    assert_reached(
        &points,
        &["after_flush.0", "after_audit_sync", "after_done"],
    );
    check_records(&clean, &reference).expect("clean run's records");
    let text = String::from_utf8_lossy(&reference).into_owned();
    assert_eq!(text.lines().count(), 8, "{text}");
    let mut schedules = 0;
    let modes = [
        CrashMode::Process,
        CrashMode::PowerDrop,
        CrashMode::PowerTear { seed: 1 },
        CrashMode::PowerTear { seed: 2 },
    ];
    for n in 1..=points.len() as u64 {
        for mode in modes {
            let what = format!("crash at {} (#{n}), {mode:?}", points[n as usize - 1]);
            let disk = base();
            let err = run(&disk, Arc::new(NthCrash::new(Some(n))), group).expect_err(&what);
            assert!(err.contains("crash"), "{what}: {err}");
            let after = disk.crash(mode);
            let published = after.file_bytes(&data_dir().join("spool/out").join(NAME));
            match err.starts_with(ROUND) {
                // Crashed in the durability round, after the result: it is the answer.
                true => assert_eq!(published.as_deref(), Some(reference.as_slice()), "{what}"),
                false => assert!(
                    published.is_none(),
                    "{what}: a result before every line was answered"
                ),
            }
            let retry =
                run(&after, no_crash(), group).unwrap_or_else(|e| panic!("{what}: retry: {e}"));
            same_answers(&after, &retry, &text).unwrap_or_else(|e| panic!("{what}: {e}"));
            check_records(&after, &retry).unwrap_or_else(|e| panic!("{what}: {e}"));
            schedules += 1;
        }
    }
    // The input back after its result (its removal not yet durable): the same bytes again.
    let new = data_dir().join("spool/new").join(NAME);
    clean.put_file_bytes(&new, body().into_bytes());
    let again = run(&clean, no_crash(), group).expect("again");
    assert_eq!(String::from_utf8_lossy(&again), text, "the input back");
    check_records(&clean, &again).expect("records after the input came back");
    println!(
        "bulk crash schedules, groups of {group}: {schedules} over {} points",
        points.len()
    );
}
