//! Checkpoints, WAL retirement and the request-key table (issue 14) on the simulated disk:
//! the WAL below a checkpoint goes, a restart replays only what came after it, every key
//! below it still gets its original answer (from the key table, one record read), ids are
//! never reused, and a crash or a power loss at any step of a checkpoint leaves a directory
//! that recovers to the same answers. A key older than the window is a new batch.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use roost::batch::{BatchResult, Status};
use roost::error::EngineError;
use roost::pipeline::crash::{CrashHook, CrashPoint, Step};
use roost::pipeline::Engine;
use roost_storage::{CrashMode, SimFaults, SimStorage};
use roost_tests::*;
use serde_json::json;

/// Batch `i`: a ~2 KB create on s1 or s2; every fifth deletes an id that does not exist
/// (rejected, and recorded).
fn batch(i: u64) -> serde_json::Value {
    let shard = if i.is_multiple_of(2) { "s1" } else { "s2" };
    let pad = "q".repeat(2000);
    if i % 5 == 4 {
        return json!({"request_key": format!("k{i}"), "ops": [{"op": "delete", "shard": shard, "id": 999_999}]});
    }
    json!({"request_key": format!("k{i}"), "ops": [{"op": "create", "shard": shard, "record": {"i": i, "pad": pad}}]})
}

/// Submits batches `from..to` and returns their answers by key index.
fn submit_all(e: &Engine, from: u64, to: u64) -> BTreeMap<u64, BatchResult> {
    (from..to)
        .map(|i| {
            let r = e
                .one_file(&parse(&batch(i)), &format!("b{i}.json"))
                .unwrap_or_else(|err| panic!("batch {i}: {err}"));
            (i, r)
        })
        .collect()
}

/// Every answer sent again (under a new spool name) is the original one.
fn same_answers(e: &Engine, answers: &BTreeMap<u64, BatchResult>, what: &str) {
    for (i, want) in answers {
        let got = e
            .one_file(&parse(&batch(*i)), &format!("again{i}.json"))
            .unwrap_or_else(|err| panic!("{what}: again {i}: {err}"));
        assert_eq!(&got, want, "{what}: batch {i} answered differently");
    }
}

fn verified(disk: &SimStorage, what: &str) {
    let report = roost::ops::verify::verify(Arc::new(disk.clone()), &data_dir());
    assert!(report.ok(), "{what}: {:?}", report.violations);
}

/// A new batch's id is above every id answered so far.
fn fresh_id(e: &Engine, answers: &BTreeMap<u64, BatchResult>, what: &str) {
    let max = answers
        .values()
        .flat_map(|r| r.ops().iter().map(|o| o.id))
        .max()
        .unwrap_or(0);
    let b = json!({"request_key": format!("fresh-{what}"), "ops": [{"op": "create", "shard": "s1", "record": {}}]});
    let r = e.one_file(&parse(&b), "fresh.json").expect("fresh batch");
    assert_eq!(r.status(), Status::Committed, "{what}: {r:?}");
    assert!(
        r.ops()[0].id > max,
        "{what}: id {} reused (max {max})",
        r.ops()[0].id
    );
}

/// Goal: a checkpoint removes the WAL below it; a restart replays only the records after
/// it; every earlier key (committed and rejected) still gets its original answer; a new
/// batch gets a fresh id; `verify` holds. Method: 60 batches over several 64 KiB WAL
/// segments, a checkpoint, 5 more batches, a process crash, reopen.
#[test]
fn a_checkpoint_retires_the_wal_and_keys_answer_from_the_table() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let mut answers = submit_all(&e, 0, 60);
    let c = e
        .checkpoint()
        .expect("checkpoint")
        .expect("something to checkpoint");
    assert!(c.wal_from > 60, "every finished batch is below it: {c:?}");
    assert!(
        e.wal().first_lsn() > 1,
        "the WAL's oldest segments are gone"
    );
    assert!(e.checkpoint().expect("again").is_none(), "nothing new");
    answers.extend(submit_all(&e, 60, 65));
    same_answers(&e, &answers, "live");
    drop(e);
    let disk = disk.crash(CrashMode::Process);
    let e = open_engine(&disk, no_crash()).expect("reopen");
    let replayed = e.figures().recovery.wal_records;
    assert!(
        replayed < 30,
        "replayed {replayed} records: recovery starts at the checkpoint"
    );
    same_answers(&e, &answers, "after restart");
    fresh_id(&e, &answers, "after restart");
    drop(e);
    verified(&disk, "after restart");
}

/// Crashes at one named point, the first time it is reached.
struct CrashAt(CrashPoint, Mutex<bool>);

