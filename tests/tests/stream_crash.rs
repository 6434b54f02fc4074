//! Crash schedules for streamed batches answered early (issue 16: `Engine::submit` with `Deliver::Early`,
//! what a stream connection runs): the engine hands each answer over once the batch is as
//! durable as a published result file, before the group's durability tail (shard flushes,
//! audit sync, `done` records). A kill or a power cut at every named point of the group's
//! run must keep every answer handed over before it: after recovery alone its lsn holds its
//! key's claim with the same ids, every id it created is on its shard, and the same batch
//! sent again gets the very same answer. Then the whole group sent again answers as a
//! crash-free run does (equal but for lsns), with every key claimed once and every create
//! on its shard once.
//!
//! Method: the real engine over the simulated disk, one group on one thread (the shard
//! owners apply concurrently, so the order of two shards' points may vary; their count does
//! not). For every point the clean run reaches, a process crash, a power loss and
//! two torn power losses there.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use roost::batch::{Batch, BatchResult};
use roost::pipeline::crash::{CrashHook, NthCrash};
use roost::pipeline::records::WalEntry;
use roost::pipeline::Engine;
use roost_storage::{CrashMode, SimStorage};
use roost_tests::*;
use serde_json::{json, Value};

const SHARDS: &[&str] = &["s1", "s2"];

/// A group to send and the records its run leaves on the shards.
#[derive(Clone, Copy)]
struct Group {
    lines: fn() -> Vec<Value>,
    records: usize,
}

/// In line order: creates over both shards, a delete of a record made before, a rejected
/// delete, the first batch again (a duplicate), a conflict, one more create. Records: a 2,
/// b 1, c 1 (setup deleted).
const MIXED: Group = Group {
    lines: || {
        vec![
            create_on("a", &["s1", "s2"]),
            create_on("b", &["s2"]),
            json!({"request_key": "del", "ops": [{"op": "delete", "shard": "s1", "id": 1}]}),
            json!({"request_key": "rej", "ops": [{"op": "delete", "shard": "s2", "id": 999}]}),
            create_on("a", &["s1", "s2"]),
            create_on("b", &["s1"]),
            create_on("c", &["s1"]),
        ]
    },
    records: 4,
};

/// Creates only: no rejection or duplicate whose answer syncs the WAL on its own, so only
/// the group's claim sync stands behind the early answers. Records: setup, a 2, b 1, c 1.
const CREATES: Group = Group {
    lines: || {
        vec![
            create_on("a", &["s1", "s2"]),
            create_on("b", &["s2"]),
            create_on("c", &["s1"]),
        ]
    },
    records: 5,
};

fn lines(g: Group) -> Vec<Batch> {
    (g.lines)().iter().map(parse).collect()
}

/// The disk with id 1 on s1.
fn base() -> SimStorage {
    let disk = SimStorage::new();
    let setup = parse(
        &json!({"request_key": "setup", "ops": [{"op": "create", "shard": "s1", "record": {"key": "setup"}}]}),
    );
    run_batch(&disk, no_crash(), &setup, "setup.json").expect("setup");
    disk
}

/// Opens the engine (recovery) and sends the lines as one stream group; the answers handed
/// over early (by line), and the group's own answers or its error (a crash).
type Run = (
    BTreeMap<usize, BatchResult>,
    Result<Vec<BatchResult>, String>,
);

fn run(disk: &SimStorage, crash: Arc<dyn CrashHook>, g: Group) -> Run {
    let mut early = BTreeMap::new();
    let e: Engine = match open_engine(disk, crash) {
        Ok(e) => e,
        Err(err) => return (early, Err(format!("open: {err}"))),
    };
    let batches = lines(g);
    let sources: Vec<String> = (1..=batches.len())
        .map(|n| format!("stream/1/{n}"))
        .collect();
    let items: Vec<(&Batch, &str)> = batches
        .iter()
        .zip(&sources)
        .map(|(b, s)| (b, s.as_str()))
        .collect();
    let all = e
        .submit(
            &items,
            Deliver::Early(&mut |i, r| {
                assert!(
                    early.insert(i, r.clone()).is_none(),
                    "line {i} handed over twice"
                );
            }),
        )
        .map_err(|e| e.to_string());
    // The durability round the serve loop runs once the group waited `tail_round_ms`.
    let all = all.and_then(|a| e.settle().map(|_| a).map_err(|e| e.to_string()));
    (early, all)
}

fn json(r: &BatchResult) -> Value {
    serde_json::to_value(r).unwrap_or(Value::Null)
}

