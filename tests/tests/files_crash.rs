//! Crash schedules for spool files run as one group (issue 16: `Engine::submit` with `Deliver::Files`, what
//! the serve loop does with files found waiting together): a kill or a power cut at every
//! named point of the group's run, then recovery and the retry of whatever is still in
//! `new/`, must leave every file's result as a crash-free run gives it (same statuses, same
//! ids), every create on its shard once, every key claimed once, and `new/` empty; and every
//! result seen before the crash must survive recovery unchanged, citing a durable claim.
//!
//! Method: the real engine over the simulated disk, one thread, so a crash-free run is
//! deterministic. For every point the clean run reaches, a process crash, a power loss and
//! two torn power losses there; reopen (recovery finishes the claims and publishes their
//! results), run the files still in `new/` again as one group, compare. Last, a file coming
//! back after its result (its removal never made durable) gives the same result again.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use roost::batch::{self, Batch};
use roost::config::ResultSync;
use roost::pipeline::crash::{CrashHook, HoldOnce, NthCrash, Step};
use roost::pipeline::records::WalEntry;
use roost::pipeline::Engine;
use roost_storage::{CrashMode, SimStorage};
use roost_tests::*;
use serde_json::{json, Value};

const SHARDS: &[&str] = &["s1", "s2"];

/// The group, in order: creates over both shards, a delete of a record made before, a
/// rejected delete, the first file's batch again under another name (a duplicate), a
/// conflict, and one more create.
fn files() -> Vec<(&'static str, Value)> {
    vec![
        ("a.json", create_on("a", &["s1", "s2"])),
        ("b.json", create_on("b", &["s2"])),
        (
            "del.json",
            json!({"request_key": "del", "ops": [{"op": "delete", "shard": "s1", "id": 1}]}),
        ),
        (
            "rej.json",
            json!({"request_key": "rej", "ops": [{"op": "delete", "shard": "s2", "id": 999}]}),
        ),
        ("a-again.json", create_on("a", &["s1", "s2"])),
        ("b-other.json", create_on("b", &["s1"])),
        ("c.json", create_on("c", &["s1"])),
    ]
}

fn new_path(name: &str) -> std::path::PathBuf {
    data_dir().join("spool/new").join(name)
}

/// The disk with id 1 on s1 and every file of the group in `new/`.
fn base() -> SimStorage {
    let disk = SimStorage::new();
    let setup = parse(
        &json!({"request_key": "setup", "ops": [{"op": "create", "shard": "s1", "record": {"key": "setup"}}]}),
    );
    run_batch(&disk, no_crash(), &setup, "setup.json").expect("setup");
    for (name, v) in files() {
        disk.put_file_bytes(&new_path(name), v.to_string().into_bytes());
    }
    disk
}

/// Opens the engine (recovery) and runs the group's files still in `new/`, in group order,
/// as one group, as the serve worker does; the engine's error is a crash.
fn run(disk: &SimStorage, crash: Arc<dyn CrashHook>) -> Result<(), String> {
    run_in(disk, crash, ResultSync::default())
}

/// [`run`] with results synced as `sync` says.
fn run_in(disk: &SimStorage, crash: Arc<dyn CrashHook>, sync: ResultSync) -> Result<(), String> {
    let e: Engine = open_engine_with(disk, crash, |c| c.result_sync = sync)
        .map_err(|e| format!("open: {e}"))?;
    let mut batches: Vec<(Batch, &str)> = Vec::new();
    for (name, _) in files() {
        if let Some(bytes) = disk.file_bytes(&new_path(name)) {
            let b = batch::parse(&bytes, 100).map_err(|e| format!("{name}: {e:?}"))?;
            batches.push((b, name));
        }
    }
    let items: Vec<(&Batch, &str)> = batches.iter().map(|(b, n)| (b, *n)).collect();
    if !items.is_empty() {
        e.submit(&items, Deliver::Files)
            .map_err(|e| e.to_string())?;
    }
    // The durability round the serve loop runs once the group waited `tail_round_ms`.
    e.settle().map(|_| ()).map_err(|e| e.to_string())
}