impl CrashHook for CrashAt {
    fn hit(&self, point: CrashPoint) -> Result<(), EngineError> {
        let mut done = self.1.lock().expect("lock");
        if point == self.0 && !*done {
            *done = true;
            return Err(EngineError::Crashed(point.to_string()));
        }
        Ok(())
    }
}

/// Recovers `disk` and checks everything a crash must not change.
fn recovers(disk: &SimStorage, answers: &BTreeMap<u64, BatchResult>, what: &str) {
    let e = open_engine(disk, no_crash()).unwrap_or_else(|err| panic!("{what}: reopen: {err}"));
    same_answers(&e, answers, what);
    fresh_id(&e, answers, what);
    e.checkpoint()
        .unwrap_or_else(|err| panic!("{what}: next checkpoint: {err}"));
    // In the same process, after the WAL below it is gone: a key the crashed checkpoint had
    // already indexed must answer from the index, not from its retired WAL record.
    same_answers(
        &e,
        answers,
        &format!("{what}, after the next checkpoint, same process"),
    );
    drop(e);
    let e = open_engine(&disk.crash(CrashMode::Process), no_crash())
        .unwrap_or_else(|err| panic!("{what}: second reopen: {err}"));
    same_answers(&e, answers, &format!("{what}, after the next checkpoint"));
    drop(e);
    verified(disk, what);
}

/// Goal: a crash at every step of a checkpoint (a process crash, and a power loss dropping
/// or tearing what was not synced) recovers to the same answers for every key, fresh ids,
/// and a directory `verify` accepts; the next checkpoint and restart work too. Method: 30
/// batches and a checkpoint (the first one copies keys), 30 more and a second checkpoint
/// crashed at each of its steps.
#[test]
fn a_crash_at_every_step_of_a_checkpoint_recovers_the_same_answers() {
    let steps = [
        Step::AfterKeysSync,
        Step::AfterKeyIndex,
        Step::AfterCheckpoint,
        Step::AfterWalRetired,
    ];
    let modes = [
        CrashMode::Process,
        CrashMode::PowerDrop,
        CrashMode::PowerTear { seed: 7 },
    ];
    let mut schedules = 0;
    for step in steps {
        for mode in modes {
            let what = format!("{} {mode:?}", step.name());
            let disk = SimStorage::new();
            let hook = Arc::new(CrashAt(step.at(), Mutex::new(false)));
            let e = open_engine(&disk, hook.clone()).expect("open");
            let mut answers = submit_all(&e, 0, 30);
            *hook.1.lock().expect("lock") = true; // the first checkpoint runs through
            e.checkpoint().expect("first checkpoint");
            *hook.1.lock().expect("lock") = false;
            answers.extend(submit_all(&e, 30, 60));
            let err = e.checkpoint().expect_err("the checkpoint crashes");
            assert!(matches!(err, EngineError::Crashed(_)), "{what}: {err}");
            drop(e);
            recovers(&disk.crash(mode), &answers, &what);
            schedules += 1;
        }
    }
    println!("checkpoint crash schedules: {schedules}");
}

/// Goal: a process crash or a power loss (dropped, torn) at every sync of a checkpoint (key
/// table, key index run and its directory, `CHECKPOINT` file, its directory, the WAL
/// directory after retirement) recovers to the same answers. Method: count the syncs a
/// clean checkpoint makes, then for each, fail it (process crash) or freeze the disk after
/// it (power loss).
#[test]
fn a_power_loss_at_every_sync_of_a_checkpoint_recovers_the_same_answers() {
    let prepare = |disk: &SimStorage| {
        let e = open_engine(disk, no_crash()).expect("open");
        let answers = submit_all(&e, 0, 40);
        (e, answers)
    };
    let (total, base) = {
        let disk = SimStorage::new();
        let (e, _) = prepare(&disk);
        let base = disk.sync_count();
        e.checkpoint().expect("checkpoint");
        (disk.sync_count() - base, base)
    };
    assert!(
        total >= 4,
        "a checkpoint syncs the table, the file and directories: {total}"
    );
    for k in 0..=total {
        // A process crash at sync k: the sync fails, the engine latches, the process dies.
        let disk = SimStorage::new();
        let (e, answers) = prepare(&disk);
        disk.set_faults(SimFaults {
            fail_sync_at: Some(base + k + 1),
            ..SimFaults::default()
        });
        let _ = e.checkpoint();
        drop(e);
        let after = disk.crash(CrashMode::Process);
        recovers(
            &after,
            &answers,
            &format!("process crash at sync {k} of {total}"),
        );
        for mode in [CrashMode::PowerDrop, CrashMode::PowerTear { seed: k + 3 }] {
            let disk = SimStorage::new();
            let (e, answers) = prepare(&disk);
            assert_eq!(disk.sync_count(), base, "the run is deterministic");
            disk.set_faults(SimFaults {
                freeze_after_syncs: Some(base + k),
                ..SimFaults::default()
            });
            e.checkpoint()
                .expect("checkpoint (the power went silently)");
            drop(e);
            let after = disk.crash(mode);
            after.set_faults(SimFaults::default());
            recovers(
                &after,
                &answers,
                &format!("power loss after sync {k} of {total} {mode:?}"),
            );
        }
    }
}

