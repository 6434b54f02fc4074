//! A full disk on the simulated disk (issue 13, item 7): the engine pauses intake before a
//! claim when a log has no spare segment, latches nothing, loses nothing across a power loss
//! while paused, and takes batches again once `try_resume` finds room. The real-file-system
//! run is `daemon/tests/full_disk.rs`.
#![forbid(unsafe_code)]

use roost::batch::{BatchResult, Status};
use roost::error::EngineError;
use roost_storage::{CrashMode, SimFaults, SimStorage};
use roost_tests::*;
use serde_json::json;

/// The WAL and the audit log (64 KiB segments in the test configuration: one each, with its
/// spare), the key table's spare (it has no segment before the first checkpoint), a shard
/// segment (16 KiB, with its spare), plus 8 KiB: the shard's second spare cannot be made.
const ROOM: u64 = 5 * (64 << 10) + 2 * (16 << 10) + (8 << 10);

fn batch(i: u64) -> serde_json::Value {
    let pad = "p".repeat(3000);
    json!({"request_key": format!("k{i}"), "ops": [{"op": "create", "shard": "s1", "record": {"i": i, "pad": pad}}]})
}

fn limit(disk: &SimStorage, room: Option<u64>) {
    disk.set_faults(SimFaults {
        space_bytes_max: room,
        ..SimFaults::default()
    });
}

/// Goal: a full disk pauses intake (`Paused`, nothing written, nothing latched), a power loss
/// while paused loses no committed batch, and intake resumes once there is room.
/// Method: batches of ~3 KB on one shard until one is refused; check the WAL did not move;
/// power loss; reopen (still full: recovery works, intake stays paused); room returns;
/// `try_resume`; the refused batch commits; `verify`.
#[test]
fn a_full_disk_pauses_intake_without_a_latch_and_loses_nothing() {
    let disk = SimStorage::new();
    limit(&disk, Some(ROOM));
    let e = open_engine(&disk, no_crash()).expect("open");
    let mut committed = Vec::new();
    let (refused, err) = loop {
        let i = committed.len() as u64;
        assert!(i < 100, "the disk never filled");
        match e.one_file(&parse(&batch(i)), &format!("b{i}.json")) {
            Ok(r) => {
                assert_eq!(r.status(), Status::Committed, "{r:?}");
                committed.push(r);
            }
            Err(err) => break (i, err),
        }
    };
    let EngineError::Paused { part, why } = &err else {
        panic!("expected a pause, got {err}");
    };
    assert_eq!((part.as_str(), why.needed_bytes), ("shard s1", 16 << 10));
    assert!(!e.is_failed(), "a pause latches nothing");
    let last = e.last_lsn();
    assert!(e.room().paused().is_some());
    assert!(!e.room().try_resume().expect("no room is no error"));
    assert!(
        matches!(
            e.one_file(&parse(&batch(refused)), "x.json"),
            Err(EngineError::Paused { .. })
        ),
        "still paused"
    );
    assert_eq!(e.last_lsn(), last, "a paused batch writes nothing");
    drop(e);
    let disk = disk.crash(CrashMode::PowerDrop);
    limit(&disk, Some(ROOM));
    let e = open_engine(&disk, no_crash()).expect("recovery on a full disk");
    for (i, r) in committed.iter().enumerate() {
        let seen = visible_result(&disk, &format!("b{i}.json")).expect("whole");
        assert_eq!(seen.as_ref(), Some(r), "b{i} after the power loss");
    }
    limit(&disk, None);
    assert!(e.room().try_resume().expect("resume"));
    assert!(e.room().paused().is_none());
    let r = e
        .one_file(&parse(&batch(refused)), &format!("b{refused}.json"))
        .expect("taken after the resume");
    assert_eq!(r.status(), Status::Committed);
    drop(e);
    let report = roost::ops::verify::verify(std::sync::Arc::new(disk.clone()), &data_dir());
    assert!(report.ok(), "{:?}", report.violations);
}