/// Every file's result as a client sees it, by name; a file still in `new/` is an error.
fn results(disk: &SimStorage) -> Result<BTreeMap<&'static str, Value>, String> {
    let mut out = BTreeMap::new();
    for (name, _) in files() {
        if disk.file_bytes(&new_path(name)).is_some() {
            return Err(format!("new/{name} is still there"));
        }
        let r = visible_result(disk, name)?.ok_or(format!("no out/{name}"))?;
        out.insert(name, serde_json::to_value(&r).map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// The results a client could see, by name (before a crash: what roost acknowledged).
fn visible(disk: &SimStorage) -> BTreeMap<&'static str, Value> {
    files()
        .into_iter()
        .filter_map(|(name, _)| {
            let r = visible_result(disk, name).ok().flatten()?;
            Some((name, serde_json::to_value(&r).ok()?))
        })
        .collect()
}

/// After the crash and a recovery alone (no retry): every result seen before the crash is
/// still there, byte for byte (its lsn too), and a committed one cites its key's claim in
/// the recovered WAL. So no result was shown before its claim was durable: a retry would
/// have hidden that by claiming the file again with the same ids.
fn kept(after: &SimStorage, acked: &BTreeMap<&str, Value>) -> Result<(), String> {
    drop(open_engine(after, no_crash()).map_err(|e| format!("recovery: {e}"))?);
    let now = visible(after);
    let wal = wal_entries(Arc::new(after.clone()), &data_dir());
    for (name, r) in acked {
        if now.get(name) != Some(r) {
            return Err(format!("{name}: {r} was seen, now {:?}", now.get(name)));
        }
        cites_its_claim(&wal, r).map_err(|e| format!("{name}, seen before the crash: {e}"))?;
    }
    Ok(())
}

/// A committed result's lsn holds its key's claim in `wal`.
fn cites_its_claim(wal: &[(u64, WalEntry)], r: &Value) -> Result<(), String> {
    let (Some(lsn), Some(key)) = (r["lsn"].as_u64(), r["request_key"].as_str()) else {
        return Ok(());
    };
    if r["status"] != "committed" {
        return Ok(());
    }
    match wal.iter().find(|(l, _)| *l == lsn).map(|(_, e)| e) {
        Some(WalEntry::Claim(c)) if c.request_key == key => Ok(()),
        other => Err(format!("lsn {lsn} holds {other:?}")),
    }
}

/// A result without what a crash may move: its lsn (recovery appends `done` records where
/// the crash-free group had its later claims) and a conflict's reason (it names an lsn).
fn strip(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("lsn");
        if o.get("status").is_some_and(|s| s == "conflict") {
            o.remove("reason");
        }
    }
    v
}

