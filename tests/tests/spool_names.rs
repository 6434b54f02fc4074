//! A spool name reused while the earlier batch under it is not settled (issue 13, item 2).
//! Recovery must never delete the new batch's input, publish the old answer over the new
//! one, or bring back an answer the client already consumed.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use roost::batch::{BatchResult, Status};
use roost::pipeline::crash::{HoldOnce, NthCrash, Step};
use roost_storage::{CrashMode, SimStorage, Storage};
use roost_tests::*;
use serde_json::json;

fn spool(sub: &str, name: &str) -> std::path::PathBuf {
    data_dir().join("spool").join(sub).join(name)
}

/// The client consumes `out/NAME`: removes it, durably.
fn consume(disk: &SimStorage, name: &str) {
    let out = spool("out", "");
    disk.remove(&out.join(name)).expect("remove result");
    disk.sync_dir(&out).expect("sync out/");
}

fn x() -> serde_json::Value {
    json!({"request_key": "x", "ops": [{"op": "create", "shard": "s1", "record": {"tag": "x"}}]})
}

fn y() -> serde_json::Value {
    json!({"request_key": "y", "ops": [{"op": "create", "shard": "s2", "record": {"tag": "y"}}]})
}

/// Goal: the earlier batch X, finished again by recovery, leaves a new batch Y waiting in
/// `new/NAME` alone (its input is not deleted, X's answer is not written for it), and Y then
/// gets its own answer.
/// Method: X crashes right after its answer (no `done`); the client reuses the name for Y,
/// which is in `new/NAME` when the daemon restarts; recovery; then Y is submitted.
#[test]
fn recovery_leaves_a_reused_names_new_input_alone() {
    let disk = SimStorage::new();
    let pts = points(&disk.crash(CrashMode::Process), &parse(&x()));
    let at = pts.iter().position(|p| p == "after_result").expect("point") as u64 + 1;
    let err = run_batch(
        &disk,
        Arc::new(NthCrash::new(Some(at))),
        &parse(&x()),
        "n.json",
    )
    .expect_err("crashes after its answer");
    assert!(err.to_string().contains("after_result"), "{err}");
    consume(&disk, "n.json");
    let y_bytes = serde_json::to_vec(&y()).expect("json");
    disk.put_file_bytes(&spool("new", "n.json"), y_bytes.clone());
    let disk = disk.crash(CrashMode::Process);
    let e = open_engine(&disk, no_crash()).expect("recovery");
    assert_eq!(e.figures().recovery.batches_finished, 1, "x finished again");
    assert_eq!(
        disk.file_bytes(&spool("new", "n.json")),
        Some(y_bytes),
        "recovery deleted the new batch's input"
    );
    assert_eq!(
        visible_result(&disk, "n.json").expect("whole"),
        None,
        "recovery published x's answer under the name y now uses"
    );
    let r = e.one_file(&parse(&y()), "n.json").expect("y");
    assert_eq!(r.status(), Status::Committed);
    assert_eq!(visible_result(&disk, "n.json").expect("whole"), Some(r));
}

/// Goal: once any answer for NAME is out, no earlier batch under NAME is finished again by a
/// later recovery: an answer the client consumed never comes back, and a later answer under
/// the name is never replaced by an earlier one.
/// Method: X commits under NAME (its `done` appended, not synced); the client consumes the
/// answer and reuses NAME for Y, which is rejected (no claim, so no WAL sync of its own);
/// the client consumes that too; the power goes. After recovery, `out/NAME` must not exist.
#[test]
fn a_consumed_answer_never_comes_back_after_the_name_was_reused() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let rx = e.one_file(&parse(&x()), "n.json").expect("x");
    assert_eq!(rx.status(), Status::Committed);
    consume(&disk, "n.json");
    let bad = json!({"request_key": "y", "ops": [{"op": "delete", "shard": "s1", "id": 999}]});
    let ry = e.one_file(&parse(&bad), "n.json").expect("y");
    assert!(matches!(ry, BatchResult::Rejected { .. }), "{ry:?}");
    assert_eq!(visible_result(&disk, "n.json").expect("whole"), Some(ry));
    consume(&disk, "n.json");
    drop(e);
    let disk = disk.crash(CrashMode::PowerDrop);
    let e = open_engine(&disk, no_crash()).expect("recovery");
    assert_eq!(
        e.figures().recovery.batches_finished,
        0,
        "x's done record was lost: it is finished again"
    );
    assert_eq!(
        visible_result(&disk, "n.json").expect("whole"),
        None,
        "an answer the client consumed came back"
    );
}