/// Goal (issue 25): after a checkpoint no key is held in memory; each key still gets its
/// original answer, read through the key index on disk (one table record each), live and
/// after a restart, which loads no key; a new key reads no record. Method: 60 batches, a
/// checkpoint, every batch sent again, a restart, again.
#[test]
fn checkpointed_keys_leave_memory_and_answer_through_the_index() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let answers = submit_all(&e, 0, 60);
    assert_eq!(
        e.figures().cached_keys,
        60,
        "the WAL answers them: in memory"
    );
    e.checkpoint().expect("checkpoint").expect("taken");
    assert_eq!(
        e.figures().cached_keys,
        0,
        "checkpointed keys are not held in memory"
    );
    assert_eq!(e.figures().live_keys(), 60);
    assert_eq!(e.figures().key_index.entries, 60);
    let reads = |e: &Engine| {
        e.stats
            .key_index_reads
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    same_answers(&e, &answers, "through the index");
    assert_eq!(reads(&e), 60, "one index read per duplicate");
    fresh_id(&e, &answers, "a new key");
    assert_eq!(reads(&e), 60, "a new key reads no record");
    drop(e);
    let e = open_engine(&disk.crash(CrashMode::Process), no_crash()).expect("reopen");
    assert!(
        e.figures().cached_keys <= 2,
        "open loads no checkpointed key"
    );
    same_answers(&e, &answers, "through the index after a restart");
    drop(e);
    verified(&disk, "after the index answered");
}

/// Goal: damage to the key index is found, never read past: `verify` names a run whose
/// entry block fails its checksum, and an open of a run whose header is damaged fails as
/// corruption (exit 65). Method: 30 batches, a checkpoint, one byte flipped in the run's
/// first entry block, then in its header.
#[test]
fn a_damaged_key_index_is_corruption() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    submit_all(&e, 0, 30);
    e.checkpoint().expect("checkpoint").expect("taken");
    drop(e);
    let disk = disk.crash(CrashMode::Process);
    verified(&disk, "before the damage");
    let run = disk
        .paths()
        .into_iter()
        .find(|p| p.extension().is_some_and(|x| x == "run"))
        .expect("a key index run");
    let good = disk.file_bytes(&run).expect("run bytes");
    let mut bad = good.clone();
    bad[roost_keyindex::HEADER_LEN + 5] ^= 0x40;
    disk.put_file_bytes(&run, bad);
    let report = roost::ops::verify::verify(Arc::new(disk.clone()), &data_dir());
    assert!(
        report.violations.iter().any(|v| v.contains("checksum")),
        "verify missed a damaged entry block: {:?}",
        report.violations
    );
    let mut bad = good;
    bad[20] ^= 0x01;
    disk.put_file_bytes(&run, bad);
    let err = open_engine(&disk, no_crash())
        .err()
        .expect("open refuses the run");
    assert!(err.is_corruption(), "{err}");
}

/// Goal (the window, documented in README): a request key is remembered for
/// `request_key_window_secs` after its batch was checkpointed; after that the same key is a
/// new batch (new lsn, new ids), live and after a restart. Method: a 1 s window, passed by
/// moving the simulated disk's clock (which a crash copy keeps: the restart is after it).
/// Inside the window a real wait longer than it changes nothing.
#[test]
fn a_key_older_than_the_window_is_a_new_batch() {
    let disk = SimStorage::new();
    let tune = |c: &mut roost::config::Config| c.request_key_window_secs = 1;
    let e = open_engine_with(&disk, no_crash(), tune).expect("open");
    let first = submit_all(&e, 0, 2);
    e.checkpoint().expect("checkpoint");
    assert_eq!(e.figures().live_keys(), 2);
    same_answers(&e, &first, "inside the window");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    e.checkpoint().expect("checkpoint after a real second");
    assert_eq!(e.figures().live_keys(), 2, "the disk's clock stood still");
    disk.advance(std::time::Duration::from_millis(1100));
    e.checkpoint().expect("checkpoint after the window");
    assert_eq!(e.figures().live_keys(), 0, "both keys forgotten");
    let again = e
        .one_file(&parse(&batch(0)), "late.json")
        .expect("late retry");
    assert_eq!(again.status(), Status::Committed);
    assert_ne!(
        again.lsn(),
        first[&0].lsn(),
        "a new batch, not the original answer"
    );
    assert!(again.ops()[0].id > first[&0].ops()[0].id, "with a new id");
    drop(e);
    let e = open_engine_with(&disk.crash(CrashMode::Process), no_crash(), tune).expect("reopen");
    let r = e
        .one_file(&parse(&batch(1)), "late1.json")
        .expect("late retry of k1");
    assert_ne!(r, first[&1], "k1 left the window before the restart");
    drop(e);
    verified(&disk, "after the window");
}