/// The retry's results against the crash-free ones: equal but for lsns, every lsn a result
/// cites is its key's claim in the WAL, and every key is claimed at most once.
fn same_results(disk: &SimStorage, want: &BTreeMap<&str, Value>) -> Result<(), String> {
    let got = results(disk)?;
    let wal = wal_entries(Arc::new(disk.clone()), &data_dir());
    let mut claims: BTreeMap<String, usize> = BTreeMap::new();
    for (_, e) in &wal {
        if let WalEntry::Claim(c) = e {
            *claims.entry(c.request_key.clone()).or_default() += 1;
        }
    }
    if let Some((key, n)) = claims.iter().find(|(_, n)| **n > 1) {
        return Err(format!("key {key} claimed {n} times"));
    }
    for (name, r) in &got {
        if strip(r) != strip(&want[name]) {
            return Err(format!("{name}: {r}\nwant {}", want[name]));
        }
        cites_its_claim(&wal, r).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

/// Every create answered is on its shard, and nothing else is: setup (deleted by "del"),
/// a: 2, b: 1, c: 1.
fn check_records(disk: &SimStorage, results: &BTreeMap<&str, Value>) -> Result<(), String> {
    let now = contents(disk, SHARDS);
    for r in results.values() {
        for op in r["ops"].as_array().into_iter().flatten() {
            if op["op"] == "create" {
                let shard = op["shard"].as_str().unwrap_or("");
                let id = op["id"].as_u64().unwrap_or(0);
                if !now.get(shard).is_some_and(|m| m.contains_key(&id)) {
                    return Err(format!(
                        "{shard}/{id} answered as created, not on the shard"
                    ));
                }
            }
        }
    }
    let records: usize = now.values().map(|m| m.len()).sum();
    match records {
        4 => Ok(()),
        n => Err(format!("{n} records on the shards, want 4: {now:?}")),
    }
}

/// The crash-free group's results (default configuration).
fn want_results() -> BTreeMap<&'static str, Value> {
    let clean = base();
    run(&clean, no_crash()).expect("clean run");
    results(&clean).expect("clean results")
}

/// No result temporary (`.NAME.SEQ.tmp`) is left in `out/`.
fn no_temporaries(disk: &SimStorage) -> Result<(), String> {
    let out = data_dir().join("spool/out");
    let left: Vec<_> = disk
        .paths()
        .into_iter()
        .filter(|p| p.parent() == Some(out.as_path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.') && n.ends_with(".tmp"))
        })
        .collect();
    match left.is_empty() {
        true => Ok(()),
        false => Err(format!("temporaries left in out/: {left:?}")),
    }
}

/// Goal: a crash after a group's result temporaries are written and synced but while its
/// claims' WAL sync may still run (the two overlap) leaves, after recovery, a result for
/// exactly the files whose claim is in the recovered WAL, none for the others (they are
/// still in `new/`), and no temporary; the retry then gives the crash-free results.
/// Method: the group held at `after_results_prepared` (the temporaries are on disk; the
/// claim sync runs on its own thread, done or not); the disk taken there as a process
/// crash, a power loss and a torn one leave it; recovery alone, then the checks.
/// In both result modes: under `syncfs` the hold comes strictly before the claims' WAL
/// sync, so the power-loss snapshots always have the claims not durable.
#[test]
fn a_crash_between_prepared_results_and_durable_claims_leaves_results_only_for_durable_claims() {
    for sync in [ResultSync::Fsync, ResultSync::Syncfs] {
        crash_between_prepared_results_and_durable_claims(sync);
    }
}

fn crash_between_prepared_results_and_durable_claims(sync: ResultSync) {
    let clean = base();
    run_in(&clean, no_crash(), sync).expect("clean run");
    let want = results(&clean).expect("clean results");
    let disk = base();
    let (hold, handle) = HoldOnce::new(Step::AfterResultsPrepared.at());
    let held = disk.clone();
    let t = std::thread::spawn(move || run_in(&held, hold, sync));
    assert!(
        handle.reached(std::time::Duration::from_secs(20)),
        "never held"
    );
    let at = |mode| disk.crash(mode);
    let snapshots = [
        at(CrashMode::Process),
        at(CrashMode::PowerDrop),
        at(CrashMode::PowerTear { seed: 4 }),
    ];
    handle.release();
    t.join().expect("group thread").expect("group run");
    assert!(
        no_temporaries(&snapshots[0]).is_err(),
        "no temporary on disk at the hold: the point is not where the test means"
    );
    for (i, after) in snapshots.iter().enumerate() {
        drop(open_engine(after, no_crash()).unwrap_or_else(|e| panic!("#{i}: recovery: {e}")));
        no_temporaries(after).unwrap_or_else(|e| panic!("#{i}: {e}"));
        let wal = wal_entries(Arc::new(after.clone()), &data_dir());
        let claimed: Vec<String> = wal
            .iter()
            .filter_map(|(_, e)| match e {
                WalEntry::Claim(c) => Some(c.source.clone()),
                _ => None,
            })
            .collect();
        // A plain power loss keeps only what was synced (a torn one may keep more).
        if sync == ResultSync::Syncfs && i == 1 {
            let group: Vec<&String> = claimed.iter().filter(|s| *s != "setup.json").collect();
            assert!(
                group.is_empty(),
                "#{i}: claims durable before their sync: {group:?}"
            );
        }
        for (name, _) in files() {
            let seen = visible_result(after, name).unwrap_or_else(|e| panic!("#{i}: {e}"));
            let durable = claimed.iter().any(|s| s == name);
            assert_eq!(seen.is_some(), durable, "#{i}: {name}: result {seen:?}");
            assert_eq!(
                after.file_bytes(&new_path(name)).is_some(),
                !durable,
                "#{i}: {name}"
            );
        }
        run(after, no_crash()).unwrap_or_else(|e| panic!("#{i}: retry: {e}"));
        same_results(after, &want).unwrap_or_else(|e| panic!("#{i}: {e}"));
    }
}

/// Goal: nothing is renamed into `out/` before its claim is durable, though the results'
/// temporaries are written and synced while the claims' WAL sync runs: whichever sync of
/// the group fails (a temporary's, the WAL's, `out/`'s), every result a client can see
/// cites a claim in the durable WAL, and recovery leaves no temporary.
/// Method: the group's syncs counted in a clean run; then for each k, the k-th of them
/// fails; the live disk (what a client saw) against the durable image (a power loss). In
/// both result modes (`syncfs` writes the temporaries early and syncs them in the round).
#[test]
fn whichever_sync_of_a_group_fails_no_result_is_visible_before_its_claim_is_durable() {
    for sync in [ResultSync::Fsync, ResultSync::Syncfs] {
        no_result_before_its_claim(sync);
    }
}

fn no_result_before_its_claim(sync: ResultSync) {
    let clean = base();
    let before = clean.sync_count();
    run_in(&clean, no_crash(), sync).expect("clean run");
    assert_eq!(
        results(&clean).expect("clean results"),
        want_results(),
        "{sync:?}"
    );
    let n = clean.sync_count() - before;
    assert!(n >= 3, "{n} syncs in the group");
    for k in 1..=n {
        let disk = base();
        disk.set_faults(roost_storage::SimFaults {
            fail_sync_at: Some(disk.sync_count() + k),
            ..roost_storage::SimFaults::default()
        });
        let failed = run_in(&disk, no_crash(), sync).is_err();
        let seen = visible(&disk);
        let durable = disk.crash(CrashMode::PowerDrop);
        let wal = wal_entries(Arc::new(durable.clone()), &data_dir());
        for (name, r) in &seen {
            cites_its_claim(&wal, r).unwrap_or_else(|e| {
                panic!("{sync:?}: sync {k} of {n} failed ({failed}): {name}: {e}")
            });
        }
        drop(open_engine(&durable, no_crash()).expect("recovery"));
        no_temporaries(&durable).unwrap_or_else(|e| panic!("sync {k}: {e}"));
    }
}

/// Goal: a group whose claims' WAL sync fails shows no result, though its results were
/// written and synced while that sync ran: nothing is renamed, no temporary stays, and the
/// files are still in `new/`.
/// Method: every sync of a WAL file fails (aimed by path, so the threads' order does not
/// matter), the group runs in each result mode; the live disk and `out/` are read.
#[test]
fn a_failed_claim_sync_publishes_none_of_the_results_prepared_beside_it() {
    for sync in [ResultSync::Fsync, ResultSync::Syncfs] {
        let disk = base();
        let e = open_engine_with(&disk, no_crash(), |c| c.result_sync = sync).expect("open");
        let batches: Vec<(Batch, &str)> = files()
            .into_iter()
            .map(|(name, v)| {
                (
                    batch::parse(v.to_string().as_bytes(), 100).expect("batch"),
                    name,
                )
            })
            .collect();
        let items: Vec<(&Batch, &str)> = batches.iter().map(|(b, n)| (b, *n)).collect();
        disk.set_faults(roost_storage::SimFaults {
            fail_syncs_under: Some(data_dir().join(roost::layout::WAL_DIR)),
            ..roost_storage::SimFaults::default()
        });
        let r = e.submit(&items, Deliver::Files).map(|_| ());
        let e = r
            .expect_err("the claims' sync failed, the group must fail")
            .to_string();
        assert!(
            e.contains("wal"),
            "{sync:?}: not the WAL's sync that failed: {e}"
        );
        assert!(visible(&disk).is_empty(), "{sync:?}: {:?}", visible(&disk));
        no_temporaries(&disk).unwrap_or_else(|e| panic!("{sync:?}: {e}"));
        for (name, _) in files() {
            assert!(
                disk.file_bytes(&new_path(name)).is_some(),
                "{sync:?}: {name}"
            );
        }
    }
}

#[test]
fn crashes_at_every_point_of_a_group_of_files_give_the_same_results() {
    let hook = Arc::new(NthCrash::new(None));
    let clean = base();
    run(&clean, hook.clone()).expect("clean run");
    let points = hook.reached();
    assert!(points.len() > 20, "{points:?}");
    // Every step, the durability round's included (it ran where the serve loop runs it).
    assert_reached(
        &points,
        &[
            "after_results_prepared",
            "after_flush.0",
            "after_audit_sync",
            "after_done",
        ],
    );
    let want = results(&clean).expect("clean results");
    let statuses: Vec<&str> = want.values().filter_map(|r| r["status"].as_str()).collect();
    for s in ["committed", "rejected", "conflict"] {
        assert!(statuses.contains(&s), "no {s} among {want:?}");
    }
    assert_eq!(
        want["a.json"]["ops"], want["a-again.json"]["ops"],
        "a duplicate"
    );
    check_records(&clean, &want).expect("clean run's records");
    let modes = [
        CrashMode::Process,
        CrashMode::PowerDrop,
        CrashMode::PowerTear { seed: 1 },
        CrashMode::PowerTear { seed: 2 },
    ];
    let mut schedules = 0;
    for n in 1..=points.len() as u64 {
        for mode in modes {
            let what = format!("crash at {} (#{n}), {mode:?}", points[n as usize - 1]);
            let disk = base();
            let err = run(&disk, Arc::new(NthCrash::new(Some(n)))).expect_err(&what);
            assert!(err.contains("crash"), "{what}: {err}");
            let acked = visible(&disk);
            let after = disk.crash(mode);
            kept(&after, &acked).unwrap_or_else(|e| panic!("{what}: {e}"));
            no_temporaries(&after).unwrap_or_else(|e| panic!("{what}: {e}"));
            run(&after, no_crash()).unwrap_or_else(|e| panic!("{what}: retry: {e}"));
            same_results(&after, &want).unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = results(&after).unwrap_or_else(|e| panic!("{what}: {e}"));
            check_records(&after, &got).unwrap_or_else(|e| panic!("{what}: {e}"));
            schedules += 1;
        }
    }
    // A file back after its result (its removal not yet durable): the same result again.
    let (name, v) = &files()[0];
    clean.put_file_bytes(&new_path(name), v.to_string().into_bytes());
    run(&clean, no_crash()).expect("again");
    let again = results(&clean).expect("results after the input came back");
    assert_eq!(again, want, "the input back");
    check_records(&clean, &again).expect("records after the input came back");
    println!(
        "file group crash schedules: {schedules} over {} points",
        points.len()
    );
}
