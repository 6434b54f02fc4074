//! `Engine::submit` of detached batches (a bulk file's lines, a stream's buffered lines):
//! each batch gets the answer it would get alone, in item order, even when a key comes twice
//! in one group.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

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

/// Goal: the one way in takes a source only in the mode it fits (a spool name for result
/// files, a detached source for answers handed back), refusing the call before any work:
/// nothing is claimed, no file is written, the engine goes on.
#[test]
fn a_source_that_does_not_fit_the_mode_is_refused_before_any_work() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let x = parse(
        &json!({"request_key": "x", "ops": [{"op": "create", "shard": "s1", "record": {"x": 1}}]}),
    );
    let as_file = e.submit(&[(&x, "bulk/f/1")], Deliver::Files);
    assert!(as_file.is_err(), "a detached source as a file: {as_file:?}");
    let handed = e.submit(&[(&x, "x.json")], Deliver::Returned);
    assert!(handed.is_err(), "a spool name handed back: {handed:?}");
    let mixed = e.submit(&[(&x, "bulk/f/1"), (&x, "x.json")], Deliver::Returned);
    assert!(mixed.is_err(), "a group with one misfit: {mixed:?}");
    assert!(!e.is_failed(), "a refused call latches nothing");
    assert_eq!(e.last_lsn(), 0, "nothing was claimed");
    assert!(visible_result(&disk, "x.json").expect("out").is_none());
    let r = e.one_detached(&x, "bulk/f/2").expect("x fits");
    assert_eq!(r.status(), Status::Committed);
}

/// Goal: with answers handed over early (the stream), every item is handed over exactly
/// once, also one that waited for an earlier item of its group with the same key (it runs
/// again once that one is finished, and its duplicate answer is handed over then).
#[test]
fn every_item_of_an_early_group_is_handed_over_once() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let z = parse(
        &json!({"request_key": "z", "ops": [{"op": "create", "shard": "s1", "record": {"z": 1}}]}),
    );
    let w = parse(&json!({"request_key": "w", "ops": [{"op": "delete", "shard": "s1", "id": 99}]}));
    let items = [(&z, "stream/1/1"), (&w, "stream/1/2"), (&z, "stream/1/3")];
    let mut handed: Vec<(usize, roost::batch::BatchResult)> = Vec::new();
    let rs = e
        .submit(
            &items,
            Deliver::Early(&mut |i, r| handed.push((i, r.clone()))),
        )
        .expect("group");
    handed.sort_by_key(|(i, _)| *i);
    let indexes: Vec<usize> = handed.iter().map(|(i, _)| *i).collect();
    assert_eq!(indexes, [0, 1, 2], "each item handed over once");
    for (i, r) in &handed {
        assert_eq!(r, &rs[*i], "item {i}: handed over what is returned");
    }
    assert_eq!(rs[0].status(), Status::Committed);
    assert_eq!(rs[1].status(), Status::Rejected);
    assert_eq!(rs[2], rs[0], "the duplicate answers with the claim's ids");
}
