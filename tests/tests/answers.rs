//! An answer, once visible, is what every later look at that request says (issue 13, item 6),
//! for the answers that have no claim behind them. A rejection is recorded in the WAL and
//! synced before it is answered, so the same batch sent again (or its input brought back by
//! a power loss) is rejected again even when the state it was judged against has changed;
//! a different batch under the same key is planned as new.
#![forbid(unsafe_code)]

use roost::batch::{BatchResult, Status};
use roost_storage::{CrashMode, SimStorage};
use roost_tests::*;
use serde_json::json;

/// Deletes id 1 on s1, which does not exist until `create()` commits.
fn delete_one() -> serde_json::Value {
    json!({"request_key": "r", "ops": [{"op": "delete", "shard": "s1", "id": 1}]})
}

fn create() -> serde_json::Value {
    json!({"request_key": "c", "ops": [{"op": "create", "shard": "s1", "record": {"n": 1}}]})
}

fn is_rejected_at(r: &BatchResult, op: u32) -> bool {
    matches!(r, BatchResult::Rejected { op_index, request_key, .. } if *op_index == op && request_key == "r")
}

/// Goal: a rejected batch sent again after the id it named came to exist is rejected again
/// (the original answer), also after a power loss right after the first answer; it never
/// commits. Method: reject `r`, commit a create of id 1, send `r` again; then a power loss
/// and `r` once more (its input back in `new/`, as a power loss can bring it).
#[test]
fn a_rejection_stays_the_answer_when_the_state_changes_and_after_a_power_loss() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let first = e.one_file(&parse(&delete_one()), "r.json").expect("r");
    assert!(is_rejected_at(&first, 0), "{first:?}");
    let c = e.one_file(&parse(&create()), "c.json").expect("c");
    assert_eq!(c.status(), Status::Committed);
    assert_eq!(
        c.ops()[0].id,
        1,
        "the id the rejected delete named now exists"
    );
    let again = e
        .one_file(&parse(&delete_one()), "r.json")
        .expect("r again");
    assert_eq!(again, first, "the same batch got another answer");
    drop(e);
    let disk = disk.crash(CrashMode::PowerDrop);
    let e = open_engine(&disk, no_crash()).expect("reopen");
    let after = e
        .one_file(&parse(&delete_one()), "r.json")
        .expect("r after");
    assert_eq!(after, first, "the answer changed after a power loss");
    assert_eq!(
        visible_result(&disk, "r.json").expect("whole"),
        Some(first),
        "out/r.json"
    );
    drop(e);
    check_disk(&disk);
}

/// Goal: a rejection does not bind its key: the client may fix the batch and send it under
/// the same key, and it is planned as new (and commits); from then on the key belongs to
/// that claim, so the old rejected content is a conflict. Method: reject `r`, then send a
/// different batch under key `r`, then the first content again.
#[test]
fn a_fixed_batch_under_a_rejected_key_is_planned_as_new() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let first = e.one_file(&parse(&delete_one()), "r.json").expect("r");
    assert!(is_rejected_at(&first, 0), "{first:?}");
    let fixed =
        json!({"request_key": "r", "ops": [{"op": "create", "shard": "s1", "record": {"n": 2}}]});
    let r = e.one_file(&parse(&fixed), "r.json").expect("fixed");
    assert_eq!(r.status(), Status::Committed, "{r:?}");
    drop(e);
    // After a restart (the WAL replayed), the same holds.
    let disk = disk.crash(CrashMode::Process);
    let e = open_engine(&disk, no_crash()).expect("reopen");
    let old = e
        .one_file(&parse(&delete_one()), "r2.json")
        .expect("old content");
    assert_eq!(old.status(), Status::Conflict, "{old:?}");
    let dup = e.one_file(&parse(&fixed), "r3.json").expect("fixed again");
    assert_eq!(dup, r, "the fixed batch's original answer");
    drop(e);
    check_disk(&disk);
}

/// `roost verify` on the files: every invariant, including that no recorded rejection has a
/// shard frame or an audit row.
fn check_disk(disk: &SimStorage) {
    let report = roost::ops::verify::verify(std::sync::Arc::new(disk.clone()), &data_dir());
    assert!(report.ok(), "{:?}", report.violations);
    assert!(
        report
            .checked
            .iter()
            .any(|c| c.contains("recorded rejections")),
        "{:?}",
        report.checked
    );
}
