//! `Engine::submit` of detached batches (a bulk file's lines, a stream's buffered lines): each batch gets
//! the answer it would get alone, in item order, even when a key comes twice in one group.
#![forbid(unsafe_code)]

use roost::batch::{Batch, Status};
use roost_storage::SimStorage;
use roost_tests::*;
use serde_json::json;

fn group(e: &roost::pipeline::Engine, items: &[(&Batch, &str)]) -> Vec<Status> {
    e.submit(items, Deliver::Returned)
        .expect("group")
        .iter()
        .map(|r| r.status())
        .collect()
}

/// Goal: a key met twice in one group means what line order says. Key K holds a recorded
/// rejection of batch X; a group (K: Y, then K: X) commits Y, and X is then a conflict with
/// Y's claim (not the old rejection, which a lookup before Y was planned would have given,
/// and which a retry of X would then contradict). Sent again, the group gets the same
/// answers (a duplicate and a conflict).
#[test]
fn a_key_met_twice_in_a_group_is_decided_in_item_order() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let x = parse(&json!({"request_key": "k", "ops": [{"op": "delete", "shard": "s1", "id": 77}]}));
    let y = parse(
        &json!({"request_key": "k", "ops": [{"op": "create", "shard": "s1", "record": {"y": 1}}]}),
    );
    let first = e.one_detached(&x, "bulk/f/1").expect("x alone");
    assert_eq!(first.status(), Status::Rejected);
    let items = [(&y, "bulk/g/1"), (&x, "bulk/g/2")];
    assert_eq!(group(&e, &items), [Status::Committed, Status::Conflict]);
    assert_eq!(group(&e, &items), [Status::Committed, Status::Conflict]);
    let again = e.one_detached(&x, "bulk/h/1").expect("x again");
    assert_eq!(again.status(), Status::Conflict, "{again:?}");
    // The same batch twice in one group: one claim, then its duplicate.
    let z = parse(
        &json!({"request_key": "z", "ops": [{"op": "create", "shard": "s1", "record": {"z": 1}}]}),
    );
    let rs = e
        .submit(&[(&z, "bulk/i/1"), (&z, "bulk/i/2")], Deliver::Returned)
        .expect("z twice");
    assert_eq!(rs[0], rs[1], "the duplicate answers with the claim's ids");
    let records: usize = contents(&disk, &["s1"]).values().map(|m| m.len()).sum();
    assert_eq!(records, 2, "y and z, once each");
}