/// Goal: the same for groups of detached batches (`Engine::submit`, `Deliver::Returned`: a bulk file's
/// lines): a full disk refuses a group with a pause and latches nothing, whatever of the
/// group was claimed before the pause is finished (a power loss keeps every answered
/// group), and once there is room the refused group sent again commits, each batch once.
/// Method: groups of 4 ~3 KB batches until one is refused; power loss; room; the refused
/// group again, then once more (duplicates: the same answers); `verify`; every create on
/// the shard exactly once.
#[test]
fn a_full_disk_refuses_a_group_without_a_latch_and_loses_nothing() {
    let disk = SimStorage::new();
    limit(&disk, Some(ROOM));
    let e = open_engine(&disk, no_crash()).expect("open");
    let group = |g: u64| -> Vec<(roost::batch::Batch, String)> {
        (g * 4..g * 4 + 4)
            .map(|i| (parse(&batch(i)), format!("bulk/g/{i}")))
            .collect()
    };
    let run = |e: &roost::pipeline::Engine, g: u64| {
        let items = group(g);
        let refs: Vec<(&roost::batch::Batch, &str)> =
            items.iter().map(|(b, s)| (b, s.as_str())).collect();
        e.submit(&refs, Deliver::Returned)
    };
    let (answered, refused) = until_refused(&e, |g| run(&e, g));
    drop(e);
    let disk = disk.crash(CrashMode::PowerDrop);
    limit(&disk, None);
    let e = open_engine(&disk, no_crash()).expect("recovery");
    assert!(e.room().try_resume().expect("resume"));
    for (g, rs) in answered.iter().enumerate() {
        assert_eq!(
            &run(&e, g as u64).expect("again"),
            rs,
            "group {g} after the power loss"
        );
    }
    let first = run(&e, refused).expect("the refused group after the resume");
    assert!(
        first.iter().all(|r| r.status() == Status::Committed),
        "{first:?}"
    );
    assert_eq!(run(&e, refused).expect("duplicates"), first);
    drop(e);
    let report = roost::ops::verify::verify(std::sync::Arc::new(disk.clone()), &data_dir());
    assert!(report.ok(), "{:?}", report.violations);
    let records: usize = contents(&disk, &["s1"]).values().map(|m| m.len()).sum();
    assert_eq!(records as u64, (refused + 1) * 4, "every create once");
}

/// Runs groups 0, 1, .. through `run` until one is refused, which must be a pause that
/// latches nothing; returns the answered groups' answers and the refused group.
fn until_refused(
    e: &roost::pipeline::Engine,
    mut run: impl FnMut(u64) -> Result<Vec<BatchResult>, EngineError>,
) -> (Vec<Vec<BatchResult>>, u64) {
    let mut answered = Vec::new();
    let (refused, err) = loop {
        let g = answered.len() as u64;
        assert!(g < 30, "the disk never filled");
        match run(g) {
            Ok(rs) => {
                assert!(rs.iter().all(|r| r.status() == Status::Committed), "{rs:?}");
                answered.push(rs);
            }
            Err(err) => break (g, err),
        }
    };
    assert!(
        matches!(err, EngineError::Paused { .. }),
        "expected a pause, got {err}"
    );
    assert!(!e.is_failed(), "a pause latches nothing");
    (answered, refused)
}

/// Files per group in the files test.
const GROUP: u64 = 4;

/// Shards of 256 KiB segments, so the WAL (64 KiB) is the log that fills first: its roll in
/// the middle of a group takes the spare, the next spare cannot be made, and the group's
/// next item pauses while planning (`plan_one`), not at the group's admission.
fn big_shards(c: &mut roost::config::Config) {
    c.shard_segment_bytes = 256 << 10;
}

/// The WAL and audit log (segment and spare each), the key table's spare, a shard's
/// segment and spare (256 KiB each), plus 8 KiB.
const WAL_FIRST_ROOM: u64 = 5 * (64 << 10) + 2 * (256 << 10) + (8 << 10);