/// Goal (issue 13, item 6): a `conflict` answer cites an earlier claim; once the client has
/// read it, a power loss must not take that claim away (the key would then plan as new, and
/// a retry of the conflicting batch would commit: the answer would change).
/// Method: batch X is held right after its claim is appended (not yet synced); batch Y with
/// the same key and other content is answered `conflict`; the power goes at once. After
/// recovery, the retry of Y must still be that conflict.
#[test]
fn a_conflict_answer_survives_a_power_loss() {
    let disk = SimStorage::new();
    let (hook, handle) = HoldOnce::new(Step::AfterClaimAppend.at());
    let e = Arc::new(open_engine(&disk, hook).expect("open"));
    let held = {
        let e = e.clone();
        std::thread::spawn(move || e.one_file(&parse(&x()), "x.json"))
    };
    assert!(
        handle.reached(Duration::from_secs(20)),
        "x reached its claim"
    );
    let other = json!({"request_key": "x", "ops": [{"op": "create", "shard": "s2", "record": {"tag": "other"}}]});
    let seen = e.one_file(&parse(&other), "y.json").expect("y");
    assert_eq!(seen.status(), Status::Conflict, "{seen:?}");
    let after = disk.crash(CrashMode::PowerDrop);
    handle.release();
    let _ = held.join();
    drop(e);
    let r = run_batch(&after, no_crash(), &parse(&other), "y2.json").expect("retry of y");
    assert_eq!(
        r, seen,
        "the conflict the client read changed after a power loss"
    );
}

/// Goal (found in review): a later batch Y under a name must not lose its answer to an
/// earlier batch X under the same name whose `done` was not yet durable. Y removing its input
/// before X settled let recovery (both inputs gone, X's answer consumed) publish X's answer
/// again and then leave Y's out as "another request's".
/// Method: X is held right after its answer (no `done`); the client consumes it and drops Y
/// under the same name; Y runs in another thread until it blocks; the process dies there.
/// Recovery, then (as the serve loop would) any input still in `new/`: the answer in `out/`
/// must be Y's.
#[test]
fn a_later_batch_under_a_name_keeps_its_answer_after_a_crash() {
    let disk = SimStorage::new();
    let (hook, handle) = HoldOnce::new(Step::AfterResult.at());
    let e = Arc::new(open_engine(&disk, hook).expect("open"));
    let tx = {
        let e = e.clone();
        std::thread::spawn(move || e.one_file(&parse(&x()), "n.json"))
    };
    assert!(handle.reached(Duration::from_secs(20)), "x answered");
    consume(&disk, "n.json");
    disk.put_file_bytes(
        &spool("new", "n.json"),
        serde_json::to_vec(&y()).expect("json"),
    );
    let ty = {
        let e = e.clone();
        std::thread::spawn(move || e.one_file(&parse(&y()), "n.json"))
    };
    // Y claims, commits and then waits for X (bounded); the process dies while it waits.
    std::thread::sleep(Duration::from_millis(300));
    let crashed = disk.crash(CrashMode::Process);
    handle.release();
    let _ = tx.join();
    let _ = ty.join();
    drop(e);
    let e = open_engine(&crashed, no_crash()).expect("recovery");
    if crashed.file_bytes(&spool("new", "n.json")).is_some() {
        e.one_file(&parse(&y()), "n.json").expect("y from new/");
    }
    drop(e);
    let answer = visible_result(&crashed, "n.json")
        .expect("whole")
        .expect("an answer for n.json");
    assert_eq!(
        answer.request_key(),
        Some("y"),
        "the answer under the name is not y's: {answer:?}"
    );
}

/// Goal (issue 13, item 6): a rejection is not in the WAL, so once it is answered its input
/// must not come back after a power loss (it would be planned again, against newer state: a
/// delete of an id created since would then commit, and the answer the client read would
/// change).
/// Method: the batch file is in `new/` (durably); its delete is rejected; the power goes at
/// once. The input must be gone (so nothing can plan it again) and the answer the same.
#[test]
fn a_rejected_input_does_not_come_back_after_a_power_loss() {
    let disk = SimStorage::new();
    let bad = json!({"request_key": "r", "ops": [{"op": "delete", "shard": "s1", "id": 1}]});
    disk.put_file_bytes(
        &spool("new", "r.json"),
        serde_json::to_vec(&bad).expect("json"),
    );
    let e = open_engine(&disk, no_crash()).expect("open");
    let seen = e.one_file(&parse(&bad), "r.json").expect("r");
    assert!(matches!(seen, BatchResult::Rejected { .. }), "{seen:?}");
    drop(e);
    let after = disk.crash(CrashMode::PowerDrop);
    assert_eq!(
        after.file_bytes(&spool("new", "r.json")),
        None,
        "the rejected input came back after the power loss"
    );
    assert_eq!(visible_result(&after, "r.json").expect("whole"), Some(seen));
}