/// After the crash and a recovery alone: every early answer cites its key's claim with its
/// ids, every id it created is on its shard, and the same line sent again (alone) gets the
/// very same answer.
fn kept(after: &SimStorage, early: &BTreeMap<usize, BatchResult>, g: Group) -> Result<(), String> {
    drop(open_engine(after, no_crash()).map_err(|e| format!("recovery: {e}"))?);
    let wal = wal_entries(Arc::new(after.clone()), &data_dir());
    let now = contents(after, SHARDS);
    for (i, r) in early {
        let BatchResult::Committed {
            request_key,
            lsn,
            ops,
        } = r
        else {
            continue;
        };
        match wal.iter().find(|(l, _)| l == lsn).map(|(_, e)| e) {
            Some(WalEntry::Claim(c)) if &c.request_key == request_key => {}
            other => return Err(format!("line {i}: lsn {lsn} holds {other:?}")),
        }
        for op in ops.iter().filter(|o| o.op == "create") {
            if !now.get(&op.shard).is_some_and(|m| m.contains_key(&op.id)) {
                return Err(format!(
                    "line {i}: {}/{} answered, not on the shard",
                    op.shard, op.id
                ));
            }
        }
    }
    let e = open_engine(after, no_crash()).map_err(|e| format!("reopen: {e}"))?;
    let batches = lines(g);
    for (i, r) in early {
        let source = format!("stream/2/{i}");
        let again = e
            .submit(&[(&batches[*i], source.as_str())], Deliver::Returned)
            .map_err(|e| format!("line {i} again: {e}"))?;
        if again.first().map(json) != Some(json(r)) {
            return Err(format!(
                "line {i}: {} was handed over, now {again:?}",
                json(r)
            ));
        }
    }
    Ok(())
}

/// A result without what a crash may move: its lsn and a conflict's reason (it names one).
fn strip(r: &BatchResult) -> Value {
    let mut v = json(r);
    if let Some(o) = v.as_object_mut() {
        o.remove("lsn");
        if o.get("status").is_some_and(|s| s == "conflict") {
            o.remove("reason");
        }
    }
    v
}

/// Every key claimed at most once, and the group's records on the shards.
fn once(disk: &SimStorage, g: Group) -> Result<(), String> {
    let mut claims: BTreeMap<String, usize> = BTreeMap::new();
    for (_, e) in wal_entries(Arc::new(disk.clone()), &data_dir()) {
        if let WalEntry::Claim(c) = e {
            *claims.entry(c.request_key).or_default() += 1;
        }
    }
    if let Some((key, n)) = claims.iter().find(|(_, n)| **n > 1) {
        return Err(format!("key {key} claimed {n} times"));
    }
    let now = contents(disk, SHARDS);
    match now.values().map(|m| m.len()).sum::<usize>() {
        n if n == g.records => Ok(()),
        n => Err(format!(
            "{n} records on the shards, want {}: {now:?}",
            g.records
        )),
    }
}

#[test]
fn early_answers_survive_a_crash_at_every_point_of_a_stream_group() {
    let (schedules, handed) = schedules(MIXED);
    let statuses: Vec<Value> = run(&base(), no_crash(), MIXED)
        .1
        .expect("clean run")
        .iter()
        .map(|r| json(r)["status"].clone())
        .collect();
    for s in ["committed", "rejected", "conflict"] {
        assert!(statuses.contains(&json!(s)), "no {s} among {statuses:?}");
    }
    println!("mixed stream group: {schedules} crash schedules, {handed} early answers kept");
}

#[test]
fn early_answers_of_creates_alone_survive_a_crash_at_every_point() {
    let (schedules, handed) = schedules(CREATES);
    println!("stream group of creates: {schedules} crash schedules, {handed} early answers kept");
}

/// Every point the clean run of `g` reaches, in every crash mode: what was handed over is
/// kept, and the group sent again answers as the clean run did. Returns the schedules run
/// and the early answers they checked.
fn schedules(g: Group) -> (usize, usize) {
    let hook = Arc::new(NthCrash::new(None));
    let clean = base();
    let (early, all) = run(&clean, hook.clone(), g);
    let want = all.expect("clean run");
    let points = hook.reached();
    assert!(points.len() > 8, "{points:?}");
    // Every line but one that waits for its key's claim to finish is answered early, and
    // with the answer the group returns.
    assert!(early.len() + 1 >= want.len(), "early {early:?}");
    for (i, r) in &early {
        assert_eq!(r, &want[*i], "line {i}");
    }
    once(&clean, g).expect("clean run");
    let modes = [
        CrashMode::Process,
        CrashMode::PowerDrop,
        CrashMode::PowerTear { seed: 1 },
        CrashMode::PowerTear { seed: 2 },
    ];
    let wanted: Vec<Value> = want.iter().map(strip).collect();
    let (mut schedules, mut handed) = (0, 0);
    for n in 1..=points.len() as u64 {
        for mode in modes {
            let what = format!("crash at {} (#{n}), {mode:?}", points[n as usize - 1]);
            let disk = base();
            let (early, all) = run(&disk, Arc::new(NthCrash::new(Some(n))), g);
            let err = all.expect_err(&what);
            assert!(err.contains("crash"), "{what}: {err}");
            handed += early.len();
            let after = disk.crash(mode);
            kept(&after, &early, g).unwrap_or_else(|e| panic!("{what}: {e}"));
            let (_, again) = run(&after, no_crash(), g);
            let again = again.unwrap_or_else(|e| panic!("{what}: retry: {e}"));
            let got: Vec<Value> = again.iter().map(strip).collect();
            assert_eq!(got, wanted, "{what}");
            once(&after, g).unwrap_or_else(|e| panic!("{what}: {e}"));
            schedules += 1;
        }
    }
    // The tail's points come after the early answers: some schedules crashed there.
    assert!(handed > 0, "no schedule crashed after an early answer");
    (schedules, handed)
}