/// Goal: the same for spool files run as a group (`Engine::submit`, `Deliver::Files`: what the serve
/// loop does with files found together): a pause in the middle of a group leaves each file
/// either answered (its result out, its input gone) or untouched in `new/`, never half;
/// answered files keep their results across a power loss; once there is room the files left
/// in `new/` commit, each once.
/// Method: groups of 4 ~3 KB files until one is refused; check each file of that group;
/// power loss; room; the files still in `new/` again; `verify`; every create once.
#[test]
fn a_full_disk_refuses_a_group_of_files_without_a_latch_and_loses_nothing() {
    let disk = SimStorage::new();
    limit(&disk, Some(WAL_FIRST_ROOM));
    let new = data_dir().join("spool/new");
    let name = |i: u64| format!("f{i}.json");
    let run = |e: &roost::pipeline::Engine, disk: &SimStorage, g: u64| {
        let items: Vec<(roost::batch::Batch, String)> = (g * GROUP..g * GROUP + GROUP)
            .filter(|i| disk.file_bytes(&new.join(name(*i))).is_some())
            .map(|i| (parse(&batch(i)), name(i)))
            .collect();
        let refs: Vec<(&roost::batch::Batch, &str)> =
            items.iter().map(|(b, s)| (b, s.as_str())).collect();
        e.submit(&refs, Deliver::Files)
    };
    let e = open_engine_with(&disk, no_crash(), big_shards).expect("open");
    let (answered, refused) = until_refused(&e, |g| {
        for i in g * GROUP..g * GROUP + GROUP {
            disk.put_file_bytes(&new.join(name(i)), batch(i).to_string().into_bytes());
        }
        run(&e, &disk, g)
    });
    let mut before = Vec::new();
    for i in refused * GROUP..refused * GROUP + GROUP {
        let out = visible_result(&disk, &name(i)).expect("whole result");
        let waiting = disk.file_bytes(&new.join(name(i))).is_some();
        assert!(
            out.is_some() != waiting,
            "{}: result {out:?}, in new/: {waiting}",
            name(i)
        );
        before.push(out);
    }
    let answered_first = before.iter().filter(|r| r.is_some()).count() as u64;
    assert!(
        (1..GROUP).contains(&answered_first),
        "the pause came mid-group: {answered_first} of {GROUP} files answered before it"
    );
    drop(e);
    let disk = disk.crash(CrashMode::PowerDrop);
    limit(&disk, None);
    let e = open_engine_with(&disk, no_crash(), big_shards).expect("recovery");
    assert!(e.room().try_resume().expect("resume"));
    for (g, rs) in answered.iter().enumerate() {
        for (k, r) in rs.iter().enumerate() {
            let i = g as u64 * GROUP + k as u64;
            let seen = visible_result(&disk, &name(i)).expect("whole result");
            assert_eq!(seen.as_ref(), Some(r), "{} after the power loss", name(i));
        }
    }
    run(&e, &disk, refused).expect("the refused group after the resume");
    for (k, i) in (refused * GROUP..refused * GROUP + GROUP).enumerate() {
        let r = visible_result(&disk, &name(i)).expect("whole result");
        let r = r.unwrap_or_else(|| panic!("{}: no result", name(i)));
        assert_eq!(r.status(), Status::Committed, "{r:?}");
        if let Some(b) = &before[k] {
            assert_eq!(
                &r,
                b,
                "{}: answered before the pause, the same after",
                name(i)
            );
        }
        assert!(
            disk.file_bytes(&new.join(name(i))).is_none(),
            "{} left",
            name(i)
        );
    }
    drop(e);
    let report = roost::ops::verify::verify(std::sync::Arc::new(disk.clone()), &data_dir());
    assert!(report.ok(), "{:?}", report.violations);
    let records: usize = contents(&disk, &["s1"]).values().map(|m| m.len()).sum();
    assert_eq!(records as u64, (refused + 1) * GROUP, "every create once");
}

/// Bytes every file on the simulated disk takes (segments and spares are allocated over
/// their whole length).
fn used(disk: &SimStorage) -> u64 {
    disk.paths()
        .iter()
        .filter_map(|p| disk.file_bytes(p))
        .map(|b| b.len() as u64)
        .sum()
}

/// Goal (issue 43): a batch whose frame on a shard is larger than that shard's spare (a
/// young shard's segments start at 64 KiB) grows the spare before its claim, so a full disk
/// pauses it there (nothing written, nothing latched) instead of failing the shard's roll
/// after the claim, which stops the daemon. Method: shards of 1 MiB segments; one small
/// batch (the shard's first segment, 64 KiB, and a 128 KiB spare); the disk then keeps 16
/// KiB free; a batch of four ~50 KB records on the shard (a 200 KB frame) is refused with a
/// pause naming the shard; with room again it commits; `verify`.
#[test]
fn a_frame_larger_than_its_shards_spare_pauses_before_the_claim() {
    let disk = SimStorage::new();
    let tune = |c: &mut roost::config::Config| {
        c.shard_segment_bytes = 1 << 20;
        c.spool_file_bytes_max = 1 << 20;
    };
    let e = open_engine_with(&disk, no_crash(), tune).expect("open");
    let small = json!({"request_key": "small", "ops": [{"op": "create", "shard": "s2", "record": {"i": 0}}]});
    let r = e.one_file(&parse(&small), "small.json").expect("small");
    assert_eq!(r.status(), Status::Committed);
    limit(&disk, Some(used(&disk) + (16 << 10)));
    let pad = "q".repeat(50_000);
    let ops: Vec<_> = (0..4)
        .map(|i| json!({"op": "create", "shard": "s2", "record": {"i": i, "pad": pad}}))
        .collect();
    let big = parse(&json!({"request_key": "big", "ops": ops}));
    let last = e.last_lsn();
    let err = e
        .one_file(&big, "big.json")
        .expect_err("no room for its frame");
    let EngineError::Paused { part, why } = &err else {
        panic!("expected a pause, got {err}");
    };
    assert_eq!(part, "shard s2", "{why}");
    assert!(why.needed_bytes >= 200_000, "{why}");
    assert!(!e.is_failed(), "a pause latches nothing");
    assert_eq!(e.last_lsn(), last, "nothing claimed");
    limit(&disk, None);
    assert!(e.room().try_resume().expect("resume"));
    let r = e
        .one_file(&big, "big.json")
        .expect("taken after the resume");
    assert_eq!(r.status(), Status::Committed);
    drop(e);
    let report = roost::ops::verify::verify(std::sync::Arc::new(disk.clone()), &data_dir());
    assert!(report.ok(), "{:?}", report.violations);
}