/// Goal: shard compaction in the daemon: once a checkpoint covers them, sealed segments
/// that are mostly deleted records are rewritten by the shard's owner while it is idle
/// (reported in the compaction figures), and every answer, record and invariant is the same
/// after it and after a restart. Method: 40 creates of ~2 KB on one shard (16 KiB segments),
/// deletes of 35 of them, a checkpoint, then wait for the owner (moving the simulated disk's
/// clock: compaction's budget grows with it, and the pool's tick runs by it).
#[test]
fn idle_owners_compact_below_the_checkpoint_and_nothing_changes() {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("open");
    let pad = "c".repeat(2000);
    let mut answers = BTreeMap::new();
    let mut ids = Vec::new();
    for i in 0..40u64 {
        let b = json!({"request_key": format!("c{i}"), "ops": [{"op": "create", "shard": "s1", "record": {"i": i, "pad": pad}}]});
        let r = e
            .one_file(&parse(&b), &format!("c{i}.json"))
            .expect("create");
        ids.push(r.ops()[0].id);
        answers.insert(i, r);
    }
    for (i, id) in ids.iter().take(35).enumerate() {
        let b = json!({"request_key": format!("d{i}"), "ops": [{"op": "delete", "shard": "s1", "id": id}]});
        let r = e
            .one_file(&parse(&b), &format!("d{i}.json"))
            .expect("delete");
        assert_eq!(r.status(), Status::Committed);
    }
    let before = contents(&disk, &["s1"]);
    assert_eq!(before["s1"].len(), 5);
    e.checkpoint().expect("checkpoint");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let stats = loop {
        let s = e.shards().compaction().remove("s1").expect("s1 figures");
        if s.compactions > 0 && !s.in_progress {
            break s;
        }
        assert!(std::time::Instant::now() < until, "no compaction: {s:?}");
        disk.advance(std::time::Duration::from_millis(50));
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(stats.reclaimed_bytes > 16 << 10, "{stats:?}");
    for (i, id) in ids.iter().enumerate().skip(35) {
        let b = json!({"request_key": format!("c{i}"), "ops": [{"op": "create", "shard": "s1", "record": {"i": i, "pad": pad}}]});
        let again = e.one_file(&parse(&b), "again.json").expect("again");
        assert_eq!(
            again.ops()[0].id,
            *id,
            "the original answer after compaction"
        );
    }
    drop(e);
    assert_eq!(contents(&disk, &["s1"]), before, "the same live records");
    verified(&disk, "after compaction");
    let disk = disk.crash(CrashMode::PowerDrop);
    let e = open_engine(&disk, no_crash()).expect("reopen");
    fresh_id(&e, &answers, "after compaction and a power loss");
    drop(e);
    assert_eq!(contents(&disk, &["s1"])["s1"].len(), 6);
    verified(&disk, "after compaction and a power loss");
}

/// Goal: the WAL a restart finds counts towards the next checkpoint, so a daemon killed
/// again and again before each checkpoint was due still checkpoints (found by the soak
/// benchmark: before, only bytes appended since the last start counted, and the interval
/// restarted with every start). Method: WAL past `checkpoint_wal_bytes`, a crash, reopen:
/// a checkpoint is due before anything new is appended.
#[test]
fn the_wal_found_at_a_restart_counts_towards_the_next_checkpoint() {
    let disk = SimStorage::new();
    let tune = |c: &mut roost::config::Config| c.checkpoint_wal_bytes = 32 << 10;
    let e = open_engine_with(&disk, no_crash(), tune).expect("open");
    assert!(!e.checkpoint_due(), "nothing appended yet");
    submit_all(&e, 0, 20); // ~2 KB claims: past 32 KiB
    assert!(e.checkpoint_due());
    drop(e);
    let e = open_engine_with(&disk.crash(CrashMode::Process), no_crash(), tune).expect("reopen");
    assert!(
        e.checkpoint_due(),
        "the history found at open is due for a checkpoint"
    );
    e.checkpoint().expect("checkpoint").expect("taken");
    assert!(!e.checkpoint_due(), "nothing new since");
}
