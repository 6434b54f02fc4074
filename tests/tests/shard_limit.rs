//! `shards_max` (issue 25, item 3): a batch that would create a shard past the limit is
//! rejected with a reason that names the limit and writes nothing to the shards, alone or in
//! a group, before and after a restart; batches on shards that exist still commit.
#![forbid(unsafe_code)]

use roost::batch::{BatchResult, Status};
use roost_storage::{SimStorage, Storage};
use roost_tests::*;
use serde_json::json;

fn creates(key: &str, shards: &[&str]) -> roost::batch::Batch {
    let ops: Vec<_> = shards
        .iter()
        .map(|s| json!({"op": "create", "shard": s, "record": {"k": key}}))
        .collect();
    parse(&json!({"request_key": key, "ops": ops}))
}

/// Nothing of shard `name` on the simulated disk: no segment, no spare, no lock.
fn no_files_of(disk: &SimStorage, name: &str) -> bool {
    let dir = data_dir().join("shards").join(name);
    disk.list(&dir).map_or(true, |names| names.is_empty())
}

fn rejected_at(r: &BatchResult) -> (u32, String) {
    match r {
        BatchResult::Rejected {
            op_index, reason, ..
        } => (*op_index, reason.clone()),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Goal: with `shards_max = 3` and two shards in use, a batch creating on a third and a
/// fourth new shard is rejected at the fourth's op, naming the limit, and leaves neither
/// shard on disk; sent again it gets the same rejection; a batch on an existing shard and
/// one creating the third shard alone commit; after a restart the count holds (the fourth
/// is still refused). In a group, the batch past the limit is rejected and its neighbour on
/// an existing shard commits.
#[test]
fn a_batch_creating_a_shard_past_shards_max_is_rejected_and_writes_nothing() {
    let disk = SimStorage::new();
    let tune = |c: &mut roost::config::Config| c.shards_max = 3;
    let e = open_engine_with(&disk, no_crash(), tune).expect("open");
    let first = e.one_detached(&creates("a", &["s1", "s2"]), "bulk/f/1");
    assert_eq!(first.expect("a").status(), Status::Committed);
    let over = creates("b", &["s3", "s4"]);
    let r = e.one_detached(&over, "bulk/f/2").expect("b");
    let (op, reason) = rejected_at(&r);
    assert_eq!(op, 1, "{reason}");
    assert_eq!(reason, "shard \"s4\" would be shard 4, past shards_max = 3");
    assert!(no_files_of(&disk, "s3") && no_files_of(&disk, "s4"));
    let again = e.one_detached(&over, "bulk/f/3").expect("b again");
    assert_eq!(again, r, "the recorded rejection answers again");
    let on_s1 = e.one_detached(&creates("c", &["s1"]), "bulk/f/4");
    assert_eq!(on_s1.expect("c").status(), Status::Committed);
    let third = e.one_detached(&creates("f", &["s3"]), "bulk/f/5");
    assert_eq!(third.expect("f").status(), Status::Committed);
    let group = e
        .submit(
            &[
                (&creates("d", &["s5"]), "bulk/g/1"),
                (&creates("e", &["s2", "s1"]), "bulk/g/2"),
            ],
            Deliver::Returned,
        )
        .expect("group");
    assert_eq!(rejected_at(&group[0]).0, 0);
    assert_eq!(group[1].status(), Status::Committed);
    drop(e);
    let e = open_engine_with(&disk, no_crash(), tune).expect("reopen");
    let r = e.one_detached(&creates("g", &["s4"]), "bulk/f/6");
    let (_, reason) = rejected_at(&r.expect("g"));
    assert!(reason.contains("past shards_max = 3"), "{reason}");
    assert!(no_files_of(&disk, "s4") && no_files_of(&disk, "s5"));
    let on_s3 = e.one_detached(&creates("h", &["s3", "s2"]), "bulk/f/7");
    assert_eq!(on_s3.expect("h").status(), Status::Committed);
}
